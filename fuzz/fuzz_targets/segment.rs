//! `segment`: spool recovery and the backlog reader over any bytes (see `sluice_fuzz::segment`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::segment(data));
