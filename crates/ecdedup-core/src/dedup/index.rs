//! The fingerprint index: fingerprint → slot, bounded, least recently used
//! entry evicted first, in about 40 bytes per entry.
//!
//! Entries live in a slab of fixed-size chunks, each entry one packed
//! record of `key_bytes + 12` bytes: the digest (exactly as long as the
//! algorithm's: 20 bytes for SHA-1), the slot, and the previous and next
//! links of the recency list (31 bits each; the next field's top bit tags
//! parity entries). Lookup goes through an open-addressing table of 4-byte
//! entry numbers with linear probing, at most 3/4 full, whose bucket is
//! chosen from the digest's first 8 bytes mixed with a per-index random
//! seed (fingerprints are uniform already; the seed keeps crafted ones
//! from piling up in one run of buckets). Removal shifts the run back, so
//! no tombstones accumulate. Nothing grows past the bound given at
//! construction: an insert into a full index evicts the least recently
//! used entry (an evicted fingerprint means a missed dedup, never an
//! error).
//!
//! [`FingerprintIndex::ram_bytes`] is computed from what the structures
//! allocate (chunks, their pointer vector and the bucket vector); tests
//! check it against the bytes a counting allocator saw.

use std::hash::{BuildHasher, Hasher};

/// An empty bucket.
const EMPTY: u32 = u32::MAX;
/// The end of the recency list (links are 31 bits).
const END: u32 = 0x7FFF_FFFF;
/// The top bit of an entry's next field: the entry describes a parity block.
const PARITY_BIT: u32 = 1 << 31;
/// Most entries an index may hold (entry numbers must stay below [`END`]).
pub const MAX_ENTRIES: usize = END as usize - 1;
/// Entries per slab chunk (fewer when the bound is smaller).
const CHUNK_ENTRIES: usize = 4096;
/// Fixed bytes of an entry besides its key: slot, prev, next.
const ENTRY_TAIL_BYTES: usize = 12;

/// What an insert changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Inserted {
    /// The entry now holding the key.
    pub entry: u32,
    /// A slot that lost its entry: the evicted least recently used one, or
    /// the key's previous slot when the key was already present (with
    /// another slot).
    pub displaced: Option<u32>,
}

pub struct FingerprintIndex {
    key_bytes: usize,
    stride: usize,
    chunk_entries: usize,
    chunks: Vec<Box<[u8]>>,
    /// Entry numbers, EMPTY where empty; a power of two long (or empty).
    buckets: Vec<u32>,
    seed: u64,
    len: usize,
    /// Entries ever made (the slab's high-water mark).
    made: usize,
    /// Freed entries, linked through their prev field.
    free_head: u32,
    /// Most recently used.
    head: u32,
    /// Least recently used.
    tail: u32,
    capacity: usize,
    evictions: u64,
    parity_entries: usize,
}

