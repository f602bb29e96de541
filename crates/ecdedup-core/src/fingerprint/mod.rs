//! Fingerprints: the content hashes the dedup layer keys its index on.
//!
//! A [`Fingerprint`] is the digest of one chunk under one [`Algorithm`]; the
//! dedup layer treats two chunks with equal fingerprints as candidates for
//! sharing one stored copy. Chunks are hashed in batches through a
//! [`FingerprintBackend`]: [`CpuBackend`] (all cores through its own rayon
//! pool) or [`gpu::GpuBackend`] (CUDA through `cudarc`, kernels compiled by
//! NVRTC at run time; docs/gpu.md), behind the same trait; which one an
//! array uses is its `fingerprint_backend` setting (`cpu`, `gpu`, `auto`),
//! resolved by [`gpu::choose_backend`].
//!
//! Invariants:
//! - A fingerprint holds exactly [`Algorithm::digest_bytes`] bytes of one
//!   algorithm's digest; the unused tail of its 32-byte array is zero, so the
//!   derived `Eq`, `Hash` and `Ord` compare the digest and nothing else.
//!   Fingerprints of different algorithms are never compared: a volume records
//!   its one algorithm, and the index is per volume.
//! - `fingerprint_batch` clears `out` and leaves one fingerprint per chunk in
//!   chunk order, identical whichever backend or path (parallel, sequential)
//!   produced it; it reuses `out`'s allocation, so a caller that keeps its
//!   vector hashes without allocating in the steady state.
//!
//! Strong and weak algorithms ([`Algorithm::strong`]): SHA-256 and BLAKE3
//! have no known collisions, so a fingerprint hit is taken as equal content
//! without reading the stored chunk back. MD5 and SHA-1 have practical
//! chosen-prefix collisions (MD5 since 2007; SHA-1 since 2020, "SHA-1 is a
//! Shambles"): an attacker who controls data written to a volume can craft
//! two different blocks with one fingerprint, and without a check the second
//! write would silently alias the first block's contents. With them the
//! dedup layer must `verify`: byte-compare the candidate with the stored
//! chunk on every hit, which removes the risk at the cost of a read. For
//! random (non-adversarial) data the accidental collision probability is
//! negligible for every algorithm here: about n²/2^(b+1) for n chunks and b
//! digest bits, about 2·10^-15 for 2^40 chunks (4 PiB of 4 KiB blocks) even
//! with MD5's 128 bits.
//!
//! Hardware acceleration is detected at run time, with no build flag and a
//! portable fallback on CPUs without the instructions. `sha1` 0.11.0 and
//! `sha2` 0.11.1 (RustCrypto, with `cpufeatures` 0.3) declare
//! `cpufeatures::new!(shani_cpuid, "sha", "sse4.1", ...)` on x86/x86-64,
//! check it once (cached) and run the SHA-NI compression when present, the
//! software rounds otherwise; on aarch64 likewise for the ARMv8 SHA2
//! extension. Measured on this project's Xeon with 4 KiB chunks, SHA-256
//! runs at 1.0-1.4 GB/s per core by default against 0.22-0.29 GB/s when
//! built with `--cfg sha2_backend="soft"`. `blake3` 1.8 dispatches among
//! SSE2, SSE4.1, AVX2 and AVX-512 assembly at run time, and within one chunk
//! hashes its 1 KiB BLAKE3 chunks side by side, so even a 4 KiB block uses
//! SIMD. `md-5` 0.11 has no SIMD backend on x86 (MD5 is one serial
//! dependency chain); it is the slowest per core here.
//!
//! [`crc32c_prefilter`] is not a fingerprint: 32 bits collide by the birthday
//! bound after ~65,000 chunks. It is the cheap, hardware-accelerated filter
//! for deciding which chunks are worth a real fingerprint or a closer look.

pub mod coalesce;
mod cpu;
pub mod gpu;
#[cfg(test)]
mod tests;

