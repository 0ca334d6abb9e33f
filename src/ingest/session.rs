//! Client sessions: the `SLUICE/2 ACK` handshake, with which a client numbers its records itself
//! so that a record it sends again after a reconnect is the same record — one row, not two.
//!
//! Owns: reading the handshake (`SLUICE/2 ACK session=<32 hex digits> first=<seq>`), the record
//! id a session's record gets (its instance derived from the pod and the session, its sequence
//! the client's number) and its key time (the client's own timestamp, from the line's prefix
//! `<unix microseconds> `: never the agent's clock, which differs between two sends of one
//! record; the persister's write window judges it like any ingest time).
//! Must not: allocate per record, or trust a session id to name rows across pods (the instance
//! is derived from the pod too, so one pod's writer cannot shadow another's rows).

use chrono::{DateTime, Utc};

/// What starts a session's handshake line.
pub const SESSION_HANDSHAKE: &[u8] = b"SLUICE/2 ACK ";

/// The longest time prefix a session's line carries (`<19 digits> `): the framer allows it
/// beside the record, whose own limit is checked apart.
pub const MAX_PREFIX: usize = 20;

/// A connection's session, from its handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Session {
    /// The session as the client named it (a UUIDv7 per process start).
    pub session: [u8; 16],
    /// The client's number for the connection's first record; the next ones follow by one.
    pub first: u64,
}

/// A handshake line that starts like a session's but cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed session handshake (expected `SLUICE/2 ACK session=<32 hex digits> first=<1..2^63>`)")]
pub struct MalformedHandshake;

impl Session {
    /// Reads a `SLUICE/2 ACK …` line; `None` if `line` is not one.
    pub fn parse(line: &[u8]) -> Option<Result<Self, MalformedHandshake>> {
        let rest = line.strip_prefix(SESSION_HANDSHAKE)?;
        Some(Self::parse_parameters(rest))
    }

    fn parse_parameters(rest: &[u8]) -> Result<Self, MalformedHandshake> {
        let text = std::str::from_utf8(rest).map_err(|_| MalformedHandshake)?;
        let (mut session, mut first) = (None, None);
        for part in text.split(' ').filter(|part| !part.is_empty()) {
            match part.split_once('=') {
                Some(("session", value)) if session.is_none() => session = Some(parse_hex16(value)?),
                Some(("first", value)) if first.is_none() => {
                    let value: u64 = value.parse().map_err(|_| MalformedHandshake)?;
                    if value == 0 || value > i64::MAX as u64 {
                        return Err(MalformedHandshake);
                    }
                    first = Some(value);
                }
                _ => return Err(MalformedHandshake),
            }
        }
        match (session, first) {
            (Some(session), Some(first)) => Ok(Self { session, first }),
            _ => Err(MalformedHandshake),
        }
    }

    /// The client's number of the connection's `n`-th record (1, 2, 3…), as the agent numbers
    /// them for acknowledgements.
    pub fn seq(&self, n: u64) -> u64 {
        self.first + n - 1
    }
}

/// The record id and key time a session's record carries in its envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientStamp {
    /// The envelope's instance: derived from the pod and the session ([`session_instance`]).
    pub instance: [u8; 16],
    /// The client's number for the record.
    pub seq: u64,
    /// The envelope's `ingest_time`: the client's time.
    pub time: DateTime<Utc>,
}

/// The instance a session's records carry: the first 16 bytes of SHA-256 over the pod's
/// identity and the session, as a UUIDv8 (RFC 9562's custom version, variant `10`). The
/// persister keys rows by it as it keys an agent's UUIDv7 instance: the same session in the
/// same pod gives the same id after any restart of the agent, another pod another id, and no
/// agent instance (version 7) or hashed id (variant `111`) can take it.
pub fn session_instance(pod_identity: &str, session: &[u8; 16]) -> [u8; 16] {
    let mut input = Vec::with_capacity(32 + pod_identity.len());
    input.extend_from_slice(b"sluice/session\0");
    input.extend_from_slice(pod_identity.as_bytes());
    input.push(0);
    input.extend_from_slice(session);
    let digest = openssl::sha::sha256(&input);
    let mut id = [0; 16];
    id.copy_from_slice(&digest[..16]);
    id[6] = (id[6] & 0x0f) | 0x80;
    id[8] = (id[8] & 0x3f) | 0x80;
    id
}

