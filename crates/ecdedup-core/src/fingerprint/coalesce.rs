//! A bounded coalescing queue in front of a fingerprint backend: blocks
//! from concurrent callers (client writes, scrub, rebuild verification) are
//! gathered into one batch, so that under load a GPU sees batches large
//! enough to pay for its copies and launch (paper 002), while a lone caller
//! never waits.
//!
//! How a batch forms (group commit):
//! - A caller that finds no batch being hashed becomes the leader: it takes
//!   its own chunks and every queued request of the same algorithm, and
//!   hashes them as one batch through the inner backend.
//! - A caller that finds a batch being hashed queues a copy of its chunks
//!   and sleeps; when the leader finishes it hands every queued caller its
//!   fingerprints, and one of the callers still queued becomes the next
//!   leader with everything that arrived meanwhile. So batches grow with
//!   the load and shrink to one request at QD1, with no timer involved.
//! - With [`CoalesceConfig::wait_us`] > 0, a leader whose batch is under
//!   [`CoalesceConfig::batch_bytes_min`] while other callers are inside the
//!   backend waits up to that many microseconds for more; a lone caller
//!   never waits.
//!
//! Bounds: the queue holds at most [`CoalesceConfig::queue_bytes_max`]
//! bytes of copied chunks; a request that does not fit, or one at least
//! `batch_bytes_min` on its own, goes straight to the inner backend. A
//! batch is at most `batch_bytes_max` bytes: the rest stays queued for the
//! next leader.
//!
//! Invariant: every caller gets exactly the fingerprints of its own chunks,
//! in order (the inner backend's result, split back), or the inner
//! backend's error.

use super::{Algorithm, Fingerprint, FingerprintBackend, FingerprintError};
use serde::Serialize;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The queue's bounds and its optional wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoalesceConfig {
    /// A request at least this large goes straight through, and a leader
    /// may wait (`wait_us`) only while its batch is smaller. Set it to the
    /// backend's measured crossover.
    pub batch_bytes_min: usize,
    /// Largest batch a leader hashes at once.
    pub batch_bytes_max: usize,
    /// Most bytes of copied chunks waiting in the queue.
    pub queue_bytes_max: usize,
    /// How long a leader with a small batch waits for more while others
    /// are busy (0: never).
    pub wait_us: u64,
}

impl Default for CoalesceConfig {
    fn default() -> Self {
        CoalesceConfig {
            batch_bytes_min: 1 << 20,
            batch_bytes_max: 64 << 20,
            queue_bytes_max: 64 << 20,
            wait_us: 0,
        }
    }
}

/// What the queue has done since it was made; counters only grow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CoalesceStats {
    /// Calls to `fingerprint_batch`.
    pub requests: u64,
    /// Batches sent to the inner backend by a leader.
    pub batches: u64,
    /// Requests that rode in another caller's batch.
    pub coalesced_requests: u64,
    /// Requests sent straight through (large, or the queue was full).
    pub direct_requests: u64,
    /// Times a leader waited for more requests.
    pub waits: u64,
    /// Largest batch, in bytes.
    pub batch_bytes_peak: u64,
}

type Outcome = Result<Vec<Fingerprint>, FingerprintError>;

struct Queued {
    ticket: u64,
    algorithm: Algorithm,
    chunks: Vec<Vec<u8>>,
    bytes: usize,
}

#[derive(Default)]
struct State {
    queue: Vec<Queued>,
    queued_bytes: usize,
    leader: bool,
    /// Callers inside `fingerprint_batch` (leaders, queued, direct).
    inside: usize,
    next_ticket: u64,
    done: HashMap<u64, Outcome>,
}

/// A [`FingerprintBackend`] that coalesces concurrent requests (see the
/// module documentation).
pub struct CoalescingBackend {
    inner: Arc<dyn FingerprintBackend>,
    config: CoalesceConfig,
    state: Mutex<State>,
    wake: Condvar,
    requests: AtomicU64,
    batches: AtomicU64,
    coalesced: AtomicU64,
    direct: AtomicU64,
    waits: AtomicU64,
    batch_bytes_peak: AtomicU64,
}

