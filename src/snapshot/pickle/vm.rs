//! A streaming unpickler for memory snapshots: Python's pickle machine (protocols 0 to 5,
//! without the opcodes that build arbitrary Python objects), except that a dict with an
//! `action` key appended to a list is a trace event and is handed to the caller as soon as it
//! is complete instead of being kept. Memory stays in proportion to what is not a trace
//! event (segments, settings), whatever the trace's length.

use std::io::Read;
use std::rc::Rc;

use super::event::{event_from_dict, fast_event, long, RawEvent};
use super::input::{Input, InputError};
use super::value::{List, Memo, Value};

/// Look-ahead the event fast path wants in the buffer: events larger than this are parsed
/// generically.
const EVENT_WINDOW: usize = 64 << 10;

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

/// What the reader reports per trace event: the list it belongs to (its creation number),
/// the event's index among all events, and the event.
pub struct Emitted {
    /// The trace list's id ([`List::id`]).
    pub list: u32,
    /// Index among all trace events so far (0-based).
    pub index: u64,
    /// Bytes of the pickle read so far (for progress reports).
    pub offset: u64,
    /// The event.
    pub event: RawEvent,
}

/// Pickle opcodes (Python's `pickletools` names); the event fast path (`event.rs`) reads a
/// subset of them.
pub(super) mod op {
    pub const MARK: u8 = b'(';
    pub const STOP: u8 = b'.';
    pub const POP: u8 = b'0';
    pub const POP_MARK: u8 = b'1';
    pub const DUP: u8 = b'2';
    pub const FLOAT: u8 = b'F';
    pub const INT: u8 = b'I';
    pub const BININT: u8 = b'J';
    pub const BININT1: u8 = b'K';
    pub const LONG: u8 = b'L';
    pub const BININT2: u8 = b'M';
    pub const NONE: u8 = b'N';
    pub const STRING: u8 = b'S';
    pub const BINSTRING: u8 = b'T';
    pub const SHORT_BINSTRING: u8 = b'U';
    pub const UNICODE: u8 = b'V';
    pub const BINUNICODE: u8 = b'X';
    pub const APPEND: u8 = b'a';
    pub const DICT: u8 = b'd';
    pub const EMPTY_DICT: u8 = b'}';
    pub const APPENDS: u8 = b'e';
    pub const GET: u8 = b'g';
    pub const BINGET: u8 = b'h';
    pub const LONG_BINGET: u8 = b'j';
    pub const LIST: u8 = b'l';
    pub const EMPTY_LIST: u8 = b']';
    pub const PUT: u8 = b'p';
    pub const BINPUT: u8 = b'q';
    pub const LONG_BINPUT: u8 = b'r';
    pub const SETITEM: u8 = b's';
    pub const TUPLE: u8 = b't';
    pub const EMPTY_TUPLE: u8 = b')';
    pub const SETITEMS: u8 = b'u';
    pub const BINFLOAT: u8 = b'G';
    pub const PROTO: u8 = 0x80;
    pub const TUPLE1: u8 = 0x85;
    pub const TUPLE2: u8 = 0x86;
    pub const TUPLE3: u8 = 0x87;
    pub const NEWTRUE: u8 = 0x88;
    pub const NEWFALSE: u8 = 0x89;
    pub const LONG1: u8 = 0x8a;
    pub const LONG4: u8 = 0x8b;
    pub const BINBYTES: u8 = b'B';
    pub const SHORT_BINBYTES: u8 = b'C';
    pub const SHORT_BINUNICODE: u8 = 0x8c;
    pub const BINUNICODE8: u8 = 0x8d;
    pub const BINBYTES8: u8 = 0x8e;
    pub const MEMOIZE: u8 = 0x94;
    pub const FRAME: u8 = 0x95;
    /// Opcodes that build Python objects by calling code: never in a memory snapshot.
    pub const OBJECT_OPCODES: [(u8, &str); 18] = [
        (b'c', "GLOBAL"),
        (0x93, "STACK_GLOBAL"),
        (b'R', "REDUCE"),
        (b'b', "BUILD"),
        (b'i', "INST"),
        (b'o', "OBJ"),
        (0x81, "NEWOBJ"),
        (0x92, "NEWOBJ_EX"),
        (b'P', "PERSID"),
        (b'Q', "BINPERSID"),
        (0x82, "EXT1"),
        (0x83, "EXT2"),
        (0x84, "EXT4"),
        (0x8f, "EMPTY_SET"),
        (0x90, "ADDITEMS"),
        (0x91, "FROZENSET"),
        (0x96, "BYTEARRAY8"),
        (0x97, "NEXT_BUFFER"),
    ];
}

