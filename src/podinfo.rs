//! The pod's labels and annotations, from a Downward API volume (`/etc/podinfo/labels` and
//! `annotations`; `[agent.pod_info]`): no API server access, no RBAC.
//!
//! Owns: the files' format (one `key="value"` per line, the value quoted as Go's `%q` writes it),
//! the allow and exclude lists, the size cap (what is kept, as JSON, within `max_bytes`: an entry
//! past it is skipped and counted), and reading them again every `interval` (the kubelet
//! rewrites the files, by a symlink swap, within about a minute of a change). Must not: read more
//! than [`MAX_FILE`] of a file, block the runtime (files are read on the blocking pool), or fail
//! the agent because a file is missing or damaged (the last good values stay, and it is said).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::PodInfoConfig;
use crate::telemetry;
use crate::telemetry::outcome::PodInfoSkip;

/// Most bytes of a file read: Kubernetes caps a pod's annotations at 256 KiB in all.
pub const MAX_FILE: u64 = 512 * 1024;

/// Labels and annotations kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodInfo {
    /// Labels kept.
    pub labels: BTreeMap<String, String>,
    /// Annotations kept.
    pub annotations: BTreeMap<String, String>,
}

/// Entries not kept, by kind and reason (the `sluice_pod_info_skipped` gauge).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Skipped {
    /// Not in the allow list, or in `exclude`.
    pub not_allowed: usize,
    /// Past `max_bytes`.
    pub max_bytes: usize,
    /// A line that is not `key="value"` (or a file past [`MAX_FILE`], or not UTF-8: one each).
    pub malformed: usize,
}

impl PodInfo {
    /// The labels and annotations as the envelope carries them: `{"labels":{…},"annotations":{…}}`
    /// without an empty map; empty when both are.
    pub fn json(&self) -> String {
        let mut parts = Vec::new();
        for (name, map) in [("labels", &self.labels), ("annotations", &self.annotations)] {
            if !map.is_empty() {
                parts.push(format!("\"{name}\":{}", serde_json::to_string(map).unwrap_or_default()));
            }
        }
        if parts.is_empty() { String::new() } else { format!("{{{}}}", parts.join(",")) }
    }
}

/// Parses a Downward API file: `key="value"` per line, the value in Go's quoted form. Returns the
/// entries and how many lines were malformed.
pub fn parse(text: &str) -> (Vec<(String, String)>, usize) {
    let mut entries = Vec::new();
    let mut malformed = 0;
    for line in text.lines().filter(|line| !line.trim().is_empty()) {
        match line.split_once('=').and_then(|(key, value)| Some((key, unquote(value)?))) {
            Some((key, value)) if !key.is_empty() && !key.contains('\0') && !value.contains('\0') => {
                entries.push((key.to_string(), value));
            }
            _ => malformed += 1,
        }
    }
    (entries, malformed)
}

/// A Go `strconv.Quote` string (what the kubelet writes) as its text; `None` if it is not one.
fn unquote(quoted: &str) -> Option<String> {
    let inner = quoted.strip_prefix('"')?.strip_suffix('"')?;
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c == '"' {
            return None;
        }
        if c != '\\' {
            out.push(c);
            continue;
        }
        let hex = |chars: &mut std::str::Chars<'_>, n: usize| -> Option<u32> {
            let digits: String = chars.by_ref().take(n).collect();
            (digits.len() == n).then(|| u32::from_str_radix(&digits, 16).ok()).flatten()
        };
        let escaped = match chars.next()? {
            'a' => '\u{7}',
            'b' => '\u{8}',
            'f' => '\u{c}',
            'n' => '\n',
            'r' => '\r',
            't' => '\t',
            'v' => '\u{b}',
            '\\' => '\\',
            '"' => '"',
            '\'' => '\'',
            // A byte: Go quotes invalid UTF-8 byte by byte; only ASCII is kept as it is.
            'x' => char::from_u32(hex(&mut chars, 2)?).filter(char::is_ascii)?,
            'u' => char::from_u32(hex(&mut chars, 4)?)?,
            'U' => char::from_u32(hex(&mut chars, 8)?)?,
            _ => return None,
        };
        out.push(escaped);
    }
    Some(out)
}

