//! Hand-written declarations of the few Intel ISA-L functions the codec uses
//! (from `isa-l/erasure_code.h`, Debian `libisal-dev`; `build.rs` links
//! `libisal`), and thin safe wrappers around them.
//!
//! Invariants: the `extern "C"` items mirror the C prototypes exactly (every
//! `int` is `c_int`, every `unsigned char` is `u8`). Every unsafe call in this
//! crate goes through a wrapper below, which asserts the preconditions ISA-L
//! does not check itself: matrix and table sizes match the geometry, every
//! source and destination buffer has the same length, lengths and counts fit in
//! a C `int`, and at least one source and one destination exist. ISA-L only
//! reads the buffers it receives as `unsigned char *` sources and coefficient
//! arrays, so handing it pointers derived from shared slices is sound; the
//! destinations come from `&mut` slices, so they never alias the sources.
//! After every vector kernel the upper vector state is cleared (`vzeroupper`),
//! which ISA-L itself does not do (see [`clear_upper_vector_state`]).

use std::os::raw::c_int;

extern "C" {
    /// `a * b` in GF(2^8) with ISA-L's polynomial 0x11d.
    pub fn gf_mul(a: u8, b: u8) -> u8;

    /// Fills the `m x k` array `a` with `[I; C]`: identity on top, then
    /// `1 / (i ^ j)` for `i in k..m`, `j in 0..k` (`m` counts all rows here).
    pub fn gf_gen_cauchy1_matrix(a: *mut u8, m: c_int, k: c_int);

    /// Inverts the `n x n` matrix `input` (destroyed) into `output`; non-zero
    /// when `input` is singular.
    pub fn gf_invert_matrix(input: *mut u8, output: *mut u8, n: c_int) -> c_int;

    /// Expands the `rows x k` coefficients `a` into `32 * k * rows` bytes of
    /// multiplication tables for [`ec_encode_data`].
    pub fn ec_init_tables(k: c_int, rows: c_int, a: *mut u8, gftbls: *mut u8);

    /// `coding[r] = sum_i c_{r,i} * data[i]` for `rows` outputs of `len` bytes
    /// from `k` sources, with the coefficients expanded in `gftbls`.
    pub fn ec_encode_data(
        len: c_int,
        k: c_int,
        rows: c_int,
        gftbls: *mut u8,
        data: *mut *mut u8,
        coding: *mut *mut u8,
    );

    /// `coding[r] ^= c_{r,vec_i} * data` for `rows` outputs: the contribution of
    /// source `vec_i` alone, XORed in.
    pub fn ec_encode_data_update(
        len: c_int,
        k: c_int,
        rows: c_int,
        vec_i: c_int,
        g_tbls: *mut u8,
        data: *mut u8,
        coding: *mut *mut u8,
    );

    /// CRC-32C (Castagnoli, iSCSI) of `len` bytes (`isa-l/crc.h`), carried
    /// on from `init_crc`: the register before its final inversion, so
    /// `!crc32_iscsi(b, n, !0)` is the standard CRC-32C of `b`, and the
    /// value returned, passed as the next call's `init_crc`, continues it.
    /// Reads `buffer` only.
    pub fn crc32_iscsi(buffer: *mut u8, len: c_int, init_crc: u32) -> u32;
}

/// The standard CRC-32C of `bytes` (the value of `crc32c::crc32c`), by
/// ISA-L: 2.2 times the `crc32c` crate's speed on 4 KiB blocks in cache
/// on an AVX-512 machine (1.7 times out of cache), the block checksums
/// of the data path go through it (docs/benchmarks.md, "Cut: the block
/// checksums by ISA-L"; `cargo bench -p ecdedup-core --bench codec`).
pub fn crc32c(bytes: &[u8]) -> u32 {
    const PIECE: usize = 1 << 30;
    let mut register = !0u32;
    for piece in bytes.chunks(PIECE) {
        // SAFETY: ISA-L reads `piece.len()` bytes from the pointer and
        // writes nothing through it (the prototype's pointer is not
        // const); the length fits a C int (1 GiB pieces).
        register = unsafe {
            crc32_iscsi(
                piece.as_ptr() as *mut u8,
                c_int_of("crc length", piece.len()),
                register,
            )
        };
    }
    clear_upper_vector_state();
    !register
}

