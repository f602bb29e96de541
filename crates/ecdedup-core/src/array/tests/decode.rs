//! Scenario tests of checked decoding (`array/decode.rs`): a decoded block
//! is compared with its recorded checksum and with the spare members
//! before it is returned, rebuilt or used to repair; a stale unit whose
//! checksum still matches (what a lost journal record or a torn degraded
//! write leaves) is found by trying other combinations of members, or the
//! read fails; never wrong data. Rebuild goes on past rows it cannot
//! decode, and scrub checks degraded stripes as far as the survivors can.
//!
//! Fault model: bytes of the in-memory devices are changed under the array
//! (a flipped byte: bit rot), and a parity block is put back to an older
//! value together with its older checksum entry (stale but self-consistent).

use super::*;

const BLOCK: usize = 4096;

/// Data role 3's unit of a stripe write in flight at a cut
/// ([`Rig::stripe_write_lost_by`]): where it is, and its old and new bytes.
struct InFlight {
    read_at: u64,
    old: Vec<u8>,
    new: Vec<u8>,
}

impl InFlight {
    /// The unit reads its old or its new bytes, or fails: never else.
    fn reads_old_new_or_error(&self, array: &Array) {
        let mut got = vec![0u8; self.old.len()];
        if array.read(&mut got, self.read_at).is_ok() {
            assert!(
                got == self.old || got == self.new,
                "the block reads neither its old nor its new bytes"
            );
        }
    }

    /// A write of the unit makes it readable again.
    fn reads_back_once_rewritten(&self, array: &Array) {
        let again = pattern(99, self.old.len());
        array.write(&again, self.read_at, false).unwrap();
        let mut got = vec![0u8; self.old.len()];
        array.read(&mut got, self.read_at).unwrap();
        assert_eq!(got, again);
    }
}

impl Rig {
    /// RS(4,2) over 6 devices, 8 stripes of 16 KiB units, filled with
    /// random data and flushed.
    fn filled_rs42() -> Rig {
        let mut rig = Rig::new(6, 4, 2, 16 << 10, 8);
        let mut data = vec![0u8; rig.model.len()];
        rand::rngs::StdRng::seed_from_u64(42).fill_bytes(&mut data);
        rig.write(0, &data);
        rig.a().flush().unwrap();
        rig
    }

    /// The volume offset of block `b` of data role `role` in `stripe`.
    fn block_offset(&self, stripe: u64, role: usize, b: u64) -> u64 {
        let g = self.a().geometry();
        stripe * g.stripe_data_bytes() + role as u64 * g.unit_bytes() + b * BLOCK as u64
    }

    /// A full-stripe write of `stripe` in flight at a power cut that
    /// device `d` loses (every other device keeps it); the array is gone
    /// after the cut.
    fn stripe_write_lost_by(&mut self, stripe: u64, d: usize) -> InFlight {
        let unit = self.a().geometry().unit_bytes() as usize;
        let at = self.block_offset(stripe, 0, 0);
        let read_at = at + 3 * unit as u64;
        let old = self.model[read_at as usize..read_at as usize + unit].to_vec();
        let new = pattern(stripe + 7, 4 * unit);
        self.plans[d].writes_before_crash.store(0, Ordering::SeqCst);
        self.write(at, &new);
        self.plans[d]
            .writes_before_crash
            .store(-1, Ordering::SeqCst);
        self.array.take().unwrap().simulate_crash();
        InFlight {
            read_at,
            old,
            new: new[3 * unit..].to_vec(),
        }
    }

    /// Data roles 0 to 2 of `stripe` written (`pattern(11, ..)`), in
    /// flight at a power cut that the Q parity's device loses; the array
    /// is gone after the cut. Returns the device of role 3, which the
    /// write left as it was.
    fn three_units_lost_by_q(&mut self, stripe: u64) -> usize {
        let unit = self.a().geometry().unit_bytes() as usize;
        let lost_by = self.device_of(stripe, 5);
        let out3 = self.device_of(stripe, 3);
        self.plans[lost_by]
            .writes_before_crash
            .store(0, Ordering::SeqCst);
        let at = self.block_offset(stripe, 0, 0);
        self.write(at, &pattern(11, 3 * unit));
        self.plans[lost_by]
            .writes_before_crash
            .store(-1, Ordering::SeqCst);
        self.array.take().unwrap().simulate_crash();
        out3
    }

    /// The array opened with devices `out` missing.
    fn open_without(&self, out: &[usize]) -> Array {
        let mut devs = self.devices();
        for &d in out {
            devs[d] = None;
        }
        Array::open_with_devices(self.dir.path(), devs, None).unwrap()
    }

    /// The device of `role` in `stripe`.
    fn device_of(&self, stripe: u64, role: usize) -> usize {
        self.a().geometry().place(stripe, role).device
    }

    /// Runs `change` on the volume, then puts parity unit `j` of block row
    /// `b` of `stripe` back as it was before, bytes and checksum entry: a
    /// parity block that is stale but matches its checksum.
    fn with_stale_parity(&mut self, stripe: u64, j: usize, b: u64, change: impl FnOnce(&mut Rig)) {
        let k = self.a().geometry().k();
        self.with_stale_block(stripe, k + j, b, change);
    }

    /// Runs `change` on the volume, then puts block `b` of `role` in
    /// `stripe` back as it was before on its device, bytes and checksum
    /// entry: a block that is stale but matches its checksum (what an old
    /// image of the device holds).
    fn with_stale_block(
        &mut self,
        stripe: u64,
        role: usize,
        b: u64,
        change: impl FnOnce(&mut Rig),
    ) {
        let g = *self.a().geometry();
        let place = g.place(stripe, role);
        let off = g.device_offset(place.row, b) as usize;
        let index = g.checksum_index(place.row, b);
        let old = self.mems[place.device].with_bytes(|d| d[off..off + BLOCK].to_vec());
        let old_crc = self.a().stores[place.device].checksum(index).unwrap();
        change(self);
        self.a().flush().unwrap();
        self.mems[place.device].with_bytes(|d| d[off..off + BLOCK].copy_from_slice(&old));
        self.a().stores[place.device].set_checksum(index, old_crc);
        assert_eq!(crc32c::crc32c(&old), old_crc);
    }

