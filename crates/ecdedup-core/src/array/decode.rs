//! Decoding a block row from the other members, checked before it is used.
//!
//! Reed-Solomon does not detect corruption: decoded from a unit that is
//! stale but carries a matching checksum (a lost journal record, a torn
//! degraded write), a missing block comes out wrong, and nothing in the
//! codec says so. So every decoded block is checked before it is returned
//! or written anywhere:
//! - a decoded data block, against the checksum its member recorded for
//!   it, where that is known (the member holds the stripe; or it went out
//!   of service since this open, and degraded writes kept its entries
//!   current; or it is being rebuilt and its table from before the
//!   replacement was kept; in the last two cases only for entries whose
//!   table page was resident when the member went out, or that a degraded
//!   write set since: the table's pages are pinned then, see
//!   [`super::checksum`]); decoded parity is derived, not returned, and
//!   its entry may describe a value a journal replay could not update;
//! - and against every present member the decode did not need: the row
//!   must be one codeword.
//!
//! When the check fails and more than k members are present, the other
//! combinations of members are tried, leaving out one present member, then
//! two, ... (as ZFS's `vdev_raidz_combrec` does); a combination is taken
//! only when a known checksum or a spare member vouches for it, and the
//! members it left out are rewritten. When none is vouched for, the row is
//! unreadable: an I/O error, never wrong data.
//!
//! The one case that cannot be checked: exactly k members present and no
//! checksum known for the blocks decoded (a member already out when the
//! array was opened, whose table went with it, or an entry whose table
//! page was not resident when its member went out). Those decodes are counted
//! (`unverified_decodes`) and served, as every RAID does; every block they
//! are decoded from was itself checked against its checksum. Except after
//! an unclean stop: a resync that finds such a row with a member changed
//! since the last flush (a write was in flight, so the k members may mix
//! old and new) marks the row's parity unreadable, and the decode is an
//! I/O error instead (`resync_from_degraded_log`, docs/write-hole.md); so
//! does one that finds more than k members left that are not one
//! codeword with nothing vouching for the missing units, before a second
//! loss leaves exactly k of them (`mark_row_unknowable`).

use super::store::{ChunkOp, ChunkRequest};
use super::Array;
use crate::counters::bump;
use crate::error::{Error, Result};

/// Most members left out when searching combinations: RS(k, m) with m up
/// to this many wrong-but-checksummed members (each level tries
/// C(present, level) decodes).
const COMBINATION_DEPTH_MAX: usize = 3;

/// A row decoded by [`Array::decode_checked`].
pub(super) struct Checked {
    /// Every member's block of the row.
    pub(super) shards: Vec<Vec<u8>>,
    /// Present members the decode that checked left out (they disagree
    /// with the others).
    pub(super) left_out: Vec<usize>,
    /// Whether a known checksum or a spare member vouched for the row
    /// (false: exactly k members and no checksum known, unchecked).
    pub(super) vouched: bool,
}

/// One member's block of a row, as read for a decode.
pub(super) enum MemberRead {
    /// The member does not hold the stripe (out of service, or not yet
    /// rebuilt this far): nothing was read.
    NotHeld,
    /// The member holds the stripe but its read failed (a medium error).
    Unreadable,
    /// What the member holds, not yet checked.
    Block(Vec<u8>),
}

/// A row decoded and checked.
pub(super) struct DecodedRow {
    /// Every member's block of the row.
    pub(super) shards: Vec<Vec<u8>>,
    /// Members whose block on the device was wrong (checksum mismatch, or
    /// left out by the combination that checked) and which hold the
    /// stripe: rewritten when repairing.
    pub(super) wrong: Vec<usize>,
}

impl Array {
    /// The checksum the block at checksum index `index` of device `d`
    /// should have, where known (see the module documentation).
    pub(super) fn expected_crc(&self, d: usize, stripe: u64, index: u64) -> Option<u32> {
        self.stores[d].expected_checksum(stripe, index)
    }

    /// Whether `value` is what the known entry of block `row` of unit
    /// `role` of `stripe` records: None where no entry is known.
    pub(super) fn entry_confirms(
        &self,
        stripe: u64,
        role: usize,
        row: u64,
        value: &[u8],
    ) -> Option<bool> {
        let g = &self.geo;
        let place = g.place(stripe, role);
        self.expected_crc(place.device, stripe, g.checksum_index(place.row, row))
            .map(|crc| crc == crate::codec::crc32c(value))
    }

