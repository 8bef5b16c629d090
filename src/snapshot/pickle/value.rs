//! The values the streaming unpickler builds, and its memo.
//!
//! Only what a snapshot needs is kept: scalars, strings, tuples, lists and dicts. A streaming
//! read also keeps a snapshot's parts in the reader's own compact forms as soon as they are
//! complete: trace events go to the caller, frames and stacks are interned
//! ([`Value::Frame`], [`Value::Stack`]), segments and blocks become records
//! ([`Value::Segment`], [`List::blocks`]). Its memo keeps strings, scalars, interned frames
//! and stacks, empty lists and short flat tuples, but not other containers: a later reference
//! to one reads back as [`Value::Elided`]. That keeps memory in proportion to the live state,
//! not to the length of the trace, and no reference can make the reader copy a container.

use std::collections::HashMap;
use std::rc::Rc;

use super::entry::Entry;
use super::frames::{FrameId, StackId};
use super::records::{BlockRecord, SegmentRecord};

/// Which part of a snapshot a list is the value of (the keys the reader tells apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Section {
    /// `segments`.
    Segments,
    /// `host_segments` (pinned host memory, PyTorch 2.13).
    HostSegments,
    /// `device_traces`.
    DeviceTraces,
    /// `host_traces` (pinned host memory, PyTorch 2.13).
    HostTraces,
    /// A segment's `blocks`.
    Blocks,
    /// Any other key.
    #[default]
    Other,
}

impl Section {
    /// The section a dict key names.
    pub fn of_key(key: &str) -> Section {
        match key {
            "segments" => Section::Segments,
            "host_segments" => Section::HostSegments,
            "device_traces" => Section::DeviceTraces,
            "host_traces" => Section::HostTraces,
            "blocks" => Section::Blocks,
            _ => Section::Other,
        }
    }
}

/// Where a list sits in the file, as the reader learnt when the list was created.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Place {
    /// The pickle's top-level value (PyTorch 2.0 and before pickled a bare list of segments).
    Root,
    /// The value of a dict key.
    Under(Section),
    /// Item `n` of a list that is the value of a key (`device_traces[n]`).
    ItemOf(Section, u32),
    /// Anywhere else.
    #[default]
    Other,
}

/// A list being built: its items, and how many trace events it streamed instead of keeping.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct List {
    /// Creation order of the list in the pickle, to tell trace lists apart.
    pub id: u32,
    /// Items kept.
    pub items: Vec<Value>,
    /// Trace events appended to it and handed to the caller instead of kept.
    pub streamed: u64,
    /// Where it sits in the file.
    pub place: Place,
    /// For a segment's `blocks`: the blocks, read into records as they were appended.
    pub blocks: Vec<BlockRecord>,
    /// For a segment's `blocks`: why the first block that could not be read was refused, and
    /// its position (reported with the segment's index once the segment is complete).
    pub bad_block: Option<(usize, String)>,
}

impl List {
    /// Whether nothing was appended to it.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty() && self.streamed == 0 && self.blocks.is_empty()
    }
}

/// One unpickled value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `None`.
    None,
    /// `True`/`False`.
    Bool(bool),
    /// An integer that fits 64 signed bits.
    Int(i64),
    /// An integer from 2^63 to 2^64 - 1 (an XPU address, pickled by Python as a 9-byte
    /// `LONG1`).
    Unsigned(u64),
    /// An integer that fits neither.
    BigInt,
    /// A float.
    Float(f64),
    /// A string.
    Str(Rc<str>),
    /// A bytes object (never part of a snapshot; its bytes are skipped).
    Bytes,
    /// A tuple.
    Tuple(Vec<Value>),
    /// A list (boxed: it is the largest variant).
    List(Box<List>),
    /// A dict, in insertion order.
    Dict(Vec<(Value, Value)>),
    /// A trace entry decoded by the fast path, waiting to be appended to its list.
    Event(Box<Entry>),
    /// A memoized container that was not kept.
    Elided,
    /// A frame dict, interned.
    Frame(FrameId),
    /// A `frames` list, interned.
    Stack(StackId),
    /// A segment dict, read into a record.
    Segment(Box<SegmentRecord>),
}

