//! The dedup layer's counters of one device (`stats`, section `dedup`):
//! the type lives here, below both the dedup layer that fills it and the
//! reports that print it, so that `counters` depends on neither.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct DedupStats {
    pub policy: String,
    pub algorithm: String,
    pub block_bytes: u64,
    /// Dedup blocks written to media (slot writes).
    pub physical_writes: u64,
    pub physical_write_bytes: u64,
    /// Of those, blocks of parity units.
    pub physical_parity_writes: u64,
    /// Blocks stored as a reference to an existing slot (a log record each).
    pub reference_writes: u64,
    /// Of those, blocks of parity units.
    pub reference_parity_writes: u64,
    /// Bytes of map records and snapshots written (the metadata cost of dedup).
    pub log_bytes: u64,
    /// Blocks fingerprinted; of those, blocks of parity units (data =
    /// hash_ops - hash_parity_ops).
    pub hash_ops: u64,
    #[serde(default)]
    pub hash_parity_ops: u64,
    pub hash_bytes: u64,
    /// Fingerprint hits; of those, for parity blocks.
    pub dedup_hits: u64,
    #[serde(default)]
    pub dedup_parity_hits: u64,
    pub verify_compares: u64,
    pub verify_mismatches: u64,
    pub unmaps: u64,
    /// Map records refused at open: written after the last sync, they
    /// named content their slot did not hold (a power loss kept the record
    /// and lost or tore the slot write); the block kept its older mapping.
    #[serde(default)]
    pub refused_records: u64,
    pub snapshots: u64,
    /// fdatasyncs of the map log (a sync with no new record skips it).
    #[serde(default)]
    pub log_syncs: u64,
    pub mapped_blocks: u64,
    pub slots_used: u64,
    pub index_entries: u64,
    pub index_capacity: u64,
    pub index_evictions: u64,
    /// RAM of the LRU index (slab chunks and bucket table, from their
    /// allocations).
    pub index_bytes: u64,
    /// Index entries inserted for parity blocks, and their share of
    /// index_bytes (entries are all the same size). Entries refilled at
    /// open are counted as parity under the parity policy, as data under
    /// `all` (the class of a slot is not persisted).
    #[serde(default)]
    pub index_parity_entries: u64,
    #[serde(default)]
    pub index_parity_bytes: u64,
    /// index_bytes / entries.
    pub index_bytes_per_entry: f64,
    /// RAM of the slot → index entry table: 4 bytes per slot of the
    /// device (its capacity, not the workload), which lets a freed slot
    /// withdraw its entry and marks slots whose fingerprint was evicted
    /// (still copied on write). Fingerprint memory in all is index_bytes +
    /// slot_entry_bytes.
    #[serde(default, alias = "slot_fingerprint_bytes")]
    pub slot_entry_bytes: u64,
    /// Slots whose content was fingerprinted (in the index or evicted).
    #[serde(default)]
    pub slot_fingerprints: u64,
    /// RAM of the block map, reference counts, free lists and the two
    /// bitmaps cleared at a sync (slots whose count fell, blocks logged).
    pub map_bytes: u64,
    /// Write-path time in ns, summed over writes (and threads): cutting a
    /// write into dedup blocks (with the merge of a partial head or tail),
    /// the backend's hashing, index lookup, verify compare and insert, and
    /// the whole write through this layer (the rest is slot and log I/O).
    #[serde(default)]
    pub chunking_ns: u64,
    #[serde(default)]
    pub fingerprint_ns: u64,
    #[serde(default)]
    pub index_ns: u64,
    #[serde(default)]
    pub write_ns: u64,
}

impl DedupStats {
    /// The Prometheus type and help text of a numeric field: `counter` for
    /// what only grows while the layer is open, `gauge` for sizes and
    /// levels. None for a field this list does not know (a new field then
    /// shows as an untyped sample until it is described here).
    pub fn prometheus_description(field: &str) -> Option<(&'static str, &'static str)> {
        let c = "counter";
        let g = "gauge";
        Some(match field {
            "block_bytes" => (g, "dedup block size in bytes"),
            "physical_writes" => (c, "dedup blocks written to media (slot writes)"),
            "physical_write_bytes" => (c, "bytes written to slots"),
            "physical_parity_writes" => (c, "slot writes of parity blocks"),
            "reference_writes" => (c, "blocks stored as a reference to an existing slot"),
            "reference_parity_writes" => (c, "parity blocks stored as references"),
            "log_bytes" => (c, "bytes of map records and snapshots written"),
            "hash_ops" => (c, "blocks fingerprinted"),
            "hash_parity_ops" => (c, "parity blocks fingerprinted"),
            "hash_bytes" => (c, "bytes fingerprinted"),
            "dedup_hits" => (c, "fingerprint index hits"),
            "dedup_parity_hits" => (c, "fingerprint index hits for parity blocks"),
            "verify_compares" => (c, "byte compares on a fingerprint hit"),
            "verify_mismatches" => (c, "byte compares that differed (collisions)"),
            "unmaps" => (c, "blocks unmapped by discard"),
            "refused_records" => (
                c,
                "map records refused at open: their slot lacked their content",
            ),
            "snapshots" => (c, "map snapshots written"),
            "log_syncs" => (c, "fdatasyncs of the map log"),
            "mapped_blocks" => (g, "blocks that map to a slot"),
            "slots_used" => (g, "slots with at least one reference"),
            "index_entries" => (g, "fingerprint index entries"),
            "index_capacity" => (g, "fingerprint index bound in entries"),
            "index_evictions" => (c, "index entries evicted (least recently used)"),
            "index_bytes" => (g, "RAM of the fingerprint index in bytes"),
            "index_parity_entries" => (g, "index entries for parity blocks"),
            "index_parity_bytes" => (g, "share of index_bytes held by parity entries"),
            "index_bytes_per_entry" => (g, "index_bytes / index_entries"),
            "slot_entry_bytes" => (g, "RAM of the slot to index entry table in bytes"),
            "slot_fingerprints" => (g, "slots whose content was fingerprinted"),
            "map_bytes" => (
                g,
                "RAM of the block map, reference counts, free lists and sync bitmaps",
            ),
            "chunking_ns" => (c, "ns spent cutting writes into dedup blocks"),
            "fingerprint_ns" => (c, "ns spent fingerprinting"),
            "index_ns" => (c, "ns spent in index lookups, verify and inserts"),
            "write_ns" => (c, "ns spent in writes through the layer"),
            _ => return None,
        })
    }
}
