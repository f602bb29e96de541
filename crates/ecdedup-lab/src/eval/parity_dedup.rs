//! `ecdedup eval parity-dedup`: paper 000's evaluation on real data.
//!
//! For every RAID chunk (stripe unit) size and every dedup policy (none =
//! plain RAID-6, all = RAID-6 + data dedup, parity = RAID-6 + parity dedup)
//! a fresh RS(4,2) array over 6 device files is created (SHA-1 over 4 KiB
//! sub-chunks, no byte compare: the paper's settings; `--fingerprint`
//! chooses another, CRC-32C always with the byte compare), served by
//! `ecdedup serve`, and written in one or both modes:
//!
//! - **fs**: ext4 on the export (`nbdfuse` → `losetup` → `mkfs.ext4` →
//!   `mount`); each workload tar is extracted into its own folder, one after
//!   another, with `sync -f` after each; the time of extract + sync is the
//!   write time. The array then sees what a file system sends: partial-stripe
//!   updates, journal and metadata writes, flushes.
//! - **raw**: the workload files back to back as one sequential stream over
//!   NBD (each file padded to 4 KiB), one request in flight, requests cut at
//!   stripe boundaries, then a flush.
//!
//! Counters come from the server's control socket before and after the
//! writes (`ecdedup stats`), so mkfs and mount are not counted. Then the
//! volume (fs: all of it; raw: the written range) is read back over NBD
//! healthy, with device 0 failed, and with devices 0 and 1 failed: the
//! decode time. Results go to `OUT/results.json`, `OUT/report.md` and
//! `OUT/plot.svg`; the report is also printed.

use super::nbd::Client;
use super::proc::{self, Fuse, Loop, Mount, Server};
use super::report;
use ecdedup_core::array::{self, CreateOptions};
use ecdedup_core::control::{self, Request, Response};
use ecdedup_core::counters::{DeviceStats, Stats};
use ecdedup_core::dedup::{DedupConfig, DedupStats, Policy, INDEX_ENTRIES_DEFAULT};
use ecdedup_core::error::{Error, Result};
use ecdedup_core::fingerprint::Algorithm;
use ecdedup_core::units::{format_size, parse_size};
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::HashSet;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// RS(k,m) over k+m devices: the paper's RAID-6 of six SSDs.
pub const K: u32 = 4;
pub const M: u32 = 2;
/// The paper's chunk for the hash key.
pub const DEDUP_BLOCK: u32 = 4096;
const PAGE: u64 = 4096;
/// Size of the requests of the raw writer and of the read-back.
const IO_REQUEST_BYTES: u64 = 4 << 20;
/// How long one extract of a workload file may take.
const EXTRACT_TIMEOUT: Duration = Duration::from_secs(12 * 3600);

