//! The simulated GPU: capacity, a CUDA context's cost, `cudaMalloc`'s 2 MiB granularity, and
//! segment addresses placed the way the H200's driver places them, so best-fit ties between
//! equal-size blocks break exactly as on the real device.

use std::cell::Cell;
use std::collections::BTreeMap;

use super::{DeviceError, DeviceMemory, DriverMemory, ProcessMemory};

const MIB: u64 = 1 << 20;

/// `cudaMemGetInfo`'s total on the H200 we measure on (`totalGlobalMem`), the default capacity.
pub const H200_TOTAL_MEMORY: u64 = 150_109_880_320;
/// What a bare CUDA context costs on the H200 in the driver's view (measured: 527 MiB).
pub const H200_CONTEXT_BYTES: u64 = 527 * MIB;
/// NVML's "used" on the H200 before any process creates a context: memory the driver keeps
/// for itself (measured: 644939776 bytes).
pub const H200_DRIVER_RESERVED_BYTES: u64 = 644_939_776;
/// `cudaMalloc` hands out physical memory in 2 MiB pages, so a segment costs its size rounded
/// up to this in the free figure.
pub const DEVICE_PAGE: u64 = 2 * MIB;
/// The driver reserves virtual address space in chunks of multiples of 32 MiB.
const VA_CHUNK: u64 = 32 * MIB;
/// The top of the virtual address window segments are placed in (as seen in the recorded
/// traces; only relative placement matters).
const VA_TOP: u64 = 0x7FAA_DA00_0000;
/// The bottom of the window: addresses below it are never handed out.
const VA_FLOOR: u64 = 1 << 32;
/// The largest simulated device: its segments must fit in the modelled address window
/// (`VA_FLOOR..VA_TOP`, about 140 TB) with room for the driver's 32 MiB chunking.
pub const MAX_TOTAL_MEMORY: u64 = 64 << 40;
/// Address space below the top that is taken before the first `cudaMalloc` in a PyTorch
/// process on the H200 (context, modules), except two ranges described in `AddressSpace::new`.
const VA_PRETAKEN: u64 = 512 * MIB;

/// One range of virtual address space the driver reserved, from which segments are carved.
#[derive(Debug, Clone)]
struct Chunk {
    base: u64,
    size: u64,
    /// Addresses at or above this (up to `base + size`) were never used since the chunk's
    /// segments last shrank back.
    bump: u64,
    /// Segments in the chunk: address → size.
    segments: BTreeMap<u64, u64>,
    /// Ranges present before the process's first allocation never return to free space.
    persistent: bool,
}

impl Chunk {
    /// Where a segment of `size` fits in this chunk, if anywhere: above the bump first, else
    /// the lowest hole below it.
    fn place(&self, size: u64) -> Option<u64> {
        if self.base + self.size - self.bump >= size {
            return Some(self.bump);
        }
        let mut cursor = self.base;
        for (&address, &length) in &self.segments {
            if address >= self.bump {
                break;
            }
            if address - cursor >= size {
                return Some(cursor);
            }
            cursor = address + length;
        }
        None
    }
}

/// The driver's virtual address placement, modelled from the recorded H200 traces
/// (see docs in the repository's reference notes): chunks of `roundup(size, 32 MiB)` packed
/// top-down, the most recently created chunk tried first, bump allocation inside a chunk.
#[derive(Debug, Clone)]
struct AddressSpace {
    /// Chunks in creation order.
    chunks: Vec<Chunk>,
    /// Ranges used by others (base, size).
    taken: Vec<(u64, u64)>,
}

impl AddressSpace {
    fn new() -> Self {
        let top = VA_TOP;
        // In a PyTorch process the top 512 MiB are already in use except two ranges that
        // behave as older chunks with nothing above their bump: [top-98, top-96) MiB, tried
        // first, and [top-24, top) MiB.
        let older = Chunk {
            base: top - 24 * MIB,
            size: 24 * MIB,
            bump: top - 24 * MIB,
            segments: BTreeMap::new(),
            persistent: true,
        };
        let newer = Chunk {
            base: top - 98 * MIB,
            size: 2 * MIB,
            bump: top - 98 * MIB,
            segments: BTreeMap::new(),
            persistent: true,
        };
        let taken = vec![
            (top - VA_PRETAKEN, VA_PRETAKEN - 98 * MIB),
            (top - 96 * MIB, 72 * MIB),
        ];
        AddressSpace {
            chunks: vec![older, newer],
            taken,
        }
    }

    /// Places a segment of `size` bytes; `None` when the address window has no room left.
    fn allocate(&mut self, size: u64) -> Option<u64> {
        for chunk in self.chunks.iter_mut().rev() {
            if let Some(address) = chunk.place(size) {
                chunk.segments.insert(address, size);
                chunk.bump = chunk.bump.max(address + size);
                return Some(address);
            }
        }
        let chunk_size = size.div_ceil(VA_CHUNK) * VA_CHUNK;
        let base = self.highest_gap(chunk_size)? - chunk_size;
        let mut segments = BTreeMap::new();
        segments.insert(base, size);
        self.chunks.push(Chunk {
            base,
            size: chunk_size,
            bump: base + size,
            segments,
            persistent: false,
        });
        Some(base)
    }

