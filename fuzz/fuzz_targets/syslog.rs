//! `syslog`: datagram and stream syslog into JSON fields (see `sluice_fuzz::syslog`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::syslog(data));
