//! `[kafka]`: the connection the agent's producer and the persister's consumer share, and the
//! librdkafka properties sluice manages itself (no pass-through map may set them).
//!
//! Owns: the section's schema and checks, [`MANAGED_KAFKA_PROPERTIES`] and
//! [`REFUSED_KAFKA_PROPERTIES`] (docs/LIBRDKAFKA.md: every librdkafka property and what sluice
//! does with it). Must not: build a client (ship and persist do).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{At, ConfigError};

/// `[kafka]`
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaConfig {
    /// Bootstrap servers, comma-separated `host:port`. Default `"127.0.0.1:9092"`.
    pub brokers: String,
    /// The topic the agent produces to and the persister consumes. Default `"sluice-logs"`.
    /// May be a template over the pod and each record (`"logs.{pod.namespace}"`,
    /// `"logs.{record.service}"`; `src/template.rs`): then `default_topic` takes what it cannot
    /// route, and the persister subscribes by pattern (`persist.topics`).
    pub topic: String,
    /// With a templated `topic`: the topic of a record it cannot route — a field it names is
    /// missing, the rendered name is not a Kafka topic name, the agent already routes to
    /// `max_topics` topics, or the broker does not know the topic. Each counted in
    /// `sluice_ingest_topic_defaults_total{reason}`. Required with a template; unset otherwise.
    pub default_topic: Option<String>,
    /// With a templated `topic`: how many distinct topics one agent routes to (from its start, or
    /// the reload that set the template); a record that would open one more goes to
    /// `default_topic`, counted `max_topics`: a hostile field cannot create unbounded topics.
    /// Default `64`.
    pub max_topics: usize,
    /// librdkafka properties passed through to both producer and consumer (TLS, SASL, ...).
    /// Keys that sluice manages itself (acks, idempotence, queue sizes, ...) are rejected here
    /// and must be set through their own key. Values of keys that look secret are redacted
    /// when shown.
    pub properties: BTreeMap<String, String>,
    /// librdkafka properties whose values are secrets, read from environment variables (a
    /// Kubernetes Secret) at start: property name → variable name, e.g.
    /// `"sasl.password" = "SLUICE_KAFKA_SASL_PASSWORD"`. A missing variable is a config error.
    pub properties_from_env: BTreeMap<String, String>,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        Self {
            brokers: "127.0.0.1:9092".into(),
            topic: "sluice-logs".into(),
            default_topic: None,
            max_topics: 64,
            properties: BTreeMap::new(),
            properties_from_env: BTreeMap::new(),
        }
    }
}

impl KafkaConfig {
    /// `properties` and the values of `properties_from_env`, for a librdkafka client.
    pub fn client_properties(&self) -> BTreeMap<String, String> {
        let mut properties = self.properties.clone();
        for (property, variable) in &self.properties_from_env {
            if let Ok(value) = std::env::var(variable) {
                properties.insert(property.clone(), value);
            }
        }
        properties
    }
}

/// librdkafka properties that sluice sets itself; setting them through a pass-through map
/// would silently weaken a guarantee (acks, idempotence) or a bound (queue sizes).
pub(super) const MANAGED_KAFKA_PROPERTIES: &[(&str, &str)] = &[
    ("bootstrap.servers", "kafka.brokers"),
    ("metadata.broker.list", "kafka.brokers"),
    ("acks", "(always `all`)"),
    ("request.required.acks", "(always `all`)"),
    ("enable.idempotence", "(always `true`)"),
    ("queue.buffering.max.kbytes", "buffer.max_bytes"),
    ("queue.buffering.max.messages", "buffer.max_records"),
    ("message.timeout.ms", "ship.delivery_timeout"),
    ("delivery.timeout.ms", "ship.delivery_timeout"),
    ("compression.type", "ship.compression"),
    ("compression.codec", "ship.compression"),
    ("linger.ms", "ship.linger"),
    ("queue.buffering.max.ms", "ship.linger"),
    ("batch.size", "ship.batch_size"),
    ("group.id", "persist.group_id"),
    ("enable.auto.commit", "(managed by the persister)"),
    ("enable.auto.offset.store", "(managed by the persister)"),
    // librdkafka verifies brokers' certificates and host names by default; there is no sluice
    // key to turn that off, so neither may a pass-through map.
    ("enable.ssl.certificate.verification", "(always verified)"),
    ("ssl.endpoint.identification.algorithm", "(always verified)"),
    // Set by sluice after the pass-through maps: a value there was silently replaced.
    ("statistics.interval.ms", "(always 5 s: the sluice_kafka_* metrics come from it)"),
];

