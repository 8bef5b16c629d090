//! What a replay found: the report, its JSON form (`gpumem replay --json`) and its text.

use std::fmt;

use serde::Serialize;
use serde_json::{json, Map, Value};

use super::compare::SegmentComparison;
use super::engine::{Counts, FirstOom, PoolRoutes};
use super::Placement;
use crate::alloc::format::format_size;
use crate::alloc::{AllocConf, DeviceStats};
use crate::snapshot::pickle::Remainder;

/// One device's trace in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DeviceTrace {
    /// Its position in `device_traces` (the device ordinal).
    pub index: u32,
    /// Trace entries recorded for it (markers included).
    pub entries: u64,
}

/// Pinned host memory the file records (`host_segments`, `host_traces`: PyTorch 2.13 with
/// `record_pinned_host_memory=True`), reported apart and never replayed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct HostMemory {
    /// Host segments at the time of the snapshot.
    pub segments: u64,
    /// Their bytes.
    pub reserved: u64,
    /// Bytes of their allocated blocks.
    pub allocated: u64,
    /// Trace entries of the host allocator.
    pub entries: u64,
}

impl HostMemory {
    /// What the file records of pinned host memory.
    pub fn of(remainder: &Remainder) -> HostMemory {
        let sum = |of: fn(&crate::snapshot::pickle::SegmentRecord) -> u64| {
            remainder
                .host_segments
                .iter()
                .fold(0_u64, |total, segment| total.saturating_add(of(segment)))
        };
        HostMemory {
            segments: remainder.host_segments.len() as u64,
            reserved: sum(|segment| segment.total_size),
            allocated: sum(|segment| segment.allocated_size),
            entries: remainder
                .host_traces
                .iter()
                .map(|(_, entries)| entries)
                .sum(),
        }
    }

    /// Whether the file records any.
    pub fn is_empty(&self) -> bool {
        self.segments == 0 && self.entries == 0
    }
}

/// Where the device capacity of a replay came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CapacitySource {
    /// The simulated H200's, because PyTorch's snapshot does not record the device's size.
    DefaultH200,
    /// Given by the caller (`--device sim:SIZE`).
    Given,
}

/// Where the allocator config of a replay came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ConfSource {
    /// The file's `allocator_settings`.
    Recorded,
    /// PyTorch's defaults: the file has no `allocator_settings`.
    DefaultNoSettings,
    /// Given by the caller (`--alloc-conf`).
    Given,
}

/// Memory reserved but not allocated at the end.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Fragmentation {
    /// Reserved minus allocated bytes.
    pub reserved_unallocated: i64,
    /// Of those, bytes in free pieces of split segments (`empty_cache()` cannot return them).
    pub inactive_split: i64,
    /// `reserved_unallocated` as a fraction of reserved (0 when nothing is reserved).
    pub fraction: f64,
}

impl Fragmentation {
    /// From the final counters.
    pub fn of(stats: &DeviceStats) -> Fragmentation {
        let reserved = stats.reserved_bytes.all.current;
        let unallocated = reserved - stats.allocated_bytes.all.current;
        Fragmentation {
            reserved_unallocated: unallocated,
            inactive_split: stats.inactive_split_bytes.all.current,
            fraction: if reserved > 0 {
                unallocated as f64 / reserved as f64
            } else {
                0.0
            },
        }
    }
}

/// Everything a replay reports.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayReport {
    /// The snapshot replayed.
    pub file: String,
    /// Which device's trace was replayed (its position in `device_traces`).
    pub device_index: usize,
    /// Total bytes of the simulated device.
    pub capacity: u64,
    /// Where that came from.
    pub capacity_source: CapacitySource,
    /// The allocator config replayed under (PyTorch's syntax; empty = defaults).
    pub alloc_conf: String,
    /// The same config, parsed (with values recorded in the file put over the text).
    pub conf: AllocConf,
    /// Where that came from.
    pub conf_source: ConfSource,
    /// Where segments were placed: [`Placement::Recorded`] or [`Placement::Model`].
    pub placement: Placement,
    /// Which allocations went to private pools (from the file's segments).
    pub routes: PoolRoutes,
    /// What was replayed.
    pub counts: Counts,
    /// The first OOM, if any.
    pub first_oom: Option<FirstOom>,
    /// Every `memory_stats()` key after the last event, in Python's order.
    pub final_stats: Vec<(String, i64)>,
    /// Reserved-but-unallocated memory at the end.
    pub fragmentation: Fragmentation,
    /// Device events, recorded against replayed.
    pub segment_events: SegmentComparison,
    /// Every device's trace in the file.
    pub devices: Vec<DeviceTrace>,
    /// Pinned host memory in the file (not replayed).
    pub host: HostMemory,
}

impl ReplayReport {
    /// One final counter by its `memory_stats()` key (0 if unknown).
    pub fn stat(&self, key: &str) -> i64 {
        self.final_stats
            .iter()
            .find(|(name, _)| name == key)
            .map_or(0, |(_, value)| *value)
    }

    /// Whether the whole trace ran without an allocation failing.
    pub fn fits(&self) -> bool {
        self.counts.ooms == 0
    }

    /// The report as one JSON object.
    pub fn to_json(&self) -> Value {
        let stats: Map<String, Value> = self
            .final_stats
            .iter()
            .map(|(key, value)| (key.clone(), json!(value)))
            .collect();
        json!({
            "file": self.file,
            "device_index": self.device_index,
            "capacity": self.capacity,
            "capacity_source": self.capacity_source,
            "alloc_conf": self.alloc_conf,
            "conf_source": self.conf_source,
            "placement": self.placement,
            "fits": self.fits(),
            "counts": self.counts,
            "first_oom": self.first_oom,
            "final_stats": stats,
            "fragmentation": self.fragmentation,
            "segment_events": self.segment_events,
            "devices": self.devices,
            "host": self.host,
        })
    }
}

