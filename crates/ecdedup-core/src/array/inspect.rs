//! Inspecting a stopped array without changing a byte of it.
//!
//! Opening an array ([`Array::open`](super::Array::open)) recovers it:
//! resync of dirty regions, journal replay, superblocks rewritten, the
//! intent map cleared at close. `status` and `stats` of an array that no
//! server holds must not: an operator looking at an array left dirty by a
//! crash would otherwise change what they look at, before deciding anything.
//! Here every file is opened read-only and only read: `array.json`, the two
//! superblock slots of each device, the intent map, and (format 2) the
//! metadata area of every member: a member whose area open would refuse is
//! shown failed, as open fails it, and every copy of every mirrored file is
//! compared (`MetaStorage::check_copies`). The caller holds the folder's
//! lock, so that no server starts (and recovers) meanwhile.

use super::superblock::{MemberState, Superblock};
use super::{ConfigFile, DeviceStatus, Geometry, Status, INTENT_FILE};
use crate::dedup::Policy;
use crate::error::{Error, Result};
use crate::fingerprint::gpu::{choose_backend, BackendChoice};
use crate::media::area::AreaFs;
use crate::media::{FileDevice, OsStorage, Storage};
use std::path::Path;
use std::sync::Arc;

/// What one device's superblock says, read without writing; Err names why
/// the device counts as failed.
pub(super) fn read_member(path: &Path) -> std::result::Result<(Superblock, u64), String> {
    use std::io::{Seek, SeekFrom};
    use std::os::unix::fs::FileExt;
    let mut file = std::fs::File::open(path).map_err(|e| format!("cannot be opened: {e}"))?;
    let size = file
        .seek(SeekFrom::End(0))
        .map_err(|e| format!("size unknown: {e}"))?;
    let mut buf = vec![0u8; 2 * super::SUPERBLOCK_BYTES as usize];
    file.read_exact_at(&mut buf, 0)
        .map_err(|e| format!("superblock unreadable: {e}"))?;
    let (a, b) = buf.split_at(super::SUPERBLOCK_BYTES as usize);
    let sb = Superblock::newest(a, b).map_err(|e| e.to_string())?;
    Ok((sb, size))
}

/// The status of the stopped array in `dir`, read without changing any
/// file and without recovery. The caller holds the folder's lock.
pub fn inspect(dir: &Path) -> Result<Status> {
    let cfg = ConfigFile::load(dir)?;
    let mut warnings = Vec::new();
    let members: Vec<Option<Superblock>> = cfg
        .devices
        .iter()
        .enumerate()
        .map(|(i, path)| {
            let member = read_member(path).and_then(|(sb, size)| {
                if size < sb.geometry.device_bytes_min() {
                    return Err(format!(
                        "holds {size} bytes, needs {}",
                        sb.geometry.device_bytes_min()
                    ));
                }
                Ok(sb)
            });
            match member {
                // A device of this array found at another position's path
                // is followed by open (`Array::follow_moved_devices`),
                // which rewrites the config; here it is only reported. A
                // foreign device is refused, as open refuses it.
                Ok(sb)
                    if sb.array_uuid == *cfg.array_uuid.as_bytes() && sb.position as usize != i =>
                {
                    warnings.push(format!(
                        "{} holds device {} (listed at position {i}): the next open \
                         follows the superblocks and rewrites {}",
                        path.display(),
                        sb.position,
                        super::CONFIG_FILE
                    ));
                    Ok(Some(sb))
                }
                Ok(sb) => match foreign_member(&cfg, i, &sb) {
                    Some(why) => {
                        warnings.push(why);
                        Ok(None)
                    }
                    None => check_member(&cfg, i, &sb).map(|()| Some(sb)),
                },
                Err(why) => {
                    warnings.push(format!(
                        "device {i} ({}) treated as failed: {why}",
                        path.display()
                    ));
                    Ok(None)
                }
            }
        })
        .collect::<Result<_>>()?;
    let mut members = members;
    let newest = newest_superblock(&members)?;
    let geo = newest.geometry;
    // A stale member is failed at open: said so here too.
    for (i, slot) in members.iter_mut().enumerate() {
        if let Some(why) = slot.as_ref().and_then(|sb| stale_member(sb, &newest)) {
            warnings.push(format!(
                "device {i} ({}) treated as failed: {why}",
                cfg.devices[i].display()
            ));
            *slot = None;
        }
    }
    let storage = metadata_view(dir, &cfg, &geo, &mut members, &newest.states, &mut warnings);
    let devices: Vec<DeviceStatus> = cfg
        .devices
        .iter()
        .enumerate()
        .map(|(i, path)| DeviceStatus {
            position: i,
            path: path.clone(),
            state: match (&members[i], newest.states.get(i)) {
                (Some(_), Some(state)) => *state,
                _ => MemberState::Failed,
            },
        })
        .collect();
    let dirty_regions = dirty_regions(storage.as_ref(), dir, &cfg, geo.stripes, &mut warnings);
    let poisoned_blocks = match super::poison::PoisonList::open(
        Arc::clone(&storage),
        &dir.join(super::POISON_FILE),
        geo.stripes,
        geo.k(),
        geo.blocks_per_unit(),
    ) {
        Ok(list) => list.len(),
        Err(e) => {
            warnings.push(format!("{e}: the array will refuse to open"));
            0
        }
    };
    if dirty_regions > 0 {
        warnings.push(format!(
            "stopped uncleanly: {dirty_regions} intent regions are dirty; the next open \
             (serve, or a maintenance command) resynchronises them"
        ));
    }
    let states: Vec<MemberState> = devices.iter().map(|d| d.state).collect();
    let unusable = states.iter().filter(|s| **s == MemberState::Failed).count();
    if unusable > geo.m() {
        return Err(too_many_failed(unusable, &geo, &warnings));
    }
    Ok(Status {
        array_uuid: cfg.array_uuid,
        devices_total: geo.devices,
        k: geo.k,
        m: geo.m,
        stripe_unit_bytes: geo.stripe_unit_bytes,
        block_bytes: geo.block_bytes,
        stripes: geo.stripes,
        volume_bytes: newest.volume_bytes,
        generation: newest.generation,
        health: super::health(&states, geo.m()),
        write_policy: cfg.write_policy,
        dedup: cfg.dedup.clone(),
        fingerprint_backend: offline_backend(&cfg),
        ssd_sim: cfg.ssd_sim.clone(),
        devices,
        dirty_regions,
        metadata_area_bytes: geo.meta_area_bytes,
        missed_regions: super::IntentLog::dirty_regions_at(
            storage.as_ref(),
            &dir.join(super::MISSED_FILE),
            cfg.array_uuid.as_bytes(),
            geo.stripes,
        ),
        poisoned_blocks,
        operation: None,
        warnings,
    })
}

