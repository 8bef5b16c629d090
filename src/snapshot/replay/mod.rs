//! `gpumem replay`: a snapshot PyTorch wrote, replayed event by event through gpumem's
//! allocator on a simulated device, to answer "will my job fit?" and "what would this config
//! change?".
//!
//! The file is streamed ([`crate::snapshot::pickle::stream_file`]): memory follows the live
//! blocks, not the trace's length. PyTorch writes `allocator_settings` after the trace, so a
//! replay under the recorded config starts with PyTorch's defaults and, in the rare case the
//! file then shows another config, runs once more under it. It also runs once more when the
//! first pass placed segments the other way than the config calls for ([`Placement::Auto`]),
//! and when the file's segments show private pools (their allocations are routed to them,
//! [`engine::PoolRoutes`]).
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

use crate::alloc::{AllocConf, CachingAllocator, MemPoolId, MemoryObserver};
use crate::device::sim::{SimDevice, H200_TOTAL_MEMORY};
use crate::device::DeviceMemory;
use crate::snapshot::pickle::{self, Emitted, Remainder, SnapshotError, Trace};
use device::{Hints, ReplayDevice};
use engine::LiveLimit;
pub use engine::{Engine, PoolRoutes};
pub use report::{
    CapacitySource, ConfSource, DeviceTrace, Fragmentation, HostMemory, ReplayReport,
};

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
    /// The file holds no allocator event to replay for the device asked for.
    #[error("{0}; record the history with torch.cuda.memory._record_memory_history() before the job runs, then save it with torch.cuda.memory._dump_snapshot(path)")]
    NoHistory(String),
    /// `--device-index` names a device the file has no trace for.
    #[error("{0}")]
    NoSuchDevice(String),
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    /// [`Placement::Recorded`] when the replay follows the recorded config (a self-replay:
    /// the config equals the file's in every setting the file records — the memory fraction
    /// is not recorded, so it is not compared), else [`Placement::Model`]: another config
    /// changes the sequence of segments, and the recorded addresses belong to the old one.
    #[default]
    Auto,
    /// Where PyTorch's driver placed the same segment, when the trace has one of that size
    /// right before (so best-fit ties break as in the recording); else the simulator's model.
    /// A recorded address that would overlap a live segment is never used.
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
    /// The device whose trace is replayed (its position in `device_traces`); `None` = the
    /// first with entries.
    pub device_index: Option<u32>,
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
pub type Tap<'a> = &'a mut dyn FnMut(&Emitted<'_>);

/// How often (in events) progress is reported.
const PROGRESS_EVERY: u64 = 1 << 16;

/// What a pass learned from the file beyond its trace: the recorded settings and where the
/// private pools' segments lie.
struct Learned {
    settings: Option<crate::snapshot::AllocatorSettings>,
    routes: PoolRoutes,
}

/// Replays the snapshot at `path`.
pub fn replay(
    path: &Path,
    options: &ReplayOptions,
    progress: Progress<'_>,
) -> Result<ReplayReport, ReplayError> {
    let (capacity, capacity_source) = options.capacity();
    let given = options.conf.is_some();
    let first_conf = options.conf.clone().unwrap_or_default();
    let first_source = if given {
        ConfSource::Given
    } else {
        ConfSource::DefaultNoSettings
    };
    // A given config is more often a what-if; without one the recorded config is followed.
    let first_placement = match options.placement {
        Placement::Auto if given => Placement::Model,
        Placement::Auto => Placement::Recorded,
        placement => placement,
    };
    let plan = Plan {
        capacity,
        capacity_source,
        placement: first_placement,
        routes: PoolRoutes::default(),
        device_index: options.device_index,
    };
    let (report, learned) = run(
        path,
        &plan,
        first_conf.clone(),
        first_source,
        &mut *progress,
    )?;
    let recorded = match &learned.settings {
        Some(settings) => match settings.to_conf() {
            Ok(conf) => Some(conf),
            Err(error) if !given => return Err(ReplayError::RecordedConfig(error.to_string())),
            // A given config does not need the recorded one; it just cannot be followed.
            Err(_) => None,
        },
        None => Some(AllocConf::default()),
    };
    let (conf, conf_source) = match (&options.conf, &recorded, &learned.settings) {
        (Some(conf), _, _) => (conf.clone(), ConfSource::Given),
        (None, Some(conf), Some(_)) => (conf.clone(), ConfSource::Recorded),
        (None, _, _) => (AllocConf::default(), ConfSource::DefaultNoSettings),
    };
    let follows = recorded
        .as_ref()
        .is_some_and(|recorded| follows_recorded(&conf, recorded));
    let placement = match options.placement {
        Placement::Auto if follows => Placement::Recorded,
        Placement::Auto => Placement::Model,
        placement => placement,
    };
    if same_behaviour(&conf, &first_conf)
        && placement == first_placement
        && learned.routes.is_empty()
    {
        let mut report = report;
        report.conf_source = conf_source;
        report.alloc_conf.clone_from(&conf.source);
        report.conf = conf;
        return Ok(report);
    }
    let plan = Plan {
        placement,
        routes: learned.routes,
        ..plan
    };
    let (report, _) = run(path, &plan, conf, conf_source, progress)?;
    Ok(report)
}

/// Whether two configs make the allocator decide alike (their source text aside).
fn same_behaviour(a: &AllocConf, b: &AllocConf) -> bool {
    let mut a = a.clone();
    a.source.clone_from(&b.source);
    a == *b
}

/// Whether replaying under `conf` follows the `recorded` config: equal in everything but the
/// memory fraction, which PyTorch does not record in `allocator_settings`.
fn follows_recorded(conf: &AllocConf, recorded: &AllocConf) -> bool {
    let mut conf = conf.clone();
    conf.per_process_memory_fraction = recorded.per_process_memory_fraction;
    same_behaviour(&conf, recorded)
}

/// Replays `path` once more under the config, device, placement and pool routes `report` was
/// made with, with `observers` subscribed to the replay allocator's event stream from its
/// first event (a timeline recorder, say: `gpumem replay --report/--timeline`).
pub fn replay_observed(
    path: &Path,
    report: &ReplayReport,
    observers: Vec<Box<dyn MemoryObserver>>,
) -> Result<ReplayReport, ReplayError> {
    replay_tapped(path, report, observers, &mut |_| {})
}

/// [`replay_observed`], also telling `tap` about each trace event of the replayed device
/// before it is replayed.
pub fn replay_tapped(
    path: &Path,
    report: &ReplayReport,
    observers: Vec<Box<dyn MemoryObserver>>,
    tap: Tap<'_>,
) -> Result<ReplayReport, ReplayError> {
    let plan = Plan {
        capacity: report.capacity,
        capacity_source: report.capacity_source,
        placement: report.placement,
        routes: report.routes.clone(),
        device_index: u32::try_from(report.device_index).ok(),
    };
    let (report, _) = run_observed(
        path,
        &plan,
        report.conf.clone(),
        report.conf_source,
        &mut no_progress,
        (observers, tap),
    )?;
    Ok(report)
}

/// How one pass runs: the device, where it places segments, which allocations go to private
/// pools.
#[derive(Debug, Clone)]
struct Plan {
    capacity: u64,
    capacity_source: CapacitySource,
    /// [`Placement::Recorded`] or [`Placement::Model`].
    placement: Placement,
    routes: PoolRoutes,
    /// The device whose trace is replayed (`--device-index`); `None`: the first with events.
    device_index: Option<u32>,
}

/// One pass over the file under `conf`; also returns what it learned of the file.
fn run(
    path: &Path,
    plan: &Plan,
    conf: AllocConf,
    conf_source: ConfSource,
    progress: Progress<'_>,
) -> Result<(ReplayReport, Learned), ReplayError> {
    run_observed(
        path,
        plan,
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
    plan: &Plan,
    conf: AllocConf,
    conf_source: ConfSource,
    progress: Progress<'_>,
    (observers, tap): (Vec<Box<dyn MemoryObserver>>, Tap<'_>),
) -> Result<(ReplayReport, Learned), ReplayError> {
    let alloc_conf = conf.source.clone();
    let hints = (plan.placement == Placement::Recorded).then(Hints::default);
    let device: Box<dyn DeviceMemory> = Box::new(ReplayDevice::new(
        SimDevice::new(plan.capacity),
        hints.clone().unwrap_or_default(),
    ));
    let allocator = CachingAllocator::new(device, conf.clone())
        .map_err(|error| ReplayError::Allocator(error.to_string()))?;
    // The file's size bounds what the replay may hold (a missing file is the reader's error).
    let file_size = std::fs::metadata(path).map_or(0, |meta| meta.len());
    let mut engine = Engine::new(allocator, hints, plan.routes.clone())
        .with_live_limit(LiveLimit::default(), file_size);
    let device_index = plan.device_index;
    for observer in observers {
        engine.subscribe(observer);
    }
    let mut last_index = 0;
    let mut other_devices = 0;
    let remainder = pickle::stream_file(path, |emitted| {
        // One device's trace is replayed; pinned host memory never is.
        match emitted.trace {
            Trace::Device(index) if device_index.is_none_or(|wanted| wanted == index) => {}
            Trace::Device(_) => {
                other_devices += 1;
                return Ok(());
            }
            Trace::Host(_) | Trace::Other => return Ok(()),
        }
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
    engine.counts.other_device_events += other_devices;
    let devices = device_traces(&remainder);
    if let Some(wanted) = device_index {
        if wanted as usize >= remainder.traces.len() {
            return Err(ReplayError::NoSuchDevice(format!(
                "the file has no trace for device {wanted}: {}",
                describe_devices(&devices)
            )));
        }
    }
    let device_index = match device_index {
        Some(wanted) => wanted as usize,
        None => engine
            .trace()
            .and_then(|id| remainder.traces.iter().position(|(list, _)| *list == id))
            .unwrap_or(0),
    };
    if engine.counts.events == 0 {
        return Err(ReplayError::NoHistory(if remainder.has_device_traces {
            format!(
                "device {device_index}'s trace holds no allocator event ({})",
                describe_devices(&devices)
            )
        } else {
            "the file records no trace (no 'device_traces': a snapshot taken without history, or PyTorch 2.0's bare list of segments)".into()
        }));
    }
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
    let mut routes = PoolRoutes::default();
    for segment in &remainder.segments {
        let (first, second) = segment.pool;
        let pool = MemPoolId::new(first as u64, second as u64);
        if pool.is_default() || segment.device != device_index as i64 {
            continue;
        }
        let base = segment.address;
        let made = engine.made_at(base).unwrap_or(0);
        routes.add(base, segment.total_size, pool, made);
    }
    let stats = engine.allocator().stats();
    let report = ReplayReport {
        file: path.display().to_string(),
        device_index,
        capacity: plan.capacity,
        capacity_source: plan.capacity_source,
        alloc_conf,
        conf,
        conf_source,
        placement: plan.placement,
        routes: plan.routes.clone(),
        counts: engine.counts.clone(),
        first_oom: engine.first_oom.clone(),
        final_stats: stats.entries(),
        fragmentation: Fragmentation::of(stats),
        segment_events: engine.segments.clone(),
        devices,
        host: HostMemory::of(&remainder),
    };
    let learned = Learned {
        settings: remainder.settings,
        routes,
    };
    Ok((report, learned))
}

/// Each device's trace in the file and its entries.
fn device_traces(remainder: &Remainder) -> Vec<DeviceTrace> {
    remainder
        .traces
        .iter()
        .enumerate()
        .map(|(index, &(_, entries))| DeviceTrace {
            index: u32::try_from(index).unwrap_or(u32::MAX),
            entries,
        })
        .collect()
}

/// "devices 0 (120 entries), 1 (0 entries)", for messages.
fn describe_devices(devices: &[DeviceTrace]) -> String {
    if devices.is_empty() {
        return "the file holds no device trace".into();
    }
    let list: Vec<String> = devices
        .iter()
        .map(|device| format!("{} ({} entries)", device.index, device.entries))
        .collect();
    format!("the file holds devices {}", list.join(", "))
}
