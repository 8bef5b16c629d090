//! gpumem's CUDA kernels: `randn.cu` (the normal generator, twin of `tensor::philox`) and
//! `values.cu` (randn per dtype, fills, elementwise arithmetic, reductions, `gpu_sleep`'s spin),
//! compiled together with NVRTC to PTX for the device's architecture the first time a process
//! needs them (the device handle is process-wide, so once per process), loaded into the primary
//! context, and launched on the stream the caller's `Current` names (the legacy default stream
//! unless a script chose another). The driver's JIT cache keeps the PTX-to-machine-code step on
//! disk between runs.
//!
//! Only the kernels tensors use are here; `gpumem bench randn` compiles its candidate kernels
//! from its own source (`src/bench/randn/variants.cu`, in front of which it puts
//! [`RANDN_SOURCE`]).
//!
//! Everything here takes device addresses ([`DevicePtr`]) and element counts: the device layer
//! knows nothing of tensors or dtypes beyond the store formats listed in [`RandnFormat`].

use std::sync::{Arc, Mutex};

use super::cuda::driver::{param, Current, DevicePtr, Function, Module};
use super::DeviceError;
use crate::tensor::philox::PHILOX_ROUNDS;

/// The generator's CUDA source (device functions shared by the production kernels and the
/// benchmark's candidates).
pub const RANDN_SOURCE: &str = include_str!("randn.cu");
/// The production kernels' CUDA source, compiled after [`RANDN_SOURCE`].
pub const VALUES_SOURCE: &str = include_str!("values.cu");
/// The name NVRTC and the logs give the production source.
pub const SOURCE_NAME: &str = "values.cu";

/// Threads per block for every launch (a multiple of the warp size that lets the randn kernels
/// keep every multiprocessor full: 2048 threads per multiprocessor on Hopper = 8 blocks).
pub const THREADS: u32 = 256;
/// Upper bound on blocks for the elementwise grid-stride kernels (fills, arithmetic): enough to
/// fill any current GPU several times over.
const MAX_GRID: u64 = 65_535;
/// Blocks for the first reduction pass (the size of `moments_partials` in `values.cu`).
const MOMENTS_MAX_BLOCKS: u64 = 1024;

/// How the production randn kernel lays its work out. None of it changes values (those depend
/// only on [`PHILOX_ROUNDS`] and the transform in `randn.cu`); `gpumem bench randn` times each
/// choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RandnLayout {
    /// Philox's multiplies as `__umulhi` plus a separate low multiply (IMAD.HI + IMAD) instead
    /// of one 32×32→64 multiply (IMAD.WIDE).
    pub hilo: bool,
    /// Blocks of four values each thread makes per loop iteration (1 or 2).
    pub per_thread: u32,
    /// Evict-first stores (`st.global.cs`).
    pub streaming: bool,
}

/// The layout of the production `randn_f32` kernel: the candidate `gpumem bench randn` showed
/// fastest on the H200 (`p7_v2_x2_cs`: two Philox blocks per thread and iteration, evict-first
/// stores; 3.324 TB/s against 3.290 with plain stores in the same run); see README, "randn".
pub const RANDN_LAYOUT: RandnLayout = RandnLayout {
    hilo: false,
    per_thread: 2,
    streaming: true,
};

/// The production source: the configuration ([`PHILOX_ROUNDS`], [`RANDN_LAYOUT`]) as
/// `#define`s, then [`RANDN_SOURCE`] and [`VALUES_SOURCE`].
pub fn production_source() -> String {
    format!(
        "#define GPUMEM_PHILOX_ROUNDS {}\n#define GPUMEM_PHILOX_HILO {}\n#define GPUMEM_RANDN_PER_THREAD {}\n#define GPUMEM_RANDN_STREAMING {}\n{RANDN_SOURCE}\n{VALUES_SOURCE}",
        PHILOX_ROUNDS,
        u8::from(RANDN_LAYOUT.hilo),
        RANDN_LAYOUT.per_thread,
        u8::from(RANDN_LAYOUT.streaming),
    )
}

/// Philox's key schedule for `seed`, as `randn.cu`'s `PhiloxKeys`: round r uses
/// `(k[2r], k[2r+1]) = (lo + r·0x9E3779B9, hi + r·0xBB67AE85)` with `(lo, hi)` the seed's
/// 32-bit halves, for up to 10 rounds; `m0`, `m1` are Philox's multipliers (the `hilo` form's
/// low multiplies read them). Computed once per launch on the host instead of in every thread.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PhiloxKeys {
    /// Interleaved (k0, k1) of rounds 0..10.
    pub k: [u32; 20],
    /// `PHILOX_M0`, 0xD2511F53.
    pub m0: u32,
    /// `PHILOX_M1`, 0xCD9E8D57.
    pub m1: u32,
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
        PhiloxKeys {
            k,
            m0: 0xD251_1F53,
            m1: 0xCD9E_8D57,
        }
    }
}

