//! Replaying one trace event at a time through gpumem's allocator: `alloc` allocates,
//! `free_requested` frees, device-level events are compared, recorded OOMs are retried, and
//! `empty_cache()` is called where the trace shows PyTorch's was.
//!
//! # Frees deferred by `record_stream`
//!
//! PyTorch records `free_requested` when a tensor dies and `free_completed` when its block goes
//! back to the cache: at once for a block used on its own stream only, later (at a malloc or an
//! `empty_cache()`) for one used on other streams (`record_stream`). The trace does not record
//! the streams, so the replay looks one event ahead: a `free_completed` of the same address
//! right after the `free_requested` is an immediate free; otherwise the free was deferred. A
//! deferred free is replayed as PyTorch made it: the allocation is recorded on a stream of its
//! own whose work is still running (`record_stream` on one of the replay device's made-up
//! streams, [`super::device::DEFERRED_STREAMS`]), and freed —
//! `allocated_bytes` falls at once, the block stays active. Its completion then follows the
//! allocator's own rules: a recorded `free_completed` marks that stream's work done, so the
//! next malloc's `process_events` takes the block back, where PyTorch took it; and the OOM path
//! and `empty_cache()` wait for every pending free (`synchronize_and_free_events`), wherever
//! the replayed config makes them happen. A recorded completion that PyTorch made on its OOM
//! path is left to the replayed malloc's OOM path; if the malloc takes another path (another
//! config), the stream's work is marked done right after it. PyTorch made it on its OOM path
//! when a release of the same malloc comes before it in the trace, or when the malloc found
//! nothing cached (the trace shows new memory or an OOM) and the releases its OOM path would
//! make with the block still pending are the recorded ones — unless the completion came right
//! after its `free_requested` and the malloc, the free made at once, would make the same
//! releases: the trace reads the same, and the free made at once is the likelier
//! (docs/allocator.md, "Replaying deferred frees").
//!
//! # Releases and `empty_cache()`
//!
//! Segment releases (and the completions of deferred frees) come in runs. A run followed by
//! the `alloc` or `oom` of a malloc is that malloc's own (garbage collection, the OOM path) —
//! unless the malloc, replayed on the state before the run, would not release exactly those
//! segments ([`CachingAllocator::malloc_outlook`]): then an `empty_cache()` came first. A run
//! followed by anything else (a free, a snapshot, the end) was an `empty_cache()`; so is any
//! run in which a release's frames name `empty_cache`. Where the malloc would release the same
//! itself, the trace cannot tell whether an `empty_cache()` came first: the replay takes the
//! releases as the malloc's, and `num_sync_all_streams` (and, for a malloc that then
//! succeeds, `num_alloc_retries`) may differ from the recording's by one. Under a what-if
//! config the replay's state is not the recording's, so the recording is asked first
//! ([`Engine::recording_room`]): where the recorded run had room for the malloc's new memory
//! with the released segments still held, its malloc cannot have released them (PyTorch's OOM
//! path runs only after a `cudaMalloc` failed), and the run was an `empty_cache()`.
//!
//! A CUDA-graph capture begins with an `empty_cache()` too (`torch.cuda.graph.__enter__`),
//! which the trace shows only by what it releases: the first allocation of a stream whose
//! frames show a capture underway (`StackSigns::graph_capture`), after one that did not, ends
//! its run as an `empty_cache()`, releases or not.
//!
//! # Private pools
//!
//! A 2.11 trace names no pool, but the file's segments do (`segment_pool_id`). Given the
//! segments of private pools that still existed at the end (and the index of the
//! `segment_alloc` that made each one, or of the `segment_map` that began an expandable
//! one's mapped range), the replay routes every allocation that lies in one of
//! them, after it was made, to that pool, as a capture or `use_mem_pool` did. A capture whose
//! pool is gone by the end (its graph deleted, its segments released) is known by its frames
//! and streams: its allocations go to a pool inferred from the segments it made
//! (`replay/captures.rs`), made freeable when the graph went away (its last block freed).
//! Under the recorded config, a request that made new memory where the default pools' cache
//! would have served it was a `MemPool`'s: an inferred one claims that memory.
//!
//! # Modules
//!
//! The engine's state, its settings and the reading of each trace event are here
//! ([`Engine::handle`]); the work is spread over:
//! - `outcome`: what the replay found, [`Counts`] and each OOM's record ([`FirstOom`]);
//! - `requests`: the trace's requests replayed: allocations, frees made at once or deferred,
//!   recorded OOMs;
//! - `window`: a trace that starts mid-run: its start state, and the malloc work the history
//!   ring cut;
//! - `routes`: [`PoolRoutes`], the private pools' segments the file's end shows;
//! - `routing`: the private pool each request goes to (the file's routes, captures, the pool a
//!   stream serves), and asking the allocator in it;
//! - `mem_pools`: `MemPool`s the file does not show, inferred at the request that asked one;
//! - `runs`: runs of releases and deferred completions, and whose they were: the malloc's
//!   that ends the run, or an `empty_cache()`;
//! - `empty_cache`: a run read as an `empty_cache()`, whole or one pool's, and what a whole
//!   call would release now;
//! - `release_claims`: the segments a run's releases show to have been a `MemPool`'s.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use super::captures::CapturePools;

