//! Unit tests of the allocator's rules, with the figures PyTorch 2.11 gave on the H200.

use super::*;
use crate::device::sim::{SimDevice, H200_TOTAL_MEMORY as H200_TOTAL};
use crate::device::{DeviceError, DeviceMemory, DevicePtr, ProcessMemory};
use std::cell::Cell;
use std::rc::Rc;

fn allocator(conf: &str) -> CachingAllocator {
    let conf = AllocConf::parse(conf).expect("valid config");
    CachingAllocator::new(Box::new(SimDevice::h200()), conf).expect("allocator")
}

fn get(allocator: &CachingAllocator, key: &str) -> i64 {
    allocator.stats().get(key).expect(key)
}

/// A sim device seen through the plain device interface: it counts its live segments where a
/// test can see them, and has no virtual-memory calls (as a device without them) unless given
/// a granularity, which may be one that does not divide PyTorch's pages.
struct WrappedSim {
    sim: SimDevice,
    live: Rc<Cell<i64>>,
    granularity: Option<u64>,
}

impl WrappedSim {
    fn new(sim: SimDevice, granularity: Option<u64>) -> WrappedSim {
        WrappedSim {
            sim,
            live: Rc::new(Cell::new(0)),
            granularity,
        }
    }
}

impl DeviceMemory for WrappedSim {
    fn malloc(&mut self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        let address = self.sim.malloc(bytes)?;
        self.live.set(self.live.get() + 1);
        Ok(address)
    }
    fn free(&mut self, segment: DevicePtr) -> Result<(), DeviceError> {
        self.live.set(self.live.get() - 1);
        self.sim.free(segment)
    }
    fn mem_get_info(&self) -> Result<(u64, u64), DeviceError> {
        self.sim.mem_get_info()
    }
    fn total_memory(&self) -> u64 {
        self.sim.total_memory()
    }
    fn index(&self) -> usize {
        0
    }
    fn process_memory(&self) -> Vec<ProcessMemory> {
        Vec::new()
    }
    fn label(&self) -> String {
        "wrapped sim".into()
    }
    fn allocation_granularity(&self) -> Result<u64, DeviceError> {
        self.granularity.ok_or_else(crate::device::vmm_unsupported)
    }
}

#[test]
fn rounds_like_pytorch() {
    let a = allocator("");
    assert_eq!(a.round_size(1), 512);
    assert_eq!(a.round_size(511), 512);
    assert_eq!(a.round_size(512), 512);
    assert_eq!(a.round_size(513), 1024);
    let p = allocator("roundup_power2_divisions:4");
    assert_eq!(p.round_size(3000), 3072);
    assert_eq!(p.round_size(1200), 1536);
    assert_eq!(p.round_size(1_331_200), 1_572_864);
    assert_eq!(p.round_size(1 << 21), 1 << 21);
}

#[test]
fn segment_sizes_follow_the_pools() {
    let a = allocator("");
    assert_eq!(a.allocation_size(512), SMALL_BUFFER);
    assert_eq!(a.allocation_size(MIB), SMALL_BUFFER);
    assert_eq!(a.allocation_size(MIB + 512), LARGE_BUFFER);
    assert_eq!(a.allocation_size(10 * MIB - 512), LARGE_BUFFER);
    assert_eq!(a.allocation_size(10 * MIB), 10 * MIB);
    assert_eq!(a.allocation_size(11 * MIB + 512), 12 * MIB);
}

