//! `gpumem bench soak`: a long random workload against the allocator in this process —
//! requests from 1 byte to 4 GiB, random frees, `empty_cache()`, out-of-memory errors caught
//! and survived — with the allocator's invariant checker run periodically and at the end. At the
//! end everything is freed and the cache emptied, and the driver's view of this process must be
//! back to what it was with only the CUDA context: anything more is a leak. It runs under
//! whatever allocator config the session has (`--alloc-conf expandable_segments:True` soaks
//! expandable segments once the allocator has them).

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use super::splitmix::SplitMix64;
use gpumem::alloc::format::format_size;
use gpumem::alloc::{AllocError, Allocation, CachingAllocator, MIB};

/// The largest request the soak makes.
pub const MAX_REQUEST: u64 = 4 << 30;

/// Operations between two invariant checks.
pub const CHECK_EVERY: u64 = 500;

/// Most blocks alive at once (more would only make every request an OOM).
const MAX_LIVE: usize = 256;

/// What the soak did, and whether it found a fault.
#[derive(Debug, Default)]
pub struct Report {
    /// Operations of every kind.
    pub ops: u64,
    /// Successful allocations.
    pub mallocs: u64,
    /// Frees.
    pub frees: u64,
    /// Out-of-memory errors caught.
    pub ooms: u64,
    /// `empty_cache()` calls.
    pub empty_caches: u64,
    /// Invariant checks run.
    pub checks: u64,
    /// This process's device memory with only the context, before the first allocation.
    pub context_bytes: u64,
    /// The same at the end, everything freed and the cache emptied.
    pub end_bytes: u64,
    /// The first fault found, if any.
    pub fault: Option<String>,
}

/// Mostly small and medium requests, with a tail up to [`MAX_REQUEST`].
fn request_size(random: &mut SplitMix64) -> u64 {
    match random.below(10) {
        0..=4 => 1 + random.below(MIB),
        5..=7 => MIB + random.below(100 * MIB),
        _ => 100 * MIB + random.below(MAX_REQUEST - 100 * MIB + 1),
    }
}

/// This process's device memory in the driver's view.
fn process_bytes(allocator: &CachingAllocator) -> Result<u64, String> {
    allocator
        .device()
        .driver_memory()
        .map(|memory| memory.process_bytes)
        .map_err(|error| format!("cannot read the driver's view: {error}"))
}

/// Runs the soak for `duration` with `seed`. `leak_tolerance` is how far the driver's figure
/// may end above the context-only one (0 on the simulator; the driver's 2 MiB page on a GPU,
/// where NVML's reading can move by one page).
pub fn soak(
    allocator: &mut CachingAllocator,
    duration: Duration,
    seed: u64,
    leak_tolerance: u64,
) -> Report {
    let mut report = Report::default();
    if let Err(fault) = run(allocator, duration, seed, leak_tolerance, &mut report) {
        report.fault = Some(fault);
    }
    report
}

