//! Placement for a what-if replay: the driver's model run in the recording's own addresses.
//!
//! Under another config the replay makes segments the recording never made, and where the
//! driver would put them decides best-fit ties. The driver's model
//! (`device::address_space`) predicts that from the address space's state, but a real
//! process's address space also holds memory no allocator event shows: the range a library
//! holds below the window's top until the job's first cuBLAS or cuDNN call, a library's own
//! `cudaMalloc`s, the context. So the replay runs two copies of the model, both at the
//! recording's window (its top from the recording's first segment, which a fresh process puts
//! at a fixed depth below it):
//!
//! - one follows the recording: every recorded `segment_alloc` is put at its address
//!   (`AddressSpace::adopt`), and what the driver must have seen to choose that address —
//!   memory of others held, or let go — is learnt at that event;
//! - the other holds the replay's own segments (at recorded addresses while the replay makes
//!   the recording's calls, placed by the model otherwise) and takes on what the first learnt,
//!   at the same point of the trace.
//!
//! Used only when the replay's config is not the recorded one and the trace starts with the
//! process (no start state to seed); a self-replay follows the recording's addresses.

use crate::device::address_space::AddressSpace;

/// The two copies of the driver's model (see the module's documentation).
#[derive(Debug, Clone)]
pub(super) struct DriverMirror {
    /// Follows the recording's segments and learns others' memory from them.
    recording: AddressSpace,
    /// Holds the replay's segments.
    replay: AddressSpace,
}

impl DriverMirror {
    /// The mirror of a process whose first `cudaMalloc` segment, `size` bytes, the trace
    /// recorded at `address`; `None` when no window of the model puts a first segment there.
    pub(super) fn from_first_segment(address: u64, size: u64) -> Option<DriverMirror> {
        let top = address.checked_add(AddressSpace::first_segment_depth(size)?)?;
        let space = AddressSpace::below(top)?;
        Some(DriverMirror {
            recording: space.clone(),
            replay: space,
        })
    }

    /// The trace recorded a `segment_alloc` of `size` bytes at `address`; `false` when the
    /// segment lies above the window's top, where no process of the model puts one (the
    /// window was guessed wrong, or the file is not a fresh process's): the mirror cannot
    /// follow it.
    pub(super) fn recorded_malloc(&mut self, address: u64, size: u64) -> bool {
        if address.saturating_add(size) > self.recording.top() {
            return false;
        }
        for change in self.recording.adopt(address, size) {
            self.replay.apply(change);
        }
        true
    }

    /// The trace recorded the `segment_free` of the segment at `address`.
    pub(super) fn recorded_free(&mut self, address: u64) {
        self.recording.free(address);
    }

    /// Where the driver would put the replay's next segment of `size` bytes (taken).
    pub(super) fn place(&mut self, size: u64) -> Option<u64> {
        self.replay.allocate(size)
    }

    /// Where the driver would put the replay's next segment of `size` bytes, asked without
    /// taking it.
    pub(super) fn would_place(&self, size: u64) -> Option<u64> {
        self.replay.clone().allocate(size)
    }

    /// The replay put a segment of `size` bytes at `address` by another rule.
    pub(super) fn placed(&mut self, address: u64, size: u64) {
        self.replay.insert(address, size);
    }

    /// The replay freed its segment at `address`.
    pub(super) fn freed(&mut self, address: u64) {
        self.replay.free(address);
    }
}
