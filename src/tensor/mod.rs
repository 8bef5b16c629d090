//! Tensors: a shape and dtype over shared storage whose memory comes from the caching
//! allocator. The storage returns its block when the last tensor (or view) referring to it is
//! dropped, which is what makes `y = randn(..)` in a script free the old `y` exactly as Python
//! does.

pub mod backend;
pub(crate) mod convert;
pub(crate) mod cuda_backend;
pub(crate) mod devices;
pub(crate) mod dtype;
pub(crate) mod interrupt;
pub(crate) mod mem_pool;
pub mod ops;
pub mod philox;
mod selection;
pub(crate) mod shape;
pub(crate) mod streams;
pub(crate) mod watch;

use std::cell::{Cell, Ref, RefCell};
use std::fmt;
use std::rc::Rc;
use std::sync::Arc;

use thiserror::Error;

use crate::alloc::format::format_size;
use crate::alloc::{
    AllocConf, AllocError, Allocation, CachingAllocator, MemoryObserver, StreamId, Subscription,
};
use crate::device::cuda::{CudaDevice, CudaGpu};
use crate::device::sim::SimDevice;
use crate::device::{DeviceError, DeviceMemory, DeviceSpan};
use backend::{Backend, SimBackend, Span};
use cuda_backend::CudaBackend;
pub use devices::{Devices, NoSuchDevice};
pub use dtype::DType;
pub use streams::Stream;
pub use watch::SessionWatcher;

/// Seed of the random generator until `manual_seed` is called (PyTorch's default seed).
pub const DEFAULT_SEED: u64 = 67_280_421_310_721;