/// Splits a session's line into the client's timestamp and the record; `None` if the line does
/// not start with `<unix microseconds> ` (1 to 19 digits, a time chrono can hold).
pub fn split_line(line: &[u8]) -> Option<(DateTime<Utc>, &[u8])> {
    let space = memchr::memchr(b' ', line)?;
    let digits = &line[..space];
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    // At most 19 digits: may still be above i64::MAX.
    let micros: i64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some((DateTime::from_timestamp_micros(micros)?, &line[space + 1..]))
}

fn parse_hex16(text: &str) -> Result<[u8; 16], MalformedHandshake> {
    let bytes = text.as_bytes();
    if bytes.len() != 32 {
        return Err(MalformedHandshake);
    }
    let mut out = [0; 16];
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        let high = (pair[0] as char).to_digit(16).ok_or(MalformedHandshake)?;
        let low = (pair[1] as char).to_digit(16).ok_or(MalformedHandshake)?;
        out[i] = (high * 16 + low) as u8;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SESSION: &str = "01a24b0342df7733953a12e961e1359a";

    #[test]
    fn reads_a_session_handshake_and_refuses_every_malformed_one() {
        let line = format!("SLUICE/2 ACK session={SESSION} first=42");
        let session = Session::parse(line.as_bytes()).expect("a session line").expect("well formed");
        assert_eq!(session.first, 42);
        assert_eq!(session.seq(1), 42);
        assert_eq!(session.seq(3), 44);
        assert_eq!(
            Session::parse(format!("SLUICE/2 ACK first=7 session={SESSION}").as_bytes()),
            Some(Ok(Session { first: 7, ..session }))
        );
        assert_eq!(Session::parse(b"SLUICE/1 ACK"), None);
        assert_eq!(Session::parse(b"{\"message\":\"SLUICE/2 ACK\"}"), None);
        for bad in [
            "SLUICE/2 ACK ".to_string(),
            format!("SLUICE/2 ACK session={SESSION}"),
            "SLUICE/2 ACK first=1".to_string(),
            format!("SLUICE/2 ACK session={SESSION} first=0"),
            format!("SLUICE/2 ACK session={SESSION} first=9223372036854775808"),
            format!("SLUICE/2 ACK session={SESSION} first=-1"),
            format!("SLUICE/2 ACK session={} first=1", &SESSION[..31]),
            format!("SLUICE/2 ACK session={}g first=1", &SESSION[..31]),
            format!("SLUICE/2 ACK session={SESSION} first=1 first=2"),
            format!("SLUICE/2 ACK session={SESSION} first=1 colour=blue"),
        ] {
            assert_eq!(Session::parse(bad.as_bytes()), Some(Err(MalformedHandshake)), "{bad}");
        }
    }

    #[test]
    fn a_session_in_one_pod_always_has_one_instance_and_another_pod_another() {
        let session = parse_hex16(SESSION).expect("hex");
        let here = session_instance("shop/web-1", &session);
        assert_eq!(here, session_instance("shop/web-1", &session), "the same after any agent restart");
        assert_ne!(here, session_instance("shop/web-2", &session), "a writer in another pod cannot shadow it");
        let uuid = uuid::Uuid::from_bytes(here);
        assert_eq!(uuid.get_version_num(), 8);
        assert_eq!(uuid.get_variant(), uuid::Variant::RFC4122);
        // The persister keys it as a uuid, not hashed: the 17th hex digit is 8, 9, a or b.
        let text = uuid.simple().to_string();
        let key = crate::persist::row::RecordKey::of(&format!("{text}-5"));
        assert_eq!(key, crate::persist::row::RecordKey::of_parts(here, 5));
    }

    #[test]
    fn a_line_is_split_into_the_clients_time_and_the_record() {
        let time = DateTime::from_timestamp_micros(1_733_400_000_000_000).expect("time");
        assert_eq!(split_line(b"1733400000000000 {\"m\":1}"), Some((time, &b"{\"m\":1}"[..])));
        assert_eq!(split_line(b"1733400000000000 "), Some((time, &b""[..])));
        for bad in [&b"{\"m\":1}"[..], b" x", b"-5 x", b"12a x", b"99999999999999999999 x", b"123"] {
            assert_eq!(split_line(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }
}
