//! The coordination layer against a real etcd (Debian's etcd 3.4): each
//! test is a story on its own cluster prefix of one etcd shared by the
//! tests that run at the same time (started on free loopback ports,
//! stopped by PID when the last of them ends). A test that compacts gets
//! an etcd of its own. Connection faults come from a TCP proxy in front of
//! etcd that the test can cut (every connection closed) or stop (refusing
//! new ones). Without `etcd` on PATH every test fails, naming
//! scripts/install-deps.sh.

use ecdedup_cluster::keys::{
    DedupPolicy, DeviceSpace, FailureDomain, PoolSpec, ServerInfo, ServerSpace, WritePolicy,
};
use ecdedup_cluster::*;
use std::collections::BTreeSet;
use std::future::Future;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Generous bound on any one wait (a loaded 2-core machine).
const WAIT: Duration = Duration::from_secs(60);

struct EtcdProcess {
    etcd: LocalEtcd,
    _dir: tempfile::TempDir,
}

fn start_etcd() -> EtcdProcess {
    let dir = tempfile::tempdir().expect("a temp dir");
    let etcd = LocalEtcd::start(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    EtcdProcess { etcd, _dir: dir }
}

static SHARED: Mutex<Weak<EtcdProcess>> = Mutex::new(Weak::new());

/// The etcd of the tests running now (started if none runs).
fn shared_etcd() -> Arc<EtcdProcess> {
    let mut shared = SHARED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(running) = shared.upgrade() {
        return running;
    }
    let started = Arc::new(start_etcd());
    *shared = Arc::downgrade(&started);
    started
}

/// The shared etcd, and a connection to it for cluster `cluster`.
async fn shared_cluster(cluster: &str) -> (Arc<EtcdProcess>, Etcd) {
    let process = shared_etcd();
    let etcd = connect(vec![process.etcd.endpoint()], cluster).await;
    (process, etcd)
}

/// Registers server `id` at `address` on `host` with the tests' TTL.
async fn register(etcd: &Etcd, id: u32, address: &str, host: &str) -> Result<Registration> {
    register_server(etcd, ServerId(id), &info(address, host), TTL).await
}

async fn connect(endpoints: Vec<String>, cluster: &str) -> Etcd {
    Etcd::connect(EtcdConfig::new(endpoints, cluster))
        .await
        .unwrap_or_else(|e| panic!("connect: {e}"))
}

async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, future)
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing after {WAIT:?}"))
}

fn info(address: &str, host: &str) -> ServerInfo {
    ServerInfo {
        address: address.to_string(),
        host: host.to_string(),
        devices: vec![],
        features: vec![],
    }
}

const TTL: Duration = Duration::from_secs(10);

/// A TCP proxy in front of etcd.
struct Proxy {
    port: u16,
    accept: JoinHandle<()>,
    connections: Arc<Mutex<Vec<JoinHandle<()>>>>,
    /// Set: the proxy forwards nothing more and keeps every connection
    /// open (a member stopped or cut off while its sockets stay up).
    stalled: Arc<tokio::sync::watch::Sender<bool>>,
    /// The connections kept open, silent, while stalled.
    held: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    async fn start(upstream_port: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let connections: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let held: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let stalled = Arc::new(tokio::sync::watch::Sender::new(false));
        let tracked = connections.clone();
        let (keep, signal) = (held.clone(), stalled.clone());
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let (keep, mut stall) = (keep.clone(), signal.subscribe());
                let handle = tokio::spawn(async move {
                    if *stall.borrow() {
                        keep.lock().unwrap().push(inbound);
                        return;
                    }
                    if let Ok(mut outbound) = TcpStream::connect(("127.0.0.1", upstream_port)).await
                    {
                        let stopped = tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => false,
                            _ = stall.wait_for(|s| *s) => true,
                        };
                        if stopped {
                            keep.lock().unwrap().extend([inbound, outbound]);
                        }
                    }
                });
                tracked.lock().unwrap().push(handle);
            }
        });
        Proxy {
            port,
            accept,
            connections,
            stalled,
            held,
        }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Closes every connection through the proxy; new ones are accepted.
    fn cut(&self) {
        for connection in self.connections.lock().unwrap().drain(..) {
            connection.abort();
        }
    }

    /// Forwards nothing more, in either direction, on any connection, old
    /// or new, and closes none: the peer sees an endpoint that accepts but
    /// never answers.
    fn stall(&self) {
        self.stalled.send_replace(true);
    }

    /// Closes every connection and refuses new ones.
    fn stop(&self) {
        self.accept.abort();
        self.cut();
        self.held.lock().unwrap().clear();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop();
    }
}

