//! The volume client (docs/cluster.md, "The data path"): the NBD server's
//! side of the cluster. A volume is striped over its pool's placement
//! groups; each PG is the engine's own array ([`ecdedup_core::array`]:
//! stripes, write policies, parity journals, intents, checksums, decode)
//! over the volume's chunks on that PG's servers, reached through
//! [`link::NetLink`]s. One data path: the single-machine array and the
//! cluster run the same code, with a device that is a file or a chunk
//! across the network.
//!
//! - [`link`]: one chunk across the network; the wire's counters; the
//!   writer's fence.
//! - [`open`]: taking a volume over (writer key, epoch push, PG arrays).
//! - [`rebuild`]: rebuilding a re-placed shard on its new server.
//! - [`follow`]: following the PG records while serving (a re-placed
//!   shard installed and rebuilt without waiting for the next open).
//! - [`volume`]: striping over PGs.

pub mod follow;
pub mod link;
pub mod open;
pub mod rebuild;
pub mod volume;

pub use open::{open, ClusterOptions, Session};
pub use volume::ClusterVolume;
