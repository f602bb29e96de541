//! Bad input: impossible geometries, missing, foreign, swapped, short and
//! blank devices, a second server, out-of-range NBD requests and malformed
//! control requests. Each gets a clear error (and a non-zero exit where a
//! command is refused), and nothing that was written is lost.

use crate::support;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;
use support::nbd;
use support::{assert_same_bytes, counter, pseudo_random, TestArray, MIB};

const DATA_LEN: usize = 8 * MIB as usize;

/// An array with DATA_LEN random bytes at offset 0, server stopped cleanly.
fn array_with_data(seed: u64) -> (TestArray, Vec<u8>) {
    let a = TestArray::create("128M");
    let data = pseudo_random(seed, DATA_LEN);
    let server = a.serve();
    let mut c = server.client();
    c.write_all(0, &data).expect("write");
    c.flush().expect("flush");
    c.disconnect();
    server.stop();
    (a, data)
}

fn read_back(server: &support::Server, data: &[u8]) {
    let mut c = server.client();
    let got = c.read_all(0, data.len()).expect("read back");
    assert_same_bytes("data read back", &got, data);
    c.disconnect();
}

fn assert_mentions(out: &support::Out, words: &[&str]) {
    for w in words {
        assert!(out.stderr.contains(w), "expected {w:?} in the error: {out}");
    }
}

/// Every command given a folder that does not exist says it holds no
/// array (`status` said "opening DIR/lock: No such file or directory").
#[test]
fn commands_on_a_folder_that_does_not_exist_say_it_holds_no_array() {
    let a = TestArray::empty();
    let missing = a.dir.join("not-here");
    let missing = missing.to_str().unwrap();
    for cmd in [&["status"][..], &["scrub", "--check-only"], &["stats"]] {
        let out = support::run(
            std::process::Command::new(support::ecdedup_bin())
                .arg("--dir")
                .arg(missing)
                .args(cmd),
            support::CLI_TIMEOUT,
        )
        .failed();
        assert_mentions(&out, &["holds no array"]);
    }
}

// --- create ---------------------------------------------------------------

#[test]
fn create_refuses_more_units_than_devices() {
    let a = TestArray::empty();
    let out = a
        .cli(&[
            "create",
            "--devices",
            "5",
            "-k",
            "4",
            "-m",
            "2",
            "--size",
            "64M",
        ])
        .failed();
    assert_mentions(&out, &["at least 6 devices"]);
    assert!(
        !a.dir.join("array.json").exists(),
        "a refused create must not leave an array behind"
    );
}

#[test]
fn create_refuses_a_stripe_unit_that_is_not_a_power_of_two() {
    let a = TestArray::empty();
    let out = a
        .cli(&["create", "--stripe-unit", "3000", "--size", "64M"])
        .failed();
    assert_mentions(&out, &["power of two"]);
    assert!(!a.dir.join("array.json").exists());
}

#[test]
fn create_refuses_zero_parity_and_a_zero_size() {
    let a = TestArray::empty();
    let out = a
        .cli(&["create", "-m", "0", "--devices", "4", "--size", "64M"])
        .failed();
    assert_mentions(&out, &["m must be at least 1"]);
    let out = a.cli(&["create", "--size", "0"]).failed();
    assert!(out.stderr.contains("size"), "{out}");
    assert!(!a.dir.join("array.json").exists());
}

#[test]
fn create_refuses_to_overwrite_an_array() {
    let a = TestArray::create("64M");
    let out = a
        .cli(
            &support::create_args("64M")
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        )
        .failed();
    assert_mentions(&out, &["already holds an array"]);
}

#[test]
fn create_refuses_a_device_of_another_array() {
    let other = TestArray::create("64M");
    let a = TestArray::empty();
    let dev: Vec<String> = (0..6)
        .map(|i| a.path(&format!("d{i}")).display().to_string())
        .collect();
    std::fs::copy(other.device(0), &dev[0]).unwrap();
    let mut args = vec!["create", "-k", "4", "-m", "2", "--size", "64M"];
    for d in &dev {
        args.push("--device");
        args.push(d);
    }
    let out = a.cli(&args).failed();
    assert_mentions(&out, &["already belongs to array"]);
}

// --- devices at serve time ------------------------------------------------

#[test]
fn serve_runs_degraded_when_a_device_file_is_missing() {
    let (a, data) = array_with_data(11);
    std::fs::remove_file(a.device(2)).unwrap();
    let server = a.serve();
    let status = a.status();
    assert_eq!(status["devices"][2]["state"], "failed", "{status}");
    assert!(
        status["health"].as_str().unwrap().starts_with("degraded"),
        "{status}"
    );
    let warnings = status["warnings"].to_string();
    assert!(
        warnings.contains("dev2"),
        "the warning should name the missing device: {status}"
    );
    read_back(&server, &data);
    assert!(counter(&a.stats(), "reconstructed_blocks") > 0);
    server.stop();
}

