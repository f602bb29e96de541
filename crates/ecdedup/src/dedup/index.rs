//! The fingerprint index: fingerprint → slot, bounded, least recently used
//! entry evicted first.
//!
//! Entries live in a slab (`Vec<Node>`) linked into a recency list by
//! indices, with a hash map from key to node. Capacity is fixed at
//! construction: nothing grows past it, and an insert into a full index
//! evicts the least recently used entry. An evicted fingerprint means a
//! missed dedup, never an error. `ram_bytes` computes what the structures
//! allocate: the slab's `Vec` capacity, and for the hash table hashbrown's
//! layout ([`hash_table_bytes`]: buckets, then one control byte per bucket
//! plus one SIMD group), with the bucket count tracked by [`SizedMap`]
//! (std does not expose it, and `capacity()` under-reports it once removals
//! leave tombstones). Tests check the result against the bytes a counting
//! allocator saw.

use std::collections::HashMap;
use std::hash::Hash;

/// A std `HashMap` that knows its bucket count, hence its exact allocation
/// ([`SizedMap::ram_bytes`]). The table only grows (nothing here shrinks
/// it), and right after it grows it holds no tombstones, so `capacity()`
/// observed after every insert gives the bucket count exactly; in between,
/// removals can only lower `capacity()`, so the maximum seen is kept.
/// Read access goes through `Deref`; every mutation through the methods
/// here.
pub struct SizedMap<K, V> {
    map: HashMap<K, V>,
    buckets: usize,
}

impl<K: Hash + Eq, V> Default for SizedMap<K, V> {
    fn default() -> Self {
        SizedMap {
            map: HashMap::new(),
            buckets: 0,
        }
    }
}

impl<K: Hash + Eq, V> SizedMap<K, V> {
    fn observe(&mut self) {
        self.buckets = self.buckets.max(buckets_for(self.map.capacity()));
    }

    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        let old = self.map.insert(key, value);
        self.observe();
        old
    }

    pub fn remove(&mut self, key: &K) -> Option<V> {
        self.map.remove(key)
    }

    pub fn retain(&mut self, f: impl FnMut(&K, &mut V) -> bool) {
        self.map.retain(f)
    }

    /// Buckets of the table (0 before the first insert).
    pub fn buckets(&self) -> usize {
        self.buckets
    }

    /// Bytes the table's single allocation holds.
    pub fn ram_bytes(&self) -> u64 {
        hash_table_bytes(
            self.buckets,
            std::mem::size_of::<(K, V)>(),
            std::mem::align_of::<(K, V)>(),
        )
    }
}

impl<K, V> std::ops::Deref for SizedMap<K, V> {
    type Target = HashMap<K, V>;
    fn deref(&self) -> &HashMap<K, V> {
        &self.map
    }
}

impl<K: Hash + Eq, V> FromIterator<(K, V)> for SizedMap<K, V> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut m = SizedMap::default();
        for (k, v) in iter {
            m.insert(k, v);
        }
        m
    }
}

const NIL: u32 = u32::MAX;

#[derive(Clone, Copy)]
struct Node<K> {
    key: K,
    slot: u64,
    prev: u32,
    next: u32,
    /// The entry describes a parity block (for the per-class counts; it
    /// fits in the node's padding).
    parity: bool,
}

pub struct LruIndex<K> {
    map: SizedMap<K, u32>,
    nodes: Vec<Node<K>>,
    free: Vec<u32>,
    /// Most recently used.
    head: u32,
    /// Least recently used.
    tail: u32,
    capacity: usize,
    evictions: u64,
    /// Entries tagged parity.
    parity_entries: usize,
}