#[derive(clap::Args, Debug, Clone)]
pub struct Options {
    /// Workload files: tar archives, extracted one after another in fs mode
    /// (a tar of many versions extracts them in order); written back to back
    /// as one stream in raw mode.
    #[arg(required_unless_present = "from_results")]
    pub workloads: Vec<PathBuf>,
    /// Scratch folder for arrays, mounts and sockets [default: a new folder
    /// in $TMPDIR]. Each array is deleted after its run unless --keep.
    #[arg(long)]
    pub work: Option<PathBuf>,
    /// Where report.md, results.json and plot.svg go.
    #[arg(long, default_value = "eval-out/parity-dedup")]
    pub out: PathBuf,
    /// RAID chunk (stripe unit) sizes, comma-separated.
    #[arg(long, default_value = "32K,1M", value_delimiter = ',')]
    pub chunks: Vec<String>,
    /// fs: ext4 on the volume; raw: one sequential stream; both.
    #[arg(long, value_enum, default_value = "both")]
    pub mode: ModeArg,
    /// Volume size of every array [default: 2 x the workload + 256M, at
    /// least 256M, in 64M steps; for many small files 2 x (a block and an
    /// inode per tar entry) + 256M where that is larger]. ext4 gets an
    /// inode count (mkfs -N) when its default would be short of the
    /// entries; both are printed.
    #[arg(long)]
    pub size: Option<String>,
    /// Policies to run, comma-separated (none is the baseline of every ratio).
    #[arg(long, default_value = "none,all,parity", value_delimiter = ',')]
    pub policies: Vec<String>,
    /// Keep the arrays (and the work folder) after the runs.
    #[arg(long)]
    pub keep: bool,
    /// Skip the read-back with failed devices (decode time).
    #[arg(long)]
    pub no_decode: bool,
    /// Fingerprint of the dedup layer: sha1 (the paper's, no byte compare,
    /// as the paper), or crc32c (a 4-byte CRC-32C index entry, every hit
    /// byte-compared), or sha256, md5, blake3 (no byte compare).
    #[arg(long, default_value = "sha1")]
    pub fingerprint: Algorithm,
    /// Byte-compare every fingerprint hit (always on for crc32c; off by
    /// default for the others, as in the paper). With it, a block's own
    /// unshared slot is rewritten in place instead of copied.
    #[arg(long)]
    pub verify: bool,
    /// Size of the raw writer's requests (rounded up to whole stripes). A
    /// request of several stripes has them updated by several threads at
    /// once, and identical content written at the same moment can then
    /// be stored twice (each misses the other's index entry, which is
    /// offered once its bytes are written); one stripe per request keeps
    /// dedup decisions in stream order.
    #[arg(long, default_value = "4M")]
    pub raw_request: String,
    /// Rounds: every configuration runs this many times, round by round
    /// (policy order rotated each round); times are reported as medians,
    /// counters from the first round.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub repeat: u32,
    /// Run nothing: render report.md and plot.svg again (into --out) from
    /// a results.json of an earlier run.
    #[arg(long, value_name = "RESULTS_JSON", conflicts_with = "workloads")]
    pub from_results: Option<PathBuf>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModeArg {
    Fs,
    Raw,
    Both,
}

pub use super::results::{
    format_size_approx, DecodeResult, FileInfo, Mode, Results, RunResult, WorkloadInfo,
    WorkloadTime,
};

/// Renders report.md and plot.svg into `out` and prints the report.
fn render(results: &Results, out: &Path) -> Result<()> {
    let md = report::markdown(results);
    let md_path = out.join("report.md");
    std::fs::write(&md_path, &md)
        .map_err(|e| Error::io(format!("writing {}", md_path.display()), e))?;
    let svg_path = out.join("plot.svg");
    std::fs::write(&svg_path, super::svg::plot(results))
        .map_err(|e| Error::io(format!("writing {}", svg_path.display()), e))?;
    println!("{md}");
    eprintln!("wrote {} and {}", md_path.display(), svg_path.display());
    Ok(())
}

fn parse_chunks(list: &[String]) -> Result<Vec<u32>> {
    let mut out = Vec::new();
    for c in list.iter().map(|c| c.trim()).filter(|c| !c.is_empty()) {
        let b = parse_size(c)?;
        if !(4096..=4 << 20).contains(&b) || !b.is_power_of_two() {
            return Err(Error::Config(format!(
                "--chunks {c}: a chunk must be a power of two from 4K to 4M"
            )));
        }
        if !out.contains(&(b as u32)) {
            out.push(b as u32);
        }
    }
    if out.is_empty() {
        return Err(Error::Config("--chunks names no chunk size".into()));
    }
    Ok(out)
}

fn parse_policies(list: &[String]) -> Result<Vec<Policy>> {
    let mut out: Vec<Policy> = Vec::new();
    for p in list.iter().map(|p| p.trim()).filter(|p| !p.is_empty()) {
        let p: Policy = p.parse()?;
        if !out.contains(&p) {
            out.push(p);
        }
    }
    if out.is_empty() {
        return Err(Error::Config("--policies names no policy".into()));
    }
    // The baseline first, so every later run can be compared as it ends.
    out.sort_by_key(|p| match p {
        Policy::None => 0,
        Policy::All => 1,
        Policy::Parity => 2,
    });
    Ok(out)
}

/// Everything that would make the experiment fail half-way, checked first.
fn preflight(opts: &Options, modes: &[Mode]) -> Result<()> {
    for w in &opts.workloads {
        let meta = std::fs::metadata(w).map_err(|e| {
            Error::Config(format!("workload file {} cannot be read: {e}", w.display()))
        })?;
        if !meta.is_file() {
            return Err(Error::Config(format!(
                "workload {} is not a regular file",
                w.display()
            )));
        }
    }
    let mut missing: Vec<&str> = Vec::new();
    let mut tools = vec!["nbdkit"];
    if modes.contains(&Mode::Fs) {
        tools.extend([
            "nbdfuse",
            "fusermount3",
            "losetup",
            "mkfs.ext4",
            "mount",
            "umount",
            "tar",
            "sync",
            "dumpe2fs",
        ]);
    }
    for t in tools {
        if !proc::have_tool(t) {
            missing.push(t);
        }
    }
    if !missing.is_empty() {
        return Err(Error::Config(format!(
            "missing tools: {} (Debian: apt-get install nbdkit libnbd-bin fuse3 mount e2fsprogs tar coreutils; or scripts/install-deps.sh)",
            missing.join(", ")
        )));
    }
    let exe =
        std::env::current_exe().map_err(|e| Error::io("locating the ecdedup executable", e))?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    let plugin_found = std::env::var_os("ECDEDUP_PLUGIN").is_some()
        || dir.join("libecdedup_nbdkit.so").exists()
        || dir.join("../libecdedup_nbdkit.so").exists();
    if !plugin_found {
        return Err(Error::Config(format!(
            "the nbdkit plugin libecdedup_nbdkit.so is not next to {} (run `cargo build --workspace`)",
            exe.display()
        )));
    }
    if modes.contains(&Mode::Fs) {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(Error::Config(
                "--mode fs (and both) needs root for losetup and mount; run as root or use --mode raw"
                    .into(),
            ));
        }
        if !Path::new("/dev/fuse").exists() {
            return Err(Error::Config(
                "/dev/fuse is missing: nbdfuse cannot run here (use --mode raw)".into(),
            ));
        }
    }
    Ok(())
}

