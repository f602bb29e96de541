//! Scenario tests of the mirrored metadata copies (format 2) on memory
//! devices behind the fault-injecting device: what the array says and
//! does when one device's copy cannot be written.

use super::*;

/// A format-2 RS(4,2) array of six memory devices, each behind a fault
/// plan, its folder and geometry; the memory devices, to reopen over.
struct CopiesRig {
    dir: tempfile::TempDir,
    geo: Geometry,
    mems: Vec<MemDevice>,
    plans: Vec<Arc<FaultPlan>>,
}

impl CopiesRig {
    fn new() -> CopiesRig {
        CopiesRig::with_policy(WritePolicy::Rmw)
    }

    fn with_policy(policy: WritePolicy) -> CopiesRig {
        let dir = tempfile::tempdir().unwrap();
        let (k, m, unit) = (4u32, 2u32, 4096u32);
        let mut opts = options(6, k, m, unit, 16 * k as u64 * unit as u64);
        opts.metadata = MetadataPlacement::Devices;
        opts.write_policy = policy;
        opts.journal_bytes_max = 2 << 20;
        let (geo, mems) = format_on_memory(dir.path(), &opts);
        CopiesRig {
            dir,
            geo,
            mems,
            plans: (0..6).map(|_| FaultPlan::new()).collect(),
        }
    }

    fn open(&self) -> Array {
        let devices = self
            .mems
            .iter()
            .zip(&self.plans)
            .map(|(d, p)| {
                Some(Arc::new(FaultyDevice::new(d.clone(), Arc::clone(p))) as Arc<dyn Device>)
            })
            .collect();
        Array::open_with_devices(self.dir.path(), devices, None).unwrap()
    }

    /// Device `d`'s metadata area refuses writes (`on`), or takes them.
    fn refuse_metadata_writes(&self, d: usize, on: bool) {
        let area = self.geo.meta_area_offset();
        *self.plans[d].bad_write_range.lock().unwrap() =
            on.then_some((area, area + self.geo.meta_area_bytes));
    }
}

#[test]
fn a_copy_that_cannot_be_written_fails_its_device_and_the_warning_names_the_copy() {
    let rig = CopiesRig::new();
    let array = rig.open();
    // Device 4's metadata area refuses writes; its data area does not.
    rig.refuse_metadata_writes(4, true);
    array.write(&vec![7u8; 8192], 0, false).unwrap();
    assert_eq!(
        array.member_states()[4],
        MemberState::Failed,
        "failed by the intent mark its copy missed, before the stripe is written"
    );
    array.flush().unwrap();
    assert_eq!(array.member_states()[4], MemberState::Failed);
    let warnings = array.warnings().join("\n");
    assert!(
        warnings.contains("device 4 failed (metadata area: writing its copy of intent.map"),
        "the warning names the copy that failed and that the device is failed: {warnings}"
    );
    let mut back = vec![0u8; 8192];
    array.read(&mut back, 0).unwrap();
    assert!(back.iter().all(|&b| b == 7));
}

/// The cluster simulator, seed 1116: the first device's copy of the
/// intent map missed a mark (a frame lost), the device stayed in service
/// until a flush that never came (the writer was taken over), and the
/// next open read that copy first: the stripe written was not
/// resynchronised, and every member's checksum entry, from before the
/// write, disagreed with its block ("0 of 6 units intact").
#[test]
fn a_write_whose_intent_mark_one_copy_missed_is_resynced_after_a_crash() {
    let rig = CopiesRig::new();
    let array = rig.open();
    rig.refuse_metadata_writes(0, true);
    array.write(&vec![7u8; 16384], 0, false).unwrap();
    array.simulate_crash();
    rig.refuse_metadata_writes(0, false);
    let array = rig.open();
    let mut back = vec![0u8; 16384];
    array
        .read(&mut back, 0)
        .expect("the stripe was resynchronised: its checksums follow its blocks");
    assert!(back.iter().all(|&b| b == 7));
}

/// The cluster simulator, seed 277285 (with the row reads batched): a
/// degraded write's record in the degraded-write log missed one device's
/// copy (a frame lost), the device stayed in service, and after a power
/// cut of every server the next open read that copy first, without the
/// record: the row was not covered, and the missing unit decoded from
/// members the cut had torn, a flushed block read as neither its old nor
/// its new bytes. The copy's device is now failed, on the superblocks,
/// before the stripe is written, as for the intent map.
#[test]
fn a_degraded_write_whose_log_record_one_copy_missed_fails_that_device_first() {
    let rig = CopiesRig::new();
    let array = rig.open();
    // The stripe's intent mark is set, so the degraded write below writes
    // no copy of the intent map.
    array.write(&vec![5u8; 4096], 4096, false).unwrap();
    let out = rig.geo.place(0, 0).device;
    array.fail_device(out).unwrap();
    let broken = (0..6).find(|&d| d != out).unwrap();
    rig.refuse_metadata_writes(broken, true);
    array.write(&vec![7u8; 4096], 8192, false).unwrap();
    let warnings = array.warnings().join("\n");
    assert_eq!(
        array.member_states()[broken],
        MemberState::Failed,
        "failed by the log record its copy missed, before the stripe is written: {warnings}"
    );
    assert!(
        warnings.contains(&format!(
            "device {broken} failed (metadata area: writing its copy of degraded.log"
        )),
        "{warnings}"
    );
    let mut back = vec![0u8; 4096];
    array.read(&mut back, 8192).unwrap();
    assert!(back.iter().all(|&b| b == 7));
}