    /// Flips a byte of block `b` of `role` in `stripe` on its device.
    fn rot(&self, stripe: u64, role: usize, b: u64) {
        let g = *self.a().geometry();
        let place = g.place(stripe, role);
        let off = g.device_offset(place.row, b) as usize + 100;
        self.mems[place.device].with_bytes(|d| d[off] ^= 0x5a);
    }

    /// Reads every block; returns those that failed to read. Panics on a
    /// block that reads back wrong.
    fn unreadable_blocks(&self) -> Vec<u64> {
        let mut failed = Vec::new();
        let mut buf = vec![0u8; BLOCK];
        for blk in 0..(self.model.len() / BLOCK) as u64 {
            let at = blk as usize * BLOCK;
            match self.a().read(&mut buf, at as u64) {
                Ok(()) => assert!(
                    buf == self.model[at..at + BLOCK],
                    "block {blk} reads back wrong, with no error"
                ),
                Err(_) => failed.push(blk),
            }
        }
        failed
    }

    /// The stale-parity story of issue 10: block 0 of role 0 in stripe 2
    /// rewritten while parity 0 of that row kept its old value; then block
    /// 0 of role 1 rots.
    fn stale_parity_and_rot() -> Rig {
        let mut rig = Rig::filled_rs42();
        let fresh = vec![0xab; BLOCK];
        let at = rig.block_offset(2, 0, 0);
        rig.with_stale_parity(2, 0, 0, |r| r.write(at, &fresh));
        rig.rot(2, 1, 0);
        rig
    }
}

#[test]
fn a_stale_parity_with_a_matching_checksum_is_left_out_and_the_block_decodes_right() {
    let rig = Rig::stale_parity_and_rot();
    assert_eq!(rig.unreadable_blocks(), Vec::<u64>::new());
    let stats = rig.a().stats();
    assert!(stats.array.combination_decodes >= 1, "{:?}", stats.array);
    // The stale parity and the rotten block were rewritten.
    rig.assert_consistent();
    rig.assert_matches_model();
}

#[test]
fn with_a_third_member_out_a_decode_that_fails_its_checksum_is_an_error_not_wrong_data() {
    let rig = Rig::stale_parity_and_rot();
    let out = rig.device_of(2, 2);
    rig.a().fail_device(out).unwrap();
    let failed = rig.unreadable_blocks();
    // Stripe 2's row 0 has lost its data: the rotten block and the one on
    // the failed device decode only through the stale parity.
    let lost = [
        rig.block_offset(2, 1, 0) / BLOCK as u64,
        rig.block_offset(2, 2, 0) / BLOCK as u64,
    ];
    assert_eq!(failed, lost.to_vec());
    assert!(rig.a().stats().array.unreadable_blocks >= 2);
}

#[test]
fn rebuild_goes_on_past_a_row_it_cannot_decode_and_marks_it_unreadable() {
    let mut rig = Rig::stale_parity_and_rot();
    let out = rig.device_of(2, 2);
    rig.a().fail_device(out).unwrap();
    rig.replace_and_rebuild(out);
    assert!(rig
        .a()
        .member_states()
        .iter()
        .all(|s| *s == MemberState::Active));
    // Every later stripe was rebuilt; the undecodable row reads as an
    // error (never as the zeros written in its place).
    let failed = rig.unreadable_blocks();
    let lost = rig.block_offset(2, 2, 0) / BLOCK as u64;
    assert!(failed.contains(&lost), "{failed:?}");
    assert!(failed.len() <= 2, "{failed:?} {:?}", rig.a().warnings());
    let report = rig.a().scrub(false, None).unwrap();
    assert!(report.checksum_mismatches >= 1, "{report:?}");
    // The row's data is lost: a write of the whole stripe (a restore)
    // needs none of it and replaces the marked block.
    let stripe_bytes = rig.a().geometry().stripe_data_bytes();
    rig.write(2 * stripe_bytes, &vec![0x11; stripe_bytes as usize]);
    assert_eq!(rig.unreadable_blocks(), Vec::<u64>::new());
}

#[test]
fn a_rebuild_with_fewer_than_k_members_in_service_pauses_and_marks_nothing() {
    // Device 0 replaced blank; then two more members out, so only 3 of the
    // others are in service (k = 4): nothing can be decoded. Before, the
    // rebuild went on, marked every row unreadable on the new member and
    // moved its cursor past them, and the blocks stayed I/O errors after
    // the members came back (the fault suite's rebuild-interrupted run).
    let mut rig = Rig::filled_rs42();
    rig.a().fail_device(0).unwrap();
    let fresh = MemDevice::new("r0", rig.mems[0].size());
    rig.mems[0] = fresh.clone();
    rig.a()
        .install_replacement(0, Arc::new(fresh), Path::new("/nonexistent/new0"))
        .unwrap();
    rig.a().fail_device(1).unwrap();
    rig.a().fail_device(2).unwrap();
    let e = rig.a().rebuild(None).unwrap_err();
    assert!(e.to_string().contains("paused at stripe 0"), "{e}");
    // Nothing rebuilt, nothing marked: the new member's cursor stays at
    // stripe 0, and a second try pauses there again.
    assert_eq!(rig.a().stats().array.rebuilt_stripes, 0);
    let e = rig.a().rebuild(None).unwrap_err();
    assert!(e.to_string().contains("paused at stripe 0"), "{e}");
}

