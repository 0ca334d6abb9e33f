//! Prometheus text exposition read back: the one parser of a scrape, for `sluice status`, the
//! integration tests and the benchmark.
//!
//! Owns: samples by name and labels (exact matches, other labels summed over), label values,
//! and quantiles from histogram buckets (interpolated for the status view, or the bucket bound
//! itself for the benchmark). Must not: fetch anything (`crate::admin::client` does), or know
//! sluice's metric names (callers pass `crate::telemetry`'s constants).

use std::collections::BTreeMap;

/// One sample line: `name{labels} value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The metric name (`sluice_ship_records_delivered_total`, `…_bucket`).
    pub name: String,
    /// Its labels, in exposition order.
    pub labels: Vec<(String, String)>,
    /// Its value.
    pub value: f64,
    /// `name{labels}` as exposed.
    series: String,
}

impl Sample {
    /// `name{labels}` exactly as the exposition wrote it.
    pub fn series(&self) -> &str {
        &self.series
    }

    /// The value of label `key`, if it has one.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    fn matches(&self, name: &str, labels: &[(&str, &str)]) -> bool {
        self.name == name && labels.iter().all(|(key, value)| self.label(key) == Some(*value))
    }
}

/// One scrape: its samples in exposition order.
#[derive(Debug, Default, Clone)]
pub struct Scrape {
    samples: Vec<Sample>,
}

/// `key="value",key="value"` (values may hold escaped quotes, commas and `=`).
fn parse_labels(text: &str) -> Vec<(String, String)> {
    let mut labels = Vec::new();
    let mut rest = text;
    while let Some((key, after)) = rest.split_once("=\"") {
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((at, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, escaped)) => value.push(escaped),
                    None => {}
                },
                '"' => {
                    end = at + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        labels.push((key.trim_start_matches(',').trim().to_string(), value));
        rest = &after[end..];
    }
    labels
}

impl Scrape {
    /// Parses Prometheus text exposition (comments and blank lines ignored).
    pub fn parse(text: &str) -> Self {
        let samples = text
            .lines()
            .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
            .filter_map(|line| {
                let (series, value) = line.rsplit_once(' ')?;
                let value = value.parse().ok()?;
                let (name, labels) = match series.split_once('{') {
                    Some((name, rest)) => (name, parse_labels(rest.strip_suffix('}').unwrap_or(rest))),
                    None => (series, Vec::new()),
                };
                Some(Sample { name: name.to_string(), labels, value, series: series.to_string() })
            })
            .collect();
        Self { samples }
    }

