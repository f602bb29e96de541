//! The `ecdedup` command line: a thin layer over the library. Commands that
//! change or inspect an array open it directly when no server holds it, and
//! talk to the server's control socket when one does.

use crate::array::{self, Array, CreateOptions, ProgressFn, Status};
use crate::control::{self, Request, Response};
use crate::error::{Error, Result};
use crate::units::{format_size, parse_size};
use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "ecdedup",
    version,
    about = "Erasure-coded, deduplicating block store for flash"
)]
struct Cli {
    /// The folder of the array (holds array.json, the intent log, sockets,
    /// and by default the device files); for `archive`, of the archive
    /// (archive.json, catalog.json, maps/, staging/, and by default the
    /// device folders dev0, dev1, ...); for `cluster`, of the local
    /// cluster (cluster.json, its etcd, servers and logs); for `serve
    /// --cluster`, the volume client's state; `chunkd`, `pool` and
    /// `volume` do not use it.
    #[arg(long, global = true, default_value = "data")]
    dir: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create an array: RS(k,m) over N devices (files are preallocated
    /// unless --sparse).
    Create {
        /// Number of device files to create in the array folder (dev0, dev1, ...).
        #[arg(long, default_value_t = 6)]
        devices: u32,
        /// Use these files or block devices instead, in position order (repeat).
        #[arg(long = "device")]
        device_paths: Vec<PathBuf>,
        #[arg(short, long, default_value_t = 4)]
        k: u32,
        #[arg(short, long, default_value_t = 2)]
        m: u32,
        /// Bytes a stripe places on one device (4K to 4M, a power of two).
        #[arg(long, default_value = "32K")]
        stripe_unit: String,
        /// Volume size.
        #[arg(long, default_value = "8G")]
        size: String,
        /// Volume bytes covered by one write-intent region.
        #[arg(long, default_value = "64M")]
        intent_region: String,
        /// Dedup policy under the array: none, all (every data and parity
        /// block), parity (only parity, paper 000).
        #[arg(long, default_value = "none")]
        dedup: String,
        /// Dedup block: the sub-chunk c that is fingerprinted (4K..1M, divides the stripe unit).
        #[arg(long, default_value = "4K")]
        dedup_block: String,
        /// Fingerprint: sha256 (default), sha1 (the papers'), md5, blake3, or
        /// crc32c (a 4-byte index key; needs --verify on or auto).
        #[arg(long, default_value = "sha256")]
        fingerprint: String,
        /// Bound of the fingerprint index, entries per device (LRU beyond it).
        #[arg(long, default_value_t = crate::dedup::INDEX_ENTRIES_DEFAULT)]
        index_entries: u64,
        /// Byte-compare on a fingerprint hit: auto (on for sha1 and md5), on, off.
        #[arg(long, default_value = "auto")]
        verify: String,
        /// Where fingerprints are computed: cpu (all cores), gpu (CUDA; an
        /// error at open where none can run), auto (the GPU when one is usable).
        #[arg(long, default_value = "cpu")]
        fingerprint_backend: String,
        /// Partial-write policy: rmw (in place), plog (parity logging), parix
        /// (speculative, paper 004), replicate (3-way baseline: sets k=1, m=2).
        #[arg(long, default_value = "rmw")]
        write_policy: String,
        /// Bound of each device's parity journal (plog, parix).
        #[arg(long, default_value = "256M")]
        journal_max: String,
        /// RAM bound of the per-block checksum tables, all devices together
        /// (pages beyond it are read from the devices on demand).
        #[arg(long, default_value = "64M")]
        checksum_cache: String,
        /// Device I/O: direct (O_DIRECT, the device answers) or buffered
        /// (the page cache; for file systems that refuse O_DIRECT, as tmpfs).
        #[arg(long, default_value = "direct")]
        io: String,
        /// Leave new device files sparse (space is taken as blocks are
        /// written, and a full file system refuses writes) instead of
        /// allocating them at create.
        #[arg(long)]
        sparse: bool,
        /// Overwrite devices that hold a file system, LVM, a partition
        /// table or an md member.
        #[arg(long)]
        force: bool,
        /// Where the parity journals, dedup maps and logs live: device (a
        /// metadata area on each device, which then assembles anywhere) or
        /// folder (the array folder: a separate, fast file system).
        #[arg(long, default_value = "device")]
        metadata: String,
        /// Simulated SSD under each device, counting flash wear of the real
        /// writes (data stays on the device): none, plain (FTL without
        /// dedup), inline, offline, separated, hinted. Counters cover one
        /// `serve`; see docs/ssd.md.
        #[arg(long, default_value = "none")]
        ssd_sim: String,
        /// Over-provisioning of the simulated SSDs, percent of flash.
        #[arg(long, default_value_t = crate::ssd::wear::SSD_OP_PERCENT_DEFAULT)]
        ssd_op: f64,
    },
    /// Change the partial-write policy of a stopped array (journals are replayed first).
    SetPolicy {
        /// rmw, plog or parix.
        policy: String,
    },
    /// Serve the volume over NBD (runs nbdkit with the ecdedup plugin, in the foreground).
    Serve {
        /// Unix socket to listen on [default: DIR/nbd.sock].
        #[arg(long)]
        socket: Option<PathBuf>,
        /// Listen on TCP instead: PORT (binds 127.0.0.1) or HOST:PORT.
        #[arg(long)]
        tcp: Option<String>,
        /// Expose Prometheus text at /metrics: PORT (binds 127.0.0.1) or HOST:PORT.
        #[arg(long)]
        metrics: Option<String>,
        /// Record a block trace of every request to this file (for `ecdedup sim`).
        #[arg(long)]
        trace: Option<PathBuf>,
        /// nbdkit worker threads.
        #[arg(long, default_value_t = 16)]
        threads: u32,
        /// The plugin library [default: next to this executable].
        #[arg(long)]
        plugin: Option<PathBuf>,
        /// Fingerprint backend for this run (cpu, gpu, auto) instead of the
        /// one chosen at create.
        #[arg(long)]
        fingerprint_backend: Option<String>,
        /// Serve a cluster volume instead (docs/cluster.md): etcd endpoints,
        /// comma-separated. --dir is then the client's state folder.
        #[arg(long, requires_all = ["volume", "key"])]
        cluster: Option<String>,
        /// The cluster's name (its etcd keys live under /ecdedup/NAME/).
        #[arg(long, default_value = "default")]
        cluster_name: String,
        #[command(flatten)]
        etcd_tls: crate::cluster_cli::EtcdTlsArgs,
        /// The cluster volume, POOL/NAME.
        #[arg(long, requires = "cluster")]
        volume: Option<String>,
        /// The cluster key file.
        #[arg(long, requires = "cluster")]
        key: Option<PathBuf>,
        /// The writer's etcd lease TTL in seconds (at least 2; default 10):
        /// a writer killed keeps its successor out for up to this long.
        #[arg(long, requires = "cluster")]
        lease_ttl: Option<u64>,
        /// Take the volume from a writer that still holds it, without
        /// waiting for that writer's lease to expire: the new epoch fences
        /// the old writer at every chunk server (for an orchestrator that
        /// has given the old host up; docs/cluster.md, "Fencing").
        #[arg(long, requires = "cluster")]
        take_over: bool,
        /// The most a rebuild of a re-placed shard writes to the PG's new
        /// server, bytes per second per PG (default 64 MiB; 0: no throttle).
        #[arg(long, requires = "cluster")]
        rebuild_rate: Option<u64>,
    },
    /// Show geometry, device states and any running operation (a stopped
    /// array is only read: no recovery, no file changed).
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Print the running server's counters (JSON, or Prometheus text); 0 for
    /// a stopped array, which is not opened.
    Stats {
        #[arg(long)]
        prometheus: bool,
    },
    /// Take a device out of service.
    Fail { position: usize },
    /// Put a blank device in place of a failed one (then run `rebuild`).
    Replace {
        position: usize,
        /// New file or block device [default: the position's current path, wiped].
        #[arg(long)]
        device: Option<PathBuf>,
    },
    /// Rebuild replaced devices from the others, with progress.
    Rebuild,
    /// Bring back a failed device whose data is still there (its failure
    /// was transient), reconstructing only the regions written while it was
    /// out. Runs on a stopped array, under every write policy and dedup
    /// mode (README).
    ReAdd { position: usize },
    /// Open a stopped array with more than m devices marked failed whose
    /// data is still there (a transient fault took them out): the freshest
    /// of them (the last to leave service) are marked active again, as few
    /// as bring the failed count down to m.
    Assemble {
        /// Bring back failed devices whose data is still there when more
        /// than m are failed: the devices brought back are trusted as they are.
        #[arg(long)]
        force: bool,
        /// Rebuild a lost array folder (--dir) from these devices, in any
        /// order (repeat): their superblocks and the copy of the settings
        /// on them (arrays made with --metadata device).
        #[arg(long = "device")]
        devices: Vec<PathBuf>,
    },
    /// Verify every block checksum and every stripe's parity; repair what is wrong.
    Scrub {
        /// Report only, change nothing.
        #[arg(long)]
        check_only: bool,
    },
    /// Make everything written so far durable (on a running server).
    Flush,
    /// Replay a block trace on the SSD simulator (FTL, GC, dedup, block separation).
    Sim(crate::ssd::SimArgs),
    /// The archive tier: objects sealed into erasure-coded containers with
    /// dedup before encoding (CodePlugin, paper 001; docs/archive.md). DIR
    /// is the archive folder.
    Archive {
        /// Show progress of put, seal, get, scrub and recovery even when
        /// stderr is not a terminal (as plain lines); on a terminal a bar
        /// is shown anyway.
        #[arg(long)]
        progress: bool,
        /// Where put and seal hash the blocks of a sealed container: cpu
        /// (all cores), gpu (CUDA; an error where none can run), auto (the
        /// GPU when one is usable). Any gives the same archive.
        #[arg(long, default_value = "cpu")]
        fingerprint_backend: String,
        #[command(subcommand)]
        command: ArchiveCommand,
    },
    /// Volumes of a cluster's pools, in etcd (docs/cluster.md).
    Volume(crate::volume_cli::VolumeArgs),
    /// Pools of a cluster and their placement groups, in etcd.
    Pool(crate::cluster_cli::PoolArgs),
    /// A chunk server: serves this host's chunk files to volume clients.
    Chunkd(crate::cluster_cli::ChunkdArgs),
    /// A whole cluster on this machine in --dir (etcd, chunk servers on
    /// loopback, a pool, a volume and its NBD server), for trials.
    Cluster(crate::cluster_cli::ClusterArgs),
    /// Run an experiment that reproduces a paper's evaluation.
    Eval {
        #[command(subcommand)]
        experiment: crate::eval::EvalCommand,
    },
}

// Parsed once per process: the size of `Create` does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum ArchiveCommand {
    /// Create an archive: RS(k,m) containers over N >= k+m device folders.
    Create {
        /// Number of device folders to make in the archive folder (dev0, dev1, ...).
        #[arg(long, default_value_t = 9)]
        devices: usize,
        /// Use these folders instead, in position order (repeat).
        #[arg(long = "device")]
        device_paths: Vec<PathBuf>,
        #[arg(short, long, default_value_t = 6)]
        k: usize,
        #[arg(short, long, default_value_t = 3)]
        m: usize,
        /// Container size (a multiple of k x block).
        #[arg(long, default_value = "300M")]
        container: String,
        /// Dedup block size (a power of two).
        #[arg(long, default_value = "8K")]
        block: String,
        /// Fingerprint: md5 (the paper's), sha1, sha256, blake3.
        #[arg(long, default_value = "md5")]
        fingerprint: String,
        /// Bound of the fingerprint cache (LRU beyond it).
        #[arg(long, default_value = "512M")]
        cache: String,
        /// Containers whose sub-files are exchanged when sealed (0: none).
        #[arg(long, default_value_t = 0)]
        exchange: u32,
        /// Byte-compare a block with its source on a hit: auto (on unless
        /// the fingerprint is sha256 or blake3), on, off.
        #[arg(long, default_value = "auto")]
        verify: String,
        /// What the data sub-files hold: paper (every block, as written)
        /// or compact (only unique blocks; reads follow the map).
        #[arg(long, default_value = "paper")]
        layout: String,
        /// Dedup units: fixed (blocks) or fastcdc (content-defined chunks
        /// of --cdc-min/--cdc-avg/--cdc-max; blocks stay the stripe unit).
        #[arg(long, default_value = "fixed")]
        chunking: String,
        #[arg(long, default_value = "2K")]
        cdc_min: String,
        #[arg(long, default_value = "8K")]
        cdc_avg: String,
        #[arg(long, default_value = "64K")]
        cdc_max: String,
    },
    /// Store a file, standard input, or a volume as an object (its name by
    /// default is the file's, or the array folder's).
    #[command(group(clap::ArgGroup::new("source").required(true).args(["file", "array", "nbd"])))]
    Put {
        /// The file to store; `-`: standard input (then --name is needed).
        file: Option<PathBuf>,
        #[arg(long)]
        name: Option<String>,
        /// Store the volume of this stopped array (its folder).
        #[arg(long)]
        array: Option<PathBuf>,
        /// Store the volume a running server exports at this NBD URI
        /// (nbd+unix:///?socket=PATH or nbd://HOST:PORT), read by nbdcopy.
        #[arg(long)]
        nbd: Option<String>,
    },
    /// Write an object (or a byte range of it) to a file or stdout.
    Get {
        name: String,
        /// Output file [default: stdout].
        #[arg(short, long)]
        output: Option<PathBuf>,
        #[arg(long, default_value_t = 0)]
        offset: u64,
        /// Bytes to read [default: to the end].
        #[arg(long)]
        length: Option<u64>,
    },
    /// List objects with their sizes and redundant blocks.
    Ls {
        #[arg(long)]
        json: bool,
    },
    /// Delete an object; batches nothing refers to any more are reclaimed.
    Rm { name: String },
    /// Seal the open container (and any waiting for an exchange batch).
    Seal,
    /// Make a lost archive folder (--dir) again from the device folders
    /// (repeat --device, any order; up to m may be missing): their copies
    /// of the config, the catalog and the maps. Prints JSON; then run
    /// `scrub --repair`.
    Assemble {
        #[arg(long = "device", required = true)]
        devices: Vec<PathBuf>,
    },
    /// Reclaim the dead part of batches: copy the live bytes of each batch
    /// under --live-below percent live into new containers, then delete it
    /// (a batch another one takes sources from stays). Prints JSON.
    Gc {
        #[arg(long, default_value_t = crate::archive::GC_LIVE_BELOW_PERCENT_DEFAULT)]
        live_below: f64,
    },
    /// Check every block and every encoded stripe's parity; repair with --repair.
    Scrub {
        #[arg(long)]
        repair: bool,
    },
    /// Counters as JSON (or Prometheus text).
    Stats {
        #[arg(long)]
        prometheus: bool,
    },
}

