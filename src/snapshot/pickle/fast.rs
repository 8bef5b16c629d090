//! The trace-event fast path: one event dict read straight from the input bytes, in the layouts
//! Python's pickler (protocols 2 to 5), serde-pickle and PyTorch's C++ writer (TorchScript's
//! pickler) write, without building values. Anything it does not recognise goes the generic
//! way (the unpickler builds the dict and `from_dict.rs` reads it).
//!
//! Consecutive events of a trace share their layout, so the fast path reads most of them
//! against what it remembers of the earlier ones: `frozen` (an earlier event byte for byte but
//! for its integers), then `tail` (the last event's keys in order); both fall back to reading
//! key by key, and both are tested to read exactly what that reads or refuse.

use std::rc::Rc;

use super::entry::{Entry, Marker, MarkerKind, RawEvent};
use super::frames::StackId;
use super::memo::Memo;
use super::opcodes::{self as op, long, unsigned_long};
use super::value::Value;
use crate::snapshot::model::Action;
use frozen::Frozen;
use tail::Template;

mod frozen;
mod tail;
#[cfg(test)]
mod testing;

/// The fields of an event dict, as the fast path recognises their keys.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Field {
    Action,
    Addr,
    Size,
    Stream,
    TimeUs,
    Text,
    Frames,
    Pool,
}

#[inline(always)]
fn field(key: &[u8]) -> Option<Field> {
    Some(match key {
        b"action" => Field::Action,
        b"addr" | b"device_free" => Field::Addr,
        b"size" => Field::Size,
        b"stream" => Field::Stream,
        b"time_us" => Field::TimeUs,
        b"compile_context" | b"user_metadata" | b"internal_metadata" => Field::Text,
        b"frames" => Field::Frames,
        b"pool_id" => Field::Pool,
        _ => return None,
    })
}

/// What an event's `action` names.
#[derive(Clone, Copy)]
enum Kind {
    Memory(Action),
    Marker(MarkerKind),
}

impl Kind {
    /// The kind an `action` names, if any.
    #[inline]
    fn of_name(name: &[u8]) -> Option<Kind> {
        Some(match Action::from_bytes(name) {
            Some(action) => Kind::Memory(action),
            None => Kind::Marker(MarkerKind::from_bytes(name)?),
        })
    }
}

/// A string read by the fast path: new bytes, or a memo reference.
enum Text<'a> {
    Bytes(&'a [u8]),
    Memo(Value),
}

impl Text<'_> {
    fn bytes(&self) -> Option<&[u8]> {
        match self {
            Text::Bytes(bytes) => Some(bytes),
            Text::Memo(Value::Str(text)) => Some(text.as_bytes()),
            Text::Memo(_) => None,
        }
    }
}

/// What the fast path read: the entry, the bytes it took, and the memo entries it made.
pub type FastEvent = (Entry, usize, Vec<(u32, Value)>);

/// Parses one event dict from `bytes`, which start just after its `EMPTY_DICT` opcode.
/// Returns the entry (its `signs` left for the caller, who holds the stacks), the
/// bytes it took and the memo entries it made, or `None` when the bytes are not an event dict
/// in a layout it knows (the caller then parses them generically). Nothing is changed unless it
/// succeeds, but `layout`, which only ever holds keys and templates as they were really
/// written.
///
/// Three ways, fastest first: a frozen layout (`Frozen`: the whole event compared at once, when
/// it repeats an earlier one but for its integers), then the previous event's `Template` (its
/// keys compared, its values read), then key by key; an event read the slower way is frozen,
/// or becomes the template, for the next ones.
pub fn fast_event(bytes: &[u8], memo: &Memo, layout: &mut KeyLayout) -> Option<FastEvent> {
    // What was learnt may name memo ids by their bytes: forgotten once an id that held a
    // string holds another value.
    if layout.epoch != memo.epoch() {
        *layout = KeyLayout {
            epoch: memo.epoch(),
            ..KeyLayout::default()
        };
    }
    let KeyLayout {
        keys,
        template,
        frozen,
        ..
    } = layout;
    if let Some(read) = frozen.read(bytes, memo, keys) {
        return Some(read);
    }
    let mut parser = Fast::new(bytes, memo, keys);
    let read = match template.read(&mut parser) {
        Some(event) => (event, parser.at, parser.puts),
        None => {
            let mut parser = Fast::new(bytes, memo, keys);
            let event = parser.event()?;
            let read = (event, parser.at, parser.puts);
            template.learn(&mut Fast::new(bytes, memo, keys));
            read
        }
    };
    if read.2.is_empty() {
        frozen.learn(bytes, memo, keys);
    }
    Some(read)
}

