//! A real CUDA GPU through cudarc: one process-wide handle per device ([`CudaGpu`]) holding the
//! device's primary context (created lazily, on the first call that needs it), the compiled
//! value kernels and NVML's view of the device; and the [`DeviceMemory`] the caching allocator
//! draws segments from ([`CudaDevice`]): plain `cuMemAlloc`/`cuMemFree`, exactly as PyTorch's
//! allocator gets them from `cudaMalloc`/`cudaFree`, the driver's free/total figures, and real
//! streams and events for the allocator's stream rules (`record_stream`, `wait_stream`,
//! `gpu_sleep`).
//!
//! Stream-ordered pools, managed memory and cudarc's `CudaSlice` are deliberately not used: they
//! would hide segments in the driver's own pool, out of the allocator's (and NVML's) sight.
//!
//! Layers: `driver` wraps the driver API (the only caller of `cudarc::driver`), `nvrtc` the
//! compiler; this module owns the handles; `kernels` launches kernels through them.
//!
//! Set `GPUMEM_LOG=cuda` to have one line on stderr for the context's creation and for each
//! NVRTC compilation, with its time.

pub(crate) mod driver;
pub(crate) mod kernels;
pub(crate) mod nvrtc;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

pub use driver::MIN_DRIVER_VERSION;
pub(crate) use driver::{Current, Marker, Module, PhysicalMemory, PrimaryContext, Stream};

use super::nvml::DriverView;
use super::{
    DeviceError, DeviceMemory, DevicePtr, DriverMemory, MemorySpace, ProcessMemory, StreamEvent,
};
use kernels::Kernels;

/// The environment variable naming what gpumem logs on stderr (comma-separated topics).
const LOG_VARIABLE: &str = "GPUMEM_LOG";
/// The [`LOG_VARIABLE`] topic for the CUDA layer.
const LOG_TOPIC: &str = "cuda";

/// Whether `GPUMEM_LOG` names the `cuda` topic (read once per process).
fn logging() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| {
        std::env::var(LOG_VARIABLE).is_ok_and(|value| {
            value
                .split(',')
                .any(|topic| topic.trim().eq_ignore_ascii_case(LOG_TOPIC))
        })
    })
}

/// Prints one `gpumem[cuda]: ...` line on stderr when [`logging`] is on.
fn log(message: impl FnOnce() -> String) {
    if logging() {
        eprintln!("gpumem[{LOG_TOPIC}]: {}", message());
    }
}

/// Locks `mutex`, ignoring poisoning: the mutexes here guard no data, only one-time
/// initialisation that a panicking thread cannot have left half done.
fn lock(mutex: &Mutex<()>) -> MutexGuard<'_, ()> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// One CUDA device and, once something needed them, its primary context and compiled kernels.
///
/// There is one per device per process ([`CudaGpu::open`] hands out the same `Arc`), shared by
/// every session and thread — the [`CudaDevice`] each allocator owns and the tensor layer's
/// CUDA backend — so the process has one context, one kernel module and one NVML baseline per
/// device, as PyTorch has. Each thread that uses it makes the context current on itself
/// (`CudaGpu::activate`).
pub struct CudaGpu {
    device: driver::Device,
    name: String,
    total: u64,
    compute_capability: (i32, i32),
    /// Streaming multiprocessors (sizes grid-stride launches).
    multiprocessors: u32,
    /// Declared before `context`, so the module is unloaded before the context is released.
    kernels: OnceLock<Kernels>,
    context: OnceLock<Arc<PrimaryContext>>,
    /// Serialise the creation of `context`, resp. the compilation of `kernels`, so threads
    /// starting at once create and compile once.
    context_init: Mutex<()>,
    kernels_init: Mutex<()>,
    /// NVRTC compilations this handle made (each logged under `GPUMEM_LOG=cuda`).
    compiles: AtomicUsize,
    /// The CUDA streams behind the allocator's stream ids 1.. (0 is the legacy default stream),
    /// created on first use and shared by every session of the process, as PyTorch's pool of
    /// streams per device is.
    streams: Mutex<BTreeMap<u64, Stream>>,
    /// NVML's view of the device, opened before the context existed so its baseline excludes
    /// it; the reason when NVML is unavailable.
    driver_view: Result<DriverView, DeviceError>,
}

