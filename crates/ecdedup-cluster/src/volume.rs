//! Volumes: many thin volumes per pool, each with a name, a size and a
//! cluster-wide id that is never reused.
//!
//! Every change is a guarded transaction: `create` compares the volume
//! key's `version == 0`, the id counter's `mod_revision` (so two creates
//! never take the same id) and the pool's `mod_revision` (the pool is
//! ready and was not replaced); `resize` and `rm` compare the volume's
//! `mod_revision` with the one they read, so of two concurrent changes one
//! is refused and says so; `rm` also requires that no writer holds the
//! volume (`volume-writer/<id>` absent).

use crate::error::{Error, Result};
use crate::keys::{
    check_name, decode, encode, Key, PoolSpec, VolumeRecord, WriterRecord, BLOCK_BYTES,
};
use crate::pool::get_pool;
use crate::server::holder_address;
use crate::session::Etcd;
use crate::txn;
use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp, TxnOpResponse};
use std::collections::{BTreeMap, BTreeSet};

/// Tries of `create_volume` when another create took the id meanwhile.
pub const CREATE_ATTEMPTS_MAX: u32 = 16;
/// Largest volume, in bytes (the NBD export size is a signed 64-bit value).
pub const VOLUME_BYTES_MAX: u64 = 1 << 62;

/// A volume as stored, with the revisions its guards compare.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VolumeEntry {
    pub record: VolumeRecord,
    pub mod_revision: i64,
    pub create_revision: i64,
}

fn check_size(size_bytes: u64) -> Result<()> {
    if size_bytes == 0
        || !size_bytes.is_multiple_of(u64::from(BLOCK_BYTES))
        || size_bytes > VOLUME_BYTES_MAX
    {
        return Err(Error::invalid(
            "volume size",
            format!(
                "{size_bytes} bytes must be a positive multiple of {BLOCK_BYTES} up to {VOLUME_BYTES_MAX}"
            ),
        ));
    }
    Ok(())
}

/// Refuses a size the pool's PGs cannot hold (`serve` would refuse it).
fn check_fits(pool: &str, spec: &PoolSpec, size_bytes: u64) -> Result<()> {
    let max = spec.volume_bytes_max();
    if size_bytes > max {
        return Err(Error::invalid(
            "volume size",
            format!(
                "{size_bytes} bytes is past what pool {pool} can serve: at most {max} \
                 ({} PGs, each at most 2^40 stripes of {} data bytes)",
                spec.pg_count,
                u64::from(spec.k) * u64::from(spec.stripe_unit_bytes)
            ),
        ));
    }
    Ok(())
}

/// Creates volume `pool/name` of `size_bytes` with the next free id.
pub async fn create_volume(
    etcd: &Etcd,
    pool: &str,
    name: &str,
    size_bytes: u64,
) -> Result<VolumeRecord> {
    check_name("volume name", name)?;
    check_size(size_bytes)?;
    let keys = etcd.keys();
    let key = keys.volume(pool, name);
    let counter = keys.volume_id_next();
    for _ in 0..CREATE_ATTEMPTS_MAX {
        let pool_entry = get_pool(etcd, pool).await?;
        if !pool_entry.record.ready {
            return Err(Error::PoolNotReady(pool.to_string()));
        }
        check_fits(pool, &pool_entry.record.spec, size_bytes)?;
        let read = txn::get_one(etcd, &counter, "volume create: id counter").await?;
        let (id, counter_revision) = match &read {
            Some(kv) => (decode::<u64>(&counter, kv.value())?, kv.mod_revision()),
            None => (1, 0),
        };
        let record = VolumeRecord {
            id,
            size_bytes,
            capacity_bytes: None,
        };
        let txn = Txn::new()
            .when([
                Compare::version(key.as_str(), CompareOp::Equal, 0),
                Compare::mod_revision(counter.as_str(), CompareOp::Equal, counter_revision),
                Compare::mod_revision(keys.pool(pool), CompareOp::Equal, pool_entry.mod_revision),
            ])
            .and_then([
                TxnOp::put(counter.as_str(), encode(&(id + 1)), None),
                TxnOp::put(key.as_str(), encode(&record), None),
            ])
            .or_else([TxnOp::get(key.as_str(), None)]);
        match txn::run(etcd, txn, "volume create").await? {
            Ok(_) => return Ok(record),
            // The counter or the pool moved under us: read them again.
            Err(None) => continue,
            Err(Some(_)) => {
                return Err(Error::VolumeExists {
                    pool: pool.to_string(),
                    name: name.to_string(),
                })
            }
        }
    }
    Err(Error::Changed {
        key: counter,
        operation: "volume create",
    })
}

