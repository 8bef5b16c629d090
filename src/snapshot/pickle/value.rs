//! The values the streaming unpickler builds, and its memo.
//!
//! Only what a snapshot needs is kept: scalars, strings, tuples, lists and dicts. Trace
//! events never become values (they go to the caller as they are decoded), and the memo keeps
//! strings, scalars and short flat tuples but not containers: a later reference to a memoized
//! list or dict (in PyTorch's files, shared `frames` lists and frame dicts) reads back as
//! [`Value::Elided`]. That keeps memory in proportion to the live state, not to the length of
//! the trace, and no reference can make the reader copy a container.

use std::collections::HashMap;
use std::rc::Rc;

use super::entry::RawEvent;

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
    /// A list (boxed: it is the largest variant).
    List(Box<List>),
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

    /// The value of `key` if this is a dict holding it (the last one set, as in Python, when a
    /// file sets a key twice).
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Dict(entries) => entries
                .iter()
                .rev()
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

    /// Whether this is a frame dict of a function named `empty_cache`.
    fn is_empty_cache_frame(&self) -> bool {
        self.get("name").and_then(Value::as_str) == Some("empty_cache")
    }

    /// Whether this frame list, frame dict or elided container mentions a function named
    /// `empty_cache` (a `segment_free` caused by `torch.cuda.empty_cache()`). A list is looked
    /// into one level only: frames are dicts in a list.
    pub fn has_empty_cache_frame(&self) -> bool {
        match self {
            Value::Elided(flag) => *flag,
            Value::Dict(_) => self.is_empty_cache_frame(),
            Value::List(list) => list.items.iter().any(|item| match item {
                Value::Elided(flag) => *flag,
                Value::Dict(_) => item.is_empty_cache_frame(),
                _ => false,
            }),
            _ => false,
        }
    }

    /// How many values [`Value::has_empty_cache_frame`] looks at (the reader's work budget).
    pub fn empty_cache_scan_cost(&self) -> u64 {
        let entries = |value: &Value| match value {
            Value::Dict(entries) => entries.len() as u64,
            _ => 0,
        };
        match self {
            Value::Dict(entries) => 1 + entries.len() as u64,
            Value::List(list) => 1 + list.items.iter().map(|item| 1 + entries(item)).sum::<u64>(),
            _ => 1,
        }
    }

    /// Whether this is a scalar, a string or a short tuple of those: what a streaming read's
    /// memo keeps whole.
    fn is_flat(&self) -> bool {
        match self {
            Value::List(_) | Value::Dict(_) | Value::Event(_) | Value::Elided(_) => false,
            Value::Tuple(items) => {
                items.len() <= FLAT_TUPLE
                    && items.iter().all(|item| {
                        !matches!(
                            item,
                            Value::List(_) | Value::Dict(_) | Value::Tuple(_) | Value::Event(_)
                        )
                    })
            }
            _ => true,
        }
    }
}

/// The longest tuple a streaming read's memo keeps (PyTorch's only tuple is the pair
/// `segment_pool_id`).
const FLAT_TUPLE: usize = 8;

/// What a memo entry holds, with what the reader's limits need to know of it.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoEntry {
    /// The value kept.
    pub value: Value,
    /// Levels of containers in it.
    pub depth: u32,
    /// Bytes of memory it holds, by the reader's accounting.
    pub cost: u64,
}

/// The unpickler's memo: ids are assigned to every memoized value, but only what
/// [`Memo::form`] keeps is stored.
#[derive(Debug, Default)]
pub struct Memo {
    kept: HashMap<u32, MemoEntry>,
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

    /// Whether containers are kept whole.
    pub fn keeps_containers(&self) -> bool {
        self.containers
    }

    /// The id `MEMOIZE` gives the next value.
    pub fn next_id(&self) -> u32 {
        self.next
    }

    /// Values kept.
    pub fn len(&self) -> usize {
        self.kept.len()
    }

    /// Whether nothing is kept.
    pub fn is_empty(&self) -> bool {
        self.kept.is_empty()
    }

    /// What the memo keeps of `value`: scalars, strings and short flat tuples whole; a
    /// container only as the `empty_cache` mark when it carries it, or whole when the memo
    /// keeps containers; `None` for nothing (an id then reads back as [`Value::Elided`]).
    pub fn form(&self, value: &Value) -> Option<Value> {
        if self.containers && !matches!(value, Value::Event(_)) {
            return Some(value.clone());
        }
        match value {
            Value::Event(_) => None,
            flat if flat.is_flat() => Some(flat.clone()),
            other => other.has_empty_cache_frame().then_some(Value::Elided(true)),
        }
    }

