//! Fuzz target: see `ecdedup::fuzzing::superblock`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ecdedup::fuzzing::superblock(data));
