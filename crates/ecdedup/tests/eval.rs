//! `ecdedup eval parity-dedup` on small generated inputs.
//!
//! Raw mode writes whole stripes in order, one request in flight, so the
//! dedup counts are exact and computable from the documented layout (with
//! N = k + m devices, the unit with role r of stripe s sits on device
//! (r + s) mod N): the input is a 256 KiB block R of random 4 KiB pages,
//! repeated. Every page of R is distinct, so a 4 KiB page on a device repeats
//! exactly when the same (content of the stripe, role) lands on it again, and
//! parity pages repeat exactly when their whole row of data repeats. The fs
//! mode test (root, nbdfuse, losetup, mkfs.ext4) checks that the whole stack
//! runs and the outputs are complete and plausible.
//!
//! Needs `cargo build --workspace` first (the nbdkit plugin sits next to the
//! `ecdedup` binary). Every process the command starts is stopped by the
//! command itself; this test only runs the command with a time limit.

use serde_json::Value;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const KIB: u64 = 1024;
const R_BYTES: u64 = 256 * KIB;
const K: u64 = 4;
const M: u64 = 2;
const W: u64 = K + M;
const PAGE: u64 = 4096;

fn bin() -> PathBuf {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_ecdedup"));
    let plugin = exe.parent().unwrap().join("libecdedup_nbdkit.so");
    assert!(
        plugin.exists(),
        "{} is missing: run `cargo build --workspace` before `cargo test`",
        plugin.display()
    );
    exe
}

/// Deterministic pseudo-random bytes (xorshift64*).
fn random_bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    out.truncate(n);
    out
}

struct Run {
    status: std::process::ExitStatus,
    stdout: String,
    stderr: String,
}

/// Runs `ecdedup eval parity-dedup ARGS` with a time limit.
fn eval(args: &[&std::ffi::OsStr], path_env: Option<&str>, limit: Duration) -> Run {
    let mut cmd = Command::new(bin());
    cmd.arg("eval").arg("parity-dedup").args(args);
    if let Some(p) = path_env {
        cmd.env("PATH", p);
    }
    run_limited(&mut cmd, limit)
}

/// Runs a command with its output captured; past `limit` it gets SIGTERM
/// (by PID), then SIGKILL, and the test fails.
fn run_limited(cmd: &mut Command, limit: Duration) -> Run {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {what}: {e}"));
    let mut so = child.stdout.take().unwrap();
    let mut se = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut so, &mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut se, &mut s);
        s
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            // SIGTERM first: the command then takes its stack down itself.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            std::thread::sleep(Duration::from_secs(30));
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Run {
        status,
        stdout: t_out.join().unwrap(),
        stderr: t_err.join().unwrap(),
    }
}

fn os(s: &str) -> &std::ffi::OsStr {
    std::ffi::OsStr::new(s)
}

fn runs<'a>(results: &'a Value, mode: &str) -> Vec<&'a Value> {
    results["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["mode"] == mode)
        .collect()
}

fn find<'a>(results: &'a Value, mode: &str, chunk: u64, policy: &str) -> &'a Value {
    runs(results, mode)
        .into_iter()
        .find(|r| r["chunk_bytes"] == chunk && r["policy"] == policy)
        .unwrap_or_else(|| panic!("no {mode} run for chunk {chunk} policy {policy}"))
}

fn u(v: &Value, field: &str) -> u64 {
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("field {field} missing or not a count in {}", v["policy"]))
}

/// Distinct (stripe content, role) pairs each device receives when
/// `stripes` stripes of `stripe_data` bytes are cut from R repeated.
fn model(stripes: u64, stripe_data: u64) -> (u64, u64) {
    assert_eq!(R_BYTES % stripe_data, 0);
    let contents = R_BYTES / stripe_data;
    let mut seen: Vec<HashSet<(u64, u64)>> = vec![HashSet::new(); W as usize];
    for s in 0..stripes {
        for role in 0..W {
            seen[((role + s) % W) as usize].insert((s % contents, role));
        }
    }
    let all: u64 = seen.iter().map(|d| d.len() as u64).sum();
    let parity: u64 = seen
        .iter()
        .map(|d| d.iter().filter(|(_, r)| *r >= K).count() as u64)
        .sum();
    (all, parity)
}

