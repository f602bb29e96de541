//! The volume client's connection to one chunk: the engine's
//! [`ChunkLink`] over the transport (docs/cluster.md, "The data path").
//!
//! Every frame carries the volume's id and the writer's epoch, and every
//! request for a chunk its PG's epoch ([`PgEpoch`]: the PG record's epoch
//! in etcd that the writer acts on). A send
//! spawns the call on the client's runtime and returns at once, so a batch
//! of the array puts every unit of a stripe on the wire before it waits;
//! operations larger than a frame go as several frames in flight together.
//! A refusal with `EpochTooOld` latches [`Wire::fenced`]: a newer writer
//! owns the volume, and the client stops its export. So does
//! `PgEpochTooOld`: a server has heard a newer placement of the PG from a
//! writer of the volume than this one acts on, which only a newer writer
//! can have sent (this writer's own change of a PG's epoch drains its
//! requests stamped with the old one first: [`PgEpoch::change`]).
//!
//! A link reaches its server at the address in the volume's
//! [`Addresses`], one cell per server shared by the links of its chunks:
//! when the server registers again on another address (restarted
//! elsewhere), the follower (`follow.rs`) changes the cell and the next
//! request goes there, over a new connection.
//!
//! The counters say what crossed the wire, in all and by [`Purpose`] (a
//! data write, a journal append, a d(0) read, a replay's read...): a round
//! trip is counted for the purpose of the first frame of its group.

use ecdedup_cluster::ServerId;
use ecdedup_core::counters::IoClass;
use ecdedup_core::media::remote::{
    changes_chunk, outcome_unknown, ChunkLink, Fenced, LinkOp, PendingReply, Purpose, Ready,
};
use ecdedup_core::proto::frame::{
    encode_append, encode_layer, encode_replay, FLAG_FUA, FLAG_LAYERED, FLAG_METADATA, FLAG_PARITY,
    FLAG_REPAIR,
};
use ecdedup_core::proto::{Header, Op, Status, PAYLOAD_BYTES_MAX};
use ecdedup_transport::Peers;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Bytes of data one frame carries (a multiple of 4 KiB under the
/// protocol's bound).
pub const FRAME_DATA_BYTES: usize = 4 << 20;

/// What crossed the wire, per volume client (JSON and Prometheus).
#[derive(Debug, Default, serde::Serialize)]
pub struct WireCounters {
    /// Frames sent.
    pub messages: AtomicU64,
    /// Groups of frames sent before the sender waited for a reply: one per
    /// batch of the array, one per lone call.
    pub round_trips: AtomicU64,
    pub bytes_out: AtomicU64,
    pub bytes_in: AtomicU64,
    /// Replies with a status other than Ok, or no reply.
    pub failures: AtomicU64,
    pub epoch_refusals: AtomicU64,
    /// Refusals for an older PG epoch than the server's.
    pub pg_epoch_refusals: AtomicU64,
    /// Messages, round trips and bytes out, by purpose.
    pub by_purpose: PurposeCounters,
}

/// Per [`Purpose`]: frames sent, round trips begun (groups whose first
/// frame had that purpose), bytes sent.
#[derive(Debug, Default)]
pub struct PurposeCounters([[AtomicU64; 3]; Purpose::ALL.len()]);

impl PurposeCounters {
    fn add(&self, purpose: Purpose, round_trip: bool, bytes: u64) {
        let at = &self.0[Purpose::ALL.iter().position(|p| *p == purpose).unwrap_or(0)];
        at[0].fetch_add(1, Relaxed);
        at[1].fetch_add(u64::from(round_trip), Relaxed);
        at[2].fetch_add(bytes, Relaxed);
    }

    /// (messages, round trips, bytes out) of `purpose`.
    pub fn get(&self, purpose: Purpose) -> (u64, u64, u64) {
        let at = &self.0[Purpose::ALL.iter().position(|p| *p == purpose).unwrap_or(0)];
        (
            at[0].load(Relaxed),
            at[1].load(Relaxed),
            at[2].load(Relaxed),
        )
    }
}

impl serde::Serialize for PurposeCounters {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(Purpose::ALL.len()))?;
        for p in Purpose::ALL {
            let (messages, round_trips, bytes_out) = self.get(p);
            map.serialize_entry(
                p.name(),
                &serde_json::json!({
                    "messages": messages,
                    "round_trips": round_trips,
                    "bytes_out": bytes_out,
                }),
            )?;
        }
        map.end()
    }
}

