//! The NBD frontend: an nbdkit plugin that serves one ecdedup volume.
//!
//! nbdkit owns the NBD protocol (handshake, request validation, multiple
//! connections, TLS); this plugin maps its callbacks onto [`Volume`]. The
//! array is opened (and resynchronised after an unclean stop) in
//! `config_complete`, before nbdkit accepts a connection; the control socket
//! and the optional Prometheus listener start in `after_fork`, so they live
//! in the serving process. What is advertised holds: FUA is native (a FUA
//! write is durable before the reply), a flush is durable on every device in
//! service, and multi-conn is safe because a flush on any connection flushes
//! the whole array. A panic aborts the server, and a stop signal lets the
//! requests in the array finish, then flushes and closes the array and
//! exits, within a bound and whatever the clients do ([`lifecycle`]).
//!
//! Parameters: `dir=ARRAY_FOLDER` (required), `metrics=HOST:PORT`,
//! `trace=FILE`, `fingerprint_backend=cpu|gpu|auto` (optional; the last
//! overrides the array's configured fingerprint backend for this run).
//!
//! Cluster mode (docs/cluster.md): `cluster=ETCD_ENDPOINTS` (comma-
//! separated), `volume=POOL/NAME`, `key=CLUSTER_KEY_FILE`, `dir=STATE`
//! (where each PG's `array.json` is cached and `stats.sock` answers the
//! volume's counters), `cluster_name=NAME` (default `default`),
//! `lease_ttl=SECONDS` (the writer's etcd lease, default 10: how long a
//! killed writer keeps a successor out), `take_over=1` (take the volume
//! from a writer that still holds it, without waiting for its lease: the
//! epoch fences the old writer). The volume
//! is taken over in `config_complete` (the writer key, the epoch pushed to
//! every server, each PG's array opened), so nbdkit must run in the
//! foreground (`ecdedup serve` does). A writer fenced by a newer one
//! (`EPOCH_TOO_OLD`) or by the loss of its lease stops its export: the
//! failing request gets EIO and the server stops as on SIGTERM, exit 1.

use ecdedup_core::array::Array;
use ecdedup_core::volume::Volume;
use nbdkit::*;
use std::sync::{Arc, Mutex, OnceLock};

mod cluster;
mod lifecycle;

use cluster::Served;

static DIR: Mutex<Option<String>> = Mutex::new(None);
static METRICS: Mutex<Option<String>> = Mutex::new(None);
static TRACE: Mutex<Option<String>> = Mutex::new(None);
static FINGERPRINT_BACKEND: Mutex<Option<String>> = Mutex::new(None);
static CLUSTER: Mutex<cluster::Params> = Mutex::new(cluster::Params::new());
static VOLUME: OnceLock<Arc<Served>> = OnceLock::new();

fn to_nbd(e: ecdedup_core::Error) -> Error {
    Error::new(e.errno(), e.to_string())
}

/// Flushes and closes the volume (the array's clean stop).
fn close_volume() -> std::result::Result<(), String> {
    VOLUME
        .get()
        .map_or(Ok(()), |vol| vol.close().map_err(|e| e.to_string()))
}

fn volume() -> Result<&'static Arc<Served>> {
    VOLUME
        .get()
        .ok_or_else(|| Error::new(libc::EIO, "volume not open"))
}

struct Handle;