#[test]
fn raw_mode_dedup_counts_match_the_layout_model_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let r = random_bytes(0x5eed, R_BYTES as usize);
    // Two workload files: the second starts where the first ends (3 MiB,
    // a multiple of every stripe), so the stream is R repeated 16 times.
    let a = tmp.path().join("a.bin");
    let b = tmp.path().join("b.bin");
    std::fs::write(&a, r.repeat(12)).unwrap();
    std::fs::write(&b, r.repeat(4)).unwrap();
    let total = 16 * R_BYTES;
    let out = tmp.path().join("out");
    let work = tmp.path().join("work");
    let t0 = Instant::now();
    let run = eval(
        &[
            os("--mode"),
            os("raw"),
            os("--chunks"),
            os("32K,64K"),
            os("--size"),
            os("16M"),
            // One stripe per request: requests of several stripes are
            // updated by several threads, and identical stripes written
            // at the same moment may each miss the other's index entry,
            // which would make the exact counts below a matter of timing.
            os("--raw-request"),
            os("4K"),
            os("--work"),
            work.as_os_str(),
            os("--out"),
            out.as_os_str(),
            a.as_os_str(),
            b.as_os_str(),
        ],
        None,
        Duration::from_secs(300),
    );
    assert!(
        run.status.success(),
        "eval failed: {}\n{}",
        run.stderr,
        run.stdout
    );
    eprintln!("raw eval took {:?}", t0.elapsed());
    assert!(run
        .stdout
        .contains("## Parity dedup (paper 000) reproduction"));
    assert!(
        run.stderr.contains("[6/6] raw mode, chunk 64K"),
        "progress lines: {}",
        run.stderr
    );
    let results: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    assert!(out.join("report.md").exists() && out.join("plot.svg").exists());

    // The workload's own duplicate count: 64 distinct pages, 1024 in all.
    let wl = &results["workload"];
    assert_eq!(u(wl, "bytes"), total);
    assert_eq!(u(wl, "blocks_4k"), total / PAGE);
    assert_eq!(u(wl, "unique_blocks_4k"), R_BYTES / PAGE);
    assert_eq!(u(wl, "zero_blocks_4k"), 0);

    assert_eq!(runs(&results, "raw").len(), 6);
    for chunk in [32 * KIB, 64 * KIB] {
        let sd = K * chunk;
        let stripes = total / sd;
        let pages = chunk / PAGE; // pages per unit
        let (all_distinct, parity_distinct) = model(stripes, sd);
        let data_sent = stripes * K * pages;
        let parity_sent = stripes * M * pages;

        for policy in ["none", "all", "parity"] {
            let run = find(&results, "raw", chunk, policy);
            // Sequential whole stripes: every update encodes from new data.
            assert_eq!(u(run, "full_stripe_writes"), stripes, "{policy} {chunk}");
            assert_eq!(u(run, "rmw_writes"), 0);
            assert_eq!(u(run, "rcw_writes"), 0);
            assert_eq!(u(run, "stripe_updates"), stripes);
            assert_eq!(u(run, "client_write_bytes"), total);
            assert_eq!(u(run, "data_pages_array"), data_sent);
            assert_eq!(u(run, "parity_pages_array"), parity_sent);
            assert_eq!(u(run, "parity_pages_paper_baseline"), parity_sent);
            let d = &run["decode"];
            assert_eq!(u(d, "range_bytes"), total);
            assert_eq!(d["verified"], true);
            for f in [
                "healthy_seconds",
                "one_failed_seconds",
                "two_failed_seconds",
            ] {
                assert!(d[f].as_f64().unwrap() > 0.0, "{f}");
            }
            assert!(run["write_seconds"].as_f64().unwrap() > 0.0);
        }

        let plain = find(&results, "raw", chunk, "none");
        assert_eq!(u(plain, "parity_pages_media"), parity_sent);
        assert_eq!(u(plain, "data_pages_media"), data_sent);
        assert_eq!(u(plain, "hash_ops"), 0);
        assert_eq!(u(plain, "index_entries"), 0);

        // Data dedup: every data and parity page hashed; one copy of each
        // distinct (content, role) per device stays.
        let all = find(&results, "raw", chunk, "all");
        assert_eq!(u(all, "hash_ops"), stripes * W * pages);
        assert_eq!(
            u(all, "data_pages_media") + u(all, "parity_pages_media"),
            all_distinct * pages
        );
        assert_eq!(u(all, "parity_pages_media"), parity_distinct * pages);
        assert_eq!(
            u(all, "parity_pages_referenced"),
            parity_sent - parity_distinct * pages
        );
        assert_eq!(
            u(all, "data_pages_referenced"),
            data_sent - (all_distinct - parity_distinct) * pages
        );
        assert_eq!(u(all, "index_entries"), all_distinct * pages);
        assert_eq!(u(all, "index_evictions"), 0);

        // Parity dedup: only parity hashed; data untouched by dedup.
        let par = find(&results, "raw", chunk, "parity");
        assert_eq!(u(par, "hash_ops"), stripes * M * pages);
        assert_eq!(u(par, "parity_pages_media"), parity_distinct * pages);
        assert_eq!(
            u(par, "parity_pages_referenced"),
            parity_sent - parity_distinct * pages
        );
        assert_eq!(u(par, "data_pages_media"), data_sent);
        assert_eq!(u(par, "data_pages_referenced"), 0);
        assert_eq!(u(par, "index_entries"), parity_distinct * pages);
        assert!(u(par, "index_bytes") > 0);
        assert!(u(par, "index_bytes") < u(all, "index_bytes"));
    }
    // The closed form for these inputs: at 32K the stream alternates two
    // stripe contents, each device sees all 6 roles over the rotation (6
    // distinct units, 2 of them parity); at 64K one content, same 6.
    assert_eq!(model(32, 128 * KIB), (36, 12));
    assert_eq!(model(16, 256 * KIB), (36, 12));
    // The work folder given by --work stays, its arrays are gone.
    assert_eq!(std::fs::read_dir(&work).unwrap().count(), 0);
}