#[test]
fn scrub_of_a_degraded_array_finds_a_stale_parity_and_repairs_it() {
    let mut rig = Rig::filled_rs42();
    let fresh = vec![0xcd; BLOCK];
    let at = rig.block_offset(5, 3, 1);
    rig.with_stale_parity(5, 1, 1, |r| r.write(at, &fresh));
    let out = rig.device_of(5, 0);
    rig.a().fail_device(out).unwrap();
    let report = rig.a().scrub(false, None).unwrap();
    assert_eq!(report.degraded_stripes, 8, "{report:?}");
    assert_eq!(report.parity_mismatches, 1, "{report:?}");
    assert_eq!(report.unrecoverable_blocks, 0, "{report:?}");
    let report = rig.a().scrub(true, None).unwrap();
    assert_eq!(report.parity_mismatches, 1, "{report:?}");
    let report = rig.a().scrub(false, None).unwrap();
    assert_eq!(report.parity_mismatches, 0, "{report:?}");
    rig.assert_matches_model();
}

/// A row with three blocks rotten of RS(4,2): a repairing scrub counts
/// the three as unrecoverable (it said one, the row), leaves them, and
/// each reads as an I/O error, never as a guess.
#[test]
fn a_repairing_scrub_counts_every_block_of_a_row_it_cannot_repair() {
    let rig = Rig::filled_rs42();
    for role in [0, 1, 4] {
        rig.rot(2, role, 1);
    }
    let report = rig.a().scrub(true, None).unwrap();
    assert_eq!(report.checksum_mismatches, 3, "{report:?}");
    assert_eq!(report.unrecoverable_blocks, 3, "{report:?}");
    assert_eq!(report.repaired_blocks, 0, "{report:?}");
    let blocks_per_unit = rig.a().geometry().blocks_per_unit();
    let first = |role: u64| (2 * 4 + role) * blocks_per_unit + 1;
    assert_eq!(rig.unreadable_blocks(), vec![first(0), first(1)]);
}

#[test]
fn resync_keeps_matching_checksums_and_counts_the_blocks_that_do_not() {
    let mut rig = Rig::filled_rs42();
    // A write left in flight: its stripe is dirty at the crash, and its
    // block's entry is the last flush's.
    let at = rig.block_offset(3, 0, 0);
    rig.write(at, &vec![0x77; BLOCK]);
    rig.crash_and_restart();
    let mismatches = rig.a().stats().array.resync_checksum_mismatches;
    assert!(mismatches >= 1, "resync did not count the block in flight");
    assert!(rig
        .a()
        .warnings()
        .iter()
        .any(|w| w.contains("no longer matched their recorded checksums")));
    rig.assert_matches_model();
    rig.assert_consistent();
}

/// Bit rot in a flushed block of a stripe an unclean stop left dirty (a
/// write elsewhere in it in flight): the resync decodes the block from the
/// members that still match their entries, finds its entry's value, and
/// rewrites it, where it took the rotten bytes for a write in flight and
/// made them the truth (parity and entry following them: wrong data that
/// scrub no longer sees). With each write policy; under the journals the
/// block in flight is the journal's, its parity not yet folded.
#[test]
fn a_block_rotten_after_its_flush_in_a_dirty_stripe_is_restored_by_the_resync_not_adopted() {
    for policy in [WritePolicy::Rmw, WritePolicy::Plog, WritePolicy::Parix] {
        let mut rig = Rig::with_policy(6, 4, 2, 16 << 10, 8, policy);
        let vol = rig.model.len();
        rig.write(0, &pattern(5, vol));
        rig.a().flush().unwrap();
        // Flushed under the journals: records not yet folded into parity.
        let flushed = rig.block_offset(3, 0, 0);
        rig.write(flushed, &pattern(6, BLOCK));
        rig.a().flush().unwrap();
        // In flight at the stop: a block of another data member, row 0.
        let in_flight = rig.block_offset(3, 1, 0);
        let old = rig.model[in_flight as usize..in_flight as usize + BLOCK].to_vec();
        let new = pattern(7, BLOCK);
        rig.a().write(&new, in_flight, false).unwrap();
        // Rot in a flushed block of row 1, and in one of row 2.
        rig.rot(3, 2, 1);
        rig.rot(3, 3, 2);
        rig.crash_and_restart();
        let mut got = vec![0u8; BLOCK];
        rig.a().read(&mut got, in_flight).unwrap();
        assert!(
            got == old || got == new,
            "{policy:?}: the write in flight reads neither its old nor its new bytes"
        );
        rig.model[in_flight as usize..in_flight as usize + BLOCK].copy_from_slice(&got);
        rig.assert_matches_model();
        let stats = rig.a().stats().array;
        assert_eq!(stats.resync_blocks_restored, 2, "{policy:?}: {stats:?}");
        assert!(
            rig.a()
                .warnings()
                .iter()
                .any(|w| w.contains("corruption at rest")),
            "{policy:?}"
        );
        rig.assert_consistent();
    }
}

/// Rot in the row of a write the stop let land whole (a kill -9: data and
/// parity on the devices, the entries from the last flush): the other
/// members are one codeword around the rot and decode it back to its
/// entry. With only the members that match their entries tried, the
/// changed parity kept the rot for good (a second new user's probe). RS(4,2),
/// and RS(2,1), where exactly k others are checked by the entry alone.
#[test]
fn rot_beside_a_write_that_landed_whole_before_a_kill_is_restored_by_the_resync() {
    for (n, k, m) in [(6, 4, 2), (3, 2, 1)] {
        let mut rig = Rig::new(n, k, m, 16 << 10, 8);
        let vol = rig.model.len();
        rig.write(0, &pattern(11, vol));
        rig.a().flush().unwrap();
        rig.write(rig.block_offset(3, 0, 2), &pattern(12, BLOCK));
        rig.rot(3, 1, 2);
        rig.crash_and_restart();
        rig.assert_matches_model();
        assert_eq!(
            rig.a().stats().array.resync_blocks_restored,
            1,
            "RS({k},{m})"
        );
        rig.assert_consistent();
    }
}

