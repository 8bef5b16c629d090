//! Giving memory back to the device: `empty_cache()`, the flush before the last retry of a
//! failed malloc, `max_split_size_mb`'s partial release and the garbage collector
//! (PyTorch's `release_cached_blocks`, `release_blocks`, `release_block`,
//! `release_available_cached_blocks`, `garbage_collect_cached_blocks`).

use super::block::{Block, BlockId, FreeKey, PoolOwner, DEFAULT_OWNER, NIL};
use super::{AllocError, CachingAllocator, EventKind, MemPoolId, Pool, Request, StreamId};

impl CachingAllocator {
    /// `torch.cuda.empty_cache()` (PyTorch's `emptyCache` of the default pool id): waits for
    /// every outstanding event and completes the frees they held back, returns every
    /// completely free `cudaMalloc` segment of the default pools to the device and unmaps
    /// every whole free page of their expandable segments; then does the same for every
    /// private pool no longer in use. Pieces of segments that still hold an allocation stay
    /// cached, and so does all memory of private pools still in use. While a private pool is
    /// active only the freeable private pools are released (PyTorch skips the rest then).
    pub fn empty_cache(&mut self) -> Result<(), AllocError> {
        self.emit(
            EventKind::EmptyCache,
            0,
            0,
            0,
            0,
            Pool::Large,
            DEFAULT_OWNER,
        );
        self.release_cached_blocks(MemPoolId::DEFAULT)
    }

    /// PyTorch's `emptyCache(mempool_id)` for a private pool (what a `MemPool` does when it
    /// goes away): if the pool `id` is no longer in use, waits for its blocks' outstanding
    /// events and releases its whole free segments (and forgets it once none is left);
    /// otherwise nothing happens. The default id is [`CachingAllocator::empty_cache`].
    pub fn empty_cache_pool(&mut self, id: MemPoolId) -> Result<(), AllocError> {
        if id.is_default() {
            return self.empty_cache();
        }
        self.emit(
            EventKind::EmptyCache,
            0,
            0,
            0,
            0,
            Pool::Large,
            DEFAULT_OWNER,
        );
        self.release_cached_blocks(id)
    }

    /// A private pool's `emptyCache(pool)` (what a `torch.cuda.MemPool` does when it goes
    /// away) replayed where the replay never knew the pool: its segments were gone by the
    /// file's end, so the replay held them in the default pools, and a whole `empty_cache()`
    /// would also release default-pool segments PyTorch kept. Counts PyTorch's
    /// synchronisation (`synchronize_and_free_events` for one pool counts in
    /// `num_sync_all_streams` too; the frees it completed are in the trace, which the replay
    /// completes itself) and releases exactly the whole cached default-pool segments at
    /// `addresses`. Returns whether every one of them was such a segment; if not, nothing is
    /// changed.
    pub fn empty_cache_of_segments(&mut self, addresses: &[u64]) -> Result<bool, AllocError> {
        self.release_whole_segments_of(addresses, &[DEFAULT_OWNER])
    }

    /// One pool's `emptyCache(pool)` as a replay makes it: its event, and its synchronisation
    /// (`synchronize_and_free_events` for one pool counts in `num_sync_all_streams` too).
    fn begin_one_pools_empty_cache(&mut self) {
        self.emit(
            EventKind::EmptyCache,
            0,
            0,
            0,
            0,
            Pool::Large,
            DEFAULT_OWNER,
        );
        self.stats.num_sync_all_streams += 1;
    }

    /// Releases, as one pool's `emptyCache(pool)`, exactly the whole cached `cudaMalloc`
    /// segments at `addresses`, in that order, each of a pool in `owners`. Returns whether
    /// every address was such a segment; if not, nothing is changed.
    fn release_whole_segments_of(
        &mut self,
        addresses: &[u64],
        owners: &[PoolOwner],
    ) -> Result<bool, AllocError> {
        let mut ids = Vec::with_capacity(addresses.len());
        for &address in addresses {
            match self.whole_cached_segment(address) {
                Some(id) if owners.contains(&self.blocks.at(id).owner) && !ids.contains(&id) => {
                    ids.push(id)
                }
                _ => return Ok(false),
            }
        }
        self.begin_one_pools_empty_cache();
        for id in ids {
            self.release_block(id)?;
        }
        Ok(true)
    }

