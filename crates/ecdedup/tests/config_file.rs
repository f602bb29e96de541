//! `array.json`, the file that names an array's devices and holds its
//! settings (issue 18, items 13 and 14). Stories: an open leaves an
//! unchanged file alone (every rewrite is a window for a power cut) and
//! brings every device's copy up to date; a file that does not parse (NUL
//! bytes after a cut, truncated, garbage) is recovered from the newest copy
//! on the devices by `serve`, `scrub` and any open, the damaged bytes kept
//! aside; an array of format 1 (no copies) is refused with what to do; a
//! file system that refuses direct transfers is named with the way out; a
//! panic of the command says what and where.

use ecdedup::array::superblock::Superblock;
use ecdedup::array::{self, Array, ConfigFile, MetadataPlacement};
use ecdedup::media::area::AreaFs;
use ecdedup::media::storage::StorageLock;
use ecdedup::media::{FileDevice, IoMode, OsStorage, Storage, StorageFile};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::support;

const VOLUME_BYTES: u64 = 8 << 20;

/// RS(4,2) over six sparse files `dev0`..`dev5` inside `tmp/array`, where
/// `create` puts them; returns the folder.
fn new_array(tmp: &Path, metadata: MetadataPlacement) -> PathBuf {
    let dir = tmp.join("array");
    std::fs::create_dir_all(&dir).unwrap();
    let paths = (0..6).map(|i| dir.join(format!("dev{i}"))).collect();
    let opts = array::CreateOptions {
        metadata,
        ..support::array_options(paths, VOLUME_BYTES)
    };
    array::create(&dir, &opts).unwrap();
    dir
}

fn config_path(dir: &Path) -> PathBuf {
    dir.join(array::CONFIG_FILE)
}

/// Which file the name is and when it was last written: a rename or an
/// in-place write changes it.
fn identity(path: &Path) -> (u64, i64, i64) {
    let m = std::fs::metadata(path).unwrap();
    (m.ino(), m.mtime(), m.mtime_nsec())
}

/// The metadata area of the device file `dev`.
fn area_of(dev: &Path, read_only: bool) -> Arc<AreaFs> {
    let head = std::fs::read(dev).unwrap();
    let (a, b) = head[..8192].split_at(4096);
    let geo = Superblock::newest(a, b).unwrap().geometry;
    let dev: Arc<dyn ecdedup::media::Device> = Arc::new(FileDevice::open(dev).unwrap());
    let area = if read_only {
        AreaFs::open_read_only(dev, geo.meta_area_offset(), geo.meta_area_bytes)
    } else {
        AreaFs::open(dev, geo.meta_area_offset(), geo.meta_area_bytes)
    };
    Arc::new(area.unwrap())
}

/// The copy of `array.json` on device file `dev`.
fn device_copy(dev: &Path) -> Vec<u8> {
    let f = area_of(dev, true).open_file(array::CONFIG_FILE).unwrap();
    let mut b = vec![0u8; f.len().unwrap() as usize];
    f.read_at(&mut b, 0).unwrap();
    b
}

/// Puts `bytes` as the copy of `array.json` on device file `dev` only.
fn set_device_copy(dev: &Path, bytes: &[u8]) {
    let area = area_of(dev, false);
    let f = area.create_file(array::CONFIG_FILE, true).unwrap();
    f.write_at(bytes, 0).unwrap();
    f.sync().unwrap();
    area.commit().unwrap();
}

/// The damaged copies kept aside in `dir`.
fn kept_aside(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("array.json.corrupt-")
        })
        .collect();
    v.sort();
    v
}

/// Issue 18, item 14: `serve` rewrote `array.json` at every open, and the
/// copies on the devices were refreshed by comparing only the first one,
/// through a rewrite of the folder's file too.
#[test]
fn an_open_leaves_array_json_alone_and_brings_every_device_copy_up_to_date() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = new_array(tmp.path(), MetadataPlacement::Devices);
    let cfg = config_path(&dir);
    drop(Array::open(&dir, None).unwrap());
    let before = identity(&cfg);
    drop(Array::open(&dir, None).unwrap());
    drop(Array::open(&dir, None).unwrap());
    assert_eq!(
        identity(&cfg),
        before,
        "an open rewrote an unchanged {cfg:?}"
    );

    // A setting changed offline goes to the folder only; an old copy on
    // one device (not the first) stays behind as well.
    let old = std::fs::read(&cfg).unwrap();
    array::set_checksum_cache(&dir, 32 << 20).unwrap();
    let new = std::fs::read(&cfg).unwrap();
    assert_ne!(old, new);
    let before = identity(&cfg);
    drop(Array::open(&dir, None).unwrap());
    assert_eq!(identity(&cfg), before, "the open rewrote the folder's file");
    set_device_copy(&dir.join("dev3"), &old);
    drop(Array::open(&dir, None).unwrap());
    assert_eq!(identity(&cfg), before, "the open rewrote the folder's file");
    for i in 0..6 {
        let copy = device_copy(&dir.join(format!("dev{i}")));
        assert!(copy == new, "device {i} keeps an old copy of the settings");
    }
}

