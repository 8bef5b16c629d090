//! Timing of the allocator's hot paths on any device, shared by the criterion benches
//! (benches/allocator.rs) and `gpumem bench alloc`, which runs the same patterns on a real GPU
//! so they can be compared with PyTorch's allocator (benches/compare/).

use std::time::Instant;

use gpumem::alloc::{AllocError, Allocation, CachingAllocator};

/// Size of the cached malloc+free pattern: 1 MiB, the largest small-pool request.
pub const CACHED_PAIR_BYTES: u64 = 1 << 20;
/// Number of live blocks in the mixed pattern.
pub const MIXED_BLOCKS: usize = 1000;
/// The mixed pattern's sizes are `512 × k` with `k` in `1..=MIXED_MAX_MULTIPLE`.
pub const MIXED_MAX_MULTIPLE: u64 = 4000;

/// The mixed pattern's request sizes: `512 × k`, `k` drawn from a fixed 64-bit LCG (Knuth's
/// MMIX constants) so every implementation can generate the same list.
pub fn mixed_sizes() -> Vec<u64> {
    let mut state: u64 = 0x2545_F491_4F6C_DD1D;
    (0..MIXED_BLOCKS)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            512 * ((state >> 33) % MIXED_MAX_MULTIPLE + 1)
        })
        .collect()
}

/// One malloc+free of `size` bytes (a cache hit once warm).
#[inline]
pub fn cached_pair(allocator: &mut CachingAllocator, size: u64) -> Result<(), AllocError> {
    let block = allocator.malloc(size)?;
    allocator.free(block)
}

/// Allocates every size, then frees them all in allocation order.
#[inline]
pub fn mixed_round(
    allocator: &mut CachingAllocator,
    sizes: &[u64],
    live: &mut Vec<Allocation>,
) -> Result<(), AllocError> {
    live.clear();
    for &size in sizes {
        live.push(allocator.malloc(size)?);
    }
    for block in live.drain(..) {
        allocator.free(block)?;
    }
    Ok(())
}

/// Median nanoseconds per malloc+free pair of each pattern.
#[derive(Debug, Clone, Copy)]
pub struct AllocTimings {
    /// Cached 1 MiB malloc+free.
    pub cached_pair_ns: f64,
    /// Mixed pattern, per pair (1000 allocations then 1000 frees).
    pub mixed_pair_ns: f64,
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// Times both patterns on `allocator` (after a warm-up that fills its cache): `rounds` samples
/// each, returning the medians.
pub fn time_patterns(
    allocator: &mut CachingAllocator,
    rounds: usize,
) -> Result<AllocTimings, AllocError> {
    const PAIRS_PER_SAMPLE: usize = 10_000;
    let rounds = rounds.max(1);
    let sizes = mixed_sizes();
    let mut live = Vec::with_capacity(sizes.len());
    for _ in 0..3 {
        cached_pair(allocator, CACHED_PAIR_BYTES)?;
        mixed_round(allocator, &sizes, &mut live)?;
    }
    let mut cached = Vec::with_capacity(rounds);
    let mut mixed = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let start = Instant::now();
        for _ in 0..PAIRS_PER_SAMPLE {
            cached_pair(allocator, CACHED_PAIR_BYTES)?;
        }
        cached.push(start.elapsed().as_nanos() as f64 / PAIRS_PER_SAMPLE as f64);
        let start = Instant::now();
        mixed_round(allocator, &sizes, &mut live)?;
        mixed.push(start.elapsed().as_nanos() as f64 / sizes.len() as f64);
    }
    Ok(AllocTimings {
        cached_pair_ns: median(cached),
        mixed_pair_ns: median(mixed),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mixed_sizes_are_fixed_multiples_of_512() {
        let sizes = mixed_sizes();
        assert_eq!(sizes.len(), MIXED_BLOCKS);
        assert!(sizes
            .iter()
            .all(|&s| s % 512 == 0 && (512..=512 * MIXED_MAX_MULTIPLE).contains(&s)));
        assert_eq!(sizes, mixed_sizes());
        assert!(sizes.iter().any(|&s| s > 1 << 20) && sizes.iter().any(|&s| s <= 1 << 20));
    }
}
