//! Pools and their placement groups.
//!
//! `create_pool` writes `pool/<name>` first, created with `version == 0`
//! and `ready: false`; then the PG records, at most
//! [`PG_WRITES_PER_TXN`] per transaction (etcd refuses a transaction of
//! more than 128 operations by default), each comparing the pool key's
//! `mod_revision` with the one the creator wrote, so no other process can
//! have replaced the pool in between; and last `ready: true` under the
//! same compare. A pool that is not ready (its creator died half-way) takes
//! no volumes. The PGs are placed from the servers registered at that
//! moment (`placement::place_pgs`).

use crate::error::{Error, Result};
use crate::keys::{check_name, decode, encode, Key, PgRecord, PoolRecord, PoolSpec};
use crate::placement::{place_pgs, Candidate};
use crate::server::list_servers;
use crate::session::Etcd;
use crate::txn;
use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp};
use std::collections::BTreeMap;

/// PG records written per transaction (below etcd's default
/// `--max-txn-ops` of 128, with room for the compare).
pub const PG_WRITES_PER_TXN: usize = 100;

/// Creates pool `name`, places its PGs on the registered servers, and
/// returns them (index = PG number).
pub async fn create_pool(etcd: &Etcd, name: &str, spec: &PoolSpec) -> Result<Vec<PgRecord>> {
    check_name("pool name", name)?;
    spec.check_new()?;
    let candidates: Vec<Candidate> = list_servers(etcd)
        .await?
        .into_iter()
        .map(|(id, entry)| Candidate {
            id,
            host: entry.info.host,
        })
        .collect();
    let pgs = place_pgs(name, spec, &candidates)?;
    let keys = etcd.keys();
    let key = keys.pool(name);
    let mut record = PoolRecord {
        spec: spec.clone(),
        ready: false,
    };
    let create = Txn::new()
        .when([Compare::version(key.as_str(), CompareOp::Equal, 0)])
        .and_then([TxnOp::put(key.as_str(), encode(&record), None)]);
    let Ok(revision) = txn::run(etcd, create, "pool create").await? else {
        return Err(Error::PoolExists(name.to_string()));
    };
    let ours = || Compare::mod_revision(key.as_str(), CompareOp::Equal, revision);
    let guarded = |ops: Vec<TxnOp>| Txn::new().when([ours()]).and_then(ops);
    for (batch_index, batch) in pgs.chunks(PG_WRITES_PER_TXN).enumerate() {
        let ops = batch
            .iter()
            .enumerate()
            .map(|(i, pg)| {
                let number = (batch_index * PG_WRITES_PER_TXN + i) as u32;
                TxnOp::put(keys.pg(name, number), encode(pg), None)
            })
            .collect();
        txn::run_or_changed(etcd, guarded(ops), &key, "pool create: PGs").await?;
    }
    record.ready = true;
    let ready = vec![TxnOp::put(key.as_str(), encode(&record), None)];
    txn::run_or_changed(etcd, guarded(ready), &key, "pool create: ready").await?;
    Ok(pgs)
}

/// Removes pool `name`, which holds no volume: its record, its PG records
/// and its rebuild records, in one transaction that compares the pool
/// key's and the volume id counter's `mod_revision` as read with the
/// volumes (every `volume create` moves the counter, so a volume created
/// in between fails it: `Changed`). A pool that is not ready (its
/// creation stopped half-way) is removed the same way.
pub async fn remove_pool(etcd: &Etcd, name: &str) -> Result<()> {
    check_name("pool name", name)?;
    let keys = etcd.keys();
    let key = keys.pool(name);
    let counter = keys.volume_id_next();
    let read = Txn::new().and_then([
        TxnOp::get(key.as_str(), None),
        TxnOp::get(keys.volumes(name), Some(GetOptions::new().with_prefix())),
        TxnOp::get(counter.as_str(), None),
    ]);
    let answer = etcd
        .client()
        .txn(read)
        .await
        .map_err(Error::etcd("pool rm"))?;
    let mut gets = answer.op_responses().into_iter().filter_map(|op| match op {
        etcd_client::TxnOpResponse::Get(get) => Some(get),
        _ => None,
    });
    let (Some(pool), Some(volumes), Some(next)) = (gets.next(), gets.next(), gets.next()) else {
        return Err(Error::invalid(
            "pool rm",
            "etcd answered a read of three keys with fewer",
        ));
    };
    let Some(pool) = pool.kvs().first() else {
        return Err(Error::PoolNotFound(name.to_string()));
    };
    if !volumes.kvs().is_empty() {
        let names: Vec<String> = volumes
            .kvs()
            .iter()
            .filter_map(|kv| match keys.parse(&String::from_utf8_lossy(kv.key())) {
                Some(Key::Volume { name, .. }) => Some(name),
                _ => None,
            })
            .collect();
        return Err(Error::PoolInUse {
            name: name.to_string(),
            volumes: names.join(", "),
        });
    }
    let counter_as_read = match next.kvs().first() {
        Some(kv) => Compare::mod_revision(counter.as_str(), CompareOp::Equal, kv.mod_revision()),
        None => Compare::version(counter.as_str(), CompareOp::Equal, 0),
    };
    let prefix = || Some(etcd_client::DeleteOptions::new().with_prefix());
    let remove = Txn::new()
        .when([
            Compare::mod_revision(key.as_str(), CompareOp::Equal, pool.mod_revision()),
            counter_as_read,
        ])
        .and_then([
            TxnOp::delete(key.as_str(), None),
            TxnOp::delete(keys.pgs(name), prefix()),
            TxnOp::delete(keys.pool_rebuilds(name), prefix()),
            TxnOp::delete(keys.pool_rebuild_progresses(name), prefix()),
        ]);
    txn::run_or_changed(etcd, remove, &key, "pool rm").await?;
    Ok(())
}

