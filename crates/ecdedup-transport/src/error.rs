//! The transport's errors: each names the peer or file and says what went
//! wrong.

use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The cluster key file is missing, unreadable, too open or malformed.
    #[error("cluster key file {path}: {reason}")]
    KeyFile { path: PathBuf, reason: String },
    /// A key of the wrong length handed in directly.
    #[error("cluster key: {0}")]
    Key(String),
    #[error("bind {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("connect to {peer}: {source}")]
    Connect {
        peer: String,
        source: std::io::Error,
    },
    /// The peer did not prove the cluster key, or broke the handshake.
    #[error("handshake with {peer}: {reason}")]
    Handshake { peer: String, reason: String },
    /// The connection ended (the peer went away, or sent a frame that
    /// failed a check) while the request waited, or before it was sent.
    #[error("connection to {peer} closed: {reason}")]
    ConnectionClosed { peer: String, reason: String },
    /// No reply came within the configured time.
    #[error("request {request_id} to {peer}: no reply within {after:?}")]
    Timeout {
        peer: String,
        request_id: u64,
        after: Duration,
    },
    /// A request this side refuses to send (no frame can carry it).
    #[error("request not sent: {0}")]
    InvalidRequest(String),
}
