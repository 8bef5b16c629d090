//! Value operations on tensors: copies, elementwise arithmetic, reductions and reads. Each
//! allocates through the caching allocator like any tensor and asks the runtime's backend to
//! compute; the contents it records let the simulated device answer reads where it can.

use std::rc::Rc;

use super::backend::{BinaryOp, Operand, Reduction};
use super::{Contents, DType, Runtime, Tensor, TensorError};

/// The most elements `to_array()` copies to the host (4 MB of float32): larger reads are
/// refused with a message rather than building a huge script array.
pub const MAX_HOST_ELEMENTS: usize = 1_000_000;

/// One side of an elementwise operation as a caller gives it.
#[derive(Clone, Copy)]
pub enum Arg<'a> {
    /// A tensor.
    Tensor(&'a Tensor),
    /// A number.
    Scalar(f64),
}

/// A number as a display shows it: integers plainly, floats with four decimals.
pub fn format_value(dtype: DType, value: f64) -> String {
    match dtype {
        DType::Bool => (value != 0.0).to_string(),
        dtype if !dtype.is_float() => format!("{value:.0}"),
        _ => format!("{value:.4}"),
    }
}

/// A tensor of at most this many elements shows every value in its display.
pub const DISPLAY_ALL_UP_TO: usize = 10;
/// A larger tensor shows this many values at each end (PyTorch's print option `edgeitems`,
/// 3 by default), with `...` between.
pub const DISPLAY_EDGE_ITEMS: usize = 3;

/// The values a tensor's display shows: every value of a small tensor, or the first and the
/// last [`DISPLAY_EDGE_ITEMS`] of a larger one.
#[derive(Debug, Clone, PartialEq)]
pub enum ShownValues {
    /// Every value.
    All(Vec<f64>),
    /// The first and the last few.
    Ends(Vec<f64>, Vec<f64>),
}

impl Tensor {
    /// What the display shows of the values ([`ShownValues`]), when the device can read them.
    pub fn shown_values(&self) -> Option<ShownValues> {
        let numel = self.numel();
        if numel <= DISPLAY_ALL_UP_TO {
            return self.leading_values(numel).map(ShownValues::All);
        }
        let head = self.leading_values(DISPLAY_EDGE_ITEMS)?;
        let skipped = numel - DISPLAY_EDGE_ITEMS;
        // Views are contiguous, so the last elements are one span at the end of this one.
        let full = self.span().ok()?;
        let tail = full.elements(skipped, DISPLAY_EDGE_ITEMS).ok()?;
        let tail = self
            .runtime()
            .backend()
            .read(&tail, DISPLAY_EDGE_ITEMS)
            .ok()?;
        Some(ShownValues::Ends(head, tail))
    }

    /// The first `count` values, when the device can read them; `None` for `empty` tensors,
    /// zero-element tensors, and on sim for values it cannot compute.
    pub fn leading_values(&self, count: usize) -> Option<Vec<f64>> {
        if self.numel() == 0 || self.storage.contents() == Contents::Uninitialized {
            return None;
        }
        self.runtime().finish_current_stream().ok()?;
        self.runtime()
            .backend()
            .read(&self.span().ok()?, count.min(self.numel()))
            .ok()
    }

    /// Every value, copied to the host; refused above [`MAX_HOST_ELEMENTS`].
    pub fn to_values(&self) -> Result<Vec<f64>, TensorError> {
        if self.numel() > MAX_HOST_ELEMENTS {
            return Err(TensorError::Unsupported(format!(
                "the tensor has {} elements; at most {MAX_HOST_ELEMENTS} can be copied to the host \
                 (read part of it, e.g. t.reshape(t.numel).slice(0, 0, 1000).to_array())",
                self.numel()
            )));
        }
        self.runtime().finish_current_stream()?;
        self.runtime().backend().read(&self.span()?, self.numel())
    }

    /// The single value of a one-element tensor (`t.item()`).
    pub fn item(&self) -> Result<f64, TensorError> {
        if self.numel() != 1 {
            return Err(TensorError::BadShape(format!(
                "item() needs a tensor with exactly one element, this one has {}",
                self.numel()
            )));
        }
        self.runtime().finish_current_stream()?;
        let values = self.runtime().backend().read(&self.span()?, 1)?;
        values
            .first()
            .copied()
            .ok_or_else(|| TensorError::Unsupported("the device returned no value".into()))
    }

    /// A new tensor with its own storage holding the same values (`t.clone()`).
    pub fn clone_values(&self) -> Result<Tensor, TensorError> {
        let runtime = Rc::clone(self.runtime());
        let copy = Tensor::empty(&runtime, &self.shape, self.dtype)?;
        runtime.backend().copy(&copy.span()?, &self.span()?)?;
        copy.storage.set_contents(self.contents_of_copy());
        Ok(copy)
    }

    /// This tensor's values in a new tensor on `runtime`'s device, or this tensor itself when
    /// it is there already (PyTorch's `t.to(device)` returns `t` then). Views copy only their
    /// own elements. [`super::Devices::copy_to`] adds PyTorch's device selection around it.
    pub fn to_runtime(&self, runtime: &Rc<Runtime>) -> Result<Tensor, TensorError> {
        if Rc::ptr_eq(self.runtime(), runtime) {
            return Ok(self.clone());
        }
        let copy = Tensor::empty(runtime, &self.shape, self.dtype)?;
        runtime.copy_from(&copy.span()?, self.runtime(), &self.span()?)?;
        copy.storage.set_contents(self.contents_of_copy());
        Ok(copy)
    }