/// What a power cut or a bad tool makes of a good config.
type Damage = fn(&[u8]) -> Vec<u8>;

/// Issue 18, item 14: a config that does not parse stopped every open;
/// the devices of a format 2 array hold its settings.
#[test]
fn a_config_that_does_not_parse_is_recovered_from_the_newest_device_copy() {
    let cases: [(&str, Damage); 3] = [
        ("NUL bytes", |good| vec![0u8; good.len()]),
        ("truncated", |good| good[..good.len() / 2].to_vec()),
        ("garbage", |_| b"\x7fELF {{{ \"devices\": [".to_vec()),
    ];
    for (what, damage) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let dir = new_array(tmp.path(), MetadataPlacement::Devices);
        let cfg = config_path(&dir);
        drop(Array::open(&dir, None).unwrap());
        let good = std::fs::read(&cfg).unwrap();
        let broken = damage(&good);
        std::fs::write(&cfg, &broken).unwrap();

        let a = Array::open(&dir, None).unwrap_or_else(|e| panic!("{what}: {e}"));
        let warnings = a.warnings().join("\n");
        assert!(
            warnings.contains("cannot be parsed") && warnings.contains("recovered from the copy"),
            "{what}: {warnings}"
        );
        drop(a);
        assert!(
            std::fs::read(&cfg).unwrap() == good,
            "{what}: not recovered"
        );
        let aside = kept_aside(&dir);
        assert_eq!(aside.len(), 1, "{what}: {aside:?}");
        assert!(std::fs::read(&aside[0]).unwrap() == broken, "{what}");
        assert!(warnings.contains(&aside[0].display().to_string()), "{what}");
        ConfigFile::load(&dir).unwrap();
    }
}

/// The devices are found where the broken file still names them, when the
/// folder holds none of them.
#[test]
fn a_config_is_recovered_from_devices_outside_the_folder_that_it_still_names() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("array");
    let paths: Vec<PathBuf> = (0..6).map(|i| tmp.path().join(format!("d{i}"))).collect();
    array::create(&dir, &support::array_options(paths, VOLUME_BYTES)).unwrap();
    drop(Array::open(&dir, None).unwrap());
    let cfg = config_path(&dir);
    let good = std::fs::read(&cfg).unwrap();
    // Cut after the device list: the settings that follow are lost.
    let text = String::from_utf8(good.clone()).unwrap();
    let cut = text.find("\"intent_region_bytes\"").unwrap();
    std::fs::write(&cfg, &good[..cut]).unwrap();
    drop(Array::open(&dir, None).unwrap());
    assert!(std::fs::read(&cfg).unwrap() == good);
}

/// Format 1 keeps its metadata in the folder: nothing to recover from, so
/// the refusal says so and names `assemble`'s limit; nothing is changed.
#[test]
fn a_format_1_config_that_does_not_parse_is_refused_with_what_to_do() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = new_array(tmp.path(), MetadataPlacement::Folder);
    let cfg = config_path(&dir);
    std::fs::write(&cfg, vec![0u8; 300]).unwrap();
    let e = Array::open(&dir, None).err().expect("refused").to_string();
    assert!(
        e.contains("cannot be parsed") && e.contains("format 1") && e.contains("assemble"),
        "{e}"
    );
    assert_eq!(std::fs::read(&cfg).unwrap(), vec![0u8; 300]);
    assert!(kept_aside(&dir).is_empty());
}

/// Issue 18, item 14, through the commands: `scrub` and `serve` of an
/// array whose config is all NUL bytes (as after the power cut) run, say
/// what they recovered, and leave the config whole.
#[test]
fn scrub_and_serve_recover_a_config_of_nul_bytes() {
    let a = support::TestArray::create("16M");
    let cfg = config_path(&a.dir);
    a.scrub_check_clean();
    let good = std::fs::read(&cfg).unwrap();

    std::fs::write(&cfg, vec![0u8; good.len()]).unwrap();
    let out = a.cli(&["scrub", "--check-only"]);
    assert!(out.success(), "{out}");
    assert!(out.stderr.contains("recovered from the copy"), "{out}");
    assert!(std::fs::read(&cfg).unwrap() == good);

    std::fs::write(&cfg, vec![0u8; good.len()]).unwrap();
    let server = a.try_serve(&[]).unwrap_or_else(|e| panic!("{e}"));
    let log = server.log_text();
    server.stop();
    assert!(log.contains("recovered from the copy"), "{log}");
    assert!(std::fs::read(&cfg).unwrap() == good);
    assert_eq!(kept_aside(&a.dir).len(), 2);
}

