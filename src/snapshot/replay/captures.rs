//! Private pools that the file's end no longer shows: CUDA-graph captures', and `MemPool`s'
//! (see [`CapturePools::route_new_mem_pool`]).
//!
//! A 2.11 trace names no pool; the replay learns private pools from the segments still held
//! at the file's end (`segment_pool_id`, [`super::engine::PoolRoutes`]). A graph deleted
//! while the job ran (an inference server evicting a batch size's graph) leaves nothing
//! there: its pool became freeable, and an `empty_cache()` or an OOM path's
//! `release_cached_blocks` released its segments. Its allocations were still made in a
//! private pool, whose blocks PyTorch's garbage collection and
//! `release_available_cached_blocks` never touch and whose cached segments no default-pool
//! request can use; held in the default pools, the replay would release or reuse them.
//!
//! The allocations' frames and streams tell a capture underway (the engine's `see_capture`),
//! and the trace's segment events tell which memory each capture made. So an allocation made
//! in a capture that no file segment routes goes to a pool of the capture's own:
//! - the pool that owns the recorded segment it lies in (a later capture sharing an earlier
//!   one's pool, `torch.cuda.graph(pool=...)`, reuses that pool's blocks);
//! - else, in a segment recorded since the capture began and claimed by no pool, the pool of
//!   the capture (a new one at its first such allocation), which claims that segment;
//! - else (a segment made before the capture by another pool) no pool: what the replay did
//!   before it knew of such pools.
//!
//! Such a pool becomes freeable (the graph's `releasePool`: PyTorch releases a private pool's
//! cached segments only then, by an `empty_cache()` or an OOM path) where the trace shows the
//! graph went away: when the last of its blocks is freed outside a capture into it (a graph's
//! outputs live as long as the graph: the job drops them with it), or, at the latest, when the
//! trace releases one of its segments, before the run that released it is replayed.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::alloc::MemPoolId;

/// The first graph-pool id given to an inferred pool: far above the ids a process hands out
/// (`graph_pool_handle()` counts from 1), so never one the file's segments name.
const FIRST_INFERRED_ID: u64 = 1 << 62;

/// Whether `pool` is a `MemPool` a replay made up ([`CapturePools::new_mem_pool`]): a stand-in
/// for a pool of the job's that nothing had named yet, which may turn out to be one the file
/// names.
pub(super) fn is_stand_in(pool: MemPoolId) -> bool {
    pool.first == 0 && pool.second > FIRST_INFERRED_ID
}

/// A recorded segment: where it ends, when it was made, and the inferred pool that claimed it.
#[derive(Debug, Clone, Copy)]
struct RecordedSegment {
    end: u64,
    made: u64,
    pool: Option<MemPoolId>,
}

/// The pools inferred from captures, and the recorded segments they own.
#[derive(Debug, Default)]
pub(super) struct CapturePools {
    /// Every segment the trace made and has not released, by base address.
    segments: BTreeMap<u64, RecordedSegment>,
    /// By recorded stream: the event index its current capture began at, and that capture's
    /// pool once an allocation named one.
    captures: HashMap<i64, (u64, Option<MemPoolId>)>,
    /// Pools made freeable (the graph went away).
    freeable: HashSet<MemPoolId>,
    /// The recorded addresses of the live allocations routed to an inferred pool.
    live: HashMap<u64, MemPoolId>,
    /// By inferred pool: how many of its allocations are live.
    live_count: HashMap<MemPoolId, u64>,
    /// Pools inferred so far.
    made: u64,
    /// Allocations routed to an inferred pool.
    pub routed: u64,
    /// The inferred pools that stand for a `MemPool` (see [`CapturePools::route_new_mem_pool`]).
    mem_pools: HashSet<MemPoolId>,
    /// By recorded stream: the inferred `MemPool` its last such allocation went to.
    mem_current: HashMap<i64, MemPoolId>,
    /// Bases of the segments recorded since the last request (made by the next malloc).
    recent: Vec<u64>,
    /// The segments inferred `MemPool`s claimed: (index of the event that made each, pool).
    claims: Vec<(u64, MemPoolId)>,
    /// The segments found to be inferred `MemPool`s' only when they were released
    /// ([`CapturePools::claim_made`]): (index of the event that made each, pool).
    released_claims: Vec<(u64, MemPoolId)>,
    /// For each of `released_claims`, the index of the event being replayed when it was
    /// made: what the replay's state was then.
    released_at: Vec<u64>,
    /// Claims a self-replay of the same trace made ([`CapturePools::learn`]), by the index
    /// of the event that made the segment.
    learned: HashMap<u64, MemPoolId>,
    /// Claims read from the default pools' state ([`CapturePools::passed_over`],
    /// [`CapturePools::read_beside`]): (index of the event that made the claimed segment or
    /// asked the claimed request, index of the event that made a default-held segment the
    /// reading depended on).
    passed_over: Vec<(u64, u64)>,
    /// Claims made at releases read from the default pools' state
    /// ([`CapturePools::released_read_beside`]): (index of the event that made the claimed
    /// segment, index of the event that made a default-held segment the reading depended on).
    released_beside: Vec<(u64, u64)>,
}

