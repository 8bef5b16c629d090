//! [`forward_device_memory!`]: a wrapper device passes the [`DeviceMemory`] calls it does not
//! change to the device it wraps, by name.
//!
//! Why a macro: the trait gives every optional call (the driver's view, the VMM calls, streams
//! and events) a default body that describes a device with no such thing. A wrapper that wrote
//! its forwarding by hand and missed one got that default silently — the replay's held-memory
//! wrapper once answered every `query_event` with "complete" that way. Naming the calls (or
//! the groups `vmm` and `streams`) in one line makes a missing one visible, and the lines
//! themselves are no longer written twice.
//!
//! [`DeviceMemory`]: super::DeviceMemory

/// Implements the named [`DeviceMemory`](crate::device::DeviceMemory) calls of a wrapper by
/// calling the same method on the field that holds the wrapped device:
/// `forward_device_memory!(inner: free, total_memory, index, vmm, streams);` inside the
/// `impl DeviceMemory for Wrapper` block. `vmm` stands for the five virtual-memory calls
/// (`allocation_granularity`, `reserve_address_range`, `free_address_range`, `map_pages`,
/// `unmap_pages`), `streams` for the seven stream and event calls (`record_event` through
/// `sleep`). A name that is not a trait method is a compile error.
macro_rules! forward_device_memory {
    ($field:ident: $($call:ident),+ $(,)?) => {
        $( $crate::device::forward_device_memory!(@call $field $call); )+
    };
    (@call $field:ident vmm) => {
        $crate::device::forward_device_memory!($field: allocation_granularity,
            reserve_address_range, free_address_range, map_pages, unmap_pages);
    };
    (@call $field:ident streams) => {
        $crate::device::forward_device_memory!($field: record_event, query_event,
            synchronize_event, synchronize_stream, synchronize_device, wait_stream, sleep);
    };
    (@call $field:ident malloc) => {
        fn malloc(&mut self, bytes: u64)
            -> Result<$crate::device::DevicePtr, $crate::device::DeviceError> {
            self.$field.malloc(bytes)
        }
    };
    (@call $field:ident free) => {
        fn free(&mut self, segment: $crate::device::DevicePtr)
            -> Result<(), $crate::device::DeviceError> {
            self.$field.free(segment)
        }
    };
    (@call $field:ident mem_get_info) => {
        fn mem_get_info(&self) -> Result<(u64, u64), $crate::device::DeviceError> {
            self.$field.mem_get_info()
        }
    };
    (@call $field:ident total_memory) => {
        fn total_memory(&self) -> u64 {
            self.$field.total_memory()
        }
    };
    (@call $field:ident index) => {
        fn index(&self) -> usize {
            self.$field.index()
        }
    };
    (@call $field:ident process_memory) => {
        fn process_memory(&self) -> Vec<$crate::device::ProcessMemory> {
            self.$field.process_memory()
        }
    };
    (@call $field:ident label) => {
        fn label(&self) -> String {
            self.$field.label()
        }
    };
    (@call $field:ident driver_memory) => {
        fn driver_memory(
            &self,
        ) -> Result<$crate::device::DriverMemory, $crate::device::DeviceError> {
            self.$field.driver_memory()
        }
    };
    (@call $field:ident allocation_granularity) => {
        fn allocation_granularity(&self) -> Result<u64, $crate::device::DeviceError> {
            self.$field.allocation_granularity()
        }
    };
    (@call $field:ident reserve_address_range) => {
        fn reserve_address_range(&mut self, bytes: u64)
            -> Result<$crate::device::DevicePtr, $crate::device::DeviceError> {
            self.$field.reserve_address_range(bytes)
        }
    };
    (@call $field:ident free_address_range) => {
        fn free_address_range(&mut self, base: $crate::device::DevicePtr, bytes: u64)
            -> Result<(), $crate::device::DeviceError> {
            self.$field.free_address_range(base, bytes)
        }
    };
    (@call $field:ident map_pages) => {
        fn map_pages(&mut self, address: $crate::device::DevicePtr, bytes: u64, page: u64)
            -> Result<(), $crate::device::DeviceError> {
            self.$field.map_pages(address, bytes, page)
        }
    };
    (@call $field:ident unmap_pages) => {
        fn unmap_pages(&mut self, address: $crate::device::DevicePtr, bytes: u64, page: u64)
            -> Result<(), $crate::device::DeviceError> {
            self.$field.unmap_pages(address, bytes, page)
        }
    };
    (@call $field:ident record_event) => {
        fn record_event(&mut self, stream: u64)
            -> Result<$crate::device::StreamEvent, $crate::device::DeviceError> {
            self.$field.record_event(stream)
        }
    };
    (@call $field:ident query_event) => {
        fn query_event(&self, event: $crate::device::StreamEvent)
            -> Result<bool, $crate::device::DeviceError> {
            self.$field.query_event(event)
        }
    };
    (@call $field:ident synchronize_event) => {
        fn synchronize_event(&mut self, event: $crate::device::StreamEvent)
            -> Result<(), $crate::device::DeviceError> {
            self.$field.synchronize_event(event)
        }
    };
    (@call $field:ident synchronize_stream) => {
        fn synchronize_stream(&mut self, stream: u64)
            -> Result<(), $crate::device::DeviceError> {
            self.$field.synchronize_stream(stream)
        }
    };
    (@call $field:ident synchronize_device) => {
        fn synchronize_device(&mut self) -> Result<(), $crate::device::DeviceError> {
            self.$field.synchronize_device()
        }
    };
    (@call $field:ident wait_stream) => {
        fn wait_stream(&mut self, stream: u64, other: u64)
            -> Result<(), $crate::device::DeviceError> {
            self.$field.wait_stream(stream, other)
        }
    };
    (@call $field:ident sleep) => {
        fn sleep(&mut self, stream: u64, millis: u64)
            -> Result<(), $crate::device::DeviceError> {
            self.$field.sleep(stream, millis)
        }
    };
}