/// Bytes of ISA-L multiplication tables per (output row, source) coefficient.
pub const TABLE_BYTES_PER_COEFFICIENT: usize = 32;

/// Converts a count or a length to a C `int`, asserting that it fits.
fn c_int_of(what: &str, value: usize) -> c_int {
    c_int::try_from(value).unwrap_or_else(|_| panic!("{what} {value} does not fit in a C int"))
}

/// Pointers to shard buffers as ISA-L takes them (`unsigned char **`): on the
/// stack for the usual handful of shards, so a call allocates nothing.
enum PointerArray {
    Inline([*mut u8; PointerArray::INLINE]),
    Heap(Vec<*mut u8>),
}

impl PointerArray {
    const INLINE: usize = 24;

    fn new(pointers: impl ExactSizeIterator<Item = *mut u8>) -> PointerArray {
        if pointers.len() <= Self::INLINE {
            let mut array = [std::ptr::null_mut(); Self::INLINE];
            for (slot, p) in array.iter_mut().zip(pointers) {
                *slot = p;
            }
            PointerArray::Inline(array)
        } else {
            PointerArray::Heap(pointers.collect())
        }
    }

    fn as_mut_ptr(&mut self) -> *mut *mut u8 {
        match self {
            PointerArray::Inline(array) => array.as_mut_ptr(),
            PointerArray::Heap(vec) => vec.as_mut_ptr(),
        }
    }
}

