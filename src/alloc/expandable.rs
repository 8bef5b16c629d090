//! Expandable segments (`expandable_segments:True`): PyTorch's `ExpandableSegment`
//! (`c10/cuda/CUDACachingAllocator.cpp`, Note [Expandable Segments]).
//!
//! Instead of one `cudaMalloc` per segment, the allocator reserves one large virtual range per
//! (stream, pool) and maps physical pages into it as needed: whole pages of 2 MiB
//! ([`SMALL_BUFFER`]) for the small pool and the large segment size (PyTorch's
//! `large_segment_size`: 20 MiB, [`super::LARGE_BUFFER`], unless `large_segment_size_mb` says
//! otherwise) for the large pool. PyTorch takes these page sizes from its own
//! constants; the device's allocation granularity does not enter (a page that is not a multiple
//! of it makes `cuMemCreate`, here [`DeviceMemory::map_pages`], fail; gpumem checks it before
//! reserving a range, to say so clearly).
//!
//! This module keeps the page bookkeeping of one segment; the allocator's rules that use it
//! (finding room, mapping, unmapping, releasing) are in the crate-private `alloc::vmm`.

use super::block::{Pool, PoolOwner, SegmentId, StreamId, DEFAULT_OWNER};
use super::SMALL_BUFFER;
use crate::device::{DeviceError, DeviceMemory, DevicePtr};

/// The page size of a pool's expandable segments: PyTorch's `find_expandable_block` passes
/// `kSmallBuffer` (2 MiB) for the small pool and `large_segment_size` (20 MiB unless
/// `large_segment_size_mb` is set) for the large pool.
pub fn page_size(pool: Pool, large_segment_size: u64) -> u64 {
    match pool {
        Pool::Small => SMALL_BUFFER,
        Pool::Large => large_segment_size,
    }
}

/// How many pages a segment's virtual range holds (PyTorch's `max_handles_`): enough for
/// 1 1/8 of the device's total memory, `ceil((total + total / 8) / page)`, so pages unmapped
/// early in the range can be mapped again at its end.
pub fn reserved_pages(total_memory: u64, page: u64) -> u64 {
    let wanted = total_memory.saturating_add(total_memory / 8);
    wanted.div_ceil(page.max(1))
}

/// A range of whole pages `[begin, end)` of a segment, by page index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageRange {
    /// First page.
    pub begin: u64,
    /// One past the last page.
    pub end: u64,
}

impl PageRange {
    /// Number of pages.
    pub fn len(&self) -> u64 {
        self.end.saturating_sub(self.begin)
    }

    /// Whether the range holds no page.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One expandable segment: a reserved virtual range of `pages` pages of `page` bytes at
/// `base`, of which some are mapped.
#[derive(Debug, Clone)]
pub struct ExpandableSegment {
    /// First byte of the reserved range, as the device handed it out.
    pub base: DevicePtr,
    /// Bytes per page (PyTorch's `segment_size_`).
    pub page: u64,
    /// Pages the range holds (PyTorch's `max_handles_`).
    pub pages: u64,
    /// The stream the segment serves.
    pub stream: StreamId,
    /// The pool the segment serves.
    pub pool: Pool,
    /// Whose pool: the default pools or a private pool (set after [`ExpandableSegment::new`],
    /// which makes a default-pool segment).
    pub owner: PoolOwner,
    /// Which pages are mapped, from page 0; trailing unmapped pages are trimmed (PyTorch's
    /// `handles_` after `trimHandles`).
    mapped: Vec<bool>,
    /// Bytes currently mapped (PyTorch's `mapped_size_`).
    mapped_bytes: u64,
}

impl ExpandableSegment {
    /// A segment over the range `[base, base + page × pages)` with nothing mapped yet.
    pub fn new(base: DevicePtr, page: u64, pages: u64, stream: StreamId, pool: Pool) -> Self {
        ExpandableSegment {
            base,
            page,
            pages,
            stream,
            pool,
            owner: DEFAULT_OWNER,
            mapped: Vec::new(),
            mapped_bytes: 0,
        }
    }

    /// Bytes of the reserved range (PyTorch's `ExpandableSegment::size()`).
    pub fn size(&self) -> u64 {
        self.page * self.pages
    }