impl fmt::Display for ReplayReport {
    /// The human-readable report `gpumem replay` prints.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let size = |bytes: i64| format_size(bytes.max(0) as u64);
        let capacity_note = match self.capacity_source {
            CapacitySource::DefaultH200 => {
                " (the simulated H200: PyTorch's snapshot does not record the device's size; --device sim:SIZE sets it)"
            }
            CapacitySource::Given => "",
        };
        let conf = if self.alloc_conf.is_empty() {
            "(defaults)"
        } else {
            &self.alloc_conf
        };
        let conf_note = match self.conf_source {
            ConfSource::Recorded => "recorded in the file",
            ConfSource::DefaultNoSettings => "the file records none",
            ConfSource::Given => "--alloc-conf",
        };
        let counts = &self.counts;
        write!(f, "replay of {} (device {}", self.file, self.device_index)?;
        if self.devices.len() > 1 {
            let devices: Vec<String> = self
                .devices
                .iter()
                .map(|device| format!("{}: {} entries", device.index, device.entries))
                .collect();
            write!(f, "; the file holds devices {}", devices.join(", "))?;
        }
        writeln!(f, ")")?;
        writeln!(
            f,
            "  device          {}{capacity_note}",
            format_size(self.capacity)
        )?;
        writeln!(f, "  allocator conf  {conf} ({conf_note})")?;
        let placement = match self.placement {
            Placement::Recorded => "recorded addresses (the replay follows the recorded config)",
            _ => "the simulator's model (a config other than the recorded one)",
        };
        writeln!(f, "  placement       {placement}")?;
        writeln!(
            f,
            "  events          {} ({} alloc, {} free_completed, {} still pending at the end)",
            counts.events, counts.allocs, counts.frees, counts.pending_frees
        )?;
        if counts.deferred_frees > 0 {
            writeln!(
                f,
                "                  {} frees deferred by record_stream (allocated falls at free_requested)",
                counts.deferred_frees
            )?;
        }
        if counts.pooled_allocs > 0 {
            writeln!(
                f,
                "                  {} allocations in private pools (by the file's segment_pool_id)",
                counts.pooled_allocs
            )?;
        }
        if counts.other_device_events > 0 {
            writeln!(
                f,
                "                  {} events of other devices not replayed",
                counts.other_device_events
            )?;
        }
        if counts.empty_cache_calls > 0 {
            writeln!(
                f,
                "                  {} empty_cache() calls seen in the trace, replayed",
                counts.empty_cache_calls
            )?;
        }
        writeln!(
            f,
            "  peak allocated  {}",
            size(self.stat("allocated_bytes.all.peak"))
        )?;
        writeln!(
            f,
            "  peak reserved   {}",
            size(self.stat("reserved_bytes.all.peak"))
        )?;
        writeln!(
            f,
            "  cudaMalloc      {} (cudaFree {}), retries {}",
            self.stat("num_device_alloc"),
            self.stat("num_device_free"),
            self.stat("num_alloc_retries")
        )?;
        match &self.first_oom {
            None => writeln!(f, "  OOMs            0: the job fits")?,
            Some(oom) => {
                writeln!(
                    f,
                    "  OOMs            {} (each alloc skipped with its free); the first at event {}: {} requested with {} allocated, {} reserved, {} free on the device",
                    counts.ooms,
                    oom.index,
                    format_size(oom.size),
                    size(oom.allocated),
                    size(oom.reserved),
                    format_size(oom.device_free)
                )?;
            }
        }
        if counts.recorded_ooms > 0 {
            writeln!(
                f,
                "  recorded OOMs   {} in the file, {} also refused by gpumem",
                counts.recorded_ooms, counts.recorded_ooms_reproduced
            )?;
        }
        if !self.host.is_empty() {
            writeln!(
                f,
                "  pinned host     {} segments, {} reserved, {} allocated, {} trace entries (host memory: reported apart, not replayed)",
                self.host.segments,
                format_size(self.host.reserved),
                format_size(self.host.allocated),
                self.host.entries
            )?;
        }
        let fragmentation = &self.fragmentation;
        writeln!(
            f,
            "  fragmentation   {} reserved but unallocated at the end ({:.1}% of reserved), {} of it in split segments",
            size(fragmentation.reserved_unallocated),
            fragmentation.fraction * 100.0,
            size(fragmentation.inactive_split)
        )?;
        let segments = &self.segment_events;
        write!(
            f,
            "  segment events  {} recorded, {} replayed, {} differ",
            segments.recorded, segments.replayed, segments.differing
        )?;
        let paired = segments.recorded.min(segments.replayed);
        if paired > 0 {
            write!(
                f,
                "; {} of {} at the same address, {} at the same offset from the first",
                segments.same_address, paired, segments.same_offset
            )?;
        }
        writeln!(f)?;
        if let Some(first) = &segments.first_difference {
            let side = |seen: &Option<super::compare::Seen>| match seen {
                Some(seen) => format!(
                    "{} {} at {:#x} (event {})",
                    seen.action,
                    format_size(seen.size),
                    seen.addr,
                    seen.index
                ),
                None => "nothing".into(),
            };
            writeln!(
                f,
                "                  first difference at device event {}: PyTorch {}, gpumem {}",
                first.position,
                side(&first.recorded),
                side(&first.replayed)
            )?;
        }
        Ok(())
    }
}