/// The epoch a writer stamps on every request for one PG's chunks, and
/// the gate that changes it: requests stamped with the old epoch are
/// drained before the new one is pushed, so that no server that took the
/// new epoch later meets one of this writer's requests stamped with the
/// old (the transport handles a connection's requests concurrently, so
/// order on the wire is not order of handling).
pub struct PgEpoch {
    state: Mutex<PgEpochState>,
    drained: Condvar,
}

struct PgEpochState {
    epoch: u32,
    /// Operations sent and not yet answered.
    in_flight: u64,
    /// A change is under way: new operations wait.
    changing: bool,
}

/// An operation in flight on a PG: counted until dropped (when its last
/// frame's reply is in).
pub struct InFlight(Arc<PgEpoch>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut st = self.0.state.lock().unwrap();
        st.in_flight -= 1;
        if st.in_flight == 0 {
            self.0.drained.notify_all();
        }
    }
}

impl PgEpoch {
    pub fn new(epoch: u32) -> Arc<PgEpoch> {
        Arc::new(PgEpoch {
            state: Mutex::new(PgEpochState {
                epoch,
                in_flight: 0,
                changing: false,
            }),
            drained: Condvar::new(),
        })
    }

    pub fn get(&self) -> u32 {
        self.state.lock().unwrap().epoch
    }

    /// An operation about to be sent: waits while the epoch changes, then
    /// gives the epoch to stamp and its in-flight count.
    pub fn begin(self: &Arc<Self>) -> (u32, Arc<InFlight>) {
        let mut st = self.state.lock().unwrap();
        while st.changing {
            st = self.drained.wait(st).unwrap();
        }
        st.in_flight += 1;
        (st.epoch, Arc::new(InFlight(Arc::clone(self))))
    }

    /// Moves to epoch `to`: holds new operations back, waits until those
    /// in flight are answered (at most `drain_max`: every request ends by
    /// its reply or its timeout), runs `push` (which tells the servers,
    /// stamping `to` itself), then lets operations go stamped `to`, even
    /// if `push` failed: the record at `to` is in etcd, and a server the
    /// push missed takes `to` from the first request that carries it.
    pub fn change<T>(&self, to: u32, drain_max: Duration, push: impl FnOnce() -> T) -> T {
        {
            let mut st = self.state.lock().unwrap();
            assert!(to >= st.epoch, "a PG's epoch only grows");
            while st.changing {
                st = self.drained.wait(st).unwrap();
            }
            st.changing = true;
            let until = Instant::now() + drain_max;
            while st.in_flight > 0 {
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                st = self.drained.wait_timeout(st, left).unwrap().0;
            }
        }
        let result = push();
        let mut st = self.state.lock().unwrap();
        st.epoch = to;
        st.changing = false;
        self.drained.notify_all();
        result
    }
}

thread_local! {
    /// Whether this thread has sent frames it has not yet waited for.
    static IN_FLIGHT: Cell<bool> = const { Cell::new(false) };
}

/// Shared by every link of one volume client.
pub struct Wire {
    pub(crate) rt: tokio::runtime::Handle,
    pub(crate) peers: Arc<Peers>,
    pub volume_id: u64,
    pub epoch: u64,
    pub(crate) timeout: Duration,
    fenced: AtomicBool,
    fence_reason: Mutex<Option<String>>,
    /// Where each server is reached now.
    pub addresses: Addresses,
    pub counters: WireCounters,
}

impl Wire {
    pub fn new(
        rt: tokio::runtime::Handle,
        peers: Arc<Peers>,
        volume_id: u64,
        epoch: u64,
        timeout: Duration,
    ) -> Wire {
        Wire {
            rt,
            peers,
            volume_id,
            epoch,
            timeout,
            fenced: AtomicBool::new(false),
            fence_reason: Mutex::new(None),
            addresses: Addresses::default(),
            counters: WireCounters::default(),
        }
    }

