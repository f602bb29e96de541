//! The GPU fingerprint backend ([`GpuBackend`]) and the choice between it
//! and the CPU backend ([`BackendChoice`], [`choose_backend`]).
//!
//! After Hamandawana et al., "Accelerating the Data Deduplication
//! Performance with GPU in Hybrid Storage Systems": fingerprints (SHA-1 in
//! the paper; SHA-256 and MD5 too here) are computed on the GPU, one thread
//! per chunk, with GPU-memory-aware allocation and copies overlapped with
//! kernels. Through `cudarc` with libcuda and libnvrtc loaded at run time,
//! the crate builds and runs on machines with no CUDA toolkit and no GPU;
//! the kernel (`gpu/hash.cu`) is compiled by NVRTC when the backend starts.
//!
//! Design (details in docs/gpu.md):
//! - Pool: at start the backend reads free device memory (cuMemGetInfo) and
//!   sizes [`STREAMS`] lanes from [`DEVICE_MEMORY_FRACTION`] of it, capped at
//!   [`MAX_POOL_BYTES`] ([`size_pool`]). A lane is a CUDA stream with a
//!   pinned host input buffer, a device input buffer, and device and pinned
//!   host digest buffers, all allocated once. A caller that finds every lane
//!   busy waits on a condvar (backpressure); nothing is allocated per batch.
//! - Overlap: a batch is cut into slices (at least one per lane when big
//!   enough) that go round the lanes; each slice is packed into its lane's
//!   pinned buffer, then copy-in, kernel and copy-out are queued on the
//!   lane's stream, and the next slice is packed while they run. So the
//!   copy engine, the SMs and the CPU work on different slices at once.
//! - Auto: batches under the crossover measured at start (or
//!   [`GPU_MIN_BATCH_BYTES`] with the measurement off: too small to pay for
//!   the copies and the launch), BLAKE3 batches (no kernel: they fall back
//!   to the CPU, not an error) and every batch after a device failure go to
//!   the backend's own [`CpuBackend`]. [`choose_backend`] puts the GPU
//!   backend behind the coalescing queue (`fingerprint/coalesce.rs`), which
//!   gathers concurrent requests into batches up to the crossover.
//! - Tests without a GPU: `build.rs` compiles `hash.cu` as C (through
//!   `hash_cpu.c`, whose macros stand in for CUDA's qualifiers and thread
//!   indices), and [`KernelOnCpuBackend`] runs that build through the same
//!   packing and pipeline, checked against RustCrypto in `gpu/tests.rs`.
//! - Self-test: before [`GpuBackend::new`] returns, every lane hashes known
//!   chunks with each kernel algorithm and must match the CPU, so a kernel
//!   that is wrong on this device is refused at start, never used.
//!
//! Invariants: [`GpuBackend::new`] returns an error value, never panics,
//! when there is no driver, no device, no NVRTC, too little free memory or
//! a failed self-test; whichever path hashes a batch, the fingerprints
//! equal [`Algorithm::fingerprint`] of each chunk, in chunk order.
//!
//! Measured on one H200 (docs/benchmarks.md): 54-65% of the pinned copy
//! bandwidth end to end on 256 MiB batches; the CPU wins below tens of MiB.
//! `benches/gpu.rs` measures it where a GPU is present.

mod device;
mod kernel_cpu;
mod offload;
mod pipeline;
#[cfg(test)]
mod tests;

pub use device::DeviceInfo;
pub use kernel_cpu::KernelOnCpuBackend;
pub use offload::OffloadStats;

use self::device::GpuLane;
use self::offload::Offload;
use self::pipeline::{DIGEST_STRIDE, MAX_LANES};
use super::{Algorithm, CpuBackend, Fingerprint, FingerprintBackend, FingerprintError};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// The kernel's source, compiled by NVRTC at run time on a GPU machine and
/// by build.rs as C everywhere.
pub const KERNEL_SOURCE: &str = include_str!("gpu/hash.cu");
/// The kernel's entry point in [`KERNEL_SOURCE`].
pub const KERNEL_NAME: &str = "fp_hash_kernel";
/// Threads per block of the launch (and of the C build's emulated grid):
/// 128 keeps several blocks resident per SM with the ~60 registers a SHA-256
/// thread needs.
pub const THREADS_PER_BLOCK: u32 = 128;

