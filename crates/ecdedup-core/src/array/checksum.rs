//! Per-block CRC32C tables, one per device, paged through a bounded cache:
//! RAM follows the configured bound (`checksum_cache_bytes_max`), not the
//! device's capacity, and opening a table reads nothing.
//!
//! On disk an entry stores `crc ^ ZERO_BLOCK_CRC`, so a zero-filled area
//! (a fresh sparse file, a punched hole) describes all-zero blocks: creating
//! an array writes no table, and a discard needs no table rewrite beyond the
//! entries it resets. The table is cut into 4 KiB pages of 1024 entries.
//!
//! A page becomes resident when an entry of it is read (one 4 KiB device
//! read) or set. A `set` reads nothing: a page that is not resident is
//! started *partial*, holding only the entries set since, and is read from
//! the device and merged under them when an entry it lacks is read, or
//! before it is written. Resident pages are kept in shards (a mutex each,
//! held across the page's device I/O), each bounded by its share of the
//! configured bytes and evicted by CLOCK. A dirty page is written when
//! evicted, or at `flush`; never dropped unwritten; and either way only
//! once a sync of every device that began after its entries were set has
//! completed ([`SyncEpochs`]: an eviction passes over a page no such sync
//! covers and asks for one). Until that flush completes, its stripes are
//! covered by the write-intent log (see docs/format.md). After an I/O error on the table the error is latched:
//! every later `flush` returns it (the array then fails the device), no
//! page is evicted any more, and entries that are not resident read as
//! unknown.
//!
//! Where the pages come from ([`Base`]): the device in the member's slot
//! (shared with the array, so a failure or a replacement is seen at once);
//! zeros ([`ChecksumTable::new_zeroed`], for benches and tests that flush to
//! their own device); or nothing (a [`ChecksumTable::duplicate`]). A table
//! whose pages cannot be read back (no device in the slot: a failed member,
//! or a duplicate) evicts nothing: its resident pages are pinned, so the
//! entries degraded writes set while a device is out stay known until the
//! rebuild; entries of pages that were not resident when the device went
//! out read as `None` (unknown), never as a made-up CRC. Such a table grows
//! past the bound with the pages degraded writes touch, up to the whole
//! table (4 bytes per 4 KiB block).

use crate::counters::{DeviceCounters, IoClass};
use crate::media::remote::{within, Scope};
use crate::media::Device;
use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

/// The device a member position holds now (None while it is out of
/// service); shared by the array and the position's table.
pub type DeviceSlot = Arc<RwLock<Option<Arc<dyn Device>>>>;

const ENTRIES_PER_PAGE: usize = 1024;
const PAGE_BYTES: usize = 4096;
const MASK_WORDS: usize = ENTRIES_PER_PAGE / 64;
/// RAM of a resident page: its entries plus the map slot and clock entry.
const PAGE_RAM_BYTES: u64 = PAGE_BYTES as u64 + 64;
/// Extra RAM of a partial page: its known-entry mask.
const MASK_RAM_BYTES: u64 = (MASK_WORDS * 8) as u64;
/// Shards per table at most (fewer under a bound of fewer pages).
const SHARDS_MAX: usize = 16;
/// Default of `checksum_cache_bytes_max`: the RAM of all of an array's
/// checksum tables together.
pub const CACHE_BYTES_DEFAULT: u64 = 64 << 20;

/// CRC32C of an all-zero block of `block_bytes`.
pub fn zero_block_crc(block_bytes: usize) -> u32 {
    static ZERO_4K: OnceLock<u32> = OnceLock::new();
    assert_eq!(block_bytes, 4096);
    *ZERO_4K.get_or_init(|| crate::codec::crc32c(&[0u8; 4096]))
}

/// Where pages that are not resident come from.
enum Base {
    /// The device in the slot, when there is one.
    Device {
        slot: DeviceSlot,
        counters: Arc<DeviceCounters>,
    },
    /// Every entry describes a zero block.
    Zero,
    /// Unknown: a copy that cannot read pages back.
    Unknown,
}

struct Page {
    entries: Box<[u32; ENTRIES_PER_PAGE]>,
    /// None when every entry is known; else bit i says entry i is (it was
    /// set since the page became resident without being read).
    known: Option<Box<[u64; MASK_WORDS]>>,
    dirty: bool,
    referenced: bool,
    /// The [`SyncEpochs`] epoch of the entry set last (while dirty): the
    /// page may be written ahead of a flush once the devices' syncs made
    /// every write of that epoch durable.
    epoch: u64,
    /// Bumped by every `set`: a flush's write of the page as encoded
    /// before leaves it clean only where no entry changed since.
    version: u64,
    /// A flush's write of the page, encoded, is on its way
    /// ([`DirtyPages`]): no eviction writes it meanwhile (an older copy
    /// could land over a newer one).
    in_flight: bool,
}

