//! `archive assemble`: a lost archive folder made again from the devices.
//!
//! Every device folder holds a copy of the config (`archive.json`, written
//! at create), of the catalog (`catalog.json`, after every commit) and of
//! the maps of the batches it is one of the m + 1 copy holders of (written
//! before the batch exists). So any k devices with their copies, in any
//! order, give back the config, the newest committed catalog among them
//! and every sealed batch's map (each map is on m + 1 devices: at least
//! one of any N - m). What only the folder held is lost: the open
//! container's staging bytes (not yet sealed, so not yet RS-coded) and the
//! fingerprint cache (a cache: later seals dedup against fewer blocks).
//! Objects with a byte in an unsealed container are dropped from the
//! catalog and named in the report.

use super::disk::Disk;
use super::map::BatchMap;
use super::meta::{self, Checked};
use super::{
    map_name, read_json, ArchiveConfig, ArchiveStore, Catalog, DeviceMarker, CATALOG_FILE,
    CONFIG_FILE, DEVICE_MARKER, MAPS_DIR, STAGING_DIR,
};
use ecdedup_core::error::{Error, Result};
use ecdedup_core::media::{OsStorage, Storage};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What `assemble` found and made.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct AssembleReport {
    pub archive: String,
    /// Device positions given, and those missing (made again by
    /// `scrub --repair`).
    pub devices_found: Vec<usize>,
    pub devices_missing: Vec<usize>,
    /// The catalog generation taken (the newest copy).
    pub catalog_generation: u64,
    pub batches: u64,
    pub objects: u64,
    /// Objects dropped: a byte of theirs was in a container not sealed.
    pub objects_lost: Vec<String>,
}

impl ArchiveStore {
    /// Makes archive folder `dir` (which must hold no archive) again from
    /// `devices` (folders of one archive, any order) on the real file
    /// system.
    pub fn assemble(dir: &Path, devices: &[PathBuf]) -> Result<AssembleReport> {
        ArchiveStore::assemble_in(OsStorage::shared(), dir, devices)
    }

