//! A PyTorch memory snapshot as Rust types: what `torch.cuda.memory._snapshot()` returns and
//! `torch.cuda.memory._dump_snapshot()` pickles, with PyTorch 2.11's keys in PyTorch's order.
//!
//! Every integer is an `i64`: the pickle writer then encodes large values (addresses,
//! timestamps) as 8-byte `LONG1`, which both Python and the memory_viz page's JavaScript
//! unpickler read as plain numbers (a 9-byte `LONG1` would become a JavaScript `BigInt`).

use serde::ser::{SerializeMap, SerializeStruct};
use serde::{Serialize, Serializer};

use super::settings::AllocatorSettings;

/// A whole snapshot: `{segments, device_traces, allocator_settings, external_annotations}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Snapshot {
    /// Every segment of every device, by address.
    pub segments: Vec<Segment>,
    /// One list of trace events per device, oldest first.
    pub device_traces: Vec<Vec<TraceEvent>>,
    /// The allocator's configuration when the snapshot was taken.
    pub allocator_settings: AllocatorSettings,
    /// Annotations recorded around user code (`record_function` ranges); gpumem records none.
    pub external_annotations: Vec<Annotation>,
}

/// One segment (or one mapped range of an expandable segment) and its blocks.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Segment {
    /// Device ordinal.
    pub device: i64,
    /// Base address.
    pub address: i64,
    /// Bytes of the segment.
    pub total_size: i64,
    /// Bytes of allocated blocks.
    pub allocated_size: i64,
    /// Bytes of active blocks (allocated, or freed and waiting for streams).
    pub active_size: i64,
    /// Bytes asked for by the active blocks.
    pub requested_size: i64,
    /// The stream the segment serves (0 = the default stream).
    pub stream: i64,
    /// `"small"` or `"large"`.
    pub segment_type: String,
    /// The private memory pool owning the segment, `(0, 0)` for the default pools.
    pub segment_pool_id: (i64, i64),
    /// Whether the segment is (part of) an expandable segment.
    pub is_expandable: bool,
    /// Where the segment was allocated, innermost frame first (empty when not recorded).
    pub frames: Vec<Frame>,
    /// The blocks, lowest address first.
    pub blocks: Vec<Block>,
}

/// One block of a segment.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Block {
    /// Device address.
    pub address: i64,
    /// Bytes covered.
    pub size: i64,
    /// Bytes asked for when the block was last handed out.
    pub requested_size: i64,
    /// `"active_allocated"`, `"active_pending_free"` or `"inactive"`.
    pub state: String,
    /// Where the block was allocated, innermost frame first (empty when not recorded).
    pub frames: Vec<Frame>,
}

/// One source location of a stack: PyTorch's `{name, filename, line}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Frame {
    /// Function name (`<module>` at a script's top level).
    pub name: String,
    /// Source file.
    pub filename: String,
    /// 1-based line.
    pub line: i64,
}

/// The kind of a trace event: the allocator's trace action, of which a snapshot holds
/// PyTorch's nine ([`Action::PYTORCH`]; reading a file accepts only their names).
pub use crate::alloc::EventKind as Action;

/// One trace event, as `_snapshot()["device_traces"][device][i]`.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceEvent {
    /// What happened.
    pub action: Action,
    /// The address (for [`Action::Oom`]: the device's free bytes, pickled as `device_free`).
    pub addr: i64,
    /// The byte count.
    pub size: i64,
    /// The stream of the block or segment.
    pub stream: i64,
    /// Microseconds since the Unix epoch.
    pub time_us: i64,
    /// `torch.compile`'s context, `"N/A"` when none.
    pub compile_context: String,
    /// Metadata a user attached (`_set_memory_metadata`), `""` when none.
    pub user_metadata: String,
    /// Where the event was caused, innermost frame first.
    pub frames: Vec<Frame>,
}

impl Serialize for TraceEvent {
    /// PyTorch's keys and order; an OOM event names its address field `device_free`.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(8))?;
        map.serialize_entry("action", self.action.name())?;
        let addr_key = if self.action == Action::Oom {
            "device_free"
        } else {
            "addr"
        };
        map.serialize_entry(addr_key, &self.addr)?;
        map.serialize_entry("size", &self.size)?;
        map.serialize_entry("stream", &self.stream)?;
        map.serialize_entry("time_us", &self.time_us)?;
        map.serialize_entry("compile_context", &self.compile_context)?;
        map.serialize_entry("user_metadata", &self.user_metadata)?;
        map.serialize_entry("frames", &self.frames)?;
        map.end()
    }
}

/// One `external_annotations` entry: a named range's start or end.
#[derive(Debug, Clone, PartialEq)]
pub struct Annotation {
    /// `"START"` or `"END"`.
    pub stage: String,
    /// The range's name.
    pub name: String,
    /// Device ordinal.
    pub device: i64,
    /// Microseconds since the Unix epoch.
    pub time_us: i64,
}

impl Serialize for Annotation {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut entry = serializer.serialize_struct("Annotation", 4)?;
        entry.serialize_field("stage", &self.stage)?;
        entry.serialize_field("name", &self.name)?;
        entry.serialize_field("device", &self.device)?;
        entry.serialize_field("time_us", &self.time_us)?;
        entry.end()
    }
}

/// Converts a byte count or address to the snapshot's signed integers (saturating; no real
/// address or size comes near `i64::MAX`).
pub fn int(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}
