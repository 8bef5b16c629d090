//! The frames of a snapshot, interned: each distinct frame (function, file, line) and each
//! distinct stack (a list of frames, innermost first) is kept once and named by a small id. A
//! trace event carries its stack's id ([`StackId`]), so frames reach the replay without a copy
//! per event, and memory grows with the file's distinct stacks, not with its events (PyTorch
//! itself shares one frames list among the events of one traceback).

use std::collections::HashMap;
use std::rc::Rc;

use crate::snapshot::model::Frame;

/// The name PyTorch gives `torch.cuda.empty_cache`'s frame: a `segment_free` under it is a
/// release by `empty_cache()`, not by a malloc's retry.
const EMPTY_CACHE: &str = "empty_cache";

/// The frames that show an allocation made inside a CUDA-graph capture (file, by the end of
/// its path, and function). PyTorch 2.11 records no trace entry for a capture's begin, nor for
/// the `empty_cache()` that `torch.cuda.graph.__enter__` makes before every capture when that
/// call releases nothing; only the Python frames of the allocations made in the capture show
/// it:
/// - `torch.cuda.graph.__enter__` itself (torch/cuda/graphs.py): an allocation made while
///   the capture begins (`capture_begin`, e.g. the generator's graph-safe state), after that
///   `empty_cache()`;
/// - cudagraph trees' `_record` (torch/_inductor/cudagraph_trees.py), the function whose
///   `with torch.cuda.graph(...)` body runs the model to record it: every capture a
///   `torch.compile(mode="reduce-overhead")` job makes. Its warm-up runs (`run_eager`) use the
///   same pool and stream but no capture, so they are not named.
///
/// Both names have been stable since PyTorch 2.0. The body of a capture a user writes
/// (`with torch.cuda.graph(g): model(x)`, `make_graphed_callables`) shows only the user's own
/// frames: see [`StackSigns::capture_stream`].
const CAPTURE_FRAMES: [(&str, &str); 3] = [
    (GRAPHS_PY, "__enter__"),
    (GRAPHS_PY, "capture_begin"),
    (CUDAGRAPH_TREES_PY, "_record"),
];

/// The cudagraph trees function that puts a private pool back to a checkpoint
/// (`torch._C._cuda_setCheckpointPoolState`) before it records a new graph after replaying
/// others: its allocations are the checkpoint's blocks, each at its own address and size.
const CHECKPOINT_RESTORE: &str = "apply_checkpoint_execution_state_in_allocator";

/// `torch.cuda.graph`'s file.
const GRAPHS_PY: &str = "torch/cuda/graphs.py";

/// cudagraph trees' file (`torch.compile(mode="reduce-overhead")`).
const CUDAGRAPH_TREES_PY: &str = "torch/_inductor/cudagraph_trees.py";

/// Whether `frame` is in `file` (a path ending so, with either separator).
fn in_file(frame: &SharedFrame, file: &str) -> bool {
    frame.filename.ends_with(file) || frame.filename.ends_with(&file.replace('/', "\\"))
}

/// Whether `frame` is one of [`CAPTURE_FRAMES`].
fn is_capture_frame(frame: &SharedFrame) -> bool {
    CAPTURE_FRAMES
        .iter()
        .any(|(file, name)| *name == &*frame.name && in_file(frame, file))
}

/// What a stack's frames tell of allocator calls the trace does not record.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StackSigns {
    /// One of its frames is `empty_cache`: a release under it is `torch.cuda.empty_cache()`'s.
    pub empty_cache: bool,
    /// One of its frames shows a CUDA-graph capture underway (`CAPTURE_FRAMES` in this module).
    pub graph_capture: bool,
    /// A capture begins in `torch.cuda.graph.__enter__` and no cudagraph trees frame is on
    /// the stack: a capture the user's code (or `make_graphed_callables`) makes, which runs on
    /// the stream `torch.cuda.graph` keeps for captures (`default_capture_stream`, one per
    /// process, used by nothing else) unless the caller gives one. cudagraph trees give their
    /// own stream, which their warm-ups use too.
    pub capture_stream: bool,
    /// A frame is cudagraph trees' checkpoint restore
    /// (`apply_checkpoint_execution_state_in_allocator`): an allocation under it takes the
    /// free block at its address, exactly its size.
    pub checkpoint_restore: bool,
}

/// One distinct frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FrameId(u32);

/// One distinct stack. [`StackId::EMPTY`] is the stack of an event recorded without frames
/// (`frames` empty or absent).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct StackId(u32);

impl StackId {
    /// No frames.
    pub const EMPTY: StackId = StackId(0);
}

