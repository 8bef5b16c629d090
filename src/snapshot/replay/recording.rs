//! What the first pass over a file found ([`Recording`]), for any number of replays of it:
//! the scan of its trace, its segments and settings, which device's trace is replayed, and
//! whether there is anything to replay at all.

use std::path::Path;

use super::engine::PoolRoutes;
use super::lessons::{LearnedMemPools, MemPoolLessons};
use super::report::DeviceTrace;
use super::scan::Scan;
use super::{ConfSource, ReplayError, ReplayOptions};
use crate::alloc::format::format_size;
use crate::alloc::{AllocConf, MemPoolId};
use crate::snapshot::model::{Action, Segment};
use crate::snapshot::pickle::Remainder;

/// What the first pass over a file found.
#[derive(Debug, Clone)]
pub struct Recording {
    /// The trace as the first pass saw it.
    pub scan: Scan,
    /// The file's segments and settings.
    pub remainder: Remainder,
    /// Which device's trace is replayed (its position in `device_traces`).
    pub device_index: usize,
    /// The segments a self-replay found to be `MemPool`s', by the index of the event that
    /// made each, once a replay under another config asked (`super::learned_mem_pools`): by
    /// the memory fraction that self-replay ran under (the bits of a fraction the file does
    /// not record, given with the recorded config, and the device capacity it is a fraction
    /// of; `None`: the recorded config as it is).
    pub(super) learned_mem_pools: std::cell::RefCell<Vec<LearnedMemPools>>,
    /// Whether the first pass over the file (`super::replay_reading`) inferred a `MemPool`:
    /// a replay under the recorded config then learns them too.
    pub(super) infers_mem_pools: std::cell::Cell<bool>,
}

impl Recording {
    /// The recording of the file at `path` (for messages) from its scan and the rest of it;
    /// refuses a file there is nothing to replay in (no history recorded, or one recorded
    /// without allocations or frees) and a `wanted` device (`--device-index`) it has no trace
    /// for.
    pub fn new(
        path: &Path,
        scan: Scan,
        remainder: Remainder,
        wanted: Option<u32>,
    ) -> Result<Recording, ReplayError> {
        if let Some(wanted) = wanted {
            if wanted as usize >= remainder.traces.len() {
                return Err(ReplayError::NoSuchDevice(format!(
                    "the file has no trace for device {wanted}: {}",
                    describe_devices(&devices(&remainder))
                )));
            }
        }
        let device_index = match (wanted, scan.device()) {
            (Some(wanted), _) => wanted as usize,
            (None, Some(device)) => device as usize,
            (None, None) => 0,
        };
        let recording = Recording {
            scan,
            remainder,
            device_index,
            learned_mem_pools: std::cell::RefCell::new(Vec::new()),
            infers_mem_pools: std::cell::Cell::new(false),
        };
        recording.check_replayable(path)?;
        Ok(recording)
    }

    /// The file's end-state segments of the replayed device.
    pub fn segments(&self) -> Vec<Segment> {
        self.remainder
            .segments
            .iter()
            .filter(|segment| segment.device == self.device_index as i64)
            .map(|segment| segment.to_model())
            .collect()
    }

    /// Each device's trace in the file and its entries.
    pub fn devices(&self) -> Vec<DeviceTrace> {
        devices(&self.remainder)
    }

    /// Where the replayed device's pools lie: the file's end-state segments, each from the
    /// `segment_alloc` that made it, or for an expandable segment the `segment_map` that
    /// began its mapped range (from the trace's start when the trace does not show it).
    pub fn routes(&self) -> PoolRoutes {
        let mut routes = PoolRoutes::default();
        for segment in &self.remainder.segments {
            let (first, second) = segment.pool;
            let pool = MemPoolId::new(first as u64, second as u64);
            if segment.device != self.device_index as i64 {
                continue;
            }
            let made = self
                .scan
                .made_at(segment.address)
                .or_else(|| self.scan.mapped_since(segment.address))
                .unwrap_or(0);
            routes.add(segment.address, segment.total_size, pool, made);
        }
        routes
    }