/// Parix, a flushed partial write whose records both parity journals
/// still hold after a clean stop: its data block rots and one journal's
/// record of it is damaged. The open resyncs the stripe from its data
/// (the damaged record lost it its account); the other journal's record
/// holds the block's latest value, which its entry vouches for, and the
/// block is put back from it. Taken as written, the rot became the data
/// for good with only two members damaged (a third new user's probe).
#[test]
fn a_data_block_and_one_journals_record_of_it_damaged_come_back_from_the_other_record() {
    let mut rig = Rig::with_policy(6, 4, 2, 16 << 10, 8, WritePolicy::Parix);
    let vol = rig.model.len();
    rig.write(0, &pattern(13, vol));
    rig.a().flush().unwrap();
    let value = pattern(14, BLOCK);
    rig.write(rig.block_offset(3, 1, 1), &value);
    rig.a().flush().unwrap();
    rig.rot(3, 1, 1);
    rig.array = None;
    let mut damaged = 0;
    for entry in std::fs::read_dir(rig.dir.path().join("journal")).unwrap() {
        let path = entry.unwrap().path();
        let mut bytes = std::fs::read(&path).unwrap();
        if damaged == 0 {
            if let Some(at) = bytes.windows(BLOCK).position(|w| w == &value[..]) {
                bytes[at + 100] ^= 0x5a;
                std::fs::write(&path, &bytes).unwrap();
                damaged += 1;
            }
        }
    }
    assert_eq!(damaged, 1, "no journal held the record after a clean stop");
    rig.open();
    rig.assert_matches_model();
    assert_eq!(rig.a().stats().array.resync_blocks_restored, 1);
    rig.assert_consistent();
}

/// A FUA write is never rolled back by the resync's restore: its entry was
/// synced with it, so a block written over it afterwards and torn by the
/// cut goes back at most to the FUA write's bytes. Under rmw the later
/// write's parity writes are lost too (the parity put back as the FUA
/// write left it), so the block is the only change in its row and the
/// restore decodes it back to exactly the FUA write's bytes; under parix
/// the journal's records name the row and the torn block is kept.
#[test]
fn the_resync_puts_a_block_in_flight_back_no_further_than_its_fua_write() {
    for policy in [WritePolicy::Rmw, WritePolicy::Parix] {
        let mut rig = Rig::with_policy(6, 4, 2, 16 << 10, 8, policy);
        let vol = rig.model.len();
        rig.write(0, &pattern(8, vol));
        rig.a().flush().unwrap();
        let (stripe, role, row) = (2, 1, 1);
        let at = rig.block_offset(stripe, role, row);
        let fua = pattern(9, BLOCK);
        rig.a().write(&fua, at, true).unwrap();
        let g = *rig.a().geometry();
        let block_of = |role: usize| {
            let place = g.place(stripe, role);
            (place.device, g.device_offset(place.row, row) as usize)
        };
        let parity_at_fua: Vec<Vec<u8>> = (4..6)
            .map(|r| {
                let (d, off) = block_of(r);
                rig.mems[d].with_bytes(|b| b[off..off + BLOCK].to_vec())
            })
            .collect();
        let after = pattern(10, BLOCK);
        rig.a().write(&after, at, false).unwrap();
        // Torn by the cut: only its first sector reached the device.
        let (d, off) = block_of(role);
        rig.mems[d].with_bytes(|b| b[off + 512..off + BLOCK].copy_from_slice(&fua[512..]));
        if policy == WritePolicy::Rmw {
            for (r, bytes) in (4..6).zip(&parity_at_fua) {
                let (d, off) = block_of(r);
                rig.mems[d].with_bytes(|b| b[off..off + BLOCK].copy_from_slice(bytes));
            }
        }
        rig.crash_and_restart();
        let mut got = vec![0u8; BLOCK];
        rig.a().read(&mut got, at).unwrap();
        let restored = rig.a().stats().array.resync_blocks_restored;
        if policy == WritePolicy::Rmw {
            assert_eq!(restored, 1, "{policy:?}");
            assert!(
                got == fua,
                "{policy:?}: not put back to the FUA write's bytes"
            );
        }
        // Sector by sector, the FUA write's bytes or the later write's
        // (a cut may tear a block between sectors): never the bytes from
        // before the FUA write.
        for (i, sector) in got.chunks(512).enumerate() {
            let at = i * 512..(i + 1) * 512;
            assert!(
                sector == &fua[at.clone()] || sector == &after[at],
                "{policy:?}: sector {i} of the FUA write was rolled back"
            );
        }
        rig.assert_consistent();
    }
}

#[test]
fn a_medium_read_error_is_decoded_and_rewritten_and_only_repeated_ones_fail_the_device() {
    let rig = Rig::filled_rs42();
    let g = *rig.a().geometry();
    let place = g.place(4, 1);
    let at = g.device_offset(place.row, 2);
    let bad_sector = |rig: &Rig| {
        *rig.plans[place.device].bad_read_range.lock().unwrap() = Some((at + 512, at + 1024));
    };
    bad_sector(&rig);
    assert_eq!(rig.unreadable_blocks(), Vec::<u64>::new());
    assert!(rig
        .a()
        .member_states()
        .iter()
        .all(|s| *s == MemberState::Active));
    let stats = rig.a().stats().array;
    assert!(stats.read_errors_corrected >= 1, "{stats:?}");
    assert!(
        rig.plans[place.device]
            .bad_read_range
            .lock()
            .unwrap()
            .is_none(),
        "the unreadable block was rewritten (the sector remapped)"
    );
    // The same device keeps returning medium errors: it is failed at the
    // READ_ERRORS_MAX-th, and every read still returns right data.
    let mut reads = 0;
    while rig.a().member_states()[place.device] == MemberState::Active {
        bad_sector(&rig);
        let mut buf = vec![0u8; BLOCK];
        let off = rig.block_offset(4, 1, 2);
        rig.a().read(&mut buf, off).unwrap();
        assert!(buf == rig.model[off as usize..off as usize + BLOCK]);
        reads += 1;
        assert!(reads <= READ_ERRORS_MAX, "the device was never failed");
    }
    assert_eq!(rig.unreadable_blocks(), Vec::<u64>::new());
}

