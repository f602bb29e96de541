//! `ecdedup eval block-separation` on a small synthetic trace: the command
//! writes its report, table and plot, and its counters are exact and
//! deterministic (the same trace gives the same figures, pinned here), so a
//! change to the FTL, the replay or the eval shows up as a changed number.

use crate::support;

use serde_json::Value;
use support::{run_ok, TestArray, CLI_TIMEOUT};

/// A synthetic trace of 30,000 single-page writes over 16 MiB (a third of
/// them from a pool of 256 popular contents, bursts of 256 writes
/// separated by idle seconds, so that the offline pass runs often relative
/// to GC, as in the paper), plus hand-written lines of every other op.
fn make_trace(a: &TestArray) -> std::path::PathBuf {
    let synthetic = a.path("synthetic.trace");
    run_ok(
        &mut a.cli_command(&[
            "sim",
            "--synthetic-writes",
            "30000",
            "--synthetic-dup-share",
            "0.33",
            "--synthetic-dup-pool",
            "256",
            "--synthetic-burst",
            "256",
            "--capacity",
            "16M",
            "--mode",
            "none",
            "--no-progress",
            "--save-trace",
            synthetic.to_str().unwrap(),
        ]),
        CLI_TIMEOUT,
    );
    let mut text = std::fs::read_to_string(&synthetic).unwrap();
    text.push_str("999000000 R 0 8192\n999000100 T 4096 4096\n999000200 F 0 0\n");
    let path = a.path("tiny-workload.trace");
    std::fs::write(&path, text).unwrap();
    path
}

fn mode<'a>(workload: &'a Value, name: &str) -> &'a Value {
    workload["summary"]["modes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mode"] == name)
        .unwrap_or_else(|| panic!("no mode {name}"))
}

#[test]
fn block_separation_eval_reports_exact_deterministic_counters_for_every_mode() {
    let a = TestArray::empty();
    let trace = make_trace(&a);
    let out_dir = a.path("report");
    let run = || {
        run_ok(
            &mut a.cli_command(&[
                "eval",
                "block-separation",
                trace.to_str().unwrap(),
                "--out",
                out_dir.to_str().unwrap(),
                // Small blocks: at 16 MiB, a second write frontier of 128
                // pages would take a third of the spare space.
                "--pages-per-block",
                "32",
                "--no-progress",
            ]),
            CLI_TIMEOUT,
        );
        let json = std::fs::read_to_string(out_dir.join("block-separation.json")).unwrap();
        serde_json::from_str::<Value>(&json).unwrap()
    };
    let first = run();
    let second = run();
    assert_eq!(first, second, "the same trace gives the same figures");

    let w = &first["workloads"][0];
    assert_eq!(w["workload"], "tiny-workload");
    let s = &w["summary"];
    assert_eq!(s["trace_page_writes"], 30000);
    assert_eq!(s["read_requests"], 1);
    assert_eq!(s["trim_requests"], 1);
    assert_eq!(s["flush_requests"], 1);
    assert_eq!(s["skipped_lines"], 0);

    // (mode, GC page copies, block erases, dedup skipped + offline remaps).
    let pinned = [
        ("none", 170216, 6256, 0),
        ("inline", 23554, 1375, 9561),
        ("offline", 38789, 2149, 9322),
        ("separated", 26529, 1767, 9322),
        ("hinted", 26297, 1760, 9322),
    ];
    let mut got = Vec::new();
    for (name, ..) in pinned {
        let m = mode(w, name);
        assert_eq!(m["host_page_writes"], 30000, "{name}");
        let programs = m["nand_page_programs"].as_u64().unwrap();
        let copies = m["gc_page_copies"].as_u64().unwrap();
        let skipped = m["dedup_skipped_writes"].as_u64().unwrap();
        assert_eq!(
            programs + skipped,
            30000 + copies,
            "{name}: counter identity"
        );
        got.push((
            name,
            copies,
            m["block_erases"].as_u64().unwrap(),
            skipped + m["offline_remaps"].as_u64().unwrap(),
        ));
    }
    assert_eq!(got, pinned, "counters changed");
    let copies = |name: &str| mode(w, name)["gc_page_copies"].as_u64().unwrap();
    assert!(
        copies("separated") < copies("offline"),
        "separation copies fewer pages than plain offline dedup"
    );

    let md = std::fs::read_to_string(out_dir.join("block-separation.md")).unwrap();
    assert!(
        md.contains("| tiny-workload | offline + separation |"),
        "{md}"
    );
    assert!(
        md.contains("20-61% fewer"),
        "the paper's figure is beside ours"
    );
    let svg = std::fs::read_to_string(out_dir.join("block-separation.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("tiny-workload"));
}
