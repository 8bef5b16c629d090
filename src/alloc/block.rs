//! Blocks, the arena that owns them, and the free-block pools.
//!
//! A segment is one device allocation (or one expandable segment's virtual range); it is carved
//! into blocks chained by `prev`/`next` in address order. Free blocks sit in their pool's
//! ordered set, keyed like PyTorch's `BlockComparatorSize` by (stream, size, address), so the
//! first block at or after `(stream, size, 0)` is the stream's best fit, lowest address first.
//! The unmapped ranges of expandable segments sit in a second set keyed like
//! `BlockComparatorAddress` by (stream, address).

use std::collections::BTreeSet;

use super::size_classes::SizeClassMap;
use crate::device::DevicePtr;

/// Index of a block in the `BlockArena`.
pub type BlockId = u32;

/// "No block": the end of a `prev`/`next` chain.
pub const NIL: BlockId = BlockId::MAX;

/// Index of an expandable segment in the allocator's segment table.
pub type SegmentId = u32;

/// "Not in an expandable segment": the block belongs to a `cudaMalloc` segment.
pub const NO_SEGMENT: SegmentId = SegmentId::MAX;

/// Which pools a block belongs to: 0 for the default pools, from 1 a private pool
/// (`super::pools`).
pub type PoolOwner = u32;

/// The default pools' [`PoolOwner`].
pub const DEFAULT_OWNER: PoolOwner = 0;

/// A CUDA stream as the allocator knows it: an opaque id, 0 for the default stream. Pools are
/// ordered by it as PyTorch orders them by the `cudaStream_t` value.
pub type StreamId = u64;

/// Which of the two default pools a block belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Pool {
    /// Requests of at most 1 MiB, carved from 2 MiB segments.
    Small,
    /// Everything larger.
    Large,
}

impl Pool {
    /// The name PyTorch uses in stats keys and snapshots ("small"/"large").
    pub fn name(self) -> &'static str {
        match self {
            Pool::Small => "small",
            Pool::Large => "large",
        }
    }
}

/// A contiguous range of device memory inside one segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// The stream the block's segment was allocated on; it is reused only on that stream.
    pub stream: StreamId,
    /// Device address of the first byte.
    pub ptr: u64,
    /// Bytes covered (a rounded size for allocated blocks).
    pub size: u64,
    /// Bytes the user asked for when this block was last handed out.
    pub requested_size: u64,
    /// The kind of pool (small or large) the block's segment belongs to.
    pub pool: Pool,
    /// Whose pool: the default pools ([`DEFAULT_OWNER`]) or a private pool.
    pub owner: PoolOwner,
    /// Whether the block is handed out to a user.
    pub allocated: bool,
    /// Whether the user freed the block but it is not back in its pool yet: it waits for the
    /// events recorded on the streams it was used on (`record_stream`), or for a capture to end
    /// before they are recorded. Such a block is still active and never merged or reused
    /// (PyTorch: `!allocated && (event_count > 0 || !stream_uses.empty())`).
    pub pending_free: bool,
    /// Events still outstanding for a pending free (PyTorch's `Block::event_count`).
    pub event_count: u32,
    /// Whether physical memory backs the range: false only for the unmapped ranges of
    /// expandable segments (PyTorch's `Block::mapped`).
    pub mapped: bool,
    /// The expandable segment the block lies in, or [`NO_SEGMENT`].
    pub segment: SegmentId,
    /// The address of the `cudaMalloc` segment the block lies in, as the device handed it
    /// out, copied into every block carved from the segment so that handing a block out
    /// derives its address without searching the segment map (a replay's hot path).
    /// [`DevicePtr::NULL`] in an expandable segment, whose table holds its range.
    pub segment_base: DevicePtr,
    /// Bytes of that `cudaMalloc` segment (0 in an expandable segment).
    pub segment_size: u64,
    /// The block just below in the same segment, or [`NIL`].
    pub prev: BlockId,
    /// The block just above in the same segment, or [`NIL`].
    pub next: BlockId,
    /// The pool's free-block lookup count when this block was last cached; its age for the
    /// garbage collector is the count now minus this.
    pub gc_count_base: u64,
}

impl Block {
    /// Whether the block is a piece of a segment rather than the whole segment.
    #[inline]
    pub fn is_split(&self) -> bool {
        self.prev != NIL || self.next != NIL
    }

    /// Whether the block lies in an expandable segment.
    #[inline]
    pub fn is_expandable(&self) -> bool {
        self.segment != NO_SEGMENT
    }

