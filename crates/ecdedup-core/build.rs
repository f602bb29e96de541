//! Build script. Links Intel ISA-L (Debian: libisal-dev) for GF(2^8) erasure
//! coding, and compiles the GPU fingerprint kernel's source as plain C
//! (`src/fingerprint/gpu/hash_cpu.c`, which includes `hash.cu` under macros
//! standing in for CUDA's qualifiers and thread indices) into a static
//! library, so the kernel's hashing logic runs and is tested on the CPU.
//!
//! Invariants: no CUDA toolkit is used here, ever: on a GPU machine the same
//! `hash.cu` is compiled at run time by NVRTC. The C build is optimised
//! (-O3) whatever the profile, so tests and the benchmark's sanity figure
//! run at a realistic speed.
fn main() {
    println!("cargo:rustc-link-lib=isal");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/fingerprint/gpu/hash.cu");
    println!("cargo:rerun-if-changed=src/fingerprint/gpu/hash_cpu.c");
    cc::Build::new()
        .file("src/fingerprint/gpu/hash_cpu.c")
        .opt_level(3)
        .flag_if_supported("-std=c11")
        .flag_if_supported("-fno-strict-aliasing")
        .compile("ecdedup_fp_kernel");
}
