//! The coordinator: the one process that re-places the PGs of a chunk
//! server that is *out* (docs/cluster.md, "Down and out").
//!
//! Every chunk server is a candidate (`chunkd` drives a [`Coordinator`]
//! with [`Coordinator::tick`]); the one that creates the `coordinator` key
//! (`create_revision == 0`, under its registration lease) is elected, and
//! the key's creation revision is its **term**. Every placement write it
//! makes is one transaction that compares the key's creation revision with
//! its term (and the PG key's `mod_revision` with the one it read), so a
//! coordinator whose lease expired, or that was replaced meanwhile, moves
//! nothing: two coordinators never both move data. A coordinator that
//! loses its term goes back to campaigning.
//!
//! A server named by a PG but not registered (its lease gone) is *down*;
//! once the elected coordinator has seen it down for `out_after` it is
//! *out*: for each PG holding it the coordinator picks a replacement
//! ([`crate::placement::replace_shards`]) and writes, in one transaction,
//! the PG's new server list with its epoch bumped and the PG's rebuild
//! record (which shard, from which server to which, at which epoch). The
//! volumes' writers rebuild the shard on the new server
//! (`ecdedup-client`) and report their progress beside it; once every
//! volume of the pool has finished, the coordinator drops the move from
//! the record. A new coordinator counts each server's absence from its own
//! first look (it never outs a server sooner than `out_after` after the
//! server went down).

use crate::error::{Error, Result};
use crate::keys::{
    decode, encode, CoordinatorRecord, Key, PgRecord, RebuildProgress, RebuildRecord, ServerId,
    ShardMove,
};
use crate::placement::{replace_shards, Candidate};
use crate::session::Etcd;
use crate::txn;
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// A server absent this long is out, by default (Ceph's
/// `mon_osd_down_out_interval`, Vitastor's `osd_out_time`).
pub const OUT_AFTER_DEFAULT: Duration = Duration::from_secs(600);

#[derive(Clone, Debug)]
pub struct CoordinatorConfig {
    /// The candidate's own server id and address (in the `coordinator` key).
    pub server: ServerId,
    pub address: String,
    /// The lease the `coordinator` key is created under (the server's
    /// registration lease: a server that is gone is no coordinator).
    pub lease_id: i64,
    pub out_after: Duration,
}

/// What a tick did, for the caller's log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CoordinatorEvent {
    Elected {
        term: i64,
    },
    TermLost {
        term: i64,
    },
    Down {
        server: ServerId,
    },
    Out {
        server: ServerId,
    },
    Replaced {
        pool: String,
        pg: u32,
        moved: ShardMove,
    },
    /// No live server on a new failure domain: the PG stays degraded.
    Unplaceable {
        pool: String,
        pg: u32,
        shard: u32,
        from: ServerId,
    },
    /// Every volume of the pool has rebuilt the shard: its move is dropped.
    Rebuilt {
        pool: String,
        pg: u32,
        shard: u32,
    },
}

/// When each down server was first seen down (pure: the caller's clock).
#[derive(Clone, Debug, Default)]
pub struct OutClock {
    down_since_ms: BTreeMap<ServerId, u64>,
}

impl OutClock {
    /// Notes the servers `placed` in some PG that are not `live`, and
    /// returns (newly down, out): those down for `out_after_ms` or more.
    pub fn observe(
        &mut self,
        now_ms: u64,
        live: &BTreeSet<ServerId>,
        placed: &BTreeSet<ServerId>,
        out_after_ms: u64,
    ) -> (Vec<ServerId>, BTreeSet<ServerId>) {
        self.down_since_ms
            .retain(|id, _| placed.contains(id) && !live.contains(id));
        let mut fresh = Vec::new();
        for &id in placed.difference(live) {
            self.down_since_ms.entry(id).or_insert_with(|| {
                fresh.push(id);
                now_ms
            });
        }
        let out = self
            .down_since_ms
            .iter()
            .filter(|(_, &since)| now_ms.saturating_sub(since) >= out_after_ms)
            .map(|(&id, _)| id)
            .collect();
        (fresh, out)
    }
}

