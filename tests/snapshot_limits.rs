//! The snapshot reader on crafted files (issue 21): deep nesting, huge declared lengths, memo
//! floods, self-referencing and exponentially shared structures, truncation at every byte of a
//! PyTorch snapshot, and wrong types in every field. Each file is refused with an error that
//! names the byte offset and the limit, or read (and replayed) with a consistent allocator;
//! none aborts, hangs or takes memory out of proportion to its size.
//!
//! The files are generated here; the property check is the `fuzz_snapshot` target's body
//! (fuzz/src/lib.rs), which replays through gpumem's allocator and checks its invariants.

#[path = "../fuzz/src/lib.rs"]
#[allow(dead_code)]
mod targets;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use gpumem::snapshot::pickle::vm::Unpickler;
use gpumem::snapshot::pickle::{self, Emitted, ReadLimits};
use gpumem::snapshot::SnapshotError;
use serde_pickle::{HashableValue, SerOptions, Value};

mod common;

/// A pickle written opcode by opcode.
#[derive(Default)]
struct Pickle(Vec<u8>);

impl Pickle {
    /// A protocol-4 pickle.
    fn new() -> Pickle {
        Pickle(vec![0x80, 4])
    }

    fn op(mut self, bytes: &[u8]) -> Pickle {
        self.0.extend_from_slice(bytes);
        self
    }

    fn repeat(mut self, bytes: &[u8], times: usize) -> Pickle {
        for _ in 0..times {
            self.0.extend_from_slice(bytes);
        }
        self
    }

    /// A `SHORT_BINUNICODE` string.
    fn text(self, text: &str) -> Pickle {
        let length = u8::try_from(text.len()).expect("short");
        self.op(&[0x8c, length]).op(text.as_bytes())
    }

    /// `{'segments': [], 'device_traces': [` — the caller fills the device list and ends it
    /// with [`Pickle::end_snapshot`].
    fn snapshot_start() -> Pickle {
        Pickle::new()
            .op(b"}(")
            .text("segments")
            .op(b"]")
            .text("device_traces")
            .op(b"](")
    }

    /// `])` then `u.`: closes what [`Pickle::snapshot_start`] opened.
    fn end_snapshot(self) -> Pickle {
        self.op(b"eu.")
    }

    fn bytes(self) -> Vec<u8> {
        self.0
    }
}

/// What reading `bytes` (of known size) under the default limits gives, with its duration.
fn read(bytes: &[u8]) -> (Result<u64, SnapshotError>, Duration) {
    read_under(bytes, ReadLimits::default())
}

fn read_under(bytes: &[u8], limits: ReadLimits) -> (Result<u64, SnapshotError>, Duration) {
    let start = Instant::now();
    let mut events = 0;
    let result = pickle::stream_limited(bytes, limits, Some(bytes.len() as u64), |_| {
        events += 1;
        Ok(())
    })
    .map(|_| events);
    (result, start.elapsed())
}

/// Reading `bytes` is refused by a limit, at an offset inside the file, naming `what`; and
/// the fuzz target's property holds for it (no panic, a consistent allocator).
fn refused_by_limit(name: &str, bytes: &[u8], what: &str) -> u64 {
    let (result, took) = read(bytes);
    assert!(
        took < Duration::from_secs(20),
        "{name}: {took:?} for {} bytes",
        bytes.len()
    );
    let offset = match result {
        Err(SnapshotError::Limit {
            offset, message, ..
        }) => {
            assert!(message.contains(what), "{name}: {message}");
            offset
        }
        other => panic!("{name}: expected a limit naming {what:?}, got {other:?}"),
    };
    assert!(offset <= bytes.len() as u64, "{name}: offset {offset}");
    targets::snapshot(bytes);
    offset
}

