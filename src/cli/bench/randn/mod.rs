//! `gpumem bench randn`: the generator's throughput on the seed's 915.5 MiB tensor
//! (`randn([200, 300, 200, 20])`, 960,000,000 bytes of float32), timed with CUDA events, for
//! the production kernel and a matrix of candidate kernels, next to PyTorch's `normal_` when
//! python3 with torch is available; plus the checks that make the figures meaningful: every
//! kernel's first 10⁶ values against its own CPU twin, bit for bit; mean and std;
//! reproducibility.
//!
//! The candidates ([`VARIANTS`]) are compiled from their own source ([`source`]:
//! `device::cuda::kernels::RANDN_SOURCE` followed by `variants.cu` and one line per candidate), only
//! by this benchmark; their twins are in [`twins`]. Each is timed in [`PASSES`] passes of
//! `reps` launches after a warm-up, passes interleaved across the candidates, and reported as
//! the median pass with the spread of all passes (a difference between two candidates smaller
//! than their spreads is noise).

#[cfg(test)]
mod host_check;
/// The statistical checks the library's own twin tests use (a test file both crates include).
#[cfg(test)]
#[path = "../../../tensor/philox_stats.rs"]
mod stats;
pub mod twins;

use std::path::Path;
use std::process::Command;
use std::rc::Rc;

use gpumem::device::bench::{
    self as driver, Current, Event, RandnFormat, RandnKernel, RANDN_LAYOUT, RANDN_SOURCE,
};
use gpumem::device::cuda::CudaGpu;
use gpumem::device::DeviceError;
use gpumem::tensor::backend::{BinaryOp, Reduction};
use gpumem::tensor::ops::Arg;
use gpumem::tensor::philox::{self, PHILOX_ROUNDS};
use gpumem::tensor::{DType, Runtime, Tensor};

pub use twins::Transform;

/// The seed's tensor: `randn([200, 300, 200, 20])`, 960,000,000 bytes of float32.
pub const SHAPE: [usize; 4] = [200, 300, 200, 20];
/// Values compared with the CPU twin.
pub const TWIN_VALUES: usize = 1_000_000;
/// Tolerance of the twin comparison: |gpu − cpu| ≤ TWIN_TOLERANCE · max(1, |cpu|), i.e.
/// relative for values of magnitude ≥ 1 and absolute below. The generator is built to be
/// bit-identical, so any count above zero is a bug; the tolerance is the bar.
pub const TWIN_TOLERANCE: f64 = 1e-6;
/// Timing passes over all kernels; each kernel's figure is its median pass.
pub const PASSES: usize = 3;
/// The seed the benchmark generates with.
const SEED: u64 = 1234;
/// Stream indices whose values the bench prints as bits (`pinned` lines): the first eight and
/// the tensor's last four, the values `tensor::philox`'s pinned test holds for the twin.
const PINNED_HEAD: usize = 8;
const PINNED_TAIL: usize = 4;
/// The candidates' CUDA source, compiled after `device::cuda::kernels::RANDN_SOURCE`.
pub const VARIANTS_SOURCE: &str = include_str!("variants.cu");

/// One candidate kernel of the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variant {
    /// The kernel's name.
    pub name: &'static str,
    /// Philox rounds (7 or 10).
    pub rounds: usize,
    /// Philox's multiplies as IMAD.HI + IMAD rather than IMAD.WIDE (`RandnLayout::hilo`).
    pub hilo: bool,
    /// What the Philox words become.
    pub transform: Transform,
    /// Blocks of four values per thread and loop iteration (`RandnLayout::per_thread`).
    pub per_thread: u32,
    /// Evict-first stores (`RandnLayout::streaming`).
    pub streaming: bool,
    /// What the candidate tests, for the report.
    pub about: &'static str,
}

impl Variant {
    /// Whether it generates normals a tensor could use (the diagnostics time one stage alone);
    /// the twins' statistical tests check those.
    #[cfg(test)]
    pub fn is_candidate(&self) -> bool {
        matches!(
            self.transform,
            Transform::BoxMuller | Transform::PreviousBoxMuller
        )
    }

