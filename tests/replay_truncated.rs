//! A trace that starts mid-run (PyTorch's ring buffer kept only the last `max_entries`
//! events): each real H200 recording, cut down to its last N events with its end-state
//! `segments` kept, replays from the state rebuilt at the cut to PyTorch's final counters —
//! every current value exactly, every peak at most PyTorch's (a window cannot see peaks before
//! it; the peak of bytes in free split pieces within the unsplit tails the rebuilt sizes may
//! miss), every total equal to what the window's events add up to — with the same segment
//! events and an end state equal to the file's.

use std::path::PathBuf;

use gpumem::snapshot::replay::report::StatScope;
use gpumem::snapshot::replay::seed::Layout;
use gpumem::snapshot::replay::{replay, ReplayOptions, ReplayReport};
use serde_json::Value;

mod common;
mod replay_files;

fn expected(name: &str) -> Value {
    let path = common::tests_path(&format!("replay/fixtures/{name}.json"));
    serde_json::from_str(&std::fs::read_to_string(path).expect("json")).expect("JSON")
}

/// The fixture cut to its last `keep` events, replayed on the recorded device.
fn cut(name: &str, keep: usize) -> (ReplayReport, Value, PathBuf) {
    let dir = common::scratch("truncated");
    let path = replay_files::write(
        &dir,
        &format!("{name}.last{keep}.pickle"),
        &replay_files::truncated(name, keep),
    );
    let json = expected(name);
    let options = ReplayOptions {
        capacity: json["total_memory"].as_u64(),
        ..ReplayOptions::default()
    };
    let report = replay(&path, &options, &mut |_, _| {}).expect("replays");
    (report, json, path)
}

/// The window's own count of `actions` in the cut trace.
fn window_count(name: &str, keep: usize, actions: &[&str]) -> i64 {
    let mut top = replay_files::fixture_values(name);
    let trace = replay_files::trace_of(&mut top);
    let cut = trace.len().saturating_sub(keep);
    trace[cut..]
        .iter()
        .filter(|event| actions.contains(&replay_files::action_of(event).as_str()))
        .count() as i64
}

fn check(name: &str, keep: usize) {
    let (report, json, _) = cut(name, keep);
    let label = format!("{name} (last {keep} events)");
    let start = report
        .start
        .unwrap_or_else(|| panic!("{label}: starts mid-run\n{report}"));
    assert_eq!(start.layout, Layout::Exact, "{label}\n{report}");
    assert!(report.fits(), "{label}\n{report}");
    let stats = json["memory_stats"].as_object().expect("memory_stats");
    let mut wrong = Vec::new();
    for (key, pytorch) in stats {
        let pytorch = pytorch.as_i64().expect("integer");
        let gpumem = report.stat(key);
        let ok = match StatScope::of(key) {
            StatScope::Exact => gpumem == pytorch,
            StatScope::WindowPeak => gpumem <= pytorch,
            StatScope::EstimatedWindowPeak => {
                gpumem <= pytorch + (start.figures.freed_by_trace << 20) as i64
            }
            StatScope::WindowTotal => true,
        };
        if !ok {
            wrong.push(format!(
                "{key} ({:?}): PyTorch {pytorch}, gpumem {gpumem}",
                StatScope::of(key)
            ));
        }
    }
    assert!(wrong.is_empty(), "{label}:\n{}\n{report}", wrong.join("\n"));
    let window = |actions: &[&str]| window_count(name, keep, actions);
    assert_eq!(
        report.stat("allocation.all.allocated"),
        window(&["alloc"]),
        "{label}"
    );
    assert_eq!(
        report.stat("allocation.all.freed"),
        window(&["free_completed"]),
        "{label}"
    );
    assert_eq!(
        report.stat("num_device_alloc"),
        window(&["segment_alloc", "segment_map"]),
        "{label}"
    );
    assert_eq!(
        report.stat("num_device_free"),
        window(&["segment_free", "segment_unmap"]),
        "{label}"
    );
    let segments = &report.segment_events;
    assert_eq!(
        segments.differing, 0,
        "{label}: {:?}\n{report}",
        segments.first_difference
    );
    assert!(
        report.end_state.matches(),
        "{label}: {:?}",
        report.end_state.first_difference
    );
    let text = report.to_string();
    assert!(text.contains("trace start     mid-run"), "{text}");
}

fn check_cuts(name: &str) {
    let events = expected(name)["events"].as_u64().map_or(0, |n| n as usize);
    let total = if events > 0 {
        events
    } else {
        replay_files::trace_of(&mut replay_files::fixture_values(name)).len()
    };
    for keep in [total * 3 / 4, total / 2, total / 10, 50, 3] {
        check(name, keep);
    }
}

#[test]
fn convnet_default_cut() {
    check_cuts("convnet.default");
}

#[test]
fn transformer_fp32_default_cut() {
    check_cuts("transformer_fp32.default");
}

#[test]
fn inference_default_cut() {
    check_cuts("inference.default");
}

#[test]
fn transformer_bf16_expandable_cut() {
    check_cuts("transformer_bf16.expandable");
}

#[test]
fn a_whole_trace_starts_from_nothing() {
    let json = expected("convnet.default");
    let path = common::tests_path("replay/fixtures/convnet.default.pickle");
    let options = ReplayOptions {
        capacity: json["total_memory"].as_u64(),
        ..ReplayOptions::default()
    };
    let report = replay(&path, &options, &mut |_, _| {}).expect("replays");
    assert!(report.start.is_none());
    assert!(
        report.end_state.matches(),
        "{:?}",
        report.end_state.first_difference
    );
    assert_eq!(report.end_state.recorded, report.end_state.equal);
    assert!(report.to_json().get("final_stats_scope").is_none());
}
