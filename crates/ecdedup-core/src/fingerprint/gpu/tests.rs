//! Tests of the GPU backend that need no GPU: the kernel's source compiled
//! as C (hash_cpu.c) against RustCrypto on fresh random inputs of many sizes,
//! the packing layout, the pipeline and its pool (slicing, oversize chunks,
//! backpressure, failure fallback) through `KernelOnCpuBackend`, pool sizing,
//! the backend choice, and the "no CUDA device" error value. Tests that need
//! a device run where `GpuBackend::new()` succeeds and otherwise print
//! "SKIPPED: no CUDA device" and return.
//!
//! Invariants: random inputs come from a seed drawn per test and printed, so
//! a failure can be replayed; every comparison is against
//! `Algorithm::fingerprint` (RustCrypto), never against the kernel itself.

use super::kernel_cpu::run_kernel_c;
use super::pipeline::{
    algorithm_code, pack, pack_on, packed_bytes, slice_len, ALIGN, DIGEST_STRIDE,
};
use super::*;
use crate::fingerprint::{Algorithm, CpuBackend, Fingerprint, FingerprintBackend};
use proptest::prelude::*;
use rand::{rngs::StdRng, Rng, RngCore, SeedableRng};
use std::sync::mpsc;
use std::time::Duration;

const KERNEL_ALGORITHMS: [Algorithm; 3] = [Algorithm::Sha1, Algorithm::Sha256, Algorithm::Md5];

/// Sizes around every padding boundary of a 64-byte block, the chunk sizes
/// of the issue, and a few odd ones.
const EDGE_SIZES: &[usize] = &[
    0, 1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 32, 33, 55, 56, 57, 59, 60, 61, 62, 63, 64, 65, 100,
    111, 112, 119, 120, 127, 128, 129, 191, 192, 193, 1000, 4095, 4096, 4097, 8191, 8192, 8193,
    32768, 65536, 65549, 131072,
];

fn rng(test: &str) -> StdRng {
    let seed: u64 = rand::random();
    eprintln!("{test}: seed {seed}");
    StdRng::seed_from_u64(seed)
}

fn random_chunk(rng: &mut StdRng, len: usize) -> Vec<u8> {
    let mut data = vec![0u8; len];
    rng.fill_bytes(&mut data);
    data
}

fn reference(algorithm: Algorithm, chunks: &[&[u8]]) -> Vec<Fingerprint> {
    chunks.iter().map(|c| algorithm.fingerprint(c)).collect()
}

/// Packs `chunks` into one buffer and runs the C kernel over it, as one
/// GPU slice would be.
fn kernel_c(algorithm: Algorithm, chunks: &[&[u8]]) -> Vec<Fingerprint> {
    let bytes: usize = chunks.iter().map(|c| packed_bytes(c.len())).sum();
    let mut input = vec![0u64; bytes.div_ceil(8)];
    // Garbage in the padding, to show the kernel never hashes it.
    for word in input.iter_mut() {
        *word = 0xdead_beef_a5a5_5a5a;
    }
    // SAFETY: a u64 buffer viewed as bytes.
    let view =
        unsafe { std::slice::from_raw_parts_mut(input.as_mut_ptr().cast::<u8>(), input.len() * 8) };
    assert_eq!(pack(chunks, view), bytes);
    let mut out = vec![0u8; chunks.len() * DIGEST_STRIDE];
    run_kernel_c(
        algorithm_code(algorithm).unwrap(),
        &input,
        chunks.len(),
        &mut out,
    );
    out.chunks_exact(DIGEST_STRIDE)
        .map(|d| Fingerprint::from_slice(&d[..algorithm.digest_bytes()]).unwrap())
        .collect()
}