/// An endpoint where nothing listens.
fn dead_endpoint() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    format!("http://127.0.0.1:{port}")
}

#[tokio::test]
async fn a_second_server_with_the_same_id_is_refused_and_told_who_holds_it() {
    let (_process, etcd) = shared_cluster("duplicate-id").await;
    let first = register(&etcd, 1, "10.0.0.1:7000", "a").await.unwrap();
    let refused = register(&etcd, 1, "10.0.0.2:7000", "b").await.unwrap_err();
    assert!(
        matches!(refused, Error::ServerIdTaken { id: 1, .. }),
        "{refused}"
    );
    assert!(refused.to_string().contains("10.0.0.1:7000"), "{refused}");

    let space = ServerSpace {
        devices: vec![DeviceSpace {
            path: "/dev/nvme0n1".into(),
            bytes_free: 10,
            bytes_used: 20,
        }],
        dedup: ecdedup_cluster::keys::ServerDedup {
            layers_open: 2,
            reference_parity_writes: 5,
            ..Default::default()
        },
        volumes: [(
            3,
            ecdedup_cluster::keys::VolumeDedup {
                chunks: 2,
                mapped_blocks: 100,
                slots_used: 60,
                ..Default::default()
            },
        )]
        .into(),
        volumes_left_out: 0,
    };
    first.report_space(&space).await.unwrap();
    let servers = list_servers(&etcd).await.unwrap();
    assert_eq!(servers.len(), 1);
    assert_eq!(servers[&ServerId(1)].info.address, "10.0.0.1:7000");
    assert_eq!(servers[&ServerId(1)].space.as_ref(), Some(&space));

    // A clean stop frees the id at once (state and space keys go with the lease).
    first.close().await.unwrap();
    assert!(list_servers(&etcd).await.unwrap().is_empty());
    let second = register(&etcd, 1, "10.0.0.2:7000", "b").await.unwrap();
    assert!(second.fence().reason().is_none());
}

#[tokio::test]
async fn a_revoked_lease_fences_the_server_and_frees_its_id() {
    let (process, etcd) = shared_cluster("revoked").await;
    let registration = register(&etcd, 5, "10.0.0.5:7000", "a").await.unwrap();
    let mut fence = registration.fence();
    // An operator (or the coordinator) revokes the lease from elsewhere.
    let other = connect(vec![process.etcd.endpoint()], "revoked").await;
    other
        .client()
        .lease_revoke(registration.lease_id())
        .await
        .unwrap();
    let reason = within("the fence", fence.fenced()).await;
    assert!(reason.contains("gone"), "{reason}");
    let space = ServerSpace {
        devices: vec![],
        dedup: Default::default(),
        volumes: Default::default(),
        volumes_left_out: 0,
    };
    assert!(matches!(
        registration.report_space(&space).await,
        Err(Error::Fenced(_))
    ));
    register(&other, 5, "10.0.0.6:7000", "b").await.unwrap();
}

