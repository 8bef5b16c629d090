//! Frees deferred by `record_stream` (PyTorch's `recordStream`, `insert_events`,
//! `process_events`, `synchronize_and_free_events`).
//!
//! A block remembers the streams other than its own that used it ([`CachingAllocator::record_stream`]).
//! Freeing such a block lowers `allocation` and `allocated_bytes` at once (`free_requested`),
//! records one device event on each of those streams, and keeps the block *active* — out of
//! its pool, never merged or reused — until every event has completed. Then the free completes
//! (`free_completed`): the block merges with its free neighbours and goes back to its pool, and
//! `active`, `active_bytes`, `requested_bytes` and the inactive-split counters change, as in
//! PyTorch's `free_block`.
//!
//! Completion happens only where PyTorch looks: at the start of every malloc, for the events
//! that have completed (`process_events`, in stream order, each stream's events oldest
//! first), and on the OOM path and in `empty_cache()`, which wait for every outstanding event
//! (`synchronize_and_free_events`, counted by `num_sync_all_streams`). Synchronising a stream
//! or the device completes no free by itself: the next malloc notices.
//!
//! While a private pool is active (PyTorch: a capture is underway) a malloc does not look,
//! and a block freed with recorded streams records no event yet: it waits, still active, until
//! the allocator next looks with no pool active; then its events are recorded, leaving out the
//! streams recorded during the capture (PyTorch's `insert_events_deferred_until_no_capture`
//! and `remove_cudagraph_stream_uses`: the capture's own work has completed by then).

use std::collections::VecDeque;

use super::block::{BlockId, PoolOwner, StreamId};
use super::{AllocError, Allocation, CachingAllocator, Freed};
use crate::device::StreamEvent;

/// The frees still waiting for their streams, as [`CachingAllocator::pending_frees`] reports
/// them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PendingFrees {
    /// Blocks freed by the user and not yet back in their pool.
    pub blocks: u64,
    /// Their bytes (still counted in `active_bytes`).
    pub bytes: u64,
    /// Events still outstanding.
    pub events: u64,
}

impl CachingAllocator {
    /// `tensor.record_stream(stream)` (PyTorch's `recordStream`): the allocation is used on
    /// `stream` too, so when it is freed its block is reused only after the work queued on
    /// `stream` until then has completed. Using the allocation's own stream records nothing,
    /// as in PyTorch; a zero-byte allocation has no block and records nothing either.
    pub fn record_stream(
        &mut self,
        allocation: Allocation,
        stream: StreamId,
    ) -> Result<(), AllocError> {
        if allocation.is_null() {
            return Ok(());
        }
        let own = match self.blocks.get(allocation.id) {
            Some(block) if block.allocated && block.ptr == allocation.ptr.addr() => block.stream,
            _ => {
                return Err(AllocError::UnknownAllocation(format!(
                    "record_stream: no live allocation at {:#x}",
                    allocation.ptr
                )))
            }
        };
        if stream == own {
            return Ok(());
        }
        let uses = self.stream_uses.entry(allocation.id).or_default();
        if !uses.contains(&stream) {
            uses.push(stream);
        }
        if self.capture_underway() {
            // PyTorch's `block_to_cudagraph_stream_uses`.
            let during = self.capture_stream_uses.entry(allocation.id).or_default();
            if !during.contains(&stream) {
                during.push(stream);
            }
        }
        Ok(())
    }

    /// The streams `allocation` was recorded on ([`CachingAllocator::record_stream`]), in the
    /// order first recorded; empty for an allocation used only on its own stream.
    pub fn stream_uses(&self, allocation: Allocation) -> &[StreamId] {
        self.stream_uses
            .get(&allocation.id)
            .map_or(&[], |uses| uses.as_slice())
    }

    /// Waits for the work queued on `stream` (`torch.cuda.Stream.synchronize()`). Completes no
    /// pending free by itself: the next malloc (or `empty_cache()`) finds their events done.
    pub fn synchronize_stream(&mut self, stream: StreamId) -> Result<(), AllocError> {
        Ok(self.device.synchronize_stream(stream)?)
    }

