//! Fuzz target: see `ecdedup::fuzzing::intent_map`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ecdedup::fuzzing::intent_map(data));
