//! One message of the data protocol: a 64-byte header, then
//! `payload_bytes` bytes of payload (docs/cluster.md, "The data protocol's
//! frame", draws the header byte by byte).
//!
//! The header is fixed-size and little-endian so that a reader needs no
//! parser state: read 64 bytes, [`Header::decode`] them (magic, version,
//! header CRC, flags, op, a reply's status, payload bound, in that order),
//! read the payload the header announces, [`Header::check_payload`] it. Both CRCs
//! are CRC32C (the checksum the store already uses for every block), so a
//! flipped bit on the wire or a peer that lost its framing is an error,
//! never a request acted on.

use crate::media::fold::{Fold, Row, RowAnswer, Term, FOLD_ROWS_MAX, FOLD_TERMS_MAX};
use std::fmt;
use std::io::Read;

/// Bytes of every header.
pub const HEADER_BYTES: usize = 64;
/// The first four bytes of every frame.
pub const MAGIC: [u8; 4] = *b"ECDF";
/// The protocol version this code speaks: 2 since a request's word at
/// byte 36 carries its PG epoch (issue 20; in version 1 it was a status
/// that had to be 0). A frame of another version is refused by name.
pub const VERSION: u8 = 2;
/// The largest payload a frame may carry: a 4 MiB stripe unit (the largest
/// the array allows) plus room for its per-block checksums. A header that
/// announces more is refused before anything is allocated for it.
pub const PAYLOAD_BYTES_MAX: u32 = (4 << 20) + (64 << 10);

/// Flag: the write is durable before its reply (NBD's FUA).
pub const FLAG_FUA: u16 = 1 << 0;
/// Flag: this frame is a reply to the request with the same `request_id`.
pub const FLAG_REPLY: u16 = 1 << 1;
/// Flag: a `Write` of parity (a dedup layer at the chunk fingerprints by
/// class: [`crate::dedup::DedupConfig::hashes`]). Sent only to a server
/// that takes a dedup layer (`dedup-layer` in its registration's
/// features); a server from before refuses the bit (an unknown flag).
pub const FLAG_PARITY: u16 = 1 << 2;
/// Flag: a `Write` of metadata (never fingerprinted); as [`FLAG_PARITY`].
pub const FLAG_METADATA: u16 = 1 << 3;
/// Flag: a `Write` that replaces content found corrupt
/// ([`crate::media::WriteHint::repair`]: a dedup layer restores the
/// shared copy instead of referring to it); as [`FLAG_PARITY`].
pub const FLAG_REPAIR: u16 = 1 << 4;
/// Flag: the sender reaches this chunk through a dedup layer at its
/// server (it started one there: `Op::Layer` answered 1). A server
/// refuses a request with the flag for a chunk that has no layer (any
/// range), and one without it on the data area of a chunk that has one
/// (a spec gone, or back, behind the writer's back: remapped bytes must
/// not be read raw, nor raw bytes through a map); as [`FLAG_PARITY`].
pub const FLAG_LAYERED: u16 = 1 << 5;
/// Every flag this version knows; any other bit set is an error.
pub const FLAGS_KNOWN: u16 =
    FLAG_FUA | FLAG_REPLY | FLAG_PARITY | FLAG_METADATA | FLAG_REPAIR | FLAG_LAYERED;

