//! Each record's Kafka topic: `kafka.topic` as a plain name, or as a template over the pod and
//! the record (`"logs.{pod.namespace}"`, `"logs.{record.service}"`) with `kafka.default_topic`
//! for what it cannot route.
//!
//! Owns: routing one record (the template rendered, the name checked, the agent's distinct
//! topics capped at `kafka.max_topics`), topics the broker said it does not know (sent to the
//! default topic for [`UNKNOWN_FOR`], then tried again), the counts of records sent to the
//! default topic by reason, and replacing the route on a reload — records already routed keep
//! their topic (it travels with them, through the spool too). Must not: block (one read lock
//! per templated record; a write lock only for a topic seen the first time), or hold more than
//! `max_topics` names per route.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use metrics::Counter;
use tracing::warn;

use crate::buffer::Topic;
use crate::config::{KafkaConfig, valid_topic};
use crate::envelope::PodMetadata;
use crate::telemetry;
use crate::template::Template;

/// How long a topic the broker does not know takes the default topic's place before it is tried
/// again (it may have been created meanwhile).
pub const UNKNOWN_FOR: Duration = Duration::from_secs(60);

pub use crate::telemetry::outcome::Defaulted;

/// One config's way of routing records.
#[derive(Debug)]
pub struct Route {
    kind: Kind,
    default: Topic,
}

#[derive(Debug)]
enum Kind {
    /// Every record to one topic (a plain `kafka.topic`, or a template of pod fields only that
    /// could not render: the default topic, with the reason).
    Fixed(Topic, Option<Defaulted>),
    /// Every record to the topic a template of pod fields only rendered once, unless the broker
    /// does not know it (then the default topic for [`UNKNOWN_FOR`], as a per-record template's).
    Pod(Known),
    /// Rendered per record.
    Template { template: Template, pod: Box<PodMetadata>, max_topics: usize, known: RwLock<HashMap<Box<str>, Known>> },
}

/// A topic a route sends to.
#[derive(Debug)]
struct Known {
    topic: Topic,
    /// Until when (Unix ms) the broker is taken not to know it; 0: it is sent to.
    unknown_until: AtomicU64,
}

impl Route {
    /// The route `kafka` describes for `pod`.
    pub fn new(kafka: &KafkaConfig, pod: &PodMetadata) -> Self {
        let default = Topic::from(kafka.fallback_topic());
        let kind = match kafka.topic_template() {
            None => Kind::Fixed(Topic::from(kafka.topic.as_str()), None),
            Some(Ok(template)) if !template.reads_records() => {
                let mut name = String::new();
                if !template.render(pod, "", &mut name) {
                    warn!(template = %template, default = %default, "kafka.topic names a pod field the Downward API does not give; every record goes to kafka.default_topic");
                    Kind::Fixed(default.clone(), Some(Defaulted::MissingField))
                } else if !valid_topic(&name) {
                    warn!(template = %template, topic = %name, default = %default, "kafka.topic renders a name Kafka refuses for this pod; every record goes to kafka.default_topic");
                    Kind::Fixed(default.clone(), Some(Defaulted::InvalidTopic))
                } else {
                    Kind::Pod(Known { topic: Topic::from(name), unknown_until: AtomicU64::new(0) })
                }
            }
            Some(Ok(template)) => Kind::Template {
                template,
                pod: Box::new(pod.clone()),
                max_topics: kafka.max_topics,
                known: RwLock::new(HashMap::new()),
            },
            // Validated at load: not reached.
            Some(Err(_)) => Kind::Fixed(default.clone(), None),
        };
        Self { kind, default }
    }

    /// The default topic.
    pub fn default_topic(&self) -> &Topic {
        &self.default
    }

    /// The topic for `record` (its text as written), or the default topic and why. `scratch` is
    /// the caller's, kept between records.
    pub fn route(&self, record: &str, scratch: &mut String) -> (Topic, Option<Defaulted>) {
        let (template, pod, max_topics, known) = match &self.kind {
            Kind::Fixed(topic, why) => return (topic.clone(), *why),
            Kind::Pod(known) => return known.route(now_ms(), &self.default),
            Kind::Template { template, pod, max_topics, known } => (template, pod, *max_topics, known),
        };
        if !template.render(pod, record, scratch) {
            return (self.default.clone(), Some(Defaulted::MissingField));
        }
        let now = now_ms();
        {
            let known = known.read().unwrap_or_else(|poisoned| poisoned.into_inner());
            if let Some(entry) = known.get(scratch.as_str()) {
                return entry.route(now, &self.default);
            }
            if !valid_topic(scratch) {
                return (self.default.clone(), Some(Defaulted::InvalidTopic));
            }
            if known.len() >= max_topics {
                return (self.default.clone(), Some(Defaulted::MaxTopics));
            }
        }
        let mut known = known.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(entry) = known.get(scratch.as_str()) {
            return entry.route(now, &self.default);
        }
        if known.len() >= max_topics {
            return (self.default.clone(), Some(Defaulted::MaxTopics));
        }
        let topic = Topic::from(scratch.as_str());
        known.insert(scratch.as_str().into(), Known { topic: topic.clone(), unknown_until: AtomicU64::new(0) });
        metrics::gauge!(telemetry::INGEST_TOPICS).set(known.len() as f64);
        (topic, None)
    }

