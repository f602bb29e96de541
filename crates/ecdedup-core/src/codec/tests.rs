//! Tests of the ISA-L codec against its scalar twin and against the RS
//! contract: encode agrees byte for byte, update equals re-encoding, any `m`
//! erasures reconstruct the original, more fail cleanly, bad geometry is
//! refused.
//!
//! Invariants: shard contents come from a seeded RNG (proptest shrinks the
//! seed, geometry and length rather than megabytes of bytes); lengths cover 0
//! and values around ISA-L's 16/32/64-byte vector widths; case counts stay
//! moderate so the suite is quick on a 2-core CI machine.

use super::scalar::{self, ScalarCodec};
use super::{isal, Codec, CodecError, DECODE_TABLE_CACHE_ENTRIES_MAX};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

const CASES: u32 = 64;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: CASES,
        ..ProptestConfig::default()
    }
}

/// Shard lengths: anything in 0..=9000, with extra weight on vector edges.
fn shard_len() -> impl Strategy<Value = usize> {
    prop_oneof![
        3 => 0usize..=9000,
        1 => prop::sample::select(vec![
            0usize, 1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 95, 127, 128, 129, 4095, 4096, 4097, 8999, 9000,
        ]),
    ]
}

fn random_shards(seed: u64, count: usize, len: usize) -> Vec<Vec<u8>> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..count)
        .map(|_| {
            let mut shard = vec![0u8; len];
            rng.fill_bytes(&mut shard);
            shard
        })
        .collect()
}

fn refs(shards: &[Vec<u8>]) -> Vec<&[u8]> {
    shards.iter().map(Vec::as_slice).collect()
}

fn muts(shards: &mut [Vec<u8>]) -> Vec<&mut [u8]> {
    shards.iter_mut().map(Vec::as_mut_slice).collect()
}

/// Data plus parity from the ISA-L codec: all `k + m` shards of a stripe.
fn encoded_stripe(codec: &Codec, seed: u64, len: usize) -> Vec<Vec<u8>> {
    let mut stripe = random_shards(seed, codec.k(), len);
    let mut parity = vec![vec![0u8; len]; codec.m()];
    codec.encode(&refs(&stripe), &mut muts(&mut parity));
    stripe.extend(parity);
    stripe
}