impl CapturePools {
    /// The trace made a segment at `[base, base + size)`, at event `index`; `mapped`: pages
    /// mapped into an expandable segment (`segment_map`), which belong to the pool of the
    /// pages mapped right beside them. An expandable segment reserves its address range once
    /// and maps pages at the end of (or into a hole of) what it mapped before, and no other
    /// segment lies in its reservation: a pool that claimed those pages owns these too. Two
    /// `cudaMalloc` segments side by side tell nothing of each other.
    pub fn segment_made(&mut self, base: u64, size: u64, index: u64, mapped: bool) {
        self.recent.push(base);
        let end = base.saturating_add(size);
        let pool = self.learned.get(&index).copied().or_else(|| {
            if !mapped {
                return None;
            }
            let below = self
                .segments
                .range(..base)
                .next_back()
                .filter(|(_, segment)| segment.end == base);
            let above = self.segments.get(&end);
            below
                .and_then(|(_, segment)| segment.pool)
                .or_else(|| above.and_then(|segment| segment.pool))
        });
        if let Some(pool) = pool.filter(|pool| self.mem_pools.contains(pool)) {
            if !self.learned.contains_key(&index) {
                self.claims.push((index, pool));
            }
        }
        self.segments.insert(
            base,
            RecordedSegment {
                end,
                made: index,
                pool,
            },
        );
    }

    /// The trace released the segment at `base` (or unmapped `[base, base + size)` of an
    /// expandable one: every mapped range recorded in it goes): the inferred pool that owned
    /// it, if any, and whether this release is the first sign that the pool became freeable.
    /// Never so for a `MemPool`: its own malloc's OOM path releases its cached blocks while
    /// the job holds it (`release_available_cached_blocks`), which the malloc after the run
    /// tells (the engine's `end_run`).
    pub fn segment_freed(&mut self, base: u64, size: u64) -> Option<(MemPoolId, bool)> {
        let end = base.saturating_add(size.max(1));
        let gone: Vec<u64> = self.segments.range(base..end).map(|(&at, _)| at).collect();
        let mut owner = None;
        for at in gone {
            if let Some(pool) = self.segments.remove(&at).and_then(|segment| segment.pool) {
                owner.get_or_insert(pool);
            }
        }
        let pool = owner?;
        if self.mem_pools.contains(&pool) {
            return Some((pool, false));
        }
        Some((pool, self.make_freeable(pool)))
    }

    /// The job dropped the allocation recorded at `addr`: the inferred capture pool it was
    /// routed to, when that pool has no live allocation left (and is not freeable yet). Never
    /// a `MemPool`'s: a job empties a `MemPool` and fills it again while it holds it.
    pub fn freed(&mut self, addr: u64) -> Option<MemPoolId> {
        let pool = self.live.remove(&addr)?;
        let count = self.live_count.entry(pool).or_insert(1);
        *count = count.saturating_sub(1);
        (*count == 0 && !self.freeable.contains(&pool) && !self.mem_pools.contains(&pool))
            .then_some(pool)
    }

    /// Whether `pool` is an inferred `MemPool` ([`CapturePools::route_new_mem_pool`]).
    pub fn is_mem_pool(&self, pool: MemPoolId) -> bool {
        self.mem_pools.contains(&pool)
    }

    /// The inferred pool that claimed the recorded segment holding `addr`, for an allocation
    /// no frame shows in a capture: PyTorch puts no other pool's block in a pool's segment.
    /// `None` where no inferred pool claimed it, or the pool is freeable.
    pub fn claimed(&mut self, addr: u64) -> Option<MemPoolId> {
        let pool = self.segment_at(addr)?.1.pool?;
        self.route_to(addr, pool)
    }

    /// Whether the recorded segment holding `addr` was made after event `after` and no pool
    /// claimed it: the memory the malloc recorded at `addr` made for itself.
    pub fn made_unclaimed_after(&self, addr: u64, after: u64) -> bool {
        self.segment_at(addr)
            .is_some_and(|(_, segment)| segment.made > after && segment.pool.is_none())
    }

