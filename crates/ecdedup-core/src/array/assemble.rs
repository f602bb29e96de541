//! `ecdedup assemble --force`: brings back members marked failed whose data
//! is still there, when more than m are marked failed and the array
//! cannot open (a controller or cable that dropped several devices at
//! once).
//!
//! As Linux md's `--assemble --force`: among the members marked failed
//! whose superblock is still readable and names this array, this position
//! and itself as active (a member that was being rebuilt is never taken),
//! the freshest are marked active again: the highest generation of their
//! own superblock, i.e. the last to leave service, whose data missed the
//! fewest writes. Only as many as bring the failed count down to m. Why
//! their data is current: once more than m members are out, no write can
//! complete, so the last member to leave missed at most the writes in
//! flight as it left; those stripes are in dirty intent regions, which the
//! next open resynchronises as after any crash. Members that stay failed
//! keep their place until `re-add` (data still there) or `replace` +
//! `rebuild`.
//!
//! `ecdedup assemble --device ...` (format 2): rebuilds a lost array
//! folder from the devices' superblocks and the copy of `array.json` in
//! their metadata areas.

use super::inspect::{check_member, newest_superblock, read_member};
use super::superblock::{MemberState, Superblock};
use super::{lock_dir, ConfigFile};
use crate::error::{Error, Result};
use crate::media::area::AreaFs;
use crate::media::{FileDevice, OsStorage};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Marks the freshest failed members of the stopped array in `dir` active
/// again until at most m are failed; returns the positions brought back.
pub fn force_assemble(dir: &Path) -> Result<Vec<usize>> {
    let _lock = lock_dir(dir)?;
    let cfg = ConfigFile::load(dir)?;
    let members: Vec<Option<Superblock>> = cfg
        .devices
        .iter()
        .map(|path| read_member(path).ok().map(|(sb, _)| sb))
        .collect();
    for (i, sb) in members.iter().enumerate() {
        if let Some(sb) = sb {
            check_member(&cfg, i, sb)?;
        }
    }
    let newest = newest_superblock(&members)?;
    let geo = newest.geometry;
    let out_of_service = |i: usize| members[i].is_none() || newest.states[i] == MemberState::Failed;
    let failed: Vec<usize> = (0..members.len()).filter(|&i| out_of_service(i)).collect();
    if failed.len() <= geo.m() {
        return Err(Error::Config(format!(
            "{} of {} members are failed; RS({},{}) opens with up to {} without --force",
            failed.len(),
            members.len(),
            geo.k,
            geo.m,
            geo.m
        )));
    }
    let mut candidates: Vec<(u64, usize)> = failed
        .iter()
        .filter_map(|&i| {
            let sb = members[i].as_ref()?;
            (sb.states.get(i) == Some(&MemberState::Active)).then_some((sb.generation, i))
        })
        .collect();
    candidates.sort_by_key(|&(generation, i)| (std::cmp::Reverse(generation), i));
    let needed = failed.len() - geo.m();
    if candidates.len() < needed {
        return Err(Error::Unavailable(format!(
            "{} members are failed and only {} of them still hold a superblock of this array \
             that lists them active; RS({},{}) needs {needed} back",
            failed.len(),
            candidates.len(),
            geo.k,
            geo.m
        )));
    }
    let chosen: Vec<usize> = candidates[..needed].iter().map(|&(_, i)| i).collect();
    let mut states = newest.states.clone();
    for &i in &chosen {
        states[i] = MemberState::Active;
    }
    let generation = newest.generation + 1;
    for (i, sb) in members.iter().enumerate() {
        let Some(sb) = sb else { continue };
        if states[i] == MemberState::Failed {
            continue;
        }
        let next = Superblock {
            generation,
            states: states.clone(),
            ..sb.clone()
        };
        write_superblock(&cfg.devices[i], &next)
            .map_err(|e| Error::io(format!("writing the superblock of device {i}"), e))?;
    }
    Ok(chosen)
}

/// Writes `sb` into its slot of the device at `path` and syncs it.
fn write_superblock(path: &Path, sb: &Superblock) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new().write(true).open(path)?;
    file.write_all_at(&sb.encode(), Superblock::slot_offset(sb.generation))?;
    file.sync_all()
}

