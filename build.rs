//! Records the git commit the binary is built from, for `sluice_build_info{git_sha}` and
//! `sluice --version`. `SLUICE_GIT_SHA` overrides (container builds have no `.git`).
//!
//! With `SLUICE_LINK_LAYOUT=1` (`scripts/build-release` and the benchmark's build set it), a
//! release build of the `sluice` binary for x86_64 Linux gets two linker settings for an idle
//! agent's memory (docs/PERFORMANCE.md, "The code laid out"): the functions an agent runs, listed
//! in `link/symbol-order.txt` (`scripts/symbol-order` writes it), laid out together — a page
//! fault on the binary maps the 64 KiB around it, so code run at start-up and while idle that lies
//! scattered keeps most of the binary resident — and relative relocations packed (`DT_RELR`): the
//! dynamic loader reads all of them at start, 400 KiB unpacked. Opt-in because both need what the
//! image's build has and not every build does: rust-lld as the linker (the toolchain's default
//! for this target; GNU ld knows no ordering file), and a glibc of 2.36 or later where the binary
//! runs (Debian 12, the image's).

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
    println!("cargo:rerun-if-env-changed=SLUICE_LINK_LAYOUT");
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    if var("SLUICE_LINK_LAYOUT") != "1" || var("PROFILE") != "release" || var("TARGET") != "x86_64-unknown-linux-gnu" {
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
