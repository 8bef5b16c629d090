//! Allocator hot paths on the simulated device (release build): a cached 1 MiB malloc+free
//! pair (target <= 100 ns) and 1000 live blocks of mixed sizes allocated then freed (target
//! <= 200 ns per pair). PyTorch 2.11's C++ allocator: 440 ns and 805 ns on the H200 machine.

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

criterion_group!(benches, cached_1mib_pair, mixed_1000_live);
criterion_main!(benches);
