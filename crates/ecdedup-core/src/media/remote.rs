//! A device across the network: one chunk on a chunk server
//! (docs/cluster.md, "The data path").
//!
//! The engine does not know sockets. A [`ChunkLink`] (the volume client's
//! connection to one chunk, in `ecdedup-client`; a simulated network in
//! the cluster simulator) sends one operation and hands back a
//! [`PendingReply`] at once; [`RemoteDevice`] is the [`Device`] over a
//! link, so the whole array (stripes, write policies, journals, intents,
//! checksums, decode) runs unchanged over chunks on other machines.
//!
//! A batch ([`super::batch::submit`]) sends every remote operation of the
//! batch before it waits for any reply: the units of one stripe write
//! travel to their servers in parallel, one round trip for the batch, as
//! the io_uring path submits every local unit in one system call.
//!
//! Every operation has a [`Purpose`] (a data write, a journal append, a
//! d(0) read, a replay's read...), which the link counts its messages and
//! round trips by: the op and its write class say most of it, and the
//! array names the rest for a stretch of its code with [`within`] (a
//! NEED_D0 read, a replay, a checksum page).
//!
//! Invariants: a reply is waited for once; an operation whose reply does
//! not come (a timeout, a closed connection, a refusal) is an error of
//! that device only, which the array latches like a medium error.

use super::{Device, WriteHint};
use crate::counters::IoClass;
use std::cell::Cell;
use std::io;
use std::sync::Arc;

/// The error a link gives once its writer is fenced (a newer writer of
/// the volume, or a newer placement of the PG, was heard of): inside an
/// `io::Error` of kind `PermissionDenied`, so the array tells it from a
/// device's own failure ([`is_fenced`]).
#[derive(Debug)]
pub struct Fenced(pub String);

impl std::fmt::Display for Fenced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Fenced {}

impl Fenced {
    /// The `io::Error` a fenced link answers with.
    pub fn error(reason: String) -> io::Error {
        io::Error::new(io::ErrorKind::PermissionDenied, Fenced(reason))
    }
}

/// Whether `e` is a fenced link's refusal ([`Fenced`]), not a device's
/// failure.
pub fn is_fenced(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<Fenced>())
}

/// One operation on a chunk.
#[derive(Clone, Copy, Debug)]
pub enum LinkOp<'a> {
    /// Reads `len` bytes at `offset`.
    Read { offset: u64, len: usize },
    /// Writes `buf` at `offset`; `fua`: durable before the reply. `class`:
    /// what the bytes are (for the counters, and for a dedup layer run at
    /// the chunk's server); `repair`: the bytes replace content found
    /// corrupt ([`WriteHint::repair`]).
    Write {
        offset: u64,
        buf: &'a [u8],
        fua: bool,
        class: IoClass,
        repair: bool,
    },
    /// A parity-journal append: `writes` (the records' runs, then the
    /// journal's length hint) written in this order, answered together
    /// (`proto::frame::Op::LogAppend`, one message); `fua`: the chunk
    /// synced after them, before the answer (a flush's checksum pages
    /// and the chunk's sync in one message).
    Append {
        writes: &'a [(u64, &'a [u8])],
        fua: bool,
    },
    /// A replay's parity fold, run at the chunk ([`super::fold`];
    /// `proto::frame::Op::Replay`, one message): the reply's bytes are
    /// the rows' answers (`proto::frame::encode_replay_answers`).
    Fold {
        fold: &'a super::fold::Fold,
        fua: bool,
    },
    /// Makes the chunk's completed writes durable.
    Sync,
    /// `[offset, offset+len)` reads as zeroes from now on.
    Discard { offset: u64, len: u64 },
    /// Runs the chunk's dedup layer at its server from now on
    /// (`proto::frame::Op::Layer`; only on a link that
    /// [`ChunkLink::takes_dedup`]): the reply's one byte says whether it
    /// does (1), or has none and none was asked made (0).
    Layer {
        spec: &'a crate::proto::frame::LayerSpec,
    },
}

/// Why an operation is sent: what the volume client counts messages and
/// round trips by (`cluster stats`, "wire"."by_purpose").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// A read of data or parity (a client read, read-modify-write's old
    /// values, a decode).
    Read,
    /// parix's read of the original value d(0) for a parity journal that
    /// lacks it (NEED_D0).
    D0Read,
    /// A write of data or parity in place.
    Write,
    /// A parity-journal append (its records; with its length hint when
    /// one message carries both).
    JournalAppend,
    /// A journal's length hint, written as a message of its own.
    JournalHint,
    /// A replay's read (journal records, parity).
    ReplayRead,
    /// A replay's write (folded parity, the invalidation that follows).
    ReplayWrite,
    /// A replay's parity fold run at the chunk (`Replay`): the journal
    /// records and the parity read, folded and written where they are.
    ReplayFold,
    /// A page of a chunk's checksum table, read or written.
    ChecksumPage,
    /// Any other metadata: superblocks, the metadata area's files (intent
    /// marks, logs), written outside a batch.
    Metadata,
    /// A sync of a chunk.
    Flush,
    Discard,
    /// Chunk management (`Open`, `SetEpoch`, sent beside the links;
    /// `Layer`, through one).
    Control,
}

