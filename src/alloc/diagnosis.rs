//! Why an allocation failed: the facts at the moment of PyTorch's out-of-memory error and the
//! one cause they point to, worded as one line that follows PyTorch's message.
//!
//! Every figure is read from the allocator when the error is raised, after PyTorch's own
//! remedies ran: the retry after returning every wholly free cached segment (what
//! `empty_cache()` does) has already failed, so "would fit after `empty_cache()`" is never
//! the answer — whatever free memory is still cached lies in segments that hold live tensors.
//! The causes, checked in this order:
//!
//! 1. [`OomCause::Impossible`]: a request of 1 EiB or more.
//! 2. [`OomCause::NeverFits`]: the segment needed exceeds what the allocator could hold even
//!    with every tensor freed: the device's free memory plus what it already reserves.
//! 3. [`OomCause::Fragmentation`]: the pool caches at least the rounded request in free
//!    blocks, but no block is large enough — whatever then refused a new segment (the
//!    memory fraction's cap or the device), which the line names too.
//! 4. [`OomCause::OverFraction`]: `set_per_process_memory_fraction`'s cap refused the segment.
//! 5. [`OomCause::DriverRefused`]: the device reports enough free memory yet refused.
//! 6. [`OomCause::DeviceFull`]: the device has too little free memory.
//!
//! Whether expandable segments would help is tried, never estimated: a side allocator under
//! `expandable_segments:True` with this device's memory and cap allocates the live blocks
//! again and then the request ([`super::ExpandableTrial`], `alloc/trial.rs`).

use super::format::format_size as fs;
use super::trial::ExpandableTrial;
use super::{CachingAllocator, MemPoolId, Pool, PoolOwner, StreamId, DEFAULT_OWNER};

/// The cause an out-of-memory error is put down to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OomCause {
    /// A request of 1 EiB or more, which PyTorch refuses outright.
    Impossible,
    /// The segment needed exceeds the device's free memory plus everything the allocator
    /// reserves: it would not fit with every tensor freed.
    NeverFits,
    /// The per-process memory fraction refused the segment, and the pool's cached free
    /// bytes could not have held the request anyway.
    OverFraction,
    /// Enough free bytes are cached in the pool, but no free block is large enough (and a
    /// new segment was refused, by the cap or the device).
    Fragmentation,
    /// The device reports enough free memory for the segment but refused it.
    DriverRefused,
    /// The device has too little free memory for the segment.
    DeviceFull,
}

impl OomCause {
    /// A short name for scripts (`"fragmentation"`, `"over_fraction"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            OomCause::Impossible => "impossible",
            OomCause::NeverFits => "never_fits",
            OomCause::OverFraction => "over_fraction",
            OomCause::Fragmentation => "fragmentation",
            OomCause::DriverRefused => "driver_refused",
            OomCause::DeviceFull => "device_full",
        }
    }
}

/// The facts at an out-of-memory error, and their cause.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OomDiagnosis {
    /// What the facts point to.
    pub cause: OomCause,
    /// Bytes the caller asked for.
    pub requested: u64,
    /// The request rounded as the allocator rounds it (the block it looked for).
    pub rounded: u64,
    /// Bytes of the segment a cache miss needs ("Tried to allocate ...").
    pub segment: u64,
    /// The pool the request belongs to.
    pub pool: Pool,
    /// The private pool (a CUDA graph's or a `MemPool`) the request was made in, if any: its
    /// blocks are the only ones it could take, so the figures below count only them.
    pub private_pool: Option<MemPoolId>,
    /// The largest free cached block of that pool.
    pub largest_free: u64,
    /// Free cached bytes of that pool.
    pub cached_free: u64,
    /// Free cached bytes of both pools, every private pool's included.
    pub cached_free_all: u64,
    /// Bytes the device reports free (`cudaMemGetInfo`).
    pub device_free: u64,
    /// The device's total memory.
    pub device_total: u64,
    /// Bytes of live blocks.
    pub allocated: u64,
    /// Bytes held from the device.
    pub reserved: u64,
    /// The memory fraction's cap, if one is set.
    pub allowed: Option<u64>,
    /// Whether expandable segments are on (then they are not suggested).
    pub expandable: bool,
    /// Bytes in whole expandable-segment pages inside the pool's free blocks: what
    /// expandable segments could unmap and map again for this request.
    pub free_pages: u64,
    /// The page size those pages are counted in (2 MiB small pool, 20 MiB large pool).
    pub page: u64,
    /// What trying the request under `expandable_segments:True` showed; `None` when they
    /// are on already, or the cause rules them out (a request too large for the device, a
    /// refusal by the driver).
    pub expandable_trial: Option<ExpandableTrial>,
}

