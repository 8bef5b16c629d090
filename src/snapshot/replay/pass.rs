//! One replay of a file: the replay's device and allocator under one config, the plan for it
//! (the state the trace starts from, the limit the recorded OOMs show), the events handed to
//! the engine, and the report at the end.

use std::path::Path;
use std::rc::Rc;

use super::device::{Hints, ReplayDevice};
use super::endstate::EndStateComparison;
use super::engine::{LiveLimit, PoolRoutes};
use super::frames::Lookup;
use super::held::{Held, HeldElsewhere};
use super::limit::{Applied, Limit};
use super::recording::{same_behaviour, Recording};
use super::sequence::DeviceCall;
use super::start::{self, StartState};
use super::timing_check::{AtOnce, Rewrite};
use super::{
    seed, CapacitySource, ConfSource, Engine, Fragmentation, HostMemory, LimitPolicy, Placement,
    ReplayError, ReplayOptions, ReplayReport, StartReport,
};
use crate::alloc::{
    fraction_cap, AllocConf, CachingAllocator, MemPoolId, MemoryObserver, LARGE_BUFFER,
};
use crate::device::sim::{SimDevice, H200_TOTAL_MEMORY};
use crate::device::DeviceMemory;
use crate::snapshot::model::Action;
use crate::snapshot::pickle::{Emitted, Entry, SnapshotError, Trace};

/// What a replay of a recording puts on its allocator before the first event.
pub(super) struct Plan {
    /// The state the trace starts from (empty for a trace that holds the whole job).
    start: StartState,
    /// The limit the recorded OOMs show.
    limit: Limit,
    /// How it is to be applied.
    applied: Applied,
    /// The start state as the report shows it, once seeded.
    start_report: Option<StartReport>,
}

/// A replay in progress.
pub(super) struct Pass {
    engine: Engine,
    /// The placement hints the engine feeds (recorded placement only).
    hints: Option<Hints>,
    /// The replay device's placements, which it counts.
    placements: Hints,
    held: Held,
    capacity: u64,
    capacity_source: CapacitySource,
    context: u64,
    conf: AllocConf,
    conf_source: ConfSource,
    /// [`Placement::Recorded`] or [`Placement::Model`].
    placement: Placement,
    /// The private pools' segments the engine routes allocations to.
    routes: PoolRoutes,
    /// The device whose trace is replayed; `None`: the first with events.
    wanted: Option<u32>,
    last_index: u64,
    /// Whether the trace's end was replayed ([`Pass::end_trace`]).
    ended: bool,
    /// The other recording whose addresses segments are placed at ([`Pass::follow_other`]).
    addresses_from: Option<std::path::PathBuf>,
    /// The trace's deferred frees completed at their requests ([`Pass::complete_at_once`]).
    at_once: Option<AtOnce>,
}

