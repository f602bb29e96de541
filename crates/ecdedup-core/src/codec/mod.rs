//! Reed-Solomon RS(k,m) over GF(2^8), computed by Intel ISA-L: `k` data shards,
//! `m` parity shards, any `k` of the `k + m` recover the rest.
//!
//! Invariants: the generator is ISA-L's Cauchy matrix `[I; C]` of
//! `(k + m) x k` with `1 <= k`, `1 <= m`, `k + m <= 255` (polynomial 0x11d), so
//! every `k x k` submatrix is invertible and the code is MDS; shard `i` is row
//! `i` of the generator times the data. All shards handed to one call have the
//! same length, and any length, 0 included, works. Wrong shard counts or
//! lengths are programmer errors and panic; too few shards to decode is a
//! [`CodecError`]. A [`Codec`] is immutable apart from its decode-table cache
//! (a `Mutex`, at most [`DECODE_TABLE_CACHE_ENTRIES_MAX`] entries), so it is
//! `Send + Sync` and shared by reference across threads. [`scalar`] is a plain
//! byte-at-a-time twin with the same results, kept for differential tests.

mod isal;
pub mod scalar;

pub use isal::crc32c;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Most shards (data plus parity) a code may have: field elements index rows.
pub const SHARDS_MAX: usize = 255;

/// Bound on cached decode tables, one entry per set of `k` rows chosen to
/// decode from; when the cache is full it is cleared before the next insert.
pub const DECODE_TABLE_CACHE_ENTRIES_MAX: usize = 64;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CodecError {
    #[error("invalid geometry: {0}")]
    Geometry(String),
    #[error("too many erasures: {present} of {total} shards present, {needed} needed")]
    TooManyErasures {
        present: usize,
        total: usize,
        needed: usize,
    },
}

/// Checks `1 <= k`, `1 <= m`, `k + m <= 255`, shared by both codecs.
fn validate_geometry(k: usize, m: usize) -> Result<(), CodecError> {
    if k == 0 {
        return Err(CodecError::Geometry(format!(
            "RS({k},{m}): need at least 1 data shard (k >= 1)"
        )));
    }
    if m == 0 {
        return Err(CodecError::Geometry(format!(
            "RS({k},{m}): need at least 1 parity shard (m >= 1)"
        )));
    }
    if k.checked_add(m).is_none_or(|n| n > SHARDS_MAX) {
        return Err(CodecError::Geometry(format!(
            "RS({k},{m}): k + m must be at most {SHARDS_MAX} shards"
        )));
    }
    Ok(())
}

/// A set of generator rows (shard indices), one bit per row.
type RowMask = [u64; 4];

fn mask_has(mask: &RowMask, row: usize) -> bool {
    mask[row / 64] & (1 << (row % 64)) != 0
}

/// What decoding from one set of `k` chosen rows needs: for each of the `m`
/// other rows, its coefficients over the chosen shards, expanded into tables.
struct DecodePlan {
    /// The rows not chosen, ascending; every missing shard is one of them.
    targets: Vec<usize>,
    /// `32 * k` bytes of ISA-L tables per target, in `targets` order.
    tables: Vec<u8>,
}

/// An RS(k,m) code with a Cauchy generator matrix (every k x k submatrix of
/// the (k+m) x k generator is invertible).
pub struct Codec {
    k: usize,
    m: usize,
    /// The `(k + m) x k` generator, row-major.
    matrix: Vec<u8>,
    /// ISA-L tables for the `m` parity rows.
    encode_tables: Vec<u8>,
    /// Decode plans keyed by the rows chosen to decode from.
    decode_cache: Mutex<HashMap<RowMask, Arc<DecodePlan>>>,
}

// Shared across threads by the array layer: keep it so.
const _: fn() = || {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Codec>();
};

impl fmt::Debug for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Codec")
            .field("k", &self.k)
            .field("m", &self.m)
            .finish_non_exhaustive()
    }
}