    /// The whole cached `cudaMalloc` segment whose first byte is `address`, of any pool.
    fn whole_cached_segment(&self, address: u64) -> Option<BlockId> {
        self.blocks
            .iter()
            .find(|(_, block)| {
                block.ptr == address
                    && !block.is_split()
                    && block.is_free()
                    && !block.is_expandable()
            })
            .map(|(id, _)| id)
    }

    /// The whole cached segments at `addresses` in the order one pool's `release_blocks` walk
    /// releases them (PyTorch's `release_cached_blocks` for one pool: its small pool, then
    /// its large pool, each by stream, size and address); `None` where an address is no
    /// whole cached `cudaMalloc` segment. A replay compares it with the order a run of
    /// releases shows, to tell one pool's `emptyCache(pool)` from a whole `empty_cache()`
    /// (which walks the default pools first, the large one before the small one).
    pub fn one_pool_release_order(&self, addresses: &[u64]) -> Option<Vec<u64>> {
        let mut keyed = Vec::with_capacity(addresses.len());
        for &address in addresses {
            let block = self.blocks.at(self.whole_cached_segment(address)?);
            let small_first = u8::from(block.pool != Pool::Small);
            keyed.push((small_first, block.stream, block.size, block.ptr));
        }
        keyed.sort_unstable();
        Some(keyed.into_iter().map(|(_, _, _, ptr)| ptr).collect())
    }

    /// A freeable private pool's `emptyCache(pool)` replayed where the replay held some of
    /// the pool's segments in the default pools: counts the call's synchronisation and
    /// releases exactly the whole cached segments at `addresses`, in that order, each the
    /// pool `id`'s or the default pools', then forgets the pool once nothing of it is left.
    /// Returns whether every address was such a segment; if not, nothing is changed.
    pub fn empty_cache_of_pool_segments(
        &mut self,
        id: MemPoolId,
        addresses: &[u64],
    ) -> Result<bool, AllocError> {
        let Some(owner) = self
            .pools
            .owner(id)
            .filter(|_| self.pools.freeable.contains(&id))
        else {
            return Ok(false);
        };
        if !self.release_whole_segments_of(addresses, &[DEFAULT_OWNER, owner])? {
            return Ok(false);
        }
        if self.pools.at(owner).cuda_malloc_count == 0 && !self.pool_holds_blocks(owner) {
            self.pools.forget(id);
        }
        Ok(true)
    }

    /// [`CachingAllocator::empty_cache_of_segments`] for expandable segments: a private
    /// pool's `emptyCache(pool)` replayed where the replay held the pool's expandable
    /// segments in the default pools. Counts the call's synchronisation and unmaps exactly the
    /// page ranges `ranges` (address, bytes), in that order, each the whole pages of one free
    /// mapped default-pool block (as [`CachingAllocator::empty_cache_unmap_outlook`] lists
    /// them), releasing a segment left with nothing mapped. Returns whether every range was
    /// such a block's; if not, nothing is changed.
    pub fn empty_cache_of_unmapped_ranges(
        &mut self,
        ranges: &[(u64, u64)],
    ) -> Result<bool, AllocError> {
        let Some(ids) = self.free_blocks_of_pages(ranges, DEFAULT_OWNER) else {
            return Ok(false);
        };
        self.begin_one_pools_empty_cache();
        self.unmap_blocks(ids)?;
        Ok(true)
    }