impl Purpose {
    /// Every purpose, in counter order.
    pub const ALL: [Purpose; 13] = [
        Purpose::Read,
        Purpose::D0Read,
        Purpose::Write,
        Purpose::JournalAppend,
        Purpose::JournalHint,
        Purpose::ReplayRead,
        Purpose::ReplayWrite,
        Purpose::ReplayFold,
        Purpose::ChecksumPage,
        Purpose::Metadata,
        Purpose::Flush,
        Purpose::Discard,
        Purpose::Control,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Purpose::Read => "read",
            Purpose::D0Read => "d0_read",
            Purpose::Write => "write",
            Purpose::JournalAppend => "journal_append",
            Purpose::JournalHint => "journal_hint",
            Purpose::ReplayRead => "replay_read",
            Purpose::ReplayWrite => "replay_write",
            Purpose::ReplayFold => "replay_fold",
            Purpose::ChecksumPage => "checksum_page",
            Purpose::Metadata => "metadata",
            Purpose::Flush => "flush",
            Purpose::Discard => "discard",
            Purpose::Control => "control",
        }
    }

    /// The purpose of `op` sent from this thread now: the op and its
    /// class, within the stretch [`within`] names.
    pub fn of(op: &LinkOp<'_>) -> Purpose {
        let scope = SCOPE.with(Cell::get);
        match (op, scope) {
            (LinkOp::Sync, _) => Purpose::Flush,
            (LinkOp::Discard { .. }, _) => Purpose::Discard,
            (LinkOp::Fold { .. }, _) => Purpose::ReplayFold,
            (LinkOp::Layer { .. }, _) => Purpose::Control,
            (LinkOp::Append { .. }, Some(Scope::Replay)) => Purpose::ReplayWrite,
            (LinkOp::Append { .. }, Some(Scope::Checksums)) => Purpose::ChecksumPage,
            (LinkOp::Append { .. }, _) => Purpose::JournalAppend,
            (LinkOp::Read { .. }, Some(Scope::D0)) => Purpose::D0Read,
            (LinkOp::Read { .. }, Some(Scope::Replay)) => Purpose::ReplayRead,
            (LinkOp::Read { .. } | LinkOp::Write { .. }, Some(Scope::Checksums)) => {
                Purpose::ChecksumPage
            }
            (LinkOp::Read { .. }, _) => Purpose::Read,
            (LinkOp::Write { .. }, Some(Scope::Replay)) => Purpose::ReplayWrite,
            (LinkOp::Write { class, buf, .. }, _) => match class {
                IoClass::Data | IoClass::Parity => Purpose::Write,
                IoClass::Journal if buf.len() == super::area::HINT_BYTES => Purpose::JournalHint,
                IoClass::Journal => Purpose::JournalAppend,
                IoClass::Metadata => Purpose::Metadata,
            },
        }
    }
}

/// A stretch of the array's code whose operations have one purpose that
/// the op alone does not say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Reading d(0) for a parity journal that lacks it.
    D0,
    /// Replaying a stripe's parity journals.
    Replay,
    /// Reading or writing a checksum table's pages.
    Checksums,
}

thread_local! {
    /// The stretch this thread is in, if any ([`within`]).
    static SCOPE: Cell<Option<Scope>> = const { Cell::new(None) };
}

/// Runs `f` with this thread's operations counted as `scope`'s (the
/// outermost stretch wins: a checksum page read inside a replay is the
/// replay's).
pub fn within<T>(scope: Scope, f: impl FnOnce() -> T) -> T {
    let outer = SCOPE.with(Cell::get);
    if outer.is_some() {
        return f();
    }
    SCOPE.with(|s| s.set(Some(scope)));
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            SCOPE.with(|s| s.set(None));
        }
    }
    let _reset = Reset;
    f()
}

/// The stretch this thread is in, if any: what a thread it starts for
/// a part of the same work runs [`within`] too.
pub fn current_scope() -> Option<Scope> {
    SCOPE.with(Cell::get)
}

/// The reply to one operation, waited for once.
pub trait PendingReply: Send {
    /// Blocks until the reply: a read's bytes, empty for the other ops.
    fn wait(self: Box<Self>) -> io::Result<Vec<u8>>;
}

/// A reply known at once (a refusal before anything was sent).
pub struct Ready(pub io::Result<Vec<u8>>);

impl PendingReply for Ready {
    fn wait(self: Box<Self>) -> io::Result<Vec<u8>> {
        self.0
    }
}