#[test]
fn serve_refuses_when_three_device_files_are_missing() {
    let (a, _) = array_with_data(12);
    for i in [0, 3, 5] {
        std::fs::remove_file(a.device(i)).unwrap();
    }
    let err = match a.try_serve(&[]) {
        Ok(_) => panic!("a server came up with 3 of 6 devices missing under RS(4,2)"),
        Err(e) => e,
    };
    assert!(err.contains("3 of 6 devices"), "unclear refusal: {err}");
    let out = a.cli(&["status"]).failed();
    assert_mentions(&out, &["3 of 6 devices"]);
}

#[test]
fn a_device_of_the_wrong_size_is_treated_as_failed() {
    let (a, data) = array_with_data(13);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(a.device(4))
        .unwrap();
    let len = f.metadata().unwrap().len();
    f.set_len(len / 2).unwrap();
    drop(f);
    let server = a.serve();
    let status = a.status();
    assert_eq!(status["devices"][4]["state"], "failed", "{status}");
    assert!(
        status["warnings"].to_string().contains("bytes"),
        "the warning should give the sizes: {status}"
    );
    read_back(&server, &data);
    server.stop();
}

/// A device of another array where a member should be is left out as a
/// failed member, never written (the other array keeps its data), and
/// said so; the array serves degraded. Refused, it blocked every command,
/// `status` and `replace` included, until its file was moved away.
#[test]
fn a_device_from_another_array_is_left_out_untouched_and_the_array_serves_degraded() {
    let (a, data) = array_with_data(14);
    let other = TestArray::create("128M");
    std::fs::copy(other.device(1), a.device(1)).unwrap();
    let foreign = std::fs::read(a.device(1)).unwrap();
    let status = a.status();
    assert_eq!(status["devices"][1]["state"], "failed", "{status}");
    let warnings = status["warnings"].to_string();
    assert!(
        warnings.contains("dev1") && warnings.contains("another array"),
        "{status}"
    );
    let server = a.serve();
    read_back(&server, &data);
    server.stop();
    assert!(
        std::fs::read(a.device(1)).unwrap() == foreign,
        "the other array's device was written"
    );
    // Replacing it in place asks for the wipe first.
    let out = a
        .cli(&["replace", "1", "--device", a.device(1).to_str().unwrap()])
        .failed();
    assert_mentions(&out, &["another array", "wipe"]);
}

#[test]
fn swapped_devices_are_followed_by_their_superblocks() {
    let (a, data) = array_with_data(15);
    let tmp = a.path("swap");
    std::fs::rename(a.device(1), &tmp).unwrap();
    std::fs::rename(a.device(2), a.device(1)).unwrap();
    std::fs::rename(&tmp, a.device(2)).unwrap();
    // A stopped array's status only reports it (it changes no file) ...
    let out = a.cli(&["status"]).ok();
    assert!(out.stdout.contains("holds device 2"), "{out}");
    // ... and serving puts each device at the position its superblock names.
    let server = a
        .try_serve(&[])
        .expect("serves an array whose device paths moved");
    read_back(&server, &data);
    server.stop();
}

#[test]
fn a_device_with_both_superblocks_zeroed_is_treated_as_failed() {
    use std::os::unix::fs::FileExt;
    let (a, data) = array_with_data(16);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(a.device(3))
        .unwrap();
    f.write_all_at(&[0u8; 8192], 0).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let server = a.serve();
    assert!(
        server.log_text().contains("warning"),
        "the server should warn: {}",
        server.log_text()
    );
    let status = a.status();
    assert_eq!(status["devices"][3]["state"], "failed", "{status}");
    assert!(
        status["warnings"].to_string().contains("device 3"),
        "{status}"
    );
    read_back(&server, &data);
    // It stays out of service until replaced, and can be rebuilt.
    a.cli(&["replace", "3"]).ok();
    a.cli(&["rebuild"]).ok();
    assert_eq!(a.status()["health"], "healthy");
    read_back(&server, &data);
    server.stop();
    a.scrub_check_clean();
}

#[test]
fn serve_refuses_a_folder_without_an_array() {
    let a = TestArray::empty();
    std::fs::create_dir_all(&a.dir).unwrap();
    let out = a
        .cli(&["serve", "--socket", a.path("x.sock").to_str().unwrap()])
        .failed();
    assert_mentions(&out, &["no array"]);
}

