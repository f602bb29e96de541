//! The metadata area: a small file system inside a reserved byte range of
//! a device, so that a device carries its own metadata (its dedup map and
//! log, its parity journal, a copy of the write-intent map) and a set of
//! devices assembles anywhere without a side folder (as md's internal
//! bitmap, dm-thin's metadata device or BlueStore's DB on the data disk).
//!
//! It implements the same [`StorageFile`] contract as a real file system
//! (media/storage.rs, POSIX taken strictly), so the journal, map and log
//! code above it is unchanged, and it does its I/O through the device's
//! [`Device`], so the power-loss simulator and the fault-injecting devices
//! run the real code under it.
//!
//! Layout (little endian; drawn in docs/format.md), from the area's start:
//! ```text
//! 0        directory slot 0 (64 KiB)   even sequence numbers
//! 64 KiB   directory slot 1 (64 KiB)   odd sequence numbers
//! 128 KiB  length hints (64 KiB; 32 bytes per file of the directory)
//! 192 KiB  extents, in units of 64 KiB
//! ```
//! A length hint: u64 directory sequence, u64 length, u32 CRC32C of those
//! 16 bytes and the file's index; written (not synced) whenever a file
//! grows, so that a killed process loses nothing the kernel holds: at open
//! a hint of the committed sequence lengthens its file up to the file's
//! committed extents.
//! A directory slot: magic `ECDDMA01`, u32 version 1, u32 entry count, u64
//! sequence, u64 area bytes, then 512-byte entries from byte 64 (u16 name
//! bytes, name of up to 118 bytes, u64 length at 120, u32 extent count at
//! 128, then up to 47 extents of (u32 first unit, u32 units) from 136), and
//! a CRC32C of the slot's first 65,532 bytes in its last 4.
//!
//! Invariants:
//! - The directory that counts is the valid slot with the highest
//!   sequence; a commit writes sequence s+1 into the other slot and syncs
//!   the device, so a torn commit leaves the previous directory whole.
//! - A file's length in a committed directory never exceeds what was made
//!   durable by a [`StorageFile::sync`] of it (or zeroed and synced), so a
//!   power cut never shows bytes a file never had (stale bytes of a reused
//!   extent): a file's sync flushes the device first, then commits the
//!   length the file had before that flush began; a flush of the array
//!   syncs the devices itself, in one batch, and then commits for each
//!   parity journal the length of its [`SyncPoint`], taken before that
//!   batch was issued ([`StorageFile::sync_after_device_sync`]), never
//!   the length the file reached meanwhile.
//! - An extent is reused only when neither the committed directory nor the
//!   in-memory one (nor a removed file still open) refers to it, so a crash
//!   before a commit that freed it finds its old content intact.
//! - Bytes of a file's committed extents past its length are zeroes or
//!   bytes written to it since (new extents are discarded when allocated,
//!   before a commit names them, or written whole, zero-padded, by a
//!   replacement; a truncation zeroes the tail and syncs; open zeroes
//!   what a power cut left past each file's length),
//!   so a length hint that reached the media without the data it covers
//!   shows zeroes or torn new data, never an older file's records.
//! - Names change (create, rename, remove) in memory and become durable
//!   with the next commit ([`AreaFs::commit`], which `sync_dir` and file
//!   syncs call), as a real folder's entries do with its fsync.

use super::batch::{submit, DeviceIo, Op};
use super::storage::{PlacedRead, PlacedWrite, RingFile, StorageFile, SyncPoint};
use super::{Device, WriteHint};
use crate::counters::IoClass;
use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex};

pub const DIR_SLOT_BYTES: u64 = 64 << 10;
pub const UNIT_BYTES: u64 = 64 << 10;
/// Where the length hints start, after the two directory slots.
pub const HINTS_OFFSET: u64 = 2 * DIR_SLOT_BYTES;
pub const HINT_BYTES: usize = 32;
/// Where extents start, after the directory slots and the hints.
pub const EXTENTS_OFFSET: u64 = 3 * DIR_SLOT_BYTES;
pub const MAGIC: [u8; 8] = *b"ECDDMA01";
pub const VERSION: u32 = 1;
const HEADER_BYTES: usize = 64;
const ENTRY_BYTES: usize = 512;
pub const NAME_BYTES_MAX: usize = 118;
const EXTENTS_AT: usize = 136;
pub const EXTENTS_PER_FILE_MAX: usize = (ENTRY_BYTES - EXTENTS_AT) / 8;
/// Files one area holds.
pub const FILES_MAX: usize = 96;
const _: () = assert!(HEADER_BYTES + FILES_MAX * ENTRY_BYTES <= DIR_SLOT_BYTES as usize - 4);
/// The largest file [`AreaFs::replace_file`] copies to pad it into one
/// FUA write; a larger one goes as its bytes, its zero tail and a sync.
const REPLACE_COPY_BYTES_MAX: usize = 1 << 20;
/// The smallest area: the directory and a few extents.
pub const AREA_BYTES_MIN: u64 = EXTENTS_OFFSET + 16 * UNIT_BYTES;

/// A run of allocation units: (first unit, units).
type Extent = (u32, u32);

/// A decoded directory: (name, length, extents) per file.
type Entries = Vec<(String, u64, Vec<Extent>)>;

/// One file: its extents and lengths. Shared by the directory and the
/// handles open on it.
struct Node {
    /// Bytes the file holds now.
    len: u64,
    /// Bytes that a sync made durable: what a commit records.
    durable_len: u64,
    /// Bytes that a sync of this file made durable, or at open its length
    /// in the committed directory before any length hint lengthened it:
    /// bytes past it were written after the file's last sync
    /// ([`StorageFile::synced_len`]). Unlike `durable_len`, a commit for
    /// another file never raises it.
    synced_len: u64,
    extents: Vec<Extent>,
    /// Truncations so far: a [`SyncPoint`] of an earlier count speaks of
    /// bytes the file no longer holds.
    truncations: u64,
    /// Unlinked: its extents are freed once no handle holds it.
    removed: bool,
    /// Its index and sequence in the committed directory (None: not in
    /// it), and its committed capacity, for length hints.
    hint: Option<(u32, u64)>,
    committed_capacity: u64,
}

impl Node {
    fn capacity(&self) -> u64 {
        self.extents.iter().map(|e| e.1 as u64 * UNIT_BYTES).sum()
    }
}

struct Inner {
    names: BTreeMap<String, Arc<Mutex<Node>>>,
    /// Removed files that a handle may still hold.
    orphans: Vec<Arc<Mutex<Node>>>,
    /// Extents the committed directory refers to.
    committed: Vec<Extent>,
    /// Sequence of the committed directory.
    seq: u64,
    /// Names or extents changed since the last commit.
    dirty: bool,
    /// A failed commit or device sync: every later call fails (latched).
    error: Option<String>,
}

/// A directory encoded for its slot ([`AreaFs::encode_commit`]).
struct Slot {
    seq: u64,
    /// Where the slot lies on the device.
    at: u64,
    bytes: Vec<u8>,
    /// The extents it names.
    committed: Vec<Extent>,
}

/// A directory commit whose durable write the caller makes itself, beside
/// its other writes to the device (a flush's checksum pages:
/// `Array::sync_devices`), made ready by
/// [`StorageFile::prepare_sync_after_device_sync`]. The area is held until
/// [`PreparedCommit::finish`] (no other commit, no name changes), as a
/// commit holds it across its own write; dropped unfinished (the write
/// never made, or not wanted), the directory stays as it was and nothing
/// is latched, and the lengths the preparation raised are put back: left
/// raised, the next commit of any file of the area (another thread's)
/// recorded them, ahead of the writes the caller had still to make
/// durable before this commit (a flush's checksum pages).
pub struct PreparedCommit<'a> {
    fs: &'a AreaFs,
    inner: std::sync::MutexGuard<'a, Inner>,
    /// Taken by [`PreparedCommit::finish`].
    slot: Option<Slot>,
    /// What the preparation changed, put back where the commit is dropped
    /// unfinished: the file, its durable and synced lengths before, and
    /// whether the directory was dirty before.
    undo: Option<(Arc<Mutex<Node>>, u64, u64, bool)>,
}

impl Drop for PreparedCommit<'_> {
    fn drop(&mut self) {
        if let Some((node, durable_len, synced_len, dirty)) = self.undo.take() {
            let mut node = node.lock().unwrap();
            node.durable_len = durable_len;
            node.synced_len = synced_len;
            self.inner.dirty = dirty;
        }
    }
}

