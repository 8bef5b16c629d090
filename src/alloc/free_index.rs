//! An ordered map from a free block's `u128` key to a value (its id), kept as short sorted runs
//! ("chunks") of at most [`CAP`] keys under a sorted array of each chunk's first key: a B+ tree
//! of height two with wide nodes. Each size class of a stream's free blocks is one
//! (`super::size_classes`).
//!
//! Why not `std`'s `BTreeMap`: a class usually holds a few blocks, which this keeps in one
//! vector (a search is one binary search, an insert or removal one short shift), while a class
//! that holds thousands (many cached blocks of one size) still costs two binary searches and a
//! shift of at most [`CAP`] entries, not a shift of the whole class. The order is exactly the
//! keys' order, so the pools' best-fit order (PyTorch's) does not depend on this choice.

/// The most keys a chunk holds; a chunk that would hold more is split in two halves.
///
/// Small enough that shifting a chunk's tail is a few cache lines, large enough that the
/// top-level array stays short (a class of 2,000 free blocks has about 60 chunks).
const CAP: usize = 64;

/// A chunk this small after a removal is merged with a neighbour that has room, so that
/// removals cannot leave many near-empty chunks behind.
const MERGE_BELOW: usize = CAP / 8;

/// One sorted run of keys, each with its block's id beside it: one allocation and one shift
/// per insert or removal, and the id in the cache line the search just read.
#[derive(Debug, Clone)]
struct Chunk<V> {
    keys: Vec<(u128, V)>,
}

impl<V: Copy> Chunk<V> {
    fn with_room() -> Chunk<V> {
        Chunk {
            keys: Vec::with_capacity(CAP + 1),
        }
    }

    /// Where `key` is or would go: the number of keys below it.
    #[inline(always)]
    fn position(&self, key: u128) -> usize {
        self.keys.partition_point(|&(k, _)| k < key)
    }

    /// The key at position `p` (valid).
    #[inline(always)]
    fn key(&self, p: usize) -> u128 {
        self.keys[p].0
    }

    fn entries(&self, from: usize, to: usize) -> impl DoubleEndedIterator<Item = (u128, V)> + '_ {
        self.keys.get(from..to).unwrap_or_default().iter().copied()
    }
}

/// An ordered map of unique `u128` keys to values, the blocks' ids (see the module's comment).
///
/// Invariants: no chunk is empty, except the only one: a map that empties keeps its last
/// chunk, so a size class whose one block comes and goes (a malloc's split and the free's
/// merge, again and again) allocates and frees nothing; chunks hold ascending keys and follow
/// each other in order; `firsts[i]` is `chunks[i]`'s first key (stale in an empty only chunk);
/// `len` is the number of keys.
#[derive(Debug, Clone)]
pub struct FreeIndex<V> {
    firsts: Vec<u128>,
    chunks: Vec<Chunk<V>>,
    len: usize,
}

impl<V: Copy> FreeIndex<V> {
    /// An empty map.
    pub fn new() -> FreeIndex<V> {
        FreeIndex {
            firsts: Vec::new(),
            chunks: Vec::new(),
            len: 0,
        }
    }

    /// Number of keys.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// The chunk `key` belongs in: the last whose first key is at most `key`, else the first.
    /// Only called while some chunk exists.
    #[inline(always)]
    fn chunk_of(&self, key: u128) -> usize {
        // Most maps (a size class's few blocks) are one chunk.
        if self.firsts.len() == 1 {
            return 0;
        }
        self.firsts
            .partition_point(|&first| first <= key)
            .saturating_sub(1)
    }

    /// Chunk and position of the first key at or above `key`, if any.
    #[inline(always)]
    fn lower_bound(&self, key: u128) -> Option<(usize, usize)> {
        if self.chunks.is_empty() {
            return None;
        }
        let c = self.chunk_of(key);
        let p = self.chunks[c].position(key);
        if p < self.chunks[c].keys.len() {
            Some((c, p))
        } else if c + 1 < self.chunks.len() {
            // Every key of the next chunk is above `key` (its first is).
            Some((c + 1, 0))
        } else {
            None
        }
    }

    /// The first entry at or above `key`.
    #[inline]
    pub fn first_from(&self, key: u128) -> Option<(u128, V)> {
        let (c, p) = self.lower_bound(key)?;
        let chunk = &self.chunks[c];
        Some(chunk.keys[p])
    }

    /// Removes and returns the first entry at or above `key`.
    #[inline]
    pub fn take_first_from(&mut self, key: u128) -> Option<(u128, V)> {
        let (c, p) = self.lower_bound(key)?;
        Some(self.take_at(c, p))
    }

    /// The id stored under `key`.
    pub fn get(&self, key: u128) -> Option<V> {
        let (c, p) = self.lower_bound(key)?;
        let chunk = &self.chunks[c];
        let (found, id) = chunk.keys[p];
        (found == key).then_some(id)
    }

