//! Memory functions named as in `torch.cuda`: `memory_stats()`, `memory_summary()`,
//! `empty_cache()`, `set_per_process_memory_fraction(f)`, ..., `device_memory()` (the
//! driver's view of the device through NVML or the simulator), and gpumem's
//! `with_allocator_conf(conf, closure)`, which runs a closure against a second allocator.

use std::rc::Rc;

use rhai::{Array, Dynamic, Engine, FnPtr, Map, NativeCallContext, INT};

use super::args::{fail, flag, integer, non_negative, BindingResult};
use crate::alloc::summary::memory_summary;
use crate::alloc::{AllocConf, DeviceStats};
use crate::device::DriverMemory;
use crate::tensor::Runtime;

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

/// Registers the memory functions.
pub fn register(engine: &mut Engine, runtime: &Rc<Runtime>) {
    // The typed counters, read as torch.cuda's functions read them (`memory_allocated()` is
    // `memory_stats()["allocated_bytes.all.current"]`, ...).
    let figures: [(&str, Figure); 4] = [
        ("memory_allocated", |s| s.allocated_bytes.all.current),
        ("memory_reserved", |s| s.reserved_bytes.all.current),
        ("max_memory_allocated", |s| s.allocated_bytes.all.peak),
        ("max_memory_reserved", |s| s.reserved_bytes.all.peak),
    ];
    for (name, figure) in figures {
        let rt = Rc::clone(runtime);
        engine.register_fn(name, move || -> INT { figure(rt.allocator().stats()) });
    }

    let rt = Rc::clone(runtime);
    engine.register_fn("memory_stats", move || -> Map {
        rt.allocator()
            .stats()
            .entries()
            .into_iter()
            .map(|(key, value)| (key.into(), Dynamic::from(value)))
            .collect()
    });
    let rt = Rc::clone(runtime);
    engine.register_fn("memory_summary", move || -> String {
        let allocator = rt.allocator();
        memory_summary(allocator.stats(), allocator.device().index(), false)
    });
    let rt = Rc::clone(runtime);
    engine.register_fn(
        "memory_summary",
        move |abbreviated: Dynamic| -> BindingResult<String> {
            let abbreviated = flag("memory_summary", "abbreviated", &abbreviated)?;
            let allocator = rt.allocator();
            Ok(memory_summary(
                allocator.stats(),
                allocator.device().index(),
                abbreviated,
            ))
        },
    );
    let rt = Rc::clone(runtime);
    engine.register_fn(
        "empty_cache",
        move |context: NativeCallContext| -> BindingResult<()> {
            super::history::stamp(&context, &rt);
            rt.empty_cache().or_else(|error| fail("empty_cache", error))
        },
    );
    let rt = Rc::clone(runtime);
    engine.register_fn("reset_peak_memory_stats", move || {
        rt.with_allocator(|a| a.reset_peak_stats())
    });
    let rt = Rc::clone(runtime);
    engine.register_fn("reset_accumulated_memory_stats", move || {
        rt.with_allocator(|a| a.reset_accumulated_stats())
    });
    let rt = Rc::clone(runtime);
    engine.register_fn(
        "set_per_process_memory_fraction",
        move |fraction: Dynamic| -> BindingResult<()> {
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
            rt.with_allocator(|a| a.set_memory_fraction(fraction))
                .map_err(|error| error.to_string().into())
        },
    );
    let rt = Rc::clone(runtime);
    engine.register_fn("get_per_process_memory_fraction", move || -> f64 {
        rt.allocator().memory_fraction()
    });
    let rt = Rc::clone(runtime);
    engine.register_fn("mem_get_info", move || -> BindingResult<Array> {
        let info = rt.allocator().device().mem_get_info();
        match info {
            Ok((free, total)) => Ok(vec![
                Dynamic::from(free as INT),
                Dynamic::from(total as INT),
            ]),
            Err(error) => fail("mem_get_info", error),
        }
    });
    let rt = Rc::clone(runtime);
    engine.register_fn(
        "with_allocator_conf",
        move |context: NativeCallContext, conf: Dynamic, closure: Dynamic| {
            with_allocator_conf(&rt, &context, &conf, &closure)
        },
    );
    let rt = Rc::clone(runtime);
    engine.register_fn("manual_seed", move |seed: Dynamic| -> BindingResult<()> {
        let seed = integer("manual_seed", "seed", &seed)?;
        rt.manual_seed(non_negative("manual_seed", "seed", seed)?);
        Ok(())
    });
    let rt = Rc::clone(runtime);
    engine.register_fn("synchronize", move || -> BindingResult<()> {
        rt.backend()
            .synchronize()
            .or_else(|error| fail("synchronize", error))
    });
    let rt = Rc::clone(runtime);
    engine.register_fn("device_memory", move || -> BindingResult<Map> {
        let allocator = rt.allocator();
        let reserved = allocator.stats().reserved_bytes.all.current.max(0) as u64;
        match allocator.device().driver_memory() {
            Ok(memory) => Ok(device_memory_map(rt.device_label(), &memory, reserved)),
            Err(error) => fail("device_memory", error),
        }
    });
}
