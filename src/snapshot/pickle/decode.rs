//! What is left of a snapshot once its trace events have been streamed out: the top-level
//! dict checked for a memory snapshot's shape, its segments and allocator settings read into
//! the model's types.

use super::value::Value;
use crate::snapshot::model::{Block, Segment};
use crate::snapshot::settings::{interval_index, AllocatorSettings};

/// The non-trace parts of a snapshot.
#[derive(Debug, Clone, PartialEq)]
pub struct Remainder {
    /// Per device (position in `device_traces`): the id of its trace list and how many
    /// events it held.
    pub traces: Vec<(u32, u64)>,
    /// The segments at the time of the snapshot (frames left empty).
    pub segments: Vec<Segment>,
    /// `allocator_settings`, when present (older PyTorch versions do not write it).
    pub settings: Option<AllocatorSettings>,
}

/// Reads the top-level value, or says why it is not a memory snapshot.
pub fn remainder(top: &Value) -> Result<Remainder, String> {
    let Value::Dict(_) = top else {
        return Err(format!(
            "the pickle holds a {}, not a dict with 'segments' and 'device_traces'",
            top.type_name()
        ));
    };
    let traces = match top.get("device_traces") {
        Some(Value::List(devices)) => devices
            .items
            .iter()
            .map(|item| match item {
                Value::List(list) => Ok((list.id, list.streamed)),
                other => Err(format!(
                    "device_traces holds a {}, expected one list per device",
                    other.type_name()
                )),
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(other) => {
            return Err(format!(
                "'device_traces' is a {}, expected a list",
                other.type_name()
            ))
        }
        None => return Err("the dict has no 'device_traces' (no trace was recorded)".into()),
    };
    let segments = match top.get("segments") {
        Some(Value::List(list)) => list
            .items
            .iter()
            .enumerate()
            .map(|(index, value)| segment(value).map_err(|e| format!("segment {index}: {e}")))
            .collect::<Result<Vec<_>, _>>()?,
        Some(other) => {
            return Err(format!(
                "'segments' is a {}, expected a list",
                other.type_name()
            ))
        }
        None => return Err("the dict has no 'segments'".into()),
    };
    let settings = match top.get("allocator_settings") {
        Some(value) => Some(settings(value).map_err(|e| format!("allocator_settings: {e}"))?),
        None => None,
    };
    Ok(Remainder {
        traces,
        segments,
        settings,
    })
}

fn int(value: &Value, key: &str) -> Result<i64, String> {
    match value.get(key) {
        Some(found) => found
            .as_int()
            .ok_or_else(|| format!("'{key}' is a {}, expected an int", found.type_name())),
        None => Err(format!("no '{key}'")),
    }
}

fn text(value: &Value, key: &str) -> Result<String, String> {
    match value.get(key) {
        Some(Value::Str(found)) => Ok(found.to_string()),
        Some(other) => Err(format!(
            "'{key}' is a {}, expected a string",
            other.type_name()
        )),
        None => Err(format!("no '{key}'")),
    }
}

fn flag(value: &Value, key: &str, default: bool) -> Result<bool, String> {
    match value.get(key) {
        Some(Value::Bool(found)) => Ok(*found),
        Some(other) => Err(format!(
            "'{key}' is a {}, expected a bool",
            other.type_name()
        )),
        None => Ok(default),
    }
}

fn segment(value: &Value) -> Result<Segment, String> {
    let blocks = match value.get("blocks") {
        Some(Value::List(list)) => list
            .items
            .iter()
            .map(|block| {
                Ok(Block {
                    address: int(block, "address").unwrap_or(0),
                    size: int(block, "size")?,
                    requested_size: int(block, "requested_size").unwrap_or(0),
                    state: text(block, "state")?,
                    frames: Vec::new(),
                })
            })
            .collect::<Result<Vec<_>, String>>()?,
        _ => return Err("no list of 'blocks'".into()),
    };
    let pool_id = match value.get("segment_pool_id") {
        Some(Value::Tuple(items)) if items.len() == 2 => (
            items[0].as_int().unwrap_or(0),
            items[1].as_int().unwrap_or(0),
        ),
        _ => (0, 0),
    };
    Ok(Segment {
        device: int(value, "device").unwrap_or(0),
        address: int(value, "address")?,
        total_size: int(value, "total_size")?,
        allocated_size: int(value, "allocated_size").unwrap_or(0),
        active_size: int(value, "active_size").unwrap_or(0),
        requested_size: int(value, "requested_size").unwrap_or(0),
        stream: int(value, "stream").unwrap_or(0),
        segment_type: text(value, "segment_type").unwrap_or_else(|_| "large".into()),
        segment_pool_id: pool_id,
        is_expandable: flag(value, "is_expandable", false)?,
        frames: Vec::new(),
        blocks,
    })
}

fn settings(value: &Value) -> Result<AllocatorSettings, String> {
    let defaults = AllocatorSettings::default();
    let optional_int = |key: &str, default: i64| match value.get(key) {
        Some(_) => int(value, key),
        None => Ok(default),
    };
    let garbage_collection_threshold = match value.get("garbage_collection_threshold") {
        Some(Value::Float(threshold)) => *threshold,
        Some(other) => other
            .as_int()
            .map(|v| v as f64)
            .ok_or_else(|| format!("'garbage_collection_threshold' is a {}", other.type_name()))?,
        None => 0.0,
    };
    let mut divisions = defaults.roundup_power2_divisions;
    if let Some(Value::Dict(entries)) = value.get("roundup_power2_divisions") {
        for (key, divisions_value) in entries {
            let index = key
                .as_str()
                .and_then(interval_index)
                .ok_or_else(|| format!("roundup_power2_divisions has a key {key:?}"))?;
            divisions[index] = divisions_value
                .as_int()
                .ok_or_else(|| "roundup_power2_divisions holds a non-integer".to_string())?;
        }
    }
    Ok(AllocatorSettings {
        alloc_conf: match value.get("PYTORCH_CUDA_ALLOC_CONF") {
            Some(_) => text(value, "PYTORCH_CUDA_ALLOC_CONF")?,
            None => String::new(),
        },
        max_split_size: optional_int("max_split_size", -1)?,
        garbage_collection_threshold,
        expandable_segments: flag(value, "expandable_segments", false)?,
        pinned_num_register_threads: optional_int("pinned_num_register_threads", 1)?,
        release_lock_on_cudamalloc: flag(value, "release_lock_on_cudamalloc", false)?,
        pinned_use_cuda_host_register: flag(value, "pinned_use_cuda_host_register", false)?,
        graph_capture_record_stream_reuse: flag(value, "graph_capture_record_stream_reuse", false)?,
        roundup_power2_divisions: divisions,
    })
}
