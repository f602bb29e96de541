//! Dedup overhead per 4 KiB write, in process (paper 002, Hamandawana et
//! al., Fig. 1), for each fingerprint backend: the successor of
//! `scripts/bench-dedup-overhead.sh` without the NBD hop, so it runs where
//! nbdkit and fio are not installed (the GPU machine).
//!
//! Method:
//! - sides, each one array opened once and kept open: `N` RS(4,2), 32K
//!   stripe unit, `--dedup none` (the peer without dedup); for each backend
//!   B given, `D-B` the same array with `--dedup all`, SHA-1 (the paper's),
//!   verify on (SHA-1's default), hashing with B; `C` a second `D-cpu`, the
//!   A/A control (C/D-cpu is the noise floor). Backends: `cpu`, `gpu` (the
//!   GPU backend behind its coalescing queue, batches under the crossover
//!   measured at start go to its CPU side: what `serve` runs) and `gpu-all`
//!   (the same with the threshold 0, `ECDEDUP_GPU_MIN_BATCH_BYTES=0`: every
//!   batch on the GPU, however small).
//! - the job: 4 KiB writes at random 4 KiB-aligned offsets, every block the
//!   same bytes (100% duplicates, as the script's `dedupe_percentage=100`),
//!   from QD threads writing one request at a time (QD1 and QD32), for
//!   SECONDS each, after a warm pass that writes every side once.
//! - ROUNDS rounds, the sides' order reversed every other round, so
//!   adjacent runs are compared and drift cancels.
//! - per-write phase times are deltas of the dedup layer's own timers
//!   (`chunking_ns`, `fingerprint_ns`, `index_ns`, summed over devices)
//!   divided by the writes done; latency is the writer threads' own clock.
//!   Overhead = latency(D) - latency(N) in the same round.
//!
//! Usage: `cargo bench -p ecdedup-core --bench dedup_overhead -- [--backends
//! cpu,gpu,gpu-all] [--rounds 5] [--seconds 3] [--size 1G] [--qd 1,32]
//! [--dir DIR] [--io direct|buffered] [--verify on|off]`; verify defaults
//! to on (SHA-1's default in `create`); the paper trusts SHA-1 (off). Without cargo's `--bench` flag (as
//! under `cargo test --benches`) it runs one tiny round as a smoke test.
//! Output: progress on stderr, markdown on stdout.

use ecdedup_core::array::{self, Array, CreateOptions, MetadataPlacement, WritePolicy};
use ecdedup_core::dedup::{DedupConfig, Policy};
use ecdedup_core::fingerprint::gpu::{BackendChoice, MIN_BATCH_ENV};
use ecdedup_core::fingerprint::Algorithm;
use ecdedup_core::media::IoMode;
use ecdedup_core::units::parse_size;
use rand::Rng;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BLOCK: usize = 4096;

struct Args {
    backends: Vec<String>,
    rounds: usize,
    seconds: f64,
    size: u64,
    qds: Vec<usize>,
    dir: PathBuf,
    io: IoMode,
    verify: bool,
}

fn parse_args() -> Args {
    let argv: Vec<String> = std::env::args().collect();
    let bench = argv.iter().any(|a| a == "--bench");
    let mut a = Args {
        backends: vec!["cpu".into()],
        rounds: if bench { 5 } else { 1 },
        seconds: if bench { 3.0 } else { 0.2 },
        size: if bench { 1 << 30 } else { 64 << 20 },
        qds: if bench { vec![1, 32] } else { vec![1, 4] },
        dir: std::env::temp_dir(),
        io: IoMode::Direct,
        verify: !Algorithm::Sha1.strong(),
    };
    let mut it = argv.iter().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .unwrap_or_else(|| panic!("{flag} needs a value"))
                .clone()
        };
        match flag.as_str() {
            "--backends" => a.backends = value().split(',').map(str::to_string).collect(),
            "--rounds" => a.rounds = value().parse().expect("--rounds N"),
            "--seconds" => a.seconds = value().parse().expect("--seconds S"),
            "--size" => a.size = parse_size(&value()).expect("--size like 1G"),
            "--qd" => {
                a.qds = value()
                    .split(',')
                    .map(|q| q.parse().expect("--qd 1,32"))
                    .collect()
            }
            "--dir" => a.dir = PathBuf::from(value()),
            "--io" => a.io = value().parse().expect("--io direct|buffered"),
            "--verify" => a.verify = value() == "on",
            _ => {} // cargo's own flags (--bench) and filters
        }
    }
    for b in &a.backends {
        assert!(
            ["cpu", "gpu", "gpu-all"].contains(&b.as_str()),
            "unknown backend {b}: cpu, gpu or gpu-all"
        );
    }
    a
}

