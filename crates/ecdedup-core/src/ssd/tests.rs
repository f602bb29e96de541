//! Model and scenario tests of the SSD simulator.
//!
//! The model is a plain map from logical page to the content last written
//! there (few distinct contents, so dedup happens). Random writes, trims and
//! offline passes run against the FTL in every mode and both store modes;
//! after every step the FTL's own consistency check recomputes its state
//! from scratch (maps, reference counts, block lists, index, CRC table,
//! counter identity) and every logical page must read back its model
//! content. Scenario tests tell short stories: what separation does to GC,
//! what each mode does to a duplicate, what a bad geometry is told.

use super::device::SsdDevice;
use super::ftl::*;
use super::latency::LatencyModel;
use super::sim::{OutOfRange, Replay, ReplayConfig};
use super::trace::{synthetic_fingerprint, Synthetic, SyntheticSpec, TraceOp, TraceRequest};
use crate::media::{Device, PlacementDevice, Stream, WriteHint};
use proptest::prelude::*;
use std::collections::HashMap;

/// 32 blocks of 8 pages, a quarter hidden: 192 logical pages on 256.
fn small(mode: DedupMode, store: StoreMode) -> FtlConfig {
    FtlConfig {
        dedup: mode,
        store,
        ..FtlConfig::new(4096, 8, 32, 0.25)
    }
}

/// The bytes of content `id`: distinct for distinct ids.
fn bytes_of(id: u32) -> Vec<u8> {
    let mut page = vec![0u8; 4096];
    for (i, b) in page.iter_mut().enumerate() {
        *b = (id as usize * 31 + i * 7 + (i >> 8)) as u8;
    }
    page[..4].copy_from_slice(&id.to_le_bytes());
    page
}

fn fingerprint_of(id: u32) -> PageFingerprint {
    synthetic_fingerprint(0x7465_7374, id as u64)
}

#[derive(Clone, Debug)]
enum Op {
    Write { lpn: u64, content: u32 },
    Trim { lpn: u64 },
    Pass { pages_max: u64 },
}

/// Writes carry one of `popular` contents half the time (duplicates), a
/// content from a large space otherwise (so the flash fills and GC runs in
/// every mode).
fn ops(logical: u64, popular: u32, len: usize) -> impl Strategy<Value = Vec<Op>> {
    let content = prop_oneof![0..popular, popular..1_000_000];
    let op = prop_oneof![
        12 => (0..logical, content).prop_map(|(lpn, content)| Op::Write { lpn, content }),
        1 => (0..logical).prop_map(|lpn| Op::Trim { lpn }),
        1 => (0u64..40).prop_map(|pages_max| Op::Pass { pages_max }),
    ];
    proptest::collection::vec(op, 1..len)
}

struct Rig {
    ftl: Ftl,
    model: HashMap<u64, u32>,
}

impl Rig {
    fn new(cfg: FtlConfig) -> Rig {
        Rig {
            ftl: Ftl::new(cfg).expect("valid geometry"),
            model: HashMap::new(),
        }
    }

    /// Writes with an arbitrary (often wrong) placement hint: only mode
    /// `hinted` uses it, and no hint may change what reads back.
    fn write(&mut self, lpn: u64, content: u32) {
        let stream = [Stream::Unknown, Stream::Unique, Stream::PossiblyDuplicate]
            [(content as usize + lpn as usize) % 3];
        match self.ftl.config().store {
            StoreMode::Contents => {
                self.ftl
                    .write_placed(lpn, PageData::Bytes(&bytes_of(content)), stream)
            }
            StoreMode::Fingerprints => {
                self.ftl
                    .write_placed(lpn, PageData::Fingerprint(fingerprint_of(content)), stream)
            }
        };
        self.model.insert(lpn, content);
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Write { lpn, content } => self.write(lpn, content),
            Op::Trim { lpn } => {
                self.ftl.trim(lpn);
                self.model.remove(&lpn);
            }
            Op::Pass { pages_max } => {
                self.ftl.offline_pass(pages_max);
            }
        }
    }

    /// The FTL is consistent and every logical page reads back its model.
    fn verify(&mut self) -> Result<(), String> {
        self.ftl.check()?;
        let mut page = vec![0u8; 4096];
        for lpn in 0..self.ftl.logical_pages() {
            let expected = self.model.get(&lpn).copied();
            match self.ftl.config().store {
                StoreMode::Contents => {
                    self.ftl.read(lpn, &mut page);
                    let want = expected.map_or(vec![0u8; 4096], bytes_of);
                    if page != want {
                        return Err(format!("page {lpn} lost content {expected:?}"));
                    }
                }
                StoreMode::Fingerprints => {
                    let (got, _) = self.ftl.read_fingerprint(lpn);
                    if got != expected.map(fingerprint_of) {
                        return Err(format!("page {lpn} lost content {expected:?}"));
                    }
                }
            }
        }
        Ok(())
    }
}

