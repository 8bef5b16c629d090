//! Memory functions named as in `torch.cuda`: `memory_stats([device])`,
//! `memory_summary([device])`, `empty_cache()`, `set_per_process_memory_fraction(f[, device])`,
//! ..., `device_memory([device])` (the driver's view of a device through NVML or the
//! simulator), and gpumem's `with_allocator_conf(conf, closure)`, which runs a closure against
//! a second allocator. Without a device they act on the current one, as PyTorch's do;
//! `empty_cache()` and `manual_seed()` act on every device, as PyTorch's do.

use std::rc::Rc;

use rhai::{Array, Dynamic, Engine, FnPtr, Map, NativeCallContext, INT};

use super::args::{device_or_current, fail, flag, integer, non_negative, BindingResult};
use crate::alloc::summary::memory_summary;
use crate::alloc::{AllocConf, DeviceStats};
use crate::device::DriverMemory;
use crate::tensor::{Devices, Runtime};

/// `with_allocator_conf(conf, closure)`: calls `closure` with a second allocator under the
/// config `conf` current, and returns its value.
/// Tensors made inside belong to that allocator (even if kept afterwards); memory functions
/// called inside report on it. The second allocator draws from the same kind of device as the
/// session (a fresh simulated GPU of the same size, or the same CUDA GPU).
fn with_allocator_conf(
    runtime: &Rc<Runtime>,
    context: &NativeCallContext,
    conf: &Dynamic,
    closure: &Dynamic,
) -> BindingResult<Dynamic> {
    const NAME: &str = "with_allocator_conf";
    let Some(text) = conf
        .read_lock::<rhai::ImmutableString>()
        .map(|s| s.to_string())
    else {
        return fail(
            NAME,
            format!("conf must be a string, got {}", conf.type_name()),
        );
    };
    let Some(closure) = closure.read_lock::<FnPtr>().map(|f| f.clone()) else {
        return fail(
            NAME,
            format!(
                "the second argument must be a function, as in || {{ ... }}, got {}",
                closure.type_name()
            ),
        );
    };
    let config = match AllocConf::parse(&text) {
        Ok(config) => config,
        Err(error) => return fail(NAME, format!("invalid allocator config '{text}': {error}")),
    };
    let allocator = match runtime.fresh_allocator(config) {
        Ok(allocator) => allocator,
        Err(error) => return fail(NAME, error),
    };
    // The second allocator's timeline names the line that made it.
    super::history::stamp(context, runtime);
    runtime.with_allocator_swapped(allocator, || {
        closure.call_within_context::<Dynamic>(context, ())
    })
}

/// The `device_memory()` map: the driver's figures plus the allocator's reserved bytes and
/// the context share they imply. Keys are a contract other scripts rely on.
fn device_memory_map(device: &str, memory: &DriverMemory, allocator_reserved: u64) -> Map {
    let mut map = Map::new();
    let int = |value: u64| Dynamic::from(value as INT);
    map.insert("device".into(), Dynamic::from(device.to_string()));
    map.insert("method".into(), Dynamic::from(memory.method.to_string()));
    map.insert("total_bytes".into(), int(memory.total_bytes));
    map.insert("used_bytes".into(), int(memory.used_bytes));
    map.insert("used_v2_bytes".into(), int(memory.used_v2_bytes));
    map.insert("free_bytes".into(), int(memory.free_bytes));
    map.insert(
        "driver_reserved_bytes".into(),
        int(memory.driver_reserved_bytes),
    );
    map.insert("process_bytes".into(), int(memory.process_bytes));
    map.insert(
        "other_processes_bytes".into(),
        int(memory.other_processes_bytes),
    );
    map.insert("allocator_reserved_bytes".into(), int(allocator_reserved));
    map.insert(
        "context_bytes".into(),
        int(memory.process_bytes.saturating_sub(allocator_reserved)),
    );
    map
}