impl Pass {
    /// A replay of the file at `path` on the device `options` names, under `conf`, placing
    /// segments by `placement` ([`Placement::Recorded`] or [`Placement::Model`]; recorded
    /// placement follows `calls`, the trace's device calls, when the scan kept them, else
    /// learns them as it reads), routing allocations to private pools by `routes`, with
    /// `observers` subscribed.
    pub(super) fn new(
        path: &Path,
        options: &ReplayOptions,
        (conf, conf_source): (AllocConf, ConfSource),
        (placement, calls): (Placement, Option<&[DeviceCall]>),
        routes: PoolRoutes,
        observers: Vec<Box<dyn MemoryObserver>>,
    ) -> Result<Pass, ReplayError> {
        let (capacity, capacity_source) = options.capacity();
        let sim = SimDevice::new(capacity);
        let context = sim.context_bytes();
        let held = Held::default();
        let placements = match placement {
            Placement::Recorded => calls.map_or_else(Hints::default, Hints::knowing),
            // Placed by the model, yet able to put a segment above the live ones when the
            // model's address is taken: hints nothing is pushed to.
            Placement::Model => Hints::default(),
        };
        let device: Box<dyn DeviceMemory> = Box::new(ReplayDevice::new(sim, placements.clone()));
        let hints = (placement == Placement::Recorded).then(|| placements.clone());
        let device = Box::new(HeldElsewhere::new(device, Rc::clone(&held)));
        let allocator = CachingAllocator::new(device, conf.clone())
            .map_err(|error| ReplayError::Allocator(error.to_string()))?;
        // The file's size bounds what the replay may hold (a missing file is the reader's error).
        let file_size = std::fs::metadata(path).map_or(0, |meta| meta.len());
        let mut engine = Engine::new(allocator, hints.clone(), routes.clone())
            .with_live_limit(LiveLimit::default(), file_size);
        engine.provisional_room(recorded_device_room(capacity, context));
        for observer in observers {
            engine.subscribe(observer);
        }
        Ok(Pass {
            engine,
            hints,
            placements,
            held,
            capacity,
            capacity_source,
            context,
            conf,
            conf_source,
            placement,
            routes,
            wanted: options.device_index,
            last_index: 0,
            ended: false,
            addresses_from: None,
            at_once: None,
        })
    }

    /// What this replay of `recording` must put on its allocator: the start state, and the
    /// inferred limit when `options` allow it and the config sets no fraction of its own.
    pub(super) fn plan(
        &self,
        recording: &Recording,
        options: &ReplayOptions,
    ) -> Result<Plan, ReplayError> {
        let start = start::rebuild(&recording.scan, &recording.segments(), self.engine.allocator())
            .map_err(|error| {
                ReplayError::Unreplayable(format!(
                    "{error}. The trace starts mid-run (PyTorch keeps only the last max_entries events), and rebuilding the state it starts from failed"
                ))
            })?;
        // The limit is the recorded run's, so it is read with the recorded config's segments.
        let limit = recording.scan.pressure.infer(
            start.figures().reserved_bytes,
            recording.recorded_expandable(),
            recording.recorded_large_segment_size(),
        );
        let allowed = options.limit == LimitPolicy::UnlessCapacityGiven
            && options.capacity.is_none()
            && self.conf.per_process_memory_fraction.is_none();
        let applied = if allowed {
            self.limit_for(&limit)
        } else {
            Applied::No
        };
        Ok(Plan {
            start,
            limit,
            applied,
            start_report: None,
        })
    }

    /// How `limit` goes on this device: a cap (the lowest the trace allows, so every recorded
    /// refusal recurs), or the memory a full device lacked held elsewhere.
    fn limit_for(&self, limit: &Limit) -> Applied {
        match *limit {
            Limit::Cap(bounds) if bounds.lower < self.capacity => Applied::Cap(bounds.lower),
            Limit::Device { usable, .. } => {
                let free = self.capacity.saturating_sub(self.context);
                if usable < free {
                    Applied::HeldElsewhere(free - usable)
                } else {
                    Applied::No
                }
            }
            Limit::Cap(_) | Limit::NoRecordedOoms | Limit::Inconsistent(_) => Applied::No,
        }
    }

    /// Whether this replay, run from an empty allocator as it read, is the replay of
    /// `recording` under `options`: no start state, no limit to apply, the recorded config's
    /// behaviour when none was given, frees recorded as `free_completed`.
    pub(super) fn needs_nothing_more(
        &self,
        recording: &Recording,
        options: &ReplayOptions,
        plan: &Plan,
    ) -> Result<bool, ReplayError> {
        let (conf, _) = recording.choose_conf(options)?;
        Ok(plan.start.is_empty()
            && plan.applied == Applied::No
            && self.placement == options.placement
            && recording.routes().is_empty()
            // A pool inferred as it read, without the end state, which tells a default-pool
            // segment (`PoolRoutes`): a pass knowing it reads again.
            && self.mem_pool_claims_trusted_or_not().is_empty()
            && !recording.frees_on_request()
            && same_behaviour(&self.conf, &conf)
            // It read before the file named its config, taking it for the recorded one.
            && (!self.engine.assumed_recorded_config() || recording.is_recorded_conf(&self.conf))
            // A replay that made a segment before the recording did (a what-if config): a
            // pass knowing the trace's every device call places it where the driver did.
            && !self.hints.as_ref().is_some_and(Hints::ran_ahead))
    }

