//! A real file system on the volume: ext4 through nbdfuse and a loop
//! device, a source tree unpacked from a tarball and compared, the server killed with
//! SIGKILL (after an unmount, and in the middle of writes), then e2fsck
//! must find the file system clean (after journal replay) and synced files
//! intact.
//!
//! Needs root, /dev/fuse and loop devices (as CI has).

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use support::fs::{
    count_files, diff_trees, fsck_clean, mkfs, require_fs_tools, sync_fs, Stack, COPY_TIMEOUT,
};
use support::{run_ok, Background, TestArray};

/// Copies a source tree that exists on every Debian build machine into
/// `dst`: this workspace's `crates/` and part of /usr/include (a few
/// thousand files, some tens of MiB). A snapshot, so concurrent edits of
/// the workspace cannot make the comparison flaky.
fn stage_tree(dst: &Path) -> usize {
    std::fs::create_dir_all(dst.join("include")).unwrap();
    run_ok(
        Command::new("cp")
            .arg("-a")
            .arg(support::workspace_root().join("crates"))
            .arg(dst.join("crates")),
        COPY_TIMEOUT,
    );
    let inc = Path::new("/usr/include");
    for d in [
        "linux",
        "asm-generic",
        "x86_64-linux-gnu",
        "c++",
        "sys",
        "netinet",
        "rpc",
        "scsi",
        "drm",
    ] {
        let p = inc.join(d);
        if p.is_dir() {
            run_ok(
                Command::new("cp")
                    .arg("-a")
                    .arg(&p)
                    .arg(dst.join("include").join(d)),
                COPY_TIMEOUT,
            );
        }
    }
    if let Ok(entries) = std::fs::read_dir(inc) {
        for e in entries.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "h") && p.is_file() {
                std::fs::copy(&p, dst.join("include").join(e.file_name())).unwrap();
            }
        }
    }
    let n = count_files(dst);
    assert!(
        n >= 1000,
        "only {n} files staged; is /usr/include (libc6-dev, linux-libc-dev) installed?"
    );
    n
}

fn dir(a: &TestArray, name: &str) -> PathBuf {
    let p = a.path(name);
    std::fs::create_dir_all(&p).unwrap();
    p
}

#[test]
fn ext4_stays_consistent_when_the_server_is_killed_after_unmount() {
    require_fs_tools();
    let a = TestArray::create("256M");
    let staged = dir(&a, "staged");
    let files = stage_tree(&staged);
    let server = a.serve();

    let mut stack = Stack::attach(a.tmp.path(), "fuse1", &server.uri());
    mkfs(stack.dev());
    let mnt = stack.mount_at(&a.path("mnt1"));
    // Unpacked from a tarball, as a user would install a source tree.
    let tarball = a.path("tree.tar");
    run_ok(
        Command::new("tar")
            .arg("-cf")
            .arg(&tarball)
            .arg("-C")
            .arg(&staged)
            .arg("."),
        COPY_TIMEOUT,
    );
    std::fs::create_dir_all(mnt.join("tree")).unwrap();
    run_ok(
        Command::new("tar")
            .arg("-xpf")
            .arg(&tarball)
            .arg("-C")
            .arg(mnt.join("tree")),
        COPY_TIMEOUT,
    );
    sync_fs(&mnt);
    diff_trees(&staged, &mnt.join("tree"));
    stack.close();
    eprintln!("unpacked {files} files onto ext4 over NBD");

    // No clean shutdown: no final flush, intent log left as it is.
    server.kill9();
    let server = a.serve();
    let mut stack = Stack::attach(a.tmp.path(), "fuse2", &server.uri());
    fsck_clean(stack.dev());
    let mnt = stack.mount_at(&a.path("mnt2"));
    diff_trees(&staged, &mnt.join("tree"));
    stack.close();
    server.stop();
    a.scrub_check_clean();
}

#[test]
fn ext4_recovers_when_the_server_is_killed_during_writes() {
    require_fs_tools();
    let a = TestArray::create("256M");
    let staged = dir(&a, "staged");
    stage_tree(&staged);
    let server = a.serve();

    let mut stack = Stack::attach(a.tmp.path(), "fuse1", &server.uri());
    mkfs(stack.dev());
    // commit=1: the journal commits (and ordered data goes out) every second.
    let mnt = stack.mount_with(&a.path("mnt1"), "commit=1");
    // A synced baseline that must survive whatever comes next.
    run_ok(
        Command::new("cp")
            .arg("-a")
            .arg(staged.join("crates"))
            .arg(mnt.join("base")),
        COPY_TIMEOUT,
    );
    sync_fs(&mnt);
    // Then a big copy, and a sync of it, killed in the middle.
    let copy = Background::spawn(
        Command::new("cp")
            .arg("-a")
            .arg(&staged)
            .arg(mnt.join("more")),
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    while count_files_lenient(&mnt.join("more")) < 800 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let sync = Background::spawn(Command::new("sync").arg("-f").arg(&mnt));
    std::thread::sleep(Duration::from_millis(150));
    let mut copy = copy;
    let mut sync = sync;
    let cp_running = copy.child.try_wait().unwrap().is_none();
    let sync_running = sync.child.try_wait().unwrap().is_none();
    server.kill9();
    eprintln!(
        "killed the server with {} files copied; cp {}, sync {}",
        count_files_lenient(&mnt.join("more")),
        if cp_running { "still running" } else { "done" },
        if sync_running {
            "still running"
        } else {
            "done"
        },
    );
    assert!(
        cp_running || sync_running,
        "the kill came after all writes were done; nothing was tested"
    );
    // nbdfuse goes first so that nothing waits on the dead server.
    stack.abandon();
    let _ = copy.wait(Duration::from_secs(60));
    let _ = sync.wait(Duration::from_secs(60));

    let server = a.serve();
    let mut stack = Stack::attach(a.tmp.path(), "fuse2", &server.uri());
    // Mount replays the journal; unmount; then the check.
    let mnt = stack.mount_at(&a.path("mnt2"));
    stack.mount.take().unwrap().unmount();
    fsck_clean(stack.dev());
    let mnt2 = stack.mount_at(&mnt);
    diff_trees(&staged.join("crates"), &mnt2.join("base"));
    stack.close();
    server.stop();
    a.scrub_check_clean();
}

fn count_files_lenient(dir: &Path) -> usize {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut n = 0;
    for e in rd.flatten() {
        match e.file_type() {
            Ok(t) if t.is_dir() => n += count_files_lenient(&e.path()),
            Ok(_) => n += 1,
            Err(_) => {}
        }
    }
    n
}

/// The file-system check can say no: a file system whose group descriptors
/// were zeroed must fail `fsck_clean`, so the clean checks above mean
/// something.
#[test]
fn fsck_rejects_a_damaged_file_system() {
    require_fs_tools();
    let tmp = tempfile::tempdir().unwrap();
    let img = tmp.path().join("damaged.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(32 << 20)
        .unwrap();
    let img_str = img.to_str().unwrap();
    mkfs(img_str);
    fsck_clean(img_str);
    // Block 1 holds the group descriptor table of a 4 KiB-block ext4.
    support::flip_bytes(&img, 4096, 4096);
    let caught = std::panic::catch_unwind(|| fsck_clean(img_str));
    assert!(caught.is_err(), "e2fsck -fn passed a damaged file system");
}
