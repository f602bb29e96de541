//! The dedup layer alone against a model: a plain map of address to bytes,
//! under random writes (few distinct contents, so references abound),
//! overwrites, discards, syncs, restarts and crashes.

use super::*;
use crate::fingerprint::CpuBackend;
use crate::media::{FaultPlan, FaultyDevice, MemDevice};
use proptest::prelude::*;

const DATA_OFFSET: u64 = 64 << 10;
const BLOCKS: u64 = 24;

struct Rig {
    dir: tempfile::TempDir,
    mem: MemDevice,
    config: DedupConfig,
    dev: Option<DedupDevice>,
    model: Vec<u8>,
}

impl Rig {
    fn new(config: DedupConfig) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let mem = MemDevice::new("m", DATA_OFFSET + BLOCKS * config.block_bytes as u64);
        let model = vec![0; (BLOCKS * config.block_bytes as u64) as usize];
        let mut rig = Rig {
            dir,
            mem,
            config,
            dev: None,
            model,
        };
        rig.open(true);
        rig
    }

    fn open(&mut self, fresh: bool) {
        let dev = open_layer(
            Arc::new(self.mem.clone()),
            self.config.clone(),
            self.dir.path(),
            fresh,
        );
        self.dev = Some(dev);
    }

    fn d(&self) -> &DedupDevice {
        self.dev.as_ref().unwrap()
    }

    fn check(&self) {
        let mut buf = vec![0u8; self.model.len()];
        self.d().read_at(&mut buf, DATA_OFFSET).unwrap();
        assert!(
            buf == self.model,
            "content differs at {:?}",
            buf.iter().zip(&self.model).position(|(a, b)| a != b)
        );
        let problems = self.d().check();
        assert!(problems.is_empty(), "{problems:?}");
    }
}

/// The layer over `dev` (BLOCKS dedup blocks after DATA_OFFSET), its map
/// in `dir` as device "d".
fn open_layer(dev: Arc<dyn Device>, config: DedupConfig, dir: &Path, fresh: bool) -> DedupDevice {
    let data = BLOCKS * config.block_bytes as u64;
    DedupDevice::open(
        crate::media::OsStorage::shared(),
        dev,
        config,
        Arc::new(CpuBackend::new(Some(1)).unwrap()),
        DATA_OFFSET,
        data,
        dir,
        "d",
        fresh,
    )
    .unwrap()
}

fn content(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_mul(31).wrapping_add((i / 4096) as u8))
        .collect()
}

#[derive(Clone, Debug)]
enum Op {
    Write {
        block: u64,
        blocks: u64,
        seed: u8,
        parity: bool,
    },
    Discard {
        at: u64,
        len: u64,
    },
    Sync,
    Restart,
    Crash,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..BLOCKS, 1u64..4, 0u8..4, any::<bool>()).prop_map(|(block, blocks, seed, parity)| Op::Write { block, blocks, seed, parity }),
        2 => (0..BLOCKS * 4096, 1u64..20_000).prop_map(|(at, len)| Op::Discard { at, len }),
        1 => Just(Op::Sync),
        1 => Just(Op::Restart),
        1 => Just(Op::Crash),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64)
    ))]

    #[test]
    fn the_layer_always_reads_back_its_model(
        policy in 0u8..2, verify in any::<bool>(), index in 1u64..8, big_block in any::<bool>(),
        ops in proptest::collection::vec(op(), 1..40),
    ) {
        let config = DedupConfig {
            policy: if policy == 0 { Policy::All } else { Policy::Parity },
            block_bytes: if big_block { 8192 } else { 4096 },
            algorithm: Algorithm::Sha1,
            index_entries_max: index,
            verify,
        };
        let block = config.block_bytes as u64;
        let mut rig = Rig::new(config);
        let size = rig.model.len() as u64;
        for op in ops {
            match op {
                Op::Write { block: b, blocks, seed, parity } => {
                    // The array writes whole 4 KiB blocks; the layer handles
                    // writes smaller than its dedup block.
                    let at = (b * 4096) % size;
                    let len = (blocks * 4096).min(size - at);
                    let bytes = content(seed, len as usize);
                    let class = if parity { IoClass::Parity } else { IoClass::Data };
                    rig.d().write_hinted(&bytes, DATA_OFFSET + at, WriteHint::new(class)).unwrap();
                    rig.model[at as usize..(at + len) as usize].copy_from_slice(&bytes);
                }
                Op::Discard { at, len } => {
                    let at = at % size;
                    let len = len.min(size - at);
                    rig.d().discard(DATA_OFFSET + at, len).unwrap();
                    rig.model[at as usize..(at + len) as usize].fill(0);
                }
                Op::Sync => rig.d().sync().unwrap(),
                Op::Restart => {
                    rig.d().sync().unwrap();
                    rig.dev = None;
                    rig.open(false);
                }
                Op::Crash => {
                    // kill -9: every issued write stays, nothing more is synced.
                    rig.dev = None;
                    rig.open(false);
                }
            }
            rig.check();
        }
        let _ = block;
    }
}

#[test]
fn identical_blocks_share_one_slot_and_cost_a_record_each() {
    let config = DedupConfig {
        policy: Policy::All,
        algorithm: Algorithm::Sha1,
        ..DedupConfig::default()
    };
    let rig = Rig::new(config);
    let same = vec![7u8; 4096];
    for b in 0..10u64 {
        rig.d().write_at(&same, DATA_OFFSET + b * 4096).unwrap();
    }
    let s = rig.d().stats();
    assert_eq!(
        (
            s.physical_writes,
            s.reference_writes,
            s.dedup_hits,
            s.slots_used
        ),
        (1, 9, 9, 1)
    );
    assert_eq!(s.hash_ops, 10);
    assert_eq!(s.index_entries, 1);
    assert!(
        s.log_bytes < 10 * 64,
        "references cost records, not blocks: {}",
        s.log_bytes
    );
}