impl Codec {
    pub fn new(k: usize, m: usize) -> Result<Codec, CodecError> {
        validate_geometry(k, m)?;
        let matrix = isal::cauchy1_matrix(k + m, k);
        let encode_tables = isal::init_tables(k, m, &matrix[k * k..]);
        Ok(Codec {
            k,
            m,
            matrix,
            encode_tables,
            decode_cache: Mutex::new(HashMap::new()),
        })
    }
    pub fn k(&self) -> usize {
        self.k
    }
    pub fn m(&self) -> usize {
        self.m
    }
    /// parity[j] = sum_i a_{k+j,i} * data[i]; all slices the same length.
    pub fn encode(&self, data: &[&[u8]], parity: &mut [&mut [u8]]) {
        assert_eq!(
            data.len(),
            self.k,
            "encode: RS({},{}) takes {} data shards",
            self.k,
            self.m,
            self.k
        );
        assert_eq!(
            parity.len(),
            self.m,
            "encode: RS({},{}) takes {} parity shards",
            self.k,
            self.m,
            self.m
        );
        isal::encode_data(&self.encode_tables, data, parity);
    }
    /// The generator's coefficient `a_{k+parity, data}`: what parity unit
    /// `parity` gains per byte of data unit `data` (parix's replay folds
    /// `a * (d(r) ^ d(0))` with it, where the parity lives: [`mul_xor`]).
    pub fn coefficient(&self, parity: usize, data: usize) -> u8 {
        assert!(
            parity < self.m && data < self.k,
            "coefficient: ({parity}, {data}) out of range for RS({},{})",
            self.k,
            self.m
        );
        self.matrix[(self.k + parity) * self.k + data]
    }
    /// parity[j] ^= a_{k+j,data_index} * delta, where delta = old ^ new of data shard data_index.
    pub fn update(&self, data_index: usize, delta: &[u8], parity: &mut [&mut [u8]]) {
        assert!(
            data_index < self.k,
            "update: data shard {data_index} out of range for k = {}",
            self.k
        );
        assert_eq!(
            parity.len(),
            self.m,
            "update: RS({},{}) takes {} parity shards",
            self.k,
            self.m,
            self.m
        );
        isal::encode_data_update(&self.encode_tables, self.k, data_index, delta, parity);
    }
    /// Fills every shard whose `present[i]` is false (data and parity alike) from
    /// any k present shards. shards.len() == k + m, all the same length.
    pub fn reconstruct(
        &self,
        shards: &mut [&mut [u8]],
        present: &[bool],
    ) -> Result<(), CodecError> {
        let (k, total) = (self.k, self.k + self.m);
        assert_eq!(
            shards.len(),
            total,
            "reconstruct: RS({},{}) takes {total} shards",
            self.k,
            self.m
        );
        assert_eq!(
            present.len(),
            total,
            "reconstruct: present must flag {total} shards"
        );
        let len = shards[0].len();
        assert!(
            shards.iter().all(|s| s.len() == len),
            "reconstruct: shards differ in length"
        );
        let present_count = present.iter().filter(|&&p| p).count();
        if present_count < k {
            return Err(CodecError::TooManyErasures {
                present: present_count,
                total,
                needed: k,
            });
        }
        if present_count == total || len == 0 {
            return Ok(());
        }

        // Decode from the first k present shards.
        let mut chosen: RowMask = [0; 4];
        for row in (0..total).filter(|&r| present[r]).take(k) {
            chosen[row / 64] |= 1 << (row % 64);
        }
        let plan = self.decode_plan(chosen);

        // Missing shards are targets; use their tables in place when they are
        // consecutive targets (always so for one erasure or all m), else gather.
        let is_missing = |p: &usize| !present[plan.targets[*p]];
        let positions = 0..plan.targets.len();
        let missing_count = total - present_count;
        let first = positions
            .clone()
            .find(is_missing)
            .expect("a shard is missing");
        let last = positions
            .clone()
            .rfind(is_missing)
            .expect("a shard is missing");
        let row_bytes = isal::TABLE_BYTES_PER_COEFFICIENT * k;
        let gathered: Vec<u8>;
        let tables: &[u8] = if last - first + 1 == missing_count {
            &plan.tables[first * row_bytes..(last + 1) * row_bytes]
        } else {
            gathered = positions
                .filter(is_missing)
                .flat_map(|p| &plan.tables[p * row_bytes..(p + 1) * row_bytes])
                .copied()
                .collect();
            &gathered
        };

        let mut srcs: Vec<&[u8]> = Vec::with_capacity(k);
        let mut dsts: Vec<&mut [u8]> = Vec::with_capacity(missing_count);
        for (row, shard) in shards.iter_mut().enumerate() {
            if mask_has(&chosen, row) {
                srcs.push(&**shard);
            } else if !present[row] {
                dsts.push(&mut **shard);
            }
        }
        isal::encode_data(tables, &srcs, &mut dsts);
        Ok(())
    }

