//! Scenario tests of the logging write policies (plog, parix) beyond the
//! happy path: bad parity met by replay, writes that must decode, replays
//! and journal appends that fail, journals that cannot grow, corrupt
//! journal records, replay at open with clean intent regions, journal
//! compaction and background replay. Each checks its outcome against the
//! model (every byte reads back, healthy and with devices failed) and
//! against a fresh encode of every stripe (scrub's parity check).
//!
//! Fault model: the array's devices are `FaultyDevice`s over memory;
//! the parity journals' files fail through their `FaultHooks` (appends
//! that write half and fail with ENOSPC, reads that fail with EIO,
//! preallocation that fails with ENOSPC).

use super::*;
use crate::array::journal::FAIL_PREALLOCATE_ON_THIS_THREAD;
use crate::array::MetadataPlacement;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};

const POLICIES: [WritePolicy; 2] = [WritePolicy::Plog, WritePolicy::Parix];

impl Rig {
    /// A filled RS(4,2) volume of `stripes` stripes, 8 KiB units, whose
    /// parity is current (full-stripe writes log nothing).
    fn filled(policy: WritePolicy, stripes: u64, journal_bytes_max: u64) -> Rig {
        Rig::filled_with(
            policy,
            stripes,
            journal_bytes_max,
            MetadataPlacement::Folder,
        )
    }

    /// As [`Rig::filled`], the metadata on the devices (format 2): the
    /// parity journals beside the parity, so a replay folds them at the
    /// device (`array/replay_fold.rs`).
    /// Metadata on the devices, each journal bounded at 4 MiB (the
    /// default 256 MiB made every rig of six memory devices zero 1.5 GiB:
    /// most of these tests' time, for journals that hold a few records).
    fn filled_on_devices(policy: WritePolicy, stripes: u64) -> Rig {
        Rig::filled_with(policy, stripes, 4 << 20, MetadataPlacement::Devices)
    }

    fn filled_with(
        policy: WritePolicy,
        stripes: u64,
        journal_bytes_max: u64,
        placement: MetadataPlacement,
    ) -> Rig {
        Rig::filled_with_dedup(
            policy,
            stripes,
            journal_bytes_max,
            placement,
            DedupConfig::default(),
        )
    }

    /// As [`Rig::filled_with`], each device under a dedup layer of `dedup`.
    fn filled_with_dedup(
        policy: WritePolicy,
        stripes: u64,
        journal_bytes_max: u64,
        placement: MetadataPlacement,
        dedup: DedupConfig,
    ) -> Rig {
        let mut rig = Rig::with(
            6,
            4,
            2,
            8192,
            stripes,
            dedup,
            policy,
            journal_bytes_max,
            placement,
        );
        let vol = rig.model.len();
        rig.write(0, &pattern(1000, vol));
        rig.a().flush().unwrap();
        assert_eq!(rig.a().journal_usage().1, 0);
        rig
    }

    fn geo(&self) -> Geometry {
        *self.a().geometry()
    }

    /// Byte offset in the volume of block `b` of data role `role` of `stripe`.
    fn volume_offset(&self, stripe: u64, role: usize, b: u64) -> u64 {
        let g = self.geo();
        stripe * g.stripe_data_bytes() + role as u64 * g.unit_bytes() + b * g.block()
    }

    /// Flips a byte of block `b` of unit `role` of `stripe`, on its device.
    fn corrupt_block(&self, stripe: u64, role: usize, b: u64) {
        let g = self.geo();
        let place = g.place(stripe, role);
        let off = (g.device_offset(place.row, b) + 77) as usize;
        self.mems[place.device].with_bytes(|bytes| bytes[off] ^= 0x5a);
    }

    /// The device holding parity unit `j` of `stripe`.
    fn parity_device(&self, stripe: u64, j: usize) -> usize {
        let g = self.geo();
        g.place(stripe, g.k() + j).device
    }

    fn journal_faults<R>(&self, d: usize, f: impl FnOnce(&journal::FaultHooks) -> R) -> R {
        let guard = self.a().stores[d].journal_for_test();
        f(guard
            .as_ref()
            .expect("a logging policy has journals")
            .faults())
    }

    fn pending(&self, stripe: u64) -> bool {
        self.a().journal_pending(stripe)
    }

    /// Fails the devices of data roles `roles` of `stripe` and checks that
    /// every byte of the volume still reads back.
    fn assert_degraded_reads_match(&self, stripe: u64, roles: &[usize]) {
        let g = self.geo();
        for &r in roles {
            self.a().fail_device(g.place(stripe, r).device).unwrap();
        }
        self.assert_matches_model();
    }

    fn close_cleanly(&mut self) {
        self.array.take().unwrap().close().unwrap();
    }

    fn journal_path(&self, d: usize) -> PathBuf {
        self.dir
            .path()
            .join(JOURNAL_DIR)
            .join(format!("dev{d}.jrnl"))
    }
}

#[test]
fn replay_over_a_corrupt_parity_block_recomputes_it_instead_of_folding_the_log_twice() {
    for (policy, on_devices) in POLICIES.into_iter().flat_map(|p| [(p, false), (p, true)]) {
        let mut rig = match on_devices {
            false => Rig::filled(policy, 4, JOURNAL_BYTES_DEFAULT),
            true => Rig::filled_on_devices(policy, 4),
        };
        let at = rig.volume_offset(1, 0, 0);
        rig.write(at, &pattern(1, 4096));
        rig.write(at + 4096 + 300, &pattern(2, 2000));
        assert!(rig.pending(1));
        rig.corrupt_block(1, 4, 0);
        rig.corrupt_block(1, 5, 1);
        rig.a().replay_all(None).unwrap();
        assert!(!rig.pending(1));
        // On the devices, the two good rows of the four are folded there;
        // the two corrupt ones the device refuses (a checksum mismatch),
        // and the writer recomputes them from the data.
        let at_device = rig.a().stats().array.parity_rows_folded_at_device;
        assert_eq!(at_device, if on_devices { 2 } else { 0 }, "{policy}");
        rig.assert_consistent();
        rig.assert_matches_model();
        rig.assert_degraded_reads_match(1, &[0, 1]);
    }
}

#[test]
fn a_write_that_must_decode_a_bad_block_replays_the_stripe_first_instead_of_failing() {
    for policy in POLICIES {
        let mut rig = Rig::filled(policy, 4, JOURNAL_BYTES_DEFAULT);
        let at = rig.volume_offset(2, 0, 0);
        rig.write(at, &pattern(3, 4096));
        assert!(rig.pending(2));
        rig.corrupt_block(2, 0, 1);
        // A partial block: the write reads the bad block, whose decode
        // needs parity the journal has not reached yet.
        rig.write(at + 4096 + 100, &pattern(4, 1000));
        rig.assert_matches_model();
        rig.a().replay_all(None).unwrap();
        rig.assert_consistent();
        rig.assert_degraded_reads_match(2, &[0, 3]);
    }
}

#[test]
fn a_replay_that_fails_keeps_the_stripe_pending_and_a_later_replay_completes_it() {
    for policy in POLICIES {
        let mut rig = Rig::filled(policy, 4, JOURNAL_BYTES_DEFAULT);
        for b in 0..2 {
            let at = rig.volume_offset(3, 1, b);
            rig.write(at, &pattern(10 + b, 4096));
        }
        let logged = rig.a().journal_usage().1;
        let p = rig.parity_device(3, 0);
        rig.journal_faults(p, |f| f.fail_reads.store(true, Relaxed));
        // Two data devices out: reads of their blocks need both parities,
        // so they replay first; the replay fails and must lose nothing.
        let g = rig.geo();
        for r in [1, 2] {
            rig.a().fail_device(g.place(3, r).device).unwrap();
        }
        let mut buf = vec![0u8; 4096];
        let at = rig.volume_offset(3, 1, 0);
        assert!(rig.a().read(&mut buf, at).is_err());
        assert!(rig.pending(3), "the failed replay keeps the stripe pending");
        assert!(rig.a().journal_usage().1 > 0 && rig.a().journal_usage().1 <= logged);
        rig.journal_faults(p, |f| f.fail_reads.store(false, Relaxed));
        rig.assert_matches_model();
        assert!(!rig.pending(3));
    }
}

#[test]
fn a_replay_that_fails_on_a_healthy_stripe_resyncs_it_from_its_data() {
    let mut rig = Rig::filled(WritePolicy::Parix, 4, JOURNAL_BYTES_DEFAULT);
    let at = rig.volume_offset(0, 2, 1);
    rig.write(at, &pattern(20, 4096));
    let p = rig.parity_device(0, 1);
    rig.journal_faults(p, |f| f.fail_reads.store(true, Relaxed));
    let before = rig.a().stats().array.resync_stripes;
    rig.a().replay_all(None).unwrap();
    assert!(rig.a().stats().array.resync_stripes > before);
    assert!(rig.a().stats().array.journal_errors > 0);
    rig.journal_faults(p, |f| f.fail_reads.store(false, Relaxed));
    assert!(!rig.pending(0));
    rig.assert_consistent();
    rig.assert_degraded_reads_match(0, &[2, 3]);
}

#[test]
fn sustained_writes_compact_the_journal_so_it_never_stays_full() {
    for policy in POLICIES {
        let bound = 4 << 20;
        let mut rig = Rig::filled(policy, 4, bound);
        let p = rig.parity_device(1, 0);
        // Stripe 1 fills its journals past a quarter of the bound; one
        // write to stripe 0 lands in the middle and stays unreplayed, as a
        // write arriving while a replay runs would.
        let mut written = 0;
        while rig.a().stores[p]
            .journal_for_test()
            .as_ref()
            .unwrap()
            .bytes()
            < bound / 3
        {
            let at = rig.volume_offset(1, (written % 4) as usize, written / 4 % 2);
            rig.write(at, &pattern(100 + written, 4096));
            written += 1;
            if written == 20 {
                rig.write(rig.volume_offset(0, 3, 0), &pattern(99, 4096));
            }
        }
        assert!(rig.pending(0) && rig.pending(1));
        rig.a().replay_stripe(1).unwrap();
        for d in 0..6 {
            rig.a().reclaim_journal(d);
        }
        let s = rig.a().stats();
        assert!(s.array.journal_compactions > 0, "{:?}", s.array);
        assert!(
            rig.a().stores[p]
                .journal_for_test()
                .as_ref()
                .unwrap()
                .bytes()
                < 64 << 10,
            "compacted to the live records of stripe 0"
        );
        assert!(rig.pending(0) && !rig.pending(1));
        assert_eq!(s.array.journal_fallbacks, 0);
        // The compacted journal is what a restart replays.
        rig.close_cleanly();
        rig.open();
        rig.assert_consistent();
        rig.assert_matches_model();
        rig.assert_degraded_reads_match(0, &[3, 0]);
    }
}

#[test]
fn a_journal_that_cannot_reserve_space_at_open_makes_writes_go_in_place() {
    for policy in POLICIES {
        let mut rig = Rig::filled(policy, 4, JOURNAL_BYTES_DEFAULT);
        rig.write(rig.volume_offset(1, 1, 1), &pattern(30, 4096));
        rig.close_cleanly();
        FAIL_PREALLOCATE_ON_THIS_THREAD.with(|f| f.set(true));
        let reopened = Array::open_with_devices(rig.dir.path(), rig.devices(), None);
        FAIL_PREALLOCATE_ON_THIS_THREAD.with(|f| f.set(false));
        rig.array = Some(reopened.expect("a journal that cannot grow does not stop the array"));
        assert!(rig.a().warnings().iter().any(|w| w.contains("reserve")));
        rig.assert_consistent();
        let before = rig.a().stats().array;
        rig.write(rig.volume_offset(2, 0, 0), &pattern(31, 4096));
        let after = rig.a().stats().array;
        assert_eq!(after.journal_writes, before.journal_writes);
        assert_eq!(after.journal_fallbacks, before.journal_fallbacks + 1);
        rig.assert_matches_model();
        // The next replay reserves the space, and writes are logged again.
        rig.a().replay_all(None).unwrap();
        rig.write(rig.volume_offset(2, 0, 1), &pattern(32, 4096));
        assert_eq!(
            rig.a().stats().array.journal_writes,
            before.journal_writes + 1
        );
        rig.assert_matches_model();
    }
}

