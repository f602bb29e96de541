//! The write-intent log: how ecdedup closes the RAID write hole.
//!
//! The volume is cut into regions of whole stripes. Before the first device
//! write into a clean region, its byte in the intent map is set and made
//! durable (`fdatasync`); only then do data, parity and checksum writes go
//! out. A flush makes every device durable and then clears the regions that
//! saw no write since the flush began, have none in flight, and have been
//! quiet for `QUIET_BEFORE_CLEAR` (md's lazy bitmap clearing). After an
//! unclean stop, every dirty region is resynchronised before serving: parity
//! is recomputed from data and checksums from content, so every stripe's
//! parity matches its data again (docs/write-hole.md has the argument and
//! its limits).
//!
//! A region can be *pinned*: it then stays dirty until the array is
//! reopened, whatever flushes and clean shutdowns happen meanwhile. A stripe
//! whose parity journal holds records that could not be invalidated (the
//! journal's disk failed or filled) is pinned, so the next open resyncs it
//! before replaying any journal.
//!
//! File layout: a 4 KiB header (magic, version, array UUID, stripes per
//! region, region count, CRC32C), then one byte per region: 0 clean, 1 dirty.

use crate::error::{Error, Result};
use crate::media::storage::{read_all, OsStorage, Storage, StorageFile};
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A region is cleared only after this much quiet, as Linux md's bitmap
/// daemon does: a client that flushes often would otherwise pay a mark (a
/// synced write) for every region it touches after every flush.
pub const QUIET_BEFORE_CLEAR: Duration = Duration::from_secs(5);

const MAGIC: [u8; 8] = *b"ECDDIL01";
const HEADER_BYTES: u64 = 4096;
const VERSION: u32 = 1;
/// Volume bytes a region covers, by default.
pub const REGION_BYTES_DEFAULT: u64 = 64 << 20;

struct RegionState {
    dirty: bool,
    in_flight: u32,
    /// Flush epoch of the last write that entered or left the region.
    last_epoch: u64,
    /// When a write last entered or left the region.
    last_touch: Option<Instant>,
    /// Stays dirty until the next open (see the module comment).
    pinned: bool,
}

struct Inner {
    regions: Vec<RegionState>,
    epoch: u64,
}

/// The regions written while a member was out of service: Linux md's
/// bitmap kept while degraded. Kept in `missed.map` (the intent map's
/// format), never cleared by a flush: `re-add` resynchronises exactly
/// these regions of a member whose data is still there.
struct Missed {
    file: Arc<dyn StorageFile>,
    regions: Vec<bool>,
    /// The superblock generation it covers writes since (0: unknown).
    since_generation: u64,
    /// Positions rebuilding by a re-add (bit d).
    re_adding: u64,
}

pub struct IntentLog {
    file: Arc<dyn StorageFile>,
    stripes_per_region: u64,
    inner: Mutex<Inner>,
    /// Set while a member is out of service (lock order: `inner`, then this).
    missed: Mutex<Option<Missed>>,
    /// The array's UUID, for the header of the missed map.
    array_uuid: [u8; 16],
    /// Quiet time before a flush clears a region, milliseconds.
    quiet_before_clear_ms: AtomicU64,
}

/// Dirty regions found at open, as stripe ranges.
pub struct Recovery {
    pub dirty_stripe_ranges: Vec<(u64, u64)>,
}

/// Header bytes 48..56: in the missed map, the superblock generation whose
/// writes it covers from (0 in the intent map, and unknown).
const SINCE_GENERATION_AT: usize = 48;
/// Header bytes 56..64: in the missed map, the positions (bit d, d < 64)
/// rebuilding by a re-add: a re-add cut short resumes as a re-add (0 in
/// the intent map, and in maps written before it was recorded).
const RE_ADDING_AT: usize = 56;

fn header(
    array_uuid: &[u8; 16],
    stripes_per_region: u64,
    regions: u64,
    since_generation: u64,
) -> Vec<u8> {
    missed_header(array_uuid, stripes_per_region, regions, since_generation, 0)
}

