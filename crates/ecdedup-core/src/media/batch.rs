//! Batches of device I/O: several reads, writes or syncs, on one device or
//! several, submitted together and awaited together.
//!
//! Devices backed by real files or block devices ([`Device::ring_file`])
//! go through io_uring: the operations of a batch that address them are the
//! entries of one submission (`io_uring_enter` once per batch, not once
//! per unit), and the kernel runs them in parallel. Reads (or writes) of a
//! batch that lie side by side on one device share one vectored entry
//! (`preadv`/`pwritev`): the units of consecutive stripes are adjacent on
//! each device, so a 1 MiB write of whole stripes is 6 entries, not 48
//! (each one an `O_DIRECT` bio chain, a file-system mapping and a
//! completion of its own). Any other device (memory,
//! fault-injecting, dedup, the power-loss simulator) runs its operations on
//! the calling thread through `read_at`, `write_hinted` and `sync`, one after
//! another: the plain twin the tests compare against.
//!
//! Rings are per thread (the server's fixed set of request threads), made on
//! a thread's first batch with [`RING_ENTRIES`] entries. Where io_uring is
//! unavailable (an old kernel, a seccomp filter, `kernel.io_uring_disabled`,
//! or `ECDEDUP_IO_URING=0` in the environment) every batch takes the looped
//! path, after one message on stderr: never a hard failure.
//!
//! Invariants: a batch returns only once every operation it submitted has
//! completed (the kernel never holds a buffer after [`submit`] returns); each
//! operation has its own result, so the caller latches exactly the device
//! that failed (a merged entry that fails or comes short is finished
//! transfer by transfer with plain calls, so its error lands on the
//! transfers it concerns); a FUA write is durable when its result is `Ok`
//! (`RWF_DSYNC`, or a `sync` of its device on the looped path).

use super::storage::{direct_aligned, AlignedBuf, RingFile, DIRECT_ALIGN_BYTES};
use super::{Device, WriteHint};
use io_uring::{opcode, types, IoUring};
use std::cell::RefCell;
use std::io;
use std::sync::OnceLock;

/// Submission queue entries per ring; a larger batch is submitted in parts.
pub const RING_ENTRIES: u32 = 64;

/// What one operation of a batch does.
pub enum Op<'a> {
    /// Reads exactly `buf.len()` bytes at `offset`.
    Read { buf: &'a mut [u8], offset: u64 },
    /// Writes all of `buf` at `offset`; `fua`: durable on return.
    Write {
        buf: &'a [u8],
        offset: u64,
        hint: WriteHint,
        fua: bool,
    },
    /// Makes the device's completed writes durable.
    Sync,
    /// `Device::discard` of `[offset, offset + len)`: on the calling
    /// thread, or one message to a chunk across the network.
    Discard { offset: u64, len: u64 },
    /// Several writes on one device (a parity-journal append: its records'
    /// runs, then the journal's length hint), made in this order and
    /// answered together. Always on the calling thread (`pwrite`), or as
    /// one message to a chunk across the network. `fua`: the device synced
    /// after the writes, before the answer (a flush's checksum pages and
    /// the chunk's sync in one message: `Array::sync_devices`). A
    /// [`BARRIER`] among the writes: the device synced there, so every
    /// write before it is durable before any after it is made (a flush's
    /// pages, then a journal's directory commit); across the network the
    /// append must then fit one frame (`proto::frame::append_fits`).
    Append {
        writes: Vec<(u64, &'a [u8])>,
        hint: WriteHint,
        fua: bool,
    },
    /// A replay's parity fold ([`super::fold`]): on the calling thread
    /// ([`super::fold::run`]), or as one `Replay` message to a chunk across
    /// the network; each row's answer lands in `answers`. `fua`: the
    /// folded rows durable before the answer.
    Fold {
        fold: &'a super::fold::Fold,
        fua: bool,
        answers: &'a mut Vec<super::fold::RowAnswer>,
    },
}

/// A write of no bytes in an [`Op::Append`]: a sync between the writes
/// before it and those after it.
pub const BARRIER: (u64, &[u8]) = (0, &[]);

/// One operation on one device.
pub struct DeviceIo<'a> {
    pub dev: &'a dyn Device,
    pub op: Op<'a>,
}

/// What a batch cost in system calls, for the array's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchCost {
    /// Batches handed to the kernel or looped (1 per [`submit`] with work).
    pub submissions: u64,
    /// System calls made: `io_uring_enter` calls on the ring path; one per
    /// read, write or sync on the looped path (two for a FUA write).
    pub syscalls: u64,
    /// io_uring entries submitted: one per read, write or sync, except
    /// that adjacent reads (or writes) of one device share one vectored
    /// entry ([`MERGED_TRANSFERS_MAX`]); none on the looped path.
    pub ring_entries: u64,
}

