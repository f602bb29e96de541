//! The batch policy shared by the GPU backend and its kernel-on-CPU twin:
//! which batches go through the lanes and which to the CPU backend, what is
//! counted, and what happens when a lane fails.
//!
//! Invariants:
//! - A batch goes to the CPU backend when its algorithm has no kernel
//!   (BLAKE3), when its bytes are under `min_batch_bytes` (too small to pay
//!   for the copies), or after a lane has failed; otherwise through the
//!   lanes. Either way `out` ends with one fingerprint per chunk, in order.
//! - The first lane failure is kept and turns the offload off for good (a
//!   CUDA context with a sticky error cannot recover); the batch it hit is
//!   hashed again on the CPU, so callers see correct fingerprints, never the
//!   device error. `stats().device_failures` and `failure()` report it.
//! - Counters only grow and are updated once per batch with relaxed atomics.

use super::pipeline::{algorithm_code, run, Lane, LanePool};
use crate::fingerprint::{
    Algorithm, CpuBackend, Fingerprint, FingerprintBackend, FingerprintError, FingerprintStats,
};
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;

/// What an offloading backend has hashed since it was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct OffloadStats {
    /// Batches hashed through the lanes (the GPU, or the kernel as C).
    pub offloaded_batches: u64,
    /// Chunks and bytes of those batches.
    pub offloaded_chunks: u64,
    pub offloaded_bytes: u64,
    /// Slices launched for them (one copy-in, kernel, copy-out each).
    pub slices: u64,
    /// Batches sent to the CPU backend instead: under the size threshold,
    /// BLAKE3, or after a failure. Their detail is in `cpu`.
    pub delegated_batches: u64,
    /// Times a caller found every lane busy and waited (backpressure).
    pub pool_waits: u64,
    /// Lane failures seen: the first turns offload off; calls already in
    /// flight then may add a few more.
    pub device_failures: u64,
    /// The CPU backend's own counters.
    pub cpu: FingerprintStats,
}

pub(crate) struct Offload<L> {
    pool: LanePool<L>,
    cpu: CpuBackend,
    min_batch_bytes: AtomicUsize,
    /// Whether slices are packed by the CPU backend's threads (`pack_on`).
    parallel_pack: AtomicBool,
    /// Slices per lane a large batch is cut into (`pipeline::run`).
    slices_per_lane: AtomicUsize,
    failed: AtomicBool,
    failure: Mutex<Option<String>>,
    offloaded_batches: AtomicU64,
    offloaded_chunks: AtomicU64,
    offloaded_bytes: AtomicU64,
    slices: AtomicU64,
    delegated_batches: AtomicU64,
    device_failures: AtomicU64,
}

impl<L: Lane> Offload<L> {
    pub(crate) fn new(lanes: Vec<L>, cpu: CpuBackend, min_batch_bytes: usize) -> Self {
        Offload {
            pool: LanePool::new(lanes),
            cpu,
            min_batch_bytes: AtomicUsize::new(min_batch_bytes),
            parallel_pack: AtomicBool::new(true),
            slices_per_lane: AtomicUsize::new(super::pipeline::SLICES_PER_LANE),
            failed: AtomicBool::new(false),
            failure: Mutex::new(None),
            offloaded_batches: AtomicU64::new(0),
            offloaded_chunks: AtomicU64::new(0),
            offloaded_bytes: AtomicU64::new(0),
            slices: AtomicU64::new(0),
            delegated_batches: AtomicU64::new(0),
            device_failures: AtomicU64::new(0),
        }
    }

    pub(crate) fn pool(&self) -> &LanePool<L> {
        &self.pool
    }

    pub(crate) fn cpu(&self) -> &CpuBackend {
        &self.cpu
    }

    /// Packs slices on the CPU backend's threads (the default) or on the
    /// caller's alone.
    pub(crate) fn set_parallel_pack(&self, on: bool) {
        self.parallel_pack.store(on, Relaxed);
    }

    /// Cuts large batches into `n` slices per lane (at least 1).
    pub(crate) fn set_slices_per_lane(&self, n: usize) {
        self.slices_per_lane.store(n.max(1), Relaxed);
    }