    /// Waits for the work queued on every stream (`torch.cuda.synchronize()`); like
    /// [`CachingAllocator::synchronize_stream`] it completes no pending free by itself.
    pub fn synchronize_device(&mut self) -> Result<(), AllocError> {
        Ok(self.device.synchronize_device()?)
    }

    /// Makes `stream`'s later work wait for the work queued on `other` so far
    /// (`torch.cuda.Stream.wait_stream`); the allocator keeps no state for it, but an event
    /// recorded on `stream` afterwards completes only after `other`'s work.
    pub fn wait_stream(&mut self, stream: StreamId, other: StreamId) -> Result<(), AllocError> {
        Ok(self.device.wait_stream(stream, other)?)
    }

    /// The frees still waiting for their streams.
    pub fn pending_frees(&self) -> PendingFrees {
        let mut pending = PendingFrees::default();
        for (_, block) in self.blocks.iter() {
            if block.pending_free {
                pending.blocks += 1;
                pending.bytes += block.size;
            }
        }
        pending.events = self
            .cuda_events
            .values()
            .map(|queue| queue.len() as u64)
            .sum();
        pending
    }

    /// Records one event on each of `streams` (PyTorch's `insert_events`, whose set of streams
    /// has no order of its own; gpumem takes them in the order first recorded).
    pub(super) fn record_events(
        &mut self,
        streams: &[StreamId],
    ) -> Result<Vec<StreamEvent>, AllocError> {
        let mut events = Vec::with_capacity(streams.len());
        for &stream in streams {
            events.push(self.device.record_event(stream)?);
        }
        Ok(events)
    }

    /// Holds the freed block `id` back until a capture is no longer underway (PyTorch's
    /// `deferred_blocks`): active, out of its pool, its streams kept.
    pub(super) fn defer_until_no_capture(&mut self, id: BlockId) {
        self.blocks.at_mut(id).pending_free = true;
        self.deferred_blocks.push(id);
    }

    /// PyTorch's `insert_events_deferred_until_no_capture`: the blocks freed during a capture
    /// record their events now, on the streams recorded before the capture only; a block left
    /// with none completes its free at once.
    fn insert_deferred_events(&mut self) -> Result<(), AllocError> {
        if self.deferred_blocks.is_empty() {
            return Ok(());
        }
        for id in std::mem::take(&mut self.deferred_blocks) {
            let mut uses = self.stream_uses.remove(&id).unwrap_or_default();
            if let Some(during) = self.capture_stream_uses.remove(&id) {
                uses.retain(|stream| !during.contains(stream));
            }
            let events = self.record_events(&uses)?;
            if events.is_empty() {
                self.blocks.at_mut(id).pending_free = false;
                let freed = self.freed(id);
                self.free_block(freed);
            } else {
                self.hold_until(id, events);
            }
        }
        Ok(())
    }

    /// Holds the freed block `id` back until `events` have completed: it stays active, out
    /// of its pool, and the events join their streams' queues.
    pub(super) fn hold_until(&mut self, id: BlockId, events: Vec<StreamEvent>) {
        let block = self.blocks.at_mut(id);
        block.pending_free = true;
        block.event_count = events.len() as u32;
        for event in events {
            self.cuda_events
                .entry(event.stream)
                .or_default()
                .push_back((event, id));
        }
    }

    /// PyTorch's `process_events`, run at the start of every malloc: on each stream, the
    /// oldest events that have completed let their blocks go (a block whose last event this
    /// was completes its free); the first event not ready stops that stream's walk.
    #[inline]
    pub(super) fn process_events(&mut self) -> Result<(), AllocError> {
        if self.cuda_events.is_empty() && self.deferred_blocks.is_empty() {
            return Ok(());
        }
        self.process_events_slow()
    }

    #[cold]
    fn process_events_slow(&mut self) -> Result<(), AllocError> {
        self.insert_deferred_events()?;
        for stream in self.walk_order() {
            while let Some(&(event, id)) = self.cuda_events.get(&stream).and_then(VecDeque::front) {
                if !self.device.query_event(event)? {
                    break;
                }
                self.pop_event(stream);
                self.event_done(id);
            }
        }
        Ok(())
    }

