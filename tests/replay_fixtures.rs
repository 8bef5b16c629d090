//! Acceptance for `gpumem replay`: each snapshot PyTorch 2.11 recorded on the H200
//! (tests/replay/fixtures/) replayed on the simulated H200 under its recorded config gives
//! every `memory_stats()` value PyTorch had at the end (the .json beside it), and the same
//! sequence of device-level events (`segment_alloc`/`segment_free`, or `segment_map`/
//! `segment_unmap` for expandable segments) in action, size and order, and an end state equal
//! to the file's `segments`.

use std::path::PathBuf;

use gpumem::snapshot::replay::{replay, ConfSource, Placement, ReplayOptions, ReplayReport};
use serde_json::Value;

mod common;

fn fixture(name: &str) -> (PathBuf, Value) {
    let dir = common::tests_path("replay/fixtures");
    let json: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join(format!("{name}.json"))).expect("json"),
    )
    .expect("JSON");
    (dir.join(format!("{name}.pickle")), json)
}

fn replayed(name: &str) -> (ReplayReport, Value) {
    let (path, json) = fixture(name);
    let options = ReplayOptions {
        capacity: json["total_memory"].as_u64(),
        conf: None,
        ..ReplayOptions::default()
    };
    let report = replay(&path, &options, &mut |_, _| {}).expect("replays");
    (report, json)
}

/// Every recorded counter equals gpumem's; returns how many were compared.
fn check_stats(name: &str, report: &ReplayReport, json: &Value) -> usize {
    let stats = json["memory_stats"].as_object().expect("memory_stats");
    let mut wrong = Vec::new();
    for (key, expected) in stats {
        let expected = expected.as_i64().expect("integer");
        let actual = report.stat(key);
        if actual != expected {
            wrong.push(format!("{key}: PyTorch {expected}, gpumem {actual}"));
        }
    }
    assert!(wrong.is_empty(), "{name}:\n{}", wrong.join("\n"));
    assert_eq!(report.final_stats.len(), stats.len(), "{name}: same keys");
    stats.len()
}

fn check_default(name: &str) {
    check(name, &["segment_alloc", "segment_free"]);
}

fn check_expandable(name: &str) {
    check(name, &["segment_map", "segment_unmap"]);
}

fn check(name: &str, device_actions: &[&str]) {
    let (report, json) = replayed(name);
    eprintln!("{report}");
    assert_eq!(report.conf_source, ConfSource::Recorded, "{name}");
    assert!(report.fits(), "{name}");
    check_stats(name, &report, &json);
    let segments = &report.segment_events;
    let recorded: u64 = device_actions
        .iter()
        .map(|action| json["actions"][action].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(segments.recorded, recorded, "{name}");
    assert_eq!(segments.replayed, recorded, "{name}");
    assert_eq!(
        segments.differing, 0,
        "{name}: {:?}",
        segments.first_difference
    );
    let end = &report.end_state;
    assert!(end.matches(), "{name}: {:?}", end.first_difference);
    assert_eq!(end.equal, end.recorded, "{name}");
    assert!(
        report.start.is_none(),
        "{name}: the trace holds the whole run"
    );
    println!(
        "{name}: {} counters equal; {} segment events equal in action, size and order, {} at the same address, {} at the same offset from the first",
        report.final_stats.len(),
        segments.recorded,
        segments.same_address,
        segments.same_offset
    );
}

#[test]
fn convnet_default() {
    check_default("convnet.default");
}

#[test]
fn inference_default() {
    check_default("inference.default");
}

#[test]
fn transformer_fp32_default() {
    check_default("transformer_fp32.default");
}

#[test]
fn transformer_bf16_default() {
    check_default("transformer_bf16.default");
}

#[test]
fn convnet_expandable() {
    check_expandable("convnet.expandable");
}

#[test]
fn inference_expandable() {
    check_expandable("inference.expandable");
}

#[test]
fn transformer_fp32_expandable() {
    check_expandable("transformer_fp32.expandable");
}

#[test]
fn transformer_bf16_expandable() {
    check_expandable("transformer_bf16.expandable");
}

/// Under the simulator's own placement model (addresses as the H200 driver placed them in
/// another process), the counters that do not depend on where segments lie (requested bytes,
/// block counts) still equal PyTorch's; once a best-fit tie breaks the other way, blocks split
/// differently and allocated bytes and segments may drift.
#[test]
fn model_placement_keeps_the_allocation_counters() {
    for name in [
        "convnet.default",
        "inference.default",
        "transformer_fp32.default",
        "transformer_bf16.default",
    ] {
        let (path, json) = fixture(name);
        let options = ReplayOptions {
            capacity: json["total_memory"].as_u64(),
            placement: Placement::Model,
            ..ReplayOptions::default()
        };
        let report = replay(&path, &options, &mut |_, _| {}).expect("replays");
        for prefix in ["requested_bytes", "allocation", "active"] {
            for key in ["all.current", "all.peak", "all.allocated", "all.freed"] {
                let key = format!("{prefix}.{key}");
                assert_eq!(
                    Some(report.stat(&key)),
                    json["memory_stats"][&key].as_i64(),
                    "{name} {key}"
                );
            }
        }
        let segments = &report.segment_events;
        println!(
            "{name} (model placement): {} of {} segment events differ, reserved peak {} (PyTorch {})",
            segments.differing,
            segments.recorded,
            report.stat("reserved_bytes.all.peak"),
            json["memory_stats"]["reserved_bytes.all.peak"]
        );
    }
}

/// A replay that needs nothing the first pass could not know (the trace holds the whole run)
/// is read once; its report is the one a replay of the file already read gives.
#[test]
fn replaying_as_it_reads_gives_the_same_report() {
    use gpumem::snapshot::replay::{read, replay_recording};
    for name in ["convnet.default", "transformer_bf16.expandable"] {
        let (path, json) = fixture(name);
        for conf in [None, Some("max_split_size_mb:64")] {
            let options = ReplayOptions {
                capacity: json["total_memory"].as_u64(),
                conf: conf.map(|text| gpumem::alloc::AllocConf::parse(text).expect("valid")),
                ..ReplayOptions::default()
            };
            let once = replay(&path, &options, &mut |_, _| {}).expect("replays");
            let recording = read(&path, None, &mut |_, _| {}).expect("reads");
            let twice = replay_recording(&path, &recording, &options, &mut |_, _| {}, Vec::new())
                .expect("replays");
            assert_eq!(once, twice, "{name} {conf:?}");
        }
    }
}
