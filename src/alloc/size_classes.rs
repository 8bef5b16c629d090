//! The free blocks of one stream in a pool, ordered by (size, address) as PyTorch's
//! `BlockComparatorSize` orders them, split by size class: one small ordered map per class
//! and a bitmap of the classes that hold a block.
//!
//! Why: a malloc's best-fit search, a split remainder's insert and a free's merges each
//! searched one ordered set of all the stream's free blocks (hundreds to thousands). A size
//! class holds the blocks of one sixteenth of a power of two, so its map is a few keys, and
//! the first class above a request's with a block is one bit scan. Classes are increasing
//! ranges of sizes, so visiting them in order visits the keys in (size, address) order: the
//! best fit is exactly the one a single ordered set gives.

use super::free_index::FreeIndex;

/// Bits of the size class below a size's leading bit: 16 classes per power of two.
const SUB_BITS: u32 = 4;

/// How many classes there are (every `u64` size has one).
const CLASSES: usize = (64 - SUB_BITS as usize + 1) << SUB_BITS;

/// Words of the bitmap of classes that hold a block.
const WORDS: usize = CLASSES.div_ceil(64);

/// The size class of `size`: sizes below 16 are their own class; above, the power of two and
/// the next four bits. Non-decreasing in `size`, so classes in order hold keys in order.
#[inline(always)]
fn class_of(size: u64) -> usize {
    let sub = 1u64 << SUB_BITS;
    if size < sub {
        return size as usize;
    }
    let log = 63 - size.leading_zeros();
    let shift = log - SUB_BITS;
    (((shift + 1) as usize) << SUB_BITS) + ((size >> shift) as usize & (sub as usize - 1))
}

/// The size packed in the high half of a free block's key.
#[inline(always)]
fn size_of(key: u128) -> u64 {
    (key >> 64) as u64
}

/// An ordered map of free blocks' keys (size in the high 64 bits, address in the low) to
/// values (their ids), in one [`FreeIndex`] per size class.
///
/// Invariants: bit `c` of `occupied` is set exactly when `classes[c]` holds a key; every key
/// of `classes[c]` has size class `c`; `len` is the number of keys.
#[derive(Debug, Clone)]
pub struct SizeClassMap<V> {
    /// The maps of the classes up to the highest used so far (grown on demand).
    classes: Vec<FreeIndex<V>>,
    occupied: [u64; WORDS],
    len: usize,
}

impl<V: Copy> SizeClassMap<V> {
    /// An empty map.
    pub fn new() -> SizeClassMap<V> {
        SizeClassMap {
            classes: Vec::new(),
            occupied: [0; WORDS],
            len: 0,
        }
    }

    /// Number of keys.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// The first class at or above `class` that holds a key.
    #[inline(always)]
    fn occupied_from(&self, class: usize) -> Option<usize> {
        let mut word = class / 64;
        let mut bits = *self.occupied.get(word)? & (u64::MAX << (class % 64));
        loop {
            if bits != 0 {
                return Some(word * 64 + bits.trailing_zeros() as usize);
            }
            word += 1;
            bits = *self.occupied.get(word)?;
        }
    }

    #[inline(always)]
    fn mark(&mut self, class: usize, holds: bool) {
        let bit = 1u64 << (class % 64);
        if holds {
            self.occupied[class / 64] |= bit;
        } else {
            self.occupied[class / 64] &= !bit;
        }
    }

    /// The first entry at or above `key`.
    #[inline]
    pub fn first_from(&self, key: u128) -> Option<(u128, V)> {
        let class = class_of(size_of(key));
        if let Some(found) = self.classes.get(class).and_then(|map| map.first_from(key)) {
            return Some(found);
        }
        let next = self.occupied_from(class + 1)?;
        self.classes.get(next)?.first_from(0)
    }

    /// Removes and returns the first entry at or above `key`.
    #[inline]
    pub fn take_first_from(&mut self, key: u128) -> Option<(u128, V)> {
        let class = class_of(size_of(key));
        if let Some(taken) = self.take_in(class, key) {
            return Some(taken);
        }
        let next = self.occupied_from(class + 1)?;
        self.take_in(next, 0)
    }

    /// Takes the first entry at or above `key` from the map of `class`.
    #[inline(always)]
    fn take_in(&mut self, class: usize, key: u128) -> Option<(u128, V)> {
        let map = self.classes.get_mut(class)?;
        let taken = map.take_first_from(key)?;
        let left = map.len();
        self.len -= 1;
        if left == 0 {
            self.mark(class, false);
        }
        Some(taken)
    }

    /// The value stored under `key`.
    pub fn get(&self, key: u128) -> Option<V> {
        self.classes.get(class_of(size_of(key)))?.get(key)
    }

    /// Stores `value` under `key`, returning the value it replaces.
    #[inline]
    pub fn insert(&mut self, key: u128, value: V) -> Option<V> {
        let class = class_of(size_of(key));
        if class >= self.classes.len() {
            self.grow(class);
        }
        let replaced = self.classes[class].insert(key, value);
        if replaced.is_none() {
            self.len += 1;
            self.mark(class, true);
        }
        replaced
    }