/// The pickle machine.
pub struct Unpickler<R, F> {
    input: Input<R>,
    stack: Vec<Value>,
    marks: Vec<usize>,
    memo: Memo,
    /// Containers on the stack that were memoized while empty: (stack position, memo id).
    /// When one leaves the stack, complete, the memo learns what it held.
    pending: Vec<(usize, u32)>,
    next_list: u32,
    events: u64,
    handler: F,
    /// Whether trace events stay in their lists as dicts (reading a whole pickle).
    whole: bool,
}

type Step<E> = Result<(), StreamError<E>>;

impl<R: Read, E, F: FnMut(Emitted) -> Result<(), E>> Unpickler<R, F> {
    /// An unpickler reading `reader` and handing each trace event to `handler`.
    pub fn new(reader: R, handler: F) -> Self {
        Unpickler {
            input: Input::new(reader),
            stack: Vec::new(),
            marks: Vec::new(),
            memo: Memo::default(),
            pending: Vec::new(),
            next_list: 0,
            events: 0,
            handler,
            whole: false,
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

    /// Trace events handed out so far.
    pub fn events(&self) -> u64 {
        self.events
    }

    /// Bytes read so far.
    pub fn offset(&self) -> u64 {
        self.input.offset()
    }

    fn corrupt<T>(&self, message: impl Into<String>) -> Result<T, StreamError<E>> {
        Err(StreamError::Pickle {
            offset: self.input.offset(),
            message: message.into(),
            events: self.events,
        })
    }

    fn input_error(&self, error: InputError) -> StreamError<E> {
        match error {
            InputError::Eof { offset } => StreamError::Pickle {
                offset,
                message: "the pickle ends early (the file is truncated)".into(),
                events: self.events,
            },
            InputError::Io(error) => StreamError::Io(error),
        }
    }

    fn pop(&mut self) -> Result<Value, StreamError<E>> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return self.corrupt("an opcode needs a value and the stack has none");
        }
        let position = self.stack.len() - 1;
        self.settle(position);
        match self.stack.pop() {
            Some(value) => Ok(value),
            None => self.corrupt("stack underflow"),
        }
    }

    /// Values since the last MARK, which is removed.
    fn pop_mark(&mut self) -> Result<Vec<Value>, StreamError<E>> {
        let Some(mark) = self.marks.pop() else {
            return self.corrupt("an opcode needs a MARK and there is none");
        };
        self.settle(mark);
        Ok(self.stack.split_off(mark))
    }

    /// Tells the memo what the memoized containers at stack positions `from` and above hold
    /// now that they are complete.
    fn settle(&mut self, from: usize) {
        while let Some(&(position, id)) = self.pending.last() {
            if position < from {
                break;
            }
            self.pending.pop();
            if let Some(value) = self.stack.get(position) {
                self.memo.put(id, value);
            }
        }
    }

