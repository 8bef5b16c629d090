//! Views and values: `t.reshape(shape)`, `t.slice(dim, start, end)`, `t.clone()`,
//! `+ - * /` with tensors or numbers, `t.sum()`, `t.mean()`, `t.std()`, `t.item()`,
//! and `t.to_array()`.

use rhai::{Array, Dynamic, Engine, NativeCallContext, FLOAT, INT};

use super::args::{fail, integer, non_negative, shape_arg, tensor_fail, wrong_type, BindingResult};
use super::history::stamp;
use crate::tensor::backend::{BinaryOp, Reduction};
use crate::tensor::ops::Arg;
use crate::tensor::{DType, Tensor};

/// A value as Rhai sees it: integers for integer dtypes, booleans for bool, floats otherwise.
fn to_dynamic(dtype: DType, value: f64) -> Dynamic {
    match dtype {
        DType::Bool => Dynamic::from(value != 0.0),
        dtype if !dtype.is_float() => Dynamic::from(value as INT),
        _ => Dynamic::from(value as FLOAT),
    }
}

/// Registers `a op b` for tensor ⊕ tensor, tensor ⊕ number and number ⊕ tensor.
fn register_operator(engine: &mut Engine, symbol: &'static str, op: BinaryOp) {
    let run = move |context: &NativeCallContext,
                    tensor: &Tensor,
                    lhs: Arg<'_>,
                    rhs: Arg<'_>|
          -> BindingResult<Tensor> {
        stamp(context, tensor.runtime());
        Tensor::binary(op, lhs, rhs).or_else(|error| tensor_fail(symbol, error))
    };
    engine.register_fn(
        symbol,
        move |context: NativeCallContext, a: &mut Tensor, b: Tensor| {
            run(&context, a, Arg::Tensor(a), Arg::Tensor(&b))
        },
    );
    engine.register_fn(
        symbol,
        move |context: NativeCallContext, a: &mut Tensor, b: FLOAT| {
            run(&context, a, Arg::Tensor(a), Arg::Scalar(b))
        },
    );
    engine.register_fn(
        symbol,
        move |context: NativeCallContext, a: &mut Tensor, b: INT| {
            run(&context, a, Arg::Tensor(a), Arg::Scalar(b as f64))
        },
    );
    engine.register_fn(
        symbol,
        move |context: NativeCallContext, a: FLOAT, b: Tensor| {
            run(&context, &b, Arg::Scalar(a), Arg::Tensor(&b))
        },
    );
    engine.register_fn(
        symbol,
        move |context: NativeCallContext, a: INT, b: Tensor| {
            run(&context, &b, Arg::Scalar(a as f64), Arg::Tensor(&b))
        },
    );
    // Rhai tries the typed overloads first; any other right-hand side lands here.
    engine.register_fn(
        symbol,
        move |_: &mut Tensor, b: Dynamic| -> BindingResult<Tensor> {
            wrong_type(symbol, "the right operand", "a tensor or a number", &b)
        },
    );
}

/// Registers view and value functions on tensors.
pub fn register(engine: &mut Engine) {
    engine.register_fn(
        "reshape",
        |t: &mut Tensor, shape: Dynamic| -> BindingResult<Tensor> {
            let shape = shape_arg("reshape", &shape)?;
            t.reshape(&shape).or_else(|error| fail("reshape", error))
        },
    );
    engine.register_fn(
        "slice",
        |t: &mut Tensor, dim: Dynamic, start: Dynamic, end: Dynamic| -> BindingResult<Tensor> {
            let index = |what: &str, value: &Dynamic| -> BindingResult<usize> {
                let value = integer("slice", what, value)?;
                Ok(non_negative("slice", what, value)? as usize)
            };
            let (dim, start, end) = (
                index("dim", &dim)?,
                index("start", &start)?,
                index("end", &end)?,
            );
            t.slice(dim, start, end)
                .or_else(|error| fail("slice", error))
        },
    );
    engine.register_fn(
        "clone",
        |context: NativeCallContext, t: &mut Tensor| -> BindingResult<Tensor> {
            stamp(&context, t.runtime());
            t.clone_values()
                .or_else(|error| tensor_fail("clone", error))
        },
    );
    register_operator(engine, "+", BinaryOp::Add);
    register_operator(engine, "-", BinaryOp::Sub);
    register_operator(engine, "*", BinaryOp::Mul);
    register_operator(engine, "/", BinaryOp::Div);
    for (name, op) in [
        ("sum", Reduction::Sum),
        ("mean", Reduction::Mean),
        ("std", Reduction::Std),
    ] {
        engine.register_fn(name, move |t: &mut Tensor| -> BindingResult<FLOAT> {
            t.reduce(op).or_else(|error| tensor_fail(name, error))
        });
    }
    engine.register_fn("item", |t: &mut Tensor| -> BindingResult<Dynamic> {
        let dtype = t.dtype();
        t.item()
            .map(|value| to_dynamic(dtype, value))
            .or_else(|error| fail("item", error))
    });
    engine.register_fn("to_array", |t: &mut Tensor| -> BindingResult<Array> {
        let dtype = t.dtype();
        t.to_values()
            .map(|values| {
                values
                    .into_iter()
                    .map(|value| to_dynamic(dtype, value))
                    .collect()
            })
            .or_else(|error| fail("to_array", error))
    });
}
