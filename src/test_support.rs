//! What the crate's own tests share (compiled for tests only).
//!
//! Owns: the property tests' configuration, the source-tree walk of the tests that read the code
//! itself, a writer that captures log output, and small fixtures several modules' tests build records from. Must not: be used by the product.

use proptest::test_runner::{Config, RngSeed};

/// The crate's root folder (where `Cargo.toml` is). Cargo sets `CARGO_MANIFEST_DIR` when it runs
/// a test, and that is read first: the compile-time value names the clone that last built the
/// binary, and two clones sharing one `target/` (a clean-clone CI run) share test binaries.
pub(crate) fn crate_root() -> &'static std::path::Path {
    static ROOT: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    ROOT.get_or_init(|| {
        std::env::var_os("CARGO_MANIFEST_DIR").map_or_else(|| env!("CARGO_MANIFEST_DIR").into(), Into::into)
    })
}

/// Every `.rs` file under the folders `dirs` (relative to the crate root; a missing one is
/// skipped), as paths relative to the root (`src/buffer/spool/reader.rs`), sorted. A subfolder is
/// entered when `descend` says so (given its relative path).
pub(crate) fn rust_files(dirs: &[&str], descend: impl Fn(&str) -> bool) -> Vec<String> {
    let root = crate_root();
    let mut files = Vec::new();
    let mut pending: Vec<_> = dirs.iter().map(|dir| root.join(dir)).collect();
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for path in entries.filter_map(Result::ok).map(|entry| entry.path()) {
            let relative = path.strip_prefix(root).expect("under the root").to_string_lossy().into_owned();
            if path.is_dir() {
                if descend(&relative) {
                    pending.push(path);
                }
            } else if relative.ends_with(".rs") {
                files.push(relative);
            }
        }
    }
    files.sort();
    files
}

/// The model-based property tests' config: `SLUICE_PROP_CASES` cases and `SLUICE_PROP_SEED`
/// (`scripts/prop` sets both), else `default_cases` on the fixed seed 12 that keeps
/// `scripts/test` short and reproducible. No failure file: a failing case prints its steps.
pub(crate) fn prop_config(default_cases: u32) -> Config {
    let from_env = |name: &str| std::env::var(name).ok().and_then(|value| value.parse::<u64>().ok());
    Config {
        cases: from_env("SLUICE_PROP_CASES").map_or(default_cases, |cases| u32::try_from(cases).unwrap_or(u32::MAX)),
        rng_seed: RngSeed::Fixed(from_env("SLUICE_PROP_SEED").unwrap_or(12)),
        failure_persistence: None,
        ..Config::default()
    }
}

/// A pod as the Downward API describes one: `web-1` in namespace `shop`, no container, node,
/// labels or annotations.
pub(crate) fn pod() -> crate::envelope::PodMetadata {
    crate::envelope::PodMetadata {
        name: Some("web-1".into()),
        namespace: Some("shop".into()),
        container: None,
        node: None,
        info: Default::default(),
    }
}

/// A log writer that keeps what is written (`tracing_subscriber`'s `with_writer(move || w.clone())`).
#[derive(Clone, Default)]
pub(crate) struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Captured {
    /// Everything written so far, as text.
    pub(crate) fn text(&self) -> String {
        String::from_utf8(self.0.lock().expect("captured").clone()).expect("utf-8")
    }
}

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("captured").extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