/// What went wrong creating or using a tensor.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum TensorError {
    /// A dtype name that is not one of [`DType::ALL`].
    #[error("unknown dtype '{0}'; expected one of float32, float16, bfloat16, float64, int64, int32, uint8, bool")]
    UnknownDType(String),
    /// A shape that is negative, overflows, or does not fit the operation.
    #[error("invalid shape: {0}")]
    BadShape(String),
    /// An index or range outside the tensor.
    #[error("out of range: {0}")]
    OutOfRange(String),
    /// The allocator refused (out of memory, or a device failure).
    #[error("{0}")]
    Alloc(#[from] AllocError),
    /// The operation is not available for this tensor or device.
    #[error("{0}")]
    Unsupported(String),
    /// The device failed a kernel launch, copy or read.
    #[error("{0}")]
    Device(#[from] crate::device::DeviceError),
    /// The user interrupted the work (`interrupt`).
    #[error("interrupted")]
    Interrupted,
    /// A device index the session does not have.
    #[error("{0}")]
    NoSuchDevice(#[from] NoSuchDevice),
}

/// The generator hands out values in blocks of four (one Philox4x32 call, one float4 store on
/// the device), so every tensor's stream starts on a block boundary.
const RANDOM_BLOCK: u64 = 4;

/// One device as a session uses it: its allocator, the random generator and the backend that
/// computes values, and the stream allocations go to. Every tensor holds its device's runtime,
/// so a tensor freed anywhere returns its block to the allocator that made it. A session's
/// devices and which one is current are [`Devices`].
pub struct Runtime {
    allocator: RefCell<CachingAllocator>,
    /// The allocators [`Runtime::with_allocator_swapped`] set aside while it runs, innermost
    /// last.
    swapped_out: RefCell<Vec<CachingAllocator>>,
    /// Allocators swapped in and back out that still own live tensors.
    orphans: RefCell<Vec<CachingAllocator>>,
    backend: Box<dyn Backend>,
    /// Where segments come from, so a second allocator can draw from the same kind of device.
    origin: DeviceOrigin,
    label: String,
    /// The device's ordinal (`torch.cuda.current_device()`'s numbering).
    index: usize,
    /// The stream this device's allocations go to (PyTorch's current stream of the device;
    /// 0 is the default stream).
    stream: Cell<StreamId>,
    /// How many streams [`Runtime::new_stream`] has handed out (PyTorch's round-robin counter
    /// over the device's stream pool).
    streams_handed_out: Cell<u64>,
    seed: Cell<u64>,
    philox_offset: Cell<u64>,
    /// Told about allocators made current and marks ([`Runtime::watch`]).
    watcher: RefCell<Option<Box<dyn SessionWatcher>>>,
}

/// The device a runtime was built on, as [`Runtime::fresh_allocator`] and [`Runtime::fresh`]
/// need it.
enum DeviceOrigin {
    /// A simulated GPU, as it was before anything used it.
    Sim(Box<SimDevice>),
    /// A CUDA GPU.
    Cuda(Arc<CudaGpu>),
}

impl Runtime {
    /// A runtime on a simulated device: the allocator draws segments from `device`, and values
    /// come from the CPU twin of the generator ([`SimBackend`]). The pairing is fixed here, so
    /// a simulated allocator never meets the CUDA kernels and the other way round.
    ///
    /// ```
    /// use gpumem::alloc::AllocConf;
    /// use gpumem::device::sim::SimDevice;
    /// use gpumem::tensor::{DType, Runtime, Tensor};
    ///
    /// let runtime = Runtime::sim(SimDevice::new(8 << 30), AllocConf::default())?;
    /// let x = Tensor::randn(&runtime, &[2, 3], DType::Float32)?;
    /// assert_eq!(runtime.allocator().stats().allocated_bytes.all.current, 512);
    /// drop(x); // the block goes back to the cache, not to the device
    /// assert_eq!(runtime.allocator().stats().reserved_bytes.all.current, 2 << 20);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn sim(device: SimDevice, conf: AllocConf) -> Result<Rc<Runtime>, AllocError> {
        let origin = DeviceOrigin::Sim(Box::new(device.fresh()));
        let allocator = CachingAllocator::new(Box::new(device), conf)?;
        Ok(Runtime::assemble(allocator, Box::new(SimBackend), origin))
    }

    /// A runtime on a CUDA GPU: the allocator's segments and the value kernels share `gpu`'s
    /// one context. Creating it makes no context yet (NVML's baseline is read first).
    pub fn cuda(gpu: Arc<CudaGpu>, conf: AllocConf) -> Result<Rc<Runtime>, AllocError> {
        let allocator = CachingAllocator::new(Box::new(CudaDevice::new(Arc::clone(&gpu))), conf)?;
        let origin = DeviceOrigin::Cuda(Arc::clone(&gpu));
        Ok(Runtime::assemble(
            allocator,
            Box::new(CudaBackend::new(gpu)),
            origin,
        ))
    }

    /// A second allocator under `conf` on the same kind of device as this runtime's: a fresh
    /// simulated GPU of the same size, or the same CUDA GPU (its own segments, the same
    /// context), so tensors it makes work with this runtime's value backend. For
    /// [`Runtime::with_allocator_swapped`].
    pub fn fresh_allocator(&self, conf: AllocConf) -> Result<CachingAllocator, AllocError> {
        CachingAllocator::new(self.origin.fresh_device(), conf)
    }

    /// A runtime on the same device as a new process finds it: a fresh allocator under the
    /// same config (no segments, counters, peaks or history), the generator at its default
    /// seed, the default stream, no observer. On the simulated device the modelled CUDA
    /// context is gone too, until a call needs it again; a CUDA GPU keeps its primary
    /// context, which only the end of the process releases. What `:reset` gives the REPL.
    pub fn fresh(&self) -> Result<Rc<Runtime>, AllocError> {
        let conf = self.allocator().config().clone();
        let allocator = CachingAllocator::new(self.origin.fresh_device(), conf)?;
        let backend: Box<dyn Backend> = match &self.origin {
            DeviceOrigin::Sim(_) => Box::new(SimBackend),
            DeviceOrigin::Cuda(gpu) => Box::new(CudaBackend::new(Arc::clone(gpu))),
        };
        let origin = match &self.origin {
            DeviceOrigin::Sim(device) => DeviceOrigin::Sim(Box::new(device.fresh())),
            DeviceOrigin::Cuda(gpu) => DeviceOrigin::Cuda(Arc::clone(gpu)),
        };
        Ok(Runtime::assemble(allocator, backend, origin))
    }

    fn assemble(
        allocator: CachingAllocator,
        backend: Box<dyn Backend>,
        origin: DeviceOrigin,
    ) -> Rc<Runtime> {
        let label = allocator.device().label();
        let index = allocator.device().index();
        Rc::new(Runtime {
            allocator: RefCell::new(allocator),
            swapped_out: RefCell::new(Vec::new()),
            orphans: RefCell::new(Vec::new()),
            backend,
            origin,
            label,
            index,
            stream: Cell::new(0),
            streams_handed_out: Cell::new(0),
            seed: Cell::new(DEFAULT_SEED),
            philox_offset: Cell::new(0),
            watcher: RefCell::new(None),
        })
    }

    /// Sets (or with `None` removes) the watcher told about allocators made current and the
    /// script's marks; returns the one it replaces.
    pub fn watch(
        &self,
        watcher: Option<Box<dyn SessionWatcher>>,
    ) -> Option<Box<dyn SessionWatcher>> {
        std::mem::replace(&mut *self.watcher.borrow_mut(), watcher)
    }

    /// Tells the watcher, if any, that the script marked a phase named `text` at the line
    /// trace context `context` stands for.
    pub fn mark(&self, text: &str, context: u32) {
        if let Some(watcher) = self.watcher.borrow_mut().as_mut() {
            watcher.mark(text, context);
        }
    }

    /// Subscribes `observer` to the current allocator's event stream
    /// ([`CachingAllocator::subscribe`]); end it with [`Runtime::unsubscribe`].
    pub fn subscribe(&self, observer: Box<dyn MemoryObserver>) -> Subscription {
        self.allocator.borrow_mut().subscribe(observer)
    }

    /// Ends a subscription of [`Runtime::subscribe`] on the current allocator, handing the
    /// observer back.
    pub fn unsubscribe(&self, id: Subscription) -> Option<Box<dyn MemoryObserver>> {
        self.allocator.borrow_mut().unsubscribe(id)
    }

    /// Allocates a block for `nbytes` bytes of a tensor from the current allocator, on the
    /// current stream; returns that allocator's [`CachingAllocator::id`] with the block.
    pub fn malloc(&self, nbytes: u64) -> Result<(u64, Allocation), AllocError> {
        let mut allocator = self.allocator.borrow_mut();
        let allocation = allocator.malloc_on(self.stream.get(), nbytes)?;
        Ok((allocator.id(), allocation))
    }

    /// `torch.cuda.empty_cache()`.
    pub fn empty_cache(&self) -> Result<(), AllocError> {
        self.allocator.borrow_mut().empty_cache()
    }

    /// The backend that computes values.
    pub fn backend(&self) -> &dyn Backend {
        self.backend.as_ref()
    }

    /// Read access to the allocator (stats, snapshots, summaries).
    pub fn allocator(&self) -> Ref<'_, CachingAllocator> {
        self.allocator.borrow()
    }

    /// Runs `f` with the allocator borrowed mutably. `f` must not drop tensors.
    pub fn with_allocator<R>(&self, f: impl FnOnce(&mut CachingAllocator) -> R) -> R {
        f(&mut self.allocator.borrow_mut())
    }

    /// Runs `f` with `replacement` as the current allocator (every tensor made and every memory
    /// function called meanwhile uses it), then puts the previous allocator back. Tensors keep
    /// the allocator that made them: one that outlives `f` is freed into its own allocator,
    /// which is kept until its last tensor is gone. Calls may nest. The watcher
    /// ([`Runtime::watch`]) is told when `replacement` becomes current and when `f` returns.
    pub fn with_allocator_swapped<R>(
        &self,
        replacement: CachingAllocator,
        f: impl FnOnce() -> R,
    ) -> R {
        let mut replacement = replacement;
        // Its events carry the caller's context (the line that made it) until a binding
        // stamps its own.
        replacement.set_trace_context(self.allocator.borrow().trace_context());
        let outer = std::mem::replace(&mut *self.allocator.borrow_mut(), replacement);
        self.swapped_out.borrow_mut().push(outer);
        if let Some(watcher) = self.watcher.borrow_mut().as_mut() {
            watcher.allocator_started(&mut self.allocator.borrow_mut());
        }
        let result = f();
        if let Some(watcher) = self.watcher.borrow_mut().as_mut() {
            watcher.allocator_ended(&self.allocator.borrow());
        }
        // Nested calls restore their own allocator before returning, so the top of the stack
        // is the one this call swapped out.
        let outer = self.swapped_out.borrow_mut().pop();
        if let Some(outer) = outer {
            let inner = std::mem::replace(&mut *self.allocator.borrow_mut(), outer);
            if inner.stats().allocation.all.current > 0 {
                self.orphans.borrow_mut().push(inner);
            }
        }
        result
    }

    /// Returns a storage's block to the allocator that made it (`owner`): the current one, one
    /// swapped out by [`Runtime::with_allocator_swapped`], or an orphan, which is dropped
    /// (returning its memory) once nothing in it is allocated.
    fn free_into_owner(&self, owner: u64, allocation: Allocation) -> Result<(), String> {
        if allocation.is_null() {
            return Ok(());
        }
        let busy = |_| "a tensor was dropped while the allocator was busy".to_string();
        let failed = |error: AllocError| error.to_string();
        let mut current = self.allocator.try_borrow_mut().map_err(busy)?;
        if current.id() == owner {
            return current.free(allocation).map_err(failed);
        }
        drop(current);
        let mut swapped_out = self.swapped_out.try_borrow_mut().map_err(busy)?;
        if let Some(allocator) = swapped_out.iter_mut().find(|a| a.id() == owner) {
            return allocator.free(allocation).map_err(failed);
        }
        drop(swapped_out);
        let mut orphans = self.orphans.try_borrow_mut().map_err(busy)?;
        let Some(index) = orphans.iter().position(|a| a.id() == owner) else {
            return Err(format!(
                "the allocator of the block at {:#x} is gone",
                allocation.ptr
            ));
        };
        orphans[index].free(allocation).map_err(failed)?;
        if orphans[index].stats().allocation.all.current == 0 {
            orphans.remove(index);
        }
        Ok(())
    }

    /// Runs `f` on the allocator whose [`CachingAllocator::id`] is `owner`: the current one,
    /// one swapped out by [`Runtime::with_allocator_swapped`], or an orphan; `None` when that
    /// allocator is gone (swapped in and out with nothing left allocated in it).
    fn with_owner_allocator<R>(
        &self,
        owner: u64,
        f: impl FnOnce(&mut CachingAllocator) -> R,
    ) -> Result<Option<R>, String> {
        let busy = |_| "the allocator was busy".to_string();
        let mut current = self.allocator.try_borrow_mut().map_err(busy)?;
        if current.id() == owner {
            return Ok(Some(f(&mut current)));
        }
        drop(current);
        let mut swapped_out = self.swapped_out.try_borrow_mut().map_err(busy)?;
        if let Some(allocator) = swapped_out.iter_mut().find(|a| a.id() == owner) {
            return Ok(Some(f(allocator)));
        }
        drop(swapped_out);
        let mut orphans = self.orphans.try_borrow_mut().map_err(busy)?;
        Ok(orphans.iter_mut().find(|a| a.id() == owner).map(f))
    }

    /// The device's label (`sim`, `sim:1` on a machine of several simulated devices,
    /// `cuda:0`).
    pub fn device_label(&self) -> &str {
        &self.label
    }

    /// The device's ordinal, as `current_device()` numbers it.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The stream this device's allocations go to (0: the default stream).
    pub fn current_stream(&self) -> StreamId {
        self.stream.get()
    }

    /// Makes `stream` this device's current stream: allocations from now on are served from
    /// its pools (the allocator keeps one set per stream), as PyTorch's
    /// `torch.cuda.set_stream`. Kernels from now on go to it too.
    pub fn set_current_stream(&self, stream: StreamId) {
        self.stream.set(stream);
        self.backend.set_stream(stream);
    }

    /// Whether this device's CUDA context exists: on a GPU, whether this process created its
    /// primary context; on the simulated device, whether a call that needs one was made
    /// (the model's own account, which its NVML view shows). Asking creates nothing.
    pub fn has_context(&self) -> bool {
        match &self.origin {
            DeviceOrigin::Cuda(gpu) => gpu.has_context(),
            // The simulated device lists this process as NVML would: only once its context
            // exists.
            DeviceOrigin::Sim(_) => !self.allocator().device().process_memory().is_empty(),
        }
    }

    /// Creates the device's CUDA context if it does not exist yet, as CUDA 12's
    /// `cudaSetDevice` does and every call that runs work on the device. Asks for
    /// `cudaMemGetInfo`, which needs the context on either kind of device.
    pub fn ensure_context(&self) -> Result<(), DeviceError> {
        self.mem_get_info().map(|_| ())
    }

    /// `cudaMemGetInfo`: (free, total) bytes of the device. Creates the context if needed.
    pub fn mem_get_info(&self) -> Result<(u64, u64), DeviceError> {
        self.allocator().device().mem_get_info()
    }

    /// Copies `src`, a span of `source`'s device, into `dst` on this runtime's device: a
    /// device-to-device copy between two GPUs, after the source device's current stream (which
    /// may still be writing `src`) has finished; or on simulated devices nothing to do (the
    /// caller carries the recorded contents over).
    pub fn copy_from(
        &self,
        dst: &Span<'_>,
        source: &Runtime,
        src: &Span<'_>,
    ) -> Result<(), TensorError> {
        match (&self.origin, &source.origin) {
            (DeviceOrigin::Sim(_), DeviceOrigin::Sim(_)) => Ok(()),
            (DeviceOrigin::Cuda(to), DeviceOrigin::Cuda(from)) => {
                source.finish_current_stream()?;
                cuda_backend::copy_between_gpus(to, dst, from, src)
            }
            _ => Err(TensorError::Unsupported(format!(
                "cannot copy between {} and {}: a session's devices are all simulated or all CUDA",
                source.label, self.label
            ))),
        }
    }

    /// `torch.manual_seed(seed)`: restarts the generator's stream at `seed`.
    pub fn manual_seed(&self, seed: u64) {
        self.seed.set(seed);
        self.philox_offset.set(0);
    }

    /// The current seed.
    pub fn seed(&self) -> u64 {
        self.seed.get()
    }

    /// Reserves `count` random values from the generator's stream: returns the (seed, offset)
    /// a counter-based generator starts from, and advances the offset past them, rounded up
    /// to a whole block of four so the next tensor starts on a block boundary.
    pub fn take_random(&self, count: u64) -> (u64, u64) {
        let offset = self.philox_offset.get();
        let advance = count.div_ceil(RANDOM_BLOCK).wrapping_mul(RANDOM_BLOCK);
        self.philox_offset.set(offset.wrapping_add(advance));
        (self.seed.get(), offset)
    }
}