    /// Why this writer is fenced (a newer writer owns the volume, or its
    /// lease is gone), or None.
    pub fn fenced(&self) -> Option<String> {
        if !self.fenced.load(SeqCst) {
            return None;
        }
        self.fence_reason.lock().unwrap().clone()
    }

    /// Latches the fence with `reason` (the first reason stays).
    pub fn fence(&self, reason: String) {
        let mut r = self.fence_reason.lock().unwrap();
        if r.is_none() {
            *r = Some(reason);
        }
        self.fenced.store(true, SeqCst);
    }

    /// A request header for a chunk of this volume, for PG epoch
    /// `pg_epoch` (0 for `SetEpoch`, which names no PG).
    pub fn header(&self, op: Op, code: u32, pg_epoch: u32, offset: u64, length: u32) -> Header {
        request_header(
            self.volume_id,
            self.epoch,
            pg_epoch,
            op,
            code,
            offset,
            length,
        )
    }

    /// Sends one frame of chunk management (`Open`, `SetEpoch`); the
    /// receiver gets its reply (or why none came).
    pub fn call(
        self: &Arc<Self>,
        addr: SocketAddr,
        header: Header,
        payload: Vec<u8>,
    ) -> mpsc::Receiver<io::Result<Vec<u8>>> {
        self.call_for(Purpose::Control, addr, header, payload)
    }

    /// Sends one frame sent for `purpose`, as [`Wire::call`].
    pub fn call_for(
        self: &Arc<Self>,
        purpose: Purpose,
        addr: SocketAddr,
        header: Header,
        payload: Vec<u8>,
    ) -> mpsc::Receiver<io::Result<Vec<u8>>> {
        self.send_frame(purpose, addr, header, payload, None)
    }

    /// Sends one frame; `in_flight` (the operation's count on its PG) is
    /// held until its reply is in.
    fn send_frame(
        self: &Arc<Self>,
        purpose: Purpose,
        addr: SocketAddr,
        header: Header,
        payload: Vec<u8>,
        in_flight: Option<Arc<InFlight>>,
    ) -> mpsc::Receiver<io::Result<Vec<u8>>> {
        let (tx, rx) = mpsc::sync_channel(1);
        let round_trip = !IN_FLIGHT.with(|f| f.replace(true));
        let bytes = 64 + payload.len() as u64;
        self.counters
            .round_trips
            .fetch_add(u64::from(round_trip), Relaxed);
        self.counters.messages.fetch_add(1, Relaxed);
        self.counters.bytes_out.fetch_add(bytes, Relaxed);
        self.counters.by_purpose.add(purpose, round_trip, bytes);
        let wire = Arc::clone(self);
        self.rt.spawn(async move {
            let reply = async {
                let client = wire.peers.get(addr).await?;
                client.call(&header, payload).await
            };
            let result = match tokio::time::timeout(wire.timeout, reply).await {
                Err(_) => Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "{:?} to {addr}: no reply within {:?}",
                        header.op, wire.timeout
                    ),
                )),
                Ok(Err(e)) => Err(io::Error::new(io::ErrorKind::NotConnected, e.to_string())),
                Ok(Ok(reply)) => {
                    wire.counters
                        .bytes_in
                        .fetch_add(64 + reply.payload.len() as u64, Relaxed);
                    wire.outcome(addr, &header, reply.header.status, reply.payload)
                }
            };
            if result.is_err() {
                wire.counters.failures.fetch_add(1, Relaxed);
            }
            drop(in_flight);
            let _ = tx.send(result);
        });
        rx
    }

    /// A reply's status as the engine sees it.
    fn outcome(
        &self,
        addr: SocketAddr,
        h: &Header,
        status: Status,
        payload: Vec<u8>,
    ) -> io::Result<Vec<u8>> {
        if status == Status::Ok {
            return Ok(payload);
        }
        let why = String::from_utf8_lossy(&payload).into_owned();
        let msg = format!("{:?} at {addr}: {status:?}: {why}", h.op);
        match status {
            Status::EpochTooOld => {
                self.counters.epoch_refusals.fetch_add(1, Relaxed);
                self.fence(msg.clone());
                Err(Fenced::error(msg))
            }
            Status::PgEpochTooOld => {
                self.counters.pg_epoch_refusals.fetch_add(1, Relaxed);
                self.fence(msg.clone());
                Err(Fenced::error(msg))
            }
            Status::NoSpace => Err(io::Error::from_raw_os_error(libc::ENOSPC)),
            // A fold the server refused before touching the chunk (a
            // server without the op, or one that finds it malformed):
            // nothing written, so the writer replays as before.
            Status::Invalid if h.op == Op::Replay => {
                Err(io::Error::new(io::ErrorKind::Unsupported, msg))
            }
            _ => Err(io::Error::other(msg)),
        }
    }

    /// Waits for a reply sent by [`Wire::call`].
    pub fn wait(rx: mpsc::Receiver<io::Result<Vec<u8>>>) -> io::Result<Vec<u8>> {
        IN_FLIGHT.with(|f| f.set(false));
        rx.recv().unwrap_or_else(|_| {
            Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "the client's runtime stopped",
            ))
        })
    }
}

