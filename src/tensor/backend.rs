//! How the tensor layer asks a device for values: fills, the random generator, copies,
//! elementwise arithmetic, reductions and reads back to the host.
//!
//! Two implementations exist: [`SimBackend`], which launches nothing and answers reads from
//! what the tensor layer recorded about a storage ([`Contents`]) with the CPU twin of the
//! generator, and the CUDA one (`cuda_backend`), which runs NVRTC-compiled kernels.

use super::convert::stored_value;
use super::philox;
use super::{Contents, DType, TensorError};
use crate::device::DeviceSpan;

/// A contiguous run of elements on the device, with what is known about them: the elements a
/// tensor view covers, borrowed from its storage for as long as the span lives. Made only by
/// [`Tensor::span`](super::Tensor::span); the device memory and the element count always agree.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Span<'a> {
    memory: DeviceSpan<'a>,
    numel: usize,
    dtype: DType,
    contents: Contents,
    first: u64,
}

impl<'a> Span<'a> {
    /// The span of `numel` elements of `dtype` in `memory` (exactly their bytes), starting at
    /// element `first` of a storage that holds `contents`.
    pub(super) fn new(
        memory: DeviceSpan<'a>,
        numel: usize,
        dtype: DType,
        contents: Contents,
        first: u64,
    ) -> Result<Span<'a>, TensorError> {
        let bytes = (numel as u64).checked_mul(dtype.size() as u64);
        if bytes != Some(memory.bytes()) {
            return Err(TensorError::OutOfRange(format!(
                "{numel} elements of {dtype} do not fill {} bytes of device memory",
                memory.bytes()
            )));
        }
        Ok(Span {
            memory,
            numel,
            dtype,
            contents,
            first,
        })
    }

    /// The `count` elements after the first `skip` of this span (the last values a display
    /// shows), borrowed from the same storage; an error when they do not lie inside it.
    pub fn elements(&self, skip: usize, count: usize) -> Result<Span<'a>, TensorError> {
        let width = self.dtype.size() as u64;
        let outside = || {
            TensorError::OutOfRange(format!(
                "elements {skip} .. {skip} + {count} of a span of {}",
                self.numel
            ))
        };
        let offset = (skip as u64).checked_mul(width).ok_or_else(outside)?;
        let bytes = (count as u64).checked_mul(width).ok_or_else(outside)?;
        let memory = self.memory.part(offset, bytes).map_err(|_| outside())?;
        Span::new(
            memory,
            count,
            self.dtype,
            self.contents,
            self.first + skip as u64,
        )
    }

    /// The elements' device memory, borrowed from the storage.
    pub fn memory(&self) -> DeviceSpan<'a> {
        self.memory
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.numel
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// What the storage holds.
    pub fn contents(&self) -> Contents {
        self.contents
    }

    /// Index of the first element within its storage (views start part-way in).
    pub fn first(&self) -> u64 {
        self.first
    }
}

/// Elementwise arithmetic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryOp {
    /// `a + b`
    Add,
    /// `a - b`
    Sub,
    /// `a * b`
    Mul,
    /// `a / b`
    Div,
}

impl BinaryOp {
    /// The operator's symbol, for messages.
    pub fn symbol(self) -> &'static str {
        match self {
            BinaryOp::Add => "+",
            BinaryOp::Sub => "-",
            BinaryOp::Mul => "*",
            BinaryOp::Div => "/",
        }
    }
}

/// One side of an elementwise operation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Operand<'a> {
    /// A tensor of the result's shape.
    Tensor(Span<'a>),
    /// A number broadcast to every element.
    Scalar(f64),
}

/// Reductions over every element.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduction {
    /// Sum of the elements.
    Sum,
    /// Arithmetic mean.
    Mean,
    /// Standard deviation with Bessel's correction (PyTorch's default, `correction=1`).
    Std,
}

impl Reduction {
    /// The method's name, for messages.
    pub fn name(self) -> &'static str {
        match self {
            Reduction::Sum => "sum",
            Reduction::Mean => "mean",
            Reduction::Std => "std",
        }
    }
}