/// Batches with fewer bytes than this are hashed by the CPU backend: under
/// about 1 MiB the fixed cost of a slice (a copy each way and a launch,
/// ~20-40 µs) is more than all cores need to hash it. An estimate, not a
/// measurement: `benches/gpu.rs` gives the figures to tune it on a GPU.
pub const GPU_MIN_BATCH_BYTES: usize = 1 << 20;
/// Lanes, one CUDA stream each: with 4, copy-in, kernel and copy-out of
/// three slices and the packing of a fourth can all be under way at once.
pub const STREAMS: usize = 4;
/// Fraction of the device memory free at start that the pool may take.
pub const DEVICE_MEMORY_FRACTION: f64 = 0.25;
/// Most bytes the pool takes on the device, whatever is free; the same again
/// is pinned on the host, which the kernel cannot swap out, so it stays
/// modest.
pub const MAX_POOL_BYTES: usize = 1 << 30;
/// A lane's input buffer is at least this big (room for several of the
/// largest, 1 MiB, chunks), or the backend does not start.
pub const MIN_LANE_BYTES: usize = 4 << 20;
/// A lane's input buffer is at most this big: enough chunks per slice to
/// keep an SM array busy (16,384 threads at 4 KiB) with slices still short
/// enough to overlap.
pub const MAX_LANE_BYTES: usize = 64 << 20;
/// A lane holds at most `lane_bytes / LANE_BYTES_PER_CHUNK` chunks: chunks
/// of this size or more fill a lane by bytes, smaller ones by count.
pub const LANE_BYTES_PER_CHUNK: usize = 512;

/// How the pool is cut: `lanes` lanes with `lane_bytes` of input and room
/// for `lane_chunks` digests each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PoolLayout {
    pub lanes: usize,
    pub lane_bytes: usize,
    pub lane_chunks: usize,
}

impl PoolLayout {
    /// `lanes` lanes of `lane_bytes` input, with the matching chunk count.
    pub fn new(lanes: usize, lane_bytes: usize) -> Self {
        PoolLayout {
            lanes,
            lane_bytes,
            lane_chunks: (lane_bytes / LANE_BYTES_PER_CHUNK).max(1),
        }
    }

    /// Device memory the pool takes (input and digest buffers); the same
    /// again is pinned on the host.
    pub fn device_bytes(&self) -> usize {
        self.lanes * (self.lane_bytes + self.lane_chunks * DIGEST_STRIDE)
    }

    fn check(&self) -> Result<(), FingerprintError> {
        if self.lanes == 0 || self.lanes > MAX_LANES {
            return Err(FingerprintError::Unavailable(format!(
                "pool of {} lanes: expected 1 to {MAX_LANES}",
                self.lanes
            )));
        }
        if self.lane_bytes < 64 || self.lane_chunks == 0 || self.lane_chunks > u32::MAX as usize {
            return Err(FingerprintError::Unavailable(format!(
                "lane of {} bytes and {} chunks is unusable",
                self.lane_bytes, self.lane_chunks
            )));
        }
        Ok(())
    }
}

/// The pool for a device with `free_bytes` free: [`STREAMS`] lanes sharing
/// `fraction` of it (at most [`MAX_POOL_BYTES`]), each lane's input between
/// [`MIN_LANE_BYTES`] and [`MAX_LANE_BYTES`] in whole MiB, its digest buffer
/// included in the share. Fails when that share is below `STREAMS` lanes of
/// `MIN_LANE_BYTES`.
pub fn size_pool(free_bytes: usize, fraction: f64) -> Result<PoolLayout, FingerprintError> {
    if !(fraction > 0.0 && fraction <= 1.0) {
        return Err(FingerprintError::Unavailable(format!(
            "device memory fraction {fraction}: expected more than 0, at most 1"
        )));
    }
    let budget = ((free_bytes as f64 * fraction) as usize).min(MAX_POOL_BYTES);
    // A lane's digests take lane_bytes / LANE_BYTES_PER_CHUNK * 32 bytes,
    // 1/16 of its input: so its input is 16/17 of its share.
    let share = budget / STREAMS;
    let lane_bytes = (share / 17 * 16).min(MAX_LANE_BYTES) & !((1 << 20) - 1);
    if lane_bytes < MIN_LANE_BYTES {
        return Err(FingerprintError::Unavailable(format!(
            "not enough free device memory: {free_bytes} bytes free, {fraction} of it \
             ({budget} bytes) is less than {STREAMS} lanes of {MIN_LANE_BYTES} bytes"
        )));
    }
    Ok(PoolLayout::new(STREAMS, lane_bytes))
}