    /// How many topics it routes to.
    pub fn topics(&self) -> usize {
        match &self.kind {
            Kind::Fixed(..) | Kind::Pod(_) => 1,
            Kind::Template { known, .. } => known.read().unwrap_or_else(|poisoned| poisoned.into_inner()).len(),
        }
    }

    /// The broker does not know `topic`: records routed to it go to the default topic for
    /// [`UNKNOWN_FOR`].
    fn unknown(&self, topic: &str) {
        match &self.kind {
            Kind::Fixed(..) => {}
            Kind::Pod(known) if &*known.topic == topic => known.unknown(topic, &self.default),
            Kind::Pod(_) => {}
            Kind::Template { known, .. } => {
                if let Some(entry) = known.read().unwrap_or_else(|poisoned| poisoned.into_inner()).get(topic) {
                    entry.unknown(topic, &self.default);
                }
            }
        }
    }
}

impl Known {
    /// The broker does not know it: the default topic takes its place for [`UNKNOWN_FOR`].
    fn unknown(&self, topic: &str, default: &Topic) {
        let now = now_ms();
        // Logged once per topic and minute, not per record.
        if self.unknown_until.swap(now + UNKNOWN_FOR.as_millis() as u64, Ordering::Relaxed) <= now {
            warn!(topic, default = %default, "kafka does not know the topic; its records go to kafka.default_topic for a minute, counted unknown_topic");
        }
    }

    fn route(&self, now: u64, default: &Topic) -> (Topic, Option<Defaulted>) {
        if self.unknown_until.load(Ordering::Relaxed) > now {
            (default.clone(), Some(Defaulted::UnknownTopic))
        } else {
            (self.topic.clone(), None)
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_millis() as u64)
}

/// The route in force, which a config reload may replace, shared by every connection (each keeps
/// a copy and takes the lock only when the generation says it changed) and the shipper.
#[derive(Debug)]
pub struct Topics {
    route: RwLock<Arc<Route>>,
    generation: AtomicU64,
    defaulted: [Counter; 4],
}

impl Topics {
    /// Starts with the route `kafka` describes for `pod`.
    pub fn new(kafka: &KafkaConfig, pod: &PodMetadata) -> Self {
        let route = Route::new(kafka, pod);
        metrics::gauge!(telemetry::INGEST_TOPICS).set(route.topics() as f64);
        Self {
            route: RwLock::new(Arc::new(route)),
            generation: AtomicU64::new(0),
            defaulted: Defaulted::ALL
                .map(|why| metrics::counter!(telemetry::INGEST_TOPIC_DEFAULTS, telemetry::REASON => why.as_str())),
        }
    }

    /// Replaces the route (a config reload); records routed after this use the new one.
    pub fn set(&self, kafka: &KafkaConfig, pod: &PodMetadata) {
        let route = Route::new(kafka, pod);
        metrics::gauge!(telemetry::INGEST_TOPICS).set(route.topics() as f64);
        *self.route.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = Arc::new(route);
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// The route in force, from `cached` unless it changed since it was read.
    pub fn current<'a>(&self, cached: &'a mut Option<(u64, Arc<Route>)>) -> &'a Route {
        let generation = self.generation.load(Ordering::Acquire);
        match cached {
            Some((read_at, _)) if *read_at == generation => {}
            _ => *cached = Some((generation, self.now())),
        }
        &cached.as_ref().expect("just set").1
    }

