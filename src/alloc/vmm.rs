//! The allocator's expandable-segment rules (PyTorch's `find_expandable_block`,
//! `try_allocate_expandable_block`, `map_block`, `unmap_block`, `release_expandable_segment`):
//! where new memory goes, how mapped pages join the free blocks around them, and how whole free
//! pages go back to the device.
//!
//! An expandable segment's blocks tile its whole reserved range: mapped blocks (allocated or
//! free, the free ones in the pool's free set) and unmapped ranges of whole pages (in the
//! pool's unmapped set). Counters: mapping adds the mapped bytes to `reserved_bytes` and counts
//! one `num_device_alloc` per map call; unmapping takes them away and counts one
//! `num_device_free` per unmap call; `segment`, `oversize_segments` and the inactive-split
//! counters never change for expandable memory.

use super::block::{Block, BlockId, Pool, PoolOwner, SegmentId, NIL};
use super::expandable::{reserved_pages, ExpandableSegment, SegmentTable};
use super::{AllocError, CachingAllocator, EventKind, Request};
use crate::device::{DeviceError, DevicePtr};

impl CachingAllocator {
    /// PyTorch's `try_allocate_expandable_block`: finds the lowest-addressed place of the
    /// request's stream and pool with room for `request.size` bytes of free and unmapped
    /// memory, maps what is missing there in whole pages, and returns the (now mapped, free,
    /// uncached) block holding it. `Ok(None)` when the device has no memory for the pages.
    pub(super) fn try_allocate_expandable_block(
        &mut self,
        request: Request,
    ) -> Result<Option<BlockId>, AllocError> {
        let size = request.size;
        let mut candidate = self.find_expandable_block(request)?;
        // The candidate starts a run of free and unmapped blocks holding at least `size`
        // bytes: unmapped (then nothing), unmapped then free ..., or free then unmapped ....
        let block = self.blocks.at(candidate);
        if !block.mapped {
            let want = block.size.min(size);
            if !self.map_block(candidate, want)? {
                return Ok(None);
            }
        }
        while self.blocks.at(candidate).size < size {
            // Invariant: the candidate is free and mapped, and an unmapped range follows it;
            // mapping part of that range merges it into the candidate.
            let remaining = size - self.blocks.at(candidate).size;
            let next = self.blocks.at(candidate).next;
            let Some(next_block) = self.blocks.get(next) else {
                return Err(AllocError::Internal(
                    "expandable segment: the space found for a request ran out".into(),
                ));
            };
            let want = remaining.min(next_block.size);
            if !self.map_block(next, want)? {
                return Ok(None);
            }
            candidate = next;
        }
        self.uncache(candidate);
        Ok(Some(candidate))
    }

    /// PyTorch's `find_expandable_block`: the lowest-addressed unmapped range of the stream
    /// (stepping back to the free block just before it, if any) from which free and unmapped
    /// blocks in a row hold at least `request.size` bytes; else a new segment, whose whole
    /// range is one unmapped block.
    fn find_expandable_block(&mut self, request: Request) -> Result<BlockId, AllocError> {
        // PyTorch's `allocatable`: neither handed out nor waiting for a pending free.
        let available = |allocator: &Self, id: BlockId| {
            allocator
                .blocks
                .get(id)
                .is_some_and(|block| block.is_free())
        };
        let pool = self.pool_ref(request.owner, request.pool);
        for unmapped in pool.unmapped_of(request.stream) {
            let mut start = unmapped;
            let prev = self.blocks.at(unmapped).prev;
            if available(self, prev) {
                start = prev;
            }
            let mut bytes = 0;
            let mut cursor = start;
            while bytes < request.size && available(self, cursor) {
                let block = self.blocks.at(cursor);
                bytes += block.size;
                cursor = block.next;
            }
            if bytes >= request.size {
                return Ok(start);
            }
        }
        self.new_expandable_segment(request.stream, request.pool, request.owner)
    }

