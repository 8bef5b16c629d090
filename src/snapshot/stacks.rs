//! The stacks of the trace events a replay goes through, named by a small key ([`StackKey`]) so
//! that per-stack counts cost a few bytes each, however long the frames.
//!
//! The streaming reader resolves each event's frames into its table of distinct stacks and
//! hands out the event's [`StackId`] with it; [`SeenStacks`] keeps the frames of each distinct
//! stack the replay met, once, so that they can be named after the replay. Memory follows the
//! distinct stacks, never the events.

use std::collections::HashMap;

use super::model::Frame;
use super::pickle::{Emitted, StackId};

/// The longest file or function name kept, in bytes: a file is untrusted, and a name is copied
/// into every label and output that shows its site.
pub const NAME_MAX_BYTES: usize = 1024;

/// `text`, cut at [`NAME_MAX_BYTES`] (on a character boundary) with `...` marking the cut.
fn clipped(text: &str) -> String {
    if text.len() <= NAME_MAX_BYTES {
        return text.to_string();
    }
    let mut end = NAME_MAX_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

/// Names one distinct stack met in a replay; [`StackKey::NONE`] is the empty stack.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackKey(pub u32);

impl StackKey {
    /// No frames recorded.
    pub const NONE: StackKey = StackKey(0);

    /// The key as an index into dense per-stack tables.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// The distinct stacks of the events seen so far, each with its frames.
#[derive(Debug, Clone)]
pub struct SeenStacks {
    keys: HashMap<StackId, StackKey>,
    /// Frames by key, innermost first; key 0 is the empty stack.
    frames: Vec<Vec<Frame>>,
}

impl Default for SeenStacks {
    fn default() -> Self {
        SeenStacks {
            keys: HashMap::new(),
            frames: vec![Vec::new()],
        }
    }
}

impl SeenStacks {
    /// No stack seen yet.
    pub fn new() -> SeenStacks {
        SeenStacks::default()
    }

    /// The key of the stack of the event the reader hands out, its frames kept the first time.
    pub fn key(&mut self, emitted: &Emitted<'_>) -> StackKey {
        let id = emitted.entry.stack();
        if id == StackId::EMPTY {
            return StackKey::NONE;
        }
        if let Some(&key) = self.keys.get(&id) {
            return key;
        }
        let key = StackKey(u32::try_from(self.frames.len()).unwrap_or(u32::MAX));
        let frames = emitted
            .stacks
            .frames(id)
            .map(|frame| Frame {
                name: clipped(&frame.name),
                filename: clipped(&frame.filename),
                line: frame.line,
            })
            .collect();
        self.frames.push(frames);
        self.keys.insert(id, key);
        key
    }

    /// The frames of `key`, innermost first (none for [`StackKey::NONE`] or an unknown key).
    pub fn frames(&self, key: StackKey) -> Vec<Frame> {
        self.frames.get(key.index()).cloned().unwrap_or_default()
    }

    /// Whether no event seen had frames.
    pub fn is_empty(&self) -> bool {
        self.frames.len() <= 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_names_are_clipped_on_a_character_boundary() {
        assert_eq!(clipped("train.py"), "train.py");
        let long = "é".repeat(NAME_MAX_BYTES);
        let cut = clipped(&long);
        assert!(
            cut.ends_with("...") && cut.len() <= NAME_MAX_BYTES + 3,
            "{}",
            cut.len()
        );
        assert!(cut.starts_with("éé"));
    }
}