    /// Puts `plan` on the allocator: seeds the start state, then applies the limit.
    pub(super) fn apply(
        &mut self,
        mut plan: Plan,
        recording: &Recording,
    ) -> Result<Plan, ReplayError> {
        if !plan.start.is_empty() {
            let held = if recording.is_recorded_conf_but_fraction(&self.conf) {
                seed::HeldBy::TheRecordedRun
            } else {
                seed::HeldBy::AnotherConfig
            };
            let seeded = seed::seed(
                self.engine.allocator_mut(),
                &plan.start,
                self.hints.as_ref(),
                held,
            )
            .map_err(ReplayError::Allocator)?;
            self.engine
                .start_from(&seeded)
                .map_err(ReplayError::Allocator)?;
            plan.start_report = Some(StartReport {
                figures: plan.start.figures(),
                layout: seeded.layout(),
                failed: seeded.failed.len() as u64,
            });
        }
        plan.applied = match plan.applied {
            Applied::Cap(cap) => self.set_cap(cap, &plan.limit),
            Applied::HeldElsewhere(held) => {
                self.held.set(held);
                Applied::HeldElsewhere(held)
            }
            Applied::No => Applied::No,
        };
        if recording.frees_on_request() {
            self.engine.free_on_request();
        }
        self.engine
            .follows_recorded_config(recording.is_recorded_conf(&self.conf));
        if let Some(recorded) = recording.recorded_alloc_conf() {
            self.engine.recorded_conf(recorded);
        }
        if let Some(room) = self.recording_room(&plan, recording) {
            self.engine.recording_room(room);
        }
        if let Some(hints) = &self.hints {
            hints.follow();
            hints.what_if(!recording.is_recorded_conf(&self.conf));
        }
        Ok(plan)
    }

    /// For a replay of a trace that starts with its process, under another config than the
    /// recorded one or a fraction: the bytes the recorded run could reserve in all, as far
    /// as the file shows. Under the recorded config and a fraction the recording never went
    /// above, the replay describes the recorded run: the fraction's cap. Otherwise (a what-if
    /// config, or a fraction the recording exceeded, so it did not run under it) the limit
    /// its OOMs show (the least it can have been), else the recording's device's room beside
    /// the CUDA context ([`recorded_device_room`]); never less than the most the recording
    /// held. `None` for a self-replay (its own state decides as the recording did) and
    /// where the file cannot tell: the trace starts mid-run (its reserved bytes are not
    /// known), the limit changed while the job ran, or the recorded config collects garbage
    /// (which releases below any limit, under a fraction the file does not record).
    fn recording_room(&self, plan: &Plan, recording: &Recording) -> Option<u64> {
        if !plan.start.is_empty() || recording.recorded_collects_garbage() {
            return None;
        }
        let highest = recording.scan.pressure.highest().unwrap_or(0).max(0) as u64;
        // A fraction the file records capped the recorded run (on a device of this replay's
        // size: the file does not record the device's), whatever config this replay asks
        // about.
        let recorded_cap = recording
            .recorded_fraction()
            .and_then(|fraction| fraction_cap(fraction, self.capacity));
        let expandable = recording.recorded_expandable();
        if recording.is_recorded_conf_but_fraction(&self.conf) {
            match recorded_cap.or(self.engine.allocator().allowed_memory_maximum()) {
                None => return None,
                Some(cap) if could_run_under(highest, cap, expandable) => return Some(cap),
                Some(_) => {}
            }
        }
        // The recording held `highest` bytes at once, so it had that room at least, whatever
        // device this replay asks about (a smaller one, say, for --min-capacity).
        match plan.limit {
            Limit::NoRecordedOoms => Some(
                recorded_cap
                    .filter(|&cap| could_run_under(highest, cap, expandable))
                    .unwrap_or_else(|| recorded_device_room(self.capacity, self.context)),
            ),
            Limit::Cap(bounds) => Some(bounds.lower),
            Limit::Device { usable, .. } => Some(usable),
            Limit::Inconsistent(_) => None,
        }
        .map(|room| room.max(highest))
    }