/// Runs every operation of `ios` and returns their results, in order.
pub fn submit(ios: &mut [DeviceIo<'_>]) -> (Vec<io::Result<()>>, BatchCost) {
    let mut results: Vec<io::Result<()>> = (0..ios.len()).map(|_| Ok(())).collect();
    let mut cost = BatchCost::default();
    if ios.is_empty() {
        return (results, cost);
    }
    cost.submissions = 1;
    // Remote operations leave first, all of them, and are waited for
    // last: one round trip for the batch.
    let mut remote = Vec::new();
    for (i, io) in ios.iter().enumerate() {
        if let Some(link) = io.dev.link() {
            remote.push((i, link.send(link_op(&io.op))));
        }
    }
    let mut ring_ops = Vec::new();
    let mut looped = Vec::new();
    for (i, io) in ios.iter().enumerate() {
        if io.dev.link().is_some() {
            continue;
        }
        let ring = io.dev.ring_file().filter(|_| ring_enabled());
        let own_thread = matches!(
            io.op,
            Op::Append { .. } | Op::Fold { .. } | Op::Discard { .. }
        );
        match ring.filter(|_| !own_thread) {
            Some(file) => ring_ops.push((i, file)),
            None => looped.push(i),
        }
    }
    for (i, r, calls) in run_looped_ops(ios, &looped) {
        results[i] = r;
        cost.syscalls += calls;
    }
    if !ring_ops.is_empty() {
        let left = RING.with(|cell| {
            let mut state = cell.borrow_mut();
            if let ThreadRing::NotMade = *state {
                *state = new_ring().map_or(ThreadRing::Refused, |r| ThreadRing::Ready(Box::new(r)));
            }
            match &mut *state {
                ThreadRing::Ready(ring) => {
                    match run_on_ring(ring, ios, &ring_ops, &mut results, &mut cost) {
                        Ok(()) => Vec::new(),
                        Err(refused) => refused.left,
                    }
                }
                _ => ring_ops.iter().map(|&(i, _)| i).collect(),
            }
        });
        // No ring on this thread (the kernel refused one, as it may for
        // lack of locked memory), or the kernel took none of a part's
        // entries: the looped path runs what did not run, and this thread
        // loops from now on.
        if !left.is_empty() {
            RING.with(|cell| *cell.borrow_mut() = ThreadRing::Refused);
            for i in left {
                let (r, calls) = run_looped(&mut ios[i]);
                results[i] = r;
                cost.syscalls += calls;
            }
        }
    }
    for (i, pending) in remote {
        let reply = pending.wait();
        let dev = ios[i].dev;
        results[i] = match &mut ios[i].op {
            Op::Read { buf, .. } => super::remote::fill_read(buf, reply, &|| dev.describe()),
            Op::Fold { fold, answers, .. } => reply.and_then(|bytes| {
                **answers = crate::proto::frame::decode_replay_answers(&bytes, fold.rows.len())
                    .map_err(|why| {
                        io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!("{}: {why}", dev.describe()),
                        )
                    })?;
                Ok(())
            }),
            _ => reply.map(drop),
        };
    }
    (results, cost)
}

/// The link operation of a batch operation.
fn link_op<'a>(op: &'a Op<'_>) -> super::remote::LinkOp<'a> {
    use super::remote::LinkOp;
    match op {
        Op::Read { buf, offset } => LinkOp::Read {
            offset: *offset,
            len: buf.len(),
        },
        Op::Write {
            buf,
            offset,
            fua,
            hint,
        } => LinkOp::Write {
            offset: *offset,
            buf,
            fua: *fua,
            class: hint.class,
            repair: hint.repair,
        },
        Op::Sync => LinkOp::Sync,
        Op::Discard { offset, len } => LinkOp::Discard {
            offset: *offset,
            len: *len,
        },
        Op::Append { writes, fua, .. } => LinkOp::Append { writes, fua: *fua },
        Op::Fold { fold, fua, .. } => LinkOp::Fold { fold, fua: *fua },
    }
}

