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

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::rc::Rc;

use super::captures::CapturePools;

use serde::Serialize;

use super::addresses::{AddressMap, AddressSet};
use super::answer::{self, Causes, LiveAllocation, OomSource, UserFrame, Why};
use super::compare::{DeviceEvent, SegmentComparison};
use super::device::{deferred_stream_done, Hints, DEFERRED_STREAMS};
use super::seed::Seeded;
use super::sequence::DeviceCall;
use crate::alloc::outlook::{MallocOutlook, ReleasedSegment};
use crate::alloc::{
    fraction_check_bytes, AllocConf, AllocError, Allocation, CachingAllocator, MemPoolId,
    MemoryEvent, MemoryObserver, OutOfMemory, PoolFilter, StreamId, Subscription, SMALL_BUFFER,
};
use crate::snapshot::model::Action;
use crate::snapshot::pickle::{Emitted, Entry, RawEvent, SnapshotError};

/// The state when the replay ran out of memory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FirstOom {
    /// Number ([`super::event_number`]) of the event that failed: an `alloc`, or a recorded
    /// `oom` gpumem reproduced.
    pub index: u64,
    /// Which of the two it was.
    pub source: OomSource,
    /// Bytes it asked for.
    pub size: u64,
    /// Bytes allocated then.
    pub allocated: i64,
    /// Bytes reserved then.
    pub reserved: i64,
    /// The device's free bytes then.
    pub device_free: u64,
    /// gpumem's (PyTorch's) OOM message.
    pub message: String,
    /// gpumem's diagnosis: the cause and its figures.
    pub why: Why,
    /// The Python frames of the failing request, the user's first (empty until looked up,
    /// or when the file records none).
    pub frames: Vec<UserFrame>,
    /// Set when the failing event itself has no stack — PyTorch 2.11 records most `oom`
    /// entries without frames even when the history has Python stacks — and [`FirstOom::frames`]
    /// then holds the stack of this earlier event instead: the nearest before the OOM in the
    /// same trace that has one, i.e. the code that was running when the allocation failed.
    pub frames_from: Option<u64>,
    /// The largest allocations live then, largest first.
    pub largest_live: Vec<LiveAllocation>,
}

/// Counts of what was replayed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// Events read from the replayed device's trace.
    pub events: u64,
    /// `alloc` events.
    pub allocs: u64,
    /// `free_completed` events.
    pub frees: u64,
    /// Frees whose `free_completed` did not follow their `free_requested` at once: blocks
    /// used on other streams (`record_stream`).
    pub deferred_frees: u64,
    /// Blocks still waiting for their streams at the end (`free_requested` never completed,
    /// or completed only in the recording).
    pub pending_frees: u64,
    /// Allocations that failed in the replay (each skipped along with its free).
    pub ooms: u64,
    /// `oom` events in the file.
    pub recorded_ooms: u64,
    /// Recorded OOMs that gpumem's allocator also refused.
    pub recorded_ooms_reproduced: u64,
    /// `snapshot` events.
    pub snapshots: u64,
    /// `empty_cache()` calls inferred from the trace.
    pub empty_cache_calls: u64,
    /// CUDA-graph captures seen in the allocations' frames (each began with an
    /// `empty_cache()`, counted in [`Counts::empty_cache_calls`]).
    pub graph_captures: u64,
    /// Allocations routed to a private pool (they lie in a segment the file's segments give
    /// to one).
    pub pooled_allocs: u64,
    /// Allocations routed to a private pool no file segment names, inferred from the trace
    /// (`replay/captures.rs`): a CUDA-graph capture's whose graph went away while the job
    /// ran, or a `MemPool`'s gone by the end; counted in [`Counts::pooled_allocs`] too.
    pub inferred_pool_allocs: u64,
    /// Of those, blocks cudagraph trees' checkpoint restore took back at their recorded
    /// addresses (`setCheckpointPoolState`).
    pub restored_blocks: u64,
    /// Events of other devices' traces (not replayed).
    pub other_device_events: u64,
}

/// Free blocks the checkpoint restores of a replay may look through in all
/// ([`CachingAllocator::allocate_block_at`] reads a private pool's free blocks, as PyTorch
/// does): this many, plus [`RESTORE_SCAN_PER_EVENT`] per event replayed. A real job's pools
/// cache hundreds of blocks and restore a few times; a crafted file that restores at every
/// event in a pool of many thousands is bounded by it (later restores are asked for as any
/// request).
const RESTORE_SCAN_BASE: u64 = 1 << 24;