/// The handles opened so far, one per device.
static OPENED: Mutex<Vec<Arc<CudaGpu>>> = Mutex::new(Vec::new());

impl CudaGpu {
    /// The process-wide handle of device `ordinal`. The first call finds the device and reads
    /// NVML's baseline without creating a context; it fails with [`DeviceError::Unavailable`]
    /// when the driver library or one of its symbols is missing or the driver is older than
    /// [`MIN_DRIVER_VERSION`], and with [`DeviceError::NoSuchDevice`] when there is no device
    /// `ordinal`. Failures are not remembered: a later call tries again.
    pub fn open(ordinal: usize) -> Result<Arc<CudaGpu>, DeviceError> {
        let mut opened = OPENED
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(gpu) = opened.iter().find(|gpu| gpu.ordinal() == ordinal) {
            return Ok(Arc::clone(gpu));
        }
        let gpu = Arc::new(Self::find(ordinal)?);
        opened.push(Arc::clone(&gpu));
        Ok(gpu)
    }

    /// How many CUDA devices this process can use: the driver's count, which honours
    /// `CUDA_VISIBLE_DEVICES`. Creates no context; fails as [`CudaGpu::open`] does when the
    /// driver is unusable.
    pub fn count() -> Result<usize, DeviceError> {
        driver::init()?;
        driver::device_count()
    }

    /// Looks device `ordinal` up and opens NVML's view of it (before any context exists, so the
    /// view's baseline leaves the context out).
    fn find(ordinal: usize) -> Result<CudaGpu, DeviceError> {
        driver::init()?;
        let device = driver::Device::get(ordinal)?;
        let uuid = device.uuid()?;
        let major = device.attribute(driver::Attribute::ComputeCapabilityMajor)?;
        let minor = device.attribute(driver::Attribute::ComputeCapabilityMinor)?;
        let multiprocessors = device.attribute(driver::Attribute::MultiprocessorCount)?;
        let driver_view = DriverView::open(&uuid, ordinal);
        Ok(CudaGpu {
            device,
            name: device.name()?,
            total: device.total_memory()?,
            compute_capability: (major, minor),
            multiprocessors: u32::try_from(multiprocessors).unwrap_or(0).max(1),
            kernels: OnceLock::new(),
            context: OnceLock::new(),
            context_init: Mutex::new(()),
            kernels_init: Mutex::new(()),
            compiles: AtomicUsize::new(0),
            streams: Mutex::new(BTreeMap::new()),
            driver_view,
        })
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.device.ordinal()
    }