/// A field of the header that holds one of a closed set of codes: the enum,
/// every value in code order (`ALL`), and the value of a code, if any.
macro_rules! wire_enum {
    ($(#[$doc:meta])* $name:ident: $repr:ty { $($(#[$vdoc:meta])* $variant:ident = $code:expr,)* }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr($repr)]
        pub enum $name {
            $($(#[$vdoc])* $variant = $code,)*
        }

        impl $name {
            /// Every value, in code order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];

            fn from_code(code: $repr) -> Option<$name> {
                $name::ALL.iter().copied().find(|v| *v as $repr == code)
            }
        }
    };
}

wire_enum! {
    /// What a frame asks for (a request) or answers (with [`FLAG_REPLY`]).
    Op: u8 {
        /// The handshake: proves the cluster key and names the sender.
        Hello = 1,
        /// Read `length` bytes of a chunk at `offset` (checked against the
        /// stored checksums by the chunk server).
        Read = 2,
        /// Write the payload into a chunk at `offset` (data or parity).
        Write = 3,
        /// A parity-journal append (plog, parix's d(r)): the payload is
        /// the append's writes ([`encode_append`]: the records' runs, then
        /// the journal's length hint), which the chunk server makes in
        /// that order before it answers; with [`FLAG_FUA`], durably.
        LogAppend = 4,
        /// A parity server's answer to a parix append it cannot apply: it
        /// lacks d(0), which the data server then supplies.
        NeedD0 = 5,
        /// A replay's parity fold at the chunk that holds the parity and
        /// its journal: the payload is a [`Fold`] ([`encode_replay`]: each
        /// parity block's offset and expected CRC32C, and its terms
        /// `c * (a ^ b)` over chunk ranges), which the chunk server runs
        /// (`media::fold::run`); the reply is the boot id, then each row's
        /// answer ([`encode_replay_answers`]); with [`FLAG_FUA`], the
        /// folded rows durable before it.
        Replay = 6,
        /// Make every acknowledged write of the volume durable.
        Flush = 7,
        /// A new writer's epoch for the volume, pushed before it writes.
        SetEpoch = 8,
        /// Read the checksums of a range (to check a decode).
        ReadChecksums = 9,
        /// Open a chunk, creating it (sparse) if absent: the payload is
        /// its size, 8 bytes LE; the reply's the size and whether it was
        /// made now (1 byte).
        Open = 10,
        /// Make `[offset, offset + n)` of a chunk read as zeroes: the
        /// payload is n, 8 bytes LE (a discard may pass `length`'s bound).
        Discard = 11,
        /// Run a dedup layer over a chunk at its server: the payload is a
        /// [`LayerSpec`] ([`encode_layer`]); the reply is the boot id, then
        /// one byte: 1 where the chunk's layer runs at the server from now
        /// on, 0 where it has none and none was asked made (the writer
        /// then runs the chunk's layer itself, as before the late evening of 2026-11-29).
        Layer = 12,
    }
}

wire_enum! {
    /// The outcome a reply carries (a request's bytes 36..40 hold its PG
    /// epoch instead).
    Status: u32 {
        Ok = 0,
        /// The frame's writer epoch is lower than the highest the chunk
        /// server has seen for the volume: a newer writer took it over.
        EpochTooOld = 1,
        /// The frame's placement-group epoch is older than the server's.
        PgEpochTooOld = 2,
        /// The chunk server does not hold that placement group.
        NotHere = 3,
        /// A medium error, or a checksum the data failed: the data is not
        /// returned.
        Io = 4,
        /// The device is full.
        NoSpace = 5,
        /// A request the server refused as malformed (out of range, bad
        /// length).
        Invalid = 6,
    }
}

/// Why a frame was refused. Each one closes the connection it came on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// The stream ended inside a frame (after `got` of `want` bytes).
    Truncated {
        want: usize,
        got: usize,
    },
    BadMagic([u8; 4]),
    UnsupportedVersion(u8),
    UnknownFlags(u16),
    UnknownOp(u8),
    UnknownStatus(u32),
    PayloadTooLarge(u32),
    HeaderChecksum {
        stored: u32,
        computed: u32,
    },
    PayloadChecksum {
        stored: u32,
        computed: u32,
    },
    /// The payload handed to [`Header::check_payload`] is not the length
    /// the header announced.
    PayloadLength {
        announced: u32,
        got: usize,
    },
    /// The stream failed (not a protocol error).
    Io(std::io::ErrorKind),
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::Truncated { want, got } => {
                write!(f, "stream ended inside a frame ({got} of {want} bytes)")
            }
            FrameError::BadMagic(m) => write!(f, "bad magic {m:02x?} (not an ecdedup peer?)"),
            FrameError::UnsupportedVersion(v) => {
                write!(f, "protocol version {v} (this server speaks {VERSION})")
            }
            FrameError::UnknownFlags(x) => write!(f, "unknown flags {x:#06x}"),
            FrameError::UnknownOp(op) => write!(f, "unknown op {op}"),
            FrameError::UnknownStatus(s) => write!(f, "unknown status {s}"),
            FrameError::PayloadTooLarge(n) => {
                write!(f, "payload of {n} bytes (at most {PAYLOAD_BYTES_MAX})")
            }
            FrameError::HeaderChecksum { stored, computed } => write!(
                f,
                "header checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
            ),
            FrameError::PayloadChecksum { stored, computed } => write!(
                f,
                "payload checksum mismatch (stored {stored:#010x}, computed {computed:#010x})"
            ),
            FrameError::PayloadLength { announced, got } => {
                write!(
                    f,
                    "payload of {got} bytes where the header announced {announced}"
                )
            }
            FrameError::Io(kind) => write!(f, "connection: {kind}"),
        }
    }
}

impl std::error::Error for FrameError {}

/// A chunk's dedup layer, run at its server (`Op::Layer`): the settings,
/// where the layer's data area lies on the chunk (it remaps
/// `[data_offset, data_offset + data_bytes)`, passes the bytes before it
/// through and takes none past its end), and whether it starts empty
/// (`fresh`: a new or blank chunk; otherwise the server opens the layer
/// it has, or answers that it has none).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LayerSpec {
    pub config: crate::dedup::DedupConfig,
    pub data_offset: u64,
    pub data_bytes: u64,
    pub fresh: bool,
}

/// Bytes a [`LayerSpec`] payload may take (JSON, a few hundred).
pub const LAYER_SPEC_BYTES_MAX: usize = 4096;

impl LayerSpec {
    /// The spec as the server stores it: everything but `fresh`.
    pub fn same_layer(&self, other: &LayerSpec) -> bool {
        self.config == other.config
            && self.data_offset == other.data_offset
            && self.data_bytes == other.data_bytes
    }

    /// Whether the layer can run over a chunk of `size` bytes: a dedup
    /// policy, a block the layer takes, its data area inside the chunk
    /// on block bounds.
    pub fn check(&self, size: u64) -> Result<(), String> {
        let block = u64::from(self.config.block_bytes);
        if self.config.policy == crate::dedup::Policy::None {
            return Err("a dedup layer with policy none".into());
        }
        self.config
            .validate(self.config.block_bytes)
            .map_err(|e| e.to_string())?;
        if !self.data_offset.is_multiple_of(block)
            || !self.data_bytes.is_multiple_of(block)
            || self.data_bytes == 0
        {
            return Err(format!(
                "a data area at {} of {} bytes, not on {block}-byte blocks",
                self.data_offset, self.data_bytes
            ));
        }
        match self.data_offset.checked_add(self.data_bytes) {
            Some(end) if end <= size => Ok(()),
            _ => Err(format!(
                "a data area at {} of {} bytes past the chunk's {size}",
                self.data_offset, self.data_bytes
            )),
        }
    }

