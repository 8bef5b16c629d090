//! A trace that starts mid-run (the history ring dropped its beginning): the state it starts
//! from, and the work of a malloc that the ring cut at the window's start (its
//! `segment_alloc`, the first releases of its garbage collection).

use super::super::seed::Seeded;
use super::{non_negative, Engine, Live};
use crate::alloc::outlook::MallocOutlook;
use crate::alloc::{AllocError, Allocation, CachingAllocator};
use crate::snapshot::model::Action;
use crate::snapshot::pickle::RawEvent;

impl Engine {
    /// Starts from the blocks `seeded` put into the allocator (a trace that starts mid-run):
    /// they are live under their recorded addresses (a block whose free was already requested
    /// is freed on a busy made-up stream of its own, as a deferred free), those that did not
    /// fit are skipped with their frees, and the allocator's events so far are not compared
    /// with the recording. The counters then start again: those frees were requested before
    /// the window, so neither the window's peaks (`allocation`, `allocated_bytes`: PyTorch
    /// lowers them at the request) nor its totals hold the blocks as allocated.
    pub fn start_from(&mut self, seeded: &Seeded) -> Result<(), String> {
        for block in &seeded.live {
            self.live.insert(
                block.addr,
                Live {
                    allocation: block.allocation,
                    deferred: None,
                    index: None,
                    requested: block.requested,
                },
            );
            if block.free_requested {
                let mut event = RawEvent::new(Action::FreeRequested);
                event.addr = block.addr as i64;
                self.defer_free(&event, false)?;
                self.pending_at_start.insert(block.addr);
            }
        }
        self.skipped.extend(seeded.failed.iter().copied());
        // Private pools the start state's segments belong to, created with their lasting use.
        self.pools.extend(seeded.pools.iter().copied());
        self.started_mid_run = true;
        self.at_window_start = true;
        // Cached all at once here, at times the file does not keep: ages the collector reads
        // are learnt from the releases the trace shows (`age_what_the_collector_took`).
        self.allocator.mark_cached_ages_unseen();
        self.log.borrow_mut().0.clear();
        self.allocator.reset_accumulated_stats();
        self.allocator.reset_peak_stats();
        Ok(())
    }

    /// Before the malloc `event` whose run released `cudaMalloc` segments, under the recorded
    /// config, in a trace that starts mid-run: the collector frees the cached blocks of at
    /// least the average age, and the start state's were cached all at once, where the
    /// recording had cached them at times before the window. Those the run released, still
    /// cached as the start left them, get an age with which the malloc's collection makes
    /// exactly the run's releases, where one does
    /// ([`CachingAllocator::age_unseen_segments`]); otherwise nothing changes.
    pub(super) fn age_what_the_collector_took(&mut self, event: &RawEvent) -> Result<(), String> {
        let freed_at = self.run.freed_at.clone();
        self.age_for_the_collector(event, &freed_at, CachingAllocator::age_unseen_segments)
    }

    /// [`Engine::age_what_the_collector_took`] again once the run's leading completions are
    /// applied (`freed_at`: the run's releases): those completions came before the malloc's
    /// releases, so before its collection, which counts their blocks in its average age; ages
    /// chosen on the cache without them may make other releases
    /// ([`CachingAllocator::age_unseen_segments_again`]).
    pub(super) fn age_again_what_the_collector_took(
        &mut self,
        event: &RawEvent,
        freed_at: &[u64],
    ) -> Result<(), String> {
        self.age_for_the_collector(event, freed_at, CachingAllocator::age_unseen_segments_again)
    }

    /// Asks `age` of the allocator (`age_unseen_segments` or its `_again`) for the malloc
    /// `event` whose run released the segments at `freed_at`, in the pool the malloc is
    /// asked in, where the replay follows the recorded config in a trace that starts mid-run.
    fn age_for_the_collector(
        &mut self,
        event: &RawEvent,
        freed_at: &[u64],
        age: fn(&mut CachingAllocator, u64, u64, &[u64]) -> bool,
    ) -> Result<(), String> {
        if freed_at.is_empty() || !self.recorded_config || !self.started_mid_run {
            return Ok(());
        }
        let size = non_negative(event.size, "size")?;
        let stream = event.stream as u64;
        let pool = self.route(event);
        let entered = self.enter_pool(pool, stream)?;
        age(&mut self.allocator, stream, size, freed_at);
        self.leave_pool(entered)
    }

