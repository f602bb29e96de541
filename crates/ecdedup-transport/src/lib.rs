//! The TCP transport of the data protocol (docs/cluster.md, "Transport"):
//! it moves frames ([`ecdedup_core::proto::frame`]) between a volume client
//! and the chunk servers, and knows nothing of what the ops mean.
//!
//! - [`key`]: the cluster key, loaded from a file that only its owner may
//!   read.
//! - [`handshake`]: a challenge–response over `Hello` frames; both sides
//!   prove the cluster key (HMAC-SHA256 over both nonces and the prover's
//!   role) before any other frame is read.
//! - [`wire`]: reading and writing frames on an async stream.
//! - [`client`]: one connection per peer, many requests in flight, replies
//!   matched by request id in any order, a bound on requests in flight.
//! - [`server`]: the accept loop, one task per connection, each request
//!   handed to a [`server::Handler`] and its reply written when it is done.
//!
//! Invariants: a frame from a peer is checked before anything acts on it;
//! a frame that fails a check closes its connection (and only it) with a
//! logged reason; a connection that ends fails every request still waiting
//! on it with [`Error::ConnectionClosed`]; nothing here panics on input.
//! The runtime is tokio (multi-thread), chosen by the loopback benchmark
//! in `examples/runtime_bench.rs` (docs/benchmarks.md).

pub mod client;
pub mod handshake;
pub mod key;
pub mod server;
pub mod wire;

mod error;
pub mod log;

pub use client::{Client, ClientConfig, Peers, Reply};
pub use error::Error;
pub use key::ClusterKey;
pub use server::{Handler, Server, ServerConfig, ServerStats};
