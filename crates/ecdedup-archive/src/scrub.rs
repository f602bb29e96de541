//! `archive scrub`: checks every block of every sealed sub-file against the
//! CRC-32C in its map (compact layout: every stored block, and every
//! redundant block read through its sources) and every encoded stripe's
//! parity against a fresh encode, and with `repair` rewrites what is missing or wrong (a lost
//! device's folder is made again and its files decoded), removes files no
//! map names (left by a crash between the files of a batch and its map, or
//! by a removal that stopped half way, or not yet durable) and the
//! temporaries of an interrupted durable write (`.NAME.tmp` in the archive
//! folder, `maps/` and on the devices), and reclaims batches no object
//! needs (left by a `put` that never committed).
//!
//! Repairs go through the same durable write as sealing, so a crash during
//! scrub leaves each file old or new.

use super::map::{BatchMap, BlockAddress};
use super::{
    disk, map_name, meta, parity_name, sub_file_name, write_marker, ArchiveStore, CATALOG_FILE,
    CONFIG_FILE, DEVICE_MARKER, MAPS_DIR,
};
use ecdedup_core::error::Result;
use serde::Serialize;
use std::collections::BTreeSet;
use std::path::PathBuf;

#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct ScrubReport {
    pub blocks_checked: u64,
    /// Data blocks missing or failing their checksum.
    pub bad_blocks: u64,
    pub parity_blocks_checked: u64,
    pub bad_parity_blocks: u64,
    /// Blocks that could not be decoded (more than m losses in a stripe).
    pub unrecoverable_blocks: u64,
    /// Damaged files a repair left as they are because they hold an
    /// unrecoverable block (a sub-file), or their parity cannot be
    /// computed without one (a parity file); every other damaged file,
    /// in any batch, is repaired.
    #[serde(default)]
    pub unrepaired_files: u64,
    pub files_rewritten: u64,
    pub devices_recreated: u64,
    /// Files on the devices that no map names (removed with repair).
    pub orphan_files: u64,
    /// Sealed containers no object needs (reclaimed with repair).
    pub unreferenced_containers: u64,
    /// Copies on the devices of the config, the catalog or a map that are
    /// missing or differ (rewritten with repair).
    pub bad_metadata_copies: u64,
}

impl ArchiveStore {
    /// Checks everything sealed; with `repair`, fixes what it can.
    pub fn scrub(&mut self, repair: bool) -> Result<ScrubReport> {
        self.check_latch()?;
        self.latching(|store| store.scrub_inner(repair))
    }

