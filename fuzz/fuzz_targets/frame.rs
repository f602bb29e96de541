//! Fuzz target: see `ecdedup::fuzzing::frame`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ecdedup::fuzzing::frame(data));