#[test]
fn an_append_that_fails_after_another_journal_took_the_write_leaves_nothing_to_fold() {
    for policy in POLICIES {
        let mut rig = Rig::filled(policy, 4, JOURNAL_BYTES_DEFAULT);
        rig.write(rig.volume_offset(1, 0, 0), &pattern(40, 4096));
        // The second parity journal of stripe 1 fails mid-append (ENOSPC):
        // the first one already holds the write's records.
        let p = rig.parity_device(1, 1);
        rig.journal_faults(p, |f| f.fail_appends.store(true, Relaxed));
        rig.write(rig.volume_offset(1, 2, 1), &pattern(41, 4096));
        let s = rig.a().stats().array;
        assert!(s.journal_errors > 0 && s.journal_fallbacks > 0, "{s:?}");
        assert!(!rig.pending(1), "parity was recomputed from the data");
        rig.assert_matches_model();
        rig.assert_consistent();
        // Writes to stripes of that journal go in place from now on.
        rig.write(rig.volume_offset(1, 3, 0), &pattern(42, 4096));
        assert!(rig.a().stats().array.journal_fallbacks > s.journal_fallbacks);
        rig.journal_faults(p, |f| f.fail_appends.store(false, Relaxed));
        // A crash now: the stripe's region was pinned dirty, so the restart
        // resyncs it before replaying the records the journals still hold.
        rig.crash_and_restart();
        rig.assert_consistent();
        rig.assert_matches_model();
        rig.assert_degraded_reads_match(1, &[0, 2]);
    }
}

#[test]
fn an_invalidation_that_cannot_be_logged_pins_the_stripe_for_resync_at_open() {
    let mut rig = Rig::filled(WritePolicy::Parix, 4, JOURNAL_BYTES_DEFAULT);
    rig.write(rig.volume_offset(2, 1, 0), &pattern(50, 4096));
    let p = rig.parity_device(2, 0);
    rig.journal_faults(p, |f| f.fail_appends.store(true, Relaxed));
    // Replay writes the parity, then cannot log the invalidation.
    rig.a().replay_all(None).unwrap();
    assert!(!rig.pending(2));
    rig.assert_consistent();
    // Even a clean close leaves the stripe's region dirty: the records the
    // file still holds are resynchronised away, never folded in again.
    rig.close_cleanly();
    rig.open();
    assert!(rig.a().stats().array.resync_stripes > 0);
    rig.assert_consistent();
    rig.assert_matches_model();
}

#[test]
fn a_corrupt_record_in_the_middle_of_a_journal_resyncs_what_it_lost() {
    // A bad payload (the record's header names its stripe) and a bad header
    // (any stripe of the journal may have lost records).
    for (policy, flip_at) in [
        (WritePolicy::Parix, 32 + 32 + 200),
        (WritePolicy::Plog, 32 + 9),
        (WritePolicy::Parix, 32 + 9),
    ] {
        let mut rig = Rig::filled(policy, 6, JOURNAL_BYTES_DEFAULT);
        for i in 0..24u64 {
            let stripe = i % 6;
            rig.write(
                rig.volume_offset(stripe, (i % 4) as usize, i / 6 % 2),
                &pattern(60 + i, 4096),
            );
        }
        let p = rig.parity_device(0, 0);
        rig.close_cleanly();
        let path = rig.journal_path(p);
        let mut bytes = std::fs::read(&path).unwrap();
        assert!(bytes.len() > 3 * 4128, "records after the corrupt one");
        bytes[flip_at] ^= 0x20;
        std::fs::write(&path, &bytes).unwrap();
        rig.open();
        assert!(
            rig.a()
                .warnings()
                .iter()
                .any(|w| w.contains("unreadable records")),
            "{:?}",
            rig.a().warnings()
        );
        rig.assert_consistent();
        rig.assert_matches_model();
        rig.assert_degraded_reads_match(0, &[0, 1]);
    }
}

#[test]
fn replay_at_open_alone_restores_parity_when_the_intent_regions_are_clean() {
    for policy in POLICIES {
        let mut rig = Rig::filled(policy, 4, JOURNAL_BYTES_DEFAULT);
        rig.set_intent_clear_quiet_ms(0);
        for i in 0..8u64 {
            rig.write(
                rig.volume_offset(i % 4, (i % 3) as usize, i % 2),
                &pattern(70 + i, 4096),
            );
        }
        rig.a().flush().unwrap();
        assert_eq!(rig.a().status().dirty_regions, 0, "flushed and quiet");
        assert!(rig.a().journal_usage().1 > 0);
        rig.crash_and_restart();
        let s = rig.a().stats().array;
        assert_eq!(
            s.resync_stripes,
            0,
            "nothing was resynchronised {:?}",
            rig.a().warnings()
        );
        assert!(s.records_replayed > 0 && s.stripes_replayed > 0, "{s:?}");
        rig.assert_consistent();
        rig.assert_matches_model();
        rig.assert_degraded_reads_match(1, &[1, 2]);
    }
}

#[test]
fn need_d0_counts_only_writes_that_were_logged() {
    // Room for one write's d(0) and d(r), not for a second one.
    let mut rig = Rig::filled(WritePolicy::Parix, 4, (1 << 20) + 10_000);
    rig.write(rig.volume_offset(0, 0, 0), &pattern(80, 4096));
    rig.write(rig.volume_offset(0, 1, 0), &pattern(81, 4096));
    let s = rig.a().stats().array;
    assert_eq!((s.journal_writes, s.journal_fallbacks), (1, 1));
    assert_eq!(s.need_d0, 1);
    rig.assert_matches_model();
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    // Generous: a loaded CI machine may starve the background thread.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn the_background_thread_replays_an_idle_volume_and_a_journal_past_its_threshold() {
    let bound: u64 = 4 << 20;
    let mut rig = Rig::filled(WritePolicy::Parix, 8, bound);
    let model = rig.model.clone();
    let array = Arc::new(rig.array.take().unwrap());
    let mut model = model;
    let mut write = |a: &Array, at: u64, bytes: &[u8]| {
        a.write(bytes, at, false).unwrap();
        model[at as usize..at as usize + bytes.len()].copy_from_slice(bytes);
    };
    // Idle: a few logged writes, then nothing.
    write(&array, 4096, &pattern(90, 4096));
    array.start_background_replay();
    wait_for("an idle replay", || {
        array.stats().array.stripes_replayed > 0
    });
    // Threshold: writes until a journal passes half its bound asks for a
    // replay, which the thread then runs.
    let mut i = 0u64;
    while !array.replay_wanted() {
        write(
            &array,
            (i % 64) * 4096 * 3 % (8 * 4 * 8192),
            &pattern(91 + i, 4096),
        );
        i += 1;
        assert!(i < 100_000, "the threshold was never reached");
    }
    let replayed = array.stats().array.stripes_replayed;
    wait_for("a threshold replay", || {
        array.stats().array.stripes_replayed > replayed
    });
    // Idle, the thread replays what is left and gives the space back.
    wait_for("empty journals", || {
        let (bytes, logged, _) = array.journal_usage();
        bytes == 0 && logged == 0
    });
    let mut back = vec![0u8; model.len()];
    array.read(&mut back, 0).unwrap();
    assert!(back == model, "volume differs from the model");
    array.close().unwrap();
    let report = array.scrub(false, None).unwrap();
    assert_eq!(report.parity_mismatches, 0, "{report:?}");
}

#[test]
fn replayed_parity_goes_through_the_dedup_layer_once_per_materialised_block() {
    let mut rig = Rig::with(
        6,
        4,
        2,
        8192,
        4,
        dedup(Policy::Parity),
        WritePolicy::Parix,
        JOURNAL_BYTES_DEFAULT,
        MetadataPlacement::Folder,
    );
    let vol = rig.model.len();
    rig.write(0, &pattern(95, vol));
    let hashes = |rig: &Rig| -> u64 {
        rig.a()
            .stats()
            .dedup
            .iter()
            .flatten()
            .map(|d| d.hash_ops)
            .sum()
    };
    let parity_blocks_written = |rig: &Rig| -> u64 {
        rig.a()
            .stats()
            .devices
            .iter()
            .map(|d| d.write_bytes.parity / 4096)
            .sum()
    };
    let (h0, p0) = (hashes(&rig), parity_blocks_written(&rig));
    for b in 0..2 {
        rig.write(rig.volume_offset(1, 0, b), &pattern(96 + b, 4096));
    }
    assert_eq!(hashes(&rig), h0, "logged writes hash nothing yet");
    rig.a().replay_all(None).unwrap();
    let materialised = parity_blocks_written(&rig) - p0;
    assert_eq!(materialised, 4, "two rows of two parity units");
    assert_eq!(hashes(&rig) - h0, materialised);
    rig.assert_consistent();
}

#[test]
fn a_parity_device_that_dies_during_replay_costs_only_its_own_log() {
    for (policy, on_devices) in POLICIES.into_iter().flat_map(|p| [(p, false), (p, true)]) {
        let mut rig = match on_devices {
            false => Rig::filled(policy, 4, JOURNAL_BYTES_DEFAULT),
            true => Rig::filled_on_devices(policy, 4),
        };
        rig.write(rig.volume_offset(2, 1, 1), &pattern(110, 4096));
        let p = rig.parity_device(2, 0);
        rig.plans[p].dead.store(true, Relaxed);
        rig.a().replay_all(None).unwrap();
        assert!(!rig.pending(2));
        assert_eq!(rig.a().member_states()[p], MemberState::Failed);
        rig.assert_matches_model();
        // The other parity unit was replayed: it alone decodes a data unit.
        rig.assert_degraded_reads_match(2, &[1]);
    }
}

#[test]
fn a_bad_parity_block_whose_data_cannot_be_read_is_left_for_readers_to_skip() {
    for (policy, on_devices) in POLICIES.into_iter().flat_map(|p| [(p, false), (p, true)]) {
        let mut rig = match on_devices {
            false => Rig::filled(policy, 4, JOURNAL_BYTES_DEFAULT),
            true => Rig::filled_on_devices(policy, 4),
        };
        rig.write(rig.volume_offset(3, 0, 0), &pattern(120, 4096));
        rig.corrupt_block(3, 4, 0);
        // A data device dies: the bad parity block cannot be recomputed.
        let d = rig.geo().place(3, 2).device;
        rig.plans[d].dead.store(true, Relaxed);
        rig.a().replay_all(None).unwrap();
        assert!(!rig.pending(3));
        // Row 0 of stripe 3 decodes from the three live data units and the
        // other parity unit; the bad one is skipped by its checksum.
        rig.assert_matches_model();
    }
}

#[test]
fn journal_records_naming_blocks_outside_the_array_are_dropped_at_open() {
    for policy in POLICIES {
        let mut rig = Rig::filled(policy, 4, JOURNAL_BYTES_DEFAULT);
        let g = rig.geo();
        let d = rig.parity_device(1, 0);
        let kind = if policy == WritePolicy::Parix {
            journal::Kind::Value
        } else {
            journal::Kind::Delta
        };
        // Well-formed records (their checksums hold) that name a stripe
        // past the end, a role past the stripe, a block past the unit, and
        // a stripe whose parity is not on this device.
        let foreign = (0..g.stripes)
            .find(|&s| (0..g.m()).all(|j| rig.parity_device(s, j) != d))
            .expect("a stripe without parity on d");
        let block = vec![0x3c; g.block() as usize];
        let mut records = Vec::new();
        journal::encode(&mut records, kind, g.stripes + 1_000_000, 0, 0, &block);
        journal::encode(&mut records, kind, 1, g.width() as u16, 0, &block);
        journal::encode(&mut records, kind, 1, 0, g.blocks_per_unit() as u32, &block);
        journal::encode(&mut records, kind, foreign, 0, 0, &block);
        {
            let mut guard = rig.a().stores[d].journal_for_test();
            let j = guard.as_mut().unwrap();
            j.append(&records).unwrap();
            j.sync().unwrap();
        }
        rig.crash_and_restart();
        assert!(
            rig.a()
                .warnings()
                .iter()
                .any(|w| w.contains("outside its parity units")),
            "{:?}",
            rig.a().warnings()
        );
        assert!(!rig.pending(1));
        rig.assert_matches_model();
        rig.assert_consistent();
    }
}