impl Value {
    /// The string, if this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(text) => Some(text),
            _ => None,
        }
    }

    /// The integer, if this is one that fits 64 signed bits (booleans count, as in Python).
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(value) => Some(*value),
            Value::Bool(flag) => Some(i64::from(*flag)),
            _ => None,
        }
    }

    /// The integer, if this is one from 2^63 to 2^64 - 1.
    pub fn as_unsigned(&self) -> Option<u64> {
        match self {
            Value::Unsigned(value) => Some(*value),
            _ => None,
        }
    }

    /// The 64 bits of an address: a non-negative or unsigned integer as it is, a negative one
    /// as the unsigned address C++'s writer wrapped (it pickles `int64_t(address)`).
    pub fn as_address(&self) -> Option<u64> {
        match self {
            Value::Int(value) => Some(*value as u64),
            Value::Unsigned(value) => Some(*value),
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
            Value::Int(_) | Value::Unsigned(_) | Value::BigInt => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Bytes => "bytes",
            Value::Tuple(_) => "tuple",
            Value::List(_) | Value::Stack(_) => "list",
            Value::Dict(_) | Value::Event(_) | Value::Frame(_) | Value::Segment(_) => "dict",
            Value::Elided => "shared object",
        }
    }

    /// Whether this is a scalar, a string, an interned frame or stack, an empty list or a
    /// short tuple of scalars and strings: what a streaming read's memo keeps whole.
    fn is_flat(&self) -> bool {
        match self {
            Value::Dict(_) | Value::Event(_) | Value::Elided | Value::Segment(_) => false,
            Value::List(list) => list.is_empty(),
            Value::Tuple(items) => {
                items.len() <= FLAT_TUPLE
                    && items.iter().all(|item| {
                        !matches!(
                            item,
                            Value::List(_)
                                | Value::Dict(_)
                                | Value::Tuple(_)
                                | Value::Event(_)
                                | Value::Segment(_)
                        )
                    })
            }
            _ => true,
        }
    }
}

/// The longest tuple a streaming read's memo keeps (PyTorch's only tuples are the pairs
/// `segment_pool_id` and `pool_id`).
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

    /// What the memo keeps of `value` (a streaming read interns frames and stacks before):
    /// flat values whole (`Value::is_flat`), everything whole when the memo keeps
    /// containers, otherwise nothing (the id then reads back as [`Value::Elided`]).
    pub fn form(&self, value: &Value) -> Option<Value> {
        match value {
            Value::Event(_) => None,
            _ if self.containers || value.is_flat() => Some(value.clone()),
            _ => None,
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

    /// The depth and cost of the entry under `id` (0 and 0 for a container that was not
    /// kept), without copying it; `None` for an id never assigned.
    pub fn peek(&self, id: u32) -> Option<(u32, u64)> {
        match self.kept.get(&id) {
            Some(entry) => Some((entry.depth, entry.cost)),
            None if id < self.next => Some((0, 0)),
            None => None,
        }
    }

    /// The value under `id`: what was kept, [`Value::Elided`] for a container that was not,
    /// `None` for an id never assigned (a corrupted pickle).
    pub fn value(&self, id: u32) -> Option<Value> {
        match self.kept.get(&id) {
            Some(entry) => Some(entry.value.clone()),
            None if id < self.next => Some(Value::Elided),
            None => None,
        }
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

    fn list(items: Vec<Value>) -> Value {
        Value::List(Box::new(List {
            items,
            ..List::default()
        }))
    }

    #[test]
    fn memo_keeps_flat_values_only() {
        let mut memo = Memo::default();
        put(&mut memo, 0, &Value::Str("alloc".into()));
        put(&mut memo, 1, &list(vec![Value::Int(1)]));
        put(&mut memo, 2, &Value::Stack(StackId::EMPTY));
        put(&mut memo, 4, &Value::Tuple(vec![list(Vec::new())]));
        put(&mut memo, 5, &list(Vec::new()));
        assert_eq!(memo.value(0), Some(Value::Str("alloc".into())));
        assert_eq!(memo.value(1), Some(Value::Elided));
        assert_eq!(memo.value(2), Some(Value::Stack(StackId::EMPTY)));
        assert_eq!(memo.value(3), Some(Value::Elided), "assigned, not kept");
        assert_eq!(
            memo.value(4),
            Some(Value::Elided),
            "a tuple holding a container is not kept"
        );
        assert_eq!(memo.value(5), Some(list(Vec::new())), "an empty list is");
        assert_eq!(memo.value(6), None);
        assert_eq!(memo.next_id(), 6);
        assert_eq!(memo.len(), 3);
        assert_eq!(memo.peek(3), Some((0, 0)));
    }

    #[test]
    fn a_whole_read_keeps_containers() {
        let mut memo = Memo::keeping_containers();
        put(&mut memo, 0, &list(vec![Value::Int(1)]));
        assert_eq!(memo.value(0), Some(list(vec![Value::Int(1)])));
    }

    #[test]
    fn a_key_set_twice_reads_as_the_last() {
        let key = |k: &str| Value::Str(k.into());
        let dict = Value::Dict(vec![(key("a"), Value::Int(1)), (key("a"), Value::Int(2))]);
        assert_eq!(dict.get("a"), Some(&Value::Int(2)));
    }

    #[test]
    fn addresses_take_all_64_bits() {
        assert_eq!(Value::Int(-1).as_address(), Some(u64::MAX));
        assert_eq!(Value::Unsigned(1 << 63).as_address(), Some(1 << 63));
        assert_eq!(Value::Unsigned(1 << 63).as_int(), None);
        assert_eq!(Value::BigInt.as_address(), None);
        assert_eq!(Section::of_key("device_traces"), Section::DeviceTraces);
    }
}
