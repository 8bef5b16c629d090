//! Snapshots as pickles, the format `torch.cuda.memory._dump_snapshot` writes.
//!
//! Writing goes through serde-pickle (protocol 3): its opcodes — `EMPTY_DICT`/`MARK`/
//! `SETITEMS`, `EMPTY_LIST`/`APPENDS`, `BINUNICODE`, `BININT`/`LONG1`, `BINFLOAT`,
//! `NEWTRUE`/`NEWFALSE`, `TUPLE` — are all among those PyTorch's memory_viz page unpickles
//! itself (`MemoryViz.js` reads protocols 2 to 4 and a fixed opcode set), and Python's pickle
//! reads them all.
//!
//! Reading streams ([`vm`]): trace events go to a handler as they are decoded, so a trace of
//! any length is read in memory proportional to the rest of the snapshot.

pub mod decode;
pub mod event;
pub mod input;
pub mod value;
pub mod vm;

use std::io::{Read, Write};
use std::path::Path;

use thiserror::Error;

pub use decode::Remainder;
pub use event::RawEvent;
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

/// Reads a snapshot from `reader`, handing every trace event to `handler` in order, and
/// returns the rest. `handler` may stop the reading with an error of its own.
pub fn stream(
    reader: impl Read,
    handler: impl FnMut(Emitted) -> Result<(), SnapshotError>,
) -> Result<Remainder, SnapshotError> {
    let mut unpickler = Unpickler::new(reader, handler);
    let top = match unpickler.run() {
        Ok(top) => top,
        Err(StreamError::Pickle {
            offset,
            message,
            events,
        }) => {
            return Err(SnapshotError::Corrupt {
                offset,
                message,
                events,
            })
        }
        Err(StreamError::Event { index, message }) => {
            return Err(SnapshotError::Event {
                index: index + 1,
                message,
            })
        }
        Err(StreamError::Handler(error)) => return Err(error),
        Err(StreamError::Io(error)) => {
            return Err(SnapshotError::Io {
                path: "snapshot".into(),
                message: error.to_string(),
            })
        }
    };
    decode::remainder(&top).map_err(SnapshotError::NotASnapshot)
}

/// Reads the whole pickle at `path` into values, trace events included and shared objects
/// resolved (what Python's `pickle.load` gives). For files that fit in memory: tests and
/// tools that compare snapshots; a replay streams instead.
pub fn load(path: &Path) -> Result<value::Value, SnapshotError> {
    let io = |error: std::io::Error| SnapshotError::Io {
        path: path.display().to_string(),
        message: error.to_string(),
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let mut unpickler = Unpickler::whole(
        std::io::BufReader::new(file),
        |_: Emitted| -> Result<(), SnapshotError> { Ok(()) },
    );
    unpickler.run().map_err(|error| match error {
        StreamError::Pickle {
            offset,
            message,
            events,
        } => SnapshotError::Corrupt {
            offset,
            message,
            events,
        },
        StreamError::Event { index, message } => SnapshotError::Event {
            index: index + 1,
            message,
        },
        StreamError::Handler(error) => error,
        StreamError::Io(error) => io(error),
    })
}

/// [`stream`] from the file `path`.
pub fn stream_file(
    path: &Path,
    handler: impl FnMut(Emitted) -> Result<(), SnapshotError>,
) -> Result<Remainder, SnapshotError> {
    let io = |error: std::io::Error| SnapshotError::Io {
        path: path.display().to_string(),
        message: error.to_string(),
    };
    let file = std::fs::File::open(path).map_err(io)?;
    stream(file, handler).map_err(|error| match error {
        SnapshotError::Io { message, .. } => SnapshotError::Io {
            path: path.display().to_string(),
            message,
        },
        other => other,
    })
}
