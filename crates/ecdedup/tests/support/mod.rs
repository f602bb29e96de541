//! Shared harness for the integration tests: arrays in temporary folders,
//! `ecdedup serve` as a child process, external tools with timeouts.
//!
//! Rules every helper keeps:
//! - every process a test starts is stopped by its PID (Drop kills what is
//!   still running and waits for it), never by name;
//! - every external command runs under a timeout, generous enough for a slow
//!   2-core CI machine; a timeout kills the command and fails the test;
//! - every socket lives inside the test's own temporary folder.
//!
//! Each test binary includes this module with `mod support;` and uses a
//! different subset, hence the `dead_code` allowance.

#![allow(dead_code)]

pub mod archive;
pub mod checker;
pub mod fs;
pub mod nbd;

use serde_json::Value;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long a server may take to open (and resync) an array and answer.
pub const SERVER_READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a server may take to stop after SIGTERM.
pub const SERVER_STOP_TIMEOUT: Duration = Duration::from_secs(60);
/// Default limit for CLI commands (scrub and rebuild of a small volume included).
pub const CLI_TIMEOUT: Duration = Duration::from_secs(300);
/// Default limit for fio, qemu-img, nbdcopy.
pub const TOOL_TIMEOUT: Duration = Duration::from_secs(300);

pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * 1024;

/// The `ecdedup` binary cargo built for these tests.
pub fn ecdedup_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ecdedup"))
}

/// The workspace root (two levels above this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("workspace root")
}

/// The nbdkit plugin `ecdedup serve` loads: next to the binary. `cargo test`
/// does not always build it, so we insist that `cargo build --workspace` ran
/// after the last source change (a stale plugin would test old code).
pub fn plugin_path() -> PathBuf {
    static CHECKED: OnceLock<PathBuf> = OnceLock::new();
    CHECKED
        .get_or_init(|| {
            let plugin = ecdedup_bin().parent().expect("binary folder").join("libecdedup_nbdkit.so");
            let meta = std::fs::metadata(&plugin).unwrap_or_else(|e| {
                panic!("{}: {e}; run `cargo build --workspace` before `cargo test`", plugin.display())
            });
            let built = meta.modified().expect("mtime");
            let root = workspace_root();
            let mut newest: Option<(std::time::SystemTime, PathBuf)> = None;
            for dir in ["crates/ecdedup-core/src", "crates/ecdedup-nbdkit/src"] {
                newest_mtime(&root.join(dir), &mut newest);
            }
            if let Some((t, p)) = newest {
                if t > built {
                    panic!(
                        "{} is older than {}: run `cargo build --workspace` so the tests serve the current code",
                        plugin.display(),
                        p.display()
                    );
                }
            }
            plugin
        })
        .clone()
}

fn newest_mtime(dir: &Path, newest: &mut Option<(std::time::SystemTime, PathBuf)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let Ok(meta) = e.metadata() else { continue };
        if meta.is_dir() {
            newest_mtime(&p, newest);
        } else if let Ok(t) = meta.modified() {
            if newest.as_ref().is_none_or(|(n, _)| t > *n) {
                *newest = Some((t, p));
            }
        }
    }
}

/// Whether a program is on PATH (for clear failures when a tool is missing).
pub fn require_tool(name: &str) {
    let found = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|d| d.join(name).is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "`{name}` is not installed; run `bash scripts/install-deps.sh`"
    );
}

// ---------------------------------------------------------------------------
// Processes

/// A finished command.
#[derive(Debug)]
pub struct Out {
    pub what: String,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// Panics with everything the command said unless it succeeded.
    pub fn ok(self) -> Out {
        assert!(self.success(), "command failed: {self}");
        self
    }

    /// Panics unless the command failed (non-zero exit, no signal).
    pub fn failed(self) -> Out {
        assert!(
            !self.success() && self.status.code().is_some(),
            "command was expected to fail with a non-zero exit: {self}"
        );
        self
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {self}"))
    }
}

impl std::fmt::Display for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "`{}` -> {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.what,
            self.status,
            tail(&self.stdout, 6000),
            tail(&self.stderr, 6000)
        )
    }
}

fn tail(s: &str, n: usize) -> &str {
    if s.len() <= n {
        s
    } else {
        let mut i = s.len() - n;
        while !s.is_char_boundary(i) {
            i += 1;
        }
        &s[i..]
    }
}

