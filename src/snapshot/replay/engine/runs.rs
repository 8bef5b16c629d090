//! Runs of segment releases and deferred completions (see the module documentation of
//! [`super`]): [`Run`], and the reading of each at its end, as the OOM path or garbage
//! collection of the malloc that ends it, or as an `empty_cache()`.

use super::super::device::deferred_stream_done;
use super::{non_negative, Engine};
use crate::alloc::outlook::{MallocOutlook, ReleasedSegment};
use crate::alloc::{fraction_check_bytes, Allocation, MemPoolId, StreamId};
use crate::snapshot::model::Action;
use crate::snapshot::pickle::RawEvent;

// Named in doc links only.
#[cfg(doc)]
use crate::alloc::CachingAllocator;

/// The run of releases (and deferred completions) since the last other event.
#[derive(Debug, Default)]
pub(super) struct Run {
    /// `segment_free`/`segment_unmap` events in it.
    pub(super) releases: u64,
    /// Their segments, in order: each one's size, and its pool as the recording's routes tell
    /// it (the default pools for a segment the routes do not name).
    pub(super) released: Vec<ReleasedSegment>,
    /// The recorded addresses of its `segment_free` events, in order.
    pub(super) freed_at: Vec<u64>,
    /// The recorded ranges (address, bytes) of its `segment_unmap` events, in order.
    pub(super) unmapped_at: Vec<(u64, u64)>,
    /// By release, in order: the event that made its segment, where the trace shows it (a
    /// whole segment's `segment_free`).
    pub(super) released_made: Vec<Option<u64>>,
    /// `segment_alloc`/`segment_map` events in it.
    pub(super) new_memory: u64,
    /// Bytes they acquired.
    pub(super) new_bytes: u64,
    /// Deferred completions in it.
    pub(super) completions: u64,
    /// Of those, completions right after their `free_requested` (they read as immediate
    /// frees, so they are no sign of an `empty_cache()`).
    pub(super) adjacent: u64,
    /// Completions recorded before any release of the run, with their made-up streams: a
    /// malloc's `process_events` made them, or (when no release came before) its OOM path.
    pub(super) leading: Vec<(StreamId, Allocation)>,
    /// Whether a release's frames name `empty_cache`.
    pub(super) empty_cache_frame: bool,
    /// Whether the run's first release is a window's first event: the history ring may have
    /// cut the run, and releases of it made before the cut are not in the file.
    pub(super) began_at_window_start: bool,
    /// Whether the malloc that ends the run is the first of a CUDA-graph capture (its frames
    /// say so, the stream's allocation before did not): `torch.cuda.graph.__enter__`
    /// synchronised and called `empty_cache()` before the capture began, so the run's releases
    /// and completions are that call's, and it was made even when the trace shows nothing.
    pub(super) capture: bool,
    /// The made-up streams of completions recorded after a release of the run: PyTorch's OOM
    /// path completed them; the replayed malloc's should too, else they are done after it.
    pub(super) after_release: Vec<StreamId>,
    /// The leading completions the run took for the OOM path's of the `oom` that ends it
    /// (their made-up streams are in `after_release`): frees made at once after all where
    /// that `oom` turns out to have been asked in a private pool
    /// ([`Engine::frees_before_a_pool_oom_were_made_at_once`]).
    pub(super) oom_path_frees: Vec<(StreamId, Allocation)>,
}

impl Run {
    /// Whether nothing happened since the last run ended (the common case: an event right
    /// after another malloc or free), so ending it changes nothing.
    fn is_empty(&self) -> bool {
        self.releases == 0
            && self.new_memory == 0
            && self.new_bytes == 0
            && self.completions == 0
            && self.adjacent == 0
            && !self.empty_cache_frame
            && !self.began_at_window_start
            && !self.capture
            && self.released.is_empty()
            && self.freed_at.is_empty()
            && self.unmapped_at.is_empty()
            && self.leading.is_empty()
            && self.after_release.is_empty()
            && self.oom_path_frees.is_empty()
    }

    /// Whether, ended by no malloc, the run shows an `empty_cache()`: a release, or a
    /// completion that does not read as an immediate free.
    fn shows_empty_cache(&self) -> bool {
        self.releases > 0 || self.completions > self.adjacent
    }
}

