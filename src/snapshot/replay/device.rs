//! The replay's device: the simulated GPU (capacity, context, 2 MiB pages), except that a
//! segment gpumem asks for is placed where PyTorch's driver placed the same segment: the
//! recording's next `cudaMalloc` while the replay's device calls are the recording's
//! (the `sequence` module), else the one the trace just recorded of that size.
//!
//! Addresses decide best-fit ties between equal-size cached blocks, so a replay that placed
//! segments by the simulator's model of a different process's address space would split other
//! blocks and drift away from the recording. The recorded address is used only when it does
//! not overlap a live segment; otherwise the simulator's own placement applies, and should that
//! one overlap a segment placed at a recorded address, the segment goes just above the highest
//! live one. A placement never fails: capacity alone decides whether a segment fits.
//!
//! Streams from [`DEFERRED_STREAMS`] up are the replay's own, one per free the trace shows
//! deferred by `record_stream`: an event recorded on one completes when the replay says so
//! (`synchronize_stream`, at the recorded completion), when the allocator waits for it
//! (`synchronize_event`, its OOM path or `empty_cache()`), or when a `cudaFree` synchronises the
//! device (a release of the replay's own, by garbage collection or the OOM path: in the
//! recording the same release made the same frees complete at the next malloc) — never
//! because time passed, so otherwise the completions come in the order the trace recorded
//! them.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::rc::Rc;

use crate::device::forward_device_memory;
use crate::device::sim::SimDevice;
use crate::device::{DeviceError, DeviceMemory, DevicePtr, MemorySpace, StreamEvent};

use super::mirror::DriverMirror;
use super::sequence::{CallSequence, DeviceCall};

/// Where the recording placed segments, for the replay's device to follow: the recorded
/// `segment_alloc`s waiting for the malloc that follows them (the segment "made at the same
/// allocation"), and the recording's whole sequence of device calls (`CallSequence`), which
/// places a segment the recording made at another allocation as long as the replay's calls so
/// far are the recording's. Shared by the engine, which reads the trace, and the device.
#[derive(Debug, Clone, Default)]
pub struct Hints(Rc<RefCell<Placements>>);

#[derive(Debug, Default)]
struct Placements {
    /// Recorded `segment_alloc`s (address, size) since the last malloc.
    at_allocation: VecDeque<(u64, u64)>,
    /// The recording's device calls, followed while the replay makes the same.
    sequence: CallSequence,
    /// How the segments were placed so far.
    placed: PlacedBy,
    /// The driver's model in the recording's addresses, for a what-if replay.
    mirror: Mirror,
    /// Whether the replay's config is another than the recorded one (a what-if replay):
    /// segments the recording does not place are then placed by the mirror.
    what_if: bool,
    /// Whether `sequence` holds another recording's device calls ([`Hints::follow_other`]):
    /// the replayed trace's own segments then place nothing.
    other_recording: bool,
}

/// The state of a replay's [`DriverMirror`].
#[derive(Debug, Default)]
enum Mirror {
    /// Not yet started: the trace recorded no segment yet.
    #[default]
    Unstarted,
    /// Started at the recording's first segment.
    Active(Box<DriverMirror>),
    /// Not used: the replay's device made a segment before the trace recorded one (a seeded
    /// start state), the first recorded segment fits no window, or a later one lies above the
    /// window the first implies (not a fresh process's trace).
    Off,
}

/// How a replay's `cudaMalloc` segments were placed, for the report: a segment placed by the
/// simulator's model (or above the last large one) may sit elsewhere than the GPU's driver
/// would put it, and a best-fit tie between two equal free blocks then breaks another way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PlacedBy {
    /// At the recording's address, the replay's device calls being the recording's.
    pub sequence: u64,
    /// At the address of the segment of that size the trace made at the same allocation.
    pub same_allocation: u64,
    /// Right above the last large segment (the driver's bump pointer).
    pub above_last_large: u64,
    /// Where the simulator's model puts it (or above every live segment, when that is taken).
    pub model: u64,
    /// Where the driver's model, run in the recording's addresses and knowing the memory the
    /// recording shows others held, puts it (a what-if replay's segment the recording does
    /// not place: `replay/mirror.rs`).
    pub mirror: u64,
}

