//! `MemPool`s the file does not show (entered with `use_mem_pool` and gone by the end),
//! inferred at the request that asked one: an allocation that made new memory, or a recorded
//! `oom`, where the default pools, in the recording's state, would have done otherwise. Also
//! the claims so inferred, which a later replay learns.

use super::runs::runs_out_releasing;
use super::{non_negative, Engine};
use crate::alloc::outlook::MallocOutlook;
use crate::alloc::{AllocError, Allocation, MemPoolId};
use crate::snapshot::pickle::RawEvent;

// Named in doc links only.
#[cfg(doc)]
use super::super::captures::CapturePools;

impl Engine {
    /// Under the recorded config, an allocation that made a new segment (this run's) where
    /// the replay's default pools, in the recording's state, hold a free block that would
    /// serve it: PyTorch's malloc did not look there, but in a private pool no frame names
    /// and the file's end no longer shows (a `MemPool` entered with `use_mem_pool` and gone
    /// by the end). Routed to that pool ([`Engine::unshown_mem_pool_for`]). Where instead
    /// garbage collection would have released cached segments first and the trace shows no
    /// release (`released`: it shows some), those segments were not the default large pool's,
    /// the only one the collector reads ([`Engine::claim_uncollected`]).
    pub(super) fn infer_mem_pool(
        &mut self,
        event: &RawEvent,
        released: bool,
    ) -> Result<(), String> {
        self.claim_passed_over(event);
        if !self.may_infer_mem_pool(event) {
            return Ok(());
        }
        let size = non_negative(event.size, "size")?;
        match self.allocator.malloc_outlook(event.stream as u64, size) {
            MallocOutlook::Cached => {}
            MallocOutlook::Collect(_) if !released => {
                self.claim_uncollected(event, size);
                return Ok(());
            }
            _ => return Ok(()),
        }
        let serving = self
            .allocator
            .default_cached_block_segment(event.stream as u64, size)
            .and_then(|base| self.made_at.get(&base).copied());
        let pool = self.unshown_mem_pool_for(event)?;
        self.route_unshown_mem_pool(event, pool);
        if let Some(serving) = serving.filter(|_| self.capture_route.is_some()) {
            self.capture_pools.passed_over(event.addr as u64, serving);
        }
        Ok(())
    }

    /// Under the recorded config, an allocation that made a new segment the file's end shows
    /// in the default pools (so its malloc asked them), where the replay's default pools, in
    /// the recording's state, hold a free block that would serve it: PyTorch's did not, so
    /// the segment of that block was a private pool's, which its requests did not tell (they
    /// made new memory where the default pools would have too). Claimed, while every segment
    /// event so far was the recording's, by the event that made it
    /// ([`CapturePools::claim_made`]), for the `MemPool` the segment's stream had allocated
    /// to last when the segment was made, else the one this stream allocated to last:
    /// a self-replay that learns from this one holds it there from the start, and keeps it
    /// only if it then reproduces the recording.
    fn claim_passed_over(&mut self, event: &RawEvent) {
        let addr = event.addr as u64;
        // Read from the replay's state: only while that is still the recording's.
        if self.capture_route.is_some()
            || !self.recorded_config
            || !self.infer_mem_pools_as_read
            || self.segments.first_difference.is_some()
            || !self.routes.in_default_segment(addr, self.index)
            || !self
                .capture_pools
                .made_unclaimed_after(addr, self.last_request)
        {
            return;
        }
        let Ok(size) = u64::try_from(event.size) else {
            return;
        };
        let serving = self
            .allocator
            .default_cached_block_segment(event.stream as u64, size);
        let Some(&made) = serving.and_then(|base| self.made_at.get(&base)) else {
            return;
        };
        let mem_pool = |pool: &MemPoolId| {
            let user_pool = pool.first == 0 && self.routes.names(*pool);
            self.capture_pools.is_mem_pool(*pool) || user_pool
        };
        let then = self.pool_when_made.get(&made).copied().filter(mem_pool);
        let last = self
            .last_private_pool
            .get(&event.stream)
            .copied()
            .filter(mem_pool);
        if let Some(pool) = then.or(last) {
            self.passed_over_seen = true;
            if self.claim_passed_over {
                self.capture_pools.claim_made(made, pool, self.index);
            }
        }
    }

