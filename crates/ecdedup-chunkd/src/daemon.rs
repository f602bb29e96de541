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

struct Adapter {
    server: Arc<ChunkServer>,
    /// The registration's lease, once registered: a request is taken,
    /// and answered `Ok`, only while it may still count as live
    /// ([`ecdedup_cluster::Fence::live_now`]), so a server paused past its
    /// lease (SIGSTOP) acknowledges nothing when it resumes, even before
    /// its lease keeper has run and fenced it.
    lease: Arc<std::sync::OnceLock<ecdedup_cluster::Fence>>,
    /// False until the writer keys are applied after the registration:
    /// a request waits for it.
    ready: tokio::sync::watch::Receiver<bool>,
    /// Told when a request finds the lease's fence time passed: the
    /// server then exits fenced, as when its keeper fences it (it would
    /// otherwise stay registered, refusing every request, if the keeper
    /// renewed the lease after the pause).
    lost: Arc<tokio::sync::Notify>,
}

impl Adapter {
    /// Whether the lease (if registered yet) has run out; latches the
    /// server's fence when it has.
    fn lease_lost(&self) -> bool {
        let lost = self.lease.get().is_some_and(|f| !f.live_now());
        if lost {
            self.server.fence();
            self.lost.notify_one();
        }
        lost
    }
}

/// The answer to a request a server whose lease ran out takes or ends.
fn lease_lost_reply() -> (Status, Vec<u8>) {
    (
        Status::Io,
        b"this chunk server's etcd lease ran out: it acknowledges nothing more and stops".to_vec(),
    )
}

impl Handler for Adapter {
    async fn handle(&self, request: Header, payload: Vec<u8>) -> (Status, Vec<u8>) {
        if !*self.ready.borrow() && self.ready.clone().wait_for(|r| *r).await.is_err() {
            return (
                Status::Io,
                b"this chunk server did not finish starting (the writer keys were not read)"
                    .to_vec(),
            );
        }
        if self.lease_lost() {
            return lease_lost_reply();
        }
        let server = Arc::clone(&self.server);
        let reply =
            match tokio::task::spawn_blocking(move || server.handle(&request, &payload)).await {
                Ok(reply) => reply,
                Err(e) => (
                    Status::Io,
                    format!("the request's task failed: {e}").into_bytes(),
                ),
            };
        // Not acknowledged if the lease ran out meanwhile (what it changed
        // may have landed, as a write in flight at a crash may).
        if reply.0 == Status::Ok && self.lease_lost() {
            return lease_lost_reply();
        }
        reply
    }
}

/// A task stopped when its handle goes.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Reads every writer key and applies them whole
/// ([`ChunkServer::apply_writer_keys`]); returns the revision of that
/// read.
async fn stored_writer_epochs(etcd: &Etcd, server: &Arc<ChunkServer>) -> Result<u64, String> {
    let (revision, epochs) = ecdedup_cluster::writer_epochs(etcd)
        .await
        .map_err(|e| e.to_string())?;
    let revision = revision.max(0) as u64;
    let volumes = epochs.len();
    let raised = apply_writer_keys(server, revision, epochs).await?;
    line(
        COMPONENT,
        "writer-epochs-stored",
        &[
            ("revision", &revision),
            ("volumes", &volumes),
            ("raised", &raised),
        ],
    );
    Ok(revision)
}

/// [`ChunkServer::apply_writer_keys`] off the async threads.
async fn apply_writer_keys(
    server: &Arc<ChunkServer>,
    revision: u64,
    keys: Vec<(u64, u64)>,
) -> Result<usize, String> {
    let s = Arc::clone(server);
    tokio::task::spawn_blocking(move || s.apply_writer_keys(revision, &keys))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("writer keys at revision {revision}: {e}"))
}