/// Found by the model tests under load (plog and parix, 5 of 8 runs with
/// four copies side by side): the close returned while the background
/// replay was still folding journals into parity, cleared the intent log,
/// and the process exited; the parity it had written was never covered by
/// a checksum-table flush, so the next scrub found every block of those
/// parity units mismatched. The close now waits for the thread.
#[test]
fn the_close_waits_for_the_background_replay_before_its_last_flush() {
    for policy in POLICIES {
        let stripes = 8u64;
        let mut rig = Rig::filled(policy, stripes, JOURNAL_BYTES_DEFAULT);
        let array = Arc::new(rig.array.take().unwrap());
        // One logged write in every stripe.
        let stripe_bytes = 4 * 8192;
        for s in 0..stripes {
            array
                .write(&pattern(300 + s, 4096), s * stripe_bytes, false)
                .unwrap();
        }
        assert!(array.journal_usage().1 >= stripes, "{policy:?}");
        // The last stripe's lock held: the replay stops there, mid-run.
        let last = stripes - 1;
        let held = array.locks[Array::lock_index(last)].read().unwrap();
        array.start_background_replay();
        wait_for("the idle replay to reach the held stripe", || {
            array.stats().array.stripes_replayed >= last
        });
        let closer = {
            let array = Arc::clone(&array);
            std::thread::spawn(move || array.close())
        };
        wait_for("the close to begin", || array.stopping.load(SeqCst));
        // Before the fix the close returned at once, the fold still to come.
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert!(
            !closer.is_finished(),
            "{policy:?}: the close returned while the background replay was mid-run"
        );
        drop(held);
        closer.join().unwrap().unwrap();
        assert_eq!(
            Arc::strong_count(&array),
            1,
            "{policy:?}: the background replay outlived the close"
        );
        let report = array.scrub(false, None).unwrap();
        assert_eq!(
            (report.checksum_mismatches, report.parity_mismatches),
            (0, 0),
            "{policy:?}: {report:?}"
        );
    }
}

/// The cluster simulator's seed 45698 (parix), on one machine: a write's
/// append to the second parity journal of stripe 1 fails, the write goes
/// in place, and the resync that follows loses the data member of role 3
/// as it reads it, its table page not resident (a cache of one page per
/// device), so nothing knows what role 3 held. The first parity folds its
/// journal; the second lacks the write, the five members left are not
/// one codeword, and no decode is vouched for. The second parity's
/// blocks of the written rows are marked unreadable now. Unmarked, a
/// later open with role 3 and the first parity out decoded role 3 from
/// the k left, the stale parity among them, as neither its bytes nor an
/// error (and in the simulator the stripe's next write failed: no
/// combination of the five members vouched for).
#[test]
fn a_failed_append_with_a_data_member_lost_at_its_resync_leaves_the_stale_parity_out() {
    for policy in [WritePolicy::Parix, WritePolicy::Plog] {
        let mut rig = Rig::with(
            6,
            4,
            2,
            4096,
            2600,
            DedupConfig::default(),
            policy,
            JOURNAL_BYTES_DEFAULT,
            MetadataPlacement::Folder,
        );
        let mut cfg = ConfigFile::load(rig.dir.path()).unwrap();
        cfg.checksum_cache_bytes_max = 6;
        cfg.store(rig.dir.path()).unwrap();
        rig.restart();
        let g = rig.geo();
        let stripe = 1;
        let sd = g.stripe_data_bytes();
        rig.write(stripe * sd, &pattern(59, sd as usize));
        // A stripe far away pages every device's table page of stripe 1
        // out (2600 stripes: 3 pages per device, one resident).
        rig.write(2500 * sd, &pattern(58, sd as usize));
        rig.a().flush().unwrap();
        let lost = g.place(stripe, 3).device;
        let at = g.device_offset(g.place(stripe, 3).row, 0);
        *rig.plans[lost].lost_read_range.lock().unwrap() = Some((at, at + g.unit_bytes()));
        let p = rig.parity_device(stripe, 1);
        rig.journal_faults(p, |f| f.fail_appends.store(true, Relaxed));
        rig.write(rig.volume_offset(stripe, 0, 0), &pattern(60, 4096));
        rig.journal_faults(p, |f| f.fail_appends.store(false, Relaxed));
        assert_eq!(rig.a().member_states()[lost], MemberState::Failed);
        rig.a().flush().unwrap();
        // The first parity is out at the next open too.
        let mut devs = rig.devices();
        devs[rig.parity_device(stripe, 0)] = None;
        let read_at = rig.volume_offset(stripe, 3, 0);
        rig.array.take().unwrap().simulate_crash();
        let array = Array::open_with_devices(rig.dir.path(), devs, None).unwrap();
        let mut got = vec![0u8; 4096];
        if array.read(&mut got, read_at).is_ok() {
            assert!(
                got[..] == rig.model[read_at as usize..read_at as usize + 4096],
                "{policy:?}: role 3 reads neither its bytes nor an error (decoded through \
                 the stale parity)"
            );
        }
    }
}

impl Rig {
    /// A 4 KiB write of block 0 of data role `role` of `stripe`, flushed,
    /// which the parity journals hold records for (a partial write).
    /// Writes a whole stripe other than `stripe` whose parity is not on
    /// device `p` (which then holds one of its data units) with FUA, the
    /// bytes of `seed`; returns that stripe.
    fn fua_write_without_parity_on(&mut self, stripe: u64, p: usize, seed: u64) -> u64 {
        let g = self.geo();
        let other = (0..g.stripes)
            .find(|&s| s != stripe && (0..g.m()).all(|j| self.parity_device(s, j) != p))
            .expect("a stripe without parity on that device");
        let sd = g.stripe_data_bytes();
        let bytes = pattern(seed, sd as usize);
        self.a().write(&bytes, other * sd, true).unwrap();
        let at = (other * sd) as usize;
        self.model[at..at + bytes.len()].copy_from_slice(&bytes);
        other
    }

    fn write_journaled(&mut self, stripe: u64, role: usize, seed: u64) {
        self.write(self.volume_offset(stripe, role, 0), &pattern(seed, 4096));
        self.a().flush().unwrap();
        assert!(self.pending(stripe), "the write is journaled");
    }

    /// The device byte range of device `p`'s parity journal (format 2),
    /// its first `bytes` bytes.
    fn journal_range_on_device(&self, p: usize, bytes: u64) -> (u64, u64) {
        let area = self.a().meta.as_ref().unwrap().area(p).unwrap();
        let runs = area.file_runs(&format!("{JOURNAL_DIR}/dev{p}.jrnl"), bytes);
        let (first, _) = runs[0];
        let (last, len) = runs[runs.len() - 1];
        (first, last + len as u64)
    }

    /// The first MiB of each parity journal of `stripe` as it lies on its
    /// device (format 2): (device, offset, bytes), for [`Rig::put_back`].
    /// Stripe 1 of a filled rig with a flushed partial write of unit
    /// `record_role` in its parity journals, then unit 3's member failed
    /// (where a fold while serving logs that unit's value); returns the
    /// rig and that member's device.
    fn journaled_with_unit_3_out(policy: WritePolicy, record_role: usize) -> (Rig, usize) {
        let mut rig = Rig::filled_on_devices(policy, 16);
        rig.write_journaled(1, record_role, 90);
        let out = rig.geo().place(1, 3).device;
        rig.a().fail_device(out).unwrap();
        (rig, out)
    }

    fn parity_journals_on_devices(&self, stripe: u64) -> Vec<(usize, u64, Vec<u8>)> {
        (0..self.geo().m())
            .map(|j| {
                let p = self.parity_device(stripe, j);
                let (from, to) = self.journal_range_on_device(p, 1 << 20);
                let bytes = self.mems[p].with_bytes(|b| b[from as usize..to as usize].to_vec());
                (p, from, bytes)
            })
            .collect()
    }

    /// Writes device byte ranges back as they were saved (a cut that
    /// dropped what was written there since).
    fn put_back(&self, saved: &[(usize, u64, Vec<u8>)]) {
        for (d, from, bytes) in saved {
            let from = *from as usize;
            self.mems[*d].with_bytes(|b| b[from..from + bytes.len()].copy_from_slice(bytes));
        }
    }

    /// Stops without a close (the journals keep their records), opens
    /// again with the member of `stripe`'s data role 0 gone, and checks
    /// that the stripe's first block row reads back in every data role
    /// and that device `p` is failed. `why`: the case, for the messages.
    fn assert_reopened_without_role_0_reads_right(&mut self, stripe: u64, p: usize, why: &str) {
        let role_0 = self.geo().place(stripe, 0).device;
        let array = self.assert_reopened_without_reads_right(stripe, &[role_0], why);
        assert_eq!(
            array.member_states()[p],
            MemberState::Failed,
            "{why}: device {p} is failed: {:?}",
            array.warnings()
        );
    }

    /// Stops without a close (the journals keep their records), opens
    /// again without devices `gone`, and checks that `stripe`'s first
    /// block row reads back in every data role. Returns the array.
    /// The volume offsets of block row 0 of each data unit of `stripe`.
    fn row_offsets(&self, stripe: u64) -> Vec<u64> {
        (0..self.geo().k())
            .map(|role| self.volume_offset(stripe, role, 0))
            .collect()
    }

    /// Stops without a close (a crash: the journals keep their records,
    /// the devices what they hold) and opens again without devices `gone`.
    fn crash_and_reopen_without(&mut self, gone: &[usize]) -> Array {
        let mut devs = self.devices();
        for &d in gone {
            devs[d] = None;
        }
        self.array.take().unwrap().simulate_crash();
        Array::open_with_devices(self.dir.path(), devs, None).unwrap()
    }

    /// Stops without a close, opens again without the member of
    /// `stripe`'s data role 0 (`role_0`), and checks that each data role's
    /// first block reads as `old` or `new` (the stripe's data before and
    /// after a write that was not flushed), role 0 also as an I/O error.
    fn assert_reopened_without_reads_old_or_new(
        &mut self,
        stripe: u64,
        role_0: usize,
        old: &[u8],
        new: &[u8],
        policy: WritePolicy,
    ) {
        let sd = self.geo().stripe_data_bytes();
        let offsets = self.row_offsets(stripe);
        let array = self.crash_and_reopen_without(&[role_0]);
        for (role, &at) in offsets.iter().enumerate() {
            let mut got = vec![0u8; 4096];
            if let Err(e) = array.read(&mut got, at) {
                assert!(
                    role == 0,
                    "{policy:?}: role {role} (left) fails to read: {e}"
                );
                continue;
            }
            let within = (at - stripe * sd) as usize;
            assert!(
                got[..] == old[within..within + 4096] || got[..] == new[within..within + 4096],
                "{policy:?}: role {role} reads neither its flushed nor its new bytes: {:?}",
                array.warnings()
            );
        }
    }

    fn assert_reopened_without_reads_right(
        &mut self,
        stripe: u64,
        gone: &[usize],
        why: &str,
    ) -> Array {
        let g = self.geo();
        let offsets = self.row_offsets(stripe);
        let array = self.crash_and_reopen_without(gone);
        for (role, &at) in offsets.iter().enumerate() {
            let mut got = vec![0u8; g.unit_bytes() as usize];
            array.read(&mut got, at).unwrap_or_else(|e| {
                panic!(
                    "{why}: role {role} fails to read: {e}: {:?}",
                    array.warnings()
                )
            });
            assert!(
                got[..] == self.model[at as usize..at as usize + got.len()],
                "{why}: role {role} reads wrong"
            );
        }
        array
    }
}

