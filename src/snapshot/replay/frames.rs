//! Where in the user's code a replayed OOM happened: the Python frames PyTorch recorded with
//! the failing request's event, and with the `alloc` events of the largest allocations live
//! then, looked up in the file once the replay has named those events.
//!
//! The replay does not keep the frames of the events it replays (most are never asked for).
//! The few events an answer names are then looked up by reading the file once more, each
//! event's stack resolved through the reader's interned frames ([`pickle::Stacks`]): memory
//! stays the reader's bound. A file larger than [`LOOKUP_MAX_BYTES`] is not read again, and the
//! report says its frames were not looked up (as it does when the second read fails).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Serialize;

use super::answer::user_frames_first;
use super::engine::FirstOom;
use crate::snapshot::model::Frame;
use crate::snapshot::pickle::{self, SnapshotError, StackId, Trace};

/// The largest file whose frames are looked up: the lookup reads the file a second time, which
/// for a long history costs as long as the replay's own read; 16 MiB holds some 150,000 events
/// with their Python stacks, a `max_entries=100000` history.
pub const LOOKUP_MAX_BYTES: u64 = 16 << 20;

/// Whether a replay's answers carry the recorded frames.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Lookup {
    /// The replay names no event to look up (no OOM), or the frames were not asked for.
    #[default]
    NotNeeded,
    /// The events the answers name were looked up (an event may still have no frames: the
    /// history was recorded without stacks, or the event had none).
    Done,
    /// The file (of this many bytes) is larger than [`LOOKUP_MAX_BYTES`]: not looked up.
    TooLarge(u64),
    /// The file could not be read whole (the reason): the answers stand without frames.
    Unreadable(String),
}

/// Puts the recorded frames on the OOM answers (`first_oom` and `ooms`) and on their largest
/// live allocations, looked up in the file at `path` they were replayed from, and says how
/// that went. The answers stand whatever happens here.
pub fn attach(path: &Path, first_oom: &mut Option<FirstOom>, ooms: &mut [FirstOom]) -> Lookup {
    let wanted = named_events(first_oom.iter().chain(ooms.iter()));
    if wanted.is_empty() {
        return Lookup::NotNeeded;
    }
    let bytes = match std::fs::metadata(path) {
        Ok(metadata) => metadata.len(),
        Err(error) => return Lookup::Unreadable(error.to_string()),
    };
    if bytes > LOOKUP_MAX_BYTES {
        return Lookup::TooLarge(bytes);
    }
    let failing: BTreeSet<u64> = first_oom
        .iter()
        .chain(ooms.iter())
        .map(|oom| oom.index)
        .collect();
    let found = match look_up(path, &wanted, &failing) {
        Ok(found) => found,
        Err(error) => return Lookup::Unreadable(error.to_string()),
    };
    let frames_of = |number: u64| {
        found
            .frames
            .get(&number)
            .map_or_else(Vec::new, |frames| user_frames_first(frames))
    };
    for oom in first_oom.iter_mut().chain(ooms.iter_mut()) {
        oom.frames = frames_of(oom.index);
        oom.frames_from = None;
        if oom.frames.is_empty() {
            if let Some((number, frames)) = found.nearest.get(&oom.index) {
                oom.frames = user_frames_first(frames);
                oom.frames_from = Some(*number);
            }
        }
        for live in &mut oom.largest_live {
            if let Some(index) = live.index {
                live.frames = frames_of(index);
            }
        }
    }
    Lookup::Done
}

/// The numbers of the events `ooms` name: each OOM's, and the `alloc` of each largest live
/// allocation.
fn named_events<'a>(ooms: impl Iterator<Item = &'a FirstOom>) -> BTreeSet<u64> {
    ooms.flat_map(|oom| {
        std::iter::once(oom.index).chain(oom.largest_live.iter().filter_map(|live| live.index))
    })
    .collect()
}

/// What [`look_up`] found in the file.
#[derive(Debug, Default)]
pub struct Found {
    /// The frames of each wanted event that has a stack.
    pub frames: BTreeMap<u64, Vec<Frame>>,
    /// For each failing event without a stack: the nearest earlier event of the same trace
    /// that has one, with its frames.
    pub nearest: BTreeMap<u64, (u64, Vec<Frame>)>,
}

/// The frames of the trace events numbered `wanted` ([`super::event_number`]: position among
/// every device's trace entries in file order, from 1) in the snapshot at `path`, and for the
/// `failing` ones that have no stack the nearest earlier stack of their trace. Events without
/// frames, and numbers past the end, are left out.
pub fn look_up(
    path: &Path,
    wanted: &BTreeSet<u64>,
    failing: &BTreeSet<u64>,
) -> Result<Found, SnapshotError> {
    let mut found = Found::default();
    // The last event with a stack: its number, trace and stack (ids stay valid to the end).
    let mut last_stack: Option<(u64, Trace, StackId)> = None;
    pickle::stream_file(path, |emitted| {
        let number = super::event_number(&emitted);
        let stack = emitted.entry.stack();
        if wanted.contains(&number) || failing.contains(&number) {
            let frames = emitted.stacks.to_model(stack);
            if !frames.is_empty() {
                found.frames.insert(number, frames);
            } else if failing.contains(&number) {
                if let Some((earlier, trace, id)) = last_stack {
                    if trace == emitted.trace {
                        found
                            .nearest
                            .insert(number, (earlier, emitted.stacks.to_model(id)));
                    }
                }
            }
        }
        if stack != StackId::EMPTY {
            last_stack = Some((number, emitted.trace, stack));
        }
        Ok(())
    })?;
    Ok(found)
}