    /// Unmaps exactly the page ranges `ranges` (address, bytes), each the whole pages of one
    /// free mapped block of the private pool `id`'s expandable segments, releasing a segment
    /// left with nothing mapped; no `empty_cache()` is counted. Returns whether every range
    /// was such a block's; if not, nothing is changed. This puts a recorded layout back (a
    /// replay rebuilding a trace's start state maps the unmapped pages between a pool's
    /// mapped ranges while it carves them, then gives them back), which the pool's own
    /// `emptyCache` cannot do while the pool is in use.
    pub fn unmap_free_pages_of_pool(
        &mut self,
        id: MemPoolId,
        ranges: &[(u64, u64)],
    ) -> Result<bool, AllocError> {
        let owner = self.pool_owner(id)?;
        let Some(ids) = self.free_blocks_of_pages(ranges, owner) else {
            return Ok(false);
        };
        self.unmap_blocks(ids)?;
        Ok(true)
    }

    /// The free mapped expandable blocks of `owner` whose whole pages are exactly `ranges`,
    /// one each; `None` if a range is no such block's.
    fn free_blocks_of_pages(
        &self,
        ranges: &[(u64, u64)],
        owner: PoolOwner,
    ) -> Option<Vec<BlockId>> {
        let mut ids = Vec::with_capacity(ranges.len());
        for &(address, bytes) in ranges {
            let found = self.blocks.iter().find(|(_, block)| {
                block.is_expandable()
                    && block.owner == owner
                    && !block.allocated
                    && block.mapped
                    && self.expandable.get(block.segment).is_some_and(|segment| {
                        let pages = segment.pages_inside(block.ptr, block.size);
                        !pages.is_empty()
                            && segment.page_address(pages.begin) == address
                            && pages.len() * segment.page == bytes
                    })
            });
            match found {
                Some((id, _)) if !ids.contains(&id) => ids.push(id),
                _ => return None,
            }
        }
        Some(ids)
    }

    /// Unmaps the whole pages of each free block of `ids`, releasing a segment left with
    /// nothing mapped.
    fn unmap_blocks(&mut self, ids: Vec<BlockId>) -> Result<(), AllocError> {
        for id in ids {
            self.unmap_block(id)?;
            let block = self.blocks.at(id);
            if block.prev == NIL && block.next == NIL {
                self.release_expandable_segment(id)?;
            }
        }
        Ok(())
    }

    /// PyTorch's `release_cached_blocks(mempool_id)`. For the default id with no private pool
    /// active: wait for every outstanding event and complete the frees they held back
    /// (`synchronize_and_free_events`, `num_sync_all_streams` +1), then release the default
    /// large pool's cached memory and then the small pool's, on every stream. Then, for every
    /// freeable private pool (for a private `id`, only that one, after waiting for its own
    /// blocks' events): release its small pool and then its large pool, and forget it once
    /// no segment of it is left (PyTorch: `cudaMalloc_count` 0). PyTorch walks the freeable
    /// pools in hash order; gpumem in id order.
    pub(super) fn release_cached_blocks(&mut self, id: MemPoolId) -> Result<(), AllocError> {
        if id.is_default() && !self.capture_underway() {
            self.synchronize_and_free_events(None)?;
            self.release_blocks(DEFAULT_OWNER, Pool::Large)?;
            self.release_blocks(DEFAULT_OWNER, Pool::Small)?;
        }
        let freeable: Vec<MemPoolId> = self.pools.freeable.iter().copied().collect();
        for pool_id in freeable {
            if !id.is_default() && pool_id != id {
                continue;
            }
            let Some(owner) = self.pools.owner(pool_id) else {
                continue;
            };
            if !id.is_default() {
                if self.capture_underway() {
                    // PyTorch asserts no capture is underway before synchronising.
                    return Err(AllocError::Pool(format!(
                        "cannot empty the cache of pool {id} while a private pool is active"
                    )));
                }
                self.synchronize_and_free_events(Some(owner))?;
            }
            self.release_blocks(owner, Pool::Small)?;
            self.release_blocks(owner, Pool::Large)?;
            let pool = self.pool_id_active(pool_id);
            if self.pools.at(owner).cuda_malloc_count == 0
                && !self.pool_holds_blocks(owner)
                && !pool
            {
                self.pools.forget(pool_id);
            }
        }
        Ok(())
    }