/// `large_segment_size_mb` (PyTorch 2.11): the segment of a large request below 10 MiB and
/// the large pool's expandable page; requests from 10 MiB up keep their 2 MiB rounding.
#[test]
fn large_segment_size_sets_the_shared_segment_and_the_large_page() {
    let mut a = allocator("large_segment_size_mb:40");
    assert_eq!(a.allocation_size(MIB + 512), 40 * MIB);
    assert_eq!(a.allocation_size(10 * MIB), 10 * MIB);
    assert_eq!(a.allocation_size(MIB), SMALL_BUFFER);
    let x = a.malloc(5 * MIB).expect("5 MiB");
    assert_eq!(
        get(&a, "reserved_bytes.large_pool.current"),
        40 * MIB as i64
    );
    assert_eq!(
        get(&a, "inactive_split_bytes.large_pool.current"),
        35 * MIB as i64
    );
    // The 35 MiB rest takes a 30 MiB request (below 30 + 40 MiB: no max_split_size here).
    let y = a.malloc(30 * MIB).expect("30 MiB");
    assert_eq!(get(&a, "num_device_alloc"), 1);
    a.free(x).expect("free");
    a.free(y).expect("free");
    a.check_invariants().expect("consistent");

    let mut e = allocator("expandable_segments:True,large_segment_size_mb:40");
    assert_eq!(e.page_size(Pool::Large), 40 * MIB);
    assert_eq!(e.page_size(Pool::Small), SMALL_BUFFER);
    let x = e.malloc(5 * MIB).expect("5 MiB");
    assert_eq!(
        get(&e, "reserved_bytes.large_pool.current"),
        40 * MIB as i64
    );
    let y = e.malloc(50 * MIB).expect("50 MiB");
    assert_eq!(
        get(&e, "reserved_bytes.large_pool.current"),
        80 * MIB as i64
    );
    e.free(x).expect("free");
    e.free(y).expect("free");
    e.check_invariants().expect("consistent");
}

#[test]
fn small_request_splits_a_two_mib_segment() {
    let mut a = allocator("");
    let x = a.malloc(1000).expect("alloc");
    assert_eq!(get(&a, "allocated_bytes.all.current"), 1024);
    assert_eq!(get(&a, "requested_bytes.all.current"), 1000);
    assert_eq!(get(&a, "reserved_bytes.small_pool.current"), 2 * MIB as i64);
    assert_eq!(get(&a, "inactive_split.small_pool.current"), 1);
    assert_eq!(get(&a, "inactive_split_bytes.all.current"), 2_096_128);
    a.free(x).expect("free");
    assert_eq!(get(&a, "inactive_split.all.current"), 0);
    assert_eq!(get(&a, "segment.all.current"), 1);
    a.empty_cache().expect("empty");
    assert_eq!(get(&a, "segment.all.current"), 0);
    assert_eq!(get(&a, "num_device_free"), 1);
    assert_eq!(get(&a, "num_sync_all_streams"), 1);
}

#[test]
fn probe_sequence_matches_pytorch() {
    // §14 of the reference notes: 5 MiB, 15 MiB, 12 MiB, 11 MiB + 1, 1 MiB, 1 MiB + 1.
    let mut a = allocator("");
    let five = a.malloc(5 * MIB).expect("5");
    assert_eq!(
        get(&a, "inactive_split_bytes.large_pool.current"),
        15 * MIB as i64
    );
    let fifteen = a.malloc(15 * MIB).expect("15");
    assert_eq!(get(&a, "inactive_split.all.current"), 0);
    assert_eq!(get(&a, "segment.all.current"), 1);
    let _twelve = a.malloc(12 * MIB).expect("12");
    assert_eq!(get(&a, "reserved_bytes.all.current"), 33_554_432);
    let _eleven = a.malloc(11 * MIB + 1).expect("11+1");
    assert_eq!(
        get(&a, "requested_bytes.all.current"),
        (32 * MIB + 11 * MIB + 1) as i64
    );
    let _one = a.malloc(MIB).expect("1");
    assert_eq!(
        get(&a, "inactive_split_bytes.small_pool.current"),
        MIB as i64
    );
    let _one_plus = a.malloc(MIB + 1).expect("1+1");
    assert_eq!(
        get(&a, "inactive_split_bytes.large_pool.current"),
        19_922_432
    );
    a.free(five).expect("free 5");
    assert_eq!(get(&a, "inactive_split.large_pool.current"), 2);
    assert_eq!(
        get(&a, "inactive_split_bytes.large_pool.current"),
        25_165_312
    );
    a.free(fifteen).expect("free 15");
    assert_eq!(get(&a, "inactive_split.large_pool.current"), 1);
    assert_eq!(
        get(&a, "inactive_split_bytes.large_pool.current"),
        19_922_432
    );
    let merged = a
        .snapshot()
        .into_iter()
        .find(|s| s.total_size == 20 * MIB && s.allocated_size == 0)
        .expect("the merged segment");
    assert_eq!(merged.blocks.len(), 1);
    assert_eq!(merged.blocks[0].requested_size, 15 * MIB);
}

