//! A cluster volume: the virtual disk striped over its pool's placement
//! groups, each PG the engine's own [`Array`] over the volume's chunks on
//! that PG's k + m servers (docs/cluster.md, "The data path").
//!
//! Stripe `s` of the volume lives in PG `(s + r) mod P` at that PG's local
//! stripe `s / P`, where `r` is fixed by the volume's id
//! ([`stripe_pg`]): a function of the volume and the pool's fixed PG count
//! only, so volumes coming and going never move another's data, and each
//! PG's local stripes are dense (its array has no holes).
//!
//! A request that covers stripes of several PGs is split: each PG gets one
//! request over its local range (gathered into, or scattered from, a
//! buffer of its own), and the PGs run in parallel. A request inside one
//! PG goes to its array as it is.

use crate::link::Wire;
use ecdedup_core::array::Array;
use ecdedup_core::error::{Error, Result};
use ecdedup_transport::log::line;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;

/// Where stripe `stripe` of a volume lives: (PG, local stripe).
pub fn stripe_pg(rotation: u64, stripe: u64, pg_count: u32) -> (u32, u64) {
    let p = u64::from(pg_count);
    (((stripe % p + rotation % p) % p) as u32, stripe / p)
}

/// One piece of a request: a run of bytes inside one stripe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Piece {
    pg: u32,
    /// Byte offset in the PG's array.
    local: u64,
    /// Byte offset from the request's start.
    at: u64,
    len: u64,
}

pub struct ClusterVolume {
    pub(crate) size: u64,
    pub(crate) stripe_bytes: u64,
    pub(crate) rotation: u64,
    /// Index: PG number.
    pub(crate) pgs: Vec<Arc<Array>>,
    pub(crate) wire: Arc<Wire>,
    pub(crate) state_dir: std::path::PathBuf,
    /// The pool's min_size: a PG with fewer shards in service takes no
    /// writes (reads go on while k remain).
    pub(crate) min_size: usize,
    /// Per PG: whether it is below min_size now (its log line is written
    /// once per change, not per refused write).
    pub(crate) below_min: Vec<AtomicBool>,
    /// The rebuilds running in the background (`rebuild.rs`; the
    /// follower adds those of re-placements while serving).
    pub(crate) rebuilds: Arc<std::sync::Mutex<Vec<crate::rebuild::Running>>>,
    /// Follows the PG records while the volume serves (`follow.rs`);
    /// stopped first at close.
    pub(crate) follower: std::sync::Mutex<Option<crate::follow::Follower>>,
    /// Held for the volume's lifetime: the runtime the links run on, the
    /// writer's lease.
    pub(crate) _session: Option<crate::open::Session>,
}

impl ClusterVolume {
    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn wire(&self) -> &Arc<Wire> {
        &self.wire
    }

    /// The folder the client keeps its state in.
    pub fn state_dir(&self) -> &std::path::Path {
        &self.state_dir
    }

    pub fn pg_arrays(&self) -> &[Arc<Array>] {
        &self.pgs
    }

    /// The pieces of `[offset, offset + len)`, in order.
    fn pieces(&self, offset: u64, len: u64) -> Vec<Piece> {
        let p = self.pgs.len() as u32;
        let mut out = Vec::new();
        let mut at = 0;
        while at < len {
            let pos = offset + at;
            let stripe = pos / self.stripe_bytes;
            let within = pos % self.stripe_bytes;
            let n = (self.stripe_bytes - within).min(len - at);
            let (pg, local_stripe) = stripe_pg(self.rotation, stripe, p);
            out.push(Piece {
                pg,
                local: local_stripe * self.stripe_bytes + within,
                at,
                len: n,
            });
            at += n;
        }
        out
    }

    /// Per PG touched: its local range `(pg, start, len)` and its pieces.
    fn by_pg(&self, offset: u64, len: u64) -> Vec<(u32, u64, u64, Vec<Piece>)> {
        let mut groups: Vec<(u32, u64, u64, Vec<Piece>)> = Vec::new();
        for piece in self.pieces(offset, len) {
            match groups.iter_mut().find(|g| g.0 == piece.pg) {
                Some(g) => {
                    // A PG's pieces follow one another in its local space.
                    debug_assert_eq!(g.1 + g.2, piece.local);
                    g.2 += piece.len;
                    g.3.push(piece);
                }
                None => groups.push((piece.pg, piece.local, piece.len, vec![piece])),
            }
        }
        groups
    }

    fn check(&self, offset: u64, len: u64, carries_data: bool) -> Result<()> {
        if let Some(reason) = self.wire.fenced() {
            return Err(Error::Unavailable(format!(
                "this writer of volume {} is fenced: {reason}",
                self.wire.volume_id
            )));
        }
        if carries_data {
            ecdedup_core::volume::check_request(offset, len, self.size)
        } else {
            ecdedup_core::volume::check_range(offset, len, self.size)
        }
    }

