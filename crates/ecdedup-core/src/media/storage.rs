//! Storage: the one interface through which every byte the store keeps on
//! disk is read, written and synced: device files and block devices, the
//! superblocks and checksum tables inside them, the write-intent map, the
//! parity journals, the dedup maps and the array's config file.
//!
//! The store never calls `std::fs` for its own state; it is handed an
//! `Arc<dyn Storage>` (TigerBeetle's `Storage` parameter, redb's
//! `StorageBackend`), so the same code runs over the real file system
//! ([`OsStorage`]) and over the power-loss simulator
//! ([`super::powerloss::PowerLossStorage`]), which can drop, keep, reorder
//! or tear every write not yet synced.
//!
//! The contract is POSIX's, taken strictly, because that is what a power
//! loss enforces:
//! - a write is durable only after [`StorageFile::sync`] of its file returns
//!   `Ok`; until then it may be lost, kept, torn at any sector, or reach the
//!   media after a later write;
//! - a name (create, rename, remove) is durable only after
//!   [`Storage::sync_dir`] of its parent folder;
//! - an error from `sync` means the unsynced writes may be gone whatever a
//!   later `sync` says: the caller latches it (Linux forgets it).

use std::any::Any;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A file (or block device) opened through a [`Storage`].
pub trait StorageFile: Send + Sync {
    /// Reads exactly `buf.len()` bytes at `offset` (`UnexpectedEof` past
    /// the end).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Reads `buf.len()` bytes at `offset` from a copy of the file whose
    /// bytes `accept` takes; returns whether one did (`buf` then holds
    /// them). A file of one copy (the default) reads once; a mirrored file
    /// (`array::meta`) tries its copies in read order, for bytes a copy
    /// may lack that the caller can check (a degraded-write log's value
    /// against the checksum it was logged with).
    fn read_at_accepted(
        &self,
        buf: &mut [u8],
        offset: u64,
        accept: &dyn Fn(&[u8]) -> bool,
    ) -> io::Result<bool> {
        self.read_at(buf, offset)?;
        Ok(accept(buf))
    }
    /// Writes all of `buf` at `offset`, extending a regular file if needed.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Current length in bytes (a block device's size).
    fn len(&self) -> io::Result<u64>;
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }
    /// Truncates or extends (with zeroes) to `len` bytes.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Makes every completed write (and the length) durable: `fdatasync`.
    fn sync(&self) -> io::Result<()>;
    /// Writes all of `buf` at `offset`, durable (with the length it gives
    /// the file) before it returns; other writes are left as they are.
    /// Default: `write_at`, then `sync`. A file in a device's metadata
    /// area writing below its durable length sends one FUA write per run
    /// (`media::area`): one round trip to a chunk across the network, not
    /// a write and a flush.
    fn write_durable(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_at(buf, offset)?;
        self.sync()
    }
    /// For a file inside a device's metadata area, whose device a flush
    /// syncs with the others in one batch: what a sync of that device
    /// issued from now on makes durable of this file, for
    /// [`StorageFile::sync_after_device_sync`] once it has. Taken before
    /// the device's sync is issued, never after: a write that completes
    /// between the two may not be on the media. None (the default): a file
    /// of its own, which only its own `sync` makes durable.
    fn sync_point(&self) -> Option<SyncPoint> {
        None
    }
    /// [`StorageFile::sync`] where the caller took `point`
    /// ([`StorageFile::sync_point`]) and then synced the device the file
    /// lies on: what is left of the sync. The file counts durable what it
    /// held at the point, not what it holds now. Default: the whole sync.
    fn sync_after_device_sync(&self, point: SyncPoint) -> io::Result<()> {
        let _ = point;
        self.sync()
    }
    /// [`StorageFile::sync`] that counts durable no byte at or past `bound`
    /// (a parity journal's mark held until the writes it stands for are
    /// answered): the bytes past it are made durable all the same, but
    /// the file's synced length (a metadata area's directory) stops
    /// there. Default: the whole sync (a file that records no length).
    fn sync_below(&self, bound: u64) -> io::Result<()> {
        let _ = bound;
        self.sync()
    }
    /// Reserves space for `len` bytes without changing the length
    /// (`fallocate(KEEP_SIZE)`), so later writes below it cannot hit a full
    /// file system.
    fn reserve(&self, len: u64) -> io::Result<()>;
    /// `[offset, offset+len)` reads as zeroes afterwards and its space may
    /// be released (hole punching on files; on block devices as `zero_range`).
    fn punch(&self, offset: u64, len: u64) -> io::Result<()>;
    /// `[offset, offset+len)` reads as zeroes afterwards and stays
    /// allocated, so writes there cannot meet a full file system:
    /// `FALLOC_FL_ZERO_RANGE` on files; on block devices the device's
    /// write-zeroes command, which may unmap the range (flash is not
    /// worn), and `BLKZEROOUT` only where there is none. Default: zeroes
    /// written.
    fn zero_range(&self, offset: u64, len: u64) -> io::Result<()> {
        write_zeroes_to(self, offset, len)
    }
    /// Allocates the file's first `len` bytes and sets its length to at
    /// least `len` (`fallocate` mode 0): a device file that is not sparse.
    fn allocate(&self, len: u64) -> io::Result<()> {
        if self.len()? < len {
            self.set_len(len)?;
        }
        self.reserve(len)
    }
    fn is_block_device(&self) -> bool {
        false
    }
    /// The descriptors a batch engine may read and write directly
    /// ([`super::batch`]); `None` (the default, as for the power-loss
    /// simulator) makes a batch loop through `read_at`/`write_at`/`sync`.
    fn ring_file(&self) -> Option<RingFile> {
        None
    }
    /// For a file inside a device's metadata area ([`super::area`]): makes
    /// room for `[offset, offset + len)` and says where those bytes lie on
    /// the device, so that a batch of device I/O ([`super::batch`]) can
    /// write them beside other device writes; the writer then calls
    /// [`StorageFile::placed_written`]. None (the default): a file of its
    /// own, written through `write_at` or [`StorageFile::ring_file`].
    fn place_write(&self, offset: u64, len: u64) -> Option<io::Result<PlacedWrite>> {
        let _ = (offset, len);
        None
    }
    /// A placed write up to `end` completed: the file is at least `end`
    /// bytes long.
    fn placed_written(&self, end: u64) {
        let _ = end;
    }
    /// How many of the file's first bytes were durable before anything
    /// written since its last [`StorageFile::sync`]: bytes past it were
    /// written after that sync and found only because they reached the
    /// media anyway (a metadata area's length hints, [`super::area`]).
    /// Counted from the file's open in this process's storage (a sync
    /// since raises it). None (the default): not known, as for a file of
    /// its own, whose length says nothing of its last sync.
    fn synced_len(&self) -> Option<u64> {
        None
    }
    /// For a file inside a device's metadata area: where its bytes
    /// `[offset, offset + len)` lie on the device, so that a batch can read
    /// them beside other reads (one round trip to a remote chunk for many
    /// blocks); an error past the file's end, as [`StorageFile::read_at`]
    /// gives. None (the default): read through `read_at`.
    fn place_read(&self, offset: u64, len: u64) -> Option<io::Result<PlacedRead>> {
        let _ = (offset, len);
        None
    }
    /// [`StorageFile::sync_after_device_sync`] in two steps, for a file
    /// inside a device's metadata area: the lengths raised and the
    /// directory's commit made ready (None inside: nothing changed, the
    /// sync is done), its durable write left to the caller, who makes it
    /// beside other writes and then finishes it
    /// ([`super::area::PreparedCommit`]). None (the default, and a point
    /// the file cannot finish so): the caller calls
    /// `sync_after_device_sync`.
    fn prepare_sync_after_device_sync(
        &self,
        point: SyncPoint,
    ) -> Option<io::Result<Option<super::area::PreparedCommit<'_>>>> {
        let _ = point;
        None
    }
    /// Where this file lives, for messages.
    fn describe(&self) -> String;
}

