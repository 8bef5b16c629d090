//! Streams as scripts use them (`torch.cuda.Stream`): a [`Stream`] names one stream of one
//! device, and the [`Runtime`] methods here create streams, queue work on them, make one wait
//! for another, synchronise them, and record a tensor's use on one (`record_stream`).
//!
//! Which stream is current, and switching streams and devices together, is
//! [`super::Devices::with_stream`]/[`super::Devices::set_stream`]. The allocator keeps one set
//! of pools per stream and defers the frees `record_stream` asks for (`alloc/pending.rs`); the
//! device runs the work (`device/streams.rs` models it on the simulator: a stream is busy only
//! while work queued by [`Runtime::sleep`] waits for the next synchronisation point).
//!
//! Stream ids are the allocator's: 0 is the device's default stream, and [`Runtime::new_stream`]
//! hands out 1 to [`STREAMS_PER_POOL`] round robin, as PyTorch hands out the 32 streams of each
//! device's pool (`getStreamFromPool`): the 33rd `torch.cuda.Stream()` is the first one again.
//! The same script therefore gets the same ids on the simulator and on a GPU.

use std::fmt;
use std::rc::Rc;

use super::{Runtime, Tensor, TensorError};
use crate::alloc::{AllocError, CachingAllocator, StreamId};

/// Streams in a device's pool (PyTorch's `kStreamsPerPool`, 1 << 5).
pub const STREAMS_PER_POOL: u64 = 32;

/// The longest [`Runtime::sleep`] accepted, in milliseconds: a spin kernel cannot be
/// interrupted, so a typo such as `gpu_sleep(5000000)` must not hold the GPU for an hour.
pub const MAX_SLEEP_MS: f64 = 60_000.0;

/// One stream of one device (`torch.cuda.Stream`): the device's runtime and the allocator's id
/// of the stream (0: the default stream). Two values are equal when they name the same stream
/// of the same device.
#[derive(Clone)]
pub struct Stream {
    runtime: Rc<Runtime>,
    id: StreamId,
}

impl Stream {
    /// Stream `id` of `runtime`'s device.
    fn of(runtime: &Rc<Runtime>, id: StreamId) -> Stream {
        Stream {
            runtime: Rc::clone(runtime),
            id,
        }
    }

    /// The device's current stream (`torch.cuda.current_stream(device)`).
    pub fn current_of(runtime: &Rc<Runtime>) -> Stream {
        Stream::of(runtime, runtime.current_stream())
    }

    /// The device's default stream (`torch.cuda.default_stream(device)`).
    pub fn default_of(runtime: &Rc<Runtime>) -> Stream {
        Stream::of(runtime, 0)
    }

    /// The allocator's id of the stream (0: the default stream).
    pub fn id(&self) -> StreamId {
        self.id
    }

    /// Whether this is the device's default stream.
    pub fn is_default(&self) -> bool {
        self.id == 0
    }

    /// The runtime of the stream's device.
    pub fn runtime(&self) -> &Rc<Runtime> {
        &self.runtime
    }

    /// The device's label, as `t.device` prints it (`sim`, `sim:1`, `cuda:0`).
    pub fn device(&self) -> &str {
        self.runtime.device_label()
    }
}

impl PartialEq for Stream {
    fn eq(&self, other: &Stream) -> bool {
        Rc::ptr_eq(&self.runtime, &other.runtime) && self.id == other.id
    }
}

