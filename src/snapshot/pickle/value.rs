//! The values the streaming unpickler builds, and its memo.
//!
//! Only what a snapshot needs is kept: scalars, strings, tuples, lists and dicts. Trace
//! events never become values (they go to the caller as they are decoded), and the memo keeps
//! strings and scalars but not containers: a later reference to a memoized list or dict (in
//! PyTorch's files, shared `frames` lists and frame dicts) reads back as [`Value::Elided`].
//! That keeps memory in proportion to the live state, not to the length of the trace.

use std::collections::HashMap;
use std::rc::Rc;

use super::event::RawEvent;

/// A list being built: its items, and how many trace events it streamed instead of keeping.
#[derive(Debug, Clone, PartialEq)]
pub struct List {
    /// Creation order of the list in the pickle, to tell trace lists apart.
    pub id: u32,
    /// Items kept.
    pub items: Vec<Value>,
    /// Trace events appended to it and handed to the caller instead of kept.
    pub streamed: u64,
}

/// One unpickled value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `None`.
    None,
    /// `True`/`False`.
    Bool(bool),
    /// An integer that fits 64 bits.
    Int(i64),
    /// An integer that does not.
    BigInt,
    /// A float.
    Float(f64),
    /// A string.
    Str(Rc<str>),
    /// A bytes object (never part of a snapshot).
    Bytes,
    /// A tuple.
    Tuple(Vec<Value>),
    /// A list.
    List(List),
    /// A dict, in insertion order.
    Dict(Vec<(Value, Value)>),
    /// A trace event decoded by the fast path, waiting to be appended to its list.
    Event(Box<RawEvent>),
    /// A memoized container that was not kept. `true` when it held a frame named
    /// `empty_cache` (all a replay wants to know of frames).
    Elided(bool),
}

impl Value {
    /// The string, if this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(text) => Some(text),
            _ => None,
        }
    }

    /// The integer, if this is one (booleans count, as in Python).
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(value) => Some(*value),
            Value::Bool(flag) => Some(i64::from(*flag)),
            _ => None,
        }
    }

    /// The value of `key` if this is a dict holding it.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Dict(entries) => entries
                .iter()
                .find(|(k, _)| k.as_str() == Some(key))
                .map(|(_, v)| v),
            _ => None,
        }
    }

    /// Python's name of the value's type, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "bool",
            Value::Int(_) | Value::BigInt => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Bytes => "bytes",
            Value::Tuple(_) => "tuple",
            Value::List(_) => "list",
            Value::Dict(_) | Value::Event(_) => "dict",
            Value::Elided(_) => "shared object",
        }
    }

    /// Whether this frame list, frame dict or elided container mentions a function named
    /// `empty_cache` (a `segment_free` caused by `torch.cuda.empty_cache()`).
    pub fn has_empty_cache_frame(&self) -> bool {
        match self {
            Value::Elided(flag) => *flag,
            Value::Dict(_) => self.get("name").and_then(Value::as_str) == Some("empty_cache"),
            Value::List(list) => list.items.iter().any(Value::has_empty_cache_frame),
            _ => false,
        }
    }

    /// What the memo keeps of this value: immutable scalars and strings whole, small tuples
    /// whole, containers only as the `empty_cache` mark when they carry it (or whole when
    /// `containers` is set).
    fn memo_form(&self, containers: bool) -> Option<Value> {
        match self {
            Value::List(_) | Value::Dict(_) | Value::Tuple(_) if containers => Some(self.clone()),
            Value::List(_) | Value::Dict(_) | Value::Elided(_) => {
                self.has_empty_cache_frame().then_some(Value::Elided(true))
            }
            Value::Event(_) => None,
            Value::Tuple(items) if items.len() > 8 => None,
            other => Some(other.clone()),
        }
    }
}

/// The unpickler's memo: ids are assigned to every memoized value, but only what
/// `Value::memo_form` (crate-private) keeps is stored.
#[derive(Debug, Default)]
pub struct Memo {
    kept: HashMap<u32, Value>,
    /// One past the highest id assigned (`MEMOIZE` uses it as the next id).
    next: u32,
    /// Whether containers are kept whole (reading a whole snapshot into values).
    containers: bool,
}

impl Memo {
    /// A memo that keeps containers whole: for reading a whole (small) pickle as values.
    pub fn keeping_containers() -> Memo {
        Memo {
            containers: true,
            ..Memo::default()
        }
    }

    /// The id `MEMOIZE` gives the next value.
    pub fn next_id(&self) -> u32 {
        self.next
    }

    /// Records `value` under `id`.
    pub fn put(&mut self, id: u32, value: &Value) {
        match value.memo_form(self.containers) {
            Some(kept) => {
                self.kept.insert(id, kept);
            }
            None => {
                self.kept.remove(&id);
            }
        }
        self.next = self.next.max(id.saturating_add(1));
    }

    /// The value under `id`: what was kept, [`Value::Elided`] for a container that was not,
    /// `None` for an id never assigned (a corrupted pickle).
    pub fn get(&self, id: u32) -> Option<Value> {
        match self.kept.get(&id) {
            Some(value) => Some(value.clone()),
            None if id < self.next => Some(Value::Elided(false)),
            None => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memo_keeps_strings_and_marks_only() {
        let mut memo = Memo::default();
        memo.put(0, &Value::Str("alloc".into()));
        memo.put(
            1,
            &Value::List(List {
                id: 0,
                items: vec![Value::Int(1)],
                streamed: 0,
            }),
        );
        let frame = Value::Dict(vec![(
            Value::Str("name".into()),
            Value::Str("empty_cache".into()),
        )]);
        memo.put(2, &frame);
        assert_eq!(memo.get(0), Some(Value::Str("alloc".into())));
        assert_eq!(memo.get(1), Some(Value::Elided(false)));
        assert_eq!(memo.get(2), Some(Value::Elided(true)));
        assert_eq!(memo.get(3), None);
        assert_eq!(memo.next_id(), 3);
    }
}
