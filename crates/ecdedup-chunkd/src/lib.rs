//! The chunk server (`ecdedup chunkd`, docs/cluster.md "The chunk
//! server"): it owns one host's chunk files and serves them over the data
//! protocol to the volume clients.
//!
//! A chunk is one shard of one placement group of one volume: a sparse
//! file in one of the server's data folders, which the volume client
//! formats and uses as a device of its PG's array (format 2: the data,
//! checksum table, dedup maps and parity journal of that shard all live
//! in the chunk itself). The server knows nothing of stripes: it reads,
//! writes, syncs and discards byte ranges, checked against the chunk's
//! bounds, and fences writers:
//!
//! - [`chunks::ChunkServer`] is the protocol logic, synchronous and free of
//!   sockets and clocks, over a [`ecdedup_core::media::Storage`] (the OS,
//!   or the power-loss simulator in the cluster simulator);
//! - [`run`] is the thin adapter: the transport's server, the etcd
//!   registration under a lease, the self-fence, the space reports.

pub mod chunks;
mod daemon;

pub use chunks::{ChunkServer, ChunkServerConfig};
pub use daemon::{run, ChunkdConfig, EXIT_FENCED};
