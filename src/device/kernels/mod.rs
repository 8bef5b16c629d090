//! gpumem's CUDA kernels (`values.cu`): compiled with NVRTC to PTX for the device's
//! architecture the first time a process needs them (sessions share the device handle, so once
//! per process), loaded into the current context, and launched on the legacy default stream.
//! The driver's JIT cache keeps the PTX-to-machine-code step on disk between runs.
//!
//! Everything here takes raw device addresses and element counts: the device layer knows
//! nothing of tensors or dtypes beyond the store formats listed in [`RandnFormat`].

use std::ffi::{c_void, CString};

use cudarc::driver::result::{self as cu, event, module};
use cudarc::driver::sys;
use cudarc::nvrtc::{self, CompileOptions};

use super::cuda::{describe, driver_error, missing_symbols};
use super::DeviceError;

/// The kernels' CUDA C source.
pub const SOURCE: &str = include_str!("values.cu");

/// Threads per block for every launch.
const THREADS: u32 = 256;
/// Upper bound on blocks for grid-stride kernels (enough to fill any current GPU).
const MAX_GRID: u64 = 65_535;

/// NVRTC entry points gpumem calls; checked before the first call.
const NVRTC_SYMBOLS: [&str; 7] = [
    "nvrtcCreateProgram",
    "nvrtcCompileProgram",
    "nvrtcDestroyProgram",
    "nvrtcGetPTXSize",
    "nvrtcGetPTX",
    "nvrtcGetProgramLogSize",
    "nvrtcGetProgramLog",
];

/// How a randn kernel covers the tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RandnLaunch {
    /// One thread per block of four values.
    Each,
    /// A grid that fills the device once (multiprocessors × resident blocks), each thread
    /// looping over blocks of four values with a grid-sized stride.
    Loop,
}

/// One float32 randn kernel of `values.cu`, as `gpumem bench randn` lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RandnVariant {
    /// The kernel's name in `values.cu`.
    pub name: &'static str,
    /// How it is launched.
    pub launch: RandnLaunch,
    /// Whether it computes gpumem's generator (the values of the CPU twin,
    /// `tensor::philox`); the others run the previous generator's arithmetic, kept as
    /// timing references.
    pub twin: bool,
}

/// The float32 randn kernels. The `twin` ones give identical values and differ only in how
/// the work is laid out (`each`/`loop`, see [`RandnLaunch`]) or multiplied (`umulhi`:
/// Philox's mulhilo as `__umulhi` plus a low multiply instead of one 32×32→64 multiply).
/// `libm` and `libm_fast` run the previous generator's Box-Muller (CUDA's logf/sincospif,
/// resp. __logf/__sincosf), which no CPU code can reproduce bit for bit.
pub const RANDN_F32_VARIANTS: [RandnVariant; 6] = [
    RandnVariant {
        name: "randn_f32_each",
        launch: RandnLaunch::Each,
        twin: true,
    },
    RandnVariant {
        name: "randn_f32_loop",
        launch: RandnLaunch::Loop,
        twin: true,
    },
    RandnVariant {
        name: "randn_f32_umulhi_each",
        launch: RandnLaunch::Each,
        twin: true,
    },
    RandnVariant {
        name: "randn_f32_umulhi_loop",
        launch: RandnLaunch::Loop,
        twin: true,
    },
    RandnVariant {
        name: "randn_f32_libm_each",
        launch: RandnLaunch::Each,
        twin: false,
    },
    RandnVariant {
        name: "randn_f32_libm_fast_each",
        launch: RandnLaunch::Each,
        twin: false,
    },
];

/// Philox4x32-10's round keys for `seed`, as `values.cu`'s `PhiloxKeys`: round r uses
/// `(k[2r], k[2r+1]) = (lo + r·0x9E3779B9, hi + r·0xBB67AE85)` with `(lo, hi)` the seed's
/// 32-bit halves. Computed once per launch on the host instead of in every thread.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PhiloxKeys {
    /// Interleaved (k0, k1) of rounds 0..10.
    pub k: [u32; 20],
}

impl PhiloxKeys {
    /// The schedule for `seed`.
    pub fn new(seed: u64) -> PhiloxKeys {
        let mut k = [0u32; 20];
        let (mut k0, mut k1) = (seed as u32, (seed >> 32) as u32);
        for pair in k.chunks_exact_mut(2) {
            pair[0] = k0;
            pair[1] = k1;
            k0 = k0.wrapping_add(0x9E37_79B9);
            k1 = k1.wrapping_add(0xBB67_AE85);
        }
        PhiloxKeys { k }
    }
}

