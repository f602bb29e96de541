//! How the serving process ends: on a bug, at once; on SIGTERM, cleanly and
//! within a bound.
//!
//! - A panic anywhere in the process is a bug that may have left the
//!   array's state half updated in RAM (a stripe's checksums, its parity, a
//!   journal) and its locks poisoned. The process aborts, so that the
//!   supervisor restarts it and the recovery of `Array::open` (intent-log
//!   resync, journal replay) rebuilds a consistent state from the media; it
//!   never serves on with part of the volume failing (ARCHITECTURE.md, "A
//!   panic stops the server").
//! - nbdkit 1.32 stops on SIGTERM only once every client has disconnected:
//!   an idle client, blocked in nothing but the server's read of its next
//!   request, would hold the server up forever. Our handler, chained after
//!   nbdkit's, shuts the read side of every accepted connection, so each
//!   connection ends after the request it is in (an idle one at once);
//!   nbdkit then unloads the plugin, which flushes and closes the array.
//!   Past [`STOP_BOUND`] the process aborts, and the next start recovers.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Once, OnceLock};
use std::time::{Duration, Instant};

/// How long the process may take to stop after SIGTERM or SIGINT (requests
/// in flight finish, then the array is flushed and closed).
pub const STOP_BOUND: Duration = Duration::from_secs(60);
/// How often, while stopping, connections accepted meanwhile are looked for.
const STOP_POLL: Duration = Duration::from_millis(100);

/// The signals that stop the server; nbdkit handles each.
const STOP_SIGNALS: [libc::c_int; 2] = [libc::SIGTERM, libc::SIGINT];

/// Write end of the pipe that wakes the stop watcher (-1 before it starts).
static WAKE_FD: AtomicI32 = AtomicI32::new(-1);
/// nbdkit's handlers, called after ours, by position in [`STOP_SIGNALS`].
static PREVIOUS: [OnceLock<libc::sigaction>; 2] = [OnceLock::new(), OnceLock::new()];
/// Set once nbdkit unloads the plugin: the close is under way.
static CLOSING: AtomicBool = AtomicBool::new(false);

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

/// The close has begun (nbdkit is unloading the plugin): no abort past
/// the stop bound.
pub fn closing() {
    CLOSING.store(true, Ordering::SeqCst);
}

/// Chains our stop handler after nbdkit's and starts the watcher that ends
/// client reads on a stop signal. Called once nbdkit serves (its handlers
/// are installed by then); later calls do nothing.
pub fn stop_idle_clients_on_signal() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if let Err(e) = install() {
            eprintln!("ecdedup: warning: {e}: a stop signal waits for idle clients to disconnect");
        }
    });
}

fn install() -> std::io::Result<()> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2(2) into a two-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let [read_fd, write_fd] = fds;
    std::thread::Builder::new()
        .name("ecdedup-stop".into())
        .spawn(move || watch(read_fd))?;
    WAKE_FD.store(write_fd, Ordering::SeqCst);
    for (i, &sig) in STOP_SIGNALS.iter().enumerate() {
        // SAFETY: sigaction(2) with zeroed, then filled, structures.
        unsafe {
            let mut previous: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut previous) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let _ = PREVIOUS[i].set(previous);
            let mut ours: libc::sigaction = std::mem::zeroed();
            ours.sa_sigaction = on_stop_signal as *const () as usize;
            // nbdkit's own restart behaviour and mask, so that its loops
            // see the interruptions they expect.
            ours.sa_flags = libc::SA_SIGINFO | (previous.sa_flags & libc::SA_RESTART);
            ours.sa_mask = previous.sa_mask;
            if libc::sigaction(sig, &ours, std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    Ok(())
}

/// Async-signal-safe: one write(2), then nbdkit's own handler.
extern "C" fn on_stop_signal(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let fd = WAKE_FD.load(Ordering::SeqCst);
    if fd >= 0 {
        // SAFETY: write(2) of one byte from a static; the result does not
        // matter (a full pipe already holds a wake-up).
        unsafe {
            libc::write(fd, b"s".as_ptr().cast(), 1);
        }
    }
    let Some(previous) = STOP_SIGNALS
        .iter()
        .position(|&s| s == sig)
        .and_then(|i| PREVIOUS[i].get())
    else {
        return;
    };
    let handler = previous.sa_sigaction;
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        return;
    }
    // SAFETY: `handler` is the function nbdkit installed for this signal,
    // called with the arguments its flags say it takes.
    unsafe {
        if previous.sa_flags & libc::SA_SIGINFO != 0 {
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                std::mem::transmute(handler);
            f(sig, info, ctx);
        } else {
            let f: extern "C" fn(libc::c_int) = std::mem::transmute(handler);
            f(sig);
        }
    }
}