    /// Whether `[offset, offset + len)` lies wholly on one side of the
    /// data area's start and, past it, inside the area (what the layer
    /// takes: it refuses a range across its start).
    pub fn takes_range(&self, offset: u64, len: u64) -> bool {
        let Some(end) = offset.checked_add(len) else {
            return false;
        };
        end <= self.data_offset
            || (offset >= self.data_offset && end <= self.data_offset + self.data_bytes)
    }
}

/// The payload of an `Op::Layer`.
pub fn encode_layer(spec: &LayerSpec) -> Vec<u8> {
    serde_json::to_vec(spec).expect("a layer spec encodes")
}

/// Reads an `Op::Layer` payload; a malformed one is an error, never a
/// panic.
pub fn decode_layer(payload: &[u8]) -> Result<LayerSpec, String> {
    if payload.len() > LAYER_SPEC_BYTES_MAX {
        return Err(format!("a layer spec of {} bytes", payload.len()));
    }
    serde_json::from_slice(payload).map_err(|e| format!("a malformed layer spec: {e}"))
}

/// Bytes before each write of a `LogAppend` payload: u64 LE chunk offset,
/// u32 LE length.
pub const APPEND_WRITE_HEADER_BYTES: usize = 12;

/// The payload of a `LogAppend`: each write as its offset (u64 LE), its
/// length (u32 LE) and its bytes, in the order they are made. A write of
/// no bytes at offset 0, between two others, is a barrier
/// (`media::batch::BARRIER`): the chunk syncs there, so the writes before
/// it are durable before any after it is made.
pub fn encode_append(writes: &[(u64, &[u8])]) -> Vec<u8> {
    let bytes = writes
        .iter()
        .map(|(_, b)| APPEND_WRITE_HEADER_BYTES + b.len())
        .sum();
    let mut out = Vec::with_capacity(bytes);
    for (offset, buf) in writes {
        out.extend_from_slice(&offset.to_le_bytes());
        out.extend_from_slice(&(buf.len() as u32).to_le_bytes());
        out.extend_from_slice(buf);
    }
    out
}

/// Whether `writes` go as one `LogAppend` frame ([`encode_append`]); a
/// larger append goes as a frame per write, in no order, so one with a
/// barrier must fit.
pub fn append_fits(writes: &[(u64, &[u8])]) -> bool {
    let bytes: usize = writes
        .iter()
        .map(|(_, b)| APPEND_WRITE_HEADER_BYTES + b.len())
        .sum();
    bytes as u64 <= u64::from(PAYLOAD_BYTES_MAX)
}

/// The writes of a `LogAppend` payload, or why it is malformed (no write,
/// an empty write other than a barrier between two writes, a length past
/// the payload's end). A barrier comes back as a write of no bytes.
pub fn decode_append(payload: &[u8]) -> Result<Vec<(u64, &[u8])>, String> {
    let mut writes = Vec::new();
    let mut rest = payload;
    while !rest.is_empty() {
        let Some((head, tail)) = rest.split_at_checked(APPEND_WRITE_HEADER_BYTES) else {
            return Err(format!(
                "a LogAppend write header cut short ({} bytes)",
                rest.len()
            ));
        };
        let offset = u64::from_le_bytes(head[..8].try_into().expect("8 bytes"));
        let len = u32::from_le_bytes(head[8..].try_into().expect("4 bytes")) as usize;
        if len == 0
            && (offset != 0
                || writes
                    .last()
                    .is_none_or(|(_, b): &(u64, &[u8])| b.is_empty()))
        {
            return Err(format!("an empty LogAppend write at {offset}"));
        }
        let Some((buf, tail)) = tail.split_at_checked(len) else {
            return Err(format!(
                "a LogAppend write of {len} bytes at {offset} with {} bytes left",
                tail.len()
            ));
        };
        writes.push((offset, buf));
        rest = tail;
    }
    match writes.last() {
        None => Err("a LogAppend with no write".into()),
        Some((_, [])) => Err("a LogAppend ending with a barrier".into()),
        Some(_) => Ok(writes),
    }
}

/// Bytes before the rows of a `Replay` payload: u32 LE block bytes, u32 LE
/// rows.
pub const REPLAY_HEADER_BYTES: usize = 8;
/// Bytes of a row's header in a `Replay` payload: u64 LE parity offset,
/// u32 LE expected CRC32C, u32 LE terms.
pub const REPLAY_ROW_BYTES: usize = 16;
/// Bytes of a term in a `Replay` payload: u8 coefficient, u8 flags (bit 0:
/// `b` present), u16 zero, u32 LE offset in the parity block, u32 LE
/// length, u64 LE `a`, u64 LE `b` (0 when absent).
pub const REPLAY_TERM_BYTES: usize = 28;
/// Bytes of a row's answer in a `Replay` reply (after the boot id): u8
/// kind (0 folded, 1 mismatch, 2 unreadable), u32 LE CRC32C (the new
/// parity's; the stored one's for a mismatch; 0).
pub const REPLAY_ANSWER_BYTES: usize = 5;

// The largest fold fits a frame.
const _: () = assert!(
    REPLAY_HEADER_BYTES + FOLD_ROWS_MAX * REPLAY_ROW_BYTES + FOLD_TERMS_MAX * REPLAY_TERM_BYTES
        <= PAYLOAD_BYTES_MAX as usize
);