/// Whether `name` matches one of `patterns` (a name, or a prefix ending in `*`).
fn matches(patterns: &[String], name: &str) -> bool {
    patterns.iter().any(|pattern| match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    })
}

/// Reads one file (at most [`MAX_FILE`]); a missing file has no entries.
fn read_file(path: &Path) -> std::io::Result<Option<String>> {
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Some(String::new())),
        Err(error) => return Err(error),
    };
    let mut bytes = Vec::new();
    file.take(MAX_FILE + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_FILE {
        return Ok(None);
    }
    Ok(String::from_utf8(bytes).ok())
}

/// Reads both files under `config.path` and keeps what the lists allow within `max_bytes`
/// (labels first, each file in name order). Blocking.
pub fn read(config: &PodInfoConfig) -> std::io::Result<(PodInfo, [Skipped; 2])> {
    let Some(dir) = &config.path else { return Ok(Default::default()) };
    let mut info = PodInfo::default();
    let mut skipped = [Skipped::default(); 2];
    let mut room = config.max_bytes.as_u64() as usize;
    for (index, (file, allow)) in
        [("labels", &config.labels), ("annotations", &config.annotations)].into_iter().enumerate()
    {
        let skipped = &mut skipped[index];
        let Some(text) = read_file(&dir.join(file))? else {
            skipped.malformed += 1;
            continue;
        };
        let (entries, malformed) = parse(&text);
        skipped.malformed += malformed;
        let map = if index == 0 { &mut info.labels } else { &mut info.annotations };
        for (key, value) in entries {
            if !matches(allow, &key) || matches(&config.exclude, &key) {
                skipped.not_allowed += 1;
                continue;
            }
            // As JSON: two strings, a colon, a comma, and their escapes (at most 6 bytes each).
            let cost = serde_json::to_string(&key).map_or(0, |k| k.len())
                + serde_json::to_string(&value).map_or(0, |v| v.len())
                + 2;
            if cost > room {
                skipped.max_bytes += 1;
                continue;
            }
            room -= cost;
            map.insert(key, value);
        }
    }
    Ok((info, skipped))
}

/// Publishes what one read kept and skipped.
fn publish(info: &PodInfo, skipped: &[Skipped; 2]) {
    for (kind, kept, skipped) in
        [("labels", info.labels.len(), skipped[0]), ("annotations", info.annotations.len(), skipped[1])]
    {
        metrics::gauge!(telemetry::POD_INFO_ENTRIES, "kind" => kind).set(kept as f64);
        for reason in PodInfoSkip::ALL {
            let n = match reason {
                PodInfoSkip::NotAllowed => skipped.not_allowed,
                PodInfoSkip::MaxBytes => skipped.max_bytes,
                PodInfoSkip::Malformed => skipped.malformed,
            };
            metrics::gauge!(telemetry::POD_INFO_SKIPPED, "kind" => kind, telemetry::REASON => reason.as_str())
                .set(n as f64);
        }
    }
}

/// Reads the files at start: what the agent's first records carry. A file that cannot be read
/// leaves none (said, not fatal).
pub fn first(config: &PodInfoConfig) -> PodInfo {
    match read(config) {
        Ok((info, skipped)) => {
            publish(&info, &skipped);
            if config.path.is_some() {
                info!(
                    labels = info.labels.len(),
                    annotations = info.annotations.len(),
                    "pod labels and annotations read"
                );
            }
            info
        }
        Err(error) => {
            warn!(%error, "pod labels and annotations cannot be read; records carry none until they can");
            PodInfo::default()
        }
    }
}

