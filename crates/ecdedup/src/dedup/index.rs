//! The fingerprint index: fingerprint → slot, bounded, least recently used
//! entry evicted first.
//!
//! Entries live in a slab (`Vec<Node>`) linked into a recency list by
//! indices, with a hash map from key to node. Capacity is fixed at
//! construction: nothing grows past it, and an insert into a full index
//! evicts the least recently used entry. An evicted fingerprint means a
//! missed dedup, never an error. `ram_bytes` counts what the structures
//! really allocate (slab and hash table capacity), so the per-entry figure
//! the stats report is measured, not estimated.

use std::collections::HashMap;
use std::hash::Hash;

const NIL: u32 = u32::MAX;

#[derive(Clone, Copy)]
struct Node<K> {
    key: K,
    slot: u64,
    prev: u32,
    next: u32,
}

pub struct LruIndex<K> {
    map: HashMap<K, u32>,
    nodes: Vec<Node<K>>,
    free: Vec<u32>,
    /// Most recently used.
    head: u32,
    /// Least recently used.
    tail: u32,
    capacity: usize,
    evictions: u64,
}

impl<K: Hash + Eq + Copy> LruIndex<K> {
    /// An index holding at most `capacity` entries (at least 1).
    pub fn new(capacity: usize) -> LruIndex<K> {
        let capacity = capacity.max(1);
        assert!(capacity < NIL as usize);
        LruIndex {
            map: HashMap::new(),
            nodes: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
            capacity,
            evictions: 0,
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

    /// Inserts or updates; evicts the least recently used entry when full.
    pub fn insert(&mut self, key: K, slot: u64) {
        if let Some(&i) = self.map.get(&key) {
            self.nodes[i as usize].slot = slot;
            self.unlink(i);
            self.push_front(i);
            return;
        }
        if self.map.len() >= self.capacity {
            let lru = self.tail;
            let old = self.nodes[lru as usize].key;
            self.unlink(lru);
            self.map.remove(&old);
            self.free.push(lru);
            self.evictions += 1;
        }
        let node = Node {
            key,
            slot,
            prev: NIL,
            next: NIL,
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
                self.unlink(i);
                self.map.remove(key);
                self.free.push(i);
                true
            }
            _ => false,
        }
    }

    /// Bytes the index holds in RAM: the hash table (keys, values and one
    /// control byte per bucket) and the slab.
    pub fn ram_bytes(&self) -> u64 {
        let bucket = std::mem::size_of::<(K, u32)>() + 1;
        let table = self.map.capacity() * bucket;
        let slab =
            self.nodes.capacity() * std::mem::size_of::<Node<K>>() + self.free.capacity() * 4;
        (table + slab) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;

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