/// Issue 18, item 1: a data block put back to an older value with its older
/// checksum (a stale device image taken back) reads clean and disagrees
/// with both parities. A repairing scrub must find the member that
/// disagrees with the others and rewrite it, not re-encode parity from
/// the stale data (which blessed the stale block for good).
#[test]
fn a_repairing_scrub_rewrites_a_stale_data_block_not_the_parity_that_disagrees_with_it() {
    let mut rig = Rig::filled_rs42();
    let fresh = vec![0x5e; BLOCK];
    let at = rig.block_offset(4, 1, 2);
    rig.with_stale_block(4, 1, 2, |r| r.write(at, &fresh));
    let report = rig.a().scrub(false, None).unwrap();
    assert_eq!(report.parity_mismatches, 2, "{report:?}");
    assert_eq!(report.checksum_mismatches, 0, "{report:?}");
    let report = rig.a().scrub(true, None).unwrap();
    assert_eq!(report.repaired_blocks, 1, "{report:?}");
    assert_eq!(report.unlocated_stripes, 0, "{report:?}");
    rig.assert_consistent();
    rig.assert_matches_model();
}

/// Two stale data blocks in one row of RS(4,2): any two members left out
/// leave exactly k, always consistent, so nothing can tell which are
/// wrong. The scrub reports the stripe and writes nothing.
#[test]
fn a_repairing_scrub_that_cannot_tell_which_member_is_wrong_changes_nothing() {
    let mut rig = Rig::filled_rs42();
    let g = *rig.a().geometry();
    let (a0, a1) = (rig.block_offset(4, 0, 2), rig.block_offset(4, 1, 2));
    rig.with_stale_block(4, 0, 2, |r| {
        r.with_stale_block(4, 1, 2, |r| {
            r.write(a0, &[0x11; BLOCK]);
            r.write(a1, &[0x22; BLOCK]);
        });
    });
    let devices_before: Vec<Vec<u8>> = rig
        .mems
        .iter()
        .map(|m| m.with_bytes(|d| d.to_vec()))
        .collect();
    let report = rig.a().scrub(true, None).unwrap();
    assert!(report.parity_mismatches >= 1, "{report:?}");
    assert_eq!(report.unlocated_stripes, 1, "{report:?}");
    assert_eq!(report.repaired_blocks, 0, "{report:?}");
    rig.a().flush().unwrap();
    for (d, before) in devices_before.iter().enumerate() {
        let at = g.data_offset() as usize;
        assert!(
            rig.mems[d].with_bytes(|now| now[at..] == before[at..]),
            "device {d}: a scrub that cannot tell wrote data or parity"
        );
    }
}

impl Rig {
    /// Cluster simulator seed 4364 on one machine: block 0 of role 0 in
    /// stripe 5, flushed, is rewritten on every member (acknowledged, not
    /// flushed); an unclean stop; at the next open its member fails
    /// before the resync reaches the stripe (every write refused from its
    /// superblock's on), so the resync takes the value the five members
    /// left agree on as that member's entry (seed 1079's rule) while the
    /// member's own table on its device still holds the flushed one. Then
    /// the member's writes work again, and it is re-added with
    /// `bad_write` refused. Returns the member.
    fn member_back_after_a_stop_with_a_write_in_flight(
        &mut self,
        bad_write: Option<(u64, u64)>,
    ) -> Result<u64> {
        let at = self.block_offset(5, 0, 0);
        self.write(at, &vec![0x3c; BLOCK]);
        let d = self.device_of(5, 0);
        *self.plans[d].bad_write_range.lock().unwrap() = Some((0, u64::MAX));
        self.crash_and_restart();
        assert_eq!(self.a().member_states()[d], MemberState::Failed);
        *self.plans[d].bad_write_range.lock().unwrap() = bad_write;
        let dev = Arc::new(FaultyDevice::new(
            self.mems[d].clone(),
            Arc::clone(&self.plans[d]),
        ));
        self.array.as_mut().unwrap().re_add_device(d, dev)
    }
}

/// Seed 4364's story with a re-add that completes: the member's unit of
/// stripe 5 is reconstructed and checked against what the resync recorded
/// for it, not against the older entry its own table held on its device
/// (which failed the check, so the block was marked unreadable).
#[test]
fn a_member_re_added_after_a_stop_with_writes_in_flight_reconstructs_them() {
    let mut rig = Rig::filled_rs42();
    let units = rig
        .member_back_after_a_stop_with_a_write_in_flight(None)
        .unwrap();
    assert!(units >= 1, "the re-add reconstructed nothing");
    assert_eq!(rig.unreadable_blocks(), Vec::<u64>::new());
    assert_eq!(rig.failed(), 0);
    rig.assert_consistent();
}

