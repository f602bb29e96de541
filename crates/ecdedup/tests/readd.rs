//! Devices that come back: a member whose failure was transient is
//! re-added with the data it still holds, and an array with more than m
//! members marked failed is assembled by force from those whose data is
//! still there. Each story ends with the data read back through the
//! members that came back (the others failed on purpose) and a clean scrub.

use crate::support;

use ecdedup::array::layout::SUPERBLOCK_BYTES;
use ecdedup::array::superblock::{MemberState, Superblock};
use support::{assert_same_bytes, pseudo_random, TestArray, MIB};

/// Volume offsets and contents written before and after devices left.
struct Written {
    before: Vec<u8>,
    after: Vec<u8>,
}

const BEFORE_AT: u64 = 0;
const AFTER_AT: u64 = 16 * MIB;

/// RS(4,2), 64 MiB (512 stripes), 4 MiB intent regions (32 stripes each).
fn array() -> TestArray {
    TestArray::create_64m_small_regions(&[])
}

/// Writes `before`, fails `positions` through the server, writes `after`
/// (which the failed devices miss), stops cleanly.
fn write_around_failures(a: &TestArray, positions: &[usize]) -> Written {
    let w = Written {
        before: pseudo_random(61, 8 * MIB as usize),
        after: pseudo_random(62, 4 * MIB as usize),
    };
    let server = a.serve();
    let mut client = server.client();
    client.write_all(BEFORE_AT, &w.before).expect("write");
    client.flush().expect("flush");
    for p in positions {
        a.cli(&["fail", &p.to_string()]).ok();
    }
    client.write_all(AFTER_AT, &w.after).expect("write");
    client.flush().expect("flush");
    client.disconnect();
    server.stop();
    w
}

/// Serves with `failed` taken out, so every read decodes through the other
/// members, and requires both writes back.
fn read_back_without(a: &TestArray, failed: &[usize], w: &Written) {
    let server = a.serve();
    for p in failed {
        a.cli(&["fail", &p.to_string()]).ok();
    }
    let mut client = server.client();
    let before = client.read_all(BEFORE_AT, w.before.len()).expect("read");
    assert_same_bytes("written before the failures", &before, &w.before);
    let after = client.read_all(AFTER_AT, w.after.len()).expect("read");
    assert_same_bytes("written while devices were out", &after, &w.after);
    client.disconnect();
    server.stop();
}