impl Page {
    fn filled(crc: u32) -> Page {
        Page {
            entries: Box::new([crc; ENTRIES_PER_PAGE]),
            known: None,
            dirty: false,
            referenced: true,
            epoch: 0,
            version: 0,
            in_flight: false,
        }
    }

    fn partial() -> Page {
        Page {
            known: Some(Box::new([0; MASK_WORDS])),
            ..Page::filled(0)
        }
    }

    fn is_known(&self, slot: usize) -> bool {
        self.known
            .as_ref()
            .is_none_or(|m| m[slot / 64] & (1 << (slot % 64)) != 0)
    }

    /// Takes the entries this page does not know from the page's bytes on
    /// the device; the page is then whole.
    fn merge_under(&mut self, stored: &[u8], zero_crc: u32) {
        assert_eq!(stored.len(), PAGE_BYTES);
        for (slot, chunk) in stored.chunks_exact(4).enumerate() {
            if !self.is_known(slot) {
                self.entries[slot] = u32::from_le_bytes(chunk.try_into().unwrap()) ^ zero_crc;
            }
        }
        self.known = None;
    }

    /// The page as the device stores it.
    fn encode(&self, zero_crc: u32, buf: &mut [u8]) {
        assert!(
            self.known.is_none(),
            "a partial page is merged before it is written"
        );
        for (chunk, crc) in buf.chunks_exact_mut(4).zip(self.entries.iter()) {
            chunk.copy_from_slice(&(crc ^ zero_crc).to_le_bytes());
        }
    }

    fn ram_bytes(&self) -> u64 {
        PAGE_RAM_BYTES
            + if self.known.is_some() {
                MASK_RAM_BYTES
            } else {
                0
            }
    }
}

#[derive(Default)]
struct Shard {
    pages: HashMap<u64, Page>,
    /// Resident pages in CLOCK order (the hand is the front).
    clock: VecDeque<u64>,
}

/// A table's dirty pages, encoded for a batched write
/// ([`ChecksumTable::dirty_pages`]): each marked in flight, so that no
/// eviction writes it meanwhile; the table's shards are not held, so
/// entries may change (their pages then stay dirty).
pub struct DirtyPages<'t> {
    table: &'t ChecksumTable,
    /// One flush's pages on their way per table at a time: a second flush
    /// (a FUA write beside it) encodes after this one's are written, so an
    /// older copy of a page never lands after a newer one that was taken
    /// for written.
    _writer: std::sync::MutexGuard<'t, ()>,
    /// (page number, device offset, bytes, the page's version encoded).
    pages: Vec<(u64, u64, Vec<u8>, u64)>,
}

impl DirtyPages<'_> {
    /// Whether no page is dirty.
    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    /// The writes to make: (device offset, bytes).
    pub fn writes(&self) -> impl Iterator<Item = (u64, &[u8])> {
        self.pages.iter().map(|(_, at, b, _)| (*at, b.as_slice()))
    }

    /// The pages' writes ended with `outcome` (the first error among
    /// them): on success each page whose entries did not change since its
    /// encoding is clean; an error other than a full file system is
    /// latched, as [`ChecksumTable::flush`] latches it, and the pages stay
    /// dirty.
    pub fn finish(self, outcome: io::Result<()>, counters: &DeviceCounters) -> io::Result<()> {
        let ok = outcome.is_ok();
        for (number, _, bytes, version) in &self.pages {
            if ok {
                counters.write(IoClass::Metadata, bytes.len());
            }
            let mut shard = self.table.shard(*number);
            if let Some(page) = shard.pages.get_mut(number) {
                page.in_flight = false;
                if ok && page.version == *version {
                    page.dirty = false;
                }
            }
        }
        if let Err(e) = outcome {
            if !super::Array::is_space_error(&e) {
                self.table.latch(&e);
            }
            return Err(e);
        }
        Ok(())
    }
}