    /// The cached segments garbage collection would have released before the malloc of
    /// `event` in the replay's default pools, where the trace shows it released none: they
    /// were a private pool's. Claimed, by the event that made each
    /// ([`CapturePools::claim_made`]), for the private pool the stream allocated to last, if
    /// it is a `MemPool`; where the stream allocated to no private pool, for a `MemPool` the
    /// file does not name (one another stream fed, gone by the file's end: nothing told it
    /// before). A self-replay that learns from this one holds them there from the start, and
    /// keeps them only if it then reproduces the recording.
    fn claim_uncollected(&mut self, event: &RawEvent, size: u64) {
        let last = self.last_private_pool.get(&event.stream).copied();
        // A `MemPool`'s only: a graph pool's segments are claimed by its capture.
        if last.is_some_and(|pool| !self.capture_pools.is_mem_pool(pool)) {
            return;
        }
        let mut pool = last;
        for address in self.allocator.collection_outlook(event.stream as u64, size) {
            if let Some(&made) = self.made_at.get(&address) {
                let pool = *pool.get_or_insert_with(|| self.capture_pools.new_unfed_mem_pool());
                self.capture_pools.claim_made(made, pool, self.index);
            }
        }
    }

    /// Whether the run of releases before the allocation `event` may tell the `MemPool` it
    /// asked ([`Engine::infer_collecting_mem_pool`], [`Engine::infer_releasing_mem_pool`]): the
    /// run releases something, no capture or `empty_cache()` frame explains it, and the
    /// allocation may be inferred at all ([`Engine::may_infer_mem_pool`]).
    fn releases_may_tell_mem_pool(&self, event: &RawEvent) -> bool {
        self.run.releases > 0
            && !self.run.capture
            && !self.run.empty_cache_frame
            && self.may_infer_mem_pool(event)
    }

    /// Whether the allocation `event` may be found to have asked a `MemPool` the file does
    /// not show: under the recorded config (the replay's state is then the recording's), not
    /// routed already, in a segment the trace made for it that no pool claimed.
    fn may_infer_mem_pool(&self, event: &RawEvent) -> bool {
        let addr = event.addr as u64;
        self.capture_route.is_none()
            && self.recorded_config
            && self.infer_mem_pools_as_read
            && self.routes.pool_of(addr, self.index).is_none()
            && !self.routes.in_default_segment(addr, self.index)
            && self
                .capture_pools
                .made_unclaimed_after(addr, self.last_request)
    }

    /// Under the recorded config, an allocation that made a new segment after a run of
    /// releases, where the replay's default pools, as they stand before the run, would have
    /// served it from their cache, and where the garbage collection a malloc asked in a
    /// private pool runs (PyTorch collects the default large pool whatever pool is asked)
    /// makes exactly the run's releases, and a whole `empty_cache()` would not (the trace
    /// would read as well as that call before a default-pool malloc, the likelier reading):
    /// the run was that collection, and the malloc asked a `MemPool` gone by the end. Read
    /// otherwise, the run is an `empty_cache()` before a default-pool malloc (the trace reads
    /// alike but for the order and number of the releases; the synchronisation count
    /// differs). Routed to an inferred `MemPool`
    /// ([`CapturePools::route_new_mem_pool`]) before the run is replayed; a run that is no such
    /// collection is left to [`Engine::end_run`], and a malloc with no release before it to
    /// [`Engine::infer_mem_pool`].
    pub(super) fn infer_collecting_mem_pool(&mut self, event: &RawEvent) -> Result<(), String> {
        if !self.releases_may_tell_mem_pool(event) {
            return Ok(());
        }
        let size = non_negative(event.size, "size")?;
        let stream = event.stream as u64;
        // Frees completed before the run's first release (frees made at once, in a pool's
        // malloc, which runs no `process_events`) were back in the cache when it looked.
        let leading: Vec<Allocation> = self.run.leading.iter().map(|&(_, a)| a).collect();
        if self
            .allocator
            .malloc_outlook_if_completed(stream, size, &leading)
            != MallocOutlook::Cached
        {
            return Ok(());
        }
        let (pool, outlook) = self.outlook_in_unshown_mem_pool(event, &leading)?;
        let collects_the_run = match &outlook {
            Some(MallocOutlook::Collect(sizes)) => *sizes == self.run.released,
            _ => false,
        };
        // A whole `empty_cache()` would make just these releases, in this order: the trace
        // reads as well as the job's call before a default-pool malloc, the likelier reading
        // (a pool's first malloc collecting garbage is told by what a call would not release).
        if collects_the_run && !self.a_whole_empty_cache_reads_the_run() {
            self.route_unshown_mem_pool(event, pool);
        }
        Ok(())
    }

