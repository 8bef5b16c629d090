//! The caching allocator: a re-implementation of PyTorch's native CUDA caching allocator
//! (`c10/cuda/CUDACachingAllocator.cpp`, `DeviceCachingAllocator`) for one device, with pools
//! kept per stream. Pure logic: it knows devices only through [`DeviceMemory`] and nothing of
//! scripts.
//!
//! For the same sequence of requests it makes the same device calls and keeps the same
//! counters as PyTorch 2.11, so `memory_stats()`, `memory_summary()` and the OOM message match.
//! The malloc/free path is here; releasing memory (`empty_cache`, the retry path, garbage
//! collection) is in `release.rs`, expandable segments in `expandable` (page bookkeeping)
//! and `vmm.rs` (the rules using it), the OOM message in `oom.rs`, the event trace in
//! `trace`.

pub(crate) mod block;
pub(crate) mod config;
pub(crate) mod diagnosis;
pub(crate) mod events;
pub(crate) mod expandable;
pub mod format;
mod free_index;
mod invariants;
pub(crate) mod measure;
mod oom;
pub(crate) mod outlook;
pub(crate) mod pending;
pub(crate) mod pools;
mod release;
mod retry_outlook;
mod size_classes;
pub(crate) mod snapshot;
pub(crate) mod stats;
pub mod summary;
pub(crate) mod trace;
mod trial;
mod vmm;
#[cfg(test)]
pub(crate) mod xorshift;

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};

use thiserror::Error;

use crate::device::{DeviceError, DeviceMemory, DevicePtr, StreamEvent};
pub use block::{
    Block, BlockId, Pool, PoolOwner, SegmentId, StreamId, DEFAULT_OWNER, NIL, NO_SEGMENT,
};
use block::{BlockArena, BlockPool};
pub use config::{AllocConf, ConfigError};
pub use events::{EventKind, EventLog, MemoryEvent, MemoryObserver, Subscription};
use expandable::SegmentTable;
pub use pending::PendingFrees;
pub use pools::{MemPoolId, PoolFilter, PrivatePoolInfo};
pub use snapshot::{BlockSnapshot, BlockState, SegmentSnapshot};
pub use stats::{DeviceStats, ScopeMark, ScopeReport, Stat, StatArray};
pub use trace::{TraceEntry, TraceRecorder};
pub use trial::ExpandableTrial;

/// One mebibyte.
pub const MIB: u64 = 1 << 20;
/// Every request is rounded up to a multiple of this, and to at least this (`kMinBlockSize`).
pub const MIN_BLOCK_SIZE: u64 = 512;
/// Requests whose rounded size is at most this go to the small pool (`kSmallSize`, 1 MiB).
pub const SMALL_SIZE: u64 = MIB;
/// Segment size for the small pool (`kSmallBuffer`, 2 MiB).
pub const SMALL_BUFFER: u64 = 2 * MIB;
/// Large requests below this share one 20 MiB segment (`kMinLargeAlloc`, 10 MiB).
pub const MIN_LARGE_ALLOC: u64 = 10 * MIB;
/// Large requests from 10 MiB up get their own segment rounded up to this (`kRoundLarge`).
pub const ROUND_LARGE: u64 = 2 * MIB;
/// Segment size for large requests below 10 MiB by default (`kLargeBuffer`, 20 MiB; PyTorch
/// 2.11's default `large_segment_size`, which `large_segment_size_mb` changes); also the default
/// `max_non_split_rounding_mb` and the smallest allowed `max_split_size_mb`.
pub const LARGE_BUFFER: u64 = 20 * MIB;
/// Requests of this size or more are refused outright (PyTorch: "Tried to allocate more than
/// 1EB memory.").
pub const ONE_EXABYTE: u64 = 1 << 60;

/// A block handed out by [`CachingAllocator::malloc`]. Zero-byte requests get a null
/// allocation ([`DevicePtr::NULL`], `id` [`NIL`]) that owns no block, as PyTorch returns a null
/// pointer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocation {
    /// The block's id, [`NIL`] for a zero-byte allocation.
    pub id: BlockId,
    /// Device address of the block, derived from its segment's address (the device's);
    /// [`DevicePtr::NULL`] for a zero-byte allocation.
    pub ptr: DevicePtr,
    /// The block's (rounded) size in bytes.
    pub size: u64,
}

impl Allocation {
    /// The allocation of a zero-byte request.
    pub const NULL: Allocation = Allocation {
        id: NIL,
        ptr: DevicePtr::NULL,
        size: 0,
    };

    /// Whether this is the null allocation of a zero-byte request.
    pub fn is_null(&self) -> bool {
        self.id == NIL
    }
}

/// PyTorch's `torch.OutOfMemoryError`: no cached block fits and the device (or the memory
/// fraction) refused a new segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutOfMemory {
    /// PyTorch's message, word for word.
    pub message: String,
    /// Bytes of the segment that could not be obtained ("Tried to allocate ...").
    pub alloc_size: u64,
    /// The facts at the error and their cause (`diagnosis`).
    pub diagnosis: Box<diagnosis::OomDiagnosis>,
}

impl OutOfMemory {
    /// gpumem's line saying why, printed after PyTorch's message.
    pub fn why(&self) -> String {
        self.diagnosis.why()
    }
}

/// Everything the allocator can refuse.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum AllocError {
    /// Out of memory; the message is PyTorch's.
    #[error("{}", .0.message)]
    OutOfMemory(OutOfMemory),
    /// The device failed in a way other than running out of memory, or cannot do what the
    /// config asks (e.g. expandable segments on a device without virtual memory management).
    #[error("device error: {0}")]
    Device(#[from] DeviceError),
    /// The allocator found its own bookkeeping inconsistent: a bug in gpumem, never the
    /// user's input. The operation was refused; the allocator's state is as before it.
    #[error("internal allocator error: {0}")]
    Internal(String),
    /// `free` of something that is not a live allocation of this allocator.
    #[error("invalid free: {0}")]
    InvalidFree(String),
    /// Another call (`record_stream`) about something that is not a live allocation.
    #[error("{0}")]
    UnknownAllocation(String),
    /// A private-pool call PyTorch refuses (an unknown pool, one released twice, a pool made
    /// active twice).
    #[error("memory pool: {0}")]
    Pool(String),
    /// `set_per_process_memory_fraction` outside [0, 1].
    #[error("set_per_process_memory_fraction: fraction must be between 0 and 1, got {0}")]
    InvalidFraction(f64),
}