impl DeviceOrigin {
    /// The device as a process that never used it sees it: a fresh simulated GPU like the
    /// original, or the same CUDA GPU (its own segments, the process's one context).
    fn fresh_device(&self) -> Box<dyn DeviceMemory> {
        match self {
            DeviceOrigin::Sim(device) => Box::new(device.fresh()),
            DeviceOrigin::Cuda(gpu) => Box::new(CudaDevice::new(Arc::clone(gpu))),
        }
    }
}

/// What a storage holds, as far as gpumem knows it without reading the device. On the
/// simulated device this is the only source of values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Contents {
    /// Never written (`empty`).
    Uninitialized,
    /// Standard normal values from the counter-based generator at (seed, offset).
    Normal {
        /// Generator seed.
        seed: u64,
        /// Index of the first value in the generator's stream.
        offset: u64,
    },
    /// Every element equal to this value (`zeros`, `ones`, `full`).
    Constant(f64),
    /// Written by a computation whose result only the device holds.
    Computed,
}

/// A block of device memory owned by one or more tensors.
pub struct Storage {
    runtime: Rc<Runtime>,
    /// The [`CachingAllocator::id`] of the allocator that handed out `allocation`.
    owner: u64,
    allocation: Allocation,
    nbytes: u64,
    contents: Cell<Contents>,
}

