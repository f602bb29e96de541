//! Images in and out through standard NBD clients: qemu-img and nbdcopy,
//! byte for byte, with several connections at once.

use crate::support;

use std::process::Command;
use support::{assert_same_bytes, pseudo_random, run_ok, TestArray, MIB, TOOL_TIMEOUT};

const VOLUME: u64 = 256 * MIB;

/// A 48 MiB raw image: random data with runs of zeroes (which copy tools
/// like to skip or turn into write-zeroes), odd-sized pieces included.
fn make_image(path: &std::path::Path) -> Vec<u8> {
    let len = 48 * MIB as usize;
    let mut img = pseudo_random(0xC0FFEE, len);
    for (start, n) in [
        (0, 64 << 10),
        (5 << 20, 3 << 20),
        (17 << 20, 12_288),
        (40 << 20, 8 << 20),
    ] {
        img[start..start + n].fill(0);
    }
    std::fs::write(path, &img).unwrap();
    img
}

fn read_prefix_and_check_rest_zero(path: &std::path::Path, want: &[u8]) {
    let got = std::fs::read(path).unwrap();
    assert_eq!(
        got.len() as u64,
        VOLUME,
        "exported image has the volume's size"
    );
    assert_same_bytes("image read back", &got[..want.len()], want);
    assert!(
        got[want.len()..].iter().all(|&b| b == 0),
        "bytes past the image must still be zero"
    );
}

#[test]
fn qemu_img_converts_an_image_in_and_out_unchanged() {
    support::require_tool("qemu-img");
    let a = TestArray::create("256M");
    let server = a.serve();
    let src = a.path("in.raw");
    let img = make_image(&src);
    run_ok(
        Command::new("qemu-img")
            .args(["convert", "-n", "-f", "raw", "-O", "raw"])
            .arg(&src)
            .arg(server.uri()),
        TOOL_TIMEOUT,
    );
    let out = a.path("out.raw");
    run_ok(
        Command::new("qemu-img")
            .args(["convert", "-f", "raw", "-O", "raw"])
            .arg(server.uri())
            .arg(&out),
        TOOL_TIMEOUT,
    );
    read_prefix_and_check_rest_zero(&out, &img);
    // qemu-img compare reads both through the block layer once more.
    let cmp = run_ok(
        Command::new("qemu-img")
            .args(["compare", "-f", "raw", "-F", "raw"])
            .arg(&src)
            .arg(server.uri()),
        TOOL_TIMEOUT,
    );
    assert!(cmp.stdout.contains("identical"), "{cmp}");
    server.stop();
    a.scrub_check_clean();
}

#[test]
fn nbdcopy_copies_an_image_in_and_out_with_four_connections() {
    support::require_tool("nbdcopy");
    let a = TestArray::create("256M");
    let server = a.serve();
    let src = a.path("in.raw");
    let img = make_image(&src);
    run_ok(
        Command::new("nbdcopy")
            .arg("--connections=4")
            .arg("--flush")
            .arg(&src)
            .arg(server.uri()),
        TOOL_TIMEOUT,
    );
    let out = a.path("out.raw");
    run_ok(
        Command::new("nbdcopy")
            .arg("--connections=4")
            .arg(server.uri())
            .arg(&out),
        TOOL_TIMEOUT,
    );
    read_prefix_and_check_rest_zero(&out, &img);
    // Once more after a clean restart: the data is on the media, not in a cache.
    server.stop();
    let server = a.serve();
    let out2 = a.path("out2.raw");
    run_ok(
        Command::new("nbdcopy").arg(server.uri()).arg(&out2),
        TOOL_TIMEOUT,
    );
    read_prefix_and_check_rest_zero(&out2, &img);
    server.stop();
    a.scrub_check_clean();
}

#[test]
fn nbdcopy_round_trips_an_image_while_a_device_is_failed() {
    support::require_tool("nbdcopy");
    let a = TestArray::create("256M");
    let server = a.serve();
    a.cli(&["fail", "3"]).ok();
    let src = a.path("in.raw");
    let img = make_image(&src);
    run_ok(
        Command::new("nbdcopy")
            .arg("--connections=4")
            .arg("--flush")
            .arg(&src)
            .arg(server.uri()),
        TOOL_TIMEOUT,
    );
    let out = a.path("out.raw");
    run_ok(
        Command::new("nbdcopy")
            .arg("--connections=4")
            .arg(server.uri())
            .arg(&out),
        TOOL_TIMEOUT,
    );
    read_prefix_and_check_rest_zero(&out, &img);
    server.stop();
}

/// A VM image in its usual container: qcow2 in (qemu-img decodes it and
/// writes the guest view to the volume), qcow2 out (read back from the
/// volume and encoded again); the guest bytes must match the original.
#[test]
fn qemu_img_converts_a_qcow2_image_in_and_out_unchanged() {
    support::require_tool("qemu-img");
    let a = TestArray::create("256M");
    let server = a.serve();
    let raw = a.path("guest.raw");
    let img = make_image(&raw);
    let qcow = a.path("guest.qcow2");
    run_ok(
        Command::new("qemu-img")
            .args(["convert", "-f", "raw", "-O", "qcow2"])
            .arg(&raw)
            .arg(&qcow),
        TOOL_TIMEOUT,
    );
    run_ok(
        Command::new("qemu-img")
            .args(["convert", "-n", "-f", "qcow2", "-O", "raw"])
            .arg(&qcow)
            .arg(server.uri()),
        TOOL_TIMEOUT,
    );
    let qcow_out = a.path("out.qcow2");
    run_ok(
        Command::new("qemu-img")
            .args(["convert", "-f", "raw", "-O", "qcow2"])
            .arg(server.uri())
            .arg(&qcow_out),
        TOOL_TIMEOUT,
    );
    let raw_out = a.path("out.raw");
    run_ok(
        Command::new("qemu-img")
            .args(["convert", "-f", "qcow2", "-O", "raw"])
            .arg(&qcow_out)
            .arg(&raw_out),
        TOOL_TIMEOUT,
    );
    read_prefix_and_check_rest_zero(&raw_out, &img);
    server.stop();
}