/// How `randn` stores each normal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RandnFormat {
    /// float32.
    F32,
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
    Tensors(DevicePtr, DevicePtr),
    /// Tensor and number `a ⊕ s`.
    TensorScalar(DevicePtr, f32),
    /// Number and tensor `s ⊕ b`.
    ScalarTensor(f32, DevicePtr),
}

/// A float32 randn kernel (`(float* out, u64 n, u64 block0, PhiloxKeys key)`, a grid-stride
/// loop) with the grid that fills the device once.
#[derive(Debug, Clone)]
pub struct RandnKernel {
    function: Function,
    grid: u32,
}

impl RandnKernel {
    /// `function` of a loaded module, which must have randn_f32's parameters and loop over the
    /// tensor; its grid is sized to the device's `multiprocessors`.
    pub fn new(function: Function, multiprocessors: u32) -> Result<RandnKernel, DeviceError> {
        let per_multiprocessor = function.resident_blocks_per_multiprocessor(THREADS)?;
        Ok(RandnKernel {
            function,
            grid: multiprocessors.saturating_mul(per_multiprocessor),
        })
    }

    /// The kernel's name.
    pub fn name(&self) -> &str {
        self.function.name()
    }

    /// Writes stream values `offset .. offset + n` of the generator keyed by `seed` at `ptr`.
    /// `offset` must be a multiple of 4 and `ptr` 16-byte aligned.
    pub fn launch(
        &self,
        current: &Current<'_>,
        ptr: DevicePtr,
        n: u64,
        seed: u64,
        offset: u64,
    ) -> Result<(), DeviceError> {
        check_randn(ptr, offset, 16)?;
        if n == 0 {
            return Ok(());
        }
        // Never more threads than blocks of four values.
        let needed = n.div_ceil(4).div_ceil(u64::from(THREADS));
        let grid = u32::try_from(needed.min(u64::from(self.grid)))
            .unwrap_or(self.grid)
            .max(1);
        let (mut ptr, mut n, mut block0) = (ptr, n, offset / 4);
        let mut keys = PhiloxKeys::new(seed);
        let mut params = [
            param(&mut ptr),
            param(&mut n),
            param(&mut block0),
            param(&mut keys),
        ];
        // SAFETY: (float* out, u64 n, u64 block0, PhiloxKeys key) with DevicePtr
        // #[repr(transparent)] over the address and PhiloxKeys #[repr(C)] as the kernel's struct
        // of 22 u32; the caller's `ptr` holds n floats.
        unsafe { self.function.launch(current, grid, THREADS, &mut params) }
    }
}

/// The checks every randn launch makes: the stream offset is a whole block of four, and the
/// address suits the kernel's `align`-byte stores (a misaligned store would fault and poison
/// the context for every later call).
fn check_randn(ptr: DevicePtr, offset: u64, align: u64) -> Result<(), DeviceError> {
    if !offset.is_multiple_of(4) {
        return Err(DeviceError::InvalidArgument(format!(
            "randn: stream offset {offset} is not a multiple of 4"
        )));
    }
    if !ptr.is_aligned(align) {
        return Err(DeviceError::InvalidArgument(format!(
            "randn: address {:#x} is not {align}-byte aligned",
            ptr.addr()
        )));
    }
    Ok(())
}

/// The loaded production kernels.
pub struct Kernels {
    randn_f32: RandnKernel,
    randn_f64: Function,
    randn_f16: Function,
    randn_bf16: Function,
    fills: [Function; 4],
    binary_f32: Function,
    moments_f32: Function,
    moments_finish: Function,
    /// `gpu_sleep`'s spin kernel.
    sleep: Function,
    /// The module's `moments_scratch` (two doubles).
    scratch: DevicePtr,
    /// Held from the first reduction launch until its result is copied back: the module (so
    /// `moments_partials` and `moments_scratch`) is shared by every thread of the process, and
    /// two reductions at once would overwrite each other's partial sums.
    reducing: Mutex<()>,
}

/// Blocks for a grid-stride kernel over `n` elements.
fn grid_for(n: u64) -> u32 {
    n.div_ceil(u64::from(THREADS)).clamp(1, MAX_GRID) as u32
}