    /// Whether the pool `id` is active (allocations go to it).
    fn pool_id_active(&self, id: MemPoolId) -> bool {
        self.pools
            .captures_underway
            .iter()
            .any(|(active, _)| *active == id)
    }

    /// Whether any block (so any segment) belongs to the pool `owner`. PyTorch forgets a
    /// freeable pool once its `cudaMalloc_count` is 0; gpumem also keeps one whose
    /// expandable segments still hold pages (their count of maps and unmaps need not
    /// balance), and one still active (released while in use: PyTorch would then fail an
    /// internal assertion at the next malloc routed to it), so no block or active pool ever
    /// names a forgotten pool.
    fn pool_holds_blocks(&self, owner: PoolOwner) -> bool {
        self.blocks().any(|block| block.owner == owner)
    }

    /// PyTorch's `release_blocks`: in pool order, frees every cached block that is a whole
    /// `cudaMalloc` segment; then unmaps the whole pages of every free expandable block, and
    /// releases an expandable segment whose range became entirely unmapped.
    fn release_blocks(&mut self, owner: PoolOwner, pool: Pool) -> Result<(), AllocError> {
        let mut whole = Vec::new();
        let mut to_unmap = Vec::new();
        for (_, _, _, id) in self.pool_ref(owner, pool).iter() {
            let block = self.blocks.at(id);
            if block.is_expandable() {
                to_unmap.push(id);
            } else if !block.is_split() {
                whole.push(id);
            }
        }
        for id in whole {
            self.release_block(id)?;
        }
        for id in to_unmap {
            self.unmap_block(id)?;
            let block = self.blocks.at(id);
            if block.prev == NIL && block.next == NIL {
                self.release_expandable_segment(id)?;
            }
        }
        Ok(())
    }

    /// Returns one cached, unsplit `cudaMalloc` segment to the device (PyTorch's
    /// `release_block`).
    pub(super) fn release_block(&mut self, id: BlockId) -> Result<(), AllocError> {
        let block = self.blocks.at(id);
        let (ptr, size, pool, stream, owner) =
            (block.ptr, block.size, block.pool, block.stream, block.owner);
        let Some(segment) = self.segments.get(&ptr) else {
            return Err(AllocError::Internal(format!(
                "the cached block at {ptr:#x} is not a whole segment"
            )));
        };
        let base = segment.base;
        self.stats.num_device_free += 1;
        self.emit(EventKind::SegmentFree, ptr, size, size, stream, pool, owner);
        self.device.free(base)?;
        self.uncount_private_malloc(owner);
        self.total_allocated_memory -= size;
        self.stats.segment.decrease(pool, 1);
        self.stats.reserved_bytes.decrease(pool, size as i64);
        if size >= self.config.max_split_size {
            self.stats.oversize_segments.decrease(1);
        }
        self.pool_mut(owner, pool).remove(stream, size, ptr, id);
        self.blocks.remove(id);
        self.segments.remove(&ptr);
        Ok(())
    }