use super::addresses::{AddressMap, AddressSet};
use super::answer::Causes;
use super::compare::{DeviceEvent, SegmentComparison};
use super::device::{Hints, DEFERRED_STREAMS};
use super::sequence::DeviceCall;
use crate::alloc::outlook::ReleasedSegment;
use crate::alloc::{
    AllocConf, Allocation, CachingAllocator, MemPoolId, MemoryEvent, MemoryObserver, StreamId,
    Subscription,
};
use crate::snapshot::model::Action;
use crate::snapshot::pickle::{Emitted, Entry, RawEvent, SnapshotError};

mod empty_cache;
mod mem_pools;
mod outcome;
mod release_claims;
mod requests;
mod routes;
mod routing;
mod runs;
mod window;

pub use outcome::{Counts, FirstOom};
pub use routes::PoolRoutes;
use runs::Run;

/// Free blocks the checkpoint restores of a replay may look through in all
/// ([`CachingAllocator::allocate_block_at`] reads a private pool's free blocks, as PyTorch
/// does): this many, plus [`RESTORE_SCAN_PER_EVENT`] per event replayed. A real job's pools
/// cache hundreds of blocks and restore a few times; a crafted file that restores at every
/// event in a pool of many thousands is bounded by it (later restores are asked for as any
/// request).
const RESTORE_SCAN_BASE: u64 = 1 << 24;

/// See [`RESTORE_SCAN_BASE`].
const RESTORE_SCAN_PER_EVENT: u64 = 64;

/// Bytes in a mebibyte.
const MIB: u64 = 1 << 20;

/// How many allocations a replay may keep live at once, in proportion to the file's size: a
/// snapshot is untrusted input, and a crafted file of 20-byte `alloc` entries that are never
/// freed would otherwise make the replay hold far more memory than the file's size (issue 21:
/// 64 MiB + 2 × the file's size for the whole process, the reader's share included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveLimit {
    /// Bytes of live-allocation state the replay may hold, whatever the file's size.
    pub base_memory: u64,
    /// And this many more per byte of the file.
    pub memory_per_byte: u64,
}

impl LiveLimit {
    /// What one live allocation costs the replay, measured: the engine's entry for its
    /// recorded address and the allocator's block, with the spare capacity of their tables
    /// (about 150 bytes in `gpumem replay` on 1.2 million live allocations).
    pub const BYTES_PER_ALLOCATION: u64 = 192;

    /// The most allocations live at once for a file of `file_size` bytes.
    pub fn allocations(&self, file_size: u64) -> u64 {
        self.base_memory
            .saturating_add(file_size.saturating_mul(self.memory_per_byte))
            / Self::BYTES_PER_ALLOCATION
    }
}