    /// Whether it computes exactly what the production `randn_f32` computes, laid out the same.
    pub fn is_production(&self) -> bool {
        self.transform == Transform::BoxMuller
            && self.rounds == PHILOX_ROUNDS
            && self.hilo == RANDN_LAYOUT.hilo
            && self.per_thread == RANDN_LAYOUT.per_thread
            && self.streaming == RANDN_LAYOUT.streaming
    }

    /// Block `block` of the stream keyed by `seed`, from the CPU twin of this kernel.
    pub fn twin_block(&self, seed: u64, block: u64) -> [f32; 4] {
        self.transform.block(self.rounds, seed, block)
    }

    /// The `RANDN_VARIANT(...)` line that instantiates it in `variants.cu`.
    pub fn cuda_line(&self) -> String {
        format!(
            "RANDN_VARIANT({}, {}, {}, {}, {}, {})",
            self.name,
            self.rounds,
            self.hilo,
            self.transform.code(),
            self.per_thread,
            self.streaming
        )
    }
}

/// A [`Variant`] in one line of the table.
const fn variant(
    name: &'static str,
    rounds: usize,
    hilo: bool,
    transform: Transform,
    per_thread: u32,
    streaming: bool,
    about: &'static str,
) -> Variant {
    Variant {
        name,
        rounds,
        hilo,
        transform,
        per_thread,
        streaming,
        about,
    }
}

/// The benchmark's kernels: the previous production kernel (the baseline), candidates that
/// change one thing at a time, and three diagnostics that time one stage alone.
pub const VARIANTS: [Variant; 12] = [
    variant(
        "p10_v1_x1",
        10,
        false,
        Transform::PreviousBoxMuller,
        1,
        false,
        "baseline: the previous production kernel (Philox4x32-10, Box-Muller v1)",
    ),
    variant(
        "p10_v2_x1",
        10,
        false,
        Transform::BoxMuller,
        1,
        false,
        "Philox4x32-10, Box-Muller v2 (fewer operations, same accuracy)",
    ),
    variant(
        "p10_v2_x2",
        10,
        false,
        Transform::BoxMuller,
        2,
        false,
        "Philox4x32-10, v2, two blocks per thread and iteration",
    ),
    variant(
        "p10hilo_v2_x2",
        10,
        true,
        Transform::BoxMuller,
        2,
        false,
        "as p10_v2_x2 with IMAD.HI + IMAD instead of IMAD.WIDE",
    ),
    variant(
        "p7_v2_x1",
        7,
        false,
        Transform::BoxMuller,
        1,
        false,
        "Philox4x32-7, v2",
    ),
    variant(
        "p7_v2_x2",
        7,
        false,
        Transform::BoxMuller,
        2,
        false,
        "Philox4x32-7, v2, two blocks per thread and iteration",
    ),
    variant(
        "p7hilo_v2_x2",
        7,
        true,
        Transform::BoxMuller,
        2,
        false,
        "as p7_v2_x2 with IMAD.HI + IMAD",
    ),
    variant(
        "p7_v2_x2_cs",
        7,
        false,
        Transform::BoxMuller,
        2,
        true,
        "as p7_v2_x2 with evict-first stores (st.global.cs)",
    ),
    variant(
        "p10_v2_x2_cs",
        10,
        false,
        Transform::BoxMuller,
        2,
        true,
        "as p10_v2_x2 with evict-first stores",
    ),
    variant(
        "diag_p10_uniform",
        10,
        false,
        Transform::Uniform,
        2,
        false,
        "diagnostic: Philox4x32-10 alone (uniforms)",
    ),
    variant(
        "diag_p7_uniform",
        7,
        false,
        Transform::Uniform,
        2,
        false,
        "diagnostic: Philox4x32-7 alone (uniforms)",
    ),
    variant(
        "diag_xorshift_v2",
        10,
        false,
        Transform::XorshiftBoxMuller,
        2,
        false,
        "diagnostic: Box-Muller v2 alone (xorshift words, no multiplies)",
    ),
];

