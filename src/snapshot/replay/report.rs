//! What a replay found: the report, its JSON form (`gpumem replay --json`) and its text.

use std::fmt;

use serde::Serialize;
use serde_json::{json, Map, Value};

use super::answer::{Causes, UserFrame};
use super::compare::SegmentComparison;
use super::device::PlacedBy;
use super::endstate::EndStateComparison;
use super::engine::{Counts, FirstOom, PoolRoutes};
use super::frames::{self, Lookup};
use super::limit::{Applied, Limit};
use super::seed::Layout;
use super::start::StartFigures;
use super::{LimitPolicy, Placement, ReplayOptions};
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

/// The state a trace that starts mid-run was replayed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct StartReport {
    /// What it held.
    #[serde(flatten)]
    pub figures: StartFigures,
    /// How it was laid out in gpumem's allocator.
    pub layout: Layout,
    /// Live blocks that did not fit on the replay's device.
    pub failed: u64,
}

/// What a counter of a replay that starts mid-run can say about PyTorch's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StatScope {
    /// Known exactly (a current value, or the config's `max_split_size`).
    Exact,
    /// A peak over the trace's window: at most PyTorch's, whose peak may lie before it.
    WindowPeak,
    /// A peak over the window of the bytes in free pieces of split segments
    /// (`inactive_split_bytes`), which depend on the sizes of the blocks the trace frees
    /// before allocating them: those are known by their requests only, and each may have
    /// carried an unsplit tail of up to 1 MiB, so this peak may exceed PyTorch's by as much.
    EstimatedWindowPeak,
    /// A total over the trace's window only (allocations, frees, `num_*` counts).
    WindowTotal,
}

impl StatScope {
    /// The scope of the `memory_stats()` key `key` for a replay that starts mid-run.
    pub fn of(key: &str) -> StatScope {
        if key == "max_split_size" || key.ends_with(".current") {
            StatScope::Exact
        } else if key.starts_with("inactive_split_bytes.") && key.ends_with(".peak") {
            StatScope::EstimatedWindowPeak
        } else if key.ends_with(".peak") {
            StatScope::WindowPeak
        } else {
            StatScope::WindowTotal
        }
    }
}

/// What the second replay of a replay under pressure, with every segment placed by the
/// simulator's model, found (`placement_check.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PlacementCheck {
    /// Whether the job fits there.
    pub fits: bool,
    /// Its OOMs.
    pub ooms: u64,
    /// The trace event of the first (numbered as the report numbers events).
    pub first_oom_event: Option<u64>,
    /// Its `num_alloc_retries`.
    pub num_alloc_retries: i64,
    /// Its `num_device_alloc`.
    pub num_device_alloc: i64,
}

impl PlacementCheck {
    /// The report's line: what the job did with segments placed by the model.
    pub fn describe(&self) -> String {
        format!(
            "checked under pressure with every segment placed by the model: {}, {} retries, {} cudaMalloc calls",
            outcome_words(self.fits, self.ooms, self.first_oom_event),
            self.num_alloc_retries,
            self.num_device_alloc
        )
    }
}

/// What the second replay of a what-if replay with deferred frees, each completed at its
/// request, found (`timing_check.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TimingCheck {
    /// Whether the job fits there.
    pub fits: bool,
    /// Its OOMs.
    pub ooms: u64,
    /// The trace event of the first (numbered as the report numbers events).
    pub first_oom_event: Option<u64>,
}

impl TimingCheck {
    /// The report's line: what the job did with every deferred free completed at once.
    pub fn describe(&self) -> String {
        format!(
            "checked with every deferred free completed at its request (the GPU idle): {}",
            outcome_words(self.fits, self.ooms, self.first_oom_event)
        )
    }
}

/// "it fits", or "it does not fit (N OOMs, first at event E)": a second reading's answer.
fn outcome_words(fits: bool, ooms: u64, first_oom_event: Option<u64>) -> String {
    let plural = if ooms == 1 { "" } else { "s" };
    match (fits, first_oom_event) {
        (true, _) => "it fits".to_string(),
        (false, Some(event)) => {
            format!("it does not fit ({ooms} OOM{plural}, first at event {event})")
        }
        (false, None) => format!("it does not fit ({ooms} OOM{plural})"),
    }
}

