//! The cluster's commands (docs/cluster.md):
//! - `ecdedup chunkd`: a chunk server;
//! - `ecdedup pool create|ls`: pools and their placement groups in etcd;
//! - `ecdedup cluster up|status|stats|restart-server|down`: a whole cluster
//!   on this machine (etcd, N chunk servers on loopback, a pool, a volume,
//!   its NBD server), for trials and tests; its processes are recorded in
//!   `DIR/cluster.json` and stopped by pid.

use crate::error::{Error, Result};
use crate::units::{format_size, parse_size};
use clap::{Args, Subcommand};
use ecdedup_cluster::keys::{DedupPolicy, FailureDomain, PoolSpec, WritePolicy};
use ecdedup_cluster::{Etcd, EtcdConfig, EtcdTls, ServerId};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Makes a peer that closed its socket an error value, not the end of
/// this process. `main` lets SIGPIPE end a command (for a closed
/// stdout), but the etcd client writes its sockets with writev (h2 over
/// rustls), which raises SIGPIPE when etcd closes the connection, as it
/// does when it refuses a client without a certificate: the command died
/// silently. A command that talks to etcd or chunk servers ignores it
/// instead (a closed stdout is then an error "Broken pipe").
pub fn ignore_sigpipe() {
    // SAFETY: signal(2) only changes this process's disposition of one
    // signal; it is called before the command's runtime starts.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
}

/// Writes a report to stdout. A reader that stopped reading (`cluster
/// status | head -3`: a closed pipe, SIGPIPE ignored by [`runtime`]) ends
/// the command quietly, as it ends `cat`; any other failure is an error.
fn print_out(text: &str) -> Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(Error::io("writing to stdout", e))
        }
        _ => Ok(()),
    }
}

fn cluster_error(e: ecdedup_cluster::Error) -> Error {
    Error::Other(e.to_string())
}

/// The runtime of a command that talks to etcd or chunk servers, with
/// SIGPIPE ignored first ([`ignore_sigpipe`]).
fn runtime() -> Result<tokio::runtime::Runtime> {
    ignore_sigpipe();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Error::io("starting the tokio runtime", e))
}

/// How a command reaches etcd: the endpoints, the cluster's name and TLS
/// (every command that talks to etcd flattens this one struct; global, so
/// `pool create --etcd URL` works as `pool --etcd URL create`).
#[derive(Args)]
pub struct EtcdArgs {
    /// etcd endpoints (comma-separated), tried in this order
    /// (https://... with --etcd-ca).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "http://127.0.0.1:2379",
        global = true
    )]
    pub etcd: Vec<String>,
    /// The cluster's name: its keys live under /ecdedup/<cluster>/.
    #[arg(long, default_value = "default", global = true)]
    pub cluster: String,
    #[command(flatten)]
    pub tls: EtcdTlsArgs,
}

/// TLS to etcd (docs/cluster.md, "Security").
#[derive(Args, Clone, Default)]
pub struct EtcdTlsArgs {
    /// CA file (PEM) that etcd's server certificate is verified against;
    /// needed by https:// endpoints.
    #[arg(long, global = true)]
    pub etcd_ca: Option<PathBuf>,
    /// Client certificate (PEM) presented to etcd (--client-cert-auth).
    #[arg(long, requires = "etcd_key", global = true)]
    pub etcd_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, requires = "etcd_cert", global = true)]
    pub etcd_key: Option<PathBuf>,
}

impl EtcdTlsArgs {
    pub fn tls(&self) -> EtcdTls {
        EtcdTls {
            ca: self.etcd_ca.clone(),
            cert: self.etcd_cert.clone(),
            key: self.etcd_key.clone(),
        }
    }
}

impl EtcdArgs {
    pub fn config(&self) -> EtcdConfig {
        EtcdConfig::new(self.etcd.clone(), &self.cluster).with_tls(self.tls.tls())
    }
}

#[derive(Args)]
pub struct ChunkdArgs {
    #[command(flatten)]
    etcd: EtcdArgs,
    /// This server's id: unique in the cluster (a second server with the
    /// same id is refused while the first is registered).
    #[arg(long)]
    id: u32,
    /// Where the data protocol listens, HOST:PORT (port 0: any).
    #[arg(long, default_value = "0.0.0.0:7900")]
    listen: String,
    /// The address clients reach it at, if not --listen's.
    #[arg(long)]
    advertise: Option<String>,
    /// The failure domain `host` of placement [default: the host name].
    #[arg(long)]
    host: Option<String>,
    /// The cluster key file (mode 0600; `ecdedup cluster up` makes one).
    #[arg(long)]
    key: PathBuf,
    /// A data folder (one per device or file system; repeat).
    #[arg(long = "data", required = true)]
    data: Vec<PathBuf>,
    /// Chunk I/O: direct (O_DIRECT) or buffered.
    #[arg(long, default_value = "direct")]
    io: String,
    /// The etcd lease's TTL in seconds: a server that cannot renew it for
    /// this long fences itself and exits 3.
    #[arg(long, default_value_t = 10)]
    lease_ttl: u64,
    /// Seconds a server may stay down before it is out: the coordinator
    /// (one chunk server, elected in etcd) then re-places its PGs and
    /// their writers rebuild them elsewhere. Give every server the same.
    #[arg(long, default_value_t = 600)]
    out_after: u64,
    /// RAM the dedup layers of the open chunks may hold together (a
    /// dedup pool's chunks: about 16 bytes per dedup block of a chunk, plus
    /// its fingerprint index); past it the least recently used is closed.
    #[arg(long, default_value = "4G")]
    dedup_ram: String,
}