    pub fn assemble_in(
        storage: Arc<dyn Storage>,
        dir: &Path,
        devices: &[PathBuf],
    ) -> Result<AssembleReport> {
        let disk = Disk::new(storage);
        if disk.exists(&dir.join(CONFIG_FILE)) {
            return Err(Error::Config(format!(
                "{} already holds an archive: assemble makes a lost one again",
                dir.display()
            )));
        }
        if devices.is_empty() {
            return Err(Error::Config("assemble needs --device folders".into()));
        }
        let mut config: Option<(ArchiveConfig, bool)> = None;
        let mut positions: BTreeMap<usize, PathBuf> = BTreeMap::new();
        let mut catalogs: Vec<Checked<Catalog>> = Vec::new();
        let mut uuid: Option<String> = None;
        for path in devices {
            let bad = |reason: String| Error::Device {
                path: path.clone(),
                reason,
            };
            let marker: DeviceMarker = read_json(&disk, &path.join(DEVICE_MARKER))?
                .ok_or_else(|| bad("holds no archive device marker".into()))?;
            match &uuid {
                Some(u) if *u != marker.archive => {
                    return Err(bad(format!(
                        "belongs to archive {}, the others to {u}",
                        marker.archive
                    )))
                }
                _ => uuid = Some(marker.archive.clone()),
            }
            // A copy that fails its checksum is no copy (another device's
            // serves); a missing one is no device of an archive.
            let copy = match meta::read::<ArchiveConfig>(&disk, &path.join(CONFIG_FILE))? {
                Checked::Good(c) => Some((c, false)),
                Checked::Legacy(c) => Some((c, true)),
                Checked::Bad(_) => None,
                Checked::Missing => {
                    return Err(bad("holds no copy of the archive's config".into()))
                }
            };
            if let Some((copy, legacy)) = copy {
                if copy.uuid != marker.archive {
                    return Err(bad("its config copy is of another archive".into()));
                }
                if config
                    .as_ref()
                    .is_none_or(|(c, _)| copy.generation > c.generation)
                {
                    config = Some((copy, legacy));
                }
            }
            if let Some(other) = positions.insert(marker.position, path.clone()) {
                return Err(bad(format!(
                    "is device {} of the archive, as {} is",
                    marker.position,
                    other.display()
                )));
            }
            catalogs.push(meta::read::<Catalog>(&disk, &path.join(CATALOG_FILE))?);
        }
        let (config, legacy) = config.ok_or_else(|| {
            Error::Corrupt("no device holds a config copy that passes its checksum".into())
        })?;
        if let Some((&position, path)) = positions.range(config.devices.len()..).next() {
            return Err(Error::Device {
                path: path.clone(),
                reason: format!("position {position} out of range"),
            });
        }
        // The newest catalog copy that passes its checksum (one without a
        // checksum only in an archive made before them).
        let mut catalog: Option<Catalog> = None;
        for c in catalogs.into_iter().filter_map(|c| c.usable(legacy)) {
            if catalog
                .as_ref()
                .is_none_or(|best| c.generation > best.generation)
            {
                catalog = Some(c);
            }
        }
        let mut config = config;
        config.generation += 1;
        let missing: Vec<usize> = (0..config.devices.len())
            .filter(|p| !positions.contains_key(p))
            .collect();
        if missing.len() > config.m {
            return Err(Error::Unavailable(format!(
                "{} of the archive's {} devices are missing (positions {missing:?}); RS({},{}) needs at least {}",
                missing.len(),
                config.devices.len(),
                config.k,
                config.m,
                config.k
            )));
        }
        // Found devices where they are now; missing ones where the config
        // had them (inside the new folder when relative), to be made again.
        for (&position, path) in &positions {
            config.devices[position] = std::path::absolute(path)
                .map_err(|e| Error::io(format!("resolve {}", path.display()), e))?;
        }

        // Every map any device holds, checked by its CRC.
        let mut maps: BTreeMap<u32, (BatchMap, Vec<u8>)> = BTreeMap::new();
        for path in positions.values() {
            for name in disk.list_files(path)?.unwrap_or_default() {
                let batch = name
                    .strip_prefix('b')
                    .and_then(|n| n.strip_suffix(".map"))
                    .and_then(|n| u32::from_str_radix(n, 16).ok());
                if batch.is_none_or(|b| maps.contains_key(&b) || map_name(b) != name) {
                    continue;
                }
                let Some(bytes) = disk.read_all(&path.join(&name))? else {
                    continue;
                };
                if let Ok(map) = BatchMap::decode(&bytes, &name) {
                    if map_name(map.batch) == name {
                        maps.insert(map.batch, (map, bytes));
                    }
                }
            }
        }
        let sealed: BTreeSet<u32> = maps
            .values()
            .flat_map(|(m, _)| m.containers.iter().map(|c| c.id))
            .collect();
        let mut catalog = catalog.unwrap_or_default();
        let objects_lost: Vec<String> = catalog
            .objects
            .iter()
            .filter(|(_, r)| r.extents.iter().any(|e| !sealed.contains(&e.container)))
            .map(|(n, _)| n.clone())
            .collect();
        for name in &objects_lost {
            catalog.objects.remove(name);
        }
        let newest = catalog.newest_container(sealed.iter());
        // A fresh open container: the old one's bytes were in staging.
        catalog.open_container = catalog.next_container.max(newest + 1);
        catalog.next_container = catalog.open_container + 1;
        catalog.open_bytes = 0;
        catalog.pending.clear();
        catalog.generation += 1;

        // The folder: maps, catalog, and the config last (it makes the
        // archive exist, as at create).
        disk.create_dir(dir)?;
        disk.create_dir(&dir.join(MAPS_DIR))?;
        disk.create_dir(&dir.join(STAGING_DIR))?;
        for (batch, (_, bytes)) in &maps {
            disk.write_durable(&dir.join(MAPS_DIR).join(map_name(*batch)), bytes)?;
        }
        meta::write(&disk, &dir.join(CATALOG_FILE), &catalog)?;
        meta::write(&disk, &dir.join(CONFIG_FILE), &config)?;
        disk.sync_dir(dir)?;
        Ok(AssembleReport {
            archive: config.uuid.clone(),
            devices_found: positions.keys().copied().collect(),
            devices_missing: missing,
            catalog_generation: catalog.generation,
            batches: maps.len() as u64,
            objects: catalog.objects.len() as u64,
            objects_lost,
        })
    }
}
