//! A single-member etcd on loopback, started and stopped by this process:
//! the tests' etcd, and the one `cluster up` is to start (issue 19, item 7).
//!
//! The binary is `$ECDEDUP_ETCD` or `etcd` on `PATH` (Debian's
//! `etcd-server`, installed by `scripts/install-deps.sh`). It listens on two
//! free loopback ports (client, peer), keeps its data in the given folder,
//! and writes its log to `etcd.log` there. [`LocalEtcd::start`] returns
//! once `/health` answers; dropping the value stops the process by its
//! PID (SIGTERM, then SIGKILL after [`STOP_GRACE`]) and waits for it.
//!
//! [`LocalEtcd::start_tls`] serves clients over TLS only, requiring a
//! client certificate signed by the given CA (`--client-cert-auth`), as
//! docs/cluster.md's deployment does; `/health` is then asked on a third,
//! plain loopback port (`--listen-metrics-urls`); with [`ServerTls::peer`]
//! its peer port takes TLS with peer certificates only as well.

use crate::error::{Error, Result};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Longest wait for a started etcd to report healthy.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest wait after SIGTERM before SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(10);
/// Tries with fresh ports when etcd exits at start (a port taken meanwhile).
const START_ATTEMPTS: u32 = 3;

/// A running etcd; stopped when dropped.
#[derive(Debug)]
pub struct LocalEtcd {
    child: Child,
    client_port: u16,
    peer_port: u16,
    /// Where `/health` is asked (plain HTTP): the client port, or the
    /// metrics port under TLS.
    health_port: u16,
    tls: bool,
    dir: PathBuf,
}

/// etcd's own TLS files for clients (PEM): its certificate and key, and
/// the CA its clients' certificates must be signed by.
#[derive(Clone, Debug)]
pub struct ServerTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: PathBuf,
    /// TLS on the peer port too (None: plain HTTP on loopback).
    pub peer: Option<PeerTls>,
}

/// etcd's TLS on its peer (Raft) port: a certificate and key used both to
/// serve and to dial peers (server and client auth), signed by the same CA
/// as the clients' (`ServerTls::client_ca`); a peer is accepted only with
/// such a certificate whose common name is [`PEER_COMMON_NAME`]
/// (`--peer-cert-allowed-cn`), so a client's certificate of the same CA
/// cannot join as a member.
#[derive(Clone, Debug)]
pub struct PeerTls {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The common name every etcd member's peer certificate carries.
pub const PEER_COMMON_NAME: &str = "ecdedup-etcd-peer";

/// The etcd binary to run.
pub fn etcd_binary() -> Result<PathBuf> {
    etcd_binary_in(std::env::var_os("ECDEDUP_ETCD"), std::env::var_os("PATH"))
}

/// `etcd_binary` for given values of `ECDEDUP_ETCD` and `PATH`.
fn etcd_binary_in(
    chosen: Option<std::ffi::OsString>,
    path: Option<std::ffi::OsString>,
) -> Result<PathBuf> {
    if let Some(chosen) = chosen {
        return Ok(PathBuf::from(chosen));
    }
    path.into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join("etcd"))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| {
            Error::LocalEtcd(
                "no `etcd` on PATH (and ECDEDUP_ETCD unset): install it with \
                 scripts/install-deps.sh (Debian package etcd-server)"
                    .into(),
            )
        })
}

/// A loopback port that was free a moment ago.
fn free_port() -> Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(|e| Error::LocalEtcd(format!("no free loopback port: {e}")))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| Error::LocalEtcd(format!("no free loopback port: {e}")))
}

impl LocalEtcd {
    /// Starts etcd with its data and log in `dir` (created if needed).
    pub fn start(dir: &Path) -> Result<LocalEtcd> {
        Self::start_with(dir, None)
    }

    /// Starts etcd serving clients over TLS with client certificates only.
    pub fn start_tls(dir: &Path, tls: &ServerTls) -> Result<LocalEtcd> {
        Self::start_with(dir, Some(tls))
    }

