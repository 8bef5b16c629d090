//! gpumem's CUDA kernels: `randn.cu` (the normal generator, twin of `tensor::philox`) and
//! `values.cu` (randn per dtype, fills, elementwise arithmetic, reductions, `gpu_sleep`'s spin),
//! compiled together with NVRTC to PTX for the device's architecture the first time a process
//! needs them (the device handle is process-wide, so once per process), loaded into the primary
//! context, and launched on the stream the caller's `Current` names (the legacy default stream
//! unless a script chose another). The driver's JIT cache keeps the PTX-to-machine-code step on
//! disk between runs.
//!
//! Only the kernels tensors use are here; `gpumem bench randn` compiles its candidate kernels
//! from its own source (`src/cli/bench/randn/variants.cu`, in front of which it puts
//! [`RANDN_SOURCE`]).
//!
//! Every launch takes the memory it writes and reads as [`DeviceSpan`]s, borrowed from their
//! owner for the call: element counts come from the spans' lengths, and a span of another
//! device's memory is refused before anything is launched. The device layer knows nothing of
//! tensors or dtypes beyond the store formats listed in [`RandnFormat`].

use std::sync::{Arc, Mutex};

use super::driver::{param, Current, Function, Module};
use crate::device::{DeviceError, DevicePtr, DeviceSpan};

/// The generator's CUDA source (device functions shared by the production kernels and the
/// benchmark's candidates).
pub const RANDN_SOURCE: &str = include_str!("randn.cu");
/// The production kernels' CUDA source, compiled after [`RANDN_SOURCE`].
pub const VALUES_SOURCE: &str = include_str!("values.cu");
/// The name NVRTC and the logs give the production source.
pub const SOURCE_NAME: &str = "values.cu";

/// Philox rounds of the production generator. The kernels are compiled with it
/// (`production_source`), and the tensor layer's CPU twin of the generator uses the same
/// constant, so changing it here changes both sides together.
///
/// 7 is the smallest round count Salmon et al. report as passing TestU01's BigCrush for
/// Philox4x32 (their "Philox4x32-7"; they recommend 10 for a safety margin, which curand and
/// PyTorch use). gpumem uses 7 because randn is bound by Philox's 32×32→64-bit multiplies on the
/// GPU: 7 rounds make it about a quarter faster (README, "randn"). 10 is supported as well
/// (pinned values and statistical tests cover both). `PhiloxKeys` holds keys for at most 10.
pub const PHILOX_ROUNDS: usize = 7;
const _: () = assert!(PHILOX_ROUNDS >= 1 && PHILOX_ROUNDS <= 10);

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
/// `#define`s, then [`RANDN_SOURCE`] and `VALUES_SOURCE`.
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

impl RandnFormat {
    /// Bytes per stored value.
    pub fn width(self) -> u64 {
        match self {
            RandnFormat::F32 => 4,
            RandnFormat::F64 => 8,
            RandnFormat::F16 | RandnFormat::BF16 => 2,
        }
    }

    /// The alignment the kernel's stores need: float32 values go out four at a time
    /// (`float4`, 16 bytes); the others one at a time.
    fn alignment(self) -> u64 {
        match self {
            RandnFormat::F32 => 16,
            other => other.width(),
        }
    }

