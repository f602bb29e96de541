//! Each device carries its own metadata (format 2, `create --metadata
//! device`): its parity journal, its dedup map and a copy of the array-wide
//! logs live in a metadata area on the device. Stories: the array folder
//! holds nothing but the settings; the folder lost, `assemble --device`
//! rebuilds it from the devices (given in any order) and every byte reads
//! back, journals replayed and dedup maps intact; a failed device is
//! replaced and rebuilt with a fresh area; an array of format 1 (metadata
//! in the folder) opens as before.

use ecdedup::array::{self, Array, CreateOptions, MetadataPlacement, WritePolicy};
use ecdedup::dedup::{DedupConfig, Policy};
use ecdedup::volume::Volume;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::support;

const VOLUME_BYTES: u64 = 8 << 20;

fn options(
    devices: Vec<PathBuf>,
    policy: WritePolicy,
    dedup: Policy,
    metadata: MetadataPlacement,
) -> CreateOptions {
    CreateOptions {
        dedup: DedupConfig {
            policy: dedup,
            ..DedupConfig::default()
        },
        write_policy: policy,
        journal_bytes_max: 4 << 20,
        metadata,
        ..support::array_options(devices, VOLUME_BYTES)
    }
}

/// A parix array with dedup of every block over six files `d0`..`d5` in
/// `tmp`, its folder `tmp/array`: (its create options, folder).
fn parix_dedup_array(tmp: &Path, metadata: MetadataPlacement) -> (CreateOptions, PathBuf) {
    let paths: Vec<PathBuf> = (0..6).map(|i| tmp.join(format!("d{i}"))).collect();
    let dir = tmp.join("array");
    let opts = options(paths, WritePolicy::Parix, Policy::All, metadata);
    array::create(&dir, &opts).unwrap();
    (opts, dir)
}

/// Random writes (with duplicates, for dedup) and flushes; returns the model.
fn fill(vol: &Volume, seed: u64) -> Vec<u8> {
    let mut model = vec![0u8; VOLUME_BYTES as usize];
    let mut rng = StdRng::seed_from_u64(seed);
    let pattern: Vec<u8> = (0..64 * 1024).map(|_| rng.gen()).collect();
    for i in 0..200 {
        let len = rng.gen_range(1..=16) * 4096;
        let off = rng.gen_range(0..(VOLUME_BYTES as usize - len) / 4096) * 4096;
        let data: Vec<u8> = if i % 3 == 0 {
            pattern.iter().cycle().take(len).copied().collect()
        } else {
            (0..len).map(|_| rng.gen()).collect()
        };
        vol.write(&data, off as u64, false).unwrap();
        model[off..off + len].copy_from_slice(&data);
        if i % 50 == 49 {
            vol.flush().unwrap();
        }
    }
    vol.flush().unwrap();
    model
}

