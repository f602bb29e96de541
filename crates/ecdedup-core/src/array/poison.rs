//! The poison list: data blocks an unclean stop made unknowable (Linux
//! md's bad-block list, for the double fault of docs/write-hole.md).
//!
//! After a power cut with writes in flight, a data member lost before the
//! resync can leave a block row whose missing unit nothing can tell: the
//! members left are not one codeword, or exactly k of them are left and a
//! write in flight may have torn them. The missing unit's blocks of that
//! row are lost. Before this list, the row's present parity was marked
//! unreadable, so the missing blocks read as I/O errors; but the row then
//! kept no redundancy for its other data, and one more member lost cost
//! its flushed blocks too (the cluster simulator's known seeds).
//!
//! Now the unknowable blocks are recorded here, durably, and the row's
//! parity is recomputed from the present data and a placeholder (zeroes)
//! for each of them: one codeword again, so a later loss decodes right.
//! A read of a poisoned block is an I/O error (never the placeholder); a
//! write that covers the whole block ends its poison (in memory at once,
//! on disk at the next flush, after the write is durable); a write that
//! covers part of it is refused (the rest of the block is unknown).
//! Everything else (resync, replay, rebuild, re-add, scrub) takes the
//! placeholder for the unit's value, as the codeword holds it.
//!
//! One thing the list keeps beside each entry: whether the unit's member
//! held the block at the stop and has been out since (it failed during the
//! open that poisoned it, before resync). Its own block is then the
//! block's last value, or the one before a write in flight, wherever the
//! member's own checksum table vouches for it; a re-add of that member
//! takes it back through the write path (`Array::re_add_device`) instead
//! of leaving the block poisoned. The mark is dropped, durably, wherever
//! the member's unit may hold something else: at that re-add (before any
//! of its units is reconstructed), at a replacement of the position, and
//! at an open that finds the member in service (a forced assembly).
//!
//! File layout (little endian), replaced whole (temporary copy, sync,
//! rename, folder sync), mirrored in every device's metadata area like the
//! intent map:
//! ```text
//! 0   [u8; 8] magic "ECDDPL01"
//! 8   u32 version (1: no entry marked; 2: bit 31 of a role is the mark)
//! 12  u32 entries (at most ENTRIES_MAX)
//! 16  entries: u64 stripe, u32 data role, u32 block row in the unit
//! ..  u32 CRC32C of every byte before it
//! ```
//! A list with no marked entry is written as version 1, byte for byte as
//! before the mark existed.
//! A file that fails its checksum or is malformed refuses the open: the
//! blocks it names would otherwise read as the placeholder's zeroes.
//! No file: nothing is poisoned.

use crate::error::{Error, Result};
use crate::media::storage::{read_all, write_atomic, Storage};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

/// The list, in the array folder (mirrored in the metadata areas).
pub const POISON_FILE: &str = "poison.map";
const MAGIC: [u8; 8] = *b"ECDDPL01";
const VERSION: u32 = 1;
/// The version whose roles carry [`OWN_HELD`].
const VERSION_MARKED: u32 = 2;
/// In a version 2 file, the bit of a role that marks the entry's member
/// as holding the block since the stop (see the module's notes).
const OWN_HELD: u32 = 1 << 31;
const HEADER_BYTES: usize = 16;
const ENTRY_BYTES: usize = 16;
/// Most entries: the file stays within one 64 KiB unit of a metadata area.
/// A double fault that would pass it is marked the older way (the row's
/// parity unreadable).
pub const ENTRIES_MAX: usize = (65536 - HEADER_BYTES - 4) / ENTRY_BYTES;
/// The file's largest size.
pub const FILE_BYTES_MAX: u64 = 65536;

/// One poisoned block: (stripe, data role, block row in the unit).
pub type Entry = (u64, u32, u32);

struct Inner {
    /// Blocks poisoned now.
    set: BTreeSet<Entry>,
    /// Entries of `on_disk` whose member holds the block as it was at the
    /// stop (the mark, as the file holds it).
    own_held: BTreeSet<Entry>,
    /// What the file holds: `set`, and the entries writes ended since the
    /// last flush (dropped from the file only once a flush that began
    /// after those writes made them durable).
    on_disk: BTreeSet<Entry>,
}

pub struct PoisonList {
    storage: Arc<dyn Storage>,
    path: PathBuf,
    inner: Mutex<Inner>,
    /// Entries in memory, for the read path's check without the lock.
    count: AtomicUsize,
}

