//! `gpumem replay`: a snapshot PyTorch wrote, replayed event by event through gpumem's
//! allocator on a simulated device, to answer "will my job fit?" and "what would this config
//! change?".
//!
//! The file is streamed twice ([`crate::snapshot::pickle::stream_file`]), in memory that
//! follows the live blocks, not the trace's length. The first pass ([`read`], [`scan`])
//! reads what the trace says before anything is replayed: the recorded config (PyTorch writes
//! `allocator_settings` after the trace), whether the history is empty or was recorded with
//! `skip_actions`, the state the trace starts from when the ring buffer wrapped
//! ([`start`], put into the allocator by [`seed`]), and the limit the recorded OOMs show
//! ([`limit`]). The second ([`replay_recording`]) replays each event ([`engine`]) and
//! compares the end with the file's `segments` ([`endstate`]). What it found is a
//! [`ReplayReport`] with its verdict ([`verdict`]).
//!
//! ```no_run
//! use gpumem::snapshot::replay::{replay, ReplayOptions};
//!
//! let options = ReplayOptions::default();
//! let report = replay(std::path::Path::new("job.pickle"), &options, &mut |_, _| {})?;
//! println!("peak reserved {}", report.stat("reserved_bytes.all.peak"));
//! # Ok::<(), gpumem::snapshot::replay::ReplayError>(())
//! ```

pub mod answer;
pub mod compare;
pub mod device;
pub mod endstate;
pub mod engine;
pub mod held;
pub mod limit;
pub mod ranges;
pub mod report;
pub mod scan;
pub mod search;
pub mod seed;
pub mod start;
pub mod verdict;

pub use search::{min_capacity, min_capacity_of, CapacitySearch};

use std::path::Path;

use thiserror::Error;

use crate::alloc::format::format_size;
use crate::alloc::{AllocConf, CachingAllocator, MemoryObserver};
use crate::device::sim::{SimDevice, H200_TOTAL_MEMORY};
use crate::device::DeviceMemory;
use crate::snapshot::model::{Action, Segment};
use crate::snapshot::pickle::{self, Remainder, SnapshotError};
use device::{Hints, ReplayDevice};
pub use engine::Engine;
use limit::{Applied, Limit};
pub use report::{CapacitySource, ConfSource, Fragmentation, ReplayReport, StartReport};
use scan::Scan;

/// Why a replay could not run.
#[derive(Debug, Error)]
pub enum ReplayError {
    /// The file is unreadable, not a snapshot, or has a bad event.
    #[error("{0}")]
    Snapshot(#[from] SnapshotError),
    /// The config recorded in the file cannot be used by gpumem.
    #[error("the allocator settings recorded in the file cannot be replayed ({0}); give a config with --alloc-conf")]
    RecordedConfig(String),
    /// The allocator could not start (e.g. a bad memory fraction in the config).
    #[error("cannot start the allocator: {0}")]
    Allocator(String),
    /// The file holds no trace events: the history was not recorded.
    #[error("{0}")]
    EmptyHistory(String),
    /// The trace leaves out what a replay needs (`skip_actions`), or contradicts the file's
    /// segments.
    #[error("{0}")]
    Unreplayable(String),
}

/// Where the replay's device places segments.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Placement {
    /// Where PyTorch's driver placed the same segment, when the trace has one of that size
    /// right before (so best-fit ties break as in the recording); else the simulator's model.
    #[default]
    Recorded,
    /// Always the simulator's placement model (the H200 driver's, as measured in another
    /// process).
    Model,
}

/// Whether a limit inferred from the recorded OOMs ([`limit`]) is put on the replay.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LimitPolicy {
    /// When the device is not given: the replay then reproduces the recorded run. A replay
    /// on a given device answers for that device, unlimited.
    #[default]
    UnlessCapacityGiven,
    /// Never.
    Never,
}

/// How to replay.
#[derive(Debug, Clone, Default)]
pub struct ReplayOptions {
    /// Total bytes of the simulated device; `None` = the simulated H200.
    pub capacity: Option<u64>,
    /// The config; `None` = the one recorded in the file.
    pub conf: Option<AllocConf>,
    /// Segment placement.
    pub placement: Placement,
    /// Whether an inferred limit is applied.
    pub limit: LimitPolicy,
}