/// Decodes a pool record and checks its settings: a record that another
/// writer left with bad settings (a PG count of 0, ...) is refused here,
/// once, so that no caller divides by it.
fn decode_pool(key: &str, value: &[u8]) -> Result<PoolRecord> {
    let record: PoolRecord = decode(key, value)?;
    record.spec.check().map_err(|e| Error::Corrupt {
        key: key.to_string(),
        reason: e.to_string(),
    })?;
    Ok(record)
}

/// A pool as stored, with the revision its guards compare.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolEntry {
    pub record: PoolRecord,
    pub mod_revision: i64,
}

/// Pool `name`.
pub async fn get_pool(etcd: &Etcd, name: &str) -> Result<PoolEntry> {
    check_name("pool name", name)?;
    let key = etcd.keys().pool(name);
    let kv = txn::get_one(etcd, &key, "pool get")
        .await?
        .ok_or_else(|| Error::PoolNotFound(name.to_string()))?;
    Ok(PoolEntry {
        record: decode_pool(&key, kv.value())?,
        mod_revision: kv.mod_revision(),
    })
}

/// Every pool, by name.
pub async fn list_pools(etcd: &Etcd) -> Result<BTreeMap<String, PoolRecord>> {
    let answer = etcd
        .client()
        .get(etcd.keys().pools(), Some(GetOptions::new().with_prefix()))
        .await
        .map_err(Error::etcd("pool list"))?;
    let mut pools = BTreeMap::new();
    for kv in answer.kvs() {
        let key = String::from_utf8_lossy(kv.key()).into_owned();
        if let Some(Key::Pool(name)) = etcd.keys().parse(&key) {
            pools.insert(name, decode_pool(&key, kv.value())?);
        }
    }
    Ok(pools)
}

/// The PGs of a ready pool (index = PG number), every one present.
pub async fn pool_pgs(etcd: &Etcd, name: &str) -> Result<Vec<PgRecord>> {
    Ok(pool_pgs_at(etcd, name)
        .await?
        .1
        .into_iter()
        .map(|(record, _)| record)
        .collect())
}

/// The pool and its PGs (index = PG number), each with the
/// `mod_revision` of its key (what a guarded re-placement compares).
pub async fn pool_pgs_at(etcd: &Etcd, name: &str) -> Result<(PoolEntry, Vec<(PgRecord, i64)>)> {
    let pool = get_pool(etcd, name).await?;
    if !pool.record.ready {
        return Err(Error::PoolNotReady(name.to_string()));
    }
    let answer = etcd
        .client()
        .get(etcd.keys().pgs(name), Some(GetOptions::new().with_prefix()))
        .await
        .map_err(Error::etcd("pool PGs"))?;
    let count = pool.record.spec.pg_count as usize;
    let mut pgs: Vec<Option<(PgRecord, i64)>> = vec![None; count];
    for kv in answer.kvs() {
        let key = String::from_utf8_lossy(kv.key()).into_owned();
        if let Some(Key::Pg { pg, .. }) = etcd.keys().parse(&key) {
            let slot = pgs.get_mut(pg as usize).ok_or_else(|| Error::Corrupt {
                key: key.clone(),
                reason: format!("pool {name} has {count} PGs"),
            })?;
            let record: PgRecord = decode(&key, kv.value())?;
            let width = pool.record.spec.width() as usize;
            if record.servers.len() != width {
                return Err(Error::Corrupt {
                    key,
                    reason: format!("{} servers in a PG of width {width}", record.servers.len()),
                });
            }
            *slot = Some((record, kv.mod_revision()));
        }
    }
    let pgs = pgs
        .into_iter()
        .enumerate()
        .map(|(pg, record)| {
            record.ok_or_else(|| Error::Corrupt {
                key: etcd.keys().pg(name, pg as u32),
                reason: "missing from a ready pool".into(),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((pool, pgs))
}