/// Objects smaller than this are put and got without a progress display.
const ARCHIVE_PROGRESS_MIN_BYTES: u64 = 64 << 20;
/// A plain progress line (no terminal, `--progress`) each time a phase
/// gets this many percent further.
const ARCHIVE_PROGRESS_LINE_PERCENT: u64 = 10;

/// Progress of an archive command: an indicatif bar when stderr is a
/// terminal, plain lines on stderr with `--progress` otherwise, nothing
/// else. Every archive phase counts bytes, from a total known when it
/// starts; each phase gets a bar of its own (its total, its rate and eta),
/// so no bar ever shows one phase's count against another's total.
struct ArchiveProgress {
    bar: Option<Arc<Mutex<Option<ProgressBar>>>>,
    report: Option<crate::archive::ProgressFn>,
}

impl ArchiveProgress {
    fn new(forced: bool) -> ArchiveProgress {
        use std::io::IsTerminal;
        if std::io::stderr().is_terminal() {
            let style = ProgressStyle::with_template(
                "{msg:>14} [{bar:40}] {percent}% {bytes}/{total_bytes} eta {eta}",
            )
            .expect("valid template")
            .progress_chars("=> ");
            let current: Arc<Mutex<Option<ProgressBar>>> = Arc::new(Mutex::new(None));
            let shared = Arc::clone(&current);
            let report: crate::archive::ProgressFn = Arc::new(move |phase, done, total| {
                let mut bar = shared.lock().unwrap_or_else(|e| e.into_inner());
                match bar.as_ref() {
                    Some(b) if b.message() == phase && b.length() == Some(total) => {
                        b.set_position(done)
                    }
                    _ => {
                        if let Some(old) = bar.take() {
                            old.finish_and_clear();
                        }
                        // Built whole before its first draw.
                        let b = ProgressBar::with_draw_target(
                            Some(total),
                            indicatif::ProgressDrawTarget::stderr(),
                        )
                        .with_style(style.clone())
                        .with_message(phase.to_string())
                        .with_position(done);
                        b.tick();
                        *bar = Some(b);
                    }
                }
            });
            ArchiveProgress {
                bar: Some(current),
                report: Some(report),
            }
        } else if forced {
            // (phase, next percent to print)
            let state = Arc::new(Mutex::new((String::new(), 0u64)));
            let report: crate::archive::ProgressFn = Arc::new(move |phase, done, total| {
                let mut st = state.lock().unwrap_or_else(|e| e.into_inner());
                if st.0 != phase {
                    *st = (phase.to_string(), 0);
                }
                let percent = (done * 100).checked_div(total).unwrap_or(100);
                if percent >= st.1 {
                    eprintln!("ecdedup: {phase}: {done}/{total} bytes ({percent}%)");
                    st.1 = (percent / ARCHIVE_PROGRESS_LINE_PERCENT + 1)
                        * ARCHIVE_PROGRESS_LINE_PERCENT;
                }
            });
            ArchiveProgress {
                bar: None,
                report: Some(report),
            }
        } else {
            ArchiveProgress::none()
        }
    }

