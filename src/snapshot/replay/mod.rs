//! `gpumem replay`: a snapshot PyTorch wrote, replayed event by event through gpumem's
//! allocator on a simulated device, to answer "will my job fit?" and "what would this config
//! change?".
//!
//! The file is streamed ([`crate::snapshot::pickle::stream_file`]) in memory that follows the
//! live blocks, not the trace's length. The first pass ([`replay_reading`]) scans the trace
//! (`scan`) and replays it as it reads (`pass.rs`, [`engine`]). What the scan learns by the
//! end of the file ([`Recording`]) — the recorded config (PyTorch writes `allocator_settings`
//! after the trace), whether the history is empty or was recorded with `skip_actions`, the
//! state the trace starts from when the ring buffer wrapped (`start`, put into the allocator
//! by [`seed`]), and the limit the recorded OOMs show (`limit`) — decides whether that replay
//! stands or a second ([`replay_recording`]) replays the file with it. A second pass also runs
//! when the file's segments show private pools (their allocations are routed to them,
//! [`engine::PoolRoutes`]). The end is compared with
//! the file's `segments` (`endstate`), and the frames of the events the answer names are
//! looked up ([`frames`]). A replay under pressure that placed segments the recording does not
//! place runs once more under the simulator's placement (`placement_check.rs`), so that the
//! verdict can say when the answer depends on where the driver puts segments. What it found is
//! a [`ReplayReport`] with its verdict ([`verdict`]).
//! Events are numbered from 1 in file order ([`event_number`]).
//!
//! ```no_run
//! use gpumem::snapshot::replay::{replay, ReplayOptions};
//!
//! let options = ReplayOptions::default();
//! let report = replay(std::path::Path::new("job.pickle"), &options, &mut |_, _| {})?;
//! println!("peak reserved {}", report.stat("reserved_bytes.all.peak"));
//! # Ok::<(), gpumem::snapshot::replay::ReplayError>(())
//! ```

pub(crate) mod addresses;
pub(crate) mod answer;
mod captures;
pub(crate) mod compare;
pub mod device;
pub(crate) mod endstate;
pub mod engine;
pub mod frames;
pub(crate) mod held;
pub(crate) mod lessons;
pub(crate) mod limit;
pub(crate) mod mapped;
mod mirror;
mod pass;
pub mod peaks;
pub(crate) mod placement_check;
pub(crate) mod ranges;
pub(crate) mod recording;
pub mod report;
pub(crate) mod scan;
pub mod search;
pub mod seed;
pub(crate) mod sequence;
pub(crate) mod start;
pub(crate) mod timing_check;
pub mod tune;
pub mod verdict;

pub use search::{min_capacity, min_capacity_of, CapacitySearch};