impl fmt::Display for Stream {
    /// `<stream 1 on cuda:0>`, `<default stream on sim>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_default() {
            write!(f, "<default stream on {}>", self.device())
        } else {
            write!(f, "<stream {} on {}>", self.id, self.device())
        }
    }
}

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl Runtime {
    /// A stream of this device's pool (`torch.cuda.Stream()`): the next of its
    /// `STREAMS_PER_POOL` streams, round robin. The caller makes sure the device's context
    /// exists, as creating the pool does in PyTorch.
    pub fn new_stream(self: &Rc<Self>) -> Result<Stream, TensorError> {
        let handed_out = self.streams_handed_out.get();
        self.streams_handed_out.set(handed_out.wrapping_add(1));
        let id = handed_out % STREAMS_PER_POOL + 1;
        Ok(Stream::of(self, id))
    }

    /// `tensor.record_stream(stream)`: the tensor's block is used on `stream` (a stream of this
    /// device) too, so once freed it is reused only after the work queued on `stream` until
    /// then has completed. Recorded in the allocator that made the block.
    pub fn record_stream(&self, tensor: &Tensor, stream: StreamId) -> Result<(), TensorError> {
        let storage = tensor.storage();
        let allocation = storage.allocation;
        self.with_owner(storage.owner, |allocator| {
            allocator.record_stream(allocation, stream)
        })
        .unwrap_or_else(|| {
            Err(AllocError::UnknownAllocation(format!(
                "the allocator of the block at {:#x} is gone",
                allocation.ptr
            )))
        })?;
        Ok(())
    }

    /// `stream.synchronize()`: waits until the work queued on `stream` has completed. Frees
    /// waiting for it complete at the next allocation, as in PyTorch.
    pub fn synchronize_stream(&self, stream: StreamId) -> Result<(), TensorError> {
        self.each_allocator(|allocator| allocator.synchronize_stream(stream))
    }

    /// `torch.cuda.synchronize()`: waits until the work queued on every stream of the device
    /// has completed.
    pub fn synchronize(&self) -> Result<(), TensorError> {
        self.each_allocator(CachingAllocator::synchronize_device)?;
        self.backend().synchronize()
    }

    /// `stream.wait_stream(other)`: work queued on `stream` from now on starts only after the
    /// work queued on `other` so far (both streams of this device).
    pub fn wait_stream(&self, stream: StreamId, other: StreamId) -> Result<(), TensorError> {
        Ok(self.allocator.borrow_mut().wait_stream(stream, other)?)
    }

    /// Keeps `stream` busy for `millis` milliseconds (`gpu_sleep`, PyTorch's
    /// `torch.cuda._sleep`): a spin kernel on a GPU; on the simulator the stream stays busy
    /// until the next synchronisation point. `millis` is more than 0 (a sleep of nothing would
    /// keep a simulated stream busy but not a real one) and at most `MAX_SLEEP_MS`; parts of
    /// a millisecond round up.
    pub fn sleep(&self, stream: StreamId, millis: f64) -> Result<(), TensorError> {
        if !(millis > 0.0 && millis <= MAX_SLEEP_MS) {
            return Err(TensorError::OutOfRange(format!(
                "a sleep of {millis} ms; it must be more than 0 and at most {MAX_SLEEP_MS} ms"
            )));
        }
        let mut allocator = self.allocator.borrow_mut();
        Ok(allocator.device_mut().sleep(stream, millis.ceil() as u64)?)
    }

    /// Waits for the current stream before the host reads a tensor's values, as a read does in
    /// PyTorch (`.item()`, `.tolist()`, printing: a copy on the current stream, then
    /// `cudaStreamSynchronize`). Skipped while the allocator is busy (a read from inside an
    /// allocator callback), which no script can reach.
    pub(crate) fn finish_current_stream(&self) -> Result<(), TensorError> {
        let stream = self.current_stream();
        if let Ok(mut allocator) = self.allocator.try_borrow_mut() {
            allocator.synchronize_stream(stream)?;
        }
        Ok(())
    }

    /// Runs `f` on the allocator whose id is `owner`: the current one, one swapped out by
    /// [`Runtime::with_allocator_swapped`], or an orphan; `None` when none has that id.
    fn with_owner<R>(&self, owner: u64, f: impl FnOnce(&mut CachingAllocator) -> R) -> Option<R> {
        let mut current = self.allocator.borrow_mut();
        if current.id() == owner {
            return Some(f(&mut current));
        }
        drop(current);
        let mut swapped_out = self.swapped_out.borrow_mut();
        if let Some(allocator) = swapped_out.iter_mut().find(|a| a.id() == owner) {
            return Some(f(allocator));
        }
        drop(swapped_out);
        let mut orphans = self.orphans.borrow_mut();
        orphans.iter_mut().find(|a| a.id() == owner).map(f)
    }

    /// Runs `f` on every allocator of this device (the current one, those swapped out, the
    /// orphans): on the simulator each draws from its own modelled device, whose streams a
    /// synchronisation must reach as it reaches the one GPU they stand for.
    fn each_allocator(
        &self,
        mut f: impl FnMut(&mut CachingAllocator) -> Result<(), AllocError>,
    ) -> Result<(), TensorError> {
        f(&mut self.allocator.borrow_mut())?;
        for allocator in self.swapped_out.borrow_mut().iter_mut() {
            f(allocator)?;
        }
        for allocator in self.orphans.borrow_mut().iter_mut() {
            f(allocator)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::AllocConf;
    use crate::device::sim::SimDevice;
    use crate::tensor::DType;

    fn runtime() -> Rc<Runtime> {
        Runtime::sim(SimDevice::new(8 << 30), AllocConf::default()).expect("runtime")
    }

    fn stat(runtime: &Runtime, key: &str) -> i64 {
        runtime.allocator().stats().get(key).expect(key)
    }

    #[test]
    fn the_pool_hands_out_32_streams_round_robin() {
        let runtime = runtime();
        let ids: Vec<StreamId> = (0..34)
            .map(|_| runtime.new_stream().expect("stream").id())
            .collect();
        assert_eq!(ids[..3], [1, 2, 3]);
        assert_eq!(ids[31..], [32, 1, 2], "the 33rd stream is the first again");
        let first = runtime.new_stream().expect("stream");
        assert_eq!(first, Stream::of(&runtime, 3));
        assert_ne!(first, Stream::default_of(&runtime));
        assert_eq!(first.to_string(), "<stream 3 on sim>");
        assert_eq!(
            Stream::current_of(&runtime).to_string(),
            "<default stream on sim>"
        );
        assert_ne!(
            Stream::default_of(&runtime),
            Stream::default_of(&self::runtime()),
            "another device's default stream"
        );
    }

    /// A block recorded on a busy stream is held back until the stream was synchronised and
    /// the next allocation looked; a read of a tensor waits for the current stream only.
    #[test]
    fn record_stream_defers_the_free_until_the_stream_is_done() {
        let runtime = runtime();
        let side = runtime.new_stream().expect("stream").id();
        let x = Tensor::empty(&runtime, &[4096], DType::UInt8).expect("fits");
        runtime.record_stream(&x, side).expect("record");
        runtime.sleep(side, 100.0).expect("sleep");
        let ptr = x.data_ptr();
        drop(x);
        assert_eq!(stat(&runtime, "allocated_bytes.all.current"), 0);
        assert_eq!(stat(&runtime, "active_bytes.all.current"), 4096);
        let y = Tensor::full(&runtime, &[1024], 1.0, DType::Float32).expect("fits");
        assert_ne!(y.data_ptr(), ptr, "still held back");
        assert_eq!(y.to_values().expect("values")[0], 1.0);
        drop(y);
        let z = Tensor::empty(&runtime, &[4096], DType::UInt8).expect("fits");
        assert_ne!(
            z.data_ptr(),
            ptr,
            "reading on the default stream left the side one busy"
        );
        runtime.synchronize_stream(side).expect("sync");
        assert_eq!(stat(&runtime, "active_bytes.all.current"), 8192);
        let w = Tensor::empty(&runtime, &[4096], DType::UInt8).expect("fits");
        assert_eq!(w.data_ptr(), ptr, "the next allocation completed the free");
        runtime.allocator().check_invariants().expect("consistent");
    }

    #[test]
    fn sleeps_are_bounded() {
        let runtime = runtime();
        for bad in [-1.0, 0.0, MAX_SLEEP_MS + 1.0, f64::NAN] {
            let error = runtime.sleep(0, bad).expect_err("refused");
            assert!(
                error
                    .to_string()
                    .contains("more than 0 and at most 60000 ms"),
                "{error}"
            );
        }
        runtime.sleep(0, 0.25).expect("part of a millisecond");
    }

    /// `record_stream` reaches the allocator that made the block, also after
    /// `with_allocator_swapped` put another one in front.
    #[test]
    fn record_stream_goes_to_the_blocks_own_allocator() {
        let runtime = runtime();
        let second = runtime
            .fresh_allocator(AllocConf::default())
            .expect("allocator");
        let kept = runtime.with_allocator_swapped(second, || {
            Tensor::empty(&runtime, &[512], DType::UInt8).expect("fits")
        });
        runtime.record_stream(&kept, 7).expect("orphan's block");
        let inner = runtime
            .fresh_allocator(AllocConf::default())
            .expect("allocator");
        let outer = Tensor::empty(&runtime, &[512], DType::UInt8).expect("fits");
        runtime.with_allocator_swapped(inner, || {
            runtime.record_stream(&outer, 7).expect("swapped-out block");
        });
        runtime.synchronize().expect("every allocator's device");
    }
}