    #[cold]
    fn grow(&mut self, class: usize) {
        self.classes.resize_with(class + 1, FreeIndex::new);
    }

    /// Removes `key`, returning its value.
    #[inline]
    pub fn remove(&mut self, key: u128) -> Option<V> {
        let class = class_of(size_of(key));
        let map = self.classes.get_mut(class)?;
        let removed = map.remove(key)?;
        let left = map.len();
        self.len -= 1;
        if left == 0 {
            self.mark(class, false);
        }
        Some(removed)
    }

    /// Every entry, in key order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (u128, V)> + '_ {
        self.classes.iter().flat_map(FreeIndex::iter)
    }

    /// The entries at or above `key`, in key order.
    pub fn range_from(&self, key: u128) -> impl DoubleEndedIterator<Item = (u128, V)> + '_ {
        let class = class_of(size_of(key));
        let (at, above) = match self.classes.get(class..) {
            Some([at, above @ ..]) => (Some(at), above),
            _ => (None, &[][..]),
        };
        at.into_iter()
            .flat_map(move |map| map.range_from(key))
            .chain(above.iter().flat_map(FreeIndex::iter))
    }

    /// The entries below `key`, in key order.
    pub fn range_below(&self, key: u128) -> impl DoubleEndedIterator<Item = (u128, V)> + '_ {
        let class = class_of(size_of(key));
        let below = self.classes.get(..class).unwrap_or(&self.classes);
        let at = self.classes.get(class);
        below
            .iter()
            .flat_map(FreeIndex::iter)
            .chain(at.into_iter().flat_map(move |map| map.range_below(key)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::xorshift::next;
    use std::collections::BTreeMap;

    #[test]
    fn classes_follow_sizes() {
        // Non-decreasing over every size near a power of two (and all small ones).
        let mut sizes: Vec<u64> = (0..5000u64)
            .chain((1..64).flat_map(|bit| {
                let p = 1u64 << bit;
                [p - 1, p, p + 1, p | (p >> 1), p | (p - 1)]
            }))
            .collect();
        sizes.sort_unstable();
        for pair in sizes.windows(2) {
            assert!(class_of(pair[0]) <= class_of(pair[1]), "{pair:?}");
            assert!(class_of(pair[1]) < CLASSES, "{pair:?}");
        }
        assert_eq!(class_of(u64::MAX), CLASSES - 1);
        assert_eq!(class_of(15), 15);
        assert_eq!(class_of(16), 16);
        assert_eq!(class_of(31), 31);
        assert_eq!(class_of(32), 32);
        assert_eq!(class_of(33), 32);
    }

    #[test]
    fn matches_an_ordered_map_under_random_operations() {
        for (seed, shift) in [(3u64, 8u32), (11, 20), (42, 40)] {
            let mut state = seed;
            let mut map = SizeClassMap::<u32>::new();
            let mut model = BTreeMap::new();
            for step in 0..20_000u32 {
                // Sizes spread over many powers of two, addresses a few apart.
                let size = next(&mut state) >> (64 - shift);
                let size = size >> (next(&mut state) % u64::from(shift));
                let key = u128::from(size) << 64 | u128::from(next(&mut state) % 4);
                match next(&mut state) % 5 {
                    0 | 1 => assert_eq!(map.insert(key, step), model.insert(key, step)),
                    2 => assert_eq!(map.remove(key), model.remove(&key)),
                    3 => {
                        let expected = model.range(key..).next().map(|(&k, &v)| (k, v));
                        assert_eq!(map.first_from(key), expected);
                        assert_eq!(map.get(key), model.get(&key).copied());
                    }
                    _ => {
                        let expected = model.range(key..).next().map(|(&k, &v)| (k, v));
                        assert_eq!(map.take_first_from(key), expected);
                        if let Some((k, _)) = expected {
                            model.remove(&k);
                        }
                    }
                }
                assert_eq!(map.len(), model.len());
                if step % 499 == 0 {
                    let all: Vec<_> = map.iter().collect();
                    let want: Vec<_> = model.iter().map(|(&k, &v)| (k, v)).collect();
                    assert_eq!(all, want);
                    let back: Vec<_> = map.iter().rev().collect();
                    assert_eq!(back, want.iter().rev().copied().collect::<Vec<_>>());
                    let from: Vec<_> = map.range_from(key).collect();
                    let want: Vec<_> = model.range(key..).map(|(&k, &v)| (k, v)).collect();
                    assert_eq!(from, want);
                    let below: Vec<_> = map.range_below(key).rev().collect();
                    let want: Vec<_> = model.range(..key).rev().map(|(&k, &v)| (k, v)).collect();
                    assert_eq!(below, want);
                    for (class, index) in map.classes.iter().enumerate() {
                        let bit = map.occupied[class / 64] >> (class % 64) & 1 == 1;
                        assert_eq!(bit, index.len() > 0, "class {class}");
                    }
                }
            }
            while let Some((key, _)) = map.take_first_from(0) {
                assert!(model.remove(&key).is_some());
            }
            assert!(model.is_empty());
            assert_eq!(map.occupied, [0; WORDS]);
        }
    }
}