    /// The production kernel's name in `values.cu`.
    fn kernel(self) -> &'static str {
        match self {
            RandnFormat::F32 => "randn_f32",
            RandnFormat::F64 => "randn_f64",
            RandnFormat::F16 => "randn_f16",
            RandnFormat::BF16 => "randn_bf16",
        }
    }
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
pub enum Operands<'a> {
    /// Two tensors `a ⊕ b`.
    Tensors(DeviceSpan<'a>, DeviceSpan<'a>),
    /// Tensor and number `a ⊕ s`.
    TensorScalar(DeviceSpan<'a>, f32),
    /// Number and tensor `s ⊕ b`.
    ScalarTensor(f32, DeviceSpan<'a>),
}

/// The kernel-parameter address of `span`, checked to be memory of `current`'s device and to
/// hold at least `bytes` bytes (`what` names the launch in errors).
fn operand(
    current: &Current<'_>,
    span: DeviceSpan<'_>,
    bytes: u64,
    what: &str,
) -> Result<u64, DeviceError> {
    let address = span.address_in(current.space(), what)?;
    if span.bytes() < bytes {
        return Err(DeviceError::InvalidArgument(format!(
            "{what}: an operand of {} bytes is shorter than the {bytes} bytes written",
            span.bytes()
        )));
    }
    Ok(address)
}

/// The number of `width`-byte elements in `span`; an error when it is not a whole number.
fn elements(span: DeviceSpan<'_>, width: u64, what: &str) -> Result<u64, DeviceError> {
    if width == 0 || !span.bytes().is_multiple_of(width) {
        return Err(DeviceError::InvalidArgument(format!(
            "{what}: {} bytes are not whole {width}-byte elements",
            span.bytes()
        )));
    }
    Ok(span.bytes() / width)
}

/// A randn kernel (`(T* out, u64 n, u64 block0, PhiloxKeys key)`, a grid-stride loop over the
/// blocks of four values) with the grid that fills the device once. Every randn launch goes
/// through [`RandnKernel::launch`]: the production kernels of each [`RandnFormat`] and the
/// benchmark's float32 candidates.
#[derive(Debug, Clone)]
pub struct RandnKernel {
    function: Function,
    format: RandnFormat,
    grid: u32,
}

impl RandnKernel {
    /// `function` of a loaded module, which must have randn's parameters, store `format` and
    /// loop over the tensor; its grid is sized to the device's `multiprocessors`.
    pub fn new(
        function: Function,
        format: RandnFormat,
        multiprocessors: u32,
    ) -> Result<RandnKernel, DeviceError> {
        let per_multiprocessor = function.resident_blocks_per_multiprocessor(THREADS)?;
        Ok(RandnKernel {
            function,
            format,
            grid: multiprocessors.saturating_mul(per_multiprocessor).max(1),
        })
    }

    /// The kernel's name.
    pub fn name(&self) -> &str {
        self.function.name()
    }

    /// Fills `out` with stream values `offset ..` of the generator keyed by `seed`, one per
    /// element. `offset` must be a multiple of 4 and `out` aligned for the kernel's stores.
    pub fn launch(
        &self,
        current: &Current<'_>,
        out: DeviceSpan<'_>,
        seed: u64,
        offset: u64,
    ) -> Result<(), DeviceError> {
        let n = elements(out, self.format.width(), self.name())?;
        check_randn(out.start(), offset, self.format.alignment())?;
        if n == 0 {
            return Ok(());
        }
        let address = operand(current, out, out.bytes(), self.name())?;
        // Never more threads than blocks of four values.
        let needed = n.div_ceil(4).div_ceil(u64::from(THREADS));
        let grid = u32::try_from(needed.min(u64::from(self.grid)))
            .unwrap_or(self.grid)
            .max(1);
        let (mut out, mut n, mut block0) = (address, n, offset / 4);
        let mut keys = PhiloxKeys::new(seed);
        let mut params = [
            param(&mut out),
            param(&mut n),
            param(&mut block0),
            param(&mut keys),
        ];
        // SAFETY: (T* out, u64 n, u64 block0, PhiloxKeys key) with the address as a u64 and
        // PhiloxKeys #[repr(C)] as the kernel's struct of 22 u32; `out` is this device's live
        // memory holding exactly n elements of the kernel's format (checked above), and the
        // kernel writes elements 0..n only.
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
    /// The randn kernel of each [`RandnFormat`], in the order of [`Kernels::RANDN_FORMATS`].
    randn: [RandnKernel; 4],
    fills: [Function; 4],
    binary_f32: Function,
    moments_f32: Function,
    moments_finish: Function,
    /// `gpu_sleep`'s spin kernel.
    sleep: Function,
    /// The module's `moments_scratch` (two doubles): its address and size.
    scratch: (DevicePtr, u64),
    /// Keeps the module loaded, so `scratch` stays valid (every Function holds it too).
    _module: Arc<Module>,
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
    /// The formats of [`Kernels`]' randn kernels, in order.
    const RANDN_FORMATS: [RandnFormat; 4] = [
        RandnFormat::F32,
        RandnFormat::F64,
        RandnFormat::F16,
        RandnFormat::BF16,
    ];

    /// The production kernels of `module` (compiled from [`production_source`]);
    /// `multiprocessors` sizes the randn grids.
    pub fn load(module: &Arc<Module>, multiprocessors: u32) -> Result<Kernels, DeviceError> {
        let (scratch, scratch_bytes) = module.global("moments_scratch")?;
        let randn = |format: RandnFormat| {
            RandnKernel::new(module.function(format.kernel())?, format, multiprocessors)
        };
        let [f32, f64, f16, bf16] = Self::RANDN_FORMATS;
        Ok(Kernels {
            randn: [randn(f32)?, randn(f64)?, randn(f16)?, randn(bf16)?],
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
            scratch: (scratch, scratch_bytes as u64),
            _module: Arc::clone(module),
            reducing: Mutex::new(()),
        })
    }

    /// The randn kernel storing `format`.
    pub fn randn_kernel(&self, format: RandnFormat) -> &RandnKernel {
        let index = match format {
            RandnFormat::F32 => 0,
            RandnFormat::F64 => 1,
            RandnFormat::F16 => 2,
            RandnFormat::BF16 => 3,
        };
        &self.randn[index]
    }

    /// Sets every `width`-byte element (1, 2, 4 or 8 bytes) of `out` to the low bytes of
    /// `pattern`.
    pub fn fill(
        &self,
        current: &Current<'_>,
        out: DeviceSpan<'_>,
        width: u64,
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
        let n = elements(out, width, f.name())?;
        if n == 0 {
            return Ok(());
        }
        let address = operand(current, out, out.bytes(), f.name())?;
        let (mut out, mut n, mut pattern) = (address, n, pattern);
        let mut params = [param(&mut out), param(&mut n), param(&mut pattern)];
        // SAFETY: (T* out, u64 n, u64 pattern); `out` is this device's live memory holding
        // exactly n elements of `width` bytes (checked above).
        unsafe { f.launch(current, grid_for(n), THREADS, &mut params) }
    }

    /// Writes stream values `offset ..` of the generator keyed by `seed` into `out`, one per
    /// element, stored as `format` ([`RandnKernel::launch`]).
    pub fn randn(
        &self,
        current: &Current<'_>,
        format: RandnFormat,
        out: DeviceSpan<'_>,
        seed: u64,
        offset: u64,
    ) -> Result<(), DeviceError> {
        self.randn_kernel(format).launch(current, out, seed, offset)
    }

    /// `out = a op b` over the float32 elements of `out`; tensor operands hold at least as
    /// many.
    pub fn binary_f32(
        &self,
        current: &Current<'_>,
        op: ElementwiseOp,
        operands: Operands<'_>,
        out: DeviceSpan<'_>,
    ) -> Result<(), DeviceError> {
        let what = self.binary_f32.name();
        let n = elements(out, 4, what)?;
        if n == 0 {
            return Ok(());
        }
        let bytes = out.bytes();
        let null = DevicePtr::NULL.addr();
        let (mut a, mut b, mut mode, mut scalar) = match operands {
            Operands::Tensors(a, b) => (
                operand(current, a, bytes, what)?,
                operand(current, b, bytes, what)?,
                0i32,
                0f32,
            ),
            Operands::TensorScalar(a, s) => (operand(current, a, bytes, what)?, null, 1, s),
            Operands::ScalarTensor(s, b) => (null, operand(current, b, bytes, what)?, 2, s),
        };
        let address = operand(current, out, bytes, what)?;
        let (mut out, mut n, mut op) = (address, n, op as i32);
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
        // float scalar); `out` and the tensor operands `mode` names are this device's live
        // memory of at least n floats (checked above); the kernel reads only those operands.
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

    /// `(Σ (x − shift), Σ (x − shift)²)` over the float32 elements of `x`, accumulated in
    /// double in a fixed order (the same input always gives the same bits).
    pub fn moments_f32(
        &self,
        current: &Current<'_>,
        x: DeviceSpan<'_>,
        shift: f64,
    ) -> Result<(f64, f64), DeviceError> {
        let what = self.moments_f32.name();
        let n = elements(x, 4, what)?;
        let address = if n == 0 {
            DevicePtr::NULL.addr()
        } else {
            operand(current, x, x.bytes(), what)?
        };
        let mut blocks = n.div_ceil(u64::from(THREADS)).clamp(1, MOMENTS_MAX_BLOCKS);
        let (mut x, mut n, mut shift) = (address, n, shift);
        // No data behind the lock: a panic elsewhere cannot leave the scratch inconsistent.
        let _reducing = self
            .reducing
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut params = [param(&mut x), param(&mut n), param(&mut shift)];
        // SAFETY: (const float* x, u64 n, double shift); `x` is this device's live memory
        // holding n floats (checked above; with n = 0 nothing is read); at most
        // MOMENTS_MAX_BLOCKS blocks, the size of the partials array.
        unsafe {
            self.moments_f32
                .launch(current, blocks as u32, THREADS, &mut params)
        }?;
        let mut params = [param(&mut blocks)];
        // SAFETY: (u64 blocks); reads the partials the previous launch wrote.
        unsafe { self.moments_finish.launch(current, 1, THREADS, &mut params) }?;
        let (scratch, scratch_bytes) = self.scratch;
        // SAFETY: the module's `moments_scratch` global, which stays allocated while the
        // module is loaded; `self` holds the module for the span's borrow of `self`.
        let scratch = unsafe { DeviceSpan::new(scratch, scratch_bytes) };
        let mut bytes = [0u8; 16];
        current.copy_to_host(&mut bytes, scratch)?;
        let (sum, squares) = bytes.split_at(8);
        let value = |half: &[u8]| f64::from_ne_bytes(half.try_into().unwrap_or([0; 8]));
        Ok((value(sum), value(squares)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn the_production_source_carries_its_configuration() {
        let source = production_source();
        assert!(source.starts_with(&format!("#define GPUMEM_PHILOX_ROUNDS {PHILOX_ROUNDS}\n")));
        assert!(source.contains("extern \"C\" __global__ void randn_f32("));
        const { assert!(RANDN_LAYOUT.per_thread == 1 || RANDN_LAYOUT.per_thread == 2) };
        // No benchmark-only code in the production module.
        assert!(!source.contains("box_muller_v1") && !source.contains("RANDN_VARIANT"));
    }

    #[test]
    fn launch_sizes_come_from_the_spans() {
        // SAFETY: simulated memory; only the arithmetic of the checks is exercised.
        let span = unsafe { DeviceSpan::new(DevicePtr::simulated(4096), 44) };
        assert_eq!(elements(span, 4, "fill_u32"), Ok(11));
        assert_eq!(
            elements(span, 8, "fill_u64").map_err(|e| e.to_string()),
            Err("fill_u64: 44 bytes are not whole 8-byte elements".to_string())
        );
        assert!(elements(span, 0, "none").is_err());
        let widths: Vec<(u64, u64)> = Kernels::RANDN_FORMATS
            .iter()
            .map(|format| (format.width(), format.alignment()))
            .collect();
        assert_eq!(widths, [(4, 16), (8, 8), (2, 2), (2, 2)]);
        let names: Vec<&str> = Kernels::RANDN_FORMATS.iter().map(|f| f.kernel()).collect();
        for name in names {
            assert!(production_source().contains(&format!("extern \"C\" __global__ void {name}(")));
        }
    }

    #[test]
    fn randn_arguments_are_checked_before_launching() {
        assert!(check_randn(DevicePtr::simulated(512), 8, 16).is_ok());
        assert!(matches!(
            check_randn(DevicePtr::simulated(512), 6, 16),
            Err(DeviceError::InvalidArgument(_))
        ));
        let error = check_randn(DevicePtr::simulated(520), 0, 16).unwrap_err();
        assert_eq!(
            error.to_string(),
            "randn: address 0x208 is not 16-byte aligned"
        );
    }
}