    /// A new inferred `MemPool` for an allocation at `addr` on `stream` that made a new
    /// segment although the default pools' cache would have served it, and the pool the
    /// stream allocated to before (if any) too, as the replay (under the recorded config, in
    /// the recording's state) finds: PyTorch's malloc looked in a private pool that no frame
    /// names and that held no block for it, a `MemPool` the job allocated to (`use_mem_pool`),
    /// gone by the file's end. It claims the segment, and is the stream's current one.
    pub fn route_new_mem_pool(&mut self, addr: u64, stream: i64) -> Option<MemPoolId> {
        self.segment_at(addr)?;
        let pool = self.new_mem_pool(stream);
        self.claim_for(addr, pool)
    }

    /// A new inferred `MemPool`, `stream`'s current one from now on.
    pub fn new_mem_pool(&mut self, stream: i64) -> MemPoolId {
        let pool = self.new_unfed_mem_pool();
        self.mem_current.insert(stream, pool);
        pool
    }

    /// A new inferred `MemPool` that went away already (its released segments tell it, and
    /// no stream allocates to it any more): freeable, and no stream's current one.
    pub fn new_gone_mem_pool(&mut self) -> MemPoolId {
        let pool = self.new_unfed_mem_pool();
        self.freeable.insert(pool);
        pool
    }

    /// A new inferred `MemPool` id, known as a `MemPool`, that no stream allocates to from
    /// now on: one the replay learns of from its cached segments alone.
    pub fn new_unfed_mem_pool(&mut self) -> MemPoolId {
        self.made += 1;
        let pool = MemPoolId::new(0, FIRST_INFERRED_ID + self.made);
        self.mem_pools.insert(pool);
        pool
    }

    /// The request recorded at event `index` (an `oom`, which records no address) was asked
    /// in `pool`: a claim for a replay that learns from this one.
    pub fn claim_request(&mut self, index: u64, pool: MemPoolId) {
        self.claims.push((index, pool));
    }

    /// The pool a replay this one learnt from found the request or segment of event `index`
    /// in, if any.
    pub fn learned_at(&self, index: u64) -> Option<MemPoolId> {
        self.learned.get(&index).copied()
    }

    /// Claims the recorded segment holding `addr` for `pool`, a `MemPool` known already (the
    /// stream's current inferred one, or one the file names) whose malloc made it, gone by
    /// the end. Taken as a `MemPool` from then on (its emptying is its own
    /// `emptyCache(pool)`), and learnt as such.
    pub fn claim_for(&mut self, addr: u64, pool: MemPoolId) -> Option<MemPoolId> {
        let (base, _) = self.segment_at(addr)?;
        self.mem_pools.insert(pool);
        if let Some(claimed) = self.segments.get_mut(&base) {
            claimed.pool = Some(pool);
            self.claims.push((claimed.made, pool));
        }
        self.route_to(addr, pool)
    }

    /// Takes the segment made at event `made`, released already, to have been `pool`'s: a
    /// claim for a replay that learns from this one ([`CapturePools::mem_pool_claims`]).
    pub fn claim_made(&mut self, made: u64, pool: MemPoolId, at: u64) {
        if !self
            .released_claims
            .iter()
            .any(|&(claimed, _)| claimed == made)
        {
            self.released_claims.push((made, pool));
            self.released_at.push(at);
        }
    }

    /// The inferred `MemPool` `stream` allocated to last, if it is still in use.
    pub fn current_mem_pool(&self, stream: i64) -> Option<MemPoolId> {
        self.mem_current
            .get(&stream)
            .copied()
            .filter(|pool| !self.freeable.contains(pool))
    }

    /// The recorded segment holding `addr`, with its base.
    fn segment_at(&self, addr: u64) -> Option<(u64, RecordedSegment)> {
        let (&base, &segment) = self.segments.range(..=addr).next_back()?;
        (addr < segment.end).then_some((base, segment))
    }

    /// Routes the allocation at `addr` to `pool` unless it is freeable, counting it live.
    fn route_to(&mut self, addr: u64, pool: MemPoolId) -> Option<MemPoolId> {
        if self.freeable.contains(&pool) {
            return None;
        }
        self.routed += 1;
        if let Some(previous) = self.live.insert(addr, pool) {
            // An address allocated again without a free (a malformed trace): counted once.
            if let Some(count) = self.live_count.get_mut(&previous) {
                *count = count.saturating_sub(1);
            }
        }
        *self.live_count.entry(pool).or_insert(0) += 1;
        Some(pool)
    }