/// `ecdedup chunkd`: returns the process's exit status.
pub fn chunkd(args: ChunkdArgs) -> Result<i32> {
    let listen = args
        .listen
        .parse()
        .map_err(|e| Error::Config(format!("--listen {:?}: {e}", args.listen)))?;
    let host = match args.host {
        Some(h) => h,
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| "localhost".into()),
    };
    let config = ecdedup_chunkd::ChunkdConfig {
        etcd: args.etcd.config(),
        id: args.id,
        listen,
        advertise: args.advertise,
        host,
        key: args.key,
        dirs: args.data,
        io: args.io.parse()?,
        lease_ttl: Duration::from_secs(args.lease_ttl),
        space_every: Duration::from_secs(10),
        out_after: Duration::from_secs(args.out_after),
        layers_ram_max: ecdedup_core::units::parse_size(&args.dedup_ram)
            .map_err(|e| Error::Config(format!("--dedup-ram {:?}: {e}", args.dedup_ram)))?,
    };
    runtime()?
        .block_on(ecdedup_chunkd::run(config))
        .map_err(Error::Other)
}

#[derive(Args)]
pub struct PoolArgs {
    #[command(flatten)]
    etcd: EtcdArgs,
    #[command(subcommand)]
    command: PoolCommand,
}

#[derive(Args, Clone)]
pub struct PoolSettings {
    #[arg(short, long, default_value_t = 4)]
    k: u32,
    #[arg(short, long, default_value_t = 2)]
    m: u32,
    /// Stripe unit (a power of two from 4K to 4M).
    #[arg(long, default_value = "64K")]
    stripe_unit: String,
    /// Partial-write policy: rmw, plog, parix, or replicate (with --copies;
    /// stored as k = 1, m = copies - 1).
    #[arg(long, default_value = "rmw")]
    policy: String,
    /// Copies of `replicate`.
    #[arg(long, default_value_t = 3)]
    copies: u32,
    /// Dedup: none, all or parity.
    #[arg(long, default_value = "none")]
    dedup: String,
    /// Placement groups.
    #[arg(long, default_value_t = 4)]
    pgs: u32,
    /// What the servers of one PG must not share: host, or device (one-machine trials).
    #[arg(long, default_value = "host")]
    failure_domain: String,
    /// The fewest shards of a PG in service for writes (below it writes
    /// fail with EIO, reads go on while k remain) [default: k + 1 for
    /// m >= 2, else k].
    #[arg(long)]
    min_size: Option<u32>,
    /// Bound of each shard's parity journal under plog and parix (a
    /// journal past half of it is replayed; parix's one-round-trip
    /// overwrite needs the block's d(0) still in the journal) [default: 32M].
    #[arg(long)]
    journal_max: Option<String>,
}

impl PoolSettings {
    fn spec(&self) -> Result<PoolSpec> {
        let bad = |what: &str, v: &str| Error::Config(format!("--{what} {v:?}"));
        let (k, m, policy) = match self.policy.as_str() {
            "rmw" => (self.k, self.m, WritePolicy::Rmw),
            "plog" => (self.k, self.m, WritePolicy::Plog),
            "parix" => (self.k, self.m, WritePolicy::Parix),
            "replicate" => (
                1,
                self.copies.saturating_sub(1),
                WritePolicy::Replicate {
                    copies: self.copies,
                },
            ),
            other => return Err(bad("policy (rmw, plog, parix, replicate)", other)),
        };
        let dedup = match self.dedup.as_str() {
            "none" => DedupPolicy::None,
            "all" => DedupPolicy::All,
            "parity" => DedupPolicy::Parity,
            other => return Err(bad("dedup (none, all, parity)", other)),
        };
        let failure_domain = match self.failure_domain.as_str() {
            "host" => FailureDomain::Host,
            "device" => FailureDomain::Device,
            other => return Err(bad("failure-domain (host, device)", other)),
        };
        let unit = parse_size(&self.stripe_unit)?;
        let spec = PoolSpec {
            k,
            m,
            stripe_unit_bytes: u32::try_from(unit)
                .map_err(|_| bad("stripe-unit", &self.stripe_unit))?,
            policy,
            dedup,
            pg_count: self.pgs,
            failure_domain,
            min_size: self.min_size,
            journal_bytes: self.journal_max.as_deref().map(parse_size).transpose()?,
        };
        spec.check_new().map_err(cluster_error)?;
        Ok(spec)
    }
}

#[derive(Subcommand)]
enum PoolCommand {
    /// Create a pool and place its PGs on the servers registered now.
    Create {
        name: String,
        #[command(flatten)]
        settings: PoolSettings,
    },
    /// List the pools and their settings.
    Ls,
    /// Remove a pool that holds no volume (its PG and rebuild records go
    /// with it).
    Rm { name: String },
}

