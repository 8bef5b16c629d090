//! A replay device of which part is held by something else: what a recorded OOM on a full
//! device shows (another process's memory, or a GPU smaller than the simulated one). Its free
//! memory is the inner device's less the bytes held elsewhere; segments and pages beyond that
//! are refused as out of memory.

use std::cell::Cell;
use std::rc::Rc;

use crate::device::forward_device_memory;
use crate::device::{DeviceError, DeviceMemory, DevicePtr, DriverMemory};

/// The bytes held elsewhere, shared with whoever sets them once the limit is known.
pub type Held = Rc<Cell<u64>>;

/// A device with some of its bytes taken by something else.
pub struct HeldElsewhere {
    inner: Box<dyn DeviceMemory>,
    held: Held,
}

impl HeldElsewhere {
    /// `inner` with `held` of its bytes taken (0 until set).
    pub fn new(inner: Box<dyn DeviceMemory>, held: Held) -> HeldElsewhere {
        HeldElsewhere { inner, held }
    }

    fn free_bytes(&self) -> Result<u64, DeviceError> {
        Ok(self.inner.mem_get_info()?.0.saturating_sub(self.held.get()))
    }

    /// Refuses `bytes` (rounded up to the device's 2 MiB pages) beyond the free memory left.
    fn check(&self, bytes: u64) -> Result<(), DeviceError> {
        let page = crate::device::sim::DEVICE_PAGE;
        if bytes.div_ceil(page) * page > self.free_bytes()? {
            return Err(DeviceError::OutOfMemory);
        }
        Ok(())
    }
}

impl DeviceMemory for HeldElsewhere {
    fn malloc(&mut self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        self.check(bytes)?;
        self.inner.malloc(bytes)
    }

    fn mem_get_info(&self) -> Result<(u64, u64), DeviceError> {
        let (_, total) = self.inner.mem_get_info()?;
        Ok((self.free_bytes()?, total))
    }

    fn driver_memory(&self) -> Result<DriverMemory, DeviceError> {
        let held = self.held.get();
        let mut view = self.inner.driver_memory()?;
        view.free_bytes = view.free_bytes.saturating_sub(held);
        view.used_bytes = view.used_bytes.saturating_add(held);
        view.other_processes_bytes = view.other_processes_bytes.saturating_add(held);
        Ok(view)
    }

    fn map_pages(&mut self, address: DevicePtr, bytes: u64, page: u64) -> Result<(), DeviceError> {
        self.check(bytes)?;
        self.inner.map_pages(address, bytes, page)
    }

    // Everything else is the inner device's: held memory changes no free, no address range and
    // none of the streams and events (the replay device's made-up streams of deferred frees
    // among them).
    forward_device_memory!(inner: free, total_memory, index, process_memory, label,
        allocation_granularity, reserve_address_range, free_address_range, unmap_pages, streams);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::sim::SimDevice;

    #[test]
    fn the_held_bytes_are_not_free() {
        let sim = SimDevice::new(1 << 30);
        let context = sim.context_bytes();
        let held = Held::default();
        let mut device = HeldElsewhere::new(Box::new(sim), Rc::clone(&held));
        assert_eq!(
            device.mem_get_info().ok().map(|(free, _)| free),
            Some((1 << 30) - context)
        );
        held.set(512 << 20);
        let free = (1 << 30) - context - (512 << 20);
        assert_eq!(device.mem_get_info().ok(), Some((free, 1 << 30)));
        assert!(matches!(
            device.malloc(free + (2 << 20)),
            Err(DeviceError::OutOfMemory)
        ));
        let segment = device.malloc(free).expect("fits");
        assert_eq!(device.mem_get_info().ok().map(|(f, _)| f), Some(0));
        assert!(device.free(segment).is_ok());
    }
}
