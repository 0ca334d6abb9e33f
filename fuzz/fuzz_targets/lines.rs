//! `lines`: newline framing and the content checks (see `sluice_fuzz::lines`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::lines(data));
