//! Consistency checks of the allocator's state, recomputed from the blocks themselves. Used by
//! property tests and debugging; cheap enough to call after every operation in tests.

use super::block::{BlockId, Pool, PoolOwner, StreamId, DEFAULT_OWNER, NIL, NO_SEGMENT};
use super::expandable::PageRange;
use super::{CachingAllocator, Stat};

/// What a recount from the block lists gives for the `current` counters of one pool.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Recount {
    allocation: i64,
    allocated_bytes: i64,
    active: i64,
    active_bytes: i64,
    requested_bytes: i64,
    segment: i64,
    reserved_bytes: i64,
    inactive_split: i64,
    inactive_split_bytes: i64,
}

/// A range blocks must tile: a `cudaMalloc` segment or an expandable segment's whole reserved
/// range.
#[derive(Debug, Clone, Copy)]
struct Region {
    base: u64,
    size: u64,
    pool: Pool,
    owner: PoolOwner,
    stream: StreamId,
    /// The expandable segment's id and page size, `None` for a `cudaMalloc` segment.
    expandable: Option<(u32, u64)>,
}

fn slot(pool: Pool) -> usize {
    match pool {
        Pool::Small => 0,
        Pool::Large => 1,
    }
}

impl CachingAllocator {
    /// Checks that no two blocks or segments overlap; that the blocks of each segment (and of
    /// each expandable segment's whole reserved range) tile it exactly with consistent
    /// `prev`/`next` links, stream and pool; that unmapped ranges are whole pages matching the
    /// segment's page map, never adjacent to one another; that no two free blocks of the
    /// same kind are adjacent; that the free and unmapped sets hold exactly the free mapped and
    /// the unmapped blocks; and that every `current` counter equals a recount (reserved bytes
    /// = `cudaMalloc` segment bytes + mapped bytes). Returns the first violation.
    pub fn check_invariants(&self) -> Result<(), String> {
        let regions = self.regions()?;
        let mut blocks: Vec<(BlockId, &super::Block)> = self.blocks.iter().collect();
        blocks.sort_unstable_by_key(|(_, block)| block.ptr);
        let mut recount = [Recount::default(); 2];
        let mut index = 0;
        let mut unmapped_blocks = 0;
        for region in &regions {
            let end = region.base + region.size;
            let count = &mut recount[slot(region.pool)];
            let mut pieces = Vec::new();
            while index < blocks.len() && blocks[index].1.ptr < end {
                pieces.push(blocks[index].0);
                index += 1;
            }
            self.check_tiling(region, &pieces)?;
            let split = pieces.len() > 1;
            let mut mapped_runs: Vec<PageRange> = Vec::new();
            for &id in &pieces {
                let block = self.blocks.at(id);
                if block.allocated {
                    count.allocation += 1;
                    count.allocated_bytes += block.size as i64;
                }
                if block.is_active() {
                    count.active += 1;
                    count.active_bytes += block.size as i64;
                    count.requested_bytes += block.requested_size as i64;
                } else if block.mapped && split && region.expandable.is_none() {
                    count.inactive_split += 1;
                    count.inactive_split_bytes += block.size as i64;
                }
                if !block.mapped {
                    unmapped_blocks += 1;
                }
                if let Some((_, page)) = region.expandable {
                    if block.mapped {
                        count.reserved_bytes += block.size as i64;
                        let first = (block.ptr - region.base) / page;
                        let last = (block.ptr + block.size - region.base).div_ceil(page);
                        match mapped_runs.last_mut() {
                            Some(run) if run.end >= first => run.end = run.end.max(last),
                            _ => mapped_runs.push(PageRange {
                                begin: first,
                                end: last,
                            }),
                        }
                    }
                }
            }
            match region.expandable {
                None => {
                    count.segment += 1;
                    count.reserved_bytes += region.size as i64;
                }
                Some((segment_id, _)) => {
                    let segment = self
                        .expandable
                        .get(segment_id)
                        .ok_or("an expandable region lost its segment")?;
                    if segment.mapped_runs() != mapped_runs {
                        return Err(format!(
                            "expandable segment {:#x}: mapped pages {:?}, mapped blocks cover {:?}",
                            region.base,
                            segment.mapped_runs(),
                            mapped_runs
                        ));
                    }
                    let mapped_bytes: u64 =
                        mapped_runs.iter().map(|r| r.len() * segment.page).sum();
                    if mapped_bytes != segment.mapped_bytes() {
                        return Err(format!(
                            "expandable segment {:#x}: mapped_bytes {} but {} mapped",
                            region.base,
                            segment.mapped_bytes(),
                            mapped_bytes
                        ));
                    }
                }
            }
        }
        if index != blocks.len() {
            return Err(format!(
                "{} blocks lie outside every segment",
                blocks.len() - index
            ));
        }
        let free_blocks = blocks
            .iter()
            .filter(|(_, block)| block.is_free() && block.mapped)
            .count();
        let mut cached = self.small.len() + self.large.len();
        let mut unmapped = self.small.unmapped_len() + self.large.unmapped_len();
        for (_, pool) in self.pools.iter() {
            cached += pool.small.len() + pool.large.len();
            unmapped += pool.small.unmapped_len() + pool.large.unmapped_len();
        }
        if free_blocks != cached {
            return Err("the free sets hold blocks that do not exist".into());
        }
        if unmapped_blocks != unmapped {
            return Err("the unmapped sets hold blocks that do not exist".into());
        }
        self.check_pools(&regions)?;
        self.check_counters(&recount)?;
        self.check_oversize(&blocks)?;
        self.check_pending(&blocks)?;
        let held: i64 = recount.iter().map(|count| count.reserved_bytes).sum();
        if held != self.total_allocated_memory as i64 {
            return Err(format!(
                "total_allocated_memory {} differs from segment + mapped bytes {held}",
                self.total_allocated_memory
            ));
        }
        Ok(())
    }