impl OomDiagnosis {
    /// The memory fraction the cap stands for (1 without a cap), as
    /// `get_per_process_memory_fraction()` reports it.
    pub fn fraction(&self) -> f64 {
        match self.allowed {
            Some(allowed) if self.device_total > 0 => allowed as f64 / self.device_total as f64,
            _ => 1.0,
        }
    }

    /// Whether expandable segments would have served the request: the live blocks and then
    /// the request, tried on a side allocator with `expandable_segments:True`, all fitted.
    pub fn fits_with_expandable(&self) -> bool {
        self.expandable_trial.is_some_and(|trial| trial.fits)
    }

    /// `reserved + segment > allowed (fraction f)`, the cap's refusal in figures.
    fn over_cap(&self, needed: &str) -> String {
        format!(
            "{} reserved + {needed} > {} allowed (fraction {})",
            fs(self.reserved),
            fs(self.allowed.unwrap_or(0)),
            fraction_text(self.fraction())
        )
    }

    /// What refused a new segment after the cache had no block large enough.
    fn segment_refusal(&self, needed: &str) -> String {
        let over_cap = self
            .allowed
            .is_some_and(|allowed| self.reserved.saturating_add(self.segment) > allowed);
        if over_cap {
            format!(
                "the memory fraction leaves no room for a new segment: {}",
                self.over_cap(needed)
            )
        } else if self.device_free < self.segment {
            format!(
                "the device has {} free, too little for {needed}",
                fs(self.device_free)
            )
        } else {
            format!(
                "the device reports {} free yet refused {needed}",
                fs(self.device_free)
            )
        }
    }

    /// The clause saying what trying expandable segments showed, if it says anything.
    fn trial_clause(&self) -> Option<String> {
        let trial = self.expandable_trial?;
        let tried = format!(
            "tried on a side allocator with this device's memory and cap: the {} live blocks, {}, allocated again in address order, then this request",
            trial.live_blocks,
            fs(trial.live_bytes)
        );
        if trial.fits {
            Some(format!("would fit with expandable_segments:True ({tried})"))
        } else if self.cause == OomCause::Fragmentation {
            Some(format!(
                "expandable_segments:True would not fit it either ({tried})"
            ))
        } else {
            None
        }
    }

