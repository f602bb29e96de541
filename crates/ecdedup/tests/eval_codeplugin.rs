//! `ecdedup eval codeplugin --generate` on its small seeded input: the
//! command writes its report, JSON and four plots, reads every object back
//! bit-exact (it fails otherwise), and its counts are exact: the same
//! input and options give the same blocks, unique and redundant blocks,
//! stripes encoded per scheme, map bytes, cache counters, data bytes
//! stored and CDC chunks, pinned here, so that a change to dedup,
//! shuffling, exchange, the cache, the map encoding, the compact layout or
//! the chunking shows up as a changed number. No timing is checked.

use serde_json::Value;
use std::process::Command;

/// (name, blocks, unique, redundant, stripes encoded, stripes, map bytes,
/// cache hits, misses, evictions)
type Expected = (&'static str, u64, u64, u64, u64, u64, u64, u64, u64, u64);

/// No-EX's counts after its name.
const NO_EX: (u64, u64, u64, u64, u64, u64, u64, u64, u64) =
    (960, 686, 274, 133, 160, 18236, 274, 686, 174);

/// A row of `EXPECTED` with no-EX's counts.
const fn as_no_ex(name: &'static str) -> Expected {
    let c = NO_EX;
    (name, c.0, c.1, c.2, c.3, c.4, c.5, c.6, c.7, c.8)
}

const EXPECTED: [Expected; 12] = [
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
    as_no_ex("CodePlugin no-EX (6,3) cache 64K"),
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
    // Compact: no-EX's counts, stripes and map (the same dedup and
    // placement; only what the data sub-files hold differs).
    as_no_ex("compact (6,3) cache 64K"),
    // FastCDC 2K/8K/64K: a block is redundant only where chunks with
    // sources cover it whole, so far fewer than with fixed blocks; the
    // cache counts chunks.
    (
        "CDC (FastCDC) (6,3) cache 64K",
        960,
        943,
        17,
        160,
        160,
        30752,
        58,
        702,
        190,
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

/// (name, data bytes stored, CDC chunks, redundant chunks), in the order of
/// `EXPECTED`.
const EXPECTED_STORED: [(&str, u64, u64, u64); 12] = [
    ("plain RS (6,3) cache 64K", 7864320, 0, 0),
    ("CodePlugin no-EX (6,3) cache 64K", 7864320, 0, 0),
    ("CodePlugin 2-EX (6,3) cache 64K", 7864320, 0, 0),
    ("CodePlugin 4-EX (6,3) cache 64K", 7864320, 0, 0),
    // Only the 686 unique blocks of 8 KiB.
    ("compact (6,3) cache 64K", 686 * 8192, 0, 0),
    ("CDC (FastCDC) (6,3) cache 64K", 7864320, 760, 58),
    ("plain RS (4,2) cache 64K", 7864320, 0, 0),
    ("CodePlugin 4-EX (4,2) cache 64K", 7864320, 0, 0),
    ("plain RS (10,5) cache 64K", 7864320, 0, 0),
    ("CodePlugin 4-EX (10,5) cache 64K", 7864320, 0, 0),
    ("CodePlugin 4-EX (6,3) cache 16K", 7864320, 0, 0),
    ("CodePlugin 4-EX (6,3) cache 32K", 7864320, 0, 0),
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
    let got: Vec<Expected> = runs
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
    let names: Vec<&str> = runs.iter().map(|x| x["name"].as_str().unwrap()).collect();
    assert_eq!(names, EXPECTED.map(|e| e.0).to_vec());
    assert_eq!(got, EXPECTED.to_vec());
    let stored: Vec<(&str, u64, u64, u64)> = runs
        .iter()
        .zip(EXPECTED_STORED)
        .map(|(x, e)| {
            (
                e.0,
                u(x, "stored_data_bytes"),
                u(x, "chunks"),
                u(x, "redundant_chunks"),
            )
        })
        .collect();
    assert_eq!(stored, EXPECTED_STORED.to_vec());
    let by_name = |name: &str| runs.iter().find(|x| x["name"] == name).unwrap();
    let (no_ex, compact, cdc) = (
        by_name(EXPECTED[1].0),
        by_name(EXPECTED[4].0),
        by_name(EXPECTED[5].0),
    );
    // Compact stores exactly the unique blocks, and the rest as no-EX.
    for key in ["parity_bytes", "map_bytes", "stripes_encoded"] {
        assert_eq!(u(compact, key), u(no_ex, key), "{key}");
    }
    assert_eq!(
        u(compact, "stored_data_bytes"),
        u(compact, "unique_blocks") * 8192
    );
    assert!(u(compact, "stored_data_bytes") < u(no_ex, "stored_data_bytes"));
    for (x, exchange) in [(compact, 0), (cdc, 0), (no_ex, 0)] {
        assert_eq!(u(x, "exchange"), exchange, "{}", x["name"]);
    }
    // Every CDC chunk is a cache hit or a miss.
    assert_eq!(
        u(cdc, "chunks"),
        u(cdc, "cache_hits") + u(cdc, "cache_misses")
    );
    for x in runs {
        // Parity is m blocks per encoded stripe; 8 containers each run.
        let m = u(x, "m");
        assert_eq!(u(x, "parity_bytes"), u(x, "stripes_encoded") * m * 8192);
        assert_eq!(u(x, "containers_sealed"), 8, "{}", x["name"]);
    }
    // With an unbounded cache (the offline count) and 64K, dedup finds
    // every copy; smaller caches find fewer.
    assert_eq!(u(no_ex, "redundant_blocks"), u(offline, "redundant_blocks"));

    let md = std::fs::read_to_string(out.path().join("codeplugin.md")).unwrap();
    assert!(
        md.contains("| CodePlugin 4-EX | 0.003 | -26.2% | 16.10 | -17.4% |"),
        "{md}"
    );
    let beyond = "n/a (beyond the paper) | n/a (beyond the paper) | 18236 | 0.232% | n/a (beyond the paper) | 5619712 (-28.5%) | 133 / 160 |";
    assert!(
        md.contains(&format!("| compact | 0.003 | -16.9% | {beyond}")),
        "{md}"
    );
    assert!(md.contains("| 760 / 58 |"), "{md}");
    assert!(!md.contains("not in this eval"), "{md}");
    // The read comparison ran for no-EX, compact and CDC, each beside plain
    // RS (bit-exact, or the command would have failed); no other run reads.
    let read: Vec<&str> = runs
        .iter()
        .filter(|x| x["read"].is_object())
        .map(|x| x["scheme"].as_str().unwrap())
        .collect();
    assert_eq!(read, ["no-ex", "compact", "cdc"]);
    for x in [no_ex, compact, cdc] {
        for key in [
            "cold_mb_s",
            "warm_mb_s",
            "plain_cold_mb_s",
            "plain_warm_mb_s",
        ] {
            assert_eq!(x["read"][key].as_array().unwrap().len(), 1, "{key}");
        }
    }
    assert!(md.contains("| compact | cold |"), "{md}");
}
