//! Typed columns (`[persist.columns]`): a value taken from each JSON record by a JSON pointer and
//! converted to its column's type, written by COPY beside the row's other columns.
//!
//! Owns: the conversion rules per type (docs/SCHEMA.md, "Typed columns"), what a value that does
//! not convert becomes (NULL, counted in `sluice_persist_unconvertible_values_total{column}`),
//! and how a value goes into COPY's binary format. Must not: dead-letter a record for a value
//! (the record is stored whole in `record`; a column is a convenience), or parse a record more
//! than once for all its columns. Adding the columns to the table is `schema`'s.

use bytes::BytesMut;
use chrono::{DateTime, Utc};
use metrics::Counter;
use serde_json::Value;
use tokio_postgres::types::{IsNull, ToSql, Type, accepts, to_sql_checked};

use crate::config::{ColumnConfig, ColumnType};
use crate::telemetry;

/// Longest `text` or `jsonb` value an indexed typed column takes (PostgreSQL's b-tree entries
/// are limited to about a third of a page, 2,704 bytes, after compression).
pub const MAX_INDEXED_BYTES: usize = 2000;

/// One typed column, compiled.
#[derive(Debug, Clone)]
pub struct Column {
    /// Its name.
    pub name: String,
    /// Its config.
    pub config: ColumnConfig,
    unconvertible: Counter,
}

/// The configured typed columns, in name order (COPY's order after the base columns).
#[derive(Debug, Clone, Default)]
pub struct Columns(pub Vec<Column>);

impl Columns {
    /// The columns of `persist.columns`.
    pub fn new(config: &std::collections::BTreeMap<String, ColumnConfig>) -> Self {
        Self(
            config
                .iter()
                .map(|(name, config)| {
                    let unconvertible = metrics::counter!(telemetry::PERSIST_UNCONVERTIBLE, "column" => name.clone());
                    unconvertible.increment(0);
                    Column { name: name.clone(), config: config.clone(), unconvertible }
                })
                .collect(),
        )
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Each column's value for a JSON record (`None` for a text record: every column NULL).
    pub fn values(&self, record: Option<&str>) -> Vec<Option<Typed>> {
        if self.0.is_empty() {
            return Vec::new();
        }
        let parsed = match record.map(serde_json::from_str::<Value>) {
            None => None,
            Some(Ok(parsed)) => Some(parsed),
            // JSON the agent passed and the database stores that cannot be read here (a number
            // past f64's range, nesting past serde_json's 128 levels): no column can be read,
            // each is NULL and counted.
            Some(Err(_)) => {
                for column in &self.0 {
                    column.unconvertible.increment(1);
                }
                return vec![None; self.0.len()];
            }
        };
        self.0
            .iter()
            .map(|column| {
                let value = parsed.as_ref()?.pointer(&column.config.pointer)?;
                if value.is_null() {
                    return None;
                }
                let converted = convert(value, column.config.kind).filter(|typed| {
                    // A b-tree entry holds at most ~2.7 kB: a longer value in an indexed column
                    // would fail its row's insert (a dead letter). NULL instead, counted.
                    !column.config.index
                        || !matches!(typed, Typed::Text(text) | Typed::Json(text) if text.len() > MAX_INDEXED_BYTES)
                });
                if converted.is_none() {
                    column.unconvertible.increment(1);
                }
                converted
            })
            .collect()
    }
}

/// A converted value.
#[derive(Debug, Clone, PartialEq)]
pub enum Typed {
    /// `text`
    Text(String),
    /// `bigint`
    Bigint(i64),
    /// `double precision`
    Double(f64),
    /// `boolean`
    Boolean(bool),
    /// `timestamptz`
    Time(DateTime<Utc>),
    /// `jsonb` (the value's JSON text)
    Json(String),
}

/// `value` as a `kind`, or `None` if it does not convert.
pub fn convert(value: &Value, kind: ColumnType) -> Option<Typed> {
    let typed = match (kind, value) {
        (ColumnType::Text, Value::String(text)) => Typed::Text(text.clone()),
        (ColumnType::Text, other) => Typed::Text(other.to_string()),
        (ColumnType::Bigint, Value::Number(number)) => Typed::Bigint(number.as_i64()?),
        (ColumnType::Bigint, Value::String(text)) => Typed::Bigint(text.trim().parse().ok()?),
        (ColumnType::DoublePrecision, Value::Number(number)) => Typed::Double(number.as_f64()?),
        (ColumnType::DoublePrecision, Value::String(text)) => {
            Typed::Double(text.trim().parse::<f64>().ok().filter(|f| f.is_finite())?)
        }
        (ColumnType::Boolean, Value::Bool(flag)) => Typed::Boolean(*flag),
        (ColumnType::Boolean, Value::String(text)) => match text.as_str() {
            "true" => Typed::Boolean(true),
            "false" => Typed::Boolean(false),
            _ => return None,
        },
        (ColumnType::Timestamptz, value) => Typed::Time(super::row::event_time(value)?),
        (ColumnType::Jsonb, value) => Typed::Json(value.to_string()),
        _ => return None,
    };
    // PostgreSQL's text and jsonb cannot hold U+0000.
    match &typed {
        Typed::Text(text) if text.contains('\0') => None,
        Typed::Json(json) if json.contains("\\u0000") => None,
        _ => Some(typed),
    }
}

impl ToSql for Typed {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self {
            Typed::Text(text) => text.to_sql(ty, out),
            Typed::Bigint(n) => n.to_sql(ty, out),
            Typed::Double(f) => f.to_sql(ty, out),
            Typed::Boolean(b) => b.to_sql(ty, out),
            Typed::Time(time) => time.to_sql(ty, out),
            Typed::Json(json) => super::row::JsonText(json.clone()).to_sql(ty, out),
        }
    }

