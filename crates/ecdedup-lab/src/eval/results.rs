//! The parity-dedup evaluation's results (`results.json`): the types that
//! the run (parity_dedup.rs) fills and the report (report.rs) and the plot
//! (svg.rs) read. They live below all three, so that none of them imports
//! another in a circle.

use ecdedup_core::dedup::Policy;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PaperFigure {
    /// throughput_relative | parity_write_reduction | index_dram_share |
    /// index_dram_vs_data_dedup | decode_1_failed_extra | decode_2_failed_extra
    pub metric: String,
    pub policy: Policy,
    /// The RAID chunk size it was measured at; None: stated for both.
    pub chunk_bytes: Option<u64>,
    pub value: f64,
    pub quote: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Fs,
    Raw,
}

impl RunResult {
    /// Fingerprint memory in all: the LRU index plus the slot → entry table.
    pub fn fingerprint_dram_bytes(&self) -> u64 {
        self.index_bytes + self.slot_entry_bytes
    }
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Fs => "fs",
            Mode::Raw => "raw",
        }
    }
}

/// One workload file.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FileInfo {
    pub path: String,
    pub bytes: u64,
}

/// The workload and its duplicate content at fixed 4 KiB blocks (each file
/// padded to 4 KiB, as the raw stream writes it).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkloadInfo {
    pub files: Vec<FileInfo>,
    pub bytes: u64,
    pub blocks_4k: u64,
    pub unique_blocks_4k: u64,
    pub zero_blocks_4k: u64,
    /// 1 - unique / blocks: the share a single global 4 KiB index could remove.
    pub duplicate_ratio_4k: f64,
    /// Entries (files, folders, links) of the workload tars (fs mode; 0 in
    /// raw mode): each takes an ext4 inode, and a file at least a block.
    #[serde(default)]
    pub entries: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkloadTime {
    pub file: String,
    pub seconds: f64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DecodeResult {
    /// Bytes read back each time (fs: the blocks ext4 has in use, per
    /// `dumpe2fs`, so that plain RAID-6 and dedup read the same written
    /// extents: an unmapped dedup block reads as zeroes with no I/O, while
    /// plain RAID-6 would read its sparse files' holes; raw: the written
    /// range).
    pub range_bytes: u64,
    pub healthy_seconds: f64,
    pub one_failed_seconds: f64,
    pub two_failed_seconds: f64,
    /// The three reads returned the same bytes (BLAKE3 of the range), and in
    /// raw mode the bytes written. A mismatch stops the experiment.
    pub verified: bool,
}

/// Everything measured in one run (one array). Counters are differences
/// over the write phase; index sizes are the values at its end. "Pages" are
/// 4 KiB blocks.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunResult {
    /// 0-based round (see --repeat).
    #[serde(default)]
    pub round: u32,
    pub mode: Mode,
    pub policy: Policy,
    pub chunk_bytes: u64,
    pub volume_bytes: u64,
    pub k: u32,
    pub m: u32,
    /// Workload bytes (file sizes).
    pub workload_bytes: u64,
    /// Wall time of the writes (fs: extract + sync of every file; raw:
    /// writes + the final flush).
    pub write_seconds: f64,
    /// workload_bytes / write_seconds, MiB/s.
    pub write_mib_per_s: f64,
    pub per_workload: Vec<WorkloadTime>,
    pub client_writes: u64,
    pub client_write_bytes: u64,
    pub client_flushes: u64,
    pub full_stripe_writes: u64,
    pub rmw_writes: u64,
    pub rcw_writes: u64,
    pub degraded_writes: u64,
    /// full + rmw + rcw + degraded.
    pub stripe_updates: u64,
    /// Pages the array sent to data / parity units (before any dedup):
    /// what a careful RAID (Linux md) writes, only the touched pages.
    pub data_pages_array: u64,
    pub parity_pages_array: u64,
    /// Write operations on parity units (one per contiguous run of pages).
    pub parity_write_ops_array: u64,
    /// Pages that reached the media after dedup (= the array's for none).
    pub data_pages_media: u64,
    pub parity_pages_media: u64,
    /// Pages stored as references instead (dedup hits).
    pub data_pages_referenced: u64,
    pub parity_pages_referenced: u64,
    /// The paper's RAID-6: every stripe update rewrites m whole chunks of
    /// parity: stripe_updates x m x chunk / 4 KiB.
    pub parity_pages_paper_baseline: u64,
    pub hash_ops: u64,
    pub dedup_hits: u64,
    pub index_entries: u64,
    pub index_bytes: u64,
    pub index_bytes_per_entry: f64,
    /// Index size before the writes (fs: what mkfs and mount left there).
    pub index_entries_before: u64,
    pub index_bytes_before: u64,
    pub index_evictions: u64,
    pub log_bytes: u64,
    pub map_bytes: u64,
    /// RAM of the slot → index entry table (4 bytes per device slot):
    /// fingerprint memory beside the index. The DRAM share reports
    /// index_bytes + this.
    #[serde(default, alias = "slot_fingerprint_bytes")]
    pub slot_entry_bytes: u64,
    pub decode: Option<DecodeResult>,
    /// In `summary` only: the write times and decode results of every round
    /// (the fields above then hold medians; counters are the first round's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub write_seconds_rounds: Vec<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub decode_rounds: Vec<DecodeResult>,
    /// `ecdedup stats` before and after the writes, as the server sent them
    /// (kept as JSON so that old result files still load when counters are
    /// added).
    pub stats_before: serde_json::Value,
    pub stats_after: serde_json::Value,
}

/// All of `results.json`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Results {
    pub command: String,
    pub unix_time: u64,
    pub host: String,
    pub cpus: usize,
    pub k: u32,
    pub m: u32,
    pub devices: u32,
    pub dedup_block_bytes: u32,
    pub fingerprint: String,
    pub verify: bool,
    pub index_entries_max: u64,
    pub volume_bytes: u64,
    /// The inode count given to mkfs.ext4 (`-N`), where its default
    /// (one per 16 KiB) would be short of the workload's entries.
    #[serde(default)]
    pub ext4_inodes: Option<u64>,
    pub workload: WorkloadInfo,
    #[serde(default = "one")]
    pub rounds: u32,
    /// Every run of every round.
    pub runs: Vec<RunResult>,
    /// One entry per configuration: medians over the rounds (what the
    /// report and the plot show).
    #[serde(default)]
    pub summary: Vec<RunResult>,
    pub total_seconds: f64,
    pub paper: Vec<PaperFigure>,
}

fn one() -> u32 {
    1
}

/// Sizes for progress lines: "1.8 GiB".
pub fn format_size_approx(b: u64) -> String {
    let f = b as f64;
    if f >= (1u64 << 30) as f64 {
        format!("{:.2} GiB", f / (1u64 << 30) as f64)
    } else if f >= (1u64 << 20) as f64 {
        format!("{:.1} MiB", f / (1u64 << 20) as f64)
    } else if f >= 1024.0 {
        format!("{:.1} KiB", f / 1024.0)
    } else {
        format!("{b} B")
    }
}