impl Storage {
    /// The device address of the first byte (0 for an empty tensor).
    pub fn data_ptr(&self) -> u64 {
        self.allocation.ptr.addr()
    }

    /// Bytes the tensor asked for (unrounded).
    pub fn nbytes(&self) -> u64 {
        self.nbytes
    }

    /// What the storage holds.
    pub fn contents(&self) -> Contents {
        self.contents.get()
    }

    /// Records what the storage now holds.
    pub fn set_contents(&self, contents: Contents) {
        self.contents.set(contents);
    }

    /// The runtime whose allocator owns the block.
    pub fn runtime(&self) -> &Rc<Runtime> {
        &self.runtime
    }

    /// The storage's device memory, borrowed for as long as the storage is: what kernel
    /// launches on its tensors write and read.
    pub(crate) fn device_span(&self) -> DeviceSpan<'_> {
        // SAFETY: `allocation` is the block the allocator handed out for this storage, from
        // its device's memory (its address derived from the segment's by the allocator),
        // holding at least `nbytes` bytes (the request it was rounded up from). It goes back
        // to its allocator only when the storage drops, which the borrow of `self` rules out
        // while the span lives, and its allocator lives as long as the runtime this storage
        // holds.
        unsafe { DeviceSpan::new(self.allocation.ptr, self.nbytes) }
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        // A storage is dropped only from script code, never while the allocator is borrowed;
        // if that ever happened the block would stay allocated, which stats would show.
        if let Err(error) = self.runtime.free_into_owner(self.owner, self.allocation) {
            eprintln!("gpumem: internal error returning a tensor's block: {error}");
        }
    }
}

