//! Private pools: CUDA graphs' memory pools and `torch.cuda.MemPool`s (PyTorch's
//! `PrivatePool`, `beginAllocateToPool`, `endAllocateToPool`, `releasePool`,
//! `createOrIncrefPool`, `get_pool`, `try_mempool_fallback`; Note [Interaction with CUDA graph
//! capture]).
//!
//! A private pool has its own small and large block sets, so its segments serve only the
//! allocations routed to it: while a pool is *active* for a stream
//! ([`CachingAllocator::begin_allocate_to_pool`]), every malloc on that stream is served from
//! it. Counters stay per device: pooled memory counts in `allocated_bytes`, `reserved_bytes`
//! and the others exactly like the default pools' (by its small or large kind).
//!
//! A pool lives while something uses it (`use_count`: the `MemPool` object, each capture or
//! `use_mem_pool` block in progress). Once its use count drops to zero it becomes *freeable*:
//! `release_cached_blocks` (`empty_cache()`, a malloc's last resort) then also releases its
//! whole free segments, and forgets the pool when no segment of it is left
//! (`cudaMalloc_count` 0). `empty_cache()` leaves the segments of pools still in use alone.
//!
//! While any pool is active ("a capture is underway"), PyTorch changes three more things,
//! and so does gpumem: a malloc does not look for completed events (`process_events`), a
//! freed block used on other streams waits for the end of the capture before its events are
//! even recorded, and a malloc that finds no memory gives up without flushing the cache
//! (no `release_cached_blocks`, no retry).

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::block::{BlockPool, Pool, StreamId};
pub use super::block::{PoolOwner, DEFAULT_OWNER};
use super::{AllocError, Allocation, CachingAllocator};

/// A memory pool's id, PyTorch's `MempoolId_t`: `(0, 0)` for the default pools; a graph pool
/// made by `graph_pool_handle()` is `(n, 0)`, a `torch.cuda.MemPool()` is `(0, n)`. Snapshots
/// record it as `segment_pool_id`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct MemPoolId {
    /// The first half (a graph pool's number).
    pub first: u64,
    /// The second half (a user-created `MemPool`'s number).
    pub second: u64,
}

impl MemPoolId {
    /// The default pools' id, `(0, 0)`.
    pub const DEFAULT: MemPoolId = MemPoolId {
        first: 0,
        second: 0,
    };

    /// The id `(first, second)`.
    pub fn new(first: u64, second: u64) -> MemPoolId {
        MemPoolId { first, second }
    }

    /// Whether this is the default pools' id.
    pub fn is_default(self) -> bool {
        self == MemPoolId::DEFAULT
    }

    /// The pair as a snapshot holds it.
    pub fn pair(self) -> (u64, u64) {
        (self.first, self.second)
    }
}

impl std::fmt::Display for MemPoolId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "({}, {})", self.first, self.second)
    }
}

/// Which streams a pool serves while it is active (the filter PyTorch's
/// `beginAllocateToPool` takes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolFilter {
    /// Every stream (`torch.cuda.use_mem_pool`, whose filter is the calling thread: scripts
    /// and replays run on one thread).
    AllStreams,
    /// One stream (a CUDA graph capture on it).
    Stream(StreamId),
}

impl PoolFilter {
    fn serves(self, stream: StreamId) -> bool {
        match self {
            PoolFilter::AllStreams => true,
            PoolFilter::Stream(only) => only == stream,
        }
    }
}

/// One private pool (PyTorch's `PrivatePool`).
#[derive(Debug)]
pub(super) struct PrivatePool {
    pub(super) id: MemPoolId,
    /// Live users: the pool object, captures and `use_mem_pool` blocks in progress.
    pub(super) use_count: u32,
    /// PyTorch's `cudaMalloc_count`: +1 per segment (or expandable allocation that mapped
    /// pages) made for the pool, −1 per segment freed (or pages unmapped).
    pub(super) cuda_malloc_count: u32,
    pub(super) small: BlockPool,
    pub(super) large: BlockPool,
}

impl PrivatePool {
    pub(super) fn blocks(&self, kind: Pool) -> &BlockPool {
        match kind {
            Pool::Small => &self.small,
            Pool::Large => &self.large,
        }
    }

    pub(super) fn blocks_mut(&mut self, kind: Pool) -> &mut BlockPool {
        match kind {
            Pool::Small => &mut self.small,
            Pool::Large => &mut self.large,
        }
    }
}

/// The allocator's private pools (PyTorch's `graph_pools`, `graph_pools_freeable`,
/// `captures_underway`, `use_on_oom_pools`, `no_split_pools`), and the counters that name new
/// ones.
#[derive(Debug, Default)]
pub(super) struct PrivatePools {
    /// Pool `owner` sits in `slots[owner - 1]`; a forgotten pool leaves its slot empty.
    slots: Vec<Option<PrivatePool>>,
    by_id: BTreeMap<MemPoolId, PoolOwner>,
    /// Pools whose use count reached zero (PyTorch keeps them in a hash map; gpumem in id
    /// order).
    pub(super) freeable: BTreeSet<MemPoolId>,
    /// The pools allocations go to, in the order they became active; the last one serving a
    /// stream wins.
    pub(super) captures_underway: Vec<(MemPoolId, PoolFilter)>,
    /// Pools a default-pool malloc may take a cached block from before freeing memory.
    pub(super) use_on_oom: BTreeSet<MemPoolId>,
    /// Pools whose blocks are never split.
    pub(super) no_split: BTreeSet<MemPoolId>,
    next_graph: u64,
    next_user: u64,
}

