//! Random writes of any size and alignment through NBD, checked against a
//! plain byte model of the volume: healthy, with one and two failed
//! devices, and after a restart; with the default write policy (rmw) and
//! with parity logging, PARIX and dedup.

use crate::support;

use rand::{Rng, SeedableRng};
use support::{assert_same_bytes, pseudo_random, TestArray, KIB, MIB};

const AREA: usize = 16 * MIB as usize;

fn random_writes_match_the_model(failed: &[usize], seed: u64) {
    random_writes_match_the_model_with(&[], failed, seed)
}

/// `create_extra`: more `ecdedup create` words (write policy, dedup).
fn random_writes_match_the_model_with(create_extra: &[&str], failed: &[usize], seed: u64) {
    let mut args: Vec<String> = support::create_args("128M");
    args.extend(create_extra.iter().map(|s| s.to_string()));
    let a = TestArray::create_with(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let mut server = a.serve();
    for d in failed {
        a.cli(&["fail", &d.to_string()]).ok();
    }
    let mut model = vec![0u8; AREA];
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut c = server.client();
    for i in 0..400u64 {
        let len = match rng.gen_range(0..4) {
            0 => rng.gen_range(1..=4096usize),
            1 => rng.gen_range(4096..=64 * KIB as usize),
            2 => rng.gen_range(64 * KIB as usize..=300 * KIB as usize),
            _ => [4096, 32 * 1024, 128 * 1024][rng.gen_range(0..3)],
        };
        let off = if rng.gen_bool(0.5) {
            rng.gen_range(0..=AREA - len)
        } else {
            rng.gen_range(0..=(AREA - len) / 4096) * 4096
        };
        let data = pseudo_random(seed ^ i, len);
        let fua = rng.gen_bool(0.1);
        if let Err(e) = c.write(off as u64, &data, fua) {
            panic!(
                "write #{i} of {len} bytes at {off} failed: {e:?}; server log:\n{}",
                server.log_text()
            );
        }
        model[off..off + len].copy_from_slice(&data);
        if i % 50 == 49 {
            let got = c.read_all(0, AREA).expect("read back");
            assert_same_bytes(&format!("volume after {} writes", i + 1), &got, &model);
        }
    }
    c.flush().unwrap();
    c.disconnect();
    assert!(server.is_running());
    server.stop();
    let server = a.serve();
    let mut c = server.client();
    assert_same_bytes(
        "volume after restart",
        &c.read_all(0, AREA).unwrap(),
        &model,
    );
    c.disconnect();
    server.stop();
    if failed.is_empty() {
        a.scrub_check_clean();
    }
}

#[test]
fn random_writes_of_any_alignment_match_the_model_on_a_healthy_array() {
    random_writes_match_the_model(&[], 1);
}

#[test]
fn random_writes_of_any_alignment_match_the_model_with_one_failed_device() {
    random_writes_match_the_model(&[0], 2);
}

#[test]
fn random_writes_of_any_alignment_match_the_model_with_two_failed_devices() {
    random_writes_match_the_model(&[2, 5], 3);
}

#[test]
fn random_writes_match_the_model_with_parity_logging_healthy_and_degraded() {
    random_writes_match_the_model_with(&["--write-policy", "plog"], &[], 4);
    random_writes_match_the_model_with(&["--write-policy", "plog"], &[1], 5);
}

#[test]
fn random_writes_match_the_model_with_parix_healthy_and_degraded() {
    random_writes_match_the_model_with(&["--write-policy", "parix"], &[], 6);
    random_writes_match_the_model_with(&["--write-policy", "parix"], &[4], 7);
}

#[test]
fn random_writes_match_the_model_with_dedup_healthy_and_degraded() {
    random_writes_match_the_model_with(&["--dedup", "all"], &[], 8);
    random_writes_match_the_model_with(&["--dedup", "all"], &[3], 9);
}

#[test]
fn a_degraded_write_across_a_stripe_unit_boundary_keeps_the_server_up() {
    // 16 KiB at 24 KiB: the last 8 KiB of data unit 0 and the first 8 KiB
    // of unit 1 of stripe 0, written while device 0 is out of service.
    let a = TestArray::create("64M");
    let mut server = a.serve();
    a.cli(&["fail", "0"]).ok();
    let data = pseudo_random(7, 16 * 1024);
    let mut c = server.client();
    let r = c.write(24 * 1024, &data, false);
    assert!(
        r.is_ok(),
        "write failed ({r:?}); server log:\n{}",
        server.log_text()
    );
    assert!(
        server.is_running(),
        "the server died; log:\n{}",
        server.log_text()
    );
    assert_same_bytes("read back", &c.read(24 * 1024, data.len()).unwrap(), &data);
    c.disconnect();
    server.stop();
}
