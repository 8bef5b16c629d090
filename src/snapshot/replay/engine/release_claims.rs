//! Segments a run's releases show to have been a `MemPool`'s where the replay held them
//! elsewhere (the file's end no longer shows them): claimed for that pool by the event that
//! made each, so that a replay that learns from this one routes them there from the start.

use super::runs::{runs_out_releasing, Run};
use super::Engine;
use crate::alloc::outlook::{MallocOutlook, ReleasedSegment};
use crate::alloc::{Allocation, MemPoolId};
use crate::snapshot::pickle::RawEvent;

// Named in doc links only.
#[cfg(doc)]
use super::super::captures::CapturePools;

impl Engine {
    /// A run of releases right before a malloc asked in the inferred `MemPool` `pool`: a
    /// malloc in a private pool releases the pool's own cached blocks
    /// (`release_available_cached_blocks`: oversize blocks, under `max_split_size_mb`) and
    /// what garbage collection takes from the default large pool, and skips
    /// `release_cached_blocks` (PyTorch's `captures_underway` is not empty). Unless garbage
    /// collection in the pool's malloc makes exactly the run's releases, the segments after
    /// those a whole `empty_cache()` would release now, in its order (a call the job made
    /// just before; all of them, or none) were a private pool's, claimed for `pool` by the
    /// event that made each ([`CapturePools::claim_made`]): a self-replay that learns from
    /// this one routes them from the start. Either:
    /// - every one is a segment `release_available_cached_blocks` could release, of the asked
    ///   pool, of the default pools as the replay holds them, or of a `MemPool` the replay
    ///   inferred that the file does not name (a stand-in it made up for a pool request that
    ///   made new memory beside a default free block, before anything told which pool it
    ///   was): they were the asked pool's all along, its malloc's own release taking them (an
    ///   inferred pool's `emptyCache(pool)` would not release beside the asked pool's);
    /// - or every one is a segment the replay holds in the default pools, and no segment event
    ///   has differed yet: they were a private pool's, whose requests made new memory where
    ///   the default pools would have too, which nothing told before (a `MemPool` the job
    ///   destroyed, or the asked one). Once an event differed, the replay's state no longer
    ///   tells whether a whole `empty_cache()` made them (its segments and the recording's
    ///   part ways), and a call the job made is the likelier reading.
    pub(super) fn claim_released_by_pool_malloc(
        &mut self,
        run: &Run,
        event: &RawEvent,
    ) -> Result<(), String> {
        if !self.recorded_config
            || !self.infer_mem_pools_as_read
            || run.releases == 0
            || run.capture
            || run.empty_cache_frame
            || run.freed_at.len() != run.released.len()
        {
            return Ok(());
        }
        let Some(pool) = self.asked_in_a_mem_pool(event) else {
            return Ok(());
        };
        let leading: Vec<Allocation> = run.leading.iter().map(|&(_, a)| a).collect();
        let outlook = self.outlook_in(event, Some(pool), &leading)?;
        if let MallocOutlook::Collect(sizes) = &outlook {
            if *sizes == run.released {
                return Ok(());
            }
        }
        // Served from the pool's cache or by new memory with every released segment still
        // held: the malloc released nothing (PyTorch releases only on a failed `cudaMalloc`,
        // or by garbage collection, which `Collect` tells).
        let released_nothing = matches!(outlook, MallocOutlook::Cached | MallocOutlook::NewMemory);
        // A whole `empty_cache()` (a call the job made) releases the run's first segments, or
        // all of them, in its order: those are its, and only the rest can be the pool's
        // malloc's own (`release_available_cached_blocks`, finding no single block large
        // enough, releases the largest first, where the call walks each pool by size).
        let by_empty_cache = if self.leaves_a_free_pending(run.leading.len()) {
            0
        } else {
            let order = self.empty_cache_addresses();
            (1..=run.freed_at.len())
                .rev()
                .find(|&count| run.freed_at[..count] == order[..])
                .unwrap_or(0)
        };
        let own = &run.released[by_empty_cache..];
        // The replay's state tells a whole `empty_cache()` only while it is the recording's:
        // once a segment event differed, only releases the malloc itself could make are read.
        let default_only =
            !own.is_empty() && own.iter().all(|segment| segment.pool == MemPoolId::DEFAULT);
        let as_recorded = self.segments.first_difference.is_none();
        let readable = self.released_by_own_pool_malloc(own, pool) || (default_only && as_recorded);
        if !readable {
            return Ok(());
        }
        // Segments the malloc did not release, of no whole `empty_cache()`: a `MemPool` the
        // job destroyed right before (its `emptyCache(pool)`), never the asked one, which is
        // still in use. Claimed for a pool of their own, gone by now.
        let claimant = if released_nothing && default_only {
            self.capture_pools.new_gone_mem_pool()
        } else {
            pool
        };
        // The whole call's other segments, which the replay holds in the default pools: the
        // reading rests on them (had one been a pool's, the call would read otherwise).
        let beside: Vec<u64> = self
            .default_segments_a_whole_call_releases()
            .into_iter()
            .filter(|base| !run.freed_at.contains(base))
            .filter_map(|base| self.made_at.get(&base).copied())
            .collect();
        for made in run.released_made.iter().skip(by_empty_cache).flatten() {
            self.capture_pools.claim_made(*made, claimant, self.index);
            for &held in &beside {
                self.capture_pools.released_read_beside(*made, held);
            }
        }
        Ok(())
    }

