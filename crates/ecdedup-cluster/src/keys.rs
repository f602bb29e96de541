//! The one etcd key layout of a cluster, and the typed (JSON) value of
//! every key.
//!
//! Every key lives under `/ecdedup/<cluster>/`; [`Keys`] builds them and
//! [`Keys::parse`] maps a key back to what it names (the watch layer's
//! consumers use it). Each builder's doc says who writes the key and under
//! which guard; `docs/cluster.md` ("etcd keys") is the same table for
//! operators. Names (cluster, pool, volume) are 1 to [`NAME_BYTES_MAX`]
//! bytes of `[A-Za-z0-9._-]`, so a name never contains the `/` that
//! separates the parts of a key, and a prefix such as `volume/<pool>/`
//! never matches another pool's keys.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The root under which every cluster's keys live.
pub const ROOT: &str = "/ecdedup/";
/// Longest cluster, pool or volume name, in bytes.
pub const NAME_BYTES_MAX: usize = 64;

/// A chunk server's id: chosen by the operator, unique in the cluster
/// (registration refuses a second server with the same id).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ServerId(pub u32);

impl std::fmt::Display for ServerId {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Checks a cluster, pool or volume name.
pub fn check_name(what: &'static str, name: &str) -> Result<()> {
    if name.is_empty() || name.len() > NAME_BYTES_MAX {
        return Err(Error::invalid(
            what,
            format!("{name:?} must be 1 to {NAME_BYTES_MAX} bytes long"),
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(Error::invalid(
            what,
            format!("{name:?} holds {c:?}; names are made of A-Z a-z 0-9 . _ -"),
        ));
    }
    Ok(())
}

/// What a key of the layout names (the inverse of the builders).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Key {
    ServerState(ServerId),
    ServerSpace(ServerId),
    ServerEpochs(ServerId),
    Pool(String),
    Pg {
        pool: String,
        pg: u32,
    },
    Volume {
        pool: String,
        name: String,
    },
    VolumeIdNext,
    VolumeWriter(u64),
    Coordinator,
    Rebuild {
        pool: String,
        pg: u32,
    },
    RebuildProgress {
        pool: String,
        pg: u32,
        volume_id: u64,
    },
}

/// The keys of one cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    /// The layout of cluster `cluster` (a checked name).
    pub fn new(cluster: &str) -> Result<Keys> {
        check_name("cluster name", cluster)?;
        Ok(Keys {
            prefix: format!("{ROOT}{cluster}/"),
        })
    }

    /// `/ecdedup/<cluster>/`: every key of the cluster starts with it.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `server/<id>/state` ([`ServerInfo`]). Written by the chunk server,
    /// under its lease, created with `create_revision == 0`: a second
    /// server with the same id is refused while the first one's lease lives.
    pub fn server_state(&self, id: ServerId) -> String {
        format!("{}server/{id}/state", self.prefix)
    }

    /// `server/<id>/space` ([`ServerSpace`]). Written by the chunk server,
    /// under the same lease as its state key (gone with it).
    pub fn server_space(&self, id: ServerId) -> String {
        format!("{}server/{id}/space", self.prefix)
    }

    /// `server/<id>/epochs` ([`EpochsSeen`]). Written by the chunk server,
    /// under the same lease as its state key (gone with it), each time it
    /// has applied the volumes' writer keys up to a newer revision: every
    /// writer epoch created at or below `through` is stored on the server,
    /// which refuses the older writers from then on. A new writer waits
    /// for it on every server its epoch push did not reach
    /// (docs/cluster.md, "Fencing").
    pub fn server_epochs(&self, id: ServerId) -> String {
        format!("{}server/{id}/epochs", self.prefix)
    }

    /// The prefix of one server's keys.
    pub fn server(&self, id: ServerId) -> String {
        format!("{}server/{id}/", self.prefix)
    }

    /// The prefix of every server key.
    pub fn servers(&self) -> String {
        format!("{}server/", self.prefix)
    }

    /// `pool/<name>` ([`PoolRecord`]). Written by `pool create`, created
    /// with `version == 0`; its later writes (`ready`) compare its
    /// `mod_revision` with the one the creator wrote.
    pub fn pool(&self, name: &str) -> String {
        format!("{}pool/{name}", self.prefix)
    }

    /// The prefix of every pool key.
    pub fn pools(&self) -> String {
        format!("{}pool/", self.prefix)
    }

    /// `pg/<pool>/<pg>` ([`PgRecord`]). Written by `pool create` while the
    /// pool is being created (compare: the pool key's `mod_revision` is the
    /// creator's); later by the coordinator when a server is out (comparing its term and
    /// the PG key's `mod_revision`; the PG's epoch bumped).
    pub fn pg(&self, pool: &str, pg: u32) -> String {
        format!("{}pg/{pool}/{pg}", self.prefix)
    }

    /// The prefix of one pool's PG keys.
    pub fn pgs(&self, pool: &str) -> String {
        format!("{}pg/{pool}/", self.prefix)
    }

    /// `volume/<pool>/<name>` ([`VolumeRecord`]). Written by `volume
    /// create` (`version == 0`, with the id counter's and the pool's
    /// `mod_revision` compared), `resize` and `rm` (the volume's
    /// `mod_revision` compared; `rm` also needs no writer key).
    pub fn volume(&self, pool: &str, name: &str) -> String {
        format!("{}volume/{pool}/{name}", self.prefix)
    }

    /// The prefix of one pool's volume keys.
    pub fn volumes(&self, pool: &str) -> String {
        format!("{}volume/{pool}/", self.prefix)
    }

    /// The prefix of every pool's volume keys.
    pub fn all_volumes(&self) -> String {
        format!("{}volume/", self.prefix)
    }

    /// `volume-id-next` (a JSON number, absent = 1): the next volume id.
    /// Written by `volume create` in the same transaction as the volume,
    /// comparing its `mod_revision`, so two creates never share an id and
    /// an id is never reused.
    pub fn volume_id_next(&self) -> String {
        format!("{}volume-id-next", self.prefix)
    }

    /// `volume-writer/<id>` ([`WriterRecord`]). Written by the volume's
    /// writer (`serve --cluster`) under its lease, created with
    /// `create_revision == 0`; its creation revision is the volume's epoch.
    pub fn volume_writer(&self, volume_id: u64) -> String {
        format!("{}volume-writer/{volume_id}", self.prefix)
    }

    /// The prefix of every writer key.
    pub fn volume_writers(&self) -> String {
        format!("{}volume-writer/", self.prefix)
    }

    /// `coordinator` ([`CoordinatorRecord`]). Written by the chunk server
    /// elected coordinator, under its registration lease, created with
    /// `create_revision == 0`: its creation revision is the coordinator's
    /// term, and every placement write compares it.
    pub fn coordinator(&self) -> String {
        format!("{}coordinator", self.prefix)
    }

    /// `rebuild/<pool>/<pg>` ([`RebuildRecord`]): the shards of a PG that
    /// were re-placed and are to be rebuilt. Written by the coordinator in
    /// the transaction that re-places the PG (comparing its term and the
    /// PG key's `mod_revision`), and by it again when every volume of the
    /// pool has rebuilt them.
    pub fn rebuild(&self, pool: &str, pg: u32) -> String {
        format!("{}rebuild/{pool}/{pg}", self.prefix)
    }

    /// The prefix of pool `pool`'s rebuild records.
    pub fn pool_rebuilds(&self, pool: &str) -> String {
        format!("{}rebuild/{pool}/", self.prefix)
    }

    /// The prefix of pool `pool`'s rebuild progress records.
    pub fn pool_rebuild_progresses(&self, pool: &str) -> String {
        format!("{}rebuild-progress/{pool}/", self.prefix)
    }

    /// The prefix of every rebuild record.
    pub fn rebuilds(&self) -> String {
        format!("{}rebuild/", self.prefix)
    }

    /// `rebuild-progress/<pool>/<pg>/<volume id>` ([`RebuildProgress`]):
    /// how far the volume's writer has rebuilt its chunks of the PG.
    /// Written by that writer, comparing the creation revision of its
    /// writer key (its epoch), so a fenced writer writes none.
    pub fn rebuild_progress(&self, pool: &str, pg: u32, volume_id: u64) -> String {
        format!("{}rebuild-progress/{pool}/{pg}/{volume_id}", self.prefix)
    }

    /// The prefix of every rebuild progress record.
    pub fn rebuild_progresses(&self) -> String {
        format!("{}rebuild-progress/", self.prefix)
    }

    /// What `key` names, or `None` for a key outside the layout.
    pub fn parse(&self, key: &str) -> Option<Key> {
        let rest = key.strip_prefix(self.prefix.as_str())?;
        let parts: Vec<&str> = rest.split('/').collect();
        let name = |s: &str| check_name("name", s).ok().map(|()| s.to_string());
        let number = |s: &str| -> Option<u64> {
            // Canonical decimal only: the builders never write "01" or "+1".
            (!s.is_empty() && s.len() <= 20 && s.bytes().all(|b| b.is_ascii_digit()))
                .then(|| s.parse().ok())
                .flatten()
                .filter(|n: &u64| n.to_string() == s)
        };
        let server = |s: &str| number(s).and_then(|n| u32::try_from(n).ok()).map(ServerId);
        match parts.as_slice() {
            ["server", id, "state"] => server(id).map(Key::ServerState),
            ["server", id, "space"] => server(id).map(Key::ServerSpace),
            ["server", id, "epochs"] => server(id).map(Key::ServerEpochs),
            ["pool", pool] => name(pool).map(Key::Pool),
            ["pg", pool, pg] => Some(Key::Pg {
                pool: name(pool)?,
                pg: u32::try_from(number(pg)?).ok()?,
            }),
            ["volume", pool, volume] => Some(Key::Volume {
                pool: name(pool)?,
                name: name(volume)?,
            }),
            ["volume-id-next"] => Some(Key::VolumeIdNext),
            ["volume-writer", id] => number(id).map(Key::VolumeWriter),
            ["coordinator"] => Some(Key::Coordinator),
            ["rebuild", pool, pg] => Some(Key::Rebuild {
                pool: name(pool)?,
                pg: u32::try_from(number(pg)?).ok()?,
            }),
            ["rebuild-progress", pool, pg, volume] => Some(Key::RebuildProgress {
                pool: name(pool)?,
                pg: u32::try_from(number(pg)?).ok()?,
                volume_id: number(volume)?,
            }),
            _ => None,
        }
    }
}

/// One device of a chunk server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    /// The device's path on its host.
    pub path: String,
    /// Its data capacity.
    pub bytes: u64,
}