/// The benchmark's CUDA source: the generator, `variants.cu`, and one line per variant.
pub fn source() -> String {
    let lines: Vec<String> = VARIANTS.iter().map(Variant::cuda_line).collect();
    format!("{RANDN_SOURCE}\n{VARIANTS_SOURCE}\n{}\n", lines.join("\n"))
}

fn bench_error(error: impl std::fmt::Display) -> String {
    error.to_string()
}

/// How a kernel's first values compare with a twin's.
#[derive(Debug, Clone, Copy, Default)]
struct TwinComparison {
    /// Values whose float32 bits differ.
    not_identical: usize,
    /// Values beyond [`TWIN_TOLERANCE`].
    over_tolerance: usize,
    /// Largest |gpu − cpu| / |cpu| (over nonzero twin values).
    worst_relative: f64,
    /// Largest |gpu − cpu| / max(1, |cpu|).
    worst_mixed: f64,
}

impl TwinComparison {
    fn of(gpu: &[f32], twin: &[f32]) -> TwinComparison {
        let mut comparison = TwinComparison::default();
        for (&gpu_value, &cpu_value) in gpu.iter().zip(twin) {
            if gpu_value.to_bits() != cpu_value.to_bits() {
                comparison.not_identical += 1;
            }
            let (gpu_value, cpu_value) = (f64::from(gpu_value), f64::from(cpu_value));
            let diff = (gpu_value - cpu_value).abs();
            let mixed = if diff.is_nan() {
                f64::INFINITY
            } else {
                diff / cpu_value.abs().max(1.0)
            };
            comparison.worst_mixed = comparison.worst_mixed.max(mixed);
            if cpu_value != 0.0 {
                comparison.worst_relative = comparison.worst_relative.max(diff / cpu_value.abs());
            }
            if mixed > TWIN_TOLERANCE {
                comparison.over_tolerance += 1;
            }
        }
        comparison
    }

    fn summary(&self, count: usize) -> String {
        if self.not_identical == 0 {
            format!("twin: bit-identical ({count} values)")
        } else {
            format!(
                "twin: {} of {count} values NOT bit-identical, max rel err {:.3e}",
                self.not_identical, self.worst_relative
            )
        }
    }
}

/// `count` float32 values of `tensor` from flat index `first`.
fn values(tensor: &Tensor, first: usize, count: usize) -> Result<Vec<f32>, String> {
    let values = tensor
        .reshape(&[tensor.numel()])
        .and_then(|flat| flat.slice(0, first, first + count))
        .and_then(|part| part.to_values())
        .map_err(bench_error)?;
    // The tensor is float32: each f64 holds a float32 exactly.
    Ok(values.into_iter().map(|value| value as f32).collect())
}

/// The first `count` values of a twin whose block `b` is `block(b)`.
fn twin_values(block: impl Fn(u64) -> [f32; 4], count: usize) -> Vec<f32> {
    let mut values = vec![0f32; count];
    philox::fill_from_blocks(block, 0, &mut values);
    values
}

/// Milliseconds per launch of `launch`, timed with CUDA events around `reps` back-to-back
/// launches.
fn time_launches(
    current: &Current<'_>,
    reps: u32,
    launch: &dyn Fn(&Current<'_>) -> Result<(), DeviceError>,
) -> Result<f64, DeviceError> {
    let start = Event::new(current)?;
    let stop = Event::new(current)?;
    start.record()?;
    for _ in 0..reps {
        launch(current)?;
    }
    stop.record()?;
    stop.synchronize()?;
    Ok(f64::from(stop.elapsed_since(&start)?) / f64::from(reps.max(1)))
}

/// One timed kernel: the production one or a variant.
struct Timed<'a> {
    label: String,
    about: String,
    kernel: &'a RandnKernel,
    /// Milliseconds per launch of each pass.
    passes: Vec<f64>,
}

impl Timed<'_> {
    /// The median pass.
    fn ms(&self) -> f64 {
        let mut sorted = self.passes.clone();
        sorted.sort_by(f64::total_cmp);
        sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN)
    }

    fn tbps(&self, bytes: u64, ms: f64) -> f64 {
        bytes as f64 / (ms * 1e-3) / 1e12
    }
}

