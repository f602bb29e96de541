//! What a stripe write sends to its chunks when they are across the
//! network: the array over [`RemoteDevice`]s whose links run each
//! operation on a memory device at once and count it, by purpose, and the
//! round trips (operations sent before the sender waited), as the volume
//! client's counters do (docs/cluster.md, "Counters").

use super::*;
use crate::media::remote::{ChunkLink, LinkOp, PendingReply, Purpose, RemoteDevice};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Mutex;

#[derive(Default)]
struct Tally {
    sent: Mutex<Vec<Purpose>>,
    round_trips: AtomicU64,
    /// The purpose of each round trip's first operation.
    round_trip_purposes: Mutex<Vec<Purpose>>,
    waiting: AtomicBool,
}

impl Tally {
    /// (messages of each purpose, round trips) since the last call.
    fn take(&self) -> (Vec<(Purpose, usize)>, u64) {
        let sent = std::mem::take(&mut *self.sent.lock().unwrap());
        let by = Purpose::ALL
            .iter()
            .map(|p| (*p, sent.iter().filter(|s| *s == p).count()))
            .filter(|(_, n)| *n > 0)
            .collect();
        (by, self.round_trips.swap(0, Ordering::SeqCst))
    }
}

struct CountingLink {
    mem: MemDevice,
    tally: Arc<Tally>,
}

struct Answered(std::io::Result<Vec<u8>>, Arc<Tally>);

impl PendingReply for Answered {
    fn wait(self: Box<Self>) -> std::io::Result<Vec<u8>> {
        self.1.waiting.store(false, Ordering::SeqCst);
        self.0
    }
}

impl ChunkLink for CountingLink {
    fn send(&self, op: LinkOp<'_>) -> Box<dyn PendingReply> {
        let t = &self.tally;
        if !t.waiting.swap(true, Ordering::SeqCst) {
            t.round_trips.fetch_add(1, Ordering::SeqCst);
            t.round_trip_purposes.lock().unwrap().push(Purpose::of(&op));
        }
        t.sent.lock().unwrap().push(Purpose::of(&op));
        let mem = &self.mem;
        let reply = match op {
            LinkOp::Read { offset, len } => {
                let mut buf = vec![0u8; len];
                mem.read_at(&mut buf, offset).map(|()| buf)
            }
            LinkOp::Write { offset, buf, .. } => mem.write_at(buf, offset).map(|()| Vec::new()),
            LinkOp::Append { writes } => writes
                .iter()
                .try_for_each(|(offset, buf)| mem.write_at(buf, *offset))
                .map(|()| Vec::new()),
            LinkOp::Sync => mem.sync().map(|()| Vec::new()),
            LinkOp::Discard { offset, len } => mem.discard(offset, len).map(|()| Vec::new()),
        };
        Box::new(Answered(reply, Arc::clone(t)))
    }

    fn size(&self) -> u64 {
        self.mem.size()
    }

    fn describe(&self) -> String {
        format!("link to {}", self.mem.describe())
    }
}

/// A parix RS(4,2) array of format 2 over counting links, its volume
/// written once (full stripes: parity current, nothing logged).
fn parix_over_links() -> (tempfile::TempDir, Array, Arc<Tally>) {
    let dir = tempfile::tempdir().unwrap();
    let (k, m, unit) = (4u32, 2u32, 8192u32);
    let mut opts = options(6, k, m, unit, 8 * k as u64 * unit as u64);
    opts.metadata = MetadataPlacement::Devices;
    opts.write_policy = WritePolicy::Parix;
    opts.journal_bytes_max = 4 << 20;
    let (geo, mems) = format_on_memory(dir.path(), &opts);
    let tally = Arc::new(Tally::default());
    let devices = mems
        .iter()
        .map(|mem| {
            let link = CountingLink {
                mem: mem.clone(),
                tally: Arc::clone(&tally),
            };
            Some(Arc::new(RemoteDevice::new(Arc::new(link))) as Arc<dyn Device>)
        })
        .collect();
    let array = Array::open_with_devices(dir.path(), devices, None).unwrap();
    let volume = geo.stripes * geo.stripe_data_bytes();
    array.write(&pattern(5, volume as usize), 0, false).unwrap();
    array.flush().unwrap();
    tally.take();
    (dir, array, tally)
}