#[test]
fn zero_bytes_allocate_nothing() {
    let mut a = allocator("");
    let null = a.malloc(0).expect("zero");
    assert!(null.is_null());
    assert_eq!(get(&a, "allocation.all.allocated"), 0);
    assert_eq!(get(&a, "num_device_alloc"), 0);
    a.free(null).expect("free of null is a no-op");
}

/// A malloc told its search of the cache failed before (a replay window cut inside its OOM
/// path) makes a new segment although a cached block would serve it; the next malloc searches
/// again and takes a cached block.
#[test]
fn a_malloc_whose_cache_search_was_cut_asks_the_device() {
    let mut a = allocator("");
    let cached = a.malloc(4 << 20).expect("4 MiB");
    a.free(cached).expect("free");
    a.expect_cache_searched_before();
    let fresh = a.malloc(4 << 20).expect("a new segment");
    assert_ne!(fresh.ptr, cached.ptr);
    assert_eq!(get(&a, "num_device_alloc"), 2);
    a.malloc(4 << 20).expect("a cached block");
    assert_eq!(get(&a, "num_device_alloc"), 2);
}

#[test]
fn fraction_oom_message_and_counters() {
    let mut a = allocator("");
    a.set_memory_fraction(0.01).expect("fraction");
    let _hundred = a.malloc(100 * MIB).expect("100 MiB fits");
    let err = a.malloc(2 << 30).expect_err("2 GiB exceeds the cap");
    let AllocError::OutOfMemory(oom) = err else {
        panic!("expected OOM, got {err:?}")
    };
    assert!(oom.message.starts_with(
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.80 GiB of which "
    ));
    assert!(oom.message.contains(" 1.40 GiB allowed; Of the allocated memory 100.00 MiB is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated."));
    assert!(oom.message.contains("this process has "));
    assert_eq!(get(&a, "num_alloc_retries"), 1);
    assert_eq!(get(&a, "num_ooms"), 1);
    assert_eq!(get(&a, "num_sync_all_streams"), 1);
    assert_eq!(get(&a, "num_device_alloc"), 1);
    assert_eq!(get(&a, "allocated_bytes.all.current"), 100 * MIB as i64);
}

#[test]
fn huge_requests_are_refused_without_touching_stats() {
    let mut a = allocator("");
    let err = a.malloc(1 << 62).expect_err("too big");
    assert!(err.to_string().contains("more than 1EB"));
    assert_eq!(a.stats(), &DeviceStats::new(-1));
}

#[test]
fn oversize_blocks_are_kept_for_oversize_requests() {
    let mut a = allocator("max_split_size_mb:40");
    let fifty = a.malloc(50 * MIB).expect("50");
    assert_eq!(get(&a, "oversize_allocations.current"), 1);
    assert_eq!(get(&a, "oversize_segments.current"), 1);
    a.free(fifty).expect("free");
    let _thirty_five = a.malloc(35 * MIB).expect("35");
    assert_eq!(get(&a, "segment.all.current"), 2);
    assert_eq!(get(&a, "max_split_size"), 40 * MIB as i64);
}

#[test]
fn invalid_free_and_fraction_are_errors() {
    let mut a = allocator("");
    let x = a.malloc(4096).expect("alloc");
    a.free(x).expect("first free");
    assert!(matches!(a.free(x), Err(AllocError::InvalidFree(_))));
    assert!(matches!(
        a.set_memory_fraction(1.5),
        Err(AllocError::InvalidFraction(_))
    ));
    assert!(matches!(
        a.set_memory_fraction(f64::NAN),
        Err(AllocError::InvalidFraction(_))
    ));
}

