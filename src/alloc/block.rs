//! Blocks, the arena that owns them, and the free-block pools.
//!
//! A segment is one device allocation; it is carved into blocks chained by `prev`/`next` in
//! address order. Free blocks sit in their pool's ordered set, keyed like PyTorch's
//! `BlockComparatorSize` by (size, address) — one stream, so the stream part of the key is
//! constant — so the first block at or after `(size, 0)` is the best fit, lowest address first.

use std::collections::BTreeSet;

/// Index of a block in the [`BlockArena`].
pub type BlockId = u32;

/// "No block": the end of a `prev`/`next` chain.
pub const NIL: BlockId = BlockId::MAX;

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
    /// Device address of the first byte.
    pub ptr: u64,
    /// Bytes covered (a rounded size for allocated blocks).
    pub size: u64,
    /// Bytes the user asked for when this block was last handed out.
    pub requested_size: u64,
    /// The pool the block's segment belongs to.
    pub pool: Pool,
    /// Whether the block is handed out to a user.
    pub allocated: bool,
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

/// The cached free blocks of one pool, ordered by (size, address).
///
/// Stored as a set of `(size, address, id)` triples: one stream means the stream part of
/// PyTorch's key is constant, and keeping the id in the key (rather than as a map value) keeps
/// each tree node to one array, which makes inserts and removals cheaper.
#[derive(Debug, Default)]
pub struct BlockPool {
    blocks: BTreeSet<(u64, u64, BlockId)>,
    /// Best-fit lookups made in this pool while garbage collection is on (PyTorch's
    /// `get_free_blocks_call_count`), the clock that ages cached blocks.
    pub get_free_blocks_call_count: u64,
}

impl BlockPool {
    /// The smallest free block of at least `size` bytes, lowest address first, as
    /// `(size, address, id)`.
    #[inline]
    pub fn best_fit(&self, size: u64) -> Option<(u64, u64, BlockId)> {
        self.blocks.range((size, 0, 0)..).next().copied()
    }

    /// Removes and returns the best fit for `size` in one traversal.
    #[inline]
    pub fn take_best_fit(&mut self, size: u64) -> Option<BlockId> {
        self.blocks
            .extract_if((size, 0, 0).., |_| true)
            .next()
            .map(|(_, _, id)| id)
    }

    /// Caches a free block.
    #[inline]
    pub fn insert(&mut self, size: u64, ptr: u64, id: BlockId) {
        self.blocks.insert((size, ptr, id));
    }

    /// Removes a cached block; `false` if it was not cached.
    #[inline]
    pub fn remove(&mut self, size: u64, ptr: u64, id: BlockId) -> bool {
        self.blocks.remove(&(size, ptr, id))
    }

    /// Whether this block is cached here.
    pub fn contains(&self, size: u64, ptr: u64, id: BlockId) -> bool {
        self.blocks.contains(&(size, ptr, id))
    }

    /// Number of cached blocks.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether no block is cached.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Every cached block as `(size, id)`, in (size, address) order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (u64, BlockId)> + '_ {
        self.blocks.iter().map(|&(size, _, id)| (size, id))
    }
}
