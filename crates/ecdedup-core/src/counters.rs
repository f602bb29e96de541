//! Counters: the evidence every layer leaves behind.
//!
//! Per device, reads and writes are counted in operations and bytes, split
//! by the class of what was moved (data, parity, metadata). Array-wide
//! counters record which write path ran and every repair. All counters only
//! grow; a snapshot is plain data that prints as JSON or Prometheus text.

mod dedup;
mod wear;

pub use dedup::DedupStats;
pub use wear::SsdWearStats;

use serde::Serialize;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// What an I/O carried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoClass {
    Data = 0,
    Parity = 1,
    Metadata = 2,
    /// Parity-journal appends and replay reads (plog, parix).
    Journal = 3,
}

pub const IO_CLASSES: [IoClass; 4] = [
    IoClass::Data,
    IoClass::Parity,
    IoClass::Metadata,
    IoClass::Journal,
];

impl IoClass {
    pub fn name(self) -> &'static str {
        match self {
            IoClass::Data => "data",
            IoClass::Parity => "parity",
            IoClass::Metadata => "metadata",
            IoClass::Journal => "journal",
        }
    }
}

#[derive(Default)]
pub struct DeviceCounters {
    read_ops: [AtomicU64; 4],
    read_bytes: [AtomicU64; 4],
    write_ops: [AtomicU64; 4],
    write_bytes: [AtomicU64; 4],
    sync_ops: AtomicU64,
    errors: AtomicU64,
}

impl DeviceCounters {
    pub fn read(&self, class: IoClass, bytes: usize) {
        self.read_ops[class as usize].fetch_add(1, Relaxed);
        self.read_bytes[class as usize].fetch_add(bytes as u64, Relaxed);
    }
    pub fn write(&self, class: IoClass, bytes: usize) {
        self.write_ops[class as usize].fetch_add(1, Relaxed);
        self.write_bytes[class as usize].fetch_add(bytes as u64, Relaxed);
    }
    pub fn sync(&self) {
        self.sync_ops.fetch_add(1, Relaxed);
    }
    pub fn error(&self) {
        self.errors.fetch_add(1, Relaxed);
    }
    fn snapshot(&self, position: usize) -> DeviceStats {
        let class = |a: &[AtomicU64; 4], c: IoClass| a[c as usize].load(Relaxed);
        let split = |a: &[AtomicU64; 4]| ClassSplit {
            data: class(a, IoClass::Data),
            parity: class(a, IoClass::Parity),
            metadata: class(a, IoClass::Metadata),
            journal: class(a, IoClass::Journal),
        };
        DeviceStats {
            position,
            read_ops: split(&self.read_ops),
            read_bytes: split(&self.read_bytes),
            write_ops: split(&self.write_ops),
            write_bytes: split(&self.write_bytes),
            sync_ops: self.sync_ops.load(Relaxed),
            errors: self.errors.load(Relaxed),
        }
    }
}

/// Array-wide event counters. Field names are the JSON and Prometheus names.
macro_rules! array_counters {
    ($($name:ident: $help:literal,)*) => {
        #[derive(Default)]
        pub struct ArrayCounters { $(pub $name: AtomicU64,)* }

        /// A counter that an older server did not have reads as 0.
        #[derive(Clone, Debug, Default, Serialize, serde::Deserialize, PartialEq, Eq)]
        #[serde(default)]
        pub struct ArrayStats { $(pub $name: u64,)* }

        impl ArrayCounters {
            pub fn snapshot(&self) -> ArrayStats {
                ArrayStats { $($name: self.$name.load(Relaxed),)* }
            }
        }

        impl ArrayStats {
            fn prometheus(&self, out: &mut String) {
                $(
                    let _ = writeln!(out, "# HELP ecdedup_{} {}", stringify!($name), $help);
                    let _ = writeln!(out, "# TYPE ecdedup_{} counter", stringify!($name));
                    let _ = writeln!(out, "ecdedup_{} {}", stringify!($name), self.$name);
                )*
            }
        }
    };
}