/// What a malloc looks for: the stream, the rounded size, its pool (kind and owner), the
/// segment size a miss needs and whether new memory comes from expandable segments
/// (PyTorch's `AllocParams`).
#[derive(Debug, Clone, Copy)]
struct Request {
    stream: StreamId,
    size: u64,
    pool: Pool,
    owner: PoolOwner,
    alloc_size: u64,
    expandable: bool,
}

/// What `free` read from the block it frees, handed to `free_block` so the block is read once.
#[derive(Debug, Clone, Copy)]
struct Freed {
    id: BlockId,
    pool: Pool,
    owner: PoolOwner,
    size: u64,
    requested: u64,
    ptr: u64,
    stream: StreamId,
    prev: BlockId,
    next: BlockId,
    expandable: bool,
}

impl Freed {
    /// What freeing `block` (whose id is `id`) needs of it, read now.
    #[inline]
    fn of(id: BlockId, block: &Block) -> Freed {
        Freed {
            id,
            pool: block.pool,
            owner: block.owner,
            size: block.size,
            requested: block.requested_size,
            ptr: block.ptr,
            stream: block.stream,
            prev: block.prev,
            next: block.next,
            expandable: block.is_expandable(),
        }
    }
}

/// A `cudaMalloc` segment: its address as the device handed it out, its size, pool (kind and
/// owner) and stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DeviceSegment {
    base: DevicePtr,
    size: u64,
    pool: Pool,
    owner: PoolOwner,
    stream: StreamId,
}

/// One expandable segment as [`CachingAllocator::expandable_segments`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpandableInfo {
    /// First byte of the reserved virtual range.
    pub base: u64,
    /// Bytes of the reserved range.
    pub reserved: u64,
    /// Bytes per page.
    pub page: u64,
    /// Bytes mapped now.
    pub mapped: u64,
    /// The stream it serves.
    pub stream: StreamId,
    /// The pool it serves.
    pub pool: Pool,
    /// The memory pool it belongs to ((0, 0) for the default pools).
    pub pool_id: MemPoolId,
}

/// The cap on reserved bytes that a memory fraction sets on a device of `total` bytes
/// (PyTorch's `allowed_memory_maximum = static_cast<size_t>(fraction * device_total)`,
/// truncated); `None` for 1.0 and above, which lift the cap. Shared by
/// [`CachingAllocator::set_memory_fraction`] and the replay, which reads the cap a recorded
/// config's fraction put on the recorded run.
pub fn fraction_cap(fraction: f64, total: u64) -> Option<u64> {
    (fraction < 1.0).then_some((fraction * total as f64) as u64)
}

/// Hands every allocator a distinct [`CachingAllocator::id`].
static NEXT_ALLOCATOR_ID: AtomicU64 = AtomicU64::new(1);

/// PyTorch's caching allocator for one device.
pub struct CachingAllocator {
    /// Distinguishes allocators that live side by side (a script may open a second one).
    id: u64,
    device: Box<dyn DeviceMemory>,
    config: AllocConf,
    blocks: BlockArena,
    small: BlockPool,
    large: BlockPool,
    /// Cached blocks of the default large pool whose age the garbage collector reads was not
    /// seen: marked by [`CachingAllocator::mark_cached_ages_unseen`] (a replay's start
    /// state, cached all at once), each dropped once cached again. Empty otherwise.
    unseen_ages: std::collections::HashSet<BlockId>,
    /// The blocks [`CachingAllocator::age_unseen_segments`] last gave an age, until
    /// [`CachingAllocator::age_unseen_segments_again`] reads them.
    aged_unseen: Vec<BlockId>,
    /// Bytes the next garbage collection is to reclaim although the memory held is under its
    /// threshold ([`CachingAllocator::expect_collection_begun_before`]): a replay window's
    /// first malloc whose collection the history ring cut. Taken by the next malloc.
    collection_begun_before: Option<u64>,
    /// Whether the next malloc's search of the cache already failed, at a time the file does
    /// not show ([`CachingAllocator::expect_cache_searched_before`]): a replay window's first
    /// malloc whose OOM path the history ring cut. Taken by the next malloc.
    cache_searched_before: bool,
    /// The private pools (graph pools, `MemPool`s) and which of them allocations go to.
    pools: pools::PrivatePools,
    stats: DeviceStats,
    /// Bytes currently held from the device (PyTorch's `total_allocated_memory`): `cudaMalloc`
    /// segments plus mapped pages.
    total_allocated_memory: u64,
    /// The cap set by `set_per_process_memory_fraction` (PyTorch's `allowed_memory_maximum`).
    allowed_memory_maximum: Option<u64>,
    /// Every `cudaMalloc` segment by base address. Touched only when segments come and go.
    segments: BTreeMap<u64, DeviceSegment>,
    /// Every live expandable segment (PyTorch's `expandable_segments_`).
    expandable: SegmentTable,
    /// The memory history (PyTorch's `alloc_buffer` and `record_history`): the built-in
    /// observer of the event stream.
    trace: TraceRecorder,
    /// Every other observer of the event stream ([`CachingAllocator::subscribe`]).
    observers: events::Observers,
    /// Whether anything listens to the event stream: the history records or an observer is
    /// subscribed. Kept apart so an unobserved allocator pays one branch per event.
    listening: bool,
    /// Whether something listens to more than the segment events: the history records, or
    /// an observer not [`MemoryObserver::segment_events_only`]. When not, a malloc or free
    /// that touches no segment emits nothing.
    listening_to_all: bool,
    /// The caller-supplied context stamped on every event ([`CachingAllocator::set_trace_context`]).
    context: u32,
    /// The streams other than its own each allocated block was used on (`record_stream`;
    /// PyTorch's `Block::stream_uses`), for the blocks that have any.
    stream_uses: BTreeMap<BlockId, Vec<StreamId>>,
    /// Outstanding events by stream, oldest first, each with the block whose free it holds
    /// back (PyTorch's `cuda_events`). PyTorch keeps the streams in a hash map; gpumem walks
    /// them in stream order, after `streams_first`.
    cuda_events: BTreeMap<StreamId, VecDeque<(StreamEvent, BlockId)>>,
    /// Streams whose events a synchronisation walks first, in this order (the order a
    /// recorded trace shows PyTorch's hash map gave; see
    /// [`CachingAllocator::walk_streams_first`]).
    streams_first: Vec<StreamId>,
    /// Blocks freed with recorded streams while a private pool was active, whose events are
    /// recorded once none is (PyTorch's `deferred_blocks`), in the order freed.
    deferred_blocks: Vec<BlockId>,
    /// The streams recorded for a block while a private pool was active (PyTorch's
    /// `block_to_cudagraph_stream_uses`).
    capture_stream_uses: BTreeMap<BlockId, Vec<StreamId>>,
    /// Whether an out-of-memory error's diagnosis tries the request under expandable segments
    /// ([`CachingAllocator::set_expandable_trials`]).
    expandable_trials: bool,
}

