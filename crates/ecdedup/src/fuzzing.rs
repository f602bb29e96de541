//! Entry points of the fuzz targets (`fuzz/`, cargo-fuzz) and of the corpus
//! replay test (`tests/fuzz_corpus.rs`, stable): one function per parser of
//! on-disk input. Each takes arbitrary bytes, hands them to the parser the
//! way the store reads them (from a file where the parser reads a file),
//! and returns whatever the bytes are: bad input must come back as an
//! `Err`, never as a panic, an overflow or an allocation sized by the input.
//!
//! Most formats carry CRC32C checksums, which random bytes fail, so the
//! checks behind them would never run. Each entry point therefore parses
//! twice: the bytes as given, then a copy whose checksums (and fixed magic
//! headers, where a format has one) were recomputed where the format keeps
//! them (`repair_*`; the offsets are those of docs/format.md). Where a
//! parse succeeds, the result is checked against its own encoding where
//! the format has an encoder (a round trip).
//!
//! Not an API: hidden from the docs, used only by the fuzz targets and
//! tests. Nothing here changes how the store reads its files.

use crate::archive::map::BatchMap;
use crate::array::degraded_log::DegradedLog;
use crate::array::intent;
use crate::array::journal::ParityJournal;
use crate::array::layout::SUPERBLOCK_BYTES;
use crate::array::poison::{self, PoisonList};
use crate::array::superblock::Superblock;
use crate::array::ConfigFile;
use crate::dedup::{log as dedup_log_file, DedupConfig, DedupDevice, Policy};
use crate::fingerprint::{Algorithm, CpuBackend, FingerprintBackend};
use crate::media::storage::write_atomic;
use crate::media::{MemDevice, PowerLossStorage, Storage};
use crate::ssd::trace::{OnError, TraceFormat, TraceReader, TraceRequest};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};

/// Requests a trace target reads at most (a bound on one run's time).
const TRACE_REQUESTS_MAX: usize = 4096;
/// Dedup blocks of the device under the dedup-map target.
const DEDUP_BLOCKS: u64 = 16;
const DEDUP_BLOCK_BYTES: u32 = 4096;

/// Writes the CRC32C of `b[covered]` at `b[at..at + 4]` (little endian).
fn seal(b: &mut [u8], covered: std::ops::Range<usize>, at: usize) {
    let crc = crc32c::crc32c(&b[covered]);
    b[at..at + 4].copy_from_slice(&crc.to_le_bytes());
}

/// Writes a trailing CRC32C of everything before it (when there is room).
fn seal_tail(b: &mut [u8]) {
    if let Some(at) = b.len().checked_sub(4) {
        seal(b, 0..at, at);
    }
}

/// A copy of `data[from..]`, cut or zero-padded to `len` bytes.
fn padded(data: &[u8], from: usize, len: usize) -> Vec<u8> {
    let mut b = data.get(from..).unwrap_or(&[]).to_vec();
    b.resize(len, 0);
    b
}

/// Little-endian u64 of up to 8 bytes at `data[at..]` (missing bytes are 0).
fn u64_at(data: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(padded(data, at, 8).try_into().expect("8 bytes"))
}

/// Writes a fixed 32-byte file header: magic, version, checksum at 28.
fn repair_header(b: &mut [u8], magic: &[u8; 8], version: u32) {
    if b.len() >= 32 {
        b[..8].copy_from_slice(magic);
        b[8..12].copy_from_slice(&version.to_le_bytes());
        seal(b, 0..28, 28);
    }
}

/// Little-endian u32 at `b[at..at + 4]`, as a length.
fn u32_le(b: &[u8], at: usize) -> usize {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes")) as usize
}

/// Seals the records of a log from byte `at` on, in the shape the store's
/// logs share: a `header_bytes` header, then a payload whose length
/// `repair` returns (after repairing the header in place, e.g. its own
/// checksum), a CRC32C of everything after its first 4 bytes at 0, and the
/// next record at the next multiple of `align`. Stops at the first record
/// that runs past the end.
fn seal_records(
    b: &mut [u8],
    mut at: usize,
    header_bytes: usize,
    align: usize,
    mut repair: impl FnMut(&mut [u8]) -> usize,
) {
    while at + header_bytes <= b.len() {
        let end = at + header_bytes + repair(&mut b[at..at + header_bytes]);
        if end > b.len() {
            break;
        }
        seal(b, at + 4..end, at);
        at = end.next_multiple_of(align);
    }
}