    /// Refuses a recording a replay could only get wrong.
    fn check_replayable(&self, path: &Path) -> Result<(), ReplayError> {
        let scan = &self.scan;
        if scan.events == 0 {
            return Err(self.no_history(path));
        }
        let allocs = scan.count(Action::Alloc);
        let frees = scan.count(Action::FreeRequested) + scan.count(Action::FreeCompleted);
        if allocs == 0 && scan.unmatched_frees > 0 {
            return Err(ReplayError::Unreplayable(format!(
                "the trace has {frees} frees but no alloc event, and frees {} blocks twice: it was recorded with skip_actions leaving out 'alloc', so the allocations cannot be replayed",
                scan.unmatched_frees
            )));
        }
        let live_at_end: u64 = self
            .segments()
            .iter()
            .flat_map(|segment| &segment.blocks)
            .filter(|block| block.state.starts_with("active"))
            .count() as u64;
        // A file without end-state segments says nothing of what was live (a crafted or
        // partial file): its trace replays as it is.
        let has_end_state = !self.segments().is_empty();
        if frees == 0 && (scan.double_allocs > 0 || (has_end_state && allocs > live_at_end)) {
            return Err(ReplayError::Unreplayable(format!(
                "the trace has {allocs} allocations but no free, while only {live_at_end} blocks are live at the end: it was recorded with skip_actions leaving out 'free_requested' and 'free_completed', so what was freed cannot be replayed"
            )));
        }
        Ok(())
    }

    /// The refusal of a file whose replayed trace holds no allocator event: it names why, what
    /// the file holds instead, and the fix.
    fn no_history(&self, path: &Path) -> ReplayError {
        let remainder = &self.remainder;
        let why = if !remainder.has_device_traces {
            "the snapshot holds no trace events (the file records no trace, no 'device_traces': a snapshot taken without history, or PyTorch 2.0's bare list of segments)".to_string()
        } else if remainder.traces.iter().all(|&(_, entries)| entries == 0) {
            format!(
                "the snapshot holds no trace events (device {}'s trace holds no allocator event; {})",
                self.device_index,
                describe_devices(&self.devices())
            )
        } else {
            format!(
                "device {}'s trace holds no allocator event ({})",
                self.device_index,
                describe_devices(&self.devices())
            )
        };
        let segments = self.segments();
        let reserved: u64 = segments.iter().map(|s| s.total_size.max(0) as u64).sum();
        let end_state = if segments.is_empty() {
            "and no segments".to_string()
        } else {
            format!(
                "only the end state: {} segments, {} reserved",
                segments.len(),
                format_size(reserved)
            )
        };
        ReplayError::NoHistory(format!(
            "{why}, {end_state}: the memory history was not recorded, so there is nothing to replay. Record the history before the job allocates, then dump the snapshot: torch.cuda.memory._record_memory_history() at the start (max_entries=1000000 keeps a long job's whole trace), torch.cuda.memory._dump_snapshot(\"{}\") at the end",
            path.file_name()
                .map_or_else(|| "snapshot.pickle".into(), |name| name.to_string_lossy())
        ))
    }

    /// The config the recorded run used: the file's settings, else PyTorch's defaults.
    fn recorded_conf(&self) -> Result<(AllocConf, ConfSource), ReplayError> {
        match &self.remainder.settings {
            Some(settings) => {
                let conf = settings
                    .to_conf()
                    .map_err(|error| ReplayError::RecordedConfig(error.to_string()))?;
                Ok((conf, ConfSource::Recorded))
            }
            None => Ok((AllocConf::default(), ConfSource::DefaultNoSettings)),
        }
    }

    /// The recorded run's config (PyTorch's defaults for a file that records none), `None`
    /// when the recorded one cannot be read.
    pub fn recorded_alloc_conf(&self) -> Option<AllocConf> {
        self.recorded_conf().ok().map(|(conf, _)| conf)
    }

    /// The config a replay runs under: the one given, else the recorded one; and where it
    /// came from.
    pub fn choose_conf(
        &self,
        options: &ReplayOptions,
    ) -> Result<(AllocConf, ConfSource), ReplayError> {
        match &options.conf {
            Some(conf) => Ok((conf.clone(), ConfSource::Given)),
            None => self.recorded_conf(),
        }
    }

