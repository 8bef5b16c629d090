//! A generator of small PyTorch-shaped snapshots with frames, for the tests of `gpumem diff`
//! and of allocation sites: a job is a list of allocations (each at a named site of a
//! `model.py`, under a frame of PyTorch's own) and frees, run through gpumem's allocator so
//! that its segment events and end state are real, and pickled as `_dump_snapshot` writes.
#![allow(dead_code)]

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::Path;
use std::rc::Rc;

use gpumem::alloc::{AllocConf, Allocation, CachingAllocator, EventLog};
use gpumem::device::sim::SimDevice;
use gpumem::snapshot::model::{int, Frame, Snapshot, TraceEvent};
use gpumem::snapshot::{capture, pickle, AllocatorSettings};

/// The user's file the frames name.
pub const MODEL: &str = "/home/user/project/model.py";

/// A job being written.
pub struct Job {
    allocator: CachingAllocator,
    log: Rc<RefCell<EventLog>>,
    trace: Vec<TraceEvent>,
    live: HashMap<String, Allocation>,
    time_us: i64,
}

/// The frames of an allocation at `model.py:line in function`, under PyTorch's `torch.empty`
/// and called from the training script's top level.
pub fn frames(line: i64, function: &str) -> Vec<Frame> {
    let frame = |filename: &str, line: i64, name: &str| Frame {
        name: name.into(),
        filename: filename.into(),
        line,
    };
    vec![
        frame(
            "/venv/lib/python3.12/site-packages/torch/nn/modules/module.py",
            1790,
            "_call_impl",
        ),
        frame(MODEL, line, function),
        frame("/home/user/project/train.py", 12, "<module>"),
    ]
}

impl Default for Job {
    fn default() -> Self {
        Job::new()
    }
}

impl Job {
    /// An empty job on the simulated H200 under PyTorch's defaults.
    pub fn new() -> Job {
        let mut allocator =
            CachingAllocator::new(Box::new(SimDevice::h200()), AllocConf::default())
                .expect("allocator");
        let log = Rc::new(RefCell::new(EventLog::default()));
        allocator.subscribe(Box::new(Rc::clone(&log)));
        Job {
            allocator,
            log,
            trace: Vec::new(),
            live: HashMap::new(),
            time_us: 1_700_000_000_000_000,
        }
    }

    /// Allocates `bytes` as `name` at `model.py:line in function`.
    pub fn alloc(&mut self, name: &str, bytes: u64, line: i64, function: &str) -> &mut Job {
        let block = self.allocator.malloc(bytes).expect("fits on the H200");
        self.record(&frames(line, function));
        self.live.insert(name.to_string(), block);
        self
    }

    /// Frees the allocation `name`.
    pub fn free(&mut self, name: &str) -> &mut Job {
        let block = self.live.remove(name).expect("a live allocation");
        self.allocator.free(block).expect("freed");
        self.record(&[]);
        self
    }

    fn record(&mut self, frames: &[Frame]) {
        let events = self.log.borrow_mut().take();
        for event in events.iter().filter(|event| event.kind.is_pytorchs()) {
            self.time_us += 1;
            self.trace.push(TraceEvent {
                action: event.kind,
                addr: int(event.addr),
                size: int(event.size),
                stream: 0,
                time_us: self.time_us,
                compile_context: "N/A".into(),
                user_metadata: String::new(),
                frames: frames.to_vec(),
            });
        }
    }

    /// The job as a snapshot: its trace, and its segments as they end.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            segments: capture::segments(&self.allocator, 0, &|_| Vec::new()),
            device_traces: vec![self.trace.clone()],
            allocator_settings: AllocatorSettings::default(),
            external_annotations: Vec::new(),
        }
    }

    /// Writes the snapshot to `path`.
    pub fn dump(&self, path: &Path) {
        pickle::dump(path, &self.snapshot()).expect("written");
    }
}

const MIB: u64 = 1 << 20;

/// A training-like job: weights at `model.py:10`, then three steps whose activation (at
/// `model.py:20`) is `activation_mib` MiB, with a 16 MiB temporary at `model.py:30` when
/// `temporary` and a `cache_mib` MiB cache at `model.py:40` when not zero.
pub fn training(activation_mib: u64, temporary: bool, cache_mib: u64) -> Job {
    let mut job = Job::new();
    job.alloc("weights", 64 * MIB, 10, "__init__");
    for _ in 0..3 {
        job.alloc("activation", activation_mib * MIB, 20, "forward");
        if temporary {
            job.alloc("temporary", 16 * MIB, 30, "forward");
        }
        if cache_mib > 0 {
            job.alloc("cache", cache_mib * MIB, 40, "attend");
        }
        if temporary {
            job.free("temporary");
        }
        if cache_mib > 0 {
            job.free("cache");
        }
        job.free("activation");
    }
    job
}
