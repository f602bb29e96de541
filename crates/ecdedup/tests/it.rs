//! The integration tests of the `ecdedup` command, one module per file of
//! this folder, in one test binary: each file used to be a binary of its
//! own that linked every dependency again (36 links in CI's build step).
//! `scripts/test.sh` still runs each module in its own process, TEST_JOBS
//! at a time. By hand:
//!
//! ```text
//! cargo test -p ecdedup --test it                    # all of them
//! cargo test -p ecdedup --test it -- fio_dedup::     # one file's tests
//! cargo test -p ecdedup --test it -- --exact powerloss::NAME
//! ```
//!
//! A filter is a substring of the test's full name (`eval::` also picks
//! `archive_eval::`'s tests). Cargo.toml sets `autotests = false`, so a
//! new file here runs only once it is declared below; the test at the end
//! fails while one is not.

mod support;

mod archive;
mod archive_assemble;
mod archive_counters;
mod archive_crash;
mod archive_eval;
mod archive_layouts;
mod archive_metadata;
mod archive_powerloss;
mod archive_volumes;
mod bad_input;
mod bad_input_dedup;
mod cluster;
mod cluster_tls;
mod config_file;
mod copy;
mod corruption;
mod crash;
mod devices;
mod eval;
mod eval_block_separation;
mod eval_codeplugin;
mod filesystem;
mod fingerprint_backend;
mod fio;
mod fio_dedup;
mod fio_policies;
mod fuzz_corpus;
mod io_modes;
mod metadata_on_devices;
mod model;
mod network;
mod operations;
mod powerloss;
mod readd;
mod server_stop;
mod ssd_backend;
mod trace;

/// Every `.rs` file of tests/ is a module above: with `autotests = false`
/// a file left out would be neither compiled nor run, silently.
#[test]
fn every_file_of_tests_is_a_module_of_this_binary() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let root = std::fs::read_to_string(dir.join("it.rs")).expect("tests/it.rs");
    let declared: Vec<&str> = root
        .lines()
        .filter_map(|l| l.strip_prefix("mod ")?.strip_suffix(';'))
        .collect();
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("tests/") {
        let path = entry.expect("tests/ entry").path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let module = match name.strip_suffix(".rs") {
            Some(m) if path.is_file() => m.to_owned(),
            // A folder with a main.rs was a test binary of its own too.
            _ if path.join("main.rs").is_file() => name.clone(),
            _ => continue,
        };
        if module != "it" && !declared.contains(&module.as_str()) {
            missing.push(name);
        }
    }
    missing.sort();
    assert!(
        missing.is_empty(),
        "tests/{missing:?}: not declared in tests/it.rs (`mod NAME;`), so never \
         compiled or run: Cargo.toml has `autotests = false`"
    );
}