fn bytes_bar(len: u64, msg: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template(
            "  {msg:<24} [{bar:32}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    bar.set_message(msg.to_string());
    bar
}

/// Reads until `buf` is full or the file ends; returns the bytes read.
fn read_full(f: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Duplicate 4 KiB blocks of the workload (also warms the page cache, so
/// every run reads its input from memory alike).
pub fn analyze(files: &[PathBuf]) -> Result<WorkloadInfo> {
    let mut infos = Vec::new();
    let mut total = 0u64;
    for f in files {
        let bytes = std::fs::metadata(f)
            .map_err(|e| Error::io(format!("reading {}", f.display()), e))?
            .len();
        infos.push(FileInfo {
            path: f.display().to_string(),
            bytes,
        });
        total += bytes;
    }
    let bar = bytes_bar(total, "hashing the workload");
    let mut seen: HashSet<[u8; 16]> = HashSet::new();
    let (mut blocks, mut zero) = (0u64, 0u64);
    let mut buf = vec![0u8; 1 << 20];
    for f in files {
        let mut file =
            File::open(f).map_err(|e| Error::io(format!("opening {}", f.display()), e))?;
        loop {
            proc::check_interrupted()?;
            let n = read_full(&mut file, &mut buf)
                .map_err(|e| Error::io(format!("reading {}", f.display()), e))?;
            if n == 0 {
                break;
            }
            let padded = n.div_ceil(PAGE as usize) * PAGE as usize;
            buf[n..padded].fill(0);
            for b in buf[..padded].chunks_exact(PAGE as usize) {
                blocks += 1;
                if b.iter().all(|&x| x == 0) {
                    zero += 1;
                }
                let h = blake3::hash(b);
                let mut key = [0u8; 16];
                key.copy_from_slice(&h.as_bytes()[..16]);
                seen.insert(key);
            }
            bar.inc(n as u64);
            if n < buf.len() {
                break;
            }
        }
    }
    bar.finish_and_clear();
    let unique = seen.len() as u64;
    Ok(WorkloadInfo {
        files: infos,
        bytes: total,
        blocks_4k: blocks,
        unique_blocks_4k: unique,
        zero_blocks_4k: zero,
        duplicate_ratio_4k: if blocks > 0 {
            1.0 - unique as f64 / blocks as f64
        } else {
            0.0
        },
        entries: 0,
    })
}

/// What a file costs ext4 beyond its content, at most: the rest of its last
/// 4 KiB block and its 256-byte inode.
pub const EXT4_BYTES_PER_FILE_MAX: u64 = 4096 + 256;
/// Volume bytes per inode that mkfs.ext4 gives by default on the volumes
/// the eval makes (`inode_ratio` of /etc/mke2fs.conf's defaults; "small"
/// file systems under 512 MiB get one per 4 KiB, "big" ones from 4 TiB one
/// per 32 KiB).
pub const EXT4_DEFAULT_BYTES_PER_INODE: u64 = 16 << 10;
/// Inodes wanted beyond the workload's entries: the 11 reserved ones, the
/// root, lost+found, a folder per workload, and slack.
pub const EXT4_INODE_SLACK: u64 = 1024;

/// The volume and the ext4 layout of the fs mode, from the workload's
/// bytes and its entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ext4Plan {
    pub volume_bytes: u64,
    /// `mkfs.ext4 -N`, where the default would be short of the entries.
    pub inodes: Option<u64>,
}

/// Sizes the volume (unless `size_bytes` is given) and the inode count.
/// What the files take is at most their bytes plus a block and an inode
/// per entry; the default volume holds twice the larger of the two, plus
/// 256 MiB for ext4's journal and metadata, in 64 MiB steps (at least 256
/// MiB). For files of 4 KiB and more on average, that is twice the
/// workload plus 256 MiB, as before entries were counted. The inode count
/// is given to mkfs only where its default may not cover every entry, with
/// an eighth to spare.
pub fn ext4_plan(workload_bytes: u64, entries: u64, size_bytes: Option<u64>) -> Ext4Plan {
    let step = 64u64 << 20;
    let footprint = workload_bytes.max(entries * EXT4_BYTES_PER_FILE_MAX);
    let volume_bytes = size_bytes
        .unwrap_or_else(|| ((2 * footprint + (256 << 20)).div_ceil(step) * step).max(256 << 20));
    let wanted = entries + entries / 8 + EXT4_INODE_SLACK;
    let by_default = volume_bytes / EXT4_DEFAULT_BYTES_PER_INODE;
    Ext4Plan {
        volume_bytes,
        inodes: (entries > 0 && by_default < wanted).then_some(wanted),
    }
}

/// `mkfs.ext4` of the fs mode on `device`, with the inode count of `plan`.
pub fn mkfs_ext4(device: &Path, plan: &Ext4Plan) -> Command {
    let mut cmd = Command::new("mkfs.ext4");
    cmd.arg("-q")
        .arg("-F")
        .arg("-E")
        .arg("lazy_itable_init=0,lazy_journal_init=0,nodiscard");
    if let Some(n) = plan.inodes {
        cmd.arg("-N").arg(n.to_string());
    }
    cmd.arg(device);
    cmd
}

/// Entries of a tar archive (any compression tar reads): `tar -tf`'s lines.
fn tar_entries(path: &Path) -> Result<u64> {
    let out = proc::run_ok(Command::new("tar").arg("-tf").arg(path), proc::STEP_TIMEOUT)?;
    Ok(out.stdout.lines().count() as u64)
}

fn fetch_stats(dir: &Path) -> Result<Stats> {
    match control::request(dir, &Request::Stats)? {
        Response::Stats(s) => Ok(*s),
        other => Err(Error::Other(format!(
            "unexpected answer to a stats request: {other:?}"
        ))),
    }
}

fn fail_device(dir: &Path, position: usize) -> Result<()> {
    match control::request(dir, &Request::Fail { position })? {
        Response::Ok => Ok(()),
        other => Err(Error::Other(format!(
            "unexpected answer to a fail request: {other:?}"
        ))),
    }
}

fn sum_dev(s: &Stats, f: impl Fn(&DeviceStats) -> u64) -> u64 {
    s.devices.iter().map(f).sum()
}

fn sum_dedup(s: &Stats, f: impl Fn(&DedupStats) -> u64) -> u64 {
    s.dedup.iter().flatten().map(f).sum()
}

/// Fills the counter fields of a result from the snapshots around the writes.
fn counters(r: &mut RunResult, b: &Stats, a: &Stats) {
    let d = |f: &dyn Fn(&Stats) -> u64| f(a).saturating_sub(f(b));
    r.client_writes = d(&|s| s.array.client_writes);
    r.client_write_bytes = d(&|s| s.array.client_write_bytes);
    r.client_flushes = d(&|s| s.array.client_flushes);
    r.full_stripe_writes = d(&|s| s.array.full_stripe_writes);
    r.rmw_writes = d(&|s| s.array.rmw_writes);
    r.rcw_writes = d(&|s| s.array.rcw_writes);
    r.degraded_writes = d(&|s| s.array.degraded_writes);
    r.stripe_updates = r.full_stripe_writes + r.rmw_writes + r.rcw_writes + r.degraded_writes;
    r.data_pages_array = d(&|s| sum_dev(s, |x| x.write_bytes.data)) / PAGE;
    r.parity_pages_array = d(&|s| sum_dev(s, |x| x.write_bytes.parity)) / PAGE;
    r.parity_write_ops_array = d(&|s| sum_dev(s, |x| x.write_ops.parity));
    r.parity_pages_paper_baseline = r.stripe_updates * r.m as u64 * (r.chunk_bytes / PAGE);
    if r.policy == Policy::None {
        r.data_pages_media = r.data_pages_array;
        r.parity_pages_media = r.parity_pages_array;
        return;
    }
    let per = DEDUP_BLOCK as u64 / PAGE;
    let phys = d(&|s| sum_dedup(s, |x| x.physical_writes));
    let phys_parity = d(&|s| sum_dedup(s, |x| x.physical_parity_writes));
    let refs = d(&|s| sum_dedup(s, |x| x.reference_writes));
    let refs_parity = d(&|s| sum_dedup(s, |x| x.reference_parity_writes));
    r.parity_pages_media = phys_parity * per;
    r.data_pages_media = (phys - phys_parity) * per;
    r.parity_pages_referenced = refs_parity * per;
    r.data_pages_referenced = (refs - refs_parity) * per;
    r.hash_ops = d(&|s| sum_dedup(s, |x| x.hash_ops));
    r.dedup_hits = d(&|s| sum_dedup(s, |x| x.dedup_hits));
    r.log_bytes = d(&|s| sum_dedup(s, |x| x.log_bytes));
    r.index_evictions = d(&|s| sum_dedup(s, |x| x.index_evictions));
    r.index_entries = sum_dedup(a, |x| x.index_entries);
    r.index_entries_before = sum_dedup(b, |x| x.index_entries);
    r.index_bytes_before = sum_dedup(b, |x| x.index_bytes);
    r.index_bytes = sum_dedup(a, |x| x.index_bytes);
    r.map_bytes = sum_dedup(a, |x| x.map_bytes);
    r.slot_entry_bytes = sum_dedup(a, |x| x.slot_entry_bytes);
    r.index_bytes_per_entry = if r.index_entries > 0 {
        r.index_bytes as f64 / r.index_entries as f64
    } else {
        0.0
    };
}

struct Context<'a> {
    opts: &'a Options,
    work: PathBuf,
    plan: Ext4Plan,
    workload: &'a WorkloadInfo,
}

fn policy_label(p: Policy) -> &'static str {
    report::config_name(p)
}