impl FingerprintIndex {
    /// An index of `key_bytes`-long digests (1 to 32) holding at most
    /// `capacity` entries (clamped to 1..=[`MAX_ENTRIES`]).
    pub fn new(key_bytes: usize, capacity: usize) -> FingerprintIndex {
        assert!(
            (1..=32).contains(&key_bytes),
            "a digest is 1 to 32 bytes, not {key_bytes}"
        );
        let capacity = capacity.clamp(1, MAX_ENTRIES);
        let seed = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        FingerprintIndex {
            key_bytes,
            stride: key_bytes + ENTRY_TAIL_BYTES,
            chunk_entries: CHUNK_ENTRIES.min(capacity.next_power_of_two()),
            chunks: Vec::new(),
            buckets: Vec::new(),
            seed,
            len: 0,
            made: 0,
            free_head: END,
            head: END,
            tail: END,
            capacity,
            evictions: 0,
            parity_entries: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Entries inserted for parity blocks (the rest are data).
    pub fn parity_entries(&self) -> usize {
        self.parity_entries
    }

    /// Bytes of one entry in the slab (digest + 12).
    pub fn entry_bytes(&self) -> usize {
        self.stride
    }

    fn rec(&self, e: u32) -> &[u8] {
        let (c, i) = (
            e as usize / self.chunk_entries,
            e as usize % self.chunk_entries,
        );
        &self.chunks[c][i * self.stride..(i + 1) * self.stride]
    }

    fn field(&self, e: u32, n: usize) -> u32 {
        let at = self.key_bytes + 4 * n;
        let r = self.rec(e);
        u32::from_le_bytes([r[at], r[at + 1], r[at + 2], r[at + 3]])
    }

    fn set_field(&mut self, e: u32, n: usize, v: u32) {
        let at = self.key_bytes + 4 * n;
        let (c, i) = (
            e as usize / self.chunk_entries,
            e as usize % self.chunk_entries,
        );
        let start = i * self.stride + at;
        self.chunks[c][start..start + 4].copy_from_slice(&v.to_le_bytes());
    }

    /// Whether `e` names an entry of the slab (live or freed).
    pub fn holds(&self, e: u32) -> bool {
        (e as usize) < self.made
    }

    /// The digest an entry holds.
    pub fn key(&self, e: u32) -> &[u8] {
        &self.rec(e)[..self.key_bytes]
    }

    /// The slot an entry points at.
    pub fn slot(&self, e: u32) -> u32 {
        self.field(e, 0)
    }

    fn prev(&self, e: u32) -> u32 {
        self.field(e, 1)
    }

    fn next(&self, e: u32) -> u32 {
        self.field(e, 2) & !PARITY_BIT
    }

    fn is_parity(&self, e: u32) -> bool {
        self.field(e, 2) & PARITY_BIT != 0
    }

    fn set_prev(&mut self, e: u32, p: u32) {
        self.set_field(e, 1, p)
    }

    fn set_next(&mut self, e: u32, n: u32) {
        let tag = self.field(e, 2) & PARITY_BIT;
        self.set_field(e, 2, n | tag)
    }

    fn home(&self, key: &[u8]) -> usize {
        let mut word = [0u8; 8];
        let n = key.len().min(8);
        word[..n].copy_from_slice(&key[..n]);
        let h = (u64::from_le_bytes(word) ^ self.seed).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (h >> (64 - self.buckets.len().trailing_zeros())) as usize
    }

    /// The bucket holding `key`'s entry, if any.
    fn find(&self, key: &[u8]) -> Option<usize> {
        if self.buckets.is_empty() {
            return None;
        }
        let mask = self.buckets.len() - 1;
        let mut b = self.home(key);
        loop {
            let e = self.buckets[b];
            if e == EMPTY {
                return None;
            }
            if self.key(e) == key {
                return Some(b);
            }
            b = (b + 1) & mask;
        }
    }

    /// Puts entry `e` into the first empty bucket of its key's run.
    fn place(&mut self, e: u32) {
        let mask = self.buckets.len() - 1;
        let mut b = self.home(self.key(e));
        while self.buckets[b] != EMPTY {
            b = (b + 1) & mask;
        }
        self.buckets[b] = e;
    }

    /// Empties bucket `b`, shifting later members of its run back so that
    /// every entry stays reachable from its home bucket.
    fn clear_bucket(&mut self, mut b: usize) {
        let mask = self.buckets.len() - 1;
        let mut j = b;
        loop {
            j = (j + 1) & mask;
            let e = self.buckets[j];
            if e == EMPTY {
                break;
            }
            let h = self.home(self.key(e));
            // The entry at j may move to b unless its home lies cyclically
            // in (b, j]: then b is before its home and it must stay.
            let stays = if b <= j {
                b < h && h <= j
            } else {
                b < h || h <= j
            };
            if !stays {
                self.buckets[b] = e;
                b = j;
            }
        }
        self.buckets[b] = EMPTY;
    }

    /// Grows the bucket table (doubling) so that one more entry keeps it
    /// at most 3/4 full.
    fn reserve_one(&mut self) {
        let want = self.len + 1;
        if !self.buckets.is_empty() && want * 4 <= self.buckets.len() * 3 {
            return;
        }
        let mut n = self.buckets.len().max(8);
        while want * 4 > n * 3 {
            n *= 2;
        }
        let old = std::mem::replace(&mut self.buckets, vec![EMPTY; n]);
        for e in old {
            if e != EMPTY {
                self.place(e);
            }
        }
    }

    fn unlink(&mut self, e: u32) {
        let (p, n) = (self.prev(e), self.next(e));
        if p != END {
            self.set_next(p, n);
        } else {
            self.head = n;
        }
        if n != END {
            self.set_prev(n, p);
        } else {
            self.tail = p;
        }
    }

    fn push_front(&mut self, e: u32) {
        let head = self.head;
        self.set_prev(e, END);
        self.set_next(e, head);
        if head != END {
            self.set_prev(head, e);
        }
        self.head = e;
        if self.tail == END {
            self.tail = e;
        }
    }

    /// Looks a key up and marks it most recently used.
    pub fn get(&mut self, key: &[u8]) -> Option<u32> {
        let e = self.buckets[self.find(key)?];
        self.unlink(e);
        self.push_front(e);
        Some(self.slot(e))
    }

    /// Looks a key up without touching recency.
    pub fn peek(&self, key: &[u8]) -> Option<u32> {
        self.find(key).map(|b| self.slot(self.buckets[b]))
    }

    /// A fresh entry number (reusing a freed one first).
    fn new_entry(&mut self) -> u32 {
        if self.free_head != END {
            let e = self.free_head;
            self.free_head = self.prev(e);
            return e;
        }
        let e = self.made;
        if e / self.chunk_entries == self.chunks.len() {
            self.chunks
                .push(vec![0u8; self.chunk_entries * self.stride].into_boxed_slice());
        }
        self.made += 1;
        e as u32
    }

    /// Removes entry `e` (from the table, the recency list and the counts)
    /// and puts it on the free list.
    pub fn remove(&mut self, e: u32) {
        let b = self
            .find(self.key(e))
            .expect("a live entry is in the table");
        debug_assert_eq!(self.buckets[b], e);
        self.clear_bucket(b);
        self.unlink(e);
        self.parity_entries -= self.is_parity(e) as usize;
        self.len -= 1;
        self.set_field(e, 2, END);
        self.set_prev(e, self.free_head);
        self.free_head = e;
    }

    /// Inserts `key` → `slot` as the most recently used entry (tagged
    /// parity or data), evicting the least recently used entry when full.
    /// A key already present moves to `slot`.
    pub fn insert(&mut self, key: &[u8], slot: u32, parity: bool) -> Inserted {
        assert_eq!(key.len(), self.key_bytes, "digest length of this index");
        if let Some(b) = self.find(key) {
            let e = self.buckets[b];
            let old = self.slot(e);
            self.set_field(e, 0, slot);
            self.parity_entries =
                self.parity_entries + parity as usize - self.is_parity(e) as usize;
            self.unlink(e);
            let tagged = (self.field(e, 2) & !PARITY_BIT) | if parity { PARITY_BIT } else { 0 };
            self.set_field(e, 2, tagged);
            self.push_front(e);
            return Inserted {
                entry: e,
                displaced: (old != slot).then_some(old),
            };
        }
        let mut displaced = None;
        if self.len >= self.capacity {
            let lru = self.tail;
            displaced = Some(self.slot(lru));
            self.remove(lru);
            self.evictions += 1;
        }
        self.reserve_one();
        let e = self.new_entry();
        let (c, i) = (
            e as usize / self.chunk_entries,
            e as usize % self.chunk_entries,
        );
        let start = i * self.stride;
        self.chunks[c][start..start + self.key_bytes].copy_from_slice(key);
        self.set_field(e, 0, slot);
        self.set_field(e, 2, if parity { PARITY_BIT | END } else { END });
        self.push_front(e);
        self.place(e);
        self.len += 1;
        self.parity_entries += parity as usize;
        Inserted {
            entry: e,
            displaced,
        }
    }

    /// Every entry, least recently used first (the order in which
    /// inserting them into an empty index rebuilds this one's recency):
    /// what a snapshot persists.
    pub fn least_recent_first(&self) -> Vec<u32> {
        let mut out = Vec::with_capacity(self.len);
        let mut e = self.tail;
        while e != END {
            out.push(e);
            e = self.prev(e);
        }
        out
    }

    /// Bytes the index holds in RAM: the slab's chunks, the vector of
    /// their pointers, and the bucket table.
    pub fn ram_bytes(&self) -> u64 {
        let chunks = self.chunks.len() * self.chunk_entries * self.stride;
        let pointers = self.chunks.capacity() * std::mem::size_of::<Box<[u8]>>();
        let buckets = self.buckets.capacity() * 4;
        (chunks + pointers + buckets) as u64
    }

    /// Checks the structure against itself: the table and the recency list
    /// hold the same `len` entries, every entry is found from its home
    /// bucket, the parity count matches. Returns problems (for scrub).
    pub fn check(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let mut listed = 0usize;
        let mut parity = 0usize;
        let mut e = self.head;
        let mut prev = END;
        while e != END && listed <= self.len {
            if self.prev(e) != prev {
                problems.push(format!("entry {e}: broken back link"));
            }
            match self.find(self.key(e)) {
                Some(b) if self.buckets[b] == e => {}
                _ => problems.push(format!("entry {e} is not found from its key")),
            }
            parity += self.is_parity(e) as usize;
            listed += 1;
            prev = e;
            e = self.next(e);
        }
        let in_table = self.buckets.iter().filter(|&&e| e != EMPTY).count();
        if listed != self.len || in_table != self.len {
            problems.push(format!(
                "{} entries counted, {listed} on the recency list, {in_table} in the table",
                self.len
            ));
        }
        if parity != self.parity_entries {
            problems.push(format!(
                "{parity} parity entries listed, {} counted",
                self.parity_entries
            ));
        }
        problems
    }
}

/// A global allocator for this crate's unit tests that counts the bytes
/// the *current thread* holds, so a test can compare a structure's computed
/// footprint with what it really allocated while other tests run beside it.
#[cfg(test)]
pub(crate) mod counting_alloc {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    thread_local! {
        static LIVE_BYTES: Cell<i64> = const { Cell::new(0) };
    }

    pub struct Counting;

    // SAFETY: forwards every call to the system allocator unchanged; the
    // bookkeeping touches only a const-initialised thread-local (no
    // allocation, `try_with` tolerates thread teardown).
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            let _ = LIVE_BYTES.try_with(|c| c.set(c.get() + layout.size() as i64));
            System.alloc(layout)
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            let _ = LIVE_BYTES.try_with(|c| c.set(c.get() - layout.size() as i64));
            System.dealloc(ptr, layout)
        }
    }

