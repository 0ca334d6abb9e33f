//! The agent's and persister's own JSON log lines: one flat object per line — `timestamp`,
//! `level`, `message`, `target`, the current `span` by name, then the event's fields — as log
//! pipelines (Vector, Fluent Bit, Loki, Elasticsearch) index them without a `fields` object to
//! dig into.
//!
//! Owns: how a field's value is written. Numbers and booleans as JSON numbers and booleans;
//! text as a string; a value recorded with `?`/`%` whose text is JSON (a list such as
//! `["ship.sink"]`, an object such as the final counts, a Rust string's quotes) as that JSON, so
//! arrays are arrays and no Rust `Debug` quoting shows; anything else as its text. Must not:
//! drop a field (a name the line already uses is kept as `field.NAME`), or write anything but
//! one line per event.
//!
//! tracing-subscriber's own JSON layer nests fields under `fields` and writes every `?`/`%`
//! value as a string; its `flatten_event` still writes lists as strings. This is the small
//! formatter that writes what an SRE's pipeline expects.

use std::fmt;

use serde_json::Value;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
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
        let timestamp = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
        let mut line: Vec<(String, Value)> =
            vec![("timestamp".into(), timestamp.into()), ("level".into(), metadata.level().as_str().into())];
        if let Some(at) = fields.0.iter().position(|(name, _)| name == "message") {
            line.push(fields.0.remove(at));
        }
        line.push(("target".into(), metadata.target().into()));
        if let Some(span) = ctx.lookup_current() {
            line.push(("span".into(), span.name().into()));
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
        self.push(field, as_json(text));
    }
}

/// `text` as the JSON it spells when it is a list, an object or a quoted string (what `?` makes
/// of a `Vec<String>` or a `String`), else as a string.
fn as_json(text: String) -> Value {
    if text.starts_with(['[', '{', '"'])
        && let Ok(value) = serde_json::from_str::<Value>(&text)
    {
        return value;
    }
    Value::String(text)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::FlatJson;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("captured").extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn logged(log: impl FnOnce()) -> serde_json::Value {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt().event_format(FlatJson).with_writer(move || writer.clone()).finish();
        tracing::subscriber::with_default(subscriber, log);
        let text = String::from_utf8(captured.0.lock().expect("captured").clone()).expect("utf-8");
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

    #[test]
    fn a_field_named_like_the_lines_own_keys_is_kept_beside_them() {
        let line = logged(|| tracing::info!(target = "the app's", level = 3, "clash"));
        assert_eq!(line["target"], module_path!());
        assert_eq!(line["field.target"], "the app's");
        assert_eq!(line["field.level"], 3);
    }
}
