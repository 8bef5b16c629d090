//! [`PoolRoutes`]: the private pools' segments the file's end shows, by address, which route
//! the allocations that lie in them to their pools.

use std::collections::BTreeMap;

use crate::alloc::MemPoolId;

/// Where the allocations of private pools lie: the segments of the file's end state that a
/// private pool owns, each with the index of the recorded event that made it; and the end
/// state's default-pool segments, which no private pool's malloc made.
#[derive(Debug, Clone, Default)]
pub struct PoolRoutes {
    /// By base address: (end, pool, index of the `segment_alloc` that made the segment).
    segments: BTreeMap<u64, (u64, MemPoolId, u64)>,
    /// The default pools' segments at the file's end, the same way.
    default_segments: BTreeMap<u64, (u64, u64)>,
}

/// Two tables are equal when they route alike: the default-pool segments route nothing (a
/// replay read as it goes, which knows no end state yet, and one of the whole file route a
/// file without private pools alike).
impl PartialEq for PoolRoutes {
    fn eq(&self, other: &PoolRoutes) -> bool {
        self.segments == other.segments
    }
}

impl Eq for PoolRoutes {}

impl PoolRoutes {
    /// Routes allocations in `[base, base + size)` made at or after event `made` to `pool`
    /// (a default pool's segment routes nothing: `PoolRoutes::in_default_segment` tells it).
    pub fn add(&mut self, base: u64, size: u64, pool: MemPoolId, made: u64) {
        let end = base.saturating_add(size);
        if pool.is_default() {
            self.default_segments.insert(base, (end, made));
        } else {
            self.segments.insert(base, (end, pool, made));
        }
    }

    /// Whether an allocation at `addr` recorded at event `index` lies in a segment the file's
    /// end shows in the default pools, made at or before that event: a segment belongs to the
    /// pool whose malloc made it for its whole life, so no private pool asked for it.
    pub(super) fn in_default_segment(&self, addr: u64, index: u64) -> bool {
        self.default_segments
            .range(..=addr)
            .next_back()
            .is_some_and(|(_, &(end, made))| addr < end && index >= made)
    }

    /// Whether no segment is routed.
    pub fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }

    /// The `MemPool`s (not graphs' pools) whose segments are routed, in id order.
    pub(super) fn mem_pools(&self) -> Vec<MemPoolId> {
        let mut pools: Vec<MemPoolId> = self
            .segments
            .values()
            .map(|&(_, pool, _)| pool)
            .filter(|pool| pool.first == 0 && pool.second != 0)
            .collect();
        pools.sort_unstable_by_key(|pool| (pool.first, pool.second));
        pools.dedup();
        pools
    }

    /// Whether some routed segment belongs to `pool`.
    pub(super) fn names(&self, pool: MemPoolId) -> bool {
        self.segments.values().any(|&(_, of, _)| of == pool)
    }

    /// Whether the file's end shows a segment of `pool` made after event `index`: the pool
    /// was still in use then, so it had not gone away at `index`.
    pub(super) fn makes_memory_after(&self, pool: MemPoolId, index: u64) -> bool {
        self.segments
            .values()
            .any(|&(_, of, made)| of == pool && made > index)
    }

    /// The pool of an allocation at `addr` recorded at event `index`, if any.
    pub(super) fn pool_of(&self, addr: u64, index: u64) -> Option<MemPoolId> {
        let (_, &(end, pool, made)) = self.segments.range(..=addr).next_back()?;
        (addr < end && index >= made).then_some(pool)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pool_the_end_shows_making_memory_later_had_not_gone_away() {
        let mut routes = PoolRoutes::default();
        let pool = MemPoolId::new(0, 1);
        routes.add(0x1000, 0x1000, pool, 5);
        routes.add(0x4000, 0x1000, pool, 45);
        assert!(routes.makes_memory_after(pool, 40));
        assert!(
            !routes.makes_memory_after(pool, 45),
            "made at that event, not after"
        );
        assert!(!routes.makes_memory_after(MemPoolId::new(0, 2), 0));
    }

    #[test]
    fn routes_only_inside_a_segment_made_before() {
        let mut routes = PoolRoutes::default();
        let pool = MemPoolId::new(1, 0);
        routes.add(0x1000, 0x1000, pool, 5);
        assert_eq!(routes.pool_of(0x1800, 9), Some(pool));
        assert_eq!(
            routes.pool_of(0x1800, 4),
            None,
            "an earlier segment at that address"
        );
        assert_eq!(routes.pool_of(0x2000, 9), None, "past its end");
        assert_eq!(routes.pool_of(0x0800, 9), None);
        routes.add(0x4000, 0x1000, MemPoolId::DEFAULT, 7);
        assert_eq!(
            routes.pool_of(0x4800, 9),
            None,
            "a default segment routes nothing"
        );
        assert!(routes.in_default_segment(0x4800, 9));
        assert!(
            !routes.in_default_segment(0x4800, 6),
            "an earlier segment at that address"
        );
        assert!(!routes.in_default_segment(0x1800, 9), "a private pool's");
        assert!(!routes.is_empty() && !routes.names(MemPoolId::DEFAULT));
    }
}