/// Raises `volume` to `epoch` on the server (off the async threads: it
/// waits for the volume's requests admitted at a lower epoch); logged if
/// it rose.
async fn store_epoch(server: &Arc<ChunkServer>, volume: u64, epoch: u64) -> Result<(), String> {
    let s = Arc::clone(server);
    let rose = tokio::task::spawn_blocking(move || s.raise_epoch(volume, epoch))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("volume {volume} epoch {epoch}: {e}"))?;
    if rose {
        line(
            COMPONENT,
            "epoch-from-etcd",
            &[("volume", &volume), ("epoch", &epoch)],
        );
    }
    Ok(())
}

/// [`store_epoch`] for a writer key's event at `revision` (a key outside
/// the writer keys raises nothing); the revision applied.
async fn raise_to(
    server: &Arc<ChunkServer>,
    raise: Option<(u64, u64)>,
    revision: i64,
) -> Result<u64, String> {
    if let Some((volume, epoch)) = raise {
        store_epoch(server, volume, epoch).await?;
    }
    Ok(revision.max(0) as u64)
}

/// Follows the writer keys from revision `after` + 1: stores each new
/// writer's epoch, then sends the revision applied. Returns why it
/// stopped (an epoch that could not be stored: the server must not go on
/// acknowledging an old writer).
async fn follow_writer_epochs(
    etcd: Etcd,
    server: Arc<ChunkServer>,
    after: u64,
    applied: tokio::sync::watch::Sender<u64>,
) -> String {
    use ecdedup_cluster::WatchEvent;
    let mut watch = ecdedup_cluster::Watcher::start(
        &etcd,
        etcd.keys().volume_writers(),
        Some(after as i64 + 1),
    );
    loop {
        let Some(event) = watch.next().await else {
            return "the watch of the writer keys stopped".into();
        };
        let applied_now = match event {
            // A reload after a compaction: applied whole, as at the start.
            WatchEvent::Reset { revision, kvs } => {
                let keys = kvs
                    .iter()
                    .filter_map(|kv| {
                        ecdedup_cluster::writer_epoch(&etcd, &kv.key, kv.create_revision)
                    })
                    .collect();
                let revision = revision.max(0) as u64;
                apply_writer_keys(&server, revision, keys)
                    .await
                    .map(|_| revision)
            }
            // A new writer: its epoch is its key's creation revision. A
            // writer gone (taken over, expired, released): no writer of an
            // epoch up to the deletion may write any more.
            WatchEvent::Put(kv) => {
                let raise = ecdedup_cluster::writer_epoch(&etcd, &kv.key, kv.create_revision);
                raise_to(&server, raise, kv.mod_revision).await
            }
            WatchEvent::Delete { key, revision } => {
                let raise = ecdedup_cluster::writer_epoch(&etcd, &key, revision);
                raise_to(&server, raise, revision).await
            }
        };
        match applied_now {
            Ok(revision) => {
                applied.send_replace(revision);
            }
            Err(e) => return e,
        }
    }
}

/// Says in `server/<id>/epochs` that the writer epochs up to `through`
/// are stored, unless already said; a failure is logged and `reported`
/// left behind, for the next try.
async fn report_epochs(
    registration: &ecdedup_cluster::Registration,
    reported: &mut u64,
    through: u64,
) {
    if through <= *reported {
        return;
    }
    match registration.report_epochs(through).await {
        Ok(()) => *reported = through,
        Err(e) => line(COMPONENT, "epochs-report-failed", &[("reason", &e)]),
    }
}

/// The longest a server fenced by a passed fence time waits to give its
/// lease back before it exits.
const LEASE_GIVE_BACK: Duration = Duration::from_secs(2);

