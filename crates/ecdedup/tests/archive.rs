//! The archive tier (CodePlugin, paper 001) end to end: objects with
//! planted duplicates read back byte for byte, whole and by range, with
//! and without sub-file exchange, with up to m devices gone; the map
//! encodes exactly the virtual stripes that hold a unique block; scrub
//! repairs lost devices; bad input is a typed error.

use ecdedup::archive::map::Layout;
use ecdedup::archive::{ArchiveStore, Chunking, CreateOptions};
use ecdedup::Error;
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use std::path::Path;

use crate::support;
use support::archive::{
    first_map, lose_devices_then_read_and_repair, maps, rm_source_then_copy, BLOCK_BYTES,
    CONTAINER_BYTES, DEVICES, M,
};

fn options(exchange: u32) -> CreateOptions {
    support::archive::layout_options(Layout::Paper, Chunking::Fixed, exchange)
}

/// An object of whole blocks, each drawn from a small shared pool (a
/// planted duplicate) or fresh random bytes, plus a ragged tail.
fn object(rng: &mut rand::rngs::StdRng, pool: &[Vec<u8>], blocks: usize, tail: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..blocks {
        if rng.gen_bool(0.5) {
            out.extend_from_slice(&pool[rng.gen_range(0..pool.len())]);
        } else {
            let mut b = vec![0u8; BLOCK_BYTES];
            rng.fill(&mut b[..]);
            out.extend_from_slice(&b);
        }
    }
    let mut t = vec![0u8; tail];
    rng.fill(&mut t[..]);
    out.extend_from_slice(&t);
    out
}

fn pool(rng: &mut rand::rngs::StdRng) -> Vec<Vec<u8>> {
    (0..6)
        .map(|_| {
            let mut b = vec![0u8; BLOCK_BYTES];
            rng.fill(&mut b[..]);
            b
        })
        .collect()
}

