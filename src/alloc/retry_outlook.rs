//! Where an expandable-segment malloc's retry would land once its OOM path released the
//! cache, found without doing it. A trace shows that retry, when mapped pages served it, as
//! completions and unmaps followed by an allocation with no new memory: the same entries as
//! an `empty_cache()` followed by a malloc served from the cache. Where the two would put the
//! block tells them apart (PyTorch's retry, `try_allocate_expandable_block`, takes the free
//! space below the lowest hole; a cache hit takes the best fit by expandable size).

use super::block::{StreamId, DEFAULT_OWNER};
use super::expandable::ExpandableSegment;
use super::CachingAllocator;

/// What a [`Stretch`] of an expandable segment is once `release_cached_blocks` ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Piece {
    /// Handed out: the OOM path leaves it alone.
    Held,
    /// Free and still mapped: the partial pages at the edges of a free block.
    Free,
    /// No physical memory behind it: unmapped before, or by the OOM path.
    Unmapped,
}

/// A run of addresses of an expandable segment once `release_cached_blocks` ran.
#[derive(Debug, Clone, Copy)]
struct Stretch {
    /// Its first byte.
    address: u64,
    /// Its length.
    bytes: u64,
    /// What it is.
    piece: Piece,
}

impl CachingAllocator {
    /// The address at which `malloc_on(stream, size)` would be served from pages still
    /// mapped, had its OOM path just run `release_cached_blocks` in the default pools: every
    /// pending free completed (`synchronize_and_free_events`) and merged with its free
    /// neighbours, every whole page of each free mapped block unmapped, then the retry
    /// (`try_allocate_expandable_block`): the lowest-addressed unmapped range of the request's
    /// stream and pool, stepping back to the free block just below it, from which free and
    /// unmapped space in a row holds the request.
    ///
    /// `None` where that retry would map pages (the trace would show them), where the request
    /// does not go to the default pools' expandable segments, or while a private pool is
    /// being allocated to (the OOM path then skips `release_cached_blocks`).
    pub fn expandable_retry_from_mapped(&self, stream: StreamId, size: u64) -> Option<u64> {
        if size == 0 || size >= super::ONE_EXABYTE || self.capture_underway() {
            return None;
        }
        let request = self.request_as_routed(stream, size);
        if !request.expandable || request.owner != DEFAULT_OWNER {
            return None;
        }
        let mut segments: Vec<(u64, Vec<Stretch>)> = self
            .expandable
            .iter()
            .filter(|(_, segment)| {
                segment.stream == stream
                    && segment.pool == request.pool
                    && segment.owner == DEFAULT_OWNER
            })
            .map(|(id, segment)| (segment.base.addr(), self.stretches_after_flush(id, segment)))
            .collect();
        segments.sort_unstable_by_key(|&(base, _)| base);
        for (_, stretches) in &segments {
            for (at, stretch) in stretches.iter().enumerate() {
                if stretch.piece != Piece::Unmapped {
                    continue;
                }
                let start = match at.checked_sub(1) {
                    Some(below) if stretches[below].piece == Piece::Free => below,
                    _ => at,
                };
                let room: u64 = stretches[start..]
                    .iter()
                    .take_while(|stretch| stretch.piece != Piece::Held)
                    .map(|stretch| stretch.bytes)
                    .sum();
                if room >= request.size {
                    let first = stretches[start];
                    return (first.piece == Piece::Free && first.bytes >= request.size)
                        .then_some(first.address);
                }
            }
        }
        None
    }