fn run(
    allocator: &mut CachingAllocator,
    duration: Duration,
    seed: u64,
    leak_tolerance: u64,
    report: &mut Report,
) -> Result<(), String> {
    // One tiny allocation creates the CUDA context; with it freed and the cache emptied, what
    // the driver counts for this process is the context alone.
    let first = allocator
        .malloc(512)
        .map_err(|error| format!("the first allocation failed: {error}"))?;
    allocator.free(first).map_err(|e| e.to_string())?;
    allocator.empty_cache().map_err(|e| e.to_string())?;
    report.context_bytes = process_bytes(allocator)?;

    let mut random = SplitMix64(seed);
    let mut live: Vec<Allocation> = Vec::new();
    let start = Instant::now();
    while start.elapsed() < duration {
        report.ops += 1;
        match random.below(100) {
            0..=54 if live.len() < MAX_LIVE => match allocator.malloc(request_size(&mut random)) {
                Ok(block) => {
                    report.mallocs += 1;
                    live.push(block);
                }
                Err(AllocError::OutOfMemory(_)) => report.ooms += 1,
                Err(other) => return Err(format!("malloc failed: {other}")),
            },
            0..=96 if !live.is_empty() => {
                let block = live.swap_remove(random.below(live.len() as u64) as usize);
                allocator
                    .free(block)
                    .map_err(|e| format!("free failed: {e}"))?;
                report.frees += 1;
            }
            _ => {
                allocator
                    .empty_cache()
                    .map_err(|e| format!("empty_cache failed: {e}"))?;
                report.empty_caches += 1;
            }
        }
        if report.ops.is_multiple_of(CHECK_EVERY) {
            report.checks += 1;
            allocator.check_invariants().map_err(|violation| {
                format!("invariant broken after {} ops: {violation}", report.ops)
            })?;
        }
    }
    for block in live.drain(..) {
        allocator
            .free(block)
            .map_err(|e| format!("free failed: {e}"))?;
        report.frees += 1;
    }
    allocator
        .empty_cache()
        .map_err(|e| format!("empty_cache failed: {e}"))?;
    report.checks += 1;
    allocator
        .check_invariants()
        .map_err(|violation| format!("invariant broken at the end: {violation}"))?;
    let stats = allocator.stats();
    if stats.allocated_bytes.all.current != 0 || stats.reserved_bytes.all.current != 0 {
        return Err(format!(
            "leftover after freeing everything and emptying the cache: {} allocated, {} reserved",
            stats.allocated_bytes.all.current, stats.reserved_bytes.all.current
        ));
    }
    report.end_bytes = process_bytes(allocator)?;
    if report.end_bytes > report.context_bytes + leak_tolerance {
        return Err(format!(
            "the driver counts {} more for this process than its context alone",
            format_size(report.end_bytes - report.context_bytes)
        ));
    }
    Ok(())
}

impl Report {
    /// The lines `gpumem bench soak` prints, the verdict (`PASS`/`FAIL: ...`) last.
    pub fn render(&self, device: &str, seconds: f64, seed: u64, config: &str) -> String {
        let mut text = String::new();
        let _ = writeln!(
            text,
            "soak: {seconds} s on {device}, seed {seed}, config '{config}'"
        );
        let _ = writeln!(
            text,
            "ops {} (mallocs {}, frees {}, OOMs caught {}, empty_cache {}), invariant checks {}",
            self.ops, self.mallocs, self.frees, self.ooms, self.empty_caches, self.checks
        );
        let _ = writeln!(
            text,
            "driver's view of this process: {} with the context alone, {} at the end with everything freed and the cache emptied (leftover {})",
            format_size(self.context_bytes),
            format_size(self.end_bytes),
            format_size(self.end_bytes.saturating_sub(self.context_bytes))
        );
        match &self.fault {
            None => text.push_str("PASS"),
            Some(fault) => {
                let _ = write!(text, "FAIL: {fault}");
            }
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumem::alloc::AllocConf;
    use gpumem::device::sim::SimDevice;

    #[test]
    fn a_short_soak_on_sim_passes_and_is_reproducible() {
        let run = |seed| {
            let mut allocator = CachingAllocator::new(
                Box::new(SimDevice::new(64 << 30)),
                AllocConf::parse("max_split_size_mb:64").expect("conf"),
            )
            .expect("allocator");
            soak(&mut allocator, Duration::from_millis(200), seed, 0)
        };
        let report = run(7);
        assert_eq!(report.fault, None, "{report:?}");
        assert!(report.mallocs > 0 && report.frees >= report.mallocs && report.checks > 0);
        assert!(
            report.ooms > 0,
            "4 GiB requests must hit a 64 GiB device's limit: {report:?}"
        );
        assert_eq!(report.end_bytes, report.context_bytes);
        assert!(report.render("sim", 0.2, 7, "").ends_with("PASS"));
    }
}
