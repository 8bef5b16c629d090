//! The reader's records made from the dicts the generic unpickler built: a trace entry (the way
//! every entry goes when the fast path, `fast.rs`, does not recognise its bytes), a block and
//! a segment. Every layout PyTorch wrote is read: blocks of 2.1 and later (`address`,
//! `requested_size`, `frames`) and of 2.0 and before (a `history`, no address).

use super::entry::{Entry, Marker, MarkerKind, RawEvent};
use super::frames::StackId;
use super::records::{BlockRecord, BlockState, SegmentRecord};
use super::value::Value;
use crate::snapshot::model::Action;

/// Reads a trace entry from a generic dict (its `frames` already interned by the unpickler),
/// or says what is wrong with it. The event's `signs` are left for the caller, who
/// holds the stacks.
pub fn event(dict: &Value) -> Result<Entry, String> {
    let action = match dict.get("action") {
        Some(Value::Str(name)) => name,
        Some(other) => return Err(wrong("action", other, "a string")),
        None => return Err("no 'action'".into()),
    };
    let time_us = int(dict, "time_us", 0)?;
    let stack = stack(dict)?;
    if let Some(kind) = MarkerKind::from_bytes(action.as_bytes()) {
        let addr = match dict.get("addr") {
            Some(_) => address(dict, "addr")? as i64,
            None => 0,
        };
        return Ok(Entry::Marker(Marker {
            kind,
            addr,
            size: int(dict, "size", 0)?,
            time_us,
            stack,
        }));
    }
    let action = Action::from_name(action)
        .ok_or_else(|| format!("unknown action '{action}' (not one PyTorch records)"))?;
    let addr_key = if action == Action::Oom && dict.get("device_free").is_some() {
        "device_free"
    } else {
        "addr"
    };
    let required = |key: &str| {
        if dict.get(key).is_none() {
            return Err(format!("{} event has no '{key}'", action.name()));
        }
        Ok(())
    };
    required(addr_key)?;
    required("size")?;
    let pool = match dict.get("pool_id") {
        None => (0, 0),
        Some(value) => pair(value).ok_or_else(|| wrong("pool_id", value, "a pair of ints"))?,
    };
    Ok(Entry::Memory(RawEvent {
        action,
        addr: address(dict, addr_key)? as i64,
        size: int(dict, "size", 0)?,
        stream: int(dict, "stream", 0)?,
        time_us,
        signs: Default::default(),
        stack,
        pool,
    }))
}

/// A pair of integers (`segment_pool_id`, `pool_id`).
fn pair(value: &Value) -> Option<(i64, i64)> {
    match value {
        Value::Tuple(items) => match items.as_slice() {
            [first, second] => Some((first.as_int()?, second.as_int()?)),
            _ => None,
        },
        _ => None,
    }
}

fn field<'a>(dict: &'a Value, key: &str) -> Result<&'a Value, String> {
    dict.get(key).ok_or_else(|| format!("no '{key}'"))
}

fn wrong(key: &str, value: &Value, expected: &str) -> String {
    format!("'{key}' is {}, expected {expected}", value.described())
}

/// A non-negative integer field.
fn size(dict: &Value, key: &str) -> Result<u64, String> {
    let value = field(dict, key)?;
    value
        .as_int()
        .and_then(|v| u64::try_from(v).ok())
        .or_else(|| value.as_unsigned())
        .ok_or_else(|| wrong(key, value, "a non-negative int"))
}

/// An optional non-negative integer field.
fn optional_size(dict: &Value, key: &str) -> Result<Option<u64>, String> {
    match dict.get(key) {
        None => Ok(None),
        Some(_) => size(dict, key).map(Some),
    }
}

/// An address field: any 64 bits (C++'s writer wraps addresses at or above 2^63 negative).
fn address(dict: &Value, key: &str) -> Result<u64, String> {
    let value = field(dict, key)?;
    value
        .as_address()
        .ok_or_else(|| wrong(key, value, "an address (an int of 64 bits)"))
}

fn int(dict: &Value, key: &str, default: i64) -> Result<i64, String> {
    match dict.get(key) {
        None => Ok(default),
        Some(value) => value
            .as_int()
            .ok_or_else(|| wrong(key, value, "an int of 64 signed bits")),
    }
}

fn flag(dict: &Value, key: &str) -> Result<bool, String> {
    match dict.get(key) {
        None => Ok(false),
        Some(Value::Bool(flag)) => Ok(*flag),
        Some(value) => Err(wrong(key, value, "a bool")),
    }
}