/// Everything a replay reports.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayReport {
    /// The snapshot replayed.
    pub file: String,
    /// What the replay learnt about the file's `MemPool`s, for a later replay made for this
    /// report (not printed).
    pub mem_pool_lessons: super::lessons::MemPoolLessons,
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
    /// The other recording whose addresses a recorded placement followed instead of the
    /// file's own ([`ReplayOptions::addresses_from`](super::ReplayOptions)), if any.
    pub addresses_from: Option<std::path::PathBuf>,
    /// How each `cudaMalloc` segment was placed.
    pub placed: PlacedBy,
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
    /// The first OOMs with their answers (the first of them is `first_oom`).
    pub ooms: Vec<FirstOom>,
    /// Every OOM's cause, counted.
    pub causes: Causes,
    /// The state replayed from when the trace starts mid-run; `None` when it holds the job
    /// from its first allocation.
    pub start: Option<StartReport>,
    /// The limit the recorded OOMs show.
    pub limit: Limit,
    /// How that limit was put on the replay.
    pub limit_applied: Applied,
    /// gpumem's end state against the file's `segments`.
    pub end_state: EndStateComparison,
    /// Events of each PyTorch action in the replayed trace.
    pub recorded_actions: Vec<(&'static str, u64)>,
    /// Whether frees were replayed at `free_requested` (the trace records no
    /// `free_completed`: `skip_actions`).
    pub free_on_request: bool,
    /// Whether the config replayed under decides as the recorded one did (so the replay
    /// should reproduce the recorded run).
    pub recorded_conf: bool,
    /// Whether the OOM answers carry the frames recorded in the file ([`super::frames`]).
    pub frames: Lookup,
    /// What the job does with every segment placed by the simulator's model, for a replay
    /// under pressure that placed segments the recording does not (`placement_check.rs`).
    pub placement_check: Option<PlacementCheck>,
    /// What the job does with every deferred free completed at its request, for a what-if
    /// replay of a trace with frees deferred by `record_stream` (`timing_check.rs`).
    pub timing_check: Option<TimingCheck>,
}

impl ReplayReport {
    /// One final counter by its `memory_stats()` key (0 if unknown).
    pub fn stat(&self, key: &str) -> i64 {
        self.final_stats
            .iter()
            .find(|(name, _)| name == key)
            .map_or(0, |(_, value)| *value)
    }

    /// Whether the job fits: no allocation failed in the replay, no recorded OOM recurred,
    /// and, when the replay's device is not one the caller chose, none was left unexplained
    /// (see [`ReplayReport::verdict`]).
    pub fn fits(&self) -> bool {
        self.verdict().fits
    }

    /// The options that replay the file as this report did (for a second replay with
    /// observers).
    pub fn options(&self) -> ReplayOptions {
        ReplayOptions {
            capacity: match self.capacity_source {
                CapacitySource::Given => Some(self.capacity),
                CapacitySource::DefaultH200 => None,
            },
            conf: match self.conf_source {
                ConfSource::Given => Some(self.conf.clone()),
                ConfSource::Recorded | ConfSource::DefaultNoSettings => None,
            },
            placement: self.placement,
            addresses_from: self.addresses_from.clone(),
            device_index: u32::try_from(self.device_index).ok(),
            limit: match self.limit_applied {
                Applied::No => LimitPolicy::Never,
                Applied::Cap(_) | Applied::HeldElsewhere(_) => LimitPolicy::UnlessCapacityGiven,
            },
            // A report's own replay keeps the recorded completions; only its timing check
            // completes them at once, and that replay reports into this one.
            deferred_frees: super::DeferredFrees::AsRecorded,
        }
    }

    /// Whether the replay's peaks are lowered by allocations that failed and were skipped.
    pub fn peaks_lowered(&self) -> bool {
        self.counts.ooms > 0
    }

