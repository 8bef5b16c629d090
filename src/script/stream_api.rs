//! Streams from scripts, named as in `torch.cuda`: `stream([device])` (`torch.cuda.Stream()`),
//! `current_stream([device])`, `default_stream([device])`, `with_stream(s, || ...)` (`with
//! torch.cuda.stream(s):`), `gpu_sleep(ms)` (`torch.cuda._sleep`, in milliseconds),
//! `t.record_stream(s)`, `s.synchronize()`, `s.wait_stream(other)` and `synchronize([device])`;
//! a stream value has `s.device`, `s.device_index` and `s.stream_id`, prints as
//! `<stream 1 on cuda:0>` and compares with `==`. Thin glue over [`Devices`] and the
//! [`Runtime`](crate::tensor::Runtime)'s stream methods (tensor/streams.rs).
//!
//! Contexts are created where PyTorch creates them: `stream()` (the device's stream pool),
//! `gpu_sleep`, `s.synchronize()`, `s.wait_stream()` and `synchronize()` run on their device
//! under a guard; reading the current or default stream creates nothing.

use std::rc::Rc;

use rhai::{Dynamic, Engine, FnPtr, NativeCallContext, INT};

use super::args::{device_arg, fail, number, tensor_fail, BindingResult};
use crate::tensor::{Devices, Stream, Tensor};

/// Reads a stream argument; anything else is an error naming the function and what it got.
fn stream_arg(function: &str, what: &str, value: &Dynamic) -> BindingResult<Stream> {
    match value.read_lock::<Stream>() {
        Some(stream) => Ok(stream.clone()),
        None => fail(
            function,
            format!(
                "{what} must be a stream (from stream(), current_stream() or default_stream()), got {} ({value})",
                value.type_name()
            ),
        ),
    }
}

/// The device index of a stream of this session.
fn device_of(function: &str, devices: &Devices, stream: &Stream) -> BindingResult<usize> {
    devices
        .stream_device(stream)
        .or_else(|error| tensor_fail(function, error))
}

/// The device an optional argument names: the current device without one.
fn device_or_current(
    function: &str,
    devices: &Devices,
    device: Option<&Dynamic>,
) -> BindingResult<usize> {
    match device {
        Some(device) => device_arg(function, devices, device),
        None => Ok(devices.current_index()),
    }
}

/// `stream([device])`: the next stream of the device's pool; `with torch.cuda.device(device)`
/// around it, and the device's context created, as PyTorch's pool creation creates it.
fn new_stream(devices: &Devices, device: Option<&Dynamic>) -> BindingResult<Stream> {
    const NAME: &str = "stream";
    let index = device_or_current(NAME, devices, device)?;
    let runtime = devices.get(index).or_else(|error| fail(NAME, error))?;
    let made = devices.with_selected(index, || {
        runtime.ensure_context()?;
        runtime.new_stream()
    });
    match made {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(error)) | Err(error) => tensor_fail(NAME, error),
    }
}

/// `current_stream([device])` or `default_stream([device])`; the first stream call of a
/// process creates the current device's context ([`Devices::ready_streams`]).
fn stream_of(
    function: &str,
    devices: &Devices,
    device: Option<&Dynamic>,
    pick: fn(&Rc<crate::tensor::Runtime>) -> Stream,
) -> BindingResult<Stream> {
    let index = device_or_current(function, devices, device)?;
    let runtime = devices.get(index).or_else(|error| fail(function, error))?;
    devices
        .ready_streams()
        .or_else(|error| tensor_fail(function, error))?;
    Ok(pick(&runtime))
}

/// `with_stream(stream, closure)`: calls `closure` with `stream` current (and its device) and
/// returns its value; every device's previous stream is current again afterwards, however the
/// closure ends.
fn with_stream(
    devices: &Devices,
    context: &NativeCallContext,
    stream: &Dynamic,
    closure: &Dynamic,
) -> BindingResult<Dynamic> {
    const NAME: &str = "with_stream";
    let stream = stream_arg(NAME, "the first argument", stream)?;
    let Some(closure) = closure.read_lock::<FnPtr>().map(|f| f.clone()) else {
        return fail(
            NAME,
            format!(
                "the second argument must be a function, as in || {{ ... }}, got {}",
                closure.type_name()
            ),
        );
    };
    match devices.with_stream(&stream, || {
        closure.call_within_context::<Dynamic>(context, ())
    }) {
        Ok(value) => value,
        Err(error) => tensor_fail(NAME, error),
    }
}

/// `gpu_sleep(ms)`: keeps the current device's current stream busy for `ms` milliseconds.
fn gpu_sleep(devices: &Devices, millis: &Dynamic) -> BindingResult<()> {
    const NAME: &str = "gpu_sleep";
    let millis = number(NAME, "ms", millis)?;
    devices
        .guarded(devices.current_index(), |runtime| {
            runtime.sleep(runtime.current_stream(), millis)
        })
        .or_else(|error| tensor_fail(NAME, error))
}