impl Kernels {
    /// The production kernels of `module` (compiled from [`production_source`]);
    /// `multiprocessors` sizes the randn grid.
    pub fn load(module: &Arc<Module>, multiprocessors: u32) -> Result<Kernels, DeviceError> {
        let (scratch, _) = module.global("moments_scratch")?;
        Ok(Kernels {
            randn_f32: RandnKernel::new(module.function("randn_f32")?, multiprocessors)?,
            randn_f64: module.function("randn_f64")?,
            randn_f16: module.function("randn_f16")?,
            randn_bf16: module.function("randn_bf16")?,
            fills: [
                module.function("fill_u8")?,
                module.function("fill_u16")?,
                module.function("fill_u32")?,
                module.function("fill_u64")?,
            ],
            binary_f32: module.function("binary_f32")?,
            moments_f32: module.function("moments_f32")?,
            moments_finish: module.function("moments_finish")?,
            sleep: module.function("gpu_sleep")?,
            scratch,
            reducing: Mutex::new(()),
        })
    }

    /// The float32 randn kernel.
    pub fn randn_f32(&self) -> &RandnKernel {
        &self.randn_f32
    }

    /// Sets `n` elements of `width` bytes (1, 2, 4 or 8) at `ptr` to the low bytes of
    /// `pattern`.
    pub fn fill(
        &self,
        current: &Current<'_>,
        ptr: DevicePtr,
        n: u64,
        width: usize,
        pattern: u64,
    ) -> Result<(), DeviceError> {
        let f = match width {
            1 => &self.fills[0],
            2 => &self.fills[1],
            4 => &self.fills[2],
            8 => &self.fills[3],
            _ => {
                return Err(DeviceError::InvalidArgument(format!(
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
        unsafe { f.launch(current, grid_for(n), THREADS, &mut params) }
    }

    /// Writes stream values `offset .. offset + n` of the generator keyed by `seed` at `ptr`.
    /// `offset` must be a multiple of 4; for float32 `ptr` must be 16-byte aligned.
    pub fn randn(
        &self,
        current: &Current<'_>,
        format: RandnFormat,
        ptr: DevicePtr,
        n: u64,
        seed: u64,
        offset: u64,
    ) -> Result<(), DeviceError> {
        let f = match format {
            RandnFormat::F32 => return self.randn_f32.launch(current, ptr, n, seed, offset),
            RandnFormat::F64 => &self.randn_f64,
            RandnFormat::F16 => &self.randn_f16,
            RandnFormat::BF16 => &self.randn_bf16,
        };
        check_randn(ptr, offset, 1)?;
        if n == 0 {
            return Ok(());
        }
        // One thread per block of four values.
        let grid = u32::try_from(n.div_ceil(4).div_ceil(u64::from(THREADS))).map_err(|_| {
            DeviceError::InvalidArgument(format!("randn: {n} elements are too many for one launch"))
        })?;
        let (mut ptr, mut n, mut block0) = (ptr, n, offset / 4);
        let mut keys = PhiloxKeys::new(seed);
        let mut params = [
            param(&mut ptr),
            param(&mut n),
            param(&mut block0),
            param(&mut keys),
        ];
        // SAFETY: (T* out, u64 n, u64 block0, PhiloxKeys key) as in RandnKernel::launch; `ptr`
        // holds n elements.
        unsafe { f.launch(current, grid, THREADS, &mut params) }
    }

    /// `out = a op b` over `n` float32 elements.
    pub fn binary_f32(
        &self,
        current: &Current<'_>,
        op: ElementwiseOp,
        operands: Operands,
        out: DevicePtr,
        n: u64,
    ) -> Result<(), DeviceError> {
        if n == 0 {
            return Ok(());
        }
        let null = DevicePtr(0);
        let (mut a, mut b, mut mode, mut scalar) = match operands {
            Operands::Tensors(a, b) => (a, b, 0i32, 0f32),
            Operands::TensorScalar(a, s) => (a, null, 1, s),
            Operands::ScalarTensor(s, b) => (null, b, 2, s),
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
        unsafe {
            self.binary_f32
                .launch(current, grid_for(n), THREADS, &mut params)
        }
    }

    /// Keeps `current`'s stream busy for `millis` milliseconds (`gpu_sleep`, PyTorch's
    /// `torch.cuda._sleep`): one thread that spins on the GPU's global timer. Returns once the
    /// kernel is queued.
    pub fn sleep(&self, current: &Current<'_>, millis: u64) -> Result<(), DeviceError> {
        let mut nanoseconds = millis.checked_mul(1_000_000).ok_or_else(|| {
            DeviceError::InvalidArgument(format!("a sleep of {millis} ms is too long"))
        })?;
        let mut params = [param(&mut nanoseconds)];
        // SAFETY: (u64 nanoseconds); the kernel touches no memory.
        unsafe { self.sleep.launch(current, 1, 1, &mut params) }
    }

    /// `(Σ (x − shift), Σ (x − shift)²)` over `n` float32 elements, accumulated in double in
    /// a fixed order (the same input always gives the same bits).
    pub fn moments_f32(
        &self,
        current: &Current<'_>,
        ptr: DevicePtr,
        n: u64,
        shift: f64,
    ) -> Result<(f64, f64), DeviceError> {
        let mut blocks = n.div_ceil(u64::from(THREADS)).clamp(1, MOMENTS_MAX_BLOCKS);
        let (mut ptr, mut n, mut shift) = (ptr, n, shift);
        // No data behind the lock: a panic elsewhere cannot leave the scratch inconsistent.
        let _reducing = self
            .reducing
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut params = [param(&mut ptr), param(&mut n), param(&mut shift)];
        // SAFETY: (const float* x, u64 n, double shift); `ptr` holds n floats; at most
        // MOMENTS_MAX_BLOCKS blocks, the size of the partials array.
        unsafe {
            self.moments_f32
                .launch(current, blocks as u32, THREADS, &mut params)
        }?;
        let mut params = [param(&mut blocks)];
        // SAFETY: (u64 blocks); reads the partials the previous launch wrote.
        unsafe { self.moments_finish.launch(current, 1, THREADS, &mut params) }?;
        let mut bytes = [0u8; 16];
        // SAFETY: the module's 16-byte scratch; the copy waits for the kernels on the stream.
        unsafe { current.copy_to_host(&mut bytes, self.scratch) }?;
        let (sum, squares) = bytes.split_at(8);
        let value = |half: &[u8]| f64::from_ne_bytes(half.try_into().unwrap_or([0; 8]));
        Ok((value(sum), value(squares)))
    }
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
        assert_eq!((keys.m0, keys.m1), (0xD251_1F53, 0xCD9E_8D57));
        assert!(RANDN_SOURCE.contains("#define PHILOX_M0 0xD2511F53u"));
        assert!(RANDN_SOURCE.contains("#define PHILOX_M1 0xCD9E8D57u"));
    }

    #[test]
    fn round_keys_give_the_twins_philox() {
        // Philox with the host's key schedule, round by round as randn.cu runs it, equals the
        // CPU twin's Philox (which derives the keys itself), for every supported round count.
        let seed = 0x0123_4567_89AB_CDEF;
        let keys = PhiloxKeys::new(seed);
        for rounds in philox::SUPPORTED_ROUNDS {
            let mut c = [7u32, 9, 0, 0];
            for round in keys.k.chunks_exact(2).take(rounds) {
                let p0 = u64::from(keys.m0) * u64::from(c[0]);
                let p1 = u64::from(keys.m1) * u64::from(c[2]);
                c = [
                    (p1 >> 32) as u32 ^ c[1] ^ round[0],
                    p1 as u32,
                    (p0 >> 32) as u32 ^ c[3] ^ round[1],
                    p0 as u32,
                ];
            }
            assert_eq!(c, philox::block_words(seed, 7 | (9 << 32), rounds));
        }
    }

    #[test]
    fn the_production_source_carries_its_configuration() {
        let source = production_source();
        assert!(source.starts_with(&format!("#define GPUMEM_PHILOX_ROUNDS {PHILOX_ROUNDS}\n")));
        assert!(source.contains("extern \"C\" __global__ void randn_f32("));
        const { assert!(RANDN_LAYOUT.per_thread == 1 || RANDN_LAYOUT.per_thread == 2) };
        // No benchmark-only code in the production module.
        assert!(!source.contains("box_muller_v1") && !source.contains("RANDN_VARIANT"));
    }

    #[test]
    fn randn_arguments_are_checked_before_launching() {
        assert!(check_randn(DevicePtr(512), 8, 16).is_ok());
        assert!(matches!(
            check_randn(DevicePtr(512), 6, 16),
            Err(DeviceError::InvalidArgument(_))
        ));
        let error = check_randn(DevicePtr(520), 0, 16).unwrap_err();
        assert_eq!(
            error.to_string(),
            "randn: address 0x208 is not 16-byte aligned"
        );
    }
}