#[test]
fn kernel_as_c_matches_known_answers() {
    let million = vec![b'a'; 1_000_000];
    let abc448: &[u8] = b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    let chunks: [&[u8]; 4] = [b"", b"abc", abc448, &million];
    let hex = |a| {
        kernel_c(a, &chunks)
            .iter()
            .map(|f| f.to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        hex(Algorithm::Sha1),
        [
            "da39a3ee5e6b4b0d3255bfef95601890afd80709",
            "a9993e364706816aba3e25717850c26c9cd0d89d",
            "84983e441c3bd26ebaae4aa1f95129e5e54670f1",
            "34aa973cd4c4daa4f61eeb2bdbad27316534016f",
        ]
    );
    assert_eq!(
        hex(Algorithm::Sha256),
        [
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1",
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0",
        ]
    );
    let md5 = hex(Algorithm::Md5);
    assert_eq!(md5[0], "d41d8cd98f00b204e9800998ecf8427e");
    assert_eq!(md5[1], "900150983cd24fb0d6963f7d28e17f72");
    assert_eq!(md5[3], "7707d6ae4e027c70eea2a935c2296f21");
}

#[test]
fn kernel_as_c_matches_rustcrypto_on_edge_and_random_sizes() {
    let mut rng = rng("kernel_as_c_matches_rustcrypto_on_edge_and_random_sizes");
    let mut sizes = EDGE_SIZES.to_vec();
    sizes.extend((0..64).map(|_| rng.gen_range(0..70_000)));
    sizes.extend((0..4).map(|_| rng.gen_range(70_000..(1 << 20) + 100)));
    let data: Vec<Vec<u8>> = sizes.iter().map(|&n| random_chunk(&mut rng, n)).collect();
    let chunks: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
    for algorithm in KERNEL_ALGORITHMS {
        // All in one slice, and each chunk alone at the buffer's start.
        assert_eq!(
            kernel_c(algorithm, &chunks),
            reference(algorithm, &chunks),
            "{algorithm}"
        );
        for chunk in &chunks {
            assert_eq!(
                kernel_c(algorithm, &[chunk]),
                reference(algorithm, &[chunk]),
                "{algorithm}, {} bytes",
                chunk.len()
            );
        }
    }
}

#[test]
fn kernel_as_c_handles_more_chunks_than_one_block_of_threads() {
    // 300 chunks: three blocks of 128 threads, the last one part idle.
    let mut rng = rng("kernel_as_c_handles_more_chunks_than_one_block_of_threads");
    let data: Vec<Vec<u8>> = (0..300)
        .map(|_| {
            let n = rng.gen_range(0..200);
            random_chunk(&mut rng, n)
        })
        .collect();
    let chunks: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
    for algorithm in KERNEL_ALGORITHMS {
        assert_eq!(kernel_c(algorithm, &chunks), reference(algorithm, &chunks));
    }
}

#[test]
fn pack_lays_out_metadata_then_aligned_chunks() {
    let chunks: [&[u8]; 3] = [b"abc", b"", &[7u8; 20]];
    let bytes: usize = chunks.iter().map(|c| packed_bytes(c.len())).sum();
    // "abc" pads to 16 bytes, the empty chunk takes none, 20 bytes pad to 32.
    assert_eq!(bytes, 3 * 16 + 16 + 32);
    let mut input = vec![0xffu8; bytes];
    assert_eq!(pack(&chunks, &mut input), bytes);
    let entry = |i: usize, k: usize| {
        u64::from_le_bytes(
            input[i * 16 + k * 8..i * 16 + k * 8 + 8]
                .try_into()
                .unwrap(),
        )
    };
    assert_eq!((entry(0, 0), entry(0, 1)), (48, 3));
    assert_eq!((entry(1, 0), entry(1, 1)), (64, 0));
    assert_eq!((entry(2, 0), entry(2, 1)), (64, 20));
    assert_eq!(&input[48..51], b"abc");
    assert_eq!(&input[64..84], &[7u8; 20]);
    for i in 0..3 {
        assert_eq!(entry(i, 0) % ALIGN as u64, 0);
    }
}

#[test]
fn slices_stop_at_capacity_count_or_target() {
    let c = [0u8; 100]; // packs into 16 + 112 = 128 bytes
    let chunks: Vec<&[u8]> = vec![&c; 10];
    assert_eq!(slice_len(&chunks, 1 << 20, 1000, 1 << 20), (10, 1280));
    assert_eq!(slice_len(&chunks, 1000, 1000, 1 << 20), (7, 896));
    assert_eq!(slice_len(&chunks, 1 << 20, 3, 1 << 20), (3, 384));
    assert_eq!(slice_len(&chunks, 1 << 20, 1000, 300), (3, 384));
}

/// A backend over a small pool, so batches cut into many slices and some
/// chunks do not fit a lane at all.
fn small_kernel_backend(lanes: usize, lane_bytes: usize) -> KernelOnCpuBackend {
    KernelOnCpuBackend::new(PoolLayout::new(lanes, lane_bytes)).unwrap()
}

/// Every lane is back in the pool (none leaked or still held).
fn assert_all_lanes_free(backend: &KernelOnCpuBackend) {
    let pool = backend.pool();
    let lanes: Vec<_> = std::iter::from_fn(|| pool.try_acquire()).collect();
    assert_eq!(lanes.len(), pool.lanes());
    lanes.into_iter().for_each(|l| pool.release(l));
}

fn random_batch(rng: &mut StdRng, count: usize, max_len: usize) -> Vec<Vec<u8>> {
    (0..count)
        .map(|_| {
            let n = rng.gen_range(0..=max_len);
            random_chunk(rng, n)
        })
        .collect()
}

#[test]
fn kernel_on_cpu_backend_matches_cpu_backend() {
    let mut rng = rng("kernel_on_cpu_backend_matches_cpu_backend");
    let cpu = CpuBackend::new(Some(2)).unwrap();
    let backends = [
        small_kernel_backend(1, 64 << 10),
        small_kernel_backend(3, 40 << 10),
        small_kernel_backend(4, 4 << 20),
    ];
    let mut out = Vec::new();
    let mut expected = Vec::new();
    for (count, max_len) in [(1, 0), (1, 5000), (37, 4096), (200, 9000), (40, 100_000)] {
        let data = random_batch(&mut rng, count, max_len);
        let chunks: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
        for algorithm in Algorithm::ALL {
            cpu.fingerprint_batch(algorithm, &chunks, &mut expected)
                .unwrap();
            for backend in &backends {
                backend
                    .fingerprint_batch(algorithm, &chunks, &mut out)
                    .unwrap();
                assert_eq!(out, expected, "{algorithm}, {count} chunks");
            }
        }
    }
    for backend in &backends {
        let stats = backend.stats();
        assert!(stats.offloaded_batches > 0 && stats.slices >= stats.offloaded_batches);
        // BLAKE3 and CRC-32C batches went to the CPU backend.
        assert_eq!(stats.delegated_batches, 10);
        assert_all_lanes_free(backend);
    }
    // The one-lane, 64 KiB pool saw chunks too big for a lane and cut
    // batches into many slices.
    assert!(backends[0].stats().slices > 20);
}

#[test]
fn equal_chunk_batches_of_the_issue_sizes_match() {
    let mut rng = rng("equal_chunk_batches_of_the_issue_sizes_match");
    let backend = small_kernel_backend(4, 4 << 20);
    let mut out = Vec::new();
    for size in [4 << 10, 8 << 10, 32 << 10, 1 << 20] {
        let data: Vec<Vec<u8>> = (0..(8 << 20) / size)
            .map(|_| random_chunk(&mut rng, size))
            .collect();
        let chunks: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
        for algorithm in KERNEL_ALGORITHMS {
            backend
                .fingerprint_batch(algorithm, &chunks, &mut out)
                .unwrap();
            assert_eq!(out, reference(algorithm, &chunks), "{algorithm} {size}");
        }
    }
    // 8 MiB over 4 lanes: at least one slice per lane.
    assert!(backend.stats().slices >= 4 * 12);
}

#[test]
fn batch_output_reuses_and_replaces_out() {
    let backend = small_kernel_backend(2, 1 << 20);
    let mut out = vec![Algorithm::Md5.fingerprint(b"stale"); 50];
    let chunks: [&[u8]; 2] = [b"one", b"two"];
    backend
        .fingerprint_batch(Algorithm::Sha1, &chunks, &mut out)
        .unwrap();
    assert_eq!(out, reference(Algorithm::Sha1, &chunks));
    backend
        .fingerprint_batch(Algorithm::Sha1, &[], &mut out)
        .unwrap();
    assert!(out.is_empty());
}

/// A lane that hashes with the kernel as C, then corrupts one digest byte:
/// what a kernel miscompiled for a device would look like.
struct WrongDigestLane {
    inner: super::kernel_cpu::CpuLane,
    out: Vec<u8>,
}

impl super::pipeline::Lane for WrongDigestLane {
    fn capacity(&self) -> usize {
        self.inner.capacity()
    }
    fn max_chunks(&self) -> usize {
        self.inner.max_chunks()
    }
    fn input(&mut self) -> Result<&mut [u8], String> {
        self.inner.input()
    }
    fn launch(&mut self, code: u32, count: usize, bytes: usize) -> Result<(), String> {
        self.inner.launch(code, count, bytes)
    }
    fn wait(&mut self) -> Result<&[u8], String> {
        self.out.clear();
        self.out.extend_from_slice(self.inner.wait()?);
        let last = self.out.len() - DIGEST_STRIDE;
        self.out[last] ^= 1;
        Ok(&self.out)
    }
}

#[test]
fn start_up_self_test_accepts_the_kernel_and_refuses_wrong_digests() {
    let layout = PoolLayout::new(2, 64 << 10);
    let mut good: Vec<_> = (0..2)
        .map(|_| super::kernel_cpu::CpuLane::new(&layout, None))
        .collect();
    assert_eq!(super::pipeline::self_test(&mut good), Ok(()));

    let mut bad: Vec<_> = (0..2)
        .map(|_| WrongDigestLane {
            inner: super::kernel_cpu::CpuLane::new(&layout, None),
            out: Vec::new(),
        })
        .collect();
    let err = super::pipeline::self_test(&mut bad).unwrap_err();
    assert!(
        err.contains("self-test failed: lane 0 computed a wrong sha1 digest of a 9001-byte chunk"),
        "{err}"
    );
}

#[test]
fn start_up_self_test_reports_a_failing_launch() {
    let layout = PoolLayout::new(1, 64 << 10);
    let left = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(1));
    let mut lanes = vec![super::kernel_cpu::CpuLane::new(&layout, Some(left))];
    let err = super::pipeline::self_test(&mut lanes).unwrap_err();
    assert!(err.contains("injected lane failure"), "{err}");
}