    /// Every `cudaMalloc` segment and expandable segment, by base, checked not to overlap.
    fn regions(&self) -> Result<Vec<Region>, String> {
        let mut regions: Vec<Region> = self
            .segments
            .iter()
            .map(|(&base, segment)| Region {
                base,
                size: segment.size,
                pool: segment.pool,
                owner: segment.owner,
                stream: segment.stream,
                expandable: None,
            })
            .collect();
        for (id, segment) in self.expandable.iter() {
            if segment.pages == 0 || segment.size() / segment.pages != segment.page {
                return Err(format!(
                    "expandable segment {:#x}: inconsistent page count",
                    segment.base
                ));
            }
            regions.push(Region {
                base: segment.base.addr(),
                size: segment.size(),
                pool: segment.pool,
                owner: segment.owner,
                stream: segment.stream,
                expandable: Some((id, segment.page)),
            });
        }
        regions.sort_unstable_by_key(|region| region.base);
        for pair in regions.windows(2) {
            if pair[0].base + pair[0].size > pair[1].base {
                return Err(format!(
                    "segments at {:#x} and {:#x} overlap",
                    pair[0].base, pair[1].base
                ));
            }
        }
        Ok(regions)
    }

    /// The blocks of one region: exact tiling, links, pool, stream, segment, cached state.
    fn check_tiling(&self, region: &Region, pieces: &[BlockId]) -> Result<(), String> {
        let base = region.base;
        let mut cursor = base;
        let mut previous = NIL;
        for &id in pieces {
            let block = self.blocks.at(id);
            let at = block.ptr;
            if at != cursor {
                return Err(format!(
                    "segment {base:#x}: block at {at:#x}, expected {cursor:#x} (gap or overlap)"
                ));
            }
            if block.prev != previous {
                return Err(format!("block {at:#x}: prev link is wrong"));
            }
            if previous != NIL && self.blocks.at(previous).next != id {
                return Err(format!(
                    "block {at:#x}: the previous block's next link is wrong"
                ));
            }
            if block.pool != region.pool
                || block.owner != region.owner
                || block.stream != region.stream
            {
                return Err(format!(
                    "block {at:#x}: pool, owner or stream differs from its segment"
                ));
            }
            let segment = region.expandable.map_or(NO_SEGMENT, |(id, _)| id);
            if block.segment != segment {
                return Err(format!("block {at:#x}: wrong segment"));
            }
            // A cudaMalloc segment's blocks carry its range (expandable ones carry none).
            let carried = match region.expandable {
                Some(_) => (0, 0),
                None => (region.base, region.size),
            };
            if (block.segment_base.addr(), block.segment_size) != carried {
                return Err(format!("block {at:#x}: carries the wrong segment range"));
            }
            if block.size == 0 {
                return Err(format!("block {at:#x}: empty"));
            }
            if previous != NIL {
                let before = self.blocks.at(previous);
                if before.is_free() && block.is_free() && before.mapped == block.mapped {
                    return Err(format!(
                        "blocks {:#x} and {at:#x}: adjacent free blocks were not merged",
                        before.ptr
                    ));
                }
            }
            self.check_cached(block, id)?;
            if !block.mapped {
                let Some((_, page)) = region.expandable else {
                    return Err(format!("block {at:#x}: unmapped in a cudaMalloc segment"));
                };
                if !block.is_free()
                    || !(at - base).is_multiple_of(page)
                    || !block.size.is_multiple_of(page)
                {
                    return Err(format!("unmapped block {at:#x}: not whole free pages"));
                }
            }
            cursor += block.size;
            previous = id;
        }
        if cursor != base + region.size {
            return Err(format!(
                "segment {base:#x}: blocks end at {cursor:#x}, segment at {:#x}",
                base + region.size
            ));
        }
        if previous != NIL && self.blocks.at(previous).next != NIL {
            return Err(format!("segment {base:#x}: last block has a next link"));
        }
        Ok(())
    }