/// One candidate's coordinator: campaigns, and once elected re-places the
/// PGs of servers that are out.
pub struct Coordinator {
    etcd: Etcd,
    config: CoordinatorConfig,
    term: Option<i64>,
    clock: OutClock,
    started: Instant,
    /// Server hosts seen (a down server's host is known only from before).
    hosts: BTreeMap<ServerId, String>,
    /// (pool, pg, shard) reported unplaceable, so the log says it once.
    unplaceable: BTreeSet<(String, u32, u32)>,
}

impl Coordinator {
    pub fn new(etcd: Etcd, config: CoordinatorConfig) -> Coordinator {
        Coordinator {
            etcd,
            config,
            term: None,
            clock: OutClock::default(),
            started: Instant::now(),
            hosts: BTreeMap::new(),
            unplaceable: BTreeSet::new(),
        }
    }

    /// The term held, if elected.
    pub fn term(&self) -> Option<i64> {
        self.term
    }

    /// One round: campaign if not elected, else look at the servers and
    /// re-place what is out.
    pub async fn tick(&mut self) -> Result<Vec<CoordinatorEvent>> {
        let Some(term) = self.term else {
            return Ok(match self.campaign().await? {
                Some(term) => {
                    self.term = Some(term);
                    // A new term counts absences from its own first look.
                    self.clock = OutClock::default();
                    self.started = Instant::now();
                    vec![CoordinatorEvent::Elected { term }]
                }
                None => Vec::new(),
            });
        };
        match self.step(term).await {
            Err(Error::Fenced(_)) => {
                self.term = None;
                Ok(vec![CoordinatorEvent::TermLost { term }])
            }
            r => r,
        }
    }