impl Default for LiveLimit {
    /// What `gpumem replay` uses: 16 MiB + 1 byte per byte of the file (87,381 live
    /// allocations whatever the size; PyTorch's files take about 70 bytes per trace entry, so
    /// a real job reaches the limit only with hundreds of thousands of allocations live at
    /// once and almost none freed).
    fn default() -> Self {
        LiveLimit {
            base_memory: 16 * MIB,
            memory_per_byte: 1,
        }
    }
}

/// A live allocation: gpumem's block for a recorded address.
#[derive(Debug, Clone, Copy)]
struct Live {
    allocation: Allocation,
    /// The stream made up for its deferred free, once freed that way.
    deferred: Option<StreamId>,
    /// The `alloc` event that made it (`None`: live when the trace starts).
    index: Option<u64>,
    /// The bytes it was asked for.
    requested: u64,
}

/// The allocator's segment events since the engine last compared them: the only ones it
/// compares, so the others (two or three per replayed event) are not kept at all.
#[derive(Debug, Default)]
struct SegmentLog(Vec<DeviceEvent>);

impl MemoryObserver for SegmentLog {
    fn on_event(&mut self, event: &MemoryEvent) {
        if event.kind.is_segment_event() {
            self.0.push((event.kind, event.addr, event.size));
        }
    }

    fn segment_events_only(&self) -> bool {
        true
    }
}

