//! A real file system on the volume: nbdfuse exposes the export as a file,
//! a loop device turns it into a block device, ext4 goes on top.
//!
//! [`Stack`] owns all three and tears them down in every path, also after
//! the server was killed under them: each step runs with a timeout and falls
//! back to its lazy/forced variant (umount -l, fusermount3 -uz, SIGKILL of
//! nbdfuse by PID), so a test never leaves a mount or a loop device behind.

use super::{kill_and_reap, run_timeout, wait_timeout, Background};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const STEP_TIMEOUT: Duration = Duration::from_secs(60);
pub const COPY_TIMEOUT: Duration = Duration::from_secs(600);
const FSCK_TIMEOUT: Duration = Duration::from_secs(300);

fn is_mounted(target: &Path) -> bool {
    let Ok(target) = target.canonicalize() else {
        return false;
    };
    std::fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().nth(1).map(Path::new) == Some(target.as_path()))
}

fn quiet(cmd: &mut Command, timeout: Duration) -> bool {
    matches!(run_timeout(cmd, timeout), Ok(o) if o.success())
}

/// nbdfuse serving `URI` as `MOUNTPOINT/nbd`.
pub struct Fuse {
    proc: Option<Background>,
    pub mountpoint: PathBuf,
}

impl Fuse {
    pub fn start(mountpoint: &Path, uri: &str) -> Fuse {
        super::require_tool("nbdfuse");
        super::require_tool("fusermount3");
        std::fs::create_dir_all(mountpoint).unwrap();
        let pidfile = mountpoint.with_extension("pid");
        let _ = std::fs::remove_file(&pidfile);
        let proc = Background::spawn(
            Command::new("nbdfuse")
                .arg("-P")
                .arg(&pidfile)
                .arg(mountpoint)
                .arg(uri),
        );
        let mut fuse = Fuse {
            proc: Some(proc),
            mountpoint: mountpoint.to_owned(),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if pidfile.exists() && fuse.file().exists() {
                return fuse;
            }
            let p = fuse.proc.as_mut().unwrap();
            if let Ok(Some(st)) = p.child.try_wait() {
                let p = fuse.proc.take().unwrap();
                let out = p.wait(Duration::from_secs(1));
                panic!("nbdfuse exited early ({st}): {out:?}");
            }
            assert!(
                Instant::now() < deadline,
                "nbdfuse did not come up within 60 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn file(&self) -> PathBuf {
        self.mountpoint.join("nbd")
    }

    /// Kills nbdfuse at once (its server is gone); pending FUSE requests fail.
    pub fn kill(&mut self) {
        if let Some(mut p) = self.proc.take() {
            kill_and_reap(&mut p.child);
        }
    }

    pub fn teardown(&mut self) {
        if self.proc.is_some() && is_mounted(&self.mountpoint) {
            quiet(
                Command::new("fusermount3").arg("-u").arg(&self.mountpoint),
                STEP_TIMEOUT,
            );
        }
        if let Some(mut p) = self.proc.take() {
            if wait_timeout(&mut p.child, Duration::from_secs(20)).is_none() {
                kill_and_reap(&mut p.child);
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
        self.teardown();
    }
}

/// A loop device over a file.
pub struct Loop {
    pub dev: Option<String>,
}

impl Loop {
    pub fn attach(file: &Path) -> Loop {
        super::require_tool("losetup");
        let out = super::run_ok(
            Command::new("losetup")
                .arg("--find")
                .arg("--show")
                .arg(file),
            STEP_TIMEOUT,
        );
        let dev = out.stdout.trim().to_string();
        assert!(dev.starts_with("/dev/loop"), "losetup printed {dev:?}");
        Loop { dev: Some(dev) }
    }

    pub fn path(&self) -> &str {
        self.dev.as_deref().expect("attached")
    }

    pub fn detach(&mut self) {
        if let Some(dev) = self.dev.take() {
            for _ in 0..10 {
                if quiet(Command::new("losetup").arg("-d").arg(&dev), STEP_TIMEOUT) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(500));
            }
            eprintln!("warning: could not detach {dev}");
        }
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        self.detach();
    }
}

/// A mounted file system.
pub struct Mount {
    pub target: Option<PathBuf>,
}

impl Mount {
    pub fn new(dev: &str, target: &Path, options: &str) -> Mount {
        std::fs::create_dir_all(target).unwrap();
        let mut cmd = Command::new("mount");
        cmd.arg("-t").arg("ext4");
        if !options.is_empty() {
            cmd.arg("-o").arg(options);
        }
        super::run_ok(cmd.arg(dev).arg(target), STEP_TIMEOUT);
        Mount {
            target: Some(target.to_owned()),
        }
    }

    pub fn path(&self) -> &Path {
        self.target.as_deref().expect("mounted")
    }

    /// Clean unmount; panics if it fails (the test wants to know).
    pub fn unmount(&mut self) {
        if let Some(t) = self.target.take() {
            super::run_ok(Command::new("umount").arg(&t), STEP_TIMEOUT);
        }
    }

    /// Best effort: umount, else lazy umount.
    pub fn teardown(&mut self) {
        if let Some(t) = self.target.take() {
            if !quiet(Command::new("umount").arg(&t), STEP_TIMEOUT) && is_mounted(&t) {
                quiet(Command::new("umount").arg("-l").arg(&t), STEP_TIMEOUT);
            }
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// nbdfuse + loop device (+ optional mount), torn down in reverse order.
pub struct Stack {
    pub mount: Option<Mount>,
    pub lo: Option<Loop>,
    pub fuse: Option<Fuse>,
}

impl Stack {
    /// nbdfuse at `base/fuseN`, a loop device on its file.
    pub fn attach(base: &Path, name: &str, uri: &str) -> Stack {
        let fuse = Fuse::start(&base.join(name), uri);
        let lo = Loop::attach(&fuse.file());
        Stack {
            mount: None,
            lo: Some(lo),
            fuse: Some(fuse),
        }
    }

    pub fn dev(&self) -> &str {
        self.lo.as_ref().unwrap().path()
    }

    pub fn mount_at(&mut self, target: &Path) -> PathBuf {
        self.mount_with(target, "")
    }

    /// Mounts ext4 with `mount -o OPTIONS` (none if empty).
    pub fn mount_with(&mut self, target: &Path, options: &str) -> PathBuf {
        let m = Mount::new(self.dev(), target, options);
        let p = m.path().to_owned();
        self.mount = Some(m);
        p
    }

    /// Clean teardown, failing loudly if the unmount fails.
    pub fn close(mut self) {
        if let Some(mut m) = self.mount.take() {
            m.unmount();
        }
        if let Some(mut l) = self.lo.take() {
            l.detach();
        }
        if let Some(mut f) = self.fuse.take() {
            f.teardown();
        }
    }

    /// Teardown after the server died underneath: nbdfuse first, so every
    /// pending and future request fails fast instead of waiting.
    pub fn abandon(mut self) {
        if let Some(f) = self.fuse.as_mut() {
            f.kill();
        }
        if let Some(mut m) = self.mount.take() {
            m.teardown();
        }
        if let Some(mut l) = self.lo.take() {
            l.detach();
        }
        if let Some(mut f) = self.fuse.take() {
            f.teardown();
        }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        if let Some(mut m) = self.mount.take() {
            m.teardown();
        }
        if let Some(mut l) = self.lo.take() {
            l.detach();
        }
        if let Some(mut f) = self.fuse.take() {
            f.teardown();
        }
    }
}

/// Files (not folders) under `dir`, recursively.
pub fn count_files(dir: &Path) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let t = e.file_type().unwrap();
        if t.is_dir() {
            n += count_files(&e.path());
        } else {
            n += 1;
        }
    }
    n
}

/// `diff -r` of two trees; panics with the difference.
pub fn diff_trees(a: &Path, b: &Path) {
    let out = super::run(
        Command::new("diff")
            .arg("-r")
            .arg("--no-dereference")
            .arg(a)
            .arg(b),
        COPY_TIMEOUT,
    );
    assert!(out.success(), "trees differ: {out}");
}

/// ext4 on `dev`, its inode tables and journal written now.
pub fn mkfs(dev: &str) {
    super::run_ok(
        Command::new("mkfs.ext4")
            .args([
                "-q",
                "-F",
                "-b",
                "4096",
                "-E",
                "lazy_itable_init=0,lazy_journal_init=0",
            ])
            .arg(dev),
        FSCK_TIMEOUT,
    );
}

/// `e2fsck -fn`: panics unless the file system is clean.
pub fn fsck_clean(dev: &str) {
    let out = super::run(Command::new("e2fsck").arg("-fn").arg(dev), FSCK_TIMEOUT);
    assert!(out.success(), "e2fsck -fn found problems: {out}");
}

/// `sync -f` of the file system mounted at `mnt`.
pub fn sync_fs(mnt: &Path) {
    super::run_ok(Command::new("sync").arg("-f").arg(mnt), COPY_TIMEOUT);
}

/// The tools, /dev/fuse and loop devices a file-system test needs.
pub fn require_fs_tools() {
    for t in [
        "nbdfuse",
        "fusermount3",
        "losetup",
        "mkfs.ext4",
        "e2fsck",
        "mount",
        "umount",
        "diff",
        "cp",
        "tar",
        "sync",
    ] {
        super::require_tool(t);
    }
    assert!(Path::new("/dev/fuse").exists(), "/dev/fuse is missing");
    assert!(
        Path::new("/dev/loop-control").exists(),
        "loop devices are missing"
    );
}
