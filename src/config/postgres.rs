//! `[postgres]`: the database, and `postgres.url` read the way tokio-postgres reads it.
//!
//! Owns: the section's schema and checks, the effective `sslmode` and its one-line description,
//! and finding passwords in both forms of connection string (`postgres://…` URLs and libpq's
//! `key=value` form). Must not: connect, or decide anything else about the URL (tokio-postgres
//! parses it for connecting).
//!
//! The reading here mirrors tokio-postgres 0.7's own parser (credentials up to the first `@`,
//! percent-decoded parameter names, quoted values with backslash escapes), so that whatever the
//! driver takes for a password is what gets hidden. When a string cannot be read, everything from
//! the point where reading failed is hidden.

use std::iter::Peekable;
use std::ops::Range;
use std::str::CharIndices;

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio_postgres::config::SslMode;

use super::{At, ConfigError, REDACTED};

/// `[postgres]`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PostgresConfig {
    /// Connection URL, `postgres://user:password@host:port/db`. The password is redacted when
    /// shown; prefer `SLUICE_POSTGRES__URL` from a Secret. Default
    /// `"postgres://postgres@127.0.0.1:5432/sluice"`.
    pub url: String,
    /// Schema holding sluice's tables (created if missing). A plain lower-case identifier.
    /// Default `"sluice"`.
    pub schema: String,
    /// How long one connection attempt to one host may take (a URL naming several hosts tries
    /// each in turn, each with this long). Default `10s`.
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// How long one batch write may wait for PostgreSQL's answers before its connection is
    /// dropped and the batch written again on a new one: a server whose node was lost sends
    /// neither an answer nor a reset, and the kernel would keep the write waiting for many
    /// minutes. Longer than any write should take. Default `60s`.
    #[serde(with = "humantime_serde")]
    pub write_timeout: Duration,
    /// The CA certificate (PEM) that signed the server's certificate, when it is not one the
    /// system trusts. TLS follows the URL's `sslmode`: `disable`, `prefer` or `require`. A URL
    /// without `sslmode` means `require` when `ca_file` is set and `prefer` (TLS when the server
    /// offers it, plaintext otherwise) when not. With TLS the certificate and host name are
    /// always verified (libpq's `verify-full`). `sluice check-config` says which applies.
    pub ca_file: Option<PathBuf>,
}

impl Default for PostgresConfig {
    fn default() -> Self {
        Self {
            url: "postgres://postgres@127.0.0.1:5432/sluice".into(),
            schema: "sluice".into(),
            connect_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(60),
            ca_file: None,
        }
    }
}

impl PostgresConfig {
    /// Checks what types alone cannot.
    pub(super) fn validate(&self, at: &At<'_>) -> Result<(), ConfigError> {
        if self.url.parse::<tokio_postgres::Config>().is_err() {
            return Err(at.invalid("url", "is not a PostgreSQL connection URL"));
        }
        if self.connect_timeout.is_zero() {
            return Err(at.invalid("connect_timeout", "must be more than 0"));
        }
        if self.write_timeout.is_zero() {
            return Err(at.invalid("write_timeout", "must be more than 0"));
        }
        if !valid_identifier(&self.schema) {
            return Err(at.invalid(
                "schema",
                format!("`{}` must be a lower-case identifier ([a-z_][a-z0-9_]*, at most 48 chars)", self.schema),
            ));
        }
        Ok(())
    }
}

/// A PostgreSQL identifier safe to use unquoted (it is still quoted where used).
pub fn valid_identifier(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b'a'..=b'z' | b'_'))
        && name.len() <= 48
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

impl PostgresConfig {
    /// How long connecting may take in all: `connect_timeout` for each host the URL names (they
    /// are tried in turn), and a second more.
    pub fn connect_budget(&self) -> Duration {
        let hosts = self.url.parse::<tokio_postgres::Config>().map_or(1, |config| config.get_hosts().len().max(1));
        self.connect_timeout * u32::try_from(hosts).unwrap_or(u32::MAX) + Duration::from_secs(1)
    }

    /// The TLS mode the persister connects with. The URL's `sslmode` when it sets one; otherwise
    /// `require` when `ca_file` is given — naming a CA says the server is expected to speak TLS,
    /// and tokio-postgres' default `prefer` would fall back to plaintext, silently, whenever the
    /// server (or a man in the middle) answers that it offers none; otherwise `prefer`.
    ///
    /// Whenever TLS is used, the OpenSSL connector verifies the certificate chain and the host
    /// name: what libpq calls `verify-full` (tokio-postgres has no weaker verified mode).
    pub fn ssl_mode(&self) -> SslMode {
        let parsed = self.url.parse::<tokio_postgres::Config>().map(|config| config.get_ssl_mode());
        match parsed {
            Ok(mode) if sets_parameter(&self.url, "sslmode") => mode,
            _ if self.ca_file.is_some() => SslMode::Require,
            // An unparseable URL is refused by validation; tokio-postgres' default otherwise.
            _ => SslMode::Prefer,
        }
    }

    /// What TLS to PostgreSQL does with this config, in one line (`sluice check-config`).
    pub fn describe_tls(&self) -> String {
        let why = if sets_parameter(&self.url, "sslmode") {
            "the URL's sslmode"
        } else if self.ca_file.is_some() {
            "ca_file is set and the URL sets no sslmode"
        } else {
            "the URL sets no sslmode"
        };
        let trusted = match &self.ca_file {
            Some(ca) => format!("the system's CAs and ca_file {}", ca.display()),
            None => "the system's CAs".to_string(),
        };
        match self.ssl_mode() {
            SslMode::Disable => format!("disabled ({why}): plaintext"),
            SslMode::Require => format!("required ({why}): certificate and host name verified against {trusted}"),
            // `prefer`, and any mode a later tokio-postgres adds (the enum is non-exhaustive).
            _ => format!(
                "prefer ({why}): certificate and host name verified against {trusted} when the server offers \
                 TLS; falls back to plaintext if it offers none (sslmode=require or ca_file refuses that)"
            ),
        }
    }
}

