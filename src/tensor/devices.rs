//! The devices of a session and which one is current: what every script binding acts on (the
//! script context of DESIGN.md). A binding asks for the current device, or a given one, and
//! gets that device's [`Runtime`]; none holds on to one runtime.
//!
//! Selecting devices follows PyTorch 2.11 on CUDA 12, including when a device's CUDA context
//! is created (see `selection.rs` and docs/devices.md): allocating on a device, selecting it
//! (`set_device`, entering `with_device`), running work on it (`synchronize`, `mem_get_info`,
//! either end of a copy between devices). Reading counters creates nothing.
//!
//! ```
//! use gpumem::alloc::AllocConf;
//! use gpumem::device::sim::SimDevice;
//! use gpumem::tensor::{DType, Devices, Runtime, Tensor};
//!
//! let gpu = |index| Runtime::sim(SimDevice::new(8 << 30).numbered(index), AllocConf::default());
//! let devices = Devices::new(vec![gpu(0)?, gpu(1)?], 0)?;
//! let x = devices.with_selected(1, || Tensor::empty(&devices.current(), &[1024], DType::UInt8))??;
//! assert_eq!((x.device(), devices.current_index()), ("sim:1", 0));
//! let y = devices.copy_to(&x, 0)?;
//! assert_eq!(devices.get(0)?.allocator().stats().allocated_bytes.all.current, 1024);
//! drop((x, y)); // each block goes back to the allocator of its own device
//! assert_eq!(devices.get(1)?.allocator().stats().allocated_bytes.all.current, 0);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use thiserror::Error;

use super::selection::{Activation, Selection};
use super::{Runtime, Stream, Tensor, TensorError};
use crate::alloc::AllocError;

/// A device index the session does not have.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("device {index} does not exist: this session has {}", count_text(*.count))]
pub struct NoSuchDevice {
    /// The index asked for (as a script wrote it, so possibly negative).
    pub index: i64,
    /// How many devices the session has.
    pub count: usize,
}

/// "2 devices (indices 0 to 1)", as [`NoSuchDevice`] words the count.
fn count_text(count: usize) -> String {
    match count {
        0 => "no devices".to_string(),
        1 => "1 device (index 0)".to_string(),
        n => format!("{n} devices (indices 0 to {})", n - 1),
    }
}

/// The devices a session sees, which one is current, and how PyTorch would have selected them.
pub struct Devices {
    /// One runtime per device, by index. Replaced wholesale by [`Devices::reset`].
    runtimes: RefCell<Vec<Rc<Runtime>>>,
    selection: Cell<Selection>,
    /// The device current when the session started.
    start: usize,
    /// Whether PyTorch's global stream state exists in this process: made once, by the first
    /// call that reads a stream (`current_stream()`, a tensor, a new stream), on the device
    /// current then (c10's `initGlobalStreamState` asks the runtime for the stream priority
    /// range, which creates that device's primary context).
    streams_ready: Cell<bool>,
}

impl Devices {
    /// The devices `runtimes` (device `i` is `runtimes[i]`), with device `start` current and
    /// no context created yet (as a process that has made no CUDA call).
    pub fn new(runtimes: Vec<Rc<Runtime>>, start: usize) -> Result<Devices, NoSuchDevice> {
        if start >= runtimes.len() {
            return Err(NoSuchDevice {
                index: i64::try_from(start).unwrap_or(i64::MAX),
                count: runtimes.len(),
            });
        }
        Ok(Devices {
            runtimes: RefCell::new(runtimes),
            selection: Cell::new(Selection::starting_on(start)),
            start,
            streams_ready: Cell::new(false),
        })
    }

    /// How many devices the session has (`torch.cuda.device_count()`).
    pub fn count(&self) -> usize {
        self.runtimes.borrow().len()
    }

    /// The current device's index (`torch.cuda.current_device()`).
    pub fn current_index(&self) -> usize {
        self.selection.get().current()
    }

    /// The current device.
    pub fn current(&self) -> Rc<Runtime> {
        let index = self.current_index();
        let runtimes = self.runtimes.borrow();
        // The selection only ever holds indices `get` accepted, so this never falls back; and
        // the list is never empty (`new` refuses an empty one, `reset` keeps its length).
        Rc::clone(runtimes.get(index).unwrap_or(&runtimes[0]))
    }

