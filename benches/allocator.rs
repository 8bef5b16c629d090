//! Allocator hot paths on the simulated device (release build): a cached 1 MiB malloc+free
//! pair (target <= 100 ns) and 1000 live blocks of mixed sizes allocated then freed (target
//! <= 200 ns per pair). PyTorch 2.11's C++ allocator: 440 ns and 805 ns on the H200 machine.
//! And an out-of-memory error with 20,000 blocks live, its diagnosis with and without the
//! expandable-segments trial (which allocates every live block again): what a replay pays per
//! OOM before and after its first 16, the ones it reports in full.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use gpumem::alloc::{AllocConf, CachingAllocator};
// The patterns `gpumem bench alloc` times (binary code, not library API), compiled in here too.
#[allow(dead_code, unused_imports)]
#[path = "../src/cli/bench/alloc.rs"]
mod patterns;
use gpumem::device::sim::SimDevice;
use patterns::{cached_pair, mixed_round, mixed_sizes, CACHED_PAIR_BYTES};

fn allocator() -> CachingAllocator {
    CachingAllocator::new(Box::new(SimDevice::h200()), AllocConf::default()).expect("allocator")
}

fn cached_1mib_pair(c: &mut Criterion) {
    let mut allocator = allocator();
    cached_pair(&mut allocator, CACHED_PAIR_BYTES).expect("warm-up");
    c.bench_function("cached 1 MiB malloc+free", |b| {
        b.iter(|| cached_pair(&mut allocator, CACHED_PAIR_BYTES).expect("pair"))
    });
}

fn mixed_1000_live(c: &mut Criterion) {
    let mut allocator = allocator();
    let sizes = mixed_sizes();
    let mut live = Vec::with_capacity(sizes.len());
    mixed_round(&mut allocator, &sizes, &mut live).expect("warm-up");
    let mut group = c.benchmark_group("mixed 1000 live blocks");
    group.throughput(Throughput::Elements(sizes.len() as u64));
    group.bench_function("malloc+free pairs", |b| {
        b.iter(|| mixed_round(&mut allocator, &sizes, &mut live).expect("round"))
    });
    group.finish();
}

fn oom_with_20000_live(c: &mut Criterion) {
    const LIVE: usize = 20_000;
    let mut allocator =
        CachingAllocator::new(Box::new(SimDevice::new(2 << 30)), AllocConf::default())
            .expect("allocator");
    let live: Vec<_> = (0..LIVE)
        .map(|_| allocator.malloc(50 << 10).expect("a small block"))
        .collect();
    // More than the device has free, less than it would have with every block freed (about
    // 1 GiB is reserved): the device-full OOM, whose diagnosis tries expandable segments.
    let (free, _) = allocator
        .device()
        .mem_get_info()
        .expect("the device's figures");
    let too_large = free + (256 << 20);
    let mut group = c.benchmark_group("an OOM with 20000 live blocks");
    for (name, trials) in [("with the expandable trial", true), ("without", false)] {
        allocator.set_expandable_trials(trials);
        group.bench_function(name, |b| {
            b.iter(|| {
                assert!(
                    allocator.malloc(too_large).is_err(),
                    "the request must fail"
                );
            })
        });
    }
    group.finish();
    drop(live);
}

criterion_group!(
    benches,
    cached_1mib_pair,
    mixed_1000_live,
    oom_with_20000_live
);
criterion_main!(benches);