// --- a second server --------------------------------------------------------

#[test]
fn a_second_serve_on_the_same_array_fails_and_the_first_keeps_serving() {
    let (a, data) = array_with_data(17);
    let mut first = a.serve();
    let second = a.try_serve(&[]);
    let err = match second {
        Ok(_) => panic!("a second server came up on the same array"),
        Err(e) => e,
    };
    assert!(
        err.contains("already being served") || err.contains("in use"),
        "unclear refusal: {err}"
    );
    assert!(first.is_running(), "the first server died");
    read_back(&first, &data);
    let mut c = first.client();
    c.write(0, &[7u8; 4096], true)
        .expect("the first server still takes writes");
    c.disconnect();
    first.stop();
}

// --- NBD requests out of range ------------------------------------------------

#[test]
fn out_of_range_requests_get_errors_and_lose_no_data() {
    let a = TestArray::create("64M");
    let mut server = a.serve();
    let mut c = server.client();
    let size = c.size;
    assert_eq!(size, 64 * MIB);
    let tail = pseudo_random(18, 64 * 1024);
    let tail_at = size - tail.len() as u64;
    c.write(tail_at, &tail, true).unwrap();

    let expect_error = |r: nbd::Result<Vec<u8>>, what: &str| match r {
        Err(nbd::Error::Server(e)) => assert_ne!(e, 0),
        other => panic!("{what}: expected an error reply, got {other:?}"),
    };
    expect_error(
        c.read(size - 4096, 8192).map(|_| vec![]),
        "read across the end",
    );
    expect_error(c.read(size, 4096).map(|_| vec![]), "read at the end");
    expect_error(
        c.read(u64::MAX - 4095, 4096).map(|_| vec![]),
        "read at 2^64 - 4096",
    );
    expect_error(
        c.write(size - 4096, &[0xEE; 8192], false).map(|_| vec![]),
        "write across the end",
    );
    expect_error(
        c.write(size, &[0xEE; 4096], true).map(|_| vec![]),
        "write at the end",
    );
    expect_error(
        c.write(u64::MAX - 4095, &[0xEE; 4096], false)
            .map(|_| vec![]),
        "write at 2^64 - 4096",
    );
    expect_error(
        c.write_zeroes(size - 4096, 8192, false).map(|_| vec![]),
        "write-zeroes across the end",
    );
    // Same connection, still in sync, data intact.
    assert_same_bytes(
        "tail after bad requests",
        &c.read(tail_at, tail.len()).unwrap(),
        &tail,
    );
    c.flush().unwrap();
    c.disconnect();
    assert!(server.is_running());
    server.stop();
    let server = a.serve();
    let mut c = server.client();
    assert_same_bytes(
        "tail after restart",
        &c.read(tail_at, tail.len()).unwrap(),
        &tail,
    );
    c.disconnect();
    server.stop();
    a.scrub_check_clean();
}

// --- control socket -----------------------------------------------------------

fn control_exchange(a: &TestArray, payload: &[u8]) -> Option<String> {
    let mut s = UnixStream::connect(a.dir.join("control.sock")).expect("control socket");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(60))).unwrap();
    if s.write_all(payload).is_err() {
        return None;
    }
    let mut line = String::new();
    match BufReader::new(&s).read_line(&mut line) {
        Ok(n) if n > 0 => Some(line),
        _ => None,
    }
}

#[test]
fn malformed_control_requests_get_errors_and_the_server_keeps_serving() {
    let (a, data) = array_with_data(19);
    let mut server = a.serve();
    for bad in [
        &b"this is not json\n"[..],
        b"{\"request\":\"explode\"}\n",
        b"{\"request\":\"fail\",\"position\":\"zero\"}\n",
        b"{\"request\":\"fail\",\"position\":99}\n",
        b"{\"request\":\"replace\",\"position\":0}\n",
        b"[1,2,3]\n",
        b"\n",
    ] {
        let answer = control_exchange(&a, bad)
            .unwrap_or_else(|| panic!("no answer to {:?}", String::from_utf8_lossy(bad)));
        let v: serde_json::Value = serde_json::from_str(&answer)
            .unwrap_or_else(|e| panic!("answer {answer:?} is not JSON: {e}"));
        assert_eq!(
            v["response"],
            "error",
            "request {:?} got {v}",
            String::from_utf8_lossy(bad)
        );
        assert!(
            !v["message"].as_str().unwrap_or("").is_empty(),
            "an error needs a message: {v}"
        );
    }
    // An oversized request: an error answer or a closed connection, nothing worse.
    let mut huge = vec![b'x'; 200 * 1024];
    huge.push(b'\n');
    if let Some(answer) = control_exchange(&a, &huge) {
        assert!(answer.contains("error"), "{answer}");
    }
    // A client that connects and leaves at once.
    drop(UnixStream::connect(a.dir.join("control.sock")).unwrap());

    assert!(
        server.is_running(),
        "the server died; log:\n{}",
        server.log_text()
    );
    let status = a.status();
    assert_eq!(
        status["health"], "healthy",
        "a malformed request changed the array: {status}"
    );
    read_back(&server, &data);
    server.stop();
}