#[test]
fn dropping_the_allocator_returns_every_segment() {
    let device = WrappedSim::new(SimDevice::h200(), None);
    let live = Rc::clone(&device.live);
    let mut a = CachingAllocator::new(Box::new(device), AllocConf::default()).expect("allocator");
    let x = a.malloc(5 * MIB).expect("5 MiB");
    let _y = a.malloc(1000).expect("1000 B");
    a.free(x).expect("free");
    assert_eq!(live.get(), 2);
    drop(a);
    assert_eq!(live.get(), 0);
}

fn expandable(device_bytes: u64) -> CachingAllocator {
    let conf = AllocConf::parse("expandable_segments:True").expect("valid config");
    CachingAllocator::new(Box::new(SimDevice::new(device_bytes)), conf).expect("allocator")
}

/// Bytes the simulated device has handed out (segments and mapped pages).
fn device_used(a: &CachingAllocator) -> u64 {
    let (free, total) = a.device().mem_get_info().expect("info");
    total - SimDevice::new(total).context_bytes() - free
}

fn check(a: &CachingAllocator) {
    if let Err(violation) = a.check_invariants() {
        panic!("invariant broken: {violation}");
    }
}

#[test]
fn expandable_segments_grow_by_whole_pages() {
    // §14 item 18 of the reference notes, observed on the H200.
    let mut a = expandable(H200_TOTAL);
    let five = a.malloc(5 * MIB).expect("5 MiB");
    assert_eq!(
        get(&a, "reserved_bytes.large_pool.current"),
        20 * MIB as i64
    );
    assert_eq!(get(&a, "segment.all.current"), 0);
    assert_eq!(get(&a, "inactive_split.all.current"), 0);
    assert_eq!(get(&a, "num_device_alloc"), 1);
    let thirty = a.malloc(30 * MIB).expect("30 MiB");
    assert_eq!(get(&a, "reserved_bytes.all.current"), 40 * MIB as i64);
    assert_eq!(get(&a, "num_device_alloc"), 2);
    let snapshot = a.snapshot();
    assert_eq!(snapshot.len(), 1);
    let segment = &snapshot[0];
    assert!(segment.is_expandable);
    assert_eq!(segment.total_size, 40 * MIB);
    let blocks: Vec<(u64, BlockState)> = segment.blocks.iter().map(|b| (b.size, b.state)).collect();
    assert_eq!(
        blocks,
        [
            (5 * MIB, BlockState::ActiveAllocated),
            (30 * MIB, BlockState::ActiveAllocated),
            (5 * MIB, BlockState::Inactive)
        ]
    );
    // The 30 MiB block starts where the 5 MiB one ends: it grew into the newly mapped page.
    assert_eq!(thirty.ptr.addr(), five.ptr.addr() + 5 * MIB);
    let small = a.malloc(1000).expect("1000 B");
    assert_eq!(get(&a, "reserved_bytes.small_pool.current"), 2 * MIB as i64);
    assert_eq!(device_used(&a), 42 * MIB);
    check(&a);
    for allocation in [five, thirty, small] {
        a.free(allocation).expect("free");
    }
    assert_eq!(get(&a, "inactive_split.all.current"), 0);
    a.empty_cache().expect("empty_cache");
    assert_eq!(get(&a, "reserved_bytes.all.current"), 0);
    assert_eq!(get(&a, "num_device_free"), 2, "one unmap per free block");
    assert_eq!(get(&a, "num_sync_all_streams"), 1);
    assert_eq!(device_used(&a), 0);
    assert!(
        a.expandable_segments().is_empty(),
        "wholly unmapped segments are released"
    );
    check(&a);
}

