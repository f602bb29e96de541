//! The host side of batch offload, independent of CUDA: packing chunks into
//! a lane's staging buffer, the pool of lanes with its backpressure, and the
//! loop that keeps several slices of a batch in flight at once. The GPU
//! backend runs it over CUDA lanes (`device.rs`); the kernel-on-CPU backend
//! over lanes that call the C build of the kernel (`kernel_cpu.rs`), which is
//! how this logic is tested on machines without a GPU.
//!
//! Invariants:
//! - A lane's input holds one slice laid out as `hash.cu` expects: `count`
//!   16-byte metadata entries (offset, length as little-endian u64), then
//!   each chunk's bytes at a 16-byte-aligned offset from the buffer's start.
//!   [`packed_bytes`] is the exact space a chunk takes, so a slice fits its
//!   lane by construction.
//! - A lane is in exactly one place: free in the pool, held by one call
//!   while it packs, or in that call's flight ring. Its buffers are
//!   rewritten only after `wait` has returned for its last launch; the ring's
//!   `Drop` waits for every launched lane before returning it to the pool,
//!   so an error or panic midway never hands out a lane with copies still
//!   running.
//! - A call blocks on the pool's condvar only while it holds no lane; when
//!   it holds some and the pool is empty it retires its own oldest slice and
//!   reuses that lane. So calls never deadlock on one another, and a pool of
//!   `n` lanes bounds the memory in use whatever the number of callers.
//! - Slot `start + i` of `out` is written from the digest of chunk
//!   `start + i` only; slices retire in launch order.
//! - Nothing here allocates per batch: the pool's vector keeps its capacity,
//!   the ring is a fixed array on the stack.

use super::super::{Algorithm, Fingerprint};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Condvar, Mutex, MutexGuard};

/// Bytes of one chunk's metadata entry: byte offset and length, two u64.
pub(crate) const META_BYTES: usize = 16;
/// Chunk data starts at multiples of this in a lane's input, so the kernel
/// can load whole 16-byte vectors.
pub(crate) const ALIGN: usize = 16;
/// Bytes of output per chunk: the longest digest.
pub(crate) const DIGEST_STRIDE: usize = 32;
/// Most lanes a pool (and so one call's flight ring) may have.
pub(crate) const MAX_LANES: usize = 8;
/// A slice is cut once it holds this many bytes, unless the batch is so
/// small that every lane gets less: smaller slices add launches and copies
/// whose fixed cost (~10 µs each) outweighs the overlap they buy.
pub(crate) const MIN_SLICE_BYTES: usize = 1 << 20;

/// The kernel's code for an algorithm (`FP_ALG_*` in hash.cu); `None` for
/// BLAKE3 and CRC-32C, which have no kernel.
pub(crate) fn algorithm_code(algorithm: Algorithm) -> Option<u32> {
    match algorithm {
        Algorithm::Sha1 => Some(0),
        Algorithm::Sha256 => Some(1),
        Algorithm::Md5 => Some(2),
        Algorithm::Blake3 | Algorithm::Crc32c => None,
    }
}

/// Space one chunk of `len` bytes takes in a lane's input.
pub(crate) fn packed_bytes(len: usize) -> usize {
    META_BYTES + len.next_multiple_of(ALIGN)
}

/// How many leading `chunks` make the next slice, and the input bytes they
/// take: as many as fit `capacity` bytes and `max_chunks` entries, stopping
/// once the slice holds at least `target` bytes. The first chunk must fit
/// alone (the caller hashes bigger ones itself); `chunks` is not empty.
pub(crate) fn slice_len(
    chunks: &[&[u8]],
    capacity: usize,
    max_chunks: usize,
    target: usize,
) -> (usize, usize) {
    let mut count = 0;
    let mut bytes = 0;
    for chunk in chunks.iter().take(max_chunks) {
        let next = bytes + packed_bytes(chunk.len());
        if next > capacity {
            break;
        }
        count += 1;
        bytes = next;
        if bytes >= target {
            break;
        }
    }
    debug_assert!(count > 0, "the first chunk must fit an empty lane");
    (count, bytes)
}

