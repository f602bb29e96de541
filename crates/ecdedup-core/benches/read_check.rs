//! What checking every block costs a read from the page cache: the bound
//! behind the archive's warm sealed-read ratio (docs/benchmarks.md,
//! "Reads"). A sealed read is one `pread` of up to 8 MiB of a sub-file and
//! a CRC-32C of each 8 KiB block in it; plain RS is the `pread` alone. This
//! program writes a 256 MiB file (left in the page cache), then for
//! `ROUNDS` rounds reads it in 8 MiB requests, timing the reads, and takes
//! the CRC-32C of every 8 KiB block of the last request `REPEATS` times
//! (the bytes in the CPU cache, as right after a read), timing that. It
//! prints both rates per round, and the ratio a checked read can reach at
//! best, 1 / (1 + read rate / CRC rate), median with min and max.
//!
//!   cargo bench -p ecdedup-core --bench read_check

use std::os::unix::fs::FileExt;
use std::time::Instant;

const FILE_BYTES: usize = 256 << 20;
const REQUEST_BYTES: usize = 8 << 20;
const BLOCK_BYTES: usize = 8 << 10;
const ROUNDS: usize = 7;
const REPEATS: usize = 32;

fn gb_s(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / secs / 1e9
}

fn median_min_max(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn main() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("f");
    let data: Vec<u8> = (0..FILE_BYTES).map(|i| (i * 7 + i / 8191) as u8).collect();
    std::fs::write(&path, &data).expect("write the file");
    let file = std::fs::File::open(&path).expect("open the file");
    let mut buf = vec![0u8; REQUEST_BYTES];
    let mut bounds = Vec::new();
    println!(
        "| round | pread GB/s | crc32c GB/s | checked / plain at best |\n|---:|---:|---:|---:|"
    );
    for round in 0..ROUNDS {
        let t = Instant::now();
        for offset in (0..FILE_BYTES).step_by(REQUEST_BYTES) {
            file.read_exact_at(&mut buf, offset as u64).expect("read");
        }
        let read = gb_s(FILE_BYTES, t.elapsed().as_secs_f64());
        let t = Instant::now();
        let mut x = 0u32;
        for _ in 0..REPEATS {
            for block in buf.chunks(BLOCK_BYTES) {
                x ^= crc32c::crc32c(block);
            }
        }
        let crc = gb_s(REPEATS * REQUEST_BYTES, t.elapsed().as_secs_f64());
        std::hint::black_box(x);
        let bound = 1.0 / (1.0 + read / crc);
        bounds.push(bound);
        println!("| {} | {read:.2} | {crc:.2} | {bound:.2} |", round + 1);
    }
    let (m, lo, hi) = median_min_max(bounds);
    println!("\nchecked read at best {m:.2} ({lo:.2}-{hi:.2}) of plain (median, min-max over {ROUNDS} rounds)");
}