    /// Device `index`.
    pub fn get(&self, index: usize) -> Result<Rc<Runtime>, NoSuchDevice> {
        self.runtimes
            .borrow()
            .get(index)
            .cloned()
            .ok_or_else(|| NoSuchDevice {
                index: i64::try_from(index).unwrap_or(i64::MAX),
                count: self.count(),
            })
    }

    /// Checks a script's device index.
    pub fn index_of(&self, index: i64) -> Result<usize, NoSuchDevice> {
        usize::try_from(index)
            .ok()
            .filter(|&index| index < self.count())
            .ok_or(NoSuchDevice {
                index,
                count: self.count(),
            })
    }

    /// Every device, by index.
    pub fn all(&self) -> Vec<Rc<Runtime>> {
        self.runtimes.borrow().clone()
    }

    /// The index of the device whose runtime is `runtime`, if it is one of this session's.
    pub fn position(&self, runtime: &Rc<Runtime>) -> Option<usize> {
        self.runtimes
            .borrow()
            .iter()
            .position(|candidate| Rc::ptr_eq(candidate, runtime))
    }

    /// The index of the device labelled `label` (`sim:1`, `cuda:0`, as `t.device` prints
    /// it); a bare `sim` or `cuda` names the current device, as `torch.device("cuda")` does.
    pub fn find(&self, label: &str) -> Option<usize> {
        let runtimes = self.runtimes.borrow();
        if let Some(index) = runtimes.iter().position(|r| r.device_label() == label) {
            return Some(index);
        }
        let kind = |runtime: &Runtime| {
            let text = runtime.device_label();
            text.split(':').next().unwrap_or(text).to_string()
        };
        let current = runtimes.get(self.current_index())?;
        (kind(current) == label).then(|| self.current_index())
    }

    /// `torch.cuda.set_device(index)`: makes device `index` current and creates its context
    /// (PyTorch 2.11 always calls `cudaSetDevice` here, which creates it).
    pub fn select(&self, index: usize) -> Result<(), TensorError> {
        self.get(index)?;
        let activation = self.step(|selection| selection.force_set(index));
        self.activate(activation)
    }

    /// `with torch.cuda.device(index): f()`: `f` runs with device `index` current (its
    /// context created, unless the CUDA runtime has that device current already); afterwards
    /// the previous device is current again, without creating its context if it has none.
    /// The previous device comes back however `f` ends; `f`'s value is returned as it is.
    pub fn with_selected<R>(&self, index: usize, f: impl FnOnce() -> R) -> Result<R, TensorError> {
        self.get(index)?;
        let before = self.selection.get();
        let (previous, activation) = self.step(|selection| selection.exchange(index));
        if let Err(error) = self.activate(activation) {
            self.selection.set(before);
            return Err(error);
        }
        let value = f();
        let has_context = self.has_context(previous);
        let activation = self.step(|selection| selection.maybe_exchange(previous, has_context));
        // Switching back only happens to a device whose context exists: nothing to create.
        self.activate(activation)?;
        Ok(value)
    }

    /// Runs `f` on device `index` under PyTorch's device guard (`CUDAGuard`), as an operation
    /// on a tensor of that device does: the device becomes current for `f` (its context
    /// created), and the previous one comes back afterwards without creating its context.
    pub fn guarded<R>(
        &self,
        index: usize,
        f: impl FnOnce(&Rc<Runtime>) -> Result<R, TensorError>,
    ) -> Result<R, TensorError> {
        let runtime = self.get(index)?;
        let before = self.selection.get();
        let (previous, activation) = self.step(|selection| selection.exchange(index));
        if let Err(error) = self.activate(activation) {
            self.selection.set(before);
            return Err(error);
        }
        let result = f(&runtime);
        let has_context = self.has_context(previous);
        let activation = self.step(|selection| selection.maybe_set(previous, has_context));
        self.activate(activation)?;
        result
    }