/// One side: a name and its open array.
struct Side {
    name: String,
    array: Arc<Array>,
}

fn open_side(name: &str, root: &Path, a: &Args) -> Option<Side> {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).expect("side dir");
    let dedup_on = name != "N";
    let opts = CreateOptions {
        devices: (0..6).map(|i| dir.join(format!("dev{i}"))).collect(),
        k: 4,
        m: 2,
        stripe_unit_bytes: 32 << 10,
        volume_bytes: a.size,
        intent_region_bytes: 64 << 20,
        dedup: DedupConfig {
            policy: if dedup_on { Policy::All } else { Policy::None },
            block_bytes: BLOCK as u32,
            algorithm: Algorithm::Sha1,
            verify: a.verify,
            ..DedupConfig::default()
        },
        write_policy: WritePolicy::Rmw,
        journal_bytes_max: 256 << 20,
        io: a.io,
        sparse: false,
        force: false,
        metadata: MetadataPlacement::Devices,
    };
    array::create(&dir, &opts).expect("create");
    let (choice, all) = match name {
        "D-gpu" => (BackendChoice::Gpu, false),
        "D-gpu-all" => (BackendChoice::Gpu, true),
        _ => (BackendChoice::Cpu, false),
    };
    // Read once by the backend's start in open; nothing else runs yet.
    if all {
        std::env::set_var(MIN_BATCH_ENV, "0");
    }
    let opened = Array::open_with_backend(&dir, None, Some(choice));
    std::env::remove_var(MIN_BATCH_ENV);
    match opened {
        Ok(array) => {
            eprintln!("{name}: {}", array.fingerprint_backend());
            Some(Side {
                name: name.to_string(),
                array: Arc::new(array),
            })
        }
        Err(e) if choice == BackendChoice::Gpu => {
            println!("!!! {name} NOT MEASURED: GPU ABSENT: {e}\n");
            None
        }
        Err(e) => panic!("{name}: open: {e}"),
    }
}

/// Phase nanoseconds summed over the devices: (chunking, fingerprint, index).
fn phases(array: &Array) -> [u64; 3] {
    let mut sum = [0u64; 3];
    for d in array.stats().dedup.iter().flatten() {
        sum[0] += d.chunking_ns;
        sum[1] += d.fingerprint_ns;
        sum[2] += d.index_ns;
    }
    sum
}

/// Per-write figures of one run.
#[derive(Clone, Copy, Default)]
struct Run {
    writes: u64,
    latency_us: f64,
    chunking_us: f64,
    fingerprint_us: f64,
    index_us: f64,
}

