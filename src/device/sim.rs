//! The simulated GPU: capacity, a CUDA context's cost, `cudaMalloc`'s 2 MiB granularity, and
//! segment addresses placed the way the H200's driver places them, so best-fit ties between
//! equal-size blocks break exactly as on the real device. For expandable segments it also
//! models the driver's virtual memory management: reserved ranges (free of cost) and mapped
//! pages (each costing its size).

use std::cell::Cell;
use std::collections::BTreeMap;

use super::address_space::AddressSpace;
use super::streams::{StreamEvent, StreamWork};
use super::{DeviceError, DeviceMemory, DevicePtr, DriverMemory, MemorySpace, ProcessMemory};

const MIB: u64 = 1 << 20;

/// `cudaMemGetInfo`'s total on the H200 we measure on (`totalGlobalMem`), the default capacity.
pub const H200_TOTAL_MEMORY: u64 = 150_109_880_320;
/// What a bare CUDA context costs on the H200 in `cudaMemGetInfo`'s free figure (measured:
/// 527 MiB = total − free − reserved in PyTorch processes).
pub const H200_CONTEXT_BYTES: u64 = 527 * MIB;
/// The part of that cost NVML attributes to the process (its per-process "used", which PyTorch's
/// OOM message quotes as "this process has ... in use"): 520 MiB, measured as NVML's 547356672
/// bytes for a PyTorch process holding one 2 MiB segment (tests/fixtures/
/// pytorch-seed-walkthrough.json, step 1). The other 7 MiB count as used on the device but as
/// nobody's.
pub const H200_PROCESS_CONTEXT_BYTES: u64 = 520 * MIB;
/// A simulated device's context is at most this fraction of it (one eighth): the H200's
/// 527 MiB would leave a device of a few hundred MiB nothing to allocate. Not PyTorch's or the
/// driver's behaviour, a choice of the model, said when such a device is opened.
pub const SMALL_DEVICE_CONTEXT_SHARE: u64 = 8;
/// NVML's "used" on the H200 before any process creates a context: memory the driver keeps
/// for itself (measured: 644939776 bytes).
pub const H200_DRIVER_RESERVED_BYTES: u64 = 644_939_776;
/// `cudaMalloc` hands out physical memory in 2 MiB pages, so a segment costs its size rounded
/// up to this in the free figure.
pub const DEVICE_PAGE: u64 = 2 * MIB;
/// The largest simulated device: its segments must fit in the modelled address window
/// (`VA_FLOOR..VA_TOP`, about 140 TB) with room for the driver's 32 MiB chunking.
pub const MAX_TOTAL_MEMORY: u64 = 64 << 40;
/// The physical allocation granularity of `cuMemCreate` (`cuMemGetAllocationGranularity`,
/// minimum, pinned device memory): 2 MiB on the H200, as on every current NVIDIA GPU.
pub const VMM_GRANULARITY: u64 = 2 * MIB;

/// A simulated GPU of a given capacity.
///
/// Its CUDA context comes into being at the first call that needs one (every call but the
/// total, the label and the driver's view: `cudaMalloc`, `cudaMemGetInfo`, the virtual-memory
/// calls), as a real GPU's does: until then the driver's view shows this process
/// using nothing, which is what a script reading `device_memory()` first sees.
#[derive(Debug, Clone)]
pub struct SimDevice {
    total: u64,
    /// The device's ordinal among the simulated machine's devices.
    index: usize,
    /// Whether the machine has several devices, so the label names the ordinal (`sim:1`).
    numbered: bool,
    context_bytes: u64,
    /// The part of `context_bytes` NVML attributes to this process.
    process_context_bytes: u64,
    /// Whether a call that needs the context has been made.
    context_created: Cell<bool>,
    /// Bytes of device pages held by segments.
    used: u64,
    segments: BTreeMap<u64, u64>,
    addresses: AddressSpace,
    /// Mapped pages of reserved ranges: page address → page size.
    pages: BTreeMap<u64, u64>,
    /// What is queued on each stream ([`StreamWork`]'s rule: work completes at the next
    /// synchronisation point).
    streams: StreamWork,
}