    /// An event other than a segment's: segments recorded after it are the next malloc's.
    pub fn request_seen(&mut self) {
        self.recent.clear();
    }

    /// The malloc just routed to `pool` made the segments recorded since the last request
    /// (an expandable segment's pages mapped in pieces): each unclaimed one is `pool`'s.
    pub fn claim_recent(&mut self, pool: MemPoolId) {
        let mem_pool = self.mem_pools.contains(&pool);
        for base in self.recent.drain(..) {
            if let Some(segment) = self.segments.get_mut(&base) {
                if segment.pool.is_none() {
                    segment.pool = Some(pool);
                    if mem_pool {
                        self.claims.push((segment.made, pool));
                    }
                }
            }
        }
    }

    /// The segments inferred `MemPool`s claimed so far, each by the index of the event that
    /// made it: what a replay under another config takes from a self-replay
    /// ([`CapturePools::learn`]).
    pub fn mem_pool_claims(&self) -> Vec<(u64, MemPoolId)> {
        self.claims_before(u64::MAX, false, false)
    }

    /// The claims made at the segments' release ([`CapturePools::claim_made`]).
    pub fn released_mem_pool_claims(&self) -> Vec<(u64, MemPoolId)> {
        self.released_claims.clone()
    }

    /// The claims inferred as the segments were made (no claim a release made).
    pub fn inferred_mem_pool_claims(&self) -> Vec<(u64, MemPoolId)> {
        self.claims.clone()
    }

    /// The segment the allocation at `addr` lies in, just claimed for a `MemPool` because
    /// the default pools would have served the request from a free block in the segment made
    /// at event `serving` (the trace shows new memory): if a release later shows that segment
    /// to be a pool's ([`CapturePools::claim_made`]), the default pools never held the block,
    /// and this claim was read from a wrong state.
    pub fn passed_over(&mut self, addr: u64, serving: u64) {
        if let Some((_, segment)) = self.segment_at(addr) {
            self.passed_over.push((segment.made, serving));
        }
    }

    /// The claim of event `claimed` (a request's, [`CapturePools::claim_request`]) was read
    /// from the default pools' state while they held the segment made at event `held`: if a
    /// release later shows that segment to be a pool's ([`CapturePools::claim_made`]), the
    /// default pools never held it, and the claim is not trusted
    /// ([`CapturePools::mem_pool_claims_before`]).
    pub fn read_beside(&mut self, claimed: u64, held: u64) {
        self.passed_over.push((claimed, held));
    }

    /// The claim of the segment made at event `claimed`, made at its release
    /// ([`CapturePools::claim_made`]), was read from the default pools' state while they held
    /// the segment made at event `held` (a whole `empty_cache()` would have released it too,
    /// and the trace shows no such release): if a release later shows that segment to be a
    /// pool's, the default pools never held it, the run reads otherwise (the job's own call),
    /// and the claim is not trusted ([`CapturePools::mem_pool_claims_before`]).
    pub fn released_read_beside(&mut self, claimed: u64, held: u64) {
        self.released_beside.push((claimed, held));
    }

    /// [`CapturePools::mem_pool_claims`], less those of segments made at or after event
    /// `limit`: a replay whose state stopped being the recording's there claimed them from a
    /// wrong state. Segments made before it and claimed at their release later stand: the
    /// trace's own releases showed them (their pool made new memory where the default pools
    /// would have too, so the replay could not tell as they were made). Less, too, the claims
    /// inferred because the default pools would have served a request from a block whose
    /// segment a release then claimed ([`CapturePools::passed_over`]), and the claims made at
    /// releases read beside a segment a release read in time then claimed
    /// ([`CapturePools::released_read_beside`]): a pass that knows that segment's pool from the
    /// start infers again what still holds.
    pub fn mem_pool_claims_before(&self, limit: u64) -> Vec<(u64, MemPoolId)> {
        self.claims_before(limit, true, false)
    }

    /// [`CapturePools::mem_pool_claims_before`], less the claims made at releases read after
    /// the first run of releases read at or after event `limit` (the run that met the first
    /// difference): those later runs were read from a state that difference had led astray.
    /// What a learning pass retreats to when the claims it learnt from all releases led the
    /// next pass astray sooner.
    pub fn mem_pool_claims_read_in_time(&self, limit: u64) -> Vec<(u64, MemPoolId)> {
        self.claims_before(limit, true, true)
    }