    /// A block is in the free set iff free (not allocated, no pending free) and mapped, in the
    /// unmapped set iff unmapped.
    fn check_cached(&self, block: &super::Block, id: BlockId) -> Result<(), String> {
        if block.owner != DEFAULT_OWNER && self.pools.get(block.owner).is_none() {
            return Err(format!(
                "block {:#x} names pool {}, which does not exist",
                block.ptr, block.owner
            ));
        }
        let pool = self.pool_ref(block.owner, block.pool);
        let free = pool.contains(block.stream, block.size, block.ptr, id);
        let unmapped = pool.contains_unmapped(block.stream, block.ptr, id);
        let expected = (block.is_free() && block.mapped, !block.mapped);
        if (free, unmapped) != expected {
            return Err(format!(
                "block {:#x} (allocated {}, mapped {}): in free set {free}, in unmapped set {unmapped}",
                block.ptr, block.allocated, block.mapped
            ));
        }
        Ok(())
    }

    fn check_counters(&self, recount: &[Recount; 2]) -> Result<(), String> {
        let stats = &self.stats;
        for pool in [Pool::Small, Pool::Large] {
            let count = recount[slot(pool)];
            let actual = Recount {
                allocation: stats.allocation.pool(pool).current,
                allocated_bytes: stats.allocated_bytes.pool(pool).current,
                active: count.active,
                active_bytes: count.active_bytes,
                requested_bytes: stats.requested_bytes.pool(pool).current,
                segment: stats.segment.pool(pool).current,
                reserved_bytes: stats.reserved_bytes.pool(pool).current,
                inactive_split: stats.inactive_split.pool(pool).current,
                inactive_split_bytes: stats.inactive_split_bytes.pool(pool).current,
            };
            if actual != count {
                return Err(format!(
                    "{} pool counters {actual:?} differ from the recount {count:?}",
                    pool.name()
                ));
            }
            if stats.active.pool(pool).current != count.active
                || stats.active_bytes.pool(pool).current != count.active_bytes
            {
                return Err(format!(
                    "{} pool active counters ({}, {} bytes) differ from the allocated and pending-free blocks ({}, {} bytes)",
                    pool.name(),
                    stats.active.pool(pool).current,
                    stats.active_bytes.pool(pool).current,
                    count.active,
                    count.active_bytes
                ));
            }
        }
        for (name, array) in [
            ("allocation", &stats.allocation),
            ("segment", &stats.segment),
            ("active", &stats.active),
            ("inactive_split", &stats.inactive_split),
            ("allocated_bytes", &stats.allocated_bytes),
            ("reserved_bytes", &stats.reserved_bytes),
            ("active_bytes", &stats.active_bytes),
            ("inactive_split_bytes", &stats.inactive_split_bytes),
            ("requested_bytes", &stats.requested_bytes),
        ] {
            for field in [
                |s: &Stat| s.current,
                |s: &Stat| s.allocated,
                |s: &Stat| s.freed,
            ] {
                if field(&array.all) != field(&array.small) + field(&array.large) {
                    return Err(format!("{name}: 'all' is not the sum of the pools"));
                }
            }
            if array.all.current != array.all.allocated - array.all.freed {
                return Err(format!("{name}: current differs from allocated - freed"));
            }
        }
        Ok(())
    }

    fn check_oversize(&self, blocks: &[(BlockId, &super::Block)]) -> Result<(), String> {
        let limit = self.config.max_split_size;
        let oversize_allocations = blocks
            .iter()
            .filter(|(_, b)| b.allocated && b.size >= limit)
            .count() as i64;
        let oversize_segments = self
            .segments()
            .filter(|&(_, size, _)| size >= limit)
            .count() as i64;
        if self.stats.oversize_allocations.current != oversize_allocations
            || self.stats.oversize_segments.current != oversize_segments
        {
            return Err("oversize counters differ from the recount".into());
        }
        Ok(())
    }