impl Engine {
    /// Before an event that is not part of a run of releases: decides whether the run was an
    /// `empty_cache()` (see the module documentation) and replays it if so. `malloc` is the
    /// `alloc` or `oom` event that ends the run, if one does.
    pub(super) fn end_run(&mut self, malloc: Option<&RawEvent>) -> Result<(), String> {
        self.complete_leading_in_recorded_order()?;
        // Where the `oom` was asked decides how its run reads: before anything reads it.
        if let Some(event) = malloc.filter(|event| event.action == Action::Oom) {
            self.oom_leaving_a_free_pending(event)?;
            self.oom_in_mem_pool_returned_to(event)?;
        }
        if let Some(event) = malloc {
            self.collection_cut_by_the_window(event)?;
            self.cache_search_cut_by_the_window(event)?;
            self.age_what_the_collector_took(event)?;
        }
        self.released_mem_pools_went_away(malloc)?;
        // Cleared first: `oom_in_default_pools` asks `route`, which reads it.
        self.oom_in_default = false;
        self.oom_in_default = match malloc {
            Some(event) if event.action == Action::Oom => self.oom_in_default_pools(event)?,
            _ => false,
        };
        // Asked in the default pools (whichever pool its stream allocated to last).
        if let Some(event) = malloc.filter(|event| event.action == Action::Oom) {
            self.claim_kept_by_a_default_oom(event)?;
        }
        if self.run.is_empty() {
            // No release, completion or new memory: no `empty_cache()`, nothing to complete.
            return Ok(());
        }
        let mut run = std::mem::take(&mut self.run);
        if let Some(event) = malloc {
            self.claim_released_by_pool_malloc(&run, event)?;
        }
        // Completions before any release: PyTorch's `process_events` made them (the blocks
        // were back in the cache when the malloc looked), or, when the malloc found nothing
        // cached (the trace shows new memory or an OOM), possibly its OOM path — if that path,
        // with those blocks still pending, reaches `release_cached_blocks` and makes the
        // recorded releases (with expandable segments, whose releases are not predicted: if a
        // completed block would have served the malloc).
        let retry_below_a_hole = match malloc {
            Some(event) => self.retry_served_below_a_hole(event, &run)?,
            None => false,
        };
        let missed = run.new_memory > 0
            || malloc.is_some_and(|event| event.action == Action::Oom)
            || retry_below_a_hole;
        // Whether PyTorch's malloc took its OOM path is a fact of the recording. Under another
        // config the replay's state cannot tell it, so completions that read as frees made at
        // once (right after their `free_requested`) are taken as such unless the recording
        // shows that path itself: a release in the run, or the malloc's recorded `oom`.
        let shown = run.releases > 0 || malloc.is_some_and(|event| event.action == Action::Oom);
        let adjacent_only = run.adjacent >= run.leading.len() as u64;
        if adjacent_only && !shown && missed && !run.leading.is_empty() && self.recorded_config {
            // The replay's state decides below: right only if its config is the recording's.
            self.assumed_recorded_config = true;
        }
        let on_oom_path = match malloc {
            // The capture's synchronisation and `empty_cache()` completed them.
            _ if run.capture => false,
            _ if adjacent_only && !shown && !self.recorded_config => false,
            Some(event) if self.had_room(event, &run, self.recording_room) => false,
            // That path's synchronisation would have completed every pending free.
            _ if self.leaves_a_free_pending(run.leading.len()) => false,
            // The recorded block lies where only that path's retry would have put it.
            _ if retry_below_a_hole => true,
            Some(event) if missed && !run.leading.is_empty() => {
                let size = non_negative(event.size, "size")?;
                match self.outlook(event)? {
                    // Unless every completion comes right after its `free_requested` and the
                    // malloc, had they been frees made at once, would make the same releases:
                    // the trace reads the same, and a free made at once is the likelier.
                    MallocOutlook::Release {
                        released: Some(sizes),
                        flush: true,
                    } => {
                        sizes == run.released
                            && (run.adjacent < run.leading.len() as u64
                                || !self.releases_if_completed(event, &run)?)
                    }
                    MallocOutlook::Release {
                        released: None,
                        flush: true,
                    } => run.leading.iter().any(|&(_, allocation)| {
                        self.allocator.pending_block_would_serve(
                            allocation,
                            event.stream as u64,
                            size,
                        )
                    }),
                    _ => false,
                }
            }
            _ => false,
        };
        let mut completed_first = Vec::new();
        for (stream, allocation) in std::mem::take(&mut run.leading) {
            if on_oom_path {
                completed_first.push(stream);
                if malloc.is_some_and(|event| event.action == Action::Oom) {
                    run.oom_path_frees.push((stream, allocation));
                }
            } else {
                // Completed one by one, in the recorded order (PyTorch walks its streams in
                // an order of its own; the trace shows it), each alone: other frees whose work
                // is done wait for the malloc's own `process_events` (none in a private pool).
                self.allocator
                    .synchronize_stream(stream)
                    .and_then(|()| self.allocator.complete_free_now(allocation))
                    .map_err(|error| format!("the allocator failed: {error}"))?;
            }
        }
        // The OOM path completed them, in the trace's order: those recorded before its
        // releases first.
        run.after_release.splice(0..0, completed_first);
        self.allocator.walk_streams_first(&[]);
        if let Some(event) = malloc {
            self.age_again_what_the_collector_took(event, &run.freed_at)?;
        }
        let mut empty_cache = match malloc {
            _ if run.empty_cache_frame || run.capture => true,
            None => run.shows_empty_cache() && !self.pools_own_empty_cache(&run)?,
            Some(event) => {
                run.releases > 0
                    && run.after_release.is_empty()
                    // Its completions are done by now: any free still pending rules it out.
                    && !self.leaves_a_free_pending(0)
                    && matches!(event.action, Action::Alloc | Action::Oom)
                    && (self.had_room(event, &run, self.recording_room)
                        || !self.malloc_releases(event, &run.released)?)
            }
        };
        // Read before the recorded config was known, from the replay's state: had the recording
        // had the room, a replay under another config would read this run otherwise.
        if self.recorded_config && self.recording_room.is_none() {
            let own = on_oom_path || (run.releases > 0 && !empty_cache);
            if own && malloc.is_some_and(|event| self.had_room(event, &run, self.provisional_room))
            {
                self.assumed_recorded_config = true;
            }
        }
        if empty_cache && !run.capture && !run.empty_cache_frame {
            empty_cache = !self.empty_cache_of_inferred_mem_pool(&run)?
                && !self.empty_cache_of_a_pool_and_beside(&run)?;
        }
        if empty_cache {
            self.claim_released_out_of_order(&run);
            if !self.empty_cache_of_an_unknown_pool(&run)? {
                self.allocator
                    .empty_cache()
                    .map_err(|error| format!("empty_cache failed: {error}"))?;
            }
            self.counts.empty_cache_calls += 1;
        }
        // Keep what the malloc's OOM path is to complete (see `after_malloc`); without a
        // malloc the run was an empty_cache(), which completed every pending free.
        if malloc.is_some() {
            self.run.after_release = run.after_release;
            self.run.oom_path_frees = run.oom_path_frees;
        }
        Ok(())
    }

