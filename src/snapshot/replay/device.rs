//! The replay's device: the simulated GPU (capacity, context, 2 MiB pages), except that a
//! segment gpumem asks for is placed where PyTorch's driver placed the same segment, when the
//! trace just recorded one of that size.
//!
//! Addresses decide best-fit ties between equal-size cached blocks, so a replay that placed
//! segments by the simulator's model of a different process's address space would split other
//! blocks and drift away from the recording. The recorded address is used only when it does
//! not overlap a live segment; otherwise the simulator's own placement applies.

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::rc::Rc;

use crate::device::sim::SimDevice;
use crate::device::{
    DeviceError, DeviceMemory, DevicePtr, DriverMemory, MemorySpace, ProcessMemory,
};

/// Recorded `segment_alloc`s (address, size) waiting for the malloc that follows them.
#[derive(Debug, Clone, Default)]
pub struct Hints(Rc<RefCell<VecDeque<(u64, u64)>>>);

impl Hints {
    /// The trace recorded a segment of `size` bytes at `address`.
    pub fn push(&self, address: u64, size: u64) {
        self.0.borrow_mut().push_back((address, size));
    }

    /// Forgets hints no malloc used (the replay took another path).
    pub fn clear(&self) {
        self.0.borrow_mut().clear();
    }

    fn take(&self, size: u64) -> Option<u64> {
        let mut hints = self.0.borrow_mut();
        let position = hints.iter().position(|&(_, bytes)| bytes == size)?;
        hints.remove(position).map(|(address, _)| address)
    }
}

/// How many of the simulator's addresses a segment tries before the replay gives up on placing
/// it beside the live segments that took recorded addresses.
const PLACEMENT_TRIES: usize = 64;

/// A [`SimDevice`] that puts segments at recorded addresses when it can.
///
/// The recorded addresses are numbers from a file; the device hands them out as simulated
/// device addresses (the one place outside the simulator that makes one from a number, which
/// is harmless: simulated memory is never written, and every CUDA launch refuses it).
pub struct ReplayDevice {
    inner: SimDevice,
    hints: Hints,
    /// Live segments by the address handed out: (size, the simulator's own segment).
    live: BTreeMap<u64, (u64, DevicePtr)>,
}

impl ReplayDevice {
    /// A device over `inner` taking placements from `hints`.
    pub fn new(inner: SimDevice, hints: Hints) -> ReplayDevice {
        ReplayDevice {
            inner,
            hints,
            live: BTreeMap::new(),
        }
    }

    fn overlaps(&self, address: u64, size: u64) -> bool {
        let end = address.saturating_add(size);
        let before = self.live.range(..end).next_back();
        before.is_some_and(|(&start, &(bytes, _))| start.saturating_add(bytes) > address)
    }
}

impl DeviceMemory for ReplayDevice {
    fn malloc(&mut self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        let hinted = self
            .hints
            .take(bytes)
            .filter(|&recorded| !self.overlaps(recorded, bytes));
        // The simulator's own address may collide with a recorded one still live (a replay
        // under another config than the recording's diverges from it): ask the simulator for
        // another, holding the colliding ones until an address is found.
        let mut collided = Vec::new();
        let placed = loop {
            let own = match self.inner.malloc(bytes) {
                Ok(own) => own,
                Err(error) => break Err(error),
            };
            let address = hinted.unwrap_or(own.addr());
            if !self.overlaps(address, bytes) {
                break Ok((address, own));
            }
            collided.push(own);
            if collided.len() >= PLACEMENT_TRIES {
                break Err(DeviceError::InvalidArgument(format!(
                    "replay placement: {PLACEMENT_TRIES} addresses for {bytes} bytes all overlap live segments placed at recorded addresses"
                )));
            }
        };
        for own in collided {
            self.inner.free(own)?;
        }
        let (address, own) = placed?;
        self.live.insert(address, (bytes, own));
        Ok(DevicePtr::simulated(address))
    }