#[test]
fn expandable_empty_cache_unmaps_only_whole_free_pages() {
    let mut a = expandable(H200_TOTAL);
    let first = a.malloc(5 * MIB).expect("a"); //  [0, 5)
    let second = a.malloc(30 * MIB).expect("b"); // [5, 35): maps page 1
    let third = a.malloc(12 * MIB).expect("c"); // [35, 47): maps page 2
    assert_eq!(get(&a, "reserved_bytes.all.current"), 60 * MIB as i64);
    a.free(second).expect("free b");
    a.empty_cache().expect("empty");
    // [5, 35) holds no whole page (page 0 has a, page 1 ends at 40 under c), nor does [47, 60).
    assert_eq!(get(&a, "reserved_bytes.all.current"), 60 * MIB as i64);
    assert_eq!(get(&a, "num_device_free"), 0);
    a.free(first).expect("free a");
    a.empty_cache().expect("empty");
    // [0, 35) is free: page 0 goes, [20, 35) stays mapped as a free block.
    assert_eq!(get(&a, "reserved_bytes.all.current"), 40 * MIB as i64);
    assert_eq!(get(&a, "num_device_free"), 1);
    let segments = a.snapshot();
    assert_eq!(segments.len(), 1, "one mapped range");
    let sizes: Vec<u64> = segments[0].blocks.iter().map(|b| b.size).collect();
    assert_eq!(sizes, [15 * MIB, 12 * MIB, 13 * MIB]);
    check(&a);
    // The lowest unmapped range with room comes first: 30 MiB fills page 0 again plus the
    // free 15 MiB after it.
    let again = a.malloc(30 * MIB).expect("30 MiB");
    assert_eq!(again.ptr, first.ptr);
    assert_eq!(get(&a, "reserved_bytes.all.current"), 60 * MIB as i64);
    check(&a);
    a.free(again).expect("free");
    a.free(third).expect("free c");
    a.empty_cache().expect("empty");
    assert_eq!(get(&a, "reserved_bytes.all.current"), 0);
    check(&a);
}

#[test]
fn expandable_retry_unmaps_then_raises_oom() {
    // 1 GiB device: its simulated context costs 128 MiB (126.3 MiB of it attributed to the
    // process, in the H200's proportion), so 896 MiB can be mapped.
    let mut a = expandable(1 << 30);
    let first = a.malloc(400 * MIB).expect("400 MiB");
    let _second = a.malloc(400 * MIB).expect("400 MiB");
    a.free(first).expect("free");
    let err = a.malloc(500 * MIB).expect_err("no room");
    let AllocError::OutOfMemory(oom) = err else {
        panic!("expected OOM, got {err:?}")
    };
    assert_eq!(
        oom.message,
        "CUDA out of memory. Tried to allocate 500.00 MiB. GPU 0 has a total capacity of 1024.00 MiB of which 496.00 MiB is free. Including non-PyTorch memory, this process has 526.30 MiB memory in use. Of the allocated memory 400.00 MiB is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"
    );
    assert_eq!(get(&a, "num_alloc_retries"), 1);
    assert_eq!(get(&a, "num_ooms"), 1);
    assert_eq!(get(&a, "num_device_alloc"), 2);
    assert_eq!(
        get(&a, "num_device_free"),
        1,
        "the cached 400 MiB were unmapped"
    );
    assert_eq!(get(&a, "reserved_bytes.all.current"), 400 * MIB as i64);
    check(&a);
}

#[test]
fn expandable_fraction_checks_the_segment_size_but_maps_the_request() {
    let mut a = expandable(H200_TOTAL);
    // 21 MiB allowed: a 5 MiB request is checked as a 20 MiB segment and maps one page.
    a.set_memory_fraction((21 * MIB) as f64 / H200_TOTAL as f64)
        .expect("fraction");
    let _five = a.malloc(5 * MIB).expect("fits");
    assert_eq!(get(&a, "reserved_bytes.all.current"), 20 * MIB as i64);
    // 15 MiB are free in the mapped page: no new memory needed.
    let _ten = a.malloc(10 * MIB).expect("fits in the page");
    // 1000 B: a 2 MiB small page would pass 21 MiB.
    let err = a.malloc(1000).expect_err("over the cap");
    assert!(err.to_string().contains("Tried to allocate 2.00 MiB"));
    assert!(err.to_string().contains("21.00 MiB allowed; "));
    check(&a);
}

