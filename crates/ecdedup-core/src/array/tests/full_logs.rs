//! Bounded logs in the metadata area (format 2) slow writes, never fail
//! them (issue 18, item 3): a degraded array written far past its
//! degraded-write log's bound without a flush checkpoints the log and
//! reads back every byte, before and after a crash.

use super::*;
use rand::rngs::StdRng;

/// A format-2 array (metadata on the devices) of 6 in-memory devices,
/// RS(4,2), 32 KiB units, 8 MiB: (its folder, devices).
fn format_2_array(policy: WritePolicy) -> (tempfile::TempDir, Vec<MemDevice>) {
    let dir = tempfile::tempdir().unwrap();
    let opts = CreateOptions {
        write_policy: policy,
        journal_bytes_max: logging::JOURNAL_BYTES_MIN,
        metadata: MetadataPlacement::Devices,
        ..options(6, 4, 2, 32 << 10, 8 << 20)
    };
    let geo = geometry_for(&opts).unwrap();
    let mems: Vec<MemDevice> = (0..6)
        .map(|i| MemDevice::new(&format!("d{i}"), geo.device_bytes_min()))
        .collect();
    format(dir.path(), &opts, shared(&mems)).unwrap();
    (dir, mems)
}

fn shared(mems: &[MemDevice]) -> Vec<Arc<dyn Device>> {
    mems.iter()
        .map(|d| Arc::new(d.clone()) as Arc<dyn Device>)
        .collect()
}

fn open(dir: &Path, mems: &[MemDevice]) -> Array {
    let devs = shared(mems).into_iter().map(Some).collect();
    Array::open_with_devices(dir, devs, None).unwrap()
}

/// Random 16 KiB writes (fio's randwrite) totalling `bytes`, no flush.
fn random_writes(a: &Array, model: &mut [u8], bytes: u64, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let bs = 16usize << 10;
    for _ in 0..bytes / bs as u64 {
        let off = rng.gen_range(0..model.len() / bs) * bs;
        let data: Vec<u8> = (0..bs).map(|_| rng.gen()).collect();
        a.write(&data, off as u64, false).unwrap();
        model[off..off + bs].copy_from_slice(&data);
    }
}

fn assert_reads(a: &Array, model: &[u8]) {
    let mut got = vec![0u8; model.len()];
    a.read(&mut got, 0).unwrap();
    assert!(
        got == model,
        "differs at byte {:?}",
        got.iter().zip(model).position(|(x, y)| x != y)
    );
}

/// The story of the issue, scaled down: two devices failed, then six
/// times the log's bound of random writes with no flush. They used to
/// fail with ENOSPC ("appending to the degraded-write log") once the
/// log filled its space in the metadata areas.
#[test]
fn degraded_writes_far_past_the_log_bound_without_a_flush_succeed() {
    for policy in [WritePolicy::Rmw, WritePolicy::Parix] {
        let (dir, mems) = format_2_array(policy);
        let a = open(dir.path(), &mems);
        let bound = degraded_log_area_bytes(a.geometry());
        let mut model = vec![0u8; a.volume_bytes() as usize];
        // Some journal records first (parix), so that degraded replays
        // log too.
        random_writes(&a, &mut model, 1 << 20, 1);
        a.fail_device(1).unwrap();
        a.fail_device(4).unwrap();
        random_writes(&a, &mut model, 3 * bound, 2);
        assert_reads(&a, &model);
        // The records since the last checkpoint resync the torn stripes.
        a.simulate_crash();
        let a = open(dir.path(), &mems);
        assert_reads(&a, &model);
        assert!(a.scrub(false, None).unwrap().parity_mismatches == 0);
    }
}
