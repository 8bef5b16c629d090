//! The trace-event fast path: one event dict read straight from the input bytes, in the layouts
//! Python's pickler and serde-pickle write, without building values. Anything it does not
//! recognise goes the generic way (the unpickler builds the dict and `dict_event.rs` reads it).

use std::rc::Rc;

use super::entry::RawEvent;
use super::opcodes::{self as op, long};
use super::value::{Memo, Value};
use crate::snapshot::model::Action;

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
}

fn field(key: &[u8]) -> Option<Field> {
    Some(match key {
        b"action" => Field::Action,
        b"addr" | b"device_free" => Field::Addr,
        b"size" => Field::Size,
        b"stream" => Field::Stream,
        b"time_us" => Field::TimeUs,
        b"compile_context" | b"user_metadata" => Field::Text,
        b"frames" => Field::Frames,
        _ => return None,
    })
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

/// What the fast path read: the event, the bytes it took, and the memo entries it made.
pub type FastEvent = (RawEvent, usize, Vec<(u32, Value)>);

/// Parses one event dict from `bytes`, which start just after its `EMPTY_DICT` opcode.
/// Returns the event, the bytes it took and the memo entries it made, or `None` when the bytes
/// are not an event dict in the layout Python's pickler and serde-pickle write (the caller
/// then parses them generically). Nothing is changed unless it succeeds.
pub fn fast_event(bytes: &[u8], memo: &Memo) -> Option<FastEvent> {
    let mut parser = Fast {
        bytes,
        at: 0,
        memo,
        next_id: memo.next_id(),
        puts: Vec::new(),
    };
    let event = parser.event()?;
    Some((event, parser.at, parser.puts))
}

struct Fast<'a> {
    bytes: &'a [u8],
    at: usize,
    memo: &'a Memo,
    next_id: u32,
    puts: Vec<(u32, Value)>,
}

impl<'a> Fast<'a> {
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

    fn u32(&mut self) -> Option<u32> {
        let piece = self.take(4)?;
        Some(u32::from_le_bytes([piece[0], piece[1], piece[2], piece[3]]))
    }

    /// A memo store right after a value, if there is one: its id.
    fn memo_store(&mut self) -> Option<Option<u32>> {
        let id = match *self.bytes.get(self.at)? {
            op::MEMOIZE => {
                self.at += 1;
                let id = self.next_id;
                self.next_id = self.next_id.saturating_add(1);
                id
            }
            op::BINPUT => {
                self.at += 1;
                u32::from(self.byte()?)
            }
            op::LONG_BINPUT => {
                self.at += 1;
                self.u32()?
            }
            _ => return Some(None),
        };
        self.next_id = self.next_id.max(id.saturating_add(1));
        Some(Some(id))
    }

    fn memo_ref(&mut self, opcode: u8) -> Option<Value> {
        let id = if opcode == op::BINGET {
            u32::from(self.byte()?)
        } else {
            self.u32()?
        };
        // An id stored earlier in this same event is only a string key or value.
        if let Some((_, value)) = self.puts.iter().rev().find(|(put, _)| *put == id) {
            return Some(value.clone());
        }
        self.memo.value(id)
    }

    /// A string, stored in the memo too if a memo opcode follows it.
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

    fn int(&mut self) -> Option<i64> {
        let value = match self.byte()? {
            op::BININT1 => i64::from(self.byte()?),
            op::BININT2 => {
                let piece = self.take(2)?;
                i64::from(u16::from_le_bytes([piece[0], piece[1]]))
            }
            op::BININT => {
                let piece = self.take(4)?;
                i64::from(i32::from_le_bytes([piece[0], piece[1], piece[2], piece[3]]))
            }
            op::LONG1 => {
                let length = usize::from(self.byte()?);
                long(self.take(length)?)?
            }
            _ => return None,
        };
        Some(value)
    }

    /// `frames`: an empty list or a memo reference; anything longer goes the generic way.
    fn frames(&mut self) -> Option<bool> {
        match self.byte()? {
            op::EMPTY_LIST => {
                if let Some(id) = self.memo_store()? {
                    self.puts.push((id, Value::Elided(false)));
                }
                match self.bytes.get(self.at)? {
                    // A MARK or an item would start filling it.
                    &op::MARK => None,
                    _ => Some(false),
                }
            }
            opcode @ (op::BINGET | op::LONG_BINGET) => match self.memo_ref(opcode)? {
                Value::Elided(flag) => Some(flag),
                _ => None,
            },
            _ => None,
        }
    }

    fn event(&mut self) -> Option<RawEvent> {
        if let Some(id) = self.memo_store()? {
            self.puts.push((id, Value::Elided(false)));
        }
        if self.byte()? != op::MARK {
            return None;
        }
        let mut event = RawEvent {
            action: Action::Alloc,
            addr: 0,
            size: 0,
            stream: 0,
            time_us: 0,
            empty_cache_frame: false,
        };
        let (mut has_action, mut has_addr, mut has_size) = (false, false, false);
        loop {
            if self.bytes.get(self.at)? == &op::SETITEMS {
                self.at += 1;
                break;
            }
            let key = self.text()?;
            let field = field(key.bytes()?)?;
            if !has_action && field != Field::Action {
                return None;
            }
            match field {
                Field::Action => {
                    let name = self.text()?;
                    event.action = Action::from_bytes(name.bytes()?)?;
                    has_action = true;
                }
                Field::Addr => {
                    event.addr = self.int()?;
                    has_addr = true;
                }
                Field::Size => {
                    event.size = self.int()?;
                    has_size = true;
                }
                Field::Stream => event.stream = self.int()?,
                Field::TimeUs => event.time_us = self.int()?,
                Field::Text => {
                    self.text()?.bytes()?;
                }
                Field::Frames => event.empty_cache_frame = self.frames()?,
            }
        }
        (has_action && has_addr && has_size).then_some(event)
    }
}