#[test]
fn a_lane_failure_falls_back_to_the_cpu_for_good() {
    let mut rng = rng("a_lane_failure_falls_back_to_the_cpu_for_good");
    let layout = PoolLayout::new(2, 64 << 10);
    let backend = KernelOnCpuBackend::failing_at(layout, 3).unwrap();
    let data = random_batch(&mut rng, 100, 8000);
    let chunks: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
    let mut out = Vec::new();
    backend
        .fingerprint_batch(Algorithm::Sha256, &chunks, &mut out)
        .unwrap();
    assert_eq!(out, reference(Algorithm::Sha256, &chunks));
    let stats = backend.stats();
    assert_eq!(stats.device_failures, 1);
    assert_eq!(stats.offloaded_batches, 0);
    assert_eq!(stats.delegated_batches, 1);
    assert!(backend.failure().unwrap().contains("injected lane failure"));
    // Later batches go straight to the CPU; every lane is back in the pool.
    backend
        .fingerprint_batch(Algorithm::Md5, &chunks, &mut out)
        .unwrap();
    assert_eq!(out, reference(Algorithm::Md5, &chunks));
    assert_eq!(backend.stats().delegated_batches, 2);
    assert_all_lanes_free(&backend);
}

#[test]
fn callers_wait_for_a_free_lane() {
    let backend = Arc::new(small_kernel_backend(1, 1 << 20));
    let held = backend.pool().acquire();
    let (done_tx, done_rx) = mpsc::channel();
    let worker = {
        let backend = Arc::clone(&backend);
        std::thread::spawn(move || {
            let chunks: [&[u8]; 3] = [b"a", b"b", b"c"];
            let mut out = Vec::new();
            backend
                .fingerprint_batch(Algorithm::Sha1, &chunks, &mut out)
                .unwrap();
            done_tx.send(()).unwrap();
            out
        })
    };
    // The only lane is held: the caller must be waiting on the condvar.
    assert!(done_rx.recv_timeout(Duration::from_millis(200)).is_err());
    assert_eq!(backend.pool_waits(), 1);
    backend.pool().release(held);
    done_rx.recv_timeout(Duration::from_secs(30)).unwrap();
    let chunks: [&[u8]; 3] = [b"a", b"b", b"c"];
    assert_eq!(worker.join().unwrap(), reference(Algorithm::Sha1, &chunks));
}

