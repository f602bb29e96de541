//! Following the PG records while a volume serves (docs/cluster.md,
//! "Down and out"): a writer learns of a re-placement of one of its PGs
//! without waiting for the next open, and installs and rebuilds the
//! moved shard's new chunk while it serves.
//!
//! One etcd watch on the pool's PG records (`watch.rs`: resumed after a
//! broken stream, reloaded after a compaction), read by a thread of its
//! own; a record whose epoch is above the one the writer acts on is
//! followed, in this order:
//!
//! 1. the PG's epoch changes ([`PgEpoch::change`]): the PG's requests in
//!    flight are drained and new ones held back; every kept member gets
//!    an `Open` at the new epoch and is waited for; only then is the new
//!    server's chunk opened (created sparse), at the new epoch too. So
//!    every server of the PG that this writer reaches has stored the new
//!    epoch before any byte moves to or from the new chunk, and from then
//!    on refuses a request stamped with the old one;
//! 2. the moved shard is failed in the PG's array (if the old server's
//!    requests had not failed it yet) and the new chunk installed blank
//!    in its place (`Array::install_replacement`);
//! 3. the PG's rebuild starts in the background (`rebuild.rs`), as at
//!    open.
//!
//! A step that fails (the new server unreachable, a second failure) is
//! logged (`event=pg-replacement-not-followed`) and the PG serves as it
//! did: the next open installs the chunk.
//!
//! A second watch of the same kind (same resume and reload rules) follows
//! the servers' registrations: a server registered again on another
//! address (restarted elsewhere) is reached there from the next request
//! of every link to it (`link.rs`, [`Addresses`]; logged
//! `event=server-address-followed`). Its boot id changed with the restart,
//! so the first change sent to it fails its shard as before (writes it
//! acknowledged may be lost); what it reaches at once is reads. A server
//! registered (again, on any address) whose shards the writer has failed,
//! before or after the registration, gets them re-added while the volume
//! serves, once per registration ([`Follow::re_add_returned`],
//! `rebuild::start_re_add`): only what they missed is reconstructed. The watches cost nothing while no key changes but
//! a server's space report (every 10 s); their queues are bounded
//! (`WATCH_QUEUE_EVENTS`).

use crate::link::{Addresses, PgEpoch, Wire};
use crate::open::{chunk_name, open_chunks, peer_of, wire_pg_epoch};
use crate::rebuild::{self, Running};
use ecdedup_cluster::keys::{decode, Key, PgRecord, ServerInfo};
use ecdedup_cluster::watch::Kv;
use ecdedup_cluster::{Etcd, Keys, ServerId, WatchEvent, Watcher};
use ecdedup_core::array::{Array, MemberState};
use ecdedup_core::error::{Error, Result};
use ecdedup_transport::log::line;
use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const COMPONENT: &str = "volume-client";
/// How often the follower's thread looks at its stop flag while no
/// event comes.
const STOP_POLL: Duration = Duration::from_millis(200);

/// What the follower works on: the volume's PGs as the writer acts on
/// them.
pub(crate) struct Follow {
    pub etcd: Etcd,
    pub rt: tokio::runtime::Handle,
    pub wire: Arc<Wire>,
    pub pool: String,
    pub volume_id: u64,
    /// Each PG's record as followed so far (index = PG number).
    pub records: Vec<PgRecord>,
    pub arrays: Vec<Arc<Array>>,
    pub pg_epochs: Vec<Arc<PgEpoch>>,
    /// The size of every chunk of the volume.
    pub chunk_bytes: u64,
    pub rebuild: rebuild::Context,
    /// The volume's background rebuilds, where a new one is added.
    pub rebuilds: Arc<Mutex<Vec<Running>>>,
}