    /// Stores `id` under `key`, returning the id it replaces.
    #[inline]
    pub fn insert(&mut self, key: u128, id: V) -> Option<V> {
        if self.chunks.is_empty() {
            // Grown as it fills: most maps of a size class hold a few keys.
            let mut chunk = Chunk { keys: Vec::new() };
            chunk.keys.push((key, id));
            self.chunks.push(chunk);
            self.firsts.push(key);
            self.len = 1;
            return None;
        }
        let c = self.chunk_of(key);
        let chunk = &mut self.chunks[c];
        let p = chunk.position(key);
        if let Some(entry) = chunk.keys.get_mut(p).filter(|entry| entry.0 == key) {
            return Some(std::mem::replace(&mut entry.1, id));
        }
        self.insert_at(c, p, key, id);
        None
    }

    /// Inserts `key` at position `p` of chunk `c`, where it sorts.
    #[inline(always)]
    fn insert_at(&mut self, c: usize, p: usize, key: u128, id: V) {
        let chunk = &mut self.chunks[c];
        chunk.keys.insert(p, (key, id));
        self.len += 1;
        if p == 0 {
            // Only below every key (chunk 0): any other key at or above a later chunk's
            // first lands after that first.
            self.firsts[c] = key;
        }
        if chunk.keys.len() > CAP {
            self.split(c);
        }
    }

    /// Removes `key`, returning its id.
    #[inline]
    pub fn remove(&mut self, key: u128) -> Option<V> {
        let (c, p) = self.lower_bound(key)?;
        if self.chunks[c].key(p) != key {
            return None;
        }
        Some(self.take_at(c, p).1)
    }

    /// Removes the entry at chunk `c`, position `p` (both valid).
    #[inline(always)]
    fn take_at(&mut self, c: usize, p: usize) -> (u128, V) {
        let chunk = &mut self.chunks[c];
        let (key, id) = match chunk.keys.len().checked_sub(1) {
            // The last key (a size class's only block, often): no shift, no `memmove` call.
            Some(last) if last == p => chunk.keys.swap_remove(p),
            _ => chunk.keys.remove(p),
        };
        self.len -= 1;
        let first = chunk.keys.first().map(|&(key, _)| key);
        let left = chunk.keys.len();
        match first {
            // The only chunk stays, empty (see the invariants).
            None if self.chunks.len() == 1 => {}
            None => {
                self.chunks.remove(c);
                self.firsts.remove(c);
            }
            Some(first) => {
                if p == 0 {
                    self.firsts[c] = first;
                }
                if left < MERGE_BELOW {
                    self.merge_small(c);
                }
            }
        }
        (key, id)
    }

    /// Splits the overfull chunk `c` into two halves.
    #[cold]
    fn split(&mut self, c: usize) {
        let chunk = &mut self.chunks[c];
        let half = chunk.keys.len() / 2;
        let mut upper = Chunk::with_room();
        upper.keys.extend(chunk.keys.drain(half..));
        self.firsts.insert(c + 1, upper.key(0));
        self.chunks.insert(c + 1, upper);
    }

    /// Moves the small chunk `c` into a neighbour with room for it, if one has.
    #[cold]
    fn merge_small(&mut self, c: usize) {
        let len = self.chunks[c].keys.len();
        let fits = |i: usize| self.chunks[i].keys.len() + len <= CAP / 2;
        // Merge chunk `lower + 1` into chunk `lower`.
        let lower = if c > 0 && fits(c - 1) {
            c - 1
        } else if c + 1 < self.chunks.len() && fits(c + 1) {
            c
        } else {
            return;
        };
        let upper = self.chunks.remove(lower + 1);
        self.firsts.remove(lower + 1);
        let into = &mut self.chunks[lower];
        into.keys.extend_from_slice(&upper.keys);
    }

