//! Converting binding arguments and building binding errors: every binding takes its
//! arguments through these helpers, so a wrong type or value gets one message shape naming
//! the function and the argument (`randn: shape element 0 must be an integer, got f64`).

use rhai::{Array, Dynamic, EvalAltResult};

use crate::alloc::AllocError;
use crate::tensor::{shape, DType, TensorError};

/// A binding's error: the function's name and what was wrong.
pub type BindingResult<T> = Result<T, Box<EvalAltResult>>;

/// Builds a script error naming the function.
pub fn fail<T>(function: &str, message: impl std::fmt::Display) -> BindingResult<T> {
    Err(format!("{function}: {message}").into())
}

/// Builds a script error from a tensor-layer error. Out of memory throws an
/// [`OomError`](super::oom_error::OomError), which reads as PyTorch's text unchanged — as
/// Python code reads `str(e)` of `torch.OutOfMemoryError` — followed by gpumem's line saying
/// why; every other error names the function that failed.
pub fn tensor_fail<T>(function: &str, error: TensorError) -> BindingResult<T> {
    match error {
        TensorError::Alloc(AllocError::OutOfMemory(oom)) => {
            Err(super::oom_error::OomError::new(&oom).into_error())
        }
        TensorError::Interrupted => super::control::Stop::Interrupted.error(),
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

/// Reads a number given as an integer or a float. Booleans are refused: `true` is not 1.0.
pub fn number(function: &str, what: &str, value: &Dynamic) -> BindingResult<f64> {
    if let Ok(int) = value.as_int() {
        Ok(int as f64)
    } else if let Ok(float) = value.as_float() {
        Ok(float)
    } else {
        wrong_type(function, what, "a number", value)
    }
}

/// Reads an integer argument. Bindings take integers as `Dynamic` and convert here, so that a
/// float or a bool gets this error naming the function and argument instead of Rhai's
/// "function not found".
pub fn integer(function: &str, what: &str, value: &Dynamic) -> BindingResult<i64> {
    match value.as_int() {
        Ok(int) => Ok(int),
        Err(_) => wrong_type(function, what, "an integer", value),
    }
}

/// Reads a boolean argument (see [`integer`] for why it is taken as `Dynamic`).
pub fn flag(function: &str, what: &str, value: &Dynamic) -> BindingResult<bool> {
    match value.as_bool() {
        Ok(flag) => Ok(flag),
        Err(_) => wrong_type(function, what, "true or false", value),
    }
}

/// The error for an argument of the wrong type: `function: what must be EXPECTED, got TYPE (VALUE)`.
pub fn wrong_type<T>(
    function: &str,
    what: &str,
    expected: &str,
    value: &Dynamic,
) -> BindingResult<T> {
    fail(
        function,
        format!(
            "{what} must be {expected}, got {} ({value})",
            value.type_name()
        ),
    )
}

/// Converts a shape argument — an integer or an array of integers — into dimensions.
pub fn shape_arg(function: &str, value: &Dynamic) -> BindingResult<Vec<usize>> {
    let dims: Vec<i64> = if let Ok(single) = value.as_int() {
        vec![single]
    } else if let Some(array) = value.read_lock::<Array>() {
        let mut dims = Vec::with_capacity(array.len());
        for (index, item) in array.iter().enumerate() {
            match item.as_int() {
                Ok(dim) => dims.push(dim),
                Err(kind) => {
                    return fail(
                        function,
                        format!("shape element {index} must be an integer, got {kind}"),
                    )
                }
            }
        }
        dims
    } else {
        return fail(
            function,
            format!(
                "shape must be an integer or an array of integers, got {}",
                value.type_name()
            ),
        );
    };
    shape::validate(&dims).or_else(|error| fail(function, error))
}

/// Converts a dtype argument.
pub fn dtype_arg(function: &str, name: &str) -> BindingResult<DType> {
    name.parse().or_else(|error| fail(function, error))
}