/// When a table page may be written ahead of a flush, shared by the
/// tables of one array. An entry is set once its block's write was taken
/// by its device, and says the block holds it; written durably while
/// another member's write of the same row was still unsynced, it outlived
/// a cut that dropped that other write, and each member left matched its
/// entry though the row was not one codeword: after two members lost at
/// the next open, the resync took the row for untouched
/// ([`super::Array::rows_torn_unlogged`]) and the k left decoded the
/// missing units as neither their old nor their new bytes (test
/// `a_cut_between_a_flushs_table_pages_and_its_syncs_never_reads_wrong`).
/// So a page is written only after every device's sync that began after
/// its entries were set: a flush syncs every device first and writes the
/// pages after ([`super::Array::sync_devices`]), and an eviction writes a
/// dirty page only where such a sync has completed, asking for one
/// (`wanted`) where none has.
pub struct SyncEpochs {
    /// Whether pages wait for the syncs at all (false: a table on its own,
    /// as in the table's unit tests and benches, writes when it evicts).
    strict: bool,
    /// The epoch an entry set now takes.
    current: std::sync::atomic::AtomicU64,
    /// Every write whose entry took this epoch or an earlier one is durable
    /// on every device in service.
    durable: std::sync::atomic::AtomicU64,
    /// An eviction found only pages it may not write yet.
    wanted: std::sync::atomic::AtomicBool,
}

impl SyncEpochs {
    /// The epochs of one array's tables.
    pub fn new() -> Arc<SyncEpochs> {
        SyncEpochs::with_strict(true)
    }

    /// No ordering: every page may be written at any time.
    fn none() -> Arc<SyncEpochs> {
        SyncEpochs::with_strict(false)
    }

    fn with_strict(strict: bool) -> Arc<SyncEpochs> {
        Arc::new(SyncEpochs {
            strict,
            current: std::sync::atomic::AtomicU64::new(1),
            durable: std::sync::atomic::AtomicU64::new(0),
            wanted: std::sync::atomic::AtomicBool::new(false),
        })
    }