/// The plain twin: one call per operation on the calling thread.
/// Runs the operations `looped` (indexes into `ios`, in order) on the
/// calling thread, one after another; except where they fall on two or
/// more devices that take work side by side without a link of their own
/// (a dedup layer over a chunk across the network: [`Device::side_by_side`]),
/// which go a thread per device, each device's in order, so that a batch
/// over k + m such chunks waits for about one round trip, not one per
/// operation (a flush of a dedup volume on six chunks: 24 round trips
/// counted one sender at a time, each waited for in turn). (index,
/// result, system calls) per operation.
fn run_looped_ops(ios: &mut [DeviceIo<'_>], looped: &[usize]) -> Vec<(usize, io::Result<()>, u64)> {
    let key = |io: &DeviceIo<'_>| io.dev as *const dyn Device as *const () as usize;
    let mut apart: Vec<usize> = looped
        .iter()
        .filter(|&&i| ios[i].dev.side_by_side())
        .map(|&i| key(&ios[i]))
        .collect();
    apart.sort_unstable();
    apart.dedup();
    if apart.len() < 2 {
        return looped
            .iter()
            .map(|&i| {
                let (r, calls) = run_looped(&mut ios[i]);
                (i, r, calls)
            })
            .collect();
    }
    // Each side-by-side device's operations, and the rest (on the calling
    // thread), as disjoint borrows of `ios`.
    let mut groups: Vec<Vec<(usize, &mut DeviceIo<'_>)>> =
        apart.iter().map(|_| Vec::new()).collect();
    let mut here = Vec::new();
    let mut wanted = looped.iter().copied().peekable();
    for (i, io) in ios.iter_mut().enumerate() {
        if wanted.peek() != Some(&i) {
            continue;
        }
        wanted.next();
        match apart
            .binary_search(&key(io))
            .ok()
            .filter(|_| io.dev.side_by_side())
        {
            Some(g) => groups[g].push((i, io)),
            None => here.push((i, io)),
        }
    }
    let scope = super::remote::current_scope();
    let run_group = move |group: Vec<(usize, &mut DeviceIo<'_>)>| {
        let run = || {
            group
                .into_iter()
                .map(|(i, io)| {
                    let (r, calls) = run_looped(io);
                    (i, r, calls)
                })
                .collect::<Vec<_>>()
        };
        match scope {
            Some(scope) => super::remote::within(scope, run),
            None => run(),
        }
    };
    let mut out = std::thread::scope(|s| {
        let handles: Vec<_> = groups
            .into_iter()
            .map(|group| s.spawn(move || run_group(group)))
            .collect();
        let mut out = run_group(here);
        for h in handles {
            match h.join() {
                Ok(done) => out.extend(done),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        out
    });
    out.sort_unstable_by_key(|(i, _, _)| *i);
    out
}

fn run_looped(io: &mut DeviceIo<'_>) -> (io::Result<()>, u64) {
    match &mut io.op {
        Op::Read { buf, offset } => (io.dev.read_at(buf, *offset), 1),
        Op::Write {
            buf,
            offset,
            hint,
            fua,
        } => {
            let r = io.dev.write_hinted(buf, *offset, *hint);
            if *fua && r.is_ok() {
                (io.dev.sync(), 2)
            } else {
                (r, 1)
            }
        }
        Op::Sync => (io.dev.sync(), 1),
        Op::Discard { offset, len } => (io.dev.discard(*offset, *len), 1),
        Op::Append { writes, hint, fua } => {
            for (n, (offset, buf)) in writes.iter().enumerate() {
                let made = match buf.is_empty() {
                    true => io.dev.sync(),
                    false => io.dev.write_hinted(buf, *offset, *hint),
                };
                if let Err(e) = made {
                    return (Err(e), n as u64 + 1);
                }
            }
            match fua {
                true => (io.dev.sync(), writes.len() as u64 + 1),
                false => (Ok(()), writes.len() as u64),
            }
        }
        Op::Fold { fold, fua, answers } => match super::fold::run(io.dev, fold, *fua) {
            Ok(a) => {
                **answers = a;
                (Ok(()), 1)
            }
            Err(e) => (Err(e), 1),
        },
    }
}

/// This thread's ring.
enum ThreadRing {
    NotMade,
    Ready(Box<IoUring>),
    /// Making one failed, or the kernel failed a submission: loop.
    Refused,
}

thread_local! {
    static RING: RefCell<ThreadRing> = const { RefCell::new(ThreadRing::NotMade) };
}

/// Whether batches may use io_uring in this process: probed once (a ring
/// made, its opcodes checked); the reason for a refusal is printed once.
pub fn ring_enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| {
        if std::env::var("ECDEDUP_IO_URING").is_ok_and(|v| v == "0") {
            return false;
        }
        match new_ring() {
            Ok(_) => true,
            Err(e) => {
                eprintln!(
                    "ecdedup: io_uring is unavailable ({e}); device I/O goes through one \
                     pread/pwrite/fdatasync per operation"
                );
                false
            }
        }
    })
}

fn new_ring() -> io::Result<IoUring> {
    let ring = IoUring::new(RING_ENTRIES)?;
    let mut probe = io_uring::Probe::new();
    ring.submitter().register_probe(&mut probe)?;
    for code in [
        opcode::Read::CODE,
        opcode::Write::CODE,
        opcode::Readv::CODE,
        opcode::Writev::CODE,
        opcode::Fsync::CODE,
    ] {
        if !probe.is_supported(code) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("the kernel's io_uring lacks opcode {code}"),
            ));
        }
    }
    Ok(ring)
}

/// The kernel took none of a part's entries: the operations `left`
/// (indexes into the batch) did not run; those of earlier parts completed.
struct RingRefused {
    left: Vec<usize>,
}

