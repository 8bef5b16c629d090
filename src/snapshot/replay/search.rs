//! What-if questions answered by replaying more than once: the smallest simulated device a
//! job fits on, by binary search over capacities in 2 MiB steps.

use std::path::Path;

use serde::Serialize;

use super::{replay, ReplayError, ReplayOptions};
use crate::alloc::AllocConf;

/// The search's step: `cudaMalloc`'s 2 MiB granularity.
pub const STEP: u64 = 2 << 20;

/// The smallest device found, and the bounds searched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct CapacitySearch {
    /// The smallest capacity (a multiple of 2 MiB, or `upper` itself) on which the replay has
    /// no OOM; `None` when it does not fit even on `upper`.
    pub capacity: Option<u64>,
    /// The largest capacity known not to fit: the peak allocated bytes rounded down to 2 MiB
    /// (a device must hold at least those, plus its context).
    pub lower: u64,
    /// The capacity the search started from (the device asked for, or the simulated H200).
    pub upper: u64,
    /// Replays run.
    pub probes: u32,
}

/// Finds the smallest simulated device on which the snapshot at `path` replays without an
/// OOM under `conf` (`None`: the recorded config), replaying device `device_index` (`None`: the
/// first with entries). Assumes that fitting is monotone in the
/// capacity, which holds unless a smaller device's extra cache flushes happen to lower the
/// fragmentation later on.
pub fn min_capacity(
    path: &Path,
    upper: Option<u64>,
    conf: Option<AllocConf>,
    device_index: Option<u32>,
) -> Result<CapacitySearch, ReplayError> {
    let mut options = ReplayOptions {
        capacity: upper,
        conf,
        device_index,
        ..ReplayOptions::default()
    };
    let (upper, _) = options.capacity();
    let first = replay(path, &options, &mut super::no_progress)?;
    // Later probes replay under the config the first one settled on.
    if options.conf.is_none() {
        options.conf = Some(first.conf.clone());
    }
    let peak = first.stat("allocated_bytes.all.peak").max(0) as u64;
    let lower = peak / STEP * STEP;
    let mut search = CapacitySearch {
        capacity: None,
        lower,
        upper,
        probes: 1,
    };
    if !first.fits() {
        return Ok(search);
    }
    let mut fits = |capacity: u64, search: &mut CapacitySearch| -> Result<bool, ReplayError> {
        search.probes += 1;
        options.capacity = Some(capacity);
        Ok(replay(path, &options, &mut super::no_progress)?.fits())
    };
    // Steps of 2 MiB: `low` never fits, `high` fits.
    let mut low = lower / STEP;
    let mut high = upper / STEP;
    if high <= low || !fits(high * STEP, &mut search)? {
        search.capacity = Some(upper);
        return Ok(search);
    }
    while high - low > 1 {
        let middle = low + (high - low) / 2;
        if fits(middle * STEP, &mut search)? {
            high = middle;
        } else {
            low = middle;
        }
    }
    search.capacity = Some(high * STEP);
    Ok(search)
}
