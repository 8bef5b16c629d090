//! What every byte of every segment holds, in one plain form the renderers share: the text map
//! ([`super::map`]), the fragmentation figures ([`super::fragmentation`]) and the HTML report's
//! first frame ([`super::report`]). Built from the allocator's snapshot, so nothing here
//! reaches into the allocator's internals.

use crate::alloc::{Block, CachingAllocator, MemPoolId, Pool};

/// What a stretch of a segment holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Region {
    /// A block handed out to a live tensor.
    Allocated,
    /// A free block in a segment that also holds something else: cached, but `empty_cache()`
    /// cannot return it (PyTorch's "inactive split" bytes).
    SplitFree,
    /// A wholly free segment: cached, and `empty_cache()` returns it to the device.
    CachedFree,
    /// Virtual addresses of an expandable segment with no physical page behind them.
    Unmapped,
}

impl Region {
    /// Every region, in the order legends list them.
    pub const ALL: [Region; 4] = [
        Region::Allocated,
        Region::SplitFree,
        Region::CachedFree,
        Region::Unmapped,
    ];

    /// A short name (`allocated`, `split_free`, `cached_free`, `unmapped`), used as a key in
    /// script maps and as a CSS class in the report.
    pub fn name(self) -> &'static str {
        match self {
            Region::Allocated => "allocated",
            Region::SplitFree => "split_free",
            Region::CachedFree => "cached_free",
            Region::Unmapped => "unmapped",
        }
    }

    /// Whether the bytes are cached free memory (either kind).
    pub fn is_free(self) -> bool {
        matches!(self, Region::SplitFree | Region::CachedFree)
    }
}

/// One contiguous stretch of a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// First byte's device address.
    pub address: u64,
    /// Bytes covered.
    pub size: u64,
    /// What it holds.
    pub region: Region,
}

/// One segment and its spans, lowest address first; the spans tile the segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentLayout {
    /// Base address.
    pub address: u64,
    /// Bytes covered, spans of every kind together.
    pub size: u64,
    /// The pool the segment serves.
    pub pool: Pool,
    /// The memory pool it belongs to: (0, 0) for the default pools, else a private pool's id
    /// (a CUDA graph's, a `MemPool`'s).
    pub pool_id: MemPoolId,
    /// The spans, tiling `address..address + size`.
    pub spans: Vec<Span>,
}

impl SegmentLayout {
    /// Bytes of spans of `region`.
    pub fn bytes(&self, region: Region) -> u64 {
        self.spans
            .iter()
            .filter(|span| span.region == region)
            .map(|span| span.size)
            .sum()
    }

    /// Builds a segment from its blocks as (address, size, allocated), lowest address first.
    /// A free block is [`Region::CachedFree`] when it is the whole segment, else
    /// [`Region::SplitFree`].
    pub fn from_blocks(
        address: u64,
        size: u64,
        pool: Pool,
        blocks: impl IntoIterator<Item = (u64, u64, bool)>,
    ) -> SegmentLayout {
        let spans = blocks
            .into_iter()
            .map(|(address, block_size, allocated)| Span {
                address,
                size: block_size,
                region: if allocated {
                    Region::Allocated
                } else if block_size == size {
                    Region::CachedFree
                } else {
                    Region::SplitFree
                },
            })
            .collect();
        SegmentLayout {
            address,
            size,
            pool,
            pool_id: MemPoolId::DEFAULT,
            spans,
        }
    }
}

/// Every segment's layout, by address.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryLayout {
    /// The segments, lowest address first.
    pub segments: Vec<SegmentLayout>,
}

impl MemoryLayout {
    /// The allocator's layout now: every `cudaMalloc` segment, and every expandable segment
    /// from its base to the end of its last mapped page, unmapped pages inside shown as
    /// [`Region::Unmapped`]. In an expandable segment the whole pages of a free block are
    /// [`Region::CachedFree`] (`empty_cache()` unmaps them) and its partial pages
    /// [`Region::SplitFree`].
    pub fn of(allocator: &CachingAllocator) -> MemoryLayout {
        let mut blocks: Vec<&Block> = allocator.blocks().collect();
        blocks.sort_unstable_by_key(|block| block.ptr);
        let blocks_in = |base: u64, end: u64| {
            let start = blocks.partition_point(|block| block.ptr < base);
            let stop = blocks.partition_point(|block| block.ptr < end);
            blocks[start..stop].iter().copied()
        };
        let pool_ids: std::collections::BTreeMap<u64, MemPoolId> =
            allocator.segment_pool_ids().collect();
        let mut segments: Vec<SegmentLayout> = allocator
            .segments()
            .map(|(base, size, pool)| {
                let mut layout = SegmentLayout::from_blocks(
                    base,
                    size,
                    pool,
                    blocks_in(base, base + size).map(|b| (b.ptr, b.size, b.is_active())),
                );
                layout.pool_id = pool_ids.get(&base).copied().unwrap_or_default();
                layout
            })
            .collect();
        for info in allocator.expandable_segments() {
            let inside: Vec<&Block> = blocks_in(info.base, info.base + info.reserved).collect();
            let Some(end) = inside
                .iter()
                .filter(|block| block.mapped)
                .map(|block| block.ptr + block.size)
                .max()
            else {
                continue;
            };
            let mut spans = Vec::new();
            for block in inside.iter().filter(|block| block.ptr < end) {
                if block.is_active() {
                    spans.push(Span {
                        address: block.ptr,
                        size: block.size,
                        region: Region::Allocated,
                    });
                } else if !block.mapped {
                    spans.push(Span {
                        address: block.ptr,
                        size: block.size.min(end - block.ptr),
                        region: Region::Unmapped,
                    });
                } else {
                    free_pages(&mut spans, info.base, info.page, block.ptr, block.size);
                }
            }
            segments.push(SegmentLayout {
                address: info.base,
                size: end - info.base,
                pool: info.pool,
                pool_id: info.pool_id,
                spans,
            });
        }
        // A private pool still in use keeps its free segments through empty_cache().
        let in_use: Vec<MemPoolId> = allocator
            .private_pools()
            .iter()
            .filter(|pool| !pool.freeable)
            .map(|pool| pool.id)
            .collect();
        for segment in segments.iter_mut().filter(|s| in_use.contains(&s.pool_id)) {
            for span in &mut segment.spans {
                if span.region == Region::CachedFree {
                    span.region = Region::SplitFree;
                }
            }
        }
        segments.sort_by_key(|segment| segment.address);
        MemoryLayout { segments }
    }

