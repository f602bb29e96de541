//! The cluster's data path end to end, in one process: a real etcd (Debian's
//! 3.4, started by the test), six chunk servers on loopback (the daemon's
//! own `run`, each on its own port and folders), and volume clients
//! taking volumes over. Every story checks what it reads against what it
//! wrote. Without `etcd` on PATH the test fails, naming
//! scripts/install-deps.sh.

use ecdedup_chunkd::ChunkdConfig;
use ecdedup_client::{ClusterOptions, ClusterVolume};
use ecdedup_cluster::keys::{DedupPolicy, FailureDomain, PoolSpec, WritePolicy};
use ecdedup_cluster::{Etcd, EtcdConfig, LocalEtcd};
use ecdedup_core::media::IoMode;
use ecdedup_transport::ClusterKey;
use std::path::PathBuf;
use std::time::Duration;
use tokio::task::JoinHandle;

const SERVERS: u32 = 6;

struct Cluster {
    _dir: tempfile::TempDir,
    root: PathBuf,
    etcd: LocalEtcd,
    rt: tokio::runtime::Runtime,
    servers: Vec<Option<JoinHandle<Result<i32, String>>>>,
    key: PathBuf,
}

impl Cluster {
    fn start(name: &str) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_owned();
        let etcd = LocalEtcd::start(&root.join("etcd")).unwrap_or_else(|e| panic!("{e}"));
        let key = root.join("cluster.key");
        ClusterKey::generate().write_new(&key).unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let mut c = Cluster {
            _dir: dir,
            root,
            etcd,
            rt,
            servers: Vec::new(),
            key,
        };
        for id in 0..SERVERS {
            let h = c.start_server(name, id);
            c.servers.push(Some(h));
        }
        let etcd = c.etcd_config(name);
        c.rt.block_on(async {
            let etcd = Etcd::connect(etcd).await.unwrap();
            for _ in 0..600 {
                if ecdedup_cluster::list_servers(&etcd).await.unwrap().len() == SERVERS as usize {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            panic!("the chunk servers did not all register within 60 s");
        });
        c
    }

    fn etcd_config(&self, name: &str) -> EtcdConfig {
        EtcdConfig::new(vec![self.etcd.endpoint()], name)
    }

    fn start_server(&self, name: &str, id: u32) -> JoinHandle<Result<i32, String>> {
        let config = ChunkdConfig {
            etcd: self.etcd_config(name),
            id,
            listen: "127.0.0.1:0".parse().unwrap(),
            advertise: None,
            host: format!("host{id}"),
            key: self.key.clone(),
            dirs: vec![self.root.join(format!("server{id}"))],
            io: IoMode::Buffered,
            lease_ttl: Duration::from_secs(5),
            space_every: Duration::from_secs(10),
        };
        self.rt.spawn(ecdedup_chunkd::run(config))
    }

    fn pool(&self, name: &str, pool: &str, policy: WritePolicy, k: u32, m: u32, pgs: u32) {
        let spec = PoolSpec {
            k,
            m,
            stripe_unit_bytes: 16 << 10,
            policy,
            dedup: DedupPolicy::None,
            pg_count: pgs,
            failure_domain: FailureDomain::Host,
        };
        let etcd = self.etcd_config(name);
        self.rt.block_on(async {
            let etcd = Etcd::connect(etcd).await.unwrap();
            ecdedup_cluster::create_pool(&etcd, pool, &spec)
                .await
                .unwrap();
        });
    }

    fn volume(&self, name: &str, pool: &str, volume: &str, bytes: u64) {
        let etcd = self.etcd_config(name);
        self.rt.block_on(async {
            let etcd = Etcd::connect(etcd).await.unwrap();
            ecdedup_cluster::create_volume(&etcd, pool, volume, bytes)
                .await
                .unwrap();
        });
    }

    fn options(&self, name: &str, pool: &str, volume: &str, state: &str) -> ClusterOptions {
        ClusterOptions {
            etcd: self.etcd_config(name),
            pool: pool.into(),
            volume: volume.into(),
            key: self.key.clone(),
            state_dir: self.root.join(state),
            writer_address: format!("test-{state}"),
            lease_ttl: Duration::from_secs(5),
            request_timeout: Duration::from_secs(20),
        }
    }

    /// Starts server `id` again; its old lease may still run for up to its
    /// TTL (the id is refused meanwhile), so it retries until registered.
    fn restart_server(&mut self, name: &str, id: u32) {
        let etcd = self.etcd_config(name);
        // The killed server's registration goes with its lease (TTL 5 s).
        self.rt.block_on(async {
            let etcd = Etcd::connect(etcd.clone()).await.unwrap();
            for _ in 0..600 {
                let live = ecdedup_cluster::list_servers(&etcd).await.unwrap();
                if !live.contains_key(&ecdedup_cluster::ServerId(id)) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            panic!("server {id}'s old registration did not expire within 60 s");
        });
        for _ in 0..60 {
            let h = self.start_server(name, id);
            let registered = self.rt.block_on(async {
                let etcd = Etcd::connect(etcd.clone()).await.unwrap();
                for _ in 0..100 {
                    if h.is_finished() {
                        return false;
                    }
                    let live = ecdedup_cluster::list_servers(&etcd).await.unwrap();
                    if live.contains_key(&ecdedup_cluster::ServerId(id)) {
                        return true;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                false
            });
            if registered {
                self.servers[id as usize] = Some(h);
                return;
            }
            h.abort();
            std::thread::sleep(Duration::from_millis(500));
        }
        panic!("server {id} did not register again");
    }

    fn kill_server(&mut self, id: u32) {
        if let Some(h) = self.servers[id as usize].take() {
            h.abort();
        }
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Writes, reads back and returns what the volume should hold.
fn write_and_check(v: &ClusterVolume, model: &mut [u8], seed: u64) {
    let size = model.len() as u64;
    let mut s = seed;
    for i in 0..24u64 {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        // Sizes from 4 KiB to 384 KiB: within a stripe, across stripes and PGs.
        let len = 4096 * (1 + (s >> 33) % 96);
        let off = ((s >> 7) % (size - len)) / 4096 * 4096;
        let data = pattern(seed * 1000 + i, len as usize);
        v.write(&data, off, i % 5 == 0).unwrap();
        model[off as usize..(off + len) as usize].copy_from_slice(&data);
    }
    v.flush().unwrap();
    check(v, model);
}

fn check(v: &ClusterVolume, model: &[u8]) {
    let mut got = vec![0u8; model.len()];
    for (i, chunk) in got.chunks_mut(1 << 20).enumerate() {
        v.read(chunk, (i << 20) as u64).unwrap();
    }
    let first_bad = got.iter().zip(model).position(|(a, b)| a != b);
    assert_eq!(first_bad, None, "the volume reads back what was written");
}

fn zero_check(v: &ClusterVolume, model: &mut [u8], off: u64, len: u64) {
    v.write_zeroes(off, len, false).unwrap();
    model[off as usize..(off + len) as usize].fill(0);
}

#[test]
fn volumes_on_six_servers_write_read_take_over_and_run_degraded() {
    let name = "loopback";
    let mut c = Cluster::start(name);
    c.pool(name, "rs42", WritePolicy::Parix, 4, 2, 3);
    c.volume(name, "rs42", "a", 8 << 20);
    c.volume(name, "rs42", "b", 4 << 20);
    let mut model_a = vec![0u8; 8 << 20];
    let mut model_b = vec![0u8; 4 << 20];

    // A new volume is formatted and serves; a second writer is refused.
    let a = ecdedup_client::open(&c.options(name, "rs42", "a", "w1")).unwrap();
    write_and_check(&a, &mut model_a, 1);
    zero_check(&a, &mut model_a, 100 << 10, 1 << 20);
    check(&a, &model_a);
    match ecdedup_client::open(&c.options(name, "rs42", "a", "w2")) {
        Err(ecdedup_core::error::Error::Busy(why)) => assert!(why.contains("writer"), "{why}"),
        Err(e) => panic!("a second writer must be refused as busy, got {e}"),
        Ok(_) => panic!("a second writer must be refused"),
    }
    // Another volume of the same pool is independent.
    let b = ecdedup_client::open(&c.options(name, "rs42", "b", "wb")).unwrap();
    write_and_check(&b, &mut model_b, 2);
    check(&a, &model_a);
    let wire = a.stats_json()["wire"].clone();
    assert!(wire["messages"].as_u64().unwrap() > 0, "{wire}");
    a.close().unwrap();
    b.close().unwrap();
    drop((a, b));

    // A new writer (another state folder: nothing cached) reads it all.
    let a = ecdedup_client::open(&c.options(name, "rs42", "a", "w3")).unwrap();
    check(&a, &model_a);

    // One server killed: its PGs go on degraded, nothing read is wrong.
    c.kill_server(2);
    write_and_check(&a, &mut model_a, 3);
    a.close().unwrap();
    drop(a);
    let a = ecdedup_client::open(&c.options(name, "rs42", "a", "w4")).unwrap();
    check(&a, &model_a);
    write_and_check(&a, &mut model_a, 4);
    a.close().unwrap();
    drop(a);

    // An rmw pool: a server that comes back rejoins at the next open,
    // resynchronising only what it missed.
    c.restart_server(name, 2);
    c.pool(name, "rmw", WritePolicy::Rmw, 4, 2, 2);
    c.volume(name, "rmw", "c", 8 << 20);
    let mut model_c = vec![0u8; 8 << 20];
    let v = ecdedup_client::open(&c.options(name, "rmw", "c", "wc1")).unwrap();
    write_and_check(&v, &mut model_c, 5);
    c.kill_server(4);
    write_and_check(&v, &mut model_c, 6);
    let failed = |v: &ClusterVolume| -> usize {
        v.pg_arrays()
            .iter()
            .map(|a| {
                a.status()
                    .devices
                    .iter()
                    .filter(|d| d.state != ecdedup_core::array::MemberState::Active)
                    .count()
            })
            .sum()
    };
    assert!(failed(&v) > 0, "the killed server's shards are failed");
    v.close().unwrap();
    drop(v);
    c.restart_server(name, 4);
    let v = ecdedup_client::open(&c.options(name, "rmw", "c", "wc2")).unwrap();
    assert_eq!(failed(&v), 0, "the returning server's shards rejoined");
    let resynced: Vec<String> = v
        .pg_arrays()
        .iter()
        .flat_map(|a| a.warnings())
        .filter(|w| w.contains("re-added"))
        .collect();
    assert!(!resynced.is_empty(), "a re-add says what it resynchronised");
    check(&v, &model_c);
    write_and_check(&v, &mut model_c, 7);
    v.close().unwrap();
}
