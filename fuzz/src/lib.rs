//! The fuzz targets' bodies, as plain functions: the `afl` binaries in `src/bin/` feed them
//! AFL's inputs, and the main crate's `tests/fuzz_regressions.rs` replays minimized crashers
//! through the same code paths.

use std::cell::RefCell;
use std::rc::Rc;

use gpumem::alloc::{AllocConf, Allocation, CachingAllocator, MIB};
use gpumem::device::sim::SimDevice;
use gpumem::script::{on_script_stack, Host, Limits, PrintSink, ScriptError};
use gpumem::snapshot::pickle::{self, ReadLimits, Remainder, Trace};
use gpumem::snapshot::replay::device::{Hints, ReplayDevice};
use gpumem::snapshot::replay::engine::LiveLimit;
use gpumem::snapshot::replay::{Engine, PoolRoutes};
use gpumem::snapshot::SnapshotError;
use gpumem::tensor::Runtime;

/// Small limits, so every input finishes in milliseconds.
pub const SCRIPT_LIMITS: Limits = Limits {
    max_operations: Some(20_000),
    max_call_depth: 32,
    max_expr_depth: 64,
    max_string_size: 4096,
    max_array_size: 1024,
    max_map_size: 256,
    max_variables: 256,
    max_functions: 64,
    max_modules: 4,
};

/// Target 1: arbitrary bytes as a script on a 16 MiB simulated device. Any outcome but a
/// panic, an abort or a hang is fine, as long as the allocator is consistent afterwards and
/// every tensor the script made was freed with its variables.
pub fn script(data: &[u8]) {
    let source = String::from_utf8_lossy(data).into_owned();
    let outcome = on_script_stack(move || {
        let conf = AllocConf::default();
        let runtime = Runtime::sim(SimDevice::new(16 * MIB), conf).expect("runtime");
        let output = Rc::new(RefCell::new(String::new()));
        let host = Host::with_limits(
            Rc::clone(&runtime),
            PrintSink::Buffer(output),
            SCRIPT_LIMITS,
        );
        match host.run_source("fuzz", &source) {
            Ok(()) | Err(ScriptError::Script { .. }) | Err(ScriptError::Exit(_)) => {}
            Err(other) => panic!("unexpected error kind: {other}"),
        }
        drop(host);
        let allocator = runtime.allocator();
        if let Err(violation) = allocator.check_invariants() {
            panic!("invariant broken after the script: {violation}");
        }
        let left = allocator.stats().allocated_bytes.all.current;
        assert_eq!(
            left, 0,
            "{left} bytes still allocated after the script ended"
        );
    });
    if let Err(panic) = outcome {
        panic!("the script thread panicked: {panic}");
    }
}

/// The allocator configs target 2 cycles through.
pub const ALLOC_CONFIGS: [&str; 6] = [
    "",
    "max_split_size_mb:20",
    "max_split_size_mb:64,max_non_split_rounding_mb:17592186044415",
    "roundup_power2_divisions:4",
    "roundup_power2_divisions:[1:8,64:2,>:1],garbage_collection_threshold:0.5,per_process_memory_fraction:0.6",
    "garbage_collection_threshold:0.9,max_split_size_mb:40",
];

/// Reads the input as a little op program.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (&first, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(first)
    }

    fn u64(&mut self) -> u64 {
        (0..8).fold(0, |value, _| {
            (value << 8) | u64::from(self.byte().unwrap_or(0))
        })
    }
}

/// Target 2: an op sequence against the allocator on a 256 MiB simulated device, with
/// `check_invariants()` after every op; at the end everything is freed and the cache emptied,
/// which must give every byte back.
pub fn alloc_ops(data: &[u8]) {
    let mut input = Bytes(data);
    let config = ALLOC_CONFIGS[usize::from(input.byte().unwrap_or(0)) % ALLOC_CONFIGS.len()];
    let conf = AllocConf::parse(config).expect("fuzz configs are valid");
    let mut allocator =
        CachingAllocator::new(Box::new(SimDevice::new(256 * MIB)), conf).expect("allocator");
    let mut live: Vec<Allocation> = Vec::new();
    while let Some(op) = input.byte() {
        match op % 8 {
            // Sizes from a few bytes to past the device, and huge ones.
            0..=2 => {
                let raw = input.u64();
                let size = match op % 3 {
                    0 => raw % (2 * MIB),
                    1 => raw % (300 * MIB),
                    _ => raw,
                };
                if let Ok(block) = allocator.malloc(size) {
                    live.push(block);
                }
            }
            3 | 4 => {
                if !live.is_empty() {
                    let index = usize::from(input.byte().unwrap_or(0)) % live.len();
                    let block = live.swap_remove(index);
                    allocator.free(block).expect("freeing a live block");
                }
            }
            5 => allocator.empty_cache().expect("empty_cache"),
            6 => {
                let fraction = f64::from(input.byte().unwrap_or(255)) / 255.0;
                allocator.set_memory_fraction(fraction).expect("in range");
            }
            _ => {
                allocator.reset_peak_stats();
            }
        }
        if let Err(violation) = allocator.check_invariants() {
            panic!("invariant broken after op {op}: {violation}");
        }
    }
    for block in live {
        allocator.free(block).expect("free");
    }
    allocator.empty_cache().expect("empty_cache");
    allocator.check_invariants().expect("consistent at the end");
    assert_eq!(
        allocator.stats().reserved_bytes.all.current,
        0,
        "leftover segments"
    );
    assert_eq!(allocator.total_allocated_memory(), 0, "leftover bytes");
}