impl CachingAllocator {
    /// An empty allocator drawing segments from `device`. A `per_process_memory_fraction` in
    /// the config is applied at once, as PyTorch does at start-up.
    pub fn new(device: Box<dyn DeviceMemory>, config: AllocConf) -> Result<Self, AllocError> {
        let mut allocator = CachingAllocator {
            id: NEXT_ALLOCATOR_ID.fetch_add(1, Ordering::Relaxed),
            device,
            stats: DeviceStats::new(config.max_split_size_stat()),
            config,
            blocks: BlockArena::default(),
            small: BlockPool::default(),
            large: BlockPool::default(),
            unseen_ages: std::collections::HashSet::new(),
            aged_unseen: Vec::new(),
            collection_begun_before: None,
            cache_searched_before: false,
            pools: pools::PrivatePools::default(),
            total_allocated_memory: 0,
            allowed_memory_maximum: None,
            expandable_trials: true,
            segments: BTreeMap::new(),
            expandable: SegmentTable::default(),
            trace: TraceRecorder::default(),
            observers: events::Observers::default(),
            listening: false,
            listening_to_all: false,
            context: 0,
            stream_uses: BTreeMap::new(),
            cuda_events: BTreeMap::new(),
            streams_first: Vec::new(),
            deferred_blocks: Vec::new(),
            capture_stream_uses: BTreeMap::new(),
        };
        if let Some(fraction) = allocator.config.per_process_memory_fraction {
            allocator.set_memory_fraction(fraction)?;
        }
        Ok(allocator)
    }

    /// An id no other allocator of this process has: a block belongs to the allocator whose
    /// id was current when it was handed out.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The configuration in force.
    pub fn config(&self) -> &AllocConf {
        &self.config
    }

    /// The device segments come from.
    pub fn device(&self) -> &dyn DeviceMemory {
        self.device.as_ref()
    }

    /// Mutable access to the device: queueing work on its streams (`sleep`), as a job keeps a
    /// stream busy while a freed block waits for it.
    pub fn device_mut(&mut self) -> &mut dyn DeviceMemory {
        self.device.as_mut()
    }

    /// The counters (`torch.cuda.memory_stats()`).
    pub fn stats(&self) -> &DeviceStats {
        &self.stats
    }

    /// The memory history.
    pub fn trace(&self) -> &TraceRecorder {
        &self.trace
    }

    /// Turns the memory history on or off (off forgets what was recorded, as PyTorch's
    /// `recordHistory(enabled=False)`), keeping at most `max_entries` entries.
    pub fn record_history(&mut self, enabled: bool, max_entries: usize) {
        self.trace.set_max_entries(max_entries);
        self.trace.set_enabled(enabled);
        self.update_listening();
    }

    /// Replaces the history's clock (tests use a fixed one).
    pub fn set_history_clock(&mut self, clock: trace::Clock) {
        self.trace.set_clock(clock);
    }

    /// Sets the opaque context id stamped on every event from now on (the script layer maps it
    /// to "file:line").
    pub fn set_trace_context(&mut self, context: u32) {
        self.context = context;
    }

    /// The context id stamped on new events.
    pub fn trace_context(&self) -> u32 {
        self.context
    }

    /// Subscribes `observer` to the event stream: from now on it is told about every event,
    /// in order. Returns the handle that ends the subscription.
    pub fn subscribe(&mut self, observer: Box<dyn MemoryObserver>) -> Subscription {
        let id = self.observers.add(observer);
        self.update_listening();
        id
    }

    /// Ends a subscription, handing the observer back (`None` if it already ended).
    pub fn unsubscribe(&mut self, id: Subscription) -> Option<Box<dyn MemoryObserver>> {
        let observer = self.observers.remove(id);
        self.update_listening();
        observer
    }

    /// Whether anything listens to the event stream (history or an observer): callers that
    /// stamp contexts can skip the work otherwise.
    #[inline]
    pub fn is_listened_to(&self) -> bool {
        self.listening
    }

    fn update_listening(&mut self) {
        self.listening = self.trace.enabled() || !self.observers.is_empty();
        self.listening_to_all = self.trace.enabled() || self.observers.want_every_event();
    }