    fn free(&mut self, segment: DevicePtr) -> Result<(), DeviceError> {
        let address = segment.addr();
        if segment.space() != MemorySpace::Simulated {
            return Err(DeviceError::InvalidArgument(format!(
                "cudaFree of {address:#x}, which is memory of {}",
                segment.space()
            )));
        }
        let Some((_, own)) = self.live.remove(&address) else {
            return Err(DeviceError::InvalidArgument(format!(
                "cudaFree of {address:#x}, which is not a segment"
            )));
        };
        self.inner.free(own)
    }

    fn mem_get_info(&self) -> Result<(u64, u64), DeviceError> {
        self.inner.mem_get_info()
    }

    fn total_memory(&self) -> u64 {
        self.inner.total_memory()
    }

    fn index(&self) -> usize {
        self.inner.index()
    }

    fn process_memory(&self) -> Vec<ProcessMemory> {
        self.inner.process_memory()
    }

    fn label(&self) -> String {
        self.inner.label()
    }

    fn driver_memory(&self) -> Result<DriverMemory, DeviceError> {
        self.inner.driver_memory()
    }

    // Expandable segments: reserved ranges and their pages are the simulator's (only
    // `cudaMalloc` segments take recorded addresses).

    fn allocation_granularity(&self) -> Result<u64, DeviceError> {
        self.inner.allocation_granularity()
    }

    fn reserve_address_range(&mut self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        self.inner.reserve_address_range(bytes)
    }

    fn free_address_range(&mut self, base: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.inner.free_address_range(base, bytes)
    }

    fn map_pages(&mut self, address: DevicePtr, bytes: u64, page: u64) -> Result<(), DeviceError> {
        self.inner.map_pages(address, bytes, page)
    }

    fn unmap_pages(
        &mut self,
        address: DevicePtr,
        bytes: u64,
        page: u64,
    ) -> Result<(), DeviceError> {
        self.inner.unmap_pages(address, bytes, page)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_a_recorded_address_of_the_same_size_once() {
        let hints = Hints::default();
        let mut device = ReplayDevice::new(SimDevice::new(1 << 30), hints.clone());
        hints.push(0x7000_0000_0000, 2 << 20);
        let placed = device.malloc(2 << 20).expect("room");
        assert_eq!(placed.addr(), 0x7000_0000_0000);
        let other = device.malloc(2 << 20).expect("room");
        assert_ne!(other.addr(), 0x7000_0000_0000);
        hints.push(0x7000_0000_0000, 2 << 20);
        let clash = device.malloc(2 << 20).expect("room");
        assert_ne!(clash.addr(), 0x7000_0000_0000, "overlaps the live one");
        assert!(device.free(placed).is_ok());
        assert!(device.free(other).is_ok() && device.free(clash).is_ok());
        assert!(device.free(placed).is_err());
        assert_eq!(
            device.mem_get_info().map(|(_, total)| total).ok(),
            Some(1 << 30)
        );
    }

    #[test]
    fn the_simulators_address_is_not_handed_out_over_a_recorded_one() {
        let hints = Hints::default();
        let mut device = ReplayDevice::new(SimDevice::new(1 << 30), hints.clone());
        let before = device.mem_get_info().ok();
        // Where the simulator would put its next segment, taken by a recorded one.
        let next = {
            let mut probe = SimDevice::new(1 << 30);
            probe.malloc(2 << 20).expect("room").addr()
        };
        hints.push(next, 2 << 20);
        let recorded = device.malloc(2 << 20).expect("room");
        assert_eq!(recorded.addr(), next);
        let own = device.malloc(2 << 20).expect("another address");
        assert!(
            own.addr().abs_diff(next) >= 2 << 20,
            "{:#x} overlaps {next:#x}",
            own.addr()
        );
        assert!(device.free(own).is_ok() && device.free(recorded).is_ok());
        assert_eq!(
            device.mem_get_info().ok(),
            before,
            "the collided address was given back"
        );
    }
}