/// The variant tensors use (an index into [`RANDN_F32_VARIANTS`]): the grid-stride loop,
/// which pays per-thread setup and constant loads once rather than per block of values.
///
/// Measured on an NVIDIA H200 (`gpumem --device cuda bench randn`: 960 MB tensor, 20 reps
/// after warm-up, CUDA events): `loop` 2.68 TB/s, `each` 2.44, `umulhi_loop` 2.73,
/// `umulhi_each` 2.45, every one of the first 10⁶ values bit-identical to the CPU twin;
/// the previous `libm` generator 1.92 and its hardware-approximation variant 2.98 (no twin);
/// PyTorch's `normal_` 1.80 in the same run.
pub const RANDN_F32_DEFAULT: usize = 1;

/// Blocks for the first reduction pass (the size of `moments_partials` in `values.cu`).
const MOMENTS_MAX_BLOCKS: u64 = 1024;

/// How `randn` stores each float32 normal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RandnFormat {
    /// float32, with the default kernel ([`RANDN_F32_DEFAULT`]).
    F32,
    /// float32 with one of [`RANDN_F32_VARIANTS`] (benchmarks).
    F32Variant(usize),
    /// Converted to float64.
    F64,
    /// Converted to IEEE half.
    F16,
    /// Converted to bfloat16.
    BF16,
}

/// Elementwise operation codes shared with `values.cu`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ElementwiseOp {
    /// `+`
    Add = 0,
    /// `-`
    Sub = 1,
    /// `*`
    Mul = 2,
    /// `/`
    Div = 3,
}

/// Where the operands of [`Kernels::binary_f32`] come from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Operands {
    /// Two tensors `a ⊕ b`.
    Tensors(u64, u64),
    /// Tensor and number `a ⊕ s`.
    TensorScalar(u64, f32),
    /// Number and tensor `s ⊕ b`.
    ScalarTensor(f32, u64),
}

/// The loaded module and its functions.
pub struct Kernels {
    /// The [`RANDN_F32_VARIANTS`] kernels, each with its grid limit (`None`: one thread per
    /// block of values; `Some(g)`: at most `g` thread blocks, looping).
    randn_f32: Vec<(sys::CUfunction, Option<u64>)>,
    randn_f64: sys::CUfunction,
    randn_f16: sys::CUfunction,
    randn_bf16: sys::CUfunction,
    fills: [sys::CUfunction; 4],
    binary_f32: sys::CUfunction,
    moments_f32: sys::CUfunction,
    moments_finish: sys::CUfunction,
    /// The module's `moments_scratch` (two doubles).
    scratch: u64,
}

fn launch_error(kernel: &str, error: cu::DriverError) -> DeviceError {
    DeviceError::Driver(format!("launching {kernel} failed: {}", describe(error)))
}

/// Blocks for a grid-stride kernel over `n` elements.
fn grid_for(n: u64) -> u32 {
    n.div_ceil(u64::from(THREADS)).clamp(1, MAX_GRID) as u32
}

/// Thread blocks of `f` that fill the device once: `multiprocessors` × the blocks of
/// [`THREADS`] threads one multiprocessor holds at a time (the driver's occupancy figure).
fn resident_grid(f: sys::CUfunction, name: &str, multiprocessors: u32) -> Result<u64, DeviceError> {
    // SAFETY: `f` is a function of the loaded module.
    let per_multiprocessor =
        unsafe { cu::occupancy::max_active_block_per_multiprocessor(f, THREADS as i32, 0) }
            .map_err(|error| {
                driver_error(
                    &format!("cuOccupancyMaxActiveBlocksPerMultiprocessor({name})"),
                    error,
                )
            })?;
    Ok(u64::from(multiprocessors) * u64::from(per_multiprocessor.max(1) as u32))
}

/// Launches `f` on the default stream.
///
/// # Safety
/// `params` must point at live values of exactly the kernel's parameter types, and every
/// address among them must be valid device memory of the sizes the kernel touches.
unsafe fn launch(
    f: sys::CUfunction,
    name: &str,
    grid: u32,
    params: &mut [*mut c_void],
) -> Result<(), DeviceError> {
    cu::launch_kernel(
        f,
        (grid, 1, 1),
        (THREADS, 1, 1),
        0,
        cu::stream::null(),
        params,
    )
    .map_err(|error| launch_error(name, error))
}

/// A pointer to `value` as a kernel parameter.
fn param<T>(value: &mut T) -> *mut c_void {
    (value as *mut T).cast()
}