/// The payload of a `Replay`: the fold's header, then each row's header
/// followed by its terms.
pub fn encode_replay(fold: &Fold) -> Vec<u8> {
    let bytes =
        REPLAY_HEADER_BYTES + fold.rows.len() * REPLAY_ROW_BYTES + fold.terms() * REPLAY_TERM_BYTES;
    let mut out = Vec::with_capacity(bytes);
    out.extend_from_slice(&fold.block_bytes.to_le_bytes());
    out.extend_from_slice(&(fold.rows.len() as u32).to_le_bytes());
    for row in &fold.rows {
        out.extend_from_slice(&row.parity.to_le_bytes());
        out.extend_from_slice(&row.expected_crc32c.to_le_bytes());
        out.extend_from_slice(&(row.terms.len() as u32).to_le_bytes());
        for t in &row.terms {
            out.push(t.coefficient);
            out.push(u8::from(t.b.is_some()));
            out.extend_from_slice(&[0, 0]);
            out.extend_from_slice(&t.at.to_le_bytes());
            out.extend_from_slice(&t.len.to_le_bytes());
            out.extend_from_slice(&t.a.to_le_bytes());
            out.extend_from_slice(&t.b.unwrap_or(0).to_le_bytes());
        }
    }
    out
}

/// Takes `n` bytes off the front of `rest`, or says what was cut short.
fn take<'p>(rest: &mut &'p [u8], n: usize, what: &str) -> Result<&'p [u8], String> {
    let Some((head, tail)) = rest.split_at_checked(n) else {
        return Err(format!(
            "a Replay {what} cut short ({} of {n} bytes)",
            rest.len()
        ));
    };
    *rest = tail;
    Ok(head)
}

fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes(b.try_into().expect("4 bytes"))
}

fn le_u64(b: &[u8]) -> u64 {
    u64::from_le_bytes(b.try_into().expect("8 bytes"))
}

/// The fold of a `Replay` payload, or why it is malformed: cut short,
/// bytes left over, a count past its bound (refused before anything is
/// allocated for it), unknown flags, a nonzero reserved field, or a fold
/// whose shape fails [`Fold::check_shape`]. The ranges are checked
/// against the chunk by [`Fold::check`].
pub fn decode_replay(payload: &[u8]) -> Result<Fold, String> {
    let mut rest = payload;
    let head = take(&mut rest, REPLAY_HEADER_BYTES, "header")?;
    let block_bytes = le_u32(&head[..4]);
    let rows = le_u32(&head[4..]) as usize;
    if rows == 0 || rows > FOLD_ROWS_MAX {
        return Err(format!("a Replay of {rows} rows (1 to {FOLD_ROWS_MAX})"));
    }
    let mut fold = Fold {
        block_bytes,
        rows: Vec::with_capacity(rows),
    };
    let mut terms_total = 0usize;
    for _ in 0..rows {
        let r = take(&mut rest, REPLAY_ROW_BYTES, "row")?;
        let terms = le_u32(&r[12..]) as usize;
        terms_total = terms_total.saturating_add(terms);
        if terms_total > FOLD_TERMS_MAX {
            return Err(format!("a Replay of more than {FOLD_TERMS_MAX} terms"));
        }
        let mut row = Row {
            parity: le_u64(&r[..8]),
            expected_crc32c: le_u32(&r[8..12]),
            terms: Vec::with_capacity(terms),
        };
        for _ in 0..terms {
            let t = take(&mut rest, REPLAY_TERM_BYTES, "term")?;
            let (flags, b) = (t[1], le_u64(&t[20..]));
            if flags > 1 || t[2..4] != [0, 0] || (flags == 0 && b != 0) {
                return Err(format!(
                    "a Replay term with flags {flags:#04x}, reserved {:02x?} and b {b}",
                    &t[2..4]
                ));
            }
            row.terms.push(Term {
                coefficient: t[0],
                at: le_u32(&t[4..8]),
                len: le_u32(&t[8..12]),
                a: le_u64(&t[12..20]),
                b: (flags == 1).then_some(b),
            });
        }
        fold.rows.push(row);
    }
    if !rest.is_empty() {
        return Err(format!(
            "a Replay with {} bytes after its last row",
            rest.len()
        ));
    }
    fold.check_shape()?;
    Ok(fold)
}

/// The rows' answers of a `Replay` reply (after the boot id).
pub fn encode_replay_answers(answers: &[RowAnswer]) -> Vec<u8> {
    let mut out = Vec::with_capacity(answers.len() * REPLAY_ANSWER_BYTES);
    for a in answers {
        let (kind, crc) = match *a {
            RowAnswer::Folded { crc32c } => (0u8, crc32c),
            RowAnswer::Mismatch { crc32c } => (1, crc32c),
            RowAnswer::Unreadable => (2, 0),
        };
        out.push(kind);
        out.extend_from_slice(&crc.to_le_bytes());
    }
    out
}