#[test]
fn the_parity_policy_fingerprints_parity_writes_only() {
    let config = DedupConfig {
        policy: Policy::Parity,
        algorithm: Algorithm::Sha1,
        ..DedupConfig::default()
    };
    let rig = Rig::new(config);
    let same = vec![9u8; 4096];
    rig.d()
        .write_hinted(&same, DATA_OFFSET, WriteHint::new(IoClass::Data))
        .unwrap();
    rig.d()
        .write_hinted(&same, DATA_OFFSET + 4096, WriteHint::new(IoClass::Data))
        .unwrap();
    rig.d()
        .write_hinted(&same, DATA_OFFSET + 8192, WriteHint::new(IoClass::Parity))
        .unwrap();
    rig.d()
        .write_hinted(&same, DATA_OFFSET + 12288, WriteHint::new(IoClass::Parity))
        .unwrap();
    let s = rig.d().stats();
    assert_eq!(s.hash_ops, 2);
    assert_eq!(
        (
            s.physical_writes,
            s.dedup_hits,
            s.physical_parity_writes,
            s.reference_parity_writes
        ),
        (3, 1, 1, 1)
    );
}

#[test]
fn a_full_device_of_distinct_blocks_overwrites_in_place_without_running_out_of_slots() {
    let config = DedupConfig {
        policy: Policy::All,
        algorithm: Algorithm::Sha1,
        ..DedupConfig::default()
    };
    let mut rig = Rig::new(config);
    for round in 0..3u8 {
        for b in 0..BLOCKS {
            let bytes = content(round.wrapping_mul(50).wrapping_add(b as u8), 4096);
            rig.d().write_at(&bytes, DATA_OFFSET + b * 4096).unwrap();
            rig.model[(b * 4096) as usize..((b + 1) * 4096) as usize].copy_from_slice(&bytes);
        }
    }
    rig.check();
    rig.dev = None;
    rig.open(false);
    rig.check();
}

#[test]
fn a_torn_map_log_keeps_every_record_before_the_tear() {
    let config = DedupConfig {
        policy: Policy::All,
        algorithm: Algorithm::Sha1,
        ..DedupConfig::default()
    };
    let mut rig = Rig::new(config);
    rig.d().write_at(&vec![1u8; 4096], DATA_OFFSET).unwrap();
    rig.model[..4096].fill(1);
    rig.d().sync().unwrap();
    rig.dev = None;
    let log = rig.dir.path().join("d.log");
    let mut bytes = std::fs::read(&log).unwrap();
    bytes.extend_from_slice(&[0xab; 17]);
    std::fs::write(&log, &bytes).unwrap();
    rig.open(false);
    rig.check();
}

#[test]
fn an_index_at_its_bound_evicts_and_writes_go_on() {
    let config = DedupConfig {
        policy: Policy::All,
        algorithm: Algorithm::Sha1,
        index_entries_max: 2,
        ..DedupConfig::default()
    };
    let rig = Rig::new(config);
    for b in 0..BLOCKS {
        rig.d()
            .write_at(&content(b as u8, 4096), DATA_OFFSET + b * 4096)
            .unwrap();
    }
    let s = rig.d().stats();
    assert_eq!(s.index_entries, 2);
    assert_eq!(s.index_evictions, BLOCKS - 2);
}

fn sha1_all(index_entries_max: u64) -> DedupConfig {
    DedupConfig {
        policy: Policy::All,
        algorithm: Algorithm::Sha1,
        index_entries_max,
        ..DedupConfig::default()
    }
}

fn restart(rig: &mut Rig) {
    rig.d().sync().unwrap();
    rig.dev = None;
    rig.open(false);
}

#[test]
fn a_duplicate_written_after_a_restart_is_a_dedup_hit() {
    let mut rig = Rig::new(sha1_all(1024));
    let a = content(3, 4096);
    rig.d().write_at(&a, DATA_OFFSET).unwrap();
    restart(&mut rig);
    rig.d().write_at(&a, DATA_OFFSET + 5 * 4096).unwrap();
    let s = rig.d().stats();
    assert_eq!((s.dedup_hits, s.physical_writes, s.slots_used), (1, 0, 1));
    rig.model[..4096].copy_from_slice(&a);
    rig.model[5 * 4096..6 * 4096].copy_from_slice(&a);
    rig.check();
}

/// Writes six distinct blocks into an index of two, restarts (through the
/// log alone, or through a snapshot), and expects the two most recent
/// fingerprints to be the ones still found.
fn recency_survives(snapshot: bool) {
    let mut rig = Rig::new(sha1_all(2));
    for b in 0..6u64 {
        rig.d()
            .write_at(&content(b as u8, 4096), DATA_OFFSET + b * 4096)
            .unwrap();
    }
    // Block 4's content is used again (a reference), so 5 and 4 are newest.
    rig.d()
        .write_at(&content(4, 4096), DATA_OFFSET + 6 * 4096)
        .unwrap();
    if snapshot {
        let d = rig.d();
        let mut st = d.state.lock().unwrap();
        d.sync_locked(&mut st).unwrap();
        d.compact(&mut st).unwrap();
    }
    restart(&mut rig);
    let s0 = rig.d().stats();
    assert_eq!(s0.index_entries, 2);
    for (seed, block, hit) in [(5u8, 10u64, true), (4, 11, true), (0, 12, false)] {
        let before = rig.d().stats().dedup_hits;
        rig.d()
            .write_at(&content(seed, 4096), DATA_OFFSET + block * 4096)
            .unwrap();
        let after = rig.d().stats().dedup_hits;
        assert_eq!(after > before, hit, "content {seed} (snapshot: {snapshot})");
    }
}

#[test]
fn a_bounded_index_keeps_its_most_recent_fingerprints_across_a_restart() {
    recency_survives(false);
}

#[test]
fn a_snapshot_keeps_the_index_recency_across_a_restart() {
    recency_survives(true);
}

