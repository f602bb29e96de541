//! Operating errors as values. Every error a user can cause (bad geometry, a
//! missing device, a corrupt superblock, an out-of-range request) is an
//! [`Error`] with a message that says what and where; broken invariants are
//! assertions instead.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("device {path}: {reason}")]
    Device { path: PathBuf, reason: String },
    #[error("corrupt metadata: {0}")]
    Corrupt(String),
    #[error("request out of range: offset {offset} length {length} exceeds volume size {size}")]
    OutOfRange { offset: u64, length: u64, size: u64 },
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("unavailable: {0}")]
    Unavailable(String),
    #[error("in use: {0}")]
    Busy(String),
    #[error("data lost: {0}")]
    DataLoss(String),
    /// The file system under the devices or the array's own files is full:
    /// writes are refused (reads go on) until space is back.
    #[error("no space: {0}")]
    NoSpace(String),
    #[error("{0}")]
    Other(String),
    /// Internal: a reader found journal entries for a stripe whose parity it
    /// needs; it retries under the exclusive lock after a replay.
    #[error("internal: stripe {0} needs a parity-journal replay")]
    NeedsReplay(u64),
}

impl Error {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// errno to hand back over NBD for this error.
    pub fn errno(&self) -> i32 {
        match self {
            Error::OutOfRange { .. } | Error::InvalidRequest(_) => libc::EINVAL,
            Error::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            Error::Busy(_) => libc::EBUSY,
            Error::NoSpace(_) => libc::ENOSPC,
            _ => libc::EIO,
        }
    }
}