/// One frame as the file records it. Strings are shared with the reader's memo.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SharedFrame {
    /// The function (`name`).
    pub name: Rc<str>,
    /// The source file (`filename`).
    pub filename: Rc<str>,
    /// The line (`line`; 0 for C++ frames without one).
    pub line: i64,
}

impl SharedFrame {
    /// The frame as the snapshot model's owned type.
    pub fn to_model(&self) -> Frame {
        Frame {
            name: self.name.to_string(),
            filename: self.filename.to_string(),
            line: self.line,
        }
    }

    /// Bytes it holds beside its entry (its strings, counted in full even when shared).
    fn bytes(&self) -> u64 {
        (self.name.len() + self.filename.len()) as u64
    }
}

/// Bytes a table entry costs beside its own data: the vector slot, the hash map's key and
/// value and control byte, with the spare capacity of both and the hash map's two tables while
/// it grows (3.4 buckets per entry at that moment), and the shared pointer's header.
const ENTRY_BYTES: u64 = 192;

/// Every distinct frame and stack read so far.
#[derive(Debug, Clone)]
pub struct Stacks {
    frames: Vec<SharedFrame>,
    frame_ids: HashMap<SharedFrame, FrameId>,
    /// By [`StackId`]; entry 0 is the empty stack.
    stacks: Vec<Rc<[FrameId]>>,
    stack_ids: HashMap<Rc<[FrameId]>, StackId>,
    /// Per stack: what its frames tell.
    signs: Vec<StackSigns>,
}

impl Default for Stacks {
    fn default() -> Self {
        let empty: Rc<[FrameId]> = Rc::from(Vec::new());
        Stacks {
            frames: Vec::new(),
            frame_ids: HashMap::new(),
            stacks: vec![Rc::clone(&empty)],
            stack_ids: HashMap::from([(empty, StackId::EMPTY)]),
            signs: vec![StackSigns::default()],
        }
    }
}

impl Stacks {
    /// The id of `frame`, and the bytes the table grew by (0 when it was known). `None` when
    /// the table is full (more than 2^32 frames: the reader's memory limit comes first).
    pub fn frame(&mut self, frame: SharedFrame) -> Option<(FrameId, u64)> {
        if let Some(&id) = self.frame_ids.get(&frame) {
            return Some((id, 0));
        }
        let id = FrameId(u32::try_from(self.frames.len()).ok()?);
        let bytes = ENTRY_BYTES + frame.bytes();
        self.frames.push(frame.clone());
        self.frame_ids.insert(frame, id);
        Some((id, bytes))
    }

    /// The id of the stack made of `frames` (innermost first), and the bytes the table grew
    /// by. `None` when the table is full.
    pub fn stack(&mut self, frames: &[FrameId]) -> Option<(StackId, u64)> {
        if let Some(&id) = self.stack_ids.get(frames) {
            return Some((id, 0));
        }
        let id = StackId(u32::try_from(self.stacks.len()).ok()?);
        let shared: Rc<[FrameId]> = Rc::from(frames);
        let mut signs = StackSigns::default();
        let mut in_tree = false;
        for frame in frames
            .iter()
            .filter_map(|frame| self.frames.get(frame.0 as usize))
        {
            signs.empty_cache |= &*frame.name == EMPTY_CACHE;
            signs.graph_capture |= is_capture_frame(frame);
            signs.capture_stream |= is_capture_frame(frame) && in_file(frame, GRAPHS_PY);
            in_tree |= in_file(frame, CUDAGRAPH_TREES_PY);
            signs.checkpoint_restore |=
                &*frame.name == CHECKPOINT_RESTORE && in_file(frame, CUDAGRAPH_TREES_PY);
        }
        signs.capture_stream &= !in_tree;
        self.stacks.push(Rc::clone(&shared));
        self.stack_ids.insert(shared, id);
        self.signs.push(signs);
        let bytes = ENTRY_BYTES + 2 * std::mem::size_of_val(frames) as u64;
        Some((id, bytes))
    }

