//! What the plugin serves: a local array's volume, or a cluster volume
//! (docs/cluster.md), behind one set of calls.

use ecdedup_client::{ClusterOptions, ClusterVolume};
use ecdedup_cluster::{EtcdConfig, EtcdTls};
use ecdedup_core::volume::Volume;
use ecdedup_core::Result;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The cluster parameters (`cluster=`, `volume=`, `key=`, `cluster_name=`,
/// `etcd_ca=`, `etcd_cert=`, `etcd_key=`, `lease_ttl=`, `take_over=`,
/// `rebuild_rate=`).
#[derive(Clone, Debug)]
pub struct Params {
    endpoints: Option<String>,
    volume: Option<String>,
    key: Option<String>,
    name: Option<String>,
    etcd_ca: Option<String>,
    etcd_cert: Option<String>,
    etcd_key: Option<String>,
    lease_ttl: Option<String>,
    take_over: Option<String>,
    rebuild_rate: Option<String>,
}

/// The writer's etcd lease TTL without `lease_ttl=`: a killed writer's
/// successor waits up to this long for the volume.
pub const WRITER_LEASE_TTL_DEFAULT: Duration = Duration::from_secs(10);

impl Params {
    pub const fn new() -> Params {
        Params {
            endpoints: None,
            volume: None,
            key: None,
            name: None,
            etcd_ca: None,
            etcd_cert: None,
            etcd_key: None,
            lease_ttl: None,
            take_over: None,
            rebuild_rate: None,
        }
    }

    pub fn set(&mut self, key: &str, value: &str) {
        let slot = match key {
            "cluster" => &mut self.endpoints,
            "volume" => &mut self.volume,
            "key" => &mut self.key,
            "etcd_ca" => &mut self.etcd_ca,
            "etcd_cert" => &mut self.etcd_cert,
            "etcd_key" => &mut self.etcd_key,
            "lease_ttl" => &mut self.lease_ttl,
            "take_over" => &mut self.take_over,
            "rebuild_rate" => &mut self.rebuild_rate,
            _ => &mut self.name,
        };
        *slot = Some(value.to_owned());
    }

    pub fn is_cluster(&self) -> bool {
        self.endpoints.is_some() || self.volume.is_some()
    }

    /// `lease_ttl=SECONDS`: whole seconds, at least the lease minimum.
    fn lease_ttl(&self) -> nbdkit::Result<Duration> {
        let Some(text) = &self.lease_ttl else {
            return Ok(WRITER_LEASE_TTL_DEFAULT);
        };
        let min = ecdedup_cluster::lease::LEASE_TTL_MIN;
        match text.parse::<u64>() {
            Ok(s) if Duration::from_secs(s) >= min => Ok(Duration::from_secs(s)),
            _ => Err(nbdkit::Error::new(
                libc::EINVAL,
                format!(
                    "lease_ttl={text:?}: whole seconds, at least {}",
                    min.as_secs()
                ),
            )),
        }
    }

    /// `take_over=1|0` (default 0): take the volume from a writer that
    /// still holds it.
    fn take_over(&self) -> nbdkit::Result<bool> {
        match self.take_over.as_deref() {
            None | Some("0") => Ok(false),
            Some("1") => Ok(true),
            Some(other) => Err(nbdkit::Error::new(
                libc::EINVAL,
                format!("take_over={other:?}: 1 or 0"),
            )),
        }
    }

    /// `rebuild_rate=BYTES_PER_S` (default
    /// [`ecdedup_client::open::REBUILD_BYTES_PER_S_DEFAULT`]; 0: no
    /// throttle): the most a rebuild writes to a PG's new server per second.
    fn rebuild_rate(&self) -> nbdkit::Result<u64> {
        let Some(text) = &self.rebuild_rate else {
            return Ok(ecdedup_client::open::REBUILD_BYTES_PER_S_DEFAULT);
        };
        text.parse::<u64>().map_err(|_| {
            nbdkit::Error::new(
                libc::EINVAL,
                format!("rebuild_rate={text:?}: bytes per second, a whole number (0: no throttle)"),
            )
        })
    }
}

pub enum Served {
    Local(Volume),
    Cluster(Arc<ClusterVolume>),
}

/// Set once a fenced writer has begun its stop.
static FENCE_STOP: AtomicBool = AtomicBool::new(false);

impl Served {
    pub fn size(&self) -> u64 {
        match self {
            Served::Local(v) => v.size(),
            Served::Cluster(c) => c.size(),
        }
    }

    /// A failed request of a fenced writer stops the export (once).
    fn after<T>(&self, r: Result<T>) -> Result<T> {
        if let (Err(_), Served::Cluster(c)) = (&r, self) {
            if let Some(reason) = c.wire().fenced() {
                if !FENCE_STOP.swap(true, Ordering::SeqCst) {
                    ecdedup_transport::log::line(
                        "volume-client",
                        "fenced",
                        &[("volume_id", &c.wire().volume_id), ("reason", &reason)],
                    );
                    // SAFETY: raising a signal our own handler takes.
                    unsafe { libc::raise(libc::SIGTERM) };
                }
            }
        }
        r
    }

    pub fn read(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.after(match self {
            Served::Local(v) => v.read(buf, offset),
            Served::Cluster(c) => c.read(buf, offset),
        })
    }

    pub fn write(&self, buf: &[u8], offset: u64, fua: bool) -> Result<()> {
        self.after(match self {
            Served::Local(v) => v.write(buf, offset, fua),
            Served::Cluster(c) => c.write(buf, offset, fua),
        })
    }

    pub fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<()> {
        self.after(match self {
            Served::Local(v) => v.write_zeroes(offset, len, fua),
            Served::Cluster(c) => c.write_zeroes(offset, len, fua),
        })
    }

    pub fn flush(&self) -> Result<()> {
        self.after(match self {
            Served::Local(v) => v.flush(),
            Served::Cluster(c) => c.flush(),
        })
    }

    pub fn close(&self) -> Result<()> {
        match self {
            Served::Local(v) => v.close(),
            Served::Cluster(c) => c.close(),
        }
    }
}

fn missing(what: &str) -> nbdkit::Error {
    nbdkit::Error::new(
        libc::EINVAL,
        format!("cluster mode needs {what}= (cluster=, volume=POOL/NAME, key=)"),
    )
}

/// Takes the cluster volume over.
pub fn open(params: &Params, state: &str) -> nbdkit::Result<Served> {
    let endpoints = params.endpoints.clone().ok_or_else(|| missing("cluster"))?;
    let volume = params.volume.clone().ok_or_else(|| missing("volume"))?;
    let key = params.key.clone().ok_or_else(|| missing("key"))?;
    let (pool, name) = volume
        .split_once('/')
        .filter(|(p, n)| !p.is_empty() && !n.is_empty())
        .ok_or_else(|| {
            nbdkit::Error::new(libc::EINVAL, format!("volume={volume:?} is not POOL/NAME"))
        })?;
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let opts = ClusterOptions {
        etcd: EtcdConfig::new(
            endpoints.split(',').map(str::to_owned).collect(),
            params.name.as_deref().unwrap_or("default"),
        )
        .with_tls(EtcdTls {
            ca: params.etcd_ca.as_ref().map(PathBuf::from),
            cert: params.etcd_cert.as_ref().map(PathBuf::from),
            key: params.etcd_key.as_ref().map(PathBuf::from),
        }),
        pool: pool.to_owned(),
        volume: name.to_owned(),
        key: PathBuf::from(key),
        state_dir: PathBuf::from(state),
        writer_address: format!("{} pid {}", host.trim(), std::process::id()),
        lease_ttl: params.lease_ttl()?,
        request_timeout: Duration::from_secs(10),
        capacity_bytes_min: ecdedup_client::open::CAPACITY_BYTES_MIN,
        rebuild_bytes_per_s: params.rebuild_rate()?,
        take_over: params.take_over()?,
        epoch_wait: ecdedup_client::open::EPOCH_WAIT_DEFAULT,
    };
    let c =
        ecdedup_client::open(&opts).map_err(|e| nbdkit::Error::new(e.errno(), e.to_string()))?;
    for (pg, a) in c.pg_arrays().iter().enumerate() {
        for w in a.open_warnings() {
            eprintln!("ecdedup: PG {pg}: warning: {w}");
        }
    }
    Ok(Served::Cluster(Arc::new(c)))
}

/// The socket that answers the volume's counters (JSON, one answer per
/// connection): `STATE/stats.sock`.
pub fn stats_socket(state: &Path) -> PathBuf {
    state.join("stats.sock")
}

/// Answers the counters on [`stats_socket`], in a thread of its own.
pub fn serve_stats(c: Arc<ClusterVolume>) -> Result<()> {
    use std::io::Write;
    let path = stats_socket(c.state_dir());
    let _ = std::fs::remove_file(&path);
    let listener = std::os::unix::net::UnixListener::bind(&path)
        .map_err(|e| ecdedup_core::Error::io(format!("binding {}", path.display()), e))?;
    std::thread::Builder::new()
        .name("ecdedup-stats".into())
        .spawn(move || {
            for mut conn in listener.incoming().flatten() {
                let text = c.stats_json().to_string();
                let _ = conn.write_all(text.as_bytes());
            }
        })
        .map_err(|e| ecdedup_core::Error::io("starting the stats thread", e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_over_is_1_or_0() {
        let mut p = Params::new();
        assert!(!p.take_over().unwrap());
        p.set("take_over", "1");
        assert!(p.take_over().unwrap());
        p.set("take_over", "0");
        assert!(!p.take_over().unwrap());
        for bad in ["yes", "2", ""] {
            p.set("take_over", bad);
            let e = p.take_over().expect_err(bad);
            assert!(e.to_string().contains("take_over"), "{bad}: {e}");
        }
    }

    #[test]
    fn rebuild_rate_is_whole_bytes_per_second() {
        let mut p = Params::new();
        let default = ecdedup_client::open::REBUILD_BYTES_PER_S_DEFAULT;
        assert_eq!(p.rebuild_rate().unwrap(), default);
        p.set("rebuild_rate", "262144");
        assert_eq!(p.rebuild_rate().unwrap(), 262_144);
        p.set("rebuild_rate", "0");
        assert_eq!(p.rebuild_rate().unwrap(), 0);
        for bad in ["-1", "1.5", "64M", ""] {
            p.set("rebuild_rate", bad);
            let e = p.rebuild_rate().expect_err(bad);
            assert!(e.to_string().contains("rebuild_rate"), "{bad}: {e}");
        }
    }

    #[test]
    fn lease_ttl_is_whole_seconds_at_least_the_minimum() {
        let mut p = Params::new();
        assert_eq!(p.lease_ttl().unwrap(), WRITER_LEASE_TTL_DEFAULT);
        p.set("lease_ttl", "3");
        assert_eq!(p.lease_ttl().unwrap(), Duration::from_secs(3));
        for bad in ["1", "0", "-3", "2.5", "ten", ""] {
            p.set("lease_ttl", bad);
            let e = p.lease_ttl().expect_err(bad);
            assert!(e.to_string().contains("lease_ttl"), "{bad}: {e}");
        }
    }
}
