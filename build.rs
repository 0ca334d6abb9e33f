//! Records the git commit the binary is built from, for `sluice_build_info{git_sha}` and
//! `sluice --version`. `SLUICE_GIT_SHA` overrides (container builds have no `.git`).
//!
//! Release builds of the `sluice` binary for x86_64 Linux (glibc, linked by rust-lld, the
//! toolchain's default there) also get two linker settings for an idle agent's memory
//! (docs/PERFORMANCE.md, "Idle memory"): the functions an agent runs, listed in
//! `link/symbol-order.txt` (`scripts/symbol-order` writes it), laid out together — a page fault
//! on the binary maps the 64 KiB around it, so code run at start-up and while idle that lies
//! scattered keeps most of the binary resident — and relative relocations packed (`DT_RELR`,
//! glibc 2.36+): the dynamic loader reads all of them at start, 400 KiB unpacked.

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
    link_for_idle_memory();
}

fn link_for_idle_memory() {
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    if var("PROFILE") != "release" || var("TARGET") != "x86_64-unknown-linux-gnu" {
        return;
    }
    println!("cargo:rustc-link-arg-bin=sluice=-Wl,-z,pack-relative-relocs");
    // Watched whether or not it exists: a list written later is taken up.
    println!("cargo:rerun-if-changed=link/symbol-order.txt");
    if let Ok(order) = Path::new("link/symbol-order.txt").canonicalize() {
        println!("cargo:rustc-link-arg-bin=sluice=-Wl,--symbol-ordering-file={}", order.display());
        // A function renamed since the list was written is laid out with the rest, unnamed.
        println!("cargo:rustc-link-arg-bin=sluice=-Wl,--no-warn-symbol-ordering");
    }
}
