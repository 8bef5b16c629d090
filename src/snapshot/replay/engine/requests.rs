//! The trace's requests replayed through the allocator: an `alloc` (or cudagraph trees'
//! checkpoint restore) and its malloc, a free made at once or deferred (`record_stream`) and its
//! completion, and a recorded `oom` tried again.

use super::super::answer::OomSource;
use super::{
    never_allocated, non_negative, Engine, Live, RESTORE_SCAN_BASE, RESTORE_SCAN_PER_EVENT,
};
use crate::alloc::{AllocError, Allocation};
use crate::snapshot::model::Action;
use crate::snapshot::pickle::RawEvent;

// Named in doc links only.
#[cfg(doc)]
use super::Counts;

/// A request replayed: its size and the allocator's answer.
type Asked = (u64, Result<Allocation, AllocError>);

impl Engine {
    /// Whether a `free_completed` completes a deferred free still waiting in the replay.
    pub(super) fn is_deferred(&self, event: &RawEvent) -> bool {
        let addr = event.addr as u64;
        self.live
            .get(&addr)
            .is_some_and(|live| live.deferred.is_some())
            || self.skipped_deferred.contains(&addr)
    }

    /// After a malloc: completions PyTorch made on its OOM path that the replayed malloc did
    /// not make are done now (their streams' work marked complete, for the next malloc).
    fn after_malloc(&mut self) -> Result<(), String> {
        self.run.oom_path_frees.clear();
        for stream in std::mem::take(&mut self.run.after_release) {
            self.allocator
                .synchronize_stream(stream)
                .map_err(|error| format!("the allocator failed: {error}"))?;
        }
        Ok(())
    }

    /// An allocation of cudagraph trees' checkpoint restore (its frames say so) in a private
    /// pool: the free block at its address, exactly its size, when gpumem's pool has that
    /// block there (a self-replay, whose segments lie at the recorded addresses); `None` for
    /// any other allocation, or when the pool has no such block (another config placed the
    /// pool's memory otherwise): the replay then asks for it as for any request.
    fn restore_block(&mut self, event: &RawEvent) -> Result<Option<Asked>, String> {
        if !event.signs.checkpoint_restore {
            return Ok(None);
        }
        let Some(pool) = self.route(event) else {
            return Ok(None);
        };
        let size = non_negative(event.size, "size")?;
        if !self.pools.contains(&pool) {
            return Ok(None);
        }
        let cost = self.allocator.cached_blocks_in_pool(pool) as u64;
        let budget = RESTORE_SCAN_BASE
            .saturating_add(RESTORE_SCAN_PER_EVENT.saturating_mul(self.counts.events));
        if self.restore_scanned.saturating_add(cost) > budget {
            return Ok(None);
        }
        self.restore_scanned += cost;
        match self
            .allocator
            .allocate_block_at(pool, event.address(), size)
        {
            Ok(allocation) => {
                self.counts.pooled_allocs += 1;
                self.counts.restored_blocks += 1;
                self.stream_pools.insert(event.stream, pool);
                Ok(Some((size, Ok(allocation))))
            }
            Err(_) => Ok(None),
        }
    }

    /// The event's request (its size, on its stream, in its pool) through the allocator; the
    /// size and the allocator's answer.
    fn malloc(&mut self, event: &RawEvent) -> Result<Asked, String> {
        let size = non_negative(event.size, "size")?;
        let stream = event.stream as u64;
        let pool = self.route(event);
        if event.action == Action::Alloc
            && (!self.routes.is_empty() || self.capture_pools.routed > 0)
        {
            if let Some(pool) = pool {
                self.counts.pooled_allocs += 1;
                self.stream_pools.insert(event.stream, pool);
                self.last_private_pool.insert(event.stream, pool);
            } else {
                self.stream_pools.remove(&event.stream);
            }
        }
        let entered = self.enter_pool(pool, stream)?;
        // The completions PyTorch's OOM path made here, in the order the trace shows.
        self.allocator.walk_streams_first(&self.run.after_release);
        let search_cut = std::mem::take(&mut self.cache_search_cut);
        let result = match self.made_before_window(event, size) {
            Some(made) => made,
            None => {
                if search_cut {
                    self.allocator.expect_cache_searched_before();
                }
                self.allocator.malloc_on(stream, size)
            }
        };
        self.allocator.walk_streams_first(&[]);
        self.leave_pool(entered)?;
        self.after_malloc()?;
        if let Some(hints) = &self.hints {
            hints.clear();
        }
        Ok((size, result))
    }

    pub(super) fn alloc(&mut self, index: u64, event: &RawEvent) -> Result<(), String> {
        self.counts.allocs += 1;
        let addr = event.addr as u64;
        if self.live.contains_key(&addr) {
            return Err(format!(
                "alloc at {addr:#x}, which is already allocated (no free_completed since)"
            ));
        }
        let (size, result) = match self.restore_block(event)? {
            Some(restored) => restored,
            None => self.malloc(event)?,
        };
        match result {
            Ok(allocation) => {
                self.live.insert(
                    addr,
                    Live {
                        allocation,
                        deferred: None,
                        index: Some(index),
                        requested: size,
                    },
                );
                Ok(())
            }
            Err(AllocError::OutOfMemory(oom)) => {
                self.counts.ooms += 1;
                self.skipped.insert(addr);
                self.answer(index, size, &oom, OomSource::Alloc);
                Ok(())
            }
            Err(other) => Err(format!("the allocator failed: {other}")),
        }
    }