/// What the fast path remembers of the events it read: each key's encoding by position, the
/// whole layout of the last event (`Template`) and the events frozen (`Frozen`).
#[derive(Default)]
pub struct KeyLayout {
    keys: KnownKeys,
    template: Template,
    frozen: Frozen,
    /// The memo's [`Memo::epoch`] when this was learnt.
    epoch: u64,
}

/// Most keys of an event whose encoding [`KeyLayout`] remembers (PyTorch writes at most 9).
const LAYOUT_KEYS: usize = 12;

/// Longest encoded key [`KeyLayout`] remembers: opcode, 4-byte length and a 19-byte name
/// (`compile_context` takes 20 bytes, `internal_metadata` 22).
const KEY_BYTES: usize = 24;

/// One key as an earlier event wrote it: its encoded bytes (opcode, length and name), padded
/// into three words with a mask for the bytes that count.
#[derive(Clone, Copy)]
struct KnownKey {
    words: [u64; 3],
    masks: [u64; 3],
    length: usize,
    field: Field,
}

/// The encoded keys of the last events, by position in the dict (for events the `Template`
/// does not take).
///
/// A trace's events are written by one pickler in one key order, so the key at position `n`
/// is almost always the bytes the previous event had there. Checking those bytes is three
/// masked word compares; reading the key as a string and matching its name cost about a third
/// of the fast path (`perf`, 2026-12-03). A key that differs is read the ordinary way and
/// remembered in its place instead.
#[derive(Default)]
struct KnownKeys {
    keys: [Option<KnownKey>; LAYOUT_KEYS],
}

impl KnownKeys {
    /// The field of the key remembered at `position` and its encoded length, when `bytes`
    /// start with it.
    #[inline(always)]
    fn known(&self, position: usize, bytes: &[u8]) -> Option<(Field, usize)> {
        let key = self.keys.get(position)?.as_ref()?;
        let window: &[u8; KEY_BYTES] = bytes.get(..KEY_BYTES)?.try_into().ok()?;
        let mut differ = 0;
        for (index, chunk) in window.chunks_exact(8).enumerate() {
            let word = u64::from_le_bytes(chunk.try_into().ok()?);
            differ |= (word ^ key.words[index]) & key.masks[index];
        }
        (differ == 0).then_some((key.field, key.length))
    }

    /// Remembers `encoded` (a whole key: opcode, length, name) as the key at `position`.
    fn learn(&mut self, position: usize, encoded: &[u8], field: Field) {
        let Some(slot) = self.keys.get_mut(position) else {
            return;
        };
        if encoded.len() > KEY_BYTES {
            *slot = None;
            return;
        }
        let mut padded = [0u8; KEY_BYTES];
        let mut mask = [0u8; KEY_BYTES];
        padded[..encoded.len()].copy_from_slice(encoded);
        mask[..encoded.len()].fill(0xff);
        let word = |bytes: &[u8; KEY_BYTES], index: usize| {
            let mut eight = [0u8; 8];
            eight.copy_from_slice(&bytes[index * 8..index * 8 + 8]);
            u64::from_le_bytes(eight)
        };
        *slot = Some(KnownKey {
            words: [0, 1, 2].map(|index| word(&padded, index)),
            masks: [0, 1, 2].map(|index| word(&mask, index)),
            length: encoded.len(),
            field,
        });
    }
}

