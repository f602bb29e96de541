//! Fuzz target: see `ecdedup::fuzzing::config`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ecdedup::fuzzing::config(data));