/// A slot whose fingerprint was evicted from the index is still copied on
/// write: the log still vouches for its old bytes, so overwriting it in
/// place (as an unfingerprinted write of a slot with one reference would
/// be) and crashing would let a later write of the old content reference
/// the new bytes. Parity policy: a block written as parity (fingerprinted),
/// evicted by another parity write, then overwritten as data (not
/// fingerprinted); checked by crashing (no sync) after the overwrite.
#[test]
fn an_evicted_slot_is_copied_on_write_so_a_crash_never_offers_stale_bytes() {
    let parity = WriteHint::new(IoClass::Parity);
    let data = WriteHint::new(IoClass::Data);
    for snapshot in [false, true] {
        let config = DedupConfig {
            policy: Policy::Parity,
            algorithm: Algorithm::Sha1,
            index_entries_max: 1,
            ..DedupConfig::default()
        };
        let mut rig = Rig::new(config);
        let (a, b, c) = (content(1, 4096), content(2, 4096), content(3, 4096));
        rig.d().write_hinted(&a, DATA_OFFSET, parity).unwrap();
        rig.d()
            .write_hinted(&b, DATA_OFFSET + 4096, parity)
            .unwrap();
        let s = rig.d().stats();
        assert_eq!((s.index_entries, s.slot_fingerprints), (1, 2), "a evicted");
        if snapshot {
            let d = rig.d();
            let mut st = d.state.lock().unwrap();
            d.sync_locked(&mut st).unwrap();
            d.compact(&mut st).unwrap();
        }
        rig.d().sync().unwrap();
        let slot_of_a = rig.d().state.lock().unwrap().map[0];
        rig.d().write_hinted(&c, DATA_OFFSET, data).unwrap();
        let now = rig.d().state.lock().unwrap().map[0];
        assert_ne!(now, slot_of_a, "copy on write (snapshot: {snapshot})");
        // Crash: the overwrite's record may or may not be durable.
        rig.dev = None;
        rig.open(false);
        rig.d()
            .write_hinted(&a, DATA_OFFSET + 7 * 4096, parity)
            .unwrap();
        rig.model[..4096].copy_from_slice(&c);
        rig.model[4096..8192].copy_from_slice(&b);
        rig.model[7 * 4096..8 * 4096].copy_from_slice(&a);
        rig.check();
    }
}

#[test]
fn index_memory_is_about_forty_bytes_per_sha1_entry_plus_four_per_slot() {
    let rig = Rig::new(sha1_all(1024));
    for b in 0..BLOCKS {
        rig.d()
            .write_at(&content(b as u8, 4096), DATA_OFFSET + b * 4096)
            .unwrap();
    }
    let s = rig.d().stats();
    assert_eq!(s.index_entries, BLOCKS);
    // 24 entries of 32 bytes in one chunk of 1024 entries, a pointer
    // vector of capacity 4, and 32 buckets of 4 bytes (24 is 3/4 of 32).
    assert_eq!(s.index_bytes, 1024 * 32 + 4 * 16 + 32 * 4);
    assert_eq!(s.slot_entry_bytes, BLOCKS * 4);
}

#[test]
fn every_numeric_stat_has_a_prometheus_type_and_help() {
    let v = serde_json::to_value(DedupStats::default()).unwrap();
    for (name, value) in v.as_object().unwrap() {
        if value.is_number() {
            assert!(
                DedupStats::prometheus_description(name).is_some(),
                "{name} has no Prometheus description"
            );
        }
    }
    assert_eq!(
        DedupStats::prometheus_description("dedup_hits").map(|d| d.0),
        Some("counter")
    );
    assert_eq!(
        DedupStats::prometheus_description("index_bytes").map(|d| d.0),
        Some("gauge")
    );
}

/// A device that counts the reads and writes reaching it.
struct Counting {
    inner: MemDevice,
    writes: std::sync::atomic::AtomicU64,
    reads: std::sync::atomic::AtomicU64,
    /// FUA writes (`write_fua`), counted apart from `writes`.
    fuas: std::sync::atomic::AtomicU64,
}