/// Seed 4364's story as the simulator found it: the re-add fails (a write
/// lost) before it reaches stripe 5, and the member is failed again.
/// Decodes of its unit there are checked against what the resync recorded
/// for it, as before the re-add; the table read back from its device
/// during the re-add (older) made the flushed block unreadable.
#[test]
fn a_re_add_that_fails_part_way_leaves_every_block_readable() {
    let mut rig = Rig::filled_rs42();
    let g = *rig.a().geometry();
    let d = rig.device_of(5, 0);
    // The member's unit of stripe 4 (the same intent region as stripe 5),
    // which the re-add writes before it reaches stripe 5.
    let row = g.place(4, g.role_on(4, d).unwrap()).row;
    let unit = g.device_offset(row, 0);
    let bad = Some((unit, unit + g.unit_bytes()));
    let e = rig
        .member_back_after_a_stop_with_a_write_in_flight(bad)
        .unwrap_err();
    assert!(
        e.to_string().contains("failed while it was re-added"),
        "{e}"
    );
    assert_eq!(rig.a().member_states()[d], MemberState::Failed);
    assert_eq!(rig.unreadable_blocks(), Vec::<u64>::new());
}

/// Issue 20, item 1 (the fault suite's rebuild-interrupted, last step):
/// a re-add during which two more members fail, so fewer than k others
/// hold the stripes it has not reached. It pauses there (the member left
/// rebuilding at that stripe), marking nothing; the two come back (their
/// own units, which the entries kept while they were out vouch for,
/// taken as they are where the paused member leaves fewer than k others)
/// and `rebuild` resumes the first where it stopped. Before, the re-add
/// marked every unit it could not decode unreadable: I/O errors after
/// every member was back.
#[test]
fn a_re_add_with_fewer_than_k_members_in_service_pauses_and_marks_nothing() {
    let mut rig = Rig::filled_rs42();
    let g = *rig.a().geometry();
    rig.a().fail_device(0).unwrap();
    let len = rig.model.len();
    rig.write(0, &pattern(3, len));
    // Devices 1 and 2 drop out when the re-add reads their units of
    // stripe 4.
    for d in [1, 2] {
        let row = g.place(4, g.role_on(4, d).unwrap()).row;
        let at = g.device_offset(row, 0);
        *rig.plans[d].lost_read_range.lock().unwrap() = Some((at, at + g.unit_bytes()));
    }
    let back = |rig: &mut Rig, d: usize| {
        *rig.plans[d].lost_read_range.lock().unwrap() = None;
        let dev = Arc::new(FaultyDevice::new(
            rig.mems[d].clone(),
            Arc::clone(&rig.plans[d]),
        ));
        rig.array.as_mut().unwrap().re_add_device(d, dev)
    };
    let first = back(&mut rig, 0);
    let states = rig.a().member_states();
    back(&mut rig, 1).unwrap();
    back(&mut rig, 2).unwrap();
    if first.is_err() {
        rig.a().rebuild(None).unwrap();
    }
    rig.assert_matches_model();
    assert_eq!(rig.unreadable_blocks(), Vec::<u64>::new());
    assert_eq!(rig.failed(), 0);
    rig.assert_consistent();
    let e = first.unwrap_err();
    assert!(e.to_string().contains("paused at stripe 4"), "{e}");
    assert_eq!(states[0], MemberState::Rebuilding { cursor: 4 });
    assert_eq!(states[1..3], [MemberState::Failed, MemberState::Failed]);
}

/// The double fault with a member out at the open (docs/write-hole.md):
/// a full-stripe write in flight at a power cut reached some members and
/// not another, and the next open finds two members out, one of them
/// the data unit read here. The k members left mix old and new, and its
/// entry went with its member: the decode, unchecked, was served as
/// neither the old nor the new block (the cluster simulator, shared-story
/// seeds 322, 1603 and others). It reads as an I/O error now, also after
/// the next open, and reads right again once rewritten.
#[test]
fn a_decode_from_k_members_that_mix_a_write_in_flight_is_an_error_not_wrong_data() {
    // The write reaches every member but role 0's, whose device loses it;
    // role 3 (read) and parity 0 are out at the next opens.
    let mut rig = Rig::filled_rs42();
    let lost_by = rig.device_of(1, 0);
    let out = [rig.device_of(1, 3), rig.device_of(1, 4)];
    let write = rig.stripe_write_lost_by(1, lost_by);
    for _ in 0..2 {
        write.reads_old_new_or_error(&rig.open_without(&out));
    }
    write.reads_back_once_rewritten(&rig.open_without(&out));
}

/// The double fault with more than k members left (docs/write-hole.md):
/// a full-stripe write in flight at a power cut reached every member but
/// role 2's, and role 3's member is out at the next open. The five left
/// are not one codeword and nothing vouches for a decode of role 3 (its
/// entry went with its member), so its reads fail; then parity 1's
/// member is lost while serving. Exactly k were left, whose decode
/// nothing checks, and it was served as neither the old nor the new
/// block, and a re-add of that member wrote parity from it, which then
/// vouched for it (the cluster simulator, shared-story seed 2346; branch
/// dd). The resync marks such a row's parity unreadable: an I/O error,
/// never wrong data, also after the member is back.
#[test]
fn a_member_lost_after_a_torn_row_with_more_than_k_left_is_an_error_not_wrong_data() {
    let mut rig = Rig::filled_rs42();
    let out = rig.device_of(1, 3);
    let lost = rig.device_of(1, 5);
    let lost_by = rig.device_of(1, 2);
    let write = rig.stripe_write_lost_by(1, lost_by);
    rig.array = Some(rig.open_without(&[out]));
    write.reads_old_new_or_error(rig.a());
    rig.a().fail_device(lost).unwrap();
    write.reads_old_new_or_error(rig.a());
    let dev = Arc::new(FaultyDevice::new(
        rig.mems[lost].clone(),
        Arc::clone(&rig.plans[lost]),
    ));
    let _ = rig.array.as_mut().unwrap().re_add_device(lost, dev);
    write.reads_old_new_or_error(rig.a());
    rig.crash_and_restart();
    write.reads_old_new_or_error(rig.a());
}