impl PrivatePools {
    pub(super) fn owner(&self, id: MemPoolId) -> Option<PoolOwner> {
        self.by_id.get(&id).copied()
    }

    pub(super) fn get(&self, owner: PoolOwner) -> Option<&PrivatePool> {
        self.slots
            .get((owner as usize).checked_sub(1)?)
            .and_then(Option::as_ref)
    }

    pub(super) fn get_mut(&mut self, owner: PoolOwner) -> Option<&mut PrivatePool> {
        self.slots
            .get_mut((owner as usize).checked_sub(1)?)
            .and_then(Option::as_mut)
    }

    /// The pool `owner`, which a live block names: missing is a bug in the allocator.
    pub(super) fn at(&self, owner: PoolOwner) -> &PrivatePool {
        match self.get(owner) {
            Some(pool) => pool,
            None => unreachable!("pool {owner} is named by a block but does not exist"),
        }
    }

    /// Mutable access to a pool a live block names.
    pub(super) fn at_mut(&mut self, owner: PoolOwner) -> &mut PrivatePool {
        match self.get_mut(owner) {
            Some(pool) => pool,
            None => unreachable!("pool {owner} is named by a block but does not exist"),
        }
    }

    /// Every live pool with its owner index, by index.
    pub(super) fn iter(&self) -> impl Iterator<Item = (PoolOwner, &PrivatePool)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(index, slot)| slot.as_ref().map(|pool| (index as PoolOwner + 1, pool)))
    }

    /// Creates the pool `id` with one use, reusing the first empty slot.
    fn create(&mut self, id: MemPoolId) -> PoolOwner {
        let pool = PrivatePool {
            id,
            use_count: 1,
            cuda_malloc_count: 0,
            small: BlockPool::default(),
            large: BlockPool::default(),
        };
        let owner = match self.slots.iter().position(Option::is_none) {
            Some(index) => {
                self.slots[index] = Some(pool);
                index as PoolOwner + 1
            }
            None => {
                self.slots.push(Some(pool));
                self.slots.len() as PoolOwner
            }
        };
        self.by_id.insert(id, owner);
        owner
    }

    /// Forgets the pool `id` (it holds no block).
    pub(super) fn forget(&mut self, id: MemPoolId) {
        if let Some(owner) = self.by_id.remove(&id) {
            if let Some(slot) = self.slots.get_mut(owner as usize - 1) {
                *slot = None;
            }
        }
        self.freeable.remove(&id);
        self.use_on_oom.remove(&id);
        self.no_split.remove(&id);
    }

    /// The pool a malloc on `stream` is routed to: the last active pool serving the stream,
    /// else the default pools (PyTorch's `get_pool`).
    #[inline]
    pub(super) fn route(&self, stream: StreamId) -> PoolOwner {
        if self.captures_underway.is_empty() {
            return DEFAULT_OWNER;
        }
        self.captures_underway
            .iter()
            .rev()
            .find(|(_, filter)| filter.serves(stream))
            .and_then(|(id, _)| self.owner(*id))
            .unwrap_or(DEFAULT_OWNER)
    }
}

/// What [`CachingAllocator::private_pools`] reports of one pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PrivatePoolInfo {
    /// The pool's id.
    pub id: MemPoolId,
    /// Live users (PyTorch's `use_count`).
    pub use_count: u32,
    /// PyTorch's `cudaMalloc_count`.
    pub cuda_malloc_count: u32,
    /// Whether its use count reached zero, so `empty_cache()` may release its segments.
    pub freeable: bool,
    /// Whether allocations go to it now.
    pub active: bool,
    /// Bytes of its segments (mapped bytes of its expandable segments).
    pub reserved_bytes: u64,
    /// Bytes of its blocks handed out.
    pub allocated_bytes: u64,
    /// Bytes of its cached free blocks (what PyTorch's OOM message calls "allocated in private
    /// pools").
    pub cached_bytes: u64,
}

impl CachingAllocator {
    /// A new id for a pool made like `torch.cuda.MemPool()`: `(0, n)`, n counting from 1 in
    /// this allocator (PyTorch counts per process). The pool is not created until used.
    pub fn new_mem_pool_id(&mut self) -> MemPoolId {
        self.pools.next_user += 1;
        MemPoolId::new(0, self.pools.next_user)
    }

    /// A new id for a graph's pool, like `torch.cuda.graph_pool_handle()`: `(n, 0)`.
    pub fn new_graph_pool_id(&mut self) -> MemPoolId {
        self.pools.next_graph += 1;
        MemPoolId::new(self.pools.next_graph, 0)
    }

    /// Creates the pool `id` with one use, or adds a use to it (PyTorch's
    /// `createOrIncrefPool`, what `torch.cuda.MemPool()` calls). The default id is refused,
    /// and so is a pool no longer in use (PyTorch asserts it is live).
    pub fn create_pool(&mut self, id: MemPoolId) -> Result<(), AllocError> {
        if id.is_default() {
            return Err(AllocError::Pool(
                "(0, 0) names the default pools, not a private pool".into(),
            ));
        }
        match self.pools.owner(id) {
            None => {
                self.pools.create(id);
            }
            Some(owner) => {
                let pool = self.pools.at_mut(owner);
                if pool.use_count == 0 {
                    return Err(AllocError::Pool(format!(
                        "pool {id} is no longer in use (released) and cannot be used again"
                    )));
                }
                pool.use_count += 1;
            }
        }
        Ok(())
    }