/// Waits for a stop signal, then ends the reads of client connections
/// until nbdkit has unloaded the plugin, or aborts past [`STOP_BOUND`].
fn watch(read_fd: RawFd) {
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
    eprintln!("ecdedup: stopping: client connections end after their current request");
    let deadline = Instant::now() + STOP_BOUND;
    while Instant::now() < deadline || CLOSING.load(Ordering::SeqCst) {
        if !CLOSING.load(Ordering::SeqCst) {
            end_client_reads();
        }
        std::thread::sleep(STOP_POLL);
    }
    eprintln!(
        "ecdedup: the server did not stop within {STOP_BOUND:?} of the stop signal; aborting \
         (the next start resynchronises the array)"
    );
    std::process::abort();
}

/// Shuts the read side of every accepted stream connection of this
/// process: a connection whose local address is that of one of its
/// listening sockets (NBD clients, and the control and metrics sockets).
fn end_client_reads() {
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let fds: Vec<RawFd> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    let mut listening = Vec::new();
    let mut accepted = Vec::new();
    for fd in fds {
        if socket_option(fd, libc::SO_TYPE) != Some(libc::SOCK_STREAM) {
            continue;
        }
        let Some(address) = local_address(fd) else {
            continue;
        };
        match socket_option(fd, libc::SO_ACCEPTCONN) {
            Some(0) => accepted.push((fd, address)),
            Some(_) => listening.push(address),
            None => {}
        }
    }
    for (fd, address) in accepted {
        if listening.contains(&address) {
            // SAFETY: shutdown(2) of a socket this process holds.
            unsafe {
                libc::shutdown(fd, libc::SHUT_RD);
            }
        }
    }
}

/// An integer socket option; None when `fd` is not a socket.
fn socket_option(fd: RawFd, option: libc::c_int) -> Option<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt(2) into an int of the length given.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            option,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(value)
}

/// What identifies the listener a socket belongs to: its family with the
/// path (Unix) or the port (TCP; the accepted side's address may be a
/// concrete one of a wildcard listener).
fn local_address(fd: RawFd) -> Option<(libc::c_int, Vec<u8>)> {
    // SAFETY: getsockname(2) into a zeroed sockaddr_storage of its size.
    let (storage, len) = unsafe {
        let mut storage: libc::sockaddr_storage = std::mem::zeroed();
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        if libc::getsockname(
            fd,
            (&mut storage as *mut libc::sockaddr_storage).cast(),
            &mut len,
        ) != 0
        {
            return None;
        }
        (storage, len as usize)
    };
    // SAFETY: the first `len` bytes of the storage were written by the kernel.
    let bytes = unsafe {
        std::slice::from_raw_parts(
            (&storage as *const libc::sockaddr_storage).cast::<u8>(),
            len.min(std::mem::size_of::<libc::sockaddr_storage>()),
        )
    };
    let family = libc::c_int::from(storage.ss_family);
    let key = match family {
        libc::AF_UNIX => bytes.get(2..)?.to_vec(),
        libc::AF_INET | libc::AF_INET6 => bytes.get(2..4)?.to_vec(),
        _ => return None,
    };
    Some((family, key))
}