/// The `frames` of a dict: a stack the reader interned, or none.
fn stack(dict: &Value) -> Result<StackId, String> {
    match dict.get("frames") {
        None | Some(Value::Elided) => Ok(StackId::EMPTY),
        Some(Value::Stack(id)) => Ok(*id),
        Some(value) => Err(wrong("frames", value, "a list of frames")),
    }
}

/// A block from its dict: 2.1 and later, or 2.0's with a `history` instead of
/// `requested_size`/`frames` (and no address).
pub fn block(dict: &Value) -> Result<BlockRecord, String> {
    let Value::Dict(_) = dict else {
        return Err(format!("a block is {}, expected a dict", dict.described()));
    };
    let state = match field(dict, "state")? {
        Value::Str(name) => BlockState::from_name(name).ok_or_else(|| {
            format!("'state' is '{name}', none of active_allocated, active_pending_free, inactive")
        })?,
        other => return Err(wrong("state", other, "a string")),
    };
    let (address, address_recorded) = match dict.get("address") {
        Some(_) => (address(dict, "address")?, true),
        None => (0, false),
    };
    let (requested_size, stack) = match dict.get("history") {
        Some(Value::List(history)) if dict.get("requested_size").is_none() => {
            match history.items.first() {
                Some(latest) => (size(latest, "real_size")?, self::stack(latest)?),
                None => (0, StackId::EMPTY),
            }
        }
        Some(other @ (Value::Dict(_) | Value::Tuple(_) | Value::Str(_))) => {
            return Err(wrong("history", other, "a list"))
        }
        _ => (
            optional_size(dict, "requested_size")?.unwrap_or(0),
            self::stack(dict)?,
        ),
    };
    Ok(BlockRecord {
        address,
        size: size(dict, "size")?,
        requested_size,
        state,
        stack,
        address_recorded,
    })
}