array_counters! {
    client_reads: "read requests served",
    client_writes: "write requests served",
    client_flushes: "flush requests served",
    client_read_bytes: "bytes read by clients",
    client_write_bytes: "bytes written by clients",
    full_stripe_writes: "stripe updates that encoded parity from new data only",
    rmw_writes: "partial stripe updates by read-modify-write (delta update)",
    rcw_writes: "partial stripe updates by reconstruct-write",
    degraded_writes: "stripe updates with a member unavailable",
    reconstructed_blocks: "blocks served by decoding other members",
    checksum_mismatches: "blocks whose CRC32C did not match on read",
    repaired_blocks: "blocks rewritten with reconstructed content",
    decode_check_failures: "decoded rows that failed a recorded checksum or disagreed with a spare member",
    combination_decodes: "rows decoded by leaving out members that held stale blocks with matching checksums",
    unverified_decodes: "rows decoded from exactly k members with no checksum known for the decoded blocks",
    read_errors_corrected: "medium read errors survived by decoding the block and rewriting it (the device stays in service)",
    torn_journal_records: "parity journal records whose d(r) survived a power cut without its d(0) (a write never flushed): left out of the fold",
    degraded_replay_unknown_rows: "stripes whose degraded journal replay after an unclean stop found block rows of a missing unit that no decode vouched for (left unlogged: they read as I/O errors, never as a guess)",
    degraded_replay_vouched_rows: "block rows of a degraded journal replay after an unclean stop whose members left disagree, logged from the decode that leaves out the fewest members and matches the missing units' known checksums",
    degraded_replay_rows_told_by_base: "block rows of a degraded journal replay at open whose parity changed since the last flush under records folded into it, where the records' bases told whether the parity held them already (journal version 4)",
    degraded_replay_unflushed_rows: "stripes whose degraded journal replay after an unclean stop marked the parity of such rows unreadable because their fold took a record appended after the last flush (format 2), or a member changed since then (a write in flight, or a parity that may hold the folded records already)",
    poisoned_blocks: "data blocks an unclean stop made unknowable, recorded in the poison list (their row's parity recomputed with a placeholder, so the rest of the row keeps its redundancy; docs/write-hole.md)",
    poisoned_reads: "reads refused because they touched a poisoned block (an I/O error until the block is written)",
    poisoned_blocks_restored: "poisoned blocks a re-add took back from the returning member's own block, which its own checksum vouched for (the member held it from the stop on; the row's parity written around it)",
    unreadable_blocks: "block rows no combination of members decodes to their checksums (an I/O error, never wrong data)",
    resync_checksum_mismatches: "blocks of dirty stripes whose content no longer matched their recorded checksum at resync (a write in flight at the stop, or corruption)",
    resync_blocks_restored: "data blocks of dirty stripes at resync that no longer matched their checksum while k members that still matched theirs decoded them back to it (corruption at rest, or an unflushed write whose every parity write the stop lost): rewritten from that decode",
    resync_stripes: "stripes resynchronised after an unclean shutdown",
    scrubbed_stripes: "stripes checked by scrub",
    parity_mismatches: "stripes whose parity did not match their data",
    rebuilt_stripes: "stripes written onto a replacement device",
    discarded_stripes: "whole stripes zeroed by discarding their units",
    intent_marks: "write-intent regions marked dirty (each costs a metadata sync)",
    journal_writes: "partial stripe writes logged to parity journals (plog, parix)",
    need_d0: "parix writes that had to read and log the original value d(0)",
    journal_fallbacks: "logged writes that fell back to read-modify-write (journal full, unreserved or failing)",
    records_replayed: "journaled blocks folded into parity by replay",
    stripes_replayed: "stripes whose parity journals were replayed",
    parity_rows_folded_at_device: "parity blocks a replay folded at the device that holds them and their journal (read, folded and written there: one Replay message per parity chunk across the network)",
    journal_errors: "parity journal appends, reads or space reservations that failed (the stripe was resynchronised or kept pending)",
    journal_compactions: "parity journals rewritten to their live records after a replay",
    device_submissions: "batches of device I/O the array issued (reads, writes and syncs of one step of a request, submitted together)",
    device_syscalls: "system calls those batches made: io_uring_enter calls, or one per pread, pwrite and fdatasync where io_uring is unavailable or the device is not a plain file",
    device_ring_entries: "io_uring entries those batches submitted: one per device read, write or sync, except that adjacent reads (or writes) of one device share one vectored entry; none where a batch loops",
    fua_syncs: "FUA requests made durable by syncing only the devices and journals they touched",
    table_page_syncs: "syncs of every device made because a checksum table was over its bound with only dirty pages whose writes were not yet durable (a page is written only after the syncs that cover its entries)",
}

