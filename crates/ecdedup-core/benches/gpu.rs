//! Benchmark of the GPU fingerprint backend against the CPU backend, in one
//! run on one machine.
//!
//! Sections: (1) the kernel's source compiled as C on one CPU thread
//! (`KernelOnCpuBackend`) against RustCrypto on one thread, a sanity figure
//! that runs everywhere; (2) the CPU backend on all cores, SHA-1 and SHA-256
//! at 4, 8 and 32 KiB chunks and several batch sizes; (3) where a CUDA
//! device is present: correctness of the GPU backend against the CPU backend
//! on fresh random data of many chunk sizes and counts, the measured pinned
//! host-to-device copy bandwidth, and the GPU throughput table on the same
//! grid as (2), each cell also as a percentage of that bandwidth (goal: at
//! least 70%). Without a device it says loudly that the GPU is absent and
//! runs (1) and (2) only.
//!
//! Invariants: data is fresh random bytes each run; every timed backend's
//! output is checked equal to the reference before it is timed; throughput
//! is bytes hashed per second (GB/s, 10^9), the median of `reps` timed runs
//! after one warm-up. The GPU table uses a backend with no size threshold,
//! so every cell is the GPU's (the default backend sends batches under
//! `GPU_MIN_BATCH_BYTES` to the CPU). Run with `cargo bench --bench gpu`;
//! without cargo's `--bench` flag (as under `cargo test --benches`) it runs
//! one small pass as a smoke test.

use ecdedup_core::fingerprint::gpu::{
    GpuBackend, GpuConfig, KernelOnCpuBackend, PoolLayout, GPU_MIN_BATCH_BYTES,
};
use ecdedup_core::fingerprint::{Algorithm, CpuBackend, Fingerprint, FingerprintBackend};
use rand::{Rng, RngCore};
use std::hint::black_box;
use std::time::Instant;

const CHUNK_SIZES: [usize; 3] = [4 << 10, 8 << 10, 32 << 10];
const TABLE_ALGORITHMS: [Algorithm; 3] = [Algorithm::Sha1, Algorithm::Sha256, Algorithm::Md5];
const KERNEL_ALGORITHMS: [Algorithm; 3] = [Algorithm::Sha1, Algorithm::Sha256, Algorithm::Md5];
/// The share of pinned copy bandwidth end-to-end GPU hashing should reach.
const GOAL: f64 = 0.70;

struct Settings {
    reps: usize,
    /// Bytes hashed per case in the single-thread section.
    single_bytes: usize,
    /// Batch sizes in bytes for the CPU and GPU tables.
    batches: Vec<usize>,
    /// Random correctness cases on the GPU.
    correctness_cases: usize,
}

fn settings() -> Settings {
    if std::env::args().any(|a| a == "--bench") {
        Settings {
            reps: 5,
            single_bytes: 32 << 20,
            batches: vec![4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20],
            correctness_cases: 40,
        }
    } else {
        Settings {
            reps: 1,
            single_bytes: 1 << 20,
            batches: vec![256 << 10, 1 << 20],
            correctness_cases: 4,
        }
    }
}

