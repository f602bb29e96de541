//! Fuzz target: see `ecdedup::fuzzing::degraded_log`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ecdedup::fuzzing::degraded_log(data));