    /// Under the recorded config, a window that begins with a run of `cudaMalloc` segment
    /// releases ended by the malloc `event`, where the memory the start state holds lies
    /// under the garbage collector's threshold, so the replayed malloc would collect nothing:
    /// the ring cut that malloc's collection, whose first releases (counted in the memory held
    /// when it began) are not in the file. The collection is taken as begun
    /// ([`CachingAllocator::expect_collection_begun_before`], reclaiming at least the bytes
    /// the run shows) where it then makes exactly the run's releases, once the unseen ages
    /// are given ([`Engine::age_what_the_collector_took`]); otherwise nothing changes, and the
    /// run is read as before (an `empty_cache()`, or the OOM path's).
    pub(super) fn collection_cut_by_the_window(&mut self, event: &RawEvent) -> Result<(), String> {
        let run = &self.run;
        if !run.began_at_window_start
            || !self.recorded_config
            || run.freed_at.is_empty()
            || !run.unmapped_at.is_empty()
            || run.empty_cache_frame
            || run.capture
        {
            return Ok(());
        }
        let bytes = run.released.iter().map(|segment| segment.size).sum();
        if !self.collection_of(event)?.is_empty() {
            // The collector runs by the memory held: nothing was cut that it needs.
            return Ok(());
        }
        self.allocator.expect_collection_begun_before(bytes);
        let released = self.run.released.clone();
        self.age_what_the_collector_took(event)?;
        let mut planned = self.collection_of(event)?;
        let mut recorded = self.run.freed_at.clone();
        planned.sort_unstable();
        recorded.sort_unstable();
        if planned != recorded || !self.malloc_releases(event, &released)? {
            self.allocator.forget_collection_begun_before();
        }
        Ok(())
    }

    /// Under the recorded config, a window that begins with a run of `cudaMalloc` segment
    /// releases ended by the malloc `event`, whose block lies at the base of a segment the run
    /// made, where a block cached at the start would serve it: the ring cut that malloc's OOM
    /// path, whose `synchronize_and_free_events` completed the block's deferred free (pending
    /// when the malloc searched the cache) before the window. The malloc is replayed past its
    /// search of the cache ([`CachingAllocator::expect_cache_searched_before`]); otherwise
    /// nothing changes.
    pub(super) fn cache_search_cut_by_the_window(
        &mut self,
        event: &RawEvent,
    ) -> Result<(), String> {
        let run = &self.run;
        if event.action != Action::Alloc
            || !run.began_at_window_start
            || !self.recorded_config
            || run.releases == 0
            || !run.unmapped_at.is_empty()
            || run.capture
            || !self.made_at.contains_key(&(event.addr as u64))
        {
            return Ok(());
        }
        self.cache_search_cut = self.outlook(event)? == MallocOutlook::Cached;
        Ok(())
    }

    /// The segments garbage collection would release now for the malloc of `event`, routed
    /// as it will be ([`CachingAllocator::collection_outlook`]).
    fn collection_of(&mut self, event: &RawEvent) -> Result<Vec<u64>, String> {
        let size = non_negative(event.size, "size")?;
        let stream = event.stream as u64;
        let pool = self.route(event);
        let entered = self.enter_pool(pool, stream)?;
        let planned = self.allocator.collection_outlook(stream, size);
        self.leave_pool(entered)?;
        Ok(planned)
    }

    /// The window's first event, an `alloc` at the base of a segment cached whole at the
    /// start, which the request would not get from the cache (a block of `max_split_size_mb`
    /// or more serves no smaller request; or a better fit is cached, which was pending when
    /// PyTorch looked and which the OOM path before the retry completed): the ring dropped
    /// the `segment_alloc` its malloc made just before, and the segment is that malloc's
    /// ([`CachingAllocator::malloc_from_made_segment`]). Read from the recorded config only.
    /// `None`: the request goes through the allocator as any other.
    pub(super) fn made_before_window(
        &mut self,
        event: &RawEvent,
        size: u64,
    ) -> Option<Result<Allocation, AllocError>> {
        if !self.at_window_start || event.action != Action::Alloc || !self.recorded_config {
            return None;
        }
        self.allocator
            .malloc_from_made_segment(event.stream as u64, size, event.addr as u64)
            .transpose()
    }
}