    fn lock_decode_cache(&self) -> MutexGuard<'_, HashMap<RowMask, Arc<DecodePlan>>> {
        // Entries are inserted whole, so a panic elsewhere cannot leave one torn.
        self.decode_cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The cached plan for decoding from the rows in `chosen`, built on a miss.
    fn decode_plan(&self, chosen: RowMask) -> Arc<DecodePlan> {
        if let Some(plan) = self.lock_decode_cache().get(&chosen) {
            return Arc::clone(plan);
        }
        let plan = Arc::new(self.build_decode_plan(&chosen));
        let mut cache = self.lock_decode_cache();
        if cache.len() >= DECODE_TABLE_CACHE_ENTRIES_MAX {
            cache.clear();
        }
        Arc::clone(cache.entry(chosen).or_insert(plan))
    }

    /// With B the k x k rows of the generator in `chosen`, the chosen shards are
    /// B * data, so any row r is (a_r * B^-1) * chosen shards.
    fn build_decode_plan(&self, chosen: &RowMask) -> DecodePlan {
        let (k, total) = (self.k, self.k + self.m);
        let mut sub = Vec::with_capacity(k * k);
        for row in (0..total).filter(|&r| mask_has(chosen, r)) {
            sub.extend_from_slice(&self.matrix[row * k..(row + 1) * k]);
        }
        assert_eq!(sub.len(), k * k, "decode plan: {k} rows must be chosen");
        let inverse = isal::invert_matrix(sub, k)
            .expect("a k x k submatrix of a Cauchy generator is always invertible");
        let targets: Vec<usize> = (0..total).filter(|&r| !mask_has(chosen, r)).collect();
        let mut coefficients = vec![0u8; targets.len() * k];
        for (out, &row) in coefficients.chunks_exact_mut(k).zip(&targets) {
            let a = &self.matrix[row * k..(row + 1) * k];
            for (j, c) in out.iter_mut().enumerate() {
                *c = (0..k).fold(0, |acc, i| acc ^ isal::mul(a[i], inverse[i * k + j]));
            }
        }
        let tables = isal::init_tables(k, targets.len(), &coefficients);
        DecodePlan { targets, tables }
    }

    #[cfg(test)]
    fn decode_cache_len(&self) -> usize {
        self.lock_decode_cache().len()
    }
}

/// `dst ^= coefficient * src` in GF(2^8), bytewise (ISA-L's
/// multiply-and-add, `ec_encode_data_update` with one 1 x 1 table; a
/// coefficient of 1 is a plain XOR). `src` and `dst` have the same length.
/// No geometry is needed: the coefficient comes from the writer's codec
/// ([`Codec::coefficient`]), so a chunk server folds parity knowing no code.
pub fn mul_xor(coefficient: u8, src: &[u8], dst: &mut [u8]) {
    assert_eq!(src.len(), dst.len(), "mul_xor: buffers differ in length");
    match coefficient {
        0 => {}
        1 => {
            for (d, s) in dst.iter_mut().zip(src) {
                *d ^= s;
            }
        }
        c => {
            let tables = isal::init_tables(1, 1, &[c]);
            isal::encode_data_update(&tables, 1, 0, src, &mut [dst]);
        }
    }
}

/// Direct ISA-L entry points, so the benchmark can time the wrapper against
/// its raw peer. Not part of the API.
#[doc(hidden)]
pub mod raw {
    pub use super::isal::{
        ec_encode_data, ec_init_tables, gf_gen_cauchy1_matrix, gf_invert_matrix, gf_mul,
    };
}
