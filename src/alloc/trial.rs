//! Trying a request under `expandable_segments:True` instead of guessing whether it would fit.
//!
//! At an out-of-memory error the diagnosis asks: had this process used expandable segments,
//! would the request have been served? The answer is computed, not estimated: a side allocator
//! with the session's config plus `expandable_segments:True`, on a [`TrialDevice`] with the same
//! total memory, the memory this process could hold (the device's free bytes plus everything
//! the allocator reserves) and the same memory-fraction cap, allocates again every live block
//! (its requested size, on its stream, in address order) and then the request. The session's
//! allocator and device are never touched.

use std::collections::BTreeMap;

use super::{AllocConf, AllocError, CachingAllocator, StreamId};
use crate::device::{DeviceError, DeviceMemory, DevicePtr, ProcessMemory};

/// The physical allocation granularity the trial device reports: 2 MiB, as every current
/// NVIDIA GPU's `cuMemGetAllocationGranularity` (PyTorch's page sizes, 2 MiB and 20 MiB, are
/// multiples of it).
const TRIAL_GRANULARITY: u64 = 2 << 20;

/// Where the trial device's addresses start: any non-zero, granularity-aligned value (only
/// relative positions matter to the allocator).
const TRIAL_BASE: u64 = 1 << 40;

/// A device that models only how much memory there is: `cudaMalloc` and mapped pages cost
/// their size, reserved address ranges cost nothing. Enough to decide whether requests fit,
/// with no addresses of any real device.
#[derive(Debug)]
pub struct TrialDevice {
    total: u64,
    free: u64,
    next_address: u64,
    /// `cudaMalloc` segments: address → bytes.
    segments: BTreeMap<u64, u64>,
}

impl TrialDevice {
    /// A device of `total` bytes of which `available` are free.
    pub fn new(total: u64, available: u64) -> TrialDevice {
        TrialDevice {
            total,
            free: available.min(total),
            next_address: TRIAL_BASE,
            segments: BTreeMap::new(),
        }
    }

    /// Hands out `bytes` of fresh address space, aligned to the granularity: simulated
    /// addresses, which no kernel accepts (nothing is behind them).
    fn take_addresses(&mut self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        let address = self.next_address;
        let span = bytes
            .div_ceil(TRIAL_GRANULARITY)
            .checked_mul(TRIAL_GRANULARITY)
            .and_then(|span| address.checked_add(span))
            .ok_or_else(|| {
                DeviceError::InvalidArgument(format!("{bytes} bytes of address space"))
            })?;
        self.next_address = span;
        Ok(DevicePtr::simulated(address))
    }
}

impl DeviceMemory for TrialDevice {
    fn malloc(&mut self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        if bytes > self.free {
            return Err(DeviceError::OutOfMemory);
        }
        let address = self.take_addresses(bytes)?;
        self.free -= bytes;
        self.segments.insert(address.addr(), bytes);
        Ok(address)
    }

    fn free(&mut self, address: DevicePtr) -> Result<(), DeviceError> {
        let bytes = self.segments.remove(&address.addr()).ok_or_else(|| {
            DeviceError::InvalidArgument(format!("{address:#x} is not a segment"))
        })?;
        self.free += bytes;
        Ok(())
    }

    fn mem_get_info(&self) -> Result<(u64, u64), DeviceError> {
        Ok((self.free, self.total))
    }

    fn total_memory(&self) -> u64 {
        self.total
    }

    fn index(&self) -> usize {
        0
    }

    fn process_memory(&self) -> Vec<ProcessMemory> {
        Vec::new()
    }

    fn label(&self) -> String {
        "trial".into()
    }

    fn allocation_granularity(&self) -> Result<u64, DeviceError> {
        Ok(TRIAL_GRANULARITY)
    }

    fn reserve_address_range(&mut self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        self.take_addresses(bytes)
    }

    fn free_address_range(&mut self, _base: DevicePtr, _bytes: u64) -> Result<(), DeviceError> {
        Ok(())
    }

