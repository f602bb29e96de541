//! ecdedup: an erasure-coded, deduplicating block store for flash.
//!
//! The write path, top to bottom, is the module list below:
//! NBD frontend (the `ecdedup-nbdkit` crate) → [`volume`] → [`array`]
//! (stripes, parity, checksums, write intents) → [`media`] (files, block
//! devices, fault-injecting test devices). [`codec`] does the GF(2^8)
//! arithmetic through Intel ISA-L; [`counters`] is the evidence every layer
//! leaves behind; [`control`] lets the CLI talk to a running server.

pub mod archive;
pub mod array;
pub mod cli;
pub mod codec;
pub mod control;
pub mod counters;
pub mod dedup;
pub mod error;
pub mod eval;
pub mod fingerprint;
#[doc(hidden)]
pub mod fuzzing;
pub mod media;
pub mod ssd;
pub mod units;
pub mod volume;

pub use error::{Error, Result};
