//! fio over NBD with crc32c verification, on a healthy array, with one and
//! two failed devices (RS(4,2)), and across replace + rebuild.

mod support;

use support::{counter, FioJob, TestArray, MIB};

/// Three standard jobs (4 KiB random, 1 MiB sequential, mixed 4k-256k) of
/// 16 MiB each (128 stripes of 128 KiB), from `base`. (32 MiB each
/// on 256 MiB volumes until 2026-11-26: twice the bytes, no other path
/// taken; docs/benchmarks.md "CI time and the long runs".)
fn jobs(base: u64, seed: u64) -> Vec<FioJob> {
    FioJob::standard_three(base, 16 * MIB, seed)
}

#[test]
fn fio_verifies_on_a_healthy_array() {
    let a = TestArray::create("128M");
    let server = a.serve();
    for job in jobs(0, 100) {
        job.run(&server);
    }
    let s = a.stats();
    assert!(
        counter(&s, "rmw_writes") > 0,
        "4 KiB random writes should take read-modify-write: {s}"
    );
    assert!(
        counter(&s, "full_stripe_writes") > 0,
        "1 MiB sequential writes should be full-stripe: {s}"
    );
    assert_eq!(counter(&s, "degraded_writes"), 0, "{s}");
    assert_eq!(counter(&s, "reconstructed_blocks"), 0, "{s}");
    assert_eq!(counter(&s, "checksum_mismatches"), 0, "{s}");
    server.stop();
    a.scrub_check_clean();
}

#[test]
fn fio_verifies_with_one_failed_device() {
    let a = TestArray::create("128M");
    let server = a.serve();
    // Data written while healthy, read back degraded below.
    let before = FioJob::sequential_1m(48 * MIB, 16 * MIB, 7);
    before.run(&server);
    a.cli(&["fail", "2"]).ok();
    assert_eq!(a.device_states()[2], "failed");
    let writes_on_2 = |s: &serde_json::Value| s["devices"][2]["write_ops"].clone();
    let dev2_writes_at_failure = writes_on_2(&a.stats());
    for job in jobs(0, 200) {
        job.run(&server);
    }
    before.verify_only(&server);
    let s = a.stats();
    assert!(
        counter(&s, "degraded_writes") > 0,
        "writes with a failed member are degraded writes: {s}"
    );
    assert!(
        counter(&s, "reconstructed_blocks") > 0,
        "reads of the failed device's units are decoded: {s}"
    );
    assert_eq!(
        writes_on_2(&s),
        dev2_writes_at_failure,
        "a failed device takes no writes"
    );
    server.stop();
}

#[test]
fn fio_verifies_with_two_failed_devices() {
    let a = TestArray::create("128M");
    let server = a.serve();
    let before = FioJob::mixed(48 * MIB, 16 * MIB, 9);
    before.run(&server);
    a.cli(&["fail", "1"]).ok();
    a.cli(&["fail", "4"]).ok();
    // A third failure would exceed m = 2: refused, with a reason.
    let third = a.cli(&["fail", "0"]).failed();
    assert!(third.stderr.contains("refused"), "{third}");
    let states = a.device_states();
    assert_eq!(
        states.iter().filter(|s| *s == "failed").count(),
        2,
        "{states:?}"
    );
    for job in jobs(0, 300) {
        job.run(&server);
    }
    before.verify_only(&server);
    let s = a.stats();
    assert!(counter(&s, "degraded_writes") > 0, "{s}");
    assert!(counter(&s, "reconstructed_blocks") > 0, "{s}");
    server.stop();
}

#[test]
fn fio_verifies_after_replace_and_rebuild() {
    let a = TestArray::create("128M");
    let server = a.serve();
    // Written healthy.
    let healthy = jobs(0, 400);
    for job in &healthy {
        job.run(&server);
    }
    a.cli(&["fail", "1"]).ok();
    a.cli(&["fail", "3"]).ok();
    // Written with two devices out of service.
    let degraded = jobs(48 * MIB, 500);
    for job in &degraded {
        job.run(&server);
    }
    let s = a.stats();
    assert!(counter(&s, "degraded_writes") > 0, "{s}");

    // Device 1 gets a new file elsewhere, device 3 is wiped in place.
    let new1 = a.path("new-dev1");
    a.cli(&["replace", "1", "--device", new1.to_str().unwrap()])
        .ok();
    a.cli(&["replace", "3"]).ok();
    let states = a.device_states();
    assert_eq!(states[1], "rebuilding", "{states:?}");
    assert_eq!(states[3], "rebuilding", "{states:?}");
    a.cli(&["rebuild"]).ok();
    let status = a.status();
    assert_eq!(status["health"], "healthy", "{status}");
    assert_eq!(
        status["devices"][1]["path"].as_str().unwrap(),
        new1.canonicalize().unwrap().to_str().unwrap()
    );
    let s = a.stats();
    assert!(counter(&s, "rebuilt_stripes") > 0, "{s}");

    for job in healthy.iter().chain(&degraded) {
        job.verify_only(&server);
    }
    // Prove the rebuilt devices hold the right content: take two *other*
    // devices out, so every read of their units decodes through 1 and 3.
    a.cli(&["fail", "0"]).ok();
    a.cli(&["fail", "2"]).ok();
    for job in healthy.iter().chain(&degraded) {
        job.verify_only(&server);
    }
    server.stop();
}

