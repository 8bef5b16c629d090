//! The unpickler's memo, kept small enough for traces of millions of events.
//!
//! Python's pickler memoizes every object it writes, and a PyTorch snapshot holds a new string
//! object in every trace entry (the `compile_context` `py::str` its C++ writer makes per entry)
//! and a new list for every entry's `frames`. A memo that kept each of those as a value of its
//! own (a hash table bucket, the value, a string's allocation: about 260 bytes against the 85
//! bytes the entry takes in the file) would hold more than the file itself, and the reader's
//! budget (32 MiB + 1 byte per byte of the file) refused real snapshots of a few hundred
//! thousand events. So the memo keeps one copy of each distinct value it can share (strings by
//! their text, scalars, interned frames and stacks, the empty lists under one kind of key) and
//! one 4-byte slot per memo id pointing at it: a memoized object costs the memo its slot, and
//! its value only the first time that value is seen.

use std::collections::HashMap;
use std::rc::Rc;

use super::frames::{FrameId, StackId};
use super::value::{Place, Section, Value};

/// What a memo entry holds, with what the reader's limits need to know of it.
#[derive(Debug, Clone, PartialEq)]
pub struct MemoEntry {
    /// The value kept.
    pub value: Value,
    /// Levels of containers in it.
    pub depth: u32,
    /// Bytes of memory a copy of it holds on the stack, by the reader's accounting.
    pub cost: u64,
}

/// A value the memo keeps one copy of, whichever ids refer to it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum SharedKey {
    None,
    Bool(bool),
    Int(i64),
    Unsigned(u64),
    Text(Rc<str>),
    Frame(FrameId),
    Stack(StackId),
    /// An empty list, by where it sits; a list that could still matter by its identity (a
    /// trace, whose events the reader numbers by list) also by its creation order.
    EmptyList(Place, Option<u32>),
}

impl SharedKey {
    /// The key of `entry` when its value can be shared.
    fn of(entry: &MemoEntry) -> Option<SharedKey> {
        if entry.depth > 0 {
            return None;
        }
        Some(match &entry.value {
            Value::None => SharedKey::None,
            Value::Bool(flag) => SharedKey::Bool(*flag),
            Value::Int(value) => SharedKey::Int(*value),
            Value::Unsigned(value) => SharedKey::Unsigned(*value),
            Value::Str(text) => SharedKey::Text(text.clone()),
            Value::Frame(id) => SharedKey::Frame(*id),
            Value::Stack(id) => SharedKey::Stack(*id),
            Value::List(list) if list.is_empty() => {
                // A `frames` list (or any other list that is a key's value) adds nothing by
                // its identity; lists of traces and segments keep theirs.
                let by_identity = !matches!(list.place, Place::Under(Section::Other));
                SharedKey::EmptyList(list.place, by_identity.then_some(list.id))
            }
            _ => return None,
        })
    }
}

/// No value: the id was assigned to a container that was not kept (or forgotten).
const NOT_KEPT: u32 = u32::MAX;

/// How far past the highest dense id a `PUT` may name an id and still get a slot in the dense
/// table (picklers number memo entries 0, 1, 2, ...; a file naming ids far apart is kept in a
/// hash table instead, so no id can make the table grow by more than this).
const DENSE_GAP: u32 = 4096;

/// Bytes charged for one dense slot: its 4 bytes three times over (a vector doubles when full,
/// and while it moves its items the old buffer and the new one, twice as large, are both
/// allocated).
const SLOT_BYTES: u64 = 3 * std::mem::size_of::<u32>() as u64;

/// Bytes charged for one id of the sparse table: its bucket four times over (a hash table
/// doubles when 7/8 full, and while it moves its entries both tables are allocated).
const SPARSE_BYTES: u64 = 4 * (std::mem::size_of::<(u32, u32)>() as u64 + 1);

/// Bytes charged for one distinct value: its entry three times over (as [`SLOT_BYTES`]).
const ENTRY_BYTES: u64 = 3 * std::mem::size_of::<MemoEntry>() as u64;

/// Bytes charged for one shared value's place in the table that finds it by key (as
/// [`SPARSE_BYTES`]).
const SHARED_BYTES: u64 = 4 * (std::mem::size_of::<(SharedKey, u32)>() as u64 + 1);

/// The unpickler's memo: ids are assigned to every memoized value, but only what
/// [`Memo::form`] keeps is stored, one copy of each shareable value (see the module's
/// documentation).
#[derive(Debug, Default)]
pub struct Memo {
    /// For each id below its length: the index of its value in `entries`, or [`NOT_KEPT`].
    dense: Vec<u32>,
    /// Ids too far past the dense ones, with their values' indices.
    sparse: HashMap<u32, u32>,
    /// The distinct values kept.
    entries: Vec<MemoEntry>,
    /// The index of each shareable value in `entries`.
    shared: HashMap<SharedKey, u32>,
    /// The string last stored or found, with its index: PyTorch's writer memoizes the same
    /// `compile_context` text in entry after entry, and comparing it with this is cheaper than
    /// hashing it (the table's hasher resists crafted collisions, which costs time).
    recent_text: Option<(Rc<str>, u32)>,
    /// One past the highest id assigned (`MEMOIZE` uses it as the next id).
    next: u32,
    /// Ids that hold a value.
    kept_ids: usize,
    /// How many times an id holding a string was given another value (see [`Memo::epoch`]).
    epoch: u64,
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