/// See [`RESTORE_SCAN_BASE`].
const RESTORE_SCAN_PER_EVENT: u64 = 64;

/// A request replayed: its size and the allocator's answer.
type Asked = (u64, Result<Allocation, AllocError>);

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
    fn in_default_segment(&self, addr: u64, index: u64) -> bool {
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
    fn mem_pools(&self) -> Vec<MemPoolId> {
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
    fn names(&self, pool: MemPoolId) -> bool {
        self.segments.values().any(|&(_, of, _)| of == pool)
    }

    /// Whether the file's end shows a segment of `pool` made after event `index`: the pool
    /// was still in use then, so it had not gone away at `index`.
    fn makes_memory_after(&self, pool: MemPoolId, index: u64) -> bool {
        self.segments
            .values()
            .any(|&(_, of, made)| of == pool && made > index)
    }

    /// The pool of an allocation at `addr` recorded at event `index`, if any.
    fn pool_of(&self, addr: u64, index: u64) -> Option<MemPoolId> {
        let (_, &(end, pool, made)) = self.segments.range(..=addr).next_back()?;
        (addr < end && index >= made).then_some(pool)
    }
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

/// The run of releases (and deferred completions) since the last other event.
#[derive(Debug, Default)]
struct Run {
    /// `segment_free`/`segment_unmap` events in it.
    releases: u64,
    /// Their segments, in order: each one's size, and its pool as the recording's routes tell
    /// it (the default pools for a segment the routes do not name).
    released: Vec<ReleasedSegment>,
    /// The recorded addresses of its `segment_free` events, in order.
    freed_at: Vec<u64>,
    /// The recorded ranges (address, bytes) of its `segment_unmap` events, in order.
    unmapped_at: Vec<(u64, u64)>,
    /// By release, in order: the event that made its segment, where the trace shows it (a
    /// whole segment's `segment_free`).
    released_made: Vec<Option<u64>>,
    /// `segment_alloc`/`segment_map` events in it.
    new_memory: u64,
    /// Bytes they acquired.
    new_bytes: u64,
    /// Deferred completions in it.
    completions: u64,
    /// Of those, completions right after their `free_requested` (they read as immediate
    /// frees, so they are no sign of an `empty_cache()`).
    adjacent: u64,
    /// Completions recorded before any release of the run, with their made-up streams: a
    /// malloc's `process_events` made them, or (when no release came before) its OOM path.
    leading: Vec<(StreamId, Allocation)>,
    /// Whether a release's frames name `empty_cache`.
    empty_cache_frame: bool,
    /// Whether the run's first release is a window's first event: the history ring may have
    /// cut the run, and releases of it made before the cut are not in the file.
    began_at_window_start: bool,
    /// Whether the malloc that ends the run is the first of a CUDA-graph capture (its frames
    /// say so, the stream's allocation before did not): `torch.cuda.graph.__enter__`
    /// synchronised and called `empty_cache()` before the capture began, so the run's releases
    /// and completions are that call's, and it was made even when the trace shows nothing.
    capture: bool,
    /// The made-up streams of completions recorded after a release of the run: PyTorch's OOM
    /// path completed them; the replayed malloc's should too, else they are done after it.
    after_release: Vec<StreamId>,
    /// The leading completions the run took for the OOM path's of the `oom` that ends it
    /// (their made-up streams are in `after_release`): frees made at once after all where
    /// that `oom` turns out to have been asked in a private pool
    /// ([`Engine::frees_before_a_pool_oom_were_made_at_once`]).
    oom_path_frees: Vec<(StreamId, Allocation)>,
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

    /// Notes whether the allocation of `event` begins a CUDA-graph capture (a trace without
    /// frames shows none; frees carry the frames of their allocation, and PyTorch 2.11 records
    /// most `oom` entries without frames, so only allocations tell):
    /// - its frames show a capture underway and its stream's allocation before did not;
    /// - or it is on `torch.cuda.graph`'s capture stream (learnt from the frames of the
    ///   first allocation on it, made as a capture began) and the allocation before it, on
    ///   any stream, was not: the captures users make run one after another on that stream,
    ///   with the warm-ups and eager code between them on others.
    fn see_capture(&mut self, event: &RawEvent) {
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
    fn route_to_inferred_pool(&mut self, event: &RawEvent) {
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

    /// Under the recorded config, an allocation that made a new segment (this run's) where
    /// the replay's default pools, in the recording's state, hold a free block that would
    /// serve it: PyTorch's malloc did not look there, but in a private pool no frame names
    /// and the file's end no longer shows (a `MemPool` entered with `use_mem_pool` and gone
    /// by the end). Routed to that pool ([`Engine::unshown_mem_pool_for`]). Where instead
    /// garbage collection would have released cached segments first and the trace shows no
    /// release (`released`: it shows some), those segments were not the default large pool's,
    /// the only one the collector reads ([`Engine::claim_uncollected`]).
    fn infer_mem_pool(&mut self, event: &RawEvent, released: bool) -> Result<(), String> {
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
    fn infer_collecting_mem_pool(&mut self, event: &RawEvent) -> Result<(), String> {
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
        let pool = self.unshown_mem_pool_for(event)?;
        let outlook = match pool {
            Some(pool) => Some(self.outlook_in(event, Some(pool), &leading)?),
            None => self
                .allocator
                .malloc_outlook_in_empty_pool(stream, size, &leading),
        };
        let collects_the_run = match &outlook {
            Some(MallocOutlook::Collect(sizes)) => *sizes == self.run.released,
            _ => false,
        };
        // A whole `empty_cache()` would make just these releases, in this order: the trace
        // reads as well as the job's call before a default-pool malloc, the likelier reading
        // (a pool's first malloc collecting garbage is told by what a call would not release).
        let call_reads_so = self.empty_cache_addresses() == self.run.freed_at
            && !self.leaves_a_free_pending(self.run.leading.len());
        if collects_the_run && !call_reads_so {
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
    fn infer_releasing_mem_pool(&mut self, event: &RawEvent) -> Result<(), String> {
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
    fn infer_oom_mem_pool(&mut self, event: &RawEvent, released: bool) -> Result<(), String> {
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
                let pool = match self.unshown_mem_pool_for(event)? {
                    Some(pool) => pool,
                    None => self.capture_pools.new_mem_pool(event.stream),
                };
                self.capture_pools.claim_request(self.index, pool);
                // Read from what the default pools hold: if a release later shows one of
                // those segments to be a pool's, that reading was wrong.
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
            None => return Ok(()),
        };
        self.stream_pools.insert(event.stream, pool);
        self.frees_before_a_pool_oom_were_made_at_once()
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
    fn oom_in_mem_pool_returned_to(&mut self, event: &RawEvent) -> Result<(), String> {
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

    /// Whether a `free_completed` completes a deferred free still waiting in the replay.
    fn is_deferred(&self, event: &RawEvent) -> bool {
        let addr = event.addr as u64;
        self.live
            .get(&addr)
            .is_some_and(|live| live.deferred.is_some())
            || self.skipped_deferred.contains(&addr)
    }

    /// Before an event that is not part of a run of releases: decides whether the run was an
    /// `empty_cache()` (see the module documentation) and replays it if so. `malloc` is the
    /// `alloc` or `oom` event that ends the run, if one does.
    fn end_run(&mut self, malloc: Option<&RawEvent>) -> Result<(), String> {
        // Frees whose work is done complete in the order the trace shows, whether the malloc's
        // `process_events` (asked below for its outlook, which completes what is done) or the
        // loop further down completes them: set before anything is asked.
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
        // Where the `oom` was asked decides how its run reads: before anything reads it.
        if let Some(event) = malloc.filter(|event| event.action == Action::Oom) {
            self.oom_in_mem_pool_returned_to(event)?;
        }
        if let Some(event) = malloc {
            self.collection_cut_by_the_window(event)?;
            self.age_what_the_collector_took(event)?;
        }
        self.released_mem_pools_went_away(malloc)?;
        // Cleared first: `oom_in_default_pools` asks `route`, which reads it.
        self.oom_in_default = false;
        self.oom_in_default = match malloc {
            Some(event) if event.action == Action::Oom => self.oom_in_default_pools(event)?,
            _ => false,
        };
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
        let missed = run.new_memory > 0 || malloc.is_some_and(|event| event.action == Action::Oom);
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

    /// Replays a run of releases read as an `empty_cache()` that begins with the segments of
    /// an inferred `MemPool` ([`CapturePools::route_new_mem_pool`]) as that pool's
    /// `emptyCache(pool)` (a `torch.cuda.MemPool` going away), then, when the run releases
    /// more, a whole `empty_cache()`: a whole one walks the default pools first and the
    /// freeable private pools after, so a pool's segments released first were its own call's.
    /// Returns whether it replayed the run so.
    fn empty_cache_of_inferred_mem_pool(&mut self, run: &Run) -> Result<bool, String> {
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
    fn empty_cache_of_a_pool_and_beside(&mut self, run: &Run) -> Result<bool, String> {
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
    fn claim_released_by_pool_malloc(&mut self, run: &Run, event: &RawEvent) -> Result<(), String> {
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
    fn claim_released_out_of_order(&mut self, run: &Run) {
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

    /// The bases of the segments a whole `empty_cache()` would release now that the replay
    /// holds in the default pools (not a freeable private pool's), in that call's order.
    fn default_segments_a_whole_call_releases(&self) -> Vec<u64> {
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
    fn empty_cache_addresses(&self) -> Vec<u64> {
        self.allocator
            .empty_cache_outlook()
            .into_iter()
            .map(|(address, _)| address)
            .collect()
    }

    /// Whether a whole `empty_cache()` would release just the segments at `addresses`, in
    /// whatever order: a run of them then reads as the job's call.
    fn whole_empty_cache_releases(&self, addresses: &[u64]) -> bool {
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
    fn leaves_a_free_pending(&self, completed: usize) -> bool {
        self.allocator.pending_frees().blocks > completed as u64
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
    fn claim_released_after(&mut self, run: &Run, own: usize, pool: MemPoolId) {
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
    fn empty_cache_of_an_unknown_pool(&mut self, run: &Run) -> Result<bool, String> {
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
    fn pools_own_empty_cache(&mut self, run: &Run) -> Result<bool, String> {
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
    fn malloc_releases(
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

    /// What the malloc of `event` would do now, routed as it will be, once the frees whose
    /// events completed are back ([`CachingAllocator::malloc_outlook`]).
    fn outlook(&mut self, event: &RawEvent) -> Result<MallocOutlook, String> {
        let pool = self.route(event);
        self.outlook_in(event, pool, &[])
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
                || self.claim_unreleased_by_default_oom(pool, &recorded)),
            Err(error) => Err(error),
        };
        self.run.released = recorded;
        in_default
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
    fn claim_unreleased_by_default_oom(
        &mut self,
        stream_pool: MemPoolId,
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
        let mem_pool = self.capture_pools.is_mem_pool(stream_pool)
            || (stream_pool.first == 0 && self.routes.names(stream_pool));
        let pool = if mem_pool {
            stream_pool
        } else {
            self.capture_pools.new_unfed_mem_pool()
        };
        for index in made {
            self.capture_pools.claim_made(index, pool, self.index);
        }
        // Read from the replay's state: right only if its config is the recording's.
        self.assumed_recorded_config = true;
        true
    }

    /// What the malloc of `event` would do now asked in `pool` (`None`: the default pools),
    /// the pending frees of `completed` taken as done
    /// ([`CachingAllocator::malloc_outlook_if_completed`]).
    fn outlook_in(
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

    /// Hands the allocator's segment events since the last call to the comparison, as
    /// replayed at event `index`.
    fn observe(&mut self, index: u64) {
        let mut log = self.log.borrow_mut();
        for event in log.0.drain(..) {
            self.segments.replayed(index, event);
        }
    }

    /// The private pool an allocation recorded at `event` goes to, if any.
    fn route(&self, event: &RawEvent) -> Option<MemPoolId> {
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
    fn enter_pool(
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
    pub(super) fn mem_pool_claims_read_in_time(&self, limit: u64) -> Vec<(u64, MemPoolId)> {
        self.capture_pools.mem_pool_claims_read_in_time(limit)
    }

    /// Takes a self-replay's `MemPool` claims: for a replay under
    /// another config than the recorded one, which cannot infer them itself.
    pub fn learn_mem_pools(&mut self, claims: &[(u64, MemPoolId)]) {
        self.capture_pools.learn(claims);
    }

    /// The graph of the inferred pool `pool` went away: PyTorch releases a private pool's
    /// cached segments only once it is freeable. The lasting use the replay gave it
    /// ([`Engine::enter_pool`]) goes, and no stream asks it again (an `oom` on the stream it
    /// served last).
    fn pool_went_away(&mut self, pool: MemPoolId) -> Result<(), String> {
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
    fn leave_pool(&mut self, pool: Option<MemPoolId>) -> Result<(), String> {
        let Some(pool) = pool else {
            return Ok(());
        };
        let fail = |error: AllocError| format!("the allocator failed: {error}");
        self.allocator.end_allocate_to_pool(pool).map_err(fail)?;
        self.allocator.release_pool(pool).map_err(fail)
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
        let result = match self.made_before_window(event, size) {
            Some(made) => made,
            None => self.allocator.malloc_on(stream, size),
        };
        self.allocator.walk_streams_first(&[]);
        self.leave_pool(entered)?;
        self.after_malloc()?;
        if let Some(hints) = &self.hints {
            hints.clear();
        }
        Ok((size, result))
    }

    /// Before the malloc `event` whose run released `cudaMalloc` segments, under the recorded
    /// config, in a trace that starts mid-run: the collector frees the cached blocks of at
    /// least the average age, and the start state's were cached all at once, where the
    /// recording had cached them at times before the window. Those the run released, still
    /// cached as the start left them, get an age with which the malloc's collection makes
    /// exactly the run's releases, where one does
    /// ([`CachingAllocator::age_unseen_segments`]); otherwise nothing changes.
    fn age_what_the_collector_took(&mut self, event: &RawEvent) -> Result<(), String> {
        if self.run.freed_at.is_empty() || !self.recorded_config || !self.started_mid_run {
            return Ok(());
        }
        let size = non_negative(event.size, "size")?;
        let stream = event.stream as u64;
        let pool = self.route(event);
        let entered = self.enter_pool(pool, stream)?;
        self.allocator
            .age_unseen_segments(stream, size, &self.run.freed_at);
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
    fn collection_cut_by_the_window(&mut self, event: &RawEvent) -> Result<(), String> {
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
    /// or more serves no smaller request): the ring dropped the `segment_alloc` its malloc
    /// made just before, and the segment is that malloc's
    /// ([`CachingAllocator::malloc_from_made_segment`]). Read from the recorded config only.
    /// `None`: the request goes through the allocator as any other.
    fn made_before_window(
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

    fn alloc(&mut self, index: u64, event: &RawEvent) -> Result<(), String> {
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
    fn free_requested(&mut self, index: u64, event: &RawEvent) -> Result<(), String> {
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
    fn free_now(&mut self, event: &RawEvent) -> Result<(), String> {
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
    fn defer_free(&mut self, event: &RawEvent, counted: bool) -> Result<(), String> {
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
    fn complete_deferred(&mut self, event: &RawEvent) -> Result<(), String> {
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
    fn recorded_oom(&mut self, index: u64, event: &RawEvent) -> Result<(), String> {
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

impl Engine {
    /// Records an OOM at event `index` for a request of `size` bytes: counted by cause, and
    /// the first ones kept with their diagnosis and the largest allocations live then.
    fn answer(&mut self, index: u64, size: u64, oom: &OutOfMemory, source: OomSource) {
        let why = Why::of(oom);
        self.causes.add(why.cause);
        if self.ooms.len() >= answer::ANSWERED_OOMS {
            return;
        }
        let stats = self.allocator.stats();
        let device_free = self
            .allocator
            .device()
            .mem_get_info()
            .map_or(0, |(free, _)| free);
        let live = self
            .live
            .iter()
            .map(|(&addr, live)| (addr, live.index, live.allocation.size, live.requested));
        let record = FirstOom {
            index,
            source,
            size,
            allocated: stats.allocated_bytes.all.current,
            reserved: stats.reserved_bytes.all.current,
            device_free,
            message: oom.message.clone(),
            why,
            frames: Vec::new(),
            frames_from: None,
            largest_live: answer::largest(live, answer::LARGEST_LIVE),
        };
        if self.first_oom.is_none() {
            self.first_oom = Some(record.clone());
        }
        self.ooms.push(record);
        if self.ooms.len() >= answer::ANSWERED_OOMS {
            // Later OOMs are only counted by cause: their diagnoses need no trial.
            self.allocator.set_expandable_trials(false);
        }
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

fn device_event(event: &RawEvent) -> DeviceEvent {
    (event.action, event.addr as u64, event.size.max(0) as u64)
}

/// Whether a malloc with `outlook` runs out of memory after the releases `recorded` (in that
/// order): a reading that serves the request (from the cache, by new memory or after garbage
/// collection) is not the recorded `oom`'s. Releases gpumem does not predict (expandable
/// segments) count as the recorded ones.
fn runs_out_releasing(outlook: &MallocOutlook, recorded: &[ReleasedSegment]) -> bool {
    match outlook {
        MallocOutlook::Release {
            released: Some(sizes),
            ..
        } => sizes == recorded,
        MallocOutlook::Release { released: None, .. } => true,
        MallocOutlook::Cached | MallocOutlook::NewMemory | MallocOutlook::Collect(_) => false,
    }
}

fn non_negative(value: i64, what: &str) -> Result<u64, String> {
    u64::try_from(value).map_err(|_| format!("negative {what} {value}"))
}

fn never_allocated(action: &str, addr: u64) -> String {
    format!(
        "{action} of address {addr:#x}, which was never allocated in this trace (or already freed)"
    )
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