/// `server/<id>/state`: where a chunk server listens and what it owns.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerInfo {
    /// `host:port` of its data protocol.
    pub address: String,
    /// The failure domain `host` of placement (a host name).
    pub host: String,
    pub devices: Vec<DeviceInfo>,
    /// What of the data protocol it takes beyond the first version
    /// ([`FEATURES`]); absent in a record from a server before 2026-11-29
    /// (evening), which takes none of them. A writer uses a feature only
    /// with a server whose record names it.
    #[serde(default)]
    pub features: Vec<String>,
}

/// A `LogAppend` may carry barriers (`proto::frame::encode_append`).
pub const FEATURE_LOG_APPEND_BARRIER: &str = "log-append-barrier";

/// The server runs a chunk's dedup layer when asked (`Op::Layer`), and a
/// `Write` may say its class (`proto::frame::FLAG_PARITY` and the rest).
pub const FEATURE_DEDUP_LAYER: &str = "dedup-layer";

/// The server follows the volumes' writer keys in etcd and stores each new
/// epoch before it says so in `server/<id>/epochs` ([`EpochsSeen`]): a
/// new writer whose push misses it waits for that, or for its lease to
/// end, before it serves.
pub const FEATURE_EPOCH_WATCH: &str = "epoch-watch";

/// The features this build's chunk server takes ([`ServerInfo::features`]).
pub const FEATURES: &[&str] = &[
    FEATURE_LOG_APPEND_BARRIER,
    FEATURE_DEDUP_LAYER,
    FEATURE_EPOCH_WATCH,
];

