//! Snapshot files for the replay tests, written here rather than kept as binaries: small
//! snapshots built event by event, and the real H200 recordings of tests/replay/fixtures/ cut
//! down as PyTorch's ring buffer cuts a long job's history (the last `max_entries` events) or
//! as `skip_actions` leaves action kinds out. Each test file uses a different subset.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use gpumem::snapshot::pickle::{self, value::Value as Read};
use serde_pickle::{HashableValue, SerOptions, Value};

/// A dict key.
pub fn key(name: &str) -> HashableValue {
    HashableValue::String(name.into())
}

/// A frame `{name, filename, line}`.
pub fn frame(filename: &str, line: i64, name: &str) -> Value {
    let mut map = BTreeMap::new();
    map.insert(key("name"), Value::String(name.into()));
    map.insert(key("filename"), Value::String(filename.into()));
    map.insert(key("line"), Value::I64(line));
    Value::Dict(map)
}

/// A trace event on the default stream with `frames`.
pub fn event_at(action: &str, addr: i64, size: i64, frames: Vec<Value>) -> Value {
    let mut map = BTreeMap::new();
    map.insert(key("action"), Value::String(action.into()));
    let addr_key = if action == "oom" {
        "device_free"
    } else {
        "addr"
    };
    map.insert(key(addr_key), Value::I64(addr));
    map.insert(key("size"), Value::I64(size));
    map.insert(key("stream"), Value::I64(0));
    map.insert(key("time_us"), Value::I64(1));
    map.insert(key("frames"), Value::List(frames));
    Value::Dict(map)
}

/// A trace event on the default stream without frames.
pub fn event(action: &str, addr: i64, size: i64) -> Value {
    event_at(action, addr, size, Vec::new())
}

/// A block `(address, size, requested, state)` of a segment.
pub type BlockSpec = (i64, i64, i64, &'static str);

/// A segment on the default stream of device 0.
pub fn segment(address: i64, total: i64, kind: &str, blocks: &[BlockSpec]) -> Value {
    let mut map = BTreeMap::new();
    let int = |value: i64| Value::I64(value);
    map.insert(key("device"), int(0));
    map.insert(key("address"), int(address));
    map.insert(key("total_size"), int(total));
    let active: i64 = blocks
        .iter()
        .filter(|b| b.3.starts_with("active"))
        .map(|b| b.1)
        .sum();
    map.insert(key("allocated_size"), int(active));
    map.insert(key("active_size"), int(active));
    map.insert(key("requested_size"), int(active));
    map.insert(key("stream"), int(0));
    map.insert(key("segment_type"), Value::String(kind.into()));
    map.insert(key("segment_pool_id"), Value::Tuple(vec![int(0), int(0)]));
    map.insert(key("is_expandable"), Value::Bool(false));
    map.insert(key("frames"), Value::List(Vec::new()));
    let blocks = blocks
        .iter()
        .map(|&(address, size, requested, state)| {
            let mut block = BTreeMap::new();
            block.insert(key("address"), int(address));
            block.insert(key("size"), int(size));
            block.insert(key("requested_size"), int(requested));
            block.insert(key("state"), Value::String(state.into()));
            block.insert(key("frames"), Value::List(Vec::new()));
            Value::Dict(block)
        })
        .collect();
    map.insert(key("blocks"), Value::List(blocks));
    Value::Dict(map)
}

/// A snapshot of one device with `segments` and the trace `events`.
pub fn snapshot(segments: Vec<Value>, events: Vec<Value>) -> Vec<u8> {
    let mut top = BTreeMap::new();
    top.insert(key("segments"), Value::List(segments));
    top.insert(key("device_traces"), Value::List(vec![Value::List(events)]));
    serde_pickle::value_to_vec(&Value::Dict(top), SerOptions::new()).expect("pickles")
}

/// Writes `bytes` to `dir/name`.
pub fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).expect("write");
    path
}

/// gpumem's reading of a value, as serde-pickle writes it again.
fn convert(value: &Read) -> Value {
    match value {
        // A whole read keeps plain values: events, frames and segments stay dicts and lists.
        Read::None
        | Read::Elided
        | Read::Bytes
        | Read::BigInt
        | Read::Event(_)
        | Read::Frame(_)
        | Read::Stack(_) => Value::None,
        // Segments are read into records even when the file is read whole.
        Read::Segment(record) => segment_value(record),
        Read::Unsigned(int) => Value::I64(*int as i64),
        Read::Bool(flag) => Value::Bool(*flag),
        Read::Int(int) => Value::I64(*int),
        Read::Float(float) => Value::F64(*float),
        Read::Str(text) => Value::String(text.to_string()),
        Read::Tuple(items) => Value::Tuple(items.iter().map(convert).collect()),
        Read::List(list) if !list.blocks.is_empty() => {
            Value::List(list.blocks.iter().map(block_value).collect())
        }
        Read::List(list) => Value::List(list.items.iter().map(convert).collect()),
        Read::Dict(entries) => Value::Dict(
            entries
                .iter()
                .filter_map(|(k, v)| Some((hashable(k)?, convert(v))))
                .collect(),
        ),
    }
}