/// What a sync of the device under a file makes durable of the file
/// ([`StorageFile::sync_point`]): its bytes below `len`, every write there
/// completed when the point was taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncPoint {
    /// The file's length at the point.
    pub len: u64,
    /// The file's truncations by then: after another one, the point says
    /// nothing of what the file holds.
    pub truncations: u64,
}

/// Where a file's bytes lie on a device ([`StorageFile::place_write`]).
pub struct PlacedWrite {
    pub dev: Arc<dyn super::Device>,
    /// (device offset, bytes), in the order of the file's bytes.
    pub runs: Vec<(u64, usize)>,
    /// The file's length hint for the new length: (device offset, bytes),
    /// written after the runs (before them, a killed process's open would
    /// find zeroes at the end and cut them as a torn tail).
    pub hint: Option<(u64, [u8; 32])>,
}

/// Where a file's bytes lie on a device ([`StorageFile::place_read`]).
pub struct PlacedRead {
    pub dev: Arc<dyn super::Device>,
    /// (device offset, bytes), in the order of the file's bytes.
    pub runs: Vec<(u64, usize)>,
}

/// A real file's descriptors, for the io_uring engine: valid while the
/// file they were taken from is alive.
#[derive(Clone, Copy, Debug)]
pub struct RingFile {
    /// Buffered descriptor: unaligned I/O and `fdatasync`.
    pub fd: std::os::unix::io::RawFd,
    /// The `O_DIRECT` descriptor, for block-aligned I/O from aligned memory.
    pub direct_fd: Option<std::os::unix::io::RawFd>,
}

/// Held while a folder is locked; dropping it releases the lock.
pub type StorageLock = Box<dyn Any + Send + Sync>;