    fn none() -> ArchiveProgress {
        ArchiveProgress {
            bar: None,
            report: None,
        }
    }

    fn report(&self, phase: &str, done: u64, total: u64) {
        if let Some(r) = &self.report {
            r(phase, done, total);
        }
    }
}

impl Drop for ArchiveProgress {
    fn drop(&mut self) {
        let bar = self
            .bar
            .as_ref()
            .and_then(|b| b.lock().unwrap_or_else(|e| e.into_inner()).take());
        if let Some(bar) = bar {
            bar.finish_and_clear();
        }
    }
}

/// A source that reports the bytes read from it.
struct ProgressReader<'a, R> {
    inner: R,
    read_bytes: u64,
    total_bytes: u64,
    progress: &'a ArchiveProgress,
}

impl<R: std::io::Read> std::io::Read for ProgressReader<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read_bytes += n as u64;
        self.progress.report(
            "put",
            self.read_bytes,
            self.total_bytes.max(self.read_bytes),
        );
        Ok(n)
    }
}

fn run_archive(
    dir: &Path,
    command: ArchiveCommand,
    progress: bool,
    fingerprint_backend: &str,
) -> Result<()> {
    use crate::archive::{ArchiveStore, CreateOptions};
    use crate::fingerprint::gpu::{choose_backend, BackendChoice};
    let choice = parse_backend(fingerprint_backend)?;
    // Only the commands that seal hash; the others never start a GPU.
    let seals = matches!(
        command,
        ArchiveCommand::Put { .. } | ArchiveCommand::Seal | ArchiveCommand::Gc { .. }
    );
    let backend = match choice {
        BackendChoice::Cpu => None,
        _ if !seals => None,
        choice => {
            let (backend, why) = choose_backend(choice, None)
                .map_err(|e| Error::Config(format!("--fingerprint-backend: {e}")))?;
            eprintln!("ecdedup: archive fingerprints: {why}");
            Some(backend)
        }
    };
    let progress = ArchiveProgress::new(progress);
    let open_archive = |dir: &Path| {
        open_archive(dir).map(|mut store| {
            store.set_progress(progress.report.clone());
            if let Some(b) = &backend {
                store.set_fingerprint_backend(Arc::clone(b));
            }
            store
        })
    };
    match command {
        ArchiveCommand::Create {
            devices,
            device_paths,
            k,
            m,
            container,
            block,
            fingerprint,
            cache,
            exchange,
            verify,
            layout,
            chunking,
            cdc_min,
            cdc_avg,
            cdc_max,
        } => {
            let layout = match layout.as_str() {
                "paper" => crate::archive::Layout::Paper,
                "compact" => crate::archive::Layout::Compact,
                other => {
                    return Err(Error::Config(format!(
                        "--layout {other:?}: expected paper or compact"
                    )))
                }
            };
            let cdc_size = |what: &str, size: &str| -> Result<u32> {
                u32::try_from(parse_size(size)?)
                    .map_err(|_| Error::Config(format!("--cdc-{what} {size} is too large")))
            };
            let chunking = match chunking.as_str() {
                "fixed" => crate::archive::Chunking::Fixed,
                "fastcdc" => crate::archive::Chunking::Fastcdc {
                    min_bytes: cdc_size("min", &cdc_min)?,
                    avg_bytes: cdc_size("avg", &cdc_avg)?,
                    max_bytes: cdc_size("max", &cdc_max)?,
                },
                other => {
                    return Err(Error::Config(format!(
                        "--chunking {other:?}: expected fixed or fastcdc"
                    )))
                }
            };
            let verify = match verify.as_str() {
                "auto" => None,
                "on" => Some(true),
                "off" => Some(false),
                other => {
                    return Err(Error::Config(format!(
                        "--verify {other:?}: expected auto, on or off"
                    )))
                }
            };
            let block_bytes = parse_size(&block)?;
            let options = CreateOptions {
                k,
                m,
                devices: device_paths,
                device_count: devices,
                container_bytes: parse_size(&container)?,
                block_bytes: u32::try_from(block_bytes)
                    .map_err(|_| Error::Config(format!("block size {block} is too large")))?,
                fingerprint: fingerprint.parse().map_err(
                    |e: crate::fingerprint::FingerprintError| Error::Config(e.to_string()),
                )?,
                cache_bytes: parse_size(&cache)?,
                exchange,
                verify,
                layout,
                chunking,
            };
            let store = ArchiveStore::create(dir, &options)?;
            let c = store.config();
            let chunking = match c.chunking {
                crate::archive::Chunking::Fixed => "fixed".to_string(),
                crate::archive::Chunking::Fastcdc {
                    min_bytes,
                    avg_bytes,
                    max_bytes,
                } => format!(
                    "fastcdc {}/{}/{}",
                    format_size(min_bytes as u64),
                    format_size(avg_bytes as u64),
                    format_size(max_bytes as u64)
                ),
            };
            println!(
                "created archive in {}: RS({},{}) over {} devices, container {}, block {}, exchange {}, layout {}, chunking {chunking}",
                dir.display(),
                c.k,
                c.m,
                c.devices.len(),
                format_size(c.container_bytes),
                format_size(c.block_bytes as u64),
                c.exchange,
                format!("{:?}", c.layout).to_lowercase()
            );
            Ok(())
        }
        ArchiveCommand::Put {
            file,
            name,
            array,
            nbd,
        } => {
            use crate::archive::source::{NbdSource, VolumeSource};
            let default_name = file
                .as_deref()
                .filter(|f| *f != Path::new("-"))
                .or(array.as_deref())
                .and_then(|p| p.file_name())
                .map(|n| n.to_string_lossy().into_owned());
            let name = name.or(default_name).ok_or_else(|| {
                Error::InvalidRequest("give the object a --name (the source has none)".into())
            })?;
            // Opened before the source: a wrong archive fails fast.
            let mut store = open_archive(dir)?;
            let quiet = ArchiveProgress::none();
            let mut put = |source: &mut dyn std::io::Read, total_bytes: u64| {
                store.put(
                    &name,
                    &mut ProgressReader {
                        inner: source,
                        read_bytes: 0,
                        total_bytes,
                        progress: if total_bytes >= ARCHIVE_PROGRESS_MIN_BYTES {
                            &progress
                        } else {
                            &quiet
                        },
                    },
                )
            };
            let record = if let Some(array_dir) = array {
                let array = open_offline(&array_dir)?.ok_or_else(|| {
                    Error::Busy(format!(
                        "array {} is being served: put its volume with --nbd",
                        array_dir.display()
                    ))
                })?;
                let mut volume = VolumeSource::new(crate::volume::Volume::new(Arc::new(array)));
                let size = volume.size();
                let record = put(&mut volume, size);
                let closed = volume.close();
                let record = record?;
                closed?;
                record
            } else if let Some(uri) = nbd {
                let mut source = NbdSource::open(&uri)?;
                let size = source.size();
                put(&mut source, size)?
            } else {
                let file = file.expect("clap requires a source");
                if file == Path::new("-") {
                    put(&mut std::io::stdin().lock(), 0)?
                } else {
                    let mut source = std::fs::File::open(&file)
                        .map_err(|e| Error::io(format!("open {}", file.display()), e))?;
                    let size = source.metadata().map(|m| m.len()).unwrap_or(0);
                    put(&mut source, size)?
                }
            };
            println!("put {name}: {} bytes", record.size);
            Ok(())
        }
        ArchiveCommand::Get {
            name,
            output,
            offset,
            length,
        } => {
            use std::io::Write;
            let store = open_archive(dir)?;
            let size = store.object(&name)?.size;
            let length = length.unwrap_or(size.saturating_sub(offset));
            if offset.checked_add(length).is_none_or(|end| end > size) {
                return Err(Error::OutOfRange {
                    offset,
                    length,
                    size,
                });
            }
            let copy = |out: &mut dyn Write| -> Result<()> {
                let mut buf = vec![0u8; 8 << 20];
                let mut done = 0u64;
                while done < length {
                    let take = (length - done).min(buf.len() as u64) as usize;
                    store.read(&name, offset + done, &mut buf[..take])?;
                    out.write_all(&buf[..take])
                        .map_err(|e| Error::io("write the object out", e))?;
                    done += take as u64;
                    if length >= ARCHIVE_PROGRESS_MIN_BYTES {
                        progress.report("get", done, length);
                    }
                }
                out.flush()
                    .map_err(|e| Error::io("write the object out", e))
            };
            match &output {
                // Standard output cannot be taken back: bytes go out as
                // they are read (and checked), and a failure stops them.
                None => copy(&mut std::io::stdout().lock()),
                Some(path) => write_whole_file(path, |file| copy(file)),
            }
        }
        ArchiveCommand::Ls { json } => {
            let store = open_archive(dir)?;
            let list = store.list();
            if json {
                print_json(&list);
            } else {
                for o in list {
                    println!(
                        "{:>12}  {:>5.1}% redundant  {}{}",
                        o.size,
                        if o.blocks > 0 {
                            100.0 * o.redundant_blocks as f64 / o.blocks as f64
                        } else {
                            0.0
                        },
                        o.name,
                        if o.unsealed_bytes > 0 {
                            "  (unsealed)"
                        } else {
                            ""
                        }
                    );
                }
            }
            Ok(())
        }
        ArchiveCommand::Rm { name } => open_archive(dir)?.remove(&name),
        ArchiveCommand::Seal => open_archive(dir)?.seal(),
        ArchiveCommand::Assemble { devices } => {
            let report = ArchiveStore::assemble(dir, &devices)?;
            print_json(&report);
            if !report.objects_lost.is_empty() {
                eprintln!(
                    "ecdedup: warning: {} objects had bytes in the lost folder's unsealed container and are gone: {:?}",
                    report.objects_lost.len(),
                    report.objects_lost
                );
            }
            Ok(())
        }
        ArchiveCommand::Gc { live_below } => {
            let report = open_archive(dir)?.gc(live_below)?;
            print_json(&report);
            Ok(())
        }
        ArchiveCommand::Scrub { repair } => {
            let mut store = open_archive(dir)?;
            let report = store.scrub(repair)?;
            print_json(&report);
            // A missing copy of the folder's metadata is lost redundancy:
            // damage that --repair fixes.
            let damaged = report.bad_blocks
                + report.bad_parity_blocks
                + report.unrecoverable_blocks
                + report.bad_metadata_copies;
            if report.unrecoverable_blocks > 0 {
                let left = match repair {
                    true => format!(
                        "; {} damaged files that hold them were left as they are, \
                         every other damaged file was repaired",
                        report.unrepaired_files
                    ),
                    false => String::new(),
                };
                return Err(Error::DataLoss(format!(
                    "{} blocks cannot be recovered (more than m of their stripe are lost){left}",
                    report.unrecoverable_blocks
                )));
            }
            if damaged > 0 && !repair {
                return Err(Error::Other(
                    "scrub found damage (run with --repair to fix it)".into(),
                ));
            }
            Ok(())
        }
        ArchiveCommand::Stats { prometheus } => {
            let stats = open_archive(dir)?.stats();
            let value = serde_json::to_value(&stats).expect("serializable");
            if prometheus {
                for (key, v) in value.as_object().expect("a struct") {
                    // Lifetime counts only grow; everything else is a gauge.
                    let kind = if key.starts_with("cache_")
                        && key != "cache_entries"
                        && key != "cache_bytes"
                    {
                        "counter"
                    } else {
                        "gauge"
                    };
                    println!("# TYPE ecdedup_archive_{key} {kind}");
                    println!("ecdedup_archive_{key} {v}");
                }
            } else {
                print_json(&value);
            }
            Ok(())
        }
    }
}