    fn now(&self) -> u64 {
        self.current.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Called before every device in service is synced: returns the epoch
    /// that sync covers (every entry set before this call took it or an
    /// earlier one, after its write was taken by its device).
    pub fn begin_sync(&self) -> u64 {
        self.current
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    }

    /// The sync begun at `epoch` completed on every device in service.
    pub fn synced(&self, epoch: u64) {
        self.durable
            .fetch_max(epoch, std::sync::atomic::Ordering::SeqCst);
    }

    fn may_write(&self, epoch: u64) -> bool {
        !self.strict || epoch <= self.durable.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Whether an eviction asked for a sync since the last call (and
    /// forgets it). Called at the end of every request: a load first, so
    /// that requests do not each write the shared flag.
    pub fn take_wanted(&self) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        self.wanted.load(SeqCst) && self.wanted.swap(false, SeqCst)
    }
}

pub struct ChecksumTable {
    epochs: Arc<SyncEpochs>,
    /// Held by a flush's [`DirtyPages`] from their encoding to their finish.
    pages_writer: Mutex<()>,
    base: Base,
    shards: Vec<Mutex<Shard>>,
    pages_per_shard_max: usize,
    blocks: u64,
    offset: u64,
    zero_crc: u32,
    /// The first I/O error met reading or writing pages (kind, message).
    error: Mutex<Option<(io::ErrorKind, String)>>,
}

impl ChecksumTable {
    /// The table of the device in `slot`, paged within `cache_bytes_max`
    /// bytes (at least one page per shard). Reads nothing.
    pub fn open(
        slot: DeviceSlot,
        counters: Arc<DeviceCounters>,
        blocks: u64,
        offset: u64,
        block_bytes: usize,
        cache_bytes_max: u64,
    ) -> ChecksumTable {
        ChecksumTable::with_base(
            Base::Device { slot, counters },
            blocks,
            offset,
            block_bytes,
            cache_bytes_max,
        )
    }

    /// The table with its pages' writes ordered after the devices' syncs
    /// by `epochs` (shared by the array's tables).
    pub fn with_epochs(mut self, epochs: Arc<SyncEpochs>) -> ChecksumTable {
        self.epochs = epochs;
        self
    }

    /// A table for `blocks` blocks, every entry describing a zero block,
    /// with no device behind it: pages it touches stay resident (flush
    /// writes the dirty ones to the device it is given).
    pub fn new_zeroed(blocks: u64, offset: u64, block_bytes: usize) -> ChecksumTable {
        ChecksumTable::with_base(Base::Zero, blocks, offset, block_bytes, u64::MAX)
    }

    fn with_base(
        base: Base,
        blocks: u64,
        offset: u64,
        block_bytes: usize,
        cache_bytes_max: u64,
    ) -> ChecksumTable {
        let pages_max = (cache_bytes_max / PAGE_RAM_BYTES).clamp(1, 1 << 40) as usize;
        let shards = pages_max.min(SHARDS_MAX);
        ChecksumTable {
            epochs: SyncEpochs::none(),
            pages_writer: Mutex::new(()),
            base,
            shards: (0..shards).map(|_| Mutex::new(Shard::default())).collect(),
            pages_per_shard_max: pages_max / shards,
            blocks,
            offset,
            zero_crc: zero_block_crc(block_bytes),
            error: Mutex::new(None),
        }
    }

    /// The entry of block `index`; None where it is unknown: its page is
    /// not resident and cannot be read (no device, or an I/O error, which
    /// is latched).
    pub fn get(&self, index: u64) -> Option<u32> {
        assert!(index < self.blocks);
        let (page_number, slot) = split(index);
        let mut shard = self.shard(page_number);
        if let Some(page) = shard.pages.get_mut(&page_number) {
            page.referenced = true;
            if !page.is_known(slot) {
                let stored = self.read_page(page_number)?;
                page.merge_under(&stored, self.zero_crc);
            }
            return Some(page.entries[slot]);
        }
        let page = match &self.base {
            Base::Zero => return Some(self.zero_crc),
            Base::Unknown => return None,
            Base::Device { .. } => {
                let stored = self.read_page(page_number)?;
                let mut page = Page::partial();
                page.merge_under(&stored, self.zero_crc);
                page
            }
        };
        let crc = page.entries[slot];
        self.insert(&mut shard, page_number, page);
        Some(crc)
    }

    /// Records the checksum of block `index`. Never reads the device.
    pub fn set(&self, index: u64, crc: u32) {
        assert!(index < self.blocks);
        let (page_number, slot) = split(index);
        let mut shard = self.shard(page_number);
        if !shard.pages.contains_key(&page_number) {
            let page = match self.base {
                Base::Zero => Page::filled(self.zero_crc),
                Base::Device { .. } | Base::Unknown => Page::partial(),
            };
            self.insert(&mut shard, page_number, page);
        }
        let page = shard.pages.get_mut(&page_number).expect("inserted above");
        page.entries[slot] = crc;
        if let Some(mask) = page.known.as_mut() {
            mask[slot / 64] |= 1 << (slot % 64);
        }
        page.dirty = true;
        page.referenced = true;
        page.epoch = page.epoch.max(self.epochs.now());
        page.version += 1;
    }

    pub fn set_zero(&self, index: u64) {
        self.set(index, self.zero_crc);
    }

    /// Every entry back to "zero block" on a wiped device: the caller has
    /// made the table's area read as zeros (`install_replacement`
    /// discards the whole device), so every page is forgotten unwritten,
    /// and so is a latched error (it was the old device's).
    pub fn reset_zeroed(&self) {
        self.forget_resident();
    }

    /// Forgets every resident page, dirty or not, and a latched error:
    /// entries are read from the device in the slot again on demand (a
    /// member re-added with what its own table area holds).
    pub fn forget_resident(&self) {
        for shard in &self.shards {
            *shard.lock().unwrap() = Shard::default();
        }
        *self.error.lock().unwrap() = None;
    }

    /// A copy of the resident entries, with no page dirty and no device:
    /// what a replaced device's blocks should decode to until the rebuild
    /// rewrites them. Entries not resident here read as unknown there.
    pub fn duplicate(&self) -> ChecksumTable {
        let copy = ChecksumTable {
            epochs: SyncEpochs::none(),
            pages_writer: Mutex::new(()),
            base: Base::Unknown,
            shards: (0..self.shards.len())
                .map(|_| Mutex::new(Shard::default()))
                .collect(),
            pages_per_shard_max: self.pages_per_shard_max,
            blocks: self.blocks,
            offset: self.offset,
            zero_crc: self.zero_crc,
            error: Mutex::new(None),
        };
        for (from, to) in self.shards.iter().zip(&copy.shards) {
            let from = from.lock().unwrap();
            let mut to = to.lock().unwrap();
            for (&number, page) in &from.pages {
                let page = Page {
                    entries: page.entries.clone(),
                    known: page.known.clone(),
                    dirty: false,
                    referenced: false,
                    epoch: 0,
                    version: 0,
                    in_flight: false,
                };
                to.pages.insert(number, page);
                to.clock.push_back(number);
            }
        }
        copy
    }

    /// RAM held by resident pages.
    pub fn ram_bytes(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| {
                s.lock()
                    .unwrap()
                    .pages
                    .values()
                    .map(Page::ram_bytes)
                    .sum::<u64>()
            })
            .sum()
    }

    /// Writes every page changed since the last flush to `dev` (a partial
    /// page is read and merged first). Returns the latched error, if any.
    /// Each page is written under its shard's lock, so a concurrent `set`
    /// either lands before the page is encoded or leaves it dirty again.
    pub fn flush(&self, dev: &dyn Device, counters: &DeviceCounters) -> io::Result<()> {
        self.check_latched()?;
        let mut buf = vec![0u8; PAGE_BYTES];
        for shard in &self.shards {
            let dirty: Vec<u64> = {
                let s = shard.lock().unwrap();
                s.pages
                    .iter()
                    .filter(|(_, p)| p.dirty)
                    .map(|(&n, _)| n)
                    .collect()
            };
            for number in dirty {
                let mut s = shard.lock().unwrap();
                let Some(page) = s.pages.get_mut(&number) else {
                    continue; // evicted, so written, meanwhile
                };
                if page.dirty {
                    // A full file system is not latched: the page stays
                    // dirty and the next flush writes it once space is back.
                    self.write_page(dev, counters, number, page, &mut buf)
                        .inspect_err(|e| {
                            if !super::Array::is_space_error(e) {
                                self.latch(e)
                            }
                        })?;
                }
            }
        }
        Ok(())
    }

    /// The first half of a flush whose page writes go to the device in a
    /// batch with other devices' ([`Array::sync_devices`]: one round trip
    /// to remote chunks, not one per page): every dirty page encoded (a
    /// partial one merged under the device's copy first, read here) and
    /// marked in flight until [`DirtyPages::finish`]. Entries set after
    /// this are not in the bytes, and leave their pages dirty.
    pub fn dirty_pages(
        &self,
        dev: &dyn Device,
        counters: &DeviceCounters,
    ) -> io::Result<DirtyPages<'_>> {
        self.check_latched()?;
        let mut held = DirtyPages {
            table: self,
            _writer: self.pages_writer.lock().unwrap(),
            pages: Vec::new(),
        };
        for shard in &self.shards {
            let mut shard = shard.lock().unwrap();
            let mut numbers: Vec<u64> = shard
                .pages
                .iter()
                .filter(|(_, p)| p.dirty)
                .map(|(&n, _)| n)
                .collect();
            numbers.sort_unstable();
            for number in numbers {
                let page = shard.pages.get_mut(&number).expect("listed above");
                let mut buf = vec![0u8; PAGE_BYTES];
                let encoded = self.encode_page(dev, counters, number, page, &mut buf);
                let at = match encoded {
                    Ok(at) => at,
                    Err(e) => {
                        self.latch(&e);
                        drop(shard);
                        // The pages marked so far are no longer on their way.
                        let _ = held.finish(Err(copy_of(&e)), counters);
                        return Err(e);
                    }
                };
                page.in_flight = true;
                held.pages.push((number, at, buf, page.version));
            }
        }
        held.pages.sort_by_key(|(_, at, _, _)| *at);
        Ok(held)
    }

