//! Benchmark of the codec wrapper against its peer, Intel ISA-L called
//! directly: encode with `Codec::encode` vs `ec_encode_data`, and decode of 1
//! and 2 lost data shards with `Codec::reconstruct` vs `ec_encode_data` on
//! precomputed decode tables, for RS(4,2) and RS(6,3) at 32 KiB and 1 MiB
//! shards. Then the block checksum: `codec::crc32c` (ISA-L's
//! `crc32_iscsi`, in the "wrapper" column) against the `crc32c` crate (in
//! the "raw" column) in 4 KiB and 32 KiB blocks, over 8 MiB (in cache)
//! and over 64 MiB (out of it).
//!
//! Invariants: both sides run the same code over the same buffers; the raw
//! side builds its tables and pointer arrays before its timed loop, so the
//! ratio shows exactly what the wrapper adds (checks, pointer arrays, the
//! decode-table cache). Sides alternate A B A B for `PAIRS` pairs after a
//! warm-up; throughput is bytes of source shards read (k x shard) per second;
//! the reported ratio is wrapper GB/s / raw GB/s per pair, median with min and
//! max. Run with `cargo bench --bench codec`; without cargo's `--bench` flag (as
//! under `cargo test --benches`) it runs one short pair per case as a smoke
//! test.

use ecdedup_core::codec::{raw, Codec};
use std::hint::black_box;
use std::os::raw::c_int;
use std::time::{Duration, Instant};

struct Settings {
    pairs: usize,
    sample: Duration,
}