impl Device for Counting {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.reads.fetch_add(1, Relaxed);
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.writes.fetch_add(1, Relaxed);
        self.inner.write_at(buf, offset)
    }
    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }
    fn write_fua(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.fuas.fetch_add(1, Relaxed);
        self.inner.write_at(buf, offset)?;
        self.inner.sync()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

fn counting_rig(config: DedupConfig) -> (tempfile::TempDir, Arc<Counting>, DedupDevice) {
    let dir = tempfile::tempdir().unwrap();
    let counting = Arc::new(Counting {
        inner: MemDevice::new("m", DATA_OFFSET + BLOCKS * 4096),
        writes: AtomicU64::new(0),
        reads: AtomicU64::new(0),
        fuas: AtomicU64::new(0),
    });
    let dev = open_layer(counting.clone(), config, dir.path(), true);
    (dir, counting, dev)
}

fn read_all(dev: &DedupDevice, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    dev.read_at(&mut buf, DATA_OFFSET).unwrap();
    buf
}

#[test]
fn a_multi_block_write_of_new_content_is_one_slot_write_and_one_append() {
    for (policy, class) in [
        (Policy::All, IoClass::Data),
        (Policy::Parity, IoClass::Data),
    ] {
        let (dir, counting, dev) = counting_rig(DedupConfig {
            policy,
            ..sha1_all(1024)
        });
        let log = dir.path().join("d.log");
        let log_before = std::fs::metadata(&log).unwrap().len();
        let bytes: Vec<u8> = (0..8u8).flat_map(|b| content(b + 1, 4096)).collect();
        dev.write_hinted(&bytes, DATA_OFFSET, WriteHint::new(class))
            .unwrap();
        assert_eq!(
            counting.writes.load(Relaxed),
            1,
            "{policy}: one write for 8 blocks"
        );
        let s = dev.stats();
        assert_eq!(
            (s.physical_writes, s.slots_used, s.mapped_blocks),
            (8, 8, 8)
        );
        assert_eq!(
            s.log_bytes,
            std::fs::metadata(&log).unwrap().len() - log_before,
            "{policy}: counted log bytes are the appended bytes"
        );
        assert_eq!(read_all(&dev, bytes.len()), bytes);
        assert!(dev.check().is_empty());
        // Overwriting: copy on write (all) or in place (parity's data), still one write.
        let again: Vec<u8> = (0..8u8).flat_map(|b| content(b + 100, 4096)).collect();
        dev.write_hinted(&again, DATA_OFFSET, WriteHint::new(class))
            .unwrap();
        assert_eq!(counting.writes.load(Relaxed), 2, "{policy}");
        assert_eq!(read_all(&dev, again.len()), again);
        assert!(dev.check().is_empty());
    }
}

#[test]
fn duplicates_within_one_write_are_references_to_its_fresh_slot() {
    for verify in [false, true] {
        let (dir, counting, dev) = counting_rig(DedupConfig {
            verify,
            ..sha1_all(1024)
        });
        let (a, b) = (content(1, 4096), content(2, 4096));
        let bytes = [&a[..], &b, &a, &a, &b].concat();
        dev.write_at(&bytes, DATA_OFFSET).unwrap();
        let s = dev.stats();
        assert_eq!(
            (
                s.physical_writes,
                s.reference_writes,
                s.dedup_hits,
                s.slots_used
            ),
            (2, 3, 3, 2)
        );
        assert_eq!(s.verify_compares, if verify { 3 } else { 0 });
        assert_eq!(counting.writes.load(Relaxed), 1);
        assert_eq!(read_all(&dev, bytes.len()), bytes);
        assert!(dev.check().is_empty());
        dev.sync().unwrap();
        drop(dev);
        let dev = open_layer(counting.clone(), sha1_all(1024), dir.path(), false);
        assert_eq!(read_all(&dev, bytes.len()), bytes);
        assert!(dev.check().is_empty());
    }
}

#[test]
fn a_multi_block_overwrite_of_a_full_device_goes_block_by_block_in_place() {
    let mut rig = Rig::new(sha1_all(1024));
    for round in 0..3u8 {
        let bytes: Vec<u8> = (0..BLOCKS)
            .flat_map(|b| content(round.wrapping_mul(50).wrapping_add(b as u8), 4096))
            .collect();
        rig.d().write_at(&bytes, DATA_OFFSET).unwrap();
        rig.model.copy_from_slice(&bytes);
        rig.check();
    }
    assert_eq!(rig.d().stats().slots_used, BLOCKS);
    restart(&mut rig);
    rig.check();
}

#[test]
fn a_read_is_one_request_per_run_of_consecutive_slots() {
    let (_dir, counting, dev) = counting_rig(sha1_all(1024));
    // Blocks 0..8 get slots 0..8 in one write; block 3 then moves to a
    // fresh slot (copy on write), and blocks 10..12 stay unmapped.
    let bytes: Vec<u8> = (0..8u8).flat_map(|b| content(b + 1, 4096)).collect();
    dev.write_at(&bytes, DATA_OFFSET).unwrap();
    let moved = content(77, 4096);
    dev.write_at(&moved, DATA_OFFSET + 3 * 4096).unwrap();
    let mut want = bytes.clone();
    want[3 * 4096..4 * 4096].copy_from_slice(&moved);
    want.resize(12 * 4096, 0);
    let reads = |dev: &DedupDevice, off: u64, len: usize| {
        let before = counting.reads.load(Relaxed);
        let mut buf = vec![0u8; len];
        dev.read_at(&mut buf, DATA_OFFSET + off).unwrap();
        (buf, counting.reads.load(Relaxed) - before)
    };
    let (got, n) = reads(&dev, 0, 12 * 4096);
    assert!(got == want, "content");
    // Runs: slots 0..3, slot 8, slots 4..8; the unmapped tail reads none.
    assert_eq!(n, 3);
    // A read that starts and ends inside blocks keeps its edges.
    let (got, n) = reads(&dev, 100, 2 * 4096);
    assert!(got[..] == want[100..2 * 4096 + 100], "unaligned content");
    assert_eq!(n, 1);
    let (got, n) = reads(&dev, 2 * 4096 + 5, 4096);
    assert!(
        got[..] == want[2 * 4096 + 5..3 * 4096 + 5],
        "across a moved block"
    );
    assert_eq!(n, 2);
}

#[test]
fn a_sync_with_no_new_map_record_does_not_sync_the_log() {
    let config = DedupConfig {
        policy: Policy::Parity,
        ..sha1_all(1024)
    };
    let (_dir, _counting, dev) = counting_rig(config);
    let data = WriteHint::new(IoClass::Data);
    dev.write_hinted(&content(1, 4096), DATA_OFFSET, data)
        .unwrap();
    dev.sync().unwrap();
    assert_eq!(dev.stats().log_syncs, 1, "a new mapping is made durable");
    // An in-place overwrite of unfingerprinted data records nothing.
    dev.write_hinted(&content(2, 4096), DATA_OFFSET, data)
        .unwrap();
    dev.sync().unwrap();
    dev.sync().unwrap();
    assert_eq!(dev.stats().log_syncs, 1);
    dev.write_hinted(
        &content(3, 4096),
        DATA_OFFSET + 4096,
        WriteHint::new(IoClass::Parity),
    )
    .unwrap();
    dev.sync().unwrap();
    assert_eq!(
        dev.stats().log_syncs,
        2,
        "a parity write's record is synced"
    );
}

/// A FUA write below the data area (a superblock) goes to the lower
/// device as its own FUA write only while the layer holds nothing
/// unsynced; after a map record it is the write and the layer's whole
/// sync (the record made durable with it), as before 2026-11-29 always.
#[test]
fn a_fua_write_below_the_data_area_passes_through_only_while_the_layer_is_clean() {
    let config = DedupConfig {
        policy: Policy::Parity,
        ..sha1_all(1024)
    };
    let (_dir, counting, dev) = counting_rig(config);
    let fuas = || counting.fuas.load(Relaxed);
    dev.write_fua(b"superblock 1", 0).unwrap();
    assert_eq!(fuas(), 1, "a fresh layer is clean");
    dev.write_hinted(
        &content(3, 4096),
        DATA_OFFSET + 4096,
        WriteHint::new(IoClass::Parity),
    )
    .unwrap();
    let syncs = dev.stats().log_syncs;
    dev.write_fua(b"superblock 2", 0).unwrap();
    assert_eq!(fuas(), 1, "a map record unsynced: the write and the sync");
    assert_eq!(dev.stats().log_syncs, syncs + 1, "the record synced");
    dev.write_fua(b"superblock 3", 0).unwrap();
    assert_eq!(fuas(), 2, "clean again");
    let mut back = [0u8; 12];
    dev.read_at(&mut back, 0).unwrap();
    assert_eq!(&back, b"superblock 3");
    // In the data area it is always the write and the layer's sync.
    dev.write_fua(&content(4, 4096), DATA_OFFSET).unwrap();
    assert_eq!(fuas(), 2);
    assert_eq!(read_all(&dev, 4096), content(4, 4096));
}

/// Two different 4 KiB blocks with one CRC-32C: `base` and `base` with a
/// set of bits flipped whose CRC contribution cancels. CRC is affine, so
/// crc(x ^ e) = crc(x) ^ crc(e) ^ crc(0); among the 33 single-bit blocks,
/// whose contributions crc(e) ^ crc(0) live in a 32-bit space, Gaussian
/// elimination finds a nonempty set summing to zero.
fn crc32c_collision(base: &[u8]) -> Vec<u8> {
    let zero = vec![0u8; base.len()];
    let crc0 = crc32c::crc32c(&zero);
    let bit_block = |i: usize| {
        let mut b = zero.clone();
        b[i / 8] |= 1 << (i % 8);
        b
    };
    // Rows: (contribution, set of bits as a mask), reduced as they come.
    let mut rows: Vec<(u32, u64)> = Vec::new();
    for i in 0..33usize {
        let (mut v, mut mask) = (crc32c::crc32c(&bit_block(i)) ^ crc0, 1u64 << i);
        for &(rv, rm) in &rows {
            if v ^ rv < v {
                v ^= rv;
                mask ^= rm;
            }
        }
        if v == 0 {
            let mut other = base.to_vec();
            for j in 0..33 {
                if mask & (1 << j) != 0 {
                    other[j / 8] ^= 1 << (j % 8);
                }
            }
            return other;
        }
        rows.push((v, mask));
        rows.sort_unstable_by_key(|r| std::cmp::Reverse(r.0));
    }
    unreachable!("33 vectors in a 32-bit space are dependent")
}

#[test]
fn crc32c_fingerprints_are_refused_without_the_byte_compare() {
    let config = DedupConfig {
        policy: Policy::Parity,
        algorithm: Algorithm::Crc32c,
        verify: false,
        ..DedupConfig::default()
    };
    let err = config.validate(32768).unwrap_err().to_string();
    assert!(err.contains("byte compare"), "{err}");
    DedupConfig {
        verify: true,
        ..config
    }
    .validate(32768)
    .unwrap();
}

#[test]
fn with_crc32c_a_chance_match_is_caught_by_the_compare_and_stored_apart() {
    let mut rig = Rig::new(DedupConfig {
        policy: Policy::All,
        algorithm: Algorithm::Crc32c,
        verify: true,
        ..DedupConfig::default()
    });
    let a = content(9, 4096);
    let b = crc32c_collision(&a);
    assert_ne!(a, b);
    assert_eq!(crc32c::crc32c(&a), crc32c::crc32c(&b), "a collision");
    rig.d().write_at(&a, DATA_OFFSET).unwrap();
    rig.d().write_at(&b, DATA_OFFSET + 4096).unwrap();
    let s = rig.d().stats();
    assert_eq!(s.verify_mismatches, 1, "b matched a's CRC, not its bytes");
    assert_eq!((s.physical_writes, s.slots_used), (2, 2));
    // The index keeps the most recent holder of a CRC: a true duplicate
    // of b is a reference.
    rig.d().write_at(&b, DATA_OFFSET + 2 * 4096).unwrap();
    let s = rig.d().stats();
    assert_eq!((s.dedup_hits, s.physical_writes, s.slots_used), (1, 2, 2));
    rig.model[..4096].copy_from_slice(&a);
    rig.model[4096..8192].copy_from_slice(&b);
    rig.model[8192..3 * 4096].copy_from_slice(&b);
    rig.check();
    restart(&mut rig);
    rig.check();
}

/// A device whose first write at `hold_at` stops until the test lets it
/// go, so that a test can act while a write is in flight.
struct Gate {
    inner: MemDevice,
    hold_at: u64,
    entered: std::sync::mpsc::SyncSender<()>,
    release: Mutex<std::sync::mpsc::Receiver<()>>,
    held: std::sync::atomic::AtomicBool,
}

impl Device for Gate {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if offset == self.hold_at && !self.held.swap(true, Relaxed) {
            self.entered.send(()).unwrap();
            self.release.lock().unwrap().recv().unwrap();
        }
        self.inner.write_at(buf, offset)
    }
    fn sync(&self) -> io::Result<()> {
        self.inner.sync()
    }
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

/// Every slot but two in use; a write of two blocks takes those two and
/// is held in flight (its blocks still own their old slots); a write of
/// an unmapped block then finds no free slot and no slot of its own. It
/// must wait for the first write to commit and let its old slots go, not
/// fail or panic.
#[test]
fn a_write_that_finds_no_free_slot_waits_for_writes_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let mem = MemDevice::new("m", DATA_OFFSET + BLOCKS * 4096);
    let open = |dev: Arc<dyn Device>| open_layer(dev, sha1_all(1024), dir.path(), false);
    reset_state(&crate::media::OsStorage, dir.path(), "d").unwrap();
    {
        let dev = open(Arc::new(mem.clone()));
        for b in 0..BLOCKS - 2 {
            dev.write_at(&content(b as u8, 4096), DATA_OFFSET + b * 4096)
                .unwrap();
        }
        dev.sync().unwrap();
        assert_eq!(dev.stats().slots_used, BLOCKS - 2);
    }
    let (entered_tx, entered) = std::sync::mpsc::sync_channel(1);
    let (release, release_rx) = std::sync::mpsc::channel();
    let gate = Arc::new(Gate {
        inner: mem.clone(),
        // The first of the two free slots (ascending allocation).
        hold_at: DATA_OFFSET + (BLOCKS - 2) * 4096,
        entered: entered_tx,
        release: Mutex::new(release_rx),
        held: false.into(),
    });
    let dev = Arc::new(open(gate));
    let new: Vec<u8> = (0..2u8).flat_map(|b| content(100 + b, 4096)).collect();
    let first = {
        let (dev, new) = (dev.clone(), new.clone());
        std::thread::spawn(move || dev.write_at(&new, DATA_OFFSET))
    };
    entered.recv().unwrap();
    let last = content(200, 4096);
    let second = {
        let (dev, last) = (dev.clone(), last.clone());
        std::thread::spawn(move || dev.write_at(&last, DATA_OFFSET + (BLOCKS - 1) * 4096))
    };
    // The second write cannot finish while the first holds the slots
    // (it waits; it must not have failed).
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert!(!second.is_finished(), "found a slot that cannot exist");
    release.send(()).unwrap();
    first.join().unwrap().unwrap();
    second.join().unwrap().unwrap();
    let mut want: Vec<u8> = (0..BLOCKS as u8).flat_map(|b| content(b, 4096)).collect();
    want[..2 * 4096].copy_from_slice(&new);
    want[(BLOCKS as usize - 2) * 4096..(BLOCKS as usize - 1) * 4096].fill(0);
    want[(BLOCKS as usize - 1) * 4096..].copy_from_slice(&last);
    assert!(read_all(&dev, want.len()) == want);
    assert!(dev.check().is_empty(), "{:?}", dev.check());
}