pub fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Sends `sig` to `pid` (a process this test started).
pub fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a PID we spawned and have not reaped yet.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

/// Waits for a child up to `timeout`; None if it is still running.
pub fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(st)) => return Some(st),
            Ok(None) => {}
            Err(e) => panic!("waiting for pid {}: {e}", child.id()),
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Kills a child by PID (SIGKILL) and reaps it.
pub fn kill_and_reap(child: &mut Child) {
    if let Ok(None) = child.try_wait() {
        signal(child.id(), libc::SIGKILL);
        let _ = child.wait();
    }
}

/// Runs a command to completion with output captured in anonymous files
/// (no pipe can block on a grandchild). On timeout the command is killed by
/// PID and Err describes it.
pub fn run_timeout(cmd: &mut Command, timeout: Duration) -> Result<Out, String> {
    run_timeout_stdin(cmd, Stdio::null(), timeout)
}

/// [`run`] with `input` as the command's standard input.
pub fn run_with_input(cmd: &mut Command, input: &[u8], timeout: Duration) -> Out {
    let mut file = tempfile::tempfile().expect("temp file");
    file.write_all(input).expect("write stdin file");
    file.seek(SeekFrom::Start(0)).unwrap();
    run_timeout_stdin(cmd, Stdio::from(file), timeout).unwrap_or_else(|e| panic!("{e}"))
}

fn run_timeout_stdin(cmd: &mut Command, stdin: Stdio, timeout: Duration) -> Result<Out, String> {
    let what = describe(cmd);
    let mut out = tempfile::tempfile().expect("temp file");
    let mut err = tempfile::tempfile().expect("temp file");
    let mut child = cmd
        .stdin(stdin)
        .stdout(Stdio::from(out.try_clone().unwrap()))
        .stderr(Stdio::from(err.try_clone().unwrap()))
        .spawn()
        .map_err(|e| format!("cannot start `{what}`: {e}"))?;
    let status = match wait_timeout(&mut child, timeout) {
        Some(st) => st,
        None => {
            kill_and_reap(&mut child);
            return Err(format!(
                "`{what}` did not finish in {timeout:?}; killed (pid {})\n--- stdout ---\n{}\n--- stderr ---\n{}",
                child.id(),
                read_file_tail(&mut out),
                read_file_tail(&mut err)
            ));
        }
    };
    Ok(Out {
        what,
        status,
        stdout: read_all(&mut out),
        stderr: read_all(&mut err),
    })
}

fn read_all(f: &mut File) -> String {
    let mut s = Vec::new();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_to_end(&mut s).unwrap();
    String::from_utf8_lossy(&s).into_owned()
}

fn read_file_tail(f: &mut File) -> String {
    tail(&read_all(f), 6000).to_string()
}

/// Runs a command; panics if it times out. The caller judges the exit.
pub fn run(cmd: &mut Command, timeout: Duration) -> Out {
    run_timeout(cmd, timeout).unwrap_or_else(|e| panic!("{e}"))
}

/// Runs a command and requires success.
pub fn run_ok(cmd: &mut Command, timeout: Duration) -> Out {
    run(cmd, timeout).ok()
}

/// A background process that is killed (by PID) and reaped when dropped.
pub struct Background {
    pub child: Child,
    pub what: String,
    out: File,
    err: File,
}

