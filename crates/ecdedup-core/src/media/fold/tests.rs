//! The device fold against the fold the writer computed in RAM before it
//! (parix: `Codec::update` with d(0) ^ d(r), plog: the deltas XORed), on
//! random data, coefficients and term shapes; a row whose expected
//! checksum is wrong is answered as a mismatch and left as it was.

use super::*;
use crate::codec::Codec;
use crate::media::MemDevice;
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

const BLOCK: usize = 4096;
/// Operands live from here on; parity rows below.
const OPERANDS_AT: u64 = 64 << 10;
const DEVICE_BYTES: u64 = 1 << 20;

/// One logged entry of a row: parix (data role, d(0), d(r)) or a plog delta.
#[derive(Clone, Debug)]
enum Entry {
    Parix { role: usize, d0: u64, dr: u64 },
    Plog { delta: u64 },
}

fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    StdRng::seed_from_u64(seed).fill_bytes(&mut b);
    b
}

fn read(dev: &MemDevice, offset: u64) -> Vec<u8> {
    let mut b = vec![0u8; BLOCK];
    dev.read_at(&mut b, offset).unwrap();
    b
}

/// The terms of an entry, whole or split at `split` bytes (as the writer
/// splits a record that crosses an extent of the metadata area).
fn terms_of(codec: &Codec, j: usize, e: &Entry, split: usize) -> Vec<Term> {
    let (coefficient, a, b) = match *e {
        Entry::Parix { role, d0, dr } => (codec.coefficient(j, role), d0, Some(dr)),
        Entry::Plog { delta } => (1, delta, None),
    };
    let whole = |at: usize, len: usize| Term {
        coefficient,
        at: at as u32,
        len: len as u32,
        a: a + at as u64,
        b: b.map(|b| b + at as u64),
    };
    match split {
        0 => vec![whole(0, BLOCK)],
        s => vec![whole(0, s), whole(s, BLOCK - s)],
    }
}

/// What the writer folded in RAM: today's `fold_parity`.
fn model_row(
    dev: &MemDevice,
    codec: &Codec,
    j: usize,
    parity: &[u8],
    entries: &[Entry],
) -> Vec<u8> {
    let mut acc = vec![0u8; BLOCK];
    for e in entries {
        match *e {
            Entry::Parix { role, d0, dr } => {
                let delta: Vec<u8> = read(dev, d0)
                    .iter()
                    .zip(read(dev, dr))
                    .map(|(x, y)| x ^ y)
                    .collect();
                let mut scratch = vec![vec![0u8; BLOCK]; codec.m()];
                let mut refs: Vec<&mut [u8]> =
                    scratch.iter_mut().map(|v| v.as_mut_slice()).collect();
                codec.update(role, &delta, &mut refs);
                acc.iter_mut().zip(&scratch[j]).for_each(|(x, y)| *x ^= y);
            }
            Entry::Plog { delta } => {
                acc.iter_mut()
                    .zip(read(dev, delta))
                    .for_each(|(x, y)| *x ^= y);
            }
        }
    }
    parity.iter().zip(&acc).map(|(x, y)| x ^ y).collect()
}

fn arb_entry(k: usize) -> impl Strategy<Value = Entry> {
    let offset = || {
        (0u64..(DEVICE_BYTES - OPERANDS_AT - BLOCK as u64) / 32).prop_map(|n| OPERANDS_AT + n * 32)
    };
    prop_oneof![
        (0..k, offset(), offset()).prop_map(|(role, d0, dr)| Entry::Parix { role, d0, dr }),
        offset().prop_map(|delta| Entry::Plog { delta }),
    ]
}

/// A row: its entries, where their terms are split (0: whole), whether
/// its expected checksum is wrong.
type RowCase = (Vec<Entry>, usize, bool);

