//! Property tests: random operation sequences on several streams under random configs (with
//! and without expandable segments) keep the allocator consistent — no overlaps, segments and
//! reserved ranges tiled exactly, every counter equal to a recount, reserved bytes equal to
//! what the device handed out — and freeing everything then `empty_cache()` returns every
//! segment, page and reserved range. Allocations are also used on other streams
//! (`record_stream`) while those streams work, wait for each other and synchronise: a block
//! freed that way stays active and is never handed out again before its streams' events
//! complete. Two private pools are made active (for every stream or for one), left and
//! released at random: their segments stay theirs, and are returned once they are freeable.

use gpumem::alloc::{AllocConf, AllocError, Allocation, CachingAllocator, MemPoolId, PoolFilter};
use gpumem::device::sim::SimDevice;
use gpumem::device::{DeviceError, DeviceMemory, DevicePtr, StreamEvent};
use proptest::prelude::*;

const MIB: u64 = 1 << 20;

#[derive(Debug, Clone)]
enum Op {
    Alloc { slot: usize, size: u64, stream: u64 },
    Free { slot: usize },
    EmptyCache,
    ResetPeak,
    RecordStream { slot: usize, stream: u64 },
    Work { stream: u64 },
    SyncStream { stream: u64 },
    SyncAll,
    WaitStream { stream: u64, other: u64 },
    UsePool { pool: usize, stream: Option<u64> },
    EndPool { pool: usize },
    ReleasePool { pool: usize },
}

/// The two private pools the sequences use: a `MemPool`'s id and a graph pool's.
const POOLS: [MemPoolId; 2] = [
    MemPoolId {
        first: 0,
        second: 1,
    },
    MemPoolId {
        first: 1,
        second: 0,
    },
];

fn stream_strategy() -> impl Strategy<Value = u64> {
    prop_oneof![4 => Just(0_u64), 1 => Just(1), 1 => Just(7), 1 => Just(9)]
}

fn size_strategy() -> impl Strategy<Value = u64> {
    prop_oneof![
        0_u64..=2048,
        (1_u64..=2048).prop_map(|k| k * 512),
        (MIB - 1024)..=(MIB + 1024),
        (MIB + 1)..(10 * MIB),
        (10 * MIB)..(120 * MIB),
    ]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0_usize..16, size_strategy(), prop_oneof![4 => Just(0_u64), 1 => Just(1), 1 => Just(7)])
            .prop_map(|(slot, size, stream)| Op::Alloc { slot, size, stream }),
        4 => (0_usize..16).prop_map(|slot| Op::Free { slot }),
        1 => Just(Op::EmptyCache),
        1 => Just(Op::ResetPeak),
        2 => (0_usize..16, stream_strategy()).prop_map(|(slot, stream)| Op::RecordStream { slot, stream }),
        2 => stream_strategy().prop_map(|stream| Op::Work { stream }),
        1 => stream_strategy().prop_map(|stream| Op::SyncStream { stream }),
        1 => Just(Op::SyncAll),
        1 => (stream_strategy(), stream_strategy()).prop_map(|(stream, other)| Op::WaitStream { stream, other }),
        1 => (0_usize..2, proptest::option::of(stream_strategy())).prop_map(|(pool, stream)| Op::UsePool { pool, stream }),
        1 => (0_usize..2).prop_map(|pool| Op::EndPool { pool }),
        1 => (0_usize..2).prop_map(|pool| Op::ReleasePool { pool }),
    ]
}

fn config_strategy() -> impl Strategy<Value = (String, Option<f64>)> {
    let conf = prop_oneof![
        Just(String::new()),
        Just("max_split_size_mb:20".to_string()),
        Just("max_split_size_mb:64".to_string()),
        Just("roundup_power2_divisions:4".to_string()),
        Just("roundup_power2_divisions:[1:2,4:4,>:8]".to_string()),
        Just("garbage_collection_threshold:0.6".to_string()),
        Just("garbage_collection_threshold:0.3,max_split_size_mb:40".to_string()),
        Just("expandable_segments:True".to_string()),
        Just("expandable_segments:True,max_split_size_mb:20".to_string()),
        Just("expandable_segments:True,roundup_power2_divisions:4".to_string()),
        Just("expandable_segments:True,garbage_collection_threshold:0.5".to_string()),
    ];
    let fraction = prop_oneof![Just(None), (0.0005_f64..0.004).prop_map(Some)];
    (conf, fraction)
}

/// What a [`Tracked`] device has handed out and not yet taken back.
#[derive(Debug, Default)]
struct Outstanding {
    segments: i64,
    segment_bytes: u64,
    mapped_bytes: u64,
    reservations: i64,
}

type Shared = std::rc::Rc<std::cell::RefCell<Outstanding>>;

/// A device that counts what is outstanding so the test can see every segment, page and
/// reserved range came back, and compare the allocator's reserved bytes with the device's.
struct Tracked {
    inner: SimDevice,
    outstanding: Shared,
    sizes: std::collections::HashMap<u64, u64>,
}