fn sha1_verified() -> DedupConfig {
    DedupConfig {
        verify: true,
        ..sha1_all(1024)
    }
}

/// With the byte compare on, new content over a block's own unshared slot
/// is written in place (as a plain RAID would), its old fingerprint no
/// longer offered; without it, copy on write.
#[test]
fn with_verify_an_unshared_fingerprinted_block_is_rewritten_in_place() {
    for verify in [true, false] {
        let mut rig = Rig::new(DedupConfig {
            verify,
            ..sha1_all(1024)
        });
        let (a, b) = (content(1, 4096), content(2, 4096));
        rig.d().write_at(&a, DATA_OFFSET).unwrap();
        let slot = rig.d().state.lock().unwrap().map[0];
        rig.d().write_at(&b, DATA_OFFSET).unwrap();
        let now = rig.d().state.lock().unwrap().map[0];
        assert_eq!(now == slot, verify, "in place iff verify");
        // a is no longer stored anywhere: writing it is a fresh slot.
        rig.d().write_at(&a, DATA_OFFSET + 4096).unwrap();
        let s = rig.d().stats();
        assert_eq!((s.dedup_hits, s.physical_writes), (0, 3), "verify {verify}");
        // b is still found.
        rig.d().write_at(&b, DATA_OFFSET + 2 * 4096).unwrap();
        assert_eq!(rig.d().stats().dedup_hits, 1);
        rig.model[..4096].copy_from_slice(&b);
        rig.model[4096..8192].copy_from_slice(&a);
        rig.model[8192..3 * 4096].copy_from_slice(&b);
        rig.check();
    }
}