    /// With `max_split_size_mb` set: before flushing everything, free just enough oversize
    /// cached segments of the request's stream — the smallest one that covers the request,
    /// else the largest ones in turn (PyTorch's `release_available_cached_blocks`). Expandable
    /// blocks are never released here.
    pub(super) fn release_available_cached_blocks(
        &mut self,
        request: Request,
    ) -> Result<bool, AllocError> {
        if !self.config.has_split_limit() {
            return Ok(false);
        }
        let max_split_size = self.config.max_split_size;
        let target = request.size.max(max_split_size);
        let key: FreeKey = (request.stream, target, 0, 0);
        let found = self
            .pool_ref(request.owner, request.pool)
            .starting_at(key)
            .next();
        if let Some((stream, _, _, id)) = found {
            if stream == request.stream && !self.blocks.at(id).is_expandable() {
                self.release_block(id)?;
                return Ok(true);
            }
        }
        // No single block is large enough: free oversize blocks from the largest down.
        let candidates: Vec<FreeKey> = self
            .pool_ref(request.owner, request.pool)
            .before_key(key)
            .collect();
        let mut released = 0;
        for (stream, size, _, id) in candidates {
            if released >= target || size < max_split_size || stream != request.stream {
                break;
            }
            if !self.blocks.at(id).is_expandable() {
                released += size;
                self.release_block(id)?;
            }
        }
        Ok(released >= target)
    }

    /// Marks every cached block of the default large pool as one whose age the collector
    /// reads was not seen, until it is cached again: a replay that starts mid-run cached its
    /// start state all at once, where PyTorch had cached those blocks at times the file does
    /// not keep ([`CachingAllocator::age_unseen_segments`]).
    pub fn mark_cached_ages_unseen(&mut self) {
        self.unseen_ages = self.large.iter().map(|(_, _, _, id)| id).collect();
    }

    /// After the cache changed since [`CachingAllocator::age_unseen_segments`] gave ages for
    /// the malloc on `stream` of `size` bytes that releases `bases` (a replay applied the
    /// completions the trace shows before that malloc's releases: the collector counts those
    /// blocks in its average too): where the collection planned now no longer makes exactly
    /// `bases`, the blocks given ages are unseen again and aged anew on the cache as it is.
    /// Returns whether ages were given.
    pub fn age_unseen_segments_again(
        &mut self,
        stream: StreamId,
        size: u64,
        bases: &[u64],
    ) -> bool {
        let aged = std::mem::take(&mut self.aged_unseen);
        if aged.is_empty() {
            return false;
        }
        let mut planned = self.collection_outlook(stream, size);
        planned.sort_unstable();
        let mut wanted = bases.to_vec();
        wanted.sort_unstable();
        if planned == wanted {
            return false;
        }
        let cached: std::collections::HashSet<BlockId> =
            self.large.iter().map(|(_, _, _, id)| id).collect();
        self.unseen_ages
            .extend(aged.into_iter().filter(|id| cached.contains(id)));
        self.age_unseen_segments(stream, size, bases)
    }

