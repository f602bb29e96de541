//! Benchmark of the SSD simulator: host page writes per second on one
//! thread with GC active, per dedup mode, and the simulator's memory per
//! simulated GiB.
//!
//! Workload: a 4 GiB logical space of 4 KiB pages, 128 pages per block, 10%
//! over-provisioning (90% utilisation), filled once sequentially, then
//! uniformly random single-page overwrites; a quarter of them carry one of
//! 4096 popular contents (duplicates), the rest are unique. The offline
//! modes run an unbounded offline pass every 65,536 writes, inside the timed
//! section. A warm-up of one logical space of overwrites brings GC to its
//! steady state; then `ROUNDS` timed rounds of one logical space each; the
//! rate reported is the median, with min and max, in thread CPU time
//! (`CLOCK_THREAD_CPUTIME_ID`, robust on a shared machine) and in wall time. Every mode replays the
//! same sequence. Fingerprints store mode (trace replay); a second table
//! runs contents mode (real bytes, real SHA-1 and CRC-32C) on 256 MiB.
//!
//! Run with `cargo bench --bench ssd` (add `-- separated` or other mode
//! names to run only those modes); without cargo's `--bench` flag (as under
//! `cargo test --benches`) it runs a small smoke version.

use ecdedup_core::ssd::{DedupMode, Ftl, FtlConfig, PageData, PageFingerprint, StoreMode};
use std::time::Instant;

const ROUNDS: usize = 3;
const PASS_EVERY: u64 = 65_536;
const DUP_SHARE_PER_MILLE: u64 = 250;
const DUP_POOL: u64 = 4096;