/// A request header for chunk `code` (PG << 8 | shard) of volume
/// `volume_id`, carrying the writer's `epoch` and the PG's `pg_epoch`.
pub fn request_header(
    volume_id: u64,
    epoch: u64,
    pg_epoch: u32,
    op: Op,
    code: u32,
    offset: u64,
    length: u32,
) -> Header {
    let mut h = Header::request(op, 0, &[]);
    h.volume_id = volume_id;
    h.epoch = epoch;
    h.pg = code;
    h.pg_epoch = pg_epoch;
    h.offset = offset;
    h.length = length;
    h
}

/// The frames (header, payload) that carry `op` on chunk `code`: one per
/// [`FRAME_DATA_BYTES`] of a read or write, one for a sync or discard, one
/// `LogAppend` for a journal append (its runs and its length hint) that
/// fits a frame, one `Layer` for a dedup layer's start.
/// With `classes` (the server takes a dedup layer:
/// [`ChunkLink::takes_dedup`]), a write's frames say its class and
/// whether it repairs ([`FLAG_PARITY`], [`FLAG_METADATA`],
/// [`FLAG_REPAIR`]), which a server from before would refuse; with
/// `layered` too (the writer started the chunk's layer there:
/// [`ChunkLink::set_layered`]), every frame but a `Layer` carries
/// [`FLAG_LAYERED`].
/// The same for every link (the network's and the cluster simulator's).
pub fn link_frames(
    volume_id: u64,
    epoch: u64,
    pg_epoch: u32,
    code: u32,
    op: LinkOp<'_>,
    classes: bool,
    layered: bool,
) -> Vec<(Header, Vec<u8>)> {
    let header = |op, offset, length| {
        let mut h = request_header(volume_id, epoch, pg_epoch, op, code, offset, length);
        if classes && layered && op != Op::Layer {
            h.flags |= FLAG_LAYERED;
        }
        h
    };
    let mut frames = Vec::new();
    match op {
        LinkOp::Read { offset, len } => {
            let mut done = 0;
            while done < len || frames.is_empty() {
                let n = (len - done).min(FRAME_DATA_BYTES);
                frames.push((header(Op::Read, offset + done as u64, n as u32), Vec::new()));
                done += n;
                if n == 0 {
                    break;
                }
            }
        }
        LinkOp::Write {
            offset,
            buf,
            fua,
            class,
            repair,
        } => {
            let mut flags = if fua { FLAG_FUA } else { 0 };
            if classes {
                flags |= match class {
                    IoClass::Parity => FLAG_PARITY,
                    IoClass::Metadata => FLAG_METADATA,
                    IoClass::Data | IoClass::Journal => 0,
                };
                if repair {
                    flags |= FLAG_REPAIR;
                }
            }
            write_frames(&mut frames, &header, offset, buf, flags)
        }
        LinkOp::Append { writes, fua } => {
            let payload = encode_append(writes);
            match u32::try_from(payload.len()) {
                Ok(n) if n <= PAYLOAD_BYTES_MAX && !writes.is_empty() => {
                    let mut h = header(Op::LogAppend, writes[0].0, n);
                    if fua {
                        h.flags |= FLAG_FUA;
                    }
                    frames.push((h, payload))
                }
                // Larger than a frame (records of a 4 MiB unit with its
                // d(0), or a flush's many checksum pages): each write as
                // its own frames, which the chunk may handle in any order,
                // so with `fua` each one durable before its answer. An
                // append with a barrier is never larger
                // (`proto::frame::append_fits`, checked by its maker); its
                // barrier would go as a sync in no order.
                _ => {
                    debug_assert!(
                        writes.iter().all(|(_, b)| !b.is_empty()),
                        "an append with a barrier over one frame"
                    );
                    let flags = if fua { FLAG_FUA } else { 0 };
                    for &(offset, buf) in writes {
                        match buf.is_empty() {
                            true => frames.push((header(Op::Flush, 0, 0), Vec::new())),
                            false => write_frames(&mut frames, &header, offset, buf, flags),
                        }
                    }
                }
            }
        }
        LinkOp::Fold { fold, fua } => {
            // Within a frame by the fold's own bounds (`proto::frame`).
            let payload = encode_replay(fold);
            let first = fold.rows.first().map_or(0, |r| r.parity);
            let mut h = header(Op::Replay, first, payload.len() as u32);
            if fua {
                h.flags |= FLAG_FUA;
            }
            frames.push((h, payload))
        }
        LinkOp::Sync => frames.push((header(Op::Flush, 0, 0), Vec::new())),
        LinkOp::Discard { offset, len } => {
            frames.push((header(Op::Discard, offset, 8), len.to_le_bytes().to_vec()))
        }
        LinkOp::Layer { spec } => {
            let payload = encode_layer(spec);
            frames.push((header(Op::Layer, 0, payload.len() as u32), payload))
        }
    }
    debug_assert!(FRAME_DATA_BYTES as u32 <= PAYLOAD_BYTES_MAX);
    frames
}

