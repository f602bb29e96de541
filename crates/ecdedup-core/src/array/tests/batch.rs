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

/// A FUA write syncs every device in service, not only those it wrote:
/// a device's sync makes durable other writes in flight there with their
/// checksum entries, so syncing some members of their stripes and not
/// others left them durable in part (`Array::make_durable`).
#[test]
fn a_fua_write_syncs_every_device_in_service() {
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
    assert_eq!(synced, (0..6).collect::<Vec<_>>(), "every device");
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

/// A read over several stripes (a sequential read) reads them in one
/// batch, not one stripe after another (issue 21: 1 MiB reads were 8
/// batches of 4 device reads each); a bad block in one of them is still
/// decoded and the bytes are right.
#[test]
fn a_read_across_stripes_is_one_batch_and_decodes_a_bad_block() {
    let rig = filled();
    let stripe_data_bytes = 4 * 4096;
    let (at, len) = (stripe_data_bytes + 1024, 3 * stripe_data_bytes);
    let before = rig.a().stats().array;
    let mut buf = vec![0u8; len];
    rig.a().read(&mut buf, at as u64).unwrap();
    assert_eq!(buf, rig.model[at..at + len]);
    let s = rig.a().stats().array;
    assert_eq!(s.device_submissions - before.device_submissions, 1);
    assert_eq!(
        s.device_syscalls - before.device_syscalls,
        13,
        "4 + 4 + 4 units and the tail's first unit"
    );
    // A corrupt data block of the request's second stripe: decoded.
    let g = *rig.a().geometry();
    let place = g.place(2, 1);
    rig.corrupt(place.device, place.row * g.unit_bytes());
    let mut again = vec![0u8; len];
    rig.a().read(&mut again, at as u64).unwrap();
    assert_eq!(again, rig.model[at..at + len]);
    assert!(rig.a().stats().array.checksum_mismatches > s.checksum_mismatches);
}

/// On device files, a request's units that lie side by side on a device
/// go to it as one ring entry: a write of 3 whole stripes is 6 entries
/// (one per device), not 18, and reading them back is one entry per run
/// of data units on each device (issue 21: a 1 MiB write was 48 entries,
/// a 1 MiB read 32).
#[test]
fn a_requests_units_side_by_side_on_a_device_are_one_ring_entry() {
    if !crate::media::batch::ring_enabled() {
        eprintln!("io_uring unavailable: no ring entries to count");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let unit = 4096u32;
    let mut opts = options(6, 4, 2, unit, 8 * 4 * unit as u64);
    opts.devices = (0..6).map(|i| dir.path().join(format!("dev{i}"))).collect();
    opts.sparse = false;
    opts.io = crate::media::IoMode::Direct;
    let array_dir = dir.path().join("array");
    if create(&array_dir, &opts).is_err() {
        // tmpfs refuses O_DIRECT: buffered device files merge the same way.
        opts.io = crate::media::IoMode::Buffered;
        create(&array_dir, &opts).unwrap();
    }
    let a = Array::open(&array_dir, None).unwrap();
    let g = *a.geometry();
    let sd = 4 * unit as usize;
    let data = pattern(11, 3 * sd);
    a.write(&data, sd as u64, false).unwrap();
    let before = a.stats().array;
    a.write(&data, sd as u64, false).unwrap();
    let s = a.stats().array;
    assert_eq!(s.full_stripe_writes - before.full_stripe_writes, 3);
    assert_eq!(s.device_submissions - before.device_submissions, 1);
    assert_eq!(
        s.device_ring_entries - before.device_ring_entries,
        6,
        "one entry per device"
    );
    // The data units of stripes 1..4 on each device, in runs of adjacent rows.
    let runs: u64 = (0..6)
        .map(|d| {
            let rows: Vec<u64> = (1..4)
                .filter(|&s| g.role_on(s, d).is_some_and(|r| r < g.k()))
                .map(|s| g.place(s, g.role_on(s, d).unwrap()).row)
                .collect();
            rows.iter()
                .enumerate()
                .filter(|&(i, r)| i == 0 || rows[i - 1] + 1 != *r)
                .count() as u64
        })
        .sum();
    let before = a.stats().array;
    let mut back = vec![0u8; 3 * sd];
    a.read(&mut back, sd as u64).unwrap();
    assert_eq!(back, data);
    let s = a.stats().array;
    assert_eq!(s.device_submissions - before.device_submissions, 1);
    assert_eq!(s.device_ring_entries - before.device_ring_entries, runs);
    assert!(runs < 12, "12 data units in {runs} runs");
    a.close().unwrap();
}

/// PARIX's appends go to the parity journals in the data write's batch,
/// not as writes of their own before it (issue 21's profile: a
/// synchronous `pwrite` per journal outside the batch).
#[test]
fn a_parix_overwrite_writes_its_data_and_journal_appends_in_one_batch() {
    let mut rig = Rig::with_policy(6, 4, 2, 4096, 8, WritePolicy::Parix);
    rig.write(4096, &pattern(1, 4096));
    let before = rig.a().stats();
    rig.write(4096, &pattern(2, 4096));
    let s = rig.a().stats();
    assert_eq!(s.array.journal_writes - before.array.journal_writes, 1);
    let journal_bytes = |s: &Stats| s.devices.iter().map(|d| d.write_bytes.journal).sum::<u64>();
    assert_eq!(
        journal_bytes(&s) - journal_bytes(&before),
        2 * (32 + 4096 + 32),
        "d(r) in both parity journals, each with its row's base (32 bytes)"
    );
    assert_eq!(
        s.array.device_submissions - before.array.device_submissions,
        1,
        "no read (d(0) is logged), one batch of writes"
    );
    // The data unit's memory device loops (one call); the journals are
    // files in the folder, appended by a pwrite each in the same batch.
    assert_eq!(
        s.array.device_syscalls - before.array.device_syscalls,
        1 + 2
    );
    rig.assert_matches_model();
    rig.a().replay_all(None).unwrap();
    rig.assert_consistent();
}

/// Request threads append to the same journals at once, each append in
/// flight in its own batch: every record lands in its own place, so the
/// replay after a restart folds exactly what each write logged.
#[test]
fn concurrent_parix_writers_append_side_by_side_and_replay_right() {
    let mut rig = Rig::with_policy(6, 4, 2, 4096, 16, WritePolicy::Parix);
    let vol = rig.model.len();
    rig.write(0, &pattern(3, vol));
    let stripe_data_bytes = 4 * 4096;
    let writers = 8u64;
    std::thread::scope(|s| {
        for t in 0..writers {
            let a = rig.a();
            s.spawn(move || {
                for i in 0..40u64 {
                    // Writer t owns stripes t and t + 8; one block each time.
                    let stripe = t + 8 * (i % 2);
                    let at = stripe * stripe_data_bytes + (i % 4) * 4096;
                    a.write(&pattern(100 + t * 1000 + i, 4096), at, false)
                        .unwrap();
                }
            });
        }
    });
    for t in 0..writers {
        for i in 40 - 8..40u64 {
            let stripe = t + 8 * (i % 2);
            let at = (stripe * stripe_data_bytes + (i % 4) * 4096) as usize;
            rig.model[at..at + 4096].copy_from_slice(&pattern(100 + t * 1000 + i, 4096));
        }
    }
    assert!(rig.a().stats().array.journal_writes >= writers * 40);
    rig.a().flush().unwrap();
    rig.restart();
    rig.assert_matches_model();
    rig.a().replay_all(None).unwrap();
    rig.assert_consistent();
    rig.assert_matches_model();
}