/// Managed for the agent's producer only (`kafka.properties`, `ship.properties`): the
/// persister's consumer may set them in `persist.properties`.
const MANAGED_PRODUCER_PROPERTIES: &[(&str, &str)] = &[(
    "message.max.bytes",
    "ingest.listeners.<name>.max_record_size (the producer's is sized for the largest message)",
)];

/// librdkafka properties no pass-through map may set, each with why: with them the agent would
/// stall or lie (docs/LIBRDKAFKA.md lists every property and what sluice does with it). Two
/// failure shapes: nothing is ever reported delivered (every record's memory stays held, and
/// what Kafka stored is counted lost at the exit), or every produce fails and is retried for
/// ever.
pub(super) const REFUSED_KAFKA_PROPERTIES: &[(&str, &str)] = &[
    (
        "delivery.report.only.error",
        "would stop librdkafka reporting delivered records: none would ever give its memory back (the buffer fills after ~200k records) and, at the exit, every record Kafka stored would be counted lost",
    ),
    (
        "transactional.id",
        "makes the producer transactional, and sluice produces without transactions: every send would fail (ERR__STATE) and be retried for ever",
    ),
    (
        "api.version.request",
        "false would keep librdkafka from learning the brokers' versions, which the idempotent producer needs: it would fail at birth, and every replacement with it",
    ),
    (
        "topic.blacklist",
        "hides topics from this client; one matching kafka.topic would make every send fail for ever as an unknown topic",
    ),
    (
        "log.queue",
        "would route librdkafka's log lines to a queue sluice does not serve: they would be lost, or warned about one by one",
    ),
];

impl KafkaConfig {
    /// Checks what types alone cannot.
    pub(super) fn validate(&self, at: &At<'_>) -> Result<(), ConfigError> {
        if self.brokers.trim().is_empty() {
            return Err(at.invalid("brokers", "must name at least one host:port"));
        }
        match self.topic_template() {
            None if !valid_topic(&self.topic) => {
                return Err(at.invalid(
                    "topic",
                    format!("`{}` is not a Kafka topic name ([a-zA-Z0-9._-], 1-249 chars) nor a template", self.topic),
                ));
            }
            None => {
                if self.default_topic.is_some() {
                    return Err(at.invalid("default_topic", "is for a templated kafka.topic; this one is a plain name"));
                }
            }
            Some(Err(error)) => return Err(at.invalid("topic", format!("not a template: {error}"))),
            Some(Ok(template)) => {
                match template.pattern_parts().next() {
                    Some(Some(prefix)) if !prefix.starts_with('_') => {}
                    _ => {
                        return Err(at.invalid(
                            "topic",
                            "a template must begin with literal text (\"logs.{record.service}\"), not `_`: a record is \
                             then routed only to topics that begin with that text, never to Kafka's own (`__…`) or \
                             those tools keep (`_schemas`, `_confluent-…`), and the persister's pattern stays within yours",
                        ));
                    }
                }
                if let Some(bad) =
                    template.pattern_parts().flatten().flat_map(str::chars).find(|c| !valid_topic_char(*c))
                {
                    return Err(
                        at.invalid("topic", format!("`{bad}` cannot be in a Kafka topic name ([a-zA-Z0-9._-])"))
                    );
                }
                match &self.default_topic {
                    None => {
                        return Err(at.invalid(
                            "default_topic",
                            "must be set with a templated kafka.topic (the topic of a record the template cannot route)",
                        ));
                    }
                    Some(topic) if !valid_topic(topic) => {
                        return Err(at.invalid(
                            "default_topic",
                            format!("`{topic}` is not a Kafka topic name ([a-zA-Z0-9._-], 1-249 chars)"),
                        ));
                    }
                    Some(_) => {}
                }
                if !(1..=10_000).contains(&self.max_topics) {
                    return Err(at.invalid("max_topics", "must be between 1 and 10000"));
                }
            }
        }
        for (property, variable) in &self.properties_from_env {
            if at.environment == super::Environment::Read && std::env::var_os(variable).is_none() {
                return Err(at.invalid(
                    &format!("properties_from_env.\"{property}\""),
                    format!("environment variable {variable} is not set"),
                ));
            }
        }
        reject_managed(at, "properties", &self.properties, Clients::Both)?;
        reject_refused(at, "properties", &self.properties)?;
        reject_managed(at, "properties_from_env", &self.properties_from_env, Clients::Both)
    }
}

