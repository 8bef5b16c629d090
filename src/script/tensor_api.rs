//! Tensor creation and properties: `randn`, `empty`, `zeros`, `ones`, `full`, `t.shape`, ...
//! New tensors go to the current device, as `device="cuda"` does in PyTorch.

use std::rc::Rc;

use rhai::{Array, Dynamic, Engine, ImmutableString, NativeCallContext, INT};

use super::args::{dtype_arg, fail, number, shape_arg, tensor_fail, BindingResult};
use super::history::stamp;
use crate::tensor::{shape, DType, Devices, Runtime, Tensor};

/// A tensor constructor taking a shape and a dtype.
type Maker = fn(&Rc<Runtime>, &[usize], DType) -> Result<Tensor, crate::tensor::TensorError>;

/// The current device, made ready for a tensor of `shape` and `dtype` as PyTorch's allocator
/// readies it ([`Devices::for_allocation`]), with the call's script line stamped on it.
fn device_for(
    function: &str,
    context: &NativeCallContext,
    devices: &Devices,
    shape: &[usize],
    dtype: DType,
) -> BindingResult<Rc<Runtime>> {
    // A shape too large to count fails in the constructor, with its own message, before
    // anything touches the device (as PyTorch refuses it before choosing a device).
    let runtime = if shape::nbytes(shape, dtype.size()).is_ok() {
        devices
            .for_allocation()
            .or_else(|error| tensor_fail(function, error))?
    } else {
        devices.current()
    };
    stamp(context, &runtime);
    Ok(runtime)
}

fn create(
    function: &'static str,
    context: &NativeCallContext,
    devices: &Devices,
    shape: &Dynamic,
    dtype: &str,
    make: Maker,
) -> BindingResult<Tensor> {
    let shape = shape_arg(function, shape)?;
    let dtype = dtype_arg(function, dtype)?;
    let runtime = device_for(function, context, devices, &shape, dtype)?;
    make(&runtime, &shape, dtype).or_else(|error| tensor_fail(function, error))
}

/// Registers creation functions and tensor properties.
pub fn register(engine: &mut Engine, devices: &Rc<Devices>) {
    engine
        .register_type_with_name::<Tensor>("Tensor")
        .register_fn("to_string", |t: &mut Tensor| t.to_string())
        .register_fn("to_debug", |t: &mut Tensor| t.to_string())
        .register_get("shape", |t: &mut Tensor| -> Array {
            t.shape().iter().map(|&d| Dynamic::from(d as INT)).collect()
        })
        .register_get("dtype", |t: &mut Tensor| t.dtype().name().to_string())
        .register_get("numel", |t: &mut Tensor| t.numel() as INT)
        .register_get("nbytes", |t: &mut Tensor| t.nbytes() as INT)
        .register_get("device", |t: &mut Tensor| t.device().to_string())
        .register_get("data_ptr", |t: &mut Tensor| t.data_ptr() as INT);

    let makers: [(&'static str, Maker); 4] = [
        ("randn", Tensor::randn),
        ("empty", Tensor::empty),
        ("zeros", |rt, shape, dtype| {
            Tensor::full(rt, shape, 0.0, dtype)
        }),
        ("ones", |rt, shape, dtype| {
            Tensor::full(rt, shape, 1.0, dtype)
        }),
    ];
    for (name, make) in makers {
        let on = Rc::clone(devices);
        engine.register_fn(name, move |context: NativeCallContext, shape: Dynamic| {
            create(name, &context, &on, &shape, "float32", make)
        });
        let on = Rc::clone(devices);
        engine.register_fn(
            name,
            move |context: NativeCallContext, shape: Dynamic, dtype: ImmutableString| {
                create(name, &context, &on, &shape, &dtype, make)
            },
        );
        // Rhai tries the string overload first; any other dtype argument lands here.
        engine.register_fn(
            name,
            move |shape: Dynamic, dtype: Dynamic| -> BindingResult<Tensor> {
                // `randn(10, 10)`: two sizes where the shape array belongs.
                if let (Ok(first), Ok(second)) = (shape.as_int(), dtype.as_int()) {
                    return fail(name, super::suggest::shape_as_array(name, &[first, second]));
                }
                not_a_dtype(name, &dtype)
            },
        );
    }
    let on = Rc::clone(devices);
    engine.register_fn(
        "full",
        move |context: NativeCallContext, shape: Dynamic, value: Dynamic| {
            full(&context, &on, &shape, &value, "float32")
        },
    );
    let on = Rc::clone(devices);
    engine.register_fn(
        "full",
        move |context: NativeCallContext,
              shape: Dynamic,
              value: Dynamic,
              dtype: ImmutableString| { full(&context, &on, &shape, &value, &dtype) },
    );
    engine.register_fn(
        "full",
        |_: Dynamic, _: Dynamic, dtype: Dynamic| -> BindingResult<Tensor> {
            not_a_dtype("full", &dtype)
        },
    );
}

/// The error for a dtype argument that is not a string.
fn not_a_dtype(function: &str, dtype: &Dynamic) -> BindingResult<Tensor> {
    fail(
        function,
        format!(
            "dtype must be a string such as \"float32\", got {} ({dtype})",
            dtype.type_name()
        ),
    )
}

fn full(
    context: &NativeCallContext,
    devices: &Devices,
    shape: &Dynamic,
    value: &Dynamic,
    dtype: &str,
) -> BindingResult<Tensor> {
    let shape = shape_arg("full", shape)?;
    // A bool fills a bool tensor (`full(3, true, "bool")`), as in PyTorch.
    let value = match value.as_bool() {
        Ok(flag) => f64::from(u8::from(flag)),
        Err(_) => number("full", "fill value", value)?,
    };
    let dtype = dtype_arg("full", dtype)?;
    let runtime = device_for("full", context, devices, &shape, dtype)?;
    Tensor::full(&runtime, &shape, value, dtype).or_else(|error| tensor_fail("full", error))
}