/// The answers of a `Replay` reply to a fold of `rows` rows, or why they
/// are malformed.
pub fn decode_replay_answers(bytes: &[u8], rows: usize) -> Result<Vec<RowAnswer>, String> {
    if bytes.len() != rows.saturating_mul(REPLAY_ANSWER_BYTES) {
        return Err(format!(
            "a Replay reply of {} bytes to a fold of {rows} rows",
            bytes.len()
        ));
    }
    bytes
        .chunks_exact(REPLAY_ANSWER_BYTES)
        .map(|a| {
            let crc32c = le_u32(&a[1..]);
            match a[0] {
                0 => Ok(RowAnswer::Folded { crc32c }),
                1 => Ok(RowAnswer::Mismatch { crc32c }),
                2 if crc32c == 0 => Ok(RowAnswer::Unreadable),
                kind => Err(format!(
                    "a Replay answer of kind {kind} and CRC {crc32c:#010x}"
                )),
            }
        })
        .collect()
}

/// The `pg` field of a chunk's frame: the placement group in the high 24
/// bits, the shard's position in the stripe in the low 8 (a volume's chunk
/// is named by its volume id, its PG and its shard).
pub fn chunk_code(pg: u32, shard: u32) -> u32 {
    debug_assert!(pg < 1 << 24 && shard < 1 << 8);
    (pg << 8) | (shard & 0xff)
}

/// The (PG, shard) of a chunk's `pg` field.
pub fn chunk_parts(code: u32) -> (u32, u32) {
    (code >> 8, code & 0xff)
}

/// A frame's header, decoded and checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub op: Op,
    /// [`FLAG_FUA`], [`FLAG_REPLY`].
    pub flags: u16,
    /// Chosen by the sender of a request, echoed by its reply.
    pub request_id: u64,
    pub volume_id: u64,
    /// The writer's epoch of the volume.
    pub epoch: u64,
    /// The placement group.
    pub pg: u32,
    /// A reply's outcome (Ok in every request).
    pub status: Status,
    /// A request's placement-group epoch: the epoch of the PG's record in
    /// etcd that the sender acts on (0 in requests that name no PG's
    /// chunk, and in every reply). Bytes 36..40 hold this in a request
    /// and `status` in a reply.
    pub pg_epoch: u32,
    /// Byte offset in the chunk.
    pub offset: u64,
    /// Bytes the operation covers (a read's length; a write's equals its
    /// payload's).
    pub length: u32,
    pub payload_bytes: u32,
    pub payload_crc32c: u32,
}

impl Header {
    /// A request header for `payload` (its length and CRC filled in).
    pub fn request(op: Op, request_id: u64, payload: &[u8]) -> Header {
        Header {
            op,
            flags: 0,
            request_id,
            volume_id: 0,
            epoch: 0,
            pg: 0,
            status: Status::Ok,
            pg_epoch: 0,
            offset: 0,
            length: payload.len() as u32,
            payload_bytes: payload.len() as u32,
            payload_crc32c: payload_crc(payload),
        }
    }

    /// The reply to this request, with `status` and `payload`.
    pub fn reply(&self, status: Status, payload: &[u8]) -> Header {
        Header {
            flags: (self.flags & !FLAG_FUA) | FLAG_REPLY,
            status,
            pg_epoch: 0,
            payload_bytes: payload.len() as u32,
            payload_crc32c: payload_crc(payload),
            ..*self
        }
    }

    pub fn is_reply(&self) -> bool {
        self.flags & FLAG_REPLY != 0
    }

    /// The 64 bytes on the wire.
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        assert!(
            self.payload_bytes <= PAYLOAD_BYTES_MAX,
            "payload over the frame bound"
        );
        assert_eq!(self.flags & !FLAGS_KNOWN, 0, "unknown flags");
        let mut b = [0u8; HEADER_BYTES];
        b[0..4].copy_from_slice(&MAGIC);
        b[4] = VERSION;
        b[5] = self.op as u8;
        b[6..8].copy_from_slice(&self.flags.to_le_bytes());
        b[8..16].copy_from_slice(&self.request_id.to_le_bytes());
        b[16..24].copy_from_slice(&self.volume_id.to_le_bytes());
        b[24..32].copy_from_slice(&self.epoch.to_le_bytes());
        b[32..36].copy_from_slice(&self.pg.to_le_bytes());
        let word_36 = if self.is_reply() {
            assert_eq!(self.pg_epoch, 0, "a reply carries no PG epoch");
            self.status as u32
        } else {
            assert_eq!(self.status, Status::Ok, "a request carries no status");
            self.pg_epoch
        };
        b[36..40].copy_from_slice(&word_36.to_le_bytes());
        b[40..48].copy_from_slice(&self.offset.to_le_bytes());
        b[48..52].copy_from_slice(&self.length.to_le_bytes());
        b[52..56].copy_from_slice(&self.payload_bytes.to_le_bytes());
        b[56..60].copy_from_slice(&self.payload_crc32c.to_le_bytes());
        let crc = crc32c::crc32c(&b[..60]);
        b[60..64].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Checks and decodes 64 bytes from a peer.
    pub fn decode(b: &[u8; HEADER_BYTES]) -> Result<Header, FrameError> {
        let u16_at = |at: usize| u16::from_le_bytes([b[at], b[at + 1]]);
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        let magic: [u8; 4] = b[0..4].try_into().expect("4 bytes");
        if magic != MAGIC {
            return Err(FrameError::BadMagic(magic));
        }
        if b[4] != VERSION {
            return Err(FrameError::UnsupportedVersion(b[4]));
        }
        let stored = u32_at(60);
        let computed = crc32c::crc32c(&b[..60]);
        if stored != computed {
            return Err(FrameError::HeaderChecksum { stored, computed });
        }
        let flags = u16_at(6);
        if flags & !FLAGS_KNOWN != 0 {
            return Err(FrameError::UnknownFlags(flags));
        }
        let op = Op::from_code(b[5]).ok_or(FrameError::UnknownOp(b[5]))?;
        // Bytes 36..40: a reply's status, a request's PG epoch.
        let (status, pg_epoch) = if flags & FLAG_REPLY != 0 {
            let code = u32_at(36);
            let status = Status::from_code(code).ok_or(FrameError::UnknownStatus(code))?;
            (status, 0)
        } else {
            (Status::Ok, u32_at(36))
        };
        let payload_bytes = u32_at(52);
        if payload_bytes > PAYLOAD_BYTES_MAX {
            return Err(FrameError::PayloadTooLarge(payload_bytes));
        }
        Ok(Header {
            op,
            flags,
            request_id: u64_at(8),
            volume_id: u64_at(16),
            epoch: u64_at(24),
            pg: u32_at(32),
            status,
            pg_epoch,
            offset: u64_at(40),
            length: u32_at(48),
            payload_bytes,
            payload_crc32c: u32_at(56),
        })
    }