    accepts!(TEXT, INT8, FLOAT8, BOOL, TIMESTAMPTZ, JSONB);
    to_sql_checked!();
}

/// A column type's COPY type.
pub fn copy_type(kind: ColumnType) -> Type {
    match kind {
        ColumnType::Text => Type::TEXT,
        ColumnType::Bigint => Type::INT8,
        ColumnType::DoublePrecision => Type::FLOAT8,
        ColumnType::Boolean => Type::BOOL,
        ColumnType::Timestamptz => Type::TIMESTAMPTZ,
        ColumnType::Jsonb => Type::JSONB,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// `[persist.columns]` as written in a config file.
    fn column_configs(text: &str) -> std::collections::BTreeMap<String, ColumnConfig> {
        toml::from_str(text).expect("columns")
    }

    #[test]
    fn converts_what_each_type_takes_and_refuses_the_rest() {
        let cases = [
            (json!("ann"), ColumnType::Text, Some(Typed::Text("ann".into()))),
            (json!({"a": 1}), ColumnType::Text, Some(Typed::Text(r#"{"a":1}"#.into()))),
            (json!(42), ColumnType::Bigint, Some(Typed::Bigint(42))),
            (json!(" 42 "), ColumnType::Bigint, Some(Typed::Bigint(42))),
            (json!(4.5), ColumnType::Bigint, None),
            (json!(1e30), ColumnType::Bigint, None),
            (json!("x"), ColumnType::Bigint, None),
            (json!(4.5), ColumnType::DoublePrecision, Some(Typed::Double(4.5))),
            (json!("NaN"), ColumnType::DoublePrecision, None),
            (json!(true), ColumnType::Boolean, Some(Typed::Boolean(true))),
            (json!("false"), ColumnType::Boolean, Some(Typed::Boolean(false))),
            (json!(1), ColumnType::Boolean, None),
            (
                json!("2026-12-06T10:00:00Z"),
                ColumnType::Timestamptz,
                Some(Typed::Time("2026-12-06T10:00:00Z".parse().expect("a time"))),
            ),
            (json!("yesterday"), ColumnType::Timestamptz, None),
            (json!([1, "a"]), ColumnType::Jsonb, Some(Typed::Json(r#"[1,"a"]"#.into()))),
            (json!("a\u{0}b"), ColumnType::Text, None),
        ];
        for (value, kind, expected) in cases {
            assert_eq!(convert(&value, kind), expected, "{value} as {kind:?}");
        }
    }

    #[test]
    fn a_record_that_cannot_be_read_here_leaves_every_column_null_and_counts_each() {
        let config = column_configs(
            r#"
            user_id = { pointer = "/user/id", type = "bigint" }
            x = { pointer = "/x", type = "double precision" }
            "#,
        );
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            let columns = Columns::new(&config);
            assert_eq!(columns.values(Some(r#"{"user":{"id":7},"x":1e400}"#)), vec![None, None]);
        });
        let text = handle.render();
        for column in ["user_id", "x"] {
            let line = format!("{}{{column=\"{column}\"}} 1", telemetry::PERSIST_UNCONVERTIBLE);
            assert!(text.contains(&line), "{line} in\n{text}");
        }
    }

    /// Cold review (issue 32): a long value in an indexed column failed its row's insert.
    #[test]
    fn a_value_too_long_for_its_index_is_null() {
        let config = column_configs(r#"path = { pointer = "/path", type = "text", index = true }"#);
        let columns = Columns::new(&config);
        let long = format!(r#"{{"path":"{}"}}"#, "x".repeat(MAX_INDEXED_BYTES + 1));
        assert_eq!(columns.values(Some(&long)), vec![None]);
        assert_eq!(columns.values(Some(r#"{"path":"/cart"}"#)), vec![Some(Typed::Text("/cart".into()))]);
    }

    #[test]
    fn takes_values_by_pointer_and_leaves_missing_and_text_records_null() {
        let config = column_configs(
            r#"
            user_id = { pointer = "/user/id", type = "bigint" }
            status = { pointer = "/http/status", type = "bigint" }
            ok = { pointer = "/ok", type = "boolean" }
            "#,
        );
        let columns = Columns::new(&config);
        // Name order: ok, status, user_id.
        assert_eq!(
            columns.values(Some(r#"{"user":{"id":7},"http":{"status":"teapot"},"ok":null}"#)),
            vec![None, None, Some(Typed::Bigint(7))]
        );
        assert_eq!(columns.values(None), vec![None, None, None]);
    }
}
