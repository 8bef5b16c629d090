//! The value a script catches on out of memory: an `OutOfMemoryError` that prints (and
//! interpolates, and compares) as PyTorch's message followed by gpumem's line saying why, so
//! scripts written against the plain text keep working, and whose fields give the figures:
//! `e.message`, `e.why`, `e.cause`, `e.requested`, `e.largest_free`, `e.cached_free`,
//! `e.device_free`, ...

use rhai::{Array, Dynamic, Engine, EvalAltResult, ImmutableString, Position, INT};

use crate::alloc::diagnosis::OomDiagnosis;
use crate::alloc::OutOfMemory;

/// The script's view of an out-of-memory error.
#[derive(Debug, Clone)]
pub struct OomError {
    message: ImmutableString,
    why: ImmutableString,
    text: ImmutableString,
    diagnosis: OomDiagnosis,
}

impl OomError {
    /// The error for an allocator's out-of-memory refusal.
    pub fn new(oom: &OutOfMemory) -> OomError {
        let why = oom.why();
        OomError {
            text: format!("{}\n{why}", oom.message).into(),
            message: oom.message.clone().into(),
            why: why.into(),
            diagnosis: (*oom.diagnosis).clone(),
        }
    }

    /// The error as a script error to throw.
    pub fn into_error(self) -> Box<EvalAltResult> {
        EvalAltResult::ErrorRuntime(Dynamic::from(self), Position::NONE).into()
    }

    /// The text of a thrown value: an [`OomError`]'s text (PyTorch's message, then gpumem's
    /// line, what `print(e)` shows), else the value as Rhai prints it.
    pub fn describe(value: &Dynamic) -> String {
        match value.read_lock::<OomError>() {
            Some(error) => error.text.to_string(),
            None => value.to_string(),
        }
    }
}

/// Reads one byte figure of a diagnosis.
type Figure = fn(&OomDiagnosis) -> u64;

fn int(value: u64) -> INT {
    INT::try_from(value).unwrap_or(INT::MAX)
}

/// Offsets of a Rhai `sub_string(start, len)` on `text`, in characters, clamped as Rhai
/// clamps them (a negative start counts from the end).
fn sub_string(text: &str, start: INT, length: INT) -> String {
    let count = text.chars().count() as INT;
    let start = if start < 0 {
        (count + start).max(0)
    } else {
        start.min(count)
    };
    let length = length.clamp(0, count - start);
    text.chars()
        .skip(start as usize)
        .take(length as usize)
        .collect()
}

/// Registers the `OutOfMemoryError` type: printing, fields, and the string functions scripts
/// use on error text (`contains`, `starts_with`, `ends_with`, `split`, `sub_string`,
/// `index_of`, `len`, `==`, `!=`, `+`).
pub fn register(engine: &mut Engine) {
    engine
        .register_type_with_name::<OomError>("OutOfMemoryError")
        .register_fn("to_string", |e: &mut OomError| e.text.clone())
        .register_fn("to_debug", |e: &mut OomError| e.text.clone())
        .register_get("message", |e: &mut OomError| e.message.clone())
        .register_get("why", |e: &mut OomError| e.why.clone())
        .register_get("cause", |e: &mut OomError| e.diagnosis.cause.name())
        .register_get("pool", |e: &mut OomError| e.diagnosis.pool.name())
        .register_get("fraction", |e: &mut OomError| e.diagnosis.fraction())
        .register_get("fits_with_expandable", |e: &mut OomError| {
            e.diagnosis.fits_with_expandable()
        })
        .register_get("allowed", |e: &mut OomError| match e.diagnosis.allowed {
            Some(allowed) => Dynamic::from(int(allowed)),
            None => Dynamic::UNIT,
        });
    let figures: [(&str, Figure); 12] = [
        ("requested", |d| d.requested),
        ("rounded", |d| d.rounded),
        ("segment", |d| d.segment),
        ("largest_free", |d| d.largest_free),
        ("cached_free", |d| d.cached_free),
        ("cached_free_all", |d| d.cached_free_all),
        ("device_free", |d| d.device_free),
        ("device_total", |d| d.device_total),
        ("allocated", |d| d.allocated),
        ("reserved", |d| d.reserved),
        ("free_pages", |d| d.free_pages),
        ("page", |d| d.page),
    ];
    for (name, figure) in figures {
        engine.register_get(name, move |e: &mut OomError| int(figure(&e.diagnosis)));
    }

    // The error reads as its text wherever scripts treat it as a string.
    engine
        .register_fn("contains", |e: &mut OomError, s: &str| e.text.contains(s))
        .register_fn("starts_with", |e: &mut OomError, s: &str| {
            e.text.starts_with(s)
        })
        .register_fn("ends_with", |e: &mut OomError, s: &str| e.text.ends_with(s))
        .register_fn("index_of", |e: &mut OomError, s: &str| -> INT {
            e.text
                .find(s)
                .map_or(-1, |bytes| e.text[..bytes].chars().count() as INT)
        })
        .register_fn("len", |e: &mut OomError| e.text.chars().count() as INT)
        .register_fn("split", |e: &mut OomError, s: &str| -> Array {
            e.text
                .split(s)
                .map(|part| Dynamic::from(part.to_string()))
                .collect()
        })
        .register_fn("sub_string", |e: &mut OomError, start: INT, length: INT| {
            sub_string(&e.text, start, length)
        })
        .register_fn("sub_string", |e: &mut OomError, start: INT| {
            sub_string(&e.text, start, INT::MAX)
        })
        .register_fn("==", |e: &mut OomError, s: ImmutableString| e.text == s)
        .register_fn("==", |s: ImmutableString, e: OomError| e.text == s)
        .register_fn("!=", |e: &mut OomError, s: ImmutableString| e.text != s)
        .register_fn("!=", |s: ImmutableString, e: OomError| e.text != s)
        .register_fn("+", |e: &mut OomError, s: ImmutableString| {
            format!("{}{s}", e.text)
        })
        .register_fn("+", |s: ImmutableString, e: OomError| {
            format!("{s}{}", e.text)
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_string_clamps_like_rhai() {
        assert_eq!(sub_string("abcdef", 1, 3), "bcd");
        assert_eq!(sub_string("abcdef", -2, 5), "ef");
        assert_eq!(sub_string("abcdef", 4, 100), "ef");
        assert_eq!(sub_string("abcdef", 10, 1), "");
    }
}