    /// Reserves a new expandable segment for (stream, pool, owner) and records its whole range
    /// as one unmapped block.
    fn new_expandable_segment(
        &mut self,
        stream: u64,
        pool: Pool,
        owner: PoolOwner,
    ) -> Result<BlockId, AllocError> {
        let page = self.page_size(pool);
        // PyTorch does not consult the granularity: a page it does not divide makes the first
        // cuMemCreate fail. Checking first gives that failure a clear message.
        let granularity = self.device.allocation_granularity()?;
        if granularity == 0 || !page.is_multiple_of(granularity) {
            return Err(AllocError::Device(DeviceError::Unsupported(format!(
                "expandable segments map pages of {page} bytes, which the device's allocation granularity of {granularity} bytes does not divide"
            ))));
        }
        let pages = reserved_pages(self.device.total_memory(), page);
        let bytes = page
            .checked_mul(pages)
            .filter(|&bytes| bytes > 0)
            .ok_or_else(|| {
                AllocError::Device(DeviceError::InvalidArgument(format!(
                    "expandable segment: cannot reserve {pages} pages of {page} bytes"
                )))
            })?;
        let range = self.device.reserve_address_range(bytes)?;
        let base = range.addr();
        let mut new_segment = ExpandableSegment::new(range, page, pages, stream, pool);
        new_segment.owner = owner;
        let segment = self.expandable.insert(new_segment);
        let id = self.blocks.insert(Block {
            stream,
            ptr: base,
            size: bytes,
            requested_size: 0,
            pool,
            owner,
            allocated: false,
            pending_free: false,
            event_count: 0,
            mapped: false,
            segment,
            segment_base: DevicePtr::NULL,
            segment_size: 0,
            prev: NIL,
            next: NIL,
            gc_count_base: 0,
        });
        self.pool_mut(owner, pool).insert_unmapped(stream, base, id);
        self.emit(
            EventKind::RangeReserve,
            base,
            bytes,
            page,
            stream,
            pool,
            owner,
        );
        Ok(id)
    }

    /// PyTorch's `map_block`: maps the pages covering the first `size` bytes of the unmapped
    /// block `id`; the block becomes a free mapped block of whole pages (the unmapped rest
    /// split off after it), merged with free neighbours and cached. `Ok(false)` when the device
    /// is out of memory (nothing changed).
    fn map_block(&mut self, id: BlockId, size: u64) -> Result<bool, AllocError> {
        let &Block {
            ptr,
            size: block_size,
            segment: segment_id,
            stream,
            pool,
            owner,
            ..
        } = self.blocks.at(id);
        let segment = segment_of(&mut self.expandable, segment_id, ptr)?;
        let Some((mapped_ptr, mapped)) = segment.map(self.device.as_mut(), ptr, size)? else {
            return Ok(false);
        };
        self.pool_mut(owner, pool).remove_unmapped(stream, ptr, id);
        self.blocks.at_mut(id).mapped = true;
        if mapped < block_size {
            // The unmapped rest becomes its own block right after this one.
            let next = self.blocks.at(id).next;
            let rest = self.blocks.insert(Block {
                stream,
                ptr: ptr + mapped,
                size: block_size - mapped,
                requested_size: 0,
                pool,
                owner,
                allocated: false,
                pending_free: false,
                event_count: 0,
                mapped: false,
                segment: segment_id,
                segment_base: DevicePtr::NULL,
                segment_size: 0,
                prev: id,
                next,
                gc_count_base: 0,
            });
            if next != NIL {
                self.blocks.at_mut(next).prev = rest;
            }
            let block = self.blocks.at_mut(id);
            block.next = rest;
            block.size = mapped;
            self.pool_mut(owner, pool)
                .insert_unmapped(stream, ptr + mapped, rest);
        }
        let (prev, next) = (self.blocks.at(id).prev, self.blocks.at(id).next);
        self.try_merge(id, prev, true);
        self.try_merge(id, next, true);
        self.insert_free(id);
        self.total_allocated_memory += mapped;
        self.stats.reserved_bytes.increase(pool, mapped as i64);
        self.stats.num_device_alloc += 1;
        self.emit(
            EventKind::SegmentMap,
            mapped_ptr,
            mapped,
            mapped,
            stream,
            pool,
            owner,
        );
        Ok(true)
    }

