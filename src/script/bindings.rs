//! Registers every binding scripts see, grouped by topic.

use std::rc::Rc;

use rhai::Engine;

use super::{memory_api, tensor_api, values_api};
use crate::tensor::Runtime;

/// Registers the tensor and memory bindings.
pub fn register(engine: &mut Engine, runtime: &Rc<Runtime>) {
    tensor_api::register(engine, runtime);
    memory_api::register(engine, runtime);
    values_api::register(engine);
}
