//! Where in the user's code a replayed OOM happened: the Python frames PyTorch recorded with
//! the failing request's event, and with the `alloc` events of the largest allocations live
//! then, looked up in the file once the replay has named those events.
//!
//! The replay streams the file without its frames (shared frame objects are not kept, so a
//! trace of any length reads in bounded memory). The few events an answer names are then
//! looked up in the file read whole, shared objects resolved: a file larger than
//! [`LOOKUP_MAX_BYTES`] is not read whole, and the report says its frames were not looked up
//! (as it does when the file cannot be read whole).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Serialize;

use super::answer::user_frames_first;
use super::engine::FirstOom;
use crate::snapshot::model::Frame;
use crate::snapshot::pickle::{self, value::Value};

/// The largest file whose frames are looked up. Reading a snapshot whole, its shared frame
/// objects resolved into every event, takes about a hundred times the file's size in memory
/// (measured: 62 MiB more for the 0.55 MB H200 transformer recording); 16 MiB holds some
/// 150,000 events with their Python stacks, a `max_entries=100000` history.
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
    let top = match pickle::load(path) {
        Ok(top) => top,
        Err(error) => return Lookup::Unreadable(error.to_string()),
    };
    let found = look_up(&top, &wanted);
    let frames_of = |number: u64| {
        found
            .get(&number)
            .map_or_else(Vec::new, |frames| user_frames_first(frames))
    };
    for oom in first_oom.iter_mut().chain(ooms.iter_mut()) {
        oom.frames = frames_of(oom.index);
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

/// The frames of the trace events numbered `wanted` ([`super::event_number`]: position among
/// every device's trace entries in file order, from 1) in the snapshot `top`. Events without
/// frames, and numbers past the end, are left out.
pub fn look_up(top: &Value, wanted: &BTreeSet<u64>) -> BTreeMap<u64, Vec<Frame>> {
    let mut found = BTreeMap::new();
    let Some(Value::List(traces)) = top.get("device_traces") else {
        return found;
    };
    let mut number = 0_u64;
    for trace in &traces.items {
        let Value::List(trace) = trace else {
            continue;
        };
        for event in &trace.items {
            number += 1;
            if !wanted.contains(&number) {
                continue;
            }
            let frames = event.get("frames").map(frames_of).unwrap_or_default();
            if !frames.is_empty() {
                found.insert(number, frames);
            }
        }
    }
    found
}

/// A pickled `frames` list as frames (entries that are not `{name, filename, line}` dicts are
/// skipped: a snapshot is untrusted input).
fn frames_of(value: &Value) -> Vec<Frame> {
    let Value::List(list) = value else {
        return Vec::new();
    };
    list.items
        .iter()
        .filter_map(|frame| {
            Some(Frame {
                name: frame.get("name")?.as_str()?.to_string(),
                filename: frame.get("filename")?.as_str()?.to_string(),
                line: frame.get("line").and_then(Value::as_int).unwrap_or(0),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::pickle::value::List;

    fn text(value: &str) -> Value {
        Value::Str(value.into())
    }

    fn dict(entries: Vec<(&str, Value)>) -> Value {
        Value::Dict(entries.into_iter().map(|(k, v)| (text(k), v)).collect())
    }

    fn list(id: u32, items: Vec<Value>) -> Value {
        Value::List(List {
            id,
            items,
            streamed: 0,
        })
    }

    fn event(frames: Vec<Value>) -> Value {
        dict(vec![("action", text("alloc")), ("frames", list(0, frames))])
    }

    fn frame(filename: &str, line: i64) -> Value {
        dict(vec![
            ("name", text("step")),
            ("filename", text(filename)),
            ("line", Value::Int(line)),
        ])
    }

    #[test]
    fn events_are_found_by_their_number_across_every_trace() {
        let top = dict(vec![(
            "device_traces",
            list(
                1,
                vec![
                    list(2, vec![event(vec![frame("a.py", 1)]), event(Vec::new())]),
                    list(
                        3,
                        vec![
                            event(vec![frame("b.py", 7), dict(vec![("name", Value::Int(3))])]),
                            event(vec![frame("c.py", 9)]),
                        ],
                    ),
                ],
            ),
        )]);
        let found = look_up(&top, &[1, 2, 3, 9].into_iter().collect());
        let lines: Vec<(u64, &str, i64)> = found
            .iter()
            .flat_map(|(n, frames)| {
                frames
                    .iter()
                    .map(move |f| (*n, f.filename.as_str(), f.line))
            })
            .collect();
        // Event 2 has no frames, event 4 is not wanted, 9 does not exist; the malformed
        // frame of event 3 is skipped.
        assert_eq!(lines, [(1, "a.py", 1), (3, "b.py", 7)]);
        assert!(look_up(&text("not a snapshot"), &[1].into_iter().collect()).is_empty());
    }
}