/// The file's bytes: `set`, with the entries of `own_held` marked (roles
/// below [`OWN_HELD`]).
fn encode(set: &BTreeSet<Entry>, own_held: &BTreeSet<Entry>) -> Vec<u8> {
    let marked = set.iter().any(|e| own_held.contains(e));
    let mut b = Vec::with_capacity(HEADER_BYTES + set.len() * ENTRY_BYTES + 4);
    b.extend_from_slice(&MAGIC);
    let version = if marked { VERSION_MARKED } else { VERSION };
    b.extend_from_slice(&version.to_le_bytes());
    b.extend_from_slice(&(set.len() as u32).to_le_bytes());
    for e @ &(stripe, role, row) in set {
        let mark = if own_held.contains(e) { OWN_HELD } else { 0 };
        b.extend_from_slice(&stripe.to_le_bytes());
        b.extend_from_slice(&(role | mark).to_le_bytes());
        b.extend_from_slice(&row.to_le_bytes());
    }
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

/// A parsed list: its entries, and those marked as held by their member
/// since the stop.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Parsed {
    pub set: BTreeSet<Entry>,
    pub own_held: BTreeSet<Entry>,
}

/// Parses a list file; `what` names it in errors.
pub fn parse(bytes: &[u8], what: &str) -> Result<Parsed> {
    let corrupt = |why: &str| Err(Error::Corrupt(format!("poison list {what}: {why}")));
    if bytes.len() < HEADER_BYTES + 4 {
        return corrupt("shorter than its header");
    }
    if bytes[..8] != MAGIC {
        return corrupt("bad magic");
    }
    let (body, tail) = bytes.split_at(bytes.len() - 4);
    if crc32c::crc32c(body) != u32::from_le_bytes(tail.try_into().unwrap()) {
        return corrupt("checksum mismatch");
    }
    let u32_at = |at: usize| u32::from_le_bytes(body[at..at + 4].try_into().unwrap());
    let version = u32_at(8);
    if version != VERSION && version != VERSION_MARKED {
        return corrupt(&format!("unknown version {version}"));
    }
    let n = u32_at(12) as usize;
    if n > ENTRIES_MAX || body.len() != HEADER_BYTES + n * ENTRY_BYTES {
        return corrupt("entry count does not match its length");
    }
    let mut set = BTreeSet::new();
    let mut own_held = BTreeSet::new();
    for e in body[HEADER_BYTES..].chunks_exact(ENTRY_BYTES) {
        let stripe = u64::from_le_bytes(e[..8].try_into().unwrap());
        let mut role = u32::from_le_bytes(e[8..12].try_into().unwrap());
        let row = u32::from_le_bytes(e[12..16].try_into().unwrap());
        if version == VERSION_MARKED && role & OWN_HELD != 0 {
            role &= !OWN_HELD;
            own_held.insert((stripe, role, row));
        }
        set.insert((stripe, role, row));
    }
    if set.len() != n {
        return corrupt("an entry is listed twice");
    }
    Ok(Parsed { set, own_held })
}

impl PoisonList {
    /// Opens the list at `path` (none there: empty). Entries outside the
    /// geometry (`stripes`, `k`, `rows` per unit) refuse the open too.
    pub fn open(
        storage: Arc<dyn Storage>,
        path: &Path,
        stripes: u64,
        k: usize,
        rows: u64,
    ) -> Result<PoisonList> {
        let parsed = if storage.exists(path) {
            let bytes = read_all(storage.as_ref(), path)
                .map_err(|e| Error::io(format!("reading the poison list {}", path.display()), e))?;
            let parsed = parse(&bytes, &path.display().to_string())?;
            if let Some(e) = parsed
                .set
                .iter()
                .find(|&&(s, role, row)| s >= stripes || role as usize >= k || row as u64 >= rows)
            {
                return Err(Error::Corrupt(format!(
                    "poison list {}: entry {e:?} is outside the array",
                    path.display()
                )));
            }
            parsed
        } else {
            Parsed::default()
        };
        let Parsed { set, own_held } = parsed;
        Ok(PoisonList {
            storage,
            path: path.to_owned(),
            count: AtomicUsize::new(set.len()),
            inner: Mutex::new(Inner {
                on_disk: set.clone(),
                own_held,
                set,
            }),
        })
    }

