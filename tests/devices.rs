//! Several devices end to end: a snapshot written by `dump_snapshot` holds one trace per device
//! and every device's segments (as PyTorch's does), and the REPL's `:mem` and `:map` show every
//! device in use. The per-device bindings are pinned by tests/golden/devices/.

use std::cell::RefCell;
use std::rc::Rc;

use gpumem::alloc::AllocConf;
use gpumem::device::sim::SimDevice;
use gpumem::script::{Host, PrintSink};
use gpumem::snapshot::pickle::{self, value::Value};
use gpumem::tensor::{Devices, Runtime};

mod common;

/// A host over `count` simulated devices of 8 GiB, device 0 current.
fn host(count: usize) -> Host {
    let runtimes = (0..count)
        .map(|index| {
            Runtime::sim(
                SimDevice::new(8 << 30).numbered(index),
                AllocConf::default(),
            )
            .expect("runtime")
        })
        .collect();
    let printed = Rc::new(RefCell::new(String::new()));
    Host::new(
        Devices::new(runtimes, 0).expect("devices"),
        PrintSink::Buffer(printed),
    )
}

fn list(value: &Value) -> &[Value] {
    match value {
        Value::List(list) => &list.items,
        other => panic!("expected a list, got {}", other.type_name()),
    }
}

fn int(value: &Value, key: &str) -> i64 {
    match value.get(key) {
        Some(Value::Int(v)) => *v,
        _ => panic!("no integer {key}"),
    }
}

fn actions(trace: &Value) -> Vec<(String, i64)> {
    list(trace)
        .iter()
        .map(|event| {
            let action = event
                .get("action")
                .and_then(Value::as_str)
                .expect("an action");
            (action.to_string(), int(event, "size"))
        })
        .collect()
}

#[test]
fn dump_snapshot_writes_one_trace_per_device() {
    let dir = common::scratch("devices-snapshot");
    let path = dir.join("two.pickle");
    let script = format!(
        r#"
        record_memory_history(true);
        let a = empty(1048576, "uint8");
        with_device(1, || {{ let b = empty(3145728, "uint8"); }});
        dump_snapshot("{}");
        "#,
        path.display()
    );
    host(2).run_source("two", &script).expect("runs");
    let snapshot = pickle::load(&path).expect("a readable pickle");
    let traces = list(snapshot.get("device_traces").expect("device_traces"));
    assert_eq!(traces.len(), 2, "one trace per device");
    assert_eq!(
        actions(&traces[0]),
        [
            ("segment_alloc".to_string(), 2097152),
            ("alloc".to_string(), 1048576)
        ]
    );
    assert_eq!(
        actions(&traces[1]),
        [
            ("segment_alloc".to_string(), 20971520),
            ("alloc".to_string(), 3145728),
            ("free_requested".to_string(), 3145728),
            ("free_completed".to_string(), 3145728)
        ]
    );
    let devices: Vec<i64> = list(snapshot.get("segments").expect("segments"))
        .iter()
        .map(|segment| int(segment, "device"))
        .collect();
    assert_eq!(devices, [0, 1], "every device's segments, in device order");
}

#[test]
fn the_repl_shows_every_device_in_use() {
    let input = "let a = empty(1000, \"uint8\");\nlet c = with_device(2, || empty(3000000, \"uint8\"));\n:mem\n:map\n";
    let output = common::gpumem(&["--device", "sim:8GiB,8GiB,8GiB"], input);
    let (stdout, stderr, code) = common::outcome(&output);
    assert_eq!(code, 0, "{stderr}");
    let mem: Vec<&str> = stdout.lines().take(3).collect();
    assert!(
        mem[0].starts_with(
            "sim:0 (current): allocated 1024 bytes, reserved 2.00 MiB, cudaMemGetInfo used"
        ),
        "{stdout}"
    );
    assert!(
        mem[1].starts_with("sim:2: allocated 2.86 MiB, reserved 20.00 MiB, cudaMemGetInfo used"),
        "{stdout}"
    );
    assert_eq!(mem[2], "not in use (no context, nothing reserved): sim:1");
    let map = stdout.lines().skip(3).collect::<Vec<_>>().join("\n");
    assert!(
        map.starts_with("sim:0 (current):\nmemory map: 1 segment, 2 MiB reserved"),
        "{map}"
    );
    assert!(
        map.contains("\nsim:2:\nmemory map: 1 segment, 20 MiB reserved"),
        "{map}"
    );
    assert!(map.ends_with("no segments: sim:1"), "{map}");
}