    /// Holds a `free_requested` until the next event says whether the free was immediate.
    pub(super) fn free_requested(&mut self, index: u64, event: &RawEvent) -> Result<(), String> {
        // The last live block of an inferred capture pool, dropped outside a capture into it:
        // the graph went away with its outputs.
        if let Some(pool) = self.capture_pools.freed(event.addr as u64) {
            let capturing = self.last_alloc_inside
                && self
                    .last_alloc_stream
                    .is_some_and(|stream| self.capture_pools.capturing_into(stream) == Some(pool));
            if !capturing && self.capture_pools.make_freeable(pool) {
                self.pool_went_away(pool)?;
            }
        }
        if self.free_on_request {
            return self.free_now(event);
        }
        let addr = event.addr as u64;
        match self.live.get(&addr) {
            Some(live) if live.deferred.is_some() => Err(format!(
                "free_requested of address {addr:#x}, whose free is already requested"
            )),
            Some(_) => {
                self.held = Some((index, *event));
                Ok(())
            }
            // Held as a live block's: whether the free was deferred shapes the runs around it.
            None if self.skipped.contains(&addr) => {
                self.held = Some((index, *event));
                Ok(())
            }
            None => Err(never_allocated("free_requested", addr)),
        }
    }

    /// A free completed at once (or a `free_completed` with no request before it).
    pub(super) fn free_now(&mut self, event: &RawEvent) -> Result<(), String> {
        self.counts.frees += 1;
        let addr = event.addr as u64;
        if let Some(live) = self.live.remove(&addr) {
            return self
                .allocator
                .free(live.allocation)
                .map_err(|error| format!("the allocator failed: {error}"));
        }
        if self.skipped.remove(&addr) {
            return Ok(());
        }
        Err(never_allocated("free_completed", addr))
    }

    /// The held `free_requested` was not followed by its completion: the block was used on
    /// other streams. Freed on a busy stream of its own, it stays active until completed.
    /// `counted`: whether [`Counts::deferred_frees`] counts it (the trace shows it deferred;
    /// not a request made before the window, nor one whose completion a malloc's releases
    /// follow at once).
    pub(super) fn defer_free(&mut self, event: &RawEvent, counted: bool) -> Result<(), String> {
        let addr = event.addr as u64;
        let Some(live) = self.live.get_mut(&addr) else {
            if self.skipped.contains(&addr) {
                self.skipped_deferred.insert(addr);
            }
            return Ok(());
        };
        let stream = self.next_stream;
        self.next_stream += 1;
        live.deferred = Some(stream);
        let allocation = live.allocation;
        if counted {
            self.counts.deferred_frees += 1;
        }
        let fail = |error: AllocError| format!("the allocator failed: {error}");
        self.allocator
            .record_stream(allocation, stream)
            .map_err(fail)?;
        self.allocator.free(allocation).map_err(fail)
    }

    /// A recorded `free_completed` of a deferred free: its stream's work is done by the end of
    /// the run ([`Engine::end_run`]), unless a release of the same run came first (then
    /// PyTorch's OOM path completed it: the replayed malloc's should; see
    /// [`Engine::after_malloc`]).
    pub(super) fn complete_deferred(&mut self, event: &RawEvent) -> Result<(), String> {
        self.counts.frees += 1;
        self.run.completions += 1;
        let addr = event.addr as u64;
        if self.pending_at_start.remove(&addr) {
            // Its request came before the trace: it reads as a free made at once.
            self.run.adjacent += 1;
        }
        let Some(live) = self.live.remove(&addr) else {
            // An allocation the replay could not make: nothing to give back.
            if self.skipped_deferred.remove(&addr) {
                self.skipped.remove(&addr);
            }
            return Ok(());
        };
        let Some(stream) = live.deferred else {
            return Ok(());
        };
        if self.run.releases > 0 {
            self.run.after_release.push(stream);
        } else {
            self.run.leading.push((stream, live.allocation));
        }
        Ok(())
    }

    /// PyTorch ran out of memory here: try the same request (a failed malloc also flushes
    /// the cache in PyTorch), and give the block back at once if gpumem succeeds.
    pub(super) fn recorded_oom(&mut self, index: u64, event: &RawEvent) -> Result<(), String> {
        self.counts.recorded_ooms += 1;
        let (size, result) = self.malloc(event)?;
        match result {
            Ok(allocation) => self
                .allocator
                .free(allocation)
                .map_err(|error| format!("the allocator failed: {error}")),
            Err(AllocError::OutOfMemory(oom)) => {
                self.counts.recorded_ooms_reproduced += 1;
                self.answer(index, size, &oom, OomSource::RecordedOom);
                Ok(())
            }
            Err(other) => Err(format!("the allocator failed: {other}")),
        }
    }
}