/// Prints `value` as pretty JSON on stdout (every `--json` output and
/// report).
fn print_json<T: serde::Serialize>(value: &T) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).expect("our types serialize")
    );
}

/// Writes `path` through `fill`, all or nothing: into a temporary file
/// beside it, synced and renamed over `path` only when `fill` succeeded
/// (every byte read and checked); on failure the temporary is removed and
/// `path` is left as it was.
fn write_whole_file(
    path: &Path,
    fill: impl FnOnce(&mut std::fs::File) -> Result<()>,
) -> Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| Error::InvalidRequest(format!("{} names no file", path.display())))?;
    let temporary = path.with_file_name(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    let mut file = std::fs::File::create(&temporary)
        .map_err(|e| Error::io(format!("create {}", temporary.display()), e))?;
    let filled = fill(&mut file).and_then(|()| {
        file.sync_all()
            .map_err(|e| Error::io(format!("sync {}", temporary.display()), e))
    });
    drop(file);
    let done = filled.and_then(|()| {
        std::fs::rename(&temporary, path)
            .map_err(|e| Error::io(format!("rename to {}", path.display()), e))
    });
    if done.is_err() {
        let _ = std::fs::remove_file(&temporary);
    }
    done
}

fn open_archive(dir: &Path) -> Result<crate::archive::ArchiveStore> {
    let store = crate::archive::ArchiveStore::open(dir)?;
    for d in store.missing_devices() {
        eprintln!("ecdedup: warning: archive device {d} is missing; reads decode around it");
    }
    for line in store.recovered() {
        eprintln!("ecdedup: warning: {line}");
    }
    Ok(store)
}

