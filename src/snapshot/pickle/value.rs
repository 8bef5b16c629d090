//! The values the streaming unpickler builds (its memo: `memo.rs`).
//!
//! Only what a snapshot needs is kept: scalars, strings, tuples, lists and dicts. A streaming
//! read also keeps a snapshot's parts in the reader's own compact forms as soon as they are
//! complete: trace events go to the caller, frames and stacks are interned
//! ([`Value::Frame`], [`Value::Stack`]), segments and blocks become records
//! ([`Value::Segment`], [`List::blocks`]). Its memo keeps strings, scalars, interned frames
//! and stacks, empty lists and short flat tuples, but not other containers: a later reference
//! to one reads back as [`Value::Elided`], and it keeps each distinct value once (`memo.rs`).
//! That keeps memory in proportion to the live state plus a 4-byte slot per memo id (Python's
//! pickler memoizes a few objects in every trace entry), and no reference can make the reader
//! copy a container.

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

    /// The value as an error message names it: its type with its article, and a scalar's
    /// value, e.g. "an int (18446744073709551615)", "None", "a str ('x')". A message saying
    /// only "is a int, expected an int" would not tell a user that the int was out of range.
    pub fn described(&self) -> String {
        /// Longer strings are cut: a message names a value, it does not quote a file.
        const SHOWN_CHARS: usize = 40;
        match self {
            Value::None => "None".to_string(),
            Value::Bool(flag) => format!("a bool ({})", if *flag { "True" } else { "False" }),
            Value::Int(value) => format!("an int ({value})"),
            Value::Unsigned(value) => format!("an int ({value})"),
            Value::BigInt => "an int wider than 64 bits".to_string(),
            Value::Float(value) => format!("a float ({value})"),
            Value::Str(text) if text.chars().count() > SHOWN_CHARS => {
                let shown: String = text.chars().take(SHOWN_CHARS).collect();
                format!("a str ('{shown}...')")
            }
            Value::Str(text) => format!("a str ('{text}')"),
            Value::Bytes => "a bytes object".to_string(),
            Value::Elided => "a shared object".to_string(),
            other => format!("a {}", other.type_name()),
        }
    }

    /// Whether this is a scalar, a string, an interned frame or stack, an empty list or a
    /// short tuple of scalars and strings: what a streaming read's memo keeps whole.
    pub(super) fn is_flat(&self) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn a_described_value_names_its_type_and_value() {
        assert_eq!(Value::None.described(), "None");
        assert_eq!(Value::Int(-5).described(), "an int (-5)");
        assert_eq!(Value::BigInt.described(), "an int wider than 64 bits");
        assert_eq!(Value::Bool(true).described(), "a bool (True)");
        assert_eq!(Value::Str("x".into()).described(), "a str ('x')");
        let long = Value::Str("y".repeat(100).into()).described();
        assert_eq!(long, format!("a str ('{}...')", "y".repeat(40)));
        assert_eq!(Value::Tuple(Vec::new()).described(), "a tuple");
    }
}
