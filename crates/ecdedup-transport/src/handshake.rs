//! The connection handshake: a challenge–response in `Hello` frames that
//! proves the cluster key in both directions before any other frame is read.
//!
//! ```text
//! client                                   server
//!   Hello request  id 0: Nc (32 bytes)   ──▶
//!                                        ◀──  Hello reply id 0: Ns, Ps
//!   checks Ps = HMAC(K, D ‖ "server" ‖ Nc ‖ Ns)
//!   Hello request  id 1: Pc              ──▶
//!                                             checks Pc = HMAC(K, D ‖ "client" ‖ Nc ‖ Ns)
//!                                        ◀──  Hello reply id 1: status Ok
//!                                             (or Invalid, then the server closes)
//! ```
//!
//! `K` is the cluster key, `D` a domain string naming this protocol and its
//! version, `Nc`/`Ns` fresh random nonces, HMAC is HMAC-SHA256. Each proof
//! covers both nonces, so it cannot be replayed on another connection, and
//! names its prover's role, so a server's proof reflected back to it is not
//! a client's. A side that fails the other's proof closes the connection;
//! the server logs the reason. Each side bounds the whole exchange with a
//! timeout, and a peer's handshake frame is bounded to the few bytes it
//! needs before anything is allocated for it (no one reaches the protocol's
//! 4 MiB payloads without the key).
//!
//! The key is never sent, and a peer that lacks it learns nothing from the
//! exchange but two nonces and an HMAC over them.

use std::time::Duration;

use ecdedup_core::proto::{Header, Op, Status};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::{wire, ClusterKey, Error};

/// Bytes of each side's nonce.
pub const NONCE_BYTES: usize = 32;
/// Bytes of a proof (an HMAC-SHA256 tag).
pub const PROOF_BYTES: usize = 32;
/// Names the protocol and its version inside every proof.
const DOMAIN: &[u8] = b"ecdedup-transport hello v1\0";

#[derive(Clone, Copy)]
enum Role {
    Client,
    Server,
}

fn mac(key: &ClusterKey, role: Role, client_nonce: &[u8], server_nonce: &[u8]) -> Hmac<Sha256> {
    let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(key.bytes())
        .expect("HMAC takes a key of any length");
    m.update(DOMAIN);
    m.update(match role {
        Role::Client => b"client",
        Role::Server => b"server",
    });
    m.update(client_nonce);
    m.update(server_nonce);
    m
}

fn prove(key: &ClusterKey, role: Role, client_nonce: &[u8], server_nonce: &[u8]) -> Vec<u8> {
    mac(key, role, client_nonce, server_nonce)
        .finalize()
        .into_bytes()
        .to_vec()
}

/// Checks `proof` in constant time.
fn verify(
    key: &ClusterKey,
    role: Role,
    client_nonce: &[u8],
    server_nonce: &[u8],
    proof: &[u8],
) -> bool {
    mac(key, role, client_nonce, server_nonce)
        .verify_slice(proof)
        .is_ok()
}

async fn send<S: AsyncWrite + Unpin>(
    s: &mut S,
    header: &Header,
    payload: &[u8],
) -> Result<(), String> {
    wire::write_frame(s, header, payload)
        .await
        .and(s.flush().await)
        .map_err(|e| format!("connection: {e}"))
}

/// Reads the handshake's next frame: a `Hello` request (or reply) with
/// `request_id` and exactly `payload_bytes` of payload, checked before the
/// payload is read.
async fn read_hello<S: AsyncRead + Unpin>(
    s: &mut S,
    reply: bool,
    request_id: u64,
    payload_bytes: usize,
) -> Result<(Header, Vec<u8>), String> {
    let header = wire::read_header(s)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("the peer closed the connection during the handshake")?;
    let what = if reply { "reply" } else { "request" };
    if header.op != Op::Hello || header.is_reply() != reply || header.request_id != request_id {
        return Err(format!(
            "expected Hello {what} {request_id}, got {:?} {} {}",
            header.op,
            if header.is_reply() {
                "reply"
            } else {
                "request"
            },
            header.request_id
        ));
    }
    if header.payload_bytes as usize != payload_bytes {
        return Err(format!(
            "Hello {what} {request_id} with {} bytes of payload (expected {payload_bytes})",
            header.payload_bytes
        ));
    }
    let mut payload = Vec::new();
    wire::read_payload(s, &header, &mut payload)
        .await
        .map_err(|e| e.to_string())?;
    Ok((header, payload))
}

/// The client's side: proves the key to the server at `peer` and checks
/// the server's proof, within `timeout`.
pub async fn client<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    key: &ClusterKey,
    peer: &str,
    timeout: Duration,
) -> Result<(), Error> {
    let fail = |reason: String| Error::Handshake {
        peer: peer.to_string(),
        reason,
    };
    match tokio::time::timeout(timeout, client_steps(s, key)).await {
        Ok(outcome) => outcome.map_err(fail),
        Err(_) => Err(fail(format!("not completed within {timeout:?}"))),
    }
}

async fn client_steps<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    key: &ClusterKey,
) -> Result<(), String> {
    let client_nonce = rand::random::<[u8; NONCE_BYTES]>();
    send(
        s,
        &Header::request(Op::Hello, 0, &client_nonce),
        &client_nonce,
    )
    .await?;
    let (challenge, body) = read_hello(s, true, 0, NONCE_BYTES + PROOF_BYTES).await?;
    if challenge.status != Status::Ok {
        return Err(format!(
            "the server refused the hello ({:?})",
            challenge.status
        ));
    }
    let (server_nonce, server_proof) = body.split_at(NONCE_BYTES);
    if !verify(key, Role::Server, &client_nonce, server_nonce, server_proof) {
        return Err("the server did not prove the cluster key \
                    (another cluster, or another key file)"
            .into());
    }
    let proof = prove(key, Role::Client, &client_nonce, server_nonce);
    send(s, &Header::request(Op::Hello, 1, &proof), &proof).await?;
    let (verdict, _) = read_hello(s, true, 1, 0).await?;
    match verdict.status {
        Status::Ok => Ok(()),
        other => Err(format!(
            "the server refused this side's proof of the cluster key ({other:?}): \
             the key files differ"
        )),
    }
}

/// The server's side: checks the client's proof and proves the key to it,
/// within `timeout`. The error is the reason to log when the peer is
/// dropped.
pub async fn server<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    key: &ClusterKey,
    timeout: Duration,
) -> Result<(), String> {
    match tokio::time::timeout(timeout, server_steps(s, key)).await {
        Ok(outcome) => outcome,
        Err(_) => Err(format!("handshake not completed within {timeout:?}")),
    }
}

async fn server_steps<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    key: &ClusterKey,
) -> Result<(), String> {
    let (hello, client_nonce) = read_hello(s, false, 0, NONCE_BYTES).await?;
    let server_nonce = rand::random::<[u8; NONCE_BYTES]>();
    let mut body = server_nonce.to_vec();
    body.extend(prove(key, Role::Server, &client_nonce, &server_nonce));
    send(s, &hello.reply(Status::Ok, &body), &body).await?;
    let (answer, proof) = read_hello(s, false, 1, PROOF_BYTES).await?;
    if !verify(key, Role::Client, &client_nonce, &server_nonce, &proof) {
        // Say why before closing; the reply carries nothing else.
        let _ = send(s, &answer.reply(Status::Invalid, &[]), &[]).await;
        return Err("the peer did not prove the cluster key".into());
    }
    send(s, &answer.reply(Status::Ok, &[]), &[]).await
}