/// A new writer's wait on the servers its epoch push missed: until each
/// says it stored the epoch (`server/<id>/epochs`), or is gone (its
/// registration ended), or never follows the writer keys (an older
/// build); else it fails naming the servers it still waits for.
#[tokio::test]
async fn a_new_writer_waits_until_each_missed_server_stored_its_epoch_or_is_gone() {
    let (_process, etcd) = shared_cluster("epoch-wait").await;
    let mut follows = info("10.0.0.1:7000", "a");
    follows.features = vec![keys::FEATURE_EPOCH_WATCH.to_string()];
    // Leases short enough to wait out, long enough that a loaded
    // machine's keepers renew them across both waits (2 s fenced one in
    // review's reckoning: 0.83 s of slack per renewal); the wait outlasts
    // a pending server's TTL by half.
    let ttl = Duration::from_secs(5);
    let one = register_server(&etcd, ServerId(1), &follows, ttl)
        .await
        .unwrap();
    let two = register_server(&etcd, ServerId(2), &follows, ttl)
        .await
        .unwrap();
    let _older = register(&etcd, 3, "10.0.0.3:7000", "c").await.unwrap();
    // The writer keys, as a chunk server reads them at its start.
    create_pool(&etcd, "p", &spec(2, 1, 1, FailureDomain::Device))
        .await
        .unwrap();
    create_volume(&etcd, "p", "v", 1 << 20).await.unwrap();
    let writer = acquire_writer(&etcd, "p", "v", "w", TTL, false)
        .await
        .unwrap();
    let (read_at, epochs) = writer_epochs(&etcd).await.unwrap();
    assert_eq!(epochs, vec![(writer.volume_id(), writer.epoch())]);
    assert!(read_at as u64 >= writer.epoch());
    let (volume, epoch) = (writer.volume_id(), writer.epoch());
    let ids = [ServerId(1), ServerId(2), ServerId(3), ServerId(4)];
    let short = Duration::from_millis(300);
    // Nobody said anything yet: 1 and 2 are waited for, past `short`, for
    // their leases' TTL and half more (7.5 s).
    let began = std::time::Instant::now();
    match await_epoch_stored(&etcd, volume, &ids, epoch, short).await {
        Err(Error::EpochUnconfirmed { servers, .. }) => assert_eq!(servers, "1, 2"),
        other => panic!("expected EpochUnconfirmed, got {other:?}"),
    }
    assert!(
        began.elapsed() >= ttl * 3 / 2,
        "waited {:?}: the pending servers' leases were not waited out",
        began.elapsed()
    );
    // An older epoch said is not enough.
    one.report_epochs(epoch - 1).await.unwrap();
    two.report_epochs(epoch).await.unwrap();
    match await_epoch_stored(&etcd, volume, &ids, epoch, short).await {
        Err(Error::EpochUnconfirmed { servers, .. }) => assert_eq!(servers, "1"),
        other => panic!("expected EpochUnconfirmed, got {other:?}"),
    }
    // Server 1's registration ends (its lease revoked): gone, as 4 is.
    one.close().await.unwrap();
    let stands = await_epoch_stored(&etcd, volume, &ids, epoch, short)
        .await
        .unwrap();
    assert_eq!(
        stands,
        vec![
            (ServerId(1), EpochStand::Gone),
            (ServerId(2), EpochStand::Stored),
            (ServerId(3), EpochStand::Unconfirmable),
            (ServerId(4), EpochStand::Gone),
        ]
    );
    // A server that says it only after the wait began is waited for.
    let three = register_server(&etcd, ServerId(5), &follows, TTL)
        .await
        .unwrap();
    let late = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        three.report_epochs(epoch).await.unwrap();
        three
    });
    let stands = within(
        "the wait",
        await_epoch_stored(&etcd, volume, &[ServerId(5)], epoch, WAIT),
    )
    .await
    .unwrap();
    assert_eq!(stands, vec![(ServerId(5), EpochStand::Stored)]);
    late.await.unwrap();
}

#[tokio::test]
async fn a_server_cut_off_from_etcd_fences_itself() {
    let process = shared_etcd();
    let proxy = Proxy::start(process.etcd.client_port()).await;
    let etcd = connect(vec![proxy.endpoint()], "cut-off").await;
    let registration = register_server(
        &etcd,
        ServerId(9),
        &info("10.0.0.9:7000", "a"),
        Duration::from_secs(3),
    )
    .await
    .unwrap();
    let mut fence = registration.fence();
    assert!(fence.reason().is_none());
    proxy.stop();
    let reason = within("the fence", fence.fenced()).await;
    assert!(reason.contains("not renewed in time"), "{reason}");
}