fn run_model(cfg: FtlConfig, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut rig = Rig::new(cfg);
    for (step, op) in ops.iter().enumerate() {
        rig.apply(op);
        if let Err(e) = rig.verify() {
            return Err(TestCaseError::fail(format!(
                "after step {step} ({op:?}): {e}"
            )));
        }
    }
    let c = *rig.ftl.counters();
    prop_assert_eq!(
        c.nand_page_programs,
        c.host_page_writes + c.gc_page_copies - c.dedup_skipped_writes
    );
    let writes = ops.iter().filter(|o| matches!(o, Op::Write { .. })).count() as u64;
    prop_assert_eq!(c.host_page_writes, writes);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn no_dedup_ftl_reads_back_every_page_through_gc(ops in ops(192, 400, 1000)) {
        run_model(small(DedupMode::None, StoreMode::Fingerprints), &ops)?;
    }

    #[test]
    fn inline_dedup_ftl_reads_back_every_page_through_gc(ops in ops(192, 6, 1000)) {
        run_model(small(DedupMode::Inline, StoreMode::Fingerprints), &ops)?;
    }

    #[test]
    fn offline_dedup_ftl_reads_back_every_page_through_gc_and_passes(ops in ops(192, 6, 1000)) {
        run_model(small(DedupMode::Offline, StoreMode::Fingerprints), &ops)?;
    }

    #[test]
    fn separated_dedup_ftl_reads_back_every_page_through_gc_and_passes(ops in ops(192, 6, 1000)) {
        run_model(small(DedupMode::OfflineSeparated, StoreMode::Fingerprints), &ops)?;
    }

    #[test]
    fn hinted_separation_reads_back_every_page_whatever_the_hints(ops in ops(192, 6, 1000)) {
        run_model(small(DedupMode::OfflineHinted, StoreMode::Fingerprints), &ops)?;
        run_model(small(DedupMode::OfflineHinted, StoreMode::Contents), &ops)?;
    }

    #[test]
    fn every_mode_holds_real_bytes_in_contents_mode(ops in ops(192, 8, 600), mode in 0usize..4) {
        run_model(small(DedupMode::ALL[mode], StoreMode::Contents), &ops)?;
    }

    #[test]
    fn cost_benefit_gc_loses_no_page(ops in ops(192, 12, 600), mode in 0usize..4) {
        let cfg = FtlConfig {
            gc_policy: GcPolicy::CostBenefit,
            ..small(DedupMode::ALL[mode], StoreMode::Fingerprints)
        };
        run_model(cfg, &ops)?;
    }

    #[test]
    fn eight_kib_pages_and_a_higher_gc_threshold_lose_no_page(ops in ops(150, 6, 400), mode in 0usize..4) {
        let cfg = FtlConfig {
            page_bytes: 8192,
            gc_free_blocks_min: 3,
            ..FtlConfig::new(8192, 8, 32, 0.4)
        };
        let cfg = FtlConfig { dedup: DedupMode::ALL[mode], ..cfg };
        run_model(cfg, &ops)?;
    }
}

/// Writes `n` random pages (content from `contents`), verifying at the end.
fn churn(rig: &mut Rig, n: u64, contents: u32, seed: u64) {
    let mut s = seed;
    let logical = rig.ftl.logical_pages();
    for _ in 0..n {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let lpn = (s >> 33) % logical;
        let content = ((s >> 13) % contents as u64) as u32;
        rig.write(lpn, content);
        if s.is_multiple_of(97) {
            rig.ftl.offline_pass(u64::MAX);
        }
    }
    rig.verify().unwrap();
}

#[test]
fn every_mode_collects_garbage_and_keeps_the_counters_consistent() {
    for mode in DedupMode::ALL {
        for store in [StoreMode::Contents, StoreMode::Fingerprints] {
            let mut rig = Rig::new(small(mode, store));
            churn(&mut rig, 3000, 1000, 7);
            let r = rig.ftl.report();
            assert!(r.counters.block_erases > 0, "{mode}: GC never ran");
            assert!(r.counters.gc_page_copies > 0, "{mode}: GC never copied");
            assert_eq!(
                r.counters.nand_page_programs,
                r.counters.host_page_writes + r.counters.gc_page_copies
                    - r.counters.dedup_skipped_writes
            );
            assert!(r.write_amplification >= 1.0 || mode == DedupMode::Inline);
            assert_eq!(
                r.free_blocks + r.u_region_blocks + r.nd_region_blocks,
                r.blocks as u64
            );
            assert!(r.erase_count_max >= r.erase_count_min);
            assert!(r.wear_spread >= 1.0);
        }
    }
}

#[test]
fn inline_dedup_writes_one_copy_of_a_page_written_everywhere() {
    let mut rig = Rig::new(small(DedupMode::Inline, StoreMode::Fingerprints));
    for lpn in 0..100 {
        rig.write(lpn, 42);
    }
    rig.verify().unwrap();
    let r = rig.ftl.report();
    assert_eq!(r.counters.nand_page_programs, 1);
    assert_eq!(r.counters.dedup_skipped_writes, 99);
    assert_eq!(r.counters.inline_page_hashes, 100);
    assert_eq!((r.valid_pages, r.mapped_logical_pages), (1, 100));
    assert!((r.dedup_ratio - 100.0).abs() < 1e-9);
    // Overwriting one sharer leaves the others sharing.
    rig.write(5, 43);
    rig.verify().unwrap();
    assert_eq!(rig.ftl.report().valid_pages, 2);
}

