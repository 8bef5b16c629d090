//! The recording's `cudaMalloc`/`cudaFree` calls in order, followed by a replay for as long as
//! it makes the same calls.
//!
//! The driver sees only its own calls: the sizes asked for and the segments given back, in
//! order, never the allocations between them. A replay whose device calls so far equal the
//! recording's is therefore, to the driver, the same process, and its next segment lands where
//! the recording's did, even if a what-if config moved that call to another allocation (a
//! segment made one allocation earlier under `roundup_power2_divisions`, say). The first call
//! that differs (another size, another segment freed, a call the recording never made) puts the
//! driver's address space somewhere the file does not show, and the sequence is not followed
//! again: placement falls back to the recorded segment made at the same allocation, then to the
//! simulator's model ([`super::device`]).
//!
//! The first pass learns the calls as it reads them, so it can follow a replay that makes each
//! call no earlier than the recording did; a replay that runs ahead of what was read marks the
//! sequence [`CallSequence::ran_ahead`], and a second pass follows it with the whole list the
//! scan kept ([`super::scan::Scan::device_calls`]).

use std::collections::VecDeque;

use crate::device::address_space::AddressSpace;

/// One device call of the recording, as its trace shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceCall {
    /// A `segment_alloc`: `cudaMalloc` of `size` bytes returned `address`.
    Malloc {
        /// The address the driver returned.
        address: u64,
        /// The bytes asked for.
        size: u64,
    },
    /// A `segment_free`: `cudaFree` of the segment at `address`.
    Free {
        /// The segment's address.
        address: u64,
    },
}

/// How far ahead in the recording a replay's call may be matched: the next recorded call, or
/// the one after it when the next is a `cudaMalloc` of another size (and the later one's
/// recorded address is not in its chunk: `CallSequence::may_not_pass`). Two calls that change places (a what-if config making the 20 MiB segment
/// just before the 2 MiB one the recording made first) go to different parts of the driver's
/// address space, so each still lands where the recording's did; measured on the what-if
/// harness (tests/gpu/whatif), a window of 2 places `moe`'s `roundup_power2_divisions:4`
/// segments as PyTorch's own run did, and wider windows placed nothing more.
const WINDOW: usize = 2;

/// The most calls a first pass keeps waiting for a replay that lags behind the recording (a
/// what-if config that makes fewer segments, say): past it the sequence is given up rather than
/// holding memory in proportion to the trace.
pub const MAX_WAITING_CALLS: usize = 1 << 16;

/// Where a replay stands against the recording's device calls.
#[derive(Debug, Clone)]
pub struct CallSequence {
    /// The recording's calls the replay has not made yet, oldest first.
    waiting: VecDeque<DeviceCall>,
    /// Whether `waiting` holds every call to the end of the trace (a second pass's list),
    /// rather than those read so far.
    complete: bool,
    /// Whether every call of the replay so far equalled the recording's, in order.
    in_step: bool,
    /// Whether the replay asked for a call before the pass had read it.
    ran_ahead: bool,
    /// Whether the replay's calls are compared yet (not while a start state is seeded).
    following: bool,
    /// Whether the last `cudaMalloc` matched was matched past an earlier waiting call.
    passed_over: bool,
}

impl Default for CallSequence {
    fn default() -> CallSequence {
        CallSequence {
            waiting: VecDeque::new(),
            complete: false,
            in_step: true,
            ran_ahead: false,
            following: true,
            passed_over: false,
        }
    }
}

impl CallSequence {
    /// A sequence that knows every call of the trace (`calls`, in order): a second pass's.
    /// Follows nothing until [`CallSequence::follow`] (the start state is seeded first).
    pub fn known(calls: &[DeviceCall]) -> CallSequence {
        CallSequence {
            waiting: calls.iter().copied().collect(),
            complete: true,
            following: false,
            ..CallSequence::default()
        }
    }

    /// From now on the replay's calls are compared with the recording's.
    pub fn follow(&mut self) {
        self.following = true;
    }

    /// The trace recorded `call` (a first pass learns them as it reads).
    pub fn recorded(&mut self, call: DeviceCall) {
        if self.complete || !self.in_step {
            return;
        }
        if self.waiting.len() >= MAX_WAITING_CALLS {
            self.leave();
            return;
        }
        self.waiting.push_back(call);
    }