    /// The one gpumem line printed after PyTorch's message, e.g.
    /// `gpumem: fragmentation: largest free cached block 4.00 MiB of 20.00 MiB cached in the
    /// large pool, 8.00 MiB needed; ...`.
    pub fn why(&self) -> String {
        // No id: a replay's pool inferred from the trace has none the user would know.
        let pool = match self.private_pool {
            Some(_) => format!(
                "{} pool of the private pool it was asked in",
                self.pool.name()
            ),
            None => format!("{} pool", self.pool.name()),
        };
        // Expandable segments map pages instead of allocating a segment.
        let needed = if self.expandable {
            format!("{} of pages", fs(self.segment))
        } else {
            format!("a {} segment", fs(self.segment))
        };
        let mut line = match self.cause {
            OomCause::Impossible => format!(
                "gpumem: {} bytes requested: 1 EiB or more can never be allocated",
                self.requested
            ),
            OomCause::NeverFits => format!(
                "gpumem: it cannot fit on this device: {needed} needed, but with every tensor freed at most {} ({} free + {} reserved) is available; the rest of the {} is the CUDA context and other memory",
                fs(self.device_free.saturating_add(self.reserved)),
                fs(self.device_free),
                fs(self.reserved),
                fs(self.device_total)
            ),
            OomCause::OverFraction => {
                let allowed = self.allowed.unwrap_or(0);
                let head = if self.segment > allowed {
                    format!(
                        "gpumem: over the memory fraction: {needed} alone is more than the {} allowed (fraction {})",
                        fs(allowed),
                        fraction_text(self.fraction())
                    )
                } else {
                    format!("gpumem: over the memory fraction: {}", self.over_cap(&needed))
                };
                let device = if self.segment <= self.device_free {
                    format!(
                        "the device has {} free, so a larger fraction would fit",
                        fs(self.device_free)
                    )
                } else {
                    format!(
                        "the device itself has only {} free",
                        fs(self.device_free)
                    )
                };
                format!("{head}; {device}")
            }
            OomCause::Fragmentation => format!(
                "gpumem: fragmentation: largest free cached block {} of {} cached in the {pool}, {} needed; empty_cache() cannot help (every free block shares its segment with a live tensor); {}",
                fs(self.largest_free),
                fs(self.cached_free),
                fs(self.rounded),
                self.segment_refusal(&needed)
            ),
            OomCause::DriverRefused => format!(
                "gpumem: the device refused {needed} although it reports {} free (the driver's own fragmentation or granularity)",
                fs(self.device_free)
            ),
            OomCause::DeviceFull => {
                let cached = if self.cached_free > 0 {
                    format!(
                        ", and {} stays cached in the {pool} in blocks of at most {}",
                        fs(self.cached_free),
                        fs(self.largest_free)
                    )
                } else {
                    String::new()
                };
                format!(
                    "gpumem: the device is full: {needed} needed, {} free on the device; live tensors hold {}{cached}",
                    fs(self.device_free),
                    fs(self.allocated)
                )
            }
        };
        if let Some(clause) = self.trial_clause() {
            line.push_str("; ");
            line.push_str(&clause);
        }
        line
    }
}