#[test]
fn offline_dedup_programs_every_duplicate_then_remaps_it_at_idle_time() {
    let mut rig = Rig::new(small(DedupMode::Offline, StoreMode::Contents));
    for lpn in 0..10 {
        rig.write(lpn, 7);
    }
    let before = rig.ftl.report();
    assert_eq!(before.counters.nand_page_programs, 10);
    assert_eq!(before.valid_pages, 10);
    assert_eq!(before.pending_pages, 10);
    // A pass with a budget of 4 hashes 4 pages: 3 of them are duplicates.
    assert_eq!(rig.ftl.offline_pass(4), 4);
    assert_eq!(rig.ftl.report().counters.offline_remaps, 3);
    assert_eq!(rig.ftl.offline_pass(u64::MAX), 6);
    rig.verify().unwrap();
    let after = rig.ftl.report();
    assert_eq!(after.counters.offline_remaps, 9);
    assert_eq!(after.counters.offline_page_hashes, 10);
    assert_eq!(after.counters.offline_page_lookups, 10);
    assert_eq!(
        after.counters.nand_page_programs, 10,
        "remaps never program"
    );
    assert_eq!((after.valid_pages, after.pending_pages), (1, 0));
}

#[test]
fn the_crc_filter_sends_new_contents_to_the_u_region_and_repeats_to_the_nd_region() {
    let mut rig = Rig::new(small(DedupMode::OfflineSeparated, StoreMode::Fingerprints));
    rig.write(0, 1);
    rig.write(1, 2);
    rig.write(2, 1); // CRC seen: possibly duplicate
    let c = *rig.ftl.counters();
    assert_eq!((c.u_region_page_writes, c.nd_region_page_writes), (2, 1));
    let r = rig.ftl.report();
    assert_eq!((r.u_region_blocks, r.nd_region_blocks), (1, 1));
    // The pass hashes all three, looks up only the ND one, and remaps it.
    rig.ftl.offline_pass(u64::MAX);
    let c = *rig.ftl.counters();
    assert_eq!(
        (
            c.offline_page_hashes,
            c.offline_page_lookups,
            c.offline_remaps
        ),
        (3, 1, 1)
    );
    rig.verify().unwrap();
    // Once every copy of a content is gone, its CRC is unseen again.
    rig.apply(&Op::Trim { lpn: 0 });
    rig.apply(&Op::Trim { lpn: 2 });
    rig.write(3, 1);
    assert_eq!(rig.ftl.counters().u_region_page_writes, 3);
    rig.verify().unwrap();
}

#[test]
fn a_crc_collision_goes_to_the_nd_region_and_is_not_deduplicated() {
    let mut ftl = Ftl::new(small(DedupMode::OfflineSeparated, StoreMode::Fingerprints)).unwrap();
    let a = PageFingerprint { digest: 1, crc: 99 };
    let b = PageFingerprint { digest: 2, crc: 99 };
    ftl.write(0, PageData::Fingerprint(a));
    ftl.write(1, PageData::Fingerprint(b));
    assert_eq!(ftl.counters().nd_region_page_writes, 1);
    ftl.offline_pass(u64::MAX);
    assert_eq!(ftl.counters().offline_remaps, 0);
    assert_eq!(ftl.read_fingerprint(0).0, Some(a));
    assert_eq!(ftl.read_fingerprint(1).0, Some(b));
    ftl.check().unwrap();
}

#[test]
fn contents_mode_compares_bytes_before_sharing_a_page() {
    // Two different pages forced to one digest cannot be written through
    // the public API (it hashes bytes itself), so check the other half of
    // the contract: equal bytes share, different bytes do not.
    let mut rig = Rig::new(small(DedupMode::Inline, StoreMode::Contents));
    rig.write(0, 1);
    rig.write(1, 1);
    rig.write(2, 2);
    assert_eq!(rig.ftl.report().valid_pages, 2);
    assert_eq!(rig.ftl.counters().dedup_verify_mismatches, 0);
    rig.verify().unwrap();
}

#[test]
fn write_latency_is_the_hash_plus_the_program_without_gc() {
    let lat = LatencyModel::default();
    let expect = [
        (DedupMode::None, lat.page_program_ns),
        (DedupMode::Inline, lat.sha1_page_ns + lat.page_program_ns),
        (DedupMode::Offline, lat.page_program_ns),
        (
            DedupMode::OfflineSeparated,
            lat.crc32_page_ns + lat.page_program_ns,
        ),
    ];
    for (mode, ns) in expect {
        let mut ftl = Ftl::new(small(mode, StoreMode::Fingerprints)).unwrap();
        assert_eq!(
            ftl.write(0, PageData::Fingerprint(fingerprint_of(1))),
            ns,
            "{mode}"
        );
    }
    // An inline hit costs only the hash.
    let mut ftl = Ftl::new(small(DedupMode::Inline, StoreMode::Fingerprints)).unwrap();
    ftl.write(0, PageData::Fingerprint(fingerprint_of(1)));
    assert_eq!(
        ftl.write(1, PageData::Fingerprint(fingerprint_of(1))),
        lat.sha1_page_ns
    );
}