    /// Bytes of `region` over every segment.
    pub fn bytes(&self, region: Region) -> u64 {
        self.segments
            .iter()
            .map(|segment| segment.bytes(region))
            .sum()
    }

    /// Bytes held from the device: every segment's mapped bytes.
    pub fn reserved(&self) -> u64 {
        self.segments
            .iter()
            .map(|segment| segment.size - segment.bytes(Region::Unmapped))
            .sum()
    }
}

/// Splits a free block of an expandable segment (pages of `page` bytes from `base`) into its
/// whole pages ([`Region::CachedFree`]) and the partial pages around them
/// ([`Region::SplitFree`]).
fn free_pages(spans: &mut Vec<Span>, base: u64, page: u64, address: u64, size: u64) {
    let page = page.max(1);
    let end = address + size;
    let first = base + (address - base).div_ceil(page) * page;
    let last = base + (end - base) / page * page;
    let mut push = |from: u64, to: u64, region: Region| {
        if to > from {
            spans.push(Span {
                address: from,
                size: to - from,
                region,
            });
        }
    };
    if first >= last {
        push(address, end, Region::SplitFree);
    } else {
        push(address, first, Region::SplitFree);
        push(first, last, Region::CachedFree);
        push(last, end, Region::SplitFree);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::AllocConf;
    use crate::device::sim::SimDevice;

    #[test]
    fn free_pieces_of_split_segments_differ_from_free_segments() {
        let mut allocator =
            CachingAllocator::new(Box::new(SimDevice::new(1 << 30)), AllocConf::default())
                .expect("allocator");
        let kept = allocator.malloc(4 << 20).expect("fits");
        let gone = allocator.malloc(40 << 20).expect("fits");
        allocator.free(gone).expect("frees");
        let layout = MemoryLayout::of(&allocator);
        assert_eq!(layout.segments.len(), 2);
        let regions: Vec<Vec<Region>> = layout
            .segments
            .iter()
            .map(|segment| segment.spans.iter().map(|span| span.region).collect())
            .collect();
        assert!(regions.contains(&vec![Region::Allocated, Region::SplitFree]));
        assert!(regions.contains(&vec![Region::CachedFree]));
        assert_eq!(layout.bytes(Region::Allocated), kept.size);
        assert_eq!(layout.bytes(Region::SplitFree), (20 << 20) - kept.size);
        assert_eq!(layout.bytes(Region::CachedFree), 40 << 20);
        assert_eq!(layout.reserved(), 60 << 20);
    }

    #[test]
    fn expandable_segments_show_unmapped_pages_and_whole_free_pages() {
        let conf = AllocConf::parse("expandable_segments:True").expect("config");
        let mut allocator =
            CachingAllocator::new(Box::new(SimDevice::new(1 << 30)), conf).expect("allocator");
        let a = allocator.malloc(30 << 20).expect("fits");
        let b = allocator.malloc(30 << 20).expect("fits");
        allocator.free(a).expect("frees");
        let layout = MemoryLayout::of(&allocator);
        assert_eq!(layout.segments.len(), 1, "{layout:?}");
        let segment = &layout.segments[0];
        assert_eq!(layout.bytes(Region::Allocated), b.size);
        // The freed 30 MiB holds one whole 20 MiB page; the rest is partial pages.
        assert_eq!(segment.bytes(Region::CachedFree), 20 << 20);
        assert_eq!(segment.bytes(Region::SplitFree), 10 << 20);
        allocator.empty_cache().expect("empties");
        let layout = MemoryLayout::of(&allocator);
        assert_eq!(layout.bytes(Region::Unmapped), 20 << 20, "{layout:?}");
        assert_eq!(
            layout.reserved(),
            allocator.stats().reserved_bytes.all.current as u64
        );
    }
}
