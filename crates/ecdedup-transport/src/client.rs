//! The client side of a connection: many requests in flight, replies
//! matched by request id and completed in whatever order they come.
//!
//! A [`Client`] owns one authenticated connection and one task that reads
//! replies and writes queued requests. A call takes a slot (at most
//! [`ClientConfig::in_flight_max`] requests wait for replies at once: the
//! caller past that waits, which is the backpressure), picks the next
//! request id, files a completion under it in the pending map, queues the
//! frame, and waits for the reply that carries its id. When the connection
//! ends, for any reason, every pending request fails with
//! [`Error::ConnectionClosed`] and the reason, and so does every later call:
//! nothing waits on a connection that is gone. A call that gives up (its
//! timeout, or its future dropped) removes its entry; a late reply to it is
//! dropped.
//!
//! [`Peers`] keeps one connection per peer address and hands out clones of
//! it, connecting again only once the old one has closed.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ecdedup_core::proto::frame::{FLAGS_KNOWN, FLAG_REPLY};
use ecdedup_core::proto::{Header, Op, PAYLOAD_BYTES_MAX};
use tokio::io::{AsyncRead, AsyncWrite, BufReader};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::task::AbortHandle;

use crate::{handshake, log, wire, ClusterKey, Error};

#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Requests one connection may have waiting for replies.
    pub in_flight_max: usize,
    /// The longest the connect and the handshake may take together.
    pub handshake_timeout: Duration,
    /// The longest a request waits for its reply.
    pub request_timeout: Duration,
    /// A **simulated** network round trip added to every request: its
    /// reply is handed to the caller this long after it came. Requests in
    /// flight together wait out their delays together, so each round trip
    /// of the caller costs it once, as a longer wire would. For benchmarks
    /// on one host (the kernel here has no netem: issue 20);
    /// `ECDEDUP_SIMULATED_RTT_US` sets it ([`simulated_rtt_from_env`]).
    pub simulated_rtt: Option<Duration>,
}

impl Default for ClientConfig {
    fn default() -> ClientConfig {
        ClientConfig {
            in_flight_max: 128,
            handshake_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(60),
            simulated_rtt: simulated_rtt_from_env(),
        }
    }
}

/// The environment variable that sets [`ClientConfig::simulated_rtt`], in
/// microseconds.
pub const SIMULATED_RTT_ENV: &str = "ECDEDUP_SIMULATED_RTT_US";

/// [`SIMULATED_RTT_ENV`] read and logged once per process (the line says
/// the figures are of a simulated network); unset, 0 or not a number: none
/// (a value that is not a number is logged as ignored).
pub fn simulated_rtt_from_env() -> Option<Duration> {
    static RTT: std::sync::OnceLock<Option<Duration>> = std::sync::OnceLock::new();
    *RTT.get_or_init(|| {
        let raw = std::env::var(SIMULATED_RTT_ENV).ok()?;
        match parse_simulated_rtt(&raw) {
            Ok(rtt) => {
                if let Some(d) = rtt {
                    log::line(
                        "ecdedup-transport",
                        "simulated-rtt",
                        &[
                            ("us", &d.as_micros()),
                            ("note", &"every reply delayed: simulated network"),
                        ],
                    );
                }
                rtt
            }
            Err(reason) => {
                log::line(
                    "ecdedup-transport",
                    "simulated-rtt-ignored",
                    &[("value", &raw), ("reason", &reason)],
                );
                None
            }
        }
    })
}

/// A simulated round trip in microseconds: `Ok(None)` for 0.
pub fn parse_simulated_rtt(raw: &str) -> Result<Option<Duration>, String> {
    let us: u64 = raw.trim().parse().map_err(|_| {
        format!("{SIMULATED_RTT_ENV}={raw:?} is not a whole number of microseconds")
    })?;
    if us > 10_000_000 {
        return Err(format!("{SIMULATED_RTT_ENV}={us} is over 10 s"));
    }
    Ok((us > 0).then(|| Duration::from_micros(us)))
}