    /// Makes the run's leading completions whose work is done complete in the order the trace
    /// shows, whichever walk completes them: the malloc's `process_events` (run by every
    /// outlook asked of it in the default pools, before or while the run is read) or the
    /// reading of the run. Set before anything asks: a completion recorded after another,
    /// on a made-up stream that sorts first, would otherwise complete first.
    pub(super) fn complete_leading_in_recorded_order(&mut self) -> Result<(), String> {
        let leading_streams: Vec<StreamId> =
            self.run.leading.iter().map(|&(stream, _)| stream).collect();
        // A completion whose work is done already (a `cudaFree` since synchronised the
        // device) is the malloc's `process_events`', whatever else: the completions recorded
        // before it were made by the same walk, so their work was done then too.
        let done = |stream: StreamId| deferred_stream_done(self.allocator.device(), stream);
        if let Some(last_done) = leading_streams.iter().rposition(|&stream| done(stream)) {
            for &stream in &leading_streams[..last_done] {
                self.allocator
                    .synchronize_stream(stream)
                    .map_err(|error| format!("the allocator failed: {error}"))?;
            }
        }
        self.allocator.walk_streams_first(&leading_streams);
        Ok(())
    }

    /// The inferred `MemPool`s whose segments the run released went away before it (their
    /// `emptyCache(pool)`, or a whole `empty_cache()` once they were freeable), unless the
    /// malloc that ends the run was asked in them: then it was that malloc's OOM path
    /// (`release_available_cached_blocks` in its own pool), and the job still holds the pool.
    fn released_mem_pools_went_away(&mut self, malloc: Option<&RawEvent>) -> Result<(), String> {
        let asked = malloc.and_then(|event| self.route(event));
        let mut gone: Vec<MemPoolId> = Vec::new();
        for segment in &self.run.released {
            let pool = segment.pool;
            if Some(pool) != asked && self.capture_pools.is_mem_pool(pool) && !gone.contains(&pool)
            {
                gone.push(pool);
            }
        }
        for pool in gone {
            if self.capture_pools.make_freeable(pool) {
                self.pool_went_away(pool)?;
            }
        }
        Ok(())
    }