struct Fast<'a> {
    bytes: &'a [u8],
    at: usize,
    memo: &'a Memo,
    next_id: u32,
    puts: Vec<(u32, Value)>,
    layout: &'a mut KnownKeys,
}

impl<'a> Fast<'a> {
    /// A parser at the start of `bytes` (just after an event's `EMPTY_DICT`).
    #[inline(always)]
    fn new(bytes: &'a [u8], memo: &'a Memo, layout: &'a mut KnownKeys) -> Fast<'a> {
        Fast {
            bytes,
            at: 0,
            memo,
            next_id: memo.next_id(),
            puts: Vec::new(),
            layout,
        }
    }

    #[inline]
    fn byte(&mut self) -> Option<u8> {
        let byte = *self.bytes.get(self.at)?;
        self.at += 1;
        Some(byte)
    }

    #[inline]
    fn take(&mut self, count: usize) -> Option<&'a [u8]> {
        let piece = self.bytes.get(self.at..self.at.checked_add(count)?)?;
        self.at += count;
        Some(piece)
    }

    #[inline]
    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    #[inline]
    fn u32(&mut self) -> Option<u32> {
        self.array().map(u32::from_le_bytes)
    }

    /// A memo store right after a value, if there is one: its id.
    #[inline]
    fn memo_store(&mut self) -> Option<Option<u32>> {
        let id = match *self.bytes.get(self.at)? {
            op::MEMOIZE => {
                self.at += 1;
                let id = self.next_id;
                self.next_id = self.next_id.saturating_add(1);
                return Some(Some(id));
            }
            opcode @ (op::BINPUT | op::LONG_BINPUT) => {
                self.at += 1;
                self.memo_id(opcode == op::LONG_BINPUT)?
            }
            _ => return Some(None),
        };
        // An id given again (which picklers never do) may replace a string that a remembered
        // key names: left to the generic path, which changes the memo's epoch.
        if id < self.next_id {
            return None;
        }
        self.next_id = id.saturating_add(1);
        Some(Some(id))
    }

    /// A memo id: the argument of `BINPUT`/`BINGET` (one byte) or of their `LONG_` forms
    /// (four).
    #[inline(always)]
    fn memo_id(&mut self, long: bool) -> Option<u32> {
        if long {
            self.u32()
        } else {
            self.byte().map(u32::from)
        }
    }

    fn memo_ref(&mut self, opcode: u8) -> Option<Value> {
        let id = self.memo_id(opcode == op::LONG_BINGET)?;
        // An id stored earlier in this same event is only a string key or value.
        if let Some((_, value)) = self.puts.iter().rev().find(|(put, _)| *put == id) {
            return Some(value.clone());
        }
        self.memo.value(id)
    }