    /// What replays of this recording learnt about its `MemPool`s so far.
    pub(super) fn mem_pool_lessons(&self) -> MemPoolLessons {
        MemPoolLessons::new(
            self.learned_mem_pools.borrow().clone(),
            self.infers_mem_pools.get(),
        )
    }

    /// Takes what an earlier reading of the same file learnt ([`Recording::mem_pool_lessons`]).
    pub(super) fn take_mem_pool_lessons(&self, lessons: &MemPoolLessons) {
        self.learned_mem_pools.replace(lessons.learned().to_vec());
        self.infers_mem_pools.set(lessons.infers());
    }

    /// Whether a replay under `conf` takes the `MemPool`s self-replays learn
    /// (`super::learned_mem_pools`): under another config than the recorded one, whose state
    /// cannot tell them; under the recorded one where the first pass inferred some.
    pub fn wants_learned_mem_pools(&self, conf: &AllocConf) -> bool {
        !self.is_recorded_conf(conf) || self.infers_mem_pools.get()
    }

    /// Whether `conf` makes the allocator decide as the recorded run's config did.
    pub fn is_recorded_conf(&self, conf: &AllocConf) -> bool {
        self.recorded_conf()
            .is_ok_and(|(recorded, _)| same_behaviour(conf, &recorded))
    }

    /// Whether `conf` is the recorded run's config but for a memory fraction, which a file
    /// records only when the job set it in `PYTORCH_CUDA_ALLOC_CONF` (most set it with
    /// `torch.cuda.set_per_process_memory_fraction`): a replay under it describes the recorded
    /// run (a fraction given is taken as the one it ran under), not a what-if. The fractions
    /// on both sides are left out: a file that records its fraction is its own config's
    /// recording too.
    pub fn is_recorded_conf_but_fraction(&self, conf: &AllocConf) -> bool {
        let Ok((mut recorded, _)) = self.recorded_conf() else {
            return false;
        };
        let mut conf = conf.clone();
        conf.per_process_memory_fraction = None;
        recorded.per_process_memory_fraction = None;
        same_behaviour(&conf, &recorded)
    }

    /// The memory fraction the recorded config names (`per_process_memory_fraction` in the
    /// recorded `PYTORCH_CUDA_ALLOC_CONF`, which PyTorch 2.11 applies at start), if any.
    pub fn recorded_fraction(&self) -> Option<f64> {
        self.recorded_conf()
            .ok()
            .and_then(|(conf, _)| conf.per_process_memory_fraction)
    }

    /// Whether the recorded config collects garbage (`garbage_collection_threshold`), which
    /// releases cached segments before a malloc runs out of room (under a fraction the file
    /// does not show).
    pub fn recorded_collects_garbage(&self) -> bool {
        self.recorded_conf()
            .is_ok_and(|(conf, _)| conf.garbage_collection_threshold > 0.0)
    }

    /// Whether the recorded run used expandable segments.
    pub fn recorded_expandable(&self) -> bool {
        self.remainder
            .settings
            .as_ref()
            .is_some_and(|settings| settings.expandable_segments)
    }

    /// The recorded run's `large_segment_size` (PyTorch's default when the file records no
    /// usable config).
    pub fn recorded_large_segment_size(&self) -> u64 {
        self.recorded_conf()
            .map_or(crate::alloc::LARGE_BUFFER, |(conf, _)| {
                conf.large_segment_size
            })
    }

    /// Whether frees are recorded only as `free_requested` (`skip_actions` left out
    /// `free_completed`), so a replay frees there.
    /// A trace of frees deferred by `record_stream` that never completed has no
    /// `free_completed` either; it is told apart by the addresses: `skip_actions` shows an
    /// address allocated again after its free was requested.
    pub fn frees_on_request(&self) -> bool {
        self.scan.count(Action::FreeCompleted) == 0
            && self.scan.count(Action::FreeRequested) > 0
            && self.scan.allocs_after_request > 0
    }
}

/// Whether two configs make the allocator decide alike (their source text aside).
pub fn same_behaviour(a: &AllocConf, b: &AllocConf) -> bool {
    let mut a = a.clone();
    a.source.clone_from(&b.source);
    a == *b
}

/// Each device's trace in the file and its entries.
fn devices(remainder: &Remainder) -> Vec<DeviceTrace> {
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