impl ReplayOptions {
    /// The device capacity replayed on and where it came from.
    pub fn capacity(&self) -> (u64, CapacitySource) {
        match self.capacity {
            Some(bytes) => (bytes, CapacitySource::Given),
            None => (H200_TOTAL_MEMORY, CapacitySource::DefaultH200),
        }
    }
}

/// Told how far a replay got: (bytes of the file read, events replayed).
pub type Progress<'a> = &'a mut dyn FnMut(u64, u64);

/// A [`Progress`] that ignores what it is told.
pub fn no_progress(_bytes: u64, _events: u64) {}

/// How often (in events) progress is reported.
const PROGRESS_EVERY: u64 = 1 << 16;

/// What the first pass over a file found, for any number of replays of it.
#[derive(Debug, Clone)]
pub struct Recording {
    /// The trace as the first pass saw it.
    pub scan: Scan,
    /// The file's segments and settings.
    pub remainder: Remainder,
    /// Which device's trace is replayed (its position in `device_traces`).
    pub device_index: usize,
}

impl Recording {
    /// The file's end-state segments of the replayed device.
    pub fn segments(&self) -> Vec<Segment> {
        self.remainder
            .segments
            .iter()
            .filter(|segment| segment.device == self.device_index as i64)
            .cloned()
            .collect()
    }
}

/// The first pass: reads the file at `path` without replaying it, and refuses a file there
/// is nothing to replay in (no history recorded, or one recorded without allocations or
/// frees).
pub fn read(path: &Path, progress: Progress<'_>) -> Result<Recording, ReplayError> {
    let mut scan = Scan::default();
    let remainder = pickle::stream_file(path, |emitted| {
        scan.see(&emitted);
        if scan.events.is_multiple_of(PROGRESS_EVERY) {
            progress(emitted.offset, scan.events);
        }
        Ok(())
    })?;
    let device_index = match scan.list() {
        Some(list) => remainder
            .traces
            .iter()
            .position(|(id, _)| *id == list)
            .ok_or_else(|| {
                SnapshotError::NotASnapshot("its trace events are not in 'device_traces'".into())
            })?,
        None => 0,
    };
    let recording = Recording {
        scan,
        remainder,
        device_index,
    };
    check_replayable(path, &recording)?;
    Ok(recording)
}

/// Refuses a recording a replay could only get wrong.
fn check_replayable(path: &Path, recording: &Recording) -> Result<(), ReplayError> {
    let scan = &recording.scan;
    if scan.events == 0 {
        let segments = &recording.remainder.segments;
        let reserved: i64 = segments.iter().map(|s| s.total_size.max(0)).sum();
        let end_state = if segments.is_empty() {
            "and no segments".to_string()
        } else {
            format!(
                "only the end state: {} segments, {} reserved",
                segments.len(),
                format_size(reserved as u64)
            )
        };
        return Err(ReplayError::EmptyHistory(format!(
            "the snapshot holds no trace events, {end_state}: it was taken without recording the memory history, so there is nothing to replay. Record the history before the job allocates, then dump the snapshot: torch.cuda.memory._record_memory_history(max_entries=1000000) at the start, torch.cuda.memory._dump_snapshot(\"{}\") at the end",
            path.file_name()
                .map_or_else(|| "snapshot.pickle".into(), |name| name.to_string_lossy())
        )));
    }
    let allocs = scan.count(Action::Alloc);
    let frees = scan.count(Action::FreeRequested) + scan.count(Action::FreeCompleted);
    if allocs == 0 && scan.unmatched_frees > 0 {
        return Err(ReplayError::Unreplayable(format!(
            "the trace has {frees} frees but no alloc event, and frees {} blocks twice: it was recorded with skip_actions leaving out 'alloc', so the allocations cannot be replayed",
            scan.unmatched_frees
        )));
    }
    let live_at_end: u64 = recording
        .segments()
        .iter()
        .flat_map(|segment| &segment.blocks)
        .filter(|block| block.state.starts_with("active"))
        .count() as u64;
    if frees == 0 && (allocs > live_at_end || scan.double_allocs > 0) {
        return Err(ReplayError::Unreplayable(format!(
            "the trace has {allocs} allocations but no free, while only {live_at_end} blocks are live at the end: it was recorded with skip_actions leaving out 'free_requested' and 'free_completed', so what was freed cannot be replayed"
        )));
    }
    Ok(())
}

