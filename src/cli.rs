//! The `sluice` binary's subcommands that are more than a line of `main`, and how they write
//! their output.

pub mod replay;
pub mod serve;

use std::io::Write as _;

/// Writes `text` to stdout. A reader that went away (`sluice check-config FILE | head`) is not
/// an error: what it wanted it has, and Rust's `print!` would panic on the broken pipe.
pub fn print(text: &str) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()) {
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}