/// Records in volume `pool/name`'s record the bytes its chunks were
/// formatted for (`capacity_bytes`), as its writer at `epoch` opened
/// them: guarded by the record's `mod_revision` as read and by the writer
/// key's creation revision (the epoch), so a fenced writer records
/// nothing; a resize in between is read again (up to a few times).
pub async fn record_capacity(
    etcd: &Etcd,
    pool: &str,
    name: &str,
    epoch: u64,
    capacity_bytes: u64,
) -> Result<()> {
    let key = etcd.keys().volume(pool, name);
    for _ in 0..CREATE_ATTEMPTS_MAX {
        let entry = get_volume(etcd, pool, name).await?;
        if entry.record.capacity_bytes == Some(capacity_bytes) {
            return Ok(());
        }
        let writer = etcd.keys().volume_writer(entry.record.id);
        let record = VolumeRecord {
            capacity_bytes: Some(capacity_bytes),
            ..entry.record
        };
        let guarded = Txn::new()
            .when([
                Compare::mod_revision(key.as_str(), CompareOp::Equal, entry.mod_revision),
                Compare::create_revision(writer.as_str(), CompareOp::Equal, epoch as i64),
            ])
            .and_then([TxnOp::put(key.as_str(), encode(&record), None)])
            .or_else([TxnOp::get(writer.as_str(), None)]);
        match txn::run(etcd, guarded, "volume capacity").await? {
            Ok(_) => return Ok(()),
            Err(Some(kv)) if kv.create_revision() == epoch as i64 => continue,
            Err(_) => {
                return Err(Error::Changed {
                    key: writer,
                    operation: "volume capacity (another writer holds the volume)",
                })
            }
        }
    }
    Err(Error::Changed {
        key,
        operation: "volume capacity",
    })
}

/// Volume `pool/name`.
pub async fn get_volume(etcd: &Etcd, pool: &str, name: &str) -> Result<VolumeEntry> {
    check_name("pool name", pool)?;
    check_name("volume name", name)?;
    let key = etcd.keys().volume(pool, name);
    let kv = txn::get_one(etcd, &key, "volume get").await?;
    let kv = kv.ok_or_else(|| Error::VolumeNotFound {
        pool: pool.to_string(),
        name: name.to_string(),
    })?;
    Ok(VolumeEntry {
        record: decode(&key, kv.value())?,
        mod_revision: kv.mod_revision(),
        create_revision: kv.create_revision(),
    })
}

/// The volumes of `pool`, by name.
pub async fn list_volumes(etcd: &Etcd, pool: &str) -> Result<BTreeMap<String, VolumeEntry>> {
    check_name("pool name", pool)?;
    let answer = etcd
        .client()
        .get(
            etcd.keys().volumes(pool),
            Some(GetOptions::new().with_prefix()),
        )
        .await
        .map_err(Error::etcd("volume list"))?;
    let mut volumes = BTreeMap::new();
    for kv in answer.kvs() {
        let key = String::from_utf8_lossy(kv.key()).into_owned();
        if let Some(Key::Volume { name, .. }) = etcd.keys().parse(&key) {
            let entry = VolumeEntry {
                record: decode(&key, kv.value())?,
                mod_revision: kv.mod_revision(),
                create_revision: kv.create_revision(),
            };
            volumes.insert(name, entry);
        }
    }
    Ok(volumes)
}

/// What [`volume_ids`] read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeIds {
    /// The id of every volume of every pool.
    pub live: BTreeSet<u64>,
    /// The next id `volume create` will give.
    pub next: u64,
    /// The etcd cluster's id (from the answer's header) and the cluster's
    /// name, as `<id in hex>/<name>`: ids mean something only there.
    pub cluster: String,
}