#[test]
fn a_write_that_triggers_gc_pays_for_the_copies_and_the_erase() {
    let mut ftl = Ftl::new(small(DedupMode::None, StoreMode::Fingerprints)).unwrap();
    let lat = LatencyModel::default();
    let mut n = 0;
    let mut worst = 0;
    while ftl.counters().block_erases == 0 {
        worst = ftl.write(n % 192, PageData::Fingerprint(fingerprint_of(n as u32)));
        n += 1;
    }
    let c = *ftl.counters();
    assert_eq!(
        worst,
        lat.page_program_ns
            + c.gc_page_copies * (lat.page_read_ns + lat.page_program_ns)
            + c.block_erases * lat.block_erase_ns
    );
    let r = ftl.report();
    assert!(r.write_latency_us_max * 1e3 >= worst as f64 - 1.0);
}

#[test]
fn impossible_geometries_are_refused_with_a_reason() {
    let ok = FtlConfig::new(4096, 64, 64, 0.1);
    assert!(ok.validate().is_ok());
    let cases = [
        (
            FtlConfig {
                page_bytes: 16384,
                ..ok.clone()
            },
            "page size",
        ),
        (
            FtlConfig {
                page_bytes: 512,
                ..ok.clone()
            },
            "page size",
        ),
        (
            FtlConfig {
                pages_per_block: 1,
                ..ok.clone()
            },
            "pages per block",
        ),
        (
            FtlConfig {
                over_provisioning: 0.0,
                ..ok.clone()
            },
            "over-provisioning",
        ),
        (
            FtlConfig {
                over_provisioning: 1.0,
                ..ok.clone()
            },
            "over-provisioning",
        ),
        (
            FtlConfig {
                over_provisioning: f64::NAN,
                ..ok.clone()
            },
            "over-provisioning",
        ),
        (
            FtlConfig {
                over_provisioning: 0.02,
                ..ok.clone()
            },
            "spare pages",
        ),
        (
            FtlConfig {
                blocks: 2,
                ..ok.clone()
            },
            "spare pages",
        ),
        (
            FtlConfig {
                gc_free_blocks_min: 1,
                ..ok.clone()
            },
            "threshold",
        ),
        (
            FtlConfig {
                blocks: u32::MAX,
                ..ok.clone()
            },
            "32-bit",
        ),
    ];
    for (cfg, word) in cases {
        let err = Ftl::new(cfg.clone()).err().expect("refused").to_string();
        assert!(err.contains(word), "{cfg:?}: {err}");
    }
    // Separation needs one more block of spare than the single-frontier modes.
    let edge = FtlConfig::new(4096, 64, 40, 0.051);
    assert!(Ftl::new(edge.clone()).is_ok());
    let err = Ftl::new(FtlConfig {
        dedup: DedupMode::OfflineSeparated,
        ..edge
    })
    .err()
    .expect("refused")
    .to_string();
    assert!(err.contains("2 write frontier"), "{err}");
}

#[test]
fn gc_progresses_at_the_smallest_spare_the_geometry_check_allows() {
    for mode in DedupMode::ALL {
        let base = FtlConfig {
            dedup: mode,
            ..FtlConfig::new(4096, 8, 64, 0.1)
        };
        // Shrink over-provisioning to the edge the check allows.
        let mut op = 0.2;
        while Ftl::new(FtlConfig {
            over_provisioning: op - 0.001,
            ..base.clone()
        })
        .is_ok()
        {
            op -= 0.001;
        }
        let mut rig = Rig::new(FtlConfig {
            over_provisioning: op,
            ..base.clone()
        });
        churn(&mut rig, 3000, 100_000, 3);
        assert!(rig.ftl.counters().block_erases > 0);
    }
}

#[test]
fn a_pass_after_a_content_was_overwritten_skips_it() {
    let mut rig = Rig::new(small(DedupMode::Offline, StoreMode::Fingerprints));
    rig.write(0, 1);
    rig.write(0, 2); // content 1 released while pending
    rig.write(1, 2);
    assert_eq!(rig.ftl.offline_pass(u64::MAX), 2);
    assert_eq!(rig.ftl.counters().offline_remaps, 1);
    rig.verify().unwrap();
}

// ----- separation against plain offline dedup ------------------------------

