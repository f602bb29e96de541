//! Benchmark of the metadata store: what it costs to persist the checksum of
//! one 4 KiB random client write, for the array's scheme (an in-memory
//! [`ChecksumTable`] whose changed 4 KiB pages are written back and synced at
//! a flush, plus the write-intent log [`IntentLog`] that covers whatever is
//! not flushed yet) against its peer, the embedded crash-safe key-value store
//! redb (one entry per block: block number -> CRC32C).
//!
//! Variants, each run over the same pseudo-random sequence of block numbers
//! in a space of `BLOCKS` blocks:
//! - `redb, commit every N`: one write transaction per N client writes, each
//!   write an insert (an update: the store is preloaded with every block, the
//!   steady state of a volume that has been written once, as the table always
//!   is); durability Immediate, redb's default (one-phase commit, one fsync per
//!   commit). N = 1 makes every write durable before it returns (as a FUA
//!   write); N = 64 is group commit, as a client flush every 64 writes.
//! - `table, flush every N`: `ChecksumTable::set` per write; every N writes
//!   `ChecksumTable::flush` (dirty pages) and `fdatasync` of the device file,
//!   which is what `Array::flush` does per device.
//! - `table + intent log, flush every N`: the same plus what `Array::write`
//!   and `Array::flush` do with the intent log: `begin`/`end` around each write
//!   (a region turning dirty costs a 1-byte write and an `fdatasync`), and
//!   `start_flush`/`finish_flush` around the flush (which clears the regions
//!   that went quiet). Regions map blocks as an RS(4,2) 32 KiB-unit array with
//!   the default 64 MiB region would: 32 blocks a stripe, 512 stripes a region.
//! - `table + intent log, no flush`: the steady state between client flushes.
//!
//! Measured: client writes per second (each variant runs until it has done
//! `OPS` writes or spent `SECS` seconds, then finishes its last group), bytes
//! the process passed to write system calls per client write (`wchar` of
//! /proc/self/io), bytes it sent towards storage per client write
//! (`write_bytes`, counted when a page is dirtied), and syncs per client write
//! (counted by this program: commits for redb, `fdatasync` calls for the
//! table and the intent log). Variants alternate in order (forward, then
//! backward) for `ROUNDS` rounds; the table gives the median rate with min and
//! max, and the byte counts of the last round; a second table gives, per
//! round, the rate of the checksum table (alone, and with the intent log)
//! divided by redb's at the same N (the three ran back to back), median with
//! min and max. The sync and byte counts are deterministic; the rates follow
//! the disk's fdatasync latency, which on a shared machine moves a lot.
//!
//! Environment: METADATA_OPS [100000], METADATA_BLOCKS [2097152],
//! METADATA_GROUPS [1,64], METADATA_SECS [20], METADATA_ROUNDS [3],
//! METADATA_DIR [$TMPDIR or /tmp]. Run with `cargo bench --bench metadata`;
//! without cargo's `--bench` flag (as under `cargo test --benches`) it runs a
//! small smoke configuration.

use ecdedup_core::array::checksum::ChecksumTable;
use ecdedup_core::array::intent::IntentLog;
use ecdedup_core::counters::DeviceCounters;
use ecdedup_core::media::{Device, FileDevice};
use redb::{Database, Durability, TableDefinition};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const TABLE: TableDefinition<u64, u32> = TableDefinition::new("checksums");
const BLOCK: u64 = 4096;
/// RS(4,2), 32 KiB unit: a stripe holds 128 KiB of data, 32 blocks.
const BLOCKS_PER_STRIPE: u64 = 32;
/// The default intent region, 64 MiB, in stripes of 128 KiB.
const STRIPES_PER_REGION: u64 = 512;
/// Where the table starts on its device file, as on an array member.
const TABLE_OFFSET: u64 = ecdedup_core::array::layout::CHECKSUM_OFFSET;

struct Settings {
    ops: usize,
    blocks: u64,
    groups: Vec<u64>,
    cap: Duration,
    rounds: usize,
    dir: PathBuf,
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} does not parse")),
        Err(_) => default,
    }
}