/// Rebuilds a lost array folder from the devices alone (format 2): the
/// superblocks say which array each device belongs to and where it sits,
/// and the copy of `array.json` in their metadata areas holds the
/// settings. `paths` may come in any order and must all belong to one
/// array; positions not given keep the path the copy names. Writes
/// `dir/array.json` (nothing on the devices) and returns it.
pub fn assemble_from_devices(dir: &Path, paths: &[PathBuf]) -> Result<ConfigFile> {
    if paths.is_empty() {
        return Err(Error::Config(
            "name the array's devices with --device".into(),
        ));
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let _lock = lock_dir(dir)?;
    if dir.join(super::CONFIG_FILE).exists() {
        return Err(Error::Config(format!(
            "{} already holds an array ({}); assemble into an empty folder",
            dir.display(),
            super::CONFIG_FILE
        )));
    }
    let mut found: Vec<(PathBuf, Superblock)> = Vec::new();
    for path in paths {
        let (sb, _) = read_member(path).map_err(|why| Error::Device {
            path: path.clone(),
            reason: why,
        })?;
        if let Some((other, first)) = found.first() {
            if first.array_uuid != sb.array_uuid {
                return Err(Error::Device {
                    path: path.clone(),
                    reason: format!(
                        "belongs to array {}, {} to array {}",
                        uuid::Uuid::from_bytes(sb.array_uuid),
                        other.display(),
                        uuid::Uuid::from_bytes(first.array_uuid)
                    ),
                });
            }
        }
        if let Some((other, _)) = found.iter().find(|(_, s)| s.position == sb.position) {
            return Err(Error::Device {
                path: path.clone(),
                reason: format!(
                    "claims position {} as {} does (a stale member and its replacement?)",
                    sb.position,
                    other.display()
                ),
            });
        }
        found.push((path.clone(), sb));
    }
    let members: Vec<Option<Superblock>> = {
        let n = found[0].1.geometry.devices as usize;
        let mut v = vec![None; n];
        for (_, sb) in &found {
            if let Some(slot) = v.get_mut(sb.position as usize) {
                *slot = Some(sb.clone());
            }
        }
        v
    };
    let newest = newest_superblock(&members)?;
    let geo = newest.geometry;
    if geo.meta_area_bytes == 0 {
        return Err(Error::Config(
            "this array keeps its metadata in its folder (format 1, `create --metadata folder`): \
             the folder cannot be rebuilt from the devices"
                .into(),
        ));
    }
    // The newest copy: members in service by position, freshest superblock first.
    let mut order: Vec<&(PathBuf, Superblock)> = found
        .iter()
        .filter(|(_, sb)| newest.states.get(sb.position as usize) == Some(&MemberState::Active))
        .collect();
    order.sort_by_key(|(_, sb)| (std::cmp::Reverse(sb.generation), sb.position));
    let mut why = Vec::new();
    let mut cfg = None;
    for (path, _) in order {
        let read = FileDevice::open_in(&OsStorage, path)
            .and_then(|dev| {
                let area = AreaFs::open_read_only(
                    Arc::new(dev),
                    geo.meta_area_offset(),
                    geo.meta_area_bytes,
                )?;
                let f = Arc::new(area).open_file(super::CONFIG_FILE)?;
                let mut b = vec![0u8; f.len()? as usize];
                f.read_at(&mut b, 0)?;
                Ok(b)
            })
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice::<ConfigFile>(&b).map_err(|e| e.to_string()));
        match read {
            Ok(c) if c.array_uuid.as_bytes() == &newest.array_uuid => {
                cfg = Some(c);
                break;
            }
            Ok(_) => why.push(format!(
                "{}: a copy of another array's settings",
                path.display()
            )),
            Err(e) => why.push(format!("{}: {e}", path.display())),
        }
    }
    let Some(mut cfg) = cfg else {
        return Err(Error::Corrupt(format!(
            "no device in service holds a readable copy of {} ({})",
            super::CONFIG_FILE,
            why.join("; ")
        )));
    };
    if cfg.devices.len() != geo.devices as usize {
        return Err(Error::Corrupt(format!(
            "the copy of {} lists {} devices, the superblocks {}",
            super::CONFIG_FILE,
            cfg.devices.len(),
            geo.devices
        )));
    }
    for (path, sb) in &found {
        cfg.devices[sb.position as usize] =
            std::path::absolute(path).unwrap_or_else(|_| path.clone());
    }
    cfg.store(dir)?;
    Ok(cfg)
}
