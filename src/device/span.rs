//! Borrowed device memory: the only thing kernel launches and device copies accept.
//!
//! A [`DeviceSpan`] is a run of bytes of one device's memory together with a borrow of
//! whatever keeps that memory allocated (a tensor's storage, a loaded module). Launches and
//! copies take their length from the span, never from a separate count, and refuse spans of
//! another device's memory, so a kernel writes only inside memory that is live for the whole
//! call. Spans are made inside the crate only, by the owner of the memory.

use std::fmt;
use std::marker::PhantomData;

use super::{DeviceError, DevicePtr, MemorySpace};

/// `bytes` bytes of device memory starting at `start`, borrowed from their owner for `'a`.
///
/// There is no public constructor: the tensor layer makes spans of its storages, the kernels
/// of their module's globals. A part of a span ([`DeviceSpan::part`]) borrows from the same
/// owner.
///
/// ```compile_fail
/// use gpumem::device::{DevicePtr, DeviceSpan};
/// // Crate-private: a gigabyte at address 0 is not memory anyone handed out.
/// let forged = unsafe { DeviceSpan::new(DevicePtr::NULL, 1 << 30) };
/// ```
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct DeviceSpan<'a> {
    start: DevicePtr,
    bytes: u64,
    _owner: PhantomData<&'a ()>,
}

impl<'a> DeviceSpan<'a> {
    /// The span of `[start, start + bytes)`.
    ///
    /// # Safety
    /// Those bytes must lie inside memory that `start`'s device handed out (a segment or mapped
    /// pages, through the allocator or the driver) and that is not given back to the device
    /// while `'a` lasts: the caller ties `'a` to a borrow of the memory's owner. Work queued on
    /// the memory runs on the one stream gpumem uses, so a block the allocator hands out again
    /// later is written in order; freeing a segment waits for the device.
    pub(crate) unsafe fn new(start: DevicePtr, bytes: u64) -> DeviceSpan<'a> {
        DeviceSpan {
            start,
            bytes,
            _owner: PhantomData,
        }
    }

    /// The first byte's address.
    pub fn start(&self) -> DevicePtr {
        self.start
    }

    /// Length in bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whose memory it is.
    pub fn space(&self) -> MemorySpace {
        self.start.space()
    }

    /// The `bytes` bytes at `offset` of this span (a view of part of a tensor), borrowed from
    /// the same owner; an error when they do not lie inside it.
    pub fn part(&self, offset: u64, bytes: u64) -> Result<DeviceSpan<'a>, DeviceError> {
        let start = self
            .start
            .offset_within(self.bytes, offset, bytes)
            .ok_or_else(|| {
                DeviceError::InvalidArgument(format!(
                    "{bytes} bytes at offset {offset} do not lie inside a span of {} bytes",
                    self.bytes
                ))
            })?;
        Ok(DeviceSpan {
            start,
            bytes,
            _owner: PhantomData,
        })
    }

    /// The address as a kernel parameter or copy argument, after checking that the span is
    /// memory of `space`, the device that will touch it (`what` names the launch or copy in
    /// the error).
    pub(crate) fn address_in(&self, space: MemorySpace, what: &str) -> Result<u64, DeviceError> {
        if self.space() == space {
            return Ok(self.start.addr());
        }
        Err(DeviceError::InvalidArgument(format!(
            "{what}: {} bytes at {:#x} are memory of {}, not of {space}",
            self.bytes,
            self.start,
            self.space()
        )))
    }
}

impl fmt::Debug for DeviceSpan<'_> {
    /// `DeviceSpan(4096 bytes at 0x7faada000000 on cuda:0)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DeviceSpan({} bytes at {:#x} on {})",
            self.bytes,
            self.start,
            self.space()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A span of simulated memory: nothing is behind it, and nothing here writes to it.
    fn simulated(addr: u64, bytes: u64) -> DeviceSpan<'static> {
        // SAFETY: simulated memory is never read or written; these spans only test arithmetic
        // and checks.
        unsafe { DeviceSpan::new(DevicePtr::simulated(addr), bytes) }
    }

    #[test]
    fn parts_stay_inside_their_span() {
        let span = simulated(0x1000, 64);
        let part = span.part(16, 32).expect("inside");
        assert_eq!((part.start().addr(), part.bytes()), (0x1010, 32));
        assert_eq!(part.space(), MemorySpace::Simulated);
        assert!(span.part(48, 16).is_ok());
        assert!(span.part(64, 0).is_ok_and(|empty| empty.bytes() == 0));
        let error = span.part(48, 17).expect_err("past the end");
        assert_eq!(
            error.to_string(),
            "17 bytes at offset 48 do not lie inside a span of 64 bytes"
        );
        assert!(span.part(u64::MAX, 2).is_err());
    }

    #[test]
    fn a_launch_refuses_another_devices_memory() {
        let span = simulated(0x2000, 8);
        assert_eq!(span.address_in(MemorySpace::Simulated, "fill"), Ok(0x2000));
        let error = span
            .address_in(MemorySpace::Cuda(0), "kernel fill_u32")
            .expect_err("simulated memory on a GPU");
        assert_eq!(
            error.to_string(),
            "kernel fill_u32: 8 bytes at 0x2000 are memory of the simulated device, not of cuda:0"
        );
        assert_eq!(
            format!("{span:?}"),
            "DeviceSpan(8 bytes at 0x2000 on the simulated device)"
        );
    }
}
