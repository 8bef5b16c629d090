//! Devices from scripts, named as in `torch.cuda`: `device_count()`, `current_device()`,
//! `set_device(i)`, `with_device(i, || ...)` (`with torch.cuda.device(i):`) and `t.to(i)`.
//! Thin glue over [`Devices`], which also decides when a device's CUDA context is created.

use std::rc::Rc;

use rhai::{Dynamic, Engine, FnPtr, NativeCallContext, INT};

use super::args::{device_arg, fail, tensor_fail, BindingResult};
use super::history::stamp;
use crate::tensor::{Devices, Tensor};

/// `with_device(device, closure)`: calls `closure` with `device` current and returns its
/// value; the previous device is current again afterwards, however the closure ends.
fn with_device(
    devices: &Devices,
    context: &NativeCallContext,
    device: &Dynamic,
    closure: &Dynamic,
) -> BindingResult<Dynamic> {
    const NAME: &str = "with_device";
    let index = device_arg(NAME, devices, device)?;
    let Some(closure) = closure.read_lock::<FnPtr>().map(|f| f.clone()) else {
        return fail(
            NAME,
            format!(
                "the second argument must be a function, as in || {{ ... }}, got {}",
                closure.type_name()
            ),
        );
    };
    match devices.with_selected(index, || {
        closure.call_within_context::<Dynamic>(context, ())
    }) {
        Ok(value) => value,
        Err(error) => tensor_fail(NAME, error),
    }
}

/// `t.to(device)`: the tensor itself when it is on `device` already, else a copy there.
fn to(
    devices: &Devices,
    context: &NativeCallContext,
    tensor: &Tensor,
    device: &Dynamic,
) -> BindingResult<Tensor> {
    let index = device_arg("to", devices, device)?;
    if let Ok(target) = devices.get(index) {
        stamp(context, &target);
    }
    devices
        .copy_to(tensor, index)
        .or_else(|error| tensor_fail("to", error))
}

/// Registers the device functions and `t.to(device)`.
pub fn register(engine: &mut Engine, devices: &Rc<Devices>) {
    let on = Rc::clone(devices);
    engine.register_fn("device_count", move || on.count() as INT);
    let on = Rc::clone(devices);
    engine.register_fn("current_device", move || on.current_index() as INT);
    let on = Rc::clone(devices);
    engine.register_fn("set_device", move |device: Dynamic| -> BindingResult<()> {
        let index = device_arg("set_device", &on, &device)?;
        on.select(index)
            .or_else(|error| tensor_fail("set_device", error))
    });
    let on = Rc::clone(devices);
    engine.register_fn(
        "with_device",
        move |context: NativeCallContext, device: Dynamic, closure: Dynamic| {
            with_device(&on, &context, &device, &closure)
        },
    );
    let on = Rc::clone(devices);
    engine.register_fn(
        "to",
        move |context: NativeCallContext, tensor: &mut Tensor, device: Dynamic| {
            to(&on, &context, tensor, &device)
        },
    );
}