/// The other side of the rule above: after a kill -9 (every write kept,
/// nothing torn) with m members out since before the stop, blocks that
/// writes completed on read back at the next open with the same members
/// out. Branch simlog's rule (a row with exactly k members left that
/// changed since the last flush) marked such rows unreadable: the fio
/// policy tests and the model proptest read acknowledged blocks as I/O
/// errors (this is the proptest's case `cc 79c228da`, shrunk: a member
/// out, a write, a second member out, kill -9). Both members were
/// recorded failed before the stop; a write with a data member out was
/// logged, and a member's failure syncs every device before it is
/// recorded, so no row of theirs can be torn unlogged.
#[test]
fn after_a_kill_9_with_m_members_out_acknowledged_writes_read_back() {
    let mut rig = Rig::new(4, 1, 2, 4096, 4);
    rig.a().fail_device(2).unwrap();
    rig.write(0, &pattern(1, 12289));
    rig.a().fail_device(0).unwrap();
    rig.crash_and_restart();
    rig.assert_matches_model();
    rig.crash_and_restart();
    rig.assert_matches_model();
}

/// The double fault with more than k members left (docs/write-hole.md):
/// a full-stripe write in flight at a power cut reached every member but
/// one parity's, and the next open finds a data member out. The five
/// members left are not one codeword and nothing vouches for the missing
/// unit (its entry went with its member), so its reads fail at that open,
/// as they may. At the open after, a second member out (the parity that
/// took the write), exactly k were left, the three new data units and the
/// old parity, and their decode, which nothing could check, was served as
/// neither the old nor the new block (the cluster simulator, shared-story
/// seeds 22012 and 25205). The first open now marks the row's parity
/// unreadable, and the block reads as an I/O error at both opens, and
/// right again once rewritten.
#[test]
fn a_row_left_torn_with_more_than_k_members_is_an_error_not_wrong_data_after_a_second_loss() {
    // The write reaches every member but parity 1's, whose device loses
    // it; role 3 (read) is out at the next open, parity 0 too at the ones
    // after.
    let mut rig = Rig::filled_rs42();
    let lost_by = rig.device_of(1, 5);
    let first = [rig.device_of(1, 3)];
    let both = [rig.device_of(1, 3), rig.device_of(1, 4)];
    let write = rig.stripe_write_lost_by(1, lost_by);
    write.reads_old_new_or_error(&rig.open_without(&first));
    for _ in 0..2 {
        write.reads_old_new_or_error(&rig.open_without(&both));
    }
    write.reads_back_once_rewritten(&rig.open_without(&both));
}

/// The double fault's marks outlived it (the cluster simulator's known
/// seeds 256008, 263256, 274406, 307244, 419512, 602148): the row above,
/// its missing unit unknowable, had its present parity marked unreadable,
/// so a data member lost later read as an I/O error too, though its block
/// was never in doubt. Now the unknowable unit's blocks are poisoned and
/// the row's parity recomputed around a placeholder for them: they read as
/// I/O errors (a part-block write too) until written whole, at this open
/// and the next, and every other member decodes right after a later loss.
#[test]
fn a_double_fault_poisons_only_the_unknowable_unit_and_its_row_keeps_its_redundancy() {
    let mut rig = Rig::filled_rs42();
    let g = *rig.a().geometry();
    let unit = g.unit_bytes() as usize;
    let role0_at = rig.block_offset(1, 0, 0);
    let lost_by = rig.device_of(1, 5);
    let out3 = rig.device_of(1, 3);
    let out0 = rig.device_of(1, 0);
    let write = rig.stripe_write_lost_by(1, lost_by);
    let array = rig.open_without(&[out3]);
    let rows = g.blocks_per_unit();
    assert_eq!(array.stats().array.poisoned_blocks, rows);
    let mut got = vec![0u8; unit];
    assert!(array.read(&mut got, write.read_at).is_err());
    let mut role0 = vec![0u8; unit];
    array.read(&mut role0, role0_at).unwrap();
    array.flush().unwrap();
    array.fail_device(out0).unwrap();
    // Decoded from the four left, the placeholder among them.
    let mut again = vec![0u8; unit];
    array.read(&mut again, role0_at).unwrap();
    assert_eq!(
        again, role0,
        "a member lost after the double fault decodes right"
    );
    assert!(array.read(&mut got, write.read_at).is_err());
    // Part of a poisoned block: its other bytes are unknown.
    assert!(array
        .write(&[7u8; 512], write.read_at + 512, false)
        .is_err());
    let fresh = pattern(5, BLOCK);
    array.write(&fresh, write.read_at, false).unwrap();
    let mut block = vec![0u8; BLOCK];
    array.read(&mut block, write.read_at).unwrap();
    assert_eq!(block, fresh);
    let next = write.read_at + BLOCK as u64;
    assert!(array.read(&mut block, next).is_err());
    assert!(array.stats().array.poisoned_reads >= 4);
    array.flush().unwrap();
    drop(array);
    let array = rig.open_without(&[out3, out0]);
    array.read(&mut block, write.read_at).unwrap();
    assert_eq!(
        block, fresh,
        "a poisoned block written and flushed stays written"
    );
    assert!(
        array.read(&mut block, next).is_err(),
        "the poison outlives a reopen"
    );
    array.read(&mut again, role0_at).unwrap();
    assert_eq!(again, role0);
    // Re-added (the unknowable unit's member holds the write in flight,
    // which its poison keeps unread): every unit reconstructed around the
    // placeholder, one codeword, the poison kept.
    for d in [out3, out0] {
        let dev = Arc::new(FaultyDevice::new(
            rig.mems[d].clone(),
            Arc::clone(&rig.plans[d]),
        ));
        array.re_add_device(d, dev).unwrap();
    }
    array.read(&mut block, write.read_at).unwrap();
    assert_eq!(block, fresh);
    assert!(
        array.read(&mut block, next).is_err(),
        "a re-add keeps the poison"
    );
    array.read(&mut again, role0_at).unwrap();
    assert_eq!(again, role0);
    let report = array.scrub(false, None).unwrap();
    assert_eq!(report.parity_mismatches, 0, "{report:?}");
    assert_eq!(report.checksum_mismatches, 0, "{report:?}");
}

