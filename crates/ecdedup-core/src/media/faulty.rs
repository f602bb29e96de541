//! A fault-injecting device for tests.
//!
//! Fault model: the device can fail every I/O from some moment on (a dead
//! disk), drop writes after a budget of writes (a crash: later writes never
//! reach the media, as after a power cut where nothing after the cut
//! persisted), or fail reads or writes of one offset range (a bad sector;
//! an unreadable one is remapped by the next write over it), or report
//! the writes of a range failed and keep them for the test to land later
//! (a request its writer gave up on that its server still handles), or
//! hold writes of a range, or syncs, until the test lets them go (a slow
//! device, to stage races). Silent corruption is injected by writing the
//! inner device directly.

use super::Device;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

#[derive(Default)]
pub struct FaultPlan {
    /// Every I/O fails with EIO.
    pub dead: AtomicBool,
    /// Writes left before the simulated crash; negative means no crash armed.
    /// At zero, further writes are silently dropped.
    pub writes_before_crash: AtomicI64,
    /// Reads overlapping this byte range fail with EIO (a medium error);
    /// a write overlapping it clears it (the disk remaps the sector).
    pub bad_read_range: Mutex<Option<(u64, u64)>>,
    /// Writes (and discards) overlapping this byte range fail with EIO.
    pub bad_write_range: Mutex<Option<(u64, u64)>>,
    /// Writes overlapping this byte range fail as a request without a
    /// reply does, and are kept in `late_writes` instead of written: the
    /// test lands them later (a request its writer gave up on, still
    /// queued at a server), by writing them to the inner device.
    pub late_write_range: Mutex<Option<(u64, u64)>>,
    pub late_writes: Mutex<Vec<(u64, Vec<u8>)>>,
    /// Reads overlapping this byte range fail as a lost link does (no
    /// medium error: the array fails the device at once).
    pub lost_read_range: Mutex<Option<(u64, u64)>>,
    /// While set, writes overlapping `hold_range` wait (a slow device, to
    /// stage races); `held` is set once a write waits there.
    pub hold: AtomicBool,
    pub hold_range: Mutex<Option<(u64, u64)>>,
    pub held: AtomicBool,
    /// With `hold`, syncs wait too (a flush's device sync in flight while
    /// other requests complete, to stage races); `held` is set as well.
    pub hold_syncs: AtomicBool,
    /// While `Some`, the bytes each write and discard replaced since the
    /// device's last sync (offset, bytes before), for a cut
    /// (`cut_on_write_range`).
    pub unsynced: Mutex<Option<Vec<PreImage>>>,
    /// A write overlapping this byte range cuts the power as it arrives:
    /// every write of this device since its last sync is undone (from
    /// `unsynced`, newest first) and it is not written; from then on
    /// writes, discards and syncs of every device sharing `power` are
    /// dropped while reported done (the test then stops the array as a
    /// crash; the other devices keep what they took before).
    pub cut_on_write_range: Mutex<Option<(u64, u64)>>,
    /// Set once the power is cut; shared by the devices of one machine.
    pub power: Mutex<Arc<AtomicBool>>,
}

/// The bytes a write replaced: (offset, bytes before).
pub type PreImage = (u64, Vec<u8>);

/// Whether `[offset, offset+len)` overlaps `range` (`[start, end)`).
fn overlaps(range: &Mutex<Option<(u64, u64)>>, offset: u64, len: usize) -> bool {
    matches!(*range.lock().unwrap(), Some((start, end)) if offset < end && offset + len as u64 > start)
}

impl FaultPlan {
    pub fn new() -> Arc<FaultPlan> {
        let p = FaultPlan::default();
        p.writes_before_crash.store(-1, Ordering::SeqCst);
        Arc::new(p)
    }

    /// Whether the power of this device's machine was cut
    /// (`cut_on_write_range`).
    pub fn is_cut(&self) -> bool {
        self.power.lock().unwrap().load(Ordering::SeqCst)
    }

    /// Ends a cut and its tracking: the power is back (for the next open).
    pub fn restore_power(&self) {
        *self.cut_on_write_range.lock().unwrap() = None;
        *self.unsynced.lock().unwrap() = None;
        *self.power.lock().unwrap() = Arc::new(AtomicBool::new(false));
    }
}

