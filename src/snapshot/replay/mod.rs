//! `gpumem replay`: a snapshot PyTorch wrote, replayed event by event through gpumem's
//! allocator on a simulated device, to answer "will my job fit?" and "what would this config
//! change?".
//!
//! The file is streamed ([`crate::snapshot::pickle::stream_file`]): memory follows the live
//! blocks, not the trace's length. PyTorch writes `allocator_settings` after the trace, so a
//! replay under the recorded config starts with PyTorch's defaults and, in the rare case the
//! file then shows another config, runs once more under it.
//!
//! ```no_run
//! use gpumem::snapshot::replay::{replay, ReplayOptions};
//!
//! let options = ReplayOptions::default();
//! let report = replay(std::path::Path::new("job.pickle"), &options, &mut |_, _| {})?;
//! println!("peak reserved {}", report.stat("reserved_bytes.all.peak"));
//! # Ok::<(), gpumem::snapshot::replay::ReplayError>(())
//! ```

pub mod compare;
pub mod device;
pub mod engine;
pub mod peaks;
pub mod report;
pub mod search;
pub mod tune;

pub use search::{min_capacity, CapacitySearch};

use std::path::Path;

use thiserror::Error;

use crate::alloc::{AllocConf, CachingAllocator, MemoryObserver};
use crate::device::sim::{SimDevice, H200_TOTAL_MEMORY};
use crate::device::DeviceMemory;
use crate::snapshot::pickle::{self, Emitted, SnapshotError};
use device::{Hints, ReplayDevice};
pub use engine::Engine;
pub use report::{CapacitySource, ConfSource, Fragmentation, ReplayReport};

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
}