    /// How many blocks are poisoned.
    pub fn len(&self) -> usize {
        self.count.load(SeqCst)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether block row `row` of data role `role` of `stripe` is poisoned.
    pub fn contains(&self, stripe: u64, role: usize, row: u64) -> bool {
        !self.is_empty()
            && self
                .inner
                .lock()
                .unwrap()
                .set
                .contains(&(stripe, role as u32, row as u32))
    }

    /// The first poisoned row of `rows` of role `role` of `stripe`.
    pub fn first_in(&self, stripe: u64, role: usize, rows: std::ops::Range<u64>) -> Option<u64> {
        if self.is_empty() {
            return None;
        }
        let inner = self.inner.lock().unwrap();
        let lo = (stripe, role as u32, rows.start.min(u32::MAX as u64) as u32);
        let hi = (stripe, role as u32, rows.end.min(u32::MAX as u64) as u32);
        inner.set.range(lo..hi).next().map(|e| e.2 as u64)
    }

    /// Adds `entries`, durably (the file rewritten and synced) before it
    /// returns: the caller writes the placeholder's parity only after.
    /// Each is marked where its flag says its member holds the block as it
    /// was at the stop (the module's notes); an entry listed already keeps
    /// its mark (its member's unit may hold the placeholder since). Past
    /// [`ENTRIES_MAX`], refused (nothing changes).
    pub fn add(&self, entries: &[(Entry, bool)]) -> Result<()> {
        let mut inner = self.inner.lock().unwrap();
        let mut disk = inner.on_disk.clone();
        let mut own_held = inner.own_held.clone();
        for &(e, held) in entries {
            disk.insert(e);
            // Poisoned still: its member's unit may hold the placeholder
            // since (a re-add drops the mark first), so the mark stays as
            // it is. New, or poisoned again after a write ended it: the
            // mark is this poisoning's.
            if !inner.set.contains(&e) {
                if held {
                    own_held.insert(e);
                } else {
                    own_held.remove(&e);
                }
            }
        }
        if disk.len() > ENTRIES_MAX {
            return Err(Error::NoSpace(format!(
                "the poison list holds {} blocks, its bound is {ENTRIES_MAX}",
                inner.on_disk.len()
            )));
        }
        if disk.len() != inner.on_disk.len() || own_held != inner.own_held {
            write_atomic(self.storage.as_ref(), &self.path, &encode(&disk, &own_held)).map_err(
                |e| {
                    Error::io(
                        format!("writing the poison list {}", self.path.display()),
                        e,
                    )
                },
            )?;
            inner.on_disk = disk;
            inner.own_held = own_held;
        }
        inner.set.extend(entries.iter().map(|&(e, _)| e));
        self.count.store(inner.set.len(), SeqCst);
        Ok(())
    }

    /// The entries poisoned now whose mark says their member holds the
    /// block as it was at the stop.
    pub fn own_held(&self) -> Vec<Entry> {
        let inner = self.inner.lock().unwrap();
        inner
            .own_held
            .iter()
            .filter(|e| inner.set.contains(e))
            .copied()
            .collect()
    }

    /// Drops the marks of the entries `which` selects, durably, before it
    /// returns (their member's unit is about to hold something else: a
    /// re-add's or a rebuild's reconstruction).
    pub fn drop_own_held(&self, which: impl Fn(&Entry) -> bool) -> Result<()> {
        let mut inner = self.inner.lock().unwrap();
        let own_held: BTreeSet<Entry> = inner
            .own_held
            .iter()
            .filter(|e| !which(e))
            .copied()
            .collect();
        if own_held.len() == inner.own_held.len() {
            return Ok(());
        }
        write_atomic(
            self.storage.as_ref(),
            &self.path,
            &encode(&inner.on_disk, &own_held),
        )
        .map_err(|e| {
            Error::io(
                format!("rewriting the poison list {}", self.path.display()),
                e,
            )
        })?;
        inner.own_held = own_held;
        Ok(())
    }

    /// Blocks `rows` of data role `role` of `stripe` were written whole
    /// (the write returned): their poison ends now in memory, and in the
    /// file at the first flush that begins after this call
    /// ([`PoisonList::ended`], [`PoisonList::persist`]). A cut before it
    /// finds them poisoned again, as a write not yet flushed may be.
    pub fn written(&self, stripe: u64, role: usize, rows: std::ops::Range<u64>) {
        if self.is_empty() {
            return;
        }
        let mut inner = self.inner.lock().unwrap();
        let lo = (stripe, role as u32, rows.start.min(u32::MAX as u64) as u32);
        let hi = (stripe, role as u32, rows.end.min(u32::MAX as u64) as u32);
        let gone: Vec<Entry> = inner.set.range(lo..hi).copied().collect();
        for e in gone {
            inner.set.remove(&e);
        }
        self.count.store(inner.set.len(), SeqCst);
    }

    /// At the start of a flush: the entries whose writes have returned,
    /// which the flush's syncs make durable.
    pub fn ended(&self) -> BTreeSet<Entry> {
        let inner = self.inner.lock().unwrap();
        inner.on_disk.difference(&inner.set).copied().collect()
    }

    /// After that flush's syncs: drops `ended` from the file (those
    /// poisoned again since stay).
    pub fn persist(&self, ended: &BTreeSet<Entry>) -> Result<()> {
        let mut inner = self.inner.lock().unwrap();
        let disk: BTreeSet<Entry> = inner
            .on_disk
            .iter()
            .filter(|e| !ended.contains(e) || inner.set.contains(e))
            .copied()
            .collect();
        if disk.len() == inner.on_disk.len() {
            return Ok(());
        }
        let r = if disk.is_empty() {
            match self.storage.exists(&self.path) {
                true => self.storage.remove(&self.path).and_then(|()| {
                    self.storage
                        .sync_dir(crate::media::storage::parent_of(&self.path))
                }),
                false => Ok(()),
            }
        } else {
            write_atomic(
                self.storage.as_ref(),
                &self.path,
                &encode(&disk, &inner.own_held),
            )
        };
        r.map_err(|e| {
            Error::io(
                format!("rewriting the poison list {}", self.path.display()),
                e,
            )
        })?;
        inner.own_held.retain(|e| disk.contains(e));
        inner.on_disk = disk;
        Ok(())
    }

    /// Every entry, in order.
    pub fn entries(&self) -> Vec<Entry> {
        self.inner.lock().unwrap().set.iter().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::PowerLossStorage;
    use proptest::prelude::*;

    fn list(storage: &Arc<dyn Storage>) -> Result<PoisonList> {
        PoisonList::open(Arc::clone(storage), Path::new("/a/poison.map"), 100, 4, 16)
    }

    #[test]
    fn entries_added_survive_a_reopen_and_writes_end_them_at_persist() {
        let sim = PowerLossStorage::new();
        let storage = sim.shared();
        storage.create_dir_all(Path::new("/a")).unwrap();
        let l = list(&storage).unwrap();
        assert!(l.is_empty());
        l.add(&[((3, 1, 2), false), ((3, 1, 5), false), ((7, 0, 0), false)])
            .unwrap();
        assert!(l.contains(3, 1, 2) && !l.contains(3, 1, 3));
        assert_eq!(l.first_in(3, 1, 0..16), Some(2));
        assert_eq!(l.first_in(3, 1, 3..5), None);
        assert_eq!(list(&storage).unwrap().entries().len(), 3);
        let before = l.ended();
        l.written(3, 1, 0..3);
        assert!(!l.contains(3, 1, 2));
        // A flush that began before the write keeps it in the file.
        l.persist(&before).unwrap();
        assert!(list(&storage).unwrap().contains(3, 1, 2));
        // A new entry is written without the ended one's drop.
        l.add(&[((9, 0, 1), false)]).unwrap();
        assert!(list(&storage).unwrap().contains(3, 1, 2));
        let ended = l.ended();
        l.persist(&ended).unwrap();
        assert_eq!(
            list(&storage).unwrap().entries(),
            vec![(3, 1, 5), (7, 0, 0), (9, 0, 1)]
        );
        // Written and poisoned again before the flush ends: it stays.
        l.written(9, 0, 0..2);
        let ended = l.ended();
        l.add(&[((9, 0, 1), false)]).unwrap();
        l.persist(&ended).unwrap();
        assert!(list(&storage).unwrap().contains(9, 0, 1));
        l.written(3, 1, 0..16);
        l.written(7, 0, 0..1);
        l.written(9, 0, 0..16);
        let ended = l.ended();
        l.persist(&ended).unwrap();
        assert!(!storage.exists(Path::new("/a/poison.map")));
        assert!(list(&storage).unwrap().is_empty());
    }

    #[test]
    fn a_corrupt_or_outside_list_refuses_the_open() {
        let sim = PowerLossStorage::new();
        let storage = sim.shared();
        storage.create_dir_all(Path::new("/a")).unwrap();
        let l = list(&storage).unwrap();
        l.add(&[((3, 1, 2), false)]).unwrap();
        let path = Path::new("/a/poison.map");
        let mut bytes = read_all(storage.as_ref(), path).unwrap();
        bytes[20] ^= 1;
        write_atomic(storage.as_ref(), path, &bytes).unwrap();
        assert!(matches!(list(&storage), Err(Error::Corrupt(_))));
        let set: BTreeSet<Entry> = [(100, 0, 0)].into();
        write_atomic(storage.as_ref(), path, &encode(&set, &BTreeSet::new())).unwrap();
        let err = list(&storage).err().unwrap().to_string();
        assert!(err.contains("outside the array"), "{err}");
    }

    #[test]
    fn the_bound_is_refused_whole() {
        let sim = PowerLossStorage::new();
        let storage = sim.shared();
        storage.create_dir_all(Path::new("/a")).unwrap();
        let l = PoisonList::open(
            Arc::clone(&storage),
            Path::new("/a/poison.map"),
            u64::MAX,
            4,
            16,
        )
        .unwrap();
        let many: Vec<(Entry, bool)> = (0..ENTRIES_MAX as u64)
            .map(|s| ((s, 0, 0), false))
            .collect();
        l.add(&many).unwrap();
        assert!(
            read_all(storage.as_ref(), Path::new("/a/poison.map"))
                .unwrap()
                .len() as u64
                <= FILE_BYTES_MAX
        );
        assert!(matches!(
            l.add(&[((u64::MAX - 1, 0, 0), false)]),
            Err(Error::NoSpace(_))
        ));
        assert_eq!(l.len(), ENTRIES_MAX);
    }

    #[test]
    fn marks_survive_a_reopen_and_are_dropped_durably() {
        let sim = PowerLossStorage::new();
        let storage = sim.shared();
        storage.create_dir_all(Path::new("/a")).unwrap();
        let path = Path::new("/a/poison.map");
        let l = list(&storage).unwrap();
        l.add(&[((3, 1, 2), false)]).unwrap();
        // No mark: version 1, as before marks existed.
        let bytes = read_all(storage.as_ref(), path).unwrap();
        assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), 1);
        l.add(&[((3, 2, 0), true), ((5, 0, 1), true)]).unwrap();
        let bytes = read_all(storage.as_ref(), path).unwrap();
        assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), 2);
        assert_eq!(
            list(&storage).unwrap().own_held(),
            vec![(3, 2, 0), (5, 0, 1)]
        );
        // Poisoned again while poisoned: the mark stays as it was.
        l.add(&[((3, 1, 2), true), ((5, 0, 1), false)]).unwrap();
        assert_eq!(
            list(&storage).unwrap().own_held(),
            vec![(3, 2, 0), (5, 0, 1)]
        );
        // A write ends an entry: it is no longer offered, and a poisoning
        // after it takes that poisoning's mark.
        l.written(5, 0, 1..2);
        assert_eq!(l.own_held(), vec![(3, 2, 0)]);
        l.add(&[((5, 0, 1), false)]).unwrap();
        assert_eq!(list(&storage).unwrap().own_held(), vec![(3, 2, 0)]);
        l.drop_own_held(|&(stripe, _, _)| stripe == 3).unwrap();
        let reopened = list(&storage).unwrap();
        assert!(reopened.own_held().is_empty());
        assert_eq!(reopened.len(), 3);
        let bytes = read_all(storage.as_ref(), path).unwrap();
        assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), 1);
    }

    proptest! {
        /// Any bytes: parsed or refused, never a panic; what encodes parses
        /// back to itself.
        #[test]
        fn parse_never_panics_and_round_trips(
            bytes in proptest::collection::vec(any::<u8>(), 0..200),
            set in proptest::collection::btree_set((any::<u64>(), 0..OWN_HELD, any::<u32>()), 0..40),
            marks in proptest::collection::vec(any::<bool>(), 40),
        ) {
            let _ = parse(&bytes, "fuzz");
            let own_held: BTreeSet<Entry> =
                set.iter().zip(&marks).filter(|(_, m)| **m).map(|(e, _)| *e).collect();
            let parsed = parse(&encode(&set, &own_held), "x").unwrap();
            prop_assert_eq!(parsed, Parsed { set, own_held });
        }
    }
}
