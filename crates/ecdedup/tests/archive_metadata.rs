//! The archive's metadata files (config, catalog, maps) and their copies
//! (issue 18, items 2 and 4): a copy that fails its checksum is never used
//! or propagated but replaced from a good one, at open and by
//! `scrub --repair`; a catalog whose extents leave their containers is
//! refused with an error, never a panic or a wrong read; archives made
//! before checksums still open; `get -o` leaves no partial file.

use ecdedup::archive::map::Layout;
use ecdedup::archive::{ArchiveStore, Chunking, CreateOptions};
use ecdedup::Error;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use std::path::Path;
use std::process::Command;

use crate::support;
use support::archive::{first_map, CONTAINER_BYTES, DEVICES, M};

fn options() -> CreateOptions {
    support::archive::layout_options(Layout::Paper, Chunking::Fixed, 0)
}

/// An archive in `dir` holding one sealed object of three and a half
/// containers (four extents); its bytes.
fn archive_with_one_object(dir: &Path) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(18);
    let mut bytes = vec![0u8; 3 * CONTAINER_BYTES as usize + 1000];
    rng.fill(&mut bytes[..]);
    let mut store = ArchiveStore::create(dir, &options()).unwrap();
    store.put("o", &mut &bytes[..]).unwrap();
    store.seal().unwrap();
    bytes
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn write_json(path: &Path, value: &Value) {
    std::fs::write(path, serde_json::to_vec_pretty(value).unwrap()).unwrap();
}

/// `value` with a checksum that matches its content.
fn with_matching_checksum(value: Value) -> Value {
    serde_json::from_slice(&support::archive::with_matching_checksum(
        &value.to_string(),
    ))
    .unwrap()
}

/// Sets extent `extent` of object "o" to start at `offset`.
fn with_extent_offset(mut catalog: Value, extent: usize, offset: u64) -> Value {
    catalog["objects"]["o"]["extents"][extent]["offset"] = offset.into();
    catalog
}

/// The folder's catalog and every device's copy.
fn catalog_copies(dir: &Path) -> Vec<std::path::PathBuf> {
    std::iter::once(dir.join("catalog.json"))
        .chain((0..DEVICES).map(|d| dir.join(format!("dev{d}/catalog.json"))))
        .collect()
}

/// Opening `dir` fails as corrupt metadata, saying `needle`.
fn assert_open_refused(dir: &Path, what: &str, needle: &str) {
    match ArchiveStore::open(dir) {
        Err(Error::Corrupt(why)) => assert!(why.contains(needle), "{what}: {why}"),
        other => panic!(
            "{what}: expected corrupt metadata, got {:?}",
            other.map(|_| ())
        ),
    }
}

fn device_catalogs(dir: &Path) -> Vec<Vec<u8>> {
    (0..DEVICES)
        .map(|d| std::fs::read(dir.join(format!("dev{d}/catalog.json"))).unwrap())
        .collect()
}

#[test]
fn an_altered_catalog_is_never_used_or_copied_and_a_good_copy_replaces_it() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = archive_with_one_object(dir.path());
    let copies_before = device_catalogs(dir.path());
    let folder = dir.path().join("catalog.json");
    write_json(&folder, &with_extent_offset(read_json(&folder), 0, 1));

    let mut store = ArchiveStore::open(dir.path()).unwrap();
    // Said, never mended unseen (the CLI prints each line as a warning).
    assert_eq!(store.recovered().len(), 1, "{:?}", store.recovered());
    assert!(
        store.recovered()[0].contains("catalog.json"),
        "{:?}",
        store.recovered()
    );
    assert_eq!(store.get("o").unwrap(), bytes);
    let scrub = store.scrub(false).unwrap();
    assert_eq!(
        (
            scrub.bad_metadata_copies,
            scrub.bad_blocks,
            scrub.orphan_files
        ),
        (0, 0, 0)
    );
    drop(store);
    // The altered offset reached no copy; the folder's is good again.
    for (before, after) in copies_before.iter().zip(device_catalogs(dir.path())) {
        let (before, after): (Value, Value) = (
            serde_json::from_slice(before).unwrap(),
            serde_json::from_slice(&after).unwrap(),
        );
        assert_eq!(before["objects"], after["objects"]);
    }
    assert_eq!(
        read_json(&folder)["objects"],
        serde_json::from_slice::<Value>(&copies_before[0]).unwrap()["objects"]
    );

    // Every copy altered: refused, with the reason.
    for path in catalog_copies(dir.path()) {
        write_json(&path, &with_extent_offset(read_json(&path), 2, 1));
    }
    assert_open_refused(dir.path(), "every copy altered", "checksum");
}

