//! Serde forms the schema shares between sections.
//!
//! Owns: how those values are written in TOML. Must not: validate (the sections do).

/// `block_timeout`: a duration, or `"forever"` for no limit.
pub(super) mod duration_or_forever {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &Option<Duration>, serializer: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(duration) => serializer.collect_str(&humantime::format_duration(*duration)),
            None => serializer.serialize_str("forever"),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Duration>, D::Error> {
        let text = String::deserialize(deserializer)?;
        if text == "forever" {
            return Ok(None);
        }
        humantime::parse_duration(&text)
            .map(Some)
            .map_err(|_| serde::de::Error::custom(format!("`{text}` is not a duration like \"1s\" or \"forever\"")))
    }
}