    /// Sets the memory fraction whose cap, truncated as PyTorch truncates it, is `cap`.
    fn set_cap(&mut self, cap: u64, limit: &Limit) -> Applied {
        let Some(bounds) = limit.bounds() else {
            return Applied::No;
        };
        let fraction = (cap as f64 + 0.5) / self.capacity as f64;
        let allocator = self.engine.allocator_mut();
        if fraction >= 1.0 || allocator.set_memory_fraction(fraction).is_err() {
            return Applied::No;
        }
        match allocator.allowed_memory_maximum() {
            Some(set) if set >= bounds.lower && set < bounds.upper => Applied::Cap(set),
            _ => {
                let _ = allocator.set_memory_fraction(1.0);
                Applied::No
            }
        }
    }

    /// Whether `emitted` is an entry of the device replayed.
    pub(super) fn replays(&self, emitted: &Emitted) -> bool {
        matches!(emitted.trace, Trace::Device(device) if self.wanted.is_none_or(|wanted| wanted == device))
    }

    /// Replays one event of the device replayed (another device's is counted; pinned host
    /// memory's is never replayed).
    pub(super) fn handle(&mut self, emitted: Emitted) -> Result<(), SnapshotError> {
        match emitted.trace {
            Trace::Device(device) if self.wanted.is_none_or(|wanted| wanted == device) => {}
            Trace::Device(_) => {
                self.engine.counts.other_device_events += 1;
                return Ok(());
            }
            Trace::Host(_) | Trace::Other => return Ok(()),
        }
        self.last_index = super::event_number(&emitted);
        let rewrite = match &mut self.at_once {
            Some(at_once) => at_once.rewrite(self.last_index, &emitted.entry),
            None => Rewrite::Keep,
        };
        match rewrite {
            Rewrite::Keep => self.engine.handle(emitted),
            Rewrite::Drop => Ok(()),
            Rewrite::ThenComplete(completed) => {
                let completion = Emitted {
                    entry: Entry::Memory(completed),
                    ..emitted
                };
                self.engine.handle(emitted)?;
                self.engine.handle(completion)
            }
        }
    }

    /// Makes this pass complete every free the trace deferred at its request, as on a GPU that
    /// finished every side stream's work at once (`timing_check.rs`).
    pub(super) fn complete_at_once(&mut self, scan: &super::scan::Scan) {
        self.at_once = Some(AtOnce::new(scan));
    }

    /// Makes this pass read the trace as the recorded run's although its config names a
    /// memory fraction the file does not record (the one the run set in code, as a
    /// self-replay gives it): what it infers from its state holds only if it then reproduces
    /// every segment event ([`Pass::reproduced_segments`]), which its caller checks.
    pub(super) fn read_as_recorded_run(&mut self) {
        self.engine.follows_recorded_config(true);
        if let Some(hints) = &self.hints {
            hints.what_if(false);
        }
    }

    /// Makes this pass place segments where another recording of the job, the file at
    /// `other`, placed them, following `calls`, that recording's device calls
    /// ([`Hints::follow_other`]); a pass placing by the model has no recorded addresses to
    /// replace.
    pub(super) fn follow_other(&mut self, other: &Path, calls: &[DeviceCall]) {
        if let Some(hints) = &self.hints {
            hints.follow_other(calls);
            self.addresses_from = Some(other.to_path_buf());
        }
    }

