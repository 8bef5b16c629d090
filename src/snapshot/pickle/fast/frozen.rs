//! Frozen layouts: whole events compared at once.
//!
//! Most events of a trace written by serde-pickle (what `gpumem bench replay` writes) repeat one
//! of a few byte layouts exactly: the same keys, the same action name, the same texts, and every
//! integer in the same form (`BININT` for a size, an eight-byte `LONG1` for an address), so only
//! the integers' bytes differ. A frozen layout is such an event's bytes with those integer bytes
//! masked out: an event that matches it on every other byte (a few dozen masked word compares)
//! is read by taking its integers from their known offsets, with no opcode read at all.
//!
//! Why it reads exactly what the key-by-key path (`Fast::event`) reads: it is frozen from an
//! event that path read without memo stores, and an event matching it differs only inside the
//! payloads of integers of fixed width, so that path would take the same steps over it,
//! reading the same keys, action, texts and frames, and integers that the same decoding gives.
//! What follows the closing `SETITEMS` is read by the same code (`Fast::finish`).

use super::{field, Fast, Field, Kind, KnownKeys};
use crate::snapshot::model::Action;
use crate::snapshot::pickle::entry::RawEvent;
use crate::snapshot::pickle::frames::StackId;
use crate::snapshot::pickle::memo::Memo;
use crate::snapshot::pickle::opcodes as op;

/// Longest frozen event, in words (an event of 8 keys without frames takes about 24).
const MOST_WORDS: usize = 40;

/// Most integers a frozen event holds.
const MOST_INTEGERS: usize = 12;

/// Layouts kept, by a hash of their bytes 8 to 24 (which hold the length and the start of the
/// action's name in the layouts serde-pickle writes); two layouts with the same hash replace
/// each other.
const LAYOUTS: usize = 16;

/// Credit a freezing costs; a frozen read earns one (up to `MOST_CREDIT`). A file whose events
/// never repeat a layout (varying texts, memo references) stops paying for freezing soon.
const FREEZE_COST: u32 = 8;
const MOST_CREDIT: u32 = 64;

/// Events after which freezing is tried again once credit has run out.
const RETRY_EVENTS: u32 = 4096;

/// The width of an integer's payload: `BININT1`, `BININT2`, `BININT`, `LONG1` of 8 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Width {
    One,
    Two,
    Four,
    Eight,
}

/// One integer of a frozen event: where its payload starts and which field it sets.
#[derive(Clone, Copy)]
struct Integer {
    at: usize,
    width: Width,
    field: Field,
}

/// One frozen event (see the module's documentation).
#[derive(Clone)]
struct Layout {
    words: [u64; MOST_WORDS],
    masks: [u64; MOST_WORDS],
    /// Words compared.
    count: usize,
    /// Bytes of the event, its closing `SETITEMS` included.
    length: usize,
    integers: [Integer; MOST_INTEGERS],
    integer_count: usize,
    kind: Kind,
    /// Whether the event has `frames` (always an empty list here).
    frames: bool,
}

/// The frozen layouts and what freezing may still cost.
pub struct Frozen {
    layouts: Vec<Option<Layout>>,
    credit: u32,
    waited: u32,
}

impl Default for Frozen {
    fn default() -> Frozen {
        Frozen {
            layouts: vec![None; LAYOUTS],
            credit: MOST_CREDIT,
            waited: 0,
        }
    }
}