    /// Under the recorded config, an allocation that made a new segment after a run of
    /// releases of one `MemPool`'s cached segments alone, where that pool's malloc would make
    /// exactly those releases (`release_available_cached_blocks`, which reads the asked pool
    /// only, under `max_split_size_mb`): the malloc was asked in that pool. Read otherwise it
    /// is a default-pool malloc after the pool's `emptyCache(pool)`, which would release every
    /// whole cached segment of the pool, and the pool would be gone.
    pub(super) fn infer_releasing_mem_pool(&mut self, event: &RawEvent) -> Result<(), String> {
        if !self.releases_may_tell_mem_pool(event) {
            return Ok(());
        }
        let Some(pool) = self.run.released.first().map(|segment| segment.pool) else {
            return Ok(());
        };
        let own = |candidate: MemPoolId| candidate == pool;
        if !self.capture_pools.is_mem_pool(pool)
            || !self.run.released.iter().all(|segment| own(segment.pool))
        {
            return Ok(());
        }
        let leading: Vec<Allocation> = self.run.leading.iter().map(|&(_, a)| a).collect();
        let releases_the_run = match self.outlook_in(event, Some(pool), &leading)? {
            MallocOutlook::Release {
                released: Some(sizes),
                ..
            } => sizes == self.run.released,
            _ => false,
        };
        if releases_the_run {
            self.route_unshown_mem_pool(event, Some(pool));
        }
        Ok(())
    }

    /// The pool a recorded `oom` that no pool routes was asked in: under the recorded config,
    /// where the replay's default pools, in the recording's state, would not have failed so
    /// (PyTorch's malloc did not look there, but in a private pool): they hold a free block
    /// that would serve it; or their OOM path would release cached segments (garbage
    /// collection's, `release_available_cached_blocks`' or `release_cached_blocks`') or unmap
    /// an expandable segment's free pages where the trace shows none before the `oom`
    /// (`released`: it shows some). A malloc in a private
    /// pool found none in the pool's own cache, and its OOM path skips `release_cached_blocks`
    /// (PyTorch's `captures_underway` is not empty while a pool is in use). Asked in the
    /// stream's `MemPool` ([`Engine::unshown_mem_pool_for`]) or a new one, gone by the end. A
    /// replay under another config takes the pool a self-replay found
    /// ([`CapturePools::learned_at`]). The stream's requests go there until its next
    /// allocation says otherwise.
    pub(super) fn infer_oom_mem_pool(
        &mut self,
        event: &RawEvent,
        released: bool,
    ) -> Result<(), String> {
        if self.route(event).is_some() {
            return self.frees_before_a_pool_oom_were_made_at_once();
        }
        let pool = match self.capture_pools.learned_at(self.index) {
            Some(pool) => pool,
            None if self.recorded_config && self.infer_mem_pools_as_read => {
                let size = non_negative(event.size, "size")?;
                let default_would_not_fail_so =
                    match self.allocator.malloc_outlook(event.stream as u64, size) {
                        MallocOutlook::Cached => true,
                        MallocOutlook::Release {
                            released: Some(sizes),
                            ..
                        } => !released && !sizes.is_empty(),
                        // Expandable segments: `release_cached_blocks` would unmap the whole
                        // pages of a free default-pool block (once the pending frees it
                        // completes first merged), which the trace would show.
                        MallocOutlook::Release {
                            released: None,
                            flush: true,
                        } => !released && self.allocator.flush_unmaps_pages(),
                        _ => false,
                    };
                if !default_would_not_fail_so {
                    return Ok(());
                }
                let pool = self.unshown_mem_pool_for(event)?;
                self.oom_read_in_mem_pool(event, pool)
            }
            None => return Ok(()),
        };
        self.stream_pools.insert(event.stream, pool);
        self.frees_before_a_pool_oom_were_made_at_once()
    }

