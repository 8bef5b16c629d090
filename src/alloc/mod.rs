//! The caching allocator: a re-implementation of PyTorch's native CUDA caching allocator
//! (`c10/cuda/CUDACachingAllocator.cpp`, `DeviceCachingAllocator`) for one device and one
//! stream. Pure logic: it knows devices only through [`DeviceMemory`] and nothing of scripts.
//!
//! For the same sequence of requests it makes the same device calls and keeps the same
//! counters as PyTorch 2.11, so `memory_stats()`, `memory_summary()` and the OOM message match.

pub mod block;
pub mod config;
pub mod diagnosis;
pub mod format;
mod invariants;
pub mod measure;
pub mod snapshot;
pub mod stats;
pub mod summary;

use thiserror::Error;

use crate::device::{DeviceError, DeviceMemory};
pub use block::{Block, BlockId, Pool, NIL};
use block::{BlockArena, BlockPool};
pub use config::{AllocConf, ConfigError};
pub use snapshot::{BlockSnapshot, BlockState, SegmentSnapshot};
pub use stats::{DeviceStats, ScopeMark, ScopeReport, Stat, StatArray};

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
/// Segment size for large requests below 10 MiB (`kLargeBuffer`, 20 MiB); also the default
/// `max_non_split_rounding_mb` and the smallest allowed `max_split_size_mb`.
pub const LARGE_BUFFER: u64 = 20 * MIB;
/// Requests of this size or more are refused outright (PyTorch: "Tried to allocate more than
/// 1EB memory.").
pub const ONE_EXABYTE: u64 = 1 << 60;

/// A block handed out by [`CachingAllocator::malloc`]. Zero-byte requests get a null
/// allocation (`ptr` 0, `id` [`NIL`]) that owns no block, as PyTorch returns a null pointer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocation {
    /// The block's id, [`NIL`] for a zero-byte allocation.
    pub id: BlockId,
    /// Device address, 0 for a zero-byte allocation.
    pub ptr: u64,
    /// The block's (rounded) size in bytes.
    pub size: u64,
}

impl Allocation {
    /// The allocation of a zero-byte request.
    pub const NULL: Allocation = Allocation {
        id: NIL,
        ptr: 0,
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
    /// The facts at the error and their cause ([`diagnosis`]).
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
    /// The device failed in a way other than running out of memory.
    #[error("device error: {0}")]
    Device(String),
    /// `free` of something that is not a live allocation of this allocator.
    #[error("invalid free: {0}")]
    InvalidFree(String),
    /// `set_per_process_memory_fraction` outside [0, 1].
    #[error("set_per_process_memory_fraction: fraction must be between 0 and 1, got {0}")]
    InvalidFraction(f64),
}

impl From<DeviceError> for AllocError {
    fn from(error: DeviceError) -> Self {
        AllocError::Device(error.to_string())
    }
}

/// What a malloc looks for: the rounded size, its pool and the segment size a miss needs.
#[derive(Debug, Clone, Copy)]
struct Request {
    size: u64,
    pool: Pool,
    alloc_size: u64,
}

/// PyTorch's caching allocator for one device and one stream.
pub struct CachingAllocator {
    device: Box<dyn DeviceMemory>,
    config: AllocConf,
    blocks: BlockArena,
    small: BlockPool,
    large: BlockPool,
    stats: DeviceStats,
    /// Bytes currently held from the device (PyTorch's `total_allocated_memory`).
    total_allocated_memory: u64,
    /// The cap set by `set_per_process_memory_fraction` (PyTorch's `allowed_memory_maximum`).
    allowed_memory_maximum: Option<u64>,
    /// Every segment: base address → (size, pool). Touched only when segments come and go.
    segments: std::collections::BTreeMap<u64, (u64, Pool)>,
}

impl CachingAllocator {
    /// An empty allocator drawing segments from `device`. A `per_process_memory_fraction` in
    /// the config is applied at once, as PyTorch does at start-up.
    pub fn new(device: Box<dyn DeviceMemory>, config: AllocConf) -> Result<Self, AllocError> {
        let mut allocator = CachingAllocator {
            device,
            stats: DeviceStats::new(config.max_split_size_stat()),
            config,
            blocks: BlockArena::default(),
            small: BlockPool::default(),
            large: BlockPool::default(),
            total_allocated_memory: 0,
            allowed_memory_maximum: None,
            segments: Default::default(),
        };
        if let Some(fraction) = allocator.config.per_process_memory_fraction {
            allocator.set_memory_fraction(fraction)?;
        }
        Ok(allocator)
    }