    /// The claims of segments made before event `limit`, less those read beside a block a
    /// release then claimed where `trusted` ([`CapturePools::mem_pool_claims_before`]), and
    /// those released too late where `in_time` ([`CapturePools::mem_pool_claims_read_in_time`]).
    fn claims_before(&self, limit: u64, trusted: bool, in_time: bool) -> Vec<(u64, MemPoolId)> {
        let misread = |made: u64| {
            trusted
                && self.passed_over.iter().any(|&(claimed, serving)| {
                    claimed == made && self.released_claims.iter().any(|&(at, _)| at == serving)
                })
        };
        let first_read_after = self
            .released_at
            .iter()
            .copied()
            .filter(|&at| at >= limit)
            .min();
        let in_time_at = |at: u64| at < limit || Some(at) == first_read_after;
        let read_in_time = |at: u64| !in_time || in_time_at(at);
        // A release read in time showed the segment made at `held` to be a pool's (one read
        // later came from a state the first difference had led astray, and tells nothing).
        let shown_a_pools = |held: u64| {
            self.released_claims
                .iter()
                .zip(&self.released_at)
                .any(|(&(made, _), &at)| made == held && in_time_at(at))
        };
        let misread_at_release = |made: u64| {
            trusted
                && self
                    .released_beside
                    .iter()
                    .any(|&(claimed, held)| claimed == made && shown_a_pools(held))
        };
        let released = self
            .released_claims
            .iter()
            .zip(&self.released_at)
            .filter(|&(&(made, _), &at)| read_in_time(at) && !misread_at_release(made))
            .map(|(claim, _)| claim);
        let mut claims: Vec<(u64, MemPoolId)> = Vec::new();
        let inferred = self.claims.iter().filter(|&&(made, _)| !misread(made));
        for &(made, pool) in inferred.chain(released) {
            if made < limit && !claims.iter().any(|&(at, _)| at == made) {
                claims.push((made, pool));
            }
        }
        claims
    }

    /// Takes the `MemPool` claims of a self-replay of the same trace: the segment the trace
    /// makes at each of those events belongs to that pool from the start. A replay under
    /// another config cannot infer a `MemPool` itself (its state is not the recording's), but
    /// which recorded segments were a `MemPool`'s is a fact of the recording.
    pub fn learn(&mut self, claims: &[(u64, MemPoolId)]) {
        for &(made, pool) in claims {
            self.learned.insert(made, pool);
            self.mem_pools.insert(pool);
            // A pool this replay infers itself gets an id of its own, not a learnt one's.
            if is_stand_in(pool) {
                self.made = self.made.max(pool.second - FIRST_INFERRED_ID);
            }
        }
    }

    /// Marks `pool` freeable; whether it was not already.
    pub fn make_freeable(&mut self, pool: MemPoolId) -> bool {
        self.freeable.insert(pool)
    }

    /// The inferred pool the capture underway on `stream` allocates to, once known.
    pub fn capturing_into(&self, stream: i64) -> Option<MemPoolId> {
        self.captures.get(&stream).and_then(|&(_, pool)| pool)
    }

    /// A capture begins on `stream` at event `index`: its pool is not known yet.
    pub fn capture_begins(&mut self, stream: i64, index: u64) {
        self.captures.insert(stream, (index, None));
    }

