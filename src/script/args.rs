//! Converting binding arguments and building binding errors: every binding takes its
//! arguments through these helpers, so a wrong type or value gets one message shape naming
//! the function and the argument (`randn: shape element 0 must be an integer, got f64`).

use std::rc::Rc;

use rhai::{Array, Dynamic, EvalAltResult, ImmutableString};

use crate::alloc::AllocError;
use crate::tensor::{shape, DType, Devices, Runtime, TensorError};

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
        TensorError::Interrupted => super::stop::Stop::Interrupted.error(),
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

/// Reads a device argument: an index (`1`), or a name as `t.device` prints it (`"cuda:1"`,
/// `"sim:1"`; a bare `"cuda"` or `"sim"` is the current device, as in PyTorch). An index the
/// session does not have is an error naming how many devices it has.
pub fn device_arg(function: &str, devices: &Devices, value: &Dynamic) -> BindingResult<usize> {
    if let Ok(index) = value.as_int() {
        return devices
            .index_of(index)
            .or_else(|error| fail(function, error));
    }
    if let Some(name) = value
        .read_lock::<ImmutableString>()
        .map(|name| name.to_string())
    {
        return match devices.find(&name) {
            Some(index) => Ok(index),
            None => {
                let names: Vec<String> = devices
                    .all()
                    .iter()
                    .map(|runtime| runtime.device_label().to_string())
                    .collect();
                fail(
                    function,
                    format!(
                        "no device named '{name}': this session's devices are {}",
                        names.join(", ")
                    ),
                )
            }
        };
    }
    wrong_type(
        function,
        "device",
        "a device index or a name such as \"cuda:0\"",
        value,
    )
}

/// The device an optional device argument names, or the current device without one (as
/// torch.cuda's memory functions read `device=None`).
pub fn device_or_current(
    function: &str,
    devices: &Devices,
    value: Option<&Dynamic>,
) -> BindingResult<Rc<Runtime>> {
    match value {
        None => Ok(devices.current()),
        Some(value) => {
            let index = device_arg(function, devices, value)?;
            devices.get(index).or_else(|error| fail(function, error))
        }
    }
}