fn secs(t: Instant) -> f64 {
    t.elapsed().as_secs_f64()
}

/// Extracts each workload into the mounted ext4, timing extract + sync.
#[allow(clippy::type_complexity)]
fn write_fs(
    server: &Server,
    base: &Path,
    workloads: &[PathBuf],
    total_bytes: u64,
    plan: &Ext4Plan,
) -> Result<(Stats, Stats, f64, Vec<WorkloadTime>, Vec<(u64, u64)>)> {
    let mut fuse = Fuse::start(&base.join("fuse"), &server.uri())?;
    let mut lo = Loop::attach(&fuse.file())?;
    eprintln!("  mkfs.ext4 on {} ...", lo.path());
    proc::run_ok(
        &mut mkfs_ext4(Path::new(lo.path()), plan),
        Duration::from_secs(3600),
    )?;
    let mut mnt = Mount::new(lo.path(), &base.join("mnt"))?;
    let sync = |mnt: &Path| -> Result<()> {
        proc::run_ok(
            Command::new("sync").arg("-f").arg(mnt),
            Duration::from_secs(3600),
        )
        .map(|_| ())
    };
    sync(mnt.path())?;
    let before = fetch_stats(&server.dir)?;
    let mut times = Vec::new();
    let mut total = 0.0;
    let bar = bytes_bar(total_bytes, "extracting");
    let mut done_before = 0u64;
    for (i, w) in workloads.iter().enumerate() {
        let stem = w
            .file_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "workload".into());
        let sub = mnt.path().join(format!("w{i}-{stem}"));
        std::fs::create_dir_all(&sub)
            .map_err(|e| Error::io(format!("creating {}", sub.display()), e))?;
        let size = std::fs::metadata(w).map(|m| m.len()).unwrap_or(0);
        bar.set_message(format!("extracting {}", short(&stem, 14)));
        let written0 = lo.written_bytes().unwrap_or(0);
        let t0 = Instant::now();
        {
            let bar = bar.clone();
            let lo_ref = &lo;
            let mut tick = move || {
                // Bytes the loop device took so far, capped at this file's size.
                let w = lo_ref.written_bytes().unwrap_or(written0) - written0;
                bar.set_position(done_before + w.min(size));
            };
            proc::run_ticking(
                Command::new("tar").arg("-xf").arg(w).arg("-C").arg(&sub),
                EXTRACT_TIMEOUT,
                &mut tick,
            )
            .and_then(|o| {
                if o.success() {
                    Ok(o)
                } else {
                    Err(Error::Other(format!(
                        "`{}` failed ({}): {}",
                        o.what,
                        o.status,
                        o.stderr.trim()
                    )))
                }
            })?;
        }
        sync(mnt.path())?;
        let s = secs(t0);
        total += s;
        done_before += size;
        bar.set_position(done_before);
        times.push(WorkloadTime {
            file: w.display().to_string(),
            seconds: s,
        });
    }
    bar.finish_and_clear();
    mnt.unmount()?;
    let used = ext4_used_ranges(lo.path())?;
    lo.detach()?;
    fuse.stop();
    let after = fetch_stats(&server.dir)?;
    Ok((before, after, total, times, used))
}

