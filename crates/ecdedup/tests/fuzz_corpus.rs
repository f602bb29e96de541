//! The fuzz targets' committed inputs, replayed on stable: every seed
//! (`fuzz/seeds/TARGET/`, small valid files written by the store's own
//! code) and every input that once crashed a parser
//! (`fuzz/regressions/TARGET/`) goes through the target's entry point in
//! `ecdedup::fuzzing`, so the regressions run in every `cargo test`, with or
//! without a nightly toolchain. The seeds are made by the ignored test
//! `write_seeds`
//! (`cargo test -p ecdedup --test it -- fuzz_corpus::write_seeds --ignored`).

use ecdedup::fuzzing;
use std::path::{Path, PathBuf};

type Target = (&'static str, fn(&[u8]));

/// Every fuzz target, by the name of its folders and of its binary.
const TARGETS: [Target; 12] = [
    ("superblock", fuzzing::superblock),
    ("meta_area", fuzzing::meta_area),
    ("intent_map", fuzzing::intent_map),
    ("parity_journal", fuzzing::parity_journal),
    ("degraded_log", fuzzing::degraded_log),
    ("config", fuzzing::config),
    ("dedup_log", fuzzing::dedup_log),
    ("dedup_snapshot", fuzzing::dedup_snapshot),
    ("trace", fuzzing::trace),
    ("archive_map", fuzzing::archive_map),
    ("frame", fuzzing::frame),
    ("poison_list", fuzzing::poison_list),
];

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

/// The files of `fuzz/KIND/TARGET`, sorted (none if the folder is absent).
fn inputs(kind: &str, target: &str) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(fuzz_dir().join(kind).join(target)) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("folder entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

/// Runs every input of `kind`; returns how many there were per target.
fn replay(kind: &str) -> Vec<(&'static str, usize)> {
    TARGETS
        .iter()
        .map(|&(name, run)| {
            let files = inputs(kind, name);
            for path in &files {
                let bytes = std::fs::read(path).expect("read input");
                let outcome = std::panic::catch_unwind(|| run(&bytes));
                assert!(outcome.is_ok(), "{} panicked on {}", name, path.display());
            }
            (name, files.len())
        })
        .collect()
}

#[test]
fn every_target_has_seeds_and_every_seed_parses_without_a_panic() {
    for (name, count) in replay("seeds") {
        assert!(count > 0, "no seeds for fuzz target {name}");
    }
}

#[test]
fn every_input_that_once_crashed_a_parser_now_gets_an_error() {
    let total: usize = replay("regressions").iter().map(|(_, n)| n).sum();
    assert!(total > 0, "the regression inputs are missing");
}

#[test]
fn the_replay_fails_when_an_entry_point_panics() {
    let outcome = std::panic::catch_unwind(|| {
        let run: fn(&[u8]) = |_| panic!("a parser that panics");
        run(b"")
    });
    assert!(outcome.is_err());
}

/// Writes small valid files made by the store's own encoders into
/// `fuzz/seeds/TARGET/`.
#[test]
#[ignore = "writes fuzz/seeds; run by hand when a format changes"]
fn write_seeds() {
    for (name, files) in seeds::all() {
        let dir = fuzz_dir().join("seeds").join(name);
        std::fs::create_dir_all(&dir).unwrap();
        for (file, bytes) in files {
            std::fs::write(dir.join(file), bytes).unwrap();
        }
    }
}

mod seeds {
    use ecdedup::archive::{self, ArchiveStore};
    use ecdedup::array::degraded_log::DegradedLog;
    use ecdedup::array::intent::IntentLog;
    use ecdedup::array::journal::{self, Kind, ParityJournal};
    use ecdedup::array::superblock::{MemberState, Superblock};
    use ecdedup::array::{self, Geometry, WritePolicy};
    use ecdedup::dedup::log::{self as dedup_log, Record, Snapshot};
    use ecdedup::dedup::{DedupConfig, Policy};
    use ecdedup::fingerprint::Algorithm;
    use ecdedup::media::storage::read_all;
    use ecdedup::media::OsStorage;
    use ecdedup::media::{IoMode, PowerLossStorage, Storage};
    use ecdedup::proto::frame::{write_frame, Header, Op, Status, FLAG_FUA};
    use ecdedup::ssd::trace::{write_ecdedup_line, TraceOp, TraceRequest};
    use std::path::Path;
    use std::sync::Arc;

    type Files = Vec<(&'static str, Vec<u8>)>;

    pub fn all() -> Vec<(&'static str, Files)> {
        vec![
            ("superblock", superblock()),
            ("meta_area", meta_area()),
            ("intent_map", intent_map()),
            ("parity_journal", parity_journal()),
            ("degraded_log", degraded_log()),
            ("config", config()),
            ("dedup_log", dedup_log()),
            ("dedup_snapshot", dedup_snapshot()),
            ("trace", trace()),
            ("archive_map", archive_map()),
            ("frame", frame()),
        ]
    }

    fn sim() -> Arc<dyn Storage> {
        let storage = PowerLossStorage::new().shared();
        storage.create_dir_all(Path::new("/s")).unwrap();
        storage
    }

    /// A metadata area with three files, one grown past its committed
    /// length (so its hint counts): slot 1's directory then the hints.
    fn meta_area() -> Files {
        use ecdedup::media::area::{AreaFs, AREA_BYTES_MIN, DIR_SLOT_BYTES};
        use ecdedup::media::{Device, MemDevice};
        let mem = MemDevice::new("seed", AREA_BYTES_MIN);
        let dev: Arc<dyn Device> = Arc::new(mem.clone());
        let fs = Arc::new(AreaFs::format(dev, 0, AREA_BYTES_MIN).unwrap());
        for (name, len) in [
            ("intent.map", 5000usize),
            ("journal/dev0.jrnl", 70_000),
            ("dedup/dev0.log", 300),
        ] {
            let f = fs.create_file(name, false).unwrap();
            f.write_at(&vec![0x5a; len], 0).unwrap();
            f.sync().unwrap();
        }
        fs.commit().unwrap();
        let f = fs.open_file("dedup/dev0.log").unwrap();
        f.write_at(&[0x33; 1000], 300).unwrap();
        // The newest directory is in slot 0 or 1: take the valid one with
        // the even sequence, as the fuzz entry point puts it in slot 0.
        let bytes = mem.with_bytes(|b| b.clone());
        let slot = DIR_SLOT_BYTES as usize;
        let newest = if u64::from_le_bytes(bytes[16..24].try_into().unwrap())
            > u64::from_le_bytes(bytes[slot + 16..slot + 24].try_into().unwrap())
        {
            0
        } else {
            slot
        };
        let mut seed = bytes[newest..newest + slot].to_vec();
        seed.extend_from_slice(&bytes[2 * slot..2 * slot + 4096]);
        vec![("area.bin", seed)]
    }

    fn superblock() -> Files {
        let geometry = Geometry::new(6, 4, 2, 32 << 10, 1 << 30).unwrap();
        let mut sb = Superblock {
            states: vec![MemberState::Active; geometry.devices as usize],
            volume_bytes: geometry.volume_bytes(),
            geometry,
            generation: 5,
            position: 3,
            array_uuid: [0xA1; 16],
            device_uuid: [0xD3; 16],
            member_uuids: (0xD0..0xD6).map(|b| [b; 16]).collect(),
            boot_stamp: 0,
        };
        let older = sb.encode();
        sb.generation = 6;
        sb.states[1] = MemberState::Failed;
        sb.states[2] = MemberState::Rebuilding { cursor: 42 };
        let newer = sb.encode();
        vec![("two-slots", [newer, older].concat())]
    }

    fn intent_map() -> Files {
        let storage = sim();
        let path = Path::new("/s/intent.map");
        let stripes = 40u64;
        IntentLog::create_in(storage.as_ref(), path, &[0xEC; 16], stripes, 8).unwrap();
        let (log, _, _) =
            IntentLog::open_in(storage.as_ref(), path, &[0xEC; 16], stripes, 8).unwrap();
        log.begin(17).unwrap();
        let file = read_all(storage.as_ref(), path).unwrap();
        vec![(
            "40-stripes-one-dirty",
            [&stripes.to_le_bytes()[..], &file].concat(),
        )]
    }

    fn parity_journal() -> Files {
        let storage = sim();
        let path = Path::new("/s/journal");
        let mut j = ParityJournal::open_in(storage.clone(), path).unwrap();
        let mut records = Vec::new();
        journal::encode(&mut records, Kind::Original, 3, 1, 0, &[1; 4096]);
        journal::encode(&mut records, Kind::Value, 3, 1, 0, &[2; 4096]);
        let bases = [Some(0x9abc), None];
        journal::encode_with_bases(&mut records, Kind::Delta, 3, 4, 0, &[3; 8192], &bases);
        journal::encode_invalidate(&mut records, 9, 0, 1);
        let fold = journal::Mark::AfterFold;
        journal::encode_mark_with_crcs(&mut records, 3, 0, 2, fold, &[0x1234, 0x5678]);
        j.append(&records).unwrap();
        let empty = journal_header(storage.as_ref(), path);
        vec![
            ("records", read_all(storage.as_ref(), path).unwrap()),
            ("empty", empty),
        ]
    }

    fn journal_header(storage: &dyn Storage, path: &Path) -> Vec<u8> {
        read_all(storage, path).unwrap()[..journal::HEADER_BYTES as usize].to_vec()
    }

    fn degraded_log() -> Files {
        let storage = sim();
        let path = Path::new("/s/degraded.log");
        // Block size 8 (the target's choice 0): records small enough for
        // the fuzzer to make more of them.
        let (log, _) = DegradedLog::open(storage.clone(), path, 8, 1 << 20).unwrap();
        // No devices to sync: the log is far from its bound anyway.
        let durable = || Ok(());
        drop(
            log.log(4, &[(0, 1, &[5; 16]), (2, 0, &[6; 8])], &durable)
                .unwrap(),
        );
        log.forget_stripe(7, &durable).unwrap();
        drop(log.log(7, &[(1, 3, &[7; 8])], &durable).unwrap());
        let file = read_all(storage.as_ref(), path).unwrap();
        vec![("block-8", [&[0u8][..], &file].concat())]
    }

    fn config() -> Files {
        let storage = sim();
        let dir = Path::new("/s/array");
        let opts = array::CreateOptions {
            devices: (0..3).map(|i| dir.join(format!("dev{i}"))).collect(),
            k: 2,
            m: 1,
            stripe_unit_bytes: 4096,
            volume_bytes: 1 << 20,
            intent_region_bytes: 1 << 20,
            dedup: DedupConfig {
                policy: Policy::Parity,
                ..DedupConfig::default()
            },
            write_policy: WritePolicy::default(),
            journal_bytes_max: array::JOURNAL_BYTES_DEFAULT,
            io: IoMode::default(),
            sparse: true,
            force: false,
            metadata: array::MetadataPlacement::Devices,
        };
        array::create_in(&storage, dir, &opts).unwrap();
        let file = read_all(storage.as_ref(), &dir.join(array::CONFIG_FILE)).unwrap();
        vec![("array.json", file)]
    }

    fn dedup_records() -> Vec<u8> {
        let fp = Algorithm::Sha256.fingerprint(b"a block");
        let mut out = Vec::new();
        for r in [
            Record::Write {
                block: 1,
                slot: 1,
                fingerprint: Some(fp),
                content: Some(7),
            },
            Record::Reference {
                block: 2,
                slot: 1,
                content: Some(7),
            },
            Record::Write {
                block: 3,
                slot: 3,
                fingerprint: None,
                content: None,
            },
            Record::Unmap { block: 3 },
        ] {
            r.encode_into(&mut out);
        }
        out
    }

    fn dedup_log() -> Files {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.log");
        drop(dedup_log::reset_log(OsStorage::shared().as_ref(), &path).unwrap());
        let empty = std::fs::read(&path).unwrap();
        vec![("records", [&empty[..], &dedup_records()].concat())]
    }

    fn dedup_snapshot() -> Files {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.snap");
        let mut map = vec![dedup_log::UNMAPPED; 16];
        map[0] = 0;
        map[5] = 0;
        map[6] = 2;
        let snap = Snapshot {
            map,
            fingerprints: vec![(0, Algorithm::Sha256.fingerprint(b"slot 0"))],
        };
        dedup_log::write_snapshot(OsStorage::shared().as_ref(), &path, &snap).unwrap();
        let snapshot = std::fs::read(&path).unwrap();
        let log_path = dir.path().join("d.log");
        drop(dedup_log::reset_log(OsStorage::shared().as_ref(), &log_path).unwrap());
        let log = [std::fs::read(&log_path).unwrap(), dedup_records()].concat();
        let split = (snapshot.len() as u16).to_le_bytes();
        vec![("snapshot-and-log", [&split[..], &snapshot, &log].concat())]
    }

    fn trace() -> Files {
        let mut ours = b"# ecdedup trace\n".to_vec();
        let page = |digest: u128| ecdedup::ssd::ftl::PageFingerprint {
            digest,
            crc: digest as u32,
        };
        for (time_us, op, offset, length, pages) in [
            (0, TraceOp::Write, 0, 8192, vec![page(1), page(2)]),
            (120, TraceOp::Read, 0, 4096, vec![]),
            (250, TraceOp::Trim, 4096, 4096, vec![]),
            (300, TraceOp::Flush, 0, 0, vec![]),
        ] {
            let req = TraceRequest {
                time_us,
                op,
                offset,
                length,
                pages,
            };
            write_ecdedup_line(&mut ours, &req).unwrap();
        }
        let fiu = b"89968195792462 20782 gzip 283193184 8 R 6 0 56f11b711d91a065a2b6458eca924523\n\
89968195800000 20782 gzip 283193192 16 W 6 0 56f11b711d91a065a2b6458eca924523 0123456789abcdef0123456789abcdef\n"
            .to_vec();
        vec![("ecdedup-format", ours), ("fiu-format", fiu)]
    }

    fn archive_map() -> Files {
        let dir = tempfile::tempdir().unwrap();
        let options = archive::CreateOptions {
            k: 2,
            m: 1,
            devices: Vec::new(),
            device_count: 3,
            container_bytes: 2 * 512 * 4,
            block_bytes: 512,
            fingerprint: Algorithm::Md5,
            cache_bytes: 1 << 20,
            exchange: 2,
            verify: None,
            ..Default::default()
        };
        let mut store = ArchiveStore::create(dir.path(), &options).unwrap();
        let object: Vec<u8> = (0..9000u32).map(|i| (i / 512 % 3) as u8).collect();
        store.put("object", &mut &object[..]).unwrap();
        store.seal().unwrap();
        let mut files = Vec::new();
        for e in std::fs::read_dir(dir.path().join("maps")).unwrap() {
            let path = e.unwrap().path();
            let bytes = std::fs::read(&path).unwrap();
            files.push((
                if files.is_empty() {
                    "batch-0"
                } else {
                    "batch-1"
                },
                bytes,
            ));
        }
        files.truncate(2);
        // A version 2 map: the compact layout with content-defined chunks.
        let dir = tempfile::tempdir().unwrap();
        let options = archive::CreateOptions {
            layout: archive::Layout::Compact,
            chunking: archive::Chunking::Fastcdc {
                min_bytes: 128,
                avg_bytes: 512,
                max_bytes: 2048,
            },
            exchange: 1,
            ..options
        };
        let mut store = ArchiveStore::create(dir.path(), &options).unwrap();
        store.put("object", &mut &object[..]).unwrap();
        store.put("again", &mut &object[..]).unwrap();
        store.seal().unwrap();
        let map = std::fs::read_dir(dir.path().join("maps")).unwrap();
        let first = map.map(|e| e.unwrap().path()).min().unwrap();
        files.push(("batch-compact-cdc", std::fs::read(first).unwrap()));
        files
    }

    fn frame() -> Files {
        let mut write = Header::request(Op::Write, 1, b"four kib of data, shortened");
        write.volume_id = 7;
        write.epoch = 3;
        write.flags = FLAG_FUA;
        write.offset = 4096;
        write.pg_epoch = 2;
        let mut stream = Vec::new();
        write_frame(&mut stream, &write, b"four kib of data, shortened");
        let reply = write.reply(Status::EpochTooOld, &[]);
        write_frame(&mut stream, &reply, &[]);
        let mut read = Vec::new();
        let mut h = Header::request(Op::Read, 2, &[]);
        h.length = 4096;
        write_frame(&mut read, &h, &[]);
        // A LogAppend's payload alone (the target parses it as one too):
        // a journal's records, then its length hint.
        let append =
            ecdedup::proto::frame::encode_append(&[(8192, &[0x11; 40]), (8232, &[0x22; 8])]);
        // A Replay's payload alone: a parix row (d(0), d(r)) and a plog
        // row (a delta), as the writer folds one parity unit.
        use ecdedup::media::fold::{Fold, Row, Term};
        let term = |coefficient, a, b| Term {
            coefficient,
            at: 0,
            len: 4096,
            a,
            b,
        };
        let fold = Fold {
            block_bytes: 4096,
            rows: vec![
                Row {
                    parity: 0,
                    expected_crc32c: 0x1234_5678,
                    terms: vec![term(0x8e, 8192, Some(12288))],
                },
                Row {
                    parity: 4096,
                    expected_crc32c: 0,
                    terms: vec![term(1, 16384, None)],
                },
            ],
        };
        let replay = ecdedup::proto::frame::encode_replay(&fold);
        // A flush's pages, a barrier, then a journal's directory slot.
        let barrier = ecdedup::proto::frame::encode_append(&[
            (4096, &[0x44; 40]),
            ecdedup::media::batch::BARRIER,
            (65536, &[0x66; 36]),
        ]);
        vec![
            ("write-and-reply", stream),
            ("read", read),
            ("log-append-payload", append),
            ("log-append-barrier", barrier),
            ("replay-payload", replay),
        ]
    }
}