    /// The `MemPool` claims a replay that learns from this one can trust: if it reproduced
    /// every segment event so far, those it inferred as the segments were made (claims its
    /// releases made it did not need, and a release run's reading can take a default-pool
    /// segment for a pool's); else those made before its first difference, the releases'
    /// included.
    pub(super) fn trusted_mem_pool_claims(&self) -> Vec<(u64, MemPoolId)> {
        if self.reproduced_segments() {
            return self.engine.inferred_mem_pool_claims();
        }
        self.engine
            .mem_pool_claims_before(self.first_difference_at())
    }

    /// [`Pass::trusted_mem_pool_claims`] less those made at releases read after the run that
    /// met the first difference ([`Engine::mem_pool_claims_read_in_time`]).
    pub(super) fn mem_pool_claims_read_in_time(&self) -> Vec<(u64, MemPoolId)> {
        if self.reproduced_segments() {
            return self.engine.inferred_mem_pool_claims();
        }
        self.engine
            .mem_pool_claims_read_in_time(self.first_difference_at())
    }

    /// The event where this pass's segment events first differed from the recording's (the
    /// earlier of the recorded and the replayed one); `u64::MAX` where none did.
    fn first_difference_at(&self) -> u64 {
        self.engine
            .segments
            .first_difference
            .as_ref()
            .map_or(u64::MAX, |difference| {
                let at = |seen: &Option<super::compare::Seen>| seen.as_ref().map(|s| s.index);
                match (at(&difference.recorded), at(&difference.replayed)) {
                    (Some(a), Some(b)) => a.min(b),
                    (Some(a), None) | (None, Some(a)) => a,
                    (None, None) => u64::MAX,
                }
            })
    }

    /// The `MemPool` claims this pass made only as the segments were released: they routed
    /// nothing in it, so they hold only if a pass that knows them from the start reproduces
    /// the recording too.
    pub(super) fn released_mem_pool_claims(&self) -> Vec<(u64, MemPoolId)> {
        self.engine.released_mem_pool_claims()
    }

    /// Every `MemPool` claim this pass made, trusted or not: whether it inferred any.
    pub(super) fn mem_pool_claims_trusted_or_not(&self) -> Vec<(u64, MemPoolId)> {
        self.engine.mem_pool_claims()
    }

    /// Whether every segment event so far is the recording's (a self-replay whose state is
    /// the recording's, so that what it inferred from that state holds).
    pub(super) fn reproduced_segments(&self) -> bool {
        let segments = &self.engine.segments;
        segments.recorded == segments.replayed
            && segments.differing == 0
            && segments.first_difference.is_none()
    }

    /// Takes what self-replays taught about `MemPool`s: their claims
    /// ([`Engine::learn_mem_pools`]), and whether to go on inferring pools as it reads
    /// ([`Engine::infer_mem_pools_as_read`]).
    pub(super) fn learn_mem_pools(&mut self, lesson: &super::lessons::Lesson) {
        self.engine.learn_mem_pools(&lesson.claims);
        self.engine.infer_mem_pools_as_read(lesson.infer_as_read);
    }

    /// Whether this self-replay, learning, claims the segments a default-pool malloc passed
    /// over ([`Engine::claim_passed_over_blocks`]).
    pub(super) fn claim_passed_over_blocks(&mut self, claim: bool) {
        self.engine.claim_passed_over_blocks(claim);
    }

    /// Whether this self-replay found segments a default-pool malloc passed over, claimed
    /// or not ([`Engine::claim_passed_over_blocks`]).
    pub(super) fn saw_passed_over_blocks(&self) -> bool {
        self.engine.passed_over_seen
    }

    pub(super) fn events(&self) -> u64 {
        self.engine.counts.events
    }