/// `ecdedup pool ...`; what it prints goes to `out`.
pub fn pool(args: PoolArgs, out: &mut dyn std::io::Write) -> Result<()> {
    // Bad settings are refused before etcd is reached.
    if let PoolCommand::Create { settings, .. } = &args.command {
        settings.spec()?;
    }
    let text = runtime()?.block_on(async {
        let etcd = Etcd::connect(args.etcd.config())
            .await
            .map_err(cluster_error)?;
        match args.command {
            PoolCommand::Create { name, settings } => {
                let spec = settings.spec()?;
                let pgs = ecdedup_cluster::create_pool(&etcd, &name, &spec)
                    .await
                    .map_err(cluster_error)?;
                Ok::<_, Error>(format!(
                    "created pool {name}: RS({},{}) {:?}, {} PGs\n",
                    spec.k,
                    spec.m,
                    spec.policy,
                    pgs.len()
                ))
            }
            PoolCommand::Rm { name } => {
                ecdedup_cluster::remove_pool(&etcd, &name)
                    .await
                    .map_err(cluster_error)?;
                Ok(format!("removed pool {name}\n"))
            }
            PoolCommand::Ls => {
                let mut text = String::new();
                for (name, record) in ecdedup_cluster::list_pools(&etcd)
                    .await
                    .map_err(cluster_error)?
                {
                    let s = &record.spec;
                    text.push_str(&format!(
                        "{name}\tRS({},{})\t{:?}\tunit {}\tdedup {:?}\t{} PGs\n",
                        s.k,
                        s.m,
                        s.policy,
                        format_size(u64::from(s.stripe_unit_bytes)),
                        s.dedup,
                        s.pg_count
                    ));
                }
                Ok(text)
            }
        }
    })?;
    out.write_all(text.as_bytes())
        .map_err(|e| Error::io("writing the output", e))
}

#[derive(Args)]
pub struct ClusterArgs {
    #[command(subcommand)]
    command: ClusterCommand,
}

/// `cluster up`'s options.
#[derive(Args)]
struct UpArgs {
    #[arg(long, default_value_t = 6)]
    servers: u32,
    /// Data folders per chunk server.
    #[arg(long, default_value_t = 1)]
    devices_per_server: u32,
    /// The pool's name.
    #[arg(long, default_value = "pool0")]
    pool: String,
    #[command(flatten)]
    settings: PoolSettings,
    /// The volume's name.
    #[arg(long, default_value = "vol0")]
    volume: String,
    /// The volume's size.
    #[arg(long, default_value = "1G")]
    size: String,
    /// Chunk I/O of the servers: direct or buffered.
    #[arg(long, default_value = "buffered")]
    io: String,
    /// nbdkit worker threads of the volume's NBD server.
    #[arg(long, default_value_t = 16)]
    threads: u32,
    /// Start no NBD server (`ecdedup serve --cluster` serves volumes).
    #[arg(long)]
    no_serve: bool,
    /// Seconds a chunk server may be down before it is out (its PGs
    /// re-placed and rebuilt elsewhere; `chunkd --out-after`).
    #[arg(long, default_value_t = 600)]
    out_after: u64,
    /// Run etcd over TLS with client certificates: a CA, etcd's and a
    /// client certificate are made in DIR/tls, and every command of this
    /// cluster uses them (recorded in cluster.json).
    #[arg(long)]
    etcd_tls: bool,
}

// Parsed once per process: the size of `Up` does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum ClusterCommand {
    /// Start a cluster on this machine in --dir: etcd, N chunk servers on
    /// loopback, a pool, a volume and its NBD server; prints the NBD URI.
    Up(UpArgs),
    /// Servers (live or down), PGs, volumes and their writers.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// The volume client's counters (JSON): wire messages, round trips,
    /// bytes, and each PG array's counters.
    Stats,
    /// Start chunk server ID again (after a kill).
    RestartServer { id: u32 },
    /// Stop everything `up` started (NBD server, chunk servers, etcd).
    Down,
}

/// What `cluster up` started, in `DIR/cluster.json`.
#[derive(Serialize, Deserialize, Default)]
struct UpState {
    etcd: String,
    etcd_pid: u32,
    key: PathBuf,
    servers: Vec<ServerProc>,
    io: String,
    devices_per_server: u32,
    pool: String,
    volume: String,
    serve_pid: Option<u32>,
    socket: PathBuf,
    /// `chunkd --out-after` of every server (older state files: 600).
    #[serde(default = "out_after_default")]
    out_after: u64,
    /// `--etcd-tls`: the client's TLS files (older state files: none).
    #[serde(default)]
    etcd_tls: Option<TlsFiles>,
}

/// The PEM files a client of `cluster up --etcd-tls`'s etcd presents.
#[derive(Serialize, Deserialize, Clone)]
struct TlsFiles {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

impl UpState {
    fn tls(&self) -> EtcdTls {
        match &self.etcd_tls {
            Some(t) => EtcdTls {
                ca: Some(t.ca.clone()),
                cert: Some(t.cert.clone()),
                key: Some(t.key.clone()),
            },
            None => EtcdTls::default(),
        }
    }

    /// How this cluster's commands reach its etcd.
    fn etcd_config(&self) -> EtcdConfig {
        EtcdConfig::new(vec![self.etcd.clone()], CLUSTER_NAME).with_tls(self.tls())
    }

    /// `--etcd-ca F --etcd-cert F --etcd-key F`, or nothing.
    fn tls_args(&self) -> Vec<std::ffi::OsString> {
        let mut args = Vec::new();
        if let Some(t) = &self.etcd_tls {
            for (option, path) in [
                ("--etcd-ca", &t.ca),
                ("--etcd-cert", &t.cert),
                ("--etcd-key", &t.key),
            ] {
                args.push(option.into());
                args.push(path.into());
            }
        }
        args
    }
}

fn out_after_default() -> u64 {
    600
}

#[derive(Serialize, Deserialize, Clone)]
struct ServerProc {
    id: u32,
    pid: u32,
    /// Its data protocol's loopback port, the same across restarts.
    port: u16,
}

/// A free loopback port (the kernel's choice; a race with another binder
/// makes the server's start fail loudly, never serve elsewhere).
fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| Error::io("finding a free port", e))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| Error::io("finding a free port", e))
}

const STATE_FILE: &str = "cluster.json";
const CLUSTER_NAME: &str = "default";
/// Generous bound on each start-up wait (a loaded 2-core machine).
const START_WAIT: Duration = Duration::from_secs(120);