#[tokio::test]
async fn a_lease_moves_to_another_endpoint_when_its_own_stops_answering() {
    // The etcd leader killed in the fault suite fenced chunk servers on a
    // 5 s lease: a renewal waited on a silent member until the fence.
    let process = shared_etcd();
    let proxy = Proxy::start(process.etcd.client_port()).await;
    let endpoints = vec![proxy.endpoint(), process.etcd.endpoint()];
    let etcd = connect(endpoints, "stalled").await;
    assert_eq!(etcd.endpoint(), proxy.endpoint());
    let ttl = Duration::from_secs(6);
    let registration = register_server(&etcd, ServerId(11), &info("10.0.0.11:7000", "a"), ttl)
        .await
        .unwrap();
    let fence = registration.fence();
    proxy.stall();
    // The keeper's next renewal (due 2 s after the last) gets no answer;
    // it must move to the other endpoint before its fence (4.5 s after the
    // last renewal was sent), not wait on the silent one until then.
    within("the keeper's move to the live endpoint", async {
        while etcd.endpoint() != process.etcd.endpoint() {
            assert_eq!(fence.reason(), None, "fenced before it moved");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    // A whole TTL more, renewed on the live endpoint all along.
    tokio::time::sleep(ttl).await;
    assert_eq!(fence.reason(), None);
    let servers = list_servers(&etcd).await.unwrap();
    assert!(servers.contains_key(&ServerId(11)), "{servers:?}");
    registration.close().await.unwrap();
}

/// Registers `count` servers spread over `hosts` hosts.
async fn register_many(etcd: &Etcd, count: u32, hosts: u32) -> Vec<Registration> {
    let mut registrations = Vec::new();
    for i in 0..count {
        let address = format!("10.0.{}.{}:7000", i % hosts, i);
        let host = format!("host{}", i % hosts);
        registrations.push(register(etcd, i + 1, &address, &host).await.unwrap());
    }
    registrations
}

fn spec(k: u32, m: u32, pg_count: u32, failure_domain: FailureDomain) -> PoolSpec {
    PoolSpec {
        k,
        m,
        stripe_unit_bytes: 65536,
        policy: WritePolicy::Parix,
        dedup: DedupPolicy::Parity,
        pg_count,
        failure_domain,
        min_size: None,
        journal_bytes: None,
    }
}

#[tokio::test]
async fn pools_and_volumes_are_created_listed_resized_and_removed_under_their_guards() {
    let (_process, etcd) = shared_cluster("crud").await;
    let _servers = register_many(&etcd, 6, 3).await;

    // 150 PGs take two transactions; every PG spans three hosts.
    let placed = create_pool(&etcd, "p", &spec(2, 1, 150, FailureDomain::Host))
        .await
        .unwrap();
    let stored = pool_pgs(&etcd, "p").await.unwrap();
    assert_eq!(stored, placed);
    assert_eq!(stored.len(), 150);
    let hosts = list_servers(&etcd).await.unwrap();
    for pg in &stored {
        let distinct: BTreeSet<&str> = pg
            .servers
            .iter()
            .map(|id| hosts[id].info.host.as_str())
            .collect();
        assert_eq!(distinct.len(), 3, "{pg:?}");
    }
    assert!(get_pool(&etcd, "p").await.unwrap().record.ready);
    let again = create_pool(&etcd, "p", &spec(2, 1, 4, FailureDomain::Host)).await;
    assert!(matches!(again, Err(Error::PoolExists(_))), "{again:?}");
    let wide = create_pool(&etcd, "wide", &spec(4, 2, 4, FailureDomain::Host)).await;
    assert!(matches!(wide, Err(Error::Placement(_))), "{wide:?}");
    create_pool(&etcd, "wide", &spec(4, 2, 4, FailureDomain::Device))
        .await
        .unwrap();
    assert_eq!(list_pools(&etcd).await.unwrap().len(), 2);

    let gib = 1u64 << 30;
    let a = create_volume(&etcd, "p", "a", gib).await.unwrap();
    let b = create_volume(&etcd, "p", "b", gib).await.unwrap();
    assert_eq!((a.id, b.id), (1, 2));
    let twice = create_volume(&etcd, "p", "a", gib).await;
    assert!(
        matches!(twice, Err(Error::VolumeExists { .. })),
        "{twice:?}"
    );
    let nowhere = create_volume(&etcd, "nopool", "a", gib).await;
    assert!(
        matches!(nowhere, Err(Error::PoolNotFound(_))),
        "{nowhere:?}"
    );
    assert!(create_volume(&etcd, "p", "odd", 1000).await.is_err());
    // Past what the pool's PGs can hold (2^40 stripes each, here 150 PGs
    // of 2 x 64 KiB stripes: about 20 EiB, so the 4 EiB bound of every
    // volume first; "wide", 4 PGs of 4 x 64 KiB: 1 EiB).
    let max = get_pool(&etcd, "wide")
        .await
        .unwrap()
        .record
        .spec
        .volume_bytes_max();
    assert_eq!(max, (1u64 << 40) * 4 * 4 * (64 << 10));
    let huge = create_volume(&etcd, "wide", "huge", max + 4096).await;
    assert!(
        huge.as_ref()
            .is_err_and(|e| e.to_string().contains("past what pool wide can serve")),
        "{huge:?}"
    );
    assert_eq!(
        get_pool(&etcd, "p")
            .await
            .unwrap()
            .record
            .spec
            .volume_bytes_max(),
        1u64 << 62
    );
    assert_eq!(
        list_volumes(&etcd, "p")
            .await
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        ["a", "b"]
    );

    // A resize or rm based on a stale read is refused by its guard.
    let stale = get_volume(&etcd, "p", "a").await.unwrap();
    resize_volume(&etcd, "p", "a", 2 * gib).await.unwrap();
    let late = resize_volume_at(&etcd, "p", "a", &stale, 3 * gib).await;
    assert!(matches!(late, Err(Error::Changed { .. })), "{late:?}");
    let late = remove_volume_at(&etcd, "p", "a", &stale).await;
    assert!(matches!(late, Err(Error::Changed { .. })), "{late:?}");
    let past = resize_volume(&etcd, "p", "a", (1u64 << 62) + 4096).await;
    assert!(matches!(past, Err(Error::Invalid { .. })), "{past:?}");
    // A writer records what its chunks were formatted for (only the
    // writer holding the key: another epoch records nothing); a resize
    // past it is refused, up to it allowed.
    let writer = acquire_writer(&etcd, "p", "a", "w", TTL, false)
        .await
        .unwrap();
    let stale = record_capacity(&etcd, "p", "a", writer.epoch() - 1, 4 * gib).await;
    assert!(matches!(stale, Err(Error::Changed { .. })), "{stale:?}");
    record_capacity(&etcd, "p", "a", writer.epoch(), 4 * gib)
        .await
        .unwrap();
    assert_eq!(
        get_volume(&etcd, "p", "a")
            .await
            .unwrap()
            .record
            .capacity_bytes,
        Some(4 * gib)
    );
    drop(writer);
    let past = resize_volume(&etcd, "p", "a", 5 * gib).await;
    assert!(
        past.as_ref()
            .is_err_and(|e| e.to_string().contains("formatted for")),
        "{past:?}"
    );
    let shrink = resize_volume(&etcd, "p", "a", gib).await;
    assert!(matches!(shrink, Err(Error::Invalid { .. })), "{shrink:?}");
    assert_eq!(
        get_volume(&etcd, "p", "a").await.unwrap().record.size_bytes,
        2 * gib
    );
    resize_volume(&etcd, "p", "a", 4 * gib).await.unwrap();

    // Ids are never reused.
    remove_volume(&etcd, "p", "b").await.unwrap();
    let gone = get_volume(&etcd, "p", "b").await;
    assert!(
        matches!(gone, Err(Error::VolumeNotFound { .. })),
        "{gone:?}"
    );
    let c = create_volume(&etcd, "p", "b", gib).await.unwrap();
    assert_eq!(c.id, 3);
    // The same name in another pool is another volume.
    assert_eq!(create_volume(&etcd, "wide", "a", gib).await.unwrap().id, 4);
    // What the chunk servers read to free removed volumes' chunks: every
    // pool's ids, the next id, and which etcd cluster said so.
    let ids = volume_ids(&etcd).await.unwrap();
    assert_eq!(ids.live, BTreeSet::from([1, 3, 4]));
    assert_eq!(ids.next, 5);
    assert!(ids.cluster.ends_with("/crud"), "{}", ids.cluster);
    assert!(!ids.cluster.starts_with("0/"), "{}", ids.cluster);

    // Records left bad by another writer are refused when read, by key.
    let no_pgs = r#"{"k":2,"m":1,"stripe_unit_bytes":65536,"policy":"rmw","dedup":"none",
        "pg_count":0,"failure_domain":"host","ready":true}"#;
    let narrow = r#"{"servers":[1],"epoch":1}"#;
    let mut client = etcd.client();
    client
        .put(etcd.keys().pool("bad"), no_pgs, None)
        .await
        .unwrap();
    client
        .put(etcd.keys().pg("p", 7), narrow, None)
        .await
        .unwrap();
    assert_corrupt(get_pool(&etcd, "bad").await, "pool/bad");
    assert_corrupt(pool_pgs(&etcd, "p").await, "pg/p/7");
}

/// A pool is removed only once it holds no volume, with its PG and
/// rebuild records and nothing else's; a pool an older build created with a stripe
/// unit `serve` cannot open (12K) is listed and removable, and no new one
/// is created so.
#[tokio::test]
async fn a_pool_is_removed_once_empty_with_its_records_and_nothing_else() {
    let (_process, etcd) = shared_cluster("pool-rm").await;
    let _servers = register_many(&etcd, 3, 3).await;
    for name in ["p", "p2"] {
        create_pool(&etcd, name, &spec(2, 1, 4, FailureDomain::Host))
            .await
            .unwrap();
    }
    create_volume(&etcd, "p", "a", 1 << 30).await.unwrap();
    match remove_pool(&etcd, "p").await {
        Err(Error::PoolInUse { volumes, .. }) => assert_eq!(volumes, "a"),
        other => panic!("expected PoolInUse, got {other:?}"),
    }
    let mut client = etcd.client();
    // A rebuild record of each pool (as the coordinator writes them).
    for name in ["p", "p2"] {
        client
            .put(etcd.keys().rebuild(name, 0), "{}", None)
            .await
            .unwrap();
    }
    remove_volume(&etcd, "p", "a").await.unwrap();
    remove_pool(&etcd, "p").await.unwrap();
    assert!(matches!(
        get_pool(&etcd, "p").await,
        Err(Error::PoolNotFound(_))
    ));
    let left = |prefix: String| {
        let mut client = etcd.client();
        async move {
            client
                .get(prefix, Some(etcd_client::GetOptions::new().with_prefix()))
                .await
                .unwrap()
                .kvs()
                .len()
        }
    };
    assert_eq!(left(etcd.keys().pgs("p")).await, 0);
    assert_eq!(left(etcd.keys().pool_rebuilds("p")).await, 0);
    // The other pool keeps everything.
    assert_eq!(pool_pgs(&etcd, "p2").await.unwrap().len(), 4);
    assert_eq!(left(etcd.keys().pool_rebuilds("p2")).await, 1);
    let again = remove_pool(&etcd, "p").await;
    assert!(matches!(again, Err(Error::PoolNotFound(_))), "{again:?}");
    // The same name can be created again.
    create_pool(&etcd, "p", &spec(2, 1, 4, FailureDomain::Host))
        .await
        .unwrap();

    // 12K units: refused for a new pool; an old record still lists and goes.
    let twelve = PoolSpec {
        stripe_unit_bytes: 12 << 10,
        ..spec(2, 1, 4, FailureDomain::Host)
    };
    let refused = create_pool(&etcd, "twelve", &twelve).await;
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.to_string().contains("power of two")),
        "{refused:?}"
    );
    let old = r#"{"k":2,"m":1,"stripe_unit_bytes":12288,"policy":"rmw","dedup":"none",
        "pg_count":1,"failure_domain":"host","ready":true}"#;
    client
        .put(etcd.keys().pool("twelve"), old, None)
        .await
        .unwrap();
    assert!(list_pools(&etcd).await.unwrap().contains_key("twelve"));
    remove_pool(&etcd, "twelve").await.unwrap();
    assert!(!list_pools(&etcd).await.unwrap().contains_key("twelve"));
}