    /// A write or discard of a member that does not hold the stripe (or
    /// that failed taking it): records what the block holds logically,
    /// so a later decode of it can be checked.
    pub(super) fn note_logical_crc(&self, d: usize, index: u64, crc: u32) {
        self.stores[d].note_logical_checksum(index, crc);
    }

    /// Decodes block row `b` of `stripe` from every readable, verified
    /// unit, checked as the module documentation says; with `repair`,
    /// rewrites members whose block was wrong. Caller holds the stripe lock.
    pub(super) fn decode_row(&self, stripe: u64, b: u64, repair: bool) -> Result<DecodedRow> {
        if self.journal_pending(stripe) {
            return Err(Error::NeedsReplay(stripe));
        }
        let g = &self.geo;
        let block = g.block() as usize;
        // Every member's block of the row in one batch (one round trip to
        // remote chunks, where one member after another took one each).
        let held: Vec<bool> = (0..g.width())
            .map(|role| self.holds(g.place(stripe, role).device, stripe))
            .collect();
        let mut blocks: Vec<Vec<u8>> = held
            .iter()
            .map(|&h| if h { vec![0u8; block] } else { Vec::new() })
            .collect();
        let reqs: Vec<ChunkRequest> = blocks
            .iter_mut()
            .enumerate()
            .filter(|(role, _)| held[*role])
            .map(|(role, buf)| {
                let place = g.place(stripe, role);
                let op = ChunkOp::Read {
                    buf: &mut buf[..],
                    offset: g.device_offset(place.row, b),
                    class: super::io::class_of(role, g.k()),
                    check: None,
                    stripe: None,
                };
                ChunkRequest::new(place.device, op)
            })
            .collect();
        let mut took = self.submit_reads(reqs).into_iter();
        let reads = blocks
            .into_iter()
            .enumerate()
            .map(|(role, shard)| {
                if !held[role] {
                    return MemberRead::NotHeld;
                }
                if took.next().unwrap_or(false) {
                    MemberRead::Block(shard)
                } else if self.holds(g.place(stripe, role).device, stripe) {
                    // A medium error on a device still in service: the
                    // block is rewritten with the rest.
                    MemberRead::Unreadable
                } else {
                    MemberRead::NotHeld
                }
            })
            .collect();
        self.decode_row_from(stripe, b, reads, repair)
    }

    /// [`Array::decode_row`] from the members' blocks of the row as read
    /// (by the caller: the row's blocks in one batch, or a whole unit each
    /// in one batch).
    pub(super) fn decode_row_from(
        &self,
        stripe: u64,
        b: u64,
        reads: Vec<MemberRead>,
        repair: bool,
    ) -> Result<DecodedRow> {
        let g = &self.geo;
        let (w, k) = (g.width(), g.k());
        let block = g.block() as usize;
        let mut read = Vec::with_capacity(w);
        let mut present = vec![false; w];
        let mut wrong = Vec::new();
        let mut unreadable = Vec::new();
        let mut expected = vec![None; w];
        for (role, member) in reads.into_iter().enumerate() {
            let place = g.place(stripe, role);
            let index = g.checksum_index(place.row, b);
            // Decoded parity is not checked against its entry: parity is
            // derived, and a replay that could not fold a journal into a
            // bad parity block leaves its entry describing an older value.
            // Decoded data is what reads return: it is checked.
            if role < k {
                expected[role] = self.expected_crc(place.device, stripe, index);
            }
            match member {
                MemberRead::NotHeld => read.push(vec![0u8; block]),
                MemberRead::Unreadable => {
                    unreadable.push(role);
                    read.push(vec![0u8; block]);
                }
                MemberRead::Block(shard) => {
                    if self.stores[place.device].block_matches(index, &shard) {
                        present[role] = true;
                    } else {
                        wrong.push(role);
                    }
                    read.push(shard);
                }
            }
        }
        let have = present.iter().filter(|p| **p).count();
        if have < k {
            return Err(Error::DataLoss(format!(
                "stripe {stripe} block {b}: only {have} of {w} units readable and intact, {k} needed"
            )));
        }
        if have == w {
            return Ok(DecodedRow {
                shards: read,
                wrong,
            });
        }
        match self.decode_checked(&read, &present, &expected) {
            Some(Checked {
                shards, left_out, ..
            }) => {
                if !left_out.is_empty() {
                    self.warn(format!(
                        "stripe {stripe} block {b}: members {left_out:?} hold stale blocks \
                         with matching checksums; decoded without them"
                    ));
                }
                wrong.extend(left_out);
                bump(&self.counters.array.reconstructed_blocks);
                if repair {
                    self.rewrite_wrong(stripe, b, &shards, &wrong);
                    self.rewrite_wrong(stripe, b, &shards, &unreadable);
                }
                Ok(DecodedRow { shards, wrong })
            }
            None => {
                bump(&self.counters.array.unreadable_blocks);
                Err(Error::DataLoss(format!(
                    "stripe {stripe} block {b}: no combination of the {have} intact members \
                     decodes to the recorded checksums; the block is unreadable"
                )))
            }
        }
    }