impl SimDevice {
    /// A simulated device of `total` bytes. Its context costs what the H200's does, but never
    /// more than an eighth of the device ([`SMALL_DEVICE_CONTEXT_SHARE`]), so small simulated
    /// devices stay usable; [`SimDevice::context_is_scaled`] says when that applies.
    pub fn new(total: u64) -> SimDevice {
        let context_bytes = H200_CONTEXT_BYTES.min(total / SMALL_DEVICE_CONTEXT_SHARE);
        // The attributed share keeps the H200's proportion on a smaller simulated device.
        let process_context_bytes = (u128::from(context_bytes)
            * u128::from(H200_PROCESS_CONTEXT_BYTES)
            / u128::from(H200_CONTEXT_BYTES)) as u64;
        SimDevice {
            total,
            index: 0,
            numbered: false,
            context_bytes,
            process_context_bytes,
            context_created: Cell::new(false),
            used: 0,
            segments: BTreeMap::new(),
            addresses: AddressSpace::new(),
            pages: BTreeMap::new(),
            streams: StreamWork::default(),
        }
    }

    /// The H200 we measure on.
    pub fn h200() -> SimDevice {
        SimDevice::new(H200_TOTAL_MEMORY)
    }

    /// This device as device `index` of a simulated machine with several devices: its index
    /// is `index` (as in PyTorch's OOM message, "GPU 1 has ...") and its label `sim:INDEX`.
    /// A machine of one device keeps [`SimDevice::new`]'s index 0 and label `sim`.
    pub fn numbered(self, index: usize) -> SimDevice {
        SimDevice {
            index,
            numbered: true,
            ..self
        }
    }

    /// A device like this one (capacity, index, label) as a process that never used it sees
    /// it: nothing allocated, no context. What a fresh session on the same machine gets.
    pub fn fresh(&self) -> SimDevice {
        let device = SimDevice::new(self.total);
        SimDevice {
            index: self.index,
            numbered: self.numbered,
            ..device
        }
    }

    /// What the simulated CUDA context costs in the driver's view.
    pub fn context_bytes(&self) -> u64 {
        self.context_bytes
    }

    /// Whether this device is too small for the H200's context, which is then scaled down to
    /// an eighth of it (below 8 × 527 MiB, about 4.12 GiB).
    pub fn context_is_scaled(&self) -> bool {
        self.context_bytes < H200_CONTEXT_BYTES
    }

    /// Whether the context exists yet (a call that needs it was made).
    pub fn has_context(&self) -> bool {
        self.context_created.get()
    }

    /// Creates the context if it does not exist yet (the first CUDA call does).
    fn touch_context(&self) {
        self.context_created.set(true);
    }

    /// What the context costs now: nothing before it exists.
    fn context_now(&self) -> u64 {
        if self.context_created.get() {
            self.context_bytes
        } else {
            0
        }
    }

    /// The context's share NVML attributes to this process now: nothing before it exists.
    fn process_context_now(&self) -> u64 {
        if self.context_created.get() {
            self.process_context_bytes
        } else {
            0
        }
    }

    fn free_bytes(&self) -> u64 {
        self.total
            .saturating_sub(self.context_now())
            .saturating_sub(self.used)
    }

    /// Bytes of pages currently mapped into reserved ranges.
    pub fn mapped_bytes(&self) -> u64 {
        self.pages.values().sum()
    }

    /// Checks a `map_pages`/`unmap_pages` request: a whole number of granularity-sized pages,
    /// inside one reservation, page-aligned from its base.
    fn check_pages(
        &self,
        call: &str,
        address: u64,
        bytes: u64,
        page: u64,
    ) -> Result<(), DeviceError> {
        let fail = |why: &str| {
            Err(DeviceError::InvalidArgument(format!(
                "{call}({address:#x}, {bytes}, page {page}): {why}"
            )))
        };
        if page == 0 || !page.is_multiple_of(VMM_GRANULARITY) {
            return fail("the page is not a multiple of the 2 MiB allocation granularity");
        }
        if bytes == 0 || !bytes.is_multiple_of(page) {
            return fail("the size is not a positive multiple of the page");
        }
        let Some((base, _)) = self.addresses.reservation_holding(address, bytes) else {
            return fail("the range is not inside one reserved range");
        };
        if !(address - base).is_multiple_of(page) {
            return fail("the address is not page-aligned from the reservation's base");
        }
        Ok(())
    }
}

