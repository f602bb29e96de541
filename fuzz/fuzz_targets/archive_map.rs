//! Fuzz target: see `ecdedup::fuzzing::archive_map`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ecdedup::fuzzing::archive_map(data));