    /// Emits one event (see [`MemoryEvent`] for what `addr`, `size` and `bytes` mean per
    /// kind). While nothing listens this is one predictable branch; the rest is kept out of
    /// line.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn emit(
        &mut self,
        kind: EventKind,
        addr: u64,
        size: u64,
        bytes: u64,
        stream: StreamId,
        pool: Pool,
        owner: PoolOwner,
    ) {
        // `kind` is a constant where this is inlined, so a malloc or free tests one flag.
        if self.listening_to_all || (self.listening && kind.is_segment_event()) {
            self.tell(
                MemoryEvent {
                    kind,
                    addr,
                    size,
                    bytes,
                    stream,
                    pool,
                    pool_id: MemPoolId::DEFAULT,
                    context: self.context,
                },
                owner,
            );
        }
    }

    #[cold]
    #[inline(never)]
    fn tell(&mut self, mut event: MemoryEvent, owner: PoolOwner) {
        event.pool_id = self.pool_id(owner);
        self.trace.record(&event);
        self.observers.tell(&event);
    }

    /// `torch.cuda.reset_peak_memory_stats()`.
    pub fn reset_peak_stats(&mut self) {
        self.stats.reset_peak();
    }

    /// `torch.cuda.reset_accumulated_memory_stats()`.
    pub fn reset_accumulated_stats(&mut self) {
        self.stats.reset_accumulated();
    }

    /// Bytes held from the device (reserved), as the fraction limit counts them.
    pub fn total_allocated_memory(&self) -> u64 {
        self.total_allocated_memory
    }

    /// The byte cap from `set_per_process_memory_fraction`, if any.
    pub fn allowed_memory_maximum(&self) -> Option<u64> {
        self.allowed_memory_maximum
    }

    /// Whether an out-of-memory error's diagnosis tries the request under expandable segments
    /// (`OomDiagnosis::expandable_trial`; on by default). The trial allocates every live block
    /// again on a side allocator, so its cost grows with the live blocks: a replay that reports
    /// only its first OOMs in full turns it off after them, and a trace that runs out of memory
    /// thousands of times with many tensors live stays fast.
    pub fn set_expandable_trials(&mut self, on: bool) {
        self.expandable_trials = on;
    }

    /// `torch.cuda.set_per_process_memory_fraction(fraction)`: caps the bytes held from the
    /// device at `fraction × total memory`; 1.0 removes the cap (PyTorch 2.11 semantics).
    pub fn set_memory_fraction(&mut self, fraction: f64) -> Result<(), AllocError> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(AllocError::InvalidFraction(fraction));
        }
        self.allowed_memory_maximum = fraction_cap(fraction, self.device.total_memory());
        let cap = self.allowed_memory_maximum.unwrap_or(0);
        self.emit(
            EventKind::SetMemoryFraction,
            0,
            cap,
            0,
            0,
            Pool::Large,
            DEFAULT_OWNER,
        );
        Ok(())
    }

    /// `set_per_process_memory_fraction`'s current value (`get_per_process_memory_fraction`).
    pub fn memory_fraction(&self) -> f64 {
        match self.allowed_memory_maximum {
            Some(allowed) => allowed as f64 / self.device.total_memory() as f64,
            None => 1.0,
        }
    }

    /// The size a request of `size` bytes is rounded to (PyTorch's `round_size`).
    pub fn round_size(&self, size: u64) -> u64 {
        round_size(&self.config, size)
    }

    /// The pool a rounded size is served from.
    pub fn pool_for(size: u64) -> Pool {
        if size <= SMALL_SIZE {
            Pool::Small
        } else {
            Pool::Large
        }
    }

    /// Bytes requested from the device when no cached block fits a rounded `size`
    /// (PyTorch's `get_allocation_size`): 2 MiB for the small pool, the large segment size
    /// (`large_segment_size_mb`, 20 MiB by default) for large requests below 10 MiB, else the
    /// size rounded up to 2 MiB. With expandable segments only the memory-fraction check and
    /// the OOM message use it; pages are mapped for the rounded size itself.
    pub fn allocation_size(&self, size: u64) -> u64 {
        allocation_size(size, self.config.large_segment_size)
    }

    /// The page size of a pool's expandable segments under this config
    /// (`expandable::page_size`).
    pub fn page_size(&self, pool: Pool) -> u64 {
        expandable::page_size(pool, self.config.large_segment_size)
    }

    /// The free blocks of one pool: the default pools' small or large set, or a private
    /// pool's (PyTorch's `BlockPool`).
    #[inline]
    fn pool_mut(&mut self, owner: PoolOwner, pool: Pool) -> &mut BlockPool {
        if owner != DEFAULT_OWNER {
            return self.pools.at_mut(owner).blocks_mut(pool);
        }
        match pool {
            Pool::Small => &mut self.small,
            Pool::Large => &mut self.large,
        }
    }

    /// [`CachingAllocator::pool_mut`] to read.
    #[inline]
    fn pool_ref(&self, owner: PoolOwner, pool: Pool) -> &BlockPool {
        if owner != DEFAULT_OWNER {
            return self.pools.at(owner).blocks(pool);
        }
        match pool {
            Pool::Small => &self.small,
            Pool::Large => &self.large,
        }
    }

    fn garbage_collection_enabled(&self) -> bool {
        self.allowed_memory_maximum.is_some() && self.config.garbage_collection_threshold > 0.0
    }

    /// Whether new memory comes from expandable segments (PyTorch's
    /// `is_expandable_segments_active`: the option is on and the pool has no allocator of its
    /// own, which gpumem's private pools never have).
    #[inline]
    fn expandable_active(&self) -> bool {
        self.config.expandable_segments
    }

    /// Whether a private pool is active: PyTorch's `captures_underway` is not empty.
    #[inline]
    fn capture_underway(&self) -> bool {
        !self.pools.captures_underway.is_empty()
    }

    /// [`CachingAllocator::malloc_on`] on the default stream (0).
    #[inline]
    pub fn malloc(&mut self, orig_size: u64) -> Result<Allocation, AllocError> {
        self.malloc_on(0, orig_size)
    }

    /// Hands out a block of at least `orig_size` bytes for use on `stream`: a cached block of
    /// that stream when one fits, else new device memory, freeing cached memory and retrying
    /// before giving up with PyTorch's OOM (PyTorch's `DeviceCachingAllocator::malloc`).
    pub fn malloc_on(
        &mut self,
        stream: StreamId,
        orig_size: u64,
    ) -> Result<Allocation, AllocError> {
        self.malloc_rounded(stream, orig_size, None)
    }

    /// [`CachingAllocator::malloc_on`] for a block of exactly `size` bytes (a multiple of
    /// 512) from `pool`: the config's `roundup_power2_divisions` is not applied to the
    /// request, and the pool is not chosen by its size. A block a recording shows, free space
    /// between blocks among them, may have a size no single request rounds to (with
    /// `roundup_power2_divisions:4`, 5.5 MiB: requests round to 5 or 6 MiB), or be a large-pool
    /// block of 1 MiB or less (an expandable segment's, next to unmapped pages); rebuilding
    /// such a recorded layout block by block needs pieces of exactly that size and pool.
    /// Everything else (best fit, splitting, new memory, the OOM path) is `malloc_on`'s.
    pub fn malloc_unrounded_on(
        &mut self,
        stream: StreamId,
        size: u64,
        pool: Pool,
    ) -> Result<Allocation, AllocError> {
        self.malloc_rounded(stream, size, Some(pool))
    }

    /// `malloc_on`, with the request rounded by the config and served from the pool its size
    /// picks (`exact: None`), or rounded only to [`MIN_BLOCK_SIZE`] and served from the pool
    /// given.
    fn malloc_rounded(
        &mut self,
        stream: StreamId,
        orig_size: u64,
        exact: Option<Pool>,
    ) -> Result<Allocation, AllocError> {
        // One malloc's: whichever path this one takes.
        let begun_before = self.collection_begun_before.take();
        let searched_before = std::mem::take(&mut self.cache_searched_before);
        if orig_size == 0 {
            return Ok(Allocation::NULL);
        }
        if orig_size >= ONE_EXABYTE {
            return Err(AllocError::OutOfMemory(OutOfMemory {
                message: "CUDA out of memory. Tried to allocate more than 1EB memory.".into(),
                alloc_size: orig_size,
                diagnosis: Box::new(self.diagnose(
                    (stream, self.pools.route(stream)),
                    orig_size,
                    orig_size,
                    orig_size,
                )),
            }));
        }
        // Frees held back by record_stream whose events completed go back to their pools
        // first (PyTorch's `process_events`); not while a private pool is active, when
        // PyTorch may not query events (graph capture).
        if !self.capture_underway() {
            self.process_events()?;
        }
        let (size, pool) = match exact {
            None => {
                let size = self.round_size(orig_size);
                (size, Self::pool_for(size))
            }
            Some(pool) => (orig_size.div_ceil(MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE, pool),
        };
        let mut request = Request {
            stream,
            size,
            pool,
            owner: self.pools.route(stream),
            alloc_size: self.allocation_size(size),
            expandable: self.expandable_active(),
        };

        // PyTorch also runs the free-memory callbacks and searches again here; the only one
        // registered (CUDA IPC) frees nothing in a single process.
        let mut found = if searched_before {
            None
        } else {
            self.get_free_block(request)
        };
        if found.is_none() {
            if self.garbage_collection_enabled() {
                self.garbage_collect_cached_blocks(begun_before)?;
            }
            found = self.alloc_block(request, false)?;
            if found.is_none() {
                if let Some((owner, block)) = self.try_mempool_fallback(request)? {
                    // Served from the pool that had a cached block: its kind of request, its
                    // owner, and no expandable growth (PyTorch's `mempool_params`).
                    request.owner = owner;
                    request.expandable = false;
                    found = Some(block);
                }
            }
            if found.is_none() && self.release_available_cached_blocks(request)? {
                found = self.alloc_block(request, false)?;
            }
            // The last resort is skipped while a private pool is active (PyTorch: only when
            // `captures_underway` is empty): no flush, no retry.
            if found.is_none() && !self.capture_underway() {
                self.release_cached_blocks(MemPoolId::DEFAULT)?;
                found = self.alloc_block(request, true)?;
            }
        }
        match found {
            Some(id) => self.alloc_found_block(id, request, orig_size),
            None => Err(self.out_of_memory(request, orig_size)),
        }
    }

    /// Best fit from the pool (PyTorch's `get_free_block`): the smallest free block of the
    /// request's stream, with the expandable-segment adjustment and the `max_split_size` rules
    /// that keep oversize blocks for oversize requests.
    fn get_free_block(&mut self, request: Request) -> Option<BlockId> {
        let gc = self.garbage_collection_enabled();
        let pool = self.pool_mut(request.owner, request.pool);
        if gc {
            pool.get_free_blocks_call_count += 1;
        }
        if self.config.max_split_size == u64::MAX && !self.config.expandable_segments {
            // No split limit and (without expandable segments in the config) no expandable
            // block, so no rule applies: take the best fit in one traversal.
            return self
                .pool_mut(request.owner, request.pool)
                .take_best_fit(request.stream, request.size);
        }
        let (_, block_size, ptr, id) = self.find_free_block(request)?;
        self.pool_mut(request.owner, request.pool)
            .remove(request.stream, block_size, ptr, id);
        Some(id)
    }

    /// The block [`CachingAllocator::get_free_block`] would take, without taking it.
    fn find_free_block(&self, request: Request) -> Option<block::FreeKey> {
        let pool = self.pool_ref(request.owner, request.pool);
        let mut key = pool.best_fit(request.stream, request.size)?;
        if self.blocks.at(key.3).is_expandable() {
            key = self.expandable_best_fit(request, key, request.expandable)?;
        }
        self.may_serve(request.size, key.1).then_some(key)
    }

    /// Whether `get_free_block` may hand the best-fitting cached free block, of `block_size`
    /// bytes, to a request rounded to `size` bytes (at most `block_size`): PyTorch refuses an
    /// oversize block to a smaller request, and one much larger to an oversize request.
    pub fn may_serve(&self, size: u64, block_size: u64) -> bool {
        let max_split_size = self.config.max_split_size;
        // Do not return an oversized block for a small request.
        if size < max_split_size && block_size >= max_split_size {
            return false;
        }
        // Do not return an oversized block for a large request much smaller than it.
        // PyTorch adds in size_t: a huge max_non_split_rounding_mb wraps around.
        !(size >= max_split_size
            && block_size >= size.wrapping_add(self.config.max_non_split_rounding_size))
    }

    /// The expandable part of `get_free_block`, starting from the best fit `first`, which lies
    /// in an expandable segment. With expandable segments on, a free block counts as large as
    /// it can grow (its size plus the unmapped range right after it), and the search moves on
    /// while the next block's growable size is smaller. With them off, expandable blocks are
    /// skipped.
    fn expandable_best_fit(
        &self,
        request: Request,
        first: block::FreeKey,
        active: bool,
    ) -> Option<block::FreeKey> {
        let pool = self.pool_ref(request.owner, request.pool);
        let mut candidates = pool.starting_at(first).skip(1);
        if !active {
            return candidates
                .find(|key| key.0 != request.stream || !self.blocks.at(key.3).is_expandable())
                .filter(|key| key.0 == request.stream);
        }
        let growable = |id: BlockId| {
            let block = self.blocks.at(id);
            let after = match self.blocks.get(block.next) {
                Some(next) if !next.mapped => next.size,
                _ => 0,
            };
            block.size + after
        };
        let mut chosen = first;
        for next in candidates {
            if !self.blocks.at(chosen.3).is_expandable()
                || next.0 != request.stream
                || growable(next.3) >= growable(chosen.3)
            {
                break;
            }
            chosen = next;
        }
        Some(chosen)
    }

    /// Gets new device memory for a request (PyTorch's `alloc_block`): a new `cudaMalloc`
    /// segment, or pages mapped into an expandable segment. `Ok(None)` means refused for lack
    /// of memory (by the device or the fraction cap).
    fn alloc_block(
        &mut self,
        request: Request,
        is_retry: bool,
    ) -> Result<Option<BlockId>, AllocError> {
        if is_retry {
            self.stats.num_alloc_retries += 1;
        }
        let size = request.alloc_size;
        if let Some(allowed) = self.allowed_memory_maximum {
            if self.total_allocated_memory + size > allowed {
                return Ok(None);
            }
        }
        if request.expandable {
            let block = self.try_allocate_expandable_block(request)?;
            if block.is_some() {
                self.count_private_malloc(request.owner);
            }
            return Ok(block);
        }
        let base = match self.device.malloc(size) {
            Ok(base) => base,
            Err(DeviceError::OutOfMemory) => return Ok(None),
            Err(other) => return Err(other.into()),
        };
        self.count_private_malloc(request.owner);
        let ptr = base.addr();
        self.total_allocated_memory += size;
        let pool = request.pool;
        self.stats.segment.increase(pool, 1);
        self.stats.reserved_bytes.increase(pool, size as i64);
        if size >= self.config.max_split_size {
            self.stats.oversize_segments.increase(1);
        }
        self.stats.num_device_alloc += 1;
        self.emit(
            EventKind::SegmentAlloc,
            ptr,
            size,
            size,
            request.stream,
            pool,
            request.owner,
        );
        self.segments.insert(
            ptr,
            DeviceSegment {
                base,
                size,
                pool,
                owner: request.owner,
                stream: request.stream,
            },
        );
        Ok(Some(self.blocks.insert(Block {
            stream: request.stream,
            ptr,
            size,
            requested_size: 0,
            pool,
            owner: request.owner,
            allocated: false,
            pending_free: false,
            event_count: 0,
            mapped: true,
            segment: NO_SEGMENT,
            segment_base: base,
            segment_size: size,
            prev: NIL,
            next: NIL,
            gc_count_base: 0,
        })))
    }

    /// A private pool's segment count (PyTorch's `cudaMalloc_count`) goes up by one.
    #[inline]
    fn count_private_malloc(&mut self, owner: PoolOwner) {
        if owner != DEFAULT_OWNER {
            self.pools.at_mut(owner).cuda_malloc_count += 1;
        }
    }

    /// A private pool's segment count goes down by one (PyTorch asserts it is positive; with
    /// expandable segments its count of maps and unmaps need not balance, so gpumem stops at
    /// zero).
    #[inline]
    fn uncount_private_malloc(&mut self, owner: PoolOwner) {
        if owner != DEFAULT_OWNER {
            let pool = self.pools.at_mut(owner);
            pool.cuda_malloc_count = pool.cuda_malloc_count.saturating_sub(1);
        }
    }

    /// Whether a found block is carved up (PyTorch's `should_split`): never in a pool marked
    /// `no_split`; with expandable segments active for the request, or in the small pool, when
    /// at least 512 bytes would remain; in the large pool when the request is below
    /// `max_split_size` and more than 1 MiB would remain.
    fn should_split(&self, block: &Block, size: u64, expandable: bool) -> bool {
        if !self.pools.no_split.is_empty()
            && self.pools.no_split.contains(&self.pool_id(block.owner))
        {
            return false;
        }
        let remaining = block.size - size;
        if block.pool == Pool::Small || expandable {
            remaining >= MIN_BLOCK_SIZE
        } else {
            size < self.config.max_split_size && remaining > SMALL_SIZE
        }
    }

    /// Splits off and hands out the front of a found block (PyTorch's `alloc_found_block`).
    /// Blocks of expandable segments leave the inactive-split counters alone. The found block
    /// is out of its pool; should its address not lie inside its segment (a bookkeeping bug),
    /// it goes back to the pool and nothing changes.
    #[inline]
    fn alloc_found_block(
        &mut self,
        id: BlockId,
        request: Request,
        orig_size: u64,
    ) -> Result<Allocation, AllocError> {
        let split = self.should_split(self.blocks.at(id), request.size, request.expandable);
        self.hand_out(id, request, orig_size, split)
    }

    /// [`CachingAllocator::alloc_found_block`] with the decision to split made by the caller
    /// (the checkpoint restore splits whenever the block is larger than the request).
    fn hand_out(
        &mut self,
        id: BlockId,
        request: Request,
        orig_size: u64,
        split: bool,
    ) -> Result<Allocation, AllocError> {
        let size = request.size;
        let pool = request.pool;
        let block = self.blocks.at(id);
        let already_split = block.is_split();
        let counts_split = !block.is_expandable();
        let handed_size = if split { size } else { block.size };
        let address = match self.device_address(block, handed_size) {
            Ok(address) => address,
            Err(error) => {
                self.insert_free(id);
                return Err(error);
            }
        };
        let handed_out = if split {
            // The allocated piece takes the low end; the remainder keeps the old block's id
            // and goes back to the pool.
            let (front, before, stream, segment, whole, owner) = (
                block.ptr,
                block.prev,
                block.stream,
                block.segment,
                block.size,
                block.owner,
            );
            let (segment_base, segment_size) = (block.segment_base, block.segment_size);
            let piece = self.blocks.insert(Block {
                stream,
                ptr: front,
                size,
                requested_size: 0,
                pool,
                owner,
                allocated: false,
                pending_free: false,
                event_count: 0,
                mapped: true,
                segment,
                segment_base,
                segment_size,
                prev: before,
                next: id,
                gc_count_base: 0,
            });
            if before != NIL {
                self.blocks.at_mut(before).next = piece;
            }
            let (rest_ptr, rest_size) = (front + size, whole - size);
            let rest = self.blocks.at_mut(id);
            rest.prev = piece;
            rest.ptr = rest_ptr;
            rest.size = rest_size;
            self.insert_free_at(id, stream, rest_size, rest_ptr, pool, owner);
            if counts_split {
                if already_split {
                    self.stats.inactive_split_bytes.decrease(pool, size as i64);
                } else {
                    self.stats
                        .inactive_split_bytes
                        .increase(pool, rest_size as i64);
                    self.stats.inactive_split.increase(pool, 1);
                }
            }
            piece
        } else {
            if already_split && counts_split {
                let block_size = self.blocks.at(id).size;
                self.stats
                    .inactive_split_bytes
                    .decrease(pool, block_size as i64);
                self.stats.inactive_split.decrease(pool, 1);
            }
            id
        };
        let max_split_size = self.config.max_split_size;
        let block = self.blocks.at_mut(handed_out);
        block.allocated = true;
        block.requested_size = orig_size;
        let (ptr, block_size, stream, owner) = (block.ptr, block.size, block.stream, block.owner);
        self.emit(
            EventKind::Alloc,
            ptr,
            orig_size,
            block_size,
            stream,
            pool,
            owner,
        );
        let stats = &mut self.stats;
        stats.allocation.increase(pool, 1);
        stats.allocated_bytes.increase(pool, block_size as i64);
        stats.active.increase(pool, 1);
        stats.active_bytes.increase(pool, block_size as i64);
        stats.requested_bytes.increase(pool, orig_size as i64);
        if block_size >= max_split_size {
            stats.oversize_allocations.increase(1);
        }
        debug_assert_eq!((address.addr(), handed_size), (ptr, block_size));
        Ok(Allocation {
            id: handed_out,
            ptr: address,
            size: block_size,
        })
    }

    /// The device address of the first `size` bytes of `block`, derived from its segment's
    /// address (the one the device handed out) by a checked offset: the one place the
    /// allocator turns its bookkeeping into a device address. An error when the bytes do not
    /// lie inside the segment, which the allocator's invariants rule out.
    #[inline]
    fn device_address(&self, block: &Block, size: u64) -> Result<DevicePtr, AllocError> {
        let segment = if block.is_expandable() {
            self.expandable
                .get(block.segment)
                .map(|segment| (segment.base, segment.size()))
        } else {
            Some((block.segment_base, block.segment_size))
        };
        segment
            .and_then(|(base, extent)| {
                let offset = block.ptr.checked_sub(base.addr())?;
                base.offset_within(extent, offset, size)
            })
            .ok_or_else(|| {
                AllocError::Internal(format!(
                    "the block at {:#x} of {size} bytes lies outside its segment",
                    block.ptr
                ))
            })
    }

    /// Caches a free block in its pool, stamping its age for the garbage collector (PyTorch's
    /// `insert_into_blocks`).
    #[inline]
    fn insert_free(&mut self, id: BlockId) {
        let block = self.blocks.at(id);
        let (stream, size, ptr, pool, owner) =
            (block.stream, block.size, block.ptr, block.pool, block.owner);
        self.insert_free_at(id, stream, size, ptr, pool, owner);
    }

    /// [`CachingAllocator::insert_free`] for a caller that has the block's key at hand (the
    /// hot paths: reading back fields just written costs a store-forwarding stall).
    #[inline]
    fn insert_free_at(
        &mut self,
        id: BlockId,
        stream: StreamId,
        size: u64,
        ptr: u64,
        pool: Pool,
        owner: PoolOwner,
    ) {
        let pool = self.pool_mut(owner, pool);
        let clock = pool.get_free_blocks_call_count;
        pool.insert(stream, size, ptr, id);
        self.blocks.at_mut(id).gc_count_base = clock;
        if !self.unseen_ages.is_empty() {
            self.unseen_ages.remove(&id);
        }
    }

    /// Takes a free block out of its pool's free set, or an unmapped range out of the unmapped
    /// set.
    #[inline]
    fn uncache(&mut self, id: BlockId) {
        let &Block {
            stream,
            size,
            ptr,
            pool,
            owner,
            mapped,
            ..
        } = self.blocks.at(id);
        let pool = self.pool_mut(owner, pool);
        if mapped {
            pool.remove(stream, size, ptr, id);
        } else {
            pool.remove_unmapped(stream, ptr, id);
        }
    }

    /// Frees an allocation (PyTorch's `free`): `allocation` and `allocated_bytes` fall at once
    /// (`free_requested`). Without `record_stream` the block then merges with the free
    /// neighbours of its segment and goes back to its pool (`free_block`, `free_completed`);
    /// with it, one event is recorded on each stream it was used on and the block stays active
    /// until they complete (`pending`). Nothing goes back to the device.
    pub fn free(&mut self, allocation: Allocation) -> Result<(), AllocError> {
        if allocation.is_null() {
            return Ok(());
        }
        let live = matches!(
            self.blocks.get(allocation.id),
            Some(block) if block.allocated && block.ptr == allocation.ptr.addr()
        );
        if !live {
            return Err(AllocError::InvalidFree(format!(
                "no live allocation at {:#x}",
                allocation.ptr
            )));
        }
        // Record the events before changing anything, so a device failure leaves the block
        // allocated. While a private pool is active (a capture underway), PyTorch records
        // none yet: the block waits for the capture to end, its streams kept.
        let deferred = self.capture_underway() && self.stream_uses.contains_key(&allocation.id);
        let events = if deferred {
            None
        } else {
            match self.take_stream_uses(allocation.id) {
                Some(uses) => match self.record_events(&uses) {
                    Ok(events) => Some(events),
                    Err(error) => {
                        self.stream_uses.insert(allocation.id, uses);
                        return Err(error);
                    }
                },
                None => None,
            }
        };
        let block = self.blocks.at_mut(allocation.id);
        block.allocated = false;
        let freed = Freed::of(allocation.id, block);
        let pool = freed.pool;
        self.stats.allocation.decrease(pool, 1);
        self.stats.allocated_bytes.decrease(pool, freed.size as i64);
        self.emit(
            EventKind::FreeRequested,
            freed.ptr,
            freed.requested,
            freed.size,
            freed.stream,
            pool,
            freed.owner,
        );
        if freed.size >= self.config.max_split_size {
            self.stats.oversize_allocations.decrease(1);
        }
        match events {
            _ if deferred => self.defer_until_no_capture(allocation.id),
            Some(events) => self.hold_until(allocation.id, events),
            None => self.free_block(freed),
        }
        Ok(())
    }

    /// The streams recorded for block `id`, taken away (PyTorch's `insert_events` moves them
    /// out of the block). One branch while no block has any.
    #[inline]
    fn take_stream_uses(&mut self, id: BlockId) -> Option<Vec<StreamId>> {
        if self.stream_uses.is_empty() {
            return None;
        }
        self.capture_stream_uses.remove(&id);
        self.stream_uses.remove(&id)
    }

    /// Merges a freed block with its free neighbours and caches it (PyTorch's `free_block`).
    #[inline]
    fn free_block(&mut self, freed: Freed) {
        let Freed {
            id,
            pool,
            owner,
            size: orig_size,
            requested,
            ptr,
            stream,
            prev,
            next,
            expandable,
        } = freed;
        self.emit(
            EventKind::FreeCompleted,
            ptr,
            requested,
            orig_size,
            stream,
            pool,
            owner,
        );
        let mut net_count: i64 = 0;
        let mut net_bytes: i64 = 0;
        let (mut base, mut size) = (ptr, orig_size);
        for neighbour in [prev, next] {
            if let Some((merged, merged_base)) = self.try_merge(id, neighbour, true) {
                net_count -= 1;
                net_bytes -= merged as i64;
                size += merged;
                base = merged_base;
            }
        }
        self.insert_free_at(id, stream, size, base, pool, owner);
        if self.blocks.at(id).is_split() {
            net_count += 1;
            net_bytes += size as i64;
        }
        let stats = &mut self.stats;
        if !expandable {
            stats.inactive_split.apply(pool, net_count);
            stats.inactive_split_bytes.apply(pool, net_bytes);
        }
        stats.active.decrease(pool, 1);
        stats.active_bytes.decrease(pool, orig_size as i64);
        stats.requested_bytes.decrease(pool, requested as i64);
    }

    /// Absorbs the free neighbour `neighbour` into `id` when both are `mapped` (or both
    /// unmapped), as PyTorch's `try_merge_blocks`; returns the bytes absorbed and the merged
    /// block's base, or `None` when the neighbour is absent, in use or of the other kind.
    #[inline(always)]
    fn try_merge(&mut self, id: BlockId, neighbour: BlockId, mapped: bool) -> Option<(u64, u64)> {
        let other = self.blocks.get(neighbour)?;
        if !other.is_free() || other.mapped != mapped {
            return None;
        }
        let (other_ptr, other_size, other_stream, other_pool, other_owner) =
            (other.ptr, other.size, other.stream, other.pool, other.owner);
        let (other_prev, other_next) = (other.prev, other.next);
        let pool = self.pool_mut(other_owner, other_pool);
        if mapped {
            pool.remove(other_stream, other_size, other_ptr, neighbour);
        } else {
            pool.remove_unmapped(other_stream, other_ptr, neighbour);
        }
        self.blocks.remove(neighbour);
        let block = self.blocks.at_mut(id);
        block.size += other_size;
        let base = if block.prev == neighbour {
            block.ptr = other_ptr;
            block.prev = other_prev;
            if other_prev != NIL {
                self.blocks.at_mut(other_prev).next = id;
            }
            other_ptr
        } else {
            let base = block.ptr;
            block.next = other_next;
            if other_next != NIL {
                self.blocks.at_mut(other_next).prev = id;
            }
            base
        };
        Some((other_size, base))
    }

    /// Every live block (mapped or not), for snapshots and invariant checks.
    pub fn blocks(&self) -> impl Iterator<Item = &Block> {
        self.blocks.iter().map(|(_, block)| block)
    }

    /// Every `cudaMalloc` segment as (base address, size, pool), by address. Expandable
    /// segments are not segments in this sense (see [`CachingAllocator::expandable_segments`]).
    pub fn segments(&self) -> impl Iterator<Item = (u64, u64, Pool)> + '_ {
        self.segments
            .iter()
            .map(|(&ptr, segment)| (ptr, segment.size, segment.pool))
    }

    /// Every `cudaMalloc` segment's memory pool, by address, as (base address, pool id): (0, 0)
    /// for the default pools.
    pub fn segment_pool_ids(&self) -> impl Iterator<Item = (u64, MemPoolId)> + '_ {
        self.segments
            .iter()
            .map(|(&ptr, segment)| (ptr, self.pool_id(segment.owner)))
    }

    /// Every live expandable segment, lowest base first.
    pub fn expandable_segments(&self) -> Vec<ExpandableInfo> {
        let mut list: Vec<ExpandableInfo> = self
            .expandable
            .iter()
            .map(|(_, segment)| ExpandableInfo {
                base: segment.base.addr(),
                reserved: segment.size(),
                page: segment.page,
                mapped: segment.mapped_bytes(),
                stream: segment.stream,
                pool: segment.pool,
                pool_id: self.pool_id(segment.owner),
            })
            .collect();
        list.sort_unstable_by_key(|info| info.base);
        list
    }
}

