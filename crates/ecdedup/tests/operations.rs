//! Operating ecdedup: a command whose stdout closes early, a bug in the
//! data path, a restart right after kill -9, a stop while a client idles,
//! and inspecting a stopped array. Each test tells one such story and checks
//! how it ends: quietly, by a fail-stop, by waiting, cleanly, read-only.

use crate::support;

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::{assert_same_bytes, pseudo_random, Background, TestArray, MIB};

/// How long a helper may take to reach the state a test waits for.
const SETUP_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs `ecdedup ARGS` with its stdout the write end of a pipe whose read
/// end is already closed; returns the exit status and stderr.
fn run_into_closed_pipe(a: &TestArray, args: &[&str]) -> (std::process::ExitStatus, String) {
    use std::os::fd::FromRawFd;
    let mut fds = [0i32; 2];
    // SAFETY: pipe(2) into a two-element array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
    // SAFETY: both descriptors were just returned by pipe(2) and are ours.
    let (read_end, write_end) = unsafe {
        (
            std::fs::File::from_raw_fd(fds[0]),
            std::fs::File::from_raw_fd(fds[1]),
        )
    };
    drop(read_end);
    let stderr = tempfile::NamedTempFile::new().expect("temp file");
    let mut child = a
        .cli_command(args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(write_end))
        .stderr(Stdio::from(stderr.reopen().expect("reopen")))
        .spawn()
        .expect("spawn ecdedup");
    let status = support::wait_timeout(&mut child, support::CLI_TIMEOUT).unwrap_or_else(|| {
        support::kill_and_reap(&mut child);
        panic!("`ecdedup {args:?}` did not finish with a closed stdout");
    });
    (
        status,
        std::fs::read_to_string(stderr.path()).unwrap_or_default(),
    )
}

#[test]
fn a_closed_stdout_ends_a_command_quietly_like_other_unix_tools() {
    let a = TestArray::create("64M");
    for args in [
        &["status"][..],
        &["status", "--json"],
        &["stats"],
        &["--help"],
    ] {
        let (status, stderr) = run_into_closed_pipe(&a, args);
        assert!(
            !stderr.contains("panicked"),
            "`ecdedup {args:?}` panicked on a closed stdout: {stderr}"
        );
        assert!(
            status.success() || status.signal() == Some(libc::SIGPIPE),
            "`ecdedup {args:?}` must end as `cat` does on a closed pipe (SIGPIPE), not {status}: {stderr}"
        );
    }
}

#[test]
fn a_panic_in_a_write_stops_the_server_and_a_restart_recovers() {
    let a = TestArray::create("64M");
    let data = pseudo_random(41, 4 * MIB as usize);
    let fault_at = 32 * MIB;
    let mut server = a
        .try_serve_with_env(
            &[],
            &[(
                ecdedup::volume::FAULT_PANIC_ON_WRITE_ENV,
                &fault_at.to_string(),
            )],
        )
        .unwrap_or_else(|e| panic!("{e}"));
    let mut client = server.client();
    client.write_all(0, &data).expect("write");
    client.flush().expect("flush");
    assert!(
        client.write(fault_at, &[0x5a; 4096], false).is_err(),
        "the write that panicked must not be acknowledged"
    );
    let Some(status) = server.wait_exit(support::SERVER_STOP_TIMEOUT) else {
        panic!(
            "after a panic in a write the server must stop (abort), not serve on; log:\n{}",
            server.log_text()
        );
    };
    assert_eq!(
        status.signal(),
        Some(libc::SIGABRT),
        "the server must abort; log:\n{}",
        server.log_text()
    );
    assert!(
        server.log_text().contains("recovery"),
        "the log must say what happens next: {}",
        server.log_text()
    );
    drop(client);

    restart_and_read_back(&a, &data, "data flushed before the panic");
    a.scrub_check_clean();
}

#[test]
fn serve_waits_for_the_folder_lock_of_a_holder_that_is_going_away() {
    let a = TestArray::create("64M");
    let held = a.path("held");
    // flock(1) holds the folder lock for a moment and answers on no control
    // socket: what a server killed with -9 looks like while the kernel
    // tears it down.
    let holder = Background::spawn(
        Command::new("flock")
            .arg(a.dir.join(ecdedup::array::LOCK_FILE))
            .arg("sh")
            .arg("-c")
            .arg(format!("touch '{}' && sleep 2", held.display())),
    );
    wait_for_file(&held);
    let server = a
        .try_serve(&[])
        .unwrap_or_else(|e| panic!("serve must wait for a lock that nobody serves from: {e}"));
    holder.wait(SETUP_TIMEOUT).expect("flock ends").ok();
    server.stop();
}

