//! Taking a volume over: the writer's handover (docs/cluster.md,
//! "Fencing"), in this order:
//!
//! 1. read the pool, its PGs, the volume and the live servers from etcd;
//! 2. take the volume's writer key under a lease of our own: its creation
//!    revision is our epoch (a second writer is refused here and told who
//!    holds the key);
//! 3. push the epoch to every server of the volume's PGs and wait for
//!    their acks: from then on no server acknowledges the old writer;
//! 4. open every PG's chunks on its servers and open the PG's array over
//!    them (formatting chunks that are all new): the array's open
//!    replays the parity journals and resynchronises the stripes the old
//!    writer left dirty;
//! 5. only then serve;
//! 6. follow the PG records while serving (`follow.rs`): a re-placed
//!    shard is installed and rebuilt without waiting for the next open.
//!
//! A server that cannot be reached costs its PGs one shard each: the
//! array opens degraded (up to m per PG) and records what the server
//! misses.

use crate::link::{NetLink, PgEpoch, Wire};
use crate::volume::ClusterVolume;
use ecdedup_cluster::keys::{
    DedupPolicy, PgRecord, PoolSpec, ServerInfo, WritePolicy as PoolPolicy, FEATURE_DEDUP_LAYER,
    FEATURE_LOG_APPEND_BARRIER,
};
use ecdedup_cluster::{Etcd, EtcdConfig, ServerId};
use ecdedup_core::array::{self, Array, ConfigFile, CreateOptions, MetadataPlacement, WritePolicy};
use ecdedup_core::dedup::{DedupConfig, Policy};
use ecdedup_core::error::{Error, Result};
use ecdedup_core::media::{Device, RemoteDevice};
use ecdedup_core::proto::{chunk_code, Op};
use ecdedup_transport::log::line;
use ecdedup_transport::{ClientConfig, ClusterKey, Peers};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Every volume is formatted for at least this many bytes (its chunks are
/// sparse: the room costs nothing until written), so that `volume resize`
/// can grow it up to this without moving data.
pub const CAPACITY_BYTES_MIN: u64 = 256 << 30;
/// The rebuild of a re-placed shard writes at most this many bytes a
/// second to its new server, by default (per PG being rebuilt).
pub const REBUILD_BYTES_PER_S_DEFAULT: u64 = 64 << 20;

const COMPONENT: &str = "volume-client";

// Every journal bound `pool create` takes is one the engine formats: a
// pool refused at its first serve would have been accepted at creation.
const _: () = assert!(
    ecdedup_cluster::keys::JOURNAL_BYTES_MIN >= array::JOURNAL_BYTES_MIN,
    "a pool's smallest journal bound is below the engine's"
);

#[derive(Clone, Debug)]
pub struct ClusterOptions {
    pub etcd: EtcdConfig,
    pub pool: String,
    pub volume: String,
    pub key: PathBuf,
    /// Where the client keeps each PG's `array.json` (a cache: the chunks
    /// hold the truth).
    pub state_dir: PathBuf,
    /// How this writer is named in its writer key.
    pub writer_address: String,
    pub lease_ttl: Duration,
    /// The longest a chunk request waits for its reply before the server
    /// counts as failed for that PG.
    pub request_timeout: Duration,
    /// A new volume's PGs are formatted for at least this many bytes in
    /// all ([`CAPACITY_BYTES_MIN`]; tests format less). A rebuild walks
    /// only the stripes the volume's size reaches
    /// (`Array::set_written_extent`).
    pub capacity_bytes_min: u64,
    /// The throttle of a rebuild ([`REBUILD_BYTES_PER_S_DEFAULT`]; 0: none).
    pub rebuild_bytes_per_s: u64,
    /// Take the volume from a writer that still holds its key, without
    /// waiting for that writer's lease to expire (`serve --take-over`;
    /// `ecdedup_cluster::acquire_writer` says why that is safe).
    pub take_over: bool,
    /// The longest the open waits, for each server its epoch push missed,
    /// until the server says in etcd that it stored the epoch or its
    /// registration ends ([`EPOCH_WAIT_DEFAULT`]; then the open fails).
    pub epoch_wait: Duration,
}

/// [`ClusterOptions::epoch_wait`] by default: a server cut off from etcd
/// fences itself within its lease's TTL and its registration goes at the
/// TTL, so this outlasts leases of up to about 25 s.
pub const EPOCH_WAIT_DEFAULT: Duration = Duration::from_secs(30);

/// What the volume keeps alive while it serves: the runtime, the etcd
/// session and the writer's lease.
pub struct Session {
    rt: tokio::runtime::Runtime,
    writer: Mutex<Option<ecdedup_cluster::Writer>>,
}

impl Session {
    /// Gives the writer key back (a clean stop: the next writer need not
    /// wait for the lease to expire).
    pub fn release(&self) {
        if let Some(w) = self.writer.lock().unwrap().take() {
            let _ = self.rt.block_on(w.release());
        }
    }
}

fn cluster_error(what: &str) -> impl Fn(ecdedup_cluster::Error) -> Error + '_ {
    move |e| match e {
        ecdedup_cluster::Error::WriterHeld { .. } => Error::Busy(format!("{what}: {e}")),
        e => Error::Unavailable(format!("{what}: {e}")),
    }
}

