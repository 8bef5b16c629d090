//! What is left of a snapshot once its trace entries have been streamed out: the top-level
//! value checked for a memory snapshot's shape (a dict, or PyTorch 2.0's bare list of
//! segments), its segments (records already), its traces per device, pinned host memory,
//! allocator settings and annotations.

use super::frames::Stacks;
use super::records::SegmentRecord;
use super::value::Value;
use crate::snapshot::model::Annotation;
use crate::snapshot::settings::{interval_index, AllocatorSettings};

/// The non-trace parts of a snapshot.
#[derive(Debug, Clone, Default)]
pub struct Remainder {
    /// Per device (position in `device_traces`): the id of its trace list and how many
    /// entries it held.
    pub traces: Vec<(u32, u64)>,
    /// Whether the file has `device_traces` at all (PyTorch 2.0's bare list of segments does
    /// not).
    pub has_device_traces: bool,
    /// `host_traces` (pinned host memory, PyTorch 2.13): per list, its id and entries.
    pub host_traces: Vec<(u32, u64)>,
    /// The segments at the time of the snapshot.
    pub segments: Vec<SegmentRecord>,
    /// `host_segments`: pinned host memory's segments.
    pub host_segments: Vec<SegmentRecord>,
    /// `allocator_settings`, when present (PyTorch before 2.3 does not write it).
    pub settings: Option<AllocatorSettings>,
    /// `external_annotations` (PyTorch 2.5 and later).
    pub annotations: Vec<Annotation>,
    /// Every distinct frame and stack of the file: resolves the stack ids of entries,
    /// segments and blocks.
    pub stacks: Stacks,
}

impl Remainder {}

/// Reads the top-level value, or says why it is not a memory snapshot.
pub fn remainder(top: &Value, stacks: Stacks) -> Result<Remainder, String> {
    match top {
        Value::Dict(_) => snapshot(top, stacks),
        Value::List(list) => Ok(Remainder {
            segments: segments(&list.items, "segment").map_err(|message| {
                format!("the pickle holds a list, {message} (a bare list of segments is what PyTorch 2.0 and before pickled)")
            })?,
            stacks,
            ..Remainder::default()
        }),
        other => Err(format!(
            "the pickle holds {}, not a dict with 'segments' and 'device_traces'",
            other.described()
        )),
    }
}