impl Background {
    pub fn spawn(cmd: &mut Command) -> Background {
        let what = describe(cmd);
        let out = tempfile::tempfile().expect("temp file");
        let err = tempfile::tempfile().expect("temp file");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::from(out.try_clone().unwrap()))
            .stderr(Stdio::from(err.try_clone().unwrap()))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start `{what}`: {e}"));
        Background {
            child,
            what,
            out,
            err,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits up to `timeout`; on timeout kills it and returns Err.
    pub fn wait(mut self, timeout: Duration) -> Result<Out, String> {
        match wait_timeout(&mut self.child, timeout) {
            Some(status) => Ok(Out {
                what: self.what.clone(),
                status,
                stdout: read_all(&mut self.out),
                stderr: read_all(&mut self.err),
            }),
            None => {
                kill_and_reap(&mut self.child);
                Err(format!(
                    "`{}` did not finish in {timeout:?}; killed\n--- stderr ---\n{}",
                    self.what,
                    read_file_tail(&mut self.err)
                ))
            }
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        kill_and_reap(&mut self.child);
    }
}

// ---------------------------------------------------------------------------
// Arrays and servers

/// Library-level create options: RS(4,2) over `devices`, a 32 KiB stripe
/// unit, 1 MiB intent regions, rmw without dedup, buffered I/O, sparse
/// files, metadata on the devices; tests change fields with `..`.
pub fn array_options(devices: Vec<PathBuf>, volume_bytes: u64) -> ecdedup::array::CreateOptions {
    ecdedup::array::CreateOptions {
        devices,
        k: 4,
        m: 2,
        stripe_unit_bytes: 32 << 10,
        volume_bytes,
        intent_region_bytes: 1 << 20,
        dedup: ecdedup::dedup::DedupConfig::default(),
        write_policy: ecdedup::array::WritePolicy::Rmw,
        journal_bytes_max: ecdedup::array::JOURNAL_BYTES_DEFAULT,
        io: ecdedup::media::IoMode::Buffered,
        sparse: true,
        force: false,
        metadata: ecdedup::array::MetadataPlacement::Devices,
    }
}

static SERVER_COUNT: AtomicUsize = AtomicUsize::new(0);

/// An array in its own temporary folder (removed on drop, after servers).
pub struct TestArray {
    pub dir: PathBuf,
    pub tmp: tempfile::TempDir,
}

/// Options for `ecdedup create`, as CLI words.
pub fn create_args(size: &str) -> Vec<String> {
    [
        "create",
        "--devices",
        "6",
        "-k",
        "4",
        "-m",
        "2",
        "--stripe-unit",
        "32K",
        "--size",
        size,
        // Tests leave device files sparse: CI's disk is shared.
        "--sparse",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

impl TestArray {
    /// A fresh, empty temporary folder (no array yet).
    pub fn empty() -> TestArray {
        let tmp = tempfile::Builder::new()
            .prefix("ecdedup-it-")
            .tempdir()
            .expect("temp dir");
        let dir = tmp.path().join("array");
        TestArray { dir, tmp }
    }

    /// RS(4,2) over 6 sparse device files, 32 KiB stripe unit.
    pub fn create(size: &str) -> TestArray {
        Self::create_with(
            &create_args(size)
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        )
    }

    /// RS(4,2) over 6 sparse files, 64 MiB (512 stripes of 128 KiB), with
    /// 4 MiB intent regions (32 stripes each) and `extra` create words.
    pub fn create_64m_small_regions(extra: &[&str]) -> TestArray {
        let mut args = vec![
            "create",
            "--size",
            "64M",
            "--sparse",
            "--intent-region",
            "4M",
        ];
        args.extend_from_slice(extra);
        Self::create_with(&args)
    }

    /// `ecdedup create` with the given words (starting with "create").
    pub fn create_with(args: &[&str]) -> TestArray {
        let a = TestArray::empty();
        a.cli(args).ok();
        a
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.tmp.path().join(name)
    }

    /// The geometry device 0's superblock records.
    pub fn geometry(&self) -> ecdedup::array::Geometry {
        let head = read_at(&self.device(0), 0, 8192);
        let (a, b) = head.split_at(4096);
        ecdedup::array::superblock::Superblock::newest(a, b)
            .expect("superblock")
            .geometry
    }

    pub fn device(&self, i: usize) -> PathBuf {
        self.dir.join(format!("dev{i}"))
    }

    pub fn cli_command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(ecdedup_bin());
        c.arg("--dir").arg(&self.dir).args(args);
        c
    }

    /// Runs `ecdedup --dir DIR ARGS`; the caller judges the exit.
    pub fn cli(&self, args: &[&str]) -> Out {
        run(&mut self.cli_command(args), CLI_TIMEOUT)
    }

    pub fn stats(&self) -> Value {
        self.cli(&["stats"]).ok().json()
    }

    pub fn status(&self) -> Value {
        self.cli(&["status", "--json"]).ok().json()
    }

    /// States of the devices, by position ("active", "failed", "rebuilding").
    pub fn device_states(&self) -> Vec<String> {
        self.status()["devices"]
            .as_array()
            .expect("devices")
            .iter()
            .map(|d| d["state"].as_str().expect("state").to_string())
            .collect()
    }

    /// Starts `ecdedup serve` on a socket in the temp folder and waits until it answers.
    pub fn serve(&self) -> Server {
        self.try_serve(&[]).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Starts a server; Err (with its log) if it exits or never answers.
    pub fn try_serve(&self, extra: &[&str]) -> Result<Server, String> {
        self.try_serve_with_env(extra, &[])
    }

    /// [`TestArray::try_serve`] with environment variables set for the
    /// server (test faults).
    pub fn try_serve_with_env(
        &self,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Server, String> {
        let n = SERVER_COUNT.fetch_add(1, Ordering::SeqCst);
        let socket = self.path(&format!("nbd{n}.sock"));
        let log = self.path(&format!("server{n}.log"));
        Server::start_with_env(&self.dir, &socket, &log, extra, env)
    }

    /// `scrub --check-only` on a stopped array (it resyncs first if the
    /// last stop was unclean); requires a clean report over every stripe.
    pub fn scrub_check_clean(&self) -> Value {
        let out = self.cli(&["scrub", "--check-only"]);
        assert!(out.success(), "scrub --check-only found problems: {out}");
        let report = out.json();
        let stripes = self.status()["stripes"].as_u64().unwrap();
        assert_eq!(
            report["stripes"].as_u64(),
            Some(stripes),
            "scrub did not cover every stripe: {report}"
        );
        for key in [
            "checksum_mismatches",
            "parity_mismatches",
            "unrecoverable_blocks",
            "degraded_stripes",
        ] {
            assert_eq!(
                report[key].as_u64(),
                Some(0),
                "scrub reports {key}: {report}"
            );
        }
        report
    }
}

/// Reads one array counter out of a `stats` snapshot.
pub fn counter(stats: &Value, name: &str) -> u64 {
    stats["array"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("no counter array.{name} in {stats}"))
}

/// The etcd endpoint `cluster up` printed (its line `etcd URL`).
pub fn printed_etcd(up: &Out) -> String {
    up.stdout
        .lines()
        .find_map(|l| l.strip_prefix("etcd "))
        .unwrap_or_else(|| panic!("cluster up prints etcd's endpoint: {up}"))
        .trim()
        .to_owned()
}

/// A running `ecdedup serve` (which execs nbdkit: same PID).
pub struct Server {
    child: Option<Child>,
    pub socket: PathBuf,
    pub log: PathBuf,
}

impl Server {
    pub fn start(dir: &Path, socket: &Path, log: &Path, extra: &[&str]) -> Result<Server, String> {
        Server::start_with_env(dir, socket, log, extra, &[])
    }

    /// [`Server::start`] with environment variables set for the server.
    pub fn start_with_env(
        dir: &Path,
        socket: &Path,
        log: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Server, String> {
        let _ = plugin_path();
        require_tool("nbdkit");
        require_tool("nbdinfo");
        let logf = File::create(log).expect("server log");
        let child = Command::new(ecdedup_bin())
            .arg("--dir")
            .arg(dir)
            .arg("serve")
            .arg("--socket")
            .arg(socket)
            .arg("--threads")
            .arg("8")
            .args(extra)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::from(logf.try_clone().unwrap()))
            .stderr(Stdio::from(logf))
            .spawn()
            .map_err(|e| format!("cannot start ecdedup serve: {e}"))?;
        let mut server = Server {
            child: Some(child),
            socket: socket.to_owned(),
            log: log.to_owned(),
        };
        let deadline = Instant::now() + SERVER_READY_TIMEOUT;
        loop {
            if let Some(st) = server.child.as_mut().unwrap().try_wait().expect("try_wait") {
                server.child = None;
                return Err(format!(
                    "ecdedup serve exited ({st}) before answering; log:\n{}",
                    server.log_text()
                ));
            }
            if server.socket.exists() {
                let probe = run_timeout(
                    Command::new("nbdinfo").arg("--size").arg(server.uri()),
                    Duration::from_secs(30),
                );
                if let Ok(out) = probe {
                    if out.success() {
                        return Ok(server);
                    }
                }
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "ecdedup serve did not answer within {SERVER_READY_TIMEOUT:?}; log:\n{}",
                    server.log_text()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.socket.display())
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("server running").id()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => c.try_wait().expect("try_wait").is_none(),
            None => false,
        }
    }

    /// Clean stop: SIGTERM, then wait; requires a clean exit.
    pub fn stop(mut self) {
        let mut child = self.child.take().expect("server running");
        signal(child.id(), libc::SIGTERM);
        match wait_timeout(&mut child, SERVER_STOP_TIMEOUT) {
            Some(st) => assert!(
                st.success() || st.code().is_none() && st.signal_is(libc::SIGTERM),
                "server exited uncleanly ({st}); log:\n{}",
                self.log_text()
            ),
            None => {
                kill_and_reap(&mut child);
                panic!(
                    "server did not stop within {SERVER_STOP_TIMEOUT:?} of SIGTERM; log:\n{}",
                    self.log_text()
                );
            }
        }
    }

    /// Waits up to `timeout` for the server to exit by itself; its status,
    /// or None while it still runs.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let status = wait_timeout(self.child.as_mut().expect("server running"), timeout)?;
        self.child = None;
        Some(status)
    }

    /// Crash: SIGKILL, no clean shutdown.
    pub fn kill9(mut self) {
        if let Some(mut c) = self.child.take() {
            kill_and_reap(&mut c);
        }
    }

    pub fn client(&self) -> nbd::Client {
        nbd::Client::connect(&self.socket)
            .unwrap_or_else(|e| panic!("connecting to {}: {e:?}", self.socket.display()))
    }
}

trait SignalIs {
    fn signal_is(&self, sig: i32) -> bool;
}

impl SignalIs for ExitStatus {
    fn signal_is(&self, sig: i32) -> bool {
        use std::os::unix::process::ExitStatusExt;
        self.signal() == Some(sig)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            kill_and_reap(&mut c);
        }
    }
}

/// Runs one named phase of a test that tells a story on one array: when
/// the phase panics, the test's output says `phase NAME failed` right after
/// the panic's own message (the panic goes on unchanged), so a merged test
/// still says which step broke.
pub fn phase<T>(name: &str, f: impl FnOnce() -> T) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(payload) => {
            eprintln!("phase `{name}` failed");
            std::panic::resume_unwind(payload)
        }
    }
}

// ---------------------------------------------------------------------------
// fio

/// `fio` that runs in the temp folder and never leaves verify-state files
/// behind (fio dumps them into its working folder when a job fails).
pub fn fio_command() -> Command {
    let mut c = Command::new("fio");
    c.current_dir(std::env::temp_dir())
        .arg("--verify_state_save=0");
    c
}

/// One fio job against a byte range of the volume, always with crc32c
/// verification that stops at the first mismatch.
#[derive(Clone, Debug)]
pub struct FioJob {
    pub name: &'static str,
    pub rw: &'static str,
    /// `--bs` value, or a `--bsrange` value when it contains '-'.
    pub bs: &'static str,
    pub offset: u64,
    pub size: u64,
    pub iodepth: u32,
    pub seed: u64,
}

impl FioJob {
    /// 4 KiB random writes.
    pub fn random_4k(offset: u64, size: u64, seed: u64) -> FioJob {
        FioJob {
            name: "rand4k",
            rw: "randwrite",
            bs: "4k",
            offset,
            size,
            iodepth: 8,
            seed,
        }
    }
    /// 1 MiB sequential writes.
    pub fn sequential_1m(offset: u64, size: u64, seed: u64) -> FioJob {
        FioJob {
            name: "seq1m",
            rw: "write",
            bs: "1m",
            offset,
            size,
            iodepth: 4,
            seed,
        }
    }
    /// Mixed random reads and writes, 4 KiB to 256 KiB.
    pub fn mixed(offset: u64, size: u64, seed: u64) -> FioJob {
        FioJob {
            name: "mixed",
            rw: "randrw",
            bs: "4k-256k",
            offset,
            size,
            iodepth: 8,
            seed,
        }
    }