fn arb_case() -> impl Strategy<Value = (usize, usize, usize, Vec<RowCase>, u64)> {
    (1usize..=8, 1usize..=3).prop_flat_map(|(k, m)| {
        let row = (
            proptest::collection::vec(arb_entry(k), 0..6),
            prop_oneof![Just(0usize), (1usize..BLOCK).prop_map(|s| s)],
            proptest::bool::weighted(0.25),
        );
        (
            Just(k),
            Just(m),
            0..m,
            proptest::collection::vec(row, 1..6),
            any::<u64>(),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn the_device_fold_equals_the_writers_fold_in_ram_and_a_wrong_checksum_writes_nothing(
        (k, m, j, rows, seed) in arb_case()
    ) {
        let codec = Codec::new(k, m).unwrap();
        let dev = MemDevice::new("fold", DEVICE_BYTES);
        dev.write_at(&bytes(seed, DEVICE_BYTES as usize), 0).unwrap();
        let mut fold = Fold { block_bytes: BLOCK as u32, rows: Vec::new() };
        let mut want = Vec::new();
        for (i, (entries, split, wrong)) in rows.iter().enumerate() {
            let at = (i * BLOCK) as u64;
            let parity = read(&dev, at);
            let crc = crc32c::crc32c(&parity);
            fold.rows.push(Row {
                parity: at,
                expected_crc32c: if *wrong { !crc } else { crc },
                terms: entries.iter().flat_map(|e| terms_of(&codec, j, e, *split)).collect(),
            });
            want.push(match wrong {
                true => (parity, RowAnswer::Mismatch { crc32c: crc }),
                false => {
                    let folded = model_row(&dev, &codec, j, &parity, entries);
                    let crc32c = crc32c::crc32c(&folded);
                    (folded, RowAnswer::Folded { crc32c })
                }
            });
        }
        let answers = run(&dev, &fold, false).unwrap();
        for (i, (bytes, answer)) in want.iter().enumerate() {
            prop_assert_eq!(answers[i], *answer, "row {}", i);
            prop_assert!(read(&dev, (i * BLOCK) as u64) == *bytes, "row {} on the device", i);
        }
    }
}

#[test]
fn a_fold_sent_twice_changes_nothing_the_second_time() {
    let dev = MemDevice::new("fold", DEVICE_BYTES);
    dev.write_at(&bytes(3, DEVICE_BYTES as usize), 0).unwrap();
    let parity = read(&dev, 0);
    let fold = Fold {
        block_bytes: BLOCK as u32,
        rows: vec![Row {
            parity: 0,
            expected_crc32c: crc32c::crc32c(&parity),
            terms: vec![Term {
                coefficient: 0x1d,
                at: 0,
                len: BLOCK as u32,
                a: OPERANDS_AT,
                b: Some(OPERANDS_AT + 4096),
            }],
        }],
    };
    let [RowAnswer::Folded { crc32c }] = run(&dev, &fold, true).unwrap()[..] else {
        panic!("the first fold folds");
    };
    let once = read(&dev, 0);
    assert_ne!(once, parity);
    assert_eq!(crc32c, crc32c::crc32c(&once));
    assert_eq!(
        run(&dev, &fold, true).unwrap(),
        vec![RowAnswer::Mismatch { crc32c }]
    );
    assert_eq!(read(&dev, 0), once, "folded once only");
}

#[test]
fn a_fold_outside_the_device_or_with_overlapping_rows_is_refused_and_writes_nothing() {
    let dev = MemDevice::new("fold", DEVICE_BYTES);
    dev.write_at(&bytes(4, DEVICE_BYTES as usize), 0).unwrap();
    let before = read(&dev, 0);
    let row = |parity, a| Row {
        parity,
        expected_crc32c: crc32c::crc32c(&before),
        terms: vec![Term {
            coefficient: 1,
            at: 0,
            len: BLOCK as u32,
            a,
            b: None,
        }],
    };
    let cases = [
        (vec![row(0, DEVICE_BYTES - 100)], "past the end"),
        (vec![row(0, 8192), row(DEVICE_BYTES, 8192)], "past the end"),
        (vec![row(0, 8192), row(2048, 8192)], "overlap"),
        (Vec::new(), "0 rows"),
    ];
    for (rows, why) in cases {
        let fold = Fold {
            block_bytes: BLOCK as u32,
            rows,
        };
        let e = run(&dev, &fold, false).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains(why), "{e}");
        assert_eq!(read(&dev, 0), before);
    }
}
