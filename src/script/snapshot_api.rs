//! Snapshots from scripts, named as in `torch.cuda.memory`: `memory_snapshot()` with every
//! key PyTorch writes, `dump_snapshot(path)` (a pickle PyTorch's tools read), and
//! `replay(path, conf)` (the `gpumem replay` report as a map).

use std::path::Path;
use std::rc::Rc;

use rhai::{Dynamic, Engine, ImmutableString};

use super::args::{fail, BindingResult};
use crate::alloc::AllocConf;
use crate::snapshot::replay::{replay, ReplayOptions};
use crate::snapshot::{capture, pickle, AllocatorSettings, Snapshot};
use crate::tensor::Runtime;

/// The runtime's state as a PyTorch snapshot.
fn snapshot(runtime: &Runtime) -> Snapshot {
    let allocator = runtime.allocator();
    Snapshot {
        segments: capture::segments(&allocator, allocator.device().index(), &|_| Vec::new()),
        device_traces: vec![Vec::new()],
        allocator_settings: AllocatorSettings::from_conf(allocator.config()),
        external_annotations: Vec::new(),
    }
}

/// `replay(path, conf)`: the report's JSON form as a map (`conf` "" = the recorded config).
fn replay_map(path: &str, conf: &str) -> BindingResult<Dynamic> {
    let conf = if conf.is_empty() {
        None
    } else {
        match AllocConf::parse(conf) {
            Ok(conf) => Some(conf),
            Err(error) => return fail("replay", format!("invalid allocator config '{conf}': {error}")),
        }
    };
    let options = ReplayOptions {
        conf,
        ..ReplayOptions::default()
    };
    match replay(Path::new(path), &options, &mut |_, _| {}) {
        Ok(report) => rhai::serde::to_dynamic(report.to_json()),
        Err(error) => fail("replay", format!("{path}: {error}")),
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
    engine.register_fn(
        "replay",
        |path: ImmutableString, conf: ImmutableString| -> BindingResult<Dynamic> {
            replay_map(&path, &conf)
        },
    );
    engine.register_fn("replay", |path: ImmutableString| -> BindingResult<Dynamic> {
        replay_map(&path, "")
    });
}