    /// The top of the highest free gap strictly larger than `size`, if any.
    fn highest_gap(&self, size: u64) -> Option<u64> {
        let mut used: Vec<(u64, u64)> = self
            .taken
            .iter()
            .copied()
            .chain(self.chunks.iter().map(|chunk| (chunk.base, chunk.size)))
            .collect();
        used.sort_unstable_by_key(|range| std::cmp::Reverse(range.0));
        let mut gap_top = VA_TOP;
        for (base, length) in used {
            let end = base + length;
            if gap_top > end && gap_top - end > size {
                return Some(gap_top);
            }
            gap_top = gap_top.min(base);
        }
        (gap_top.saturating_sub(VA_FLOOR) > size).then_some(gap_top)
    }

    /// Frees the segment at `address`; `false` if there is none.
    fn free(&mut self, address: u64) -> bool {
        let Some(position) = self
            .chunks
            .iter()
            .position(|chunk| chunk.segments.contains_key(&address))
        else {
            return false;
        };
        let chunk = &mut self.chunks[position];
        let size = chunk.segments.remove(&address).unwrap_or(0);
        if address + size == chunk.bump {
            chunk.bump = chunk
                .segments
                .iter()
                .next_back()
                .map_or(chunk.base, |(&start, &length)| start + length);
        }
        if chunk.segments.is_empty() && !chunk.persistent {
            self.chunks.remove(position);
        }
        true
    }
}

/// A simulated GPU of a given capacity.
///
/// Its CUDA context comes into being at the first call that needs one (`cudaMalloc`,
/// `cudaMemGetInfo`), as a real GPU's does: until then the driver's view shows this process
/// using nothing, which is what a script reading `device_memory()` first sees.
#[derive(Debug, Clone)]
pub struct SimDevice {
    total: u64,
    context_bytes: u64,
    /// Whether a call that needs the context has been made.
    context_created: Cell<bool>,
    /// Bytes of device pages held by segments.
    used: u64,
    segments: BTreeMap<u64, u64>,
    addresses: AddressSpace,
}

impl SimDevice {
    /// A simulated device of `total` bytes. Its context costs what the H200's does, but never
    /// more than an eighth of the device, so small simulated devices stay usable.
    pub fn new(total: u64) -> SimDevice {
        SimDevice {
            total,
            context_bytes: H200_CONTEXT_BYTES.min(total / 8),
            context_created: Cell::new(false),
            used: 0,
            segments: BTreeMap::new(),
            addresses: AddressSpace::new(),
        }
    }

    /// The H200 we measure on.
    pub fn h200() -> SimDevice {
        SimDevice::new(H200_TOTAL_MEMORY)
    }

    /// What the simulated CUDA context costs in the driver's view.
    pub fn context_bytes(&self) -> u64 {
        self.context_bytes
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

    fn free_bytes(&self) -> u64 {
        self.total
            .saturating_sub(self.context_now())
            .saturating_sub(self.used)
    }
}

impl DeviceMemory for SimDevice {
    fn malloc(&mut self, bytes: u64) -> Result<u64, DeviceError> {
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
        Ok(address)
    }

    fn free(&mut self, address: u64) -> Result<(), DeviceError> {
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
        0
    }

    /// This process, once it has a context (NVML lists only processes with one).
    fn process_memory(&self) -> Vec<ProcessMemory> {
        if !self.has_context() {
            return Vec::new();
        }
        vec![ProcessMemory {
            pid: std::process::id(),
            is_current: true,
            used_bytes: self.context_now() + self.used,
        }]
    }

    fn label(&self) -> String {
        "sim".into()
    }

    /// The model's account: the H200's driver reservation (at most a sixteenth of a smaller
    /// simulated device), the context, and the segments' pages; no other processes.
    fn driver_memory(&self) -> Result<DriverMemory, DeviceError> {
        // NVML's total counts the memory the driver keeps for itself, which CUDA's total
        // leaves out: on the H200, 143771 MiB = 150109880320 + 644939776 bytes.
        let reserved = H200_DRIVER_RESERVED_BYTES.min(self.total / 16);
        let total = self.total + reserved;
        let process = self.context_now() + self.used;
        let used = (reserved + process).min(total);
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
        assert_eq!(after.process_bytes, H200_CONTEXT_BYTES);
        assert_eq!(after.used_bytes - before.used_bytes, H200_CONTEXT_BYTES);
    }

    #[test]
    fn an_exhausted_address_window_refuses_instead_of_wrapping() {
        let mut addresses = AddressSpace::new();
        assert_eq!(addresses.allocate(200 << 40), None);
        let mut device = SimDevice::new(MAX_TOTAL_MEMORY);
        let big = device.malloc(60 << 40).expect("60 TiB fits the window");
        assert!(big >= VA_FLOOR);
        assert_eq!(device.malloc(8 << 40), Err(DeviceError::OutOfMemory));
    }

    #[test]
    fn first_segments_land_where_the_h200_put_them() {
        let mut device = SimDevice::h200();
        assert_eq!(device.malloc(2 * MIB), Ok(VA_TOP - 98 * MIB));
        assert_eq!(device.malloc(20 * MIB), Ok(VA_TOP - 24 * MIB));
        let big = device.malloc(100 * MIB).expect("fits");
        assert_eq!(big, VA_TOP - VA_PRETAKEN - 128 * MIB);
    }
}