    fn scrub_inner(&mut self, repair: bool) -> Result<ScrubReport> {
        let mut report = ScrubReport::default();
        if repair {
            for position in std::mem::take(&mut self.missing_devices) {
                let uuid = self.config.uuid.clone();
                write_marker(&self.disk, &self.device_dir(position), &uuid, position)?;
                report.devices_recreated += 1;
            }
            report.unreferenced_containers = self.collect_garbage()?;
        } else {
            let live = self.live_batches();
            report.unreferenced_containers = self
                .batches
                .iter()
                .filter(|(b, _)| !live.contains(b))
                .map(|(_, map)| map.containers.len() as u64)
                .sum();
        }
        self.check_metadata_copies(repair, &mut report)?;
        let block = self.config.block_bytes as usize;
        let batches: Vec<u32> = self.batches.keys().copied().collect();
        let phase = if repair { "scrub --repair" } else { "scrub" };
        // Progress in bytes: the data bytes of the sealed containers.
        let batch_bytes =
            |map: &BatchMap| -> u64 { map.containers.iter().map(|c| c.data_bytes).sum() };
        let total: u64 = self.batches.values().map(batch_bytes).sum();
        let mut checked = 0u64;
        self.report_progress(phase, 0, total);
        for b in &batches {
            let map = &self.batches[b];
            checked += batch_bytes(map);
            let mut rewrites: Vec<(PathBuf, Vec<u8>)> = Vec::new();
            for c in &map.containers {
                for (j, sub) in c.sub_files.iter().enumerate() {
                    let stored = sub.stored_columns(map.layout);
                    let mut bytes = Vec::with_capacity(stored.len() * block);
                    let mut bad = 0;
                    let mut lost = false;
                    for column in 0..sub.blocks.len() as u32 {
                        if sub.stored(map.layout, column) {
                            continue;
                        }
                        // Compact: not stored; its sources must serve it.
                        report.blocks_checked += 1;
                        let a = BlockAddress {
                            container: c.id,
                            sub_file: j as u8,
                            column,
                        };
                        if self.read_block(a).is_err() {
                            report.unrecoverable_blocks += 1;
                        }
                    }
                    for column in stored {
                        let a = BlockAddress {
                            container: c.id,
                            sub_file: j as u8,
                            column,
                        };
                        report.blocks_checked += 1;
                        match self.read_block_raw(a)? {
                            Some(good) => bytes.extend_from_slice(&good),
                            None => {
                                bad += 1;
                                match self.recover_block(a, 0) {
                                    Ok(fixed) => bytes.extend_from_slice(&fixed),
                                    Err(_) => {
                                        report.unrecoverable_blocks += 1;
                                        lost = true;
                                        bytes.resize(bytes.len() + block, 0);
                                    }
                                }
                            }
                        }
                    }
                    report.bad_blocks += bad;
                    let path = self
                        .device_dir(sub.device as usize)
                        .join(sub_file_name(c.id, j as u8));
                    // A compact sub-file of no unique block is empty: the
                    // per-block checks above do not see it missing.
                    if bytes.is_empty() && !self.disk.read_at(&path, 0, &mut [])? {
                        bad += 1;
                    }
                    // Never a file with a block not recovered: its zeroes
                    // would pass for data. The batch's other files are.
                    if bad > 0 && lost {
                        report.unrepaired_files += 1;
                    } else if bad > 0 {
                        rewrites.push((path, bytes));
                    }
                }
            }
            for g in 0..map.groups.len() {
                let (checked, bad, files, expected) = self.check_parity(map, g)?;
                report.parity_blocks_checked += checked;
                report.bad_parity_blocks += bad;
                match expected {
                    Some(expected) if bad > 0 => rewrites.extend(expected),
                    Some(_) => {}
                    None => report.unrepaired_files += files,
                }
            }
            // Each batch on its own: an unrecoverable block elsewhere once
            // kept every later batch's damage unrepaired, unreported.
            if repair {
                for (path, bytes) in rewrites {
                    self.disk.write_durable(&path, &bytes)?;
                    report.files_rewritten += 1;
                }
            }
            self.report_progress(phase, checked, total);
        }
        // Files no map names, and maps, catalogs and caches a crash left
        // half written (the temporaries of `write_durable`).
        for folder in [self.dir.clone(), self.dir.join(super::MAPS_DIR)] {
            let mut removed = false;
            for name in self.disk.list_files(&folder)?.unwrap_or_default() {
                if disk::is_temporary(&name) || (folder != self.dir && name.starts_with('.')) {
                    report.orphan_files += 1;
                    if repair {
                        self.disk.remove(&folder.join(name))?;
                        removed = true;
                    }
                }
            }
            if removed {
                self.disk.sync_dir(&folder)?;
            }
        }
        let mut expected: BTreeSet<PathBuf> = BTreeSet::new();
        for map in self.batches.values() {
            expected.extend(self.batch_files(map));
        }
        for position in 0..self.config.devices.len() {
            let dir = self.device_dir(position);
            for name in self.disk.list_files(&dir)?.unwrap_or_default() {
                let path = dir.join(&name);
                if [DEVICE_MARKER, CONFIG_FILE, CATALOG_FILE].contains(&name.as_str())
                    || expected.contains(&path)
                {
                    continue;
                }
                report.orphan_files += 1;
                if repair {
                    self.disk.remove(&path)?;
                }
            }
            if repair {
                self.disk.sync_dir(&dir).ok();
            }
        }
        Ok(report)
    }