impl ServerInfo {
    /// Whether the server's record names `feature`.
    pub fn takes(&self, feature: &str) -> bool {
        self.features.iter().any(|f| f == feature)
    }
}

/// Space of one device, as its chunk server last reported it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceSpace {
    pub path: String,
    pub bytes_free: u64,
    pub bytes_used: u64,
}

/// `server/<id>/space`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerSpace {
    pub devices: Vec<DeviceSpace>,
    /// The dedup layers the server runs over its chunks (since
    /// the late evening of 2026-11-29; absent from an older server's report).
    #[serde(default)]
    pub dedup: ServerDedup,
    /// The same, per volume (since the night of 2026-11-29 to 30; absent
    /// from an older server's report): `cluster status` sums them over
    /// the servers into each volume's dedup ratio.
    #[serde(default)]
    pub volumes: BTreeMap<u64, VolumeDedup>,
    /// Volumes left out of `volumes` (past [`VOLUMES_REPORTED_MAX`], the
    /// fewest blocks mapped first), so the report stays far below etcd's
    /// request size limit.
    #[serde(default)]
    pub volumes_left_out: u64,
}

/// The most volumes a server's space report names in `volumes` (about
/// 200 bytes of JSON each).
pub const VOLUMES_REPORTED_MAX: usize = 1024;

