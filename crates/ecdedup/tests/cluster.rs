//! The cluster through its commands, as a user runs it: `cluster up` (a
//! local etcd and six chunk servers on loopback), pools of each policy,
//! volumes served by `serve --cluster`, and fio `--verify` through NBD
//! across a chunk server killed and restarted, a second writer refused,
//! a writer taken over while the old one is stopped (SIGSTOP) and later
//! resumed, and ext4 through nbdfuse and a loop device across a writer
//! and a chunk server killed with SIGKILL. One cluster serves the whole story (its start-up is the
//! expensive part); each step's failure names the step.

use crate::support;

use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};
use support::fs::{
    count_files, diff_trees, fsck_clean, mkfs, require_fs_tools, sync_fs, Stack, COPY_TIMEOUT,
};
use support::*;

struct Cluster {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    etcd: String,
}

impl Cluster {
    fn cli(&self, args: &[&str]) -> Out {
        run(
            Command::new(ecdedup_bin())
                .arg("--dir")
                .arg(&self.dir)
                .args(args),
            CLI_TIMEOUT,
        )
    }

    fn cli_ok(&self, args: &[&str]) -> Out {
        let out = self.cli(args);
        assert!(out.success(), "ecdedup {args:?}: {out}");
        out
    }

    fn etcd_args(&self) -> Vec<String> {
        vec!["--etcd".into(), self.etcd.clone()]
    }

    fn state(&self) -> Value {
        serde_json::from_slice(&std::fs::read(self.dir.join("cluster.json")).unwrap()).unwrap()
    }

    fn server_pid(&self, id: usize) -> u32 {
        self.state()["servers"][id]["pid"].as_u64().unwrap() as u32
    }

    /// `serve --cluster` of `volume` with its state in `name`.
    fn serve(&self, volume: &str, name: &str) -> Result<Server, String> {
        self.serve_with(volume, name, &[])
    }

    /// [`Cluster::serve`] with more `serve` options.
    fn serve_with(&self, volume: &str, name: &str, extra: &[&str]) -> Result<Server, String> {
        let key = self.dir.join("cluster.key");
        let mut args = vec![
            "--cluster",
            &self.etcd,
            "--volume",
            volume,
            "--key",
            key.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        Server::start(
            &self.dir.join(name),
            &self.dir.join(format!("{name}.sock")),
            &self.dir.join(format!("{name}.log")),
            &args,
        )
    }

    fn stats(&self, name: &str) -> Value {
        use std::io::Read;
        let mut s = std::os::unix::net::UnixStream::connect(self.dir.join(name).join("stats.sock"))
            .expect("the volume's stats socket");
        let mut text = String::new();
        s.read_to_string(&mut text).unwrap();
        serde_json::from_str(&text).unwrap()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.dir.join("cluster.json").exists() {
            let _ = self.cli(&["cluster", "down"]);
        }
    }
}

fn up() -> Cluster {
    require_tool("etcd");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("c");
    let mut c = Cluster {
        _tmp: tmp,
        dir,
        etcd: String::new(),
    };
    let out = c.cli_ok(&[
        "cluster",
        "up",
        "--servers",
        "6",
        "--size",
        "128M",
        "--pgs",
        "2",
        "--stripe-unit",
        "32K",
        "--no-serve",
    ]);
    c.etcd = printed_etcd(&out);
    c
}

/// The nbdkit process under a `serve --cluster` (its child).
fn nbdkit_of(server: &Server) -> u32 {
    let path = format!("/proc/{}/task/{}/children", server.pid(), server.pid());
    std::fs::read_to_string(&path)
        .unwrap_or_default()
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("serve --cluster has no nbdkit child ({path})"))
}