    /// The marketing name (`NVIDIA H200`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `(major, minor)` compute capability.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.compute_capability
    }

    /// Streaming multiprocessors.
    pub fn multiprocessors(&self) -> u32 {
        self.multiprocessors
    }

    /// The primary context, created (retained) on first use.
    pub(crate) fn context(&self) -> Result<&Arc<PrimaryContext>, DeviceError> {
        if let Some(context) = self.context.get() {
            return Ok(context);
        }
        let _creating = lock(&self.context_init);
        if let Some(context) = self.context.get() {
            return Ok(context);
        }
        let start = Instant::now();
        let context = Arc::new(PrimaryContext::retain(self.device)?);
        log(|| {
            format!(
                "created the primary context of cuda:{} in {:.1} ms",
                self.ordinal(),
                start.elapsed().as_secs_f64() * 1e3
            )
        });
        Ok(self.context.get_or_init(|| context))
    }

    /// Whether this process created the device's primary context yet (some call needed it).
    /// Asks nothing of the driver, so asking creates nothing.
    pub fn has_context(&self) -> bool {
        self.context.get().is_some()
    }

    /// Makes the device's primary context current on this thread (creating it on first use)
    /// and returns the proof that calls needing it take. Every call that touches the device
    /// goes through here.
    pub(crate) fn activate(&self) -> Result<Current<'_>, DeviceError> {
        self.context()?.current()
    }

    /// The CUDA stream behind the allocator's stream `id`: the legacy default stream for 0,
    /// else a non-blocking stream created (with the context, if need be) the first time any
    /// session of the process names `id`, then the same one every time.
    pub(crate) fn stream(&self, id: u64) -> Result<Stream, DeviceError> {
        if id == 0 {
            return Ok(Stream::LEGACY_DEFAULT);
        }
        let mut streams = self
            .streams
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(stream) = streams.get(&id) {
            return Ok(*stream);
        }
        let stream = self.activate()?.create_stream()?;
        streams.insert(id, stream);
        Ok(stream)
    }

    /// [`CudaGpu::activate`], with kernel launches and copies going to the allocator's stream
    /// `id` ([`CudaGpu::stream`]).
    pub(crate) fn activate_on(&self, id: u64) -> Result<Current<'_>, DeviceError> {
        let stream = self.stream(id)?;
        Ok(self.activate()?.on(stream))
    }

    /// Waits until every kernel launched on the device has finished (`cuCtxSynchronize`);
    /// kernel launches return before the kernel runs. Nothing to wait for without a context.
    pub fn synchronize(&self) -> Result<(), DeviceError> {
        match self.context.get() {
            Some(context) => context.current()?.synchronize(),
            None => Ok(()),
        }
    }

    /// Compiles `source` (named `name` in messages and logs) with NVRTC for this device and
    /// loads it into the primary context. Counted (`compiles`) and, under
    /// `GPUMEM_LOG=cuda`, logged with its time.
    pub(crate) fn compile_module(
        &self,
        source: &str,
        name: &str,
    ) -> Result<Arc<Module>, DeviceError> {
        let context = self.context()?;
        let start = Instant::now();
        let ptx = nvrtc::compile(source, name, self.compute_capability)?;
        let compiled = start.elapsed();
        let module = Module::load_ptx(context, &ptx)?;
        let count = self.compiles.fetch_add(1, Ordering::Relaxed) + 1;
        log(|| {
            let (major, minor) = self.compute_capability;
            format!(
                "compiled {name} for compute_{major}{minor} with NVRTC in {:.1} ms, loaded in {:.1} ms (compilation {count} of this process)",
                compiled.as_secs_f64() * 1e3,
                (start.elapsed() - compiled).as_secs_f64() * 1e3
            )
        });
        Ok(module)
    }

    /// NVRTC compilations made so far through this handle (the production kernels once, plus
    /// one per `gpumem bench randn` run).
    #[cfg(feature = "bench-internals")]
    pub(crate) fn compiles(&self) -> usize {
        self.compiles.load(Ordering::Relaxed)
    }

    /// The value kernels, compiled for this device on first use: once per process, whichever
    /// thread or session asks first (the others wait for it).
    pub(crate) fn kernels(&self) -> Result<&Kernels, DeviceError> {
        if let Some(kernels) = self.kernels.get() {
            return Ok(kernels);
        }
        let _compiling = lock(&self.kernels_init);
        if let Some(kernels) = self.kernels.get() {
            return Ok(kernels);
        }
        let module = self.compile_module(&kernels::production_source(), kernels::SOURCE_NAME)?;
        let kernels = Kernels::load(&module, self.multiprocessors)?;
        Ok(self.kernels.get_or_init(|| kernels))
    }
}

/// The [`DeviceMemory`] of a CUDA GPU: what the caching allocator draws segments from —
/// `cuMemAlloc` segments, and for expandable segments reserved address ranges with one
/// `cuMemCreate` allocation mapped per page — and the events it waits for before reusing a
/// block another stream used.
pub struct CudaDevice {
    gpu: Arc<CudaGpu>,
    /// Events recorded for the allocator and not yet seen complete, by the ticket of the
    /// [`StreamEvent`] handed out for each. A ticket missing here was seen complete (its event
    /// is destroyed), so it counts as complete. Behind a mutex because `query_event` reads
    /// through `&self` and drops what completed.
    events: Mutex<BTreeMap<u64, Marker>>,
    /// The ticket of the next recorded event.
    next_ticket: u64,
    /// Segments this device allocated (`cuMemAlloc`) and has not freed, by address: only these
    /// are freed, so a segment of another allocator on the same GPU is never freed from under
    /// it.
    segments: BTreeSet<u64>,
    /// Reserved address ranges (`cuMemAddressReserve`): base → (its address, bytes).
    reservations: BTreeMap<u64, (DevicePtr, u64)>,
    /// Physical pages mapped into those ranges: page address → (its address, its allocation),
    /// released (`cuMemRelease`) when removed after `cuMemUnmap`.
    pages: BTreeMap<u64, (DevicePtr, PhysicalMemory)>,
}

