//! `octet_counted`: RFC 6587 framing and the content checks (see `sluice_fuzz::octet_counted`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::octet_counted(data));
