//! The transport on loopback: a server on 127.0.0.1 port 0 (a free port of
//! its own per test) and clients, each test a story of one connection's
//! life. No timing assertions: every wait is a poll with a generous
//! deadline.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ecdedup_core::proto::{Header, Op, Status, HEADER_BYTES, PAYLOAD_BYTES_MAX};
use ecdedup_transport::{
    handshake, wire, Client, ClientConfig, ClusterKey, Error, Handler, Peers, Server, ServerConfig,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

/// Long enough for a loaded 2-core machine; reached only by a failure.
const DEADLINE: Duration = Duration::from_secs(30);

/// Writes echo their payload; reads answer `length` bytes of the offset's
/// low byte; flushes wait until the test opens the gate.
struct Store {
    gate: Semaphore,
    held: AtomicUsize,
}

impl Default for Store {
    fn default() -> Store {
        Store {
            gate: Semaphore::new(0),
            held: AtomicUsize::new(0),
        }
    }
}

impl Handler for Store {
    async fn handle(&self, request: Header, payload: Vec<u8>) -> (Status, Vec<u8>) {
        match request.op {
            Op::Write => (Status::Ok, payload),
            Op::Read => (
                Status::Ok,
                vec![request.offset as u8; request.length as usize],
            ),
            Op::Flush => {
                self.held.fetch_add(1, Ordering::SeqCst);
                let _ = self.gate.acquire().await.map(|p| p.forget());
                self.held.fetch_sub(1, Ordering::SeqCst);
                (Status::Ok, Vec::new())
            }
            // A handler bug: the transport must fail this request alone.
            Op::Replay => panic!("planted handler panic"),
            _ => (Status::Invalid, Vec::new()),
        }
    }
}

fn key(byte: u8) -> ClusterKey {
    ClusterKey::from_bytes(&[byte; 32]).unwrap()
}

async fn serve(key: ClusterKey, config: ServerConfig) -> (Server, Arc<Store>) {
    let store = Arc::new(Store::default());
    let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let server = Server::bind(addr, key, store.clone(), config)
        .await
        .unwrap();
    (server, store)
}

async fn wait_for(what: &str, done: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "waited {DEADLINE:?} for {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn write(offset: u64, payload: &[u8]) -> (Header, Vec<u8>) {
    let mut h = Header::request(Op::Write, 0, payload);
    h.offset = offset;
    (h, payload.to_vec())
}

fn flush() -> Header {
    Header::request(Op::Flush, 0, &[])
}

/// A write that must come back as itself.
async fn round_trip(client: &Client, offset: u64) {
    let data = format!("block at {offset}").into_bytes();
    let (h, p) = write(offset, &data);
    let reply = tokio::time::timeout(DEADLINE, client.call(&h, p))
        .await
        .expect("a reply in time")
        .expect("a reply");
    assert_eq!(reply.header.status, Status::Ok);
    assert_eq!(reply.header.offset, offset);
    assert_eq!(reply.payload, data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_with_the_cluster_key_is_served() {
    let (server, _) = serve(key(1), ServerConfig::default()).await;
    let client = Client::connect(server.local_addr(), &key(1), &ClientConfig::default())
        .await
        .unwrap();
    round_trip(&client, 7).await;
    let mut read = Header::request(Op::Read, 0, &[]);
    read.offset = 3;
    read.length = 4096;
    let reply = client.call(&read, Vec::new()).await.unwrap();
    assert_eq!(reply.payload, vec![3u8; 4096]);
    assert_eq!(server.stats().handshakes_refused.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_with_another_key_is_refused_and_so_is_a_server_with_another_key() {
    let (server, _) = serve(key(1), ServerConfig::default()).await;
    // The client checks the server's proof first: it fails under key 2.
    let err = Client::connect(server.local_addr(), &key(2), &ClientConfig::default())
        .await
        .err()
        .expect("refused");
    assert!(
        matches!(&err, Error::Handshake { reason, .. } if reason.contains("did not prove the cluster key")),
        "{err}"
    );
    // The server, left mid-handshake, drops the peer and counts it.
    wait_for("the refused handshake to be counted", || {
        server.stats().handshakes_refused.load(Ordering::SeqCst) == 1
    })
    .await;
}

/// A peer that skips checking the server's proof and answers the
/// challenge without the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_cannot_prove_the_key_is_told_and_dropped() {
    let (server, _) = serve(key(1), ServerConfig::default()).await;
    let mut raw = TcpStream::connect(server.local_addr()).await.unwrap();
    let nonce = [9u8; handshake::NONCE_BYTES];
    wire::write_frame(&mut raw, &Header::request(Op::Hello, 0, &nonce), &nonce)
        .await
        .unwrap();
    let mut payload = Vec::new();
    let challenge = wire::read_frame(&mut raw, &mut payload)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((challenge.op, challenge.status), (Op::Hello, Status::Ok));
    let guess = [0u8; handshake::PROOF_BYTES];
    wire::write_frame(&mut raw, &Header::request(Op::Hello, 1, &guess), &guess)
        .await
        .unwrap();
    let verdict = wire::read_frame(&mut raw, &mut payload)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(verdict.status, Status::Invalid);
    let end = tokio::time::timeout(DEADLINE, wire::read_frame(&mut raw, &mut payload)).await;
    assert!(matches!(end, Ok(Ok(None)) | Ok(Err(_))), "{end:?}");
    assert_eq!(server.stats().handshakes_refused.load(Ordering::SeqCst), 1);
    // Nothing of the protocol is reachable without the handshake: a
    // request instead of a Hello is refused too.
    let mut raw = TcpStream::connect(server.local_addr()).await.unwrap();
    let (h, p) = write(0, b"no hello");
    wire::write_frame(&mut raw, &h, &p).await.unwrap();
    let end = tokio::time::timeout(DEADLINE, wire::read_frame(&mut raw, &mut payload)).await;
    assert!(matches!(end, Ok(Ok(None)) | Ok(Err(_))), "{end:?}");
    wait_for("the second refusal", || {
        server.stats().handshakes_refused.load(Ordering::SeqCst) == 2
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_peer_is_dropped_when_the_handshake_times_out() {
    let config = ServerConfig {
        handshake_timeout: Duration::from_millis(200),
        ..ServerConfig::default()
    };
    let (server, _) = serve(key(1), config).await;
    let mut raw = TcpStream::connect(server.local_addr()).await.unwrap();
    let mut buf = [0u8; 16];
    let end = tokio::time::timeout(DEADLINE, raw.read(&mut buf)).await;
    assert!(matches!(end, Ok(Ok(0)) | Ok(Err(_))), "{end:?}");
    assert_eq!(server.stats().handshakes_refused.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_complete_out_of_order_each_with_its_own_reply() {
    let (server, store) = serve(key(1), ServerConfig::default()).await;
    let client = Client::connect(server.local_addr(), &key(1), &ClientConfig::default())
        .await
        .unwrap();
    // The first request is held by the server...
    let first = tokio::spawn({
        let client = client.clone();
        async move { client.call(&flush(), Vec::new()).await }
    });
    wait_for("the flush to reach the handler", || {
        store.held.load(Ordering::SeqCst) == 1
    })
    .await;
    // ...while 31 more, on the same connection, are answered.
    let mut later = Vec::new();
    for offset in 0..31u64 {
        let client = client.clone();
        later.push(tokio::spawn(
            async move { round_trip(&client, offset).await },
        ));
    }
    for call in later {
        call.await.unwrap();
    }
    assert!(!first.is_finished(), "the held request was answered early");
    store.gate.add_permits(1);
    let reply = tokio::time::timeout(DEADLINE, first)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        (reply.header.op, reply.header.status),
        (Op::Flush, Status::Ok)
    );
    assert_eq!(
        server.stats().connections_accepted.load(Ordering::SeqCst),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_in_flight_are_bounded_on_both_sides() {
    for (client_max, server_max) in [(3, 128), (128, 4)] {
        let config = ServerConfig {
            in_flight_max: server_max,
            ..ServerConfig::default()
        };
        let (server, store) = serve(key(1), config).await;
        let client_config = ClientConfig {
            in_flight_max: client_max,
            ..ClientConfig::default()
        };
        let client = Client::connect(server.local_addr(), &key(1), &client_config)
            .await
            .unwrap();
        let bound = client_max.min(server_max);
        let calls: Vec<_> = (0..10)
            .map(|_| {
                let client = client.clone();
                tokio::spawn(async move { client.call(&flush(), Vec::new()).await })
            })
            .collect();
        wait_for("the bound to fill", || {
            store.held.load(Ordering::SeqCst) == bound
        })
        .await;
        // Give extra requests every chance to get through; none may.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(store.held.load(Ordering::SeqCst), bound);
        store.gate.add_permits(10);
        for call in calls {
            let reply = tokio::time::timeout(DEADLINE, call).await.unwrap().unwrap();
            assert_eq!(reply.unwrap().header.status, Status::Ok);
        }
    }
}

/// A valid request header for `payload`, its bytes edited by `edit` and
/// its header CRC made good again.
fn resealed(payload: &[u8], edit: impl FnOnce(&mut [u8; HEADER_BYTES])) -> Vec<u8> {
    let mut b = write(0, payload).0.encode();
    edit(&mut b);
    let crc = crc32c::crc32c(&b[..60]);
    b[60..64].copy_from_slice(&crc.to_le_bytes());
    let mut frame = b.to_vec();
    frame.extend_from_slice(payload);
    frame
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_frame_closes_only_its_connection_and_the_server_serves_on() {
    let (server, _) = serve(key(1), ServerConfig::default()).await;
    let bystander = Client::connect(server.local_addr(), &key(1), &ClientConfig::default())
        .await
        .unwrap();
    let mut http = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
    http.resize(HEADER_BYTES, b' ');
    let mut bad_payload = resealed(b"payload", |_| {});
    *bad_payload.last_mut().unwrap() ^= 1;
    let oversized = resealed(&[], |b| {
        b[52..56].copy_from_slice(&(PAYLOAD_BYTES_MAX + 1).to_le_bytes())
    });
    let reply_as_request = resealed(&[], |b| b[6] = 2);
    let hello_again = resealed(&[], |b| b[5] = Op::Hello as u8);
    let bad_frames = [http, bad_payload, oversized, reply_as_request, hello_again];
    for (n, garbage) in bad_frames.iter().enumerate() {
        let mut raw = TcpStream::connect(server.local_addr()).await.unwrap();
        handshake::client(&mut raw, &key(1), "test", DEADLINE)
            .await
            .unwrap();
        raw.write_all(garbage).await.unwrap();
        let mut rest = Vec::new();
        let end = tokio::time::timeout(DEADLINE, raw.read_to_end(&mut rest)).await;
        assert!(matches!(end, Ok(Ok(0)) | Ok(Err(_))), "frame {n}: {end:?}");
        assert_eq!(
            server.stats().frames_refused.load(Ordering::SeqCst),
            n as u64 + 1,
            "frame {n}"
        );
        round_trip(&bystander, n as u64).await;
    }
    let newcomer = Client::connect(server.local_addr(), &key(1), &ClientConfig::default())
        .await
        .unwrap();
    round_trip(&newcomer, 99).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_server_fails_every_pending_request() {
    let (server, store) = serve(key(1), ServerConfig::default()).await;
    let client = Client::connect(server.local_addr(), &key(1), &ClientConfig::default())
        .await
        .unwrap();
    let calls: Vec<_> = (0..3)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { client.call(&flush(), Vec::new()).await })
        })
        .collect();
    wait_for("the requests to be held", || {
        store.held.load(Ordering::SeqCst) == 3
    })
    .await;
    drop(server);
    for call in calls {
        let outcome = tokio::time::timeout(DEADLINE, call).await.unwrap().unwrap();
        assert!(
            matches!(&outcome, Err(Error::ConnectionClosed { reason, .. }) if reason.contains("closed the connection")),
            "{outcome:?}"
        );
    }
    assert!(client.is_closed());
    let (h, p) = write(0, b"late");
    let late = client.call(&h, p).await;
    assert!(
        matches!(late, Err(Error::ConnectionClosed { .. })),
        "{late:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_reuse_one_connection_per_server() {
    let (server, _) = serve(key(1), ServerConfig::default()).await;
    let peers = Peers::new(key(1), ClientConfig::default());
    for offset in 0..3 {
        let client = peers.get(server.local_addr()).await.unwrap();
        round_trip(&client, offset).await;
    }
    assert_eq!(
        server.stats().connections_accepted.load(Ordering::SeqCst),
        1
    );
    let (other, _) = serve(key(1), ServerConfig::default()).await;
    round_trip(&peers.get(other.local_addr()).await.unwrap(), 5).await;
    assert_eq!(other.stats().connections_accepted.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_no_frame_can_carry_are_refused_before_sending() {
    let (server, _) = serve(key(1), ServerConfig::default()).await;
    let client = Client::connect(server.local_addr(), &key(1), &ClientConfig::default())
        .await
        .unwrap();
    let too_big = vec![0u8; PAYLOAD_BYTES_MAX as usize + 1];
    let (h, _) = write(0, &[]);
    let hello = Header::request(Op::Hello, 0, &[]);
    let mut reply_flag = h;
    reply_flag.flags = 2;
    for (request, payload) in [(h, too_big), (hello, Vec::new()), (reply_flag, Vec::new())] {
        let outcome = client.call(&request, payload).await;
        assert!(
            matches!(outcome, Err(Error::InvalidRequest(_))),
            "{outcome:?}"
        );
    }
    round_trip(&client, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_panics_fails_its_request_alone() {
    let (server, _) = serve(key(9), ServerConfig::default()).await;
    let config = ClientConfig::default();
    let client = Client::connect(server.local_addr(), &key(9), &config)
        .await
        .unwrap();
    let replay = Header::request(Op::Replay, 0, &[]);
    // Well before the client's own request timeout: the server answers.
    let reply = tokio::time::timeout(DEADLINE, client.call(&replay, Vec::new()))
        .await
        .expect("a reply before the deadline, not the client's timeout")
        .expect("a reply");
    assert_eq!(reply.header.status, Status::Io);
    // The connection and the server go on serving.
    round_trip(&client, 11).await;
}

/// A simulated round trip (`ClientConfig::simulated_rtt`, the delayed
/// network of issue 20's benchmark) delays every reply by at least its
/// length, and requests in flight together wait it out together: a lower
/// bound only (a sleep never ends early), nothing about how fast.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_simulated_round_trip_delays_every_reply_by_at_least_its_length() {
    let (server, _) = serve(key(1), ServerConfig::default()).await;
    let rtt = std::time::Duration::from_millis(30);
    let config = ClientConfig {
        simulated_rtt: Some(rtt),
        ..ClientConfig::default()
    };
    let client = Client::connect(server.local_addr(), &key(1), &config)
        .await
        .unwrap();
    let started = std::time::Instant::now();
    round_trip(&client, 5).await;
    assert!(started.elapsed() >= rtt, "one call, one round trip");
    assert_eq!(
        ecdedup_transport::client::parse_simulated_rtt("250").unwrap(),
        Some(std::time::Duration::from_micros(250))
    );
    assert_eq!(
        ecdedup_transport::client::parse_simulated_rtt("0").unwrap(),
        None
    );
    for bad in ["", "1ms", "-3", "99999999999"] {
        let e = ecdedup_transport::client::parse_simulated_rtt(bad).unwrap_err();
        assert!(e.contains("ECDEDUP_SIMULATED_RTT_US"), "{e}");
    }
}