impl Settings {
    fn from_env(full: bool) -> Settings {
        let (ops, blocks, secs, rounds) = if full {
            (100_000, 2 << 20, 20, 3)
        } else {
            (2_000, 1 << 16, 1, 1)
        };
        let groups = std::env::var("METADATA_GROUPS").unwrap_or_else(|_| "1,64".into());
        Settings {
            ops: env_or("METADATA_OPS", ops),
            blocks: env_or("METADATA_BLOCKS", blocks),
            groups: groups
                .split(',')
                .map(|g| {
                    g.trim()
                        .parse()
                        .expect("METADATA_GROUPS is a list of numbers")
                })
                .collect(),
            cap: Duration::from_secs_f64(env_or("METADATA_SECS", secs as f64)),
            rounds: env_or("METADATA_ROUNDS", rounds),
            dir: std::env::var_os("METADATA_DIR")
                .or_else(|| std::env::var_os("TMPDIR"))
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("/tmp")),
        }
    }
}

/// The same block numbers for every variant (xorshift64*).
fn block_sequence(n: usize, blocks: u64) -> Vec<u64> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..n)
        .map(|_| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            x.wrapping_mul(0x2545_F491_4F6C_DD1D) % blocks
        })
        .collect()
}

/// A stand-in checksum for write `i` of block `b` (the value does not matter,
/// only that it changes).
fn crc_of(i: usize, b: u64) -> u32 {
    crc32c::crc32c(&(i as u64 ^ (b << 20)).to_le_bytes())
}

#[derive(Clone, Copy, Default)]
struct ProcIo {
    wchar: u64,
    write_bytes: u64,
}

fn proc_io() -> ProcIo {
    let text = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
            .unwrap_or(0)
    };
    ProcIo {
        wchar: field("wchar:"),
        write_bytes: field("write_bytes:"),
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Redb,
    Table,
    TableIntent,
}

#[derive(Clone, Copy)]
struct Variant {
    kind: Kind,
    /// Client writes per commit or flush; None: never.
    group: Option<u64>,
}

impl Variant {
    fn label(&self) -> String {
        let every = match self.group {
            Some(1) => "every write".to_string(),
            Some(n) => format!("every {n} writes"),
            None => "never (between client flushes)".to_string(),
        };
        match self.kind {
            Kind::Redb => format!("redb, commit {every}"),
            Kind::Table => format!("checksum table, flush {every}"),
            Kind::TableIntent => format!("checksum table + intent log, flush {every}"),
        }
    }
}

struct Sample {
    writes: usize,
    secs: f64,
    syncs: u64,
    io: ProcIo,
}

struct Stores {
    db: Database,
    dev: FileDevice,
    table: ChecksumTable,
    counters: DeviceCounters,
    intent: IntentLog,
}

impl Stores {
    fn create(dir: &Path, blocks: u64) -> Stores {
        let db_path = dir.join("checksums.redb");
        let db = Database::create(&db_path).expect("create redb");
        {
            // Preload: every block has an entry, as after a volume was written once.
            let txn = db.begin_write().unwrap();
            {
                let mut t = txn.open_table(TABLE).unwrap();
                for b in 0..blocks {
                    t.insert(b, crc_of(0, b)).unwrap();
                }
            }
            txn.commit().unwrap();
        }
        let table_bytes = (blocks * 4).div_ceil(BLOCK) * BLOCK;
        let dev = FileDevice::create_file(&dir.join("dev0"), TABLE_OFFSET + table_bytes)
            .expect("create table file");
        let counters = DeviceCounters::default();
        let table = ChecksumTable::new_zeroed(blocks, TABLE_OFFSET, BLOCK as usize);
        for b in 0..blocks {
            table.set(b, crc_of(0, b));
        }
        table.flush(&dev, &counters).unwrap();
        dev.sync().unwrap();
        let stripes = blocks.div_ceil(BLOCKS_PER_STRIPE);
        let intent_path = dir.join("intent.map");
        IntentLog::create(&intent_path, &[7; 16], stripes, STRIPES_PER_REGION).unwrap();
        let (intent, _, _) =
            IntentLog::open(&intent_path, &[7; 16], stripes, STRIPES_PER_REGION).unwrap();
        Stores {
            db,
            dev,
            table,
            counters,
            intent,
        }
    }

