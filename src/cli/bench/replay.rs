//! A synthetic memory snapshot of any length for `gpumem bench replay`: a training-like mix
//! of small, medium and large allocations with a bounded live set, made by running gpumem's
//! own allocator (so its `segment_alloc` events and addresses are real) and pickled as it is
//! generated, in PyTorch's layout, without holding the trace in memory.

use std::cell::{Cell, RefCell};
use std::io::Write;
use std::path::Path;
use std::rc::Rc;

use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};

use gpumem::alloc::{AllocConf, Allocation, CachingAllocator, EventLog};
use gpumem::device::sim::SimDevice;
use gpumem::snapshot::model::{int, Action, Annotation, Segment, TraceEvent};
use gpumem::snapshot::{capture, AllocatorSettings};

use crate::cli::splitmix::SplitMix64;

/// Live bytes the workload stays under (well inside the simulated H200).
const LIVE_LIMIT: u64 = 16 << 30;
/// Live blocks the workload keeps around on average.
const LIVE_TARGET: usize = 2000;

/// The generator's state while the trace is being written.
struct Workload {
    allocator: CachingAllocator,
    /// The allocator's event stream: every event of PyTorch's kinds goes into the trace.
    log: Rc<RefCell<EventLog>>,
    rng: SplitMix64,
    live: Vec<(Allocation, u64)>,
    live_bytes: u64,
    time_us: i64,
    pending: Vec<TraceEvent>,
}

impl Workload {
    fn event(&mut self, action: Action, addr: u64, size: u64) {
        self.time_us += 1;
        self.pending.push(TraceEvent {
            action,
            addr: int(addr),
            size: int(size),
            stream: 0,
            time_us: self.time_us,
            compile_context: "N/A".into(),
            user_metadata: String::new(),
            frames: Vec::new(),
        });
    }

    fn size(&mut self) -> u64 {
        match self.rng.below(100) {
            0..=59 => 512 * (1 + self.rng.below(2048)),
            60..=94 => (1 << 20) + self.rng.below(9 << 20),
            _ => (10 << 20) + self.rng.below(190 << 20),
        }
    }

    /// One step of the workload: an allocation or a free, with the events it causes.
    fn step(&mut self) {
        let grow = self.live.len() < LIVE_TARGET / 2
            || (self.live.len() < 2 * LIVE_TARGET && self.rng.below(2) == 0);
        if grow && self.live_bytes < LIVE_LIMIT {
            let size = self.size();
            let Ok(block) = self.allocator.malloc(size) else {
                self.log.borrow_mut().take();
                return self.free_one();
            };
            self.write_events();
            self.live_bytes += block.size;
            self.live.push((block, size));
        } else {
            self.free_one();
        }
    }

    fn free_one(&mut self) {
        if self.live.is_empty() {
            return;
        }
        let index = self.rng.below(self.live.len() as u64) as usize;
        let (block, _) = self.live.swap_remove(index);
        self.live_bytes -= block.size;
        // The block is ours and live: its free cannot fail.
        let _ = self.allocator.free(block);
        self.write_events();
    }

    /// Moves the allocator's events since the last call into the trace (PyTorch's kinds only).
    fn write_events(&mut self) {
        let events = self.log.borrow_mut().take();
        for event in events.iter().filter(|event| event.kind.is_pytorchs()) {
            self.event(event.kind, event.addr, event.size);
        }
    }
}

/// `device_traces`: one device whose events are generated while they are written.
struct Traces<'a> {
    workload: &'a RefCell<Workload>,
    /// Events asked for.
    events: u64,
    /// Events written, once the trace is.
    written: Cell<u64>,
}

impl Serialize for Traces<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut devices = serializer.serialize_seq(Some(1))?;
        devices.serialize_element(&Trace(self))?;
        devices.end()
    }
}

struct Trace<'a, 'b>(&'a Traces<'b>);

impl Serialize for Trace<'_, '_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut trace = serializer.serialize_seq(None)?;
        let mut written = 0;
        while written < self.0.events {
            let batch = {
                let mut workload = self.0.workload.borrow_mut();
                workload.step();
                std::mem::take(&mut workload.pending)
            };
            // A step's events are written whole (the trace may run a few events past the
            // count asked for), so the trace ends where the allocator's state does and `segments`, written
            // after it, is that state.
            for event in batch {
                trace.serialize_element(&event)?;
                written += 1;
            }
        }
        self.0.written.set(written);
        trace.end()
    }
}

