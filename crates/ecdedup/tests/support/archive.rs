//! Archive-tier helpers shared by the archive tests: the batch maps of an
//! archive folder, and the story every layout must pass after sealing
//! (lose devices, read every object back whole and by range, repair, scrub
//! clean).

use ecdedup::archive::map::BatchMap;
use ecdedup::archive::ArchiveStore;
use std::path::Path;

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
