//! The CUDA implementation of [`Backend`]: maps tensor operations onto the kernels of
//! `device::cuda::kernels` for the session's GPU. Every operation first makes the GPU's primary
//! context current on the calling thread (`CudaGpu::activate_on`) and goes to the current
//! stream ([`Backend::set_stream`]), as PyTorch launches kernels on `current_stream()`.

use std::cell::Cell;
use std::sync::Arc;

use super::backend::{finish_reduction, Backend, BinaryOp, Operand, Reduction, Span};
use super::convert::{decode, fill_pattern};
use super::{DType, TensorError};
use crate::device::cuda::kernels::{ElementwiseOp, Kernels, Operands, RandnFormat};
use crate::device::cuda::{CudaGpu, Current};

/// Runs tensor operations on a CUDA GPU.
pub struct CudaBackend {
    gpu: Arc<CudaGpu>,
    /// The allocator's id of the stream operations go to (0: the legacy default stream).
    stream: Cell<u64>,
}

impl CudaBackend {
    /// A backend on `gpu` (the same process-wide handle the allocator's device uses), on the
    /// default stream.
    pub fn new(gpu: Arc<CudaGpu>) -> CudaBackend {
        CudaBackend {
            gpu,
            stream: Cell::new(0),
        }
    }

    /// The context made current on this thread, on the current stream.
    fn current(&self) -> Result<Current<'_>, TensorError> {
        Ok(self.gpu.activate_on(self.stream.get())?)
    }

    /// [`CudaBackend::current`], and the kernels (compiled on first use).
    fn kernels(&self) -> Result<(Current<'_>, &Kernels), TensorError> {
        let current = self.current()?;
        Ok((current, self.gpu.kernels()?))
    }
}

/// Copies `src`, on the GPU `from`, into `dst` on the GPU `to`: `t.to(i)` between CUDA
/// devices. Within one GPU a plain device-to-device copy; between two, `cuMemcpyPeer`, which
/// needs both devices' contexts (the source's exists: it holds the tensor).
pub fn copy_between_gpus(
    to: &Arc<CudaGpu>,
    dst: &Span<'_>,
    from: &Arc<CudaGpu>,
    src: &Span<'_>,
) -> Result<(), TensorError> {
    if Arc::ptr_eq(to, from) {
        return CudaBackend::new(Arc::clone(to)).copy(dst, src);
    }
    if src.memory().bytes() == 0 {
        return Ok(());
    }
    let source = from.context()?;
    let current = to.activate()?;
    current.copy_from_peer(dst.memory(), source, src.memory())?;
    Ok(())
}

/// How randn stores values of `dtype`.
pub fn randn_format(dtype: DType) -> Result<RandnFormat, TensorError> {
    match dtype {
        DType::Float32 => Ok(RandnFormat::F32),
        DType::Float64 => Ok(RandnFormat::F64),
        DType::Float16 => Ok(RandnFormat::F16),
        DType::BFloat16 => Ok(RandnFormat::BF16),
        other => Err(TensorError::Unsupported(format!(
            "randn is only defined for floating dtypes, not {other}"
        ))),
    }
}

fn elementwise(op: BinaryOp) -> ElementwiseOp {
    match op {
        BinaryOp::Add => ElementwiseOp::Add,
        BinaryOp::Sub => ElementwiseOp::Sub,
        BinaryOp::Mul => ElementwiseOp::Mul,
        BinaryOp::Div => ElementwiseOp::Div,
    }
}

fn float32_only(what: &str, span: &Span<'_>) -> Result<(), TensorError> {
    if span.dtype() == DType::Float32 {
        Ok(())
    } else {
        Err(TensorError::Unsupported(format!(
            "{what} on {} tensors is not supported yet (float32 only)",
            span.dtype()
        )))
    }
}

impl Backend for CudaBackend {
    fn synchronize(&self) -> Result<(), TensorError> {
        Ok(self.gpu.synchronize()?)
    }

    fn set_stream(&self, stream: u64) {
        self.stream.set(stream);
    }

    fn fill(&self, dst: &Span<'_>, value: f64) -> Result<(), TensorError> {
        let pattern = fill_pattern(dst.dtype(), value);
        let (current, kernels) = self.kernels()?;
        let width = dst.dtype().size() as u64;
        kernels.fill(&current, dst.memory(), width, pattern)?;
        Ok(())
    }

    fn randn(&self, dst: &Span<'_>, seed: u64, offset: u64) -> Result<(), TensorError> {
        let format = randn_format(dst.dtype())?;
        let (current, kernels) = self.kernels()?;
        kernels.randn(&current, format, dst.memory(), seed, offset)?;
        Ok(())
    }

    fn copy(&self, dst: &Span<'_>, src: &Span<'_>) -> Result<(), TensorError> {
        let current = self.current()?;
        current.copy_device(dst.memory(), src.memory())?;
        Ok(())
    }

    fn binary(
        &self,
        op: BinaryOp,
        lhs: Operand<'_>,
        rhs: Operand<'_>,
        out: &Span<'_>,
    ) -> Result<(), TensorError> {
        let operands = match (lhs, rhs) {
            (Operand::Tensor(a), Operand::Tensor(b)) => {
                float32_only(op.symbol(), &a)?;
                float32_only(op.symbol(), &b)?;
                Operands::Tensors(a.memory(), b.memory())
            }
            (Operand::Tensor(a), Operand::Scalar(s)) => {
                float32_only(op.symbol(), &a)?;
                Operands::TensorScalar(a.memory(), s as f32)
            }
            (Operand::Scalar(s), Operand::Tensor(b)) => {
                float32_only(op.symbol(), &b)?;
                Operands::ScalarTensor(s as f32, b.memory())
            }
            (Operand::Scalar(_), Operand::Scalar(_)) => {
                return Err(TensorError::Unsupported(format!(
                    "'{}' needs at least one tensor",
                    op.symbol()
                )))
            }
        };
        float32_only(op.symbol(), out)?;
        let (current, kernels) = self.kernels()?;
        kernels.binary_f32(&current, elementwise(op), operands, out.memory())?;
        Ok(())
    }

    fn reduce(&self, op: Reduction, src: &Span<'_>) -> Result<f64, TensorError> {
        float32_only(op.name(), src)?;
        let (current, kernels) = self.kernels()?;
        let n = src.numel() as u64;
        let (sum, squares) = kernels.moments_f32(&current, src.memory(), 0.0)?;
        if op != Reduction::Std || n < 2 {
            return Ok(finish_reduction(op, n as f64, sum, squares));
        }
        // Second pass around the mean, so a large mean does not cancel the variance away.
        let mean = sum / n as f64;
        let (shifted_sum, shifted_squares) = kernels.moments_f32(&current, src.memory(), mean)?;
        Ok(finish_reduction(
            Reduction::Std,
            n as f64,
            shifted_sum,
            shifted_squares,
        ))
    }

    fn read(&self, src: &Span<'_>, count: usize) -> Result<Vec<f64>, TensorError> {
        let current = self.current()?;
        let count = count.min(src.numel());
        let mut bytes = vec![0u8; count * src.dtype().size()];
        current.copy_to_host(&mut bytes, src.memory())?;
        Ok(decode(src.dtype(), &bytes))
    }
}