/// The double fault again, where the lost member's unit took no part in
/// the write in flight: the members left are not one codeword (the Q
/// parity's device lost the write), so its blocks are poisoned while it is
/// out; but it held them from the stop on, and its own checksum table
/// vouches for them, so its re-add (at a later open) writes them back
/// through the write path and they read their flushed bytes again.
#[test]
fn a_re_added_member_gives_back_the_poisoned_blocks_its_own_checksums_vouch_for() {
    let mut rig = Rig::filled_rs42();
    let g = *rig.a().geometry();
    let unit = g.unit_bytes() as usize;
    let stripe = 1;
    let role3_at = rig.block_offset(stripe, 3, 0);
    let flushed = rig.model[role3_at as usize..role3_at as usize + unit].to_vec();
    let out0 = rig.device_of(stripe, 0);
    let at = rig.block_offset(stripe, 0, 0);
    let out3 = rig.three_units_lost_by_q(stripe);
    // It fails at the open's first read of its data (its table's pages
    // not read yet: its entries unknown), after the open's superblocks:
    // the missed map's start (this open) vouches for its image at the
    // re-add.
    let data_at = g.device_offset(0, 0);
    *rig.plans[out3].lost_read_range.lock().unwrap() = Some((data_at, u64::MAX));
    let array = rig.open_without(&[]);
    let rows = g.blocks_per_unit();
    assert_eq!(array.stats().array.poisoned_blocks, rows);
    let mut got = vec![0u8; unit];
    assert!(
        array.read(&mut got, role3_at).is_err(),
        "unknowable while its member is out"
    );
    array.close().unwrap();
    drop(array);
    *rig.plans[out3].lost_read_range.lock().unwrap() = None;
    // Out before this open: its marks hold.
    let array = rig.open_without(&[out3]);
    assert!(array.read(&mut got, role3_at).is_err());
    let dev = Arc::new(FaultyDevice::new(
        rig.mems[out3].clone(),
        Arc::clone(&rig.plans[out3]),
    ));
    array.re_add_device(out3, dev).unwrap();
    assert_eq!(array.stats().array.poisoned_blocks_restored, rows);
    array.read(&mut got, role3_at).unwrap();
    assert_eq!(got, flushed, "the member's own blocks are back");
    assert_eq!(array.status().poisoned_blocks, 0);
    let report = array.scrub(false, None).unwrap();
    assert_eq!(report.parity_mismatches, 0, "{report:?}");
    assert_eq!(report.checksum_mismatches, 0, "{report:?}");
    array.close().unwrap();
    drop(array);
    // Durable, and the row one codeword: a member lost later decodes it.
    let array = rig.open_without(&[out0]);
    array.read(&mut got, role3_at).unwrap();
    assert_eq!(got, flushed);
    let mut role0 = vec![0u8; unit];
    array.read(&mut role0, at).unwrap();
    assert_eq!(role0, pattern(11, 3 * unit)[..unit]);
}

/// A member missing from the open that poisoned its blocks, where no
/// missed map was kept before: the map's start is unknown, so the re-add
/// takes any image (and reconstructs every stripe), an older copy among
/// them whose own blocks and table agree on stale bytes. Its own blocks
/// are not taken: they stay poisoned, and the marks are dropped.
#[test]
fn a_re_add_without_a_known_missed_start_takes_no_own_block() {
    let mut rig = Rig::filled_rs42();
    let unit = rig.a().geometry().unit_bytes() as usize;
    let role3_at = rig.block_offset(1, 3, 0);
    let out3 = rig.three_units_lost_by_q(1);
    let array = rig.open_without(&[out3]);
    assert!(!array.poison.own_held().is_empty());
    assert_eq!(array.intent.missed_since_generation(), None);
    let dev = Arc::new(FaultyDevice::new(
        rig.mems[out3].clone(),
        Arc::clone(&rig.plans[out3]),
    ));
    array.re_add_device(out3, dev).unwrap();
    assert_eq!(array.stats().array.poisoned_blocks_restored, 0);
    assert!(array.poison.own_held().is_empty());
    let mut got = vec![0u8; unit];
    assert!(array.read(&mut got, role3_at).is_err(), "still poisoned");
}

/// The own-held mark is dropped wherever the member's unit may come to
/// hold the placeholder: a replacement of the position drops it at once
/// (durably), so no later re-add of the new device takes its rebuilt
/// placeholder for the block.
#[test]
fn a_replacement_drops_the_own_held_marks_of_its_position() {
    let mut rig = Rig::filled_rs42();
    let out3 = rig.three_units_lost_by_q(1);
    let array = rig.open_without(&[out3]);
    assert!(!array.poison.own_held().is_empty());
    let fresh = MemDevice::new("r3", rig.mems[out3].size());
    rig.mems[out3] = fresh.clone();
    array
        .install_replacement(out3, Arc::new(fresh), Path::new("/nonexistent/new3"))
        .unwrap();
    assert!(array.poison.own_held().is_empty());
    array.close().unwrap();
    drop(array);
    let array = rig.open_without(&[out3]);
    assert!(array.poison.own_held().is_empty());
    assert!(!array.poison.is_empty(), "the blocks stay poisoned");
}