    /// Bytes currently mapped.
    pub fn mapped_bytes(&self) -> u64 {
        self.mapped_bytes
    }

    /// Whether page `index` is mapped.
    pub fn is_mapped(&self, index: u64) -> bool {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.mapped.get(i).copied())
            .unwrap_or(false)
    }

    /// The page holding `address` (PyTorch's `segmentLeft`).
    pub fn page_left(&self, address: u64) -> u64 {
        (address - self.base.addr()) / self.page
    }

    /// The first page at or after `address` (PyTorch's `segmentRight`).
    pub fn page_right(&self, address: u64) -> u64 {
        (address - self.base.addr()).div_ceil(self.page)
    }

    /// The pages a map of `[address, address + size)` covers: from the page holding `address`
    /// (which must start a page) to the page holding the last byte.
    pub fn pages_to_map(&self, address: u64, size: u64) -> PageRange {
        PageRange {
            begin: self.page_left(address),
            end: self.page_right(address + size),
        }
    }

    /// The whole pages lying inside `[address, address + size)`: partial pages at either edge
    /// are left out (PyTorch's `unmap` rounds the start up and the end down).
    pub fn pages_inside(&self, address: u64, size: u64) -> PageRange {
        PageRange {
            begin: self.page_right(address),
            end: self.page_left(address + size),
        }
    }

    /// The address of the first byte of page `index`.
    pub fn page_address(&self, index: u64) -> u64 {
        self.base.addr() + index * self.page
    }

    /// The device address of the pages `range`, derived from the segment's base; an error when
    /// the range does not lie inside the reserved range.
    fn pages_ptr(&self, range: PageRange) -> Result<DevicePtr, DeviceError> {
        range
            .begin
            .checked_mul(self.page)
            .zip(range.len().checked_mul(self.page))
            .and_then(|(offset, bytes)| self.base.offset_within(self.size(), offset, bytes))
            .ok_or_else(|| {
                DeviceError::InvalidArgument(format!(
                    "expandable segment at {:#x}: pages {}..{} lie outside its {} pages",
                    self.base, range.begin, range.end, self.pages
                ))
            })
    }

    /// Maps the pages covering `[address, address + size)` (`address` starts a page) with one
    /// device call. Returns the mapped range as (address, bytes) — at least `size` bytes,
    /// rounded up to whole pages — or `None` when the device is out of memory, in which case
    /// nothing was mapped.
    pub fn map(
        &mut self,
        device: &mut dyn DeviceMemory,
        address: u64,
        size: u64,
    ) -> Result<Option<(u64, u64)>, DeviceError> {
        let range = self.pages_to_map(address, size);
        if range.is_empty() {
            return Ok(None);
        }
        if range.end > self.pages || (range.begin..range.end).any(|i| self.is_mapped(i)) {
            return Err(DeviceError::InvalidArgument(format!(
                "expandable segment at {:#x}: pages {}..{} are outside the range or already mapped",
                self.base, range.begin, range.end
            )));
        }
        let start = self.page_address(range.begin);
        let bytes = range.len() * self.page;
        match device.map_pages(self.pages_ptr(range)?, bytes, self.page) {
            Ok(()) => {}
            Err(DeviceError::OutOfMemory) => return Ok(None),
            Err(other) => return Err(other),
        }
        self.set_mapped(range, true);
        self.mapped_bytes += bytes;
        Ok(Some((start, bytes)))
    }

    /// Unmaps the whole pages inside `[address, address + size)` with one device call. Returns
    /// the unmapped range as (address, bytes); bytes is 0 (and nothing happens) when no whole
    /// page lies inside.
    pub fn unmap(
        &mut self,
        device: &mut dyn DeviceMemory,
        address: u64,
        size: u64,
    ) -> Result<(u64, u64), DeviceError> {
        let range = self.pages_inside(address, size);
        if range.is_empty() {
            return Ok((address, 0));
        }
        let start = self.page_address(range.begin);
        let bytes = range.len() * self.page;
        device.unmap_pages(self.pages_ptr(range)?, bytes, self.page)?;
        self.set_mapped(range, false);
        self.mapped_bytes -= bytes;
        Ok((start, bytes))
    }