impl ReplayError {
    /// The message for a replay of `file`, naming the file once: a file that could not be
    /// read is named by the error itself, every other error is prefixed with it.
    pub fn naming(&self, file: &Path) -> String {
        match self {
            ReplayError::Snapshot(SnapshotError::Io { .. }) => self.to_string(),
            _ => format!("{}: {self}", file.display()),
        }
    }
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

/// How to replay.
#[derive(Debug, Clone, Default)]
pub struct ReplayOptions {
    /// Total bytes of the simulated device; `None` = the simulated H200.
    pub capacity: Option<u64>,
    /// The config; `None` = the one recorded in the file.
    pub conf: Option<AllocConf>,
    /// Segment placement.
    pub placement: Placement,
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

/// Told about each trace event of the file before it is replayed (to learn its stack, say:
/// [`peaks`]).
pub type Tap<'a> = &'a mut dyn FnMut(&Emitted);

/// How often (in events) progress is reported.
const PROGRESS_EVERY: u64 = 1 << 16;

/// Replays the snapshot at `path`.
pub fn replay(
    path: &Path,
    options: &ReplayOptions,
    progress: Progress<'_>,
) -> Result<ReplayReport, ReplayError> {
    let (capacity, capacity_source) = options.capacity();
    if let Some(conf) = &options.conf {
        let (report, _) = run(
            path,
            (capacity, capacity_source, options.placement),
            conf.clone(),
            ConfSource::Given,
            progress,
        )?;
        return Ok(report);
    }
    let (report, recorded) = run(
        path,
        (capacity, capacity_source, options.placement),
        AllocConf::default(),
        ConfSource::DefaultNoSettings,
        &mut *progress,
    )?;
    let Some(recorded) = recorded else {
        return Ok(report);
    };
    let conf = recorded
        .to_conf()
        .map_err(|error| ReplayError::RecordedConfig(error.to_string()))?;
    if same_behaviour(&conf, &AllocConf::default()) {
        let mut report = report;
        report.conf_source = ConfSource::Recorded;
        report.alloc_conf.clone_from(&conf.source);
        report.conf = conf;
        return Ok(report);
    }
    let (report, _) = run(
        path,
        (capacity, capacity_source, options.placement),
        conf,
        ConfSource::Recorded,
        progress,
    )?;
    Ok(report)
}

/// Whether two configs make the allocator decide alike (their source text aside).
fn same_behaviour(a: &AllocConf, b: &AllocConf) -> bool {
    let mut a = a.clone();
    a.source.clone_from(&b.source);
    a == *b
}

/// Replays `path` once more under the config and device `report` was made with, with
/// `observers` subscribed to the replay allocator's event stream from its first event (a
/// timeline recorder, say: `gpumem replay --report/--timeline`).
pub fn replay_observed(
    path: &Path,
    report: &ReplayReport,
    placement: Placement,
    observers: Vec<Box<dyn MemoryObserver>>,
) -> Result<ReplayReport, ReplayError> {
    replay_tapped(path, report, placement, observers, &mut |_| {})
}

/// [`replay_observed`], also telling `tap` about each trace event before it is replayed.
pub fn replay_tapped(
    path: &Path,
    report: &ReplayReport,
    placement: Placement,
    observers: Vec<Box<dyn MemoryObserver>>,
    tap: Tap<'_>,
) -> Result<ReplayReport, ReplayError> {
    let (report, _) = run_observed(
        path,
        (report.capacity, report.capacity_source, placement),
        report.conf.clone(),
        report.conf_source,
        &mut no_progress,
        (observers, tap),
    )?;
    Ok(report)
}

/// One pass over the file under `conf`; also returns the settings the file records.
fn run(
    path: &Path,
    device: (u64, CapacitySource, Placement),
    conf: AllocConf,
    conf_source: ConfSource,
    progress: Progress<'_>,
) -> Result<(ReplayReport, Option<crate::snapshot::AllocatorSettings>), ReplayError> {
    run_observed(
        path,
        device,
        conf,
        conf_source,
        progress,
        (Vec::new(), &mut |_| {}),
    )
}

/// [`run`] with `observers` subscribed to the allocator's event stream and `tap` told of each
/// trace event first.
fn run_observed(
    path: &Path,
    (capacity, capacity_source, placement): (u64, CapacitySource, Placement),
    conf: AllocConf,
    conf_source: ConfSource,
    progress: Progress<'_>,
    (observers, tap): (Vec<Box<dyn MemoryObserver>>, Tap<'_>),
) -> Result<(ReplayReport, Option<crate::snapshot::AllocatorSettings>), ReplayError> {
    let alloc_conf = conf.source.clone();
    let sim = SimDevice::new(capacity);
    let (device, hints): (Box<dyn DeviceMemory>, _) = match placement {
        Placement::Recorded => {
            let hints = Hints::default();
            (Box::new(ReplayDevice::new(sim, hints.clone())), Some(hints))
        }
        Placement::Model => (Box::new(sim), None),
    };
    let allocator = CachingAllocator::new(device, conf.clone())
        .map_err(|error| ReplayError::Allocator(error.to_string()))?;
    let mut engine = Engine::new(allocator, hints);
    for observer in observers {
        engine.subscribe(observer);
    }
    let mut last_index = 0;
    let remainder = pickle::stream_file(path, |emitted| {
        last_index = emitted.index;
        let offset = emitted.offset;
        tap(&emitted);
        engine.handle(emitted)?;
        if engine.counts.events.is_multiple_of(PROGRESS_EVERY) {
            progress(offset, engine.counts.events);
        }
        Ok(())
    })?;
    engine.finish(last_index)?;
    let device_index = engine
        .trace()
        .and_then(|id| remainder.traces.iter().position(|(list, _)| *list == id))
        .unwrap_or(0);
    if engine.trace().is_some()
        && remainder
            .traces
            .iter()
            .all(|(list, _)| Some(*list) != engine.trace())
    {
        return Err(SnapshotError::NotASnapshot(
            "its trace events are not in 'device_traces'".into(),
        )
        .into());
    }
    let stats = engine.allocator().stats();
    let report = ReplayReport {
        file: path.display().to_string(),
        device_index,
        capacity,
        capacity_source,
        alloc_conf,
        conf,
        conf_source,
        counts: engine.counts.clone(),
        first_oom: engine.first_oom.clone(),
        final_stats: stats.entries(),
        fragmentation: Fragmentation::of(stats),
        segment_events: engine.segments.clone(),
    };
    Ok((report, remainder.settings))
}
