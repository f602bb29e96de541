//! fio over NBD with crc32c verification under the partial-write policies
//! plog, parix and replicate: healthy; after kill -9 with partial writes
//! just logged; with a device failed after the writes (so degraded reads
//! replay the parity journals, or, if the server replayed them when idle,
//! decode from replayed parity); degraded writes; kill -9 while degraded;
//! and finally replace + rebuild and an offline scrub that must be clean
//! (every stripe's parity equals a fresh encode of its data).
//!
//! Nothing here asserts timing: whether a journal was replayed by the idle
//! thread or by the degraded read first, the bytes must be the same.

use crate::support;

use support::{counter, FioJob, TestArray, MIB};

/// RS(4,2) (RS(1,2) for replicate) under `policy`, 64 MiB: the jobs use
/// [0, 34 MiB), and the rebuild and the scrub walk every stripe (128 MiB
/// until 2026-11-27).
fn create(policy: &str) -> TestArray {
    let mut args: Vec<String> = support::create_args("64M");
    args.extend(
        ["--write-policy", policy, "--journal-max", "64M"]
            .iter()
            .map(|s| s.to_string()),
    );
    TestArray::create_with(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// The story for one policy; `seed` keeps the policies' data apart.
fn healthy_crash_degraded_rebuild(policy: &str, seed: u64) {
    let a = create(policy);
    let server = a.serve();
    // Healthy: 4 KiB random, 1 MiB sequential, mixed, 8 MiB each (16 MiB
    // until 2026-11-26; 8 MiB of 4 KiB writes is 2,048 logged writes).
    let mut written = FioJob::standard_three(0, 8 * MIB, seed);
    for job in &written {
        job.run(&server);
    }
    let s = a.stats();
    if policy == "replicate" {
        assert_eq!(counter(&s, "journal_writes"), 0, "{s}");
        assert_eq!(
            counter(&s, "rmw_writes"),
            0,
            "RS(1,2): every write is whole: {s}"
        );
    } else {
        assert!(
            counter(&s, "journal_writes") > 0,
            "4 KiB writes are logged under {policy}: {s}"
        );
    }

    // Overwrites of the 4 KiB range, then kill -9 at once: the restart
    // resyncs or replays before serving.
    written[0] = FioJob::random_4k(0, 8 * MIB, seed + 10);
    written[0].run(&server);
    server.kill9();
    let server = a.serve();
    for job in &written {
        job.verify_only(&server);
    }

    // Overwrites again, then a device fails: what its units held is decoded
    // from parity that the journals must have reached first.
    written[0] = FioJob::random_4k(0, 8 * MIB, seed + 20);
    written[0].run(&server);
    a.cli(&["fail", "2"]).ok();
    for job in &written {
        job.verify_only(&server);
    }
    // Degraded writes (logging falls back to in-place writes on a degraded
    // stripe) and a second failure. 2 MiB, 512 writes over 16 stripes (8
    // MiB until 2026-11-27): each syncs the degraded-write log first.
    let degraded = FioJob::random_4k(32 * MIB, 2 * MIB, seed + 30);
    degraded.run(&server);
    written.push(degraded);
    a.cli(&["fail", "5"]).ok();
    for job in &written {
        job.verify_only(&server);
    }

    // kill -9 while degraded.
    server.kill9();
    let server = a.serve();
    for job in &written {
        job.verify_only(&server);
    }
    let s = a.stats();
    assert!(counter(&s, "reconstructed_blocks") > 0, "{s}");

    a.cli(&["replace", "2"]).ok();
    a.cli(&["replace", "5"]).ok();
    a.cli(&["rebuild"]).ok();
    assert_eq!(a.status()["health"], "healthy");
    for job in &written {
        job.verify_only(&server);
    }
    server.stop();
    a.scrub_check_clean();
    let server = a.serve();
    for job in &written {
        job.verify_only(&server);
    }
    server.stop();
}

#[test]
fn fio_verifies_under_plog_healthy_degraded_and_across_kill9() {
    healthy_crash_degraded_rebuild("plog", 1100);
}

#[test]
fn fio_verifies_under_parix_healthy_degraded_and_across_kill9() {
    healthy_crash_degraded_rebuild("parix", 1200);
}

#[test]
fn fio_verifies_under_replicate_healthy_degraded_and_across_kill9() {
    healthy_crash_degraded_rebuild("replicate", 1300);
}

/// Two devices fail right after a run of logged overwrites: the degraded
/// reads replay what they need (or find it replayed by the idle thread),
/// the background thread replays the rest, and every byte verifies.
#[test]
fn parix_degraded_reads_after_logged_overwrites_verify_and_replay_counts() {
    let a = create("parix");
    let server = a.serve();
    let fill = FioJob::sequential_1m(0, 16 * MIB, 1400);
    fill.run(&server);
    let over = FioJob::random_4k(0, 16 * MIB, 1401);
    over.run(&server);
    a.cli(&["fail", "0"]).ok();
    a.cli(&["fail", "3"]).ok();
    over.verify_only(&server);
    // The failure asked the background thread to replay what is left;
    // generous, since a loaded machine may starve it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
    let s = loop {
        let s = a.stats();
        if s["journal_logged_blocks"] == 0 {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "journals still hold logged blocks: {s}"
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    };
    assert!(counter(&s, "journal_writes") > 0, "{s}");
    assert!(
        counter(&s, "records_replayed") > 0,
        "the logged writes were replayed, idle or on demand: {s}"
    );
    over.verify_only(&server);
    server.stop();
}
