//! The server side: an accept loop, and per connection the handshake, then
//! a reader that hands each request to a [`Handler`] in a task of its own
//! and a writer that sends each reply as soon as it is ready (replies leave
//! in the order they complete, not the order of the requests).
//!
//! At most [`ServerConfig::in_flight_max`] requests of one connection are
//! being handled at once; past that the reader stops reading, and TCP's
//! window pushes back on the client. A frame that fails a check, a reply
//! sent as a request, or a `Hello` after the handshake closes that
//! connection with a logged reason; the other connections go on. A peer
//! that closes cleanly still gets the replies it is owed.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ecdedup_core::proto::{FrameError, Header, Op, Status, PAYLOAD_BYTES_MAX};
use tokio::io::{AsyncRead, AsyncWrite, BufReader};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::{JoinHandle, JoinSet};

use crate::{handshake, log, wire, ClusterKey, Error};

/// What serves the requests: the chunk store, in a chunk server. The
/// transport gives it each request's header and payload and sends back
/// the status and payload it returns, under the request's id.
pub trait Handler: Send + Sync + 'static {
    fn handle(
        &self,
        request: Header,
        payload: Vec<u8>,
    ) -> impl Future<Output = (Status, Vec<u8>)> + Send;
}

#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The longest a new connection may take to prove the cluster key.
    pub handshake_timeout: Duration,
    /// Requests of one connection handled at once.
    pub in_flight_max: usize,
}

impl Default for ServerConfig {
    fn default() -> ServerConfig {
        ServerConfig {
            handshake_timeout: Duration::from_secs(10),
            in_flight_max: 128,
        }
    }
}

/// Counts of what the server saw, for its status and for tests.
#[derive(Debug, Default)]
pub struct ServerStats {
    pub connections_accepted: AtomicU64,
    /// Connections dropped because the peer did not prove the key (or
    /// broke the handshake, or let it time out).
    pub handshakes_refused: AtomicU64,
    /// Connections closed because a frame failed a check.
    pub frames_refused: AtomicU64,
    pub requests_handled: AtomicU64,
}