/// A file system folder of its own for one call (the dedup map is read
/// with `std::fs`), removed when dropped. Under /dev/shm where there is
/// one, so the fuzzer does not wear a disk.
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn new() -> ScratchDir {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let base = Path::new("/dev/shm");
        let base = if base.is_dir() {
            base.to_owned()
        } else {
            std::env::temp_dir()
        };
        let dir = base.join(format!(
            "ecdedup-fuzz-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("scratch folder");
        ScratchDir(dir)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A simulated storage holding `bytes` as the file `path`.
fn storage_with(path: &Path, bytes: &[u8]) -> Arc<dyn Storage> {
    let storage = PowerLossStorage::new().shared();
    storage
        .create_dir_all(path.parent().expect("a folder"))
        .expect("simulated folder");
    write_atomic(storage.as_ref(), path, bytes).expect("simulated file");
    storage
}

/// Superblock slots (`array/superblock.rs`): `data` as one slot, then its
/// first two 4 KiB as the two slots of a device.
pub fn superblock(data: &[u8]) {
    let _ = Superblock::decode(data);
    let slot = SUPERBLOCK_BYTES as usize;
    let mut slots = [padded(data, 0, slot), padded(data, slot, slot)];
    for s in &mut slots {
        s[..8].copy_from_slice(&crate::array::superblock::MAGIC);
        seal_tail(s);
        if let Ok(sb) = Superblock::decode(s) {
            assert_eq!(Superblock::decode(&sb.encode()).ok(), Some(sb));
        }
    }
    let _ = Superblock::newest(&slots[0], &slots[1]);
}

/// A device's metadata area (`media/area.rs`): the bytes are directory
/// slot 0 (padded to 64 KiB; its magic, version, area size and checksum
/// repaired in the second parse) and then the length hints. A directory
/// that opens must list files whose every byte reads back.
pub fn meta_area(data: &[u8]) {
    use crate::media::area::{self, AreaFs, AREA_BYTES_MIN, DIR_SLOT_BYTES, HINTS_OFFSET};
    let slot = DIR_SLOT_BYTES as usize;
    let hints = padded(data, slot, 4096);
    let mut repaired = padded(data, 0, slot);
    repaired[..8].copy_from_slice(&area::MAGIC);
    repaired[8..12].copy_from_slice(&area::VERSION.to_le_bytes());
    repaired[24..32].copy_from_slice(&AREA_BYTES_MIN.to_le_bytes());
    let seq = u64_at(&repaired, 16) & !1;
    repaired[16..24].copy_from_slice(&seq.to_le_bytes());
    seal_tail(&mut repaired);
    for dir in [padded(data, 0, slot), repaired] {
        let dev = Arc::new(MemDevice::new("fuzz", AREA_BYTES_MIN));
        dev.with_bytes(|b| {
            b[..slot].copy_from_slice(&dir);
            b[HINTS_OFFSET as usize..HINTS_OFFSET as usize + hints.len()].copy_from_slice(&hints);
        });
        let Ok(fs) = AreaFs::open_read_only(dev, 0, AREA_BYTES_MIN) else {
            continue;
        };
        let fs = Arc::new(fs);
        for name in fs.list() {
            let f = fs.open_file(&name).expect("a listed file opens");
            let len = f.len().expect("length");
            assert!(
                len <= AREA_BYTES_MIN,
                "{name}: {len} bytes in a smaller area"
            );
            let mut b = vec![0u8; len as usize];
            f.read_at(&mut b, 0)
                .expect("every byte of a listed file reads");
        }
    }
}

/// The write-intent map (`array/intent.rs`): the first 8 bytes are the
/// array's stripe count (within the bound a geometry allows), the rest the
/// file.
pub fn intent_map(data: &[u8]) {
    let stripes = u64_at(data, 0) % (1 << 40);
    let uuid = [0xEC; 16];
    let file = data.get(8..).unwrap_or(&[]);
    let _ = intent::parse_map(file, &uuid, stripes);
    let mut b = file.to_vec();
    if b.len() >= 4096 {
        b[..8].copy_from_slice(b"ECDDIL01");
        b[16..32].copy_from_slice(&uuid);
        seal(&mut b, 0..4092, 4092);
    }
    if let Ok((spr, map)) = intent::parse_map(&b, &uuid, stripes) {
        assert!(spr > 0 && map.len() as u64 == stripes.div_ceil(spr));
    }
}

/// A parity journal (`array/journal.rs`), opened from a simulated file.
pub fn parity_journal(data: &[u8]) {
    let path = Path::new("/j/journal");
    for bytes in [data.to_vec(), repair_journal(data)] {
        let storage = storage_with(path, &bytes);
        if let Ok(mut j) = ParityJournal::open_in(storage, path) {
            let _ = j.take_lost();
        }
    }
}

/// The journal's header (version 1 or 2 when byte 8 says so, else 3) and
/// every record's two checksums, records read at 32-byte steps.
fn repair_journal(data: &[u8]) -> Vec<u8> {
    let mut b = data.to_vec();
    let version = match data.get(8) {
        Some(&v) if v == 1 || v == 2 => v.into(),
        _ => 3,
    };
    repair_header(&mut b, b"ECDDPJ01", version);
    seal_records(&mut b, 32, 32, 32, |h| {
        seal(h, 4..28, 28);
        u32_le(h, 24)
    });
    b
}

/// The degraded-write log (`array/degraded_log.rs`), opened from a
/// simulated file. The first byte picks the block size (small ones let the
/// fuzzer write records with payload) and whether the repair also gives
/// every record the header's generation.
pub fn degraded_log(data: &[u8]) {
    let Some((&choice, file)) = data.split_first() else {
        return;
    };
    let block = [8, 64, 512, 4096][choice as usize & 3];
    let path = Path::new("/d/degraded.log");
    for bytes in [file.to_vec(), repair_degraded_log(file, choice & 4 != 0)] {
        let storage = storage_with(path, &bytes);
        if let Ok((log, _intact)) = DegradedLog::open(storage, path, block, 1 << 20) {
            let _ = log.has_stripe(u64_at(file, 48));
        }
    }
}

/// The poison list (`array/poison.rs`): parsed as given, then with its
/// magic, version (1 or 2), entry count (from its length) and checksum repaired;
/// what parses is opened from a simulated file against a small geometry
/// (entries outside it refuse the open).
pub fn poison_list(data: &[u8]) {
    let _ = poison::parse(data, "fuzz");
    let mut b = data.to_vec();
    if b.len() >= 20 {
        b[..8].copy_from_slice(b"ECDDPL01");
        // Version 1, or 2 (whose roles may carry the own-held mark).
        let version = 1 + (b[8] & 1) as u32;
        b[8..12].copy_from_slice(&version.to_le_bytes());
        let n = ((b.len() - 20) / 16) as u32;
        b[12..16].copy_from_slice(&n.to_le_bytes());
        b.truncate(16 + n as usize * 16 + 4);
        seal_tail(&mut b);
    }
    let path = Path::new("/p/poison.map");
    if let Ok(parsed) = poison::parse(&b, "fuzz") {
        assert!(parsed.set.len() <= poison::ENTRIES_MAX);
        assert!(parsed.own_held.is_subset(&parsed.set));
        let storage = storage_with(path, &b);
        if let Ok(list) = PoisonList::open(storage, path, 64, 4, 4) {
            assert_eq!(list.len(), parsed.set.len());
            assert_eq!(list.own_held().len(), parsed.own_held.len());
        }
    }
}

fn repair_degraded_log(data: &[u8], same_generation: bool) -> Vec<u8> {
    let mut b = data.to_vec();
    repair_header(&mut b, b"ECDDDW01", 1);
    let generation = u64_at(&b, 12).to_le_bytes();
    seal_records(&mut b, 32, 40, 8, |h| {
        if same_generation {
            h[8..16].copy_from_slice(&generation);
        }
        u32_le(h, 4)
    });
    b
}

/// `array.json` (`array/mod.rs`), loaded from a simulated folder.
pub fn config(data: &[u8]) {
    let dir = Path::new("/a");
    let storage = storage_with(&dir.join(crate::array::CONFIG_FILE), data);
    let _ = ConfigFile::load_in(storage.as_ref(), dir);
}

/// The dedup map's log (`dedup/log.rs`): a thin call into its reader, on
/// the bytes as given and with the header and record checksums repaired.
pub fn dedup_log(data: &[u8]) {
    let _ = dedup_log_file::Record::decode(data, dedup_log_file::LOG_VERSION);
    let _ = dedup_log_file::Record::decode(data, dedup_log_file::LOG_VERSION_MIN);
    let scratch = ScratchDir::new();
    let path = scratch.0.join("d.log");
    for bytes in [data.to_vec(), repair_dedup_log(data)] {
        std::fs::write(&path, &bytes).expect("scratch file");
        let _ = dedup_log_file::read_log(crate::media::OsStorage::shared().as_ref(), &path);
    }
}

fn repair_dedup_log(data: &[u8]) -> Vec<u8> {
    let mut b = data.to_vec();
    repair_header(
        &mut b,
        &dedup_log_file::LOG_MAGIC,
        dedup_log_file::LOG_VERSION,
    );
    let start = dedup_log_file::LOG_HEADER_BYTES as usize;
    seal_records(&mut b, start, dedup_log_file::RECORD_HEADER_BYTES, 1, |h| {
        h[5] as usize
    });
    b
}

/// The dedup map's snapshot (`dedup/log.rs`, read by `dedup/mod.rs`): the
/// reader alone, then a whole open of a dedup layer of [`DEDUP_BLOCKS`]
/// blocks over the snapshot and a log (which rebuilds the map, reference
/// counts and fingerprint index from them), then its self-check. The first
/// two bytes are the snapshot's length; the rest after it is the log.
pub fn dedup_snapshot(data: &[u8]) {
    let split = u64_at(data.get(..2).unwrap_or(data), 0) as usize;
    let body = data.get(2..).unwrap_or(&[]);
    let (snapshot, log) = body.split_at(split.min(body.len()));
    let mut log = log.to_vec();
    log.resize(log.len().max(dedup_log_file::LOG_HEADER_BYTES as usize), 0);
    let scratch = ScratchDir::new();
    let snapshot_path = scratch.0.join("d.snap");
    let log_path = scratch.0.join("d.log");
    let mut repaired = snapshot.to_vec();
    if repaired.len() >= 24 {
        repaired[..8].copy_from_slice(&dedup_log_file::SNAPSHOT_MAGIC);
        repaired[16..24].copy_from_slice(&DEDUP_BLOCKS.to_le_bytes());
    }
    seal_tail(&mut repaired);
    for bytes in [snapshot.to_vec(), repaired] {
        std::fs::write(&snapshot_path, &bytes).expect("scratch file");
        let _ = dedup_log_file::read_snapshot(
            crate::media::OsStorage::shared().as_ref(),
            &snapshot_path,
            DEDUP_BLOCKS,
        );
        std::fs::write(&log_path, repair_dedup_log(&log)).expect("scratch file");
        let config = DedupConfig {
            policy: Policy::All,
            block_bytes: DEDUP_BLOCK_BYTES,
            algorithm: Algorithm::Sha256,
            index_entries_max: DEDUP_BLOCKS,
            verify: false,
        };
        let data_bytes = DEDUP_BLOCKS * DEDUP_BLOCK_BYTES as u64;
        let inner = Arc::new(MemDevice::new("fuzz", data_bytes));
        if let Ok(layer) = DedupDevice::open(
            crate::media::OsStorage::shared(),
            inner,
            config,
            cpu_backend(),
            0,
            data_bytes,
            &scratch.0,
            "d",
            false,
        ) {
            let problems = layer.check();
            assert!(
                problems.is_empty(),
                "an opened map is consistent: {problems:?}"
            );
        }
    }
}

/// One single-threaded fingerprint backend for the whole process (a
/// backend per call would start a thread pool per call).
fn cpu_backend() -> Arc<dyn FingerprintBackend> {
    static BACKEND: OnceLock<Arc<dyn FingerprintBackend>> = OnceLock::new();
    BACKEND
        .get_or_init(|| Arc::new(CpuBackend::new(Some(1)).expect("CPU backend")))
        .clone()
}

/// Block traces (`ssd/trace.rs`) in both formats, skipping malformed lines.
pub fn trace(data: &[u8]) {
    for format in [TraceFormat::Ecdedup, TraceFormat::Fiu] {
        let mut reader = TraceReader::new(data, format, OnError::Skip);
        let mut req = TraceRequest::default();
        for _ in 0..TRACE_REQUESTS_MAX {
            match reader.next_into(&mut req) {
                Ok(true) => assert_eq!(
                    req.pages.len() as u64,
                    if req.op == crate::ssd::trace::TraceOp::Write {
                        req.length / crate::ssd::trace::TRACE_PAGE_BYTES
                    } else {
                        0
                    }
                ),
                Ok(false) | Err(_) => break,
            }
        }
    }
}

/// An archive batch map (`archive/map.rs`: the map-address table and the
/// container records in it), decoded, then re-encoded and decoded again.
pub fn archive_map(data: &[u8]) {
    let _ = BatchMap::decode(data, "fuzz");
    let mut b = data.to_vec();
    if b.len() >= 8 && !b.starts_with(crate::archive::map::MAGIC_V2) {
        b[..8].copy_from_slice(crate::archive::map::MAGIC);
    }
    seal_tail(&mut b);
    if let Ok(map) = BatchMap::decode(&b, "fuzz") {
        for g in 0..map.groups.len() {
            map.group_id(g);
        }
        assert_eq!(BatchMap::decode(&map.encode(), "again").ok(), Some(map));
    }
}

/// A byte stream from a peer of the data protocol (`proto/frame.rs`):
/// frames read one after another until the stream ends or a frame is
/// refused; each accepted header must encode back to the bytes it came
/// from. Then the same with the first header's magic, version and CRC
/// made valid, so that the checks behind the CRC run.
pub fn frame(data: &[u8]) {
    use crate::proto::frame::{read_frame, Header, HEADER_BYTES, MAGIC, VERSION};
    fn stream(data: &[u8]) {
        let mut r = data;
        let mut payload = Vec::new();
        let mut at = 0;
        while let Ok(Some(h)) = read_frame(&mut r, &mut payload) {
            assert_eq!(&h.encode()[..], &data[at..at + HEADER_BYTES]);
            at += HEADER_BYTES + payload.len();
        }
    }
    stream(data);
    // A LogAppend's payload (its writes): whatever parses encodes back to
    // the same bytes, and nothing panics.
    if let Ok(writes) = crate::proto::frame::decode_append(data) {
        assert_eq!(crate::proto::frame::encode_append(&writes), data);
    }
    // A Replay's payload (a parity fold) and its reply's answers: the
    // same, and a fold that parses runs on a small memory chunk (checked
    // against it first) without a panic.
    if let Ok(fold) = crate::proto::frame::decode_replay(data) {
        assert_eq!(crate::proto::frame::encode_replay(&fold), data);
        let chunk = crate::media::MemDevice::new("fuzz", 1 << 16);
        let _ = crate::media::fold::run(&chunk, &fold, false);
    }
    // A Layer's payload (a dedup layer's spec): parsing and checking it
    // never panics, and one that passes the check runs over a small
    // memory chunk: every range the check lets through is taken.
    if let Ok(spec) = crate::proto::frame::decode_layer(data) {
        if spec.check(1 << 20).is_ok() {
            assert!(spec.takes_range(spec.data_offset, spec.data_bytes));
            assert!(
                !spec.takes_range(spec.data_offset.saturating_sub(1), 2) || spec.data_offset == 0
            );
        }
    }
    let rows = data.len() / crate::proto::frame::REPLAY_ANSWER_BYTES;
    if let Ok(answers) = crate::proto::frame::decode_replay_answers(data, rows) {
        assert_eq!(crate::proto::frame::encode_replay_answers(&answers), data);
    }
    let mut b = data.to_vec();
    if b.len() >= HEADER_BYTES {
        b[..4].copy_from_slice(&MAGIC);
        b[4] = VERSION;
        seal(&mut b, 0..60, 60);
        if let Ok(h) = Header::decode(b[..HEADER_BYTES].try_into().expect("64 bytes")) {
            // Seal the payload too where the stream holds it whole.
            let end = HEADER_BYTES + h.payload_bytes as usize;
            if let Some(payload) = b.get(HEADER_BYTES..end) {
                let crc = if payload.is_empty() {
                    0
                } else {
                    crc32c::crc32c(payload)
                };
                b[56..60].copy_from_slice(&crc.to_le_bytes());
                seal(&mut b, 0..60, 60);
            }
        }
        stream(&b);
    }
}