/// Geometry, a seed and a length, plus a subset of shards of size `erased`.
fn erasure_case(
    erased: impl Fn(usize) -> std::ops::RangeInclusive<usize>,
) -> impl Strategy<Value = (usize, usize, u64, usize, Vec<usize>)> {
    (1usize..=12, 1usize..=4, any::<u64>(), shard_len()).prop_flat_map(move |(k, m, seed, len)| {
        let (lo, hi) = (*erased(m).start(), (*erased(m).end()).min(k + m));
        let lost = prop::sample::subsequence((0..k + m).collect::<Vec<_>>(), lo..=hi);
        (Just(k), Just(m), Just(seed), Just(len), lost)
    })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn isal_encode_matches_scalar_encode(
        k in 1usize..=12, m in 1usize..=4, seed in any::<u64>(), len in shard_len(),
    ) {
        let data = random_shards(seed, k, len);
        let mut fast = random_shards(!seed, m, len); // stale contents must be overwritten
        let mut slow = vec![vec![0u8; len]; m];
        Codec::new(k, m).unwrap().encode(&refs(&data), &mut muts(&mut fast));
        ScalarCodec::new(k, m).unwrap().encode(&refs(&data), &mut muts(&mut slow));
        prop_assert_eq!(fast, slow);
    }

    #[test]
    fn mul_xor_matches_the_scalar_multiply_and_add_and_the_coefficient_is_updates(
        (k, m) in (1usize..=12, 1usize..=4),
        coefficient in any::<u8>(),
        seed in any::<u64>(),
        len in shard_len(),
    ) {
        let src = random_shards(seed, 1, len).remove(0);
        let mut fast = random_shards(!seed, 1, len).remove(0);
        let mut slow = fast.clone();
        super::mul_xor(coefficient, &src, &mut fast);
        scalar::mul_add(coefficient, &src, &mut slow);
        prop_assert_eq!(&fast, &slow);
        // What `update` adds to parity j for data unit i is a_{k+j,i} times
        // the delta: the coefficient a replay folds with.
        let codec = Codec::new(k, m).unwrap();
        let i = (seed as usize) % k;
        let mut parity = vec![vec![0u8; len]; m];
        codec.update(i, &src, &mut muts(&mut parity));
        for (j, p) in parity.iter().enumerate() {
            let mut want = vec![0u8; len];
            super::mul_xor(codec.coefficient(j, i), &src, &mut want);
            prop_assert_eq!(p, &want);
        }
    }

    #[test]
    fn update_with_delta_matches_reencoding_after_changing_one_shard(
        (k, m) in (1usize..=12, 1usize..=4),
        index in any::<prop::sample::Index>(),
        seed in any::<u64>(),
        len in shard_len(),
    ) {
        let (codec, twin) = (Codec::new(k, m).unwrap(), ScalarCodec::new(k, m).unwrap());
        let data_index = index.index(k);
        let mut data = random_shards(seed, k, len);
        let mut parity = vec![vec![0u8; len]; m];
        codec.encode(&refs(&data), &mut muts(&mut parity));
        let mut twin_parity = parity.clone();

        let new_shard = random_shards(seed.wrapping_add(1), 1, len).remove(0);
        let delta: Vec<u8> = data[data_index].iter().zip(&new_shard).map(|(o, n)| o ^ n).collect();
        data[data_index] = new_shard;
        codec.update(data_index, &delta, &mut muts(&mut parity));
        twin.update(data_index, &delta, &mut muts(&mut twin_parity));

        let mut reencoded = vec![vec![0u8; len]; m];
        codec.encode(&refs(&data), &mut muts(&mut reencoded));
        prop_assert_eq!(&parity, &reencoded);
        prop_assert_eq!(&twin_parity, &reencoded);
    }

    #[test]
    fn any_m_erasures_reconstruct_the_original(
        (k, m, seed, len, lost) in erasure_case(|m| 0..=m),
    ) {
        let codec = Codec::new(k, m).unwrap();
        let original = encoded_stripe(&codec, seed, len);
        let present: Vec<bool> = (0..k + m).map(|i| !lost.contains(&i)).collect();

        let mut damaged = original.clone();
        for &i in &lost {
            damaged[i].fill(0xa5); // whatever was there must be overwritten
        }
        let mut twin_damaged = damaged.clone();
        codec.reconstruct(&mut muts(&mut damaged), &present).unwrap();
        prop_assert_eq!(&damaged, &original);

        ScalarCodec::new(k, m).unwrap().reconstruct(&mut muts(&mut twin_damaged), &present).unwrap();
        prop_assert_eq!(&twin_damaged, &original);
    }

    #[test]
    fn more_than_m_erasures_return_too_many_erasures(
        (k, m, seed, len, lost) in erasure_case(|m| m + 1..=usize::MAX),
    ) {
        let codec = Codec::new(k, m).unwrap();
        let original = encoded_stripe(&codec, seed, len);
        let present: Vec<bool> = (0..k + m).map(|i| !lost.contains(&i)).collect();
        let expected = || CodecError::TooManyErasures { present: k + m - lost.len(), total: k + m, needed: k };

        let mut shards = original.clone();
        prop_assert_eq!(codec.reconstruct(&mut muts(&mut shards), &present), Err(expected()));
        prop_assert_eq!(&shards, &original, "a failed reconstruct must not write");
        let twin = ScalarCodec::new(k, m).unwrap();
        prop_assert_eq!(twin.reconstruct(&mut muts(&mut shards), &present), Err(expected()));
    }
}

#[test]
fn codec_new_rejects_bad_geometry() {
    for (k, m) in [
        (0, 1),
        (1, 0),
        (0, 0),
        (254, 2),
        (255, 1),
        (1, 255),
        (200, 100),
        (usize::MAX, 1),
        (1, usize::MAX),
    ] {
        for err in [Codec::new(k, m).err(), ScalarCodec::new(k, m).err()] {
            match err {
                Some(CodecError::Geometry(msg)) => {
                    assert!(msg.contains(&format!("RS({k},{m})")), "{msg}")
                }
                other => panic!("RS({k},{m}) accepted or refused oddly: {other:?}"),
            }
        }
    }
    let msg = Codec::new(254, 2).unwrap_err().to_string();
    assert_eq!(
        msg,
        "invalid geometry: RS(254,2): k + m must be at most 255 shards"
    );
}

