//! The paged checksum table against a plain `Vec` model, under a cache of a
//! few pages so that eviction, partial pages and reloads all happen.

use super::*;
use crate::media::{FaultPlan, FaultyDevice, MemDevice};
use proptest::prelude::*;

const OFFSET: u64 = 8192;

/// A table of `blocks` entries over a memory device, with a cache of
/// `pages` pages (one shard each up to 16).
struct Rig {
    dev: Arc<dyn Device>,
    slot: DeviceSlot,
    counters: Arc<DeviceCounters>,
    blocks: u64,
    pages: u64,
}

impl Rig {
    fn new(blocks: u64, pages: u64) -> Rig {
        Rig::over(Arc::new(MemDevice::new("t", 8 << 20)), blocks, pages)
    }

    fn over(dev: Arc<dyn Device>, blocks: u64, pages: u64) -> Rig {
        Rig {
            slot: Arc::new(RwLock::new(Some(Arc::clone(&dev)))),
            dev,
            counters: Arc::new(DeviceCounters::default()),
            blocks,
            pages,
        }
    }

    /// 4096 entries over a device whose faults the plan injects.
    fn faulty(pages: u64) -> (Rig, Arc<FaultPlan>) {
        let plan = FaultPlan::new();
        let dev = FaultyDevice::new(MemDevice::new("t", 8 << 20), Arc::clone(&plan));
        (Rig::over(Arc::new(dev), 4096, pages), plan)
    }

    fn open(&self) -> ChecksumTable {
        ChecksumTable::open(
            Arc::clone(&self.slot),
            Arc::clone(&self.counters),
            self.blocks,
            OFFSET,
            4096,
            self.pages * PAGE_RAM_BYTES,
        )
    }

    fn flush(&self, t: &ChecksumTable) {
        t.flush(self.dev.as_ref(), &self.counters).unwrap();
    }

    /// Entry `index` as stored on the device.
    fn stored(&self, index: u64) -> u32 {
        let mut b = [0u8; 4];
        self.dev.read_at(&mut b, OFFSET + index * 4).unwrap();
        u32::from_le_bytes(b) ^ zero_block_crc(4096)
    }

    fn fail_device(&self) {
        *self.slot.write().unwrap() = None;
    }
}

fn zero() -> u32 {
    zero_block_crc(4096)
}

#[test]
fn a_zeroed_area_describes_zero_blocks_and_flushed_entries_reload() {
    let rig = Rig::new(3000, 64);
    let t = rig.open();
    assert_eq!(t.get(2999), Some(crc32c::crc32c(&[0u8; 4096])));
    t.set(1500, 0xdead_beef);
    t.set(7, 1);
    rig.flush(&t);
    let u = rig.open();
    assert_eq!(u.get(1500), Some(0xdead_beef));
    assert_eq!(u.get(7), Some(1));
    assert_eq!(u.get(8), Some(zero()));
}

#[test]
fn opening_reads_nothing_and_ram_follows_the_bound_not_the_capacity() {
    // 1 Mi blocks: a 4 GiB device, whose whole table would be 4 MiB.
    let blocks = 1 << 20;
    let rig = Rig::new(blocks, 4);
    let t = rig.open();
    assert_eq!(t.ram_bytes(), 0);
    for page in 0..100u64 {
        t.set(page * 1024 * 97 % blocks, page as u32);
        assert_eq!(t.get((page * 1024 * 13 + 5) % blocks), Some(zero()));
    }
    assert!(t.ram_bytes() <= 4 * (PAGE_RAM_BYTES + MASK_RAM_BYTES));
}

#[test]
fn evicting_a_dirty_page_writes_it_before_the_flush() {
    let rig = Rig::new(4096, 1);
    let t = rig.open();
    t.set(3, 0x1234_5678);
    assert_eq!(rig.stored(3), zero(), "not written while resident");
    // Page 1 takes the only place; page 0 (partial, dirty) is merged with
    // its copy on the device and written on its way out.
    assert_eq!(t.get(1024 + 9), Some(zero()));
    assert_eq!(t.get(1024 + 9), Some(zero()));
    t.set(1024 + 10, 5);
    assert_eq!(t.get(2048), Some(zero()));
    assert_eq!(rig.stored(3), 0x1234_5678);
    assert_eq!(rig.stored(1024 + 10), 5);
    assert_eq!(t.get(3), Some(0x1234_5678));
}

