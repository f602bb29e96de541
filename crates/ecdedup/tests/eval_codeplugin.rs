//! `ecdedup eval codeplugin --generate` on its small seeded input: the
//! command writes its report, JSON and four plots, reads every object back
//! bit-exact (it fails otherwise), and its counts are exact: the same
//! input and options give the same blocks, unique and redundant blocks,
//! stripes encoded per scheme, map bytes and cache counters, pinned here,
//! so that a change to dedup, shuffling, exchange, the cache or the map
//! encoding shows up as a changed number. No timing is checked.

use serde_json::Value;
use std::process::Command;

/// (name, blocks, unique, redundant, stripes encoded, stripes, map bytes,
/// cache hits, misses, evictions)
type Expected = (&'static str, u64, u64, u64, u64, u64, u64, u64, u64, u64);

const EXPECTED: [Expected; 10] = [
    (
        "plain RS (6,3) cache 64K",
        960,
        960,
        0,
        160,
        160,
        0,
        0,
        0,
        0,
    ),
    (
        "CodePlugin no-EX (6,3) cache 64K",
        960,
        686,
        274,
        133,
        160,
        18236,
        274,
        686,
        174,
    ),
    (
        "CodePlugin 2-EX (6,3) cache 64K",
        960,
        686,
        274,
        124,
        160,
        18000,
        274,
        686,
        174,
    ),
    (
        "CodePlugin 4-EX (6,3) cache 64K",
        960,
        686,
        274,
        118,
        160,
        17864,
        274,
        686,
        174,
    ),
    (
        "plain RS (4,2) cache 64K",
        960,
        960,
        0,
        240,
        240,
        0,
        0,
        0,
        0,
    ),
    (
        "CodePlugin 4-EX (4,2) cache 64K",
        960,
        686,
        274,
        176,
        240,
        17568,
        274,
        686,
        174,
    ),
    ("plain RS (10,5) cache 64K", 960, 960, 0, 96, 96, 0, 0, 0, 0),
    (
        "CodePlugin 4-EX (10,5) cache 64K",
        960,
        686,
        274,
        73,
        96,
        18484,
        274,
        686,
        174,
    ),
    (
        "CodePlugin 4-EX (6,3) cache 16K",
        960,
        862,
        98,
        148,
        160,
        18224,
        98,
        862,
        734,
    ),
    (
        "CodePlugin 4-EX (6,3) cache 32K",
        960,
        859,
        101,
        148,
        160,
        18224,
        101,
        859,
        603,
    ),
];

fn u(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} missing in {v}"))
}

#[test]
fn codeplugin_eval_on_generated_images_reports_exact_counts_for_every_scheme() {
    let out = tempfile::tempdir().unwrap();
    let run = Command::new(env!("CARGO_BIN_EXE_ecdedup"))
        .args(["eval", "codeplugin", "--generate", "--no-progress", "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "eval codeplugin failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    for file in [
        "codeplugin.md",
        "codeplugin.json",
        "codeplugin-fig4.svg",
        "codeplugin-fig5.svg",
        "codeplugin-fig6.svg",
        "codeplugin-fig7.svg",
    ] {
        assert!(out.path().join(file).is_file(), "{file} not written");
    }
    assert!(
        !out.path().join("work").exists(),
        "the archives are removed"
    );
    let r: Value =
        serde_json::from_slice(&std::fs::read(out.path().join("codeplugin.json")).unwrap())
            .unwrap();
    // 4 images of 240 blocks of 8 KiB in 960 KiB containers.
    assert_eq!(u(&r, "input_bytes"), 4 * 240 * 8192);
    let offline = &r["offline"];
    assert_eq!(
        (
            u(offline, "blocks"),
            u(offline, "distinct_blocks"),
            u(offline, "redundant_blocks"),
            u(offline, "zero_blocks")
        ),
        (960, 686, 274, 64)
    );

    let runs = r["runs"].as_array().unwrap();
    let built: Vec<&Value> = runs.iter().filter(|x| x["not_built"].is_null()).collect();
    let got: Vec<Expected> = built
        .iter()
        .zip(EXPECTED)
        .map(|(x, e)| {
            (
                e.0,
                u(x, "blocks"),
                u(x, "unique_blocks"),
                u(x, "redundant_blocks"),
                u(x, "stripes_encoded"),
                u(x, "stripes"),
                u(x, "map_bytes"),
                u(x, "cache_hits"),
                u(x, "cache_misses"),
                u(x, "cache_evictions"),
            )
        })
        .collect();
    let names: Vec<&str> = built.iter().map(|x| x["name"].as_str().unwrap()).collect();
    assert_eq!(names, EXPECTED.map(|e| e.0).to_vec());
    assert_eq!(got, EXPECTED.to_vec());
    for x in &built {
        // Parity is m blocks per encoded stripe; 8 containers each run.
        let m = u(x, "m");
        assert_eq!(u(x, "parity_bytes"), u(x, "stripes_encoded") * m * 8192);
        assert_eq!(u(x, "containers_sealed"), 8, "{}", x["name"]);
    }
    // With an unbounded cache (the offline count) and 64K, dedup finds
    // every copy; smaller caches find fewer.
    assert_eq!(
        u(built[1], "redundant_blocks"),
        u(offline, "redundant_blocks")
    );

    let not_built: Vec<&str> = runs
        .iter()
        .filter(|x| !x["not_built"].is_null())
        .map(|x| x["scheme"].as_str().unwrap())
        .collect();
    assert_eq!(not_built, ["compact", "cdc"]);
    let md = std::fs::read_to_string(out.path().join("codeplugin.md")).unwrap();
    assert!(md.contains("| compact | not in this eval yet"), "{md}");
    assert!(
        md.contains("| CodePlugin 4-EX | 0.003 | -26.2% | 16.10 | -17.4% |"),
        "{md}"
    );
    // The read comparison ran (bit-exact, or the command would have failed).
    assert!(built[0]["read"].is_object() && built[1]["read"].is_object());
}