    /// The configuration in force.
    pub fn config(&self) -> &AllocConf {
        &self.config
    }

    /// The device segments come from.
    pub fn device(&self) -> &dyn DeviceMemory {
        self.device.as_ref()
    }

    /// Mutable access to the device, for callers that write tensor contents.
    pub fn device_mut(&mut self) -> &mut dyn DeviceMemory {
        self.device.as_mut()
    }

    /// The counters (`torch.cuda.memory_stats()`).
    pub fn stats(&self) -> &DeviceStats {
        &self.stats
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

    /// `torch.cuda.set_per_process_memory_fraction(fraction)`: caps the bytes held from the
    /// device at `fraction × total memory`; 1.0 removes the cap (PyTorch 2.11 semantics).
    pub fn set_memory_fraction(&mut self, fraction: f64) -> Result<(), AllocError> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(AllocError::InvalidFraction(fraction));
        }
        self.allowed_memory_maximum = if fraction < 1.0 {
            Some((fraction * self.device.total_memory() as f64) as u64)
        } else {
            None
        };
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
        if size < MIN_BLOCK_SIZE {
            return MIN_BLOCK_SIZE;
        }
        let divisions = self.config.divisions_for(size);
        if divisions > 1 && size > MIN_BLOCK_SIZE * divisions {
            return roundup_power2_next_division(size, divisions);
        }
        size.div_ceil(MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE
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
    /// (PyTorch's `get_allocation_size`).
    pub fn allocation_size(size: u64) -> u64 {
        if size <= SMALL_SIZE {
            SMALL_BUFFER
        } else if size < MIN_LARGE_ALLOC {
            LARGE_BUFFER
        } else {
            size.div_ceil(ROUND_LARGE) * ROUND_LARGE
        }
    }

    fn pool_mut(&mut self, pool: Pool) -> &mut BlockPool {
        match pool {
            Pool::Small => &mut self.small,
            Pool::Large => &mut self.large,
        }
    }

    fn garbage_collection_enabled(&self) -> bool {
        self.allowed_memory_maximum.is_some() && self.config.garbage_collection_threshold > 0.0
    }

    /// Hands out a block of at least `orig_size` bytes: a cached one when one fits, else a new
    /// segment, freeing cached segments and retrying before giving up with PyTorch's OOM.
    pub fn malloc(&mut self, orig_size: u64) -> Result<Allocation, AllocError> {
        if orig_size == 0 {
            return Ok(Allocation::NULL);
        }
        if orig_size >= ONE_EXABYTE {
            return Err(AllocError::OutOfMemory(OutOfMemory {
                message: "CUDA out of memory. Tried to allocate more than 1EB memory.".into(),
                alloc_size: orig_size,
                diagnosis: Box::new(self.diagnose(orig_size, orig_size, orig_size)),
            }));
        }
        let size = self.round_size(orig_size);
        let pool = Self::pool_for(size);
        let request = Request {
            size,
            pool,
            alloc_size: Self::allocation_size(size),
        };

        // PyTorch also runs the free-memory callbacks and searches again here; the only one
        // registered (CUDA IPC) frees nothing in a single process.
        let mut found = self.get_free_block(request);
        if found.is_none() {
            if self.garbage_collection_enabled() {
                self.garbage_collect_cached_blocks()?;
            }
            found = self.alloc_block(request, false)?;
            if found.is_none() && self.release_available_cached_blocks(request)? {
                found = self.alloc_block(request, false)?;
            }
            if found.is_none() {
                self.release_cached_blocks()?;
                found = self.alloc_block(request, true)?;
            }
        }
        match found {
            Some(id) => Ok(self.alloc_found_block(id, request, orig_size)),
            None => Err(self.out_of_memory(request, orig_size)),
        }
    }

    /// Best fit from the pool (PyTorch's `get_free_block`), with the `max_split_size` rules
    /// that keep oversize blocks for oversize requests.
    fn get_free_block(&mut self, request: Request) -> Option<BlockId> {
        let gc = self.garbage_collection_enabled();
        let max_split_size = self.config.max_split_size;
        let max_non_split_rounding = self.config.max_non_split_rounding_size;
        let pool = self.pool_mut(request.pool);
        if gc {
            pool.get_free_blocks_call_count += 1;
        }
        if max_split_size == u64::MAX {
            // No split limit, so no rejection rule applies: take the best fit in one traversal.
            return pool.take_best_fit(request.size);
        }
        let (block_size, ptr, id) = pool.best_fit(request.size)?;
        // Do not return an oversized block for a small request.
        if request.size < max_split_size && block_size >= max_split_size {
            return None;
        }
        // Do not return an oversized block for a large request much smaller than it.
        if request.size >= max_split_size
            && block_size >= request.size.saturating_add(max_non_split_rounding)
        {
            return None;
        }
        pool.remove(block_size, ptr, id);
        Some(id)
    }

    /// Asks the device for a new segment (PyTorch's `alloc_block`). `Ok(None)` means refused
    /// for lack of memory (by the device or the fraction cap).
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
        let ptr = match self.device.malloc(size) {
            Ok(ptr) => ptr,
            Err(DeviceError::OutOfMemory) => return Ok(None),
            Err(other) => return Err(other.into()),
        };
        self.total_allocated_memory += size;
        let pool = request.pool;
        self.stats.segment.increase(pool, 1);
        self.stats.reserved_bytes.increase(pool, size as i64);
        if size >= self.config.max_split_size {
            self.stats.oversize_segments.increase(1);
        }
        self.stats.num_device_alloc += 1;
        self.segments.insert(ptr, (size, pool));
        Ok(Some(self.blocks.insert(Block {
            ptr,
            size,
            requested_size: 0,
            pool,
            allocated: false,
            prev: NIL,
            next: NIL,
            gc_count_base: 0,
        })))
    }