/// [`header`] with the missed map's positions being re-added.
fn missed_header(
    array_uuid: &[u8; 16],
    stripes_per_region: u64,
    regions: u64,
    since_generation: u64,
    re_adding: u64,
) -> Vec<u8> {
    let mut h = vec![0u8; HEADER_BYTES as usize];
    h[0..8].copy_from_slice(&MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    h[16..32].copy_from_slice(array_uuid);
    h[32..40].copy_from_slice(&stripes_per_region.to_le_bytes());
    h[40..48].copy_from_slice(&regions.to_le_bytes());
    h[SINCE_GENERATION_AT..SINCE_GENERATION_AT + 8]
        .copy_from_slice(&since_generation.to_le_bytes());
    h[RE_ADDING_AT..RE_ADDING_AT + 8].copy_from_slice(&re_adding.to_le_bytes());
    let crc = crc32c::crc32c(&h[..4092]);
    h[4092..].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Parses an intent map file of the array `array_uuid` with `stripes`
/// stripes: its stripes per region and one byte per region (0 clean). An
/// error says why the file cannot be used (`open` then resyncs everything).
pub fn parse_map(bytes: &[u8], array_uuid: &[u8; 16], stripes: u64) -> Result<(u64, Vec<u8>)> {
    let corrupt = |why: &str| Err(Error::Corrupt(format!("intent map: {why}")));
    if bytes.len() < HEADER_BYTES as usize || bytes[0..8] != MAGIC {
        return corrupt("no header");
    }
    let crc = u32::from_le_bytes(bytes[4092..4096].try_into().unwrap());
    if crc != crc32c::crc32c(&bytes[..4092]) {
        return corrupt("header checksum mismatch");
    }
    if bytes[16..32] != array_uuid[..] {
        return corrupt("written for another array");
    }
    let spr = u64::from_le_bytes(bytes[32..40].try_into().unwrap());
    let regions = u64::from_le_bytes(bytes[40..48].try_into().unwrap());
    if spr == 0 || regions != stripes.div_ceil(spr) || bytes.len() as u64 != HEADER_BYTES + regions
    {
        return corrupt("region count does not match the array");
    }
    Ok((spr, bytes[HEADER_BYTES as usize..].to_vec()))
}

/// The positions a missed map parsed by [`parse_map`] records as being
/// re-added.
fn re_adding_of(bytes: &[u8]) -> u64 {
    u64::from_le_bytes(bytes[RE_ADDING_AT..RE_ADDING_AT + 8].try_into().unwrap())
}

/// The generation a missed map parsed by [`parse_map`] covers writes
/// since (0: unknown, as in maps written before it was recorded).
fn since_generation_of(bytes: &[u8]) -> u64 {
    u64::from_le_bytes(
        bytes[SINCE_GENERATION_AT..SINCE_GENERATION_AT + 8]
            .try_into()
            .unwrap(),
    )
}

impl IntentLog {
    pub fn stripes_per_region(stripe_data_bytes: u64, region_bytes: u64) -> u64 {
        (region_bytes / stripe_data_bytes).max(1)
    }

    /// Writes a clean intent map.
    pub fn create(
        path: &Path,
        array_uuid: &[u8; 16],
        stripes: u64,
        stripes_per_region: u64,
    ) -> Result<()> {
        IntentLog::create_in(&OsStorage, path, array_uuid, stripes, stripes_per_region)
    }

    /// [`IntentLog::create`] in `storage`.
    pub fn create_in(
        storage: &dyn Storage,
        path: &Path,
        array_uuid: &[u8; 16],
        stripes: u64,
        stripes_per_region: u64,
    ) -> Result<()> {
        IntentLog::write_map(storage, path, array_uuid, stripes, stripes_per_region, 0)
    }

    /// Writes a whole map with every region at `state` (0 clean, 1 dirty),
    /// durably: through a temporary file renamed over `path`, so a crash
    /// leaves the old map or the new one.
    fn write_map(
        storage: &dyn Storage,
        path: &Path,
        array_uuid: &[u8; 16],
        stripes: u64,
        stripes_per_region: u64,
        state: u8,
    ) -> Result<()> {
        let regions = stripes.div_ceil(stripes_per_region);
        let mut bytes = header(array_uuid, stripes_per_region, regions, 0);
        bytes.resize((HEADER_BYTES + regions) as usize, state);
        crate::media::storage::write_atomic(storage, path, &bytes)
            .map_err(|e| Error::io(format!("writing intent log {}", path.display()), e))
    }

    /// Opens the map; a missing or corrupt map means every stripe may be
    /// inconsistent, which the returned recovery says.
    pub fn open(
        path: &Path,
        array_uuid: &[u8; 16],
        stripes: u64,
        stripes_per_region_default: u64,
    ) -> Result<(IntentLog, Recovery, Option<String>)> {
        IntentLog::open_in(
            &OsStorage,
            path,
            array_uuid,
            stripes,
            stripes_per_region_default,
        )
    }

    /// [`IntentLog::open`] in `storage`.
    pub fn open_in(
        storage: &dyn Storage,
        path: &Path,
        array_uuid: &[u8; 16],
        stripes: u64,
        stripes_per_region_default: u64,
    ) -> Result<(IntentLog, Recovery, Option<String>)> {
        let io = |e| Error::io(format!("opening intent log {}", path.display()), e);
        let mut warning = None;
        let parsed = read_all(storage, path)
            .ok()
            .and_then(|bytes| parse_map(&bytes, array_uuid, stripes).ok());
        let (spr, map) = match parsed {
            Some(p) => p,
            None => {
                warning = Some(format!(
                    "intent log {} is missing or corrupt: resynchronising every stripe",
                    path.display()
                ));
                // The evidence that every stripe needs a resync is made
                // durable before anything else: a map written clean here
                // would let a crash during that resync forget it.
                let spr = stripes_per_region_default;
                IntentLog::write_map(storage, path, array_uuid, stripes, spr, 1)?;
                (spr, vec![1u8; stripes.div_ceil(spr) as usize])
            }
        };
        let file = storage.open(path).map_err(io)?;
        let mut dirty_stripe_ranges = Vec::new();
        for (r, &b) in map.iter().enumerate() {
            if b != 0 {
                let start = r as u64 * spr;
                dirty_stripe_ranges.push((start, (start + spr).min(stripes)));
            }
        }
        let regions = map
            .iter()
            .map(|&b| RegionState {
                dirty: b != 0,
                in_flight: 0,
                last_epoch: 0,
                last_touch: None,
                pinned: false,
            })
            .collect();
        let log = IntentLog {
            file,
            stripes_per_region: spr,
            inner: Mutex::new(Inner { regions, epoch: 1 }),
            missed: Mutex::new(None),
            array_uuid: *array_uuid,
            quiet_before_clear_ms: AtomicU64::new(QUIET_BEFORE_CLEAR.as_millis() as u64),
        };
        Ok((
            log,
            Recovery {
                dirty_stripe_ranges,
            },
            warning,
        ))
    }

    /// How many regions the map at `path` marks dirty, read without
    /// changing it (the status of a stopped array); None when the map is
    /// missing or corrupt (the next open resynchronises every stripe).
    pub fn dirty_regions_at(
        storage: &dyn Storage,
        path: &Path,
        array_uuid: &[u8; 16],
        stripes: u64,
    ) -> Option<usize> {
        let bytes = crate::media::storage::read_all(storage, path).ok()?;
        let (_, map) = parse_map(&bytes, array_uuid, stripes).ok()?;
        Some(map.iter().filter(|&&b| b != 0).count())
    }

    /// Announces a write into `stripe`: marks its region dirty (durably) if
    /// it is clean. Returns whether a mark was written. Pair with `end`.
    pub fn begin(&self, stripe: u64) -> std::io::Result<bool> {
        let r = (stripe / self.stripes_per_region) as usize;
        let mut inner = self.inner.lock().unwrap();
        self.mark_missed(r)?;
        let epoch = inner.epoch;
        let region = &mut inner.regions[r];
        region.in_flight += 1;
        region.last_epoch = epoch;
        region.last_touch = Some(Instant::now());
        if region.dirty {
            return Ok(false);
        }
        // One durable write (a FUA write per copy in a metadata area: one
        // round trip to a chunk, not a write and a flush).
        let marked = self.file.write_durable(&[1], HEADER_BYTES + r as u64);
        if let Err(e) = marked {
            inner.regions[r].in_flight -= 1;
            return Err(e);
        }
        inner.regions[r].dirty = true;
        Ok(true)
    }

    /// Records region `r` in the missed map (durably), if one is kept.
    /// Caller holds `inner`, so that no write slips past the start of
    /// tracking.
    fn mark_missed(&self, r: usize) -> std::io::Result<()> {
        let mut missed = self.missed.lock().unwrap();
        let Some(m) = missed.as_mut() else {
            return Ok(());
        };
        if !m.regions[r] {
            m.file.write_durable(&[1], HEADER_BYTES + r as u64)?;
            m.regions[r] = true;
        }
        Ok(())
    }

    /// Records the regions of `stripes` (None: every region) in the
    /// missed map, durably with one sync, if one is kept: what a re-add
    /// must reconstruct that nothing else records once it rewrites its
    /// member (the stripes the member's own parity journal held), so that
    /// a re-add that fails part way and is tried again still does.
    pub fn mark_missed_stripes(&self, stripes: Option<&BTreeSet<u64>>) -> std::io::Result<()> {
        let inner = self.inner.lock().unwrap();
        let mut missed = self.missed.lock().unwrap();
        let Some(m) = missed.as_mut() else {
            return Ok(());
        };
        let regions: BTreeSet<usize> = match stripes {
            Some(stripes) => stripes
                .iter()
                .map(|&s| (s / self.stripes_per_region) as usize)
                .filter(|&r| r < inner.regions.len())
                .collect(),
            None => (0..inner.regions.len()).collect(),
        };
        let new: Vec<usize> = regions.into_iter().filter(|&r| !m.regions[r]).collect();
        for &r in &new {
            m.file.write_at(&[1], HEADER_BYTES + r as u64)?;
        }
        if !new.is_empty() {
            m.file.sync()?;
        }
        for r in new {
            m.regions[r] = true;
        }
        Ok(())
    }

    /// Starts keeping the missed map at `path` (a member left service):
    /// the regions dirty now (writes in flight as the member left, or at a
    /// crash before this open) are added to an existing intact map, or
    /// start a new one covering writes since `since_generation` (the
    /// generation on the superblocks as the member left; an existing map
    /// keeps its own); every region is when `history_known` is false
    /// (the member was out before anything was tracked; then the
    /// generation is unknown: 0).
    pub fn track_missed_in(
        &self,
        storage: &dyn Storage,
        path: &Path,
        history_known: bool,
        since_generation: u64,
    ) -> Result<()> {
        let array_uuid = &self.array_uuid;
        let inner = self.inner.lock().unwrap();
        let mut missed = self.missed.lock().unwrap();
        if missed.is_some() {
            return Ok(());
        }
        let io = |e| Error::io(format!("missed-write map {}", path.display()), e);
        let stripes = inner.regions.len() as u64 * self.stripes_per_region;
        let kept = read_all(storage, path)
            .ok()
            .and_then(|bytes| {
                let (spr, map) = parse_map(&bytes, array_uuid, stripes).ok()?;
                Some((spr, map, since_generation_of(&bytes), re_adding_of(&bytes)))
            })
            .filter(|(spr, _, _, _)| *spr == self.stripes_per_region);
        // Regions a write may be in as the member leaves (or was in at a
        // crash before this open) are missed too.
        let now: Vec<bool> = inner
            .regions
            .iter()
            .map(|r| !history_known || r.dirty || r.in_flight > 0)
            .collect();
        let regions: Vec<bool> = match &kept {
            Some((_, map, _, _)) => map.iter().zip(&now).map(|(&b, &n)| b != 0 || n).collect(),
            None => now,
        };
        let since_generation = match &kept {
            Some((_, _, since, _)) => *since,
            None if history_known => since_generation,
            None => 0,
        };
        let re_adding = kept.as_ref().map_or(0, |(_, _, _, r)| *r);
        let unchanged = kept
            .as_ref()
            .is_some_and(|(_, map, _, _)| map.iter().zip(&regions).all(|(&b, &r)| (b != 0) == r));
        if !unchanged {
            let mut bytes = missed_header(
                array_uuid,
                self.stripes_per_region,
                regions.len() as u64,
                since_generation,
                re_adding,
            );
            bytes.extend(regions.iter().map(|&d| d as u8));
            crate::media::storage::write_atomic(storage, path, &bytes).map_err(io)?;
        }
        let file = storage.open(path).map_err(io)?;
        *missed = Some(Missed {
            file,
            regions,
            since_generation,
            re_adding,
        });
        Ok(())
    }

    /// Records (durably) whether position `d` is rebuilding by a re-add,
    /// in the missed map's header, if one is kept (positions past 63 are
    /// never recorded: their re-adds cut short resume as full rebuilds).
    pub fn set_re_adding(&self, d: usize, on: bool) -> std::io::Result<()> {
        if d >= 64 {
            return Ok(());
        }
        let bit = 1u64 << d;
        let inner = self.inner.lock().unwrap();
        let mut missed = self.missed.lock().unwrap();
        let Some(m) = missed.as_mut() else {
            return Ok(());
        };
        let mask = if on {
            m.re_adding | bit
        } else {
            m.re_adding & !bit
        };
        if mask != m.re_adding {
            let h = missed_header(
                &self.array_uuid,
                self.stripes_per_region,
                inner.regions.len() as u64,
                m.since_generation,
                mask,
            );
            m.file.write_at(&h, 0)?;
            m.file.sync()?;
            m.re_adding = mask;
        }
        Ok(())
    }

    /// Whether position `d` is recorded rebuilding by a re-add, in a kept
    /// missed map with a known start (what it missed is then known).
    pub fn re_adding(&self, d: usize) -> bool {
        d < 64
            && self
                .missed
                .lock()
                .unwrap()
                .as_ref()
                .is_some_and(|m| m.since_generation != 0 && m.re_adding & (1 << d) != 0)
    }

    /// The region that holds `stripe`.
    pub fn region_of(&self, stripe: u64) -> usize {
        (stripe / self.stripes_per_region) as usize
    }

    /// Whether region `region` counts as missed now: marked in the missed
    /// map, past its end, or no map with a known start is kept (then
    /// nothing is known about what a member missed, so everything is).
    pub fn region_missed(&self, region: usize) -> bool {
        match self.missed.lock().unwrap().as_ref() {
            Some(m) if m.since_generation != 0 => m.regions.get(region).copied().unwrap_or(true),
            _ => true,
        }
    }

    /// The regions of the missed map, if one is kept.
    pub fn missed_regions(&self) -> Option<Vec<bool>> {
        self.missed
            .lock()
            .unwrap()
            .as_ref()
            .map(|m| m.regions.clone())
    }

    /// The superblock generation the missed map covers writes since, if
    /// one is kept and it is known (maps written before it was recorded,
    /// and maps started with no history, cover an unknown span).
    pub fn missed_since_generation(&self) -> Option<u64> {
        self.missed
            .lock()
            .unwrap()
            .as_ref()
            .map(|m| m.since_generation)
            .filter(|&g| g != 0)
    }

    /// Stops keeping the missed map (no member is out of service any
    /// more) and removes it.
    pub fn stop_tracking_missed_in(&self, storage: &dyn Storage, path: &Path) -> Result<()> {
        let _inner = self.inner.lock().unwrap();
        let mut missed = self.missed.lock().unwrap();
        missed.take();
        if storage.exists(path) {
            storage
                .remove(path)
                .and_then(|_| storage.sync_dir(crate::media::storage::parent_of(path)))
                .map_err(|e| Error::io(format!("removing {}", path.display()), e))?;
        }
        Ok(())
    }

    /// A write leaves the region. It may have changed checksums after a
    /// concurrent flush wrote its table pages, so the region counts as
    /// written in the current epoch: that flush must not clear it.
    pub fn end(&self, stripe: u64) {
        let r = (stripe / self.stripes_per_region) as usize;
        let mut inner = self.inner.lock().unwrap();
        let epoch = inner.epoch;
        let region = &mut inner.regions[r];
        assert!(region.in_flight > 0);
        region.in_flight -= 1;
        region.last_epoch = epoch;
        region.last_touch = Some(Instant::now());
    }

    /// Starts a flush; returns its epoch for `finish_flush`.
    pub fn start_flush(&self) -> u64 {
        let mut inner = self.inner.lock().unwrap();
        inner.epoch += 1;
        inner.epoch
    }

    /// After every device is durable: clears regions untouched since `epoch`
    /// began. Clearing is not synced: a lost clear costs only a resync.
    pub fn finish_flush(&self, epoch: u64) -> std::io::Result<()> {
        let quiet_before_clear = Duration::from_millis(self.quiet_before_clear_ms.load(Relaxed));
        let mut inner = self.inner.lock().unwrap();
        for (r, region) in inner.regions.iter_mut().enumerate() {
            let quiet = region
                .last_touch
                .is_none_or(|t| t.elapsed() >= quiet_before_clear);
            if region.dirty
                && !region.pinned
                && region.in_flight == 0
                && region.last_epoch < epoch
                && quiet
            {
                self.file.write_at(&[0], HEADER_BYTES + r as u64)?;
                region.dirty = false;
            }
        }
        Ok(())
    }

    /// Marks everything clean after a full resync, durably; pinned regions
    /// stay dirty.
    pub fn clear_all(&self) -> std::io::Result<()> {
        let mut inner = self.inner.lock().unwrap();
        let map: Vec<u8> = inner.regions.iter().map(|r| r.pinned as u8).collect();
        self.file.write_at(&map, HEADER_BYTES)?;
        self.file.sync()?;
        for region in inner.regions.iter_mut() {
            region.dirty = region.pinned;
        }
        Ok(())
    }

    /// Keeps the region of `stripe` dirty, durably, until the next open.
    pub fn pin(&self, stripe: u64) -> std::io::Result<()> {
        let r = (stripe / self.stripes_per_region) as usize;
        let mut inner = self.inner.lock().unwrap();
        let region = &mut inner.regions[r];
        if !region.dirty || !region.pinned {
            self.file.write_durable(&[1], HEADER_BYTES + r as u64)?;
        }
        region.dirty = true;
        region.pinned = true;
        Ok(())
    }

    /// Sets how long a region must be quiet before a flush clears it.
    pub fn set_quiet_before_clear(&self, quiet: Duration) {
        self.quiet_before_clear_ms
            .store(quiet.as_millis() as u64, Relaxed);
    }

    pub fn dirty_regions(&self) -> usize {
        self.inner
            .lock()
            .unwrap()
            .regions
            .iter()
            .filter(|r| r.dirty)
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_region_written_and_not_flushed_is_dirty_after_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("intent");
        IntentLog::create(&path, &[1; 16], 100, 10).unwrap();
        let (log, rec, warn) = IntentLog::open(&path, &[1; 16], 100, 10).unwrap();
        log.set_quiet_before_clear(Duration::ZERO);
        assert!(rec.dirty_stripe_ranges.is_empty() && warn.is_none());
        assert!(log.begin(35).unwrap());
        assert!(!log.begin(36).unwrap());
        log.end(35);
        log.end(36);
        drop(log);
        let (log, rec, _) = IntentLog::open(&path, &[1; 16], 100, 10).unwrap();
        log.set_quiet_before_clear(Duration::ZERO);
        assert_eq!(rec.dirty_stripe_ranges, vec![(30, 40)]);
        let e = log.start_flush();
        log.finish_flush(e).unwrap();
        drop(log);
        let (_, rec, _) = IntentLog::open(&path, &[1; 16], 100, 10).unwrap();
        assert!(rec.dirty_stripe_ranges.is_empty());
    }

    #[test]
    fn a_write_in_flight_keeps_its_region_dirty_through_a_flush() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("intent");
        IntentLog::create(&path, &[1; 16], 100, 10).unwrap();
        let (log, _, _) = IntentLog::open(&path, &[1; 16], 100, 10).unwrap();
        log.set_quiet_before_clear(Duration::ZERO);
        log.begin(5).unwrap();
        let e = log.start_flush();
        log.finish_flush(e).unwrap();
        assert_eq!(log.dirty_regions(), 1);
        log.end(5);
        let e = log.start_flush();
        log.finish_flush(e).unwrap();
        assert_eq!(log.dirty_regions(), 0);
    }

    #[test]
    fn a_write_that_ends_during_a_flush_keeps_its_region_dirty() {
        // The flush wrote checksum pages before the write set its own; the
        // region must stay dirty until the next flush.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("intent");
        IntentLog::create(&path, &[1; 16], 100, 10).unwrap();
        let (log, _, _) = IntentLog::open(&path, &[1; 16], 100, 10).unwrap();
        log.set_quiet_before_clear(Duration::ZERO);
        log.begin(5).unwrap();
        let e = log.start_flush();
        log.end(5);
        log.finish_flush(e).unwrap();
        assert_eq!(log.dirty_regions(), 1);
        let e = log.start_flush();
        log.finish_flush(e).unwrap();
        assert_eq!(log.dirty_regions(), 0);
    }

    #[test]
    fn a_pinned_region_stays_dirty_through_flushes_and_a_clean_close() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("intent");
        IntentLog::create(&path, &[1; 16], 100, 10).unwrap();
        let (log, _, _) = IntentLog::open(&path, &[1; 16], 100, 10).unwrap();
        log.set_quiet_before_clear(Duration::ZERO);
        log.pin(42).unwrap();
        let e = log.start_flush();
        log.finish_flush(e).unwrap();
        log.clear_all().unwrap();
        assert_eq!(log.dirty_regions(), 1);
        drop(log);
        let (_, rec, _) = IntentLog::open(&path, &[1; 16], 100, 10).unwrap();
        assert_eq!(rec.dirty_stripe_ranges, vec![(40, 50)]);
    }

    #[test]
    fn a_corrupt_map_means_resync_everything() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("intent");
        std::fs::write(&path, b"garbage").unwrap();
        let (_, rec, warn) = IntentLog::open(&path, &[1; 16], 95, 10).unwrap();
        assert!(warn.unwrap().contains("resynchronising every stripe"));
        assert_eq!(rec.dirty_stripe_ranges.len(), 10);
        assert_eq!(rec.dirty_stripe_ranges[9], (90, 95));
    }
}

#[cfg(test)]
mod quiet_tests {
    use super::*;

    #[test]
    fn a_region_written_recently_stays_dirty_through_a_flush() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("intent");
        IntentLog::create(&path, &[1; 16], 100, 10).unwrap();
        let (log, _, _) = IntentLog::open(&path, &[1; 16], 100, 10).unwrap();
        log.begin(5).unwrap();
        log.end(5);
        let e = log.start_flush();
        log.finish_flush(e).unwrap();
        assert_eq!(
            log.dirty_regions(),
            1,
            "quiet for less than QUIET_BEFORE_CLEAR"
        );
        assert!(!log.begin(6).unwrap(), "so the next write pays no mark");
        log.end(6);
    }
}