#[test]
fn a_catalog_whose_extents_leave_their_containers_is_refused_without_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    archive_with_one_object(dir.path());
    let folder = dir.path().join("catalog.json");
    let good = read_json(&folder);
    let last = CONTAINER_BYTES;
    for (what, catalog) in [
        (
            "a middle extent shifted",
            with_extent_offset(good.clone(), 1, 1),
        ),
        (
            "an extent past the end",
            with_extent_offset(good.clone(), 3, last),
        ),
        ("an offset near u64::MAX", {
            with_extent_offset(good.clone(), 0, u64::MAX - 1)
        }),
        ("a size its extents do not hold", {
            let mut c = good.clone();
            c["objects"]["o"]["size"] = (4 * CONTAINER_BYTES).into();
            c
        }),
        ("an unknown container", {
            let mut c = good.clone();
            c["objects"]["o"]["extents"][0]["container"] = 999.into();
            c
        }),
    ] {
        let catalog = with_matching_checksum(catalog);
        for path in catalog_copies(dir.path()) {
            write_json(&path, &catalog);
        }
        assert_open_refused(dir.path(), what, "object \"o\"");
    }
}

#[test]
fn a_corrupt_map_anywhere_is_replaced_from_a_good_copy() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = archive_with_one_object(dir.path());
    let map = first_map(dir.path());
    let name = map.file_name().unwrap().to_owned();
    let good = std::fs::read(&map).unwrap();
    let mut corrupt = good.clone();
    corrupt[40] ^= 1;

    // The folder's map: replaced at open; every call works.
    std::fs::write(&map, &corrupt).unwrap();
    let mut store = ArchiveStore::open(dir.path()).unwrap();
    assert_eq!(store.recovered().len(), 1, "{:?}", store.recovered());
    assert!(
        store.recovered()[0].contains(".map"),
        "{:?}",
        store.recovered()
    );
    assert_eq!(std::fs::read(&map).unwrap(), good);
    assert_eq!(store.get("o").unwrap(), bytes);
    assert_eq!(store.list().len(), 1);
    assert_eq!(store.scrub(false).unwrap().bad_metadata_copies, 0);
    drop(store);

    // A device's copy: found by scrub, rewritten by --repair.
    let holders: Vec<_> = (0..DEVICES)
        .map(|d| dir.path().join(format!("dev{d}")).join(&name))
        .filter(|p| p.exists())
        .collect();
    assert_eq!(holders.len(), M + 1);
    std::fs::write(&holders[1], &corrupt).unwrap();
    let mut store = ArchiveStore::open(dir.path()).unwrap();
    assert_eq!(store.scrub(false).unwrap().bad_metadata_copies, 1);
    assert_eq!(store.scrub(true).unwrap().bad_metadata_copies, 1);
    assert_eq!(store.scrub(false).unwrap().bad_metadata_copies, 0);
    assert_eq!(std::fs::read(&holders[1]).unwrap(), good);
    drop(store);

    // Every copy corrupt: refused.
    for path in holders.iter().chain(std::iter::once(&map)) {
        std::fs::write(path, &corrupt).unwrap();
    }
    assert_open_refused(dir.path(), "every map copy", "no device holds a good copy");
}

