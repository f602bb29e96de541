//! The end of a server's life by a stop signal: under a write load with
//! many requests in flight on one connection, and with clients that never
//! finish their NBD handshake. Each story sends SIGTERM and checks that the
//! server exits with status 0, within its bound, with the array closed
//! cleanly (no dirty intent region) and every acknowledged write there.

use crate::support;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::checker::{block_content, decode, BLOCK};
use support::nbd::{self, CMD_WRITE, REQUEST_MAGIC, SIMPLE_REPLY_MAGIC};
use support::{Background, TestArray, KIB, MIB, SERVER_STOP_TIMEOUT};

/// Bytes per write of the load (fio's `--bs=64k` of the report).
const WRITE_BYTES: u64 = 64 * KIB;
/// Requests in flight on the load's connection (fio's `--iodepth=16`).
const QUEUE_DEPTH: usize = 16;
/// The volume of the load tests.
const VOLUME_BYTES: u64 = 64 * MIB;
/// Writes acknowledged in a round before the stop signal: the load runs.
const ACKED_BEFORE_STOP: u64 = 300;
/// How long a round may take to reach [`ACKED_BEFORE_STOP`].
const LOAD_TIMEOUT: Duration = Duration::from_secs(120);

/// What the load knows about one 64 KiB slot of the volume: every block of
/// it holds `acked` (the newest write the server acknowledged; 0 is
/// zeroes) or, after a stop, the write that was in flight.
#[derive(Clone, Copy, Default)]
struct Slot {
    acked: u64,
    in_flight: Option<u64>,
}

/// The writes of a load, sent `QUEUE_DEPTH` at a time on one connection to
/// slots that have no write in flight (so their order is known).
struct Load {
    slots: Vec<Slot>,
    next_seq: u64,
    acked: Arc<AtomicU64>,
    error_replies: u64,
    ended_by: String,
}

impl Load {
    fn new() -> Load {
        Load {
            slots: vec![Slot::default(); (VOLUME_BYTES / WRITE_BYTES) as usize],
            next_seq: 1,
            acked: Arc::new(AtomicU64::new(0)),
            error_replies: 0,
            ended_by: String::new(),
        }
    }