    /// Whether the block is free in its pool: neither handed out nor waiting for a pending
    /// free to complete.
    #[inline]
    pub fn is_free(&self) -> bool {
        !self.allocated && !self.pending_free
    }

    /// Whether the block counts as active: handed out, or freed and waiting for its streams.
    #[inline]
    pub fn is_active(&self) -> bool {
        self.allocated || self.pending_free
    }
}

/// Owner of every block, addressed by [`BlockId`]; freed slots are reused.
#[derive(Debug, Default)]
pub struct BlockArena {
    slots: Vec<Option<Block>>,
    vacant: Vec<BlockId>,
}

impl BlockArena {
    /// Stores a block and returns its id.
    #[inline]
    pub fn insert(&mut self, block: Block) -> BlockId {
        match self.vacant.pop() {
            Some(id) => {
                self.slots[id as usize] = Some(block);
                id
            }
            None => {
                self.slots.push(Some(block));
                (self.slots.len() - 1) as BlockId
            }
        }
    }

    /// Deletes a block, returning it.
    #[inline]
    pub fn remove(&mut self, id: BlockId) -> Option<Block> {
        let block = self.slots.get_mut(id as usize)?.take()?;
        self.vacant.push(id);
        Some(block)
    }

    /// The block with this id, if it exists.
    #[inline]
    pub fn get(&self, id: BlockId) -> Option<&Block> {
        self.slots.get(id as usize)?.as_ref()
    }

    /// The block with this id. Callers pass ids taken from live links, so a miss is a bug in
    /// the allocator, not a user error.
    #[inline]
    pub fn at(&self, id: BlockId) -> &Block {
        match self.get(id) {
            Some(block) => block,
            None => unreachable!("block {id} is linked but missing from the arena"),
        }
    }

    /// Mutable access to a linked block (see [`BlockArena::at`]).
    #[inline]
    pub fn at_mut(&mut self, id: BlockId) -> &mut Block {
        match self.slots.get_mut(id as usize).and_then(Option::as_mut) {
            Some(block) => block,
            None => unreachable!("block {id} is linked but missing from the arena"),
        }
    }

    /// Every live block with its id, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (BlockId, &Block)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(id, slot)| slot.as_ref().map(|block| (id as BlockId, block)))
    }
}

/// A free block's place in its pool: PyTorch's `BlockComparatorSize` order (stream, size,
/// address), with the id carried along so a lookup needs no second search.
pub type FreeKey = (StreamId, u64, u64, BlockId);

/// A free block's place within its stream's set: size in the high 64 bits, address in the
/// low, so that the (size, address) order is one `u128` comparison.
///
/// The free blocks of one stream have distinct addresses, so this key alone is unique and the
/// block's id can be the map's value. Against the former `(size, address, id)` tuple keys, a
/// tree search compares two words with no branch per field, and a node's keys take 16 bytes
/// each instead of 24 (fewer cache lines per node): the free-block sets are the allocator's
/// hottest structure in a replay.
type SizeAddress = u128;

/// The [`SizeAddress`] of a block.
#[inline(always)]
fn size_address(size: u64, ptr: u64) -> SizeAddress {
    (u128::from(size) << 64) | u128::from(ptr)
}

/// The (size, address) a [`SizeAddress`] packs.
#[inline(always)]
fn unpack(key: SizeAddress) -> (u64, u64) {
    ((key >> 64) as u64, key as u64)
}

/// The free blocks of one stream in a pool, ordered by (size, address).
#[derive(Debug)]
struct StreamBlocks {
    stream: StreamId,
    blocks: SizeClassMap<BlockId>,
}

/// The cached free blocks of one pool, ordered by (stream, size, address), and the unmapped
/// ranges of its expandable segments, ordered by (stream, address).
///
/// The free blocks are kept in one (size, address) map per stream, the maps in stream order:
/// the order is PyTorch's, while a tree key is one [`SizeAddress`] and a lookup compares no
/// stream (programs use one or a few streams, so finding the stream's map is a short scan).
#[derive(Debug, Default)]
pub struct BlockPool {
    streams: Vec<StreamBlocks>,
    unmapped: BTreeSet<(StreamId, u64, BlockId)>,
    /// Best-fit lookups made in this pool while garbage collection is on (PyTorch's
    /// `get_free_blocks_call_count`), the clock that ages cached blocks.
    pub get_free_blocks_call_count: u64,
}

impl BlockPool {
    #[inline]
    fn set(&self, stream: StreamId) -> Option<&SizeClassMap<BlockId>> {
        self.streams
            .iter()
            .find(|entry| entry.stream == stream)
            .map(|entry| &entry.blocks)
    }

