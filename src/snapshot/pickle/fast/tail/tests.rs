//! The template must read exactly what the key-by-key path reads, or refuse: these tests
//! learn a template from one event and read another against it, then compare with
//! `Fast::event` on the same bytes.

use super::super::testing::{
    alloc, binint, check_random_changes, dict, event, key_by_key, long8, text,
};
use super::super::{FastEvent, KnownKeys};
use super::*;
use crate::snapshot::pickle::memo::{Memo, MemoEntry};

/// A template learned from `first` (as if read key by key).
fn learned(first: &[u8], memo: &Memo) -> Template {
    let mut keys = KnownKeys::default();
    let mut template = Template::default();
    assert!(key_by_key(first, memo).is_some(), "the first event reads");
    template.learn(&mut Fast::new(first, memo, &mut keys));
    template
}

/// What the template learned from `first` reads from `next`.
fn by_template(template: &mut Template, next: &[u8], memo: &Memo) -> Option<FastEvent> {
    let mut keys = KnownKeys::default();
    let mut parser = Fast::new(next, memo, &mut keys);
    let entry = template.read(&mut parser)?;
    Some((entry, parser.at, parser.puts))
}

/// Checks that the template, when it reads `next` at all, reads what `Fast::event` reads;
/// returns whether it read it.
fn agrees(first: &[u8], next: &[u8]) -> bool {
    let memo = Memo::default();
    let mut template = learned(first, &memo);
    match by_template(&mut template, next, &memo) {
        Some(read) => {
            assert_eq!(Some(read), key_by_key(next, &memo), "{next:?}");
            true
        }
        None => false,
    }
}

#[test]
fn reads_events_that_differ_only_in_their_values() {
    let first = alloc();
    for next in [
        alloc(),
        dict(&event(
            "free_requested",
            0x7faa_d880_0000,
            binint(1 << 20),
            0,
        )),
        dict(&event("segment_alloc", -5, binint(7), 3)),
        // Another integer form: a size beyond 32 bits, a one-byte size.
        dict(&event("alloc", 1, long8(5 << 40), 0)),
        dict(&event("free_completed", 1, vec![op::BININT1, 9], 0)),
        dict(&event("user_defined", 0, binint(0), 0)),
    ] {
        assert!(agrees(&first, &next), "{next:?}");
    }
}

#[test]
fn refuses_events_whose_keys_differ() {
    let first = alloc();
    let mut renamed = event("alloc", 1, binint(2), 0);
    renamed[2].0 = text("sizf");
    let mut swapped = event("alloc", 1, binint(2), 0);
    swapped.swap(1, 2);
    let mut short_form = event("alloc", 1, binint(2), 0);
    short_form[1].0 = vec![op::SHORT_BINUNICODE, 4, b'a', b'd', b'd', b'r'];
    let mut fewer = event("alloc", 1, binint(2), 0);
    fewer.pop();
    let mut more = event("alloc", 1, binint(2), 0);
    more.push((
        text("pool_id"),
        vec![op::BININT1, 1, op::BININT1, 2, op::TUPLE2],
    ));
    let mut device_free = event("alloc", 1, binint(2), 0);
    device_free[1].0 = text("device_free");
    for next in [renamed, swapped, short_form, fewer, more, device_free] {
        assert!(!agrees(&first, &dict(&next)), "{next:?}");
    }
}

#[test]
fn leaves_memo_opcodes_to_the_key_by_key_path() {
    let first = alloc();
    let put = |bytes: &mut Vec<u8>, at: usize| {
        bytes.splice(at..at, [op::BINPUT, 7]);
    };
    let items = event("alloc", 1, binint(2), 0);
    // A memo store after a key, after the action, after the dict's MARK.
    let key_end = 1 + items[0].0.len();
    let action_end = key_end + items[0].1.len();
    for at in [key_end, action_end] {
        let mut next = dict(&items);
        put(&mut next, at);
        assert!(!agrees(&first, &next));
        assert!(key_by_key(&next, &Memo::default()).is_some());
    }
    // A frames list being filled.
    let mut filled = items.clone();
    filled[7].1 = vec![op::EMPTY_LIST, op::MARK];
    assert!(!agrees(&first, &dict(&filled)));
    // Memo stores the template reads as the key-by-key path does: before the MARK (Python's
    // pickler memoizes the dict), after the SETITEMS (PyTorch's C++ writer), after frames.
    let mut before = dict(&items);
    before.splice(0..0, [op::MEMOIZE]);
    let mut after = dict(&items);
    let end = after
        .iter()
        .rposition(|&byte| byte == op::SETITEMS)
        .unwrap_or(0);
    after.splice(end + 1..end + 1, [op::BINPUT, 3]);
    let mut frames = items;
    frames[7].1 = vec![op::EMPTY_LIST, op::BINPUT, 4];
    for next in [before, after, dict(&frames)] {
        assert!(agrees(&first, &next), "{next:?}");
    }
}