    /// The report as one JSON object.
    pub fn to_json(&self) -> Value {
        let stats: Map<String, Value> = self
            .final_stats
            .iter()
            .map(|(key, value)| (key.clone(), json!(value)))
            .collect();
        let verdict = self.verdict();
        let mut object = json!({
            "file": self.file,
            "device_index": self.device_index,
            "capacity": self.capacity,
            "capacity_source": self.capacity_source,
            "alloc_conf": self.alloc_conf,
            "conf_source": self.conf_source,
            "placement": self.placement,
            "addresses_from": self.addresses_from.as_ref().map(|other| other.display().to_string()),
            "placed": self.placed,
            "fits": verdict.fits,
            "verdict": verdict,
            "counts": self.counts,
            "peaks_lowered_by_failed_allocations": self.peaks_lowered(),
            "first_oom": self.first_oom,
            "frames_lookup": self.frames,
            "ooms": self.ooms,
            "oom_causes": self.causes,
            "final_stats": stats,
            "fragmentation": self.fragmentation,
            "segment_events": self.segment_events,
            "end_state": self.end_state,
            "limit": self.limit_json(),
            "recorded_actions": self.recorded_actions.iter().map(|(name, count)| (name.to_string(), json!(count))).collect::<Map<String, Value>>(),
            "free_on_request": self.free_on_request,
            "placement_check": self.placement_check,
            "timing_check": self.timing_check,
            "start": self.start,
            "devices": self.devices,
            "host": self.host,
        });
        if self.start.is_some() {
            let scopes = |scope: StatScope| -> Vec<&str> {
                self.final_stats
                    .iter()
                    .filter(|(key, _)| StatScope::of(key) == scope)
                    .map(|(key, _)| key.as_str())
                    .collect()
            };
            object["final_stats_scope"] = json!({
                "exact": scopes(StatScope::Exact),
                "window_peak": scopes(StatScope::WindowPeak),
                "estimated_window_peak": scopes(StatScope::EstimatedWindowPeak),
                "window_total": scopes(StatScope::WindowTotal),
            });
        }
        object
    }