/// A connection to one chunk.
pub trait ChunkLink: Send + Sync {
    /// Sends `op` and returns without waiting for its reply.
    fn send(&self, op: LinkOp<'_>) -> Box<dyn PendingReply>;
    /// The chunk's size in bytes.
    fn size(&self) -> u64;
    /// Where the chunk lives, for messages.
    fn describe(&self) -> String;
    /// The chunk server's boot id when this link opened the chunk (every
    /// change it acknowledges since carries the same: `check_boot`); None
    /// where the link cannot tell.
    fn boot_id(&self) -> Option<u64> {
        None
    }
    /// Whether sends from several threads at once are welcome (the
    /// network's links); a deterministic harness's link says no, so its
    /// frames keep the order its seed gives them.
    fn side_by_side(&self) -> bool {
        true
    }
    /// Whether the chunk's server takes a barrier inside a `LogAppend`
    /// (`proto::frame::encode_append`; a server from before 2026-11-29
    /// refuses one as `Invalid`): only then does a flush put a grown
    /// journal's directory commit in the message of the chunk's checksum
    /// pages. Default: false.
    fn takes_barrier(&self) -> bool {
        false
    }
    /// Whether the chunk's server runs a dedup layer over the chunk when
    /// asked ([`LinkOp::Layer`]; a server from before the late evening of
    /// 2026-11-29 knows no such op): then a dedup volume asks it (the
    /// server's answer decides where the layer runs: a chunk whose layer
    /// ran at its writer before keeps it there), and the writes sent say
    /// their class (parity, metadata; data and journal alike). Default:
    /// false.
    fn takes_dedup(&self) -> bool {
        false
    }
    /// Says whether this writer reaches the chunk through a dedup layer at
    /// its server (after [`LinkOp::Layer`]'s answer): a link that
    /// [takes dedup](Self::takes_dedup) then marks every request it
    /// sends but a `Layer` so (`proto::frame::FLAG_LAYERED`), and the
    /// server refuses one that disagrees with what it holds. Default:
    /// nothing.
    fn set_layered(&self, layered: bool) {
        let _ = layered;
    }
    /// Whether a change (a write, an append, a discard, a fold) sent on
    /// this link ended without its reply (no reply in time, or the
    /// connection lost after sending): its frame may still reach the
    /// server and be applied there later, after anything this writer
    /// sends since (a read or a sync landing late changes nothing). A
    /// shard whose link says so is not taken back (re-added) by this
    /// writer: a writer at a newer epoch does, whose epoch the server
    /// stores first and which then refuses that frame (docs/cluster.md,
    /// "A request without its reply"). Default: false (a local device).
    fn unanswered(&self) -> bool {
        false
    }
}

/// Whether `op` changes the chunk, so that landing late it could undo
/// what was written since ([`ChunkLink::unanswered`]).
pub fn changes_chunk(op: &LinkOp<'_>) -> bool {
    !matches!(op, LinkOp::Read { .. } | LinkOp::Sync)
}

/// Whether an error of a request sent to a chunk leaves its outcome
/// unknown ([`ChunkLink::unanswered`]): no reply in time, or the
/// connection lost (a refusal the server answered is not).
pub fn outcome_unknown(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::TimedOut | io::ErrorKind::NotConnected
    )
}

/// The [`Device`] over a [`ChunkLink`].
pub struct RemoteDevice {
    link: Arc<dyn ChunkLink>,
}

impl RemoteDevice {
    pub fn new(link: Arc<dyn ChunkLink>) -> RemoteDevice {
        RemoteDevice { link }
    }
}

/// Copies a read's reply into `buf`; a reply of another length is an
/// error (never a short read passed on as data).
pub fn fill_read(
    buf: &mut [u8],
    reply: io::Result<Vec<u8>>,
    what: &dyn Fn() -> String,
) -> io::Result<()> {
    let bytes = reply?;
    if bytes.len() != buf.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{}: a read of {} bytes answered with {}",
                what(),
                buf.len(),
                bytes.len()
            ),
        ));
    }
    buf.copy_from_slice(&bytes);
    Ok(())
}

impl Device for RemoteDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let reply = self
            .link
            .send(LinkOp::Read {
                offset,
                len: buf.len(),
            })
            .wait();
        fill_read(buf, reply, &|| self.link.describe())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.write_hinted(buf, offset, WriteHint::new(IoClass::Metadata))
    }

    fn write_hinted(&self, buf: &[u8], offset: u64, hint: WriteHint) -> io::Result<()> {
        self.link
            .send(LinkOp::Write {
                offset,
                buf,
                fua: false,
                class: hint.class,
                repair: hint.repair,
            })
            .wait()
            .map(drop)
    }

    fn sync(&self) -> io::Result<()> {
        self.link.send(LinkOp::Sync).wait().map(drop)
    }

    fn write_fua(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.link
            .send(LinkOp::Write {
                offset,
                buf,
                fua: true,
                class: IoClass::Metadata,
                repair: false,
            })
            .wait()
            .map(drop)
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.link
            .send(LinkOp::Discard { offset, len })
            .wait()
            .map(drop)
    }

    fn size(&self) -> u64 {
        self.link.size()
    }

    fn describe(&self) -> String {
        self.link.describe()
    }

    fn link(&self) -> Option<&dyn ChunkLink> {
        Some(self.link.as_ref())
    }
}