/// A re-add records the stripes its member's parity journal held in the
/// missed map before it rewrites the member's area (the journal is gone
/// after that). A copy of the map that missed that record, left in
/// service past a cut that came after the rewrite, would be read first at
/// the next open: the re-add tried again finds an empty journal and no
/// record of those stripes, and leaves the member's stale parity of them
/// in service. The copy's device is failed, on the superblocks, before
/// the member is rewritten, as for the intent map and the degraded-write
/// log: here the rewrite of the member's area fails, and the failure of
/// the copy's device is found on the superblocks after a crash.
#[test]
fn a_re_add_whose_missed_map_record_one_copy_missed_fails_that_device_first() {
    let rig = CopiesRig::with_policy(WritePolicy::Plog);
    // Regions marked clean by the second flush below: the missed map
    // starts empty when the member leaves.
    let mut cfg = ConfigFile::load(rig.dir.path()).unwrap();
    cfg.intent_clear_quiet_ms = 0;
    cfg.store(rig.dir.path()).unwrap();
    let array = rig.open();
    // Partial writes of every stripe's first block: delta records in the
    // journals of each stripe's parity members, flushed.
    let stripes = rig.geo.stripes;
    let stripe_bytes = rig.geo.stripe_data_bytes();
    for s in 0..stripes {
        array
            .write(&vec![3u8; 4096], s * stripe_bytes, false)
            .unwrap();
    }
    array.flush().unwrap();
    array.flush().unwrap();
    assert!(!array.stores[rig.geo.place(0, rig.geo.k as usize).device]
        .journal_stripes()
        .is_empty());
    let out = rig.geo.place(0, rig.geo.k as usize).device;
    array.fail_device(out).unwrap();
    let broken = (0..6).find(|&d| d != out).unwrap();
    rig.refuse_metadata_writes(broken, true);
    // The member's own area cannot be rewritten: the re-add stops there.
    rig.refuse_metadata_writes(out, true);
    let dev = Arc::new(FaultyDevice::new(
        rig.mems[out].clone(),
        Arc::clone(&rig.plans[out]),
    ));
    let e = array.re_add_device(out, dev).unwrap_err();
    let warnings = array.warnings().join("\n");
    assert!(
        warnings.contains(&format!(
            "device {broken} failed (metadata area: writing its copy of missed.map"
        )),
        "the copy that missed the record failed its device ({e}): {warnings}"
    );
    array.simulate_crash();
    rig.refuse_metadata_writes(broken, false);
    rig.refuse_metadata_writes(out, false);
    let array = rig.open();
    assert_eq!(
        array.member_states()[broken],
        MemberState::Failed,
        "failed on the superblocks before the member's area was rewritten"
    );
    let mut back = vec![0u8; 4096];
    for s in 0..stripes {
        array.read(&mut back, s * stripe_bytes).unwrap();
        assert!(back.iter().all(|&b| b == 3), "stripe {s}");
    }
}

/// The poison list names blocks whose unit holds a placeholder: read
/// without it, they would read as zeroes. A copy that fails its check is
/// rewritten at the open from the copy most devices hold; with every copy
/// corrupt the open is refused and says why.
#[test]
fn a_corrupt_copy_of_the_poison_list_is_rewritten_and_every_copy_corrupt_refuses_the_open() {
    let rig = CopiesRig::new();
    let array = rig.open();
    array.poison.add(&[((1, 2, 0), false)]).unwrap();
    let corrupt = |array: &Array, d: usize| {
        let area = array.meta.as_ref().unwrap().area(d).unwrap();
        let f = area.open_file(POISON_FILE).unwrap();
        f.write_at(&[0xff], 20).unwrap();
        f.sync().unwrap();
    };
    corrupt(&array, 0);
    drop(array);
    let array = rig.open();
    assert!(array.poison.contains(1, 2, 0));
    assert!(
        array.warnings().iter().any(|w| w.contains("poison.map")),
        "{:?}",
        array.warnings()
    );
    let mut block = vec![0u8; 4096];
    let at = rig.geo.stripe_data_bytes() + 2 * rig.geo.unit_bytes();
    assert!(array.read(&mut block, at).is_err());
    assert_eq!(array.status().poisoned_blocks, 1);
    for d in 0..6 {
        corrupt(&array, d);
    }
    drop(array);
    let devices = rig
        .mems
        .iter()
        .map(|d| Some(Arc::new(d.clone()) as Arc<dyn Device>))
        .collect();
    let e = Array::open_with_devices(rig.dir.path(), devices, None)
        .err()
        .expect("every copy corrupt refuses the open")
        .to_string();
    assert!(e.contains("poison list") && e.contains("checksum"), "{e}");
}