impl PlacedBy {
    /// Every segment placed.
    pub fn total(&self) -> u64 {
        self.sequence + self.same_allocation + self.above_last_large + self.model + self.mirror
    }

    /// Segments at an address the recording's driver chose.
    pub fn recorded(&self) -> u64 {
        self.sequence + self.same_allocation
    }
}

/// Which rule placed a segment.
#[derive(Debug, Clone, Copy)]
enum PlacedHow {
    Sequence,
    SameAllocation,
    AboveLastLarge,
    Model,
    Mirror,
}

impl Hints {
    /// Hints for a pass that knows every device call of the trace (`calls`, in order), which
    /// it follows once [`Hints::follow`] is called.
    pub fn knowing(calls: &[DeviceCall]) -> Hints {
        Hints(Rc::new(RefCell::new(Placements {
            sequence: CallSequence::known(calls),
            ..Placements::default()
        })))
    }

    /// Makes the replay follow `calls`, the device calls of another recording of the same
    /// job (PyTorch's own run under the replay's config, say), instead of the replayed
    /// trace's: its segments go where that run's driver put them while the replay makes that
    /// run's calls, and by the simulator's model after. The replayed trace's own addresses
    /// and the mirror learnt from them are not used. With the addresses the driver really
    /// gave that run, a replay that still differs from it differs in the allocator's
    /// decisions, not in placement (`gpumem replay --addresses-from`).
    pub fn follow_other(&self, calls: &[DeviceCall]) {
        let mut placements = self.0.borrow_mut();
        placements.sequence = CallSequence::known(calls);
        placements.at_allocation.clear();
        placements.mirror = Mirror::Off;
        placements.other_recording = true;
    }

    /// The trace recorded a segment of `size` bytes at `address` (for the next malloc).
    pub fn push(&self, address: u64, size: u64) {
        let mut placements = self.0.borrow_mut();
        if !placements.other_recording {
            placements.at_allocation.push_back((address, size));
        }
    }

    /// The trace recorded device call `call` (a pass that learns them as it reads).
    pub fn recorded(&self, call: DeviceCall) {
        let mut placements = self.0.borrow_mut();
        if !placements.other_recording {
            placements.sequence.recorded(call);
        }
    }

    /// The replay of the trace begins (the start state is seeded): from now on its device
    /// calls are compared with the recording's.
    pub fn follow(&self) {
        self.0.borrow_mut().sequence.follow();
    }

    /// The replay's config is another than the recorded one (`what_if`), or the same.
    pub fn what_if(&self, what_if: bool) {
        self.0.borrow_mut().what_if = what_if;
    }

    /// The trace recorded a `segment_alloc` of `size` bytes at `address`: the mirror starts
    /// at the first and learns from every one.
    pub fn recorded_segment(&self, address: u64, size: u64) {
        let mirror = &mut self.0.borrow_mut().mirror;
        match mirror {
            Mirror::Unstarted => {
                *mirror = match DriverMirror::from_first_segment(address, size).map(Box::new) {
                    Some(mut started) => {
                        if started.recorded_malloc(address, size) {
                            Mirror::Active(started)
                        } else {
                            Mirror::Off
                        }
                    }
                    None => Mirror::Off,
                };
            }
            Mirror::Active(started) => {
                if !started.recorded_malloc(address, size) {
                    *mirror = Mirror::Off;
                }
            }
            Mirror::Off => {}
        }
    }

    /// The trace recorded the `segment_free` of the segment at `address`.
    pub fn recorded_segment_free(&self, address: u64) {
        if let Mirror::Active(mirror) = &mut self.0.borrow_mut().mirror {
            mirror.recorded_free(address);
        }
    }

    /// Where the mirror puts the replay's next segment of `size` bytes, in a what-if replay.
    fn mirror_place(&self, size: u64) -> Option<u64> {
        let mut placements = self.0.borrow_mut();
        if !placements.what_if {
            return None;
        }
        match &mut placements.mirror {
            Mirror::Active(mirror) => mirror.place(size),
            _ => None,
        }
    }