/// The replay of one trace.
pub struct Engine {
    allocator: CachingAllocator,
    live: AddressMap<Live>,
    /// Recorded addresses whose allocation failed in the replay; their frees are skipped.
    skipped: AddressSet,
    /// Of those, the ones whose free the trace shows deferred (its `free_completed` came
    /// later): their completion still belongs to the run it is recorded in, as the trace reads
    /// the same whatever the replay could allocate.
    skipped_deferred: AddressSet,
    /// The trace list replayed (the first that has events).
    trace: Option<u32>,
    /// The allocator's own events since the last recorded event was replayed: its segment
    /// events are what the comparison checks.
    log: Rc<RefCell<SegmentLog>>,
    /// Where recorded segments go, for the device to place gpumem's alike (`None`: the
    /// simulator's placement model).
    hints: Option<Hints>,
    /// A `free_requested` waiting to see whether its `free_completed` follows at once.
    held: Option<(u64, RawEvent)>,
    /// A `free_requested` and the `free_completed` right after it, waiting for the next event:
    /// an immediate free, unless that event starts a malloc's releases or new memory.
    pair: Option<(u64, RawEvent, RawEvent)>,
    /// The current run of releases and deferred completions.
    run: Run,
    /// Blocks whose free was requested before the trace starts (a trace that starts mid-run):
    /// their completion is no sign of an `empty_cache()`, whatever comes between.
    pending_at_start: AddressSet,
    /// The next made-up stream for a deferred free.
    next_stream: StreamId,
    /// The private pools' segments, when the file has any.
    routes: PoolRoutes,
    /// The private pools made so far.
    pools: HashSet<MemPoolId>,
    /// Pools of captures the file's segments do not name, inferred from the trace.
    capture_pools: CapturePools,
    /// The inferred pool of the `alloc` being replayed, if it has one.
    capture_route: Option<MemPoolId>,
    /// The index of the last event that was not a segment event: a capture beginning at the
    /// next allocation began after it (its segments come before that allocation).
    last_request: u64,
    /// Free blocks the checkpoint restores looked through so far (see [`RESTORE_SCAN_BASE`]).
    restore_scanned: u64,
    /// By recorded stream: the private pool its last allocation went to, if it went to one.
    stream_pools: HashMap<i64, MemPoolId>,
    /// By recorded stream: the private pool its last allocation in one went to (kept while
    /// the stream allocates in the default pools).
    last_private_pool: HashMap<i64, MemPoolId>,
    /// By the index of the `segment_alloc` that made a segment: the private pool its stream
    /// had allocated to last by then ([`Engine::claim_passed_over`]).
    pool_when_made: HashMap<u64, MemPoolId>,
    /// The recorded run's config, once the file has named it (a first pass takes its own for
    /// it): how the recording rounded a request for its memory-fraction check.
    recorded_conf: Option<AllocConf>,
    /// Whether the `oom` that ends the current run was asked in the default pools although its
    /// stream's last allocation went to a private pool ([`Engine::oom_in_default_pools`]).
    oom_in_default: bool,
    /// Index of the last `segment_alloc` recorded at each address (for [`PoolRoutes`]).
    made_at: AddressMap<u64>,
    /// The index of the event being replayed.
    index: u64,
    /// By recorded stream: whether its last allocation was made in a CUDA-graph capture, as
    /// its frames tell.
    capturing: HashMap<i64, bool>,
    /// The stream `torch.cuda.graph` keeps for the captures users make, once an allocation's
    /// frames name it ([`StackSigns::capture_stream`](crate::snapshot::pickle::StackSigns)):
    /// every allocation on it is made in a capture.
    capture_stream: Option<i64>,
    /// The stream of the last allocation.
    last_alloc_stream: Option<i64>,
    /// Whether the last allocation was made in a capture.
    last_alloc_inside: bool,
    /// Whether the replay's config decides as the recorded run's did (a self-replay): only
    /// then can the replay's state tell what PyTorch's malloc did where the trace does not
    /// show it.
    recorded_config: bool,
    /// Whether, following the recorded config, the replay infers the `MemPool`s the file does
    /// not show from its state as it reads ([`Engine::infer_mem_pools_as_read`]).
    infer_mem_pools_as_read: bool,
    /// Whether [`Engine::claim_passed_over`] claims what it finds.
    claim_passed_over: bool,
    /// Whether [`Engine::claim_passed_over`] found a segment to claim (claimed or not).
    pub(super) passed_over_seen: bool,
    /// Whether a decision so far took [`Engine::follows_recorded_config`] for granted: a
    /// replay that ran before the recorded config was known must then run again if it was
    /// not.
    assumed_recorded_config: bool,
    /// In a what-if replay of a trace that starts with its process: the bytes the recorded
    /// run could reserve in all ([`Engine::recording_room`]), which tell a run of releases
    /// its malloc did not need from one an `empty_cache()` made.
    recording_room: Option<u64>,
    /// Before the recorded config is known (a first pass, which reads as it replays): the
    /// room the replay's device would give. Where it would read a run otherwise than the
    /// replay's state did, a replay under another config runs again
    /// ([`Engine::assumed_recorded_config`]).
    provisional_room: Option<u64>,
    /// Bytes the recording held in segments at this point of its trace (its `segment_alloc`
    /// and `segment_map` sizes less its releases).
    recorded_reserved: u64,
    /// Whether the trace starts mid-run ([`Engine::start_from`]): a stream's first allocation
    /// in a capture may then continue one begun before the window, so it begins none.
    started_mid_run: bool,
    /// Set from the start of a window until its first event is replayed: that event, an
    /// `alloc`, may be the malloc whose `segment_alloc` the history ring just dropped
    /// ([`Engine::made_before_window`]).
    at_window_start: bool,
    /// Whether the next malloc's search of the cache failed before the window
    /// ([`Engine::cache_search_cut_by_the_window`]).
    cache_search_cut: bool,
    /// What was replayed.
    pub counts: Counts,
    /// The first OOM of the replay.
    pub first_oom: Option<FirstOom>,
    /// The first `answer::ANSWERED_OOMS` OOMs, each with its diagnosis.
    pub ooms: Vec<FirstOom>,
    /// Every OOM's cause, counted.
    pub causes: Causes,
    /// Whether `free_requested` frees (the trace records no `free_completed`).
    free_on_request: bool,
    /// Device events compared.
    pub segments: SegmentComparison,
    /// The most allocations kept live at once (`None`: no limit).
    max_live: Option<u64>,
    /// The limit as the refusal states it.
    live_limit_text: String,
}

