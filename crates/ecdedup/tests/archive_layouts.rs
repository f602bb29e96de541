//! The archive tier beyond the paper (issue 12, item 7): the compact layout
//! (only unique blocks in the data sub-files; reads follow the map) and
//! content-defined chunking (FastCDC chunks laid over fixed blocks), alone
//! and together. Objects with planted duplicates, shifted ones included,
//! read back byte for byte with any m devices gone; the encoded stripes are
//! exactly those holding unique data; scrub repairs, `rm` reclaims, and
//! archives made before the layouts existed still open.

use ecdedup::archive::map::{ContainerMap, Layout};
use ecdedup::archive::{ArchiveStore, Chunking, CreateOptions};
use ecdedup::Error;
use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use std::path::Path;

use crate::support;
use support::archive::{
    first_map, lose_devices_then_read_and_repair, maps, rm_source_then_copy, BLOCK_BYTES,
    CONTAINER_BYTES, DEVICES, K, M,
};

/// FastCDC's smallest allowed sizes around a 512-byte average.
const CDC: Chunking = Chunking::Fastcdc {
    min_bytes: 128,
    avg_bytes: 512,
    max_bytes: 2048,
};

fn options(layout: Layout, chunking: Chunking, exchange: u32) -> CreateOptions {
    support::archive::layout_options(layout, chunking, exchange)
}

fn random(rng: &mut rand::rngs::StdRng, bytes: usize) -> Vec<u8> {
    let mut out = vec![0u8; bytes];
    rng.fill(&mut out[..]);
    out
}

/// An object of pieces, each a copy of a pool piece (a planted duplicate,
/// at whatever byte offset the object has reached: shifted) or fresh bytes
/// of a random length.
fn object(rng: &mut rand::rngs::StdRng, pool: &[Vec<u8>], pieces: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..pieces {
        if rng.gen_bool(0.5) {
            out.extend_from_slice(&pool[rng.gen_range(0..pool.len())]);
        } else {
            let len = rng.gen_range(1..3 * BLOCK_BYTES);
            out.extend(random(rng, len));
        }
    }
    out
}

/// Pieces of a few blocks each: long enough for whole blocks of a shifted
/// copy to be covered by redundant chunks.
fn pool(rng: &mut rand::rngs::StdRng) -> Vec<Vec<u8>> {
    (0..4).map(|i| random(rng, BLOCK_BYTES * (2 + i))).collect()
}

/// Whether each block of a container (sub-file major) holds a byte of a
/// unique chunk, computed from the chunks alone.
fn blocks_holding_unique_chunks(c: &ContainerMap) -> Vec<bool> {
    let blocks = K * c.blocks_per_sub_file as usize;
    let mut holds = vec![false; blocks];
    let mut at = 0u64;
    for chunk in &c.chunks {
        let end = at + chunk.length as u64;
        if chunk.source.is_none() {
            for byte in [at, end - 1] {
                holds[(byte / BLOCK_BYTES as u64) as usize] = true;
            }
            for b in at / BLOCK_BYTES as u64..end / BLOCK_BYTES as u64 {
                holds[b as usize] = true;
            }
        }
        at = end;
    }
    assert_eq!(at, c.data_bytes, "chunks tile the data bytes");
    holds
}

/// Each group encodes as many stripes as its member with the most blocks
/// holding unique data; every such block sits in an encoded stripe; under
/// CDC those blocks are exactly the ones touched by a unique chunk; in the
/// compact layout each data sub-file holds exactly its unique blocks.
fn assert_encoded_stripes_are_the_stripes_holding_unique_data(dir: &Path, layout: Layout) {
    for map in maps(dir) {
        assert_eq!(map.layout, layout);
        for c in &map.containers {
            if !c.chunks.is_empty() {
                let recorded: Vec<bool> = c
                    .sub_files
                    .iter()
                    .flat_map(|s| s.blocks.iter().map(|b| !b.redundant))
                    .collect();
                assert_eq!(recorded, blocks_holding_unique_chunks(c));
            }
            for (j, s) in c.sub_files.iter().enumerate() {
                let file = dir
                    .join(format!("dev{}", s.device))
                    .join(format!("c{:08x}.{j}", c.id));
                let stored = std::fs::metadata(&file).unwrap().len();
                let blocks = match layout {
                    Layout::Paper => s.blocks.len(),
                    Layout::Compact => s.blocks.iter().filter(|b| !b.redundant).count(),
                };
                assert_eq!(stored, (blocks * BLOCK_BYTES) as u64, "{}", file.display());
            }
        }
        for group in &map.groups {
            let mut most = 0;
            for &(c, j) in &group.members {
                let sub = &map.container(c).unwrap().sub_files[j as usize];
                let unique = sub.blocks.iter().filter(|b| !b.redundant).count() as u32;
                most = most.max(unique);
                for b in sub.blocks.iter().filter(|b| !b.redundant) {
                    assert!(b.position < group.encoded);
                }
            }
            assert_eq!(group.encoded, most, "batch {}", map.batch);
        }
    }
}

