//! Trace events as the unpickler hands them out ([`RawEvent`]), decoded either by a fast
//! path that reads one event dict straight from the input bytes without building values, or
//! from a generic dict when the fast path does not recognise the bytes.

use std::rc::Rc;

use super::value::{Memo, Value};
use super::vm::op;
use crate::snapshot::model::Action;

/// The fields of one trace event a replay uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawEvent {
    /// What happened.
    pub action: Action,
    /// `addr` (for `oom`: `device_free`).
    pub addr: i64,
    /// `size`.
    pub size: i64,
    /// `stream` (0 when absent).
    pub stream: i64,
    /// `time_us` (0 when absent).
    pub time_us: i64,
    /// Whether its frames name `empty_cache` (a release by `torch.cuda.empty_cache()`).
    pub empty_cache_frame: bool,
}

/// Reads an event from a generic dict, or says what is wrong with it.
pub fn event_from_dict(entries: &[(Value, Value)]) -> Result<RawEvent, String> {
    let get = |key: &str| {
        entries
            .iter()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v)
    };
    let action = match get("action") {
        Some(Value::Str(name)) => Action::from_name(name)
            .ok_or_else(|| format!("unknown action '{name}' (not one PyTorch records)"))?,
        Some(other) => {
            return Err(format!(
                "'action' is a {}, expected a string",
                other.type_name()
            ))
        }
        None => return Err("no 'action'".into()),
    };
    let int = |key: &str, required: bool| -> Result<i64, String> {
        match get(key) {
            Some(value) => value
                .as_int()
                .ok_or_else(|| format!("'{key}' is a {}, expected an int", value.type_name())),
            None if required => Err(format!("{} event has no '{key}'", action.name())),
            None => Ok(0),
        }
    };
    let addr = if action == Action::Oom && get("device_free").is_some() {
        int("device_free", true)?
    } else {
        int("addr", true)?
    };
    Ok(RawEvent {
        action,
        addr,
        size: int("size", true)?,
        stream: int("stream", false)?,
        time_us: int("time_us", false)?,
        empty_cache_frame: get("frames").is_some_and(Value::has_empty_cache_frame),
    })
}

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

    #[inline]
    fn u32(&mut self) -> Option<u32> {
        let piece = self.take(4)?;
        Some(u32::from_le_bytes([piece[0], piece[1], piece[2], piece[3]]))
    }

    /// A memo store right after a value, if there is one: its id.
    #[inline]
    fn memo_store(&mut self) -> Option<Option<u32>> {
        let id = match *self.bytes.get(self.at)? {
            op::MEMOIZE => {
                self.at += 1;
                let id = self.next_id;
                self.next_id += 1;
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
        self.memo.get(id)
    }

    /// A string's bytes when they are written out and not memoized (how serde-pickle and
    /// Python's pickler without memo write them: the common case, read in place without
    /// returning a [`Text`] through memory, which stalled the caller's loads); `None` (nothing
    /// read) for anything else, which [`Fast::text`] reads.
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

    #[inline]
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
            let field = match self.plain_text()? {
                Some(key) => field(key)?,
                None => field(self.text()?.bytes()?)?,
            };
            if !has_action && field != Field::Action {
                return None;
            }
            match field {
                Field::Action => {
                    event.action = match self.plain_text()? {
                        Some(name) => Action::from_bytes(name)?,
                        None => Action::from_bytes(self.text()?.bytes()?)?,
                    };
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
                    if self.plain_text()?.is_none() {
                        self.text()?.bytes()?;
                    }
                }
                Field::Frames => event.empty_cache_frame = self.frames()?,
            }
        }
        (has_action && has_addr && has_size).then_some(event)
    }
}

/// A little-endian two's-complement integer of up to 8 bytes (`LONG1`'s argument); `None`
/// when it does not fit 64 bits.
pub fn long(bytes: &[u8]) -> Option<i64> {
    if bytes.is_empty() {
        return Some(0);
    }
    if bytes.len() > 8 {
        // Python writes a 9th byte only for sign: accept it when the value still fits.
        let (low, high) = bytes.split_at(8);
        let sign = if low[7] & 0x80 != 0 { 0xff } else { 0 };
        if high.iter().any(|&b| b != sign) {
            return None;
        }
        return long(low);
    }
    let mut buffer = if bytes[bytes.len() - 1] & 0x80 != 0 {
        [0xff_u8; 8]
    } else {
        [0_u8; 8]
    };
    buffer[..bytes.len()].copy_from_slice(bytes);
    Some(i64::from_le_bytes(buffer))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_decodes_twos_complement() {
        assert_eq!(long(&[]), Some(0));
        assert_eq!(long(&[0xff]), Some(-1));
        assert_eq!(long(&[0x00, 0x80, 0x00]), Some(0x8000));
        assert_eq!(
            long(&[0, 0, 0, 0, 0, 0, 0, 0x80, 0]),
            None,
            "2^63 does not fit"
        );
        assert_eq!(long(&[1, 0, 0, 0, 0, 0, 0, 0, 0]), Some(1));
    }

    #[test]
    fn a_dict_without_action_or_with_an_unknown_one_is_refused() {
        let key = |k: &str| Value::Str(k.into());
        assert!(event_from_dict(&[(key("size"), Value::Int(1))])
            .unwrap_err()
            .contains("no 'action'"));
        let unknown = [(key("action"), key("teleport"))];
        assert!(event_from_dict(&unknown)
            .unwrap_err()
            .contains("unknown action 'teleport'"));
        let no_addr = [(key("action"), key("alloc")), (key("size"), Value::Int(1))];
        assert!(event_from_dict(&no_addr)
            .unwrap_err()
            .contains("alloc event has no 'addr'"));
    }
}
