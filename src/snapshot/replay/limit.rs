//! The limit a job ran under, inferred from its trace when the file does not record it (a
//! memory fraction never is): every `cudaMalloc` that succeeded shows the limit was at least
//! the reserved bytes after it, and every recorded OOM that it was below the reserved bytes
//! then plus the segment the request needed. When those bounds agree, the OOM event's
//! `device_free` tells which kind of limit it was: a cap (`set_per_process_memory_fraction`)
//! when the device still had room, the device's own free memory (another process, or a
//! smaller GPU) when it did not.

use serde::Serialize;

use crate::alloc::format::format_size;

/// Bytes per page of an expandable segment: 2 MiB in the small pool, 20 MiB in the large.
fn expandable_page(size: u64) -> u64 {
    if size <= crate::alloc::SMALL_SIZE {
        crate::alloc::SMALL_BUFFER
    } else {
        crate::alloc::LARGE_BUFFER
    }
}

/// One recorded `oom` event, with the reserved bytes the trace shows at it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordedOom {
    /// The event's index in the file.
    pub index: u64,
    /// The rounded request PyTorch could not serve (the event's `size`).
    pub size: u64,
    /// The device's free bytes then (the event's `device_free`).
    pub device_free: u64,
    /// Reserved bytes then, relative to the trace's first event.
    delta: i64,
}

/// Reserved memory over the trace as its segment events move it, relative to where the
/// trace starts, and the recorded OOMs: what a limit is inferred from.
#[derive(Debug, Clone, Default)]
pub struct Pressure {
    delta: i64,
    /// The highest reserved bytes right after a `segment_alloc`/`segment_map`, and its event.
    highest: Option<(i64, u64)>,
    ooms: Vec<RecordedOom>,
    /// Recorded OOMs beyond those kept (a loop that catches thousands).
    more_ooms: u64,
}

/// Recorded OOMs kept for the inference; the rest are counted.
const KEPT_OOMS: usize = 4096;

impl Pressure {
    /// A segment (or pages) of `size` bytes was acquired at event `index`.
    pub fn acquired(&mut self, index: u64, size: u64) {
        self.delta = self.delta.saturating_add(size as i64);
        if self.highest.is_none_or(|(highest, _)| self.delta > highest) {
            self.highest = Some((self.delta, index));
        }
    }

    /// A segment (or pages) of `size` bytes went back to the device.
    pub fn released(&mut self, size: u64) {
        self.delta = self.delta.saturating_sub(size as i64);
    }

    /// An `oom` event: `size` bytes (rounded) could not be had, `device_free` bytes were free.
    pub fn oom(&mut self, index: u64, size: u64, device_free: u64) {
        if self.ooms.len() < KEPT_OOMS {
            self.ooms.push(RecordedOom {
                index,
                size,
                device_free,
                delta: self.delta,
            });
        } else {
            self.more_ooms += 1;
        }
    }

    /// The most bytes the trace held in segments at once (after a `segment_alloc` or
    /// `segment_map`), relative to its start; `None` before any.
    pub fn highest(&self) -> Option<i64> {
        self.highest.map(|(highest, _)| highest)
    }

    /// Recorded OOMs seen.
    pub fn recorded_ooms(&self) -> u64 {
        self.ooms.len() as u64 + self.more_ooms
    }

    /// What the trace shows, given the bytes reserved at its first event, whether the job
    /// used expandable segments, and its config's `large_segment_size` (the segment a request
    /// below 10 MiB asks for).
    pub fn infer(&self, start_reserved: u64, expandable: bool, large_segment_size: u64) -> Limit {
        let at = |delta: i64| (start_reserved as i64).saturating_add(delta).max(0) as u64;
        let Some(first) = self.ooms.first() else {
            return Limit::NoRecordedOoms;
        };
        let (lower, lower_index) = match self.highest {
            Some((delta, index)) => (at(delta).max(start_reserved), Some(index)),
            None => (start_reserved, None),
        };
        // The OOM whose reserved + segment is lowest bounds the limit from above.
        let segment =
            |oom: &RecordedOom| crate::alloc::allocation_size(oom.size, large_segment_size);
        let binding = self
            .ooms
            .iter()
            .min_by_key(|oom| at(oom.delta).saturating_add(segment(oom)))
            .unwrap_or(first);
        let upper = at(binding.delta).saturating_add(segment(binding));
        let reserved_at_oom = at(binding.delta);
        // What the device had to find for the request: the segment, or with expandable
        // segments the pages of the request.
        let needed = if expandable {
            binding.size.div_ceil(expandable_page(binding.size)) * expandable_page(binding.size)
        } else {
            segment(binding)
        };
        let bounds = Bounds {
            lower,
            lower_index,
            upper,
            upper_index: binding.index,
            reserved_at_oom,
            device_free: binding.device_free,
            needed,
        };
        if lower >= upper {
            return Limit::Inconsistent(bounds);
        }
        if binding.device_free >= needed {
            return Limit::Cap(bounds);
        }
        // The device was full: the job could hold what it held plus what was free.
        let usable = reserved_at_oom.saturating_add(binding.device_free);
        if usable < lower {
            return Limit::Inconsistent(bounds);
        }
        Limit::Device { bounds, usable }
    }
}