impl ArrayCounters {
    pub fn add(&self, counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Relaxed);
    }
}

pub fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Relaxed);
}

#[derive(Clone, Debug, Default, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct ClassSplit {
    pub data: u64,
    pub parity: u64,
    pub metadata: u64,
    #[serde(default)]
    pub journal: u64,
}

impl ClassSplit {
    pub fn total(&self) -> u64 {
        self.data + self.parity + self.metadata + self.journal
    }
}

#[derive(Clone, Debug, Default, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct DeviceStats {
    pub position: usize,
    pub read_ops: ClassSplit,
    pub read_bytes: ClassSplit,
    pub write_ops: ClassSplit,
    pub write_bytes: ClassSplit,
    pub sync_ops: u64,
    pub errors: u64,
}

/// Everything `ecdedup stats` prints.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize, PartialEq)]
pub struct Stats {
    pub array: ArrayStats,
    pub devices: Vec<DeviceStats>,
    /// Bytes of RAM held by the per-block checksum tables.
    pub checksum_table_bytes: u64,
    /// Parity journals: bytes held, blocks logged, RAM of their index.
    #[serde(default)]
    pub journal_bytes: u64,
    #[serde(default)]
    pub journal_logged_blocks: u64,
    #[serde(default)]
    pub journal_index_bytes: u64,
    /// The dedup layer of each device (null where the policy is none or
    /// the device is out of service).
    #[serde(default)]
    pub dedup: Vec<Option<DedupStats>>,
    /// The simulated SSD of each device (`create --ssd-sim`; absent when
    /// off, null where a device is out of service).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ssd: Vec<Option<SsdWearStats>>,
}

pub struct Counters {
    pub array: ArrayCounters,
    /// Shared with each device's checksum table, which counts its page I/O.
    pub devices: Vec<std::sync::Arc<DeviceCounters>>,
}

impl Counters {
    pub fn new(devices: usize) -> Counters {
        Counters {
            array: ArrayCounters::default(),
            devices: (0..devices).map(|_| Default::default()).collect(),
        }
    }

    pub fn snapshot(&self, checksum_table_bytes: u64) -> Stats {
        Stats {
            array: self.array.snapshot(),
            devices: self
                .devices
                .iter()
                .enumerate()
                .map(|(i, d)| d.snapshot(i))
                .collect(),
            checksum_table_bytes,
            dedup: Vec::new(),
            ssd: Vec::new(),
            journal_bytes: 0,
            journal_logged_blocks: 0,
            journal_index_bytes: 0,
        }
    }
}