impl Engine {
    /// A replay into `allocator` (fresh, on the device and config to replay under), telling
    /// recorded segment placements to `hints` when given, and routing allocations to private
    /// pools by `routes`.
    pub fn new(
        mut allocator: CachingAllocator,
        hints: Option<Hints>,
        routes: PoolRoutes,
    ) -> Engine {
        let log = Rc::new(RefCell::new(SegmentLog::default()));
        allocator.subscribe(Box::new(Rc::clone(&log)));
        Engine {
            allocator,
            hints,
            live: AddressMap::default(),
            skipped: AddressSet::default(),
            skipped_deferred: AddressSet::default(),
            trace: None,
            log,
            held: None,
            pair: None,
            run: Run::default(),
            pending_at_start: AddressSet::default(),
            next_stream: DEFERRED_STREAMS,
            routes,
            pools: HashSet::new(),
            capture_pools: CapturePools::default(),
            capture_route: None,
            last_request: 0,
            stream_pools: HashMap::new(),
            last_private_pool: HashMap::new(),
            pool_when_made: HashMap::new(),
            oom_in_default: false,
            recorded_conf: None,
            restore_scanned: 0,
            made_at: AddressMap::default(),
            index: 0,
            capturing: HashMap::new(),
            started_mid_run: false,
            at_window_start: false,
            cache_search_cut: false,
            recorded_config: true,
            infer_mem_pools_as_read: true,
            claim_passed_over: false,
            passed_over_seen: false,
            assumed_recorded_config: false,
            recording_room: None,
            provisional_room: None,
            recorded_reserved: 0,
            capture_stream: None,
            last_alloc_stream: None,
            last_alloc_inside: false,
            counts: Counts::default(),
            first_oom: None,
            ooms: Vec::new(),
            causes: Causes::default(),
            free_on_request: false,
            segments: SegmentComparison::default(),
            max_live: None,
            live_limit_text: String::new(),
        }
    }

    /// Refuses, at the entry that would go past it, to keep more allocations live at once
    /// than `limit` allows for a file of `file_size` bytes ([`LiveLimit`]).
    pub fn with_live_limit(mut self, limit: LiveLimit, file_size: u64) -> Engine {
        let most = limit.allocations(file_size);
        self.max_live = Some(most);
        self.live_limit_text = format!(
            "more than {most} allocations live at once (limit: {} MiB + {} byte per byte of this {file_size}-byte file, at {} bytes per allocation)",
            limit.base_memory / MIB,
            limit.memory_per_byte,
            LiveLimit::BYTES_PER_ALLOCATION
        );
        self
    }

    /// Subscribes `observer` to the replay allocator's event stream (a timeline being
    /// recorded, say); see [`CachingAllocator::subscribe`].
    pub fn subscribe(&mut self, observer: Box<dyn MemoryObserver>) -> Subscription {
        self.allocator.subscribe(observer)
    }

    /// The allocator replayed into.
    pub fn allocator(&self) -> &CachingAllocator {
        &self.allocator
    }

    /// The allocator replayed into, to set it up before the first event (a memory fraction,
    /// the state a trace starts from).
    pub fn allocator_mut(&mut self) -> &mut CachingAllocator {
        &mut self.allocator
    }

    /// Names the recorded run's config: how the recording rounded a request for its
    /// memory-fraction check, which tells its OOM path from an `empty_cache()`.
    pub fn recorded_conf(&mut self, conf: AllocConf) {
        self.recorded_conf = Some(conf);
    }

    /// Says whether the replay's config decides as the recorded run's did (the default: yes;
    /// a what-if replay says no).
    pub fn follows_recorded_config(&mut self, recorded: bool) {
        self.recorded_config = recorded;
    }

    /// Says whether the replay, following the recorded config, infers `MemPool`s the file
    /// does not show from its state as it reads (the default: yes). No where self-replays
    /// taught that such inferences read this trace the wrong way (`super::lessons::Lesson`):
    /// the claims it learnt still route.
    pub fn infer_mem_pools_as_read(&mut self, infer: bool) {
        self.infer_mem_pools_as_read = infer;
    }

