//! The archive's counters through the command line, each command a new
//! process: blocks, unique and redundant blocks, stripes encoded, map bytes
//! and the cache's hits, misses and evictions in `archive stats` (JSON and
//! Prometheus text), exact for a story whose counts follow by hand; the
//! progress lines of `--progress` when stderr is not a terminal; and a read
//! that meets a flipped byte in a data sub-file decodes that block and
//! returns the object's bytes.

use rand::{Rng, SeedableRng};
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};

const BLOCK: usize = 8192;
/// RS(6,3), 4 stripes of 6 blocks: 24 blocks per container.
const CONTAINER_BLOCKS: usize = 24;

fn archive(dir: &Path, args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_ecdedup"))
        .arg("archive")
        .arg("--dir")
        .arg(dir)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "archive {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// One container of distinct random blocks.
fn distinct_blocks(seed: u64) -> Vec<u8> {
    let mut bytes = vec![0u8; CONTAINER_BLOCKS * BLOCK];
    rand::rngs::StdRng::seed_from_u64(seed).fill(&mut bytes[..]);
    bytes
}

/// Creates an archive with the given cache bound, puts `a` and a copy of
/// it (one container each), seals, and returns `stats` as JSON.
fn a_and_its_copy(dir: &Path, cache: &str) -> Value {
    let a = dir.join("a.img");
    std::fs::write(&a, distinct_blocks(7)).unwrap();
    let arc = dir.join("arc");
    archive(&arc, &["create", "--container", "192K", "--cache", cache]);
    archive(&arc, &["put", a.to_str().unwrap()]);
    archive(&arc, &["put", a.to_str().unwrap(), "--name", "copy"]);
    archive(&arc, &["seal"]);
    serde_json::from_slice(&archive(&arc, &["stats"]).stdout).unwrap()
}

fn counters(s: &Value) -> [u64; 9] {
    [
        "blocks",
        "unique_blocks",
        "redundant_blocks",
        "stripes",
        "stripes_encoded",
        "map_bytes",
        "cache_hits",
        "cache_misses",
        "cache_evictions",
    ]
    .map(|k| s[k].as_u64().unwrap_or_else(|| panic!("{k} missing")))
}

#[test]
fn a_copy_is_counted_as_hits_and_redundant_blocks_across_processes() {
    let dir = tempfile::tempdir().unwrap();
    let stats = a_and_its_copy(dir.path(), "512M");
    // 48 blocks; the copy's 24 hit the cache and need no stripe. Maps:
    // header 28 + container 448 + group (48 + 4 + 12 + 12 x encoded) + CRC 4.
    assert_eq!(
        counters(&stats),
        [
            48,
            24,
            24,
            8,
            4,
            28 + 448 + 112 + 4 + 28 + 448 + 64 + 4,
            24,
            24,
            0
        ]
    );
    assert_eq!(stats["parity_bytes"], 4 * 3 * BLOCK as u64);

    let text =
        String::from_utf8(archive(&dir.path().join("arc"), &["stats", "--prometheus"]).stdout)
            .unwrap();
    for line in [
        "# TYPE ecdedup_archive_cache_hits counter",
        "ecdedup_archive_cache_hits 24",
        "ecdedup_archive_cache_evictions 0",
        "# TYPE ecdedup_archive_stripes_encoded gauge",
        "ecdedup_archive_stripes_encoded 4",
        "ecdedup_archive_redundant_blocks 24",
        "ecdedup_archive_map_bytes 1136",
    ] {
        assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
    }
}

#[test]
fn a_cache_of_two_entries_evicts_the_source_before_its_copy_arrives() {
    let dir = tempfile::tempdir().unwrap();
    // 256 bytes: two entries of 128 accounted bytes.
    let stats = a_and_its_copy(dir.path(), "256");
    assert_eq!(counters(&stats)[..5], [48, 48, 0, 8, 8]);
    assert_eq!(counters(&stats)[6..], [0, 48, 46]);
}

#[test]
fn progress_lines_are_written_when_asked_for_without_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.img");
    std::fs::write(&a, distinct_blocks(8)).unwrap();
    let arc = dir.path().join("arc");
    archive(&arc, &["create", "--container", "384K"]);
    archive(&arc, &["put", a.to_str().unwrap()]);
    let quiet = archive(&arc, &["seal"]);
    assert!(quiet.stderr.is_empty(), "no progress unless asked for");
    archive(&arc, &["put", a.to_str().unwrap(), "--name", "b"]);
    let seal = String::from_utf8(archive(&arc, &["--progress", "seal"]).stderr).unwrap();
    // Bytes, each phase from its total, each ending at 100%: the
    // container's 196,608 bytes (4 stripes of 6 x 8 KiB), no stripe to
    // encode (a copy of "a"), its 6 sub-files of 4 blocks written.
    for line in [
        "seal: dedup: 0/196608 bytes (0%)",
        "seal: dedup: 196608/196608 bytes (100%)",
        "seal: encode: 0/0 bytes (100%)",
        "seal: write: 196608/196608 bytes (100%)",
    ] {
        assert!(seal.contains(line), "{line}: {seal}");
    }
    let scrub = String::from_utf8(archive(&arc, &["--progress", "scrub"]).stderr).unwrap();
    assert!(
        scrub.contains("scrub: 393216/393216 bytes (100%)"),
        "{scrub}"
    );
}

#[test]
fn a_flipped_byte_in_a_data_sub_file_is_decoded_around_on_read() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = distinct_blocks(9);
    let a = dir.path().join("a.img");
    std::fs::write(&a, &bytes).unwrap();
    let arc = dir.path().join("arc");
    archive(&arc, &["create", "--container", "192K"]);
    archive(&arc, &["put", a.to_str().unwrap()]);
    archive(&arc, &["seal"]);
    // Sub-file 2 of container 0 (its 4 blocks are bytes 64K..96K of a).
    let sub_file = (0..9)
        .map(|d| arc.join(format!("dev{d}/c00000000.2")))
        .find(|p| p.exists())
        .unwrap();
    let mut stored = std::fs::read(&sub_file).unwrap();
    stored[BLOCK + 5] ^= 0x40;
    std::fs::write(&sub_file, &stored).unwrap();
    let got = archive(&arc, &["get", "a.img"]).stdout;
    assert!(got == bytes, "the object reads back exactly");
    // A range that starts inside the damaged block.
    let range = archive(
        &arc,
        &["get", "a.img", "--offset", "73733", "--length", "20000"],
    )
    .stdout;
    assert!(range[..] == bytes[73733..93733]);
}