impl ServerSpace {
    /// Keeps the [`VOLUMES_REPORTED_MAX`] volumes with the most blocks
    /// mapped in `volumes`, counting the others in `volumes_left_out`.
    pub fn bound_volumes(&mut self) {
        if self.volumes.len() <= VOLUMES_REPORTED_MAX {
            return;
        }
        let mut by_size: Vec<(u64, u64)> = self
            .volumes
            .iter()
            .map(|(&id, v)| (v.mapped_blocks, id))
            .collect();
        by_size.sort_unstable_by(|a, b| b.cmp(a));
        for &(_, id) in &by_size[VOLUMES_REPORTED_MAX..] {
            self.volumes.remove(&id);
            self.volumes_left_out += 1;
        }
    }
}

/// A chunk server's dedup layers of one volume.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeDedup {
    /// Chunks whose layer's space is counted: those open now, and those
    /// closed since the server started (as they were at their close).
    pub chunks: u64,
    /// Blocks of those chunks' data areas mapped (written, not
    /// discarded), and the slots they use: the layers save the difference.
    pub mapped_blocks: u64,
    pub slots_used: u64,
    /// Since the server started: dedup blocks written (slot writes), and
    /// blocks stored as a reference; of those, parity blocks.
    pub physical_writes: u64,
    pub reference_writes: u64,
    pub reference_parity_writes: u64,
}

/// A chunk server's dedup layers: how many are open, and their counters
/// summed since the server started (a layer's at its close included).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerDedup {
    pub layers_open: u64,
    /// RAM the open layers hold (maps, fingerprint indexes).
    #[serde(default)]
    pub layers_ram_bytes: u64,
    /// Dedup blocks written to the chunks (slot writes).
    pub physical_writes: u64,
    /// Blocks stored as a reference to a slot already written; of those,
    /// parity blocks.
    pub reference_writes: u64,
    pub reference_parity_writes: u64,
    /// Blocks fingerprinted.
    pub hash_ops: u64,
    /// Bytes of map records and snapshots written.
    pub log_bytes: u64,
}

/// A pool's partial-write policy (the engine's `WritePolicy`, with the
/// replica count of `replicate` explicit).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WritePolicy {
    Rmw,
    Plog,
    Parix,
    /// `copies` full copies: stored as RS(1, copies - 1).
    Replicate {
        copies: u32,
    },
}

/// A pool's dedup policy (the engine's `dedup::Policy`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DedupPolicy {
    None,
    All,
    Parity,
}

/// What must differ between the servers of one PG.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailureDomain {
    /// Distinct `host` values: a host lost costs each PG one shard at most.
    Host,
    /// Distinct servers only (each owns its own devices): one-machine trials.
    Device,
}

/// The settings of a pool, fixed at creation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolSpec {
    pub k: u32,
    pub m: u32,
    pub stripe_unit_bytes: u32,
    pub policy: WritePolicy,
    pub dedup: DedupPolicy,
    pub pg_count: u32,
    pub failure_domain: FailureDomain,
    /// The fewest shards of a PG that must be in service for the PG to
    /// take writes (`pool create --min-size`); `None` (and a record
    /// written before the field existed) is [`PoolSpec::min_size_default`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_size: Option<u32>,
    /// Bound of each shard's parity journal in bytes under plog and parix
    /// (`pool create --journal-max`); `None` (and a record written before
    /// the field existed) is [`JOURNAL_BYTES_DEFAULT`]. Read when a PG's
    /// shards are formatted: a PG formatted before keeps its bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub journal_bytes: Option<u64>,
}

