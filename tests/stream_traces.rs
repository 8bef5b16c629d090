//! The two-stream traces recorded from PyTorch 2.11 (tests/fixtures/pytorch-traces/*streams*)
//! replayed as scripts, through the stream bindings: the recording's second-stream allocations
//! are made inside `with_stream(side, ...)`, and every recorded counter after every op must
//! equal PyTorch's. tests/pytorch_traces.rs replays the same traces on the allocator directly;
//! tests/gpu/traces.py writes the same scripts and runs them on a GPU (`traces-cuda`).

use std::collections::BTreeMap;
use std::io::Read;

use serde_json::Value;

mod common;

fn fixture(name: &str) -> Value {
    let path = common::tests_path(&format!("fixtures/pytorch-traces/{name}"));
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(&path).expect("fixture readable"))
        .read_to_string(&mut text)
        .expect("fixture decompresses");
    serde_json::from_str(&text).expect("fixture is JSON")
}

/// The script tests/gpu/traces.py writes for `fixture`: 12 slots, the ops in order, the
/// counters printed after each (`S trace op {json}`) and each allocation's outcome
/// (`A trace op ok|oom`).
fn script_for(fixture: &Value) -> String {
    let empty_slots = "[(), (), (), (), (), (), (), (), (), (), (), ()]";
    let mut lines = vec![
        format!("let slots = {empty_slots};"),
        "let side = stream();".into(),
    ];
    let fraction = fixture["memory_fraction"]
        .as_f64()
        .expect("memory_fraction");
    if fraction < 1.0 {
        lines.push(format!("set_per_process_memory_fraction({fraction:?});"));
    }
    for (t, trace) in fixture["traces"]
        .as_array()
        .expect("traces")
        .iter()
        .enumerate()
    {
        lines.push(format!("slots = {empty_slots};"));
        lines.push("synchronize(); empty_cache(); reset_peak_memory_stats();".into());
        lines.push("reset_accumulated_memory_stats();".into());
        for (i, step) in trace["ops"].as_array().expect("ops").iter().enumerate() {
            let op = step["op"].as_array().expect("op");
            match op[0].as_str().expect("op name") {
                "alloc" => {
                    let mut make = format!("empty({}, \"uint8\")", op[2]);
                    if op[3..].iter().any(|mark| mark == "stream1") {
                        make = format!("with_stream(side, || {make})");
                    }
                    lines.push(format!(
                        "try {{ slots[{}] = {make}; print(\"A {t} {i} ok\"); }} catch (e) {{ print(\"A {t} {i} oom\"); }}",
                        op[1]
                    ));
                }
                "free" => lines.push(format!("slots[{}] = ();", op[1])),
                _ => lines.push("empty_cache();".into()),
            }
            lines.push(format!("print(\"S {t} {i} \" + memory_stats().to_json());"));
        }
    }
    lines.join("\n") + "\n"
}

/// Runs `name` as a script on a simulated H200 under its config; returns the mismatches.
fn replay(name: &str) -> Vec<String> {
    let fixture = fixture(name);
    assert!(
        fixture["streams"].as_bool() == Some(true),
        "{name} has a second stream"
    );
    assert!(
        fixture["per_trace_counters"]
            .as_str()
            .is_some_and(|text| text.starts_with("all")),
        "recorded fixtures reset their counters at each trace start"
    );
    let total = fixture["total_memory"].as_u64().expect("total_memory");
    let conf = fixture["alloc_conf"].as_str().expect("alloc_conf");
    let (host, printed) = common::sim_host(Some(total), conf);
    host.run_source(name, &script_for(&fixture))
        .unwrap_or_else(|error| panic!("{name}: {error}"));
    let printed = printed.borrow();
    let mut stats: BTreeMap<(usize, usize), Value> = BTreeMap::new();
    let mut outcomes: BTreeMap<(usize, usize), &str> = BTreeMap::new();
    for line in printed.lines() {
        let mut parts = line.splitn(4, ' ');
        let kind = parts.next();
        let t: usize = parts.next().and_then(|t| t.parse().ok()).expect("trace");
        let i: usize = parts.next().and_then(|i| i.parse().ok()).expect("op");
        let rest = parts.next().expect("rest");
        match kind {
            Some("S") => {
                stats.insert((t, i), serde_json::from_str(rest).expect("stats JSON"));
            }
            Some("A") => {
                outcomes.insert((t, i), rest);
            }
            other => panic!("unexpected line {other:?}"),
        }
    }
    let mut mismatches = Vec::new();
    for (t, trace) in fixture["traces"]
        .as_array()
        .expect("traces")
        .iter()
        .enumerate()
    {
        for (i, step) in trace["ops"].as_array().expect("ops").iter().enumerate() {
            let op = &step["op"];
            let at = format!("{name} trace {t} op {i} {op}");
            if op[0] == "alloc" {
                let expected = if op.as_array().and_then(|o| o.last()) == Some(&"oom".into()) {
                    "oom"
                } else {
                    "ok"
                };
                if outcomes.get(&(t, i)).copied() != Some(expected) {
                    mismatches.push(format!(
                        "{at}: {:?}, PyTorch {expected}",
                        outcomes.get(&(t, i))
                    ));
                }
            }
            let got = &stats[&(t, i)];
            for (key, want) in step["stats"].as_object().expect("stats") {
                if &got[key] != want {
                    mismatches.push(format!("{at} {key}: gpumem {}, PyTorch {want}", got[key]));
                }
            }
        }
    }
    mismatches
}

fn check(name: &str) {
    let mismatches = replay(name);
    assert!(
        mismatches.is_empty(),
        "{} mismatches, first ones:\n{}",
        mismatches.len(),
        mismatches[..mismatches.len().min(12)].join("\n")
    );
}

#[test]
fn two_streams_as_a_script() {
    check("traces_default_streams.json.gz");
}

#[test]
fn two_streams_without_a_memory_fraction_as_a_script() {
    check("traces_default_streams_addr.json.gz");
}

#[test]
fn expandable_segments_on_two_streams_as_a_script() {
    check("traces_expandable_streams.json.gz");
}