    /// Every maximal run of mapped pages, lowest first (PyTorch's `forEachAllocatedRange`).
    pub fn mapped_runs(&self) -> Vec<PageRange> {
        let mut runs = Vec::new();
        let mut start = None;
        for (index, &mapped) in self.mapped.iter().enumerate() {
            let index = index as u64;
            match (mapped, start) {
                (true, None) => start = Some(index),
                (false, Some(begin)) => {
                    runs.push(PageRange { begin, end: index });
                    start = None;
                }
                _ => {}
            }
        }
        if let Some(begin) = start {
            runs.push(PageRange {
                begin,
                end: self.mapped.len() as u64,
            });
        }
        runs
    }

    /// Unmaps everything still mapped and frees the reserved range (PyTorch's
    /// `~ExpandableSegment`).
    pub fn release(mut self, device: &mut dyn DeviceMemory) -> Result<(), DeviceError> {
        for run in self.mapped_runs() {
            device.unmap_pages(self.pages_ptr(run)?, run.len() * self.page, self.page)?;
            self.set_mapped(run, false);
        }
        device.free_address_range(self.base, self.size())
    }

    fn set_mapped(&mut self, range: PageRange, mapped: bool) {
        let end = usize::try_from(range.end).unwrap_or(usize::MAX);
        if mapped && self.mapped.len() < end {
            self.mapped.resize(end, false);
        }
        let begin = usize::try_from(range.begin).unwrap_or(usize::MAX);
        let upper = end.min(self.mapped.len());
        if begin < upper {
            self.mapped[begin..upper].fill(mapped);
        }
        while self.mapped.last() == Some(&false) {
            self.mapped.pop();
        }
    }
}

/// The live expandable segments, addressed by [`SegmentId`]; freed slots are reused.
#[derive(Debug, Default)]
pub struct SegmentTable {
    slots: Vec<Option<ExpandableSegment>>,
    vacant: Vec<SegmentId>,
}

impl SegmentTable {
    /// Stores a segment and returns its id.
    pub fn insert(&mut self, segment: ExpandableSegment) -> SegmentId {
        match self.vacant.pop() {
            Some(id) => {
                self.slots[id as usize] = Some(segment);
                id
            }
            None => {
                self.slots.push(Some(segment));
                (self.slots.len() - 1) as SegmentId
            }
        }
    }

    /// Deletes a segment, returning it.
    pub fn remove(&mut self, id: SegmentId) -> Option<ExpandableSegment> {
        let segment = self.slots.get_mut(id as usize)?.take()?;
        self.vacant.push(id);
        Some(segment)
    }

    /// The segment with this id, if it exists.
    pub fn get(&self, id: SegmentId) -> Option<&ExpandableSegment> {
        self.slots.get(id as usize)?.as_ref()
    }

    /// Mutable access to a segment, if it exists.
    pub fn get_mut(&mut self, id: SegmentId) -> Option<&mut ExpandableSegment> {
        self.slots.get_mut(id as usize)?.as_mut()
    }

