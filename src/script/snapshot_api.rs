//! Snapshots from scripts, named as in `torch.cuda.memory`: `record_memory_history(on)`,
//! `memory_history()` (the recorded events, PyTorch's keys), `memory_snapshot()` with every
//! key PyTorch writes, `dump_snapshot(path)` (a pickle PyTorch's tools read), and
//! `replay(path, conf)` (the `gpumem replay` report as a map). As in PyTorch, history is
//! recorded on every device and a snapshot holds every device's segments and trace.

use std::rc::Rc;

use rhai::{Dynamic, Engine, ImmutableString};

use super::args::{fail, flag, integer, non_negative, BindingResult};
use super::history;
use super::sandbox::{PathPolicy, SharedPolicy};
use crate::alloc::AllocConf;
use crate::snapshot::model::{Segment, TraceEvent};
use crate::snapshot::replay::{replay, ReplayOptions};
use crate::snapshot::{capture, pickle, AllocatorSettings, Snapshot};
use crate::tensor::{Devices, Runtime};

/// Every device's state as a PyTorch snapshot: segments (with the frames of each live block's
/// allocation) of all devices in device order, one recorded trace per device, the settings.
fn snapshot(devices: &Devices) -> Snapshot {
    let mut segments = Vec::new();
    let mut device_traces = Vec::new();
    for runtime in devices.all() {
        let (device_segments, trace) = device_snapshot(&runtime);
        segments.extend(device_segments);
        device_traces.push(trace);
    }
    let allocator_settings = AllocatorSettings::from_conf(devices.current().allocator().config());
    Snapshot {
        segments,
        device_traces,
        allocator_settings,
        external_annotations: Vec::new(),
    }
}

/// One device's segments and recorded trace. Like PyTorch's per-device snapshot it then
/// records a `snapshot` event (after the trace was taken, so it shows in the next one).
fn device_snapshot(runtime: &Runtime) -> (Vec<Segment>, Vec<TraceEvent>) {
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
    runtime.with_allocator(|allocator| allocator.record_snapshot_event(active.max(0) as u64));
    (segments, history::events(&entries))
}

/// `record_memory_history(enabled[, max_entries])`, on every device as in PyTorch.
fn record_history(
    devices: &Devices,
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
    for runtime in devices.all() {
        runtime.with_allocator(|allocator| allocator.record_history(enabled, max_entries));
    }
    Ok(())
}

/// `replay(path, conf)`: the report's JSON form as a map (`conf` "" = the recorded config). The
/// file must lie where `policy` lets scripts read.
fn replay_map(policy: &PathPolicy, path: &str, conf: &str) -> BindingResult<Dynamic> {
    let file = match policy.readable(path) {
        Ok(file) => file,
        Err(refused) => return fail("replay", refused),
    };
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
    match replay(&file, &options, &mut |_, _| {}) {
        Ok(report) => rhai::serde::to_dynamic(report.to_json()),
        Err(error) => fail("replay", error.naming(&file)),
    }
}

/// Registers the snapshot functions.
pub fn register(engine: &mut Engine, devices: &Rc<Devices>, paths: &SharedPolicy) {
    let on = Rc::clone(devices);
    // The snapshot types derive Serialize with PyTorch's key names, so Rhai's serde support
    // turns them into maps directly.
    engine.register_fn("memory_snapshot", move || -> BindingResult<Dynamic> {
        rhai::serde::to_dynamic(snapshot(&on).segments)
    });
    let on = Rc::clone(devices);
    let policy = Rc::clone(paths);
    engine.register_fn(
        "dump_snapshot",
        move |path: ImmutableString| -> BindingResult<()> {
            let path = match policy.borrow().writable(&path) {
                Ok(path) => path,
                Err(refused) => return fail("dump_snapshot", refused),
            };
            pickle::dump(&path, &snapshot(&on)).or_else(|error| fail("dump_snapshot", error))
        },
    );
    let on = Rc::clone(devices);
    engine.register_fn(
        "record_memory_history",
        move |enabled: Dynamic| -> BindingResult<()> { record_history(&on, &enabled, None) },
    );
    let on = Rc::clone(devices);
    engine.register_fn(
        "record_memory_history",
        move |enabled: Dynamic, max_entries: Dynamic| -> BindingResult<()> {
            record_history(&on, &enabled, Some(&max_entries))
        },
    );
    let on = Rc::clone(devices);
    engine.register_fn("memory_history", move || -> BindingResult<Dynamic> {
        let entries = on.current().allocator().trace().entries();
        rhai::serde::to_dynamic(history::events(&entries))
    });
    let policy = Rc::clone(paths);
    engine.register_fn(
        "replay",
        move |path: ImmutableString, conf: ImmutableString| -> BindingResult<Dynamic> {
            replay_map(&policy.borrow(), &path, &conf)
        },
    );
    let policy = Rc::clone(paths);
    engine.register_fn(
        "replay",
        move |path: ImmutableString| -> BindingResult<Dynamic> {
            replay_map(&policy.borrow(), &path, "")
        },
    );
}
