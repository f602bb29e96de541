//! The one writer of a volume, and its epoch.
//!
//! The writer (the volume's NBD server) creates `volume-writer/<id>` under
//! its own lease with `create_revision == 0`: while it holds the key, a
//! second writer is refused and told who holds it. The key's creation
//! revision is the volume's **epoch**: etcd's revisions only grow, so every
//! new writer's epoch is higher than every earlier one's, and the chunk
//! servers, which keep the highest epoch seen per volume, refuse the
//! messages of an older writer (`EPOCH_TOO_OLD`, docs/cluster.md,
//! "Fencing"). The lease alone does not exclude an old writer that is
//! paused past its expiry; the epoch does.

use crate::error::{Error, Result};
use crate::keys::{
    decode, encode, EpochsSeen, Key, ServerId, ServerInfo, WriterRecord, FEATURE_EPOCH_WATCH,
};
use crate::lease::{Fence, Lease};
use crate::server::holder_address;
use crate::session::Etcd;
use crate::txn;
use crate::volume::get_volume;
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};
use std::time::Duration;

/// A held writer key.
#[derive(Debug)]
pub struct Writer {
    volume_id: u64,
    epoch: u64,
    lease: Lease,
    taken_from: Option<TakenFrom>,
}

/// The writer whose key a take-over deleted ([`acquire_writer`] with
/// `take_over`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TakenFrom {
    /// Its address, as its record gave it.
    pub holder: String,
    /// Its epoch, which every chunk server refuses once the new writer's
    /// higher one reached it.
    pub epoch: u64,
}

/// Takes the writer key of volume `pool/name` for the writer at `address`.
///
/// A key held by another writer refuses the volume (`WriterHeld`) until
/// that writer's lease expires, unless `take_over`: then the key is
/// deleted as it was read (a transaction comparing its `mod_revision`)
/// and created again under this writer's lease, so the new epoch is higher
/// than the old writer's. That is safe because the epoch, not the lease,
/// fences: the old writer, dead or alive, is refused by every chunk server
/// the new epoch reaches (the new writer pushes it to every server before
/// it serves). It is how a cluster's orchestrator moves a volume off a
/// host it has given up on without waiting out the lease (Ceph's lock
/// break, Curve's epoch push).
pub async fn acquire_writer(
    etcd: &Etcd,
    pool: &str,
    name: &str,
    address: &str,
    ttl: Duration,
    take_over: bool,
) -> Result<Writer> {
    let volume = get_volume(etcd, pool, name).await?;
    let volume_id = volume.record.id;
    let lease = Lease::grant(etcd, ttl).await?;
    let key = etcd.keys().volume_writer(volume_id);
    let record = WriterRecord {
        address: address.to_string(),
    };
    let mut taken_from = None;
    // A take-over deletes the key it read, then creates it: a third
    // writer between the two sends it round again, a few times at most.
    for _ in 0..TAKE_OVER_TRIES {
        let txn = Txn::new()
            .when([
                Compare::create_revision(key.as_str(), CompareOp::Equal, 0),
                // The volume read above is still the same volume (not
                // removed, nor removed and created again under the same
                // name).
                Compare::create_revision(
                    etcd.keys().volume(pool, name),
                    CompareOp::Equal,
                    volume.create_revision,
                ),
            ])
            .and_then([TxnOp::put(
                key.as_str(),
                encode(&record),
                Some(PutOptions::new().with_lease(lease.id())),
            )])
            .or_else([TxnOp::get(key.as_str(), None)]);
        let found = match txn::run(etcd, txn, "writer acquire").await {
            // The transaction's revision is the one that created the key.
            Ok(Ok(revision)) => {
                return Ok(Writer {
                    volume_id,
                    epoch: revision as u64,
                    lease,
                    taken_from,
                })
            }
            Ok(Err(found)) => found,
            Err(e) => {
                let _ = lease.revoke().await;
                return Err(e);
            }
        };
        let Some(kv) = found else {
            let _ = lease.revoke().await;
            return Err(Error::Changed {
                key: etcd.keys().volume(pool, name),
                operation: "writer acquire",
            });
        };
        let holder = holder_address::<WriterRecord>(&key, &kv, |w| w.address);
        let epoch = kv.create_revision() as u64;
        if !take_over {
            let _ = lease.revoke().await;
            return Err(Error::WriterHeld {
                volume_id,
                holder,
                epoch,
                key,
            });
        }
        let delete = Txn::new()
            .when([Compare::mod_revision(
                key.as_str(),
                CompareOp::Equal,
                kv.mod_revision(),
            )])
            .and_then([TxnOp::delete(key.as_str(), None)]);
        if let Err(e) = txn::run(etcd, delete, "writer take-over").await {
            let _ = lease.revoke().await;
            return Err(e);
        }
        taken_from = Some(TakenFrom { holder, epoch });
    }
    let _ = lease.revoke().await;
    Err(Error::Changed {
        key,
        operation: "writer take-over",
    })
}