fn read_all(vol: &Volume) -> Vec<u8> {
    let mut got = vec![0u8; VOLUME_BYTES as usize];
    vol.read(&mut got, 0).unwrap();
    got
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn a_lost_folder_is_rebuilt_from_the_devices_and_every_byte_reads_back() {
    for (policy, dedup) in [
        (WritePolicy::Parix, Policy::None),
        (WritePolicy::Plog, Policy::All),
        (WritePolicy::Rmw, Policy::Parity),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let devs = tmp.path().join("devices");
        std::fs::create_dir_all(&devs).unwrap();
        let paths: Vec<PathBuf> = (0..6).map(|i| devs.join(format!("disk{i}"))).collect();
        let dir = tmp.path().join("array");
        array::create(
            &dir,
            &options(paths.clone(), policy, dedup, MetadataPlacement::Devices),
        )
        .unwrap();
        let model = {
            let vol = Volume::new(Arc::new(Array::open(&dir, None).unwrap()));
            let model = fill(&vol, 7);
            // A crash with journals and dedup logs in use: nothing flushed
            // after the last writes below.
            let mut rng = StdRng::seed_from_u64(8);
            let mut model = model;
            for _ in 0..20 {
                let off = rng.gen_range(0..VOLUME_BYTES / 4096 - 1) * 4096;
                let data = vec![rng.gen::<u8>(); 4096];
                vol.write(&data, off, true).unwrap();
                model[off as usize..off as usize + 4096].copy_from_slice(&data);
            }
            let array = Arc::clone(vol.array());
            drop(vol);
            Arc::into_inner(array).unwrap().simulate_crash();
            model
        };
        assert_eq!(
            names(&dir),
            vec!["array.json", "lock"],
            "{policy:?}/{dedup:?}: the folder holds only the settings"
        );
        // The folder is lost; the devices come back in another order.
        std::fs::remove_dir_all(&dir).unwrap();
        let mut shuffled = paths.clone();
        shuffled.reverse();
        let cfg = array::assemble_from_devices(&dir, &shuffled).unwrap();
        assert_eq!(cfg.write_policy, policy);
        assert_eq!(cfg.dedup.policy, dedup);
        assert_eq!(cfg.devices, paths, "positions come from the superblocks");
        let array = Array::open(&dir, None).unwrap();
        assert!(array.warnings().is_empty(), "{:?}", array.warnings());
        let vol = Volume::new(Arc::new(array));
        assert!(
            read_all(&vol) == model,
            "{policy:?}/{dedup:?}: data differs after assemble"
        );
        let report = vol.array().scrub(false, None).unwrap();
        let clean = report.checksum_mismatches == 0
            && report.parity_mismatches == 0
            && report.unrecoverable_blocks == 0
            && report.dedup_map_problems.is_empty();
        assert!(clean, "{policy:?}/{dedup:?}: {report:?}");
    }
}

/// A folder's `array.json` edited by hand to another write policy and
/// another dedup policy (not `set-policy`, which writes both it and the
/// devices' copies) over a crashed parix array with dedup of every block:
/// the open uses the devices' settings and says so, and every byte reads
/// back. Before, the folder's were obeyed: the journals' records were
/// never replayed, the layers' maps were read as none, and blocks read
/// wrong (a probe, as a user would; this test, with the devices' copy
/// ignored, read wrong bytes).
#[test]
fn a_hand_edited_write_or_dedup_policy_in_the_folder_gives_way_to_the_devices_copy() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, dir) = parix_dedup_array(tmp.path(), MetadataPlacement::Devices);
    let model = {
        let vol = Volume::new(Arc::new(Array::open(&dir, None).unwrap()));
        let model = fill(&vol, 11);
        let array = Arc::clone(vol.array());
        drop(vol);
        Arc::into_inner(array).unwrap().simulate_crash();
        model
    };
    let path = dir.join("array.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut cfg: serde_json::Value = serde_json::from_str(&text).unwrap();
    cfg["write_policy"] = serde_json::json!("rmw");
    cfg["dedup"]["policy"] = serde_json::json!("none");
    std::fs::write(&path, serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
    let array = Array::open(&dir, None).unwrap();
    let warnings = array.warnings().join("\n");
    assert!(
        warnings.contains("sets write policy Rmw, the devices' copy Parix"),
        "{warnings}"
    );
    assert!(warnings.contains("sets dedup"), "{warnings}");
    assert_eq!(array.write_policy(), WritePolicy::Parix);
    let vol = Volume::new(Arc::new(array));
    assert!(read_all(&vol) == model, "every byte reads back");
}

#[test]
fn assemble_refuses_mixed_arrays_a_used_folder_and_format_1() {
    let tmp = tempfile::tempdir().unwrap();
    let mk = |name: &str, metadata| {
        let paths: Vec<PathBuf> = (0..6)
            .map(|i| tmp.path().join(format!("{name}-d{i}")))
            .collect();
        let dir = tmp.path().join(name);
        array::create(
            &dir,
            &options(paths.clone(), WritePolicy::Rmw, Policy::None, metadata),
        )
        .unwrap();
        (dir, paths)
    };
    let (a_dir, a) = mk("a", MetadataPlacement::Devices);
    let (_, b) = mk("b", MetadataPlacement::Devices);
    let (_, old) = mk("old", MetadataPlacement::Folder);
    let e = array::assemble_from_devices(&tmp.path().join("x"), &[a[0].clone(), b[1].clone()])
        .unwrap_err();
    assert!(e.to_string().contains("belongs to array"), "{e}");
    let e = array::assemble_from_devices(&a_dir, &a).unwrap_err();
    assert!(e.to_string().contains("already holds an array"), "{e}");
    let e = array::assemble_from_devices(&tmp.path().join("y"), &old).unwrap_err();
    assert!(e.to_string().contains("format 1"), "{e}");
    let e = array::assemble_from_devices(&tmp.path().join("z"), &[a[0].clone(), a[0].clone()])
        .unwrap_err();
    assert!(e.to_string().contains("claims position"), "{e}");
}

#[test]
fn a_replaced_device_gets_a_fresh_area_and_the_array_survives_losing_the_others_copies() {
    let tmp = tempfile::tempdir().unwrap();
    let (opts, dir) = parix_dedup_array(tmp.path(), MetadataPlacement::Devices);
    let paths = &opts.devices;
    let vol = Volume::new(Arc::new(Array::open(&dir, None).unwrap()));
    let mut model = fill(&vol, 11);
    vol.array().fail_device(0).unwrap();
    // Degraded writes: logged in the mirrored degraded-write log.
    let data = vec![0x5a; 64 << 10];
    vol.write(&data, 1 << 20, false).unwrap();
    model[1 << 20..(1 << 20) + data.len()].copy_from_slice(&data);
    vol.flush().unwrap();
    vol.array()
        .replace_device(0, Some(&tmp.path().join("new0")))
        .unwrap();
    vol.array().rebuild(None).unwrap();
    vol.array().close().unwrap();
    drop(vol);
    // The replacement carries copies: with devices 1 and 2 gone (their
    // areas too), the array opens from the others and reads back.
    std::fs::remove_file(&paths[1]).unwrap();
    std::fs::remove_file(&paths[2]).unwrap();
    let array = Array::open(&dir, None).unwrap();
    let vol = Volume::new(Arc::new(array));
    assert!(
        read_all(&vol) == model,
        "data differs after replace, rebuild and two losses"
    );
}

#[test]
fn an_array_with_its_metadata_in_the_folder_keeps_it_there() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, dir) = parix_dedup_array(tmp.path(), MetadataPlacement::Folder);
    let vol = Volume::new(Arc::new(Array::open(&dir, None).unwrap()));
    let model = fill(&vol, 3);
    vol.array().close().unwrap();
    drop(vol);
    let names = names(&dir);
    for want in [
        "array.json",
        "intent.map",
        "journal",
        "dedup",
        "degraded.log",
    ] {
        assert!(
            names.iter().any(|n| n == want),
            "{want} missing from {names:?}"
        );
    }
    let vol = Volume::new(Arc::new(Array::open(&dir, None).unwrap()));
    assert!(read_all(&vol) == model);
}

