//! Seeing memory from scripts: `memory_map([width])`, `fragmentation()`,
//! `measure(|| { ... })` and `mark(text)`. Thin glue over [`crate::viz`], the allocator's
//! measurement scopes and the runtime's watcher.

use std::cell::Cell;
use std::rc::Rc;

use rhai::{Dynamic, Engine, FnPtr, Map, NativeCallContext, FLOAT, INT};

use super::args::{integer, non_negative, BindingResult};
use crate::alloc::{DeviceStats, ScopeReport};
use crate::tensor::Runtime;
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

/// Registers `memory_map`, `fragmentation`, `measure` and `mark`.
pub fn register(engine: &mut Engine, runtime: &Rc<Runtime>, settings: &MapSettings) {
    // `mark(text)`: a phase boundary a timeline draws (nothing happens unless one is
    // recorded: `gpumem run --timeline/--report`).
    let rt = Rc::clone(runtime);
    engine.register_fn("mark", move |context: NativeCallContext, text: Dynamic| {
        super::history::stamp(&context, &rt);
        let text = match text.read_lock::<rhai::ImmutableString>() {
            Some(text) => text.to_string(),
            None => text.to_string(),
        };
        rt.mark(&text);
    });
    let rt = Rc::clone(runtime);
    let options = Rc::clone(settings);
    engine.register_fn("memory_map", move || -> String {
        map::render(&MemoryLayout::of(&rt.allocator()), &options.get())
    });
    let rt = Rc::clone(runtime);
    let options = Rc::clone(settings);
    engine.register_fn(
        "memory_map",
        move |width: Dynamic| -> BindingResult<String> {
            let width = integer("memory_map", "width", &width)?;
            let width = non_negative("memory_map", "width", width)?;
            let options = MapOptions {
                width: usize::try_from(width).unwrap_or(usize::MAX),
                ..options.get()
            };
            Ok(map::render(&MemoryLayout::of(&rt.allocator()), &options))
        },
    );
    let rt = Rc::clone(runtime);
    engine.register_fn("fragmentation", move || -> Map {
        let fragmentation = Fragmentation::of(&MemoryLayout::of(&rt.allocator()));
        let mut map = Map::new();
        map.insert("all".into(), free_space_map(&fragmentation.all).into());
        map.insert("small".into(), free_space_map(&fragmentation.small).into());
        map.insert("large".into(), free_space_map(&fragmentation.large).into());
        map
    });
    let rt = Rc::clone(runtime);
    engine.register_fn(
        "measure",
        move |context: NativeCallContext, work: FnPtr| -> BindingResult<Map> {
            let mark = rt.with_allocator(|allocator| allocator.begin_measure());
            // The scope closes whether or not the work fails, so an error caught further up
            // leaves no scope open.
            let result = work.call_within_context::<Dynamic>(&context, ());
            let report = rt.with_allocator(|allocator| allocator.end_measure(mark));
            Ok(measure_map(&report, result?))
        },
    );
}
