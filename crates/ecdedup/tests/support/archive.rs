//! Archive-tier helpers shared by the archive tests: the batch maps of an
//! archive folder, and the story every layout must pass after sealing
//! (lose devices, read every object back whole and by range, repair, scrub
//! clean).

use ecdedup::archive::map::{BatchMap, Layout};
use ecdedup::archive::{ArchiveStore, Chunking, CreateOptions};
use ecdedup::fingerprint::Algorithm;
use std::path::Path;

/// The small geometry of the archive tests: RS(3,2) over 6 devices,
/// 512-byte blocks.
pub const BLOCK_BYTES: usize = 512;
pub const K: usize = 3;
pub const M: usize = 2;
pub const DEVICES: usize = 6;
/// 8 blocks per sub-file: small containers, so objects span several.
pub const CONTAINER_BYTES: u64 = (K * BLOCK_BYTES * 8) as u64;

/// An archive of that geometry, MD5, a 1 MiB cache.
pub fn layout_options(layout: Layout, chunking: Chunking, exchange: u32) -> CreateOptions {
    CreateOptions {
        k: K,
        m: M,
        device_count: DEVICES,
        container_bytes: CONTAINER_BYTES,
        block_bytes: BLOCK_BYTES as u32,
        fingerprint: Algorithm::Md5,
        cache_bytes: 1 << 20,
        exchange,
        layout,
        chunking,
        ..CreateOptions::default()
    }
}

/// Every sealed batch's map in `dir`.
pub fn maps(dir: &Path) -> Vec<BatchMap> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir.join("maps")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "map") {
            out.push(BatchMap::decode(&std::fs::read(&path).unwrap(), "test").unwrap());
        }
    }
    out
}

/// The path of the first map file in `dir` (an archive of one batch).
pub fn first_map(dir: &Path) -> std::path::PathBuf {
    let entry = std::fs::read_dir(dir.join("maps")).unwrap().next().unwrap();
    entry.unwrap().path()
}

/// Removes devices `lost`, then checks that every object reads back
/// exactly, whole and over the byte range at fractions `range` of it, that
/// `scrub --repair` restores every lost device and that a second scrub
/// finds nothing, and that the objects still read back.
pub fn lose_devices_then_read_and_repair(
    dir: &Path,
    lost: &[usize],
    objects: &[(String, Vec<u8>)],
    range: (f64, f64),
) {
    for &d in lost {
        std::fs::remove_dir_all(dir.join(format!("dev{d}"))).unwrap();
    }
    let store = ArchiveStore::open(dir).unwrap();
    for (name, bytes) in objects {
        assert!(&store.get(name).unwrap() == bytes, "{name} reads back");
        let start = (range.0 * bytes.len() as f64) as usize;
        let len = (range.1 * (bytes.len() - start) as f64) as usize;
        let mut part = vec![0u8; len];
        store.read(name, start as u64, &mut part).unwrap();
        assert!(part[..] == bytes[start..start + len], "{name} by range");
    }
    drop(store);

    let mut store = ArchiveStore::open(dir).unwrap();
    let repaired = store.scrub(true).unwrap();
    assert_eq!(repaired.unrecoverable_blocks, 0);
    assert_eq!(repaired.devices_recreated, lost.len() as u64);
    let clean = store.scrub(false).unwrap();
    assert_eq!(
        clean.bad_blocks + clean.bad_parity_blocks + clean.orphan_files,
        0
    );
    for (name, bytes) in objects {
        assert!(&store.get(name).unwrap() == bytes, "{name} after repair");
    }
}

/// With objects "first" and "second" both `bytes` (the second a copy of
/// the first) sealed in `store`: removing "first" keeps the sources; with
/// devices `lost` gone, "second" reads back through them; removing it too
/// reclaims every container, and every device left holds only its marker
/// and the copies of the config and catalog.
pub fn rm_source_then_copy(dir: &Path, mut store: ArchiveStore, bytes: &[u8], lost: &[usize]) {
    let sealed = store.stats().containers_sealed;
    store.remove("first").unwrap();
    assert_eq!(
        store.stats().containers_sealed,
        sealed,
        "the source is kept"
    );
    drop(store);
    for &d in lost {
        std::fs::remove_dir_all(dir.join(format!("dev{d}"))).unwrap();
    }
    let mut store = ArchiveStore::open(dir).unwrap();
    assert!(store.get("second").unwrap() == bytes);
    store.remove("second").unwrap();
    let stats = store.stats();
    assert_eq!((stats.containers_sealed, stats.objects), (0, 0));
    for d in (0..DEVICES).filter(|d| !lost.contains(d)) {
        let leftover: Vec<_> = std::fs::read_dir(dir.join(format!("dev{d}")))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        let mut leftover = leftover;
        leftover.sort();
        // The marker and the copies of the config and the catalog.
        assert_eq!(
            leftover,
            vec!["archive-device.json", "archive.json", "catalog.json"],
            "dev{d}"
        );
    }
}

/// Options for a small test archive: MD5, a 1 MiB fingerprint cache,
/// `device_count` folders inside the archive folder.
pub fn options(
    k: usize,
    m: usize,
    block_bytes: usize,
    device_count: usize,
    container_bytes: u64,
    exchange: u32,
) -> CreateOptions {
    CreateOptions {
        k,
        m,
        devices: Vec::new(),
        device_count,
        container_bytes,
        block_bytes: block_bytes as u32,
        fingerprint: Algorithm::Md5,
        cache_bytes: 1 << 20,
        exchange,
        verify: None,
        ..CreateOptions::default()
    }
}

/// `json` (a metadata file's text) with a `crc32c` that matches its
/// content, as a bug that wrote wrong content would leave it: what only
/// the structural checks can catch.
pub fn with_matching_checksum(json: &str) -> Vec<u8> {
    let mut value: serde_json::Value = serde_json::from_str(json).unwrap();
    value.as_object_mut().unwrap().remove("crc32c");
    let crc = crc32c::crc32c(&serde_json::to_vec(&value).unwrap());
    value
        .as_object_mut()
        .unwrap()
        .insert("crc32c".into(), crc.into());
    serde_json::to_vec_pretty(&value).unwrap()
}

/// Map file `map` of `dir`'s folder and its copies on the devices.
pub fn map_copies(dir: &Path, map: &Path) -> Vec<std::path::PathBuf> {
    std::iter::once(map.to_path_buf())
        .chain((0..DEVICES).map(|d| dir.join(format!("dev{d}")).join(map.file_name().unwrap())))
        .filter(|p| p.exists())
        .collect()
}