/// The byte ranges `(start, len)` of the blocks an (unmounted) ext4 has in
/// use, from `dumpe2fs`'s per-group free lists: what the decode timing reads,
/// so that every configuration reads the same written extents.
fn ext4_used_ranges(dev: &str) -> Result<Vec<(u64, u64)>> {
    let out = proc::run_ok(Command::new("dumpe2fs").arg(dev), proc::STEP_TIMEOUT)?;
    parse_dumpe2fs_used(&out.stdout)
        .ok_or_else(|| Error::Other(format!("could not parse `dumpe2fs {dev}`'s free lists")))
}

/// Parses `dumpe2fs` output into used byte ranges (complement of the free
/// block lists over the block count), merged and in order.
fn parse_dumpe2fs_used(text: &str) -> Option<Vec<(u64, u64)>> {
    let field = |name: &str| -> Option<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
    };
    let block = field("Block size:")?;
    let count = field("Block count:")?;
    let mut free: Vec<(u64, u64)> = Vec::new();
    for l in text.lines() {
        let Some(list) = l.trim_start().strip_prefix("Free blocks:") else {
            continue;
        };
        if !l.starts_with(char::is_whitespace) {
            continue; // the superblock's total, not a group's list
        }
        for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (a, b) = match part.split_once('-') {
                Some((a, b)) => (a.trim().parse().ok()?, b.trim().parse().ok()?),
                None => {
                    let a: u64 = part.parse().ok()?;
                    (a, a)
                }
            };
            free.push((a, b + 1));
        }
    }
    free.sort_unstable();
    let mut used = Vec::new();
    let mut at = 0u64;
    for (a, b) in free {
        if a > at {
            used.push((at * block, (a - at) * block));
        }
        at = at.max(b);
    }
    if at < count {
        used.push((at * block, (count - at) * block));
    }
    Some(used)
}

fn short(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let t: String = s.chars().take(n - 1).collect();
        format!("{t}~")
    }
}

/// Writes the workload files back to back (each padded to 4 KiB) as one
/// sequential stream; returns the end of the written range too.
fn write_raw(
    server: &Server,
    workloads: &[PathBuf],
    stripe_data: u64,
    request_bytes: u64,
    total_bytes: u64,
) -> Result<(Stats, Stats, f64, Vec<WorkloadTime>, u64, blake3::Hash)> {
    let before = fetch_stats(&server.dir)?;
    let mut client = Client::connect(&server.socket)?;
    let volume = client.size;
    let req = request_bytes.max(1).div_ceil(stripe_data) * stripe_data;
    let mut buf = vec![0u8; req as usize];
    let mut pos = 0u64;
    let mut times = Vec::new();
    let bar = bytes_bar(total_bytes, "writing");
    let mut hasher = blake3::Hasher::new();
    let t_all = Instant::now();
    for w in workloads {
        let t0 = Instant::now();
        let mut file =
            File::open(w).map_err(|e| Error::io(format!("opening {}", w.display()), e))?;
        loop {
            proc::check_interrupted()?;
            // Cut requests at multiples of `req` (so at stripe boundaries).
            let want = (req - pos % req) as usize;
            let n = read_full(&mut file, &mut buf[..want])
                .map_err(|e| Error::io(format!("reading {}", w.display()), e))?;
            if n == 0 {
                break;
            }
            let len = n.div_ceil(PAGE as usize) * PAGE as usize;
            buf[n..len].fill(0);
            if pos + len as u64 > volume {
                return Err(Error::Config(format!(
                    "the workload does not fit the {} volume; give a larger --size",
                    format_size(volume)
                )));
            }
            client.write(pos, &buf[..len])?;
            hasher.update(&buf[..len]);
            pos += len as u64;
            bar.inc(n as u64);
            if n < want {
                break;
            }
        }
        times.push(WorkloadTime {
            file: w.display().to_string(),
            seconds: secs(t0),
        });
    }
    client.flush()?;
    let total = secs(t_all);
    bar.finish_and_clear();
    client.disconnect();
    let after = fetch_stats(&server.dir)?;
    Ok((before, after, total, times, pos, hasher.finalize()))
}

