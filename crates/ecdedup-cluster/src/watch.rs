//! A watch over a key prefix that survives broken streams, compaction and
//! the loss of an endpoint.
//!
//! The consumer sees one ordered stream of [`WatchEvent`]s: first a
//! [`WatchEvent::Reset`] with everything under the prefix (unless the
//! watch starts from a given revision), then the puts and deletes after
//! it. Underneath, [`WatchCursor`] (a state machine with no sockets)
//! decides what to do next:
//! - after a broken stream, watch again from the last revision delivered
//!   plus one, on the same endpoint or the next live one (`Etcd::reconnect`):
//!   nothing is lost and nothing is delivered twice;
//! - after a compaction error (the revision to resume from is gone), load
//!   the whole prefix again (get with prefix) and deliver it as a new
//!   `Reset`, then watch from that read's revision plus one.
//!
//! A revision's events are applied whole: the cursor moves only at the end
//! of a watch response, and etcd never splits a revision across responses
//! (we do not ask for fragmenting).

use crate::error::Result;
use crate::session::Etcd;
use etcd_client::{EventType, GetOptions, WatchOptions};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Events queued between the watch task and a slow consumer.
pub const WATCH_QUEUE_EVENTS: usize = 1024;
/// Pause before retrying after an error (no endpoint, refused watch).
const RETRY_DELAY: Duration = Duration::from_millis(200);

/// A key and its value at some revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kv {
    pub key: String,
    pub value: Vec<u8>,
    pub create_revision: i64,
    pub mod_revision: i64,
    /// The lease the key lives under (0: none).
    pub lease: i64,
}

impl Kv {
    fn from_etcd(kv: &etcd_client::KeyValue) -> Kv {
        Kv {
            key: String::from_utf8_lossy(kv.key()).into_owned(),
            value: kv.value().to_vec(),
            create_revision: kv.create_revision(),
            mod_revision: kv.mod_revision(),
            lease: kv.lease(),
        }
    }
}

/// What a watcher delivers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchEvent {
    /// Everything under the prefix at `revision`: replaces the consumer's
    /// view (the first event, and again after a compaction).
    Reset {
        revision: i64,
        kvs: Vec<Kv>,
    },
    Put(Kv),
    Delete {
        key: String,
        revision: i64,
    },
}

/// What the watch loop does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchAction {
    /// Load the whole prefix (get), then watch after it.
    Load,
    /// Watch from this revision on.
    WatchFrom(i64),
}

/// The watch loop's state: the next revision to deliver, if known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WatchCursor {
    next_revision: Option<i64>,
}

impl WatchCursor {
    /// A cursor that loads first (`None`) or watches from `from`.
    pub fn new(from: Option<i64>) -> WatchCursor {
        WatchCursor {
            next_revision: from,
        }
    }

    pub fn action(&self) -> WatchAction {
        match self.next_revision {
            None => WatchAction::Load,
            Some(revision) => WatchAction::WatchFrom(revision),
        }
    }

    /// The prefix was read at `revision`.
    pub fn on_loaded(&mut self, revision: i64) {
        self.next_revision = Some(revision + 1);
    }

    /// A watch response's events were delivered, the last at `revision`.
    pub fn on_delivered(&mut self, revision: i64) {
        self.next_revision = Some(revision + 1);
    }

    /// etcd compacted past the next revision: only a full load is left.
    pub fn on_compacted(&mut self) {
        self.next_revision = None;
    }
}

/// A running watch; dropping it stops the task.
#[derive(Debug)]
pub struct Watcher {
    rx: mpsc::Receiver<WatchEvent>,
    task: tokio::task::JoinHandle<()>,
    counts: Arc<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    resumes: AtomicU64,
    reloads: AtomicU64,
}

impl Watcher {
    /// Watches every key under `prefix` (a full key prefix, e.g.
    /// `etcd.keys().servers()`): from `from` on if given, else after a
    /// full load.
    pub fn start(etcd: &Etcd, prefix: String, from: Option<i64>) -> Watcher {
        let (tx, rx) = mpsc::channel(WATCH_QUEUE_EVENTS);
        let counts = Arc::new(Counts::default());
        let task = tokio::spawn(run(
            etcd.clone(),
            prefix,
            WatchCursor::new(from),
            tx,
            counts.clone(),
        ));
        Watcher { rx, task, counts }
    }

    /// The next event (`None` only if the task stopped).
    pub async fn next(&mut self) -> Option<WatchEvent> {
        self.rx.recv().await
    }

    /// Times a broken stream was resumed (from revision + 1).
    pub fn resumes(&self) -> u64 {
        self.counts.resumes.load(Ordering::Relaxed)
    }