    /// Routes every later malloc on the streams `filter` names to the pool `id`, creating it
    /// or adding a use (PyTorch's `beginAllocateToPool`: a graph capture's start, or entering
    /// `use_mem_pool`). A pool already active is refused.
    pub fn begin_allocate_to_pool(
        &mut self,
        id: MemPoolId,
        filter: PoolFilter,
    ) -> Result<(), AllocError> {
        if self
            .pools
            .captures_underway
            .iter()
            .any(|(active, _)| *active == id)
        {
            return Err(AllocError::Pool(format!(
                "beginAllocateToPool: already recording to mempool_id {id}"
            )));
        }
        self.create_pool(id)?;
        self.pools.captures_underway.push((id, filter));
        Ok(())
    }

    /// Stops routing mallocs to the pool `id` (PyTorch's `endAllocateToPool`: a capture's end,
    /// or leaving `use_mem_pool`); its use stays until [`CachingAllocator::release_pool`].
    pub fn end_allocate_to_pool(&mut self, id: MemPoolId) -> Result<(), AllocError> {
        let position = self
            .pools
            .captures_underway
            .iter()
            .position(|(active, _)| *active == id)
            .ok_or_else(|| {
                AllocError::Pool(format!(
                    "endAllocatePool: not currently recording to mempool_id {id}"
                ))
            })?;
        self.pools.captures_underway.remove(position);
        Ok(())
    }

    /// Drops one use of the pool `id` (PyTorch's `releasePool`: a graph reset, the end of
    /// `use_mem_pool`, a `MemPool` destroyed). At zero uses the pool becomes freeable: the
    /// next `empty_cache()` releases its whole free segments.
    pub fn release_pool(&mut self, id: MemPoolId) -> Result<(), AllocError> {
        let owner = self.pool_owner(id)?;
        let pool = self.pools.at_mut(owner);
        if pool.use_count == 0 {
            return Err(AllocError::Pool(format!("pool {id} was already released")));
        }
        pool.use_count -= 1;
        if pool.use_count == 0 {
            self.pools.freeable.insert(id);
        }
        Ok(())
    }

    /// Lets a default-pool malloc that found no cached block take one from the pool `id`
    /// before freeing memory (PyTorch's `setUseOnOOM`, `MemPool(use_on_oom=True)`).
    pub fn set_use_on_oom(&mut self, id: MemPoolId, use_on_oom: bool) -> Result<(), AllocError> {
        self.pool_owner(id)?;
        if use_on_oom {
            self.pools.use_on_oom.insert(id);
        } else {
            self.pools.use_on_oom.remove(&id);
        }
        Ok(())
    }

    /// Never splits the blocks of the pool `id` (PyTorch's `setNoSplit`,
    /// `MemPool(no_split=True)`).
    pub fn set_no_split(&mut self, id: MemPoolId) -> Result<(), AllocError> {
        self.pool_owner(id)?;
        self.pools.no_split.insert(id);
        Ok(())
    }

    /// PyTorch's `getPoolUseCount`.
    pub fn pool_use_count(&self, id: MemPoolId) -> Option<u32> {
        let owner = self.pools.owner(id)?;
        Some(self.pools.at(owner).use_count)
    }

    /// The pools allocations go to now, oldest first.
    pub fn active_pools(&self) -> Vec<(MemPoolId, PoolFilter)> {
        self.pools.captures_underway.clone()
    }

    /// Every private pool with its figures, by id.
    pub fn private_pools(&self) -> Vec<PrivatePoolInfo> {
        let mut list: Vec<PrivatePoolInfo> = self
            .pools
            .iter()
            .map(|(owner, pool)| {
                let mut info = PrivatePoolInfo {
                    id: pool.id,
                    use_count: pool.use_count,
                    cuda_malloc_count: pool.cuda_malloc_count,
                    freeable: self.pools.freeable.contains(&pool.id),
                    active: self
                        .pools
                        .captures_underway
                        .iter()
                        .any(|(id, _)| *id == pool.id),
                    reserved_bytes: 0,
                    allocated_bytes: 0,
                    cached_bytes: 0,
                };
                for (_, block) in self.blocks.iter().filter(|(_, b)| b.owner == owner) {
                    if block.mapped {
                        info.reserved_bytes += block.size;
                    }
                    if block.allocated {
                        info.allocated_bytes += block.size;
                    } else if block.is_free() && block.mapped {
                        info.cached_bytes += block.size;
                    }
                }
                info
            })
            .collect();
        list.sort_unstable_by_key(|info| info.id);
        list
    }