/// The follower's thread; stopped (and joined) by [`Follower::stop`] or
/// when dropped.
pub struct Follower {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Follower {
    pub(crate) fn start(follow: Follow) -> Follower {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name("ecdedup-pg-follow".into())
                .spawn(move || run(follow, &stop))
                .expect("spawning the PG follower")
        };
        Follower {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops following (a re-placement being installed is finished
    /// first).
    pub fn stop(&mut self) {
        self.stop.store(true, SeqCst);
        if let Some(t) = self.thread.take() {
            if let Err(panic) = t.join() {
                std::panic::resume_unwind(panic);
            }
        }
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.stop.store(true, SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Which watch an event came from.
enum Watched {
    Pgs(Option<WatchEvent>),
    Servers(Option<WatchEvent>),
}

fn run(mut follow: Follow, stop: &AtomicBool) {
    let (mut pgs, mut servers) = {
        let _runtime = follow.rt.enter();
        let keys = follow.etcd.keys();
        (
            Watcher::start(&follow.etcd, keys.pgs(&follow.pool), None),
            Watcher::start(&follow.etcd, keys.servers(), None),
        )
    };
    // Each server's registration as last seen, and the shards a re-add was
    // started for, per registration (its key's revision): one try each.
    let mut registered: BTreeMap<ServerId, Kv> = BTreeMap::new();
    let mut tried: HashSet<(usize, usize, i64)> = HashSet::new();
    while !stop.load(SeqCst) {
        follow.re_add_returned(&registered, &mut tried);
        let next = follow.rt.block_on(async {
            let either = async {
                tokio::select! {
                    e = pgs.next() => Watched::Pgs(e),
                    e = servers.next() => Watched::Servers(e),
                }
            };
            tokio::time::timeout(STOP_POLL, either).await
        });
        let (servers, event) = match next {
            Err(_) => continue,
            Ok(Watched::Pgs(event)) => (false, event),
            Ok(Watched::Servers(event)) => (true, event),
        };
        let kvs = match event {
            None => {
                line(
                    COMPONENT,
                    "watch-stopped",
                    &[
                        ("pool", &follow.pool),
                        ("watch", &if servers { "servers" } else { "pgs" }),
                    ],
                );
                return;
            }
            Some(WatchEvent::Reset { kvs, .. }) => {
                if servers {
                    registered.clear();
                }
                kvs
            }
            Some(WatchEvent::Put(kv)) => vec![kv],
            Some(WatchEvent::Delete { key, .. }) => {
                if let Some(Key::ServerState(id)) = follow.etcd.keys().parse(&key) {
                    registered.remove(&id);
                }
                continue;
            }
        };
        for kv in kvs {
            if servers {
                follow_server(&follow.wire.addresses, follow.etcd.keys(), &kv);
                if let Some(Key::ServerState(id)) = follow.etcd.keys().parse(&kv.key) {
                    registered.insert(id, kv);
                }
                continue;
            }
            let Some(Key::Pg { pool, pg }) = follow.etcd.keys().parse(&kv.key) else {
                continue;
            };
            if pool != follow.pool {
                continue;
            }
            match decode::<PgRecord>(&kv.key, &kv.value) {
                Ok(record) => follow.pg(pg, record),
                Err(e) => line(
                    COMPONENT,
                    "pg-record-unreadable",
                    &[("pg", &pg), ("reason", &e)],
                ),
            }
        }
    }
}

/// Follows one key under `server/`: a server's registration (`state`)
/// naming another address than its links use moves them there. Returns
/// the server and its old and new addresses when it moved.
fn follow_server(
    addresses: &Addresses,
    keys: &Keys,
    kv: &Kv,
) -> Option<(ServerId, SocketAddr, SocketAddr)> {
    let Some(Key::ServerState(id)) = keys.parse(&kv.key) else {
        return None;
    };
    let info = decode::<ServerInfo>(&kv.key, &kv.value)
        .map_err(|e| e.to_string())
        .and_then(|info| {
            info.address
                .parse::<SocketAddr>()
                .map_err(|e| format!("address {:?}: {e}", info.address))
        });
    let to = match info {
        Ok(to) => to,
        Err(reason) => {
            line(
                COMPONENT,
                "server-record-unreadable",
                &[("server", &id), ("reason", &reason)],
            );
            return None;
        }
    };
    let from = addresses.update(id, to)?;
    line(
        COMPONENT,
        "server-address-followed",
        &[("server", &id), ("from", &from), ("to", &to)],
    );
    Some((id, from, to))
}

impl Follow {
    /// Follows PG `pg`'s record if it is newer than the one acted on.
    fn pg(&mut self, pg: u32, record: PgRecord) {
        let Some(current) = self.records.get(pg as usize) else {
            return;
        };
        if record.epoch <= current.epoch || record.servers.len() != current.servers.len() {
            return;
        }
        let moved: Vec<usize> = (0..record.servers.len())
            .filter(|&s| record.servers[s] != current.servers[s])
            .collect();
        if let Err(e) = self.install(pg, &record, &moved) {
            line(
                COMPONENT,
                "pg-replacement-not-followed",
                &[
                    ("volume_id", &self.volume_id),
                    ("pg", &pg),
                    ("pg_epoch", &record.epoch),
                    ("reason", &e),
                ],
            );
        }
        self.records[pg as usize] = record;
    }

    /// Servers registered (`registered`: each one's state key as last
    /// seen): every shard a server holds in a PG of this volume that the
    /// writer has failed is opened on it at the PG's current epoch and
    /// re-added while the volume serves ([`rebuild::start_re_add`]), once
    /// per registration (`tried`: PG, shard, the key's revision). So a
    /// shard failed before its server came back is re-added when the
    /// registration is seen, and one that fails after (its first change
    /// met the restarted server's new boot id) at the next look, within
    /// [`STOP_POLL`]; a shard that fails again under the same registration
    /// waits for the next open. A chunk that cannot be opened, or a PG busy
    /// with a rebuild, leaves the shard failed for the next open (logged).
    fn re_add_returned(
        &self,
        registered: &BTreeMap<ServerId, Kv>,
        tried: &mut HashSet<(usize, usize, i64)>,
    ) {
        for (pg, record) in self.records.iter().enumerate() {
            let states = self.arrays[pg].member_states();
            for (&id, kv) in registered {
                let shards: Vec<usize> = (0..record.servers.len())
                    .filter(|&s| {
                        record.servers[s] == id
                            && states.get(s) == Some(&MemberState::Failed)
                            && tried.insert((pg, s, kv.mod_revision))
                    })
                    .collect();
                if !shards.is_empty() {
                    self.re_add_on(pg as u32, id, kv, &shards);
                }
            }
        }
    }

    /// Opens `shards` of PG `pg` on server `id` (registered as `kv` says)
    /// and starts their re-adds.
    fn re_add_on(&self, pg: u32, id: ServerId, kv: &Kv, shards: &[usize]) {
        let peer = decode::<ServerInfo>(&kv.key, &kv.value)
            .ok()
            .and_then(|info| peer_of(&info));
        let Some(peer) = peer else {
            return;
        };
        let record = &self.records[pg as usize];
        let array = &self.arrays[pg as usize];
        let opened = wire_pg_epoch(pg, record.epoch).and_then(|at| {
            open_chunks(
                &self.wire,
                pg,
                &record.servers,
                shards,
                at,
                &self.pg_epochs[pg as usize],
                self.chunk_bytes,
                &|server| (server == id).then_some(peer),
            )
        });
        let opened = match opened {
            Ok(opened) => opened,
            Err(e) => {
                line(
                    COMPONENT,
                    "shard-re-add-not-started",
                    &[("volume_id", &self.volume_id), ("pg", &pg), ("reason", &e)],
                );
                return;
            }
        };
        for (shard, dev) in opened {
            match dev {
                Ok(dev) => {
                    let running = rebuild::start_re_add(pg, array, shard, dev, &self.rebuild);
                    self.rebuilds.lock().unwrap().push(running);
                }
                Err(e) => line(
                    COMPONENT,
                    "shard-re-add-not-started",
                    &[
                        ("volume_id", &self.volume_id),
                        ("pg", &pg),
                        ("shard", &shard),
                        ("reason", &e),
                    ],
                ),
            }
        }
    }

    /// Steps 1 to 3 of the module's comment for the `moved` shards of PG
    /// `pg`, now placed as `record` says.
    fn install(&self, pg: u32, record: &PgRecord, moved: &[usize]) -> Result<()> {
        let to = wire_pg_epoch(pg, record.epoch)?;
        let servers = self
            .rt
            .block_on(ecdedup_cluster::list_servers(&self.etcd))
            .map_err(|e| Error::Unavailable(format!("listing the servers: {e}")))?;
        let peer = |id: ServerId| peer_of(&servers.get(&id)?.info);
        let kept: Vec<usize> = (0..record.servers.len())
            .filter(|s| !moved.contains(s))
            .collect();
        let pg_epoch = &self.pg_epochs[pg as usize];
        // Every request stamped with the old epoch ends by its reply or
        // its timeout.
        let drain_max = self.wire.timeout * 2;
        let opened = pg_epoch.change(to, drain_max, || -> Result<_> {
            let open = |shards: &[usize]| {
                open_chunks(
                    &self.wire,
                    pg,
                    &record.servers,
                    shards,
                    to,
                    pg_epoch,
                    self.chunk_bytes,
                    &peer,
                )
            };
            for (shard, pushed) in open(&kept)? {
                if let Err(e) = pushed {
                    line(
                        COMPONENT,
                        "pg-epoch-push-failed",
                        &[("pg", &pg), ("shard", &shard), ("reason", &e)],
                    );
                }
            }
            open(moved)
        })?;
        let array = &self.arrays[pg as usize];
        for (shard, dev) in opened {
            let dev = dev.map_err(|e| {
                Error::Unavailable(format!(
                    "opening shard {shard}'s new chunk on server {}: {e}",
                    record.servers[shard]
                ))
            })?;
            if array.status().devices[shard].state != MemberState::Failed {
                array.fail_device(shard)?;
            }
            let name = chunk_name(record.servers[shard], self.volume_id, pg, shard);
            array.install_replacement(shard, dev, &name)?;
            line(
                COMPONENT,
                "shard-replacement-installed",
                &[
                    ("volume_id", &self.volume_id),
                    ("pg", &pg),
                    ("shard", &shard),
                    ("server", &record.servers[shard]),
                    ("pg_epoch", &record.epoch),
                    ("while_serving", &true),
                ],
            );
        }
        if let Some(running) = rebuild::start_pg(pg, array, &self.rebuild) {
            self.rebuilds.lock().unwrap().push(running);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(keys: &Keys, id: u32, address: &str, revision: i64) -> Kv {
        let info = ServerInfo {
            address: address.into(),
            host: "h".into(),
            devices: vec![],
            features: vec![],
        };
        Kv {
            key: keys.server_state(ServerId(id)),
            value: serde_json::to_vec(&info).unwrap(),
            create_revision: revision,
            mod_revision: revision,
            lease: 1,
        }
    }

    #[test]
    fn a_server_registered_again_elsewhere_moves_every_link_to_it() {
        let keys = Keys::new("t").unwrap();
        let book = Addresses::default();
        let old: SocketAddr = "127.0.0.1:7001".parse().unwrap();
        let new: SocketAddr = "127.0.0.1:7002".parse().unwrap();
        // Two chunks of server 3 (two PGs) share its cell.
        let (a, b) = (book.cell(ServerId(3), old), book.cell(ServerId(3), old));
        // The same address again (a reload, a space report) moves nothing.
        assert_eq!(
            follow_server(&book, &keys, &state(&keys, 3, "127.0.0.1:7001", 5)),
            None
        );
        assert_eq!(
            follow_server(&book, &keys, &state(&keys, 3, "127.0.0.1:7002", 9)),
            Some((ServerId(3), old, new))
        );
        assert_eq!(*a.lock().unwrap(), new);
        assert_eq!(*b.lock().unwrap(), new);
        assert_eq!(book.get(ServerId(3)), Some(new));
    }

    #[test]
    fn keys_that_name_no_known_server_or_no_address_change_nothing() {
        let keys = Keys::new("t").unwrap();
        let book = Addresses::default();
        let at: SocketAddr = "127.0.0.1:7001".parse().unwrap();
        book.cell(ServerId(3), at);
        // A server this client has no link to is not tracked.
        assert_eq!(
            follow_server(&book, &keys, &state(&keys, 4, "127.0.0.1:9", 2)),
            None
        );
        assert_eq!(book.get(ServerId(4)), None);
        // A space report, a value that is not JSON, an address that does
        // not parse: logged or ignored, never followed, never a panic.
        let mut space = state(&keys, 3, "127.0.0.1:9", 3);
        space.key = keys.server_space(ServerId(3));
        let mut garbage = state(&keys, 3, "127.0.0.1:9", 4);
        garbage.value = b"{not json".to_vec();
        let no_port = state(&keys, 3, "somewhere", 5);
        for kv in [space, garbage, no_port] {
            assert_eq!(follow_server(&book, &keys, &kv), None, "{}", kv.key);
        }
        assert_eq!(book.get(ServerId(3)), Some(at));
    }
}
