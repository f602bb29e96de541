//! The loopback benchmark behind the transport's runtime (docs/benchmarks.md,
//! "Transport runtime"): tokio's multi-thread runtime against plain std
//! threads (one reader and one writer thread per connection side), on one
//! connection that echoes frames: 4 KiB at queue depth 1 and 32, 1 MiB at
//! queue depth 4. Both sides use the same frame code and the same batching
//! (a writer drains its queue before it flushes); the server and the
//! client each get their own runtime (or threads), as two processes would.
//!
//! Runs alternate sides (tokio first in even pairs, std first in odd ones)
//! and print every run, then per case the median (min–max) of each side's
//! round trips per second and of the per-pair ratio tokio / std.
//!
//! ```text
//! cargo run --release -p ecdedup-transport --example runtime_bench -- [PAIRS] [SECONDS]
//! ```
//! PAIRS defaults to 5, SECONDS (measured per run, after a tenth of it to
//! warm up) to 0.5.

use std::io::{BufReader, BufWriter, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc::{sync_channel, Receiver};
use std::time::{Duration, Instant};

use ecdedup_core::proto::{read_frame, Header, Op, Status};
use ecdedup_transport::wire;

const CASES: [(usize, usize); 3] = [(4096, 1), (4096, 32), (1 << 20, 4)];

/// The request for round trip `id`.
fn request(id: u64, payload: &[u8]) -> (Header, Vec<u8>) {
    (Header::request(Op::Write, id, payload), payload.to_vec())
}

/// Counts replies that land in the measured window; says whether to send
/// another request.
struct Window {
    warm_until: Instant,
    end: Instant,
    replies: u64,
}

impl Window {
    fn new(seconds: f64) -> Window {
        let warm_until = Instant::now() + Duration::from_secs_f64(seconds / 10.0);
        Window {
            warm_until,
            end: warm_until + Duration::from_secs_f64(seconds),
            replies: 0,
        }
    }

    /// Records a reply; true while requests should keep going.
    fn reply(&mut self, header: &Header, payload: &[u8], payload_bytes: usize) -> bool {
        assert!(header.is_reply() && header.status == Status::Ok);
        assert_eq!(payload.len(), payload_bytes);
        let now = Instant::now();
        if now >= self.warm_until && now < self.end {
            self.replies += 1;
        }
        now < self.end
    }

    fn rate(&self) -> f64 {
        self.replies as f64 / (self.end - self.warm_until).as_secs_f64()
    }
}

// ---- std threads -------------------------------------------------------

fn std_write(stream: TcpStream, queue: Receiver<(Header, Vec<u8>)>) {
    let mut w = BufWriter::new(stream);
    while let Ok(first) = queue.recv() {
        let mut next = Some(first);
        while let Some((header, payload)) = next {
            w.write_all(&header.encode()).unwrap();
            w.write_all(&payload).unwrap();
            next = queue.try_recv().ok();
        }
        w.flush().unwrap();
    }
}

fn std_serve(stream: TcpStream) {
    stream.set_nodelay(true).unwrap();
    let (replies, queue) = sync_channel(64);
    let w = stream.try_clone().unwrap();
    let writer = std::thread::spawn(move || std_write(w, queue));
    let mut r = BufReader::new(stream);
    let mut payload = Vec::new();
    while let Ok(Some(header)) = read_frame(&mut r, &mut payload) {
        let echo = std::mem::take(&mut payload);
        if replies
            .send((header.reply(Status::Ok, &echo), echo))
            .is_err()
        {
            break;
        }
    }
    drop(replies);
    writer.join().unwrap();
}

fn std_run(payload_bytes: usize, depth: usize, seconds: f64) -> f64 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || std_serve(listener.accept().unwrap().0));
    let stream = TcpStream::connect(addr).unwrap();
    stream.set_nodelay(true).unwrap();
    let (requests, queue) = sync_channel(2 * depth);
    let w = stream.try_clone().unwrap();
    let writer = std::thread::spawn(move || std_write(w, queue));
    let data = vec![0xa5u8; payload_bytes];
    let mut window = Window::new(seconds);
    for id in 0..depth {
        requests.send(request(id as u64, &data)).unwrap();
    }
    let (mut in_flight, mut next_id) = (depth, depth as u64);
    let mut r = BufReader::new(stream.try_clone().unwrap());
    let mut payload = Vec::new();
    while in_flight > 0 {
        let header = read_frame(&mut r, &mut payload).unwrap().unwrap();
        if window.reply(&header, &payload, payload_bytes) {
            requests.send(request(next_id, &data)).unwrap();
            next_id += 1;
        } else {
            in_flight -= 1;
        }
    }
    drop(requests);
    writer.join().unwrap();
    stream.shutdown(std::net::Shutdown::Both).unwrap();
    server.join().unwrap();
    window.rate()
}