    /// Whether the recording shows that the malloc of `event` took no OOM path, so that the
    /// releases and completions of `run` before it were not its own: it got its new memory (or
    /// a cached block), and the recorded run had room for that memory with the released
    /// segments still held (`room`: [`Engine::recording_room`]). PyTorch's OOM path runs only
    /// after a `cudaMalloc` failed, which it could not have.
    fn had_room(&self, event: &RawEvent, run: &Run, room: Option<u64>) -> bool {
        let released = run
            .released
            .iter()
            .fold(0_u64, |sum, segment| sum.saturating_add(segment.size));
        // What the cap was checked against: the new segment's size, which is the request's
        // allocation size; with expandable segments the pages mapped may be more or fewer than
        // that size, which the check counts instead.
        let recorded = self
            .recorded_conf
            .as_ref()
            .unwrap_or(self.allocator.config());
        let checked = if recorded.expandable_segments {
            fraction_check_bytes(recorded, event.size.max(0) as u64)
        } else {
            run.new_bytes
        };
        let held_before = self
            .recorded_reserved
            .saturating_sub(run.new_bytes)
            .saturating_add(released);
        event.action == Action::Alloc
            && room.is_some_and(|room| held_before.saturating_add(checked) <= room)
    }

    /// Whether the malloc of `event`, replayed now, would release exactly the segments
    /// `released` (their pools and sizes, in order) that the run holds, by garbage collection or on its
    /// OOM path; any others mean an `empty_cache()` released them. With expandable segments
    /// (pages, not predicted) any release of the OOM path counts.
    pub(super) fn malloc_releases(
        &mut self,
        event: &RawEvent,
        released: &[ReleasedSegment],
    ) -> Result<bool, String> {
        Ok(match self.outlook(event)? {
            MallocOutlook::Release { released: None, .. } => true,
            MallocOutlook::Release {
                released: Some(sizes),
                ..
            }
            | MallocOutlook::Collect(sizes) => sizes == released,
            MallocOutlook::Cached | MallocOutlook::NewMemory => false,
        })
    }

    /// Whether the allocation of `event`, which got no new memory after the run's completions
    /// and unmaps, was the retry of its OOM path: with the run's frees still pending, the
    /// malloc would have found nothing cached and been refused new memory, and
    /// `release_cached_blocks` would have left mapped free space below a hole exactly where the
    /// trace shows the block ([`CachingAllocator::expandable_retry_from_mapped`]). An
    /// `empty_cache()` followed by a cache hit reads alike in the trace, but the best fit by
    /// expandable size passes over the block below a hole, whose size counts the hole too.
    fn retry_served_below_a_hole(&mut self, event: &RawEvent, run: &Run) -> Result<bool, String> {
        if event.action != Action::Alloc
            || run.unmapped_at.is_empty()
            || run.new_memory > 0
            || run.leading.is_empty()
            || self.route(event).is_some()
        {
            return Ok(false);
        }
        if !matches!(
            self.outlook(event)?,
            MallocOutlook::Release { flush: true, .. }
        ) {
            return Ok(false);
        }
        let size = non_negative(event.size, "size")?;
        let served_at = self
            .allocator
            .expandable_retry_from_mapped(event.stream as u64, size);
        Ok(served_at.is_some() && served_at == u64::try_from(event.addr).ok())
    }