/// Settings of a [`GpuBackend`]; `Default` gives the named constants.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuConfig {
    /// CUDA device ordinal.
    pub ordinal: usize,
    /// Fraction of free device memory the pool may take.
    pub memory_fraction: f64,
    /// Batches under this many bytes go to the CPU backend.
    pub min_batch_bytes: usize,
    /// Threads of the CPU backend used for small and BLAKE3 batches;
    /// `None`: one per core.
    pub cpu_threads: Option<usize>,
    /// Replace `min_batch_bytes` at start by the crossover measured on this
    /// machine (SHA-256, GPU end to end against all CPU threads).
    pub measure_crossover: bool,
}

/// Environment variable that fixes the GPU backend's batch threshold
/// (bytes; 0 sends every batch to the GPU) and turns the start-up
/// measurement off, for benchmarks that want every batch on the device.
pub const MIN_BATCH_ENV: &str = "ECDEDUP_GPU_MIN_BATCH_BYTES";

impl GpuConfig {
    /// The default configuration with [`MIN_BATCH_ENV`] applied when it is
    /// set; an error names a value that is not a byte count.
    pub fn from_env() -> Result<GpuConfig, FingerprintError> {
        GpuConfig::default().with_min_batch_setting(std::env::var_os(MIN_BATCH_ENV).as_deref())
    }

    /// `self` with the threshold `value` (a [`MIN_BATCH_ENV`] value) fixed
    /// and the start-up measurement off; unchanged for `None`.
    pub fn with_min_batch_setting(
        mut self,
        value: Option<&std::ffi::OsStr>,
    ) -> Result<GpuConfig, FingerprintError> {
        if let Some(value) = value {
            let bytes = value
                .to_str()
                .and_then(|v| v.trim().parse::<usize>().ok())
                .ok_or_else(|| {
                    FingerprintError::Unavailable(format!(
                        "{MIN_BATCH_ENV}={value:?} is not a byte count"
                    ))
                })?;
            self.min_batch_bytes = bytes;
            self.measure_crossover = false;
        }
        Ok(self)
    }
}

impl Default for GpuConfig {
    fn default() -> Self {
        GpuConfig {
            ordinal: 0,
            memory_fraction: DEVICE_MEMORY_FRACTION,
            min_batch_bytes: GPU_MIN_BATCH_BYTES,
            cpu_threads: None,
            measure_crossover: true,
        }
    }
}

/// Hashes SHA-1, SHA-256 and MD5 batches on a CUDA device (module
/// documentation); small and BLAKE3 batches on its own [`CpuBackend`].
pub struct GpuBackend {
    device: DeviceInfo,
    offload: Offload<GpuLane>,
}

impl GpuBackend {
    /// The backend on device 0 with the default settings, or why it cannot
    /// run here ("no CUDA device: libcuda not found", ...). Never panics.
    pub fn new() -> Result<Self, FingerprintError> {
        Self::with_config(GpuConfig::default())
    }

    /// The backend with `config`, or why it cannot run here.
    pub fn with_config(config: GpuConfig) -> Result<Self, FingerprintError> {
        let opened = device::open(&config)?;
        let cpu = CpuBackend::new(config.cpu_threads)?;
        let backend = GpuBackend {
            device: opened.device,
            offload: Offload::new(opened.lanes, cpu, config.min_batch_bytes),
        };
        if config.measure_crossover {
            backend.offload.measure_crossover(Algorithm::Sha256);
        }
        Ok(backend)
    }