use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::alloc::{AllocConf, MemoryObserver};
use crate::device::sim::H200_TOTAL_MEMORY;
use crate::snapshot::pickle::{self, Emitted, SnapshotError};
pub use engine::{Engine, PoolRoutes};
use lessons::Lesson;
use pass::Pass;
pub use recording::Recording;
pub use report::{
    CapacitySource, ConfSource, DeviceTrace, Fragmentation, HostMemory, ReplayReport, StartReport,
    StatScope,
};
use scan::Scan;
use sequence::DeviceCall;

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
    /// The file holds no allocator event to replay for the device asked for: the history was
    /// not recorded. The message names the fix (`_record_memory_history()`).
    #[error("{0}")]
    NoHistory(String),
    /// `--device-index` names a device the file has no trace for.
    #[error("{0}")]
    NoSuchDevice(String),
    /// The trace leaves out what a replay needs (`skip_actions`), or contradicts the file's
    /// segments.
    #[error("{0}")]
    Unreplayable(String),
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
///
/// Which of two equal-size cached blocks PyTorch takes depends on their addresses (its pools
/// are sets ordered by stream, size, address), so placement decides best-fit ties. The H200's
/// driver does not place `cudaMalloc` segments by a rule of the allocator's calls alone: in the
/// recordings of tests/gpu/whatif/results the same program makes the same segments at addresses
/// that interleave with ranges no allocator event shows (lazily loaded modules, the context),
/// e.g. a 20 MiB segment placed 64 MiB above the last one with nothing recorded between them,
/// and the same run in two processes differs by 32 MiB in 9 of 28 segments. What the driver
/// did at a given point of the program is best known from a recording of that program, under
/// any config: hence [`Placement::Recorded`] by default, a what-if replay included.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    /// Where PyTorch's driver placed the recording's segment: the recording's next
    /// `cudaMalloc` while the replay's device calls are the recording's (every segment of a
    /// self-replay). Under a what-if config, once they differ, where the driver's model puts
    /// the segment in the recording's address space, knowing the memory the recording shows
    /// others held (`replay/mirror.rs`; for a trace that starts with its process). Else the
    /// segment the trace made at the same allocation, right above the last large segment (the
    /// driver's bump pointer), or the simulator's model (`replay/sequence.rs`,
    /// `replay/device.rs`). A recorded address that would overlap a live segment is never
    /// used, so a placement never fails.
    #[default]
    Recorded,
    /// Always the simulator's placement model (the H200 driver's, as measured in another
    /// process).
    Model,
}

/// Whether a limit inferred from the recorded OOMs (`limit`) is put on the replay.
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
    /// The device whose trace is replayed (its position in `device_traces`); `None` = the
    /// first with entries.
    pub device_index: Option<u32>,
    /// Whether an inferred limit is applied.
    pub limit: LimitPolicy,
    /// Another recording of the same job whose segment addresses a [`Placement::Recorded`]
    /// replay follows instead of the file's own (see [`Hints`](device::Hints)'s
    /// `follow_other`): for telling, when a what-if replay differs from PyTorch's own run under
    /// that config, whether the driver's placement or the allocator's decisions differ.
    pub addresses_from: Option<PathBuf>,
    /// When frees deferred by `record_stream` complete.
    pub deferred_frees: DeferredFrees,
}

/// When a replay completes the frees `record_stream` deferred (`free_requested` now,
/// `free_completed` once the side stream's work is done).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DeferredFrees {
    /// Where the recording completed each one (and on the replay's own OOM path): the
    /// recording's GPU timing.
    #[default]
    AsRecorded,
    /// Each at its request, as on a GPU that finished every side stream's work at once; one
    /// still pending at the trace's end stays pending (`timing_check.rs`).
    AtOnce,
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

/// The number a replay gives a file's trace event, in its text, JSON, errors and pictures
/// alike: the event's position among the file's trace entries (every device's trace, in
/// file order), counted from 1. For a file of one device it is the position in
/// `device_traces[0]` plus one (Python's `enumerate(trace, 1)`); 0 stands for the state
/// before the first event.
pub fn event_number(emitted: &Emitted) -> u64 {
    emitted.index + 1
}

