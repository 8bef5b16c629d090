//! Why a replayed allocation failed, and where: gpumem's diagnosis of the OOM (the cause and
//! figures scripts get, [`crate::alloc::diagnosis`]), the Python frames of the failing
//! request with the user's own frames first, and the largest allocations live at that moment.

use serde::Serialize;

use crate::alloc::diagnosis::OomDiagnosis;
use crate::alloc::OutOfMemory;
use crate::snapshot::model::Frame;

/// How many OOMs get the full answer (diagnosis, largest live allocations); later ones are
/// counted by cause.
pub const ANSWERED_OOMS: usize = 16;

/// How many of the largest live allocations an answer lists.
pub const LARGEST_LIVE: usize = 5;

/// gpumem's diagnosis of one OOM, as scripts get it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Why {
    /// The cause (`"fragmentation"`, `"over_fraction"`, `"device_full"`, ...).
    pub cause: &'static str,
    /// The one line gpumem prints after PyTorch's message.
    pub text: String,
    /// Bytes asked for.
    pub requested: u64,
    /// The request rounded as the allocator rounds it.
    pub rounded: u64,
    /// Bytes of the segment a cache miss needed.
    pub segment: u64,
    /// The pool (`"small"`/`"large"`).
    pub pool: &'static str,
    /// Whether the request was asked in a private pool (a CUDA graph's or a `MemPool`'s),
    /// whose blocks alone the figures below count.
    pub in_private_pool: bool,
    /// The largest free cached block of that pool.
    pub largest_free: u64,
    /// Free cached bytes of that pool.
    pub cached_free: u64,
    /// Bytes free on the device.
    pub device_free: u64,
    /// The device's total memory.
    pub device_total: u64,
    /// Bytes of live blocks.
    pub allocated: u64,
    /// Bytes held from the device.
    pub reserved: u64,
    /// The memory fraction's cap in bytes, if one was set.
    pub allowed: Option<u64>,
    /// Whether expandable segments would have served the request.
    pub fits_with_expandable: bool,
}

impl Why {
    /// The diagnosis of `oom`.
    pub fn of(oom: &OutOfMemory) -> Why {
        let d: &OomDiagnosis = &oom.diagnosis;
        Why {
            cause: d.cause.name(),
            text: oom.why(),
            requested: d.requested,
            rounded: d.rounded,
            segment: d.segment,
            pool: d.pool.name(),
            in_private_pool: d.private_pool.is_some(),
            largest_free: d.largest_free,
            cached_free: d.cached_free,
            device_free: d.device_free,
            device_total: d.device_total,
            allocated: d.allocated,
            reserved: d.reserved,
            allowed: d.allowed,
            fits_with_expandable: d.fits_with_expandable(),
        }
    }
}

/// Which event an OOM was replayed at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OomSource {
    /// An `alloc` PyTorch served that gpumem could not (skipped with its free).
    Alloc,
    /// An `oom` PyTorch recorded, reproduced: gpumem refused the same request.
    RecordedOom,
}

/// One frame of a stack, marked as the user's own code or not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UserFrame {
    /// Source file.
    pub filename: String,
    /// 1-based line.
    pub line: i64,
    /// Function name.
    pub name: String,
    /// Whether it is the user's code (not PyTorch's, Python's or a library's).
    pub user: bool,
}

/// Whether a frame's file is PyTorch's, Python's, an installed library's or native code,
/// rather than the user's own.
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
    filename.starts_with('<')
        || filename.starts_with("??")
        || filename.is_empty()
        || MARKS.iter().any(|mark| filename.contains(mark))
        || NATIVE.iter().any(|ext| filename.ends_with(ext))
}

/// `frames` (innermost first, as PyTorch records them) with the user's own frames first and
/// PyTorch's and other internals after, each group keeping its order.
pub fn user_frames_first(frames: &[Frame]) -> Vec<UserFrame> {
    let (user, internal): (Vec<&Frame>, Vec<&Frame>) = frames
        .iter()
        .partition(|frame| !is_internal(&frame.filename));
    user.into_iter()
        .map(|frame| (frame, true))
        .chain(internal.into_iter().map(|frame| (frame, false)))
        .map(|(frame, user)| UserFrame {
            filename: frame.filename.clone(),
            line: frame.line,
            name: frame.name.clone(),
            user,
        })
        .collect()
}

/// A live allocation at an OOM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LiveAllocation {
    /// The `alloc` event that made it; `None` for a block live when the trace starts.
    pub index: Option<u64>,
    /// Its recorded address.
    pub address: u64,
    /// Its block's bytes.
    pub size: u64,
    /// The bytes asked for.
    pub requested: u64,
    /// Where it was allocated, the user's frames first (empty until looked up, or when the
    /// file records none).
    pub frames: Vec<UserFrame>,
}

/// The `limit` largest of `live` (address, alloc event, block bytes, requested bytes), largest
/// first (ties by address).
pub fn largest<I>(live: I, limit: usize) -> Vec<LiveAllocation>
where
    I: Iterator<Item = (u64, Option<u64>, u64, u64)>,
{
    let mut all: Vec<LiveAllocation> = live
        .map(|(address, index, size, requested)| LiveAllocation {
            index,
            address,
            size,
            requested,
            frames: Vec::new(),
        })
        .collect();
    all.sort_by(|a, b| b.size.cmp(&a.size).then(a.address.cmp(&b.address)));
    all.truncate(limit);
    all
}

/// Counts of OOMs by cause, in order of first appearance.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Causes(Vec<(&'static str, u64)>);

impl Causes {
    /// Counts one OOM of `cause`.
    pub fn add(&mut self, cause: &'static str) {
        match self.0.iter_mut().find(|(name, _)| *name == cause) {
            Some((_, count)) => *count += 1,
            None => self.0.push((cause, 1)),
        }
    }

    /// `"2 fragmentation, 1 device_full"`.
    pub fn summary(&self) -> String {
        self.0
            .iter()
            .map(|(cause, count)| format!("{count} {cause}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Whether none were counted.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
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
    fn the_users_frames_come_first() {
        let frames = [
            frame(
                "/usr/lib/python3/site-packages/torch/nn/modules/linear.py",
                125,
                "forward",
            ),
            frame("??", 0, "c10::cuda::CUDACachingAllocator::malloc"),
            frame("/home/me/train.py", 42, "step"),
            frame("/home/me/train.py", 80, "<module>"),
        ];
        let ordered = user_frames_first(&frames);
        let names: Vec<(&str, bool)> = ordered.iter().map(|f| (f.name.as_str(), f.user)).collect();
        assert_eq!(
            names,
            [
                ("step", true),
                ("<module>", true),
                ("forward", false),
                ("c10::cuda::CUDACachingAllocator::malloc", false)
            ]
        );
    }

    #[test]
    fn largest_first_and_causes_counted() {
        let live = vec![
            (0x10, Some(1), 512, 100),
            (0x20, None, 4096, 4000),
            (0x30, Some(3), 4096, 3000),
        ];
        let top = largest(live.into_iter(), 2);
        assert_eq!(
            top.iter().map(|l| l.address).collect::<Vec<_>>(),
            [0x20, 0x30]
        );
        let mut causes = Causes::default();
        causes.add("fragmentation");
        causes.add("device_full");
        causes.add("fragmentation");
        assert_eq!(causes.summary(), "2 fragmentation, 1 device_full");
    }
}
