//! Bad dedup metadata at the command line: a device's map log or snapshot
//! (`ARRAY/dedup/devN.log`, `devN.snap`) corrupt or missing. The device is
//! opened as failed with a warning that names the file and the way back
//! (`ecdedup replace N` + `ecdedup rebuild`, which rebuild the device's
//! content, map and index from the others); the volume stays readable;
//! after the rebuild the device holds a map again and serves reads alone.
//! More lost maps than the parity covers (m) refuse to serve, naming them.
//! These arrays keep their metadata in the folder (`--metadata folder`,
//! format 1), where the files can be damaged one by one; in format 2 the
//! maps live in each device's metadata area, and a damaged area fails its
//! device the same way (tests/metadata_on_devices.rs).

use crate::support;

use support::{assert_same_bytes, pseudo_random, Server, TestArray, MIB};

/// 4 MiB of random bytes followed by the same 768 KiB (6 stripes of
/// 4 × 32 KiB) four times over, so the maps hold references as well as
/// slots of their own.
fn data() -> Vec<u8> {
    let mut d = pseudo_random(31, 4 * MIB as usize);
    let period = pseudo_random(32, 768 * 1024);
    for _ in 0..4 {
        d.extend_from_slice(&period);
    }
    d
}

/// An array with dedup `all`, the data written and flushed, server stopped.
fn array_with_data() -> (TestArray, Vec<u8>) {
    let mut args = support::create_args("64M");
    args.extend(
        ["--dedup", "all", "--metadata", "folder"]
            .iter()
            .map(|s| s.to_string()),
    );
    let a = TestArray::create_with(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let d = data();
    let server = a.serve();
    let mut c = server.client();
    c.write_all(0, &d).expect("write");
    c.flush().expect("flush");
    c.disconnect();
    let s = a.stats();
    let refs: u64 = (0..6)
        .map(|i| s["dedup"][i]["reference_writes"].as_u64().unwrap_or(0))
        .sum();
    assert!(refs > 0, "the repeated data should be references: {s}");
    server.stop();
    (a, d)
}

fn map_file(a: &TestArray, device: usize, ext: &str) -> std::path::PathBuf {
    a.dir.join("dedup").join(format!("dev{device}.{ext}"))
}

fn read_back(server: &Server, want: &[u8]) {
    let mut c = server.client();
    let got = c.read_all(0, want.len()).expect("read back");
    assert_same_bytes("data read back", &got, want);
    c.disconnect();
}

/// Serves, expects `device` failed with a warning naming `file_words` and
/// the recovery commands; reads the data degraded; replaces and rebuilds
/// the device; checks that it has a map again, that an offline scrub finds
/// everything (maps included) clean, and that the data reads back with two
/// *other* devices failed (so through the rebuilt one).
fn fails_then_rebuilds(a: &TestArray, want: &[u8], device: usize, file_words: &[&str]) {
    let server = a.serve();
    let status = a.status();
    assert_eq!(
        status["devices"][device]["state"], "failed",
        "a device whose map cannot be read must not serve: {status}"
    );
    let warnings = status["warnings"].to_string();
    for w in file_words
        .iter()
        .copied()
        .chain([&*format!("ecdedup replace {device}"), "rebuild"])
    {
        assert!(
            warnings.contains(w),
            "the warning should mention {w:?}: {warnings}"
        );
    }
    read_back(&server, want);
    let d = device.to_string();
    a.cli(&["replace", &d]).ok();
    a.cli(&["rebuild"]).ok();
    let status = a.status();
    assert_eq!(status["health"], "healthy", "{status}");
    let s = a.stats();
    assert!(
        s["dedup"][device]["mapped_blocks"].as_u64().unwrap_or(0) > 0,
        "the rebuilt device has no map: {s}"
    );
    server.stop();
    let report = a.scrub_check_clean();
    assert_eq!(
        report["dedup_map_problems"].as_array().map(Vec::len),
        Some(0),
        "{report}"
    );
    let server = a.serve();
    let others: Vec<String> = (0..6)
        .filter(|&i| i != device)
        .take(2)
        .map(|i| i.to_string())
        .collect();
    for o in &others {
        a.cli(&["fail", o]).ok();
    }
    read_back(&server, want);
    server.stop();
}

#[test]
fn a_map_log_with_a_bad_header_fails_its_device_until_replace_and_rebuild() {
    let (a, want) = array_with_data();
    let log = map_file(&a, 2, "log");
    support::flip_bytes(&log, 0, 8);
    fails_then_rebuilds(&a, &want, 2, &["dev2.log", "no valid header"]);
}

#[test]
fn a_corrupt_map_snapshot_fails_its_device_until_replace_and_rebuild() {
    let (a, want) = array_with_data();
    let snap = map_file(&a, 4, "snap");
    std::fs::write(&snap, b"ECDDMS01 but nothing a snapshot holds").unwrap();
    fails_then_rebuilds(&a, &want, 4, &["dev4.snap"]);
}

#[test]
fn a_missing_map_log_fails_its_device_until_replace_and_rebuild() {
    let (a, want) = array_with_data();
    std::fs::remove_file(map_file(&a, 0, "log")).unwrap();
    fails_then_rebuilds(&a, &want, 0, &["dev0.log", "missing"]);
}

#[test]
fn more_lost_maps_than_parity_devices_refuse_to_serve_and_name_them() {
    let (a, _) = array_with_data();
    for d in [1, 3, 5] {
        support::flip_bytes(&map_file(&a, d, "log"), 0, 8);
    }
    let err = match a.try_serve(&[]) {
        Ok(_) => panic!("a server came up with 3 of 6 dedup maps unreadable under RS(4,2)"),
        Err(e) => e,
    };
    for w in ["3 of 6 devices", "dev1.log", "dev3.log", "dev5.log"] {
        assert!(err.contains(w), "the refusal should mention {w:?}: {err}");
    }
}

#[test]
fn a_scrub_of_an_array_with_sound_maps_reports_no_map_problem() {
    let (a, _) = array_with_data();
    let report = a.scrub_check_clean();
    assert_eq!(
        report["dedup_map_problems"].as_array().map(Vec::len),
        Some(0),
        "{report}"
    );
}