/// A namespace of files: the real file system or a simulator.
pub trait Storage: Send + Sync {
    /// Opens an existing file or block device for reading and writing.
    fn open(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>>;
    /// Opens a device file or block device, exclusively: another process
    /// that has it open as a device makes this fail with `ResourceBusy`
    /// (a lock on files, `O_EXCL` on block devices); `direct` bypasses the
    /// page cache (`O_DIRECT`) for block-aligned I/O. Default:
    /// [`Storage::open`].
    fn open_device(&self, path: &Path, direct: bool) -> io::Result<Arc<dyn StorageFile>> {
        let _ = direct;
        self.open(path)
    }
    /// Creates a file, or opens it if it exists; `truncate` empties it.
    fn create(&self, path: &Path, truncate: bool) -> io::Result<Arc<dyn StorageFile>>;
    fn exists(&self, path: &Path) -> bool;
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Replaces `to` by `from` atomically (durable after `sync_dir`).
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;
    /// Makes the names in folder `path` durable.
    fn sync_dir(&self, path: &Path) -> io::Result<()>;
    /// Takes an exclusive lock on `path` (created if missing) for this
    /// process; `Ok(None)` when another holder has it.
    fn try_lock(&self, path: &Path) -> io::Result<Option<StorageLock>>;
    /// Replaces the content of `path` (created if missing) by `bytes`,
    /// atomically and durably: once it returns a crash leaves the new
    /// content, before that the old (or no file) or the new, never a mix.
    /// Default: [`write_atomic_by_rename`]; a metadata area does it with
    /// one durable write and one directory commit (`AreaFs::replace_file`).
    fn write_atomic(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        write_atomic_by_rename(self, path, bytes)
    }
    /// Names of the plain files in folder `path` as reads see them now
    /// (names not yet made durable by [`Storage::sync_dir`] included),
    /// sorted; `NotFound` when the folder does not exist. Sub-folders and
    /// other entries are left out. Default: `Unsupported`.
    fn list_files(&self, path: &Path) -> io::Result<Vec<String>> {
        let _ = path;
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this storage cannot list a folder",
        ))
    }
    /// Whether `path` is an existing folder. Default: whether it can be
    /// listed.
    fn is_dir(&self, path: &Path) -> bool {
        self.list_files(path).is_ok()
    }
    /// Removes the empty folder `path` (durable after `sync_dir` of its
    /// parent). Default: `Unsupported`.
    fn remove_dir(&self, path: &Path) -> io::Result<()> {
        let _ = path;
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "this storage cannot remove a folder",
        ))
    }
}

/// Reads a whole file.
pub fn read_all(storage: &dyn Storage, path: &Path) -> io::Result<Vec<u8>> {
    read_file(storage.open(path)?.as_ref())
}

/// Reads the whole of an open file.
pub fn read_file(f: &dyn StorageFile) -> io::Result<Vec<u8>> {
    let len = f.len()?;
    let len = usize::try_from(len).map_err(|_| io::Error::other("file too large to read"))?;
    let mut buf = vec![0u8; len];
    f.read_at(&mut buf, 0)?;
    Ok(buf)
}

/// Replaces a file atomically and durably ([`Storage::write_atomic`]): a
/// crash leaves the old or the new content, never a mix.
pub fn write_atomic(storage: &dyn Storage, path: &Path, bytes: &[u8]) -> io::Result<()> {
    storage.write_atomic(path, bytes)
}

/// [`Storage::write_atomic`] as any folder takes it: a temporary file,
/// synced, renamed over `path`, and the folder synced.
pub fn write_atomic_by_rename<S: Storage + ?Sized>(
    storage: &S,
    path: &Path,
    bytes: &[u8],
) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let f = storage.create(&tmp, true)?;
    f.write_at(bytes, 0)?;
    f.sync()?;
    drop(f);
    storage.rename(&tmp, path)?;
    storage.sync_dir(parent_of(path))
}

/// The folder holding `path` (`.` for a bare name).
pub fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// The real file system, through `std::fs` and positioned I/O.
#[derive(Clone, Copy, Debug, Default)]
pub struct OsStorage;

impl OsStorage {
    pub fn shared() -> Arc<dyn Storage> {
        Arc::new(OsStorage)
    }
}

/// A file or block device of the real file system.
pub struct OsFile {
    file: File,
    /// The same file opened with `O_DIRECT`, for block-aligned I/O
    /// (`--io direct`); other I/O goes through `file`, which the kernel
    /// keeps coherent with it.
    direct: Option<File>,
    path: PathBuf,
    is_block_device: bool,
    /// The exclusive lock on a device file, shared by every handle of
    /// this process on it ([`DeviceLock`]); `None` for other files.
    _lock: Option<Arc<DeviceLock>>,
}