/// Each group encodes as many stripes as its member with the most unique
/// blocks has, and every unique block sits in an encoded stripe.
fn assert_encoded_stripes_hold_exactly_the_unique_blocks(dir: &Path) {
    for map in maps(dir) {
        for (g, group) in map.groups.iter().enumerate() {
            let most_unique = group
                .members
                .iter()
                .map(|&(c, j)| map.container(c).unwrap().sub_files[j as usize].unique_blocks())
                .max()
                .unwrap();
            assert_eq!(
                group.encoded, most_unique,
                "group {g} of batch {}",
                map.batch
            );
            for &(c, j) in &group.members {
                for b in &map.container(c).unwrap().sub_files[j as usize].blocks {
                    if !b.redundant {
                        assert!(b.position < group.encoded);
                    }
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn objects_with_planted_duplicates_read_back_exactly_with_any_m_devices_gone(
        seed in any::<u64>(),
        exchange in prop_oneof![Just(0u32), Just(2), Just(4)],
        sizes in prop::collection::vec((0usize..40, 0usize..BLOCK_BYTES), 1..5),
        lost in prop::sample::subsequence((0..DEVICES).collect::<Vec<_>>(), 0..=M),
        range in (0.0f64..1.0, 0.0f64..1.0),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let pool = pool(&mut rng);
        let mut store = ArchiveStore::create(dir.path(), &options(exchange)).unwrap();
        let mut objects = Vec::new();
        for (i, &(blocks, tail)) in sizes.iter().enumerate() {
            let bytes = object(&mut rng, &pool, blocks, tail);
            store.put(&format!("o{i}"), &mut &bytes[..]).unwrap();
            objects.push(bytes);
            // The same object again: every block is a duplicate.
            if i == 0 {
                store.put("copy", &mut &objects[0][..]).unwrap();
            }
        }
        store.seal().unwrap();
        assert_encoded_stripes_hold_exactly_the_unique_blocks(dir.path());
        let stats = store.stats();
        prop_assert!(stats.stripes_encoded <= stats.stripes);
        drop(store);

        let mut named: Vec<(String, Vec<u8>)> = objects
            .iter()
            .enumerate()
            .map(|(i, bytes)| (format!("o{i}"), bytes.clone()))
            .collect();
        named.push(("copy".into(), objects[0].clone()));
        lose_devices_then_read_and_repair(dir.path(), &lost, &named, range);
    }
}

#[test]
fn a_second_copy_of_an_object_is_redundant_and_costs_no_parity() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut store = ArchiveStore::create(dir.path(), &options(0)).unwrap();
    // Exactly two containers of random bytes, then the same bytes again.
    let mut bytes = vec![0u8; 2 * CONTAINER_BYTES as usize];
    rng.fill(&mut bytes[..]);
    store.put("first", &mut &bytes[..]).unwrap();
    store.put("second", &mut &bytes[..]).unwrap();
    store.seal().unwrap();
    let stats = store.stats();
    assert_eq!(stats.containers_sealed, 4);
    assert_eq!(stats.redundant_blocks, stats.blocks / 2);
    assert_eq!(stats.stripes_encoded, stats.stripes / 2);
    assert_eq!(stats.parity_bytes, stats.plain_parity_bytes / 2);
    let listed = store.list();
    assert_eq!(listed[1].name, "second");
    assert_eq!(listed[1].redundant_blocks, listed[1].blocks);
    assert_eq!(store.get("second").unwrap(), bytes);
}

#[test]
fn removing_the_source_object_keeps_the_blocks_its_copy_refers_to() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(8);
    let mut store = ArchiveStore::create(dir.path(), &options(0)).unwrap();
    let mut bytes = vec![0u8; CONTAINER_BYTES as usize];
    rng.fill(&mut bytes[..]);
    store.put("first", &mut &bytes[..]).unwrap();
    store.put("second", &mut &bytes[..]).unwrap();
    store.seal().unwrap();
    // Lose the devices holding the copy's data: it is read through its sources.
    let lost: Vec<usize> = (1..=M).collect();
    rm_source_then_copy(dir.path(), store, &bytes, &lost);
}

#[test]
fn exchanging_sub_files_never_encodes_more_stripes() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let pool = pool(&mut rng);
    let data: Vec<Vec<u8>> = (0..4).map(|_| object(&mut rng, &pool, 48, 0)).collect();
    let mut encoded = Vec::new();
    for exchange in [0, 2, 4] {
        let dir = tempfile::tempdir().unwrap();
        let mut store = ArchiveStore::create(dir.path(), &options(exchange)).unwrap();
        for (i, d) in data.iter().enumerate() {
            store.put(&format!("o{i}"), &mut &d[..]).unwrap();
        }
        store.seal().unwrap();
        assert_encoded_stripes_hold_exactly_the_unique_blocks(dir.path());
        for (i, d) in data.iter().enumerate() {
            assert_eq!(&store.get(&format!("o{i}")).unwrap(), d);
        }
        encoded.push(store.stats().stripes_encoded);
    }
    assert!(
        encoded[1] <= encoded[0] && encoded[2] <= encoded[1],
        "{encoded:?}"
    );
}

#[test]
fn objects_stay_readable_before_their_container_is_sealed_and_after_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = ArchiveStore::create(dir.path(), &options(0)).unwrap();
    store.put("small", &mut &b"hello archive"[..]).unwrap();
    drop(store);
    let store = ArchiveStore::open(dir.path()).unwrap();
    assert_eq!(store.get("small").unwrap(), b"hello archive");
    assert_eq!(store.list()[0].unsealed_bytes, 13);
}

#[test]
fn bad_requests_are_typed_errors_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = ArchiveStore::create(dir.path(), &options(0)).unwrap();
    store.put("a", &mut &[1u8; 1000][..]).unwrap();
    assert!(matches!(
        store.put("a", &mut &[2u8; 10][..]),
        Err(Error::InvalidRequest(_))
    ));
    assert!(matches!(
        store.put("", &mut &[2u8; 10][..]),
        Err(Error::InvalidRequest(_))
    ));
    let mut buf = [0u8; 10];
    assert!(matches!(
        store.read("a", 995, &mut buf),
        Err(Error::OutOfRange { .. })
    ));
    assert!(matches!(store.get("nope"), Err(Error::InvalidRequest(_))));
    assert!(matches!(
        store.remove("nope"),
        Err(Error::InvalidRequest(_))
    ));
    assert!(matches!(
        ArchiveStore::open(dir.path()),
        Err(Error::Busy(_))
    ));
    store.seal().unwrap();
    assert_eq!(store.get("a").unwrap(), vec![1u8; 1000]);
    drop(store);
    assert!(matches!(
        ArchiveStore::create(dir.path(), &options(0)),
        Err(Error::Config(_))
    ));
    let mut bad = options(0);
    bad.container_bytes = 1000;
    assert!(matches!(
        ArchiveStore::create(&dir.path().join("other"), &bad),
        Err(Error::Config(_))
    ));
}