    fn check_latched(&self) -> io::Result<()> {
        match self.error.lock().unwrap().as_ref() {
            Some((kind, msg)) => Err(io::Error::new(
                *kind,
                format!("checksum table: an earlier I/O error: {msg}"),
            )),
            None => Ok(()),
        }
    }

    fn latch(&self, e: &io::Error) {
        self.error
            .lock()
            .unwrap()
            .get_or_insert_with(|| (e.kind(), e.to_string()));
    }

    fn shard(&self, page_number: u64) -> std::sync::MutexGuard<'_, Shard> {
        self.shards[(page_number % self.shards.len() as u64) as usize]
            .lock()
            .unwrap()
    }

    /// The device behind the table, when pages can be read from it and
    /// written back to it.
    fn device(&self) -> Option<(Arc<dyn Device>, &DeviceCounters)> {
        match &self.base {
            Base::Device { slot, counters } if self.error.lock().unwrap().is_none() => {
                let dev = slot.read().unwrap().clone()?;
                Some((dev, counters.as_ref()))
            }
            _ => None,
        }
    }

    /// The stored bytes of page `page_number`, or None (no device, or an
    /// error, latched).
    fn read_page(&self, page_number: u64) -> Option<Vec<u8>> {
        let (dev, counters) = self.device()?;
        let mut buf = vec![0u8; PAGE_BYTES];
        let at = self.page_offset(page_number);
        match within(Scope::Checksums, || dev.read_at(&mut buf, at)) {
            Ok(()) => {
                counters.read(IoClass::Metadata, PAGE_BYTES);
                Some(buf)
            }
            Err(e) => {
                self.latch(&e);
                None
            }
        }
    }

    fn page_offset(&self, page_number: u64) -> u64 {
        self.offset + page_number * PAGE_BYTES as u64
    }

    /// Writes a dirty page (merging a partial one under the device's copy
    /// first) and marks it clean.
    fn write_page(
        &self,
        dev: &dyn Device,
        counters: &DeviceCounters,
        page_number: u64,
        page: &mut Page,
        buf: &mut [u8],
    ) -> io::Result<()> {
        let at = self.encode_page(dev, counters, page_number, page, buf)?;
        within(Scope::Checksums, || dev.write_at(buf, at))?;
        counters.write(IoClass::Metadata, buf.len());
        page.dirty = false;
        Ok(())
    }

    /// Encodes `page` into `buf` as it is to be written, a partial page
    /// merged under the device's copy first (read here); returns its
    /// device offset.
    fn encode_page(
        &self,
        dev: &dyn Device,
        counters: &DeviceCounters,
        page_number: u64,
        page: &mut Page,
        buf: &mut [u8],
    ) -> io::Result<u64> {
        let at = self.page_offset(page_number);
        if page.known.is_some() {
            within(Scope::Checksums, || dev.read_at(buf, at))?;
            counters.read(IoClass::Metadata, buf.len());
            page.merge_under(buf, self.zero_crc);
        }
        page.encode(self.zero_crc, buf);
        Ok(at)
    }

    /// Adds a page to its shard, first evicting pages past the bound when
    /// they can be read back.
    fn insert(&self, shard: &mut Shard, page_number: u64, page: Page) {
        if shard.pages.len() >= self.pages_per_shard_max {
            if let Some((dev, counters)) = self.device() {
                self.evict(shard, dev.as_ref(), counters);
            }
        }
        shard.pages.insert(page_number, page);
        shard.clock.push_back(page_number);
    }

    /// CLOCK: passes over referenced pages (clearing the bit) and evicts
    /// until the shard has room for one page; a dirty page is written
    /// first, where the devices' syncs allow it ([`SyncEpochs`]): one they
    /// do not yet is passed over, and where nothing else could go the
    /// shard stays over its bound until the sync it asks for. Stops at an
    /// I/O error (latched; the page stays).
    fn evict(&self, shard: &mut Shard, dev: &dyn Device, counters: &DeviceCounters) {
        let mut buf = vec![0u8; PAGE_BYTES];
        let mut steps = 2 * shard.clock.len() + 1;
        while shard.pages.len() >= self.pages_per_shard_max && steps > 0 {
            steps -= 1;
            let Some(number) = shard.clock.pop_front() else {
                return;
            };
            let page = shard
                .pages
                .get_mut(&number)
                .expect("clock holds resident pages");
            if page.referenced {
                page.referenced = false;
                shard.clock.push_back(number);
                continue;
            }
            if page.in_flight {
                shard.clock.push_back(number);
                continue;
            }
            if page.dirty && !self.epochs.may_write(page.epoch) {
                self.epochs
                    .wanted
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                shard.clock.push_back(number);
                continue;
            }
            if page.dirty {
                if let Err(e) = self.write_page(dev, counters, number, page, &mut buf) {
                    self.latch(&e);
                    shard.clock.push_back(number);
                    return;
                }
            }
            shard.pages.remove(&number);
        }
    }
}

/// A copy of `e` (an I/O error is not `Clone`): its OS error where it has
/// one (a full file system stays one), else its kind and message.
pub fn copy_of(e: &io::Error) -> io::Error {
    match e.raw_os_error() {
        Some(code) => io::Error::from_raw_os_error(code),
        None => io::Error::new(e.kind(), e.to_string()),
    }
}

/// (page number, entry within the page) of block `index`.
fn split(index: u64) -> (u64, usize) {
    (
        index / ENTRIES_PER_PAGE as u64,
        (index % ENTRIES_PER_PAGE as u64) as usize,
    )
}

#[cfg(test)]
mod tests;