/// A segment record as the dict PyTorch writes (frames left empty).
fn segment_value(record: &pickle::SegmentRecord) -> Value {
    let mut map = BTreeMap::new();
    let int = |value: u64| Value::I64(value as i64);
    map.insert(key("device"), Value::I64(record.device));
    map.insert(key("address"), int(record.address));
    map.insert(key("total_size"), int(record.total_size));
    map.insert(key("allocated_size"), int(record.allocated_size));
    map.insert(key("active_size"), int(record.active_size));
    map.insert(key("requested_size"), int(record.requested_size));
    map.insert(key("stream"), Value::I64(record.stream));
    let kind = if record.small { "small" } else { "large" };
    map.insert(key("segment_type"), Value::String(kind.into()));
    map.insert(
        key("segment_pool_id"),
        Value::Tuple(vec![Value::I64(record.pool.0), Value::I64(record.pool.1)]),
    );
    map.insert(key("is_expandable"), Value::Bool(record.expandable));
    map.insert(key("frames"), Value::List(Vec::new()));
    map.insert(
        key("blocks"),
        Value::List(record.blocks.iter().map(block_value).collect()),
    );
    Value::Dict(map)
}

/// A block record as the dict PyTorch writes (frames left empty).
fn block_value(block: &pickle::BlockRecord) -> Value {
    let mut map = BTreeMap::new();
    map.insert(key("address"), Value::I64(block.address as i64));
    map.insert(key("size"), Value::I64(block.size as i64));
    map.insert(
        key("requested_size"),
        Value::I64(block.requested_size as i64),
    );
    map.insert(key("state"), Value::String(block.state.name().into()));
    map.insert(key("frames"), Value::List(Vec::new()));
    Value::Dict(map)
}

fn hashable(value: &Read) -> Option<HashableValue> {
    Some(match value {
        Read::Str(text) => HashableValue::String(text.to_string()),
        Read::Int(int) => HashableValue::I64(*int),
        Read::Bool(flag) => HashableValue::Bool(*flag),
        Read::Tuple(items) => {
            HashableValue::Tuple(items.iter().map(hashable).collect::<Option<Vec<_>>>()?)
        }
        _ => return None,
    })
}

/// A recorded fixture (tests/replay/fixtures/NAME.pickle) as values.
pub fn fixture_values(name: &str) -> Value {
    let path = crate::common::tests_path(&format!("replay/fixtures/{name}.pickle"));
    // The reader's default memory bound is for streaming; holding every event of a recorded
    // fixture as values takes some hundred times the file, so the bound is raised here.
    let file = std::fs::File::open(&path).expect("the fixture opens");
    let limits = pickle::ReadLimits {
        memory_per_byte: 1024,
        ..pickle::ReadLimits::default()
    };
    let mut unpickler = pickle::vm::Unpickler::whole(
        std::io::BufReader::new(file),
        |_: pickle::Emitted| -> Result<(), pickle::SnapshotError> { Ok(()) },
    )
    .with_limits(limits, file_size(&path));
    convert(&unpickler.run().expect("the fixture reads"))
}

/// The bytes of the file at `path`, when known.
fn file_size(path: &Path) -> Option<u64> {
    std::fs::metadata(path).ok().map(|meta| meta.len())
}

/// The first device's trace of a snapshot value, to change it.
pub fn trace_of(top: &mut Value) -> &mut Vec<Value> {
    let Value::Dict(map) = top else {
        panic!("a snapshot is a dict")
    };
    let Some(Value::List(devices)) = map.get_mut(&key("device_traces")) else {
        panic!("device_traces is a list")
    };
    let Some(Value::List(trace)) = devices.first_mut() else {
        panic!("one trace per device")
    };
    trace
}

/// The action of a trace event value.
pub fn action_of(event: &Value) -> String {
    match event {
        Value::Dict(map) => match map.get(&key("action")) {
            Some(Value::String(action)) => action.clone(),
            _ => String::new(),
        },
        _ => String::new(),
    }
}

/// The fixture `name` with only the last `keep` events of its trace, as PyTorch's ring buffer
/// of `max_entries = keep` holds a longer run; its `segments` stay the end state.
pub fn truncated(name: &str, keep: usize) -> Vec<u8> {
    let mut top = fixture_values(name);
    let trace = trace_of(&mut top);
    let cut = trace.len().saturating_sub(keep);
    trace.drain(..cut);
    serde_pickle::value_to_vec(&top, SerOptions::new()).expect("pickles")
}

/// The fixture `name` without events of `actions`, as `_record_memory_history(skip_actions=
/// actions)` records it.
pub fn without_actions(name: &str, actions: &[&str]) -> Vec<u8> {
    let mut top = fixture_values(name);
    trace_of(&mut top).retain(|event| !actions.contains(&action_of(event).as_str()));
    serde_pickle::value_to_vec(&top, SerOptions::new()).expect("pickles")
}

/// The fixture `name` with its whole trace removed: a snapshot taken without recording the
/// memory history.
pub fn without_history(name: &str) -> Vec<u8> {
    let mut top = fixture_values(name);
    trace_of(&mut top).clear();
    serde_pickle::value_to_vec(&top, SerOptions::new()).expect("pickles")
}