    /// Times the prefix was loaded again after a compaction.
    pub fn reloads(&self) -> u64 {
        self.counts.reloads.load(Ordering::Relaxed)
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How one step of the watch loop ended.
enum Ended {
    /// The prefix was loaded: watch next.
    Loaded,
    Broken,
    Compacted,
    ConsumerGone,
}

async fn run(
    etcd: Etcd,
    prefix: String,
    mut cursor: WatchCursor,
    tx: mpsc::Sender<WatchEvent>,
    counts: Arc<Counts>,
) {
    loop {
        let step = match cursor.action() {
            WatchAction::Load => load(&etcd, &prefix, &mut cursor, &tx).await,
            WatchAction::WatchFrom(revision) => {
                watch_from(&etcd, &prefix, revision, &mut cursor, &tx).await
            }
        };
        match step {
            Ok(Ended::ConsumerGone) => return,
            Ok(Ended::Loaded) => {}
            Ok(Ended::Compacted) => {
                counts.reloads.fetch_add(1, Ordering::Relaxed);
                cursor.on_compacted();
            }
            Ok(Ended::Broken) | Err(_) => {
                if matches!(cursor.action(), WatchAction::WatchFrom(_)) {
                    counts.resumes.fetch_add(1, Ordering::Relaxed);
                }
                tokio::time::sleep(RETRY_DELAY).await;
                // No live endpoint now: the next pass tries them all again.
                let _ = etcd.reconnect().await;
            }
        }
    }
}

async fn load(
    etcd: &Etcd,
    prefix: &str,
    cursor: &mut WatchCursor,
    tx: &mpsc::Sender<WatchEvent>,
) -> Result<Ended> {
    let answer = etcd
        .client()
        .get(prefix, Some(GetOptions::new().with_prefix()))
        .await
        .map_err(crate::Error::etcd("watch: load"))?;
    let revision = answer.header().map(|h| h.revision()).unwrap_or(0);
    let kvs = answer.kvs().iter().map(Kv::from_etcd).collect();
    if tx.send(WatchEvent::Reset { revision, kvs }).await.is_err() {
        return Ok(Ended::ConsumerGone);
    }
    cursor.on_loaded(revision);
    Ok(Ended::Loaded)
}

async fn watch_from(
    etcd: &Etcd,
    prefix: &str,
    revision: i64,
    cursor: &mut WatchCursor,
    tx: &mpsc::Sender<WatchEvent>,
) -> Result<Ended> {
    let options = WatchOptions::new()
        .with_prefix()
        .with_start_revision(revision);
    let mut stream = etcd
        .client()
        .watch(prefix, Some(options))
        .await
        .map_err(crate::Error::etcd("watch"))?;
    loop {
        let response = match stream.message().await {
            Ok(Some(response)) => response,
            Ok(None) | Err(_) => return Ok(Ended::Broken),
        };
        if response.compact_revision() > 0 {
            return Ok(Ended::Compacted);
        }
        if response.canceled() {
            return Ok(Ended::Broken);
        }
        let mut last = None;
        for event in response.events() {
            let Some(kv) = event.kv() else { continue };
            let delivered = match event.event_type() {
                EventType::Put => WatchEvent::Put(Kv::from_etcd(kv)),
                EventType::Delete => WatchEvent::Delete {
                    key: String::from_utf8_lossy(kv.key()).into_owned(),
                    revision: kv.mod_revision(),
                },
            };
            if tx.send(delivered).await.is_err() {
                return Ok(Ended::ConsumerGone);
            }
            last = Some(kv.mod_revision());
        }
        if let Some(last) = last {
            cursor.on_delivered(last);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_cursor_loads_and_then_watches_after_the_load() {
        let mut cursor = WatchCursor::new(None);
        assert_eq!(cursor.action(), WatchAction::Load);
        cursor.on_loaded(41);
        assert_eq!(cursor.action(), WatchAction::WatchFrom(42));
    }

    #[test]
    fn a_broken_stream_resumes_after_the_last_revision_delivered() {
        let mut cursor = WatchCursor::new(Some(10));
        cursor.on_delivered(17);
        // The stream breaks: nothing changes, the next watch starts at 18.
        assert_eq!(cursor.action(), WatchAction::WatchFrom(18));
    }

    #[test]
    fn a_compaction_turns_the_next_step_into_a_full_load() {
        let mut cursor = WatchCursor::new(Some(10));
        cursor.on_compacted();
        assert_eq!(cursor.action(), WatchAction::Load);
        cursor.on_loaded(90);
        assert_eq!(cursor.action(), WatchAction::WatchFrom(91));
    }
}
