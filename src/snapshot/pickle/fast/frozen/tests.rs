//! A frozen layout must read exactly what the key-by-key path reads, or refuse: these tests
//! freeze one event and read another against it, then compare with `Fast::event` on the same
//! bytes.

use super::super::testing::{
    alloc, binint, check_random_changes, dict, event, key_by_key, long8, text,
};
use super::*;

/// The layouts frozen from `first` (read key by key first, as the fast path does).
fn frozen_from(first: &[u8], memo: &Memo) -> Frozen {
    assert!(key_by_key(first, memo).is_some(), "the first event reads");
    let mut frozen = Frozen::default();
    frozen.learn(first, memo, &mut KnownKeys::default());
    frozen
}

/// Checks that the layout frozen from `first`, when it reads `next` at all, reads what
/// `Fast::event` reads; returns whether it read it.
fn agrees(first: &[u8], next: &[u8]) -> bool {
    let memo = Memo::default();
    let mut frozen = frozen_from(first, &memo);
    match frozen.read(next, &memo, &mut KnownKeys::default()) {
        Some(read) => {
            assert_eq!(Some(read), key_by_key(next, &memo), "{next:?}");
            true
        }
        None => false,
    }
}

fn frozen_count(frozen: &Frozen) -> usize {
    frozen.layouts.iter().flatten().count()
}

#[test]
fn reads_events_that_differ_only_in_their_integers() {
    let first = alloc();
    for next in [
        alloc(),
        dict(&event("alloc", -1, binint(-7), 5)),
        dict(&event("alloc", i64::MAX, binint(i32::MAX), i32::MIN)),
    ] {
        assert!(agrees(&first, &next), "{next:?}");
    }
    let one_byte = dict(&event("free_completed", 1, vec![op::BININT1, 9], 0));
    assert!(agrees(
        &one_byte,
        &dict(&event("free_completed", 3, vec![op::BININT1, 200], 2))
    ));
    let two_bytes = dict(&event("free_completed", 1, vec![op::BININT2, 9, 1], 0));
    assert!(agrees(
        &two_bytes,
        &dict(&event("free_completed", 3, vec![op::BININT2, 0, 200], 2))
    ));
    let marker = dict(&event("user_defined", 0, binint(0), 0));
    assert!(agrees(
        &marker,
        &dict(&event("user_defined", 9, binint(3), 0))
    ));
}

#[test]
fn refuses_every_other_difference() {
    let first = alloc();
    let mut other_text = event("alloc", 1, binint(2), 0);
    other_text[5].1 = text("N/B");
    let mut renamed = event("alloc", 1, binint(2), 0);
    renamed[2].0 = text("sizf");
    let mut frames = event("alloc", 1, binint(2), 0);
    frames[7].1 = vec![op::BINGET, 0];
    for next in [
        dict(&event("free_requested", 1, binint(2), 0)),
        dict(&event("alloc", 1, long8(2), 0)),
        dict(&event("alloc", 1, vec![op::BININT1, 2, op::BININT1, 0], 0)),
        dict(&other_text),
        dict(&renamed),
        dict(&frames),
    ] {
        assert!(!agrees(&first, &next), "{next:?}");
    }
    // What follows the dict is read as the key-by-key path reads it: a memo store belongs to
    // the event, the end of the bytes refuses it.
    let mut stored = alloc();
    let end = stored.len() - 32;
    stored.splice(end..end, [op::BINPUT, 3]);
    assert!(agrees(&first, &stored));
    assert!(!agrees(&first, &first[..end]));
}

#[test]
fn freezes_only_fixed_layouts() {
    let memo = Memo::default();
    let mut pool = event("alloc", 1, binint(2), 0);
    pool.push((
        text("pool_id"),
        vec![op::BININT1, 1, op::BININT1, 2, op::TUPLE2],
    ));
    let mut short_long = event("alloc", 1, binint(2), 0);
    short_long[1].1 = vec![op::LONG1, 5, 1, 2, 3, 4, 5];
    let mut memoized = dict(&event("alloc", 1, binint(2), 0));
    memoized.splice(0..0, [op::MEMOIZE]);
    for first in [dict(&pool), dict(&short_long), memoized] {
        assert!(key_by_key(&first, &memo).is_some());
        assert_eq!(frozen_count(&frozen_from(&first, &memo)), 0, "{first:?}");
    }
    assert_eq!(frozen_count(&frozen_from(&alloc(), &memo)), 1);
}

#[test]
fn stops_freezing_when_nothing_repeats() {
    let memo = Memo::default();
    let mut frozen = Frozen::default();
    let mut pool = event("alloc", 1, binint(2), 0);
    pool.push((
        text("pool_id"),
        vec![op::BININT1, 1, op::BININT1, 2, op::TUPLE2],
    ));
    let unfreezable = dict(&pool);
    for _ in 0..MOST_CREDIT / FREEZE_COST {
        frozen.learn(&unfreezable, &memo, &mut KnownKeys::default());
    }
    frozen.learn(&alloc(), &memo, &mut KnownKeys::default());
    assert_eq!(frozen_count(&frozen), 0, "out of credit");
    for _ in 0..RETRY_EVENTS {
        frozen.learn(&alloc(), &memo, &mut KnownKeys::default());
    }
    assert_eq!(frozen_count(&frozen), 1, "tried again");
}

/// Random changes of one to three bytes anywhere in an event: whatever the frozen layout
/// reads, the key-by-key path reads alike. Changes inside integers are read; the rest are
/// refused.
#[test]
fn never_disagrees_with_the_key_by_key_path() {
    check_random_changes(0x9e37_79b9_7f4a_7c15, |random| (random >> 8) as u8, agrees);
}
