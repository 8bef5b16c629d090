//! A small deterministic pseudo-random generator for tests that drive a structure with many
//! random operations and compare it with a model (std's `BTreeMap`, the reader's key-by-key
//! path): reproducible from its seed, with no randomness crate.

/// The next word of Marsaglia's xorshift64 (shifts 13, 7, 17) from `state`, which it advances.
/// `state` must not be 0 (it would stay 0).
pub(crate) fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}