    /// Ids that hold a value (several may hold the same one).
    #[allow(clippy::len_without_is_empty)] // nothing asks whether a memo is empty
    pub fn len(&self) -> usize {
        self.kept_ids
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
    /// what the id held). Returns the bytes of memory the memo newly holds by the reader's
    /// accounting: the id's slot when it is new, the value when no id held it before. A value
    /// stays kept when its ids are given other values (files written by picklers never do).
    pub fn put(&mut self, id: u32, entry: Option<MemoEntry>) -> u64 {
        self.next = self.next.max(id.saturating_add(1));
        let mut held = 0;
        let index = match entry {
            Some(entry) => {
                let (index, grew) = self.index_of(entry);
                held += grew;
                index
            }
            None => NOT_KEPT,
        };
        let old = if let Some(slot) = self.dense.get_mut(id as usize) {
            std::mem::replace(slot, index)
        } else if id <= (self.dense.len() as u32).saturating_add(DENSE_GAP) && id < NOT_KEPT {
            let new_slots = id as usize + 1 - self.dense.len();
            held += new_slots as u64 * SLOT_BYTES;
            self.dense.resize(id as usize, NOT_KEPT);
            self.dense.push(index);
            NOT_KEPT
        } else {
            let old = self.sparse.insert(id, index);
            if old.is_none() {
                held += SPARSE_BYTES;
            }
            old.unwrap_or(NOT_KEPT)
        };
        if old != index && old != NOT_KEPT {
            let held_text = self
                .entries
                .get(old as usize)
                .is_some_and(|entry| matches!(entry.value, Value::Str(_)));
            self.epoch += u64::from(held_text);
        }
        match (old == NOT_KEPT, index == NOT_KEPT) {
            (true, false) => self.kept_ids += 1,
            (false, true) => self.kept_ids -= 1,
            _ => {}
        }
        held
    }

    /// The index in `entries` of `entry`'s value, stored now when no id held it before, and
    /// the bytes that took.
    fn index_of(&mut self, entry: MemoEntry) -> (u32, u64) {
        if let (Value::Str(text), Some((recent, index))) = (&entry.value, &self.recent_text) {
            if entry.depth == 0 && text == recent {
                return (*index, 0);
            }
        }
        let key = SharedKey::of(&entry);
        if let Some(&index) = key.as_ref().and_then(|key| self.shared.get(key)) {
            if let Some(SharedKey::Text(text)) = key {
                self.recent_text = Some((text, index));
            }
            return (index, 0);
        }
        // `entries` cannot reach `NOT_KEPT` values: each costs the memory budget more than
        // `ENTRY_BYTES`, so that many would need a file of hundreds of gigabytes.
        let index = u32::try_from(self.entries.len()).unwrap_or(NOT_KEPT - 1);
        // The entry, and what a copy of its value holds on the stack (a little more than the
        // value holds beyond the entry: the memo does not know the stack's slot size).
        let mut held = ENTRY_BYTES + entry.cost;
        self.entries.push(entry);
        if let Some(key) = key {
            if let SharedKey::Text(text) = &key {
                self.recent_text = Some((text.clone(), index));
            }
            self.shared.insert(key, index);
            held += SHARED_BYTES;
        }
        (index, held)
    }

    /// The entry under `id`: `Some(None)` for an id assigned to a value not kept, `None` for
    /// an id never assigned.
    fn entry(&self, id: u32) -> Option<Option<&MemoEntry>> {
        let index = match self.dense.get(id as usize) {
            Some(&index) => Some(index),
            None => self.sparse.get(&id).copied(),
        };
        match index {
            Some(NOT_KEPT) => Some(None),
            Some(index) => Some(self.entries.get(index as usize)),
            None if id < self.next => Some(None),
            None => None,
        }
    }

    /// Changes whenever an id that held a string is given another value (which picklers never
    /// do): the fast path, which remembers a memo reference's bytes as the key it named,
    /// forgets what it learnt then.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The string under `id`, when it holds one, without copying it.
    pub fn text(&self, id: u32) -> Option<&str> {
        match &self.entry(id)??.value {
            Value::Str(text) => Some(text),
            _ => None,
        }
    }

    /// The depth and cost of the entry under `id` (0 and 0 for a container that was not
    /// kept), without copying it; `None` for an id never assigned.
    pub fn peek(&self, id: u32) -> Option<(u32, u64)> {
        self.entry(id)
            .map(|entry| entry.map_or((0, 0), |entry| (entry.depth, entry.cost)))
    }

    /// The value under `id`: what was kept, [`Value::Elided`] for a container that was not,
    /// `None` for an id never assigned (a corrupted pickle).
    pub fn value(&self, id: u32) -> Option<Value> {
        self.entry(id)
            .map(|entry| entry.map_or(Value::Elided, |entry| entry.value.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::super::value::List;
    use super::*;

    fn flat(value: Value) -> Option<MemoEntry> {
        Some(MemoEntry {
            value,
            depth: 0,
            cost: 48,
        })
    }

    fn put(memo: &mut Memo, id: u32, value: &Value) -> u64 {
        let form = memo.form(value).and_then(flat);
        memo.put(id, form)
    }

    fn list(items: Vec<Value>) -> Value {
        Value::List(Box::new(List {
            items,
            ..List::default()
        }))
    }

    fn empty_list(id: u32, place: Place) -> Value {
        Value::List(Box::new(List {
            id,
            place,
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
    fn a_string_memoized_again_costs_only_its_slot() {
        let mut memo = Memo::default();
        let first = put(&mut memo, 0, &Value::Str("N/A".into()));
        let again = put(&mut memo, 1, &Value::Str("N/A".into()));
        assert!(
            first > ENTRY_BYTES,
            "the first copy holds the value: {first}"
        );
        assert_eq!(again, SLOT_BYTES, "a second copy holds only its id's slot");
        assert_eq!(memo.len(), 2, "two ids hold it");
        assert_eq!(memo.entries.len(), 1, "one copy");
        assert_eq!(memo.value(1), Some(Value::Str("N/A".into())));
        let other = put(&mut memo, 2, &Value::Str("N/B".into()));
        assert!(other > ENTRY_BYTES);
        assert_eq!(memo.value(2), Some(Value::Str("N/B".into())));
        assert_eq!(memo.value(0), Some(Value::Str("N/A".into())));
    }

    #[test]
    fn a_million_memoized_strings_of_a_few_texts_take_a_slot_each() {
        let mut memo = Memo::default();
        let mut held = 0;
        for id in 0..1_000_000u32 {
            let text = ["N/A", "", "alloc"][id as usize % 3];
            held += put(&mut memo, id, &Value::Str(text.into()));
        }
        assert_eq!(memo.entries.len(), 3);
        assert_eq!(memo.len(), 1_000_000);
        assert!(held < 1_000_000 * SLOT_BYTES + 4096, "{held} bytes");
    }

    #[test]
    fn empty_frames_lists_are_shared_but_trace_lists_keep_their_identity() {
        let mut memo = Memo::default();
        let frames = Place::Under(Section::Other);
        put(&mut memo, 0, &empty_list(7, frames));
        assert_eq!(put(&mut memo, 1, &empty_list(9, frames)), SLOT_BYTES);
        let trace = Place::ItemOf(Section::DeviceTraces, 0);
        put(&mut memo, 2, &empty_list(11, trace));
        assert!(put(&mut memo, 3, &empty_list(12, trace)) > SLOT_BYTES);
        assert_eq!(memo.value(3), Some(empty_list(12, trace)));
        assert_eq!(memo.value(2), Some(empty_list(11, trace)));
    }

    #[test]
    fn the_epoch_changes_only_when_a_string_is_replaced() {
        let mut memo = Memo::default();
        put(&mut memo, 0, &Value::Str("action".into()));
        put(&mut memo, 1, &list(Vec::new()));
        memo.put(1, None);
        put(&mut memo, 0, &Value::Str("action".into()));
        assert_eq!(memo.epoch(), 0);
        assert_eq!(memo.text(0), Some("action"));
        assert_eq!(memo.text(1), None);
        put(&mut memo, 0, &Value::Str("size".into()));
        assert_eq!(memo.epoch(), 1);
        assert_eq!(memo.text(0), Some("size"));
    }

    #[test]
    fn forgetting_an_id_reads_it_back_as_elided() {
        let mut memo = Memo::default();
        put(&mut memo, 0, &list(Vec::new()));
        assert_eq!(memo.len(), 1);
        memo.put(0, None);
        assert_eq!(memo.len(), 0);
        assert_eq!(memo.value(0), Some(Value::Elided));
        assert_eq!(memo.peek(0), Some((0, 0)));
    }

    #[test]
    fn far_ids_go_to_the_sparse_table_and_grow_nothing_else() {
        let mut memo = Memo::default();
        let held = put(&mut memo, 4_000_000_000, &Value::Int(5));
        assert!(held < 4096, "{held} bytes");
        assert_eq!(memo.value(4_000_000_000), Some(Value::Int(5)));
        assert_eq!(memo.value(3_999_999_999), Some(Value::Elided));
        assert_eq!(memo.value(u32::MAX), None);
        put(&mut memo, u32::MAX, &Value::Int(6));
        assert_eq!(memo.value(u32::MAX), Some(Value::Int(6)));
        assert_eq!(memo.next_id(), u32::MAX);
    }
}