fn replay_synthetic(modes: &[DedupMode], dup_share: f64, seed: u64) -> Vec<FtlReport> {
    let ftl = FtlConfig {
        dedup: DedupMode::OfflineSeparated,
        ..FtlConfig::new(4096, 64, 1, 0.1)
    };
    let blocks = ftl.blocks_for(8192) as u32; // 32 MiB logical
    let mut replay = Replay::new(ReplayConfig {
        ftl: FtlConfig { blocks, ..ftl },
        modes: modes.to_vec(),
        idle_us: 10_000,
        offline_unbounded: true,
        offline_every: 0,
        out_of_range: OutOfRange::Fail,
    })
    .unwrap();
    replay.prefill();
    let spec = SyntheticSpec {
        logical_bytes: replay.logical_bytes(),
        writes: 8192 * 6,
        dup_share,
        dup_pool: 256,
        burst_pages: 1024,
        seed,
        ..SyntheticSpec::default()
    };
    for req in Synthetic::new(spec) {
        replay.apply(&req).unwrap();
    }
    for ftl in replay.ftls() {
        ftl.check().unwrap();
    }
    replay.summary().modes.into_iter().map(|m| m.ftl).collect()
}

#[test]
fn separation_copies_fewer_pages_in_gc_than_plain_offline_dedup_on_a_workload_with_duplicates() {
    let r = replay_synthetic(
        &[
            DedupMode::None,
            DedupMode::Offline,
            DedupMode::OfflineSeparated,
        ],
        0.3,
        11,
    );
    let copies: Vec<u64> = r.iter().map(|m| m.counters.gc_page_copies).collect();
    let (none, offline, separated) = (copies[0], copies[1], copies[2]);
    assert!(
        offline < none,
        "offline dedup reduces GC copies: {copies:?}"
    );
    assert!(
        (separated as f64) < 0.9 * offline as f64,
        "separation cuts GC copies by over 10% against offline: {copies:?}"
    );
    // Same host writes, same remaps found: only placement differs.
    assert_eq!(
        r[1].counters.host_page_writes,
        r[2].counters.host_page_writes
    );
    assert!(r[2].counters.offline_page_lookups < r[2].counters.offline_page_hashes);
    // Fewer copies mean lower write latency (foreground GC).
    assert!(r[2].write_latency_us_mean < r[1].write_latency_us_mean);
}

#[test]
fn without_duplicates_separation_costs_only_the_crc() {
    let r = replay_synthetic(&[DedupMode::Offline, DedupMode::OfflineSeparated], 0.0, 5);
    assert_eq!(r[0].counters.gc_page_copies, r[1].counters.gc_page_copies);
    assert_eq!(r[1].counters.nd_region_page_writes, 0);
    let crc_us = LatencyModel::default().crc32_page_ns as f64 / 1e3;
    assert!((r[1].write_latency_us_mean - r[0].write_latency_us_mean - crc_us).abs() < 1e-6);
}

#[test]
fn inline_dedup_never_programs_a_duplicate_and_pays_sha1_on_every_write() {
    let r = replay_synthetic(&[DedupMode::None, DedupMode::Inline], 0.3, 2);
    assert!(r[1].counters.dedup_skipped_writes > 0);
    assert!(r[1].counters.gc_page_copies < r[0].counters.gc_page_copies);
    assert_eq!(
        r[1].counters.inline_page_hashes,
        r[1].counters.host_page_writes
    );
}

// ----- the replay ------------------------------------------------------------

#[test]
fn eight_kib_pages_compose_two_trace_pages_and_rewrite_partial_pages() {
    let ftl = FtlConfig {
        dedup: DedupMode::OfflineSeparated,
        ..FtlConfig::new(8192, 16, 1, 0.2)
    };
    let blocks = ftl.blocks_for(64) as u32;
    let mut replay = Replay::new(ReplayConfig {
        ftl: FtlConfig { blocks, ..ftl },
        modes: vec![DedupMode::Inline],
        idle_us: 10_000,
        offline_unbounded: false,
        offline_every: 0,
        out_of_range: OutOfRange::Fail,
    })
    .unwrap();
    let f = |n| synthetic_fingerprint(9, n);
    let write = |offset: u64, pages: Vec<PageFingerprint>| TraceRequest {
        time_us: 0,
        op: TraceOp::Write,
        offset,
        length: pages.len() as u64 * 4096,
        pages,
    };
    // Pages 0-1 and 2-3 get equal halves: one program, one dedup hit.
    replay
        .apply(&write(0, vec![f(1), f(2), f(1), f(2)]))
        .unwrap();
    // Half of SSD page 2 (trace page 4): a read-modify-write with a zero half.
    replay.apply(&write(4 * 4096, vec![f(1)])).unwrap();
    // Completing it from the other side makes it equal to page 0.
    replay.apply(&write(5 * 4096, vec![f(2)])).unwrap();
    let s = replay.summary();
    let c = s.modes[0].ftl.counters;
    assert_eq!(c.host_page_writes, 4);
    assert_eq!(c.dedup_skipped_writes, 2);
    assert_eq!(c.nand_page_programs, 2);
    assert_eq!(c.host_page_reads, 2, "two partial writes read first");
    // Beyond the capacity fails by default.
    let end = replay.logical_bytes();
    assert!(replay.apply(&write(end, vec![f(3)])).is_err());
}

