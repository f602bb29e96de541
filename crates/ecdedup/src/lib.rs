//! ecdedup: an erasure-coded, deduplicating block store for flash; this
//! crate is the `ecdedup` command ([`cli`]).
//!
//! The system's parts are crates: `ecdedup-core` (the engine: codec, media,
//! array, dedup, fingerprinting, volume), `ecdedup-archive` (the archive
//! tier), `ecdedup-lab` (the paper evaluations) and `ecdedup-nbdkit` (the
//! NBD server plugin, which links only the engine). Their modules are
//! re-exported here under the names they have always had, so that the
//! command, the integration tests and the fuzz targets name one crate.

pub use ecdedup_archive as archive;
pub use ecdedup_core::{
    array, codec, control, counters, dedup, error, fingerprint, media, proto, ssd, units, volume,
};
pub use ecdedup_core::{Error, Result};
pub use ecdedup_lab::eval;

pub mod cli;
pub mod cluster_cli;
mod cluster_pki;
#[doc(hidden)]
pub mod fuzzing;
pub mod volume_cli;