    /// Records `entry` under `id` (the caller made it with [`Memo::form`]; `None` forgets
    /// what the id held). Returns the entry it replaces, if any.
    pub fn put(&mut self, id: u32, entry: Option<MemoEntry>) -> Option<MemoEntry> {
        self.next = self.next.max(id.saturating_add(1));
        match entry {
            Some(entry) => self.kept.insert(id, entry),
            None => self.kept.remove(&id),
        }
    }

    /// Records a flat value (a string or scalar, as the event fast path reads them) under `id`.
    pub fn put_flat(&mut self, id: u32, value: Value, cost: u64) -> Option<MemoEntry> {
        self.put(
            id,
            Some(MemoEntry {
                value,
                depth: 0,
                cost,
            }),
        )
    }

    /// The entry under `id`: what was kept, [`Value::Elided`] for a container that was not,
    /// `None` for an id never assigned (a corrupted pickle).
    pub fn get(&self, id: u32) -> Option<MemoEntry> {
        match self.kept.get(&id) {
            Some(entry) => Some(entry.clone()),
            None if id < self.next => Some(MemoEntry {
                value: Value::Elided(false),
                depth: 0,
                cost: 0,
            }),
            None => None,
        }
    }

    /// The depth and cost of the entry under `id` (0 and 0 for a container that was not
    /// kept), without copying it; `None` for an id never assigned.
    pub fn peek(&self, id: u32) -> Option<(u32, u64)> {
        match self.kept.get(&id) {
            Some(entry) => Some((entry.depth, entry.cost)),
            None if id < self.next => Some((0, 0)),
            None => None,
        }
    }

    /// The value under `id` (see [`Memo::get`]).
    pub fn value(&self, id: u32) -> Option<Value> {
        self.get(id).map(|entry| entry.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(memo: &mut Memo, id: u32, value: &Value) {
        let form = memo.form(value).map(|value| MemoEntry {
            value,
            depth: 0,
            cost: 0,
        });
        memo.put(id, form);
    }

    #[test]
    fn memo_keeps_strings_and_marks_only() {
        let mut memo = Memo::default();
        put(&mut memo, 0, &Value::Str("alloc".into()));
        let list = Value::List(Box::new(List {
            id: 0,
            items: vec![Value::Int(1)],
            streamed: 0,
        }));
        put(&mut memo, 1, &list);
        let frame = Value::Dict(vec![(
            Value::Str("name".into()),
            Value::Str("empty_cache".into()),
        )]);
        put(&mut memo, 2, &frame);
        put(&mut memo, 4, &Value::Tuple(vec![list.clone()]));
        assert_eq!(memo.value(0), Some(Value::Str("alloc".into())));
        assert_eq!(memo.value(1), Some(Value::Elided(false)));
        assert_eq!(memo.value(2), Some(Value::Elided(true)));
        assert_eq!(
            memo.value(3),
            Some(Value::Elided(false)),
            "assigned, not kept"
        );
        assert_eq!(
            memo.value(4),
            Some(Value::Elided(false)),
            "a tuple holding a container is not kept"
        );
        assert_eq!(memo.value(5), None);
        assert_eq!(memo.next_id(), 5);
        assert_eq!(memo.len(), 2);
    }

    #[test]
    fn a_key_set_twice_reads_as_the_last() {
        let key = |k: &str| Value::Str(k.into());
        let dict = Value::Dict(vec![(key("a"), Value::Int(1)), (key("a"), Value::Int(2))]);
        assert_eq!(dict.get("a"), Some(&Value::Int(2)));
    }

    #[test]
    fn an_empty_cache_frame_is_found_one_level_down_only() {
        let frame = Value::Dict(vec![(
            Value::Str("name".into()),
            Value::Str("empty_cache".into()),
        )]);
        let list = |items| {
            Value::List(Box::new(List {
                id: 0,
                items,
                streamed: 0,
            }))
        };
        assert!(list(vec![frame.clone()]).has_empty_cache_frame());
        assert!(!list(vec![list(vec![frame])]).has_empty_cache_frame());
    }
}