impl DeviceMemory for Tracked {
    fn malloc(&mut self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        let ptr = self.inner.malloc(bytes)?;
        let mut out = self.outstanding.borrow_mut();
        out.segments += 1;
        out.segment_bytes += bytes;
        self.sizes.insert(ptr.addr(), bytes);
        Ok(ptr)
    }
    fn free(&mut self, segment: DevicePtr) -> Result<(), DeviceError> {
        self.inner.free(segment)?;
        let mut out = self.outstanding.borrow_mut();
        out.segments -= 1;
        out.segment_bytes -= self.sizes.remove(&segment.addr()).unwrap_or(0);
        Ok(())
    }
    fn mem_get_info(&self) -> Result<(u64, u64), DeviceError> {
        self.inner.mem_get_info()
    }
    fn total_memory(&self) -> u64 {
        self.inner.total_memory()
    }
    fn index(&self) -> usize {
        0
    }
    fn process_memory(&self) -> Vec<gpumem::device::ProcessMemory> {
        self.inner.process_memory()
    }
    fn label(&self) -> String {
        "tracked".into()
    }
    fn allocation_granularity(&self) -> Result<u64, DeviceError> {
        self.inner.allocation_granularity()
    }
    fn reserve_address_range(&mut self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        let base = self.inner.reserve_address_range(bytes)?;
        self.outstanding.borrow_mut().reservations += 1;
        Ok(base)
    }
    fn free_address_range(&mut self, base: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.inner.free_address_range(base, bytes)?;
        self.outstanding.borrow_mut().reservations -= 1;
        Ok(())
    }
    fn map_pages(&mut self, address: DevicePtr, bytes: u64, page: u64) -> Result<(), DeviceError> {
        self.inner.map_pages(address, bytes, page)?;
        self.outstanding.borrow_mut().mapped_bytes += bytes;
        Ok(())
    }
    fn unmap_pages(
        &mut self,
        address: DevicePtr,
        bytes: u64,
        page: u64,
    ) -> Result<(), DeviceError> {
        self.inner.unmap_pages(address, bytes, page)?;
        self.outstanding.borrow_mut().mapped_bytes -= bytes;
        Ok(())
    }
    fn record_event(&mut self, stream: u64) -> Result<StreamEvent, DeviceError> {
        self.inner.record_event(stream)
    }
    fn query_event(&self, event: StreamEvent) -> Result<bool, DeviceError> {
        self.inner.query_event(event)
    }
    fn synchronize_event(&mut self, event: StreamEvent) -> Result<(), DeviceError> {
        self.inner.synchronize_event(event)
    }
    fn synchronize_stream(&mut self, stream: u64) -> Result<(), DeviceError> {
        self.inner.synchronize_stream(stream)
    }
    fn synchronize_device(&mut self) -> Result<(), DeviceError> {
        self.inner.synchronize_device()
    }
    fn wait_stream(&mut self, stream: u64, other: u64) -> Result<(), DeviceError> {
        self.inner.wait_stream(stream, other)
    }
    fn sleep(&mut self, stream: u64, millis: u64) -> Result<(), DeviceError> {
        self.inner.sleep(stream, millis)
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn random_sequences_keep_the_allocator_consistent(
        (conf, fraction) in config_strategy(),
        device_gib in prop_oneof![Just(1_u64), Just(2), Just(140)],
        ops in proptest::collection::vec(op_strategy(), 1..160),
    ) {
        let outstanding = Shared::default();
        let device = Tracked {
            inner: SimDevice::new(device_gib << 30),
            outstanding: outstanding.clone(),
            sizes: Default::default(),
        };
        let conf = AllocConf::parse(&conf).expect("valid config");
        let expandable = conf.expandable_segments;
        let mut allocator = CachingAllocator::new(Box::new(device), conf).expect("allocator");
        if let Some(fraction) = fraction {
            allocator.set_memory_fraction(fraction).expect("fraction");
        }
        let mut slots: Vec<Option<Allocation>> = vec![None; 16];
        for op in &ops {
            match *op {
                Op::Alloc { slot, size, stream } => match allocator.malloc_on(stream, size) {
                    Ok(new) => {
                        prop_assert!(new.size >= size);
                        if let Some(old) = slots[slot].replace(new) {
                            allocator.free(old).expect("free old");
                        }
                    }
                    Err(AllocError::OutOfMemory(oom)) => {
                        prop_assert!(oom.message.starts_with("CUDA out of memory. Tried to allocate"));
                    }
                    Err(other) => prop_assert!(false, "unexpected error {other}"),
                },
                Op::Free { slot } => {
                    if let Some(old) = slots[slot].take() {
                        allocator.free(old).expect("free");
                    }
                }
                Op::EmptyCache => allocator.empty_cache().expect("empty_cache"),
                Op::ResetPeak => allocator.reset_peak_stats(),
                Op::RecordStream { slot, stream } => {
                    if let Some(allocation) = slots[slot] {
                        allocator.record_stream(allocation, stream).expect("record_stream");
                    }
                }
                Op::Work { stream } => allocator.device_mut().sleep(stream, 1).expect("sleep"),
                Op::SyncStream { stream } => allocator.synchronize_stream(stream).expect("sync"),
                Op::SyncAll => allocator.synchronize_device().expect("sync"),
                Op::WaitStream { stream, other } => {
                    allocator.wait_stream(stream, other).expect("wait_stream");
                }
                // Misuse (a pool active twice, released twice, ended when not active) is
                // refused as PyTorch refuses it, and must change nothing.
                Op::UsePool { pool, stream } => {
                    let filter = stream.map_or(PoolFilter::AllStreams, PoolFilter::Stream);
                    let _ = allocator.begin_allocate_to_pool(POOLS[pool], filter);
                }
                Op::EndPool { pool } => {
                    let _ = allocator.end_allocate_to_pool(POOLS[pool]);
                }
                Op::ReleasePool { pool } => {
                    let _ = allocator.release_pool(POOLS[pool]);
                }
            }
            if let Err(violation) = allocator.check_invariants() {
                prop_assert!(false, "after {op:?}: {violation}");
            }
            let live: Vec<Allocation> = slots.iter().flatten().filter(|a| !a.is_null()).copied().collect();
            for (i, a) in live.iter().enumerate() {
                for b in &live[i + 1..] {
                    let (a_at, b_at) = (a.ptr.addr(), b.ptr.addr());
                    prop_assert!(a_at + a.size <= b_at || b_at + b.size <= a_at, "{a:?} overlaps {b:?}");
                }
            }
            // Memory whose free waits for other streams is never handed out meanwhile.
            let pending: Vec<(u64, u64)> = allocator
                .blocks()
                .filter(|block| block.pending_free)
                .map(|block| (block.ptr, block.size))
                .collect();
            for a in &live {
                for &(ptr, size) in &pending {
                    prop_assert!(a.ptr.addr() + a.size <= ptr || ptr + size <= a.ptr.addr(), "{a:?} overlaps a pending free at {ptr:#x}");
                }
            }
            let stats = allocator.stats();
            let pending_bytes: u64 = pending.iter().map(|&(_, size)| size).sum();
            prop_assert_eq!(
                stats.active_bytes.all.current,
                stats.allocated_bytes.all.current + pending_bytes as i64,
                "active = allocated + pending frees"
            );
            prop_assert!(stats.allocated_bytes.all.peak >= stats.allocated_bytes.all.current);
            prop_assert!(stats.reserved_bytes.all.current >= stats.allocated_bytes.all.current);
            let out = outstanding.borrow();
            prop_assert_eq!(
                stats.reserved_bytes.all.current as u64,
                out.segment_bytes + out.mapped_bytes,
                "reserved bytes are the segments' plus the mapped pages'"
            );
            prop_assert_eq!(allocator.total_allocated_memory(), out.segment_bytes + out.mapped_bytes);
            if expandable {
                prop_assert_eq!(stats.segment.all.current, 0);
                prop_assert_eq!(stats.inactive_split.all.current, 0);
                prop_assert_eq!(out.segments, 0);
                prop_assert_eq!(out.reservations as usize, allocator.expandable_segments().len());
            } else {
                prop_assert_eq!(out.mapped_bytes, 0);
                prop_assert_eq!(out.reservations, 0);
            }
        }
        for slot in slots.iter_mut() {
            if let Some(allocation) = slot.take() {
                allocator.free(allocation).expect("final free");
            }
        }
        // Leave every pool and drop every use, so that empty_cache may release them.
        for (id, _) in allocator.active_pools() {
            allocator.end_allocate_to_pool(id).expect("end");
        }
        for id in POOLS {
            while allocator.release_pool(id).is_ok() {}
        }
        allocator.empty_cache().expect("final empty_cache");
        if !expandable {
            // PyTorch forgets a freeable pool when its cudaMalloc_count is 0, which it counts
            // per map and unmap with expandable segments (they need not balance).
            prop_assert!(allocator.private_pools().is_empty(), "freeable pools are forgotten once empty");
        }
        prop_assert_eq!(allocator.pending_frees().blocks, 0, "empty_cache waits for every event");
        prop_assert_eq!(allocator.stats().active.all.current, 0);
        prop_assert_eq!(allocator.stats().reserved_bytes.all.current, 0);
        prop_assert_eq!(allocator.stats().segment.all.current, 0);
        {
            let out = outstanding.borrow();
            prop_assert_eq!(out.segments, 0);
            prop_assert_eq!(out.mapped_bytes, 0);
            prop_assert_eq!(out.reservations, 0, "every reserved range was freed");
        }
        prop_assert!(allocator.expandable_segments().is_empty());
        if !expandable {
            // One cudaFree per cudaMalloc. Expandable segments count map and unmap calls, and
            // one unmap may return pages mapped by several maps.
            prop_assert_eq!(allocator.stats().num_device_alloc, allocator.stats().num_device_free);
        }
        if let Err(violation) = allocator.check_invariants() {
            prop_assert!(false, "at the end: {violation}");
        }
    }
}