#[test]
fn codec_new_accepts_the_extreme_good_geometries() {
    for (k, m) in [(1, 1), (254, 1), (1, 254), (128, 127), (4, 2), (6, 3)] {
        let codec = Codec::new(k, m).unwrap();
        assert_eq!((codec.k(), codec.m()), (k, m));
        ScalarCodec::new(k, m).unwrap();
    }
}

#[test]
fn isal_and_scalar_build_the_same_generator_matrix() {
    let geometries = (1..=12).flat_map(|k| (1..=4).map(move |m| (k, m)));
    for (k, m) in geometries.chain([(1, 254), (254, 1), (128, 127), (200, 55)]) {
        let codec = Codec::new(k, m).unwrap();
        assert_eq!(codec.matrix, scalar::cauchy1_matrix(k, m), "RS({k},{m})");
    }
}

#[test]
fn scalar_field_arithmetic_matches_isal() {
    for a in 0..=255u8 {
        for b in 0..=255u8 {
            assert_eq!(scalar::mul(a, b), isal::mul(a, b), "{a} * {b}");
        }
        if a != 0 {
            assert_eq!(scalar::mul(a, scalar::inv(a)), 1, "{a} * 1/{a}");
        }
    }
}

#[test]
fn every_k_by_k_submatrix_of_the_generator_is_invertible() {
    for k in 1..=6usize {
        for m in 1..=4usize {
            let matrix = scalar::cauchy1_matrix(k, m);
            for mask in 0u32..1 << (k + m) {
                if mask.count_ones() as usize != k {
                    continue;
                }
                let sub: Vec<u8> = (0..k + m)
                    .filter(|r| mask & (1 << r) != 0)
                    .flat_map(|r| matrix[r * k..(r + 1) * k].to_vec())
                    .collect();
                let slow = scalar::invert(&sub, k)
                    .unwrap_or_else(|| panic!("RS({k},{m}) rows {mask:b} singular"));
                let fast = isal::invert_matrix(sub, k).expect("ISA-L disagrees: singular");
                assert_eq!(slow, fast, "RS({k},{m}) rows {mask:b}");
            }
        }
    }
}

#[test]
fn large_geometries_reconstruct_erasures_beyond_the_first_128_rows() {
    for (k, m, lost) in [
        (200, 55, vec![0, 63, 64, 127, 128, 199, 200, 254]),
        (254, 1, vec![253]),
        (1, 254, (0..254).collect::<Vec<_>>()),
        (128, 127, (0..127).map(|i| i * 2).collect()),
    ] {
        let codec = Codec::new(k, m).unwrap();
        let original = encoded_stripe(&codec, 7, 100);
        let present: Vec<bool> = (0..k + m).map(|i| !lost.contains(&i)).collect();
        let mut shards = original.clone();
        for &i in &lost {
            shards[i].fill(0);
        }
        codec.reconstruct(&mut muts(&mut shards), &present).unwrap();
        assert!(shards == original, "RS({k},{m}) did not reconstruct");
    }
}

#[test]
fn zero_length_shards_are_a_no_op() {
    let codec = Codec::new(4, 2).unwrap();
    let data: Vec<Vec<u8>> = vec![Vec::new(); 4];
    let mut parity: Vec<Vec<u8>> = vec![Vec::new(); 2];
    codec.encode(&refs(&data), &mut muts(&mut parity));
    codec.update(3, &[], &mut muts(&mut parity));
    let mut shards: Vec<Vec<u8>> = vec![Vec::new(); 6];
    codec
        .reconstruct(
            &mut muts(&mut shards),
            &[false, true, true, false, true, true],
        )
        .unwrap();
    assert_eq!(
        codec.reconstruct(
            &mut muts(&mut shards),
            &[false, false, true, false, true, true]
        ),
        Err(CodecError::TooManyErasures {
            present: 3,
            total: 6,
            needed: 4
        })
    );
}