/// Shards of `len` bytes with arbitrary but fixed contents.
fn shards(count: usize, len: usize, seed: u64) -> Vec<Vec<u8>> {
    let mut x = seed | 1;
    (0..count)
        .map(|_| {
            (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect()
        })
        .collect()
}

/// The ISA-L Cauchy generator, `(k + m) x k`, built by ISA-L itself.
fn raw_generator(k: usize, m: usize) -> Vec<u8> {
    let mut matrix = vec![0u8; (k + m) * k];
    // SAFETY: the buffer holds (k + m) * k bytes.
    unsafe { raw::gf_gen_cauchy1_matrix(matrix.as_mut_ptr(), (k + m) as c_int, k as c_int) };
    matrix
}

fn raw_tables(k: usize, rows: usize, coefficients: &mut [u8]) -> Vec<u8> {
    assert_eq!(coefficients.len(), k * rows);
    let mut tables = vec![0u8; 32 * k * rows];
    // SAFETY: coefficients are rows x k, tables 32 * k * rows bytes.
    unsafe {
        raw::ec_init_tables(
            k as c_int,
            rows as c_int,
            coefficients.as_mut_ptr(),
            tables.as_mut_ptr(),
        )
    };
    tables
}

/// Raw `ec_encode_data` from `srcs` into `dsts`, `iters` times; pointer arrays
/// are built once, outside the loop, as a hand-tuned caller would.
fn raw_encode_loop(tables: &[u8], srcs: &[&[u8]], dsts: &mut [&mut [u8]], iters: u64) {
    let len = srcs[0].len();
    assert!(srcs.iter().all(|s| s.len() == len) && dsts.iter().all(|d| d.len() == len));
    assert_eq!(tables.len(), 32 * srcs.len() * dsts.len());
    // ISA-L only reads its sources; `*mut` is C's missing const.
    let mut src_ptrs: Vec<*mut u8> = srcs.iter().map(|s| s.as_ptr().cast_mut()).collect();
    let mut dst_ptrs: Vec<*mut u8> = dsts.iter_mut().map(|d| d.as_mut_ptr()).collect();
    for _ in 0..iters {
        // SAFETY: pointers to distinct buffers of `len` bytes, tables sized as asserted.
        unsafe {
            raw::ec_encode_data(
                len as c_int,
                src_ptrs.len() as c_int,
                dst_ptrs.len() as c_int,
                tables.as_ptr().cast_mut(),
                black_box(src_ptrs.as_mut_ptr()),
                black_box(dst_ptrs.as_mut_ptr()),
            )
        };
    }
}

#[derive(Clone, Copy)]
enum Side {
    Wrapper,
    Raw,
}

/// Seconds for `iters` operations on one side.
fn time<S>(run: &dyn Fn(Side, u64, &mut S), state: &mut S, side: Side, iters: u64) -> f64 {
    let start = Instant::now();
    run(side, iters, state);
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

/// Alternates wrapper and raw (A B A B), prints the median GB/s of each and
/// the wrapper/raw ratio of each pair: median, min, max.
/// `run(side, iters, state)` does `iters` operations on `state`, the buffers
/// both sides share.
fn compare<S>(
    label: &str,
    bytes_per_op: usize,
    settings: &Settings,
    state: &mut S,
    run: &dyn Fn(Side, u64, &mut S),
) {
    // Warm up both (caches, the decode-table cache, page faults), then size a
    // sample to about `settings.sample`.
    time(run, state, Side::Wrapper, 3);
    time(run, state, Side::Raw, 3);
    let once = time(run, state, Side::Raw, 8) / 8.0;
    let iters = ((settings.sample.as_secs_f64() / once) as u64).max(1);
    let gbps = |secs: f64| (bytes_per_op as f64 * iters as f64) / secs / 1e9;
    let (mut ours, mut theirs, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..settings.pairs {
        let a = gbps(time(run, state, Side::Wrapper, iters));
        let b = gbps(time(run, state, Side::Raw, iters));
        ours.push(a);
        theirs.push(b);
        ratios.push(a / b);
    }
    let (min, max) = ratios
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), &r| (lo.min(r), hi.max(r)));
    println!(
        "{label:<30} wrapper {:>6.2} GB/s  raw {:>6.2} GB/s  wrapper/raw median {:.3} (min {:.3}, max {:.3}; {} pairs x {iters} ops)",
        median(&mut ours),
        median(&mut theirs),
        median(&mut ratios),
        min,
        max,
        settings.pairs,
    );
}

fn bench_encode(k: usize, m: usize, len: usize, size: &str, settings: &Settings) {
    let codec = Codec::new(k, m).unwrap();
    let data = shards(k, len, 1);
    let mut generator = raw_generator(k, m);
    let tables = raw_tables(k, m, &mut generator[k * k..]);
    let data_refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    let mut expected = vec![vec![0u8; len]; m];
    codec.encode(
        &data_refs,
        &mut expected
            .iter_mut()
            .map(Vec::as_mut_slice)
            .collect::<Vec<_>>(),
    );

    // Both sides read the same data and write the same parity buffers.
    let mut parity = vec![vec![0u8; len]; m];
    let run = |side: Side, iters: u64, parity: &mut Vec<Vec<u8>>| {
        let mut dsts: Vec<&mut [u8]> = parity.iter_mut().map(Vec::as_mut_slice).collect();
        match side {
            Side::Wrapper => {
                for _ in 0..iters {
                    codec.encode(black_box(&data_refs), black_box(&mut dsts));
                }
            }
            Side::Raw => raw_encode_loop(&tables, &data_refs, &mut dsts, iters),
        }
    };
    let label = format!("encode RS({k},{m}) {size}");
    compare(&label, k * len, settings, &mut parity, &run);
    for side in [Side::Wrapper, Side::Raw] {
        parity.iter_mut().for_each(|p| p.fill(0));
        run(side, 1, &mut parity);
        assert!(parity == expected, "{label}: a side encoded wrongly");
    }
}

fn bench_decode(k: usize, m: usize, len: usize, size: &str, lost: &[usize], settings: &Settings) {
    let codec = Codec::new(k, m).unwrap();
    let total = k + m;
    let mut original = shards(k, len, 2);
    original.extend(vec![vec![0u8; len]; m]);
    {
        let (data, parity) = original.split_at_mut(k);
        let data: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
        codec.encode(
            &data,
            &mut parity.iter_mut().map(Vec::as_mut_slice).collect::<Vec<_>>(),
        );
    }
    let present: Vec<bool> = (0..total).map(|i| !lost.contains(&i)).collect();

    // Raw peer: invert the rows of the first k present shards once, then
    // decode with one ec_encode_data call per stripe.
    let generator = raw_generator(k, m);
    let chosen: Vec<usize> = (0..total).filter(|&i| present[i]).take(k).collect();
    let mut sub: Vec<u8> = chosen
        .iter()
        .flat_map(|&r| generator[r * k..(r + 1) * k].to_vec())
        .collect();
    let mut inverse = vec![0u8; k * k];
    // SAFETY: both buffers are k x k.
    let rc = unsafe { raw::gf_invert_matrix(sub.as_mut_ptr(), inverse.as_mut_ptr(), k as c_int) };
    assert_eq!(rc, 0, "singular decode matrix");
    let mut coefficients: Vec<u8> = lost
        .iter()
        .flat_map(|&t| {
            let row = &generator[t * k..(t + 1) * k];
            let inverse = &inverse;
            (0..k).map(move |j| {
                // SAFETY: a pure function of two bytes.
                (0..k).fold(0u8, |acc, i| {
                    acc ^ unsafe { raw::gf_mul(row[i], inverse[i * k + j]) }
                })
            })
        })
        .collect();
    let tables = raw_tables(k, lost.len(), &mut coefficients);

    // Both sides decode from and into the same buffers.
    let mut stripe = original.clone();
    let run = |side: Side, iters: u64, stripe: &mut Vec<Vec<u8>>| match side {
        Side::Wrapper => {
            let mut shards: Vec<&mut [u8]> = stripe.iter_mut().map(Vec::as_mut_slice).collect();
            for _ in 0..iters {
                codec
                    .reconstruct(black_box(&mut shards), black_box(&present))
                    .unwrap();
            }
        }
        Side::Raw => {
            let mut srcs: Vec<&[u8]> = Vec::new();
            let mut dsts: Vec<&mut [u8]> = Vec::new();
            for (i, shard) in stripe.iter_mut().enumerate() {
                if chosen.contains(&i) {
                    srcs.push(shard);
                } else if lost.contains(&i) {
                    dsts.push(shard);
                }
            }
            raw_encode_loop(&tables, &srcs, &mut dsts, iters);
        }
    };
    let label = format!("decode RS({k},{m}) {size} {} lost", lost.len());
    compare(&label, k * len, settings, &mut stripe, &run);
    for side in [Side::Wrapper, Side::Raw] {
        lost.iter().for_each(|&i| stripe[i].fill(0));
        run(side, 1, &mut stripe);
        assert!(stripe == original, "{label}: a side did not reconstruct");
    }
}

/// CRC-32C of every `block` bytes of `total` bytes: `codec::crc32c`
/// (ISA-L) as the "wrapper" side, the `crc32c` crate as the "raw" one.
fn bench_crc(block: usize, size: &str, total: usize, settings: &Settings) {
    let data = shards(1, total, 7).remove(0);
    for c in data.chunks(block).take(4) {
        assert_eq!(ecdedup_core::codec::crc32c(c), crc32c::crc32c(c));
    }
    let label = format!("crc32c, {size} of {} MiB", total >> 20);
    compare(&label, data.len(), settings, &mut (), &|side, iters, _| {
        for _ in 0..iters {
            let mut acc = 0u32;
            for c in data.chunks(block) {
                acc ^= match side {
                    Side::Wrapper => ecdedup_core::codec::crc32c(black_box(c)),
                    Side::Raw => crc32c::crc32c(black_box(c)),
                };
            }
            black_box(acc);
        }
    });
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let settings = if full {
        Settings {
            pairs: 7,
            sample: Duration::from_millis(40),
        }
    } else {
        Settings {
            pairs: 1,
            sample: Duration::from_millis(1),
        }
    };
    println!("codec: Codec (wrapper) vs ISA-L ec_encode_data (raw); GB/s of source shards read (k x shard)");
    for (k, m) in [(4, 2), (6, 3)] {
        for (len, size) in [(32 << 10, "32 KiB"), (1 << 20, "1 MiB")] {
            bench_encode(k, m, len, size, &settings);
            bench_decode(k, m, len, size, &[0], &settings);
            bench_decode(k, m, len, size, &[0, 1], &settings);
        }
    }
    println!("block checksums: codec::crc32c (ISA-L crc32_iscsi) as wrapper vs the crc32c crate as raw; GB/s checksummed");
    for total in [8usize << 20, 64 << 20] {
        for (block, size) in [(4 << 10, "4 KiB"), (32 << 10, "32 KiB")] {
            bench_crc(block, size, total, &settings);
        }
    }
}
