//! Consistency checks of the allocator's state, recomputed from the blocks themselves. Used by
//! property tests and debugging; cheap enough to call after every operation in tests.

use super::block::{BlockId, Pool, StreamId, NIL, NO_SEGMENT};
use super::expandable::PageRange;
use super::{CachingAllocator, Stat};

/// What a recount from the block lists gives for the `current` counters of one pool.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Recount {
    allocation: i64,
    allocated_bytes: i64,
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
            .filter(|(_, block)| !block.allocated && block.mapped)
            .count();
        if free_blocks != self.small.len() + self.large.len() {
            return Err("the free sets hold blocks that do not exist".into());
        }
        if unmapped_blocks != self.small.unmapped_len() + self.large.unmapped_len() {
            return Err("the unmapped sets hold blocks that do not exist".into());
        }
        self.check_counters(&recount)?;
        self.check_oversize(&blocks)?;
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
            if block.pool != region.pool || block.stream != region.stream {
                return Err(format!(
                    "block {at:#x}: pool or stream differs from its segment"
                ));
            }
            let segment = region.expandable.map_or(NO_SEGMENT, |(id, _)| id);
            if block.segment != segment {
                return Err(format!("block {at:#x}: wrong segment"));
            }
            if block.size == 0 {
                return Err(format!("block {at:#x}: empty"));
            }
            if previous != NIL {
                let before = self.blocks.at(previous);
                if !before.allocated && !block.allocated && before.mapped == block.mapped {
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
                if block.allocated
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

    /// A block is in the free set iff free and mapped, in the unmapped set iff unmapped.
    fn check_cached(&self, block: &super::Block, id: BlockId) -> Result<(), String> {
        let pool = self.pool_ref(block.pool);
        let free = pool.contains(block.stream, block.size, block.ptr, id);
        let unmapped = pool.contains_unmapped(block.stream, block.ptr, id);
        let expected = (!block.allocated && block.mapped, !block.mapped);
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
            if stats.active.pool(pool).current != count.allocation
                || stats.active_bytes.pool(pool).current != count.allocated_bytes
            {
                return Err(format!(
                    "{} pool active counters differ from allocated",
                    pool.name()
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
}