/// Failed waits (1 ms apart) for entries already in flight before the
/// process stops: their buffers cannot be freed while the kernel holds them.
const RING_FAILED_WAITS_MAX: u32 = 10_000;

/// Most transfers one ring entry carries: adjacent reads (or writes) of a
/// batch on one descriptor go as one vectored entry of up to this many
/// buffers (the kernel takes up to `IOV_MAX`, 1,024).
pub const MERGED_TRANSFERS_MAX: usize = 64;

/// Most bytes one merged ring entry moves (so its result, an `i32`,
/// never runs short for its size alone).
pub const MERGED_BYTES_MAX: usize = 16 << 20;

/// One transfer's part in a ring entry: its index in the batch and its
/// aligned bounce buffer for `O_DIRECT`, when the caller's memory is not
/// aligned.
struct Member {
    io: usize,
    bounce: Option<AlignedBuf>,
}

/// One ring entry's memory: the transfers it carries, in offset order
/// (several only when adjacent), and their buffers' vector.
struct Slot {
    members: Vec<Member>,
    /// The vector of a merged entry (the kernel reads it while the entry
    /// is in flight); empty for one transfer.
    iovecs: Vec<libc::iovec>,
    /// The descriptor the entry used (a short transfer is finished on it
    /// with `pread`/`pwrite`).
    fd: types::Fd,
}

/// A read's or write's descriptor, direction, offset, length and FUA flag;
/// None for a sync.
fn transfer(op: &Op<'_>, file: RingFile) -> Option<(i32, bool, u64, usize, bool)> {
    let (write, offset, len, fua) = match op {
        Op::Read { buf, offset } => (false, *offset, buf.len(), false),
        Op::Write {
            buf, offset, fua, ..
        } => (true, *offset, buf.len(), *fua),
        Op::Sync | Op::Discard { .. } | Op::Append { .. } | Op::Fold { .. } => return None,
    };
    Some((choose_fd(file, len, offset), write, offset, len, fua))
}