    /// The device, its memory at start and the pool sized from it.
    pub fn device(&self) -> &DeviceInfo {
        &self.device
    }

    /// Batches under this many bytes go to the CPU backend.
    /// Packs large slices into the pinned buffers on the CPU backend's
    /// threads (`true`, the default) or on the calling thread alone
    /// (`benches/gpu.rs` compares the two).
    pub fn set_parallel_pack(&self, on: bool) {
        self.offload.set_parallel_pack(on);
    }

    /// Cuts large batches into `n` slices per lane (default 1; at least 1).
    pub fn set_slices_per_lane(&self, n: usize) {
        self.offload.set_slices_per_lane(n);
    }

    pub fn min_batch_bytes(&self) -> usize {
        self.offload.min_batch_bytes()
    }

    /// Threads of the CPU backend beside the GPU.
    pub fn cpu_threads(&self) -> usize {
        self.offload.cpu().threads()
    }

    /// What this backend has hashed, on the GPU and on the CPU.
    pub fn stats(&self) -> OffloadStats {
        self.offload.stats()
    }

    /// The first device failure, after which every batch went to the CPU.
    pub fn failure(&self) -> Option<String> {
        self.offload.failure()
    }

    /// One line: device, memory, pool and the CPU rule.
    pub fn describe(&self) -> String {
        let d = &self.device;
        format!(
            "{} (device {}, compute {}.{}, {} MiB free of {} MiB at start; pool {} streams x \
             {} MiB pinned+device); batches under {} KiB (the crossover measured at start, \
             or as configured) and BLAKE3 go to the CPU backend ({} threads)",
            d.name,
            d.ordinal,
            d.compute_capability.0,
            d.compute_capability.1,
            d.free_bytes >> 20,
            d.total_bytes >> 20,
            d.layout.lanes,
            d.layout.lane_bytes >> 20,
            self.min_batch_bytes() >> 10,
            self.cpu_threads(),
        )
    }

    /// Pinned host-to-device copy bandwidth in bytes per second: `reps`
    /// copies of `bytes` (at most one lane's input) from a lane's pinned
    /// buffer to its device buffer, after one warm-up copy. Waits for a
    /// free lane like a batch does.
    pub fn h2d_bandwidth(&self, bytes: usize, reps: usize) -> Result<f64, FingerprintError> {
        let pool = self.offload.pool();
        let mut lane = pool.acquire();
        let bytes = bytes.min(pool.capacity());
        let timed = lane
            .time_h2d(bytes, 1)
            .and_then(|_| lane.time_h2d(bytes, reps.max(1)));
        pool.release(lane);
        let seconds = timed.map_err(FingerprintError::Backend)?;
        Ok((bytes * reps.max(1)) as f64 / seconds)
    }
}

impl fmt::Debug for GpuBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GpuBackend")
            .field("device", &self.device)
            .field("min_batch_bytes", &self.min_batch_bytes())
            .finish_non_exhaustive()
    }
}

impl FingerprintBackend for GpuBackend {
    fn name(&self) -> &str {
        "gpu"
    }

    fn fingerprint_batch(
        &self,
        algorithm: Algorithm,
        chunks: &[&[u8]],
        out: &mut Vec<Fingerprint>,
    ) -> Result<(), FingerprintError> {
        self.offload.fingerprint_batch(algorithm, chunks, out)
    }
}

/// Which fingerprint backend to run, as configured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendChoice {
    /// The CPU backend on all cores.
    #[default]
    Cpu,
    /// The GPU backend; an error where it cannot run.
    Gpu,
    /// The GPU backend when a usable GPU is present (it still sends batches
    /// under [`GPU_MIN_BATCH_BYTES`] to its CPU backend), the CPU backend
    /// otherwise.
    Auto,
}

impl BackendChoice {
    pub const ALL: [BackendChoice; 3] =
        [BackendChoice::Cpu, BackendChoice::Gpu, BackendChoice::Auto];

    /// The name used by `Display`, `FromStr` and serde.
    pub fn name(self) -> &'static str {
        match self {
            BackendChoice::Cpu => "cpu",
            BackendChoice::Gpu => "gpu",
            BackendChoice::Auto => "auto",
        }
    }
}