impl Server for Handle {
    fn name() -> &'static str {
        "ecdedup"
    }

    fn description() -> Option<&'static str> {
        Some("ecdedup erasure-coded volume")
    }

    fn config_help() -> Option<&'static str> {
        Some("dir=<ARRAY_FOLDER>  (required) the array to serve (cluster mode: the state folder)\nmetrics=<HOST:PORT>  Prometheus text on this address\ncluster=<ETCD,...> volume=<POOL/NAME> key=<FILE> [cluster_name=<NAME>] [etcd_ca=<PEM> [etcd_cert=<PEM> etcd_key=<PEM>]] [lease_ttl=<SECONDS>] [take_over=1] [rebuild_rate=<BYTES_PER_S>]  serve a cluster volume")
    }

    fn config(key: &str, value: &str) -> Result<()> {
        match key {
            "dir" => *DIR.lock().unwrap() = Some(value.to_owned()),
            "metrics" => *METRICS.lock().unwrap() = Some(value.to_owned()),
            "trace" => *TRACE.lock().unwrap() = Some(value.to_owned()),
            "fingerprint_backend" => *FINGERPRINT_BACKEND.lock().unwrap() = Some(value.to_owned()),
            "cluster" | "volume" | "key" | "cluster_name" | "etcd_ca" | "etcd_cert"
            | "etcd_key" | "lease_ttl" | "take_over" | "rebuild_rate" => {
                CLUSTER.lock().unwrap().set(key, value)
            }
            _ => {
                return Err(Error::new(
                    libc::EINVAL,
                    format!(
                        "unknown parameter {key:?} (dir=, metrics=, trace=, fingerprint_backend=, \
                         cluster=, volume=, key=, cluster_name=, etcd_ca=, etcd_cert=, etcd_key=, \
                         lease_ttl=, take_over=, rebuild_rate=)"
                    ),
                ))
            }
        }
        Ok(())
    }

    fn config_complete() -> Result<()> {
        lifecycle::fail_stop_on_panic();
        let dir = DIR.lock().unwrap().clone().ok_or_else(|| {
            Error::new(libc::EINVAL, "the dir=<ARRAY_FOLDER> parameter is required")
        })?;
        let params = CLUSTER.lock().unwrap().clone();
        if params.is_cluster() {
            let served = cluster::open(&params, &dir)?;
            let _ = VOLUME.set(Arc::new(served));
            return Ok(());
        }
        let progress: ecdedup_core::array::ProgressFn =
            Arc::new(|what: &str, done: u64, total: u64| {
                if done == total || done.is_multiple_of(4096) {
                    eprintln!("ecdedup: {what}: {done}/{total} stripes");
                }
            });
        let backend = match FINGERPRINT_BACKEND.lock().unwrap().clone() {
            Some(name) => Some(name.parse().map_err(|e| {
                Error::new(libc::EINVAL, format!("fingerprint_backend={name}: {e}"))
            })?),
            None => None,
        };
        let array = Array::open_with_backend(std::path::Path::new(&dir), Some(progress), backend)
            .map_err(to_nbd)?;
        eprintln!(
            "ecdedup: fingerprint backend: {}",
            array.fingerprint_backend()
        );
        for w in array.open_warnings() {
            eprintln!("ecdedup: warning: {w}");
        }
        let array = Arc::new(array);
        let volume = match TRACE.lock().unwrap().clone() {
            Some(path) => {
                let rec = ecdedup_core::volume::TraceRecorder::create(std::path::Path::new(&path))
                    .map_err(to_nbd)?;
                Volume::with_trace(array, rec)
            }
            None => Volume::new(array),
        };
        let _ = VOLUME.set(Arc::new(Served::Local(volume)));
        Ok(())
    }

    fn after_fork() -> Result<()> {
        let vol = volume()?;
        match vol.as_ref() {
            Served::Local(vol) => {
                ecdedup_core::control::serve(Arc::clone(vol.array())).map_err(to_nbd)?;
                vol.array().start_background_replay();
                if let Some(addr) = METRICS.lock().unwrap().clone() {
                    ecdedup_core::control::serve_metrics(Arc::clone(vol.array()), &addr)
                        .map_err(to_nbd)?;
                }
            }
            Served::Cluster(c) => cluster::serve_stats(Arc::clone(c)).map_err(to_nbd)?,
        }
        // nbdkit's signal handlers are in place, no connection is accepted
        // yet: from now on a stop signal is ours.
        lifecycle::stop_on_signal(close_volume);
        Ok(())
    }

    fn unload() {
        lifecycle::unload(close_volume);
    }

    fn open(_readonly: bool) -> Result<Box<dyn Server>> {
        volume()?;
        if lifecycle::stopping() {
            return Err(Error::new(libc::ESHUTDOWN, "the server is stopping"));
        }
        Ok(Box::new(Handle))
    }

    fn thread_model() -> Result<ThreadModel> {
        Ok(ThreadModel::Parallel)
    }

    fn get_size(&self) -> Result<i64> {
        Ok(volume()?.size() as i64)
    }

    fn is_rotational(&self) -> Result<bool> {
        Ok(false)
    }

    fn can_multi_conn(&self) -> Result<bool> {
        Ok(true)
    }

    fn can_flush(&self) -> Result<bool> {
        Ok(true)
    }

    fn can_fua(&self) -> Result<FuaFlags> {
        Ok(FuaFlags::Native)
    }

    fn can_trim(&self) -> Result<bool> {
        Ok(true)
    }

    fn can_zero(&self) -> Result<bool> {
        Ok(true)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        lifecycle::request(|| volume()?.read(buf, offset).map_err(to_nbd))
    }

    fn write_at(&self, buf: &[u8], offset: u64, flags: Flags) -> Result<()> {
        lifecycle::request(|| {
            volume()?
                .write(buf, offset, flags.contains(Flags::FUA))
                .map_err(to_nbd)
        })
    }

    fn flush(&self) -> Result<()> {
        lifecycle::request(|| volume()?.flush().map_err(to_nbd))
    }

    fn trim(&self, count: u32, offset: u64, flags: Flags) -> Result<()> {
        // A trimmed range reads back as zeroes.
        self.zero(count, offset, flags)
    }

    fn zero(&self, count: u32, offset: u64, flags: Flags) -> Result<()> {
        lifecycle::request(|| {
            volume()?
                .write_zeroes(offset, count as u64, flags.contains(Flags::FUA))
                .map_err(to_nbd)
        })
    }
}

plugin!(Handle {
    config,
    config_complete,
    after_fork,
    unload,
    thread_model,
    is_rotational,
    can_multi_conn,
    can_flush,
    can_fua,
    can_trim,
    can_zero,
    write_at,
    flush,
    trim,
    zero
});