/// A tar of 50,000 small files ran ext4 out of inodes at the default
/// volume size (one inode per 16 KiB). The plan for such a workload, put
/// through the eval's own mkfs.ext4 command on a sparse file of the planned
/// size, leaves an inode for every entry and a block for every file.
#[test]
fn ext4_on_the_planned_volume_has_room_for_50000_small_files() {
    use ecdedup::eval::parity_dedup::{ext4_plan, mkfs_ext4};
    for tool in ["mkfs.ext4", "dumpe2fs"] {
        assert!(have(tool), "{tool} is not installed (e2fsprogs)");
    }
    let files = 50_000u64;
    let entries = files + 2; // and two folders
    let workload_bytes = files * PAGE;
    let plan = ext4_plan(workload_bytes, entries, None);
    let tmp = tempfile::tempdir().unwrap();
    let volume = tmp.path().join("volume");
    std::fs::File::create(&volume)
        .unwrap()
        .set_len(plan.volume_bytes)
        .unwrap();
    let made = run_limited(&mut mkfs_ext4(&volume, &plan), Duration::from_secs(600));
    assert!(made.status.success(), "mkfs.ext4 failed: {}", made.stderr);
    let header = run_limited(
        Command::new("dumpe2fs").arg("-h").arg(&volume),
        Duration::from_secs(300),
    );
    assert!(
        header.status.success(),
        "dumpe2fs failed: {}",
        header.stderr
    );
    let field = |name: &str| -> u64 {
        header
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in dumpe2fs -h:\n{}", header.stdout))
    };
    let free_inodes = field("Free inodes:");
    let free_bytes = field("Free blocks:") * field("Block size:");
    assert!(
        free_inodes >= entries,
        "{free_inodes} free inodes for {entries} entries ({plan:?})"
    );
    assert!(
        free_bytes >= workload_bytes,
        "{free_bytes} free bytes for {files} files of 4 KiB ({plan:?})"
    );
}

fn is_root() -> bool {
    unsafe { libc::geteuid() == 0 }
}

fn have(tool: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false)
}

/// Two small "versions" of a tree as two tars: the second changes a few
/// bytes in every third file.
fn make_tars(dir: &Path) -> (PathBuf, PathBuf) {
    let tree = dir.join("tree");
    for v in ["v1", "v2"] {
        std::fs::create_dir_all(tree.join(v)).unwrap();
    }
    for i in 0..24u64 {
        let len = ((i * 7919) % 40 + 1) as usize * 1024 + (i as usize * 37);
        let body = random_bytes(1000 + i, len);
        std::fs::write(tree.join("v1").join(format!("f{i}")), &body).unwrap();
        let mut b2 = body.clone();
        if i % 3 == 0 {
            b2[len / 2] ^= 0xff;
        }
        std::fs::write(tree.join("v2").join(format!("f{i}")), &b2).unwrap();
    }
    let mut tars = Vec::new();
    for v in ["v1", "v2"] {
        let t = dir.join(format!("{v}.tar"));
        let st = Command::new("tar")
            .arg("-cf")
            .arg(&t)
            .arg("-C")
            .arg(&tree)
            .arg(v)
            .status()
            .unwrap();
        assert!(st.success());
        tars.push(t);
    }
    (tars[0].clone(), tars[1].clone())
}

