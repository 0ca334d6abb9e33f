//! Showing a config without its secrets (`check-config`, `/config`, logs).
//!
//! Owns: what counts as a secret (URL passwords, secret-looking Kafka properties) and the
//! redacted copy. Must not: change the running config.

use super::postgres::redact_url_password;
use super::{Config, REDACTED};

impl Config {
    /// A copy safe to print: passwords in URLs and secret-looking Kafka properties replaced.
    pub fn redacted(&self) -> Config {
        let mut shown = self.clone();
        for properties in [&mut shown.kafka.properties, &mut shown.ship.properties, &mut shown.persist.properties] {
            for (key, value) in properties.iter_mut() {
                if is_secret_key(key) {
                    *value = REDACTED.into();
                }
            }
        }
        shown.postgres.url = redact_url_password(&shown.postgres.url);
        shown
    }

    /// The effective config as TOML, secrets redacted.
    pub fn to_redacted_toml(&self) -> String {
        toml::to_string_pretty(&self.redacted()).unwrap_or_else(|error| format!("# cannot render: {error}\n"))
    }
}

fn is_secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    // `sasl.oauthbearer.config` carries client ids and secrets as `key=value` pairs.
    ["password", "secret", "token", "jaas", "key.pem", "private", "oauthbearer.config"]
        .iter()
        .any(|word| key.contains(word))
}