/// Every volume id and the next one, read in one transaction (one
/// revision): an id below `next` that is not live belonged to a removed
/// volume, and ids are never reused, so what a chunk server holds of it
/// can go.
pub async fn volume_ids(etcd: &Etcd) -> Result<VolumeIds> {
    let keys = etcd.keys();
    let counter = keys.volume_id_next();
    let read = Txn::new().and_then([
        TxnOp::get(keys.all_volumes(), Some(GetOptions::new().with_prefix())),
        TxnOp::get(counter.as_str(), None),
    ]);
    let answer = etcd
        .client()
        .txn(read)
        .await
        .map_err(Error::etcd("volume ids"))?;
    let cluster = format!(
        "{:x}/{}",
        answer.header().map(|h| h.cluster_id()).unwrap_or(0),
        etcd.keys()
            .prefix()
            .trim_end_matches('/')
            .rsplit('/')
            .next()
            .unwrap_or("")
    );
    let mut ids = BTreeSet::new();
    let mut next = 1;
    for (i, op) in answer.op_responses().into_iter().enumerate() {
        let TxnOpResponse::Get(get) = op else {
            continue;
        };
        for kv in get.kvs() {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            if i == 0 {
                if let Some(Key::Volume { .. }) = keys.parse(&key) {
                    ids.insert(decode::<VolumeRecord>(&key, kv.value())?.id);
                }
            } else {
                next = decode::<u64>(&key, kv.value())?;
            }
        }
    }
    Ok(VolumeIds {
        live: ids,
        next,
        cluster,
    })
}

/// Grows volume `pool/name` to `size_bytes` (shrinking is refused: the
/// chunk servers would keep the data past the new end).
pub async fn resize_volume(
    etcd: &Etcd,
    pool: &str,
    name: &str,
    size_bytes: u64,
) -> Result<VolumeRecord> {
    let entry = get_volume(etcd, pool, name).await?;
    resize_volume_at(etcd, pool, name, &entry, size_bytes).await
}

/// Resizes volume `pool/name` if it is still as `entry` (read before)
/// shows it, else fails with [`Error::Changed`].
pub async fn resize_volume_at(
    etcd: &Etcd,
    pool: &str,
    name: &str,
    entry: &VolumeEntry,
    size_bytes: u64,
) -> Result<VolumeRecord> {
    check_size(size_bytes)?;
    if size_bytes < entry.record.size_bytes {
        return Err(Error::invalid(
            "volume size",
            format!(
                "{pool}/{name} holds {} bytes; shrinking to {size_bytes} is not supported",
                entry.record.size_bytes
            ),
        ));
    }
    check_fits(pool, &get_pool(etcd, pool).await?.record.spec, size_bytes)?;
    if let Some(capacity) = entry.record.capacity_bytes {
        if size_bytes > capacity {
            return Err(Error::invalid(
                "volume size",
                format!(
                    "{pool}/{name}'s chunks were formatted for {capacity} bytes at its first \
                     serve: it cannot grow past that ({size_bytes} asked)"
                ),
            ));
        }
    }
    let key = etcd.keys().volume(pool, name);
    let record = VolumeRecord {
        size_bytes,
        ..entry.record
    };
    let guarded = Txn::new()
        .when([Compare::mod_revision(
            key.as_str(),
            CompareOp::Equal,
            entry.mod_revision,
        )])
        .and_then([TxnOp::put(key.as_str(), encode(&record), None)]);
    txn::run_or_changed(etcd, guarded, &key, "volume resize").await?;
    Ok(record)
}

/// Removes volume `pool/name`, unless a writer holds it.
pub async fn remove_volume(etcd: &Etcd, pool: &str, name: &str) -> Result<()> {
    let entry = get_volume(etcd, pool, name).await?;
    remove_volume_at(etcd, pool, name, &entry).await
}

/// Removes volume `pool/name` if it is still as `entry` shows it and no
/// writer holds it.
pub async fn remove_volume_at(
    etcd: &Etcd,
    pool: &str,
    name: &str,
    entry: &VolumeEntry,
) -> Result<()> {
    let key = etcd.keys().volume(pool, name);
    let writer = etcd.keys().volume_writer(entry.record.id);
    let guarded = Txn::new()
        .when([
            Compare::mod_revision(key.as_str(), CompareOp::Equal, entry.mod_revision),
            Compare::create_revision(writer.as_str(), CompareOp::Equal, 0),
        ])
        .and_then([TxnOp::delete(key.as_str(), None)])
        .or_else([TxnOp::get(writer.as_str(), None)]);
    match txn::run(etcd, guarded, "volume rm").await? {
        Ok(_) => Ok(()),
        Err(Some(kv)) => Err(Error::VolumeInUse {
            pool: pool.to_string(),
            name: name.to_string(),
            holder: holder_address::<WriterRecord>(&writer, &kv, |w| w.address),
        }),
        Err(None) => Err(Error::Changed {
            key,
            operation: "volume rm",
        }),
    }
}
