//! The archive folder lost (issue 12, beyond the paper): every device
//! holds copies of the config and the catalog and m + 1 devices a copy of
//! each map, so `assemble` makes the folder again from any N - m devices
//! in any order; objects with a byte in the unsealed container (whose
//! staging bytes only the folder held) are reported lost and dropped;
//! `scrub` finds and rewrites missing or wrong copies; bad input is
//! refused.

use ecdedup::archive::map::Layout;
use ecdedup::archive::{ArchiveStore, Chunking, CreateOptions};
use ecdedup::Error;
use rand::{Rng, SeedableRng};
use std::path::{Path, PathBuf};

use crate::support;
use support::archive::{layout_options, CONTAINER_BYTES, DEVICES, M};

/// Options with the device folders outside the archive folder, so that the
/// folder can be lost alone.
fn options(devices: &Path, exchange: u32) -> CreateOptions {
    CreateOptions {
        devices: (0..DEVICES)
            .map(|d| devices.join(format!("d{d}")))
            .collect(),
        ..layout_options(Layout::Paper, Chunking::Fixed, exchange)
    }
}

fn random(rng: &mut rand::rngs::StdRng, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    rng.fill(&mut b[..]);
    b
}

fn device(root: &Path, d: usize) -> PathBuf {
    root.join(format!("d{d}"))
}

/// Five sealed objects (two copies among them) and one whose tail is in
/// the open container.
fn archive_with_objects(dir: &Path, devices: &Path) -> Vec<(String, Vec<u8>)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(41);
    let mut store = ArchiveStore::create(dir, &options(devices, 2)).unwrap();
    let a = random(&mut rng, 3 * CONTAINER_BYTES as usize + 100);
    let b = random(&mut rng, CONTAINER_BYTES as usize / 3);
    let mut objects = vec![
        ("a".to_string(), a.clone()),
        ("b".to_string(), b.clone()),
        ("a-copy".to_string(), a),
        ("b-copy".to_string(), b),
    ];
    for (name, bytes) in &objects {
        store.put(name, &mut &bytes[..]).unwrap();
    }
    store.seal().unwrap();
    let late = random(&mut rng, CONTAINER_BYTES as usize / 2);
    store.put("late", &mut &late[..]).unwrap();
    objects.push(("late".to_string(), late));
    objects
}

#[test]
fn a_lost_archive_folder_is_assembled_from_any_n_minus_m_devices_in_any_order() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("arc");
    let objects = archive_with_objects(&dir, root.path());
    std::fs::remove_dir_all(&dir).unwrap();
    let lost = [1usize, 4];
    assert_eq!(lost.len(), M);
    for &d in &lost {
        std::fs::remove_dir_all(device(root.path(), d)).unwrap();
    }
    let given: Vec<PathBuf> = (0..DEVICES)
        .rev()
        .filter(|d| !lost.contains(d))
        .map(|d| device(root.path(), d))
        .collect();
    let again = root.path().join("arc-again");
    let report = ArchiveStore::assemble(&again, &given).unwrap();
    assert_eq!(report.devices_missing, lost);
    assert_eq!(report.objects_lost, ["late"], "{report:?}");
    assert_eq!(report.objects, 4);
    assert!(report.batches > 0);

    let mut store = ArchiveStore::open(&again).unwrap();
    assert_eq!(store.missing_devices(), lost);
    for (name, bytes) in &objects[..4] {
        assert!(&store.get(name).unwrap() == bytes, "{name} reads back");
    }
    assert!(matches!(store.get("late"), Err(Error::InvalidRequest(_))));
    let repair = store.scrub(true).unwrap();
    assert_eq!(repair.unrecoverable_blocks, 0, "{repair:?}");
    assert_eq!(repair.devices_recreated, M as u64);
    let clean = store.scrub(false).unwrap();
    assert_eq!(
        (
            clean.bad_blocks,
            clean.bad_parity_blocks,
            clean.orphan_files,
            clean.bad_metadata_copies
        ),
        (0, 0, 0, 0),
        "{clean:?}"
    );
    // It goes on: the lost object put again, sealed, read back.
    let (name, late) = &objects[4];
    store.put(name, &mut &late[..]).unwrap();
    store.seal().unwrap();
    drop(store);
    let store = ArchiveStore::open(&again).unwrap();
    for (name, bytes) in &objects {
        assert!(&store.get(name).unwrap() == bytes, "{name} after repair");
    }
}

#[test]
fn assemble_refuses_what_is_not_one_archive() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("arc");
    archive_with_objects(&dir, root.path());
    let all: Vec<PathBuf> = (0..DEVICES).map(|d| device(root.path(), d)).collect();
    // The folder still holds its archive.
    assert!(matches!(
        ArchiveStore::assemble(&dir, &all),
        Err(Error::Config(_))
    ));
    let again = root.path().join("again");
    // The same device twice.
    let twice = [all[0].clone(), all[0].clone()];
    assert!(matches!(
        ArchiveStore::assemble(&again, &twice),
        Err(Error::Device { .. })
    ));
    // More than m missing.
    assert!(matches!(
        ArchiveStore::assemble(&again, &all[..DEVICES - M - 1]),
        Err(Error::Unavailable(_))
    ));
    // A device of another archive.
    let other = tempfile::tempdir().unwrap();
    ArchiveStore::create(&other.path().join("arc"), &options(other.path(), 0)).unwrap();
    let mixed = [all[0].clone(), device(other.path(), 1)];
    assert!(matches!(
        ArchiveStore::assemble(&again, &mixed),
        Err(Error::Device { .. })
    ));
    // A folder that is no archive device.
    let blank = root.path().join("blank");
    std::fs::create_dir(&blank).unwrap();
    assert!(matches!(
        ArchiveStore::assemble(&again, &[blank]),
        Err(Error::Device { .. })
    ));
    assert!(!again.join("archive.json").exists(), "nothing was made");
}

#[test]
fn scrub_finds_and_rewrites_a_missing_map_copy_and_a_wrong_config_copy() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("arc");
    let objects = archive_with_objects(&dir, root.path());
    let map_copy = (0..DEVICES)
        .flat_map(|d| std::fs::read_dir(device(root.path(), d)).unwrap())
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "map"))
        .unwrap();
    std::fs::remove_file(&map_copy).unwrap();
    std::fs::write(device(root.path(), 2).join("archive.json"), b"{}").unwrap();
    let mut store = ArchiveStore::open(&dir).unwrap();
    let found = store.scrub(false).unwrap();
    assert_eq!(found.bad_metadata_copies, 2, "{found:?}");
    assert_eq!(store.scrub(true).unwrap().bad_metadata_copies, 2);
    assert_eq!(store.scrub(false).unwrap().bad_metadata_copies, 0);
    assert!(map_copy.exists());
    drop(store);
    // The rewritten copies serve an assemble.
    std::fs::remove_dir_all(&dir).unwrap();
    let all: Vec<PathBuf> = (0..DEVICES).map(|d| device(root.path(), d)).collect();
    let report = ArchiveStore::assemble(&dir, &all).unwrap();
    assert_eq!(report.objects_lost, ["late"]);
    let store = ArchiveStore::open(&dir).unwrap();
    for (name, bytes) in &objects[..4] {
        assert!(&store.get(name).unwrap() == bytes, "{name}");
    }
}