/// Reads the files every `config.interval` until `stop`, calling `changed` with what they hold
/// whenever that differs from `current`. A read that fails keeps the last values.
pub async fn follow(config: PodInfoConfig, mut current: PodInfo, changed: impl Fn(&PodInfo), stop: CancellationToken) {
    if config.path.is_none() {
        return;
    }
    let mut failing = false;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(config.interval) => {}
        }
        let reading = config.clone();
        let read = tokio::task::spawn_blocking(move || read(&reading)).await;
        match read {
            Ok(Ok((info, skipped))) => {
                failing = false;
                publish(&info, &skipped);
                if info != current {
                    info!(
                        labels = info.labels.len(),
                        annotations = info.annotations.len(),
                        "pod labels or annotations changed; records read from now on carry the new ones"
                    );
                    changed(&info);
                    current = info;
                }
            }
            Ok(Err(error)) if !failing => {
                failing = true;
                warn!(%error, "pod labels and annotations cannot be read; the last values stay");
            }
            _ => {}
        }
    }
}

/// The poll interval's floor.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_the_kubelet_writes() {
        let text = "app=\"web\"\nteam=\"payments\"\nnote=\"a \\\"quoted\\\" line\\nand \\u00e9 \\x41\"\n";
        let (entries, malformed) = parse(text);
        assert_eq!(malformed, 0);
        assert_eq!(
            entries,
            vec![
                ("app".into(), "web".into()),
                ("team".into(), "payments".into()),
                ("note".into(), "a \"quoted\" line\nand é A".into())
            ]
        );
    }

    #[test]
    fn counts_lines_that_are_not_key_equals_quoted_value() {
        let (entries, malformed) = parse("ok=\"1\"\nno quotes=1\nopen=\"x\n=\"empty key\"\nnul=\"\\x00\"\n");
        assert_eq!(entries, vec![("ok".into(), "1".into())]);
        assert_eq!(malformed, 4);
    }

    fn config(dir: &Path) -> PodInfoConfig {
        PodInfoConfig {
            path: Some(dir.to_path_buf()),
            labels: vec!["*".into()],
            annotations: vec!["sluice.dev/*".into()],
            exclude: vec!["pod-template-hash".into()],
            ..PodInfoConfig::default()
        }
    }

    #[test]
    fn keeps_what_the_lists_allow_within_max_bytes() {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::write(dir.path().join("labels"), "app=\"web\"\npod-template-hash=\"abc\"\n").expect("labels");
        std::fs::write(
            dir.path().join("annotations"),
            "sluice.dev/team=\"payments\"\nkubectl.kubernetes.io/last-applied-configuration=\"{}\"\n",
        )
        .expect("annotations");
        let (info, skipped) = read(&config(dir.path())).expect("read");
        assert_eq!(info.labels, BTreeMap::from([("app".into(), "web".into())]));
        assert_eq!(info.annotations, BTreeMap::from([("sluice.dev/team".into(), "payments".into())]));
        assert_eq!(skipped[0].not_allowed, 1);
        assert_eq!(skipped[1].not_allowed, 1);
        assert_eq!(info.json(), r#"{"labels":{"app":"web"},"annotations":{"sluice.dev/team":"payments"}}"#);

        let small = PodInfoConfig { max_bytes: bytesize::ByteSize::b(14), ..config(dir.path()) };
        let (info, skipped) = read(&small).expect("read");
        assert_eq!(info.labels.len(), 1, "\"app\":\"web\", is 12 bytes");
        assert_eq!(skipped[1].max_bytes, 1);
    }

    #[test]
    fn a_missing_folder_or_file_gives_no_entries_and_an_oversized_file_is_counted() {
        let dir = tempfile::tempdir().expect("dir");
        let (info, _) = read(&config(&dir.path().join("absent"))).expect("read");
        assert_eq!(info, PodInfo::default());
        std::fs::write(dir.path().join("labels"), "x".repeat(MAX_FILE as usize + 1)).expect("labels");
        let (info, skipped) = read(&config(dir.path())).expect("read");
        assert!(info.labels.is_empty());
        assert_eq!(skipped[0].malformed, 1);
        assert_eq!(PodInfo::default().json(), "");
    }
}
