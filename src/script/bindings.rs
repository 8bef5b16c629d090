//! Registers every binding scripts see, grouped by topic.

use std::rc::Rc;

use rhai::Engine;

use super::{memory_api, oom_error, progress_api, snapshot_api, tensor_api, values_api, viz_api};
use crate::tensor::Runtime;

/// Registers the tensor, memory, snapshot and visualisation bindings; `map_settings` is how
/// `memory_map()` draws by default.
pub fn register(engine: &mut Engine, runtime: &Rc<Runtime>, map_settings: &viz_api::MapSettings) {
    tensor_api::register(engine, runtime);
    memory_api::register(engine, runtime);
    snapshot_api::register(engine, runtime);
    values_api::register(engine);
    viz_api::register(engine, runtime, map_settings);
    oom_error::register(engine);
    progress_api::register(engine);
}