impl DeviceMemory for SimDevice {
    fn malloc(&mut self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        self.touch_context();
        if bytes == 0 {
            return Err(DeviceError::InvalidArgument("cudaMalloc of 0 bytes".into()));
        }
        let pages = bytes.div_ceil(DEVICE_PAGE) * DEVICE_PAGE;
        if pages > self.free_bytes() {
            return Err(DeviceError::OutOfMemory);
        }
        let address = self
            .addresses
            .allocate(bytes)
            .ok_or(DeviceError::OutOfMemory)?;
        self.used += pages;
        self.segments.insert(address, bytes);
        Ok(DevicePtr::simulated(address))
    }

    fn free(&mut self, segment: DevicePtr) -> Result<(), DeviceError> {
        self.touch_context();
        let address = segment.addr_in(MemorySpace::Simulated, "cudaFree")?;
        // cudaFree synchronises the device.
        self.streams.synchronize_all();
        let Some(bytes) = self.segments.remove(&address) else {
            return Err(DeviceError::InvalidArgument(format!(
                "cudaFree of {address:#x}, which is not a segment"
            )));
        };
        self.addresses.free(address);
        self.used -= bytes.div_ceil(DEVICE_PAGE) * DEVICE_PAGE;
        Ok(())
    }

    fn mem_get_info(&self) -> Result<(u64, u64), DeviceError> {
        self.touch_context();
        Ok((self.free_bytes(), self.total))
    }

    fn total_memory(&self) -> u64 {
        self.total
    }

    fn index(&self) -> usize {
        self.index
    }

    /// This process, once it has a context (NVML lists only processes with one).
    fn process_memory(&self) -> Vec<ProcessMemory> {
        if !self.has_context() {
            return Vec::new();
        }
        vec![ProcessMemory {
            pid: std::process::id(),
            is_current: true,
            used_bytes: self.process_context_now() + self.used,
        }]
    }

    fn label(&self) -> String {
        if self.numbered {
            format!("sim:{}", self.index)
        } else {
            "sim".into()
        }
    }

    fn allocation_granularity(&self) -> Result<u64, DeviceError> {
        self.touch_context();
        Ok(VMM_GRANULARITY)
    }

    fn reserve_address_range(&mut self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        self.touch_context();
        if bytes == 0 || !bytes.is_multiple_of(VMM_GRANULARITY) {
            return Err(DeviceError::InvalidArgument(format!(
                "cuMemAddressReserve of {bytes} bytes: not a positive multiple of the granularity"
            )));
        }
        self.addresses
            .place_reservation(bytes, VMM_GRANULARITY)
            .map(DevicePtr::simulated)
            .ok_or_else(|| {
                DeviceError::InvalidArgument(format!(
                    "cuMemAddressReserve of {bytes} bytes: no virtual address range that large is free"
                ))
            })
    }

    fn free_address_range(&mut self, base: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.touch_context();
        let base = base.addr_in(MemorySpace::Simulated, "cuMemAddressFree")?;
        let end = base.saturating_add(bytes);
        if self.pages.range(base..end).next().is_some() {
            return Err(DeviceError::InvalidArgument(format!(
                "cuMemAddressFree({base:#x}, {bytes}): pages are still mapped"
            )));
        }
        if !self.addresses.free_reservation(base, bytes) {
            return Err(DeviceError::InvalidArgument(format!(
                "cuMemAddressFree({base:#x}, {bytes}): not a reserved range"
            )));
        }
        Ok(())
    }

    fn map_pages(&mut self, address: DevicePtr, bytes: u64, page: u64) -> Result<(), DeviceError> {
        self.touch_context();
        let address = address.addr_in(MemorySpace::Simulated, "map_pages")?;
        self.check_pages("map_pages", address, bytes, page)?;
        if self.pages.range(address..address + bytes).next().is_some() {
            return Err(DeviceError::InvalidArgument(format!(
                "map_pages({address:#x}, {bytes}): part of the range is already mapped"
            )));
        }
        // Each page is one cuMemCreate; running out part-way releases the pages already made,
        // so either all fit or none is mapped.
        if bytes > self.free_bytes() {
            return Err(DeviceError::OutOfMemory);
        }
        for index in 0..bytes / page {
            self.pages.insert(address + index * page, page);
        }
        self.used += bytes;
        Ok(())
    }