    /// The replay's device made a segment at `address` (`by_mirror`: where the mirror said).
    fn device_made(&self, address: u64, size: u64, by_mirror: bool) {
        let mut placements = self.0.borrow_mut();
        match &mut placements.mirror {
            // A segment before the trace's first: a seeded start state, whose process's
            // window the mirror cannot know.
            Mirror::Unstarted => placements.mirror = Mirror::Off,
            Mirror::Active(mirror) if !by_mirror => mirror.placed(address, size),
            _ => {}
        }
    }

    /// The replay's device freed its segment at `address`.
    fn device_freed(&self, address: u64) {
        if let Mirror::Active(mirror) = &mut self.0.borrow_mut().mirror {
            mirror.freed(address);
        }
    }

    /// Whether the replay made a device call before the pass had read the recording's: a
    /// pass that knows every call could have followed it further.
    pub fn ran_ahead(&self) -> bool {
        self.0.borrow().sequence.ran_ahead()
    }

    /// Forgets hints no malloc used (the replay took another path).
    pub fn clear(&self) {
        self.0.borrow_mut().at_allocation.clear();
    }

    /// How the segments were placed so far.
    pub fn placed(&self) -> PlacedBy {
        self.0.borrow().placed
    }

    fn count(&self, how: PlacedHow) {
        let placed = &mut self.0.borrow_mut().placed;
        let counter = match how {
            PlacedHow::Sequence => &mut placed.sequence,
            PlacedHow::SameAllocation => &mut placed.same_allocation,
            PlacedHow::AboveLastLarge => &mut placed.above_last_large,
            PlacedHow::Model => &mut placed.model,
            PlacedHow::Mirror => &mut placed.mirror,
        };
        *counter += 1;
    }

    /// The recorded addresses for a segment of `size` bytes: the recording's next call's when
    /// the replay is in step with it, and the one made at the same allocation.
    fn take(&self, size: u64) -> [Option<u64>; 2] {
        let mut placements = self.0.borrow_mut();
        let mut in_sequence = placements.sequence.malloc(size);
        if placements.sequence.passed_over() && placements.what_if {
            // Two calls changed places: the recorded address was the driver's with the other
            // made first. The mirror, where it follows the recording, knows where the driver
            // puts this one now (the first segment of a what-if whose config resized it can
            // take the startup range the recording's first one took, not the recording's next
            // one's new chunk).
            if let Mirror::Active(mirror) = &placements.mirror {
                if let Some(placed) = mirror.would_place(size) {
                    in_sequence = in_sequence.filter(|&recorded| recorded == placed);
                }
            }
        }
        let hints = &mut placements.at_allocation;
        let at_allocation = hints
            .iter()
            .position(|&(_, bytes)| bytes == size)
            .and_then(|position| hints.remove(position))
            .map(|(address, _)| address);
        [in_sequence, at_allocation]
    }

    /// The replay gave back the segment at `address`.
    fn freed(&self, address: u64) {
        self.0.borrow_mut().sequence.free(address);
        self.device_freed(address);
    }
}

/// cudaMalloc's segments start on 2 MiB boundaries (the H200 driver's granularity).
const SEGMENT_ALIGNMENT: u64 = 2 << 20;

/// The segment of PyTorch's small pool (`kSmallBuffer`, 2 MiB): every segment larger than it
/// belongs to the large pool (whose smallest is `kLargeBuffer`'s 20 MiB, or 10 MiB and up in
/// 2 MiB steps).
const SMALL_SEGMENT: u64 = 2 << 20;

/// The first of the streams a replay makes up for deferred frees: above every address a
/// process can hold, so no recorded stream (a `cudaStream_t` value) is one.
pub const DEFERRED_STREAMS: u64 = 1 << 63;

/// The ticket of every event recorded on a made-up stream: its one piece of work.
const DEFERRED_TICKET: u64 = 1;