/// Reads `[0, len)` sequentially; returns the seconds the reads took (the
/// hashing between them not counted: one request is in flight, so the
/// server is idle meanwhile) and the BLAKE3 of the bytes.
fn read_back(server: &Server, ranges: &[(u64, u64)], what: &str) -> Result<(f64, blake3::Hash)> {
    let mut client = Client::connect(&server.socket)?;
    let size = client.size;
    let total: u64 = ranges.iter().map(|r| r.1).sum();
    let mut buf = vec![0u8; IO_REQUEST_BYTES as usize];
    let bar = bytes_bar(total, what);
    let mut hasher = blake3::Hasher::new();
    let mut timed = Duration::ZERO;
    let mut done = 0u64;
    for &(start, len) in ranges {
        let end = (start + len).min(size);
        let mut pos = start;
        while pos < end {
            proc::check_interrupted()?;
            let n = (end - pos).min(IO_REQUEST_BYTES) as usize;
            let t0 = Instant::now();
            client.read(pos, &mut buf[..n])?;
            timed += t0.elapsed();
            hasher.update(&buf[..n]);
            pos += n as u64;
            done += n as u64;
            bar.set_position(done);
        }
    }
    bar.finish_and_clear();
    client.disconnect();
    Ok((timed.as_secs_f64(), hasher.finalize()))
}

/// One array: create, serve, write, count, read back, stop, delete. On an
/// interrupt its folder goes too (unless --keep); on another error it stays
/// for inspection.
fn run_one(ctx: &Context, mode: Mode, chunk: u32, policy: Policy) -> Result<RunResult> {
    let name = format!("{}-{}-{}", format_size(chunk as u64), policy, mode.name());
    let base = ctx.work.join(&name);
    let r = run_one_in(ctx, mode, chunk, policy, &name, &base);
    if r.is_err() && proc::interrupted() && !ctx.opts.keep && !proc::is_mounted(&base.join("mnt")) {
        let _ = std::fs::remove_dir_all(&base);
    }
    r
}

fn run_one_in(
    ctx: &Context,
    mode: Mode,
    chunk: u32,
    policy: Policy,
    name: &str,
    base: &Path,
) -> Result<RunResult> {
    if base.exists() {
        std::fs::remove_dir_all(base)
            .map_err(|e| Error::io(format!("removing {}", base.display()), e))?;
    }
    let dir = base.join("array");
    let opts = CreateOptions {
        devices: (0..K + M).map(|i| dir.join(format!("dev{i}"))).collect(),
        k: K,
        m: M,
        stripe_unit_bytes: chunk,
        volume_bytes: ctx.plan.volume_bytes,
        intent_region_bytes: ecdedup_core::array::intent::REGION_BYTES_DEFAULT,
        write_policy: Default::default(),
        journal_bytes_max: ecdedup_core::array::JOURNAL_BYTES_DEFAULT,
        // As the figures in docs/benchmarks.md were measured: through the
        // page cache, sparse files (both sides of every comparison alike).
        io: ecdedup_core::media::IoMode::Buffered,
        sparse: true,
        force: false,
        dedup: DedupConfig {
            policy,
            block_bytes: DEDUP_BLOCK,
            algorithm: ctx.opts.fingerprint,
            index_entries_max: INDEX_ENTRIES_DEFAULT,
            verify: ctx.opts.verify || !ctx.opts.fingerprint.cryptographic(),
        },
        metadata: ecdedup_core::array::MetadataPlacement::Devices,
    };
    array::create(&dir, &opts)?;
    let mut server = Server::start(&dir)?;
    settle(&ctx.work)?;
    let workloads = &ctx.opts.workloads;
    let wl_bytes = ctx.workload.bytes;
    let stripe_data = K as u64 * chunk as u64;
    let (before, after, write_s, times, written, used) = match mode {
        Mode::Fs => {
            let (b, a, s, t, used) = write_fs(&server, base, workloads, wl_bytes, &ctx.plan)?;
            (b, a, s, t, None, used)
        }
        Mode::Raw => {
            let (b, a, s, t, end, hash) = write_raw(
                &server,
                workloads,
                stripe_data,
                parse_size(&ctx.opts.raw_request)?,
                wl_bytes,
            )?;
            (b, a, s, t, Some((end, hash)), vec![(0, end)])
        }
    };
    eprintln!(
        "  wrote {} in {:.1} s ({:.1} MiB/s)",
        format_size_approx(wl_bytes),
        write_s,
        wl_bytes as f64 / (1 << 20) as f64 / write_s.max(1e-9)
    );
    let volume_bytes = after_volume(&server)?;
    let decode = if ctx.opts.no_decode {
        None
    } else {
        let range: u64 = used.iter().map(|r| r.1.min(volume_bytes)).sum();
        settle(&ctx.work)?;
        let (healthy, h0) = read_back(&server, &used, "reading (healthy)")?;
        fail_device(&dir, 0)?;
        let (one, h1) = read_back(&server, &used, "reading (1 failed)")?;
        fail_device(&dir, 1)?;
        let (two, h2) = read_back(&server, &used, "reading (2 failed)")?;
        if h0 != h1 || h0 != h2 || written.is_some_and(|w| w.1 != h0) {
            return Err(Error::DataLoss(format!(
                "{name}: the read-back differs{} (healthy {h0}, 1 failed {h1}, 2 failed {h2})",
                written.map_or(String::new(), |w| format!(
                    " from what was written ({})",
                    w.1
                )),
            )));
        }
        eprintln!(
            "  read back {}: healthy {:.1} s, 1 failed {:.1} s, 2 failed {:.1} s",
            format_size_approx(range),
            healthy,
            one,
            two
        );
        Some(DecodeResult {
            range_bytes: range,
            healthy_seconds: healthy,
            one_failed_seconds: one,
            two_failed_seconds: two,
            verified: true,
        })
    };
    server.stop()?;
    drop(server);
    if !ctx.opts.keep {
        std::fs::remove_dir_all(base)
            .map_err(|e| Error::io(format!("removing {}", base.display()), e))?;
    }
    let mut r = RunResult {
        round: 0,
        mode,
        policy,
        chunk_bytes: chunk as u64,
        volume_bytes,
        k: K,
        m: M,
        workload_bytes: wl_bytes,
        write_seconds: write_s,
        write_mib_per_s: wl_bytes as f64 / (1 << 20) as f64 / write_s.max(1e-9),
        per_workload: times,
        client_writes: 0,
        client_write_bytes: 0,
        client_flushes: 0,
        full_stripe_writes: 0,
        rmw_writes: 0,
        rcw_writes: 0,
        degraded_writes: 0,
        stripe_updates: 0,
        data_pages_array: 0,
        parity_pages_array: 0,
        parity_write_ops_array: 0,
        data_pages_media: 0,
        parity_pages_media: 0,
        data_pages_referenced: 0,
        parity_pages_referenced: 0,
        parity_pages_paper_baseline: 0,
        hash_ops: 0,
        dedup_hits: 0,
        index_entries: 0,
        index_bytes: 0,
        index_bytes_per_entry: 0.0,
        index_entries_before: 0,
        index_bytes_before: 0,
        index_evictions: 0,
        log_bytes: 0,
        map_bytes: 0,
        slot_entry_bytes: 0,
        decode,
        write_seconds_rounds: Vec::new(),
        decode_rounds: Vec::new(),
        stats_before: serde_json::to_value(&before).expect("stats serialise"),
        stats_after: serde_json::to_value(&after).expect("stats serialise"),
    };
    counters(&mut r, &before, &after);
    Ok(r)
}