fn wait_until(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !ok() {
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_cluster_serves_volumes_through_faults_and_takeovers() {
    let c = up();
    let etcd = c.etcd_args();
    let with_etcd = |args: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        v.splice(1..1, etcd.iter().cloned());
        v
    };
    let cli = |args: Vec<String>| {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        c.cli_ok(&refs)
    };

    // 0. Every server registered what of the protocol it takes (a writer
    // sends a barrier only to a server that names it).
    let status: Value =
        serde_json::from_str(&c.cli_ok(&["cluster", "status", "--json"]).stdout).unwrap();
    for s in status["servers"].as_array().unwrap() {
        assert_eq!(
            s["features"],
            serde_json::json!(["log-append-barrier", "dedup-layer", "epoch-watch"]),
            "step 0: {s}"
        );
    }

    // A reader that stopped reading ends `cluster status` quietly, as it
    // ends `cat` (it panicked in `println!` before the late evening of 2026-11-29). `true`
    // exits at once: the pipe is closed long before the status is read
    // from etcd.
    let piped = run(
        Command::new("sh").arg("-c").arg(format!(
            "'{}' --dir '{}' cluster status | true",
            ecdedup_bin().display(),
            c.dir.display()
        )),
        CLI_TIMEOUT,
    );
    assert!(
        piped.success() && !piped.stderr.contains("panic"),
        "step 0: cluster status | true: {piped}"
    );

    // 1. The rmw volume `cluster up` made: fio verifies through NBD.
    let w1 = c
        .serve("pool0/vol0", "w1")
        .expect("step 1: serve --cluster");
    let jobs = FioJob::standard_three(0, 8 * MIB, 11);
    for job in &jobs {
        job.run(&w1);
    }

    // 2. A second writer of the same volume is refused, saying who holds it.
    match c.serve("pool0/vol0", "w2") {
        Ok(_) => panic!("step 2: a second writer of pool0/vol0 was accepted"),
        Err(log) => assert!(
            log.contains("writer"),
            "step 2: the refusal names the writer: {log}"
        ),
    }

    // 3. A chunk server killed during writes: fio goes on, degraded.
    let victim = c.server_pid(2);
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        signal(victim, libc::SIGKILL);
    });
    let during = FioJob::random_4k(32 * MIB, 8 * MIB, 12);
    during.run(&w1);
    killer.join().unwrap();
    for job in &jobs {
        job.verify_only(&w1);
    }
    // Down once its registration's lease (5 s) has expired: fio may end
    // sooner on a quiet machine.
    wait_until(
        "step 3: the killed server shows down",
        Duration::from_secs(60),
        || {
            let status = c.cli_ok(&["cluster", "status", "--json"]).stdout;
            let status: Value = serde_json::from_str(&status).unwrap();
            status["servers"][2]["state"] == "down"
        },
    );

    // 4. It comes back; the writer still serving resynchronises only what
    //    its shards missed, without a reopen. Its old port was taken
    //    meanwhile (as by another process's bind): it comes back on
    //    another, which the writer follows.
    let old_port = c.state()["servers"][2]["port"].as_u64().unwrap() as u16;
    let taken = std::net::TcpListener::bind(("127.0.0.1", old_port));
    let out = c.cli_ok(&["cluster", "restart-server", "2"]);
    let new_port = c.state()["servers"][2]["port"].as_u64().unwrap() as u16;
    if taken.is_ok() {
        assert_ne!(new_port, old_port, "step 4: {}", out.stdout);
        assert!(
            out.stdout.contains(&format!("port {new_port}")),
            "step 4: {}",
            out.stdout
        );
    } else {
        eprintln!(
            "SKIPPED (part of step 4): port {old_port} was taken before the test could hold it"
        );
    }
    drop(taken);
    let resynced_while_serving = |log: &str| {
        let started = log.matches("event=shard-re-add-start").count();
        let done = log
            .lines()
            .filter(|l| l.contains("event=shard-resynced") && l.contains("while_serving=true"))
            .count();
        started > 0 && done == started
    };
    wait_until(
        "step 4: the serving writer re-adds the returned server's shards",
        Duration::from_secs(120),
        || resynced_while_serving(&w1.log_text()),
    );
    assert!(
        w1.log_text().contains("re-added"),
        "step 4: the re-add says what it resynchronised: {}",
        w1.log_text()
    );
    w1.stop();
    let w3 = c
        .serve("pool0/vol0", "w3")
        .expect("step 4: serve after the restart");
    assert!(
        !w3.log_text().contains("shard-stays-failed"),
        "step 4: every shard is in service at the next open: {}",
        w3.log_text()
    );
    for job in jobs.iter().chain([&during]) {
        job.verify_only(&w3);
    }

    // 5. Takeover: the writer stopped (SIGSTOP) past its lease, a new
    //    writer takes over and writes; the old one, resumed, lands nothing.
    let old_nbdkit = nbdkit_of(&w3);
    signal(old_nbdkit, libc::SIGSTOP);
    let w4 = {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            match c.serve("pool0/vol0", "w4") {
                Ok(s) => break s,
                Err(log) if Instant::now() < deadline && log.contains("writer") => {
                    std::thread::sleep(Duration::from_secs(1))
                }
                Err(log) => panic!("step 5: the new writer did not take over: {log}"),
            }
        }
    };
    let after = FioJob::random_4k(0, 8 * MIB, 13);
    after.run(&w4);
    signal(old_nbdkit, libc::SIGCONT);
    // The old writer's attempt: refused (EIO), and it stops its export.
    let old_try = run(
        fio_command()
            .arg("--name=old")
            .arg("--ioengine=nbd")
            .arg(format!("--uri={}", w3.uri()))
            .arg("--rw=write")
            .arg("--bs=64k")
            .arg("--size=1M")
            .arg("--offset=0"),
        TOOL_TIMEOUT,
    );
    assert!(
        !old_try.success(),
        "step 5: the old writer's write succeeded: {old_try}"
    );
    wait_until(
        "step 5: the fenced writer stops",
        Duration::from_secs(60),
        || w3.log_text().contains("fenced") || w3.log_text().contains("stopped"),
    );
    after.verify_only(&w4);
    let wire = &c.stats("w4")["wire"];
    assert_eq!(wire["failures"], 0, "step 5: {wire}");
    w4.stop();
    drop(w3);

    // 6. A parix pool with parity-only dedup (its layers run at the chunk
    //    servers) and a replicated pool on the same servers.
    cli(with_etcd(&[
        "pool",
        "create",
        "px",
        "--policy",
        "parix",
        "--pgs",
        "2",
        "--stripe-unit",
        "32K",
        "--dedup",
        "parity",
    ]));
    cli(with_etcd(&[
        "pool",
        "create",
        "r3",
        "--policy",
        "replicate",
        "--copies",
        "3",
        "--pgs",
        "2",
    ]));
    cli(with_etcd(&["volume", "create", "px/v", "--size", "64M"]));
    cli(with_etcd(&["volume", "create", "r3/v", "--size", "64M"]));
    let made = cli(with_etcd(&[
        "volume", "create", "px/small", "--size", "32M",
    ]));
    let small_id: u64 = made
        .stdout
        .split("id ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("step 6: the new volume's id in {:?}", made.stdout));
    cli(with_etcd(&[
        "volume", "resize", "px/small", "--size", "48M",
    ]));
    for (volume, name) in [("px/v", "px"), ("r3/v", "r3"), ("px/small", "small")] {
        let s = c
            .serve(volume, name)
            .unwrap_or_else(|e| panic!("step 6: {volume}: {e}"));
        let job = FioJob::random_4k(0, 8 * MIB, 14);
        job.run(&s);
        let wire = &c.stats(name)["wire"];
        assert!(
            wire["round_trips"].as_u64().unwrap() > 0,
            "step 6: {volume}: {wire}"
        );
        if name == "small" {
            // The resize shows: the volume is 48 MiB.
            let out = run_ok(
                Command::new("nbdinfo").arg("--size").arg(s.uri()),
                TOOL_TIMEOUT,
            );
            assert_eq!(out.stdout.trim(), (48 * MIB).to_string(), "step 6: resized");
        }
        s.stop();
    }
    // The px volumes' dedup layers ran at the servers, which report them
    // with their space (every 10 s here).
    let server_dedup = || -> (u64, u64) {
        let status: Value =
            serde_json::from_str(&c.cli_ok(&["cluster", "status", "--json"]).stdout).unwrap();
        let servers = status["servers"].as_array().unwrap().clone();
        let sum = |field: &str| -> u64 {
            servers
                .iter()
                .filter_map(|s| s["dedup"][field].as_u64())
                .sum()
        };
        (sum("layers_open"), sum("physical_writes"))
    };
    wait_until(
        "step 6: the servers report the px volumes' dedup layers",
        Duration::from_secs(120),
        || {
            let (layers, written) = server_dedup();
            layers > 0 && written > 0
        },
    );
    // And per volume, summed over the servers: px/v's parity blocks,
    // mapped to no more slots than blocks.
    wait_until(
        "step 6: cluster status shows px/v's dedup at the servers",
        Duration::from_secs(120),
        || {
            let status: Value =
                serde_json::from_str(&c.cli_ok(&["cluster", "status", "--json"]).stdout).unwrap();
            let px = status["pools"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == "px")
                .cloned()
                .unwrap();
            let v = px["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["name"] == "v")
                .cloned()
                .unwrap();
            let d = &v["dedup"];
            let (mapped, slots) = (
                d["mapped_blocks"].as_u64().unwrap_or(0),
                d["slots_used"].as_u64().unwrap_or(0),
            );
            assert!(mapped >= slots, "step 6: {d}");
            slots > 0 && d["chunks"].as_u64().unwrap_or(0) > 0
        },
    );
    let text = c.cli_ok(&["cluster", "status"]).stdout;
    assert!(
        text.contains("dedup at servers:"),
        "step 6: the text status shows it: {text}"
    );

    // 7. `volume rm` frees the volume's chunks: each server deletes them at
    //    its next space report (every 10 s here).
    let chunk_folders = || -> Vec<PathBuf> {
        (0..6)
            .flat_map(|id| {
                let server = c.dir.join(format!("server{id}"));
                (0..4).map(move |d| server.join(format!("dev{d}/chunks/v{small_id}")))
            })
            .filter(|p| p.exists())
            .collect()
    };
    assert!(!chunk_folders().is_empty(), "step 7: px/small has chunks");
    let out = cli(with_etcd(&["volume", "rm", "px/small"]));
    assert!(out.stdout.contains("removed px/small"), "step 7: {out:?}");
    wait_until(
        "step 7: the chunks of px/small deleted",
        Duration::from_secs(120),
        || chunk_folders().is_empty(),
    );
    // Pools: one that holds volumes is not removed, an empty one is; a
    // stripe unit serve could not open is refused at creation; a pool
    // that does not exist is said so; the etcd options may follow the
    // subcommand.
    let refused = |args: Vec<String>, why: &str| {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = c.cli(&refs);
        assert!(!out.success(), "step 7: {args:?} succeeded: {out}");
        assert!(out.stderr.contains(why), "step 7: {args:?}: {out}");
    };
    refused(with_etcd(&["pool", "rm", "px"]), "holds volumes (v)");
    refused(
        with_etcd(&["pool", "create", "twelve", "--stripe-unit", "12K"]),
        "power of two",
    );
    refused(with_etcd(&["volume", "ls", "nopool"]), "does not exist");
    cli(with_etcd(&["pool", "create", "empty", "--pgs", "1"]));
    let mut after: Vec<String> = ["pool", "rm", "empty"].map(String::from).to_vec();
    after.extend(etcd.iter().cloned());
    let out = cli(after);
    assert!(out.stdout.contains("removed pool empty"), "step 7: {out}");
    let listed = cli(with_etcd(&["pool", "ls"])).stdout;
    assert!(!listed.contains("empty"), "step 7: {listed}");

    // 8. ext4 on a volume (nbdfuse + loop: the kernel has no nbd module):
    //    a tree copied and synced, the writer's nbdkit and a chunk server
    //    killed with SIGKILL, a take-over: e2fsck clean, the tree the same,
    //    read degraded.
    require_fs_tools();
    let started = Instant::now();
    cli(with_etcd(&[
        "volume", "create", "pool0/fs", "--size", "96M",
    ]));
    let staged = c.dir.join("staged");
    std::fs::create_dir_all(&staged).unwrap();
    // A snapshot of two crates' sources (a few dozen files) and a 3 MiB
    // file that spans stripes of both PGs.
    for crate_dir in ["ecdedup-cluster", "ecdedup-client"] {
        run_ok(
            Command::new("cp")
                .arg("-a")
                .arg(workspace_root().join("crates").join(crate_dir))
                .arg(&staged),
            COPY_TIMEOUT,
        );
    }
    std::fs::write(
        staged.join("random.bin"),
        pseudo_random(15, 3 * MIB as usize),
    )
    .unwrap();
    let files = count_files(&staged);
    let fs1 = c.serve("pool0/fs", "fs1").expect("step 8: serve --cluster");
    let mut stack = Stack::attach(&c.dir, "fuse1", &fs1.uri());
    mkfs(stack.dev());
    let mnt = stack.mount_at(&c.dir.join("mnt1"));
    run_ok(
        Command::new("cp")
            .arg("-a")
            .arg(&staged)
            .arg(mnt.join("tree")),
        COPY_TIMEOUT,
    );
    sync_fs(&mnt);
    stack.close();
    // No clean stop: the writer's nbdkit, then its parent, then a server.
    signal(nbdkit_of(&fs1), libc::SIGKILL);
    fs1.kill9();
    signal(c.server_pid(3), libc::SIGKILL);
    let fs2 = c
        .serve_with("pool0/fs", "fs2", &["--take-over"])
        .expect("step 8: the take-over with server 3 down");
    let mut stack = Stack::attach(&c.dir, "fuse2", &fs2.uri());
    fsck_clean(stack.dev());
    let mnt = stack.mount_at(&c.dir.join("mnt2"));
    diff_trees(&staged, &mnt.join("tree"));
    stack.close();
    let stats = c.stats("fs2");
    eprintln!(
        "step 8: {files} files on ext4, read back with server 3 down in {:?}: {stats}",
        started.elapsed()
    );
    assert!(
        stats["degraded_reads"].as_u64().unwrap() > 0,
        "step 8: the reads decoded around server 3: {stats}"
    );
    fs2.stop();
}