/// Most shards in a stripe (k + m), as the engine's codec allows.
pub const SHARDS_MAX: u32 = 32;
/// Most PGs in a pool.
pub const PG_COUNT_MAX: u32 = 1 << 16;
/// Largest stripe unit, in bytes.
pub const STRIPE_UNIT_BYTES_MAX: u32 = 4 << 20;
/// Sizes (stripe units, volumes) are multiples of this.
pub const BLOCK_BYTES: u32 = 4096;
/// Each shard's parity journal bound unless the pool sets one: a journal
/// past half of it is replayed, which empties it of every d(0) that
/// parix's speculation needs (docs/cluster.md).
pub const JOURNAL_BYTES_DEFAULT: u64 = 32 << 20;
/// The smallest journal bound a pool takes: at least the engine's
/// smallest (`ecdedup_core::array::JOURNAL_BYTES_MIN`, checked when the
/// volume client is compiled), so that a pool refused at its first serve is
/// refused at `pool create` instead.
pub const JOURNAL_BYTES_MIN: u64 = 2 << 20;
/// The largest: the bound is reserved on each parity shard's device.
pub const JOURNAL_BYTES_MAX: u64 = 64 << 30;

impl PoolSpec {
    /// Servers per PG: k + m.
    pub fn width(&self) -> u32 {
        self.k + self.m
    }

    /// k + 1 where m >= 2 (a write acknowledged then survives one more
    /// loss), else k.
    pub fn min_size_default(&self) -> u32 {
        if self.m >= 2 {
            self.k + 1
        } else {
            self.k
        }
    }

    /// The pool's min_size: the fewest shards of a PG in service for
    /// writes (reads go on while k remain).
    pub fn min_size(&self) -> u32 {
        self.min_size.unwrap_or_else(|| self.min_size_default())
    }

    /// The bound of each shard's parity journal (plog, parix).
    pub fn journal_bytes(&self) -> u64 {
        self.journal_bytes.unwrap_or(JOURNAL_BYTES_DEFAULT)
    }

    /// The largest volume the pool can serve: each PG's array holds at
    /// most 2^40 stripes and under 2^63 bytes (the engine's
    /// `Geometry::validate`), and a volume's stripes go round its PGs;
    /// at most [`crate::volume::VOLUME_BYTES_MAX`].
    pub fn volume_bytes_max(&self) -> u64 {
        let stripe = u64::from(self.k) * u64::from(self.stripe_unit_bytes);
        if stripe == 0 {
            return 0;
        }
        let per_pg = (1u64 << 40).min((u64::MAX / 2) / stripe);
        per_pg
            .saturating_mul(u64::from(self.pg_count))
            .saturating_mul(stripe)
            .min(crate::volume::VOLUME_BYTES_MAX)
    }

    /// Checks a new pool's settings: [`PoolSpec::check`], and a stripe
    /// unit the engine can open (a power of two: `Geometry::validate`).
    /// Not part of `check`, which every read of a pool record runs: a pool
    /// an older build created with, say, 12K units is refused by `serve`
    /// and still listed (and removable: `remove_pool`), where failing its
    /// read would fail every listing of the pools.
    pub fn check_new(&self) -> Result<()> {
        self.check()?;
        if !self.stripe_unit_bytes.is_power_of_two() {
            return Err(Error::invalid(
                "pool settings",
                format!(
                    "stripe unit {} bytes must be a power of two (4K, 8K, ... 4M)",
                    self.stripe_unit_bytes
                ),
            ));
        }
        Ok(())
    }

