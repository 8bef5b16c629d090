//! A run of releases read as an `empty_cache()`: a whole call, a `MemPool`'s own
//! `emptyCache(pool)` (an inferred pool's, or one the replay never knew), and what a whole call
//! would release now, which tells them apart.

use std::collections::HashSet;

use super::runs::Run;
use super::Engine;
use crate::alloc::outlook::ReleasedSegment;
use crate::alloc::{AllocError, MemPoolId, SMALL_BUFFER};

// Named in doc links only.
#[cfg(doc)]
use super::super::captures::CapturePools;
#[cfg(doc)]
use crate::alloc::CachingAllocator;

impl Engine {
    /// Replays a run of releases read as an `empty_cache()` that begins with the segments of
    /// an inferred `MemPool` ([`CapturePools::route_new_mem_pool`]) as that pool's
    /// `emptyCache(pool)` (a `torch.cuda.MemPool` going away), then, when the run releases
    /// more, a whole `empty_cache()`: a whole one walks the default pools first and the
    /// freeable private pools after, so a pool's segments released first were its own call's.
    /// Returns whether it replayed the run so.
    pub(super) fn empty_cache_of_inferred_mem_pool(&mut self, run: &Run) -> Result<bool, String> {
        let Some(first) = run.released.first() else {
            return Ok(false);
        };
        let pool = first.pool;
        if !self.capture_pools.is_mem_pool(pool) {
            return Ok(false);
        }
        let own = run
            .released
            .iter()
            .take_while(|segment| segment.pool == pool)
            .count();
        self.claim_released_after(run, own, pool);
        let fail = |error: AllocError| format!("the allocator failed: {error}");
        self.allocator.empty_cache_pool(pool).map_err(fail)?;
        self.counts.empty_cache_calls += 1;
        if own < run.released.len() {
            self.allocator.empty_cache().map_err(fail)?;
            self.counts.empty_cache_calls += 1;
        }
        Ok(true)
    }

    /// A run of releases read as an `empty_cache()` that releases segments of one inferred
    /// `MemPool` gone by now and, before or among them, segments the replay holds in the
    /// default pools, all in the order that pool's own `emptyCache(pool)` walks them
    /// (its small pool, then its large pool, each by size) where a whole `empty_cache()`
    /// would release other segments too: that pool's call, the default-held segments its own
    /// (their requests made new memory where the default pools would have too, which nothing
    /// told). Under the recorded config, whose state is the recording's, the replay releases
    /// just those, with one synchronisation, and claims the default-held ones for the pool by
    /// the event that made each ([`CapturePools::claim_made`]): a self-replay that learns from
    /// this one holds them there from the start. Returns whether it read the run so.
    pub(super) fn empty_cache_of_a_pool_and_beside(&mut self, run: &Run) -> Result<bool, String> {
        if !self.recorded_config
            || !self.infer_mem_pools_as_read
            || !run.after_release.is_empty()
            || run.freed_at.len() != run.released.len()
            || run.released_made.len() != run.released.len()
        {
            return Ok(false);
        }
        let beside = |segment: &ReleasedSegment| segment.pool == MemPoolId::DEFAULT;
        let Some(pool) = run
            .released
            .iter()
            .find(|segment| !beside(segment))
            .map(|segment| segment.pool)
        else {
            return Ok(false);
        };
        if !self.capture_pools.is_mem_pool(pool)
            || !run.released.iter().any(beside)
            || !run
                .released
                .iter()
                .all(|segment| segment.pool == pool || beside(segment))
            || self.whole_empty_cache_releases(&run.freed_at)
        {
            return Ok(false);
        }
        let claim_beside = |engine: &mut Engine| {
            for (segment, made) in run.released.iter().zip(&run.released_made) {
                if let (true, Some(made)) = (beside(segment), *made) {
                    engine.capture_pools.claim_made(made, pool, engine.index);
                }
            }
        };
        let Some(order) = self.allocator.one_pool_release_order(&run.freed_at) else {
            // The replay still holds a block in one of them (it went astray before: a request
            // it routed to the default pools, whose `process_events` completed a deferred free
            // early, say): the recorded sizes alone still tell the pool's walk, small segments
            // first. A claim for the next pass to try; this one reads the run as before.
            if recorded_walk_order(run) {
                claim_beside(self);
            }
            return Ok(false);
        };
        if order != run.freed_at {
            return Ok(false);
        }
        let done = self
            .allocator
            .empty_cache_of_pool_segments(pool, &run.freed_at)
            .map_err(|error| format!("the allocator failed: {error}"))?;
        if !done {
            return Ok(false);
        }
        claim_beside(self);
        // Read from the replay's state: right only if its config is the recording's.
        self.assumed_recorded_config = true;
        self.counts.empty_cache_calls += 1;
        Ok(true)
    }