/// A crash after an in-place rewrite (no sync) can leave a record that
/// vouches for the old bytes; a later write of the old content must then
/// be caught by the compare, not become a reference to the new bytes.
#[test]
fn a_crash_after_an_in_place_rewrite_never_references_the_new_bytes_as_old() {
    for snapshot in [false, true] {
        let mut rig = Rig::new(sha1_verified());
        let (a, b) = (content(1, 4096), content(2, 4096));
        rig.d().write_at(&a, DATA_OFFSET).unwrap();
        if snapshot {
            let d = rig.d();
            let mut st = d.state.lock().unwrap();
            d.sync_locked(&mut st).unwrap();
            d.compact(&mut st).unwrap();
        }
        rig.d().sync().unwrap();
        rig.d().write_at(&b, DATA_OFFSET).unwrap();
        // Crash: the rewrite's bytes reached the media (in place), its
        // record may not count; drop the log's tail to make sure.
        rig.dev = None;
        if !snapshot {
            let log = rig.dir.path().join("d.log");
            let len = std::fs::metadata(&log).unwrap().len();
            let f = std::fs::OpenOptions::new().write(true).open(&log).unwrap();
            f.set_len(len - 1).unwrap();
        }
        rig.open(false);
        rig.d().write_at(&a, DATA_OFFSET + 5 * 4096).unwrap();
        let s = rig.d().stats();
        // Without the snapshot the torn log still says the slot holds a:
        // the compare refuses it. With it, the rewrite's record survived.
        let refused = if snapshot { 0 } else { 1 };
        assert_eq!((s.verify_mismatches, s.dedup_hits), (refused, 0));
        rig.model[..4096].copy_from_slice(&b);
        rig.model[5 * 4096..6 * 4096].copy_from_slice(&a);
        rig.check();
    }
}

/// An earlier block of a request that references a slot keeps it from
/// being rewritten in place by a later block of the same request whose
/// own slot it is.
#[test]
fn a_slot_referenced_earlier_in_a_request_is_not_rewritten_by_a_later_block() {
    let mut rig = Rig::new(sha1_verified());
    let (a, b) = (content(1, 4096), content(2, 4096));
    rig.d().write_at(&a, 2 * 4096 + DATA_OFFSET).unwrap();
    // Blocks 1, 2: block 1 becomes a reference to block 2's slot, then
    // block 2 gets new content.
    let bytes = [&a[..], &b[..]].concat();
    rig.d().write_at(&bytes, DATA_OFFSET + 4096).unwrap();
    rig.model[4096..3 * 4096].copy_from_slice(&bytes);
    rig.check();
    let s = rig.d().stats();
    assert_eq!((s.dedup_hits, s.slots_used), (1, 2));
}

/// A failed in-place rewrite, with a later block of the request referring
/// to it, leaves the counts as the map says (no leaked reference).
#[test]
fn a_failed_rewrite_leaves_reference_counts_that_match_the_map() {
    let dir = tempfile::tempdir().unwrap();
    let mem = MemDevice::new("m", DATA_OFFSET + BLOCKS * 4096);
    let open =
        |dev: Arc<dyn Device>, fresh: bool| open_layer(dev, sha1_verified(), dir.path(), fresh);
    let dev = open(Arc::new(mem.clone()), true);
    dev.write_at(&content(1, 4096), DATA_OFFSET).unwrap();
    let slot = dev.state.lock().unwrap().map[0];
    dev.sync().unwrap();
    drop(dev);
    let plan = FaultPlan::new();
    let at = DATA_OFFSET + slot as u64 * 4096;
    *plan.bad_write_range.lock().unwrap() = Some((at, at + 4096));
    let dev = open(Arc::new(FaultyDevice::new(mem.clone(), plan)), false);
    // Block 0 is rewritten in place with b; block 1 refers to it.
    let b = content(2, 4096);
    let err = dev.write_at(&[&b[..], &b[..]].concat(), DATA_OFFSET);
    assert!(err.is_err());
    assert!(dev.check().is_empty(), "{:?}", dev.check());
}

