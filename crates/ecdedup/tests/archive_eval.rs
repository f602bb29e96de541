//! The archive tier's parity saving on a synthetic set of VM-like images
//! (paper 001's evaluation in miniature): plain RS(6,3) against CodePlugin
//! with no exchange, 2-EX and 4-EX, 8 KiB blocks, MD5. Prints a markdown
//! table (run with `--nocapture`; docs/benchmarks.md quotes it) and checks
//! what must hold on any input: the saving is positive here, never above
//! the redundant fraction (an encoded stripe holds at most k unique
//! blocks), and exchange never encodes more stripes.

use ecdedup::archive::{ArchiveStore, CreateOptions};
use ecdedup::fingerprint::Algorithm;
use rand::{Rng, SeedableRng};
use std::collections::HashSet;

const BLOCK_BYTES: usize = 8 << 10;
const K: usize = 6;
const M: usize = 3;
/// 32 blocks per sub-file: 1.5 MiB containers, two per image.
const CONTAINER_BYTES: u64 = (K * BLOCK_BYTES * 32) as u64;
const IMAGE_BLOCKS: usize = 384;
const IMAGES: usize = 8;

/// Images of two "distributions": each is its base with 30% of its blocks
/// replaced by its own (installed, updated) blocks and 5% zeroed.
fn images(seed: u64) -> Vec<Vec<u8>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let block = |rng: &mut rand::rngs::StdRng| {
        let mut b = vec![0u8; BLOCK_BYTES];
        rng.fill(&mut b[..]);
        b
    };
    let bases: Vec<Vec<Vec<u8>>> = (0..2)
        .map(|_| (0..IMAGE_BLOCKS).map(|_| block(&mut rng)).collect())
        .collect();
    (0..IMAGES)
        .map(|i| {
            let mut image = Vec::with_capacity(IMAGE_BLOCKS * BLOCK_BYTES);
            for base_block in &bases[i % 2] {
                let roll: f64 = rng.gen();
                if roll < 0.30 {
                    image.extend(block(&mut rng));
                } else if roll < 0.35 {
                    image.extend(std::iter::repeat_n(0u8, BLOCK_BYTES));
                } else {
                    image.extend_from_slice(base_block);
                }
            }
            image
        })
        .collect()
}

#[test]
fn codeplugin_saves_parity_on_similar_vm_images() {
    let images = images(2024);
    let data_bytes: usize = images.iter().map(|i| i.len()).sum();
    let mut seen = HashSet::new();
    let redundant = images
        .iter()
        .flat_map(|i| i.chunks(BLOCK_BYTES))
        .filter(|b| !seen.insert(b.to_vec()))
        .count();
    let redundant_fraction = redundant as f64 / (data_bytes / BLOCK_BYTES) as f64;
    println!(
        "\n{IMAGES} images, {} MiB, RS({K},{M}), 8 KiB blocks, MD5; offline fixed-8K redundant fraction {:.1}%\n",
        data_bytes >> 20,
        100.0 * redundant_fraction
    );
    println!("| scheme | parity bytes | saving vs plain RS | stripes encoded / all | map bytes (% of data) |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    let mut encoded = Vec::new();
    for exchange in [0u32, 2, 4] {
        let dir = tempfile::tempdir().unwrap();
        let options = CreateOptions {
            k: K,
            m: M,
            devices: Vec::new(),
            device_count: K + M,
            container_bytes: CONTAINER_BYTES,
            block_bytes: BLOCK_BYTES as u32,
            fingerprint: Algorithm::Md5,
            cache_bytes: 512 << 20,
            exchange,
            verify: None,
            ..CreateOptions::default()
        };
        let mut store = ArchiveStore::create(dir.path(), &options).unwrap();
        for (i, image) in images.iter().enumerate() {
            store.put(&format!("vm{i}"), &mut &image[..]).unwrap();
        }
        store.seal().unwrap();
        assert!(store.get("vm5").unwrap() == images[5]);
        let s = store.stats();
        if exchange == 0 {
            println!(
                "| plain RS | {} | 0.0% | {} / {} | 0 |",
                s.plain_parity_bytes, s.stripes, s.stripes
            );
        }
        let name = match exchange {
            0 => "CodePlugin no-EX".to_string(),
            n => format!("CodePlugin {n}-EX"),
        };
        println!(
            "| {name} | {} | {:.1}% | {} / {} | {} ({:.2}%) |",
            s.parity_bytes,
            s.parity_saving_percent,
            s.stripes_encoded,
            s.stripes,
            s.map_bytes,
            100.0 * s.map_bytes as f64 / data_bytes as f64
        );
        assert!(s.parity_saving_percent > 0.0);
        assert!(s.parity_saving_percent <= 100.0 * redundant_fraction + 1e-9);
        encoded.push(s.stripes_encoded);
    }
    assert!(
        encoded[1] <= encoded[0] && encoded[2] <= encoded[1],
        "{encoded:?}"
    );
}
