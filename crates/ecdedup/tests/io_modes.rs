//! The direct (`O_DIRECT`) and buffered engines side by side: the same
//! random workload of unaligned writes, trims, flushes and reads through the
//! real volume on two arrays, one per engine, compared byte for byte with
//! each other and with a model, before and after a reopen. Also: a
//! preallocated array keeps its space through trims (zeroed in place), a
//! sparse one gives it back (holes punched).

use ecdedup::array::{self, Array, CreateOptions};
use ecdedup::media::IoMode;
use ecdedup::volume::Volume;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;

use crate::support;

const VOLUME_BYTES: u64 = 8 << 20;

fn create(dir: &Path, io: IoMode, sparse: bool) {
    let devices = (0..6).map(|i| dir.join(format!("dev{i}"))).collect();
    array::create(dir, &options(devices, io, sparse)).unwrap();
}

/// RS(4,2) over `devices`, a volume of [`VOLUME_BYTES`].
fn options(devices: Vec<std::path::PathBuf>, io: IoMode, sparse: bool) -> CreateOptions {
    CreateOptions {
        io,
        sparse,
        ..support::array_options(devices, VOLUME_BYTES)
    }
}

fn allocated_bytes(dir: &Path) -> u64 {
    (0..6)
        .map(|i| {
            std::fs::metadata(dir.join(format!("dev{i}")))
                .unwrap()
                .blocks()
                * 512
        })
        .sum()
}

/// Whether this process holds `path` open with `O_DIRECT` (from
/// /proc/self/fdinfo), so the direct engine is not buffered in disguise.
fn open_direct(path: &Path) -> bool {
    let path = path.canonicalize().unwrap();
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .any(|fd| {
            std::fs::read_link(fd.path()).ok().as_deref() == Some(path.as_path())
                && std::fs::read_to_string(format!(
                    "/proc/self/fdinfo/{}",
                    fd.file_name().to_string_lossy()
                ))
                .ok()
                .and_then(|info| {
                    info.lines()
                        .find_map(|l| l.strip_prefix("flags:"))
                        .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())
                })
                .is_some_and(|flags| flags & libc::O_DIRECT as u32 != 0)
        })
}

fn read_all(vol: &Volume) -> Vec<u8> {
    let mut got = vec![0u8; VOLUME_BYTES as usize];
    vol.read(&mut got, 0).unwrap();
    got
}

#[test]
fn direct_and_buffered_engines_read_back_the_same_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let (d, b) = (tmp.path().join("direct"), tmp.path().join("buffered"));
    create(&d, IoMode::Direct, false);
    create(&b, IoMode::Buffered, true);
    let cfg = array::ConfigFile::load(&d).unwrap();
    assert_eq!((cfg.io, cfg.sparse), (IoMode::Direct, false));
    let vols: Vec<Volume> = [&d, &b]
        .iter()
        .map(|p| Volume::new(Arc::new(Array::open(p, None).unwrap())))
        .collect();
    assert!(
        open_direct(&d.join("dev0")),
        "the direct engine opens with O_DIRECT"
    );
    assert!(
        !open_direct(&b.join("dev0")),
        "the buffered engine does not"
    );
    let mut model = vec![0u8; VOLUME_BYTES as usize];
    let mut rng = StdRng::seed_from_u64(42);
    for i in 0..300u64 {
        match rng.gen_range(0..10) {
            0 => vols.iter().for_each(|v| v.flush().unwrap()),
            1 => {
                let len = rng.gen_range(1..=64) * 4096;
                let off = rng.gen_range(0..=(VOLUME_BYTES as usize - len) / 4096) * 4096;
                for v in &vols {
                    v.write_zeroes(off as u64, len as u64, false).unwrap();
                }
                model[off..off + len].fill(0);
            }
            _ => {
                let len = rng.gen_range(1..=200 * 1024);
                let off = rng.gen_range(0..=VOLUME_BYTES as usize - len);
                let mut data = vec![0u8; len];
                StdRng::seed_from_u64(i).fill(&mut data[..]);
                for v in &vols {
                    v.write(&data, off as u64, rng.gen_bool(0.05)).unwrap();
                }
                model[off..off + len].copy_from_slice(&data);
            }
        }
    }
    for v in &vols {
        assert!(read_all(v) == model, "an engine reads back other bytes");
        v.close().unwrap();
    }
    drop(vols);
    for p in [&d, &b] {
        let v = Volume::new(Arc::new(Array::open(p, None).unwrap()));
        assert!(read_all(&v) == model, "{} after reopen", p.display());
        let report = v.array().scrub(false, None).unwrap();
        assert_eq!(
            (report.checksum_mismatches, report.parity_mismatches),
            (0, 0)
        );
    }
}