#[test]
fn a_corrupt_map_or_a_foreign_device_is_refused_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = ArchiveStore::create(dir.path(), &options(0)).unwrap();
    store.put("a", &mut &[1u8; 5000][..]).unwrap();
    store.seal().unwrap();
    drop(store);
    let map = first_map(dir.path());
    let good = std::fs::read(&map).unwrap();
    let mut corrupt = good.clone();
    corrupt[40] ^= 1;
    // Every copy (the folder's and the devices'): one good copy would
    // replace the others (tests/archive_metadata.rs).
    let copies = support::archive::map_copies(dir.path(), &map);
    for path in &copies {
        std::fs::write(path, &corrupt).unwrap();
    }
    assert!(matches!(
        ArchiveStore::open(dir.path()),
        Err(Error::Corrupt(_))
    ));
    for path in &copies {
        std::fs::write(path, &good).unwrap();
    }

    let other = tempfile::tempdir().unwrap();
    ArchiveStore::create(other.path(), &options(0)).unwrap();
    std::fs::copy(
        other.path().join("dev2/archive-device.json"),
        dir.path().join("dev2/archive-device.json"),
    )
    .unwrap();
    assert!(matches!(
        ArchiveStore::open(dir.path()),
        Err(Error::Device { .. })
    ));
}

#[test]
fn an_empty_folder_in_place_of_a_lost_device_is_a_missing_device_and_repair_fills_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut bytes = vec![0u8; 2 * CONTAINER_BYTES as usize + 100];
    rng.fill(&mut bytes[..]);
    let mut store = ArchiveStore::create(dir.path(), &options(0)).unwrap();
    store.put("o", &mut &bytes[..]).unwrap();
    store.seal().unwrap();
    drop(store);
    std::fs::remove_dir_all(dir.path().join("dev1")).unwrap();
    std::fs::create_dir(dir.path().join("dev1")).unwrap();
    let mut store = ArchiveStore::open(dir.path()).unwrap();
    assert_eq!(store.missing_devices(), [1]);
    assert_eq!(store.get("o").unwrap(), bytes);
    let repair = store.scrub(true).unwrap();
    assert_eq!(
        (repair.devices_recreated, repair.unrecoverable_blocks),
        (1, 0)
    );
    drop(store);
    let mut store = ArchiveStore::open(dir.path()).unwrap();
    assert!(store.missing_devices().is_empty());
    let after = store.scrub(false).unwrap();
    assert_eq!(
        after.bad_blocks + after.bad_parity_blocks + after.orphan_files,
        0
    );
    assert_eq!(store.get("o").unwrap(), bytes);
}

/// `scrub --repair` over a batch with more than m files of one group
/// damaged, and another batch with one: the second is repaired all the
/// same (once, an unrecoverable block in any batch left every later
/// batch's damage unrepaired, and the parity check's read of the lost
/// block ended the scrub with an error and no report), and the report
/// says which files were left.
#[test]
fn an_unrecoverable_batch_does_not_stop_the_repair_of_the_others() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(12);
    let mut store = ArchiveStore::create(dir.path(), &options(0)).unwrap();
    let mut objects = Vec::new();
    for name in ["lost", "kept"] {
        let mut bytes = vec![0u8; CONTAINER_BYTES as usize];
        rng.fill(&mut bytes[..]);
        store.put(name, &mut &bytes[..]).unwrap();
        store.seal().unwrap();
        objects.push(bytes);
    }
    drop(store);
    let mut batches = maps(dir.path());
    batches.sort_by_key(|m| m.batch);
    assert_eq!(batches.len(), 2);
    let file = |c: &ecdedup::archive::map::ContainerMap, j: usize| {
        dir.path()
            .join(format!("dev{}", c.sub_files[j].device))
            .join(format!("c{:08x}.{j}", c.id))
    };
    let flip = |path: &Path| {
        let mut bytes = std::fs::read(path).unwrap();
        for b in bytes.iter_mut().step_by(BLOCK_BYTES) {
            *b ^= 0xff;
        }
        std::fs::write(path, bytes).unwrap();
    };
    // Every data sub-file of the first batch's container: three of five
    // members of each stripe, past m = 2.
    let lost = &batches[0].containers[0];
    for j in 0..lost.sub_files.len() {
        flip(&file(lost, j));
    }
    let kept = &batches[1].containers[0];
    let kept_file = file(kept, 1);
    let good = std::fs::read(&kept_file).unwrap();
    flip(&kept_file);
    let mut store = ArchiveStore::open(dir.path()).unwrap();
    let report = store.scrub(true).unwrap();
    assert!(report.unrecoverable_blocks > 0, "{report:?}");
    assert_eq!(
        report.unrepaired_files,
        lost.sub_files.len() as u64,
        "{report:?}"
    );
    assert!(report.files_rewritten >= 1, "{report:?}");
    assert_eq!(
        std::fs::read(&kept_file).unwrap(),
        good,
        "the second batch's file was repaired"
    );
    assert_eq!(store.get("kept").unwrap(), objects[1]);
    assert!(
        store.get("lost").is_err(),
        "the lost object fails, never wrong bytes"
    );
    let again = store.scrub(false).unwrap();
    assert_eq!(
        again.unrecoverable_blocks, report.unrecoverable_blocks,
        "{again:?}"
    );
}