impl Stats {
    /// Prometheus text exposition format (version 0.0.4).
    pub fn prometheus(&self) -> String {
        let mut out = String::new();
        self.array.prometheus(&mut out);
        type Family = (&'static str, &'static str, fn(&DeviceStats) -> &ClassSplit);
        let families: [Family; 4] = [
            ("device_read_ops", "device read operations", |d| &d.read_ops),
            ("device_read_bytes", "device bytes read", |d| &d.read_bytes),
            ("device_write_ops", "device write operations", |d| {
                &d.write_ops
            }),
            ("device_write_bytes", "device bytes written", |d| {
                &d.write_bytes
            }),
        ];
        for (name, help, get) in families {
            let _ = writeln!(
                out,
                "# HELP ecdedup_{name} {help}, by device position and class"
            );
            let _ = writeln!(out, "# TYPE ecdedup_{name} counter");
            for d in &self.devices {
                let s = get(d);
                for (class, v) in [
                    ("data", s.data),
                    ("parity", s.parity),
                    ("metadata", s.metadata),
                    ("journal", s.journal),
                ] {
                    let _ = writeln!(
                        out,
                        "ecdedup_{name}{{device=\"{}\",class=\"{class}\"}} {v}",
                        d.position
                    );
                }
            }
        }
        let _ = writeln!(out, "# HELP ecdedup_device_errors device I/O errors");
        let _ = writeln!(out, "# TYPE ecdedup_device_errors counter");
        for d in &self.devices {
            let _ = writeln!(
                out,
                "ecdedup_device_errors{{device=\"{}\"}} {}",
                d.position, d.errors
            );
        }
        let _ = writeln!(
            out,
            "# HELP ecdedup_checksum_table_bytes RAM held by checksum tables"
        );
        let _ = writeln!(out, "# TYPE ecdedup_checksum_table_bytes gauge");
        let _ = writeln!(
            out,
            "ecdedup_checksum_table_bytes {}",
            self.checksum_table_bytes
        );
        // Dedup layers: every numeric field, labelled by device.
        let mut families: std::collections::BTreeMap<String, Vec<(usize, f64)>> =
            Default::default();
        for (d, layer) in self.dedup.iter().enumerate() {
            let Some(layer) = layer else { continue };
            if let Ok(serde_json::Value::Object(fields)) = serde_json::to_value(layer) {
                for (name, v) in fields {
                    if let Some(x) = v.as_f64() {
                        families.entry(name).or_default().push((d, x));
                    }
                }
            }
        }
        for (name, samples) in families {
            if let Some((kind, help)) = DedupStats::prometheus_description(&name) {
                let _ = writeln!(out, "# HELP ecdedup_dedup_{name} {help}, by device");
                let _ = writeln!(out, "# TYPE ecdedup_dedup_{name} {kind}");
            }
            for (d, x) in samples {
                let _ = writeln!(out, "ecdedup_dedup_{name}{{device=\"{d}\"}} {x}");
            }
        }
        // Simulated SSDs: the wear figures, labelled by device.
        for name in [
            "host_page_writes",
            "host_page_trims",
            "nand_page_programs",
            "gc_page_copies",
            "block_erases",
            "dedup_skipped_writes",
            "offline_remaps",
            "write_amplification",
            "erase_count_min",
            "erase_count_max",
            "erase_count_mean",
            "wear_spread",
        ] {
            let samples: Vec<(usize, f64)> = self
                .ssd
                .iter()
                .enumerate()
                .filter_map(|(d, s)| {
                    let v = serde_json::to_value(s.as_ref()?).ok()?;
                    Some((d, v.get(name)?.as_f64()?))
                })
                .collect();
            if samples.is_empty() {
                continue;
            }
            if let Some((kind, help)) = SsdWearStats::prometheus_description(name) {
                let _ = writeln!(out, "# HELP ecdedup_ssd_{name} {help}, by device");
                let _ = writeln!(out, "# TYPE ecdedup_ssd_{name} {kind}");
            }
            for (d, x) in samples {
                let _ = writeln!(out, "ecdedup_ssd_{name}{{device=\"{d}\"}} {x}");
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_text_names_every_device_and_class() {
        let c = Counters::new(2);
        c.devices[1].write(IoClass::Parity, 4096);
        bump(&c.array.rmw_writes);
        let text = c.snapshot(0).prometheus();
        assert!(text.contains("ecdedup_device_write_bytes{device=\"1\",class=\"parity\"} 4096"));
        assert!(text.contains("ecdedup_rmw_writes 1"));
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let value = line.rsplit(' ').next().unwrap();
            assert!(value.parse::<f64>().is_ok(), "bad sample line {line}");
        }
    }
}
