//! Media: the bottom of the data path. A [`Device`] is a flat, fixed-size
//! byte space with positioned reads and writes and a durability barrier.
//! Files and block devices ([`FileDevice`]), memory ([`MemDevice`]) and the
//! fault-injecting test device ([`FaultyDevice`]) all run under the same code
//! above them. Every byte the store keeps on disk, device data and metadata
//! files alike, goes through one [`Storage`] ([`storage`]), so the
//! power-loss simulator ([`powerloss`]) can stand in for the disk. The
//! array hands the device I/O of one request step to [`batch::submit`],
//! which sends what lands on real files to the kernel as one io_uring
//! submission and loops through the [`Device`] methods for everything else.
//!
//! Invariants: reads and writes never extend a device (callers stay below
//! [`Device::size`]); `sync` returns only when every completed write is
//! durable. A device reports errors; it never decides what they mean.

pub mod area;
pub mod batch;
mod faulty;
mod file;
pub mod fold;
mod mem;
pub mod placement;
pub mod powerloss;
pub mod remote;
pub mod storage;

pub use batch::{submit, BatchCost, DeviceIo, Op};
pub use faulty::{FaultPlan, FaultyDevice};
pub use file::FileDevice;
pub use mem::MemDevice;
pub use placement::{PlacementDevice, PlacementFilter, Stream};
pub use powerloss::PowerLossStorage;
pub use remote::{is_fenced, ChunkLink, Fenced, LinkOp, PendingReply, RemoteDevice};
pub use storage::{OsStorage, RingFile, Storage, StorageFile};

use crate::counters::IoClass;
use std::io;

/// How device files and block devices are read and written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IoMode {
    /// Through the page cache (`pread`/`pwrite`): for file systems that
    /// refuse `O_DIRECT` (tmpfs), and the mode of arrays made before
    /// `--io` existed.
    #[default]
    Buffered,
    /// `O_DIRECT` for block-aligned I/O: the device, not the page cache,
    /// answers (what `create` chooses unless told otherwise).
    Direct,
}

impl std::str::FromStr for IoMode {
    type Err = crate::error::Error;
    fn from_str(s: &str) -> crate::error::Result<IoMode> {
        match s {
            "buffered" => Ok(IoMode::Buffered),
            "direct" => Ok(IoMode::Direct),
            other => Err(crate::error::Error::Config(format!(
                "--io {other:?} is not direct or buffered"
            ))),
        }
    }
}

impl std::fmt::Display for IoMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            IoMode::Buffered => "buffered",
            IoMode::Direct => "direct",
        })
    }
}

/// How a device file is opened and what its discard does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceOptions {
    pub io: IoMode,
    /// A sparse file: discard punches holes (space returns to the file
    /// system, and a later write may meet a full one). A preallocated file
    /// zeroes ranges in place and keeps them allocated.
    pub sparse: bool,
}

/// What a write carries, for layers below the array that treat data and
/// parity differently (the dedup policy; later, placement streams).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteHint {
    pub class: IoClass,
    /// The bytes replace content found corrupt: a layer that shares content
    /// (dedup) must restore the shared copy, not refer to it.
    pub repair: bool,
    /// Paper 003's unique / possibly-duplicate decision, for devices that
    /// place data by stream ([`placement`]); others ignore it.
    pub stream: Stream,
}

impl WriteHint {
    pub fn new(class: IoClass) -> WriteHint {
        WriteHint {
            class,
            repair: false,
            stream: Stream::Unknown,
        }
    }
}

pub trait Device: Send + Sync {
    /// Reads exactly `buf.len()` bytes at `offset`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Writes all of `buf` at `offset`.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Writes with a hint of what the bytes are. Default: `write_at`.
    fn write_hinted(&self, buf: &[u8], offset: u64, hint: WriteHint) -> io::Result<()> {
        let _ = hint;
        self.write_at(buf, offset)
    }
    /// Makes every completed write durable.
    fn sync(&self) -> io::Result<()>;
    /// Writes `buf` at `offset`, durable before it returns (a FUA write:
    /// other writes are not made durable by it). Default: `write_at`, then
    /// `sync`; a chunk across the network sends one message
    /// ([`remote::LinkOp::Write`] with `fua`), one round trip, not two.
    fn write_fua(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_at(buf, offset)?;
        self.sync()
    }
    /// Tells the device that `[offset, offset+len)` now reads as zeroes and
    /// its space may be released. The default writes zeroes.
    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        write_zeroes(self, offset, len)
    }
    /// Size in bytes.
    fn size(&self) -> u64;
    /// Where this device lives, for messages.
    fn describe(&self) -> String;
    /// The descriptors of a real file or block device that the io_uring
    /// engine ([`batch`]) addresses directly. `None`, the default, makes a
    /// batch loop through `read_at`, `write_hinted` and `sync`, so memory,
    /// fault-injecting, dedup and simulated devices need nothing more.
    fn ring_file(&self) -> Option<RingFile> {
        None
    }
    /// The connection of a device across the network ([`remote`]): a
    /// batch sends its operation with the batch's others before waiting
    /// for any reply. `None`, the default, for every local device.
    fn link(&self) -> Option<&dyn remote::ChunkLink> {
        None
    }
    /// Whether one caller's operations on this device and on its peers
    /// may run side by side, a thread each (the copies of a mirrored
    /// metadata file: `array/meta.rs`): a chunk across the network, whose
    /// link says so. Local devices keep them in turn, so a power-loss
    /// simulation's cut points stay where its seed put them.
    fn side_by_side(&self) -> bool {
        self.link().is_some_and(|l| l.side_by_side())
    }
    /// The boot id of the chunk server that holds this device's bytes:
    /// its link's for a chunk across the network, its lower device's for
    /// a layer over one (dedup), None for a local device or a link that
    /// cannot tell. What a superblock's `boot_stamp` records (a writer's
    /// open trusts a journal's marks past its sync where the server never
    /// restarted: docs/write-hole.md).
    fn server_boot_id(&self) -> Option<u64> {
        self.link().and_then(|l| l.boot_id())
    }
}

/// Writes zeroes over a range, 1 MiB at a time.
pub fn write_zeroes<D: Device + ?Sized>(dev: &D, offset: u64, len: u64) -> io::Result<()> {
    let zero = vec![0u8; len.min(1 << 20) as usize];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(zero.len() as u64) as usize;
        dev.write_at(&zero[..n], offset + done)?;
        done += n as u64;
    }
    Ok(())
}
