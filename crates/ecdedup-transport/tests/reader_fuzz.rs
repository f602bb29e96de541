//! Property tests of the server's reader: whatever bytes a peer sends,
//! before or after the handshake, the connection's task ends without a
//! panic, and every reply it wrote is a well-formed reply to a request the
//! peer really sent, carrying that request's payload (the handler echoes).
//! Inputs are valid frames with a flipped byte, a cut, and random bytes
//! after them, so the parser is reached in every state.

use std::sync::Arc;
use std::time::Duration;

use ecdedup_core::proto::{Header, Op, Status};
use ecdedup_transport::server::serve_connection;
use ecdedup_transport::{handshake, wire, ClusterKey, Handler, ServerConfig, ServerStats};
use proptest::prelude::*;
use proptest::sample::Index;
use tokio::io::AsyncWriteExt;

const DEADLINE: Duration = Duration::from_secs(30);

struct Echo;

impl Handler for Echo {
    async fn handle(&self, _request: Header, payload: Vec<u8>) -> (Status, Vec<u8>) {
        (Status::Ok, payload)
    }
}

/// Feeds `input` to one server connection (after a real handshake if
/// `authenticated`) and returns the replies it wrote.
fn serve_bytes(authenticated: bool, input: Vec<u8>) -> Vec<(Header, Vec<u8>)> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let key = ClusterKey::from_bytes(&[7; 32]).unwrap();
        let (mut ours, theirs) = tokio::io::duplex(1 << 16);
        let server = tokio::spawn(serve_connection(
            theirs,
            "fuzz".into(),
            Arc::new(key.clone()),
            Arc::new(Echo),
            ServerConfig::default(),
            Arc::new(ServerStats::default()),
        ));
        if authenticated {
            handshake::client(&mut ours, &key, "server", DEADLINE)
                .await
                .unwrap();
        }
        let (mut r, mut w) = tokio::io::split(ours);
        let feed = async {
            // The server may close first: then these fail, as they should.
            let _ = w.write_all(&input).await;
            let _ = w.shutdown().await;
        };
        let collect = async {
            let mut replies = Vec::new();
            let mut payload = Vec::new();
            while let Ok(Some(header)) = wire::read_frame(&mut r, &mut payload).await {
                replies.push((header, std::mem::take(&mut payload)));
            }
            replies
        };
        let ((), replies) = tokio::join!(feed, collect);
        tokio::time::timeout(DEADLINE, server)
            .await
            .expect("the connection's task ends")
            .expect("the connection's task did not panic");
        replies
    })
}

/// Valid write requests (ids 0, 1, ...), then maybe a flipped byte, maybe
/// a cut, then random bytes.
fn damaged_stream() -> impl Strategy<Value = (Vec<Vec<u8>>, Vec<u8>)> {
    (
        proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..200), 0..4),
        proptest::option::of((any::<Index>(), 1u8..=255)),
        proptest::option::of(any::<Index>()),
        proptest::collection::vec(any::<u8>(), 0..300),
    )
        .prop_map(|(payloads, flip, cut, tail)| {
            let mut wire = Vec::new();
            for (id, payload) in payloads.iter().enumerate() {
                wire.extend(Header::request(Op::Write, id as u64, payload).encode());
                wire.extend(payload);
            }
            if let (Some((at, x)), false) = (flip, wire.is_empty()) {
                let at = at.index(wire.len());
                wire[at] ^= x;
            }
            if let (Some(at), false) = (cut, wire.is_empty()) {
                wire.truncate(at.index(wire.len()));
            }
            wire.extend(tail);
            (payloads, wire)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn bytes_after_the_handshake_never_panic_the_server_nor_get_a_wrong_reply(
        (payloads, wire) in damaged_stream()
    ) {
        for (header, payload) in serve_bytes(true, wire) {
            prop_assert!(header.is_reply());
            prop_assert_eq!(header.status, Status::Ok);
            let sent = payloads.get(header.request_id as usize);
            prop_assert_eq!(Some(&payload), sent, "reply {}", header.request_id);
        }
    }

    #[test]
    fn bytes_instead_of_a_handshake_never_panic_the_server_nor_reach_the_handler(
        (_, wire) in damaged_stream()
    ) {
        let replies = serve_bytes(false, wire);
        // At most the handshake's challenge comes back, never a handled request.
        prop_assert!(replies.iter().all(|(h, _)| h.op == Op::Hello), "{:?}", replies);
    }
}

#[test]
fn intact_frames_after_the_handshake_are_all_answered() {
    let payloads: Vec<Vec<u8>> = (0..5u8).map(|n| vec![n; 100 * n as usize]).collect();
    let mut wire = Vec::new();
    for (id, payload) in payloads.iter().enumerate() {
        wire.extend(Header::request(Op::Write, id as u64, payload).encode());
        wire.extend(payload);
    }
    let mut replies = serve_bytes(true, wire);
    replies.sort_by_key(|(h, _)| h.request_id);
    let echoed: Vec<Vec<u8>> = replies.into_iter().map(|(_, p)| p).collect();
    assert_eq!(echoed, payloads);
}