    fn now(&self) -> Arc<Route> {
        self.route.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// The default topic of the route in force.
    pub fn default_topic(&self) -> Topic {
        self.now().default.clone()
    }

    /// Counts `n` records sent to the default topic for `why`.
    pub fn count(&self, why: Defaulted, n: u64) {
        self.defaulted[why as usize].increment(n);
    }

    /// The broker does not know `topic` (a record's delivery failed for it): where that record
    /// goes instead, counted — the default topic, or `None` if `topic` is the default topic
    /// itself (nothing else to try: it waits in the buffer, as any record does while Kafka
    /// cannot take it). Records routed to `topic` meanwhile go to the default topic too, for
    /// [`UNKNOWN_FOR`].
    pub fn unknown(&self, topic: &str) -> Option<Topic> {
        let route = self.now();
        if topic == &*route.default {
            return None;
        }
        route.unknown(topic);
        self.count(Defaulted::UnknownTopic, 1);
        Some(route.default.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::pod;

    fn kafka(topic: &str, max_topics: usize) -> KafkaConfig {
        KafkaConfig {
            topic: topic.into(),
            default_topic: Some("logs.other".into()),
            max_topics,
            ..KafkaConfig::default()
        }
    }

    #[test]
    fn routes_by_record_field_and_defaults_a_record_without_it() {
        let route = Route::new(&kafka("logs.{record.service}", 8), &pod());
        let mut scratch = String::new();
        assert_eq!(route.route(r#"{"service":"cart"}"#, &mut scratch), (Topic::from("logs.cart"), None));
        assert_eq!(route.route(r#"{"n":1}"#, &mut scratch), (Topic::from("logs.other"), Some(Defaulted::MissingField)));
        assert_eq!(route.route("plain text", &mut scratch).1, Some(Defaulted::MissingField));
    }

    #[test]
    fn a_name_kafka_forbids_goes_to_the_default_topic() {
        let route = Route::new(&kafka("logs.{record.service}", 8), &pod());
        let mut scratch = String::new();
        for bad in [r#"{"service":"a b"}"#, r#"{"service":"ü"}"#, &format!(r#"{{"service":"{}"}}"#, "x".repeat(250))] {
            assert_eq!(route.route(bad, &mut scratch), (Topic::from("logs.other"), Some(Defaulted::InvalidTopic)));
        }
        assert_eq!(route.topics(), 0);
    }

    #[test]
    fn caps_distinct_topics_at_max_topics() {
        let route = Route::new(&kafka("logs.{record.service}", 2), &pod());
        let mut scratch = String::new();
        assert_eq!(route.route(r#"{"service":"a"}"#, &mut scratch).1, None);
        assert_eq!(route.route(r#"{"service":"b"}"#, &mut scratch).1, None);
        assert_eq!(
            route.route(r#"{"service":"c"}"#, &mut scratch),
            (Topic::from("logs.other"), Some(Defaulted::MaxTopics))
        );
        assert_eq!(
            route.route(r#"{"service":"a"}"#, &mut scratch),
            (Topic::from("logs.a"), None),
            "known ones still route"
        );
        assert_eq!(route.topics(), 2);
    }

    #[test]
    fn a_pod_only_template_is_rendered_once() {
        let route = Route::new(&kafka("logs.{pod.namespace}", 1), &pod());
        let mut scratch = String::new();
        assert_eq!(route.route("anything", &mut scratch), (Topic::from("logs.shop"), None));
        let no_node = Route::new(&kafka("logs.{pod.node}", 1), &pod());
        assert_eq!(no_node.route("x", &mut scratch), (Topic::from("logs.other"), Some(Defaulted::MissingField)));
    }

    #[test]
    fn an_unknown_topic_goes_to_the_default_topic_for_a_while() {
        let topics = Topics::new(&kafka("logs.{record.service}", 8), &pod());
        let mut cached = None;
        let mut scratch = String::new();
        let cart = r#"{"service":"cart"}"#;
        assert_eq!(topics.current(&mut cached).route(cart, &mut scratch).1, None);
        assert_eq!(topics.unknown("logs.cart"), Some(Topic::from("logs.other")));
        assert_eq!(
            topics.current(&mut cached).route(cart, &mut scratch),
            (Topic::from("logs.other"), Some(Defaulted::UnknownTopic))
        );
        assert_eq!(topics.unknown("logs.other"), None, "the default topic has nowhere else to go");
    }

    #[test]
    fn a_pod_only_templates_unknown_topic_goes_to_the_default_topic_for_a_while_too() {
        let topics = Topics::new(&kafka("logs.{pod.namespace}", 8), &pod());
        let mut cached = None;
        let mut scratch = String::new();
        assert_eq!(topics.current(&mut cached).route("x", &mut scratch), (Topic::from("logs.shop"), None));
        assert_eq!(topics.unknown("logs.shop"), Some(Topic::from("logs.other")));
        assert_eq!(
            topics.current(&mut cached).route("x", &mut scratch),
            (Topic::from("logs.other"), Some(Defaulted::UnknownTopic)),
            "the next records go to the default topic at once, not each sent twice"
        );
    }

    #[test]
    fn a_reload_replaces_the_route_for_records_routed_after_it() {
        let topics = Topics::new(&kafka("logs.{record.service}", 8), &pod());
        let mut cached = None;
        let mut scratch = String::new();
        assert_eq!(&*topics.current(&mut cached).route(r#"{"service":"a"}"#, &mut scratch).0, "logs.a");
        topics.set(&KafkaConfig { topic: "plain".into(), ..KafkaConfig::default() }, &pod());
        assert_eq!(&*topics.current(&mut cached).route(r#"{"service":"a"}"#, &mut scratch).0, "plain");
        assert_eq!(&*topics.default_topic(), "plain");
    }
}