    /// Whether PG `pg` has min_size shards in service: checked before a
    /// write goes to its array and again after it, so that no write is
    /// acknowledged with fewer (a shard that failed during the write
    /// turns its success into EIO: the data may have landed, as with any
    /// EIO). The PG's change either way is logged once.
    fn min_size_holds(&self, pg: u32) -> Result<()> {
        let complete = self.pgs[pg as usize].members_complete();
        let below = complete < self.min_size;
        let was = self.below_min[pg as usize].swap(below, SeqCst);
        if below != was {
            let event = if below {
                "pg-below-min-size"
            } else {
                "pg-writable-again"
            };
            line(
                "volume-client",
                event,
                &[
                    ("volume_id", &self.wire.volume_id),
                    ("pg", &pg),
                    ("shards_in_service", &complete),
                    ("min_size", &self.min_size),
                ],
            );
        }
        if below {
            return Err(Error::Unavailable(format!(
                "PG {pg} of volume {} has {complete} shards in service, fewer than the pool's \
                 min_size {}: writes are refused until it has {} again (reads go on)",
                self.wire.volume_id, self.min_size, self.min_size
            )));
        }
        Ok(())
    }

    /// A write of PG `pg`, between two min_size checks.
    fn pg_write(&self, pg: u32, write: impl FnOnce(&Array) -> Result<()>) -> Result<()> {
        self.min_size_holds(pg)?;
        write(&self.pgs[pg as usize])?;
        self.min_size_holds(pg)
    }

    pub fn read(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.check(offset, buf.len() as u64, true)?;
        let groups = self.by_pg(offset, buf.len() as u64);
        if let [(pg, start, _, _)] = groups.as_slice() {
            return self.pgs[*pg as usize].read(buf, *start);
        }
        let results: Vec<Result<(Vec<u8>, Vec<Piece>)>> = std::thread::scope(|s| {
            let handles: Vec<_> = groups
                .into_iter()
                .map(|(pg, start, len, pieces)| {
                    let array = &self.pgs[pg as usize];
                    s.spawn(move || {
                        let mut tmp = vec![0u8; len as usize];
                        array.read(&mut tmp, start).map(|()| (tmp, pieces))
                    })
                })
                .collect();
            handles.into_iter().map(join).collect()
        });
        for r in results {
            let (tmp, pieces) = r?;
            let base = pieces[0].local;
            for p in pieces {
                let from = (p.local - base) as usize;
                buf[p.at as usize..(p.at + p.len) as usize]
                    .copy_from_slice(&tmp[from..from + p.len as usize]);
            }
        }
        Ok(())
    }

    pub fn write(&self, buf: &[u8], offset: u64, fua: bool) -> Result<()> {
        self.check(offset, buf.len() as u64, true)?;
        let groups = self.by_pg(offset, buf.len() as u64);
        if let [(pg, start, _, _)] = groups.as_slice() {
            return self.pg_write(*pg, |a| a.write(buf, *start, fua));
        }
        let results: Vec<Result<()>> = std::thread::scope(|s| {
            let handles: Vec<_> = groups
                .into_iter()
                .map(|(pg, start, len, pieces)| {
                    s.spawn(move || {
                        let mut tmp = Vec::with_capacity(len as usize);
                        for p in &pieces {
                            tmp.extend_from_slice(&buf[p.at as usize..(p.at + p.len) as usize]);
                        }
                        self.pg_write(pg, |a| a.write(&tmp, start, fua))
                    })
                })
                .collect();
            handles.into_iter().map(join).collect()
        });
        results.into_iter().collect()
    }

    pub fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<()> {
        self.check(offset, len, false)?;
        if len == 0 {
            return Ok(());
        }
        // Each PG's part of the range is contiguous in its local space:
        // from its first piece's start to its last piece's end.
        let p = u64::from(self.pgs.len() as u32);
        let first = offset / self.stripe_bytes;
        let last = (offset + len - 1) / self.stripe_bytes;
        let mut ranges: Vec<(u32, u64, u64)> = Vec::new();
        for s in first..=(first + p - 1).min(last) {
            let (pg, _) = stripe_pg(self.rotation, s, p as u32);
            // The PG's stripes in [first, last]: s, s + p, ... up to last.
            let s_last = s + (last - s) / p * p;
            let start_in = if s == first {
                offset % self.stripe_bytes
            } else {
                0
            };
            let end_in = if s_last == last {
                (offset + len - 1) % self.stripe_bytes + 1
            } else {
                self.stripe_bytes
            };
            let start = (s / p) * self.stripe_bytes + start_in;
            let end = (s_last / p) * self.stripe_bytes + end_in;
            ranges.push((pg, start, end - start));
        }
        if let [(pg, start, n)] = ranges.as_slice() {
            return self.pg_write(*pg, |a| a.write_zeroes(*start, *n, fua));
        }
        let results: Vec<Result<()>> = std::thread::scope(|s| {
            let handles: Vec<_> = ranges
                .into_iter()
                .map(|(pg, start, n)| {
                    s.spawn(move || self.pg_write(pg, |a| a.write_zeroes(start, n, fua)))
                })
                .collect();
            handles.into_iter().map(join).collect()
        });
        results.into_iter().collect()
    }