/// A reply: its header (status, echoed fields) and payload.
#[derive(Debug)]
pub struct Reply {
    pub header: Header,
    pub payload: Vec<u8>,
}

type Completion = oneshot::Sender<Result<Reply, Error>>;

struct State {
    pending: HashMap<u64, Completion>,
    /// Why the connection ended, once it has.
    closed: Option<String>,
}

/// What the caller side and the connection's task share.
struct Shared {
    peer: String,
    state: Mutex<State>,
    slots: Semaphore,
    next_request_id: AtomicU64,
    request_timeout: Duration,
    simulated_rtt: Option<Duration>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn closed_error(&self, reason: &str) -> Error {
        Error::ConnectionClosed {
            peer: self.peer.clone(),
            reason: reason.to_string(),
        }
    }

    /// The error of a call on this connection once it has ended.
    fn closed_now(&self) -> Error {
        let reason = self.state().closed.clone();
        self.closed_error(reason.as_deref().unwrap_or("the connection ended"))
    }

    /// Ends the connection: fails every pending request and every caller
    /// waiting for a slot. False if it had ended already.
    fn close(&self, reason: &str) -> bool {
        let pending = {
            let mut state = self.state();
            if state.closed.is_some() {
                return false;
            }
            state.closed = Some(reason.to_string());
            std::mem::take(&mut state.pending)
        };
        self.slots.close();
        for (_, completion) in pending {
            let _ = completion.send(Err(self.closed_error(reason)));
        }
        true
    }

    fn complete(&self, header: Header, payload: Vec<u8>) {
        let completion = self.state().pending.remove(&header.request_id);
        if let Some(completion) = completion {
            let _ = completion.send(Ok(Reply { header, payload }));
        }
    }
}

/// Removes a call's pending entry however the call ends.
struct PendingEntry<'a> {
    shared: &'a Shared,
    request_id: u64,
}

impl Drop for PendingEntry<'_> {
    fn drop(&mut self) {
        self.shared.state().pending.remove(&self.request_id);
    }
}

/// The connection behind every clone of a [`Client`]; dropping the last
/// clone ends it.
struct Connection {
    shared: Arc<Shared>,
    queue: mpsc::Sender<wire::Queued>,
    task: AbortHandle,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.task.abort();
        self.shared.close("the client was dropped");
    }
}

/// One authenticated connection to a peer; cheap to clone (clones share
/// the connection).
#[derive(Clone)]
pub struct Client {
    connection: Arc<Connection>,
}

impl Client {
    /// Connects to `addr` and proves the cluster key (checking the
    /// server's proof).
    pub async fn connect(
        addr: SocketAddr,
        key: &ClusterKey,
        config: &ClientConfig,
    ) -> Result<Client, Error> {
        let peer = addr.to_string();
        let stream = tokio::time::timeout(config.handshake_timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| Error::Connect {
                peer: peer.clone(),
                source: std::io::ErrorKind::TimedOut.into(),
            })?
            .map_err(|source| Error::Connect {
                peer: peer.clone(),
                source,
            })?;
        // Small frames go out at once (the queue already batches them).
        let _ = stream.set_nodelay(true);
        let mut stream = stream;
        handshake::client(&mut stream, key, &peer, config.handshake_timeout).await?;
        Ok(Client::over(stream, peer, config))
    }

