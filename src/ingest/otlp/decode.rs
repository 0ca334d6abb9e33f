//! An Export's bytes → its request, within bounds: gzip inflated up to `max_message_size` (every
//! member of a multi-member stream), and what decoding would build estimated from the bytes
//! before anything is built — a 2-byte empty `LogRecord` becomes a struct of ~200 bytes, so 4 MiB
//! of them would be ~400 MB.
//!
//! Owns: [`inflate`], [`decoded_cost`] (a walk of the protobuf wire format along the OTLP logs
//! schema, or a count of JSON's objects and arrays) and [`decode`]. Must not: allocate from a
//! declared length, or build a request whose estimated cost is over the budget.

use std::io::Read as _;

use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{
    AnyValue, ArrayValue, EntityRef, InstrumentationScope, KeyValue, KeyValueList,
};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message as _;

/// What decoding may build, as a multiple of `max_message_size` (estimated by
/// [`decoded_cost`]; the vectors' growth may take up to twice the estimate for a moment).
pub const DECODED_BUDGET_FACTOR: usize = 4;

/// Why a body gives no request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Over `max_message_size` inflated, or over the decoding budget: why, and how many log
    /// records it holds (0 where unknown: each is counted `too_large`, at least one).
    TooLarge {
        /// Said to the client.
        why: &'static str,
        /// Its log records, when the walk counted them.
        records: u64,
    },
    /// Not OTLP.
    Malformed(String),
}

/// Inflates `bytes` (gzip, every member) up to `limit`; more is `TooLarge` (a compression bomb
/// stops here).
pub fn inflate(bytes: &[u8], limit: usize) -> Result<Vec<u8>, Refusal> {
    let mut inflated = Vec::new();
    let mut reader = flate2::read::MultiGzDecoder::new(bytes).take(limit as u64 + 1);
    match reader.read_to_end(&mut inflated) {
        Ok(_) if inflated.len() > limit => {
            Err(Refusal::TooLarge { why: "larger than max_message_size once inflated", records: 0 })
        }
        Ok(_) => Ok(inflated),
        Err(error) => Err(Refusal::Malformed(format!("gzip: {error}"))),
    }
}

/// The request of a protobuf or JSON body, if what it would build stays within `budget` bytes.
pub fn decode(bytes: &[u8], json: bool, budget: usize) -> Result<ExportLogsServiceRequest, Refusal> {
    let (cost, records) = if json { (json_cost(bytes), 0) } else { decoded_cost(bytes).map_err(Refusal::Malformed)? };
    if cost > budget {
        let why = "decodes to more than the agent holds for one Export (many tiny records)";
        return Err(Refusal::TooLarge { why, records });
    }
    if json {
        serde_json::from_slice::<ExportLogsServiceRequest>(bytes)
            .map_err(|error| Refusal::Malformed(format!("OTLP/JSON: {error}")))
    } else {
        ExportLogsServiceRequest::decode(bytes).map_err(|error| Refusal::Malformed(format!("OTLP protobuf: {error}")))
    }
}

/// An upper bound of what a JSON body decodes to: every object or array as large as a
/// `LogRecord`, and its bytes.
fn json_cost(bytes: &[u8]) -> usize {
    crate::ingest::record::json_containers(bytes)
        .saturating_mul(std::mem::size_of::<LogRecord>())
        .saturating_add(bytes.len())
}

/// The messages of the OTLP logs schema the walk knows.
#[derive(Clone, Copy)]
enum Kind {
    Request,
    ResourceLogs,
    Resource,
    ScopeLogs,
    Scope,
    LogRecord,
    KeyValue,
    AnyValue,
    ArrayValue,
    KeyValueList,
    /// A message whose fields are not walked (its bytes counted).
    Opaque,
}

impl Kind {
    /// The kind of field `field` if it is a message, with what one costs decoded.
    fn child(self, field: u64) -> Option<(Kind, usize)> {
        use std::mem::size_of;
        Some(match (self, field) {
            (Kind::Request, 1) => (Kind::ResourceLogs, size_of::<ResourceLogs>()),
            (Kind::ResourceLogs, 1) => (Kind::Resource, size_of::<Resource>()),
            (Kind::ResourceLogs, 2) => (Kind::ScopeLogs, size_of::<ScopeLogs>()),
            (Kind::Resource, 1) | (Kind::Scope, 3) | (Kind::LogRecord, 6) | (Kind::KeyValueList, 1) => {
                (Kind::KeyValue, size_of::<KeyValue>())
            }
            (Kind::Resource, 3) => (Kind::Opaque, size_of::<EntityRef>()),
            (Kind::ScopeLogs, 1) => (Kind::Scope, size_of::<InstrumentationScope>()),
            (Kind::ScopeLogs, 2) => (Kind::LogRecord, size_of::<LogRecord>()),
            (Kind::LogRecord, 5) | (Kind::KeyValue, 2) | (Kind::ArrayValue, 1) => {
                (Kind::AnyValue, size_of::<AnyValue>())
            }
            (Kind::AnyValue, 5) => (Kind::ArrayValue, size_of::<ArrayValue>()),
            (Kind::AnyValue, 6) => (Kind::KeyValueList, size_of::<KeyValueList>()),
            _ => return None,
        })
    }
}

/// Nesting the walk follows (prost itself stops at 100).
const MAX_DEPTH: usize = 100;