    fn map_pages(
        &mut self,
        _address: DevicePtr,
        bytes: u64,
        _page: u64,
    ) -> Result<(), DeviceError> {
        if bytes > self.free {
            return Err(DeviceError::OutOfMemory);
        }
        self.free -= bytes;
        Ok(())
    }

    fn unmap_pages(
        &mut self,
        _address: DevicePtr,
        bytes: u64,
        _page: u64,
    ) -> Result<(), DeviceError> {
        self.free += bytes;
        Ok(())
    }
}

/// What trying the request under expandable segments showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpandableTrial {
    /// Live blocks allocated again before the request.
    pub live_blocks: u64,
    /// Their requested bytes.
    pub live_bytes: u64,
    /// Whether every live block and then the request were served.
    pub fits: bool,
}

impl CachingAllocator {
    /// Tries `requested` bytes on `stream` under `expandable_segments:True`: a side allocator
    /// on a [`TrialDevice`] (this device's total, its free bytes plus this allocator's reserved
    /// bytes available, this allocator's cap) allocates every live block again, in address
    /// order, then the request. `None` when expandable segments are already on (there is
    /// nothing to try) or the side allocator could not start.
    pub(super) fn try_with_expandable(
        &self,
        stream: StreamId,
        requested: u64,
        device_free: u64,
        device_total: u64,
    ) -> Option<ExpandableTrial> {
        if self.config.expandable_segments {
            return None;
        }
        let mut live: Vec<(u64, StreamId, u64)> = self
            .blocks()
            .filter(|block| block.allocated)
            .map(|block| (block.ptr, block.stream, block.requested_size))
            .collect();
        live.sort_unstable();
        let reserved = self.total_allocated_memory;
        let device = TrialDevice::new(device_total, device_free.saturating_add(reserved));
        let config = AllocConf {
            expandable_segments: true,
            // The cap is copied in bytes below, not recomputed from a fraction.
            per_process_memory_fraction: None,
            ..self.config.clone()
        };
        let mut side = CachingAllocator::new(Box::new(device), config).ok()?;
        side.allowed_memory_maximum = self.allowed_memory_maximum;
        let mut trial = ExpandableTrial {
            live_blocks: live.len() as u64,
            live_bytes: live.iter().map(|&(_, _, bytes)| bytes).sum(),
            fits: false,
        };
        for (_, block_stream, bytes) in live {
            match side.malloc_on(block_stream, bytes) {
                Ok(_) => {}
                Err(AllocError::OutOfMemory(_)) => return Some(trial),
                Err(_) => return None,
            }
        }
        trial.fits = match side.malloc_on(stream, requested) {
            Ok(_) => true,
            Err(AllocError::OutOfMemory(_)) => false,
            Err(_) => return None,
        };
        Some(trial)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trial_device_charges_segments_and_pages_but_not_ranges() {
        let mib = 1 << 20;
        let mut device = TrialDevice::new(100 * mib, 60 * mib);
        assert_eq!(device.mem_get_info(), Ok((60 * mib, 100 * mib)));
        let segment = device.malloc(20 * mib).expect("fits");
        let range = device.reserve_address_range(1 << 30).expect("free of cost");
        assert_eq!(device.mem_get_info(), Ok((40 * mib, 100 * mib)));
        device.map_pages(range, 40 * mib, 20 * mib).expect("fits");
        let beyond = range
            .offset_within(1 << 30, 40 * mib, 20 * mib)
            .expect("inside the range");
        assert_eq!(
            device.map_pages(beyond, 20 * mib, 20 * mib),
            Err(DeviceError::OutOfMemory)
        );
        assert_eq!(device.malloc(2 * mib), Err(DeviceError::OutOfMemory));
        device.free(segment).expect("a segment");
        assert!(device.free(segment).is_err(), "freed twice");
        device
            .unmap_pages(range, 40 * mib, 20 * mib)
            .expect("mapped");
        assert_eq!(device.mem_get_info(), Ok((60 * mib, 100 * mib)));
        assert_ne!(segment, range, "ranges and segments never overlap");
    }
}