/// The ring entries of a batch's ring share, as indexes into `ring_ops`:
/// reads (or writes) on one descriptor, of one FUA flag, each starting
/// where the one before ends, share an entry (at most
/// [`MERGED_TRANSFERS_MAX`] transfers and [`MERGED_BYTES_MAX`] bytes);
/// every other operation has its own. A 1 MiB write of whole stripes is
/// one entry per device, not one per unit.
fn plan_entries(ios: &[DeviceIo<'_>], ring_ops: &[(usize, RingFile)]) -> Vec<Vec<usize>> {
    let mut entries: Vec<Vec<usize>> = Vec::with_capacity(ring_ops.len());
    let mut transfers = Vec::with_capacity(ring_ops.len());
    for (j, &(i, file)) in ring_ops.iter().enumerate() {
        match transfer(&ios[i].op, file) {
            Some((fd, write, offset, len, fua)) => transfers.push((fd, write, fua, offset, len, j)),
            None => entries.push(vec![j]),
        }
    }
    transfers.sort_unstable();
    // The last entry's key and end, and its bytes so far.
    let mut last: Option<(i32, bool, bool, u64)> = None;
    let mut bytes = 0usize;
    for (fd, write, fua, offset, len, j) in transfers {
        match entries.last_mut() {
            Some(entry)
                if last == Some((fd, write, fua, offset))
                    && entry.len() < MERGED_TRANSFERS_MAX
                    && bytes + len <= MERGED_BYTES_MAX =>
            {
                entry.push(j);
                bytes += len;
            }
            _ => {
                entries.push(vec![j]);
                bytes = len;
            }
        }
        last = Some((fd, write, fua, offset + len as u64));
    }
    entries
}

/// Runs the ring's share of a batch, adding the system calls and ring
/// entries it made to `cost`; `Err` only when the kernel took none of a
/// part's entries (the caller loops what is left instead).
fn run_on_ring(
    ring: &mut IoUring,
    ios: &mut [DeviceIo<'_>],
    ring_ops: &[(usize, RingFile)],
    results: &mut [io::Result<()>],
    cost: &mut BatchCost,
) -> Result<(), RingRefused> {
    let entries = plan_entries(ios, ring_ops);
    for (part_index, part) in entries.chunks(RING_ENTRIES as usize).enumerate() {
        let mut slots = Vec::with_capacity(part.len());
        for (n, entry) in part.iter().enumerate() {
            let (sqe, slot) = prepare(ios, entry, ring_ops);
            // SAFETY: every buffer named by the entry (the caller's, borrowed
            // for the whole batch, or a bounce buffer or vector kept in
            // `slots`) outlives its completion, which is awaited below.
            unsafe {
                ring.submission()
                    .push(&sqe.user_data(n as u64))
                    .expect("a part fits the ring");
            }
            slots.push(slot);
        }
        let mut pending = part.len();
        let mut results_of_part: Vec<Option<i32>> = vec![None; part.len()];
        let mut failed_waits = 0u32;
        while pending > 0 {
            match ring.submit_and_wait(pending) {
                Ok(_) => cost.syscalls += 1,
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
                    ) =>
                {
                    cost.syscalls += 1
                }
                Err(e) => {
                    cost.syscalls += 1;
                    if ring.submission().len() == part.len() {
                        // Nothing of this part reached the kernel: safe to
                        // drop the ring with these entries unsubmitted.
                        let left = entries[part_index * RING_ENTRIES as usize..]
                            .iter()
                            .flatten()
                            .map(|&j| ring_ops[j].0)
                            .collect();
                        return Err(RingRefused { left });
                    }
                    // Entries are in flight with our buffers: they must
                    // complete before anything here is freed.
                    failed_waits += 1;
                    if failed_waits > RING_FAILED_WAITS_MAX {
                        eprintln!(
                            "ecdedup: io_uring_enter keeps failing ({e}) with I/O in flight; \
                             stopping rather than free memory the kernel may still write"
                        );
                        std::process::abort();
                    }
                    std::thread::sleep(std::time::Duration::from_millis(1));
                    continue;
                }
            }
            for cqe in ring.completion() {
                let n = cqe.user_data() as usize;
                debug_assert!(results_of_part[n].is_none(), "one completion per entry");
                results_of_part[n] = Some(cqe.result());
                pending -= 1;
            }
        }
        cost.ring_entries += part.len() as u64;
        for (slot, res) in slots.into_iter().zip(results_of_part) {
            let res = res.expect("every entry completed");
            complete_entry(ios, slot, res, results, &mut cost.syscalls);
        }
    }
    Ok(())
}

/// The descriptor for a transfer of `len` bytes at `offset`: `O_DIRECT`
/// for block-aligned I/O (through an aligned copy when the memory is not
/// aligned), the buffered descriptor otherwise.
fn choose_fd(file: RingFile, len: usize, offset: u64) -> i32 {
    match file.direct_fd.filter(|_| direct_aligned(offset, len)) {
        Some(d) => d,
        None => file.fd,
    }
}

/// A read's or write's memory for the kernel on descriptor `fd`: the
/// caller's, or an aligned bounce buffer (holding the bytes, for a write)
/// when `fd` is `O_DIRECT` and the caller's memory is not aligned.
fn transfer_memory(
    op: &mut Op<'_>,
    fd: i32,
    file: RingFile,
) -> (*mut u8, usize, Option<AlignedBuf>) {
    let direct = file.direct_fd == Some(fd);
    match op {
        Op::Read { buf, .. } => {
            let len = buf.len();
            if direct && !(buf.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN_BYTES) {
                let mut b = AlignedBuf::new(len);
                (b.as_mut_slice(len).as_mut_ptr(), len, Some(b))
            } else {
                (buf.as_mut_ptr(), len, None)
            }
        }
        Op::Write { buf, .. } => {
            let len = buf.len();
            if direct && !(buf.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN_BYTES) {
                let mut b = AlignedBuf::new(len);
                let s = b.as_mut_slice(len);
                s.copy_from_slice(buf);
                (s.as_mut_ptr(), len, Some(b))
            } else {
                // The kernel only reads from a write's memory.
                (buf.as_ptr().cast_mut(), len, None)
            }
        }
        Op::Sync | Op::Discard { .. } | Op::Append { .. } | Op::Fold { .. } => {
            unreachable!("only reads and writes have memory")
        }
    }
}

/// The ring entry of one planned entry (indexes into `ring_ops`) and the
/// memory it uses.
fn prepare(
    ios: &mut [DeviceIo<'_>],
    entry: &[usize],
    ring_ops: &[(usize, RingFile)],
) -> (io_uring::squeue::Entry, Slot) {
    let (first, file) = ring_ops[entry[0]];
    let Some((fd, write, offset, _, fua)) = transfer(&ios[first].op, file) else {
        match ios[first].op {
            Op::Sync => {}
            Op::Read { .. }
            | Op::Write { .. }
            | Op::Discard { .. }
            | Op::Append { .. }
            | Op::Fold { .. } => {
                unreachable!("an append, a fold or a discard runs on the calling thread")
            }
        }
        let sqe = opcode::Fsync::new(types::Fd(file.fd))
            .flags(types::FsyncFlags::DATASYNC)
            .build();
        let members = vec![Member {
            io: first,
            bounce: None,
        }];
        return (
            sqe,
            Slot {
                members,
                iovecs: Vec::new(),
                fd: types::Fd(file.fd),
            },
        );
    };
    let flags = if fua { libc::RWF_DSYNC } else { 0 };
    let mut members = Vec::with_capacity(entry.len());
    let mut iovecs = Vec::new();
    let mut one = None;
    for &j in entry {
        let (i, file) = ring_ops[j];
        let (ptr, len, bounce) = transfer_memory(&mut ios[i].op, fd, file);
        members.push(Member { io: i, bounce });
        if entry.len() == 1 {
            one = Some((ptr, len));
        } else {
            iovecs.push(libc::iovec {
                iov_base: ptr.cast(),
                iov_len: len,
            });
        }
    }
    let sqe = match (one, write) {
        (Some((ptr, len)), false) => opcode::Read::new(types::Fd(fd), ptr, len as u32)
            .offset(offset)
            .build(),
        (Some((ptr, len)), true) => opcode::Write::new(types::Fd(fd), ptr, len as u32)
            .offset(offset)
            .rw_flags(flags)
            .build(),
        (None, false) => opcode::Readv::new(types::Fd(fd), iovecs.as_ptr(), iovecs.len() as u32)
            .offset(offset)
            .build(),
        (None, true) => opcode::Writev::new(types::Fd(fd), iovecs.as_ptr(), iovecs.len() as u32)
            .offset(offset)
            .rw_flags(flags)
            .build(),
    };
    let slot = Slot {
        members,
        iovecs,
        fd: types::Fd(fd),
    };
    (sqe, slot)
}

/// Turns an entry's completion into its operations' results. A merged
/// entry's bytes are shared out in offset order; if it failed or came
/// short, each of its transfers finishes on its own with plain calls, so
/// an error lands on the transfers it concerns only, as if they had gone
/// in entries of their own.
fn complete_entry(
    ios: &mut [DeviceIo<'_>],
    slot: Slot,
    res: i32,
    results: &mut [io::Result<()>],
    calls: &mut u64,
) {
    let Slot {
        members,
        iovecs,
        fd,
    } = slot;
    if iovecs.is_empty() {
        for m in members {
            results[m.io] = complete(&mut ios[m.io], fd, m.bounce, res, calls);
        }
        return;
    }
    let mut left = res.max(0) as usize;
    for (m, iov) in members.into_iter().zip(&iovecs) {
        let done = left.min(iov.iov_len);
        left -= done;
        let io = &mut ios[m.io];
        results[m.io] = match complete(io, fd, m.bounce, done as i32, calls) {
            Err(e) if res < 0 => Err(ring_error(io, fd, e)),
            r => r,
        };
    }
}

/// An error of a transfer on `fd`, said as `direct_refused` says it when
/// `fd` is the device's `O_DIRECT` descriptor.
fn ring_error(io: &DeviceIo<'_>, fd: types::Fd, e: io::Error) -> io::Error {
    let direct = matches!(io.op, Op::Read { .. } | Op::Write { .. })
        && io.dev.ring_file().and_then(|f| f.direct_fd) == Some(fd.0);
    if direct {
        super::storage::direct_refused(e, std::path::Path::new(&io.dev.describe()))
    } else {
        e
    }
}

/// Turns a completion into the operation's result: copies a bounce buffer
/// out, finishes a short transfer with plain calls (counted in `calls`).
fn complete(
    io: &mut DeviceIo<'_>,
    fd: types::Fd,
    mut bounce: Option<AlignedBuf>,
    res: i32,
    calls: &mut u64,
) -> io::Result<()> {
    if res < 0 {
        return Err(ring_error(io, fd, io::Error::from_raw_os_error(-res)));
    }
    let done = res as usize;
    match &mut io.op {
        Op::Read { buf, offset } => {
            let len = buf.len();
            match &mut bounce {
                Some(b) => {
                    finish(fd, Mem::Read(b.as_mut_slice(len)), *offset, done, calls)?;
                    buf.copy_from_slice(b.as_mut_slice(len));
                    Ok(())
                }
                None => finish(fd, Mem::Read(buf), *offset, done, calls),
            }
        }
        Op::Write {
            buf, offset, fua, ..
        } => {
            let len = buf.len();
            match &mut bounce {
                Some(b) => finish(fd, Mem::Write(b.as_mut_slice(len)), *offset, done, calls)?,
                None => finish(fd, Mem::Write(buf), *offset, done, calls)?,
            }
            if *fua && done < len {
                // The tail went through plain pwrite: sync it.
                *calls += 1;
                // SAFETY: fdatasync on a descriptor the device keeps open.
                if unsafe { libc::fdatasync(fd.0) } != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        }
        Op::Sync => Ok(()),
        Op::Discard { .. } | Op::Append { .. } | Op::Fold { .. } => {
            unreachable!("an append, a fold or a discard runs on the calling thread")
        }
    }
}

/// The memory of a transfer that [`finish`] completes.
enum Mem<'b> {
    Read(&'b mut [u8]),
    Write(&'b [u8]),
}

/// Completes a transfer of which `done` bytes went through:
/// `pread`/`pwrite` for the rest, `UnexpectedEof` at the end of a file.
fn finish(
    fd: types::Fd,
    mut mem: Mem<'_>,
    offset: u64,
    mut done: usize,
    calls: &mut u64,
) -> io::Result<()> {
    let len = match &mem {
        Mem::Read(b) => b.len(),
        Mem::Write(b) => b.len(),
    };
    while done < len {
        *calls += 1;
        let at = (offset + done as u64) as libc::off_t;
        // SAFETY: the pointer is valid for `len - done` bytes; the
        // descriptor is open.
        let n = unsafe {
            match &mut mem {
                Mem::Write(b) => libc::pwrite(fd.0, b[done..].as_ptr().cast(), len - done, at),
                Mem::Read(b) => libc::pread(fd.0, b[done..].as_mut_ptr().cast(), len - done, at),
            }
        };
        match n {
            n if n > 0 => done += n as usize,
            0 if matches!(mem, Mem::Read(_)) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "read past the end of the device",
                ))
            }
            0 => return Err(io::Error::new(io::ErrorKind::WriteZero, "wrote nothing")),
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::counters::IoClass;
    use crate::media::{DeviceOptions, IoMode, OsStorage};
    use crate::media::{FileDevice, MemDevice};

    fn pattern(seed: u8, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    /// A device file of `size` bytes in `dir`, `O_DIRECT` where the file
    /// system takes it (tmpfs refuses it: the buffered descriptor then
    /// serves).
    fn direct_device(dir: &std::path::Path, size: u64) -> FileDevice {
        let options = DeviceOptions {
            io: IoMode::Direct,
            sparse: false,
        };
        FileDevice::create_with(&OsStorage, &dir.join("dev"), size, options)
            .unwrap_or_else(|_| FileDevice::create_file(&dir.join("dev"), size).unwrap())
    }

    /// The same batch on a direct file device (io_uring when available)
    /// and on a memory device (the looped twin) reads back the same bytes.
    #[test]
    fn a_batch_on_a_file_reads_back_what_the_looped_twin_reads() {
        let dir = tempfile::tempdir().unwrap();
        let size = 1 << 20;
        let file = direct_device(dir.path(), size);
        let mem = MemDevice::new("mem", size);
        let hint = WriteHint::new(IoClass::Data);
        // Aligned, unaligned-memory and unaligned-offset writes, one FUA.
        let a = pattern(1, 8192);
        let b = pattern(2, 4096 + 1);
        let c = pattern(3, 100);
        for dev in [&file as &dyn Device, &mem] {
            let mut ios = vec![
                DeviceIo {
                    dev,
                    op: Op::Write {
                        buf: &a,
                        offset: 0,
                        hint,
                        fua: false,
                    },
                },
                DeviceIo {
                    dev,
                    op: Op::Write {
                        buf: &b[1..],
                        offset: 65536,
                        hint,
                        fua: true,
                    },
                },
                DeviceIo {
                    dev,
                    op: Op::Write {
                        buf: &c,
                        offset: 12345,
                        hint,
                        fua: false,
                    },
                },
                DeviceIo { dev, op: Op::Sync },
            ];
            let (results, cost) = submit(&mut ios);
            assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
            assert_eq!(cost.submissions, 1);
        }
        let read_all = |dev: &dyn Device| {
            let mut x = vec![0u8; 8192];
            let mut y = vec![0u8; 4097];
            let mut z = vec![0u8; 100];
            let mut ios = vec![
                DeviceIo {
                    dev,
                    op: Op::Read {
                        buf: &mut x,
                        offset: 0,
                    },
                },
                DeviceIo {
                    dev,
                    op: Op::Read {
                        buf: &mut y[1..],
                        offset: 65536,
                    },
                },
                DeviceIo {
                    dev,
                    op: Op::Read {
                        buf: &mut z,
                        offset: 12345,
                    },
                },
            ];
            let (results, _) = submit(&mut ios);
            assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
            (x, y[1..].to_vec(), z)
        };
        let from_file = read_all(&file);
        assert_eq!(from_file, read_all(&mem));
        assert_eq!(from_file, (a, b[1..].to_vec(), c));
    }

    /// Operation `i` of `ops` placed at block `i` of `dev`.
    fn block_by_block<'a>(
        dev: &'a dyn Device,
        ops: impl Iterator<Item = Op<'a>>,
    ) -> Vec<DeviceIo<'a>> {
        ops.enumerate()
            .map(|(i, mut op)| {
                let at = (i * 4096) as u64;
                match &mut op {
                    Op::Read { offset, .. }
                    | Op::Write { offset, .. }
                    | Op::Discard { offset, .. } => *offset = at,
                    Op::Sync | Op::Append { .. } | Op::Fold { .. } => {}
                }
                DeviceIo { dev, op }
            })
            .collect()
    }

    /// More operations than the ring holds go in parts; each result lands
    /// on its own operation.
    #[test]
    fn a_batch_larger_than_the_ring_reads_back_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let n = RING_ENTRIES as usize * 2 + 7;
        let dev = FileDevice::create_file(&dir.path().join("dev"), (n * 4096) as u64).unwrap();
        let blocks: Vec<Vec<u8>> = (0..n).map(|i| pattern(i as u8, 4096)).collect();
        let hint = WriteHint::new(IoClass::Data);
        let writes = blocks.iter().map(|b| Op::Write {
            buf: b,
            offset: 0,
            hint,
            fua: false,
        });
        let mut ios = block_by_block(&dev, writes);
        let (results, _) = submit(&mut ios);
        assert!(results.iter().all(|r| r.is_ok()));
        let mut back = vec![vec![0u8; 4096]; n];
        let reads = back.iter_mut().map(|b| Op::Read { buf: b, offset: 0 });
        let mut ios = block_by_block(&dev, reads);
        ios.reverse();
        let (results, cost) = submit(&mut ios);
        assert!(results.iter().all(|r| r.is_ok()));
        assert_eq!(cost.submissions, 1);
        drop(ios);
        assert_eq!(back, blocks);
    }

    /// Adjacent writes (and reads) of one device go as one vectored ring
    /// entry whatever their order in the batch, through a bounce buffer
    /// where the memory is not aligned; a transfer after a gap has its
    /// own entry (issue 21: a 1 MiB write was 48 entries, one per unit).
    #[test]
    fn adjacent_transfers_of_a_device_share_one_ring_entry() {
        let dir = tempfile::tempdir().unwrap();
        let size = 1 << 20;
        let dev = direct_device(dir.path(), size);
        let hint = WriteHint::new(IoClass::Data);
        // Blocks 3, 1, 0, 2 (block 1 from unaligned memory) and 6.
        let blocks: Vec<Vec<u8>> = (0..5).map(|i| pattern(i + 1, 4096 + 1)).collect();
        let at = [3u64, 1, 0, 2, 6];
        let mut ios: Vec<DeviceIo> = blocks
            .iter()
            .zip(at)
            .enumerate()
            .map(|(n, (b, block))| DeviceIo {
                dev: &dev,
                op: Op::Write {
                    buf: if n == 1 { &b[1..] } else { &b[..4096] },
                    offset: block * 4096,
                    hint,
                    fua: false,
                },
            })
            .collect();
        let (results, cost) = submit(&mut ios);
        assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
        let entries = if ring_enabled() { 2 } else { 0 };
        assert_eq!(
            cost.ring_entries, entries,
            "blocks 0-3 in one entry, 6 in another"
        );
        let mut back = vec![vec![0u8; 4096 + 1]; 5];
        let mut ios: Vec<DeviceIo> = back
            .iter_mut()
            .zip(at)
            .enumerate()
            .map(|(n, (b, block))| DeviceIo {
                dev: &dev,
                op: Op::Read {
                    buf: if n == 3 { &mut b[1..] } else { &mut b[..4096] },
                    offset: block * 4096,
                },
            })
            .collect();
        let (results, cost) = submit(&mut ios);
        assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
        assert_eq!(cost.ring_entries, entries);
        drop(ios);
        for (n, (b, want)) in back.iter().zip(&blocks).enumerate() {
            let want = if n == 1 { &want[1..] } else { &want[..4096] };
            let got = if n == 3 { &b[1..] } else { &b[..4096] };
            assert_eq!(got, want, "block {}", at[n]);
        }
    }

    /// A read past the end fails alone, whether it has an entry of its
    /// own (far past the end) or shares one with the read before it (just
    /// past the end: the merged read comes short, and each transfer
    /// finishes on its own).
    #[test]
    fn a_read_past_the_end_fails_alone() {
        let dir = tempfile::tempdir().unwrap();
        let dev = FileDevice::create_file(&dir.path().join("dev"), 8192).unwrap();
        let data = pattern(9, 4096);
        let hint = WriteHint::new(IoClass::Data);
        let write = Op::Write {
            buf: &data,
            offset: 4096,
            hint,
            fua: false,
        };
        assert!(submit(&mut [DeviceIo {
            dev: &dev,
            op: write
        }])
        .0[0]
            .is_ok());
        for (past, entries) in [(1 << 20, 2), (8192, 1)] {
            let mut x = vec![0u8; 4096];
            let mut y = vec![0u8; 4096];
            let mut ios = vec![
                DeviceIo {
                    dev: &dev,
                    op: Op::Read {
                        buf: &mut y,
                        offset: past,
                    },
                },
                DeviceIo {
                    dev: &dev,
                    op: Op::Read {
                        buf: &mut x,
                        offset: 4096,
                    },
                },
            ];
            let (results, cost) = submit(&mut ios);
            assert_eq!(cost.ring_entries, entries * u64::from(ring_enabled()));
            assert_eq!(
                results[0].as_ref().unwrap_err().kind(),
                io::ErrorKind::UnexpectedEof
            );
            assert!(results[1].is_ok());
            drop(ios);
            assert_eq!(x, data);
        }
    }
}