    /// Whether a found block is carved up (PyTorch's `should_split`).
    fn should_split(&self, block: &Block, size: u64) -> bool {
        let remaining = block.size - size;
        match block.pool {
            Pool::Small => remaining >= MIN_BLOCK_SIZE,
            Pool::Large => size < self.config.max_split_size && remaining > SMALL_SIZE,
        }
    }

    /// Splits off and hands out the front of a found block (PyTorch's `alloc_found_block`).
    fn alloc_found_block(&mut self, id: BlockId, request: Request, orig_size: u64) -> Allocation {
        let size = request.size;
        let pool = request.pool;
        let block = self.blocks.at(id);
        let already_split = block.is_split();
        let split = self.should_split(block, size);
        let handed_out = if split {
            // The allocated piece takes the low end; the remainder keeps the old block's id
            // and goes back to the pool.
            let (front, before) = (block.ptr, block.prev);
            let piece = self.blocks.insert(Block {
                ptr: front,
                size,
                requested_size: 0,
                pool,
                allocated: false,
                prev: before,
                next: id,
                gc_count_base: 0,
            });
            if before != NIL {
                self.blocks.at_mut(before).next = piece;
            }
            let rest = self.blocks.at_mut(id);
            rest.prev = piece;
            rest.ptr += size;
            rest.size -= size;
            let rest_size = rest.size;
            self.insert_free(id);
            if already_split {
                self.stats.inactive_split_bytes.decrease(pool, size as i64);
            } else {
                self.stats
                    .inactive_split_bytes
                    .increase(pool, rest_size as i64);
                self.stats.inactive_split.increase(pool, 1);
            }
            piece
        } else {
            if already_split {
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
        let (ptr, block_size) = (block.ptr, block.size);
        let stats = &mut self.stats;
        stats.allocation.increase(pool, 1);
        stats.allocated_bytes.increase(pool, block_size as i64);
        stats.active.increase(pool, 1);
        stats.active_bytes.increase(pool, block_size as i64);
        stats.requested_bytes.increase(pool, orig_size as i64);
        if block_size >= max_split_size {
            stats.oversize_allocations.increase(1);
        }
        Allocation {
            id: handed_out,
            ptr,
            size: block_size,
        }
    }

    /// Caches a free block in its pool, stamping its age for the garbage collector.
    #[inline]
    fn insert_free(&mut self, id: BlockId) {
        let block = self.blocks.at(id);
        let (size, ptr, pool) = (block.size, block.ptr, block.pool);
        let pool = self.pool_mut(pool);
        let clock = pool.get_free_blocks_call_count;
        pool.insert(size, ptr, id);
        self.blocks.at_mut(id).gc_count_base = clock;
    }

    /// Returns a block to the cache, merging it with free neighbours (PyTorch's `free` followed
    /// at once by `free_block`, as on one stream without `record_stream`). Nothing goes back to
    /// the device.
    pub fn free(&mut self, allocation: Allocation) -> Result<(), AllocError> {
        if allocation.is_null() {
            return Ok(());
        }
        match self.blocks.get(allocation.id) {
            Some(block) if block.allocated && block.ptr == allocation.ptr => {}
            _ => {
                return Err(AllocError::InvalidFree(format!(
                    "no live allocation at {:#x}",
                    allocation.ptr
                )))
            }
        }
        let id = allocation.id;
        let max_split_size = self.config.max_split_size;
        let block = self.blocks.at_mut(id);
        block.allocated = false;
        let (pool, orig_size, requested) = (block.pool, block.size, block.requested_size);
        self.stats.allocation.decrease(pool, 1);
        self.stats.allocated_bytes.decrease(pool, orig_size as i64);
        if orig_size >= max_split_size {
            self.stats.oversize_allocations.decrease(1);
        }

        let mut net_count: i64 = 0;
        let mut net_bytes: i64 = 0;
        let (prev, next) = (block.prev, block.next);
        for neighbour in [prev, next] {
            if let Some(merged) = self.try_merge(id, neighbour) {
                net_count -= 1;
                net_bytes -= merged as i64;
            }
        }
        self.insert_free(id);
        let block = self.blocks.at(id);
        if block.is_split() {
            net_count += 1;
            net_bytes += block.size as i64;
        }
        let stats = &mut self.stats;
        stats.inactive_split.apply(pool, net_count);
        stats.inactive_split_bytes.apply(pool, net_bytes);
        stats.active.decrease(pool, 1);
        stats.active_bytes.decrease(pool, orig_size as i64);
        stats.requested_bytes.decrease(pool, requested as i64);
        Ok(())
    }

    /// Absorbs a free neighbour into `id` (PyTorch's `try_merge_blocks`); returns the bytes
    /// absorbed, or `None` when the neighbour is absent or in use.
    fn try_merge(&mut self, id: BlockId, neighbour: BlockId) -> Option<u64> {
        if neighbour == NIL {
            return None;
        }
        let other = self.blocks.at(neighbour);
        if other.allocated {
            return None;
        }
        let (other_ptr, other_size, other_pool) = (other.ptr, other.size, other.pool);
        let (other_prev, other_next) = (other.prev, other.next);
        self.pool_mut(other_pool)
            .remove(other_size, other_ptr, neighbour);
        self.blocks.remove(neighbour);
        let block = self.blocks.at_mut(id);
        if block.prev == neighbour {
            block.ptr = other_ptr;
            block.prev = other_prev;
            if other_prev != NIL {
                self.blocks.at_mut(other_prev).next = id;
            }
        } else {
            block.next = other_next;
            if other_next != NIL {
                self.blocks.at_mut(other_next).prev = id;
            }
        }
        self.blocks.at_mut(id).size += other_size;
        Some(other_size)
    }

    /// `torch.cuda.empty_cache()`: returns every completely free segment to the device.
    /// Pieces of segments that still hold an allocation stay cached.
    pub fn empty_cache(&mut self) -> Result<(), AllocError> {
        self.release_cached_blocks()
    }

    /// PyTorch's `release_cached_blocks`: synchronise, then free whole cached segments of the
    /// large pool and then of the small pool.
    fn release_cached_blocks(&mut self) -> Result<(), AllocError> {
        self.stats.num_sync_all_streams += 1;
        for pool in [Pool::Large, Pool::Small] {
            let cached: Vec<BlockId> = self.pool_mut(pool).iter().map(|(_, id)| id).collect();
            let whole: Vec<BlockId> = cached
                .into_iter()
                .filter(|&id| !self.blocks.at(id).is_split())
                .collect();
            for id in whole {
                self.release_block(id)?;
            }
        }
        Ok(())
    }

    /// Returns one cached, unsplit segment to the device (PyTorch's `release_block`).
    fn release_block(&mut self, id: BlockId) -> Result<(), AllocError> {
        let block = self.blocks.at(id);
        let (ptr, size, pool) = (block.ptr, block.size, block.pool);
        self.device.free(ptr)?;
        self.pool_mut(pool).remove(size, ptr, id);
        self.blocks.remove(id);
        self.segments.remove(&ptr);
        self.total_allocated_memory -= size;
        self.stats.num_device_free += 1;
        self.stats.segment.decrease(pool, 1);
        self.stats.reserved_bytes.decrease(pool, size as i64);
        if size >= self.config.max_split_size {
            self.stats.oversize_segments.decrease(1);
        }
        Ok(())
    }

    /// With `max_split_size_mb` set: before flushing everything, free just enough oversize
    /// cached segments — the smallest one that covers the request, else the largest ones in
    /// turn (PyTorch's `release_available_cached_blocks`).
    fn release_available_cached_blocks(&mut self, request: Request) -> Result<bool, AllocError> {
        if !self.config.has_split_limit() {
            return Ok(false);
        }
        let max_split_size = self.config.max_split_size;
        let target = request.size.max(max_split_size);
        let pool = self.pool_mut(request.pool);
        if let Some((_, _, id)) = pool.best_fit(target) {
            self.release_block(id)?;
            return Ok(true);
        }
        // No single block is large enough: free oversize blocks from the largest down.
        let candidates: Vec<(u64, BlockId)> = pool.iter().rev().collect();
        let mut released = 0;
        for (size, id) in candidates {
            if released >= target || size < max_split_size {
                break;
            }
            self.release_block(id)?;
            released += size;
        }
        Ok(released >= target)
    }

    /// With a memory fraction and `garbage_collection_threshold` set: when the bytes held pass
    /// the threshold, free the oldest unsplit cached large segments until back under it
    /// (PyTorch's `garbage_collect_cached_blocks`).
    fn garbage_collect_cached_blocks(&mut self) -> Result<(), AllocError> {
        let Some(allowed) = self.allowed_memory_maximum else {
            return Ok(());
        };
        let threshold = (self.config.garbage_collection_threshold * allowed as f64) as u64;
        if self.total_allocated_memory <= threshold {
            return Ok(());
        }
        let target = self.total_allocated_memory - threshold;
        let clock = self.large.get_free_blocks_call_count;
        let age = |block: &Block| clock.saturating_sub(block.gc_count_base) as f64;
        let mut total_age = 0.0;
        let mut freeable = 0_u64;
        for (_, id) in self.large.iter() {
            let block = self.blocks.at(id);
            if !block.is_split() {
                total_age += age(block);
                freeable += 1;
            }
        }
        if freeable == 0 {
            return Ok(());
        }
        let mut reclaimed = 0;
        let mut freed_any = true;
        while reclaimed < target && freed_any && freeable > 0 {
            let age_threshold = total_age / freeable as f64;
            freed_any = false;
            let order: Vec<BlockId> = self.large.iter().map(|(_, id)| id).collect();
            for id in order {
                let block = self.blocks.at(id);
                if block.is_split() {
                    continue;
                }
                let block_age = age(block);
                if block_age >= age_threshold {
                    freed_any = true;
                    reclaimed += block.size;
                    total_age -= block_age;
                    freeable -= 1;
                    self.release_block(id)?;
                }
            }
        }
        Ok(())
    }

    /// Builds PyTorch's OOM error after every attempt failed.
    fn out_of_memory(&mut self, request: Request, orig_size: u64) -> AllocError {
        let (device_free, device_total) = self.device.mem_get_info().unwrap_or((0, 0));
        self.stats.num_ooms += 1;
        let allocated = self.stats.allocated_bytes.all.current.max(0) as u64;
        let reserved = self.stats.reserved_bytes.all.current.max(0) as u64;
        let fs = format::format_size;
        let allowed_info = match self.allowed_memory_maximum {
            Some(allowed) => format!("{} allowed; ", fs(allowed)),
            None => String::new(),
        };
        let mut proc_info = String::new();
        for process in self.device.process_memory() {
            if process.is_current {
                proc_info.push_str("Including non-PyTorch memory, this process");
            } else {
                proc_info.push_str(&format!("Process {}", process.pid));
            }
            proc_info.push_str(&format!(" has {} memory in use. ", fs(process.used_bytes)));
        }
        let message = format!(
            "CUDA out of memory. Tried to allocate {}. GPU {} has a total capacity of {} of which {} is free. {}{}Of the allocated memory {} is allocated by PyTorch, and {} is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)",
            fs(request.alloc_size),
            self.device.index(),
            fs(device_total),
            fs(device_free),
            proc_info,
            allowed_info,
            fs(allocated),
            fs(reserved.saturating_sub(allocated)),
        );
        AllocError::OutOfMemory(OutOfMemory {
            message,
            alloc_size: request.alloc_size,
            diagnosis: Box::new(self.diagnose(orig_size, request.size, request.alloc_size)),
        })
    }

    /// Every live block, for snapshots and invariant checks.
    pub fn blocks(&self) -> impl Iterator<Item = &Block> {
        self.blocks.iter().map(|(_, block)| block)
    }

    /// Every segment as (base address, size, pool), by address.
    pub fn segments(&self) -> impl Iterator<Item = (u64, u64, Pool)> + '_ {
        self.segments
            .iter()
            .map(|(&ptr, &(size, pool))| (ptr, size, pool))
    }

    /// Number of free blocks cached in each pool: (small, large).
    pub fn cached_block_counts(&self) -> (usize, usize) {
        (self.small.len(), self.large.len())
    }
}

impl Drop for CachingAllocator {
    /// Returns every segment to the device. No tensor can outlive its allocator (each storage
    /// holds the runtime that owns it), so by now every block is free; a session that ends
    /// therefore leaves nothing behind on the device, as `empty_cache()` would.
    fn drop(&mut self) {
        let segments: Vec<u64> = self.segments.keys().copied().collect();
        for ptr in segments {
            // Nothing can be reported from a destructor; a failing free leaves the segment to
            // the driver, which reclaims it when the process exits.
            let _ = self.device.free(ptr);
        }
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
