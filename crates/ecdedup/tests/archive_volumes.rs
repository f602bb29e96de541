//! Volumes into the archive (issue 12, item 1): `archive put --nbd URI`
//! from a running server, `archive put --array DIR` from a stopped array,
//! `put -` from standard input, and what a failing source leaves (nothing),
//! plus `--fingerprint-backend` on the command line.

use crate::support;

use std::path::Path;
use std::process::{Command, Stdio};
use support::{
    assert_same_bytes, ecdedup_bin, pseudo_random, run, run_ok, Out, TestArray, CLI_TIMEOUT, MIB,
    TOOL_TIMEOUT,
};

const VOLUME: u64 = 32 * MIB;

fn archive_command(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(ecdedup_bin());
    c.arg("--dir").arg(dir).arg("archive").args(args);
    c
}

fn archive(dir: &Path, args: &[&str]) -> Out {
    run(&mut archive_command(dir, args), CLI_TIMEOUT)
}

/// RS(3,2) over 5 folders, 6 MiB containers of 8 KiB blocks.
fn create_archive(dir: &Path) {
    archive(
        dir,
        &[
            "create",
            "--devices",
            "5",
            "-k",
            "3",
            "-m",
            "2",
            "--container",
            "6M",
        ],
    )
    .ok();
}

fn get(dir: &Path, name: &str, out: &Path) -> Vec<u8> {
    archive(dir, &["get", name, "-o", out.to_str().unwrap()]).ok();
    std::fs::read(out).unwrap()
}

fn ls(dir: &Path) -> serde_json::Value {
    archive(dir, &["ls", "--json"]).ok().json()
}

/// The volume's bytes: `image` at offset 0, zeroes after it.
fn volume_bytes(image: &[u8]) -> Vec<u8> {
    let mut v = image.to_vec();
    v.resize(VOLUME as usize, 0);
    v
}

#[test]
fn a_served_volume_and_then_the_stopped_array_archive_bit_exact() {
    support::require_tool("nbdcopy");
    let a = TestArray::create("32M");
    let arc = a.path("archive");
    create_archive(&arc);
    // 10 MiB of random bytes, written twice: the second copy is redundant.
    let half = pseudo_random(0xA1C4, 10 * MIB as usize);
    let mut image = half.clone();
    image.extend_from_slice(&half);
    let src = a.path("image.raw");
    std::fs::write(&src, &image).unwrap();
    let server = a.serve();
    run_ok(
        Command::new("nbdcopy").arg(&src).arg(server.uri()),
        TOOL_TIMEOUT,
    );
    let put = archive(&arc, &["put", "--nbd", &server.uri(), "--name", "live"]).ok();
    assert!(put.stdout.contains("put live: 33554432 bytes"), "{put}");

    // A served array cannot be opened offline: a clear error, nothing put.
    let busy = archive(&arc, &["put", "--array", a.dir.to_str().unwrap()]).failed();
    assert!(busy.stderr.contains("is being served"), "{busy}");
    assert_eq!(ls(&arc).as_array().unwrap().len(), 1);
    server.stop();

    // The stopped array, read offline; named after its folder.
    let put = archive(&arc, &["put", "--array", a.dir.to_str().unwrap()]).ok();
    assert!(put.stdout.contains("put array: 33554432 bytes"), "{put}");
    archive(&arc, &["seal"]).ok();

    let want = volume_bytes(&image);
    assert_same_bytes("live", &get(&arc, "live", &a.path("live.out")), &want);
    assert_same_bytes("array", &get(&arc, "array", &a.path("array.out")), &want);
    let list = ls(&arc);
    let redundant = |name: &str| {
        list.as_array()
            .unwrap()
            .iter()
            .find(|o| o["name"] == name)
            .unwrap_or_else(|| panic!("{name} not in {list}"))["redundant_blocks"]
            .as_u64()
            .unwrap()
    };
    // Blocks of 8 KiB: the second random copy (1280 blocks) and all but
    // one of the 12 MiB of zeroes are redundant in `live`; `array` is all
    // redundant.
    assert!(redundant("live") >= 1280 + 1535, "{list}");
    assert_eq!(redundant("array"), VOLUME / 8192, "{list}");
    archive(&arc, &["scrub"]).ok();
}

