//! Tests of the fingerprint module: published known-answer vectors for each
//! algorithm, names and serde, the `Fingerprint` layout, and the batch
//! contract (same fingerprints, in order, as hashing each chunk alone) on
//! both the parallel and the sequential path of `CpuBackend`.

use super::*;
use proptest::prelude::*;
use rand::{rngs::StdRng, RngCore, SeedableRng};

fn hex(algorithm: Algorithm, data: &[u8]) -> String {
    algorithm.fingerprint(data).to_string()
}

/// 1,000,000 repetitions of 'a', the long-message vector of FIPS 180 and
/// the NIST example set.
fn million_a() -> Vec<u8> {
    vec![b'a'; 1_000_000]
}

const ABC_448: &[u8] = b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";

#[test]
fn sha1_matches_the_fips_180_known_answers() {
    let a = Algorithm::Sha1;
    assert_eq!(hex(a, b""), "da39a3ee5e6b4b0d3255bfef95601890afd80709");
    assert_eq!(hex(a, b"abc"), "a9993e364706816aba3e25717850c26c9cd0d89d");
    assert_eq!(hex(a, ABC_448), "84983e441c3bd26ebaae4aa1f95129e5e54670f1");
    assert_eq!(
        hex(a, &million_a()),
        "34aa973cd4c4daa4f61eeb2bdbad27316534016f"
    );
}