/// `result` is a refusal of the value of the key ending in `key_suffix`.
fn assert_corrupt<T: std::fmt::Debug>(result: Result<T>, key_suffix: &str) {
    match result {
        Err(Error::Corrupt { key, .. }) if key.ends_with(key_suffix) => {}
        other => panic!("expected {key_suffix} refused as corrupt, got {other:?}"),
    }
}

#[tokio::test]
async fn each_writer_gets_a_higher_epoch_and_a_second_writer_is_refused() {
    let (_process, etcd) = shared_cluster("writer").await;
    let _servers = register_many(&etcd, 3, 3).await;
    create_pool(&etcd, "p", &spec(2, 1, 8, FailureDomain::Device))
        .await
        .unwrap();
    let volume = create_volume(&etcd, "p", "v", 1 << 30).await.unwrap();

    let first = acquire_writer(&etcd, "p", "v", "10.1.0.1:10809", TTL, false)
        .await
        .unwrap();
    assert_eq!(first.volume_id(), volume.id);
    let (epoch, holder) = current_writer(&etcd, volume.id).await.unwrap().unwrap();
    assert_eq!(
        (epoch, holder.address.as_str()),
        (first.epoch(), "10.1.0.1:10809")
    );

    let second = acquire_writer(&etcd, "p", "v", "10.1.0.2:10809", TTL, false).await;
    match &second {
        Err(Error::WriterHeld { holder, epoch, .. }) => {
            assert_eq!((holder.as_str(), *epoch), ("10.1.0.1:10809", first.epoch()));
        }
        other => panic!("expected WriterHeld, got {other:?}"),
    }
    let in_use = remove_volume(&etcd, "p", "v").await;
    assert!(
        matches!(in_use, Err(Error::VolumeInUse { .. })),
        "{in_use:?}"
    );

    let old_epoch = first.epoch();
    first.release().await.unwrap();
    let next = acquire_writer(&etcd, "p", "v", "10.1.0.2:10809", TTL, false)
        .await
        .unwrap();
    assert!(
        next.epoch() > old_epoch,
        "{} after {old_epoch}",
        next.epoch()
    );
    assert!(next.fence().reason().is_none());

    // A take-over does not wait for the holder's lease: it deletes the key
    // as it read it and creates it again, with a higher epoch, and says
    // whom it displaced.
    let taker = acquire_writer(&etcd, "p", "v", "10.1.0.3:10809", TTL, true)
        .await
        .unwrap();
    assert!(taker.epoch() > next.epoch());
    assert_eq!(
        taker.taken_from(),
        Some(&ecdedup_cluster::TakenFrom {
            holder: "10.1.0.2:10809".into(),
            epoch: next.epoch(),
        })
    );
    let (epoch, holder) = current_writer(&etcd, volume.id).await.unwrap().unwrap();
    assert_eq!(
        (epoch, holder.address.as_str()),
        (taker.epoch(), "10.1.0.3:10809")
    );
    // The displaced writer's release is harmless: the key is the taker's.
    next.release().await.unwrap();
    assert_eq!(
        current_writer(&etcd, volume.id).await.unwrap().unwrap().0,
        taker.epoch()
    );
    // Without a holder, a take-over is a plain acquire.
    taker.release().await.unwrap();
    let plain = acquire_writer(&etcd, "p", "v", "10.1.0.4:10809", TTL, true)
        .await
        .unwrap();
    assert_eq!(plain.taken_from(), None);
}