/// The engine's settings for a PG array of `pool`, over `names`.
fn create_options(spec: &PoolSpec, names: Vec<PathBuf>, pg_bytes: u64) -> Result<CreateOptions> {
    let write_policy = match spec.policy {
        PoolPolicy::Rmw => WritePolicy::Rmw,
        PoolPolicy::Plog => WritePolicy::Plog,
        PoolPolicy::Parix => WritePolicy::Parix,
        PoolPolicy::Replicate { .. } => WritePolicy::Replicate,
    };
    let policy = match spec.dedup {
        DedupPolicy::None => Policy::None,
        DedupPolicy::All => Policy::All,
        DedupPolicy::Parity => Policy::Parity,
    };
    Ok(CreateOptions {
        devices: names,
        k: spec.k,
        m: spec.m,
        stripe_unit_bytes: spec.stripe_unit_bytes,
        volume_bytes: pg_bytes,
        intent_region_bytes: array::intent::REGION_BYTES_DEFAULT,
        dedup: DedupConfig {
            policy,
            ..DedupConfig::default()
        },
        write_policy,
        journal_bytes_max: spec.journal_bytes(),
        io: Default::default(),
        sparse: true,
        force: false,
        metadata: MetadataPlacement::Devices,
    })
}

/// Takes volume `opts.volume` over and returns it ready to serve.
pub fn open(opts: &ClusterOptions) -> Result<ClusterVolume> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("ecdedup-client")
        .enable_all()
        .build()
        .map_err(|e| Error::io("starting the client's runtime", e))?;
    let key = ClusterKey::load(&opts.key).map_err(|e| Error::Config(e.to_string()))?;
    let (etcd, pool, pgs, volume, servers, writer) = rt.block_on(async {
        let etcd = Etcd::connect(opts.etcd.clone())
            .await
            .map_err(cluster_error("etcd"))?;
        let pool = ecdedup_cluster::get_pool(&etcd, &opts.pool)
            .await
            .map_err(cluster_error("pool"))?;
        let pgs = ecdedup_cluster::pool_pgs(&etcd, &opts.pool)
            .await
            .map_err(cluster_error("placement groups"))?;
        let volume = ecdedup_cluster::get_volume(&etcd, &opts.pool, &opts.volume)
            .await
            .map_err(cluster_error("volume"))?;
        let servers = ecdedup_cluster::list_servers(&etcd)
            .await
            .map_err(cluster_error("servers"))?;
        let writer = ecdedup_cluster::acquire_writer(
            &etcd,
            &opts.pool,
            &opts.volume,
            &opts.writer_address,
            opts.lease_ttl,
            opts.take_over,
        )
        .await
        .map_err(cluster_error("writer"))?;
        Ok::<_, Error>((etcd, pool, pgs, volume, servers, writer))
    })?;
    let spec = pool.record.spec.clone();
    let volume_id = volume.record.id;
    let epoch = writer.epoch();
    if let Some(from) = writer.taken_from() {
        line(
            COMPONENT,
            "writer-taken-over",
            &[
                ("volume", &opts.volume),
                ("from", &from.holder),
                ("from_epoch", &from.epoch),
                ("epoch", &epoch),
            ],
        );
    }
    line(
        COMPONENT,
        "writer",
        &[
            ("volume", &opts.volume),
            ("volume_id", &volume_id),
            ("epoch", &epoch),
        ],
    );
    let peers = Arc::new(Peers::new(
        key,
        ClientConfig {
            request_timeout: opts.request_timeout,
            ..ClientConfig::default()
        },
    ));
    let wire = Arc::new(Wire::new(
        rt.handle().clone(),
        peers,
        volume_id,
        epoch,
        opts.request_timeout,
    ));
    // The lease lost: the writer stops at once.
    {
        let mut fence = writer.fence();
        let wire = Arc::clone(&wire);
        rt.spawn(async move {
            let reason = fence.fenced().await;
            wire.fence(format!("the writer's lease is lost: {reason}"));
        });
    }
    let addr_of =
        |id: ServerId| -> Option<SocketAddr> { servers.get(&id)?.info.address.parse().ok() };
    // 3. The epoch, to every server of the volume's PGs.
    let mut all: Vec<ServerId> = pgs.iter().flat_map(|p| p.servers.iter().copied()).collect();
    all.sort();
    all.dedup();
    let pushes: Vec<_> = all
        .iter()
        .filter_map(|&id| {
            Some((
                id,
                wire.call(
                    addr_of(id)?,
                    wire.header(Op::SetEpoch, 0, 0, 0, 0),
                    Vec::new(),
                ),
            ))
        })
        .collect();
    let mut reached = BTreeMap::new();
    let mut failed = Vec::new();
    for (id, rx) in pushes {
        match Wire::wait(rx) {
            Ok(_) => {
                reached.insert(id, ());
            }
            Err(e) => {
                line(
                    COMPONENT,
                    "epoch-push-failed",
                    &[("server", &id), ("reason", &e)],
                );
                failed.push(format!("server {id}: {e}"));
            }
        }
    }
    if let Some(reason) = wire.fenced() {
        return Err(Error::Busy(format!(
            "a newer writer holds the volume: {reason}"
        )));
    }
    // Not one server answered (a wrong cluster key, say, or the writer cut
    // off): said now, with why, rather than after waiting for each of
    // them in etcd and failing the PGs' opens for want of servers.
    if reached.is_empty() && !failed.is_empty() {
        return Err(Error::Unavailable(format!(
            "no chunk server of volume {} answered the writer's epoch: {}",
            opts.volume,
            failed.join("; ")
        )));
    }
    // 3b. A server the push missed may still be reachable by the old
    // writer: wait until it says in etcd that it stored our epoch (it
    // follows the writer keys) or its registration ends (it fenced itself
    // first), so that nothing of the old writer lands after the open
    // (docs/cluster.md, "Fencing").
    let missed: Vec<ServerId> = all
        .iter()
        .copied()
        .filter(|id| !reached.contains_key(id))
        .collect();
    if !missed.is_empty() {
        let stands = rt
            .block_on(ecdedup_cluster::await_epoch_stored(
                &etcd,
                volume_id,
                &missed,
                epoch,
                opts.epoch_wait,
            ))
            .map_err(cluster_error("epoch"))?;
        for (id, stand) in stands {
            line(
                COMPONENT,
                "epoch-missed-push",
                &[
                    ("server", &id),
                    ("epoch", &epoch),
                    ("stand", &format!("{stand:?}").to_lowercase()),
                ],
            );
        }
    }
    // 4. Every PG's array.
    let stripe_bytes = u64::from(spec.k) * u64::from(spec.stripe_unit_bytes);
    let p = u64::from(spec.pg_count);
    let capacity = volume.record.size_bytes.max(opts.capacity_bytes_min);
    let pg_stripes = capacity.div_ceil(stripe_bytes).div_ceil(p);
    let pg_bytes = pg_stripes * stripe_bytes;
    let pg_epochs = pgs
        .iter()
        .enumerate()
        .map(|(pg, record)| Ok(PgEpoch::new(wire_pg_epoch(pg as u32, record.epoch)?)))
        .collect::<Result<Vec<_>>>()?;
    // The PGs open side by side (each replays and resynchronises what the
    // last writer left, round trip after round trip: one after another,
    // four PGs took most of a takeover's 10 s in the fault suite), at most
    // `PG_OPENS_AT_ONCE` at a time.
    let reachable = |id| peer_of(&servers.get(&id)?.info).filter(|_| reached.contains_key(&id));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut opened: Vec<Option<Result<(Array, u64)>>> = (0..pgs.len()).map(|_| None).collect();
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..PG_OPENS_AT_ONCE.min(pgs.len()))
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let pg = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(record) = pgs.get(pg) else {
                            return done;
                        };
                        let r = open_pg(
                            opts,
                            &spec,
                            &wire,
                            volume_id,
                            pg as u32,
                            record,
                            &pg_epochs[pg],
                            pg_bytes,
                            &reachable,
                        );
                        done.push((pg, r));
                    }
                })
            })
            .collect();
        for w in workers {
            // A worker that panicked leaves its PGs unopened: refused below.
            for (pg, r) in w.join().unwrap_or_default() {
                opened[pg] = Some(r);
            }
        }
    });
    let mut arrays = Vec::with_capacity(pgs.len());
    let mut chunk_bytes = 0;
    for (pg, r) in opened.into_iter().enumerate() {
        let array;
        (array, chunk_bytes) = r.unwrap_or_else(|| {
            Err(Error::Config(format!(
                "PG {pg} was not opened (its opening thread stopped)"
            )))
        })?;
        arrays.push(Arc::new(array));
    }
    let capacity = arrays[0].volume_bytes() * p;
    if volume.record.size_bytes > capacity {
        return Err(Error::Config(format!(
            "volume {} is {} bytes, its chunks were formatted for {capacity}: it cannot grow \
             past that",
            opts.volume, volume.record.size_bytes,
        )));
    }
    // What the chunks were formatted for goes in the volume's record, so
    // that `volume resize` refuses a size no serve could open (a failure
    // here leaves the resize unguarded, not the volume: logged).
    if volume.record.capacity_bytes != Some(capacity) {
        let r = rt.block_on(ecdedup_cluster::record_capacity(
            &etcd,
            &opts.pool,
            &opts.volume,
            epoch,
            capacity,
        ));
        if let Err(e) = r {
            line(
                COMPONENT,
                "capacity-not-recorded",
                &[("capacity", &capacity), ("reason", &e)],
            );
        }
    }
    // Each PG's stripes past those the volume's size reaches (which never
    // shrinks) were never written on any chunk: a rebuild stops there (a
    // shard of a small volume rebuilt its PG's whole formatted capacity,
    // 256 GiB over the PGs, zeroes written and allocated on the new
    // server), and a write past it is refused.
    let written = volume.record.size_bytes.div_ceil(stripe_bytes).div_ceil(p);
    for a in &arrays {
        a.set_written_extent(written);
        a.start_background_replay();
    }
    // 5. Shards to rebuild (a re-placed shard's new chunk, or a rebuild
    // that an earlier writer left part-way): in the background, while
    // the volume serves.
    let rebuild = crate::rebuild::Context {
        etcd: etcd.clone(),
        rt: rt.handle().clone(),
        pool: opts.pool.clone(),
        volume_id,
        writer_epoch: epoch,
        pg_epochs: pg_epochs.clone(),
        bytes_per_s: opts.rebuild_bytes_per_s,
    };
    let rebuilds = Arc::new(Mutex::new(crate::rebuild::start(&arrays, &rebuild)));
    // 6. A re-placement while the volume serves is followed at once.
    let follower = crate::follow::Follower::start(crate::follow::Follow {
        etcd,
        rt: rt.handle().clone(),
        wire: Arc::clone(&wire),
        pool: opts.pool.clone(),
        volume_id,
        records: pgs.clone(),
        arrays: arrays.clone(),
        pg_epochs,
        chunk_bytes,
        rebuild,
        rebuilds: Arc::clone(&rebuilds),
    });
    line(
        COMPONENT,
        "serving",
        &[
            ("volume", &opts.volume),
            ("bytes", &volume.record.size_bytes),
            ("pgs", &pgs.len()),
        ],
    );
    Ok(ClusterVolume {
        size: volume.record.size_bytes,
        stripe_bytes,
        rotation: volume_id,
        pgs: arrays,
        wire,
        state_dir: opts.state_dir.clone(),
        min_size: spec.min_size() as usize,
        rebuilds,
        follower: Mutex::new(Some(follower)),
        below_min: (0..pgs.len()).map(|_| Default::default()).collect(),
        _session: Some(Session {
            rt,
            writer: Mutex::new(Some(writer)),
        }),
    })
}