    /// Creates the `coordinator` key under our lease, if absent: our term.
    async fn campaign(&self) -> Result<Option<i64>> {
        let key = self.etcd.keys().coordinator();
        let record = CoordinatorRecord {
            server: self.config.server,
            address: self.config.address.clone(),
        };
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.as_str(),
                encode(&record),
                Some(PutOptions::new().with_lease(self.config.lease_id)),
            )])
            .or_else([TxnOp::get(key.as_str(), None)]);
        Ok(
            match txn::run(&self.etcd, txn, "coordinator campaign").await? {
                Ok(revision) => Some(revision),
                // Our own key (from a term this process dropped): still ours.
                Err(Some(kv)) if kv.lease() == self.config.lease_id => Some(kv.create_revision()),
                Err(_) => None,
            },
        )
    }

    /// The guard of every write of term `term`.
    fn holds_term(&self, term: i64) -> Compare {
        Compare::create_revision(self.etcd.keys().coordinator(), CompareOp::Equal, term)
    }

    async fn check_term(&self, term: i64) -> Result<()> {
        let key = self.etcd.keys().coordinator();
        match txn::get_one(&self.etcd, &key, "coordinator get").await? {
            Some(kv) if kv.create_revision() == term => Ok(()),
            _ => Err(Error::Fenced(format!("coordinator term {term} is over"))),
        }
    }

    async fn step(&mut self, term: i64) -> Result<Vec<CoordinatorEvent>> {
        self.check_term(term).await?;
        let mut events = Vec::new();
        let servers = crate::server::list_servers(&self.etcd).await?;
        for (id, entry) in &servers {
            self.hosts.insert(*id, entry.info.host.clone());
        }
        let live: BTreeSet<ServerId> = servers.keys().copied().collect();
        let candidates: Vec<Candidate> = servers
            .iter()
            .map(|(&id, e)| Candidate {
                id,
                host: e.info.host.clone(),
            })
            .collect();
        let mut pools = Vec::new();
        for (name, record) in crate::pool::list_pools(&self.etcd).await? {
            if record.ready {
                let (_, pgs) = crate::pool::pool_pgs_at(&self.etcd, &name).await?;
                pools.push((name, record.spec, pgs));
            }
        }
        let placed: BTreeSet<ServerId> = pools
            .iter()
            .flat_map(|(_, _, pgs)| pgs.iter().flat_map(|(r, _)| r.servers.iter().copied()))
            .collect();
        let now_ms = self.started.elapsed().as_millis() as u64;
        let out_after_ms = self.config.out_after.as_millis() as u64;
        let (down, out) = self.clock.observe(now_ms, &live, &placed, out_after_ms);
        events.extend(
            down.into_iter()
                .map(|server| CoordinatorEvent::Down { server }),
        );
        let rebuilds = self.rebuild_records().await?;
        for (pool, spec, pgs) in &pools {
            for (pg, (record, revision)) in pgs.iter().enumerate() {
                let pg = pg as u32;
                let existing = rebuilds.get(&(pool.clone(), pg));
                if record.servers.iter().any(|id| out.contains(id)) {
                    let moves = replace_shards(
                        pool,
                        spec,
                        pg,
                        &record.servers,
                        &out,
                        &self.hosts,
                        &candidates,
                    );
                    for (shard, &from) in record.servers.iter().enumerate() {
                        let shard = shard as u32;
                        if out.contains(&from)
                            && !moves.iter().any(|m| m.0 == shard)
                            && self.unplaceable.insert((pool.clone(), pg, shard))
                        {
                            events.push(CoordinatorEvent::Unplaceable {
                                pool: pool.clone(),
                                pg,
                                shard,
                                from,
                            });
                        }
                    }
                    if !moves.is_empty() {
                        for &id in moves.iter().map(|(_, from, _)| from) {
                            if !events.contains(&CoordinatorEvent::Out { server: id }) {
                                events.push(CoordinatorEvent::Out { server: id });
                            }
                        }
                        let moved = self
                            .replace(term, pool, pg, record, *revision, existing, &moves)
                            .await?;
                        events.extend(moved.into_iter().map(|moved| CoordinatorEvent::Replaced {
                            pool: pool.clone(),
                            pg,
                            moved,
                        }));
                    }
                } else if let Some((rebuild, rebuild_revision)) = existing {
                    let done = self.finished_moves(pool, pg, rebuild).await?;
                    if !done.is_empty() {
                        self.drop_moves(term, pool, pg, rebuild, *rebuild_revision, &done)
                            .await?;
                        events.extend(done.into_iter().map(|shard| CoordinatorEvent::Rebuilt {
                            pool: pool.clone(),
                            pg,
                            shard,
                        }));
                    }
                }
            }
        }
        Ok(events)
    }

    /// Every rebuild record, by (pool, PG), with its `mod_revision`.
    async fn rebuild_records(&self) -> Result<BTreeMap<(String, u32), (RebuildRecord, i64)>> {
        let answer = self
            .etcd
            .client()
            .get(
                self.etcd.keys().rebuilds(),
                Some(GetOptions::new().with_prefix()),
            )
            .await
            .map_err(Error::etcd("rebuild records"))?;
        let mut out = BTreeMap::new();
        for kv in answer.kvs() {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            if let Some(Key::Rebuild { pool, pg }) = self.etcd.keys().parse(&key) {
                out.insert((pool, pg), (decode(&key, kv.value())?, kv.mod_revision()));
            }
        }
        Ok(out)
    }

    /// Writes PG `pg`'s new servers (epoch + 1) and its rebuild record in
    /// one transaction of term `term`; returns the moves written.
    #[allow(clippy::too_many_arguments)]
    async fn replace(
        &self,
        term: i64,
        pool: &str,
        pg: u32,
        record: &PgRecord,
        revision: i64,
        existing: Option<&(RebuildRecord, i64)>,
        moves: &[(u32, ServerId, ServerId)],
    ) -> Result<Vec<ShardMove>> {
        let keys = self.etcd.keys();
        let epoch = record.epoch + 1;
        let mut next = record.clone();
        next.epoch = epoch;
        let mut rebuild = existing.map(|(r, _)| r.clone()).unwrap_or_default();
        let mut moved = Vec::new();
        for &(shard, from, to) in moves {
            next.servers[shard as usize] = to;
            // A shard moved again (its replacement went out too) keeps
            // one entry: the newest.
            rebuild.moves.retain(|m| m.shard != shard);
            let m = ShardMove {
                shard,
                from,
                to,
                epoch,
            };
            rebuild.moves.push(m);
            moved.push(m);
        }
        let pg_key = keys.pg(pool, pg);
        let rebuild_key = keys.rebuild(pool, pg);
        let rebuild_unchanged = match existing {
            Some((_, rev)) => Compare::mod_revision(rebuild_key.as_str(), CompareOp::Equal, *rev),
            None => Compare::version(rebuild_key.as_str(), CompareOp::Equal, 0),
        };
        let txn = Txn::new()
            .when([
                self.holds_term(term),
                Compare::mod_revision(pg_key.as_str(), CompareOp::Equal, revision),
                rebuild_unchanged,
            ])
            .and_then([
                TxnOp::put(pg_key.as_str(), encode(&next), None),
                TxnOp::put(rebuild_key.as_str(), encode(&rebuild), None),
            ]);
        if txn::run(&self.etcd, txn, "re-place PG").await?.is_err() {
            // Our term is over, or the PG changed: looked at again next tick.
            self.check_term(term).await?;
            return Ok(Vec::new());
        }
        Ok(moved)
    }

    /// The shards of `rebuild` that every volume of `pool` has rebuilt.
    async fn finished_moves(
        &self,
        pool: &str,
        pg: u32,
        rebuild: &RebuildRecord,
    ) -> Result<Vec<u32>> {
        let volumes = crate::volume::list_volumes(&self.etcd, pool).await?;
        let mut done = Vec::new();
        for m in &rebuild.moves {
            let mut all = true;
            for v in volumes.values() {
                let key = self.etcd.keys().rebuild_progress(pool, pg, v.record.id);
                let finished = match txn::get_one(&self.etcd, &key, "rebuild progress").await? {
                    Some(kv) => {
                        let p: RebuildProgress = decode(&key, kv.value())?;
                        p.finished && p.epoch >= m.epoch
                    }
                    None => false,
                };
                all &= finished;
            }
            if all {
                done.push(m.shard);
            }
        }
        Ok(done)
    }

    async fn drop_moves(
        &self,
        term: i64,
        pool: &str,
        pg: u32,
        rebuild: &RebuildRecord,
        revision: i64,
        shards: &[u32],
    ) -> Result<()> {
        let key = self.etcd.keys().rebuild(pool, pg);
        let mut left = rebuild.clone();
        left.moves.retain(|m| !shards.contains(&m.shard));
        let write = if left.moves.is_empty() {
            TxnOp::delete(key.as_str(), None)
        } else {
            TxnOp::put(key.as_str(), encode(&left), None)
        };
        let txn = Txn::new()
            .when([
                self.holds_term(term),
                Compare::mod_revision(key.as_str(), CompareOp::Equal, revision),
            ])
            .and_then([write]);
        if txn::run(&self.etcd, txn, "rebuild done").await?.is_err() {
            self.check_term(term).await?;
        }
        Ok(())
    }
}