/// Replays the snapshot at `path`.
pub fn replay(
    path: &Path,
    options: &ReplayOptions,
    progress: Progress<'_>,
) -> Result<ReplayReport, ReplayError> {
    let recording = read(path, &mut *progress)?;
    replay_recording(path, &recording, options, progress, Vec::new())
}

/// The config a replay runs under: the one given, else the one recorded, else PyTorch's
/// defaults; and where it came from.
fn choose_conf(
    recording: &Recording,
    options: &ReplayOptions,
) -> Result<(AllocConf, ConfSource), ReplayError> {
    if let Some(conf) = &options.conf {
        return Ok((conf.clone(), ConfSource::Given));
    }
    match &recording.remainder.settings {
        Some(settings) => {
            let conf = settings
                .to_conf()
                .map_err(|error| ReplayError::RecordedConfig(error.to_string()))?;
            Ok((conf, ConfSource::Recorded))
        }
        None => Ok((AllocConf::default(), ConfSource::DefaultNoSettings)),
    }
}

/// Whether two configs make the allocator decide alike (their source text aside).
fn same_behaviour(a: &AllocConf, b: &AllocConf) -> bool {
    let mut a = a.clone();
    a.source.clone_from(&b.source);
    a == *b
}

/// Whether `conf` makes the allocator decide as the recorded run's config did.
fn is_recorded_conf(recording: &Recording, conf: &AllocConf) -> bool {
    let recorded = match &recording.remainder.settings {
        Some(settings) => match settings.to_conf() {
            Ok(recorded) => recorded,
            Err(_) => return false,
        },
        None => AllocConf::default(),
    };
    same_behaviour(conf, &recorded)
}

/// Replays the file at `path`, which [`read`] made `recording` of, with `observers`
/// subscribed to the replay allocator's event stream from its first event (the rebuilt
/// start state's included).
pub fn replay_recording(
    path: &Path,
    recording: &Recording,
    options: &ReplayOptions,
    progress: Progress<'_>,
    observers: Vec<Box<dyn MemoryObserver>>,
) -> Result<ReplayReport, ReplayError> {
    let (capacity, capacity_source) = options.capacity();
    let (conf, conf_source) = choose_conf(recording, options)?;
    let sim = SimDevice::new(capacity);
    let context = sim.context_bytes();
    let held = std::rc::Rc::new(std::cell::Cell::new(0));
    let (device, hints): (Box<dyn DeviceMemory>, _) = match options.placement {
        Placement::Recorded => {
            let hints = Hints::default();
            (Box::new(ReplayDevice::new(sim, hints.clone())), Some(hints))
        }
        Placement::Model => (Box::new(sim), None),
    };
    let device = Box::new(held::HeldElsewhere::new(device, std::rc::Rc::clone(&held)));
    let allocator = CachingAllocator::new(device, conf.clone())
        .map_err(|error| ReplayError::Allocator(error.to_string()))?;
    let mut engine = Engine::new(allocator, hints.clone());
    for observer in observers {
        engine.subscribe(observer);
    }
    let segments = recording.segments();
    let scan = &recording.scan;
    let start = start::rebuild(scan, &segments, engine.allocator()).map_err(|error| {
        ReplayError::Unreplayable(format!(
            "{error}. The trace starts mid-run (PyTorch keeps only the last max_entries events), and rebuilding the state it starts from failed"
        ))
    })?;
    let mut start_report = None;
    if !start.is_empty() {
        let seeded = seed::seed(engine.allocator_mut(), &start, hints.as_ref())
            .map_err(ReplayError::Allocator)?;
        engine.start_from(&seeded);
        start_report = Some(StartReport {
            figures: start.figures(),
            layout: seeded.layout(),
            failed: seeded.failed.len() as u64,
        });
    }
    // The limit is the recorded run's, so it is read with the recorded config's segments.
    let recorded_expandable = recording
        .remainder
        .settings
        .as_ref()
        .is_some_and(|settings| settings.expandable_segments);
    let limit = scan
        .pressure
        .infer(start.figures().reserved_bytes, recorded_expandable);
    let applied = apply_limit(
        &mut engine,
        &limit,
        options,
        (capacity, context),
        &held,
        conf.per_process_memory_fraction.is_some(),
    );
    if scan.count(Action::FreeCompleted) == 0 && scan.count(Action::FreeRequested) > 0 {
        engine.free_on_request();
    }
    let mut last_index = 0;
    pickle::stream_file(path, |emitted| {
        last_index = emitted.index;
        let offset = emitted.offset;
        engine.handle(emitted)?;
        if engine.counts.events.is_multiple_of(PROGRESS_EVERY) {
            progress(offset, engine.counts.events);
        }
        Ok(())
    })?;
    engine.finish(last_index)?;
    let recorded_conf = is_recorded_conf(recording, &conf);
    let stats = engine.allocator().stats();
    let end_state =
        endstate::EndStateComparison::of(&segments, &engine.allocator().segment_snapshots());
    Ok(ReplayReport {
        file: path.display().to_string(),
        device_index: recording.device_index,
        capacity,
        capacity_source,
        alloc_conf: conf.source.clone(),
        conf,
        conf_source,
        counts: engine.counts.clone(),
        first_oom: engine.first_oom.clone(),
        ooms: engine.ooms.clone(),
        causes: engine.causes.clone(),
        final_stats: stats.entries(),
        fragmentation: Fragmentation::of(stats),
        segment_events: engine.segments.clone(),
        start: start_report,
        limit,
        limit_applied: applied,
        end_state,
        recorded_actions: Action::PYTORCH
            .iter()
            .map(|&action| (action.name(), scan.count(action)))
            .collect(),
        free_on_request: scan.count(Action::FreeCompleted) == 0
            && scan.count(Action::FreeRequested) > 0,
        recorded_conf,
    })
}

