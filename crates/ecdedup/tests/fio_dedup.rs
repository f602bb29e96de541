//! fio over NBD with crc32c verification on arrays with a dedup layer under
//! every device: policies `all` (data and parity fingerprinted) and
//! `parity` (parity only), healthy, with one and two failed devices, after
//! replace + rebuild, and after a kill -9 and restart: three stories per
//! policy, each on its own array (the healthy story runs on to the kill -9,
//! the one failure on to the second; five stories until 2026-11-27).
//!
//! fio's verify blocks carry their offset and a checksum, so they never
//! repeat; each story therefore first writes a *repeating* pattern (one
//! 768 KiB buffer, = 6 stripes of RS(4,2) with 32 KiB units, so the same
//! bytes come back to the same device and role), which makes most of it,
//! data and parity, references to shared slots. fio then overwrites part of
//! that range (releasing references) and writes fresh ranges; at the end
//! the untouched rest of the pattern must still read back exactly (checked
//! with our own NBD client), and so must every fio job.

use crate::support;

use support::{counter, phase, FioJob, Server, TestArray, MIB};

/// Period of the repeating pattern: 6 stripes of 4 × 32 KiB.
const PATTERN_BYTES: usize = 768 * 1024;
/// The pattern covers [0, PATTERN_AREA) (24 periods, 18 MiB; 48 until
/// 2026-11-26, which repeated the same references twice as often); fio
/// overwrites its first 2 MiB with 4 KiB writes: 512 writes over 16
/// stripes, 2.7 periods (4 MiB until 2026-11-27; on a degraded array each
/// of them syncs the degraded-write log first, docs/benchmarks.md "CI time
/// and the long runs").
const PATTERN_AREA: u64 = 8 * 3 * PATTERN_BYTES as u64;
const OVERWRITTEN: u64 = 2 * MIB;