/// Clears the upper halves of the vector registers after an ISA-L kernel.
///
/// ISA-L's AVX2/AVX-512 kernels (2.30, as Debian ships it) return without
/// `vzeroupper`, and the legacy-SSE instructions that plain `x86_64` Rust code
/// runs next (to zero and copy memory, among others) then pay a
/// state-transition penalty: measured here as about 170 ns added to each small
/// encode call on an AVX-512 Xeon, and 5% of a 32 KiB RS(4,2) encode. Intel's
/// guidance is to leave AVX code with `vzeroupper`; this does it for ISA-L.
#[inline]
fn clear_upper_vector_state() {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: the CPU has AVX, checked just above.
        unsafe { zero_upper_avx() }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
fn zero_upper_avx() {
    std::arch::x86_64::_mm256_zeroupper();
}

/// `a * b` in GF(2^8) (polynomial 0x11d).
pub fn mul(a: u8, b: u8) -> u8 {
    // SAFETY: a pure function of two bytes.
    unsafe { gf_mul(a, b) }
}

/// The `rows x k` Cauchy generator `[I; C]` of `gf_gen_cauchy1_matrix`,
/// row-major. `rows` counts data and parity rows together.
pub fn cauchy1_matrix(rows: usize, k: usize) -> Vec<u8> {
    assert!(k >= 1, "cauchy1_matrix: k must be at least 1");
    assert!(
        rows >= k,
        "cauchy1_matrix: {rows} rows cannot hold {k} identity rows"
    );
    // Row indices become field elements `i ^ j`: they must fit in a byte.
    assert!(rows <= 255, "cauchy1_matrix: {rows} rows exceed 255");
    let mut a = vec![0u8; rows * k];
    // SAFETY: `a` holds exactly rows * k bytes, which is all ISA-L writes.
    unsafe { gf_gen_cauchy1_matrix(a.as_mut_ptr(), c_int_of("rows", rows), c_int_of("k", k)) };
    a
}

/// The inverse of the `n x n` row-major matrix `input`, or `None` when it is
/// singular.
pub fn invert_matrix(mut input: Vec<u8>, n: usize) -> Option<Vec<u8>> {
    assert!(n >= 1, "invert_matrix: empty matrix");
    assert_eq!(input.len(), n * n, "invert_matrix: input is not {n} x {n}");
    let mut output = vec![0u8; n * n];
    // SAFETY: both buffers hold exactly n * n bytes; ISA-L reads and scribbles
    // on `input` and writes `output`, nothing beyond.
    let rc = unsafe { gf_invert_matrix(input.as_mut_ptr(), output.as_mut_ptr(), c_int_of("n", n)) };
    (rc == 0).then_some(output)
}

/// Expands `rows x k` row-major coefficients into the `32 * k * rows` bytes of
/// tables that [`encode_data`] and [`encode_data_update`] take.
pub fn init_tables(k: usize, rows: usize, coefficients: &[u8]) -> Vec<u8> {
    assert!(
        k >= 1 && rows >= 1,
        "init_tables: empty geometry {rows} x {k}"
    );
    assert_eq!(
        coefficients.len(),
        k * rows,
        "init_tables: coefficients are not {rows} x {k}"
    );
    let mut tables = vec![0u8; TABLE_BYTES_PER_COEFFICIENT * k * rows];
    // SAFETY: ISA-L reads k * rows coefficients (it never writes them, the
    // `*mut` is C's missing const) and writes 32 * k * rows table bytes.
    unsafe {
        ec_init_tables(
            c_int_of("k", k),
            c_int_of("rows", rows),
            coefficients.as_ptr().cast_mut(),
            tables.as_mut_ptr(),
        )
    };
    tables
}

/// `dsts[r] = sum_i c_{r,i} * srcs[i]`, with the coefficients expanded by
/// [`init_tables`] for `dsts.len()` rows and `srcs.len()` sources. All buffers
/// must have the same length; a length of 0 is a no-op.
pub fn encode_data(tables: &[u8], srcs: &[&[u8]], dsts: &mut [&mut [u8]]) {
    let (k, rows) = (srcs.len(), dsts.len());
    assert!(k >= 1, "encode_data: no sources");
    assert!(rows >= 1, "encode_data: no destinations");
    assert_eq!(
        tables.len(),
        TABLE_BYTES_PER_COEFFICIENT * k * rows,
        "encode_data: tables are not for {rows} rows x {k} sources"
    );
    let len = srcs[0].len();
    assert!(
        srcs.iter().all(|s| s.len() == len) && dsts.iter().all(|d| d.len() == len),
        "encode_data: buffers differ in length"
    );
    if len == 0 {
        return;
    }
    let mut src_ptrs = PointerArray::new(srcs.iter().map(|s| s.as_ptr().cast_mut()));
    let mut dst_ptrs = PointerArray::new(dsts.iter_mut().map(|d| d.as_mut_ptr()));
    // SAFETY: k source and `rows` destination pointers, each to `len` valid
    // bytes; destinations are distinct `&mut` slices so they alias nothing;
    // ISA-L only reads the sources and the tables (sized as asserted).
    unsafe {
        ec_encode_data(
            c_int_of("len", len),
            c_int_of("k", k),
            c_int_of("rows", rows),
            tables.as_ptr().cast_mut(),
            src_ptrs.as_mut_ptr(),
            dst_ptrs.as_mut_ptr(),
        )
    };
    clear_upper_vector_state();
}

/// `dsts[r] ^= c_{r,vec_i} * src` for the `dsts.len()` rows and `k` sources of
/// `tables` (from [`init_tables`]). All buffers must have the same length; a
/// length of 0 is a no-op.
pub fn encode_data_update(
    tables: &[u8],
    k: usize,
    vec_i: usize,
    src: &[u8],
    dsts: &mut [&mut [u8]],
) {
    let rows = dsts.len();
    assert!(
        vec_i < k,
        "encode_data_update: source {vec_i} out of range for k = {k}"
    );
    assert!(rows >= 1, "encode_data_update: no destinations");
    assert_eq!(
        tables.len(),
        TABLE_BYTES_PER_COEFFICIENT * k * rows,
        "encode_data_update: tables are not for {rows} rows x {k} sources"
    );
    let len = src.len();
    assert!(
        dsts.iter().all(|d| d.len() == len),
        "encode_data_update: buffers differ in length"
    );
    if len == 0 {
        return;
    }
    let mut dst_ptrs = PointerArray::new(dsts.iter_mut().map(|d| d.as_mut_ptr()));
    // SAFETY: one source and `rows` destinations of `len` valid bytes each;
    // destinations are distinct `&mut` slices; ISA-L only reads `src` and the
    // tables (sized as asserted) and reads-modifies-writes the destinations.
    unsafe {
        ec_encode_data_update(
            c_int_of("len", len),
            c_int_of("k", k),
            c_int_of("rows", rows),
            c_int_of("vec_i", vec_i),
            tables.as_ptr().cast_mut(),
            src.as_ptr().cast_mut(),
            dst_ptrs.as_mut_ptr(),
        )
    };
    clear_upper_vector_state();
}