    /// The frames of stack `id`, innermost first (none for an id this table did not give).
    pub fn frames(&self, id: StackId) -> impl Iterator<Item = &SharedFrame> + '_ {
        self.stacks
            .get(id.0 as usize)
            .into_iter()
            .flat_map(|frames| frames.iter())
            .filter_map(|frame| self.frames.get(frame.0 as usize))
    }

    /// The frames of stack `id` as the snapshot model's owned type.
    pub fn to_model(&self, id: StackId) -> Vec<Frame> {
        self.frames(id).map(SharedFrame::to_model).collect()
    }

    /// Whether one of the frames of stack `id` is `empty_cache`.
    pub fn mentions_empty_cache(&self, id: StackId) -> bool {
        self.signs(id).empty_cache
    }

    /// What the frames of stack `id` tell (nothing for an id this table did not give).
    pub fn signs(&self, id: StackId) -> StackSigns {
        self.signs.get(id.0 as usize).copied().unwrap_or_default()
    }

    /// Distinct stacks (the empty one included).
    pub fn len(&self) -> usize {
        self.stacks.len()
    }

    /// Whether only the empty stack is known.
    pub fn is_empty(&self) -> bool {
        self.stacks.len() == 1
    }

    /// Distinct frames.
    pub fn frame_count(&self) -> usize {
        self.frames.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(name: &str, line: i64) -> SharedFrame {
        SharedFrame {
            name: name.into(),
            filename: "train.py".into(),
            line,
        }
    }

    #[test]
    fn frames_and_stacks_are_kept_once() {
        let mut stacks = Stacks::default();
        let (step, grew) = stacks.frame(frame("step", 7)).expect("room");
        assert!(grew > 0);
        assert_eq!(stacks.frame(frame("step", 7)), Some((step, 0)));
        let (main, _) = stacks.frame(frame("<module>", 30)).expect("room");
        let (id, grew) = stacks.stack(&[step, main]).expect("room");
        assert!(grew > 0);
        assert_eq!(stacks.stack(&[step, main]), Some((id, 0)));
        assert_ne!(stacks.stack(&[main, step]).map(|(id, _)| id), Some(id));
        assert_eq!(stacks.stack(&[]), Some((StackId::EMPTY, 0)));
        let lines: Vec<i64> = stacks.frames(id).map(|frame| frame.line).collect();
        assert_eq!(lines, [7, 30]);
        assert_eq!(stacks.to_model(id)[1].name, "<module>");
        assert_eq!(stacks.frames(StackId(99)).count(), 0);
        assert_eq!((stacks.len(), stacks.frame_count()), (3, 2));
    }

    #[test]
    fn a_stack_through_empty_cache_is_marked() {
        let mut stacks = Stacks::default();
        let (release, _) = stacks.frame(frame("empty_cache", 1)).expect("room");
        let (other, _) = stacks.frame(frame("step", 2)).expect("room");
        let (with, _) = stacks.stack(&[release, other]).expect("room");
        let (without, _) = stacks.stack(&[other]).expect("room");
        assert!(stacks.mentions_empty_cache(with));
        assert!(!stacks.mentions_empty_cache(without));
        assert!(!stacks.mentions_empty_cache(StackId::EMPTY));
    }

    fn torch_frame(name: &str, filename: &str) -> SharedFrame {
        SharedFrame {
            name: name.into(),
            filename: filename.into(),
            line: 1,
        }
    }

    #[test]
    fn a_stack_inside_a_graph_capture_is_marked() {
        let mut stacks = Stacks::default();
        let site = "/usr/lib/python3/site-packages/torch/_inductor/cudagraph_trees.py";
        let (record, _) = stacks.frame(torch_frame("_record", site)).expect("room");
        let (warm_up, _) = stacks.frame(torch_frame("run_eager", site)).expect("room");
        let (begin, _) = stacks
            .frame(torch_frame(
                "capture_begin",
                "C:\\Python\\Lib\\site-packages\\torch\\cuda\\graphs.py",
            ))
            .expect("room");
        let (user, _) = stacks
            .frame(torch_frame("_record", "train.py"))
            .expect("room");
        let (recording, _) = stacks.stack(&[record, user]).expect("room");
        let (beginning, _) = stacks.stack(&[begin]).expect("room");
        let (warming, _) = stacks.stack(&[warm_up, user]).expect("room");
        let (own, _) = stacks.stack(&[user]).expect("room");
        assert!(stacks.signs(recording).graph_capture);
        assert!(stacks.signs(beginning).graph_capture);
        assert!(!stacks.signs(warming).graph_capture);
        assert!(!stacks.signs(own).graph_capture);
        let (restore, _) = stacks
            .frame(torch_frame(
                "apply_checkpoint_execution_state_in_allocator",
                site,
            ))
            .expect("room");
        let (restoring, _) = stacks.stack(&[restore, user]).expect("room");
        assert!(stacks.signs(restoring).checkpoint_restore);
        assert!(!stacks.signs(restoring).graph_capture);
        assert!(!stacks.signs(recording).checkpoint_restore);
        assert!(
            stacks.signs(beginning).capture_stream,
            "a capture the user makes"
        );
        assert!(!stacks.signs(recording).capture_stream);
        let (tree_begin, _) = stacks.stack(&[begin, record]).expect("room");
        assert!(stacks.signs(tree_begin).graph_capture);
        assert!(
            !stacks.signs(tree_begin).capture_stream,
            "cudagraph trees capture on their own stream"
        );
        assert_eq!(stacks.signs(StackId(99)), StackSigns::default());
    }
}