#[test]
fn fs_mode_runs_the_whole_stack_and_leaves_nothing_mounted() {
    let needed = [
        "nbdkit",
        "nbdfuse",
        "fusermount3",
        "losetup",
        "mkfs.ext4",
        "dumpe2fs",
        "tar",
    ];
    // No skip: the fs mode is what the experiment is about.
    assert!(
        is_root(),
        "fs mode needs root (losetup, mount); run the tests as root, as scripts/test.sh does"
    );
    assert!(
        Path::new("/dev/fuse").exists(),
        "/dev/fuse is missing: nbdfuse cannot run"
    );
    for t in needed {
        assert!(
            have(t),
            "`{t}` is not installed; run `bash scripts/install-deps.sh`"
        );
    }
    let tmp = tempfile::tempdir().unwrap();
    let (v1, v2) = make_tars(tmp.path());
    let out = tmp.path().join("out");
    let work = tmp.path().join("work");
    let t0 = Instant::now();
    let run = eval(
        &[
            os("--mode"),
            os("fs"),
            os("--chunks"),
            os("32K"),
            os("--size"),
            os("64M"),
            os("--work"),
            work.as_os_str(),
            os("--out"),
            out.as_os_str(),
            v1.as_os_str(),
            v2.as_os_str(),
        ],
        None,
        Duration::from_secs(300),
    );
    assert!(
        run.status.success(),
        "eval failed: {}\n{}",
        run.stderr,
        run.stdout
    );
    eprintln!("fs eval took {:?}", t0.elapsed());
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("### fs mode"));
    assert!(md.contains("| 32K | RAID-6 + parity dedup |"));
    let svg = std::fs::read_to_string(out.join("plot.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    let results: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let fs_runs = runs(&results, "fs");
    assert_eq!(fs_runs.len(), 3);
    let wl_bytes = u(&results["workload"], "bytes");
    for run in &fs_runs {
        let policy = run["policy"].as_str().unwrap();
        // ext4 wrote at least the files' bytes, through partial-stripe updates.
        assert!(u(run, "client_write_bytes") >= wl_bytes / 2, "{policy}");
        assert!(u(run, "stripe_updates") > 0);
        assert!(
            u(run, "rmw_writes") + u(run, "rcw_writes") > 0,
            "{policy}: no partial-stripe update"
        );
        assert!(u(run, "parity_pages_array") > 0);
        assert!(u(run, "parity_pages_media") <= u(run, "parity_pages_array"));
        assert!(u(run, "parity_pages_array") <= u(run, "parity_pages_paper_baseline"));
        assert_eq!(run["per_workload"].as_array().unwrap().len(), 2);
        assert!(run["write_seconds"].as_f64().unwrap() > 0.0);
        let d = &run["decode"];
        // The blocks ext4 has in use: the same extents in every policy.
        assert!(u(d, "range_bytes") > 0 && u(d, "range_bytes") <= 64 << 20);
        assert_eq!(
            u(d, "range_bytes"),
            u(&fs_runs[0]["decode"], "range_bytes"),
            "{policy}"
        );
        assert_eq!(d["verified"], true);
        match policy {
            "none" => assert_eq!(u(run, "hash_ops"), 0),
            "parity" => {
                assert_eq!(u(run, "hash_ops"), u(run, "parity_pages_array"));
                assert_eq!(u(run, "data_pages_media"), u(run, "data_pages_array"));
                assert!(u(run, "index_bytes") > 0);
            }
            "all" => assert_eq!(
                u(run, "hash_ops"),
                u(run, "parity_pages_array") + u(run, "data_pages_array")
            ),
            other => panic!("unexpected policy {other}"),
        }
    }
    // Nothing left mounted or attached under the work folder.
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(!mounts.contains(work.to_str().unwrap()), "{mounts}");
    let loops = Command::new("losetup").arg("-a").output().unwrap();
    assert!(!String::from_utf8_lossy(&loops.stdout).contains(work.to_str().unwrap()));
}

#[test]
fn bad_input_is_refused_before_any_work_with_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let missing = tmp.path().join("no-such.tar");
    let run = eval(
        &[
            os("--mode"),
            os("raw"),
            os("--out"),
            out.as_os_str(),
            missing.as_os_str(),
        ],
        None,
        Duration::from_secs(60),
    );
    assert_eq!(run.status.code(), Some(1));
    assert!(run.stderr.contains("no-such.tar"), "{}", run.stderr);
    assert!(run.stderr.contains("cannot be read"), "{}", run.stderr);

    let f = tmp.path().join("w.bin");
    std::fs::write(&f, b"x").unwrap();
    let run = eval(
        &[
            os("--mode"),
            os("fs"),
            os("--out"),
            out.as_os_str(),
            f.as_os_str(),
        ],
        Some(tmp.path().to_str().unwrap()),
        Duration::from_secs(60),
    );
    assert_eq!(run.status.code(), Some(1));
    assert!(
        run.stderr.contains("missing tools: nbdkit, nbdfuse"),
        "{}",
        run.stderr
    );

    let run = eval(
        &[
            os("--chunks"),
            os("48K"),
            os("--out"),
            out.as_os_str(),
            f.as_os_str(),
        ],
        None,
        Duration::from_secs(60),
    );
    assert_eq!(run.status.code(), Some(1));
    assert!(run.stderr.contains("power of two"), "{}", run.stderr);
}
