//! Registers every binding scripts see, grouped by topic. Each binding that touches a device
//! receives the session's [`Devices`] and asks it for the current device (or the one named);
//! none holds on to one device's runtime, so a new device or stream is a change in
//! [`Devices`]/[`crate::tensor::Runtime`], not in every binding.

use std::rc::Rc;

use rhai::Engine;

use super::{
    device_api, mem_pool_api, memory_api, oom_error, progress_api, sandbox, snapshot_api,
    stream_api, tensor_api, values_api, viz_api,
};
use crate::tensor::Devices;

/// Registers the tensor, device, memory, private pool, snapshot and visualisation bindings; `map_settings` is
/// how `memory_map()` draws by default, `paths` where scripts may read and write files.
pub fn register(
    engine: &mut Engine,
    devices: &Rc<Devices>,
    map_settings: &viz_api::MapSettings,
    paths: &sandbox::SharedPolicy,
) {
    tensor_api::register(engine, devices);
    device_api::register(engine, devices);
    stream_api::register(engine, devices);
    memory_api::register(engine, devices);
    mem_pool_api::register(engine, devices);
    snapshot_api::register(engine, devices, paths);
    values_api::register(engine);
    viz_api::register(engine, devices, map_settings);
    oom_error::register(engine);
    progress_api::register(engine);
}
