//! Allocation sites: the place in the user's code that asked for memory, found from the frames
//! PyTorch records with each allocation (innermost first).
//!
//! A stack's site is its innermost frame of the user's own code (not PyTorch's, Python's, an
//! installed library's or native code): `train.py:42 in forward`, whatever PyTorch functions
//! ran below it. A stack of internals only (an optimizer step's buffers allocated inside
//! `torch/optim`) is named by its innermost frame; a stack with no frames (allocations made by
//! autograd's threads, or a history recorded without stacks) is the site "no frames
//! recorded". Grouping happens after the replay, from stack totals ([`group`]): the replay
//! keeps bytes per distinct stack, whatever way the stacks reached it.

use std::collections::HashMap;
use std::fmt;

use serde::Serialize;

use super::model::Frame;

/// Whether a frame's file is PyTorch's, Python's, an installed library's or native code rather
/// than the user's own.
pub fn is_internal(filename: &str) -> bool {
    const MARKS: [&str; 6] = [
        "/torch/",
        "/site-packages/",
        "/dist-packages/",
        "/lib/python",
        "/c10/",
        "/aten/",
    ];
    const NATIVE: [&str; 5] = [".cpp", ".cc", ".cu", ".h", ".hpp"];
    filename.is_empty()
        || filename.starts_with('<')
        || filename.starts_with("??")
        || MARKS.iter().any(|mark| filename.contains(mark))
        || NATIVE.iter().any(|ext| filename.ends_with(ext))
}

/// One allocation site: the frame that names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Site {
    /// Source file, as recorded.
    pub filename: String,
    /// 1-based line (0 for native frames without one).
    pub line: i64,
    /// Function name.
    pub name: String,
    /// Whether the frame is the user's own code (`false`: the stack has none, and its
    /// innermost frame names it).
    pub user: bool,
}

impl Site {
    /// The site of a stack (innermost frame first); `None` when no frames were recorded.
    pub fn of(frames: &[Frame]) -> Option<Site> {
        let (frame, user) = match frames.iter().find(|f| !is_internal(&f.filename)) {
            Some(frame) => (frame, true),
            None => (frames.first()?, false),
        };
        Some(Site {
            filename: frame.filename.clone(),
            line: frame.line,
            name: frame.name.clone(),
            user,
        })
    }
}

impl fmt::Display for Site {
    /// `file:line in name`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{} in {}", self.filename, self.line, self.name)
    }
}

/// What a site without frames is called.
pub const NO_FRAMES: &str = "(no frames recorded)";

/// The label of an optional site: its `file:line in name`, or [`NO_FRAMES`].
pub fn label(site: Option<&Site>) -> String {
    site.map_or_else(|| NO_FRAMES.to_string(), Site::to_string)
}

/// Bytes one site holds at a moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SiteBytes {
    /// `file:line in name`, or [`NO_FRAMES`].
    pub label: String,
    /// The site (`None`: no frames recorded).
    pub site: Option<Site>,
    /// Bytes of its live blocks (as the allocator rounded them).
    pub bytes: u64,
    /// Its live blocks.
    pub blocks: u64,
    /// The whole stack of its largest contributor, innermost frame first.
    pub stack: Vec<Frame>,
}

/// Bytes and blocks held by one distinct stack, as a replay counts them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Held {
    /// Bytes of live blocks.
    pub bytes: u64,
    /// Live blocks.
    pub blocks: u64,
}

/// Groups per-stack totals into sites, largest first (ties by label). `frames` gives a stack's
/// frames; every stack is asked for once.
pub fn group<K: Copy>(
    stacks: impl IntoIterator<Item = (K, Held)>,
    frames: impl Fn(K) -> Vec<Frame>,
) -> Vec<SiteBytes> {
    let mut sites: HashMap<Option<Site>, (Held, u64, Vec<Frame>)> = HashMap::new();
    for (key, held) in stacks {
        if held.blocks == 0 && held.bytes == 0 {
            continue;
        }
        let stack = frames(key);
        let site = Site::of(&stack);
        let entry = sites.entry(site).or_default();
        entry.0.bytes += held.bytes;
        entry.0.blocks += held.blocks;
        if held.bytes > entry.1 || entry.2.is_empty() {
            entry.1 = held.bytes;
            entry.2 = stack;
        }
    }
    let mut list: Vec<SiteBytes> = sites
        .into_iter()
        .map(|(site, (held, _, stack))| SiteBytes {
            label: label(site.as_ref()),
            site,
            bytes: held.bytes,
            blocks: held.blocks,
            stack,
        })
        .collect();
    list.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.label.cmp(&b.label)));
    list
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(filename: &str, line: i64, name: &str) -> Frame {
        Frame {
            name: name.into(),
            filename: filename.into(),
            line,
        }
    }

    #[test]
    fn the_site_is_the_innermost_user_frame() {
        let stack = [
            frame(
                "/venv/lib/python3.12/site-packages/torch/nn/functional.py",
                2935,
                "layer_norm",
            ),
            frame("/home/me/model.py", 88, "forward"),
            frame("/home/me/train.py", 12, "<module>"),
        ];
        let site = Site::of(&stack).expect("a site");
        assert!(site.user);
        assert_eq!(site.to_string(), "/home/me/model.py:88 in forward");
        let internal = [frame("/opt/torch/optim/adam.py", 791, "_multi_tensor_adam")];
        let site = Site::of(&internal).expect("a site");
        assert!(!site.user);
        assert_eq!(site.name, "_multi_tensor_adam");
        assert_eq!(Site::of(&[]), None);
        assert!(is_internal("<frozen runpy>"));
        assert!(is_internal("/usr/lib/python3.12/runpy.py"));
        assert!(is_internal("aten/src/ATen/native/Copy.cpp"));
        assert!(!is_internal("train.py"));
    }

    #[test]
    fn stacks_of_one_site_are_summed_and_sorted() {
        let stacks = [
            vec![
                frame("lib/site-packages/torch/x.py", 1, "f"),
                frame("a.py", 3, "g"),
            ],
            vec![frame("a.py", 3, "g"), frame("main.py", 1, "<module>")],
            vec![frame("b.py", 9, "h")],
            vec![],
        ];
        let held = [(0_usize, 100, 1), (1, 300, 2), (2, 250, 5), (3, 50, 1)];
        let sites = group(
            held.iter()
                .map(|&(key, bytes, blocks)| (key, Held { bytes, blocks })),
            |key| stacks[key].clone(),
        );
        let labels: Vec<(&str, u64, u64)> = sites
            .iter()
            .map(|s| (s.label.as_str(), s.bytes, s.blocks))
            .collect();
        assert_eq!(
            labels,
            [
                ("a.py:3 in g", 400, 3),
                ("b.py:9 in h", 250, 5),
                (NO_FRAMES, 50, 1)
            ]
        );
        assert_eq!(sites[0].stack, stacks[1], "the largest contributor's stack");
    }
}
