//! `gpumem replay` on files it cannot replay: each is a clear error on stderr naming what is
//! wrong (and the event index where there is one), exit status 2, never a panic.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_pickle::{HashableValue, SerOptions, Value};

mod common;

fn key(name: &str) -> HashableValue {
    HashableValue::String(name.into())
}

fn event(action: &str, addr: i64, size: i64) -> Value {
    let mut map = BTreeMap::new();
    map.insert(key("action"), Value::String(action.into()));
    map.insert(key("addr"), Value::I64(addr));
    map.insert(key("size"), Value::I64(size));
    map.insert(key("stream"), Value::I64(0));
    map.insert(key("time_us"), Value::I64(1));
    map.insert(key("frames"), Value::List(Vec::new()));
    Value::Dict(map)
}

/// A snapshot whose only device has `events`.
fn snapshot(events: Vec<Value>) -> Vec<u8> {
    let mut top = BTreeMap::new();
    top.insert(key("segments"), Value::List(Vec::new()));
    top.insert(key("device_traces"), Value::List(vec![Value::List(events)]));
    serde_pickle::value_to_vec(&Value::Dict(top), SerOptions::new()).expect("pickles")
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).expect("write");
    path
}

/// Runs `gpumem replay FILE` and checks exit 2, no panic, and `expected` in stderr.
fn refused(path: &Path, expected: &[&str]) -> String {
    let output = common::gpumem(&["replay", path.to_str().expect("utf-8 path")], "");
    let (stdout, stderr, code) = common::outcome(&output);
    assert_eq!(code, 2, "stdout: {stdout}\nstderr: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    for part in expected {
        assert!(stderr.contains(part), "expected {part:?} in: {stderr}");
    }
    stderr
}

fn fixture_bytes() -> Vec<u8> {
    std::fs::read(common::tests_path("replay/fixtures/convnet.default.pickle")).expect("fixture")
}

#[test]
fn a_truncated_pickle_says_where_it_ends() {
    let dir = common::scratch("bad-truncated");
    let bytes = fixture_bytes();
    let path = write(&dir, "half.pickle", &bytes[..bytes.len() / 2]);
    let stderr = refused(
        &path,
        &[
            "half.pickle",
            "ends early",
            "truncated",
            "dump the snapshot again",
            "trace events",
        ],
    );
    assert!(
        stderr.contains(&format!("at byte {}", bytes.len() / 2)),
        "{stderr}"
    );
    let path = write(&dir, "empty.pickle", b"");
    refused(&path, &["ends early", "after 0 trace events"]);
}

#[test]
fn a_corrupted_pickle_is_refused() {
    let dir = common::scratch("bad-corrupt");
    let mut bytes = fixture_bytes();
    let middle = bytes.len() / 3;
    bytes[middle..middle + 64].fill(0xff);
    let path = write(&dir, "corrupt.pickle", &bytes);
    refused(&path, &["corrupt.pickle", "not a readable pickle"]);
    let path = write(&dir, "text.pickle", b"segments,device_traces\n1,2\n");
    refused(&path, &["not a readable pickle"]);
}

#[test]
fn a_pickle_that_is_not_a_snapshot_is_refused() {
    let dir = common::scratch("bad-not-snapshot");
    let list = serde_pickle::value_to_vec(
        &Value::List(vec![Value::I64(1), Value::I64(2)]),
        SerOptions::new(),
    )
    .expect("pickles");
    let path = write(&dir, "list.pickle", &list);
    refused(&path, &["not a PyTorch memory snapshot", "holds a list"]);
    let mut dict = BTreeMap::new();
    dict.insert(key("weights"), Value::List(vec![Value::F64(0.5)]));
    let dict = serde_pickle::value_to_vec(&Value::Dict(dict), SerOptions::new()).expect("pickles");
    let path = write(&dir, "dict.pickle", &dict);
    refused(&path, &["not a PyTorch memory snapshot", "no 'segments'"]);
    // A pickled Python object (`collections.OrderedDict()`, protocol 2).
    let path = write(
        &dir,
        "object.pickle",
        b"\x80\x02ccollections\nOrderedDict\nq\x00)Rq\x01.",
    );
    refused(&path, &["builds a Python object", "GLOBAL"]);
}

#[test]
fn an_unknown_event_kind_names_its_index() {
    let dir = common::scratch("bad-action");
    let bytes = snapshot(vec![
        event("alloc", 4096, 100),
        event("free_requested", 4096, 100),
        event("teleport", 4096, 100),
    ]);
    let path = write(&dir, "action.pickle", &bytes);
    refused(&path, &["event 3:", "unknown action 'teleport'"]);
}

#[test]
fn a_free_of_an_address_never_allocated_names_its_index() {
    let dir = common::scratch("bad-free");
    let bytes = snapshot(vec![
        event("alloc", 4096, 100),
        event("free_requested", 4096, 100),
        event("free_completed", 4096, 100),
        event("free_requested", 8192, 100),
    ]);
    let path = write(&dir, "free.pickle", &bytes);
    refused(
        &path,
        &[
            "event 4:",
            "free_requested of address 0x2000",
            "never allocated",
            "lies in no segment",
            "starts mid-run",
        ],
    );
    let bytes = snapshot(vec![
        event("alloc", 4096, 100),
        event("alloc", 4096, 100),
        event("free_requested", 4096, 100),
        event("free_completed", 4096, 100),
    ]);
    let path = write(&dir, "twice.pickle", &bytes);
    refused(&path, &["event 2:", "already allocated"]);
}

