/*
 * hash.cu: the GPU fingerprint kernel, one thread per chunk, each thread
 * hashing its chunk sequentially with SHA-1, SHA-256 or MD5.
 *
 * This one file is compiled two ways from the same text. On a machine with
 * a CUDA device, gpu.rs embeds it with include_str! and hands it to NVRTC at
 * run time (no CUDA toolkit at build time). Everywhere, build.rs compiles it
 * as plain C through hash_cpu.c, which defines __global__, __device__,
 * __constant__, blockIdx, threadIdx and blockDim before including it, and the
 * Rust tests check that C build against RustCrypto on random inputs. So the
 * hashing logic below must stay the common subset of C99 and CUDA C++: no
 * C++ features, no C-only features, no standard headers (NVRTC has none by
 * default). The one CUDA-only branch is fp_load_block's 16-byte vector load
 * (under __CUDACC__), which reads the same 16 words as the C loop.
 *
 * Input layout (written by pipeline.rs `pack`), one device buffer per slice:
 *   meta[2*i]   = byte offset of chunk i from the buffer's start (multiple of 16)
 *   meta[2*i+1] = length of chunk i in bytes
 *   data        = the same buffer viewed as 32-bit words; chunk i starts at
 *                 word meta[2*i] / 4, and its last word may hold padding.
 * The buffer is read as little-endian 32-bit words: true of every CUDA device
 * and of the x86-64 and aarch64 hosts the C build is tested on.
 * Output: digest of chunk i at out[32*i ..], digest bytes in the standard
 * order (SHA big-endian words, MD5 little-endian words); the rest of the
 * 32-byte slot is left unwritten.
 *
 * Invariants: a thread reads only its own chunk's words (whole words, never
 * past the 16-byte-aligned end of its chunk) and writes only its own slot;
 * threads with index >= count return at once; algorithm codes match
 * `algorithm_code` in pipeline.rs (0 SHA-1, 1 SHA-256, 2 MD5); an unknown
 * code writes a zero digest.
 */