impl Kernels {
    /// Compiles `values.cu` for `compute_capability` and loads it into the current context;
    /// `multiprocessors` sizes the grid-stride launches.
    pub fn load(
        compute_capability: (i32, i32),
        multiprocessors: u32,
    ) -> Result<Kernels, DeviceError> {
        // SAFETY: only tries to load the library.
        if !unsafe { nvrtc::sys::is_culib_present() } {
            return Err(DeviceError::Driver(
                "NVRTC (libnvrtc.so) was not found; it ships with the CUDA toolkit: add its lib64 folder to LD_LIBRARY_PATH"
                    .into(),
            ));
        }
        let missing = missing_symbols!(nvrtc::sys::culib, NVRTC_SYMBOLS);
        if !missing.is_empty() {
            return Err(DeviceError::Driver(format!(
                "the NVRTC library lacks {}",
                missing.join(", ")
            )));
        }
        let (major, minor) = compute_capability;
        let options = CompileOptions {
            options: vec![format!("--gpu-architecture=compute_{major}{minor}")],
            name: Some("values.cu".into()),
            ..Default::default()
        };
        let ptx = nvrtc::compile_ptx_with_opts(SOURCE, options).map_err(|error| {
            DeviceError::Driver(format!(
                "compiling the kernels with NVRTC failed: {error:?}"
            ))
        })?;
        let image = CString::new(ptx.to_src())
            .map_err(|_| DeviceError::Driver("NVRTC produced PTX containing NUL".into()))?;
        // SAFETY: `image` is NUL-terminated PTX text; a context is current (the caller
        // activated it). The module stays loaded for the rest of the process.
        let handle = unsafe { module::load_data(image.as_ptr().cast()) }
            .map_err(|error| driver_error("cuModuleLoadData", error))?;
        let function = |name: &str| -> Result<sys::CUfunction, DeviceError> {
            let c_name = CString::new(name)
                .map_err(|_| DeviceError::Driver(format!("bad kernel name {name}")))?;
            // SAFETY: `handle` is a loaded module.
            unsafe { module::get_function(handle, c_name) }
                .map_err(|error| driver_error(&format!("cuModuleGetFunction({name})"), error))
        };
        let scratch_name = CString::new("moments_scratch")
            .map_err(|_| DeviceError::Driver("bad symbol name".into()))?;
        // SAFETY: `handle` is a loaded module declaring `moments_scratch`.
        let (scratch, _) = unsafe { module::get_global(handle, scratch_name) }
            .map_err(|error| driver_error("cuModuleGetGlobal(moments_scratch)", error))?;
        let randn_f32 = RANDN_F32_VARIANTS
            .iter()
            .map(|variant| {
                let f = function(variant.name)?;
                let limit = match variant.launch {
                    RandnLaunch::Each => None,
                    RandnLaunch::Loop => Some(resident_grid(f, variant.name, multiprocessors)?),
                };
                Ok((f, limit))
            })
            .collect::<Result<Vec<_>, DeviceError>>()?;
        Ok(Kernels {
            randn_f32,
            randn_f64: function("randn_f64")?,
            randn_f16: function("randn_f16")?,
            randn_bf16: function("randn_bf16")?,
            fills: [
                function("fill_u8")?,
                function("fill_u16")?,
                function("fill_u32")?,
                function("fill_u64")?,
            ],
            binary_f32: function("binary_f32")?,
            moments_f32: function("moments_f32")?,
            moments_finish: function("moments_finish")?,
            scratch,
        })
    }

    /// Sets `n` elements of `width` bytes (1, 2, 4 or 8) at `ptr` to the low bytes of
    /// `pattern`.
    pub fn fill(&self, ptr: u64, n: u64, width: usize, pattern: u64) -> Result<(), DeviceError> {
        let f = match width {
            1 => self.fills[0],
            2 => self.fills[1],
            4 => self.fills[2],
            8 => self.fills[3],
            _ => {
                return Err(DeviceError::Driver(format!(
                    "no fill kernel for {width}-byte elements"
                )))
            }
        };
        if n == 0 {
            return Ok(());
        }
        let (mut ptr, mut n, mut pattern) = (ptr, n, pattern);
        let mut params = [param(&mut ptr), param(&mut n), param(&mut pattern)];
        // SAFETY: (T* out, u64 n, u64 pattern); `ptr` holds n elements of `width` bytes.
        unsafe { launch(f, "fill", grid_for(n), &mut params) }
    }