/// Per (pool, PG): its rebuild record, if any, and each volume's progress
/// report (volume id, progress).
pub type RebuildStatus =
    BTreeMap<(String, u32), (Option<RebuildRecord>, Vec<(u64, RebuildProgress)>)>;

/// The rebuild records and progress reports of the cluster (for `cluster
/// status`).
pub async fn rebuild_status(etcd: &Etcd) -> Result<RebuildStatus> {
    let mut out = RebuildStatus::new();
    for prefix in [etcd.keys().rebuilds(), etcd.keys().rebuild_progresses()] {
        let answer = etcd
            .client()
            .get(prefix, Some(GetOptions::new().with_prefix()))
            .await
            .map_err(Error::etcd("rebuild status"))?;
        for kv in answer.kvs() {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            match etcd.keys().parse(&key) {
                Some(Key::Rebuild { pool, pg }) => {
                    out.entry((pool, pg)).or_default().0 = Some(decode(&key, kv.value())?);
                }
                Some(Key::RebuildProgress {
                    pool,
                    pg,
                    volume_id,
                }) => {
                    out.entry((pool, pg))
                        .or_default()
                        .1
                        .push((volume_id, decode(&key, kv.value())?));
                }
                _ => {}
            }
        }
    }
    Ok(out)
}

/// Writes volume `volume_id`'s rebuild progress of PG `pg`, guarded by
/// the writer's epoch (the creation revision of its writer key).
pub async fn report_rebuild_progress(
    etcd: &Etcd,
    pool: &str,
    pg: u32,
    volume_id: u64,
    writer_epoch: u64,
    progress: &RebuildProgress,
) -> Result<()> {
    let keys = etcd.keys();
    let txn = Txn::new()
        .when([Compare::create_revision(
            keys.volume_writer(volume_id),
            CompareOp::Equal,
            writer_epoch as i64,
        )])
        .and_then([TxnOp::put(
            keys.rebuild_progress(pool, pg, volume_id),
            encode(progress),
            None,
        )]);
    match txn::run(etcd, txn, "rebuild progress").await? {
        Ok(_) => Ok(()),
        Err(_) => Err(Error::Fenced(format!(
            "volume {volume_id}'s writer key is no longer epoch {writer_epoch}"
        ))),
    }
}

