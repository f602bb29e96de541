//! Block traces end to end: `serve --trace` records what real NBD clients
//! write (nbdcopy, plus unaligned writes, a write-zeroes and a flush through
//! a plain NBD client), and `ecdedup sim` replays the file it wrote. The
//! story checks the contract between the recorder and the parser: every
//! line parses, host page writes equal the pages written, and the recorded
//! fingerprints are those of the bytes the volume holds.

use crate::support;

use ecdedup::fingerprint::Algorithm;
use std::collections::HashMap;
use std::process::Command;
use support::{pseudo_random, run_ok, TestArray, CLI_TIMEOUT, MIB, TOOL_TIMEOUT};

const PAGE: usize = 4096;
const IMAGE_BYTES: usize = 8 * MIB as usize;

/// 8 MiB of pages where every fourth page repeats one of 16 popular pages
/// and none is all zeroes (so nbdcopy writes every page).
fn make_image() -> Vec<u8> {
    let mut img = pseudo_random(0x7ACE, IMAGE_BYTES);
    let popular = pseudo_random(0x90B, 16 * PAGE);
    for p in (0..IMAGE_BYTES / PAGE).step_by(4) {
        let src = (p / 4) % 16 * PAGE;
        img[p * PAGE..(p + 1) * PAGE].copy_from_slice(&popular[src..src + PAGE]);
    }
    img
}

fn sha1_hex(page: &[u8]) -> String {
    Algorithm::Sha1.fingerprint(page).to_string()
}

/// Replays the write and trim lines of a trace: page offset -> the
/// fingerprint of its last recorded content; also page writes and flushes.
fn recorded_pages(trace: &str) -> (HashMap<u64, String>, u64, u64) {
    let mut pages = HashMap::new();
    let (mut page_writes, mut flushes) = (0, 0);
    for line in trace.lines().filter(|l| !l.starts_with('#')) {
        let f: Vec<&str> = line.split_ascii_whitespace().collect();
        match f[1] {
            "W" => {
                let offset: u64 = f[2].parse().unwrap();
                let length: u64 = f[3].parse().unwrap();
                assert_eq!(length % PAGE as u64, 0, "{line}");
                assert_eq!(f.len() as u64, 4 + 2 * length / PAGE as u64, "{line}");
                for i in 0..length / PAGE as u64 {
                    let fp = f[4 + 2 * i as usize].to_string();
                    pages.insert(offset + i * PAGE as u64, fp);
                    page_writes += 1;
                }
            }
            "T" => {
                let offset: u64 = f[2].parse().unwrap();
                let length: u64 = f[3].parse().unwrap();
                for i in 0..length / PAGE as u64 {
                    pages.insert(offset + i * PAGE as u64, sha1_hex(&[0; PAGE]));
                }
            }
            "F" => flushes += 1,
            _ => {}
        }
    }
    (pages, page_writes, flushes)
}

#[test]
fn a_trace_recorded_by_serve_replays_in_the_simulator_with_every_written_page() {
    support::require_tool("nbdcopy");
    let a = TestArray::create("64M");
    let trace_path = a.path("volume.trace");
    let trace_arg = trace_path.to_str().unwrap().to_string();
    let server = a
        .try_serve(&["--trace", &trace_arg])
        .unwrap_or_else(|e| panic!("{e}"));

    // A real client writes the image from the volume's start.
    let src = a.path("image.raw");
    let mut volume = make_image();
    std::fs::write(&src, &volume).unwrap();
    run_ok(
        Command::new("nbdcopy")
            .arg("--flush")
            .arg(&src)
            .arg(server.uri()),
        TOOL_TIMEOUT,
    );
    // Unaligned writes, a write-zeroes with ragged edges, and a flush.
    let mut client = server.client();
    let patch = [0x5au8; 100];
    client.write(5000, &patch, false).unwrap();
    volume[5000..5100].copy_from_slice(&patch);
    let ragged = pseudo_random(3, 2 * PAGE);
    client.write(40 * PAGE as u64 + 10, &ragged, false).unwrap();
    volume[40 * PAGE + 10..42 * PAGE + 10].copy_from_slice(&ragged);
    client
        .write_zeroes(60 * PAGE as u64 + 1000, 3 * PAGE as u32, false)
        .unwrap();
    volume[60 * PAGE + 1000..63 * PAGE + 1000].fill(0);
    client.flush().unwrap();
    client.disconnect();
    server.stop();

    let trace = std::fs::read_to_string(&trace_path).unwrap();
    let (pages, page_writes, flushes) = recorded_pages(&trace);
    assert!(flushes >= 2, "nbdcopy --flush and the client flushed");
    // The image's pages, then: the 100-byte write (1 page), the ragged
    // write (3 pages), the edges of the write-zeroes (2 pages).
    let image_pages = (IMAGE_BYTES / PAGE) as u64;
    assert_eq!(page_writes, image_pages + 1 + 3 + 2, "page writes recorded");
    for (offset, fp) in &pages {
        let o = *offset as usize;
        assert_eq!(
            *fp,
            sha1_hex(&volume[o..o + PAGE]),
            "recorded fingerprint of page at {offset}"
        );
    }

    // The simulator replays it, strictly (a malformed line fails).
    let out = run_ok(
        &mut a.cli_command(&[
            "sim",
            trace_path.to_str().unwrap(),
            "--mode",
            "none,offline,separated",
            "--on-error",
            "fail",
            "--capacity",
            "64M",
            "--json",
            "--no-progress",
        ]),
        CLI_TIMEOUT,
    );
    let summary = out.json();
    assert_eq!(summary["skipped_lines"].as_u64(), Some(0), "{summary}");
    assert_eq!(
        summary["trace_page_writes"].as_u64(),
        Some(page_writes),
        "{summary}"
    );
    assert_eq!(summary["flush_requests"].as_u64(), Some(flushes));
    assert!(summary["trim_requests"].as_u64().unwrap() >= 1, "{summary}");
    for mode in summary["modes"].as_array().unwrap() {
        assert_eq!(
            mode["host_page_writes"].as_u64(),
            Some(page_writes),
            "host page writes of mode {}",
            mode["mode"]
        );
    }
    // Every fourth image page repeats one of 16: the offline modes find them.
    let separated = &summary["modes"][2];
    assert!(
        separated["nd_region_page_writes"].as_u64().unwrap() >= image_pages / 4 - 16,
        "{separated}"
    );
}