    /// PyTorch's `unmap_block`: unmaps the whole pages inside the free block `id`. Partial
    /// pages at its edges stay mapped as free blocks of their own; the unmapped middle keeps
    /// the id, merges with unmapped neighbours and joins the unmapped set. Nothing happens when
    /// no whole page lies inside.
    pub(super) fn unmap_block(&mut self, id: BlockId) -> Result<(), AllocError> {
        let &Block {
            ptr,
            size,
            segment: segment_id,
            stream,
            pool,
            owner,
            ..
        } = self.blocks.at(id);
        let segment = segment_of(&mut self.expandable, segment_id, ptr)?;
        let (unmapped_ptr, unmapped) = segment.unmap(self.device.as_mut(), ptr, size)?;
        if unmapped == 0 {
            return Ok(());
        }
        self.pool_mut(owner, pool).remove(stream, size, ptr, id);
        let before = unmapped_ptr - ptr;
        if before > 0 {
            let prev = self.blocks.at(id).prev;
            let piece = self.free_piece(id, ptr, before, prev, id);
            if prev != NIL {
                self.blocks.at_mut(prev).next = piece;
            }
            self.blocks.at_mut(id).prev = piece;
            self.insert_free(piece);
        }
        let after = size - before - unmapped;
        if after > 0 {
            let next = self.blocks.at(id).next;
            let piece = self.free_piece(id, unmapped_ptr + unmapped, after, id, next);
            if next != NIL {
                self.blocks.at_mut(next).prev = piece;
            }
            self.blocks.at_mut(id).next = piece;
            self.insert_free(piece);
        }
        let block = self.blocks.at_mut(id);
        block.ptr = unmapped_ptr;
        block.size = unmapped;
        block.mapped = false;
        let (prev, next) = (block.prev, block.next);
        self.try_merge(id, prev, false);
        self.try_merge(id, next, false);
        let ptr = self.blocks.at(id).ptr;
        self.pool_mut(owner, pool).insert_unmapped(stream, ptr, id);
        self.total_allocated_memory -= unmapped;
        self.stats.reserved_bytes.decrease(pool, unmapped as i64);
        self.uncount_private_malloc(owner);
        self.stats.num_device_free += 1;
        self.emit(
            EventKind::SegmentUnmap,
            unmapped_ptr,
            unmapped,
            unmapped,
            stream,
            pool,
            owner,
        );
        Ok(())
    }

    /// A new free mapped block of `size` bytes at `ptr`, in the same segment as `like`, linked
    /// between `prev` and `next` (the caller fixes the neighbours' links).
    fn free_piece(
        &mut self,
        like: BlockId,
        ptr: u64,
        size: u64,
        prev: BlockId,
        next: BlockId,
    ) -> BlockId {
        let model = self.blocks.at(like);
        let piece = Block {
            stream: model.stream,
            ptr,
            size,
            requested_size: 0,
            pool: model.pool,
            owner: model.owner,
            allocated: false,
            pending_free: false,
            event_count: 0,
            mapped: true,
            segment: model.segment,
            segment_base: model.segment_base,
            segment_size: model.segment_size,
            prev,
            next,
            gc_count_base: 0,
        };
        self.blocks.insert(piece)
    }

    /// PyTorch's `release_expandable_segment`: the block `id` is an unmapped range covering a
    /// whole segment; forget both and free the segment's reserved range.
    pub(super) fn release_expandable_segment(&mut self, id: BlockId) -> Result<(), AllocError> {
        let block = self.blocks.at(id);
        let (ptr, size, segment_id, stream, pool, owner, mapped) = (
            block.ptr,
            block.size,
            block.segment,
            block.stream,
            block.pool,
            block.owner,
            block.mapped,
        );
        let whole = self
            .expandable
            .get(segment_id)
            .is_some_and(|segment| segment.base.addr() == ptr && segment.size() == size);
        if mapped || !whole {
            return Err(AllocError::Internal(format!(
                "expandable segment at {ptr:#x}: the block disagrees with the segment"
            )));
        }
        self.pool_mut(owner, pool).remove_unmapped(stream, ptr, id);
        self.blocks.remove(id);
        if let Some(segment) = self.expandable.remove(segment_id) {
            let page = segment.page;
            segment.release(self.device.as_mut())?;
            self.emit(
                EventKind::RangeRelease,
                ptr,
                size,
                page,
                stream,
                pool,
                owner,
            );
        }
        Ok(())
    }
}

/// The expandable segment `id` that the block at `ptr` lies in; an error (never expected: every
/// block of an expandable pool records its segment) when there is none.
fn segment_of(
    segments: &mut SegmentTable,
    id: SegmentId,
    ptr: u64,
) -> Result<&mut ExpandableSegment, AllocError> {
    segments.get_mut(id).ok_or_else(|| {
        AllocError::Internal(format!("block at {ptr:#x} is not in an expandable segment"))
    })
}