    /// Whether the run of releases before a malloc asked in `pool` can be that malloc's own
    /// `release_available_cached_blocks` ([`Engine::claim_released_by_pool_malloc`]) though
    /// the replay holds some of its segments elsewhere: each is `pool`'s, the default pools'
    /// or an inferred `MemPool`'s the file does not name, at least one is not `pool`'s, and
    /// each is oversize under `max_split_size_mb` (the only blocks that call releases).
    fn released_by_own_pool_malloc(&self, released: &[ReleasedSegment], pool: MemPoolId) -> bool {
        let config = self.allocator.config();
        let stand_in = |of: MemPoolId| {
            of == MemPoolId::DEFAULT
                || (self.capture_pools.is_mem_pool(of) && !self.routes.names(of))
        };
        config.has_split_limit()
            && released.iter().any(|segment| segment.pool != pool)
            && released.iter().all(|segment| {
                (segment.pool == pool || stand_in(segment.pool))
                    && segment.size >= config.max_split_size
            })
    }

    /// The `MemPool` the malloc of `event` was asked in, if it was asked in one: a pool the
    /// replay inferred, or one the file's segments name under an id users make, `(0, n)`
    /// (`torch.cuda.MemPool()`, and `graph_pool_handle()`, whose pools captures share; a
    /// capture's own pool is `(n, 0)`) where no sign tells a capture (its frames, or
    /// `torch.cuda.graph`'s capture stream).
    fn asked_in_a_mem_pool(&self, event: &RawEvent) -> Option<MemPoolId> {
        let pool = self.route(event)?;
        let captured = event.signs.graph_capture || self.capture_stream == Some(event.stream);
        let named = pool.first == 0 && self.routes.names(pool) && !captured;
        (self.capture_pools.is_mem_pool(pool) || named).then_some(pool)
    }

    /// A run read as a whole `empty_cache()` that releases just the segments that call would
    /// release in the replay, but not in its order: PyTorch's walks the default pools first
    /// (large, then small, each by size and address) and then each freeable private pool, so
    /// the segments from the first one out of that order on were a private pool's, gone
    /// before the call (a `MemPool` destroyed while a tensor still held its memory, which the
    /// file's end no longer shows). Claimed for a new inferred `MemPool` by the event that
    /// made each: a replay that learns from this one holds them there from the start, and the
    /// claims stand only if that replay reproduces the recording (a tail of several pools'
    /// segments does not).
    pub(super) fn claim_released_out_of_order(&mut self, run: &Run) {
        if !self.recorded_config
            || !self.infer_mem_pools_as_read
            || run.capture
            || run.freed_at.len() != run.released.len()
            || run.released_made.len() != run.released.len()
            || run
                .released
                .iter()
                .any(|segment| segment.pool != MemPoolId::DEFAULT)
        {
            return;
        }
        let order = self.empty_cache_addresses();
        let places: Option<Vec<usize>> = run
            .freed_at
            .iter()
            .map(|address| order.iter().position(|at| at == address))
            .collect();
        let Some(places) = places.filter(|places| places.len() == order.len()) else {
            return;
        };
        let Some(first_out) = places.windows(2).position(|pair| pair[1] < pair[0]) else {
            return;
        };
        let made: Option<Vec<u64>> = run.released_made[first_out + 1..].iter().copied().collect();
        let Some(made) = made else {
            return;
        };
        let pool = self.capture_pools.new_mem_pool(0);
        self.capture_pools.make_freeable(pool);
        for index in made {
            self.capture_pools.claim_made(index, pool, self.index);
        }
    }