#[test]
fn out_of_range_requests_wrap_or_skip_when_asked() {
    for (policy, programs) in [(OutOfRange::Wrap, 1), (OutOfRange::Skip, 0)] {
        let ftl = FtlConfig::new(4096, 8, 1, 0.25);
        let blocks = ftl.blocks_for(64) as u32;
        let mut replay = Replay::new(ReplayConfig {
            ftl: FtlConfig { blocks, ..ftl },
            modes: vec![DedupMode::None],
            idle_us: 10_000,
            offline_unbounded: false,
            offline_every: 0,
            out_of_range: policy,
        })
        .unwrap();
        let end = replay.logical_bytes();
        let req = TraceRequest {
            time_us: 0,
            op: TraceOp::Write,
            offset: end,
            length: 4096,
            pages: vec![synthetic_fingerprint(1, 1)],
        };
        replay.apply(&req).unwrap();
        let s = replay.summary();
        assert_eq!(s.out_of_range_requests, 1);
        assert_eq!(s.modes[0].ftl.counters.nand_page_programs, programs);
    }
}

#[test]
fn an_idle_gap_runs_a_pass_as_long_as_the_gap_allows() {
    let ftl = FtlConfig::new(4096, 8, 1, 0.25);
    let blocks = ftl.blocks_for(64) as u32;
    let mut replay = Replay::new(ReplayConfig {
        ftl: FtlConfig { blocks, ..ftl },
        modes: vec![DedupMode::Offline],
        idle_us: 1000,
        offline_unbounded: false,
        offline_every: 0,
        out_of_range: OutOfRange::Fail,
    })
    .unwrap();
    for i in 0..10 {
        replay
            .apply(&TraceRequest {
                time_us: i,
                op: TraceOp::Write,
                offset: i * 4096,
                length: 4096,
                pages: vec![synthetic_fingerprint(1, 1)],
            })
            .unwrap();
    }
    // 500 us gap: below the idle threshold, no pass.
    let read = |t| TraceRequest {
        time_us: t,
        op: TraceOp::Read,
        offset: 0,
        length: 4096,
        pages: vec![],
    };
    replay.apply(&read(509)).unwrap();
    assert_eq!(replay.summary().modes[0].ftl.counters.offline_passes, 0);
    // 1250 us gap: (50 + 75) us per page → 10 pages hashed.
    replay.apply(&read(509 + 1250)).unwrap();
    let c = replay.summary().modes[0].ftl.counters;
    assert_eq!(
        (c.offline_passes, c.offline_page_hashes, c.offline_remaps),
        (1, 10, 9)
    );
}

#[test]
fn the_markdown_summary_has_a_row_per_mode_and_every_figure() {
    let r = {
        let ftl = FtlConfig {
            dedup: DedupMode::OfflineSeparated,
            ..FtlConfig::new(4096, 8, 1, 0.25)
        };
        let blocks = ftl.blocks_for(256) as u32;
        let mut replay = Replay::new(ReplayConfig {
            ftl: FtlConfig { blocks, ..ftl },
            modes: DedupMode::ALL.to_vec(),
            idle_us: 10_000,
            offline_unbounded: false,
            offline_every: 100,
            out_of_range: OutOfRange::Fail,
        })
        .unwrap();
        let spec = SyntheticSpec {
            logical_bytes: replay.logical_bytes(),
            writes: 2000,
            dup_pool: 16,
            ..SyntheticSpec::default()
        };
        for req in Synthetic::new(spec) {
            replay.apply(&req).unwrap();
        }
        replay.summary()
    };
    let text = super::sim::markdown(&r);
    for mode in ["| none |", "| inline |", "| offline |", "| separated |"] {
        assert!(text.contains(mode), "{text}");
    }
    assert!(text.contains("| gc_page_copies |"));
    assert!(text.contains("| write_latency_us_p99 |"));
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["modes"][0]["gc_copies_vs_none"], 1.0);
    assert!(json["modes"][3]["offline_remaps"].as_u64().unwrap() > 0);
}

// ----- the device --------------------------------------------------------------