    /// Under the recorded config, a recorded `oom` after a run of releases that the default
    /// pools' reading would not make (their OOM path would release other segments or more,
    /// or the request would be served), and that exactly the releases of a malloc asked in a
    /// `MemPool` the file does not show are: its garbage collection (PyTorch collects the
    /// default large pool whatever pool is asked) and `release_available_cached_blocks` in
    /// that pool, with `release_cached_blocks` skipped while a pool is in use (PyTorch's
    /// `captures_underway` is not empty). A whole `empty_cache()` that would make just those
    /// releases is the likelier reading and is left to [`Engine::end_run`]. Read as the
    /// default pools', the run was an `empty_cache()` that released fewer segments than the
    /// call does, and the request was then served: "fits" of a job that ran out of memory.
    /// Asked before the run is read; a run with no release is left to
    /// [`Engine::infer_oom_mem_pool`].
    pub(super) fn infer_oom_collecting_mem_pool(&mut self, event: &RawEvent) -> Result<(), String> {
        if self.run.releases == 0
            || self.run.capture
            || self.run.empty_cache_frame
            || !self.recorded_config
            || !self.infer_mem_pools_as_read
            || self.route(event).is_some()
            || self.capture_pools.learned_at(self.index).is_some()
        {
            return Ok(());
        }
        // Its outlooks run `process_events`, which may complete leading frees.
        self.complete_leading_in_recorded_order()?;
        let leading: Vec<Allocation> = self.run.leading.iter().map(|&(_, a)| a).collect();
        let recorded = self.run.released.clone();
        let makes = |outlook: &MallocOutlook| match outlook {
            MallocOutlook::Release {
                released: Some(sizes),
                ..
            } => *sizes == recorded,
            _ => false,
        };
        // The default pools' malloc runs `process_events` first, completing finished frees.
        if makes(&self.outlook_in(event, None, &[])?)
            || makes(&self.outlook_in(event, None, &leading)?)
        {
            return Ok(());
        }
        let (pool, outlook) = self.outlook_in_unshown_mem_pool(event, &leading)?;
        if outlook.as_ref().is_some_and(makes) && !self.a_whole_empty_cache_reads_the_run() {
            let pool = self.oom_read_in_mem_pool(event, pool);
            self.stream_pools.insert(event.stream, pool);
        }
        Ok(())
    }

    /// The `MemPool` the file does not show that the malloc of `event` may have asked
    /// ([`Engine::unshown_mem_pool_for`]; `None`: a new one), and what that malloc would do
    /// there, the pending frees of `leading` taken as done (`None` where gpumem does not
    /// predict it: a new pool under expandable segments).
    fn outlook_in_unshown_mem_pool(
        &mut self,
        event: &RawEvent,
        leading: &[Allocation],
    ) -> Result<(Option<MemPoolId>, Option<MallocOutlook>), String> {
        let pool = self.unshown_mem_pool_for(event)?;
        let outlook = match pool {
            Some(pool) => Some(self.outlook_in(event, Some(pool), leading)?),
            None => self.allocator.malloc_outlook_in_empty_pool(
                event.stream as u64,
                non_negative(event.size, "size")?,
                leading,
            ),
        };
        Ok((pool, outlook))
    }

    /// Whether a whole `empty_cache()` would make just the run's releases, in their order, and
    /// leave no free pending: the trace then reads as the job's call, the likelier reading.
    fn a_whole_empty_cache_reads_the_run(&self) -> bool {
        self.empty_cache_addresses() == self.run.freed_at
            && !self.leaves_a_free_pending(self.run.leading.len())
    }

    /// Reads the recorded `oom` of `event` as asked in `pool`, or in a new inferred `MemPool`
    /// (gone by the end) where `None`: returns the pool, which the stream's requests go to
    /// until its next allocation says otherwise.
    fn oom_read_in_mem_pool(&mut self, event: &RawEvent, pool: Option<MemPoolId>) -> MemPoolId {
        let pool = pool.unwrap_or_else(|| self.capture_pools.new_mem_pool(event.stream));
        self.capture_pools.claim_request(self.index, pool);
        // Read from what the default pools hold: if a release later shows one of those
        // segments to be a pool's, that reading was wrong.
        let default_held: Vec<u64> = self
            .allocator
            .segment_pool_ids()
            .filter(|&(_, owner)| owner.is_default())
            .filter_map(|(base, _)| self.made_at.get(&base).copied())
            .collect();
        for made in default_held {
            self.capture_pools.read_beside(self.index, made);
        }
        // Read from the replay's state: right only if its config is the recording's.
        self.assumed_recorded_config = true;
        pool
    }