/// Runs the benchmark on CUDA device `index` and returns the report, one fact per line (the
/// summary table and the `key=value` lines `tests/gpu/run.sh` reads come last).
/// `runtime` is the session's (on `cuda:index`, under the session's allocator config); the
/// kernels are timed on the same process-wide GPU handle.
pub fn randn(
    runtime: &Rc<Runtime>,
    index: usize,
    reps: u32,
    torch_script: &Path,
) -> Result<String, String> {
    let gpu = CudaGpu::open(index).map_err(bench_error)?;
    let mut out = Vec::new();
    let (major, minor) = gpu.compute_capability();
    out.push(format!(
        "device: cuda:{index} ({}, sm_{major}{minor}, {} multiprocessors)",
        gpu.name(),
        gpu.multiprocessors()
    ));
    out.push(format!(
        "production generator: Philox4x32-{PHILOX_ROUNDS} + Box-Muller v2; randn_f32 layout {RANDN_LAYOUT:?}"
    ));

    runtime.manual_seed(SEED);
    let tensor = Tensor::randn(runtime, &SHAPE, DType::Float32).map_err(bench_error)?;
    let bytes = tensor.nbytes();
    // The tensor's memory, borrowed for every launch below.
    let memory = tensor.span().map_err(bench_error)?.memory();
    out.push(format!("tensor: randn({SHAPE:?}) float32, {bytes} bytes"));

    let current = driver::activate(&gpu).map_err(bench_error)?;
    let production_kernel = driver::production_randn(&gpu).map_err(bench_error)?;
    // The candidates; without them (a bug) the production kernel is still measured.
    let candidates =
        driver::compile_module(&gpu, &source(), "randn_variants.cu").and_then(|module| {
            VARIANTS
                .iter()
                .map(|v| {
                    let function = module.function(v.name)?;
                    RandnKernel::new(function, RandnFormat::F32, gpu.multiprocessors())
                })
                .collect::<Result<Vec<_>, DeviceError>>()
        });
    let (variant_kernels, candidates_compiled) = match candidates {
        Ok(kernels) => (kernels, true),
        Err(error) => {
            out.push(format!("candidates: not compiled: {error}"));
            (Vec::new(), false)
        }
    };

    let production_label = VARIANTS
        .iter()
        .find(|v| v.is_production())
        .map_or("no variant".to_string(), |v| v.name.to_string());
    let mut timed = vec![Timed {
        label: "randn_f32".to_string(),
        about: format!("production kernel (same code as {production_label})"),
        kernel: production_kernel,
        passes: Vec::new(),
    }];
    for (variant, kernel) in VARIANTS.iter().zip(&variant_kernels) {
        timed.push(Timed {
            label: variant.name.to_string(),
            about: variant.about.to_string(),
            kernel,
            passes: Vec::new(),
        });
    }
    // Passes interleaved across kernels, each kernel warmed up before its timed launches.
    for _ in 0..PASSES {
        for entry in &mut timed {
            let launch = |current: &Current<'_>| entry.kernel.launch(current, memory, SEED, 0);
            launch(&current).map_err(bench_error)?;
            let ms = time_launches(&current, reps, &launch).map_err(bench_error)?;
            entry.passes.push(ms);
        }
    }

    // Twin checks: each kernel writes the tensor once more, and its first values are compared
    // with its own twin's.
    let production_twin = twin_values(|b| philox::normal_block(SEED, b), TWIN_VALUES);
    let mut lines = Vec::new();
    let mut variants_not_identical = 0;
    let mut production = TwinComparison::default();
    let mut production_tbps = 0.0;
    for (position, entry) in timed.iter().enumerate() {
        entry
            .kernel
            .launch(&current, memory, SEED, 0)
            .map_err(bench_error)?;
        let gpu_values = values(&tensor, 0, TWIN_VALUES)?;
        let comparison = match position.checked_sub(1).and_then(|i| VARIANTS.get(i)) {
            Some(variant) => {
                let twin = twin_values(|b| variant.twin_block(SEED, b), TWIN_VALUES);
                let comparison = TwinComparison::of(&gpu_values, &twin);
                variants_not_identical += usize::from(comparison.not_identical > 0);
                comparison
            }
            None => {
                production = TwinComparison::of(&gpu_values, &production_twin);
                production
            }
        };
        let ms = entry.ms();
        let tbps = entry.tbps(bytes, ms);
        if position == 0 {
            production_tbps = tbps;
        }
        let (low, high) = entry
            .passes
            .iter()
            .fold((f64::INFINITY, 0f64), |(lo, hi), &p| (lo.min(p), hi.max(p)));
        lines.push(format!(
            "{:<18} {ms:8.4} ms {tbps:6.3} TB/s (passes {low:.4}..{high:.4} ms)  {}  -- {}",
            entry.label,
            comparison.summary(TWIN_VALUES),
            entry.about
        ));
    }

    // The tensor as randn leaves it, for the remaining checks.
    production_kernel
        .launch(&current, memory, SEED, 0)
        .map_err(bench_error)?;
    let mean = tensor.reduce(Reduction::Mean).map_err(bench_error)?;
    let std = tensor.reduce(Reduction::Std).map_err(bench_error)?;
    let numel = tensor.numel();
    let mut pinned = Vec::new();
    let mut tail_identical = true;
    for (first, count) in [(0, PINNED_HEAD), (numel - PINNED_TAIL, PINNED_TAIL)] {
        let gpu_values = values(&tensor, first, count)?;
        let mut twin = vec![0f32; count];
        philox::fill_normals(SEED, first as u64, &mut twin);
        tail_identical &= gpu_values
            .iter()
            .map(|v| v.to_bits())
            .eq(twin.iter().map(|v| v.to_bits()));
        let bits: Vec<String> = gpu_values
            .iter()
            .map(|value| format!("{:#010x}", value.to_bits()))
            .collect();
        pinned.push(format!(
            "pinned rounds={PHILOX_ROUNDS} seed={SEED} first={first}: {}",
            bits.join(" ")
        ));
    }

    runtime.manual_seed(SEED);
    let again = Tensor::randn(runtime, &SHAPE, DType::Float32).map_err(bench_error)?;
    // Same seed, same values: their difference must be exactly zero everywhere.
    let difference = Tensor::binary(BinaryOp::Sub, Arg::Tensor(&again), Arg::Tensor(&tensor))
        .map_err(bench_error)?;
    let (sum, diff_std) = (
        difference.reduce(Reduction::Sum).map_err(bench_error)?,
        difference.reduce(Reduction::Std).map_err(bench_error)?,
    );
    let repeat_sum = tensor.reduce(Reduction::Sum).map_err(bench_error)?
        == tensor.reduce(Reduction::Sum).map_err(bench_error)?;

    let torch = torch_figure(torch_script, reps);
    out.push(format!(
        "kernels: median of {PASSES} passes of {reps} launches after a warm-up, CUDA events; twin: first {TWIN_VALUES} values against the kernel's own CPU twin"
    ));
    out.extend(lines);
    out.push(torch.line.clone());
    out.extend(pinned);
    out.push(format!(
        "twin: first {TWIN_VALUES} values of randn_f32, {} not bit-identical, max |gpu-cpu|/|cpu| = {:.3e}, max |gpu-cpu|/max(1,|cpu|) = {:.3e}, {} beyond {TWIN_TOLERANCE:e}; last {PINNED_TAIL} values {}",
        production.not_identical,
        production.worst_relative,
        production.worst_mixed,
        production.over_tolerance,
        if tail_identical { "identical" } else { "NOT identical" }
    ));
    out.push(format!(
        "compilations: {} (the production kernels and the candidates)",
        driver::compiles(&gpu)
    ));
    out.push(format!("mean={mean:.6} std={std:.6}"));
    out.push(format!("twin_not_identical={}", production.not_identical));
    out.push(format!("twin_over={}", production.over_tolerance));
    out.push(format!(
        "twin_tail_identical={}",
        if tail_identical { "yes" } else { "no" }
    ));
    out.push(format!("variants_not_identical={variants_not_identical}"));
    out.push(format!(
        "candidates_compiled={}",
        if candidates_compiled { "yes" } else { "no" }
    ));
    out.push(format!(
        "reproducible={}",
        if sum == 0.0 && diff_std == 0.0 {
            "yes"
        } else {
            "no"
        }
    ));
    out.push(format!(
        "deterministic_sum={}",
        if repeat_sum { "yes" } else { "no" }
    ));
    match torch.tbps {
        Some(torch_tbps) => out.push(format!(
            "gpumem_tbps={production_tbps:.3} torch_tbps={torch_tbps:.3} ratio={:.2}x",
            production_tbps / torch_tbps
        )),
        None => out.push(format!("gpumem_tbps={production_tbps:.3}")),
    }
    Ok(out.join("\n"))
}