impl fmt::Display for BackendChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for BackendChoice {
    type Err = FingerprintError;

    /// Parses the names `Display` writes, in any ASCII case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        BackendChoice::ALL
            .into_iter()
            .find(|c| c.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                FingerprintError::Unavailable(format!(
                    "unknown fingerprint backend {s:?}: expected cpu, gpu or auto"
                ))
            })
    }
}

/// The backend for `choice`, with a line saying what was chosen and why,
/// starting with the configured choice: "cpu: chosen by configuration (2
/// threads)", "gpu: chosen by configuration: NVIDIA H100 ...", "auto: no
/// usable GPU (no CUDA device: ...), using cpu (2 threads)" or "auto: found a
/// usable GPU, using gpu: ...". Never panics.
/// `cpu_threads` sizes the CPU backend (the chosen one, or the GPU
/// backend's own for small batches); `None`: one thread per core.
/// `Gpu` fails where no GPU backend can run; `Auto` then takes the CPU.
pub fn choose_backend(
    choice: BackendChoice,
    cpu_threads: Option<usize>,
) -> Result<(Arc<dyn FingerprintBackend>, String), FingerprintError> {
    let config = || -> Result<GpuConfig, FingerprintError> {
        Ok(GpuConfig {
            cpu_threads,
            ..GpuConfig::from_env()?
        })
    };
    match choice {
        BackendChoice::Cpu => {
            let cpu = CpuBackend::new(cpu_threads)?;
            let why = format!("cpu: chosen by configuration ({} threads)", cpu.threads());
            Ok((Arc::new(cpu), why))
        }
        BackendChoice::Gpu => match GpuBackend::with_config(config()?) {
            Ok(gpu) => {
                let why = format!("gpu: chosen by configuration: {}", gpu.describe());
                Ok((coalesced(gpu), why))
            }
            Err(FingerprintError::Unavailable(why)) => Err(FingerprintError::Unavailable(format!(
                "gpu backend chosen by configuration cannot run: {why}"
            ))),
            Err(e) => Err(e),
        },
        BackendChoice::Auto => match GpuBackend::with_config(config()?) {
            Ok(gpu) => {
                let why = format!("auto: found a usable GPU, using gpu: {}", gpu.describe());
                Ok((coalesced(gpu), why))
            }
            Err(gpu_error) => {
                let cpu = CpuBackend::new(cpu_threads)?;
                let reason = match gpu_error {
                    FingerprintError::Unavailable(why) => why,
                    other => other.to_string(),
                };
                let why = format!(
                    "auto: no usable GPU ({reason}), using cpu ({} threads)",
                    cpu.threads()
                );
                Ok((Arc::new(cpu), why))
            }
        },
    }
}

/// The GPU backend behind the coalescing queue (`fingerprint/coalesce.rs`),
/// which gathers concurrent requests up to the measured crossover.
/// Without the queue when the queue cannot gather a batch the GPU would
/// take ([`queue_can_reach`]): then it would only make concurrent callers
/// wait for one another's CPU batches (measured on an H200 with 16 cores,
/// crossover "never": 4 KiB writes at QD32 spent 66x longer fingerprinting).
fn coalesced(gpu: GpuBackend) -> Arc<dyn FingerprintBackend> {
    let config = crate::fingerprint::coalesce::CoalesceConfig {
        batch_bytes_min: gpu.min_batch_bytes().min(64 << 20),
        ..Default::default()
    };
    if !queue_can_reach(gpu.min_batch_bytes(), &config) {
        return Arc::new(gpu);
    }
    Arc::new(crate::fingerprint::coalesce::CoalescingBackend::new(
        Arc::new(gpu),
        config,
    ))
}

/// Whether the coalescing queue can gather a batch of `crossover` bytes
/// (the size from which the GPU backend hashes on the device): not when
/// the GPU never wins (`usize::MAX`) or wins only above the queue's bounds.
pub(crate) fn queue_can_reach(
    crossover: usize,
    config: &crate::fingerprint::coalesce::CoalesceConfig,
) -> bool {
    crossover <= config.batch_bytes_max.min(config.queue_bytes_max)
}
