//! A crash-consistency checker: writers that know exactly which writes the
//! server acknowledged and which of those a flush (or FUA) made durable.
//!
//! Every 4 KiB block written carries (magic, volume offset, sequence number)
//! and a body derived from both, so any block read back is either all zeroes
//! (sequence 0: never written, or written with zeroes), or exactly one write
//! that went to that very offset, or garbage. Each writer owns a disjoint
//! range of blocks and keeps one request in flight, so per block it knows
//!   durable: the newest write that a completed flush or FUA covers, and
//!   later:   every write issued after it (acknowledged or in flight).
//! After a crash a block must read back as `durable` or one of `later`:
//! old or new content, never anything else (in particular never an older
//! durable write, a torn block, or another block's data).

use super::nbd::{self, Client};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

pub const BLOCK: u64 = 4096;
const MAGIC: &[u8; 8] = b"ECDCHK01";

/// The content of the block at `offset` written by write number `seq`;
/// sequence 0 is the zero block.
pub fn block_content(offset: u64, seq: u64) -> Vec<u8> {
    if seq == 0 {
        return vec![0u8; BLOCK as usize];
    }
    let mut b = super::pseudo_random(
        offset.rotate_left(17) ^ seq.wrapping_mul(0x9E37_79B9),
        BLOCK as usize,
    );
    b[0..8].copy_from_slice(MAGIC);
    b[8..16].copy_from_slice(&offset.to_le_bytes());
    b[16..24].copy_from_slice(&seq.to_le_bytes());
    b
}

/// Which write a block read back at `offset` holds.
pub fn decode(offset: u64, block: &[u8]) -> Result<u64, String> {
    if block.iter().all(|&b| b == 0) {
        return Ok(0);
    }
    if &block[0..8] != MAGIC {
        return Err(format!(
            "block at {offset}: no checker magic (garbage: {:02x?}...)",
            &block[..16]
        ));
    }
    let at = u64::from_le_bytes(block[8..16].try_into().unwrap());
    let seq = u64::from_le_bytes(block[16..24].try_into().unwrap());
    if at != offset {
        return Err(format!(
            "block at {offset} holds the content written to offset {at} (seq {seq})"
        ));
    }
    if block != block_content(offset, seq).as_slice() {
        return Err(format!(
            "block at {offset} has the header of seq {seq} but a torn or corrupt body"
        ));
    }
    Ok(seq)
}

#[derive(Clone, Debug, Default)]
pub struct BlockState {
    pub durable: u64,
    pub later: Vec<u64>,
}

impl BlockState {
    pub fn allows(&self, seq: u64) -> bool {
        seq == self.durable || self.later.contains(&seq)
    }
    /// What a read must return while the server is up (every earlier
    /// request of this writer has been acknowledged).
    fn latest(&self) -> u64 {
        *self.later.last().unwrap_or(&self.durable)
    }
}

/// One writer's blocks, `first_block` .. `first_block + blocks.len()`.
#[derive(Clone, Debug)]
pub struct Range {
    pub first_block: u64,
    pub blocks: Vec<BlockState>,
}

impl Range {
    pub fn new(first_block: u64, count: u64) -> Range {
        Range {
            first_block,
            blocks: vec![BlockState::default(); count as usize],
        }
    }
    fn offset(&self, i: usize) -> u64 {
        (self.first_block + i as u64) * BLOCK
    }
}

/// What one writer session did.
#[derive(Debug, Default, Clone)]
pub struct Tally {
    pub writes_acked: u64,
    pub fua_writes_acked: u64,
    pub zero_writes_acked: u64,
    pub flushes_acked: u64,
    pub reads_checked: u64,
    /// Why the session ended (normally: the connection broke at the kill).
    pub ended_by: String,
    /// A check that failed while the server was still up.
    pub violation: Option<String>,
}

/// Shared, global sequence numbers (unique across writers and iterations).
pub struct Sequencer(AtomicU64);

impl Sequencer {
    pub fn new() -> Arc<Sequencer> {
        Arc::new(Sequencer(AtomicU64::new(1)))
    }
    fn next(&self) -> u64 {
        self.0.fetch_add(1, Ordering::SeqCst)
    }
}

