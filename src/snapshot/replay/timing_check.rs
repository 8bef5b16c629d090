//! Whether a replay's answer depends on when the GPU finishes a side stream's work.
//!
//! A free deferred by `record_stream` completes once the work queued on the streams that used
//! the block is done: at a later malloc that finds it done (`process_events`), or on the OOM
//! path's `synchronize_and_free_events`. The trace records where one process's GPU got there;
//! another process under another config has its own timing, and near the memory limit that
//! timing can decide whether a request finds a block. Measured in tests/gpu/whatif: the
//! prefetch job under `garbage_collection_threshold:0.6` and a tight fraction fit in five
//! runs and ran out of memory in one; gpumem's replay of the base run with that run's
//! completion points (`retime.py --as-run`) ran out at the same allocation, with the base
//! run's it fit.
//!
//! So a what-if replay (a config that does not decide as the recorded one did) of a trace
//! with deferred frees runs once more with every such free completed at its request, as on a
//! GPU that finished every side stream's work at once ([`DeferredFrees::AtOnce`]); the
//! verdict says the job is borderline when the two answers disagree. A self-replay keeps the
//! recorded completions: they are that run's own.

use super::addresses::{AddressMap, AddressSet};
use super::report::ReplayReport;
use super::scan::Scan;
use super::{DeferredFrees, ReplayOptions};
use crate::snapshot::model::Action;
use crate::snapshot::pickle::{Entry, RawEvent};

/// Whether `report` calls for the check: a replay under a config that does not decide as the
/// recorded one, of a trace that deferred frees, replayed with the recorded completions.
pub fn wanted(report: &ReplayReport, options: &ReplayOptions) -> bool {
    report.counts.deferred_frees > 0
        && !report.recorded_conf
        && options.deferred_frees == DeferredFrees::AsRecorded
}

/// The options of the second reading: `options` with every deferred free completed at its
/// request.
pub fn at_once(options: &ReplayOptions) -> ReplayOptions {
    ReplayOptions {
        deferred_frees: DeferredFrees::AtOnce,
        ..options.clone()
    }
}

/// What a [`DeferredFrees::AtOnce`] replay does with one event of the trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Rewrite {
    /// Replay it as it is.
    Keep,
    /// Replay it, then this completion of the same block.
    ThenComplete(RawEvent),
    /// Skip it: the block's completion was replayed at its request.
    Drop,
}

/// The rewriting of a trace's completions for a [`DeferredFrees::AtOnce`] replay.
#[derive(Debug, Clone, Default)]
pub(super) struct AtOnce {
    /// The blocks whose free is still pending at the trace's end, by the event that requested
    /// it: those stay pending.
    pending_at_end: AddressMap<u64>,
    /// Blocks completed at their request whose recorded completion is still to come.
    completed_early: AddressSet,
}

impl AtOnce {
    /// The rewriting for the trace `scan` read.
    pub(super) fn new(scan: &Scan) -> AtOnce {
        AtOnce {
            pending_at_end: scan.pending_at_end().collect(),
            completed_early: AddressSet::default(),
        }
    }

    /// What to do with `entry`, the event numbered `index`.
    pub(super) fn rewrite(&mut self, index: u64, entry: &Entry) -> Rewrite {
        let Entry::Memory(event) = entry else {
            return Rewrite::Keep;
        };
        let addr = event.addr as u64;
        match event.action {
            Action::FreeRequested if self.pending_at_end.get(&addr) != Some(&index) => {
                self.completed_early.insert(addr);
                Rewrite::ThenComplete(RawEvent {
                    action: Action::FreeCompleted,
                    ..*event
                })
            }
            Action::FreeCompleted if self.completed_early.remove(&addr) => Rewrite::Drop,
            _ => Rewrite::Keep,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(action: Action, addr: i64) -> Entry {
        let mut event = RawEvent::new(action);
        event.addr = addr;
        event.size = 4096;
        Entry::Memory(event)
    }

    #[test]
    fn a_deferred_free_completes_at_its_request_and_one_pending_at_the_end_stays_pending() {
        // Block 1's free completes after an allocation; block 2's never does.
        let trace = [
            entry(Action::Alloc, 1),
            entry(Action::Alloc, 2),
            entry(Action::FreeRequested, 1),
            entry(Action::FreeRequested, 2),
            entry(Action::Alloc, 3),
            entry(Action::FreeCompleted, 1),
        ];
        let mut scan = Scan::default();
        let stacks = crate::snapshot::pickle::Stacks::default();
        for (index, entry) in trace.iter().enumerate() {
            scan.see(&crate::snapshot::pickle::Emitted {
                list: 1,
                trace: crate::snapshot::pickle::Trace::Device(0),
                index: index as u64,
                offset: 0,
                entry: *entry,
                stacks: &stacks,
            });
        }
        let mut at_once = AtOnce::new(&scan);
        let rewrites: Vec<Rewrite> = trace
            .iter()
            .enumerate()
            // Events are numbered from 1 (`event_number`), as the scan numbers them.
            .map(|(index, entry)| at_once.rewrite(index as u64 + 1, entry))
            .collect();
        let Entry::Memory(requested) = trace[2] else {
            unreachable!("a memory event")
        };
        let completed = RawEvent {
            action: Action::FreeCompleted,
            ..requested
        };
        assert_eq!(
            rewrites,
            [
                Rewrite::Keep,
                Rewrite::Keep,
                Rewrite::ThenComplete(completed),
                Rewrite::Keep,
                Rewrite::Keep,
                Rewrite::Drop,
            ]
        );
    }
}