fn layout_strategy() -> impl Strategy<Value = Layout> {
    prop_oneof![Just(Layout::Paper), Just(Layout::Compact)]
}

fn chunking_strategy() -> impl Strategy<Value = Chunking> {
    prop_oneof![Just(Chunking::Fixed), Just(CDC)]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn every_layout_and_chunking_reads_back_exactly_with_any_m_devices_gone(
        seed in any::<u64>(),
        layout in layout_strategy(),
        chunking in chunking_strategy(),
        exchange in prop_oneof![Just(0u32), Just(2)],
        pieces in prop::collection::vec(1usize..24, 1..4),
        lost in prop::sample::subsequence((0..DEVICES).collect::<Vec<_>>(), 0..=M),
        range in (0.0f64..1.0, 0.0f64..1.0),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let pool = pool(&mut rng);
        let mut store =
            ArchiveStore::create(dir.path(), &options(layout, chunking, exchange)).unwrap();
        let mut objects = Vec::new();
        for (i, &n) in pieces.iter().enumerate() {
            let bytes = object(&mut rng, &pool, n);
            store.put(&format!("o{i}"), &mut &bytes[..]).unwrap();
            objects.push((format!("o{i}"), bytes));
        }
        // A copy of the first object shifted by a few bytes: whole blocks
        // of it are redundant under CDC, almost none under fixed blocks.
        let mut shifted = random(&mut rng, 37);
        shifted.extend_from_slice(&objects[0].1);
        store.put("shifted", &mut &shifted[..]).unwrap();
        objects.push(("shifted".into(), shifted));
        store.seal().unwrap();
        assert_encoded_stripes_are_the_stripes_holding_unique_data(dir.path(), layout);
        let stats = store.stats();
        prop_assert!(stats.stripes_encoded <= stats.stripes);
        if layout == Layout::Compact {
            prop_assert_eq!(stats.stored_data_bytes, stats.unique_blocks * BLOCK_BYTES as u64);
        }
        drop(store);
        lose_devices_then_read_and_repair(dir.path(), &lost, &objects, range);
    }
}

#[test]
fn a_compact_copy_stores_no_data_and_survives_the_loss_of_its_source_object() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(8);
    let mut store =
        ArchiveStore::create(dir.path(), &options(Layout::Compact, Chunking::Fixed, 0)).unwrap();
    let bytes = random(&mut rng, CONTAINER_BYTES as usize);
    store.put("first", &mut &bytes[..]).unwrap();
    store.put("second", &mut &bytes[..]).unwrap();
    store.seal().unwrap();
    let stats = store.stats();
    assert_eq!(
        stats.stored_data_bytes, CONTAINER_BYTES,
        "the copy stores nothing"
    );
    assert_eq!(stats.stripes_encoded, stats.stripes / 2);
    // Lose m devices: the copy is read through its sources, decoded.
    let lost: Vec<usize> = (0..M).collect();
    rm_source_then_copy(dir.path(), store, &bytes, &lost);
}

#[test]
fn content_defined_chunking_finds_a_shifted_copy_that_fixed_blocks_miss() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let original = random(&mut rng, 4 * CONTAINER_BYTES as usize);
    let mut shifted = random(&mut rng, 100);
    shifted.extend_from_slice(&original);
    let mut redundant = Vec::new();
    for chunking in [Chunking::Fixed, CDC] {
        let dir = tempfile::tempdir().unwrap();
        let mut store =
            ArchiveStore::create(dir.path(), &options(Layout::Compact, chunking, 0)).unwrap();
        store.put("original", &mut &original[..]).unwrap();
        store.put("shifted", &mut &shifted[..]).unwrap();
        store.seal().unwrap();
        assert_eq!(store.get("shifted").unwrap(), shifted);
        let s = store.stats();
        redundant.push(s.redundant_blocks as f64 / s.blocks as f64);
    }
    assert!(redundant[0] < 0.05, "fixed: {redundant:?}");
    assert!(redundant[1] > 0.35, "fastcdc: {redundant:?}");
}