/// Writes back the dirty pages of the file system holding the arrays
/// before a timed phase, so that one run's write-back does not land in the
/// next one's timing. Only that file system (`sync -f`): a global sync would
/// also wait for every other mount on the host, FUSE ones included.
fn settle(work: &Path) -> Result<()> {
    proc::run_ok(
        Command::new("sync").arg("-f").arg(work),
        Duration::from_secs(600),
    )
    .map(|_| ())
}

fn after_volume(server: &Server) -> Result<u64> {
    let c = Client::connect(&server.socket)?;
    let size = c.size;
    c.disconnect();
    Ok(size)
}

/// Removes the default work folder on every path (unless --keep).
struct WorkDir {
    path: PathBuf,
    remove: bool,
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if self.remove && !super::proc::is_mounted(&self.path) {
            // Only what no mount still covers: the guards took them down.
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

pub fn run(opts: Options) -> Result<()> {
    if let Some(path) = &opts.from_results {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
        let mut results: Results = serde_json::from_str(&text)
            .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
        if results.summary.is_empty() {
            results.summary = report::summarize(&results.runs);
        }
        std::fs::create_dir_all(&opts.out)
            .map_err(|e| Error::io(format!("creating {}", opts.out.display()), e))?;
        return render(&results, &opts.out);
    }
    proc::install_interrupt_handler();
    let started = Instant::now();
    let chunks = parse_chunks(&opts.chunks)?;
    let policies = parse_policies(&opts.policies)?;
    if parse_size(&opts.raw_request)? == 0 {
        return Err(Error::Config(
            "--raw-request must be at least one byte".into(),
        ));
    }
    let modes = match opts.mode {
        ModeArg::Fs => vec![Mode::Fs],
        ModeArg::Raw => vec![Mode::Raw],
        ModeArg::Both => vec![Mode::Fs, Mode::Raw],
    };
    preflight(&opts, &modes)?;
    std::fs::create_dir_all(&opts.out)
        .map_err(|e| Error::io(format!("creating {}", opts.out.display()), e))?;

    eprintln!(
        "[0] hashing {} workload file(s) at 4 KiB (duplicate ratio; warms the page cache)",
        opts.workloads.len()
    );
    let mut workload = analyze(&opts.workloads)?;
    if modes.contains(&Mode::Fs) {
        for w in &opts.workloads {
            workload.entries += tar_entries(w)?;
        }
    }
    eprintln!(
        "    {} in {} blocks of 4 KiB: {:.1}% duplicates, {:.1}% zero blocks",
        format_size_approx(workload.bytes),
        workload.blocks_4k,
        100.0 * workload.duplicate_ratio_4k,
        100.0 * workload.zero_blocks_4k as f64 / workload.blocks_4k.max(1) as f64
    );
    let size_bytes = opts.size.as_deref().map(parse_size).transpose()?;
    let plan = ext4_plan(workload.bytes, workload.entries, size_bytes);
    let volume_bytes = plan.volume_bytes;
    eprintln!(
        "    volume {} ({}){}",
        format_size(volume_bytes),
        if size_bytes.is_some() {
            "--size".to_string()
        } else {
            format!(
                "for {} and {} tar entries",
                format_size_approx(workload.bytes),
                workload.entries
            )
        },
        match (modes.contains(&Mode::Fs), plan.inodes) {
            (false, _) => String::new(),
            (true, Some(n)) => format!(
                "; ext4 with {n} inodes (mkfs -N; its default of one per {} would be short)",
                format_size(EXT4_DEFAULT_BYTES_PER_INODE)
            ),
            (true, None) => format!(
                "; ext4 with its default inodes (one per {}: enough)",
                format_size(EXT4_DEFAULT_BYTES_PER_INODE)
            ),
        }
    );
    if modes.contains(&Mode::Raw) && volume_bytes < workload.bytes {
        return Err(Error::Config(format!(
            "--size {} is smaller than the workload ({})",
            format_size(volume_bytes),
            format_size_approx(workload.bytes)
        )));
    }
    let (work, remove_work) = match &opts.work {
        Some(w) => (w.clone(), false),
        None => (
            std::env::temp_dir().join(format!("ecdedup-eval-{}", std::process::id())),
            !opts.keep,
        ),
    };
    std::fs::create_dir_all(&work)
        .map_err(|e| Error::io(format!("creating {}", work.display()), e))?;
    let work = work
        .canonicalize()
        .map_err(|e| Error::io(format!("resolving {}", work.display()), e))?;
    let mut work_guard = WorkDir {
        path: work.clone(),
        remove: remove_work,
    };
    let ctx = Context {
        opts: &opts,
        work: work.clone(),
        plan,
        workload: &workload,
    };
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let mut results = Results {
        command,
        unix_time: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        host: host_description(),
        cpus: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        k: K,
        m: M,
        devices: K + M,
        dedup_block_bytes: DEDUP_BLOCK,
        fingerprint: opts.fingerprint.to_string(),
        verify: opts.verify || !opts.fingerprint.cryptographic(),
        index_entries_max: INDEX_ENTRIES_DEFAULT,
        volume_bytes,
        ext4_inodes: plan.inodes,
        workload: workload.clone(),
        rounds: opts.repeat,
        runs: Vec::new(),
        summary: Vec::new(),
        total_seconds: 0.0,
        paper: report::paper_figures(),
    };
    let total = opts.repeat as usize * modes.len() * chunks.len() * policies.len();
    let mut step = 0;
    for round in 0..opts.repeat {
        for &mode in &modes {
            for &chunk in &chunks {
                let mut order = policies.clone();
                let len = order.len();
                order.rotate_left(round as usize % len);
                for &policy in &order {
                    step += 1;
                    eprintln!(
                    "[{step}/{total}] {}{} mode, chunk {}, {} (--dedup {policy}), volume {} [{:.0} s so far]",
                    if opts.repeat > 1 { format!("round {}/{}, ", round + 1, opts.repeat) } else { String::new() },
                    mode.name(),
                    format_size(chunk as u64),
                    policy_label(policy),
                    format_size(volume_bytes),
                    secs(started)
                );
                    let r = match run_one(&ctx, mode, chunk, policy) {
                        Ok(mut r) => {
                            r.round = round;
                            r
                        }
                        Err(e) => {
                            if !proc::interrupted() {
                                work_guard.remove = false;
                                eprintln!(
                                    "ecdedup: the work folder {} is kept for inspection",
                                    work.display()
                                );
                            }
                            return Err(e);
                        }
                    };
                    results.runs.push(r);
                    // Partial results survive a later failure.
                    results.total_seconds = secs(started);
                    results.summary = report::summarize(&results.runs);
                    write_json(&opts.out.join("results.json"), &results)?;
                }
            }
        }
    }
    results.total_seconds = secs(started);
    results.summary = report::summarize(&results.runs);
    write_json(&opts.out.join("results.json"), &results)?;
    render(&results, &opts.out)?;
    eprintln!(
        "done in {:.0} s; raw numbers in {}",
        secs(started),
        opts.out.join("results.json").display()
    );
    Ok(())
}

fn write_json(path: &Path, results: &Results) -> Result<()> {
    let text = serde_json::to_string_pretty(results).expect("results serialise");
    std::fs::write(path, text).map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

fn host_description() -> String {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    format!("Linux {kernel}, {cpu}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dumpe2fs_free_lists_become_the_used_byte_ranges() {
        let text = "Block count:              100\nFree blocks:              40\nBlock size:               4096\n\
Group 0: (Blocks 0-49)\n  Free blocks: 10-19, 30\nGroup 1: (Blocks 50-99)\n  Free blocks: 60-79, 95-99\n";
        let used = parse_dumpe2fs_used(text).expect("parses");
        let b = 4096;
        assert_eq!(
            used,
            vec![
                (0, 10 * b),
                (20 * b, 10 * b),
                (31 * b, 29 * b),
                (80 * b, 15 * b)
            ]
        );
    }

    #[test]
    fn dumpe2fs_output_without_a_block_size_is_refused() {
        assert_eq!(parse_dumpe2fs_used("Group 0:\n  Free blocks: 1-2\n"), None);
    }
}