#[test]
fn streams_keep_separate_pools_and_segments() {
    let mut a = allocator("");
    let x = a.malloc_on(0, 1000).expect("stream 0");
    a.free(x).expect("free");
    let y = a.malloc_on(7, 1000).expect("stream 7");
    assert_eq!(
        get(&a, "segment.small_pool.current"),
        2,
        "no reuse across streams"
    );
    let z = a.malloc(1000).expect("stream 0 again");
    assert_eq!(z.ptr, x.ptr, "stream 0 reuses its own cached block");
    let snapshot = a.snapshot();
    let streams: Vec<u64> = snapshot.iter().map(|s| s.stream).collect();
    assert!(streams.contains(&0) && streams.contains(&7));
    a.free(y).expect("free");
    a.free(z).expect("free");
    a.empty_cache().expect("empty");
    assert_eq!(
        get(&a, "segment.all.current"),
        0,
        "empty_cache covers every stream"
    );
    check(&a);

    let mut e = expandable(H200_TOTAL);
    let p = e.malloc_on(1, 5 * MIB).expect("stream 1");
    let q = e.malloc_on(2, 5 * MIB).expect("stream 2");
    assert_eq!(
        e.expandable_segments().len(),
        2,
        "one segment per (stream, pool)"
    );
    assert_eq!(get(&e, "reserved_bytes.all.current"), 40 * MIB as i64);
    e.free(p).expect("free");
    let r = e.malloc_on(2, 10 * MIB).expect("stream 2");
    assert_eq!(
        r.ptr.addr(),
        q.ptr.addr() + 5 * MIB,
        "stream 2 stays in its own segment"
    );
    check(&e);
}

#[test]
fn trace_records_pytorchs_events_in_order() {
    fn clock() -> i64 {
        7
    }
    let actions = |a: &CachingAllocator| -> Vec<(&'static str, u64, u64)> {
        a.trace()
            .entries()
            .iter()
            .map(|e| (e.action.name(), e.addr, e.size))
            .collect()
    };
    let mut a = allocator("");
    a.set_history_clock(clock);
    let untraced = a.malloc(1000).expect("alloc");
    assert!(a.trace().is_empty(), "off by default");
    a.record_history(true, 100);
    a.set_trace_context(3);
    let x = a.malloc(5 * MIB).expect("alloc");
    a.free(x).expect("free");
    a.free(untraced).expect("free");
    let _snapshot = a.snapshot();
    a.empty_cache().expect("empty");
    a.set_memory_fraction(0.0).expect("fraction");
    assert!(a.malloc(1000).is_err());
    let (base, small) = (x.ptr.addr(), untraced.ptr.addr());
    let (free, _) = a.device().mem_get_info().expect("info");
    assert_eq!(
        actions(&a),
        [
            ("segment_alloc", base, 20 * MIB),
            ("alloc", base, 5 * MIB),
            ("free_requested", base, 5 * MIB),
            ("free_completed", base, 5 * MIB),
            ("free_requested", small, 1000),
            ("free_completed", small, 1000),
            ("snapshot", 0, 0),
            // PyTorch's history has no `empty_cache` entry: only what it released.
            ("segment_free", base, 20 * MIB),
            ("segment_free", small, 2 * MIB),
            ("oom", free, 1024),
        ]
    );
    assert!(a
        .trace()
        .entries()
        .iter()
        .all(|e| e.context == 3 && e.time_us == 7));

    let mut e = expandable(H200_TOTAL);
    e.record_history(true, 100);
    let y = e.malloc(5 * MIB).expect("alloc");
    let z = e.malloc(30 * MIB).expect("alloc");
    let _ = e.snapshot();
    e.free(y).expect("free");
    e.free(z).expect("free");
    e.empty_cache().expect("empty");
    let base = y.ptr.addr();
    assert_eq!(
        actions(&e)
            .into_iter()
            .filter(|(name, _, _)| !name.starts_with("free"))
            .collect::<Vec<_>>(),
        [
            ("segment_map", base, 20 * MIB),
            ("alloc", base, 5 * MIB),
            ("segment_map", base + 20 * MIB, 20 * MIB),
            ("alloc", base + 5 * MIB, 30 * MIB),
            ("snapshot", 0, 35 * MIB),
            ("segment_unmap", base, 40 * MIB),
        ]
    );
}