    /// A run of releases that begins with the `own` segments of the `MemPool` `pool` (its
    /// `emptyCache(pool)`) and goes on with segments no pool claimed, of sizes that go on
    /// growing as the pool's own did: the pool's walk of its cached blocks (small, then large,
    /// each by size), so its segments too, which the replay had not known to be (they made new
    /// memory where the default pools' cache would not have served either). Unless they are
    /// just what a whole `empty_cache()` would release now (every whole cached segment of the
    /// default pools, and of freeable pools): then they read as that call's, made after the
    /// pool's. Claimed for `pool` by the event that made each ([`CapturePools::claim_made`]):
    /// this replay goes on as it read the run, and a replay that learns from it routes them
    /// from the start.
    pub(super) fn claim_released_after(&mut self, run: &Run, own: usize, pool: MemPoolId) {
        if own >= run.released.len() || run.freed_at.len() != run.released.len() {
            return;
        }
        if self.whole_empty_cache_releases(&run.freed_at[own..]) && !self.leaves_a_free_pending(0) {
            return;
        }
        let mut smallest = run.released[..own]
            .iter()
            .map(|segment| segment.size)
            .max()
            .unwrap_or(0);
        for (segment, made) in run.released[own..]
            .iter()
            .zip(run.released_made[own..].iter())
        {
            let Some(made) = *made else {
                break;
            };
            if segment.pool != MemPoolId::DEFAULT || segment.size < smallest {
                break;
            }
            smallest = segment.size;
            self.capture_pools.claim_made(made, pool, self.index);
        }
    }

    /// Under the recorded config, an `oom` neither reading of [`Engine::oom_in_default_pools`]
    /// explains: the pool's OOM path would not make the recorded releases (default segments
    /// it cannot release: it releases only that pool's oversize blocks, and garbage
    /// collection's; or its own oversize blocks the trace does not show released), and the
    /// default pools' path would make them and release more whole cached segments
    /// (`release_cached_blocks` releases every one, once the pending frees complete). If those
    /// others are segments the file's end does not show in the default pools, they were a
    /// private pool's the replay could not tell (the file no longer shows them): the `oom` was
    /// asked in the default pools, and they are claimed for the pool the stream allocated to
    /// last where it is a `MemPool`, else for one the file does not name
    /// ([`CapturePools::claim_made`]), for the next pass to hold there from the start.
    pub(super) fn claim_unreleased_by_default_oom(
        &mut self,
        stream_pool: Option<MemPoolId>,
        recorded: &[ReleasedSegment],
    ) -> bool {
        if !self.recorded_config
            || !self.infer_mem_pools_as_read
            || self.run.freed_at.len() != recorded.len()
            || recorded.iter().any(|segment| !segment.pool.is_default())
        {
            return false;
        }
        let whole = self.default_segments_a_whole_call_releases();
        if !self.run.freed_at.iter().all(|freed| whole.contains(freed)) {
            return false;
        }
        let others: Vec<u64> = whole
            .into_iter()
            .filter(|base| !self.run.freed_at.contains(base))
            .collect();
        let mut made = Vec::with_capacity(others.len());
        for base in &others {
            match self.made_at.get(base) {
                Some(&index) if !self.routes.in_default_segment(*base, index) => made.push(index),
                _ => return false,
            }
        }
        if made.is_empty() {
            return false;
        }
        let mem_pool = stream_pool.filter(|&pool| {
            self.capture_pools.is_mem_pool(pool) || (pool.first == 0 && self.routes.names(pool))
        });
        let pool = match mem_pool {
            Some(pool) => pool,
            None => self.capture_pools.new_unfed_mem_pool(),
        };
        for index in made {
            self.capture_pools.claim_made(index, pool, self.index);
        }
        // Read from the replay's state: right only if its config is the recording's.
        self.assumed_recorded_config = true;
        true
    }

    /// An `oom` asked in the default pools (its stream's last allocation went there too, or
    /// [`Engine::oom_in_default_pools`] read it so) whose OOM path, on the replay's state,
    /// would not make the recorded releases, with or
    /// without the run's leading completions done first: where the default pools hold cached
    /// segments the file's end does not show there, and those are all that a whole
    /// `release_cached_blocks` would release beyond the recorded ones, they were a private
    /// pool's the replay could not tell ([`Engine::claim_unreleased_by_default_oom`]). Held in
    /// the default pools they also mislead the reading: an oversize one is
    /// `release_available_cached_blocks`' to release, after which the request fits, so the
    /// run read as an `empty_cache()` that released it too, and the replay said the job fit.
    pub(super) fn claim_kept_by_a_default_oom(&mut self, event: &RawEvent) -> Result<(), String> {
        if self.run.releases == 0 || self.route(event).is_some() {
            return Ok(());
        }
        let recorded = self.run.released.clone();
        let leading: Vec<Allocation> = self.run.leading.iter().map(|&(_, a)| a).collect();
        if runs_out_releasing(&self.outlook_in(event, None, &[])?, &recorded)
            || runs_out_releasing(&self.outlook_in(event, None, &leading)?, &recorded)
        {
            return Ok(());
        }
        let stream_pool = self.stream_pools.get(&event.stream).copied();
        self.claim_unreleased_by_default_oom(stream_pool, &recorded);
        Ok(())
    }
}
