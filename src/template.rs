//! Templates over a record's pod and its fields: `"{pod.namespace}/{record.user}"`, for the Kafka
//! key (`ship.key = "template"`) and the topic (`kafka.topic`).
//!
//! Owns: the syntax — literal text, and `{pod.name}`, `{pod.namespace}`, `{pod.container}`,
//! `{pod.node}` (the Downward API's), `{pod.labels.NAME}`, `{pod.annotations.NAME}`
//! (`[agent.pod_info]`), `{record.FIELD}` (a top-level field of a JSON record: a
//! string's content, any other value's JSON text); `{{` and `}}` are literal braces — checked at
//! load, and rendering one record. Must not: allocate per record beyond the rendered text, or
//! render a value that is not there (a missing pod or record field renders nothing at all: the
//! caller decides what a record without it gets).

use std::fmt;

use crate::envelope::PodMetadata;

/// A template, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    Pod(PodField),
    Label(String),
    Annotation(String),
    Record(String),
}

/// A Downward API field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PodField {
    Name,
    Namespace,
    Container,
    Node,
}

/// Why a template does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TemplateError(String);

impl Template {
    /// Parses `text`.
    pub fn parse(text: &str) -> Result<Self, TemplateError> {
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut rest = text;
        while let Some(at) = rest.find(['{', '}']) {
            literal.push_str(&rest[..at]);
            let brace = &rest[at..];
            if brace.starts_with("{{") || brace.starts_with("}}") {
                literal.push_str(&brace[..1]);
                rest = &brace[2..];
                continue;
            }
            if brace.starts_with('}') {
                return Err(TemplateError(format!(
                    "a lone `}}` at byte {} (write `}}}}` for a brace)",
                    text.len() - brace.len()
                )));
            }
            let Some(end) = brace.find('}') else {
                return Err(TemplateError("a `{` without its `}`".into()));
            };
            let name = &brace[1..end];
            let part = match name {
                "pod.name" => Part::Pod(PodField::Name),
                "pod.namespace" => Part::Pod(PodField::Namespace),
                "pod.container" => Part::Pod(PodField::Container),
                "pod.node" => Part::Pod(PodField::Node),
                _ => {
                    let named =
                        |prefix: &str| name.strip_prefix(prefix).filter(|n| !n.is_empty() && !n.contains(['{', '"']));
                    if let Some(field) = named("record.") {
                        Part::Record(field.to_string())
                    } else if let Some(label) = named("pod.labels.") {
                        Part::Label(label.to_string())
                    } else if let Some(annotation) = named("pod.annotations.") {
                        Part::Annotation(annotation.to_string())
                    } else {
                        return Err(TemplateError(format!(
                            "`{{{name}}}`: a template names pod.name, pod.namespace, pod.container, pod.node, pod.labels.NAME, pod.annotations.NAME or record.FIELD"
                        )));
                    }
                }
            };
            if !literal.is_empty() {
                parts.push(Part::Literal(std::mem::take(&mut literal)));
            }
            parts.push(part);
            rest = &brace[end + 1..];
        }
        literal.push_str(rest);
        if !literal.is_empty() {
            parts.push(Part::Literal(literal));
        }
        if parts.is_empty() {
            return Err(TemplateError("an empty template".into()));
        }
        Ok(Self { parts })
    }

    /// Whether it reads record fields (else it renders the same for every record).
    pub fn reads_records(&self) -> bool {
        self.parts.iter().any(|part| matches!(part, Part::Record(_)))
    }

    /// Whether it names a pod label or annotation (which change while the agent runs).
    pub fn reads_pod_info(&self) -> bool {
        self.parts.iter().any(|part| matches!(part, Part::Label(_) | Part::Annotation(_)))
    }

    /// Its parts in order: `Some(text)` for literal text, `None` for a field (what the persister's
    /// topic pattern matches with any text).
    pub fn pattern_parts(&self) -> impl Iterator<Item = Option<&str>> {
        self.parts.iter().map(|part| match part {
            Part::Literal(text) => Some(text.as_str()),
            _ => None,
        })
    }