pub use cpu::{CpuBackend, PARALLEL_THRESHOLD_BYTES};

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A content-hash algorithm for fingerprints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Algorithm {
    Sha1,
    Sha256,
    Md5,
    Blake3,
    /// CRC-32C as a fingerprint: not cryptographic, 32 bits, so matches
    /// happen by chance (birthday bound near 65,000 chunks) and a hit is
    /// only a candidate: an array with it must byte-compare every hit
    /// (`verify`, enforced by `DedupConfig::validate`). It buys an index
    /// entry of 16 bytes and hashing at the speed of the SSE4.2 CRC
    /// instruction, for workloads where hits are rare (parity).
    Crc32c,
}

impl Algorithm {
    /// Every algorithm, in declaration order.
    pub const ALL: [Algorithm; 5] = [
        Algorithm::Sha1,
        Algorithm::Sha256,
        Algorithm::Md5,
        Algorithm::Blake3,
        Algorithm::Crc32c,
    ];

    /// The name used by `Display`, `FromStr` and serde.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Sha1 => "sha1",
            Algorithm::Sha256 => "sha256",
            Algorithm::Md5 => "md5",
            Algorithm::Blake3 => "blake3",
            Algorithm::Crc32c => "crc32c",
        }
    }

    /// Length of this algorithm's digest in bytes.
    pub const fn digest_bytes(self) -> usize {
        match self {
            Algorithm::Sha1 => 20,
            Algorithm::Sha256 => 32,
            Algorithm::Md5 => 16,
            Algorithm::Blake3 => 32,
            Algorithm::Crc32c => 4,
        }
    }

    /// Whether equal fingerprints of different content take an attack
    /// (MD5, SHA-1) or never happen in practice (SHA-256, BLAKE3): false
    /// only for CRC-32C, whose matches happen by chance, so it is usable
    /// only with a byte compare on every hit.
    pub const fn cryptographic(self) -> bool {
        !matches!(self, Algorithm::Crc32c)
    }

    /// Whether a fingerprint match may be trusted without comparing bytes:
    /// true for SHA-256 and BLAKE3, false for MD5 and SHA-1, which have
    /// practical chosen-prefix collisions (see the module documentation).
    pub const fn strong(self) -> bool {
        matches!(self, Algorithm::Sha256 | Algorithm::Blake3)
    }

    /// The fingerprint of one chunk, hashed on the calling thread and not
    /// counted by any backend.
    pub fn fingerprint(self, chunk: &[u8]) -> Fingerprint {
        use sha2::Digest as _;
        match self {
            Algorithm::Sha1 => Fingerprint::from_digest(&sha1::Sha1::digest(chunk)),
            Algorithm::Sha256 => Fingerprint::from_digest(&sha2::Sha256::digest(chunk)),
            Algorithm::Md5 => Fingerprint::from_digest(&md5::Md5::digest(chunk)),
            Algorithm::Blake3 => Fingerprint::from_digest(blake3::hash(chunk).as_bytes()),
            Algorithm::Crc32c => {
                Fingerprint::from_digest(&crate::codec::crc32c(chunk).to_le_bytes())
            }
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algorithm {
    type Err = FingerprintError;

    /// Parses the names `Display` writes, in any ASCII case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| FingerprintError::UnknownAlgorithm(s.to_string()))
    }
}

/// The digest of one chunk: up to 32 bytes inline, `Copy`, 33 bytes in all
/// ([`Fingerprint::SIZE`]) with alignment 1, so that an index of millions stays
/// compact. Displays and debug-prints as lowercase hex.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint {
    len: u8,
    bytes: [u8; Fingerprint::MAX_BYTES],
}

const _: () = assert!(Fingerprint::SIZE == 33);
const _: () = assert!(std::mem::align_of::<Fingerprint>() == 1);

impl Fingerprint {
    /// The longest digest a fingerprint holds (SHA-256, BLAKE3).
    pub const MAX_BYTES: usize = 32;