    /// The bases of the segments a whole `empty_cache()` would release now that the replay
    /// holds in the default pools (not a freeable private pool's), in that call's order.
    pub(super) fn default_segments_a_whole_call_releases(&self) -> Vec<u64> {
        let default: HashSet<u64> = self
            .allocator
            .segment_pool_ids()
            .filter(|&(_, owner)| owner.is_default())
            .map(|(base, _)| base)
            .collect();
        self.allocator
            .empty_cache_outlook()
            .into_iter()
            .map(|(base, _)| base)
            .filter(|base| default.contains(base))
            .collect()
    }

    /// The recorded addresses of the segments a whole `empty_cache()` would release now, in
    /// its order ([`CachingAllocator::empty_cache_outlook`]).
    pub(super) fn empty_cache_addresses(&self) -> Vec<u64> {
        self.allocator
            .empty_cache_outlook()
            .into_iter()
            .map(|(address, _)| address)
            .collect()
    }

    /// Whether a whole `empty_cache()` would release just the segments at `addresses`, in
    /// whatever order: a run of them then reads as the job's call.
    pub(super) fn whole_empty_cache_releases(&self, addresses: &[u64]) -> bool {
        let mut released = addresses.to_vec();
        let mut whole = self.empty_cache_addresses();
        released.sort_unstable();
        whole.sort_unstable();
        released == whole
    }

    /// Whether a whole `empty_cache()` made here would leave a free pending that the trace
    /// shows no completion of, `completed` of the pending frees being the run's own completions
    /// (still pending in the replay): that call's synchronisation completes every pending free
    /// (PyTorch's `synchronize_and_free_events`, before any release, each recorded as a
    /// `free_completed`), so a free still pending rules the call out. The replay holds no free
    /// pending that the recording did not (it completes each where the trace does, or sooner
    /// on an OOM path), so this reads the recording.
    pub(super) fn leaves_a_free_pending(&self, completed: usize) -> bool {
        self.allocator.pending_frees().blocks > completed as u64
    }

    /// Replays a run of releases read as an `empty_cache()` as a private pool's
    /// `emptyCache(pool)` instead (a `torch.cuda.MemPool` going away) when that is what the
    /// trace shows: the replay never knew the pool (its segments were gone by the file's end,
    /// so it held them in the default pools), and a whole `empty_cache()` would release
    /// default-pool segments besides those the trace released. Only where each recorded
    /// release names a whole cached segment of the replay at its recorded address (a replay
    /// that placed them as recorded), with no completion after a release (a whole
    /// synchronisation's) and no `empty_cache` frame, where the whole call would release more
    /// or would have completed a free the trace leaves pending; and only under the recorded
    /// config,
    /// whose state is the recording's (under another, a `torch.cuda.empty_cache()` finds
    /// other segments cached than the recording's did). Returns whether it did.
    pub(super) fn empty_cache_of_an_unknown_pool(&mut self, run: &Run) -> Result<bool, String> {
        if !self.recorded_config
            || run.empty_cache_frame
            || run.capture
            || !run.after_release.is_empty()
        {
            return Ok(false);
        }
        if !run.unmapped_at.is_empty() && run.unmapped_at.len() as u64 == run.releases {
            return self.unmaps_of_an_unknown_pool(run);
        }
        if run.freed_at.is_empty() || run.freed_at.len() as u64 != run.releases {
            return Ok(false);
        }
        // A free still pending: a whole `empty_cache()` would have completed it, the pool's
        // (whose synchronisation reaches its own blocks only) did not.
        let pending_left = self.leaves_a_free_pending(0);
        let whole = self.allocator.empty_cache_outlook();
        let recorded_all = run
            .freed_at
            .iter()
            .all(|address| whole.iter().any(|&(at, _)| at == *address));
        if !recorded_all || (whole.len() == run.freed_at.len() && !pending_left) {
            return Ok(false);
        }
        let done = self.allocator.empty_cache_of_segments(&run.freed_at);
        self.read_from_state(done)
    }

