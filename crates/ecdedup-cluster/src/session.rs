//! A connection to an etcd cluster that fails over between endpoints.
//!
//! [`Etcd::connect`] tries the endpoints in the order given and keeps the
//! first that answers a status request, so a dead endpoint listed first
//! costs one refused connection (or `connect_timeout`), not an error. The
//! long-lived users (the lease keeper, the watch layer) call
//! [`Etcd::reconnect`] when their stream breaks: it tries the current
//! endpoint again and then the others, in order. One-shot requests
//! (pool, volume and writer operations) return the error instead: the
//! caller decides to retry, after a `reconnect`.
//!
//! Over TLS ([`EtcdTls`]), the files are read and checked once, at
//! [`Etcd::connect`], before any endpoint is tried; every connection after
//! (a reconnect) uses what was loaded then.

use crate::error::{Error, Result};
use crate::keys::Keys;
use crate::tls::EtcdTls;
use etcd_client::{Client, ConnectOptions, TlsOptions};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Interval of HTTP/2 pings on an idle connection.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(5);
/// A ping unanswered this long breaks the connection.
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// How to reach a cluster.
#[derive(Clone, Debug)]
pub struct EtcdConfig {
    /// `http://host:port` (or `https://` with [`EtcdConfig::tls`]) URLs of
    /// the etcd members; tried in this order.
    pub endpoints: Vec<String>,
    /// TLS to etcd: a CA, and a client certificate and key (default none:
    /// plain HTTP).
    pub tls: EtcdTls,
    /// The cluster's name: its keys live under `/ecdedup/<cluster>/`.
    pub cluster: String,
    /// Longest wait for a TCP connection to one endpoint.
    pub connect_timeout: Duration,
    /// Longest wait for one request's answer.
    pub request_timeout: Duration,
}

impl EtcdConfig {
    /// The defaults: plain HTTP, 2 s to connect, 10 s per request.
    pub fn new(endpoints: Vec<String>, cluster: &str) -> EtcdConfig {
        EtcdConfig {
            endpoints,
            tls: EtcdTls::default(),
            cluster: cluster.to_string(),
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(10),
        }
    }

    /// The same, over TLS as `tls` says.
    pub fn with_tls(mut self, tls: EtcdTls) -> EtcdConfig {
        self.tls = tls;
        self
    }
}

/// A live connection: cheap to clone (clones share the current endpoint).
#[derive(Clone)]
pub struct Etcd {
    config: Arc<EtcdConfig>,
    /// The TLS files as loaded at connect (None: plain HTTP).
    tls: Option<TlsOptions>,
    keys: Keys,
    current: Arc<Mutex<(usize, Client)>>,
}

impl std::fmt::Debug for Etcd {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.debug_struct("Etcd")
            .field("endpoint", &self.endpoint())
            .field("prefix", &self.keys.prefix())
            .finish()
    }
}

impl Etcd {
    /// Connects to the first endpoint (in order) that answers.
    pub async fn connect(config: EtcdConfig) -> Result<Etcd> {
        let keys = Keys::new(&config.cluster)?;
        if config.endpoints.is_empty() {
            return Err(Error::invalid("etcd endpoints", "the list is empty"));
        }
        let tls = config.tls.load(&config.endpoints)?;
        let per_endpoint = config.connect_timeout + config.request_timeout;
        let (index, client) = first_live(&config, tls.as_ref(), 0, per_endpoint).await?;
        Ok(Etcd {
            config: Arc::new(config),
            tls,
            keys,
            current: Arc::new(Mutex::new((index, client))),
        })
    }

    /// The cluster's key layout.
    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// The endpoint in use.
    pub fn endpoint(&self) -> String {
        let index = self.lock().0;
        self.config.endpoints[index].clone()
    }

    /// A client on the endpoint in use (a clone: clients are handles).
    pub fn client(&self) -> Client {
        self.lock().1.clone()
    }

    /// Finds a live endpoint again, starting with the one in use, and makes
    /// it current for every clone of this connection.
    pub async fn reconnect(&self) -> Result<()> {
        let per_endpoint = self.config.connect_timeout + self.config.request_timeout;
        self.reconnect_within(Failover::SameFirst, per_endpoint)
            .await
    }

    /// As [`Etcd::reconnect`], for a caller with a deadline of its own (the
    /// lease keeper): each endpoint gets at most `per_endpoint` to connect
    /// and answer, and [`Failover::OthersFirst`] leaves the endpoint in use
    /// for last: one that accepts connections but no longer answers (a
    /// stopped or partitioned member) would otherwise take the whole wait.
    pub async fn reconnect_within(&self, order: Failover, per_endpoint: Duration) -> Result<()> {
        let current = self.lock().0;
        let start = match order {
            Failover::SameFirst => current,
            Failover::OthersFirst => (current + 1) % self.config.endpoints.len(),
        };
        let found = first_live(&self.config, self.tls.as_ref(), start, per_endpoint).await?;
        *self.lock() = found;
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (usize, Client)> {
        // The guarded pair is replaced whole; a panic elsewhere cannot leave
        // it half-written, so a poisoned lock still holds a valid pair.
        self.current.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Which endpoint a reconnect tries first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failover {
    /// The endpoint in use, then the others in order (a broken stream on a
    /// member that may well be alive).
    SameFirst,
    /// The others in order, the endpoint in use last (it stopped answering).
    OthersFirst,
}

/// The first endpoint from `start` (wrapping around) that answers a status
/// request within `per_endpoint`, with its index.
async fn first_live(
    config: &EtcdConfig,
    tls: Option<&TlsOptions>,
    start: usize,
    per_endpoint: Duration,
) -> Result<(usize, Client)> {
    let count = config.endpoints.len();
    let mut last = String::new();
    for step in 0..count {
        let index = (start + step) % count;
        let endpoint = &config.endpoints[index];
        let mut options = ConnectOptions::new()
            .with_connect_timeout(config.connect_timeout)
            .with_timeout(config.request_timeout)
            // HTTP/2 pings: a watch or keep-alive stream on a silently dead
            // endpoint breaks instead of waiting forever.
            .with_keep_alive(KEEP_ALIVE_INTERVAL, KEEP_ALIVE_TIMEOUT)
            .with_keep_alive_while_idle(true);
        if let Some(tls) = tls {
            options = options.with_tls(tls.clone());
        }
        let attempt = async {
            let mut client = Client::connect([endpoint.as_str()], Some(options)).await?;
            client.status().await?;
            Ok::<Client, etcd_client::Error>(client)
        };
        match tokio::time::timeout(per_endpoint, attempt).await {
            Ok(Ok(client)) => return Ok((index, client)),
            Ok(Err(e)) => last = format!("{endpoint}: {}", with_causes(&e)),
            Err(_) => last = format!("{endpoint}: no answer in time"),
        }
    }
    if tls.is_some() && config.tls.cert.is_none() {
        last.push_str(
            " (no client certificate was given: an etcd started with --client-cert-auth \
             refuses the connection; --etcd-cert and --etcd-key)",
        );
    }
    Err(Error::NoEndpoint {
        endpoints: config.endpoints.join(", "),
        last,
    })
}

/// An error and its causes, `: `-separated (a TLS refusal is only named
/// deep in the chain: "transport error" alone says nothing).
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text
}