    /// Writes stream values `offset .. offset + n` of the generator keyed by `seed` at
    /// `ptr`. `offset` must be a multiple of 4; for float32 formats `ptr` must be 16-byte
    /// aligned.
    pub fn randn(
        &self,
        format: RandnFormat,
        ptr: u64,
        n: u64,
        seed: u64,
        offset: u64,
    ) -> Result<(), DeviceError> {
        if !offset.is_multiple_of(4) {
            return Err(DeviceError::Driver(format!(
                "randn: stream offset {offset} is not a multiple of 4"
            )));
        }
        if n == 0 {
            return Ok(());
        }
        // The float32 kernels store four values at a time (16-byte stores); a misaligned store
        // would fault and poison the context for every later call.
        if matches!(format, RandnFormat::F32 | RandnFormat::F32Variant(_))
            && !ptr.is_multiple_of(16)
        {
            return Err(DeviceError::Driver(format!(
                "randn: address {ptr:#x} is not 16-byte aligned"
            )));
        }
        let variant = |index: usize| {
            self.randn_f32
                .get(index)
                .copied()
                .ok_or_else(|| DeviceError::Driver(format!("no randn variant {index}")))
        };
        let (f, limit) = match format {
            RandnFormat::F32 => variant(RANDN_F32_DEFAULT)?,
            RandnFormat::F32Variant(index) => variant(index)?,
            RandnFormat::F64 => (self.randn_f64, None),
            RandnFormat::F16 => (self.randn_f16, None),
            RandnFormat::BF16 => (self.randn_bf16, None),
        };
        // One thread per block of four values, fewer when the kernel loops.
        let grid = n.div_ceil(4).div_ceil(u64::from(THREADS));
        let grid = limit.map_or(grid, |limit| grid.min(limit));
        let grid = u32::try_from(grid).map_err(|_| {
            DeviceError::Driver(format!("randn: {n} elements are too many for one launch"))
        })?;
        let (mut ptr, mut n, mut block0) = (ptr, n, offset / 4);
        let mut keys = PhiloxKeys::new(seed);
        let mut params = [
            param(&mut ptr),
            param(&mut n),
            param(&mut block0),
            param(&mut keys),
        ];
        // SAFETY: (T* out, u64 n, u64 block0, PhiloxKeys key) with PhiloxKeys #[repr(C)] as
        // the kernel's struct of 20 u32; `ptr` holds n elements.
        unsafe { launch(f, "randn", grid, &mut params) }
    }

    /// `out = a op b` over `n` float32 elements.
    pub fn binary_f32(
        &self,
        op: ElementwiseOp,
        operands: Operands,
        out: u64,
        n: u64,
    ) -> Result<(), DeviceError> {
        if n == 0 {
            return Ok(());
        }
        let (mut a, mut b, mut mode, mut scalar) = match operands {
            Operands::Tensors(a, b) => (a, b, 0i32, 0f32),
            Operands::TensorScalar(a, s) => (a, 0, 1, s),
            Operands::ScalarTensor(s, b) => (0, b, 2, s),
        };
        let (mut out, mut n, mut op) = (out, n, op as i32);
        let mut params = [
            param(&mut a),
            param(&mut b),
            param(&mut out),
            param(&mut n),
            param(&mut op),
            param(&mut mode),
            param(&mut scalar),
        ];
        // SAFETY: (const float* a, const float* b, float* out, u64 n, int op, int mode,
        // float scalar); the kernel reads only the tensor operands `mode` names.
        unsafe { launch(self.binary_f32, "binary_f32", grid_for(n), &mut params) }
    }

    /// `(Σ (x − shift), Σ (x − shift)²)` over `n` float32 elements, accumulated in double in
    /// a fixed order (the same input always gives the same bits).
    pub fn moments_f32(&self, ptr: u64, n: u64, shift: f64) -> Result<(f64, f64), DeviceError> {
        let mut blocks = n.div_ceil(u64::from(THREADS)).clamp(1, MOMENTS_MAX_BLOCKS);
        let (mut ptr, mut n, mut shift) = (ptr, n, shift);
        let mut params = [param(&mut ptr), param(&mut n), param(&mut shift)];
        // SAFETY: (const float* x, u64 n, double shift); `ptr` holds n floats; at most
        // MOMENTS_MAX_BLOCKS blocks, the size of the partials array.
        unsafe { launch(self.moments_f32, "moments_f32", blocks as u32, &mut params) }?;
        let mut params = [param(&mut blocks)];
        // SAFETY: (u64 blocks); reads the partials the previous launch wrote.
        unsafe { launch(self.moments_finish, "moments_finish", 1, &mut params) }?;
        let mut result = [0f64; 2];
        // SAFETY: copies the 16-byte scratch; synchronous, after the kernels on the same stream.
        unsafe { cu::memcpy_dtoh_sync(&mut result, self.scratch) }
            .map_err(|error| driver_error("cuMemcpyDtoH", error))?;
        Ok((result[0], result[1]))
    }

