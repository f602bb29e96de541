//! The fingerprint cache of the archive tier: fingerprint of a unique block
//! → its address (container, sub-file, column), bounded in bytes, least
//! recently used entry evicted first (paper 001's "cache").
//!
//! The bound is accounted at [`ENTRY_BYTES`] per entry, an estimate of what
//! the two maps below hold per entry (fingerprint twice, address, recency
//! stamp, and the maps' own overhead). An evicted fingerprint is a missed
//! dedup, never an error. The cache is saved beside the catalog after each
//! seal (see `ArchiveStore`) so deduplication spans commands; entries that
//! name a container no longer sealed are dropped when it is loaded.

use super::map::BlockAddress;
use ecdedup_core::fingerprint::Fingerprint;
use std::collections::{BTreeMap, HashMap};

/// Accounted bytes per cache entry.
pub const ENTRY_BYTES: u64 = 128;

#[derive(Debug, Default)]
pub struct FingerprintCache {
    capacity_entries: usize,
    entries: HashMap<Fingerprint, (BlockAddress, u64)>,
    by_age: BTreeMap<u64, Fingerprint>,
    clock: u64,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
}

impl FingerprintCache {
    pub fn new(cache_bytes: u64) -> FingerprintCache {
        FingerprintCache {
            capacity_entries: (cache_bytes / ENTRY_BYTES).max(1) as usize,
            ..Default::default()
        }
    }

    pub fn entries(&self) -> usize {
        self.entries.len()
    }

    /// Accounted bytes now held.
    pub fn bytes(&self) -> u64 {
        self.entries.len() as u64 * ENTRY_BYTES
    }

    /// The address of a fingerprint's source block, refreshing its age.
    pub fn get(&mut self, fp: &Fingerprint) -> Option<BlockAddress> {
        self.clock += 1;
        let clock = self.clock;
        match self.entries.get_mut(fp) {
            Some((address, age)) => {
                self.by_age.remove(age);
                *age = clock;
                self.by_age.insert(clock, *fp);
                self.hits += 1;
                Some(*address)
            }
            None => {
                self.misses += 1;
                None
            }
        }
    }

    /// Records (or moves) a fingerprint's source block, evicting the least
    /// recently used entry when full.
    pub fn insert(&mut self, fp: Fingerprint, address: BlockAddress) {
        self.clock += 1;
        if let Some((_, age)) = self.entries.remove(&fp) {
            self.by_age.remove(&age);
        } else if self.entries.len() >= self.capacity_entries {
            if let Some((_, oldest)) = self.by_age.pop_first() {
                self.entries.remove(&oldest);
                self.evictions += 1;
            }
        }
        self.entries.insert(fp, (address, self.clock));
        self.by_age.insert(self.clock, fp);
    }

    /// Drops every entry whose source lies in a container `gone` says is gone.
    pub fn retain_containers(&mut self, keep: impl Fn(u32) -> bool) {
        let by_age = &mut self.by_age;
        self.entries.retain(|_, (address, age)| {
            let kept = keep(address.container);
            if !kept {
                by_age.remove(age);
            }
            kept
        });
    }

    /// Entries oldest first, for saving.
    pub fn oldest_first(&self) -> impl Iterator<Item = (&Fingerprint, BlockAddress)> {
        self.by_age.values().map(|fp| (fp, self.entries[fp].0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ecdedup_core::fingerprint::Algorithm;

    fn address(column: u32) -> BlockAddress {
        BlockAddress {
            container: 0,
            sub_file: 0,
            column,
        }
    }

    #[test]
    fn a_full_cache_evicts_the_least_recently_used_fingerprint() {
        let mut cache = FingerprintCache::new(2 * ENTRY_BYTES);
        let fps: Vec<_> = (0u8..3).map(|i| Algorithm::Md5.fingerprint(&[i])).collect();
        cache.insert(fps[0], address(0));
        cache.insert(fps[1], address(1));
        assert_eq!(cache.get(&fps[0]), Some(address(0)));
        cache.insert(fps[2], address(2));
        assert_eq!(cache.get(&fps[1]), None, "1 was least recently used");
        assert_eq!(cache.get(&fps[0]), Some(address(0)));
        assert_eq!(cache.evictions, 1);
        assert!(cache.bytes() <= 2 * ENTRY_BYTES);
    }
}
