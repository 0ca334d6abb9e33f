//! `forward`: Fluent Forward framing and decoding (see `sluice_fuzz::forward`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::forward(data));