    /// The current device, ready for a tensor to be made there: a device made current without
    /// its context becomes the CUDA runtime's current device, which creates the context. This
    /// holds for a tensor of 0 bytes too, which allocates nothing: PyTorch 2.11's
    /// `torch.empty(0, device="cuda")` creates the context all the same (measured on the H200 by
    /// tests/gpu/contexts.py, case "a tensor of 0 bytes").
    pub fn for_allocation(&self) -> Result<Rc<Runtime>, TensorError> {
        let activation = self.step(Selection::settle);
        self.activate(activation)?;
        // The device the tensor goes to needs its context even when nothing was deferred (a
        // fresh process on device 0) and nothing will be allocated (0 bytes).
        let current = self.current();
        // Asked only while there is none: making sure costs a driver call (`cuMemGetInfo`),
        // which would double the cost of a small tensor on a GPU.
        if !current.has_context() {
            current.ensure_context()?;
        }
        self.streams_ready.set(true);
        Ok(current)
    }

    /// Readies PyTorch's stream state before a stream is read (`current_stream()`,
    /// `default_stream()`): the first time in a process, that creates the context of the device
    /// current then — whichever device's stream is asked for (measured on the H200 for device
    /// 0 by tests/gpu/contexts.py, case "current and default stream").
    pub fn ready_streams(&self) -> Result<(), TensorError> {
        if !self.streams_ready.get() {
            let current = self.current();
            if !current.has_context() {
                current.ensure_context()?;
            }
            self.streams_ready.set(true);
        }
        Ok(())
    }

    /// `t.to(index)`: `tensor` itself when it is on device `index` already (PyTorch returns
    /// the tensor unchanged), else a copy of its values in a new tensor there. The copy runs
    /// under guards of both devices, as PyTorch's does, so it creates the destination's
    /// context and no other.
    pub fn copy_to(&self, tensor: &Tensor, index: usize) -> Result<Tensor, TensorError> {
        let target = self.get(index)?;
        if Rc::ptr_eq(tensor.runtime(), &target) {
            return Ok(tensor.clone());
        }
        let Some(source) = self.position(tensor.runtime()) else {
            return Err(TensorError::Unsupported(
                "the tensor belongs to another session (or to this one before :reset)".into(),
            ));
        };
        self.guarded(source, |_| {
            self.guarded(index, |target| tensor.to_runtime(target))
        })
    }

    /// The index of `stream`'s device; an error for a stream of another session (or of this
    /// one before [`Devices::reset`]).
    pub fn stream_device(&self, stream: &Stream) -> Result<usize, TensorError> {
        self.position(stream.runtime()).ok_or_else(|| {
            TensorError::Unsupported(
                "the stream belongs to another session (or to this one before :reset)".into(),
            )
        })
    }

    /// `torch.cuda.set_stream(stream)`: `stream` becomes its device's current stream, and
    /// its device the current device when it is not (`c10::cuda::set_device`, PyTorch's
    /// internal `SetDevice`: it calls `cudaSetDevice`, creating the context, unless the CUDA
    /// runtime has that device current already).
    pub fn set_stream(&self, stream: &Stream) -> Result<(), TensorError> {
        let index = self.stream_device(stream)?;
        stream.runtime().set_current_stream(stream.id());
        if self.current_index() != index {
            let activation = self.step(|selection| selection.set(index));
            self.activate(activation)?;
        }
        Ok(())
    }

    /// `with torch.cuda.stream(stream): f()`: `f` runs with `stream` current on its device,
    /// and with that device current; afterwards each device has its previous stream again,
    /// however `f` ends, and `f`'s value is returned as it is. As in PyTorch's
    /// `StreamContext`, a stream of another device makes that device current inside (reading
    /// its current stream under `with torch.cuda.device`, then `set_stream`), and leaving sets
    /// the previous device back with `set_stream` — a `cudaSetDevice` that creates its
    /// context if it has none.
    pub fn with_stream<R>(&self, stream: &Stream, f: impl FnOnce() -> R) -> Result<R, TensorError> {
        let index = self.stream_device(stream)?;
        let source = Stream::current_of(&self.current());
        let target = if Rc::ptr_eq(source.runtime(), stream.runtime()) {
            None
        } else {
            Some(self.with_selected(index, || Stream::current_of(stream.runtime()))?)
        };
        // Both streams come back however the closure ends, even when switching devices fails.
        let restore = |target: Option<Stream>| {
            let target_restored = target.map_or(Ok(()), |target| self.set_stream(&target));
            target_restored.and(self.set_stream(&source))
        };
        if let Err(error) = self.set_stream(stream) {
            // The entering error is the one to report; restoring is best effort here.
            let _ = restore(target);
            return Err(error);
        }
        let value = f();
        restore(target)?;
        Ok(value)
    }