/// Writes `chunks` into `input` in the layout of hash.cu (see the module
/// documentation) and returns the bytes used. `input` must hold at least
/// the sum of [`packed_bytes`]; padding bytes are left as they were.
pub(crate) fn pack(chunks: &[&[u8]], input: &mut [u8]) -> usize {
    let mut offset = chunks.len() * META_BYTES;
    for (i, chunk) in chunks.iter().enumerate() {
        let entry = &mut input[i * META_BYTES..(i + 1) * META_BYTES];
        entry[..8].copy_from_slice(&(offset as u64).to_le_bytes());
        entry[8..].copy_from_slice(&(chunk.len() as u64).to_le_bytes());
        input[offset..offset + chunk.len()].copy_from_slice(chunk);
        offset += chunk.len().next_multiple_of(ALIGN);
    }
    offset
}

/// Slices of at least this many packed bytes are copied into the lane by
/// the CPU backend's threads ([`pack_on`]); smaller ones by the caller.
pub(crate) const PARALLEL_PACK_BYTES: usize = 1 << 20;

/// Slices per lane a large batch is cut into by default. More slices would
/// let packing, copies and kernels of different slices overlap more, but
/// each costs a launch and a synchronization: measured on an H200 (SHA-1,
/// 4 KiB chunks, `benches/gpu.rs`), 1, 2, 4 and 8 slices per lane gave
/// 15.4, 11.4, 10.3 and 10.3 GB/s on 16 MiB batches and 31.4, 33.4, 26.1
/// and 22.5 GB/s on 256 MiB batches.
pub(crate) const SLICES_PER_LANE: usize = 1;

/// [`pack`], with the chunks copied by `pool`'s threads when the slice
/// packs to at least `min_parallel_bytes` (one thread cannot fill pinned
/// memory as fast as the copy engine drains it). Same bytes as [`pack`].
pub(crate) fn pack_on(
    pool: Option<&rayon::ThreadPool>,
    min_parallel_bytes: usize,
    chunks: &[&[u8]],
    input: &mut [u8],
) -> usize {
    use rayon::prelude::*;
    let bytes: usize = chunks.iter().map(|c| packed_bytes(c.len())).sum();
    let Some(pool) = pool.filter(|_| chunks.len() > 1 && bytes >= min_parallel_bytes) else {
        return pack(chunks, input);
    };
    let mut offset = chunks.len() * META_BYTES;
    let (entries, mut rest) = input.split_at_mut(offset);
    let mut pieces: Vec<(&[u8], &mut [u8])> = Vec::with_capacity(chunks.len());
    for (chunk, entry) in chunks.iter().zip(entries.chunks_exact_mut(META_BYTES)) {
        entry[..8].copy_from_slice(&(offset as u64).to_le_bytes());
        entry[8..].copy_from_slice(&(chunk.len() as u64).to_le_bytes());
        let padded = chunk.len().next_multiple_of(ALIGN);
        let (room, tail) = std::mem::take(&mut rest).split_at_mut(padded);
        pieces.push((chunk, &mut room[..chunk.len()]));
        rest = tail;
        offset += padded;
    }
    // Tasks of about 256 KiB, so rayon's per-task cost stays small.
    let per_task = ((256 << 10) * chunks.len() / bytes.max(1)).max(1);
    pool.install(|| {
        pieces
            .into_par_iter()
            .with_min_len(per_task)
            .for_each(|(src, dst)| dst.copy_from_slice(src))
    });
    offset
}

/// One staging slot of the pipeline: an input buffer, an output buffer, and
/// an engine (a CUDA stream, or the C kernel on this thread) that runs
/// copy-in, kernel and copy-out for one slice at a time.
pub(crate) trait Lane: Send {
    /// Bytes of input this lane holds.
    fn capacity(&self) -> usize;
    /// Chunks one slice may have at most (bounds the output buffer).
    fn max_chunks(&self) -> usize;
    /// The input staging buffer, `capacity` bytes, free to overwrite: the
    /// lane's previous launch (if any) has been waited for.
    fn input(&mut self) -> Result<&mut [u8], String>;
    /// Starts hashing the first `bytes` of input, `count` chunks, with
    /// kernel algorithm `code`; may return before the work is done.
    fn launch(&mut self, code: u32, count: usize, bytes: usize) -> Result<(), String>;
    /// Waits for the last launch and returns its digests:
    /// `count * DIGEST_STRIDE` bytes.
    fn wait(&mut self) -> Result<&[u8], String>;
}

/// The lanes not in use, with a condvar that callers wait on when none is.
pub(crate) struct LanePool<L> {
    free: Mutex<Vec<L>>,
    available: Condvar,
    lanes: usize,
    capacity: usize,
    max_chunks: usize,
    waits: AtomicU64,
}