/// Target 3: arbitrary text as an `--alloc-conf`. Parsing must not panic; an accepted config
/// must round-trip through [`AllocConf::canonical`]; a refusal must name a key found in the
/// text (or the stray token that stood where a key should be).
pub fn alloc_conf(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    match AllocConf::parse(&text) {
        Ok(conf) => {
            let canonical = conf.canonical();
            let again = AllocConf::parse(&canonical)
                .unwrap_or_else(|error| panic!("canonical '{canonical}' refused: {error}"));
            let strip = |conf: AllocConf| AllocConf {
                source: String::new(),
                ..conf
            };
            assert_eq!(strip(again), strip(conf), "round trip of '{canonical}'");
        }
        Err(error) => {
            let key = error.key();
            // The text as PyTorch's tokenizer sees it: without C's `isspace` characters.
            let compact: String = text
                .chars()
                .filter(|c| !matches!(c, ' ' | '\t' | '\n' | '\u{b}' | '\u{c}' | '\r'))
                .collect();
            assert!(
                !key.is_empty() && (compact.contains(key) || key == "expandable_segments"),
                "error '{error}' names '{key}', which is not in '{text}'"
            );
            assert!(
                error.to_string().contains(key),
                "'{error}' does not name '{key}'"
            );
        }
    }
}

/// The simulated device snapshot inputs replay on: small, so that recorded sizes run it out of
/// memory and the OOM paths are taken too.
pub const SNAPSHOT_DEVICE: u64 = 1 << 30;

/// Target 4: arbitrary bytes as a snapshot file, read and replayed as `gpumem replay` does
/// (under the recorded config when the file has one, which means a second pass). Every input
/// must either replay or be refused with one of the reader's or the replay's clean errors;
/// either way the allocator passes `check_invariants()` afterwards.
pub fn snapshot(data: &[u8]) {
    let first = replay_snapshot(data, AllocConf::default());
    let Ok(remainder) = first else {
        return;
    };
    if let Some(settings) = remainder.settings {
        if let Ok(conf) = settings.to_conf() {
            let _ = replay_snapshot(data, conf);
        }
    }
}

/// One pass of [`snapshot`] under `conf`; panics when the property does not hold.
fn replay_snapshot(data: &[u8], conf: AllocConf) -> Result<Remainder, SnapshotError> {
    let hints = Hints::default();
    let device = ReplayDevice::new(SimDevice::new(SNAPSHOT_DEVICE), hints.clone());
    let Ok(allocator) = CachingAllocator::new(Box::new(device), conf) else {
        // A recorded config gpumem cannot start under (a bad fraction): refused cleanly too.
        return Err(SnapshotError::NotASnapshot("config".into()));
    };
    let mut engine = Engine::new(allocator, Some(hints), PoolRoutes::default())
        .with_live_limit(LiveLimit::default(), data.len() as u64);
    let mut last = 0;
    let limits = ReadLimits::default();
    let read = pickle::stream_limited(data, limits, Some(data.len() as u64), |emitted| {
        // As `gpumem replay`: device traces only, never pinned host memory.
        if !matches!(emitted.trace, Trace::Device(_)) {
            return Ok(());
        }
        last = emitted.index;
        engine.handle(emitted)
    });
    let outcome = read.and_then(|remainder| engine.finish(last).map(|()| remainder));
    if let Err(violation) = engine.allocator().check_invariants() {
        panic!("invariant broken after the replay ({outcome:?}): {violation}");
    }
    match &outcome {
        Ok(_) => {}
        Err(SnapshotError::Io { message, .. }) => panic!("an I/O error from memory: {message}"),
        Err(SnapshotError::Write(message)) => panic!("a write error while reading: {message}"),
        Err(
            SnapshotError::Corrupt { .. }
            | SnapshotError::Limit { .. }
            | SnapshotError::NotASnapshot(_)
            | SnapshotError::Event { .. },
        ) => {}
    }
    outcome
}
