//! Fuzz target: see `ecdedup::fuzzing::meta_area`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ecdedup::fuzzing::meta_area(data));