/// A view of storage: shape, dtype and the element offset where the view starts.
#[derive(Clone)]
pub struct Tensor {
    storage: Rc<Storage>,
    shape: Vec<usize>,
    dtype: DType,
    offset: usize,
}

impl Tensor {
    /// Allocates an uninitialised tensor (`torch.empty`).
    pub fn empty(
        runtime: &Rc<Runtime>,
        shape: &[usize],
        dtype: DType,
    ) -> Result<Tensor, TensorError> {
        let nbytes = shape::nbytes(shape, dtype.size())?;
        let (owner, allocation) = runtime.malloc(nbytes)?;
        Ok(Tensor {
            storage: Rc::new(Storage {
                runtime: Rc::clone(runtime),
                owner,
                allocation,
                nbytes,
                contents: Cell::new(Contents::Uninitialized),
            }),
            shape: shape.to_vec(),
            dtype,
            offset: 0,
        })
    }

    /// A tensor with every element `value` (`torch.full`; `zeros`/`ones` are 0 and 1).
    pub fn full(
        runtime: &Rc<Runtime>,
        shape: &[usize],
        value: f64,
        dtype: DType,
    ) -> Result<Tensor, TensorError> {
        convert::check_representable(dtype, value)?;
        let tensor = Tensor::empty(runtime, shape, dtype)?;
        runtime.backend().fill(&tensor.span()?, value)?;
        tensor.storage.set_contents(Contents::Constant(value));
        Ok(tensor)
    }

