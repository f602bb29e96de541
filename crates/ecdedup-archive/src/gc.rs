//! Reclaiming the dead part of a batch (`archive gc`): `rm` deletes the
//! batches nothing refers to any more, but a batch that still holds one
//! live byte keeps every file it has. `gc` copies the live bytes of a
//! mostly dead batch forward into new containers (deduplicated and
//! encoded as any `put`'s), moves the objects' extents to them in one
//! catalog write, and then the old batch, which nothing refers to any
//! more, is deleted as by `rm`.
//!
//! A batch is rewritten only when no other live batch takes a redundant
//! block's source from it (it is not "pinned"): a source keeps its
//! protection, in place, as long as a copy depends on it. Batches are
//! rewritten newest first and the pins are worked out again after each, so
//! a batch pinned only by one that was rewritten becomes a candidate.
//!
//! Crash safety follows from `put`'s: the copied bytes are sealed (their
//! maps durable) before the catalog write that moves the extents, and the
//! old batch is deleted after it. A cut before the catalog write leaves the
//! objects where they were and the new containers unreferenced (reclaimed
//! by the next `rm`, `gc` or `scrub --repair`); a cut after it leaves the
//! old batch unreferenced, likewise.

use super::{ArchiveStore, ObjectRecord, PUT_BUFFER_BYTES_MAX};
use ecdedup_core::error::Result;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// A batch is rewritten when less than this percentage of its containers'
/// data bytes belongs to live objects (`archive gc --live-below`).
pub const GC_LIVE_BELOW_PERCENT_DEFAULT: f64 = 50.0;

/// What `gc` did.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct GcReport {
    /// Batches whose live bytes were copied forward.
    pub batches_rewritten: u64,
    /// Object bytes copied.
    pub bytes_copied: u64,
    /// Containers deleted (those of the rewritten batches, and any other
    /// that nothing referred to).
    pub containers_reclaimed: u64,
    /// Batches left under the threshold because another batch takes
    /// sources from them.
    pub batches_pinned: u64,
    /// Bytes on the devices (data sub-files, parity, maps) before and after.
    pub stored_bytes_before: u64,
    pub stored_bytes_after: u64,
}

impl ArchiveStore {
    /// Rewrites every batch whose live share of data bytes is under
    /// `live_below_percent` and that no other batch takes sources from.
    pub fn gc(&mut self, live_below_percent: f64) -> Result<GcReport> {
        self.check_latch()?;
        if !(0.0..=100.0).contains(&live_below_percent) {
            return Err(ecdedup_core::error::Error::InvalidRequest(format!(
                "--live-below {live_below_percent}: a percentage from 0 to 100"
            )));
        }
        if let Some(&d) = self.missing_devices.first() {
            return Err(ecdedup_core::error::Error::Unavailable(format!(
                "archive device {d} is missing: `archive scrub --repair` restores it before gc"
            )));
        }
        self.latching(|store| {
            let mut report = GcReport {
                stored_bytes_before: store.stored_bytes(),
                ..GcReport::default()
            };
            report.containers_reclaimed += store.collect_garbage()?;
            while let Some(batch) = store.gc_candidate(live_below_percent, &mut report) {
                report.bytes_copied += store.rewrite_batch(batch)?;
                report.batches_rewritten += 1;
                report.containers_reclaimed += store.collect_garbage()?;
            }
            report.stored_bytes_after = store.stored_bytes();
            Ok(report)
        })
    }

    fn stored_bytes(&self) -> u64 {
        let s = self.stats();
        s.stored_data_bytes + s.parity_bytes + s.map_bytes
    }

    /// The newest live batch under the threshold that no other live batch
    /// takes sources from; counts the pinned ones in `report` (last pass).
    fn gc_candidate(&self, live_below_percent: f64, report: &mut GcReport) -> Option<u32> {
        let live = self.live_batches();
        let mut pinned = BTreeSet::new();
        for &b in &live {
            for src in self.batches[&b].source_containers() {
                match self.container_batch.get(&src) {
                    Some(&sb) if sb != b => {
                        pinned.insert(sb);
                    }
                    _ => {}
                }
            }
        }
        let mut live_bytes: BTreeMap<u32, u64> = BTreeMap::new();
        for e in self.catalog.objects.values().flat_map(|r| &r.extents) {
            if let Some(&b) = self.container_batch.get(&e.container) {
                *live_bytes.entry(b).or_default() += e.length;
            }
        }
        let under = |b: &u32| {
            let data: u64 = self.batches[b]
                .containers
                .iter()
                .map(|c| c.data_bytes)
                .sum();
            let held = live_bytes.get(b).copied().unwrap_or(0);
            data > 0 && (held as f64) < live_below_percent / 100.0 * data as f64
        };
        report.batches_pinned = live
            .iter()
            .filter(|b| under(b) && pinned.contains(b))
            .count() as u64;
        live.iter()
            .rev()
            .find(|b| under(b) && !pinned.contains(b))
            .copied()
    }

    /// Copies every live object byte held by `batch` into new containers,
    /// seals them, and commits the objects' new extents. Returns the bytes
    /// copied. The batch is left to `collect_garbage`.
    fn rewrite_batch(&mut self, batch: u32) -> Result<u64> {
        let containers: BTreeSet<u32> = self.batches[&batch]
            .containers
            .iter()
            .map(|c| c.id)
            .collect();
        let names: Vec<String> = self
            .catalog
            .objects
            .iter()
            .filter(|(_, r)| r.extents.iter().any(|e| containers.contains(&e.container)))
            .map(|(n, _)| n.clone())
            .collect();
        let total: u64 = names
            .iter()
            .flat_map(|n| &self.catalog.objects[n].extents)
            .filter(|e| containers.contains(&e.container))
            .map(|e| e.length)
            .sum();
        // New blocks must not take their sources from the batch that goes.
        self.dying_batch = Some(batch);
        let mut buffer =
            vec![0u8; (self.config.container_bytes as usize).min(PUT_BUFFER_BYTES_MAX)];
        let mut moved = Vec::with_capacity(names.len());
        let mut copied = 0u64;
        for name in names {
            let old = self.catalog.objects[&name].clone();
            let mut record = ObjectRecord {
                size: old.size,
                extents: Vec::with_capacity(old.extents.len()),
            };
            for e in old.extents {
                if !containers.contains(&e.container) {
                    record.extents.push(e);
                    continue;
                }
                let mut done = 0u64;
                while done < e.length {
                    let take = (e.length - done).min(buffer.len() as u64) as usize;
                    self.read_container(e.container, e.offset + done, &mut buffer[..take])?;
                    self.append(&buffer[..take], &mut record.extents)?;
                    done += take as u64;
                    copied += take as u64;
                    self.report_progress("gc: copy", copied, total);
                }
            }
            moved.push((name, record));
        }
        // Sealed before the objects move: the copies are protected before
        // the originals go.
        self.seal_open_and_pending()?;
        self.dying_batch = None;
        for (name, record) in moved {
            self.catalog.objects.insert(name, record);
        }
        self.save_catalog()?;
        Ok(copied)
    }
}
