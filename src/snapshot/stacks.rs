//! Where a replay learns each trace event's stack of frames ([`StackSource`]), named by a small
//! key ([`StackKey`]) so that per-stack counts cost a few bytes each, however long the frames.
//!
//! The streaming reader hands out events without their frames (it elides shared frame lists to
//! keep memory flat), so for now the stacks come from reading a small file whole
//! ([`LoadedStacks`], files up to [`LOADED_MAX_BYTES`]); a reader that streams one stack id per
//! event plugs in as another [`StackSource`] without changing the counting or the grouping
//! ([`super::sites`]).

use std::collections::HashMap;
use std::path::Path;

use super::model::Frame;
use super::pickle::value::Value;
use super::pickle::{self, Emitted, SnapshotError};

/// Names one distinct stack of a snapshot; [`StackKey::NONE`] is the empty stack.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackKey(pub u32);

impl StackKey {
    /// No frames recorded.
    pub const NONE: StackKey = StackKey(0);

    /// The key as an index into dense per-stack tables.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Tells a replay the stack of each trace event and, afterwards, the frames of a stack.
pub trait StackSource {
    /// The stack of the event being replayed.
    fn stack(&self, emitted: &Emitted) -> StackKey;
    /// The frames of `key`, innermost first (none for [`StackKey::NONE`] or a key it did not
    /// give).
    fn frames(&self, key: StackKey) -> Vec<Frame>;
}

/// A source that knows no frames: every event has the empty stack.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoStacks;

impl StackSource for NoStacks {
    fn stack(&self, _emitted: &Emitted) -> StackKey {
        StackKey::NONE
    }

    fn frames(&self, _key: StackKey) -> Vec<Frame> {
        Vec::new()
    }
}

/// The largest file whose stacks are read whole ([`LoadedStacks::read`]): reading a pickle
/// whole holds every value at once, several times the file's size.
pub const LOADED_MAX_BYTES: u64 = 64 << 20;

/// The stacks of every trace event of a file read whole: one key per event (by the event's
/// index among all trace events, as the streaming reader numbers them) and each distinct stack
/// once.
#[derive(Debug, Clone, Default)]
pub struct LoadedStacks {
    by_event: Vec<StackKey>,
    stacks: Vec<Vec<Frame>>,
}

impl LoadedStacks {
    /// Reads the stacks of the file at `path`, or says why they are not available: a file
    /// larger than [`LOADED_MAX_BYTES`], or one the whole-file reader refuses.
    pub fn read(path: &Path) -> Result<LoadedStacks, String> {
        let bytes = std::fs::metadata(path)
            .map_err(|error| format!("{}: {error}", path.display()))?
            .len();
        if bytes > LOADED_MAX_BYTES {
            return Err(format!(
                "allocation sites are read for files up to {} MiB for now (this one has {} MiB): the streaming reader does not hand out frames yet",
                LOADED_MAX_BYTES >> 20,
                bytes >> 20
            ));
        }
        let top = pickle::load(path).map_err(|error: SnapshotError| error.to_string())?;
        Ok(LoadedStacks::from_value(&top))
    }

    /// The stacks of a snapshot already read whole.
    pub fn from_value(top: &Value) -> LoadedStacks {
        let mut table = LoadedStacks {
            by_event: Vec::new(),
            stacks: vec![Vec::new()],
        };
        let mut known: HashMap<Vec<Frame>, StackKey> = HashMap::new();
        known.insert(Vec::new(), StackKey::NONE);
        let Some(Value::List(devices)) = top.get("device_traces") else {
            return table;
        };
        for device in &devices.items {
            let Value::List(trace) = device else {
                continue;
            };
            for event in trace
                .items
                .iter()
                .filter(|item| item.get("action").is_some())
            {
                let frames = event.get("frames").map(frames_of).unwrap_or_default();
                let next = StackKey(u32::try_from(table.stacks.len()).unwrap_or(u32::MAX));
                let key = *known.entry(frames).or_insert_with_key(|frames| {
                    table.stacks.push(frames.clone());
                    next
                });
                table.by_event.push(key);
            }
        }
        table
    }

    /// Distinct stacks, the empty one included.
    pub fn len(&self) -> usize {
        self.stacks.len()
    }

    /// Whether no event has frames.
    pub fn is_empty(&self) -> bool {
        self.stacks.len() <= 1
    }
}

impl StackSource for LoadedStacks {
    fn stack(&self, emitted: &Emitted) -> StackKey {
        usize::try_from(emitted.index)
            .ok()
            .and_then(|index| self.by_event.get(index))
            .copied()
            .unwrap_or(StackKey::NONE)
    }

    fn frames(&self, key: StackKey) -> Vec<Frame> {
        self.stacks.get(key.index()).cloned().unwrap_or_default()
    }
}

/// A `frames` value as frames (entries that are not `{name, filename, line}` dicts are left
/// out).
fn frames_of(value: &Value) -> Vec<Frame> {
    let Value::List(list) = value else {
        return Vec::new();
    };
    list.items
        .iter()
        .filter_map(|frame| {
            Some(Frame {
                name: frame.get("name")?.as_str()?.to_string(),
                filename: frame.get("filename")?.as_str()?.to_string(),
                line: frame.get("line").and_then(Value::as_int).unwrap_or(0),
            })
        })
        .collect()
}