/// Told about each trace event of the file before it is replayed (to learn its stack, say:
/// [`peaks`]).
pub type Tap<'a> = &'a mut dyn FnMut(&Emitted<'_>);

/// How often (in events) progress is reported.
const PROGRESS_EVERY: u64 = 1 << 16;

/// The first pass alone: reads the file at `path` without replaying it, and refuses a file
/// there is nothing to replay in (no history recorded, or one recorded without allocations or
/// frees, or a device the file has no trace for). For callers that replay one file several times ([`replay_recording`]).
pub fn read(
    path: &Path,
    device_index: Option<u32>,
    progress: Progress<'_>,
) -> Result<Recording, ReplayError> {
    let mut scan = Scan::new(device_index);
    let remainder = pickle::stream_file(path, |emitted| {
        scan.see(&emitted);
        if scan.events.is_multiple_of(PROGRESS_EVERY) {
            progress(emitted.offset, scan.events);
        }
        Ok(())
    })?;
    Recording::new(path, scan, remainder, device_index)
}

/// Replays the snapshot at `path`.
pub fn replay(
    path: &Path,
    options: &ReplayOptions,
    progress: Progress<'_>,
) -> Result<ReplayReport, ReplayError> {
    replay_reading(path, options, progress).map(|(report, _)| report)
}

/// Replays the snapshot at `path`, and returns what was read of it too, for more replays of
/// it ([`replay_recording`]).
///
/// The first pass replays as it reads, from an empty allocator under the config given (or
/// PyTorch's defaults). When the file turns out to need more — a trace that starts mid-run,
/// another recorded config or placement, private pools' segments, a limit to apply, frees
/// recorded only as `free_requested` — a
/// second pass replays it with what the first learned; a file recorded from the job's start
/// under the default config, with no limit to apply, is read once.
pub fn replay_reading(
    path: &Path,
    options: &ReplayOptions,
    progress: Progress<'_>,
) -> Result<(ReplayReport, Recording), ReplayError> {
    let (conf, conf_source) = match &options.conf {
        Some(conf) => (conf.clone(), ConfSource::Given),
        None => (AllocConf::default(), ConfSource::DefaultNoSettings),
    };
    let placement = options.placement;
    let mut first = Pass::new(
        path,
        options,
        (conf, conf_source),
        (placement, None),
        PoolRoutes::default(),
        Vec::new(),
    )?;
    let mut scan = Scan::new(options.device_index);
    // Set once the first pass's replay cannot stand: the trace starts mid-run, or an event
    // failed in it (frees recorded only as requests, say): the second pass, which knows the
    // whole file, replays it or reports the error.
    let mut abandoned = false;
    let remainder = pickle::stream_file(path, |emitted| {
        scan.see(&emitted);
        let offset = emitted.offset;
        // A trace that has shown it starts mid-run is not handed on: the allocator never saw
        // the blocks it frees.
        if !abandoned {
            if scan.starts_mid_run() {
                abandoned = true;
            } else {
                match first.handle(emitted) {
                    Ok(()) => {}
                    // More allocations live at once than the file's size allows: a second
                    // pass would hold as many, so the read stops here.
                    Err(limit @ SnapshotError::Limit { .. }) => return Err(limit),
                    Err(_) => abandoned = true,
                }
            }
        }
        if scan.events.is_multiple_of(PROGRESS_EVERY) {
            progress(offset, scan.events);
        }
        Ok(())
    })?;
    let recording = Recording::new(path, scan, remainder, options.device_index)?;
    let (chosen, _) = recording.choose_conf(options)?;
    // Its inferences include those of the run the trace ends with.
    if !abandoned && first.end_trace().is_err() {
        abandoned = true;
    }
    // The first pass reads as the recorded run until the file names its config: its
    // inferences stand only where the config is the recorded one. It knows none of the
    // file's pools (their segments come at the file's end), so where the file has private
    // pools a replay knowing them may claim more segments at their release
    // (`Engine::end_run`), which only a pass knowing those from the start routes right.
    let pools_unread = !recording.routes().is_empty();
    recording.infers_mem_pools.set(
        !abandoned
            && recording.is_recorded_conf(&chosen)
            && (!first.mem_pool_claims_trusted_or_not().is_empty() || pools_unread),
    );
    let plan = first.plan(&recording, options)?;
    // Under another config than the recorded one, `MemPool`s only a self-replay can infer
    // route the replay's allocations; under the recorded one too where the first pass
    // inferred some (a pool's segments that made new memory, whichever pool was asked, are
    // told by their release only, after the replay took them for the default pools'): a
    // second pass takes them.
    let learned = recording.wants_learned_mem_pools(&chosen)
        && learned_mem_pools(path, &recording, options).teaches();
    // The first pass placed segments at the file's own addresses: a replay at another
    // recording's (`addresses_from`) is a second pass's.
    let mut report = if !abandoned
        && !learned
        && options.addresses_from.is_none()
        && first.needs_nothing_more(&recording, options, &plan)?
    {
        first.finish(path, &recording, plan)?
    } else {
        // The first replay's allocator and live blocks go before the second's are made.
        drop(first);
        replay_recording(path, &recording, options, &mut *progress, Vec::new())?
    };
    check_verdict(path, &recording, options, &mut report, progress)?;
    report.frames = frames::attach(path, &mut report.first_oom, &mut report.ooms);
    Ok((report, recording))
}

/// When `report` (a replay of `path` with `options`) was under pressure and placed segments
/// the recording does not place, replays the file once more with every segment placed by the
/// simulator's model and puts what that found into `report`, whose verdict then says whether
/// the answer depends on the placement (`placement_check.rs`); and when it is a what-if
/// replay of a trace with deferred frees, once more with each completed at its request, for
/// whether it depends on the GPU's timing (`timing_check.rs`). [`replay_reading`] does it for
/// its own report; a caller of [`replay_recording`] (`gpumem replay --compare`) asks for it.
pub fn check_verdict(
    path: &Path,
    recording: &Recording,
    options: &ReplayOptions,
    report: &mut ReplayReport,
    progress: Progress<'_>,
) -> Result<(), ReplayError> {
    if placement_check::wanted(report) {
        placement_check::check(path, recording, options, report, &mut *progress)?;
    }
    if timing_check::wanted(report, options) {
        let options = timing_check::at_once(options);
        let again = replay_recording(path, recording, &options, progress, Vec::new())?;
        let verdict = again.verdict();
        report.timing_check = Some(report::TimingCheck {
            fits: verdict.fits,
            ooms: verdict.ooms,
            first_oom_event: verdict.first_oom_event,
        });
    }
    Ok(())
}

/// Replays the file at `path`, which [`read`] (or [`replay_reading`]) made `recording` of,
/// with `observers` subscribed to the replay allocator's event stream from its first event
/// (the rebuilt start state's included).
pub fn replay_recording(
    path: &Path,
    recording: &Recording,
    options: &ReplayOptions,
    progress: Progress<'_>,
    observers: Vec<Box<dyn MemoryObserver>>,
) -> Result<ReplayReport, ReplayError> {
    replay_recording_tapped(path, recording, options, progress, (observers, &mut |_| {}))
}

/// [`replay_recording`], also telling `tap` about each trace entry of the replayed device
/// before it is replayed.
fn replay_recording_tapped(
    path: &Path,
    recording: &Recording,
    options: &ReplayOptions,
    progress: Progress<'_>,
    (observers, tap): (Vec<Box<dyn MemoryObserver>>, Tap<'_>),
) -> Result<ReplayReport, ReplayError> {
    let (conf, conf_source) = recording.choose_conf(options)?;
    let pass_conf = conf.clone();
    let placement = options.placement;
    let mut pass = Pass::new(
        path,
        options,
        (conf, conf_source),
        (placement, recording.scan.device_calls()),
        recording.routes(),
        observers,
    )?;
    if let Some(other) = &options.addresses_from {
        pass.follow_other(other, &other_device_calls(other, options.device_index)?);
    }
    if options.deferred_frees == DeferredFrees::AtOnce {
        pass.complete_at_once(&recording.scan);
    }
    let lesson = recording
        .wants_learned_mem_pools(&pass_conf)
        .then(|| learned_mem_pools(path, recording, options));
    if let Some(lesson) = &lesson {
        pass.learn_mem_pools(lesson);
    }
    let plan = pass.plan(recording, options)?;
    let plan = pass.apply(plan, recording)?;
    // Where self-replays under this config and fraction, read as the recorded run's,
    // reproduced it, this replay is that run too: it reads the trace as they did.
    if lesson.is_some_and(|lesson| lesson.as_recorded_run) {
        pass.read_as_recorded_run();
    }
    pickle::stream_file(path, |emitted| {
        let offset = emitted.offset;
        if pass.replays(&emitted) {
            tap(&emitted);
        }
        pass.handle(emitted)?;
        if pass.events().is_multiple_of(PROGRESS_EVERY) {
            progress(offset, pass.events());
        }
        Ok(())
    })?;
    pass.finish(path, recording, plan)
}

/// The segments a self-replay of `recording` (under its recorded config, on the device
/// `options` give) finds to be `MemPool`s' (`replay/captures.rs`), by the index of the event
/// that made each: a replay under another config routes the allocations in them to those
/// pools, which its own state cannot tell. Replayed once per recording (and fraction) and
/// kept. Only a self-replay that reproduced every recorded segment event teaches anything:
/// the inference reads the replay's state as the recording's, which it is not where the
/// recorded run had a limit the replay does not have, or the replay failed. So a self-replay
/// learns on the device `options` give, whose memory its fraction is of: where `options` give
/// the recorded config with a memory fraction the file does not record (the one a job set
/// with `set_per_process_memory_fraction`, as a self-replay of it gives it), or the recorded
/// config with the fraction it records. Without it, garbage collection, which only a fraction
/// enables, would not release what the recording did. What it learns there stands where one
/// of its self-replays reproduced the recording, even if that taught nothing (inferring as it
/// reads is then right, and a lesson from another device would not be); else the recording
/// is replayed as it ran.
fn learned_mem_pools(path: &Path, recording: &Recording, options: &ReplayOptions) -> Lesson {
    let own_fraction = recording.choose_conf(options).ok().and_then(|(conf, _)| {
        let unrecorded = recording.recorded_fraction().is_none()
            && recording.is_recorded_conf_but_fraction(&conf);
        let recorded = recording.recorded_fraction().is_some() && recording.is_recorded_conf(&conf);
        conf.per_process_memory_fraction
            .filter(|_| unrecorded || recorded)
            .map(|fraction| (conf, fraction))
    });
    if let Some((conf, fraction)) = own_fraction {
        // That config and fraction on the device asked (a fraction is of its memory), read
        // as the recorded run's; a what-if of a run that had no fraction does not reproduce
        // the recording under one, and learns what the recording as it ran teaches.
        let own = ReplayOptions {
            conf: Some(conf),
            placement: Placement::Recorded,
            ..options.clone()
        };
        let key = Some((fraction.to_bits(), options.capacity));
        let learned = learned_under(path, recording, key, &own);
        if learned.reproduced {
            return learned;
        }
    }
    // The recording as it ran: its config, on the default device (the simulated H200, with
    // the limit the file's OOMs show), whatever device was asked, so that every later replay
    // of the file, a capacity search's included, learns the same.
    let own = ReplayOptions {
        conf: None,
        capacity: None,
        placement: Placement::Recorded,
        ..options.clone()
    };
    learned_under(path, recording, None, &own)
}

/// `MemPool` claims: (index of the event that made a segment, the pool it belongs to).
type Claims = Vec<(u64, crate::alloc::MemPoolId)>;

/// What self-replays of `recording` under `own` teach ([`learned_mem_pools`]), kept in the
/// recording under `key` (`None`: its recorded config as it is; else the bits of the fraction
/// given and the capacity it is a fraction of, the replay then read as the recorded run's).
/// A self-replay can learn, besides what it inferred as it went, segments it took for the
/// default pools' and found a pool's only when they were released (`Engine::end_run`): it
/// did not reproduce the recording then, but one that knows them from the start may, or may
/// find more (a pool's segment that made new memory, whichever pool was asked, is told by its
/// release only). At most [`LEARNING_PASSES`], while each finds more. A pass that reproduced
/// every recorded segment event teaches what it inferred as it read; what it claimed only at
/// the segments' release (which routed nothing in it) stands only if the next pass, knowing it
/// from the start, reproduces the recording too. A pass that did not reproduce it trusts the
/// claims made at releases after its first difference too (a pool's segment is often told by
/// its release alone); where learning then gets stuck, it starts again from the latest pass
/// that made such claims, with only those read up to the run that met its first difference
/// ([`learning_passes`]). Where none reproduced it, one more that infers
/// nothing may: then its lesson is to infer nothing (an inference read the trace the wrong way,
/// which the later events showed); else nothing is learnt.
fn learned_under(
    path: &Path,
    recording: &Recording,
    key: Option<(u64, Option<u64>)>,
    own: &ReplayOptions,
) -> Lesson {
    if let Some((_, known)) = recording
        .learned_mem_pools
        .borrow()
        .iter()
        .find(|(of, _)| *of == key)
    {
        return known.clone();
    }
    let as_recorded = key.is_some();
    let learn = || -> Result<Lesson, ReplayError> {
        let taught = |claims: Claims| Lesson {
            claims: claims.into(),
            infer_as_read: true,
            reproduced: true,
            as_recorded_run: as_recorded,
        };
        let mut inferred_any = false;
        let mut passed_over = false;
        // Without the segments default-pool mallocs passed over, and, where that reproduced
        // nothing and some were found, with them.
        for claim_passed_over in [false, true] {
            if claim_passed_over && !passed_over {
                break;
            }
            let conditions = LearningConditions {
                as_recorded,
                claim_passed_over,
            };
            let found = learning_passes(path, recording, own, conditions)?;
            inferred_any |= found.inferred;
            passed_over |= found.passed_over;
            if let Some(claims) = found.reproducing {
                return Ok(taught(claims));
            }
        }
        let conditions = LearningConditions {
            as_recorded,
            claim_passed_over: false,
        };
        let reproduced_without = inferred_any
            && learning_pass(path, recording, own, conditions, (&[], false))?.reproduced;
        Ok(Lesson {
            claims: std::sync::Arc::from(Vec::new()),
            infer_as_read: !reproduced_without,
            reproduced: reproduced_without,
            as_recorded_run: as_recorded && reproduced_without,
        })
    };
    let learned = learn().unwrap_or_default();
    recording
        .learned_mem_pools
        .borrow_mut()
        .push((key, learned.clone()));
    learned
}

/// How the self-replays of [`learned_under`] run: read as the recorded run's (its fraction
/// given), and whether they claim the segments default-pool mallocs passed over
/// ([`Pass::claim_passed_over_blocks`]).
#[derive(Debug, Clone, Copy)]
struct LearningConditions {
    as_recorded: bool,
    claim_passed_over: bool,
}

/// What [`learning_passes`] found.
struct Learnt {
    /// The claims of a pass that reproduced the recording, if one did.
    reproducing: Option<Claims>,
    /// Whether any pass inferred a `MemPool` claim.
    inferred: bool,
    /// Whether any pass found segments a default-pool malloc passed over.
    passed_over: bool,
}

/// Up to [`LEARNING_PASSES`] self-replays under `conditions`, each knowing what the ones
/// before found, while each finds more ([`learned_under`]).
fn learning_passes(
    path: &Path,
    recording: &Recording,
    own: &ReplayOptions,
    conditions: LearningConditions,
) -> Result<Learnt, ReplayError> {
    let mut known: Claims = Vec::new();
    // The claims of the last pass that reproduced the recording, when it had found more at
    // the segments' release, which the next pass tries.
    let mut reproducing: Option<Claims> = None;
    let mut learnt = Learnt {
        reproducing: None,
        inferred: false,
        passed_over: false,
    };
    // What each pass knew from the start.
    let mut tried: Vec<Claims> = Vec::new();
    // Where to learn again from when learning is stuck: what a pass knew, with only the
    // claims it read up to the run that met its first difference, latest last.
    let mut retreats: Vec<Claims> = Vec::new();
    for _ in 0..LEARNING_PASSES {
        tried.push(known.clone());
        let outcome = learning_pass(path, recording, own, conditions, (&known, true))?;
        learnt.inferred |= outcome.inferred;
        learnt.passed_over |= outcome.passed_over;
        let before = known.clone();
        let mut retreat = known.clone();
        merge_claims(&mut retreat, outcome.read_in_time);
        merge_claims(&mut known, outcome.trusted);
        if outcome.reproduced {
            let confirmed = known.clone();
            merge_claims(&mut known, outcome.released);
            if known == confirmed {
                learnt.reproducing = Some(confirmed);
                return Ok(learnt);
            }
            reproducing = Some(confirmed);
            continue;
        }
        if reproducing.is_some() {
            break;
        }
        if retreat != known {
            retreats.push(retreat);
        }
        // Stuck: this pass taught nothing new. A claim a pass made at a release read after
        // its own first difference came from a wrong state (the job's own `empty_cache()` or
        // a default OOM path read as a pool's, because the replay still held a pool's segment
        // the file no longer shows); learn again without such claims, from the latest pass
        // that made some.
        if known == before {
            match retreats.pop().filter(|retreat| !tried.contains(retreat)) {
                Some(retreat) => known = retreat,
                None => break,
            }
        }
    }
    learnt.reproducing = reproducing;
    Ok(learnt)
}

/// How many self-replays [`learned_mem_pools`] runs at most on one recording: each after the
/// first starts from the claims the ones before found (a pool's segments its releases told,
/// which only a replay knowing them from the start routes right, and what that one then
/// infers). Files without private pools stop after the first. results-wave8's `combo.frac`
/// needs 4 (each pass's releases tell the pool's segments of the next stretch of the trace),
/// so a file with one more such stretch would need 5: 6 leaves room, and a pass runs only
/// while the one before found more.
const LEARNING_PASSES: usize = 6;

/// Adds to `known` the claims of `found` on segments it holds none for. Where `found` gives a
/// pool the file names to a segment `known` gave a made-up `MemPool` (a stand-in, inferred
/// before anything named its pool), the stand-in was that pool: every claim of it is renamed.
fn merge_claims(known: &mut Claims, found: Claims) {
    for (made, pool) in found {
        match known.iter().find(|&&(at, _)| at == made).map(|&(_, of)| of) {
            None => known.push((made, pool)),
            Some(stand_in) if captures::is_stand_in(stand_in) && !captures::is_stand_in(pool) => {
                for claim in known.iter_mut().filter(|(_, of)| *of == stand_in) {
                    claim.1 = pool;
                }
            }
            Some(_) => {}
        }
    }
}

/// What one learning pass ([`learning_pass`]) found.
struct PassOutcome {
    /// Whether it reproduced every recorded segment event.
    reproduced: bool,
    /// The `MemPool` claims it trusts ([`Pass::trusted_mem_pool_claims`]).
    trusted: Claims,
    /// Those of them read up to the run that met its first difference
    /// ([`Pass::mem_pool_claims_read_in_time`]).
    read_in_time: Claims,
    /// The claims it made only at the segments' release ([`Pass::released_mem_pool_claims`]).
    released: Claims,
    /// Whether it inferred any `MemPool` claim at all.
    inferred: bool,
    /// Whether it found segments a default-pool malloc passed over.
    passed_over: bool,
}

/// The `cudaMalloc`/`cudaFree` calls of device `device_index`'s trace in the recording at
/// `other` (`--addresses-from`), every one of them.
fn other_device_calls(
    other: &Path,
    device_index: Option<u32>,
) -> Result<Vec<DeviceCall>, ReplayError> {
    let naming = |error: ReplayError| {
        ReplayError::Unreplayable(format!(
            "the recording to take addresses from: {}",
            error.naming(other)
        ))
    };
    let recording = read(other, device_index, &mut no_progress).map_err(naming)?;
    recording
        .scan
        .device_calls()
        .map(<[DeviceCall]>::to_vec)
        .ok_or_else(|| {
            naming(ReplayError::Unreplayable(format!(
                "it made more than {} cudaMalloc/cudaFree calls, too many to follow",
                scan::MAX_KEPT_CALLS
            )))
        })
}

/// One self-replay of [`learned_mem_pools`] under `own`, knowing the claims `learned` from
/// the start (read as the recorded run's where `as_recorded`, its fraction given), inferring
/// more as it reads where `infer`.
fn learning_pass(
    path: &Path,
    recording: &Recording,
    own: &ReplayOptions,
    conditions: LearningConditions,
    (learned, infer): (&[(u64, crate::alloc::MemPoolId)], bool),
) -> Result<PassOutcome, ReplayError> {
    let mut pass = Pass::new(
        path,
        own,
        recording.choose_conf(own)?,
        (Placement::Recorded, recording.scan.device_calls()),
        recording.routes(),
        Vec::new(),
    )?;
    pass.learn_mem_pools(&Lesson {
        claims: learned.into(),
        infer_as_read: infer,
        reproduced: false,
        as_recorded_run: false,
    });
    let plan = pass.plan(recording, own)?;
    pass.apply(plan, recording)?;
    if conditions.as_recorded {
        pass.read_as_recorded_run();
    }
    pass.claim_passed_over_blocks(conditions.claim_passed_over);
    pickle::stream_file(path, |emitted| pass.handle(emitted))?;
    pass.end_trace()?;
    let inferred = !pass.mem_pool_claims_trusted_or_not().is_empty();
    Ok(PassOutcome {
        reproduced: pass.reproduced_segments(),
        trusted: pass.trusted_mem_pool_claims(),
        read_in_time: pass.mem_pool_claims_read_in_time(),
        released: pass.released_mem_pool_claims(),
        inferred,
        passed_over: pass.saw_passed_over_blocks(),
    })
}

/// Replays `path` once more under the config, device, placement, pool routes and limit `report`
/// was made with, with `observers` subscribed to the replay allocator's event stream from its
/// first event (a timeline recorder, say: `gpumem replay --report/--timeline`).
pub fn replay_observed(
    path: &Path,
    report: &ReplayReport,
    observers: Vec<Box<dyn MemoryObserver>>,
) -> Result<ReplayReport, ReplayError> {
    replay_tapped(path, report, observers, &mut |_| {})
}

/// [`replay_observed`], also telling `tap` about each trace entry of the replayed device
/// before it is replayed.
pub fn replay_tapped(
    path: &Path,
    report: &ReplayReport,
    observers: Vec<Box<dyn MemoryObserver>>,
    tap: Tap<'_>,
) -> Result<ReplayReport, ReplayError> {
    let options = report.options();
    let recording = read(path, options.device_index, &mut no_progress)?;
    recording.take_mem_pool_lessons(&report.mem_pool_lessons);
    replay_recording_tapped(
        path,
        &recording,
        &options,
        &mut no_progress,
        (observers, tap),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::MemPoolId;

    #[test]
    fn a_named_pool_found_for_a_stand_ins_segment_renames_every_claim_of_it() {
        let stand_in = MemPoolId::new(0, (1 << 62) + 1);
        let other = MemPoolId::new(0, (1 << 62) + 2);
        let named = MemPoolId::new(0, 1);
        let mut known: Claims = vec![(3, stand_in), (9, stand_in), (12, other)];
        merge_claims(
            &mut known,
            vec![(9, named), (20, named), (12, MemPoolId::new(0, 2))],
        );
        assert_eq!(
            known,
            vec![
                (3, named),
                (9, named),
                (12, MemPoolId::new(0, 2)),
                (20, named)
            ]
        );
        // A claim already naming a pool the file names stands.
        merge_claims(&mut known, vec![(3, other), (9, MemPoolId::new(0, 3))]);
        assert_eq!(known[..2], [(3, named), (9, named)]);
    }
}