    /// The pool of an allocation at `addr` made in a capture on `stream` that no file
    /// segment routes (see the module's rules), claiming its segment for the capture's pool
    /// when it was made since the capture began. `None`: no pool (the allocation lies in no
    /// recorded segment, or in one made before the capture by no inferred pool, or in a pool
    /// already freeable, which PyTorch never allocates to again).
    pub fn route(&mut self, addr: u64, stream: i64) -> Option<MemPoolId> {
        let (&base, segment) = self.segments.range(..=addr).next_back()?;
        if addr >= segment.end {
            return None;
        }
        let pool = match segment.pool {
            Some(owner) => owner,
            None => {
                // A capture whose beginning the trace does not show (it began before the
                // window, or on a stream whose allocations all read as captured) begins here.
                let (began, current) = *self.captures.entry(stream).or_insert((segment.made, None));
                if segment.made < began {
                    return None;
                }
                let pool = current.unwrap_or_else(|| {
                    self.made += 1;
                    MemPoolId::new(FIRST_INFERRED_ID + self.made, 0)
                });
                if let Some(claimed) = self.segments.get_mut(&base) {
                    claimed.pool = Some(pool);
                }
                pool
            }
        };
        if self.freeable.contains(&pool) {
            return None;
        }
        // A capture that reuses a pool's blocks is that pool's capture from here on.
        if let Some(capture) = self.captures.get_mut(&stream) {
            capture.1 = Some(pool);
        }
        self.route_to(addr, pool)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// Pools that saw a 20 MiB `cudaMalloc` segment made at each (event, base) of `made`.
    fn with_segments(made: &[(u64, u64)]) -> CapturePools {
        let mut pools = CapturePools::default();
        for &(index, base) in made {
            pools.segment_made(base, 20 * MIB, index, false);
        }
        pools
    }

    #[test]
    fn a_claim_read_beside_a_block_a_release_then_claimed_is_not_trusted() {
        let mut pools = CapturePools::default();
        // A pool's segment the replay held in the default pools (made at event 1), and a
        // request beside its free block that made new memory (event 5): read as a pool's.
        pools.segment_made(0x1000_0000, 70 * MIB, 1, false);
        pools.segment_made(0x2000_0000, 58 * MIB, 5, false);
        let stand_in = pools.route_new_mem_pool(0x2000_0000, 0).expect("claimed");
        pools.passed_over(0x2000_0000, 1);
        assert_eq!(pools.mem_pool_claims_before(u64::MAX), vec![(5, stand_in)]);
        // The release of the first segment in a pool's malloc shows it was that pool's.
        let named = MemPoolId::new(0, 1);
        pools.claim_made(1, named, 7);
        assert_eq!(
            pools.mem_pool_claims_before(u64::MAX),
            vec![(1, named)],
            "the default pools never held the block: the request was read from a wrong state"
        );
        assert_eq!(pools.mem_pool_claims(), vec![(5, stand_in), (1, named)]);
        assert!(is_stand_in(stand_in) && !is_stand_in(named));
    }

    #[test]
    fn an_ooms_pool_read_while_the_default_pools_held_a_pools_segment_is_not_trusted() {
        let mut pools = CapturePools::default();
        // Segments made at events 1 and 4, both held in the default pools by the replay; an
        // `oom` at event 9 read as asked in a pool, from what those pools held.
        pools.segment_made(0x1000_0000, 2 * MIB, 1, false);
        pools.segment_made(0x2000_0000, 20 * MIB, 4, false);
        let stand_in = pools.new_mem_pool(0);
        pools.claim_request(9, stand_in);
        pools.read_beside(9, 1);
        pools.read_beside(9, 4);
        assert_eq!(pools.mem_pool_claims_before(u64::MAX), vec![(9, stand_in)]);
        // A release made by another pool's call shows the small segment was that pool's.
        let other = pools.new_gone_mem_pool();
        pools.claim_made(1, other, 12);
        assert_eq!(
            pools.mem_pool_claims_before(u64::MAX),
            vec![(1, other)],
            "the default pools never held that segment: the `oom` was read from a wrong state"
        );
        // Every claim is still there for a replay under another config to weigh.
        assert_eq!(pools.mem_pool_claims(), vec![(9, stand_in), (1, other)]);
    }

    #[test]
    fn claims_made_at_a_release_read_beside_a_pools_segment_are_not_trusted() {
        // Two default segments released by a run (events 13 and 17) that a whole
        // `empty_cache()` would have walked beside a segment made at event 31, which the
        // replay held in the default pools: read as a destroyed pool's `emptyCache(pool)`.
        let mut pools = with_segments(&[(13, 0x1000_0000), (17, 0x2000_0000), (31, 0x3000_0000)]);
        let gone = pools.new_gone_mem_pool();
        for made in [13, 17] {
            pools.claim_made(made, gone, 38);
            pools.released_read_beside(made, 31);
        }
        assert_eq!(
            pools.mem_pool_claims_before(u64::MAX),
            vec![(13, gone), (17, gone)]
        );
        // A later `oom` shows the segment of event 31 to be a live pool's: the run was the
        // job's own call, and its releases were the default pools'.
        let live = MemPoolId::new(0, 1);
        pools.claim_made(31, live, 47);
        assert_eq!(pools.mem_pool_claims_before(u64::MAX), vec![(31, live)]);
        assert_eq!(
            pools.mem_pool_claims(),
            vec![(13, gone), (17, gone), (31, live)]
        );
        // Read in time too where the pass first differed at event 45 (the `oom`'s is the run
        // that met that difference).
        assert_eq!(pools.mem_pool_claims_before(45), vec![(31, live)]);
    }

    #[test]
    fn a_release_read_after_the_difference_does_not_overturn_an_earlier_claim() {
        let mut pools = with_segments(&[(1, 0x1000_0000), (7, 0x2000_0000), (17, 0x3000_0000)]);
        // A pool's malloc released the segment of event 17 (event 43), read beside the
        // default segments of events 1 and 7; the pass first differed at event 41.
        let pool = MemPoolId::new(0, 1);
        pools.claim_made(17, pool, 43);
        pools.released_read_beside(17, 1);
        pools.released_read_beside(17, 7);
        // A later run (event 54), read from the state that difference led astray, took the
        // two default segments for the pool: it overturns nothing.
        pools.claim_made(1, pool, 54);
        pools.claim_made(7, pool, 54);
        assert_eq!(
            pools.mem_pool_claims_before(41),
            vec![(17, pool), (1, pool), (7, pool)]
        );
        assert_eq!(pools.mem_pool_claims_read_in_time(41), vec![(17, pool)]);
    }

    #[test]
    fn claims_read_at_releases_after_the_run_that_met_the_difference_are_not_in_time() {
        let mut pools = with_segments(&[(1, 0x1000_0000), (3, 0x2000_0000), (5, 0x3000_0000)]);
        let pool = pools.new_gone_mem_pool();
        // Released before the first difference (event 10), at the run that met it (event
        // 12), and at a later run (event 20).
        pools.claim_made(1, pool, 8);
        pools.claim_made(3, pool, 12);
        pools.claim_made(5, pool, 20);
        assert_eq!(
            pools.mem_pool_claims_before(10),
            vec![(1, pool), (3, pool), (5, pool)]
        );
        assert_eq!(
            pools.mem_pool_claims_read_in_time(10),
            vec![(1, pool), (3, pool)],
            "the later run was read from a state the difference had led astray"
        );
        // Made at or after the difference: in neither.
        pools.segment_made(0x4000_0000, 20 * MIB, 11, false);
        pools.claim_made(11, pool, 12);
        assert_eq!(pools.mem_pool_claims_read_in_time(10).len(), 2);
    }

    #[test]
    fn a_capture_claims_the_segments_it_made_and_a_later_capture_shares_them() {
        let mut pools = CapturePools::default();
        pools.segment_made(0x1000_0000, 20 * MIB, 1, false);
        pools.capture_begins(7, 2);
        pools.segment_made(0x2000_0000, 20 * MIB, 3, false);
        // Made before the capture (a default-pool segment): no pool.
        assert_eq!(pools.route(0x1000_0000, 7), None);
        let first = pools.route(0x2000_0000, 7).expect("the capture's segment");
        assert_eq!(pools.route(0x2000_0000 + MIB, 7), Some(first));
        pools.segment_made(0x3000_0000, 20 * MIB, 5, false);
        assert_eq!(pools.route(0x3000_0000, 7), Some(first));
        // A second capture on the same stream, landing in the first one's segment, shares it.
        pools.capture_begins(7, 9);
        assert_eq!(pools.route(0x2000_0000 + 2 * MIB, 7), Some(first));
        assert_eq!(
            pools.segment_freed(0x3000_0000, 20 * MIB),
            Some((first, true))
        );
        assert_eq!(pools.segment_freed(0x1000_0000, 20 * MIB), None);
        assert_eq!(pools.routed, 4);
    }

    #[test]
    fn pages_mapped_beside_a_mem_pools_pages_are_that_pools() {
        let mut pools = CapturePools::default();
        pools.segment_made(0x2000_0000, 60 * MIB, 1, true);
        let pool = pools.route_new_mem_pool(0x2000_0000, 0).expect("claimed");
        // Mapped at the end of the pool's pages (the segment grew), and into the hole between
        // them and pages mapped apart (no pool's when they were mapped): the pool's, learnt
        // by their events.
        pools.segment_made(0x2000_0000 + 60 * MIB, 40 * MIB, 3, true);
        pools.segment_made(0x2000_0000 + 120 * MIB, 20 * MIB, 4, true);
        pools.segment_made(0x2000_0000 + 100 * MIB, 20 * MIB, 5, true);
        for addr in [60, 100].map(|at| 0x2000_0000 + at * MIB) {
            assert_eq!(pools.claimed(addr), Some(pool), "{addr:#x}");
        }
        assert_eq!(pools.claimed(0x2000_0000 + 120 * MIB), None);
        assert_eq!(
            pools.mem_pool_claims(),
            vec![(1, pool), (3, pool), (5, pool)],
            "the lone pages at 120 MiB were mapped before the hole was filled"
        );
        // A `cudaMalloc` segment right beside a pool's says nothing.
        pools.segment_made(0x2000_0000 + 140 * MIB, 20 * MIB, 6, false);
        assert_eq!(pools.claimed(0x2000_0000 + 140 * MIB), None);
    }

    #[test]
    fn a_new_capture_making_new_memory_gets_a_pool_of_its_own() {
        let mut pools = CapturePools::default();
        pools.capture_begins(7, 1);
        pools.segment_made(0x2000_0000, 20 * MIB, 2, false);
        let first = pools.route(0x2000_0000, 7).expect("first");
        pools.capture_begins(7, 3);
        pools.segment_made(0x4000_0000, 20 * MIB, 4, false);
        let second = pools.route(0x4000_0000, 7).expect("second");
        assert_ne!(first, second);
        assert!(!first.is_default() && !second.is_default());
    }

    #[test]
    fn a_pool_whose_last_block_is_freed_is_named_once() {
        let mut pools = CapturePools::default();
        pools.capture_begins(7, 1);
        pools.segment_made(0x2000_0000, 20 * MIB, 2, false);
        let pool = pools.route(0x2000_0000, 7).expect("claimed");
        assert_eq!(pools.route(0x2000_0000 + MIB, 7), Some(pool));
        assert_eq!(pools.capturing_into(7), Some(pool));
        assert_eq!(pools.freed(0x2000_0000), None);
        assert_eq!(pools.freed(0x1234), None);
        assert_eq!(pools.freed(0x2000_0000 + MIB), Some(pool));
        assert!(pools.make_freeable(pool));
        assert!(!pools.make_freeable(pool));
        assert_eq!(
            pools.segment_freed(0x2000_0000, 20 * MIB),
            Some((pool, false))
        );
    }

    #[test]
    fn a_mem_pool_claims_its_segments_and_the_pieces_its_malloc_mapped() {
        let mut pools = CapturePools::default();
        pools.request_seen();
        pools.segment_made(0x2000_0000, 20 * MIB, 2, false);
        let pool = pools
            .route_new_mem_pool(0x2000_0000, 0)
            .expect("a new MemPool");
        assert!(pools.is_mem_pool(pool));
        pools.claim_recent(pool);
        // The next malloc maps two pieces: the one its block starts in was claimed before,
        // the one after is claimed with it.
        pools.request_seen();
        pools.segment_made(0x2140_0000, 20 * MIB, 4, false);
        assert!(!pools.made_unclaimed_after(0x2000_0000 + 6 * MIB, 3));
        assert_eq!(pools.claimed(0x2000_0000 + 6 * MIB), Some(pool));
        pools.claim_recent(pool);
        assert_eq!(pools.claimed(0x2140_0000 + MIB), Some(pool));
        // The stream's MemPool takes the next inference too.
        pools.request_seen();
        pools.segment_made(0x4000_0000, 40 * MIB, 6, false);
        assert!(pools.made_unclaimed_after(0x4000_0000, 5));
        assert_eq!(pools.current_mem_pool(0), Some(pool));
        assert_eq!(pools.claim_for(0x4000_0000, pool), Some(pool));
        // Emptied, it is not taken for gone; nor released: its own malloc's OOM path releases
        // its cached blocks while the job holds it (the engine asks the malloc after the run).
        for addr in [
            0x2000_0000,
            0x2000_0000 + 6 * MIB,
            0x2140_0000 + MIB,
            0x4000_0000,
        ] {
            assert_eq!(pools.freed(addr), None);
        }
        assert_eq!(
            pools.segment_freed(0x4000_0000, 40 * MIB),
            Some((pool, false))
        );
        assert!(pools.make_freeable(pool));
        assert_eq!(pools.claimed(0x2000_0000), None);
    }

    #[test]
    fn a_released_segment_makes_its_pool_freeable_once() {
        let mut pools = CapturePools::default();
        pools.capture_begins(7, 1);
        pools.segment_made(0x2000_0000, 20 * MIB, 2, false);
        pools.segment_made(0x4000_0000, 20 * MIB, 3, false);
        let pool = pools.route(0x2000_0000, 7).expect("claimed");
        assert_eq!(pools.route(0x4000_0000, 7), Some(pool));
        assert_eq!(
            pools.segment_freed(0x2000_0000, 20 * MIB),
            Some((pool, true))
        );
        assert_eq!(
            pools.segment_freed(0x4000_0000, 20 * MIB),
            Some((pool, false))
        );
        assert_eq!(pools.segment_freed(0x4000_0000, 20 * MIB), None);
        // A freeable pool takes no more allocations.
        pools.segment_made(0x2000_0000, 20 * MIB, 4, false);
        pools.capture_begins(7, 5);
        pools.segment_made(0x6000_0000, 20 * MIB, 6, false);
        assert_ne!(pools.route(0x6000_0000, 7), Some(pool));
    }
}