/// `t.record_stream(stream)`: `stream` must be a stream of the tensor's device.
fn record_stream(tensor: &Tensor, stream: &Dynamic) -> BindingResult<()> {
    const NAME: &str = "record_stream";
    let stream = stream_arg(NAME, "the argument", stream)?;
    if !Rc::ptr_eq(stream.runtime(), tensor.runtime()) {
        return fail(
            NAME,
            format!(
                "the stream is on device {}, the tensor on device {}: record a stream of the tensor's own device",
                stream.runtime().index(),
                tensor.runtime().index()
            ),
        );
    }
    tensor
        .runtime()
        .record_stream(tensor, stream.id())
        .or_else(|error| tensor_fail(NAME, error))
}

/// `s.synchronize()`: waits for the stream's work, under a guard of its device.
fn synchronize_stream(devices: &Devices, stream: &Stream) -> BindingResult<()> {
    const NAME: &str = "synchronize";
    let index = device_of(NAME, devices, stream)?;
    devices
        .guarded(index, |runtime| runtime.synchronize_stream(stream.id()))
        .or_else(|error| tensor_fail(NAME, error))
}

/// `s.wait_stream(other)`: `s`'s later work waits for `other`'s work so far; both streams of
/// one device.
fn wait_stream(devices: &Devices, stream: &Stream, other: &Dynamic) -> BindingResult<()> {
    const NAME: &str = "wait_stream";
    let other = stream_arg(NAME, "the argument", other)?;
    let index = device_of(NAME, devices, stream)?;
    if !Rc::ptr_eq(stream.runtime(), other.runtime()) {
        return fail(
            NAME,
            format!(
                "the streams are on devices {} and {}; gpumem orders the streams of one device",
                stream.runtime().index(),
                other.runtime().index()
            ),
        );
    }
    devices
        .guarded(index, |runtime| {
            runtime.wait_stream(stream.id(), other.id())
        })
        .or_else(|error| tensor_fail(NAME, error))
}

/// `synchronize([device])`: `with torch.cuda.device(device): cudaDeviceSynchronize()`, which
/// creates the device's context if it has none and waits for every stream of the device.
fn synchronize(devices: &Devices, device: Option<&Dynamic>) -> BindingResult<()> {
    const NAME: &str = "synchronize";
    let index = device_or_current(NAME, devices, device)?;
    let runtime = devices.get(index).or_else(|error| fail(NAME, error))?;
    let outcome = devices.with_selected(index, || {
        runtime.ensure_context()?;
        runtime.synchronize()
    });
    match outcome {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) | Err(error) => tensor_fail(NAME, error),
    }
}

/// Registers the stream type, its functions and `t.record_stream(s)`.
pub fn register(engine: &mut Engine, devices: &Rc<Devices>) {
    engine
        .register_type_with_name::<Stream>("Stream")
        .register_fn("to_string", |s: &mut Stream| s.to_string())
        .register_fn("to_debug", |s: &mut Stream| s.to_string())
        .register_get("device", |s: &mut Stream| s.device().to_string())
        .register_get("device_index", |s: &mut Stream| s.runtime().index() as INT)
        .register_get("stream_id", |s: &mut Stream| s.id() as INT)
        .register_fn("==", |a: &mut Stream, b: Stream| *a == b)
        .register_fn("!=", |a: &mut Stream, b: Stream| *a != b)
        .register_fn("record_stream", |t: &mut Tensor, s: Dynamic| {
            record_stream(t, &s)
        });
    let on = Rc::clone(devices);
    engine.register_fn("stream", move || new_stream(&on, None));
    let on = Rc::clone(devices);
    engine.register_fn("stream", move |device: Dynamic| {
        new_stream(&on, Some(&device))
    });
    for (name, pick) in [
        ("current_stream", Stream::current_of as fn(&_) -> Stream),
        ("default_stream", Stream::default_of),
    ] {
        let on = Rc::clone(devices);
        engine.register_fn(name, move || stream_of(name, &on, None, pick));
        let on = Rc::clone(devices);
        engine.register_fn(name, move |device: Dynamic| {
            stream_of(name, &on, Some(&device), pick)
        });
    }
    let on = Rc::clone(devices);
    engine.register_fn(
        "with_stream",
        move |context: NativeCallContext, stream: Dynamic, closure: Dynamic| {
            with_stream(&on, &context, &stream, &closure)
        },
    );
    let on = Rc::clone(devices);
    engine.register_fn("gpu_sleep", move |millis: Dynamic| gpu_sleep(&on, &millis));
    let on = Rc::clone(devices);
    engine.register_fn("synchronize", move |stream: &mut Stream| {
        synchronize_stream(&on, stream)
    });
    let on = Rc::clone(devices);
    engine.register_fn("wait_stream", move |stream: &mut Stream, other: Dynamic| {
        wait_stream(&on, stream, &other)
    });
    let on = Rc::clone(devices);
    engine.register_fn("synchronize", move || synchronize(&on, None));
    let on = Rc::clone(devices);
    engine.register_fn("synchronize", move |device: Dynamic| {
        synchronize(&on, Some(&device))
    });
}