    /// What a copy of this view holds: the same contents, with a generated view's offset
    /// moved in (the copy starts at element 0 of its storage).
    fn contents_of_copy(&self) -> Contents {
        match self.storage.contents() {
            Contents::Normal { seed, offset } => Contents::Normal {
                seed,
                offset: offset + self.offset as u64,
            },
            other => other,
        }
    }

    /// `lhs op rhs` into a new tensor: float32 tensors of equal shape, or a tensor and a number.
    pub fn binary(op: BinaryOp, lhs: Arg<'_>, rhs: Arg<'_>) -> Result<Tensor, TensorError> {
        let template = match (lhs, rhs) {
            (Arg::Tensor(tensor), _) | (_, Arg::Tensor(tensor)) => tensor,
            (Arg::Scalar(_), Arg::Scalar(_)) => {
                return Err(TensorError::Unsupported(format!(
                    "'{}' needs at least one tensor",
                    op.symbol()
                )))
            }
        };
        for arg in [lhs, rhs] {
            if let Arg::Tensor(tensor) = arg {
                if tensor.dtype != DType::Float32 {
                    return Err(TensorError::Unsupported(format!(
                        "'{}' on {} tensors is not supported yet (float32 only)",
                        op.symbol(),
                        tensor.dtype
                    )));
                }
                if tensor.shape != template.shape {
                    return Err(TensorError::BadShape(format!(
                        "'{}' needs tensors of equal shape, got {:?} and {:?}",
                        op.symbol(),
                        template.shape,
                        tensor.shape
                    )));
                }
                if !Rc::ptr_eq(tensor.runtime(), template.runtime()) {
                    return Err(TensorError::Unsupported(
                        "tensors of different sessions cannot be combined".into(),
                    ));
                }
            }
        }
        let runtime = Rc::clone(template.runtime());
        let out = Tensor::empty(&runtime, &template.shape, DType::Float32)?;
        fn operand(arg: Arg<'_>) -> Result<Operand<'_>, TensorError> {
            match arg {
                Arg::Tensor(tensor) => tensor.span().map(Operand::Tensor),
                Arg::Scalar(value) => Ok(Operand::Scalar(value)),
            }
        }
        runtime
            .backend()
            .binary(op, operand(lhs)?, operand(rhs)?, &out.span()?)?;
        out.storage.set_contents(Contents::Computed);
        Ok(out)
    }

    /// Reduces every element to one number (`sum`, `mean`, `std`); float32 only for now.
    pub fn reduce(&self, op: Reduction) -> Result<f64, TensorError> {
        if self.dtype != DType::Float32 {
            return Err(TensorError::Unsupported(format!(
                "{}() of {} tensors is not supported yet (float32 only)",
                op.name(),
                self.dtype
            )));
        }
        self.runtime().finish_current_stream()?;
        self.runtime().backend().reduce(op, &self.span()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::AllocConf;
    use crate::device::sim::SimDevice;
    use crate::tensor::{philox, Runtime};

    fn runtime() -> Rc<Runtime> {
        Runtime::sim(SimDevice::h200(), AllocConf::default()).expect("runtime")
    }

    #[test]
    fn sim_reads_generated_values_through_the_twin() {
        let rt = runtime();
        rt.manual_seed(5);
        let first = Tensor::randn(&rt, &[3], DType::Float32).expect("randn");
        let second = Tensor::randn(&rt, &[2, 2], DType::Float32).expect("randn");
        assert_eq!(
            first.to_values().expect("values"),
            (0..3)
                .map(|i| f64::from(philox::normal_at(5, i)))
                .collect::<Vec<_>>()
        );
        // The second tensor starts on the next block of four.
        assert_eq!(
            second.to_values().expect("values")[0],
            f64::from(philox::normal_at(5, 4))
        );
        let view = second
            .reshape(&[4])
            .and_then(|t| t.slice(0, 1, 2))
            .expect("view");
        assert_eq!(
            view.item().expect("item"),
            f64::from(philox::normal_at(5, 5))
        );
        let copy = view.clone_values().expect("clone");
        assert_eq!(copy.item(), view.item());
        assert!(first.to_string().contains(", ["), "{first}");
    }

    #[test]
    fn arithmetic_allocates_and_is_unreadable_on_sim() {
        let rt = runtime();
        let a = Tensor::full(&rt, &[4], 2.0, DType::Float32).expect("full");
        assert_eq!(a.reduce(Reduction::Sum), Ok(8.0));
        let before = rt.allocator().stats().allocation.all.current;
        let b = Tensor::binary(BinaryOp::Mul, Arg::Tensor(&a), Arg::Scalar(3.0)).expect("mul");
        assert_eq!(rt.allocator().stats().allocation.all.current, before + 1);
        assert!(b.to_values().is_err());
        assert!(!b.to_string().contains(", ["));
        let other = Tensor::full(&rt, &[5], 1.0, DType::Float32).expect("full");
        assert!(Tensor::binary(BinaryOp::Add, Arg::Tensor(&a), Arg::Tensor(&other)).is_err());
        let ints = Tensor::full(&rt, &[4], 1.0, DType::Int32).expect("full");
        assert!(ints.reduce(Reduction::Mean).is_err());
        assert_eq!(ints.to_values(), Ok(vec![1.0; 4]));
    }

    #[test]
    fn item_needs_one_element() {
        let rt = runtime();
        let a = Tensor::full(&rt, &[2], 1.0, DType::Float32).expect("full");
        assert!(a.item().is_err());
    }
}
