//! What a streaming read recognises in the values the generic unpickler builds: a frame dict,
//! a `frames` list of interned frames, the trace a list of events belongs to, a segment's
//! blocks. The unpickler (`vm.rs`) uses these to keep a snapshot's parts in their compact forms
//! as soon as they are complete.

use super::entry::Trace;
use super::frames::{FrameId, SharedFrame};
use super::records::BlockRecord;
use super::value::{List, Place, Section, Value};

/// The frame a dict is: one with a `filename` and a `name` that are strings and a `line` that
/// is an int (other keys, such as the FX keys `fx_node_op`, `fx_node_name`, `fx_node_target`
/// and `fx_original_trace` PyTorch 2.10 may add, are left out).
pub fn frame_of(value: &Value) -> Option<SharedFrame> {
    let Value::Dict(_) = value else {
        return None;
    };
    let text = |key: &str| match value.get(key) {
        Some(Value::Str(text)) => Some(std::rc::Rc::clone(text)),
        _ => None,
    };
    Some(SharedFrame {
        name: text("name")?,
        filename: text("filename")?,
        line: value.get("line")?.as_int()?,
    })
}

/// The frames of a list whose items are all interned frames (none for an empty list), or
/// `None` when it holds anything else.
pub fn stack_items(list: &List) -> Option<Vec<FrameId>> {
    if list.streamed > 0 || !list.blocks.is_empty() {
        return None;
    }
    list.items
        .iter()
        .map(|item| match item {
            Value::Frame(id) => Some(*id),
            _ => None,
        })
        .collect()
}

/// Bytes of a frame's strings, for the work of hashing it.
pub fn frame_bytes(frame: &SharedFrame) -> u64 {
    (frame.name.len() + frame.filename.len()) as u64
}

/// The trace whose entries a list at `place` holds: `device_traces[n]`, `host_traces[n]`
/// (or `host_traces` itself, should it be one flat list), or neither.
pub fn trace_of(place: Place) -> Trace {
    match place {
        Place::ItemOf(Section::DeviceTraces, n) => Trace::Device(n),
        Place::ItemOf(Section::HostTraces, n) => Trace::Host(n),
        Place::Under(Section::HostTraces) => Trace::Host(0),
        _ => Trace::Other,
    }
}

/// Whether the dicts appended to a list at `place` are segments: the items of `segments` or
/// `host_segments`, or of a top-level list (PyTorch 2.0 and before pickled
/// `torch.cuda.memory_snapshot()`, a bare list of segments).
pub fn holds_segments(place: Place) -> bool {
    matches!(
        place,
        Place::Root | Place::Under(Section::Segments | Section::HostSegments)
    )
}

/// Takes the blocks out of a segment dict's `blocks` list (where they were read into records
/// as they were appended), or says what is wrong with it.
pub fn take_blocks(segment: &mut Value) -> Result<Vec<BlockRecord>, String> {
    let Value::Dict(entries) = segment else {
        return Err(format!(
            "a segment is {}, expected a dict",
            segment.described()
        ));
    };
    let blocks = entries
        .iter_mut()
        .rev()
        .find(|(key, _)| key.as_str() == Some("blocks"))
        .map(|(_, value)| value);
    match blocks {
        Some(Value::List(list)) => {
            if let Some((index, message)) = list.bad_block.take() {
                return Err(format!("block {index}: {message}"));
            }
            if let Some(item) = list.items.first() {
                return Err(format!(
                    "'blocks' holds {}, expected dicts",
                    item.described()
                ));
            }
            Ok(std::mem::take(&mut list.blocks))
        }
        Some(other) => Err(format!(
            "'blocks' is {}, expected a list",
            other.described()
        )),
        None => Err("no 'blocks'".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::pickle::frames::Stacks;

    fn dict(entries: Vec<(&str, Value)>) -> Value {
        Value::Dict(
            entries
                .into_iter()
                .map(|(key, value)| (Value::Str(key.into()), value))
                .collect(),
        )
    }

    #[test]
    fn frames_with_and_without_fx_keys() {
        let plain = dict(vec![
            ("name", Value::Str("forward".into())),
            ("filename", Value::Str("model.py".into())),
            ("line", Value::Int(17)),
        ]);
        let frame = frame_of(&plain).expect("a frame");
        assert_eq!((&*frame.name, frame.line), ("forward", 17));
        let mut fx = plain.clone();
        if let Value::Dict(entries) = &mut fx {
            entries.push((
                Value::Str("fx_node_op".into()),
                Value::Str("call_function".into()),
            ));
        }
        assert_eq!(frame_of(&fx), Some(frame.clone()));
        assert_eq!(
            frame_of(&dict(vec![("name", Value::Str("x".into()))])),
            None
        );
        let mut stacks = Stacks::default();
        let (id, _) = stacks.frame(frame).expect("room");
        let list = List {
            items: vec![Value::Frame(id)],
            ..List::default()
        };
        assert_eq!(stack_items(&list), Some(vec![id]));
        let mixed = List {
            items: vec![Value::Frame(id), Value::Int(1)],
            ..List::default()
        };
        assert_eq!(stack_items(&mixed), None);
    }

    #[test]
    fn traces_by_place() {
        assert_eq!(
            trace_of(Place::ItemOf(Section::DeviceTraces, 2)),
            Trace::Device(2)
        );
        assert_eq!(trace_of(Place::Under(Section::HostTraces)), Trace::Host(0));
        assert_eq!(trace_of(Place::Under(Section::DeviceTraces)), Trace::Other);
        assert!(holds_segments(Place::Root));
        assert!(!holds_segments(Place::Under(Section::Blocks)));
    }

    #[test]
    fn blocks_are_taken_or_their_fault_named() {
        let blocks = |list: List| dict(vec![("blocks", Value::List(Box::new(list)))]);
        let mut good = blocks(List::default());
        assert_eq!(take_blocks(&mut good), Ok(Vec::new()));
        let mut bad = blocks(List {
            bad_block: Some((3, "no 'size'".into())),
            ..List::default()
        });
        assert_eq!(take_blocks(&mut bad), Err("block 3: no 'size'".into()));
        let mut missing = dict(Vec::new());
        assert_eq!(take_blocks(&mut missing), Err("no 'blocks'".into()));
    }
}
