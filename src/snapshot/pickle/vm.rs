//! A streaming unpickler for memory snapshots: Python's pickle machine (protocols 0 to 5,
//! without the opcodes that build arbitrary Python objects), except that a dict with an
//! `action` key appended to a list is a trace entry and is handed to the caller as soon as it
//! is complete instead of being kept, with the trace it belongs to (the list's place in the
//! file: `device_traces[n]`, `host_traces`). Frames are interned ([`Stacks`]), and segments
//! and blocks become compact records as soon as they are complete, so memory stays in
//! proportion to the file's distinct stacks and live state, whatever the trace's length.
//!
//! Every value on the machine's stack carries its nesting depth and the memory it holds, so
//! the limits of [`ReadLimits`] hold as the values are built: no input nests deeper than the
//! depth limit (values are dropped and compared recursively), holds more memory than its
//! allowance, or makes the machine copy or scan more than its work allowance.

use std::collections::HashMap;
use std::io::Read;
use std::rc::Rc;

use super::entry::{Entry, Trace};
use super::fast::{fast_event, KeyLayout};
use super::frames::{FrameId, SharedFrame, StackId, Stacks};
use super::from_dict;
use super::input::{Input, InputError};
use super::limits::{Budget, ReadLimits, Refusal};
use super::memo::{Memo, MemoEntry};
use super::opcodes::{self as op, long, unsigned_long};
use super::records::{BlockRecord, SegmentRecord};
use super::shape::{frame_bytes, frame_of, holds_segments, stack_items, take_blocks, trace_of};
use super::value::{List, Place, Section, Value};

/// Look-ahead the event fast path wants in the buffer: events larger than this are parsed
/// generically. (An event without frames takes about 170 bytes; the unread bytes, at most
/// this many, move to the buffer's front at each refill.)
const EVENT_WINDOW: usize = 16 << 10;

/// Bytes the reader's accounting charges for one value wherever it is (a stack slot, an item
/// of a container, half a dict entry): twice a stack slot's size, for the spare capacity of
/// the vector that holds it.
const VALUE_BYTES: u64 = 2 * std::mem::size_of::<Slot>() as u64;

/// Bytes a string holds beside its text: the two reference counts of its `Rc<str>`, and the
/// memory allocator's header and rounding (a short string takes a 32-byte chunk).
const STRING_HEADER_BYTES: u64 = 32;

/// Bytes charged for one MARK, or for one memoized container waiting to be complete (its
/// place in two tables).
const MARK_BYTES: u64 = 48;

/// Bytes charged for one block record (twice its size, for the spare capacity of the vector
/// holding it).
const BLOCK_BYTES: u64 = 2 * std::mem::size_of::<BlockRecord>() as u64;

/// Bytes a segment record holds beside its blocks.
const SEGMENT_BYTES: u64 = VALUE_BYTES + std::mem::size_of::<SegmentRecord>() as u64;

/// Work units per byte hashed when a frame is interned (hashing is cheap next to building a
/// value).
const HASHED_BYTES_PER_UNIT: u64 = 64;

/// The longest integer argument (`LONG1`/`LONG4`) whose bytes are read: anything longer is
/// far outside 64 bits, skipped and read as [`Value::BigInt`].
const LONGEST_INT: u64 = 16;

/// Why unpickling stopped.
#[derive(Debug)]
pub enum StreamError<E> {
    /// The bytes are not a pickle this reader accepts, or end early.
    Pickle {
        /// Byte offset of the problem.
        offset: u64,
        /// What is wrong.
        message: String,
        /// Trace events handed out before it.
        events: u64,
    },
    /// The file asks for more than the reader's limits allow.
    Limit {
        /// Byte offset where a limit was reached.
        offset: u64,
        /// Which limit, with its value.
        message: String,
        /// Trace events handed out before it.
        events: u64,
    },
    /// The pickle is not laid out as a memory snapshot (a segment or block that cannot be
    /// read, with its index).
    Shape(String),
    /// A trace event is malformed.
    Event {
        /// Its index among all trace events (0-based).
        index: u64,
        /// What is wrong.
        message: String,
    },
    /// The caller's handler refused an event.
    Handler(E),
    /// Reading failed.
    Io(std::io::Error),
}

/// What the reader reports per trace entry: the trace it belongs to, its index among all
/// entries, the entry, and the stacks its frames are resolved in.
pub struct Emitted<'a> {
    /// The trace list's id ([`List::id`], its creation number in the pickle).
    pub list: u32,
    /// Which trace of the file: a device's (`device_traces[n]`), pinned host memory's, or
    /// neither.
    pub trace: Trace,
    /// Index among all trace entries of the file so far (0-based, every trace counted).
    pub index: u64,
    /// Bytes of the pickle read so far (for progress reports).
    pub offset: u64,
    /// The entry.
    pub entry: Entry,
    /// Every distinct stack read so far: [`Stacks::frames`] of [`Entry::stack`] gives the
    /// entry's frames (filename, line, name), and any stack id handed out earlier stays valid
    /// (the table is also returned with the rest of the snapshot).
    pub stacks: &'a Stacks,
}