    /// Checks the settings: the bounds above, `replicate(n)` stored as
    /// RS(1, n - 1), and a min_size from k to k + m.
    pub fn check(&self) -> Result<()> {
        let bad = |reason: String| Err(Error::invalid("pool settings", reason));
        if self.k == 0 || self.width() > SHARDS_MAX {
            return bad(format!(
                "k = {}, m = {}: k must be at least 1 and k + m at most {SHARDS_MAX}",
                self.k, self.m
            ));
        }
        if let WritePolicy::Replicate { copies } = self.policy {
            if copies < 2 || self.k != 1 || self.m + 1 != copies {
                return bad(format!(
                    "replicate({copies}) is stored as k = 1, m = copies - 1 with at least 2 copies \
                     (given k = {}, m = {})",
                    self.k, self.m
                ));
            }
        } else if self.m == 0 {
            return bad(format!("{:?} needs m >= 1", self.policy));
        }
        if self.stripe_unit_bytes == 0
            || !self.stripe_unit_bytes.is_multiple_of(BLOCK_BYTES)
            || self.stripe_unit_bytes > STRIPE_UNIT_BYTES_MAX
        {
            return bad(format!(
                "stripe unit {} bytes must be a multiple of {BLOCK_BYTES} up to {STRIPE_UNIT_BYTES_MAX}",
                self.stripe_unit_bytes
            ));
        }
        if let Some(min) = self.min_size {
            if min < self.k || min > self.width() {
                return bad(format!(
                    "min_size {min} must be from k = {} to k + m = {}",
                    self.k,
                    self.width()
                ));
            }
        }
        if let Some(bytes) = self.journal_bytes {
            if !(JOURNAL_BYTES_MIN..=JOURNAL_BYTES_MAX).contains(&bytes)
                || !bytes.is_multiple_of(u64::from(BLOCK_BYTES))
            {
                return bad(format!(
                    "journal bound {bytes} bytes must be a multiple of {BLOCK_BYTES} from \
                     {JOURNAL_BYTES_MIN} to {JOURNAL_BYTES_MAX}"
                ));
            }
        }
        if self.pg_count == 0 || self.pg_count > PG_COUNT_MAX {
            return bad(format!(
                "{} PGs: a pool has 1 to {PG_COUNT_MAX}",
                self.pg_count
            ));
        }
        Ok(())
    }
}

/// `pool/<name>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolRecord {
    #[serde(flatten)]
    pub spec: PoolSpec,
    /// False while `pool create` is still writing the PG records (a pool
    /// with many PGs takes several transactions): no volume is created in
    /// a pool that is not ready.
    pub ready: bool,
}

/// `pg/<pool>/<pg>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PgRecord {
    /// Shard i of every stripe of the PG lives on `servers[i]` (k data
    /// shards, then m parity).
    pub servers: Vec<ServerId>,
    /// Bumped by the coordinator on every change of `servers`.
    pub epoch: u64,
}

/// `volume/<pool>/<name>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    /// Unique in the cluster, never reused; the stripe-to-PG mapping and
    /// the writer key use it.
    pub id: u64,
    pub size_bytes: u64,
    /// The bytes its PGs' chunks were formatted for at its first serve
    /// (`max(size, 256 GiB)`), recorded by that writer: `volume resize`
    /// refuses to grow past it (serve would refuse the volume). Absent
    /// before a first serve, and in records of older builds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_bytes: Option<u64>,
}

/// `server/<id>/epochs`: how far the server has applied the volumes'
/// writer keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochsSeen {
    /// Every writer key created at or below this etcd revision has its
    /// epoch (its creation revision) stored on the server.
    pub through: u64,
}

/// `volume-writer/<id>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriterRecord {
    /// Where the writer (the NBD server of the volume) runs.
    pub address: String,
}

/// `coordinator`: the chunk server that re-places the PGs of servers out.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoordinatorRecord {
    pub server: ServerId,
    pub address: String,
}

/// One shard of a PG moved from a server that is out to another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardMove {
    pub shard: u32,
    pub from: ServerId,
    pub to: ServerId,
    /// The PG's epoch that the move created.
    pub epoch: u64,
}

/// `rebuild/<pool>/<pg>`: the moves whose rebuild is not known to be done
/// in every volume of the pool.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RebuildRecord {
    pub moves: Vec<ShardMove>,
}

/// `rebuild-progress/<pool>/<pg>/<volume id>`: one volume's rebuild of
/// its chunks of a PG, as its writer last reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RebuildProgress {
    /// The PG's epoch the writer rebuilds for (its placement at open).
    pub epoch: u64,
    /// Stripes done (rebuilt or found not to hold the shard) and in all.
    pub done: u64,
    pub total: u64,
    /// True once the engine marked the shard rebuilt (never before).
    pub finished: bool,
}

