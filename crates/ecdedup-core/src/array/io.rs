//! The array's read and write paths.
//!
//! A request is cut at stripe boundaries; each piece runs under its stripe
//! lock (a read over several stripes, or a write of whole stripes, takes
//! up to 16 stripes' locks together, in lock order, and goes to the devices
//! in one batch). Reads fetch the data unit's blocks and check each
//! block's CRC32C; a block on a failed device, or one whose checksum does
//! not match, is decoded from the other units of its row (and written back
//! when its device is healthy). Writes pick, per stripe piece:
//! - full-stripe / reconstruct-write (RCW): read the data blocks of the
//!   touched rows that the write does not cover, encode parity;
//! - read-modify-write (RMW): read the old data and parity of the touched
//!   rows, fold `old ^ new` into parity with ISA-L's delta update;
//!   whichever reads fewer blocks (ties go to RMW). A stripe with a member
//!   out of service always takes RCW, which decodes what it cannot read.

use super::logging::MarkParity;
use super::store::{ChunkOp, ChunkReply, ChunkRequest, ChunkTransport};
use super::{Array, IntentLog};
use crate::counters::{bump, IoClass};
use crate::error::{Error, Result};
use crate::media;
use crate::media::remote::{within, Scope};
use crate::media::storage::ScratchBuf;
use std::ops::Range;
use std::sync::Arc;

/// The outcome of a parity journal's sync, and on failure the stripes it
/// holds records for.
type JournalSynced = std::result::Result<(), (std::io::Error, Vec<u64>)>;

/// One data unit's share of a stripe write.
pub(super) struct UnitWrite<'a> {
    pub(super) role: usize,
    /// Byte offset inside the unit.
    pub(super) offset: u64,
    pub(super) bytes: &'a [u8],
}

impl UnitWrite<'_> {
    pub(super) fn blocks(&self, block: u64) -> Range<u64> {
        self.offset / block..(self.offset + self.bytes.len() as u64).div_ceil(block)
    }
    /// Blocks the write overwrites completely.
    pub(super) fn covered(&self, block: u64) -> Range<u64> {
        let end = self.offset + self.bytes.len() as u64;
        let start = self.offset.div_ceil(block);
        let stop = end / block;
        start..stop.max(start)
    }
}

/// A stripe piece of a write request: (stripe, offset in the stripe's
/// data, length, offset in the request's buffer).
type Piece = (u64, u64, usize, usize);

/// Most whole stripes of one request written in one batch (their locks
/// held together); a larger request is written in groups of this many.
pub(super) const WHOLE_STRIPES_BATCH_MAX: usize = 16;

pub(super) fn class_of(role: usize, k: usize) -> IoClass {
    if role < k {
        IoClass::Data
    } else {
        IoClass::Parity
    }
}

