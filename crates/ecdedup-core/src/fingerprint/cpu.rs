//! The CPU fingerprint backend: hashes a batch on its own bounded rayon pool
//! when the batch is large enough to pay for the hand-off, otherwise on the
//! calling thread.
//!
//! Invariants: both paths produce the same fingerprints in chunk order (the
//! parallel path writes slot `i` from chunk `i` only); the pool is private to
//! the backend, never rayon's global pool, so fingerprinting cannot starve or
//! be starved by other rayon users and never uses more than `threads` cores;
//! counters are updated once per successful batch with relaxed atomics.

use super::{Algorithm, Fingerprint, FingerprintBackend, FingerprintError, FingerprintStats};
use rayon::prelude::*;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Batches of at least this many bytes (and at least two chunks) are spread
/// over the pool; smaller ones are hashed on the calling thread, where the
/// ~10 µs of waking pool threads would cost more than it saves.
pub const PARALLEL_THRESHOLD_BYTES: usize = 256 << 10;

/// A parallel task hashes at least about this many bytes, so that rayon's
/// per-task cost stays small next to the hashing itself.
const TASK_MIN_BYTES: usize = 64 << 10;

/// Hashes on the CPU cores, through a thread pool of its own.
#[derive(Debug)]
pub struct CpuBackend {
    /// `None` when the backend has one thread: then the caller hashes.
    pool: Option<rayon::ThreadPool>,
    threads: usize,
    parallel_threshold: usize,
    chunks: AtomicU64,
    bytes: AtomicU64,
    batches: AtomicU64,
    parallel_batches: AtomicU64,
}

impl CpuBackend {
    /// A backend on `threads` threads; `None` (or `Some(0)`) means one per
    /// available core. Fails only if the pool's threads cannot be started.
    pub fn new(threads: Option<usize>) -> Result<Self, FingerprintError> {
        let threads = match threads {
            Some(n) if n > 0 => n,
            _ => std::thread::available_parallelism().map_or(1, |n| n.get()),
        };
        let pool = if threads > 1 {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .thread_name(|i| format!("ecdedup-fp-{i}"))
                .build()
                .map_err(|e| {
                    FingerprintError::Unavailable(format!("cpu pool of {threads} threads: {e}"))
                })?;
            Some(pool)
        } else {
            None
        };
        Ok(CpuBackend {
            pool,
            threads,
            parallel_threshold: PARALLEL_THRESHOLD_BYTES,
            chunks: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            parallel_batches: AtomicU64::new(0),
        })
    }

    /// The same backend with another parallel threshold in bytes: 0 sends
    /// every batch of two or more chunks to the pool, `usize::MAX` none.
    pub fn with_parallel_threshold(mut self, bytes: usize) -> Self {
        self.parallel_threshold = bytes;
        self
    }

    /// The backend's own thread pool (`None` with one thread), lent to
    /// other bulk work of fingerprinting (the GPU backend's packing).
    pub(crate) fn pool(&self) -> Option<&rayon::ThreadPool> {
        self.pool.as_ref()
    }

    /// Threads this backend hashes on at most.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Batches of at least this many bytes go to the pool.
    pub fn parallel_threshold(&self) -> usize {
        self.parallel_threshold
    }

    /// What this backend has hashed so far.
    pub fn stats(&self) -> FingerprintStats {
        FingerprintStats {
            chunks: self.chunks.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
            batches: self.batches.load(Relaxed),
            parallel_batches: self.parallel_batches.load(Relaxed),
        }
    }
}

impl FingerprintBackend for CpuBackend {
    fn name(&self) -> &str {
        "cpu"
    }

    fn fingerprint_batch(
        &self,
        algorithm: Algorithm,
        chunks: &[&[u8]],
        out: &mut Vec<Fingerprint>,
    ) -> Result<(), FingerprintError> {
        let total: usize = chunks.iter().map(|c| c.len()).sum();
        out.clear();
        let pool = self
            .pool
            .as_ref()
            .filter(|_| chunks.len() > 1 && total >= self.parallel_threshold);
        match pool {
            Some(pool) => {
                out.resize(chunks.len(), Fingerprint::UNSET);
                let average = (total / chunks.len()).max(1);
                let min_len = (TASK_MIN_BYTES / average).clamp(1, chunks.len());
                pool.install(|| {
                    out.par_iter_mut()
                        .zip(chunks.par_iter())
                        .with_min_len(min_len)
                        .for_each(|(slot, chunk)| *slot = algorithm.fingerprint(chunk));
                });
                self.parallel_batches.fetch_add(1, Relaxed);
            }
            None => out.extend(chunks.iter().map(|chunk| algorithm.fingerprint(chunk))),
        }
        self.batches.fetch_add(1, Relaxed);
        self.chunks.fetch_add(chunks.len() as u64, Relaxed);
        self.bytes.fetch_add(total as u64, Relaxed);
        Ok(())
    }
}