impl CudaDevice {
    /// The device of `gpu`.
    pub fn new(gpu: Arc<CudaGpu>) -> CudaDevice {
        CudaDevice {
            gpu,
            events: Mutex::new(BTreeMap::new()),
            next_ticket: 1,
            segments: BTreeSet::new(),
            reservations: BTreeMap::new(),
            pages: BTreeMap::new(),
        }
    }

    /// Whose memory this device's addresses are.
    fn space(&self) -> MemorySpace {
        MemorySpace::cuda(self.gpu.ordinal())
    }

    /// Checks that `[address, address + bytes)` is whole pages of `page` bytes inside one
    /// reservation, counted from its base; returns the number of pages.
    fn page_run(&self, address: u64, bytes: u64, page: u64) -> Result<u64, DeviceError> {
        let refuse = |why: &str| {
            Err(DeviceError::InvalidArgument(format!(
                "pages [{address:#x}, +{bytes}) of {page} bytes: {why}"
            )))
        };
        if page == 0 || bytes == 0 || !bytes.is_multiple_of(page) {
            return refuse("not a whole number of pages");
        }
        let Some((&base, &(_, size))) = self.reservations.range(..=address).next_back() else {
            return refuse("not inside a reserved range");
        };
        let end = address.checked_add(bytes);
        if end.is_none_or(|end| end > base + size) || !(address - base).is_multiple_of(page) {
            return refuse("not whole pages inside one reserved range");
        }
        Ok(bytes / page)
    }

    /// The events not yet seen complete (poisoning ignored: the map is consistent after every
    /// statement).
    fn events(&self) -> MutexGuard<'_, BTreeMap<u64, Marker>> {
        self.events
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Unmaps and releases the given pages of `mapped` (after the device finished its work).
    fn unmap_each(
        mapped: &mut BTreeMap<u64, (DevicePtr, PhysicalMemory)>,
        current: &Current<'_>,
        pages: &[u64],
    ) -> Result<(), DeviceError> {
        let mut first_error = Ok(());
        for address in pages {
            if let Some((at, memory)) = mapped.remove(address) {
                // SAFETY: the page was mapped by `map_pages` and is unmapped once, here; the
                // caller synchronised, so no queued work uses it.
                let unmapped = unsafe { current.unmap(at, memory.bytes()) };
                if unmapped.is_err() && first_error.is_ok() {
                    first_error = unmapped;
                }
                // `memory` drops here: cuMemRelease frees the page once it is unmapped.
            }
        }
        first_error
    }
}

/// The addresses of the `count` pages of `page` bytes that make up `[start, start + bytes)`,
/// each derived from `start` by a checked offset.
fn page_addresses(
    start: DevicePtr,
    bytes: u64,
    page: u64,
    count: u64,
) -> Result<Vec<DevicePtr>, DeviceError> {
    (0..count)
        .map(|index| {
            index
                .checked_mul(page)
                .and_then(|offset| start.offset_within(bytes, offset, page))
                .ok_or_else(|| {
                    DeviceError::InvalidArgument(format!(
                        "page {index} of {page} bytes lies outside [{start:#x}, +{bytes})"
                    ))
                })
        })
        .collect()
}

impl DeviceMemory for CudaDevice {
    fn malloc(&mut self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        let segment = self.gpu.activate()?.mem_alloc(bytes)?;
        self.segments.insert(segment.addr());
        Ok(segment)
    }

    fn free(&mut self, segment: DevicePtr) -> Result<(), DeviceError> {
        let address = segment.addr_in(self.space(), "cuMemFree")?;
        if !self.segments.contains(&address) {
            return Err(DeviceError::InvalidArgument(format!(
                "cuMemFree of {address:#x}, which is not a segment of this device"
            )));
        }
        let current = self.gpu.activate()?;
        // As cudaFree does: work queued on any stream may still use the segment's blocks.
        current.synchronize()?;
        // SAFETY: a segment `malloc` returned (checked above), freed once (forgotten below);
        // the allocator frees only segments no tensor uses, and the device finished every
        // queued kernel above.
        unsafe { current.mem_free(segment) }?;
        self.segments.remove(&address);
        Ok(())
    }

