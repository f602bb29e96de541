//! A plain, byte-at-a-time twin of [`Codec`](super::Codec): GF(2^8) from
//! log/exp tables, the same Cauchy generator, encode, update and reconstruct by
//! Gauss-Jordan inversion. It is the reference the ISA-L codec is tested
//! against, written for obviousness rather than speed; do not use it on the
//! data path.
//!
//! Invariants: arithmetic is in GF(2^8) with ISA-L's polynomial
//! x^8 + x^4 + x^3 + x^2 + 1 (0x11d) and generator 2; the generator matrix is
//! built exactly as ISA-L's `gf_gen_cauchy1_matrix` (identity in rows `0..k`,
//! `1 / (i ^ j)` at row `i in k..k+m`, column `j in 0..k`); geometry is
//! validated by the same rule, and every method has the same contract
//! (counts, lengths, panics, errors) as its `Codec` counterpart.

use super::{validate_geometry, CodecError};

/// ISA-L's field polynomial, x^8 + x^4 + x^3 + x^2 + 1.
pub const POLY: u16 = 0x11d;

/// `EXP[i] = 2^i`, doubled in length so `EXP[log a + log b]` needs no modulo;
/// `LOG[2^i] = i` (`LOG[0]` is unused).
const fn log_exp_tables() -> ([u8; 512], [u8; 256]) {
    let mut exp = [0u8; 512];
    let mut log = [0u8; 256];
    let mut x: u16 = 1;
    let mut i = 0;
    while i < 255 {
        exp[i] = x as u8;
        log[x as usize] = i as u8;
        x <<= 1;
        if x & 0x100 != 0 {
            x ^= POLY;
        }
        i += 1;
    }
    while i < 512 {
        exp[i] = exp[i - 255];
        i += 1;
    }
    (exp, log)
}

const LOG_EXP: ([u8; 512], [u8; 256]) = log_exp_tables();
static EXP: [u8; 512] = LOG_EXP.0;
static LOG: [u8; 256] = LOG_EXP.1;

/// `a * b` in GF(2^8).
pub fn mul(a: u8, b: u8) -> u8 {
    if a == 0 || b == 0 {
        0
    } else {
        EXP[LOG[a as usize] as usize + LOG[b as usize] as usize]
    }
}

/// The `b` with `a * b = 1`; `a` must not be 0.
pub fn inv(a: u8) -> u8 {
    assert!(a != 0, "0 has no inverse in GF(2^8)");
    EXP[255 - LOG[a as usize] as usize]
}

/// The `(k + m) x k` Cauchy generator, row-major, as `gf_gen_cauchy1_matrix`.
pub fn cauchy1_matrix(k: usize, m: usize) -> Vec<u8> {
    let rows = k + m;
    assert!(
        rows <= super::SHARDS_MAX,
        "cauchy1_matrix: {rows} rows exceed 255"
    );
    let mut a = vec![0u8; rows * k];
    for i in 0..k {
        a[i * k + i] = 1;
    }
    for i in k..rows {
        for j in 0..k {
            // i != j, both below 255: i ^ j is a non-zero byte.
            a[i * k + j] = inv((i ^ j) as u8);
        }
    }
    a
}

/// The inverse of the `n x n` row-major `matrix` by Gauss-Jordan elimination,
/// or `None` when it is singular.
pub fn invert(matrix: &[u8], n: usize) -> Option<Vec<u8>> {
    assert_eq!(matrix.len(), n * n, "invert: matrix is not {n} x {n}");
    let mut a = matrix.to_vec();
    let mut b = vec![0u8; n * n];
    for i in 0..n {
        b[i * n + i] = 1;
    }
    for col in 0..n {
        let pivot = (col..n).find(|&r| a[r * n + col] != 0)?;
        if pivot != col {
            for j in 0..n {
                a.swap(pivot * n + j, col * n + j);
                b.swap(pivot * n + j, col * n + j);
            }
        }
        let scale = inv(a[col * n + col]);
        for j in 0..n {
            a[col * n + j] = mul(a[col * n + j], scale);
            b[col * n + j] = mul(b[col * n + j], scale);
        }
        for r in (0..n).filter(|&r| r != col) {
            let factor = a[r * n + col];
            if factor != 0 {
                for j in 0..n {
                    a[r * n + j] ^= mul(factor, a[col * n + j]);
                    b[r * n + j] ^= mul(factor, b[col * n + j]);
                }
            }
        }
    }
    Some(b)
}