    /// A string's bytes when they are written out and not memoized (how serde-pickle, and
    /// Python's pickler for an event's values, write them: the common case), read in place;
    /// `Some(None)` with nothing read for anything else, which [`Fast::text`] then reads.
    /// Returning the bytes directly rather than a [`Text`] matters: `perf` showed a third of a
    /// replay's time in the stall of reading back a `Text` that `text` had returned through
    /// memory.
    #[inline(always)]
    fn plain_text(&mut self) -> Option<Option<&'a [u8]>> {
        let start = self.at;
        let length = match *self.bytes.get(start)? {
            op::SHORT_BINUNICODE => {
                self.at += 1;
                usize::from(self.byte()?)
            }
            op::BINUNICODE => {
                self.at += 1;
                self.u32()? as usize
            }
            _ => return Some(None),
        };
        let bytes = self.take(length)?;
        match *self.bytes.get(self.at)? {
            op::MEMOIZE | op::BINPUT | op::LONG_BINPUT => {
                self.at = start;
                Some(None)
            }
            _ => Some(Some(bytes)),
        }
    }

    /// A string, stored in the memo too if a memo opcode follows it.
    #[inline(never)]
    fn text(&mut self) -> Option<Text<'a>> {
        let opcode = self.byte()?;
        let text = match opcode {
            op::SHORT_BINUNICODE => {
                let length = usize::from(self.byte()?);
                Text::Bytes(self.take(length)?)
            }
            op::BINUNICODE => {
                let length = self.u32()? as usize;
                Text::Bytes(self.take(length)?)
            }
            op::BINGET | op::LONG_BINGET => return Some(Text::Memo(self.memo_ref(opcode)?)),
            _ => return None,
        };
        if let Some(id) = self.memo_store()? {
            let Text::Bytes(bytes) = text else {
                return None;
            };
            let string: Rc<str> = std::str::from_utf8(bytes).ok()?.into();
            self.puts.push((id, Value::Str(string)));
        }
        Some(text)
    }

    #[inline(always)]
    fn int(&mut self) -> Option<i64> {
        match self.number()? {
            Number::Signed(value) => Some(value),
            Number::Unsigned(_) => None,
        }
    }

    /// An address: any 64 bits ([`RawEvent::addr`]).
    #[inline(always)]
    fn address(&mut self) -> Option<i64> {
        match self.number()? {
            Number::Signed(value) => Some(value),
            Number::Unsigned(value) => Some(value as i64),
        }
    }

    #[inline(always)]
    fn number(&mut self) -> Option<Number> {
        let value = match self.byte()? {
            op::BININT1 => i64::from(self.byte()?),
            op::BININT2 => i64::from(u16::from_le_bytes(self.array()?)),
            op::BININT => i64::from(i32::from_le_bytes(self.array()?)),
            op::LONG1 => {
                let length = usize::from(self.byte()?);
                let bytes = self.take(length)?;
                return match long(bytes) {
                    Some(value) => Some(Number::Signed(value)),
                    None => unsigned_long(bytes).map(Number::Unsigned),
                };
            }
            _ => return None,
        };
        Some(Number::Signed(value))
    }

    /// `frames`: an empty list or a memo reference to one the reader interned; a list being
    /// filled goes the generic way.
    fn frames(&mut self) -> Option<StackId> {
        match self.byte()? {
            op::EMPTY_LIST => {
                if let Some(id) = self.memo_store()? {
                    self.puts.push((id, Value::Stack(StackId::EMPTY)));
                }
                match self.bytes.get(self.at)? {
                    // A MARK would start filling it (and a single item appended to it would
                    // be read as the next key, which fails: the generic way takes over).
                    &op::MARK => None,
                    _ => Some(StackId::EMPTY),
                }
            }
            opcode @ (op::BINGET | op::LONG_BINGET) => match self.memo_ref(opcode)? {
                Value::Stack(id) => Some(id),
                Value::Elided => Some(StackId::EMPTY),
                Value::List(list) if list.is_empty() => Some(StackId::EMPTY),
                _ => None,
            },
            _ => None,
        }
    }

    /// `pool_id`: two integers and `TUPLE2` (memoized or not), or a memo reference to such a
    /// pair.
    fn pool(&mut self) -> Option<(i64, i64)> {
        if let Some(&opcode @ (op::BINGET | op::LONG_BINGET)) = self.bytes.get(self.at) {
            self.at += 1;
            return match self.memo_ref(opcode)? {
                Value::Tuple(items) => match items.as_slice() {
                    [first, second] => Some((first.as_int()?, second.as_int()?)),
                    _ => None,
                },
                _ => None,
            };
        }
        let first = self.int()?;
        let second = self.int()?;
        if self.byte()? != op::TUPLE2 {
            return None;
        }
        if let Some(id) = self.memo_store()? {
            self.puts.push((
                id,
                Value::Tuple(vec![Value::Int(first), Value::Int(second)]),
            ));
        }
        Some((first, second))
    }

    /// The next key's field: the key the layout remembers at `position` when the bytes match
    /// it and no memo store follows, else read and (when plainly written) remembered.
    #[inline(always)]
    fn key(&mut self, position: usize) -> Option<Field> {
        let rest = self.bytes.get(self.at..)?;
        if let Some((field, length)) = self.layout.known(position, rest) {
            if !matches!(
                rest.get(length)?,
                &(op::MEMOIZE | op::BINPUT | op::LONG_BINPUT)
            ) {
                self.at += length;
                return Some(field);
            }
        }
        // A key written out, or a memo reference to a string stored before this event (how
        // Python's pickler writes every key after its first use), is remembered by its bytes
        // (a memo reference's valid while the memo's epoch stays); anything else is read as
        // text.
        let start = self.at;
        let name = match self.plain_text()? {
            Some(name) => Some(name),
            None => self.memo_text()?,
        };
        match name {
            Some(name) => {
                let key = field(name)?;
                self.layout
                    .learn(position, &self.bytes[start..self.at], key);
                Some(key)
            }
            None => field(self.text()?.bytes()?),
        }
    }

    /// A memo reference to a string stored before this event, borrowed from the memo (no
    /// copy); `Some(None)` with nothing read for anything else, which [`Fast::text`] reads.
    #[inline(always)]
    fn memo_text(&mut self) -> Option<Option<&'a [u8]>> {
        let start = self.at;
        let opcode = *self.bytes.get(start)?;
        if !matches!(opcode, op::BINGET | op::LONG_BINGET) {
            return Some(None);
        }
        self.at += 1;
        let id = self.memo_id(opcode == op::LONG_BINGET)?;
        if self.puts.iter().any(|(put, _)| *put == id) {
            // Stored in this same event: not in the memo yet.
            self.at = start;
            return Some(None);
        }
        let memo: &'a Memo = self.memo;
        Some(Some(memo.text(id)?.as_bytes()))
    }

    fn event(&mut self) -> Option<Entry> {
        if let Some(id) = self.memo_store()? {
            self.puts.push((id, Value::Elided));
        }
        if self.byte()? != op::MARK {
            return None;
        }
        let mut kind = None;
        let mut event = RawEvent::new(Action::Alloc);
        let (mut has_addr, mut has_size) = (false, false);
        let mut position = 0;
        loop {
            if self.bytes.get(self.at)? == &op::SETITEMS {
                self.at += 1;
                break;
            }
            let field = self.key(position)?;
            position += 1;
            if kind.is_none() && field != Field::Action {
                return None;
            }
            match field {
                Field::Action => {
                    let name = match self.plain_text()? {
                        Some(name) => Some(name),
                        None => self.memo_text()?,
                    };
                    kind = Some(match name {
                        Some(name) => Kind::of_name(name)?,
                        None => Kind::of_name(self.text()?.bytes()?)?,
                    });
                }
                Field::Addr => {
                    event.addr = self.address()?;
                    has_addr = true;
                }
                Field::Size => {
                    event.size = self.int()?;
                    has_size = true;
                }
                Field::Stream => event.stream = self.int()?,
                Field::TimeUs => event.time_us = self.int()?,
                Field::Text => {
                    if self.plain_text()?.is_none() && self.memo_text()?.is_none() {
                        self.text()?.bytes()?;
                    }
                }
                Field::Frames => event.stack = self.frames()?,
                Field::Pool => event.pool = self.pool()?,
            }
        }
        self.finish(kind?, event, has_addr, has_size)
    }

    /// The end of an event dict, after its `SETITEMS`: the entry its fields make.
    #[inline(always)]
    fn finish(
        &mut self,
        kind: Kind,
        mut event: RawEvent,
        has_addr: bool,
        has_size: bool,
    ) -> Option<Entry> {
        // PyTorch's C++ writer memoizes a dict it holds twice after the dict is complete.
        if let Some(id) = self.memo_store()? {
            self.puts.push((id, Value::Elided));
        }
        match kind {
            Kind::Memory(action) => {
                event.action = action;
                (has_addr && has_size).then_some(Entry::Memory(event))
            }
            Kind::Marker(kind) => Some(Entry::Marker(Marker {
                kind,
                addr: event.addr,
                size: event.size,
                time_us: event.time_us,
                stack: event.stack,
            })),
        }
    }
}

/// An integer argument: signed 64 bits, or from 2^63 to 2^64 - 1.
enum Number {
    Signed(i64),
    Unsigned(u64),
}