#[test]
fn a_source_that_fails_leaves_nothing_and_the_archive_goes_on() {
    support::require_tool("nbdkit");
    support::require_tool("nbdcopy");
    let tmp = tempfile::tempdir().unwrap();
    let arc = tmp.path().join("archive");
    create_archive(&arc);

    // Nothing answers at the URI.
    let nowhere = format!(
        "nbd+unix:///?socket={}",
        tmp.path().join("none.sock").display()
    );
    let out = archive(&arc, &["put", "--nbd", &nowhere, "--name", "x"]).failed();
    assert!(out.stderr.contains("no NBD export at"), "{out}");

    // An export whose reads fail (nbdkit's error filter): nbdcopy fails
    // partway, so put fails before it commits.
    let socket = tmp.path().join("err.sock");
    let mut server = Command::new("nbdkit")
        .args(["--foreground", "--exit-with-parent", "-U"])
        .arg(&socket)
        .args([
            "--filter=error",
            "pattern",
            "16M",
            "error-pread=EIO",
            "error-pread-rate=100%",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("nbdkit");
    let uri = format!("nbd+unix:///?socket={}", socket.display());
    let deadline = std::time::Instant::now() + support::SERVER_READY_TIMEOUT;
    while run(Command::new("nbdinfo").args(["--size", &uri]), TOOL_TIMEOUT)
        .stdout
        .trim()
        != "16777216"
    {
        assert!(
            std::time::Instant::now() < deadline,
            "nbdkit never answered"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let out = archive(&arc, &["put", "--nbd", &uri, "--name", "bad"]).failed();
    assert!(out.stderr.contains("nbdcopy"), "{out}");
    support::kill_and_reap(&mut server);
    assert_eq!(ls(&arc), serde_json::json!([]));

    // The archive is whole and takes the next object; standard input
    // needs a name.
    let data = pseudo_random(7, 3 * MIB as usize);
    let mut put = archive_command(&arc, &["put", "-"]);
    let unnamed = support::run_with_input(&mut put, &data, CLI_TIMEOUT).failed();
    assert!(unnamed.stderr.contains("--name"), "{unnamed}");
    let mut put = archive_command(&arc, &["put", "-", "--name", "stdin"]);
    support::run_with_input(&mut put, &data, CLI_TIMEOUT).ok();
    assert_same_bytes("stdin", &get(&arc, "stdin", &tmp.path().join("o")), &data);
    archive(&arc, &["scrub"]).ok();
}

#[test]
fn the_fingerprint_backend_is_chosen_on_the_command_line() {
    let tmp = tempfile::tempdir().unwrap();
    let arc = tmp.path().join("archive");
    create_archive(&arc);
    let file = tmp.path().join("f");
    std::fs::write(&file, pseudo_random(3, MIB as usize)).unwrap();
    let f = file.to_str().unwrap();
    let out = archive(&arc, &["--fingerprint-backend", "auto", "put", f]).ok();
    assert!(
        out.stderr.contains("archive fingerprints: auto:"),
        "auto says what it chose: {out}"
    );
    let out = archive(
        &arc,
        &["--fingerprint-backend", "tpu", "put", f, "--name", "g"],
    )
    .failed();
    assert!(out.stderr.contains("expected cpu, gpu or auto"), "{out}");
    // `gpu` hashes on a GPU or refuses to start; never silently the CPU.
    let out = archive(
        &arc,
        &["--fingerprint-backend", "gpu", "put", f, "--name", "g"],
    );
    if out.success() {
        assert!(out.stderr.contains("gpu: chosen by configuration"), "{out}");
    } else {
        assert!(out.stderr.contains("cannot run"), "{out}");
        assert_eq!(ls(&arc).as_array().unwrap().len(), 1);
    }
}

/// A missing copy of the folder's metadata on a device is damage to the
/// command line: `scrub` fails and says to repair; `--repair` fixes it.
#[test]
fn scrub_fails_on_a_missing_metadata_copy_until_repaired() {
    let tmp = tempfile::tempdir().unwrap();
    let arc = tmp.path().join("archive");
    create_archive(&arc);
    let file = tmp.path().join("f");
    std::fs::write(&file, pseudo_random(5, 7 * MIB as usize)).unwrap();
    archive(&arc, &["put", file.to_str().unwrap()]).ok();
    archive(&arc, &["seal"]).ok();
    archive(&arc, &["scrub"]).ok();
    std::fs::remove_file(arc.join("dev0").join("archive.json")).unwrap();
    let found = archive(&arc, &["scrub"]).failed();
    assert!(found.stderr.contains("--repair"), "{found}");
    assert_eq!(found.json()["bad_metadata_copies"], 1, "{found}");
    archive(&arc, &["scrub", "--repair"]).ok();
    let clean = archive(&arc, &["scrub"]).ok();
    assert_eq!(clean.json()["bad_metadata_copies"], 0, "{clean}");
}
