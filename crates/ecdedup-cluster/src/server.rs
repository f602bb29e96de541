//! Chunk-server registration: `server/<id>/state` under the server's lease,
//! created only if absent, and the space reports beside it.
//!
//! The create-only transaction is what makes an id belong to one process:
//! it compares `create_revision == 0` (the key does not exist), so a
//! second server started with the same id is refused, and the refusal
//! names the address of the server that holds the id. The key goes with
//! the lease: when the holder stops renewing (crash, partition), etcd
//! deletes it and the id is free again, while the holder, fenced by its
//! own lease clock before that moment, has stopped acknowledging writes.

use crate::error::{Error, Result};
use crate::keys::{decode, encode, EpochsSeen, Key, ServerId, ServerInfo, ServerSpace};
use crate::lease::{Fence, Lease};
use crate::session::Etcd;
use crate::txn;
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};
use std::collections::BTreeMap;
use std::time::Duration;

/// A chunk server's registration, live while its lease is renewed.
#[derive(Debug)]
pub struct Registration {
    id: ServerId,
    lease: Lease,
    etcd: Etcd,
}

/// Registers chunk server `id` with `info` under a new lease of `ttl`.
pub async fn register_server(
    etcd: &Etcd,
    id: ServerId,
    info: &ServerInfo,
    ttl: Duration,
) -> Result<Registration> {
    let lease = Lease::grant(etcd, ttl).await?;
    let key = etcd.keys().server_state(id);
    let txn = Txn::new()
        .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
        .and_then([TxnOp::put(
            key.as_str(),
            encode(info),
            Some(PutOptions::new().with_lease(lease.id())),
        )])
        .or_else([TxnOp::get(key.as_str(), None)]);
    let Err(found) = txn::run(etcd, txn, "register server").await? else {
        return Ok(Registration {
            id,
            lease,
            etcd: etcd.clone(),
        });
    };
    // Refused: give the lease back at once, and say who holds the id.
    let _ = lease.revoke().await;
    let (holder, holder_lease) = match &found {
        Some(kv) => (
            holder_address::<ServerInfo>(&key, kv, |info| info.address),
            kv.lease(),
        ),
        None => ("(released meanwhile)".to_string(), 0),
    };
    Err(Error::ServerIdTaken {
        id: id.0,
        holder,
        key,
        lease: holder_lease,
    })
}

/// The address in a holder's value, or why it cannot be read (a refusal
/// still names the key and says the value is bad).
pub(crate) fn holder_address<T: for<'de> serde::Deserialize<'de>>(
    key: &str,
    kv: &etcd_client::KeyValue,
    address: impl FnOnce(T) -> String,
) -> String {
    decode::<T>(key, kv.value())
        .map(address)
        .unwrap_or_else(|e| format!("(unreadable: {e})"))
}

impl Registration {
    pub fn id(&self) -> ServerId {
        self.id
    }

    /// The lease the registration lives under.
    pub fn lease_id(&self) -> i64 {
        self.lease.id()
    }

    /// Fires when the server must stop acknowledging writes and exit.
    pub fn fence(&self) -> Fence {
        self.lease.fence()
    }

    /// Writes `server/<id>/space` under the registration's lease.
    pub async fn report_space(&self, space: &ServerSpace) -> Result<()> {
        if let Some(reason) = self.fence().reason() {
            return Err(Error::Fenced(reason));
        }
        self.etcd
            .client()
            .put(
                self.etcd.keys().server_space(self.id),
                encode(space),
                Some(PutOptions::new().with_lease(self.lease.id())),
            )
            .await
            .map_err(Error::etcd("report space"))?;
        Ok(())
    }

    /// Writes `server/<id>/epochs` under the registration's lease: every
    /// writer key created at or below revision `through` has its epoch
    /// stored on this server.
    pub async fn report_epochs(&self, through: u64) -> Result<()> {
        if let Some(reason) = self.fence().reason() {
            return Err(Error::Fenced(reason));
        }
        self.etcd
            .client()
            .put(
                self.etcd.keys().server_epochs(self.id),
                encode(&EpochsSeen { through }),
                Some(PutOptions::new().with_lease(self.lease.id())),
            )
            .await
            .map_err(Error::etcd("report epochs"))?;
        Ok(())
    }

    /// Deregisters: revokes the lease, so the id is free at once.
    pub async fn close(self) -> Result<()> {
        self.lease.revoke().await
    }
}

/// What etcd knows of one server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerEntry {
    pub info: ServerInfo,
    /// Its last space report, if any.
    pub space: Option<ServerSpace>,
}

/// Every registered (live) chunk server, by id.
pub async fn list_servers(etcd: &Etcd) -> Result<BTreeMap<ServerId, ServerEntry>> {
    let prefix = etcd.keys().servers();
    let answer = etcd
        .client()
        .get(prefix, Some(GetOptions::new().with_prefix()))
        .await
        .map_err(Error::etcd("list servers"))?;
    let mut infos = BTreeMap::new();
    let mut spaces = BTreeMap::new();
    for kv in answer.kvs() {
        let key = String::from_utf8_lossy(kv.key()).into_owned();
        match etcd.keys().parse(&key) {
            Some(Key::ServerState(id)) => {
                infos.insert(id, decode::<ServerInfo>(&key, kv.value())?);
            }
            Some(Key::ServerSpace(id)) => {
                spaces.insert(id, decode::<ServerSpace>(&key, kv.value())?);
            }
            _ => {}
        }
    }
    Ok(infos
        .into_iter()
        .map(|(id, info)| {
            let space = spaces.remove(&id);
            (id, ServerEntry { info, space })
        })
        .collect())
}