/// The slot of the layout the event starting with `head` may follow (only a hint: the whole
/// event is compared before it is taken to follow it).
#[inline(always)]
fn slot(head: &[u8; 24]) -> usize {
    let word = |index: usize| {
        let mut eight = [0u8; 8];
        eight.copy_from_slice(&head[index * 8..index * 8 + 8]);
        u64::from_le_bytes(eight)
    };
    let mixed = (word(1) ^ word(2).rotate_left(29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (mixed >> 60) as usize % LAYOUTS
}

/// A little-endian word of `bytes` at `at` (all of which exist).
#[inline(always)]
fn word_at(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(*bytes.get(at..)?.first_chunk::<8>()?))
}

impl Frozen {
    /// The event at the start of `bytes` (just after its `EMPTY_DICT`) when it matches a
    /// frozen layout, read exactly as `Fast::event` would read it, with the bytes taken and
    /// the memo entries made; `None` when it matches none.
    #[inline(always)]
    pub fn read<'a>(
        &mut self,
        bytes: &'a [u8],
        memo: &'a Memo,
        keys: &'a mut KnownKeys,
    ) -> Option<super::FastEvent> {
        let layout = self
            .layouts
            .get(slot(bytes.first_chunk::<24>()?))?
            .as_ref()?;
        let room = bytes.get(..layout.count * 8)?;
        let mut differ = 0;
        for ((chunk, word), mask) in room
            .chunks_exact(8)
            .zip(&layout.words[..layout.count])
            .zip(&layout.masks[..layout.count])
        {
            let found = u64::from_le_bytes(*chunk.first_chunk::<8>()?);
            differ |= (found ^ word) & mask;
        }
        if differ != 0 {
            return None;
        }
        let mut event = RawEvent::new(Action::Alloc);
        for integer in &layout.integers[..layout.integer_count] {
            let at = integer.at;
            let value = match integer.width {
                Width::One => i64::from(*bytes.get(at)?),
                Width::Two => i64::from(u16::from_le_bytes(*bytes.get(at..)?.first_chunk()?)),
                Width::Four => i64::from(i32::from_le_bytes(*bytes.get(at..)?.first_chunk()?)),
                Width::Eight => word_at(bytes, at)? as i64,
            };
            match integer.field {
                Field::Addr => event.addr = value,
                Field::Size => event.size = value,
                Field::Stream => event.stream = value,
                _ => event.time_us = value,
            }
        }
        if layout.frames {
            event.stack = StackId::EMPTY;
        }
        let mut parser = Fast::new(bytes, memo, keys);
        parser.at = layout.length;
        // The layout was frozen only when the event had its addr and size (or is a marker).
        let entry = parser.finish(layout.kind, event, true, true)?;
        self.credit = (self.credit + 1).min(MOST_CREDIT);
        Some((entry, parser.at, parser.puts))
    }

    /// Freezes the event at the start of `bytes`, which `Fast::event` has just read without
    /// a memo store, when its layout can be frozen and freezing has not cost too much lately.
    pub fn learn(&mut self, bytes: &[u8], memo: &Memo, keys: &mut KnownKeys) {
        if self.credit < FREEZE_COST {
            self.waited += 1;
            if self.waited < RETRY_EVENTS {
                return;
            }
            self.waited = 0;
            self.credit = FREEZE_COST;
        }
        self.credit -= FREEZE_COST;
        let Some(head) = bytes.first_chunk::<24>() else {
            return;
        };
        let index = slot(head);
        if let Some(layout) = freeze(&mut Fast::new(bytes, memo, keys)) {
            if let Some(place) = self.layouts.get_mut(index) {
                *place = Some(layout);
            }
        }
    }
}

/// The frozen layout of the event `parser` starts at, if it has one: keys and texts written
/// out in full, integers in a form of fixed width, frames an empty list, no pool, no memo
/// opcode anywhere.
fn freeze(parser: &mut Fast<'_>) -> Option<Layout> {
    if parser.byte()? != op::MARK {
        return None;
    }
    let mut integers = [Integer {
        at: 0,
        width: Width::One,
        field: Field::Size,
    }; MOST_INTEGERS];
    let mut integer_count = 0;
    let mut kind = None;
    let (mut has_addr, mut has_size, mut frames) = (false, false, false);
    loop {
        if parser.bytes.get(parser.at)? == &op::SETITEMS {
            parser.at += 1;
            break;
        }
        let field = field(parser.plain_text()??)?;
        if kind.is_none() && field != Field::Action {
            return None;
        }
        match field {
            Field::Action => kind = Some(Kind::of_name(parser.plain_text()??)?),
            Field::Addr | Field::Size | Field::Stream | Field::TimeUs => {
                let (width, payload) = match parser.bytes.get(parser.at..parser.at + 2)? {
                    [op::BININT1, _] => (Width::One, 1),
                    [op::BININT2, _] => (Width::Two, 1),
                    [op::BININT, _] => (Width::Four, 1),
                    [op::LONG1, 8] => (Width::Eight, 2),
                    _ => return None,
                };
                let at = parser.at + payload;
                match field {
                    Field::Addr => {
                        parser.address()?;
                        has_addr = true;
                    }
                    _ => {
                        parser.int()?;
                        has_size |= field == Field::Size;
                    }
                }
                *integers.get_mut(integer_count)? = Integer { at, width, field };
                integer_count += 1;
            }
            Field::Text => {
                parser.plain_text()??;
            }
            Field::Frames => {
                if parser.bytes.get(parser.at)? != &op::EMPTY_LIST {
                    return None;
                }
                parser.frames()?;
                frames = true;
            }
            Field::Pool => return None,
        }
    }
    let kind = kind?;
    if matches!(kind, Kind::Memory(_)) && !(has_addr && has_size) || !parser.puts.is_empty() {
        return None;
    }
    let length = parser.at;
    let count = length.div_ceil(8);
    if count > MOST_WORDS {
        return None;
    }
    let mut padded = [0u8; MOST_WORDS * 8];
    let mut mask = [0u8; MOST_WORDS * 8];
    padded[..length].copy_from_slice(parser.bytes.get(..length)?);
    mask[..length].fill(0xff);
    for integer in &integers[..integer_count] {
        let width = match integer.width {
            Width::One => 1,
            Width::Two => 2,
            Width::Four => 4,
            Width::Eight => 8,
        };
        mask.get_mut(integer.at..integer.at + width)?.fill(0);
    }
    let words = |bytes: &[u8; MOST_WORDS * 8]| {
        let mut words = [0u64; MOST_WORDS];
        for (word, chunk) in words.iter_mut().zip(bytes.chunks_exact(8)) {
            let mut eight = [0u8; 8];
            eight.copy_from_slice(chunk);
            *word = u64::from_le_bytes(eight);
        }
        words
    };
    Some(Layout {
        words: words(&padded),
        masks: words(&mask),
        count,
        length,
        integers,
        integer_count,
        kind,
        frames,
    })
}

#[cfg(test)]
mod tests;