/// Whether the work behind the events recorded on the made-up stream `stream` (see
/// [`DEFERRED_STREAMS`]) is done on the replay's `device`.
pub fn deferred_stream_done(device: &dyn DeviceMemory, stream: u64) -> bool {
    device
        .query_event(StreamEvent {
            stream,
            ticket: DEFERRED_TICKET,
        })
        .unwrap_or(false)
}

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
    /// The made-up streams whose work is done.
    done: BTreeSet<u64>,
    /// The made-up streams with an event recorded and not yet done.
    pending: BTreeSet<u64>,
    /// Where the last large-pool segment placed at a recorded address, or above the one
    /// before it, ends: the driver's bump pointer in the range it is filling.
    last_large_end: Option<u64>,
}

impl ReplayDevice {
    /// A device over `inner` taking placements from `hints`.
    pub fn new(inner: SimDevice, hints: Hints) -> ReplayDevice {
        ReplayDevice {
            inner,
            hints,
            live: BTreeMap::new(),
            done: BTreeSet::new(),
            pending: BTreeSet::new(),
            last_large_end: None,
        }
    }

    /// The first 2 MiB boundary above every live segment (live segments never overlap, so
    /// the one that starts last ends last).
    fn above_live(&self) -> Option<u64> {
        let (&start, &(bytes, _)) = self.live.last_key_value()?;
        start
            .checked_add(bytes)?
            .checked_next_multiple_of(SEGMENT_ALIGNMENT)
    }

    fn overlaps(&self, address: u64, size: u64) -> bool {
        let end = address.saturating_add(size);
        let before = self.live.range(..end).next_back();
        before.is_some_and(|(&start, &(bytes, _))| start.saturating_add(bytes) > address)
    }
}

/// Whether a recorded address can hold a segment of `bytes`: not null, aligned as every
/// `cudaMalloc` result is (512 bytes at least), and not wrapping past the end of the address
/// space. A snapshot file is untrusted: anything else is left to the simulator's placement.
fn plausible(address: u64, bytes: u64) -> bool {
    address != 0 && address.is_multiple_of(512) && address.checked_add(bytes).is_some()
}

impl DeviceMemory for ReplayDevice {
    fn malloc(&mut self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        let own = self.inner.malloc(bytes)?;
        let usable = |address: Option<u64>| {
            address.filter(|&address| plausible(address, bytes) && !self.overlaps(address, bytes))
        };
        let [in_sequence, at_allocation] = self.hints.take(bytes);
        // A large-pool segment the recording does not place goes where the driver's bump
        // pointer stands: right above the last large one placed at a recorded address (or
        // so), when that range is free.
        let large = bytes > SMALL_SEGMENT;
        let above_last_large = self
            .last_large_end
            .and_then(|end| end.checked_next_multiple_of(SEGMENT_ALIGNMENT))
            .filter(|_| large);
        let by_mirror = || {
            let address = self.hints.mirror_place(bytes)?;
            if usable(Some(address)).is_none() {
                // The mirror holds every live segment, so this is a file it cannot follow:
                // forget its placement and use the other rules.
                self.hints.device_freed(address);
                return None;
            }
            Some(address)
        };
        let sequence = usable(in_sequence).map(|address| (address, PlacedHow::Sequence));
        let chosen = sequence
            .or_else(|| by_mirror().map(|address| (address, PlacedHow::Mirror)))
            .or_else(|| {
                [
                    (usable(at_allocation), PlacedHow::SameAllocation),
                    (usable(above_last_large), PlacedHow::AboveLastLarge),
                ]
                .into_iter()
                .find_map(|(address, how)| address.map(|address| (address, how)))
            });
        let (address, how) = match chosen {
            Some((address, how)) => {
                if large {
                    self.last_large_end = address.checked_add(bytes);
                }
                (address, how)
            }
            None if !self.overlaps(own.addr(), bytes) => (own.addr(), PlacedHow::Model),
            // The simulator's own address collides with a recorded one still live (its model
            // of the address space is not the recorded process's, e.g. on a smaller device):
            // the segment goes above every live one instead.
            None => match self.above_live() {
                Some(address) if address.checked_add(bytes).is_some() => {
                    (address, PlacedHow::Model)
                }
                _ => {
                    self.inner.free(own)?;
                    return Err(DeviceError::InvalidArgument(format!(
                        "replay placement: no address for a segment of {bytes} bytes beside the recorded ones"
                    )));
                }
            },
        };
        self.hints.count(how);
        self.hints
            .device_made(address, bytes, matches!(how, PlacedHow::Mirror));
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
        self.hints.freed(address);
        // cudaFree synchronises the device: the work behind every event recorded so far is
        // done, and the allocator's next `process_events` completes those frees (in a what-if
        // replay whose garbage collection or OOM path releases a segment where the recording
        // did not, that is where PyTorch would have completed them).
        let pending = std::mem::take(&mut self.pending);
        self.done.extend(pending);
        self.inner.free(own)
    }

