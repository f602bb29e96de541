//! Fuzz target: see `ecdedup::fuzzing::trace`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ecdedup::fuzzing::trace(data));