/// A value on the machine's stack, with what the limits need to know of it.
#[derive(Debug, Clone)]
struct Slot {
    value: Value,
    /// Levels of containers in it: 0 for a scalar or a string, 1 for a container of those.
    depth: u32,
    /// Bytes of memory it holds by the reader's accounting, held in the budget while the slot
    /// lives.
    cost: u64,
}

/// Bytes a value holds beside its slot: a string's text, a list's box, an event's box.
fn payload(value: &Value) -> u64 {
    match value {
        Value::Str(text) => text.len() as u64 + STRING_HEADER_BYTES,
        Value::List(_) => std::mem::size_of::<List>() as u64,
        Value::Event(_) => std::mem::size_of::<Entry>() as u64,
        _ => 0,
    }
}

/// Whether a value is a container (it nests one level).
fn is_container(value: &Value) -> bool {
    matches!(value, Value::List(_) | Value::Dict(_) | Value::Tuple(_))
}

/// Values copied or scanned when a value costing `cost` is copied or scanned whole (every
/// value costs at least [`VALUE_BYTES`]).
fn nodes(cost: u64) -> u64 {
    cost / VALUE_BYTES + 1
}

/// The pickle machine.
pub struct Unpickler<R, F> {
    input: Input<R>,
    stack: Vec<Slot>,
    marks: Vec<usize>,
    memo: Memo,
    /// Containers on the stack that were memoized while empty: (stack position, memo id).
    /// When one leaves the stack, complete, the memo learns what it held.
    pending: Vec<(usize, u32)>,
    /// The same, by memo id: a reference to a container still on the stack reads what it
    /// holds so far (a frame referenced again inside the `frames` list being built).
    pending_at: HashMap<u32, usize>,
    next_list: u32,
    events: u64,
    handler: F,
    /// Whether trace events stay in their lists as dicts (reading a whole pickle).
    whole: bool,
    budget: Budget,
    /// Every distinct frame and stack read so far (a streaming read interns them).
    stacks: Stacks,
    /// The keys of the last trace events as written, for the fast path to recognise.
    layout: KeyLayout,
}

type Step<E> = Result<(), StreamError<E>>;