    /// Decodes a row from the members flagged `present` (their blocks in
    /// `read`), checked: the decoded members against `expected` where
    /// known, and the row against every spare member. When that fails
    /// and more than k members are present, the combinations leaving out
    /// one present member, then two, ... are tried, and one is taken only
    /// when a known checksum or a spare member vouches for it. None when
    /// nothing does: the missing members cannot be known, and a decode
    /// would be a guess. With exactly k members and no checksum known the
    /// decode is taken unchecked (counted in `unverified_decodes`).
    pub(super) fn decode_checked(
        &self,
        read: &[Vec<u8>],
        present: &[bool],
        expected: &[Option<u32>],
    ) -> Option<Checked> {
        let k = self.geo.k();
        let have = present.iter().filter(|p| **p).count();
        if have < k {
            return None;
        }
        if have == present.len() {
            return Some(Checked {
                shards: read.to_vec(),
                left_out: Vec::new(),
                vouched: true,
            });
        }
        let avail: Vec<usize> = (0..present.len()).filter(|&r| present[r]).collect();
        let depth_max = (have - k).min(COMBINATION_DEPTH_MAX);
        for depth in 0..=depth_max {
            let mut found = None;
            for_each_combination(avail.len(), depth, &mut |left_out| {
                let mut use_ = present.to_vec();
                for &i in left_out {
                    use_[avail[i]] = false;
                }
                match self.try_decode(read, &use_, present, expected) {
                    Some((shards, vouched)) if depth == 0 || vouched => {
                        found = Some(Checked {
                            shards,
                            left_out: left_out.iter().map(|&i| avail[i]).collect(),
                            vouched,
                        });
                        true
                    }
                    _ => false,
                }
            });
            if found.is_some() {
                if depth > 0 {
                    bump(&self.counters.array.combination_decodes);
                }
                return found;
            }
            if depth == 0 {
                bump(&self.counters.array.decode_check_failures);
            }
        }
        None
    }

    /// The values of the missing data members (not `present`) of block
    /// row `b` of `stripe`, from the decode that leaves out the fewest
    /// present members and that the missing members' known checksums
    /// vouch for: every missing data member's entry known, and each
    /// decoded value matching it. None when no such decode exists, or
    /// when two decodes at that depth disagree (a guess either way).
    /// What the left-out members hold is not judged here: the caller
    /// decides which side is the truth. `logged`: as for
    /// `mark_row_undecodable`, a missing member's logged value's checksum
    /// where its entry is unknown.
    pub(super) fn decode_missing_vouched(
        &self,
        stripe: u64,
        b: u64,
        read: &[Vec<u8>],
        present: &[bool],
        logged: &[Option<u32>],
    ) -> Option<Vec<(usize, Vec<u8>)>> {
        let g = &self.geo;
        let k = g.k();
        let missing: Vec<usize> = (0..k).filter(|&r| !present[r]).collect();
        let mut expected = vec![None; g.width()];
        for &role in &missing {
            let place = g.place(stripe, role);
            let index = g.checksum_index(place.row, b);
            expected[role] = Some(
                self.expected_crc(place.device, stripe, index)
                    .or(logged[role])?,
            );
        }
        if missing.is_empty() {
            return None;
        }
        let avail: Vec<usize> = (0..present.len()).filter(|&r| present[r]).collect();
        let depth_max = avail.len().saturating_sub(k).min(COMBINATION_DEPTH_MAX);
        for depth in 1..=depth_max {
            let mut answers: Vec<Vec<(usize, Vec<u8>)>> = Vec::new();
            for_each_combination(avail.len(), depth, &mut |left_out| {
                let mut use_ = present.to_vec();
                for &i in left_out {
                    use_[avail[i]] = false;
                }
                if let Some((shards, true)) = self.try_decode(read, &use_, present, &expected) {
                    let values: Vec<(usize, Vec<u8>)> =
                        missing.iter().map(|&r| (r, shards[r].clone())).collect();
                    if !answers.contains(&values) {
                        answers.push(values);
                    }
                }
                answers.len() > 1
            });
            match answers.len() {
                0 => continue,
                1 => return answers.pop(),
                _ => return None,
            }
        }
        None
    }