    /// Standard normal values from the session's generator (`torch.randn`). Floating dtypes
    /// only, as in PyTorch.
    pub fn randn(
        runtime: &Rc<Runtime>,
        shape: &[usize],
        dtype: DType,
    ) -> Result<Tensor, TensorError> {
        if !dtype.is_float() {
            return Err(TensorError::Unsupported(format!(
                "randn is only defined for floating dtypes, not {dtype}"
            )));
        }
        let tensor = Tensor::empty(runtime, shape, dtype)?;
        let (seed, offset) = runtime.take_random(tensor.numel() as u64);
        runtime.backend().randn(&tensor.span()?, seed, offset)?;
        tensor
            .storage
            .set_contents(Contents::Normal { seed, offset });
        Ok(tensor)
    }

    /// The dimensions.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Bytes of this view's elements.
    pub fn nbytes(&self) -> u64 {
        (self.numel() * self.dtype.size()) as u64
    }

    /// Address of this view's first element.
    pub fn data_ptr(&self) -> u64 {
        if self.storage.data_ptr() == 0 {
            0
        } else {
            self.storage.data_ptr() + (self.offset * self.dtype.size()) as u64
        }
    }

    /// Element offset of this view into its storage.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The storage this tensor views.
    pub fn storage(&self) -> &Rc<Storage> {
        &self.storage
    }

