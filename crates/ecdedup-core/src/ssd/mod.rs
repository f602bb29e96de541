//! The SSD simulator: a page-mapped FTL with greedy GC and dedup inside the
//! SSD, after paper 003 (offline dedup-aware block separation).
//!
//! The module splits by phase, top to bottom:
//! - [`sim`]: `ecdedup sim`, which replays a block trace on one simulated
//!   SSD per dedup mode and prints the counters;
//! - [`trace`]: the trace formats (ecdedup's own, FIU's) and their parsers,
//!   plus a synthetic workload generator;
//! - [`device`]: [`SsdDevice`], a [`crate::media::Device`] on the FTL, so an
//!   array can run on simulated SSDs;
//! - [`wear`]: [`WearDevice`], wear accounting stacked on a real device
//!   (`create --ssd-sim`): the data stays on the device, the FTL sees
//!   fingerprints of the array's real writes;
//! - [`ftl`]: the FTL itself (page map, contents with reference counts,
//!   regions, GC, the offline pass, counters);
//! - [`index`] and [`latency`]: its lookup tables and its latency model.
//!
//! Invariants live with the FTL ([`ftl`]): every figure the simulator
//! reports is a deterministic function of the trace and the configuration,
//! and the FTL's own consistency check ([`Ftl::check`]) recomputes all of
//! its state from scratch. `docs/ssd.md` gives the model, the formulas and
//! the measured speed.

pub mod device;
pub mod ftl;
pub mod index;
pub mod latency;
pub mod sim;
pub mod trace;
pub mod wear;

#[cfg(test)]
mod tests;

pub use device::SsdDevice;
pub use ftl::{
    DedupMode, Ftl, FtlConfig, FtlCounters, FtlReport, GcPolicy, PageData, PageFingerprint,
    StoreMode,
};
pub use latency::{LatencyHistogram, LatencyModel};
pub use sim::{run_sim, SimArgs};
pub use wear::{SsdSimConfig, SsdSimMode, SsdWearStats, WearDevice};