#[test]
fn many_callers_share_a_small_pool() {
    let seed: u64 = rand::random();
    eprintln!("many_callers_share_a_small_pool: seed {seed}");
    let backend = Arc::new(small_kernel_backend(2, 32 << 10));
    let threads: Vec<_> = (0..6)
        .map(|t| {
            let backend = Arc::clone(&backend);
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed ^ t);
                let mut out = Vec::new();
                for round in 0..10 {
                    let data = random_batch(&mut rng, 30, 5000);
                    let chunks: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
                    let algorithm = KERNEL_ALGORITHMS[round % 3];
                    backend
                        .fingerprint_batch(algorithm, &chunks, &mut out)
                        .unwrap();
                    assert_eq!(out, reference(algorithm, &chunks));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(backend.stats().offloaded_batches, 60);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn any_batch_through_any_pool_matches_rustcrypto(
        sizes in prop::collection::vec(0usize..3000, 0..40),
        seed in any::<u64>(),
        lanes in 1usize..5,
        lane_bytes in 64usize..6000,
        algorithm in prop::sample::select(KERNEL_ALGORITHMS.to_vec()),
    ) {
        let mut rng = StdRng::seed_from_u64(seed);
        let data: Vec<Vec<u8>> = sizes.iter().map(|&n| random_chunk(&mut rng, n)).collect();
        let chunks: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
        let backend = KernelOnCpuBackend::new(PoolLayout::new(lanes, lane_bytes)).unwrap();
        let mut out = Vec::new();
        backend.fingerprint_batch(algorithm, &chunks, &mut out).unwrap();
        prop_assert_eq!(out, reference(algorithm, &chunks));
    }
}

#[test]
fn pool_is_sized_from_free_device_memory() {
    const GIB: usize = 1 << 30;
    // An H100 with 79 GiB free: the cap binds, 4 lanes of 64 MiB.
    let big = size_pool(79 * GIB, DEVICE_MEMORY_FRACTION).unwrap();
    assert_eq!(big, PoolLayout::new(STREAMS, MAX_LANE_BYTES));
    // 1 GiB free: a quarter, 256 MiB, shared by 4 lanes with their digests.
    let small = size_pool(GIB, DEVICE_MEMORY_FRACTION).unwrap();
    assert_eq!(small.lanes, STREAMS);
    assert_eq!(small.lane_bytes, 60 << 20);
    for free in [GIB, 3 * GIB, 79 * GIB, 200 << 20] {
        let layout = size_pool(free, DEVICE_MEMORY_FRACTION).unwrap();
        let budget = ((free as f64 * DEVICE_MEMORY_FRACTION) as usize).min(MAX_POOL_BYTES);
        assert!(layout.device_bytes() <= budget, "{free}: {layout:?}");
        assert!(layout.lane_bytes >= MIN_LANE_BYTES && layout.lane_bytes <= MAX_LANE_BYTES);
        assert_eq!(layout.lane_bytes % (1 << 20), 0);
    }
    // Too little free memory, or a nonsense fraction: an error, not a pool.
    assert!(size_pool(32 << 20, DEVICE_MEMORY_FRACTION).is_err());
    assert!(size_pool(79 * GIB, 0.0).is_err());
    assert!(size_pool(79 * GIB, 1.5).is_err());
    assert!(size_pool(79 * GIB, f64::NAN).is_err());
}

#[test]
fn backend_choice_names_round_trip() {
    for choice in BackendChoice::ALL {
        assert_eq!(choice.name().parse::<BackendChoice>().unwrap(), choice);
        assert_eq!(
            choice
                .to_string()
                .to_uppercase()
                .parse::<BackendChoice>()
                .unwrap(),
            choice
        );
        let json = serde_json::to_string(&choice).unwrap();
        assert_eq!(json, format!("\"{}\"", choice.name()));
        assert_eq!(
            serde_json::from_str::<BackendChoice>(&json).unwrap(),
            choice
        );
    }
    assert!("cuda".parse::<BackendChoice>().is_err());
    assert_eq!(BackendChoice::default(), BackendChoice::Cpu);
}

/// The GPU backend with the compiled threshold ([`GPU_MIN_BATCH_BYTES`],
/// not the crossover measured at start, which on a many-core host can send
/// every batch to the CPU: seen on an H200 with 16 cores), or `None` after
/// printing loudly why the calling test is skipped.
fn gpu_or_skip(test: &str) -> Option<GpuBackend> {
    let config = GpuConfig {
        measure_crossover: false,
        ..GpuConfig::default()
    };
    match GpuBackend::with_config(config) {
        Ok(gpu) => Some(gpu),
        Err(e) => {
            eprintln!("SKIPPED: no CUDA device, GPU-only test {test} not run: {e}");
            None
        }
    }
}

#[test]
fn without_a_gpu_new_returns_an_error_value() {
    // Must not panic wherever it runs; on a machine without a device the
    // error says so.
    match GpuBackend::new() {
        Ok(gpu) => eprintln!("a CUDA device is present: {}", gpu.describe()),
        Err(e) => {
            let msg = e.to_string();
            assert!(matches!(e, FingerprintError::Unavailable(_)), "{msg}");
            assert!(
                msg.contains("no CUDA device")
                    || msg.contains("libnvrtc not found")
                    || msg.contains("not enough free device memory"),
                "{msg}"
            );
            if !device::driver_present() {
                assert!(msg.contains("libcuda not found"), "{msg}");
            }
            eprintln!("GPU absent, as expected on CI: {msg}");
        }
    }
}

#[test]
fn choose_backend_auto_picks_the_cpu_without_a_gpu_and_says_so() {
    let (backend, why) = choose_backend(BackendChoice::Auto, Some(2)).unwrap();
    eprintln!("auto chose: {why}");
    let gpu_usable = GpuBackend::new().is_ok();
    if gpu_usable {
        assert_eq!(backend.name(), "gpu");
        assert!(
            why.starts_with("auto: found a usable GPU, using gpu"),
            "{why}"
        );
    } else {
        assert_eq!(backend.name(), "cpu");
        assert!(
            why.starts_with("auto: no usable GPU") && why.ends_with("using cpu (2 threads)"),
            "{why}"
        );
        assert!(
            why.contains("no CUDA device") || why.contains("libnvrtc"),
            "{why}"
        );
        // The backend it gave works.
        let mut out = Vec::new();
        backend
            .fingerprint_batch(Algorithm::Sha1, &[b"abc"], &mut out)
            .unwrap();
        assert_eq!(out, reference(Algorithm::Sha1, &[b"abc"]));
    }

    let (cpu, why) = choose_backend(BackendChoice::Cpu, Some(2)).unwrap();
    assert_eq!(cpu.name(), "cpu");
    assert!(why.starts_with("cpu: chosen by configuration"), "{why}");

    match choose_backend(BackendChoice::Gpu, Some(2)) {
        Ok((gpu, why)) => {
            assert!(gpu_usable);
            assert_eq!(gpu.name(), "gpu");
            assert!(why.starts_with("gpu: chosen by configuration"), "{why}");
        }
        Err(e) => {
            assert!(!gpu_usable);
            let msg = e.to_string();
            assert!(
                msg.contains("gpu backend chosen by configuration cannot run"),
                "{msg}"
            );
        }
    }
}

#[test]
fn gpu_matches_cpu_on_random_batches() {
    let Some(gpu) = gpu_or_skip("gpu_matches_cpu_on_random_batches") else {
        return;
    };
    let mut rng = rng("gpu_matches_cpu_on_random_batches");
    let cpu = CpuBackend::new(None).unwrap();
    let mut out = Vec::new();
    let mut expected = Vec::new();
    let mut cases: Vec<(usize, usize)> = vec![(1, 0), (300, 4096), (2000, 4096), (600, 32768)];
    cases.extend((0..6).map(|_| (rng.gen_range(1..3000), rng.gen_range(0..70_000))));
    for (count, max_len) in cases {
        let mut data = random_batch(&mut rng, count, max_len);
        data.extend(EDGE_SIZES.iter().map(|&n| random_chunk(&mut rng, n)));
        let chunks: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
        for algorithm in Algorithm::ALL {
            cpu.fingerprint_batch(algorithm, &chunks, &mut expected)
                .unwrap();
            gpu.fingerprint_batch(algorithm, &chunks, &mut out).unwrap();
            assert_eq!(out, expected, "{algorithm}, {count} chunks");
        }
    }
    let stats = gpu.stats();
    assert!(stats.offloaded_batches > 0, "{stats:?}");
    assert_eq!(stats.device_failures, 0, "{:?}", gpu.failure());
}

#[test]
fn gpu_sends_small_batches_to_the_cpu_and_measures_copies() {
    let Some(gpu) = gpu_or_skip("gpu_sends_small_batches_to_the_cpu_and_measures_copies") else {
        return;
    };
    let mut out = Vec::new();
    gpu.fingerprint_batch(Algorithm::Sha256, &[b"small"], &mut out)
        .unwrap();
    assert_eq!(out, reference(Algorithm::Sha256, &[b"small"]));
    assert_eq!(gpu.stats().delegated_batches, 1);
    assert_eq!(gpu.stats().offloaded_batches, 0);
    let bandwidth = gpu.h2d_bandwidth(16 << 20, 4).unwrap();
    eprintln!("pinned host-to-device copy: {:.1} GB/s", bandwidth / 1e9);
    assert!(bandwidth > 1e8);
}

#[test]
fn gpu_callers_share_the_pool() {
    let Some(gpu) = gpu_or_skip("gpu_callers_share_the_pool") else {
        return;
    };
    let gpu = Arc::new(gpu);
    let seed: u64 = rand::random();
    eprintln!("gpu_callers_share_the_pool: seed {seed}");
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let gpu = Arc::clone(&gpu);
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed ^ t);
                let mut out = Vec::new();
                for round in 0..4 {
                    let data: Vec<Vec<u8>> =
                        (0..1024).map(|_| random_chunk(&mut rng, 8192)).collect();
                    let chunks: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
                    let algorithm = KERNEL_ALGORITHMS[round % 3];
                    gpu.fingerprint_batch(algorithm, &chunks, &mut out).unwrap();
                    assert_eq!(out, reference(algorithm, &chunks));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(gpu.stats().offloaded_batches, 32);
}

/// Compiles KERNEL_SOURCE as CUDA C++ for a GPU target with clang, where
/// clang with CUDA support is installed: the closest this project gets to
/// NVRTC without a GPU machine. Checks it compiles with no warnings, emits
/// the kernel entry, and keeps its arrays in registers (no local memory).
#[test]
fn kernel_source_compiles_as_cuda_cpp_with_clang() {
    use std::process::Command;
    let dir = tempfile::tempdir().unwrap();
    let prelude = dir.path().join("prelude.h");
    std::fs::write(
        &prelude,
        "#define __global__ __attribute__((global))\n\
         #define __device__ __attribute__((device))\n\
         #define __constant__ __attribute__((constant))\n\
         #define __forceinline__ __inline__ __attribute__((always_inline))\n\
         #include <__clang_cuda_builtin_vars.h>\n\
         struct __attribute__((aligned(16))) uint4 { unsigned x, y, z, w; };\n",
    )
    .unwrap();
    let compile = |source: &str, name: &str| {
        let src = dir.path().join(name);
        std::fs::write(&src, source).unwrap();
        let ptx = dir.path().join(format!("{name}.ptx"));
        let output = Command::new("clang")
            .args(["-x", "cuda", "--cuda-device-only", "--cuda-gpu-arch=sm_70"])
            .args([
                "-nocudainc",
                "-nocudalib",
                "-D__CUDACC__",
                "-O3",
                "-Wall",
                "-Wextra",
            ])
            .arg("-include")
            .arg(&prelude)
            .arg("-S")
            .arg(&src)
            .arg("-o")
            .arg(&ptx)
            .output();
        output.map(|o| (o, ptx))
    };
    let probe = "extern \"C\" __global__ void probe(unsigned *p) { p[threadIdx.x] = 1u; }\n";
    match compile(probe, "probe.cu") {
        Ok((o, _)) if o.status.success() => {}
        Ok((o, _)) => {
            eprintln!(
                "SKIPPED: clang here cannot compile CUDA: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            return;
        }
        Err(e) => {
            eprintln!("SKIPPED: no clang to compile the kernel as CUDA C++: {e}");
            return;
        }
    }
    let (output, ptx) = compile(KERNEL_SOURCE, "hash.cu").unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.trim().is_empty(), "warnings: {stderr}");
    let ptx = std::fs::read_to_string(ptx).unwrap();
    assert!(ptx.contains(&format!(".entry {KERNEL_NAME}(")));
    assert!(!ptx.contains(".local"), "the kernel spills to local memory");
    assert!(
        ptx.contains("ld.v4.u32"),
        "full blocks load as 16-byte vectors"
    );
}

#[test]
fn the_crossover_measured_at_start_is_what_batches_are_routed_by() {
    let backend = KernelOnCpuBackend::new(PoolLayout::new(2, 1 << 20)).unwrap();
    let set = backend.measure_crossover(Algorithm::Sha256);
    let sizes = crate::fingerprint::coalesce::crossover_sizes();
    assert!(
        set == usize::MAX || sizes.contains(&set),
        "{set} is neither a measured size nor 'never'"
    );
    assert_eq!(backend.min_batch_bytes(), set);
    // Whatever it is, fingerprints stay right on either side of it.
    let chunk = vec![7u8; 4096];
    let chunks: Vec<&[u8]> = (0..8).map(|_| &chunk[..]).collect();
    let mut out = Vec::new();
    backend
        .fingerprint_batch(Algorithm::Sha256, &chunks, &mut out)
        .unwrap();
    assert_eq!(out, reference(Algorithm::Sha256, &chunks));
    // BLAKE3 has no kernel: nothing to measure, the threshold stays.
    assert_eq!(backend.measure_crossover(Algorithm::Blake3), set);
}

#[test]
fn the_min_batch_setting_fixes_the_threshold_or_names_a_bad_value() {
    use std::ffi::OsStr;
    let unset = GpuConfig::default().with_min_batch_setting(None).unwrap();
    assert!(unset.measure_crossover);
    assert_eq!(unset.min_batch_bytes, GPU_MIN_BATCH_BYTES);
    let all = GpuConfig::default()
        .with_min_batch_setting(Some(OsStr::new("0")))
        .unwrap();
    assert!(!all.measure_crossover);
    assert_eq!(all.min_batch_bytes, 0);
    let err = GpuConfig::default()
        .with_min_batch_setting(Some(OsStr::new("1M")))
        .unwrap_err()
        .to_string();
    assert!(err.contains(MIN_BATCH_ENV) && err.contains("1M"), "{err}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    /// Packing on a pool's threads writes the same bytes, padding left as
    /// it was included, as packing on the caller's thread.
    #[test]
    fn packing_on_a_pool_writes_what_packing_alone_writes(
        lens in proptest::collection::vec(0usize..9000, 0..40),
        seed in any::<u64>(),
    ) {
        let mut rng = StdRng::seed_from_u64(seed);
        let data: Vec<Vec<u8>> = lens.iter().map(|&n| random_chunk(&mut rng, n)).collect();
        let chunks: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
        let bytes: usize = chunks.iter().map(|c| packed_bytes(c.len())).sum();
        let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
        let mut alone = vec![0xa5u8; bytes + 64];
        let mut shared = alone.clone();
        let used = pack(&chunks, &mut alone);
        prop_assert_eq!(pack_on(Some(&pool), 0, &chunks, &mut shared), used);
        prop_assert_eq!(alone, shared);
    }
}

#[test]
fn the_queue_is_used_only_where_it_can_gather_a_gpu_batch() {
    let config = crate::fingerprint::coalesce::CoalesceConfig::default();
    assert!(queue_can_reach(1 << 20, &config));
    assert!(queue_can_reach(64 << 20, &config));
    // The GPU never won at start (a many-core host): no queue.
    assert!(!queue_can_reach(usize::MAX, &config));
    assert!(!queue_can_reach((64 << 20) + 1, &config));
}
