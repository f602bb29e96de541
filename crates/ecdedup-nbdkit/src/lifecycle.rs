//! How the serving process ends: on a bug, at once; on a stop signal,
//! cleanly and within a bound.
//!
//! - A panic anywhere in the process is a bug that may have left the
//!   array's state half updated in RAM (a stripe's checksums, its parity, a
//!   journal) and its locks poisoned. The process aborts, so that the
//!   supervisor restarts it and the recovery of `Array::open` (intent-log
//!   resync, journal replay) rebuilds a consistent state from the media; it
//!   never serves on with part of the volume failing (ARCHITECTURE.md, "A
//!   panic stops the server").
//! - A stop signal (SIGTERM, SIGINT, SIGHUP, SIGQUIT: the ones nbdkit stops
//!   on) is ours to handle, not nbdkit's. nbdkit 1.32 stops only once every
//!   client has disconnected (an idle client, or one that never finishes
//!   its handshake, holds it forever), and it cannot end a connection from
//!   its side while that connection has requests in flight: once it marks
//!   a connection dead (a send that fails, a request cut short) it closes
//!   the socket's write side while other worker threads of the connection
//!   still have replies to send, and `raw_send_socket` asserts
//!   `sock >= 0` and aborts the process (nbdkit commit 9d82aa4f, in 1.33.3).
//!   Replying ESHUTDOWN to new requests (nbdkit's own stop) or shutting
//!   client sockets (what this module did) makes a client drop the
//!   connection with requests in flight, which is how a stop under load
//!   ended in that abort with the intent log dirty. So our handler
//!   replaces nbdkit's and the stop never touches a connection: the
//!   [`request`] gate closes (a request that arrives afterwards waits
//!   there, unanswered: a client sees it fail when the connection ends,
//!   and a connection that has not finished its handshake is refused at
//!   `open`), the requests already inside finish, the array is flushed and
//!   closed, and the process exits at once with status 0 (1 if the close
//!   failed), every connection ending with it. Past [`STOP_BOUND`] for the
//!   requests inside to finish, the process aborts, and the next start
//!   recovers.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, Once, PoisonError};
use std::time::{Duration, Instant};

/// How long the requests inside the array may take to finish after a stop
/// signal; the flush and close that follow are not bounded by it.
pub const STOP_BOUND: Duration = Duration::from_secs(60);

/// The signals that stop the server: the ones nbdkit installs its own stop
/// handler for.
const STOP_SIGNALS: [libc::c_int; 4] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGQUIT];

/// How the array is flushed and closed; the message says why it failed.
pub type CloseFn = fn() -> Result<(), String>;

/// Write end of the pipe that wakes the stop thread (-1 before it starts).
static WAKE_FD: AtomicI32 = AtomicI32::new(-1);

/// The request gate is closed: a stop has begun.
static STOPPING: AtomicBool = AtomicBool::new(false);
/// Requests inside the gate (between entering and leaving [`request`]).
/// With [`STOPPING`], both sequentially consistent: a request that enters
/// either sees the gate closed or is counted by the stop that closes it.
static INSIDE: AtomicUsize = AtomicUsize::new(0);
/// The stop thread waits on [`DRAINED`] under this lock; the last request
/// to leave a closed gate takes it to signal.
static DRAIN_LOCK: Mutex<()> = Mutex::new(());
static DRAINED: Condvar = Condvar::new();
/// The outcome of closing the array, once it was closed (by the stop
/// thread or by nbdkit's unload, whichever came first).
static CLOSED: Mutex<Option<Result<(), String>>> = Mutex::new(None);

/// Makes every panic in this process abort it after the usual message.
pub fn fail_stop_on_panic() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            report(info);
            eprintln!(
                "ecdedup: a panic is a bug that may leave the array half updated in memory: \
                 the server aborts; start it again and recovery resynchronises the array"
            );
            std::process::abort();
        }));
    });
}

/// Runs one client request against the array, unless a stop has begun:
/// then the request waits, unanswered, until the process exits (it must
/// not reach an array being closed, and an error reply would make the
/// client drop a connection that still has replies to come).
pub fn request<T>(serve: impl FnOnce() -> T) -> T {
    struct Inside;
    impl Drop for Inside {
        fn drop(&mut self) {
            if INSIDE.fetch_sub(1, Ordering::SeqCst) == 1 && STOPPING.load(Ordering::SeqCst) {
                let _lock = DRAIN_LOCK.lock().unwrap_or_else(PoisonError::into_inner);
                DRAINED.notify_all();
            }
        }
    }
    INSIDE.fetch_add(1, Ordering::SeqCst);
    let inside = Inside;
    if STOPPING.load(Ordering::SeqCst) {
        drop(inside);
        loop {
            std::thread::park();
        }
    }
    serve()
}

