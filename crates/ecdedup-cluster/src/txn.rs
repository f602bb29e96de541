//! The two shapes every guarded write of the layout takes, in one place:
//! a transaction whose compares either hold (its writes happen) or fail
//! (its `or_else` reads the key that says why), and a read of one key.

use crate::error::{Error, Result};
use crate::session::Etcd;
use etcd_client::{KeyValue, Txn, TxnOpResponse};

/// Runs `txn`: `Ok(revision)` of its writes when its compares held, else
/// `Err` with the first key-value that its `or_else` get found (`None` when
/// it has no get, or the key is absent).
pub(crate) async fn run(
    etcd: &Etcd,
    txn: Txn,
    operation: &'static str,
) -> Result<std::result::Result<i64, Option<KeyValue>>> {
    let answer = etcd
        .client()
        .txn(txn)
        .await
        .map_err(Error::etcd(operation))?;
    if answer.succeeded() {
        return Ok(Ok(answer.header().map(|h| h.revision()).unwrap_or(0)));
    }
    let found = answer.op_responses().into_iter().find_map(|op| match op {
        TxnOpResponse::Get(mut get) => get.take_kvs().into_iter().next(),
        _ => None,
    });
    Ok(Err(found))
}

/// Runs `txn`, whose failed compare means that `key` changed meanwhile.
pub(crate) async fn run_or_changed(
    etcd: &Etcd,
    txn: Txn,
    key: &str,
    operation: &'static str,
) -> Result<i64> {
    run(etcd, txn, operation)
        .await?
        .map_err(|_| Error::Changed {
            key: key.to_string(),
            operation,
        })
}

/// The key-value of `key`, if present.
pub(crate) async fn get_one(
    etcd: &Etcd,
    key: &str,
    operation: &'static str,
) -> Result<Option<KeyValue>> {
    let mut answer = etcd
        .client()
        .get(key, None)
        .await
        .map_err(Error::etcd(operation))?;
    Ok(answer.take_kvs().into_iter().next())
}