    /// The replay calls `cudaMalloc(size)`: the recording's address when the call is the one
    /// the recording made next.
    pub fn malloc(&mut self, size: u64) -> Option<u64> {
        self.passed_over = false;
        if !self.following || !self.in_step {
            return None;
        }
        let found = self.find(
            |call| matches!(call, DeviceCall::Malloc { size: recorded, .. } if recorded == size),
        );
        match found {
            Some(position) if self.may_not_pass(position) => {
                self.leave();
                None
            }
            Some(position) => match self.waiting.remove(position) {
                Some(DeviceCall::Malloc { address, .. }) => {
                    self.passed_over = position > 0;
                    Some(address)
                }
                _ => None,
            },
            None if !self.complete && self.waiting.len() < WINDOW => {
                self.ran_ahead = true;
                self.leave();
                None
            }
            None => {
                self.leave();
                None
            }
        }
    }

    /// The replay calls `cudaFree` on the segment at `address`.
    pub fn free(&mut self, address: u64) {
        if !self.following || !self.in_step {
            return;
        }
        let found = self.find(
            |call| matches!(call, DeviceCall::Free { address: recorded } if recorded == address),
        );
        match found {
            Some(position) => {
                self.waiting.remove(position);
            }
            None if !self.complete && self.waiting.len() < WINDOW => {
                self.ran_ahead = true;
                self.leave();
            }
            None => self.leave(),
        }
    }

    /// Whether the address the last [`CallSequence::malloc`] gave was matched past an earlier
    /// waiting call (two calls that changed places): the driver gave it with that call made
    /// first, so a replay that knows better where its driver would put the segment prefers
    /// that (`replay/device.rs`).
    pub fn passed_over(&self) -> bool {
        self.passed_over
    }

    /// Whether the replay made a call before the pass had read the recording's: a second pass,
    /// knowing every call, may follow it further.
    pub fn ran_ahead(&self) -> bool {
        self.ran_ahead
    }

    /// The position among the next [`WINDOW`] waiting calls of the first that `wanted`
    /// accepts, looking past `cudaMalloc`s only: a free never changes places with another
    /// call (a segment freed and then made again at its address is not the other way round).
    fn find(&self, wanted: impl Fn(DeviceCall) -> bool) -> Option<usize> {
        for (position, &call) in self.waiting.iter().take(WINDOW).enumerate() {
            if wanted(call) {
                return Some(position);
            }
            if matches!(call, DeviceCall::Free { .. }) {
                return None;
            }
        }
        None
    }

    /// Whether the waiting `cudaMalloc` at `position` lies in the chunk of address space an
    /// earlier waiting one (passed over) may have opened: the driver put it there because that
    /// segment was made first, so without it (made later, or never: a what-if whose first
    /// request runs out of memory) the address is not the driver's. Two calls that change
    /// places keep their addresses only in different parts of the address space.
    fn may_not_pass(&self, position: usize) -> bool {
        let Some(DeviceCall::Malloc { address, .. }) = self.waiting.get(position) else {
            return false;
        };
        self.waiting.iter().take(position).any(|&call| match call {
            DeviceCall::Malloc {
                address: first,
                size,
            } => (first..first.saturating_add(AddressSpace::chunk_for(size))).contains(address),
            DeviceCall::Free { .. } => false,
        })
    }

    /// Whether the replay's calls so far are the recording's.
    #[cfg(test)]
    fn in_step(&self) -> bool {
        self.in_step
    }

