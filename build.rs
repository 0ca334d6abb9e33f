//! Records the git commit the binary is built from, for `sluice_build_info{git_sha}` and
//! `sluice --version`. `SLUICE_GIT_SHA` overrides (container builds have no `.git`).

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=SLUICE_GIT_SHA");
    for path in [".git/HEAD", ".git/refs/heads", ".git/packed-refs"] {
        if Path::new(path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    let sha = std::env::var("SLUICE_GIT_SHA").ok().filter(|sha| !sha.is_empty()).or_else(|| {
        Command::new("git")
            .args(["rev-parse", "--short=12", "HEAD"])
            .output()
            .ok()
            .filter(|output| output.status.success())
            .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_string())
    });
    println!("cargo:rustc-env=SLUICE_GIT_SHA={}", sha.unwrap_or_else(|| "unknown".into()));
}
