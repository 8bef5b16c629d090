//! Memory history for scripts (`torch.cuda.memory._record_memory_history`): the allocator's
//! trace, with each event's frame — the script file, line and binding that caused it.
//!
//! The allocator stamps every trace entry with an opaque context id. Bindings that allocate
//! or release call [`stamp`] with their call site; it interns `(file, line, binding)` as an id
//! (a thread-local table: scripts run on one thread) and sets it as the allocator's context.
//! In a run that tracks call sites ([`track_call_sites`]) a binding called inside a stdlib
//! helper also gets the script line that called the helper, so pictures name the user's line.
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

/// A binding's call site (file, line, binding) and the script line that called the stdlib
/// helper it ran in, if any.
type SiteKey = (String, u32, String, Option<(String, i64)>);

/// Interned call sites: id `n` (from 1) is `stacks[n - 1]`; 0 means no frame.
#[derive(Default)]
struct Sites {
    stacks: Vec<Vec<Frame>>,
    ids: HashMap<SiteKey, u32>,
}

thread_local! {
    static SITES: RefCell<Sites> = RefCell::new(Sites::default());
    /// The name of the script being run (the file of a call made at its top level).
    static ROOT: RefCell<String> = RefCell::new("<script>".to_string());
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
    let caller = if is_stdlib(file) {
        script_caller(context)
    } else {
        None
    };
    let id = SITES.with(|sites| {
        let mut sites = sites.borrow_mut();
        let key = (
            file.to_string(),
            line,
            name.to_string(),
            caller
                .as_ref()
                .map(|frame| (frame.filename.clone(), frame.line)),
        );
        if let Some(&id) = sites.ids.get(&key) {
            return id;
        }
        let mut stack = vec![Frame {
            name: name.to_string(),
            filename: file.to_string(),
            line: i64::from(line),
        }];
        stack.extend(caller);
        sites.stacks.push(stack);
        let id = sites.stacks.len() as u32;
        sites.ids.insert(key, id);
        id
    });
    runtime.with_allocator(|allocator| allocator.set_trace_context(id));
}

/// Whether `file` is one of the embedded stdlib modules (`stdlib/mem.rhai`).
pub fn is_stdlib(file: &str) -> bool {
    file.starts_with("stdlib/")
}

/// For a binding called inside a stdlib helper: the script's own line that called the
/// helper, as a frame named after the helper, walked out of the call stack Rhai's debugger
/// keeps ([`track_call_sites`]); None when it keeps none.
fn script_caller(context: &NativeCallContext) -> Option<Frame> {
    let frames = context.debugger()?.call_stack();
    // A frame's position is in its caller's file: the previous frame's source (a script
    // function's source is its own file), or the script itself for the first frame.
    let mut first = frames.len();
    while first > 0 && frames[first - 1].source.as_deref().is_some_and(is_stdlib) {
        first -= 1;
    }
    let entry = frames.get(first)?;
    let filename = match first.checked_sub(1) {
        Some(outer) => frames[outer]
            .source
            .as_deref()
            .unwrap_or("<script>")
            .to_string(),
        None => ROOT.with(|root| root.borrow().clone()),
    };
    Some(Frame {
        name: entry.fn_name.to_string(),
        filename,
        line: i64::from(entry.pos.line().unwrap_or(0) as u32),
    })
}

/// The stdlib helper a stack went through (`mem::fill_until_oom`), if its first frame is in
/// the stdlib and a script line follows.
pub fn helper(stack: &[Frame]) -> Option<String> {
    let [inner, caller, ..] = stack else {
        return None;
    };
    let module = inner
        .filename
        .strip_prefix("stdlib/")?
        .strip_suffix(".rhai")?;
    Some(format!("{module}::{}", caller.name))
}

/// Makes `engine` keep Rhai's call stack (a debugger that never stops) so that [`stamp`]
/// names the script's own line for a binding called inside a stdlib helper. Keeping it costs a
/// copy of every call's arguments, so only recorded runs (`gpumem run --timeline/--report`)
/// ask for it.
pub fn track_call_sites(engine: &mut rhai::Engine) {
    #[allow(deprecated)] // Rhai marks its debugging interface volatile, not deprecated.
    engine.register_debugger(
        |_, debugger| debugger,
        |_, event, _, source, _| {
            // Each run starts with its script's name: the file a first frame is called from.
            if let (rhai::debugger::DebuggerEvent::Start, Some(source)) = (event, source) {
                if !is_stdlib(source) {
                    ROOT.with(|root| *root.borrow_mut() = source.to_string());
                }
            }
            Ok(rhai::debugger::DebuggerCommand::Continue)
        },
    );
}

/// The frames of context `id`, innermost first: the binding's call site, then (in a run
/// that tracks call sites) the script line that called the stdlib helper it ran in. Empty
/// for 0 or an unknown id.
pub fn frames(id: u32) -> Vec<Frame> {
    if id == 0 {
        return Vec::new();
    }
    SITES.with(|sites| {
        sites
            .borrow()
            .stacks
            .get(id as usize - 1)
            .cloned()
            .unwrap_or_default()
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