/// Test fault: set, the command panics as it starts (after the panic hook
/// is in place), so that a test sees what a panic prints.
pub const FAULT_PANIC_ENV: &str = "ECDEDUP_TEST_PANIC";

/// Makes every panic print its message and location straight to fd 2,
/// unbuffered, before the default handling: a panic must never end a
/// command with exit status 101 and nothing said (a progress bar redrawn
/// over the message, a stderr buffer never flushed).
pub fn install_panic_hook() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let msg = payload
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
            .unwrap_or("(a panic with a non-text payload)");
        let at = info
            .location()
            .map_or_else(|| "an unknown place".to_string(), |l| l.to_string());
        let line = format!("\necdedup: panic at {at}: {msg}\n");
        write_fd2(line.as_bytes());
        default(info);
    }));
}

/// Writes all of `bytes` to fd 2 with write(2), past Rust's stderr lock.
fn write_fd2(mut bytes: &[u8]) {
    while !bytes.is_empty() {
        // SAFETY: write(2) from a valid buffer of `bytes.len()` bytes.
        let n = unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
        if n > 0 {
            bytes = &bytes[n as usize..];
        } else if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
        {
            continue;
        } else {
            return;
        }
    }
}

pub fn main() -> i32 {
    if let Some(what) = std::env::var_os(FAULT_PANIC_ENV) {
        panic!("test fault {FAULT_PANIC_ENV}={}", what.to_string_lossy());
    }
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("ecdedup: error: {e}");
            1
        }
    }
}

fn progress_bar() -> (ProgressFn, ProgressBar) {
    progress_bar_with("{msg:>8} [{bar:40}] {pos}/{len} stripes {percent}% eta {eta}")
}

/// A bar drawn with `template`, and the callback that moves it: a new
/// phase name becomes its message.
fn progress_bar_with(template: &str) -> (ProgressFn, ProgressBar) {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template(template)
            .expect("valid template")
            .progress_chars("=> "),
    );
    let b = bar.clone();
    let current = Arc::new(Mutex::new(String::new()));
    let f: ProgressFn = Arc::new(move |what: &str, done: u64, total: u64| {
        let mut cur = current.lock().unwrap();
        if *cur != what {
            *cur = what.to_string();
            b.set_message(what.to_string());
        }
        b.set_length(total);
        b.set_position(done);
    });
    (f, bar)
}