    #[inline]
    fn set_mut(&mut self, stream: StreamId) -> Option<&mut SizeClassMap<BlockId>> {
        self.streams
            .iter_mut()
            .find(|entry| entry.stream == stream)
            .map(|entry| &mut entry.blocks)
    }

    /// The set of `stream`, created (in stream order) when missing.
    #[inline]
    fn set_or_new(&mut self, stream: StreamId) -> &mut SizeClassMap<BlockId> {
        // Most programs use one stream: its set comes first.
        if self
            .streams
            .first()
            .is_some_and(|entry| entry.stream == stream)
        {
            return &mut self.streams[0].blocks;
        }
        self.set_or_new_slow(stream)
    }

    #[cold]
    fn set_or_new_slow(&mut self, stream: StreamId) -> &mut SizeClassMap<BlockId> {
        let index = match self.streams.iter().position(|entry| entry.stream >= stream) {
            Some(index) if self.streams[index].stream == stream => index,
            Some(index) => {
                self.streams.insert(index, StreamBlocks::new(stream));
                index
            }
            None => {
                self.streams.push(StreamBlocks::new(stream));
                self.streams.len() - 1
            }
        };
        &mut self.streams[index].blocks
    }

    /// The smallest free block of `stream` with at least `size` bytes, lowest address first.
    #[inline]
    pub fn best_fit(&self, stream: StreamId, size: u64) -> Option<FreeKey> {
        let (key, id) = self.set(stream)?.first_from(size_address(size, 0))?;
        let (size, ptr) = unpack(key);
        Some((stream, size, ptr, id))
    }

    /// Removes and returns the best fit of `stream` for `size` in one traversal.
    #[inline]
    pub fn take_best_fit(&mut self, stream: StreamId, size: u64) -> Option<BlockId> {
        self.set_mut(stream)?
            .take_first_from(size_address(size, 0))
            .map(|(_, id)| id)
    }

    /// The free blocks from `key` onwards (it included), in pool order: the rest of the key's
    /// stream, then every later stream.
    pub fn starting_at(&self, key: FreeKey) -> impl Iterator<Item = FreeKey> + '_ {
        let (stream, size, ptr, _) = key;
        let same = self
            .set(stream)
            .into_iter()
            // (size, address) is unique in a stream's set, so starting there starts at `key`.
            .flat_map(move |set| set.range_from(size_address(size, ptr)))
            .map(move |(key, id)| {
                let (size, ptr) = unpack(key);
                (stream, size, ptr, id)
            });
        let later = self
            .streams
            .iter()
            .filter(move |entry| entry.stream > stream)
            .flat_map(StreamBlocks::keys);
        same.chain(later)
    }

    /// The free blocks below `key`, largest first (for PyTorch's backwards walk in
    /// `release_available_cached_blocks`): the key's stream below it, then every earlier
    /// stream from its largest block down.
    pub fn before_key(&self, key: FreeKey) -> impl Iterator<Item = FreeKey> + '_ {
        let (stream, size, ptr, _) = key;
        let same = self
            .set(stream)
            .into_iter()
            .flat_map(move |set| set.range_below(size_address(size, ptr)).rev())
            .map(move |(key, id)| {
                let (size, ptr) = unpack(key);
                (stream, size, ptr, id)
            });
        let earlier = self
            .streams
            .iter()
            .rev()
            .filter(move |entry| entry.stream < stream)
            .flat_map(|entry| entry.keys().rev());
        same.chain(earlier)
    }

    /// Caches a free block.
    #[inline]
    pub fn insert(&mut self, stream: StreamId, size: u64, ptr: u64, id: BlockId) {
        self.set_or_new(stream).insert(size_address(size, ptr), id);
    }

    /// Removes a cached block; `false` if it was not cached.
    #[inline]
    pub fn remove(&mut self, stream: StreamId, size: u64, ptr: u64, id: BlockId) -> bool {
        let Some(set) = self.set_mut(stream) else {
            return false;
        };
        let key = size_address(size, ptr);
        match set.remove(key) {
            Some(cached) if cached == id => true,
            // Another block at this place (a caller's bug): it stays.
            Some(cached) => {
                set.insert(key, cached);
                false
            }
            None => false,
        }
    }

    /// Whether this block is cached here.
    pub fn contains(&self, stream: StreamId, size: u64, ptr: u64, id: BlockId) -> bool {
        self.set(stream)
            .is_some_and(|set| set.get(size_address(size, ptr)) == Some(id))
    }

    /// Number of cached blocks.
    pub fn len(&self) -> usize {
        self.streams.iter().map(|entry| entry.blocks.len()).sum()
    }

    /// Every cached block, in (stream, size, address) order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = FreeKey> + '_ {
        self.streams.iter().flat_map(StreamBlocks::keys)
    }

    /// Records an unmapped range of an expandable segment.
    pub fn insert_unmapped(&mut self, stream: StreamId, ptr: u64, id: BlockId) {
        self.unmapped.insert((stream, ptr, id));
    }

    /// Forgets an unmapped range; `false` if it was not recorded.
    pub fn remove_unmapped(&mut self, stream: StreamId, ptr: u64, id: BlockId) -> bool {
        self.unmapped.remove(&(stream, ptr, id))
    }

    /// Whether this unmapped range is recorded here.
    pub fn contains_unmapped(&self, stream: StreamId, ptr: u64, id: BlockId) -> bool {
        self.unmapped.contains(&(stream, ptr, id))
    }

    /// The unmapped ranges of `stream`, lowest address first (PyTorch's `unmapped` set from
    /// `lower_bound(stream, 0)` while the stream matches).
    pub fn unmapped_of(&self, stream: StreamId) -> impl Iterator<Item = BlockId> + '_ {
        self.unmapped
            .range((stream, 0, 0)..=(stream, u64::MAX, NIL))
            .map(|&(_, _, id)| id)
    }

    /// Number of unmapped ranges recorded.
    pub fn unmapped_len(&self) -> usize {
        self.unmapped.len()
    }
}