    /// The metadata files: the config and the catalog in the folder and on
    /// each device in place, each map in the folder and on its m + 1; a
    /// copy that is missing, fails its checksum or differs from what this
    /// open holds (and checked) is counted and, with `repair`, written
    /// again.
    fn check_metadata_copies(&mut self, repair: bool, report: &mut ScrubReport) -> Result<()> {
        let config = meta::encode(&self.config);
        let catalog = meta::encode(&self.catalog);
        let mut expected: Vec<(PathBuf, &[u8])> = Vec::new();
        for position in 0..self.config.devices.len() {
            if !self.missing_devices.contains(&position) {
                expected.push((self.device_dir(position).join(CONFIG_FILE), &config));
            }
        }
        expected.push((self.dir.join(CONFIG_FILE), &config));
        let maps: Vec<(u32, Vec<u8>)> = self
            .batches
            .values()
            .map(|map| (map.batch, map.encode()))
            .collect();
        for (batch, encoded) in &maps {
            for path in self.map_copy_paths(*batch) {
                if path.parent().is_some_and(|dir| self.disk.is_dir(dir)) {
                    expected.push((path, encoded));
                }
            }
            expected.push((self.dir.join(MAPS_DIR).join(map_name(*batch)), encoded));
        }
        for (path, bytes) in expected {
            if self.disk.read_all(&path).ok().flatten().as_deref() != Some(bytes) {
                report.bad_metadata_copies += 1;
                if repair {
                    self.disk.write_durable(&path, bytes)?;
                }
            }
        }
        let folder_catalog = self.dir.join(CATALOG_FILE);
        let folder_bad = self
            .disk
            .read_all(&folder_catalog)
            .ok()
            .flatten()
            .as_deref()
            != Some(&catalog[..]);
        let stale = if repair {
            self.refresh_catalog_copies(folder_bad)?
        } else {
            self.catalog_copies_stale()?.0
        };
        report.bad_metadata_copies += stale as u64 + folder_bad as u64;
        Ok(())
    }

    /// Parity blocks checked and found wrong in group `g`, the parity files
    /// found wrong, and the parity files as they should be: None where a data block of the group
    /// cannot be read or recovered (its stripes are not checked, and the
    /// parity files are left as they are: they may be what recovers it
    /// once a device comes back).
    #[allow(clippy::type_complexity)]
    fn check_parity(
        &self,
        map: &BatchMap,
        g: usize,
    ) -> Result<(u64, u64, u64, Option<Vec<(PathBuf, Vec<u8>)>>)> {
        let (k, m) = (self.config.k, self.config.m);
        let block = self.config.block_bytes as usize;
        let group = &map.groups[g];
        let encoded = group.encoded as usize;
        let paths: Vec<PathBuf> = (0..m)
            .map(|i| {
                self.device_dir(group.parity_devices[i] as usize)
                    .join(parity_name(map.group_id(g), i))
            })
            .collect();
        let stored: Vec<Option<Vec<u8>>> = paths
            .iter()
            .map(|p| self.disk.read_all(p))
            .collect::<Result<_>>()?;
        let mut fresh = vec![vec![0u8; encoded * block]; m];
        let mut bad = 0u64;
        let mut checked = 0u64;
        let mut bad_files = vec![false; m];
        let mut complete = true;
        'positions: for position in 0..encoded {
            let mut data = Vec::with_capacity(k);
            for &(cid, j) in &group.members {
                let c = map.container(cid).expect("decoded map");
                match c.sub_files[j as usize].stripe_column(map.layout, position as u32) {
                    None => data.push(vec![0u8; block]),
                    Some(column) => match self.read_block(BlockAddress {
                        container: cid,
                        sub_file: j,
                        column,
                    }) {
                        Ok(bytes) => data.push(bytes),
                        // Counted by the caller's pass over the blocks.
                        Err(ecdedup_core::error::Error::DataLoss(_)) => {
                            complete = false;
                            continue 'positions;
                        }
                        Err(e) => return Err(e),
                    },
                }
            }
            checked += m as u64;
            let refs: Vec<&[u8]> = data.iter().map(|d| &d[..]).collect();
            let mut out: Vec<&mut [u8]> = fresh
                .iter_mut()
                .map(|p| &mut p[position * block..(position + 1) * block])
                .collect();
            self.codec.encode(&refs, &mut out);
            for (i, p) in out.iter().enumerate() {
                let on_disk = stored[i]
                    .as_ref()
                    .and_then(|s| s.get(position * block..(position + 1) * block));
                if on_disk != Some(&p[..]) {
                    bad += 1;
                    bad_files[i] = true;
                }
            }
        }
        // A file with trailing bytes, or a missing one of no stripes (the
        // per-block compare above sees neither): rewrite it.
        for (i, s) in stored.iter().enumerate() {
            let wrong_length = match s {
                None => encoded == 0,
                Some(s) => s.len() > encoded * block,
            };
            bad += wrong_length as u64;
            bad_files[i] |= wrong_length;
        }
        let files = bad_files.iter().filter(|b| **b).count() as u64;
        let expected = complete.then(|| paths.into_iter().zip(fresh).collect());
        Ok((checked, bad, files, expected))
    }
}