impl<L: Lane> LanePool<L> {
    /// A pool of `lanes` (1 to [`MAX_LANES`], all of one capacity).
    pub(crate) fn new(lanes: Vec<L>) -> Self {
        assert!(!lanes.is_empty() && lanes.len() <= MAX_LANES);
        let capacity = lanes[0].capacity();
        let max_chunks = lanes[0].max_chunks();
        assert!(lanes
            .iter()
            .all(|l| l.capacity() == capacity && l.max_chunks() == max_chunks));
        LanePool {
            lanes: lanes.len(),
            free: Mutex::new(lanes),
            available: Condvar::new(),
            capacity,
            max_chunks,
            waits: AtomicU64::new(0),
        }
    }

    pub(crate) fn lanes(&self) -> usize {
        self.lanes
    }

    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    pub(crate) fn max_chunks(&self) -> usize {
        self.max_chunks
    }

    /// Times a caller found no free lane and waited (backpressure).
    pub(crate) fn waits(&self) -> u64 {
        self.waits.load(Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, Vec<L>> {
        // A panic while holding the lock cannot leave the vector half
        // changed (push and pop are the only operations), so go on.
        self.free.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A free lane, waiting on the condvar while there is none.
    pub(crate) fn acquire(&self) -> L {
        let mut free = self.lock();
        let mut counted = false;
        loop {
            if let Some(lane) = free.pop() {
                return lane;
            }
            if !counted {
                self.waits.fetch_add(1, Relaxed);
                counted = true;
            }
            free = self.available.wait(free).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// A free lane if there is one now.
    pub(crate) fn try_acquire(&self) -> Option<L> {
        self.lock().pop()
    }

    /// Gives an idle lane (nothing launched, or waited for) back.
    pub(crate) fn release(&self, lane: L) {
        self.lock().push(lane);
        self.available.notify_one();
    }
}

/// A launched slice: its lane and the chunks it covers.
struct Slice<L> {
    lane: L,
    start: usize,
    count: usize,
}

/// One call's slices in flight, oldest first, in a fixed ring.
struct Flight<'p, L: Lane> {
    pool: &'p LanePool<L>,
    ring: [Option<Slice<L>>; MAX_LANES],
    head: usize,
    len: usize,
}

impl<'p, L: Lane> Flight<'p, L> {
    fn new(pool: &'p LanePool<L>) -> Self {
        Flight {
            pool,
            ring: std::array::from_fn(|_| None),
            head: 0,
            len: 0,
        }
    }

    fn push(&mut self, slice: Slice<L>) {
        debug_assert!(self.len < self.pool.lanes());
        self.ring[(self.head + self.len) % MAX_LANES] = Some(slice);
        self.len += 1;
    }

    fn pop(&mut self) -> Option<Slice<L>> {
        if self.len == 0 {
            return None;
        }
        let slice = self.ring[self.head].take();
        self.head = (self.head + 1) % MAX_LANES;
        self.len -= 1;
        slice
    }

    /// Waits for the oldest slice, writes its fingerprints into `out` and
    /// returns its lane (idle now); `None` when nothing is in flight. On a
    /// device error the lane goes back to the pool and the error is returned.
    fn retire(
        &mut self,
        algorithm: Algorithm,
        out: &mut [Fingerprint],
    ) -> Option<Result<L, String>> {
        let Slice {
            mut lane,
            start,
            count,
        } = self.pop()?;
        let digests = match lane.wait() {
            Ok(digests) => digests,
            Err(e) => {
                self.pool.release(lane);
                return Some(Err(e));
            }
        };
        let n = algorithm.digest_bytes();
        for (slot, digest) in out[start..start + count]
            .iter_mut()
            .zip(digests.chunks_exact(DIGEST_STRIDE))
        {
            *slot = Fingerprint::from_digest(&digest[..n]);
        }
        Some(Ok(lane))
    }

    /// A lane to pack the next slice into: from the pool (waiting there only
    /// when this call holds none), or the lane of this call's oldest slice
    /// once that slice is retired.
    fn next_lane(&mut self, algorithm: Algorithm, out: &mut [Fingerprint]) -> Result<L, String> {
        if self.len == 0 {
            return Ok(self.pool.acquire());
        }
        if self.len < self.pool.lanes() {
            if let Some(lane) = self.pool.try_acquire() {
                return Ok(lane);
            }
        }
        self.retire(algorithm, out).expect("a slice is in flight")
    }
}

impl<L: Lane> Drop for Flight<'_, L> {
    /// Only reached with slices left on an error or a panic: wait for each
    /// (so no copy still reads or writes its buffers) and free its lane.
    fn drop(&mut self) {
        while let Some(mut slice) = self.pop() {
            let _ = slice.lane.wait();
            self.pool.release(slice.lane);
        }
    }
}

/// Hashes `chunks` (with `total` bytes in all) through `pool` into `out`,
/// which holds one slot per chunk. Chunks too big for an empty lane are
/// hashed on this thread. Returns the number of slices launched.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run<L: Lane>(
    pool: &LanePool<L>,
    packer: Option<&rayon::ThreadPool>,
    slices_per_lane: usize,
    algorithm: Algorithm,
    code: u32,
    chunks: &[&[u8]],
    out: &mut [Fingerprint],
    total: usize,
) -> Result<u64, String> {
    debug_assert_eq!(chunks.len(), out.len());
    let fits = |len: usize| packed_bytes(len) <= pool.capacity() && pool.max_chunks() > 0;
    // Cut the batch into at least one slice per lane when it is big enough,
    // so copies of one slice overlap the kernel of another.
    let target = total
        .div_ceil(pool.lanes() * slices_per_lane.max(1))
        .clamp(MIN_SLICE_BYTES.min(pool.capacity()), pool.capacity());
    let mut flight = Flight::new(pool);
    let mut next = 0;
    let mut slices = 0;
    while next < chunks.len() {
        if !fits(chunks[next].len()) {
            out[next] = algorithm.fingerprint(chunks[next]);
            next += 1;
            continue;
        }
        let mut lane = flight.next_lane(algorithm, out)?;
        let (count, bytes) = slice_len(&chunks[next..], pool.capacity(), pool.max_chunks(), target);
        let input = match lane.input() {
            Ok(input) => input,
            Err(e) => {
                pool.release(lane);
                return Err(e);
            }
        };
        pack_on(
            packer,
            PARALLEL_PACK_BYTES,
            &chunks[next..next + count],
            input,
        );
        let launched = lane.launch(code, count, bytes);
        // In flight even if the launch failed part way, so that the ring's
        // Drop waits for whatever was queued before the lane is reused.
        flight.push(Slice {
            lane,
            start: next,
            count,
        });
        launched?;
        next += count;
        slices += 1;
    }
    while let Some(lane) = flight.retire(algorithm, out) {
        pool.release(lane?);
    }
    Ok(slices)
}

/// Chunk lengths of the start-up self-test: empty, short, SHA/MD5 padding
/// edges (55, 56, 64 bytes), a 4 KiB block and an unaligned tail.
const SELF_TEST_LENGTHS: [usize; 7] = [0, 3, 55, 56, 64, 4096, 9001];

/// Hashes a few known chunks with every kernel algorithm on every lane and
/// compares each digest with [`Algorithm::fingerprint`]. The GPU backend
/// runs it before it hashes anything, so that a kernel that NVRTC or the
/// driver got wrong on this device (or a driver call that does not work
/// here) is refused at start with an error value, never used to dedup data.
/// Each lane is idle on return, whatever the outcome.
pub(crate) fn self_test<L: Lane>(lanes: &mut [L]) -> Result<(), String> {
    let data: Vec<u8> = (0..SELF_TEST_LENGTHS[SELF_TEST_LENGTHS.len() - 1])
        .map(|i| (i * 31 % 251) as u8)
        .collect();
    let chunks: Vec<&[u8]> = SELF_TEST_LENGTHS.iter().map(|&n| &data[..n]).collect();
    for (number, lane) in lanes.iter_mut().enumerate() {
        for algorithm in [Algorithm::Sha1, Algorithm::Sha256, Algorithm::Md5] {
            let code = algorithm_code(algorithm).expect("SHA-1, SHA-256 and MD5 have kernels");
            let input = lane.input()?;
            let bytes = pack(&chunks, input);
            // A failed launch may have queued a copy: wait for it either way.
            let launched = lane.launch(code, chunks.len(), bytes);
            let digests = lane.wait();
            launched?;
            let digests = digests?;
            for (chunk, digest) in chunks.iter().zip(digests.chunks_exact(DIGEST_STRIDE)) {
                let expected = algorithm.fingerprint(chunk);
                if &digest[..algorithm.digest_bytes()] != expected.as_bytes() {
                    return Err(format!(
                        "self-test failed: lane {number} computed a wrong {algorithm} digest \
                         of a {}-byte chunk",
                        chunk.len()
                    ));
                }
            }
        }
    }
    Ok(())
}
