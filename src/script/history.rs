//! Memory history for scripts (`torch.cuda.memory._record_memory_history`): the allocator's
//! trace, with each event's frame — the script file, line and binding that caused it.
//!
//! The allocator stamps every trace entry with an opaque context id. Bindings that allocate
//! or release call [`stamp`] with their call site; it interns `(file, line, binding)` as an id
//! (a thread-local table: scripts run on one thread) and sets it as the allocator's context.
//! While recording is off, [`stamp`] costs one borrow and one branch.

use std::cell::RefCell;
use std::collections::HashMap;

use rhai::NativeCallContext;

use crate::alloc::{EventKind, TraceEntry};
use crate::snapshot::model::{int, Frame, TraceEvent};
use crate::tensor::Runtime;

/// How many entries `record_memory_history(true)` keeps (PyTorch keeps every entry by
/// default; a script loop can make millions).
pub const DEFAULT_MAX_ENTRIES: usize = 1_000_000;

/// Interned call sites: id `n` (from 1) is `frames[n - 1]`; 0 means no frame.
#[derive(Default)]
struct Sites {
    frames: Vec<Frame>,
    ids: HashMap<(String, u32, String), u32>,
}

thread_local! {
    static SITES: RefCell<Sites> = RefCell::new(Sites::default());
}

/// Makes the allocator stamp the events that follow with the call site of `context` (only
/// while something listens to its event stream: the history, or a timeline being recorded by
/// `gpumem run --timeline/--report`).
pub fn stamp(context: &NativeCallContext, runtime: &Runtime) {
    if !runtime.allocator().is_listened_to() {
        return;
    }
    let line = context.call_position().line().unwrap_or(0) as u32;
    let file = context.call_source().unwrap_or("<script>");
    let name = context.fn_name();
    let id = SITES.with(|sites| {
        let mut sites = sites.borrow_mut();
        let key = (file.to_string(), line, name.to_string());
        if let Some(&id) = sites.ids.get(&key) {
            return id;
        }
        sites.frames.push(Frame {
            name: name.to_string(),
            filename: file.to_string(),
            line: i64::from(line),
        });
        let id = sites.frames.len() as u32;
        sites.ids.insert(key, id);
        id
    });
    runtime.with_allocator(|allocator| allocator.set_trace_context(id));
}

/// The frames of context `id` (innermost first; empty for 0 or an unknown id).
pub fn frames(id: u32) -> Vec<Frame> {
    if id == 0 {
        return Vec::new();
    }
    SITES.with(|sites| {
        sites
            .borrow()
            .frames
            .get(id as usize - 1)
            .cloned()
            .into_iter()
            .collect()
    })
}

/// The recorded entries as PyTorch's trace events, oldest first.
pub fn events(entries: &[TraceEntry]) -> Vec<TraceEvent> {
    entries
        .iter()
        .filter_map(|entry| {
            Some(TraceEvent {
                // The history holds PyTorch's kinds only; the filter keeps that promise here too.
                action: Some(entry.action).filter(|action| action.is_pytorchs())?,
                addr: int(entry.addr),
                size: int(entry.size),
                stream: int(entry.stream),
                time_us: entry.time_us,
                compile_context: "N/A".into(),
                user_metadata: String::new(),
                frames: frames(entry.context),
            })
        })
        .collect()
}

/// For each block still allocated at the end of `entries`, the context of its `alloc`.
pub fn allocation_contexts(entries: &[TraceEntry]) -> HashMap<u64, u32> {
    let mut live = HashMap::new();
    for entry in entries {
        match entry.action {
            EventKind::Alloc => {
                live.insert(entry.addr, entry.context);
            }
            EventKind::FreeCompleted => {
                live.remove(&entry.addr);
            }
            _ => {}
        }
    }
    live
}