#[test]
fn a_negative_size_is_refused_whatever_the_action() {
    let dir = common::scratch("bad-size");
    for (index, action) in ["free_requested", "segment_alloc", "free_completed"]
        .into_iter()
        .enumerate()
    {
        let mut events = vec![event("alloc", 4096, 512)];
        events.push(event(action, 4096, -5));
        let path = write(&dir, &format!("negative{index}.pickle"), &snapshot(events));
        refused(&path, &["event 2:", "negative size -5"]);
    }
}

#[test]
fn a_field_of_the_wrong_type_names_its_value() {
    let dir = common::scratch("bad-field");
    // 2^64 as a size: pickled with a marker size, whose 8-byte LONG1 is then widened to the
    // 9 bytes of 2^64 (an unframed pickle has no offsets to fix).
    const MARKER: i64 = 0x1122_3344_5566_7788;
    let mut bytes = snapshot(vec![event("alloc", 4096, MARKER)]);
    let mut long1 = vec![0x8a, 8];
    long1.extend_from_slice(&MARKER.to_le_bytes());
    let at = bytes
        .windows(long1.len())
        .position(|window| window == long1.as_slice())
        .expect("the marker is pickled as an 8-byte LONG1");
    let mut two_to_the_64 = vec![0x8a, 9, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    bytes.splice(at..at + long1.len(), two_to_the_64.drain(..));
    let mut text = event("alloc", 8192, 512);
    if let Value::Dict(text) = &mut text {
        text.insert(key("stream"), Value::String("s".into()));
    }
    let path = write(&dir, "wide.pickle", &bytes);
    refused(
        &path,
        &[
            "event 1:",
            "'size' is an int wider than 64 bits, expected an int",
        ],
    );
    let path = write(&dir, "text.pickle", &snapshot(vec![text]));
    refused(
        &path,
        &["event 1:", "'stream' is a str ('s'), expected an int"],
    );
}

#[test]
fn a_trace_without_allocations_or_frees_names_skip_actions() {
    let dir = common::scratch("bad-skip");
    let bytes = snapshot(vec![event("alloc", 4096, 100), event("alloc", 4096, 100)]);
    let path = write(&dir, "no-frees.pickle", &bytes);
    refused(
        &path,
        &[
            "2 allocations but no free",
            "skip_actions",
            "cannot be replayed",
        ],
    );
    let bytes = snapshot(vec![
        event("free_requested", 4096, 100),
        event("free_completed", 4096, 100),
        event("free_requested", 4096, 100),
        event("free_completed", 4096, 100),
    ]);
    let path = write(&dir, "no-allocs.pickle", &bytes);
    refused(
        &path,
        &["no alloc event", "skip_actions leaving out 'alloc'"],
    );
}

#[test]
fn a_missing_file_and_a_cuda_device_are_usage_errors() {
    let output = common::gpumem(&["replay", "no/such/file.pickle"], "");
    let (_, stderr, code) = common::outcome(&output);
    assert_eq!(code, 2);
    assert!(stderr.contains("no/such/file.pickle"), "{stderr}");
    let path = common::tests_path("replay/fixtures/inference.default.pickle");
    let output = common::gpumem(
        &["--device", "cuda", "replay", path.to_str().expect("utf-8")],
        "",
    );
    let (_, stderr, code) = common::outcome(&output);
    assert_eq!(code, 2);
    assert!(stderr.contains("simulated device"), "{stderr}");
}

#[test]
fn the_file_that_overflowed_the_stack_is_refused_with_exit_2() {
    // Issue 21: 2,000,000 empty lists, each appended to the one before (4 MB), aborted
    // `gpumem replay` with a stack overflow (exit 134, no message).
    let dir = common::scratch("bad-deep");
    let mut bytes = vec![0x80, 4];
    bytes.extend(std::iter::repeat_n(b']', 2_000_000));
    bytes.extend(std::iter::repeat_n(b'a', 1_999_999));
    bytes.push(b'.');
    let path = write(&dir, "deep.pickle", &bytes);
    let stderr = refused(&path, &["deep.pickle", "refused at byte", "limit"]);
    assert!(!stderr.contains("overflow"), "{stderr}");
    // Nesting that costs no memory stops at the depth limit, at the byte that went too deep.
    let mut tuples = vec![0x80, 4, b'N'];
    tuples.extend(std::iter::repeat_n(0x85, 100_000));
    tuples.push(b'.');
    let path = write(&dir, "tuples.pickle", &tuples);
    refused(
        &path,
        &["refused at byte 68:", "nested more than 64 levels"],
    );
}

#[test]
fn a_length_longer_than_the_file_is_refused_with_exit_2() {
    let dir = common::scratch("bad-length");
    let mut bytes = vec![0x80, 4, 0x8d];
    bytes.extend_from_slice(&(1_u64 << 40).to_le_bytes());
    bytes.extend_from_slice(b"abc.");
    let path = write(&dir, "long.pickle", &bytes);
    refused(
        &path,
        &[
            "refused at byte 11:",
            "1099511627776 bytes is declared, but only 4 bytes are left",
        ],
    );
}
