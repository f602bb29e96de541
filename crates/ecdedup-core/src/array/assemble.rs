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

use super::inspect::{check_member, member_uuids, newest_superblock, read_member, replaced_member};
use super::superblock::{MemberState, Superblock};
use super::{lock_dir, ConfigFile};
use crate::error::{Error, Result};
use crate::media::area::AreaFs;
use crate::media::storage::read_file;
use crate::media::{Device, FileDevice, OsStorage, Storage};
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
            (sb.states.get(i) == Some(&MemberState::Active)
                && replaced_member(sb, &newest).is_none())
            .then_some((sb.generation, i))
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
    let member_uuids = member_uuids(&newest, &members);
    // The members brought back first: a cut part way leaves none of them
    // more than one generation behind a member that lists it active (an
    // open would fail it as a stale image).
    let others = (0..members.len()).filter(|i| !chosen.contains(i));
    for i in chosen.iter().copied().chain(others) {
        let Some(sb) = &members[i] else { continue };
        if states[i] == MemberState::Failed || replaced_member(sb, &newest).is_some() {
            continue;
        }
        let next = Superblock {
            generation,
            states: states.clone(),
            member_uuids: member_uuids.clone(),
            // A forced assembly vouches for no server's boot.
            boot_stamp: 0,
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
    if newest.geometry.meta_area_bytes == 0 {
        return Err(Error::Config(
            "this array keeps its metadata in its folder (format 1, `create --metadata folder`): \
             the folder cannot be rebuilt from the devices"
                .into(),
        ));
    }
    let (mut cfg, _) = newest_config_copy(&OsStorage, &found, &newest)?;
    for (path, sb) in &found {
        cfg.devices[sb.position as usize] =
            std::path::absolute(path).unwrap_or_else(|_| path.clone());
    }
    cfg.store(dir)?;
    Ok(cfg)
}

/// The newest readable copy of `array.json` in the metadata areas of
/// `found` (format 2; paths and their superblocks, all of the array
/// `newest` names): members in service first, freshest superblock first.
/// Returns it with the path it was read from.
fn newest_config_copy(
    storage: &dyn Storage,
    found: &[(PathBuf, Superblock)],
    newest: &Superblock,
) -> Result<(ConfigFile, PathBuf)> {
    newest_config_copy_with(found, newest, |path| {
        Ok(Arc::new(FileDevice::open_in(storage, path)?))
    })
}

/// [`newest_config_copy`] over members found as `T`s (paths, or devices
/// already open), each opened by `open`.
fn newest_config_copy_with<T: Clone + NameOf>(
    found: &[(T, Superblock)],
    newest: &Superblock,
    open: impl Fn(&T) -> std::io::Result<Arc<dyn Device>>,
) -> Result<(ConfigFile, T)> {
    let geo = newest.geometry;
    let mut order: Vec<&(T, Superblock)> = found
        .iter()
        .filter(|(_, sb)| newest.states.get(sb.position as usize) == Some(&MemberState::Active))
        .collect();
    order.sort_by_key(|(_, sb)| (std::cmp::Reverse(sb.generation), sb.position));
    let mut why = Vec::new();
    for (member, _) in order {
        let read = open(member)
            .and_then(|dev| {
                let area =
                    AreaFs::open_read_only(dev, geo.meta_area_offset(), geo.meta_area_bytes)?;
                read_file(Arc::new(area).open_file(super::CONFIG_FILE)?.as_ref())
            })
            .map_err(|e| e.to_string())
            .and_then(|b| serde_json::from_slice::<ConfigFile>(&b).map_err(|e| e.to_string()));
        let name = member.name_of();
        match read {
            Ok(c) if c.array_uuid.as_bytes() != &newest.array_uuid => {
                why.push(format!("{name}: a copy of another array's settings"))
            }
            Ok(c) if c.devices.len() != geo.devices as usize => why.push(format!(
                "{name}: the copy lists {} devices, the superblocks {}",
                c.devices.len(),
                geo.devices
            )),
            Ok(c) => return Ok((c, member.clone())),
            Err(e) => why.push(format!("{name}: {e}")),
        }
    }
    Err(Error::Corrupt(format!(
        "no device in service holds a readable copy of {} ({})",
        super::CONFIG_FILE,
        why.join("; ")
    )))
}

/// Recovers `array.json` of the array in `dir`, whose bytes `broken` do not
/// parse (`why`), from the copies on its devices (format 2), under the
/// folder's lock: the candidates are the device files in the folder
/// (`dev*`, where `create` puts them) and every path the broken file still
/// shows; those whose superblock names the array (the uuid the file still
/// shows, or the only one found) give the newest copy, as `assemble`
/// reads it. The broken bytes are kept as `array.json.corrupt-<time>` and
/// the recovered file written in their place; returns it and a warning
/// saying what happened. Format 1 (no copies on the devices) and no device
/// found are errors that say what to do.
pub(super) fn recover_config(
    storage: &dyn Storage,
    dir: &Path,
    broken: &[u8],
    why: &str,
) -> Result<(ConfigFile, String)> {
    let path = dir.join(super::CONFIG_FILE);
    let damaged = format!("{} cannot be parsed ({why})", path.display());
    let text = String::from_utf8_lossy(broken);
    // What the broken file still shows: JSON strings that are absolute
    // paths or uuids.
    let shown: Vec<&str> = text.split('"').skip(1).step_by(2).collect();
    let mut candidates: Vec<PathBuf> = shown
        .iter()
        .filter(|s| s.starts_with('/') && !s.chars().any(char::is_control))
        .map(PathBuf::from)
        .collect();
    for name in storage.list_files(dir).unwrap_or_default() {
        if name.starts_with("dev") {
            candidates.push(dir.join(name));
        }
    }
    candidates.sort();
    candidates.dedup();
    let mut found: Vec<(PathBuf, Superblock)> = Vec::new();
    for candidate in candidates {
        let Ok(dev) = FileDevice::open_in(storage, &candidate) else {
            continue;
        };
        if let Ok(sb) = super::read_superblock(&dev) {
            found.push((candidate, sb));
        }
    }
    let mut uuids: Vec<[u8; 16]> = found.iter().map(|(_, sb)| sb.array_uuid).collect();
    uuids.sort();
    uuids.dedup();
    let named = uuids.iter().copied().find(|u| {
        let u = uuid::Uuid::from_bytes(*u).to_string();
        shown.contains(&u.as_str())
    });
    let array_uuid = match (named, uuids.as_slice()) {
        (Some(u), _) => u,
        (None, [u]) => *u,
        (None, []) => {
            return Err(Error::Corrupt(format!(
                "{damaged}, and no device of the array was found in {} or at a path the file \
                 still shows: `ecdedup assemble --device DEV...` into an empty folder rebuilds \
                 it from the devices",
                dir.display()
            )))
        }
        (None, _) => {
            return Err(Error::Corrupt(format!(
                "{damaged}, and devices of {} arrays were found: `ecdedup assemble --device \
                 DEV...` into an empty folder with the devices of this one rebuilds it",
                uuids.len()
            )))
        }
    };
    found.retain(|(_, sb)| sb.array_uuid == array_uuid);
    let n = found[0].1.geometry.devices as usize;
    let newest = newest_of_found(&found, n)?;
    if newest.geometry.meta_area_bytes == 0 {
        return Err(Error::Config(format!(
            "{damaged}, and this array keeps its metadata in its folder (format 1, \
             `create --metadata folder`): its devices hold no copy of the settings. Restore \
             {} from a backup; `ecdedup assemble` rebuilds only arrays of format 2",
            super::CONFIG_FILE
        )));
    }
    let (mut cfg, source) = newest_config_copy(storage, &found, &newest)
        .map_err(|e| Error::Corrupt(format!("{damaged}, and it cannot be recovered: {e}")))?;
    // Devices found where the copy does not say (the folder moved) are
    // followed, where one path alone claims the position.
    for (p, sb) in &found {
        let pos = sb.position as usize;
        if found
            .iter()
            .filter(|(_, s)| s.position == sb.position)
            .count()
            == 1
            && pos < n
        {
            cfg.devices[pos] = std::path::absolute(p).unwrap_or_else(|_| p.clone());
        }
    }
    let aside = keep_aside(storage, &path, broken)
        .map_err(|e| Error::io(format!("keeping the damaged {} aside", path.display()), e))?;
    cfg.write_in(storage, dir)?;
    Ok((
        cfg,
        format!(
            "{damaged}: recovered from the copy on {} (superblock generation {}); the damaged \
             file is kept as {}",
            source.display(),
            newest.generation,
            aside.display()
        ),
    ))
}

/// The newest superblock among the members `found` of an array of `n`
/// devices (per position the highest generation seen, then the newest of
/// those).
fn newest_of_found<T>(found: &[(T, Superblock)], n: usize) -> Result<Superblock> {
    let mut members: Vec<Option<Superblock>> = vec![None; n];
    for (_, sb) in found {
        if let Some(slot) = members.get_mut(sb.position as usize) {
            if slot.as_ref().is_none_or(|s| s.generation < sb.generation) {
                *slot = Some(sb.clone());
            }
        }
    }
    newest_superblock(&members)
}

/// The positions among `devices` (in position order, None where a member
/// cannot be reached) that hold an earlier occupant of the position,
/// replaced since ([`super::inspect::replaced_member`]): stale images,
/// which an open fails, never reads; a volume client installs their
/// chunks as replacements and rebuilds them. A member that was only out,
/// however many superblock generations ago, is not one of them: it is
/// re-added.
pub fn replaced_members(devices: &[Option<Arc<dyn Device>>]) -> Vec<usize> {
    let sbs: Vec<Option<Superblock>> = devices
        .iter()
        .map(|d| {
            d.as_ref()
                .and_then(|d| super::read_superblock(d.as_ref()).ok())
        })
        .collect();
    let Ok(newest) = newest_superblock(&sbs) else {
        return Vec::new();
    };
    (0..sbs.len())
        .filter(|&i| {
            sbs[i].as_ref().is_some_and(|sb| {
                sb.array_uuid == newest.array_uuid && replaced_member(sb, &newest).is_some()
            })
        })
        .collect()
}

/// How a member is named in messages.
trait NameOf {
    fn name_of(&self) -> String;
}

impl NameOf for PathBuf {
    fn name_of(&self) -> String {
        self.display().to_string()
    }
}

impl NameOf for Arc<dyn Device> {
    fn name_of(&self) -> String {
        self.describe()
    }
}

/// The settings of the array whose members are `devices` (in position
/// order, None where a member cannot be reached), read from the newest
/// copy on the devices themselves (format 2): how a volume client that has
/// never served the array opens it (docs/cluster.md). The members must
/// all belong to one array; at least one must hold a readable copy.
pub fn config_from_devices(devices: &[Option<Arc<dyn Device>>]) -> Result<ConfigFile> {
    let mut found: Vec<(Arc<dyn Device>, Superblock)> = Vec::new();
    let mut why = Vec::new();
    for dev in devices.iter().flatten() {
        match super::read_superblock(dev.as_ref()) {
            Ok(sb) => found.push((Arc::clone(dev), sb)),
            Err(e) => why.push(format!("{}: {e}", dev.describe())),
        }
    }
    let Some((_, first)) = found.first() else {
        return Err(Error::Corrupt(format!(
            "no member holds a superblock ({})",
            why.join("; ")
        )));
    };
    let uuid = first.array_uuid;
    if let Some((dev, sb)) = found.iter().find(|(_, sb)| sb.array_uuid != uuid) {
        return Err(Error::Device {
            path: PathBuf::from(dev.describe()),
            reason: format!(
                "belongs to array {}, not {}",
                uuid::Uuid::from_bytes(sb.array_uuid),
                uuid::Uuid::from_bytes(uuid)
            ),
        });
    }
    let n = first.geometry.devices as usize;
    let newest = newest_of_found(&found, n)?;
    if newest.geometry.meta_area_bytes == 0 {
        return Err(Error::Config(
            "the array keeps its settings in its folder (format 1): its devices hold no copy"
                .into(),
        ));
    }
    let (cfg, _) = newest_config_copy_with(&found, &newest, |d| Ok(Arc::clone(d)))?;
    Ok(cfg)
}

/// Copies `bytes` (the damaged `path`) to `path.corrupt-<unix seconds>`,
/// durably, before the file is replaced: a crash in between leaves both.
fn keep_aside(storage: &dyn Storage, path: &Path, bytes: &[u8]) -> std::io::Result<PathBuf> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let name = |i: u32| {
        let mut p = path.as_os_str().to_owned();
        p.push(format!(".corrupt-{secs}"));
        if i > 0 {
            p.push(format!("-{i}"));
        }
        PathBuf::from(p)
    };
    let aside = (0..1000)
        .map(name)
        .find(|p| !storage.exists(p))
        .ok_or_else(|| std::io::Error::other("1000 damaged copies kept already"))?;
    let f = storage.create(&aside, true)?;
    f.write_at(bytes, 0)?;
    f.sync()?;
    drop(f);
    storage.sync_dir(crate::media::storage::parent_of(path))?;
    Ok(aside)
}
