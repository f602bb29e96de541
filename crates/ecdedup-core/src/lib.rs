//! ecdedup's engine: everything a server that holds data links.
//!
//! The write path, top to bottom, is the module list below:
//! NBD frontend (the `ecdedup-nbdkit` crate) → [`volume`] → [`array`]
//! (stripes, parity, checksums, write intents, write policies and parity
//! journals) → [`dedup`] (the per-device dedup/remap layer, hashing with
//! [`fingerprint`]) → [`media`] (the `Storage` trait, files, block devices,
//! io_uring batches, the metadata area, the power-loss simulator, and
//! [`ssd`], the SSD simulator as a media backend). [`codec`] does the
//! GF(2^8) arithmetic through Intel ISA-L; [`counters`] is the evidence
//! every layer leaves behind; [`control`] lets the CLI talk to a running
//! server.
//!
//! The archive tier (`ecdedup-archive`) and the paper evaluations
//! (`ecdedup-lab`) sit beside this crate and use it; nothing here uses them.

pub mod array;
pub mod codec;
pub mod control;
pub mod counters;
pub mod dedup;
pub mod error;
pub mod fingerprint;
pub mod media;
pub mod proto;
pub mod ssd;
pub mod units;
pub mod volume;

pub use error::{Error, Result};