    /// Pending frees: a block waits for exactly the queued events naming it, is never
    /// allocated while it waits, and only pending blocks have events; the streams recorded
    /// for an allocation are its own blocks', without its own stream or repeats; every queued
    /// event sits in its stream's queue.
    fn check_pending(&self, blocks: &[(BlockId, &super::Block)]) -> Result<(), String> {
        let mut queued: std::collections::BTreeMap<BlockId, u32> = Default::default();
        for (&stream, queue) in &self.cuda_events {
            if queue.is_empty() {
                return Err(format!("stream {stream}: an empty event queue is kept"));
            }
            for (event, id) in queue {
                if event.stream != stream {
                    return Err(format!(
                        "an event of stream {} sits in stream {stream}'s queue",
                        event.stream
                    ));
                }
                *queued.entry(*id).or_default() += 1;
            }
        }
        for &(id, block) in blocks {
            let events = queued.remove(&id).unwrap_or(0);
            if block.event_count != events {
                return Err(format!(
                    "block {:#x}: event_count {} but {events} queued events",
                    block.ptr, block.event_count
                ));
            }
            let deferred = self.deferred_blocks.contains(&id);
            if deferred && (block.event_count > 0 || !self.stream_uses.contains_key(&id)) {
                return Err(format!(
                    "block {:#x}: deferred until the capture ends, but with {} events or no streams",
                    block.ptr, block.event_count
                ));
            }
            if block.pending_free != (block.event_count > 0 || deferred)
                || (block.allocated && block.pending_free)
            {
                return Err(format!(
                    "block {:#x}: pending_free {} with {} events (allocated {})",
                    block.ptr, block.pending_free, block.event_count, block.allocated
                ));
            }
        }
        if let Some((id, _)) = queued.into_iter().next() {
            return Err(format!(
                "events queued for block {id}, which does not exist"
            ));
        }
        for (&id, uses) in &self.stream_uses {
            let Some(block) = self
                .blocks
                .get(id)
                .filter(|block| block.allocated || self.deferred_blocks.contains(&id))
            else {
                return Err(format!(
                    "stream uses kept for block {id}, which is neither allocated nor deferred"
                ));
            };
            let mut sorted = uses.clone();
            sorted.sort_unstable();
            sorted.dedup();
            if uses.is_empty() || sorted.len() != uses.len() || uses.contains(&block.stream) {
                return Err(format!(
                    "block {:#x}: stream uses {uses:?} (own stream {})",
                    block.ptr, block.stream
                ));
            }
        }
        for id in self.capture_stream_uses.keys() {
            if !self.stream_uses.contains_key(id) {
                return Err(format!(
                    "streams recorded during a capture kept for block {id}, which has no stream uses"
                ));
            }
        }
        Ok(())
    }

    /// Private pools: every block names the default pools or a live pool; a pool's
    /// `cudaMalloc_count` equals its live `cudaMalloc` segments (with expandable segments on,
    /// PyTorch counts maps and unmaps, which need not balance); freeable pools are exactly the
    /// unused ones; active, `use_on_oom` and `no_split` pools are live, each active once.
    fn check_pools(&self, regions: &[Region]) -> Result<(), String> {
        for block in self.blocks() {
            if block.owner != DEFAULT_OWNER && self.pools.get(block.owner).is_none() {
                return Err(format!(
                    "block {:#x} names pool {}, which does not exist",
                    block.ptr, block.owner
                ));
            }
        }
        for (owner, pool) in self.pools.iter() {
            if self.pools.owner(pool.id) != Some(owner) {
                return Err(format!("pool {} is not found by its id", pool.id));
            }
            let segments = regions
                .iter()
                .filter(|region| region.owner == owner && region.expandable.is_none())
                .count() as u32;
            if !self.config.expandable_segments && pool.cuda_malloc_count != segments {
                return Err(format!(
                    "pool {}: cudaMalloc_count {} but {segments} segments",
                    pool.id, pool.cuda_malloc_count
                ));
            }
            if (pool.use_count == 0) != self.pools.freeable.contains(&pool.id) {
                return Err(format!(
                    "pool {}: use count {} but freeable {}",
                    pool.id,
                    pool.use_count,
                    self.pools.freeable.contains(&pool.id)
                ));
            }
        }
        let mut active: Vec<_> = self
            .pools
            .captures_underway
            .iter()
            .map(|(id, _)| *id)
            .collect();
        active.sort_unstable();
        let count = active.len();
        active.dedup();
        if active.len() != count {
            return Err("a pool is active twice".into());
        }
        for id in active
            .iter()
            .chain(&self.pools.freeable)
            .chain(&self.pools.use_on_oom)
            .chain(&self.pools.no_split)
        {
            if self.pools.owner(*id).is_none() {
                return Err(format!("pool {id} is named but does not exist"));
            }
        }
        Ok(())
    }
}