    /// Writes until the connection breaks (the server stopped) or `stop`.
    /// A write the server fails ends the load, as fio ends a job: the
    /// connection is dropped with the other requests still in flight.
    fn run(mut self, socket: &Path, stop: &AtomicBool) -> Load {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(self.next_seq);
        let mut sock = match nbd::Client::connect(socket) {
            Ok(c) => c.into_stream(),
            Err(e) => {
                self.ended_by = format!("connect: {e:?}");
                return self;
            }
        };
        // handle -> slot; a write's sequence number is in its slot.
        let mut pending: HashMap<u64, usize> = HashMap::new();
        let mut handle = 0u64;
        loop {
            while pending.len() < QUEUE_DEPTH && !stop.load(Ordering::SeqCst) {
                let slot = loop {
                    let s = rng.gen_range(0..self.slots.len());
                    if self.slots[s].in_flight.is_none() {
                        break s;
                    }
                };
                let seq = self.next_seq;
                self.next_seq += 1;
                handle += 1;
                self.slots[slot].in_flight = Some(seq);
                pending.insert(handle, slot);
                let offset = slot as u64 * WRITE_BYTES;
                let mut request = Vec::with_capacity(28 + WRITE_BYTES as usize);
                request.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
                request.extend_from_slice(&0u16.to_be_bytes());
                request.extend_from_slice(&CMD_WRITE.to_be_bytes());
                request.extend_from_slice(&handle.to_be_bytes());
                request.extend_from_slice(&offset.to_be_bytes());
                request.extend_from_slice(&(WRITE_BYTES as u32).to_be_bytes());
                for b in 0..WRITE_BYTES / BLOCK {
                    request.extend(block_content(offset + b * BLOCK, seq));
                }
                if let Err(e) = sock.write_all(&request) {
                    self.ended_by = format!("sending a write: {e}");
                    return self;
                }
            }
            if pending.is_empty() {
                self.ended_by = "stopped".into();
                return self;
            }
            let mut reply = [0u8; 16];
            if let Err(e) = sock.read_exact(&mut reply) {
                self.ended_by = format!("reading a reply: {e}");
                return self;
            }
            let magic = u32::from_be_bytes(reply[0..4].try_into().unwrap());
            let error = u32::from_be_bytes(reply[4..8].try_into().unwrap());
            let h = u64::from_be_bytes(reply[8..16].try_into().unwrap());
            assert_eq!(magic, SIMPLE_REPLY_MAGIC, "reply magic");
            let slot = pending
                .remove(&h)
                .unwrap_or_else(|| panic!("a reply for handle {h}, which is not in flight"));
            if error != 0 {
                // Not acknowledged: the slot may hold it or not.
                self.error_replies += 1;
                self.ended_by = format!("the server failed a write with error {error}");
                return self;
            }
            let s = &mut self.slots[slot];
            s.acked = s.in_flight.take().expect("in flight");
            self.acked.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Reads every slot back from a fresh server and checks it against the
    /// model; what was read becomes the acknowledged state.
    fn verify(&mut self, socket: &Path) -> Result<(), String> {
        let mut client = nbd::Client::connect(socket).map_err(|e| format!("connect: {e:?}"))?;
        let mut errors = Vec::new();
        for (i, slot) in self.slots.iter_mut().enumerate() {
            let offset = i as u64 * WRITE_BYTES;
            let data = client
                .read(offset, WRITE_BYTES as usize)
                .map_err(|e| format!("reading slot {i}: {e:?}"))?;
            let mut seen = None;
            for (b, block) in data.chunks(BLOCK as usize).enumerate() {
                let at = offset + b as u64 * BLOCK;
                match decode(at, block) {
                    Ok(seq) if seq == slot.acked || Some(seq) == slot.in_flight => seen = Some(seq),
                    Ok(seq) => errors.push(format!(
                        "block at {at}: write {seq}, but the acknowledged one is {} (in flight: {:?})",
                        slot.acked, slot.in_flight
                    )),
                    Err(e) => errors.push(e),
                }
            }
            slot.acked = seen.unwrap_or(slot.acked);
            slot.in_flight = None;
        }
        client.disconnect();
        if errors.is_empty() {
            Ok(())
        } else {
            let n = errors.len();
            errors.truncate(10);
            Err(format!("{n} blocks wrong:\n{}", errors.join("\n")))
        }
    }
}

/// Reads 64 KiB blocks, `QUEUE_DEPTH` at a time on one connection, taking
/// its replies slowly (a client busy with what it read), so that the
/// server's threads queue to send them; until the connection breaks or
/// `stop`. A failed read ends it and drops the connection at once, with
/// the other reads in flight. Returns how it ended.
fn slow_reader(socket: &Path, stop: &AtomicBool, replies: &AtomicU64) -> String {
    let mut sock = match nbd::Client::connect(socket) {
        Ok(c) => c.into_stream(),
        Err(e) => return format!("connect: {e:?}"),
    };
    let mut in_flight = 0usize;
    let mut handle = 0u64;
    let mut data = vec![0u8; WRITE_BYTES as usize];
    loop {
        while in_flight < QUEUE_DEPTH && !stop.load(Ordering::SeqCst) {
            handle += 1;
            let offset = (handle * 7919 % (VOLUME_BYTES / WRITE_BYTES)) * WRITE_BYTES;
            let mut request = Vec::with_capacity(28);
            request.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
            request.extend_from_slice(&0u16.to_be_bytes());
            request.extend_from_slice(&nbd::CMD_READ.to_be_bytes());
            request.extend_from_slice(&handle.to_be_bytes());
            request.extend_from_slice(&offset.to_be_bytes());
            request.extend_from_slice(&(WRITE_BYTES as u32).to_be_bytes());
            if let Err(e) = sock.write_all(&request) {
                return format!("sending a read: {e}");
            }
            in_flight += 1;
        }
        if in_flight == 0 {
            return "stopped".into();
        }
        std::thread::sleep(Duration::from_millis(2));
        let mut reply = [0u8; 16];
        if let Err(e) = sock.read_exact(&mut reply) {
            return format!("reading a reply: {e}");
        }
        let error = u32::from_be_bytes(reply[4..8].try_into().unwrap());
        if error != 0 {
            return format!("the server failed a read with error {error}");
        }
        if let Err(e) = sock.read_exact(&mut data) {
            return format!("reading data: {e}");
        }
        in_flight -= 1;
        replies.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn sigterm_under_a_queue_depth_16_write_load_exits_0_with_every_acknowledged_write_kept() {
    let a = TestArray::create("64M");
    let mut load = Load::new();
    for round in 1..=3 {
        let mut server = a.serve();
        let socket = server.socket.clone();
        let acked = Arc::clone(&load.acked);
        let before = acked.load(Ordering::SeqCst);
        let stop = Arc::new(AtomicBool::new(false));
        let read_replies = Arc::new(AtomicU64::new(0));
        let reader = {
            let (stop, socket, replies) =
                (Arc::clone(&stop), socket.clone(), Arc::clone(&read_replies));
            std::thread::spawn(move || slow_reader(&socket, &stop, &replies))
        };
        let writer = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || load.run(&socket, &stop))
        };
        let deadline = Instant::now() + LOAD_TIMEOUT;
        while (acked.load(Ordering::SeqCst) < before + ACKED_BEFORE_STOP
            || read_replies.load(Ordering::SeqCst) < QUEUE_DEPTH as u64)
            && !writer.is_finished()
            && !reader.is_finished()
        {
            assert!(
                Instant::now() < deadline,
                "round {round}: fewer than {ACKED_BEFORE_STOP} writes acknowledged in {LOAD_TIMEOUT:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(
            !writer.is_finished() && !reader.is_finished(),
            "round {round}: the load ended before the stop"
        );
        support::signal(server.pid(), libc::SIGTERM);
        let status = server.wait_exit(SERVER_STOP_TIMEOUT);
        stop.store(true, Ordering::SeqCst);
        load = writer.join().expect("load thread");
        let reader_ended_by = reader.join().expect("reader thread");
        let log = server.log_text();
        let status = status.unwrap_or_else(|| {
            panic!("round {round}: no exit within {SERVER_STOP_TIMEOUT:?} of SIGTERM; log:\n{log}")
        });
        assert!(
            status.success(),
            "round {round}: the server exited with {status} after SIGTERM under load \
             (writes ended by: {}, after {} error replies; reads ended by: {reader_ended_by}); \
             log:\n{log}",
            load.ended_by,
            load.error_replies
        );
        assert!(
            log.contains("stopping"),
            "round {round}: no stop logged:\n{log}"
        );
        assert_eq!(
            a.status()["dirty_regions"].as_u64(),
            Some(0),
            "round {round}: a clean stop leaves no dirty intent region; log:\n{log}"
        );
        let server = a.serve();
        load.verify(&server.socket)
            .unwrap_or_else(|e| panic!("round {round}: after the stop: {e}"));
        server.stop();
    }
    assert!(
        load.acked.load(Ordering::SeqCst) >= 3 * ACKED_BEFORE_STOP,
        "the load ran"
    );
}

/// Reads the start of the server's handshake (NBDMAGIC, IHAVEOPT, flags).
fn read_greeting(sock: &mut UnixStream) {
    let mut greeting = [0u8; 18];
    sock.read_exact(&mut greeting)
        .expect("the server's greeting");
    assert_eq!(
        u64::from_be_bytes(greeting[0..8].try_into().unwrap()),
        nbd::NBDMAGIC,
        "greeting"
    );
}

#[test]
fn sigterm_stops_the_server_while_clients_stay_stuck_in_the_handshake() {
    let a = TestArray::create("64M");
    let socket = a.path("stuck.sock");
    support::plugin_path();
    // No client completes a handshake before the stop (a probe would).
    let server = Background::spawn(&mut a.cli_command(&[
        "serve",
        "--socket",
        socket.to_str().expect("path"),
        "--threads",
        "8",
    ]));
    let deadline = Instant::now() + support::SERVER_READY_TIMEOUT;
    // Says nothing at all.
    let mut silent = loop {
        if let Ok(mut s) = UnixStream::connect(&socket) {
            s.set_read_timeout(Some(support::SERVER_READY_TIMEOUT))
                .expect("timeout");
            read_greeting(&mut s);
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the server did not listen within {:?}",
            support::SERVER_READY_TIMEOUT
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    // Half a handshake: the client flags, then no option.
    let mut half = UnixStream::connect(&socket).expect("connect");
    half.set_read_timeout(Some(support::SERVER_READY_TIMEOUT))
        .expect("timeout");
    read_greeting(&mut half);
    half.write_all(&1u32.to_be_bytes()).expect("client flags");

    support::signal(server.pid(), libc::SIGTERM);
    let out = server
        .wait(SERVER_STOP_TIMEOUT)
        .unwrap_or_else(|e| panic!("stuck clients held the stop: {e}"));
    assert!(out.success(), "exit after SIGTERM: {out}");
    assert!(out.stderr.contains("stopping"), "the stop is logged: {out}");
    let mut rest = Vec::new();
    let _ = silent.read_to_end(&mut rest);
    drop(half);
    assert_eq!(a.status()["dirty_regions"].as_u64(), Some(0));
}