#[test]
fn a_preallocated_array_keeps_its_space_through_trims_and_a_sparse_one_returns_it() {
    let tmp = tempfile::tempdir().unwrap();
    for sparse in [false, true] {
        let dir = tmp.path().join(format!("sparse-{sparse}"));
        create(&dir, IoMode::Direct, sparse);
        let vol = Volume::new(Arc::new(Array::open(&dir, None).unwrap()));
        let data = vec![0x5au8; VOLUME_BYTES as usize];
        vol.write(&data, 0, false).unwrap();
        vol.flush().unwrap();
        let before = allocated_bytes(&dir);
        vol.write_zeroes(0, VOLUME_BYTES, false).unwrap();
        vol.flush().unwrap();
        let after = allocated_bytes(&dir);
        assert!(read_all(&vol).iter().all(|&x| x == 0));
        if sparse {
            assert!(
                after + VOLUME_BYTES <= before,
                "a sparse array punches trimmed stripes: {before} -> {after} bytes"
            );
        } else {
            assert!(
                after >= before,
                "a preallocated array keeps its blocks allocated: {before} -> {after} bytes"
            );
        }
    }
}

/// A loop device over a sparse file, detached when dropped.
struct Loop {
    dev: std::path::PathBuf,
    backing: std::path::PathBuf,
}

impl Loop {
    fn attach(backing: &Path, bytes: u64) -> Loop {
        std::fs::File::create(backing)
            .unwrap()
            .set_len(bytes)
            .unwrap();
        let out = std::process::Command::new("losetup")
            .args(["--find", "--show"])
            .arg(backing)
            .output()
            .expect("losetup (util-linux) runs");
        assert!(
            out.status.success(),
            "losetup failed (the tests run as root with loop devices): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Loop {
            dev: String::from_utf8(out.stdout).unwrap().trim().into(),
            backing: backing.to_owned(),
        }
    }

    fn allocated_bytes(&self) -> u64 {
        std::fs::metadata(&self.backing).unwrap().blocks() * 512
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup")
            .arg("-d")
            .arg(&self.dev)
            .status();
    }
}

#[test]
fn trims_on_block_devices_unmap_through_write_zeroes_instead_of_writing_zeroes() {
    let tmp = tempfile::tempdir().unwrap();
    let loops: Vec<Loop> = (0..6)
        .map(|i| Loop::attach(&tmp.path().join(format!("backing{i}")), 128 << 20))
        .collect();
    let dir = tmp.path().join("array");
    let opts = options(
        loops.iter().map(|l| l.dev.clone()).collect(),
        IoMode::Direct,
        false,
    );
    array::create(&dir, &opts).unwrap();
    let vol = Volume::new(Arc::new(Array::open(&dir, None).unwrap()));
    let data: Vec<u8> = (0..VOLUME_BYTES).map(|i| (i % 251) as u8 + 1).collect();
    vol.write(&data, 0, false).unwrap();
    vol.flush().unwrap();
    let allocated = |loops: &[Loop]| loops.iter().map(Loop::allocated_bytes).sum::<u64>();
    let before = allocated(&loops);
    vol.write_zeroes(0, VOLUME_BYTES, false).unwrap();
    vol.flush().unwrap();
    let after = allocated(&loops);
    assert!(read_all(&vol).iter().all(|&x| x == 0));
    // The loop driver turns an unmapping write-zeroes into a hole in its
    // backing file, and a BLKZEROOUT into an allocated zero range: the
    // space coming back shows the device was asked to unmap.
    assert!(
        after + VOLUME_BYTES <= before,
        "trimmed stripes stay allocated on the loop devices' files: {before} -> {after} bytes"
    );
    drop(vol);
}