/// Counts what the backend it wraps hashes.
struct Counting {
    inner: ecdedup::fingerprint::gpu::KernelOnCpuBackend,
    chunks: std::sync::atomic::AtomicUsize,
}

impl ecdedup::fingerprint::FingerprintBackend for Counting {
    fn name(&self) -> &str {
        "counting kernel-on-cpu"
    }

    fn fingerprint_batch(
        &self,
        algorithm: ecdedup::fingerprint::Algorithm,
        chunks: &[&[u8]],
        out: &mut Vec<ecdedup::fingerprint::Fingerprint>,
    ) -> Result<(), ecdedup::fingerprint::FingerprintError> {
        self.chunks
            .fetch_add(chunks.len(), std::sync::atomic::Ordering::Relaxed);
        self.inner.fingerprint_batch(algorithm, chunks, out)
    }
}

/// Every file of a sealed archive but the device markers and config copies
/// (which carry the archive's random uuid), by path.
fn sealed_files(dir: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    let mut files = std::collections::BTreeMap::new();
    for sub in std::iter::once("maps".to_string()).chain((0..DEVICES).map(|d| format!("dev{d}"))) {
        for entry in std::fs::read_dir(dir.join(&sub)).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if name != "archive-device.json" && name != "archive.json" {
                files.insert(format!("{sub}/{name}"), std::fs::read(&path).unwrap());
            }
        }
    }
    files
}

/// Sealing hashes through whatever backend the store is given: the GPU
/// backend's packing, pipeline and kernel (built for the CPU here,
/// `KernelOnCpuBackend`) seal, with exchange, exactly the files the CPU
/// backend seals, and every block goes through it.
#[test]
fn the_gpu_pipeline_seals_the_same_archive_as_the_cpu_backend() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(21);
    let pool = pool(&mut rng);
    let objects: Vec<Vec<u8>> = (0..4).map(|_| object(&mut rng, &pool, 30, 100)).collect();
    let seal = |dir: &Path, backend: Option<std::sync::Arc<Counting>>| {
        let mut store = ArchiveStore::create(dir, &options(2)).unwrap();
        if let Some(b) = backend {
            store.set_fingerprint_backend(b);
        }
        for (i, o) in objects.iter().enumerate() {
            store.put(&format!("o{i}"), &mut &o[..]).unwrap();
        }
        store.seal().unwrap();
        store.stats()
    };
    let (cpu, gpu) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let counting = std::sync::Arc::new(Counting {
        inner: ecdedup::fingerprint::gpu::KernelOnCpuBackend::new(
            ecdedup::fingerprint::gpu::PoolLayout::new(2, 64 << 10),
        )
        .unwrap(),
        chunks: Default::default(),
    });
    let cpu_stats = seal(cpu.path(), None);
    let gpu_stats = seal(gpu.path(), Some(std::sync::Arc::clone(&counting)));
    assert_eq!(
        counting.chunks.load(std::sync::atomic::Ordering::Relaxed) as u64,
        gpu_stats.blocks,
        "every block of every sealed container is hashed by the given backend"
    );
    assert!(gpu_stats.redundant_blocks > 0, "{gpu_stats:?}");
    assert_eq!(cpu_stats.redundant_blocks, gpu_stats.redundant_blocks);
    assert_eq!(sealed_files(cpu.path()), sealed_files(gpu.path()));
    let store = ArchiveStore::open(gpu.path()).unwrap();
    for (i, o) in objects.iter().enumerate() {
        assert_eq!(&store.get(&format!("o{i}")).unwrap(), o);
    }
}

fn random_bytes(rng: &mut rand::rngs::StdRng, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    rng.fill(&mut b[..]);
    b
}