    /// The values of the missing data members of block row `b` of
    /// `stripe`, from the decode that leaves out one present data member
    /// whose block differs from its recorded entry and that decodes that
    /// member back to its entry: the member a write in flight changed
    /// since the last flush (its entry is of its flushed bytes; table pages
    /// are written at flushes), every other member as the row was. A
    /// decode that leaves out a member that did not change, or uses one
    /// that did, gives the left-out member bytes whose checksum is not its
    /// entry. None where no member so vouches, or where two do and
    /// disagree.
    pub(super) fn decode_missing_around_changed(
        &self,
        stripe: u64,
        b: u64,
        read: &[Vec<u8>],
        present: &[bool],
    ) -> Option<Vec<(usize, Vec<u8>)>> {
        let g = &self.geo;
        let k = g.k();
        let missing: Vec<usize> = (0..k).filter(|&r| !present[r]).collect();
        if missing.is_empty() {
            return None;
        }
        let none = vec![None; g.width()];
        let mut answers: Vec<Vec<(usize, Vec<u8>)>> = Vec::new();
        for y in (0..k).filter(|&r| present[r]) {
            let place = g.place(stripe, y);
            let Some(entry) =
                self.expected_crc(place.device, stripe, g.checksum_index(place.row, b))
            else {
                continue;
            };
            if crate::codec::crc32c(&read[y]) == entry {
                continue;
            }
            let mut use_ = present.to_vec();
            use_[y] = false;
            let Some((shards, _)) = self.try_decode(read, &use_, present, &none) else {
                continue;
            };
            if crate::codec::crc32c(&shards[y]) != entry {
                continue;
            }
            let values: Vec<(usize, Vec<u8>)> =
                missing.iter().map(|&r| (r, shards[r].clone())).collect();
            if !answers.contains(&values) {
                answers.push(values);
            }
        }
        match answers.len() {
            1 => answers.pop(),
            _ => None,
        }
    }

    /// Decodes from the members flagged in `use_`; checks every member
    /// that was not `present` (absent, or read with a checksum mismatch)
    /// against its known checksum, and every used member past k. Members
    /// present but left out are taken to be wrong: not checked. Returns
    /// the row and whether something beyond the decode itself vouched for
    /// it, or None when a check failed.
    pub(super) fn try_decode(
        &self,
        read: &[Vec<u8>],
        use_: &[bool],
        present: &[bool],
        expected: &[Option<u32>],
    ) -> Option<(Vec<Vec<u8>>, bool)> {
        let k = self.geo.k();
        let mut shards = read.to_vec();
        {
            let mut refs: Vec<&mut [u8]> = shards.iter_mut().map(|s| s.as_mut_slice()).collect();
            self.codec.reconstruct(&mut refs, use_).ok()?;
        }
        let mut vouched = false;
        for (role, crc) in expected.iter().enumerate() {
            if present[role] {
                continue;
            }
            match crc {
                Some(c) if crate::codec::crc32c(&shards[role]) == *c => vouched = true,
                Some(_) => return None,
                None => {}
            }
        }
        if use_.iter().filter(|u| **u).count() > k {
            // Spare members: the row must be one codeword.
            let data: Vec<&[u8]> = shards[..k].iter().map(|s| s.as_slice()).collect();
            let parity = self.encode_data(&data);
            for (j, pj) in parity.iter().enumerate() {
                if use_[k + j] && *pj != shards[k + j] {
                    return None;
                }
            }
            vouched = true;
        } else if !vouched {
            bump(&self.counters.array.unverified_decodes);
        }
        Some((shards, vouched))
    }

    /// Block row `row` of a stripe's units as read, a block of zeroes where
    /// a unit is None (not held, or not read).
    pub(super) fn row_blocks(&self, units: &[Option<Vec<u8>>], row: u64) -> Vec<Vec<u8>> {
        let block = self.geo.block() as usize;
        let at = row as usize * block;
        units
            .iter()
            .map(|u| match u {
                Some(u) => u[at..at + block].to_vec(),
                None => vec![0u8; block],
            })
            .collect()
    }

    /// Block row `row` of a stripe's units as read (None: not held), when
    /// the members read are one codeword and a spare member vouches for
    /// it: every member's block of the row, the missing ones decoded.
    pub(super) fn one_codeword_row(
        &self,
        units: &[Option<Vec<u8>>],
        row: u64,
    ) -> Option<Vec<Vec<u8>>> {
        let block = self.geo.block() as usize;
        let at = row as usize * block;
        let known: Vec<Option<Vec<u8>>> = units
            .iter()
            .map(|u| u.as_ref().map(|u| u[at..at + block].to_vec()))
            .collect();
        self.decode_vouched_by_spare(&known)
    }