/// An exclusive `flock` on a device file, held while any handle of this
/// process has the file open as a device: a second process (another
/// server, an `assemble` into another folder) is refused with the
/// device's name, while this process may open it again (a replace of the
/// same path, a test that looks at it). Block devices are held by
/// `O_EXCL` instead, which the kernel enforces for every opener.
pub struct DeviceLock {
    _lock: FileLock,
}

/// The locks this process holds, by (st_dev, st_ino) of the device file.
type DeviceLocks =
    std::sync::Mutex<std::collections::HashMap<(u64, u64), std::sync::Weak<DeviceLock>>>;

fn device_locks() -> &'static DeviceLocks {
    static LOCKS: std::sync::OnceLock<DeviceLocks> = std::sync::OnceLock::new();
    LOCKS.get_or_init(Default::default)
}

impl DeviceLock {
    /// This process's lock on the device file `file` (opened from `path`),
    /// taken now or shared with an earlier handle; `ResourceBusy` naming
    /// `path` when another process holds it.
    fn take(file: &File, path: &Path) -> io::Result<Arc<DeviceLock>> {
        use std::os::unix::fs::MetadataExt;
        let meta = file.metadata()?;
        let key = (meta.dev(), meta.ino());
        let mut locks = device_locks().lock().unwrap();
        if let Some(held) = locks.get(&key).and_then(std::sync::Weak::upgrade) {
            return Ok(held);
        }
        let Some(own) = FileLock::try_on(file.try_clone()?)? else {
            return Err(io::Error::new(
                io::ErrorKind::ResourceBusy,
                format!(
                    "{} is in use by another process (a server or another array holds \
                     its lock); stop it first",
                    path.display()
                ),
            ));
        };
        let lock = Arc::new(DeviceLock { _lock: own });
        locks.retain(|_, w| w.strong_count() > 0);
        locks.insert(key, Arc::downgrade(&lock));
        Ok(lock)
    }
}

/// Alignment of `O_DIRECT` offsets, lengths and buffers: the largest
/// logical block size in use (4 KiB sector drives).
pub const DIRECT_ALIGN_BYTES: usize = 4096;

/// A buffer aligned for `O_DIRECT` (the bounce buffer of a transfer whose
/// memory is not aligned), of a power-of-two size class of at least
/// [`DIRECT_ALIGN_BYTES`]. Buffers of up to [`BOUNCE_POOL_CLASS_MAX`] are
/// taken from and given back to a pool holding at most
/// [`BOUNCE_POOL_BYTES_MAX`], so a steady stream of unaligned requests
/// allocates, zeroes and faults in no memory per request (the allocation
/// was 17% of the server's CPU under 1 MiB writes: docs/benchmarks.md,
/// "Where the CPU goes"). Its bytes are initialised: zeros when new, else
/// what an earlier transfer left, which every user overwrites before it
/// reads them (a read fills the whole slice or fails).
pub(crate) struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
}

// SAFETY: the buffer owns its memory exclusively; it is plain bytes.
unsafe impl Send for AlignedBuf {}

/// Largest bounce buffer kept for reuse; bigger ones are freed.
pub(crate) const BOUNCE_POOL_CLASS_MAX: usize = 4 << 20;
/// Most bytes of bounce buffers the pool keeps (the RAM it may hold idle).
pub(crate) const BOUNCE_POOL_BYTES_MAX: usize = 32 << 20;

/// Free bounce buffers by size class, and the bytes they hold.
struct BouncePool {
    free: Vec<Vec<AlignedBuf>>,
    bytes: usize,
}

static BOUNCE_POOL: std::sync::Mutex<BouncePool> = std::sync::Mutex::new(BouncePool {
    free: Vec::new(),
    bytes: 0,
});

fn bounce_pool() -> std::sync::MutexGuard<'static, BouncePool> {
    BOUNCE_POOL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Bytes the pool holds idle now.
impl BouncePool {
    /// A free buffer of `class` (`size` bytes), if one is kept.
    fn take(&mut self, class: usize, size: usize) -> Option<AlignedBuf> {
        let buf = self.free.get_mut(class).and_then(|v| v.pop())?;
        self.bytes -= size;
        Some(buf)
    }

    /// Keeps `buf` for reuse, or gives it back when it is too big or the
    /// pool is full.
    fn keep(&mut self, buf: AlignedBuf) -> Result<(), AlignedBuf> {
        let size = buf.layout.size();
        if size > BOUNCE_POOL_CLASS_MAX || self.bytes + size > BOUNCE_POOL_BYTES_MAX {
            return Err(buf);
        }
        let (class, _) = size_class(size);
        if self.free.len() <= class {
            self.free.resize_with(class + 1, Vec::new);
        }
        self.bytes += size;
        self.free[class].push(buf);
        Ok(())
    }
}

fn size_class(len: usize) -> (usize, usize) {
    let size = len.max(DIRECT_ALIGN_BYTES).next_power_of_two();
    let class = (size / DIRECT_ALIGN_BYTES).trailing_zeros() as usize;
    (class, size)
}

