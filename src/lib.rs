//! Sluice: a per-pod sidecar log shipper. Apps write lines to a local Unix socket; the agent
//! buffers them within a fixed budget and ships them to Kafka with acks=all; the persister
//! writes them to PostgreSQL exactly once per record.
//!
//! The modules follow the pipeline: [`ingest`] → [`buffer`] → [`ship`], then [`persist`];
//! [`config`], [`admin`], [`telemetry`] and [`shutdown`] serve all of them. [`agent`] wires the
//! agent together; `ARCHITECTURE.md` has the picture and the invariants.

pub mod admin;
pub mod agent;
pub mod buffer;
pub mod client;
pub mod config;
pub mod envelope;
pub mod ingest;
pub mod inject;
pub mod lifecycle;
pub mod persist;
pub mod ship;
pub mod shutdown;
pub mod status;
pub mod telemetry;
#[cfg(test)]
mod test_support;

#[cfg(test)]
mod tests {
    /// ARCHITECTURE.md's code map names every module, and only files that exist. A row is
    /// `| `src/dir/a.rs`, `b.rs` | … |`: later names without a slash are a.rs's siblings.
    #[test]
    fn the_code_map_lists_every_module_and_nothing_that_does_not_exist() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let map = std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
        let mut listed = std::collections::BTreeSet::new();
        for row in map.lines().filter(|line| line.starts_with("| `src/")) {
            let cell = row.split('|').nth(1).unwrap_or_default();
            let names: Vec<&str> = cell.split('`').skip(1).step_by(2).collect();
            let dir = names[0].rsplit_once('/').map_or("", |(dir, _)| dir).to_owned();
            for name in names {
                listed.insert(if name.contains('/') { name.to_owned() } else { format!("{dir}/{name}") });
            }
        }
        let stale: Vec<_> = listed.iter().filter(|path| !root.join(path).exists()).collect();
        assert!(stale.is_empty(), "the code map names files that do not exist: {stale:?}");
        let mut missing = Vec::new();
        let mut dirs = vec![root.join("src")];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).expect("src").filter_map(Result::ok) {
                let path = entry.path();
                let relative = path.strip_prefix(root).expect("under the root").to_string_lossy().into_owned();
                if path.is_dir() {
                    if !relative.ends_with("/tests") {
                        dirs.push(path);
                    }
                    continue;
                }
                let test = relative.ends_with("/tests.rs") || relative.ends_with("/model.rs");
                if relative.ends_with(".rs") && !test && !listed.contains(&relative) {
                    missing.push(relative);
                }
            }
        }
        assert!(missing.is_empty(), "ARCHITECTURE.md's code map lacks {missing:?}");
    }

    /// Dependencies point down: the persister shares nothing with the agent's pipeline but what
    /// both use from below it (config, envelope, admin, telemetry, lifecycle).
    #[test]
    fn the_persister_imports_nothing_from_the_agent_or_its_pipeline() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = vec![root.join("persist.rs")];
        let mut dirs = vec![root.join("persist")];
        while let Some(dir) = dirs.pop() {
            for path in std::fs::read_dir(&dir).expect("persist").filter_map(Result::ok).map(|entry| entry.path()) {
                if path.is_dir() { dirs.push(path) } else { files.push(path) }
            }
        }
        for file in files {
            let text = std::fs::read_to_string(&file).expect("source");
            for upward in ["crate::agent", "crate::ship", "crate::ingest", "crate::buffer"] {
                assert!(!text.contains(upward), "{} uses {upward}", file.display());
            }
        }
    }
}