impl PreparedCommit<'_> {
    /// The device the write goes to.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.fs.dev
    }

    /// The write to make durably (FUA, or a sync after it), and only
    /// after every write the commit speaks of is durable: (device offset,
    /// bytes).
    pub fn write(&self) -> (u64, &[u8]) {
        let slot = self.slot.as_ref().expect("taken only by finish");
        (slot.at, &slot.bytes)
    }

    /// The write made (`written`: its outcome, durable): the directory is
    /// the committed one, or the area is latched as a failed commit
    /// latches it.
    pub fn finish(mut self, written: io::Result<()>) -> io::Result<()> {
        self.undo = None;
        let slot = self.slot.take().expect("finished once");
        self.fs.finish_commit(&mut self.inner, slot, written)
    }
}

/// A file system in `[offset, offset + bytes)` of a device.
pub struct AreaFs {
    dev: Arc<dyn Device>,
    offset: u64,
    bytes: u64,
    units: u32,
    inner: Mutex<Inner>,
}

fn corrupt(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// ENOSPC as the OS would give it, so that callers recognise a full
/// space (`Array::is_space_error`); `what` goes to the log.
fn no_space(what: String) -> io::Error {
    log_space_error(&what);
    io::Error::from_raw_os_error(libc::ENOSPC)
}

fn log_space_error(what: &str) {
    eprintln!("ecdedup: {what}");
}

impl AreaFs {
    /// Writes an empty directory over the area (sequence 1 in slot 1; slot
    /// 0 zeroed) and syncs the device.
    pub fn format(dev: Arc<dyn Device>, offset: u64, bytes: u64) -> io::Result<AreaFs> {
        let fs = AreaFs::new(dev, offset, bytes)?;
        fs.dev
            .write_at(&vec![0u8; DIR_SLOT_BYTES as usize], offset)?;
        {
            let mut inner = fs.inner.lock().unwrap();
            inner.seq = 0;
            inner.dirty = true;
            fs.commit_locked(&mut inner)?;
        }
        Ok(fs)
    }

    /// Reads the newest valid directory, and zeroes (durably) every file's
    /// extents past its length: bytes a power cut left there (appended,
    /// never synced, and then forgotten) must not be shown by a later
    /// length hint.
    pub fn open(dev: Arc<dyn Device>, offset: u64, bytes: u64) -> io::Result<AreaFs> {
        let fs = AreaFs::open_read_only(dev, offset, bytes)?;
        {
            let inner = fs.inner.lock().unwrap();
            let mut tails = Vec::new();
            for node in inner.names.values() {
                let n = node.lock().unwrap();
                let capacity = n.capacity();
                if n.len < capacity {
                    tails.extend(fs.runs(&n, n.len, capacity - n.len));
                }
            }
            // Every file's tail in one batch (one round trip to a chunk
            // across the network, where it took one per edge and middle),
            // then the sync.
            if !tails.is_empty() {
                fs.zero(&tails)?;
                fs.dev.sync()?;
            }
        }
        Ok(fs)
    }

    /// Reads the newest valid directory and changes nothing on the device
    /// (status of a stopped array, assemble): not for writing.
    pub fn open_read_only(dev: Arc<dyn Device>, offset: u64, bytes: u64) -> io::Result<AreaFs> {
        let fs = AreaFs::new(dev, offset, bytes)?;
        let mut best: Option<(u64, Entries)> = None;
        let mut why = Vec::new();
        for slot in 0..2u64 {
            let mut b = vec![0u8; DIR_SLOT_BYTES as usize];
            fs.dev.read_at(&mut b, offset + slot * DIR_SLOT_BYTES)?;
            match decode_dir(&b, bytes, fs.units) {
                Ok((seq, entries)) if seq % 2 == slot => {
                    if best.as_ref().is_none_or(|(s, _)| seq > *s) {
                        best = Some((seq, entries));
                    }
                }
                Ok((seq, _)) => why.push(format!("slot {slot} holds sequence {seq}")),
                Err(e) => why.push(format!("slot {slot}: {e}")),
            }
        }
        let Some((seq, entries)) = best else {
            return Err(corrupt(format!(
                "metadata area of {}: no valid directory ({})",
                fs.dev.describe(),
                why.join("; ")
            )));
        };
        {
            let mut inner = fs.inner.lock().unwrap();
            inner.seq = seq;
            for (name, len, extents) in entries {
                inner.committed.extend(extents.iter().copied());
                let capacity = extents.iter().map(|e| e.1 as u64 * UNIT_BYTES).sum();
                let node = Node {
                    len,
                    durable_len: len,
                    synced_len: len,
                    extents,
                    truncations: 0,
                    removed: false,
                    hint: None,
                    committed_capacity: capacity,
                };
                inner.names.insert(name, Arc::new(Mutex::new(node)));
            }
            // Lengths a killed process had reached (see the module comment).
            let mut hints = vec![0u8; inner.names.len() * HINT_BYTES];
            fs.dev.read_at(&mut hints, offset + HINTS_OFFSET)?;
            for (i, node) in inner.names.values().enumerate() {
                let mut n = node.lock().unwrap();
                n.hint = Some((i as u32, seq));
                if let Some(len) = decode_hint(&hints[i * HINT_BYTES..(i + 1) * HINT_BYTES], i, seq)
                {
                    if len > n.len {
                        n.len = len.min(n.committed_capacity);
                        n.durable_len = n.len;
                    }
                }
            }
        }
        Ok(fs)
    }

    fn new(dev: Arc<dyn Device>, offset: u64, bytes: u64) -> io::Result<AreaFs> {
        if bytes < AREA_BYTES_MIN || !bytes.is_multiple_of(UNIT_BYTES) {
            return Err(corrupt(format!(
                "metadata area of {bytes} bytes: at least {AREA_BYTES_MIN}, in 64 KiB units"
            )));
        }
        if offset.checked_add(bytes).is_none_or(|end| end > dev.size()) {
            return Err(corrupt(format!(
                "metadata area [{offset}, +{bytes}) runs past the end of {}",
                dev.describe()
            )));
        }
        let units = u32::try_from((bytes - EXTENTS_OFFSET) / UNIT_BYTES)
            .map_err(|_| corrupt("metadata area too large".into()))?;
        Ok(AreaFs {
            dev,
            offset,
            bytes,
            units,
            inner: Mutex::new(Inner {
                names: BTreeMap::new(),
                orphans: Vec::new(),
                committed: Vec::new(),
                seq: 0,
                dirty: false,
                error: None,
            }),
        })
    }

    /// Where the area starts on its device (tests: a cut staged on the
    /// directory slots and the length hints).
    #[cfg(test)]
    pub fn device_offset(&self) -> u64 {
        self.offset
    }

    /// Whether this area's device takes operations side by side with its
    /// peers' ([`Device::side_by_side`]).
    pub fn side_by_side(&self) -> bool {
        self.dev.side_by_side()
    }

    pub fn area_bytes(&self) -> u64 {
        self.bytes
    }

    pub fn describe(&self) -> String {
        format!("metadata area of {}", self.dev.describe())
    }

    fn check(inner: &Inner) -> io::Result<()> {
        match &inner.error {
            Some(e) => Err(io::Error::other(format!(
                "metadata area failed earlier: {e}"
            ))),
            None => Ok(()),
        }
    }

    fn check_name(name: &str) -> io::Result<()> {
        if name.is_empty() || name.len() > NAME_BYTES_MAX {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("metadata file name {name:?}: 1 to {NAME_BYTES_MAX} bytes"),
            ));
        }
        Ok(())
    }

    pub fn exists(&self, name: &str) -> bool {
        self.inner.lock().unwrap().names.contains_key(name)
    }

    /// Names in the area, sorted.
    pub fn list(&self) -> Vec<String> {
        self.inner.lock().unwrap().names.keys().cloned().collect()
    }

    pub fn open_file(self: &Arc<Self>, name: &str) -> io::Result<Arc<dyn StorageFile>> {
        let inner = self.inner.lock().unwrap();
        Self::check(&inner)?;
        let node = inner.names.get(name).cloned().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("{name} not in {}", self.describe()),
            )
        })?;
        Ok(Arc::new(AreaFile {
            fs: Arc::clone(self),
            name: name.to_owned(),
            node,
        }))
    }

    pub fn create_file(
        self: &Arc<Self>,
        name: &str,
        truncate: bool,
    ) -> io::Result<Arc<dyn StorageFile>> {
        Self::check_name(name)?;
        let mut inner = self.inner.lock().unwrap();
        Self::check(&inner)?;
        let node = match inner.names.get(name).cloned() {
            Some(node) => {
                if truncate {
                    let mut n = node.lock().unwrap();
                    self.truncate_node(&mut n, 0)
                        .map_err(|e| self.latch(&mut inner, e))?;
                    drop(n);
                    inner.dirty = true;
                }
                node
            }
            None => {
                if inner.names.len() >= FILES_MAX {
                    return Err(no_space(format!(
                        "{}: {FILES_MAX} files already",
                        self.describe()
                    )));
                }
                let node = Arc::new(Mutex::new(Node {
                    len: 0,
                    durable_len: 0,
                    synced_len: 0,
                    extents: Vec::new(),
                    truncations: 0,
                    removed: false,
                    hint: None,
                    committed_capacity: 0,
                }));
                inner.names.insert(name.to_owned(), Arc::clone(&node));
                inner.dirty = true;
                node
            }
        };
        Ok(Arc::new(AreaFile {
            fs: Arc::clone(self),
            name: name.to_owned(),
            node,
        }))
    }

    pub fn remove(&self, name: &str) -> io::Result<()> {
        let mut inner = self.inner.lock().unwrap();
        Self::check(&inner)?;
        let node = inner.names.remove(name).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("{name} not in {}", self.describe()),
            )
        })?;
        node.lock().unwrap().removed = true;
        inner.orphans.push(node);
        inner.dirty = true;
        Ok(())
    }

    pub fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        Self::check_name(to)?;
        let mut inner = self.inner.lock().unwrap();
        Self::check(&inner)?;
        let node = inner.names.remove(from).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("{from} not in {}", self.describe()),
            )
        })?;
        if let Some(old) = inner.names.insert(to.to_owned(), node) {
            old.lock().unwrap().removed = true;
            inner.orphans.push(old);
        }
        inner.dirty = true;
        Ok(())
    }

    /// Replaces file `name` (created if missing) by `bytes`, atomically
    /// and durably, as a temporary file synced, renamed over it and the
    /// directory committed would, in two durable writes: the bytes into
    /// free units (an extent neither directory nor an open handle refers
    /// to), zero-padded to the extent's end (the tail a later length hint
    /// may show reads as zeroes, so no discard), as one FUA write (a file
    /// past [`REPLACE_COPY_BYTES_MAX`] is not copied: its bytes, the zero
    /// tail and a sync); then
    /// the directory naming them, committed (one FUA write). A cut before
    /// the commit leaves the old file whole (its extents untouched); the
    /// old content's extents are freed as a removed file's are. It needs
    /// one free run of units as long as the bytes, as the temporary file's
    /// first write did (ENOSPC otherwise).
    pub fn replace_file(self: &Arc<Self>, name: &str, bytes: &[u8]) -> io::Result<()> {
        Self::check_name(name)?;
        let mut inner = self.inner.lock().unwrap();
        Self::check(&inner)?;
        if !inner.names.contains_key(name) && inner.names.len() >= FILES_MAX {
            return Err(no_space(format!(
                "{}: {FILES_MAX} files already",
                self.describe()
            )));
        }
        let units = u32::try_from((bytes.len() as u64).div_ceil(UNIT_BYTES).max(1)).ok();
        let Some((first, units)) = units.and_then(|u| self.allocate(&mut inner, u, None)) else {
            return Err(no_space(format!(
                "{}: no room for {} bytes in one run",
                self.describe(),
                bytes.len()
            )));
        };
        let at = self.offset + EXTENTS_OFFSET + first as u64 * UNIT_BYTES;
        let tail = (units as u64 * UNIT_BYTES - bytes.len() as u64) as usize;
        let written = if bytes.len() <= REPLACE_COPY_BYTES_MAX {
            // A small file (every file but a large dedup snapshot): its
            // bytes and the zero tail copied into one FUA write.
            let mut padded = vec![0u8; bytes.len() + tail];
            padded[..bytes.len()].copy_from_slice(bytes);
            self.dev.write_fua(&padded, at)
        } else {
            // A large one is not copied (each mirrored copy would hold its
            // own): its bytes, the zero tail, then a sync.
            self.dev
                .write_at(bytes, at)
                .and_then(|()| match tail {
                    0 => Ok(()),
                    n => self.dev.write_at(&vec![0u8; n], at + bytes.len() as u64),
                })
                .and_then(|()| self.dev.sync())
        };
        // A full file system under a sparse device: the host's fault,
        // reported as such (nothing names the extent); any other failure
        // of a durable write latches, as a failed sync does.
        if let Err(e) = written {
            return Err(match e.raw_os_error() {
                Some(libc::ENOSPC) | Some(libc::EDQUOT) => e,
                _ => self.latch(&mut inner, e),
            });
        }
        let len = bytes.len() as u64;
        let node = Arc::new(Mutex::new(Node {
            len,
            durable_len: len,
            synced_len: len,
            extents: vec![(first, units)],
            truncations: 0,
            removed: false,
            hint: None,
            committed_capacity: 0,
        }));
        // The old content, and a temporary copy a cut left behind (the
        // way of `write_atomic_by_rename`), go with the same commit.
        let old = inner.names.insert(name.to_owned(), node);
        let stale = inner.names.remove(&format!("{name}.tmp"));
        for node in old.into_iter().chain(stale) {
            node.lock().unwrap().removed = true;
            inner.orphans.push(node);
        }
        inner.dirty = true;
        self.commit_locked(&mut inner)
    }

    /// Makes the names and the synced lengths durable (a commit, only when
    /// something changed).
    pub fn commit(&self) -> io::Result<()> {
        let mut inner = self.inner.lock().unwrap();
        Self::check(&inner)?;
        if !inner.dirty {
            return Ok(());
        }
        self.dev.sync().map_err(|e| self.latch(&mut inner, e))?;
        self.commit_locked(&mut inner)
    }

    fn latch(&self, inner: &mut Inner, e: io::Error) -> io::Error {
        inner.error.get_or_insert_with(|| e.to_string());
        e
    }

    /// Writes the directory as it is in memory (with synced lengths) into
    /// the other slot and syncs. The caller synced file data first.
    fn commit_locked(&self, inner: &mut Inner) -> io::Result<()> {
        let slot = self.encode_commit(inner);
        // Durable before anything relies on it (the extents it frees may
        // be written next): one FUA write, one round trip to a chunk
        // across the network, where a write and a flush took two. What
        // the files hold was synced before the commit (their `sync`, a
        // truncation's own sync, a temporary copy's sync before its
        // rename).
        let written = self.dev.write_fua(&slot.bytes, slot.at);
        self.finish_commit(inner, slot, written)
    }

    /// The directory as it is in memory (with synced lengths), encoded for
    /// the slot of the next sequence.
    fn encode_commit(&self, inner: &Inner) -> Slot {
        let seq = inner.seq + 1;
        let mut b = vec![0u8; DIR_SLOT_BYTES as usize];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(inner.names.len() as u32).to_le_bytes());
        b[16..24].copy_from_slice(&seq.to_le_bytes());
        b[24..32].copy_from_slice(&self.bytes.to_le_bytes());
        let mut committed = Vec::new();
        for (i, (name, node)) in inner.names.iter().enumerate() {
            let n = node.lock().unwrap();
            let e = &mut b[HEADER_BYTES + i * ENTRY_BYTES..HEADER_BYTES + (i + 1) * ENTRY_BYTES];
            e[0..2].copy_from_slice(&(name.len() as u16).to_le_bytes());
            e[2..2 + name.len()].copy_from_slice(name.as_bytes());
            e[120..128].copy_from_slice(&n.durable_len.min(n.len).to_le_bytes());
            e[128..132].copy_from_slice(&(n.extents.len() as u32).to_le_bytes());
            for (j, &(first, units)) in n.extents.iter().enumerate() {
                let at = EXTENTS_AT + j * 8;
                e[at..at + 4].copy_from_slice(&first.to_le_bytes());
                e[at + 4..at + 8].copy_from_slice(&units.to_le_bytes());
            }
            committed.extend(n.extents.iter().copied());
        }
        let crc = crc32c::crc32c(&b[..DIR_SLOT_BYTES as usize - 4]);
        b[DIR_SLOT_BYTES as usize - 4..].copy_from_slice(&crc.to_le_bytes());
        debug_assert!(decode_dir(&b, self.bytes, self.units).is_ok());
        Slot {
            seq,
            at: self.offset + (seq % 2) * DIR_SLOT_BYTES,
            bytes: b,
            committed,
        }
    }

    /// After the slot's durable write (`written`, its outcome): the
    /// directory of `slot` is the committed one, or the area is latched.
    /// `inner` was held since [`AreaFs::encode_commit`].
    fn finish_commit(
        &self,
        inner: &mut Inner,
        slot: Slot,
        written: io::Result<()>,
    ) -> io::Result<()> {
        if let Err(e) = written {
            return Err(self.latch(inner, e));
        }
        let seq = slot.seq;
        for (i, node) in inner.names.values().enumerate() {
            let mut n = node.lock().unwrap();
            n.hint = Some((i as u32, seq));
            n.committed_capacity = n.capacity();
            // Hints of the previous sequence no longer count: a file with
            // appends past its committed length gets a new one.
            if n.len > n.durable_len {
                if let Err(e) = self.write_hint(&n) {
                    drop(n);
                    return Err(self.latch(inner, e));
                }
            }
        }
        for node in &inner.orphans {
            node.lock().unwrap().hint = None;
        }
        inner.seq = seq;
        inner.committed = slot.committed;
        inner.dirty = false;
        Ok(())
    }

    /// Cuts a file to `len`: the tail is zeroed and synced first (see the
    /// module comment), so a later length hint cannot show it.
    fn truncate_node(&self, n: &mut Node, len: u64) -> io::Result<()> {
        if len < n.len {
            self.zero(&self.runs(n, len, n.len - len))?;
            self.dev.sync()?;
            n.len = len;
            n.durable_len = n.durable_len.min(len);
            n.synced_len = n.synced_len.min(len);
            n.truncations += 1;
        }
        Ok(())
    }

    /// Zeroes each run `(at, bytes)` of the device: the 4 KiB-aligned
    /// middle by discard (block devices refuse unaligned ranges), the
    /// edges by writing zeroes; every piece in one batch.
    fn zero(&self, runs: &[(u64, usize)]) -> io::Result<()> {
        const ALIGN: u64 = 4096;
        static ZEROES: [u8; ALIGN as usize] = [0; ALIGN as usize];
        let mut ios = Vec::new();
        let edge = |at: u64, end: u64| Op::Write {
            buf: &ZEROES[..(end - at) as usize],
            offset: at,
            hint: WriteHint::new(IoClass::Metadata),
            fua: false,
        };
        for &(at, len) in runs {
            let end = at + len as u64;
            let body_start = at.next_multiple_of(ALIGN).min(end);
            let body_end = (end / ALIGN * ALIGN).max(body_start);
            if body_start > at {
                ios.push(edge(at, body_start));
            }
            if body_end > body_start {
                ios.push(Op::Discard {
                    offset: body_start,
                    len: body_end - body_start,
                });
            }
            if end > body_end {
                ios.push(edge(body_end, end));
            }
        }
        let mut ios: Vec<DeviceIo<'_>> = ios
            .into_iter()
            .map(|op| DeviceIo {
                dev: self.dev.as_ref(),
                op,
            })
            .collect();
        submit(&mut ios).0.into_iter().collect()
    }

    /// Records a grown length where a restarted process finds it.
    fn write_hint(&self, n: &Node) -> io::Result<()> {
        match self.hint_for(n, n.len) {
            Some((at, h)) => self.dev.write_at(&h, at),
            None => Ok(()),
        }
    }

    /// The length hint saying that file `n` is `len` bytes long, and where
    /// it goes on the device (None for a file not yet committed).
    fn hint_for(&self, n: &Node, len: u64) -> Option<(u64, [u8; HINT_BYTES])> {
        let (i, seq) = n.hint?;
        let mut h = [0u8; HINT_BYTES];
        h[0..8].copy_from_slice(&seq.to_le_bytes());
        h[8..16].copy_from_slice(&len.to_le_bytes());
        let crc = hint_crc(&h[..16], i as usize);
        h[16..20].copy_from_slice(&crc.to_le_bytes());
        Some((self.offset + HINTS_OFFSET + i as u64 * HINT_BYTES as u64, h))
    }

    /// Finds `units` free units: not in the committed directory, not in
    /// any file named now or still open after removal.
    fn allocate(&self, inner: &mut Inner, units: u32, after: Option<Extent>) -> Option<Extent> {
        // An orphan only this list holds has no handle left: its extents
        // are free (the committed directory may still name them: below).
        inner.orphans.retain(|o| Arc::strong_count(o) > 1);
        let mut used: Vec<Extent> = inner.committed.clone();
        for node in inner.names.values().chain(inner.orphans.iter()) {
            used.extend(node.lock().unwrap().extents.iter().copied());
        }
        used.sort_unstable();
        let is_free = |first: u32, n: u32| {
            let end = first as u64 + n as u64;
            end <= self.units as u64
                && used
                    .iter()
                    .all(|&(f, u)| end <= f as u64 || first as u64 >= f as u64 + u as u64)
        };
        // Growing in place keeps a file in one extent.
        if let Some((f, u)) = after {
            if is_free(f + u, units) {
                return Some((f + u, units));
            }
        }
        let mut candidate = 0u32;
        for &(f, u) in used.iter().chain(std::iter::once(&(self.units, 0))) {
            if f >= candidate && f - candidate >= units {
                return Some((candidate, units));
            }
            candidate = candidate.max(f + u);
        }
        None
    }

    /// Gives the file room for `want` bytes. Extents change only under
    /// `inner` (lock order: `inner`, then a node).
    fn grow(&self, node: &Arc<Mutex<Node>>, want: u64) -> io::Result<()> {
        if want <= node.lock().unwrap().capacity() {
            return Ok(());
        }
        let mut inner = self.inner.lock().unwrap();
        Self::check(&inner)?;
        let (have, last) = {
            let n = node.lock().unwrap();
            (n.capacity(), n.extents.last().copied())
        };
        if want <= have {
            return Ok(());
        }
        // Doubling: a file that grows by appends needs few extents.
        let need = (want - have).max(have).div_ceil(UNIT_BYTES);
        let exact = (want - have).div_ceil(UNIT_BYTES);
        let mut got = None;
        for units in [need, exact] {
            let Ok(units) = u32::try_from(units) else {
                continue;
            };
            if let Some(e) = self.allocate(&mut inner, units, last) {
                got = Some(e);
                break;
            }
        }
        let Some((first, units)) = got else {
            return Err(no_space(format!(
                "{}: no room for {} more bytes",
                self.describe(),
                want - have
            )));
        };
        // A reused unit's old bytes go before any commit names it.
        self.dev.discard(
            self.offset + EXTENTS_OFFSET + first as u64 * UNIT_BYTES,
            units as u64 * UNIT_BYTES,
        )?;
        let mut n = node.lock().unwrap();
        match n.extents.last_mut() {
            Some(l) if l.0 + l.1 == first => l.1 += units,
            _ => {
                if n.extents.len() >= EXTENTS_PER_FILE_MAX {
                    return Err(no_space(format!(
                        "{}: a file reached {EXTENTS_PER_FILE_MAX} extents",
                        self.describe()
                    )));
                }
                n.extents.push((first, units));
            }
        }
        drop(n);
        // Committed at once (the discard synced first), so that length
        // hints can cover the new extent: a killed process then loses
        // nothing it appended there. Extents are allocated by doubling,
        // so this is rare.
        inner.dirty = true;
        self.dev.sync().map_err(|e| self.latch(&mut inner, e))?;
        self.commit_locked(&mut inner)
    }

    /// Device runs of the first `len` bytes of file `name`: (device
    /// offset, bytes). For tests that fail the reads of one file.
    #[cfg(test)]
    pub(crate) fn file_runs(&self, name: &str, len: u64) -> Vec<(u64, usize)> {
        let inner = self.inner.lock().unwrap();
        let node = inner
            .names
            .get(name)
            .expect("the file exists")
            .lock()
            .unwrap();
        self.runs(&node, 0, len)
    }

    /// Device runs of `[pos, pos + len)` of a file: (device offset, bytes).
    fn runs(&self, node: &Node, mut pos: u64, len: u64) -> Vec<(u64, usize)> {
        let mut out = Vec::new();
        let end = pos + len;
        let mut base = 0u64;
        for &(first, units) in &node.extents {
            let ext_bytes = units as u64 * UNIT_BYTES;
            if pos < base + ext_bytes && pos < end {
                let within = pos - base;
                let n = (ext_bytes - within).min(end - pos);
                out.push((
                    self.offset + EXTENTS_OFFSET + first as u64 * UNIT_BYTES + within,
                    n as usize,
                ));
                pos += n;
            }
            base += ext_bytes;
        }
        debug_assert_eq!(pos, end, "runs past the file's extents");
        out
    }

    fn write_node(&self, node: &Arc<Mutex<Node>>, buf: &[u8], offset: u64) -> io::Result<()> {
        let end = offset
            .checked_add(buf.len() as u64)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "offset overflows"))?;
        self.grow(node, end)?;
        let mut n = node.lock().unwrap();
        if offset > n.len {
            // The gap reads as zeroes, not as a reused extent's old bytes.
            let zeroes = vec![0u8; (offset - n.len).min(1 << 20) as usize];
            let mut at = n.len;
            while at < offset {
                let k = (offset - at).min(zeroes.len() as u64);
                self.write_runs(&n, &zeroes[..k as usize], at, false)?;
                at += k;
            }
        }
        self.write_runs(&n, buf, offset, false)?;
        if end > n.len {
            n.len = end;
            self.write_hint(&n)?;
        }
        Ok(())
    }

    /// Writes `buf` at `offset` of the file's extents; with `fua`, each
    /// run durable before the next goes (`Device::write_fua`).
    fn write_runs(&self, node: &Node, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        let mut done = 0usize;
        for (at, n) in self.runs(node, offset, buf.len() as u64) {
            let piece = &buf[done..done + n];
            match fua {
                true => self.dev.write_fua(piece, at)?,
                false => self.dev.write_at(piece, at)?,
            }
            done += n;
        }
        Ok(())
    }
}

