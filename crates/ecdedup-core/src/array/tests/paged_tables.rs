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
