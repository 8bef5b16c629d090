//! The template of a trace entry: the previous entry's layout, byte for byte but its values.
//!
//! One pickler writes a whole trace, so consecutive entries share their layout: the same keys,
//! written the same way, in the same order; only the values (action, address, size, ...)
//! differ. A `Template` keeps the bytes from one value to the next (the `MARK` and first
//! key, each later key, the closing `SETITEMS`) as masked words. Reading the next entry
//! against it checks each stretch with three word compares and reads only the values, with
//! the same readers the key-by-key path uses; the first stretch that differs hands the entry
//! back to that path, which then makes it the template.
//!
//! Why it reads exactly what the key-by-key path (`Fast::event`) reads: a template holds
//! only keys written out in full (never a memo reference, whose meaning the memo could
//! change), each stretch checked ends with a whole key, and every value reader refuses the
//! memo opcodes that the key-by-key path would have taken after a key. So a stretch matching
//! means the key-by-key path would have seen the same key there, with the same field, and
//! then called the same reader on the same bytes.

use super::{field, Fast, Field, Kind};
use crate::snapshot::model::Action;
use crate::snapshot::pickle::entry::{Entry, RawEvent};
use crate::snapshot::pickle::opcodes as op;
use crate::snapshot::pickle::value::Value;

/// Most stretches a template holds: the keys of an event (PyTorch writes at most 9) and the
/// closing `SETITEMS`.
const MOST_STEPS: usize = 13;

/// Longest stretch: `MARK`, then a key of at most 22 bytes (opcode, 4-byte length and
/// `internal_metadata`), fits in three words.
const STRETCH_BYTES: usize = 24;

/// Events read key by key before the template is learned again, after an event it could not
/// be learned from (a layout with memo references, say): learning costs a second reading of
/// the event, so a file the template never fits pays it once in this many events.
const IDLE_EVENTS: u32 = 64;

/// One stretch of bytes and the value that follows it (`None`: the stretch closes the dict).
#[derive(Clone, Copy, Default)]
struct Step {
    words: [u64; 3],
    masks: [u64; 3],
    length: usize,
    field: Option<Field>,
}

impl Step {
    /// The stretch `bytes` (at most `STRETCH_BYTES`), then `field`'s value.
    fn new(bytes: &[u8], field: Option<Field>) -> Option<Step> {
        if bytes.len() > STRETCH_BYTES {
            return None;
        }
        let mut padded = [0u8; STRETCH_BYTES];
        let mut mask = [0u8; STRETCH_BYTES];
        padded[..bytes.len()].copy_from_slice(bytes);
        mask[..bytes.len()].fill(0xff);
        Some(Step {
            words: words(&padded),
            masks: words(&mask),
            length: bytes.len(),
            field,
        })
    }

    /// Whether `bytes` start with the stretch (`false` when fewer than `STRETCH_BYTES`
    /// bytes are left: the key-by-key path reads the last events of a file).
    #[inline(always)]
    fn matches(&self, bytes: &[u8]) -> bool {
        let Some(window) = bytes.first_chunk::<STRETCH_BYTES>() else {
            return false;
        };
        let found = words(window);
        let differ = ((found[0] ^ self.words[0]) & self.masks[0])
            | ((found[1] ^ self.words[1]) & self.masks[1])
            | ((found[2] ^ self.words[2]) & self.masks[2]);
        differ == 0
    }
}

/// `bytes` as three little-endian words.
#[inline(always)]
fn words(bytes: &[u8; STRETCH_BYTES]) -> [u64; 3] {
    let word = |index: usize| {
        let mut eight = [0u8; 8];
        eight.copy_from_slice(&bytes[index * 8..index * 8 + 8]);
        u64::from_le_bytes(eight)
    };
    [word(0), word(1), word(2)]
}