#[test]
fn expandable_segments_need_the_devices_virtual_memory_calls() {
    let conf = AllocConf::parse("expandable_segments:True").expect("valid config");
    let device = WrappedSim::new(SimDevice::new(1 << 30), None);
    let mut a = CachingAllocator::new(Box::new(device), conf.clone()).expect("allocator");
    let err = a.malloc(1000).expect_err("no VMM");
    // The device's own error, kept typed inside the allocator's.
    assert_eq!(err, AllocError::Device(crate::device::vmm_unsupported()));
    assert!(err
        .to_string()
        .starts_with("device error: this device does not support virtual memory management"));
    assert_eq!(a.stats(), &DeviceStats::new(-1));
    let device = WrappedSim::new(SimDevice::new(1 << 30), Some(3 << 20));
    let mut a = CachingAllocator::new(Box::new(device), conf).expect("allocator");
    let err = a.malloc(1000).expect_err("bad granularity");
    assert!(
        matches!(err, AllocError::Device(DeviceError::Unsupported(_))),
        "{err:?}"
    );
    assert!(err
        .to_string()
        .contains("granularity of 3145728 bytes does not divide"));
}

/// `release_cached_blocks` (`empty_cache()` and a malloc's last resort) releases the large
/// pool before the small one, each walked in PyTorch's (stream, size, address) order; split
/// free pieces stay.
#[test]
fn release_cached_blocks_walks_large_then_small_in_pool_order() {
    let mut a = allocator("");
    a.record_history(true, 1000);
    let sizes = [
        (1, 30 * MIB),
        (0, 40 * MIB),
        (0, 12 * MIB),
        (1, 1000),
        (0, 1000),
    ];
    let blocks: Vec<Allocation> = sizes
        .iter()
        .map(|&(stream, size)| a.malloc_on(stream, size).expect("alloc"))
        .collect();
    let kept = a.malloc(5 * MIB).expect("a 20 MiB segment kept split");
    for block in blocks {
        a.free(block).expect("free");
    }
    let mark = a.trace().len();
    a.empty_cache().expect("empty");
    let released: Vec<(u64, u64)> = a.trace().entries()[mark..]
        .iter()
        .map(|entry| (entry.stream, entry.size))
        .collect();
    assert_eq!(
        released,
        [
            (0, 12 * MIB),
            (0, 40 * MIB),
            (1, 30 * MIB),
            (0, 2 * MIB),
            (1, 2 * MIB)
        ]
    );
    assert_eq!(get(&a, "reserved_bytes.all.current"), 20 * MIB as i64);
    a.free(kept).expect("free");
    a.check_invariants().expect("consistent");
}

#[test]
fn block_addresses_are_derived_from_their_segments_address() {
    let mut a = allocator("");
    let x = a.malloc(5 * MIB).expect("alloc");
    let y = a.malloc(3 * MIB).expect("alloc");
    // Both blocks lie in the 20 MiB segment the device handed out, and carry its memory space.
    let (base, segment) = a
        .segments
        .iter()
        .next()
        .map(|(&b, s)| (b, *s))
        .expect("one");
    assert_eq!(segment.base.addr(), base);
    assert_eq!(x.ptr, segment.base);
    assert_eq!(y.ptr.addr(), base + 5 * MIB);
    assert_eq!(y.ptr.space(), crate::device::MemorySpace::Simulated);
    a.free(y).expect("free");
    // Every block carries its segment's range.
    assert!(
        a.blocks
            .iter()
            .all(|(_, block)| (block.segment_base, block.segment_size)
                == (segment.base, segment.size))
    );
    // Bookkeeping that no longer knows the block's segment (the cached block carries a range
    // it does not fit in): the malloc is refused as an internal error, and the cached block
    // stays cached.
    let (cached, _) = a
        .blocks
        .iter()
        .find(|(_, block)| block.is_free() && block.ptr == base + 5 * MIB)
        .expect("the freed block");
    a.blocks.at_mut(cached).segment_size = 5 * MIB;
    let err = a.malloc(3 * MIB).expect_err("no segment for the block");
    assert!(matches!(err, AllocError::Internal(_)), "{err:?}");
    assert!(err
        .to_string()
        .starts_with("internal allocator error: the block at"));
    a.blocks.at_mut(cached).segment_size = segment.size;
    a.check_invariants().expect("consistent after the refusal");
    let again = a.malloc(3 * MIB).expect("alloc");
    assert_eq!(again.ptr.addr(), base + 5 * MIB);
}