    pub fn flush(&self) -> Result<()> {
        self.check(0, 0, false)?;
        self.each_pg(|a| a.flush())
    }

    /// Where each rebuild started at open: (PG, shard, first stripe).
    /// A rebuild resumed from an earlier writer's durable cursor starts
    /// past 0.
    pub fn rebuild_starts(&self) -> Vec<(u32, usize, u64)> {
        self.rebuilds
            .lock()
            .unwrap()
            .iter()
            .flat_map(|r| r.starts.clone())
            .collect()
    }

    /// Waits for the background rebuilds to end; their results (an error
    /// where a rebuild stopped short: the shard stays rebuilding, its
    /// cursor durable).
    pub fn wait_rebuilds(&self) -> Vec<Result<u64>> {
        let running: Vec<_> = self.rebuilds.lock().unwrap().drain(..).collect();
        running.into_iter().map(|r| r.join()).collect()
    }

    /// Flushes and closes every PG's array, then gives the writer key back.
    /// A rebuild running stops at its next stripe with its cursor
    /// recorded (the next writer resumes there).
    pub fn close(&self) -> Result<()> {
        if let Some(mut follower) = self.follower.lock().unwrap().take() {
            follower.stop();
        }
        let closed = self.each_pg(|a| a.close());
        // The arrays are stopping: each rebuild records its cursor and
        // ends; then the arrays are flushed once more.
        self.wait_rebuilds();
        let closed = closed.and(self.each_pg(|a| a.close()));
        // Nothing more leaves this writer (a background replay of a closed
        // array included): its key is given back below.
        self.wire
            .fence("the volume was closed by its writer".into());
        if let Some(session) = &self._session {
            session.release();
        }
        closed
    }

    fn each_pg(&self, f: impl Fn(&Array) -> Result<()> + Sync) -> Result<()> {
        if let [one] = self.pgs.as_slice() {
            return f(one);
        }
        let f = &f;
        let results: Vec<Result<()>> = std::thread::scope(|s| {
            let handles: Vec<_> = self.pgs.iter().map(|a| s.spawn(move || f(a))).collect();
            handles.into_iter().map(join).collect()
        });
        results.into_iter().collect()
    }

    /// The volume's counters: the wire's, the volume's sums of the PG
    /// arrays' NEED_D0s and degraded service, and each PG array's.
    pub fn stats_json(&self) -> serde_json::Value {
        let stats: Vec<_> = self.pgs.iter().map(|a| a.stats()).collect();
        let sum = |f: fn(&ecdedup_core::counters::ArrayStats) -> u64| -> u64 {
            stats.iter().map(|s| f(&s.array)).sum()
        };
        serde_json::json!({
            "volume_id": self.wire.volume_id,
            "epoch": self.wire.epoch,
            "wire": &self.wire.counters,
            "need_d0": sum(|a| a.need_d0),
            "journal_writes": sum(|a| a.journal_writes),
            "degraded_reads": sum(|a| a.reconstructed_blocks),
            "degraded_writes": sum(|a| a.degraded_writes),
            "pgs": stats,
        })
    }
}

/// A PG's result from its thread; a panic there is re-raised here (a bug:
/// the server's fail-stop handles it).
fn join<T>(h: std::thread::ScopedJoinHandle<'_, Result<T>>) -> Result<T> {
    match h.join() {
        Ok(r) => r,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stripes_spread_over_pgs_densely_and_the_rotation_is_per_volume() {
        for rotation in [0u64, 5, u64::MAX] {
            let mut next_local = [0u64; 4];
            for s in 0..40 {
                let (pg, local) = stripe_pg(rotation, s, 4);
                assert_eq!(local, next_local[pg as usize], "dense local stripes");
                next_local[pg as usize] += 1;
            }
            assert_eq!(next_local, [10; 4]);
        }
        assert_ne!(stripe_pg(0, 0, 4).0, stripe_pg(1, 0, 4).0);
    }
}
