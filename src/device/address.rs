//! Device addresses. A [`DevicePtr`] can only be made by a device: the CUDA driver's wrappers
//! (`cuMemAlloc`, `cuMemAddressReserve`, a module's globals) or the simulated device. Everything
//! above the device layer receives addresses and derives others from them by checked offsets
//! inside the range they came with (the allocator's blocks inside its segments, a tensor view
//! inside its storage); nothing outside `gpumem` can turn an integer into one.
//!
//! Each address also says whose memory it is ([`MemorySpace`]): a kernel launched on `cuda:0`
//! refuses an address of the simulated device or of another GPU instead of writing there.

use std::fmt;

use super::DeviceError;

/// Whose memory a device address points into.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MemorySpace {
    /// No device's: the null address of a zero-byte allocation ([`DevicePtr::NULL`]).
    Null,
    /// A simulated device's. Nothing is behind it and nothing is ever written there.
    Simulated,
    /// The CUDA device with this ordinal, in this process's primary context.
    Cuda(u32),
}

impl MemorySpace {
    /// CUDA device `ordinal`'s memory. (Ordinals are small; one beyond `u32` saturates, which
    /// no device has, so such an address matches no device's kernels.)
    pub(crate) fn cuda(ordinal: usize) -> MemorySpace {
        MemorySpace::Cuda(u32::try_from(ordinal).unwrap_or(u32::MAX))
    }
}

impl fmt::Display for MemorySpace {
    /// `no device`, `the simulated device`, `cuda:0`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemorySpace::Null => f.write_str("no device"),
            MemorySpace::Simulated => f.write_str("the simulated device"),
            MemorySpace::Cuda(ordinal) => write!(f, "cuda:{ordinal}"),
        }
    }
}

/// An address in a device's memory, as a device handed it out.
///
/// Reading the number is always possible ([`DevicePtr::addr`]: for printing, snapshots,
/// `data_ptr`); making one from a number is not, outside the device layer. The allocator gets
/// each segment's address from its device and derives its blocks' addresses from it by checked
/// offsets; tensors carry the address of their block. So an address that reaches a kernel
/// launch came from a device and lies inside memory that device handed out.
///
/// Outside `gpumem` there is no constructor: neither the tuple form nor a function taking a
/// number exists.
///
/// ```compile_fail
/// let forged = gpumem::device::DevicePtr(0x7000_0000_0000);
/// ```
///
/// ```compile_fail
/// // Crate-private: only the simulated device and the replay's placement of recorded
/// // segments use it.
/// let forged = gpumem::device::DevicePtr::simulated(0x7000_0000_0000);
/// ```
///
/// ```compile_fail
/// // Crate-private: only the CUDA driver's wrappers use it.
/// let forged = gpumem::device::DevicePtr::cuda(0x7000_0000_0000, 0);
/// ```
///
/// ```compile_fail
/// // No arithmetic either: an offset would reach any address from a real one.
/// let null = gpumem::device::DevicePtr::NULL;
/// let forged = null.offset_within(u64::MAX, 0x7000_0000_0000, 1);
/// ```
///
/// Addresses come from a device or the allocator, and read as numbers:
///
/// ```
/// use gpumem::alloc::{AllocConf, CachingAllocator};
/// use gpumem::device::sim::SimDevice;
/// use gpumem::device::{DevicePtr, MemorySpace};
///
/// let mut allocator = CachingAllocator::new(Box::new(SimDevice::h200()), AllocConf::default())?;
/// let block = allocator.malloc(1000)?;
/// let address: DevicePtr = block.ptr;
/// assert_eq!(address.space(), MemorySpace::Simulated);
/// assert!(address.addr() > 0 && address.is_aligned(512));
/// allocator.free(block)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DevicePtr {
    addr: u64,
    space: MemorySpace,
}

impl DevicePtr {
    /// The null address: what a zero-byte allocation gets (PyTorch returns a null pointer for
    /// it). It belongs to no device, so no kernel accepts it for more than zero bytes.
    pub const NULL: DevicePtr = DevicePtr {
        addr: 0,
        space: MemorySpace::Null,
    };

    /// An address the CUDA driver returned for device `ordinal` (`cuMemAlloc`,
    /// `cuMemAddressReserve`, `cuModuleGetGlobal`). Only the driver's wrappers in
    /// `device::cuda` call this; the rest of the device layer derives addresses from theirs.
    pub(super) fn cuda(addr: u64, ordinal: usize) -> DevicePtr {
        DevicePtr {
            addr,
            space: MemorySpace::cuda(ordinal),
        }
    }