    fn unmap_pages(
        &mut self,
        address: DevicePtr,
        bytes: u64,
        page: u64,
    ) -> Result<(), DeviceError> {
        self.touch_context();
        let address = address.addr_in(MemorySpace::Simulated, "unmap_pages")?;
        self.check_pages("unmap_pages", address, bytes, page)?;
        let count = bytes / page;
        let all_mapped =
            (0..count).all(|index| self.pages.get(&(address + index * page)) == Some(&page));
        if !all_mapped || self.pages.range(address..address + bytes).count() as u64 != count {
            return Err(DeviceError::InvalidArgument(format!(
                "unmap_pages({address:#x}, {bytes}): not every page of the range is mapped with page size {page}"
            )));
        }
        for index in 0..count {
            self.pages.remove(&(address + index * page));
        }
        self.used -= bytes;
        // Unmapping waits for the device first, as gpumem's CUDA device does
        // (`cuCtxSynchronize`; PyTorch synchronises the segment's stream, which this call does
        // not know), so queued work completes here on both.
        self.streams.synchronize_all();
        Ok(())
    }

    // Streams: idle unless `sleep` queued work; work completes at the next synchronisation
    // point (`StreamWork`): a synchronisation asked for, `cudaFree`, unmapping pages.

    fn record_event(&mut self, stream: u64) -> Result<StreamEvent, DeviceError> {
        self.touch_context();
        Ok(self.streams.record(stream))
    }

    fn query_event(&self, event: StreamEvent) -> Result<bool, DeviceError> {
        Ok(self.streams.is_complete(event))
    }

    fn synchronize_event(&mut self, event: StreamEvent) -> Result<(), DeviceError> {
        self.streams.synchronize_event(event);
        Ok(())
    }

    fn synchronize_stream(&mut self, stream: u64) -> Result<(), DeviceError> {
        self.streams.synchronize_stream(stream);
        Ok(())
    }

    fn synchronize_device(&mut self) -> Result<(), DeviceError> {
        self.streams.synchronize_all();
        Ok(())
    }

    fn wait_stream(&mut self, stream: u64, other: u64) -> Result<(), DeviceError> {
        self.streams.wait(stream, other);
        Ok(())
    }

    fn sleep(&mut self, stream: u64, _millis: u64) -> Result<(), DeviceError> {
        self.touch_context();
        self.streams.queue(stream);
        Ok(())
    }