impl ServerStats {
    fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// A listening server; dropping it stops the accept loop and closes every
/// connection (requests being handled run to their end; their replies are
/// dropped).
pub struct Server {
    local_addr: SocketAddr,
    stats: Arc<ServerStats>,
    accept: JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl Server {
    /// Listens on `addr` (port 0: any free port, see [`Server::local_addr`])
    /// and serves every connection that proves `key` with `handler`.
    pub async fn bind<H: Handler>(
        addr: SocketAddr,
        key: ClusterKey,
        handler: Arc<H>,
        config: ServerConfig,
    ) -> Result<Server, Error> {
        let bind_error = |source| Error::Bind {
            addr: addr.to_string(),
            source,
        };
        let listener = TcpListener::bind(addr).await.map_err(bind_error)?;
        let local_addr = listener.local_addr().map_err(bind_error)?;
        let stats = Arc::new(ServerStats::default());
        let accept = tokio::spawn(accept_loop(
            listener,
            Arc::new(key),
            handler,
            config,
            stats.clone(),
        ));
        Ok(Server {
            local_addr,
            stats,
            accept,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn stats(&self) -> &ServerStats {
        &self.stats
    }
}

/// A pause after a failed accept (out of file descriptors: let some close).
const ACCEPT_RETRY_DELAY: Duration = Duration::from_millis(100);

async fn accept_loop<H: Handler>(
    listener: TcpListener,
    key: Arc<ClusterKey>,
    handler: Arc<H>,
    config: ServerConfig,
    stats: Arc<ServerStats>,
) {
    // Owning the connections' tasks here means that stopping this loop
    // stops them all.
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    ServerStats::bump(&stats.connections_accepted);
                    let _ = stream.set_nodelay(true);
                    connections.spawn(serve_connection(
                        stream,
                        peer.to_string(),
                        key.clone(),
                        handler.clone(),
                        config.clone(),
                        stats.clone(),
                    ));
                }
                Err(e) => {
                    log::event("accept_failed", &listener_name(&listener), &e);
                    tokio::time::sleep(ACCEPT_RETRY_DELAY).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

fn listener_name(listener: &TcpListener) -> String {
    listener
        .local_addr()
        .map_or_else(|_| "-".into(), |a| a.to_string())
}

/// How a connection's reader stopped.
enum Ended {
    /// The peer closed its side between frames.
    Cleanly,
    /// A frame failed a check, or broke the protocol.
    Refused(String),
    /// The stream failed, or ended inside a frame.
    Lost(String),
}

/// Serves one connection: the handshake, then requests until the peer
/// closes or breaks the protocol. Public so that tests can drive it over
/// an in-memory stream.
pub async fn serve_connection<S, H>(
    mut stream: S,
    peer: String,
    key: Arc<ClusterKey>,
    handler: Arc<H>,
    config: ServerConfig,
    stats: Arc<ServerStats>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Handler,
{
    if let Err(reason) = handshake::server(&mut stream, &key, config.handshake_timeout).await {
        ServerStats::bump(&stats.handshakes_refused);
        log::event("handshake_refused", &peer, &reason);
        return;
    }
    let in_flight_max = config.in_flight_max.max(1);
    let (r, w) = tokio::io::split(stream);
    let (replies, mut queued) = mpsc::channel(in_flight_max);
    let slots = Arc::new(Semaphore::new(in_flight_max));
    let reader = read_requests(BufReader::new(r), replies, slots, handler, stats.clone());
    let writer = wire::write_queued(w, &mut queued);
    tokio::pin!(writer);
    let ended = tokio::select! {
        ended = reader => ended,
        written = &mut writer => Ended::Lost(match written {
            Ok(()) => "the reply queue closed".into(),
            Err(e) => format!("writing a reply: {e}"),
        }),
    };
    match ended {
        Ended::Cleanly => {
            // The reader's end of the queue is gone; the writer ends once
            // every request being handled has queued its reply.
            if let Err(e) = writer.await {
                log::event("connection_lost", &peer, &format!("writing a reply: {e}"));
            }
        }
        Ended::Refused(reason) => {
            ServerStats::bump(&stats.frames_refused);
            log::event("connection_refused", &peer, &reason);
        }
        Ended::Lost(reason) => log::event("connection_lost", &peer, &reason),
    }
}

async fn read_requests<R, H>(
    mut r: R,
    replies: mpsc::Sender<wire::Queued>,
    slots: Arc<Semaphore>,
    handler: Arc<H>,
    stats: Arc<ServerStats>,
) -> Ended
where
    R: AsyncRead + Unpin,
    H: Handler,
{
    loop {
        // Taken before the next frame is read: with every slot busy the
        // reader waits, and the client's sends back up.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return Ended::Lost("the request slots closed".into());
        };
        let mut payload = Vec::new();
        let request = match wire::read_frame(&mut r, &mut payload).await {
            Ok(Some(header)) => header,
            Ok(None) => return Ended::Cleanly,
            Err(e @ (FrameError::Io(_) | FrameError::Truncated { .. })) => {
                return Ended::Lost(e.to_string())
            }
            Err(e) => return Ended::Refused(e.to_string()),
        };
        if request.is_reply() || request.op == Op::Hello {
            return Ended::Refused(format!(
                "a {:?} {} after the handshake",
                request.op,
                if request.is_reply() {
                    "reply"
                } else {
                    "request"
                }
            ));
        }
        let handler = handler.clone();
        let replies = replies.clone();
        let stats = stats.clone();
        tokio::spawn(async move {
            // The handler runs in a task of its own, so that a panic in it
            // (a bug) fails its request with `Io` at once instead of
            // leaving the caller to its timeout; the connection goes on.
            let handled = tokio::spawn(async move { handler.handle(request, payload).await }).await;
            let (mut status, mut payload) = match handled {
                Ok(reply) => reply,
                Err(e) => {
                    log::event(
                        "handler_failed",
                        &request.request_id,
                        &format!("a {:?}: {e}; replying Io", request.op),
                    );
                    (Status::Io, Vec::new())
                }
            };
            if payload.len() > PAYLOAD_BYTES_MAX as usize {
                log::event(
                    "reply_too_large",
                    &request.request_id,
                    &format!(
                        "the handler returned {} bytes for a {:?}; replying Io",
                        payload.len(),
                        request.op
                    ),
                );
                status = Status::Io;
                payload = Vec::new();
            }
            ServerStats::bump(&stats.requests_handled);
            let _ = replies
                .send((request.reply(status, &payload), payload))
                .await;
            drop(slot);
        });
    }
}
