// Links Intel ISA-L (Debian: libisal-dev) for GF(2^8) erasure coding.
fn main() {
    println!("cargo:rustc-link-lib=isal");
    println!("cargo:rerun-if-changed=build.rs");
}