/// The next `count` events, each within the wait.
async fn take(watcher: &mut Watcher, count: usize) -> Vec<WatchEvent> {
    let mut events = Vec::new();
    while events.len() < count {
        let event = within("a watch event", watcher.next()).await;
        events.push(event.expect("the watch task runs"));
    }
    events
}

/// The keys of puts, in order.
fn put_keys(events: &[WatchEvent]) -> Vec<String> {
    events
        .iter()
        .map(|e| match e {
            WatchEvent::Put(kv) => kv.key.clone(),
            other => panic!("expected a put, got {other:?}"),
        })
        .collect()
}

#[tokio::test]
async fn a_watch_resumes_after_a_broken_stream_without_losing_or_repeating_events() {
    let process = shared_etcd();
    let direct = connect(vec![process.etcd.endpoint()], "resume").await;
    let proxy = Proxy::start(process.etcd.client_port()).await;
    let etcd = connect(vec![proxy.endpoint()], "resume").await;
    let prefix = format!("{}watched/", etcd.keys().prefix());
    let mut watcher = Watcher::start(&etcd, prefix.clone(), None);
    let reset = take(&mut watcher, 1).await;
    assert!(matches!(&reset[0], WatchEvent::Reset { kvs, .. } if kvs.is_empty()));

    let mut client = direct.client();
    let keys: Vec<String> = (0..10).map(|i| format!("{prefix}{i:02}")).collect();
    for key in &keys[..5] {
        client.put(key.as_str(), "x", None).await.unwrap();
    }
    assert_eq!(put_keys(&take(&mut watcher, 5).await), keys[..5]);

    proxy.cut();
    for key in &keys[5..] {
        client.put(key.as_str(), "y", None).await.unwrap();
    }
    client.delete(keys[0].as_str(), None).await.unwrap();
    let after = take(&mut watcher, 6).await;
    assert_eq!(put_keys(&after[..5]), keys[5..]);
    assert!(matches!(&after[5], WatchEvent::Delete { key, .. } if *key == keys[0]));
    assert!(watcher.resumes() >= 1, "the stream was never broken");
    assert_eq!(watcher.reloads(), 0);
}