#[test]
fn a_server_restarted_right_after_kill_9_comes_up_every_time() {
    let a = TestArray::create("64M");
    let mut server = a.serve();
    for round in 0..5u64 {
        let mut client = server.client();
        client
            .write(round * MIB, &pseudo_random(round, 64 << 10), false)
            .expect("write");
        drop(client);
        // No wait for the old process to be reaped: the restart races its
        // teardown, as a supervisor's restart does.
        support::signal(server.pid(), libc::SIGKILL);
        let next = a
            .try_serve(&[])
            .unwrap_or_else(|e| panic!("round {round}: restart after kill -9 refused: {e}"));
        server.kill9();
        server = next;
    }
    server.stop();
    a.scrub_check_clean();
}

#[test]
fn sigterm_stops_the_server_cleanly_while_an_idle_client_stays_connected() {
    let a = TestArray::create("64M");
    let data = pseudo_random(43, 2 * MIB as usize);
    let server = a.serve();
    let mut idle = server.client();
    // Written, never flushed by the client: the stop must flush it.
    idle.write_all(0, &data).expect("write");
    // `stop` sends SIGTERM and requires a clean exit within its bound,
    // while `idle` stays connected without a word.
    server.stop();
    drop(idle);
    assert_eq!(
        a.status()["dirty_regions"].as_u64(),
        Some(0),
        "a clean stop leaves no dirty intent region"
    );
    restart_and_read_back(&a, &data, "data written before SIGTERM");
}

#[test]
fn status_and_stats_of_a_killed_array_change_no_file_and_run_no_recovery() {
    let a = TestArray::create_64m_small_regions(&["--write-policy", "plog"]);
    let data = pseudo_random(47, 3 * MIB as usize);
    let server = a.serve();
    let mut client = server.client();
    client.write_all(0, &data).expect("write");
    client.write(40 * MIB, &[7u8; 4096], false).expect("write");
    server.kill9();
    drop(client);

    let before = file_fingerprints(&a.dir);
    let status = a.status();
    let text = a.cli(&["status"]).ok();
    let stats = a.cli(&["stats"]).ok();
    let prometheus = a.cli(&["stats", "--prometheus"]).ok();
    assert_eq!(
        file_fingerprints(&a.dir),
        before,
        "status and stats of a stopped array must not write any file\n{text}\n{stats}\n{prometheus}"
    );
    assert!(
        status["dirty_regions"].as_u64().unwrap_or(0) > 0,
        "the crash left dirty regions, and status must show them, not resync them: {status}"
    );
    assert!(text.stdout.contains("dirty intent regions:"), "{text}");
    // The next open still finds the crash and recovers from it.
    restart_and_read_back(&a, &data, "data written before the kill");
    a.scrub_check_clean();
}

/// Length, CRC32C and modification time of every regular file below
/// `dir`, by path.
fn file_fingerprints(dir: &Path) -> std::collections::BTreeMap<std::path::PathBuf, String> {
    let mut out = std::collections::BTreeMap::new();
    let mut folders = vec![dir.to_owned()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).expect("read_dir").flatten() {
            let meta = entry.metadata().expect("metadata");
            if meta.is_dir() {
                folders.push(entry.path());
            } else if meta.is_file() {
                let bytes = std::fs::read(entry.path()).expect("read");
                out.insert(
                    entry.path(),
                    format!(
                        "{} bytes, crc32c {:08x}, modified {:?}",
                        meta.len(),
                        crc32c::crc32c(&bytes),
                        meta.modified().expect("mtime")
                    ),
                );
            }
        }
    }
    out
}

/// Serves the array again, requires `data` at offset 0, stops cleanly.
fn restart_and_read_back(a: &TestArray, data: &[u8], what: &str) {
    let server = a.serve();
    let mut client = server.client();
    let back = client.read_all(0, data.len()).expect("read after restart");
    assert_same_bytes(what, &back, data);
    client.disconnect();
    server.stop();
}

fn wait_for_file(path: &Path) {
    let deadline = Instant::now() + SETUP_TIMEOUT;
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} did not appear within {SETUP_TIMEOUT:?}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