#[test]
fn decode_table_cache_stays_bounded() {
    // RS(4,4) has C(8,4) = 70 choices of 4 rows, more than the cache holds.
    let (k, m) = (4, 4);
    let codec = Codec::new(k, m).unwrap();
    let original = encoded_stripe(&codec, 11, 333);
    let mut patterns = 0;
    for lost_mask in 0u32..1 << (k + m) {
        if lost_mask.count_ones() as usize > m {
            continue;
        }
        let present: Vec<bool> = (0..k + m).map(|i| lost_mask & (1 << i) == 0).collect();
        let mut shards = original.clone();
        codec.reconstruct(&mut muts(&mut shards), &present).unwrap();
        assert!(shards == original, "lost {lost_mask:08b}");
        assert!(codec.decode_cache_len() <= DECODE_TABLE_CACHE_ENTRIES_MAX);
        patterns += 1;
    }
    assert_eq!(patterns, 1 + 8 + 28 + 56 + 70);
    assert!(codec.decode_cache_len() >= 1);
}

#[test]
fn one_codec_reconstructs_from_many_threads_at_once() {
    let codec = Codec::new(6, 3).unwrap();
    let original = encoded_stripe(&codec, 5, 4099);
    std::thread::scope(|scope| {
        for t in 0..4usize {
            let (codec, original) = (&codec, &original);
            scope.spawn(move || {
                for round in 0..50usize {
                    let lost = [
                        (t + round) % 9,
                        (t * 3 + round * 7 + 1) % 9,
                        (round * 5 + 2) % 9,
                    ];
                    let present: Vec<bool> = (0..9).map(|i| !lost.contains(&i)).collect();
                    let mut shards = original.clone();
                    for &i in &lost {
                        shards[i].fill(0);
                    }
                    codec.reconstruct(&mut muts(&mut shards), &present).unwrap();
                    assert!(&shards == original, "thread {t} round {round}");
                }
            });
        }
    });
}

#[test]
#[should_panic(expected = "differ in length")]
fn encode_panics_on_shards_of_different_lengths() {
    let codec = Codec::new(2, 1).unwrap();
    let data = [vec![0u8; 64], vec![0u8; 65]];
    let mut parity = [vec![0u8; 64]];
    codec.encode(&refs(&data), &mut muts(&mut parity));
}

#[test]
#[should_panic(expected = "takes 2 data shards")]
fn encode_panics_on_the_wrong_shard_count() {
    let codec = Codec::new(2, 1).unwrap();
    let data = [vec![0u8; 64]];
    let mut parity = [vec![0u8; 64]];
    codec.encode(&refs(&data), &mut muts(&mut parity));
}

#[test]
#[should_panic(expected = "out of range")]
fn update_panics_on_a_data_index_past_k() {
    let codec = Codec::new(2, 1).unwrap();
    let mut parity = [vec![0u8; 64]];
    codec.update(2, &[0u8; 64], &mut muts(&mut parity));
}

proptest! {
    #![proptest_config(config())]

    /// ISA-L's CRC-32C is the `crc32c` crate's, at any length and
    /// alignment (the block checksums on disk do not change with it).
    #[test]
    fn isal_crc32c_matches_the_crc32c_crate(
        seed in any::<u64>(), len in 0usize..70_000, skip in 0usize..64,
    ) {
        let bytes = &random_shards(seed, 1, len + skip)[0][skip..];
        prop_assert_eq!(super::crc32c(bytes), crc32c::crc32c(bytes));
    }
}

#[test]
fn isal_crc32c_of_known_values() {
    // RFC 3720, B.4: 32 bytes of zeroes, of 0xff, and 0..=31.
    assert_eq!(super::crc32c(&[0u8; 32]), 0x8a91_36aa);
    assert_eq!(super::crc32c(&[0xffu8; 32]), 0x62a8_ab43);
    let ascending: Vec<u8> = (0..32).collect();
    assert_eq!(super::crc32c(&ascending), 0x46dd_794e);
    assert_eq!(super::crc32c(&[]), 0);
    assert_eq!(super::crc32c(&[0u8; 4096]), crc32c::crc32c(&[0u8; 4096]));
}