struct Settings {
    logical_bytes: u64,
    contents_logical_bytes: u64,
    rounds: usize,
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn fingerprint(tag: u64, n: u64) -> PageFingerprint {
    let mut s = tag ^ n.wrapping_mul(0xd6e8_feb8_6659_fd93);
    let digest = ((splitmix(&mut s) as u128) << 64) | splitmix(&mut s) as u128;
    PageFingerprint {
        digest,
        crc: digest as u32,
    }
}

fn config(mode: DedupMode, store: StoreMode, logical_bytes: u64) -> FtlConfig {
    let base = FtlConfig {
        dedup: DedupMode::OfflineSeparated,
        store,
        ..FtlConfig::new(4096, 128, 1, 0.1)
    };
    let blocks = base.blocks_for(logical_bytes / 4096) as u32;
    FtlConfig {
        blocks,
        dedup: mode,
        ..base
    }
}

/// The workload's next (page, content id); ids below `DUP_POOL` are popular.
fn next_write(rng: &mut u64, logical: u64, serial: &mut u64) -> (u64, u64) {
    let lpn = splitmix(rng) % logical;
    let content = if splitmix(rng) % 1000 < DUP_SHARE_PER_MILLE {
        splitmix(rng) % DUP_POOL
    } else {
        *serial += 1;
        DUP_POOL + *serial
    };
    (lpn, content)
}

struct Writer {
    rng: u64,
    serial: u64,
    since_pass: u64,
    page: Vec<u8>,
}

impl Writer {
    fn write(&mut self, ftl: &mut Ftl, n: u64) {
        let logical = ftl.logical_pages();
        let contents = ftl.config().store == StoreMode::Contents;
        for _ in 0..n {
            let (lpn, content) = next_write(&mut self.rng, logical, &mut self.serial);
            if contents {
                self.page[..8].copy_from_slice(&content.to_le_bytes());
                self.page[4088..].copy_from_slice(&content.to_le_bytes());
                ftl.write(lpn, PageData::Bytes(&self.page));
            } else {
                ftl.write(lpn, PageData::Fingerprint(fingerprint(1, content)));
            }
            self.since_pass += 1;
            if self.since_pass == PASS_EVERY {
                ftl.offline_pass(u64::MAX);
                self.since_pass = 0;
            }
        }
    }
}

/// This thread's CPU time in seconds.
fn thread_cpu_s() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

struct Row {
    rates: Vec<f64>,
    wall_rates: Vec<f64>,
    write_amplification: f64,
    copies_per_write: f64,
    memory_per_gib: f64,
}

fn run(mode: DedupMode, store: StoreMode, logical_bytes: u64, rounds: usize) -> Row {
    let mut ftl = Ftl::new(config(mode, store, logical_bytes)).expect("valid geometry");
    let logical = ftl.logical_pages();
    let mut writer = Writer {
        rng: 42,
        serial: 0,
        since_pass: 0,
        page: vec![0x5a; 4096],
    };
    // Fill sequentially, then warm up to GC's steady state.
    for lpn in 0..logical {
        if store == StoreMode::Contents {
            writer.page[..8].copy_from_slice(&(u64::MAX - lpn).to_le_bytes());
            ftl.write(lpn, PageData::Bytes(&writer.page));
        } else {
            ftl.write(lpn, PageData::Fingerprint(fingerprint(2, lpn)));
        }
    }
    ftl.offline_pass(u64::MAX);
    writer.write(&mut ftl, logical);
    ftl.reset_stats();
    let (mut rates, mut wall_rates) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let (start, cpu) = (Instant::now(), thread_cpu_s());
        writer.write(&mut ftl, logical);
        rates.push(logical as f64 / (thread_cpu_s() - cpu));
        wall_rates.push(logical as f64 / start.elapsed().as_secs_f64());
    }
    ftl.check().expect("consistent after the run");
    let r = ftl.report();
    let physical_gib = r.physical_pages as f64 * 4096.0 / (1u64 << 30) as f64;
    Row {
        rates,
        wall_rates,
        write_amplification: r.write_amplification,
        copies_per_write: r.counters.gc_page_copies as f64 / r.counters.host_page_writes as f64,
        memory_per_gib: r.memory_bytes as f64 / physical_gib / (1u64 << 20) as f64,
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

fn table(store: StoreMode, logical_bytes: u64, rounds: usize, modes: &[DedupMode]) {
    println!(
        "{store:?} mode, {} MiB logical, 4 KiB pages, 128 pages/block, 10% over-provisioning, \
         {rounds} rounds of {} random overwrites",
        logical_bytes >> 20,
        logical_bytes / 4096
    );
    println!();
    println!(
        "| mode | page writes per CPU s, median (min–max) | per wall s, median | write amp. | \
         GC copies / host write | MiB per simulated GiB |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for &mode in modes {
        let mut row = run(mode, store, logical_bytes, rounds);
        let (min, max) = row
            .rates
            .iter()
            .fold((f64::MAX, f64::MIN), |(lo, hi), &r| (lo.min(r), hi.max(r)));
        println!(
            "| {mode} | {:.2} M ({:.2}–{:.2}) | {:.2} M | {:.2} | {:.2} | {:.1} |",
            median(&mut row.rates) / 1e6,
            min / 1e6,
            max / 1e6,
            median(&mut row.wall_rates) / 1e6,
            row.write_amplification,
            row.copies_per_write,
            row.memory_per_gib,
        );
    }
    println!();
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let wanted: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let modes: Vec<DedupMode> = DedupMode::ALL
        .into_iter()
        .filter(|m| wanted.is_empty() || wanted.iter().any(|w| w == m.name()))
        .collect();
    let settings = if full {
        Settings {
            logical_bytes: 4 << 30,
            contents_logical_bytes: 256 << 20,
            rounds: ROUNDS,
        }
    } else {
        Settings {
            logical_bytes: 16 << 20,
            contents_logical_bytes: 4 << 20,
            rounds: 1,
        }
    };
    println!("ssd: single-threaded FTL simulation with GC active (benches/ssd.rs)");
    println!();
    table(
        StoreMode::Fingerprints,
        settings.logical_bytes,
        settings.rounds,
        &modes,
    );
    table(
        StoreMode::Contents,
        settings.contents_logical_bytes,
        settings.rounds,
        &modes,
    );
}