/// The whole snapshot. The trace comes before `segments` (PyTorch writes `segments` first):
/// the segments are the state after the last event, known only once the trace is written, and
/// readers take the dict's keys in any order. PyTorch's memory_viz page starts from `segments`
/// and undoes the trace backwards, so they must be the trace's end state.
struct Synthetic<'a> {
    traces: Traces<'a>,
}

impl Serialize for Synthetic<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(4))?;
        map.serialize_entry("device_traces", &self.traces)?;
        let segments: Vec<Segment> = {
            let workload = self.traces.workload.borrow();
            capture::segments(&workload.allocator, 0, &|_| Vec::new())
        };
        map.serialize_entry("segments", &segments)?;
        map.serialize_entry("allocator_settings", &AllocatorSettings::default())?;
        map.serialize_entry("external_annotations", &Vec::<Annotation>::new())?;
        map.end()
    }
}

/// Writes a synthetic snapshot of `events` trace events to `path` (a few more when the last
/// step makes several); returns its size in bytes and the events written.
pub fn write_synthetic(path: &Path, events: u64, seed: u64) -> Result<(u64, u64), String> {
    let mut allocator = CachingAllocator::new(Box::new(SimDevice::h200()), AllocConf::default())
        .map_err(|error| error.to_string())?;
    let log = Rc::new(RefCell::new(EventLog::default()));
    allocator.subscribe(Box::new(Rc::clone(&log)));
    let workload = RefCell::new(Workload {
        allocator,
        log,
        rng: SplitMix64(seed),
        live: Vec::new(),
        live_bytes: 0,
        time_us: 1_700_000_000_000_000,
        pending: Vec::new(),
    });
    let snapshot = Synthetic {
        traces: Traces {
            workload: &workload,
            events,
            written: Cell::new(0),
        },
    };
    let file = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut writer = std::io::BufWriter::with_capacity(1 << 20, file);
    serde_pickle::to_writer(&mut writer, &snapshot, serde_pickle::SerOptions::new())
        .map_err(|error| error.to_string())?;
    writer.flush().map_err(|error| error.to_string())?;
    let bytes = std::fs::metadata(path)
        .map(|meta| meta.len())
        .map_err(|error| error.to_string())?;
    Ok((bytes, snapshot.traces.written.get()))
}

/// This process's peak resident memory in KiB (`VmHWM` in /proc/self/status), where the
/// system reports it.
pub fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// CPU time this thread has run, in nanoseconds (/proc/thread-self/schedstat), where the
/// system reports it: on a shared machine it measures the work, where the wall clock also
/// measures the neighbours.
pub fn thread_cpu_ns() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpumem::snapshot::pickle::stream_file;
    use gpumem::snapshot::replay::{replay, ReplayOptions};

    /// PyTorch's memory_viz page starts from `segments` and undoes the trace backwards: the
    /// synthetic file's segments must be the state its trace ends in.
    #[test]
    fn the_synthetic_snapshot_ends_in_its_segments() {
        let path = std::env::temp_dir().join(format!(
            "gpumem-synthetic-test-{}.pickle",
            std::process::id()
        ));
        let (_, written) = write_synthetic(&path, 20_000, 3).expect("written");
        assert!((20_000..20_010).contains(&written), "{written}");
        let mut streamed = 0_u64;
        let rest = stream_file(&path, |_| {
            streamed += 1;
            Ok(())
        })
        .expect("readable");
        assert_eq!(streamed, written);
        let report = replay(&path, &ReplayOptions::default(), &mut |_, _| {}).expect("replays");
        let _ = std::fs::remove_file(&path);
        let segments: Vec<gpumem::snapshot::Segment> =
            rest.segments.iter().map(|s| s.to_model()).collect();
        let reserved: i64 = segments.iter().map(|s| s.total_size).sum();
        let allocated: Vec<&gpumem::snapshot::Block> = segments
            .iter()
            .flat_map(|s| &s.blocks)
            .filter(|b| b.state == "active_allocated")
            .collect();
        assert!(reserved > 0 && !allocated.is_empty());
        assert_eq!(reserved, report.stat("reserved_bytes.all.current"));
        assert_eq!(
            allocated.len() as i64,
            report.stat("allocation.all.current")
        );
        assert_eq!(
            allocated.iter().map(|b| b.size).sum::<i64>(),
            report.stat("allocated_bytes.all.current")
        );
    }
}
