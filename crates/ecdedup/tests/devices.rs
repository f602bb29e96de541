//! Pointing an array at devices that hold something else: `create` refuses
//! a device with a file system (made here by the real mkfs.ext4) unless
//! forced, and the config keeps device paths as the user gave them.

use ecdedup::array::{self, CreateOptions, WritePolicy};
use ecdedup::dedup::DedupConfig;
use ecdedup::media::IoMode;
use std::path::{Path, PathBuf};
use std::process::Command;

fn options(devices: Vec<PathBuf>, force: bool) -> CreateOptions {
    CreateOptions {
        devices,
        k: 4,
        m: 2,
        stripe_unit_bytes: 32 << 10,
        volume_bytes: 8 << 20,
        intent_region_bytes: 1 << 20,
        dedup: DedupConfig::default(),
        write_policy: WritePolicy::Rmw,
        journal_bytes_max: array::JOURNAL_BYTES_DEFAULT,
        io: IoMode::Buffered,
        sparse: true,
        force,
        metadata: ecdedup::array::MetadataPlacement::Devices,
    }
}

fn files(dir: &Path) -> Vec<PathBuf> {
    (0..6)
        .map(|i| {
            let p = dir.join(format!("disk{i}"));
            std::fs::File::create(&p)
                .unwrap()
                .set_len(128 << 20)
                .unwrap();
            p
        })
        .collect()
}

#[test]
fn create_refuses_a_device_holding_a_file_system_unless_forced() {
    let tmp = tempfile::tempdir().unwrap();
    let devices = files(tmp.path());
    let status = Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(&devices[3])
        .status()
        .expect("mkfs.ext4 (e2fsprogs, installed by scripts/install-deps.sh)");
    assert!(status.success());
    let err = array::create(&tmp.path().join("a"), &options(devices.clone(), false))
        .expect_err("a device with ext4 on it is refused");
    let msg = err.to_string();
    assert!(
        msg.contains("ext2/3/4") && msg.contains("disk3") && msg.contains("--force"),
        "{msg}"
    );
    array::create(&tmp.path().join("b"), &options(devices, true)).expect("forced");
}

#[test]
fn the_config_keeps_device_paths_as_given_not_resolved_through_links() {
    let tmp = tempfile::tempdir().unwrap();
    let devices = files(tmp.path());
    let links: Vec<PathBuf> = devices
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let l = tmp.path().join(format!("by-id-{i}"));
            std::os::unix::fs::symlink(d, &l).unwrap();
            l
        })
        .collect();
    let dir = tmp.path().join("a");
    array::create(&dir, &options(links.clone(), false)).unwrap();
    let cfg = array::ConfigFile::load(&dir).unwrap();
    assert_eq!(cfg.devices, links);
}

#[test]
fn devices_found_at_each_others_paths_are_assembled_by_their_superblocks() {
    use ecdedup::array::{Array, ConfigFile};
    use ecdedup::volume::Volume;
    use std::sync::Arc;
    let tmp = tempfile::tempdir().unwrap();
    let devices = files(tmp.path());
    let dir = tmp.path().join("array");
    array::create(&dir, &options(devices.clone(), false)).unwrap();
    let data: Vec<u8> = (0..8 << 20).map(|i: u32| (i % 253) as u8).collect();
    {
        let vol = Volume::new(Arc::new(Array::open(&dir, None).unwrap()));
        vol.write(&data, 0, false).unwrap();
        vol.flush().unwrap();
    }
    // The names move (as /dev/sdX names do across boots): disk1 <-> disk4.
    let aside = tmp.path().join("aside");
    std::fs::rename(&devices[1], &aside).unwrap();
    std::fs::rename(&devices[4], &devices[1]).unwrap();
    std::fs::rename(&aside, &devices[4]).unwrap();
    let array = Arc::new(Array::open(&dir, None).expect("assembled by superblock"));
    assert!(
        array
            .warnings()
            .iter()
            .any(|w| w.contains("found at other paths")),
        "{:?}",
        array.warnings()
    );
    let cfg = ConfigFile::load(&dir).unwrap();
    assert_eq!(cfg.devices[1], devices[4]);
    assert_eq!(cfg.devices[4], devices[1]);
    let vol = Volume::new(Arc::clone(&array));
    let mut got = vec![0u8; data.len()];
    vol.read(&mut got, 0).unwrap();
    assert!(got == data, "data read back wrong after the paths moved");
    let report = array.scrub(false, None).unwrap();
    assert_eq!(
        (report.checksum_mismatches, report.parity_mismatches),
        (0, 0),
        "{report:?}"
    );
}