/// A flush of format 2 makes each parity journal durable by its device's
/// sync, in one batch with the other devices', and records the journal's
/// new length (its synced length, what a degraded replay takes as
/// flushed) only afterwards. An append that finishes while the devices
/// sync may reach its device after that device's sync: it is the next
/// flush's, and this flush records the length the journal had before the
/// syncs were issued, never the length at its bookkeeping.
#[test]
fn an_append_that_finishes_while_a_flush_syncs_the_devices_is_the_next_flushs() {
    for policy in POLICIES {
        let mut rig = Rig::filled_on_devices(policy, 16);
        let g = rig.geo();
        let stripe = 1;
        // Logged once and flushed: parix's journals hold d(0), and the
        // stripe's intent region is dirty, so the write below touches no
        // device but its own three.
        rig.write_journaled(stripe, 2, 90);
        let p = rig.parity_device(stripe, 0);
        let own: Vec<usize> = [g.place(stripe, 2).device, p, rig.parity_device(stripe, 1)].into();
        let slow = (0..g.width()).find(|d| !own.contains(d)).unwrap();
        let name = format!("{JOURNAL_DIR}/dev{p}.jrnl");
        // The journal's length as the device's directory records it:
        // what an open takes as synced.
        let committed = |rig: &Rig| {
            let dev: Arc<dyn Device> = Arc::new(rig.mems[p].clone());
            let area = Arc::new(
                AreaFs::open_read_only(dev, g.meta_area_offset(), g.meta_area_bytes).unwrap(),
            );
            area.open_file(&name).unwrap().synced_len().unwrap()
        };
        let before = rig.a().stores[p].journal_bytes();
        assert_eq!(committed(&rig), before, "{policy:?}: flushed");
        // A write elsewhere, so that the flush has something to sync.
        rig.write(rig.volume_offset(5, 0, 0), &pattern(91, 4096));
        let before = rig.a().stores[p].journal_bytes();
        let plan = Arc::clone(&rig.plans[slow]);
        plan.hold_syncs.store(true, SeqCst);
        plan.hold.store(true, SeqCst);
        let at = rig.volume_offset(stripe, 2, 0);
        let late = pattern(92, 4096);
        std::thread::scope(|s| {
            let a = rig.array.as_ref().unwrap();
            let flush = s.spawn(move || a.flush());
            while !plan.held.load(SeqCst) {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            // The flush has taken the journals' lengths and waits in the
            // devices' sync: this write's appends finish meanwhile.
            a.write(&late, at, false).unwrap();
            assert!(a.stores[p].journal_bytes() > before, "{policy:?}: appended");
            plan.hold.store(false, SeqCst);
            flush.join().unwrap().unwrap();
        });
        plan.hold_syncs.store(false, SeqCst);
        rig.model[at as usize..at as usize + 4096].copy_from_slice(&late);
        assert_eq!(
            committed(&rig),
            before,
            "{policy:?}: the append made during the devices' sync is recorded as flushed"
        );
        rig.a().flush().unwrap();
        assert_eq!(
            committed(&rig),
            rig.a().stores[p].journal_bytes(),
            "{policy:?}: the next flush records it"
        );
        rig.assert_matches_model();
        rig.assert_degraded_reads_match(stripe, &[2]);
    }
}

/// The cluster simulator, seed 33331 (parix): at a takeover's open the
/// read of one parity member's journal timed out. The journal was put
/// aside and every stripe resynchronised from its data, the member kept
/// in service: its parity of a stripe with a data member out lacked the
/// records the journal held, the five members left disagreed, and the
/// missing block (never written) read as an I/O error where the four
/// others decoded it right. Format 2 keeps the journal on the member's
/// own device, so a read error of it fails the member, as any read error
/// does, and its parity is left out.
#[test]
fn a_parity_journal_that_cannot_be_read_at_open_fails_its_device() {
    for policy in POLICIES {
        let mut rig = Rig::filled_on_devices(policy, 16);
        let stripe = 1;
        rig.write_journaled(stripe, 2, 61);
        // At the next open the read of the first parity's journal fails
        // as a lost link does.
        let p = rig.parity_device(stripe, 0);
        let (at, _) = rig.journal_range_on_device(p, 4096);
        *rig.plans[p].lost_read_range.lock().unwrap() = Some((at, at + 4096));
        rig.assert_reopened_without_role_0_reads_right(stripe, p, &format!("{policy:?}"));
    }
}

/// The cluster simulator, seeds 80585, 74821 and 92254: the mark that
/// cancels a stripe's records (its parity recomputed from data) could not
/// be appended to one parity member's journal. The member stayed in
/// service with the stripe pinned for a resync, and its journal still
/// held the records; the next open found a data member out, folded them
/// into parity that already held their writes, and the two parities
/// disagreed (a block that four members decoded right read as an I/O
/// error). Format 2: the append's error is the device's write error,
/// which fails it.
#[test]
fn an_invalidation_that_cannot_be_appended_on_the_device_fails_the_device() {
    for policy in POLICIES {
        let mut rig = Rig::filled_on_devices(policy, 16);
        let g = rig.geo();
        let stripe = 1;
        rig.write_journaled(stripe, 1, 62);
        let p = rig.parity_device(stripe, 0);
        let journal = rig.journal_range_on_device(p, 1 << 20);
        *rig.plans[p].bad_write_range.lock().unwrap() = Some(journal);
        // A whole-stripe write recomputes parity and cancels the records.
        let sd = g.stripe_data_bytes();
        rig.write(stripe * sd, &pattern(63, sd as usize));
        *rig.plans[p].bad_write_range.lock().unwrap() = None;
        rig.a().flush().unwrap();
        rig.assert_reopened_without_role_0_reads_right(stripe, p, &format!("{policy:?}"));
    }
}

/// The cluster simulator's seed 1767634 (plog, traced 2026-11-29 on a
/// build with a flush's directory commits in the pages' messages): a
/// partial write of a unit left records in both parity journals, flushed;
/// a whole-stripe write of the stripe appended its invalidation marks
/// (before its parity writes, unsynced), and the append on one parity's
/// device failed. That device's failure synced every device and committed
/// the journals' lengths, so the other parity's mark became durable and
/// *within* its journal's synced length, before the parity write it
/// stands for was issued. A power cut then dropped the whole write's data
/// and parity writes (the members left all matching their entries, as
/// untouched), and the next open lost a data member in service at the
/// stop: the mark ended the records for good, the parity as it was
/// lacked them, and the lost unit decoded from it as neither its flushed
/// nor its new bytes.
#[test]
fn a_whole_stripe_writes_mark_synced_by_a_failure_before_its_parity_write_never_reads_wrong() {
    for policy in POLICIES {
        let mut rig = Rig::filled_on_devices(policy, 16);
        let g = rig.geo();
        let stripe = 1;
        let sd = g.stripe_data_bytes();
        rig.write_journaled(stripe, 0, 62);
        // The marks go to parity 0's journal, then parity 1's: the second
        // append fails, after the first one.
        let q = rig.parity_device(stripe, 0);
        let p = rig.parity_device(stripe, 1);
        // Every unit of the stripe but the failing parity's as it lies on
        // its device: the cut drops what the whole write puts there.
        let units: Vec<(usize, usize, Vec<u8>)> = (0..g.width())
            .filter(|&role| g.place(stripe, role).device != p)
            .map(|role| {
                let place = g.place(stripe, role);
                let at = g.device_offset(place.row, 0) as usize;
                let len = g.unit_bytes() as usize;
                let bytes = rig.mems[place.device].with_bytes(|b| b[at..at + len].to_vec());
                (place.device, at, bytes)
            })
            .collect();
        let old: Vec<u8> = rig.model[(stripe * sd) as usize..((stripe + 1) * sd) as usize].to_vec();
        let journal = rig.journal_range_on_device(p, 1 << 20);
        *rig.plans[p].bad_write_range.lock().unwrap() = Some(journal);
        let whole = pattern(63, sd as usize);
        rig.a().write(&whole, stripe * sd, false).unwrap();
        *rig.plans[p].bad_write_range.lock().unwrap() = None;
        assert_eq!(
            rig.a().member_states()[p],
            MemberState::Failed,
            "{policy:?}: the failed append fails its device"
        );
        assert!(
            !rig.pending(stripe),
            "{policy:?}: {q}'s mark ended the records"
        );
        for (d, at, bytes) in &units {
            rig.mems[*d].with_bytes(|b| b[*at..*at + bytes.len()].copy_from_slice(bytes));
        }
        let role_0 = g.place(stripe, 0).device;
        rig.assert_reopened_without_reads_old_or_new(stripe, role_0, &old, &whole, policy);
    }
}

/// The same hole with no device failing: a flush (another request's,
/// which takes no stripe lock) syncs every device between a whole-stripe
/// write's marks and its data and parity writes; a cut drops those
/// writes. Counted synced by that flush, the marks ended the records for
/// good, both parities lacked them alike, and with one data member lost
/// at the next open its unit decoded, a spare vouching, as it was before
/// its flushed partial write.
#[test]
fn a_flush_between_a_whole_stripe_writes_marks_and_its_writes_never_reads_wrong() {
    for policy in POLICIES {
        let mut rig = Rig::filled_on_devices(policy, 16);
        let g = rig.geo();
        let stripe = 1;
        let sd = g.stripe_data_bytes();
        rig.write_journaled(stripe, 0, 64);
        let old: Vec<u8> = rig.model[(stripe * sd) as usize..((stripe + 1) * sd) as usize].to_vec();
        let role_0 = g.place(stripe, 0).device;
        // The whole write's batch waits at its first write, role 0's unit,
        // after its marks.
        rig.hold_unit_writes(role_0, stripe);
        let whole = pattern(65, sd as usize);
        std::thread::scope(|s| {
            let a = rig.array.as_ref().unwrap();
            let plan = &rig.plans[role_0];
            let write = s.spawn(|| a.write(&whole, stripe * sd, false));
            while !plan.held.load(SeqCst) {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            a.flush().unwrap();
            // The cut: nothing written from now on reaches a device.
            for plan in &rig.plans {
                plan.writes_before_crash.store(0, SeqCst);
            }
            plan.hold.store(false, SeqCst);
            write.join().unwrap().unwrap();
        });
        for plan in &rig.plans {
            plan.writes_before_crash.store(-1, SeqCst);
            *plan.hold_range.lock().unwrap() = None;
        }
        rig.assert_reopened_without_reads_old_or_new(stripe, role_0, &old, &whole, policy);
    }
}

/// An append to one parity member's journal that its writer saw fail (no
/// reply) and that lands later, after the journal's end went back over
/// it and the next record was written in its place: the later open found
/// the stale record where the newer one was. Kept in service, the member
/// folded it at the next open with a data member out, its parity lacked
/// the newer write, and the two parities disagreed. Format 2: the
/// append's error is the device's write error, which fails the device,
/// so its journal is never read again (`re-add` counts every stripe it
/// holds records for as missed). The cluster simulator has such late
/// requests; seeds 28455 and 52865 (plog with dedup) pass with this rule.
#[test]
fn an_append_without_a_reply_that_lands_later_never_reaches_parity() {
    for policy in POLICIES {
        let mut rig = Rig::filled_on_devices(policy, 16);
        let stripe = 1;
        let p = rig.parity_device(stripe, 0);
        let journal = rig.journal_range_on_device(p, 1 << 20);
        *rig.plans[p].late_write_range.lock().unwrap() = Some(journal);
        rig.write(rig.volume_offset(stripe, 1, 0), &pattern(64, 4096));
        *rig.plans[p].late_write_range.lock().unwrap() = None;
        // The journal takes records again after a replay reserves it.
        rig.a().replay_all(None).unwrap();
        rig.write(rig.volume_offset(stripe, 2, 0), &pattern(65, 4096));
        let late = std::mem::take(&mut *rig.plans[p].late_writes.lock().unwrap());
        assert!(!late.is_empty(), "{policy:?}: the append was held back");
        for (at, bytes) in late {
            rig.mems[p].write_at(&bytes, at).unwrap();
        }
        rig.a().flush().unwrap();
        rig.assert_reopened_without_role_0_reads_right(stripe, p, &format!("{policy:?}"));
    }
}

#[test]
fn a_replay_whose_invalidation_a_cut_dropped_is_not_folded_again_into_a_missing_units_decode() {
    // A flushed parix write of one block; a replay folds it into parity
    // and logs its invalidation; a power cut keeps the parity writes and
    // drops the invalidations (the journals restored to what they held
    // before the replay); the block's own member is lost before the next
    // open's resync (the cluster simulator's seed 68227: a server down at
    // the takeover after a power loss of every server).
    let mut rig = Rig::filled(WritePolicy::Parix, 4, JOURNAL_BYTES_DEFAULT);
    let stripe = 1;
    let role = 2;
    let at = rig.volume_offset(stripe, role, 0);
    rig.write(at, &pattern(61, 4096));
    rig.a().flush().unwrap();
    assert!(rig.pending(stripe));
    let parity: Vec<usize> = (0..2).map(|j| rig.parity_device(stripe, j)).collect();
    let journals: Vec<Vec<u8>> = parity
        .iter()
        .map(|&p| std::fs::read(rig.journal_path(p)).unwrap())
        .collect();
    rig.a().replay_all(None).unwrap();
    assert!(!rig.pending(stripe));
    rig.a().flush().unwrap();
    let g = rig.geo();
    rig.array.take().unwrap().simulate_crash();
    for (&p, bytes) in parity.iter().zip(&journals) {
        std::fs::write(rig.journal_path(p), bytes).unwrap();
    }
    let mut devs = rig.devices();
    devs[g.place(stripe, role).device] = None;
    let array = Array::open_with_devices(rig.dir.path(), devs, None).unwrap();
    let mut got = vec![0u8; 4096];
    match array.read(&mut got, at) {
        Ok(()) => assert!(
            got[..] == rig.model[at as usize..at as usize + 4096],
            "the flushed block decodes as neither its bytes nor an error (its records folded \
             twice into parity)"
        ),
        Err(e) => panic!("the flushed block fails to read ({e}), though its d(r) is logged"),
    }
}

/// A plog write in flight at a cut that keeps its parity-journal records
/// and drops its data write (the data member's writes after it lost),
/// then two members lost before the next open's resync: the member of
/// another data unit of the row and parity 1. The replay at that open
/// (`replay_degraded`) folds parity 0's delta against data that never
/// took the write, warns that the row cannot be told, and writes the
/// folded parity with a fresh entry; the resync then sees no member
/// that differs from its entry, and the lost data unit decodes from the
/// k members left unchecked, as bytes never written to it. The
/// mechanism of the cluster simulator's seeds 28455 and 52865 on
/// cce0370 (plog with dedup: a block never written read as other
/// bytes), which pass since e35e3ce only because a failed append now
/// fails its device, so their later writes go the degraded path.
///
/// It failed on main cb8fe88 and 22f4057 (the never-written block read
/// as other bytes; branch pld) and passes since a row whose fold took a
/// record appended after the last flush is marked unreadable (format 2,
/// branch fm: the journal's synced length tells those records apart).
#[test]
fn a_plog_delta_whose_data_write_a_cut_dropped_is_not_decoded_through_after_a_double_fault() {
    let mut rig = Rig::filled_on_devices(WritePolicy::Plog, 16);
    let g = rig.geo();
    let stripe = 1;
    let d0 = g.place(stripe, 0).device;
    let lost = [g.place(stripe, 1).device, rig.parity_device(stripe, 1)];
    let written = rig.volume_offset(stripe, 0, 0);
    let read_at = rig.volume_offset(stripe, 1, 0);
    let old_written = rig.model[written as usize..written as usize + 4096].to_vec();
    let old = rig.model[read_at as usize..read_at as usize + 4096].to_vec();
    let new = pattern(77, 4096);
    rig.plans[d0].writes_before_crash.store(0, SeqCst);
    rig.write(written, &new);
    rig.array.take().unwrap().simulate_crash();
    rig.plans[d0].writes_before_crash.store(-1, SeqCst);
    let mut devs = rig.devices();
    for d in lost {
        devs[d] = None;
    }
    let array = Array::open_with_devices(rig.dir.path(), devs, None).unwrap();
    let mut got = vec![0u8; 4096];
    if array.read(&mut got, written).is_ok() {
        assert!(
            got == old_written || got == new,
            "the written block reads neither its old nor its new bytes: {:?}",
            array.warnings()
        );
    }
    if array.read(&mut got, read_at).is_ok() {
        assert!(
            got == old,
            "a block never written reads other bytes: {:?}",
            array.warnings()
        );
    }
}

/// The cluster simulator, seed 73757 (plog): every server lost power with
/// a plog write in flight; the cut kept its delta record in the parity
/// journals and dropped the in-place data write; the next open found two
/// other data members out, and its degraded replay folded the delta into
/// parity against data that never took it: the missing blocks decoded
/// from the four left, unchecked, as neither their old nor their new
/// bytes. In format 2 a record past its journal's synced length was
/// appended after the last flush: such a row's parity is marked
/// unreadable (its missing blocks read as I/O errors), while a row whose
/// records were flushed folds as before and reads right.
#[test]
fn a_record_not_flushed_whose_data_write_a_cut_dropped_never_decodes_a_missing_unit_wrong() {
    for policy in POLICIES {
        let mut rig = Rig::filled_on_devices(policy, 16);
        let g = rig.geo();
        let stripe = 1;
        let offset = |role: u64, b: u64| {
            (stripe * g.stripe_data_bytes() + role * g.unit_bytes() + b * g.block()) as usize
        };
        // Row 0: a flushed partial write (its record stays in the journals).
        rig.write_journaled(stripe, 0, 70);
        // Row 1: a partial write never flushed, whose in-place data write
        // the cut drops while its records stay.
        let place = g.place(stripe, 1);
        let on_device = g.device_offset(place.row, 1) as usize;
        let old = rig.mems[place.device].with_bytes(|b| b[on_device..on_device + 4096].to_vec());
        let at = rig.volume_offset(stripe, 1, 1);
        rig.a().write(&pattern(71, 4096), at, false).unwrap();
        rig.mems[place.device].with_bytes(|b| b[on_device..on_device + 4096].copy_from_slice(&old));
        // The members of roles 2 and 3 are lost at the next open.
        let mut devs = rig.devices();
        for role in [2, 3] {
            devs[g.place(stripe, role as usize).device] = None;
        }
        rig.array.take().unwrap().simulate_crash();
        let array = Array::open_with_devices(rig.dir.path(), devs, None).unwrap();
        for role in [2, 3] {
            let at = offset(role, 0);
            let mut got = vec![0u8; 4096];
            array.read(&mut got, at as u64).unwrap_or_else(|e| {
                panic!(
                    "{policy:?}: role {role} of the flushed row fails to read: {e}: {:?}",
                    array.warnings()
                )
            });
            assert!(
                got[..] == rig.model[at..at + 4096],
                "{policy:?}: role {role} of the flushed row reads wrong"
            );
            let at = offset(role, 1);
            if array.read(&mut got, at as u64).is_ok() {
                assert!(
                    got[..] == rig.model[at..at + 4096],
                    "{policy:?}: role {role} of the row not flushed reads neither its bytes \
                     nor an error (decoded through parity that folded a dropped write)"
                );
            }
        }
    }
}

/// A whole-stripe write in flight at a cut that kept its data and parity
/// writes and dropped the invalidation marks it appended first (the
/// cluster simulator's seed 1591 on branch `flush-rt`, parix): the
/// journals still held an older, flushed partial write's records, the
/// next open lost two data members (one with no logged d(r)), and its
/// degraded replay folded those records into parity that the whole
/// write had replaced, then wrote it with fresh entries, so the resync
/// saw no member changed since the last flush and the missing units
/// decoded unchecked. The members changed since the last flush are told
/// before the fold (`rows_torn_unlogged`), and such a row that nothing
/// vouches for reads as an I/O error, never as other bytes.
#[test]
fn a_whole_stripe_write_whose_invalidation_a_cut_dropped_never_decodes_through_a_second_fold() {
    for policy in POLICIES {
        let mut rig = Rig::filled_on_devices(policy, 16);
        let g = rig.geo();
        let stripe = 1;
        rig.write_journaled(stripe, 2, 80);
        // The parity journals as they are, to put back after the whole
        // write: the cut drops its invalidation marks, keeps the rest.
        let saved = rig.parity_journals_on_devices(stripe);
        // The data units of roles 0 and 1 (the members left) as they
        // are: the cut drops their writes too, so only the parity
        // members changed since the last flush.
        let kept: Vec<(usize, usize, Vec<u8>)> = [0usize, 1]
            .iter()
            .map(|&role| {
                let place = g.place(stripe, role);
                let at = g.device_offset(place.row, 0) as usize;
                let len = g.unit_bytes() as usize;
                let bytes = rig.mems[place.device].with_bytes(|b| b[at..at + len].to_vec());
                (place.device, at, bytes)
            })
            .collect();
        let sd = g.stripe_data_bytes();
        rig.a()
            .write(&pattern(81, sd as usize), stripe * sd, false)
            .unwrap();
        for (d, at, bytes) in &kept {
            rig.mems[*d].with_bytes(|b| b[*at..*at + bytes.len()].copy_from_slice(bytes));
        }
        rig.put_back(&saved);
        let new = pattern(81, sd as usize);
        let mut devs = rig.devices();
        for role in [2, 3] {
            devs[g.place(stripe, role).device] = None;
        }
        let offsets: Vec<u64> = [2u64, 3]
            .iter()
            .map(|&role| rig.volume_offset(stripe, role as usize, 0))
            .collect();
        rig.array.take().unwrap().simulate_crash();
        let array = Array::open_with_devices(rig.dir.path(), devs, None).unwrap();
        for (i, &at) in offsets.iter().enumerate() {
            let mut got = vec![0u8; 4096];
            if array.read(&mut got, at).is_ok() {
                let within = (at - stripe * sd) as usize;
                assert!(
                    got[..] == rig.model[at as usize..at as usize + 4096]
                        || got[..] == new[within..within + 4096],
                    "{policy:?}: role {} reads neither its old nor its new bytes: {:?}",
                    i + 2,
                    array.warnings()
                );
            }
        }
    }
}

/// The cluster simulator's seed 1323488 (plog beside rmw, traced on
/// f91c932): a partial write of a unit left its records in both parity
/// journals after the last flush; a whole-stripe write of the stripe then
/// appended its marks and wrote every member; a power cut kept the data
/// and parity writes and dropped the marks; the next open lost the unit's
/// member (in service at the stop). The degraded replay folded the unit's
/// records over parity that the whole write had replaced: a record of a
/// missing unit moves every parity alike, so the spare member vouched for
/// the fold, and the unit decoded as neither write (its whole write's
/// bytes plus the partial write's delta). A record appended after the last
/// flush may come before the change of its parity (the fold is right) or
/// after it (a lost mark: the fold is wrong), and with the unit's entry
/// lost with its member nothing tells which: the row reads as an I/O error
/// until rewritten, never as other bytes. (Parix logs the unit's d(r), its
/// value, and reads it.)
#[test]
fn a_lost_mark_over_records_not_flushed_never_decodes_through_a_second_fold() {
    for policy in POLICIES {
        let mut rig = Rig::filled_on_devices(policy, 16);
        let g = rig.geo();
        let stripe = 1;
        let sd = g.stripe_data_bytes();
        let at = rig.volume_offset(stripe, 3, 0);
        let old = rig.model[at as usize..at as usize + 4096].to_vec();
        let partial = pattern(80, 4096);
        rig.write(at, &partial);
        assert!(rig.pending(stripe), "the write is journaled");
        // The parity members' metadata areas with the records, to put back
        // after the whole write: the cut drops its marks (and the journal
        // growth with them) and keeps its data and parity writes.
        let saved: Vec<(usize, u64, Vec<u8>)> = (0..g.m())
            .map(|j| {
                let p = rig.parity_device(stripe, j);
                let (from, to) = (g.meta_area_offset(), g.data_offset());
                let bytes = rig.mems[p].with_bytes(|b| b[from as usize..to as usize].to_vec());
                (p, from, bytes)
            })
            .collect();
        let whole = pattern(81, sd as usize);
        rig.write(stripe * sd, &whole);
        rig.put_back(&saved);
        let others = rig.row_offsets(stripe)[..3].to_vec();
        let array = rig.crash_and_reopen_without(&[g.place(stripe, 3).device]);
        let mut got = vec![0u8; 4096];
        if array.read(&mut got, at).is_ok() {
            let within = (at - stripe * sd) as usize;
            assert!(
                got == old || got == partial || got[..] == whole[within..within + 4096],
                "{policy:?}: role 3 reads none of its writes (a record folded over parity \
                 a whole-stripe write replaced): {:?}",
                array.warnings()
            );
        }
        // The members left read as the whole write left them.
        for (role, &at) in others.iter().enumerate() {
            array.read(&mut got, at).unwrap();
            let within = (at - stripe * sd) as usize;
            assert!(
                got[..] == whole[within..within + 4096],
                "{policy:?}: role {role} reads wrong"
            );
        }
        // Rewritten, the block reads back.
        let again = pattern(82, 4096);
        array.write(&again, at, false).unwrap();
        array.read(&mut got, at).unwrap();
        assert!(got == again, "{policy:?}: role 3 rewritten reads wrong");
    }
}

/// The cluster simulator's seeds 845757, 868189 and 1277558 (plog, and
/// parix): a fold while serving, with a data member out, logged that
/// member's value in the degraded-write log and wrote both parities; a
/// cut kept one parity write, dropped the other and the marks. The next
/// open lost a second data member and folded the records into both
/// parities again: the one that held them already went back to what it
/// held before them, the row was not one codeword, and it was poisoned
/// (an I/O error on a flushed block). Where a parity changed since the
/// last flush, the replay now also decodes with its block as read (the
/// records already in it), and takes the row where one choice alone is
/// one codeword that a spare member vouches for.
#[test]
fn a_fold_that_landed_on_one_parity_is_not_folded_again_when_a_second_member_is_lost() {
    for policy in POLICIES {
        // The record on the member lost at the open, on one left, or on
        // the member out while serving (role 3: under parix its latest
        // d(r), its value, is a member of the decode, without which the
        // row is exactly k members with nothing to vouch: seed 1241874),
        // parity 1's write dropped or torn (its first half old, the rest
        // new), and in `both`, parity 0's torn too (its first quarter old:
        // with the record's unit lost, only the records' base tells it).
        let cases = [
            (0usize, false, false),
            (0, true, false),
            (0, true, true),
            (2, false, false),
            (2, true, false),
            (3, false, false),
            (3, true, false),
            (3, true, true),
        ];
        for (record_role, torn, both) in cases {
            let (mut rig, out) = Rig::journaled_with_unit_3_out(policy, record_role);
            let g = rig.geo();
            let stripe = 1;
            // Before the fold: each parity journal, and parity 1's block.
            let journals = rig.parity_journals_on_devices(stripe);
            let p1 = rig.parity_device(stripe, 1);
            let p1_at = g.device_offset(g.place(stripe, g.k() + 1).row, 0);
            let kept = if torn { 2048 } else { g.unit_bytes() as usize };
            let p1_block = rig.mems[p1].with_bytes(|b| b[p1_at as usize..][..kept].to_vec());
            let p0 = rig.parity_device(stripe, 0);
            let p0_at = g.device_offset(g.place(stripe, g.k()).row, 0);
            let p0_block = rig.mems[p0].with_bytes(|b| b[p0_at as usize..][..1024].to_vec());
            rig.a().replay_stripe(stripe).unwrap();
            assert!(
                !rig.pending(stripe),
                "{policy:?}: the fold ended the records"
            );
            // The cut: parity 0's write kept, parity 1's (or its first
            // half) and the marks dropped (a length hint that names them
            // may survive: the open then finds a torn tail and resyncs
            // those stripes).
            rig.put_back(&journals);
            rig.put_back(&[(p1, p1_at, p1_block)]);
            if both {
                rig.put_back(&[(p0, p0_at, p0_block)]);
            }
            let offsets = rig.row_offsets(stripe);
            let array = rig.crash_and_reopen_without(&[out, g.place(stripe, 0).device]);
            let mut got = vec![0u8; 4096];
            for (role, &at) in offsets.iter().enumerate() {
                // The torn cases with the record on the member lost: two
                // choices are codewords (its old and its new bytes) in the
                // sectors where the parities disagree, or where both are
                // old, which `decode_folded_or_not` cannot tell; the
                // records' base tells each parity, sector by sector.
                if let Err(e) = array.read(&mut got, at) {
                    panic!(
                        "{policy:?}, record of role {record_role}, torn {torn}, both {both}: \
                         role {role} (flushed) fails to read: {e}: {:?}",
                        array.warnings()
                    );
                }
                assert!(
                    got[..] == rig.model[at as usize..at as usize + 4096],
                    "{policy:?}, record of role {record_role}, torn {torn}, both {both}: role \
                     {role} reads wrong"
                );
            }
        }
    }
}

/// The cluster simulator's seed 1177955 (plog; docs/write-hole.md, "A
/// fold whose mark the cut lost"): a flushed partial write left records
/// in both parity journals; a fold while serving, a data member out,
/// wrote both parities and appended both marks; the cut kept both parity
/// writes and parity 0's mark and dropped parity 1's, so parity 1's
/// journal still held the records its parity had taken. The next open
/// lost a second data member and folded them into parity 1 again: the
/// parities disagreed and the row was poisoned (an I/O error on a
/// flushed block). That case reads right since the replay also weighs a
/// changed parity as read (`decode_folded_or_not`: parity 0, its records
/// ended, pins the row). With both marks lost and the record's own unit
/// lost, "both parities hold the records" and "neither does" are both
/// codewords: an I/O error until records carried their rows' base (each
/// parity block is its base with them folded in: it holds them). Every
/// block reads its flushed bytes.
#[test]
fn a_fold_whose_marks_the_cut_lost_is_not_folded_again() {
    for policy in POLICIES {
        // The record's unit lost (a record of a unit left is the test
        // above's case).
        for (record_role, both) in [(0usize, false), (0, true)] {
            let (mut rig, out) = Rig::journaled_with_unit_3_out(policy, record_role);
            let g = rig.geo();
            let stripe = 1;
            let journals = rig.parity_journals_on_devices(stripe);
            rig.a().replay_stripe(stripe).unwrap();
            assert!(
                !rig.pending(stripe),
                "{policy:?}: the fold ended the records"
            );
            // The cut: parity 1's mark dropped (or both), everything
            // else kept.
            rig.put_back(&journals[if both { 0 } else { 1 }..]);
            let offsets = rig.row_offsets(stripe);
            let array = rig.crash_and_reopen_without(&[out, g.place(stripe, 0).device]);
            let mut got = vec![0u8; 4096];
            for (role, &at) in offsets.iter().enumerate() {
                let read = array.read(&mut got, at);
                assert!(
                    read.is_ok(),
                    "{policy:?}, record of role {record_role}, both marks lost {both}: role \
                     {role} (flushed): {read:?}, {:?}",
                    array.warnings()
                );
                assert!(
                    got[..] == rig.model[at as usize..at as usize + 4096],
                    "{policy:?}, record of role {record_role}, both marks lost {both}: role \
                     {role} reads wrong"
                );
            }
        }
    }
}

/// Why a parity's own entry cannot say whether it holds the records
/// (docs/write-hole.md, "A fold whose mark the cut lost"): a whole-stripe
/// write changes unit 0 from A to B, a partial write puts it back to A
/// (its records, the delta B to A, made durable by a member's failure,
/// which syncs every journal and device and writes no checksum page), a
/// fold while serving (logging the failed member's value) has its parity
/// writes and marks dropped by a cut, and the next open loses unit 0's
/// member. The parity as read is B's, and with the records folded A's,
/// which its entry (of the last flush, before both writes) records: "the
/// records are what changed it since its entry" takes B's parity and
/// decodes unit 0 as B, the write the partial one undid. Unit 0 must read
/// A, or an I/O error; never B.
#[test]
fn a_parity_whose_folded_value_is_its_entry_is_not_taken_to_hold_the_records() {
    for policy in [WritePolicy::Plog] {
        let mut rig = Rig::filled_on_devices(policy, 16);
        let g = rig.geo();
        let stripe = 1;
        let sd = g.stripe_data_bytes() as usize;
        let at = rig.volume_offset(stripe, 0, 0);
        let a = rig.model[at as usize..at as usize + 4096].to_vec();
        // The whole stripe as it is, but unit 0's first block.
        let mut whole = rig.model[stripe as usize * sd..][..sd].to_vec();
        let b = pattern(95, 4096);
        whole[..4096].copy_from_slice(&b);
        rig.write(stripe * sd as u64, &whole);
        rig.write(at, &a);
        assert!(
            rig.pending(stripe),
            "{policy:?}: the write back is journaled"
        );
        let out = g.place(stripe, 3).device;
        rig.a().fail_device(out).unwrap();
        // Before the fold: the journals and both parity units.
        let mut saved = rig.parity_journals_on_devices(stripe);
        for j in 0..g.m() {
            let p = rig.parity_device(stripe, j);
            let from = g.device_offset(g.place(stripe, g.k() + j).row, 0);
            let unit =
                rig.mems[p].with_bytes(|d| d[from as usize..][..g.unit_bytes() as usize].to_vec());
            saved.push((p, from, unit));
        }
        rig.a().replay_stripe(stripe).unwrap();
        rig.put_back(&saved);
        let array = rig.crash_and_reopen_without(&[out, g.place(stripe, 0).device]);
        let mut got = vec![0u8; 4096];
        if array.read(&mut got, at).is_ok() {
            assert!(
                got == a,
                "{policy:?}: unit 0 reads {} (the write its partial write undid is B): {:?}",
                if got == b { "B" } else { "neither A nor B" },
                array.warnings()
            );
        }
    }
}

/// A fold whose marks were never appended (docs/write-hole.md): a
/// partial write of unit 0, flushed; a fold while serving writes both
/// parities, and its writer stops before its marks (killed, or fenced by a
/// takeover: no cut, the parity writes are in place); the next open has
/// lost a data member. The records are live and the parity holds them:
/// folded again, a record of the lost unit moves every parity alike and
/// the spare vouches for the unit's bytes before its write (plog read it
/// wrong, without an error, until 2026-11-29). Then a record of the
/// unit lost left its row unknowable (an I/O error) until records carried
/// their rows' bases (2026-11-29, evening): each parity block is its
/// records' base with them folded in, so it holds them, and every block
/// reads its flushed bytes (without that rule it fails here).
#[test]
fn a_fold_whose_marks_were_never_appended_never_reads_wrong() {
    for policy in POLICIES {
        for lost_role in [0usize, 1] {
            let mut rig = Rig::filled_on_devices(policy, 16);
            let g = rig.geo();
            let stripe = 1;
            rig.write_journaled(stripe, 0, 90);
            let journals = rig.parity_journals_on_devices(stripe);
            rig.a().replay_stripe(stripe).unwrap();
            rig.put_back(&journals);
            let offsets = rig.row_offsets(stripe);
            let array = rig.crash_and_reopen_without(&[g.place(stripe, lost_role).device]);
            let mut got = vec![0u8; 4096];
            for (role, &at) in offsets.iter().enumerate() {
                let read = array.read(&mut got, at);
                assert!(
                    read.is_ok(),
                    "{policy:?}, unit {lost_role} lost: unit {role}: {read:?}, {:?}",
                    array.warnings()
                );
                assert!(
                    got[..] == rig.model[at as usize..at as usize + 4096],
                    "{policy:?}, unit {lost_role} lost: unit {role} reads wrong: {:?}",
                    array.warnings()
                );
            }
        }
    }
}

/// A flush writes every device's checksum pages before it syncs the
/// devices, and commits each parity journal's length only after the
/// syncs; an entry is set once its block's write was answered. So a cut
/// during a flush can keep a page and drop the parity write it describes
/// (an entry ahead of its block), or keep everything but the journals'
/// lengths: either way a mark past the journal's synced length finds the
/// parity's entry saying nothing of whether its write landed. Here a
/// flushed partial write of unit 0 left records in both parity journals;
/// then either a clean replay folded them (parity writes, then the marks
/// that end them) or a whole-stripe write superseded them (the marks,
/// then every member's write); a flush began, and the cut kept the pages
/// and the marks and dropped the journals' length commits, with the
/// parity writes dropped too or kept. The next open loses unit 0's or
/// unit 1's member. The open read the fold's parity as landed where it
/// had not, and as not landed where it had (folding the records again),
/// and the whole write's parity as not landed: in each case unit 0
/// decoded from a row the spare vouched for, to bytes neither written
/// (reasoned on 2026-11-29, this test the same day). Since, each mark
/// carries its parity rows' checksums after its write, which the parity
/// block is checked against. Blocks a fold leaves read their flushed
/// bytes; a whole write in flight reads old or new, or (its parity
/// dropped, a member lost: the double fault) an I/O error.
#[test]
fn an_entry_ahead_of_its_fold_never_reads_wrong() {
    for policy in POLICIES {
        for whole in [false, true] {
            for parity_landed in [false, true] {
                // Unit 1's loss only for the fold (the whole write's case
                // is the same on either side).
                for lost_role in [0usize, 1].into_iter().take(if whole { 1 } else { 2 }) {
                    let case = format!(
                        "{policy:?}, {}, parity {}, unit {lost_role} lost",
                        if whole { "whole write" } else { "fold" },
                        if parity_landed { "landed" } else { "dropped" },
                    );
                    entry_ahead_case(policy, whole, parity_landed, lost_role, &case);
                }
            }
        }
    }
}

fn entry_ahead_case(
    policy: WritePolicy,
    whole: bool,
    parity_landed: bool,
    lost: usize,
    case: &str,
) {
    let mut rig = Rig::filled_on_devices(policy, 16);
    let g = rig.geo();
    let stripe = 1;
    rig.write_journaled(stripe, 0, 90);
    let offsets = rig.row_offsets(stripe);
    let flushed: Vec<Vec<u8>> = offsets
        .iter()
        .map(|&at| rig.model[at as usize..at as usize + 4096].to_vec())
        .collect();
    // What the cut drops: each parity unit's write (unless it landed) and
    // its journal's length commit (the metadata area's directory slots).
    let mut saved = Vec::new();
    for j in 0..g.m() {
        let place = g.place(stripe, g.k() + j);
        if !parity_landed {
            let from = g.device_offset(place.row, 0);
            let unit = rig.mems[place.device]
                .with_bytes(|b| b[from as usize..(from + g.unit_bytes()) as usize].to_vec());
            saved.push((place.device, from, unit));
        }
        let area = rig.a().meta.as_ref().unwrap().area(place.device).unwrap();
        let at = area.device_offset();
        let slots_end = at + 2 * crate::media::area::DIR_SLOT_BYTES;
        let slots =
            rig.mems[place.device].with_bytes(|b| b[at as usize..slots_end as usize].to_vec());
        saved.push((place.device, at, slots));
    }
    if whole {
        let sd = g.stripe_data_bytes();
        rig.write(stripe * sd, &pattern(91, sd as usize));
    } else {
        rig.a().replay_stripe(stripe).unwrap();
    }
    rig.a().flush().unwrap();
    rig.put_back(&saved);
    let array = rig.crash_and_reopen_without(&[g.place(stripe, lost).device]);
    let mut got = vec![0u8; 4096];
    for (role, &at) in offsets.iter().enumerate() {
        let new = &rig.model[at as usize..at as usize + 4096];
        match array.read(&mut got, at) {
            Ok(()) => assert!(
                got[..] == flushed[role][..] || (whole && got[..] == new[..]),
                "{case}: unit {role} reads wrong: {:?}",
                array.warnings()
            ),
            Err(e) => assert!(
                whole && !parity_landed,
                "{case}: unit {role} fails to read: {e}: {:?}",
                array.warnings()
            ),
        }
    }
}

/// The cluster simulator's seed 52865 (plog with dedup on both volumes,
/// with the failed-append rule of e35e3ce taken out), on one machine: a
/// stripe's parity written with its journals' records already in it (a
/// resync from the data there, a whole-stripe write here), a data
/// member's failure recorded (which syncs every journal and device), and
/// the marks that end those records lost (in 52865 appended after the
/// failure's sync and dropped by the cut; here the journals are put
/// back as they were before them). The next open, that member out since
/// before it, replayed the stripe degraded and folded the records
/// again into parity that held them, which took it back to what it held
/// before them, and the member's block decoded from the four left,
/// unchecked, as neither its old nor its new bytes. A parity that changed
/// since the last flush and whose journal holds records for its row may
/// already hold them: such a row that nothing vouches for is marked
/// unreadable, so the block reads as an I/O error until rewritten.
#[test]
fn a_parity_that_holds_its_records_already_is_not_folded_again_for_a_member_out_before_the_open() {
    for policy in POLICIES {
        let mut rig = Rig::filled_on_devices(policy, 16);
        let g = rig.geo();
        let stripe = 1;
        rig.write_journaled(stripe, 2, 90);
        // The parity journals as they are, to put back: the cut drops the
        // marks that end these records.
        let saved = rig.parity_journals_on_devices(stripe);
        let sd = g.stripe_data_bytes();
        let at = rig.volume_offset(stripe, 0, 0);
        let old = rig.model[at as usize..at as usize + 4096].to_vec();
        rig.write(stripe * sd, &pattern(91, sd as usize));
        // Parity 1's member, then role 0's, fail: recorded out in the
        // superblocks, which syncs every journal and device.
        let lost = [rig.parity_device(stripe, 1), g.place(stripe, 0).device];
        for d in lost {
            rig.a().fail_device(d).unwrap();
        }
        rig.put_back(&saved);
        let others: Vec<u64> = (1..g.k())
            .map(|role| rig.volume_offset(stripe, role, 0))
            .collect();
        let mut devs = rig.devices();
        for d in lost {
            devs[d] = None;
        }
        rig.array.take().unwrap().simulate_crash();
        let array = Array::open_with_devices(rig.dir.path(), devs, None).unwrap();
        let mut got = vec![0u8; 4096];
        if array.read(&mut got, at).is_ok() {
            assert!(
                got[..] == rig.model[at as usize..at as usize + 4096] || got == old,
                "{policy:?}: role 0 reads neither its old nor its new bytes (the records \
                 folded again into parity that held them): {:?}",
                array.warnings()
            );
        }
        // The other blocks of the stripe read as written.
        for (role, &at) in (1..).zip(&others) {
            array.read(&mut got, at).unwrap();
            assert!(
                got[..] == rig.model[at as usize..at as usize + 4096],
                "{policy:?}: role {role} reads wrong"
            );
        }
        // Rewritten, the block reads back.
        let again = pattern(92, 4096);
        array.write(&again, at, false).unwrap();
        array.read(&mut got, at).unwrap();
        assert!(got == again, "{policy:?}: role 0 rewritten reads wrong");
    }
}

/// The cluster simulator, seed 43529 (parix beside plog): a flushed
/// partial write left records in the parity journals; a data member
/// failed (recorded out), and a replay while serving folded the records
/// into both parities, the missing unit's value logged first in the
/// degraded-write log; no flush came after. The next open lost another
/// data member (in service at the stop), so the row had exactly k
/// members left, two of them parity blocks that no longer matched their
/// entries (the fold's fresh entries are written at a flush): the resync
/// took the row for one a write in flight had torn and marked it
/// unreadable, and flushed blocks read as I/O errors. The logged value
/// is a member known beyond the k left, a spare: where they are one
/// codeword, it vouches for the decode of the other missing unit.
#[test]
fn a_fold_after_the_last_flush_with_a_logged_missing_unit_leaves_the_row_readable_after_a_second_loss(
) {
    for policy in POLICIES {
        let mut rig = Rig::filled_on_devices(policy, 16);
        let g = rig.geo();
        let stripe = 1;
        rig.write_journaled(stripe, 0, 93);
        let out = g.place(stripe, 3).device;
        let lost = g.place(stripe, 1).device;
        rig.a().fail_device(out).unwrap();
        // A degraded read of the missing unit replays the stripe (not
        // `replay_all`, which flushes after).
        let mut got = vec![0u8; g.unit_bytes() as usize];
        let at3 = rig.volume_offset(stripe, 3, 0);
        rig.a().read(&mut got, at3).unwrap();
        assert!(
            !rig.pending(stripe),
            "{policy:?}: the replay folded the records"
        );
        rig.assert_reopened_without_reads_right(stripe, &[out, lost], &format!("{policy:?}"));
    }
}

/// The cluster simulator's seed 177513 (plog with dedup on both volumes,
/// on 2afe4b7): a flushed partial write left delta records for stripe
/// 20 in both parity journals; a whole-stripe write ended them with an
/// invalidation mark in each journal (not synced) and wrote every
/// member; a FUA write of other stripes then synced every device (each
/// device's sync writes all its dirty checksum pages) but only those
/// stripes' parity journals, one of which was parity 0's and not parity
/// 1's. The power loss of every server lost parity 1's mark, and kept
/// its parity and that parity's entry (below, end to end). A FUA write
/// now syncs the journal of every device it syncs: nothing it makes
/// durable there outlives the marks appended before it.
#[test]
fn a_fua_write_syncs_the_journal_of_every_device_it_syncs() {
    for policy in POLICIES {
        let mut rig = Rig::filled_on_devices(policy, 16);
        let g = rig.geo();
        let stripe = 1;
        rig.write_journaled(stripe, 0, 94);
        // A whole-stripe write: its marks end the records, unsynced.
        let sd = g.stripe_data_bytes();
        rig.write(stripe * sd, &pattern(95, sd as usize));
        assert!(
            !rig.pending(stripe),
            "{policy:?}: the marks end the records"
        );
        let p1 = rig.parity_device(stripe, 1);
        rig.fua_write_without_parity_on(stripe, p1, 96);
        for d in 0..rig.mems.len() {
            let past = rig.a().stores[d]
                .journal_held()
                .as_ref()
                .map_or(0, |j| j.bytes_past_sync());
            assert_eq!(
                past, 0,
                "{policy:?}: device {d} was synced by the FUA write, and its journal \
                 holds {past} bytes past its last sync (parity 1 of stripe {stripe} is \
                 device {p1})"
            );
        }
    }
}

/// Seed 177513's path end to end on one machine (format 2, dedup of
/// parity, as both of its volumes): a flushed partial write's records,
/// a whole-stripe write whose marks end them (not synced), and a FUA
/// write of a stripe without parity on parity 1's device, which holds
/// one of its data units. That device's sync goes through its dedup
/// layer, whose log's sync commits the metadata area's directory: the
/// journal's committed length stays at its last sync, and the length
/// hint that covers the mark is written again for the new directory,
/// unsynced. A cut that drops that hint (staged here: the area's hints
/// zeroed) leaves the journal, at the next open, without the mark,
/// while the parity and its checksum entry (the FUA wrote every dirty
/// page of the device) hold the whole-stripe write. With data roles 0
/// and 2 lost at that open, the degraded replay folded the records
/// again, no rule marking the row (flushed records, every member left
/// matching its entry), and both blocks decoded from the four left,
/// unchecked, as neither their old nor their new bytes. A FUA write now
/// syncs the journal of every device it syncs, so the mark outlives the
/// cut.
#[test]
fn a_whole_stripe_writes_mark_survives_a_cut_after_a_fua_write_synced_its_parity() {
    for policy in POLICIES {
        let dedup = DedupConfig {
            policy: crate::dedup::Policy::Parity,
            ..DedupConfig::default()
        };
        let mut rig =
            Rig::filled_with_dedup(policy, 16, 4 << 20, MetadataPlacement::Devices, dedup);
        let g = rig.geo();
        let stripe = 1;
        let sd = g.stripe_data_bytes();
        rig.write_journaled(stripe, 0, 97);
        let missing = [0usize, 2];
        let before: Vec<Vec<u8>> = missing
            .iter()
            .map(|&role| {
                let at = rig.volume_offset(stripe, role, 0) as usize;
                rig.model[at..at + 4096].to_vec()
            })
            .collect();
        rig.write(stripe * sd, &pattern(98, sd as usize));
        let p1 = rig.parity_device(stripe, 1);
        let area = rig.a().meta.as_ref().unwrap().area(p1).unwrap();
        let base = area.device_offset() as usize;
        // The sequence of the area's directory on the device (the higher
        // of its two slots).
        let seq = |rig: &Rig| {
            rig.mems[p1].with_bytes(|b| {
                [0usize, 64 << 10]
                    .map(|slot| {
                        let at = base + slot + 16;
                        u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
                    })
                    .into_iter()
                    .max()
                    .unwrap()
            })
        };
        let seq_before = seq(&rig);
        rig.fua_write_without_parity_on(stripe, p1, 99);
        assert!(
            seq(&rig) > seq_before,
            "{policy:?}: the FUA write's sync of device {p1} committed its metadata area"
        );
        // The cut: every length hint written since that commit's sync
        // dropped (it wrote the directory, synced, then the hints).
        rig.mems[p1].with_bytes(|b| b[base + (128 << 10)..base + (192 << 10)].fill(0));
        let mut devs = rig.devices();
        for &role in &missing {
            devs[g.place(stripe, role).device] = None;
        }
        rig.array.take().unwrap().simulate_crash();
        let array = Array::open_with_devices(rig.dir.path(), devs, None).unwrap();
        for (&role, old) in missing.iter().zip(&before) {
            let at = (stripe * sd + role as u64 * g.unit_bytes()) as usize;
            let mut got = vec![0u8; 4096];
            if array.read(&mut got, at as u64).is_ok() {
                assert!(
                    got[..] == rig.model[at..at + 4096] || got == *old,
                    "{policy:?}: role {role} reads neither its old nor its new bytes (records \
                     ended by a mark the cut dropped, folded into parity that held the \
                     write): {:?}",
                    array.warnings()
                );
            }
        }
    }
}

/// A row of a degraded stripe whose missing data units' values the
/// degraded-write log holds in part (one member out and logged, the
/// other lost at the open, in service at the stop), both members' tables
/// gone: the logged value checks the decode from the k members left. Here
/// those members are not one codeword (a data member holds a write whose
/// parity a cut dropped, its entry made durable beside it), so a decode
/// gives the logged unit another value: the row is marked and its missing
/// blocks read as I/O errors, never as a guess. Unchecked, they read as
/// neither their old nor their new bytes (the cluster simulator, seed
/// 232517 with a batched row decode).
#[test]
fn a_logged_value_checks_the_decode_of_a_row_whose_other_missing_member_was_in_service() {
    let mut rig = Rig::filled_on_devices(WritePolicy::Plog, 8);
    let g = rig.geo();
    let stripe = 1;
    rig.close_cleanly();
    // Both members out from the open on: their tables unknown.
    let gone = [g.place(stripe, 0).device, g.place(stripe, 1).device];
    let mut devs = rig.devices();
    for &d in &gone {
        devs[d] = None;
    }
    rig.array = Some(Array::open_with_devices(rig.dir.path(), devs, None).unwrap());
    // Data role 2 holds a write its parity lacks, its entry beside it.
    let place = g.place(stripe, 2);
    let off = g.device_offset(place.row, 0) as usize;
    let newer = pattern(4242, 4096);
    rig.mems[place.device].with_bytes(|b| b[off..off + 4096].copy_from_slice(&newer));
    let index = g.checksum_index(place.row, 0);
    rig.a().stores[place.device].set_checksum(index, crc32c::crc32c(&newer));
    let old: Vec<Vec<u8>> = [0usize, 1]
        .iter()
        .map(|&role| {
            let at = rig.volume_offset(stripe, role, 0) as usize;
            rig.model[at..at + 4096].to_vec()
        })
        .collect();
    let units = rig.a().read_stripe_raw(stripe);
    let mut logged = vec![None; g.width()];
    logged[0] = Some(crc32c::crc32c(&old[0]));
    rig.a()
        .note_missing_from_codeword(stripe, 0, &units, false, true, &logged);
    for (role, old) in [0usize, 1].into_iter().zip(&old) {
        let mut got = vec![0u8; 4096];
        let read = rig.a().read(&mut got, rig.volume_offset(stripe, role, 0));
        assert!(
            read.is_err(),
            "role {role}: a decode the logged value refuses is an I/O error, not {}",
            if got == *old {
                "its old bytes"
            } else {
                "a guess"
            }
        );
    }
}

/// The double fault of the two tests below: a plog stripe whose journals
/// hold a flushed record, then a write in flight at a cut to data role 2
/// that landed in place while both parity journals lost its records
/// (that member changed since the last flush), then data role 3's member
/// lost at the next open: at the open's first read of its unit there
/// (stripe 0's resync read its table page before: its entry is known), or
/// missing from the start (`absent`: its entries are unknown). The block
/// of role 3 reads its flushed bytes; the one of role 2 its old or new.
fn double_fault_beside_a_changed_member(absent: bool) -> Array {
    let mut rig = Rig::filled_on_devices(WritePolicy::Plog, 16);
    let g = rig.geo();
    let stripe = 1;
    rig.write_journaled(stripe, 0, 70);
    let parities: Vec<usize> = (0..g.m()).map(|j| rig.parity_device(stripe, j)).collect();
    for &p in &parities {
        rig.plans[p].writes_before_crash.store(0, SeqCst);
    }
    let changed = rig.volume_offset(stripe, 2, 0);
    let before = rig.model[changed as usize..][..4096].to_vec();
    let read_at = rig.volume_offset(stripe, 3, 0);
    let flushed = rig.model[read_at as usize..read_at as usize + 4096].to_vec();
    rig.write(changed, &pattern(72, 4096));
    rig.array.take().unwrap().simulate_crash();
    for &p in &parities {
        rig.plans[p].writes_before_crash.store(-1, SeqCst);
    }
    let lost = g.place(stripe, 3);
    let unit_at = g.device_offset(lost.row, 0);
    *rig.plans[lost.device].lost_read_range.lock().unwrap() =
        Some((unit_at, unit_at + g.unit_bytes()));
    let mut devs = rig.devices();
    if absent {
        devs[lost.device] = None;
    }
    let array = Array::open_with_devices(rig.dir.path(), devs, None).unwrap();
    assert!(
        array.status().devices[lost.device].state == MemberState::Failed,
        "the member failed at the open: {:?}",
        array.warnings()
    );
    let mut got = vec![0u8; 4096];
    array
        .read(&mut got, read_at)
        .unwrap_or_else(|e| panic!("{e}: {:?}", array.warnings()));
    assert_eq!(got, flushed, "the lost block reads its flushed bytes");
    assert!(array.stats().array.degraded_replay_vouched_rows > 0);
    array.read(&mut got, changed).unwrap();
    assert!(got == pattern(72, 4096) || got == before);
    array
}

/// [`double_fault_beside_a_changed_member`] with the lost member's entry
/// known: the members left disagree, so the degraded replay cannot fold
/// its way to the lost unit; but the decode that leaves out the changed
/// member gives the lost unit the checksum its entry records, and that
/// value (its flushed bytes) is logged instead of the block being
/// poisoned (an I/O error before: the cluster simulator's seed 488505,
/// plog).
#[test]
fn a_degraded_replay_takes_the_decode_a_lost_members_known_checksum_vouches_for() {
    double_fault_beside_a_changed_member(false);
}

/// [`double_fault_beside_a_changed_member`] with the lost member's entry
/// unknown: the changed member vouches instead (left out, it decodes back
/// to its entry, its flushed bytes), so the lost unit's value is the one
/// the row held at the last flush (an I/O error before: the simulator's
/// seeds 628645 and 769941, plog).
#[test]
fn a_degraded_replay_takes_the_decode_that_gives_a_changed_member_back_its_entry() {
    double_fault_beside_a_changed_member(true);
}

/// A degraded replay of a row whose missing data units' values the
/// degraded-write log holds in part (role 0 logged, role 3 not): the
/// members left, with the journal's records folded, are k, and decode
/// role 0 as the content their parity holds, which here lacks the write
/// that logged its value (a degraded write whose parity writes a cut
/// dropped). Logged over the right value, that decode became role 0's
/// content (the cluster simulator's seed 845757 on e4481c9: a flushed
/// block read as zeroes). The replay now decodes only with the logged
/// value among the members, vouched by a spare, and otherwise logs
/// nothing for the row: the log keeps the value it had.
#[test]
fn a_degraded_replay_never_decodes_around_a_logged_value() {
    let mut rig = Rig::filled_on_devices(WritePolicy::Plog, 8);
    let g = rig.geo();
    let stripe = 1;
    rig.write_journaled(stripe, 1, 70);
    let a = rig.a();
    for role in [0, 3] {
        a.latch_failure(
            g.place(stripe, role).device,
            "read",
            &std::io::Error::other("gone"),
        );
    }
    let logged = pattern(4343, 4096);
    let log = a.degraded_log.as_ref().expect("format 2 keeps the log");
    drop(log.log(stripe, &[(0, 0, &logged)], &|| Ok(())).unwrap());
    {
        let _g = a.locks[Array::lock_index(stripe)].write().unwrap();
        a.replay_stripe(stripe).unwrap();
    }
    assert!(!a.journal_pending(stripe), "the replay folded the records");
    assert!(
        log.value(stripe, 0, 0).unwrap() == Some(logged),
        "the replay logged role 0 a value decoded around the logged one: {:?}",
        a.warnings()
    );
}

/// A member whose block matches its checksum entry is taken for one that
/// no write in flight at the stop reached (`rows_torn_unlogged`), and an
/// entry describes the block as of the last flush, or of a write the
/// flush that wrote it had made durable. Written before the devices'
/// syncs (as a flush did until 2026-11-29), a cut between the two could
/// keep one member's page (its new entry) with its new block and drop
/// another member's block and page: each member left matched its entry,
/// the row was not one codeword, and with two data members lost at the
/// next open the k left decoded them as neither their old nor their new
/// bytes, unchecked (their entries went with them). Here parity 0's
/// device loses its power as the flush's page write reaches it (every
/// write since its last sync undone), the others going on. Each lost unit
/// must read what the last completed flush left (or, where the write in
/// flight covered it, its new bytes), or fail.
#[test]
fn a_cut_between_a_flushs_table_pages_and_its_syncs_never_reads_wrong() {
    let cases = [
        (WritePolicy::Rmw, false),
        (WritePolicy::Rmw, true),
        (WritePolicy::Plog, true),
        (WritePolicy::Parix, true),
    ];
    for (policy, whole) in cases {
        let case = format!("{policy:?}, {}", if whole { "whole" } else { "partial" });
        let mut rig = Rig::filled_on_devices(policy, 16);
        let g = rig.geo();
        let stripe = 1;
        let sd = g.stripe_data_bytes();
        let offsets = rig.row_offsets(stripe);
        let flushed: Vec<Vec<u8>> = offsets
            .iter()
            .map(|&at| rig.model[at as usize..at as usize + 4096].to_vec())
            .collect();
        // Parity 0's device loses its power when its table's page of the
        // stripe's entries is written.
        let p0 = g.place(stripe, g.k());
        let entry_at = crate::array::layout::CHECKSUM_OFFSET + g.checksum_index(p0.row, 0) * 4;
        let page_from = entry_at / 4096 * 4096;
        let plan = Arc::clone(&rig.plans[p0.device]);
        let power = Arc::new(std::sync::atomic::AtomicBool::new(false));
        for p in &rig.plans {
            *p.power.lock().unwrap() = Arc::clone(&power);
        }
        *plan.unsynced.lock().unwrap() = Some(Vec::new());
        *plan.cut_on_write_range.lock().unwrap() = Some((page_from, page_from + 4096));
        let new = pattern(91, sd as usize);
        match whole {
            true => rig.write(stripe * sd, &new),
            false => rig.write(offsets[1], &new[..4096]),
        }
        rig.a().flush().unwrap();
        assert!(plan.is_cut(), "{case}: the flush wrote parity 0's page");
        assert!(
            rig.a().status().dirty_regions > 0,
            "{case}: the intent marks outlive the flush (the cut comes before they end)"
        );
        for p in &rig.plans {
            p.restore_power();
        }
        let lost = [0usize, 2];
        let gone: Vec<usize> = lost.iter().map(|&r| g.place(stripe, r).device).collect();
        let array = rig.crash_and_reopen_without(&gone);
        let mut got = vec![0u8; 4096];
        for &role in &lost {
            let at = offsets[role];
            let within = (at - stripe * sd) as usize;
            if let Ok(()) = array.read(&mut got, at) {
                assert!(
                    got[..] == flushed[role][..] || (whole && got[..] == new[within..][..4096]),
                    "{case}: unit {role} (lost) reads neither its flushed nor its new bytes: {:?}",
                    array.warnings()
                );
            }
        }
    }
}

/// On one machine a flush commits a grown parity journal's length (its
/// metadata area's directory) only once the device's checksum pages are
/// durable: the pages, their sync, then the commits (`Array::sync_devices`;
/// across the network a barrier in the pages' message does the same). A
/// device whose journal grew (it holds parity of a partially written
/// stripe) and whose page is dirty (it holds data of another written
/// stripe) loses its power as its directory commit reaches it, every write
/// since its last sync undone: the page with the new entry must be there.
#[test]
fn a_local_flush_commits_a_grown_journal_only_after_its_pages_are_durable() {
    for policy in [WritePolicy::Plog, WritePolicy::Parix] {
        let mut rig = Rig::filled_on_devices(policy, 16);
        let g = rig.geo();
        let stripe = 1;
        let p0 = g.place(stripe, g.k());
        // A stripe with a data unit on that device.
        let (other, role) = (2..16u64)
            .find_map(|s| {
                (0..g.k())
                    .find(|&r| g.place(s, r).device == p0.device)
                    .map(|r| (s, r))
            })
            .expect("a data unit on every device");
        let unit = g.place(other, role);
        let entry_at = crate::array::layout::CHECKSUM_OFFSET + g.checksum_index(unit.row, 0) * 4;
        rig.write(rig.row_offsets(stripe)[1], &pattern(92, 4096));
        let new = pattern(93, 4096);
        rig.write(rig.row_offsets(other)[role], &new);
        let plan = Arc::clone(&rig.plans[p0.device]);
        let power = Arc::new(std::sync::atomic::AtomicBool::new(false));
        for p in &rig.plans {
            *p.power.lock().unwrap() = Arc::clone(&power);
        }
        let slots = g.meta_area_offset();
        *plan.unsynced.lock().unwrap() = Some(Vec::new());
        *plan.cut_on_write_range.lock().unwrap() = Some((slots, slots + 2 * (64 << 10)));
        let _ = rig.a().flush();
        assert!(
            plan.is_cut(),
            "{policy:?}: the flush committed the grown journal's length"
        );
        // As the table stores it: XORed with a zero block's CRC.
        let mut entry = [0u8; 4];
        rig.mems[p0.device].read_at(&mut entry, entry_at).unwrap();
        assert_eq!(
            u32::from_le_bytes(entry) ^ crate::array::checksum::zero_block_crc(4096),
            crc32c::crc32c(&new),
            "{policy:?}: the page with the new entry was not durable before the commit"
        );
        for p in &rig.plans {
            p.restore_power();
        }
    }
}