    /// Says whether the replay claims for a `MemPool` the segments a default-pool malloc
    /// passed over (`Engine::claim_passed_over`; the default: no). A self-replay that learns
    /// does, where learning without them reproduced nothing: the reading is sound in the
    /// recording's state, but a claim for the wrong one of several pools can lead later
    /// passes astray where the replay would otherwise have found its way.
    pub fn claim_passed_over_blocks(&mut self, claim: bool) {
        self.claim_passed_over = claim;
    }

    /// Tells a what-if replay of a trace that starts with its process how many bytes the
    /// recorded run could reserve in all (its device's room, or the limit its OOMs show).
    /// A run of releases before a malloc that, in the recording, could have had its new
    /// memory without them was then no OOM path of that malloc: the program called
    /// `empty_cache()`, and the replay does, whatever the what-if config's malloc would do in
    /// its place (see the module documentation).
    pub fn recording_room(&mut self, room: u64) {
        self.recording_room = Some(room);
    }

    /// Tells a replay that reads the trace before the file names its config (the first pass)
    /// the room its device gives, to know whether [`Engine::recording_room`] could change its
    /// reading under another config.
    pub fn provisional_room(&mut self, room: u64) {
        self.provisional_room = Some(room);
    }

    /// Whether a decision so far relied on the replay's config being the recorded run's (see
    /// [`Engine::follows_recorded_config`]).
    pub fn assumed_recorded_config(&self) -> bool {
        self.assumed_recorded_config
    }

    /// Makes `free_requested` free the block: for traces without `free_completed` events
    /// (recorded with `skip_actions`).
    pub fn free_on_request(&mut self) {
        self.free_on_request = true;
    }

    /// The trace list replayed, once known.
    pub fn trace(&self) -> Option<u32> {
        self.trace
    }

    /// The index of the last `segment_alloc` recorded at `addr`, if any.
    pub fn made_at(&self, addr: u64) -> Option<u64> {
        self.made_at.get(&addr).copied()
    }