    /// `torch.manual_seed(seed)`: restarts every device's generator at `seed`.
    pub fn manual_seed(&self, seed: u64) {
        for runtime in self.runtimes.borrow().iter() {
            runtime.manual_seed(seed);
        }
    }

    /// Makes the session as a new process finds it: every device fresh ([`Runtime::fresh`]:
    /// no segments, counters, peaks, history, generator state or, on the simulated device,
    /// context) and the starting device current. Tensors still alive keep their old runtimes
    /// and free into them.
    pub fn reset(&self) -> Result<(), AllocError> {
        let fresh = self
            .runtimes
            .borrow()
            .iter()
            .map(|runtime| runtime.fresh())
            .collect::<Result<Vec<_>, _>>()?;
        *self.runtimes.borrow_mut() = fresh;
        self.selection.set(Selection::starting_on(self.start));
        self.streams_ready.set(false);
        Ok(())
    }

    /// Applies `change` to the selection and returns what it says.
    fn step<T>(&self, change: impl FnOnce(&mut Selection) -> T) -> T {
        let mut selection = self.selection.get();
        let outcome = change(&mut selection);
        self.selection.set(selection);
        outcome
    }

    /// Carries out a `cudaSetDevice`: creates that device's context if it has none.
    fn activate(&self, activation: Activation) -> Result<(), TensorError> {
        match activation {
            Some(index) => Ok(self.get(index)?.ensure_context()?),
            None => Ok(()),
        }
    }

    fn has_context(&self, index: usize) -> bool {
        self.get(index).is_ok_and(|runtime| runtime.has_context())
    }
}