/// How many times a take-over deletes a key another writer created again.
const TAKE_OVER_TRIES: usize = 3;

impl Writer {
    pub fn volume_id(&self) -> u64 {
        self.volume_id
    }

    /// The volume's epoch under this writer: every data message carries it.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The writer a take-over displaced, if it did.
    pub fn taken_from(&self) -> Option<&TakenFrom> {
        self.taken_from.as_ref()
    }

    /// Fires when the writer must stop serving the volume.
    pub fn fence(&self) -> Fence {
        self.lease.fence()
    }

    /// Gives the volume up: revokes the lease, deleting the key at once.
    pub async fn release(self) -> Result<()> {
        self.lease.revoke().await
    }
}

/// The writer holding volume `volume_id` now, with its epoch.
pub async fn current_writer(etcd: &Etcd, volume_id: u64) -> Result<Option<(u64, WriterRecord)>> {
    let key = etcd.keys().volume_writer(volume_id);
    txn::get_one(etcd, &key, "writer get")
        .await?
        .map(|kv| Ok((kv.create_revision() as u64, decode(&key, kv.value())?)))
        .transpose()
}

/// Every volume's writer epoch now: (volume id, epoch) for each writer key
/// that exists, and the revision of the read (a watch of the writer keys
/// goes on from that revision plus one).
pub async fn writer_epochs(etcd: &Etcd) -> Result<(i64, Vec<(u64, u64)>)> {
    let prefix = etcd.keys().volume_writers();
    let answer = etcd
        .client()
        .get(prefix, Some(GetOptions::new().with_prefix()))
        .await
        .map_err(Error::etcd("writer epochs"))?;
    let revision = answer.header().map(|h| h.revision()).unwrap_or(0);
    let epochs = answer
        .kvs()
        .iter()
        .filter_map(|kv| {
            writer_epoch(
                etcd,
                &String::from_utf8_lossy(kv.key()),
                kv.create_revision(),
            )
        })
        .collect();
    Ok((revision, epochs))
}

/// (volume id, epoch) of writer key `key` created at `create_revision`;
/// `None` for a key outside the writer keys.
pub fn writer_epoch(etcd: &Etcd, key: &str, create_revision: i64) -> Option<(u64, u64)> {
    match etcd.keys().parse(key)? {
        Key::VolumeWriter(volume_id) if create_revision > 0 => {
            Some((volume_id, create_revision as u64))
        }
        _ => None,
    }
}

/// Where a server stands with a new writer's epoch
/// ([`await_epoch_stored`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EpochStand {
    /// Its `server/<id>/epochs` says the epoch is stored there.
    Stored,
    /// It is not registered: its lease ended (it fenced itself before
    /// that), or it never came up; once back, it reads every writer key
    /// before it serves.
    Gone,
    /// Registered by a build that does not follow the writer keys
    /// (`FEATURE_EPOCH_WATCH` absent): nothing to wait for; it refuses the
    /// old writer once the new writer's first request reaches it.
    Unconfirmable,
}

/// How often [`await_epoch_stored`] looks again.
const EPOCH_POLL: Duration = Duration::from_millis(100);

