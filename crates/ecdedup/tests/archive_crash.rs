//! Crash safety of the archive tier: a `put` (that fills and seals several
//! containers) followed by a `seal`, interrupted before each of their file
//! operations in turn, leaves the archive as it was before the interrupted
//! call: the earlier objects read back exactly, the new object is either
//! absent or whole, and whatever the crash left behind is found and
//! reclaimed by `scrub --repair`, after which a second scrub finds nothing.
//! The paper layout with exchange 0 and 2, and the compact layout with
//! FastCDC chunking.
//!
//! Every crash point is one whole put + seal + scrub story, and the points
//! number in the hundreds, so CI tries every third one, each layout from a
//! different offset; the full run sets
//! `ECDEDUP_ARCHIVE_CRASH_STRIDE=1` (`scripts/test.sh --long`).

use ecdedup::archive::{disk, ArchiveStore, Chunking, CreateOptions, Layout};
use ecdedup::fingerprint::Algorithm;
use rand::{Rng, SeedableRng};
use std::path::Path;

const BLOCK_BYTES: usize = 512;
const CONTAINER_BYTES: u64 = 3 * 512 * 4;

fn options(layout: Layout, chunking: Chunking, exchange: u32) -> CreateOptions {
    CreateOptions {
        k: 3,
        m: 2,
        devices: Vec::new(),
        device_count: 5,
        container_bytes: CONTAINER_BYTES,
        block_bytes: BLOCK_BYTES as u32,
        fingerprint: Algorithm::Md5,
        cache_bytes: 1 << 20,
        exchange,
        verify: None,
        layout,
        chunking,
    }
}

fn random(rng: &mut rand::rngs::StdRng, bytes: usize) -> Vec<u8> {
    let mut out = vec![0u8; bytes];
    rng.fill(&mut out[..]);
    out
}

/// An archive holding one sealed object and one in the open container.
fn archive_before(dir: &Path, options: &CreateOptions, sealed: &[u8], open: &[u8]) {
    let mut store = ArchiveStore::create(dir, options).unwrap();
    store.put("sealed", &mut &sealed[..]).unwrap();
    store.seal().unwrap();
    store.put("open", &mut &open[..]).unwrap();
}

/// A plain copy of an archive folder (no syncs: the copy is a fresh start).
fn copy_tree(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            std::fs::create_dir_all(&target).unwrap();
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Every how many crash points one is tried (`ECDEDUP_ARCHIVE_CRASH_STRIDE`,
/// default 3; 1 tries them all).
fn crash_stride() -> u64 {
    match std::env::var("ECDEDUP_ARCHIVE_CRASH_STRIDE") {
        Ok(v) => v
            .parse::<u64>()
            .ok()
            .filter(|&n| n > 0)
            .unwrap_or_else(|| panic!("ECDEDUP_ARCHIVE_CRASH_STRIDE={v}: want a number >= 1")),
        Err(_) => 3,
    }
}

#[test]
fn an_interrupted_put_or_seal_leaves_the_archive_as_it_was() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(12);
    let sealed = random(&mut rng, 2 * CONTAINER_BYTES as usize + 700);
    let open = random(&mut rng, 1000);
    // The new object repeats the sealed one (dedup sources in old batches)
    // and adds fresh bytes across three more containers.
    let mut new = sealed.clone();
    new.extend(random(&mut rng, 3 * CONTAINER_BYTES as usize));
    let cdc = Chunking::Fastcdc {
        min_bytes: 128,
        avg_bytes: 512,
        max_bytes: 2048,
    };
    let stride = crash_stride();
    for (layout_index, (layout, chunking, exchange)) in [
        (Layout::Paper, Chunking::Fixed, 0),
        (Layout::Paper, Chunking::Fixed, 2),
        (Layout::Compact, cdc, 0),
    ]
    .into_iter()
    .enumerate()
    {
        let layout_index = layout_index as u64;
        let template = tempfile::tempdir().unwrap();
        let options = options(layout, chunking, exchange);
        archive_before(template.path(), &options, &sealed, &open);
        let mut completed = false;
        let first = layout_index % stride;
        for crash_after in (first..).step_by(stride as usize) {
            let dir = tempfile::tempdir().unwrap();
            copy_tree(template.path(), dir.path());
            let mut store = ArchiveStore::open(dir.path()).unwrap();
            disk::fail_after_writes(Some(crash_after));
            let put = store.put("new", &mut &new[..]);
            let sealed_ok = put.is_ok() && store.seal().is_ok();
            disk::fail_after_writes(None);
            drop(store);

            let mut store = ArchiveStore::open(dir.path()).unwrap();
            let story = format!(
                "{layout:?} {chunking:?} exchange {exchange}, crash after {crash_after} writes"
            );
            assert!(
                store.get("sealed").unwrap() == sealed,
                "{story}: sealed differs"
            );
            assert!(store.get("open").unwrap() == open, "{story}: open differs");
            let names: Vec<String> = store.list().into_iter().map(|o| o.name).collect();
            if put.is_ok() {
                assert!(store.get("new").unwrap() == new, "{story}: new differs");
            } else {
                assert_eq!(names, vec!["open", "sealed"], "{story}");
            }
            let repair = store.scrub(true).unwrap();
            assert_eq!(repair.unrecoverable_blocks, 0, "{story}");
            let after = store.scrub(false).unwrap();
            assert_eq!(after.bad_blocks + after.bad_parity_blocks, 0, "{story}");
            assert_eq!(
                after.orphan_files + after.unreferenced_containers,
                0,
                "{story}"
            );
            // The archive goes on: the object can be stored (again) and sealed.
            if put.is_err() {
                store.put("new", &mut &new[..]).unwrap();
            }
            store.seal().unwrap();
            assert!(store.get("new").unwrap() == new, "{story}: new differs");
            assert!(store.get("open").unwrap() == open, "{story}: open differs");
            if sealed_ok {
                completed = true;
                break;
            }
        }
        assert!(completed);
    }
}