    /// Under the recorded config, an `oom` the trace leaves a deferred free pending past was
    /// asked in a private pool, a capture's or a `MemPool`'s: PyTorch's malloc in the default
    /// pools, with no pool being allocated to (`captures_underway` empty), runs
    /// `process_events` and, on its OOM path, `release_cached_blocks`, whose synchronisation
    /// completes every pending free before the `oom` is recorded; a private pool's runs
    /// neither. Read before the default pools' reading is asked (which completes the frees
    /// whose work is done): the request goes to the pool [`Engine::unshown_mem_pool_for`]
    /// names, else to a new inferred one (a CUDA graph's first request, a `use_mem_pool`
    /// block's first).
    pub(super) fn oom_leaving_a_free_pending(&mut self, event: &RawEvent) -> Result<(), String> {
        if !self.recorded_config
            || !self.infer_mem_pools_as_read
            || self.route(event).is_some()
            || self.capture_pools.learned_at(self.index).is_some()
            // The run's completions, before its releases and after them (a garbage
            // collection's releases come before the OOM path's synchronisation), are recorded
            // before the `oom`: pending in the replay until its malloc, they are no free left.
            || !self.leaves_a_free_pending(self.run.leading.len() + self.run.after_release.len())
        {
            return Ok(());
        }
        let pool = match self.unshown_mem_pool_for(event)? {
            Some(pool) => pool,
            None => self.capture_pools.new_mem_pool(event.stream),
        };
        self.capture_pools.claim_request(self.index, pool);
        self.stream_pools.insert(event.stream, pool);
        // Read from the replay's state: right only if its config is the recording's.
        self.assumed_recorded_config = true;
        Ok(())
    }

    /// Under the recorded config, a recorded `oom` on a stream whose last allocation went to
    /// the default pools, after it had allocated in one of the file's private pools (a
    /// `MemPool`, or a graph's pool it captured into; in a trace that starts mid-run and shows
    /// no such allocation, any of the file's `MemPool`s): where the default pools' reading
    /// does not make the releases the trace shows before the `oom` (their OOM path would
    /// release others, or serve the request) and that pool's does (its collection's, with
    /// `release_cached_blocks` skipped while a pool is in use), the job came back to the pool
    /// (`use_mem_pool` again, or another capture into the same pool) and asked it. Routed
    /// there from [`Engine::end_run`], once the walk order of the run's completions is set
    /// and before the run is read, so the run is that malloc's. Read as the default pools',
    /// such an `oom` was replayed as a request served by `release_cached_blocks`: "fits" of a
    /// job that ran out of memory.
    pub(super) fn oom_in_mem_pool_returned_to(&mut self, event: &RawEvent) -> Result<(), String> {
        if !self.recorded_config
            || !self.infer_mem_pools_as_read
            || self.route(event).is_some()
            || self.capture_pools.learned_at(self.index).is_some()
        {
            return Ok(());
        }
        // The pool the stream allocated in last; in a trace that starts mid-run, where the
        // window shows none, any of the file's (its requests there came before the window).
        let candidates = match self.last_private_pool.get(&event.stream) {
            Some(&pool) => vec![pool],
            None if self.started_mid_run => self.routes.mem_pools(),
            None => Vec::new(),
        };
        let candidates: Vec<MemPoolId> = candidates
            .into_iter()
            .filter(|&pool| self.routes.names(pool))
            .collect();
        if candidates.is_empty() {
            return Ok(());
        }
        let recorded = self.run.released.clone();
        let leading: Vec<Allocation> = self.run.leading.iter().map(|&(_, a)| a).collect();
        let makes = |outlook: MallocOutlook| runs_out_releasing(&outlook, &recorded);
        // The default pools' malloc runs `process_events` first, completing finished frees.
        if makes(self.outlook_in(event, None, &[])?)
            || makes(self.outlook_in(event, None, &leading)?)
        {
            return Ok(());
        }
        for pool in candidates {
            if makes(self.outlook_in(event, Some(pool), &leading)?) {
                self.stream_pools.insert(event.stream, pool);
                // Read from the replay's state: right only if its config is the recording's.
                self.assumed_recorded_config = true;
                break;
            }
        }
        Ok(())
    }