    // The device's figures are the simulator's, and so are expandable segments: reserved
    // ranges and their pages (only `cudaMalloc` segments take recorded addresses).
    forward_device_memory!(inner: mem_get_info, total_memory, index, process_memory, label,
        driver_memory, vmm);

    // Streams and events: the simulator's, but for the made-up streams of deferred frees.

    fn record_event(&mut self, stream: u64) -> Result<StreamEvent, DeviceError> {
        if stream >= DEFERRED_STREAMS {
            if !self.done.contains(&stream) {
                self.pending.insert(stream);
            }
            return Ok(StreamEvent {
                stream,
                ticket: DEFERRED_TICKET,
            });
        }
        self.inner.record_event(stream)
    }

    fn query_event(&self, event: StreamEvent) -> Result<bool, DeviceError> {
        if event.stream >= DEFERRED_STREAMS {
            return Ok(self.done.contains(&event.stream));
        }
        self.inner.query_event(event)
    }

    fn synchronize_event(&mut self, event: StreamEvent) -> Result<(), DeviceError> {
        if event.stream >= DEFERRED_STREAMS {
            self.pending.remove(&event.stream);
            self.done.insert(event.stream);
            return Ok(());
        }
        self.inner.synchronize_event(event)
    }

    fn synchronize_stream(&mut self, stream: u64) -> Result<(), DeviceError> {
        if stream >= DEFERRED_STREAMS {
            self.pending.remove(&stream);
            self.done.insert(stream);
            return Ok(());
        }
        self.inner.synchronize_stream(stream)
    }

    forward_device_memory!(inner: synchronize_device, wait_stream);