/// The device operations tensors need. Everything runs on the current stream
/// ([`Backend::set_stream`]) in launch order, so a result is ready for the next operation on
/// that stream; launches may return before the kernel finishes, reads (`reduce`, `read`) wait
/// for it, and [`Backend::synchronize`] waits for everything.
pub trait Backend {
    /// Sets every element of `dst` to `value` (cast to its dtype).
    fn fill(&self, dst: &Span<'_>, value: f64) -> Result<(), TensorError>;
    /// Writes generator values `offset .. offset + numel` of the stream `seed` into `dst`.
    fn randn(&self, dst: &Span<'_>, seed: u64, offset: u64) -> Result<(), TensorError>;
    /// Copies `src` into `dst` (same dtype and element count).
    fn copy(&self, dst: &Span<'_>, src: &Span<'_>) -> Result<(), TensorError>;
    /// `out = lhs op rhs` elementwise; at least one operand is a tensor.
    fn binary(
        &self,
        op: BinaryOp,
        lhs: Operand<'_>,
        rhs: Operand<'_>,
        out: &Span<'_>,
    ) -> Result<(), TensorError>;
    /// Reduces every element of `src` to one number.
    fn reduce(&self, op: Reduction, src: &Span<'_>) -> Result<f64, TensorError>;
    /// The first `count` elements of `src`, as numbers.
    fn read(&self, src: &Span<'_>, count: usize) -> Result<Vec<f64>, TensorError>;
    /// Waits until every operation launched so far has finished (`torch.cuda.synchronize()`).
    /// Nothing is ever pending on the simulated device.
    fn synchronize(&self) -> Result<(), TensorError> {
        Ok(())
    }
    /// Sends the operations from now on to the allocator's stream `stream` (0: the default
    /// stream), the device's current stream. The simulated device runs nothing, so has nothing
    /// to send.
    fn set_stream(&self, stream: u64) {
        let _ = stream;
    }
}

/// The simulated device's backend: nothing runs, values come from [`Contents`].
#[derive(Debug, Clone, Copy, Default)]
pub struct SimBackend;

/// Why the simulated device cannot produce values of `contents`.
fn unreadable(contents: Contents) -> TensorError {
    match contents {
        Contents::Uninitialized => TensorError::Unsupported(
            "the tensor was created with empty() and holds no defined values".into(),
        ),
        _ => TensorError::Unsupported(
            "values of computed tensors are only available on a CUDA device".into(),
        ),
    }
}

/// The first `count` values of `span` computed from its recorded contents, where the CPU
/// can compute them (generator output and constants).
pub fn values_from_contents(span: &Span, count: usize) -> Result<Vec<f64>, TensorError> {
    let count = count.min(span.numel);
    match span.contents {
        Contents::Constant(value) => Ok(vec![stored_value(span.dtype, value); count]),
        Contents::Normal { seed, offset } => {
            let mut values = vec![0f32; count];
            philox::fill_normals(seed, offset + span.first, &mut values);
            Ok(values
                .into_iter()
                .map(|value| stored_value(span.dtype, f64::from(value)))
                .collect())
        }
        other => Err(unreadable(other)),
    }
}

/// Most values the simulated device regenerates on the CPU for one reduction (the seed's
/// 240,000,000-element tensor takes a few seconds); beyond this a reduction is refused rather
/// than left running for minutes where Ctrl-C cannot reach it.
pub const MAX_SIM_REDUCTION_VALUES: usize = 1 << 28;

/// Values regenerated between two checks for an interruption (a few milliseconds' work).
const REDUCTION_CHUNK: u64 = 1 << 20;

/// A reduction of `span` computed from its recorded contents.
pub fn reduce_from_contents(op: Reduction, span: &Span) -> Result<f64, TensorError> {
    let n = span.numel as f64;
    let (sum, squares) = match span.contents {
        Contents::Constant(value) => {
            // Closed form: a sum of squares would leave rounding noise in the variance of
            // values that are all equal.
            let value = stored_value(span.dtype, value);
            return Ok(match op {
                Reduction::Sum => value * n,
                Reduction::Mean if span.numel == 0 => f64::NAN,
                Reduction::Mean => value,
                Reduction::Std if n < 2.0 => f64::NAN,
                Reduction::Std => 0.0,
            });
        }
        Contents::Normal { .. } if span.numel > MAX_SIM_REDUCTION_VALUES => {
            return Err(TensorError::Unsupported(format!(
                "{}() over {} generated values is too slow to recompute on the simulated device (at most {MAX_SIM_REDUCTION_VALUES}); reduce a slice, or use a CUDA device",
                op.name(),
                span.numel
            )))
        }
        // Standard normal values have a mean near zero, so the one-pass sum of squares does
        // not cancel.
        // Regenerated in chunks, between which a Ctrl-C can stop it.
        Contents::Normal { seed, offset } => {
            let (mut sum, mut squares) = (0f64, 0f64);
            let (first, total) = (offset + span.first, span.numel as u64);
            let mut done = 0;
            while done < total {
                super::interrupt::check()?;
                let count = (total - done).min(REDUCTION_CHUNK);
                philox::for_each_normal(seed, first + done, count, |value| {
                    let value = stored_value(span.dtype, f64::from(value));
                    sum += value;
                    squares += value * value;
                });
                done += count;
            }
            (sum, squares)
        }
        other => return Err(unreadable(other)),
    };
    Ok(finish_reduction(op, n, sum, squares))
}

/// Turns a sum and a sum of squares over `n` elements into the reduction's result
/// (PyTorch: the mean of nothing and the std of fewer than two elements are NaN).
pub fn finish_reduction(op: Reduction, n: f64, sum: f64, squares: f64) -> f64 {
    match op {
        Reduction::Sum => sum,
        Reduction::Mean => sum / n,
        Reduction::Std if n < 2.0 => f64::NAN,
        Reduction::Std => ((squares - sum * sum / n) / (n - 1.0)).max(0.0).sqrt(),
    }
}

impl Backend for SimBackend {
    fn fill(&self, _dst: &Span, _value: f64) -> Result<(), TensorError> {
        Ok(())
    }

    fn randn(&self, _dst: &Span, _seed: u64, _offset: u64) -> Result<(), TensorError> {
        Ok(())
    }

    fn copy(&self, _dst: &Span, _src: &Span) -> Result<(), TensorError> {
        Ok(())
    }

    fn binary(
        &self,
        _op: BinaryOp,
        _lhs: Operand,
        _rhs: Operand,
        _out: &Span,
    ) -> Result<(), TensorError> {
        Ok(())
    }

    fn reduce(&self, op: Reduction, src: &Span) -> Result<f64, TensorError> {
        reduce_from_contents(op, src)
    }

    fn read(&self, src: &Span, count: usize) -> Result<Vec<f64>, TensorError> {
        values_from_contents(src, count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::AllocConf;
    use crate::device::sim::SimDevice;
    use crate::tensor::{Runtime, Tensor};

    /// Runs `check` on the span of `numel` float32 elements, from element `first` of a storage
    /// on a simulated H200 that holds `contents`.
    fn with_span<R>(
        contents: Contents,
        numel: usize,
        first: usize,
        check: impl FnOnce(&Span<'_>) -> R,
    ) -> R {
        let runtime = Runtime::sim(SimDevice::h200(), AllocConf::default()).expect("runtime");
        let tensor = Tensor::empty(&runtime, &[first + numel], DType::Float32).expect("tensor");
        tensor.storage().set_contents(contents);
        let view = tensor.slice(0, first, first + numel).expect("view");
        check(&view.span().expect("span"))
    }

    #[test]
    fn constants_have_no_rounding_noise() {
        let stored = f64::from(10000.1_f32);
        with_span(Contents::Constant(10000.1), 1_000_000, 0, |constant| {
            assert_eq!(
                reduce_from_contents(Reduction::Std, constant).ok(),
                Some(0.0)
            );
            assert_eq!(
                reduce_from_contents(Reduction::Mean, constant).ok(),
                Some(stored)
            );
        });
        with_span(Contents::Constant(1.0), 0, 0, |empty| {
            assert!(reduce_from_contents(Reduction::Mean, empty).is_ok_and(f64::is_nan));
            assert_eq!(reduce_from_contents(Reduction::Sum, empty).ok(), Some(0.0));
        });
    }

    #[test]
    fn huge_generated_reductions_are_refused_on_sim() {
        let contents = Contents::Normal { seed: 1, offset: 0 };
        with_span(contents, MAX_SIM_REDUCTION_VALUES + 1, 0, |huge| {
            let error = reduce_from_contents(Reduction::Sum, huge).expect_err("refused");
            assert!(error.to_string().contains("too slow"), "{error}");
        });
    }

    #[test]
    fn constants_reduce_in_closed_form() {
        with_span(Contents::Constant(1.0), 10, 0, |ones| {
            assert_eq!(SimBackend.reduce(Reduction::Sum, ones), Ok(10.0));
            assert_eq!(SimBackend.reduce(Reduction::Mean, ones), Ok(1.0));
            assert_eq!(SimBackend.reduce(Reduction::Std, ones), Ok(0.0));
            assert_eq!(SimBackend.read(ones, 3), Ok(vec![1.0; 3]));
        });
    }

    #[test]
    fn normal_values_follow_the_view_offset() {
        let contents = Contents::Normal { seed: 3, offset: 8 };
        let whole = with_span(contents, 16, 0, |span| SimBackend.read(span, 16)).expect("values");
        let view = with_span(contents, 11, 5, |span| {
            assert_eq!(span.first(), 5);
            assert_eq!(span.memory().bytes(), 44);
            SimBackend.read(span, 11)
        });
        assert_eq!(view.expect("values"), whole[5..]);
        let expected = f64::from(philox::normal_at(3, 13));
        assert_eq!(whole[5], expected);
    }

    #[test]
    fn computed_values_are_a_clear_error_on_sim() {
        let error = with_span(Contents::Computed, 4, 0, |span| SimBackend.read(span, 4));
        assert_eq!(
            error,
            Err(TensorError::Unsupported(
                "values of computed tensors are only available on a CUDA device".into()
            ))
        );
        with_span(Contents::Uninitialized, 4, 0, |span| {
            assert!(SimBackend.reduce(Reduction::Sum, span).is_err());
        });
    }
}
