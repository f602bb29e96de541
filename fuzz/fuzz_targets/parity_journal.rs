//! Fuzz target: see `ecdedup::fuzzing::parity_journal`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ecdedup::fuzzing::parity_journal(data));
