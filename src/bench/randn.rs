//! `gpumem bench randn`: the generator's throughput on the seed's 915.5 MiB tensor (960,000,000 bytes), timed with
//! CUDA events, next to PyTorch's `normal_` when python3 with torch is available, plus the
//! checks that make the figure meaningful (mean, std, reproducibility, CPU-twin equality).

use std::path::Path;
use std::process::Command;
use std::rc::Rc;

use crate::alloc::AllocConf;
use crate::device::cuda::CudaGpu;
use crate::device::kernels::{RandnFormat, RANDN_F32_DEFAULT, RANDN_F32_VARIANTS};
use crate::tensor::backend::{BinaryOp, Reduction};
use crate::tensor::ops::Arg;
use crate::tensor::{philox, DType, Runtime, Tensor};

/// The seed's tensor: `randn([200, 300, 200, 20])`, 960,000,000 bytes of float32.
pub const SHAPE: [usize; 4] = [200, 300, 200, 20];
/// Values compared with the CPU twin.
pub const TWIN_VALUES: usize = 1_000_000;
/// Tolerance of the twin comparison: |gpu − cpu| ≤ TWIN_TOLERANCE · max(1, |cpu|), i.e.
/// relative for values of magnitude ≥ 1 and absolute below. The generator is built to be
/// bit-identical, so any count above zero is a bug; the tolerance is the bar.
pub const TWIN_TOLERANCE: f64 = 1e-6;
/// Stream indices whose values the bench prints as bits, to pin the device's output in the
/// CPU twin's unit tests (`tensor::philox`): the first eight and the tensor's last four.
const PINNED_HEAD: usize = 8;
const PINNED_TAIL: usize = 4;

fn bench_error(error: impl std::fmt::Display) -> String {
    error.to_string()
}

/// How the device's first values compare with the CPU twin's.
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

/// `count` values of `tensor` from flat index `first`, as float32.
fn values(tensor: &Tensor, first: usize, count: usize) -> Result<Vec<f32>, String> {
    let values = tensor
        .reshape(&[tensor.numel()])
        .and_then(|flat| flat.slice(0, first, first + count))
        .and_then(|part| part.to_values())
        .map_err(bench_error)?;
    // The tensor is float32: each f64 holds a float32 exactly.
    Ok(values.into_iter().map(|value| value as f32).collect())
}

/// Compares the first `twin.len()` values of `tensor` with `twin`.
fn compare_with_twin(tensor: &Tensor, twin: &[f32]) -> Result<TwinComparison, String> {
    let head = values(tensor, 0, twin.len())?;
    let mut comparison = TwinComparison {
        not_identical: 0,
        over_tolerance: 0,
        worst_relative: 0.0,
        worst_mixed: 0.0,
    };
    for (&gpu_value, &cpu_value) in head.iter().zip(twin) {
        if gpu_value.to_bits() != cpu_value.to_bits() {
            comparison.not_identical += 1;
        }
        let (gpu_value, cpu_value) = (f64::from(gpu_value), f64::from(cpu_value));
        let diff = (gpu_value - cpu_value).abs();
        let mixed = diff / cpu_value.abs().max(1.0);
        comparison.worst_mixed = comparison.worst_mixed.max(mixed);
        if cpu_value != 0.0 {
            comparison.worst_relative = comparison.worst_relative.max(diff / cpu_value.abs());
        }
        if mixed > TWIN_TOLERANCE {
            comparison.over_tolerance += 1;
        }
    }
    Ok(comparison)
}