/// Runs requests against `range` until the connection breaks or `stop` is
/// set. One request at a time: writes of 1 to 40 blocks (some whole aligned
/// stripes of `stripe_blocks`), some with FUA, write-zeroes, flushes, and
/// read-back checks of acknowledged content.
pub fn run_writer(
    socket: PathBuf,
    mut range: Range,
    seq: Arc<Sequencer>,
    stop: Arc<AtomicBool>,
    acked_total: Arc<AtomicU64>,
    rng_seed: u64,
    stripe_blocks: u64,
) -> (Range, Tally) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(rng_seed);
    let mut tally = Tally::default();
    let mut client = match Client::connect(&socket) {
        Ok(c) => c,
        Err(e) => {
            tally.ended_by = format!("connect: {e:?}");
            return (range, tally);
        }
    };
    let n = range.blocks.len() as u64;
    let mut touched_since_flush = std::collections::BTreeSet::new();
    while !stop.load(Ordering::SeqCst) {
        let op = rng.gen_range(0..100);
        let r: nbd::Result<()> = if op < 8 {
            // Flush: everything this writer had acknowledged is now durable.
            let r = client.flush();
            if r.is_ok() {
                tally.flushes_acked += 1;
                for &i in &touched_since_flush {
                    let b: &mut BlockState = &mut range.blocks[i];
                    b.durable = b.latest();
                    b.later.clear();
                }
                touched_since_flush.clear();
            }
            r
        } else if op < 16 {
            // Read back a few blocks: acknowledged content, exactly.
            let len = rng.gen_range(1..=16u64).min(n);
            let start = rng.gen_range(0..=n - len);
            match client.read(range.offset(start as usize), (len * BLOCK) as usize) {
                Ok(data) => {
                    for j in 0..len as usize {
                        let i = start as usize + j;
                        let got = decode(
                            range.offset(i),
                            &data[j * BLOCK as usize..(j + 1) * BLOCK as usize],
                        );
                        let want = range.blocks[i].latest();
                        if got != Ok(want) {
                            tally.violation = Some(format!(
                                "while serving: block at {} read {got:?}, last acknowledged write is seq {want}",
                                range.offset(i)
                            ));
                            stop.store(true, Ordering::SeqCst);
                        }
                    }
                    tally.reads_checked += 1;
                    Ok(())
                }
                Err(e) => Err(e),
            }
        } else {
            // Write (some with zeroes, some FUA).
            let len = match rng.gen_range(0..10) {
                0..=5 => rng.gen_range(1..=4u64),
                6..=8 => rng.gen_range(5..=40u64),
                _ => stripe_blocks,
            }
            .min(n);
            let start = if len == stripe_blocks {
                let first_aligned =
                    range.first_block.div_ceil(stripe_blocks) * stripe_blocks - range.first_block;
                let slots = (n.saturating_sub(first_aligned)) / stripe_blocks;
                if slots == 0 {
                    0
                } else {
                    first_aligned + rng.gen_range(0..slots) * stripe_blocks
                }
            } else {
                rng.gen_range(0..=n - len)
            };
            let fua = rng.gen_range(0..100) < 15;
            let zeroes = rng.gen_range(0..100) < 5;
            let s = if zeroes { 0 } else { seq.next() };
            let mut payload = Vec::with_capacity((len * BLOCK) as usize);
            for i in start..start + len {
                range.blocks[i as usize].later.push(s);
                if !zeroes {
                    payload.extend(block_content(range.offset(i as usize), s));
                }
            }
            let offset = range.offset(start as usize);
            let r = if zeroes {
                client.write_zeroes(offset, (len * BLOCK) as u32, fua)
            } else {
                client.write(offset, &payload, fua)
            };
            if r.is_ok() {
                tally.writes_acked += 1;
                acked_total.fetch_add(1, Ordering::SeqCst);
                if zeroes {
                    tally.zero_writes_acked += 1;
                }
                for i in start..start + len {
                    let b = &mut range.blocks[i as usize];
                    if fua {
                        // Durable now; everything before it was acknowledged.
                        b.durable = s;
                        b.later.clear();
                    } else {
                        touched_since_flush.insert(i as usize);
                    }
                }
                if fua {
                    tally.fua_writes_acked += 1;
                }
            }
            r
        };
        match r {
            Ok(()) => {}
            Err(nbd::Error::Io(e)) => {
                tally.ended_by = format!("connection broke: {e}");
                return (range, tally);
            }
            Err(e) => {
                // A live server refused a valid request: that is a bug.
                tally.violation = Some(format!("server refused a valid request: {e:?}"));
                tally.ended_by = "violation".into();
                stop.store(true, Ordering::SeqCst);
                return (range, tally);
            }
        }
    }
    tally.ended_by = "stopped".into();
    client.disconnect();
    (range, tally)
}

/// What a verification found.
#[derive(Debug, Default)]
pub struct Verified {
    pub blocks: u64,
    /// Blocks that read back as a write newer than the durable one.
    pub newer_than_durable: u64,
    /// Blocks whose durable write was not zero (real evidence checked).
    pub durable_nonzero: u64,
}

/// Reads every block of `range` from a freshly started server and checks it
/// against the model; then adopts what was read as the new durable state
/// (the caller flushes afterwards). Err lists the first violations.
pub fn verify_after_restart(socket: &Path, range: &mut Range) -> Result<Verified, String> {
    let mut client = Client::connect(socket).map_err(|e| format!("connect: {e:?}"))?;
    let mut v = Verified::default();
    let mut errors = Vec::new();
    let total = range.blocks.len();
    let chunk = 64usize;
    let mut i = 0;
    while i < total {
        let n = chunk.min(total - i);
        let data = client
            .read(range.offset(i), n * BLOCK as usize)
            .map_err(|e| format!("reading {} blocks at {}: {e:?}", n, range.offset(i)))?;
        for j in 0..n {
            let idx = i + j;
            let off = range.offset(idx);
            let st = &mut range.blocks[idx];
            match decode(off, &data[j * BLOCK as usize..(j + 1) * BLOCK as usize]) {
                Ok(seq) if st.allows(seq) => {
                    if seq != st.durable {
                        v.newer_than_durable += 1;
                    }
                    if st.durable != 0 {
                        v.durable_nonzero += 1;
                    }
                    st.durable = seq;
                    st.later.clear();
                }
                Ok(seq) => errors.push(format!(
                    "block at {off}: read seq {seq}, but the durable write is seq {} and later writes are {:?}",
                    st.durable, st.later
                )),
                Err(e) => errors.push(format!("{e} (durable seq {}, later {:?})", st.durable, st.later)),
            }
            v.blocks += 1;
        }
        i += n;
    }
    client
        .flush()
        .map_err(|e| format!("flush after verification: {e:?}"))?;
    client.disconnect();
    if errors.is_empty() {
        Ok(v)
    } else {
        let n = errors.len();
        errors.truncate(20);
        Err(format!(
            "{n} blocks violate the model:\n{}",
            errors.join("\n")
        ))
    }
}