impl CoalescingBackend {
    pub fn new(inner: Arc<dyn FingerprintBackend>, config: CoalesceConfig) -> CoalescingBackend {
        assert!(config.batch_bytes_max > 0 && config.batch_bytes_min <= config.batch_bytes_max);
        CoalescingBackend {
            inner,
            config,
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            requests: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            coalesced: AtomicU64::new(0),
            direct: AtomicU64::new(0),
            waits: AtomicU64::new(0),
            batch_bytes_peak: AtomicU64::new(0),
        }
    }

    pub fn config(&self) -> CoalesceConfig {
        self.config
    }

    pub fn stats(&self) -> CoalesceStats {
        CoalesceStats {
            requests: self.requests.load(Relaxed),
            batches: self.batches.load(Relaxed),
            coalesced_requests: self.coalesced.load(Relaxed),
            direct_requests: self.direct.load(Relaxed),
            waits: self.waits.load(Relaxed),
            batch_bytes_peak: self.batch_bytes_peak.load(Relaxed),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// As leader: takes queued requests of `algorithm` up to the batch
    /// bound (`room` bytes), in arrival order.
    fn take_queued(state: &mut State, algorithm: Algorithm, mut room: usize) -> Vec<Queued> {
        let mut taken = Vec::new();
        let mut kept = Vec::with_capacity(state.queue.len());
        for q in state.queue.drain(..) {
            if q.algorithm == algorithm && q.bytes <= room {
                room -= q.bytes;
                state.queued_bytes -= q.bytes;
                taken.push(q);
            } else {
                kept.push(q);
            }
        }
        state.queue = kept;
        taken
    }

    /// Hashes `own` (the leader's chunks, if any) with `queued` as one
    /// batch; hands the queued callers their results; returns the leader's.
    fn lead(
        &self,
        algorithm: Algorithm,
        own: &[&[u8]],
        queued: Vec<Queued>,
        out: &mut Vec<Fingerprint>,
    ) -> Result<(), FingerprintError> {
        let mut all: Vec<&[u8]> = own.to_vec();
        for q in &queued {
            all.extend(q.chunks.iter().map(|c| c.as_slice()));
        }
        let bytes: usize = all.iter().map(|c| c.len()).sum();
        self.batches.fetch_add(1, Relaxed);
        self.coalesced.fetch_add(queued.len() as u64, Relaxed);
        self.batch_bytes_peak.fetch_max(bytes as u64, Relaxed);
        let mut fps = Vec::with_capacity(all.len());
        let result = self.inner.fingerprint_batch(algorithm, &all, &mut fps);
        let mut state = self.lock();
        let mut at = own.len();
        for q in queued {
            let n = q.chunks.len();
            let outcome = match &result {
                Ok(()) => Ok(fps[at..at + n].to_vec()),
                Err(e) => Err(FingerprintError::Backend(format!(
                    "a coalesced batch failed: {e}"
                ))),
            };
            at += n;
            state.done.insert(q.ticket, outcome);
        }
        state.leader = false;
        drop(state);
        self.wake.notify_all();
        result?;
        out.clear();
        out.extend_from_slice(&fps[..own.len()]);
        Ok(())
    }
}

impl FingerprintBackend for CoalescingBackend {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn fingerprint_batch(
        &self,
        algorithm: Algorithm,
        chunks: &[&[u8]],
        out: &mut Vec<Fingerprint>,
    ) -> Result<(), FingerprintError> {
        self.requests.fetch_add(1, Relaxed);
        let bytes: usize = chunks.iter().map(|c| c.len()).sum();
        let mut state = self.lock();
        let direct = bytes >= self.config.batch_bytes_min
            || state.queued_bytes + bytes > self.config.queue_bytes_max;
        if direct || chunks.is_empty() {
            drop(state);
            self.direct.fetch_add(1, Relaxed);
            return self.inner.fingerprint_batch(algorithm, chunks, out);
        }
        state.inside += 1;
        let result = if !state.leader {
            // Lead at once; wait for company only if someone else is busy.
            state.leader = true;
            if self.config.wait_us > 0 && state.inside > 1 {
                let deadline = Instant::now() + Duration::from_micros(self.config.wait_us);
                self.waits.fetch_add(1, Relaxed);
                while state.queued_bytes + bytes < self.config.batch_bytes_min {
                    let now = Instant::now();
                    if now >= deadline {
                        break;
                    }
                    state = self
                        .wake
                        .wait_timeout(state, deadline - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            }
            let queued =
                Self::take_queued(&mut state, algorithm, self.config.batch_bytes_max - bytes);
            drop(state);
            let r = self.lead(algorithm, chunks, queued, out);
            state = self.lock();
            r
        } else {
            let ticket = state.next_ticket;
            state.next_ticket += 1;
            state.queue.push(Queued {
                ticket,
                algorithm,
                chunks: chunks.iter().map(|c| c.to_vec()).collect(),
                bytes,
            });
            state.queued_bytes += bytes;
            self.wake.notify_all();
            loop {
                if let Some(outcome) = state.done.remove(&ticket) {
                    break outcome.map(|fps| {
                        out.clear();
                        out.extend(fps);
                    });
                }
                if !state.leader {
                    // No batch in flight: lead with what is queued (this
                    // request among it, unless another leader took it).
                    state.leader = true;
                    let queued =
                        Self::take_queued(&mut state, algorithm, self.config.batch_bytes_max);
                    drop(state);
                    let mut none = Vec::new();
                    let r = self.lead(algorithm, &[], queued, &mut none);
                    state = self.lock();
                    if let Err(e) = r {
                        state.done.remove(&ticket);
                        break Err(e);
                    }
                    continue;
                }
                state = self.wake.wait(state).unwrap_or_else(|p| p.into_inner());
            }
        };
        state.inside -= 1;
        result
    }
}

/// The smallest batch size at which `fast` beats `slow` on every larger
/// size measured: the crossover `auto` and the GPU backend route by.
/// `time_of(backend, bytes)` says what one batch of that size cost on
/// backend 0 (`slow`, the CPU) or 1 (`fast`, the GPU); `sizes` ascend.
/// None when `fast` never wins at the largest size.
pub fn crossover(
    sizes: &[usize],
    mut time_of: impl FnMut(usize, usize) -> Duration,
) -> Option<usize> {
    let wins: Vec<bool> = sizes
        .iter()
        .map(|&s| time_of(1, s) < time_of(0, s))
        .collect();
    let last_loss = wins.iter().rposition(|w| !w);
    match last_loss {
        None => sizes.first().copied(),
        Some(i) if i + 1 < sizes.len() => Some(sizes[i + 1]),
        Some(_) => None,
    }
}

/// Batch sizes the start-up measurement tries: 4 KiB to 64 MiB, doubling.
pub fn crossover_sizes() -> Vec<usize> {
    (12..=26).map(|p| 1usize << p).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fingerprint::CpuBackend;
    use std::sync::atomic::AtomicUsize;

    /// A backend that hashes on the CPU and records every batch's size; it
    /// can hold batches until released, to make callers pile up.
    struct Recording {
        cpu: CpuBackend,
        batches: Mutex<Vec<usize>>,
        gate: Mutex<bool>,
        opened: Condvar,
        inside: AtomicUsize,
    }

    impl Recording {
        fn new(held: bool) -> Arc<Recording> {
            Arc::new(Recording {
                cpu: CpuBackend::new(Some(1)).unwrap(),
                batches: Mutex::new(Vec::new()),
                gate: Mutex::new(!held),
                opened: Condvar::new(),
                inside: AtomicUsize::new(0),
            })
        }
        fn open(&self) {
            *self.gate.lock().unwrap() = true;
            self.opened.notify_all();
        }
    }

    impl FingerprintBackend for Recording {
        fn name(&self) -> &str {
            "recording"
        }
        fn fingerprint_batch(
            &self,
            algorithm: Algorithm,
            chunks: &[&[u8]],
            out: &mut Vec<Fingerprint>,
        ) -> Result<(), FingerprintError> {
            self.inside.fetch_add(1, Relaxed);
            let mut open = self.gate.lock().unwrap();
            while !*open {
                open = self.opened.wait(open).unwrap();
            }
            drop(open);
            self.batches.lock().unwrap().push(chunks.len());
            self.cpu.fingerprint_batch(algorithm, chunks, out)
        }
    }

    fn chunk(i: usize) -> Vec<u8> {
        (0..4096).map(|j| (i * 31 + j * 7) as u8).collect()
    }

    /// Hashes `data` through `q` as one request; checks the caller gets
    /// exactly its own chunks' fingerprints.
    fn hash_and_check(q: &CoalescingBackend, algorithm: Algorithm, data: &[Vec<u8>]) {
        let refs: Vec<&[u8]> = data.iter().map(|c| c.as_slice()).collect();
        let mut out = Vec::new();
        q.fingerprint_batch(algorithm, &refs, &mut out).unwrap();
        let want: Vec<Fingerprint> = data.iter().map(|c| algorithm.fingerprint(c)).collect();
        assert_eq!(out, want, "a caller got fingerprints not of its own chunks");
    }

    #[test]
    fn a_lone_caller_goes_through_alone_and_gets_its_own_fingerprints() {
        let inner = Recording::new(false);
        let q = CoalescingBackend::new(inner.clone(), CoalesceConfig::default());
        let data: Vec<Vec<u8>> = (0..3).map(chunk).collect();
        hash_and_check(&q, Algorithm::Sha256, &data);
        assert_eq!(*inner.batches.lock().unwrap(), vec![3]);
        assert_eq!(q.stats().waits, 0, "a lone caller never waits");
    }

    #[test]
    fn callers_that_arrive_while_a_batch_is_hashed_ride_in_the_next_one() {
        let inner = Recording::new(true);
        let q = Arc::new(CoalescingBackend::new(
            inner.clone(),
            CoalesceConfig::default(),
        ));
        let callers = 6;
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..callers)
                .map(|i| {
                    let q = Arc::clone(&q);
                    s.spawn(move || {
                        hash_and_check(&q, Algorithm::Sha1, &[chunk(i), chunk(i + 100)])
                    })
                })
                .collect();
            // The first leader is held inside the backend until the others
            // have queued (no timing: the queue's own state says when).
            loop {
                let queued = q.lock().queue.len();
                if inner.inside.load(Relaxed) == 1 && queued == callers - 1 {
                    break;
                }
                std::thread::yield_now();
            }
            inner.open();
            for h in handles {
                h.join().unwrap();
            }
        });
        let batches = inner.batches.lock().unwrap().clone();
        assert_eq!(batches, vec![2, 2 * (callers - 1)], "{batches:?}");
        let stats = q.stats();
        assert_eq!(stats.coalesced_requests, callers as u64 - 1);
        assert_eq!(stats.batches, 2);
    }

    #[test]
    fn large_requests_and_requests_past_the_queue_bound_go_straight_through() {
        let inner = Recording::new(false);
        let config = CoalesceConfig {
            batch_bytes_min: 8192,
            batch_bytes_max: 1 << 20,
            queue_bytes_max: 4096,
            wait_us: 0,
        };
        let q = CoalescingBackend::new(inner, config);
        let data: Vec<Vec<u8>> = (0..2).map(chunk).collect();
        let refs: Vec<&[u8]> = data.iter().map(|c| c.as_slice()).collect();
        let mut out = Vec::new();
        q.fingerprint_batch(Algorithm::Md5, &refs, &mut out)
            .unwrap();
        assert_eq!(q.stats().direct_requests, 1);
        q.fingerprint_batch(Algorithm::Md5, &refs[..1], &mut out)
            .unwrap();
        assert_eq!(q.stats().direct_requests, 1, "a small request is queued");
        assert_eq!(out, vec![Algorithm::Md5.fingerprint(&data[0])]);
    }

    #[test]
    fn the_crossover_is_where_the_fast_side_wins_from_then_on() {
        let sizes = [1, 2, 4, 8, 16];
        // GPU cost: 10 fixed + 1 per unit; CPU: 3 per unit.
        let cost = |b: usize, s: usize| {
            Duration::from_micros(if b == 1 { 10 + s as u64 } else { 3 * s as u64 })
        };
        assert_eq!(crossover(&sizes, cost), Some(8));
        assert_eq!(
            crossover(&sizes, |b, _| Duration::from_micros(b as u64)),
            None
        );
        assert_eq!(
            crossover(&sizes, |b, _| Duration::from_micros(2 - b as u64)),
            Some(1)
        );
        // A win below a loss does not count.
        let noisy = |b: usize, s: usize| {
            let gpu_wins = s == 2 || s >= 16;
            Duration::from_micros(if gpu_wins == (b == 1) { 1 } else { 2 })
        };
        assert_eq!(crossover(&sizes, noisy), Some(16));
    }
}