    /// Replays one event from the reader.
    pub fn handle(&mut self, emitted: Emitted) -> Result<(), SnapshotError> {
        let Entry::Memory(event) = emitted.entry else {
            // `user_defined` and `annotate` markers change no memory.
            return Ok(());
        };
        if *self.trace.get_or_insert(emitted.list) != emitted.list {
            self.counts.other_device_events += 1;
            return Ok(());
        }
        self.counts.events += 1;
        let index = super::event_number(&emitted);
        self.index = index;
        // Every allocator event a file event causes carries its index (low 32 bits; the
        // timeline restores the rest), so pictures number events as the text does.
        self.allocator.set_trace_context(index as u32);
        let fail = |message: String| SnapshotError::Event { index, message };
        // PyTorch pickles a `size_t`, so a negative size is a damaged file, whatever the
        // action: refused here rather than read as 0 where the action does not use the size.
        non_negative(event.size, "size").map_err(fail)?;
        if event.action == Action::Alloc
            && self
                .max_live
                .is_some_and(|most| self.live.len() as u64 >= most)
        {
            return Err(SnapshotError::Limit {
                offset: emitted.offset,
                message: self.live_limit_text.clone(),
                events: index,
            });
        }
        if let Some((held_index, held)) = self.held.take() {
            if event.action == Action::FreeCompleted && event.addr == held.addr {
                // An immediate free, unless the next event starts a malloc's releases, new
                // memory or OOM: then its OOM path may have completed a deferred free.
                self.pair = Some((held_index, held, event));
                return Ok(());
            }
            self.defer_free(&held, true)
                .map_err(|message| SnapshotError::Event {
                    index: held_index,
                    message,
                })?;
            self.observe(held_index);
        }
        if let Some((requested_index, requested, completed)) = self.pair.take() {
            let at = |message: String| SnapshotError::Event {
                index: requested_index,
                message,
            };
            // A malloc's releases, new memory or `oom` next: its OOM path may have completed
            // a deferred free (`synchronize_and_free_events`), and a malloc whose retry only
            // asks for new memory runs out of memory even when that block would serve it.
            // Another deferred completion next may be that same walk's (it completes every
            // pending free, the one freed last first when its stream comes first): the
            // pair joins the run of completions, whose end tells (completed in the trace's
            // order either way, so a free made at once reads the same).
            if matches!(
                event.action,
                Action::SegmentFree
                    | Action::SegmentUnmap
                    | Action::SegmentAlloc
                    | Action::SegmentMap
                    | Action::Oom
            ) || (event.action == Action::FreeCompleted && self.is_deferred(&event))
            {
                self.defer_free(&requested, false).map_err(at)?;
                self.complete_deferred(&completed).map_err(at)?;
                self.run.adjacent += 1;
            } else {
                self.end_run(None).map_err(at)?;
                self.free_now(&completed).map_err(at)?;
            }
            self.observe(requested_index);
        }
        match event.action {
            Action::SegmentFree | Action::SegmentUnmap => {
                if event.action == Action::SegmentFree {
                    if let Some(hints) = &self.hints {
                        hints.recorded(DeviceCall::Free {
                            address: event.addr as u64,
                        });
                        hints.recorded_segment_free(event.addr as u64);
                    }
                }
                self.segments.recorded(index, device_event(&event));
                self.recorded_reserved = self.recorded_reserved.saturating_sub(event.size as u64);
                self.run.began_at_window_start |= self.at_window_start;
                self.run.releases += 1;
                let inferred = self
                    .capture_pools
                    .segment_freed(event.addr as u64, event.size.max(0) as u64);
                if let Some((pool, true)) = inferred {
                    // Released, so the graph went away before this run (at the latest).
                    self.pool_went_away(pool).map_err(fail)?;
                }
                let pool = self
                    .routes
                    .pool_of(event.addr as u64, index)
                    .or(inferred.map(|(pool, _)| pool))
                    .unwrap_or(MemPoolId::DEFAULT);
                self.run.released.push(ReleasedSegment {
                    pool,
                    size: event.size.max(0) as u64,
                });
                let made = if event.action == Action::SegmentFree {
                    self.run.freed_at.push(event.addr as u64);
                    self.made_at.get(&(event.addr as u64)).copied()
                } else {
                    self.run
                        .unmapped_at
                        .push((event.addr as u64, event.size.max(0) as u64));
                    None
                };
                self.run.released_made.push(made);
                self.run.empty_cache_frame |= event.signs.empty_cache;
            }
            Action::SegmentAlloc | Action::SegmentMap => {
                self.segments.recorded(index, device_event(&event));
                self.recorded_reserved = self.recorded_reserved.saturating_add(event.size as u64);
                self.run.new_memory += 1;
                self.run.new_bytes = self.run.new_bytes.saturating_add(event.size as u64);
                if event.action == Action::SegmentAlloc {
                    self.made_at.insert(event.addr as u64, index);
                    if let Some(&pool) = self.last_private_pool.get(&event.stream) {
                        self.pool_when_made.insert(index, pool);
                    }
                }
                self.capture_pools.segment_made(
                    event.addr as u64,
                    event.size.max(0) as u64,
                    index,
                    event.action == Action::SegmentMap,
                );
                // Only a `cudaMalloc` tells where the driver puts one: pages mapped into an
                // expandable segment lie in its address reservation, no place for a segment
                // of a replay without expandable segments.
                if let Some(hints) = self
                    .hints
                    .as_ref()
                    .filter(|_| event.action == Action::SegmentAlloc)
                {
                    let (address, size) = (event.addr as u64, event.size.max(0) as u64);
                    hints.push(address, size);
                    hints.recorded(DeviceCall::Malloc { address, size });
                    hints.recorded_segment(address, size);
                }
            }
            Action::FreeCompleted if self.is_deferred(&event) => {
                self.complete_deferred(&event).map_err(fail)?;
            }
            Action::Alloc => {
                self.see_capture(&event);
                self.route_to_inferred_pool(&event);
                self.infer_collecting_mem_pool(&event).map_err(fail)?;
                self.infer_releasing_mem_pool(&event).map_err(fail)?;
                let released = self.run.releases > 0;
                self.end_run(Some(&event)).map_err(fail)?;
                self.infer_mem_pool(&event, released).map_err(fail)?;
                let allocated = self.alloc(index, &event);
                self.capture_route = None;
                allocated.map_err(fail)?;
            }
            Action::Oom => {
                self.route_learned_oom(&event);
                self.infer_oom_collecting_mem_pool(&event).map_err(fail)?;
                let released = self.run.releases > 0;
                self.end_run(Some(&event)).map_err(fail)?;
                self.infer_oom_mem_pool(&event, released).map_err(fail)?;
                self.recorded_oom(index, &event).map_err(fail)?;
            }
            Action::FreeRequested => {
                self.end_run(None).map_err(fail)?;
                self.free_requested(index, &event).map_err(fail)?;
            }
            Action::FreeCompleted => {
                self.end_run(None).map_err(fail)?;
                self.free_now(&event).map_err(fail)?;
            }
            Action::Snapshot => {
                self.end_run(None).map_err(fail)?;
                self.counts.snapshots += 1;
            }
            // gpumem's own kinds: a file's reader accepts only PyTorch's names.
            Action::EmptyCache
            | Action::RangeReserve
            | Action::RangeRelease
            | Action::SetMemoryFraction => {}
        }
        if !event.action.is_segment_event() {
            self.last_request = index;
            self.capture_pools.request_seen();
        }
        self.at_window_start = false;
        self.observe(index);
        Ok(())
    }

