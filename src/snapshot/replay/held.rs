//! A replay device of which part is held by something else: what a recorded OOM on a full
//! device shows (another process's memory, or a GPU smaller than the simulated one). Its free
//! memory is the inner device's less the bytes held elsewhere; segments and pages beyond that
//! are refused as out of memory.

use std::cell::Cell;
use std::rc::Rc;

use crate::device::{
    DeviceError, DeviceMemory, DevicePtr, DriverMemory, ProcessMemory, StreamEvent,
};

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

    fn free(&mut self, segment: DevicePtr) -> Result<(), DeviceError> {
        self.inner.free(segment)
    }

    fn mem_get_info(&self) -> Result<(u64, u64), DeviceError> {
        let (_, total) = self.inner.mem_get_info()?;
        Ok((self.free_bytes()?, total))
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
        let held = self.held.get();
        let mut view = self.inner.driver_memory()?;
        view.free_bytes = view.free_bytes.saturating_sub(held);
        view.used_bytes = view.used_bytes.saturating_add(held);
        view.other_processes_bytes = view.other_processes_bytes.saturating_add(held);
        Ok(view)
    }

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
        self.check(bytes)?;
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

    // Streams and events are the inner device's (the replay device's made-up streams of
    // deferred frees among them): held memory changes none of them.

    fn record_event(&mut self, stream: u64) -> Result<StreamEvent, DeviceError> {
        self.inner.record_event(stream)
    }

    fn query_event(&self, event: StreamEvent) -> Result<bool, DeviceError> {
        self.inner.query_event(event)
    }

    fn synchronize_event(&mut self, event: StreamEvent) -> Result<(), DeviceError> {
        self.inner.synchronize_event(event)
    }

    fn synchronize_stream(&mut self, stream: u64) -> Result<(), DeviceError> {
        self.inner.synchronize_stream(stream)
    }

    fn synchronize_device(&mut self) -> Result<(), DeviceError> {
        self.inner.synchronize_device()
    }

    fn wait_stream(&mut self, stream: u64, other: u64) -> Result<(), DeviceError> {
        self.inner.wait_stream(stream, other)
    }

    fn sleep(&mut self, stream: u64, millis: u64) -> Result<(), DeviceError> {
        self.inner.sleep(stream, millis)
    }
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