/// Stripe units `re-add` says it reconstructed.
fn units_reconstructed(out: &support::Out) -> u64 {
    out.stdout
        .split("re-added: ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("re-add does not say what it reconstructed: {out}"))
}

#[test]
fn re_add_brings_back_a_transiently_failed_device_resyncing_only_what_it_missed() {
    let a = array();
    let w = write_around_failures(&a, &[2]);
    assert_eq!(a.device_states()[2], "failed");
    let missed = a.status()["missed_regions"].as_u64();
    assert!(
        matches!(missed, Some(1..=3)),
        "status must show the regions device 2 missed: {missed:?}"
    );

    let out = a.cli(&["re-add", "2"]).ok();
    let units = units_reconstructed(&out);
    // `after` covers one region (32 stripes); the regions of `before` may
    // still have been dirty when device 2 left (5 s of quiet clear them).
    assert!(
        (32..=96).contains(&units),
        "re-add must reconstruct what device 2 missed and little else (of 512 stripes): {out}"
    );
    assert_eq!(a.status()["health"], "healthy");
    assert!(
        !a.dir.join(ecdedup::array::MISSED_FILE).exists() && a.status()["missed_regions"].is_null(),
        "with no device failed the missed map is gone"
    );
    a.scrub_check_clean();
    read_back_without(&a, &[0, 1], &w);
}

#[test]
fn assemble_force_brings_back_the_freshest_failed_devices_and_re_add_the_rest() {
    let a = array();
    let w = write_around_failures(&a, &[1, 4]);
    // Then device 3 drops out as well: the survivors' superblocks mark it
    // failed; its data stays as it was (it missed nothing: no write can
    // complete with three of six out).
    mark_failed_on(&a, 3, &[0, 2, 5]);
    let refused = a.cli(&["status"]).failed();
    assert!(refused.stderr.contains("3 of 6"), "{refused}");
    assert!(a.try_serve(&[]).is_err(), "served with 3 of 6 failed");

    let out = a.cli(&["assemble", "--force"]).ok();
    assert!(out.stdout.contains("device(s) 3 marked active"), "{out}");
    assert_eq!(
        a.device_states(),
        ["active", "failed", "active", "active", "failed", "active"],
        "only the freshest failed device (3) comes back"
    );
    read_back_without(&a, &[], &w);

    for p in ["1", "4"] {
        a.cli(&["re-add", p]).ok();
    }
    assert_eq!(a.status()["health"], "healthy");
    a.scrub_check_clean();
    read_back_without(&a, &[0, 2], &w);
}

/// Issue 18, item 1: an image of device 2 copied aside before the whole
/// volume was overwritten, put back over the device after it was failed.
/// Its checksums match its old data, so only its generation can tell: the
/// missed-write map starts at the generation device 2 left at, and the
/// image is older. Re-add refuses it and names the full way back.
#[test]
fn re_add_refuses_a_stale_image_of_the_device_and_names_replace_and_rebuild() {
    let a = array();
    let old = pseudo_random(71, 8 * MIB as usize);
    let new = pseudo_random(72, 8 * MIB as usize);
    let write = |bytes: &[u8]| {
        let server = a.serve();
        let mut client = server.client();
        client.write_all(0, bytes).expect("write");
        client.flush().expect("flush");
        client.disconnect();
        server.stop();
    };
    write(&old);
    let image = a.path("dev2.image");
    std::fs::copy(a.device(2), &image).expect("copy the image aside");
    write(&new);
    a.cli(&["fail", "2"]).ok();
    std::fs::copy(&image, a.device(2)).expect("put the old image back");

    let out = a.cli(&["re-add", "2"]).failed();
    assert!(
        out.stderr.contains("stale") && out.stderr.contains("ecdedup replace 2"),
        "the refusal must say why and what to do instead: {out}"
    );
    assert_eq!(
        a.device_states()[2],
        "failed",
        "a refused re-add changes nothing"
    );
    let server = a.serve();
    let mut client = server.client();
    let back = client.read_all(0, new.len()).expect("read");
    assert_same_bytes("written last, read with device 2 out", &back, &new);
    client.disconnect();
    server.stop();
}

/// Under plog and parix the device leaves with records in its parity
/// journal: re-add counts their stripes as missed and starts it with an
/// empty journal (refused before, as for dedup below).
#[test]
fn re_add_brings_back_a_device_of_a_journaled_array() {
    for policy in ["plog", "parix"] {
        let a = TestArray::create_64m_small_regions(&["--write-policy", policy]);
        let mut model = pseudo_random(63, 20 * MIB as usize);
        let server = a.serve();
        let mut client = server.client();
        client.write_all(0, &model).expect("write");
        client.flush().expect("flush");
        // Partial writes: logged in the parity journals, not replayed yet.
        for i in 0..64u64 {
            let at = (i * 4099 * 4096) % (20 * MIB - 4096);
            let at = at - at % 4096;
            let block = pseudo_random(100 + i, 4096);
            client.write_all(at, &block).expect("write");
            model[at as usize..at as usize + 4096].copy_from_slice(&block);
        }
        client.flush().expect("flush");
        a.cli(&["fail", "2"]).ok();
        let after = pseudo_random(64, MIB as usize);
        client.write_all(16 * MIB, &after).expect("write");
        model[16 * MIB as usize..17 * MIB as usize].copy_from_slice(&after);
        client.flush().expect("flush");
        client.disconnect();
        server.stop();
        assert_eq!(a.device_states()[2], "failed");

        let out = a.cli(&["re-add", "2"]).ok();
        let units = units_reconstructed(&out);
        assert!(
            units > 0 && units < 512,
            "{policy}: re-add must reconstruct what device 2 missed, not all 512 stripes: {out}"
        );
        assert_eq!(a.status()["health"], "healthy", "{policy}");
        a.scrub_check_clean();
        // Every block through device 2: two others out.
        let server = a.serve();
        for p in [0, 1] {
            a.cli(&["fail", &p.to_string()]).ok();
        }
        let mut client = server.client();
        let back = client.read_all(0, model.len()).expect("read");
        assert_same_bytes(policy, &back, &model);
        client.disconnect();
        server.stop();
    }
}

/// Under dedup (refused before: `replace` and a full `rebuild` were the
/// only way back) the member's dedup maps, in its metadata area, are
/// opened again and only what it missed is reconstructed through them.
#[test]
fn re_add_brings_back_a_device_of_a_deduplicating_array() {
    let a = TestArray::create_64m_small_regions(&["--dedup", "parity"]);
    let w = write_around_failures(&a, &[2]);
    let out = a.cli(&["re-add", "2"]).ok();
    let units = units_reconstructed(&out);
    assert!(
        (32..=96).contains(&units),
        "re-add must reconstruct what device 2 missed and little else (of 512 stripes): {out}"
    );
    assert_eq!(a.status()["health"], "healthy");
    a.scrub_check_clean();
    read_back_without(&a, &[0, 1], &w);
}

/// Writes a new generation of the superblock on `survivors` that marks
/// `position` failed, as the server does when a member fails.
fn mark_failed_on(a: &TestArray, position: usize, survivors: &[usize]) {
    use std::os::unix::fs::FileExt;
    let slot = SUPERBLOCK_BYTES as usize;
    let read = |i: usize| {
        let bytes = support::read_at(&a.device(i), 0, 2 * slot);
        Superblock::newest(&bytes[..slot], &bytes[slot..]).expect("superblock")
    };
    let generation = survivors.iter().map(|&i| read(i).generation).max().unwrap() + 1;
    for &i in survivors {
        let mut sb = read(i);
        sb.generation = generation;
        sb.states[position] = MemberState::Failed;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(a.device(i))
            .expect("open device");
        f.write_all_at(&sb.encode(), Superblock::slot_offset(generation))
            .expect("write superblock");
        f.sync_all().expect("sync");
    }
}