/// An observer that wants only segment events, and keeps the kinds it is told.
struct SegmentKinds(Vec<EventKind>);

impl MemoryObserver for SegmentKinds {
    fn on_event(&mut self, event: &MemoryEvent) {
        self.0.push(event.kind);
    }

    fn segment_events_only(&self) -> bool {
        true
    }
}

#[test]
fn a_segment_only_observer_is_told_every_segment_event() {
    let mut a = allocator("");
    let kinds = Rc::new(std::cell::RefCell::new(SegmentKinds(Vec::new())));
    a.subscribe(Box::new(Rc::clone(&kinds)));
    assert!(a.is_listened_to());
    let x = a.malloc(5 * MIB).expect("alloc");
    a.free(x).expect("free");
    a.empty_cache().expect("empty_cache");
    // Alone, it is told no malloc or free: the allocator skips building them.
    assert_eq!(
        kinds.borrow().0,
        [EventKind::SegmentAlloc, EventKind::SegmentFree]
    );
    // Beside an observer of every event it may be told more, never less.
    let every = Rc::new(std::cell::RefCell::new(EventLog::default()));
    a.subscribe(Box::new(Rc::clone(&every)));
    kinds.borrow_mut().0.clear();
    let y = a.malloc(5 * MIB).expect("alloc");
    a.free(y).expect("free");
    a.empty_cache().expect("empty_cache");
    let told = kinds.borrow().0.clone();
    assert!(told.contains(&EventKind::SegmentAlloc) && told.contains(&EventKind::SegmentFree));
    assert!(told.contains(&EventKind::Alloc), "{told:?}");
    assert_eq!(every.borrow().events().len(), told.len());
}

/// `malloc_unrounded_on` hands out exactly the bytes asked (to 512) from the pool named:
/// under `roundup_power2_divisions:4` a request of 5.5 MiB rounds to 6 MiB, and one of 1 MiB
/// goes to the small pool; asked unrounded from the large pool, they are 5.5 MiB and 1 MiB
/// blocks of a large segment. Everything else is malloc's: the same segment, split as usual.
#[test]
fn an_unrounded_request_is_served_at_its_size_from_the_pool_named() {
    const MIB: u64 = 1 << 20;
    let mut rounded = allocator("roundup_power2_divisions:4");
    let block = rounded.malloc(5 * MIB + MIB / 2).expect("rounded");
    assert_eq!(block.size, 6 * MIB);
    let mut exact = allocator("roundup_power2_divisions:4");
    let first = exact
        .malloc_unrounded_on(0, 5 * MIB + MIB / 2, Pool::Large)
        .expect("5.5 MiB");
    assert_eq!(first.size, 5 * MIB + MIB / 2);
    let second = exact
        .malloc_unrounded_on(0, MIB, Pool::Large)
        .expect("1 MiB");
    assert_eq!(second.size, MIB);
    assert_eq!(second.ptr.addr(), first.ptr.addr() + first.size);
    assert_eq!(get(&exact, "segment.large_pool.current"), 1);
    assert_eq!(get(&exact, "segment.small_pool.current"), 0);
    exact.free(second).expect("freed");
    exact.free(first).expect("freed");
    assert_eq!(get(&exact, "allocated_bytes.all.current"), 0);
}