    /// The three standard jobs over three consecutive ranges of `size` from `base`.
    pub fn standard_three(base: u64, size: u64, seed: u64) -> Vec<FioJob> {
        vec![
            FioJob::random_4k(base, size, seed),
            FioJob::sequential_1m(base + size, size, seed + 1),
            FioJob::mixed(base + 2 * size, size, seed + 2),
        ]
    }

    pub fn command(&self, uri: &str, verify_only: bool) -> Command {
        let mut c = fio_command();
        c.arg(format!("--name={}", self.name))
            .arg("--ioengine=nbd")
            .arg(format!("--uri={uri}"))
            .arg("--thread")
            .arg(format!("--rw={}", self.rw))
            .arg(format!("--offset={}", self.offset))
            .arg(format!("--size={}", self.size))
            .arg(format!("--iodepth={}", self.iodepth))
            .arg(format!("--randseed={}", self.seed))
            .arg("--verify=crc32c")
            .arg("--verify_fatal=1")
            .arg("--do_verify=1");
        if self.bs.contains('-') {
            c.arg(format!("--bsrange={}", self.bs));
        } else {
            c.arg(format!("--bs={}", self.bs));
        }
        if self.rw == "randrw" {
            c.arg("--rwmixread=30");
        }
        if verify_only {
            c.arg("--verify_only");
        }
        c
    }