    /// A block row's members as known (`known`: each member's block, None
    /// where unknown), when more than k are known and they are one
    /// codeword, which a spare member vouches for: every member's block,
    /// the unknown ones decoded. A member known need not be on a device:
    /// the degraded-write log's value of a missing unit counts.
    pub(super) fn decode_vouched_by_spare(
        &self,
        known: &[Option<Vec<u8>>],
    ) -> Option<Vec<Vec<u8>>> {
        // Blocks, or parts of them of one length (a sector each).
        let block = known.iter().flatten().next()?.len();
        let present: Vec<bool> = known.iter().map(Option::is_some).collect();
        if present.iter().filter(|p| **p).count() <= self.geo.k() {
            return None;
        }
        let read: Vec<Vec<u8>> = known
            .iter()
            .map(|u| u.clone().unwrap_or_else(|| vec![0u8; block]))
            .collect();
        match self.try_decode(&read, &present, &present, &vec![None; known.len()]) {
            Some((shards, true)) => Some(shards),
            _ => None,
        }
    }

    /// A row read whole, every block with a matching checksum, that is not
    /// one codeword (a scrub found its parity disagreeing with its data):
    /// which members disagree with the others, and the row they leave.
    /// Found by leaving out the fewest members (one, then two, ...) whose
    /// absence leaves more than k members that are one codeword; None when
    /// no such set is unique (m = 1, where any k members are consistent,
    /// or more members disagree than the others can outvote): the row
    /// cannot tell which member is wrong. Parity is not assumed wrong: a
    /// stale data block with its stale checksum (an old image re-added) is
    /// found as well.
    pub(super) fn locate_wrong_members(
        &self,
        row: &[Vec<u8>],
    ) -> Option<(Vec<usize>, Vec<Vec<u8>>)> {
        let (w, k) = (self.geo.width(), self.geo.k());
        let no_sums = vec![None; w];
        let depth_max = (w - k).saturating_sub(1).min(COMBINATION_DEPTH_MAX);
        for depth in 1..=depth_max {
            let mut found = Vec::new();
            for_each_combination(w, depth, &mut |left_out| {
                let mut use_ = vec![true; w];
                for &i in left_out {
                    use_[i] = false;
                }
                if let Some((shards, _)) = self.try_decode(row, &use_, &use_, &no_sums) {
                    found.push((left_out.to_vec(), shards));
                }
                found.len() > 1
            });
            match found.len() {
                0 => continue,
                1 => return found.pop(),
                _ => return None,
            }
        }
        None
    }

    pub(super) fn rewrite_wrong(&self, stripe: u64, b: u64, shards: &[Vec<u8>], wrong: &[usize]) {
        for &role in wrong {
            if self.write_unit_blocks_as(stripe, role, b, &shards[role], true) {
                bump(&self.counters.array.repaired_blocks);
            }
        }
    }
}

/// Calls `f` with each `r`-subset of `0..n` (ascending indices) until it
/// returns true.
fn for_each_combination(n: usize, r: usize, f: &mut dyn FnMut(&[usize]) -> bool) {
    fn go(
        start: usize,
        n: usize,
        r: usize,
        acc: &mut Vec<usize>,
        f: &mut dyn FnMut(&[usize]) -> bool,
    ) -> bool {
        if acc.len() == r {
            return f(acc);
        }
        for i in start..n {
            acc.push(i);
            if go(i + 1, n, r, acc, f) {
                return true;
            }
            acc.pop();
        }
        false
    }
    go(0, n, r, &mut Vec::with_capacity(r), f);
}

#[cfg(test)]
mod tests {
    use super::for_each_combination;

    #[test]
    fn combinations_are_listed_once_each_in_order_and_stop_when_told() {
        let mut seen = Vec::new();
        for_each_combination(4, 2, &mut |c| {
            seen.push(c.to_vec());
            false
        });
        assert_eq!(
            seen,
            vec![
                vec![0, 1],
                vec![0, 2],
                vec![0, 3],
                vec![1, 2],
                vec![1, 3],
                vec![2, 3]
            ]
        );
        let mut calls = 0;
        for_each_combination(5, 0, &mut |c| {
            calls += 1;
            assert!(c.is_empty());
            false
        });
        assert_eq!(calls, 1);
        calls = 0;
        for_each_combination(5, 2, &mut |_| {
            calls += 1;
            calls == 3
        });
        assert_eq!(calls, 3);
    }
}