pub(crate) use forward_device_memory;

#[cfg(test)]
mod tests {
    use crate::device::sim::SimDevice;
    use crate::device::{DeviceError, DeviceMemory, DevicePtr};

    /// Counts its mallocs and forwards everything else, streams included.
    struct Counting {
        inner: SimDevice,
        mallocs: usize,
    }

    impl DeviceMemory for Counting {
        fn malloc(&mut self, bytes: u64) -> Result<DevicePtr, DeviceError> {
            self.mallocs += 1;
            self.inner.malloc(bytes)
        }

        forward_device_memory!(inner: free, mem_get_info, total_memory, index, process_memory,
            label, driver_memory, vmm, streams);
    }

    #[test]
    fn a_wrapper_answers_with_the_inner_devices_streams_and_memory() {
        let mut device = Counting {
            inner: SimDevice::new(1 << 30),
            mallocs: 0,
        };
        // The trait's default would say every event is complete at once; the simulator keeps
        // a sleeping stream busy until the next synchronisation point.
        device.sleep(7, 10).expect("sim streams sleep");
        let event = device.record_event(7).expect("an event");
        assert!(!device.query_event(event).expect("query"));
        device.synchronize_stream(7).expect("synchronize");
        assert!(device.query_event(event).expect("query"));
        // Memory and the VMM calls are the simulator's too.
        let (free_before, _) = device.mem_get_info().expect("info");
        let segment = device.malloc(2 << 20).expect("a segment");
        let (free_after, _) = device.mem_get_info().expect("info");
        assert_eq!(free_before - free_after, 2 << 20);
        assert_eq!(device.allocation_granularity(), Ok(2 << 20));
        device.free(segment).expect("free");
        assert_eq!(device.mallocs, 1);
        assert_eq!(device.label(), device.inner.label());
    }
}