    /// Ends the replay: a `free_requested` still held was deferred, and a run at the very end
    /// was an `empty_cache()`.
    pub fn finish(&mut self, last_index: u64) -> Result<(), SnapshotError> {
        // What the end releases is numbered by the last event, as the text numbers it.
        self.allocator.set_trace_context(last_index as u32);
        let fail = |message: String| SnapshotError::Event {
            index: last_index,
            message,
        };
        if let Some((_, held)) = self.held.take() {
            self.defer_free(&held, true).map_err(fail)?;
        }
        if let Some((_, _, completed)) = self.pair.take() {
            self.end_run(None).map_err(fail)?;
            self.free_now(&completed).map_err(fail)?;
        }
        self.end_run(None).map_err(fail)?;
        self.observe(last_index);
        self.counts.pending_frees = self.allocator.pending_frees().blocks;
        self.segments.finish();
        Ok(())
    }

    /// Hands the allocator's segment events since the last call to the comparison, as
    /// replayed at event `index`.
    fn observe(&mut self, index: u64) {
        let mut log = self.log.borrow_mut();
        for event in log.0.drain(..) {
            self.segments.replayed(index, event);
        }
    }
}

/// A recorded segment event as the comparison reads it: its action, address and size.
fn device_event(event: &RawEvent) -> DeviceEvent {
    (event.action, event.addr as u64, event.size.max(0) as u64)
}

/// `value` as a `u64`, or the error that names it (`what`) negative.
fn non_negative(value: i64, what: &str) -> Result<u64, String> {
    u64::try_from(value).map_err(|_| format!("negative {what} {value}"))
}

/// The error for a free (`action`) of an address no live allocation holds.
fn never_allocated(action: &str, addr: u64) -> String {
    format!(
        "{action} of address {addr:#x}, which was never allocated in this trace (or already freed)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_live_limit_grows_with_the_file() {
        let limit = LiveLimit::default();
        assert_eq!(limit.allocations(0), (16 << 20) / 192);
        assert_eq!(
            limit.allocations(192 * 1000),
            (16 << 20) / 192 + 1000,
            "one more allocation per 192 bytes of the file"
        );
        let none = LiveLimit {
            base_memory: 0,
            memory_per_byte: 0,
        };
        assert_eq!(none.allocations(1 << 30), 0);
        assert_eq!(limit.allocations(u64::MAX), u64::MAX / 192, "saturates");
    }
}
