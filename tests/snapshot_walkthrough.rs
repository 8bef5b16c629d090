//! gpumem's snapshot of the seed walkthrough (scripts/walkthrough.rhai between
//! `record_memory_history(true)` and `dump_snapshot`) against PyTorch's snapshot of the same
//! steps (tests/fixtures/pytorch-walkthrough-snapshot.pickle): the same keys and value types at
//! every level, the same segments and blocks (sizes, states) and the same trace (actions and
//! sizes, in order). Addresses and frames differ by nature.

use gpumem::snapshot::pickle::{self, value::Value};

mod common;

/// A segment as compared: type, total, allocated, active, requested, blocks (size,
/// requested, state).
type SegmentSummary = (String, i64, i64, i64, i64, Vec<(i64, i64, String)>);

fn load(path: &std::path::Path) -> Value {
    pickle::load(path).expect("a readable pickle")
}

fn kind(value: &Value) -> &'static str {
    value.type_name()
}

fn list(value: &Value) -> &[Value] {
    match value {
        Value::List(list) => &list.items,
        other => panic!("expected a list, got {}", kind(other)),
    }
}

fn get<'a>(value: &'a Value, key: &str) -> &'a Value {
    value.get(key).unwrap_or_else(|| panic!("no key {key}"))
}

fn int(value: &Value, key: &str) -> i64 {
    match get(value, key) {
        Value::Int(v) => *v,
        other => panic!("{key} is a {}", kind(other)),
    }
}

fn text<'a>(value: &'a Value, key: &str) -> &'a str {
    get(value, key)
        .as_str()
        .unwrap_or_else(|| panic!("{key} is not a string"))
}

/// Same keys and value types, recursively; lists compared element by element where both
/// have one. Returns the number of keys compared.
fn same_shape(ours: &Value, theirs: &Value, path: &str) -> usize {
    assert_eq!(kind(ours), kind(theirs), "type at {path}");
    match (ours, theirs) {
        (Value::Dict(a), Value::Dict(b)) => {
            let keys = |entries: &[(Value, Value)]| {
                let mut keys: Vec<String> = entries
                    .iter()
                    .map(|(key, _)| key.as_str().unwrap_or("?").to_string())
                    .collect();
                keys.sort();
                keys
            };
            assert_eq!(keys(a), keys(b), "keys at {path}");
            a.iter()
                .map(|(key, value)| {
                    let name = key.as_str().unwrap_or("?");
                    1 + same_shape(value, get(theirs, name), &format!("{path}.{name}"))
                })
                .sum()
        }
        (Value::List(a), Value::List(b)) => a
            .items
            .iter()
            .zip(&b.items)
            .enumerate()
            .map(|(i, (x, y))| same_shape(x, y, &format!("{path}[{i}]")))
            .sum(),
        (Value::Tuple(a), Value::Tuple(b)) => a
            .iter()
            .zip(b)
            .enumerate()
            .map(|(i, (x, y))| same_shape(x, y, &format!("{path}[{i}]")))
            .sum(),
        _ => 0,
    }
}

#[test]
fn the_walkthrough_snapshot_has_pytorchs_layout_and_content() {
    let dir = common::scratch("walkthrough-snapshot");
    let out = dir.join("gpumem-walkthrough.pickle");
    let walkthrough = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/walkthrough.rhai"),
    )
    .expect("walkthrough");
    let script = format!(
        "record_memory_history(true);\n{walkthrough}\ndump_snapshot(\"{}\");\n",
        out.display()
    );
    let (host, _) = common::sim_host(None, "");
    host.run_source("walkthrough.rhai", &script)
        .expect("the walkthrough runs");

    let ours = load(&out);
    let theirs = load(&common::tests_path(
        "fixtures/pytorch-walkthrough-snapshot.pickle",
    ));
    let compared = same_shape(&ours, &theirs, "snapshot");
    assert!(compared > 100, "only {compared} keys compared");

    // Segments and blocks: sizes and states.
    let segments = |snapshot: &Value| -> Vec<SegmentSummary> {
        list(get(snapshot, "segments"))
            .iter()
            .map(|segment| {
                (
                    text(segment, "segment_type").to_string(),
                    int(segment, "total_size"),
                    int(segment, "allocated_size"),
                    int(segment, "active_size"),
                    int(segment, "requested_size"),
                    list(get(segment, "blocks"))
                        .iter()
                        .map(|block| {
                            (
                                int(block, "size"),
                                int(block, "requested_size"),
                                text(block, "state").to_string(),
                            )
                        })
                        .collect(),
                )
            })
            .collect()
    };
    assert_eq!(segments(&ours), segments(&theirs));

    // The trace: actions and sizes in order.
    let trace = |snapshot: &Value| -> Vec<(String, i64)> {
        list(&list(get(snapshot, "device_traces"))[0])
            .iter()
            .map(|event| (text(event, "action").to_string(), int(event, "size")))
            .collect()
    };
    let (ours_trace, theirs_trace) = (trace(&ours), trace(&theirs));
    assert_eq!(ours_trace, theirs_trace);
    assert_eq!(ours_trace.len(), 33);

    // Every event carries the script line that caused it.
    for event in list(&list(get(&ours, "device_traces"))[0]) {
        let frames = list(get(event, "frames"));
        assert_eq!(frames.len(), 1, "{event:?}");
        assert_eq!(text(&frames[0], "filename"), "walkthrough.rhai");
        assert!(int(&frames[0], "line") > 1);
    }
    assert_eq!(
        get(&ours, "allocator_settings"),
        get(&theirs, "allocator_settings")
    );
}

#[test]
fn memory_history_lists_events_with_pytorchs_keys_and_script_lines() {
    let (host, output) = common::sim_host(None, "");
    host.run_source(
        "history.rhai",
        "let before = memory_history().len();\nrecord_memory_history(true);\nlet x = empty(1000, \"uint8\");\nx = ();\nlet h = memory_history();\nprint(before);\nfor e in h { let f = e.frames[0]; print(`${e.action} ${e.size} ${e.stream} ${f.filename}:${f.line}:${f.name}`); }\nlet keys = h[0].keys(); keys.sort(); print(keys);\nrecord_memory_history(false);\nprint(memory_history().len());\nrecord_memory_history(true, 2);\nlet y = empty(10, \"uint8\"); y = (); let z = empty(20, \"uint8\");\nprint(memory_history().map(|e| e.action));",
    )
    .expect("runs");
    assert_eq!(
        *output.borrow(),
        "0\nsegment_alloc 2097152 0 history.rhai:3:empty\nalloc 1000 0 history.rhai:3:empty\nfree_requested 1000 0 history.rhai:3:empty\nfree_completed 1000 0 history.rhai:3:empty\n[\"action\", \"addr\", \"compile_context\", \"frames\", \"size\", \"stream\", \"time_us\", \"user_metadata\"]\n0\n[\"free_completed\", \"alloc\"]\n"
    );
}