    /// Checks that `payload` is the one this header announced.
    pub fn check_payload(&self, payload: &[u8]) -> Result<(), FrameError> {
        if payload.len() != self.payload_bytes as usize {
            return Err(FrameError::PayloadLength {
                announced: self.payload_bytes,
                got: payload.len(),
            });
        }
        let computed = payload_crc(payload);
        if computed != self.payload_crc32c {
            return Err(FrameError::PayloadChecksum {
                stored: self.payload_crc32c,
                computed,
            });
        }
        Ok(())
    }
}

/// The CRC of a payload; 0 for none.
fn payload_crc(payload: &[u8]) -> u32 {
    if payload.is_empty() {
        0
    } else {
        crate::codec::crc32c(payload)
    }
}

/// Fills `buf` from `r`; `Truncated` when the stream ends first.
fn read_exact_or_truncated(r: &mut impl Read, buf: &mut [u8]) -> Result<(), FrameError> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => {
                return Err(FrameError::Truncated {
                    want: buf.len(),
                    got,
                })
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(FrameError::Io(e.kind())),
        }
    }
    Ok(())
}

/// Reads one whole frame from a stream: its header, checked, then its
/// payload into `payload` (resized to the announced length, which the
/// header check bounds), checked. `Ok(None)` at a clean end of stream
/// (no byte of a next frame).
pub fn read_frame(r: &mut impl Read, payload: &mut Vec<u8>) -> Result<Option<Header>, FrameError> {
    let mut b = [0u8; HEADER_BYTES];
    match read_exact_or_truncated(r, &mut b) {
        Err(FrameError::Truncated { got: 0, .. }) => return Ok(None),
        other => other?,
    }
    let header = Header::decode(&b)?;
    payload.clear();
    payload.resize(header.payload_bytes as usize, 0);
    read_exact_or_truncated(r, payload)?;
    header.check_payload(payload)?;
    Ok(Some(header))
}