    fn mem_get_info(&self) -> Result<(u64, u64), DeviceError> {
        self.gpu.activate()?.mem_get_info()
    }

    fn total_memory(&self) -> u64 {
        self.gpu.total
    }

    fn index(&self) -> usize {
        self.gpu.ordinal()
    }

    fn process_memory(&self) -> Vec<ProcessMemory> {
        match &self.gpu.driver_view {
            Ok(view) => view.processes().unwrap_or_default(),
            Err(_) => Vec::new(),
        }
    }

    fn label(&self) -> String {
        format!("cuda:{}", self.gpu.ordinal())
    }

    fn driver_memory(&self) -> Result<DriverMemory, DeviceError> {
        match &self.gpu.driver_view {
            Ok(view) => view.read(),
            Err(reason) => Err(DeviceError::Unavailable(format!(
                "NVML is unavailable: {reason}"
            ))),
        }
    }

    fn allocation_granularity(&self) -> Result<u64, DeviceError> {
        self.gpu.activate()?.allocation_granularity()
    }

    fn reserve_address_range(&mut self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        let base = self.gpu.activate()?.address_reserve(bytes)?;
        self.reservations.insert(base.addr(), (base, bytes));
        Ok(base)
    }

    fn free_address_range(&mut self, range: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        let base = range.addr_in(self.space(), "cuMemAddressFree")?;
        if self.reservations.get(&base).map(|&(_, size)| size) != Some(bytes) {
            return Err(DeviceError::InvalidArgument(format!(
                "no reserved range of {bytes} bytes at {base:#x}"
            )));
        }
        if self.pages.range(base..base + bytes).next().is_some() {
            return Err(DeviceError::InvalidArgument(format!(
                "the range at {base:#x} still has mapped pages"
            )));
        }
        let current = self.gpu.activate()?;
        // SAFETY: exactly a reservation made by `reserve_address_range`, with nothing mapped.
        unsafe { current.address_free(range, bytes) }?;
        self.reservations.remove(&base);
        Ok(())
    }

    fn map_pages(&mut self, start: DevicePtr, bytes: u64, page: u64) -> Result<(), DeviceError> {
        let address = start.addr_in(self.space(), "cuMemMap")?;
        let count = self.page_run(address, bytes, page)?;
        let addresses = page_addresses(start, bytes, page, count)?;
        if let Some(mapped) = addresses
            .iter()
            .find(|at| self.pages.contains_key(&at.addr()))
        {
            return Err(DeviceError::InvalidArgument(format!(
                "the page at {mapped:#x} is already mapped"
            )));
        }
        let gpu = Arc::clone(&self.gpu);
        let current = gpu.activate()?;
        // All or nothing, as PyTorch's ExpandableSegment::map: create every page first; on
        // failure the pages created so far are released by dropping them.
        let mut created = Vec::with_capacity(addresses.len());
        for _ in &addresses {
            created.push(current.mem_create(page)?);
        }
        let mut mapped = Vec::with_capacity(addresses.len());
        let mut outcome = Ok(());
        for (&at, memory) in addresses.iter().zip(created) {
            // SAFETY: `at` is a whole page inside a reservation (checked above) and unmapped.
            match unsafe { current.map(at, &memory) } {
                Ok(()) => {
                    self.pages.insert(at.addr(), (at, memory));
                    mapped.push(at.addr());
                }
                Err(error) => {
                    outcome = Err(error);
                    break;
                }
            }
        }
        if outcome.is_ok() {
            // SAFETY: every page of the range was just mapped.
            outcome = unsafe { current.set_access(start, bytes) };
        }
        if let Err(error) = outcome {
            // Undo what this call mapped; the error of the mapping is the one to report.
            let _ = Self::unmap_each(&mut self.pages, &current, &mapped);
            return Err(error);
        }
        Ok(())
    }

    fn unmap_pages(&mut self, start: DevicePtr, bytes: u64, page: u64) -> Result<(), DeviceError> {
        let address = start.addr_in(self.space(), "cuMemUnmap")?;
        let count = self.page_run(address, bytes, page)?;
        let addresses: Vec<u64> = page_addresses(start, bytes, page, count)?
            .iter()
            .map(|at| at.addr())
            .collect();
        if let Some(missing) = addresses.iter().find(|a| !self.pages.contains_key(a)) {
            return Err(DeviceError::InvalidArgument(format!(
                "the page at {missing:#x} is not mapped"
            )));
        }
        let gpu = Arc::clone(&self.gpu);
        let current = gpu.activate()?;
        // As PyTorch does before unmapping: the pages may still be in use by queued work.
        current.synchronize()?;
        Self::unmap_each(&mut self.pages, &current, &addresses)
    }

