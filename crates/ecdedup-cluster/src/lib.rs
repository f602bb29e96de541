//! ecdedup's coordination layer on etcd (docs/cluster.md, "etcd keys").
//!
//! etcd is the cluster's only source of agreement: who is a chunk server
//! ([`server`]), which pools, placement groups and volumes exist
//! ([`pool`], [`volume`]), and which process writes a volume, with which
//! epoch ([`writer`]). This crate is that layer and nothing else: the key
//! layout ([`keys`]), guarded transactions over it, leases whose holders
//! fence themselves ([`lease`]), a watch that survives broken streams,
//! compaction and dead endpoints ([`watch`], [`session`]) over plain
//! HTTP or TLS with client certificates ([`tls`]), and placement
//! as pure functions ([`placement`]). The decisions that do not need etcd
//! (placement, the lease clock, the watch cursor) are plain functions and
//! state machines, tested without sockets or clocks.
//!
//! The API is async (tokio). Typical uses:
//! - a chunk server: [`Etcd::connect`], [`register_server`], then serve
//!   until [`lease::Fence::fenced`] fires, and exit non-zero;
//! - `ecdedup pool create` / `volume create|ls|resize|rm`: [`create_pool`],
//!   [`create_volume`], [`list_volumes`], [`resize_volume`], [`remove_volume`];
//! - a volume's NBD server: [`acquire_writer`] (the epoch), then
//!   [`placement::stripe_pg`] and [`pool_pgs`] to find each stripe's servers.
//!
//! Tests run against a real etcd ([`LocalEtcd`]).

pub mod coordinator;
pub mod error;
pub mod keys;
pub mod lease;
pub mod local_etcd;
pub mod placement;
pub mod pool;
pub mod server;
pub mod session;
pub mod tls;
mod txn;
pub mod volume;
pub mod watch;
pub mod writer;

pub use coordinator::{Coordinator, CoordinatorConfig, CoordinatorEvent};
pub use error::{Error, Result};
pub use keys::{Keys, ServerId};
pub use lease::{Fence, Lease};
pub use local_etcd::{LocalEtcd, PeerTls, ServerTls, PEER_COMMON_NAME};
pub use pool::{create_pool, get_pool, list_pools, pool_pgs, pool_pgs_at, remove_pool};
pub use server::{list_servers, register_server, Registration};
pub use session::{Etcd, EtcdConfig, Failover};
pub use tls::EtcdTls;
pub use volume::{
    create_volume, get_volume, list_volumes, record_capacity, remove_volume, remove_volume_at,
    resize_volume, resize_volume_at, volume_ids, VolumeIds,
};
pub use watch::{WatchEvent, Watcher};
pub use writer::{
    acquire_writer, await_epoch_stored, current_writer, writer_epoch, writer_epochs, EpochStand,
    TakenFrom, Writer,
};
