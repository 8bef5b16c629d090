//! `gpumem bench randn`: the generator's throughput on the seed's 918 MiB tensor, timed with
//! CUDA events, next to PyTorch's `normal_` when python3 with torch is available, plus the
//! checks that make the figure meaningful (mean, std, reproducibility, CPU-twin equality).

use std::path::Path;
use std::process::Command;
use std::rc::Rc;

use crate::alloc::{AllocConf, CachingAllocator};
use crate::device::cuda::{CudaDevice, CudaGpu};
use crate::device::kernels::{RandnFormat, RANDN_F32_DEFAULT, RANDN_F32_VARIANTS};
use crate::tensor::backend::{BinaryOp, Reduction};
use crate::tensor::cuda_backend::CudaBackend;
use crate::tensor::ops::Arg;
use crate::tensor::{philox, DType, Runtime, Tensor};

/// The seed's tensor: `randn([200, 300, 200, 20])`, 960,000,000 bytes of float32.
pub const SHAPE: [usize; 4] = [200, 300, 200, 20];
/// Values compared with the CPU twin.
pub const TWIN_VALUES: usize = 1_000_000;
/// Tolerance of the twin comparison: |gpu − cpu| ≤ TWIN_TOLERANCE · max(1, |cpu|), i.e.
/// relative for values of magnitude ≥ 1 and absolute below (Box-Muller values near zero come
/// from r·cos near a zero of cos, where a relative bound would measure the cosine's ulp).
pub const TWIN_TOLERANCE: f64 = 1e-6;

fn bench_error(error: impl std::fmt::Display) -> String {
    error.to_string()
}

/// Compares the first [`TWIN_VALUES`] values of `tensor` with `twin`: (largest
/// |gpu − cpu| / max(1, |cpu|), largest |gpu − cpu| / |cpu|, count beyond the tolerance).
fn twin_mismatches(tensor: &Tensor, twin: &[f32]) -> Result<(f64, f64, usize), String> {
    let head = tensor
        .reshape(&[tensor.numel()])
        .and_then(|flat| flat.slice(0, 0, twin.len()))
        .and_then(|head| head.to_values())
        .map_err(bench_error)?;
    let (mut worst_mixed, mut worst_relative, mut over) = (0f64, 0f64, 0usize);
    for (&gpu_value, &cpu_value) in head.iter().zip(twin) {
        let cpu_value = f64::from(cpu_value);
        let diff = (gpu_value - cpu_value).abs();
        let mixed = diff / cpu_value.abs().max(1.0);
        worst_mixed = worst_mixed.max(mixed);
        if cpu_value != 0.0 {
            worst_relative = worst_relative.max(diff / cpu_value.abs());
        }
        if mixed > TWIN_TOLERANCE {
            over += 1;
        }
    }
    Ok((worst_mixed, worst_relative, over))
}

/// Runs the benchmark on CUDA device `index` and returns the report, one fact per line.
pub fn randn(index: usize, reps: u32, torch_script: &Path) -> Result<String, String> {
    let gpu = CudaGpu::open(index)?;
    let device = CudaDevice::new(Rc::clone(&gpu));
    let allocator =
        CachingAllocator::new(Box::new(device), AllocConf::default()).map_err(bench_error)?;
    let runtime = Runtime::with_backend(allocator, Box::new(CudaBackend::new(Rc::clone(&gpu))));
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
    for (index, (name, _)) in RANDN_F32_VARIANTS.iter().enumerate() {
        let format = RandnFormat::F32Variant(index);
        let ms = kernels
            .time_randn(format, tensor.data_ptr(), n, seed, reps)
            .map_err(bench_error)?;
        let tbps = tensor.nbytes() as f64 / (ms * 1e-3) / 1e12;
        let over = twin_mismatches(&tensor, &twin)?;
        let marker = if index == RANDN_F32_DEFAULT {
            default_tbps = tbps;
            " [used by randn]"
        } else {
            ""
        };
        out.push(format!(
            "gpumem {name}: {ms:.4} ms per call, {tbps:.3} TB/s ({reps} reps after warm-up, CUDA events); twin: {} of the first {TWIN_VALUES} values beyond tolerance{marker}",
            over.2
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

    let (worst_mixed, worst_relative, over) = twin_mismatches(&tensor, &twin)?;
    out.push(format!(
        "twin: first {TWIN_VALUES} values, max |gpu-cpu|/max(1,|cpu|) = {worst_mixed:.3e}, max |gpu-cpu|/|cpu| = {worst_relative:.3e}, {over} beyond {TWIN_TOLERANCE:e}"
    ));
    out.push(format!("twin_over={over}"));

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
