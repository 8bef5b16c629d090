//! Snapshots as pickles, the format `torch.cuda.memory._dump_snapshot` writes.
//!
//! Writing goes through serde-pickle (protocol 3): its opcodes — `EMPTY_DICT`/`MARK`/
//! `SETITEMS`, `EMPTY_LIST`/`APPENDS`, `BINUNICODE`, `BININT`/`LONG1`, `BINFLOAT`,
//! `NEWTRUE`/`NEWFALSE`, `TUPLE` — are all among those PyTorch's memory_viz page unpickles
//! itself (`MemoryViz.js` reads protocols 2 to 4 and a fixed opcode set), and Python's pickle
//! reads them all.
//!
//! Reading streams ([`vm`]): trace events go to a handler as they are decoded, so a trace of
//! any length is read in memory proportional to the rest of the snapshot. A file is untrusted
//! input: the reader's `limits` bound nesting, the memo, memory and work in proportion to its
//! size, and a refusal ([`SnapshotError::Limit`]) names the byte offset and the limit.

pub(crate) mod decode;
mod entry;
mod fast;
pub(crate) mod frames;
mod from_dict;
mod input;
pub(crate) mod limits;
mod memo;
mod opcodes;
pub(crate) mod records;
mod shape;
pub mod value;
pub mod vm;

use std::io::{Read, Write};
use std::path::Path;

use thiserror::Error;

pub use decode::Remainder;
pub use entry::{Entry, Marker, MarkerKind, RawEvent, Trace};
pub use frames::{SharedFrame, StackId, StackSigns, Stacks};
pub use limits::ReadLimits;
pub use records::{BlockRecord, BlockState, SegmentRecord};
pub use vm::Emitted;

use super::model::Snapshot;
use vm::{StreamError, Unpickler};

/// Why a snapshot could not be read or written.
#[derive(Debug, Error)]
pub enum SnapshotError {
    /// The file could not be opened, read or written.
    #[error("{path}: {message}")]
    Io {
        /// The file.
        path: String,
        /// The operating system's reason.
        message: String,
    },
    /// The bytes are not a readable pickle (corrupted or truncated).
    #[error("not a readable pickle: {message} (at byte {offset}, after {events} trace events)")]
    Corrupt {
        /// Where.
        offset: u64,
        /// What.
        message: String,
        /// Trace events read before it.
        events: u64,
    },
    /// The file asks the reader for more than its limits allow (nesting, memo, memory, work,
    /// or a length longer than the file).
    #[error("refused at byte {offset}: {message} (after {events} trace events)")]
    Limit {
        /// Where.
        offset: u64,
        /// Which limit, with its value.
        message: String,
        /// Trace events read before it.
        events: u64,
    },
    /// A pickle, but not a memory snapshot.
    #[error("not a PyTorch memory snapshot: {0}")]
    NotASnapshot(String),
    /// One trace event is malformed or cannot be replayed.
    #[error("event {index}: {message}")]
    Event {
        /// The event's number: its position among the file's trace entries (every device's
        /// trace, in file order), counted from 1 (`gpumem replay` numbers events alike).
        index: u64,
        /// What is wrong.
        message: String,
    },
    /// Serialization failed.
    #[error("cannot write the snapshot: {0}")]
    Write(String),
}

/// Writes `snapshot` as a pickle to `writer`.
pub fn write(writer: &mut impl Write, snapshot: &Snapshot) -> Result<(), SnapshotError> {
    serde_pickle::to_writer(writer, snapshot, serde_pickle::SerOptions::new())
        .map_err(|error| SnapshotError::Write(error.to_string()))
}

/// Writes `snapshot` to the file `path` (PyTorch's `_dump_snapshot`).
pub fn dump(path: &Path, snapshot: &Snapshot) -> Result<(), SnapshotError> {
    let io = |error: std::io::Error| SnapshotError::Io {
        path: path.display().to_string(),
        message: error.to_string(),
    };
    let file = std::fs::File::create(path).map_err(io)?;
    let mut writer = std::io::BufWriter::new(file);
    write(&mut writer, snapshot)?;
    writer.flush().map_err(io)
}

/// Reads a snapshot from `reader` (of unknown size, under the default limits), handing every
/// trace event to `handler` in order, and returns the rest. `handler` may stop the reading
/// with an error of its own.
pub fn stream(
    reader: impl Read,
    handler: impl FnMut(Emitted) -> Result<(), SnapshotError>,
) -> Result<Remainder, SnapshotError> {
    stream_limited(reader, ReadLimits::default(), None, handler)
}

/// [`stream`] under `limits`, from a reader of `size` bytes when that is known (declared
/// lengths are then checked against it, and the allowances follow it).
pub fn stream_limited(
    reader: impl Read,
    limits: ReadLimits,
    size: Option<u64>,
    handler: impl FnMut(Emitted) -> Result<(), SnapshotError>,
) -> Result<Remainder, SnapshotError> {
    let mut unpickler = Unpickler::new(reader, handler).with_limits(limits, size);
    let top = unpickler.run().map_err(from_stream)?;
    decode::remainder(&top, unpickler.take_stacks()).map_err(SnapshotError::NotASnapshot)
}

/// A reading error as the caller sees it (an I/O error names no file yet).
fn from_stream(error: StreamError<SnapshotError>) -> SnapshotError {
    match error {
        StreamError::Pickle {
            offset,
            message,
            events,
        } => SnapshotError::Corrupt {
            offset,
            message,
            events,
        },
        StreamError::Limit {
            offset,
            message,
            events,
        } => SnapshotError::Limit {
            offset,
            message,
            events,
        },
        StreamError::Shape(message) => SnapshotError::NotASnapshot(message),
        StreamError::Event { index, message } => SnapshotError::Event {
            // Events are numbered from 1 (`replay::event_number`).
            index: index + 1,
            message,
        },
        StreamError::Handler(error) => error,
        StreamError::Io(error) => SnapshotError::Io {
            path: "snapshot".into(),
            message: error.to_string(),
        },
    }
}

/// Opens `path` and learns its size.
fn open(path: &Path) -> Result<(std::fs::File, Option<u64>), SnapshotError> {
    let io = |error: std::io::Error| SnapshotError::Io {
        path: path.display().to_string(),
        message: error.to_string(),
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let size = file.metadata().map_err(io)?.len();
    Ok((file, Some(size)))
}

/// Gives an I/O error the file's name.
fn naming(path: &Path, error: SnapshotError) -> SnapshotError {
    match error {
        SnapshotError::Io { message, .. } => SnapshotError::Io {
            path: path.display().to_string(),
            message,
        },
        other => other,
    }
}

/// Reads the whole pickle at `path` into values, trace events included and shared objects
/// resolved (what Python's `pickle.load` gives), under the default limits. For files that fit
/// in memory: tests and tools that compare snapshots; a replay streams instead.
pub fn load(path: &Path) -> Result<value::Value, SnapshotError> {
    let (file, size) = open(path)?;
    let mut unpickler = Unpickler::whole(
        std::io::BufReader::new(file),
        |_: Emitted| -> Result<(), SnapshotError> { Ok(()) },
    )
    .with_limits(ReadLimits::default(), size);
    unpickler
        .run()
        .map_err(|error| naming(path, from_stream(error)))
}

/// [`stream`] from the file `path`, whose size sets the limits' allowances.
pub fn stream_file(
    path: &Path,
    handler: impl FnMut(Emitted) -> Result<(), SnapshotError>,
) -> Result<Remainder, SnapshotError> {
    let (file, size) = open(path)?;
    stream_limited(file, ReadLimits::default(), size, handler).map_err(|error| naming(path, error))
}