    /// The `oom` about to be replayed was asked in a private pool: PyTorch's
    /// `captures_underway` was not empty, so its malloc ran neither `process_events` nor
    /// `release_cached_blocks` (whose `synchronize_and_free_events` is the OOM path's only
    /// way to complete a deferred free). The completions recorded before it, which
    /// [`Engine::end_run`] left for that path, were frees made at once: completed now, each
    /// alone, as the trace shows them. Left pending, they kept the next `empty_cache()` from
    /// being recognised, and a default-pool reading of the `oom` made the job fit.
    fn frees_before_a_pool_oom_were_made_at_once(&mut self) -> Result<(), String> {
        let fail = |error: AllocError| format!("the allocator failed: {error}");
        for (stream, allocation) in std::mem::take(&mut self.run.oom_path_frees) {
            if let Some(at) = self.run.after_release.iter().position(|&s| s == stream) {
                self.run.after_release.remove(at);
            }
            self.allocator
                .synchronize_stream(stream)
                .and_then(|()| self.allocator.complete_free_now(allocation))
                .map_err(fail)?;
        }
        Ok(())
    }

    /// The `MemPool` the allocation `event`, which made new memory where the default cache
    /// would have served it, was asked in, if one is known: the file's pool the stream's last
    /// allocation went to (a `use_mem_pool` block serves its thread until it is left, and a
    /// pool's segments it released before the end are not in the file), else the stream's
    /// current inferred one; but not one whose own cache would have served it (PyTorch would
    /// have taken that block): that was another pool, new to the replay. `None`: a new one.
    fn unshown_mem_pool_for(&mut self, event: &RawEvent) -> Result<Option<MemPoolId>, String> {
        let candidate = match self.stream_pools.get(&event.stream) {
            Some(&pool) if self.routes.names(pool) => Some(pool),
            _ => self.capture_pools.current_mem_pool(event.stream),
        };
        Ok(match candidate {
            Some(pool) if self.outlook_in(event, Some(pool), &[])? != MallocOutlook::Cached => {
                Some(pool)
            }
            _ => None,
        })
    }

    /// Routes the allocation `event` to `pool` ([`Engine::unshown_mem_pool_for`]), or to a
    /// new inferred `MemPool`, claiming its segment (and those its malloc made).
    fn route_unshown_mem_pool(&mut self, event: &RawEvent, pool: Option<MemPoolId>) {
        let addr = event.addr as u64;
        self.capture_route = match pool {
            Some(pool) => self.capture_pools.claim_for(addr, pool),
            None => self.capture_pools.route_new_mem_pool(addr, event.stream),
        };
        if let Some(pool) = self.capture_route {
            self.counts.inferred_pool_allocs += 1;
            self.capture_pools.claim_recent(pool);
            // Read from the replay's state: right only if its config is the recording's.
            self.assumed_recorded_config = true;
        }
    }

    /// The segments the `MemPool`s this replay inferred claimed, by the index of the event
    /// that made each.
    pub fn mem_pool_claims(&self) -> Vec<(u64, MemPoolId)> {
        self.capture_pools.mem_pool_claims()
    }

    /// The `MemPool` claims made at the segments' release, which routed nothing in this
    /// replay.
    pub fn released_mem_pool_claims(&self) -> Vec<(u64, MemPoolId)> {
        self.capture_pools.released_mem_pool_claims()
    }

    /// The `MemPool` claims inferred as the segments were made (none a release made).
    pub fn inferred_mem_pool_claims(&self) -> Vec<(u64, MemPoolId)> {
        self.capture_pools.inferred_mem_pool_claims()
    }

    /// The `MemPool` claims of segments made before event `limit` (those a release made
    /// included).
    pub fn mem_pool_claims_before(&self, limit: u64) -> Vec<(u64, MemPoolId)> {
        self.capture_pools.mem_pool_claims_before(limit)
    }

    /// The `MemPool` claims of segments made before event `limit`, less those made at
    /// releases read after the run of releases that met it (read from a state gone astray).
    pub(in crate::snapshot::replay) fn mem_pool_claims_read_in_time(
        &self,
        limit: u64,
    ) -> Vec<(u64, MemPoolId)> {
        self.capture_pools.mem_pool_claims_read_in_time(limit)
    }

    /// Takes a self-replay's `MemPool` claims: for a replay under
    /// another config than the recorded one, which cannot infer them itself.
    pub fn learn_mem_pools(&mut self, claims: &[(u64, MemPoolId)]) {
        self.capture_pools.learn(claims);
    }
}