/// `out ^= coefficient * src`, bytewise: the twin of [`super::mul_xor`].
pub fn mul_add(coefficient: u8, src: &[u8], out: &mut [u8]) {
    assert_eq!(src.len(), out.len(), "mul_add: buffers differ in length");
    for (o, &s) in out.iter_mut().zip(src) {
        *o ^= mul(coefficient, s);
    }
}

/// The scalar RS(k,m) code; see the module documentation.
#[derive(Debug, Clone)]
pub struct ScalarCodec {
    k: usize,
    m: usize,
    matrix: Vec<u8>,
}

impl ScalarCodec {
    pub fn new(k: usize, m: usize) -> Result<ScalarCodec, CodecError> {
        validate_geometry(k, m)?;
        Ok(ScalarCodec {
            k,
            m,
            matrix: cauchy1_matrix(k, m),
        })
    }
    pub fn k(&self) -> usize {
        self.k
    }
    pub fn m(&self) -> usize {
        self.m
    }
    /// The `(k + m) x k` generator, row-major.
    pub fn matrix(&self) -> &[u8] {
        &self.matrix
    }
    fn row(&self, r: usize) -> &[u8] {
        &self.matrix[r * self.k..(r + 1) * self.k]
    }
    /// parity[j] = sum_i a_{k+j,i} * data[i]; all slices the same length.
    pub fn encode(&self, data: &[&[u8]], parity: &mut [&mut [u8]]) {
        assert_eq!(data.len(), self.k, "encode: takes {} data shards", self.k);
        assert_eq!(
            parity.len(),
            self.m,
            "encode: takes {} parity shards",
            self.m
        );
        for (j, p) in parity.iter_mut().enumerate() {
            p.fill(0);
            for (i, d) in data.iter().enumerate() {
                mul_add(self.row(self.k + j)[i], d, p);
            }
        }
    }
    /// parity[j] ^= a_{k+j,data_index} * delta, where delta = old ^ new of data shard data_index.
    pub fn update(&self, data_index: usize, delta: &[u8], parity: &mut [&mut [u8]]) {
        assert!(
            data_index < self.k,
            "update: data shard {data_index} out of range"
        );
        assert_eq!(
            parity.len(),
            self.m,
            "update: takes {} parity shards",
            self.m
        );
        for (j, p) in parity.iter_mut().enumerate() {
            mul_add(self.row(self.k + j)[data_index], delta, p);
        }
    }
    /// Fills every shard whose `present[i]` is false (data and parity alike) from
    /// any k present shards. shards.len() == k + m, all the same length.
    pub fn reconstruct(
        &self,
        shards: &mut [&mut [u8]],
        present: &[bool],
    ) -> Result<(), CodecError> {
        let (k, total) = (self.k, self.k + self.m);
        assert_eq!(shards.len(), total, "reconstruct: takes {total} shards");
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

        // Missing data: data = B^-1 * chosen, B the generator rows of the first
        // k present shards.
        let chosen: Vec<usize> = (0..total).filter(|&r| present[r]).take(k).collect();
        if (0..k).any(|i| !present[i]) {
            let b: Vec<u8> = chosen.iter().flat_map(|&r| self.row(r).to_vec()).collect();
            let inverse = invert(&b, k).expect("Cauchy submatrices are invertible");
            let sources: Vec<Vec<u8>> = chosen.iter().map(|&r| shards[r].to_vec()).collect();
            for i in (0..k).filter(|&i| !present[i]) {
                shards[i].fill(0);
                for (c, src) in sources.iter().enumerate() {
                    mul_add(inverse[i * k + c], src, shards[i]);
                }
            }
        }
        // Missing parity: re-encode from the (now complete) data.
        let data: Vec<Vec<u8>> = (0..k).map(|i| shards[i].to_vec()).collect();
        for r in (k..total).filter(|&r| !present[r]) {
            shards[r].fill(0);
            for (i, d) in data.iter().enumerate() {
                mul_add(self.row(r)[i], d, shards[r]);
            }
        }
        Ok(())
    }
}