/// Where a stopped array's metadata is read: the folder (format 1) or the
/// metadata areas of its members, opened without writing (format 2). A
/// member whose area cannot be opened is taken out of `members` (open
/// fails it: the status says so), and a copy of a mirrored file that
/// differs from the others is warned about.
fn metadata_view(
    dir: &Path,
    cfg: &ConfigFile,
    geo: &Geometry,
    members: &mut [Option<Superblock>],
    states: &[MemberState],
    warnings: &mut Vec<String>,
) -> Arc<dyn Storage> {
    let base = OsStorage::shared();
    if geo.meta_area_bytes == 0 {
        return base;
    }
    let areas: Vec<_> = cfg
        .devices
        .iter()
        .enumerate()
        .map(|(i, path)| {
            members.get(i)?.as_ref()?;
            if states.get(i) == Some(&MemberState::Failed) {
                return None;
            }
            let opened = FileDevice::open_in(base.as_ref(), path)
                .map_err(|e| e.to_string())
                .and_then(|dev| {
                    AreaFs::open_read_only(
                        Arc::new(dev),
                        geo.meta_area_offset(),
                        geo.meta_area_bytes,
                    )
                    .map_err(|e| e.to_string())
                });
            match opened {
                Ok(area) => Some(Arc::new(area)),
                Err(e) => {
                    warnings.push(format!(
                        "device {i} ({}) treated as failed: its metadata area cannot be \
                         used: {e}; the next open fails it (then `replace` and `rebuild`)",
                        path.display()
                    ));
                    None
                }
            }
        })
        .collect();
    for (i, area) in areas.iter().enumerate() {
        if area.is_none() && states.get(i) != Some(&MemberState::Failed) {
            members[i] = None;
        }
    }
    let order = (0..states.len())
        .filter(|&i| states[i] == MemberState::Active)
        .collect();
    let meta = super::meta::MetaStorage::new(base, dir, areas, order);
    for p in meta.check_copies(false) {
        warnings.push(format!(
            "metadata {p}; `scrub` rewrites it from the good copy"
        ));
    }
    meta.shared()
}

/// The fingerprint backend an offline command would hash with, and why
/// (a configured `gpu` is tried as `auto` offline, as `ecdedup` does).
fn offline_backend(cfg: &ConfigFile) -> String {
    let choice = cfg.fingerprint_backend;
    if cfg.dedup.policy == Policy::None {
        return format!("none: dedup is off ({choice} configured)");
    }
    let choice = match choice {
        BackendChoice::Gpu => BackendChoice::Auto,
        other => other,
    };
    match choose_backend(choice, None) {
        Ok((_, why)) => why,
        Err(e) => format!("{choice}: {e}"),
    }
}

/// The superblock of the highest generation among the members read.
pub(super) fn newest_superblock(members: &[Option<Superblock>]) -> Result<Superblock> {
    members
        .iter()
        .flatten()
        .max_by_key(|sb| sb.generation)
        .cloned()
        .ok_or_else(|| {
            Error::Unavailable("no device of the array has a readable superblock".into())
        })
}