    fn run(&self, v: Variant, seq: &[u64], cap: Duration) -> Sample {
        // Start from a clean state: nothing dirty, intent map clean and synced.
        self.table.flush(&self.dev, &self.counters).unwrap();
        self.dev.sync().unwrap();
        self.intent.clear_all().unwrap();
        let io0 = proc_io();
        let start = Instant::now();
        let (writes, syncs) = match v.kind {
            Kind::Redb => self.run_redb(v.group.expect("redb commits"), seq, start, cap),
            Kind::Table | Kind::TableIntent => {
                self.run_table(v.kind == Kind::TableIntent, v.group, seq, start, cap)
            }
        };
        let secs = start.elapsed().as_secs_f64();
        let io1 = proc_io();
        Sample {
            writes,
            secs,
            syncs,
            io: ProcIo {
                wchar: io1.wchar - io0.wchar,
                write_bytes: io1.write_bytes - io0.write_bytes,
            },
        }
    }

    /// Returns (client writes done, commits).
    fn run_redb(&self, group: u64, seq: &[u64], start: Instant, cap: Duration) -> (usize, u64) {
        let mut commits = 0;
        let mut i = 0;
        while i < seq.len() && start.elapsed() < cap {
            let mut txn = self.db.begin_write().unwrap();
            txn.set_durability(Durability::Immediate).unwrap();
            {
                let mut t = txn.open_table(TABLE).unwrap();
                for _ in 0..group {
                    if i == seq.len() {
                        break;
                    }
                    t.insert(seq[i], crc_of(i + 1, seq[i])).unwrap();
                    i += 1;
                }
            }
            txn.commit().unwrap();
            commits += 1;
        }
        (i, commits)
    }