    /// The samples of a `final counts` log line's `counts` object (series → value; see
    /// [`crate::telemetry::final_counts`]).
    pub fn from_counts(counts: &serde_json::Value) -> Self {
        let lines: Vec<String> = counts
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(series, value)| Some(format!("{series} {}", value.as_f64()?)))
            .collect();
        Self::parse(&lines.join("\n"))
    }

    /// Every sample, in exposition order.
    pub fn samples(&self) -> &[Sample] {
        &self.samples
    }

    /// The sum of the samples of `name` that carry all of `labels` (other labels, such as
    /// `listener`, are summed over), if any is present.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let mut matching = self.samples.iter().filter(|sample| sample.matches(name, labels)).peekable();
        matching.peek()?;
        Some(matching.map(|sample| sample.value).sum::<f64>() + 0.0)
    }

    /// Like [`Scrape::value`], 0 when no such sample exists (yet).
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.value(name, labels).unwrap_or(0.0)
    }

    /// True if any sample of `name` (any labels) is present.
    pub fn has(&self, name: &str) -> bool {
        self.samples.iter().any(|sample| sample.name == name)
    }

    /// The samples of `name` summed by the value of their label `key`.
    pub fn by_label(&self, name: &str, key: &str) -> BTreeMap<String, f64> {
        let mut values = BTreeMap::new();
        for sample in self.samples.iter().filter(|sample| sample.name == name) {
            if let Some(value) = sample.label(key) {
                *values.entry(value.to_string()).or_insert(0.0) += sample.value;
            }
        }
        values
    }

    /// The value of label `key` on the first sample of `name`.
    pub fn label(&self, name: &str, key: &str) -> Option<String> {
        self.samples
            .iter()
            .filter(|sample| sample.name == name)
            .find_map(|sample| sample.label(key))
            .map(str::to_string)
    }

    /// A quantile estimated from histogram `name`'s buckets (linear within a bucket), or `None`.
    pub fn quantile(&self, name: &str, q: f64) -> Option<f64> {
        let mut buckets: Vec<(f64, f64)> = self
            .by_label(&format!("{name}_bucket"), "le")
            .into_iter()
            .filter_map(|(le, count)| Some((if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? }, count)))
            .collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        let total = buckets.last()?.1;
        if total <= 0.0 {
            return None;
        }
        let target = q * total;
        let mut previous = (0.0, 0.0);
        for (bound, count) in buckets {
            if count >= target {
                if bound.is_infinite() {
                    return Some(previous.0);
                }
                let span = (count - previous.1).max(f64::EPSILON);
                return Some(previous.0 + (bound - previous.0) * (target - previous.1) / span);
            }
            previous = (bound, count);
        }
        None
    }

    /// The bound (`le`, as exposed) of the first bucket of histogram `name` holding at least
    /// share `q` of its `_count`: "at or under this many seconds". `+Inf` when none does.
    pub fn bucket_bound(&self, name: &str, q: f64) -> String {
        let bucket = format!("{name}_bucket");
        let count = format!("{name}_count");
        let total = self.samples.iter().filter(|sample| sample.name == count).map(|sample| sample.value).next_back();
        let target = q * total.unwrap_or(0.0);
        self.samples
            .iter()
            .filter(|sample| sample.name == bucket)
            .find(|sample| sample.value >= target)
            .and_then(|sample| sample.label("le"))
            .unwrap_or("+Inf")
            .to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"
# TYPE sluice_ingest_records_total counter
sluice_ingest_records_total{listener="default",protocol="lines"} 100
sluice_ingest_records_total{listener="octets",protocol="octet_counted"} 20
sluice_ship_records_delivered_total 90
sluice_buffer_records_dropped_total{reason="drop_newest"} 3
sluice_build_info{version="0.1.0",git_sha="abc",role="agent"} 1
sluice_ship_delivery_latency_seconds_bucket{le="0.005"} 10
sluice_ship_delivery_latency_seconds_bucket{le="0.025"} 95
sluice_ship_delivery_latency_seconds_bucket{le="+Inf"} 100
sluice_ship_delivery_latency_seconds_sum 1.5
sluice_ship_delivery_latency_seconds_count 100
"#;

    #[test]
    fn samples_are_found_by_exact_name_and_labels_and_summed_over_the_rest() {
        let scrape = Scrape::parse(TEXT);
        assert_eq!(scrape.value("sluice_ingest_records_total", &[]), Some(120.0));
        assert_eq!(scrape.value("sluice_ingest_records_total", &[("listener", "octets")]), Some(20.0));
        assert_eq!(scrape.value("sluice_ingest_records_total", &[("listener", "nope")]), None);
        assert_eq!(scrape.sum("sluice_ingest_records", &[]), 0.0, "a prefix is not a name");
        assert!(scrape.has("sluice_ship_delivery_latency_seconds_bucket"));
        assert!(!scrape.has("sluice_ship_delivery_latency_seconds"));
        assert_eq!(scrape.label("sluice_build_info", "role").as_deref(), Some("agent"));
        assert_eq!(scrape.by_label("sluice_ingest_records_total", "protocol").len(), 2);
        let dropped = &scrape.samples()[3];
        assert_eq!(dropped.series(), r#"sluice_buffer_records_dropped_total{reason="drop_newest"}"#);
    }

    #[test]
    fn quantiles_interpolate_and_bucket_bounds_are_the_exposed_le() {
        let scrape = Scrape::parse(TEXT);
        let p50 = scrape.quantile("sluice_ship_delivery_latency_seconds", 0.5).expect("p50");
        assert!((p50 - (0.005 + 0.02 * 40.0 / 85.0)).abs() < 1e-9, "{p50}");
        assert_eq!(scrape.bucket_bound("sluice_ship_delivery_latency_seconds", 0.5), "0.025");
        assert_eq!(scrape.bucket_bound("sluice_ship_delivery_latency_seconds", 0.99), "+Inf");
        assert_eq!(scrape.bucket_bound("sluice_ship_delivery_latency_seconds", 0.05), "0.005");
        assert_eq!(scrape.bucket_bound("sluice_nothing", 0.5), "+Inf");
    }

    #[test]
    fn label_values_may_hold_commas_quotes_and_equals_signs() {
        let scrape = Scrape::parse("m{a=\"x,y=\\\"z\\\"\",b=\"2\"} 1\n");
        assert_eq!(scrape.samples()[0].labels, vec![("a".into(), "x,y=\"z\"".into()), ("b".into(), "2".into())]);
        assert_eq!(scrape.value("m", &[("b", "2")]), Some(1.0));
    }
}