    /// PyTorch's `synchronize_and_free_events` (the first step of `release_cached_blocks`,
    /// so of `empty_cache()` and of a malloc's last resort): counts `num_sync_all_streams`,
    /// records the events of blocks freed during a capture, waits for every outstanding event,
    /// stream by stream, and completes every pending free. Given a private pool, only the
    /// events of that pool's blocks are waited for.
    pub(super) fn synchronize_and_free_events(
        &mut self,
        only: Option<PoolOwner>,
    ) -> Result<(), AllocError> {
        self.stats.num_sync_all_streams += 1;
        self.insert_deferred_events()?;
        self.wait_for_events(|allocator, id| {
            only.is_none_or(|owner| allocator.blocks.at(id).owner == owner)
        })
    }

    /// Makes the allocator's walks over its pending frees (`process_events` and the
    /// synchronisations) take `streams` first, in this order, then the others in stream order.
    /// PyTorch walks the streams of its `cuda_events` hash map in an order of its own, which
    /// decides the order several pending frees complete in (and so the `inactive_split`
    /// peaks); a replay that knows it from the trace says so before the malloc that completes
    /// them, and clears it after (an empty list).
    pub fn walk_streams_first(&mut self, streams: &[StreamId]) {
        self.streams_first.clear();
        self.streams_first.extend_from_slice(streams);
    }

    /// Waits for every outstanding event of the blocks `wanted` picks, stream by stream, and
    /// lets each go: a block whose last event this was completes its free.
    fn wait_for_events(
        &mut self,
        wanted: impl Fn(&CachingAllocator, BlockId) -> bool,
    ) -> Result<(), AllocError> {
        for stream in self.walk_order() {
            let mut index = 0;
            while let Some(&(event, id)) = self
                .cuda_events
                .get(&stream)
                .and_then(|queue| queue.get(index))
            {
                if !wanted(self, id) {
                    index += 1;
                    continue;
                }
                self.device.synchronize_event(event)?;
                self.remove_event(stream, index);
                self.event_done(id);
            }
        }
        Ok(())
    }

    /// The streams with pending events, in the order walks take them: those of
    /// [`CachingAllocator::walk_streams_first`] first, then the others in stream order.
    fn walk_order(&self) -> Vec<StreamId> {
        let mut streams: Vec<StreamId> = self
            .streams_first
            .iter()
            .copied()
            .filter(|stream| self.cuda_events.contains_key(stream))
            .collect();
        streams.extend(
            self.cuda_events
                .keys()
                .copied()
                .filter(|stream| !self.streams_first.contains(stream)),
        );
        streams
    }

    /// Completes the pending free of `allocation` now: its block waits for none of its events
    /// any more (each is waited for) and goes back to its pool, and no other pending free is
    /// touched. For a replay whose trace records that completion at this point: PyTorch's
    /// `process_events` completes only what is done, and a malloc in a capture or a private
    /// pool runs none, so completing every finished free with it would be another reading.
    /// Nothing happens for an allocation whose free is not pending.
    pub fn complete_free_now(&mut self, allocation: Allocation) -> Result<(), AllocError> {
        if allocation.is_null() {
            return Ok(());
        }
        self.wait_for_events(|_, id| id == allocation.id)
    }

    /// Drops the oldest event of `stream`'s queue, and the queue once empty.
    fn pop_event(&mut self, stream: StreamId) {
        self.remove_event(stream, 0);
    }

    /// Drops the event at `index` of `stream`'s queue, and the queue once empty.
    fn remove_event(&mut self, stream: StreamId, index: usize) {
        if let Some(queue) = self.cuda_events.get_mut(&stream) {
            queue.remove(index);
            if queue.is_empty() {
                self.cuda_events.remove(&stream);
            }
        }
    }

    /// One of the block's events completed; the last one completes its free.
    fn event_done(&mut self, id: BlockId) {
        let block = self.blocks.at_mut(id);
        block.event_count = block.event_count.saturating_sub(1);
        if block.event_count == 0 {
            block.pending_free = false;
            let freed = self.freed(id);
            self.free_block(freed);
        }
    }

