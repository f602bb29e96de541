//! Scenario tests of batched device I/O and of FUA: what one request
//! submits (read from the counters) and which devices a FUA write syncs.
//! The devices are memory behind the fault-injecting device, so every
//! batch takes the looped path: one call per operation.

use super::*;

/// A filled, flushed RS(4,2) volume of 8 stripes, 4 KiB units, rmw.
fn filled() -> Rig {
    let mut rig = Rig::new(6, 4, 2, 4096, 8);
    let vol = rig.model.len();
    rig.write(0, &pattern(7, vol));
    rig.a().flush().unwrap();
    rig
}

fn sync_ops(rig: &Rig) -> Vec<u64> {
    rig.a().stats().devices.iter().map(|d| d.sync_ops).collect()
}

#[test]
fn a_fua_write_syncs_only_the_devices_it_touched() {
    let rig = filled();
    let before = sync_ops(&rig);
    let flushes = rig.a().stats().array.client_flushes;
    rig.a().write(&pattern(8, 4096), 0, true).unwrap();
    let synced: Vec<usize> = sync_ops(&rig)
        .iter()
        .zip(&before)
        .enumerate()
        .filter(|(_, (a, b))| a > b)
        .map(|(d, _)| d)
        .collect();
    let g = rig.a().geometry();
    let mut touched: Vec<usize> = [0, g.k(), g.k() + 1]
        .iter()
        .map(|&role| g.place(0, role).device)
        .collect();
    touched.sort_unstable();
    assert_eq!(
        synced, touched,
        "the data unit's device and the parity devices"
    );
    let s = rig.a().stats().array;
    assert_eq!(s.client_flushes, flushes, "no whole-array flush");
    assert_eq!(s.fua_syncs, 1);
}

#[test]
fn a_read_modify_write_reads_in_one_batch_then_writes_in_one() {
    let mut rig = filled();
    let before = rig.a().stats().array;
    rig.write(4096, &pattern(9, 4096));
    let s = rig.a().stats().array;
    assert_eq!(s.rmw_writes - before.rmw_writes, 1);
    assert_eq!(s.device_submissions - before.device_submissions, 2);
    // Memory devices loop: old data and two parities read, then written.
    assert_eq!(s.device_syscalls - before.device_syscalls, 6);
    rig.assert_matches_model();
    rig.assert_consistent();
}

#[test]
fn whole_stripes_of_one_request_go_in_one_batch() {
    let mut rig = filled();
    let before = rig.a().stats().array;
    let stripe_data_bytes = 4 * 4096;
    rig.write(
        stripe_data_bytes as u64,
        &pattern(10, 3 * stripe_data_bytes),
    );
    let s = rig.a().stats().array;
    assert_eq!(s.full_stripe_writes - before.full_stripe_writes, 3);
    assert_eq!(s.device_submissions - before.device_submissions, 1);
    assert_eq!(s.device_syscalls - before.device_syscalls, 3 * 6);
    rig.assert_matches_model();
    rig.assert_consistent();
}

#[test]
fn a_read_across_the_units_of_a_stripe_is_one_batch() {
    let rig = filled();
    let before = rig.a().stats().array;
    let mut buf = vec![0u8; 3 * 4096];
    rig.a().read(&mut buf, 2048).unwrap();
    assert_eq!(buf, rig.model[2048..2048 + buf.len()]);
    let s = rig.a().stats().array;
    assert_eq!(s.device_submissions - before.device_submissions, 1);
    assert_eq!(
        s.device_syscalls - before.device_syscalls,
        4,
        "4 units touched"
    );
}