/// The `coordinator` key: who holds it, and its term.
pub async fn current_coordinator(etcd: &Etcd) -> Result<Option<(i64, CoordinatorRecord)>> {
    let key = etcd.keys().coordinator();
    txn::get_one(etcd, &key, "coordinator get")
        .await?
        .map(|kv| Ok((kv.create_revision(), decode(&key, kv.value())?)))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_is_out_only_after_out_after_of_continuous_absence() {
        let mut clock = OutClock::default();
        let placed: BTreeSet<ServerId> = (1..=4).map(ServerId).collect();
        let all = placed.clone();
        let without2: BTreeSet<ServerId> = [1, 3, 4].map(ServerId).into();
        assert_eq!(
            clock.observe(0, &all, &placed, 1000),
            (vec![], BTreeSet::new())
        );
        // Down at 100: not out at 1099, out at 1100.
        let (down, out) = clock.observe(100, &without2, &placed, 1000);
        assert_eq!((down, out), (vec![ServerId(2)], BTreeSet::new()));
        assert!(clock.observe(1099, &without2, &placed, 1000).1.is_empty());
        // Back before the delay: its clock starts again from the next loss.
        assert!(clock.observe(1050, &all, &placed, 1000).1.is_empty());
        assert_eq!(
            clock.observe(1500, &without2, &placed, 1000).0,
            vec![ServerId(2)]
        );
        assert!(clock.observe(2400, &without2, &placed, 1000).1.is_empty());
        assert_eq!(
            clock.observe(2500, &without2, &placed, 1000).1,
            BTreeSet::from([ServerId(2)])
        );
        // A server no PG names any more (re-placed) is forgotten.
        let placed_now: BTreeSet<ServerId> = [1, 3, 4, 5].map(ServerId).into();
        let live: BTreeSet<ServerId> = [1, 3, 4, 5].map(ServerId).into();
        assert!(clock.observe(9000, &live, &placed_now, 1000).1.is_empty());
    }
}