/// The layout of the last event read key by key (see the module's documentation).
#[derive(Default)]
pub struct Template {
    steps: [Step; MOST_STEPS],
    /// Steps in use; 0 while there is no template.
    count: usize,
    /// Events left to read key by key before learning again.
    idle: u32,
    /// Events in a row the template did not fit.
    misses: u32,
}

impl Template {
    /// The event at the start of `parser`'s bytes when it follows the template, read exactly
    /// as `Fast::event` would read it; `None` (with the parser in any state) when it does
    /// not.
    #[inline(always)]
    pub fn read(&mut self, parser: &mut Fast<'_>) -> Option<Entry> {
        let steps = self.steps.get(..self.count)?;
        if steps.is_empty() {
            return None;
        }
        if let Some(id) = parser.memo_store()? {
            parser.puts.push((id, Value::Elided));
        }
        let mut kind = None;
        let mut event = RawEvent::new(Action::Alloc);
        let (mut has_addr, mut has_size) = (false, false);
        for step in steps {
            if !step.matches(parser.bytes.get(parser.at..)?) {
                return None;
            }
            parser.at += step.length;
            let Some(field) = step.field else {
                break;
            };
            match field {
                Field::Action => kind = Some(Kind::of_name(parser.plain_text()??)?),
                Field::Addr => {
                    event.addr = parser.address()?;
                    has_addr = true;
                }
                Field::Size => {
                    event.size = parser.int()?;
                    has_size = true;
                }
                Field::Stream => event.stream = parser.int()?,
                Field::TimeUs => event.time_us = parser.int()?,
                Field::Text => {
                    parser.plain_text()??;
                }
                Field::Frames => event.stack = parser.frames()?,
                Field::Pool => event.pool = parser.pool()?,
            }
        }
        let entry = parser.finish(kind?, event, has_addr, has_size)?;
        self.misses = 0;
        Some(entry)
    }

    /// Makes the event at the start of `parser`'s bytes, which `Fast::event` has just read
    /// and the template did not fit, the template, when its keys are all written out in full
    /// and its action and texts are plain strings; otherwise drops the template and reads the
    /// next `IDLE_EVENTS` events key by key.
    ///
    /// A template is replaced only after it failed twice in a row: a trace whose events
    /// alternate between two layouts (or with a rare odd one) keeps the common one instead of
    /// learning at every event.
    pub fn learn(&mut self, parser: &mut Fast<'_>) {
        if self.idle > 0 {
            self.idle -= 1;
            return;
        }
        if self.count > 0 {
            self.misses += 1;
            if self.misses < 2 {
                return;
            }
        }
        self.misses = 0;
        if self.learned(parser).is_none() {
            self.count = 0;
            self.idle = IDLE_EVENTS;
        }
    }

    fn learned(&mut self, parser: &mut Fast<'_>) -> Option<()> {
        parser.memo_store()?;
        let mut start = parser.at;
        if parser.byte()? != op::MARK {
            return None;
        }
        let mut count = 0;
        loop {
            let slot = self.steps.get_mut(count)?;
            if parser.bytes.get(parser.at)? == &op::SETITEMS {
                parser.at += 1;
                *slot = Step::new(parser.bytes.get(start..parser.at)?, None)?;
                break;
            }
            let field = field(parser.plain_text()??)?;
            if count == 0 && field != Field::Action {
                return None;
            }
            *slot = Step::new(parser.bytes.get(start..parser.at)?, Some(field))?;
            count += 1;
            match field {
                Field::Action | Field::Text => {
                    parser.plain_text()??;
                }
                Field::Addr => {
                    parser.address()?;
                }
                Field::Size | Field::Stream | Field::TimeUs => {
                    parser.int()?;
                }
                Field::Frames => {
                    parser.frames()?;
                }
                Field::Pool => {
                    parser.pool()?;
                }
            }
            start = parser.at;
        }
        self.count = count + 1;
        Some(())
    }
}

#[cfg(test)]
mod tests;