/// Puts the inferred `limit` on the replay when the policy allows and the config sets no
/// fraction of its own: a cap (the lowest the trace allows, so every recorded refusal recurs)
/// as a memory fraction, or the memory a full device lacked as held by something else.
fn apply_limit(
    engine: &mut Engine,
    limit: &Limit,
    options: &ReplayOptions,
    (capacity, context): (u64, u64),
    held: &held::Held,
    conf_has_fraction: bool,
) -> Applied {
    let allowed = options.limit == LimitPolicy::UnlessCapacityGiven
        && options.capacity.is_none()
        && !conf_has_fraction;
    if !allowed {
        return Applied::No;
    }
    match *limit {
        Limit::Cap(bounds) => {
            // The fraction whose cap, truncated as PyTorch truncates it, is the lower bound.
            let fraction = (bounds.lower as f64 + 0.5) / capacity as f64;
            let allocator = engine.allocator_mut();
            if fraction >= 1.0 || allocator.set_memory_fraction(fraction).is_err() {
                return Applied::No;
            }
            match allocator.allowed_memory_maximum() {
                Some(cap) if cap >= bounds.lower && cap < bounds.upper => Applied::Cap(cap),
                _ => {
                    let _ = allocator.set_memory_fraction(1.0);
                    Applied::No
                }
            }
        }
        Limit::Device { usable, .. } => {
            let free = capacity.saturating_sub(context);
            if usable >= free {
                return Applied::No;
            }
            held.set(free - usable);
            Applied::HeldElsewhere(free - usable)
        }
        Limit::NoRecordedOoms | Limit::Inconsistent(_) => Applied::No,
    }
}

/// Replays `path` once more under the config, device and limit `report` was made with, with
/// `observers` subscribed to the replay allocator's event stream from its first event (a
/// timeline recorder, say: `gpumem replay --report/--timeline`).
pub fn replay_observed(
    path: &Path,
    report: &ReplayReport,
    placement: Placement,
    observers: Vec<Box<dyn MemoryObserver>>,
) -> Result<ReplayReport, ReplayError> {
    let recording = read(path, &mut no_progress)?;
    replay_recording(
        path,
        &recording,
        &report.options(placement),
        &mut no_progress,
        observers,
    )
}