#[test]
fn archives_record_their_layout_and_old_ones_still_open() {
    let paper = tempfile::tempdir().unwrap();
    let mut store =
        ArchiveStore::create(paper.path(), &options(Layout::Paper, Chunking::Fixed, 0)).unwrap();
    store.put("a", &mut &[5u8; 3000][..]).unwrap();
    store.seal().unwrap();
    drop(store);
    // The paper-faithful archive is written exactly as before the layouts
    // existed: version 1, no layout fields, ECDAMAP1 maps.
    let config = std::fs::read_to_string(paper.path().join("archive.json")).unwrap();
    assert!(config.contains("\"version\": 1"), "{config}");
    let mut json: serde_json::Value = serde_json::from_str(&config).unwrap();
    let fields = json.as_object_mut().unwrap();
    fields.remove("layout");
    fields.remove("chunking");
    std::fs::write(
        paper.path().join("archive.json"),
        serde_json::to_vec_pretty(&json).unwrap(),
    )
    .unwrap();
    let map = first_map(paper.path());
    assert!(std::fs::read(&map).unwrap().starts_with(b"ECDAMAP1"));
    let store = ArchiveStore::open(paper.path()).unwrap();
    assert_eq!(store.get("a").unwrap(), vec![5u8; 3000]);
    drop(store);

    let compact = tempfile::tempdir().unwrap();
    let mut store =
        ArchiveStore::create(compact.path(), &options(Layout::Compact, CDC, 0)).unwrap();
    store.put("a", &mut &[5u8; 3000][..]).unwrap();
    store.seal().unwrap();
    drop(store);
    let path = compact.path().join("archive.json");
    let config = std::fs::read_to_string(&path).unwrap();
    assert!(
        config.contains("\"version\": 2") && config.contains("compact"),
        "{config}"
    );
    let map = first_map(compact.path());
    assert!(std::fs::read(&map).unwrap().starts_with(b"ECDAMAP2"));
    // A version 1 config cannot claim a layout, and a map must match the
    // archive's layout (each config passing its checksum: a failing one
    // is replaced from the devices' copies).
    let checked = support::archive::with_matching_checksum;
    std::fs::write(
        &path,
        checked(&config.replace("\"version\": 2", "\"version\": 1")),
    )
    .unwrap();
    assert!(matches!(
        ArchiveStore::open(compact.path()),
        Err(Error::Config(_))
    ));
    std::fs::write(&path, checked(&config.replace("compact", "paper"))).unwrap();
    assert!(matches!(
        ArchiveStore::open(compact.path()),
        Err(Error::Corrupt(_))
    ));
    std::fs::write(&path, &config).unwrap();
    ArchiveStore::open(compact.path()).unwrap();
}

#[test]
fn bad_chunk_sizes_are_config_errors() {
    let dir = tempfile::tempdir().unwrap();
    for chunking in [
        Chunking::Fastcdc {
            min_bytes: 0,
            avg_bytes: 512,
            max_bytes: 2048,
        },
        Chunking::Fastcdc {
            min_bytes: 1024,
            avg_bytes: 512,
            max_bytes: 2048,
        },
        Chunking::Fastcdc {
            min_bytes: 128,
            avg_bytes: 513,
            max_bytes: 2048,
        },
        Chunking::Fastcdc {
            min_bytes: 128,
            avg_bytes: 512,
            max_bytes: 1 << 30,
        },
    ] {
        let result = ArchiveStore::create(dir.path(), &options(Layout::Compact, chunking, 0));
        assert!(matches!(result, Err(Error::Config(_))), "{chunking:?}");
    }
    assert!(!dir.path().join("archive.json").exists());
}

#[test]
fn a_corrupt_compact_map_is_refused_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = ArchiveStore::create(dir.path(), &options(Layout::Compact, CDC, 0)).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(4);
    store.put("a", &mut &random(&mut rng, 9000)[..]).unwrap();
    store.seal().unwrap();
    drop(store);
    let map = first_map(dir.path());
    let copies = support::archive::map_copies(dir.path(), &map);
    let good = std::fs::read(&map).unwrap();
    // Each patch keeps the checksum right (resealed), so the map's own
    // checks must catch it: an unknown layout, a chunking that does not
    // match the records, the paper-and-fixed pair a v2 map never has, a
    // block entry claiming a source block under CDC.
    let entries = 28 + 16 + 8 * K;
    for (at, value) in [(10, 9u8), (11, 0), (10, 0), (entries + 8, 1)] {
        let mut corrupt = good.clone();
        corrupt[at] = value;
        if (at, value) == (10, 0) {
            corrupt[11] = 0;
        }
        let body = corrupt.len() - 4;
        let crc = crc32c::crc32c(&corrupt[..body]);
        corrupt[body..].copy_from_slice(&crc.to_le_bytes());
        // Every copy: one good copy would replace the folder's.
        for copy in &copies {
            std::fs::write(copy, &corrupt).unwrap();
        }
        let err = ArchiveStore::open(dir.path()).err();
        assert!(matches!(err, Some(Error::Corrupt(_))), "byte {at}: {err:?}");
    }
    for copy in &copies {
        std::fs::write(copy, &good).unwrap();
    }
    assert_eq!(ArchiveStore::open(dir.path()).unwrap().list().len(), 1);
}
