//! The coordination layer's errors: every refusal names what was refused
//! and why (the holder of a key, the guard that failed, the bad value).

/// Results of the coordination layer.
pub type Result<T> = std::result::Result<T, Error>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No endpoint of the list answered a status request.
    #[error("etcd: no endpoint of [{endpoints}] answered (last error: {last})")]
    NoEndpoint { endpoints: String, last: String },
    /// An etcd request failed (transport or gRPC status).
    #[error("etcd {operation}: {source}")]
    Etcd {
        operation: &'static str,
        #[source]
        source: etcd_client::Error,
    },
    /// A name, size or setting that the layout refuses.
    #[error("invalid {what}: {reason}")]
    Invalid { what: &'static str, reason: String },
    /// A value stored in etcd that does not parse as its key's type.
    #[error("etcd key {key} holds a value that is not valid: {reason}")]
    Corrupt { key: String, reason: String },
    /// `register_server` found the id's state key held by another server.
    #[error(
        "chunk server id {id} is already registered by the server at {holder} \
         (key {key}, lease {lease:x}): stop that server or pick another id"
    )]
    ServerIdTaken {
        id: u32,
        holder: String,
        key: String,
        lease: i64,
    },
    /// `acquire_writer` found the volume's writer key held.
    #[error(
        "volume {volume_id} already has a writer at {holder} (epoch {epoch}); \
         a second writer is refused while it holds key {key}"
    )]
    WriterHeld {
        volume_id: u64,
        holder: String,
        epoch: u64,
        key: String,
    },
    #[error("pool {0} already exists")]
    PoolExists(String),
    #[error("pool {0} does not exist")]
    PoolNotFound(String),
    /// A pool whose creation did not finish (its PG records are incomplete).
    #[error("pool {0} is not ready: its creation did not finish (remove it with `pool rm` and create it again)")]
    PoolNotReady(String),
    /// A pool that still holds volumes cannot be removed.
    #[error("pool {name} holds volumes ({volumes}): remove them first (`volume rm`)")]
    PoolInUse { name: String, volumes: String },
    #[error("volume {pool}/{name} already exists")]
    VolumeExists { pool: String, name: String },
    #[error("volume {pool}/{name} does not exist")]
    VolumeNotFound { pool: String, name: String },
    /// A volume that a writer holds cannot be removed.
    #[error("volume {pool}/{name} is in use by the writer at {holder}: stop it first")]
    VolumeInUse {
        pool: String,
        name: String,
        holder: String,
    },
    /// A compare of a guarded transaction failed: someone else changed the
    /// key between our read and our write.
    #[error("{key} changed while {operation} was in progress: read it again and retry")]
    Changed {
        key: String,
        operation: &'static str,
    },
    /// Placement cannot give every PG its servers on distinct failure domains.
    #[error("placement: {0}")]
    Placement(String),
    /// A new writer's epoch is neither stored on these servers (their
    /// `server/<id>/epochs`) nor are their registrations gone, after the
    /// wait (`writer::await_epoch_stored`): an old writer might still land
    /// changes there, so the new one does not serve.
    #[error(
        "epoch {epoch} of volume {volume_id} is not known to be stored on chunk server(s) \
         {servers} after {waited_ms} ms: each is registered (its lease lives) but has not said \
         it applied the writer key (server/<id>/epochs); the volume is not served until it \
         does or its lease ends (check that server's link to etcd; last etcd error: \
         {last_error})"
    )]
    EpochUnconfirmed {
        volume_id: u64,
        epoch: u64,
        servers: String,
        waited_ms: u64,
        last_error: String,
    },
    /// The lease under which the caller acts is lost (see `lease.rs`).
    #[error("fenced: {0}")]
    Fenced(String),
    /// A TLS file for etcd (CA, client certificate or key) that cannot
    /// be read or does not hold what it is for.
    #[error("etcd TLS: file {path} {reason}")]
    TlsFile { path: String, reason: String },
    /// A local etcd (tests, `cluster up`) could not be started.
    #[error("local etcd: {0}")]
    LocalEtcd(String),
}

impl Error {
    /// Wraps an etcd client error with the operation it failed.
    pub(crate) fn etcd(operation: &'static str) -> impl FnOnce(etcd_client::Error) -> Error {
        move |source| Error::Etcd { operation, source }
    }

    pub(crate) fn invalid(what: &'static str, reason: impl Into<String>) -> Error {
        Error::Invalid {
            what,
            reason: reason.into(),
        }
    }
}