/// The bounds a trace puts on the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Bounds {
    /// The limit was at least this: the highest reserved bytes after a successful
    /// `cudaMalloc` (or, with none in the trace, the bytes reserved at its start).
    pub lower: u64,
    /// The event of that `cudaMalloc`.
    pub lower_index: Option<u64>,
    /// The limit was below this: reserved bytes at a recorded OOM plus the segment it needed
    /// (the lowest such sum over the recorded OOMs).
    pub upper: u64,
    /// The event of that OOM.
    pub upper_index: u64,
    /// Reserved bytes at that OOM.
    pub reserved_at_oom: u64,
    /// The device's free bytes at that OOM (the event's `device_free`).
    pub device_free: u64,
    /// What the device had to provide for the request.
    pub needed: u64,
}

/// What the recorded OOMs say about the limit the job ran under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// The trace records no OOM: nothing to infer.
    NoRecordedOoms,
    /// A cap on reserved memory between the bounds explains every recorded OOM, and the
    /// device had room at them: `set_per_process_memory_fraction` (never in the file).
    Cap(Bounds),
    /// The device had less free memory than the request needed: the job could reserve
    /// `usable` bytes; the rest was held by another process (or the GPU is smaller).
    Device {
        /// The bounds.
        bounds: Bounds,
        /// Reserved plus free bytes at the OOM: what the job could hold.
        usable: u64,
    },
    /// No single limit explains the trace: memory this job could use changed while it ran
    /// (another process took or gave back memory).
    Inconsistent(Bounds),
}

impl Limit {
    /// A short name for JSON: `"none"`, `"cap"`, `"device"`, `"inconsistent"`.
    pub fn kind(&self) -> &'static str {
        match self {
            Limit::NoRecordedOoms => "none",
            Limit::Cap(_) => "cap",
            Limit::Device { .. } => "device",
            Limit::Inconsistent(_) => "inconsistent",
        }
    }

    /// The bounds, when there were recorded OOMs.
    pub fn bounds(&self) -> Option<&Bounds> {
        match self {
            Limit::NoRecordedOoms => None,
            Limit::Cap(bounds) | Limit::Inconsistent(bounds) => Some(bounds),
            Limit::Device { bounds, .. } => Some(bounds),
        }
    }

    /// One sentence saying what the trace shows.
    pub fn describe(&self) -> String {
        let bounds = match self {
            Limit::NoRecordedOoms => return "no recorded OOM, so no limit to infer".into(),
            Limit::Cap(bounds) | Limit::Inconsistent(bounds) | Limit::Device { bounds, .. } => {
                bounds
            }
        };
        let after = match bounds.lower_index {
            Some(index) => format!("a cudaMalloc at event {index} succeeded with"),
            None => "the trace starts with".into(),
        };
        let range = format!(
            "{after} {} reserved, and the OOM at event {} failed with {} reserved + {} needed",
            format_size(bounds.lower),
            bounds.upper_index,
            format_size(bounds.reserved_at_oom),
            format_size(bounds.upper - bounds.reserved_at_oom)
        );
        match self {
            Limit::Cap(_) => format!(
                "a cap of at least {} and below {} on reserved memory ({range}; the device still had {} free there, so a memory fraction, which the file does not record)",
                format_size(bounds.lower),
                format_size(bounds.upper),
                format_size(bounds.device_free)
            ),
            Limit::Device { usable, .. } => format!(
                "the device's free memory: at the OOM at event {} it had only {} free for {} needed, so the job could hold {} ({range}); the rest was held by another process, or the GPU was smaller",
                bounds.upper_index,
                format_size(bounds.device_free),
                format_size(bounds.needed),
                format_size(*usable)
            ),
            Limit::NoRecordedOoms | Limit::Inconsistent(_) => format!(
                "no single limit: {range}, so the memory the job could use changed while it ran; the device had {} free at that OOM (another process took or gave back memory)",
                format_size(bounds.device_free)
            ),
        }
    }
}

/// How an inferred limit was put on the replay's device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Applied {
    /// Not applied: no limit inferred, or one that cannot be replayed.
    No,
    /// A memory fraction whose cap is this many bytes.
    Cap(u64),
    /// This many bytes of the simulated device held by something else.
    HeldElsewhere(u64),
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_cap_between_the_last_malloc_and_the_oom() {
        let mut pressure = Pressure::default();
        pressure.acquired(3, 20 * MIB);
        pressure.acquired(7, 40 * MIB);
        pressure.oom(9, 30 * MIB, 100 << 30);
        let limit = pressure.infer(0, false, crate::alloc::LARGE_BUFFER);
        let bounds = *limit.bounds().expect("bounds");
        assert_eq!(limit.kind(), "cap");
        assert_eq!(bounds.lower, 60 * MIB);
        assert_eq!(bounds.lower_index, Some(7));
        assert_eq!(bounds.upper, 90 * MIB);
        assert!(limit
            .describe()
            .contains("at least 60.00 MiB and below 90.00 MiB"));
    }

    #[test]
    fn a_full_device_and_bounds_that_cannot_agree() {
        let mut pressure = Pressure::default();
        pressure.acquired(1, 100 * MIB);
        pressure.oom(2, 50 * MIB, 10 * MIB);
        let limit = pressure.infer(0, false, crate::alloc::LARGE_BUFFER);
        assert_eq!(
            limit,
            Limit::Device {
                bounds: *limit.bounds().expect("bounds"),
                usable: 110 * MIB
            }
        );
        let mut pressure = Pressure::default();
        pressure.acquired(1, 100 * MIB);
        pressure.released(100 * MIB);
        pressure.oom(2, 20 * MIB, 10 * MIB);
        let limit = pressure.infer(0, false, crate::alloc::LARGE_BUFFER);
        assert_eq!(limit.kind(), "inconsistent", "{}", limit.describe());
        assert_eq!(
            Pressure::default().infer(0, false, crate::alloc::LARGE_BUFFER),
            Limit::NoRecordedOoms
        );
    }
}