/// Merges block ranges into sorted, disjoint runs.
fn runs(mut ranges: Vec<Range<u64>>) -> Vec<Range<u64>> {
    ranges.sort_by_key(|r| r.start);
    let mut out: Vec<Range<u64>> = Vec::new();
    for r in ranges {
        match out.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

fn len_of(r: &Range<u64>) -> u64 {
    r.end - r.start
}

/// `a - b` for ranges, as up to two ranges.
fn subtract(a: Range<u64>, b: &Range<u64>) -> Vec<Range<u64>> {
    let mut out = Vec::new();
    if b.start >= b.end || b.end <= a.start || b.start >= a.end {
        out.push(a);
        return out;
    }
    if a.start < b.start {
        out.push(a.start..b.start);
    }
    if b.end < a.end {
        out.push(b.end..a.end);
    }
    out
}

impl Array {
    /// Splits `[offset, offset+len)` of the volume into stripe pieces:
    /// (stripe, offset in the stripe's data, length).
    fn pieces(&self, offset: u64, len: u64) -> impl Iterator<Item = (u64, u64, u64)> {
        let sd = self.geo.stripe_data_bytes();
        let mut pos = offset;
        let end = offset + len;
        std::iter::from_fn(move || {
            if pos >= end {
                return None;
            }
            let stripe = pos / sd;
            let within = pos % sd;
            let n = (sd - within).min(end - pos);
            pos += n;
            Some((stripe, within, n))
        })
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.volume_bytes => Ok(()),
            _ => Err(Error::OutOfRange {
                offset,
                length: len,
                size: self.volume_bytes,
            }),
        }
    }

    /// [`Array::check_range`] for a write: also within the written extent
    /// ([`Array::set_written_extent`]), past which nothing is ever written
    /// (a rebuild leaves it zeroes on the new member).
    fn check_write_range(&self, offset: u64, len: u64) -> Result<()> {
        self.check_range(offset, len)?;
        let extent = self
            .written_extent
            .load(std::sync::atomic::Ordering::SeqCst)
            * self.geo.stripe_data_bytes();
        match offset + len <= extent {
            true => Ok(()),
            false => Err(Error::OutOfRange {
                offset,
                length: len,
                size: extent,
            }),
        }
    }

    pub(super) fn lock_index(stripe: u64) -> usize {
        (stripe % super::STRIPE_LOCKS as u64) as usize
    }

    pub fn read(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.check_range(offset, buf.len() as u64)?;
        bump(&self.counters.array.client_reads);
        self.counters
            .array
            .add(&self.counters.array.client_read_bytes, buf.len() as u64);
        let pieces: Vec<(u64, u64, u64)> = self.pieces(offset, buf.len() as u64).collect();
        let read = self.read_all_pieces(&pieces, buf);
        self.sync_for_table_pages();
        read
    }

    fn read_all_pieces(&self, pieces: &[(u64, u64, u64)], buf: &mut [u8]) -> Result<()> {
        if pieces.len() == 1 {
            return self.read_pieces(pieces, buf);
        }
        // A request over several stripes (a sequential read) reads every
        // unit of a group of them in one batch, so each device has the
        // request's reads in flight at once, not one stripe after another.
        let mut done = 0usize;
        for group in pieces.chunks(WHOLE_STRIPES_BATCH_MAX) {
            let len: usize = group.iter().map(|&(_, _, n)| n as usize).sum();
            let out = &mut buf[done..done + len];
            match self.read_stripes(group, out) {
                // A decode needs a replay: stripe by stripe, which replays.
                Err(Error::NeedsReplay(_)) => self.read_pieces(group, out)?,
                r => r?,
            }
            done += len;
        }
        Ok(())
    }

    /// Reads stripe pieces (stripe, offset in its data, length) into `out`,
    /// one stripe after another, each under its lock; replays a stripe
    /// whose decode needs it.
    fn read_pieces(&self, pieces: &[(u64, u64, u64)], out: &mut [u8]) -> Result<()> {
        let mut done = 0usize;
        for &(stripe, within, n) in pieces {
            let out = &mut out[done..done + n as usize];
            loop {
                let r = {
                    let _g = self.locks[Self::lock_index(stripe)].read().unwrap();
                    self.read_stripe(stripe, within, out)
                };
                match r {
                    // A decode needs parity that a journal has not reached
                    // yet: replay under the exclusive lock, then read again.
                    Err(Error::NeedsReplay(s)) => {
                        let _g = self.locks[Self::lock_index(s)].write().unwrap();
                        self.replay_stripe(s)?;
                    }
                    r => break r?,
                }
            }
            done += n as usize;
        }
        Ok(())
    }

    /// The units a read of `n` bytes at `within` of a stripe's data needs:
    /// per unit (role, blocks, first byte wanted in the blocks, bytes
    /// wanted).
    fn read_parts(&self, within: u64, n: usize) -> Vec<(usize, Range<u64>, usize, usize)> {
        let unit = self.geo.unit_bytes();
        let block = self.geo.block();
        let mut parts = Vec::new();
        let mut pos = within;
        let mut done = 0usize;
        while done < n {
            let role = (pos / unit) as usize;
            let in_unit = pos % unit;
            let len = (unit - in_unit).min((n - done) as u64) as usize;
            let b0 = in_unit / block;
            let b1 = (in_unit + len as u64).div_ceil(block);
            parts.push((role, b0..b1, (in_unit - b0 * block) as usize, len));
            done += len;
            pos += len as u64;
        }
        parts
    }

    /// Reads `out.len()` bytes at `within` of the stripe's data: the blocks
    /// of every unit the range touches, in one batch.
    fn read_stripe(&self, stripe: u64, within: u64, out: &mut [u8]) -> Result<()> {
        self.read_stripes(&[(stripe, within, out.len() as u64)], out)
    }

    /// Reads stripe pieces (stripe, offset in its data, length) into `out`:
    /// their locks taken shared in lock order (none when the caller holds
    /// the only stripe's), every unit they touch read in one batch.
    fn read_stripes(&self, pieces: &[(u64, u64, u64)], out: &mut [u8]) -> Result<()> {
        let _guards: Vec<_> = if pieces.len() > 1 {
            let mut order: Vec<usize> = pieces.iter().map(|p| Self::lock_index(p.0)).collect();
            order.sort_unstable();
            order.dedup();
            order
                .iter()
                .map(|&i| self.locks[i].read().unwrap())
                .collect()
        } else {
            Vec::new()
        };
        let mut wants: Vec<(u64, usize, Range<u64>)> = Vec::new();
        let mut copies: Vec<(usize, usize)> = Vec::new();
        for &(stripe, within, n) in pieces {
            for (role, blocks, skip, len) in self.read_parts(within, n as usize) {
                self.refuse_poisoned(stripe, role, blocks.clone())?;
                wants.push((stripe, role, blocks));
                copies.push((skip, len));
            }
        }
        let mut done = 0usize;
        for (blocks, &(skip, n)) in self.read_units_of(&wants)?.iter().zip(&copies) {
            out[done..done + n].copy_from_slice(&blocks[skip..skip + n]);
            done += n;
        }
        Ok(())
    }

    /// A client's read or partial-block write of `rows` of data role
    /// `role` of `stripe` that touches a poisoned block: an I/O error (the
    /// block's content is unknown; its unit holds a placeholder).
    fn refuse_poisoned(&self, stripe: u64, role: usize, rows: Range<u64>) -> Result<()> {
        match self.poison.first_in(stripe, role, rows) {
            None => Ok(()),
            Some(row) => {
                bump(&self.counters.array.poisoned_reads);
                Err(Error::DataLoss(format!(
                    "stripe {stripe} unit {role} block row {row} is poisoned: an unclean stop \
                     with a member lost before resync left its content unknowable (it reads as \
                     an I/O error until written whole; docs/write-hole.md)"
                )))
            }
        }
    }

    /// Before a write of `n` bytes at `within` of `stripe`'s data: a block
    /// it covers only in part that is poisoned refuses the write (the rest
    /// of the block is unknown). Returns the whole blocks it covers, per
    /// data role, whose poison the write ends once it succeeded.
    fn poison_covered(&self, stripe: u64, within: u64, n: u64) -> Result<Vec<(usize, Range<u64>)>> {
        if self.poison.is_empty() {
            return Ok(Vec::new());
        }
        let block = self.geo.block();
        let mut whole = Vec::new();
        for (role, blocks, skip, len) in self.read_parts(within, n as usize) {
            let first_whole = blocks.start + u64::from(skip != 0);
            let end = skip as u64 + len as u64;
            let last_whole = blocks.start + end / block;
            for row in blocks.clone() {
                if row < first_whole || row >= last_whole {
                    self.refuse_poisoned(stripe, role, row..row + 1)?;
                }
            }
            if first_whole < last_whole {
                whole.push((role, first_whole..last_whole));
            }
        }
        Ok(whole)
    }

    /// Reads blocks of one unit, verified; decodes what is missing or bad.
    /// Caller holds the stripe lock.
    pub(super) fn read_unit_blocks(
        &self,
        stripe: u64,
        role: usize,
        blocks: Range<u64>,
    ) -> Result<Vec<u8>> {
        let g = &self.geo;
        let block = g.block() as usize;
        let place = g.place(stripe, role);
        let mut out = vec![0u8; len_of(&blocks) as usize * block];
        let mut bad = Vec::new();
        if self.holds(place.device, stripe)
            && self.dev_read(
                place.device,
                class_of(role, g.k()),
                &mut out,
                g.device_offset(place.row, blocks.start),
            )
        {
            for (j, b) in blocks.clone().enumerate() {
                let bytes = &out[j * block..(j + 1) * block];
                if !self.stores[place.device].block_matches(g.checksum_index(place.row, b), bytes) {
                    bump(&self.counters.array.checksum_mismatches);
                    bad.push(b);
                }
            }
        } else {
            bad.extend(blocks.clone());
        }
        for b in bad {
            let row = self.reconstruct_row(stripe, b)?;
            let j = (b - blocks.start) as usize;
            out[j * block..(j + 1) * block].copy_from_slice(&row[role]);
        }
        Ok(out)
    }

    /// Decodes block row `b` of `stripe` from every readable, verified unit,
    /// checked (`array/decode.rs`); rewrites units whose device is healthy
    /// but whose block was wrong. Caller holds the stripe lock.
    pub(super) fn reconstruct_row(&self, stripe: u64, b: u64) -> Result<Vec<Vec<u8>>> {
        Ok(self.decode_row(stripe, b, true)?.shards)
    }

    /// Reads from a device, counting; an error fails the device. Returns
    /// false when nothing was read.
    pub(super) fn dev_read(&self, d: usize, class: IoClass, buf: &mut [u8], offset: u64) -> bool {
        let op = ChunkOp::Read {
            buf,
            offset,
            class,
            check: None,
            stripe: None,
        };
        let mut reqs = [ChunkRequest::new(d, op)];
        self.submit(&mut reqs);
        let [req] = reqs;
        match req.reply {
            ChunkReply::Done => true,
            ChunkReply::Failed(e) => {
                self.note_read_error(d, &e);
                false
            }
            ChunkReply::Mismatch | ChunkReply::Unavailable => false,
        }
    }

    /// Reads whole units of `stripe` (the `roles` given) in one batch,
    /// unverified: None for a unit whose device does not hold the stripe
    /// or whose read failed (noted as [`Array::dev_read`] notes it). One
    /// round trip for the lot where the members are across the network,
    /// not one per unit.
    pub(super) fn read_units_raw(&self, stripe: u64, roles: &[usize]) -> Vec<Option<Vec<u8>>> {
        let wants: Vec<(u64, usize)> = roles.iter().map(|&role| (stripe, role)).collect();
        self.read_stripe_units_raw(&wants)
    }

    /// As [`Self::read_units_raw`] for units of several stripes
    /// (stripe, role), all in one batch.
    pub(super) fn read_stripe_units_raw(&self, wants: &[(u64, usize)]) -> Vec<Option<Vec<u8>>> {
        let g = &self.geo;
        let held: Vec<bool> = wants
            .iter()
            .map(|&(stripe, role)| self.holds(g.place(stripe, role).device, stripe))
            .collect();
        let mut bufs: Vec<Vec<u8>> = held
            .iter()
            .map(|&h| {
                if h {
                    vec![0u8; g.unit_bytes() as usize]
                } else {
                    Vec::new()
                }
            })
            .collect();
        let reqs: Vec<ChunkRequest> = bufs
            .iter_mut()
            .zip(wants)
            .zip(&held)
            .filter(|(_, &h)| h)
            .map(|((buf, &(stripe, role)), _)| {
                let place = g.place(stripe, role);
                let op = ChunkOp::Read {
                    buf: &mut buf[..],
                    offset: g.device_offset(place.row, 0),
                    class: class_of(role, g.k()),
                    check: None,
                    stripe: None,
                };
                ChunkRequest::new(place.device, op)
            })
            .collect();
        let mut took = self.submit_reads(reqs).into_iter();
        bufs.into_iter()
            .zip(held)
            .map(|(buf, h)| (h && took.next().unwrap_or(false)).then_some(buf))
            .collect()
    }

    /// Submits a batch of reads; per read, whether it took (a failure is
    /// noted: a medium error, or the device latched failed).
    pub(super) fn submit_reads(&self, mut reqs: Vec<ChunkRequest<'_>>) -> Vec<bool> {
        self.submit(&mut reqs);
        reqs.into_iter()
            .map(|req| match req.reply {
                ChunkReply::Done => true,
                ChunkReply::Failed(e) => {
                    self.note_read_error(req.store, &e);
                    false
                }
                ChunkReply::Mismatch | ChunkReply::Unavailable => false,
            })
            .collect()
    }

    /// Runs a batch of requests to the chunk stores (every device's I/O in
    /// one submission) and counts what it cost.
    pub(super) fn submit(&self, reqs: &mut [ChunkRequest<'_>]) {
        let cost = self.stores.as_slice().submit(reqs);
        self.count_batch(cost);
    }

    /// Counts a batch's submissions, system calls and ring entries.
    fn count_batch(&self, cost: media::batch::BatchCost) {
        let a = &self.counters.array;
        a.add(&a.device_submissions, cost.submissions);
        a.add(&a.device_syscalls, cost.syscalls);
        a.add(&a.device_ring_entries, cost.ring_entries);
    }

    /// Reads units of a stripe (role, blocks) in one batch: as
    /// [`Array::read_units_of`].
    fn read_units(&self, stripe: u64, wants: &[(usize, Range<u64>)]) -> Result<Vec<ScratchBuf>> {
        let wants: Vec<(u64, usize, Range<u64>)> = wants
            .iter()
            .map(|(role, blocks)| (stripe, *role, blocks.clone()))
            .collect();
        self.read_units_of(&wants)
    }

    /// Reads units (stripe, role, blocks) in one batch, into pooled aligned
    /// buffers (no bounce copy under `O_DIRECT`), each checked against its
    /// checksums at its store; a unit whose device is out, fails or returns
    /// a bad block is read again through [`Array::read_unit_blocks`], which
    /// decodes what it cannot read. Caller holds the stripes' locks.
    fn read_units_of(&self, wants: &[(u64, usize, Range<u64>)]) -> Result<Vec<ScratchBuf>> {
        let g = &self.geo;
        let block = g.block() as usize;
        // Every byte is overwritten below: by the read, or by the decode of
        // a unit whose read did not take.
        let mut out: Vec<ScratchBuf> = wants
            .iter()
            .map(|(_, _, blocks)| ScratchBuf::new(len_of(blocks) as usize * block))
            .collect();
        let reqs: Vec<ChunkRequest> = out
            .iter_mut()
            .zip(wants)
            .map(|(buf, (stripe, role, blocks))| {
                let place = g.place(*stripe, *role);
                let op = ChunkOp::Read {
                    buf: &mut buf[..],
                    offset: g.device_offset(place.row, blocks.start),
                    class: class_of(*role, g.k()),
                    check: Some(g.checksum_index(place.row, blocks.start)),
                    stripe: Some(*stripe),
                };
                ChunkRequest::new(place.device, op)
            })
            .collect();
        let good = self.submit_reads(reqs);
        for (i, (stripe, role, blocks)) in wants.iter().enumerate() {
            if !good[i] {
                out[i].copy_from_slice(&self.read_unit_blocks(*stripe, *role, blocks.clone())?);
            }
        }
        Ok(out)
    }

    /// Writes units (stripe, role, first block, bytes) in one batch, their
    /// checksums recorded by their stores; skips devices that do not hold
    /// a unit's stripe. Returns, per unit, whether its device took the
    /// write.
    pub(super) fn write_units(
        &self,
        units: &[(u64, usize, u64, &[u8])],
        repair: bool,
    ) -> Vec<bool> {
        self.write_units_with(units, repair, Vec::new()).0
    }

    /// As `write_units`, with `beside` (parity-journal appends) in the
    /// same batch; returns their replies too, in order.
    pub(super) fn write_units_with<'a>(
        &self,
        units: &[(u64, usize, u64, &'a [u8])],
        repair: bool,
        beside: Vec<ChunkRequest<'a>>,
    ) -> (Vec<bool>, Vec<ChunkReply>) {
        let g = &self.geo;
        let mut reqs: Vec<ChunkRequest> = units
            .iter()
            .map(|&(stripe, role, b, bytes)| {
                let place = g.place(stripe, role);
                let hint = crate::media::WriteHint {
                    class: class_of(role, g.k()),
                    repair,
                    // Decided below the array, by a PlacementDevice if stacked.
                    stream: crate::media::Stream::Unknown,
                };
                let op = ChunkOp::Write {
                    buf: bytes,
                    offset: g.device_offset(place.row, b),
                    first: g.checksum_index(place.row, b),
                    stripe,
                    hint,
                    fua: false,
                };
                ChunkRequest::new(place.device, op)
            })
            .collect();
        reqs.extend(beside);
        self.submit(&mut reqs);
        let beside: Vec<ChunkReply> = reqs.drain(units.len()..).map(|r| r.reply).collect();
        let written = reqs
            .into_iter()
            .zip(units)
            .map(|(req, &(stripe, role, b, bytes))| match req.reply {
                ChunkReply::Done => true,
                ChunkReply::Failed(e) => self.note_unit_write_error(stripe, role, b, bytes, e),
                ChunkReply::Unavailable | ChunkReply::Mismatch => {
                    self.note_logical_unit(stripe, role, b, bytes);
                    false
                }
            })
            .collect();
        (written, beside)
    }

    /// Handles a unit write's error (a full file system is noted, any
    /// other error latched). Returns false: the write did not take.
    fn note_unit_write_error(
        &self,
        stripe: u64,
        role: usize,
        b: u64,
        bytes: &[u8],
        e: std::io::Error,
    ) -> bool {
        let place = self.geo.place(stripe, role);
        if Self::is_space_error(&e) {
            self.note_space_error(place.device, stripe, &e);
        } else {
            self.latch_failure(place.device, "write", &e);
            self.note_logical_unit(stripe, role, b, bytes);
        }
        false
    }

    /// A unit write that no device took: what the unit holds from now on,
    /// logically, for checking its decode later (`array/decode.rs`).
    fn note_logical_unit(&self, stripe: u64, role: usize, b: u64, bytes: &[u8]) {
        let g = &self.geo;
        let place = g.place(stripe, role);
        for (j, chunk) in bytes.chunks_exact(g.block() as usize).enumerate() {
            self.note_logical_crc(
                place.device,
                g.checksum_index(place.row, b + j as u64),
                crate::codec::crc32c(chunk),
            );
        }
    }

    /// Writes blocks of a unit starting at block `b` and records their
    /// checksums; skips a device that does not hold the stripe. Returns
    /// whether the device took the write.
    pub(super) fn write_unit_blocks(&self, stripe: u64, role: usize, b: u64, bytes: &[u8]) -> bool {
        self.write_unit_blocks_as(stripe, role, b, bytes, false)
    }

    /// As `write_unit_blocks`; `repair` says the bytes replace corrupt content.
    pub(super) fn write_unit_blocks_as(
        &self,
        stripe: u64,
        role: usize,
        b: u64,
        bytes: &[u8],
        repair: bool,
    ) -> bool {
        self.write_units(&[(stripe, role, b, bytes)], repair)[0]
    }

    pub(super) fn intent_begin(&self, stripe: u64) -> Result<()> {
        match self.intent.begin(stripe) {
            Ok(marked) => {
                if marked {
                    bump(&self.counters.array.intent_marks);
                }
                // A mirrored copy of the map that missed the mark (format
                // 2) is its device's failure, on the superblocks before
                // the stripe is written: left in service until the next
                // flush, its copy, first in read order, was read at the
                // next open without the mark, the stripe was not
                // resynchronised, and every member's checksum entry of
                // the write in flight disagreed with its block (cluster
                // simulator seed 1116: a block unreadable, "0 of 6 units
                // intact").
                self.fail_broken_metadata_copies();
                Ok(())
            }
            Err(e) => Err(Error::io(
                "marking the write-intent log (the array folder's disk failed?)",
                e,
            )),
        }
    }

    pub fn write(&self, buf: &[u8], offset: u64, fua: bool) -> Result<()> {
        self.check_write_range(offset, buf.len() as u64)?;
        self.check_space()?;
        let space_errors = self.space_errors.load(std::sync::atomic::Ordering::SeqCst);
        bump(&self.counters.array.client_writes);
        self.note_write();
        self.counters
            .array
            .add(&self.counters.array.client_write_bytes, buf.len() as u64);
        let mut pieces: Vec<Piece> = Vec::new();
        let mut done = 0usize;
        for (stripe, within, n) in self.pieces(offset, buf.len() as u64) {
            pieces.push((stripe, within, n as usize, done));
            done += n as usize;
        }
        let one = |&(stripe, within, n, at): &Piece| -> Result<()> {
            let _g = self.locks[Self::lock_index(stripe)].write().unwrap();
            self.write_piece(stripe, within, &buf[at..at + n])
        };
        // Whole stripes (a sequential copy) go to the devices in one
        // batch per group, every unit of every stripe at once, so one
        // request keeps every device busy without a thread of its own.
        // Other pieces are written one stripe after another, each stripe's
        // reads in one batch and its writes in another. On an error,
        // stripes already written stay written, and the request fails.
        let sd = self.geo.stripe_data_bytes();
        let whole = pieces.len() > 1 && pieces.iter().all(|&(_, w, n, _)| w == 0 && n as u64 == sd);
        if whole {
            for group in pieces.chunks(WHOLE_STRIPES_BATCH_MAX) {
                self.write_whole_stripes(group, buf, &one)?;
            }
        } else {
            pieces.iter().try_for_each(one)?;
        }
        if self.space_errors.load(std::sync::atomic::Ordering::SeqCst) != space_errors {
            return Err(Error::NoSpace(
                "the file system under the array filled during this write; free space, \
                 then write again"
                    .into(),
            ));
        }
        if fua {
            self.make_durable()?;
        } else {
            self.sync_for_table_pages();
        }
        Ok(())
    }

    /// Where a checksum table over its bound could evict none of its dirty
    /// pages (their entries' writes not yet durable on every device:
    /// `checksum::SyncEpochs`), every device synced now, as for a FUA
    /// write, so that they may go; called at the end of a request (no
    /// stripe lock held), a read's too (a read pages entries in). An error
    /// here is latched and told by the next flush.
    fn sync_for_table_pages(&self) {
        if self.sync_epochs.take_wanted() {
            bump(&self.counters.array.table_page_syncs);
            let _ = self.make_everything_durable();
        }
    }

    /// Writes `bytes` at `within` of `stripe`, the stripe's lock held by
    /// the caller: its intent marked, the write as the policy has it, and
    /// the poison of every block it covers whole ended.
    pub(super) fn write_piece(&self, stripe: u64, within: u64, bytes: &[u8]) -> Result<()> {
        let whole = self.poison_covered(stripe, within, bytes.len() as u64)?;
        self.intent_begin(stripe)?;
        let r = self.with_replay(|| self.write_stripe(stripe, within, bytes));
        self.intent.end(stripe);
        if r.is_ok() {
            for (role, rows) in whole {
                self.poison.written(stripe, role, rows);
            }
        }
        r
    }

    /// Writes whole stripes (stripe, 0, stripe bytes, offset in `buf`) of
    /// one request: their locks taken in lock order, their intents marked,
    /// parity encoded, and every unit written in one batch. A group with a
    /// degraded stripe or pending journal records goes stripe by stripe
    /// through `one` instead, as does one a member failed out of while its
    /// intents were marked.
    fn write_whole_stripes(
        &self,
        group: &[Piece],
        buf: &[u8],
        one: &dyn Fn(&Piece) -> Result<()>,
    ) -> Result<()> {
        let g = &self.geo;
        let unit = g.unit_bytes() as usize;
        let mut order: Vec<usize> = group.iter().map(|p| Self::lock_index(p.0)).collect();
        order.sort_unstable();
        order.dedup();
        let plain = {
            let _guards: Vec<_> = order
                .iter()
                .map(|&i| self.locks[i].write().unwrap())
                .collect();
            group
                .iter()
                .all(|&(s, ..)| !self.degraded(s) && !self.journal_pending(s))
                .then(|| {
                    let mut begun = Vec::with_capacity(group.len());
                    let r = (|| {
                        for &(stripe, ..) in group {
                            self.intent_begin(stripe)?;
                            begun.push(stripe);
                        }
                        // A member can fail at the intent marks (its copy
                        // of intent.map, a sync): the group is degraded
                        // now, and written whole from here its missing
                        // units would live only in parity with no record
                        // of their values, so a cut before the next flush
                        // that kept some units and dropped others decoded
                        // them wrong (the cluster simulator's seed 78975).
                        // Its stripes take the degraded path instead,
                        // which logs those values before any device write.
                        if group.iter().any(|&(s, ..)| self.degraded(s)) {
                            return Ok(false);
                        }
                        for &(stripe, ..) in group {
                            self.forget_degraded_records(stripe)?;
                        }
                        // Parity into pooled aligned buffers: the encode
                        // writes every byte, the devices take them as they are.
                        let parity: Vec<Vec<ScratchBuf>> = group
                            .iter()
                            .map(|&(_, _, n, at)| {
                                let d: Vec<&[u8]> = buf[at..at + n].chunks(unit).collect();
                                let mut p: Vec<ScratchBuf> =
                                    (0..g.m()).map(|_| ScratchBuf::new(unit)).collect();
                                let mut refs: Vec<&mut [u8]> =
                                    p.iter_mut().map(|v| &mut v[..]).collect();
                                self.codec.encode(&d, &mut refs);
                                p
                            })
                            .collect();
                        let mut units = Vec::with_capacity(group.len() * g.width());
                        for (&(stripe, _, n, at), p) in group.iter().zip(&parity) {
                            for (role, bytes) in buf[at..at + n].chunks(unit).enumerate() {
                                units.push((stripe, role, 0, bytes));
                            }
                            for (j, bytes) in p.iter().enumerate() {
                                units.push((stripe, g.k() + j, 0, &bytes[..]));
                            }
                            bump(&self.counters.array.full_stripe_writes);
                        }
                        self.write_units(&units, false);
                        self.check_available().map(|()| true)
                    })();
                    for stripe in begun {
                        self.intent.end(stripe);
                    }
                    r
                })
        };
        match plain {
            Some(Ok(true)) => {
                for &(stripe, ..) in group {
                    for role in 0..g.k() {
                        self.poison.written(stripe, role, 0..g.blocks_per_unit());
                    }
                }
                Ok(())
            }
            Some(Err(e)) => Err(e),
            Some(Ok(false)) | None => group.iter().try_for_each(one),
        }
    }

    /// Whether a device of the stripe is out of service.
    pub(super) fn degraded(&self, stripe: u64) -> bool {
        let g = &self.geo;
        (0..g.width()).any(|r| !self.holds(g.place(stripe, r).device, stripe))
    }

    /// Writes zeroes; whole stripes are discarded on the media instead.
    pub fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<()> {
        self.check_write_range(offset, len)?;
        self.check_space()?;
        let space_errors = self.space_errors.load(std::sync::atomic::Ordering::SeqCst);
        let sd = self.geo.stripe_data_bytes();
        let zeroes = vec![0u8; sd.min(len) as usize];
        for (stripe, within, n) in self.pieces(offset, len) {
            let _g = self.locks[Self::lock_index(stripe)].write().unwrap();
            let whole = self.poison_covered(stripe, within, n)?;
            self.intent_begin(stripe)?;
            let r = if n == sd {
                // A discarded stripe's parity is zeroes.
                let rows = self.geo.blocks_per_unit();
                // The marks held until the discards are answered.
                self.journal_invalidate_before(stripe, 0, rows, MarkParity::Zeroes)
                    .and_then(|_held| {
                        let _logged = self.log_discarded_missing_units(stripe)?;
                        self.discard_stripe(stripe)
                    })
            } else {
                self.with_replay(|| self.write_stripe(stripe, within, &zeroes[..n as usize]))
            };
            self.intent.end(stripe);
            r?;
            for (role, rows) in whole {
                self.poison.written(stripe, role, rows);
            }
        }
        if self.space_errors.load(std::sync::atomic::Ordering::SeqCst) != space_errors {
            return Err(Error::NoSpace(
                "the file system under the array filled during this request".into(),
            ));
        }
        if fua {
            self.make_durable()?;
        } else {
            self.sync_for_table_pages();
        }
        Ok(())
    }

    fn discard_stripe(&self, stripe: u64) -> Result<()> {
        let g = &self.geo;
        // Held until every member is discarded: the record of the missing
        // data units' zeroes made when a member fails midway.
        let mut _logged = None;
        for role in 0..g.width() {
            let place = g.place(stripe, role);
            let zero_logical = || {
                for b in 0..g.blocks_per_unit() {
                    let index = g.checksum_index(place.row, b);
                    self.note_logical_crc(
                        place.device,
                        index,
                        super::checksum::zero_block_crc(g.block() as usize),
                    );
                }
            };
            let discarded = match self.holds(place.device, stripe) {
                true => self.stores[place.device].discard(
                    g.device_offset(place.row, 0),
                    g.unit_bytes(),
                    g.checksum_index(place.row, 0),
                ),
                false => None,
            };
            match discarded {
                Some(Ok(())) => {}
                Some(Err(e)) => {
                    self.latch_failure(place.device, "discard", &e);
                    zero_logical();
                    // The failure synced every device (its superblocks):
                    // the members discarded so far are durable. Those after
                    // it are discarded with this one missing, a degraded
                    // write: its zeroes are logged first, as any degraded
                    // write's values are. Unlogged, a cut that tore the
                    // later discards left rows that the open took for
                    // untorn (the member was out before it), and the
                    // missing unit decoded unchecked from old and new
                    // members (the cluster simulator's seed 393759).
                    if role + 1 < g.width() && role < g.k() {
                        _logged = self.log_discarded_missing_units(stripe)?;
                    }
                }
                None => zero_logical(),
            }
        }
        bump(&self.counters.array.discarded_stripes);
        self.check_available()
    }

    fn check_available(&self) -> Result<()> {
        let down = self.unavailable_count();
        if down > self.geo.m() {
            return Err(Error::Unavailable(format!(
                "{down} devices failed; RS({},{}) survives at most {}",
                self.geo.k, self.geo.m, self.geo.m
            )));
        }
        Ok(())
    }

    /// Writes `bytes` at `within` of the stripe's data. Caller holds the
    /// stripe lock exclusively and has marked the intent.
    fn write_stripe(&self, stripe: u64, within: u64, bytes: &[u8]) -> Result<()> {
        let g = &self.geo;
        let unit = g.unit_bytes();
        let block = g.block();
        let mut writes = Vec::new();
        let mut pos = within;
        let mut done = 0usize;
        while done < bytes.len() {
            let role = (pos / unit) as usize;
            let offset = pos % unit;
            let n = (unit - offset).min((bytes.len() - done) as u64) as usize;
            writes.push(UnitWrite {
                role,
                offset,
                bytes: &bytes[done..done + n],
            });
            done += n;
            pos += n as u64;
        }
        let rows = runs(writes.iter().map(|w| w.blocks(block)).collect());
        let degraded = self.degraded(stripe);
        let rmw_reads: u64 = writes.iter().map(|w| len_of(&w.blocks(block))).sum::<u64>()
            + g.m() as u64 * rows.iter().map(len_of).sum::<u64>();
        let rcw_reads: u64 = rows
            .iter()
            .map(|run| {
                (0..g.k())
                    .map(|role| match writes.iter().find(|w| w.role == role) {
                        Some(w) => subtract(run.clone(), &w.covered(block))
                            .iter()
                            .map(len_of)
                            .sum(),
                        None => len_of(run),
                    })
                    .sum::<u64>()
            })
            .sum();
        let partial = rcw_reads > 0;
        if !degraded {
            // Records logged while the stripe was degraded no longer
            // describe it once it is written with every device in service.
            self.forget_degraded_records(stripe)?;
        }
        if self.write_policy.journals()
            && partial
            && !degraded
            && self.journal_write(stripe, &writes)?
        {
            return self.check_available();
        }
        // A member may have failed during the journal's attempt (at its
        // reads), which then left the write to the degraded path.
        let degraded = degraded || self.degraded(stripe);
        // The marks of a whole-stripe write, held out of every journal sync
        // until its writes below are answered.
        let mut _held = None;
        if self.journal_pending(stripe) {
            let whole = within == 0 && bytes.len() as u64 == g.stripe_data_bytes();
            if whole && !degraded {
                // Parity is about to be encoded from the new data alone;
                // the marks carry its checksums (an extra encode, only
                // where the stripe's journals hold records).
                let units: Vec<&[u8]> = bytes.chunks_exact(g.unit_bytes() as usize).collect();
                let parity = self.encode_data(&units);
                let parity = MarkParity::Units(&parity);
                _held =
                    Some(self.journal_invalidate_before(stripe, 0, g.blocks_per_unit(), parity)?);
            } else {
                self.replay_stripe(stripe)?;
            }
        }
        let result = if degraded {
            bump(&self.counters.array.degraded_writes);
            self.reconstruct_write(stripe, &writes, &rows)
        } else if rcw_reads == 0 {
            bump(&self.counters.array.full_stripe_writes);
            self.reconstruct_write(stripe, &writes, &rows)
        } else if rmw_reads <= rcw_reads {
            bump(&self.counters.array.rmw_writes);
            self.read_modify_write(stripe, &writes, &rows)
        } else {
            bump(&self.counters.array.rcw_writes);
            self.reconstruct_write(stripe, &writes, &rows)
        };
        result?;
        self.check_available()
    }

    fn reconstruct_write(
        &self,
        stripe: u64,
        writes: &[UnitWrite],
        rows: &[Range<u64>],
    ) -> Result<()> {
        let g = &self.geo;
        let block = g.block();
        for run in rows {
            let run_bytes = (len_of(run) * block) as usize;
            // The blocks of the run that the write does not cover, of every
            // data unit, read in one batch (none for a full stripe).
            let mut need = Vec::new();
            for role in 0..g.k() {
                let parts = match writes.iter().find(|w| w.role == role) {
                    Some(w) => subtract(run.clone(), &w.covered(block)),
                    None => vec![run.clone()],
                };
                need.extend(parts.into_iter().map(|part| (role, part)));
            }
            let old = self.read_units(stripe, &need)?;
            let mut data = vec![vec![0u8; run_bytes]; g.k()];
            for ((role, part), old) in need.iter().zip(&old) {
                let at = ((part.start - run.start) * block) as usize;
                data[*role][at..at + old.len()].copy_from_slice(old);
            }
            for w in writes {
                overlay(&mut data[w.role], run.start * block, w);
            }
            let mut parity: Vec<ScratchBuf> =
                (0..g.m()).map(|_| ScratchBuf::new(run_bytes)).collect();
            {
                let d: Vec<&[u8]> = data.iter().map(|v| v.as_slice()).collect();
                let mut p: Vec<&mut [u8]> = parity.iter_mut().map(|v| &mut v[..]).collect();
                self.codec.encode(&d, &mut p);
            }
            // Degraded: the missing units' new values are durable before
            // any device of the stripe is written (the degraded write hole).
            // (Logged again where the append itself failed a data member:
            // `Array::log_missing_rows`.)
            let _logged = self.log_missing_units(stripe, run.start, &data)?;
            // The touched data blocks and the parity of the run: one batch.
            let mut units: Vec<(u64, usize, u64, &[u8])> = Vec::with_capacity(writes.len() + g.m());
            for w in writes {
                let touched = intersect(&w.blocks(block), run);
                if touched.start < touched.end {
                    let at = ((touched.start - run.start) * block) as usize;
                    let len = (len_of(&touched) * block) as usize;
                    units.push((stripe, w.role, touched.start, &data[w.role][at..at + len]));
                }
            }
            for (j, p) in parity.iter().enumerate() {
                units.push((stripe, g.k() + j, run.start, &p[..]));
            }
            self.write_units(&units, false);
        }
        Ok(())
    }

    fn read_modify_write(
        &self,
        stripe: u64,
        writes: &[UnitWrite],
        rows: &[Range<u64>],
    ) -> Result<()> {
        let g = &self.geo;
        let block = g.block();
        // Old parity of every run and old data of every write: one batch.
        let mut wants: Vec<(usize, Range<u64>)> =
            Vec::with_capacity(rows.len() * g.m() + writes.len());
        for run in rows {
            wants.extend((0..g.m()).map(|j| (g.k() + j, run.clone())));
        }
        wants.extend(writes.iter().map(|w| (w.role, w.blocks(block))));
        let mut old = self.read_units(stripe, &wants)?;
        if !self.missing_data_roles(stripe).is_empty() {
            // A member failed at these reads (a parity member's read, and
            // the superblock write that recorded it failing a data member
            // too): the write is a degraded write now, and only the
            // degraded path logs the missing units' values before a device
            // is written. Written here, the new data block and the parity
            // were the missing unit's only account, and a cut that kept
            // one and dropped the other decoded it as neither its old nor
            // its new bytes (the cluster simulator's seed 655184: a block
            // never written read as garbage after the next open).
            bump(&self.counters.array.degraded_writes);
            return self.reconstruct_write(stripe, writes, rows);
        }
        let old_data = old.split_off(rows.len() * g.m());
        let mut parity: Vec<Vec<ScratchBuf>> = Vec::with_capacity(rows.len());
        let mut old_parity = old.into_iter();
        for _ in rows {
            parity.push(old_parity.by_ref().take(g.m()).collect());
        }
        let mut new_data = Vec::with_capacity(writes.len());
        for (w, mut new) in writes.iter().zip(old_data) {
            let blocks = w.blocks(block);
            // The old bytes become the new ones in place (an aligned
            // buffer, written as it is); the delta keeps old ^ new.
            let mut delta = new.to_vec();
            overlay(&mut new, blocks.start * block, w);
            delta.iter_mut().zip(new.iter()).for_each(|(d, b)| *d ^= b);
            let r = rows
                .iter()
                .position(|run| run.start <= blocks.start && blocks.end <= run.end)
                .expect("run covers write");
            let at = ((blocks.start - rows[r].start) * block) as usize;
            let mut p: Vec<&mut [u8]> = parity[r]
                .iter_mut()
                .map(|v| &mut v[at..at + delta.len()])
                .collect();
            self.codec.update(w.role, &delta, &mut p);
            new_data.push((w.role, blocks.start, new));
        }
        // New data and new parity: one batch.
        let mut units: Vec<(u64, usize, u64, &[u8])> = new_data
            .iter()
            .map(|(role, b, bytes)| (stripe, *role, *b, &bytes[..]))
            .collect();
        for (run, per_run) in rows.iter().zip(&parity) {
            for (j, p) in per_run.iter().enumerate() {
                units.push((stripe, g.k() + j, run.start, &p[..]));
            }
        }
        self.write_units(&units, false);
        Ok(())
    }

    /// Makes every acknowledged write durable on every device in service,
    /// then lets the intent log forget regions that went quiet.
    pub fn flush(&self) -> Result<()> {
        bump(&self.counters.array.client_flushes);
        let epoch = self.intent.start_flush();
        // Poison that writes ended before the devices' syncs below.
        let poison_ended = self.poison.ended();
        // Failed even when a step below fails: a dropped copy is stale.
        self.fail_broken_metadata_copies();
        match &self.degraded_log {
            // Its records are dropped once the devices are durable.
            Some(log) => log.checkpoint(&|| self.make_everything_durable())?,
            None => self.make_everything_durable()?,
        }
        if let Err(e) = self.poison.persist(&poison_ended) {
            // The file keeps a superset: those blocks read as I/O errors
            // again after a reopen, never as their placeholder.
            self.warn(format!(
                "{e}: blocks written since they were poisoned stay listed"
            ));
        }
        self.intent
            .finish_flush(epoch)
            .map_err(|e| Error::io("updating the write-intent log", e))
    }

    /// Every write done so far durable: the parity journals synced, then
    /// every device in service, and the failures latched meanwhile on the
    /// superblocks. What a flush and a checkpoint of the degraded-write
    /// log need; it takes no stripe lock.
    pub(super) fn make_everything_durable(&self) -> Result<()> {
        let every = vec![true; self.stores.len()];
        let space = self.sync_journals_and_devices(&every)?;
        self.fail_broken_metadata_copies();
        self.check_available()?;
        self.failures_made_durable()?;
        Self::flush_space_result(space)
    }

    /// FUA: makes durable what a request wrote: every device in service,
    /// each with its checksum pages and its parity journal, as a flush
    /// does (without ending the intent marks or the degraded-write log's
    /// generation). The intent mark of each stripe was synced before its
    /// write, and the degraded-write log syncs its own records, so after a
    /// power cut the stripes are resynced from data that is durable here.
    ///
    /// Every device, not only those of the request's stripes: a device's
    /// sync makes durable all it was written since, the blocks of other
    /// stripes' writes in flight with their checksum entries (every dirty
    /// page of the device is written). Synced on some members of such a
    /// stripe and not on others, a write in flight became durable in part,
    /// and no member left after a cut differed from its entry, which the
    /// resync takes for the sign of a write in flight there
    /// ([`Array::rows_torn_unlogged`]): with two members lost at the next
    /// open, the k left (new data beside old parity) decoded the missing
    /// units as neither their old nor their new bytes, unchecked (the
    /// cluster simulator, seed 232517 with a batched row decode; one
    /// machine, `tests/powerloss.rs`
    /// `power_loss_after_fua_writes_then_two_devices_lost_never_reads_wrong`:
    /// 160 blocks wrong in 96 cuts before, 0 in format 2 after).
    ///
    /// Each device with its journal (never a device without it): a parity
    /// written over records its journal holds (a whole-stripe write, a
    /// fold, a resync) is ended by an invalidation mark in that journal.
    /// Past the journal's last sync only a length hint covers the mark,
    /// and a commit of the metadata area's directory (a dedup log's sync
    /// within the device's) writes that hint again, unsynced: a cut then
    /// lost the mark and kept the parity and its entry, the next open
    /// found the flushed records again with nothing changed since its
    /// entries, so no rule marked the row, and a degraded replay folded
    /// them into parity that held the write that ended them (the cluster
    /// simulator's seed 177513 on 2afe4b7: blocks 80 and 82 of stripe 20
    /// decoded as neither their old nor their new bytes).
    fn make_durable(&self) -> Result<()> {
        bump(&self.counters.array.fua_syncs);
        self.make_everything_durable()
    }

    /// Makes the devices `devices` durable, each with its parity journal
    /// (never a device without its journal: [`Array::make_durable`], seed
    /// 177513); the first space error of a device, as
    /// [`Array::sync_devices`]. Format 1 syncs each journal (a file of
    /// the folder) first. Format 2 keeps each journal on its own device,
    /// which the devices' sync (one batch, one round trip to remote
    /// chunks) makes durable, and then only finishes each journal's sync
    /// (its metadata area's directory, where it changed): one sync per
    /// device, not two, and not one round trip per journal (a parix flush
    /// on six chunks after writes to one stripe: 14 round trips before
    /// 2afe4b7, 3 since 2026-11-28, counted one sender at a time;
    /// `array::tests::wire::a_flush_takes_...`).
    pub(super) fn sync_journals_and_devices(
        &self,
        devices: &[bool],
    ) -> Result<Option<std::io::Error>> {
        if self.meta.is_none() || !self.write_policy.journals() {
            // Format 1: the journals' lengths before their files' syncs,
            // recorded beside them once the devices, which hold the
            // records' data writes, are synced too (so a record below the
            // recorded length was flushed with its data, and one past it
            // is told at the next open as format 2's area tells it).
            let points: Vec<_> = (0..self.stores.len())
                .map(|d| {
                    devices[d]
                        .then(|| self.stores[d].journal_flush_point())
                        .flatten()
                })
                .collect();
            self.sync_journals_of(devices)?;
            let (space, synced, _) = self.sync_devices(devices, &[]);
            let chosen: Vec<bool> = (0..self.stores.len())
                .map(|d| synced[d] && points[d].is_some())
                .collect();
            self.sync_journals_with(&chosen, |d, store| {
                store.journal_record_flushed(points[d].expect("chosen"))
            })?;
            return Ok(space);
        }
        // What each device's sync will make durable of its journal, taken
        // before the sync is issued: an append that finishes after this
        // may reach the device after its sync, and is the next flush's.
        let points: Vec<_> = (0..self.stores.len())
            .map(|d| {
                devices[d]
                    .then(|| self.stores[d].journal_sync_point())
                    .flatten()
            })
            .collect();
        let (space, synced, finished) = self.sync_devices(devices, &points);
        // The journals whose sync the pages' messages did not finish.
        let chosen: Vec<bool> = (0..self.stores.len())
            .map(|d| devices[d] && synced[d] && finished[d].is_none())
            .collect();
        let finished = self.journal_sync_outcomes(
            finished
                .into_iter()
                .enumerate()
                .filter_map(|(d, r)| Some((d, r?))),
        );
        let rest = self.sync_journals_with(&chosen, |d, store| {
            store.journal_sync_after_device_sync(points[d].clone(), true)
        });
        finished.and(rest)?;
        Ok(space)
    }

    /// Makes the chosen devices durable: every chosen device synced (one
    /// batch: one sync's latency, not one per device), then the dirty
    /// checksum pages written and made durable (a remote chunk's as one
    /// append with FUA; a local device's writes in one batch, its sync in
    /// another). A device that fails either step is latched, except for a
    /// full file system ([`Array::note_flush_space_error`]): the device
    /// stays in service and the first such error is returned, for the
    /// flush to fail with ENOSPC. Also returns, per device, whether it was
    /// synced, and the outcome of its parity journal's sync where it was
    /// finished here (below; None: the caller finishes it).
    ///
    /// The syncs come first: an entry says its block holds what the write
    /// put there, and written durably while another member's write of the
    /// same row was still unsynced, a cut between the two could keep it
    /// and drop the other: each member left then matched its entry, the
    /// row was not one codeword, and after two members lost at the next
    /// open the k left decoded them as neither their old nor their new
    /// bytes ([`checksum::SyncEpochs`]; test
    /// `a_cut_between_a_flushs_table_pages_and_its_syncs_never_reads_wrong`).
    /// The pages are encoded before the syncs, so every entry they carry
    /// is of a write the syncs cover; an entry set meanwhile (a write
    /// completing during the syncs, which no table lock holds up) leaves
    /// its page dirty for the next flush. That costs a flush
    /// with dirty pages a second round trip to remote chunks (their pages
    /// and sync went in one message before) and a local device a second
    /// sync.
    ///
    /// `journals`: each device's parity-journal sync point, taken before
    /// the syncs (empty: none). A chunk across the network whose server
    /// takes barriers (`ChunkLink::takes_barrier`: its registration says
    /// so) and whose journal
    /// grew takes its metadata area's directory commit in the same message
    /// as its pages, after a barrier (`proto::frame::encode_append`: the
    /// chunk syncs the pages before it writes the directory, then syncs
    /// again), so a committed length still never comes ahead of the pages
    /// of the flush that made its records durable, and the commit costs no
    /// round trip of its own (a parix flush on six chunks: 3 round trips
    /// where it took 4, counted one sender at a time,
    /// `array::tests::wire::a_flush_takes_...`). The journal is held from
    /// the commit's encoding until its write is answered, as a commit
    /// holds it across its own write. Anything else (a local device, a
    /// journal in a dedup layer's or another device's area, pages and
    /// directory over one frame) leaves the journal's sync to the caller.
    fn sync_devices(
        &self,
        chosen: &[bool],
        journals: &[Option<super::journal::JournalSyncPoint>],
    ) -> (
        Option<std::io::Error>,
        Vec<bool>,
        Vec<Option<JournalSynced>>,
    ) {
        let n = self.stores.len();
        let mut synced = vec![false; n];
        let mut journal_synced: Vec<Option<JournalSynced>> = (0..n).map(|_| None).collect();
        let mut space = None;
        let mut flush_failed = |d: usize, e: std::io::Error| {
            if Self::is_space_error(&e) {
                self.note_flush_space_error(d, &e);
                space.get_or_insert(e);
            } else {
                self.latch_failure(d, "flush", &e);
            }
        };
        // A device's failure is handled (its superblocks written, its
        // journals synced) once every page is finished.
        let mut failed = Vec::new();
        let mut held = Vec::with_capacity(n);
        for d in (0..n).filter(|&d| chosen[d]) {
            match self.stores[d].dirty_checksum_pages() {
                Some((dev, Ok(pages))) => held.push((d, dev, pages)),
                Some((_, Err(e))) => failed.push((d, e)),
                None => {}
            }
        }
        // Every device in service is synced here (none out of the choice,
        // none failing): the writes of every entry set before this point
        // are then durable, and pages may be evicted with them.
        let everyone = (0..n)
            .all(|d| self.stores[d].device().is_none() || held.iter().any(|(h, _, _)| *h == d));
        let epoch = self.sync_epochs.begin_sync();
        let mut syncs: Vec<ChunkRequest> = held
            .iter()
            .map(|(d, _, _)| ChunkRequest::new(*d, ChunkOp::Sync))
            .collect();
        self.submit(&mut syncs);
        let mut outcomes: Vec<std::io::Result<()>> = syncs
            .into_iter()
            .map(|req| match req.reply {
                ChunkReply::Failed(e) => Err(e),
                _ => Ok(()),
            })
            .collect();
        if everyone && outcomes.iter().all(|o| o.is_ok()) {
            self.sync_epochs.synced(epoch);
        }
        // The grown journals of synced chunks across the network, held in
        // device order (as a replay's fold holds them), their directory
        // commits made ready to go in the pages' messages.
        // Only where the commit may go so: the chunk's server takes
        // barriers (elsewhere the journal is neither held across the
        // pages' round trip nor made ready for nothing).
        let remote_journal = |i: usize| {
            let link = held[i].1.link();
            let wanted = outcomes[i].is_ok() && link.is_some_and(|l| l.takes_barrier());
            point_if(wanted, journals, held[i].0)
        };
        let mut guards = self.hold_journals(&held, &remote_journal);
        let mut prepare_failed = Vec::new();
        let commits = prepare_commits(
            &guards,
            &held,
            &remote_journal,
            &mut journal_synced,
            &mut prepare_failed,
            |i, commit| {
                let mut writes: Vec<(u64, &[u8])> = held[i].2.writes().collect();
                writes.push(media::batch::BARRIER);
                writes.push(commit.write());
                crate::proto::frame::append_fits(&writes)
            },
        );
        // The pages, each device's made durable: a chunk across the network
        // takes them as one append with FUA (written in order, then synced:
        // one message), its directory commit after a barrier; a local
        // device as page writes side by side in one io_uring submission,
        // then its sync in another (an append loops on the calling thread,
        // one device's sync after another's).
        let hint = media::WriteHint::new(IoClass::Data);
        let to_write =
            |i: usize| (!held[i].2.is_empty() || commits[i].is_some()) && outcomes[i].is_ok();
        let mut ios = Vec::new();
        let mut owner = Vec::new();
        for (i, (_, dev, pages)) in held.iter().enumerate().filter(|(i, _)| to_write(*i)) {
            if dev.link().is_some() {
                let mut writes: Vec<(u64, &[u8])> = pages.writes().collect();
                if let Some(commit) = &commits[i] {
                    if !writes.is_empty() {
                        writes.push(media::batch::BARRIER);
                    }
                    writes.push(commit.write());
                }
                let op = media::batch::Op::Append {
                    writes,
                    hint,
                    fua: true,
                };
                ios.push(media::DeviceIo {
                    dev: dev.as_ref(),
                    op,
                });
                owner.push(i);
                continue;
            }
            for (offset, buf) in pages.writes() {
                let op = media::batch::Op::Write {
                    buf,
                    offset,
                    hint,
                    fua: false,
                };
                ios.push(media::DeviceIo {
                    dev: dev.as_ref(),
                    op,
                });
                owner.push(i);
            }
        }
        let locals: Vec<usize> = (0..held.len())
            .filter(|&i| to_write(i) && held[i].1.link().is_none())
            .collect();
        self.submit_table_pages(&mut ios, &owner, &held, &mut outcomes);
        drop(ios);
        // Each directory commit finished where its message went through;
        // where it failed (the chunk stops at its first failed write, or
        // the message's outcome is unknown) it is dropped unfinished,
        // nothing latched, its directory left as it was, as when the
        // commit followed the pages and was never sent after their
        // failure: the device is failed for it (or, on a full file system,
        // stays in service and the next flush commits it).
        let mut commit_outcomes = Vec::new();
        for (i, commit) in commits.into_iter().enumerate() {
            let Some(commit) = commit else { continue };
            match &outcomes[i] {
                Err(_) => {
                    drop(commit);
                    journal_synced[held[i].0] = Some(Ok(()));
                }
                Ok(()) => commit_outcomes.push((i, commit.finish(Ok(())))),
            }
        }
        commit_outcomes.extend(prepare_failed);
        note_commits(&mut guards, &held, commit_outcomes, &mut journal_synced);
        drop(guards);
        // Local devices whose page writes all went through: synced.
        let mut ios = Vec::new();
        let mut owner = Vec::new();
        for i in locals.into_iter().filter(|&i| outcomes[i].is_ok()) {
            let op = media::batch::Op::Sync;
            ios.push(media::DeviceIo {
                dev: held[i].1.as_ref(),
                op,
            });
            owner.push(i);
        }
        self.submit_table_pages(&mut ios, &owner, &held, &mut outcomes);
        // The grown journals of local devices whose pages are durable:
        // their directory commits as FUA writes side by side in one
        // submission, where each was a FUA write in turn (an `fdatasync`
        // each, one after another). Taken here, after the pages' syncs
        // (a journal held no longer than its commit's write).
        let unfinished: Vec<bool> = journal_synced.iter().map(Option::is_none).collect();
        let local_journal = |i: usize| {
            let (d, dev, _) = &held[i];
            point_if(
                outcomes[i].is_ok() && dev.link().is_none() && unfinished[*d],
                journals,
                *d,
            )
        };
        let mut guards = self.hold_journals(&held, &local_journal);
        let mut commit_outcomes = Vec::new();
        let commits = prepare_commits(
            &guards,
            &held,
            &local_journal,
            &mut journal_synced,
            &mut commit_outcomes,
            |_, _| true,
        );
        let commits: Vec<(usize, media::area::PreparedCommit)> = commits
            .into_iter()
            .enumerate()
            .filter_map(|(i, c)| Some((i, c?)))
            .collect();
        let mut ios: Vec<media::DeviceIo> = commits
            .iter()
            .map(|(_, commit)| {
                let (offset, buf) = commit.write();
                media::DeviceIo {
                    dev: commit.device().as_ref(),
                    op: media::batch::Op::Write {
                        buf,
                        offset,
                        hint: media::WriteHint::new(IoClass::Metadata),
                        fua: true,
                    },
                }
            })
            .collect();
        let (results, cost) = media::submit(&mut ios);
        drop(ios);
        self.count_batch(cost);
        for ((i, commit), written) in commits.into_iter().zip(results) {
            commit_outcomes.push((i, commit.finish(written)));
        }
        note_commits(&mut guards, &held, commit_outcomes, &mut journal_synced);
        drop(guards);
        for ((d, _, pages), outcome) in held.into_iter().zip(outcomes) {
            // The table keeps its own copy of an error (latched there unless
            // a full file system: its OS error is kept), the device's
            // failure the original.
            let (for_table, for_device) = match outcome {
                Ok(()) => (Ok(()), None),
                Err(e) => (Err(super::checksum::copy_of(&e)), Some(e)),
            };
            let finished = self.stores[d].finish_checksum_pages(pages, for_table);
            match (for_device, finished) {
                (Some(e), _) | (None, Err(e)) => failed.push((d, e)),
                (None, Ok(())) => synced[d] = true,
            }
        }
        failed.sort_by_key(|(d, _)| *d);
        for (d, e) in failed {
            flush_failed(d, e);
        }
        (space, synced, journal_synced)
    }

    /// The journals of the devices of `held` that `chosen` gives a sync
    /// point, held, in device order (as a replay's fold holds them).
    fn hold_journals<'s, 'p>(
        &'s self,
        held: &[HeldPages<'_>],
        chosen: &dyn Fn(usize) -> Option<&'p super::journal::JournalSyncPoint>,
    ) -> Vec<(usize, super::store::JournalGuard<'s>)> {
        (0..held.len())
            .filter(|&i| chosen(i).is_some())
            .map(|i| (i, self.stores[held[i].0].journal_held()))
            .collect()
    }

    /// Submits a batch of a flush's checksum-page I/O (`owner`: the index
    /// in `held` of each operation's device), counting it and each sync
    /// it made, and keeps each device's first error in `outcomes`.
    fn submit_table_pages(
        &self,
        ios: &mut [media::DeviceIo<'_>],
        owner: &[usize],
        held: &[HeldPages<'_>],
        outcomes: &mut [std::io::Result<()>],
    ) {
        if ios.is_empty() {
            return;
        }
        let (results, cost) = within(Scope::Checksums, || media::submit(ios));
        self.count_batch(cost);
        for ((r, &i), io) in results.into_iter().zip(owner).zip(ios.iter()) {
            if matches!(
                io.op,
                media::batch::Op::Append { .. } | media::batch::Op::Sync
            ) {
                self.stores[held[i].0].note_sync();
            }
            if let (Ok(()), Err(e)) = (&outcomes[i], r) {
                outcomes[i] = Err(e);
            }
        }
    }

    /// Stripes per intent region (for tests and tools).
    pub fn stripes_per_region(&self) -> u64 {
        let cfg = self.config.lock().unwrap();
        IntentLog::stripes_per_region(self.geo.stripe_data_bytes(), cfg.file.intent_region_bytes)
    }
}

/// A device's dirty checksum pages, held for a flush: (device, its
/// device handle, the pages).
type HeldPages<'a> = (
    usize,
    Arc<dyn media::Device>,
    super::checksum::DirtyPages<'a>,
);

/// Device `d`'s journal sync point in `journals`, where `wanted`.
fn point_if(
    wanted: bool,
    journals: &[Option<super::journal::JournalSyncPoint>],
    d: usize,
) -> Option<&super::journal::JournalSyncPoint> {
    wanted.then(|| journals.get(d)?.as_ref()).flatten()
}

/// The directory commits of the held journals `guards` (index into
/// `held`, guard) made ready for the sync points `point_of` gives: by
/// index into `held`, the commits whose write the caller makes (those on
/// the device of the pages, which `keep` takes); a journal with nothing
/// to commit, or latched, has its sync's outcome set in `synced` (Ok);
/// one that cannot be prepared is pushed to `failed`; one whose commit
/// is not kept or not preparable is left to the caller's sync.
fn prepare_commits<'g, 'p>(
    guards: &'g [(usize, super::store::JournalGuard<'_>)],
    held: &[HeldPages<'_>],
    point_of: &dyn Fn(usize) -> Option<&'p super::journal::JournalSyncPoint>,
    synced: &mut [Option<JournalSynced>],
    failed: &mut Vec<(usize, std::io::Result<()>)>,
    keep: impl Fn(usize, &media::area::PreparedCommit<'_>) -> bool,
) -> Vec<Option<media::area::PreparedCommit<'g>>> {
    let mut commits: Vec<Option<media::area::PreparedCommit>> =
        (0..held.len()).map(|_| None).collect();
    for (i, guard) in guards {
        let (d, dev, _) = &held[*i];
        let Some(journal) = guard.as_ref().filter(|j| !j.is_latched()) else {
            // As the caller's sync finds it: nothing to do.
            synced[*d] = Some(Ok(()));
            continue;
        };
        let point = point_of(*i).expect("chosen");
        match journal.prepare_sync_after_device_sync(point) {
            None => {}
            Some(Err(e)) => failed.push((*i, Err(e))),
            Some(Ok(None)) => synced[*d] = Some(Ok(())),
            Some(Ok(Some(commit))) => {
                let alike = std::ptr::addr_eq(Arc::as_ptr(commit.device()), Arc::as_ptr(dev));
                if alike && keep(*i, &commit) {
                    commits[*i] = Some(commit);
                }
                // Otherwise dropped unfinished: the caller's sync commits
                // the directory.
            }
        }
    }
    commits
}

/// Each journal's prepared sync finished with `outcomes` (index into
/// `held`, outcome): noted by the journal (a failure latches it) and set
/// in `synced`.
fn note_commits(
    guards: &mut [(usize, super::store::JournalGuard<'_>)],
    held: &[HeldPages<'_>],
    outcomes: Vec<(usize, std::io::Result<()>)>,
    synced: &mut [Option<JournalSynced>],
) {
    for (i, outcome) in outcomes {
        let g = &mut guards.iter_mut().find(|(h, _)| *h == i).expect("held").1;
        let journal = g.as_mut().expect("prepared");
        journal.note_prepared_sync(&outcome);
        synced[held[i].0] = Some(outcome.map_err(|e| (e, journal.stripes())));
    }
}

fn intersect(a: &Range<u64>, b: &Range<u64>) -> Range<u64> {
    a.start.max(b.start)..a.end.min(b.end)
}

/// Copies a unit write into `buf`, which holds the unit's bytes from
/// `buf_start` on.
/// Copies the part of a unit write that falls inside `buf`, which holds the
/// unit's bytes from `buf_start` on.
pub(super) fn overlay(buf: &mut [u8], buf_start: u64, w: &UnitWrite) {
    let start = w.offset.max(buf_start);
    let end = (w.offset + w.bytes.len() as u64).min(buf_start + buf.len() as u64);
    if start >= end {
        return;
    }
    let (dst, src) = ((start - buf_start) as usize, (start - w.offset) as usize);
    let n = (end - start) as usize;
    buf[dst..dst + n].copy_from_slice(&w.bytes[src..src + n]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_merge_overlapping_and_touching_ranges() {
        assert_eq!(runs(vec![4..6, 0..2, 1..3, 6..7]), vec![0..3, 4..7]);
    }

    #[test]
    fn subtract_leaves_the_uncovered_edges() {
        assert_eq!(subtract(0..8, &(2..5)), vec![0..2, 5..8]);
        assert_eq!(subtract(0..8, &(3..3)), vec![0..8]);
        assert_eq!(subtract(2..4, &(0..8)), Vec::<Range<u64>>::new());
    }
}