    /// Before a malloc on `stream` of `size` bytes whose garbage collection, as the trace
    /// shows, released the `cudaMalloc` segments at `bases`: gives the cached whole segments
    /// among them whose ages were not seen ([`CachingAllocator::mark_cached_ages_unseen`]) an
    /// age with which the collector takes exactly `bases`, trying in turn an age above every
    /// pass's average, the age of the youngest seen segment it releases, one more than the
    /// oldest block it keeps, and the least age that lifts the first pass's average above
    /// that oldest kept block; other blocks keep their ages. Where none gives exactly
    /// those releases (the run was not the collector's, or seen ages rule it out), nothing
    /// changes. Returns whether ages were given.
    pub fn age_unseen_segments(&mut self, stream: StreamId, size: u64, bases: &[u64]) -> bool {
        if self.unseen_ages.is_empty() || !self.garbage_collection_enabled() {
            return false;
        }
        let unseen: Vec<BlockId> = self
            .large
            .iter()
            .map(|(_, _, _, id)| id)
            .filter(|id| self.unseen_ages.contains(id))
            .filter(|&id| {
                let block = self.blocks.at(id);
                !block.is_split() && !block.is_expandable() && bases.contains(&block.ptr)
            })
            .collect();
        if unseen.is_empty() {
            return false;
        }
        let clock = self.large.get_free_blocks_call_count;
        let age_of = |block: &Block| clock.saturating_sub(block.gc_count_base);
        let whole: Vec<(BlockId, u64)> = self
            .large
            .iter()
            .map(|(_, _, _, id)| id)
            .filter(|&id| !self.blocks.at(id).is_split())
            .map(|id| (id, age_of(self.blocks.at(id))))
            .collect();
        let youngest_seen_released = whole
            .iter()
            .filter(|(id, _)| !unseen.contains(id) && bases.contains(&self.blocks.at(*id).ptr))
            .map(|&(_, age)| age)
            .min();
        let oldest_kept = whole
            .iter()
            .filter(|(id, _)| !bases.contains(&self.blocks.at(*id).ptr))
            .map(|&(_, age)| age)
            .max();
        // Above every pass's average: more than n times the oldest age.
        let above_all = (whole.len() as u64 + 1).saturating_mul(clock.saturating_add(1));
        let mut wanted: Vec<u64> = bases.to_vec();
        wanted.sort_unstable();
        let saved_clock = clock;
        let saved: Vec<(BlockId, u64)> = self
            .large
            .iter()
            .map(|(_, _, _, id)| (id, self.blocks.at(id).gc_count_base))
            .collect();
        // Above all first: the collector's first pass then takes the unseen ones whatever
        // else is cached by the time the malloc runs (a deferred free it completes first
        // lowers the average); where it also takes seen blocks, an age among theirs.
        // The unseen ones were cached before the window, each at its own time: old ones lift
        // the first pass's average over the blocks it keeps, so that one pass takes every
        // block it releases (a second pass, over the blocks left, would take more). Found as
        // one age for all of them, the least that makes the sum of ages exceed the number of
        // blocks times the oldest kept age.
        let seen_sum: u64 = whole
            .iter()
            .filter(|(id, _)| !unseen.contains(id))
            .map(|&(_, age)| age)
            .fold(0, u64::saturating_add);
        let (blocks, unseen_count) = (whole.len() as u64, unseen.len() as u64);
        let lifting_the_average = oldest_kept.map(|kept| {
            (blocks.saturating_mul(kept).saturating_sub(seen_sum) / unseen_count).saturating_add(1)
        });
        let candidates = [
            Some(above_all),
            youngest_seen_released,
            oldest_kept.map(|age| age.saturating_add(1)),
            lifting_the_average,
        ];
        for age in candidates.into_iter().flatten() {
            self.set_collection_ages(&unseen, age);
            let mut planned = self.collection_outlook(stream, size);
            planned.sort_unstable();
            if planned == wanted {
                for id in &unseen {
                    self.unseen_ages.remove(id);
                }
                self.aged_unseen = unseen;
                return true;
            }
            self.large.get_free_blocks_call_count = saved_clock;
            for &(id, base) in &saved {
                self.blocks.at_mut(id).gc_count_base = base;
            }
        }
        false
    }

    /// The bytes a garbage collection run now is to reclaim: how far the memory held lies
    /// above `garbage_collection_threshold` × the fraction's limit (PyTorch's `target_size`);
    /// `None` where it lies at or under it, and the collection does nothing. `begun_before`
    /// (bytes) stands in where it lies under: the collection began before a replay window's
    /// cut ([`CachingAllocator::expect_collection_begun_before`]).
    pub(super) fn collection_target(&self, begun_before: Option<u64>) -> Option<u64> {
        let allowed = self.allowed_memory_maximum?;
        let threshold = (self.config.garbage_collection_threshold * allowed as f64) as u64;
        if self.total_allocated_memory > threshold {
            return Some(self.total_allocated_memory - threshold);
        }
        begun_before.filter(|&bytes| bytes > 0)
    }

    /// Before a replay window's first malloc whose garbage collection the trace shows
    /// releasing segments although the memory the start state holds lies under the
    /// collector's threshold: the history ring cut the collection, whose first releases,
    /// counted in the memory held when it began, are not in the file. The next malloc's
    /// collection (if it runs: no cached block served it) reclaims at least `bytes`, the
    /// releases the trace shows, as a collection that began above the threshold would; the
    /// malloc after it collects by the memory held again. [`CachingAllocator::collection_outlook`]
    /// and the other outlooks read it too.
    pub fn expect_collection_begun_before(&mut self, bytes: u64) {
        self.collection_begun_before = Some(bytes);
    }