    #[global_allocator]
    static ALLOCATOR: Counting = Counting;

    /// Bytes allocated and not yet freed by this thread.
    pub fn live_bytes() -> i64 {
        LIVE_BYTES.with(|c| c.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    /// A 20-byte key (SHA-1 sized) whose first bytes are `i`.
    fn key(i: u64) -> [u8; 20] {
        let mut k = [0u8; 20];
        k[..8].copy_from_slice(&i.to_le_bytes());
        k[12..20].copy_from_slice(&i.wrapping_mul(0x9E37_79B9).to_le_bytes());
        k
    }

    #[test]
    fn ram_bytes_is_what_the_allocator_handed_out() {
        for entries in [0usize, 1, 3, 7, 8, 100, 1000, 4097, 20_000] {
            let before = counting_alloc::live_bytes();
            let mut ix = FingerprintIndex::new(20, entries.max(1));
            for i in 0..entries {
                ix.insert(&key(i as u64), i as u32, false);
            }
            let held = counting_alloc::live_bytes() - before;
            assert_eq!(ix.ram_bytes() as i64, held, "{entries} entries");
            drop(ix);
            assert_eq!(counting_alloc::live_bytes(), before);
        }
    }

    #[test]
    fn a_sha1_entry_costs_about_forty_bytes() {
        let mut ix = FingerprintIndex::new(20, 1 << 20);
        let n = 200_000u64;
        for i in 0..n {
            ix.insert(&key(i), i as u32, true);
        }
        assert_eq!(ix.entry_bytes(), 32);
        let per_entry = ix.ram_bytes() as f64 / n as f64;
        // 32-byte records plus 4-byte buckets at 3/8..3/4 load.
        assert!((36.0..44.0).contains(&per_entry), "{per_entry} bytes");
    }

    #[test]
    fn an_index_that_evicts_and_removes_still_knows_its_allocation() {
        let before = counting_alloc::live_bytes();
        let mut ix = FingerprintIndex::new(16, 1000);
        let mut live = std::collections::HashMap::new();
        for i in 0..20_000u64 {
            let ins = ix.insert(&key(i)[..16], i as u32, i % 2 == 0);
            if let Some(d) = ins.displaced {
                live.retain(|_, s: &mut u32| *s != d);
            }
            live.insert(i, ins.entry);
            if i % 3 == 0 {
                if let Some(e) = live.remove(&(i / 2)) {
                    ix.remove(e);
                }
            }
            assert_eq!(
                ix.ram_bytes() as i64,
                counting_alloc::live_bytes() - before - live_map_bytes(&live),
                "after {i}"
            );
        }
        assert!(ix.check().is_empty(), "{:?}", ix.check());
    }

    /// What the test's own bookkeeping map holds (so the index's bytes can
    /// be told apart): measured by cloning it under the counter.
    fn live_map_bytes(m: &std::collections::HashMap<u64, u32>) -> i64 {
        let before = counting_alloc::live_bytes();
        let copy = m.clone();
        let bytes = counting_alloc::live_bytes() - before;
        drop(copy);
        bytes
    }

    #[test]
    fn the_least_recently_used_entry_is_evicted_first() {
        let mut ix = FingerprintIndex::new(20, 2);
        ix.insert(&key(1), 10, false);
        ix.insert(&key(2), 20, false);
        assert_eq!(ix.get(&key(1)), Some(10));
        let ins = ix.insert(&key(3), 30, false);
        assert_eq!(ins.displaced, Some(20), "2 was least recently used");
        assert_eq!(ix.peek(&key(2)), None);
        assert_eq!(ix.peek(&key(1)), Some(10));
        assert_eq!(ix.peek(&key(3)), Some(30));
        assert_eq!(ix.evictions(), 1);
    }

    #[test]
    fn a_key_inserted_again_moves_to_its_new_slot_and_reports_the_old_one() {
        let mut ix = FingerprintIndex::new(20, 4);
        ix.insert(&key(1), 10, true);
        let ins = ix.insert(&key(1), 11, false);
        assert_eq!(ins.displaced, Some(10));
        assert_eq!(ix.peek(&key(1)), Some(11));
        assert_eq!((ix.len(), ix.parity_entries()), (1, 0));
        let same = ix.insert(&key(1), 11, false);
        assert_eq!(same.displaced, None);
    }

    #[test]
    fn reinserting_in_least_recent_first_order_keeps_the_recency() {
        let mut ix = FingerprintIndex::new(20, 4);
        for k in 0..4u64 {
            ix.insert(&key(k), k as u32, false);
        }
        ix.get(&key(0));
        let order: Vec<u32> = ix
            .least_recent_first()
            .into_iter()
            .map(|e| ix.slot(e))
            .collect();
        assert_eq!(order, vec![1, 2, 3, 0]);
        let mut again = FingerprintIndex::new(20, 3);
        for e in ix.least_recent_first() {
            again.insert(ix.key(e), ix.slot(e), false);
        }
        assert_eq!(again.peek(&key(1)), None, "1 was least recently used");
        let order: Vec<u32> = again
            .least_recent_first()
            .into_iter()
            .map(|e| again.slot(e))
            .collect();
        assert_eq!(order, vec![2, 3, 0]);
    }

    #[test]
    fn an_index_at_its_bound_evicts_and_never_grows() {
        let mut ix = FingerprintIndex::new(20, 100);
        for i in 0..10_000u64 {
            ix.insert(&key(i), i as u32, false);
            assert!(ix.len() <= 100);
        }
        assert_eq!(ix.len(), 100);
        assert!(ix.made <= 100);
        assert!(ix.buckets.len() <= 256);
    }

    #[test]
    fn keys_that_share_a_home_bucket_stay_findable_through_removals() {
        // Keys equal in their first 8 bytes always share a home bucket:
        // one long run, with removals from its middle.
        let mut ix = FingerprintIndex::new(20, 64);
        let k = |i: u8| {
            let mut k = [7u8; 20];
            k[19] = i;
            k
        };
        let mut entries = Vec::new();
        for i in 0..40u8 {
            entries.push(ix.insert(&k(i), i as u32, false).entry);
        }
        for i in (0..40u8).step_by(3) {
            ix.remove(entries[i as usize]);
        }
        for i in 0..40u8 {
            let want = (i % 3 != 0).then_some(i as u32);
            assert_eq!(ix.peek(&k(i)), want, "key {i}");
        }
        assert!(ix.check().is_empty(), "{:?}", ix.check());
    }

    proptest! {
        #[test]
        fn the_index_behaves_like_a_recency_list(
            cap in 1usize..8,
            ops in proptest::collection::vec((0u8..3, 0u8..12, 0u32..5, any::<bool>()), 1..200)
        ) {
            let mut ix = FingerprintIndex::new(4, cap);
            // front = most recent: (key, slot, parity)
            let mut model: VecDeque<(u8, u32, bool)> = VecDeque::new();
            // Keys share few home buckets: only the first byte varies.
            let k = |key: u8| [key, 0, 0, 0];
            for (op, key, slot, parity) in ops {
                match op {
                    0 => {
                        let ins = ix.insert(&k(key), slot, parity);
                        let old = model.iter().position(|(mk, _, _)| *mk == key);
                        let want = match old {
                            Some(p) => {
                                let (_, s, _) = model.remove(p).unwrap();
                                (s != slot).then_some(s)
                            }
                            None if model.len() == cap => model.pop_back().map(|(_, s, _)| s),
                            None => None,
                        };
                        prop_assert_eq!(ins.displaced, want);
                        model.push_front((key, slot, parity));
                    }
                    1 => {
                        let got = ix.get(&k(key));
                        let pos = model.iter().position(|(mk, _, _)| *mk == key);
                        prop_assert_eq!(got, pos.map(|p| model[p].1));
                        if let Some(p) = pos {
                            let e = model.remove(p).unwrap();
                            model.push_front(e);
                        }
                    }
                    _ => {
                        let pos = model.iter().position(|(mk, _, _)| *mk == key);
                        if let Some(p) = pos {
                            let e = ix
                                .least_recent_first()
                                .into_iter()
                                .find(|&e| ix.key(e) == k(key))
                                .unwrap();
                            ix.remove(e);
                            model.remove(p);
                        }
                    }
                }
                prop_assert_eq!(ix.len(), model.len());
                prop_assert_eq!(
                    ix.parity_entries(),
                    model.iter().filter(|(_, _, p)| *p).count()
                );
                let order: Vec<u32> = ix.least_recent_first().into_iter().map(|e| ix.slot(e)).collect();
                let want: Vec<u32> = model.iter().rev().map(|(_, s, _)| *s).collect();
                prop_assert_eq!(order, want);
                prop_assert!(ix.check().is_empty(), "{:?}", ix.check());
            }
        }
    }
}
