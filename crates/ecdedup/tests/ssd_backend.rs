//! An array on simulated SSDs (`create --ssd-sim`): fio writes over NBD
//! reach a wear-accounting FTL under every device, `stats` reports each
//! device's flash wear, the data stays on the device files (it verifies,
//! and survives a restart, after which the counters start again), and an
//! array without the option has no `ssd` section at all.

use crate::support;

use serde_json::Value;
use support::{FioJob, TestArray, MIB};

/// Small enough that two passes of 4 KiB random writes overwrite every
/// device's flash several times (data and parity read-modify-write), so GC
/// must copy valid pages.
const VOLUME_BYTES: u64 = 32 * MIB;
const DEVICES: usize = 6;

fn create(extra: &[&str]) -> TestArray {
    let mut args = support::create_args("32M");
    // The simulated SSD spans the whole device: a metadata area would add
    // flash that the test's writes never fill, and GC would never run.
    args.extend(["--metadata", "folder"].iter().map(|s| s.to_string()));
    args.extend(extra.iter().map(|s| s.to_string()));
    TestArray::create_with(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// The `ssd` section of each device, all present.
fn ssd_devices(stats: &Value) -> Vec<Value> {
    let devices = stats["ssd"]
        .as_array()
        .unwrap_or_else(|| panic!("no ssd section in {stats}"));
    assert_eq!(devices.len(), DEVICES, "{stats}");
    devices
        .iter()
        .enumerate()
        .map(|(d, s)| {
            assert!(s.is_object(), "device {d} has no simulated SSD: {stats}");
            s.clone()
        })
        .collect()
}

fn field(s: &Value, name: &str) -> u64 {
    s[name]
        .as_u64()
        .unwrap_or_else(|| panic!("no ssd counter {name} in {s}"))
}

#[test]
fn an_array_on_simulated_ssds_counts_the_flash_wear_of_real_writes() {
    let a = create(&["--ssd-sim", "separated", "--ssd-op", "7"]);
    let shown = a.cli(&["status"]).ok();
    assert!(
        shown
            .stdout
            .contains("simulated SSDs: separated (7% over-provisioning"),
        "status should show the simulation: {shown}"
    );
    assert_eq!(a.status()["ssd_sim"]["mode"], "separated");
    let server = a.serve();
    let first = FioJob::random_4k(0, VOLUME_BYTES, 11);
    let second = FioJob::random_4k(0, VOLUME_BYTES, 12);
    first.run(&server);
    second.run(&server);
    let stats = a.stats();
    let mut gc_copies = 0;
    for (d, s) in ssd_devices(&stats).iter().enumerate() {
        assert_eq!(s["mode"], "separated", "device {d}: {s}");
        let host = field(s, "host_page_writes");
        let nand = field(s, "nand_page_programs");
        let gc = field(s, "gc_page_copies");
        let skipped = field(s, "dedup_skipped_writes");
        assert!(host > 0, "device {d} saw no write: {s}");
        assert!(nand >= host, "device {d}: fewer programs than writes: {s}");
        assert_eq!(
            nand,
            host - skipped + gc,
            "device {d}: counters disagree: {s}"
        );
        assert!(
            field(s, "block_erases") > 0,
            "device {d} erased nothing: {s}"
        );
        let wa = s["write_amplification"]
            .as_f64()
            .expect("write_amplification");
        assert!(wa >= 1.0, "device {d}: write amplification {wa}: {s}");
        gc_copies += gc;
    }
    assert!(gc_copies > 0, "GC copied nothing on any device: {stats}");
    let text = a.cli(&["stats", "--prometheus"]).ok().stdout;
    assert!(
        text.contains("ecdedup_ssd_gc_page_copies{device=\"0\"}"),
        "{text}"
    );
    server.stop();

    // The data lived on the device files all along: after a restart the
    // second pass still verifies, and the wear counters start again.
    let server = a.serve();
    let before = a.stats();
    for (d, s) in ssd_devices(&before).iter().enumerate() {
        assert!(
            field(s, "host_page_writes") < (VOLUME_BYTES / 4096),
            "device {d}: counters survived the restart: {s}"
        );
    }
    second.verify_only(&server);
    server.stop();
    a.scrub_check_clean();
}

#[test]
fn an_array_without_the_simulation_reports_no_ssd_section() {
    let a = create(&[]);
    let server = a.serve();
    FioJob::random_4k(0, MIB, 3).run(&server);
    let stats = a.stats();
    assert!(stats.get("ssd").is_none(), "{stats}");
    let text = a.cli(&["stats", "--prometheus"]).ok().stdout;
    assert!(!text.contains("ecdedup_ssd_"), "{text}");
    server.stop();
}

#[test]
fn a_bad_ssd_mode_or_over_provisioning_is_refused_before_anything_is_created() {
    for (args, needle) in [
        (vec!["--ssd-sim", "wild"], "--ssd-sim"),
        (vec!["--ssd-sim", "plain", "--ssd-op", "0"], "--ssd-op"),
    ] {
        let a = TestArray::empty();
        let mut words = support::create_args("32M");
        words.extend(args.iter().map(|s| s.to_string()));
        let out = a
            .cli(&words.iter().map(String::as_str).collect::<Vec<_>>())
            .failed();
        assert!(out.stderr.contains(needle), "{args:?}: {out}");
        assert!(
            !a.dir.join("array.json").exists(),
            "{args:?} left an array behind"
        );
    }
}