    /// The runtime the tensor belongs to.
    pub fn runtime(&self) -> &Rc<Runtime> {
        &self.storage.runtime
    }

    /// The elements this view covers, as the backend sees them, borrowed from the storage:
    /// the part of the storage's device memory the view covers (an error, never expected, when
    /// the view does not lie inside its storage).
    pub fn span(&self) -> Result<Span<'_>, TensorError> {
        let start = (self.offset as u64)
            .checked_mul(self.dtype.size() as u64)
            .ok_or_else(|| TensorError::OutOfRange(format!("element {}", self.offset)))?;
        let memory = self.storage.device_span().part(start, self.nbytes())?;
        Span::new(
            memory,
            self.numel(),
            self.dtype,
            self.storage.contents(),
            self.offset as u64,
        )
    }

    /// Whether the view covers its whole storage from the start.
    pub fn is_whole_storage(&self) -> bool {
        self.offset == 0 && self.nbytes() == self.storage.nbytes
    }

    /// The device label (`sim`, `sim:1`, `cuda:0`).
    pub fn device(&self) -> &str {
        self.storage.runtime.device_label()
    }

    /// A view with another shape of the same element count, sharing storage.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor, TensorError> {
        if shape::numel(shape)? != self.numel() {
            return Err(TensorError::BadShape(format!(
                "cannot reshape a tensor of {} elements ({:?}) into {:?}",
                self.numel(),
                self.shape,
                shape
            )));
        }
        Ok(Tensor {
            shape: shape.to_vec(),
            ..self.clone()
        })
    }

    /// A view of `start..end` along dimension 0 sharing storage (PyTorch's `narrow` on the
    /// outermost dimension; inner dimensions would not be contiguous).
    pub fn slice(&self, dim: usize, start: usize, end: usize) -> Result<Tensor, TensorError> {
        if dim >= self.shape.len() {
            return Err(TensorError::OutOfRange(format!(
                "dimension {dim} of a tensor with {} dimensions",
                self.shape.len()
            )));
        }
        if dim != 0 && self.shape[..dim].iter().any(|&d| d != 1) {
            return Err(TensorError::Unsupported(
                "slice supports dimension 0 (or a dimension preceded only by size-1 dimensions), which keeps the view contiguous".into(),
            ));
        }
        let size = self.shape[dim];
        if start > end || end > size {
            return Err(TensorError::OutOfRange(format!(
                "slice {start}..{end} of dimension {dim} with size {size}"
            )));
        }
        let inner: usize = self.shape[dim + 1..].iter().product();
        let mut shape = self.shape.clone();
        shape[dim] = end - start;
        Ok(Tensor {
            storage: Rc::clone(&self.storage),
            shape,
            dtype: self.dtype,
            offset: self.offset + start * inner,
        })
    }
}

impl fmt::Display for Tensor {
    /// `tensor(shape=[2, 3], dtype=float32, device=cuda:0, 24 bytes, [0.1234, -1.2345, ...])`:
    /// every value of a small tensor, the first and last three of a large one
    /// ([`ops::ShownValues`]); the values appear only where the device can read them (never for
    /// `empty` tensors).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tensor(shape={:?}, dtype={}, device={}, {}",
            self.shape,
            self.dtype,
            self.device(),
            format_size(self.nbytes())
        )?;
        let text = |values: &[f64]| -> Vec<String> {
            values
                .iter()
                .map(|&value| ops::format_value(self.dtype, value))
                .collect()
        };
        let parts = match self.shown_values() {
            Some(ops::ShownValues::All(values)) => Some(text(&values)),
            Some(ops::ShownValues::Ends(head, tail)) => {
                Some([text(&head), vec!["...".into()], text(&tail)].concat())
            }
            None => None,
        };
        if let Some(parts) = parts {
            write!(f, ", [{}]", parts.join(", "))?;
        }
        f.write_str(")")
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}