    fn limit_json(&self) -> Value {
        let mut limit = json!({
            "kind": self.limit.kind(),
            "text": self.limit.describe(),
            "applied": self.limit_applied,
        });
        if let Some(bounds) = self.limit.bounds() {
            limit["bounds"] = json!(bounds);
        }
        if let super::limit::Limit::Device { usable, .. } = self.limit {
            limit["usable"] = json!(usable);
        }
        limit
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
        let verdict = self.verdict();
        writeln!(f, "  verdict         {}", verdict.text)?;
        writeln!(
            f,
            "  device          {}{capacity_note}",
            format_size(self.capacity)
        )?;
        writeln!(f, "  allocator conf  {conf} ({conf_note})")?;
        writeln!(f, "  placement       {}", self.placement_text())?;
        if let Some(check) = &self.placement_check {
            writeln!(f, "                  {}", check.describe())?;
        }
        if let Some(check) = &self.timing_check {
            writeln!(f, "  timing          {}", check.describe())?;
        }
        self.write_limit(f)?;
        self.write_start(f)?;
        writeln!(
            f,
            "  events          {} ({} alloc, {} free_completed, {} still pending at the end)",
            counts.events, counts.allocs, counts.frees, counts.pending_frees
        )?;
        if counts.deferred_frees > 0 {
            // Under another config the completions are the recording's, whose timing was
            // another run's (docs/allocator.md, "Replaying deferred frees"): in
            // tests/gpu/whatif the GPU moved them by up to 76 requests from one run to the next,
            // and PyTorch's peak reserved by up to 10%.
            let timing = if self.recorded_conf {
                ""
            } else {
                "; each completes where the recording's did, or on the OOM path: where the GPU finishes the work they wait for moves them, and the peak reserved with them"
            };
            writeln!(
                f,
                "                  {} frees deferred by record_stream (allocated falls at free_requested){timing}",
                counts.deferred_frees
            )?;
        }
        if counts.pooled_allocs > 0 {
            let inferred = if counts.inferred_pool_allocs > 0 {
                format!(
                    "; {} of them in pools gone by the end, inferred from the trace: captures by their frames, MemPools by the new memory their requests made",
                    counts.inferred_pool_allocs
                )
            } else {
                String::new()
            };
            writeln!(
                f,
                "                  {} allocations in private pools (by the file's segment_pool_id{inferred})",
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
        if counts.graph_captures > 0 {
            writeln!(
                f,
                "                  {} CUDA-graph captures seen in the frames, each begun with an empty_cache()",
                counts.graph_captures
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
        let total = counts.ooms + counts.recorded_ooms_reproduced;
        match &self.first_oom {
            None => writeln!(f, "  OOMs            0")?,
            Some(oom) => {
                writeln!(
                    f,
                    "  OOMs            {total} ({} allocs gpumem could not serve, each skipped with its free; {} recorded OOMs reproduced): {}",
                    counts.ooms,
                    counts.recorded_ooms_reproduced,
                    self.causes.summary()
                )?;
                write_oom(f, "first OOM", oom)?;
                match &self.frames {
                    Lookup::TooLarge(bytes) => writeln!(
                        f,
                        "                  frames not looked up: the file ({}) is larger than the {} gpumem reads whole to find them",
                        format_size(*bytes),
                        format_size(frames::LOOKUP_MAX_BYTES)
                    )?,
                    Lookup::Unreadable(why) => writeln!(
                        f,
                        "                  frames not looked up: the file could not be read whole ({why})"
                    )?,
                    Lookup::NotNeeded | Lookup::Done => {}
                }
            }
        }
        if counts.recorded_ooms > 0 {
            writeln!(
                f,
                "  recorded OOMs   {} in the file, {} also refused by gpumem",
                counts.recorded_ooms, counts.recorded_ooms_reproduced
            )?;
        }
        if let Some(why) = &verdict.unreproduced_why {
            writeln!(f, "                  not reproduced: {why}")?;
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
        if !self.recorded_conf && segments.differing > 0 {
            // A what-if answer: the config changes the requests' rounding and the segments
            // made, so differences from the recording are the answer, not an error.
            write!(
                f,
                " (under another config than the recording's: the segments it would make)"
            )?;
        }
        writeln!(f)?;
        if self.free_on_request {
            writeln!(
                f,
                "                  the trace records no free_completed (skip_actions): blocks were freed at free_requested"
            )?;
        }
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
        self.write_end_state(f)
    }
}

impl ReplayReport {
    /// The placement line: the rule, and how many segments each way placed.
    fn placement_text(&self) -> String {
        let placed = self.placed;
        let rule = match (self.placement, &self.addresses_from) {
            (Placement::Recorded, Some(other)) => {
                format!("{}'s addresses, else the model", other.display())
            }
            (Placement::Recorded, None) => "recorded addresses, else the model".to_string(),
            (Placement::Model, _) => "the simulator's model".to_string(),
        };
        if placed.total() == 0 {
            return format!("{rule} (no cudaMalloc segment)");
        }
        let mut parts = Vec::new();
        if placed.recorded() > 0 {
            let whose = match &self.addresses_from {
                Some(other) => format!("{}'s", other.display()),
                None => "the recording's".to_string(),
            };
            parts.push(format!("{} at {whose} addresses", placed.recorded()));
        }
        if placed.mirror > 0 {
            parts.push(format!(
                "{} where the driver's model puts them in the recording's address space",
                placed.mirror
            ));
        }
        if placed.above_last_large > 0 {
            parts.push(format!(
                "{} right above the last large one",
                placed.above_last_large
            ));
        }
        if placed.model > 0 {
            parts.push(format!("{} by the model", placed.model));
        }
        let mut text = format!("{rule}: {} segments, {}", placed.total(), parts.join(", "));
        if placed.recorded() < placed.total() && self.placement == Placement::Recorded {
            // Only a recorded address is known to be the driver's; elsewhere a best-fit tie
            // between two equal free blocks may break another way than on the GPU.
            text.push_str(
                " (the recording does not place the others: their addresses, and the best-fit \
                 ties they decide, may differ on the GPU)",
            );
        }
        text
    }

    /// The line on the limit inferred from the recorded OOMs, if there were any.
    fn write_limit(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.limit == Limit::NoRecordedOoms {
            return Ok(());
        }
        let applied = match self.limit_applied {
            Applied::Cap(cap) => format!(
                "; replayed under a cap of {} (fraction {:.4} of {})",
                format_size(cap),
                cap as f64 / self.capacity as f64,
                format_size(self.capacity)
            ),
            Applied::HeldElsewhere(held) => format!(
                "; replayed with {} of the simulated device held elsewhere",
                format_size(held)
            ),
            Applied::No => match (self.limit, self.capacity_source) {
                (Limit::Inconsistent(_), _) => "; not applied".into(),
                (_, CapacitySource::Given) => {
                    "; not applied: this replay answers for the device given".into()
                }
                _ => "; not applied".into(),
            },
        };
        writeln!(f, "  inferred limit  {}{applied}", self.limit.describe())
    }

    /// The lines on the state a mid-run trace starts from.
    fn write_start(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(start) = &self.start else {
            return Ok(());
        };
        let figures = &start.figures;
        let layout = match start.layout {
            Layout::Exact => "laid out exactly as recorded".to_string(),
            Layout::Approximate { pieces } => {
                format!("laid out as recorded but for {pieces} pieces")
            }
            Layout::Compact => {
                "its live blocks allocated in address order under this config".to_string()
            }
        };
        writeln!(
            f,
            "  trace start     mid-run (PyTorch keeps only the last max_entries events, or recording began after the job's first allocations): rebuilt from the file's end-state segments walked back over the trace: {} segments ({} reserved), {} live blocks ({}, {} of them freed by the trace), {layout}",
            figures.segments,
            format_size(figures.reserved_bytes),
            figures.blocks,
            format_size(figures.allocated_bytes),
            figures.freed_by_trace
        )?;
        let segment_events: u64 = self
            .recorded_actions
            .iter()
            .filter(|(name, _)| name.starts_with("segment_"))
            .map(|(_, count)| count)
            .sum();
        if segment_events == 0 && figures.segments > 0 {
            writeln!(
                f,
                "                  the trace records no segment events (a steady state, or skip_actions): every end-state segment is taken as held from its start"
            )?;
        }
        if start.failed > 0 {
            writeln!(
                f,
                "                  {} of those blocks did not fit on this device (skipped with their frees)",
                start.failed
            )?;
        }
        writeln!(
            f,
            "                  counters: current values exact; peaks and totals (allocated, freed, num_*) are the trace's window only (inactive_split_bytes peaks within 1 MiB per block the trace frees before allocating)"
        )
    }

    /// The line comparing the end state with the file's segments.
    fn write_end_state(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let end = &self.end_state;
        write!(
            f,
            "  end state       {} segments recorded ({} blocks), {} replayed ({} blocks); {} equal in size, pool and blocks, {} of them at the same address",
            end.recorded,
            end.recorded_blocks,
            end.replayed,
            end.replayed_blocks,
            end.equal,
            end.same_address
        )?;
        writeln!(f)?;
        if let Some(first) = &end.first_difference {
            writeln!(
                f,
                "                  first difference at segment {}: {}",
                first.position, first.what
            )?;
        }
        Ok(())
    }
}

/// One OOM's lines: the event, the why, the frames and the largest live allocations.
fn write_oom(f: &mut fmt::Formatter<'_>, label: &str, oom: &FirstOom) -> fmt::Result {
    let source = match oom.source {
        super::answer::OomSource::Alloc => "an alloc PyTorch served",
        super::answer::OomSource::RecordedOom => "an OOM PyTorch recorded, reproduced",
    };
    writeln!(
        f,
        "  {label:<15} event {} ({source}): {} requested with {} allocated, {} reserved, {} free on the device",
        oom.index,
        format_size(oom.size),
        format_size(oom.allocated.max(0) as u64),
        format_size(oom.reserved.max(0) as u64),
        format_size(oom.device_free)
    )?;
    writeln!(f, "                  why: {}", oom.why.text)?;
    if !oom.frames.is_empty() {
        match oom.frames_from {
            None => writeln!(f, "                  at: {}", frames_text(&oom.frames, 4))?,
            Some(earlier) => writeln!(
                f,
                "                  at: {} (the stack of event {earlier}, the nearest before the OOM: PyTorch recorded none with the OOM itself)",
                frames_text(&oom.frames, 4)
            )?,
        }
    }
    if !oom.largest_live.is_empty() {
        let live: Vec<String> = oom
            .largest_live
            .iter()
            .map(|live| {
                let made = match live.index {
                    Some(index) => format!("event {index}"),
                    None => "live at the trace's start".into(),
                };
                let place = if live.frames.is_empty() {
                    String::new()
                } else {
                    format!(", {}", frames_text(&live.frames, 1))
                };
                format!("{} ({made}{place})", format_size(live.size))
            })
            .collect();
        writeln!(f, "                  largest live: {}", live.join("; "))?;
    }
    Ok(())
}

/// Up to `count` frames as `file:line in name`, the user's own first.
fn frames_text(frames: &[UserFrame], count: usize) -> String {
    frames
        .iter()
        .take(count)
        .map(|frame| format!("{}:{} in {}", frame.filename, frame.line, frame.name))
        .collect::<Vec<_>>()
        .join(" < ")
}
