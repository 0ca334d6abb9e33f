//! The `sluice` binary's subcommands that are more than a line of `main`.

pub mod serve;
