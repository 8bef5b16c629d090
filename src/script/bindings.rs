//! Registers every binding scripts see, grouped by topic.

use std::rc::Rc;

use rhai::Engine;

use super::location::Locator;
use super::{memory_api, oom_error, progress_api, tensor_api, values_api, viz_api};
use crate::tensor::Runtime;

/// Registers the tensor, memory and visualisation bindings; `map_settings` is how
/// `memory_map()` draws by default, and bindings that allocate or free tell `locator` where
/// they were called from.
pub fn register(
    engine: &mut Engine,
    runtime: &Rc<Runtime>,
    map_settings: &viz_api::MapSettings,
    locator: &Rc<Locator>,
) {
    tensor_api::register(engine, runtime, locator);
    memory_api::register(engine, runtime, locator);
    values_api::register(engine, locator);
    viz_api::register(engine, runtime, map_settings);
    oom_error::register(engine);
    progress_api::register(engine);
}
