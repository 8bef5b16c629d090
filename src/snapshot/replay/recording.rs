//! What the first pass over a file found ([`Recording`]), for any number of replays of it:
//! the scan of its trace, its segments and settings, which device's trace is replayed, and
//! whether there is anything to replay at all.

use std::path::Path;

use super::scan::Scan;
use super::{ConfSource, ReplayError, ReplayOptions};
use crate::alloc::format::format_size;
use crate::alloc::AllocConf;
use crate::snapshot::model::{Action, Segment};
use crate::snapshot::pickle::{Remainder, SnapshotError};

/// What the first pass over a file found.
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
    /// The recording of the file at `path` (for messages) from its scan and the rest of it;
    /// refuses a file there is nothing to replay in (no history recorded, or one recorded
    /// without allocations or frees).
    pub fn new(path: &Path, scan: Scan, remainder: Remainder) -> Result<Recording, ReplayError> {
        let device_index = match scan.list() {
            Some(list) => remainder
                .traces
                .iter()
                .position(|(id, _)| *id == list)
                .ok_or_else(|| {
                    SnapshotError::NotASnapshot(
                        "its trace events are not in 'device_traces'".into(),
                    )
                })?,
            None => 0,
        };
        let recording = Recording {
            scan,
            remainder,
            device_index,
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
            .cloned()
            .collect()
    }

    /// Refuses a recording a replay could only get wrong.
    fn check_replayable(&self, path: &Path) -> Result<(), ReplayError> {
        let scan = &self.scan;
        if scan.events == 0 {
            let segments = &self.remainder.segments;
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
        let live_at_end: u64 = self
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

    /// Whether `conf` makes the allocator decide as the recorded run's config did.
    pub fn is_recorded_conf(&self, conf: &AllocConf) -> bool {
        self.recorded_conf()
            .is_ok_and(|(recorded, _)| same_behaviour(conf, &recorded))
    }

    /// Whether the recorded run used expandable segments.
    pub fn recorded_expandable(&self) -> bool {
        self.remainder
            .settings
            .as_ref()
            .is_some_and(|settings| settings.expandable_segments)
    }

    /// Whether frees are recorded only as `free_requested` (`skip_actions` left out
    /// `free_completed`), so a replay frees there.
    pub fn frees_on_request(&self) -> bool {
        self.scan.count(Action::FreeCompleted) == 0 && self.scan.count(Action::FreeRequested) > 0
    }
}

/// Whether two configs make the allocator decide alike (their source text aside).
pub fn same_behaviour(a: &AllocConf, b: &AllocConf) -> bool {
    let mut a = a.clone();
    a.source.clone_from(&b.source);
    a == *b
}