fn run(side: &Side, qd: usize, seconds: f64, size: u64) -> Run {
    let before = phases(&side.array);
    let stop = Arc::new(AtomicBool::new(false));
    let block = Arc::new(vec![0x5au8; BLOCK]);
    let threads: Vec<_> = (0..qd)
        .map(|_| {
            let (array, stop, block) = (side.array.clone(), stop.clone(), block.clone());
            std::thread::spawn(move || {
                let mut rng = rand::thread_rng();
                let (mut writes, mut busy) = (0u64, Duration::ZERO);
                while !stop.load(Ordering::Relaxed) {
                    let offset = rng.gen_range(0..size / BLOCK as u64) * BLOCK as u64;
                    let t = Instant::now();
                    array.write(&block, offset, false).expect("write");
                    busy += t.elapsed();
                    writes += 1;
                }
                (writes, busy)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(seconds));
    stop.store(true, Ordering::Relaxed);
    let (mut writes, mut busy) = (0u64, Duration::ZERO);
    for t in threads {
        let (w, b) = t.join().expect("writer");
        writes += w;
        busy += b;
    }
    side.array.flush().expect("flush");
    let after = phases(&side.array);
    let per = |i: usize| (after[i] - before[i]) as f64 / 1e3 / writes.max(1) as f64;
    Run {
        writes,
        latency_us: busy.as_secs_f64() * 1e6 / writes.max(1) as f64,
        chunking_us: per(0),
        fingerprint_us: per(1),
        index_us: per(2),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn spread(v: &[f64]) -> String {
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{:.2} ({min:.2}-{max:.2})", median(v.to_vec()))
}

fn main() {
    let a = parse_args();
    let root = tempfile::Builder::new()
        .prefix("ecdedup-dedup-overhead")
        .tempdir_in(&a.dir)
        .expect("temp dir");
    let mut names = vec!["N".to_string()];
    names.extend(a.backends.iter().map(|b| format!("D-{b}")));
    names.push("C".to_string());
    let sides: Vec<Side> = names
        .iter()
        .filter_map(|n| open_side(n, root.path(), &a))
        .collect();
    let names: Vec<String> = sides.iter().map(|s| s.name.clone()).collect();
    // Warm pass: the first write of the repeated block stores it; later
    // ones are references, as in every timed run.
    for s in &sides {
        run(s, 1, a.seconds.min(1.0), a.size);
    }
    println!("# Dedup overhead per 4 KiB write, in process (paper 002 Fig. 1)\n");
    println!(
        "RS(4,2), 32K stripe unit, rmw, SHA-1, verify {}, 100% duplicate 4 KiB random writes, \
         {} rounds x {} s per side and QD, sides alternating (order reversed every other \
         round), io {:?}, {} GiB volume; {} CPUs.\n",
        if a.verify { "on" } else { "off" },
        a.rounds,
        a.seconds,
        a.io,
        a.size >> 30,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    for &qd in &a.qds {
        // results[side][round]
        let mut results: Vec<Vec<Run>> = vec![Vec::new(); sides.len()];
        for round in 0..a.rounds {
            let order: Vec<usize> = if round % 2 == 0 {
                (0..sides.len()).collect()
            } else {
                (0..sides.len()).rev().collect()
            };
            for i in order {
                let r = run(&sides[i], qd, a.seconds, a.size);
                eprintln!(
                    "QD{qd} round {round} {}: {} writes, {:.1} us/write",
                    sides[i].name, r.writes, r.latency_us
                );
                results[i].push(r);
            }
        }
        println!("## QD{qd}\n");
        println!(
            "| side | writes/s | latency us | chunking us | fingerprint us | index us | \
             dedup overhead us (D - N) | fingerprint share of chunk+fp+index |"
        );
        println!("|---|---|---|---|---|---|---|---|");
        let n = &results[0];
        for (i, side) in sides.iter().enumerate() {
            let r = &results[i];
            let col = |f: &dyn Fn(&Run) -> f64| spread(&r.iter().map(f).collect::<Vec<_>>());
            let iops: Vec<f64> = r
                .iter()
                .map(|x| x.writes as f64 / a.seconds)
                .collect::<Vec<_>>();
            let overhead: Vec<f64> = r
                .iter()
                .zip(n)
                .map(|(d, n)| d.latency_us - n.latency_us)
                .collect();
            let share: Vec<f64> = r
                .iter()
                .map(|x| {
                    let t = x.chunking_us + x.fingerprint_us + x.index_us;
                    if t > 0.0 {
                        100.0 * x.fingerprint_us / t
                    } else {
                        f64::NAN
                    }
                })
                .collect();
            println!(
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                side.name,
                spread(&iops),
                col(&|x| x.latency_us),
                col(&|x| x.chunking_us),
                col(&|x| x.fingerprint_us),
                col(&|x| x.index_us),
                if i == 0 {
                    "-".into()
                } else {
                    spread(&overhead)
                },
                if i == 0 { "-".into() } else { spread(&share) },
            );
        }
        // Paired ratios against D-cpu, with the A/A control.
        let dcpu = names.iter().position(|n| n == "D-cpu");
        if let Some(base) = dcpu {
            println!("\nratios per round against D-cpu, median (min-max):\n");
            for (i, side) in sides.iter().enumerate() {
                if i == base || i == 0 {
                    continue;
                }
                let ratio = |f: &dyn Fn(&Run) -> f64| {
                    let v: Vec<f64> = results[i]
                        .iter()
                        .zip(&results[base])
                        .map(|(x, b)| f(x) / f(b))
                        .collect();
                    spread(&v)
                };
                let ov = |r: &Run, n: &Run| r.latency_us - n.latency_us;
                let ov_ratio: Vec<f64> = results[i]
                    .iter()
                    .zip(&results[base])
                    .zip(n)
                    .map(|((x, b), n)| ov(x, n) / ov(b, n))
                    .collect();
                println!(
                    "- {} / D-cpu: fingerprint time {}, dedup overhead {}, latency {}",
                    side.name,
                    ratio(&|x| x.fingerprint_us),
                    spread(&ov_ratio),
                    ratio(&|x| x.latency_us)
                );
            }
        }
        println!();
    }
    for s in sides {
        match Arc::try_unwrap(s.array) {
            Ok(array) => array.close().expect("close"),
            Err(_) => panic!("array still shared"),
        }
    }
}
