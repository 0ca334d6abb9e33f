//! `row`: the persister's envelope parsing, row building and window (see `sluice_fuzz::row`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::row(data));