/// `url` with every password replaced by [`REDACTED`]: the one in a URL's user info, a
/// `password` query parameter, a `password` key in `key=value` form (quoted or not, with or
/// without spaces around `=`).
pub fn redact_url_password(url: &str) -> String {
    let (parameters, unreadable) = parameters(url);
    let end = unreadable.unwrap_or(url.len());
    let mut shown = String::with_capacity(url.len());
    let mut at = 0;
    for parameter in parameters.iter().filter(|parameter| parameter.key == "password") {
        shown.push_str(&url[at..parameter.value.start]);
        shown.push_str(REDACTED);
        at = parameter.value.end;
    }
    shown.push_str(&url[at..end]);
    if unreadable.is_some() {
        shown.push_str(REDACTED);
    }
    shown
}

/// True if the connection string sets `key` itself.
pub(crate) fn sets_parameter(url: &str, key: &str) -> bool {
    parameters(url).0.iter().any(|parameter| parameter.key == key)
}

/// One parameter of a connection string: its name as the driver reads it, and where its value is.
struct Parameter {
    key: String,
    value: Range<usize>,
}

/// The parameters of `url` in the order they appear, and the byte offset where reading stopped
/// if the rest could not be read.
fn parameters(url: &str) -> (Vec<Parameter>, Option<usize>) {
    match ["postgres://", "postgresql://"].iter().find(|prefix| url.starts_with(**prefix)) {
        Some(prefix) => url_parameters(url, prefix.len()),
        None => key_value_parameters(url),
    }
}

/// `postgres://user:password@host,host:port/db?key=value&…`
fn url_parameters(url: &str, start: usize) -> (Vec<Parameter>, Option<usize>) {
    let mut parameters = Vec::new();
    let mut at = start;
    // Like tokio-postgres: the credentials run to the first `@` anywhere; the password is what
    // follows their first `:`.
    if let Some(credentials_end) = url[at..].find('@').map(|i| at + i) {
        if let Some(colon) = url[at..credentials_end].find(':') {
            parameters.push(Parameter { key: "password".into(), value: at + colon + 1..credentials_end });
        }
        at = credentials_end + 1;
    }
    at = url[at..].find(['/', '?']).map_or(url.len(), |i| at + i);
    if url[at..].starts_with('/') {
        at = url[at..].find('?').map_or(url.len(), |i| at + i);
    }
    if !url[at..].starts_with('?') {
        return (parameters, None);
    }
    at += 1;
    while at < url.len() {
        let Some(equals) = url[at..].find('=').map(|i| at + i) else {
            return (parameters, Some(at));
        };
        let value_end = url[equals + 1..].find('&').map_or(url.len(), |i| equals + 1 + i);
        parameters.push(Parameter { key: percent_decode(&url[at..equals]), value: equals + 1..value_end });
        at = (value_end + 1).min(url.len());
    }
    (parameters, None)
}

/// libpq's `key=value key = 'quoted \' value'` form. Whitespace is Unicode's, as for
/// tokio-postgres.
fn key_value_parameters(text: &str) -> (Vec<Parameter>, Option<usize>) {
    let mut parameters = Vec::new();
    let mut chars = text.char_indices().peekable();
    let position = |chars: &mut Peekable<CharIndices>| chars.peek().map_or(text.len(), |&(i, _)| i);
    let skip_space = |chars: &mut Peekable<CharIndices>| while chars.next_if(|&(_, c)| c.is_whitespace()).is_some() {};
    loop {
        skip_space(&mut chars);
        let key_start = position(&mut chars);
        while chars.next_if(|&(_, c)| !c.is_whitespace() && c != '=').is_some() {}
        let key_end = position(&mut chars);
        if key_start == key_end {
            // The end, or an `=` with no key (tokio-postgres stops reading there: hide the rest).
            return (parameters, (key_start < text.len()).then_some(key_start));
        }
        skip_space(&mut chars);
        if chars.next_if(|&(_, c)| c == '=').is_none() {
            return (parameters, Some(key_start));
        }
        skip_space(&mut chars);
        let value_start = position(&mut chars);
        if chars.next_if(|&(_, c)| c == '\'').is_some() {
            loop {
                match chars.next() {
                    None => return (parameters, Some(value_start)),
                    Some((_, '\\')) => _ = chars.next(),
                    Some((_, '\'')) => break,
                    Some(_) => {}
                }
            }
        } else {
            while let Some((_, c)) = chars.next_if(|&(_, c)| !c.is_whitespace()) {
                if c == '\\' {
                    chars.next();
                }
            }
        }
        let value_end = position(&mut chars);
        if value_end == value_start {
            return (parameters, Some(value_start));
        }
        parameters.push(Parameter { key: text[key_start..key_end].to_string(), value: value_start..value_end });
    }
}

/// `%XX` escapes decoded (parameter names only; invalid escapes are kept as they are).
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let escaped = (bytes[at] == b'%')
            .then(|| text.get(at + 1..at + 3))
            .flatten()
            .filter(|hex| hex.bytes().all(|b| b.is_ascii_hexdigit()))
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escaped {
            Some(byte) => {
                decoded.push(byte);
                at += 3;
            }
            None => {
                decoded.push(bytes[at]);
                at += 1;
            }
        }
    }
    String::from_utf8_lossy(&decoded).into_owned()
}