#[test]
fn deep_nesting_is_refused_at_the_depth_limit() {
    // ((((None,),),),...): one byte per level, nothing else held.
    let tuples = Pickle::new()
        .op(b"N")
        .repeat(&[0x85], 1_000_000)
        .op(b".")
        .bytes();
    let offset = refused_by_limit("tuples", &tuples, "nested more than 64 levels");
    assert_eq!(offset, 2 + 1 + 65, "refused at the 65th TUPLE1");
    // [[[...]]] built as N empty lists then N-1 APPENDs.
    let lists = Pickle::new()
        .repeat(b"]", 100)
        .repeat(b"a", 99)
        .op(b".")
        .bytes();
    refused_by_limit("lists", &lists, "nested more than 64 levels");
    // {'k': {'k': ...}} inside a snapshot's trace list, through SETITEM.
    let mut dicts = Pickle::snapshot_start().op(b"]");
    for _ in 0..100 {
        dicts = dicts.op(b"}").text("k");
    }
    let dicts = dicts
        .op(b"N")
        .repeat(b"s", 100)
        .op(b"a")
        .end_snapshot()
        .bytes();
    refused_by_limit("dicts", &dicts, "nested more than 64 levels");
    // The whole-file reader (`pickle::load`) has the same limit.
    let dir = common::scratch("limits-deep");
    let path = dir.join("tuples.pickle");
    std::fs::write(&path, &tuples).expect("write");
    match pickle::load(&path) {
        Err(SnapshotError::Limit { message, .. }) => {
            assert!(message.contains("nested more than 64 levels"), "{message}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_four_megabyte_file_that_overflowed_the_stack_is_refused() {
    // Issue 21's crash: 2,000,000 empty lists each appended to the one before (exit 134 before
    // the limits). Now refused, here by the memory allowance before the depth limit is reached.
    let bytes = Pickle::new()
        .repeat(b"]", 2_000_000)
        .repeat(b"a", 1_999_999)
        .op(b".")
        .bytes();
    assert_eq!(bytes.len(), 4_000_002);
    refused_by_limit("deep lists", &bytes, "limit");
}

#[test]
fn declared_lengths_past_the_end_are_refused_before_allocating() {
    let cases: [(&str, Vec<u8>); 8] = [
        (
            "BINUNICODE",
            [b"X".as_slice(), &u32::MAX.to_le_bytes()].concat(),
        ),
        (
            "BINUNICODE8",
            [[0x8d].as_slice(), &(u64::MAX / 3).to_le_bytes()].concat(),
        ),
        (
            "BINSTRING",
            [b"T".as_slice(), &u32::MAX.to_le_bytes()].concat(),
        ),
        (
            "BINBYTES",
            [b"B".as_slice(), &u32::MAX.to_le_bytes()].concat(),
        ),
        (
            "BINBYTES8",
            [[0x8e].as_slice(), &u64::MAX.to_le_bytes()].concat(),
        ),
        (
            "LONG4",
            [[0x8b].as_slice(), &u32::MAX.to_le_bytes()].concat(),
        ),
        ("SHORT_BINUNICODE", vec![0x8c, 255]),
        ("SHORT_BINBYTES", vec![b'C', 200]),
    ];
    for (name, opcode) in cases {
        let bytes = Pickle::new().op(&opcode).op(b"abc.").bytes();
        let offset = refused_by_limit(name, &bytes, "bytes are left in the file");
        assert_eq!(
            offset,
            bytes.len() as u64 - 4,
            "{name}: the argument's first byte"
        );
        // Of unknown size (a stream), the same bytes read what is there and end early.
        let result = pickle::stream(&bytes[..], |_| Ok(()));
        match result {
            Err(SnapshotError::Corrupt { message, .. }) => {
                assert!(message.contains("ends early"), "{name}: {message}")
            }
            other => panic!("{name}: {other:?}"),
        }
    }
}

#[test]
fn memo_floods_are_refused_by_the_memo_or_memory_limits() {
    // One string memoized under 8,000,000 ids (40 MB): the memo keeps the string once, but
    // its ids' slots outgrow the allowance.
    let mut flood = Pickle::new().text("x");
    for id in 0..8_000_000_u32 {
        flood = flood.op(b"r").op(&id.to_le_bytes());
    }
    let flood = flood.op(b".").bytes();
    refused_by_limit("memo flood", &flood, "bytes of memory");
    // Under a small memo limit, the count is what refuses it.
    let limits = ReadLimits {
        max_memo_entries: 1000,
        ..ReadLimits::default()
    };
    match read_under(&flood, limits).0 {
        Err(SnapshotError::Limit {
            offset, message, ..
        }) => {
            assert!(message.contains("more than 1000 values"), "{message}");
            assert_eq!(offset, 2 + 3 + 5 * 1001);
        }
        other => panic!("{other:?}"),
    }
    // The same id over and over replaces its entry: nothing accumulates.
    let same = Pickle::new()
        .text("x")
        .repeat(b"q\x07", 500_000)
        .op(b".")
        .bytes();
    assert!(matches!(read(&same).0, Err(SnapshotError::NotASnapshot(_))));
}

/// `[L, L]` where L is the list before, `levels` times, each level memoized once complete and
/// popped: 2^levels lists if the sharing were copied out.
fn doubling_lists(levels: u8) -> Vec<u8> {
    let mut bytes = Pickle::new().op(b"]").op(&[0x94]).op(b"0");
    for level in 0..levels {
        bytes = bytes
            .op(b"(h")
            .op(&[level])
            .op(b"h")
            .op(&[level])
            .op(b"l")
            .op(&[0x94])
            .op(b"0");
    }
    bytes.op(b"h").op(&[levels]).op(b".").bytes()
}

#[test]
fn shared_and_self_referencing_structures_stay_small() {
    // A list that holds itself (`l = []; l.append(l)`): the reader sees an elided reference,
    // not a cycle.
    let cycle = Pickle::new().op(b"]q\x00h\x00a.").bytes();
    assert!(matches!(
        read(&cycle).0,
        Err(SnapshotError::NotASnapshot(_))
    ));
    // 60 levels of doubling: a streaming read keeps shared containers elided.
    let laughs = doubling_lists(60);
    let (result, took) = read(&laughs);
    assert!(
        matches!(result, Err(SnapshotError::NotASnapshot(_))),
        "{result:?}"
    );
    assert!(took < Duration::from_secs(2), "{took:?}");
    targets::snapshot(&laughs);
    // Reading the whole file resolves shared containers by copying them: refused by the work
    // (or memory) allowance long before 2^60 copies.
    let dir = common::scratch("limits-laughs");
    for (name, bytes) in [("laughs", &laughs), ("cycle", &cycle)] {
        let path = dir.join(format!("{name}.pickle"));
        std::fs::write(&path, bytes).expect("write");
        let start = Instant::now();
        let result = pickle::load(&path);
        assert!(start.elapsed() < Duration::from_secs(10), "{name}");
        match (name, result) {
            ("cycle", Ok(_)) => {}
            ("laughs", Err(SnapshotError::Limit { message, .. })) => {
                assert!(message.contains("limit"), "{message}")
            }
            (name, other) => panic!("{name}: {other:?}"),
        }
    }
    // DUP of a growing tuple: the copies are charged too.
    let dups = Pickle::new()
        .op(b"N")
        .repeat(&[b'2', 0x86], 60)
        .op(b".")
        .bytes();
    let (result, took) = read(&dups);
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert!(
        matches!(result, Err(SnapshotError::Limit { .. })),
        "{result:?}"
    );
}

#[test]
fn every_truncation_of_a_pytorch_snapshot_is_refused_cleanly() {
    let bytes = std::fs::read(common::tests_path(
        "fixtures/pytorch-walkthrough-snapshot.pickle",
    ))
    .expect("fixture");
    assert!(read(&bytes).0.is_ok());
    for end in 0..bytes.len() {
        let prefix = &bytes[..end];
        match read(prefix).0 {
            Err(SnapshotError::Corrupt {
                offset, message, ..
            }) => {
                assert!(message.contains("ends early"), "{end}: {message}");
                assert!(offset <= end as u64, "{end}: {offset}");
            }
            Err(SnapshotError::Limit {
                offset, message, ..
            }) => {
                assert!(message.contains("bytes are left"), "{end}: {message}");
                assert!(offset <= end as u64, "{end}: {offset}");
            }
            other => panic!("{end} of {} bytes: {other:?}", bytes.len()),
        }
        // The replay's property (a consistent allocator after a refusal mid-trace) on a sample
        // of the prefixes: the read above is what differs from one byte to the next.
        if end % 16 == 0 {
            targets::snapshot(prefix);
        }
    }
}

#[test]
fn every_truncation_of_each_writers_form_is_refused_cleanly() {
    // The other writers' layouts go other ways through the reader: the C++ TorchScript
    // pickler (memo after completion, empty MARK batches), 2.0's history blocks (the generic
    // path), XPU's 9-byte LONG1 addresses, protocol 5's frames, pinned host memory.
    let forms = common::tests_path("replay/fixtures/forms");
    for file in [
        "cpp-torchscript.pickle",
        "v2.0-history.pickle",
        "v2.10-xpu.pickle",
        "v2.11-python3.14-protocol-5.pickle",
        "v2.13-host-annotate.pickle",
    ] {
        let bytes = std::fs::read(forms.join(file)).expect("fixture");
        assert!(read(&bytes).0.is_ok(), "{file}");
        for end in 0..bytes.len() {
            let prefix = &bytes[..end];
            match read(prefix).0 {
                Err(
                    SnapshotError::Corrupt { offset, .. } | SnapshotError::Limit { offset, .. },
                ) => {
                    assert!(offset <= end as u64, "{file} cut at {end}: offset {offset}")
                }
                other => panic!("{file} cut at {end} of {} bytes: {other:?}", bytes.len()),
            }
            targets::snapshot(prefix);
        }
    }
}

fn key(name: &str) -> HashableValue {
    HashableValue::String(name.into())
}

fn dict(entries: Vec<(&str, Value)>) -> Value {
    Value::Dict(
        entries
            .into_iter()
            .map(|(name, value)| (key(name), value))
            .collect::<BTreeMap<_, _>>(),
    )
}

fn frame() -> Value {
    dict(vec![
        ("name", Value::String("step".into())),
        ("filename", Value::String("train.py".into())),
        ("line", Value::I64(7)),
    ])
}

fn event(action: &str, addr: i64, size: i64) -> Value {
    dict(vec![
        ("action", Value::String(action.into())),
        ("addr", Value::I64(addr)),
        ("size", Value::I64(size)),
        ("stream", Value::I64(0)),
        ("time_us", Value::I64(1)),
        ("compile_context", Value::String("N/A".into())),
        ("user_metadata", Value::String(String::new())),
        ("frames", Value::List(vec![frame()])),
    ])
}

/// A small, valid 2.11-style snapshot: one segment with two blocks, a trace that fills it.
fn valid_snapshot() -> Value {
    let block = |address: i64, size: i64, state: &str| {
        dict(vec![
            ("address", Value::I64(address)),
            ("size", Value::I64(size)),
            ("requested_size", Value::I64(size)),
            ("state", Value::String(state.into())),
            ("frames", Value::List(vec![frame()])),
        ])
    };
    let segment = dict(vec![
        ("device", Value::I64(0)),
        ("address", Value::I64(1 << 21)),
        ("total_size", Value::I64(2 << 20)),
        ("allocated_size", Value::I64(512)),
        ("active_size", Value::I64(512)),
        ("requested_size", Value::I64(512)),
        ("stream", Value::I64(0)),
        ("segment_type", Value::String("small".into())),
        (
            "segment_pool_id",
            Value::Tuple(vec![Value::I64(0), Value::I64(0)]),
        ),
        ("is_expandable", Value::Bool(false)),
        ("frames", Value::List(Vec::new())),
        (
            "blocks",
            Value::List(vec![
                block(1 << 21, 512, "active_allocated"),
                block((1 << 21) + 512, (2 << 20) - 512, "inactive"),
            ]),
        ),
    ]);
    let divisions = dict(
        [
            "1", "2", "4", "8", "16", "32", "64", "128", "256", "512", "1024", "2048", "4096",
            "8192", "16384", "32768",
        ]
        .iter()
        .map(|name| (*name, Value::I64(0)))
        .collect(),
    );
    let settings = dict(vec![
        ("PYTORCH_CUDA_ALLOC_CONF", Value::String(String::new())),
        ("max_split_size", Value::I64(-1)),
        ("garbage_collection_threshold", Value::F64(0.0)),
        ("expandable_segments", Value::Bool(false)),
        ("pinned_num_register_threads", Value::I64(1)),
        ("release_lock_on_cudamalloc", Value::Bool(false)),
        ("pinned_use_cuda_host_register", Value::Bool(false)),
        ("graph_capture_record_stream_reuse", Value::Bool(false)),
        ("roundup_power2_divisions", divisions),
    ]);
    let trace = vec![
        event("segment_alloc", 1 << 21, 2 << 20),
        event("alloc", 1 << 21, 512),
        event("alloc", (1 << 21) + 512, 512),
        event("free_requested", (1 << 21) + 512, 512),
        event("free_completed", (1 << 21) + 512, 512),
        event("snapshot", 0, 512),
    ];
    dict(vec![
        ("segments", Value::List(vec![segment])),
        ("device_traces", Value::List(vec![Value::List(trace)])),
        ("allocator_settings", settings),
        ("external_annotations", Value::List(Vec::new())),
    ])
}

/// Every path to a field in `value` (dict keys, list and tuple positions), depth first.
fn field_paths(value: &Value, path: &mut Vec<PathStep>, out: &mut Vec<Vec<PathStep>>) {
    match value {
        Value::Dict(entries) => {
            for (k, v) in entries {
                if let HashableValue::String(name) = k {
                    path.push(PathStep::Key(name.clone()));
                    out.push(path.clone());
                    field_paths(v, path, out);
                    path.pop();
                }
            }
        }
        Value::List(items) | Value::Tuple(items) => {
            for (index, item) in items.iter().enumerate() {
                path.push(PathStep::Index(index));
                out.push(path.clone());
                field_paths(item, path, out);
                path.pop();
            }
        }
        _ => {}
    }
}

#[derive(Debug, Clone)]
enum PathStep {
    Key(String),
    Index(usize),
}

/// `value` with the field at `path` replaced by `with`.
fn replaced(value: &Value, path: &[PathStep], with: &Value) -> Value {
    let Some((first, rest)) = path.split_first() else {
        return with.clone();
    };
    match (value, first) {
        (Value::Dict(entries), PathStep::Key(name)) => {
            let mut entries = entries.clone();
            if let Some(inner) = entries.get_mut(&key(name)) {
                *inner = replaced(inner, rest, with);
            }
            Value::Dict(entries)
        }
        (Value::List(items), PathStep::Index(index)) => {
            let mut items = items.clone();
            items[*index] = replaced(&items[*index], rest, with);
            Value::List(items)
        }
        (Value::Tuple(items), PathStep::Index(index)) => {
            let mut items = items.clone();
            items[*index] = replaced(&items[*index], rest, with);
            Value::Tuple(items)
        }
        _ => value.clone(),
    }
}

#[test]
fn wrong_types_in_every_field_are_refused_or_replayed_consistently() {
    let snapshot = valid_snapshot();
    let bytes = serde_pickle::value_to_vec(&snapshot, SerOptions::new()).expect("pickles");
    assert_eq!(read(&bytes).0.ok(), Some(6), "the valid snapshot reads");
    let wrong = [
        Value::None,
        Value::String("x".into()),
        Value::I64(-3),
        Value::F64(0.5),
        Value::Bool(true),
        Value::List(vec![Value::I64(1)]),
        Value::Dict(BTreeMap::new()),
        Value::Tuple(Vec::new()),
        Value::Bytes(vec![1, 2]),
        Value::I64(i64::MIN),
    ];
    let mut paths = Vec::new();
    field_paths(&snapshot, &mut Vec::new(), &mut paths);
    assert!(paths.len() > 100, "{} fields", paths.len());
    let (mut refused, mut read_fine) = (0, 0);
    for path in &paths {
        for with in &wrong {
            let changed = replaced(&snapshot, path, with);
            let bytes = serde_pickle::value_to_vec(&changed, SerOptions::new()).expect("pickles");
            targets::snapshot(&bytes);
            match read(&bytes).0 {
                Ok(_) => read_fine += 1,
                Err(
                    SnapshotError::NotASnapshot(message)
                    | SnapshotError::Event { message, .. }
                    | SnapshotError::Corrupt { message, .. },
                ) => {
                    assert!(!message.is_empty(), "{path:?}");
                    refused += 1;
                }
                Err(other) => panic!("{path:?} = {with:?}: {other}"),
            }
        }
    }
    assert!(
        refused > 0 && read_fine > 0,
        "{refused} refused, {read_fine} read"
    );
}

/// Reads `bytes` to the end and returns the most memory the reader held, by its accounting.
fn peak_held(name: &str, bytes: &[u8]) -> u64 {
    let mut unpickler = Unpickler::new(bytes, |_: Emitted| -> Result<(), ()> { Ok(()) })
        .with_limits(ReadLimits::default(), Some(bytes.len() as u64));
    assert!(unpickler.run().is_ok(), "{name}");
    let budget = unpickler.budget();
    println!(
        "{name}: {} bytes, {} held at most ({:.2} per byte), {} units of work",
        bytes.len(),
        budget.peak(),
        budget.peak() as f64 / bytes.len() as f64,
        budget.spent()
    );
    budget.peak()
}

#[test]
fn pytorchs_snapshots_use_a_small_part_of_their_allowance() {
    // PyTorch 2.11's files (tests/replay/fixtures): what the reader holds at most is the memo of
    // their distinct strings, frames and stacks (a short run's file is mostly those), well
    // inside the allowance's 32 MiB base.
    let dir = common::tests_path("replay/fixtures");
    for name in [
        "convnet.default",
        "convnet.expandable",
        "transformer_bf16.default",
        "inference.expandable",
    ] {
        let bytes = std::fs::read(dir.join(format!("{name}.pickle"))).expect("fixture");
        let peak = peak_held(name, &bytes);
        assert!(peak < 4 << 20, "{name}: {peak} bytes held");
    }
}

#[test]
fn a_long_trace_holds_no_more_than_a_short_one() {
    // The same three events over and over, with their frames written out each time (as
    // serde-pickle writes them, without a memo): memory follows the distinct stacks, not the
    // events.
    let trace = |repeats: usize| {
        let mut events = Vec::new();
        for round in 0..repeats {
            let addr = (1 << 21) + 512 * (round as i64 % 1000);
            events.push(event("alloc", addr, 512));
            events.push(event("free_requested", addr, 512));
            events.push(event("free_completed", addr, 512));
        }
        let snapshot = dict(vec![
            ("segments", Value::List(Vec::new())),
            ("device_traces", Value::List(vec![Value::List(events)])),
        ]);
        serde_pickle::value_to_vec(&snapshot, SerOptions::new()).expect("pickles")
    };
    let short = peak_held("1,000 events", &trace(333));
    let long = peak_held("100,000 events", &trace(33_333));
    assert!(long < short + (64 << 10), "{short} then {long}");
}