    /// Every live segment with its id.
    pub fn iter(&self) -> impl Iterator<Item = (SegmentId, &ExpandableSegment)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(id, slot)| slot.as_ref().map(|segment| (id as SegmentId, segment)))
    }

    /// Removes and returns every live segment.
    pub fn drain(&mut self) -> Vec<ExpandableSegment> {
        self.vacant.clear();
        std::mem::take(&mut self.slots)
            .into_iter()
            .flatten()
            .collect()
    }

    /// Number of live segments (the unit tests' check).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.slots.iter().filter(|slot| slot.is_some()).count()
    }

    /// Whether no segment is live (the unit tests' check).
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::sim::SimDevice;

    const MIB: u64 = 1 << 20;

    #[test]
    fn page_sizes_and_reserve_follow_pytorch() {
        assert_eq!(page_size(Pool::Small, 20 * MIB), 2 * MIB);
        assert_eq!(page_size(Pool::Large, 20 * MIB), 20 * MIB);
        assert_eq!(page_size(Pool::Small, 40 * MIB), 2 * MIB);
        assert_eq!(page_size(Pool::Large, 40 * MIB), 40 * MIB);
        // The H200: 150109880320 + 18763735040 = 168873615360 bytes; 8053 pages of 20 MiB
        // (8052.52 rounded up), 80526 of 2 MiB (80525.21 rounded up).
        assert_eq!(reserved_pages(150_109_880_320, 20 * MIB), 8053);
        assert_eq!(reserved_pages(150_109_880_320, 2 * MIB), 80526);
        assert_eq!(reserved_pages(8 << 30, 20 * MIB), 461);
        assert_eq!(reserved_pages(0, 2 * MIB), 0);
    }

    #[test]
    fn map_rounds_up_unmap_rounds_in() {
        let segment = ExpandableSegment::new(
            DevicePtr::simulated(0x1000_0000),
            2 * MIB,
            100,
            0,
            Pool::Small,
        );
        let base = segment.base.addr();
        assert_eq!(
            segment.pages_to_map(base, 1),
            PageRange { begin: 0, end: 1 }
        );
        assert_eq!(
            segment.pages_to_map(base + 2 * MIB, 2 * MIB + 1),
            PageRange { begin: 1, end: 3 }
        );
        // A free block from 1 MiB to 7 MiB holds pages 1 and 2 whole; its edges are partial.
        assert_eq!(
            segment.pages_inside(base + MIB, 6 * MIB),
            PageRange { begin: 1, end: 3 }
        );
        // A block inside one page holds no whole page.
        assert!(segment.pages_inside(base + 512, MIB).is_empty());
        assert!(segment.pages_inside(base + MIB, 2 * MIB).is_empty());
        assert_eq!(
            segment.pages_inside(base, 2 * MIB),
            PageRange { begin: 0, end: 1 }
        );
    }

    #[test]
    fn map_and_unmap_track_pages_and_device_memory() {
        let mut device = SimDevice::new(1 << 30);
        let page = 2 * MIB;
        let pages = reserved_pages(device.total_memory(), page);
        let range = device.reserve_address_range(page * pages).expect("reserve");
        let free_before = device.mem_get_info().expect("info").0;
        let mut segment = ExpandableSegment::new(range, page, pages, 0, Pool::Small);
        let base = range.addr();
        assert_eq!(
            segment.map(&mut device, base, 3 * MIB),
            Ok(Some((base, 4 * MIB)))
        );
        assert_eq!(segment.mapped_bytes(), 4 * MIB);
        assert_eq!(
            device.mem_get_info().expect("info").0,
            free_before - 4 * MIB
        );
        assert!(
            segment.map(&mut device, base, page).is_err(),
            "mapped twice"
        );
        assert_eq!(
            segment.map(&mut device, base + 4 * MIB, 2 * MIB),
            Ok(Some((base + 4 * MIB, 2 * MIB)))
        );
        assert_eq!(segment.mapped_runs(), [PageRange { begin: 0, end: 3 }]);
        assert_eq!(
            segment.unmap(&mut device, base + MIB, 4 * MIB),
            Ok((base + 2 * MIB, 2 * MIB))
        );
        assert_eq!(
            segment.mapped_runs(),
            [
                PageRange { begin: 0, end: 1 },
                PageRange { begin: 2, end: 3 }
            ]
        );
        assert_eq!(
            segment.unmap(&mut device, base + MIB, MIB),
            Ok((base + MIB, 0))
        );
        // More than the device holds: refused, nothing mapped.
        assert_eq!(segment.map(&mut device, base + 6 * MIB, 1 << 30), Ok(None));
        assert_eq!(segment.mapped_bytes(), 4 * MIB);
        segment.release(&mut device).expect("release");
        assert_eq!(device.mem_get_info().expect("info").0, free_before);
    }

    #[test]
    fn table_reuses_slots() {
        let mut table = SegmentTable::default();
        let at = DevicePtr::simulated;
        let a = table.insert(ExpandableSegment::new(at(0), 2, 4, 0, Pool::Small));
        let b = table.insert(ExpandableSegment::new(at(8), 2, 4, 0, Pool::Large));
        assert_eq!((a, b), (0, 1));
        assert!(table.remove(a).is_some());
        assert!(table.get(a).is_none());
        assert_eq!(
            table.insert(ExpandableSegment::new(at(16), 2, 4, 3, Pool::Small)),
            0
        );
        assert_eq!(table.len(), 2);
        assert_eq!(table.drain().len(), 2);
        assert!(table.is_empty());
    }
}
