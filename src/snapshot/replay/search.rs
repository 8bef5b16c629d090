//! What-if questions answered by replaying more than once: the smallest simulated device a
//! job fits on, by binary search over capacities in 2 MiB steps.
//!
//! The search starts from the peak: a device whose memory beside its CUDA context cannot hold
//! the job's peak allocated bytes cannot run it, so the largest such capacity is the lower
//! bound, and the device asked for (or the simulated H200) the upper. A capacity fits when its
//! replay fits ([`super::ReplayReport::fits`]): no allocation failed and no OOM PyTorch recorded
//! recurred there, so the search never returns a capacity on which a recorded OOM recurs; and,
//! for a replay under pressure that placed segments the recording does not, none failed with
//! every segment placed by the simulator's model either (`placement_check.rs`): a capacity
//! whose answer hangs on where the driver puts segments is not one the job fits on.
//!
//! The simulated device's CUDA context is modelled as the H200's (527 MiB) but never more than
//! an eighth of the device ([`SimDevice::new`]); a real GPU's context does not shrink, so the
//! answer also names the total memory a real GPU needs: the memory the job used beside the
//! simulated context, plus the H200's context.

use std::path::Path;

use serde::Serialize;

use super::{
    check_verdict, read, replay_recording, LimitPolicy, Recording, ReplayError, ReplayOptions,
};
use crate::alloc::AllocConf;
use crate::device::sim::{SimDevice, H200_CONTEXT_BYTES};

/// The search's step: `cudaMalloc`'s 2 MiB granularity.
pub const STEP: u64 = 2 << 20;

/// The smallest device found, and the bounds searched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CapacitySearch {
    /// The smallest capacity (a multiple of 2 MiB, or `upper` itself) on which the replay
    /// fits; `None` when it does not fit even on `upper`.
    pub capacity: Option<u64>,
    /// The largest capacity known not to fit: its memory beside the simulated context is
    /// below `peak`.
    pub lower: u64,
    /// The capacity the search started from (the device asked for, or the simulated H200).
    pub upper: u64,
    /// The peak allocated bytes of the replay on `upper` (when it fits, every allocation was
    /// served, so this is the job's own peak).
    pub peak: u64,
    /// The simulated CUDA context on `capacity` (on `upper` when nothing fits).
    pub context: u64,
    /// The total memory a real GPU needs: `capacity` less its simulated context, plus
    /// [`H200_CONTEXT_BYTES`], the context measured on the H200 (a real context does not
    /// shrink with the device).
    pub real_gpu: Option<u64>,
    /// The CUDA context assumed for a real GPU.
    pub real_context: u64,
    /// Replays run (placement checks not counted).
    pub probes: u32,
    /// The smallest capacity on which the job fits at the recording's addresses, when it is
    /// below `capacity`: from there up to `capacity` the answer depends on where the driver
    /// puts the segments the recording does not place (`placement_check.rs`), so `capacity`
    /// is the one that holds either way.
    pub borderline_from: Option<u64>,
}

/// The smallest capacity, in steps, whose memory beside the simulated context holds `peak`.
fn first_holding(peak: u64) -> u64 {
    let usable = |steps: u64| {
        let capacity = steps * STEP;
        capacity - SimDevice::new(capacity).context_bytes()
    };
    // The usable memory grows with the capacity: bisect for the first step holding the peak.
    let (mut low, mut high) = (0_u64, peak / STEP + H200_CONTEXT_BYTES / STEP + 2);
    while high - low > 1 {
        let middle = low + (high - low) / 2;
        if usable(middle) >= peak {
            high = middle;
        } else {
            low = middle;
        }
    }
    high
}

/// Finds the smallest simulated device on which the snapshot at `path` replays and fits under
/// `conf` (`None`: the recorded config), replaying device `device_index` (`None`: the first
/// with entries). Assumes that fitting is monotone in the capacity,
/// which holds unless a smaller device's extra cache flushes happen to lower the fragmentation
/// later on.
pub fn min_capacity(
    path: &Path,
    upper: Option<u64>,
    conf: Option<AllocConf>,
    device_index: Option<u32>,
) -> Result<CapacitySearch, ReplayError> {
    let recording = read(path, device_index, &mut super::no_progress)?;
    min_capacity_of(path, &recording, upper, conf)
}