impl Drop for CachingAllocator {
    /// Returns every segment to the device: `cudaMalloc` segments are freed, expandable
    /// segments unmapped and their ranges freed. No tensor can outlive its allocator (each
    /// storage holds the runtime that owns it), so by now every block is free; a session that
    /// ends therefore leaves nothing behind on the device, as `empty_cache()` would.
    fn drop(&mut self) {
        let segments: Vec<DevicePtr> = self.segments.values().map(|s| s.base).collect();
        for base in segments {
            // Nothing can be reported from a destructor; a failing free leaves the segment to
            // the driver, which reclaims it when the process exits.
            let _ = self.device.free(base);
        }
        for segment in self.expandable.drain() {
            let _ = segment.release(self.device.as_mut());
        }
    }
}

/// The size a request of `size` bytes is rounded to under `config` (PyTorch's `round_size`).
pub fn round_size(config: &AllocConf, size: u64) -> u64 {
    if size < MIN_BLOCK_SIZE {
        return MIN_BLOCK_SIZE;
    }
    let divisions = config.divisions_for(size);
    if divisions > 1 && size > MIN_BLOCK_SIZE * divisions {
        return roundup_power2_next_division(size, divisions);
    }
    size.div_ceil(MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE
}

/// The bytes the memory-fraction check of PyTorch's `alloc_block` counts for a request of
/// `size` bytes under `config` (`total_allocated_memory + alloc_size > allowed`): its
/// allocation size. A `cudaMalloc` segment has that size; pages mapped into an expandable
/// segment may be more or fewer.
pub fn fraction_check_bytes(config: &AllocConf, size: u64) -> u64 {
    allocation_size(round_size(config, size), config.large_segment_size)
}

/// Bytes PyTorch's `get_allocation_size` asks the device for when no cached block fits a
/// rounded `size`, with `large_segment_size` as the config sets it.
pub fn allocation_size(size: u64, large_segment_size: u64) -> u64 {
    if size <= SMALL_SIZE {
        SMALL_BUFFER
    } else if size < MIN_LARGE_ALLOC {
        large_segment_size
    } else {
        size.div_ceil(ROUND_LARGE) * ROUND_LARGE
    }
}

/// Rounds `size` up to the next of `divisions` equal steps between two powers of two
/// (PyTorch's `roundup_power2_next_division`).
fn roundup_power2_next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let power2_floor = 1_u64 << (63 - size.leading_zeros());
    let step = power2_floor >> (63 - divisions.leading_zeros());
    if step == 0 {
        return power2_floor << 1;
    }
    let floor = size & !(step - 1);
    if floor == size {
        size
    } else {
        floor + step
    }
}

#[cfg(test)]
mod tests;