// --- CLI misuse -----------------------------------------------------------------

#[test]
fn maintenance_commands_refuse_what_makes_no_sense() {
    let a = TestArray::create("64M");
    let server = a.serve();
    assert_mentions(
        &a.cli(&["fail", "9"]).failed(),
        &["no device at position 9"],
    );
    assert_mentions(&a.cli(&["replace", "0"]).failed(), &["in service"]);
    a.cli(&["fail", "0"]).ok();
    assert_mentions(&a.cli(&["fail", "0"]).failed(), &["already failed"]);
    // Replacing with a device of another array is refused.
    let other = TestArray::create("64M");
    let out = a
        .cli(&[
            "replace",
            "0",
            "--device",
            other.device(0).to_str().unwrap(),
        ])
        .failed();
    assert_mentions(&out, &["another array"]);
    // Replacing with another member of this array is refused.
    let out = a
        .cli(&["replace", "0", "--device", a.device(1).to_str().unwrap()])
        .failed();
    assert_mentions(&out, &["already device 1"]);
    assert_eq!(a.device_states()[1], "active");
    server.stop();
}

#[test]
fn rebuild_with_nothing_to_rebuild_fails_offline() {
    let a = TestArray::create("64M");
    assert_mentions(&a.cli(&["rebuild"]).failed(), &["no device is waiting"]);
}

#[test]
fn rebuild_with_nothing_to_rebuild_fails_through_the_server_instead_of_hanging() {
    let a = TestArray::create("64M");
    let server = a.serve();
    let out = support::run_timeout(&mut a.cli_command(&["rebuild"]), Duration::from_secs(60))
        .unwrap_or_else(|e| {
            panic!("`ecdedup rebuild` with nothing to rebuild hangs instead of failing: {e}")
        });
    assert!(
        !out.success(),
        "rebuild with nothing to rebuild must fail: {out}"
    );
    assert_mentions(&out, &["no device is waiting"]);
    server.stop();
}

#[test]
fn rebuild_through_the_server_reports_its_own_outcome_not_an_earlier_scrubs() {
    let a = TestArray::create("64M");
    let server = a.serve();
    // An online scrub leaves a finished operation behind...
    a.cli(&["scrub"]).ok();
    // ...which a later rebuild with nothing to rebuild must not pass off as its own success.
    let out = support::run_timeout(&mut a.cli_command(&["rebuild"]), Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("`ecdedup rebuild` hangs: {e}"));
    assert!(
        !out.success(),
        "rebuild with nothing to rebuild reported success: {out}"
    );
    // And a real rebuild after a scrub returns only once the array is healthy.
    a.cli(&["fail", "1"]).ok();
    a.cli(&["replace", "1"]).ok();
    a.cli(&["rebuild"]).ok();
    let status = a.status();
    assert_eq!(
        status["health"], "healthy",
        "`rebuild` returned before the rebuild finished: {status}"
    );
    server.stop();
}

/// Write-zeroes carries no data, so it is not bound by the 64 MiB data
/// request limit: one request may zero the whole volume (mkfs trims a device
/// this way), and it leaves zeroes; past the end it is still refused.
#[test]
fn write_zeroes_of_the_whole_volume_in_one_request_succeeds() {
    let a = TestArray::create("256M");
    let server = a.serve();
    let mut c = server.client();
    let size = c.size;
    let data = pseudo_random(77, 1 << 20);
    for at in [0, 100 * MIB, size - (1 << 20)] {
        c.write(at, &data, false).unwrap();
    }
    c.write_zeroes(0, size as u32, true)
        .expect("zeroing 256 MiB in one request");
    for at in [0, 100 * MIB, size - (1 << 20)] {
        let got = c.read(at, 1 << 20).unwrap();
        assert!(got.iter().all(|&b| b == 0), "zeroes expected at {at}");
    }
    match c.write_zeroes(4096, size as u32, false) {
        Err(nbd::Error::Server(e)) => assert_ne!(e, 0),
        other => panic!("zeroing past the end must fail, got {other:?}"),
    }
    c.disconnect();
    server.stop();
    a.scrub_check_clean();
}