impl<K: Hash + Eq + Copy> LruIndex<K> {
    /// An index holding at most `capacity` entries (at least 1).
    pub fn new(capacity: usize) -> LruIndex<K> {
        let capacity = capacity.max(1);
        assert!(capacity < NIL as usize);
        LruIndex {
            map: SizedMap::default(),
            nodes: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
            capacity,
            evictions: 0,
            parity_entries: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
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

    fn unlink(&mut self, i: u32) {
        let Node { prev, next, .. } = self.nodes[i as usize];
        if prev != NIL {
            self.nodes[prev as usize].next = next;
        } else {
            self.head = next;
        }
        if next != NIL {
            self.nodes[next as usize].prev = prev;
        } else {
            self.tail = prev;
        }
    }

    fn push_front(&mut self, i: u32) {
        self.nodes[i as usize].prev = NIL;
        self.nodes[i as usize].next = self.head;
        if self.head != NIL {
            self.nodes[self.head as usize].prev = i;
        }
        self.head = i;
        if self.tail == NIL {
            self.tail = i;
        }
    }

    /// Looks a key up and marks it most recently used.
    pub fn get(&mut self, key: &K) -> Option<u64> {
        let i = *self.map.get(key)?;
        self.unlink(i);
        self.push_front(i);
        Some(self.nodes[i as usize].slot)
    }

    /// Looks a key up without touching recency.
    pub fn peek(&self, key: &K) -> Option<u64> {
        self.map.get(key).map(|&i| self.nodes[i as usize].slot)
    }

    /// Inserts or updates (a data entry); evicts the least recently used
    /// entry when full.
    pub fn insert(&mut self, key: K, slot: u64) {
        self.insert_class(key, slot, false);
    }

    /// As [`insert`](Self::insert), tagging the entry parity or data.
    pub fn insert_class(&mut self, key: K, slot: u64, parity: bool) {
        if let Some(&i) = self.map.get(&key) {
            let n = &mut self.nodes[i as usize];
            n.slot = slot;
            self.parity_entries = self.parity_entries + parity as usize - n.parity as usize;
            n.parity = parity;
            self.unlink(i);
            self.push_front(i);
            return;
        }
        if self.map.len() >= self.capacity {
            let lru = self.tail;
            let old = self.nodes[lru as usize].key;
            self.parity_entries -= self.nodes[lru as usize].parity as usize;
            self.unlink(lru);
            self.map.remove(&old);
            self.free.push(lru);
            self.evictions += 1;
        }
        self.parity_entries += parity as usize;
        let node = Node {
            key,
            slot,
            prev: NIL,
            next: NIL,
            parity,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        self.map.insert(key, i);
        self.push_front(i);
    }

    /// Removes `key` if it maps to `slot` (a freed slot must not be found).
    pub fn remove_if(&mut self, key: &K, slot: u64) -> bool {
        match self.map.get(key) {
            Some(&i) if self.nodes[i as usize].slot == slot => {
                self.parity_entries -= self.nodes[i as usize].parity as usize;
                self.unlink(i);
                self.map.remove(key);
                self.free.push(i);
                true
            }
            _ => false,
        }
    }

    /// The slots of every entry, least recently used first (the order in
    /// which inserting them into an empty index rebuilds this one's
    /// recency): what a snapshot persists.
    pub fn slots_least_recent_first(&self) -> Vec<u64> {
        let mut out = Vec::with_capacity(self.map.len());
        let mut i = self.tail;
        while i != NIL {
            out.push(self.nodes[i as usize].slot);
            i = self.nodes[i as usize].prev;
        }
        out
    }

    /// Bytes the index holds in RAM: the hash table (as hashbrown lays it
    /// out, [`hash_table_bytes`]) and the slab and its free list.
    pub fn ram_bytes(&self) -> u64 {
        let table = self.map.ram_bytes();
        let slab =
            self.nodes.capacity() * std::mem::size_of::<Node<K>>() + self.free.capacity() * 4;
        table + slab as u64
    }
}

/// Width of hashbrown's control-byte group: 16 with SSE2, else 8.
const GROUP_WIDTH: usize = if cfg!(all(
    target_feature = "sse2",
    any(target_arch = "x86", target_arch = "x86_64")
)) {
    16
} else {
    8
};

/// The fewest buckets whose usable capacity holds `capacity` items:
/// hashbrown keeps a power of two of buckets (at least 4) and fills at most
/// 7/8 of them (all but one below 8 buckets).
fn buckets_for(capacity: usize) -> usize {
    if capacity == 0 {
        return 0;
    }
    let mut b = 4usize;
    while usable(b) < capacity {
        b *= 2;
    }
    b
}

fn usable(buckets: usize) -> usize {
    if buckets < 8 {
        buckets - 1
    } else {
        buckets / 8 * 7
    }
}

/// Bytes std's `HashMap` (hashbrown) allocates for a table of `buckets`
/// buckets holding (key, value) tuples of `entry_bytes` aligned to
/// `entry_align`: one allocation of the bucket array rounded up to the
/// control bytes' alignment, then one control byte per bucket plus one
/// group of [`GROUP_WIDTH`] (so probes never wrap). No buckets, no bytes.
pub fn hash_table_bytes(buckets: usize, entry_bytes: usize, entry_align: usize) -> u64 {
    if buckets == 0 {
        return 0;
    }
    debug_assert!(buckets.is_power_of_two(), "hashbrown keeps 2^n buckets");
    let ctrl_align = GROUP_WIDTH.max(entry_align);
    let data = (buckets * entry_bytes).div_ceil(ctrl_align) * ctrl_align;
    (data + buckets + GROUP_WIDTH) as u64
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
    use crate::fingerprint::Fingerprint;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    #[test]
    fn ram_bytes_is_what_the_allocator_handed_out() {
        for entries in [0usize, 1, 3, 7, 8, 100, 1000, 4097] {
            let before = counting_alloc::live_bytes();
            let mut ix: LruIndex<Fingerprint> = LruIndex::new(entries.max(1));
            for i in 0..entries {
                let mut bytes = [0u8; 20];
                bytes[..8].copy_from_slice(&(i as u64).to_le_bytes());
                ix.insert(Fingerprint::from_slice(&bytes).expect("20 bytes"), i as u64);
            }
            let held = counting_alloc::live_bytes() - before;
            assert_eq!(ix.ram_bytes() as i64, held, "{entries} entries");
            drop(ix);
            assert_eq!(counting_alloc::live_bytes(), before);
        }
    }

    #[test]
    fn a_sized_map_knows_its_allocation_through_inserts_and_removals() {
        let fp = |i: u32| Fingerprint::from_slice(&i.to_le_bytes()).expect("4 bytes");
        for n in [1u32, 5, 29, 1000, 100_000] {
            let before = counting_alloc::live_bytes();
            let mut m: SizedMap<u32, Fingerprint> = (0..n).map(|i| (i, fp(i))).collect();
            assert_eq!(m.ram_bytes() as i64, counting_alloc::live_bytes() - before);
            // Removals leave tombstones (capacity() drops), then more
            // inserts rehash or grow: the count stays exact.
            for i in (0..n).step_by(2) {
                m.remove(&i);
                assert_eq!(m.ram_bytes() as i64, counting_alloc::live_bytes() - before);
            }
            for i in n..n + n / 2 + 3 {
                m.insert(i, fp(i));
                assert_eq!(
                    m.ram_bytes() as i64,
                    counting_alloc::live_bytes() - before,
                    "{n}: after inserting {i}"
                );
            }
        }
    }

    #[test]
    fn an_index_that_evicts_and_removes_still_knows_its_allocation() {
        let before = counting_alloc::live_bytes();
        let mut ix: LruIndex<u64> = LruIndex::new(1000);
        for i in 0..20_000u64 {
            ix.insert(i, i);
            if i % 3 == 0 {
                ix.remove_if(&(i / 2), i / 2);
            }
            assert_eq!(
                ix.ram_bytes() as i64,
                counting_alloc::live_bytes() - before,
                "after {i}"
            );
        }
    }

    #[test]
    fn the_least_recently_used_entry_is_evicted_first() {
        let mut ix = LruIndex::new(2);
        ix.insert(1u32, 10);
        ix.insert(2, 20);
        assert_eq!(ix.get(&1), Some(10));
        ix.insert(3, 30);
        assert_eq!(ix.peek(&2), None, "2 was least recently used");
        assert_eq!(ix.peek(&1), Some(10));
        assert_eq!(ix.peek(&3), Some(30));
        assert_eq!(ix.evictions(), 1);
    }

    #[test]
    fn reinserting_in_least_recent_first_order_keeps_the_recency() {
        let mut ix = LruIndex::new(4);
        for k in 0..4u32 {
            ix.insert(k, k as u64);
        }
        ix.get(&0);
        assert_eq!(ix.slots_least_recent_first(), vec![1, 2, 3, 0]);
        let mut again = LruIndex::new(3);
        for s in ix.slots_least_recent_first() {
            again.insert(s as u32, s);
        }
        assert_eq!(again.peek(&1), None, "1 was least recently used");
        assert_eq!(again.slots_least_recent_first(), vec![2, 3, 0]);
    }

    #[test]
    fn an_index_at_its_bound_evicts_and_never_grows() {
        let mut ix = LruIndex::new(100);
        for i in 0..10_000u64 {
            ix.insert(i, i);
            assert!(ix.len() <= 100);
        }
        assert_eq!(ix.len(), 100);
        assert!(ix.nodes.len() <= 100);
    }

    proptest! {
        #[test]
        fn the_index_behaves_like_a_recency_list(
            cap in 1usize..8,
            ops in proptest::collection::vec((0u8..3, 0u8..12, 0u64..5), 1..200)
        ) {
            let mut ix = LruIndex::new(cap);
            let mut model: VecDeque<(u8, u64)> = VecDeque::new(); // front = most recent
            for (op, key, slot) in ops {
                match op {
                    0 => {
                        ix.insert(key, slot);
                        model.retain(|(k, _)| *k != key);
                        model.push_front((key, slot));
                        model.truncate(cap);
                    }
                    1 => {
                        let got = ix.get(&key);
                        let pos = model.iter().position(|(k, _)| *k == key);
                        prop_assert_eq!(got, pos.map(|p| model[p].1));
                        if let Some(p) = pos {
                            let e = model.remove(p).unwrap();
                            model.push_front(e);
                        }
                    }
                    _ => {
                        let removed = ix.remove_if(&key, slot);
                        let pos = model.iter().position(|(k, s)| *k == key && *s == slot);
                        prop_assert_eq!(removed, pos.is_some());
                        if let Some(p) = pos {
                            model.remove(p);
                        }
                    }
                }
                prop_assert_eq!(ix.len(), model.len());
            }
        }
    }
}
