//! Processes and mounts the experiments start, each behind a guard that
//! stops it on every path: by its PID (never by name), with timeouts, and
//! with a lazy/forced fallback where the clean way hangs.
//!
//! Children run in their own process group, so a Ctrl-C at the terminal
//! reaches only this process: [`install_interrupt_handler`] turns SIGINT and
//! SIGTERM into a flag that every wait loop checks, and the guards' `Drop`
//! then takes the stack down in order (mount, loop device, nbdfuse, server).

use ecdedup_core::error::{Error, Result};
use std::fs::File;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Limit for the quick steps (losetup, mount, umount, mkfs of a small volume).
pub const STEP_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a server may take to open an array and answer.
pub const SERVER_READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a server may take to close its array after SIGTERM.
pub const SERVER_STOP_TIMEOUT: Duration = Duration::from_secs(120);

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_sig: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// SIGINT and SIGTERM set a flag instead of killing the process.
pub fn install_interrupt_handler() {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
}

pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

pub fn check_interrupted() -> Result<()> {
    if interrupted() {
        Err(Error::Other("interrupted; the stack was taken down".into()))
    } else {
        Ok(())
    }
}

/// Sends a signal to a child this process started and has not reaped.
fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on the PID of our own unreaped child.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

/// Waits up to `timeout`; None if still running (or interrupted, when
/// `interruptible`).
fn wait_timeout(child: &mut Child, timeout: Duration, interruptible: bool) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(st)) => return Some(st),
            Ok(None) => {}
            Err(_) => return None,
        }
        if Instant::now() >= deadline || (interruptible && interrupted()) {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn kill_and_reap(child: &mut Child) {
    signal(child.id(), libc::SIGKILL);
    let _ = child.wait();
}

pub fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// A finished command.
#[derive(Debug)]
pub struct Output {
    pub what: String,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    pub fn success(&self) -> bool {
        self.status.success()
    }
}

fn reader<R: Read + Send + 'static>(r: Option<R>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = Vec::new();
        if let Some(mut r) = r {
            let _ = r.read_to_end(&mut s);
        }
        String::from_utf8_lossy(&s).into_owned()
    })
}

/// Runs a command to completion with a time limit; kills it (by PID) on
/// timeout or interrupt.
pub fn run(cmd: &mut Command, timeout: Duration) -> Result<Output> {
    run_as(cmd, timeout, true, None)
}

/// As [`run`], calling `tick` about four times a second while it runs.
pub fn run_ticking(cmd: &mut Command, timeout: Duration, tick: &mut dyn FnMut()) -> Result<Output> {
    run_as(cmd, timeout, true, Some(tick))
}

/// As [`run`], but an interrupt does not stop it (teardown steps).
fn run_teardown(cmd: &mut Command, timeout: Duration) -> Result<Output> {
    run_as(cmd, timeout, false, None)
}

fn run_as(
    cmd: &mut Command,
    timeout: Duration,
    interruptible: bool,
    mut tick: Option<&mut dyn FnMut()>,
) -> Result<Output> {
    let what = describe(cmd);
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| Error::io(format!("running `{what}`"), e))?;
    let out = reader(child.stdout.take());
    let err = reader(child.stderr.take());
    let deadline = Instant::now() + timeout;
    let mut last_tick = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) => {}
            Err(e) => {
                kill_and_reap(&mut child);
                return Err(Error::io(format!("waiting for `{what}`"), e));
            }
        }
        if interruptible && interrupted() {
            kill_and_reap(&mut child);
            check_interrupted()?;
        }
        if Instant::now() >= deadline {
            kill_and_reap(&mut child);
            return Err(Error::Other(format!(
                "`{what}` did not finish within {} s and was killed",
                timeout.as_secs()
            )));
        }
        if let Some(t) = tick.as_mut() {
            if last_tick.elapsed() >= Duration::from_millis(250) {
                last_tick = Instant::now();
                t();
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Ok(Output {
        what,
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    })
}

/// As [`run`], and a non-zero exit is an error that quotes the command.
pub fn run_ok(cmd: &mut Command, timeout: Duration) -> Result<Output> {
    ok(run(cmd, timeout)?)
}

fn ok(out: Output) -> Result<Output> {
    if !out.success() {
        return Err(Error::Other(format!(
            "`{}` failed ({}): {}{}",
            out.what,
            out.status,
            out.stderr.trim(),
            if out.stdout.trim().is_empty() {
                String::new()
            } else {
                format!(" / {}", out.stdout.trim())
            }
        )));
    }
    Ok(out)
}

/// Best effort, for teardown: true when the command ran and succeeded.
fn quiet(cmd: &mut Command, timeout: Duration) -> bool {
    matches!(run_teardown(cmd, timeout), Ok(o) if o.success())
}

/// Whether a program is on PATH.
pub fn have_tool(name: &str) -> bool {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|d| d.join(name).is_file()))
        .unwrap_or(false)
}