pub struct FaultyDevice<D: Device> {
    inner: D,
    plan: Arc<FaultPlan>,
}

impl<D: Device> FaultyDevice<D> {
    pub fn new(inner: D, plan: Arc<FaultPlan>) -> Self {
        FaultyDevice { inner, plan }
    }

    fn check_dead(&self) -> io::Result<()> {
        if self.plan.dead.load(Ordering::SeqCst) {
            Err(io::Error::other("injected: device dead"))
        } else {
            Ok(())
        }
    }

    /// Whether a write or discard of `len` bytes at `offset` is dropped by
    /// a cut (one that arrives at the cut's range cuts the power first);
    /// else its pre-image is kept where the test tracks them.
    fn cut_at(&self, offset: u64, len: u64) -> io::Result<bool> {
        if self.plan.is_cut() {
            return Ok(true);
        }
        let mut unsynced = self.plan.unsynced.lock().unwrap();
        if overlaps(&self.plan.cut_on_write_range, offset, len as usize) {
            for (at, before) in unsynced.take().unwrap_or_default().into_iter().rev() {
                self.inner.write_at(&before, at)?;
            }
            self.plan
                .power
                .lock()
                .unwrap()
                .store(true, Ordering::SeqCst);
            return Ok(true);
        }
        if let Some(list) = unsynced.as_mut() {
            let mut before = vec![0u8; len as usize];
            self.inner.read_at(&mut before, offset)?;
            list.push((offset, before));
        }
        Ok(false)
    }

    /// True when the write should be dropped (crash point passed).
    fn crashed(&self) -> bool {
        let left = self.plan.writes_before_crash.load(Ordering::SeqCst);
        if left < 0 {
            return false;
        }
        if left == 0 {
            return true;
        }
        self.plan.writes_before_crash.fetch_sub(1, Ordering::SeqCst);
        false
    }
}

impl<D: Device> Device for FaultyDevice<D> {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check_dead()?;
        if overlaps(&self.plan.bad_read_range, offset, buf.len()) {
            // A medium error, as a disk reports an unreadable sector.
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        if overlaps(&self.plan.lost_read_range, offset, buf.len()) {
            return Err(io::Error::other("injected: read lost"));
        }
        self.inner.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.check_dead()?;
        if overlaps(&self.plan.bad_write_range, offset, buf.len()) {
            return Err(io::Error::other("injected: bad sector (write)"));
        }
        if overlaps(&self.plan.late_write_range, offset, buf.len()) {
            self.plan
                .late_writes
                .lock()
                .unwrap()
                .push((offset, buf.to_vec()));
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "injected: no reply (the write may land later)",
            ));
        }
        if overlaps(&self.plan.hold_range, offset, buf.len()) {
            while self.plan.hold.load(Ordering::SeqCst) {
                self.plan.held.store(true, Ordering::SeqCst);
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        if self.crashed() || self.cut_at(offset, buf.len() as u64)? {
            return Ok(());
        }
        // Writing a sector that could not be read remaps it, as disks do.
        if overlaps(&self.plan.bad_read_range, offset, buf.len()) {
            *self.plan.bad_read_range.lock().unwrap() = None;
        }
        self.inner.write_at(buf, offset)
    }

    fn sync(&self) -> io::Result<()> {
        self.check_dead()?;
        if self.plan.hold_syncs.load(Ordering::SeqCst) {
            while self.plan.hold.load(Ordering::SeqCst) {
                self.plan.held.store(true, Ordering::SeqCst);
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        if self.plan.is_cut() {
            return Ok(());
        }
        self.inner.sync()?;
        if let Some(list) = self.plan.unsynced.lock().unwrap().as_mut() {
            list.clear();
        }
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check_dead()?;
        if overlaps(&self.plan.bad_write_range, offset, len as usize) {
            return Err(io::Error::other("injected: bad sector (discard)"));
        }
        if self.crashed() || self.cut_at(offset, len)? {
            return Ok(());
        }
        self.inner.discard(offset, len)
    }

    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn describe(&self) -> String {
        format!("faulty:{}", self.inner.describe())
    }
}