fn hint_crc(b: &[u8], index: usize) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(b), &(index as u32).to_le_bytes())
}

/// The length a hint records for file `index` of directory `seq`, if valid.
fn decode_hint(h: &[u8], index: usize, seq: u64) -> Option<u64> {
    let crc = u32::from_le_bytes(h[16..20].try_into().unwrap());
    (u64::from_le_bytes(h[0..8].try_into().unwrap()) == seq && crc == hint_crc(&h[..16], index))
        .then(|| u64::from_le_bytes(h[8..16].try_into().unwrap()))
}

/// Decodes and checks a directory slot: (sequence, entries).
#[allow(clippy::type_complexity)]
fn decode_dir(
    b: &[u8],
    area_bytes: u64,
    units: u32,
) -> io::Result<(u64, Vec<(String, u64, Vec<Extent>)>)> {
    if b.len() != DIR_SLOT_BYTES as usize || b[0..8] != MAGIC {
        return Err(corrupt("no directory magic".into()));
    }
    let at = DIR_SLOT_BYTES as usize - 4;
    if u32::from_le_bytes(b[at..].try_into().unwrap()) != crc32c::crc32c(&b[..at]) {
        return Err(corrupt("directory checksum mismatch".into()));
    }
    let u32_at = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
    let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    if u32_at(b, 8) != VERSION {
        return Err(corrupt(format!("directory version {}", u32_at(b, 8))));
    }
    if u64_at(b, 24) != area_bytes {
        return Err(corrupt(format!(
            "directory of an area of {} bytes, this one has {area_bytes}",
            u64_at(b, 24)
        )));
    }
    let count = u32_at(b, 12) as usize;
    if count > FILES_MAX {
        return Err(corrupt(format!("{count} files in a directory")));
    }
    let mut out = Vec::with_capacity(count);
    let mut all: Vec<Extent> = Vec::new();
    for i in 0..count {
        let e = &b[HEADER_BYTES + i * ENTRY_BYTES..HEADER_BYTES + (i + 1) * ENTRY_BYTES];
        let name_len = u16::from_le_bytes([e[0], e[1]]) as usize;
        let name = (1..=NAME_BYTES_MAX)
            .contains(&name_len)
            .then(|| std::str::from_utf8(&e[2..2 + name_len]).ok())
            .flatten()
            .ok_or_else(|| corrupt(format!("entry {i}: bad name")))?;
        let len = u64_at(e, 120);
        let n = u32_at(e, 128) as usize;
        if n > EXTENTS_PER_FILE_MAX {
            return Err(corrupt(format!("{name}: {n} extents")));
        }
        let mut extents = Vec::with_capacity(n);
        let mut capacity = 0u64;
        for j in 0..n {
            let (first, count) = (
                u32_at(e, EXTENTS_AT + j * 8),
                u32_at(e, EXTENTS_AT + j * 8 + 4),
            );
            if count == 0 || first as u64 + count as u64 > units as u64 {
                return Err(corrupt(format!("{name}: extent outside the area")));
            }
            capacity += count as u64 * UNIT_BYTES;
            extents.push((first, count));
        }
        if len > capacity {
            return Err(corrupt(format!(
                "{name}: {len} bytes in {capacity} of extents"
            )));
        }
        if out
            .iter()
            .any(|(n, _, _): &(String, u64, Vec<Extent>)| n == name)
        {
            return Err(corrupt(format!("{name} named twice")));
        }
        all.extend(extents.iter().copied());
        out.push((name.to_owned(), len, extents));
    }
    all.sort_unstable();
    if all.windows(2).any(|w| w[0].0 + w[0].1 > w[1].0) {
        return Err(corrupt("two files share an extent".into()));
    }
    Ok((u64_at(b, 16), out))
}