/// Which client a pass-through map configures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Clients {
    /// The agent's producer and the persister's consumer (`kafka.properties`).
    Both,
    /// The agent's producer (`ship.properties`).
    Producer,
    /// The persister's consumer (`persist.properties`).
    Consumer,
}

/// A pass-through map (`<section>.<key>`) must not set a property sluice manages for the
/// `clients` it configures, nor one it refuses.
pub(super) fn reject_managed(
    at: &At<'_>,
    key: &str,
    properties: &BTreeMap<String, String>,
    clients: Clients,
) -> Result<(), ConfigError> {
    let producer = if clients == Clients::Consumer { &[][..] } else { MANAGED_PRODUCER_PROPERTIES };
    for property in properties.keys() {
        if let Some((_, instead)) = MANAGED_KAFKA_PROPERTIES.iter().chain(producer).find(|(name, _)| name == property) {
            return Err(at.invalid(&format!("{key}.\"{property}\""), format!("is managed by sluice; use {instead}")));
        }
        if let Some((_, why)) = REFUSED_KAFKA_PROPERTIES.iter().find(|(name, _)| name == property) {
            return Err(at.invalid(&format!("{key}.\"{property}\""), format!("is refused: it {why}")));
        }
    }
    Ok(())
}

/// Refuses a pass-through property librdkafka itself would refuse (an unknown name, a value out
/// of its range): found here, the key is named (exit 78) — found when a producer is made, the
/// agent exited 1, or a reload was taken and every later producer failed to be made. Each
/// property is set on a configuration of its own, as librdkafka checks them one by one; checks
/// across properties are librdkafka's when the client is made. `plugin.*` is left to then:
/// setting it loads the plugin.
pub(super) fn reject_refused(at: &At<'_>, key: &str, properties: &BTreeMap<String, String>) -> Result<(), ConfigError> {
    for (property, value) in properties {
        if property.starts_with("plugin.") {
            continue;
        }
        let mut client = rdkafka::ClientConfig::new();
        client.set(property, value);
        if let Err(error) = client.create_native_config() {
            let why = match error {
                rdkafka::error::KafkaError::ClientConfig(_, description, _, _) => description,
                other => other.to_string(),
            };
            return Err(at.invalid(&format!("{key}.\"{property}\""), format!("is refused by librdkafka: {why}")));
        }
    }
    Ok(())
}

impl KafkaConfig {
    /// `topic` as a template, if it is one (it holds a brace).
    pub fn topic_template(&self) -> Option<Result<crate::template::Template, crate::template::TemplateError>> {
        self.topic.contains(['{', '}']).then(|| crate::template::Template::parse(&self.topic))
    }

    /// The topic of a record nothing else routes: `default_topic` with a template, else `topic`.
    pub fn fallback_topic(&self) -> &str {
        match (&self.default_topic, self.topic_template()) {
            (Some(topic), Some(_)) => topic,
            _ => &self.topic,
        }
    }

    /// A regular expression (librdkafka's subscription syntax: `^` first) matching every topic
    /// `topic` can render, for the persister's default subscription: literal parts escaped, each
    /// field any text. `None` for a plain topic.
    pub fn topic_pattern(&self) -> Option<String> {
        let template = self.topic_template()?.ok()?;
        let mut pattern = String::from("^");
        for part in template.pattern_parts() {
            match part {
                // A topic name's only character special in a pattern is `.` (librdkafka's regex
                // engine takes `\.`; `regex::escape` would also escape `-`, which it may not).
                Some(literal) => pattern.push_str(&literal.replace('.', "\\.")),
                None => pattern.push_str(".*"),
            }
        }
        pattern.push('$');
        Some(pattern)
    }
}

/// Whether `topic` is a name Kafka takes: 1-249 of `[a-zA-Z0-9._-]`, not `.` or `..`.
pub fn valid_topic(topic: &str) -> bool {
    !topic.is_empty() && topic.len() <= 249 && topic != "." && topic != ".." && topic.chars().all(valid_topic_char)
}

fn valid_topic_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '.' || c == '_' || c == '-'
}
