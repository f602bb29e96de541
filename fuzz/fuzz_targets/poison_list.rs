//! Fuzz target: see `ecdedup::fuzzing::poison_list`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ecdedup::fuzzing::poison_list(data));
