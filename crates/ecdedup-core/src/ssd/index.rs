//! The two lookup tables inside the simulated FTL: the fingerprint index
//! (digest → stored content) and the CRC filter's table (CRC → how many
//! stored contents have it).
//!
//! Both are open-addressing tables with linear probing over 8-byte slots:
//! 32 hash bits and a 32-bit value. Their capacity is fixed at
//! construction, a power of two at least twice the number of entries that
//! can exist, so the load stays at or below 1/2 and every probe sequence
//! ends at an empty slot. Deletion shifts the following entries back (no
//! tombstones), so lookups never slow down with churn, and it needs only
//! the hash bits kept in the slots.
//!
//! [`DigestIndex`] holds content numbers; the digest of an entry is read
//! from the FTL's own array of digests, and only when the hash bits match,
//! so the table never copies a digest and rarely touches one. Invariants:
//! an indexed content's digest does not change while it is in the index
//! (the FTL removes it first); no two entries have equal digests.
//!
//! [`CrcTable`] counts live contents per CRC; the hash of a CRC is a
//! bijection, so the hash bits identify the CRC. An entry is removed when
//! its count reaches zero, so the table holds at most one entry per stored
//! content.

/// An empty slot of either table.
const EMPTY: u64 = u64::MAX;

/// Mixes a 128-bit digest into 32 hash bits. Digests from SHA-1 or MD5 are
/// uniform already; the multiply also spreads the small integers tests use.
#[inline]
pub fn digest_hash(digest: u128) -> u32 {
    let folded = (digest as u64) ^ ((digest >> 64) as u64).rotate_left(29);
    (folded.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as u32
}

/// Mixes a CRC into 32 hash bits (a bijection, so equal CRCs and only
/// they share hash bits).
#[inline]
fn mix_crc(crc: u32) -> u32 {
    crc.wrapping_mul(0x9e37_79b1).rotate_left(16)
}

/// Table capacity for up to `entries_max` entries at load 1/2 or less.
fn capacity_for(entries_max: usize) -> usize {
    let capacity = (entries_max.max(1) * 2).next_power_of_two();
    assert!(
        capacity <= 1 << 32,
        "a table of {entries_max} entries exceeds 32-bit hash positions"
    );
    capacity
}

/// The position a slot's entry hashes to.
#[inline]
fn home_of(slot: u64, mask: usize) -> usize {
    ((slot >> 32) as usize) & mask
}

/// Backward-shift deletion at `hole` in a linear-probing table of slots
/// whose high 32 bits are their hash: moves each later entry of the cluster
/// whose home is not cyclically in (hole, j] into the hole.
#[inline]
fn delete_at(slots: &mut [u64], mask: usize, mut hole: usize) {
    let mut j = hole;
    loop {
        j = (j + 1) & mask;
        let s = slots[j];
        if s == EMPTY {
            break;
        }
        let home = home_of(s, mask);
        if (j.wrapping_sub(home) & mask) >= (j.wrapping_sub(hole) & mask) {
            slots[hole] = s;
            hole = j;
        }
    }
    slots[hole] = EMPTY;
}

/// Fingerprint index: digest → content number, digests kept by the caller.
/// A slot holds the digest's 32 hash bits and the content number, so probing
/// and deletion touch the caller's digests only on a hash match.
pub struct DigestIndex {
    slots: Vec<u64>,
    mask: usize,
    len: usize,
}

impl DigestIndex {
    /// A table for up to `contents_max` entries (at most 2^31).
    pub fn new(contents_max: usize) -> DigestIndex {
        let capacity = capacity_for(contents_max);
        DigestIndex {
            slots: vec![EMPTY; capacity],
            mask: capacity - 1,
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The content with this digest, if indexed.
    #[inline]
    pub fn find(&self, digest: u128, digests: &[u128]) -> Option<u32> {
        let hash = digest_hash(digest);
        let mut i = hash as usize & self.mask;
        loop {
            let s = self.slots[i];
            if s == EMPTY {
                return None;
            }
            if (s >> 32) as u32 == hash && digests[s as u32 as usize] == digest {
                return Some(s as u32);
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Adds `content`, whose digest is `digests[content]` and not yet indexed.
    #[inline]
    pub fn insert(&mut self, content: u32, digests: &[u128]) {
        let digest = digests[content as usize];
        assert!(
            self.len < self.slots.len() / 2,
            "digest index over its bound"
        );
        let hash = digest_hash(digest);
        let mut i = hash as usize & self.mask;
        while self.slots[i] != EMPTY {
            debug_assert!(
                digests[self.slots[i] as u32 as usize] != digest,
                "digest indexed twice"
            );
            i = (i + 1) & self.mask;
        }
        self.slots[i] = ((hash as u64) << 32) | content as u64;
        self.len += 1;
    }

    /// Removes `content`, which must be indexed under `digests[content]`.
    pub fn remove(&mut self, content: u32, digests: &[u128]) {
        self.remove_hashed(content, digest_hash(digests[content as usize]));
    }

    /// Removes `content`, indexed under a digest whose [`digest_hash`] is
    /// `hash` (the FTL keeps it with the content, so removal reads no digest).
    #[inline]
    pub fn remove_hashed(&mut self, content: u32, hash: u32) {
        let slot = ((hash as u64) << 32) | content as u64;
        let mut i = home_of(slot, self.mask);
        while self.slots[i] != slot {
            assert!(self.slots[i] != EMPTY, "removing an unindexed content");
            i = (i + 1) & self.mask;
        }
        delete_at(&mut self.slots, self.mask, i);
        self.len -= 1;
    }

    /// Prefetches the slot where a digest's probe starts.
    #[inline]
    pub fn prefetch(&self, digest: u128) {
        prefetch(&self.slots, digest_hash(digest) as usize & self.mask);
    }

    /// Every indexed content, in table order (for consistency checks).
    pub fn contents(&self) -> impl Iterator<Item = u32> + '_ {
        self.slots
            .iter()
            .filter(|&&s| s != EMPTY)
            .map(|&s| s as u32)
    }

    pub fn memory_bytes(&self) -> u64 {
        (self.slots.capacity() * 8) as u64
    }
}

/// Live contents per CRC: the unique-chunk filter of paper 003. A slot
/// holds a CRC's hash bits (which determine the CRC) and its count.
pub struct CrcTable {
    slots: Vec<u64>,
    mask: usize,
    len: usize,
}

impl Default for CrcTable {
    fn default() -> Self {
        CrcTable::new(0)
    }
}

impl CrcTable {
    /// A table for up to `crcs_max` distinct CRCs (at most 2^31).
    pub fn new(crcs_max: usize) -> CrcTable {
        let capacity = capacity_for(crcs_max);
        CrcTable {
            slots: vec![EMPTY; capacity],
            mask: capacity - 1,
            len: 0,
        }
    }

    /// The slot position holding `crc`, or the empty slot ending its probe.
    #[inline]
    fn position(&self, crc: u32) -> (usize, bool) {
        let hash = mix_crc(crc);
        let mut i = hash as usize & self.mask;
        loop {
            let s = self.slots[i];
            if s == EMPTY {
                return (i, false);
            }
            if (s >> 32) as u32 == hash {
                return (i, true);
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Whether some stored content has this CRC.
    #[inline]
    pub fn seen(&self, crc: u32) -> bool {
        self.position(crc).1
    }

    /// Counts one more content with this CRC; returns whether the CRC was
    /// seen before.
    #[inline]
    pub fn add(&mut self, crc: u32) -> bool {
        let (i, found) = self.position(crc);
        if found {
            self.slots[i] += 1;
        } else {
            assert!(self.len < self.slots.len() / 2, "CRC table over its bound");
            self.slots[i] = ((mix_crc(crc) as u64) << 32) | 1;
            self.len += 1;
        }
        found
    }

    /// Counts one content fewer with this CRC, forgetting the CRC at zero.
    #[inline]
    pub fn remove(&mut self, crc: u32) {
        let (i, found) = self.position(crc);
        assert!(found, "CRC counted before");
        self.slots[i] -= 1;
        if self.slots[i] as u32 == 0 {
            delete_at(&mut self.slots, self.mask, i);
            self.len -= 1;
        }
    }

    pub fn count(&self, crc: u32) -> u32 {
        match self.position(crc) {
            (i, true) => self.slots[i] as u32,
            _ => 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn memory_bytes(&self) -> u64 {
        (self.slots.capacity() * 8) as u64
    }
}

/// Hints the CPU to fetch `slice[i]` into cache (no effect elsewhere than
/// x86-64, none on program state anywhere). Independent misses then
/// overlap instead of stalling one after another.
#[inline(always)]
pub(crate) fn prefetch<T>(slice: &[T], i: usize) {
    #[cfg(target_arch = "x86_64")]
    if let Some(x) = slice.get(i) {
        // SAFETY: a prefetch reads nothing the program observes and cannot
        // fault; the address is of a live element; SSE is part of the
        // x86-64 baseline.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                x as *const T as *const i8,
            )
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (slice, i);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    proptest! {
        /// The index agrees with a plain map under random inserts and
        /// removes, with few distinct home positions so clusters form.
        #[test]
        fn digest_index_agrees_with_a_map(ops in proptest::collection::vec((any::<bool>(), 0u32..64), 1..400)) {
            let contents = 64usize;
            // Small integers as digests: the hardest case for the mixer.
            let digests: Vec<u128> = (0..contents as u128).map(|i| i * 7 + 3).collect();
            let mut index = DigestIndex::new(contents);
            let mut model: HashMap<u128, u32> = HashMap::new();
            for (insert, c) in ops {
                let d = digests[c as usize];
                if insert {
                    model.entry(d).or_insert_with(|| {
                        index.insert(c, &digests);
                        c
                    });
                } else if model.remove(&d).is_some() {
                    index.remove(c, &digests);
                }
                prop_assert_eq!(index.len(), model.len());
                for (i, &d) in digests.iter().enumerate() {
                    let expected = model.get(&d).copied();
                    prop_assert_eq!(index.find(d, &digests), expected, "digest of {}", i);
                }
            }
        }
    }

    #[test]
    fn crc_table_forgets_a_crc_when_its_last_content_goes() {
        let mut t = CrcTable::new(4);
        t.add(7);
        t.add(7);
        assert!(t.seen(7) && !t.seen(8));
        t.remove(7);
        assert!(t.seen(7));
        t.remove(7);
        assert!(!t.seen(7));
        assert!(t.is_empty());
    }
}