/// Whether a stop has begun (a connection that opens now is refused).
pub fn stopping() -> bool {
    STOPPING.load(Ordering::SeqCst)
}

/// Closes the array once: the first caller runs `close` (logging it), a
/// later or concurrent one gets its outcome.
fn close_once(close: CloseFn) -> Result<(), String> {
    let mut closed = CLOSED.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(outcome) = closed.as_ref() {
        return outcome.clone();
    }
    let outcome = close();
    match &outcome {
        Ok(()) => eprintln!("ecdedup: stopped: the array is flushed and closed"),
        Err(e) => eprintln!("ecdedup: closing the array: {e}"),
    }
    *closed = Some(outcome.clone());
    outcome
}

/// nbdkit's unload: closes the array unless the stop thread did. A close
/// that fails ends the process with status 1.
pub fn unload(close: CloseFn) {
    if close_once(close).is_err() {
        exit_now(1);
    }
}

/// Ends the process at once with `code`: nbdkit's threads (some waiting in
/// the gate, some in a client's read) are not joined, and no exit handler
/// runs while they do.
fn exit_now(code: libc::c_int) -> ! {
    // SAFETY: _exit(2) ends the process; nothing after it runs.
    unsafe { libc::_exit(code) }
}

/// Replaces nbdkit's handlers of the stop signals with ours and starts the
/// thread that stops the server on one, closing the array with `close`.
/// Called once nbdkit serves (after it installed its handlers, before it
/// accepts a connection); later calls do nothing.
pub fn stop_on_signal(close: CloseFn) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if let Err(e) = install(close) {
            eprintln!(
                "ecdedup: warning: {e}: a stop signal is nbdkit's, which waits for every client \
                 to disconnect"
            );
        }
    });
}

fn install(close: CloseFn) -> std::io::Result<()> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2(2) into a two-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let [read_fd, write_fd] = fds;
    std::thread::Builder::new()
        .name("ecdedup-stop".into())
        .spawn(move || stop_on_wake(read_fd, close))?;
    WAKE_FD.store(write_fd, Ordering::SeqCst);
    for &sig in &STOP_SIGNALS {
        // SAFETY: sigaction(2) with a zeroed, then filled, structure.
        unsafe {
            let mut ours: libc::sigaction = std::mem::zeroed();
            ours.sa_sigaction = on_stop_signal as *const () as usize;
            ours.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut ours.sa_mask);
            if libc::sigaction(sig, &ours, std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    Ok(())
}

/// Async-signal-safe: one write(2) that wakes the stop thread.
extern "C" fn on_stop_signal(_sig: libc::c_int) {
    let fd = WAKE_FD.load(Ordering::SeqCst);
    // SAFETY: write(2) of one byte from a static; the result does not
    // matter (a full pipe already holds a wake-up).
    unsafe {
        libc::write(fd, b"s".as_ptr().cast(), 1);
    }
}

/// Waits for a stop signal, then stops the server: closes the gate, waits
/// for the requests inside (aborting past [`STOP_BOUND`]), closes the
/// array and exits.
fn stop_on_wake(read_fd: RawFd, close: CloseFn) {
    let mut byte = [0u8; 1];
    loop {
        // SAFETY: read(2) into a one-byte buffer.
        let n = unsafe { libc::read(read_fd, byte.as_mut_ptr().cast(), 1) };
        if n == 1 {
            break;
        }
        if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        return;
    }
    let deadline = Instant::now() + STOP_BOUND;
    STOPPING.store(true, Ordering::SeqCst);
    let mut lock = DRAIN_LOCK.lock().unwrap_or_else(PoisonError::into_inner);
    let inside = INSIDE.load(Ordering::SeqCst);
    eprintln!(
        "ecdedup: stopping: no new request is served; {} in the array {} first, then the array \
         is flushed and closed and every connection ends",
        match inside {
            0 => "no request".to_string(),
            1 => "the 1 request".to_string(),
            n => format!("the {n} requests"),
        },
        if inside == 0 { "waits" } else { "finish" }
    );
    while INSIDE.load(Ordering::SeqCst) > 0 {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            eprintln!(
                "ecdedup: requests did not finish within {STOP_BOUND:?} of the stop signal; \
                 aborting (the next start resynchronises the array)"
            );
            std::process::abort();
        }
        lock = DRAINED
            .wait_timeout(lock, left)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
    drop(lock);
    let code = if close_once(close).is_ok() { 0 } else { 1 };
    exit_now(code);
}