/// A file system that opens files with `O_DIRECT` and then fails every
/// direct transfer with EINVAL, as a FUSE file system may: buffered
/// transfers (unaligned, or from a buffered handle) pass.
struct RefusesDirect;

struct DirectRefused(Arc<dyn StorageFile>);

fn refused() -> io::Error {
    io::Error::from_raw_os_error(libc::EINVAL)
}

fn aligned(offset: u64, len: usize) -> bool {
    offset.is_multiple_of(4096) && len.is_multiple_of(4096)
}

impl StorageFile for DirectRefused {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if aligned(offset, buf.len()) {
            return Err(refused());
        }
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if aligned(offset, buf.len()) {
            return Err(refused());
        }
        self.0.write_at(buf, offset)
    }
    fn len(&self) -> io::Result<u64> {
        self.0.len()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
    fn sync(&self) -> io::Result<()> {
        self.0.sync()
    }
    fn reserve(&self, len: u64) -> io::Result<()> {
        self.0.reserve(len)
    }
    fn punch(&self, offset: u64, len: u64) -> io::Result<()> {
        self.0.punch(offset, len)
    }
    fn describe(&self) -> String {
        self.0.describe()
    }
}

impl Storage for RefusesDirect {
    fn open(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>> {
        OsStorage.open(path)
    }
    fn open_device(&self, path: &Path, direct: bool) -> io::Result<Arc<dyn StorageFile>> {
        let file = OsStorage.open_device(path, false)?;
        Ok(if direct {
            Arc::new(DirectRefused(file))
        } else {
            file
        })
    }
    fn create(&self, path: &Path, truncate: bool) -> io::Result<Arc<dyn StorageFile>> {
        OsStorage.create(path, truncate)
    }
    fn exists(&self, path: &Path) -> bool {
        OsStorage.exists(path)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        OsStorage.remove(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        OsStorage.rename(from, to)
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        OsStorage.create_dir_all(path)
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        OsStorage.sync_dir(path)
    }
    fn try_lock(&self, path: &Path) -> io::Result<Option<StorageLock>> {
        OsStorage.try_lock(path)
    }
    fn list_files(&self, path: &Path) -> io::Result<Vec<String>> {
        OsStorage.list_files(path)
    }
}

/// Issue 18, item 13: over such a file system an array of `"io":
/// "direct"` said "no device of the array has a readable superblock";
/// the refusal names direct I/O and `--io buffered`, whatever the storage.
#[test]
fn devices_on_a_file_system_refusing_direct_io_are_named_with_the_way_out() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = new_array(tmp.path(), MetadataPlacement::Devices);
    let storage: Arc<dyn Storage> = Arc::new(RefusesDirect);
    drop(Array::open_in(Arc::clone(&storage), &dir, None, None).expect("buffered opens"));
    let mut cfg = ConfigFile::load(&dir).unwrap();
    cfg.io = IoMode::Direct;
    cfg.store(&dir).unwrap();
    let e = Array::open_in(storage, &dir, None, None)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains("refuses direct I/O") && e.contains("--io buffered"),
        "{e}"
    );
    assert!(e.contains(&dir.join("dev0").display().to_string()), "{e}");
}

/// Issue 18, item 14: `scrub --check-only` once exited 101 and printed
/// nothing. The command's panic hook writes the message and where it
/// happened straight to fd 2.
#[test]
fn a_panic_of_the_command_prints_its_message_and_location() {
    let mut cmd = std::process::Command::new(support::ecdedup_bin());
    cmd.env(ecdedup::cli::FAULT_PANIC_ENV, "1").args([
        "--dir",
        "/nonexistent",
        "scrub",
        "--check-only",
    ]);
    let out = support::run(&mut cmd, Duration::from_secs(120));
    assert_eq!(out.status.code(), Some(101), "{out}");
    assert!(
        out.stderr
            .contains("ecdedup: panic at crates/ecdedup/src/cli.rs:")
            && out.stderr.contains("test fault ECDEDUP_TEST_PANIC=1"),
        "{out}"
    );
}