#[test]
fn a_device_whose_metadata_area_is_corrupt_is_failed_and_rebuilt() {
    use std::os::unix::fs::FileExt;
    let tmp = tempfile::tempdir().unwrap();
    let (opts, dir) = parix_dedup_array(tmp.path(), MetadataPlacement::Devices);
    let paths = &opts.devices;
    let model = {
        let vol = Volume::new(Arc::new(Array::open(&dir, None).unwrap()));
        let model = fill(&vol, 5);
        vol.array().close().unwrap();
        model
    };
    // Both directory slots of device 2's area damaged.
    let geo = array::geometry_for(&opts).unwrap();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&paths[2])
        .unwrap();
    for slot in 0..2u64 {
        f.write_all_at(b"garbage", geo.meta_area_offset() + slot * (64 << 10) + 200)
            .unwrap();
    }
    drop(f);
    let array = Array::open(&dir, None).unwrap();
    let warnings = array.warnings().join("\n");
    assert!(
        warnings.contains("device 2") && warnings.contains("no valid directory"),
        "{warnings}"
    );
    let vol = Volume::new(Arc::new(array));
    assert!(read_all(&vol) == model, "degraded reads differ");
    vol.array().replace_device(2, None).unwrap();
    vol.array().rebuild(None).unwrap();
    vol.array().close().unwrap();
    drop(vol);
    let vol = Volume::new(Arc::new(Array::open(&dir, None).unwrap()));
    assert!(
        vol.array().warnings().is_empty(),
        "{:?}",
        vol.array().warnings()
    );
    assert!(read_all(&vol) == model, "data differs after the rebuild");
}