    /// What `Array::write` and `Array::flush` do with the metadata of one
    /// device. Returns (client writes done, fdatasync calls).
    fn run_table(
        &self,
        with_intent: bool,
        group: Option<u64>,
        seq: &[u64],
        start: Instant,
        cap: Duration,
    ) -> (usize, u64) {
        let mut syncs = 0;
        let mut i = 0;
        // The time cap is checked only where a group ends, so a run always
        // ends flushed.
        let step = group.unwrap_or(64) as usize;
        while i < seq.len() && (i % step != 0 || start.elapsed() < cap) {
            let b = seq[i];
            let stripe = b / BLOCKS_PER_STRIPE;
            if with_intent && self.intent.begin(stripe).unwrap() {
                syncs += 1;
            }
            self.table.set(b, crc_of(i + 1, b));
            if with_intent {
                self.intent.end(stripe);
            }
            i += 1;
            if group.is_some_and(|g| (i as u64).is_multiple_of(g)) {
                let epoch = with_intent.then(|| self.intent.start_flush());
                self.table.flush(&self.dev, &self.counters).unwrap();
                self.dev.sync().unwrap();
                syncs += 1;
                if let Some(epoch) = epoch {
                    self.intent.finish_flush(epoch).unwrap();
                }
            }
        }
        (i, syncs)
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let s = Settings::from_env(full);
    let work = tempfile::Builder::new()
        .prefix("ecdedup-bench-metadata.")
        .tempdir_in(&s.dir)
        .expect("temporary folder");
    eprintln!(
        "metadata bench in {}: {} writes over {} blocks, groups {:?}, cap {:?} a run, {} rounds{}",
        work.path().display(),
        s.ops,
        s.blocks,
        s.groups,
        s.cap,
        s.rounds,
        if full {
            ""
        } else {
            " (smoke run; `cargo bench --bench metadata` for the real one)"
        }
    );
    let seq = block_sequence(s.ops, s.blocks);
    let t = Instant::now();
    let stores = Stores::create(work.path(), s.blocks);
    eprintln!(
        "preloaded both stores with {} entries in {:.1} s",
        s.blocks,
        t.elapsed().as_secs_f64()
    );

    let mut variants = Vec::new();
    for &g in &s.groups {
        variants.push(Variant {
            kind: Kind::Redb,
            group: Some(g),
        });
        variants.push(Variant {
            kind: Kind::Table,
            group: Some(g),
        });
        variants.push(Variant {
            kind: Kind::TableIntent,
            group: Some(g),
        });
    }
    variants.push(Variant {
        kind: Kind::TableIntent,
        group: None,
    });

    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    let mut last: Vec<Option<Sample>> = variants.iter().map(|_| None).collect();
    for round in 0..s.rounds {
        let order: Vec<usize> = if round % 2 == 0 {
            (0..variants.len()).collect()
        } else {
            (0..variants.len()).rev().collect()
        };
        for vi in order {
            let sample = stores.run(variants[vi], &seq, s.cap);
            let rate = sample.writes as f64 / sample.secs;
            eprintln!(
                "round {} {:<55} {:>9.0} writes/s ({} writes in {:.1} s)",
                round + 1,
                variants[vi].label(),
                rate,
                sample.writes,
                sample.secs
            );
            rates[vi].push(rate);
            last[vi] = Some(sample);
        }
    }
    // Paired ratios: in each round the three variants of one group size ran
    // back to back, so their ratio cancels most of the drift between rounds.
    let mut ratio_lines = Vec::new();
    for &g in &s.groups {
        let find = |k: Kind| {
            variants
                .iter()
                .position(|v| v.kind == k && v.group == Some(g))
                .unwrap()
        };
        let (r, t, ti) = (find(Kind::Redb), find(Kind::Table), find(Kind::TableIntent));
        let ratios = |x: usize| -> String {
            let mut q: Vec<f64> = rates[x].iter().zip(&rates[r]).map(|(a, b)| a / b).collect();
            let (lo, hi) = q
                .iter()
                .fold((f64::MAX, f64::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
            format!("{:.2} ({:.2}–{:.2})", median(&mut q), lo, hi)
        };
        ratio_lines.push(format!("| {g} | {} | {} |", ratios(t), ratios(ti)));
    }
    let db_bytes = std::fs::metadata(work.path().join("checksums.redb"))
        .map(|m| m.len())
        .unwrap_or(0);
    let table_bytes = (s.blocks * 4).div_ceil(BLOCK) * BLOCK;

    println!(
        "| variant | client writes/s: median (min–max) | writes in last run | syncs / write | bytes to write() / write | bytes towards storage / write |"
    );
    println!("|---|---|---|---|---|---|");
    for (vi, v) in variants.iter().enumerate() {
        let r = &mut rates[vi];
        let (lo, hi) = r
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        let m = median(r);
        let l = last[vi].as_ref().unwrap();
        let per = |x: u64| x as f64 / l.writes as f64;
        println!(
            "| {} | {:.0} ({:.0}–{:.0}) | {} | {:.3} | {:.0} | {:.0} |",
            v.label(),
            m,
            lo,
            hi,
            l.writes,
            per(l.syncs),
            per(l.io.wchar),
            per(l.io.write_bytes),
        );
    }
    println!();
    println!("| writes per commit / flush (N) | checksum table ÷ redb, writes/s per round: median (min–max) | table + intent log ÷ redb: median (min–max) |");
    println!("|---|---|---|");
    for l in &ratio_lines {
        println!("{l}");
    }
    println!();
    println!(
        "On disk for {} blocks: redb file {:.1} MiB, checksum table {:.1} MiB (and the same in RAM), intent map {} bytes.",
        s.blocks,
        db_bytes as f64 / (1 << 20) as f64,
        table_bytes as f64 / (1 << 20) as f64,
        4096 + s.blocks.div_ceil(BLOCKS_PER_STRIPE).div_ceil(STRIPES_PER_REGION)
    );
}