fn tail_of_file(path: &Path, n: usize) -> String {
    let s = std::fs::read_to_string(path).unwrap_or_default();
    let start = s.len().saturating_sub(n);
    let mut i = start;
    while !s.is_char_boundary(i) {
        i += 1;
    }
    s[i..].trim().to_string()
}

pub fn is_mounted(target: &Path) -> bool {
    let Ok(target) = target.canonicalize() else {
        return false;
    };
    std::fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().nth(1).map(Path::new) == Some(target.as_path()))
}

// ---------------------------------------------------------------------------
// The server

/// `ecdedup serve` (which becomes nbdkit) on a Unix socket.
pub struct Server {
    child: Option<Child>,
    pub dir: PathBuf,
    pub socket: PathBuf,
    log: PathBuf,
}

impl Server {
    /// Starts the server of the array in `dir` and waits until both its NBD
    /// socket and its control socket answer.
    pub fn start(dir: &Path) -> Result<Server> {
        let exe =
            std::env::current_exe().map_err(|e| Error::io("locating the ecdedup executable", e))?;
        let socket = dir.join("nbd.sock");
        let log = dir.join("serve.log");
        let logf =
            File::create(&log).map_err(|e| Error::io(format!("creating {}", log.display()), e))?;
        let logf2 = logf
            .try_clone()
            .map_err(|e| Error::io("duplicating a file handle", e))?;
        let child = Command::new(exe)
            .arg("--dir")
            .arg(dir)
            .arg("serve")
            .arg("--socket")
            .arg(&socket)
            .stdin(Stdio::null())
            .stdout(logf)
            .stderr(logf2)
            .process_group(0)
            .spawn()
            .map_err(|e| Error::io("starting `ecdedup serve`", e))?;
        let mut server = Server {
            child: Some(child),
            dir: dir.to_owned(),
            socket,
            log,
        };
        server.wait_ready()?;
        Ok(server)
    }

    fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + SERVER_READY_TIMEOUT;
        loop {
            check_interrupted()?;
            let child = self.child.as_mut().expect("running");
            if let Ok(Some(st)) = child.try_wait() {
                self.child = None;
                return Err(Error::Other(format!(
                    "`ecdedup serve` exited early ({st}): {}",
                    tail_of_file(&self.log, 2000)
                )));
            }
            if self.socket.exists() {
                if let Ok(c) = super::nbd::Client::connect(&self.socket) {
                    c.disconnect();
                    if ecdedup_core::control::request(
                        &self.dir,
                        &ecdedup_core::control::Request::Status,
                    )
                    .is_ok()
                    {
                        return Ok(());
                    }
                }
            }
            if Instant::now() > deadline {
                return Err(Error::Other(format!(
                    "`ecdedup serve` did not answer within {} s: {}",
                    SERVER_READY_TIMEOUT.as_secs(),
                    tail_of_file(&self.log, 2000)
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.socket.display())
    }

    /// SIGTERM, so the array closes cleanly; SIGKILL if it does not stop.
    pub fn stop(&mut self) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        signal(child.id(), libc::SIGTERM);
        match wait_timeout(&mut child, SERVER_STOP_TIMEOUT, false) {
            Some(st) if st.success() || st.code().is_none() => Ok(()),
            Some(st) => Err(Error::Other(format!(
                "the server exited with {st} on SIGTERM: {}",
                tail_of_file(&self.log, 2000)
            ))),
            None => {
                kill_and_reap(&mut child);
                Err(Error::Other(format!(
                    "the server did not stop within {} s of SIGTERM and was killed",
                    SERVER_STOP_TIMEOUT.as_secs()
                )))
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            eprintln!("ecdedup: warning: {e}");
        }
    }
}

// ---------------------------------------------------------------------------
// nbdfuse, loop device, mount

/// nbdfuse exposing the export as the file `MOUNTPOINT/nbd`.
pub struct Fuse {
    child: Option<Child>,
    pub mountpoint: PathBuf,
}

impl Fuse {
    pub fn start(mountpoint: &Path, uri: &str) -> Result<Fuse> {
        std::fs::create_dir_all(mountpoint)
            .map_err(|e| Error::io(format!("creating {}", mountpoint.display()), e))?;
        let pidfile = mountpoint.with_extension("pid");
        let log = mountpoint.with_extension("log");
        let _ = std::fs::remove_file(&pidfile);
        let logf =
            File::create(&log).map_err(|e| Error::io(format!("creating {}", log.display()), e))?;
        let logf2 = logf
            .try_clone()
            .map_err(|e| Error::io("duplicating a file handle", e))?;
        let child = Command::new("nbdfuse")
            .arg("-P")
            .arg(&pidfile)
            .arg(mountpoint)
            .arg(uri)
            .stdin(Stdio::null())
            .stdout(logf)
            .stderr(logf2)
            .process_group(0)
            .spawn()
            .map_err(|e| Error::io("starting nbdfuse", e))?;
        let mut fuse = Fuse {
            child: Some(child),
            mountpoint: mountpoint.to_owned(),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            check_interrupted()?;
            if pidfile.exists() && fuse.file().exists() {
                return Ok(fuse);
            }
            if let Ok(Some(st)) = fuse.child.as_mut().expect("running").try_wait() {
                fuse.child = None;
                return Err(Error::Other(format!(
                    "nbdfuse exited early ({st}): {}",
                    tail_of_file(&log, 2000)
                )));
            }
            if Instant::now() > deadline {
                return Err(Error::Other(format!(
                    "nbdfuse did not come up within 60 s: {}",
                    tail_of_file(&log, 2000)
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn file(&self) -> PathBuf {
        self.mountpoint.join("nbd")
    }

    pub fn stop(&mut self) {
        if self.child.is_some() && is_mounted(&self.mountpoint) {
            quiet(
                Command::new("fusermount3").arg("-u").arg(&self.mountpoint),
                STEP_TIMEOUT,
            );
        }
        if let Some(mut child) = self.child.take() {
            if wait_timeout(&mut child, Duration::from_secs(30), false).is_none() {
                kill_and_reap(&mut child);
            }
        }
        if is_mounted(&self.mountpoint) {
            quiet(
                Command::new("fusermount3")
                    .arg("-u")
                    .arg("-z")
                    .arg(&self.mountpoint),
                STEP_TIMEOUT,
            );
        }
        if is_mounted(&self.mountpoint) {
            quiet(
                Command::new("umount").arg("-l").arg(&self.mountpoint),
                STEP_TIMEOUT,
            );
        }
    }
}

impl Drop for Fuse {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A loop device over a file (buffered I/O, as the issue asks).
pub struct Loop {
    dev: Option<String>,
}

impl Loop {
    pub fn attach(file: &Path) -> Result<Loop> {
        let out = run_ok(
            Command::new("losetup")
                .arg("--find")
                .arg("--show")
                .arg("--direct-io=off")
                .arg(file),
            STEP_TIMEOUT,
        )?;
        let dev = out.stdout.trim().to_string();
        if !dev.starts_with("/dev/loop") {
            return Err(Error::Other(format!("losetup printed {dev:?}")));
        }
        Ok(Loop { dev: Some(dev) })
    }

    pub fn path(&self) -> &str {
        self.dev.as_deref().expect("attached")
    }

    /// Sectors written to the loop device so far (from sysfs), for progress.
    pub fn written_bytes(&self) -> Option<u64> {
        let name = self.dev.as_deref()?.strip_prefix("/dev/")?;
        let stat = std::fs::read_to_string(format!("/sys/block/{name}/stat")).ok()?;
        let sectors: u64 = stat.split_whitespace().nth(6)?.parse().ok()?;
        Some(sectors * 512)
    }

    pub fn detach(&mut self) -> Result<()> {
        if let Some(dev) = self.dev.take() {
            for _ in 0..20 {
                if quiet(Command::new("losetup").arg("-d").arg(&dev), STEP_TIMEOUT) {
                    return Ok(());
                }
                std::thread::sleep(Duration::from_millis(500));
            }
            return Err(Error::Other(format!("could not detach {dev}")));
        }
        Ok(())
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        if let Err(e) = self.detach() {
            eprintln!("ecdedup: warning: {e}");
        }
    }
}

/// A mounted ext4 (`Mount::new` mounts it).
pub struct Mount {
    target: Option<PathBuf>,
}

impl Mount {
    pub fn new(dev: &str, target: &Path) -> Result<Mount> {
        std::fs::create_dir_all(target)
            .map_err(|e| Error::io(format!("creating {}", target.display()), e))?;
        run_ok(
            Command::new("mount")
                .arg("-t")
                .arg("ext4")
                .arg(dev)
                .arg(target),
            STEP_TIMEOUT,
        )?;
        Ok(Mount {
            target: Some(target.to_owned()),
        })
    }

    pub fn path(&self) -> &Path {
        self.target.as_deref().expect("mounted")
    }

    /// Clean unmount (an error if it fails; Drop then falls back to lazy).
    pub fn unmount(&mut self) -> Result<()> {
        if let Some(t) = self.target.clone() {
            let mut last = None;
            for _ in 0..10 {
                match run_teardown(Command::new("umount").arg(&t), STEP_TIMEOUT).and_then(ok) {
                    Ok(_) => {
                        self.target = None;
                        return Ok(());
                    }
                    Err(e) => last = Some(e),
                }
                std::thread::sleep(Duration::from_millis(500));
            }
            return Err(last.expect("tried"));
        }
        Ok(())
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Some(t) = self.target.take() {
            if !quiet(Command::new("umount").arg(&t), STEP_TIMEOUT) && is_mounted(&t) {
                quiet(Command::new("umount").arg("-l").arg(&t), STEP_TIMEOUT);
            }
        }
    }
}