/// A power loss: the log loses everything after its last sync, while the
/// slot bytes written since may have reached the media. (The device
/// keeps every byte; the log is cut back to `synced_len`.)
fn power_loss(rig: &mut Rig, synced_len: u64) {
    rig.dev = None;
    let log = rig.dir.path().join("d.log");
    let f = std::fs::OpenOptions::new().write(true).open(&log).unwrap();
    f.set_len(synced_len).unwrap();
    rig.open(false);
}

fn log_len(rig: &Rig) -> u64 {
    std::fs::metadata(rig.dir.path().join("d.log"))
        .unwrap()
        .len()
}

/// Blocks 0 and 1 share a slot; block 1 moves away (its record not yet
/// durable), so in RAM the slot is block 0's alone; block 0 then gets
/// new content. Overwriting the slot in place would, after a power loss
/// that keeps the bytes but loses block 1's record, make block 1 read
/// block 0's new bytes.
#[test]
fn a_slot_shared_until_an_unsynced_record_is_not_overwritten_in_place() {
    for config in [sha1_verified(), sha1_all(1024)] {
        let mut rig = Rig::new(config);
        let (a, b, c) = (content(1, 4096), content(2, 4096), content(3, 4096));
        rig.d().write_at(&a, DATA_OFFSET).unwrap();
        rig.d().write_at(&a, DATA_OFFSET + 4096).unwrap();
        rig.d().sync().unwrap();
        let synced = log_len(&rig);
        rig.d().write_at(&c, DATA_OFFSET + 4096).unwrap();
        rig.d().write_at(&b, DATA_OFFSET).unwrap();
        power_loss(&mut rig, synced);
        let got = read_all(rig.d(), 2 * 4096);
        assert!(got[..4096] == a[..] || got[..4096] == b[..], "block 0");
        assert!(got[4096..] == a[..] || got[4096..] == c[..], "block 1");
        assert!(rig.d().check().is_empty());
    }
}

/// A slot two blocks share whose fingerprint was evicted before a
/// snapshot reopens marked fingerprinted (copied on write), so the
/// evicted fingerprint's absence from the snapshot cannot let a later
/// write overwrite it in place.
#[test]
fn a_shared_slot_reopens_marked_fingerprinted_without_its_fingerprint() {
    let mut rig = Rig::new(sha1_all(1));
    let (a, b) = (content(1, 4096), content(2, 4096));
    rig.d().write_at(&a, DATA_OFFSET).unwrap();
    rig.d().write_at(&a, DATA_OFFSET + 4096).unwrap();
    rig.d().write_at(&b, DATA_OFFSET + 2 * 4096).unwrap();
    {
        let d = rig.d();
        let mut st = d.state.lock().unwrap();
        d.sync_locked(&mut st).unwrap();
        d.compact(&mut st).unwrap();
    }
    restart(&mut rig);
    let s = rig.d().stats();
    assert_eq!((s.index_entries, s.slot_fingerprints), (1, 2));
}

/// Found by the fuzz target `dedup_snapshot`: a snapshot whose fingerprint
/// list names a slot past the device indexed the reference counts with it
/// and panicked; it is now a corrupt map.
#[test]
fn a_snapshot_fingerprint_of_a_slot_past_the_device_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mem = MemDevice::new("m", DATA_OFFSET + BLOCKS * 4096);
    drop(open_layer(
        Arc::new(mem.clone()),
        sha1_all(8),
        dir.path(),
        true,
    ));
    let snap = Snapshot {
        map: vec![UNMAPPED; BLOCKS as usize],
        fingerprints: vec![(u32::MAX - 1, Algorithm::Sha1.fingerprint(b"x"))],
    };
    log::write_snapshot(
        crate::media::OsStorage::shared().as_ref(),
        &dir.path().join("d.snap"),
        &snap,
    )
    .unwrap();
    let err = DedupDevice::open(
        crate::media::OsStorage::shared(),
        Arc::new(mem),
        sha1_all(8),
        Arc::new(CpuBackend::new(Some(1)).unwrap()),
        DATA_OFFSET,
        BLOCKS * 4096,
        dir.path(),
        "d",
        false,
    )
    .err()
    .expect("a corrupt snapshot is refused");
    assert!(matches!(err, Error::Corrupt(_)), "{err}");
    assert!(err.to_string().contains("fingerprint of slot"), "{err}");
}

/// The opposite power loss (issue 10): the log keeps every record written
/// since the last sync while the slot writes made since are lost. The
/// records name content their slots do not hold: replay refuses them and
/// each block keeps its content at the sync, with counts that match.
#[test]
fn records_whose_slot_writes_were_lost_are_refused_and_the_blocks_keep_their_synced_content() {
    for config in [sha1_all(1024), sha1_verified(), parity_policy()] {
        let mut rig = Rig::new(config);
        let (a, b, c) = (content(1, 4096), content(2, 4096), content(3, 4096));
        for (i, bytes) in [&a, &b, &a, &c].into_iter().enumerate() {
            rig.d()
                .write_at(bytes, DATA_OFFSET + i as u64 * 4096)
                .unwrap();
        }
        rig.d().sync().unwrap();
        let at_sync = read_all(rig.d(), (BLOCKS * 4096) as usize);
        let mut media = vec![0u8; (BLOCKS * 4096) as usize];
        rig.mem.read_at(&mut media, DATA_OFFSET).unwrap();
        // New content (fresh slots), a reference to it, an unmap.
        let d = content(4, 4096);
        for i in [0u64, 1, 5] {
            rig.d().write_at(&d, DATA_OFFSET + i * 4096).unwrap();
        }
        rig.d().discard(DATA_OFFSET + 3 * 4096, 4096).unwrap();
        // Power loss: no slot write since the sync reached the media.
        rig.dev = None;
        rig.mem.write_at(&media, DATA_OFFSET).unwrap();
        rig.open(false);
        let got = read_all(rig.d(), (BLOCKS * 4096) as usize);
        let mut want = at_sync.clone();
        want[3 * 4096..4 * 4096].fill(0);
        assert!(
            got == want,
            "every block reads its synced content (block 3 unmapped)"
        );
        assert!(rig.d().stats().refused_records > 0);
        assert!(rig.d().check().is_empty(), "{:?}", rig.d().check());
        // The refused records are gone for good: a clean restart agrees.
        restart(&mut rig);
        assert!(read_all(rig.d(), (BLOCKS * 4096) as usize) == want);
        assert_eq!(rig.d().stats().refused_records, 0);
    }
}