/// Encodes a value for etcd.
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // Plain structs of numbers, strings and enums: serialization cannot fail.
    serde_json::to_vec(value).expect("a layout value serializes")
}

/// Decodes the value of `key`, naming the key when it is not valid.
pub fn decode<T: for<'de> Deserialize<'de>>(key: &str, value: &[u8]) -> Result<T> {
    serde_json::from_slice(value).map_err(|e| Error::Corrupt {
        key: key.to_string(),
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builder_parses_back_to_what_it_names() {
        let keys = Keys::new("c1").unwrap();
        let cases = [
            (
                keys.server_state(ServerId(7)),
                Key::ServerState(ServerId(7)),
            ),
            (
                keys.server_space(ServerId(7)),
                Key::ServerSpace(ServerId(7)),
            ),
            (
                keys.server_epochs(ServerId(7)),
                Key::ServerEpochs(ServerId(7)),
            ),
            (keys.pool("p"), Key::Pool("p".into())),
            (
                keys.pg("p", 12),
                Key::Pg {
                    pool: "p".into(),
                    pg: 12,
                },
            ),
            (
                keys.volume("p", "v.1"),
                Key::Volume {
                    pool: "p".into(),
                    name: "v.1".into(),
                },
            ),
            (keys.volume_id_next(), Key::VolumeIdNext),
            (keys.volume_writer(3), Key::VolumeWriter(3)),
            (keys.coordinator(), Key::Coordinator),
            (
                keys.rebuild("p", 4),
                Key::Rebuild {
                    pool: "p".into(),
                    pg: 4,
                },
            ),
            (
                keys.rebuild_progress("p", 4, 9),
                Key::RebuildProgress {
                    pool: "p".into(),
                    pg: 4,
                    volume_id: 9,
                },
            ),
        ];
        for (key, named) in cases {
            assert!(key.starts_with("/ecdedup/c1/"), "{key}");
            assert_eq!(keys.parse(&key), Some(named), "{key}");
        }
    }

    #[test]
    fn a_space_report_names_at_most_its_bound_of_volumes_the_largest_kept() {
        let mut space = ServerSpace {
            devices: vec![],
            dedup: ServerDedup::default(),
            volumes: (0..VOLUMES_REPORTED_MAX as u64 + 3)
                .map(|id| {
                    let v = VolumeDedup {
                        mapped_blocks: id,
                        ..VolumeDedup::default()
                    };
                    (id, v)
                })
                .collect(),
            volumes_left_out: 0,
        };
        space.bound_volumes();
        assert_eq!(space.volumes.len(), VOLUMES_REPORTED_MAX);
        assert_eq!(space.volumes_left_out, 3);
        assert!(!space.volumes.contains_key(&2) && space.volumes.contains_key(&3));
        assert!(encode(&space).len() < 300 * VOLUMES_REPORTED_MAX);
    }

    #[test]
    fn keys_outside_the_layout_parse_to_none() {
        let keys = Keys::new("c1").unwrap();
        for key in [
            "/ecdedup/c2/pool/p",
            "/ecdedup/c1/server/x/state",
            "/ecdedup/c1/server/01/state",
            "/ecdedup/c1/server/4294967296/state",
            "/ecdedup/c1/pg/p/",
            "/ecdedup/c1/volume/p",
            "/ecdedup/c1/volume/p/a b",
            "/ecdedup/c1/volume-writer/-1",
            "/ecdedup/c1/",
        ] {
            assert_eq!(keys.parse(key), None, "{key}");
        }
    }

    #[test]
    fn names_with_a_slash_or_out_of_bounds_are_refused() {
        for bad in ["", "a/b", "a b", "ü", &"x".repeat(NAME_BYTES_MAX + 1)] {
            assert!(check_name("pool name", bad).is_err(), "{bad:?}");
        }
        assert!(Keys::new("a/b").is_err());
        check_name("pool name", "Pool_1.x-y").unwrap();
    }

    #[test]
    fn pool_settings_are_checked() {
        let good = PoolSpec {
            k: 4,
            m: 2,
            stripe_unit_bytes: 65536,
            policy: WritePolicy::Parix,
            dedup: DedupPolicy::Parity,
            pg_count: 64,
            failure_domain: FailureDomain::Host,
            min_size: None,
            journal_bytes: None,
        };
        good.check().unwrap();
        PoolSpec {
            journal_bytes: Some(1 << 30),
            ..good.clone()
        }
        .check()
        .unwrap();
        let replicate = PoolSpec {
            k: 1,
            m: 2,
            policy: WritePolicy::Replicate { copies: 3 },
            ..good.clone()
        };
        replicate.check().unwrap();
        for bad in [
            PoolSpec {
                k: 0,
                ..good.clone()
            },
            PoolSpec {
                m: 0,
                ..good.clone()
            },
            PoolSpec {
                k: 30,
                m: 3,
                ..good.clone()
            },
            PoolSpec {
                stripe_unit_bytes: 1000,
                ..good.clone()
            },
            PoolSpec {
                pg_count: 0,
                ..good.clone()
            },
            PoolSpec {
                policy: WritePolicy::Replicate { copies: 3 },
                ..good.clone()
            },
            PoolSpec {
                m: 1,
                ..replicate.clone()
            },
            PoolSpec {
                min_size: Some(3),
                ..good.clone()
            },
            PoolSpec {
                min_size: Some(7),
                ..good.clone()
            },
            PoolSpec {
                journal_bytes: Some(4096),
                ..good.clone()
            },
            PoolSpec {
                journal_bytes: Some((1 << 30) + 1),
                ..good.clone()
            },
            PoolSpec {
                journal_bytes: Some(128 << 30),
                ..good.clone()
            },
        ] {
            let err = bad.check().unwrap_err();
            assert!(matches!(err, Error::Invalid { .. }), "{bad:?}: {err}");
        }
        // A stripe unit the engine cannot open (not a power of two): a new
        // pool is refused; one already stored still reads.
        let twelve = PoolSpec {
            stripe_unit_bytes: 12 << 10,
            ..good.clone()
        };
        twelve.check().unwrap();
        let err = twelve.check_new().unwrap_err();
        assert!(err.to_string().contains("power of two"), "{err}");
        good.check_new().unwrap();
    }

    #[test]
    fn values_round_trip_and_bad_json_names_the_key() {
        let pool = PoolRecord {
            spec: PoolSpec {
                k: 1,
                m: 2,
                stripe_unit_bytes: 4096,
                policy: WritePolicy::Replicate { copies: 3 },
                dedup: DedupPolicy::None,
                pg_count: 8,
                failure_domain: FailureDomain::Device,
                min_size: Some(3),
                journal_bytes: Some(256 << 20),
            },
            ready: true,
        };
        let bytes = encode(&pool);
        assert_eq!(decode::<PoolRecord>("k", &bytes).unwrap(), pool);
        let err = decode::<VolumeRecord>("/ecdedup/c/volume/p/v", b"{").unwrap_err();
        assert!(err.to_string().contains("/ecdedup/c/volume/p/v"), "{err}");
    }

    #[test]
    fn min_size_defaults_to_k_plus_one_for_m_of_two_and_old_records_read_so() {
        // A pool record written before min_size existed.
        let old = br#"{"k":4,"m":2,"stripe_unit_bytes":65536,"policy":"parix","dedup":"none",
            "pg_count":8,"failure_domain":"host","ready":true}"#;
        let pool: PoolRecord = decode("k", old).unwrap();
        assert_eq!(pool.spec.min_size, None);
        assert_eq!(pool.spec.min_size(), 5);
        assert_eq!(pool.spec.journal_bytes(), JOURNAL_BYTES_DEFAULT);
        let rs21 = PoolSpec {
            k: 2,
            m: 1,
            ..pool.spec.clone()
        };
        assert_eq!(rs21.min_size(), 2);
        let set = PoolSpec {
            min_size: Some(4),
            ..pool.spec.clone()
        };
        set.check().unwrap();
        assert_eq!(set.min_size(), 4);
        // The default is not written out: older readers see what they know.
        let text = String::from_utf8(encode(&pool)).unwrap();
        assert!(
            !text.contains("min_size") && !text.contains("journal_bytes"),
            "{text}"
        );
        let err = decode::<VolumeRecord>("/ecdedup/c/volume/p/v", b"{").unwrap_err();
        assert!(err.to_string().contains("/ecdedup/c/volume/p/v"), "{err}");
    }
}
