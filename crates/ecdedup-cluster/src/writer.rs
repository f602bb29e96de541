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
use crate::keys::{decode, encode, WriterRecord};
use crate::lease::{Fence, Lease};
use crate::server::holder_address;
use crate::session::Etcd;
use crate::txn;
use crate::volume::get_volume;
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
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