/// The `Write` frames of `buf` at `offset`, one per [`FRAME_DATA_BYTES`],
/// each with `flags`.
fn write_frames(
    frames: &mut Vec<(Header, Vec<u8>)>,
    header: &dyn Fn(Op, u64, u32) -> Header,
    offset: u64,
    buf: &[u8],
    flags: u16,
) {
    for (i, piece) in buf.chunks(FRAME_DATA_BYTES).enumerate() {
        let at = offset + (i * FRAME_DATA_BYTES) as u64;
        let mut h = header(Op::Write, at, piece.len() as u32);
        h.flags |= flags;
        frames.push((h, piece.to_vec()));
    }
}

/// Where one server is reached now (shared by the links of its chunks).
pub type ServerAddress = Arc<Mutex<SocketAddr>>;

/// The address of every server a volume client has links to.
#[derive(Default)]
pub struct Addresses(Mutex<BTreeMap<ServerId, ServerAddress>>);

impl Addresses {
    /// Server `id`'s cell, set to `addr` (the caller read it from etcd as
    /// it opens chunks there: at least as new as the cell's).
    pub fn cell(&self, id: ServerId, addr: SocketAddr) -> ServerAddress {
        let mut book = self.0.lock().unwrap();
        let cell = book.entry(id).or_insert_with(|| Arc::new(Mutex::new(addr)));
        *cell.lock().unwrap() = addr;
        Arc::clone(cell)
    }

    /// Server `id` registered at `addr`: its links go there from now on.
    /// Returns the address it had, if it changed; a server with no link
    /// here is not tracked (its chunks get a cell when opened).
    pub fn update(&self, id: ServerId, addr: SocketAddr) -> Option<SocketAddr> {
        let book = self.0.lock().unwrap();
        let mut at = book.get(&id)?.lock().unwrap();
        let old = *at;
        *at = addr;
        (old != addr).then_some(old)
    }

    /// Where server `id` is reached now, if it has links here.
    pub fn get(&self, id: ServerId) -> Option<SocketAddr> {
        Some(*self.0.lock().unwrap().get(&id)?.lock().unwrap())
    }
}

