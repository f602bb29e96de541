//! The CUDA side of the GPU backend, through `cudarc`'s driver API with
//! libcuda and libnvrtc loaded at run time: finding a device, compiling
//! `hash.cu` with NVRTC, sizing the pool from free device memory, and the
//! lanes (a CUDA stream with its pinned host and device buffers each) that
//! run copy-in, kernel and copy-out for one slice at a time.
//!
//! Invariants:
//! - No driver or NVRTC function is called before `is_culib_present` has
//!   found the library (cudarc panics on the first call otherwise); every
//!   call while opening runs under `catch_unwind` as well, so a missing
//!   symbol in an old driver is an error value too, never a panic.
//! - All device and pinned memory is allocated in `open`, never in the hot
//!   path; a lane's buffers are used on its own stream only. Event tracking
//!   is off for the context: the pipeline orders work itself (a lane is
//!   reused only after `wait` synchronized its stream), and the hot path
//!   calls the driver's raw async copies and `cuLaunchKernel` directly.
//! - A lane's stream is synchronized before its buffers are freed.
//! - Before `open` returns, every lane has hashed known chunks with every
//!   kernel algorithm and matched the CPU (`pipeline::self_test`): a kernel
//!   that is wrong on this device is refused, never used.
//!
//! Nothing in this file has run on a GPU in this project so far: it is
//! built and type-checked everywhere, and exercised only up to the
//! "no CUDA device" error on machines without one.

use super::pipeline::{self_test, Lane, DIGEST_STRIDE};
use super::{size_pool, GpuConfig, PoolLayout, KERNEL_NAME, KERNEL_SOURCE, THREADS_PER_BLOCK};
use crate::fingerprint::FingerprintError;
use cudarc::driver::{
    result, sys, CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, PinnedHostSlice,
};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

/// What `open` found and made.
pub(crate) struct Opened {
    pub(crate) device: DeviceInfo,
    pub(crate) lanes: Vec<GpuLane>,
}

/// The device the backend runs on, as found at start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// CUDA ordinal.
    pub ordinal: usize,
    /// Device name, e.g. "NVIDIA H100 80GB HBM3".
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// Device memory free and total when the backend started (cuMemGetInfo).
    pub free_bytes: usize,
    pub total_bytes: usize,
    /// The pool sized from `free_bytes`.
    pub layout: PoolLayout,
}

fn unavailable(what: impl std::fmt::Display) -> FingerprintError {
    FingerprintError::Unavailable(what.to_string())
}

/// Whether libcuda can be loaded: no CUDA device can exist otherwise.
pub(crate) fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library by its usual names.
    unsafe { sys::is_culib_present() }
}

fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the library by its usual names.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Opens device `cfg.ordinal`, compiles the kernel and allocates the pool.
pub(crate) fn open(cfg: &GpuConfig) -> Result<Opened, FingerprintError> {
    if !driver_present() {
        return Err(unavailable(
            "no CUDA device: libcuda not found (no NVIDIA driver on this machine)",
        ));
    }
    match catch_unwind(AssertUnwindSafe(|| open_inner(cfg))) {
        Ok(result) => result,
        Err(panic) => {
            let msg = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("unknown panic");
            Err(unavailable(format!(
                "CUDA driver or NVRTC call panicked (driver too old for cuda-12080 bindings?): {msg}"
            )))
        }
    }
}

/// Number of CUDA devices, or why there are none. Call only after
/// `driver_present`.
fn device_count() -> Result<usize, FingerprintError> {
    if let Err(e) = result::init() {
        return Err(unavailable(format!("no CUDA device: cuInit failed: {e}")));
    }
    let count = result::device::get_count()
        .map_err(|e| unavailable(format!("no CUDA device: cuDeviceGetCount: {e}")))?;
    if count <= 0 {
        return Err(unavailable("no CUDA device: the driver reports 0 devices"));
    }
    Ok(count as usize)
}

