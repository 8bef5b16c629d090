//! Which script line is running, for recordings: bindings that allocate or free call
//! [`Locator::mark`] with their call context, and while recording is on the runtime's context
//! id ([`Runtime::set_context`]) names the script and line making the call. Frees that happen
//! without a call (a variable going out of scope) carry the line of the last marked call.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use rhai::NativeCallContext;

use crate::tensor::Runtime;

/// Script locations seen so far, each with an id; id 0 is "no script line".
#[derive(Debug, Default)]
struct LocationTable {
    ids: HashMap<(String, u32), u32>,
    labels: Vec<String>,
    /// The last location looked up — (source text address, its length, line) — and its id:
    /// a loop calls from the same line over and over.
    last: Option<(usize, usize, u32, u32)>,
}

impl LocationTable {
    fn id(&mut self, source: &str, line: u32) -> u32 {
        let key = (source.as_ptr() as usize, source.len(), line);
        if let Some((address, length, last_line, id)) = self.last {
            if (address, length, last_line) == key {
                return id;
            }
        }
        let next = self.labels.len() as u32 + 1;
        let id = *self
            .ids
            .entry((source.to_string(), line))
            .or_insert_with(|| next);
        if id == next {
            self.labels.push(format!("{source}:{line}"));
        }
        self.last = Some((key.0, key.1, key.2, id));
        id
    }
}

/// Stamps the runtime's context with the calling script line while recording is on.
pub struct Locator {
    runtime: Rc<Runtime>,
    enabled: Cell<bool>,
    table: RefCell<LocationTable>,
}

impl Locator {
    /// A locator for `runtime`, off until [`Locator::set_enabled`].
    pub fn new(runtime: Rc<Runtime>) -> Locator {
        Locator {
            runtime,
            enabled: Cell::new(false),
            table: RefCell::default(),
        }
    }

    /// Turns stamping on or off (off costs one flag test per marked call).
    pub fn set_enabled(&self, enabled: bool) {
        self.enabled.set(enabled);
    }

    /// Records where the binding called with `context` was called from.
    #[inline]
    pub fn mark(&self, context: &NativeCallContext) {
        if self.enabled.get() {
            self.mark_slow(context);
        }
    }

    #[inline(never)]
    fn mark_slow(&self, context: &NativeCallContext) {
        let line = context
            .call_position()
            .line()
            .and_then(|line| u32::try_from(line).ok())
            .unwrap_or(0);
        let source = context.call_source().unwrap_or("script");
        let id = self.table.borrow_mut().id(source, line);
        self.runtime.set_context(id);
    }

    /// `file:line` of each id: entry `i` names id `i + 1`.
    pub fn labels(&self) -> Vec<String> {
        self.table.borrow().labels.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_stable_and_labelled() {
        let mut table = LocationTable::default();
        let a = table.id("x.rhai", 3);
        let b = table.id("x.rhai", 4);
        assert_eq!((a, b), (1, 2));
        assert_eq!(table.id("x.rhai", 3), 1);
        assert_eq!(table.id("mem", 3), 3);
        assert_eq!(table.labels, ["x.rhai:3", "x.rhai:4", "mem:3"]);
    }
}