    fn record_event(&mut self, stream: u64) -> Result<StreamEvent, DeviceError> {
        let on = self.gpu.stream(stream)?;
        let marker = self.gpu.context()?.record_marker(on)?;
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.events().insert(ticket, marker);
        Ok(StreamEvent { stream, ticket })
    }

    fn query_event(&self, event: StreamEvent) -> Result<bool, DeviceError> {
        let mut events = self.events();
        let Some(marker) = events.get(&event.ticket) else {
            return Ok(true);
        };
        let done = marker.is_done()?;
        if done {
            events.remove(&event.ticket);
        }
        Ok(done)
    }

    fn synchronize_event(&mut self, event: StreamEvent) -> Result<(), DeviceError> {
        let mut events = self.events();
        if let Some(marker) = events.get(&event.ticket) {
            marker.wait()?;
            events.remove(&event.ticket);
        }
        Ok(())
    }

    fn synchronize_stream(&mut self, stream: u64) -> Result<(), DeviceError> {
        // Without a context nothing was ever queued; waiting must not create one.
        if !self.gpu.has_context() {
            return Ok(());
        }
        let on = self.gpu.stream(stream)?;
        self.gpu.activate()?.synchronize_stream(on)
    }

    fn synchronize_device(&mut self) -> Result<(), DeviceError> {
        self.gpu.synchronize()
    }

    fn wait_stream(&mut self, stream: u64, other: u64) -> Result<(), DeviceError> {
        if stream == other {
            return Ok(());
        }
        let (waiter, waited) = (self.gpu.stream(stream)?, self.gpu.stream(other)?);
        self.gpu.activate()?.wait_stream(waiter, waited)
    }

    fn sleep(&mut self, stream: u64, millis: u64) -> Result<(), DeviceError> {
        let current = self.gpu.activate_on(stream)?;
        self.gpu.kernels()?.sleep(&current, millis)
    }
}

impl Drop for CudaDevice {
    /// Returns whatever the allocator left mapped or reserved (it releases everything when
    /// dropped, so normally nothing): pages first, then their ranges.
    fn drop(&mut self) {
        if self.pages.is_empty() && self.reservations.is_empty() {
            return;
        }
        let gpu = Arc::clone(&self.gpu);
        let Ok(current) = gpu.activate() else {
            return;
        };
        let _ = current.synchronize();
        let pages: Vec<u64> = self.pages.keys().copied().collect();
        let _ = Self::unmap_each(&mut self.pages, &current, &pages);
        for &(base, bytes) in self.reservations.values() {
            // SAFETY: a reservation of ours with every page unmapped above; a failure leaves
            // the range to the driver, which reclaims it at process exit.
            let _ = unsafe { current.address_free(base, bytes) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_handle_is_shared_across_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<CudaGpu>();
        assert_send_sync::<Arc<CudaGpu>>();
        assert_send_sync::<Kernels>();
    }

    #[test]
    fn log_lines_name_their_topic() {
        assert_eq!(LOG_VARIABLE, "GPUMEM_LOG");
        assert_eq!(LOG_TOPIC, "cuda");
    }

    #[test]
    fn opening_without_a_usable_gpu_is_a_typed_error_every_time() {
        // Where CUDA works this opens the device; elsewhere (CI) it must say why, the same way on
        // every call, without panicking and without caching the failure.
        match (CudaGpu::open(0), CudaGpu::open(0)) {
            (Ok(first), Ok(second)) => assert!(Arc::ptr_eq(&first, &second)),
            (Err(first), Err(second)) => {
                assert_eq!(first, second);
                assert!(
                    matches!(
                        first,
                        DeviceError::Unavailable(_) | DeviceError::NoSuchDevice { .. }
                    ),
                    "{first:?}"
                );
            }
            (first, second) => panic!("{:?} then {:?}", first.err(), second.err()),
        }
    }
}