/// An open file of an area.
struct AreaFile {
    fs: Arc<AreaFs>,
    name: String,
    node: Arc<Mutex<Node>>,
}

impl AreaFile {
    /// Where `[offset, offset + len)` of the file lies on the device; an
    /// error past the file's end.
    fn read_runs(&self, offset: u64, len: u64) -> io::Result<Vec<(u64, usize)>> {
        let node = self.node.lock().unwrap();
        let end = offset.checked_add(len);
        if end.is_none_or(|end| end > node.len) {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("read past the end of {}", self.describe()),
            ));
        }
        Ok(self.fs.runs(&node, offset, len))
    }
}

impl AreaFile {
    /// The end of a sync whose device sync began once the file was `len`
    /// bytes long (every write below it completed): the file's durable
    /// length (what the next commit records) and its synced length go up
    /// to `len`, never past it (a write that completed after the device's
    /// sync began may not be on the media), and the directory is
    /// committed where it changed.
    fn synced_up_to(
        &self,
        mut inner: std::sync::MutexGuard<'_, Inner>,
        len: u64,
    ) -> io::Result<()> {
        self.raise_synced(&mut inner, len);
        if inner.dirty {
            self.fs.commit_locked(&mut inner)?;
        }
        Ok(())
    }

    /// The file's bytes below `len` are durable (a sync of the device
    /// began after they were written): its durable and synced lengths go
    /// up to it; the directory is dirty where its durable length changed.
    fn raise_synced(&self, inner: &mut Inner, len: u64) {
        let mut node = self.node.lock().unwrap();
        debug_assert!(
            len <= node.len,
            "a file's length falls only by a truncation"
        );
        if node.durable_len < len && !node.removed {
            node.durable_len = len;
            inner.dirty = true;
        }
        node.synced_len = node.synced_len.max(len);
    }
}