/// A fraction with at most four decimals and no trailing zeros (`0.02`, `0.3333`).
fn fraction_text(fraction: f64) -> String {
    let text = format!("{fraction:.4}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

impl CachingAllocator {
    /// The facts of an out-of-memory error for a request of `requested` bytes on `stream`,
    /// rounded to `rounded`, that needed a `segment`-byte segment, asked in the pool of
    /// `owner` (a private pool's request can take only that pool's blocks), with the cause
    /// they point to.
    pub(super) fn diagnose(
        &self,
        (stream, owner): (StreamId, PoolOwner),
        requested: u64,
        rounded: u64,
        segment: u64,
    ) -> OomDiagnosis {
        let pool = Self::pool_for(rounded);
        let page = self.page_size(pool);
        let (mut largest_free, mut cached_free, mut cached_free_all, mut free_pages) = (0, 0, 0, 0);
        // Free blocks with memory behind them (unmapped ranges of expandable segments are
        // blocks too, but hold nothing).
        for block in self
            .blocks()
            .filter(|block| !block.allocated && block.mapped)
        {
            cached_free_all += block.size;
            if block.pool != pool || block.owner != owner {
                continue;
            }
            cached_free += block.size;
            largest_free = largest_free.max(block.size);
            // Whole pages counted from the segment's base, as an expandable segment's are.
            let base = match self.expandable.get(block.segment) {
                Some(segment) => segment.base.addr(),
                None => self
                    .segments
                    .range(..=block.ptr)
                    .next_back()
                    .map_or(block.ptr, |(&base, _)| base),
            };
            let first = (block.ptr - base).div_ceil(page);
            let last = (block.ptr + block.size - base) / page;
            free_pages += last.saturating_sub(first) * page;
        }
        let (device_free, device_total) = self.device.mem_get_info().unwrap_or((0, 0));
        let reserved = self.stats.reserved_bytes.all.current.max(0) as u64;
        let over_fraction = self
            .allowed_memory_maximum
            .is_some_and(|allowed| reserved.saturating_add(segment) > allowed);
        let cause = if requested >= super::ONE_EXABYTE {
            OomCause::Impossible
        } else if segment > device_free.saturating_add(reserved) {
            OomCause::NeverFits
        } else if cached_free >= rounded {
            OomCause::Fragmentation
        } else if over_fraction {
            OomCause::OverFraction
        } else if device_free >= segment {
            OomCause::DriverRefused
        } else {
            OomCause::DeviceFull
        };
        let expandable_trial = match cause {
            _ if !self.expandable_trials => None,
            OomCause::Impossible | OomCause::NeverFits | OomCause::DriverRefused => None,
            _ => self.try_with_expandable(stream, requested, device_free, device_total),
        };
        OomDiagnosis {
            cause,
            requested,
            rounded,
            segment,
            pool,
            private_pool: (owner != DEFAULT_OWNER).then(|| self.pool_id(owner)),
            largest_free,
            cached_free,
            cached_free_all,
            device_free,
            device_total,
            allocated: self.stats.allocated_bytes.all.current.max(0) as u64,
            reserved,
            allowed: self.allowed_memory_maximum,
            expandable: self.config.expandable_segments,
            free_pages,
            page,
            expandable_trial,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::{AllocConf, AllocError};
    use crate::device::{DeviceError, DeviceMemory, DevicePtr, ProcessMemory};

    /// A device that reports 1 GiB free and refuses every segment.
    struct Refusing;

    impl DeviceMemory for Refusing {
        fn malloc(&mut self, _bytes: u64) -> Result<DevicePtr, DeviceError> {
            Err(DeviceError::OutOfMemory)
        }
        fn free(&mut self, _segment: DevicePtr) -> Result<(), DeviceError> {
            Ok(())
        }
        fn mem_get_info(&self) -> Result<(u64, u64), DeviceError> {
            Ok((1 << 30, 2 << 30))
        }
        fn total_memory(&self) -> u64 {
            2 << 30
        }
        fn index(&self) -> usize {
            0
        }
        fn process_memory(&self) -> Vec<ProcessMemory> {
            Vec::new()
        }
        fn label(&self) -> String {
            "refusing".into()
        }
    }

    #[test]
    fn a_refusal_with_room_on_the_device_is_the_drivers() {
        let mut allocator =
            CachingAllocator::new(Box::new(Refusing), AllocConf::default()).expect("allocator");
        let Err(AllocError::OutOfMemory(oom)) = allocator.malloc(100 << 20) else {
            panic!("the refusing device must make malloc fail");
        };
        assert_eq!(oom.diagnosis.cause, OomCause::DriverRefused);
        assert_eq!(
            oom.why(),
            "gpumem: the device refused a 100.00 MiB segment although it reports 1024.00 MiB free (the driver's own fragmentation or granularity)"
        );
        assert!(
            !oom.message.contains("gpumem"),
            "PyTorch's text stays unchanged"
        );
    }

    /// A sim device of 1 GiB capped at `cap_mib`, filled with 4 MiB tensors until the cap
    /// refuses, every tensor but each fifth freed (so each 20 MiB segment keeps one 4 MiB
    /// tensor in its middle): the layout of scripts/fragmentation.rhai part 3.
    fn thinned(cap_mib: u64) -> (CachingAllocator, Vec<crate::alloc::Allocation>) {
        use crate::device::sim::SimDevice;
        let mib = 1 << 20;
        let device = SimDevice::new(1 << 30);
        let mut allocator =
            CachingAllocator::new(Box::new(device), AllocConf::default()).expect("allocator");
        allocator
            .set_memory_fraction((cap_mib * mib) as f64 / (1u64 << 30) as f64)
            .expect("fraction");
        let mut blocks = Vec::new();
        while let Ok(block) = allocator.malloc(4 * mib) {
            blocks.push(block);
        }
        let mut kept = Vec::new();
        for (index, block) in blocks.into_iter().enumerate() {
            if index % 5 == 2 {
                kept.push(block);
            } else {
                allocator.free(block).expect("free");
            }
        }
        (allocator, kept)
    }

    #[test]
    fn a_private_pools_request_counts_only_that_pools_blocks() {
        let mib = 1 << 20;
        // 400 MiB cached free in the default pools, in 8 MiB holes.
        let (mut allocator, _kept) = thinned(510);
        let pool = allocator.new_mem_pool_id();
        allocator.create_pool(pool).expect("MemPool()");
        allocator
            .begin_allocate_to_pool(pool, crate::alloc::PoolFilter::AllStreams)
            .expect("use_mem_pool");
        let Err(AllocError::OutOfMemory(oom)) = allocator.malloc(4 * mib) else {
            panic!("the pool has no block and the cap is reached");
        };
        let diagnosis = &oom.diagnosis;
        assert_eq!(diagnosis.private_pool, Some(pool));
        // The default pools' holes would have served 4 MiB, but a pool's request cannot
        // take them: no fragmentation, the cap.
        assert_eq!(diagnosis.cached_free, 0, "{}", oom.why());
        assert_eq!(diagnosis.cached_free_all, 400 * mib);
        assert_eq!(diagnosis.cause, OomCause::OverFraction, "{}", oom.why());
        allocator
            .end_allocate_to_pool(pool)
            .expect("leave the pool");
    }

    #[test]
    fn cached_free_bytes_that_no_block_holds_are_fragmentation_even_under_a_cap() {
        let mib = 1 << 20;
        let (mut allocator, kept) = thinned(510);
        let Err(AllocError::OutOfMemory(oom)) = allocator.malloc(12 * mib) else {
            panic!("12 MiB must not fit: every hole is 8 MiB and the cap is reached");
        };
        let diagnosis = &oom.diagnosis;
        assert_eq!(diagnosis.cause, OomCause::Fragmentation, "{}", oom.why());
        let why = oom.why();
        // Both figures: the cache's (free bytes that no block holds) and the cap's.
        assert!(
            why.contains("largest free cached block 8.00 MiB of 400.00 MiB cached"),
            "{why}"
        );
        assert!(why.contains("510.00 MiB allowed"), "{why}");
        // Tried, not guessed: 25 live tensors (100 MiB) allocated again on a fresh
        // expandable allocator under the same cap leave room for 12 MiB.
        assert!(diagnosis.fits_with_expandable(), "{why}");
        assert!(
            why.contains("the 25 live blocks, 100.00 MiB, allocated again"),
            "{why}"
        );
        assert_eq!(kept.len(), 25);
    }

    #[test]
    fn expandable_segments_are_tried_and_may_not_fit() {
        let mib = 1 << 20;
        // The cap is full of live tensors: replayed on an expandable allocator they still
        // fill it, so the request cannot fit there either.
        let mut allocator = CachingAllocator::new(
            Box::new(crate::device::sim::SimDevice::new(1 << 30)),
            AllocConf::default(),
        )
        .expect("allocator");
        allocator.set_memory_fraction(0.25).expect("fraction");
        let mut live = Vec::new();
        while let Ok(block) = allocator.malloc(4 * mib) {
            live.push(block);
        }
        let Err(AllocError::OutOfMemory(oom)) = allocator.malloc(4 * mib) else {
            panic!("the cap is full");
        };
        assert_eq!(oom.diagnosis.cause, OomCause::OverFraction, "{}", oom.why());
        assert!(!oom.diagnosis.fits_with_expandable(), "{}", oom.why());
        assert_eq!(live.len(), 60);
    }

    #[test]
    fn with_trials_off_the_diagnosis_tries_nothing_and_keeps_its_cause() {
        let mib = 1 << 20;
        let (mut allocator, _kept) = thinned(510);
        allocator.set_expandable_trials(false);
        let Err(AllocError::OutOfMemory(oom)) = allocator.malloc(12 * mib) else {
            panic!("12 MiB must not fit");
        };
        assert_eq!(
            oom.diagnosis.cause,
            OomCause::Fragmentation,
            "{}",
            oom.why()
        );
        assert_eq!(oom.diagnosis.expandable_trial, None);
        assert!(
            !oom.why().contains("expandable_segments:True ("),
            "{}",
            oom.why()
        );
        allocator.set_expandable_trials(true);
        let Err(AllocError::OutOfMemory(oom)) = allocator.malloc(12 * mib) else {
            panic!("12 MiB must not fit");
        };
        assert!(oom.diagnosis.fits_with_expandable(), "{}", oom.why());
    }

    #[test]
    fn fractions_print_short() {
        assert_eq!(fraction_text(0.02), "0.02");
        assert_eq!(fraction_text(0.019_999_999_9), "0.02");
        assert_eq!(fraction_text(1.0), "1");
    }
}
