//! The array over checksum tables of one resident page per device, with
//! several pages per device: every read and write pages tables in and out,
//! and a dirty page is written by eviction long before the flush.

use super::*;

/// RS(4,2) with a 4 KiB stripe unit and 2600 stripes: 2600 blocks, so 3
/// table pages, per device; the table cache holds one page per device.
fn rig_with_tiny_table_cache() -> Rig {
    let mut rig = Rig::new(6, 4, 2, 4096, 2600);
    let mut cfg = ConfigFile::load(rig.dir.path()).unwrap();
    cfg.checksum_cache_bytes_max = 6;
    cfg.store(rig.dir.path()).unwrap();
    rig.restart();
    rig
}

/// Blocks far apart, so consecutive writes land on different table pages.
fn scattered_writes(rig: &mut Rig, seed: u64, count: u64) {
    let blocks = rig.model.len() as u64 / 4096;
    for i in 0..count {
        let block = (i * 1031 + seed * 7919) % blocks;
        rig.write(block * 4096, &pattern(seed * 1000 + i, 4096));
    }
}

/// A tiny-cache rig after 200 scattered writes and a flush.
fn written_and_flushed(seed: u64) -> Rig {
    let mut rig = rig_with_tiny_table_cache();
    scattered_writes(&mut rig, seed, 200);
    rig.a().flush().unwrap();
    rig
}

fn reads_back_and_scrubs_clean(rig: &Rig) {
    rig.assert_matches_model();
    rig.assert_consistent();
}

#[test]
fn a_table_cache_of_one_page_per_device_reads_back_every_block_after_restarts() {
    let mut rig = rig_with_tiny_table_cache();
    scattered_writes(&mut rig, 1, 300);
    rig.assert_matches_model();
    assert!(rig.a().stats().checksum_table_bytes <= 6 * 8192);
    rig.a().flush().unwrap();
    rig.restart();
    reads_back_and_scrubs_clean(&rig);
}

#[test]
fn pages_evicted_before_a_crash_leave_every_flushed_block_readable() {
    let mut rig = written_and_flushed(2);
    // Written after the flush: their table pages are evicted (written)
    // while the data may or may not be, then the power is cut.
    scattered_writes(&mut rig, 3, 200);
    rig.crash_and_restart();
    reads_back_and_scrubs_clean(&rig);
}

#[test]
fn a_device_out_with_a_tiny_table_cache_is_rebuilt_to_the_model() {
    let mut rig = written_and_flushed(4);
    rig.a().fail_device(2).unwrap();
    // Degraded writes: device 2's entries pile up pinned in its table.
    scattered_writes(&mut rig, 5, 200);
    rig.assert_matches_model();
    rig.replace_and_rebuild(2);
    reads_back_and_scrubs_clean(&rig);
    rig.a().flush().unwrap();
    rig.restart();
    rig.assert_matches_model();
}

/// A dirty page is written ahead of a flush only once a sync of every
/// device covers its entries' writes (`checksum::SyncEpochs`): evicted
/// whenever the cache was full, a page carried entries of writes that
/// other members had not made durable, and a cut that dropped those left
/// rows that were not one codeword while every member matched its entry
/// (the resync's sign of a row no write in flight reached). Here device
/// 0 loses its power at the first write of one of its table's pages
/// after the flush (every write since its last sync undone), the others
/// going on; the next open loses devices 1 and 2 as well. Every block
/// reads a value some write gave it, or fails; and the cache kept its
/// bound, the writes waiting for the syncs it asked for.
#[test]
fn a_page_evicted_ahead_of_its_rows_writes_never_reads_wrong() {
    let mut rig = written_and_flushed(6);
    let blocks = rig.model.len() / 4096;
    let mut written: Vec<Vec<Vec<u8>>> = (0..blocks)
        .map(|b| vec![rig.model[b * 4096..(b + 1) * 4096].to_vec()])
        .collect();
    let plan = Arc::clone(&rig.plans[0]);
    let table = crate::array::layout::CHECKSUM_OFFSET;
    let power = Arc::new(std::sync::atomic::AtomicBool::new(false));
    for p in &rig.plans {
        *p.power.lock().unwrap() = Arc::clone(&power);
    }
    *plan.unsynced.lock().unwrap() = Some(Vec::new());
    *plan.cut_on_write_range.lock().unwrap() = Some((table, table + 3 * 4096));
    let before = rig.a().stats().array.table_page_syncs;
    let mut syncs_asked = 0;
    for i in 0..200u64 {
        let block = ((i * 1031 + 7 * 7919) % blocks as u64) as usize;
        let bytes = pattern(7000 + i, 4096);
        rig.write(block as u64 * 4096, &bytes);
        written[block].push(bytes);
        assert!(rig.a().stats().checksum_table_bytes <= 6 * 8192);
        syncs_asked = rig.a().stats().array.table_page_syncs - before;
        if plan.is_cut() {
            break;
        }
    }
    assert!(plan.is_cut(), "a page of device 0 was written");
    for p in &rig.plans {
        p.restore_power();
    }
    let mut devs = rig.devices();
    devs[1] = None;
    devs[2] = None;
    rig.array.take().unwrap().simulate_crash();
    let array = Array::open_with_devices(rig.dir.path(), devs, None).unwrap();
    let mut got = vec![0u8; 4096];
    let mut wrong = Vec::new();
    for (b, values) in written.iter().enumerate() {
        if array.read(&mut got, b as u64 * 4096).is_ok() && !values.contains(&got) {
            wrong.push(b);
        }
    }
    assert!(
        wrong.is_empty(),
        "{} blocks read as no write left them: {wrong:?}: {:?}",
        wrong.len(),
        array.warnings()
    );
    assert!(
        syncs_asked > 0,
        "the full cache asked for the devices' syncs"
    );
}