/// `rm` of most of a batch frees nothing (one live object holds it); `gc`
/// copies the live object forward and deletes the batch: fewer bytes
/// stored, the object reads back, with m devices lost too. A batch over
/// the threshold is left alone.
#[test]
fn gc_copies_the_live_bytes_out_of_a_mostly_dead_batch() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(31);
    let mut store = ArchiveStore::create(dir.path(), &options(0)).unwrap();
    let quarter = CONTAINER_BYTES as usize / 4;
    let (a, b) = (
        random_bytes(&mut rng, 3 * quarter),
        random_bytes(&mut rng, quarter),
    );
    store.put("a", &mut &a[..]).unwrap();
    store.put("b", &mut &b[..]).unwrap();
    store.seal().unwrap();
    store.remove("a").unwrap();
    let before = store.stats();
    assert_eq!(before.containers_sealed, 1, "b keeps the batch");
    // 25% live: not under 20%.
    let untouched = store.gc(20.0).unwrap();
    assert_eq!(
        (untouched.batches_rewritten, untouched.containers_reclaimed),
        (0, 0)
    );
    let old_maps: Vec<_> = maps(dir.path()).iter().map(|m| m.batch).collect();
    let report = store.gc(50.0).unwrap();
    assert_eq!(report.batches_rewritten, 1, "{report:?}");
    assert_eq!(report.bytes_copied, b.len() as u64);
    assert_eq!(report.containers_reclaimed, 1);
    assert!(
        report.stored_bytes_after * 2 < report.stored_bytes_before,
        "{report:?}"
    );
    let after = store.stats();
    assert_eq!(after.containers_sealed, 1);
    assert_eq!(after.sealed_data_bytes, b.len() as u64);
    let new_maps: Vec<_> = maps(dir.path()).iter().map(|m| m.batch).collect();
    assert!(
        new_maps.iter().all(|m| !old_maps.contains(m)),
        "the old batch is gone"
    );
    assert_eq!(store.get("b").unwrap(), b);
    drop(store);
    lose_devices_then_read_and_repair(dir.path(), &[0, 3], &[("b".to_string(), b)], (0.3, 0.5));
}

/// A batch that another one takes sources from is not rewritten, however
/// little of it is live: the copy's sources keep their place and parity.
/// Once the copy goes too, `rm` reclaims both.
#[test]
fn gc_leaves_a_batch_that_holds_sources_of_another() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(32);
    let mut store = ArchiveStore::create(dir.path(), &options(0)).unwrap();
    let half = CONTAINER_BYTES as usize / 2;
    let (x, w) = (random_bytes(&mut rng, half), random_bytes(&mut rng, half));
    store.put("x", &mut &x[..]).unwrap();
    store.put("w", &mut &w[..]).unwrap();
    store.seal().unwrap();
    store.put("y", &mut &x[..]).unwrap();
    store.seal().unwrap();
    store.remove("x").unwrap();
    store.remove("w").unwrap();
    assert_eq!(store.stats().containers_sealed, 2);
    let report = store.gc(50.0).unwrap();
    assert_eq!(report.batches_rewritten, 0, "{report:?}");
    assert_eq!(report.batches_pinned, 1, "{report:?}");
    assert_eq!(report.stored_bytes_after, report.stored_bytes_before);
    drop(store);
    lose_devices_then_read_and_repair(dir.path(), &[1, 2], &[("y".to_string(), x)], (0.1, 0.8));
    let mut store = ArchiveStore::open(dir.path()).unwrap();
    store.remove("y").unwrap();
    assert_eq!(store.stats().containers_sealed, 0);
}

/// A batch pinned only by a batch that gc rewrites becomes a candidate in
/// the same run (newest first): after rewriting, what the copy's sources
/// need is in the new batch or kept, and everything reads back.
#[test]
fn gc_rewrites_newest_first_and_keeps_every_source_it_needs() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(33);
    let mut store = ArchiveStore::create(dir.path(), &options(2)).unwrap();
    let pool = pool(&mut rng);
    let mut objects = Vec::new();
    for i in 0..8 {
        let bytes = object(&mut rng, &pool, 20, 37);
        store.put(&format!("o{i}"), &mut &bytes[..]).unwrap();
        objects.push((format!("o{i}"), bytes));
    }
    store.seal().unwrap();
    for i in [0, 1, 2, 4, 5, 6] {
        store.remove(&format!("o{i}")).unwrap();
    }
    objects.retain(|(n, _)| n == "o3" || n == "o7");
    let report = store.gc(100.0).unwrap();
    assert!(report.batches_rewritten > 0, "{report:?}");
    assert!(
        report.stored_bytes_after < report.stored_bytes_before,
        "{report:?}"
    );
    for (name, bytes) in &objects {
        assert_eq!(&store.get(name).unwrap(), bytes);
    }
    assert_encoded_stripes_hold_exactly_the_unique_blocks(dir.path());
    // Done: a second pass finds only pinned batches or none.
    let again = store.gc(100.0).unwrap();
    assert_eq!(
        again.stored_bytes_after, again.stored_bytes_before,
        "{again:?}"
    );
    drop(store);
    lose_devices_then_read_and_repair(dir.path(), &[2, 5], &objects, (0.2, 0.6));
}