fn random_bytes(len: usize) -> Vec<u8> {
    let mut data = vec![0u8; len];
    rand::thread_rng().fill_bytes(&mut data);
    data
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

fn size_label(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}

/// Median GB/s of `f` hashing `bytes`, after one warm-up run.
fn throughput(reps: usize, bytes: usize, mut f: impl FnMut()) -> f64 {
    f();
    let runs = (0..reps)
        .map(|_| {
            let start = Instant::now();
            f();
            bytes as f64 / start.elapsed().as_secs_f64() / 1e9
        })
        .collect();
    median(runs)
}

fn reference(algorithm: Algorithm, chunks: &[&[u8]]) -> Vec<Fingerprint> {
    chunks.iter().map(|c| algorithm.fingerprint(c)).collect()
}

fn batch_gbps(
    backend: &dyn FingerprintBackend,
    algorithm: Algorithm,
    chunks: &[&[u8]],
    reps: usize,
) -> f64 {
    let bytes: usize = chunks.iter().map(|c| c.len()).sum();
    let mut out = Vec::with_capacity(chunks.len());
    backend
        .fingerprint_batch(algorithm, chunks, &mut out)
        .expect("backend");
    assert_eq!(
        out,
        reference(algorithm, chunks),
        "{} disagrees with RustCrypto: {algorithm}",
        backend.name()
    );
    throughput(reps, bytes, || {
        backend
            .fingerprint_batch(algorithm, black_box(chunks), &mut out)
            .expect("backend");
        black_box(&out);
    })
}

fn single_thread_section(s: &Settings) {
    println!("\n## Kernel source as C, one CPU thread, vs RustCrypto on one thread");
    println!("(sanity figure: the GPU kernel is one sequential hash per thread; RustCrypto");
    println!(" uses SHA-NI where the CPU has it, the kernel as C never does)\n");
    println!("| algorithm | chunk | kernel as C GB/s | RustCrypto GB/s | C / RustCrypto |");
    println!("|---|---|---|---|---|");
    let data = random_bytes(s.single_bytes);
    let kernel = KernelOnCpuBackend::new(PoolLayout::new(1, 64 << 20)).expect("kernel on cpu");
    for algorithm in KERNEL_ALGORITHMS {
        for size in CHUNK_SIZES {
            let chunks: Vec<&[u8]> = data.chunks_exact(size).collect();
            let bytes = chunks.len() * size;
            let c = batch_gbps(&kernel, algorithm, &chunks, s.reps);
            let mut out = Vec::with_capacity(chunks.len());
            let rust = throughput(s.reps, bytes, || {
                out.clear();
                out.extend(chunks.iter().map(|c| algorithm.fingerprint(black_box(c))));
                black_box(&out);
            });
            println!(
                "| {algorithm} | {} | {c:.3} | {rust:.3} | {:.2} |",
                size_label(size),
                c / rust
            );
        }
    }
}

/// GB/s of `backend` for each algorithm, chunk size and batch size, in
/// table order; checks every batch against RustCrypto first.
fn table(backend: &dyn FingerprintBackend, data: &[u8], s: &Settings) -> Vec<f64> {
    let mut cells = Vec::new();
    for algorithm in TABLE_ALGORITHMS {
        for size in CHUNK_SIZES {
            for &batch in &s.batches {
                // A batch smaller than one chunk has no cell (NaN, shown "-").
                if batch < size {
                    cells.push(f64::NAN);
                    continue;
                }
                let chunks: Vec<&[u8]> = data[..batch].chunks_exact(size).collect();
                cells.push(batch_gbps(backend, algorithm, &chunks, s.reps));
            }
        }
    }
    cells
}

fn print_cpu_table(cpu: &CpuBackend, cells: &[f64], s: &Settings) {
    println!(
        "\n## CPU backend on all {} threads, GB/s (batch = bytes per fingerprint_batch call)\n",
        cpu.threads()
    );
    print!("| algorithm | chunk |");
    for &b in &s.batches {
        print!(" {} |", size_label(b));
    }
    println!();
    println!("|---|---|{}", "---|".repeat(s.batches.len()));
    let mut cell = cells.iter();
    for algorithm in TABLE_ALGORITHMS {
        for size in CHUNK_SIZES {
            print!("| {algorithm} | {} |", size_label(size));
            for _ in &s.batches {
                match cell.next().copied() {
                    Some(v) if v.is_finite() => print!(" {v:.2} |"),
                    _ => print!(" - |"),
                }
            }
            println!();
        }
    }
}

/// Random batches of many counts and chunk sizes, every algorithm, GPU
/// against the CPU backend. Returns (batches, chunks) checked.
fn gpu_correctness(gpu: &GpuBackend, cpu: &CpuBackend, s: &Settings) -> (usize, usize) {
    let mut rng = rand::thread_rng();
    let edge = [0usize, 1, 55, 56, 63, 64, 65, 4096, 8192, 32768, 1 << 20];
    let (mut batches, mut total_chunks) = (0, 0);
    let (mut out, mut expected) = (Vec::new(), Vec::new());
    for case in 0..s.correctness_cases {
        let count = [1, 7, 128, 1000, 5000][case % 5];
        let max_len = [100, 4096, 9000, 70_000, 1 << 20][(case / 5) % 5];
        let data: Vec<Vec<u8>> = (0..count)
            .map(|_| random_bytes(rng.gen_range(0..=max_len)))
            .chain(edge.iter().map(|&n| random_bytes(n)))
            .collect();
        let chunks: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
        for algorithm in Algorithm::ALL {
            cpu.fingerprint_batch(algorithm, &chunks, &mut expected)
                .expect("cpu");
            gpu.fingerprint_batch(algorithm, &chunks, &mut out)
                .expect("gpu");
            assert_eq!(
                out, expected,
                "GPU disagrees with CPU: {algorithm}, case {case}"
            );
            batches += 1;
            total_chunks += chunks.len();
        }
    }
    (batches, total_chunks)
}

fn gpu_section(gpu: &GpuBackend, cpu: &CpuBackend, cpu_cells: &[f64], data: &[u8], s: &Settings) {
    let (batches, chunks) = gpu_correctness(gpu, cpu, s);
    println!(
        "\ncorrectness: {batches} random batches, {chunks} chunks, all four algorithms: GPU == CPU"
    );
    if let Some(failure) = gpu.failure() {
        println!("WARNING: the GPU failed and the CPU took over: {failure}");
    }
    let lane = gpu.device().layout.lane_bytes;
    let h2d = gpu.h2d_bandwidth(lane, 20).expect("h2d bandwidth") / 1e9;
    println!(
        "pinned host-to-device copy bandwidth: {h2d:.2} GB/s ({} copies)",
        size_label(lane)
    );
    let cells = table(gpu, data, s);
    println!(
        "\n## GPU backend end to end (pack, copy in, hash, copy out), GB/s; \
         [% of pinned H2D bandwidth, goal >= {:.0}%]; (x CPU backend)\n",
        GOAL * 100.0
    );
    print!("| algorithm | chunk |");
    for &b in &s.batches {
        print!(" {} |", size_label(b));
    }
    println!();
    println!("|---|---|{}", "---|".repeat(s.batches.len()));
    let mut i = 0;
    let mut met = 0;
    for algorithm in TABLE_ALGORITHMS {
        for size in CHUNK_SIZES {
            print!("| {algorithm} | {} |", size_label(size));
            for _ in &s.batches {
                if !cells[i].is_finite() {
                    print!(" - |");
                    i += 1;
                    continue;
                }
                let share = cells[i] / h2d;
                met += usize::from(share >= GOAL);
                print!(
                    " {:.2} [{:.0}%] (x{:.2}) |",
                    cells[i],
                    share * 100.0,
                    cells[i] / cpu_cells[i]
                );
                i += 1;
            }
            println!();
        }
    }
    println!(
        "\n{met} of {} cells reach {:.0}% of the pinned copy bandwidth; the default \
         backend sends batches under {} to the CPU.",
        cells.iter().filter(|c| c.is_finite()).count(),
        GOAL * 100.0,
        size_label(GPU_MIN_BATCH_BYTES)
    );
    // Packing into the pinned buffers on the caller's thread alone against
    // the CPU backend's threads (the default), on the large batches.
    println!("\n## Packing: one thread vs the CPU backend's threads, SHA-1, 4 KiB chunks, GB/s\n");
    println!("| batch | pack on 1 thread | pack on the pool (default) |");
    println!("|---|---|---|");
    for &batch in s.batches.iter().filter(|&&b| b >= 16 << 20) {
        let chunks: Vec<&[u8]> = data[..batch].chunks_exact(4 << 10).collect();
        gpu.set_parallel_pack(false);
        let alone = batch_gbps(gpu, Algorithm::Sha1, &chunks, s.reps);
        gpu.set_parallel_pack(true);
        let pooled = batch_gbps(gpu, Algorithm::Sha1, &chunks, s.reps);
        println!("| {} | {alone:.2} | {pooled:.2} |", size_label(batch));
    }
    println!("\n## Slices per lane (large batches are cut into lanes x this), SHA-1, 4 KiB chunks, GB/s\n");
    println!("| batch | 1 (default) | 2 | 4 | 8 |");
    println!("|---|---|---|---|---|");
    for &batch in s.batches.iter().filter(|&&b| b >= 16 << 20) {
        let chunks: Vec<&[u8]> = data[..batch].chunks_exact(4 << 10).collect();
        print!("| {} |", size_label(batch));
        for n in [1, 2, 4, 8] {
            gpu.set_slices_per_lane(n);
            print!(
                " {:.2} |",
                batch_gbps(gpu, Algorithm::Sha1, &chunks, s.reps)
            );
        }
        println!();
        gpu.set_slices_per_lane(1);
    }
    let stats = gpu.stats();
    println!(
        "GPU stats: {} batches, {} slices, {} pool waits, {} device failures",
        stats.offloaded_batches, stats.slices, stats.pool_waits, stats.device_failures
    );
}

fn main() {
    let s = settings();
    println!("# GPU fingerprint benchmark");
    let cpu = CpuBackend::new(None).expect("cpu backend");
    let gpu = GpuBackend::with_config(GpuConfig {
        min_batch_bytes: 0,
        measure_crossover: false,
        ..GpuConfig::default()
    });
    match &gpu {
        Ok(gpu) => println!("GPU: {}", gpu.describe()),
        Err(e) => {
            println!();
            println!("!!! GPU ABSENT: {e}");
            println!("!!! Running the CPU side only; GPU throughput NOT measured.");
        }
    }
    single_thread_section(&s);
    let data = random_bytes(*s.batches.iter().max().unwrap());
    let cpu_cells = table(&cpu, &data, &s);
    print_cpu_table(&cpu, &cpu_cells, &s);
    match &gpu {
        Ok(gpu) => {
            gpu_section(gpu, &cpu, &cpu_cells, &data, &s);
            crossover_section();
        }
        Err(e) => println!("\n!!! GPU ABSENT ({e}): no GPU table, no copy bandwidth."),
    }
}

/// The crossover the default backend measures at start (SHA-256 batches of
/// 4 KiB chunks, GPU end to end against all CPU threads), and how long the
/// measurement took.
fn crossover_section() {
    let started = Instant::now();
    match GpuBackend::with_config(GpuConfig::default()) {
        Ok(gpu) => {
            let took = started.elapsed().as_secs_f64();
            let min = gpu.min_batch_bytes();
            let shown = if min == usize::MAX {
                "never (the GPU does not win at 64 MiB)".to_string()
            } else {
                size_label(min)
            };
            println!(
                "\ncrossover measured at start: batches from {shown} go to the GPU \
                 (start-up with the measurement: {took:.2} s)"
            );
        }
        Err(e) => println!("\ncrossover: the default backend did not start: {e}"),
    }
}