/// Appends one frame (header and payload) to `out`.
pub fn write_frame(out: &mut Vec<u8>, header: &Header, payload: &[u8]) {
    debug_assert_eq!(payload.len(), header.payload_bytes as usize);
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(payload);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arb_header() -> impl Strategy<Value = (Header, Vec<u8>)> {
        (
            0..Op::ALL.len(),
            any::<bool>(),
            any::<bool>(),
            0..Status::ALL.len(),
            any::<[u64; 4]>(),
            any::<[u32; 3]>(),
            proptest::collection::vec(any::<u8>(), 0..300),
        )
            .prop_map(
                |(op, fua, reply, status, w, [pg, length, pg_epoch], payload)| {
                    let mut h = Header::request(Op::ALL[op], w[0], &payload);
                    h.volume_id = w[1];
                    h.epoch = w[2];
                    h.offset = w[3];
                    h.pg = pg;
                    h.length = length;
                    h.pg_epoch = pg_epoch;
                    h.flags = if fua { FLAG_FUA } else { 0 };
                    if reply {
                        h = h.reply(Status::ALL[status], &payload);
                    }
                    (h, payload)
                },
            )
    }

    proptest! {
        #[test]
        fn every_header_decodes_to_itself((h, payload) in arb_header()) {
            let b = h.encode();
            prop_assert_eq!(Header::decode(&b), Ok(h));
            let mut wire = Vec::new();
            write_frame(&mut wire, &h, &payload);
            let mut got = Vec::new();
            let mut r = &wire[..];
            prop_assert_eq!(read_frame(&mut r, &mut got), Ok(Some(h)));
            prop_assert_eq!(&got, &payload);
            prop_assert_eq!(read_frame(&mut r, &mut got), Ok(None));
        }

        #[test]
        fn every_flipped_header_bit_is_refused((h, _) in arb_header(), bit in 0..HEADER_BYTES * 8) {
            let mut b = h.encode();
            b[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(Header::decode(&b).is_err());
        }

        #[test]
        fn every_flipped_payload_bit_is_refused((h, payload) in arb_header(), bit in any::<usize>()) {
            prop_assume!(!payload.is_empty());
            let mut wire = Vec::new();
            write_frame(&mut wire, &h, &payload);
            let at = HEADER_BYTES + (bit / 8) % payload.len();
            wire[at] ^= 1 << (bit % 8);
            let r = read_frame(&mut &wire[..], &mut Vec::new());
            prop_assert!(matches!(r, Err(FrameError::PayloadChecksum { .. })), "{:?}", r);
        }

        #[test]
        fn a_stream_cut_anywhere_inside_a_frame_is_truncated((h, payload) in arb_header(), cut in any::<usize>()) {
            let mut wire = Vec::new();
            write_frame(&mut wire, &h, &payload);
            let cut = 1 + cut % (wire.len() - 1);
            let r = read_frame(&mut &wire[..cut], &mut Vec::new());
            prop_assert!(matches!(r, Err(FrameError::Truncated { .. })), "{:?}", r);
        }
    }

    /// A header with valid checksums but `edit` applied to its bytes.
    fn resealed(edit: impl FnOnce(&mut [u8; HEADER_BYTES])) -> [u8; HEADER_BYTES] {
        let mut b = Header::request(Op::Write, 7, b"abc").encode();
        edit(&mut b);
        let crc = crc32c::crc32c(&b[..60]);
        b[60..64].copy_from_slice(&crc.to_le_bytes());
        b
    }

    #[test]
    fn an_oversized_payload_is_refused_before_anything_is_allocated() {
        let b = resealed(|b| b[52..56].copy_from_slice(&u32::MAX.to_le_bytes()));
        assert_eq!(
            Header::decode(&b),
            Err(FrameError::PayloadTooLarge(u32::MAX))
        );
        // Through the stream reader too: the 4 GiB announced is never read.
        let mut buf = Vec::new();
        assert_eq!(
            read_frame(&mut &b[..], &mut buf),
            Err(FrameError::PayloadTooLarge(u32::MAX))
        );
        assert_eq!(buf.capacity(), 0);
    }

    #[test]
    fn unknown_ops_flags_statuses_and_versions_are_refused_by_name() {
        assert_eq!(
            Header::decode(&resealed(|b| b[5] = 200)),
            Err(FrameError::UnknownOp(200))
        );
        assert_eq!(
            Header::decode(&resealed(|b| b[6] = 0x80)),
            Err(FrameError::UnknownFlags(0x80))
        );
        assert_eq!(
            Header::decode(&resealed(|b| {
                b[6] = FLAG_REPLY as u8;
                b[36] = 99
            })),
            Err(FrameError::UnknownStatus(99))
        );
        // Version 1 (whose requests had a status of 0 where the PG epoch
        // now is) is refused by name, not misread.
        assert_eq!(
            Header::decode(&resealed(|b| b[4] = 1)),
            Err(FrameError::UnsupportedVersion(1))
        );
        let mut http = [0u8; HEADER_BYTES];
        http[..4].copy_from_slice(b"GET ");
        assert_eq!(Header::decode(&http), Err(FrameError::BadMagic(*b"GET ")));
    }

    #[test]
    fn a_reply_echoes_the_request_and_carries_its_status() {
        let mut req = Header::request(Op::Write, 41, b"data");
        req.volume_id = 3;
        req.epoch = 17;
        req.flags = FLAG_FUA;
        req.pg_epoch = 5;
        assert_eq!(Header::decode(&req.encode()), Ok(req));
        let rep = req.reply(Status::EpochTooOld, &[]);
        assert!(rep.is_reply());
        assert_eq!((rep.request_id, rep.volume_id, rep.epoch), (41, 3, 17));
        assert_eq!((rep.status, rep.pg_epoch), (Status::EpochTooOld, 0));
        assert_eq!(rep.encode()[36], Status::EpochTooOld as u8);
        assert_eq!(Header::decode(&rep.encode()), Ok(rep));
    }

    #[test]
    fn the_header_layout_is_the_documented_one() {
        let mut h = Header::request(Op::Read, 0x0102030405060708, &[]);
        h.volume_id = 9;
        h.epoch = 10;
        h.pg = 11;
        h.offset = 12;
        h.length = 13;
        h.pg_epoch = 14;
        let b = h.encode();
        assert_eq!(&b[0..4], b"ECDF");
        assert_eq!(b[4], 2);
        assert_eq!(b[5], Op::Read as u8);
        assert_eq!(b[8], 0x08);
        assert_eq!(b[16], 9);
        assert_eq!(b[24], 10);
        assert_eq!(b[32], 11);
        assert_eq!(b[36], 14, "a request's PG epoch");
        assert_eq!(b[40], 12);
        assert_eq!(b[48], 13);
    }

    #[test]
    fn a_layer_spec_round_trips_and_a_malformed_or_misplaced_one_is_refused() {
        let spec = LayerSpec {
            config: crate::dedup::DedupConfig {
                policy: crate::dedup::Policy::Parity,
                ..Default::default()
            },
            data_offset: 64 << 10,
            data_bytes: 960 << 10,
            fresh: true,
        };
        let bytes = encode_layer(&spec);
        assert_eq!(decode_layer(&bytes), Ok(spec.clone()));
        assert_eq!(spec.check(1 << 20), Ok(()));
        assert!(spec.same_layer(&LayerSpec {
            fresh: false,
            ..spec.clone()
        }));
        // Past the chunk, off the dedup block, no policy, a bad block:
        // refused with the reason.
        assert!(spec.check((1 << 20) - 4096).is_err());
        for bad in [
            LayerSpec {
                data_offset: 1000,
                ..spec.clone()
            },
            LayerSpec {
                data_bytes: 0,
                ..spec.clone()
            },
            LayerSpec {
                data_bytes: u64::MAX - 4095,
                ..spec.clone()
            },
        ] {
            assert!(bad.check(1 << 20).is_err(), "{bad:?}");
        }
        let mut none = spec.clone();
        none.config.policy = crate::dedup::Policy::None;
        assert!(none.check(1 << 20).is_err());
        let mut odd = spec.clone();
        odd.config.block_bytes = 6000;
        assert!(odd.check(1 << 20).is_err());
        // Ranges: on one side of the data area's start, inside its end.
        assert!(spec.takes_range(0, 64 << 10));
        assert!(spec.takes_range(64 << 10, 4096));
        assert!(!spec.takes_range((64 << 10) - 4096, 8192));
        assert!(!spec.takes_range((1 << 20) - 4096, 8192));
        assert!(!spec.takes_range(u64::MAX, 2));
        for malformed in [&b"{"[..], b"", b"[]", &vec![b' '; LAYER_SPEC_BYTES_MAX + 1]] {
            assert!(decode_layer(malformed).is_err());
        }
    }

    #[test]
    fn a_log_append_payload_round_trips_and_a_malformed_one_is_refused() {
        let writes: Vec<(u64, &[u8])> = vec![(4096, b"records"), (131072, b"hint")];
        let payload = encode_append(&writes);
        assert_eq!(decode_append(&payload).unwrap(), writes);
        let why = |p: &[u8]| decode_append(p).unwrap_err();
        assert!(why(&[]).contains("no write"));
        assert!(why(&payload[..5]).contains("cut short"));
        assert!(why(&payload[..payload.len() - 1]).contains("bytes left"));
        assert!(why(&encode_append(&[(8, b"")])).contains("empty"));
        // A barrier: between two writes, at offset 0, one at a time.
        let barred: Vec<(u64, &[u8])> = vec![(4096, b"pages"), (0, b""), (65536, b"directory")];
        assert_eq!(decode_append(&encode_append(&barred)).unwrap(), barred);
        assert!(why(&encode_append(&[(0, b""), (8, b"x")])).contains("empty"));
        assert!(why(&encode_append(&[(8, b"x"), (0, b"")])).contains("ending with a barrier"));
        assert!(why(&encode_append(&[(8, b"x"), (4, b""), (9, b"y")])).contains("empty"));
        assert!(why(&encode_append(&[(8, b"x"), (0, b""), (0, b""), (9, b"y")])).contains("empty"));
        assert!(append_fits(&barred));
        let big = vec![0u8; PAYLOAD_BYTES_MAX as usize];
        assert!(!append_fits(&[(0, &big[..])]));
    }

    fn a_fold() -> Fold {
        let term = |coefficient, a, b| Term {
            coefficient,
            at: 0,
            len: 4096,
            a,
            b,
        };
        Fold {
            block_bytes: 4096,
            rows: vec![
                Row {
                    parity: 1 << 20,
                    expected_crc32c: 0xdead_beef,
                    terms: vec![term(0x8e, 8192, Some(16384)), term(1, 65536, None)],
                },
                Row {
                    parity: (1 << 20) + 4096,
                    expected_crc32c: 7,
                    terms: Vec::new(),
                },
            ],
        }
    }

    #[test]
    fn a_replay_payload_and_its_answers_round_trip_and_malformed_ones_are_refused() {
        let fold = a_fold();
        let payload = encode_replay(&fold);
        assert_eq!(decode_replay(&payload).unwrap(), fold);
        let why = |p: &[u8]| decode_replay(p).unwrap_err();
        assert!(why(&[]).contains("header cut short"));
        assert!(why(&payload[..payload.len() - 1]).contains("cut short"));
        let mut longer = payload.clone();
        longer.push(0);
        assert!(why(&longer).contains("after its last row"));
        // Counts past their bounds are refused before any allocation.
        let mut many = payload.clone();
        many[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(why(&many).contains("rows (1 to"));
        let mut terms = payload.clone();
        terms[REPLAY_HEADER_BYTES + 12..REPLAY_HEADER_BYTES + 16]
            .copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(why(&terms).contains("more than"));
        // A term: unknown flags, a b without its flag, a coefficient of 0,
        // a range outside its parity block.
        let term_at = REPLAY_HEADER_BYTES + REPLAY_ROW_BYTES;
        let edit = |at: usize, bytes: &[u8]| {
            let mut p = payload.clone();
            p[term_at + at..term_at + at + bytes.len()].copy_from_slice(bytes);
            why(&p)
        };
        assert!(edit(1, &[2]).contains("flags"));
        assert!(edit(1, &[0]).contains("b 16384"));
        assert!(edit(0, &[0]).contains("coefficient 0"));
        assert!(edit(4, &1u32.to_le_bytes()).contains("in a parity block"));
        assert!(edit(8, &0u32.to_le_bytes()).contains("a term of 0 bytes"));
        // The answers.
        let answers = vec![
            RowAnswer::Folded { crc32c: 5 },
            RowAnswer::Mismatch { crc32c: 6 },
            RowAnswer::Unreadable,
        ];
        let bytes = encode_replay_answers(&answers);
        assert_eq!(decode_replay_answers(&bytes, 3).unwrap(), answers);
        assert!(decode_replay_answers(&bytes, 2)
            .unwrap_err()
            .contains("2 rows"));
        let mut bad = bytes.clone();
        bad[0] = 9;
        assert!(decode_replay_answers(&bad, 3)
            .unwrap_err()
            .contains("kind 9"));
    }
}
