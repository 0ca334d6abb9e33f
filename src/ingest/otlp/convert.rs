//! OTLP log records → Sluice's JSON records, one per `LogRecord`.
//!
//! Owns: the record's shape (docs/PROTOCOL.md, "otlp", lists it field by field): `time`,
//! `observed_time`, `level` (OpenTelemetry's severity word, the clients' `level`),
//! `severity_number`, `severity_text`, `message` (a string body) or `body` (any other),
//! `attributes`, `resource`, `scope`, `trace_id`, `span_id`, `trace_flags`, `event_name`,
//! `dropped_attributes_count`. Must not: allocate per value beyond the JSON it writes (a
//! resource's and a scope's JSON are written once and copied into each of their records).

use std::fmt::Write as _;
use std::sync::Arc;

use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::logs::v1::LogRecord;
use serde::Serialize;
use serde::ser::{SerializeMap, SerializeSeq, Serializer};
use serde_json::value::RawValue;

use crate::telemetry::outcome::Rejected;

/// How many log records a request holds.
pub fn count(request: &ExportLogsServiceRequest) -> usize {
    request.resource_logs.iter().flat_map(|resource| &resource.scope_logs).map(|scope| scope.log_records.len()).sum()
}

/// Every record of `request` as JSON, in order, each written when it is asked for (a request's
/// records are never all held as JSON at once); one whose JSON would pass `max_record` bytes is
/// `too_large`, and writing it stops there (a record of control characters is six times longer
/// as JSON; a resource larger than the limit makes every record of it too large, unwritten).
pub fn records(
    request: &ExportLogsServiceRequest,
    max_record: usize,
) -> impl Iterator<Item = Result<Vec<u8>, Rejected>> + Send + '_ {
    request.resource_logs.iter().flat_map(move |resource_logs| {
        let resource = Arc::new(
            resource_logs
                .resource
                .as_ref()
                .filter(|resource| !resource.attributes.is_empty())
                .and_then(|resource| bounded_raw(&Attributes(&resource.attributes), max_record)),
        );
        resource_logs.scope_logs.iter().flat_map(move |scope_logs| {
            let scope = scope_logs
                .scope
                .as_ref()
                .filter(|scope| !is_empty_scope(scope))
                .and_then(|scope| bounded_raw(&Scope(scope), max_record));
            let resource = resource.clone();
            scope_logs.log_records.iter().map(move |record| {
                let (resource, scope) = (resource.as_ref().as_ref(), scope.as_ref());
                match (resource, scope) {
                    (Some(Err(reason)), _) | (_, Some(Err(reason))) => Err(*reason),
                    _ => to_json(
                        record,
                        resource.and_then(|r| r.as_deref().ok()),
                        scope.and_then(|s| s.as_deref().ok()),
                        max_record,
                    ),
                }
            })
        })
    })
}

/// `value` as JSON if it is at most `max` bytes.
fn bounded_raw(value: &impl Serialize, max: usize) -> Option<Result<Box<RawValue>, Rejected>> {
    let mut out = Bounded { bytes: Vec::new(), max };
    match serde_json::to_writer(&mut out, value) {
        Ok(()) => String::from_utf8(out.bytes).ok().and_then(|json| RawValue::from_string(json).ok()).map(Ok),
        Err(_) => Some(Err(Rejected::TooLarge)),
    }
}

/// A writer that refuses to grow past `max` bytes.
struct Bounded {
    bytes: Vec<u8>,
    max: usize,
}