/// PyTorch's side of the comparison.
struct TorchFigure {
    /// The line for the report.
    line: String,
    /// Its TB/s, when measured.
    tbps: Option<f64>,
}

/// PyTorch's figure from `torch_script`, or why there is none.
fn torch_figure(torch_script: &Path, reps: u32) -> TorchFigure {
    let not_measured = |why: String| TorchFigure {
        line: format!("PyTorch: not measured ({why})"),
        tbps: None,
    };
    if !torch_script.exists() {
        return not_measured(format!("{} not found", torch_script.display()));
    }
    match Command::new("python3")
        .arg(torch_script)
        .arg(reps.to_string())
        .output()
    {
        Ok(output) if output.status.success() => {
            let text = String::from_utf8_lossy(&output.stdout).trim().to_string();
            let tbps = text
                .split_whitespace()
                .find_map(|field| field.strip_prefix("torch_tbps="))
                .and_then(|value| value.parse().ok());
            TorchFigure {
                line: format!("PyTorch normal_: {text}"),
                tbps,
            }
        }
        Ok(output) => not_measured(
            String::from_utf8_lossy(&output.stderr)
                .lines()
                .last()
                .unwrap_or("python3 failed")
                .to_string(),
        ),
        Err(error) => not_measured(format!("cannot run python3: {error}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn variant_names_are_unique_and_in_the_source() {
        let names: HashSet<_> = VARIANTS.iter().map(|v| v.name).collect();
        assert_eq!(names.len(), VARIANTS.len());
        let source = source();
        for variant in VARIANTS {
            assert!(source.contains(&format!("RANDN_VARIANT({},", variant.name)));
            assert!(philox::SUPPORTED_ROUNDS.contains(&variant.rounds));
            assert!(variant.per_thread == 1 || variant.per_thread == 2);
        }
    }

    #[test]
    fn the_production_kernel_is_one_of_the_candidates() {
        // The benchmark times the production kernel next to the candidate with the same code,
        // so switching the default (PHILOX_ROUNDS, RANDN_LAYOUT) to another candidate keeps a
        // matching row.
        assert_eq!(VARIANTS.iter().filter(|v| v.is_production()).count(), 1);
        let baseline = VARIANTS[0];
        assert_eq!(baseline.transform, Transform::PreviousBoxMuller);
        assert!(baseline.is_candidate() && !baseline.is_production());
    }

    #[test]
    fn the_production_twin_is_the_production_candidates_twin() {
        let production = VARIANTS
            .iter()
            .find(|v| v.is_production())
            .copied()
            .unwrap_or(VARIANTS[0]);
        for block in [0, 1, 12345, u64::from(u32::MAX) + 3] {
            assert_eq!(
                production.twin_block(SEED, block),
                philox::normal_block(SEED, block)
            );
        }
    }

    #[test]
    fn twin_comparison_counts_differences() {
        let a = [1.0f32, -2.0, 0.5];
        let b = [1.0f32, -2.0000002, 0.5];
        let c = TwinComparison::of(&a, &b);
        assert_eq!(c.not_identical, 1);
        assert_eq!(c.over_tolerance, 0);
        assert!(c.summary(3).contains("NOT bit-identical"));
        assert_eq!(
            TwinComparison::of(&a, &a).summary(3),
            "twin: bit-identical (3 values)"
        );
    }
}
