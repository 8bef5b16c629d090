//! A trace that starts mid-run (PyTorch's ring buffer kept only the last `max_entries`
//! events): each real H200 recording, cut down to its last N events with its end-state
//! `segments` kept, replays from the state rebuilt at the cut to PyTorch's final counters —
//! every current value exactly, every peak at most PyTorch's (a window cannot see peaks before
//! it; the peak of bytes in free split pieces within the unsplit tails the rebuilt sizes may
//! miss), every total equal to what the window's events add up to — with the same segment
//! events and an end state equal to the file's.

use std::path::PathBuf;

use gpumem::alloc::{AllocConf, CachingAllocator, MIB};
use gpumem::device::sim::SimDevice;
use gpumem::snapshot::model::{int, TraceEvent};
use gpumem::snapshot::replay::report::StatScope;
use gpumem::snapshot::replay::seed::Layout;
use gpumem::snapshot::replay::{replay, ReplayOptions, ReplayReport};
use gpumem::snapshot::{capture, pickle, AllocatorSettings, Snapshot};
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
    // Its fit covers the window only, and says so: what came before is not in the file.
    let verdict = report.verdict();
    assert!(verdict.window_only, "{label}\n{report}");
    assert!(
        verdict.text.contains("for the trace's window only"),
        "{label}: {}",
        verdict.text
    );
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
    // PyTorch counts a free when it is requested (`free()` lowers `allocation` and
    // `allocated_bytes` before a `record_stream` block waits for its events).
    assert_eq!(
        report.stat("allocation.all.freed"),
        window(&["free_requested"]),
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
    assert!(!report.verdict().window_only);
    assert!(
        report.end_state.matches(),
        "{:?}",
        report.end_state.first_difference
    );
    assert_eq!(report.end_state.recorded, report.end_state.equal);
    assert!(report.to_json().get("final_stats_scope").is_none());
}

/// The simulated device of the recording below.
const RING_TOTAL: u64 = 16 << 30;

/// A side stream (a `cudaStream_t` value in a real trace).
const SIDE: u64 = 0x5555_0000;

/// A prefetch step whose batch, used on the default stream (`record_stream`), is dropped
/// while that work runs, then two activations made and dropped; a sync and a malloc complete
/// the batch's free. Returns how many trace entries the history held once both activations
/// were made.
fn prefetch_step(allocator: &mut CachingAllocator) -> usize {
    let batch = allocator.malloc_on(SIDE, 64 * MIB).expect("batch");
    allocator.record_stream(batch, 0).expect("record_stream");
    allocator.device_mut().sleep(0, 5).expect("compute");
    allocator
        .free(batch)
        .expect("drop the batch while compute runs");
    let first = allocator.malloc(48 * MIB).expect("activation");
    let second = allocator.malloc(48 * MIB).expect("activation");
    let before_window = allocator.trace().entries().len();
    allocator.free(first).expect("free");
    allocator.free(second).expect("free");
    allocator.synchronize_device().expect("loss.item()");
    let next = allocator
        .malloc(8 * MIB)
        .expect("completes the batch's free");
    allocator.free(next).expect("free");
    before_window
}

/// A recording of [`prefetch_step`] keeping the last `max_entries` trace entries.
fn prefetch_recording(max_entries: usize) -> (CachingAllocator, usize) {
    let mut allocator =
        CachingAllocator::new(Box::new(SimDevice::new(RING_TOTAL)), AllocConf::default())
            .expect("allocator");
    allocator.set_history_clock(|| 1);
    allocator.record_history(true, max_entries);
    let before_window = prefetch_step(&mut allocator);
    (allocator, before_window)
}

/// A ring that wrapped between a `record_stream` block's `free_requested` and its
/// `free_completed` (special.ring_prefetch of tests/gpu/whatif): the rebuilt start holds the
/// block as a pending free, which PyTorch no longer counted as allocated, so the window's
/// `allocation` peak is the two activations, never three.
#[test]
fn a_ring_wrapped_inside_a_deferred_free_does_not_count_it_allocated() {
    let (whole, before_window) = prefetch_recording(usize::MAX);
    let window = whole.trace().entries().len() - before_window;
    let (recording, _) = prefetch_recording(window);
    let entries = recording.trace().entries();
    assert_eq!(entries.len(), window);
    let device_traces = vec![entries
        .iter()
        .map(|entry| TraceEvent {
            action: entry.action,
            addr: int(entry.addr),
            size: int(entry.size),
            stream: int(entry.stream),
            time_us: entry.time_us,
            compile_context: "N/A".into(),
            user_metadata: String::new(),
            frames: Vec::new(),
        })
        .collect()];
    let snapshot = Snapshot {
        segments: capture::segments(&recording, 0, &|_| Vec::new()),
        device_traces,
        allocator_settings: AllocatorSettings::from_conf(recording.config()),
        external_annotations: Vec::new(),
    };
    let path = common::scratch("ring-deferred").join("run.pickle");
    pickle::dump(&path, &snapshot).expect("dump");
    let options = ReplayOptions {
        capacity: Some(RING_TOTAL),
        ..ReplayOptions::default()
    };
    let report = replay(&path, &options, &mut |_, _| {}).expect("replays");
    let start = report.start.expect("starts mid-run");
    assert_eq!(start.figures.blocks, 3, "the batch and two activations");
    let stats = recording.stats();
    assert_eq!(stats.allocation.all.peak, 2);
    assert_eq!(report.stat("allocation.all.peak"), 2, "{report}");
    assert_eq!(
        report.stat("allocated_bytes.all.peak"),
        int(96 * MIB),
        "{report}"
    );
    assert_eq!(report.stat("allocation.all.current"), 0);
    assert_eq!(report.counts.pending_frees, 0);
}
