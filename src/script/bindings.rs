//! Registers every binding scripts see, grouped by topic.

use std::rc::Rc;

use rhai::{Dynamic, Engine, EvalAltResult};

use super::{memory_api, tensor_api, values_api};
use crate::alloc::AllocError;
use crate::tensor::{Runtime, TensorError};

/// A binding's error: the function's name and what was wrong.
pub type BindingResult<T> = Result<T, Box<EvalAltResult>>;

/// Builds a script error naming the function.
pub fn fail<T>(function: &str, message: impl std::fmt::Display) -> BindingResult<T> {
    Err(format!("{function}: {message}").into())
}

/// Builds a script error from a tensor-layer error. PyTorch's out-of-memory text passes through
/// unchanged — scripts read it as Python code reads `str(e)` of `torch.OutOfMemoryError` — while
/// every other error names the function that failed.
pub fn tensor_fail<T>(function: &str, error: TensorError) -> BindingResult<T> {
    match error {
        TensorError::Alloc(AllocError::OutOfMemory(oom)) => Err(oom.message.into()),
        other => fail(function, other),
    }
}

/// Reads an integer argument that must be non-negative.
pub fn non_negative(function: &str, what: &str, value: i64) -> BindingResult<u64> {
    u64::try_from(value).or_else(|_| {
        fail(
            function,
            format!("{what} must be non-negative, got {value}"),
        )
    })
}

/// Reads a number given as an integer or a float.
pub fn number(function: &str, what: &str, value: &Dynamic) -> BindingResult<f64> {
    if let Ok(int) = value.as_int() {
        Ok(int as f64)
    } else if let Ok(float) = value.as_float() {
        Ok(float)
    } else if let Ok(flag) = value.as_bool() {
        Ok(f64::from(u8::from(flag)))
    } else {
        fail(
            function,
            format!("{what} must be a number, got {}", value.type_name()),
        )
    }
}

/// Registers the tensor and memory bindings.
pub fn register(engine: &mut Engine, runtime: &Rc<Runtime>) {
    tensor_api::register(engine, runtime);
    memory_api::register(engine, runtime);
    values_api::register(engine, runtime);
}
