//! The data protocol between a volume client and the chunk servers
//! (docs/cluster.md): what crosses the network, independent of how it
//! crosses it. [`frame`] is the wire format of one message: a fixed
//! 64-byte little-endian header and a bounded payload, each under its own
//! CRC32C.
//!
//! Invariant: bytes from a peer are checked once, here, before anything
//! acts on them; a frame that fails a check is refused with the reason and
//! its connection is closed (a byte stream has no way back into step after
//! a bad header). Nothing in this module panics on input or allocates more
//! than [`frame::PAYLOAD_BYTES_MAX`] for a payload.

pub mod frame;

pub use frame::{
    chunk_code, chunk_parts, read_frame, FrameError, Header, Op, Status, HEADER_BYTES,
    PAYLOAD_BYTES_MAX,
};
