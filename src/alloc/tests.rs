//! Unit tests of the allocator's rules, with the figures PyTorch 2.11 gave on the H200.

use super::*;
use crate::device::sim::SimDevice;

fn allocator(conf: &str) -> CachingAllocator {
    let conf = AllocConf::parse(conf).expect("valid config");
    CachingAllocator::new(Box::new(SimDevice::h200()), conf).expect("allocator")
}

fn get(allocator: &CachingAllocator, key: &str) -> i64 {
    allocator.stats().get(key).expect(key)
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
    assert_eq!(CachingAllocator::allocation_size(512), SMALL_BUFFER);
    assert_eq!(CachingAllocator::allocation_size(MIB), SMALL_BUFFER);
    assert_eq!(CachingAllocator::allocation_size(MIB + 512), LARGE_BUFFER);
    assert_eq!(
        CachingAllocator::allocation_size(10 * MIB - 512),
        LARGE_BUFFER
    );
    assert_eq!(CachingAllocator::allocation_size(10 * MIB), 10 * MIB);
    assert_eq!(CachingAllocator::allocation_size(11 * MIB + 512), 12 * MIB);
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
    use crate::device::{DeviceError, DeviceMemory, ProcessMemory};
    use std::cell::Cell;
    use std::rc::Rc;

    /// A sim device that counts its live segments where the test can see them.
    struct Counting(SimDevice, Rc<Cell<i64>>);
    impl DeviceMemory for Counting {
        fn malloc(&mut self, bytes: u64) -> Result<u64, DeviceError> {
            self.1.set(self.1.get() + 1);
            self.0.malloc(bytes)
        }
        fn free(&mut self, address: u64) -> Result<(), DeviceError> {
            self.1.set(self.1.get() - 1);
            self.0.free(address)
        }
        fn mem_get_info(&self) -> Result<(u64, u64), DeviceError> {
            self.0.mem_get_info()
        }
        fn total_memory(&self) -> u64 {
            self.0.total_memory()
        }
        fn index(&self) -> usize {
            0
        }
        fn process_memory(&self) -> Vec<ProcessMemory> {
            Vec::new()
        }
        fn label(&self) -> String {
            "counting".into()
        }
    }
    let live = Rc::new(Cell::new(0));
    let device = Counting(SimDevice::h200(), Rc::clone(&live));
    let mut a = CachingAllocator::new(Box::new(device), AllocConf::default()).expect("allocator");
    let x = a.malloc(5 * MIB).expect("5 MiB");
    let _y = a.malloc(1000).expect("1000 B");
    a.free(x).expect("free");
    assert_eq!(live.get(), 2);
    drop(a);
    assert_eq!(live.get(), 0);
}
