//! A trace event read from a dict the generic unpickler built: the way every event goes when
//! the fast path (`fast.rs`) does not recognise its bytes.

use super::entry::RawEvent;
use super::value::Value;
use crate::snapshot::model::Action;

/// Reads an event from a generic dict, or says what is wrong with it.
pub fn event_from_dict(entries: &[(Value, Value)]) -> Result<RawEvent, String> {
    let get = |key: &str| {
        entries
            .iter()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v)
    };
    let action = match get("action") {
        Some(Value::Str(name)) => Action::from_name(name)
            .ok_or_else(|| format!("unknown action '{name}' (not one PyTorch records)"))?,
        Some(other) => {
            return Err(format!(
                "'action' is a {}, expected a string",
                other.type_name()
            ))
        }
        None => return Err("no 'action'".into()),
    };
    let int = |key: &str, required: bool| -> Result<i64, String> {
        match get(key) {
            Some(value) => value
                .as_int()
                .ok_or_else(|| format!("'{key}' is a {}, expected an int", value.type_name())),
            None if required => Err(format!("{} event has no '{key}'", action.name())),
            None => Ok(0),
        }
    };
    let addr = if action == Action::Oom && get("device_free").is_some() {
        int("device_free", true)?
    } else {
        int("addr", true)?
    };
    Ok(RawEvent {
        action,
        addr,
        size: int("size", true)?,
        stream: int("stream", false)?,
        time_us: int("time_us", false)?,
        empty_cache_frame: get("frames").is_some_and(Value::has_empty_cache_frame),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dict_without_action_or_with_an_unknown_one_is_refused() {
        let key = |k: &str| Value::Str(k.into());
        assert!(event_from_dict(&[(key("size"), Value::Int(1))])
            .unwrap_err()
            .contains("no 'action'"));
        let unknown = [(key("action"), key("teleport"))];
        assert!(event_from_dict(&unknown)
            .unwrap_err()
            .contains("unknown action 'teleport'"));
        let no_addr = [(key("action"), key("alloc")), (key("size"), Value::Int(1))];
        assert!(event_from_dict(&no_addr)
            .unwrap_err()
            .contains("alloc event has no 'addr'"));
    }
}