impl std::io::Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > self.max {
            return Err(std::io::Error::other("too large"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn is_empty_scope(scope: &InstrumentationScope) -> bool {
    scope.name.is_empty() && scope.version.is_empty() && scope.attributes.is_empty()
}

/// One record as JSON, if it is at most `max` bytes; `resource` and `scope` are their JSON
/// objects, already written.
pub fn to_json(
    record: &LogRecord,
    resource: Option<&RawValue>,
    scope: Option<&RawValue>,
    max: usize,
) -> Result<Vec<u8>, Rejected> {
    let time = if record.time_unix_nano != 0 { record.time_unix_nano } else { record.observed_time_unix_nano };
    let level = level(record.severity_number)
        .map(str::to_string)
        .or_else(|| (!record.severity_text.is_empty()).then(|| record.severity_text.to_ascii_lowercase()));
    let (message, body) = match record.body.as_ref().and_then(|body| body.value.as_ref()) {
        Some(any_value::Value::StringValue(text)) => (Some(text.as_str()), None),
        Some(_) => (None, record.body.as_ref().map(Any)),
        None => (None, None),
    };
    let shape = Shape {
        time: (time != 0).then(|| rfc3339_nanos(time)),
        observed_time: (record.observed_time_unix_nano != 0 && record.time_unix_nano != 0)
            .then(|| rfc3339_nanos(record.observed_time_unix_nano)),
        level,
        severity_number: (record.severity_number != 0).then_some(record.severity_number),
        severity_text: (!record.severity_text.is_empty()).then_some(record.severity_text.as_str()),
        message,
        body,
        event_name: (!record.event_name.is_empty()).then_some(record.event_name.as_str()),
        attributes: (!record.attributes.is_empty()).then_some(Attributes(&record.attributes)),
        dropped_attributes_count: (record.dropped_attributes_count != 0).then_some(record.dropped_attributes_count),
        trace_id: nonzero_hex(&record.trace_id),
        span_id: nonzero_hex(&record.span_id),
        trace_flags: (record.flags & 0xff != 0).then_some(record.flags & 0xff),
        resource,
        scope,
    };
    // Serializing plain strings, numbers and maps of them fails only past `max`.
    let mut out = Bounded { bytes: Vec::with_capacity(256.min(max)), max };
    serde_json::to_writer(&mut out, &shape).map_err(|_| Rejected::TooLarge)?;
    Ok(out.bytes)
}

#[derive(Serialize)]
struct Shape<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    time: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    observed_time: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    level: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    severity_number: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    severity_text: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    body: Option<Any<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    event_name: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    attributes: Option<Attributes<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dropped_attributes_count: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    trace_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    span_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    trace_flags: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    resource: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    scope: Option<&'a RawValue>,
}

/// OpenTelemetry's severity word for a severity number (1–24), lower-cased as the clients write
/// it.
pub fn level(number: i32) -> Option<&'static str> {
    Some(match number {
        1..=4 => "trace",
        5..=8 => "debug",
        9..=12 => "info",
        13..=16 => "warn",
        17..=20 => "error",
        21..=24 => "fatal",
        _ => return None,
    })
}

/// Nanoseconds since the epoch as RFC 3339, UTC, with nanoseconds.
fn rfc3339_nanos(nanos: u64) -> String {
    let nanos = i64::try_from(nanos).unwrap_or(i64::MAX);
    chrono::DateTime::from_timestamp_nanos(nanos).to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
}

/// Lower-case hex of an id, or none for an absent or all-zero one (OTLP's "no id").
fn nonzero_hex(id: &[u8]) -> Option<String> {
    if id.iter().all(|byte| *byte == 0) {
        return None;
    }
    let mut hex = String::with_capacity(id.len() * 2);
    for byte in id {
        let _ = write!(hex, "{byte:02x}");
    }
    Some(hex)
}

/// A scope: `name`, `version`, `attributes`.
struct Scope<'a>(&'a InstrumentationScope);

impl Serialize for Scope<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let scope = self.0;
        let mut map = serializer.serialize_map(None)?;
        if !scope.name.is_empty() {
            map.serialize_entry("name", &scope.name)?;
        }
        if !scope.version.is_empty() {
            map.serialize_entry("version", &scope.version)?;
        }
        if !scope.attributes.is_empty() {
            map.serialize_entry("attributes", &Attributes(&scope.attributes))?;
        }
        map.end()
    }
}

/// Key-value pairs as a JSON object (a repeated key: the last one wins when read back).
struct Attributes<'a>(&'a [KeyValue]);

impl Serialize for Attributes<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for pair in self.0 {
            match &pair.value {
                Some(value) => map.serialize_entry(&pair.key, &Any(value))?,
                None => map.serialize_entry(&pair.key, &())?,
            }
        }
        map.end()
    }
}

/// An `AnyValue` as JSON: strings, booleans, numbers (NaN and infinities: null), arrays, objects;
/// bytes as base64 (OTLP/JSON's own form).
struct Any<'a>(&'a AnyValue);