#[tokio::test]
async fn a_watch_reloads_everything_after_its_revision_was_compacted() {
    // Compaction is cluster-wide: this story gets an etcd of its own.
    let process = start_etcd();
    let etcd = connect(vec![process.etcd.endpoint()], "compact").await;
    let prefix = format!("{}watched/", etcd.keys().prefix());
    let mut client = etcd.client();
    client.put(format!("{prefix}a"), "1", None).await.unwrap();
    let seen = client.put(format!("{prefix}b"), "2", None).await.unwrap();
    let seen_revision = seen.header().unwrap().revision();
    client.put(format!("{prefix}c"), "3", None).await.unwrap();
    client.delete(format!("{prefix}a"), None).await.unwrap();
    let last = client.put("/elsewhere", "x", None).await.unwrap();
    client
        .compact(last.header().unwrap().revision(), None)
        .await
        .unwrap();

    // A consumer that had seen up to `seen_revision` resumes after it: gone.
    let mut watcher = Watcher::start(&etcd, prefix.clone(), Some(seen_revision + 1));
    match &take(&mut watcher, 1).await[0] {
        WatchEvent::Reset { kvs, revision } => {
            let keys: Vec<&str> = kvs.iter().map(|kv| kv.key.as_str()).collect();
            assert_eq!(keys, [format!("{prefix}b"), format!("{prefix}c")]);
            assert!(*revision >= last.header().unwrap().revision());
        }
        other => panic!("expected a reload, got {other:?}"),
    }
    assert_eq!(watcher.reloads(), 1);
    client.put(format!("{prefix}d"), "4", None).await.unwrap();
    assert_eq!(
        put_keys(&take(&mut watcher, 1).await),
        [format!("{prefix}d")]
    );
}