#[test]
fn a_parix_overwrite_sends_the_data_and_one_append_per_parity_in_one_round_trip() {
    let (_dir, array, tally) = parix_over_links();
    // The first overwrite of a block since its parity was written: both
    // parity journals answer NEED_D0, so d(0) is read first.
    array.write(&pattern(6, 4096), 8192, false).unwrap();
    let (by, round_trips) = tally.take();
    let of = |p| by.iter().find(|(q, _)| *q == p).map_or(0, |(_, n)| *n);
    assert_eq!(of(Purpose::D0Read), 1, "{by:?}");
    assert_eq!(of(Purpose::Write), 1, "{by:?}");
    assert_eq!(array.stats().array.need_d0, 1);
    // The next overwrite of it: the journals hold d(0), so the new value
    // goes to the data chunk and to each parity journal, all at once.
    array.write(&pattern(7, 4096), 8192, false).unwrap();
    let (by, round_trips_fast) = tally.take();
    assert_eq!(
        (by.clone(), round_trips_fast),
        (vec![(Purpose::Write, 1), (Purpose::JournalAppend, 2)], 1),
        "the fast path: 1 data write and m journal appends in 1 round trip"
    );
    assert_eq!(array.stats().array.need_d0, 1);
    let _ = round_trips;
    let mut back = vec![0u8; 4096];
    array.read(&mut back, 8192).unwrap();
    assert_eq!(back, pattern(7, 4096));
}

/// A replay folds a stripe's records into each parity unit reading every
/// journal block it needs in one batch per parity journal: one round trip
/// to each parity chunk for the records, not one per block (docs/
/// benchmarks.md, "Five pools, a simulated network distance": 75,389
/// replay reads in as many round trips before).
#[test]
fn a_replay_reads_a_stripes_journal_records_in_one_round_trip_per_journal() {
    let (_dir, array, tally) = parix_over_links();
    // Four blocks of one stripe overwritten twice each: every journal holds
    // d(0) and d(r) of each, 8 blocks per parity journal.
    for round in 0..2u64 {
        for b in 0..4u64 {
            let at = b * 8192;
            array
                .write(&pattern(10 + round * 4 + b, 4096), at, false)
                .unwrap();
        }
    }
    tally.take();
    tally.round_trip_purposes.lock().unwrap().clear();
    array.replay_all(None).unwrap();
    let (by, round_trips) = tally.take();
    let of = |p| by.iter().find(|(q, _)| *q == p).map_or(0, |(_, n)| *n);
    let read_round_trips = tally
        .round_trip_purposes
        .lock()
        .unwrap()
        .iter()
        .filter(|p| **p == Purpose::ReplayRead)
        .count();
    // The figures docs/cluster.md quotes (`-- --nocapture`).
    eprintln!("replay: {by:?}; {read_round_trips} of {round_trips} round trips read");
    // 2 journals x 8 blocks read, one at a time 16 round trips (and one
    // per parity row read). Batched: one per journal, and the parity rows'.
    assert!(of(Purpose::ReplayRead) >= 16, "{by:?}");
    assert!(
        read_round_trips <= 4,
        "{read_round_trips} of {round_trips} round trips read ({by:?}): the journal blocks \
         were read one by one"
    );
    assert_eq!(
        array.stats().array.records_replayed,
        8,
        "4 blocks per journal"
    );
    for round in 1..2u64 {
        for b in 0..4u64 {
            let mut back = vec![0u8; 4096];
            array.read(&mut back, b * 8192).unwrap();
            assert_eq!(back, pattern(10 + round * 4 + b, 4096));
        }
    }
}