#ifdef __cplusplus
extern "C" {
#endif

typedef unsigned char fp_u8;
typedef unsigned int fp_u32;
typedef unsigned long long fp_u64;

#define FP_ALG_SHA1 0u
#define FP_ALG_SHA256 1u
#define FP_ALG_MD5 2u
#define FP_DIGEST_STRIDE 32u

#ifdef __CUDACC__
#define FP_UNROLL _Pragma("unroll")
#define FP_INLINE __forceinline__
#else
#define FP_UNROLL
#define FP_INLINE inline
#endif

#define FP_ROTL(x, n) (((x) << (n)) | ((x) >> (32u - (n))))
#define FP_ROTR(x, n) (((x) >> (n)) | ((x) << (32u - (n))))

__device__ FP_INLINE fp_u32 fp_bswap32(fp_u32 x)
{
    return (x >> 24) | ((x >> 8) & 0xff00u) | ((x << 8) & 0xff0000u) | (x << 24);
}

/* Loads one full 64-byte block (16 little-endian words); p is 16-byte aligned. */
__device__ FP_INLINE void fp_load_block(const fp_u32 *p, fp_u32 *w)
{
#ifdef __CUDACC__
    const uint4 *q = (const uint4 *)p;
    fp_u32 j;
    FP_UNROLL
    for (j = 0u; j < 4u; j++) {
        uint4 v = q[j];
        w[4u * j] = v.x;
        w[4u * j + 1u] = v.y;
        w[4u * j + 2u] = v.z;
        w[4u * j + 3u] = v.w;
    }
#else
    fp_u32 j;
    for (j = 0u; j < 16u; j++) {
        w[j] = p[j];
    }
#endif
}

/*
 * Word j (little-endian) of the final partial block: the rem (< 64) data
 * bytes at src, then the 0x80 marker, then zeros. Reads src[j] only when
 * that word holds data, so never past the chunk's last data word.
 */
__device__ FP_INLINE fp_u32 fp_tail_word(const fp_u32 *src, fp_u32 rem, fp_u32 j)
{
    fp_u32 base = 4u * j;
    fp_u32 n;
    if (base >= rem) {
        return base == rem ? 0x80u : 0u;
    }
    n = rem - base;
    if (n >= 4u) {
        return src[j];
    }
    return (src[j] & ((1u << (8u * n)) - 1u)) | (0x80u << (8u * n));
}

/* ---------------------------------------------------------------- SHA-1 */

__device__ FP_INLINE void fp_sha1_block(fp_u32 *h, fp_u32 *w)
{
    fp_u32 a = h[0], b = h[1], c = h[2], d = h[3], e = h[4];
    fp_u32 i;
    FP_UNROLL
    for (i = 0u; i < 80u; i++) {
        fp_u32 f, k, t;
        if (i >= 16u) {
            t = w[(i - 3u) & 15u] ^ w[(i - 8u) & 15u] ^ w[(i - 14u) & 15u] ^ w[i & 15u];
            w[i & 15u] = FP_ROTL(t, 1u);
        }
        if (i < 20u) {
            f = (b & c) | (~b & d);
            k = 0x5a827999u;
        } else if (i < 40u) {
            f = b ^ c ^ d;
            k = 0x6ed9eba1u;
        } else if (i < 60u) {
            f = (b & c) | (b & d) | (c & d);
            k = 0x8f1bbcdcu;
        } else {
            f = b ^ c ^ d;
            k = 0xca62c1d6u;
        }
        t = FP_ROTL(a, 5u) + f + e + k + w[i & 15u];
        e = d;
        d = c;
        c = FP_ROTL(b, 30u);
        b = a;
        a = t;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
}

__device__ void fp_sha1(const fp_u32 *src, fp_u64 len, fp_u8 *digest)
{
    fp_u32 h[5] = {0x67452301u, 0xefcdab89u, 0x98badcfeu, 0x10325476u, 0xc3d2e1f0u};
    fp_u32 w[16];
    fp_u64 blocks = len >> 6, b;
    fp_u64 bits = len << 3;
    fp_u32 rem = (fp_u32)(len & 63u), j;
    for (b = 0u; b < blocks; b++) {
        fp_load_block(src + 16u * b, w);
        FP_UNROLL
        for (j = 0u; j < 16u; j++) {
            w[j] = fp_bswap32(w[j]);
        }
        fp_sha1_block(h, w);
    }
    src += 16u * blocks;
    FP_UNROLL
    for (j = 0u; j < 16u; j++) {
        w[j] = fp_bswap32(fp_tail_word(src, rem, j));
    }
    if (rem >= 56u) {
        fp_sha1_block(h, w);
        FP_UNROLL
        for (j = 0u; j < 16u; j++) {
            w[j] = 0u;
        }
    }
    w[14] = (fp_u32)(bits >> 32);
    w[15] = (fp_u32)bits;
    fp_sha1_block(h, w);
    FP_UNROLL
    for (j = 0u; j < 20u; j++) {
        digest[j] = (fp_u8)(h[j >> 2] >> (24u - 8u * (j & 3u)));
    }
}

/* -------------------------------------------------------------- SHA-256 */

__constant__ fp_u32 fp_sha256_k[64] = {
    0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu, 0x59f111f1u, 0x923f82a4u, 0xab1c5ed5u,
    0xd807aa98u, 0x12835b01u, 0x243185beu, 0x550c7dc3u, 0x72be5d74u, 0x80deb1feu, 0x9bdc06a7u, 0xc19bf174u,
    0xe49b69c1u, 0xefbe4786u, 0x0fc19dc6u, 0x240ca1ccu, 0x2de92c6fu, 0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau,
    0x983e5152u, 0xa831c66du, 0xb00327c8u, 0xbf597fc7u, 0xc6e00bf3u, 0xd5a79147u, 0x06ca6351u, 0x14292967u,
    0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu, 0x53380d13u, 0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u,
    0xa2bfe8a1u, 0xa81a664bu, 0xc24b8b70u, 0xc76c51a3u, 0xd192e819u, 0xd6990624u, 0xf40e3585u, 0x106aa070u,
    0x19a4c116u, 0x1e376c08u, 0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au, 0x5b9cca4fu, 0x682e6ff3u,
    0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u, 0x90befffau, 0xa4506cebu, 0xbef9a3f7u, 0xc67178f2u,
};

__device__ FP_INLINE void fp_sha256_block(fp_u32 *h, fp_u32 *w)
{
    fp_u32 a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    fp_u32 i;
    FP_UNROLL
    for (i = 0u; i < 64u; i++) {
        fp_u32 t1, t2;
        if (i >= 16u) {
            fp_u32 w15 = w[(i - 15u) & 15u], w2 = w[(i - 2u) & 15u];
            fp_u32 s0 = FP_ROTR(w15, 7u) ^ FP_ROTR(w15, 18u) ^ (w15 >> 3);
            fp_u32 s1 = FP_ROTR(w2, 17u) ^ FP_ROTR(w2, 19u) ^ (w2 >> 10);
            w[i & 15u] += s0 + w[(i - 7u) & 15u] + s1;
        }
        t1 = k + (FP_ROTR(e, 6u) ^ FP_ROTR(e, 11u) ^ FP_ROTR(e, 25u)) + ((e & f) ^ (~e & g)) +
             fp_sha256_k[i] + w[i & 15u];
        t2 = (FP_ROTR(a, 2u) ^ FP_ROTR(a, 13u) ^ FP_ROTR(a, 22u)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
    h[5] += f;
    h[6] += g;
    h[7] += k;
}

__device__ void fp_sha256(const fp_u32 *src, fp_u64 len, fp_u8 *digest)
{
    fp_u32 h[8] = {0x6a09e667u, 0xbb67ae85u, 0x3c6ef372u, 0xa54ff53au,
                   0x510e527fu, 0x9b05688cu, 0x1f83d9abu, 0x5be0cd19u};
    fp_u32 w[16];
    fp_u64 blocks = len >> 6, b;
    fp_u64 bits = len << 3;
    fp_u32 rem = (fp_u32)(len & 63u), j;
    for (b = 0u; b < blocks; b++) {
        fp_load_block(src + 16u * b, w);
        FP_UNROLL
        for (j = 0u; j < 16u; j++) {
            w[j] = fp_bswap32(w[j]);
        }
        fp_sha256_block(h, w);
    }
    src += 16u * blocks;
    FP_UNROLL
    for (j = 0u; j < 16u; j++) {
        w[j] = fp_bswap32(fp_tail_word(src, rem, j));
    }
    if (rem >= 56u) {
        fp_sha256_block(h, w);
        FP_UNROLL
        for (j = 0u; j < 16u; j++) {
            w[j] = 0u;
        }
    }
    w[14] = (fp_u32)(bits >> 32);
    w[15] = (fp_u32)bits;
    fp_sha256_block(h, w);
    FP_UNROLL
    for (j = 0u; j < 32u; j++) {
        digest[j] = (fp_u8)(h[j >> 2] >> (24u - 8u * (j & 3u)));
    }
}

/* ------------------------------------------------------------------ MD5 */

#define FP_MD5_F(x, y, z) (((x) & (y)) | (~(x) & (z)))
#define FP_MD5_G(x, y, z) (((x) & (z)) | ((y) & ~(z)))
#define FP_MD5_H(x, y, z) ((x) ^ (y) ^ (z))
#define FP_MD5_I(x, y, z) ((y) ^ ((x) | ~(z)))
#define FP_MD5_STEP(f, a, b, c, d, x, t, s) \
    do {                                    \
        (a) += f((b), (c), (d)) + (x) + (t); \
        (a) = FP_ROTL((a), (s));            \
        (a) += (b);                         \
    } while (0)

/* RFC 1321's 64 steps written out, so every rotation is a literal. */
__device__ FP_INLINE void fp_md5_block(fp_u32 *h, const fp_u32 *w)
{
    fp_u32 a = h[0], b = h[1], c = h[2], d = h[3];
    FP_MD5_STEP(FP_MD5_F, a, b, c, d, w[0], 0xd76aa478u, 7);
    FP_MD5_STEP(FP_MD5_F, d, a, b, c, w[1], 0xe8c7b756u, 12);
    FP_MD5_STEP(FP_MD5_F, c, d, a, b, w[2], 0x242070dbu, 17);
    FP_MD5_STEP(FP_MD5_F, b, c, d, a, w[3], 0xc1bdceeeu, 22);
    FP_MD5_STEP(FP_MD5_F, a, b, c, d, w[4], 0xf57c0fafu, 7);
    FP_MD5_STEP(FP_MD5_F, d, a, b, c, w[5], 0x4787c62au, 12);
    FP_MD5_STEP(FP_MD5_F, c, d, a, b, w[6], 0xa8304613u, 17);
    FP_MD5_STEP(FP_MD5_F, b, c, d, a, w[7], 0xfd469501u, 22);
    FP_MD5_STEP(FP_MD5_F, a, b, c, d, w[8], 0x698098d8u, 7);
    FP_MD5_STEP(FP_MD5_F, d, a, b, c, w[9], 0x8b44f7afu, 12);
    FP_MD5_STEP(FP_MD5_F, c, d, a, b, w[10], 0xffff5bb1u, 17);
    FP_MD5_STEP(FP_MD5_F, b, c, d, a, w[11], 0x895cd7beu, 22);
    FP_MD5_STEP(FP_MD5_F, a, b, c, d, w[12], 0x6b901122u, 7);
    FP_MD5_STEP(FP_MD5_F, d, a, b, c, w[13], 0xfd987193u, 12);
    FP_MD5_STEP(FP_MD5_F, c, d, a, b, w[14], 0xa679438eu, 17);
    FP_MD5_STEP(FP_MD5_F, b, c, d, a, w[15], 0x49b40821u, 22);
    FP_MD5_STEP(FP_MD5_G, a, b, c, d, w[1], 0xf61e2562u, 5);
    FP_MD5_STEP(FP_MD5_G, d, a, b, c, w[6], 0xc040b340u, 9);
    FP_MD5_STEP(FP_MD5_G, c, d, a, b, w[11], 0x265e5a51u, 14);
    FP_MD5_STEP(FP_MD5_G, b, c, d, a, w[0], 0xe9b6c7aau, 20);
    FP_MD5_STEP(FP_MD5_G, a, b, c, d, w[5], 0xd62f105du, 5);
    FP_MD5_STEP(FP_MD5_G, d, a, b, c, w[10], 0x02441453u, 9);
    FP_MD5_STEP(FP_MD5_G, c, d, a, b, w[15], 0xd8a1e681u, 14);
    FP_MD5_STEP(FP_MD5_G, b, c, d, a, w[4], 0xe7d3fbc8u, 20);
    FP_MD5_STEP(FP_MD5_G, a, b, c, d, w[9], 0x21e1cde6u, 5);
    FP_MD5_STEP(FP_MD5_G, d, a, b, c, w[14], 0xc33707d6u, 9);
    FP_MD5_STEP(FP_MD5_G, c, d, a, b, w[3], 0xf4d50d87u, 14);
    FP_MD5_STEP(FP_MD5_G, b, c, d, a, w[8], 0x455a14edu, 20);
    FP_MD5_STEP(FP_MD5_G, a, b, c, d, w[13], 0xa9e3e905u, 5);
    FP_MD5_STEP(FP_MD5_G, d, a, b, c, w[2], 0xfcefa3f8u, 9);
    FP_MD5_STEP(FP_MD5_G, c, d, a, b, w[7], 0x676f02d9u, 14);
    FP_MD5_STEP(FP_MD5_G, b, c, d, a, w[12], 0x8d2a4c8au, 20);
    FP_MD5_STEP(FP_MD5_H, a, b, c, d, w[5], 0xfffa3942u, 4);
    FP_MD5_STEP(FP_MD5_H, d, a, b, c, w[8], 0x8771f681u, 11);
    FP_MD5_STEP(FP_MD5_H, c, d, a, b, w[11], 0x6d9d6122u, 16);
    FP_MD5_STEP(FP_MD5_H, b, c, d, a, w[14], 0xfde5380cu, 23);
    FP_MD5_STEP(FP_MD5_H, a, b, c, d, w[1], 0xa4beea44u, 4);
    FP_MD5_STEP(FP_MD5_H, d, a, b, c, w[4], 0x4bdecfa9u, 11);
    FP_MD5_STEP(FP_MD5_H, c, d, a, b, w[7], 0xf6bb4b60u, 16);
    FP_MD5_STEP(FP_MD5_H, b, c, d, a, w[10], 0xbebfbc70u, 23);
    FP_MD5_STEP(FP_MD5_H, a, b, c, d, w[13], 0x289b7ec6u, 4);
    FP_MD5_STEP(FP_MD5_H, d, a, b, c, w[0], 0xeaa127fau, 11);
    FP_MD5_STEP(FP_MD5_H, c, d, a, b, w[3], 0xd4ef3085u, 16);
    FP_MD5_STEP(FP_MD5_H, b, c, d, a, w[6], 0x04881d05u, 23);
    FP_MD5_STEP(FP_MD5_H, a, b, c, d, w[9], 0xd9d4d039u, 4);
    FP_MD5_STEP(FP_MD5_H, d, a, b, c, w[12], 0xe6db99e5u, 11);
    FP_MD5_STEP(FP_MD5_H, c, d, a, b, w[15], 0x1fa27cf8u, 16);
    FP_MD5_STEP(FP_MD5_H, b, c, d, a, w[2], 0xc4ac5665u, 23);
    FP_MD5_STEP(FP_MD5_I, a, b, c, d, w[0], 0xf4292244u, 6);
    FP_MD5_STEP(FP_MD5_I, d, a, b, c, w[7], 0x432aff97u, 10);
    FP_MD5_STEP(FP_MD5_I, c, d, a, b, w[14], 0xab9423a7u, 15);
    FP_MD5_STEP(FP_MD5_I, b, c, d, a, w[5], 0xfc93a039u, 21);
    FP_MD5_STEP(FP_MD5_I, a, b, c, d, w[12], 0x655b59c3u, 6);
    FP_MD5_STEP(FP_MD5_I, d, a, b, c, w[3], 0x8f0ccc92u, 10);
    FP_MD5_STEP(FP_MD5_I, c, d, a, b, w[10], 0xffeff47du, 15);
    FP_MD5_STEP(FP_MD5_I, b, c, d, a, w[1], 0x85845dd1u, 21);
    FP_MD5_STEP(FP_MD5_I, a, b, c, d, w[8], 0x6fa87e4fu, 6);
    FP_MD5_STEP(FP_MD5_I, d, a, b, c, w[15], 0xfe2ce6e0u, 10);
    FP_MD5_STEP(FP_MD5_I, c, d, a, b, w[6], 0xa3014314u, 15);
    FP_MD5_STEP(FP_MD5_I, b, c, d, a, w[13], 0x4e0811a1u, 21);
    FP_MD5_STEP(FP_MD5_I, a, b, c, d, w[4], 0xf7537e82u, 6);
    FP_MD5_STEP(FP_MD5_I, d, a, b, c, w[11], 0xbd3af235u, 10);
    FP_MD5_STEP(FP_MD5_I, c, d, a, b, w[2], 0x2ad7d2bbu, 15);
    FP_MD5_STEP(FP_MD5_I, b, c, d, a, w[9], 0xeb86d391u, 21);
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
}

__device__ void fp_md5(const fp_u32 *src, fp_u64 len, fp_u8 *digest)
{
    fp_u32 h[4] = {0x67452301u, 0xefcdab89u, 0x98badcfeu, 0x10325476u};
    fp_u32 w[16];
    fp_u64 blocks = len >> 6, b;
    fp_u64 bits = len << 3;
    fp_u32 rem = (fp_u32)(len & 63u), j;
    for (b = 0u; b < blocks; b++) {
        fp_load_block(src + 16u * b, w);
        fp_md5_block(h, w);
    }
    src += 16u * blocks;
    FP_UNROLL
    for (j = 0u; j < 16u; j++) {
        w[j] = fp_tail_word(src, rem, j);
    }
    if (rem >= 56u) {
        fp_md5_block(h, w);
        FP_UNROLL
        for (j = 0u; j < 16u; j++) {
            w[j] = 0u;
        }
    }
    w[14] = (fp_u32)bits;
    w[15] = (fp_u32)(bits >> 32);
    fp_md5_block(h, w);
    FP_UNROLL
    for (j = 0u; j < 16u; j++) {
        digest[j] = (fp_u8)(h[j >> 2] >> (8u * (j & 3u)));
    }
}

/* --------------------------------------------------------------- kernel */

__global__ void fp_hash_kernel(fp_u32 algorithm, const fp_u64 *meta, const fp_u32 *data,
                               fp_u32 count, fp_u8 *out)
{
    fp_u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    fp_u64 offset, length;
    const fp_u32 *src;
    fp_u8 *digest;
    fp_u32 j;
    if (i >= count) {
        return;
    }
    offset = meta[2u * i];
    length = meta[2u * i + 1u];
    src = data + (offset >> 2);
    digest = out + (fp_u64)i * FP_DIGEST_STRIDE;
    if (algorithm == FP_ALG_SHA1) {
        fp_sha1(src, length, digest);
    } else if (algorithm == FP_ALG_SHA256) {
        fp_sha256(src, length, digest);
    } else if (algorithm == FP_ALG_MD5) {
        fp_md5(src, length, digest);
    } else {
        for (j = 0u; j < FP_DIGEST_STRIDE; j++) {
            digest[j] = 0u;
        }
    }
}

#ifdef __cplusplus
}
#endif