    /// Renders for `record` (its text as written) on `pod` into `out` (cleared first); false,
    /// with `out` unspecified, if a field it names is missing.
    pub fn render(&self, pod: &PodMetadata, record: &str, out: &mut String) -> bool {
        out.clear();
        // A record's fields are read once, and only if a part needs them.
        let mut fields: Option<
            Option<std::collections::HashMap<std::borrow::Cow<'_, str>, &serde_json::value::RawValue>>,
        > = None;
        for part in &self.parts {
            match part {
                Part::Literal(text) => out.push_str(text),
                Part::Pod(field) => {
                    let value = match field {
                        PodField::Name => &pod.name,
                        PodField::Namespace => &pod.namespace,
                        PodField::Container => &pod.container,
                        PodField::Node => &pod.node,
                    };
                    match value {
                        Some(value) => out.push_str(value),
                        None => return false,
                    }
                }
                Part::Label(name) | Part::Annotation(name) => {
                    let map = if matches!(part, Part::Label(_)) { &pod.info.labels } else { &pod.info.annotations };
                    match map.get(name) {
                        Some(value) => out.push_str(value),
                        None => return false,
                    }
                }
                Part::Record(field) => {
                    let fields = fields.get_or_insert_with(|| {
                        crate::envelope::is_json_object(record).then(|| serde_json::from_str(record).ok()).flatten()
                    });
                    let Some(value) = fields.as_ref().and_then(|fields| fields.get(field.as_str())) else {
                        return false;
                    };
                    match serde_json::from_str::<std::borrow::Cow<'_, str>>(value.get()) {
                        Ok(text) => out.push_str(&text),
                        Err(_) => out.push_str(value.get()),
                    }
                }
            }
        }
        true
    }
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for part in &self.parts {
            match part {
                Part::Literal(text) => write!(f, "{}", text.replace('{', "{{").replace('}', "}}"))?,
                Part::Pod(PodField::Name) => write!(f, "{{pod.name}}")?,
                Part::Pod(PodField::Namespace) => write!(f, "{{pod.namespace}}")?,
                Part::Pod(PodField::Container) => write!(f, "{{pod.container}}")?,
                Part::Pod(PodField::Node) => write!(f, "{{pod.node}}")?,
                Part::Label(name) => write!(f, "{{pod.labels.{name}}}")?,
                Part::Annotation(name) => write!(f, "{{pod.annotations.{name}}}")?,
                Part::Record(field) => write!(f, "{{record.{field}}}")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::pod;

    #[test]
    fn renders_pod_fields_record_fields_and_literals() {
        let template = Template::parse("{pod.namespace}/{record.user}-{record.n}{{x}}").expect("parse");
        let mut out = String::new();
        assert!(template.render(&pod(), r#"{"user":"ann","n":12}"#, &mut out));
        assert_eq!(out, "shop/ann-12{x}");
        assert!(template.reads_records());
        assert_eq!(template.to_string(), "{pod.namespace}/{record.user}-{record.n}{{x}}");
    }

    #[test]
    fn a_missing_field_renders_nothing() {
        let mut out = String::new();
        assert!(!Template::parse("{record.user}").expect("parse").render(&pod(), r#"{"n":1}"#, &mut out));
        assert!(!Template::parse("{record.user}").expect("parse").render(&pod(), "plain text", &mut out));
        assert!(!Template::parse("{pod.node}").expect("parse").render(&pod(), "{}", &mut out), "no NODE_NAME");
    }

    #[test]
    fn renders_pod_labels_and_annotations() {
        let mut pod = pod();
        pod.info.labels.insert("app".into(), "web".into());
        pod.info.annotations.insert("sluice.dev/team".into(), "payments".into());
        let template = Template::parse("{pod.labels.app}.{pod.annotations.sluice.dev/team}").expect("parse");
        let mut out = String::new();
        assert!(template.render(&pod, "", &mut out));
        assert_eq!(out, "web.payments");
        assert!(!template.reads_records());
        assert!(!Template::parse("{pod.labels.tier}").expect("parse").render(&pod, "", &mut out), "no such label");
    }

    #[test]
    fn refuses_what_it_cannot_render() {
        for bad in ["", "{pod.uid}", "{record.}", "open {", "close }", "{nope}"] {
            assert!(Template::parse(bad).is_err(), "{bad:?}");
        }
    }
}