    /// The outcome of a reading made from the replay's state (an unknown pool's
    /// `emptyCache(pool)`, say): where it was made, it is right only if the replay's config
    /// is the recording's, which the pass then assumes.
    fn read_from_state(&mut self, done: Result<bool, AllocError>) -> Result<bool, String> {
        let done = done.map_err(|error| format!("the allocator failed: {error}"))?;
        self.assumed_recorded_config |= done;
        Ok(done)
    }

    /// [`Engine::empty_cache_of_an_unknown_pool`] with expandable segments: a run of
    /// `segment_unmap` events only, each the whole pages of one free block the replay holds
    /// in the default pools, at its recorded address, where a whole `empty_cache()` would
    /// unmap other pages (or release a `cudaMalloc` segment) too, or would have completed a
    /// free the trace leaves pending. The pool's `emptyCache(pool)` then unmapped just these,
    /// in the recorded order. Returns whether it read the run so.
    fn unmaps_of_an_unknown_pool(&mut self, run: &Run) -> Result<bool, String> {
        let pending_left = self.leaves_a_free_pending(0);
        let whole = self.allocator.empty_cache_unmap_outlook();
        let recorded_all = run.unmapped_at.iter().all(|range| whole.contains(range));
        let releases_more =
            whole.len() > run.unmapped_at.len() || !self.empty_cache_addresses().is_empty();
        if !recorded_all || (!releases_more && !pending_left) {
            return Ok(false);
        }
        let done = self
            .allocator
            .empty_cache_of_unmapped_ranges(&run.unmapped_at);
        self.read_from_state(done)
    }

    /// A run with no malloc after it that completed deferred frees and released nothing, where
    /// a whole `empty_cache()` would have released cached segments (under the recorded
    /// config, whose cache is the recording's) or completed a free the trace leaves pending:
    /// a `MemPool`'s `emptyCache(pool)` (the pool going away; its synchronisation reaches its
    /// own blocks' frees, the run's completions, and it had nothing whole to release).
    /// Counts that call's synchronisation; returns whether it read the run so.
    pub(super) fn pools_own_empty_cache(&mut self, run: &Run) -> Result<bool, String> {
        if run.releases > 0 || run.empty_cache_frame || run.capture {
            return Ok(false);
        }
        let whole_releases = self.recorded_config
            && (!self.empty_cache_addresses().is_empty()
                || self.allocator.empty_cache_unmaps_pages());
        if !whole_releases && !self.leaves_a_free_pending(0) {
            return Ok(false);
        }
        self.allocator
            .empty_cache_of_segments(&[])
            .map_err(|error| format!("the allocator failed: {error}"))?;
        Ok(true)
    }
}

/// Whether the run's releases come in the order one pool's `release_blocks` walk takes by
/// their recorded sizes alone: its small-pool segments (`SMALL_BUFFER`, the only size a small
/// segment has and no large one does) first, then the large ones by size, then address.
fn recorded_walk_order(run: &Run) -> bool {
    let keys: Vec<(bool, u64, u64)> = run
        .released
        .iter()
        .zip(&run.freed_at)
        .map(|(segment, &address)| (segment.size != SMALL_BUFFER, segment.size, address))
        .collect();
    keys.windows(2).all(|pair| pair[0] <= pair[1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pools_walk_takes_its_small_segments_first_then_the_large_by_size() {
        let run = |segments: &[(u64, u64)]| Run {
            released: segments
                .iter()
                .map(|&(size, _)| ReleasedSegment {
                    pool: MemPoolId::DEFAULT,
                    size,
                })
                .collect(),
            freed_at: segments.iter().map(|&(_, address)| address).collect(),
            ..Run::default()
        };
        let mib = 1 << 20;
        assert!(recorded_walk_order(&run(&[
            (2 * mib, 0x9000),
            (20 * mib, 0x1000),
            (20 * mib, 0x5000),
            (40 * mib, 0x3000)
        ])));
        assert!(
            !recorded_walk_order(&run(&[(20 * mib, 0x1000), (2 * mib, 0x9000)])),
            "a whole empty_cache() walks the default large pool first"
        );
        assert!(!recorded_walk_order(&run(&[
            (20 * mib, 0x5000),
            (20 * mib, 0x1000)
        ])));
    }
}