/// Runs the benchmark on CUDA device `index` and returns the report, one fact per line.
pub fn randn(index: usize, reps: u32, torch_script: &Path) -> Result<String, String> {
    let gpu = CudaGpu::open(index)?;
    let runtime = Runtime::cuda(Rc::clone(&gpu), AllocConf::default()).map_err(bench_error)?;
    let mut out = Vec::new();
    let (major, minor) = gpu.compute_capability();
    out.push(format!(
        "device: cuda:{index} ({}, sm_{major}{minor})",
        gpu.name()
    ));

    let seed = 1234;
    runtime.manual_seed(seed);
    let tensor = Tensor::randn(&runtime, &SHAPE, DType::Float32).map_err(bench_error)?;
    let n = tensor.numel() as u64;
    out.push(format!(
        "tensor: randn({SHAPE:?}) float32, {} bytes",
        tensor.nbytes()
    ));
    let kernels = gpu.kernels().map_err(bench_error)?;
    let mut twin = vec![0f32; TWIN_VALUES];
    philox::fill_normals(seed, 0, &mut twin);
    let mut default_tbps = 0f64;
    for (index, variant) in RANDN_F32_VARIANTS.iter().enumerate() {
        let format = RandnFormat::F32Variant(index);
        let ms = kernels
            .time_randn(format, tensor.data_ptr(), n, seed, reps)
            .map_err(bench_error)?;
        let tbps = tensor.nbytes() as f64 / (ms * 1e-3) / 1e12;
        let twin_note = if variant.twin {
            let comparison = compare_with_twin(&tensor, &twin)?;
            format!(
                "twin: {} of the first {TWIN_VALUES} values not bit-identical, max rel err {:.3e}",
                comparison.not_identical, comparison.worst_relative
            )
        } else {
            "previous generator, timing reference (no CPU twin)".to_string()
        };
        let marker = if index == RANDN_F32_DEFAULT {
            default_tbps = tbps;
            " [used by randn]"
        } else {
            ""
        };
        out.push(format!(
            "gpumem {}: {ms:.4} ms per call, {tbps:.3} TB/s ({reps} reps after warm-up, CUDA events); {twin_note}{marker}",
            variant.name
        ));
    }
    // Timing overwrote the tensor: write the values randn gives again.
    kernels
        .randn(RandnFormat::F32, tensor.data_ptr(), n, seed, 0)
        .map_err(bench_error)?;
    out.push(format!("gpumem_tbps={default_tbps:.3}"));
    out.push(torch_figure(torch_script, reps));

    let mean = tensor.reduce(Reduction::Mean).map_err(bench_error)?;
    let std = tensor.reduce(Reduction::Std).map_err(bench_error)?;
    out.push(format!("mean={mean:.6} std={std:.6}"));

    let comparison = compare_with_twin(&tensor, &twin)?;
    out.push(format!(
        "twin: first {TWIN_VALUES} values, {} not bit-identical, max |gpu-cpu|/|cpu| = {:.3e}, max |gpu-cpu|/max(1,|cpu|) = {:.3e}, {} beyond {TWIN_TOLERANCE:e}",
        comparison.not_identical,
        comparison.worst_relative,
        comparison.worst_mixed,
        comparison.over_tolerance
    ));
    out.push(format!("twin_not_identical={}", comparison.not_identical));
    out.push(format!("twin_over={}", comparison.over_tolerance));
    let numel = tensor.numel();
    for (first, count) in [(0, PINNED_HEAD), (numel - PINNED_TAIL, PINNED_TAIL)] {
        let bits = values(&tensor, first, count)?
            .iter()
            .map(|value| format!("{:#010x}", value.to_bits()))
            .collect::<Vec<_>>();
        out.push(format!(
            "pinned seed={seed} first={first}: {}",
            bits.join(" ")
        ));
    }

    runtime.manual_seed(seed);
    let again = Tensor::randn(&runtime, &SHAPE, DType::Float32).map_err(bench_error)?;
    // Same seed, same values: their difference must be exactly zero everywhere.
    let difference = Tensor::binary(BinaryOp::Sub, Arg::Tensor(&again), Arg::Tensor(&tensor))
        .map_err(bench_error)?;
    let (sum, std) = (
        difference.reduce(Reduction::Sum).map_err(bench_error)?,
        difference.reduce(Reduction::Std).map_err(bench_error)?,
    );
    let repeat_sum = tensor.reduce(Reduction::Sum).map_err(bench_error)?
        == tensor.reduce(Reduction::Sum).map_err(bench_error)?;
    out.push(format!(
        "reproducible={}",
        if sum == 0.0 && std == 0.0 {
            "yes"
        } else {
            "no"
        }
    ));
    out.push(format!(
        "deterministic_sum={}",
        if repeat_sum { "yes" } else { "no" }
    ));
    Ok(out.join("\n"))
}

/// PyTorch's figure from `torch_script`, or why there is none.
fn torch_figure(torch_script: &Path, reps: u32) -> String {
    if !torch_script.exists() {
        return format!(
            "PyTorch: not measured ({} not found)",
            torch_script.display()
        );
    }
    match Command::new("python3")
        .arg(torch_script)
        .arg(reps.to_string())
        .output()
    {
        Ok(output) if output.status.success() => format!(
            "PyTorch normal_: {}",
            String::from_utf8_lossy(&output.stdout).trim()
        ),
        Ok(output) => format!(
            "PyTorch: not measured ({})",
            String::from_utf8_lossy(&output.stderr)
                .lines()
                .last()
                .unwrap_or("python3 failed")
        ),
        Err(error) => format!("PyTorch: not measured (cannot run python3: {error})"),
    }
}
