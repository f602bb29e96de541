//! Silent corruption on the media: bytes flipped in device files while the
//! server is stopped must be detected by the block checksums, repaired from
//! the redundancy (on read, or by scrub), and never reach a client.

use crate::support;

use support::nbd;
use support::{
    assert_same_bytes, counter, flip_bytes, locate, pseudo_random, read_at, unit_block, TestArray,
    MIB,
};

const DATA_LEN: usize = 16 * MIB as usize;
/// Bytes of one stripe's data: 4 units of 32 KiB.
const STRIPE_DATA: u64 = 128 * 1024;

/// Creates an array and writes DATA_LEN random bytes at offset 0 (flushed,
/// server stopped cleanly). Returns the data.
fn array_with_data(seed: u64) -> (TestArray, Vec<u8>) {
    let a = TestArray::create("256M");
    let data = pseudo_random(seed, DATA_LEN);
    let server = a.serve();
    let mut c = server.client();
    c.write_all(0, &data).expect("write");
    c.flush().expect("flush");
    c.disconnect();
    server.stop();
    (a, data)
}

/// A place on the media: device, byte offset of a 4 KiB block.
#[derive(Clone, Copy, Debug)]
struct Target {
    device: usize,
    offset: u64,
}

/// The device block holding data unit `role` (0..4), block `b`, of
/// `stripe`; checks that it holds the bytes written there.
fn data_target(a: &TestArray, data: &[u8], stripe: u64, role: usize, b: u64) -> Target {
    let (device, offset) = unit_block(&a.geometry(), stripe, role, b);
    let vol = stripe * STRIPE_DATA + role as u64 * 32 * 1024 + b * 4096;
    let l = locate(&a.geometry(), vol);
    assert_eq!(
        (l.device, l.offset),
        (device, offset),
        "layout helpers disagree"
    );
    let on_media = read_at(&a.device(device), offset, 4096);
    assert_same_bytes(
        &format!("device {device} at {offset} (volume offset {vol}) should hold the data written there; has the layout changed?"),
        &on_media,
        &data[vol as usize..vol as usize + 4096],
    );
    Target { device, offset }
}

/// The device block holding parity unit `j` (0 or 1) of `stripe`, block `b`.
fn parity_target(a: &TestArray, stripe: u64, j: usize, b: u64) -> Target {
    let (device, offset) = unit_block(&a.geometry(), stripe, 4 + j, b);
    Target { device, offset }
}

fn corrupt(a: &TestArray, t: Target) -> Vec<u8> {
    let before = read_at(&a.device(t.device), t.offset, 4096);
    flip_bytes(&a.device(t.device), t.offset + 100, 8);
    flip_bytes(&a.device(t.device), t.offset + 3000, 1);
    assert_ne!(read_at(&a.device(t.device), t.offset, 4096), before);
    before
}

#[test]
fn corrupted_data_blocks_are_detected_and_repaired_on_read() {
    let (a, data) = array_with_data(1);
    // Two lone bad blocks, and a row with two bad units (still within m = 2).
    let targets = [
        data_target(&a, &data, 8, 2, 2),
        data_target(&a, &data, 10, 2, 5),
        data_target(&a, &data, 20, 0, 3),
        data_target(&a, &data, 20, 1, 3),
    ];
    let originals: Vec<Vec<u8>> = targets.iter().map(|&t| corrupt(&a, t)).collect();

    let server = a.serve();
    let mut c = server.client();
    let got = c.read_all(0, DATA_LEN).expect("read back");
    assert_same_bytes("data read back over corrupted media", &got, &data);
    let s = a.stats();
    // The two bad units of one row are found and repaired together.
    assert!(counter(&s, "checksum_mismatches") >= 3, "{s}");
    assert!(counter(&s, "repaired_blocks") >= 4, "{s}");
    assert!(counter(&s, "reconstructed_blocks") >= 3, "{s}");
    // Repaired for good: a second pass finds nothing new.
    let mismatches = counter(&s, "checksum_mismatches");
    let got = c.read_all(0, DATA_LEN).expect("read back again");
    assert_same_bytes("second read", &got, &data);
    assert_eq!(
        counter(&a.stats(), "checksum_mismatches"),
        mismatches,
        "repairs did not stick"
    );
    c.disconnect();
    server.stop();

    for (t, orig) in targets.iter().zip(&originals) {
        assert_same_bytes(
            &format!("repaired block {t:?} on the media"),
            &read_at(&a.device(t.device), t.offset, 4096),
            orig,
        );
    }
    a.scrub_check_clean();
}