    /// An address of the simulated device. The simulated device mints its segments' addresses
    /// with it, the replay's device places a segment where a recording had it, and the OOM
    /// diagnosis's trial device (`alloc::trial`) numbers its segments (simulated memory is
    /// never written, so any address is as good as another there). Crate-private
    /// all the same: outside `gpumem` no integer becomes a device address, and every CUDA
    /// launch refuses simulated addresses.
    pub(crate) fn simulated(addr: u64) -> DevicePtr {
        DevicePtr {
            addr,
            space: MemorySpace::Simulated,
        }
    }

    /// The address as a number (for printing, snapshots, `data_ptr`, bookkeeping).
    pub fn addr(self) -> u64 {
        self.addr
    }

    /// Whose memory it is.
    pub fn space(self) -> MemorySpace {
        self.space
    }

    /// Whether the address is a multiple of `align` (false for `align` 0).
    pub fn is_aligned(self, align: u64) -> bool {
        align != 0 && self.addr.is_multiple_of(align)
    }

    /// The address `offset` bytes past this one, provided `[offset, offset + len)` lies inside
    /// the `extent` bytes that start here (a block inside its segment, a page inside its
    /// reserved range, a view inside its storage); `None` otherwise, or on overflow. The only
    /// way to derive one device address from another.
    pub(crate) fn offset_within(self, extent: u64, offset: u64, len: u64) -> Option<DevicePtr> {
        let end = offset.checked_add(len)?;
        if end > extent {
            return None;
        }
        // The whole extent must be addressable, not just the part asked for.
        self.addr.checked_add(extent)?;
        Some(DevicePtr {
            addr: self.addr + offset,
            space: self.space,
        })
    }

    /// The address as a number, after checking that it is memory of `space`: a device refuses
    /// another device's addresses (`call` names the operation in the error).
    pub(crate) fn addr_in(self, space: MemorySpace, call: &str) -> Result<u64, DeviceError> {
        if self.space == space {
            Ok(self.addr)
        } else {
            Err(DeviceError::InvalidArgument(format!(
                "{call}: {:#x} is memory of {}, not of {space}",
                self.addr, self.space
            )))
        }
    }
}

impl fmt::Debug for DevicePtr {
    /// `DevicePtr(0x7faada000000 on cuda:0)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DevicePtr({:#x} on {})", self.addr, self.space)
    }
}

impl fmt::LowerHex for DevicePtr {
    /// The address in hexadecimal, with the formatter's flags (`{:#x}` gives `0x7faada000000`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::LowerHex::fmt(&self.addr, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_stay_inside_their_extent() {
        let base = DevicePtr::simulated(0x1000);
        let inside = base.offset_within(0x100, 0x80, 0x80);
        assert_eq!(inside.map(DevicePtr::addr), Some(0x1080));
        assert_eq!(inside.map(DevicePtr::space), Some(MemorySpace::Simulated));
        assert_eq!(
            base.offset_within(0x100, 0x100, 0).map(DevicePtr::addr),
            Some(0x1100)
        );
        assert_eq!(base.offset_within(0x100, 0x80, 0x81), None, "past the end");
        assert_eq!(
            base.offset_within(0x100, u64::MAX, 2),
            None,
            "overflowing offset"
        );
        let high = DevicePtr::simulated(u64::MAX - 4);
        assert_eq!(
            high.offset_within(16, 0, 1),
            None,
            "extent past the address space"
        );
    }

    #[test]
    fn a_device_refuses_another_devices_addresses() {
        let sim = DevicePtr::simulated(0x2000);
        assert_eq!(sim.addr_in(MemorySpace::Simulated, "cudaFree"), Ok(0x2000));
        let error = sim
            .addr_in(MemorySpace::Cuda(0), "cuMemFree")
            .expect_err("another device's memory");
        assert_eq!(
            error.to_string(),
            "cuMemFree: 0x2000 is memory of the simulated device, not of cuda:0"
        );
        let gpu = DevicePtr::cuda(0x3000, 1);
        assert_eq!(gpu.space(), MemorySpace::Cuda(1));
        assert!(gpu.addr_in(MemorySpace::Cuda(0), "launch").is_err());
        assert!(DevicePtr::NULL
            .addr_in(MemorySpace::Simulated, "free")
            .is_err());
    }

    #[test]
    fn addresses_print_as_numbers() {
        let ptr = DevicePtr::cuda(0x7faa_da00_0000, 0);
        assert_eq!(format!("{ptr:#x}"), "0x7faada000000");
        assert_eq!(format!("{ptr:x}"), "7faada000000");
        assert_eq!(format!("{ptr:?}"), "DevicePtr(0x7faada000000 on cuda:0)");
        assert_eq!(
            format!("{:?}", DevicePtr::NULL),
            "DevicePtr(0x0 on no device)"
        );
        assert!(ptr.is_aligned(1 << 20) && !ptr.is_aligned(0));
        assert_eq!(MemorySpace::cuda(usize::MAX), MemorySpace::Cuda(u32::MAX));
    }
}
