//! Snapshots from scripts, named as in `torch.cuda.memory`: `record_memory_history(on)`,
//! `memory_history()` (the recorded events, PyTorch's keys), `memory_snapshot()` with every
//! key PyTorch writes, `dump_snapshot(path)` (a pickle PyTorch's tools read), and
//! `replay(path, conf)` (the `gpumem replay` report as a map).

use std::path::Path;
use std::rc::Rc;

use rhai::{Dynamic, Engine, ImmutableString};

use super::args::{fail, flag, integer, non_negative, BindingResult};
use super::history;
use crate::alloc::trace::TraceAction;
use crate::alloc::AllocConf;
use crate::snapshot::replay::{replay, ReplayOptions};
use crate::snapshot::{capture, pickle, AllocatorSettings, Snapshot};
use crate::tensor::Runtime;

/// The runtime's state as a PyTorch snapshot: segments (with the frames of each live block's
/// allocation), the recorded history, the settings. Like PyTorch's `_snapshot()` it then
/// records a `snapshot` event.
fn snapshot(runtime: &Runtime) -> Snapshot {
    let entries = runtime.allocator().trace().entries();
    let contexts = history::allocation_contexts(&entries);
    let frames_of = |address: u64| {
        contexts
            .get(&address)
            .map_or_else(Vec::new, |&id| history::frames(id))
    };
    let segments = {
        let allocator = runtime.allocator();
        capture::segments(&allocator, allocator.device().index(), &frames_of)
    };
    let active: i64 = segments.iter().map(|segment| segment.active_size).sum();
    runtime.with_allocator(|allocator| {
        allocator
            .trace_mut()
            .record(TraceAction::Snapshot, 0, active.max(0) as u64, 0)
    });
    let allocator = runtime.allocator();
    Snapshot {
        segments,
        device_traces: vec![history::events(&entries)],
        allocator_settings: AllocatorSettings::from_conf(allocator.config()),
        external_annotations: Vec::new(),
    }
}

/// `record_memory_history(enabled[, max_entries])`.
fn record_history(
    runtime: &Runtime,
    enabled: &Dynamic,
    max_entries: Option<&Dynamic>,
) -> BindingResult<()> {
    let enabled = flag("record_memory_history", "enabled", enabled)?;
    let max_entries = match max_entries {
        Some(value) => {
            let value = integer("record_memory_history", "max_entries", value)?;
            non_negative("record_memory_history", "max_entries", value)? as usize
        }
        None => history::DEFAULT_MAX_ENTRIES,
    };
    runtime.with_allocator(|allocator| {
        let trace = allocator.trace_mut();
        trace.set_max_entries(max_entries);
        trace.set_enabled(enabled);
    });
    Ok(())
}

/// `replay(path, conf)`: the report's JSON form as a map (`conf` "" = the recorded config).
fn replay_map(path: &str, conf: &str) -> BindingResult<Dynamic> {
    let conf = if conf.is_empty() {
        None
    } else {
        match AllocConf::parse(conf) {
            Ok(conf) => Some(conf),
            Err(error) => {
                return fail(
                    "replay",
                    format!("invalid allocator config '{conf}': {error}"),
                )
            }
        }
    };
    let options = ReplayOptions {
        conf,
        ..ReplayOptions::default()
    };
    match replay(Path::new(path), &options, &mut |_, _| {}) {
        Ok(report) => rhai::serde::to_dynamic(report.to_json()),
        Err(error) => fail("replay", error.naming(Path::new(path))),
    }
}

/// Registers the snapshot functions.
pub fn register(engine: &mut Engine, runtime: &Rc<Runtime>) {
    let rt = Rc::clone(runtime);
    // The snapshot types derive Serialize with PyTorch's key names, so Rhai's serde support
    // turns them into maps directly.
    engine.register_fn("memory_snapshot", move || -> BindingResult<Dynamic> {
        rhai::serde::to_dynamic(snapshot(&rt).segments)
    });
    let rt = Rc::clone(runtime);
    engine.register_fn(
        "dump_snapshot",
        move |path: ImmutableString| -> BindingResult<()> {
            pickle::dump(Path::new(path.as_str()), &snapshot(&rt))
                .or_else(|error| fail("dump_snapshot", error))
        },
    );
    let rt = Rc::clone(runtime);
    engine.register_fn(
        "record_memory_history",
        move |enabled: Dynamic| -> BindingResult<()> { record_history(&rt, &enabled, None) },
    );
    let rt = Rc::clone(runtime);
    engine.register_fn(
        "record_memory_history",
        move |enabled: Dynamic, max_entries: Dynamic| -> BindingResult<()> {
            record_history(&rt, &enabled, Some(&max_entries))
        },
    );
    let rt = Rc::clone(runtime);
    engine.register_fn("memory_history", move || -> BindingResult<Dynamic> {
        let entries = rt.allocator().trace().entries();
        rhai::serde::to_dynamic(history::events(&entries))
    });
    engine.register_fn(
        "replay",
        |path: ImmutableString, conf: ImmutableString| -> BindingResult<Dynamic> {
            replay_map(&path, &conf)
        },
    );
    engine.register_fn(
        "replay",
        |path: ImmutableString| -> BindingResult<Dynamic> { replay_map(&path, "") },
    );
}
