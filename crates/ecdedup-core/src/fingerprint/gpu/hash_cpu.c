/*
 * hash_cpu.c: the GPU fingerprint kernel (hash.cu) compiled as plain C for
 * the CPU, so that its hashing logic is tested without a GPU (build.rs
 * compiles this file with the cc crate; kernel_cpu.rs calls it).
 *
 * The macros below stand in for CUDA's qualifiers and built-in thread
 * indices; ecdedup_fp_kernel_cpu then plays the grid: it runs the kernel
 * body once per (block, thread) index, one after another, on the calling
 * thread, exactly as the launch in gpu/device.rs would run it on a device
 * with the same threads per block.
 *
 * Invariants: the index variables are thread-local, so Rust tests running
 * in parallel threads each play their own grid; the kernel sees the same
 * arguments (meta, data and out pointing into one caller-owned buffer each)
 * as on the GPU; nothing here allocates or keeps state between calls.
 */

typedef struct {
    unsigned int x, y, z;
} fp_dim3;

static _Thread_local fp_dim3 blockIdx;
static _Thread_local fp_dim3 threadIdx;
static _Thread_local fp_dim3 blockDim;
static _Thread_local fp_dim3 gridDim;

#define __global__ static
#define __device__ static
#define __constant__ static const

#include "hash.cu"

/*
 * Runs fp_hash_kernel over count chunks in a grid of blocks of
 * threads_per_block threads (at least 1), like the CUDA launch does.
 */
void ecdedup_fp_kernel_cpu(fp_u32 algorithm, const fp_u64 *meta, const fp_u32 *data,
                           fp_u32 count, fp_u8 *out, fp_u32 threads_per_block)
{
    fp_u32 block, thread;
    if (threads_per_block == 0u) {
        threads_per_block = 1u;
    }
    gridDim.x = (count + threads_per_block - 1u) / threads_per_block;
    gridDim.y = gridDim.z = 1u;
    blockDim.x = threads_per_block;
    blockDim.y = blockDim.z = 1u;
    for (block = 0u; block < gridDim.x; block++) {
        for (thread = 0u; thread < threads_per_block; thread++) {
            blockIdx.x = block;
            threadIdx.x = thread;
            fp_hash_kernel(algorithm, meta, data, count, out);
        }
    }
}
