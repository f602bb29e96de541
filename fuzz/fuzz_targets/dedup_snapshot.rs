//! Fuzz target: see `ecdedup::fuzzing::dedup_snapshot`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ecdedup::fuzzing::dedup_snapshot(data));