#[test]
fn a_failed_devices_table_keeps_the_entries_degraded_writes_set() {
    let rig = Rig::new(8192, 2);
    let t = rig.open();
    t.set(1, 11);
    rig.flush(&t);
    assert_eq!(t.get(1), Some(11));
    rig.fail_device();
    // Degraded writes go on recording what the device's blocks hold
    // logically, on resident pages and on pages it never read.
    t.set(2, 22);
    for page in 2..8u64 {
        t.set(page * 1024, page as u32);
    }
    assert_eq!(t.get(1), Some(11), "resident before the failure");
    assert_eq!(t.get(2), Some(22));
    for page in 2..8u64 {
        assert_eq!(
            t.get(page * 1024),
            Some(page as u32),
            "pinned past the bound"
        );
        assert_eq!(
            t.get(page * 1024 + 1),
            None,
            "never read: unknown, not made up"
        );
    }
    let prior = t.duplicate();
    assert_eq!(prior.get(2), Some(22));
    assert_eq!(prior.get(7 * 1024), Some(7));
    assert_eq!(prior.get(7 * 1024 + 1), None);
    prior.set(7 * 1024 + 1, 71);
    assert_eq!(prior.get(7 * 1024 + 1), Some(71));
}

#[test]
fn a_replacement_reads_as_zero_blocks_and_forgets_the_old_pages() {
    let rig = Rig::new(4096, 2);
    let t = rig.open();
    t.set(5, 55);
    rig.fail_device();
    t.set(2000, 1);
    // install_replacement: a wiped device, then the table is reset.
    let blank: Arc<dyn Device> = Arc::new(MemDevice::new("blank", 8 << 20));
    t.reset_zeroed();
    *rig.slot.write().unwrap() = Some(Arc::clone(&blank));
    assert_eq!(t.get(5), Some(zero()));
    assert_eq!(t.get(2000), Some(zero()));
    assert_eq!(t.ram_bytes(), PAGE_RAM_BYTES * 2);
}

#[test]
fn an_unreadable_table_page_is_unknown_and_the_error_is_latched() {
    let (rig, plan) = Rig::faulty(4);
    let t = rig.open();
    t.set(1, 1);
    *plan.bad_read_range.lock().unwrap() = Some((OFFSET, OFFSET + 4096));
    assert_eq!(t.get(2), None, "page 0 is partial and cannot be merged");
    *plan.bad_read_range.lock().unwrap() = None;
    assert_eq!(t.get(1), Some(1), "what was set stays known");
    assert_eq!(t.get(1024), None, "no page is read after the error");
    assert!(t.flush(rig.dev.as_ref(), &rig.counters).is_err());
    assert!(t.flush(rig.dev.as_ref(), &rig.counters).is_err(), "latched");
}

#[test]
fn a_failed_eviction_write_keeps_the_page_and_latches() {
    let (rig, plan) = Rig::faulty(1);
    let t = rig.open();
    assert_eq!(t.get(0), Some(zero()));
    t.set(0, 9);
    plan.dead.store(true, std::sync::atomic::Ordering::SeqCst);
    t.set(1024, 8);
    assert_eq!(t.get(0), Some(9), "never dropped unwritten");
    assert_eq!(t.get(1024), Some(8));
    assert!(t.flush(rig.dev.as_ref(), &rig.counters).is_err());
}

#[derive(Clone, Debug)]
enum Op {
    Get(u64),
    Set(u64, u32),
    SetZero(u64),
    Flush,
    /// Drops the table unflushed after a flush of what it holds (a clean
    /// close), then opens it again from the device.
    Reopen,
}

fn op(blocks: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..blocks).prop_map(Op::Get),
        6 => (0..blocks, any::<u32>()).prop_map(|(i, c)| Op::Set(i, c)),
        1 => (0..blocks).prop_map(Op::SetZero),
        1 => Just(Op::Flush),
        1 => Just(Op::Reopen),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64)
    ))]

    /// With a cache of 1 to 3 pages over 6 pages of entries, every read
    /// agrees with a plain vector; after a flush the device holds the
    /// model exactly.
    #[test]
    fn the_paged_table_reads_back_its_model(
        pages in 1u64..4,
        ops in proptest::collection::vec(op(6 * 1024 - 100), 1..300),
    ) {
        let blocks = 6 * 1024 - 100;
        let rig = Rig::new(blocks, pages);
        let mut model = vec![zero(); blocks as usize];
        let mut t = rig.open();
        for op in ops {
            match op {
                Op::Get(i) => prop_assert_eq!(t.get(i), Some(model[i as usize])),
                Op::Set(i, c) => {
                    t.set(i, c);
                    model[i as usize] = c;
                }
                Op::SetZero(i) => {
                    t.set_zero(i);
                    model[i as usize] = zero();
                }
                Op::Flush => {
                    rig.flush(&t);
                    for (i, &c) in model.iter().enumerate() {
                        prop_assert_eq!(rig.stored(i as u64), c);
                    }
                }
                Op::Reopen => {
                    rig.flush(&t);
                    t = rig.open();
                }
            }
            prop_assert!(t.ram_bytes() <= pages.min(16) * (PAGE_RAM_BYTES + MASK_RAM_BYTES));
        }
    }
}