impl StreamBlocks {
    fn new(stream: StreamId) -> StreamBlocks {
        StreamBlocks {
            stream,
            blocks: SizeClassMap::new(),
        }
    }

    fn keys(&self) -> impl DoubleEndedIterator<Item = FreeKey> + '_ {
        let stream = self.stream;
        self.blocks.iter().map(move |(key, id)| {
            let (size, ptr) = unpack(key);
            (stream, size, ptr, id)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(iter: impl Iterator<Item = FreeKey>) -> Vec<(u64, u64)> {
        iter.map(|(stream, size, _, _)| (stream, size)).collect()
    }

    #[test]
    fn pools_order_by_stream_size_address() {
        let mut pool = BlockPool::default();
        pool.insert(7, 300, 0x30, 1);
        pool.insert(0, 200, 0x20, 2);
        pool.insert(0, 200, 0x10, 3);
        pool.insert(3, 100, 0x40, 4);
        pool.insert(7, 100, 0x50, 5);
        assert_eq!(
            keys(pool.iter()),
            [(0, 200), (0, 200), (3, 100), (7, 100), (7, 300)]
        );
        assert_eq!(
            pool.iter().next().map(|k| k.2),
            Some(0x10),
            "ties by address"
        );
        // Best fit searches only the request's stream.
        assert_eq!(pool.best_fit(0, 150).map(|k| k.3), Some(3));
        assert_eq!(pool.best_fit(3, 150), None);
        assert_eq!(pool.best_fit(5, 1), None);
        assert_eq!(pool.best_fit(7, 150).map(|k| k.3), Some(1));
        // PyTorch's lower_bound walks on into later streams, and back into earlier ones.
        assert_eq!(keys(pool.starting_at((3, 150, 0, 0))), [(7, 100), (7, 300)]);
        assert_eq!(
            keys(pool.before_key((3, 150, 0, 0))),
            [(3, 100), (0, 200), (0, 200)]
        );
        assert_eq!(pool.take_best_fit(0, 1), Some(3));
        assert_eq!(pool.take_best_fit(3, 101), None);
        assert!(pool.remove(7, 100, 0x50, 5));
        assert!(!pool.remove(7, 100, 0x50, 5));
        assert!(!pool.contains(7, 100, 0x50, 5));
        assert_eq!(pool.len(), 3);
        assert_eq!(keys(pool.iter().rev()), [(7, 300), (3, 100), (0, 200)]);
    }

    #[test]
    fn unmapped_ranges_order_by_stream_and_address() {
        let mut pool = BlockPool::default();
        pool.insert_unmapped(1, 0x200, 1);
        pool.insert_unmapped(0, 0x300, 2);
        pool.insert_unmapped(1, 0x100, 3);
        assert_eq!(pool.unmapped_of(1).collect::<Vec<_>>(), [3, 1]);
        assert_eq!(pool.unmapped_of(0).collect::<Vec<_>>(), [2]);
        assert!(pool.remove_unmapped(1, 0x100, 3));
        assert!(pool.contains_unmapped(1, 0x200, 1));
        assert_eq!(pool.unmapped_len(), 2);
    }
}