/// [`min_capacity`] of a file already read.
pub fn min_capacity_of(
    path: &Path,
    recording: &Recording,
    upper: Option<u64>,
    conf: Option<AllocConf>,
) -> Result<CapacitySearch, ReplayError> {
    let mut options = ReplayOptions {
        capacity: upper,
        conf,
        device_index: u32::try_from(recording.device_index).ok(),
        limit: LimitPolicy::Never,
        ..ReplayOptions::default()
    };
    let (upper, _) = options.capacity();
    // Every probe names its capacity, so no inferred limit applies: the question is the
    // device's size alone.
    options.capacity = Some(upper);
    let mut search = CapacitySearch {
        capacity: None,
        lower: 0,
        upper,
        peak: 0,
        context: SimDevice::new(upper).context_bytes(),
        real_gpu: None,
        real_context: H200_CONTEXT_BYTES,
        probes: 0,
        borderline_from: None,
    };
    search.probes += 1;
    let first = replay_checked(path, recording, &options)?;
    search.peak = first.stat("allocated_bytes.all.peak").max(0) as u64;
    let mut low = first_holding(search.peak).saturating_sub(1);
    search.lower = low * STEP;
    if !first.fits() {
        return Ok(search);
    }
    // Each probe answers twice: whether the job fits under both placements (the search's
    // answer), and whether it fits at the recording's addresses alone, which bounds where the
    // two part: the largest capacity seen failing as placed, the smallest seen fitting.
    let mut as_placed = (low, upper / STEP);
    let mut replay_on = |steps: u64, search: &mut CapacitySearch| {
        search.probes += 1;
        options.capacity = Some(steps * STEP);
        let report = replay_checked(path, recording, &options)?;
        if report.fits_as_placed() {
            as_placed.1 = as_placed.1.min(steps);
        } else {
            as_placed.0 = as_placed.0.max(steps);
        }
        Ok::<bool, ReplayError>(report.fits())
    };
    let mut high = upper / STEP;
    if high <= low || !replay_on(high, &mut search)? {
        search.lower = search.lower.min(upper);
        return Ok(search.found(upper));
    }
    while high - low > 1 {
        let middle = low + (high - low) / 2;
        if replay_on(middle, &mut search)? {
            high = middle;
        } else {
            low = middle;
        }
    }
    let (mut failing, mut fitting) = as_placed;
    // (`failing` above `fitting` would mean fitting is not monotone in the capacity there;
    // the search assumes it is, and then names no range.)
    if failing < fitting && fitting < high {
        // Below the answer the job fits at the recording's addresses but not with the
        // model's: find the smallest such capacity, by the recording's placement alone.
        while fitting - failing > 1 {
            let middle = failing + (fitting - failing) / 2;
            search.probes += 1;
            options.capacity = Some(middle * STEP);
            let report = replay_recording(
                path,
                recording,
                &options,
                &mut super::no_progress,
                Vec::new(),
            )?;
            if report.fits() {
                fitting = middle;
            } else {
                failing = middle;
            }
        }
        search.borderline_from = Some(fitting * STEP);
    }
    Ok(search.found(high * STEP))
}

/// One probe of the search: the replay, and, under pressure, the placement check, and for a
/// what-if replay of a trace with deferred frees the timing check ([`check_verdict`]), so that
/// a capacity fits only if it fits however the driver places the segments the recording does
/// not place and whenever the GPU finishes the side streams' work. Near the smallest capacity
/// most replays retry, and there one best-fit tie, decided by a segment's address, can decide
/// an OOM.
fn replay_checked(
    path: &Path,
    recording: &Recording,
    options: &ReplayOptions,
) -> Result<super::ReplayReport, ReplayError> {
    let mut report = replay_recording(
        path,
        recording,
        options,
        &mut super::no_progress,
        Vec::new(),
    )?;
    check_verdict(
        path,
        recording,
        options,
        &mut report,
        &mut super::no_progress,
    )?;
    Ok(report)
}

impl CapacitySearch {
    /// The search with `capacity` as its answer.
    fn found(mut self, capacity: u64) -> CapacitySearch {
        self.capacity = Some(capacity);
        self.context = SimDevice::new(capacity).context_bytes();
        self.real_gpu = Some(capacity - self.context + self.real_context);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::replay::{no_progress, replay, ReplayReport};

    #[test]
    fn the_answer_fits_under_both_placements_and_names_where_they_part() {
        // Under the defaults this fixture's smallest device depends on the placement: a few
        // steps below the answer the job fits at its recorded addresses only.
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/replay/fixtures/inference.default.pickle");
        let found = min_capacity(&path, None, None, None).expect("the fixture replays");
        let capacity = found.capacity.expect("it fits on the H200");
        let from = found.borderline_from.expect("borderline below the answer");
        assert!(from < capacity, "{found:?}");
        let on = |capacity: u64| -> ReplayReport {
            let options = ReplayOptions {
                capacity: Some(capacity),
                limit: LimitPolicy::Never,
                ..ReplayOptions::default()
            };
            replay(&path, &options, &mut no_progress).expect("the fixture replays")
        };
        assert!(on(capacity).fits());
        let below = on(capacity - STEP);
        assert!(!below.fits() && below.verdict().borderline);
        let first = on(from);
        assert!(first.fits_as_placed() && !first.fits() && first.verdict().borderline);
        assert!(!on(from - STEP).fits_as_placed());
    }

    #[test]
    fn the_lower_bound_holds_the_peak_beside_the_context() {
        for peak in [1, 100 << 20, 3 << 30, 100 << 30] {
            let steps = first_holding(peak);
            let capacity = steps * STEP;
            let below = (steps - 1) * STEP;
            assert!(capacity - SimDevice::new(capacity).context_bytes() >= peak);
            assert!(below - SimDevice::new(below).context_bytes() < peak);
        }
    }
}
