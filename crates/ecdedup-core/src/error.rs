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
            // Mapped at the device boundary: a full file system is ENOSPC;
            // any other failure below the volume (EINVAL from a file system
            // that went away, ENOTCONN, EBADF...) is an I/O error, never
            // the client's invalid request.
            Error::Io { source, .. } => match source.raw_os_error() {
                Some(libc::ENOSPC) | Some(libc::EDQUOT) => libc::ENOSPC,
                _ => libc::EIO,
            },
            Error::Busy(_) => libc::EBUSY,
            Error::NoSpace(_) => libc::ENOSPC,
            _ => libc::EIO,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 18, item 13: what fails under the volume reaches a client as
    /// EIO (a full file system as ENOSPC), never as EINVAL.
    #[test]
    fn device_errors_reach_clients_as_eio_and_a_full_file_system_as_enospc() {
        let io = |errno| Error::io("writing", std::io::Error::from_raw_os_error(errno));
        assert_eq!(io(libc::EINVAL).errno(), libc::EIO);
        assert_eq!(io(libc::ENOTCONN).errno(), libc::EIO);
        assert_eq!(io(libc::EIO).errno(), libc::EIO);
        assert_eq!(io(libc::EDQUOT).errno(), libc::ENOSPC);
        let refused = crate::media::storage::direct_refused(
            std::io::Error::from_raw_os_error(libc::EINVAL),
            std::path::Path::new("/fuse/dev0"),
        );
        let msg = refused.to_string();
        assert!(
            msg.contains("/fuse/dev0") && msg.contains("--io buffered"),
            "{msg}"
        );
        assert_eq!(Error::io("reading", refused).errno(), libc::EIO);
        assert_eq!(
            Error::InvalidRequest("unaligned".into()).errno(),
            libc::EINVAL
        );
    }
}