/// The longest lease TTL [`await_epoch_stored`] waits out (an hour).
const LEASE_TTL_WAITED_MAX_S: i64 = 3600;

/// How long [`await_epoch_stored`] waits at least for the registration
/// of a server under a lease of `ttl` to go: a dead server's lease ends
/// within its TTL of its last renewal (before the wait began), plus
/// etcd's granularity in expiring it: half the TTL more, at least 1 s.
fn lease_wait(ttl: Duration) -> Duration {
    ttl + (ttl / 2).max(Duration::from_secs(1))
}

/// Waits until epoch `epoch` of volume `volume_id` is stored on each
/// server of `ids` or the server is gone ([`EpochStand`]), looking every
/// 100 ms for up to `within`, or longer where a pending server's lease
/// has a longer TTL (a server killed just before is gone within its TTL;
/// one alive and following etcd says so at once); then fails with
/// `EpochUnconfirmed`, naming the servers still registered without it.
/// An etcd request that fails is tried again at the next look, and named
/// in that error if the wait runs out.
pub async fn await_epoch_stored(
    etcd: &Etcd,
    volume_id: u64,
    ids: &[ServerId],
    epoch: u64,
    within: Duration,
) -> Result<Vec<(ServerId, EpochStand)>> {
    let start = tokio::time::Instant::now();
    let mut deadline = start + within;
    let mut done = Vec::new();
    let mut pending: Vec<ServerId> = ids.to_vec();
    let mut last_error = None;
    loop {
        let mut still = Vec::new();
        for &id in &pending {
            match epoch_stand(etcd, id, epoch).await {
                Ok(Ok(stand)) => done.push((id, stand)),
                Ok(Err(lease)) => {
                    match etcd.client().lease_time_to_live(lease, None).await {
                        Ok(ttl) => {
                            let ttl = ttl.granted_ttl().clamp(0, LEASE_TTL_WAITED_MAX_S) as u64;
                            deadline = deadline.max(start + lease_wait(Duration::from_secs(ttl)));
                        }
                        Err(e) => last_error = Some(format!("lease time to live: {e}")),
                    }
                    still.push(id);
                }
                Err(e) => {
                    last_error = Some(e.to_string());
                    still.push(id);
                }
            }
        }
        pending = still;
        if pending.is_empty() {
            done.sort_by_key(|(id, _)| *id);
            return Ok(done);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::EpochUnconfirmed {
                volume_id,
                epoch,
                servers: pending
                    .iter()
                    .map(|id| id.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                waited_ms: start.elapsed().as_millis() as u64,
                last_error: last_error.unwrap_or_else(|| "none".into()),
            });
        }
        tokio::time::sleep(EPOCH_POLL).await;
    }
}

/// Where server `id` stands with `epoch` now, or the lease of its
/// registration while it has not stored it.
async fn epoch_stand(
    etcd: &Etcd,
    id: ServerId,
    epoch: u64,
) -> Result<std::result::Result<EpochStand, i64>> {
    let answer = etcd
        .client()
        .get(
            etcd.keys().server(id),
            Some(GetOptions::new().with_prefix()),
        )
        .await
        .map_err(Error::etcd("server epochs"))?;
    let (mut info, mut seen) = (None, None);
    for kv in answer.kvs() {
        let key = String::from_utf8_lossy(kv.key()).into_owned();
        match etcd.keys().parse(&key) {
            Some(Key::ServerState(_)) => {
                info = Some((decode::<ServerInfo>(&key, kv.value())?, kv.lease()))
            }
            Some(Key::ServerEpochs(_)) => seen = Some(decode::<EpochsSeen>(&key, kv.value())?),
            _ => {}
        }
    }
    Ok(match (info, seen) {
        (None, _) => Ok(EpochStand::Gone),
        (Some((info, _)), _) if !info.takes(FEATURE_EPOCH_WATCH) => Ok(EpochStand::Unconfirmable),
        (Some(_), Some(seen)) if seen.through >= epoch => Ok(EpochStand::Stored),
        (Some((_, lease)), _) => Err(lease),
    })
}