    /// The stretches of the expandable segment `id`, in address order, as they would be once
    /// `release_cached_blocks` completed every pending free and unmapped the whole pages of
    /// each run of free mapped blocks (a pending free merges with its free neighbours once
    /// completed, so the run reaches through it).
    fn stretches_after_flush(
        &self,
        id: super::block::SegmentId,
        segment: &ExpandableSegment,
    ) -> Vec<Stretch> {
        let Some(head) = self
            .blocks
            .iter()
            .find(|(_, block)| block.segment == id && self.blocks.get(block.prev).is_none())
            .map(|(head, _)| head)
        else {
            return Vec::new();
        };
        let freeable = |block: &super::block::Block| block.mapped && !block.allocated;
        let mut stretches = Vec::new();
        let mut push = |address: u64, end: u64, piece: Piece| {
            if end > address {
                stretches.push(Stretch {
                    address,
                    bytes: end - address,
                    piece,
                });
            }
        };
        let mut cursor = head;
        while let Some(block) = self.blocks.get(cursor) {
            if !freeable(block) {
                let piece = if block.mapped {
                    Piece::Held
                } else {
                    Piece::Unmapped
                };
                push(block.ptr, block.ptr + block.size, piece);
                cursor = block.next;
                continue;
            }
            let start = block.ptr;
            let mut end = block.ptr + block.size;
            cursor = block.next;
            while let Some(next) = self.blocks.get(cursor).filter(|next| freeable(next)) {
                end = next.ptr + next.size;
                cursor = next.next;
            }
            let pages = segment.pages_inside(start, end - start);
            if pages.is_empty() {
                push(start, end, Piece::Free);
                continue;
            }
            let (low, high) = (
                segment.page_address(pages.begin),
                segment.page_address(pages.end),
            );
            push(start, low, Piece::Free);
            push(low, high, Piece::Unmapped);
            push(high, end, Piece::Free);
        }
        stretches
    }
}

#[cfg(test)]
mod tests {
    use crate::alloc::{AllocConf, Allocation, CachingAllocator, MIB};
    use crate::device::sim::SimDevice;

    /// A side stream for `record_stream`.
    const SIDE: u64 = 7;

    /// On a 1 GiB device capped at 90 MiB, one expandable segment holding, from its base:
    /// 7 MiB held, a 60 MiB block whose free waits for work on [`SIDE`], 12 MiB held (80 MiB
    /// mapped: four 20 MiB pages). The allocator, the segment's base and the pending block.
    fn segment_with_a_pending_free() -> (CachingAllocator, u64, Allocation) {
        let conf = AllocConf::parse("expandable_segments:True").expect("valid config");
        let mut a = CachingAllocator::new(Box::new(SimDevice::new(1 << 30)), conf).expect("new");
        let total = a.device().total_memory() as f64;
        let low = a.malloc(7 * MIB).expect("7 MiB");
        let pending = a.malloc(60 * MIB).expect("60 MiB");
        let _high = a.malloc(12 * MIB).expect("12 MiB");
        a.record_stream(pending, SIDE).expect("record_stream");
        a.device_mut().sleep(SIDE, 1).expect("work");
        a.free(pending).expect("free");
        a.set_memory_fraction(90.0 * MIB as f64 / total)
            .expect("fraction");
        (a, low.ptr.addr(), pending)
    }

    /// The OOM path completes the 60 MiB free and unmaps its two whole pages (20 to 60 MiB);
    /// the retry takes the 13 MiB left mapped below that hole: where the prediction said.
    #[test]
    fn the_retry_lands_below_the_hole_its_oom_path_unmapped() {
        let (mut a, base, pending) = segment_with_a_pending_free();
        let predicted = a.expandable_retry_from_mapped(0, 8 * MIB);
        assert_eq!(predicted, Some(pending.ptr.addr()));
        assert_eq!(pending.ptr.addr(), base + 7 * MIB);
        let served = a.malloc(8 * MIB).expect("served after the OOM path");
        assert_eq!(Some(served.ptr.addr()), predicted);
        let stats = a.stats();
        assert_eq!(stats.num_alloc_retries, 1, "served by the retry");
        assert_eq!(stats.num_ooms, 0);
    }

    /// A request larger than the 13 MiB left below the hole maps pages into it: no address
    /// from mapped space alone.
    #[test]
    fn a_retry_that_maps_pages_is_not_predicted() {
        let (a, _, _) = segment_with_a_pending_free();
        assert_eq!(a.expandable_retry_from_mapped(0, 14 * MIB), None);
    }

    /// Without expandable segments there is no such retry.
    #[test]
    fn nothing_is_predicted_for_cuda_malloc_segments() {
        let conf = AllocConf::parse("").expect("valid config");
        let a = CachingAllocator::new(Box::new(SimDevice::new(1 << 30)), conf).expect("new");
        assert_eq!(a.expandable_retry_from_mapped(0, MIB), None);
    }
}