/// How many PGs a writer's open opens at once.
const PG_OPENS_AT_ONCE: usize = 8;

/// Opens (formatting if new) the array of PG `pg` over its chunks; with
/// the size of its chunks.
#[allow(clippy::too_many_arguments)]
fn open_pg(
    opts: &ClusterOptions,
    spec: &PoolSpec,
    wire: &Arc<Wire>,
    volume_id: u64,
    pg: u32,
    record: &PgRecord,
    pg_epoch: &Arc<PgEpoch>,
    pg_bytes: u64,
    peer: &(dyn Fn(ServerId) -> Option<Peer> + Sync),
) -> Result<(Array, u64)> {
    let names: Vec<PathBuf> = record
        .servers
        .iter()
        .enumerate()
        .map(|(shard, &id)| chunk_name(id, volume_id, pg, shard))
        .collect();
    let dir = opts
        .state_dir
        .join(format!("v{volume_id}"))
        .join(format!("pg{pg}"));
    std::fs::create_dir_all(&dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    // The chunk's size: the array's data per device plus its metadata.
    let options = create_options(spec, names.clone(), pg_bytes)?;
    let geo = array::geometry_for(&options)?;
    let chunk_bytes = geo.device_bytes_min().div_ceil(4096) * 4096;
    let mut devices: Vec<Option<Arc<dyn Device>>> = Vec::new();
    let shards: Vec<usize> = (0..record.servers.len()).collect();
    for (shard, opened) in open_chunks(
        wire,
        pg,
        &record.servers,
        &shards,
        pg_epoch.get(),
        pg_epoch,
        chunk_bytes,
        peer,
    )? {
        if let Err(e) = &opened {
            line(
                COMPONENT,
                "shard-open-failed",
                &[("pg", &pg), ("shard", &shard), ("reason", e)],
            );
        }
        devices.push(opened.ok());
    }
    if let Some(reason) = wire.fenced() {
        return Err(Error::Busy(format!(
            "a newer writer holds the volume: {reason}"
        )));
    }
    let what = format!("PG {pg} of volume {}", opts.volume);
    let (array, installed) = open_pg_array_replacing(&dir, &options, devices, &names, &what)?;
    for shard in installed {
        line(
            COMPONENT,
            "shard-replacement-installed",
            &[
                ("array", &what),
                ("shard", &shard),
                ("server", &record.servers[shard]),
                ("pg_epoch", &record.epoch),
            ],
        );
    }
    Ok((array, chunk_bytes))
}

/// A PG record's epoch as the frames carry it (32 bits; one per
/// re-placement of the PG, so never near the bound in practice).
pub(crate) fn wire_pg_epoch(pg: u32, epoch: u64) -> Result<u32> {
    u32::try_from(epoch).map_err(|_| {
        Error::Corrupt(format!(
            "PG {pg}'s record is at epoch {epoch}, past the data protocol's 32-bit PG epoch"
        ))
    })
}

/// How a chunk is named in its PG array's configuration.
pub(crate) fn chunk_name(id: ServerId, volume_id: u64, pg: u32, shard: usize) -> PathBuf {
    PathBuf::from(format!(
        "ecdedup://server-{id}/v{volume_id}/pg{pg}/s{shard}"
    ))
}

/// Where a chunk server is reached, and what of the protocol it takes.
#[derive(Clone, Copy)]
pub(crate) struct Peer {
    pub addr: SocketAddr,
    /// Its registration names [`FEATURE_LOG_APPEND_BARRIER`].
    pub takes_barrier: bool,
    /// Its registration names [`FEATURE_DEDUP_LAYER`].
    pub takes_dedup: bool,
}

/// The peer a server's registration describes (None: its address does
/// not parse).
pub(crate) fn peer_of(info: &ServerInfo) -> Option<Peer> {
    Some(Peer {
        addr: info.address.parse().ok()?,
        takes_barrier: info.takes(FEATURE_LOG_APPEND_BARRIER),
        takes_dedup: info.takes(FEATURE_DEDUP_LAYER),
    })
}

/// A chunk's device, or why it could not be opened.
pub(crate) type OpenedChunk = std::io::Result<Arc<dyn Device>>;

/// Opens (creating, sparse, if absent) the chunks of `shards` of PG `pg`
/// on `servers[shard]`, all at once, each `Open` carrying PG epoch
/// `open_at`: per shard, its device (a [`RemoteDevice`] whose requests
/// carry the epoch `pg_epoch` stands at as it changes), or why not.
#[allow(clippy::too_many_arguments)]
pub(crate) fn open_chunks(
    wire: &Arc<Wire>,
    pg: u32,
    servers: &[ServerId],
    shards: &[usize],
    open_at: u32,
    pg_epoch: &Arc<PgEpoch>,
    chunk_bytes: u64,
    peer_of: &dyn Fn(ServerId) -> Option<Peer>,
) -> Result<Vec<(usize, OpenedChunk)>> {
    let opens: Vec<_> = shards
        .iter()
        .map(|&shard| {
            let id = servers[shard];
            let code = chunk_code(pg, shard as u32);
            let sent = peer_of(id).map(|peer| {
                let h = wire.header(Op::Open, code, open_at, 0, 8);
                (
                    peer,
                    wire.call(peer.addr, h, chunk_bytes.to_le_bytes().to_vec()),
                )
            });
            (shard, id, code, sent)
        })
        .collect();
    let mut out = Vec::with_capacity(opens.len());
    for (shard, id, code, sent) in opens {
        let Some((
            Peer {
                addr,
                takes_barrier,
                takes_dedup,
            },
            rx,
        )) = sent
        else {
            let why =
                format!("server {id} is not reachable (not registered, or its epoch push failed)");
            out.push((shard, Err(std::io::Error::other(why))));
            continue;
        };
        let opened = match Wire::wait(rx) {
            Ok(reply) if reply.len() == 17 => {
                let boot_id = u64::from_le_bytes(reply[9..17].try_into().expect("8 bytes"));
                let link = NetLink::new(
                    Arc::clone(wire),
                    id,
                    wire.addresses.cell(id, addr),
                    code,
                    Arc::clone(pg_epoch),
                    chunk_bytes,
                    boot_id,
                )
                .taking_barriers(takes_barrier)
                .taking_dedup(takes_dedup);
                Ok(Arc::new(RemoteDevice::new(Arc::new(link))) as Arc<dyn Device>)
            }
            Ok(reply) => {
                return Err(Error::Corrupt(format!(
                    "server {id} answered an Open with {} bytes",
                    reply.len()
                )))
            }
            Err(e) => Err(e),
        };
        out.push((shard, opened));
    }
    Ok(out)
}

/// As [`open_pg_array`], and a chunk with no superblock in a PG whose
/// other chunks have one is a replacement (the coordinator moved the
/// shard to a new server, or the server lost the chunk): it is left out
/// of the open, installed blank in the shard's place (`names`: each
/// shard's device name) and rebuilt from the others. Its old server is no
/// longer in the PG's record, so nothing of it is read. Returns the array
/// and the shards installed as replacements.
pub fn open_pg_array_replacing(
    dir: &Path,
    options: &CreateOptions,
    mut devices: Vec<Option<Arc<dyn Device>>>,
    names: &[PathBuf],
    what: &str,
) -> Result<(Array, Vec<usize>)> {
    let probed = probe_chunks(&devices, true);
    let formatted = probed.iter().any(|p| matches!(p, Some(Ok(true))));
    let mut fresh = Vec::new();
    if formatted {
        // A chunk of an earlier occupant of its shard, which the newest
        // superblock no longer names there (`array::replaced_members`):
        // the shard placed again on a server that still holds its chunk
        // from before it moved away (the server was out, the shard rebuilt
        // elsewhere, then moved back). Its stale blocks match their own
        // checksums, and taken as current they were read back: it is
        // rebuilt as a blank chunk is. A chunk the newest superblock still
        // names was only down, however many generations it missed: the
        // open below re-adds it (what it missed, not all of it).
        let stale = array::replaced_members(&devices);
        // Only a chunk that reads and holds no superblock: one that cannot
        // be read (a lost frame) is no blank chunk, and goes to the open
        // as any other (which fails it if it still cannot be read).
        for (shard, probe) in probed.iter().enumerate() {
            let blank = matches!(probe, Some(Ok(false)));
            if blank || (devices[shard].is_some() && stale.contains(&shard)) {
                if !blank {
                    line(
                        COMPONENT,
                        "shard-stale",
                        &[("array", &what), ("shard", &shard)],
                    );
                }
                let dev = devices[shard].take().expect("probed");
                fresh.push((shard, dev));
            }
        }
    }
    let array = open_probed(dir, options, devices, &probed, what)?;
    let mut installed = Vec::new();
    for (shard, dev) in fresh {
        // A replacement that cannot be installed now (its server lost a
        // frame) leaves the shard failed, as an unreachable server would:
        // the PG serves degraded and the next open installs it.
        match array.install_replacement(shard, dev, &names[shard]) {
            Ok(()) => installed.push(shard),
            Err(e) => line(
                COMPONENT,
                "shard-replacement-not-installed",
                &[("array", &what), ("shard", &shard), ("reason", &e)],
            ),
        }
    }
    Ok((array, installed))
}

/// Each chunk's superblock, probed: `Ok(true)` held, `Ok(false)` blank,
/// an error where it could not be read; None where the server cannot be
/// reached, or (`all` false) past the first chunk found formatted.
fn probe_chunks(devices: &[Option<Arc<dyn Device>>], all: bool) -> Vec<Option<Result<bool>>> {
    let mut formatted = false;
    devices
        .iter()
        .map(|d| {
            let probe = d
                .as_ref()
                .filter(|_| all || !formatted)
                .map(|d| array::probe_superblock(d.as_ref()));
            formatted |= matches!(probe, Some(Ok(true)));
            probe
        })
        .collect()
}

/// The array of one PG over its chunks (`devices`, in shard order, None
/// where a server cannot be reached), with its client state in `dir`:
/// formatted with `options` when no chunk holds a superblock yet (only
/// with every chunk there and read), else opened with the settings the
/// chunks carry, which replays the parity journals and resynchronises
/// what the last writer left dirty. `what` names the PG in messages.
pub fn open_pg_array(
    dir: &Path,
    options: &CreateOptions,
    devices: Vec<Option<Arc<dyn Device>>>,
    what: &str,
) -> Result<Array> {
    let probed = probe_chunks(&devices, false);
    open_probed(dir, options, devices, &probed, what)
}

/// [`open_pg_array`] with the chunks' superblocks probed (`probed`, of
/// the chunks as they were before any was taken out as a replacement).
fn open_probed(
    dir: &Path,
    options: &CreateOptions,
    devices: Vec<Option<Arc<dyn Device>>>,
    probed: &[Option<Result<bool>>],
    what: &str,
) -> Result<Array> {
    let config = dir.join(array::CONFIG_FILE);
    let _ = std::fs::remove_file(&config);
    let formatted = probed.iter().any(|p| matches!(p, Some(Ok(true))));
    // A chunk that could not be read may hold a superblock: the PG is
    // formatted only once every chunk read blank, never over data.
    if let (false, Some((shard, Some(Err(e))))) = (
        formatted,
        probed
            .iter()
            .enumerate()
            .find(|(_, p)| matches!(p, Some(Err(_)))),
    ) {
        return Err(Error::Unavailable(format!(
            "{what}: no chunk read holds a superblock, and shard {shard}'s cannot be read \
             ({e}): it is formatted only once every chunk reads blank"
        )));
    }
    if !formatted {
        if devices.iter().any(Option::is_none) {
            return Err(Error::Unavailable(format!(
                "{what} is new and a server of it cannot be reached: it is formatted only \
                 with all {} servers up",
                devices.len()
            )));
        }
        line(
            COMPONENT,
            "format",
            &[("array", &what), ("chunk_bytes", &devices_size(&devices))],
        );
        array::format(dir, options, devices.iter().flatten().cloned().collect())?;
    } else {
        let mut cfg: ConfigFile = array::config_from_devices(&devices)?;
        cfg.devices = options.devices.clone();
        cfg.store(dir)?;
    }
    let array = Array::open_with_devices(dir, devices.clone(), None)?;
    // A server that is back: its shard rejoins (`re-add`), resynchronising
    // only the regions written while it was out and the stripes its own
    // parity journal held, through its dedup maps if the pool has dedup;
    // or it stays failed (an image older than the missed map, a second
    // failure) until it is replaced and rebuilt.
    let failed: Vec<usize> = array
        .status()
        .devices
        .iter()
        .filter(|d| d.state == array::MemberState::Failed)
        .map(|d| d.position)
        .collect();
    for d in failed {
        let Some(dev) = devices[d].clone() else {
            continue;
        };
        match array.re_add_device(d, dev) {
            Ok(units) => line(
                COMPONENT,
                "shard-resynced",
                &[("array", &what), ("shard", &d), ("units", &units)],
            ),
            // Paused below k other members in service: rebuilding from
            // where it stopped, which the rebuild at open resumes.
            Err(e) => line(
                COMPONENT,
                match array.member_states()[d] {
                    array::MemberState::Failed => "shard-stays-failed",
                    _ => "shard-resync-paused",
                },
                &[("array", &what), ("shard", &d), ("reason", &e)],
            ),
        }
    }
    Ok(array)
}

/// The size of the first reachable chunk (all are alike), for the log.
fn devices_size(devices: &[Option<Arc<dyn Device>>]) -> u64 {
    devices
        .iter()
        .flatten()
        .map(|d| d.size())
        .next()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ecdedup_cluster::keys::{FailureDomain, JOURNAL_BYTES_DEFAULT};

    #[test]
    fn a_pgs_shards_are_formatted_with_the_pools_journal_bound() {
        let spec = PoolSpec {
            k: 4,
            m: 2,
            stripe_unit_bytes: 65536,
            policy: PoolPolicy::Parix,
            dedup: DedupPolicy::None,
            pg_count: 4,
            failure_domain: FailureDomain::Host,
            min_size: None,
            journal_bytes: None,
        };
        let names = |n| (0..n).map(|i| PathBuf::from(format!("c{i}"))).collect();
        let default = create_options(&spec, names(6), 1 << 30).unwrap();
        assert_eq!(default.journal_bytes_max, JOURNAL_BYTES_DEFAULT);
        assert_eq!(default.write_policy, WritePolicy::Parix);
        let set = PoolSpec {
            journal_bytes: Some(256 << 20),
            ..spec
        };
        assert_eq!(
            create_options(&set, names(6), 1 << 30)
                .unwrap()
                .journal_bytes_max,
            256 << 20
        );
    }
}