/// Reads one figure from the counters.
type Figure = fn(&DeviceStats) -> INT;

/// Registers `name()` and `name(device)`, both calling `body` with the device (the current
/// one when none is given).
fn register_on_device(
    engine: &mut Engine,
    devices: &Rc<Devices>,
    name: &'static str,
    body: fn(&Runtime) -> BindingResult<Dynamic>,
) {
    let on = Rc::clone(devices);
    engine.register_fn(name, move || body(&on.current()));
    let on = Rc::clone(devices);
    engine.register_fn(name, move |device: Dynamic| {
        let runtime = device_or_current(name, &on, Some(&device))?;
        body(&runtime)
    });
}

/// `memory_summary(device, abbreviated)`.
fn summary(runtime: &Runtime, abbreviated: bool) -> String {
    let allocator = runtime.allocator();
    memory_summary(allocator.stats(), allocator.device().index(), abbreviated)
}

/// `mem_get_info([device])`: `cudaMemGetInfo` under a guard of the device, which creates its
/// context if it has none.
fn mem_get_info(devices: &Devices, device: Option<&Dynamic>) -> BindingResult<Array> {
    const NAME: &str = "mem_get_info";
    let index = match device {
        Some(device) => super::args::device_arg(NAME, devices, device)?,
        None => devices.current_index(),
    };
    let info = devices.guarded(index, |runtime| Ok(runtime.mem_get_info()?));
    match info {
        Ok((free, total)) => Ok(vec![
            Dynamic::from(free as INT),
            Dynamic::from(total as INT),
        ]),
        Err(error) => fail(NAME, error),
    }
}

/// `device_memory([device])`: NVML's view (or the simulator's), which creates no context.
fn device_memory(runtime: &Runtime) -> BindingResult<Map> {
    let allocator = runtime.allocator();
    let reserved = allocator.stats().reserved_bytes.all.current.max(0) as u64;
    match allocator.device().driver_memory() {
        Ok(memory) => Ok(device_memory_map(runtime.device_label(), &memory, reserved)),
        Err(error) => fail("device_memory", error),
    }
}

/// `set_per_process_memory_fraction(fraction[, device])`.
fn set_fraction(runtime: &Runtime, fraction: &Dynamic) -> BindingResult<()> {
    // PyTorch raises a TypeError for anything but a Python float, integers included.
    let Ok(fraction) = fraction.as_float() else {
        return fail(
            "set_per_process_memory_fraction",
            format!(
                "fraction must be a float, got {} ({fraction}); write 1.0, not 1 (PyTorch: \"Invalid type for fraction argument, must be `float`\")",
                fraction.type_name()
            ),
        );
    };
    // The allocator's message already names the function.
    runtime
        .with_allocator(|a| a.set_memory_fraction(fraction))
        .map_err(|error| error.to_string().into())
}

