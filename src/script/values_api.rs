//! Views and values: `t.reshape(shape)`, `t.slice(dim, start, end)`.

use std::rc::Rc;

use rhai::{Dynamic, Engine, INT};

use super::bindings::{fail, non_negative, BindingResult};
use super::tensor_api::shape_arg;
use crate::tensor::{Runtime, Tensor};

/// Registers view and value functions on tensors.
pub fn register(engine: &mut Engine, _runtime: &Rc<Runtime>) {
    engine.register_fn(
        "reshape",
        |t: &mut Tensor, shape: Dynamic| -> BindingResult<Tensor> {
            let shape = shape_arg("reshape", &shape)?;
            t.reshape(&shape).or_else(|error| fail("reshape", error))
        },
    );
    engine.register_fn(
        "slice",
        |t: &mut Tensor, dim: INT, start: INT, end: INT| -> BindingResult<Tensor> {
            let dim = non_negative("slice", "dim", dim)? as usize;
            let start = non_negative("slice", "start", start)? as usize;
            let end = non_negative("slice", "end", end)? as usize;
            t.slice(dim, start, end)
                .or_else(|error| fail("slice", error))
        },
    );
}