// ---- tokio -------------------------------------------------------------

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn tokio_serve(stream: tokio::net::TcpStream) {
    stream.set_nodelay(true).unwrap();
    let (r, w) = stream.into_split();
    let (replies, mut queue) = tokio::sync::mpsc::channel(64);
    let writer = tokio::spawn(async move { wire::write_queued(w, &mut queue).await });
    let mut r = tokio::io::BufReader::new(r);
    let mut payload = Vec::new();
    while let Ok(Some(header)) = wire::read_frame(&mut r, &mut payload).await {
        let echo = std::mem::take(&mut payload);
        if replies
            .send((header.reply(Status::Ok, &echo), echo))
            .await
            .is_err()
        {
            break;
        }
    }
    drop(replies);
    writer.await.unwrap().unwrap();
}

async fn tokio_client(addr: SocketAddr, payload_bytes: usize, depth: usize, seconds: f64) -> f64 {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let (r, w) = stream.into_split();
    let (requests, mut queue) = tokio::sync::mpsc::channel(2 * depth);
    let writer = tokio::spawn(async move { wire::write_queued(w, &mut queue).await });
    let data = vec![0xa5u8; payload_bytes];
    let mut window = Window::new(seconds);
    for id in 0..depth {
        requests.send(request(id as u64, &data)).await.unwrap();
    }
    let (mut in_flight, mut next_id) = (depth, depth as u64);
    let mut r = tokio::io::BufReader::new(r);
    let mut payload = Vec::new();
    while in_flight > 0 {
        let header = wire::read_frame(&mut r, &mut payload)
            .await
            .unwrap()
            .unwrap();
        if window.reply(&header, &payload, payload_bytes) {
            requests.send(request(next_id, &data)).await.unwrap();
            next_id += 1;
        } else {
            in_flight -= 1;
        }
    }
    drop(requests);
    writer.await.unwrap().unwrap();
    window.rate()
}

fn tokio_run(payload_bytes: usize, depth: usize, seconds: f64) -> f64 {
    let (server_rt, client_rt) = (runtime(), runtime());
    let listener = server_rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let server =
        server_rt.spawn(async move { tokio_serve(listener.accept().await.unwrap().0).await });
    let rate = client_rt.block_on(tokio_client(addr, payload_bytes, depth, seconds));
    server_rt.block_on(server).unwrap();
    rate
}

// ---- the comparison ----------------------------------------------------

fn summary(xs: &[f64]) -> String {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let median = if !v.len().is_multiple_of(2) {
        v[v.len() / 2]
    } else {
        (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
    };
    let fmt = |x: f64| {
        if x >= 100.0 {
            format!("{x:.0}")
        } else {
            format!("{x:.2}")
        }
    };
    format!("{} ({}–{})", fmt(median), fmt(v[0]), fmt(v[v.len() - 1]))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let pairs: usize = args.get(1).map_or(5, |a| a.parse().expect("PAIRS"));
    let seconds: f64 = args.get(2).map_or(0.5, |a| a.parse().expect("SECONDS"));
    let mut results = vec![(Vec::new(), Vec::new()); CASES.len()];
    for pair in 0..pairs {
        for (case, &(payload_bytes, depth)) in CASES.iter().enumerate() {
            let run_tokio = || tokio_run(payload_bytes, depth, seconds);
            let run_std = || std_run(payload_bytes, depth, seconds);
            let (t, s) = if pair % 2 == 0 {
                let t = run_tokio();
                (t, run_std())
            } else {
                let s = run_std();
                (run_tokio(), s)
            };
            println!(
                "pair {pair} payload {payload_bytes} B QD{depth}: tokio {t:.0}/s std {s:.0}/s ratio {:.3}",
                t / s
            );
            results[case].0.push(t);
            results[case].1.push(s);
        }
    }
    println!();
    println!("| case | tokio round trips/s | std threads round trips/s | tokio / std |");
    println!("| --- | --- | --- | --- |");
    for (&(payload_bytes, depth), (t, s)) in CASES.iter().zip(&results) {
        let ratios: Vec<f64> = t.iter().zip(s).map(|(a, b)| a / b).collect();
        let size = if payload_bytes >= 1 << 20 {
            format!("{} MiB", payload_bytes >> 20)
        } else {
            format!("{} KiB", payload_bytes >> 10)
        };
        println!(
            "| {size} QD{depth} | {} | {} | {} |",
            summary(t),
            summary(s),
            summary(&ratios)
        );
    }
}
