//! The SSD simulator's wear figures of one device (`stats`, section
//! `ssd`): the type lives here, below both the simulator that fills it and
//! the reports that print it, so that `counters` depends on neither.

use serde::{Deserialize, Serialize};

/// One device's simulated-flash figures in `ecdedup stats` (the `ssd`
/// section; counters since the array was opened).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SsdWearStats {
    /// FTL dedup mode: none, inline, offline, separated, hinted.
    pub mode: String,
    pub pages_per_block: u32,
    pub blocks: u32,
    /// Configured over-provisioning, share of physical pages.
    pub over_provisioning: f64,
    /// Physical pages not needed for the device's bytes, share of physical
    /// pages (at least the configured share; more on small devices).
    pub spare_share: f64,
    pub host_page_writes: u64,
    pub host_page_trims: u64,
    pub nand_page_programs: u64,
    pub gc_page_copies: u64,
    pub block_erases: u64,
    pub dedup_skipped_writes: u64,
    pub offline_remaps: u64,
    /// Offline passes run (one per sync in the offline modes).
    pub offline_passes: u64,
    /// Contents written since the last offline pass.
    pub pending_pages: u64,
    /// Logical pages holding data, and the physical pages (contents)
    /// storing them now; their ratio is the dedup ratio inside the SSD.
    pub mapped_logical_pages: u64,
    pub valid_pages: u64,
    pub dedup_ratio: f64,
    /// NAND page programs / host page writes (0 without writes).
    pub write_amplification: f64,
    pub erase_count_min: u32,
    pub erase_count_max: u32,
    pub erase_count_mean: f64,
    /// max / mean erase count (0 before any erase).
    pub wear_spread: f64,
    /// Modelled write latency, microseconds.
    pub write_latency_us_mean: f64,
    pub write_latency_us_p99: f64,
    /// RAM the simulation holds for this device.
    pub memory_bytes: u64,
}

impl SsdWearStats {
    /// Prometheus (kind, help) of the numeric fields.
    pub fn prometheus_description(name: &str) -> Option<(&'static str, &'static str)> {
        Some(match name {
            "host_page_writes" => ("counter", "simulated SSD: 4 KiB pages written by the host"),
            "host_page_trims" => ("counter", "simulated SSD: 4 KiB pages trimmed by the host"),
            "nand_page_programs" => ("counter", "simulated SSD: NAND page programs"),
            "gc_page_copies" => ("counter", "simulated SSD: valid pages copied by GC"),
            "block_erases" => ("counter", "simulated SSD: block erases"),
            "dedup_skipped_writes" => ("counter", "simulated SSD: inline dedup hits"),
            "offline_remaps" => ("counter", "simulated SSD: offline dedup remaps"),
            "write_amplification" => ("gauge", "simulated SSD: NAND programs per host write"),
            "erase_count_min" => ("gauge", "simulated SSD: fewest erases of a block"),
            "erase_count_max" => ("gauge", "simulated SSD: most erases of a block"),
            "erase_count_mean" => ("gauge", "simulated SSD: mean erases per block"),
            "wear_spread" => ("gauge", "simulated SSD: max / mean erase count"),
            _ => return None,
        })
    }
}
