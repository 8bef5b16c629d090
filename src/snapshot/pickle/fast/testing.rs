//! Events as serde-pickle writes them, for the fast path's tests.

use super::{Fast, FastEvent, KnownKeys};
use crate::snapshot::pickle::memo::Memo;
use crate::snapshot::pickle::opcodes as op;

/// `BINUNICODE`: how serde-pickle writes every string.
pub fn text(name: &str) -> Vec<u8> {
    let mut bytes = vec![op::BINUNICODE];
    bytes.extend_from_slice(&(name.len() as u32).to_le_bytes());
    bytes.extend_from_slice(name.as_bytes());
    bytes
}

/// `LONG1` of eight bytes: serde-pickle's form of an integer beyond 32 bits.
pub fn long8(value: i64) -> Vec<u8> {
    let mut bytes = vec![op::LONG1, 8];
    bytes.extend_from_slice(&value.to_le_bytes());
    bytes
}

pub fn binint(value: i32) -> Vec<u8> {
    let mut bytes = vec![op::BININT];
    bytes.extend_from_slice(&value.to_le_bytes());
    bytes
}

/// An event dict after its `EMPTY_DICT`, from encoded keys and values, followed by the next
/// event's `EMPTY_DICT`s (room for the template's three-word reads).
pub fn dict(items: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut bytes = vec![op::MARK];
    for (key, value) in items {
        bytes.extend_from_slice(key);
        bytes.extend_from_slice(value);
    }
    bytes.push(op::SETITEMS);
    bytes.extend_from_slice(&[op::EMPTY_DICT; 32]);
    bytes
}

/// An event as serde-pickle (and `gpumem bench replay`) writes it.
pub fn event(action: &str, addr: i64, size: Vec<u8>, stream: i32) -> Vec<(Vec<u8>, Vec<u8>)> {
    vec![
        (text("action"), text(action)),
        (text("addr"), long8(addr)),
        (text("size"), size),
        (text("stream"), binint(stream)),
        (text("time_us"), long8(1_700_000_000_000_000)),
        (text("compile_context"), text("N/A")),
        (text("user_metadata"), text("")),
        (text("frames"), vec![op::EMPTY_LIST]),
    ]
}

pub fn alloc() -> Vec<u8> {
    dict(&event("alloc", 0x7faa_d880_0000, binint(1 << 20), 0))
}

/// What `Fast::event` reads from `bytes`.
pub fn key_by_key(bytes: &[u8], memo: &Memo) -> Option<FastEvent> {
    let mut keys = KnownKeys::default();
    let mut parser = Fast::new(bytes, memo, &mut keys);
    let entry = parser.event()?;
    Some((entry, parser.at, parser.puts))
}

/// Changes one to three bytes at random places of `alloc()`'s event, 20,000 times over
/// (`new_byte` makes each new byte from a random word), and asserts that `agrees` (a fast
/// reading checked against the key-by-key path's) read more than 1,000 of the changed events
/// and refused more than 1,000: both outcomes are exercised.
pub fn check_random_changes(
    seed: u64,
    new_byte: impl Fn(u64) -> u8,
    agrees: impl Fn(&[u8], &[u8]) -> bool,
) {
    let first = alloc();
    let mut state = seed;
    let mut next_random = move || crate::alloc::xorshift::next(&mut state);
    let (mut read, mut refused) = (0, 0);
    for _ in 0..20_000 {
        let mut next = alloc();
        // The trailing `EMPTY_DICT`s stand for the next event: left as they are.
        let event = first.len() - 32;
        for _ in 0..1 + next_random() % 3 {
            let at = (next_random() % event as u64) as usize;
            next[at] = new_byte(next_random());
        }
        if agrees(&first, &next) {
            read += 1;
        } else {
            refused += 1;
        }
    }
    assert!(
        read > 1000 && refused > 1000,
        "{read} read, {refused} refused"
    );
}