fn snapshot(top: &Value, stacks: Stacks) -> Result<Remainder, String> {
    let (traces, has_device_traces) = match top.get("device_traces") {
        Some(value) => (traces(value, "device_traces")?, true),
        None => (Vec::new(), false),
    };
    let host_traces = match top.get("host_traces") {
        Some(value) => self::traces(value, "host_traces")?,
        None => Vec::new(),
    };
    let segments = match top.get("segments") {
        Some(Value::List(list)) => self::segments(&list.items, "segment")?,
        Some(other) => {
            return Err(format!(
                "'segments' is {}, expected a list",
                other.described()
            ))
        }
        None => return Err("the dict has no 'segments'".into()),
    };
    let host_segments = match top.get("host_segments") {
        Some(Value::List(list)) => self::segments(&list.items, "host segment")?,
        Some(other) => {
            return Err(format!(
                "'host_segments' is {}, expected a list",
                other.described()
            ))
        }
        None => Vec::new(),
    };
    let settings = match top.get("allocator_settings") {
        Some(value) => Some(settings(value).map_err(|e| format!("allocator_settings: {e}"))?),
        None => None,
    };
    let annotations = match top.get("external_annotations") {
        Some(Value::List(list)) => list
            .items
            .iter()
            .enumerate()
            .map(|(index, item)| {
                annotation(item).map_err(|e| format!("external_annotations[{index}]: {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(other) => {
            return Err(format!(
                "'external_annotations' is {}, expected a list",
                other.described()
            ))
        }
        None => Vec::new(),
    };
    Ok(Remainder {
        traces,
        has_device_traces,
        host_traces,
        segments,
        host_segments,
        settings,
        annotations,
        stacks,
    })
}

/// The trace lists of `device_traces` (one list per device) or `host_traces` (the same, or
/// one flat list of entries).
fn traces(value: &Value, key: &str) -> Result<Vec<(u32, u64)>, String> {
    let Value::List(outer) = value else {
        return Err(format!("'{key}' is {}, expected a list", value.described()));
    };
    if outer.streamed > 0 {
        return Ok(vec![(outer.id, outer.streamed)]);
    }
    outer
        .items
        .iter()
        .map(|item| match item {
            Value::List(list) => Ok((list.id, list.streamed)),
            // A memoized empty list referenced again (one object for several devices).
            Value::Elided => Ok((u32::MAX, 0)),
            other => Err(format!(
                "{key} holds {}, expected one list per device",
                other.described()
            )),
        })
        .collect()
}

/// The records of a list of segments (each read as it was appended).
fn segments(items: &[Value], what: &str) -> Result<Vec<SegmentRecord>, String> {
    items
        .iter()
        .enumerate()
        .map(|(index, item)| match item {
            Value::Segment(record) => Ok((**record).clone()),
            other => Err(format!(
                "{what} {index} is {}, expected a dict",
                other.described()
            )),
        })
        .collect()
}

fn int(value: &Value, key: &str) -> Result<i64, String> {
    match value.get(key) {
        Some(found) => found.as_int().ok_or_else(|| {
            format!(
                "'{key}' is {}, expected an int of 64 signed bits",
                found.described()
            )
        }),
        None => Err(format!("no '{key}'")),
    }
}

fn text(value: &Value, key: &str) -> Result<String, String> {
    match value.get(key) {
        Some(Value::Str(found)) => Ok(found.to_string()),
        Some(other) => Err(format!(
            "'{key}' is {}, expected a string",
            other.described()
        )),
        None => Err(format!("no '{key}'")),
    }
}

fn flag(value: &Value, key: &str, default: bool) -> Result<bool, String> {
    match value.get(key) {
        Some(Value::Bool(found)) => Ok(*found),
        Some(other) => Err(format!("'{key}' is {}, expected a bool", other.described())),
        None => Ok(default),
    }
}

fn annotation(value: &Value) -> Result<Annotation, String> {
    let Value::Dict(_) = value else {
        return Err(format!("{}, expected a dict", value.described()));
    };
    Ok(Annotation {
        stage: text(value, "stage")?,
        name: text(value, "name")?,
        device: int(value, "device").unwrap_or(0),
        time_us: int(value, "time_us").unwrap_or(0),
    })
}

fn settings(value: &Value) -> Result<AllocatorSettings, String> {
    let Value::Dict(_) = value else {
        return Err(format!("{}, expected a dict", value.described()));
    };
    let defaults = AllocatorSettings::default();
    let optional_int = |key: &str, default: i64| match value.get(key) {
        Some(_) => int(value, key),
        None => Ok(default),
    };
    let garbage_collection_threshold = match value.get("garbage_collection_threshold") {
        Some(Value::Float(threshold)) => *threshold,
        Some(other) => other.as_int().map(|v| v as f64).ok_or_else(|| {
            format!(
                "'garbage_collection_threshold' is {}, expected a number",
                other.described()
            )
        })?,
        None => 0.0,
    };
    let mut divisions = defaults.roundup_power2_divisions;
    match value.get("roundup_power2_divisions") {
        Some(Value::Dict(entries)) => {
            for (key, count) in entries {
                let slot = key
                    .as_str()
                    .and_then(interval_index)
                    .and_then(|index| divisions.get_mut(index))
                    .ok_or_else(|| match key.as_str() {
                        Some(key) => format!("roundup_power2_divisions has a key '{key}', not a power of 2 from 1 to 32768"),
                        None => format!("roundup_power2_divisions has a key that is {}", key.described()),
                    })?;
                *slot = count.as_int().ok_or_else(|| {
                    format!(
                        "roundup_power2_divisions holds {}, expected an int",
                        count.described()
                    )
                })?;
            }
        }
        Some(other) => {
            return Err(format!(
                "'roundup_power2_divisions' is {}, expected a dict",
                other.described()
            ))
        }
        None => {}
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