/// How often a failed `server/<id>/epochs` report is tried again.
const EPOCHS_RETRY: Duration = Duration::from_secs(1);

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
    let etcd = Etcd::connect(config.etcd.clone())
        .await
        .map_err(|e| format!("etcd: {e}"))?;
    let lease = Arc::new(std::sync::OnceLock::new());
    let lost = Arc::new(tokio::sync::Notify::new());
    // Requests wait until the writer keys are applied (below).
    let (ready_tx, ready_rx) = tokio::sync::watch::channel(false);
    let listener = Server::bind(
        config.listen,
        key,
        Arc::new(Adapter {
            server: Arc::clone(&server),
            lease: Arc::clone(&lease),
            ready: ready_rx,
            lost: Arc::clone(&lost),
        }),
        ServerConfig::default(),
    )
    .await
    .map_err(|e| e.to_string())?;
    let address = config
        .advertise
        .clone()
        .unwrap_or_else(|| listener.local_addr().to_string());
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
    let _ = lease.set(registration.fence());
    // Every writer key, read after the registration and applied before
    // the first request is taken: a new writer whose push missed this
    // server either saw it registered (and waits for its
    // `server/<id>/epochs`) or not (and counted it gone), in which case
    // its key is older than this read and is in it.
    let epochs_read = match stored_writer_epochs(&etcd, &server).await {
        Ok(revision) => revision,
        Err(e) => {
            let _ = registration.close().await;
            return Err(format!("storing the volumes' writer epochs: {e}"));
        }
    };
    ready_tx.send_replace(true);
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
    // What this server says of the writer epochs it stored
    // (`server/<id>/epochs`): the revision it read them at, then each
    // writer key the follower applies.
    let (applied_tx, mut applied_rx) = tokio::sync::watch::channel(epochs_read);
    let mut follower = AbortOnDrop(tokio::spawn(follow_writer_epochs(
        etcd.clone(),
        Arc::clone(&server),
        epochs_read,
        applied_tx,
    )));
    let mut reported = 0;
    report_epochs(&registration, &mut reported, epochs_read).await;
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
    let _coordinator = AbortOnDrop(coordinator);
    let mut fence = registration.fence();
    let mut space_tick = tokio::time::interval(config.space_every);
    let mut epochs_retry = tokio::time::interval(EPOCHS_RETRY);
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
            _ = lost.notified() => {
                line(COMPONENT, "fenced", &[("id", &config.id), ("reason", &"a request found the lease's fence time passed (the process was paused, or the host suspended)")]);
                // The keeper may have renewed the lease since (a short
                // suspend): give it back, so the id (and the coordinator
                // key, if this server held it) is free at once; a lease
                // already gone makes this fail, quickly.
                let _ = tokio::time::timeout(LEASE_GIVE_BACK, registration.close()).await;
                return Ok(EXIT_FENCED);
            }
            reason = &mut follower.0 => {
                let reason = reason.unwrap_or_else(|e| format!("the follower task failed: {e}"));
                server.fence();
                line(COMPONENT, "fenced", &[("id", &config.id), ("reason", &format!("writer epochs: {reason}"))]);
                return Ok(EXIT_FENCED);
            }
            Ok(()) = applied_rx.changed() => {
                let through = *applied_rx.borrow_and_update();
                report_epochs(&registration, &mut reported, through).await;
            }
            _ = epochs_retry.tick() => {
                let through = *applied_rx.borrow();
                report_epochs(&registration, &mut reported, through).await;
            }
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
            _ = space_tick.tick() => {
                remove_deleted_volumes(&etcd, &server, config.id).await;
                let s = Arc::clone(&server);
                let (space, dedup, volumes) = tokio::task::spawn_blocking(move || {
                    (s.space(), s.dedup_totals(), s.dedup_by_volume())
                })
                .await
                .unwrap_or_default();
                let mut report = ServerSpace {
                    dedup,
                    volumes,
                    volumes_left_out: 0,
                    devices: space
                        .into_iter()
                        .map(|(path, free, used)| DeviceSpace {
                            path: path.display().to_string(),
                            bytes_free: free,
                            bytes_used: used,
                        })
                        .collect(),
                };
                report.bound_volumes();
                if let Err(e) = registration.report_space(&report).await {
                    line(COMPONENT, "space-report-failed", &[("reason", &e)]);
                }
            }
        }
    }
    line(COMPONENT, "stopping", &[("id", &config.id)]);
    // Nothing more is acknowledged once the registration goes (a request
    // still in a handler's task would be answered after it).
    server.fence();
    drop(listener);
    if let Err(e) = registration.close().await {
        line(COMPONENT, "deregister-failed", &[("reason", &e)]);
    }
    Ok(0)
}
