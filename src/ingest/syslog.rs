//! Syslog: turning an RFC 5424 or RFC 3164 message, as real programs send them, into a JSON
//! record.
//!
//! Owns: the mapping from syslog fields to record fields (documented in `docs/PROTOCOL.md`):
//! `message`, `level` (from the severity), `severity` (0–7), `facility`, `hostname`,
//! `app_name`, `procid`, `msgid`, `time` (RFC 3339), `structured_data` (`{id: {param: value}}`)
//! and `syslog` (`rfc5424` or `rfc3164`). Must not: drop input it cannot parse (it is kept as a
//! plain `{"message": ...}`), or decide framing (datagram or [`super::framing::SyslogFramer`]).
//!
//! Parsing is syslog_loose's (the parser Vector uses), which accepts the many dialects real
//! programs write: `logger`, glibc's `syslog(3)`, Python's `SysLogHandler`, rsyslog forwarding.

use serde::Serialize;
use serde_json::{Map, Value};
use syslog_loose::{Message, ProcId, Protocol, SyslogSeverity, Variant};

/// Strips what senders append to a message and syslog does not keep: trailing NULs (Python's
/// `SysLogHandler` ends every message with one) and line endings.
pub fn trim_trailer(bytes: &[u8]) -> &[u8] {
    let end = bytes.iter().rposition(|&b| !matches!(b, b'\0' | b'\n' | b'\r')).map_or(0, |last| last + 1);
    &bytes[..end]
}

#[derive(Serialize)]
struct Record<'a> {
    message: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    level: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    severity: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    facility: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hostname: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    app_name: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    procid: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    msgid: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    time: Option<String>,
    #[serde(skip_serializing_if = "Map::is_empty")]
    structured_data: Map<String, Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    syslog: Option<&'static str>,
}

/// Parses one syslog message (valid UTF-8, trailer trimmed) and writes its JSON record to
/// `out` (cleared first). Input that is not syslog becomes `{"message": text}`.
pub fn to_record(text: &str, out: &mut Vec<u8>) {
    out.clear();
    let message = syslog_loose::parse_message(text, Variant::Either);
    // syslog_loose returns the whole input as the message, and nothing else, when no part of it
    // parses (it wants a timestamp); then the bare `<PRI>TAG: message` that Python's
    // SysLogHandler and many small libraries send is read here, and anything else is text.
    let parsed = message.facility.is_some() || message.timestamp.is_some();
    let record = if parsed { fields(text, &message) } else { bare(text).unwrap_or_else(|| plain(text)) };
    // Serialising plain strings and numbers into a Vec cannot fail.
    let _ = serde_json::to_writer(out, &record);
}

/// `<PRI>` then an optional `TAG:` or `TAG[PID]:`, then the message.
fn bare(text: &str) -> Option<Record<'_>> {
    let rest = text.strip_prefix('<')?;
    let close = rest.find('>').filter(|&close| (1..=3).contains(&close))?;
    let pri: u8 = rest[..close].parse().ok().filter(|&pri| pri <= 191)?;
    let (facility, severity) = syslog_loose::decompose_pri(pri);
    let mut record = plain(rest[close + 1..].trim_start());
    record.level = severity.map(level);
    record.severity = severity.map(|severity| severity as u8);
    record.facility = facility.map(|facility| facility.as_str());
    record.syslog = Some("rfc3164");
    if let Some((tag, message)) = record.message.split_once(": ") {
        let (name, pid) = match tag.strip_suffix(']').and_then(|tag| tag.split_once('[')) {
            Some((name, pid)) => (name, pid.parse::<i64>().ok()),
            None => (tag, None),
        };
        let is_tag = |name: &str| {
            !name.is_empty()
                && name.len() <= 48
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.' | b'/'))
        };
        if is_tag(name) {
            record.app_name = Some(name);
            record.procid = pid.map(Value::from);
            record.message = message;
        }
    }
    Some(record)
}

fn plain(text: &str) -> Record<'_> {
    Record {
        message: text,
        level: None,
        severity: None,
        facility: None,
        hostname: None,
        app_name: None,
        procid: None,
        msgid: None,
        time: None,
        structured_data: Map::new(),
        syslog: None,
    }
}

fn fields<'a>(text: &str, message: &'a Message<&'a str>) -> Record<'a> {
    let mut structured_data = Map::new();
    for element in &message.structured_data {
        let params: Map<String, Value> =
            element.params().map(|(name, value)| (name.to_string(), Value::String(value))).collect();
        structured_data.insert(element.id.to_string(), Value::Object(params));
    }
    // `<PRI>TIMESTAMP TAG: msg` (what `logger -u` sends: no hostname) reads to syslog_loose as
    // a hostname; a hostname is never followed by a colon, a tag is.
    let is_3164 = matches!(message.protocol, Protocol::RFC3164);
    let (hostname, app_name) = match (message.hostname, message.appname) {
        (Some(host), None) if is_3164 && text.contains(&format!(" {host}: ")) => (None, Some(host)),
        (hostname, app_name) => (hostname, app_name),
    };
    Record {
        message: message.msg,
        level: message.severity.map(level),
        severity: message.severity.map(|severity| severity as u8),
        facility: message.facility.map(|facility| facility.as_str()),
        hostname,
        app_name,
        procid: message.procid.as_ref().map(|procid| match procid {
            ProcId::PID(pid) => Value::from(*pid),
            ProcId::Name(name) => Value::from(*name),
        }),
        msgid: message.msgid,
        time: message.timestamp.map(|time| time.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)),
        structured_data,
        syslog: Some(match message.protocol {
            Protocol::RFC5424(_) => "rfc5424",
            Protocol::RFC3164 => "rfc3164",
        }),
    }
}