    /// Replays the trace's end once, after its last event: the run of releases and
    /// completions it ends with (an `empty_cache()` at the end, say), and the frees still
    /// held. Before it, what the pass inferred and compared leaves that run out.
    pub(super) fn end_trace(&mut self) -> Result<(), ReplayError> {
        if !self.ended {
            self.ended = true;
            self.engine.finish(self.last_index)?;
        }
        Ok(())
    }

    /// Ends the replay of the file at `path` and makes its report.
    pub(super) fn finish(
        mut self,
        path: &Path,
        recording: &Recording,
        plan: Plan,
    ) -> Result<ReplayReport, ReplayError> {
        self.end_trace()?;
        // A replay that ran as it read started under PyTorch's defaults: when the file
        // records a config that behaves alike, the report names the recorded one.
        if self.conf_source == ConfSource::DefaultNoSettings {
            let (conf, source) = recording.choose_conf(&ReplayOptions::default())?;
            self.conf = conf;
            self.conf_source = source;
        }
        let recorded_conf = recording.is_recorded_conf(&self.conf);
        let scan = &recording.scan;
        let engine = &self.engine;
        let stats = engine.allocator().stats();
        let end_state = EndStateComparison::of(
            &recording.segments(),
            &engine.allocator().segment_snapshots(),
        );
        Ok(ReplayReport {
            file: path.display().to_string(),
            mem_pool_lessons: recording.mem_pool_lessons(),
            device_index: recording.device_index,
            capacity: self.capacity,
            capacity_source: self.capacity_source,
            alloc_conf: self.conf.source.clone(),
            conf: self.conf.clone(),
            conf_source: self.conf_source,
            placement: self.placement,
            addresses_from: self.addresses_from.clone(),
            placed: self.placements.placed(),
            routes: self.routes.clone(),
            counts: engine.counts.clone(),
            first_oom: engine.first_oom.clone(),
            ooms: engine.ooms.clone(),
            causes: engine.causes.clone(),
            final_stats: stats.entries(),
            fragmentation: Fragmentation::of(stats),
            segment_events: engine.segments.clone(),
            start: plan.start_report,
            limit: plan.limit,
            limit_applied: plan.applied,
            end_state,
            recorded_actions: Action::PYTORCH
                .iter()
                .map(|&action| (action.name(), scan.count(action)))
                .collect(),
            free_on_request: recording.frees_on_request(),
            recorded_conf,
            frames: Lookup::NotNeeded,
            placement_check: None,
            timing_check: None,
            devices: recording.devices(),
            host: HostMemory::of(&recording.remainder),
        })
    }
}

/// The room beside the CUDA context of the device a recording without OOMs ran on, as a replay
/// reads the recording: the file does not record the device's size, so the simulated H200's
/// (the default device), or the replay's own where that is larger. A replay on a smaller
/// device (`--device`, `--min-capacity`'s probes) asks what the job would do there; the recorded
/// run did what it did on its own device, so its reading (was a run of releases before a
/// malloc the program's `empty_cache()` or that malloc's OOM path?) does not follow the
/// replay's device. The what-if property found a job recorded on 16 GiB and replayed on
/// 768 MiB whose `empty_cache()` was read as the OOM path of the malloc after it: one retry
/// more than the direct run's.
fn recorded_device_room(capacity: u64, context: u64) -> u64 {
    capacity.max(H200_TOTAL_MEMORY).saturating_sub(context)
}

/// Whether a run capped at `cap` reserved bytes (a memory fraction) could have held `highest`
/// bytes at once. PyTorch checks the cap against the allocation's size (`alloc_block`:
/// `total_allocated_memory + size > allowed_memory_maximum`), rounded to 2 MiB, but an
/// expandable segment then maps whole pages for the request (`kLargeBuffer`, 20 MiB, in the
/// large pool): such a run can hold up to a page less than that more than its cap.
fn could_run_under(highest: u64, cap: u64, expandable: bool) -> bool {
    let overshoot = if expandable { LARGE_BUFFER - 1 } else { 0 };
    highest <= cap.saturating_add(overshoot)
}
