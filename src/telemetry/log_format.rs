//! The agent's and persister's own JSON log lines: one flat object per line — `timestamp`,
//! `level`, `message`, `target`, the current `span` by name, then the event's fields — as log
//! pipelines (Vector, Fluent Bit, Loki, Elasticsearch) index them without a `fields` object to
//! dig into.
//!
//! Owns: how a field's value is written. Numbers and booleans as JSON numbers and booleans;
//! text as a string; a value recorded with `?`/`%` that is a list of strings (`["ship.sink"]`) or
//! a Rust string's quotes as that JSON, so arrays are arrays and no `Debug` quoting shows; the
//! final counts as an object; anything else as its text. The fields of the spans an event is in
//! (a connection's `listener` and `id`) are on its line too. Must not: drop one of the event's
//! fields (a name the line already uses is kept as `field.NAME`; a span's, as `span.NAME`), or
//! write anything but one line per event.
//!
//! tracing-subscriber's own JSON layer nests fields under `fields` and writes every `?`/`%`
//! value as a string; its `flatten_event` still writes lists as strings. This is the small
//! formatter that writes what an SRE's pipeline expects.

use std::fmt;

use serde_json::Value;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// The flat JSON event format ([`super::init_logging`]).
pub struct FlatJson;

impl<S, N> FormatEvent<S, N> for FlatJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let metadata = event.metadata();
        // A line from the `log` crate (PostgreSQL's and the migrations' libraries) names its
        // own target: that one, not `log`, and not its source location.
        let log_target = fields.take("log.target");
        for location in ["log.module_path", "log.file", "log.line"] {
            fields.take(location);
        }
        let timestamp = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        let mut line: Vec<(String, Value)> =
            vec![("timestamp".into(), timestamp.into()), ("level".into(), metadata.level().as_str().into())];
        if let Some(at) = fields.0.iter().position(|(name, _)| name == "message") {
            line.push(fields.0.remove(at));
        }
        line.push(("target".into(), log_target.unwrap_or_else(|| metadata.target().into())));
        if let Some(span) = ctx.lookup_current() {
            line.push(("span".into(), span.name().into()));
        }
        // The fields of the spans the event is in (a connection's `listener` and `id`), the
        // innermost first. A name taken already (by the event, or an inner span) is kept as
        // `span.NAME` — the nearest span's only.
        for span in ctx.event_scope().into_iter().flatten() {
            let extensions = span.extensions();
            let Some(formatted) = extensions.get::<FormattedFields<N>>() else { continue };
            let Ok(serde_json::Value::Object(span_fields)) = serde_json::from_str(formatted.as_str()) else { continue };
            for (name, value) in span_fields {
                let name = if fields.0.iter().any(|(taken, _)| *taken == name) { format!("span.{name}") } else { name };
                if !fields.0.iter().any(|(taken, _)| *taken == name) {
                    fields.0.push((name, value));
                }
            }
        }
        for (name, value) in fields.0 {
            let name = if line.iter().any(|(taken, _)| *taken == name) { format!("field.{name}") } else { name };
            line.push((name, value));
        }
        writer.write_char('{')?;
        for (at, (name, value)) in line.iter().enumerate() {
            if at > 0 {
                writer.write_char(',')?;
            }
            write!(writer, "{}:{value}", Value::from(name.as_str()))?;
        }
        writer.write_str("}\n")
    }
}

/// An event's fields in the order they were given.
#[derive(Default)]
struct Fields(Vec<(String, Value)>);

impl Fields {
    fn push(&mut self, field: &Field, value: Value) {
        self.0.push((field.name().to_string(), value));
    }