    /// `size_of::<Fingerprint>()`, known at compile time: 33.
    pub const SIZE: usize = std::mem::size_of::<Fingerprint>();

    /// Placeholder for slots about to be overwritten; never handed out.
    const UNSET: Fingerprint = Fingerprint {
        len: 0,
        bytes: [0; Fingerprint::MAX_BYTES],
    };

    /// A fingerprint from digest bytes, e.g. read back from an index on disk.
    /// Fails unless `1 <= digest.len() <= 32`.
    pub fn from_slice(digest: &[u8]) -> Result<Self, FingerprintError> {
        if digest.is_empty() || digest.len() > Self::MAX_BYTES {
            return Err(FingerprintError::InvalidLength(digest.len()));
        }
        Ok(Self::from_digest(digest))
    }

    /// Digest bytes a hash function just produced (1..=32 by construction).
    fn from_digest(digest: &[u8]) -> Self {
        debug_assert!(!digest.is_empty() && digest.len() <= Self::MAX_BYTES);
        let mut bytes = [0u8; Self::MAX_BYTES];
        bytes[..digest.len()].copy_from_slice(digest);
        Fingerprint {
            len: digest.len() as u8,
            bytes,
        }
    }

    /// The digest bytes, exactly as long as the algorithm's digest.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }

    /// The first 8 digest bytes as a little-endian integer: uniformly
    /// distributed for any algorithm here, so good for choosing an index
    /// shard or bucket without hashing again.
    pub fn prefix_u64(&self) -> u64 {
        let mut word = [0u8; 8];
        word.copy_from_slice(&self.bytes[..8]);
        u64::from_le_bytes(word)
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in self.as_bytes() {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Why fingerprinting (or parsing a name or digest for it) failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FingerprintError {
    /// The backend cannot run here, e.g. a GPU backend with no device, or a
    /// thread pool that could not be started.
    #[error("fingerprint backend unavailable: {0}")]
    Unavailable(String),
    /// The backend runs but does not implement this algorithm.
    #[error("fingerprint backend {backend} does not support {algorithm}")]
    Unsupported {
        backend: String,
        algorithm: Algorithm,
    },
    /// The backend failed while hashing a batch (e.g. a device error).
    #[error("fingerprint backend failed: {0}")]
    Backend(String),
    #[error("unknown fingerprint algorithm {0:?}: expected one of sha1, sha256, md5, blake3")]
    UnknownAlgorithm(String),
    #[error("invalid fingerprint length {0} bytes: expected 1 to 32")]
    InvalidLength(usize),
}

/// Something that hashes batches of chunks: [`CpuBackend`] or
/// [`gpu::GpuBackend`] (which itself sends small and BLAKE3 batches to a
/// `CpuBackend`).
pub trait FingerprintBackend: Send + Sync {
    /// Short name for logs and errors, e.g. "cpu".
    fn name(&self) -> &str;

    /// Clears `out` and fills it with one fingerprint per chunk, in chunk
    /// order. Reuses `out`'s allocation; on error `out`'s contents are
    /// unspecified.
    fn fingerprint_batch(
        &self,
        algorithm: Algorithm,
        chunks: &[&[u8]],
        out: &mut Vec<Fingerprint>,
    ) -> Result<(), FingerprintError>;
}

/// What a backend has hashed since it was made; counters only grow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FingerprintStats {
    /// Chunks hashed (one hash operation each).
    pub chunks: u64,
    /// Bytes hashed, summed over all chunks.
    pub bytes: u64,
    /// Calls to `fingerprint_batch`.
    pub batches: u64,
    /// Of those, batches spread over the thread pool.
    pub parallel_batches: u64,
}

/// CRC-32C (Castagnoli) of a chunk: the cheap prefilter, SSE4.2 or ARMv8
/// CRC instructions where present (ISA-L's, as the block checksums:
/// `codec::crc32c`). Not a fingerprint; see the module documentation.
pub fn crc32c_prefilter(chunk: &[u8]) -> u32 {
    crate::codec::crc32c(chunk)
}