#[test]
fn offline_scrub_finds_and_repairs_corruption() {
    let (a, data) = array_with_data(2);
    let targets = [
        data_target(&a, &data, 3, 1, 0),
        parity_target(&a, 12, 0, 0),
        parity_target(&a, 13, 1, 7),
    ];
    let originals: Vec<Vec<u8>> = targets.iter().map(|&t| corrupt(&a, t)).collect();
    let corrupted: Vec<Vec<u8>> = targets
        .iter()
        .map(|t| read_at(&a.device(t.device), t.offset, 4096))
        .collect();

    let check = a.cli(&["scrub", "--check-only"]).failed();
    let report = check.json();
    assert!(
        report["checksum_mismatches"].as_u64().unwrap() >= 3,
        "{check}"
    );
    assert_eq!(report["repaired_blocks"].as_u64(), Some(0), "{check}");
    // Check-only changes nothing.
    for (t, c) in targets.iter().zip(&corrupted) {
        assert_same_bytes(
            "media after scrub --check-only",
            &read_at(&a.device(t.device), t.offset, 4096),
            c,
        );
    }

    let repair = a.cli(&["scrub"]).ok();
    let report = repair.json();
    assert!(report["repaired_blocks"].as_u64().unwrap() >= 3, "{repair}");
    assert_eq!(report["unrecoverable_blocks"].as_u64(), Some(0), "{repair}");
    for (t, orig) in targets.iter().zip(&originals) {
        assert_same_bytes(
            &format!("block {t:?} after scrub"),
            &read_at(&a.device(t.device), t.offset, 4096),
            orig,
        );
    }
    a.scrub_check_clean();

    let server = a.serve();
    let mut c = server.client();
    assert_same_bytes("data after scrub", &c.read_all(0, DATA_LEN).unwrap(), &data);
    c.disconnect();
    server.stop();
}

#[test]
fn corrupted_parity_is_found_and_repaired_by_scrub_through_the_server() {
    let (a, data) = array_with_data(3);
    let t = parity_target(&a, 40, 1, 2);
    let orig = corrupt(&a, t);
    let server = a.serve();
    // Reads touch data units only: nothing to see yet.
    let mut c = server.client();
    assert_same_bytes("data", &c.read_all(0, DATA_LEN).unwrap(), &data);
    c.disconnect();
    a.cli(&["scrub"]).ok();
    server.stop();
    assert_same_bytes(
        "parity block after scrub",
        &read_at(&a.device(t.device), t.offset, 4096),
        &orig,
    );
    a.scrub_check_clean();
}

#[test]
fn scrub_check_only_through_the_server_exits_nonzero_on_corruption() {
    // `scrub --check-only` promises a non-zero exit when it finds checksum
    // or parity mismatches; that must hold when a server holds the array too.
    let (a, _data) = array_with_data(4);
    corrupt(&a, parity_target(&a, 50, 0, 1));
    let server = a.serve();
    let out = a.cli(&["scrub", "--check-only"]);
    assert!(
        !out.success(),
        "scrub --check-only through the server found a corrupt parity block but exited 0: {out}"
    );
    server.stop();
}

#[test]
fn reads_fail_cleanly_when_corruption_exceeds_the_parity() {
    let (a, data) = array_with_data(5);
    // Three bad units in one row of stripe 30: more than m = 2 can repair.
    let stripe = 30;
    corrupt(&a, data_target(&a, &data, stripe, 0, 0));
    corrupt(&a, data_target(&a, &data, stripe, 1, 0));
    corrupt(&a, parity_target(&a, stripe, 0, 0));
    let mut server = a.serve();
    let mut c = server.client();
    // Data units 0 and 1, block 0: both beyond repair.
    let bad = [stripe * STRIPE_DATA, stripe * STRIPE_DATA + 32 * 1024];
    for &off in &bad {
        match c.read(off, 4096) {
            Err(nbd::Error::Server(errno)) => assert_eq!(errno, libc::EIO as u32, "expected EIO"),
            Ok(_) => panic!("a block beyond repair was returned to the client instead of an error"),
            Err(e) => panic!(
                "expected an EIO reply, got {e:?}; log:\n{}",
                server.log_text()
            ),
        }
    }
    // The connection, and everything else on the volume, still work.
    let mut start = 0u64;
    for end in bad.iter().copied().chain([DATA_LEN as u64]) {
        let got = c
            .read_all(start, (end - start) as usize)
            .unwrap_or_else(|e| panic!("reading {start}..{end}: {e:?}"));
        assert_same_bytes(
            &format!("data {start}..{end}"),
            &got,
            &data[start as usize..end as usize],
        );
        start = end + 4096;
    }
    c.disconnect();
    assert!(
        server.is_running(),
        "the server must survive unrecoverable reads"
    );
    server.stop();
}

#[test]
fn scrub_exits_nonzero_when_blocks_are_unrecoverable() {
    let (a, data) = array_with_data(6);
    let stripe = 33;
    corrupt(&a, data_target(&a, &data, stripe, 2, 4));
    corrupt(&a, data_target(&a, &data, stripe, 3, 4));
    corrupt(&a, parity_target(&a, stripe, 1, 4));
    let out = a.cli(&["scrub"]);
    let report = out.json();
    assert!(
        report["unrecoverable_blocks"].as_u64().unwrap() >= 1,
        "{out}"
    );
    assert!(
        !out.success(),
        "scrub reported unrecoverable blocks but exited 0: {out}"
    );
}