    fn take(&mut self, name: &str) -> Option<Value> {
        let at = self.0.iter().position(|(taken, _)| taken == name)?;
        Some(self.0.remove(at).1)
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.push(field, value.into());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.push(field, value.into());
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.push(field, value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.push(field, value.into());
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.push(field, value.into());
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.push(field, value.to_string().into());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let text = format!("{value:?}");
        let value = as_json(text, field.name() == OBJECT_FIELD);
        self.push(field, value);
    }
}

/// The one field written as a JSON object: the final counts (`telemetry::final_counts`). Any
/// other field keeps one type on every line (a log store maps a field's type once).
const OBJECT_FIELD: &str = "counts";

/// `text` as the JSON it spells when it is a list of strings or a quoted string (what `?` makes
/// of a `Vec<String>` or a `String`) — or, for [`OBJECT_FIELD`], an object — else as a string.
fn as_json(text: String, object: bool) -> Value {
    let parsed = || serde_json::from_str::<Value>(&text).ok();
    let value = match text.as_bytes().first() {
        Some(b'"') => parsed().filter(Value::is_string),
        Some(b'[') => parsed().filter(|list| list.as_array().is_some_and(|items| items.iter().all(Value::is_string))),
        Some(b'{') if object => parsed().filter(Value::is_object),
        _ => None,
    };
    value.unwrap_or(Value::String(text))
}

#[cfg(test)]
mod tests {
    use super::FlatJson;

    fn logged(log: impl FnOnce()) -> serde_json::Value {
        let captured = crate::test_support::Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
            .event_format(FlatJson)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, log);
        let text = captured.text();
        assert_eq!(text.lines().count(), 1, "{text}");
        serde_json::from_str(&text).expect("one JSON object")
    }

    #[test]
    fn a_line_is_flat_with_numbers_lists_and_text_as_json_not_rust_debug() {
        let keys = vec!["ship.sink".to_string(), "kafka.topic".to_string()];
        let name = String::from("web \"1\"");
        let error = std::io::Error::other("refused");
        let line = logged(|| {
            let span = tracing::info_span!("reload");
            let _entered = span.enter();
            tracing::warn!(keys = ?keys, pod = ?name, lost = 3u64, ratio = 0.5, ok = false, %error, "settings kept");
        });
        assert_eq!(line["message"], "settings kept");
        assert_eq!(line["level"], "WARN");
        assert_eq!(line["span"], "reload");
        assert_eq!(line["keys"], serde_json::json!(["ship.sink", "kafka.topic"]), "{line}");
        assert_eq!(line["pod"], "web \"1\"", "no Debug quotes: {line}");
        assert_eq!(
            (line["lost"].as_u64(), line["ratio"].as_f64(), line["ok"].as_bool()),
            (Some(3), Some(0.5), Some(false))
        );
        assert_eq!(line["error"], "refused");
        assert!(line.get("fields").is_none(), "{line}");
    }

    /// Found by the cold review: a connection's `listener` and `id` (its span's fields) were on
    /// none of its lines, and a text that happened to be JSON changed a field's type.
    #[test]
    fn a_line_carries_its_spans_fields_and_each_field_keeps_one_type() {
        let line = logged(|| {
            let span = tracing::info_span!("connection", listener = "default", id = 7u64);
            let _entered = span.enter();
            let detail = r#"{"looks":"like json"}"#;
            tracing::warn!(id = 8u64, %detail, counts = %r#"{"sluice_x_total":1}"#, "closed");
        });
        assert_eq!((line["span"].as_str(), line["listener"].as_str()), (Some("connection"), Some("default")), "{line}");
        assert_eq!((line["id"].as_u64(), line["span.id"].as_u64()), (Some(8), Some(7)), "both kept: {line}");
        assert_eq!(line["detail"], r#"{"looks":"like json"}"#, "a string stays a string: {line}");
        assert_eq!(line["counts"]["sluice_x_total"], 1, "the final counts are an object: {line}");
    }

    #[test]
    fn a_field_named_like_the_lines_own_keys_is_kept_beside_them() {
        let line = logged(|| tracing::info!(target = "the app's", level = 3, "clash"));
        assert_eq!(line["target"], module_path!());
        assert_eq!(line["field.target"], "the app's");
        assert_eq!(line["field.level"], 3);
    }
}
