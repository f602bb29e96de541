//! The GPU kernel's source (`hash.cu`) compiled as plain C by build.rs and
//! run on the CPU: the lanes behind [`KernelOnCpuBackend`], which drives the
//! same packing and pipeline as the GPU backend with the kernel playing its
//! grid on the calling thread. It exists so that the kernel's hashing logic
//! and the host-side pipeline are tested (against RustCrypto) on machines
//! without a GPU, and as a single-thread sanity figure in `benches/gpu.rs`.
//!
//! Invariants: a lane's input is a `Vec<u64>`, so the metadata the kernel
//! reads as `u64` and the data it reads as `u32` are aligned as on the GPU;
//! `launch` runs the whole kernel before returning, so `wait` only hands
//! back the result; lanes own their buffers and keep no other state.

use super::offload::{Offload, OffloadStats};
use super::pipeline::{Lane, DIGEST_STRIDE};
use super::{PoolLayout, THREADS_PER_BLOCK};
use crate::fingerprint::{
    Algorithm, CpuBackend, Fingerprint, FingerprintBackend, FingerprintError,
};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

extern "C" {
    /// `hash_cpu.c`: runs `fp_hash_kernel` over `count` chunks in a grid
    /// of `threads_per_block`-thread blocks, one index after another.
    fn ecdedup_fp_kernel_cpu(
        algorithm: u32,
        meta: *const u64,
        data: *const u32,
        count: u32,
        out: *mut u8,
        threads_per_block: u32,
    );
}

/// Runs the C build of the kernel over one packed input, as the GPU launch
/// would: `input` laid out by `pipeline::pack` for `count` chunks, `out` at
/// least `count * DIGEST_STRIDE` bytes.
pub(crate) fn run_kernel_c(code: u32, input: &[u64], count: usize, out: &mut [u8]) {
    assert!(out.len() >= count * DIGEST_STRIDE);
    assert!(input.len() * 8 >= count * super::pipeline::META_BYTES);
    let count = u32::try_from(count).expect("slice of at most u32::MAX chunks");
    // SAFETY: the kernel reads `count` metadata entries and, through them,
    // chunk words inside `input` (pack wrote offsets and lengths within
    // it), and writes `count` 32-byte slots of `out`; both lengths are
    // checked above and both buffers outlive the call.
    unsafe {
        ecdedup_fp_kernel_cpu(
            code,
            input.as_ptr(),
            input.as_ptr().cast::<u32>(),
            count,
            out.as_mut_ptr(),
            THREADS_PER_BLOCK,
        )
    }
}

/// A lane whose engine is the C build of the kernel on the calling thread.
pub(crate) struct CpuLane {
    input: Vec<u64>,
    output: Vec<u8>,
    max_chunks: usize,
    count: usize,
    /// Test hook: launches left before one fails (shared by all lanes).
    fail_after: Option<Arc<AtomicU64>>,
}

impl CpuLane {
    pub(crate) fn new(layout: &PoolLayout, fail_after: Option<Arc<AtomicU64>>) -> Self {
        CpuLane {
            input: vec![0; layout.lane_bytes.div_ceil(8)],
            output: vec![0; layout.lane_chunks * DIGEST_STRIDE],
            max_chunks: layout.lane_chunks,
            count: 0,
            fail_after,
        }
    }
}

impl Lane for CpuLane {
    fn capacity(&self) -> usize {
        self.input.len() * 8
    }

    fn max_chunks(&self) -> usize {
        self.max_chunks
    }

    fn input(&mut self) -> Result<&mut [u8], String> {
        let len = self.input.len() * 8;
        // SAFETY: any u64 buffer is a valid u8 buffer of 8 times the length,
        // and the borrow of `self` keeps it exclusive.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.input.as_mut_ptr().cast::<u8>(), len) })
    }

    fn launch(&mut self, code: u32, count: usize, _bytes: usize) -> Result<(), String> {
        if let Some(left) = &self.fail_after {
            if left.fetch_sub(1, Relaxed) == 0 {
                return Err("injected lane failure".to_string());
            }
        }
        run_kernel_c(code, &self.input, count, &mut self.output);
        self.count = count;
        Ok(())
    }

    fn wait(&mut self) -> Result<&[u8], String> {
        Ok(&self.output[..self.count * DIGEST_STRIDE])
    }
}

/// The GPU backend's pipeline with the C build of its kernel as the device:
/// every SHA-1, SHA-256 and MD5 batch is packed into lanes and hashed by
/// `hash.cu`'s code on the calling thread (one thread, no overlap).
/// BLAKE3 goes to a one-thread [`CpuBackend`], as the GPU backend sends it
/// to its CPU backend. For tests and the benchmark's sanity figure; it is
/// slower than [`CpuBackend`] and not meant for the data path.
pub struct KernelOnCpuBackend {
    offload: Offload<CpuLane>,
}

impl KernelOnCpuBackend {
    /// A backend with the lanes of `layout` (1 to 8 lanes).
    pub fn new(layout: PoolLayout) -> Result<Self, FingerprintError> {
        Self::build(layout, None)
    }

    /// The same with launch number `n` (counting from 0 over all lanes)
    /// failing, as a device error would.
    #[cfg(test)]
    pub(crate) fn failing_at(layout: PoolLayout, n: u64) -> Result<Self, FingerprintError> {
        Self::build(layout, Some(Arc::new(AtomicU64::new(n))))
    }

    fn build(
        layout: PoolLayout,
        fail_after: Option<Arc<AtomicU64>>,
    ) -> Result<Self, FingerprintError> {
        layout.check()?;
        let lanes = (0..layout.lanes)
            .map(|_| CpuLane::new(&layout, fail_after.clone()))
            .collect();
        Ok(KernelOnCpuBackend {
            offload: Offload::new(lanes, CpuBackend::new(Some(1))?, 0),
        })
    }

    /// Measures the crossover against its CPU backend and routes by it,
    /// as the GPU backend does at start (tests the measurement's plumbing
    /// without a GPU).
    pub fn measure_crossover(&self, algorithm: Algorithm) -> usize {
        self.offload.measure_crossover(algorithm)
    }

    /// Batches under this many bytes go to the CPU backend.
    pub fn min_batch_bytes(&self) -> usize {
        self.offload.min_batch_bytes()
    }

    /// What this backend has hashed, through the kernel and beside it.
    pub fn stats(&self) -> OffloadStats {
        self.offload.stats()
    }

    /// The first lane failure, after which every batch went to the CPU.
    pub fn failure(&self) -> Option<String> {
        self.offload.failure()
    }

    /// Times a caller waited for a free lane.
    pub fn pool_waits(&self) -> u64 {
        self.offload.stats().pool_waits
    }
}

impl FingerprintBackend for KernelOnCpuBackend {
    fn name(&self) -> &str {
        "gpu-kernel-on-cpu"
    }

    fn fingerprint_batch(
        &self,
        algorithm: Algorithm,
        chunks: &[&[u8]],
        out: &mut Vec<Fingerprint>,
    ) -> Result<(), FingerprintError> {
        self.offload.fingerprint_batch(algorithm, chunks, out)
    }
}

#[cfg(test)]
impl KernelOnCpuBackend {
    pub(crate) fn pool(&self) -> &super::pipeline::LanePool<CpuLane> {
        self.offload.pool()
    }
}