    /// The model's account: the H200's driver reservation (at most a sixteenth of a smaller
    /// simulated device), the context, and the segments' pages; no other processes. The
    /// context's share NVML does not attribute to the process stays in "used" unattributed.
    fn driver_memory(&self) -> Result<DriverMemory, DeviceError> {
        // NVML's total counts the memory the driver keeps for itself, which CUDA's total
        // leaves out: on the H200, 143771 MiB = 150109880320 + 644939776 bytes.
        let reserved = H200_DRIVER_RESERVED_BYTES.min(self.total / 16);
        let total = self.total + reserved;
        let process = self.process_context_now() + self.used;
        let used = (reserved + self.context_now() + self.used).min(total);
        Ok(DriverMemory {
            method: "sim-model",
            total_bytes: total,
            used_bytes: used,
            used_v2_bytes: used - reserved.min(used),
            free_bytes: total - used,
            driver_reserved_bytes: reserved,
            process_bytes: process,
            other_processes_bytes: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::address_space::{VA_FLOOR, VA_PRETAKEN, VA_TOP, VMM_ALIGN, VMM_FLOOR};

    /// The simulated address `offset` bytes past `base` (tests probe misaligned and outside
    /// addresses, which the allocator never derives).
    fn at(base: DevicePtr, offset: u64) -> DevicePtr {
        DevicePtr::simulated(base.addr() + offset)
    }

    #[test]
    fn streams_are_idle_until_work_is_queued_and_cuda_free_synchronises() {
        let mut sim = SimDevice::new(1 << 30);
        let idle = sim.record_event(1).expect("record");
        assert_eq!(sim.query_event(idle), Ok(true));
        sim.sleep(1, 10).expect("sleep");
        let busy = sim.record_event(1).expect("record");
        assert_eq!(sim.query_event(busy), Ok(false));
        let segment = sim.malloc(2 << 20).expect("room");
        assert_eq!(
            sim.query_event(busy),
            Ok(false),
            "cudaMalloc waits for nothing"
        );
        sim.free(segment).expect("free");
        assert_eq!(sim.query_event(busy), Ok(true), "cudaFree synchronises");
        sim.sleep(2, 10).expect("sleep");
        let busy = sim.record_event(2).expect("record");
        sim.synchronize_device().expect("sync");
        assert_eq!(sim.query_event(busy), Ok(true));
        // Unmapping pages waits for the device as well (as gpumem's CUDA device does).
        let range = sim.reserve_address_range(4 << 20).expect("range");
        sim.map_pages(range, 4 << 20, 2 << 20).expect("map");
        sim.sleep(3, 10).expect("sleep");
        let busy = sim.record_event(3).expect("record");
        sim.unmap_pages(range, 2 << 20, 2 << 20).expect("unmap");
        assert_eq!(sim.query_event(busy), Ok(true), "unmapping synchronises");
    }

    #[test]
    fn refuses_what_does_not_fit_and_frees() {
        let mut device = SimDevice::new(1 << 30);
        let context = device.context_bytes();
        let (free, total) = device.mem_get_info().expect("info");
        assert_eq!((free, total), ((1 << 30) - context, 1 << 30));
        let a = device.malloc(3 * MIB).expect("fits");
        assert_eq!(device.mem_get_info().map(|i| i.0), Ok(free - 4 * MIB));
        assert_eq!(device.malloc(1 << 30), Err(DeviceError::OutOfMemory));
        assert!(device.free(a).is_ok());
        assert!(device.free(a).is_err());
        assert_eq!(device.mem_get_info().map(|i| i.0), Ok(free));
    }

    #[test]
    fn the_context_appears_at_the_first_call_that_needs_it() {
        let device = SimDevice::h200();
        let before = device.driver_memory().expect("driver view");
        assert_eq!(before.process_bytes, 0);
        assert_eq!(before.used_bytes, H200_DRIVER_RESERVED_BYTES);
        assert!(device.process_memory().is_empty());
        assert!(!device.has_context());
        let (free, total) = device.mem_get_info().expect("info");
        assert_eq!(total - free, H200_CONTEXT_BYTES);
        let after = device.driver_memory().expect("driver view");
        assert_eq!(after.process_bytes, H200_PROCESS_CONTEXT_BYTES);
        assert_eq!(after.used_bytes - before.used_bytes, H200_CONTEXT_BYTES);
    }

    #[test]
    fn an_exhausted_address_window_refuses_instead_of_wrapping() {
        let mut addresses = AddressSpace::new();
        assert_eq!(addresses.allocate(200 << 40), None);
        let mut device = SimDevice::new(MAX_TOTAL_MEMORY);
        let big = device.malloc(60 << 40).expect("60 TiB fits the window");
        assert!(big.addr() >= VA_FLOOR);
        assert_eq!(device.malloc(8 << 40), Err(DeviceError::OutOfMemory));
    }

    #[test]
    fn reservations_cost_nothing_and_mapped_pages_cost_their_size() {
        let mut device = SimDevice::new(1 << 30);
        let free = device.mem_get_info().expect("info").0;
        assert_eq!(device.allocation_granularity(), Ok(2 * MIB));
        let base = device.reserve_address_range(100 * MIB).expect("reserve");
        assert!(base.is_aligned(2 * MIB));
        assert_eq!(base.space(), MemorySpace::Simulated);
        assert_eq!(
            base.addr(),
            VMM_FLOOR,
            "the first range at the measured floor"
        );
        let other = device.reserve_address_range(40 * MIB).expect("reserve");
        assert_eq!(
            other.addr(),
            (base.addr() + 100 * MIB).div_ceil(VMM_ALIGN) * VMM_ALIGN,
            "bottom-up, on the next 32 MiB boundary"
        );
        device.free_address_range(base, 100 * MIB).expect("free");
        let reused = device.reserve_address_range(60 * MIB).expect("reserve");
        assert_eq!(reused, base, "a freed range is reused first fit");
        device.free_address_range(reused, 60 * MIB).expect("free");
        let base = device.reserve_address_range(100 * MIB).expect("reserve");
        assert_eq!(device.mem_get_info().expect("info").0, free);
        device.map_pages(base, 40 * MIB, 20 * MIB).expect("map");
        assert_eq!(device.mem_get_info().expect("info").0, free - 40 * MIB);
        assert_eq!(device.mapped_bytes(), 40 * MIB);
        // Refusals: already mapped, misaligned, outside, unmapped, partial.
        assert!(device.map_pages(base, 20 * MIB, 20 * MIB).is_err());
        assert!(device
            .map_pages(at(base, 2 * MIB), 20 * MIB, 20 * MIB)
            .is_err());
        assert!(device
            .map_pages(at(base, 80 * MIB), 40 * MIB, 20 * MIB)
            .is_err());
        assert!(device
            .map_pages(at(base, 40 * MIB), 3 * MIB, 3 * MIB)
            .is_err());
        assert!(device
            .unmap_pages(at(base, 40 * MIB), 20 * MIB, 20 * MIB)
            .is_err());
        assert!(device.unmap_pages(base, 40 * MIB, 2 * MIB).is_err());
        assert!(
            device.free_address_range(base, 100 * MIB).is_err(),
            "still mapped"
        );
        // Out of memory maps nothing.
        assert_eq!(device.map_pages(other, 40 * MIB, 2 * MIB), Ok(()));
        let huge = device.reserve_address_range(2 << 30).expect("reserve");
        assert_eq!(
            device.map_pages(huge, 2 << 30, 2 * MIB),
            Err(DeviceError::OutOfMemory)
        );
        assert_eq!(device.mapped_bytes(), 80 * MIB);
        device.unmap_pages(base, 40 * MIB, 20 * MIB).expect("unmap");
        device.unmap_pages(other, 40 * MIB, 2 * MIB).expect("unmap");
        assert_eq!(device.mem_get_info().expect("info").0, free);
        assert!(
            device.free_address_range(base, 90 * MIB).is_err(),
            "wrong size"
        );
        device.free_address_range(base, 100 * MIB).expect("free");
        assert!(
            device.free_address_range(base, 100 * MIB).is_err(),
            "freed twice"
        );
        // cudaMalloc segments avoid reservations and the other way round.
        let segment = device.malloc(64 * MIB).expect("malloc").addr();
        let other = other.addr();
        assert!(segment + 64 * MIB <= other || segment >= other + 40 * MIB);
    }

    #[test]
    fn a_reservation_too_large_for_the_window_is_a_driver_error() {
        let mut device = SimDevice::new(1 << 30);
        assert!(matches!(
            device.reserve_address_range(200 << 40),
            Err(DeviceError::InvalidArgument(_))
        ));
        assert!(device.reserve_address_range(0).is_err());
        assert!(device.reserve_address_range(MIB).is_err());
    }

    #[test]
    fn a_numbered_device_names_its_index_and_a_fresh_copy_has_no_context() {
        let mut device = SimDevice::new(1 << 30).numbered(1);
        assert_eq!((device.index(), device.label()), (1, "sim:1".to_string()));
        assert_eq!(SimDevice::new(1 << 30).label(), "sim");
        device.malloc(2 * MIB).expect("fits");
        assert!(device.has_context());
        let fresh = device.fresh();
        assert!(!fresh.has_context());
        assert_eq!(fresh.driver_memory().map(|m| m.process_bytes), Ok(0));
        assert_eq!((fresh.index(), fresh.label()), (1, "sim:1".to_string()));
        assert_eq!(fresh.total_memory(), 1 << 30);
    }

    #[test]
    fn first_segments_land_where_the_h200_put_them() {
        let mut device = SimDevice::h200();
        let mut next = |bytes| device.malloc(bytes).map(DevicePtr::addr);
        assert_eq!(next(2 * MIB), Ok(VA_TOP - 98 * MIB));
        assert_eq!(next(20 * MIB), Ok(VA_TOP - 24 * MIB));
        assert_eq!(next(100 * MIB), Ok(VA_TOP - VA_PRETAKEN - 128 * MIB));
    }

    #[test]
    fn another_devices_addresses_are_refused() {
        let mut device = SimDevice::new(1 << 30);
        let segment = device.malloc(2 * MIB).expect("fits");
        let gpu = DevicePtr::cuda(segment.addr(), 0);
        let error = device.free(gpu).expect_err("not simulated memory");
        assert!(error.to_string().contains("is memory of cuda:0"), "{error}");
        assert_eq!(device.free(segment), Ok(()));
    }
}