/// Opens the array offline, or says that a server holds it.
///
/// Offline maintenance (status, scrub, rebuild, set-policy) of an array
/// configured for `gpu` hashes with `auto`: the backend changes how fast
/// fingerprints are computed, never their value, so such an array stays
/// maintainable on a machine without a GPU. `serve` enforces the
/// configured backend.
fn open_offline(dir: &Path) -> Result<Option<Array>> {
    use crate::fingerprint::gpu::BackendChoice;
    let backend = match array::ConfigFile::load(dir) {
        Ok(cfg) if cfg.fingerprint_backend == BackendChoice::Gpu => Some(BackendChoice::Auto),
        _ => None,
    };
    let (progress, bar) = progress_bar();
    match Array::open_with_backend(dir, Some(progress), backend) {
        Ok(a) => {
            bar.finish_and_clear();
            for w in a.open_warnings() {
                eprintln!("ecdedup: warning: {w}");
            }
            Ok(Some(a))
        }
        Err(Error::Busy(_)) => {
            bar.finish_and_clear();
            Ok(None)
        }
        Err(e) => {
            bar.finish_and_clear();
            Err(e)
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    let dir = cli.dir;
    match cli.command {
        Command::Create {
            devices,
            device_paths,
            k,
            m,
            stripe_unit,
            size,
            intent_region,
            dedup,
            dedup_block,
            fingerprint,
            index_entries,
            verify,
            fingerprint_backend,
            write_policy,
            journal_max,
            checksum_cache,
            io,
            sparse,
            force,
            metadata,
            ssd_sim,
            ssd_op,
        } => {
            let fingerprint_backend = parse_backend(&fingerprint_backend)?;
            let ssd_sim = crate::ssd::SsdSimConfig {
                mode: ssd_sim.parse()?,
                over_provisioning_percent: ssd_op,
            };
            ssd_sim.validate()?;
            let write_policy: crate::array::WritePolicy = write_policy.parse()?;
            let (k, m) = if write_policy == crate::array::WritePolicy::Replicate {
                println!("write policy replicate: every block is stored on 3 devices (RS(1,2))");
                (1, 2)
            } else {
                (k, m)
            };
            let algorithm: crate::fingerprint::Algorithm = fingerprint
                .parse()
                .map_err(|e| Error::Config(format!("--fingerprint: {e}")))?;
            let verify = match verify.as_str() {
                "auto" => !algorithm.strong(),
                "on" => true,
                "off" => false,
                other => {
                    return Err(Error::Config(format!(
                        "--verify {other:?} is not auto, on or off"
                    )))
                }
            };
            let dedup = crate::dedup::DedupConfig {
                policy: dedup.parse()?,
                block_bytes: u32::try_from(parse_size(&dedup_block)?).map_err(|_| {
                    Error::Config(format!("--dedup-block {dedup_block} is too large"))
                })?,
                algorithm,
                index_entries_max: index_entries,
                verify,
            };
            let stripe_unit_bytes = parse_size(&stripe_unit)?;
            let stripe_unit_bytes = u32::try_from(stripe_unit_bytes)
                .map_err(|_| Error::Config(format!("stripe unit {stripe_unit} is too large")))?;
            let paths = if device_paths.is_empty() {
                (0..devices).map(|i| dir.join(format!("dev{i}"))).collect()
            } else {
                device_paths
            };
            let opts = CreateOptions {
                devices: paths,
                k,
                m,
                stripe_unit_bytes,
                volume_bytes: parse_size(&size)?,
                intent_region_bytes: parse_size(&intent_region)?,
                dedup,
                write_policy,
                journal_bytes_max: parse_size(&journal_max)?,
                io: io.parse()?,
                sparse,
                force,
                metadata: metadata.parse()?,
            };
            array::create(&dir, &opts)?;
            array::set_fingerprint_backend(&dir, fingerprint_backend)?;
            if ssd_sim != crate::ssd::SsdSimConfig::default() {
                array::set_ssd_sim(&dir, ssd_sim)?;
            }
            let checksum_cache_bytes = parse_size(&checksum_cache)?;
            if checksum_cache_bytes != array::checksum::CACHE_BYTES_DEFAULT {
                array::set_checksum_cache(&dir, checksum_cache_bytes)?;
            }
            println!(
                "created RS({k},{m}) array in {} over {} devices: stripe unit {}, volume {}",
                dir.display(),
                opts.devices.len(),
                format_size(stripe_unit_bytes as u64),
                format_size(opts.volume_bytes)
            );
            Ok(())
        }
        Command::Serve {
            socket,
            tcp,
            metrics,
            trace,
            threads,
            plugin,
            fingerprint_backend,
            cluster,
            cluster_name,
            etcd_tls,
            volume,
            key,
            lease_ttl,
            take_over,
            rebuild_rate,
        } => {
            let backend = fingerprint_backend
                .as_deref()
                .map(parse_backend)
                .transpose()?;
            let target = match (cluster, volume, key) {
                (Some(endpoints), Some(volume), Some(key)) => {
                    if trace.is_some() || backend.is_some() {
                        return Err(Error::Config(
                            "--trace and --fingerprint-backend serve a local array; a cluster \
                             volume takes neither"
                                .into(),
                        ));
                    }
                    ServeTarget::Cluster {
                        endpoints,
                        name: cluster_name,
                        tls: etcd_tls.tls(),
                        volume,
                        key,
                        lease_ttl,
                        take_over,
                        rebuild_rate,
                    }
                }
                _ => {
                    check_servable(&dir)?;
                    ServeTarget::Array
                }
            };
            serve_nbdkit(
                &dir, target, socket, tcp, metrics, trace, threads, plugin, backend,
            )
        }
        Command::Status { json } => {
            let status = match array::lock_dir(&dir) {
                // Held while reading, so that no server starts meanwhile.
                Ok(_lock) => array::inspect(&dir)?,
                Err(Error::Busy(_)) => match control::request(&dir, &Request::Status)? {
                    Response::Status(s) => *s,
                    other => return Err(unexpected(other)),
                },
                Err(e) => return Err(e),
            };
            if json {
                print_json(&status);
            } else {
                print_status(&status);
            }
            Ok(())
        }
        Command::Stats { prometheus } => {
            let stats = match array::lock_dir(&dir) {
                Ok(_lock) => {
                    // Counters count what one server did; a stopped array
                    // is not opened (that would recover it), so they are 0.
                    eprintln!(
                        "ecdedup: no server runs on {}: counters cover one serve session, so they are all 0",
                        dir.display()
                    );
                    let devices = array::ConfigFile::load(&dir)?.devices.len();
                    crate::counters::Counters::new(devices).snapshot(0)
                }
                Err(Error::Busy(_)) => match control::request(&dir, &Request::Stats)? {
                    Response::Stats(s) => *s,
                    other => return Err(unexpected(other)),
                },
                Err(e) => return Err(e),
            };
            if prometheus {
                print!("{}", stats.prometheus());
            } else {
                print_json(&stats);
            }
            Ok(())
        }
        Command::Fail { position } => {
            match open_offline(&dir)? {
                Some(a) => a.fail_device(position)?,
                None => expect_ok(control::request(&dir, &Request::Fail { position })?)?,
            }
            println!(
                "device {position} failed; the array serves degraded until `replace` and `rebuild`"
            );
            Ok(())
        }
        Command::Replace { position, device } => {
            match open_offline(&dir)? {
                Some(a) => a.replace_device(position, device.as_deref())?,
                None => expect_ok(control::request(
                    &dir,
                    &Request::Replace {
                        position,
                        path: device,
                    },
                )?)?,
            }
            println!("device {position} replaced with a blank device; run `ecdedup rebuild`");
            Ok(())
        }
        Command::Rebuild => {
            match open_offline(&dir)? {
                Some(a) => {
                    let (progress, bar) = progress_bar();
                    let r = a.rebuild(Some(progress));
                    bar.finish();
                    let n = r?;
                    a.close()?;
                    println!("rebuilt {n} stripe units");
                }
                None => {
                    let after = started_after(control::request(&dir, &Request::Rebuild)?)?;
                    follow(&dir, after)?;
                    println!("rebuild finished");
                }
            }
            Ok(())
        }
        Command::Scrub { check_only } => {
            let report: crate::array::ScrubReport = match open_offline(&dir)? {
                Some(a) => {
                    let (progress, bar) = progress_bar();
                    let r = a.scrub(!check_only, Some(progress));
                    bar.finish();
                    let report = r?;
                    a.close()?;
                    report
                }
                None => {
                    let after = started_after(control::request(
                        &dir,
                        &Request::Scrub {
                            repair: !check_only,
                        },
                    )?)?;
                    let op = follow(&dir, after)?;
                    op.result
                        .and_then(|v| serde_json::from_value(v).ok())
                        .ok_or_else(|| Error::Other("the server's scrub left no report".into()))?
                }
            };
            print_json(&report);
            if report.unrecoverable_blocks > 0 {
                return Err(Error::DataLoss(format!(
                    "{} blocks could not be repaired: more units of their rows are bad than the parity covers",
                    report.unrecoverable_blocks
                )));
            }
            if report.unlocated_stripes > 0 {
                return Err(Error::DataLoss(format!(
                    "{} stripes' parity disagrees with their data and no member can be told \
                     wrong: left unchanged (the warnings name them)",
                    report.unlocated_stripes
                )));
            }
            if !report.dedup_map_problems.is_empty() {
                return Err(Error::Corrupt(format!(
                    "the dedup maps are inconsistent ({}); replace and rebuild the device named",
                    report.dedup_map_problems.join("; ")
                )));
            }
            let copies_bad =
                report.metadata_copy_problems.len() as u64 - report.metadata_copies_repaired;
            if !check_only && copies_bad > 0 {
                return Err(Error::Corrupt(format!(
                    "{copies_bad} copies of metadata files could not be rewritten ({})",
                    report.metadata_copy_problems.join("; ")
                )));
            }
            if check_only
                && (report.checksum_mismatches > 0
                    || report.parity_mismatches > 0
                    || copies_bad > 0)
            {
                return Err(Error::Other(
                    "scrub found inconsistencies (run without --check-only to repair)".into(),
                ));
            }
            Ok(())
        }
        Command::ReAdd { position } => {
            let Some(mut a) = open_offline(&dir)? else {
                return Err(Error::Busy(format!(
                    "stop the server of {} first: re-add runs on a stopped array",
                    dir.display()
                )));
            };
            let units = a.re_add(position)?;
            a.close()?;
            println!(
                "device {position} re-added: {units} stripe units it missed were reconstructed (of {} stripes)",
                a.geometry().stripes
            );
            Ok(())
        }
        Command::Assemble { force, devices } => {
            if !devices.is_empty() {
                if force {
                    return Err(Error::Config(
                        "--device rebuilds a folder; run `assemble --force` on it afterwards if needed".into(),
                    ));
                }
                let cfg = array::assemble_from_devices(&dir, &devices)?;
                println!(
                    "assembled array {} in {} from {} of its {} devices",
                    cfg.array_uuid,
                    dir.display(),
                    devices.len(),
                    cfg.devices.len()
                );
                return Ok(());
            }
            if !force {
                return Err(Error::Config(
                    "an array assembles whenever it is opened; `assemble --force` brings back \
                     failed devices whose data is still there when more than m are failed"
                        .into(),
                ));
            }
            let back = array::force_assemble(&dir)?;
            let status = array::inspect(&dir)?;
            let still: Vec<String> = status
                .devices
                .iter()
                .filter(|d| d.state == array::MemberState::Failed)
                .map(|d| d.position.to_string())
                .collect();
            println!(
                "device(s) {} marked active again, their data taken as it is (the dirty regions are resynchronised when the array opens)",
                back.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")
            );
            if !still.is_empty() {
                println!(
                    "still failed: {} (`ecdedup re-add N` if a device's data is still there, else `replace` and `rebuild`)",
                    still.join(", ")
                );
            }
            Ok(())
        }
        Command::Archive {
            progress,
            fingerprint_backend,
            command,
        } => run_archive(&dir, command, progress, &fingerprint_backend),
        Command::Eval { experiment } => crate::eval::run(experiment),
        Command::Volume(args) => crate::volume_cli::run(args, &mut std::io::stdout()),
        Command::Pool(args) => crate::cluster_cli::pool(args, &mut std::io::stdout()),
        Command::Chunkd(args) => {
            let code = crate::cluster_cli::chunkd(args)?;
            if code != 0 {
                std::process::exit(code);
            }
            Ok(())
        }
        Command::Cluster(args) => crate::cluster_cli::cluster(&dir, args),
        Command::Sim(args) => crate::ssd::run_sim(args),
        Command::SetPolicy { policy } => {
            let policy: crate::array::WritePolicy = policy.parse()?;
            let Some(a) = open_offline(&dir)? else {
                return Err(Error::Busy(format!(
                    "stop the server of {} first: the policy is chosen offline",
                    dir.display()
                )));
            };
            a.set_write_policy(policy)?;
            println!("write policy is now {policy}");
            Ok(())
        }
        Command::Flush => match open_offline(&dir)? {
            Some(a) => a.close(),
            None => expect_ok(control::request(&dir, &Request::Flush)?),
        },
    }
}

/// A `--fingerprint-backend` value: cpu, gpu or auto.
fn parse_backend(name: &str) -> Result<crate::fingerprint::gpu::BackendChoice> {
    name.parse()
        .map_err(|e| Error::Config(format!("--fingerprint-backend: {e}")))
}

fn unexpected(r: Response) -> Error {
    Error::Other(format!("unexpected answer from server: {r:?}"))
}

fn expect_ok(r: Response) -> Result<()> {
    match r {
        Response::Ok | Response::Started { .. } => Ok(()),
        other => Err(unexpected(other)),
    }
}

/// Follows a server-side operation with a progress bar until it ends.
/// The sequence number after which the server's new operation is numbered.
fn started_after(r: Response) -> Result<u64> {
    match r {
        Response::Started { after_seq, .. } => Ok(after_seq),
        other => Err(unexpected(other)),
    }
}

/// Follows the server-side operation numbered after `after_seq` with a
/// progress bar until it ends; returns its final state.
fn follow(dir: &Path, after_seq: u64) -> Result<crate::array::OpProgress> {
    let (progress, bar) = progress_bar();
    loop {
        let status = match control::request(dir, &Request::Status)? {
            Response::Status(s) => s,
            other => return Err(unexpected(other)),
        };
        if let Some(op) = status.operation.filter(|op| op.seq > after_seq) {
            progress(&op.op, op.done, op.total);
            if op.finished {
                bar.finish();
                return match &op.error {
                    Some(e) => Err(Error::Other(format!("{} failed: {e}", op.op))),
                    None => Ok(op),
                };
            }
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn print_status(s: &Status) {
    println!("array {}  generation {}", s.array_uuid, s.generation);
    println!(
        "RS({},{}) over {} devices, stripe unit {}, volume {} ({} stripes)",
        s.k,
        s.m,
        s.devices_total,
        format_size(s.stripe_unit_bytes as u64),
        format_size(s.volume_bytes),
        s.stripes
    );
    println!("health: {}", s.health);
    match s.metadata_area_bytes {
        0 => println!("metadata: in the array folder (format 1)"),
        b => println!(
            "metadata: on the devices, a {} area on each (format 2)",
            format_size(b)
        ),
    }
    println!("write policy: {}", s.write_policy);
    let d = &s.dedup;
    if d.policy == crate::dedup::Policy::None {
        println!("dedup: none");
    } else {
        println!(
            "dedup: {} ({} in {} sub-chunks, index bound {} entries per device, verify {})",
            d.policy,
            d.algorithm,
            format_size(d.block_bytes as u64),
            d.index_entries_max,
            if d.verify { "on" } else { "off" }
        );
        println!("fingerprint backend: {}", s.fingerprint_backend);
    }
    if s.ssd_sim.mode != crate::ssd::SsdSimMode::Off {
        println!(
            "simulated SSDs: {} ({}% over-provisioning; wear counters in `stats`, per serve session)",
            s.ssd_sim.mode, s.ssd_sim.over_provisioning_percent
        );
    }
    for d in &s.devices {
        let state = match d.state {
            array::MemberState::Active => "active".to_string(),
            array::MemberState::Failed => "FAILED".to_string(),
            array::MemberState::Rebuilding { cursor } => {
                format!("rebuilding ({cursor}/{} stripes)", s.stripes)
            }
        };
        println!(
            "  device {}: {:<28} {}",
            d.position,
            state,
            d.path.display()
        );
    }
    println!("dirty intent regions: {}", s.dirty_regions);
    if let Some(n) = s.missed_regions {
        // The hint only where it applies: a re-add takes back a failed
        // member whose data is still there; a rebuilding one is being
        // written whole (a probe: `re-add` was pointed to after `replace`,
        // and at a position holding another array's device).
        let failed = s
            .devices
            .iter()
            .any(|d| d.state == array::MemberState::Failed);
        let hint = match failed {
            true => " (`re-add` reconstructs them on a failed device whose data is still there)",
            false => "",
        };
        println!("regions written while a device was failed: {n}{hint}");
    }
    if s.poisoned_blocks > 0 {
        println!(
            "poisoned blocks: {} (unknowable after an unclean stop: they read as I/O errors \
             until written whole; docs/write-hole.md)",
            s.poisoned_blocks
        );
    }
    if let Some(op) = &s.operation {
        println!(
            "operation: {} {}/{}{}",
            op.op,
            op.done,
            op.total,
            if op.finished { " (finished)" } else { "" }
        );
    }
    for w in &s.warnings {
        println!("warning: {w}");
    }
}

fn plugin_path(explicit: Option<PathBuf>) -> Result<PathBuf> {
    if let Some(p) = explicit.or_else(|| std::env::var_os("ECDEDUP_PLUGIN").map(PathBuf::from)) {
        return Ok(p);
    }
    let exe =
        std::env::current_exe().map_err(|e| Error::io("locating the ecdedup executable", e))?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    for candidate in [
        dir.join("libecdedup_nbdkit.so"),
        dir.join("../libecdedup_nbdkit.so"),
    ] {
        if candidate.exists() {
            return Ok(candidate);
        }
    }
    Err(Error::Config(format!(
        "the nbdkit plugin libecdedup_nbdkit.so is not next to {} (build the workspace with `cargo build --release`, or pass --plugin)",
        exe.display()
    )))
}

/// Fails early, with our own words, on the common mistakes of serving the
/// array in `dir`. A config that does not parse is the open's to recover
/// (from the devices' copies).
fn check_servable(dir: &Path) -> Result<()> {
    match array::ConfigFile::load(dir) {
        Ok(_) | Err(Error::Corrupt(_)) => {}
        Err(e) => return Err(e),
    }
    if held_by_another_server(dir)? {
        return Err(Error::Busy(format!(
            "array {} is already being served (or its lock stayed held for {} s while no server answered)",
            dir.display(),
            SERVE_LOCK_WAIT.as_secs()
        )));
    }
    Ok(())
}

/// What `serve` serves: the array in --dir, or a cluster volume (--dir
/// then holds the client's state).
// One per process: the size of `Array` does not matter.
#[allow(clippy::large_enum_variant)]
enum ServeTarget {
    Array,
    Cluster {
        endpoints: String,
        name: String,
        tls: ecdedup_cluster::EtcdTls,
        volume: String,
        key: PathBuf,
        lease_ttl: Option<u64>,
        take_over: bool,
        rebuild_rate: Option<u64>,
    },
}

#[allow(clippy::too_many_arguments)] // one per `serve` option
fn serve_nbdkit(
    dir: &Path,
    target: ServeTarget,
    socket: Option<PathBuf>,
    tcp: Option<String>,
    metrics: Option<String>,
    trace: Option<PathBuf>,
    threads: u32,
    plugin: Option<PathBuf>,
    fingerprint_backend: Option<crate::fingerprint::gpu::BackendChoice>,
) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let plugin = plugin_path(plugin)?;
    let cluster = matches!(target, ServeTarget::Cluster { .. });
    if cluster {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    }
    let dir_abs = std::fs::canonicalize(dir)
        .map_err(|e| Error::io(format!("resolving {}", dir.display()), e))?;
    let mut cmd = std::process::Command::new("nbdkit");
    cmd.arg("--foreground")
        .arg("--threads")
        .arg(threads.to_string());
    match tcp {
        Some(addr) => {
            // A bare port binds loopback only.
            let (host, port) = addr
                .rsplit_once(':')
                .unwrap_or(("127.0.0.1", addr.as_str()));
            if port.parse::<u16>().is_err() {
                return Err(Error::Config(format!(
                    "--tcp {addr:?} is not PORT or HOST:PORT"
                )));
            }
            cmd.arg("--ipaddr")
                .arg(host.trim_matches(['[', ']']))
                .arg("--port")
                .arg(port);
        }
        None => {
            let sock = socket.unwrap_or_else(|| dir_abs.join("nbd.sock"));
            remove_stale_socket(&sock)?;
            cmd.arg("--unix").arg(sock);
        }
    }
    cmd.arg(&plugin).arg(format!("dir={}", dir_abs.display()));
    if let ServeTarget::Cluster {
        endpoints,
        name,
        tls,
        volume,
        key,
        lease_ttl,
        take_over,
        rebuild_rate,
    } = target
    {
        let key = std::fs::canonicalize(&key)
            .map_err(|e| Error::io(format!("cluster key {}", key.display()), e))?;
        cmd.arg(format!("cluster={endpoints}"))
            .arg(format!("cluster_name={name}"))
            .arg(format!("volume={volume}"))
            .arg(format!("key={}", key.display()));
        // The plugin's etcd_ca=, etcd_cert=, etcd_key= (absolute: nbdkit
        // may change directory).
        for (param, path) in [
            ("etcd_ca", tls.ca),
            ("etcd_cert", tls.cert),
            ("etcd_key", tls.key),
        ] {
            if let Some(path) = path {
                let path = std::fs::canonicalize(&path).map_err(|e| {
                    Error::io(
                        format!("--{} {}", param.replace('_', "-"), path.display()),
                        e,
                    )
                })?;
                cmd.arg(format!("{param}={}", path.display()));
            }
        }
        if let Some(ttl) = lease_ttl {
            cmd.arg(format!("lease_ttl={ttl}"));
        }
        if take_over {
            cmd.arg("take_over=1");
        }
        if let Some(rate) = rebuild_rate {
            cmd.arg(format!("rebuild_rate={rate}"));
        }
    }
    if let Some(m) = metrics {
        cmd.arg(format!("metrics={m}"));
    }
    if let Some(b) = fingerprint_backend {
        cmd.arg(format!("fingerprint_backend={b}"));
    }
    if let Some(t) = trace {
        let t = if t.is_absolute() {
            t
        } else {
            std::env::current_dir().map(|d| d.join(&t)).unwrap_or(t)
        };
        cmd.arg(format!("trace={}", t.display()));
    }
    if cluster {
        // nbdkit (Debian's 1.32) dies with its parent (it sets
        // PR_SET_PDEATHSIG): a cluster volume's server stays its parent,
        // so that `cluster up` or a supervisor may exit before it.
        return supervise(cmd);
    }
    let err = cmd.exec();
    Err(Error::Other(format!(
        "cannot run nbdkit ({err}); install it with scripts/install-deps.sh"
    )))
}

/// The child `supervise` forwards stop signals to (0: none yet).
static SUPERVISED: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn forward_signal(sig: libc::c_int) {
    let pid = SUPERVISED.load(std::sync::atomic::Ordering::SeqCst);
    if pid > 0 {
        // SAFETY: kill(2) is async-signal-safe; the pid is our child's.
        unsafe { libc::kill(pid, sig) };
    }
}

/// Runs nbdkit as a child, forwards the stop signals to it, and exits with
/// its status.
fn supervise(mut cmd: std::process::Command) -> Result<()> {
    let mut child = cmd.spawn().map_err(|e| {
        Error::Other(format!(
            "cannot run nbdkit ({e}); install it with scripts/install-deps.sh"
        ))
    })?;
    SUPERVISED.store(child.id() as i32, std::sync::atomic::Ordering::SeqCst);
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT] {
        // SAFETY: installs an async-signal-safe handler.
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = forward_signal as *const () as usize;
            act.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut act.sa_mask);
            libc::sigaction(sig, &act, std::ptr::null_mut());
        }
    }
    let status = child
        .wait()
        .map_err(|e| Error::io("waiting for nbdkit", e))?;
    std::process::exit(status.code().unwrap_or(1));
}

/// A socket file left by a killed server would make nbdkit refuse to bind.
/// Removes it when nothing listens on it; refuses when something does.
fn remove_stale_socket(path: &Path) -> Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    if !meta.file_type().is_socket() {
        return Err(Error::Config(format!(
            "{} exists and is not a socket; choose another --socket",
            path.display()
        )));
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(Error::Busy(format!(
            "something already listens on {}",
            path.display()
        )));
    }
    std::fs::remove_file(path)
        .map_err(|e| Error::io(format!("removing stale socket {}", path.display()), e))
}

/// How long `serve` waits for the array folder's lock while no server
/// answers on the array's control socket: a server killed a moment ago
/// (kill -9) holds the lock until the kernel has torn the process down.
const SERVE_LOCK_WAIT: Duration = Duration::from_secs(10);
/// How often `serve` tries the lock while it waits.
const SERVE_LOCK_POLL: Duration = Duration::from_millis(50);

/// True when another process holds the array: at once when a server
/// answers a status request on its control socket, after
/// [`SERVE_LOCK_WAIT`] otherwise.
fn held_by_another_server(dir: &Path) -> Result<bool> {
    let deadline = std::time::Instant::now() + SERVE_LOCK_WAIT;
    loop {
        match array::lock_dir(dir) {
            Ok(_) => return Ok(false),
            Err(Error::Busy(_)) => {}
            Err(e) => return Err(e),
        }
        // A killed server's control socket still takes connections until
        // its teardown ends, so only an answer shows a live server.
        let answers = control::request(dir, &Request::Status).is_ok();
        if answers || std::time::Instant::now() >= deadline {
            return Ok(true);
        }
        std::thread::sleep(SERVE_LOCK_POLL);
    }
}