impl From<Rc<Runtime>> for Devices {
    /// A session of one device.
    fn from(runtime: Rc<Runtime>) -> Devices {
        Devices {
            runtimes: RefCell::new(vec![runtime]),
            selection: Cell::new(Selection::starting_on(0)),
            start: 0,
            streams_ready: Cell::new(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::AllocConf;
    use crate::device::sim::SimDevice;
    use crate::tensor::DType;

    fn two_gpus() -> Devices {
        let gpu = |index| {
            Runtime::sim(
                SimDevice::new(8 << 30).numbered(index),
                AllocConf::default(),
            )
            .expect("runtime")
        };
        Devices::new(vec![gpu(0), gpu(1)], 0).expect("two devices")
    }

    fn contexts(devices: &Devices) -> Vec<bool> {
        devices.all().iter().map(|r| r.has_context()).collect()
    }

    #[test]
    fn a_bad_index_names_the_count() {
        let devices = two_gpus();
        let error = devices.select(5).expect_err("no device 5");
        assert_eq!(
            error.to_string(),
            "device 5 does not exist: this session has 2 devices (indices 0 to 1)"
        );
        assert_eq!(
            devices.index_of(-1).map_err(|e| e.to_string()),
            Err("device -1 does not exist: this session has 2 devices (indices 0 to 1)".into())
        );
        assert!(Devices::new(Vec::new(), 0).is_err());
        assert_eq!(
            contexts(&devices),
            [false, false],
            "a refusal creates nothing"
        );
    }

    #[test]
    fn with_selected_restores_the_device_even_when_the_work_fails() {
        let devices = two_gpus();
        let result: Result<Result<(), &str>, _> = devices.with_selected(1, || {
            assert_eq!(devices.current_index(), 1);
            Err("the work failed")
        });
        assert_eq!(result.ok(), Some(Err("the work failed")));
        assert_eq!(devices.current_index(), 0);
        assert_eq!(
            contexts(&devices),
            [false, true],
            "entering created 1's context"
        );
    }

    #[test]
    fn the_stray_context_on_device_0() {
        let devices = two_gpus();
        devices.with_selected(1, || {}).expect("device 1 exists");
        assert_eq!(contexts(&devices), [false, true]);
        // Back on 0 without its context; the next allocation there creates it.
        devices.for_allocation().expect("device 0");
        assert_eq!(contexts(&devices), [true, true]);
    }

    /// `with torch.cuda.stream(s)` for a stream of device 1: device 1 and `s` are current
    /// inside; afterwards device 0 and both devices' previous streams are back, however the
    /// work ended, and switching back to device 0 created its context (PyTorch's `set_stream`).
    #[test]
    fn with_stream_restores_streams_and_devices() {
        let devices = two_gpus();
        let one = devices.get(1).expect("device 1");
        let side = devices
            .with_selected(1, || one.new_stream())
            .expect("device 1")
            .expect("stream");
        assert_eq!(
            contexts(&devices),
            [false, true],
            "selecting device 1 created its context"
        );
        let result: Result<Result<(), &str>, _> = devices.with_stream(&side, || {
            assert_eq!(devices.current_index(), 1);
            assert_eq!(Stream::current_of(&devices.current()), side);
            Err("the work failed")
        });
        assert_eq!(result.ok(), Some(Err("the work failed")));
        assert_eq!(devices.current_index(), 0);
        assert!(Stream::current_of(&one).is_default());
        assert_eq!(
            contexts(&devices),
            [true, true],
            "the stray context on device 0"
        );
        let same = Stream::current_of(&devices.current());
        let inner = devices
            .with_stream(&same, || devices.current_index())
            .expect("same device");
        assert_eq!((inner, devices.current_index()), (0, 0));
        let foreign = two_gpus()
            .get(0)
            .expect("device")
            .new_stream()
            .expect("stream");
        let error = devices.with_stream(&foreign, || ()).expect_err("not ours");
        assert!(error.to_string().contains("another session"), "{error}");
    }

    #[test]
    fn set_device_creates_the_context_even_of_the_current_device() {
        let devices = two_gpus();
        devices.select(0).expect("device 0 exists");
        assert_eq!(contexts(&devices), [true, false]);
    }

    #[test]
    fn copies_go_to_the_right_device_and_free_there() {
        let devices = two_gpus();
        let x = Tensor::full(
            &devices.for_allocation().expect("current"),
            &[1024],
            2.0,
            DType::Float32,
        )
        .expect("fits");
        let same = devices.copy_to(&x, 0).expect("same device");
        assert!(
            Rc::ptr_eq(same.storage(), x.storage()),
            "no copy on the same device"
        );
        let y = devices
            .copy_to(&x.slice(0, 512, 1024).expect("view"), 1)
            .expect("copies");
        assert_eq!(y.device(), "sim:1");
        assert_eq!(y.to_values().expect("values")[..2], [2.0, 2.0]);
        let allocated = |index: usize| {
            devices
                .get(index)
                .expect("device")
                .allocator()
                .stats()
                .allocated_bytes
                .all
                .current
        };
        assert_eq!((allocated(0), allocated(1)), (4096, 2048));
        drop(y);
        assert_eq!((allocated(0), allocated(1)), (4096, 0));
        assert_eq!(contexts(&devices), [true, true]);
        assert_eq!(devices.current_index(), 0);
    }

    #[test]
    fn reset_gives_fresh_devices_and_the_start_device() {
        let devices = two_gpus();
        devices.select(1).expect("select");
        let kept = Tensor::empty(
            &devices.for_allocation().expect("current"),
            &[512],
            DType::UInt8,
        )
        .expect("fits");
        devices.reset().expect("reset");
        assert_eq!(devices.current_index(), 0);
        assert_eq!(contexts(&devices), [false, false]);
        assert_eq!(
            devices
                .get(1)
                .expect("device")
                .allocator()
                .stats()
                .reserved_bytes
                .all
                .current,
            0
        );
        // The old tensor still frees into its own (old) allocator.
        drop(kept);
        assert!(devices
            .copy_to(
                &Tensor::empty(&devices.current(), &[0], DType::UInt8).expect("empty"),
                1
            )
            .is_ok());
    }
}