    /// A client over a stream whose handshake is done (tests use in-memory
    /// streams). Starts the connection's task on the current runtime.
    pub fn over<S>(stream: S, peer: String, config: &ClientConfig) -> Client
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let in_flight_max = config.in_flight_max.max(1);
        let shared = Arc::new(Shared {
            peer,
            state: Mutex::new(State {
                pending: HashMap::new(),
                closed: None,
            }),
            slots: Semaphore::new(in_flight_max),
            next_request_id: AtomicU64::new(0),
            request_timeout: config.request_timeout,
            simulated_rtt: config.simulated_rtt,
        });
        let (queue, queued) = mpsc::channel(in_flight_max);
        let task = tokio::spawn(run(stream, shared.clone(), queued)).abort_handle();
        Client {
            connection: Arc::new(Connection {
                shared,
                queue,
                task,
            }),
        }
    }

    pub fn peer(&self) -> &str {
        &self.connection.shared.peer
    }

    /// Whether the connection has ended (every call now fails).
    pub fn is_closed(&self) -> bool {
        self.connection.shared.state().closed.is_some()
    }

    /// Sends a request and waits for its reply. `request` gives the op,
    /// flags (any but [`FLAG_REPLY`]), volume, epoch, PG, offset and length;
    /// the request id, payload length and CRC are filled in here. A reply
    /// with an error status is a reply (`Ok`): what it means is the
    /// caller's business.
    pub async fn call(&self, request: &Header, payload: Vec<u8>) -> Result<Reply, Error> {
        if request.op == Op::Hello {
            return Err(Error::InvalidRequest(
                "Hello frames belong to the handshake".into(),
            ));
        }
        if request.flags & (FLAG_REPLY | !FLAGS_KNOWN) != 0 {
            return Err(Error::InvalidRequest(format!(
                "flags {:#06x} (a request carries no reply flag, and only known ones)",
                request.flags
            )));
        }
        if payload.len() > PAYLOAD_BYTES_MAX as usize {
            return Err(Error::InvalidRequest(format!(
                "payload of {} bytes (a frame carries at most {PAYLOAD_BYTES_MAX})",
                payload.len()
            )));
        }
        let shared = &*self.connection.shared;
        let _slot = shared
            .slots
            .acquire()
            .await
            .map_err(|_| shared.closed_now())?;
        let request_id = shared.next_request_id.fetch_add(1, Ordering::Relaxed);
        let header = Header {
            flags: request.flags,
            volume_id: request.volume_id,
            epoch: request.epoch,
            pg: request.pg,
            pg_epoch: request.pg_epoch,
            offset: request.offset,
            length: request.length,
            ..Header::request(request.op, request_id, &payload)
        };
        let (completion, reply) = oneshot::channel();
        {
            let mut state = shared.state();
            if let Some(reason) = &state.closed {
                return Err(shared.closed_error(reason));
            }
            state.pending.insert(request_id, completion);
        }
        let _entry = PendingEntry { shared, request_id };
        if self.connection.queue.send((header, payload)).await.is_err() {
            return Err(shared.closed_now());
        }
        match tokio::time::timeout(shared.request_timeout, reply).await {
            Ok(Ok(outcome)) => {
                if let Some(rtt) = shared.simulated_rtt {
                    delay_line::wait(rtt).await;
                }
                outcome
            }
            Ok(Err(_)) => Err(shared.closed_now()),
            Err(_) => Err(Error::Timeout {
                peer: shared.peer.clone(),
                request_id,
                after: shared.request_timeout,
            }),
        }
    }
}

/// The connection's task: reads replies and writes queued requests until
/// either side fails, then closes the connection with the reason.
async fn run<S>(stream: S, shared: Arc<Shared>, mut queued: mpsc::Receiver<wire::Queued>)
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (r, w) = tokio::io::split(stream);
    let reason = tokio::select! {
        reason = read_replies(BufReader::new(r), &shared) => reason,
        written = wire::write_queued(w, &mut queued) => match written {
            Ok(()) => "the client was dropped".to_string(),
            Err(e) => format!("writing to the server: {e}"),
        },
    };
    if shared.close(&reason) {
        log::event("connection_closed", &shared.peer, &reason);
    }
}

async fn read_replies<R: AsyncRead + Unpin>(mut r: R, shared: &Shared) -> String {
    loop {
        let mut payload = Vec::new();
        match wire::read_frame(&mut r, &mut payload).await {
            Ok(Some(header)) if header.is_reply() && header.op != Op::Hello => {
                shared.complete(header, payload)
            }
            Ok(Some(header)) => {
                return format!(
                    "the server sent a {:?} {} after the handshake",
                    header.op,
                    if header.is_reply() {
                        "reply"
                    } else {
                        "request"
                    }
                )
            }
            Ok(None) => return "the server closed the connection".into(),
            Err(e) => return format!("refused a frame from the server: {e}"),
        }
    }
}