impl Serialize for Any<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use base64::Engine as _;
        match &self.0.value {
            None => serializer.serialize_none(),
            Some(any_value::Value::StringValue(text)) => serializer.serialize_str(text),
            Some(any_value::Value::BoolValue(value)) => serializer.serialize_bool(*value),
            Some(any_value::Value::IntValue(value)) => serializer.serialize_i64(*value),
            Some(any_value::Value::DoubleValue(value)) if value.is_finite() => serializer.serialize_f64(*value),
            Some(any_value::Value::DoubleValue(_)) => serializer.serialize_none(),
            Some(any_value::Value::ArrayValue(array)) => {
                let mut seq = serializer.serialize_seq(Some(array.values.len()))?;
                for value in &array.values {
                    seq.serialize_element(&Any(value))?;
                }
                seq.end()
            }
            Some(any_value::Value::KvlistValue(list)) => Attributes(&list.values).serialize(serializer),
            Some(any_value::Value::BytesValue(bytes)) => {
                serializer.serialize_str(&base64::engine::general_purpose::STANDARD.encode(bytes))
            }
            // A string-table index (profiles' dictionary), meaningless in a log record.
            Some(any_value::Value::StringValueStrindex(index)) => serializer.serialize_i32(*index),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::common::v1::{ArrayValue, KeyValueList};

    fn string(text: &str) -> AnyValue {
        AnyValue { value: Some(any_value::Value::StringValue(text.to_string())) }
    }

    fn raw(json: &str) -> Box<RawValue> {
        RawValue::from_string(json.to_string()).expect("json")
    }

    fn pair(key: &str, value: AnyValue) -> KeyValue {
        KeyValue { key: key.to_string(), value: Some(value), ..Default::default() }
    }

    #[test]
    fn a_record_becomes_one_json_object_with_every_field_named_as_documented() {
        let record = LogRecord {
            time_unix_nano: 1_700_000_000_123_456_789,
            observed_time_unix_nano: 1_700_000_001_000_000_000,
            severity_number: 17,
            severity_text: "ERROR".into(),
            body: Some(string("payment failed")),
            attributes: vec![
                pair("http.status", AnyValue { value: Some(any_value::Value::IntValue(502)) }),
                pair(
                    "tags",
                    AnyValue {
                        value: Some(any_value::Value::ArrayValue(ArrayValue {
                            values: vec![
                                string("a"),
                                AnyValue { value: Some(any_value::Value::DoubleValue(f64::NAN)) },
                            ],
                        })),
                    },
                ),
            ],
            trace_id: vec![0x5b; 16],
            span_id: vec![0, 0, 0, 0, 0, 0, 0, 7],
            flags: 1,
            ..Default::default()
        };
        let json: serde_json::Value = serde_json::from_slice(
            &to_json(&record, Some(&raw(r#"{"service.name":"checkout"}"#)), Some(&raw(r#"{"name":"app"}"#)), 4096)
                .expect("within the limit"),
        )
        .expect("json");
        assert_eq!(
            json,
            serde_json::json!({
                "time": "2023-11-14T22:13:20.123456789Z",
                "observed_time": "2023-11-14T22:13:21.000000000Z",
                "level": "error",
                "severity_number": 17,
                "severity_text": "ERROR",
                "message": "payment failed",
                "attributes": {"http.status": 502, "tags": ["a", null]},
                "trace_id": "5b5b5b5b5b5b5b5b5b5b5b5b5b5b5b5b",
                "span_id": "0000000000000007",
                "trace_flags": 1,
                "resource": {"service.name": "checkout"},
                "scope": {"name": "app"}
            })
        );
    }

    #[test]
    fn a_structured_body_is_kept_as_body_and_an_empty_record_is_an_empty_object() {
        let record = LogRecord {
            body: Some(AnyValue {
                value: Some(any_value::Value::KvlistValue(KeyValueList {
                    values: vec![pair("bytes", AnyValue { value: Some(any_value::Value::BytesValue(vec![1, 2, 3])) })],
                })),
            }),
            severity_text: "Warning".into(),
            ..Default::default()
        };
        let json: serde_json::Value =
            serde_json::from_slice(&to_json(&record, None, None, 4096).expect("small")).expect("json");
        assert_eq!(
            json,
            serde_json::json!({"level": "warning", "severity_text": "Warning", "body": {"bytes": "AQID"}})
        );
        assert_eq!(to_json(&LogRecord::default(), None, None, 2).expect("two bytes"), b"{}");
        assert_eq!(to_json(&LogRecord::default(), None, None, 1), Err(Rejected::TooLarge), "stopped at the limit");
    }
}
