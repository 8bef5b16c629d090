//! Seeing memory from scripts: `memory_map([device[, width]])`, `fragmentation()` and
//! `measure(|| { ... })` (both on the current device), and `mark(text)` (on every device's
//! timeline). Thin glue over [`crate::viz`], the allocator's measurement scopes and the
//! runtimes' watchers.

use std::cell::Cell;
use std::rc::Rc;

use rhai::{Dynamic, Engine, FnPtr, Map, NativeCallContext, FLOAT, INT};

use super::args::{device_arg, fail, integer, non_negative, BindingResult};
use crate::alloc::{DeviceStats, ScopeReport};
use crate::tensor::{Devices, Runtime};
use crate::viz::{map, Fragmentation, FreeSpace, MapOptions, MemoryLayout};

/// How `memory_map()` draws when the script gives no width: the host's terminal width and
/// whether its output wants colour. Plain 80 columns until the command line says otherwise,
/// which is what golden tests and pipes get.
pub type MapSettings = Rc<Cell<MapOptions>>;

fn int(value: u64) -> Dynamic {
    Dynamic::from(value as INT)
}

/// One pool's free space as a script map.
fn free_space_map(space: &FreeSpace) -> Map {
    let mut map = Map::new();
    map.insert("cached_free".into(), int(space.cached_free));
    map.insert("largest_free".into(), int(space.largest_free));
    map.insert("free_blocks".into(), int(space.free_blocks));
    map.insert("releasable".into(), int(space.releasable));
    map.insert("external".into(), Dynamic::from(space.external() as FLOAT));
    map
}

/// The `measure()` map: peaks inside the scope, figures at its ends, device calls in it.
fn measure_map(report: &ScopeReport, result: Dynamic) -> Map {
    let (start, end): (&DeviceStats, &DeviceStats) = (&report.start, &report.end);
    let mut map = Map::new();
    let figures: [(&str, i64); 9] = [
        ("peak_allocated", end.allocated_bytes.all.scope_peak),
        ("peak_reserved", end.reserved_bytes.all.scope_peak),
        ("allocated_before", start.allocated_bytes.all.current),
        ("allocated_after", end.allocated_bytes.all.current),
        ("reserved_before", start.reserved_bytes.all.current),
        ("reserved_after", end.reserved_bytes.all.current),
        (
            "allocations",
            end.allocation.all.allocated - start.allocation.all.allocated,
        ),
        (
            "device_allocations",
            end.num_device_alloc - start.num_device_alloc,
        ),
        ("device_frees", end.num_device_free - start.num_device_free),
    ];
    for (key, value) in figures {
        map.insert(key.into(), Dynamic::from(value as INT));
    }
    map.insert("result".into(), result);
    map
}

/// The script location of each context id the timeline's events carry (entry `i` is id
/// `i + 1`), from the call sites bindings stamped ([`super::history::stamp`]): the script's own
/// line, with the stdlib helper an event happened in (walked out of when the run tracked call
/// sites).
pub fn timeline_labels(timeline: &crate::viz::Timeline) -> Vec<crate::viz::Site> {
    (1..=timeline.counts.last_context)
        .map(|id| {
            let stack = super::history::frames(id);
            let helper = super::history::helper(&stack);
            stack
                .last()
                .map_or_else(crate::viz::Site::default, |frame| crate::viz::Site {
                    label: format!("{}:{}", frame.filename, frame.line),
                    helper,
                })
        })
        .collect()
}

/// `memory_map(device, width)`'s device: as [`device_arg`], with a hint for the old
/// `memory_map(width)` form when a number is not a device.
fn map_device(devices: &Devices, device: &Dynamic) -> BindingResult<Rc<Runtime>> {
    let index = device_arg("memory_map", devices, device).map_err(|error| {
        if device.is_int() {
            format!(
                "{error}; the width is the second argument: memory_map(current_device(), {device})"
            )
            .into()
        } else {
            error
        }
    })?;
    devices
        .get(index)
        .or_else(|error| fail("memory_map", error))
}

/// Draws `runtime`'s segments `width` columns wide (the host's width when `None`).
fn draw(
    runtime: &Runtime,
    width: Option<&Dynamic>,
    settings: &MapSettings,
) -> BindingResult<String> {
    let mut options = settings.get();
    if let Some(width) = width {
        let width = integer("memory_map", "width", width)?;
        let width = non_negative("memory_map", "width", width)?;
        options.width = usize::try_from(width).unwrap_or(usize::MAX);
    }
    Ok(map::render(
        &MemoryLayout::of(&runtime.allocator()),
        &options,
    ))
}

/// Registers `memory_map`, `fragmentation`, `measure` and `mark`.
pub fn register(engine: &mut Engine, devices: &Rc<Devices>, settings: &MapSettings) {
    // `mark(text)`: a phase boundary every device's timeline draws (nothing happens unless
    // one is recorded: `gpumem run --timeline/--report`).
    let on = Rc::clone(devices);
    engine.register_fn("mark", move |context: NativeCallContext, text: Dynamic| {
        let current = on.current();
        super::history::stamp(&context, &current);
        let site = current.allocator().trace_context();
        let text = match text.read_lock::<rhai::ImmutableString>() {
            Some(text) => text.to_string(),
            None => text.to_string(),
        };
        for runtime in on.all() {
            runtime.mark(&text, site);
        }
    });
    let on = Rc::clone(devices);
    let options = Rc::clone(settings);
    engine.register_fn("memory_map", move || draw(&on.current(), None, &options));
    let on = Rc::clone(devices);
    let options = Rc::clone(settings);
    engine.register_fn(
        "memory_map",
        move |device: Dynamic| -> BindingResult<String> {
            let runtime = map_device(&on, &device)?;
            draw(&runtime, None, &options)
        },
    );
    let on = Rc::clone(devices);
    let options = Rc::clone(settings);
    engine.register_fn(
        "memory_map",
        move |device: Dynamic, width: Dynamic| -> BindingResult<String> {
            let runtime = map_device(&on, &device)?;
            draw(&runtime, Some(&width), &options)
        },
    );
    let on = Rc::clone(devices);
    engine.register_fn("fragmentation", move || -> Map {
        let fragmentation = Fragmentation::of(&MemoryLayout::of(&on.current().allocator()));
        let mut map = Map::new();
        map.insert("all".into(), free_space_map(&fragmentation.all).into());
        map.insert("small".into(), free_space_map(&fragmentation.small).into());
        map.insert("large".into(), free_space_map(&fragmentation.large).into());
        map
    });
    let on = Rc::clone(devices);
    engine.register_fn(
        "measure",
        move |context: NativeCallContext, work: FnPtr| -> BindingResult<Map> {
            // The device current when the measure starts is the one measured.
            let runtime = on.current();
            let mark = runtime.with_allocator(|allocator| allocator.begin_measure());
            // The scope closes whether or not the work fails, so an error caught further up
            // leaves no scope open.
            let result = work.call_within_context::<Dynamic>(&context, ());
            let report = runtime.with_allocator(|allocator| allocator.end_measure(mark));
            Ok(measure_map(&report, result?))
        },
    );
}