    /// Milliseconds per launch of `randn` over `n` elements at `ptr`, timed with CUDA events
    /// around `reps` back-to-back launches after one warm-up launch.
    pub fn time_randn(
        &self,
        format: RandnFormat,
        ptr: u64,
        n: u64,
        seed: u64,
        reps: u32,
    ) -> Result<f64, DeviceError> {
        self.randn(format, ptr, n, seed, 0)?;
        let flags = sys::CUevent_flags::CU_EVENT_DEFAULT;
        let start = event::create(flags).map_err(|error| driver_error("cuEventCreate", error))?;
        let stop = event::create(flags).map_err(|error| driver_error("cuEventCreate", error))?;
        let timed = (|| {
            // SAFETY: both events were just created on the current context.
            unsafe { event::record(start, cu::stream::null()) }
                .map_err(|error| driver_error("cuEventRecord", error))?;
            for _ in 0..reps {
                self.randn(format, ptr, n, seed, 0)?;
            }
            // SAFETY: as above.
            unsafe { event::record(stop, cu::stream::null()) }
                .map_err(|error| driver_error("cuEventRecord", error))?;
            // SAFETY: as above. The elapsed time is defined once `stop` has completed.
            unsafe { event::synchronize(stop) }
                .map_err(|error| driver_error("cuEventSynchronize", error))?;
            // SAFETY: as above.
            unsafe { event::elapsed(start, stop) }
                .map_err(|error| driver_error("cuEventElapsedTime", error))
        })();
        // SAFETY: the events are not used after this.
        unsafe {
            let _ = event::destroy(start);
            let _ = event::destroy(stop);
        }
        Ok(f64::from(timed?) / f64::from(reps.max(1)))
    }
}

/// Copies `bytes` bytes from device address `src` to the host.
pub fn read(src: u64, bytes: usize) -> Result<Vec<u8>, DeviceError> {
    let mut host = vec![0u8; bytes];
    if bytes > 0 {
        // SAFETY: `src` holds at least `bytes` bytes; synchronous copy on the default stream.
        unsafe { cu::memcpy_dtoh_sync(&mut host, src) }
            .map_err(|error| driver_error("cuMemcpyDtoH", error))?;
    }
    Ok(host)
}

/// Copies `bytes` bytes between device addresses.
pub fn copy(dst: u64, src: u64, bytes: usize) -> Result<(), DeviceError> {
    if bytes == 0 {
        return Ok(());
    }
    // SAFETY: both ranges are valid device memory of `bytes` bytes.
    unsafe { cu::memcpy_dtod_sync(dst, src, bytes) }
        .map_err(|error| driver_error("cuMemcpyDtoD", error))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::philox;

    #[test]
    fn round_keys_follow_the_weyl_sequence() {
        let keys = PhiloxKeys::new(0xFFFF_FFFF_0000_0001);
        assert_eq!((keys.k[0], keys.k[1]), (1, 0xFFFF_FFFF));
        assert_eq!(keys.k[2], 1u32.wrapping_add(0x9E37_79B9));
        assert_eq!(
            keys.k[19],
            0xFFFF_FFFFu32.wrapping_add(9u32.wrapping_mul(0xBB67_AE85))
        );
    }

    #[test]
    fn round_keys_give_the_twins_philox() {
        // Philox with the host's key schedule, round by round as values.cu runs it, equals
        // the CPU twin's Philox (which derives the keys itself).
        let seed = 0x0123_4567_89AB_CDEF;
        let keys = PhiloxKeys::new(seed);
        let mut c = [7u32, 9, 0, 0];
        for round in keys.k.chunks_exact(2) {
            let p0 = u64::from(0xD251_1F53u32) * u64::from(c[0]);
            let p1 = u64::from(0xCD9E_8D57u32) * u64::from(c[2]);
            c = [
                (p1 >> 32) as u32 ^ c[1] ^ round[0],
                p1 as u32,
                (p0 >> 32) as u32 ^ c[3] ^ round[1],
                p0 as u32,
            ];
        }
        assert_eq!(
            c,
            philox::philox4x32_10([7, 9, 0, 0], [seed as u32, (seed >> 32) as u32])
        );
    }

    #[test]
    fn every_variant_is_in_values_cu_and_the_default_is_exact() {
        assert!(RANDN_F32_VARIANTS[RANDN_F32_DEFAULT].twin);
        let names: Vec<_> = RANDN_F32_VARIANTS.iter().map(|v| v.name).collect();
        for name in names {
            assert!(
                SOURCE.contains(&format!("RANDN_F32({name},")),
                "{name} not in values.cu"
            );
        }
    }
}