fn ssd(mode: DedupMode) -> SsdDevice {
    SsdDevice::with_size(
        "t",
        1 << 20,
        FtlConfig {
            dedup: mode,
            ..FtlConfig::new(8192, 16, 1, 0.25)
        },
    )
    .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Unaligned reads, writes and discards agree with a byte-vector model,
    /// through GC and offline passes.
    #[test]
    fn ssd_device_agrees_with_a_byte_model(
        ops in proptest::collection::vec((0u8..4, 0u64..(1 << 20), 1u64..40_000, 0u32..8), 1..150),
        mode in 0usize..4,
    ) {
        let dev = ssd(DedupMode::ALL[mode]);
        let size = dev.size();
        prop_assert!(size >= 1 << 20);
        let mut model = vec![0u8; size as usize];
        for (kind, offset, len, fill) in ops {
            let offset = offset.min(size - 1);
            let len = len.min(size - offset);
            let range = offset as usize..(offset + len) as usize;
            match kind {
                0 | 1 => {
                    // Half the fills come from four constant patterns (so
                    // duplicates exist), half are unique (so GC runs).
                    let buf: Vec<u8> = if fill < 4 {
                        vec![fill as u8 * 60; len as usize]
                    } else {
                        (0..len).map(|i| (i as u32 ^ offset as u32 ^ fill).to_le_bytes()[i as usize % 3]).collect()
                    };
                    dev.write_at(&buf, offset).unwrap();
                    model[range].copy_from_slice(&buf);
                }
                2 => {
                    dev.discard(offset, len).unwrap();
                    model[range].fill(0);
                }
                _ => {
                    dev.offline_pass(u64::MAX);
                }
            }
            dev.with_ftl(|f| f.check()).map_err(TestCaseError::fail)?;
        }
        let mut back = vec![0u8; size as usize];
        dev.read_at(&mut back, 0).unwrap();
        prop_assert!(back == model, "device disagrees with the model");
    }
}

#[test]
fn requests_beyond_the_device_are_refused_before_any_page_changes() {
    let dev = ssd(DedupMode::None);
    let size = dev.size();
    let mut buf = vec![1u8; 8192];
    assert!(dev.write_at(&buf, size - 4096).is_err());
    assert!(dev.read_at(&mut buf, size - 4096).is_err());
    assert!(dev.discard(u64::MAX - 10, 20).is_err());
    assert_eq!(dev.report().counters.host_page_writes, 0);
    assert!(dev.sync().is_ok());
    assert!(dev.describe().starts_with("ssd:"));
}

#[test]
fn a_repair_write_restores_the_shared_copy_for_every_sharer() {
    let dev = ssd(DedupMode::Inline);
    let page = vec![5u8; 8192];
    dev.write_at(&page, 0).unwrap();
    dev.write_at(&page, 8192).unwrap();
    assert_eq!(dev.report().valid_pages, 1);
    dev.write_hinted(
        &page,
        0,
        WriteHint {
            repair: true,
            ..WriteHint::new(crate::counters::IoClass::Data)
        },
    )
    .unwrap();
    let r = dev.report();
    assert_eq!(r.valid_pages, 1, "still shared, now on a fresh page");
    assert_eq!(r.counters.repair_writes, 1);
    assert_eq!(r.counters.nand_page_programs, 2);
    let mut back = vec![0u8; 16384];
    dev.read_at(&mut back, 0).unwrap();
    assert!(back.iter().all(|&b| b == 5));
    // A repair with other bytes does not touch the sharer.
    let other = vec![6u8; 8192];
    dev.write_hinted(
        &other,
        0,
        WriteHint {
            repair: true,
            ..WriteHint::new(crate::counters::IoClass::Parity)
        },
    )
    .unwrap();
    dev.read_at(&mut back, 0).unwrap();
    assert!(back[..8192].iter().all(|&b| b == 6) && back[8192..].iter().all(|&b| b == 5));
    dev.with_ftl(|f| f.check()).unwrap();
}