/// One connection per peer, shared by every caller and reused until it
/// closes.
pub struct Peers {
    key: ClusterKey,
    config: ClientConfig,
    connections: Mutex<HashMap<SocketAddr, Arc<tokio::sync::Mutex<Option<Client>>>>>,
}

impl Peers {
    pub fn new(key: ClusterKey, config: ClientConfig) -> Peers {
        Peers {
            key,
            config,
            connections: Mutex::new(HashMap::new()),
        }
    }

    /// The open connection to `addr`, or a new one if there is none (or
    /// the last one closed). Callers of one peer wait for one connect;
    /// callers of different peers do not wait for each other.
    pub async fn get(&self, addr: SocketAddr) -> Result<Client, Error> {
        let slot = self
            .connections
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(addr)
            .or_default()
            .clone();
        let mut slot = slot.lock().await;
        if let Some(client) = slot.as_ref().filter(|c| !c.is_closed()) {
            return Ok(client.clone());
        }
        let client = Client::connect(addr, &self.key, &self.config).await?;
        *slot = Some(client.clone());
        Ok(client)
    }
}

/// The simulated round trip's timer: tokio's timer ticks in milliseconds,
/// far coarser than the 100 to 400 us delays it models, so one thread
/// keeps the deadlines in a heap and wakes each waiter when its deadline
/// passes (`recv_timeout`, the kernel's high-resolution timer: tens of
/// microseconds late at most on an idle host).
mod delay_line {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
    use std::sync::{Mutex, OnceLock};
    use std::time::{Duration, Instant};
    use tokio::sync::oneshot;

    struct Due(Instant, u64, oneshot::Sender<()>);

    impl PartialEq for Due {
        fn eq(&self, other: &Due) -> bool {
            (self.0, self.1) == (other.0, other.1)
        }
    }
    impl Eq for Due {}
    impl PartialOrd for Due {
        fn partial_cmp(&self, other: &Due) -> Option<std::cmp::Ordering> {
            Some(self.cmp(other))
        }
    }
    impl Ord for Due {
        fn cmp(&self, other: &Due) -> std::cmp::Ordering {
            (self.0, self.1).cmp(&(other.0, other.1))
        }
    }

    /// A deadline and who waits for it.
    type Request = (Instant, oneshot::Sender<()>);

    fn line() -> &'static Mutex<Sender<Request>> {
        static LINE: OnceLock<Mutex<Sender<Request>>> = OnceLock::new();
        LINE.get_or_init(|| {
            let (tx, rx) = channel::<Request>();
            std::thread::Builder::new()
                .name("ecdedup-simulated-rtt".into())
                .spawn(move || {
                    let mut due: BinaryHeap<Reverse<Due>> = BinaryHeap::new();
                    let mut seq = 0u64;
                    loop {
                        let now = Instant::now();
                        while due.peek().is_some_and(|Reverse(d)| d.0 <= now) {
                            let Reverse(Due(_, _, waiter)) = due.pop().unwrap();
                            let _ = waiter.send(());
                        }
                        let next = match due.peek() {
                            Some(Reverse(d)) => rx.recv_timeout(d.0 - now),
                            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
                        };
                        match next {
                            Ok((at, waiter)) => {
                                seq += 1;
                                due.push(Reverse(Due(at, seq, waiter)));
                            }
                            Err(RecvTimeoutError::Timeout) => {}
                            Err(RecvTimeoutError::Disconnected) => return,
                        }
                    }
                })
                .expect("spawning the simulated-rtt thread");
            Mutex::new(tx)
        })
    }

    /// Resolves `rtt` from now (at once if the timer thread is gone).
    pub(super) async fn wait(rtt: Duration) {
        let (tx, rx) = oneshot::channel();
        let sent = line()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send((Instant::now() + rtt, tx));
        if sent.is_ok() {
            let _ = rx.await;
        }
    }
}