/// One chunk: shard `shard` of PG `pg` of the volume, on `server`.
pub struct NetLink {
    wire: Arc<Wire>,
    server: ServerId,
    /// The server's address now ([`Addresses`]).
    addr: ServerAddress,
    code: u32,
    /// The PG's epoch, shared by the links of its chunks.
    pg_epoch: Arc<PgEpoch>,
    size: u64,
    /// The server's boot id when the chunk was opened.
    boot_id: u64,
    /// The server's registration says it takes a barrier in a
    /// `LogAppend` ([`ChunkLink::takes_barrier`]).
    takes_barrier: bool,
    /// The server's registration says it runs a dedup layer over a chunk
    /// ([`ChunkLink::takes_dedup`]).
    takes_dedup: bool,
    /// The writer reaches the chunk through a layer at its server
    /// ([`ChunkLink::set_layered`]).
    layered: AtomicBool,
    /// A request of this link ended without its reply
    /// ([`ChunkLink::unanswered`]).
    unanswered: Arc<AtomicBool>,
}

impl NetLink {
    pub fn new(
        wire: Arc<Wire>,
        server: ServerId,
        addr: ServerAddress,
        code: u32,
        pg_epoch: Arc<PgEpoch>,
        size: u64,
        boot_id: u64,
    ) -> NetLink {
        NetLink {
            wire,
            server,
            addr,
            code,
            pg_epoch,
            size,
            boot_id,
            takes_barrier: false,
            takes_dedup: false,
            layered: AtomicBool::new(false),
            unanswered: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Whether the server takes a barrier ([`ChunkLink::takes_barrier`]:
    /// its registration says so). False unless set.
    pub fn taking_barriers(mut self, takes: bool) -> NetLink {
        self.takes_barrier = takes;
        self
    }

    /// Whether the server runs a dedup layer over a chunk
    /// ([`ChunkLink::takes_dedup`]: its registration says so). False
    /// unless set.
    pub fn taking_dedup(mut self, takes: bool) -> NetLink {
        self.takes_dedup = takes;
        self
    }

    fn addr(&self) -> SocketAddr {
        *self.addr.lock().unwrap()
    }
}

/// What the reply to an operation carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyKind {
    /// A read's bytes.
    Data,
    /// A change's acknowledgement (write, append, flush, discard): the
    /// server's boot id.
    Change,
    /// A change's acknowledgement, then its answer (a `Replay`'s rows).
    ChangeAndAnswer,
}

impl ReplyKind {
    pub fn of(op: &LinkOp<'_>) -> ReplyKind {
        match op {
            LinkOp::Read { .. } => ReplyKind::Data,
            LinkOp::Fold { .. } | LinkOp::Layer { .. } => ReplyKind::ChangeAndAnswer,
            _ => ReplyKind::Change,
        }
    }
}

/// Checks the reply of a change (write, flush, discard, fold) against the
/// boot id the chunk's server gave at open: another id means the server
/// restarted in between, and writes it acknowledged before may be lost
/// (a crash drops unsynced writes), so the shard is failed rather than
/// trusted. A read's reply is data, passed on; a fold's answer, after
/// the boot id, too.
pub fn check_boot(
    kind: ReplyKind,
    boot_id: u64,
    reply: io::Result<Vec<u8>>,
    what: &dyn Fn() -> String,
) -> io::Result<Vec<u8>> {
    let mut payload = reply?;
    let boot = boot_id.to_le_bytes();
    let (acknowledged, answer) = match kind {
        ReplyKind::Data => return Ok(payload),
        ReplyKind::Change => (payload.as_slice() == boot, 0),
        ReplyKind::ChangeAndAnswer => (payload.starts_with(&boot), boot.len()),
    };
    if !acknowledged {
        return Err(io::Error::other(format!(
            "{} restarted since this writer opened the chunk (its boot id changed): writes \
             it acknowledged before may be lost",
            what()
        )));
    }
    Ok(match kind {
        ReplyKind::ChangeAndAnswer => payload.split_off(answer),
        _ => Vec::new(),
    })
}

/// Replies of the frames of one operation, joined, each checked.
struct Frames {
    rxs: Vec<mpsc::Receiver<io::Result<Vec<u8>>>>,
    kind: ReplyKind,
    boot_id: u64,
    what: String,
    /// The link's flag, for a change (`changes_chunk`).
    unanswered: Option<Arc<AtomicBool>>,
}

impl PendingReply for Frames {
    fn wait(self: Box<Self>) -> io::Result<Vec<u8>> {
        let what = &self.what;
        let replies = self.rxs.into_iter().map(Wire::wait);
        join_replies(
            replies,
            self.kind,
            self.boot_id,
            self.unanswered.as_deref(),
            &|| what.clone(),
        )
    }
}

/// The replies of one operation's frames, in order, each checked with
/// [`check_boot`], joined: the first error, or the bytes of all (the same
/// for every link: the network's and the cluster simulator's). A reply
/// that never came sets `unanswered` (the link's flag, given for a
/// change: [`ChunkLink::unanswered`]).
pub fn join_replies(
    replies: impl IntoIterator<Item = io::Result<Vec<u8>>>,
    kind: ReplyKind,
    boot_id: u64,
    unanswered: Option<&AtomicBool>,
    what: &dyn Fn() -> String,
) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut first_error = None;
    for reply in replies {
        if let (Some(flag), true) = (unanswered, reply.as_ref().is_err_and(outcome_unknown)) {
            flag.store(true, SeqCst);
        }
        match check_boot(kind, boot_id, reply, what) {
            Ok(bytes) if first_error.is_none() => out.extend_from_slice(&bytes),
            Ok(_) => {}
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

impl ChunkLink for NetLink {
    fn send(&self, op: LinkOp<'_>) -> Box<dyn PendingReply> {
        if let Some(reason) = self.wire.fenced() {
            return Box::new(Ready(Err(Fenced::error(reason))));
        }
        let w = &self.wire;
        let kind = ReplyKind::of(&op);
        let purpose = Purpose::of(&op);
        let changes = changes_chunk(&op);
        let (pg_epoch, in_flight) = self.pg_epoch.begin();
        let addr = self.addr();
        let rxs = link_frames(
            w.volume_id,
            w.epoch,
            pg_epoch,
            self.code,
            op,
            self.takes_dedup,
            self.layered.load(SeqCst),
        )
        .into_iter()
        .map(|(h, payload)| w.send_frame(purpose, addr, h, payload, Some(Arc::clone(&in_flight))))
        .collect();
        Box::new(Frames {
            rxs,
            kind,
            boot_id: self.boot_id,
            what: format!("server {} ({addr})", self.server),
            unanswered: changes.then(|| Arc::clone(&self.unanswered)),
        })
    }

    fn unanswered(&self) -> bool {
        self.unanswered.load(SeqCst)
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn describe(&self) -> String {
        let (pg, shard) = ecdedup_core::proto::chunk_parts(self.code);
        format!(
            "server {} ({}) volume {} PG {pg} shard {shard}",
            self.server,
            self.addr(),
            self.wire.volume_id
        )
    }

    fn boot_id(&self) -> Option<u64> {
        Some(self.boot_id)
    }

    fn takes_barrier(&self) -> bool {
        self.takes_barrier
    }

    fn takes_dedup(&self) -> bool {
        self.takes_dedup
    }

    fn set_layered(&self, layered: bool) {
        self.layered.store(layered, SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A flush's checksum pages and the chunk's sync travel as one
    /// `LogAppend` with FUA; pages beyond one frame go as `Write` frames,
    /// each with FUA (the chunk may handle them in any order, so no one
    /// frame's sync could cover the others).
    #[test]
    fn a_durable_append_is_one_fua_frame_or_fua_writes_beyond_a_frame() {
        let page = vec![7u8; 4096];
        let writes = [(0u64, &page[..]), (65536, &page[..])];
        let frames = link_frames(
            1,
            2,
            0,
            3,
            LinkOp::Append {
                writes: &writes,
                fua: true,
            },
            false,
            false,
        );
        assert_eq!(frames.len(), 1);
        assert_eq!(frames[0].0.op, Op::LogAppend);
        assert_ne!(frames[0].0.flags & FLAG_FUA, 0, "durable before the answer");
        let plain = link_frames(
            1,
            2,
            0,
            3,
            LinkOp::Append {
                writes: &writes,
                fua: false,
            },
            false,
            false,
        );
        assert_eq!(plain[0].0.flags & FLAG_FUA, 0);
        let many: Vec<(u64, &[u8])> = (0..1100u64).map(|i| (i * 4096, &page[..])).collect();
        let frames = link_frames(
            1,
            2,
            0,
            3,
            LinkOp::Append {
                writes: &many,
                fua: true,
            },
            false,
            false,
        );
        assert_eq!(frames.len(), 1100);
        assert!(frames
            .iter()
            .all(|(h, _)| h.op == Op::Write && h.flags & FLAG_FUA != 0));
    }

    #[test]
    fn a_fold_travels_as_one_replay_frame_and_its_answer_follows_the_boot_id() {
        use ecdedup_core::media::fold::{Fold, Row, Term};
        let fold = Fold {
            block_bytes: 4096,
            rows: vec![Row {
                parity: 8192,
                expected_crc32c: 1,
                terms: vec![Term {
                    coefficient: 3,
                    at: 0,
                    len: 4096,
                    a: 65536,
                    b: None,
                }],
            }],
        };
        let op = LinkOp::Fold {
            fold: &fold,
            fua: true,
        };
        let frames = link_frames(7, 5, 1, 0x301, op, false, false);
        assert_eq!(frames.len(), 1);
        let (h, payload) = &frames[0];
        assert_eq!(
            (h.op, h.offset, h.flags & FLAG_FUA),
            (Op::Replay, 8192, FLAG_FUA)
        );
        assert_eq!(
            ecdedup_core::proto::frame::decode_replay(payload).unwrap(),
            fold
        );
        let what = || "server 1".to_string();
        let kind = ReplyKind::of(&op);
        let mut reply = 42u64.to_le_bytes().to_vec();
        reply.extend_from_slice(b"rows");
        assert_eq!(
            check_boot(kind, 42, Ok(reply.clone()), &what).unwrap(),
            b"rows"
        );
        // Another boot id: the server restarted, whatever it answered.
        let e = check_boot(kind, 43, Ok(reply), &what).unwrap_err();
        assert!(e.to_string().contains("restarted"), "{e}");
        // A plain change's reply is the boot id alone.
        let change = ReplyKind::of(&LinkOp::Sync);
        let mut longer = 42u64.to_le_bytes().to_vec();
        longer.push(0);
        assert!(check_boot(change, 42, Ok(longer), &what).is_err());
    }

    #[test]
    fn a_pg_epoch_change_pushes_only_after_the_old_epochs_requests_are_answered() {
        let epoch = PgEpoch::new(1);
        let (stamp, in_flight) = epoch.begin();
        assert_eq!(stamp, 1);
        let log = Arc::new(Mutex::new(Vec::new()));
        let changer = {
            let (epoch, log) = (Arc::clone(&epoch), Arc::clone(&log));
            std::thread::spawn(move || {
                epoch.change(2, Duration::from_secs(600), || {
                    log.lock().unwrap().push("pushed at 2");
                    "the push's result"
                })
            })
        };
        // Give a change that does not wait the time to push first.
        std::thread::sleep(Duration::from_millis(50));
        log.lock().unwrap().push("old request answered");
        drop(in_flight);
        assert_eq!(changer.join().unwrap(), "the push's result");
        assert_eq!(
            *log.lock().unwrap(),
            ["old request answered", "pushed at 2"]
        );
        // Requests after it carry the new epoch.
        assert_eq!(epoch.begin().0, 2);
    }

    #[test]
    fn a_pg_epoch_change_stops_waiting_at_its_bound_and_moves_on() {
        let epoch = PgEpoch::new(4);
        // A request whose reply never comes (its timeout is the bound).
        let (_, stuck) = epoch.begin();
        let pushed = epoch.change(5, Duration::from_millis(10), || true);
        assert!(pushed);
        assert_eq!(epoch.get(), 5);
        drop(stuck);
        assert_eq!(epoch.begin().0, 5);
    }
}