/// The level word for a severity, in the words other records use (`error`, not `err`).
fn level(severity: SyslogSeverity) -> &'static str {
    match severity {
        SyslogSeverity::SEV_EMERG => "emergency",
        SyslogSeverity::SEV_ALERT => "alert",
        SyslogSeverity::SEV_CRIT => "critical",
        SyslogSeverity::SEV_ERR => "error",
        SyslogSeverity::SEV_WARNING => "warning",
        SyslogSeverity::SEV_NOTICE => "notice",
        SyslogSeverity::SEV_INFO => "info",
        SyslogSeverity::SEV_DEBUG => "debug",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(text: &str) -> Value {
        let mut out = Vec::new();
        to_record(text, &mut out);
        serde_json::from_slice(&out).expect("valid JSON")
    }

    #[test]
    fn parses_rfc5424_with_structured_data() {
        let got = record(
            r#"<165>1 2026-11-30T05:55:00.123Z web-1 checkout 4242 ID47 [origin ip="10.0.0.1" x="a\"b"] paid order 17"#,
        );
        assert_eq!(got["message"], "paid order 17");
        assert_eq!(got["level"], "notice");
        assert_eq!(got["severity"], 5);
        assert_eq!(got["facility"], "local4");
        assert_eq!(got["hostname"], "web-1");
        assert_eq!(got["app_name"], "checkout");
        assert_eq!(got["procid"], 4242);
        assert_eq!(got["msgid"], "ID47");
        assert_eq!(got["time"], "2026-11-30T05:55:00.123Z");
        assert_eq!(got["structured_data"]["origin"]["ip"], "10.0.0.1");
        assert_eq!(got["structured_data"]["origin"]["x"], "a\"b");
        assert_eq!(got["syslog"], "rfc5424");
    }

    #[test]
    fn parses_what_logger_sends_to_a_local_socket() {
        // util-linux logger's local format: no hostname.
        let got = record("<13>Nov 30 05:55:00 alice[1234]: hello from logger");
        assert_eq!(got["message"], "hello from logger");
        assert_eq!(got["level"], "notice");
        assert_eq!(got["facility"], "user");
        assert_eq!(got["app_name"], "alice");
        assert_eq!(got["procid"], 1234);
        assert_eq!(got["syslog"], "rfc3164");
        let got = record("<164>Nov 30 06:11:46 checkout: paid order 17");
        assert_eq!((got["app_name"].as_str(), got.get("hostname")), (Some("checkout"), None));
        let got = record("<164>Nov 30 06:11:46 web-1 checkout: paid order 17");
        assert_eq!((got["app_name"].as_str(), got["hostname"].as_str()), (Some("checkout"), Some("web-1")));
        let got = record("<13>Nov 30 05:55:00 alice[1234]: hello from logger");
        assert!(got["time"].as_str().is_some_and(|time| time.contains("-11-30T")), "{got}");
    }

    #[test]
    fn parses_what_python_syslog_handler_sends() {
        let got = record("<11>myapp: something failed");
        assert_eq!(got["level"], "error");
        assert_eq!(got["facility"], "user");
        assert_eq!(got["app_name"], "myapp");
        assert_eq!(got["message"], "something failed");
        let got = record("<14>worker[77]: started: 3 jobs");
        assert_eq!((got["app_name"].as_str(), got["procid"].as_i64()), (Some("worker"), Some(77)));
        assert_eq!(got["message"], "started: 3 jobs");
        let got = record("<11>no tag here, just text: with a colon");
        assert_eq!(got["message"], "no tag here, just text: with a colon");
        assert_eq!(got.get("app_name"), None);
    }

    #[test]
    fn keeps_unparseable_input_as_a_plain_message() {
        assert_eq!(record("just some text"), serde_json::json!({"message": "just some text"}));
        assert_eq!(record("<999>x"), serde_json::json!({"message": "<999>x"}));
    }

    #[test]
    fn trims_trailing_nuls_and_line_endings_only() {
        assert_eq!(trim_trailer(b"<13>hi\0"), b"<13>hi");
        assert_eq!(trim_trailer(b"<13>hi\r\n"), b"<13>hi");
        assert_eq!(trim_trailer(b"a\0b\0"), b"a\0b");
        assert_eq!(trim_trailer(b"\0\0"), b"");
    }
}