fn create(policy: &str) -> TestArray {
    let mut args = support::create_args("128M");
    args.extend(
        [
            "--dedup",
            policy,
            "--fingerprint",
            "sha256",
            "--index-entries",
            "65536",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    TestArray::create_with(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

fn pattern() -> Vec<u8> {
    support::pseudo_random(0x5eed, PATTERN_BYTES)
}

/// Writes the repeating pattern over [0, PATTERN_AREA) and flushes.
fn write_pattern(server: &Server) {
    let p = pattern();
    let mut c = server.client();
    let mut at = 0;
    while at < PATTERN_AREA {
        c.write_all(at, &p).expect("pattern write");
        at += PATTERN_BYTES as u64;
    }
    c.flush().expect("flush");
    c.disconnect();
}

/// The part of the pattern fio did not overwrite reads back exactly.
fn check_pattern(server: &Server) {
    let p = pattern();
    let mut c = server.client();
    let mut at = 0;
    while at < PATTERN_AREA {
        let got = c.read_all(at, PATTERN_BYTES).expect("pattern read");
        let from = OVERWRITTEN.saturating_sub(at).min(PATTERN_BYTES as u64) as usize;
        support::assert_same_bytes(
            &format!("pattern copy at {at} (from byte {from})"),
            &got[from..],
            &p[from..],
        );
        at += PATTERN_BYTES as u64;
    }
    c.disconnect();
}

/// Sums a dedup counter over the devices that have a layer in service.
fn dedup_counter(stats: &serde_json::Value, name: &str) -> u64 {
    stats["dedup"]
        .as_array()
        .unwrap_or_else(|| panic!("no dedup stats in {stats}"))
        .iter()
        .filter(|d| !d.is_null())
        .map(|d| {
            d[name]
                .as_u64()
                .unwrap_or_else(|| panic!("no dedup counter {name} in {d}"))
        })
        .sum()
}

/// fio jobs: 4 KiB random writes over the first 4 MiB of the pattern, then
/// 1 MiB sequential and mixed jobs on fresh ranges from `fresh`.
fn jobs(fresh: u64, seed: u64) -> Vec<FioJob> {
    vec![
        FioJob::random_4k(0, OVERWRITTEN, seed),
        FioJob::sequential_1m(fresh, 8 * MIB, seed + 1),
        FioJob::mixed(fresh + 8 * MIB, 8 * MIB, seed + 2),
    ]
}

/// The pattern became references: in both policies parity repeats with the
/// stripes, and under `all` the data does too.
fn assert_pattern_deduplicated(a: &TestArray, policy: &str) {
    let s = a.stats();
    let hits = dedup_counter(&s, "dedup_hits");
    let parity_refs = dedup_counter(&s, "reference_parity_writes");
    let refs = dedup_counter(&s, "reference_writes");
    assert!(parity_refs > 0, "{policy}: no parity reference: {s}");
    assert!(hits >= refs, "{policy}: {s}");
    match policy {
        "all" => assert!(refs > parity_refs, "all: no data reference: {s}"),
        _ => assert_eq!(refs, parity_refs, "parity: data was deduplicated: {s}"),
    }
}

/// One device fails, fio writes and verifies, then a second one fails and
/// fio writes and verifies again; the pattern and what was written before
/// the failures read back throughout.
fn one_then_two_failed(policy: &str, first: &str, second: &str) {
    let a = create(policy);
    let server = a.serve();
    write_pattern(&server);
    let before = FioJob::sequential_1m(96 * MIB, 8 * MIB, 7);
    before.run(&server);
    let mut s_prev = a.stats();
    let mut written = vec![before];
    for (phase_name, failed, fresh, seed) in [
        ("one failed device", &[first][..], 64 * MIB, 200),
        ("two failed devices", &[first, second][..], 104 * MIB, 300),
    ] {
        s_prev = phase(phase_name, || {
            a.cli(&["fail", failed[failed.len() - 1]]).ok();
            let states = a.device_states();
            assert_eq!(
                states.iter().filter(|s| *s == "failed").count(),
                failed.len(),
                "{states:?}"
            );
            let js = jobs(fresh, seed);
            for job in &js {
                job.run(&server);
            }
            for job in &written {
                job.verify_only(&server);
            }
            check_pattern(&server);
            // The 4 KiB job overwrote the pattern's first OVERWRITTEN bytes,
            // as the next phase's will again: only the fresh ranges stay.
            written.extend(js.into_iter().skip(1));
            let s = a.stats();
            for name in ["degraded_writes", "reconstructed_blocks"] {
                assert!(
                    counter(&s, name) > counter(&s_prev, name),
                    "{name} grew with {failed:?} failed: {s}"
                );
            }
            s
        });
    }
    server.stop();
}

fn rebuilt(policy: &str) {
    let a = create(policy);
    let server = a.serve();
    write_pattern(&server);
    let healthy = jobs(64 * MIB, 400);
    for job in &healthy {
        job.run(&server);
    }
    a.cli(&["fail", "1"]).ok();
    a.cli(&["fail", "3"]).ok();
    // 2 MiB of degraded 4 KiB writes (8 MiB until 2026-11-27).
    let degraded = FioJob::random_4k(96 * MIB, 2 * MIB, 500);
    degraded.run(&server);
    a.cli(&["replace", "1"]).ok();
    a.cli(&["replace", "3"]).ok();
    a.cli(&["rebuild"]).ok();
    assert_eq!(a.status()["health"], "healthy");
    // The rebuilt devices got their maps back: the pattern is shared again.
    let s = a.stats();
    assert!(counter(&s, "rebuilt_stripes") > 0, "{s}");
    for d in [1, 3] {
        let layer = &s["dedup"][d];
        assert!(
            layer["mapped_blocks"].as_u64().unwrap_or(0) > 0,
            "device {d} has no map after rebuild: {s}"
        );
    }
    // Everything reads back through the rebuilt devices alone: two others out.
    a.cli(&["fail", "0"]).ok();
    a.cli(&["fail", "2"]).ok();
    for job in healthy.iter().chain([&degraded]) {
        job.verify_only(&server);
    }
    check_pattern(&server);
    server.stop();
}

/// Healthy: the pattern becomes references, fio writes and verifies, the
/// pattern reads back; then kill -9 and a restart, after which everything
/// reads back, dedup still works and the stopped array scrubs clean.
fn healthy_then_killed(policy: &str) {
    let a = create(policy);
    let server = a.serve();
    let js = phase("healthy", || {
        write_pattern(&server);
        assert_pattern_deduplicated(&a, policy);
        let js = jobs(64 * MIB, 700);
        for job in &js {
            job.run(&server);
        }
        check_pattern(&server);
        let s = a.stats();
        assert_eq!(counter(&s, "checksum_mismatches"), 0, "{s}");
        js
    });
    server.kill9();
    let server = a.serve();
    for job in &js {
        job.verify_only(&server);
    }
    check_pattern(&server);
    // Dedup still works after the restart: the pattern written again, one
    // period further, becomes references only.
    let before = a.stats();
    let p = pattern();
    let mut c = server.client();
    c.write_all(PATTERN_AREA, &p).expect("write");
    c.flush().expect("flush");
    let back = c.read_all(PATTERN_AREA, p.len()).expect("read");
    c.disconnect();
    support::assert_same_bytes("pattern after restart", &back, &p);
    let after = a.stats();
    assert!(
        dedup_counter(&after, "reference_parity_writes")
            > dedup_counter(&before, "reference_parity_writes"),
        "no parity reference after the restart: {after}"
    );
    server.stop();
    a.scrub_check_clean();
}

#[test]
fn fio_verifies_healthy_then_after_kill_9_and_restart_with_data_dedup() {
    healthy_then_killed("all");
}

#[test]
fn fio_verifies_healthy_then_after_kill_9_and_restart_with_parity_dedup() {
    healthy_then_killed("parity");
}

#[test]
fn fio_verifies_with_one_then_two_failed_devices_and_data_dedup() {
    one_then_two_failed("all", "2", "4");
}

#[test]
fn fio_verifies_with_one_then_two_failed_devices_and_parity_dedup() {
    one_then_two_failed("parity", "5", "0");
}

#[test]
fn fio_verifies_after_rebuild_with_data_dedup() {
    rebuilt("all");
}

#[test]
fn fio_verifies_after_rebuild_with_parity_dedup() {
    rebuilt("parity");
}