    fn sleep(&mut self, stream: u64, millis: u64) -> Result<(), DeviceError> {
        if stream >= DEFERRED_STREAMS {
            // A made-up stream is busy until the replay says otherwise.
            return Ok(());
        }
        self.inner.sleep(stream, millis)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Recorded addresses and the model's mix: when the model's address for a segment is
    /// taken by one placed at a recorded address, the segment goes above every live one —
    /// never an error ("replay placement: ... overlaps a live segment" was one).
    #[test]
    fn a_placement_never_fails_for_overlap() {
        // The model's first two addresses, in a device of the same size.
        let mut probe = SimDevice::new(1 << 30);
        let _first = probe.malloc(4 << 20).expect("room");
        let second = probe.malloc(2 << 20).expect("room");
        let hints = Hints::default();
        let mut device = ReplayDevice::new(SimDevice::new(1 << 30), hints.clone());
        // The trace put a 4 MiB segment where the model puts the next 2 MiB one.
        hints.push(second.addr(), 4 << 20);
        let recorded = device.malloc(4 << 20).expect("room");
        assert_eq!(recorded.addr(), second.addr());
        let next = device
            .malloc(2 << 20)
            .expect("capacity decides, not placement");
        assert!(
            next.addr() >= recorded.addr() + (4 << 20),
            "{:#x} must not overlap the recorded segment at {:#x}",
            next.addr(),
            recorded.addr()
        );
        assert!(next.addr().is_multiple_of(2 << 20));
        let mut placed = vec![recorded, next];
        for _ in 0..4 {
            placed.push(device.malloc(2 << 20).expect("room"));
        }
        let sizes: BTreeMap<u64, u64> = device.live.iter().map(|(&a, &(b, _))| (a, b)).collect();
        let mut sorted: Vec<u64> = placed.iter().map(|address| address.addr()).collect();
        sorted.sort_unstable();
        for pair in sorted.windows(2) {
            assert!(pair[0] + sizes[&pair[0]] <= pair[1], "{pair:?} overlap");
        }
        for address in placed {
            device.free(address).expect("free");
        }
        assert_eq!(
            device.mem_get_info().ok(),
            SimDevice::new(1 << 30).mem_get_info().ok(),
            "every segment went back"
        );
    }

    /// `--addresses-from`: the other recording's calls place the segments while the replay
    /// makes them, the replayed trace's own addresses none, and the model takes over at the
    /// first call the other recording did not make.
    #[test]
    fn another_recordings_calls_place_segments_instead_of_the_traces_own() {
        const OTHER: u64 = 0x7100_0000_0000;
        const OWN: u64 = 0x7000_0000_0000;
        let hints = Hints::knowing(&[DeviceCall::Malloc {
            address: OWN,
            size: 2 << 20,
        }]);
        hints.follow_other(&[
            DeviceCall::Malloc {
                address: OTHER,
                size: 2 << 20,
            },
            DeviceCall::Malloc {
                address: OTHER + (20 << 20),
                size: 20 << 20,
            },
        ]);
        hints.follow();
        hints.what_if(true);
        let mut device = ReplayDevice::new(SimDevice::new(1 << 30), hints.clone());
        // What the replayed trace itself records is not used.
        hints.push(OWN, 2 << 20);
        hints.recorded(DeviceCall::Malloc {
            address: OWN,
            size: 2 << 20,
        });
        hints.recorded_segment(OWN, 2 << 20);
        let first = device.malloc(2 << 20).expect("room");
        assert_eq!(first.addr(), OTHER);
        let second = device.malloc(20 << 20).expect("room");
        assert_eq!(second.addr(), OTHER + (20 << 20));
        // A call the other recording never made: the model's address, not the trace's.
        let third = device.malloc(2 << 20).expect("room");
        assert!(third.addr() != OWN && third.addr() != OTHER);
        let placed = hints.placed();
        assert_eq!((placed.sequence, placed.model, placed.total()), (2, 1, 3));
        for segment in [first, second, third] {
            device.free(segment).expect("free");
        }
    }

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

    #[test]
    fn an_implausible_recorded_address_is_not_used() {
        let hints = Hints::default();
        let mut device = ReplayDevice::new(SimDevice::new(1 << 30), hints.clone());
        for address in [0, 0x7000_0000_0100, u64::MAX - (1 << 20) + 1] {
            hints.push(address, 2 << 20);
            let placed = device.malloc(2 << 20).expect("room").addr();
            assert_ne!(placed, address);
            assert!(placed.checked_add(2 << 20).is_some());
        }
    }

    #[test]
    fn a_simulator_address_taken_by_a_recorded_segment_goes_above_the_live_ones() {
        // Where the simulator puts two segments, from a device of the same make.
        let mut probe = ReplayDevice::new(SimDevice::new(1 << 30), Hints::default());
        let first = probe.malloc(2 << 20).expect("room").addr();
        let second = probe.malloc(2 << 20).expect("room").addr();
        // The recording put the first segment where the simulator puts the second.
        let hints = Hints::default();
        let mut device = ReplayDevice::new(SimDevice::new(1 << 30), hints.clone());
        hints.push(second, 2 << 20);
        let recorded = device.malloc(2 << 20).expect("room");
        assert_eq!(recorded.addr(), second);
        let moved = device.malloc(2 << 20).expect("placed, not refused");
        let at = moved.addr();
        assert!(at != first && at != second, "{at:#x}");
        assert!(at >= second + (2 << 20) && at.is_multiple_of(2 << 20));
        assert!(device.free(moved).is_ok() && device.free(recorded).is_ok());
        assert_eq!(
            device.mem_get_info().map(|(free, _)| free).ok(),
            probe
                .inner
                .mem_get_info()
                .map(|(free, _)| free + (4 << 20))
                .ok()
        );
    }
}