/// What decoding `bytes` as an `ExportLogsServiceRequest` builds, estimated — each message the
/// size of its struct, each string or bytes field its length — and how many log records it
/// holds. Malformed wire data is an error.
pub fn decoded_cost(bytes: &[u8]) -> Result<(usize, u64), String> {
    let mut cost = Cost { bytes: std::mem::size_of::<ExportLogsServiceRequest>(), records: 0 };
    walk(bytes, Kind::Request, 0, &mut cost)?;
    Ok((cost.bytes, cost.records))
}

/// What the walk adds up.
struct Cost {
    bytes: usize,
    records: u64,
}

fn walk(mut bytes: &[u8], kind: Kind, depth: usize, cost: &mut Cost) -> Result<(), String> {
    if depth > MAX_DEPTH {
        return Err("OTLP protobuf: nested too deep".into());
    }
    while !bytes.is_empty() {
        let key = varint(&mut bytes)?;
        let (field, wire) = (key >> 3, key & 7);
        match wire {
            0 => {
                varint(&mut bytes)?;
            }
            1 => bytes = bytes.get(8..).ok_or("OTLP protobuf: a fixed64 cut short")?,
            5 => bytes = bytes.get(4..).ok_or("OTLP protobuf: a fixed32 cut short")?,
            2 => {
                let len = usize::try_from(varint(&mut bytes)?).map_err(|_| "OTLP protobuf: a length past memory")?;
                if len > bytes.len() {
                    return Err("OTLP protobuf: a length past the message".into());
                }
                let (inner, rest) = bytes.split_at(len);
                bytes = rest;
                match kind.child(field) {
                    Some((Kind::Opaque, size)) => cost.bytes = cost.bytes.saturating_add(size + len),
                    Some((child, size)) => {
                        cost.bytes = cost.bytes.saturating_add(size);
                        if matches!(child, Kind::LogRecord) {
                            cost.records += 1;
                        }
                        walk(inner, child, depth + 1, cost)?;
                    }
                    None => cost.bytes = cost.bytes.saturating_add(len),
                }
            }
            _ => return Err(format!("OTLP protobuf: wire type {wire} is not used by OTLP")),
        }
    }
    Ok(())
}

fn varint(bytes: &mut &[u8]) -> Result<u64, String> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = bytes.split_first().ok_or("OTLP protobuf: a varint cut short")?;
        *bytes = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err("OTLP protobuf: a varint over 64 bits".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::common::v1::any_value;

    fn request(records: Vec<LogRecord>) -> ExportLogsServiceRequest {
        ExportLogsServiceRequest {
            resource_logs: vec![ResourceLogs {
                scope_logs: vec![ScopeLogs { log_records: records, ..Default::default() }],
                ..Default::default()
            }],
        }
    }

    #[test]
    fn many_tiny_records_are_refused_before_they_are_built() {
        // 2 bytes each on the wire, ~200 each decoded.
        let tiny = request(vec![LogRecord::default(); 100_000]).encode_to_vec();
        assert!(tiny.len() < 300_000);
        let (cost, records) = decoded_cost(&tiny).expect("well formed");
        assert!(cost >= 100_000 * std::mem::size_of::<LogRecord>(), "{cost}");
        assert_eq!(records, 100_000);
        assert!(matches!(decode(&tiny, false, 4 * tiny.len()), Err(Refusal::TooLarge { records: 100_000, .. })));
        let json = format!(r#"{{"resourceLogs":[{{"scopeLogs":[{{"logRecords":[{}{{}}]}}]}}]}}"#, "{},".repeat(50_000));
        assert!(matches!(decode(json.as_bytes(), true, 4 * json.len()), Err(Refusal::TooLarge { .. })));
    }

    #[test]
    fn an_ordinary_export_costs_a_small_multiple_of_its_bytes() {
        let body = |n: usize| Some(AnyValue { value: Some(any_value::Value::StringValue("x".repeat(200 + n % 7))) });
        let records = (0..512).map(|n| LogRecord { body: body(n), severity_number: 9, ..Default::default() }).collect();
        let bytes = request(records).encode_to_vec();
        let (cost, _) = decoded_cost(&bytes).expect("well formed");
        assert!(cost < 4 * bytes.len(), "{cost} for {} bytes", bytes.len());
        assert_eq!(
            decode(&bytes, false, 4 * bytes.len()).expect("decoded").resource_logs[0].scope_logs[0].log_records.len(),
            512
        );
    }

    #[test]
    fn malformed_wire_data_is_refused_not_walked_past() {
        assert!(decoded_cost(&[0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f]).is_err(), "a length past the message");
        assert!(decoded_cost(&[0x0b]).is_err(), "a group");
        assert!(decoded_cost(&[0x08, 0xff]).is_err(), "a varint cut short");
    }

    #[test]
    fn every_gzip_member_is_inflated_and_the_cap_holds() {
        let gzip = |data: &[u8]| {
            let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            std::io::Write::write_all(&mut encoder, data).expect("gzip");
            encoder.finish().expect("gzip")
        };
        let mut two = gzip(b"first ");
        two.extend(gzip(b"second"));
        assert_eq!(inflate(&two, 100).expect("inflated"), b"first second");
        assert!(matches!(inflate(&gzip(&[0; 4096]), 4095), Err(Refusal::TooLarge { .. })));
    }
}