impl StorageFile for AreaFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut done = 0usize;
        for (at, n) in self.read_runs(offset, buf.len() as u64)? {
            self.fs.dev.read_at(&mut buf[done..done + n], at)?;
            done += n;
        }
        Ok(())
    }

    fn place_read(&self, offset: u64, len: u64) -> Option<io::Result<PlacedRead>> {
        Some(self.read_runs(offset, len).map(|runs| PlacedRead {
            dev: Arc::clone(&self.fs.dev),
            runs,
        }))
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        // A removed file keeps its extents while open (as an unlinked
        // inode): writes land there and are never seen under a name.
        self.fs.write_node(&self.node, buf, offset)
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.node.lock().unwrap().len)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let from = self.node.lock().unwrap().len;
        if len > from {
            // An empty write at `len`: its gap is zeroed as any write's is.
            self.fs.write_node(&self.node, &[], len)?;
        } else if len < from {
            let mut inner = self.fs.inner.lock().unwrap();
            let mut node = self.node.lock().unwrap();
            self.fs
                .truncate_node(&mut node, len)
                .map_err(|e| self.fs.latch(&mut inner, e))?;
            inner.dirty = true;
        }
        Ok(())
    }

    fn sync(&self) -> io::Result<()> {
        // The length before the device's sync (under `inner` the file is
        // not cut): a write that completes during it may not be covered.
        self.sync_below(u64::MAX)
    }

    /// Below the file's durable length (its extents and length already
    /// committed: nothing of the directory changes), one FUA write per run
    /// of the device; elsewhere a write and a sync.
    fn write_durable(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        // A latched area takes no durable write, as it takes no sync.
        AreaFs::check(&self.fs.inner.lock().unwrap())?;
        let end = offset.checked_add(buf.len() as u64);
        let written = {
            let node = self.node.lock().unwrap();
            if node.removed || end.is_none_or(|end| end > node.durable_len) {
                None
            } else {
                Some(self.fs.write_runs(&node, buf, offset, true))
            }
        };
        match written {
            None => {
                self.write_at(buf, offset)?;
                self.sync()
            }
            Some(Ok(())) => Ok(()),
            // Latched as a failed sync is: the area is not trusted after.
            Some(Err(e)) => Err(self.fs.latch(&mut self.fs.inner.lock().unwrap(), e)),
        }
    }

    fn sync_point(&self) -> Option<SyncPoint> {
        let node = self.node.lock().unwrap();
        Some(SyncPoint {
            len: node.len,
            truncations: node.truncations,
        })
    }

    /// The device synced by the caller after `point` was taken: the
    /// file's durable and synced lengths go up to the point's length, as
    /// [`StorageFile::sync`] takes them to the length at its start. A point
    /// taken before a truncation of the file says nothing of its bytes
    /// now: a whole sync instead.
    /// [`AreaFile::sync_after_device_sync`] with the commit's write left
    /// to the caller; None where the point was taken before a truncation
    /// (a whole sync is due: the caller's `sync_after_device_sync`).
    fn prepare_sync_after_device_sync(
        &self,
        point: SyncPoint,
    ) -> Option<io::Result<Option<PreparedCommit<'_>>>> {
        let mut inner = self.fs.inner.lock().unwrap();
        if let Err(e) = AreaFs::check(&inner) {
            return Some(Err(e));
        }
        let before = {
            let node = self.node.lock().unwrap();
            if node.truncations != point.truncations {
                return None;
            }
            (node.durable_len, node.synced_len)
        };
        let dirty = inner.dirty;
        self.raise_synced(&mut inner, point.len);
        if !inner.dirty {
            return Some(Ok(None));
        }
        let slot = self.fs.encode_commit(&inner);
        Some(Ok(Some(PreparedCommit {
            fs: &self.fs,
            inner,
            slot: Some(slot),
            undo: Some((Arc::clone(&self.node), before.0, before.1, dirty)),
        })))
    }

    fn sync_after_device_sync(&self, point: SyncPoint) -> io::Result<()> {
        let inner = self.fs.inner.lock().unwrap();
        AreaFs::check(&inner)?;
        if self.node.lock().unwrap().truncations != point.truncations {
            // A truncation since cut only bytes at or past the point's
            // length (a failed append's, or all but a header): a sync of
            // its own, counting durable nothing the point did not cover.
            drop(inner);
            return self.sync_below(point.len);
        }
        self.synced_up_to(inner, point.len)
    }

    fn sync_below(&self, bound: u64) -> io::Result<()> {
        let mut inner = self.fs.inner.lock().unwrap();
        AreaFs::check(&inner)?;
        let len = self.node.lock().unwrap().len.min(bound);
        self.fs
            .dev
            .sync()
            .map_err(|e| self.fs.latch(&mut inner, e))?;
        self.synced_up_to(inner, len)
    }

    fn reserve(&self, len: u64) -> io::Result<()> {
        self.fs.grow(&self.node, len)
    }

    fn punch(&self, offset: u64, len: u64) -> io::Result<()> {
        self.zero_range(offset, len)
    }

    fn zero_range(&self, offset: u64, len: u64) -> io::Result<()> {
        super::storage::write_zeroes_to(self, offset, len)
    }

    fn allocate(&self, len: u64) -> io::Result<()> {
        if self.len()? < len {
            self.set_len(len)?;
        }
        Ok(())
    }

    fn ring_file(&self) -> Option<RingFile> {
        None
    }

    /// Unlike `write_at`, nothing between the length and `offset` is
    /// zeroed: the caller writes those bytes itself (appends in flight
    /// beside this one), so a zeroing here could land over them.
    fn place_write(&self, offset: u64, len: u64) -> Option<io::Result<PlacedWrite>> {
        let Some(end) = offset.checked_add(len) else {
            return Some(Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "offset overflows",
            )));
        };
        if let Err(e) = self.fs.grow(&self.node, end) {
            return Some(Err(e));
        }
        let n = self.node.lock().unwrap();
        Some(Ok(PlacedWrite {
            dev: Arc::clone(&self.fs.dev),
            runs: self.fs.runs(&n, offset, len),
            hint: (end > n.len).then(|| self.fs.hint_for(&n, end)).flatten(),
        }))
    }

    fn placed_written(&self, end: u64) {
        let mut n = self.node.lock().unwrap();
        n.len = n.len.max(end);
    }

    fn synced_len(&self) -> Option<u64> {
        Some(self.node.lock().unwrap().synced_len)
    }

    fn describe(&self) -> String {
        format!("{} in {}", self.name, self.fs.describe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::{FileDevice, MemDevice, PowerLossStorage};
    use proptest::prelude::*;
    use std::path::Path;

    const AREA: u64 = 4 << 20;

    fn read(fs: &Arc<AreaFs>, name: &str) -> Vec<u8> {
        let f = fs.open_file(name).unwrap();
        let mut b = vec![0u8; f.len().unwrap() as usize];
        f.read_at(&mut b, 0).unwrap();
        b
    }

    /// An area with file `j`: 100 bytes synced, 50 more written, a sync
    /// point taken of those 150 and the device synced: the device, the
    /// area, the file and the point.
    fn synced_100_then_50_more() -> (
        Arc<dyn Device>,
        Arc<AreaFs>,
        Arc<dyn StorageFile>,
        SyncPoint,
    ) {
        let dev: Arc<dyn Device> = Arc::new(MemDevice::new("m", 8 << 20));
        let fs = Arc::new(AreaFs::format(Arc::clone(&dev), 0, AREA).unwrap());
        let f = fs.create_file("j", false).unwrap();
        f.write_at(&[1u8; 100], 0).unwrap();
        f.sync().unwrap();
        f.write_at(&[2u8; 50], 100).unwrap();
        let point = f.sync_point().unwrap();
        dev.sync().unwrap();
        (dev, fs, f, point)
    }

    /// The synced length of file `j` in `dev`'s committed directory (what
    /// an open takes as synced).
    fn committed(dev: &Arc<dyn Device>) -> u64 {
        let fs = Arc::new(AreaFs::open_read_only(Arc::clone(dev), 0, AREA).unwrap());
        fs.open_file("j").unwrap().synced_len().unwrap()
    }

    /// Replaces `name` as `write_atomic` does on a real file system.
    fn replace(fs: &Arc<AreaFs>, name: &str, bytes: &[u8]) -> io::Result<()> {
        let tmp = format!("{name}.tmp");
        let f = fs.create_file(&tmp, true)?;
        f.write_at(bytes, 0)?;
        f.sync()?;
        fs.rename(&tmp, name)?;
        fs.commit()
    }

    #[test]
    fn files_written_and_committed_read_back_after_reopen() {
        let dev: Arc<dyn Device> = Arc::new(MemDevice::new("m", 8 << 20));
        let fs = Arc::new(AreaFs::format(Arc::clone(&dev), 1 << 20, AREA).unwrap());
        let a = fs.create_file("journal/dev0.jrnl", false).unwrap();
        a.write_at(b"hello", 0).unwrap();
        a.write_at(b"world", 70_000).unwrap();
        a.sync().unwrap();
        replace(&fs, "intent.map", &[7u8; 100_000]).unwrap();
        let fs = Arc::new(AreaFs::open(dev, 1 << 20, AREA).unwrap());
        let got = read(&fs, "journal/dev0.jrnl");
        assert_eq!(got.len(), 70_005);
        assert_eq!(&got[..5], b"hello");
        assert!(
            got[5..70_000].iter().all(|&b| b == 0),
            "the gap reads as zeroes"
        );
        assert_eq!(&got[70_000..], b"world");
        assert_eq!(read(&fs, "intent.map"), vec![7u8; 100_000]);
        assert_eq!(fs.list(), vec!["intent.map", "journal/dev0.jrnl"]);
    }

    #[test]
    fn a_killed_process_loses_no_append_the_kernel_holds() {
        let dev: Arc<dyn Device> = Arc::new(MemDevice::new("m", 8 << 20));
        let fs = Arc::new(AreaFs::format(Arc::clone(&dev), 0, AREA).unwrap());
        let f = fs.create_file("log", false).unwrap();
        f.write_at(b"synced", 0).unwrap();
        f.sync().unwrap();
        // Appends with no sync: a kill -9 now keeps them in the page cache,
        // and the length hints say how far they go.
        f.write_at(b" and not", 6).unwrap();
        f.write_at(&[7u8; 200_000], 14).unwrap();
        // Another file's sync commits the directory meanwhile.
        let g = fs.create_file("other", false).unwrap();
        g.write_at(b"x", 0).unwrap();
        g.sync().unwrap();
        drop((f, g, fs));
        let fs = Arc::new(AreaFs::open(dev, 0, AREA).unwrap());
        let got = read(&fs, "log");
        assert_eq!(&got[..14], b"synced and not");
        assert_eq!(got.len(), 14 + 200_000);
        // What the hints added was written after the file's last sync: its
        // synced length says where it starts (the parity journal takes
        // records there as not flushed) until the file's own sync, whatever
        // another file's commit records meanwhile.
        let f = fs.open_file("log").unwrap();
        assert_eq!(f.synced_len(), Some(6));
        fs.open_file("other").unwrap().sync().unwrap();
        fs.create_file("third", false).unwrap().sync().unwrap();
        assert_eq!(f.synced_len(), Some(6));
        f.sync().unwrap();
        assert_eq!(f.synced_len(), Some(14 + 200_000));
    }

    /// A sync finished by the caller's device sync (a flush's batch)
    /// counts durable what the file held when its point was taken, never
    /// what was appended between the point and the bookkeeping, in the
    /// directory (what an open takes as synced) as in memory; after a
    /// truncation since the point, a sync of its own counts no more than
    /// the point's length (a truncation cuts only bytes past a point a
    /// parity journal takes; bytes past it wait for the next sync).
    #[test]
    fn a_sync_after_the_devices_sync_counts_what_the_file_held_at_its_point() {
        let (dev, _fs, f, point) = synced_100_then_50_more();
        // Finished after the device's sync was issued.
        f.write_at(&[3u8; 70], 150).unwrap();
        f.sync_after_device_sync(point).unwrap();
        assert_eq!(f.synced_len(), Some(150));
        assert_eq!(committed(&dev), 150);
        f.sync().unwrap();
        assert_eq!((f.synced_len(), committed(&dev)), (Some(220), 220));
        // Cut and grown again past the point's length: a sync of its own,
        // up to the point's length.
        let point = f.sync_point().unwrap();
        f.set_len(10).unwrap();
        f.write_at(&[4u8; 300], 10).unwrap();
        f.sync_after_device_sync(point).unwrap();
        assert_eq!((f.synced_len(), committed(&dev)), (Some(220), 220));
        f.sync().unwrap();
        assert_eq!((f.synced_len(), committed(&dev)), (Some(310), 310));
    }

    /// A commit made ready and dropped unfinished (not wanted in the
    /// message it was made for: the flush sends it after the pages
    /// instead) puts back the lengths it raised: another file's commit
    /// meanwhile records the file as it was, never the length the caller
    /// had still to order behind its other writes.
    #[test]
    fn a_prepared_commit_dropped_unfinished_leaves_no_raised_length_behind() {
        let (dev, fs, f, point) = synced_100_then_50_more();
        let commit = f.prepare_sync_after_device_sync(point);
        assert!(matches!(commit, Some(Ok(Some(_)))), "the length changed");
        drop(commit);
        assert_eq!(f.synced_len(), Some(100), "put back in memory");
        let g = fs.create_file("other", false).unwrap();
        g.write_at(b"x", 0).unwrap();
        g.sync().unwrap();
        assert_eq!(
            committed(&dev),
            100,
            "another file's commit records j as it was"
        );
        f.sync_after_device_sync(point).unwrap();
        assert_eq!((f.synced_len(), committed(&dev)), (Some(150), 150));
    }

    /// Appends written in a batch beside other device I/O: placed while
    /// an earlier one is written and not yet finished, the later one must
    /// not zero the earlier one's bytes (as `write_at` zeroes a gap).
    #[test]
    fn placed_writes_land_where_placed_and_finish_in_any_order() {
        let dev: Arc<dyn Device> = Arc::new(MemDevice::new("d", AREA));
        let fs = Arc::new(AreaFs::format(Arc::clone(&dev), 0, AREA).unwrap());
        let f = fs.create_file("j", false).unwrap();
        f.write_at(&[7u8; 100], 0).unwrap();
        f.sync().unwrap();
        let write = |p: &PlacedWrite, bytes: &[u8]| {
            let mut done = 0;
            for &(at, n) in &p.runs {
                p.dev.write_at(&bytes[done..done + n], at).unwrap();
                done += n;
            }
            if let Some((at, h)) = &p.hint {
                p.dev.write_at(h, *at).unwrap();
            }
        };
        let a = vec![0xa1u8; 5000];
        let b = vec![0xb2u8; 200_000];
        let pa = f.place_write(100, a.len() as u64).unwrap().unwrap();
        write(&pa, &a);
        let pb = f
            .place_write(100 + a.len() as u64, b.len() as u64)
            .unwrap()
            .unwrap();
        assert_eq!(f.len().unwrap(), 100, "placing changes no length");
        write(&pb, &b);
        f.placed_written(5100 + b.len() as u64);
        f.placed_written(5100);
        let mut want = vec![7u8; 100];
        want.extend(&a);
        want.extend(&b);
        assert_eq!(read(&fs, "j"), want);
        f.sync().unwrap();
        drop(f);
        drop(fs);
        let fs = Arc::new(AreaFs::open(dev, 0, AREA).unwrap());
        assert_eq!(read(&fs, "j"), want);
    }

    #[test]
    fn a_truncated_tail_reads_as_zeroes_when_the_file_grows_again() {
        let dev: Arc<dyn Device> = Arc::new(MemDevice::new("m", 8 << 20));
        let fs = Arc::new(AreaFs::format(Arc::clone(&dev), 0, AREA).unwrap());
        let f = fs.create_file("log", false).unwrap();
        f.write_at(&[9u8; 10_000], 0).unwrap();
        f.sync().unwrap();
        f.set_len(100).unwrap();
        f.set_len(10_000).unwrap();
        let got = read(&fs, "log");
        assert!(got[100..].iter().all(|&b| b == 0));
        // On the media too: the old records are gone, not only hidden.
        drop((f, fs));
        let fs = Arc::new(AreaFs::open(dev, 0, AREA).unwrap());
        let got = read(&fs, "log");
        assert!(got[100..].iter().all(|&b| b == 0), "old bytes came back");
    }

    /// A file replaced in place (`replace_file`: its bytes as one FUA
    /// write into free units, then the directory's commit) or the
    /// temporary file's way, with the power cut after each of its device
    /// writes in turn (later writes never reach the device; the unsynced
    /// ones before meet the simulator's fates): after the cut the file is
    /// its old content or its new, never a mix; a synced log beside it
    /// keeps its bytes; once the replacement returned with every write
    /// through, the new content. `replace_file` sends 2 writes and no
    /// sync or discard (the temporary file's way 6 writes, with a discard
    /// and syncs between them); past `REPLACE_COPY_BYTES_MAX`, 3 writes
    /// (the bytes, the zero tail, the commit) and a sync.
    #[test]
    fn a_replaced_file_is_its_old_or_new_content_wherever_the_power_is_cut() {
        use crate::media::{FaultPlan, FaultyDevice};
        use std::sync::atomic::Ordering::SeqCst;
        let path = Path::new("/sim/dev0");
        let old = vec![0x11u8; 70_000];
        let log = vec![0x22u8; 5_000];
        for by_rename in [false, true] {
            for new_len in [3_000usize, 150_000, 1_200_000] {
                let new = vec![0x33u8; new_len];
                let mut complete = 0;
                for cut in 0..16i64 {
                    let sim = PowerLossStorage::new();
                    let storage = sim.shared();
                    storage.create_dir_all(Path::new("/sim")).unwrap();
                    let dev = FileDevice::create_in(storage.as_ref(), path, 8 << 20).unwrap();
                    storage.sync_dir(Path::new("/sim")).unwrap();
                    let fs = Arc::new(AreaFs::format(Arc::new(dev), 1 << 20, AREA).unwrap());
                    fs.replace_file("map", &old).unwrap();
                    let f = fs.create_file("log", false).unwrap();
                    f.write_at(&log, 0).unwrap();
                    f.sync().unwrap();
                    drop((f, fs));
                    let plan = FaultPlan::new();
                    let dev = FileDevice::open_in(storage.as_ref(), path).unwrap();
                    let faulty: Arc<dyn Device> =
                        Arc::new(FaultyDevice::new(dev, Arc::clone(&plan)));
                    let fs = Arc::new(AreaFs::open(faulty, 1 << 20, AREA).unwrap());
                    plan.writes_before_crash.store(cut, SeqCst);
                    let _ = match by_rename {
                        true => replace(&fs, "map", &new),
                        false => fs.replace_file("map", &new),
                    };
                    let through = plan.writes_before_crash.load(SeqCst) > 0;
                    drop(fs);
                    sim.crash(cut as u64 * 7 + new_len as u64);
                    let dev: Arc<dyn Device> =
                        Arc::new(FileDevice::open_in(storage.as_ref(), path).unwrap());
                    let fs = Arc::new(AreaFs::open(dev, 1 << 20, AREA).unwrap());
                    let got = read(&fs, "map");
                    let what = format!("by rename {by_rename}, {new_len} bytes, cut {cut}");
                    assert!(got == old || got == new, "{what}: a mix");
                    if through {
                        assert_eq!(got, new, "{what}: returned, not kept");
                        complete += 1;
                    }
                    assert_eq!(read(&fs, "log"), log, "{what}: the log");
                    // (The temporary file's way may leave its copy.)
                    let mut names = fs.list();
                    names.retain(|n| !by_rename || n != "map.tmp");
                    assert_eq!(names, ["log", "map"], "{what}");
                }
                let writes_needed = 15 - complete;
                eprintln!("by rename {by_rename}, {new_len} bytes: {writes_needed} writes");
                if !by_rename {
                    // A large file's bytes and zero tail go apart, synced.
                    let writes = if new_len <= REPLACE_COPY_BYTES_MAX {
                        2
                    } else {
                        3
                    };
                    assert_eq!(writes_needed, writes, "the bytes' writes and the commit");
                }
            }
        }
    }

    #[test]
    fn a_full_area_refuses_with_enospc_and_keeps_what_it_holds() {
        let dev: Arc<dyn Device> = Arc::new(MemDevice::new("m", 8 << 20));
        let fs = Arc::new(AreaFs::format(Arc::clone(&dev), 0, AREA_BYTES_MIN).unwrap());
        replace(&fs, "a", &[1u8; 300_000]).unwrap();
        let e = replace(&fs, "b", &[2u8; 900_000]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
        let e = fs.replace_file("b", &[2u8; 900_000]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
        // Replacing a needs room for both contents until the commit.
        let e = fs.replace_file("a", &[3u8; 800_000]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
        assert_eq!(read(&fs, "a"), vec![1u8; 300_000]);
        // Removing a frees its extents once committed.
        fs.remove("a").unwrap();
        fs.commit().unwrap();
        replace(&fs, "b", &[2u8; 900_000]).unwrap();
        assert_eq!(read(&fs, "b"), vec![2u8; 900_000]);
    }

    #[test]
    fn corrupt_directories_are_refused_and_a_torn_commit_falls_back() {
        let dev = Arc::new(MemDevice::new("m", 8 << 20));
        let d: Arc<dyn Device> = dev.clone();
        let fs = Arc::new(AreaFs::format(Arc::clone(&d), 0, AREA).unwrap());
        replace(&fs, "x", b"one").unwrap();
        // The newest slot torn: the previous directory is read.
        let seq = fs.inner.lock().unwrap().seq;
        let newest = (seq % 2) * DIR_SLOT_BYTES;
        dev.with_bytes(|b| b[newest as usize + 100] ^= 0xff);
        let back = Arc::new(AreaFs::open(Arc::clone(&d), 0, AREA).unwrap());
        assert!(back.inner.lock().unwrap().seq < seq);
        // Both slots bad: a clear error.
        dev.with_bytes(|b| b[(DIR_SLOT_BYTES - newest) as usize + 100] ^= 0xff);
        let e = AreaFs::open(d, 0, AREA).err().unwrap();
        assert!(e.to_string().contains("no valid directory"), "{e}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Random file operations against a model of named byte vectors:
        /// after syncing everything and reopening, the area holds exactly
        /// the model.
        #[test]
        fn the_area_matches_a_model_of_files_after_reopen(
            ops in proptest::collection::vec((0u8..6, 0usize..4, 0u64..200_000, 1usize..70_000, any::<u8>()), 1..40)
        ) {
            let dev: Arc<dyn Device> = Arc::new(MemDevice::new("m", 16 << 20));
            let fs = Arc::new(AreaFs::format(Arc::clone(&dev), 1 << 20, 12 << 20).unwrap());
            let mut model: BTreeMap<String, Vec<u8>> = BTreeMap::new();
            let name = |i: usize| format!("f{i}");
            for (op, i, at, len, byte) in ops {
                match op {
                    0 | 1 => {
                        let f = fs.create_file(&name(i), false).unwrap();
                        f.write_at(&vec![byte; len], at).unwrap();
                        let m = model.entry(name(i)).or_default();
                        if m.len() < at as usize + len { m.resize(at as usize + len, 0); }
                        m[at as usize..at as usize + len].fill(byte);
                    }
                    2 => if let Some(m) = model.get_mut(&name(i)) {
                        let new_len = (at as usize) / 2;
                        fs.open_file(&name(i)).unwrap().set_len(new_len as u64).unwrap();
                        m.resize(new_len, 0);
                    },
                    3 => if let Some(m) = model.remove(&name(i)) {
                        fs.rename(&name(i), &name((i + 1) % 4)).unwrap();
                        model.insert(name((i + 1) % 4), m);
                    },
                    4 => if model.remove(&name(i)).is_some() {
                        fs.remove(&name(i)).unwrap();
                    },
                    _ => if model.contains_key(&name(i)) {
                        fs.open_file(&name(i)).unwrap().sync().unwrap();
                    },
                }
            }
            for n in model.keys() {
                fs.open_file(n).unwrap().sync().unwrap();
            }
            fs.commit().unwrap();
            let fs = Arc::new(AreaFs::open(dev, 1 << 20, 12 << 20).unwrap());
            prop_assert_eq!(fs.list(), model.keys().cloned().collect::<Vec<_>>());
            for (n, m) in &model {
                prop_assert_eq!(&read(&fs, n), m);
            }
        }
    }

    /// Power cuts through the simulator: an appended log never shows bytes
    /// that were not appended (a reused extent's stale content), keeps
    /// every synced byte, and a replaced file is its old or its new
    /// version, never a mix.
    #[test]
    fn power_cuts_never_show_stale_bytes_and_keep_what_was_synced() {
        let path = Path::new("/sim/dev0");
        for seed in std::env::var("AREA_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .map_or(0..200u64, |s: u64| s..s + 1)
        {
            let sim = PowerLossStorage::new();
            let storage = sim.shared();
            storage.create_dir_all(Path::new("/sim")).unwrap();
            let open = |format: bool| {
                let dev: Arc<dyn Device> = if format {
                    Arc::new(FileDevice::create_in(storage.as_ref(), path, 8 << 20).unwrap())
                } else {
                    Arc::new(FileDevice::open_in(storage.as_ref(), path).unwrap())
                };
                if format {
                    storage.sync_dir(Path::new("/sim")).unwrap();
                    Arc::new(AreaFs::format(dev, 1 << 20, AREA).unwrap())
                } else {
                    Arc::new(AreaFs::open(dev, 1 << 20, AREA).unwrap())
                }
            };
            let mut fs = open(true);
            let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            let mut next = || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng
            };
            // The log's content so far (what may survive) and how much of
            // it was synced (what must).
            let mut log: Vec<u8> = Vec::new();
            let mut synced = 0usize;
            let mut versions: Vec<Vec<u8>> = vec![];
            let mut map_done: Option<Vec<u8>> = None;
            for step in 0..60u64 {
                let op = next() % 5;
                if std::env::var("AREA_SEED").is_ok() {
                    eprintln!("step {step} op {op} log {} synced {synced}", log.len());
                }
                match op {
                    0 | 1 => {
                        let n = (next() % 20_000) as usize + 1;
                        let bytes: Vec<u8> =
                            (0..n).map(|i| (step as usize * 31 + i) as u8 | 1).collect();
                        let f = match fs.open_file("log") {
                            Ok(f) => f,
                            Err(_) => fs.create_file("log", false).unwrap(),
                        };
                        f.write_at(&bytes, log.len() as u64).unwrap();
                        log.extend_from_slice(&bytes);
                        if next() % 2 == 0 {
                            f.sync().unwrap();
                            synced = log.len();
                        }
                    }
                    2 => {
                        // Shrink the log (a journal reset), synced.
                        if let Ok(f) = fs.open_file("log") {
                            f.set_len(0).unwrap();
                            f.sync().unwrap();
                            log.clear();
                            synced = 0;
                        }
                    }
                    3 => {
                        let n = (next() % 200_000) as usize + 1;
                        let v = vec![(step as u8) | 0x80; n];
                        versions = vec![v.clone()];
                        if let Some(d) = &map_done {
                            versions.push(d.clone());
                        }
                        match next() % 2 {
                            0 => replace(&fs, "map", &v).unwrap(),
                            _ => fs.replace_file("map", &v).unwrap(),
                        }
                        map_done = Some(v);
                    }
                    _ => {
                        sim.crash(seed * 1000 + step);
                        fs = open(false);
                        let got = fs
                            .open_file("log")
                            .map(|f| {
                                let mut b = vec![0u8; f.len().unwrap() as usize];
                                f.read_at(&mut b, 0).unwrap();
                                b
                            })
                            .unwrap_or_default();
                        assert!(
                            got.len() >= synced,
                            "seed {seed} step {step}: synced bytes lost"
                        );
                        assert!(
                            got.len() <= log.len(),
                            "seed {seed} step {step}: the log grew"
                        );
                        assert_eq!(
                            got[..synced],
                            log[..synced],
                            "seed {seed} step {step}: synced bytes"
                        );
                        // Past the synced part: what was appended, or
                        // zeroes where a length hint outran its data;
                        // never an older file's bytes.
                        for (i, (&g, &w)) in got.iter().zip(&log).enumerate().skip(synced) {
                            assert!(
                                g == w || g == 0,
                                "seed {seed} step {step}: stale byte {g} at {i}"
                            );
                        }
                        log.truncate(got.len());
                        log[synced..].copy_from_slice(&got[synced..]);
                        synced = got.len();
                        if let Some(done) = &map_done {
                            let m = read(&fs, "map");
                            assert_eq!(&m, done, "seed {seed} step {step}: replaced file");
                        }
                        let _ = &versions;
                    }
                }
            }
        }
    }
}