#[test]
fn refuses_what_the_key_by_key_path_refuses() {
    let first = alloc();
    // An unsigned size, an unknown action, a memory event without its size.
    let mut unsigned = vec![op::LONG1, 9];
    unsigned.extend_from_slice(&[0xff; 8]);
    unsigned.push(0);
    for next in [
        dict(&event("alloc", 1, unsigned, 0)),
        dict(&event("allocate", 1, binint(2), 0)),
    ] {
        assert!(!agrees(&first, &next));
        assert!(key_by_key(&next, &Memo::default()).is_none());
    }
    // A template learned from a marker without a size refuses a memory event without one.
    let mut items = event("user_defined", 0, binint(0), 0);
    items.remove(2);
    let marker_first = dict(&items);
    items[0].1 = text("alloc");
    let sizeless = dict(&items);
    let mut template = learned(&marker_first, &Memo::default());
    assert!(template.count > 0);
    assert!(by_template(&mut template, &sizeless, &Memo::default()).is_none());
    assert!(key_by_key(&sizeless, &Memo::default()).is_none());
}

#[test]
fn refuses_an_event_cut_short() {
    let first = alloc();
    let next = alloc();
    let end = next.len() - 32;
    for length in 0..=end {
        agrees(&first, &next[..length]);
    }
    // The key-by-key path needs a byte after the dict (a memo store would belong to it).
    assert!(!agrees(&first, &next[..end]));
}

#[test]
fn learns_only_keys_written_out() {
    // Python's pickler refers to keys it wrote before by memo id: what a key means then
    // depends on the memo, which the template does not check, so it is not learned.
    let mut memo = Memo::default();
    let addr = Value::Str("addr".into());
    let entry = memo.form(&addr).map(|value| MemoEntry {
        value,
        depth: 0,
        cost: 0,
    });
    memo.put(0, entry);
    let items = event("alloc", 1, binint(2), 0);
    let mut bytes = dict(&items);
    let key = text("addr");
    let at = 1 + items[0].0.len() + items[0].1.len();
    bytes.splice(at..at + key.len(), [op::BINGET, 0]);
    assert!(key_by_key(&bytes, &memo).is_some());
    let mut keys = KnownKeys::default();
    let mut template = Template::default();
    template.learn(&mut Fast::new(&bytes, &memo, &mut keys));
    assert_eq!(template.count, 0);
    assert_eq!(template.idle, IDLE_EVENTS);
}

#[test]
fn keeps_a_template_through_one_odd_event() {
    let memo = Memo::default();
    let mut template = learned(&alloc(), &memo);
    let mut items = event("alloc", 1, binint(2), 0);
    items.pop();
    let odd = dict(&items);
    let mut keys = KnownKeys::default();
    assert!(by_template(&mut template, &odd, &memo).is_none());
    template.learn(&mut Fast::new(&odd, &memo, &mut keys));
    assert!(by_template(&mut template, &alloc(), &memo).is_some());
    // Twice in a row: the new layout becomes the template.
    for _ in 0..2 {
        assert!(by_template(&mut template, &odd, &memo).is_none());
        template.learn(&mut Fast::new(&odd, &memo, &mut keys));
    }
    assert!(by_template(&mut template, &odd, &memo).is_some());
    assert!(by_template(&mut template, &alloc(), &memo).is_none());
}

/// Random changes of one to three bytes anywhere in an event: whatever the template reads, the
/// key-by-key path reads alike. Some changes fall in values and are read; the rest are refused.
#[test]
fn never_disagrees_with_the_key_by_key_path() {
    let interesting = [
        0u8,
        1,
        4,
        8,
        0xff,
        op::MARK,
        op::SETITEMS,
        op::BINPUT,
        op::MEMOIZE,
        op::BINGET,
        op::EMPTY_LIST,
        op::LONG1,
        op::BININT1,
        op::BINUNICODE,
        op::SHORT_BINUNICODE,
        b'a',
    ];
    // Half the new bytes are opcodes and lengths the template must notice, half anything.
    let new_byte = |random: u64| {
        if random.is_multiple_of(2) {
            interesting[(random >> 8) as usize % interesting.len()]
        } else {
            (random >> 8) as u8
        }
    };
    check_random_changes(0x2545_f491_4f6c_dd1d, new_byte, agrees);
}
