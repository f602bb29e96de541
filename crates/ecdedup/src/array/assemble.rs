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

use super::inspect::{check_member, newest_superblock, read_member};
use super::superblock::{MemberState, Superblock};
use super::{lock_dir, ConfigFile};
use crate::error::{Error, Result};
use std::path::Path;

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