    /// Whether the recorded `oom` of `event`, whose stream's last allocation went to a private
    /// pool, was asked in the default pools instead: an `oom` records no address, and a
    /// request made after leaving `use_mem_pool` (or a capture) on the same stream reads
    /// alike. The releases the trace shows before it tell them apart: asked in the pool
    /// (`captures_underway` not empty), PyTorch's OOM path releases only that pool's cached
    /// blocks and garbage collection's; asked in the default pools, it goes on to
    /// `release_cached_blocks`. Taken as the default pools where that reading makes the
    /// recorded releases and the pool's does not, or where the pool's cache would have served
    /// the request (that pool did not run out of memory).
    fn oom_in_default_pools(&mut self, event: &RawEvent) -> Result<bool, String> {
        let Some(pool) = self.route(event) else {
            return Ok(false);
        };
        let recorded = std::mem::take(&mut self.run.released);
        let leading: Vec<Allocation> = self.run.leading.iter().map(|&(_, a)| a).collect();
        let makes = |outlook: MallocOutlook| runs_out_releasing(&outlook, &recorded);
        // In the pool neither the malloc's `process_events` nor its OOM path completes a
        // deferred free, so completions recorded before the `oom` were frees made at once.
        // The pool's reading first: the default pools' runs `process_events`, which completes
        // finished frees, so it is asked only when the pool's does not fit the trace.
        // A pool whose cache would serve the request was not the one that ran out of memory:
        // the default pools' reading stands, whatever their state before the run shows (an
        // `empty_cache()` in the run may release the block their cache holds now).
        let in_default = match self.outlook_in(event, Some(pool), &leading) {
            Ok(MallocOutlook::Cached) => Ok(true),
            Ok(outlook) if makes(outlook.clone()) => Ok(false),
            Ok(_) => Ok(self.outlook_in(event, None, &[]).map(makes)?
                || self.outlook_in(event, None, &leading).map(makes)?
                || self.claim_unreleased_by_default_oom(Some(pool), &recorded)),
            Err(error) => Err(error),
        };
        self.run.released = recorded;
        in_default
    }

    /// Whether the malloc of `event`, routed as it will be, would make exactly the releases of
    /// `run` had its leading deferred frees completed just before it
    /// ([`CachingAllocator::malloc_outlook_if_completed`]), and still run out of memory where
    /// the recording shows it did.
    fn releases_if_completed(&mut self, event: &RawEvent, run: &Run) -> Result<bool, String> {
        let size = non_negative(event.size, "size")?;
        let stream = event.stream as u64;
        let pool = self.route(event);
        let allocations: Vec<Allocation> = run.leading.iter().map(|&(_, a)| a).collect();
        let entered = self.enter_pool(pool, stream)?;
        let outlook = self
            .allocator
            .malloc_outlook_if_completed(stream, size, &allocations);
        self.leave_pool(entered)?;
        // A malloc recorded as an `oom` took its OOM path: served from the cache, by new
        // memory or after a collection, it would not have.
        let ran_out = event.action == Action::Oom;
        Ok(match outlook {
            MallocOutlook::Release {
                released: Some(sizes),
                ..
            } => sizes == run.released,
            MallocOutlook::Collect(sizes) => !ran_out && sizes == run.released,
            MallocOutlook::Release { released: None, .. } => false,
            MallocOutlook::Cached | MallocOutlook::NewMemory => !ran_out && run.released.is_empty(),
        })
    }
}

/// Whether a malloc with `outlook` runs out of memory after the releases `recorded` (in that
/// order): a reading that serves the request (from the cache, by new memory or after garbage
/// collection) is not the recorded `oom`'s. Releases gpumem does not predict (expandable
/// segments) count as the recorded ones.
pub(super) fn runs_out_releasing(outlook: &MallocOutlook, recorded: &[ReleasedSegment]) -> bool {
    match outlook {
        MallocOutlook::Release {
            released: Some(sizes),
            ..
        } => sizes == recorded,
        MallocOutlook::Release { released: None, .. } => true,
        MallocOutlook::Cached | MallocOutlook::NewMemory | MallocOutlook::Collect(_) => false,
    }
}
