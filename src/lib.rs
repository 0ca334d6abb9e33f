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
pub mod podinfo;
pub mod ship;
pub mod shutdown;
pub mod status;
pub mod storable;
pub mod telemetry;
pub mod template;
#[cfg(test)]
mod test_support;
pub mod topic;

#[cfg(test)]
mod tests {
    /// ARCHITECTURE.md's code map names every module, and only files that exist. A row is
    /// `| `src/dir/a.rs`, `b.rs` | … |`: later names without a slash are a.rs's siblings.
    #[test]
    fn the_code_map_lists_every_module_and_nothing_that_does_not_exist() {
        let root = crate::test_support::crate_root();
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
        let missing: Vec<_> = crate::test_support::rust_files(&["src"], |dir| !dir.ends_with("/tests"))
            .into_iter()
            .filter(|file| !file.ends_with("/tests.rs") && !file.ends_with("/model.rs") && !listed.contains(file))
            .collect();
        assert!(missing.is_empty(), "ARCHITECTURE.md's code map lacks {missing:?}");
    }

    /// Dependencies point down: the persister shares nothing with the agent's pipeline but what
    /// both use from below it (config, envelope, admin, telemetry, lifecycle).
    #[test]
    fn the_persister_imports_nothing_from_the_agent_or_its_pipeline() {
        let mut files = crate::test_support::rust_files(&["src/persist"], |_| true);
        files.push("src/persist.rs".into());
        for file in files {
            let text = std::fs::read_to_string(crate::test_support::crate_root().join(&file)).expect("source");
            for upward in ["crate::agent", "crate::ship", "crate::ingest", "crate::buffer"] {
                assert!(!text.contains(upward), "{file} uses {upward}");
            }
        }
    }
}