fn open_inner(cfg: &GpuConfig) -> Result<Opened, FingerprintError> {
    let count = device_count()?;
    if cfg.ordinal >= count {
        return Err(unavailable(format!(
            "no CUDA device {}: the driver reports {count}",
            cfg.ordinal
        )));
    }
    if !nvrtc_present() {
        return Err(unavailable(
            "libnvrtc not found: the GPU backend compiles its kernel at run time; install \
             the CUDA NVRTC runtime (e.g. Debian's libnvrtc12 or pip's nvidia-cuda-nvrtc-cu12) \
             and put it on the loader path. These bindings look for libnvrtc.so and \
             libnvrtc.so.12 (not .so.13): with only CUDA 13's NVRTC, put a libnvrtc.so \
             symlink to it in a folder on LD_LIBRARY_PATH (see docs/gpu.md)",
        ));
    }
    let driver = |what: &str, e: result::DriverError| unavailable(format!("{what}: {e}"));
    let ctx = CudaContext::new(cfg.ordinal).map_err(|e| driver("cuCtx (primary)", e))?;
    // SAFETY: every buffer is made after this and used on one stream only;
    // the pipeline synchronizes a lane's stream before touching its buffers
    // again (see the module documentation).
    unsafe { ctx.disable_event_tracking() };
    let name = ctx.name().map_err(|e| driver("cuDeviceGetName", e))?;
    let compute_capability = ctx
        .compute_capability()
        .map_err(|e| driver("compute capability", e))?;
    let (free_bytes, total_bytes) = ctx.mem_get_info().map_err(|e| driver("cuMemGetInfo", e))?;
    let layout = size_pool(free_bytes, cfg.memory_fraction)?;
    let function = compile(&ctx, compute_capability)?;
    let mut lanes = Vec::with_capacity(layout.lanes);
    for _ in 0..layout.lanes {
        lanes.push(GpuLane::new(&ctx, &function, &layout).map_err(|e| driver("lane", e))?);
    }
    ctx.synchronize()
        .map_err(|e| driver("cuCtxSynchronize", e))?;
    // Every driver call of the hot path runs here first, under the caller's
    // catch_unwind, and the kernel's digests are checked on this device.
    self_test(&mut lanes).map_err(|e| unavailable(format!("GPU kernel {e}")))?;
    Ok(Opened {
        device: DeviceInfo {
            ordinal: cfg.ordinal,
            name,
            compute_capability,
            free_bytes,
            total_bytes,
            layout,
        },
        lanes,
    })
}

/// `hash.cu` through NVRTC to PTX for this device's architecture (or, if
/// this NVRTC does not know it, its default one), loaded into `ctx`.
fn compile(
    ctx: &Arc<CudaContext>,
    (major, minor): (i32, i32),
) -> Result<CudaFunction, FingerprintError> {
    let opts = |arch: Option<String>| CompileOptions {
        options: arch.into_iter().collect(),
        name: Some("hash.cu".to_string()),
        ..Default::default()
    };
    let ptx = compile_ptx_with_opts(
        KERNEL_SOURCE,
        opts(Some(format!("--gpu-architecture=compute_{major}{minor}"))),
    )
    .or_else(|_| compile_ptx_with_opts(KERNEL_SOURCE, opts(None)))
    .map_err(|e| unavailable(format!("NVRTC could not compile hash.cu: {e}")))?;
    let module = ctx.load_module(ptx).map_err(|e| {
        unavailable(format!(
            "loading the kernel's PTX failed (NVRTC newer than the driver?): {e}"
        ))
    })?;
    module
        .load_function(KERNEL_NAME)
        .map_err(|e| unavailable(format!("kernel {KERNEL_NAME} not found: {e}")))
}

/// One CUDA stream with its pinned host and device buffers.
pub(crate) struct GpuLane {
    stream: Arc<CudaStream>,
    function: CudaFunction,
    /// Write-combined pinned memory: the CPU only writes it (packing), the
    /// copy engine reads it.
    host_in: PinnedHostSlice<u8>,
    /// Ordinary (cached) pinned memory: the CPU reads the digests back.
    host_out: PinnedHostSlice<u8>,
    dev_in: CudaSlice<u8>,
    dev_out: CudaSlice<u8>,
    max_chunks: usize,
    count: usize,
}

impl GpuLane {
    fn new(
        ctx: &Arc<CudaContext>,
        function: &CudaFunction,
        layout: &PoolLayout,
    ) -> Result<Self, result::DriverError> {
        let stream = ctx.new_stream()?;
        let out_bytes = layout.lane_chunks * DIGEST_STRIDE;
        // SAFETY: the buffers start uninitialised; packing writes every
        // byte the kernel reads as data before each launch, and only the
        // digests the kernel wrote are read back.
        let (host_in, host_out, dev_in, dev_out) = unsafe {
            (
                ctx.alloc_pinned_with_flags::<u8>(
                    layout.lane_bytes,
                    sys::CU_MEMHOSTALLOC_WRITECOMBINED,
                )?,
                ctx.alloc_pinned_with_flags::<u8>(out_bytes, 0)?,
                stream.alloc::<u8>(layout.lane_bytes)?,
                stream.alloc::<u8>(out_bytes)?,
            )
        };
        Ok(GpuLane {
            stream,
            function: function.clone(),
            host_in,
            host_out,
            dev_in,
            dev_out,
            max_chunks: layout.lane_chunks,
            count: 0,
        })
    }