#[test]
fn an_array_runs_on_simulated_ssds_and_reads_back_what_it_wrote() {
    use crate::array::{format, Array, CreateOptions, Geometry, WritePolicy};
    use crate::dedup::DedupConfig;
    use std::sync::Arc;
    let (n, k, m, su) = (6u32, 4u32, 2u32, 16384u32);
    let volume_bytes = 64 * k as u64 * su as u64;
    let geo = Geometry::new(n, k, m, su, volume_bytes).unwrap();
    let devs: Vec<Arc<SsdDevice>> = (0..n)
        .map(|i| {
            Arc::new(
                SsdDevice::with_size(
                    &format!("d{i}"),
                    geo.device_bytes_min(),
                    FtlConfig {
                        dedup: DedupMode::Inline,
                        ..FtlConfig::new(4096, 32, 1, 0.2)
                    },
                )
                .unwrap(),
            )
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let opts = CreateOptions {
        devices: (0..n)
            .map(|i| std::path::PathBuf::from(format!("/nonexistent/ssd{i}")))
            .collect(),
        k,
        m,
        stripe_unit_bytes: su,
        volume_bytes,
        intent_region_bytes: 2 * k as u64 * su as u64,
        dedup: DedupConfig::default(),
        write_policy: WritePolicy::Rmw,
        journal_bytes_max: 1 << 20,
        io: crate::media::IoMode::Buffered,
        sparse: true,
        force: false,
        metadata: crate::array::MetadataPlacement::Folder,
    };
    let as_devices = || {
        devs.iter()
            .map(|d| Arc::clone(d) as Arc<dyn Device>)
            .collect::<Vec<_>>()
    };
    format(dir.path(), &opts, as_devices()).unwrap();
    let array = Array::open_with_devices(
        dir.path(),
        as_devices().into_iter().map(Some).collect(),
        None,
    )
    .unwrap();
    let mut model = vec![0u8; volume_bytes as usize];
    let mut s = 1u64;
    for _ in 0..200 {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1);
        let offset = ((s >> 20) % (volume_bytes / 4096 - 8)) * 4096;
        let len = 4096 * (1 + (s >> 50) % 8);
        let buf: Vec<u8> = (0..len)
            .map(|i| ((i / 4096) as u8) ^ ((s >> 8) as u8 & 3))
            .collect();
        array.write(&buf, offset, false).unwrap();
        model[offset as usize..(offset + len) as usize].copy_from_slice(&buf);
    }
    let mut back = vec![0u8; volume_bytes as usize];
    array.read(&mut back, 0).unwrap();
    assert!(back == model, "array on SSDs disagrees with the model");
    for d in &devs {
        d.with_ftl(|f| f.check()).unwrap();
        let r = d.report();
        assert!(r.counters.host_page_writes > 0);
    }
    let skipped: u64 = devs
        .iter()
        .map(|d| d.report().counters.dedup_skipped_writes)
        .sum();
    assert!(
        skipped > 0,
        "identical blocks were deduplicated inside the SSDs"
    );
}

#[test]
fn the_placement_hint_of_an_array_write_reaches_the_simulated_ssd() {
    use crate::array::{format, Array, CreateOptions, Geometry, WritePolicy};
    use crate::dedup::DedupConfig;
    use std::sync::Arc;
    let (n, k, m, su) = (4u32, 2u32, 2u32, 16384u32);
    let volume_bytes = 64 * k as u64 * su as u64;
    let geo = Geometry::new(n, k, m, su, volume_bytes).unwrap();
    // Each SSD sits under a PlacementDevice: the CRC filter above the
    // device decides, the SSD (mode hinted) places by the decision.
    let devs: Vec<Arc<PlacementDevice<SsdDevice>>> = (0..n)
        .map(|i| {
            let ssd = SsdDevice::with_size(
                &format!("d{i}"),
                geo.device_bytes_min(),
                FtlConfig {
                    dedup: DedupMode::OfflineHinted,
                    ..FtlConfig::new(4096, 32, 1, 0.2)
                },
            )
            .unwrap();
            Arc::new(PlacementDevice::new(ssd, 4096))
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let opts = CreateOptions {
        devices: (0..n)
            .map(|i| std::path::PathBuf::from(format!("/nonexistent/ssd{i}")))
            .collect(),
        k,
        m,
        stripe_unit_bytes: su,
        volume_bytes,
        intent_region_bytes: 2 * k as u64 * su as u64,
        dedup: DedupConfig::default(),
        write_policy: WritePolicy::Rmw,
        journal_bytes_max: 1 << 20,
        io: crate::media::IoMode::Buffered,
        sparse: true,
        force: false,
        metadata: crate::array::MetadataPlacement::Folder,
    };
    let as_devices = || {
        devs.iter()
            .map(|d| Arc::clone(d) as Arc<dyn Device>)
            .collect::<Vec<_>>()
    };
    format(dir.path(), &opts, as_devices()).unwrap();
    let array = Array::open_with_devices(
        dir.path(),
        as_devices().into_iter().map(Some).collect(),
        None,
    )
    .unwrap();
    // Two full-stripe passes: the second writes the same blocks again.
    let stripe_bytes = k as u64 * su as u64;
    let data: Vec<u8> = (0..8 * stripe_bytes)
        .map(|i| (i / 4096) as u8 ^ (i % 251) as u8)
        .collect();
    array.write(&data, 0, false).unwrap();
    array.write(&data, 8 * stripe_bytes, false).unwrap();
    let mut back = vec![0u8; data.len()];
    array.read(&mut back, 8 * stripe_bytes).unwrap();
    assert!(back == data, "the second copy reads back");
    let (mut unique, mut nd) = (0, 0);
    for d in &devs {
        let placed = d.counters();
        let r = d.inner().report();
        d.inner().with_ftl(|f| f.check()).unwrap();
        assert_eq!(
            r.counters.hinted_page_writes,
            placed.unique_pages + placed.possibly_duplicate_pages,
            "every classified page arrived with its hint"
        );
        assert_eq!(r.counters.u_region_page_writes, placed.unique_pages);
        assert_eq!(
            r.counters.nd_region_page_writes,
            placed.possibly_duplicate_pages + placed.unknown_pages
        );
        unique += placed.unique_pages;
        nd += placed.possibly_duplicate_pages;
    }
    // The second copy's data blocks repeat the first's on the same devices.
    let data_pages = 8 * stripe_bytes / 4096;
    assert!(unique >= data_pages, "{unique} unique pages");
    assert!(nd >= data_pages, "{nd} possibly-duplicate pages");
    for d in &devs {
        d.inner().offline_pass(u64::MAX);
        d.inner().with_ftl(|f| f.check()).unwrap();
    }
    let remaps: u64 = devs
        .iter()
        .map(|d| d.inner().report().counters.offline_remaps)
        .sum();
    assert!(remaps >= data_pages, "{remaps} remaps");
    array.read(&mut back, 0).unwrap();
    assert!(
        back == data,
        "the first copy still reads back after the pass"
    );
}