#[test]
fn sha256_matches_the_fips_180_known_answers() {
    let a = Algorithm::Sha256;
    assert_eq!(
        hex(a, b""),
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    );
    assert_eq!(
        hex(a, b"abc"),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    assert_eq!(
        hex(a, ABC_448),
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
    );
    assert_eq!(
        hex(a, &million_a()),
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"
    );
}

#[test]
fn md5_matches_the_rfc_1321_known_answers() {
    let a = Algorithm::Md5;
    assert_eq!(hex(a, b""), "d41d8cd98f00b204e9800998ecf8427e");
    assert_eq!(hex(a, b"abc"), "900150983cd24fb0d6963f7d28e17f72");
    assert_eq!(
        hex(a, b"message digest"),
        "f96b697d7cb7938d525a2f31aaf161d0"
    );
    assert_eq!(
        hex(a, b"abcdefghijklmnopqrstuvwxyz"),
        "c3fcd3d76192e4007dfb496cca67e13b"
    );
}

#[test]
fn blake3_matches_the_official_test_vectors() {
    // test_vectors.json of the BLAKE3 reference: input byte i is i % 251;
    // the default 32-byte output is the first 64 hex digits of "hash".
    let input = |len: usize| (0..len).map(|i| (i % 251) as u8).collect::<Vec<u8>>();
    let cases = [
        (
            0,
            "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262",
        ),
        (
            1,
            "2d3adedff11b61f14c886e35afa036736dcd87a74d27b5c1510225d0f592e213",
        ),
        (
            1024,
            "42214739f095a406f3fc83deb889744ac00df831c10daa55189b5d121c855af7",
        ),
        (
            1025,
            "d00278ae47eb27b34faecf67b4fe263f82d5412916c1ffd97c8cb7fb814b8444",
        ),
        (
            4096,
            "015094013f57a5277b59d8475c0501042c0b642e531b0a1c8f58d2163229e969",
        ),
    ];
    for (len, expected) in cases {
        assert_eq!(
            hex(Algorithm::Blake3, &input(len)),
            expected,
            "length {len}"
        );
    }
    assert_eq!(
        hex(Algorithm::Blake3, b"abc"),
        "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85"
    );
}

#[test]
fn every_fingerprint_is_as_long_as_its_algorithm_digest() {
    let expected = [20, 32, 16, 32, 4];
    for (algorithm, bytes) in Algorithm::ALL.into_iter().zip(expected) {
        assert_eq!(algorithm.digest_bytes(), bytes);
        assert_eq!(algorithm.fingerprint(b"x").as_bytes().len(), bytes);
    }
}

#[test]
fn only_sha256_and_blake3_are_strong_and_only_crc32c_is_not_cryptographic() {
    assert!(!Algorithm::Sha1.strong());
    assert!(Algorithm::Sha256.strong());
    assert!(!Algorithm::Md5.strong());
    assert!(Algorithm::Blake3.strong());
    assert!(!Algorithm::Crc32c.strong());
    for algorithm in Algorithm::ALL {
        assert_eq!(algorithm.cryptographic(), algorithm != Algorithm::Crc32c);
    }
}

#[test]
fn a_crc32c_fingerprint_is_the_castagnoli_crc_of_the_chunk() {
    // The CRC-32C check value (RFC 3720, appendix B.4): "123456789".
    assert_eq!(
        Algorithm::Crc32c.fingerprint(b"123456789").as_bytes(),
        0xE306_9283u32.to_le_bytes()
    );
}

#[test]
fn names_round_trip_through_display_and_from_str_in_any_case() {
    let names = ["sha1", "sha256", "md5", "blake3", "crc32c"];
    for (algorithm, name) in Algorithm::ALL.into_iter().zip(names) {
        assert_eq!(algorithm.to_string(), name);
        assert_eq!(name.parse::<Algorithm>().unwrap(), algorithm);
        assert_eq!(name.to_uppercase().parse::<Algorithm>().unwrap(), algorithm);
    }
}

#[test]
fn from_str_rejects_an_unknown_name_with_a_message_listing_the_known_ones() {
    for bad in ["sha3", "", "sha-256", " sha1"] {
        let err = bad.parse::<Algorithm>().unwrap_err();
        assert_eq!(err, FingerprintError::UnknownAlgorithm(bad.to_string()));
        assert_eq!(
            err.to_string(),
            format!(
                "unknown fingerprint algorithm {bad:?}: expected one of sha1, sha256, md5, blake3"
            )
        );
    }
}

#[test]
fn serde_writes_and_reads_the_lowercase_names() {
    for algorithm in Algorithm::ALL {
        let json = serde_json::to_string(&algorithm).unwrap();
        assert_eq!(json, format!("\"{algorithm}\""));
        assert_eq!(serde_json::from_str::<Algorithm>(&json).unwrap(), algorithm);
    }
    assert!(serde_json::from_str::<Algorithm>("\"sha3\"").is_err());
}

#[test]
fn a_fingerprint_is_33_bytes_byte_aligned_and_copy() {
    assert_eq!(Fingerprint::SIZE, 33);
    assert_eq!(std::mem::size_of::<Fingerprint>(), 33);
    assert_eq!(std::mem::align_of::<Fingerprint>(), 1);
    let a = Algorithm::Sha256.fingerprint(b"abc");
    let b = a; // Copy: `a` stays usable.
    assert_eq!(a, b);
}

#[test]
fn from_slice_keeps_the_digest_and_rejects_empty_or_overlong_input() {
    for algorithm in Algorithm::ALL {
        let fp = algorithm.fingerprint(b"chunk");
        assert_eq!(Fingerprint::from_slice(fp.as_bytes()).unwrap(), fp);
    }
    assert_eq!(
        Fingerprint::from_slice(&[]),
        Err(FingerprintError::InvalidLength(0))
    );
    assert_eq!(
        Fingerprint::from_slice(&[7; 33]),
        Err(FingerprintError::InvalidLength(33))
    );
}

#[test]
fn fingerprints_of_different_chunks_differ_and_of_equal_chunks_agree() {
    for algorithm in Algorithm::ALL {
        let a = algorithm.fingerprint(&[0u8; 4096]);
        let mut other = [0u8; 4096];
        other[4095] = 1;
        assert_ne!(a, algorithm.fingerprint(&other));
        assert_eq!(a, algorithm.fingerprint(&[0u8; 4096]));
        assert_ne!(a.prefix_u64(), algorithm.fingerprint(&other).prefix_u64());
    }
}

#[test]
fn display_and_debug_print_lowercase_hex() {
    let fp = Fingerprint::from_slice(&[0x00, 0xab, 0x0f, 0xff]).unwrap();
    assert_eq!(fp.to_string(), "00ab0fff");
    assert_eq!(format!("{fp:?}"), "00ab0fff");
}

#[test]
fn crc32c_prefilter_matches_the_castagnoli_check_value() {
    assert_eq!(crc32c_prefilter(b"123456789"), 0xe306_9283);
    assert_eq!(crc32c_prefilter(b""), 0);
}

/// Chunks of the given sizes filled from a seeded generator.
fn random_chunks(sizes: &[usize], seed: u64) -> Vec<Vec<u8>> {
    let mut rng = StdRng::seed_from_u64(seed);
    sizes
        .iter()
        .map(|&len| {
            let mut chunk = vec![0u8; len];
            rng.fill_bytes(&mut chunk);
            chunk
        })
        .collect()
}

/// Runs every algorithm over `chunks` on `backend` and checks the batch
/// against hashing each chunk alone, starting from a stale `out`.
fn check_batch_matches_each_chunk_alone(
    backend: &CpuBackend,
    chunks: &[Vec<u8>],
) -> Result<(), TestCaseError> {
    let refs: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
    let mut out = vec![Algorithm::Md5.fingerprint(b"stale")];
    for algorithm in Algorithm::ALL {
        backend
            .fingerprint_batch(algorithm, &refs, &mut out)
            .unwrap();
        let alone: Vec<Fingerprint> = refs.iter().map(|c| algorithm.fingerprint(c)).collect();
        prop_assert_eq!(&out, &alone, "{}", algorithm);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn the_batch_equals_hashing_each_chunk_alone_on_the_parallel_path(
        sizes in prop::collection::vec(0usize..=70_000, 0..=70),
        seed in any::<u64>(),
    ) {
        let backend = CpuBackend::new(Some(4)).unwrap().with_parallel_threshold(0);
        let chunks = random_chunks(&sizes, seed);
        check_batch_matches_each_chunk_alone(&backend, &chunks)?;
        // One parallel batch per algorithm, unless there is nothing to split.
        let parallel = if chunks.len() > 1 { Algorithm::ALL.len() as u64 } else { 0 };
        prop_assert_eq!(backend.stats().parallel_batches, parallel);
    }

    #[test]
    fn the_batch_equals_hashing_each_chunk_alone_on_the_sequential_path(
        sizes in prop::collection::vec(0usize..=70_000, 0..=70),
        seed in any::<u64>(),
    ) {
        let backend = CpuBackend::new(Some(4)).unwrap().with_parallel_threshold(usize::MAX);
        let chunks = random_chunks(&sizes, seed);
        check_batch_matches_each_chunk_alone(&backend, &chunks)?;
        prop_assert_eq!(backend.stats().parallel_batches, 0);
    }
}

#[test]
fn a_reused_output_vector_is_cleared_and_not_reallocated() {
    let backend = CpuBackend::new(Some(2)).unwrap().with_parallel_threshold(0);
    let chunks = random_chunks(&[4096; 64], 1);
    let refs: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
    // Room for a full batch plus the stale entry pushed before each call.
    let mut out = Vec::with_capacity(65);
    let buffer = out.as_ptr();
    for n in [64, 3, 0, 64] {
        out.push(Algorithm::Md5.fingerprint(b"stale"));
        backend
            .fingerprint_batch(Algorithm::Blake3, &refs[..n], &mut out)
            .unwrap();
        assert_eq!(out.len(), n);
        assert_eq!(out.as_ptr(), buffer, "batch of {n} reallocated");
    }
}

#[test]
fn stats_count_chunks_bytes_and_batches() {
    let backend = CpuBackend::new(Some(2)).unwrap();
    assert_eq!(backend.stats(), FingerprintStats::default());
    let chunks = random_chunks(&[0, 1, 4096, 70_000], 2);
    let refs: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
    let mut out = Vec::new();
    backend
        .fingerprint_batch(Algorithm::Sha256, &refs, &mut out)
        .unwrap();
    backend
        .fingerprint_batch(Algorithm::Sha1, &refs[2..], &mut out)
        .unwrap();
    let stats = backend.stats();
    assert_eq!(stats.chunks, 6);
    assert_eq!(stats.bytes, 2 * (4096 + 70_000) + 1);
    assert_eq!(stats.batches, 2);
    let json = serde_json::to_value(stats).unwrap();
    assert_eq!(json["chunks"], 6);
    assert_eq!(json["bytes"], stats.bytes);
}

#[test]
fn the_default_threshold_sends_only_batches_of_256_kib_or_more_to_the_pool() {
    let backend = CpuBackend::new(Some(2)).unwrap();
    assert_eq!(backend.parallel_threshold(), PARALLEL_THRESHOLD_BYTES);
    let chunks = random_chunks(&[4096; 64], 3); // exactly 256 KiB
    let refs: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
    let mut out = Vec::new();
    backend
        .fingerprint_batch(Algorithm::Sha256, &refs[..63], &mut out)
        .unwrap();
    assert_eq!(backend.stats().parallel_batches, 0);
    backend
        .fingerprint_batch(Algorithm::Sha256, &refs, &mut out)
        .unwrap();
    assert_eq!(backend.stats().parallel_batches, 1);
}

#[test]
fn a_one_thread_backend_hashes_on_the_calling_thread() {
    let backend = CpuBackend::new(Some(1)).unwrap().with_parallel_threshold(0);
    assert_eq!(backend.threads(), 1);
    let chunks = random_chunks(&[8192; 8], 4);
    let refs: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
    let mut out = Vec::new();
    backend
        .fingerprint_batch(Algorithm::Blake3, &refs, &mut out)
        .unwrap();
    assert_eq!(out.len(), 8);
    assert_eq!(backend.stats().parallel_batches, 0);
}

#[test]
fn no_thread_count_means_one_thread_per_core() {
    let cores = std::thread::available_parallelism().unwrap().get();
    assert_eq!(CpuBackend::new(None).unwrap().threads(), cores);
    assert_eq!(CpuBackend::new(Some(0)).unwrap().threads(), cores);
}

#[test]
fn the_cpu_backend_works_behind_the_trait_object() {
    let backend: Box<dyn FingerprintBackend> = Box::new(CpuBackend::new(Some(2)).unwrap());
    assert_eq!(backend.name(), "cpu");
    let mut out = vec![Algorithm::Sha1.fingerprint(b"stale")];
    backend
        .fingerprint_batch(Algorithm::Sha1, &[], &mut out)
        .unwrap();
    assert!(out.is_empty());
    backend
        .fingerprint_batch(Algorithm::Sha1, &[b"abc"], &mut out)
        .unwrap();
    assert_eq!(out, [Algorithm::Sha1.fingerprint(b"abc")]);
}

#[test]
fn errors_say_what_failed() {
    let unsupported = FingerprintError::Unsupported {
        backend: "cuda".into(),
        algorithm: Algorithm::Md5,
    };
    assert_eq!(
        unsupported.to_string(),
        "fingerprint backend cuda does not support md5"
    );
    assert_eq!(
        FingerprintError::Unavailable("no CUDA device".into()).to_string(),
        "fingerprint backend unavailable: no CUDA device"
    );
}