    fn leave(&mut self) {
        self.in_step = false;
        self.waiting = VecDeque::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A recorded `cudaMalloc` of `size` bytes at `address`.
    fn malloc(address: u64, size: u64) -> DeviceCall {
        DeviceCall::Malloc { address, size }
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_call_made_earlier_than_recorded_still_gets_the_recorded_address() {
        let mut sequence =
            CallSequence::known(&[malloc(0x7000_0000, 20 * MIB), malloc(0x7140_0000, 20 * MIB)]);
        sequence.follow();
        assert_eq!(sequence.malloc(20 * MIB), Some(0x7000_0000));
        assert_eq!(sequence.malloc(20 * MIB), Some(0x7140_0000));
        assert!(sequence.in_step());
    }

    #[test]
    fn the_first_different_call_ends_the_sequence_for_good() {
        let mut sequence = CallSequence::known(&[
            malloc(0x7000_0000, 2 * MIB),
            DeviceCall::Free {
                address: 0x7000_0000,
            },
            malloc(0x7000_0000, 2 * MIB),
        ]);
        sequence.follow();
        assert_eq!(sequence.malloc(2 * MIB), Some(0x7000_0000));
        // The replay keeps the segment and asks for another: the driver's state differs.
        assert_eq!(sequence.malloc(2 * MIB), None);
        assert!(!sequence.in_step());
        sequence.free(0x7000_0000);
        assert_eq!(sequence.malloc(2 * MIB), None, "never followed again");
        assert!(!sequence.ran_ahead());
    }

    #[test]
    fn two_mallocs_of_different_sizes_may_change_places_but_not_a_free() {
        let mut sequence = CallSequence::known(&[
            malloc(0x7000_0000, 2 * MIB),
            malloc(0x9000_0000, 20 * MIB),
            DeviceCall::Free {
                address: 0x7000_0000,
            },
            malloc(0xa000_0000, 20 * MIB),
        ]);
        sequence.follow();
        assert_eq!(sequence.malloc(20 * MIB), Some(0x9000_0000));
        assert!(sequence.passed_over());
        assert_eq!(sequence.malloc(2 * MIB), Some(0x7000_0000));
        assert!(!sequence.passed_over());
        // The recording freed the 2 MiB segment before its next 20 MiB one: a replay that
        // makes the 20 MiB one first has left the sequence.
        assert_eq!(sequence.malloc(20 * MIB), None);
        assert!(!sequence.in_step());
    }

    #[test]
    fn a_malloc_made_in_the_chunk_of_one_passed_over_ends_the_sequence() {
        // The recording's 2 MiB segment went into the tail of its 34 MiB one's chunk: a replay
        // that makes the 2 MiB one without the 34 MiB one first does not get that address.
        let mut sequence =
            CallSequence::known(&[malloc(0x7000_0000, 34 * MIB), malloc(0x7220_0000, 2 * MIB)]);
        sequence.follow();
        assert_eq!(sequence.malloc(2 * MIB), None);
        assert!(!sequence.in_step());
        // Elsewhere, it does.
        let mut sequence =
            CallSequence::known(&[malloc(0x7000_0000, 34 * MIB), malloc(0x7420_0000, 2 * MIB)]);
        sequence.follow();
        assert_eq!(sequence.malloc(2 * MIB), Some(0x7420_0000));
        assert!(sequence.in_step());
    }

    #[test]
    fn a_first_pass_follows_a_lagging_replay_and_notes_one_that_runs_ahead() {
        let mut lagging = CallSequence::default();
        lagging.recorded(malloc(0x7000_0000, 2 * MIB));
        lagging.recorded(malloc(0x7020_0000, 2 * MIB));
        assert_eq!(lagging.malloc(2 * MIB), Some(0x7000_0000));
        assert_eq!(lagging.malloc(2 * MIB), Some(0x7020_0000));
        assert!(!lagging.ran_ahead());

        let mut ahead = CallSequence::default();
        assert_eq!(ahead.malloc(2 * MIB), None);
        assert!(ahead.ran_ahead() && !ahead.in_step());
        ahead.recorded(malloc(0x7000_0000, 2 * MIB));
        assert_eq!(ahead.malloc(2 * MIB), None);
    }

    #[test]
    fn nothing_is_followed_while_the_start_state_is_seeded() {
        let mut sequence = CallSequence::known(&[DeviceCall::Free {
            address: 0x7000_0000,
        }]);
        assert_eq!(sequence.malloc(2 * MIB), None);
        assert!(sequence.in_step());
        sequence.follow();
        sequence.free(0x7000_0000);
        assert!(sequence.in_step());
    }

    #[test]
    fn a_replay_that_lags_too_far_gives_the_sequence_up() {
        let mut sequence = CallSequence::default();
        for index in 0..=MAX_WAITING_CALLS as u64 {
            sequence.recorded(DeviceCall::Free {
                address: index << 21,
            });
        }
        assert!(!sequence.in_step());
        assert_eq!(sequence.malloc(2 * MIB), None);
    }
}