impl AlignedBuf {
    pub(crate) fn new(len: usize) -> AlignedBuf {
        let (class, size) = size_class(len);
        if size <= BOUNCE_POOL_CLASS_MAX {
            if let Some(buf) = bounce_pool().take(class, size) {
                return buf;
            }
        }
        AlignedBuf::allocate(size)
    }

    /// A new zeroed buffer of `size` bytes (a power of two).
    fn allocate(size: usize) -> AlignedBuf {
        let layout =
            std::alloc::Layout::from_size_align(size, DIRECT_ALIGN_BYTES).expect("aligned layout");
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr =
            std::ptr::NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, layout }
    }

    pub(crate) fn as_mut_slice(&mut self, len: usize) -> &mut [u8] {
        assert!(len <= self.layout.size());
        // SAFETY: `ptr` owns `layout.size()` initialised bytes.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let this = AlignedBuf {
            ptr: self.ptr,
            layout: self.layout,
        };
        if let Err(back) = bounce_pool().keep(this) {
            std::mem::forget(back);
            // SAFETY: allocated in `allocate` with this layout; the pool
            // did not keep it.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
        }
    }
}

/// `len` bytes of a pooled [`AlignedBuf`]: the array's scratch memory on
/// its hot paths (units read, parity encoded). An `O_DIRECT` transfer uses
/// it as it is, without a bounce copy, and it is neither allocated nor
/// zeroed per request. Its bytes start as an earlier user left them (zeros
/// when new), so each user overwrites all of them before reading them: a
/// read fills the whole slice or fails, an encode writes all its parity.
pub(crate) struct ScratchBuf {
    buf: AlignedBuf,
    len: usize,
}

impl ScratchBuf {
    pub(crate) fn new(len: usize) -> ScratchBuf {
        ScratchBuf {
            buf: AlignedBuf::new(len),
            len,
        }
    }
}

