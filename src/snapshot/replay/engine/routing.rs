//! The private pool each request goes to: the file's routes ([`super::PoolRoutes`]), a
//! CUDA-graph capture seen in the frames, the pool a stream serves; and asking the allocator
//! in that pool, entered and left around the question.

use super::{non_negative, Engine};
use crate::alloc::outlook::MallocOutlook;
use crate::alloc::{AllocError, Allocation, MemPoolId, PoolFilter, StreamId};
use crate::snapshot::model::Action;
use crate::snapshot::pickle::RawEvent;

// Named in doc links only.
#[cfg(doc)]
use super::super::captures::CapturePools;
#[cfg(doc)]
use crate::alloc::CachingAllocator;

impl Engine {
    /// Notes whether the allocation of `event` begins a CUDA-graph capture (a trace without
    /// frames shows none; frees carry the frames of their allocation, and PyTorch 2.11 records
    /// most `oom` entries without frames, so only allocations tell):
    /// - its frames show a capture underway and its stream's allocation before did not;
    /// - or it is on `torch.cuda.graph`'s capture stream (learnt from the frames of the
    ///   first allocation on it, made as a capture began) and the allocation before it, on
    ///   any stream, was not: the captures users make run one after another on that stream,
    ///   with the warm-ups and eager code between them on others.
    pub(super) fn see_capture(&mut self, event: &RawEvent) {
        let stream = event.stream;
        // The common case, one table look-up spared: the same stream as the allocation
        // before, which was outside a capture, and no sign of one now.
        if self.last_alloc_stream == Some(stream)
            && !self.last_alloc_inside
            && !event.signs.graph_capture
            && self.capture_stream != Some(stream)
        {
            return;
        }
        let first_on_stream = !self.capturing.contains_key(&stream);
        if event.signs.capture_stream && first_on_stream && self.capture_stream.is_none() {
            self.capture_stream = Some(stream);
        }
        let dedicated = self.capture_stream == Some(stream);
        let inside = event.signs.graph_capture || dedicated;
        let before = self
            .capturing
            .insert(stream, inside)
            .unwrap_or(self.started_mid_run);
        let continues = if dedicated {
            self.last_alloc_stream
                .map_or(self.started_mid_run, |last| last == stream)
        } else {
            before
        };
        self.last_alloc_stream = Some(stream);
        self.last_alloc_inside = inside;
        if inside && !continues {
            self.run.capture = true;
            self.counts.graph_captures += 1;
            self.capture_pools
                .capture_begins(stream, self.last_request.saturating_add(1));
        }
    }

    /// The inferred pool of the allocation `event` (see [`Engine::see_capture`] first), if
    /// no file segment routes it: its capture's ([`CapturePools::route`]), or the pool that
    /// claimed the recorded segment it lies in (a `MemPool`'s, say).
    pub(super) fn route_to_inferred_pool(&mut self, event: &RawEvent) {
        let addr = event.addr as u64;
        self.capture_route = if self.routes.pool_of(addr, self.index).is_some() {
            None
        } else if self.last_alloc_inside {
            self.capture_pools.route(addr, event.stream)
        } else {
            self.capture_pools.claimed(addr)
        };
        if let Some(pool) = self.capture_route {
            self.counts.inferred_pool_allocs += 1;
            self.capture_pools.claim_recent(pool);
        }
    }

    /// Routes a recorded `oom` that a replay this one learnt from found asked in a private
    /// pool to that pool before its run is read, as an allocation's learnt route is
    /// ([`Engine::route_to_inferred_pool`]). Routed only after the run was read, a release of
    /// that pool's segment in the run made the pool go away first (no malloc asked in it
    /// there), and the `oom` went to the default pools, whose OOM path completed a deferred
    /// free the recording left pending.
    pub(super) fn route_learned_oom(&mut self, event: &RawEvent) {
        if let Some(pool) = self.capture_pools.learned_at(self.index) {
            self.stream_pools.insert(event.stream, pool);
        }
    }

    /// What the malloc of `event` would do now, routed as it will be, once the frees whose
    /// events completed are back ([`CachingAllocator::malloc_outlook`]).
    pub(super) fn outlook(&mut self, event: &RawEvent) -> Result<MallocOutlook, String> {
        let pool = self.route(event);
        self.outlook_in(event, pool, &[])
    }