#[test]
fn a_corrupt_config_in_the_folder_is_replaced_from_the_devices() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = archive_with_one_object(dir.path());
    let config = dir.path().join("archive.json");
    let good = std::fs::read(&config).unwrap();
    let mut altered = read_json(&config);
    altered["exchange"] = 2.into();
    write_json(&config, &altered);
    let store = ArchiveStore::open(dir.path()).unwrap();
    assert_eq!(store.recovered().len(), 1, "{:?}", store.recovered());
    assert!(
        store.recovered()[0].contains("archive.json"),
        "{:?}",
        store.recovered()
    );
    assert_eq!(store.config().exchange, 0);
    assert_eq!(store.get("o").unwrap(), bytes);
    drop(store);
    assert_eq!(std::fs::read(&config).unwrap(), good);
    // Mended once: the next open has nothing to say.
    assert!(ArchiveStore::open(dir.path())
        .unwrap()
        .recovered()
        .is_empty());
}

/// Removes the checksum from every metadata file, as an archive made
/// before checksums has them.
fn strip_checksums(dir: &Path) {
    let mut files = vec![dir.join("archive.json"), dir.join("catalog.json")];
    for d in 0..DEVICES {
        files.push(dir.join(format!("dev{d}/archive.json")));
        files.push(dir.join(format!("dev{d}/catalog.json")));
    }
    for path in files {
        let mut value = read_json(&path);
        value.as_object_mut().unwrap().remove("crc32c");
        value.as_object_mut().unwrap().remove("generation");
        write_json(&path, &value);
    }
}

#[test]
fn an_archive_made_before_checksums_opens_and_gets_them() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = archive_with_one_object(dir.path());
    strip_checksums(dir.path());
    let mut store = ArchiveStore::open(dir.path()).unwrap();
    assert_eq!(store.get("o").unwrap(), bytes);
    assert_eq!(store.scrub(false).unwrap().bad_metadata_copies, 0);
    drop(store);
    for path in [
        dir.path().join("archive.json"),
        dir.path().join("catalog.json"),
        dir.path().join("dev3/catalog.json"),
    ] {
        assert!(
            read_json(&path).get("crc32c").is_some(),
            "{}",
            path.display()
        );
    }
    // From now on a file without its checksum is not believed.
    let folder = dir.path().join("catalog.json");
    let mut value = with_extent_offset(read_json(&folder), 0, 1);
    value.as_object_mut().unwrap().remove("crc32c");
    write_json(&folder, &value);
    let store = ArchiveStore::open(dir.path()).unwrap();
    assert_eq!(store.get("o").unwrap(), bytes);
}

#[test]
fn get_to_a_file_that_fails_part_way_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    // More than one 8 MiB request of `get`, so bytes are written before
    // the failing one.
    let container = 3 << 20;
    let mut bytes = vec![0u8; 4 * container + 100];
    rng.fill(&mut bytes[..]);
    let mut store = ArchiveStore::create(
        dir.path(),
        &CreateOptions {
            container_bytes: container as u64,
            ..options()
        },
    )
    .unwrap();
    store.put("o", &mut &bytes[..]).unwrap();
    store.seal().unwrap();
    drop(store);
    // The last container's sub-files lost beyond what RS(3,2) decodes.
    let last = support::archive::maps(dir.path())
        .iter()
        .flat_map(|m| m.containers.iter().map(|c| c.id))
        .max()
        .unwrap();
    let mut removed = 0;
    for d in 0..DEVICES {
        for j in 0..3 {
            let path = dir.path().join(format!("dev{d}/c{last:08x}.{j}"));
            if path.exists() {
                std::fs::write(&path, b"").unwrap();
                removed += 1;
            }
        }
    }
    assert_eq!(removed, 3);
    let out = dir.path().join("out");
    let status = Command::new(env!("CARGO_BIN_EXE_ecdedup"))
        .arg("archive")
        .arg("--dir")
        .arg(dir.path())
        .args(["get", "o", "-o"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(!status.status.success());
    assert!(!out.exists(), "a partial output file was left");
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(names.is_empty(), "temporaries left: {names:?}");
}