    /// Allocates, in private pool `id`, the free block that starts at address `ptr`, taking
    /// exactly `size` bytes of it: what cudagraph trees' checkpoint restore does to each block
    /// of a checkpointed segment (PyTorch's `setCheckpointPoolState`, through
    /// `setSegmentStateToCheckpoint`: `alloc_found_block` with the block's own size as the
    /// request, split off the front whenever the free block is larger, counted in the pool
    /// the block is in, small or large, whatever its size). No rounding, no search, no device
    /// memory, no events processed. An error, with nothing changed, when the pool is unknown,
    /// or no free block of it starts at `ptr`, or that block is smaller than `size`.
    pub fn allocate_block_at(
        &mut self,
        id: MemPoolId,
        ptr: u64,
        size: u64,
    ) -> Result<Allocation, AllocError> {
        let owner = self.pool_owner(id)?;
        // PyTorch looks the block up among the pool's free blocks too (`ptrs_to_blocks`).
        let found = [Pool::Small, Pool::Large].into_iter().find_map(|kind| {
            self.pool_ref(owner, kind)
                .iter()
                .find(|&(_, _, start, _)| start == ptr)
                .map(|key| (kind, key))
        });
        let Some((kind, (stream, block_size, _, block))) = found else {
            return Err(AllocError::Pool(format!(
                "no free block of pool {id} starts at {ptr:#x}"
            )));
        };
        if size == 0 || block_size < size {
            return Err(AllocError::Pool(format!(
                "the free block at {ptr:#x} holds {block_size} bytes, not {size}"
            )));
        }
        self.uncache(block);
        let request = super::Request {
            stream,
            size,
            pool: kind,
            owner,
            alloc_size: size,
            expandable: self.blocks.at(block).is_expandable(),
        };
        self.hand_out(block, request, size, block_size > size)
    }

    /// `malloc_on(stream, orig_size)` served by the free, whole `cudaMalloc` segment at `ptr`,
    /// as if `alloc_block` had just made that segment for this request: PyTorch records a
    /// malloc's `segment_alloc` just before its `alloc`, and a history ring that keeps its last
    /// entries may cut between the two. The replay of such a window starts with the segment
    /// made and cached, where this request may not find it: a cached block of at least
    /// `max_split_size_mb` serves no smaller request; and a better-fitting block the replay
    /// holds cached may have been pending when PyTorch's `get_free_block` looked (a free
    /// deferred by `record_stream`, which the OOM path's `synchronize_and_free_events`
    /// completed before its retry made the segment). `None`, with nothing changed, unless the
    /// segment is cached whole, in the pool and on the stream the request is routed to, with
    /// the size `alloc_block` would make for it, and the pool's best fit (PyTorch's
    /// `get_free_block`) finds no block for the request or another block than the segment
    /// (the trace's address says the malloc did not take that one); else the block is handed
    /// out as the malloc would (the usual split; the best-fit search counted for garbage
    /// collection).
    pub fn malloc_from_made_segment(
        &mut self,
        stream: StreamId,
        orig_size: u64,
        ptr: u64,
    ) -> Result<Option<Allocation>, AllocError> {
        if orig_size == 0 || orig_size >= super::ONE_EXABYTE || self.expandable_active() {
            return Ok(None);
        }
        if !self.capture_underway() {
            self.process_events()?;
        }
        let size = self.round_size(orig_size);
        let pool = Self::pool_for(size);
        let request = super::Request {
            stream,
            size,
            pool,
            owner: self.pools.route(stream),
            alloc_size: self.allocation_size(size),
            expandable: false,
        };
        let made = self
            .pool_ref(request.owner, pool)
            .iter()
            .find(|&(on, bytes, start, id)| {
                on == stream
                    && start == ptr
                    && bytes == request.alloc_size
                    && !self.blocks.at(id).is_split()
                    && !self.blocks.at(id).is_expandable()
            });
        let Some((_, _, _, id)) = made else {
            return Ok(None);
        };
        if self
            .find_free_block(request)
            .is_some_and(|(_, _, _, found)| found == id)
        {
            return Ok(None);
        }
        if self.garbage_collection_enabled() {
            self.pool_mut(request.owner, pool)
                .get_free_blocks_call_count += 1;
        }
        self.uncache(id);
        self.alloc_found_block(id, request, orig_size).map(Some)
    }

    /// How many free blocks private pool `id` caches (0 for an unknown pool): what
    /// [`CachingAllocator::allocate_block_at`] looks through.
    pub fn cached_blocks_in_pool(&self, id: MemPoolId) -> usize {
        self.pools.owner(id).map_or(0, |owner| {
            self.pool_ref(owner, Pool::Small).len() + self.pool_ref(owner, Pool::Large).len()
        })
    }

    /// The id of the pool `owner` (the default id for the default pools).
    pub fn pool_id(&self, owner: PoolOwner) -> MemPoolId {
        if owner == DEFAULT_OWNER {
            return MemPoolId::DEFAULT;
        }
        self.pools
            .get(owner)
            .map_or(MemPoolId::DEFAULT, |pool| pool.id)
    }

    /// The owner index of the live pool `id`.
    pub(super) fn pool_owner(&self, id: MemPoolId) -> Result<PoolOwner, AllocError> {
        self.pools
            .owner(id)
            .ok_or_else(|| AllocError::Pool(format!("Could not find pool of id {id}")))
    }

    /// Bytes of cached free blocks in every private pool: what PyTorch's OOM message reports
    /// as "allocated in private pools" (it sums the pools' free block sets).
    pub(super) fn cached_in_private_pools(&self) -> u64 {
        self.pools
            .iter()
            .map(|(_, pool)| {
                pool.small.iter().map(|key| key.1).sum::<u64>()
                    + pool.large.iter().map(|key| key.1).sum::<u64>()
            })
            .sum()
    }