    fn start_with(dir: &Path, tls: Option<&ServerTls>) -> Result<LocalEtcd> {
        let binary = etcd_binary()?;
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::LocalEtcd(format!("{}: {e}", dir.display())))?;
        let mut last = String::new();
        for _ in 0..START_ATTEMPTS {
            match Self::start_once(&binary, dir, tls) {
                Ok(etcd) => return Ok(etcd),
                Err(e) => last = e.to_string(),
            }
        }
        Err(Error::LocalEtcd(last))
    }

    fn start_once(binary: &Path, dir: &Path, tls: Option<&ServerTls>) -> Result<LocalEtcd> {
        let (client_port, peer_port) = (free_port()?, free_port()?);
        let scheme = if tls.is_some() { "https" } else { "http" };
        let client_url = format!("{scheme}://127.0.0.1:{client_port}");
        let peer_tls = tls.and_then(|t| t.peer.as_ref().map(|p| (p, &t.client_ca)));
        let peer_scheme = if peer_tls.is_some() { "https" } else { "http" };
        let peer_url = format!("{peer_scheme}://127.0.0.1:{peer_port}");
        let log_path = dir.join("etcd.log");
        let log = std::fs::File::create(&log_path)
            .map_err(|e| Error::LocalEtcd(format!("{}: {e}", log_path.display())))?;
        let log_err = log
            .try_clone()
            .map_err(|e| Error::LocalEtcd(format!("{}: {e}", log_path.display())))?;
        let mut command = Command::new(binary);
        if let Some((peer, ca)) = peer_tls {
            command
                .arg(format!("--peer-cert-file={}", peer.cert.display()))
                .arg(format!("--peer-key-file={}", peer.key.display()))
                .arg(format!("--peer-trusted-ca-file={}", ca.display()))
                .arg("--peer-client-cert-auth")
                .arg(format!("--peer-cert-allowed-cn={PEER_COMMON_NAME}"));
        }
        let health_port = match tls {
            None => client_port,
            Some(tls) => {
                let metrics_port = free_port()?;
                command
                    .arg(format!("--cert-file={}", tls.cert.display()))
                    .arg(format!("--key-file={}", tls.key.display()))
                    .arg(format!("--trusted-ca-file={}", tls.client_ca.display()))
                    .arg("--client-cert-auth")
                    .arg(format!(
                        "--listen-metrics-urls=http://127.0.0.1:{metrics_port}"
                    ));
                metrics_port
            }
        };
        let child = command
            .arg("--name=ecdedup")
            .arg(format!("--data-dir={}", dir.join("data").display()))
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=ecdedup={peer_url}"))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .map_err(|e| Error::LocalEtcd(format!("{}: {e}", binary.display())))?;
        let mut etcd = LocalEtcd {
            child,
            client_port,
            peer_port,
            health_port,
            tls: tls.is_some(),
            dir: dir.to_path_buf(),
        };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(Some(status)) = etcd.child.try_wait() {
                return Err(Error::LocalEtcd(format!(
                    "{} exited at start ({status}); its log ends:\n{}",
                    binary.display(),
                    etcd.log_tail()
                )));
            }
            if etcd.healthy() {
                return Ok(etcd);
            }
            if Instant::now() > deadline {
                return Err(Error::LocalEtcd(format!(
                    "not healthy after {START_TIMEOUT:?}; its log ends:\n{}",
                    etcd.log_tail()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `http://127.0.0.1:<port>` (`https://` under TLS): the client
    /// endpoint.
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    /// The client port.
    pub fn client_port(&self) -> u16 {
        self.client_port
    }

    /// The peer (Raft) port.
    pub fn peer_port(&self) -> u16 {
        self.peer_port
    }

    /// Lets etcd run on after this handle goes (`ecdedup cluster up`,
    /// which `cluster down` stops by its pid); returns the pid.
    pub fn detach(self) -> u32 {
        let pid = self.child.id();
        std::mem::forget(self);
        pid
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether `GET /health` answers `"health":"true"`.
    pub fn healthy(&self) -> bool {
        let address = SocketAddr::from((Ipv4Addr::LOCALHOST, self.health_port));
        let Ok(mut stream) = TcpStream::connect_timeout(&address, Duration::from_secs(1)) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
        if stream
            .write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .is_err()
        {
            return false;
        }
        let mut answer = String::new();
        let _ = stream.take(64 * 1024).read_to_string(&mut answer);
        answer.contains("\"health\":\"true\"")
    }

    /// The last lines of etcd's log (for error messages).
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for LocalEtcd {
    fn drop(&mut self) {
        let pid = self.child.id() as libc::pid_t;
        // SAFETY: kill(2) on our own child's pid; it has not been waited for
        // (so the pid is not reused) until the wait below.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_etcd_on_path_the_error_names_the_install_script() {
        let empty = tempfile::tempdir().unwrap();
        let err = etcd_binary_in(None, Some(empty.path().as_os_str().to_owned())).unwrap_err();
        assert!(err.to_string().contains("scripts/install-deps.sh"), "{err}");
        assert!(etcd_binary_in(None, None).is_err());
    }
}