/// Why a member whose superblock names this array and its position is
/// not current, if it is not: [`replaced_member`], or the newest lists
/// its position in service while its generation is behind the newest's
/// by more than one. Every superblock update writes a new generation to
/// every member in service (one at a time, so a cut in the middle leaves
/// members one generation apart), so a member listed in service and two
/// or more behind is an old image of it put back (a copy), whose blocks
/// match their own checksums: nothing else would tell that they are
/// stale. (A member that kept an older superblock because its file
/// system was full, and stayed in service, is failed too: `re-add` or a
/// rebuild brings it back.) A member the newest lists failed and names
/// at its position was only out (a server down, a cable): however many
/// generations it missed, it is no stale image; `re-add` resyncs what the
/// missed-write map says it missed.
pub(super) fn stale_member(sb: &Superblock, newest: &Superblock) -> Option<String> {
    let pos = sb.position as usize;
    let listed_in_service = newest
        .states
        .get(pos)
        .is_some_and(|s| *s != MemberState::Failed);
    replaced_member(sb, newest).or_else(|| {
        (listed_in_service && sb.generation + 1 < newest.generation).then(|| {
            format!(
                "its superblock is of generation {}, the array's is {}: a stale image that \
                 missed writes (an old copy put back); `re-add` it, or `replace` and \
                 `rebuild` it",
                sb.generation, newest.generation
            )
        })
    })
}

/// Why a member is an earlier occupant of its position, replaced since,
/// if it is: the newest superblock names another device there (a
/// replacement gets a new device UUID). Its blocks are stale however
/// recent its superblock (an old disk put back after its position was
/// rebuilt; a cluster shard's old chunk on a server the shard was placed
/// on again). Superblocks from before the member table name no one, and
/// nothing is concluded from them.
pub(super) fn replaced_member(sb: &Superblock, newest: &Superblock) -> Option<String> {
    let named = newest.member_uuid(sb.position as usize)?;
    (named != sb.device_uuid).then(|| {
        format!(
            "it is device {} (superblock generation {}), an earlier occupant of position {}, \
             which the array has replaced since with device {} (generation {}): a stale image; \
             `replace` and `rebuild` the position",
            uuid::Uuid::from_bytes(sb.device_uuid),
            sb.generation,
            sb.position,
            uuid::Uuid::from_bytes(named),
            newest.generation
        )
    })
}

/// Each position's member as the array knows it: the device the newest
/// superblock names there, else (not recorded) the device found there.
pub(super) fn member_uuids(newest: &Superblock, sbs: &[Option<Superblock>]) -> Vec<[u8; 16]> {
    (0..sbs.len())
        .map(|i| {
            newest
                .member_uuid(i)
                .or_else(|| sbs[i].as_ref().map(|sb| sb.device_uuid))
                .unwrap_or([0; 16])
        })
        .collect()
}

/// Where the device found at position `i` belongs to another array: why
/// it is left out. Open and status take such a device for a failed member
/// (mdadm's assemble leaves a foreign superblock out the same way): never
/// written, so the other array keeps its data, and `replace` puts a device
/// in its place. Refused, it blocked every command of this array until
/// its file was moved away (a new user's probe, 2026-11-30).
pub(super) fn foreign_member(cfg: &ConfigFile, i: usize, sb: &Superblock) -> Option<String> {
    (sb.array_uuid != *cfg.array_uuid.as_bytes()).then(|| {
        format!(
            "device {i} ({}) treated as failed: it belongs to another array ({}), not {}; \
             it is left untouched (replace it, or list this array's device there)",
            cfg.devices[i].display(),
            uuid::Uuid::from_bytes(sb.array_uuid),
            cfg.array_uuid
        )
    })
}

/// Refuses a device of another array, or one listed at another position.
pub(super) fn check_member(cfg: &ConfigFile, i: usize, sb: &Superblock) -> Result<()> {
    if sb.array_uuid != *cfg.array_uuid.as_bytes() {
        return Err(Error::Device {
            path: cfg.devices[i].clone(),
            reason: format!(
                "belongs to another array ({}), not {}",
                uuid::Uuid::from_bytes(sb.array_uuid),
                cfg.array_uuid
            ),
        });
    }
    if sb.position as usize != i {
        return Err(Error::Device {
            path: cfg.devices[i].clone(),
            reason: format!(
                "is position {} of this array, listed at position {i}: were devices swapped?",
                sb.position
            ),
        });
    }
    Ok(())
}

/// The refusal of an array with more members out than the code survives.
pub(super) fn too_many_failed(unusable: usize, geo: &Geometry, warnings: &[String]) -> Error {
    Error::Unavailable(format!(
        "{unusable} of {} devices are failed or missing; RS({},{}) survives at most {}. {}",
        geo.devices,
        geo.k,
        geo.m,
        geo.m,
        warnings.join("; ")
    ))
}

/// Dirty regions of the intent map, read only (0, with a warning, when
/// the map is missing or corrupt).
fn dirty_regions(
    storage: &dyn Storage,
    dir: &Path,
    cfg: &ConfigFile,
    stripes: u64,
    warnings: &mut Vec<String>,
) -> usize {
    let path = dir.join(INTENT_FILE);
    super::IntentLog::dirty_regions_at(storage, &path, cfg.array_uuid.as_bytes(), stripes)
        .unwrap_or_else(|| {
            warnings.push(format!(
                "intent log {} is missing or corrupt: the next open resynchronises every stripe",
                path.display()
            ));
            0
        })
}