    /// What `free_block` needs of the block `id`, read now.
    pub(super) fn freed(&self, id: BlockId) -> Freed {
        Freed::of(id, self.blocks.at(id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::{AllocConf, BlockState, MIB};
    use crate::device::sim::SimDevice;

    /// The side stream the tests use (any id other than the default stream's 0).
    const SIDE: StreamId = 5;

    fn allocator(conf: &str) -> CachingAllocator {
        let conf = AllocConf::parse(conf).expect("valid config");
        let mut allocator =
            CachingAllocator::new(Box::new(SimDevice::h200()), conf).expect("allocator");
        allocator.record_history(true, 1000);
        allocator
    }

    fn get(allocator: &CachingAllocator, key: &str) -> i64 {
        allocator.stats().get(key).expect(key)
    }

    /// The recorded history as (action, address) since `from`.
    fn history(allocator: &CachingAllocator, from: usize) -> Vec<(&'static str, u64)> {
        allocator.trace().entries()[from..]
            .iter()
            .map(|entry| (entry.action.name(), entry.addr))
            .collect()
    }

    fn state_of(allocator: &CachingAllocator, ptr: u64) -> Option<BlockState> {
        allocator
            .segment_snapshots()
            .iter()
            .flat_map(|segment| segment.blocks.iter())
            .find(|block| block.address == ptr)
            .map(|block| block.state)
    }

    /// A block used on a busy side stream: its free lowers `allocated` at once, keeps it
    /// active (pending, unusable) until the next malloc after the stream's work completed.
    #[test]
    fn a_free_waits_for_the_streams_the_block_was_used_on() {
        let mut a = allocator("");
        let x = a.malloc(MIB + 512).expect("alloc");
        a.record_stream(x, SIDE).expect("record");
        assert_eq!(a.stream_uses(x), [SIDE]);
        a.device_mut()
            .sleep(SIDE, 10)
            .expect("work on the side stream");
        let mark = a.trace().len();
        a.free(x).expect("free");
        assert_eq!(history(&a, mark), [("free_requested", x.ptr.addr())]);
        assert_eq!(get(&a, "allocated_bytes.all.current"), 0);
        assert_eq!(get(&a, "allocation.all.current"), 0);
        assert_eq!(get(&a, "active_bytes.all.current"), x.size as i64);
        assert_eq!(get(&a, "active.all.current"), 1);
        assert_eq!(get(&a, "requested_bytes.all.current"), (MIB + 512) as i64);
        assert_eq!(
            get(&a, "inactive_split.all.current"),
            1,
            "the 20 MiB segment's rest"
        );
        assert_eq!(
            state_of(&a, x.ptr.addr()),
            Some(BlockState::ActivePendingFree)
        );
        assert_eq!(
            a.pending_frees(),
            PendingFrees {
                blocks: 1,
                bytes: x.size,
                events: 1
            }
        );
        a.check_invariants().expect("consistent");
        // Not reusable while the side stream works: the same request takes the free rest.
        let y = a.malloc(MIB + 512).expect("alloc");
        assert_ne!(y.ptr.addr(), x.ptr.addr());
        assert_eq!(a.pending_frees().blocks, 1);
        // Synchronising completes the stream's work, not the free: the next malloc does.
        a.synchronize_stream(SIDE).expect("sync");
        assert_eq!(a.pending_frees().blocks, 1);
        let mark = a.trace().len();
        let z = a.malloc(MIB + 512).expect("alloc");
        assert_eq!(
            history(&a, mark),
            [("free_completed", x.ptr.addr()), ("alloc", x.ptr.addr())],
            "process_events at the start of malloc, then the freed block is the best fit"
        );
        assert_eq!(z.ptr.addr(), x.ptr.addr());
        assert_eq!(a.pending_frees(), PendingFrees::default());
        assert_eq!(
            get(&a, "active_bytes.all.current"),
            (y.size + z.size) as i64
        );
        a.check_invariants().expect("consistent");
    }

    /// PyTorch records the events at the free even when the stream is idle; the free
    /// completes at the next malloc, never inside `free`.
    #[test]
    fn an_idle_stream_completes_the_free_at_the_next_malloc() {
        let mut a = allocator("");
        let x = a.malloc(4096).expect("alloc");
        a.record_stream(x, SIDE).expect("record");
        a.free(x).expect("free");
        assert_eq!(get(&a, "active.all.current"), 1);
        assert_eq!(get(&a, "requested_bytes.all.current"), 4096);
        let mark = a.trace().len();
        let _ = a.malloc(8192).expect("alloc");
        assert_eq!(history(&a, mark)[0], ("free_completed", x.ptr.addr()));
        assert_eq!(get(&a, "active.all.current"), 1);
        a.check_invariants().expect("consistent");
    }

    /// Recording the allocation's own stream records nothing; a stream recorded twice holds
    /// one event; a freed or foreign allocation is refused and changes nothing.
    #[test]
    fn record_stream_ignores_the_own_stream_and_refuses_dead_allocations() {
        let mut a = allocator("");
        let x = a.malloc_on(SIDE, 4096).expect("alloc");
        a.record_stream(x, SIDE).expect("own stream");
        assert!(a.stream_uses(x).is_empty());
        a.record_stream(x, 0).expect("default stream");
        a.record_stream(x, 0).expect("again");
        assert_eq!(a.stream_uses(x), [0]);
        a.record_stream(Allocation::NULL, 3)
            .expect("a null allocation has no block");
        a.free(x).expect("free");
        assert_eq!(a.pending_frees().events, 1);
        let error = a.record_stream(x, 3).expect_err("freed");
        assert!(matches!(error, AllocError::UnknownAllocation(_)), "{error}");
        assert!(error.to_string().contains("no live allocation at"));
        a.check_invariants().expect("consistent");
    }

    /// A block used on two streams completes only once both streams' events have.
    #[test]
    fn every_recorded_stream_must_complete() {
        let mut a = allocator("");
        let x = a.malloc(4096).expect("alloc");
        a.record_stream(x, 5).expect("record");
        a.record_stream(x, 6).expect("record");
        a.device_mut().sleep(5, 1).expect("sleep");
        a.device_mut().sleep(6, 1).expect("sleep");
        a.free(x).expect("free");
        assert_eq!(a.pending_frees().events, 2);
        a.synchronize_stream(5).expect("sync");
        let _ = a.malloc(512).expect("alloc");
        assert_eq!(a.pending_frees().events, 1, "stream 6 still works");
        assert_eq!(
            state_of(&a, x.ptr.addr()),
            Some(BlockState::ActivePendingFree)
        );
        a.synchronize_device().expect("sync");
        let _ = a.malloc(512).expect("alloc");
        assert_eq!(a.pending_frees(), PendingFrees::default());
        a.check_invariants().expect("consistent");
    }

    /// A stream that waits for another completes only after it: an event recorded on it
    /// waits for both.
    #[test]
    fn wait_stream_chains_the_completion() {
        let mut a = allocator("");
        let x = a.malloc(4096).expect("alloc");
        a.record_stream(x, 5).expect("record");
        a.device_mut().sleep(6, 1).expect("sleep");
        a.wait_stream(5, 6).expect("wait");
        a.free(x).expect("free");
        let _ = a.malloc(512).expect("alloc");
        assert_eq!(a.pending_frees().blocks, 1);
        a.synchronize_stream(6).expect("sync 6");
        let _ = a.malloc(512).expect("alloc");
        assert_eq!(
            a.pending_frees().blocks,
            1,
            "stream 5's wait completes when stream 5 is synchronised"
        );
        a.synchronize_stream(5).expect("sync 5");
        let _ = a.malloc(512).expect("alloc");
        assert_eq!(a.pending_frees().blocks, 0);
    }

    /// A pending block does not merge with a neighbour freed meanwhile; both merge into the
    /// whole segment once it completes, and the counters follow PyTorch's `free_block`.
    #[test]
    fn a_pending_block_merges_only_when_it_completes() {
        let mut a = allocator("");
        let x = a.malloc(4 * MIB).expect("alloc");
        let y = a.malloc(4 * MIB).expect("alloc");
        a.record_stream(x, SIDE).expect("record");
        a.device_mut().sleep(SIDE, 1).expect("sleep");
        a.free(x).expect("free");
        a.free(y).expect("free");
        // y merged with the free rest only: x's piece stays apart.
        assert_eq!(get(&a, "inactive_split.all.current"), 1);
        assert_eq!(get(&a, "inactive_split_bytes.all.current"), 16 * MIB as i64);
        a.check_invariants().expect("consistent");
        a.synchronize_device().expect("sync");
        let _ = a.malloc(512).expect("alloc");
        assert_eq!(
            get(&a, "inactive_split.large_pool.current"),
            0,
            "one whole free segment"
        );
        assert_eq!(get(&a, "active_bytes.large_pool.current"), 0);
        a.check_invariants().expect("consistent");
    }

    /// `empty_cache()` waits for every outstanding event (`synchronize_and_free_events`)
    /// before releasing: the completed block's whole segment goes back.
    #[test]
    fn empty_cache_completes_pending_frees_then_releases() {
        let mut a = allocator("");
        let x = a.malloc(30 * MIB).expect("alloc");
        a.record_stream(x, SIDE).expect("record");
        a.device_mut().sleep(SIDE, 1).expect("sleep");
        a.free(x).expect("free");
        let mark = a.trace().len();
        a.empty_cache().expect("empty");
        assert_eq!(
            history(&a, mark),
            [
                ("free_completed", x.ptr.addr()),
                ("segment_free", x.ptr.addr())
            ]
        );
        assert_eq!(get(&a, "num_sync_all_streams"), 1);
        assert_eq!(get(&a, "reserved_bytes.all.current"), 0);
        a.check_invariants().expect("consistent");
    }

    /// The OOM path: the first try is refused by the fraction; `release_cached_blocks` waits
    /// for the pending free, releases the segment it completed, and the retry succeeds.
    #[test]
    fn the_oom_path_completes_pending_frees_before_releasing() {
        let mut a = allocator("");
        let total = a.device().total_memory() as f64;
        a.set_memory_fraction(60.0 * MIB as f64 / total)
            .expect("fraction");
        let x = a.malloc(40 * MIB).expect("alloc");
        a.record_stream(x, SIDE).expect("record");
        a.device_mut().sleep(SIDE, 1).expect("sleep");
        a.free(x).expect("free");
        let mark = a.trace().len();
        let y = a
            .malloc(40 * MIB)
            .expect("fits once the pending block is released");
        assert_eq!(
            history(&a, mark),
            [
                ("free_completed", x.ptr.addr()),
                ("segment_free", x.ptr.addr()),
                ("segment_alloc", y.ptr.addr()),
                ("alloc", y.ptr.addr())
            ]
        );
        assert_eq!(get(&a, "num_alloc_retries"), 1);
        assert_eq!(get(&a, "num_sync_all_streams"), 1);
        assert_eq!(get(&a, "num_ooms"), 0);
        a.check_invariants().expect("consistent");
    }

    /// Expandable segments: a pending block is not room for new pages
    /// (`find_expandable_block`'s `allocatable`).
    #[test]
    fn expandable_growth_skips_pending_blocks() {
        let mut a = allocator("expandable_segments:True");
        let x = a.malloc(20 * MIB).expect("alloc");
        a.record_stream(x, SIDE).expect("record");
        a.device_mut().sleep(SIDE, 1).expect("sleep");
        a.free(x).expect("free");
        let y = a.malloc(20 * MIB).expect("alloc");
        assert_eq!(
            y.ptr.addr(),
            x.ptr.addr() + 20 * MIB,
            "mapped after the pending block"
        );
        assert_eq!(get(&a, "reserved_bytes.all.current"), 40 * MIB as i64);
        a.check_invariants().expect("consistent");
        a.empty_cache().expect("empty");
        assert_eq!(get(&a, "reserved_bytes.all.current"), 20 * MIB as i64);
        a.check_invariants().expect("consistent");
    }
}
