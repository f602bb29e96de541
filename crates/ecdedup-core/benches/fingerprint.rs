//! Benchmark of fingerprinting throughput: a single-threaded loop of
//! `Algorithm::fingerprint` (side A) against `CpuBackend::fingerprint_batch`
//! on one thread per core (side B), for every algorithm at 4 KiB, 8 KiB and
//! 32 KiB chunks.
//!
//! Invariants: both sides hash the same batch (64 MiB of fixed pseudo-random
//! data cut into chunks) into a reused output vector, and B's output is
//! checked equal to A's before timing. Sides alternate A B A B for `PAIRS`
//! pairs after a warm-up pair; throughput is bytes hashed per second (GB/s,
//! 10^9); the reported ratio is B GB/s / A GB/s per pair, median with min and
//! max. Run with `cargo bench --bench fingerprint`; without cargo's `--bench`
//! flag (as under `cargo test --benches`) it runs one short pair per case on
//! 1 MiB as a smoke test.

use ecdedup_core::fingerprint::{Algorithm, CpuBackend, Fingerprint, FingerprintBackend};
use std::hint::black_box;
use std::time::Instant;

const PAIRS: usize = 7;
const DATA_BYTES: usize = 64 << 20;
const CHUNK_SIZES: [(usize, &str); 3] =
    [(4 << 10, "4 KiB"), (8 << 10, "8 KiB"), (32 << 10, "32 KiB")];

struct Settings {
    pairs: usize,
    data_bytes: usize,
}

/// `len` bytes of fixed pseudo-random data (xorshift64).
fn random_data(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut data = Vec::with_capacity(len + 8);
    while data.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        data.extend_from_slice(&x.to_le_bytes());
    }
    data.truncate(len);
    data
}

/// Side A: one thread, one chunk after another. Returns seconds taken.
fn single_thread(algorithm: Algorithm, chunks: &[&[u8]], out: &mut Vec<Fingerprint>) -> f64 {
    let start = Instant::now();
    out.clear();
    out.extend(chunks.iter().map(|c| algorithm.fingerprint(black_box(c))));
    black_box(&out);
    start.elapsed().as_secs_f64()
}

/// Side B: the backend on all cores. Returns seconds taken.
fn backend(
    backend: &CpuBackend,
    algorithm: Algorithm,
    chunks: &[&[u8]],
    out: &mut Vec<Fingerprint>,
) -> f64 {
    let start = Instant::now();
    backend
        .fingerprint_batch(algorithm, black_box(chunks), out)
        .expect("cpu backend");
    black_box(&out);
    start.elapsed().as_secs_f64()
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

fn cpu_features() -> String {
    #[cfg(target_arch = "x86_64")]
    {
        let mut found = Vec::new();
        if std::arch::is_x86_feature_detected!("sha") {
            found.push("sha-ni");
        }
        if std::arch::is_x86_feature_detected!("sse4.2") {
            found.push("sse4.2");
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            found.push("avx2");
        }
        if std::arch::is_x86_feature_detected!("avx512f") {
            found.push("avx512f");
        }
        found.join(", ")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        String::from("(not x86-64)")
    }
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let settings = if full {
        Settings {
            pairs: PAIRS,
            data_bytes: DATA_BYTES,
        }
    } else {
        Settings {
            pairs: 1,
            data_bytes: 1 << 20,
        }
    };
    let cpu = CpuBackend::new(None).expect("cpu backend");
    let data = random_data(settings.data_bytes);
    println!(
        "fingerprint: single-threaded loop (A) vs CpuBackend on {} threads (B), {} MiB batch, \
         {} A/B pairs; CPU features: {}",
        cpu.threads(),
        settings.data_bytes >> 20,
        settings.pairs,
        cpu_features()
    );
    println!();
    println!(
        "| algorithm | chunk | A: 1 thread GB/s | B: CpuBackend GB/s | B/A median (min–max) |"
    );
    println!("|---|---|---:|---:|---|");
    let mut out_a = Vec::new();
    let mut out_b = Vec::new();
    for algorithm in Algorithm::ALL {
        for (size, label) in CHUNK_SIZES {
            let chunks: Vec<&[u8]> = data.chunks(size).collect();
            let bytes = data.len() as f64;
            // Warm-up pair, and the check that both sides agree.
            single_thread(algorithm, &chunks, &mut out_a);
            backend(&cpu, algorithm, &chunks, &mut out_b);
            assert_eq!(out_a, out_b, "{algorithm} {label}: backend disagrees");
            let (mut a_rates, mut b_rates, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..settings.pairs {
                let a = bytes / single_thread(algorithm, &chunks, &mut out_a) / 1e9;
                let b = bytes / backend(&cpu, algorithm, &chunks, &mut out_b) / 1e9;
                a_rates.push(a);
                b_rates.push(b);
                ratios.push(b / a);
            }
            let (min, max) = ratios
                .iter()
                .fold((f64::MAX, f64::MIN), |(lo, hi), &r| (lo.min(r), hi.max(r)));
            println!(
                "| {algorithm} | {label} | {:.2} | {:.2} | {:.2} ({min:.2}–{max:.2}) |",
                median(&mut a_rates),
                median(&mut b_rates),
                median(&mut ratios),
            );
        }
    }
}