impl std::ops::Deref for ScratchBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` owns at least `len` initialised bytes (`new`).
        unsafe { std::slice::from_raw_parts(self.buf.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for ScratchBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.buf.as_mut_slice(self.len)
    }
}

pub(crate) fn direct_aligned(offset: u64, len: usize) -> bool {
    len > 0
        && offset.is_multiple_of(DIRECT_ALIGN_BYTES as u64)
        && len.is_multiple_of(DIRECT_ALIGN_BYTES)
}

/// An `O_DIRECT` transfer of aligned offset, length and memory that fails
/// with EINVAL: the file system refuses direct I/O (a FUSE file system
/// opens with `O_DIRECT` and then fails every such read). Said so, with
/// the way out; the error carries no EINVAL (an invalid request, for an
/// NBD client), so it reaches clients as an I/O error. Applied where the
/// device knows it asked for direct I/O, whatever the [`Storage`]:
/// [`super::FileDevice`]'s transfers and the io_uring completions
/// ([`super::batch`]).
pub(crate) fn direct_refused(e: io::Error, path: &Path) -> io::Error {
    if e.raw_os_error() != Some(libc::EINVAL) {
        return e;
    }
    io::Error::other(format!(
        "the file system under {} refuses direct I/O (O_DIRECT): \
         use `--io buffered` there (`create --io buffered`; an existing array: \
         \"io\": \"buffered\" in array.json)",
        path.display()
    ))
}

/// Bytes moved through one bounce buffer at a time.
const BOUNCE_BYTES_MAX: usize = 1 << 20;

const BLKZEROOUT: libc::c_ulong = 0x127f; // _IO(0x12, 127)

impl OsFile {
    fn new(file: File, path: &Path) -> io::Result<OsFile> {
        let meta = file.metadata()?;
        let is_block_device = meta.file_type().is_block_device();
        if !is_block_device && !meta.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file or block device",
            ));
        }
        Ok(OsFile {
            file,
            direct: None,
            path: path.to_owned(),
            is_block_device,
            _lock: None,
        })
    }

    fn ioctl_range(&self, request: libc::c_ulong, offset: u64, len: u64) -> io::Result<()> {
        let range: [u64; 2] = [offset, len];
        // SAFETY: BLKZEROOUT reads two u64 (start, length) from the pointer.
        let rc = unsafe { libc::ioctl(self.file.as_raw_fd(), request as _, range.as_ptr()) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    fn fallocate(&self, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
        // SAFETY: fallocate on a valid descriptor with in-range arguments.
        let rc = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                mode,
                offset as libc::off_t,
                len as libc::off_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

impl StorageFile for OsFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let Some(direct) = self
            .direct
            .as_ref()
            .filter(|_| direct_aligned(offset, buf.len()))
        else {
            return self.file.read_exact_at(buf, offset);
        };
        if (buf.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN_BYTES) {
            return direct.read_exact_at(buf, offset);
        }
        let mut bounce = AlignedBuf::new(buf.len().min(BOUNCE_BYTES_MAX));
        for (i, chunk) in buf.chunks_mut(BOUNCE_BYTES_MAX).enumerate() {
            let b = bounce.as_mut_slice(chunk.len());
            direct.read_exact_at(b, offset + (i * BOUNCE_BYTES_MAX) as u64)?;
            chunk.copy_from_slice(b);
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let Some(direct) = self
            .direct
            .as_ref()
            .filter(|_| direct_aligned(offset, buf.len()))
        else {
            return self.file.write_all_at(buf, offset);
        };
        if (buf.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN_BYTES) {
            return direct.write_all_at(buf, offset);
        }
        let mut bounce = AlignedBuf::new(buf.len().min(BOUNCE_BYTES_MAX));
        for (i, chunk) in buf.chunks(BOUNCE_BYTES_MAX).enumerate() {
            let b = bounce.as_mut_slice(chunk.len());
            b.copy_from_slice(chunk);
            direct.write_all_at(b, offset + (i * BOUNCE_BYTES_MAX) as u64)?;
        }
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        if self.is_block_device {
            use std::io::{Seek, SeekFrom};
            let mut f = &self.file;
            f.seek(SeekFrom::End(0))
        } else {
            Ok(self.file.metadata()?.len())
        }
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn reserve(&self, len: u64) -> io::Result<()> {
        self.fallocate(libc::FALLOC_FL_KEEP_SIZE, 0, len)
    }

    fn punch(&self, offset: u64, len: u64) -> io::Result<()> {
        if self.is_block_device {
            // BLKDISCARD does not promise zeroes on every device; the
            // write-zeroes offload of zero_range does, and may unmap.
            return self.zero_range(offset, len);
        }
        self.fallocate(
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset,
            len,
        )
    }

    fn zero_range(&self, offset: u64, len: u64) -> io::Result<()> {
        let r = if self.is_block_device {
            // Write-zeroes offloaded to the device, which may unmap the
            // range (fallocate PUNCH_HOLE|KEEP_SIZE on a block device is the
            // kernel's BLKDEV_ZERO_NOFALLBACK: never a write of zeroes, and
            // the range reads zero after it). Only a device that offers no
            // such command gets BLKZEROOUT, which the kernel may carry out
            // by writing zeroes.
            match self.fallocate(
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset,
                len,
            ) {
                Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP)) => {
                    self.ioctl_range(BLKZEROOUT, offset, len)
                }
                r => r,
            }
        } else {
            self.fallocate(
                libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
                offset,
                len,
            )
        };
        match r {
            // Not offered by this file system or device: write the zeroes.
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EOPNOTSUPP) | Some(libc::ENOTTY)
                ) =>
            {
                write_zeroes_to(self, offset, len)
            }
            r => r,
        }
    }

    fn allocate(&self, len: u64) -> io::Result<()> {
        if self.is_block_device {
            return Ok(());
        }
        self.fallocate(0, 0, len)
    }

    fn is_block_device(&self) -> bool {
        self.is_block_device
    }

    fn ring_file(&self) -> Option<RingFile> {
        Some(RingFile {
            fd: self.file.as_raw_fd(),
            direct_fd: self.direct.as_ref().map(|d| d.as_raw_fd()),
        })
    }

    fn describe(&self) -> String {
        self.path.display().to_string()
    }
}

/// Writes zeroes over a range, 1 MiB at a time.
pub fn write_zeroes_to<F: StorageFile + ?Sized>(f: &F, offset: u64, len: u64) -> io::Result<()> {
    let zero = vec![0u8; len.min(1 << 20) as usize];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(zero.len() as u64) as usize;
        f.write_at(&zero[..n], offset + done)?;
        done += n as u64;
    }
    Ok(())
}

impl Storage for OsStorage {
    fn open(&self, path: &Path) -> io::Result<Arc<dyn StorageFile>> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        Ok(Arc::new(OsFile::new(file, path)?))
    }

    fn open_device(&self, path: &Path, direct: bool) -> io::Result<Arc<dyn StorageFile>> {
        use std::os::unix::fs::OpenOptionsExt;
        let block_device = std::fs::metadata(path)?.file_type().is_block_device();
        // A block device is opened exclusively (O_EXCL): the kernel refuses
        // it while mounted or held by another array, md or LVM.
        let excl = if block_device { libc::O_EXCL } else { 0 };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(excl)
            .open(path)
            .map_err(|e| {
                if e.raw_os_error() == Some(libc::EBUSY) {
                    io::Error::new(
                        io::ErrorKind::ResourceBusy,
                        format!(
                            "{} is in use (mounted, or held by md, LVM or another array)",
                            path.display()
                        ),
                    )
                } else {
                    e
                }
            })?;
        let mut f = OsFile::new(file, path)?;
        if !f.is_block_device {
            f._lock = Some(DeviceLock::take(&f.file, path)?);
        }
        if direct {
            let d = OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_DIRECT)
                .open(path)
                .map_err(|e| {
                    if e.raw_os_error() == Some(libc::EINVAL) {
                        io::Error::new(
                            io::ErrorKind::InvalidInput,
                            "this file system refuses O_DIRECT (tmpfs does): \
                             create the array with --io buffered",
                        )
                    } else {
                        e
                    }
                })?;
            f.direct = Some(d);
        }
        Ok(Arc::new(f))
    }

    fn create(&self, path: &Path, truncate: bool) -> io::Result<Arc<dyn StorageFile>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(truncate)
            .open(path)?;
        Ok(Arc::new(OsFile::new(file, path)?))
    }

    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir_all(path)
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        File::open(path)?.sync_all()
    }

    fn try_lock(&self, path: &Path) -> io::Result<Option<StorageLock>> {
        Ok(FileLock::try_exclusive(path)?.map(|l| Box::new(l) as StorageLock))
    }

    fn list_files(&self, path: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(path)? {
            let entry = entry?;
            if entry.file_type()?.is_file() {
                names.push(entry.file_name().to_string_lossy().into_owned());
            }
        }
        names.sort();
        Ok(names)
    }

    fn is_dir(&self, path: &Path) -> bool {
        path.is_dir()
    }

    fn remove_dir(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_dir(path)
    }
}

/// An exclusive `flock` on a file, released when dropped.
///
/// The lock belongs to the open file description, which every duplicate
/// of the descriptor shares, and a child process gets a duplicate of every
/// descriptor when it is forked: close-on-exec closes it only once the
/// child execs (or exits, when its `exec` fails). Closing our descriptor
/// would leave the lock held for as long as such a child is between its
/// fork and its exec, so that a folder this process has just closed would
/// read as in use by another process when it reopens it. Dropping unlocks
/// explicitly instead (`LOCK_UN` releases the lock for every duplicate),
/// then closes. A process that forks while it holds the lock and lets the
/// child keep going (a server going into the background) is unaffected:
/// the lock lasts until it is dropped, or until every duplicate is closed.
pub struct FileLock {
    file: File,
}

impl FileLock {
    /// Takes an exclusive lock on `path` (created if missing), or None
    /// when another open file description holds it.
    pub fn try_exclusive(path: &Path) -> io::Result<Option<FileLock>> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)?;
        FileLock::try_on(file)
    }

    /// Takes an exclusive lock on an open file (its open file
    /// description), or None when another one holds it.
    pub fn try_on(file: File) -> io::Result<Option<FileLock>> {
        // SAFETY: flock on a valid descriptor.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                return Ok(None);
            }
            return Err(e);
        }
        Ok(Some(FileLock { file }))
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        // SAFETY: flock on the descriptor this struct owns. Failing, it
        // leaves the lock to the close that follows, as before.
        unsafe { libc::flock(self.file.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// What a device's first bytes say it already holds, if anything another
/// program would miss: a file system, LVM, a partition table, another
/// array. `create` refuses such a device unless `--force`.
pub fn foreign_signature(head: &[u8]) -> Option<&'static str> {
    let at = |off: usize, magic: &[u8]| head.get(off..off + magic.len()) == Some(magic);
    if at(0, b"ECDDSB01") || at(4096, b"ECDDSB01") {
        return Some("an ecdedup array member");
    }
    if at(1080, &[0x53, 0xef]) {
        return Some("an ext2/3/4 file system");
    }
    if at(0, b"XFSB") {
        return Some("an XFS file system");
    }
    if at(65600, b"_BHRfS_M") {
        return Some("a btrfs file system");
    }
    if at(512, b"LABELONE") || at(24, b"LVM2 001") || at(536, b"LVM2 001") {
        return Some("an LVM physical volume");
    }
    if at(512, b"EFI PART") {
        return Some("a GPT partition table");
    }
    if at(4096, &[0xfc, 0x4e, 0x2b, 0xa9]) {
        return Some("an md RAID member");
    }
    if at(4086, b"SWAPSPACE2") {
        return Some("a swap area");
    }
    if at(510, &[0x55, 0xaa])
        && head
            .get(446..510)
            .is_some_and(|t| t.iter().any(|&b| b != 0))
    {
        return Some("an MBR partition table");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Buffers come back in their size class, aligned and long enough; the
    /// pool never holds more than its bound or a buffer over the class cap;
    /// a kept buffer is the one handed out next in its class.
    #[test]
    fn the_bounce_pool_reuses_buffers_within_its_bounds() {
        let mut pool = BouncePool {
            free: Vec::new(),
            bytes: 0,
        };
        for len in [1, 4096, 4097, 65536, 1 << 20, (1 << 20) + 1] {
            let (class, size) = size_class(len);
            assert!(size >= len && size.is_power_of_two() && size >= DIRECT_ALIGN_BYTES);
            let mut buf = AlignedBuf::allocate(size);
            assert_eq!(buf.as_mut_slice(len).len(), len);
            let addr = buf.ptr.as_ptr() as usize;
            assert_eq!(addr % DIRECT_ALIGN_BYTES, 0);
            assert!(pool.keep(buf).is_ok());
            let again = pool.take(class, size).expect("kept");
            assert_eq!(again.ptr.as_ptr() as usize, addr, "the same buffer back");
            assert!(pool.take(class, size).is_none());
            drop(again);
        }
        // Over the class cap: never kept.
        let big = AlignedBuf::allocate(BOUNCE_POOL_CLASS_MAX * 2);
        assert!(pool.keep(big).is_err());
        // Up to the byte bound, and no further.
        let n = BOUNCE_POOL_BYTES_MAX / BOUNCE_POOL_CLASS_MAX;
        for _ in 0..n {
            assert!(pool
                .keep(AlignedBuf::allocate(BOUNCE_POOL_CLASS_MAX))
                .is_ok());
        }
        assert_eq!(pool.bytes, BOUNCE_POOL_BYTES_MAX);
        assert!(pool.keep(AlignedBuf::allocate(DIRECT_ALIGN_BYTES)).is_err());
        // Buffers given back by the test land in the shared pool: bounded.
        drop(pool);
        assert!(bounce_pool().bytes <= BOUNCE_POOL_BYTES_MAX);
    }

    #[test]
    fn a_folder_lists_its_plain_files_sorted_and_a_missing_one_is_not_found() {
        let dir = tempfile::tempdir().unwrap();
        let s = OsStorage;
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        s.create(&dir.path().join("b"), true).unwrap();
        s.create(&dir.path().join("a"), true).unwrap();
        assert_eq!(s.list_files(dir.path()).unwrap(), vec!["a", "b"]);
        assert!(s.is_dir(&dir.path().join("sub")) && !s.is_dir(&dir.path().join("a")));
        let e = s.list_files(&dir.path().join("none")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn foreign_signatures_are_recognised_and_zeroes_are_not() {
        let mut head = vec![0u8; 70 << 10];
        assert_eq!(foreign_signature(&head), None);
        head[1080] = 0x53;
        head[1081] = 0xef;
        assert_eq!(foreign_signature(&head), Some("an ext2/3/4 file system"));
        let mut head = vec![0u8; 70 << 10];
        head[512..520].copy_from_slice(b"LABELONE");
        assert_eq!(foreign_signature(&head), Some("an LVM physical volume"));
        assert_eq!(foreign_signature(&[]), None, "a short head is no signature");
    }

    /// Issue 18, item 8: a device file another process holds (here a lock
    /// taken on its own open file, as another server's would be) is
    /// refused with its name; this process may open it twice.
    #[test]
    fn a_device_file_locked_elsewhere_is_refused_and_this_process_may_reopen_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dev0");
        OsStorage
            .create(&path, true)
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
        let first = OsStorage.open_device(&path, false).unwrap();
        let again = OsStorage
            .open_device(&path, false)
            .expect("this process's own lock");
        drop((first, again));
        let other = File::open(&path).unwrap();
        // SAFETY: flock on a valid descriptor.
        let rc = unsafe { libc::flock(other.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        assert_eq!(rc, 0, "the device is free once its handles are dropped");
        let e = OsStorage
            .open_device(&path, false)
            .err()
            .expect("held elsewhere");
        assert_eq!(e.kind(), io::ErrorKind::ResourceBusy);
        assert!(e.to_string().contains("dev0"), "{e}");
        drop(other);
        OsStorage.open_device(&path, false).expect("free again");
    }

    /// A duplicate of the lock's descriptor (what a child process holds
    /// between its fork and its exec) must not keep the lock once the
    /// holder drops it.
    #[test]
    fn a_dropped_lock_is_free_although_a_duplicate_of_its_descriptor_is_open() {
        use std::os::unix::io::{FromRawFd, OwnedFd};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        let lock = OsStorage.try_lock(&path).unwrap().expect("free");
        assert!(OsStorage.try_lock(&path).unwrap().is_none(), "held");
        let file = &lock.downcast_ref::<FileLock>().expect("a FileLock").file;
        // SAFETY: dup of a valid descriptor; the new one is owned below.
        let fd = unsafe { libc::dup(file.as_raw_fd()) };
        assert!(fd >= 0, "{}", io::Error::last_os_error());
        // SAFETY: `fd` is open and owned by nothing else.
        let duplicate = unsafe { OwnedFd::from_raw_fd(fd) };
        drop(lock);
        let again = OsStorage.try_lock(&path).unwrap();
        assert!(again.is_some(), "the duplicate kept the folder locked");
        assert!(OsStorage.try_lock(&path).unwrap().is_none(), "held again");
        drop(duplicate);
    }
}