    /// Before a replay window's first malloc that the trace shows making new memory, after
    /// releases its OOM path made, where a block cached at the window's start would serve it:
    /// that block was still pending (a free deferred by `record_stream`) when PyTorch's
    /// malloc searched the cache, and the OOM path's `synchronize_and_free_events` completed
    /// it before the window, before the retry, which asks the device, not the cache. The next
    /// malloc skips its search of the cache (`get_free_block`) and goes on from there, as
    /// PyTorch's did; the malloc after it searches again.
    pub fn expect_cache_searched_before(&mut self) {
        self.cache_searched_before = true;
    }

    /// Withdraws [`CachingAllocator::expect_collection_begun_before`] before its malloc.
    pub fn forget_collection_begun_before(&mut self) {
        self.collection_begun_before = None;
    }

    /// Gives the cached blocks `ids` of the default large pool the collector's age `age`,
    /// moving the clock on (and every other cached block's base with it, keeping its age)
    /// where the clock is below that age.
    fn set_collection_ages(&mut self, ids: &[BlockId], age: u64) {
        let clock = self.large.get_free_blocks_call_count;
        if age > clock {
            let shift = age - clock;
            self.large.get_free_blocks_call_count = age;
            let cached: Vec<BlockId> = self.large.iter().map(|(_, _, _, id)| id).collect();
            for id in cached {
                let block = self.blocks.at_mut(id);
                block.gc_count_base = block.gc_count_base.saturating_add(shift);
            }
        }
        let clock = self.large.get_free_blocks_call_count;
        for &id in ids {
            self.blocks.at_mut(id).gc_count_base = clock - age;
        }
    }

    /// With a memory fraction and `garbage_collection_threshold` set: when the bytes held pass
    /// the threshold, free the oldest unsplit cached large segments (of every stream) until
    /// back under it (PyTorch's `garbage_collect_cached_blocks`). Expandable blocks count
    /// towards the average age when unsplit, as in PyTorch, but are never freed here. Only
    /// the default large pool is collected, whichever pool the request is for.
    ///
    /// `begun_before`: the bytes to reclaim where the memory held is under the threshold, for
    /// a collection a replay window's cut began ([`CachingAllocator::collection_target`]).
    pub(super) fn garbage_collect_cached_blocks(
        &mut self,
        begun_before: Option<u64>,
    ) -> Result<(), AllocError> {
        let Some(target) = self.collection_target(begun_before) else {
            return Ok(());
        };
        let clock = self.large.get_free_blocks_call_count;
        let age = |block: &Block| clock.saturating_sub(block.gc_count_base) as f64;
        let mut total_age = 0.0;
        let mut freeable = 0_u64;
        for (_, _, _, id) in self.large.iter() {
            let block = self.blocks.at(id);
            if !block.is_split() {
                total_age += age(block);
                freeable += 1;
            }
        }
        if freeable == 0 {
            return Ok(());
        }
        let mut reclaimed = 0;
        let mut freed_any = true;
        while reclaimed < target && freed_any && freeable > 0 {
            let age_threshold = total_age / freeable as f64;
            freed_any = false;
            let order: Vec<BlockId> = self.large.iter().map(|key| key.3).collect();
            for id in order {
                let block = self.blocks.at(id);
                if block.is_split() || block.is_expandable() {
                    continue;
                }
                let block_age = age(block);
                if block_age >= age_threshold {
                    freed_any = true;
                    reclaimed += block.size;
                    total_age -= block_age;
                    freeable -= 1;
                    self.release_block(id)?;
                }
            }
        }
        Ok(())
    }
}