    /// Runs the job (writes, then verifies); requires success.
    pub fn run(&self, server: &Server) -> Out {
        self.go(server, false)
    }

    /// Re-verifies what an earlier run of the same job wrote, writing nothing.
    pub fn verify_only(&self, server: &Server) -> Out {
        self.go(server, true)
    }

    fn go(&self, server: &Server, verify_only: bool) -> Out {
        require_tool("fio");
        let out = run(&mut self.command(&server.uri(), verify_only), TOOL_TIMEOUT);
        assert!(
            out.success() && !out.stderr.contains("verify:"),
            "fio {}job {self:?} failed: {out}\n--- server log (tail) ---\n{}",
            if verify_only { "verify-only " } else { "" },
            tail(&server.log_text(), 6000)
        );
        out
    }
}

// ---------------------------------------------------------------------------
// Data

/// Deterministic pseudo-random bytes (xorshift64*), for images and patterns.
pub fn pseudo_random(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        v.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    v.truncate(len);
    v
}

/// Where a volume byte lives on the media of an array of geometry `g`
/// ([`TestArray::geometry`]: as its superblocks say, metadata area
/// included), computed with the library's own layout (the tests
/// cross-check it against the device files before relying on it).
pub struct Location {
    pub device: usize,
    pub offset: u64,
    pub stripe: u64,
    pub role: usize,
}

pub fn locate(g: &ecdedup::array::Geometry, volume_offset: u64) -> Location {
    let sd = g.stripe_data_bytes();
    let stripe = volume_offset / sd;
    let within = volume_offset % sd;
    let role = (within / g.unit_bytes()) as usize;
    let in_unit = within % g.unit_bytes();
    let p = g.place(stripe, role);
    Location {
        device: p.device,
        offset: g.device_offset(p.row, in_unit / g.block()) + in_unit % g.block(),
        stripe,
        role,
    }
}

/// Device offset of block `b` of the unit with `role` in `stripe`.
pub fn unit_block(g: &ecdedup::array::Geometry, stripe: u64, role: usize, b: u64) -> (usize, u64) {
    let p = g.place(stripe, role);
    (p.device, g.device_offset(p.row, b))
}

pub fn read_at(path: &Path, offset: u64, len: usize) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let f = File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, offset)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    buf
}

/// Flips (XOR 0xff) `len` bytes of a device file at `offset`.
pub fn flip_bytes(path: &Path, offset: u64, len: usize) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .expect("open device");
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, offset).unwrap();
    for b in &mut buf {
        *b ^= 0xff;
    }
    f.write_all_at(&buf, offset).unwrap();
    f.sync_all().unwrap();
}

/// First differing offset of two buffers, for readable assertion messages.
pub fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    if a.len() != b.len() {
        return Some(a.len().min(b.len()));
    }
    a.iter().zip(b).position(|(x, y)| x != y)
}

pub fn assert_same_bytes(what: &str, got: &[u8], want: &[u8]) {
    if let Some(i) = first_difference(got, want) {
        panic!(
            "{what}: differs at byte {i} (lengths {} and {}; block {} of 4 KiB)",
            got.len(),
            want.len(),
            i / 4096
        );
    }
}