#[tokio::test]
async fn connect_skips_a_dead_endpoint_and_the_watch_fails_over_to_the_next() {
    let process = shared_etcd();
    let proxy = Proxy::start(process.etcd.client_port()).await;
    let endpoints = vec![dead_endpoint(), proxy.endpoint(), process.etcd.endpoint()];
    let etcd = connect(endpoints, "failover").await;
    assert_eq!(etcd.endpoint(), proxy.endpoint());

    let prefix = format!("{}watched/", etcd.keys().prefix());
    let mut watcher = Watcher::start(&etcd, prefix.clone(), None);
    take(&mut watcher, 1).await;
    let mut client = connect(vec![process.etcd.endpoint()], "failover")
        .await
        .client();
    client.put(format!("{prefix}1"), "x", None).await.unwrap();
    assert_eq!(
        put_keys(&take(&mut watcher, 1).await),
        [format!("{prefix}1")]
    );

    // The proxied endpoint goes away for good.
    proxy.stop();
    client.put(format!("{prefix}2"), "x", None).await.unwrap();
    assert_eq!(
        put_keys(&take(&mut watcher, 1).await),
        [format!("{prefix}2")]
    );
    assert_eq!(etcd.endpoint(), process.etcd.endpoint());
    // One-shot requests use the endpoint the watch found.
    let servers = list_servers(&etcd).await.unwrap();
    assert!(servers.is_empty());
}
