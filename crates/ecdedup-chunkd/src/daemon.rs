//! The chunk server's process: the transport's listener over a
//! [`ChunkServer`], the registration in etcd under a lease, the
//! self-fence, space reports, and the stop on a signal.

use crate::chunks::{ChunkServer, ChunkServerConfig};
use ecdedup_cluster::keys::{DeviceInfo, DeviceSpace, ServerInfo, ServerSpace};
use ecdedup_cluster::{register_server, Etcd, EtcdConfig, ServerId};
use ecdedup_core::media::{IoMode, OsStorage};
use ecdedup_core::proto::{Header, Status};
use ecdedup_transport::log::line;
use ecdedup_transport::{ClusterKey, Handler, Server, ServerConfig};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The exit status of a server that fenced itself (its lease could not be
/// renewed): a supervisor restarts it.
pub const EXIT_FENCED: i32 = 3;
/// The exit status when the server id is held by another live server.
pub const EXIT_ID_TAKEN: i32 = 4;

const COMPONENT: &str = "chunkd";

#[derive(Clone, Debug)]
pub struct ChunkdConfig {
    pub etcd: EtcdConfig,
    pub id: u32,
    /// Where the data protocol listens (port 0: any free port).
    pub listen: SocketAddr,
    /// The address clients use, if not `listen`'s (behind NAT, 0.0.0.0).
    pub advertise: Option<String>,
    /// The failure domain `host` of placement.
    pub host: String,
    pub key: PathBuf,
    pub dirs: Vec<PathBuf>,
    pub io: IoMode,
    pub lease_ttl: Duration,
    /// Seconds between space reports to etcd.
    pub space_every: Duration,
    /// How long a server is down before the coordinator (if this server
    /// is elected) re-places its PGs ([`ecdedup_cluster::coordinator`]).
    pub out_after: Duration,
    /// [`ChunkServerConfig::layers_ram_max`].
    pub layers_ram_max: u64,
}

/// How often a coordinator candidate campaigns, and the elected one looks
/// at the servers.
const COORDINATOR_TICK: Duration = Duration::from_secs(1);

/// This server's coordinator candidate: campaigns every tick, and once
/// elected re-places the PGs of servers that are out; logs what it does.
async fn coordinate(etcd: ecdedup_cluster::Etcd, config: ecdedup_cluster::CoordinatorConfig) {
    use ecdedup_cluster::CoordinatorEvent as E;
    let mut c = ecdedup_cluster::Coordinator::new(etcd, config);
    let mut tick = tokio::time::interval(COORDINATOR_TICK);
    loop {
        tick.tick().await;
        let events = match c.tick().await {
            Ok(events) => events,
            Err(e) => {
                line(COMPONENT, "coordinator-failed", &[("reason", &e)]);
                continue;
            }
        };
        for e in events {
            match e {
                E::Elected { term } => line(COMPONENT, "coordinator-elected", &[("term", &term)]),
                E::TermLost { term } => {
                    line(COMPONENT, "coordinator-term-lost", &[("term", &term)])
                }
                E::Down { server } => line(COMPONENT, "server-down", &[("server", &server)]),
                E::Out { server } => line(COMPONENT, "server-out", &[("server", &server)]),
                E::Replaced { pool, pg, moved } => line(
                    COMPONENT,
                    "pg-replaced",
                    &[
                        ("pool", &pool),
                        ("pg", &pg),
                        ("shard", &moved.shard),
                        ("from", &moved.from),
                        ("to", &moved.to),
                        ("epoch", &moved.epoch),
                    ],
                ),
                E::Unplaceable {
                    pool,
                    pg,
                    shard,
                    from,
                } => line(
                    COMPONENT,
                    "pg-unplaceable",
                    &[
                        ("pool", &pool),
                        ("pg", &pg),
                        ("shard", &shard),
                        ("from", &from),
                        (
                            "reason",
                            &"no live server on a failure domain new to the PG",
                        ),
                    ],
                ),
                E::Rebuilt { pool, pg, shard } => line(
                    COMPONENT,
                    "pg-rebuilt",
                    &[("pool", &pool), ("pg", &pg), ("shard", &shard)],
                ),
            }
        }
    }
}

struct Adapter(Arc<ChunkServer>);

impl Handler for Adapter {
    async fn handle(&self, request: Header, payload: Vec<u8>) -> (Status, Vec<u8>) {
        let server = Arc::clone(&self.0);
        match tokio::task::spawn_blocking(move || server.handle(&request, &payload)).await {
            Ok(reply) => reply,
            Err(e) => (
                Status::Io,
                format!("the request's task failed: {e}").into_bytes(),
            ),
        }
    }
}

/// Tells systemd (`Type=notify`) the server is ready, when started by it.
fn notify_ready() {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    if let Ok(sock) = std::os::unix::net::UnixDatagram::unbound() {
        let _ = sock.send_to(b"READY=1", PathBuf::from(path));
    }
}

/// Deletes the chunks of volumes removed from the cluster (`volume rm`
/// leaves them to the servers, so a server that was down then frees them
/// when it is back): one consistent read of the volume ids, then the
/// deletions off the async threads. Failures are logged and retried at the
/// next space report.
async fn remove_deleted_volumes(etcd: &Etcd, server: &Arc<ChunkServer>, id: u32) {
    let ids = match ecdedup_cluster::volume_ids(etcd).await {
        Ok(ids) => ids,
        Err(e) => {
            line(COMPONENT, "volume-ids-failed", &[("reason", &e)]);
            return;
        }
    };
    let s = Arc::clone(server);
    let done = tokio::task::spawn_blocking(move || {
        s.remove_volumes_not_in(&ids.cluster, &ids.live, ids.next)
    })
    .await
    .map_err(|e| std::io::Error::other(e.to_string()))
    .and_then(|r| r);
    match done {
        Ok(removed) => {
            for (volume, r) in removed {
                line(
                    COMPONENT,
                    "volume-removed",
                    &[
                        ("id", &id),
                        ("volume", &volume),
                        ("chunks", &r.chunks),
                        ("bytes", &r.bytes),
                    ],
                );
            }
        }
        Err(e) => line(COMPONENT, "volume-removal-failed", &[("reason", &e)]),
    }
}

/// Runs the chunk server until a stop signal (returns 0), a fence
/// ([`EXIT_FENCED`]) or a refused registration ([`EXIT_ID_TAKEN`]); an
/// error that keeps it from starting is returned as text.
pub async fn run(config: ChunkdConfig) -> Result<i32, String> {
    let key = ClusterKey::load(&config.key).map_err(|e| e.to_string())?;
    let server = Arc::new(
        ChunkServer::new(
            OsStorage::shared(),
            ChunkServerConfig {
                dirs: config.dirs.clone(),
                io: config.io,
                open_chunks_max: 4096,
                layers_ram_max: config.layers_ram_max,
            },
        )
        .map_err(|e| format!("data folders: {e}"))?,
    );
    let listener = Server::bind(
        config.listen,
        key,
        Arc::new(Adapter(Arc::clone(&server))),
        ServerConfig::default(),
    )
    .await
    .map_err(|e| e.to_string())?;
    let address = config
        .advertise
        .clone()
        .unwrap_or_else(|| listener.local_addr().to_string());
    let etcd = Etcd::connect(config.etcd.clone())
        .await
        .map_err(|e| format!("etcd: {e}"))?;
    let info = ServerInfo {
        address: address.clone(),
        host: config.host.clone(),
        devices: config
            .dirs
            .iter()
            .map(|d| DeviceInfo {
                path: d.display().to_string(),
                bytes: 0,
            })
            .collect(),
        features: ecdedup_cluster::keys::FEATURES
            .iter()
            .map(|f| f.to_string())
            .collect(),
    };
    let registration =
        match register_server(&etcd, ServerId(config.id), &info, config.lease_ttl).await {
            Ok(r) => r,
            Err(e @ ecdedup_cluster::Error::ServerIdTaken { .. }) => {
                line(COMPONENT, "refused", &[("id", &config.id), ("reason", &e)]);
                return Ok(EXIT_ID_TAKEN);
            }
            Err(e) => return Err(format!("registering in etcd: {e}")),
        };
    line(
        COMPONENT,
        "ready",
        &[
            ("id", &config.id),
            ("address", &address),
            ("host", &config.host),
            ("lease", &registration.lease_id()),
        ],
    );
    notify_ready();
    // Every server is a coordinator candidate under its registration's
    // lease: the coordinator goes with the server that runs it.
    let coordinator = tokio::spawn(coordinate(
        etcd.clone(),
        ecdedup_cluster::CoordinatorConfig {
            server: ServerId(config.id),
            address: address.clone(),
            lease_id: registration.lease_id(),
            out_after: config.out_after,
        },
    ));
    struct AbortOnDrop(tokio::task::JoinHandle<()>);
    impl Drop for AbortOnDrop {
        fn drop(&mut self) {
            self.0.abort();
        }
    }
    let _coordinator = AbortOnDrop(coordinator);
    let mut fence = registration.fence();
    let mut space_tick = tokio::time::interval(config.space_every);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| e.to_string())?;
    loop {
        tokio::select! {
            reason = fence.fenced() => {
                // Nothing more is acknowledged from here on.
                server.fence();
                line(COMPONENT, "fenced", &[("id", &config.id), ("reason", &reason)]);
                return Ok(EXIT_FENCED);
            }
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
            _ = space_tick.tick() => {
                remove_deleted_volumes(&etcd, &server, config.id).await;
                let s = Arc::clone(&server);
                let (space, dedup) = tokio::task::spawn_blocking(move || (s.space(), s.dedup_totals()))
                    .await
                    .unwrap_or_default();
                let report = ServerSpace {
                    dedup,
                    devices: space
                        .into_iter()
                        .map(|(path, free, used)| DeviceSpace {
                            path: path.display().to_string(),
                            bytes_free: free,
                            bytes_used: used,
                        })
                        .collect(),
                };
                if let Err(e) = registration.report_space(&report).await {
                    line(COMPONENT, "space-report-failed", &[("reason", &e)]);
                }
            }
        }
    }
    line(COMPONENT, "stopping", &[("id", &config.id)]);
    drop(listener);
    if let Err(e) = registration.close().await {
        line(COMPONENT, "deregister-failed", &[("reason", &e)]);
    }
    Ok(0)
}