fn load_state(dir: &Path) -> Result<UpState> {
    let path = dir.join(STATE_FILE);
    let bytes = std::fs::read(&path).map_err(|e| {
        Error::Config(format!(
            "{}: {e} (no cluster was started in {} with `ecdedup cluster up`)",
            path.display(),
            dir.display()
        ))
    })?;
    serde_json::from_slice(&bytes).map_err(|e| Error::Corrupt(format!("{}: {e}", path.display())))
}

fn save_state(dir: &Path, state: &UpState) -> Result<()> {
    let bytes = serde_json::to_vec_pretty(state).expect("plain data serializes");
    crate::media::storage::write_atomic(&crate::media::OsStorage, &dir.join(STATE_FILE), &bytes)
        .map_err(|e| Error::io("writing cluster.json", e))
}

fn alive(pid: u32) -> bool {
    // A zombie (our own child not yet reaped) counts as gone.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat
        .rsplit(')')
        .next()
        .and_then(|r| r.split_whitespace().next());
    !stat.is_empty() && state != Some("Z")
}

/// SIGTERM, then SIGKILL past `grace`; waits until the process is gone.
fn stop_pid(pid: u32, grace: Duration) {
    if !alive(pid) {
        return;
    }
    // SAFETY: kill(2) on a pid this cluster recorded.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
    let deadline = Instant::now() + grace;
    while alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    if alive(pid) {
        // SAFETY: as above.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn exe() -> Result<PathBuf> {
    std::env::current_exe().map_err(|e| Error::io("locating the ecdedup executable", e))
}

/// Starts a detached process with its output in `log`; returns its pid.
fn spawn_logged(mut cmd: Command, log: &Path) -> Result<u32> {
    use std::os::unix::process::CommandExt;
    let out = std::fs::File::create(log)
        .map_err(|e| Error::io(format!("creating {}", log.display()), e))?;
    let err = out.try_clone().map_err(|e| Error::io("log file", e))?;
    let child = cmd
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .spawn()
        .map_err(|e| Error::io("starting a cluster process", e))?;
    Ok(child.id())
}

fn start_server(dir: &Path, state: &UpState, id: u32, port: u16) -> Result<u32> {
    let mut cmd = Command::new(exe()?);
    cmd.arg("chunkd")
        .arg("--etcd")
        .arg(&state.etcd)
        .arg("--cluster")
        .arg(CLUSTER_NAME)
        .arg("--id")
        .arg(id.to_string())
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--host")
        .arg(format!("host{id}"))
        .arg("--key")
        .arg(&state.key)
        .arg("--io")
        .arg(&state.io)
        .arg("--lease-ttl")
        .arg("5")
        .arg("--out-after")
        .arg(state.out_after.to_string())
        .args(state.tls_args());
    for d in 0..state.devices_per_server.max(1) {
        cmd.arg("--data")
            .arg(dir.join(format!("server{id}")).join(format!("dev{d}")));
    }
    spawn_logged(cmd, &dir.join(format!("server{id}.log")))
}

/// The last 15 lines of `log` (none where it cannot be read).
fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

fn wait_for(what: &str, log: &Path, mut ready: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + START_WAIT;
    while !ready() {
        if Instant::now() > deadline {
            return Err(Error::Other(format!(
                "{what} did not come up within {START_WAIT:?}; {} ends:\n{}",
                log.display(),
                log_tail(log)
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// Starts a server again on a fresh port this many times at most where its
/// first port was taken between `free_port` and its bind.
const PORT_RETRIES: u32 = 3;

/// Waits until every server of `state` is registered. A server that exits
/// first fails the wait at once with its own log's end, unless its port was
/// taken meanwhile (another process bound it after `free_port` let it go):
/// that one starts again on a fresh port. On time out, the logs are those
/// of the servers not registered (server 0's log alone said nothing of a
/// server that never came: a clean-clone CI run on 2026-11-28).
fn wait_for_servers(
    dir: &Path,
    state: &mut UpState,
    rt: &tokio::runtime::Runtime,
    etcd: &EtcdConfig,
) -> Result<()> {
    let deadline = Instant::now() + START_WAIT;
    let mut retries = 0;
    let log_end = |id: u32| {
        let log = dir.join(format!("server{id}.log"));
        let end = log_tail(&log);
        (log, end)
    };
    loop {
        let up = registered(rt, etcd);
        let waiting: Vec<u32> = state
            .servers
            .iter()
            .map(|s| s.id)
            .filter(|id| !up.contains(id))
            .collect();
        if waiting.is_empty() {
            return Ok(());
        }
        for slot in 0..state.servers.len() {
            let ServerProc { id, pid, .. } = state.servers[slot];
            if !waiting.contains(&id) || alive(pid) {
                continue;
            }
            let (log, end) = log_end(id);
            if end.contains("in use") && retries < PORT_RETRIES {
                retries += 1;
                let port = free_port()?;
                state.servers[slot].pid = start_server(dir, state, id, port)?;
                state.servers[slot].port = port;
                save_state(dir, state)?;
                continue;
            }
            return Err(Error::Other(format!(
                "chunk server {id} exited at start; {} ends:\n{end}",
                log.display()
            )));
        }
        if Instant::now() > deadline {
            let logs: Vec<String> = waiting
                .iter()
                .map(|&id| {
                    let (log, end) = log_end(id);
                    format!("{} ends:\n{end}", log.display())
                })
                .collect();
            return Err(Error::Other(format!(
                "chunk servers {waiting:?} did not register within {START_WAIT:?}; {}",
                logs.join("\n")
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn registered(rt: &tokio::runtime::Runtime, etcd: &EtcdConfig) -> Vec<u32> {
    rt.block_on(async {
        let Ok(etcd) = Etcd::connect(etcd.clone()).await else {
            return Vec::new();
        };
        ecdedup_cluster::list_servers(&etcd)
            .await
            .map(|s| s.keys().map(|id| id.0).collect())
            .unwrap_or_default()
    })
}

fn start_serve(dir: &Path, state: &UpState, threads: u32) -> Result<u32> {
    let _ = std::fs::remove_file(&state.socket);
    let mut cmd = Command::new(exe()?);
    cmd.arg("serve")
        .arg("--dir")
        .arg(dir.join("client"))
        .arg("--cluster")
        .arg(&state.etcd)
        .arg("--cluster-name")
        .arg(CLUSTER_NAME)
        .arg("--volume")
        .arg(format!("{}/{}", state.pool, state.volume))
        .arg("--key")
        .arg(&state.key)
        .arg("--socket")
        .arg(&state.socket)
        .arg("--threads")
        .arg(threads.to_string())
        .args(state.tls_args());
    spawn_logged(cmd, &dir.join("serve.log"))
}

/// `ecdedup cluster ...` in `dir`.
pub fn cluster(dir: &Path, args: ClusterArgs) -> Result<()> {
    match args.command {
        ClusterCommand::Up(args) => up(dir, args),
        ClusterCommand::Status { json } => status(dir, json),
        ClusterCommand::Stats => {
            use std::io::Read;
            let path = dir.join("client").join("stats.sock");
            let mut s = std::os::unix::net::UnixStream::connect(&path).map_err(|e| {
                Error::io(
                    format!("connecting to {} (is the volume served?)", path.display()),
                    e,
                )
            })?;
            let mut text = String::new();
            s.read_to_string(&mut text)
                .map_err(|e| Error::io("reading the counters", e))?;
            text.push('\n');
            print_out(&text)
        }
        ClusterCommand::RestartServer { id } => {
            let mut state = load_state(dir)?;
            let Some(slot) = state.servers.iter().position(|s| s.id == id) else {
                return Err(Error::Config(format!("this cluster has no server {id}")));
            };
            if alive(state.servers[slot].pid) {
                return Err(Error::Busy(format!(
                    "server {id} runs (pid {})",
                    state.servers[slot].pid
                )));
            }
            let rt = runtime()?;
            let etcd = state.etcd_config();
            let log = dir.join(format!("server{id}.log"));
            // A killed server's registration lives until its lease expires
            // (5 s): the id is refused until then.
            wait_for(
                &format!("server {id}'s old registration to expire"),
                &log,
                || !registered(&rt, &etcd).contains(&id),
            )?;
            // Its old port first; where another process took it while
            // the server was down, a fresh one (the writer follows the
            // new address, docs/cluster.md).
            let mut port = state.servers[slot].port;
            let mut retries = 0;
            loop {
                let pid = start_server(dir, &state, id, port)?;
                state.servers[slot].pid = pid;
                state.servers[slot].port = port;
                save_state(dir, &state)?;
                wait_for(&format!("server {id}"), &log, || {
                    registered(&rt, &etcd).contains(&id) || !alive(pid)
                })?;
                if alive(pid) {
                    println!("server {id} restarted (pid {pid}, port {port})");
                    return Ok(());
                }
                if log_tail(&log).contains("in use") && retries < PORT_RETRIES {
                    retries += 1;
                    port = free_port()?;
                    continue;
                }
                return Err(Error::Other(format!(
                    "server {id} exited at start; see {}",
                    log.display()
                )));
            }
        }
        ClusterCommand::Down => {
            // Only a state file that is not there means nothing runs (one
            // that cannot be looked at is an error, not "nothing").
            let state_file = dir.join(STATE_FILE);
            let present = state_file
                .try_exists()
                .map_err(|e| Error::io(format!("looking at {}", state_file.display()), e))?;
            if !present {
                println!(
                    "no cluster runs in {} (no {STATE_FILE}): nothing to stop",
                    dir.display()
                );
                return Ok(());
            }
            stop_all(dir, &load_state(dir)?)?;
            println!("cluster in {} stopped", dir.display());
            Ok(())
        }
    }
}

/// Stops every process of `state` (the NBD server first, then the chunk
/// servers, then etcd), and forgets them (`cluster.json` removed).
fn stop_all(dir: &Path, state: &UpState) -> Result<()> {
    if let Some(pid) = state.serve_pid {
        stop_pid(pid, Duration::from_secs(90));
    }
    for s in &state.servers {
        stop_pid(s.pid, Duration::from_secs(30));
    }
    stop_pid(state.etcd_pid, Duration::from_secs(30));
    // A process that outlived its kill (stuck in the kernel) stays listed.
    let left: Vec<u32> = state
        .serve_pid
        .into_iter()
        .chain(state.servers.iter().map(|s| s.pid))
        .chain([state.etcd_pid])
        .filter(|&pid| alive(pid))
        .collect();
    if !left.is_empty() {
        return Err(Error::Other(format!(
            "processes {left:?} did not stop; {STATE_FILE} is kept"
        )));
    }
    std::fs::remove_file(dir.join(STATE_FILE)).map_err(|e| Error::io("removing cluster.json", e))
}

fn up(dir: &Path, args: UpArgs) -> Result<()> {
    let UpArgs {
        servers,
        devices_per_server,
        pool,
        settings,
        volume,
        size,
        io,
        threads,
        no_serve,
        out_after,
        etcd_tls,
    } = args;
    let threads = (!no_serve).then_some(threads);
    let spec = settings.spec()?;
    let size_bytes = parse_size(&size)?;
    let _: crate::media::IoMode = io.parse()?;
    if servers < spec.width() {
        return Err(Error::Config(format!(
            "RS({},{}) needs {} servers on distinct hosts; --servers {servers}",
            spec.k,
            spec.m,
            spec.width()
        )));
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let dir = std::fs::canonicalize(dir).map_err(|e| Error::io("resolving --dir", e))?;
    if let Ok(old) = load_state(&dir) {
        if alive(old.etcd_pid) {
            return Err(Error::Busy(format!(
                "a cluster runs in {} (etcd pid {}); `ecdedup cluster down --dir {}` first",
                dir.display(),
                old.etcd_pid,
                dir.display()
            )));
        }
    }
    let key = dir.join("cluster.key");
    if !key.exists() {
        ecdedup_transport::ClusterKey::generate()
            .write_new(&key)
            .map_err(|e| Error::Other(e.to_string()))?;
    }
    let (etcd, client_tls) = if etcd_tls {
        let pki = crate::cluster_pki::make(&dir.join("tls"))?;
        let etcd = ecdedup_cluster::LocalEtcd::start_tls(&dir.join("etcd"), &pki.server);
        let c = pki.client;
        let files =
            c.ca.zip(c.cert)
                .zip(c.key)
                .map(|((ca, cert), key)| TlsFiles { ca, cert, key });
        (etcd, files)
    } else {
        (ecdedup_cluster::LocalEtcd::start(&dir.join("etcd")), None)
    };
    let etcd = etcd.map_err(cluster_error)?;
    let state = UpState {
        etcd: etcd.endpoint(),
        etcd_pid: etcd.detach(),
        key,
        servers: Vec::new(),
        io,
        devices_per_server,
        pool: pool.clone(),
        volume: volume.clone(),
        serve_pid: None,
        socket: dir.join("nbd.sock"),
        out_after,
        etcd_tls: client_tls,
    };
    if let Err(e) = save_state(&dir, &state) {
        // Not recorded: stopped here, or nothing would know of it.
        stop_pid(state.etcd_pid, Duration::from_secs(30));
        return Err(e);
    }
    // From here on a failure stops what this command started (a failed
    // `cluster up` leaves no process behind); the data stays in DIR.
    let mut state = state;
    match start_the_rest(
        &dir, &mut state, servers, &pool, &volume, &spec, size_bytes, threads,
    ) {
        Ok(()) => Ok(()),
        Err(e) => {
            let stopped = match stop_all(&dir, &state) {
                Ok(()) => "every process it started is stopped".to_string(),
                Err(s) => format!("stopping what it started: {s}"),
            };
            Err(Error::Other(format!("cluster up failed ({stopped}): {e}")))
        }
    }
}

/// A pool's settings with the defaults filled in (`min_size`, the journal
/// bound), for comparing what was kept with what was given.
fn effective(spec: &PoolSpec) -> (PoolSpec, u32, u64) {
    (
        PoolSpec {
            min_size: None,
            journal_bytes: None,
            ..spec.clone()
        },
        spec.min_size(),
        spec.journal_bytes(),
    )
}

/// A pool's settings in one line.
fn describe_spec(s: &PoolSpec) -> String {
    format!(
        "RS({},{}) {:?}, unit {}, dedup {:?}, {} PGs, failure domain {:?}, min_size {}, journal {}",
        s.k,
        s.m,
        s.policy,
        format_size(u64::from(s.stripe_unit_bytes)),
        s.dedup,
        s.pg_count,
        s.failure_domain,
        s.min_size(),
        format_size(s.journal_bytes())
    )
}

/// `cluster up` once etcd runs: the chunk servers, the pool and the volume
/// (kept where an earlier cluster of this folder made them), the NBD
/// server; then what it prints.
#[allow(clippy::too_many_arguments)]
fn start_the_rest(
    dir: &Path,
    state: &mut UpState,
    servers: u32,
    pool: &str,
    volume: &str,
    spec: &PoolSpec,
    size_bytes: u64,
    threads: Option<u32>,
) -> Result<()> {
    for id in 0..servers {
        let port = free_port()?;
        let pid = start_server(dir, state, id, port)?;
        state.servers.push(ServerProc { id, pid, port });
        save_state(dir, state)?;
    }
    let rt = runtime()?;
    let etcd_config = state.etcd_config();
    wait_for_servers(dir, state, &rt, &etcd_config)?;
    // A pool or volume an earlier cluster of this folder made is kept as it
    // is (its data is in the chunk servers' folders): what is printed is
    // what is served, and a note says the settings given were not applied.
    let (spec, size_bytes, kept) = rt.block_on(async {
        let etcd = Etcd::connect(etcd_config.clone())
            .await
            .map_err(cluster_error)?;
        let mut kept = Vec::new();
        let spec = match ecdedup_cluster::get_pool(&etcd, pool).await {
            Ok(entry) => {
                let kept_spec = entry.record.spec;
                if effective(&kept_spec) != effective(spec) {
                    kept.push(format!(
                        "pool {pool}'s settings ({})",
                        describe_spec(&kept_spec)
                    ));
                }
                if servers < kept_spec.width() {
                    return Err(Error::Config(format!(
                        "pool {pool}, kept from an earlier cluster in this folder, is RS({},{}): \
                         it needs {} servers on distinct hosts; --servers {servers}",
                        kept_spec.k,
                        kept_spec.m,
                        kept_spec.width()
                    )));
                }
                kept_spec
            }
            Err(ecdedup_cluster::Error::PoolNotFound(_)) => {
                ecdedup_cluster::create_pool(&etcd, pool, spec)
                    .await
                    .map_err(cluster_error)?;
                spec.clone()
            }
            Err(e) => return Err(cluster_error(e)),
        };
        let size_bytes = match ecdedup_cluster::get_volume(&etcd, pool, volume).await {
            Ok(entry) => {
                if entry.record.size_bytes != size_bytes {
                    kept.push(format!("volume {pool}/{volume}'s size"));
                }
                entry.record.size_bytes
            }
            Err(ecdedup_cluster::Error::VolumeNotFound { .. }) => {
                ecdedup_cluster::create_volume(&etcd, pool, volume, size_bytes)
                    .await
                    .map_err(cluster_error)?;
                size_bytes
            }
            Err(e) => return Err(cluster_error(e)),
        };
        Ok::<_, Error>((spec, size_bytes, kept))
    })?;
    if let Some(threads) = threads {
        let pid = start_serve(dir, state, threads)?;
        state.serve_pid = Some(pid);
        save_state(dir, state)?;
        let socket = state.socket.clone();
        wait_for("the volume's NBD server", &dir.join("serve.log"), || {
            std::os::unix::net::UnixStream::connect(&socket).is_ok() || !alive(pid)
        })?;
        if !alive(pid) {
            let log = std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default();
            return Err(Error::Other(format!(
                "the volume's NBD server exited at start; serve.log:\n{log}"
            )));
        }
    }
    println!(
        "cluster up in {}: etcd {} (pid {}), {} chunk servers, pool {pool} RS({},{}) {:?}, volume {pool}/{volume} ({})",
        dir.display(),
        state.etcd,
        state.etcd_pid,
        servers,
        spec.k,
        spec.m,
        spec.policy,
        format_size(size_bytes)
    );
    if !kept.is_empty() {
        println!(
            "{} kept from an earlier cluster in this folder, not those given",
            kept.join(" and ")
        );
    }
    if threads.is_some() {
        println!("nbd+unix:///?socket={}", state.socket.display());
    }
    println!("etcd {}", state.etcd);
    if let Some(t) = &state.etcd_tls {
        println!(
            "etcd TLS: --etcd-ca {} --etcd-cert {} --etcd-key {}",
            t.ca.display(),
            t.cert.display(),
            t.key.display()
        );
    }
    Ok(())
}

fn status(dir: &Path, json: bool) -> Result<()> {
    let state = load_state(dir)?;
    let rt = runtime()?;
    let etcd_config = state.etcd_config();
    let report = rt.block_on(async {
        let etcd = Etcd::connect(etcd_config).await.map_err(cluster_error)?;
        let live = ecdedup_cluster::list_servers(&etcd).await.map_err(cluster_error)?;
        let pools = ecdedup_cluster::list_pools(&etcd).await.map_err(cluster_error)?;
        let coordinator = ecdedup_cluster::coordinator::current_coordinator(&etcd)
            .await
            .map_err(cluster_error)?;
        let rebuilds = ecdedup_cluster::coordinator::rebuild_status(&etcd)
            .await
            .map_err(cluster_error)?;
        let mut pool_rows = Vec::new();
        for (name, record) in pools {
            let pgs = ecdedup_cluster::pool_pgs(&etcd, &name).await.map_err(cluster_error)?;
            let volumes = ecdedup_cluster::list_volumes(&etcd, &name).await.map_err(cluster_error)?;
            let mut vols = Vec::new();
            for (vname, v) in volumes {
                let writer = ecdedup_cluster::current_writer(&etcd, v.record.id)
                    .await
                    .map_err(cluster_error)?;
                // Its dedup layers at the servers, summed over the live ones.
                let mut dedup = ecdedup_cluster::keys::VolumeDedup::default();
                for space in live.values().filter_map(|e| e.space.as_ref()) {
                    if let Some(d) = space.volumes.get(&v.record.id) {
                        dedup.chunks += d.chunks;
                        dedup.mapped_blocks += d.mapped_blocks;
                        dedup.slots_used += d.slots_used;
                        dedup.physical_writes += d.physical_writes;
                        dedup.reference_writes += d.reference_writes;
                        dedup.reference_parity_writes += d.reference_parity_writes;
                    }
                }
                vols.push(serde_json::json!({
                    "name": vname,
                    "id": v.record.id,
                    "size_bytes": v.record.size_bytes,
                    "writer": writer.map(|(epoch, w)| serde_json::json!({"address": w.address, "epoch": epoch})),
                    "dedup": (dedup.chunks > 0).then_some(dedup),
                }));
            }
            let pg_rows: Vec<serde_json::Value> = pgs
                .iter()
                .enumerate()
                .map(|(i, pg)| {
                    let down: Vec<u32> = pg
                        .servers
                        .iter()
                        .filter(|id| !live.contains_key(id))
                        .map(|id| id.0)
                        .collect();
                    // Below min_size writes fail with EIO while reads
                    // go on (k in service): said apart from degraded.
                    let serving = record.spec.width() - down.len() as u32;
                    let state = if down.is_empty() {
                        "active"
                    } else if serving < record.spec.k {
                        "unavailable"
                    } else if serving < record.spec.min_size() {
                        "read-only"
                    } else {
                        "degraded"
                    };
                    let (moves, progress) = rebuilds
                        .get(&(name.clone(), i as u32))
                        .cloned()
                        .unwrap_or_default();
                    serde_json::json!({
                        "pg": i,
                        "servers": pg.servers.iter().map(|s| s.0).collect::<Vec<_>>(),
                        "epoch": pg.epoch,
                        "down": down,
                        "state": state,
                        "rebuild": moves.map(|r| r.moves).unwrap_or_default(),
                        "rebuild_progress": progress
                            .iter()
                            .map(|(volume, p)| serde_json::json!({
                                "volume_id": volume,
                                "epoch": p.epoch,
                                "done": p.done,
                                "total": p.total,
                                "finished": p.finished,
                            }))
                            .collect::<Vec<_>>(),
                    })
                })
                .collect();
            pool_rows.push(serde_json::json!({
                "name": name,
                "k": record.spec.k,
                "m": record.spec.m,
                "policy": format!("{:?}", record.spec.policy),
                "min_size": record.spec.min_size(),
                "journal_bytes": record.spec.journal_bytes(),
                "pgs": pg_rows,
                "volumes": vols,
            }));
        }
        let servers: Vec<serde_json::Value> = state
            .servers
            .iter()
            .map(|s| {
                let entry = live.get(&ServerId(s.id));
                serde_json::json!({
                    "id": s.id,
                    "pid": s.pid,
                    "state": if entry.is_some() { "up" } else { "down" },
                    "address": entry.map(|e| e.info.address.clone()),
                    "features": entry.map(|e| e.info.features.clone()),
                    "dedup": entry.and_then(|e| e.space.as_ref()).map(|s| s.dedup.clone()),
                })
            })
            .collect();
        Ok::<_, Error>(serde_json::json!({
            "etcd": state.etcd,
            "servers": servers,
            "pools": pool_rows,
            "coordinator": coordinator.map(|(term, c)| serde_json::json!({
                "server": c.server.0,
                "address": c.address,
                "term": term,
            })),
            "nbd": format!("nbd+unix:///?socket={}", state.socket.display()),
            "serve_pid": state.serve_pid.filter(|p| alive(*p)),
        }))
    })?;
    if json {
        return print_out(&format!(
            "{}\n",
            serde_json::to_string_pretty(&report).expect("json")
        ));
    }
    let mut text = String::new();
    macro_rules! say {
        ($($arg:tt)*) => {{
            use std::fmt::Write as _;
            writeln!(text, $($arg)*).expect("a String takes it");
        }};
    }
    say!("etcd {}", report["etcd"].as_str().unwrap_or(""));
    match report["coordinator"].as_object() {
        Some(c) => say!("coordinator server {} term {}", c["server"], c["term"]),
        None => say!("coordinator none elected"),
    }
    for s in report["servers"].as_array().into_iter().flatten() {
        let features: Vec<&str> = s["features"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|f| f.as_str())
            .collect();
        let dedup = match s["dedup"].as_object() {
            Some(d) if d["layers_open"].as_u64().unwrap_or(0) > 0 => format!(
                "\tdedup layers {} refs {} (parity {}) slots {}",
                d["layers_open"],
                d["reference_writes"],
                d["reference_parity_writes"],
                d["physical_writes"]
            ),
            _ => String::new(),
        };
        say!(
            "server {}\t{}\tpid {}\t{}\tfeatures {}{dedup}",
            s["id"],
            s["state"].as_str().unwrap_or(""),
            s["pid"],
            s["address"].as_str().unwrap_or("-"),
            if features.is_empty() {
                "-".to_string()
            } else {
                features.join(",")
            }
        );
    }
    for p in report["pools"].as_array().into_iter().flatten() {
        say!(
            "pool {} RS({},{}) {} min_size {} journal {}",
            p["name"].as_str().unwrap_or(""),
            p["k"],
            p["m"],
            p["policy"].as_str().unwrap_or(""),
            p["min_size"],
            format_size(p["journal_bytes"].as_u64().unwrap_or(0))
        );
        for pg in p["pgs"].as_array().into_iter().flatten() {
            say!(
                "  pg {}\t{}\tepoch {}\tservers {}\tdown {}",
                pg["pg"],
                pg["state"].as_str().unwrap_or(""),
                pg["epoch"],
                pg["servers"],
                pg["down"]
            );
            for m in pg["rebuild"].as_array().into_iter().flatten() {
                say!(
                    "    rebuild shard {} from server {} to server {} (epoch {})",
                    m["shard"],
                    m["from"],
                    m["to"],
                    m["epoch"]
                );
            }
            for r in pg["rebuild_progress"].as_array().into_iter().flatten() {
                say!(
                    "    volume {} rebuilt {} of {} stripes{}",
                    r["volume_id"],
                    r["done"],
                    r["total"],
                    if r["finished"] == true {
                        ", finished"
                    } else {
                        ""
                    }
                );
            }
        }
        for v in p["volumes"].as_array().into_iter().flatten() {
            let dedup = match v["dedup"].as_object() {
                Some(d) => {
                    let n = |k: &str| d[k].as_u64().unwrap_or(0);
                    format!(
                        "\tdedup at servers: {} blocks in {} slots ({:.2}x) over {} chunks, refs {} (parity {})",
                        n("mapped_blocks"),
                        n("slots_used"),
                        n("mapped_blocks") as f64 / n("slots_used").max(1) as f64,
                        n("chunks"),
                        n("reference_writes"),
                        n("reference_parity_writes")
                    )
                }
                None => String::new(),
            };
            say!(
                "  volume {}\tid {}\t{}\twriter {}{dedup}",
                v["name"].as_str().unwrap_or(""),
                v["id"],
                format_size(v["size_bytes"].as_u64().unwrap_or(0)),
                v["writer"]
            );
        }
    }
    // The URI only while the NBD server `cluster up` started runs (after
    // a take-over by another `serve`, its socket serves nothing).
    match report["serve_pid"].as_u64() {
        Some(pid) => say!("{} (serve pid {pid})", report["nbd"].as_str().unwrap_or("")),
        None => say!("no NBD server of this cluster runs (`cluster up` starts one; `serve --cluster` serves any volume)"),
    }
    print_out(&text)
}