    /// Seconds to copy `bytes` (at most the lane's capacity) from this
    /// lane's pinned input buffer to its device buffer, `reps` times in a
    /// row on its stream.
    pub(crate) fn time_h2d(&mut self, bytes: usize, reps: usize) -> Result<f64, String> {
        let bytes = bytes.min(self.host_in.len());
        self.stream
            .context()
            .bind_to_thread()
            .map_err(|e| e.to_string())?;
        let (dev_in, _) = self.device_ptrs();
        let src = self.host_in.as_slice().map_err(|e| e.to_string())?;
        let start = Instant::now();
        for _ in 0..reps {
            // SAFETY: both buffers are this lane's and idle; the stream is
            // synchronized below before `src` is released.
            unsafe { result::memcpy_htod_async(dev_in, &src[..bytes], self.stream.cu_stream()) }
                .map_err(|e| e.to_string())?;
        }
        self.stream.synchronize().map_err(|e| e.to_string())?;
        Ok(start.elapsed().as_secs_f64())
    }
}

impl GpuLane {
    /// The device addresses of the input and output buffers. With event
    /// tracking off this records nothing.
    fn device_ptrs(&self) -> (sys::CUdeviceptr, sys::CUdeviceptr) {
        (
            self.dev_in.device_ptr(&self.stream).0,
            self.dev_out.device_ptr(&self.stream).0,
        )
    }
}

impl Lane for GpuLane {
    fn capacity(&self) -> usize {
        self.host_in.len()
    }

    fn max_chunks(&self) -> usize {
        self.max_chunks
    }

    fn input(&mut self) -> Result<&mut [u8], String> {
        self.host_in.as_mut_slice().map_err(|e| e.to_string())
    }

    fn launch(&mut self, code: u32, count: usize, bytes: usize) -> Result<(), String> {
        debug_assert!(count <= self.max_chunks && bytes <= self.host_in.len());
        let ctx = self.stream.context();
        ctx.bind_to_thread()
            .map_err(|e| format!("bind context: {e}"))?;
        let stream = self.stream.cu_stream();
        let (dev_in, dev_out) = self.device_ptrs();
        let src = self.host_in.as_slice().map_err(|e| e.to_string())?;
        // SAFETY: the three operations are queued on this lane's stream in
        // order; the host buffers stay allocated and untouched until `wait`
        // synchronizes the stream (the pipeline's lane protocol), the device
        // buffers are this lane's alone, and the kernel's arguments match
        // fp_hash_kernel's parameters (u32, two device pointers, u32,
        // device pointer).
        unsafe {
            result::memcpy_htod_async(dev_in, &src[..bytes], stream)
                .map_err(|e| format!("copy in: {e}"))?;
            let mut algorithm = code;
            let mut meta = dev_in;
            let mut data = dev_in;
            let mut n = count as u32;
            let mut out = dev_out;
            let mut params: [*mut c_void; 5] = [
                (&mut algorithm as *mut u32).cast(),
                (&mut meta as *mut sys::CUdeviceptr).cast(),
                (&mut data as *mut sys::CUdeviceptr).cast(),
                (&mut n as *mut u32).cast(),
                (&mut out as *mut sys::CUdeviceptr).cast(),
            ];
            let grid = (count as u32).div_ceil(THREADS_PER_BLOCK);
            result::launch_kernel(
                self.function.cu_function(),
                (grid, 1, 1),
                (THREADS_PER_BLOCK, 1, 1),
                0,
                stream,
                &mut params,
            )
            .map_err(|e| format!("kernel launch: {e}"))?;
            let dst = self.host_out.as_mut_slice().map_err(|e| e.to_string())?;
            result::memcpy_dtoh_async(&mut dst[..count * DIGEST_STRIDE], dev_out, stream)
                .map_err(|e| format!("copy out: {e}"))?;
        }
        self.count = count;
        Ok(())
    }

    fn wait(&mut self) -> Result<&[u8], String> {
        self.stream
            .synchronize()
            .map_err(|e| format!("stream synchronize: {e}"))?;
        let digests = self.host_out.as_slice().map_err(|e| e.to_string())?;
        Ok(&digests[..self.count * DIGEST_STRIDE])
    }
}

impl Drop for GpuLane {
    fn drop(&mut self) {
        // Nothing may still read or write the buffers when they are freed.
        let _ = self.stream.synchronize();
    }
}