    /// PyTorch's `try_mempool_fallback`: a malloc routed to the default pools that found no
    /// cached block and could not get new memory looks, before freeing anything, for a cached
    /// block in each pool marked `use_on_oom` (in id order), on the request's stream. Returns
    /// the pool and block found; the request is then served from that pool.
    pub(super) fn try_mempool_fallback(
        &mut self,
        request: super::Request,
    ) -> Result<Option<(PoolOwner, super::block::BlockId)>, AllocError> {
        if request.owner != DEFAULT_OWNER || self.pools.use_on_oom.is_empty() {
            return Ok(None);
        }
        let candidates: Vec<MemPoolId> = self.pools.use_on_oom.iter().copied().collect();
        for id in candidates {
            // PyTorch makes the pool active for the lookup (one more use) and releases it
            // after: the use count ends where it was.
            self.begin_allocate_to_pool(id, PoolFilter::AllStreams)?;
            let owner = self.pools.route(request.stream);
            let lookup = super::Request {
                owner,
                expandable: false,
                ..request
            };
            let found = self.get_free_block(lookup);
            self.end_allocate_to_pool(id)?;
            self.release_pool(id)?;
            if let Some(block) = found {
                return Ok(Some((owner, block)));
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::{AllocConf, EventKind, EventLog, MIB};
    use crate::device::sim::SimDevice;
    use std::cell::RefCell;
    use std::rc::Rc;

    fn allocator(conf: &str) -> CachingAllocator {
        let conf = AllocConf::parse(conf).expect("valid config");
        CachingAllocator::new(Box::new(SimDevice::h200()), conf).expect("allocator")
    }

    fn get(allocator: &CachingAllocator, key: &str) -> i64 {
        allocator.stats().get(key).expect(key)
    }

    /// Under `max_split_size_mb:40` a request of 38 MiB and a byte makes a 40 MiB segment
    /// (large segments come in 2 MiB steps): cached, the
    /// segment serves no such request (it is oversize), but as the segment made for it, it
    /// serves it as the malloc did, split the usual way; any other address or size is refused.
    #[test]
    fn a_made_segment_serves_the_request_that_made_it() {
        let mut allocator = allocator("max_split_size_mb:40");
        let request = 38 * MIB + 1;
        let made = allocator.malloc_on(0, request).expect("malloc");
        assert_eq!(made.size, 38 * MIB + 512);
        let base = made.ptr.addr();
        allocator.free(made).expect("free");
        assert_eq!(
            allocator
                .malloc_from_made_segment(0, request, base + 512)
                .ok()
                .flatten(),
            None
        );
        assert_eq!(
            allocator
                .malloc_from_made_segment(0, 41 * MIB, base)
                .ok()
                .flatten(),
            None
        );
        let served = allocator
            .malloc_from_made_segment(0, request, base)
            .expect("no error")
            .expect("served by the segment made for it");
        assert_eq!((served.ptr.addr(), served.size), (base, 38 * MIB + 512));
        assert_eq!(get(&allocator, "segment.all.current"), 1);
        assert_eq!(get(&allocator, "inactive_split.all.current"), 1);
        assert_eq!(
            get(&allocator, "requested_bytes.all.current"),
            request as i64
        );
    }

    /// `torch.cuda.MemPool()`: a new pool id with its pool made.
    fn new_mem_pool(allocator: &mut CachingAllocator) -> MemPoolId {
        let id = allocator.new_mem_pool_id();
        allocator.create_pool(id).expect("MemPool()");
        id
    }

    /// `with use_mem_pool(id): body(allocator)` on every stream (or a capture into `id`).
    fn in_pool<T>(
        allocator: &mut CachingAllocator,
        id: MemPoolId,
        body: impl FnOnce(&mut CachingAllocator) -> T,
    ) -> T {
        allocator
            .begin_allocate_to_pool(id, PoolFilter::AllStreams)
            .expect("use the pool");
        let result = body(allocator);
        allocator.end_allocate_to_pool(id).expect("end");
        result
    }

    fn pool_of(allocator: &CachingAllocator, ptr: u64) -> Option<MemPoolId> {
        allocator
            .segment_snapshots()
            .into_iter()
            .find(|segment| segment.address <= ptr && ptr < segment.address + segment.total_size)
            .map(|segment| segment.segment_pool_id)
    }

    /// `torch.cuda.MemPool()` then `with use_mem_pool(pool)`: allocations inside go to the
    /// pool's own segments, counted in the device's stats; `empty_cache()` leaves a pool in
    /// use alone and releases it once it is freeable, then forgets it.
    #[test]
    fn a_mem_pool_has_its_own_segments_until_released() {
        let mut a = allocator("");
        let log = Rc::new(RefCell::new(EventLog::default()));
        a.subscribe(Box::new(Rc::clone(&log)));
        let id = new_mem_pool(&mut a);
        assert_eq!(id, MemPoolId::new(0, 1));
        a.begin_allocate_to_pool(id, PoolFilter::AllStreams)
            .expect("use_mem_pool");
        assert_eq!(a.pool_use_count(id), Some(2));
        let x = a.malloc(5 * MIB).expect("in the pool");
        let y = a.malloc_on(3, 1000).expect("every stream");
        a.end_allocate_to_pool(id).expect("leave");
        a.release_pool(id).expect("leave");
        assert_eq!(a.pool_use_count(id), Some(1));
        assert_eq!(pool_of(&a, x.ptr.addr()), Some(id));
        assert_eq!(pool_of(&a, y.ptr.addr()), Some(id));
        let segment_allocs: Vec<MemPoolId> = log
            .borrow()
            .events()
            .iter()
            .filter(|event| event.kind == EventKind::SegmentAlloc)
            .map(|event| event.pool_id)
            .collect();
        assert_eq!(segment_allocs, [id, id], "events carry the pool");
        // Outside the pool, a request does not see the pool's free 15 MiB.
        let z = a.malloc(5 * MIB).expect("default pool");
        assert_eq!(pool_of(&a, z.ptr.addr()), Some(MemPoolId::DEFAULT));
        assert_eq!(get(&a, "segment.large_pool.current"), 2);
        assert_eq!(get(&a, "reserved_bytes.all.current"), 42 * MIB as i64);
        a.free(x).expect("free");
        a.free(y).expect("free");
        a.free(z).expect("free");
        a.empty_cache().expect("empty");
        assert_eq!(
            get(&a, "reserved_bytes.all.current"),
            22 * MIB as i64,
            "the pool in use keeps its 20 + 2 MiB"
        );
        let info = a.private_pools();
        assert_eq!(info.len(), 1);
        assert_eq!(
            (info[0].reserved_bytes, info[0].cached_bytes),
            (22 * MIB, 22 * MIB)
        );
        assert!(!info[0].freeable);
        a.check_invariants().expect("consistent");
        a.release_pool(id).expect("~MemPool");
        assert!(a.private_pools()[0].freeable);
        a.empty_cache().expect("empty");
        assert_eq!(get(&a, "reserved_bytes.all.current"), 0);
        assert!(a.private_pools().is_empty(), "forgotten once empty");
        assert_eq!(a.pool_use_count(id), None);
        a.check_invariants().expect("consistent");
    }

    /// cudagraph trees' checkpoint restore: the pool's free blocks are taken back at their
    /// addresses, exactly their sizes — a whole 2 MiB small segment counted in the small pool,
    /// a block split whenever it is larger, even by less than a malloc would split off — and
    /// a wrong address or size is an error that changes nothing.
    #[test]
    fn a_checkpoint_restore_takes_blocks_at_their_addresses() {
        let mut a = allocator("");
        let id = a.new_graph_pool_id();
        a.create_pool(id).expect("pool");
        let (small, large) = in_pool(&mut a, id, |a| {
            (
                a.malloc(4096).expect("a small segment of the pool"),
                a.malloc(6 * MIB).expect("a 20 MiB segment of the pool"),
            )
        });
        let (small_base, large_base) = (small.ptr.addr(), large.ptr.addr());
        a.free(small).expect("free");
        a.free(large).expect("free");
        let before = a.stats().clone();
        let error = a
            .allocate_block_at(id, small_base + 512, 512)
            .expect_err("no block starts there");
        assert!(matches!(error, AllocError::Pool(_)), "{error}");
        a.allocate_block_at(id, small_base, 4 * MIB)
            .expect_err("larger than the block");
        a.allocate_block_at(MemPoolId::new(0, 99), small_base, 512)
            .expect_err("no such pool");
        assert_eq!(a.stats(), &before, "nothing changed");

        let whole = a
            .allocate_block_at(id, small_base, 2 * MIB)
            .expect("the whole small segment");
        assert_eq!((whole.ptr.addr(), whole.size), (small_base, 2 * MIB));
        assert_eq!(
            get(&a, "allocated_bytes.small_pool.current"),
            2 * MIB as i64
        );
        assert_eq!(
            get(&a, "requested_bytes.small_pool.current"),
            2 * MIB as i64
        );
        // 6 MiB of the 20 MiB segment, then the rest in two pieces, the last 512 bytes
        // split off although a malloc would not split so little from a large block.
        let front = a.allocate_block_at(id, large_base, 6 * MIB).expect("front");
        let middle = a
            .allocate_block_at(id, large_base + 6 * MIB, 14 * MIB - 512)
            .expect("middle");
        let tail = a
            .allocate_block_at(id, large_base + 20 * MIB - 512, 512)
            .expect("tail");
        assert_eq!(tail.size, 512);
        assert_eq!(get(&a, "allocation.large_pool.current"), 3);
        assert_eq!(
            get(&a, "allocated_bytes.large_pool.current"),
            20 * MIB as i64
        );
        assert_eq!(get(&a, "num_device_alloc"), 2, "no device memory");
        a.check_invariants().expect("consistent");
        for block in [whole, front, middle, tail] {
            a.free(block).expect("free");
        }
        assert_eq!(get(&a, "inactive_split.all.current"), 0, "merged back");
        a.check_invariants().expect("consistent");
    }

    /// A graph capture routes only its stream; the last active pool serving a stream wins.
    #[test]
    fn captures_route_by_stream_last_first() {
        let mut a = allocator("");
        let graph = a.new_graph_pool_id();
        assert_eq!(graph, MemPoolId::new(1, 0));
        let user = a.new_mem_pool_id();
        a.begin_allocate_to_pool(graph, PoolFilter::Stream(7))
            .expect("capture");
        let on_default = a.malloc(4096).expect("alloc");
        let on_seven = a.malloc_on(7, 4096).expect("alloc");
        a.begin_allocate_to_pool(user, PoolFilter::AllStreams)
            .expect("nested");
        let nested = a.malloc_on(7, 4096).expect("alloc");
        assert_eq!(pool_of(&a, on_default.ptr.addr()), Some(MemPoolId::DEFAULT));
        assert_eq!(pool_of(&a, on_seven.ptr.addr()), Some(graph));
        assert_eq!(pool_of(&a, nested.ptr.addr()), Some(user));
        assert_eq!(
            a.active_pools(),
            [
                (graph, PoolFilter::Stream(7)),
                (user, PoolFilter::AllStreams)
            ]
        );
        a.end_allocate_to_pool(graph).expect("end");
        a.end_allocate_to_pool(user).expect("end");
        a.check_invariants().expect("consistent");
    }

    /// While a pool is active a malloc that finds no memory raises the OOM without flushing
    /// the cache or retrying (PyTorch runs release_cached_blocks only with no capture
    /// underway); the same request outside the pool frees the cached segment and succeeds.
    #[test]
    fn no_flush_and_no_retry_while_a_pool_is_active() {
        let mut a = allocator("");
        let total = a.device().total_memory() as f64;
        a.set_memory_fraction(50.0 * MIB as f64 / total)
            .expect("fraction");
        let cached = a.malloc(30 * MIB).expect("alloc");
        a.free(cached).expect("free");
        let id = a.new_graph_pool_id();
        a.begin_allocate_to_pool(id, PoolFilter::AllStreams)
            .expect("capture");
        let error = a.malloc(30 * MIB).expect_err("30 + 30 MiB > 50 MiB");
        let message = error.to_string();
        assert!(message.starts_with("CUDA out of memory"), "{message}");
        assert_eq!(get(&a, "num_alloc_retries"), 0);
        assert_eq!(get(&a, "num_sync_all_streams"), 0);
        assert_eq!(
            get(&a, "segment.all.current"),
            1,
            "the cached segment stays"
        );
        a.end_allocate_to_pool(id).expect("end");
        let x = a.malloc(30 * MIB).expect("the cached block");
        assert_eq!(x.ptr, cached.ptr);
        a.check_invariants().expect("consistent");
    }

    /// PyTorch's OOM message counts the free blocks of private pools as allocated in them.
    #[test]
    fn the_oom_message_reports_private_pools() {
        let mut a = allocator("");
        let total = a.device().total_memory() as f64;
        a.set_memory_fraction(60.0 * MIB as f64 / total)
            .expect("fraction");
        let id = a.new_mem_pool_id();
        let x = in_pool(&mut a, id, |a| a.malloc(5 * MIB).expect("alloc"));
        a.free(x).expect("free");
        let live = a.malloc(30 * MIB).expect("alloc");
        let message = a
            .malloc(30 * MIB)
            .expect_err("20 + 30 + 30 > 60")
            .to_string();
        assert!(
            message.contains(
                "Of the allocated memory 50.00 MiB is allocated by PyTorch, with 20.00 MiB allocated in private pools (e.g., CUDA Graphs), and 0 bytes is reserved by PyTorch but unallocated."
            ),
            "{message}"
        );
        a.free(live).expect("free");
        a.check_invariants().expect("consistent");
    }

    /// `MemPool(use_on_oom=True)`: a default-pool malloc that cannot get new memory takes a
    /// cached block of the pool before freeing anything; the pool's use count ends unchanged.
    #[test]
    fn use_on_oom_pools_serve_before_the_cache_is_flushed() {
        let mut a = allocator("");
        let id = new_mem_pool(&mut a);
        a.set_use_on_oom(id, true).expect("use_on_oom");
        let x = in_pool(&mut a, id, |a| a.malloc(8 * MIB).expect("alloc"));
        a.release_pool(id).expect("end");
        a.free(x).expect("free");
        let total = a.device().total_memory() as f64;
        a.set_memory_fraction(30.0 * MIB as f64 / total)
            .expect("fraction");
        let y = a.malloc(6 * MIB).expect("from the pool");
        assert_eq!(pool_of(&a, y.ptr.addr()), Some(id));
        assert_eq!(y.ptr.addr(), x.ptr.addr());
        assert_eq!(get(&a, "num_alloc_retries"), 0);
        assert_eq!(get(&a, "num_device_alloc"), 1);
        assert_eq!(a.pool_use_count(id), Some(1));
        a.check_invariants().expect("consistent");
    }

    /// `MemPool(no_split=True)`: the pool's blocks are handed out whole.
    #[test]
    fn no_split_pools_hand_out_whole_blocks() {
        let mut a = allocator("");
        let id = new_mem_pool(&mut a);
        a.set_no_split(id).expect("no_split");
        let (x, y) = in_pool(&mut a, id, |a| {
            (
                a.malloc(5 * MIB).expect("alloc"),
                a.malloc(1000).expect("alloc"),
            )
        });
        assert_eq!((x.size, y.size), (20 * MIB, 2 * MIB));
        assert_eq!(get(&a, "inactive_split.all.current"), 0);
        a.check_invariants().expect("consistent");
    }

    /// A block freed with recorded streams during a capture waits, with no event, until the
    /// allocator looks with no pool active; a stream recorded during the capture is left out
    /// then, so a block used only on it completes at once.
    #[test]
    fn frees_during_a_capture_wait_for_its_end() {
        let mut a = allocator("");
        a.record_history(true, 1000);
        let before = a.malloc(4096).expect("alloc");
        let during = a.malloc(8192).expect("alloc");
        a.record_stream(before, 5).expect("record");
        a.device_mut().sleep(5, 1).expect("busy");
        let id = a.new_graph_pool_id();
        a.begin_allocate_to_pool(id, PoolFilter::Stream(9))
            .expect("capture");
        a.record_stream(during, 6)
            .expect("record during the capture");
        a.free(before).expect("free");
        a.free(during).expect("free");
        let pending = a.pending_frees();
        assert_eq!((pending.blocks, pending.events), (2, 0));
        a.check_invariants().expect("consistent");
        let _ = a.malloc(512).expect("no process_events during the capture");
        assert_eq!(a.pending_frees().blocks, 2);
        a.end_allocate_to_pool(id).expect("end");
        let mark = a.trace().len();
        let _ = a.malloc(512).expect("alloc");
        let completed: Vec<u64> = a.trace().entries()[mark..]
            .iter()
            .filter(|entry| entry.action == EventKind::FreeCompleted)
            .map(|entry| entry.addr)
            .collect();
        assert_eq!(completed, [during.ptr.addr()], "stream 5 still works");
        assert_eq!(a.pending_frees().events, 1);
        a.check_invariants().expect("consistent");
        a.empty_cache().expect("empty");
        assert_eq!(a.pending_frees().blocks, 0);
        a.check_invariants().expect("consistent");
    }

    /// `emptyCache(pool)` of a freeable pool waits only for that pool's events and releases
    /// only its segments; of a pool in use, it does nothing.
    #[test]
    fn emptying_one_pool() {
        let mut a = allocator("");
        let id = new_mem_pool(&mut a);
        let pooled = in_pool(&mut a, id, |a| a.malloc(5 * MIB).expect("alloc"));
        a.release_pool(id).expect("end");
        let default = a.malloc(5 * MIB).expect("alloc");
        a.record_stream(pooled, 5).expect("record");
        a.record_stream(default, 5).expect("record");
        a.device_mut().sleep(5, 1).expect("busy");
        a.free(pooled).expect("free");
        a.free(default).expect("free");
        a.empty_cache_pool(id).expect("in use: nothing");
        assert_eq!(a.pending_frees().blocks, 2);
        assert_eq!(get(&a, "num_sync_all_streams"), 0);
        a.release_pool(id).expect("~MemPool");
        a.empty_cache_pool(id).expect("freeable");
        assert_eq!(
            a.pending_frees().blocks,
            1,
            "the default pool's free still waits"
        );
        assert_eq!(get(&a, "num_sync_all_streams"), 1);
        assert_eq!(get(&a, "segment.all.current"), 1);
        assert!(a.private_pools().is_empty());
        a.check_invariants().expect("consistent");
    }

    /// Expandable segments serve private pools too, one range per (stream, pool).
    #[test]
    fn expandable_segments_per_pool() {
        let mut a = allocator("expandable_segments:True");
        let x = a.malloc(5 * MIB).expect("alloc");
        let id = a.new_mem_pool_id();
        let y = in_pool(&mut a, id, |a| a.malloc(5 * MIB).expect("alloc"));
        assert_eq!(a.expandable_segments().len(), 2);
        assert_eq!(pool_of(&a, y.ptr.addr()), Some(id));
        assert_ne!(pool_of(&a, x.ptr.addr()), pool_of(&a, y.ptr.addr()));
        assert_eq!(get(&a, "reserved_bytes.all.current"), 40 * MIB as i64);
        a.free(y).expect("free");
        a.release_pool(id).expect("freeable");
        a.empty_cache().expect("empty");
        assert_eq!(get(&a, "reserved_bytes.all.current"), 20 * MIB as i64);
        assert_eq!(a.expandable_segments().len(), 1);
        a.check_invariants().expect("consistent");
    }

    /// Calls PyTorch refuses are errors that change nothing.
    #[test]
    fn pool_misuse_is_refused() {
        let mut a = allocator("");
        let id = a.new_mem_pool_id();
        let err = |result: Result<(), AllocError>| result.expect_err("refused").to_string();
        assert!(err(a.create_pool(MemPoolId::DEFAULT)).contains("default pools"));
        assert!(err(a.release_pool(id)).contains("Could not find pool"));
        assert!(err(a.end_allocate_to_pool(id)).contains("not currently recording"));
        a.begin_allocate_to_pool(id, PoolFilter::AllStreams)
            .expect("use");
        assert!(
            err(a.begin_allocate_to_pool(id, PoolFilter::Stream(1))).contains("already recording")
        );
        a.end_allocate_to_pool(id).expect("end");
        a.release_pool(id).expect("to zero");
        assert!(err(a.release_pool(id)).contains("already released"));
        assert!(err(a.create_pool(id)).contains("no longer in use"));
        assert!(err(a.set_use_on_oom(MemPoolId::new(9, 9), true)).contains("Could not find"));
        a.check_invariants().expect("consistent");
    }
}