    /// What the malloc of `event` would do now asked in `pool` (`None`: the default pools),
    /// the pending frees of `completed` taken as done
    /// ([`CachingAllocator::malloc_outlook_if_completed`]).
    pub(super) fn outlook_in(
        &mut self,
        event: &RawEvent,
        pool: Option<MemPoolId>,
        completed: &[Allocation],
    ) -> Result<MallocOutlook, String> {
        let size = non_negative(event.size, "size")?;
        let stream = event.stream as u64;
        // In the pool first: a malloc asked in a private pool runs no `process_events`
        // (PyTorch's `captures_underway` is not empty), so nothing completes there.
        let entered = self.enter_pool(pool, stream)?;
        self.allocator
            .complete_finished_frees()
            .map_err(|error| format!("the allocator failed: {error}"))?;
        let outlook = self
            .allocator
            .malloc_outlook_if_completed(stream, size, completed);
        self.leave_pool(entered)?;
        Ok(outlook)
    }

    /// The private pool an allocation recorded at `event` goes to, if any.
    pub(super) fn route(&self, event: &RawEvent) -> Option<MemPoolId> {
        if self.routes.is_empty() && self.capture_route.is_none() && self.stream_pools.is_empty() {
            return None;
        }
        let routed = match event.action {
            Action::Alloc => self
                .routes
                .pool_of(event.addr as u64, self.index)
                .or(self.capture_route),
            // An `oom` has no address. A pool serving a stream (a capture, cudagraph trees'
            // warm-up, `use_mem_pool`) serves it until it is left, so a stream whose last
            // allocation went to a private pool asked that pool: its OOM path skips
            // `release_cached_blocks` (PyTorch's `captures_underway` is not empty).
            // Unless the trace shows otherwise ([`Engine::oom_in_default_pools`]).
            Action::Oom if self.oom_in_default => None,
            Action::Oom => self.stream_pools.get(&event.stream).copied(),
            _ => None,
        };
        // A pool the replay let go is not asked again (see `Engine::enter_pool`).
        routed.filter(|&pool| self.allocator.pool_use_count(pool) != Some(0))
    }

    /// Makes `pool` (if any) serve `stream`, creating it with one lasting use the first time
    /// (the replay never learns when a graph or `MemPool` went away); returns the pool entered,
    /// for [`Engine::leave_pool`]. A pool the replay already let go (a reading of its releases
    /// that the trace later belies) is not entered: the allocator refuses a released pool, so
    /// the request goes to the default pools and the pass differs from there, never failing
    /// the replay.
    pub(super) fn enter_pool(
        &mut self,
        pool: Option<MemPoolId>,
        stream: StreamId,
    ) -> Result<Option<MemPoolId>, String> {
        let Some(pool) = pool.filter(|&pool| self.allocator.pool_use_count(pool) != Some(0)) else {
            return Ok(None);
        };
        let fail = |error: AllocError| format!("the allocator failed: {error}");
        if self.pools.insert(pool) {
            self.allocator.create_pool(pool).map_err(fail)?;
        }
        self.allocator
            .begin_allocate_to_pool(pool, PoolFilter::Stream(stream))
            .map_err(fail)?;
        Ok(Some(pool))
    }

    /// The graph of the inferred pool `pool` went away: PyTorch releases a private pool's
    /// cached segments only once it is freeable. The lasting use the replay gave it
    /// ([`Engine::enter_pool`]) goes, and no stream asks it again (an `oom` on the stream it
    /// served last).
    pub(super) fn pool_went_away(&mut self, pool: MemPoolId) -> Result<(), String> {
        // A reading that lets a pool go which the file's end shows making memory later is
        // wrong (PyTorch never reuses a pool id): the pool stays.
        if self.routes.makes_memory_after(pool, self.index) {
            return Ok(());
        }
        self.stream_pools.retain(|_, served| *served != pool);
        if self.pools.contains(&pool) {
            self.allocator
                .release_pool(pool)
                .map_err(|error| format!("the allocator failed: {error}"))?;
        }
        Ok(())
    }

    /// Undoes [`Engine::enter_pool`].
    pub(super) fn leave_pool(&mut self, pool: Option<MemPoolId>) -> Result<(), String> {
        let Some(pool) = pool else {
            return Ok(());
        };
        let fail = |error: AllocError| format!("the allocator failed: {error}");
        self.allocator.end_allocate_to_pool(pool).map_err(fail)?;
        self.allocator.release_pool(pool).map_err(fail)
    }
}