impl<R: Read, E, F: FnMut(Emitted<'_>) -> Result<(), E>> Unpickler<R, F> {
    /// An unpickler reading `reader` (of unknown size, under the default limits) and handing
    /// each trace event to `handler`.
    pub fn new(reader: R, handler: F) -> Self {
        Unpickler {
            input: Input::new(reader),
            stack: Vec::new(),
            marks: Vec::new(),
            memo: Memo::default(),
            pending: Vec::new(),
            pending_at: HashMap::new(),
            next_list: 0,
            events: 0,
            handler,
            whole: false,
            budget: Budget::new(ReadLimits::default(), None),
            stacks: Stacks::default(),
            layout: KeyLayout::default(),
        }
    }

    /// An unpickler that keeps everything, trace events included, with shared containers
    /// resolved: Python's `pickle.load` for a snapshot small enough to hold in memory.
    pub fn whole(reader: R, handler: F) -> Self {
        let mut unpickler = Unpickler::new(reader, handler);
        unpickler.memo = Memo::keeping_containers();
        unpickler.whole = true;
        unpickler
    }

    /// The same unpickler under `limits`, reading a stream of `size` bytes when that is known
    /// (declared lengths are then checked against it, and the allowances follow it).
    pub fn with_limits(mut self, limits: ReadLimits, size: Option<u64>) -> Self {
        self.input.set_size(size);
        self.budget = Budget::new(limits, size);
        self
    }

    /// Trace events handed out so far.
    pub fn events(&self) -> u64 {
        self.events
    }

    /// Bytes read so far.
    pub fn offset(&self) -> u64 {
        self.input.offset()
    }

    /// The memory and work spent so far, by the reader's accounting.
    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    /// The stacks read, taken out (once the machine has stopped).
    pub fn take_stacks(&mut self) -> Stacks {
        std::mem::take(&mut self.stacks)
    }

    fn corrupt<T>(&self, message: impl Into<String>) -> Result<T, StreamError<E>> {
        Err(StreamError::Pickle {
            offset: self.input.offset(),
            message: message.into(),
            events: self.events,
        })
    }

    fn refused(&self, refusal: Refusal) -> StreamError<E> {
        StreamError::Limit {
            offset: refusal.offset,
            message: refusal.message,
            events: self.events,
        }
    }

    fn input_error(&self, error: InputError) -> StreamError<E> {
        match error {
            InputError::Eof { offset } => StreamError::Pickle {
                offset,
                // A file cut short (a process killed while `_dump_snapshot` wrote it, a copy
                // interrupted) has lost the rest of its trace and the `allocator_settings`
                // pickled after it, so there is nothing sound to replay: say what to do.
                message: "the pickle ends early (the file is truncated: dump the snapshot again; a file cut short has lost the rest of its trace and the allocator settings written after it)".into(),
                events: self.events,
            },
            InputError::TooLong {
                offset,
                declared,
                left,
            } => StreamError::Limit {
                offset,
                message: format!(
                    "an argument of {declared} bytes is declared, but only {left} bytes are left in the file"
                ),
                events: self.events,
            },
            InputError::Io(error) => StreamError::Io(error),
        }
    }

    /// Holds `bytes` more of memory in the budget.
    fn hold(&mut self, bytes: u64) -> Step<E> {
        let offset = self.input.offset();
        self.budget
            .hold(bytes, offset)
            .map_err(|refusal| self.refused(refusal))
    }

    /// Spends `units` of work in the budget.
    fn spend(&mut self, units: u64) -> Step<E> {
        let offset = self.input.offset();
        self.budget
            .spend(units, offset)
            .map_err(|refusal| self.refused(refusal))
    }

    /// Refuses a container `depth` levels deep when that is over the limit.
    fn check_depth(&self, depth: u32) -> Step<E> {
        self.budget
            .check_depth(depth, self.input.offset())
            .map_err(|refusal| self.refused(refusal))
    }

    /// Pushes a value that holds no other value (a scalar, a string, an empty container).
    fn push(&mut self, value: Value) -> Step<E> {
        let cost = VALUE_BYTES + payload(&value);
        self.hold(cost)?;
        let depth = u32::from(is_container(&value));
        self.stack.push(Slot { value, depth, cost });
        Ok(())
    }

    /// Pushes a container made of `items` (whose memory is held already).
    fn push_built(&mut self, items: Vec<Slot>, build: impl FnOnce(Vec<Value>) -> Value) -> Step<E> {
        let mut depth = 1;
        let mut cost = VALUE_BYTES;
        for item in &items {
            depth = depth.max(item.depth.saturating_add(1));
            cost = cost.saturating_add(item.cost);
        }
        self.check_depth(depth)?;
        self.hold(VALUE_BYTES)?;
        let value = build(items.into_iter().map(|slot| slot.value).collect());
        self.stack.push(Slot { value, depth, cost });
        Ok(())
    }

    fn pop(&mut self) -> Result<Slot, StreamError<E>> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return self.corrupt("an opcode needs a value and the stack has none");
        }
        let position = self.stack.len() - 1;
        self.settle(position)?;
        match self.stack.pop() {
            Some(slot) => Ok(slot),
            None => self.corrupt("stack underflow"),
        }
    }

    /// Pops a value and drops it, giving its memory back.
    fn pop_and_drop(&mut self) -> Step<E> {
        let slot = self.pop()?;
        self.budget.release(slot.cost);
        Ok(())
    }

    /// Values since the last MARK, which is removed.
    fn pop_mark(&mut self) -> Result<Vec<Slot>, StreamError<E>> {
        let Some(mark) = self.marks.pop() else {
            return self.corrupt("an opcode needs a MARK and there is none");
        };
        self.budget.release(MARK_BYTES);
        self.settle(mark)?;
        Ok(self.stack.split_off(mark))
    }

    /// Tells the memo what the memoized containers at stack positions `from` and above hold
    /// now that they are complete.
    fn settle(&mut self, from: usize) -> Step<E> {
        while let Some(&(position, id)) = self.pending.last() {
            if position < from {
                break;
            }
            self.pending.pop();
            if self.pending_at.get(&id) == Some(&position) {
                self.pending_at.remove(&id);
            }
            self.budget.release(MARK_BYTES);
            self.remember(id, position)?;
        }
        Ok(())
    }

    /// Takes the slot on top of the stack (above the last MARK) off the stack to change it,
    /// without settling its memo entry: [`Unpickler::put_back`] returns it to its place.
    fn take_top(&mut self) -> Result<Slot, StreamError<E>> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return self.corrupt("an opcode needs a value and the stack has none");
        }
        match self.stack.pop() {
            Some(slot) => Ok(slot),
            None => self.corrupt("stack underflow"),
        }
    }

    fn put_back(&mut self, slot: Slot) {
        self.stack.push(slot);
    }

    /// Records the value at stack position `position` under memo id `id`, as the memo keeps
    /// it.
    fn remember(&mut self, id: u32, position: usize) -> Step<E> {
        let entry = self.memo_entry_at(position)?;
        self.keep(id, entry)
    }

    /// What the memo keeps of the value at stack position `position` (a streaming read
    /// interns a frame dict or a list of frames first), the copy or the scan charged to the
    /// budget.
    fn memo_entry_at(&mut self, position: usize) -> Result<Option<MemoEntry>, StreamError<E>> {
        let Some(slot) = self.stack.get(position) else {
            return Ok(None);
        };
        let (depth, cost) = (slot.depth, slot.cost);
        let whole = self.memo.keeps_containers();
        let work = match &slot.value {
            // A copy of the whole value.
            _ if whole => nodes(cost),
            // A look at its entries or items (for a frame, or a list of frames).
            Value::Dict(entries) => 1 + entries.len() as u64,
            Value::List(list) => 1 + list.items.len() as u64,
            _ => 1,
        };
        self.spend(work)?;
        let interned = if whole {
            None
        } else {
            self.interned_form(position)?
        };
        Ok(match interned {
            Some(value) => Some(MemoEntry {
                value,
                depth: 0,
                cost: VALUE_BYTES,
            }),
            None => self.stack.get(position).and_then(|slot| {
                self.memo.form(&slot.value).map(|value| {
                    let kept_whole = whole && depth > 0;
                    MemoEntry {
                        cost: if kept_whole {
                            cost
                        } else {
                            VALUE_BYTES + payload(&value)
                        },
                        depth: if kept_whole { depth } else { 0 },
                        value,
                    }
                })
            }),
        })
    }

    /// The interned form of the value at stack position `position` when it is a frame dict
    /// ([`Value::Frame`]) or a non-empty list of frames ([`Value::Stack`]).
    fn interned_form(&mut self, position: usize) -> Result<Option<Value>, StreamError<E>> {
        match self.stack.get(position).map(|slot| &slot.value) {
            Some(value @ Value::Dict(_)) => match frame_of(value) {
                Some(frame) => {
                    let id = self.intern_frame(frame)?;
                    Ok(Some(Value::Frame(id)))
                }
                None => Ok(None),
            },
            Some(Value::List(list)) if !list.is_empty() => match stack_items(list) {
                Some(frames) => {
                    let id = self.intern_stack(&frames)?;
                    Ok(Some(Value::Stack(id)))
                }
                None => Ok(None),
            },
            _ => Ok(None),
        }
    }

    /// Interns a frame, charging the hashing to the work budget and the table's growth to the
    /// memory budget.
    fn intern_frame(&mut self, frame: SharedFrame) -> Result<FrameId, StreamError<E>> {
        self.spend(1 + frame_bytes(&frame) / HASHED_BYTES_PER_UNIT)?;
        let Some((id, grew)) = self.stacks.frame(frame) else {
            return Err(StreamError::Shape(
                "more distinct frames than the reader can number".into(),
            ));
        };
        self.hold(grew)?;
        Ok(id)
    }

    /// Interns a stack (its frames innermost first), charging it as [`Unpickler::intern_frame`].
    fn intern_stack(&mut self, frames: &[FrameId]) -> Result<StackId, StreamError<E>> {
        self.spend(1 + frames.len() as u64 / 16)?;
        let Some((id, grew)) = self.stacks.stack(frames) else {
            return Err(StreamError::Shape(
                "more distinct stacks than the reader can number".into(),
            ));
        };
        self.hold(grew)?;
        Ok(id)
    }

    /// Puts `entry` in the memo under `id`, holding the memory the memo grew by.
    fn keep(&mut self, id: u32, entry: Option<MemoEntry>) -> Step<E> {
        let grew = self.memo.put(id, entry);
        self.hold(grew)?;
        self.budget
            .check_memo(self.memo.len(), self.input.offset())
            .map_err(|refusal| self.refused(refusal))
    }

    fn memoize(&mut self, id: u32) -> Step<E> {
        let Some(slot) = self.stack.last() else {
            return self.corrupt("memoize with an empty stack");
        };
        let container = matches!(slot.value, Value::List(_) | Value::Dict(_));
        let position = self.stack.len() - 1;
        self.remember(id, position)?;
        if container {
            self.hold(MARK_BYTES)?;
            self.pending.push((position, id));
            self.pending_at.insert(id, position);
        } else {
            self.pending_at.remove(&id);
        }
        Ok(())
    }

    /// Pushes a copy of what the memo holds under `id`; for a container still on the stack,
    /// of what it holds so far.
    fn get(&mut self, id: u32) -> Step<E> {
        if let Some(&position) = self.pending_at.get(&id) {
            let entry = self.memo_entry_at(position)?;
            let (value, depth, cost) = match entry {
                Some(entry) => (entry.value, entry.depth, entry.cost.max(VALUE_BYTES)),
                None => (Value::Elided, 0, VALUE_BYTES),
            };
            self.hold(cost)?;
            self.stack.push(Slot { value, depth, cost });
            return Ok(());
        }
        let Some((depth, cost)) = self
            .memo
            .peek(id)
            .map(|(depth, cost)| (depth, cost.max(VALUE_BYTES)))
        else {
            return self.corrupt(format!("a memo reference to {id}, which was never stored"));
        };
        self.spend(nodes(cost))?;
        self.hold(cost)?;
        let value = self.memo.value(id).unwrap_or(Value::Elided);
        self.stack.push(Slot { value, depth, cost });
        Ok(())
    }

    /// Pushes a copy of the value on top of the stack.
    fn dup(&mut self) -> Step<E> {
        let top = self.take_top()?;
        let (depth, cost) = (top.depth, top.cost);
        let copy = top.value.clone();
        self.put_back(top);
        self.spend(nodes(cost))?;
        self.hold(cost)?;
        self.stack.push(Slot {
            value: copy,
            depth,
            cost,
        });
        Ok(())
    }

    /// Makes `item`, complete, part of the container `parent`: the parent's depth and memory
    /// include it from now on.
    fn absorb(&self, parent: &mut Slot, item: &Slot) -> Step<E> {
        let depth = item.depth.saturating_add(1);
        self.check_depth(depth)?;
        parent.depth = parent.depth.max(depth);
        parent.cost = parent.cost.saturating_add(item.cost);
        Ok(())
    }

    /// Appends `items` to the list on top of the stack, handing trace entries out.
    fn extend_list(&mut self, items: Vec<Slot>) -> Step<E> {
        let mut parent = self.take_top()?;
        let (id, place) = match &parent.value {
            Value::List(list) => (list.id, list.place),
            other => {
                let kind = other.type_name();
                self.put_back(parent);
                return self.corrupt(format!("APPEND to a {kind}, not a list"));
            }
        };
        let result = self.extend_into(&mut parent, place, items);
        if let (Value::List(list), Ok(entries)) = (&mut parent.value, &result) {
            list.streamed += entries.len() as u64;
        }
        self.put_back(parent);
        let trace = trace_of(place);
        for entry in result? {
            self.emit(id, trace, entry)?;
        }
        Ok(())
    }

    /// Puts the items that are not trace entries into `parent` (a list at `place`), in the
    /// reader's compact forms where it has one, and returns the entries.
    fn extend_into(
        &mut self,
        parent: &mut Slot,
        place: Place,
        items: Vec<Slot>,
    ) -> Result<Vec<Entry>, StreamError<E>> {
        let mut emitted = Vec::new();
        for item in items {
            let item = if self.whole {
                item
            } else {
                match &item.value {
                    Value::Event(entry) => {
                        emitted.push(**entry);
                        self.budget.release(item.cost);
                        continue;
                    }
                    Value::Dict(entries) if is_event(entries) => {
                        let index = self.events + emitted.len() as u64;
                        let entry = from_dict::event(&item.value)
                            .map_err(|message| StreamError::Event { index, message })?;
                        emitted.push(entry);
                        self.budget.release(item.cost);
                        continue;
                    }
                    Value::Dict(_) if place == Place::Under(Section::Blocks) => {
                        self.append_block(parent, item)?;
                        continue;
                    }
                    Value::Dict(_) if holds_segments(place) => {
                        let index = match &parent.value {
                            Value::List(list) => list.items.len(),
                            _ => 0,
                        };
                        self.segment_record(item, place, index)?
                    }
                    Value::Dict(_) => match frame_of(&item.value) {
                        Some(frame) => {
                            let id = self.intern_frame(frame)?;
                            self.replace(item, Value::Frame(id))?
                        }
                        None => item,
                    },
                    _ => item,
                }
            };
            self.absorb(parent, &item)?;
            if let Value::List(list) = &mut parent.value {
                list.items.push(item.value);
            }
        }
        Ok(emitted)
    }

    /// A slot holding `value` (which holds no other value) in place of `old`, whose memory is
    /// given back.
    fn replace(&mut self, old: Slot, value: Value) -> Result<Slot, StreamError<E>> {
        self.budget.release(old.cost);
        let cost = VALUE_BYTES + payload(&value);
        self.hold(cost)?;
        Ok(Slot {
            value,
            depth: 0,
            cost,
        })
    }

    /// Reads a block dict appended to a segment's `blocks` into a record kept in the list; the
    /// first that cannot be read is remembered, for the segment to report.
    fn append_block(&mut self, parent: &mut Slot, item: Slot) -> Step<E> {
        let record = from_dict::block(&item.value);
        self.budget.release(item.cost);
        let Value::List(list) = &mut parent.value else {
            return Ok(());
        };
        match record {
            Ok(record) => {
                let offset = self.input.offset();
                self.budget
                    .hold(BLOCK_BYTES, offset)
                    .map_err(|refusal| StreamError::Limit {
                        offset: refusal.offset,
                        message: refusal.message,
                        events: self.events,
                    })?;
                parent.cost = parent.cost.saturating_add(BLOCK_BYTES);
                list.blocks.push(record);
            }
            Err(message) => {
                if list.bad_block.is_none() {
                    list.bad_block = Some((list.blocks.len(), message));
                }
            }
        }
        Ok(())
    }

    /// Reads segment `index` of the list at `place` (a dict whose blocks are records already)
    /// into a record.
    fn segment_record(
        &mut self,
        item: Slot,
        place: Place,
        index: usize,
    ) -> Result<Slot, StreamError<E>> {
        let what = if place == Place::Under(Section::HostSegments) {
            "host segment"
        } else {
            "segment"
        };
        let cost = item.cost;
        let mut dict = item.value;
        let record = take_blocks(&mut dict)
            .and_then(|blocks| from_dict::segment(&dict, blocks))
            .map_err(|message| StreamError::Shape(format!("{what} {index}: {message}")))?;
        self.budget.release(cost);
        let cost = SEGMENT_BYTES + record.blocks.len() as u64 * BLOCK_BYTES;
        self.hold(cost)?;
        Ok(Slot {
            value: Value::Segment(Box::new(record)),
            depth: 0,
            cost,
        })
    }

    /// A `frames` value as an interned stack: a list of frames, an empty list, or a shared
    /// container the memo did not keep (read as no frames). Anything else is left for the
    /// entry's reader to refuse.
    fn as_stack(&mut self, slot: Slot) -> Result<Slot, StreamError<E>> {
        let id = match &slot.value {
            Value::List(list) if list.is_empty() => Some(StackId::EMPTY),
            Value::List(list) => match stack_items(list) {
                Some(frames) => Some(self.intern_stack(&frames)?),
                None => None,
            },
            Value::Elided => Some(StackId::EMPTY),
            _ => None,
        };
        match id {
            Some(id) => self.replace(slot, Value::Stack(id)),
            None => Ok(slot),
        }
    }

    /// Sets `items` (keys and values, alternating) in the dict on top of the stack. A key set
    /// twice keeps both entries; lookups read the last, as Python's dict does (this keeps
    /// every SETITEMS linear in its items). A streaming read interns a `frames` value.
    fn set_items(&mut self, items: Vec<Slot>) -> Step<E> {
        if !items.len().is_multiple_of(2) {
            return self.corrupt("SETITEMS with an odd number of values");
        }
        let mut parent = self.take_top()?;
        if !matches!(parent.value, Value::Dict(_)) {
            let kind = parent.value.type_name();
            self.put_back(parent);
            return self.corrupt(format!("SETITEM on a {kind}, not a dict"));
        }
        let mut items = items.into_iter();
        let mut result = Ok(());
        while let (Some(key), Some(value)) = (items.next(), items.next()) {
            let value = if !self.whole && key.value.as_str() == Some("frames") {
                match self.as_stack(value) {
                    Ok(value) => value,
                    Err(error) => {
                        result = Err(error);
                        break;
                    }
                }
            } else {
                value
            };
            result = self
                .absorb(&mut parent, &key)
                .and_then(|()| self.absorb(&mut parent, &value));
            if result.is_err() {
                break;
            }
            if let Value::Dict(entries) = &mut parent.value {
                entries.push((key.value, value.value));
            }
        }
        self.put_back(parent);
        result
    }

    /// Where a list created now sits: from what the stack holds below it (the container it
    /// will be added to and, for a dict, its key). Python's pickler and PyTorch's C++ writer
    /// add items in MARK batches (`APPENDS`, `SETITEMS`), or one at a time (`APPEND`,
    /// `SETITEM`) for a container of one item and in protocols 0 and 1.
    fn place_of_new_list(&self) -> Place {
        let stack = &self.stack;
        let len = stack.len();
        let item_of = |list: &List, position: usize| match list.place {
            Place::Under(section) => {
                Place::ItemOf(section, u32::try_from(position).unwrap_or(u32::MAX))
            }
            _ => Place::Other,
        };
        let key = |slot: &Slot| {
            slot.value
                .as_str()
                .map(|key| Place::Under(Section::of_key(key)))
        };
        if let Some(&mark) = self.marks.last() {
            if let Some(below) = mark.checked_sub(1).and_then(|at| stack.get(at)) {
                let in_batch = len.saturating_sub(mark);
                match &below.value {
                    Value::List(list) if mark <= len => {
                        return item_of(list, list.items.len().saturating_add(in_batch))
                    }
                    _ if in_batch % 2 == 1 => {
                        if let Some(place) = stack.last().and_then(key) {
                            return place;
                        }
                    }
                    _ => {}
                }
            }
        }
        match stack.last().map(|slot| &slot.value) {
            Some(Value::List(list)) => return item_of(list, list.items.len()),
            Some(Value::Str(_)) => {
                if let (
                    Some(top),
                    Some(Slot {
                        value: Value::Dict(_),
                        ..
                    }),
                ) = (
                    stack.last(),
                    len.checked_sub(2).and_then(|at| stack.get(at)),
                ) {
                    if let Some(place) = key(top) {
                        return place;
                    }
                }
            }
            None if self.marks.is_empty() => return Place::Root,
            _ => {}
        }
        Place::Other
    }

    fn new_list(&mut self) -> Step<E> {
        let id = self.next_list;
        self.next_list = self.next_list.wrapping_add(1);
        let place = self.place_of_new_list();
        self.push(Value::List(Box::new(List {
            id,
            place,
            ..List::default()
        })))
    }

    fn string(&self, bytes: Vec<u8>) -> Result<Value, StreamError<E>> {
        match String::from_utf8(bytes) {
            Ok(text) => Ok(Value::Str(Rc::from(text))),
            Err(_) => self.corrupt("a string that is not UTF-8"),
        }
    }

    fn read<T>(
        &mut self,
        f: impl FnOnce(&mut Input<R>) -> Result<T, InputError>,
    ) -> Result<T, StreamError<E>> {
        f(&mut self.input).map_err(|error| self.input_error(error))
    }

    fn u32(&mut self) -> Result<u32, StreamError<E>> {
        self.read(|input| input.array::<4>().map(u32::from_le_bytes))
    }

    /// The length argument of a `BINUNICODE`-like opcode: 4 bytes, or 8 when `wide`.
    fn length(&mut self, wide: bool) -> Result<u64, StreamError<E>> {
        if wide {
            self.read(|input| input.array::<8>().map(u64::from_le_bytes))
        } else {
            self.u32().map(u64::from)
        }
    }

    /// A string of `length` declared bytes, its memory held before it is read.
    fn text(&mut self, length: u64) -> Result<Value, StreamError<E>> {
        let offset = self.input.offset();
        let end = offset.saturating_add(length);
        if let Some(size) = self.input.size() {
            if end > size {
                return Err(self.input_error(InputError::TooLong {
                    offset,
                    declared: length,
                    left: size.saturating_sub(offset),
                }));
            }
        }
        // Held while the bytes become a string; the string's own cost is held again when it
        // is pushed. (The one more copy made on the way is the "2 ×" of the memory bound.)
        let transient = length;
        self.budget
            .hold_expecting(transient, offset, end)
            .map_err(|refusal| self.refused(refusal))?;
        let count = usize::try_from(length).unwrap_or(usize::MAX);
        let bytes = self.read(|input| input.take_vec(count));
        self.budget.release(transient);
        self.string(bytes?)
    }

    /// An `EMPTY_DICT`: a whole trace entry through the fast path when the bytes are one,
    /// else an empty dict to be filled by the opcodes that follow.
    fn empty_dict(&mut self) -> Step<E> {
        if self.whole {
            return self.push(Value::Dict(Vec::new()));
        }
        let fast = match self.input.window(EVENT_WINDOW) {
            Ok(window) => fast_event(window, &self.memo, &mut self.layout),
            Err(error) => return Err(self.input_error(error)),
        };
        let Some((entry, used, puts)) = fast else {
            return self.push(Value::Dict(Vec::new()));
        };
        self.input.advance(used);
        for (id, value) in puts {
            let entry = self.memo.form(&value).map(|value| MemoEntry {
                cost: VALUE_BYTES + payload(&value),
                depth: 0,
                value,
            });
            self.keep(id, entry)?;
        }
        // Inside a MARK batch of a list with nothing else pending (how picklers write a
        // trace), the entry goes out at once; otherwise it waits for its APPEND.
        if let Some((id, place)) = self.batch_list() {
            return self.emit(id, trace_of(place), entry);
        }
        self.push(Value::Event(Box::new(entry)))
    }

    /// The list being filled by the current MARK batch, when the batch holds nothing yet: its
    /// id and place, one more entry counted as streamed to it.
    fn batch_list(&mut self) -> Option<(u32, Place)> {
        let &mark = self.marks.last()?;
        if self.stack.len() != mark || mark == 0 {
            return None;
        }
        match self.stack.get_mut(mark - 1) {
            Some(Slot {
                value: Value::List(list),
                ..
            }) => {
                list.streamed += 1;
                Some((list.id, list.place))
            }
            _ => None,
        }
    }

    /// Hands one entry of list `list` (of `trace`) to the handler.
    fn emit(&mut self, list: u32, trace: Trace, mut entry: Entry) -> Step<E> {
        let index = self.events;
        self.events += 1;
        if let Entry::Memory(event) = &mut entry {
            event.signs = self.stacks.signs(event.stack);
        }
        (self.handler)(Emitted {
            list,
            trace,
            index,
            offset: self.input.offset(),
            entry,
            stacks: &self.stacks,
        })
        .map_err(StreamError::Handler)
    }

    /// An integer of `length` little-endian bytes (`LONG1`/`LONG4`).
    fn long_int(&mut self, length: u64) -> Step<E> {
        if length > LONGEST_INT {
            self.read(|input| input.skip(length))?;
            return self.push(Value::BigInt);
        }
        let bytes = self.read(|input| input.take_vec(length as usize))?;
        let value = match long(&bytes) {
            Some(value) => Value::Int(value),
            None => unsigned_long(&bytes).map_or(Value::BigInt, Value::Unsigned),
        };
        self.push(value)
    }

    /// Runs the machine to `STOP` and returns the top-level value (with trace events taken
    /// out of their lists).
    pub fn run(&mut self) -> Result<Value, StreamError<E>> {
        loop {
            let opcode = self.read(Input::byte)?;
            match opcode {
                op::STOP => return self.pop().map(|slot| slot.value),
                op::PROTO => {
                    let version = self.read(Input::byte)?;
                    if version > 5 {
                        return self
                            .corrupt(format!("pickle protocol {version} (at most 5 exists)"));
                    }
                }
                op::FRAME => {
                    self.read(|input| input.array::<8>())?;
                }
                op::MARK => {
                    self.hold(MARK_BYTES)?;
                    self.marks.push(self.stack.len());
                }
                op::POP => self.pop_and_drop()?,
                op::POP_MARK => {
                    for slot in self.pop_mark()? {
                        self.budget.release(slot.cost);
                    }
                }
                op::DUP => self.dup()?,
                op::NONE => self.push(Value::None)?,
                op::NEWTRUE => self.push(Value::Bool(true))?,
                op::NEWFALSE => self.push(Value::Bool(false))?,
                op::BININT1 => {
                    let value = self.read(Input::byte)?;
                    self.push(Value::Int(i64::from(value)))?;
                }
                op::BININT2 => {
                    let value = self.read(|input| input.array::<2>().map(u16::from_le_bytes))?;
                    self.push(Value::Int(i64::from(value)))?;
                }
                op::BININT => {
                    let value = self.read(|input| input.array::<4>().map(i32::from_le_bytes))?;
                    self.push(Value::Int(i64::from(value)))?;
                }
                op::LONG1 => {
                    let length = self.read(Input::byte)?;
                    self.long_int(u64::from(length))?;
                }
                op::LONG4 => {
                    let length = self.u32()?;
                    self.long_int(u64::from(length))?;
                }
                op::INT | op::LONG => {
                    let line = self.read(Input::line)?;
                    let Some(value) = decimal(&line) else {
                        let text = String::from_utf8_lossy(&line).into_owned();
                        return self.corrupt(format!("an integer written as '{text}'"));
                    };
                    self.push(value)?;
                }
                op::BINFLOAT => {
                    let value = self.read(|input| input.array::<8>().map(f64::from_be_bytes))?;
                    self.push(Value::Float(value))?;
                }
                op::FLOAT => {
                    let line = self.read(Input::line)?;
                    match String::from_utf8_lossy(&line).parse::<f64>() {
                        Ok(value) => self.push(Value::Float(value))?,
                        Err(_) => return self.corrupt("a float that is not a number"),
                    }
                }
                op::SHORT_BINUNICODE | op::SHORT_BINSTRING => {
                    let length = self.read(Input::byte)?;
                    let value = self.text(u64::from(length))?;
                    self.push(value)?;
                }
                op::BINUNICODE | op::BINUNICODE8 | op::BINSTRING => {
                    let length = self.length(opcode == op::BINUNICODE8)?;
                    let value = self.text(length)?;
                    self.push(value)?;
                }
                op::UNICODE | op::STRING => {
                    let line = self.read(Input::line)?;
                    let text = String::from_utf8_lossy(&line);
                    let text = text.trim_matches(|c| c == '\'' || c == '"');
                    self.push(Value::Str(Rc::from(text)))?;
                }
                op::SHORT_BINBYTES => {
                    let length = self.read(Input::byte)?;
                    self.read(|input| input.skip(u64::from(length)))?;
                    self.push(Value::Bytes)?;
                }
                op::BINBYTES | op::BINBYTES8 => {
                    let length = self.length(opcode == op::BINBYTES8)?;
                    self.read(|input| input.skip(length))?;
                    self.push(Value::Bytes)?;
                }
                op::EMPTY_LIST => self.new_list()?,
                op::LIST => {
                    let items = self.pop_mark()?;
                    self.new_list()?;
                    self.extend_list(items)?;
                }
                op::APPEND => {
                    let item = self.pop()?;
                    self.extend_list(vec![item])?;
                }
                op::APPENDS => {
                    let items = self.pop_mark()?;
                    self.extend_list(items)?;
                }
                op::EMPTY_DICT => self.empty_dict()?,
                op::DICT => {
                    let items = self.pop_mark()?;
                    self.push(Value::Dict(Vec::new()))?;
                    self.set_items(items)?;
                }
                op::SETITEM => {
                    let value = self.pop()?;
                    let key = self.pop()?;
                    self.set_items(vec![key, value])?;
                }
                op::SETITEMS => {
                    let items = self.pop_mark()?;
                    self.set_items(items)?;
                }
                op::EMPTY_TUPLE => self.push(Value::Tuple(Vec::new()))?,
                op::TUPLE => {
                    let items = self.pop_mark()?;
                    self.push_built(items, Value::Tuple)?;
                }
                op::TUPLE1 | op::TUPLE2 | op::TUPLE3 => {
                    let count = usize::from(opcode - op::TUPLE1 + 1);
                    let mut items = Vec::with_capacity(count);
                    for _ in 0..count {
                        items.push(self.pop()?);
                    }
                    items.reverse();
                    self.push_built(items, Value::Tuple)?;
                }
                op::MEMOIZE => {
                    let id = self.memo.next_id();
                    self.memoize(id)?;
                }
                op::BINPUT => {
                    let id = u32::from(self.read(Input::byte)?);
                    self.memoize(id)?;
                }
                op::LONG_BINPUT => {
                    let id = self.u32()?;
                    self.memoize(id)?;
                }
                op::PUT | op::GET => {
                    let line = self.read(Input::line)?;
                    let Ok(id) = String::from_utf8_lossy(&line).parse::<u32>() else {
                        return self.corrupt("a memo index that is not a number");
                    };
                    if opcode == op::PUT {
                        self.memoize(id)?;
                    } else {
                        self.get(id)?;
                    }
                }
                op::BINGET => {
                    let id = u32::from(self.read(Input::byte)?);
                    self.get(id)?;
                }
                op::LONG_BINGET => {
                    let id = self.u32()?;
                    self.get(id)?;
                }
                other => {
                    let name = op::OBJECT_OPCODES
                        .iter()
                        .find(|(code, _)| *code == other)
                        .map(|(_, name)| *name);
                    let offset = self.input.offset().saturating_sub(1);
                    return Err(StreamError::Pickle {
                        offset,
                        message: match name {
                            Some(name) => format!(
                                "the pickle builds a Python object (opcode {name}); a memory snapshot holds only dicts, lists, strings and numbers"
                            ),
                            None => format!("unknown opcode 0x{other:02x} (the file is corrupted or not a pickle)"),
                        },
                        events: self.events,
                    });
                }
            }
        }
    }
}

/// A protocol-0 integer (`INT`/`LONG`): `00`/`01` are booleans, a number that does not fit
/// 64 bits is a [`Value::BigInt`]; `None` when the text is not a number.
fn decimal(line: &[u8]) -> Option<Value> {
    let text = String::from_utf8_lossy(line);
    let text = text.trim_end_matches('L');
    match text {
        "00" => return Some(Value::Bool(false)),
        "01" => return Some(Value::Bool(true)),
        _ => {}
    }
    if let Ok(value) = text.parse::<i64>() {
        return Some(Value::Int(value));
    }
    let digits = text.strip_prefix('-').unwrap_or(text);
    (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())).then_some(Value::BigInt)
}

/// Whether a dict is a trace event: it has an `action` key.
fn is_event(entries: &[(Value, Value)]) -> bool {
    entries
        .iter()
        .any(|(key, _)| key.as_str() == Some("action"))
}