/// A segment from its dict and its blocks (read by [`block`] as they came). Sizes the file
/// does not record are summed from the blocks; block addresses it does not record follow from
/// the segment's address and the sizes before them.
pub fn segment(dict: &Value, mut blocks: Vec<BlockRecord>) -> Result<SegmentRecord, String> {
    let Value::Dict(_) = dict else {
        return Err(format!(
            "a segment is {}, expected a dict",
            dict.described()
        ));
    };
    let base = address(dict, "address")?;
    let mut next = base;
    for block in &mut blocks {
        if !block.address_recorded {
            block.address = next;
        }
        next = block.address.wrapping_add(block.size);
    }
    let sum = |keep: fn(&BlockRecord) -> bool, of: fn(&BlockRecord) -> u64| {
        blocks
            .iter()
            .filter(|block| keep(block))
            .fold(0_u64, |total, block| total.saturating_add(of(block)))
    };
    let allocated = sum(|b| b.state == BlockState::ActiveAllocated, |b| b.size);
    let active = sum(|b| b.state.is_active(), |b| b.size);
    let requested = sum(|b| b.state.is_active(), |b| b.requested_size);
    let pool = match dict.get("segment_pool_id") {
        None => (0, 0),
        Some(value) => {
            pair(value).ok_or_else(|| wrong("segment_pool_id", value, "a pair of ints"))?
        }
    };
    let small = match dict.get("segment_type") {
        None => false,
        Some(Value::Str(kind)) => match &**kind {
            "small" => true,
            "large" => false,
            other => return Err(format!("'segment_type' is '{other}', not small or large")),
        },
        Some(other) => return Err(wrong("segment_type", other, "a string")),
    };
    Ok(SegmentRecord {
        device: int(dict, "device", 0)?,
        address: base,
        total_size: size(dict, "total_size")?,
        allocated_size: optional_size(dict, "allocated_size")?.unwrap_or(allocated),
        active_size: optional_size(dict, "active_size")?.unwrap_or(active),
        requested_size: optional_size(dict, "requested_size")?.unwrap_or(requested),
        stream: int(dict, "stream", 0)?,
        small,
        pool,
        expandable: flag(dict, "is_expandable")?,
        stack: stack(dict)?,
        blocks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::pickle::value::List;

    #[test]
    fn a_dict_without_action_or_with_an_unknown_one_is_refused() {
        assert!(event(&dict(vec![("size", Value::Int(1))]))
            .unwrap_err()
            .contains("no 'action'"));
        assert!(event(&dict(vec![("action", text("teleport"))]))
            .unwrap_err()
            .contains("unknown action 'teleport'"));
        let no_addr = dict(vec![("action", text("alloc")), ("size", Value::Int(1))]);
        assert!(event(&no_addr)
            .unwrap_err()
            .contains("alloc event has no 'addr'"));
    }

    #[test]
    fn events_markers_pools_and_unsigned_addresses() {
        let oom = event(&dict(vec![
            ("action", text("oom")),
            ("device_free", Value::Unsigned(1 << 63)),
            ("size", Value::Int(512)),
            ("pool_id", Value::Tuple(vec![Value::Int(1), Value::Int(0)])),
        ]))
        .expect("an oom");
        let Entry::Memory(oom) = oom else {
            panic!("{oom:?}")
        };
        assert_eq!((oom.address(), oom.pool), (1 << 63, (1, 0)));
        let marker = event(&dict(vec![
            ("action", text("user_defined")),
            ("frames", Value::Stack(StackId::EMPTY)),
        ]))
        .expect("a marker");
        assert_eq!(marker.action_name(), "user_defined");
        assert!(event(&dict(vec![
            ("action", text("alloc")),
            ("addr", Value::Int(0)),
            ("size", Value::Int(1)),
            ("frames", text("no")),
        ]))
        .unwrap_err()
        .contains("'frames' is a str"));
    }

    fn dict(entries: Vec<(&str, Value)>) -> Value {
        Value::Dict(
            entries
                .into_iter()
                .map(|(key, value)| (Value::Str(key.into()), value))
                .collect(),
        )
    }

    fn text(value: &str) -> Value {
        Value::Str(value.into())
    }

    #[test]
    fn a_2_1_block_and_segment() {
        let block = block(&dict(vec![
            ("address", Value::Int(4096)),
            ("size", Value::Int(512)),
            ("requested_size", Value::Int(500)),
            ("state", text("active_allocated")),
            ("frames", Value::Stack(StackId::EMPTY)),
        ]))
        .expect("a block");
        assert_eq!(
            (block.address, block.size, block.requested_size),
            (4096, 512, 500)
        );
        let segment = segment(
            &dict(vec![
                ("address", Value::Int(4096)),
                ("total_size", Value::Int(2 << 20)),
                ("segment_type", text("small")),
                (
                    "segment_pool_id",
                    Value::Tuple(vec![Value::Int(1), Value::Int(2)]),
                ),
            ]),
            vec![block],
        )
        .expect("a segment");
        assert!(segment.small);
        assert_eq!(segment.pool, (1, 2));
        assert_eq!(
            (
                segment.allocated_size,
                segment.active_size,
                segment.requested_size
            ),
            (512, 512, 500),
            "summed from the blocks when not recorded"
        );
        assert_eq!(segment.to_model().blocks[0].state, "active_allocated");
    }

    #[test]
    fn a_2_0_block_takes_its_history_and_a_computed_address() {
        let history = Value::List(Box::new(List {
            items: vec![dict(vec![
                ("addr", Value::Int(1 << 21)),
                ("real_size", Value::Int(1000)),
                ("frames", Value::Stack(StackId::EMPTY)),
            ])],
            ..List::default()
        }));
        let first = block(&dict(vec![
            ("size", Value::Int(512)),
            ("state", text("inactive")),
        ]))
        .expect("a block");
        let second = block(&dict(vec![
            ("size", Value::Int(1024)),
            ("state", text("active_awaiting_free")),
            ("history", history),
        ]))
        .expect("a block");
        assert_eq!(second.requested_size, 1000);
        assert_eq!(second.state, BlockState::ActivePendingFree);
        let segment = segment(
            &dict(vec![
                ("address", Value::Unsigned(1 << 63)),
                ("total_size", Value::Int(1536)),
            ]),
            vec![first, second],
        )
        .expect("a segment");
        assert_eq!(segment.blocks[1].address, (1 << 63) + 512);
    }

    #[test]
    fn wrong_fields_are_named() {
        let bad = |entries| block(&dict(entries)).expect_err("refused");
        assert!(bad(vec![("size", Value::Int(1))]).contains("no 'state'"));
        assert!(
            bad(vec![("size", text("1")), ("state", text("inactive"))]).contains("'size' is a str")
        );
        assert!(
            bad(vec![("size", Value::Int(-1)), ("state", text("inactive"))])
                .contains("non-negative")
        );
        assert!(bad(vec![("size", Value::Int(1)), ("state", text("lost"))])
            .contains("'state' is 'lost'"));
        let refused =
            segment(&dict(vec![("address", Value::Float(1.0))]), Vec::new()).expect_err("refused");
        assert!(refused.contains("'address' is a float"), "{refused}");
    }
}
