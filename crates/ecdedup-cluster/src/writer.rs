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
}

/// Takes the writer key of volume `pool/name` for the writer at `address`.
pub async fn acquire_writer(
    etcd: &Etcd,
    pool: &str,
    name: &str,
    address: &str,
    ttl: Duration,
) -> Result<Writer> {
    let volume = get_volume(etcd, pool, name).await?;
    let volume_id = volume.record.id;
    let lease = Lease::grant(etcd, ttl).await?;
    let key = etcd.keys().volume_writer(volume_id);
    let record = WriterRecord {
        address: address.to_string(),
    };
    let txn = Txn::new()
        .when([
            Compare::create_revision(key.as_str(), CompareOp::Equal, 0),
            // The volume read above is still the same volume (not removed,
            // nor removed and created again under the same name).
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
    let found = match txn::run(etcd, txn, "writer acquire").await? {
        // The transaction's revision is the one that created the key.
        Ok(revision) => {
            return Ok(Writer {
                volume_id,
                epoch: revision as u64,
                lease,
            })
        }
        Err(found) => found,
    };
    let _ = lease.revoke().await;
    if let Some(kv) = found {
        return Err(Error::WriterHeld {
            volume_id,
            holder: holder_address::<WriterRecord>(&key, &kv, |w| w.address),
            epoch: kv.create_revision() as u64,
            key,
        });
    }
    Err(Error::Changed {
        key: etcd.keys().volume(pool, name),
        operation: "writer acquire",
    })
}

impl Writer {
    pub fn volume_id(&self) -> u64 {
        self.volume_id
    }

    /// The volume's epoch under this writer: every data message carries it.
    pub fn epoch(&self) -> u64 {
        self.epoch
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