#[test]
fn a_rebuilt_array_scrubs_clean_offline() {
    let a = TestArray::create("64M");
    let server = a.serve();
    let js = FioJob::standard_three(0, 8 * MIB, 600);
    for job in &js {
        job.run(&server);
    }
    a.cli(&["fail", "5"]).ok();
    FioJob::random_4k(32 * MIB, 8 * MIB, 601).run(&server);
    a.cli(&["replace", "5"]).ok();
    a.cli(&["rebuild"]).ok();
    server.stop();
    a.scrub_check_clean();
    let server = a.serve();
    for job in &js {
        job.verify_only(&server);
    }
    FioJob::random_4k(32 * MIB, 8 * MIB, 601).verify_only(&server);
    server.stop();
}

#[test]
fn two_fio_processes_verify_in_parallel_on_disjoint_ranges() {
    let a = TestArray::create("128M");
    let server = a.serve();
    let j1 = FioJob::mixed(0, 24 * MIB, 700);
    let j2 = FioJob::random_4k(32 * MIB, 16 * MIB, 701);
    std::thread::scope(|s| {
        let t1 = s.spawn(|| j1.run(&server));
        let t2 = s.spawn(|| j2.run(&server));
        t1.join().expect("first fio");
        t2.join().expect("second fio");
    });
    server.stop();
    a.scrub_check_clean();
}

/// "Rebuild while the volume stays served": clients write and verify while
/// the rebuild runs; afterwards the rebuilt device alone (with two others
/// failed) must reproduce everything, old and new.
#[test]
fn fio_writes_and_verifies_while_a_rebuild_runs() {
    let a = TestArray::create("128M");
    let server = a.serve();
    let before = FioJob::sequential_1m(0, 32 * MIB, 800);
    before.run(&server);
    a.cli(&["fail", "2"]).ok();
    let degraded = FioJob::random_4k(32 * MIB, 8 * MIB, 801);
    degraded.run(&server);
    a.cli(&["replace", "2"]).ok();

    // The rebuild runs in the server; `rebuild` follows it to the end.
    let rebuild = support::Background::spawn(&mut a.cli_command(&["rebuild"]));
    let during = [
        FioJob::random_4k(48 * MIB, 16 * MIB, 802),
        FioJob::mixed(64 * MIB, 16 * MIB, 803),
    ];
    for job in &during {
        job.run(&server);
    }
    let out = rebuild
        .wait(support::CLI_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(out.success(), "rebuild failed: {out}");
    let status = a.status();
    assert_eq!(status["health"], "healthy", "{status}");
    assert!(counter(&a.stats(), "rebuilt_stripes") > 0);

    // New writes after the rebuild, then every job read back through the
    // rebuilt device: 0 and 4 out, so units on 2 are read or decoded from it.
    let after = FioJob::random_4k(96 * MIB, 8 * MIB, 804);
    after.run(&server);
    a.cli(&["fail", "0"]).ok();
    a.cli(&["fail", "4"]).ok();
    for job in [&before, &degraded, &after].into_iter().chain(&during) {
        job.verify_only(&server);
    }
    server.stop();
}

/// The harness can say no: verifying a range against a job that never
/// wrote it (another seed and pattern) must fail, so a passing verify above
/// means the bytes were really there.
#[test]
fn fio_verify_fails_on_data_it_did_not_write() {
    let a = TestArray::create("64M");
    let server = a.serve();
    FioJob::random_4k(0, 8 * MIB, 900).run(&server);
    let other = FioJob::sequential_1m(0, 8 * MIB, 901);
    let out = support::run(
        &mut other.command(&server.uri(), true),
        support::TOOL_TIMEOUT,
    );
    assert!(
        !out.success() || out.stderr.contains("verify:"),
        "fio verified data that another job wrote: {out}"
    );
    server.stop();
}
