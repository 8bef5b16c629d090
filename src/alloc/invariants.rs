//! Consistency checks of the allocator's state, recomputed from the blocks themselves. Used by
//! property tests and debugging; cheap enough to call after every operation in tests.

use super::{CachingAllocator, Pool, NIL};

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

impl CachingAllocator {
    /// Checks that no two blocks overlap, that the blocks of each segment tile it exactly with
    /// consistent `prev`/`next` links, that the free pools hold exactly the free blocks, and that
    /// every `current` counter equals a recount from the blocks. Returns the first violation.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut blocks: Vec<_> = self.blocks.iter().collect();
        blocks.sort_unstable_by_key(|(_, block)| block.ptr);
        let mut recount = [Recount::default(); 2];
        let slot = |pool: Pool| match pool {
            Pool::Small => 0,
            Pool::Large => 1,
        };
        let mut index = 0;
        for (base, size, pool) in self.segments() {
            let count = &mut recount[slot(pool)];
            count.segment += 1;
            count.reserved_bytes += size as i64;
            let mut cursor = base;
            let mut previous = NIL;
            let mut pieces = Vec::new();
            while index < blocks.len() && blocks[index].1.ptr < base + size {
                let (id, block) = blocks[index];
                if block.ptr != cursor {
                    return Err(format!(
                        "segment {base:#x}: block at {:#x}, expected {cursor:#x} (gap or overlap)",
                        block.ptr
                    ));
                }
                if block.prev != previous {
                    return Err(format!("block {:#x}: prev link is wrong", block.ptr));
                }
                if block.pool != pool {
                    return Err(format!(
                        "block {:#x}: pool differs from its segment",
                        block.ptr
                    ));
                }
                cursor += block.size;
                previous = id;
                pieces.push(id);
                index += 1;
            }
            if cursor != base + size {
                return Err(format!(
                    "segment {base:#x}: blocks end at {cursor:#x}, segment at {:#x}",
                    base + size
                ));
            }
            for pair in pieces.windows(2) {
                if self.blocks.at(pair[0]).next != pair[1] {
                    return Err(format!(
                        "block {:#x}: next link is wrong",
                        self.blocks.at(pair[0]).ptr
                    ));
                }
            }
            if let Some(&last) = pieces.last() {
                if self.blocks.at(last).next != NIL {
                    return Err(format!("segment {base:#x}: last block has a next link"));
                }
            }
            let split = pieces.len() > 1;
            for &id in &pieces {
                let block = self.blocks.at(id);
                let pool_set = match pool {
                    Pool::Small => &self.small,
                    Pool::Large => &self.large,
                };
                let cached = pool_set.contains(block.size, block.ptr, id);
                if block.allocated {
                    if cached {
                        return Err(format!(
                            "allocated block {:#x} is in the free pool",
                            block.ptr
                        ));
                    }
                    count.allocation += 1;
                    count.allocated_bytes += block.size as i64;
                    count.requested_bytes += block.requested_size as i64;
                } else {
                    if !cached {
                        return Err(format!(
                            "free block {:#x} is missing from its pool",
                            block.ptr
                        ));
                    }
                    if split {
                        count.inactive_split += 1;
                        count.inactive_split_bytes += block.size as i64;
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
        let free_blocks = blocks.iter().filter(|(_, block)| !block.allocated).count();
        if free_blocks != self.small.len() + self.large.len() {
            return Err("the free pools hold blocks that do not exist".into());
        }
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
                |s: &super::Stat| s.current,
                |s: &super::Stat| s.allocated,
                |s: &super::Stat| s.freed,
            ] {
                if field(&array.all) != field(&array.small) + field(&array.large) {
                    return Err(format!("{name}: 'all' is not the sum of the pools"));
                }
            }
            if array.all.current != array.all.allocated - array.all.freed {
                return Err(format!("{name}: current differs from allocated - freed"));
            }
        }
        let oversize_allocations = blocks
            .iter()
            .filter(|(_, b)| b.allocated && b.size >= self.config.max_split_size)
            .count() as i64;
        let oversize_segments = self
            .segments()
            .filter(|&(_, size, _)| size >= self.config.max_split_size)
            .count() as i64;
        if stats.oversize_allocations.current != oversize_allocations
            || stats.oversize_segments.current != oversize_segments
        {
            return Err("oversize counters differ from the recount".into());
        }
        let reserved: u64 = self.segments().map(|(_, size, _)| size).sum();
        if reserved != self.total_allocated_memory {
            return Err("total_allocated_memory differs from the segments' sizes".into());
        }
        Ok(())
    }
}
