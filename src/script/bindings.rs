//! Registers every binding scripts see, grouped by topic.

use std::rc::Rc;

use rhai::Engine;

use super::{memory_api, snapshot_api, tensor_api, values_api};
use crate::tensor::Runtime;

/// Registers the tensor, memory and snapshot bindings.
pub fn register(engine: &mut Engine, runtime: &Rc<Runtime>) {
    tensor_api::register(engine, runtime);
    memory_api::register(engine, runtime);
    snapshot_api::register(engine, runtime);
    values_api::register(engine);
}