    fn top(&mut self) -> Result<&mut Value, StreamError<E>> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return Err(StreamError::Pickle {
                offset: self.input.offset(),
                message: "an opcode needs a value and the stack has none".into(),
                events: self.events,
            });
        }
        match self.stack.last_mut() {
            Some(value) => Ok(value),
            None => unreachable!("the stack is longer than its floor"),
        }
    }

    fn memoize(&mut self, id: u32) -> Step<E> {
        let position = self.stack.len().wrapping_sub(1);
        let Some(value) = self.stack.last() else {
            return self.corrupt("memoize with an empty stack");
        };
        self.memo.put(id, value);
        if matches!(value, Value::List(_) | Value::Dict(_)) {
            self.pending.push((position, id));
        }
        Ok(())
    }

    fn get(&mut self, id: u32) -> Step<E> {
        match self.memo.get(id) {
            Some(value) => {
                self.stack.push(value);
                Ok(())
            }
            None => self.corrupt(format!("a memo reference to {id}, which was never stored")),
        }
    }

    /// Appends `items` to the list on top of the stack, handing trace events out.
    fn extend_list(&mut self, items: Vec<Value>) -> Step<E> {
        if self.whole {
            return match self.top()? {
                Value::List(list) => {
                    list.items.extend(items);
                    Ok(())
                }
                other => {
                    let kind = other.type_name();
                    self.corrupt(format!("APPEND to a {kind}, not a list"))
                }
            };
        }
        let mut kept = Vec::new();
        let mut emitted = Vec::new();
        for item in items {
            match item {
                Value::Event(event) => emitted.push(*event),
                Value::Dict(entries) if is_event(&entries) => {
                    let index = self.events + emitted.len() as u64;
                    match event_from_dict(&entries) {
                        Ok(event) => emitted.push(event),
                        Err(message) => return Err(StreamError::Event { index, message }),
                    }
                }
                other => kept.push(other),
            }
        }
        let list = match self.top()? {
            Value::List(list) => list,
            other => {
                let kind = other.type_name();
                return self.corrupt(format!("APPEND to a {kind}, not a list"));
            }
        };
        list.items.extend(kept);
        list.streamed += emitted.len() as u64;
        let id = list.id;
        for event in emitted {
            self.emit(id, event)?;
        }
        Ok(())
    }

    fn set_items(&mut self, items: Vec<Value>) -> Step<E> {
        if !items.len().is_multiple_of(2) {
            return self.corrupt("SETITEMS with an odd number of values");
        }
        let entries = match self.top()? {
            Value::Dict(entries) => entries,
            other => {
                let kind = other.type_name();
                return self.corrupt(format!("SETITEM on a {kind}, not a dict"));
            }
        };
        let mut items = items.into_iter();
        while let (Some(key), Some(value)) = (items.next(), items.next()) {
            match entries.iter_mut().find(|(k, _)| *k == key) {
                Some(entry) => entry.1 = value,
                None => entries.push((key, value)),
            }
        }
        Ok(())
    }

    fn new_list(&mut self, items: Vec<Value>) -> Value {
        let id = self.next_list;
        self.next_list = self.next_list.wrapping_add(1);
        Value::List(List {
            id,
            items,
            streamed: 0,
        })
    }

    fn string(&self, bytes: &[u8]) -> Result<Value, StreamError<E>> {
        match std::str::from_utf8(bytes) {
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

    fn length_prefixed(&mut self, wide: bool) -> Result<Vec<u8>, StreamError<E>> {
        let length = if wide {
            let length = self.read(|input| input.array::<8>().map(u64::from_le_bytes))?;
            usize::try_from(length).unwrap_or(usize::MAX)
        } else {
            self.u32()? as usize
        };
        if length > 1 << 31 {
            return self.corrupt(format!("an argument of {length} bytes"));
        }
        self.read(|input| input.take(length).map(<[u8]>::to_vec))
    }

    /// An `EMPTY_DICT`: a whole trace event through the fast path when the bytes are one,
    /// else an empty dict to be filled by the opcodes that follow.
    fn empty_dict(&mut self) -> Step<E> {
        if self.whole {
            self.stack.push(Value::Dict(Vec::new()));
            return Ok(());
        }
        let fast = match self.input.window(EVENT_WINDOW) {
            Ok(window) => fast_event(window, &self.memo),
            Err(error) => return Err(self.input_error(error)),
        };
        if let Some((event, used, puts)) = fast {
            self.input.advance(used);
            for (id, value) in puts {
                self.memo.put(id, &value);
            }
            // Inside a MARK batch of a list with nothing else pending (how picklers write a
            // trace), the event goes out at once; otherwise it waits for its APPEND.
            if let Some(list) = self.batch_list() {
                let id = list.id;
                list.streamed += 1;
                return self.emit(id, event);
            }
            self.stack.push(Value::Event(Box::new(event)));
        } else {
            self.stack.push(Value::Dict(Vec::new()));
        }
        Ok(())
    }

    /// The list being filled by the current MARK batch, when the batch holds nothing yet.
    fn batch_list(&mut self) -> Option<&mut List> {
        let &mark = self.marks.last()?;
        if self.stack.len() != mark || mark == 0 {
            return None;
        }
        match self.stack.get_mut(mark - 1) {
            Some(Value::List(list)) => Some(list),
            _ => None,
        }
    }

    /// Hands one event of list `list` to the handler.
    fn emit(&mut self, list: u32, event: RawEvent) -> Step<E> {
        let index = self.events;
        self.events += 1;
        (self.handler)(Emitted {
            list,
            index,
            offset: self.input.offset(),
            event,
        })
        .map_err(StreamError::Handler)
    }

    /// Runs the machine to `STOP` and returns the top-level value (with trace events taken
    /// out of their lists).
    pub fn run(&mut self) -> Result<Value, StreamError<E>> {
        loop {
            let opcode = self.read(Input::byte)?;
            match opcode {
                op::STOP => return self.pop(),
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
                op::MARK => self.marks.push(self.stack.len()),
                op::POP => {
                    self.pop()?;
                }
                op::POP_MARK => {
                    self.pop_mark()?;
                }
                op::DUP => {
                    let top = self.top()?.clone();
                    self.stack.push(top);
                }
                op::NONE => self.stack.push(Value::None),
                op::NEWTRUE => self.stack.push(Value::Bool(true)),
                op::NEWFALSE => self.stack.push(Value::Bool(false)),
                op::BININT1 => {
                    let value = self.read(Input::byte)?;
                    self.stack.push(Value::Int(i64::from(value)));
                }
                op::BININT2 => {
                    let value = self.read(|input| input.array::<2>().map(u16::from_le_bytes))?;
                    self.stack.push(Value::Int(i64::from(value)));
                }
                op::BININT => {
                    let value = self.read(|input| input.array::<4>().map(i32::from_le_bytes))?;
                    self.stack.push(Value::Int(i64::from(value)));
                }
                op::LONG1 | op::LONG4 => {
                    let length = if opcode == op::LONG1 {
                        usize::from(self.read(Input::byte)?)
                    } else {
                        self.u32()? as usize
                    };
                    let bytes = self.read(|input| input.take(length).map(<[u8]>::to_vec))?;
                    self.stack
                        .push(long(&bytes).map_or(Value::BigInt, Value::Int));
                }
                op::INT | op::LONG => {
                    let line = self.read(Input::line)?;
                    let text = String::from_utf8_lossy(&line);
                    let text = text.trim_end_matches('L');
                    let value = match text {
                        "00" => Value::Bool(false),
                        "01" => Value::Bool(true),
                        _ => match text.parse::<i64>() {
                            Ok(value) => Value::Int(value),
                            Err(_)
                                if !text.is_empty()
                                    && text
                                        .trim_start_matches('-')
                                        .bytes()
                                        .all(|b| b.is_ascii_digit()) =>
                            {
                                Value::BigInt
                            }
                            Err(_) => {
                                return self.corrupt(format!("an integer written as '{text}'"))
                            }
                        },
                    };
                    self.stack.push(value);
                }
                op::BINFLOAT => {
                    let value = self.read(|input| input.array::<8>().map(f64::from_be_bytes))?;
                    self.stack.push(Value::Float(value));
                }
                op::FLOAT => {
                    let line = self.read(Input::line)?;
                    match String::from_utf8_lossy(&line).parse::<f64>() {
                        Ok(value) => self.stack.push(Value::Float(value)),
                        Err(_) => return self.corrupt("a float that is not a number"),
                    }
                }
                op::SHORT_BINUNICODE => {
                    let length = usize::from(self.read(Input::byte)?);
                    let bytes = self.read(|input| input.take(length).map(<[u8]>::to_vec))?;
                    let value = self.string(&bytes)?;
                    self.stack.push(value);
                }
                op::BINUNICODE | op::BINUNICODE8 => {
                    let bytes = self.length_prefixed(opcode == op::BINUNICODE8)?;
                    let value = self.string(&bytes)?;
                    self.stack.push(value);
                }
                op::UNICODE | op::STRING => {
                    let line = self.read(Input::line)?;
                    let text = String::from_utf8_lossy(&line);
                    let text = text.trim_matches(|c| c == '\'' || c == '"');
                    self.stack.push(Value::Str(Rc::from(text)));
                }
                op::SHORT_BINSTRING | op::SHORT_BINBYTES => {
                    let length = usize::from(self.read(Input::byte)?);
                    let bytes = self.read(|input| input.take(length).map(<[u8]>::to_vec))?;
                    let value = if opcode == op::SHORT_BINSTRING {
                        self.string(&bytes)?
                    } else {
                        Value::Bytes
                    };
                    self.stack.push(value);
                }
                op::BINSTRING | op::BINBYTES | op::BINBYTES8 => {
                    let bytes = self.length_prefixed(opcode == op::BINBYTES8)?;
                    let value = if opcode == op::BINSTRING {
                        self.string(&bytes)?
                    } else {
                        Value::Bytes
                    };
                    self.stack.push(value);
                }
                op::EMPTY_LIST => {
                    let list = self.new_list(Vec::new());
                    self.stack.push(list);
                }
                op::LIST => {
                    let items = self.pop_mark()?;
                    let list = self.new_list(Vec::new());
                    self.stack.push(list);
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
                    self.stack.push(Value::Dict(Vec::new()));
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
                op::EMPTY_TUPLE => self.stack.push(Value::Tuple(Vec::new())),
                op::TUPLE => {
                    let items = self.pop_mark()?;
                    self.stack.push(Value::Tuple(items));
                }
                op::TUPLE1 | op::TUPLE2 | op::TUPLE3 => {
                    let count = usize::from(opcode - op::TUPLE1 + 1);
                    let mut items = Vec::with_capacity(count);
                    for _ in 0..count {
                        items.push(self.pop()?);
                    }
                    items.reverse();
                    self.stack.push(Value::Tuple(items));
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

/// Whether a dict is a trace event: it has an `action` key.
fn is_event(entries: &[(Value, Value)]) -> bool {
    entries
        .iter()
        .any(|(key, _)| key.as_str() == Some("action"))
}
