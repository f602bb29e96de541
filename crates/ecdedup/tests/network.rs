//! The network faces of `serve`: `--tcp PORT` and `--metrics PORT` bind
//! loopback only (checked in /proc/net/tcp, not just by connecting), NBD
//! over TCP carries data, and /metrics speaks Prometheus text.
//!
//! All traffic stays on 127.0.0.1; ports are picked free by the kernel.

use crate::support;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};
use support::{run, run_ok, Background, TestArray, TOOL_TIMEOUT};

/// A port the kernel says is free on loopback right now.
fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().unwrap().port()
}

/// Local addresses (IPv4, as "a.b.c.d") listening on `port`, from /proc/net/tcp.
fn listeners_on(port: u16) -> Vec<String> {
    let text = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    let mut found = Vec::new();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        // f[1] = "0100007F:1F90" (address little-endian hex : port hex), f[3] = state, 0A = LISTEN.
        if f.len() < 4 || f[3] != "0A" {
            continue;
        }
        let Some((addr, p)) = f[1].split_once(':') else {
            continue;
        };
        if u16::from_str_radix(p, 16).ok() != Some(port) {
            continue;
        }
        let a = u32::from_str_radix(addr, 16).unwrap_or(0).to_le_bytes();
        found.push(format!("{}.{}.{}.{}", a[0], a[1], a[2], a[3]));
    }
    found
}

/// Waits until something listens on `port` (or the deadline passes).
fn wait_listening(port: u16, server: &mut Background) {
    let deadline = Instant::now() + support::SERVER_READY_TIMEOUT;
    while listeners_on(port).is_empty() {
        if let Ok(Some(st)) = server.child.try_wait() {
            panic!("server exited ({st}) before listening on {port}");
        }
        assert!(
            Instant::now() < deadline,
            "nothing listens on port {port} after {:?}",
            support::SERVER_READY_TIMEOUT
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn http_get(port: u16, path: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect to metrics");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).expect("read metrics reply");
    body
}

#[test]
fn tcp_and_metrics_bind_loopback_and_answer() {
    support::require_tool("nbdkit");
    support::require_tool("nbdcopy");
    let _ = support::plugin_path();
    let a = TestArray::create("64M");
    let (nbd_port, metrics_port) = (free_port(), free_port());
    let mut server = Background::spawn(&mut a.cli_command(&[
        "serve",
        "--tcp",
        &nbd_port.to_string(),
        "--metrics",
        &metrics_port.to_string(),
        "--threads",
        "4",
    ]));
    wait_listening(nbd_port, &mut server);
    wait_listening(metrics_port, &mut server);
    assert_eq!(listeners_on(nbd_port), vec!["127.0.0.1".to_string()]);
    assert_eq!(listeners_on(metrics_port), vec!["127.0.0.1".to_string()]);

    // Data over TCP: an image in and out.
    let uri = format!("nbd://127.0.0.1:{nbd_port}");
    let img = support::pseudo_random(42, 4 << 20);
    let src = a.path("in.raw");
    std::fs::write(&src, &img).unwrap();
    run_ok(
        Command::new("nbdcopy").arg("--flush").arg(&src).arg(&uri),
        TOOL_TIMEOUT,
    );
    let out = a.path("out.raw");
    run_ok(Command::new("nbdcopy").arg(&uri).arg(&out), TOOL_TIMEOUT);
    let got = std::fs::read(&out).unwrap();
    support::assert_same_bytes("image over TCP", &got[..img.len()], &img);

    // Prometheus text, with the writes just made counted.
    let reply = http_get(metrics_port, "/metrics");
    assert!(
        reply.starts_with("HTTP/1.0 200") || reply.starts_with("HTTP/1.1 200"),
        "{reply}"
    );
    assert!(reply.contains("# TYPE"), "not Prometheus text: {reply}");
    let writes: u64 = reply
        .lines()
        .filter(|l| {
            l.starts_with("ecdedup_device_write_bytes")
                || l.starts_with("ecdedup_device_write_bytes_total")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum();
    assert!(
        writes >= img.len() as u64,
        "device write bytes in /metrics ({writes}) should count the {} bytes written:\n{reply}",
        img.len()
    );
    let missing = http_get(metrics_port, "/nothing-here");
    assert!(missing.contains("404"), "{missing}");

    support::signal(server.pid(), libc_sigterm());
    let stopped = server
        .wait(support::SERVER_STOP_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        listeners_on(nbd_port).is_empty(),
        "port still open after stop: {stopped}"
    );
}

#[test]
fn a_malformed_tcp_address_is_refused_with_a_reason() {
    let a = TestArray::create("64M");
    let out = run(
        &mut a.cli_command(&["serve", "--tcp", "not-a-port"]),
        support::CLI_TIMEOUT,
    )
    .failed();
    assert!(out.stderr.contains("--tcp"), "{out}");
}

fn libc_sigterm() -> i32 {
    15
}