    fn packer(&self) -> Option<&rayon::ThreadPool> {
        self.cpu.pool().filter(|_| self.parallel_pack.load(Relaxed))
    }

    pub(crate) fn min_batch_bytes(&self) -> usize {
        self.min_batch_bytes.load(Relaxed)
    }

    /// Measures, on this machine, the batch size from which the lanes beat
    /// the CPU backend (`coalesce::crossover` over 4 KiB to 64 MiB, best of
    /// 3 each), and routes by it from now on; usize::MAX when the lanes
    /// never win. Returns what was set.
    pub(crate) fn measure_crossover(&self, algorithm: Algorithm) -> usize {
        let Some(code) = algorithm_code(algorithm) else {
            return self.min_batch_bytes();
        };
        let sizes = crate::fingerprint::coalesce::crossover_sizes();
        let chunk = vec![0x5au8; 4096];
        let mut out = Vec::new();
        let crossover = crate::fingerprint::coalesce::crossover(&sizes, |side, bytes| {
            let chunks: Vec<&[u8]> = (0..bytes / chunk.len()).map(|_| &chunk[..]).collect();
            (0..3)
                .map(|_| {
                    let t = std::time::Instant::now();
                    let _ = if side == 0 {
                        self.cpu.fingerprint_batch(algorithm, &chunks, &mut out)
                    } else {
                        out.clear();
                        out.resize(chunks.len(), Fingerprint::UNSET);
                        run(
                            &self.pool,
                            self.packer(),
                            self.slices_per_lane.load(Relaxed),
                            algorithm,
                            code,
                            &chunks,
                            &mut out,
                            bytes,
                        )
                        .map(|_| ())
                        .map_err(FingerprintError::Backend)
                    };
                    t.elapsed()
                })
                .min()
                .unwrap_or_default()
        })
        .unwrap_or(usize::MAX);
        self.min_batch_bytes.store(crossover, Relaxed);
        crossover
    }

    pub(crate) fn stats(&self) -> OffloadStats {
        OffloadStats {
            offloaded_batches: self.offloaded_batches.load(Relaxed),
            offloaded_chunks: self.offloaded_chunks.load(Relaxed),
            offloaded_bytes: self.offloaded_bytes.load(Relaxed),
            slices: self.slices.load(Relaxed),
            delegated_batches: self.delegated_batches.load(Relaxed),
            pool_waits: self.pool.waits(),
            device_failures: self.device_failures.load(Relaxed),
            cpu: self.cpu.stats(),
        }
    }

    pub(crate) fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn delegate(
        &self,
        algorithm: Algorithm,
        chunks: &[&[u8]],
        out: &mut Vec<Fingerprint>,
    ) -> Result<(), FingerprintError> {
        self.delegated_batches.fetch_add(1, Relaxed);
        self.cpu.fingerprint_batch(algorithm, chunks, out)
    }

    pub(crate) fn fingerprint_batch(
        &self,
        algorithm: Algorithm,
        chunks: &[&[u8]],
        out: &mut Vec<Fingerprint>,
    ) -> Result<(), FingerprintError> {
        let total: usize = chunks.iter().map(|c| c.len()).sum();
        let code = match algorithm_code(algorithm) {
            Some(code)
                if !chunks.is_empty()
                    && total >= self.min_batch_bytes()
                    && !self.failed.load(Relaxed) =>
            {
                code
            }
            _ => return self.delegate(algorithm, chunks, out),
        };
        out.clear();
        out.resize(chunks.len(), Fingerprint::UNSET);
        match run(
            &self.pool,
            self.packer(),
            self.slices_per_lane.load(Relaxed),
            algorithm,
            code,
            chunks,
            out,
            total,
        ) {
            Ok(slices) => {
                self.offloaded_batches.fetch_add(1, Relaxed);
                self.offloaded_chunks
                    .fetch_add(chunks.len() as u64, Relaxed);
                self.offloaded_bytes.fetch_add(total as u64, Relaxed);
                self.slices.fetch_add(slices, Relaxed);
                Ok(())
            }
            Err(e) => {
                self.device_failures.fetch_add(1, Relaxed);
                self.failed.store(true, Relaxed);
                self.failure
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(e);
                self.delegate(algorithm, chunks, out)
            }
        }
    }
}