fn parity_policy() -> DedupConfig {
    DedupConfig {
        policy: Policy::Parity,
        ..sha1_all(1024)
    }
}

/// A map log of version 1 (records without content checksums, as the
/// build before issue 10 wrote them) is read, its records believed as
/// they stand, and rewritten as a snapshot and a version 2 log at open.
#[test]
fn a_version_1_map_log_is_read_and_rewritten_in_version_2() {
    let mut rig = Rig::new(sha1_all(1024));
    let a = content(1, 4096);
    rig.d().write_at(&a, DATA_OFFSET + 4096).unwrap();
    rig.d().sync().unwrap();
    rig.dev = None;
    // Block 1 on slot 0, block 2 a reference to it: in version 1 records.
    let v1 = |kind: u8, block: u64, slot: u64| {
        let mut r = vec![0u8; 4];
        r.extend_from_slice(&[kind, 0, 0, 0]);
        r.extend_from_slice(&block.to_le_bytes());
        r.extend_from_slice(&slot.to_le_bytes());
        let crc = crc32c::crc32c(&r[4..]);
        r[..4].copy_from_slice(&crc.to_le_bytes());
        r
    };
    let mut header = [0u8; 32];
    header[..8].copy_from_slice(&log::LOG_MAGIC);
    header[8..12].copy_from_slice(&1u32.to_le_bytes());
    let crc = crc32c::crc32c(&header[..28]);
    header[28..].copy_from_slice(&crc.to_le_bytes());
    let path = rig.dir.path().join("d.log");
    let old = [header.to_vec(), v1(1, 1, 0), v1(2, 2, 0)].concat();
    std::fs::write(&path, &old).unwrap();
    let _ = std::fs::remove_file(rig.dir.path().join("d.snap"));
    rig.open(false);
    let got = read_all(rig.d(), 3 * 4096);
    assert!(got[4096..2 * 4096] == a[..] && got[2 * 4096..] == a[..]);
    assert!(rig.d().check().is_empty());
    let now = std::fs::read(&path).unwrap();
    assert_eq!(now[8..12], log::LOG_VERSION.to_le_bytes(), "rewritten");
    assert!(rig.dir.path().join("d.snap").exists());
}

/// Issue 18 item 3, for the map log: it was compacted only at a sync, so a
/// writer that never flushed grew it without bound, past its room in a
/// metadata area (then ENOSPC). Past a bound a write now syncs (and so
/// compacts) the map first, as a flush would.
#[test]
fn the_map_log_stays_bounded_without_a_flush() {
    let mut rig = Rig::new(DedupConfig {
        policy: Policy::All,
        ..DedupConfig::default()
    });
    let compact_bytes = 16 << 10;
    rig.d().set_log_compact_bytes(compact_bytes);
    let log = rig.dir.path().join("d.log");
    let (a, b) = (content(1, 4096), content(2, 4096));
    let write = |rig: &mut Rig, block: usize, data: &[u8]| {
        let at = DATA_OFFSET + block as u64 * 4096;
        rig.d().write_at(data, at).unwrap();
        rig.model[block * 4096..(block + 1) * 4096].copy_from_slice(data);
    };
    for block in 0..BLOCKS as usize {
        write(&mut rig, block, if block == 0 { &b } else { &a });
    }
    // Blocks 1.. switch between the two contents: every write is a
    // reference to a slot that stays referenced (blocks 0 and 1 keep one
    // of each), a map record and nothing else that would sync.
    let mut longest = 0;
    for i in 0..2000usize {
        let block = 2 + i % (BLOCKS as usize - 2);
        let data = if (i / (BLOCKS as usize - 2)).is_multiple_of(2) {
            &b
        } else {
            &a
        };
        write(&mut rig, block, data);
        longest = longest.max(std::fs::metadata(&log).unwrap().len());
    }
    // One write's record past the sync bound at most.
    assert!(
        longest <= log_sync_bytes(compact_bytes) + 4096,
        "the log reached {longest} bytes"
    );
    rig.check();
    restart(&mut rig);
    rig.check();
}

/// A writer killed while its chunk server runs (a takeover with no power
/// loss): every write the layer answered reads back at the next open with
/// no sync in between (a slot's bytes are written before the map record
/// that points at them, the record before the answer, and the open
/// believes a record past the log's last sync where the slot holds the
/// bytes it names). The array's boot stamps rely on it for a chunk under
/// the layer: a fold's parity write, answered before its mark, stands
/// there (docs/write-hole.md, "A fold's mark after a takeover with no
/// power loss"). Fresh content, a reference to another block's, and an
/// overwrite of a block shared since the last sync, for every policy that
/// hashes what it writes here.
#[test]
fn a_writer_killed_without_a_sync_loses_no_answered_write() {
    let parity_only = DedupConfig {
        policy: Policy::Parity,
        ..sha1_all(1024)
    };
    for config in [sha1_verified(), sha1_all(1024), parity_only] {
        let mut rig = Rig::new(config);
        let (a, b, c) = (content(1, 4096), content(2, 4096), content(3, 4096));
        let hint = WriteHint::new(IoClass::Parity);
        let write = |rig: &Rig, buf: &[u8], block: u64| {
            rig.d()
                .write_hinted(buf, DATA_OFFSET + block * 4096, hint)
                .unwrap()
        };
        write(&rig, &a, 0);
        write(&rig, &a, 1);
        rig.d().sync().unwrap();
        write(&rig, &b, 0);
        write(&rig, &b, 2);
        write(&rig, &c, 1);
        write(&rig, &c, 3);
        // Killed: the layer's state in RAM is gone, every byte it wrote
        // (slots and log) is on the device and in the log's file.
        rig.dev = None;
        rig.open(false);
        let got = read_all(rig.d(), 4 * 4096);
        assert!(
            got == [&b[..], &c, &b, &c].concat(),
            "{:?}",
            rig.config.policy
        );
        assert!(rig.d().check().is_empty(), "{:?}", rig.d().check());
    }
}