/// An RMW array without dedup over six files in `tmp`, filled and closed:
/// (its create options, folder).
fn closed_rmw_array(tmp: &Path) -> (CreateOptions, PathBuf) {
    let paths: Vec<PathBuf> = (0..6).map(|i| tmp.join(format!("d{i}"))).collect();
    let dir = tmp.join("array");
    let opts = options(
        paths,
        WritePolicy::Rmw,
        Policy::None,
        MetadataPlacement::Devices,
    );
    array::create(&dir, &opts).unwrap();
    let vol = Volume::new(Arc::new(Array::open(&dir, None).unwrap()));
    fill(&vol, 13);
    vol.array().close().unwrap();
    (opts, dir)
}

#[test]
fn status_shows_a_device_whose_directory_slots_are_random_bytes_as_failed() {
    use std::os::unix::fs::FileExt;
    let tmp = tempfile::tempdir().unwrap();
    let (opts, dir) = closed_rmw_array(tmp.path());
    let geo = array::geometry_for(&opts).unwrap();
    let mut rng = StdRng::seed_from_u64(21);
    let noise: Vec<u8> = (0..128 << 10).map(|_| rng.gen()).collect();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&opts.devices[3])
        .unwrap();
    f.write_all_at(&noise, geo.meta_area_offset()).unwrap();
    drop(f);
    let status = array::inspect(&dir).unwrap();
    assert_eq!(status.devices[3].state, array::MemberState::Failed);
    assert!(status.health.starts_with("degraded"), "{}", status.health);
    let warnings = status.warnings.join("\n");
    assert!(
        warnings.contains("device 3") && warnings.contains("metadata area"),
        "{warnings}"
    );
    // What serve does with it: the same device failed.
    let array = Array::open(&dir, None).unwrap();
    assert_eq!(array.member_states()[3], array::MemberState::Failed);
}

#[test]
fn status_and_scrub_find_a_corrupt_copy_of_the_intent_map_and_scrub_rewrites_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (opts, dir) = closed_rmw_array(tmp.path());
    let geo = array::geometry_for(&opts).unwrap();
    // Device 2's copy of the intent map (not the one read) gets bytes the
    // others do not hold.
    {
        let dev = ecdedup::media::FileDevice::open_in(&ecdedup::media::OsStorage, &opts.devices[2])
            .unwrap();
        let area = Arc::new(
            ecdedup::media::area::AreaFs::open(
                Arc::new(dev),
                geo.meta_area_offset(),
                geo.meta_area_bytes,
            )
            .unwrap(),
        );
        let f = area.open_file("intent.map").unwrap();
        let len = f.len().unwrap();
        f.write_at(&[0xa5; 3], len - 3).unwrap();
        f.sync().unwrap();
    }
    let status = array::inspect(&dir).unwrap();
    let warnings = status.warnings.join("\n");
    assert!(
        warnings.contains("device 2: its copy of intent.map differs"),
        "{warnings}"
    );
    let array = Array::open(&dir, None).unwrap();
    let report = array.scrub(false, None).unwrap();
    assert_eq!(report.metadata_copy_problems.len(), 1, "{report:?}");
    assert!(
        report.metadata_copy_problems[0].contains("device 2: its copy of intent.map"),
        "{report:?}"
    );
    assert_eq!(
        report.metadata_copies_repaired, 0,
        "a check changes nothing"
    );
    let report = array.scrub(true, None).unwrap();
    assert_eq!(report.metadata_copies_repaired, 1, "{report:?}");
    let report = array.scrub(false, None).unwrap();
    assert!(report.metadata_copy_problems.is_empty(), "{report:?}");
    array.close().unwrap();
    drop(array);
    let status = array::inspect(&dir).unwrap();
    assert!(status.warnings.is_empty(), "{:?}", status.warnings);
}