    /// Every entry, in key order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (u128, V)> + '_ {
        self.chunks
            .iter()
            .flat_map(|chunk| chunk.entries(0, chunk.keys.len()))
    }

    /// The entries at or above `key`, in key order.
    pub fn range_from(&self, key: u128) -> impl DoubleEndedIterator<Item = (u128, V)> + '_ {
        let (c, p) = self.split_point(key);
        self.chunks
            .get(c..)
            .unwrap_or_default()
            .iter()
            .enumerate()
            .flat_map(move |(i, chunk)| chunk.entries(if i == 0 { p } else { 0 }, chunk.keys.len()))
    }

    /// The entries below `key`, in key order.
    pub fn range_below(&self, key: u128) -> impl DoubleEndedIterator<Item = (u128, V)> + '_ {
        let (c, p) = self.split_point(key);
        let last = c.min(self.chunks.len());
        self.chunks
            .get(..=c)
            .unwrap_or(&self.chunks)
            .iter()
            .enumerate()
            .flat_map(move |(i, chunk)| {
                chunk.entries(0, if i == last { p } else { chunk.keys.len() })
            })
    }

    /// Chunk and position where the keys at or above `key` start; `(0, 0)` when empty.
    fn split_point(&self, key: u128) -> (usize, usize) {
        if self.chunks.is_empty() {
            return (0, 0);
        }
        let c = self.chunk_of(key);
        (c, self.chunks[c].position(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::xorshift::next;
    use std::collections::BTreeMap;

    /// Checks the structure's invariants and that it holds exactly `model`'s entries.
    fn check(index: &FreeIndex<u32>, model: &BTreeMap<u128, u32>) {
        assert_eq!(index.len(), model.len());
        assert_eq!(index.firsts.len(), index.chunks.len());
        for (first, chunk) in index.firsts.iter().zip(&index.chunks) {
            assert!(chunk.keys.len() <= CAP);
            assert!(chunk.keys.windows(2).all(|pair| pair[0].0 < pair[1].0));
            if index.len > 0 {
                assert_eq!(Some(*first), chunk.keys.first().map(|&(key, _)| key));
            }
        }
        let all: Vec<_> = index.iter().collect();
        let expected: Vec<_> = model.iter().map(|(&k, &v)| (k, v)).collect();
        assert_eq!(all, expected);
        let reversed: Vec<_> = index.iter().rev().collect();
        assert_eq!(reversed, expected.into_iter().rev().collect::<Vec<_>>());
    }

    #[test]
    fn matches_an_ordered_map_under_random_operations() {
        for (seed, spread) in [(1u64, 50u64), (7, 400), (99, 5000)] {
            let mut state = seed;
            let mut index = FreeIndex::<u32>::new();
            let mut model = BTreeMap::new();
            for step in 0..20_000u32 {
                let key = u128::from(next(&mut state) % spread) << 64 | u128::from(step % 7);
                match next(&mut state) % 6 {
                    // A malloc's split and a free's merge: a removal, then an insert of a
                    // nearby key.
                    5 => {
                        let taken = model.range(key..).next().map(|(&k, &v)| (k, v));
                        assert_eq!(index.take_first_from(key), taken);
                        if let Some((k, v)) = taken {
                            model.remove(&k);
                            let near = if step % 2 == 0 {
                                k.saturating_sub(u128::from(next(&mut state) % 3) << 64)
                            } else {
                                k + (u128::from(next(&mut state) % 3) << 64)
                            };
                            assert_eq!(index.insert(near, v), model.insert(near, v));
                        }
                    }
                    0 | 1 => assert_eq!(index.insert(key, step), model.insert(key, step)),
                    2 => assert_eq!(index.remove(key), model.remove(&key)),
                    3 => {
                        let expected = model.range(key..).next().map(|(&k, &v)| (k, v));
                        assert_eq!(index.first_from(key), expected);
                        assert_eq!(index.get(key), model.get(&key).copied());
                    }
                    _ => {
                        let expected = model.range(key..).next().map(|(&k, &v)| (k, v));
                        assert_eq!(index.take_first_from(key), expected);
                        if let Some((k, _)) = expected {
                            model.remove(&k);
                        }
                    }
                }
                if step % 997 == 0 {
                    check(&index, &model);
                    let from: Vec<_> = index.range_from(key).collect();
                    let want: Vec<_> = model.range(key..).map(|(&k, &v)| (k, v)).collect();
                    assert_eq!(from, want);
                    let below: Vec<_> = index.range_below(key).rev().collect();
                    let want: Vec<_> = model.range(..key).rev().map(|(&k, &v)| (k, v)).collect();
                    assert_eq!(below, want);
                }
            }
            check(&index, &model);
            // Drain it through best-fit takes: only one chunk, empty, stays.
            while let Some((key, _)) = index.take_first_from(0) {
                assert!(model.remove(&key).is_some());
            }
            check(&index, &model);
            assert!(index.chunks.len() <= 1);
            // And it fills again from its kept chunk.
            assert_eq!(index.insert(5, 1), None);
            assert_eq!(index.insert(3, 2), None);
            assert_eq!(index.first_from(4), Some((5, 1)));
            assert_eq!(index.take_first_from(0), Some((3, 2)));
            assert_eq!(index.remove(5), Some(1));
            assert_eq!(index.first_from(0), None);
        }
    }

    #[test]
    fn empty_map_answers_nothing() {
        let mut index = FreeIndex::<u32>::new();
        assert_eq!(index.first_from(0), None);
        assert_eq!(index.take_first_from(0), None);
        assert_eq!(index.remove(5), None);
        assert_eq!(index.get(5), None);
        assert_eq!(index.range_from(0).count(), 0);
        assert_eq!(index.range_below(u128::MAX).count(), 0);
    }
}