/// Registers the memory functions.
pub fn register(engine: &mut Engine, devices: &Rc<Devices>) {
    // The typed counters, read as torch.cuda's functions read them (`memory_allocated()` is
    // `memory_stats()["allocated_bytes.all.current"]`, ...).
    let figures: [(&'static str, Figure); 4] = [
        ("memory_allocated", |s| s.allocated_bytes.all.current),
        ("memory_reserved", |s| s.reserved_bytes.all.current),
        ("max_memory_allocated", |s| s.allocated_bytes.all.peak),
        ("max_memory_reserved", |s| s.reserved_bytes.all.peak),
    ];
    for (name, figure) in figures {
        let on = Rc::clone(devices);
        engine.register_fn(name, move || -> INT {
            figure(on.current().allocator().stats())
        });
        let on = Rc::clone(devices);
        engine.register_fn(name, move |device: Dynamic| -> BindingResult<INT> {
            let runtime = device_or_current(name, &on, Some(&device))?;
            let value = figure(runtime.allocator().stats());
            Ok(value)
        });
    }
    register_on_device(engine, devices, "memory_stats", |runtime| {
        let stats: Map = runtime
            .allocator()
            .stats()
            .entries()
            .into_iter()
            .map(|(key, value)| (key.into(), Dynamic::from(value)))
            .collect();
        Ok(Dynamic::from_map(stats))
    });
    let on = Rc::clone(devices);
    engine.register_fn("memory_summary", move || summary(&on.current(), false));
    // `memory_summary(true)` abbreviates (gpumem's shorthand); any other argument names the
    // device, as PyTorch's first parameter does.
    let on = Rc::clone(devices);
    engine.register_fn(
        "memory_summary",
        move |argument: Dynamic| -> BindingResult<String> {
            if let Ok(abbreviated) = argument.as_bool() {
                return Ok(summary(&on.current(), abbreviated));
            }
            let runtime = device_or_current("memory_summary", &on, Some(&argument))?;
            Ok(summary(&runtime, false))
        },
    );
    let on = Rc::clone(devices);
    engine.register_fn(
        "memory_summary",
        move |device: Dynamic, abbreviated: Dynamic| -> BindingResult<String> {
            let runtime = device_or_current("memory_summary", &on, Some(&device))?;
            let abbreviated = flag("memory_summary", "abbreviated", &abbreviated)?;
            Ok(summary(&runtime, abbreviated))
        },
    );
    // PyTorch's emptyCache releases the cached segments of every device's allocator.
    let on = Rc::clone(devices);
    engine.register_fn(
        "empty_cache",
        move |context: NativeCallContext| -> BindingResult<()> {
            for runtime in on.all() {
                super::history::stamp(&context, &runtime);
                runtime
                    .empty_cache()
                    .or_else(|error| fail("empty_cache", error))?;
            }
            Ok(())
        },
    );
    register_on_device(engine, devices, "reset_peak_memory_stats", |runtime| {
        runtime.with_allocator(|a| a.reset_peak_stats());
        Ok(Dynamic::UNIT)
    });
    register_on_device(
        engine,
        devices,
        "reset_accumulated_memory_stats",
        |runtime| {
            runtime.with_allocator(|a| a.reset_accumulated_stats());
            Ok(Dynamic::UNIT)
        },
    );
    let on = Rc::clone(devices);
    engine.register_fn(
        "set_per_process_memory_fraction",
        move |fraction: Dynamic| -> BindingResult<()> { set_fraction(&on.current(), &fraction) },
    );
    let on = Rc::clone(devices);
    engine.register_fn(
        "set_per_process_memory_fraction",
        move |fraction: Dynamic, device: Dynamic| -> BindingResult<()> {
            let runtime = device_or_current("set_per_process_memory_fraction", &on, Some(&device))?;
            set_fraction(&runtime, &fraction)
        },
    );
    register_on_device(
        engine,
        devices,
        "get_per_process_memory_fraction",
        |runtime| Ok(Dynamic::from(runtime.allocator().memory_fraction())),
    );
    let on = Rc::clone(devices);
    engine.register_fn("mem_get_info", move || mem_get_info(&on, None));
    let on = Rc::clone(devices);
    engine.register_fn("mem_get_info", move |device: Dynamic| {
        mem_get_info(&on, Some(&device))
    });
    let on = Rc::clone(devices);
    engine.register_fn(
        "with_allocator_conf",
        move |context: NativeCallContext, conf: Dynamic, closure: Dynamic| {
            with_allocator_conf(&on.current(), &context, &conf, &closure)
        },
    );
    let on = Rc::clone(devices);
    engine.register_fn("manual_seed", move |seed: Dynamic| -> BindingResult<()> {
        let seed = integer("manual_seed", "seed", &seed)?;
        on.manual_seed(non_negative("manual_seed", "seed", seed)?);
        Ok(())
    });
    register_on_device(engine, devices, "device_memory", |runtime| {
        device_memory(runtime).map(Dynamic::from_map)
    });
}
