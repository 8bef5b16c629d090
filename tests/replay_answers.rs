//! `gpumem replay`'s answer to "will my job fit, and if not why?", through the binary: the
//! verdict (never "fits" wrongly), each OOM's cause, the limit a job ran under when the file
//! does not record it, `--fail-on-oom`'s exit status 3, `--compare`'s verdict per config, and
//! `--min-capacity`'s bounds. The snapshots are written by gpumem scripts run here (gpumem's
//! `dump_snapshot` writes PyTorch's format, and a script can run a job under a memory
//! fraction or on a small device, which the file then does not record), or built event by
//! event.

use std::path::{Path, PathBuf};

use serde_json::Value;

mod common;
mod replay_files;

use replay_files::{event, snapshot};

/// Runs the gpumem script `source` in `dir`; it writes `name` there with `dump_snapshot`.
fn recorded_by_script(dir: &Path, name: &str, source: &str) -> PathBuf {
    common::write(dir, "job.rhai", source);
    let output = common::gpumem_in(Some(dir), &["run", "job.rhai"], "");
    let (stdout, stderr, code) = common::outcome(&output);
    assert_eq!(code, 0, "the recording script runs\n{stdout}\n{stderr}");
    dir.join(name)
}

/// A batch-size search under `set_per_process_memory_fraction(0.02)`: 1 GiB of weights,
/// then 4 GiB and 2 GiB of activations fail (two OOMs caught), 1 GiB fits.
const SEARCH: &str = r#"//! device: sim
record_memory_history(true);
set_per_process_memory_fraction(0.02);
let weights = empty(1 << 30, "uint8");
for mib in [4096, 2048, 1024] {
    try {
        let activations = empty(mib << 20, "uint8");
        break;
    } catch (e) {
        print(`batch of ${mib} MiB: OOM`);
    }
}
dump_snapshot("search.pickle");
"#;

/// A job on a 4 GiB device (no fraction): 1 GiB of weights, then 4 GiB fails, 2 GiB fits.
const FULL: &str = r#"//! device: sim:4GiB
record_memory_history(true);
let weights = empty(1 << 30, "uint8");
for mib in [4096, 2048] {
    try {
        let activations = empty(mib << 20, "uint8");
        break;
    } catch (e) {
        print(`batch of ${mib} MiB: OOM`);
    }
}
dump_snapshot("full.pickle");
"#;

/// Fragmentation on a 1 GiB device: 88 blocks of 8 MiB in 44 segments of 20 MiB, every
/// second one freed, then 100 MiB fails with 528 MiB cached in pieces of 12 MiB.
const FRAGMENTED: &str = r#"//! device: sim:1GiB
record_memory_history(true);
let kept = [];
let dropped = [];
for i in 0..44 {
    kept.push(empty(8 << 20, "uint8"));
    dropped.push(empty(8 << 20, "uint8"));
}
dropped = [];
try {
    let big = empty(100 << 20, "uint8");
} catch (e) {
    print("OOM");
}
dump_snapshot("frag.pickle");
"#;

fn replay(args: &[&str]) -> (String, String, i32) {
    let mut all = vec!["replay"];
    all.extend_from_slice(args);
    let output = common::gpumem(&all, "");
    common::outcome(&output)
}

fn replay_json(args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let (stdout, stderr, code) = replay(&all);
    assert_eq!(code, 0, "{stderr}");
    serde_json::from_str(&stdout).expect("one JSON object")
}

fn text(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

#[test]
fn an_empty_history_is_an_error_naming_the_fix() {
    let dir = common::scratch("answers-empty");
    let path = replay_files::write(
        &dir,
        "no-history.pickle",
        &replay_files::without_history("convnet.default"),
    );
    let (stdout, stderr, code) = replay(&[text(&path)]);
    assert_eq!(code, 2, "{stdout}{stderr}");
    assert!(!stdout.contains("fits"), "{stdout}");
    for part in [
        "no trace events",
        "24 segments",
        "torch.cuda.memory._record_memory_history(",
        "_dump_snapshot(",
    ] {
        assert!(stderr.contains(part), "{part:?} in {stderr}");
    }
    let path = replay_files::write(&dir, "nothing.pickle", &snapshot(Vec::new(), Vec::new()));
    let (_, stderr, code) = replay(&[text(&path), "--fail-on-oom"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("_record_memory_history"), "{stderr}");
}

#[test]
fn recorded_ooms_under_a_fraction_are_reproduced_under_the_inferred_cap() {
    let dir = common::scratch("answers-search");
    let path = recorded_by_script(&dir, "search.pickle", SEARCH);
    let json = replay_json(&[text(&path)]);
    assert_eq!(json["fits"], false, "{json:#}");
    assert_eq!(json["counts"]["recorded_ooms"], 2);
    assert_eq!(json["counts"]["recorded_ooms_reproduced"], 2);
    assert_eq!(json["limit"]["kind"], "cap");
    // The cap lies between the reserved bytes after the last cudaMalloc (2 GiB) and the OOM's
    // reserved plus its segment (1 GiB + 2 GiB); the replay uses the lower bound.
    assert_eq!(json["limit"]["bounds"]["lower"], 2u64 << 30);
    assert_eq!(json["limit"]["bounds"]["upper"], 3u64 << 30);
    assert_eq!(json["limit"]["applied"]["cap"], 2u64 << 30);
    let oom = &json["first_oom"];
    assert_eq!(oom["index"], json["verdict"]["first_oom_event"]);
    assert_eq!(oom["source"], "recorded_oom");
    assert_eq!(oom["why"]["cause"], "over_fraction");
    assert_eq!(oom["why"]["allowed"], 2u64 << 30);
    assert!(oom["why"]["text"]
        .as_str()
        .is_some_and(|why| why.contains("over the memory fraction")));
    assert_eq!(oom["largest_live"][0]["size"], 1u64 << 30);
    let verdict = json["verdict"]["text"].as_str().expect("text");
    assert!(
        verdict.starts_with("does not fit on 139.80 GiB under the inferred cap of 2.00 GiB: 2 OOMs, first at event "),
        "{verdict}"
    );
    let (stdout, _, code) = replay(&[text(&path)]);
    assert_eq!(code, 0, "without --fail-on-oom a replay that ran exits 0");
    assert!(
        stdout.contains(&format!("  verdict         {verdict}")),
        "{stdout}"
    );
    assert!(
        stdout.contains("inferred limit  a cap of at least 2.00 GiB and below 3.00 GiB"),
        "{stdout}"
    );
    assert!(
        stdout.contains("why: gpumem: over the memory fraction"),
        "{stdout}"
    );
    let (_, _, code) = replay(&[text(&path), "--fail-on-oom"]);
    assert_eq!(code, 3);
}

#[test]
fn on_a_device_the_caller_names_the_cap_is_not_applied_and_says_why() {
    let dir = common::scratch("answers-named");
    let path = recorded_by_script(&dir, "search.pickle", SEARCH);
    let json = replay_json(&[text(&path), "--device", "sim:140GiB"]);
    assert_eq!(json["fits"], true, "{json:#}");
    assert_eq!(json["limit"]["kind"], "cap");
    assert_eq!(json["limit"]["applied"], "no");
    assert_eq!(json["verdict"]["unreproduced"], 2);
    let why = json["verdict"]["unreproduced_why"].as_str().expect("a why");
    assert!(why.contains("a limit the file does not record"), "{why}");
    let verdict = json["verdict"]["text"].as_str().expect("text");
    assert!(
        verdict.contains("the recorded run ran out of memory 2 times"),
        "{verdict}"
    );
    let (_, _, code) = replay(&[text(&path), "--device", "sim:140GiB", "--fail-on-oom"]);
    assert_eq!(code, 0);
}

#[test]
fn a_full_device_is_inferred_as_memory_held_elsewhere() {
    let dir = common::scratch("answers-full");
    let path = recorded_by_script(&dir, "full.pickle", FULL);
    let json = replay_json(&[text(&path)]);
    assert_eq!(json["limit"]["kind"], "device", "{json:#}");
    // At the OOM 1 GiB was reserved and 2.5 GiB free (4 GiB less the 512 MiB context).
    assert_eq!(json["limit"]["usable"], 3584u64 << 20);
    assert!(json["limit"]["applied"]["held_elsewhere"]
        .as_u64()
        .is_some());
    assert_eq!(json["counts"]["recorded_ooms_reproduced"], 1);
    assert_eq!(json["first_oom"]["why"]["cause"], "never_fits");
    assert_eq!(json["fits"], false);
    let text_out = json["limit"]["text"].as_str().expect("text");
    assert!(
        text_out.contains("another process, or the GPU was smaller"),
        "{text_out}"
    );
}

#[test]
fn bounds_that_cannot_agree_name_what_else_limited_the_job() {
    // 200 MiB were reserved once; after they were released, 20 MiB could not be had with
    // 10 MiB free on the device: no single limit explains both.
    let dir = common::scratch("answers-inconsistent");
    let mib = 1_i64 << 20;
    let base = 0x7f00_0000_0000_i64;
    let events = vec![
        event("segment_alloc", base, 200 * mib),
        event("alloc", base, 200 * mib),
        event("free_requested", base, 200 * mib),
        event("free_completed", base, 200 * mib),
        event("segment_free", base, 200 * mib),
        event("oom", 10 * mib, 20 * mib),
    ];
    let path = replay_files::write(&dir, "other.pickle", &snapshot(Vec::new(), events));
    let json = replay_json(&[text(&path)]);
    assert_eq!(json["limit"]["kind"], "inconsistent", "{json:#}");
    assert_eq!(json["limit"]["applied"], "no");
    let limit = json["limit"]["text"].as_str().expect("text");
    assert!(limit.contains("no single limit"), "{limit}");
    assert!(limit.contains("10.00 MiB free at that OOM"), "{limit}");
    assert_eq!(json["fits"], false, "the recorded run ran out of memory");
    let verdict = json["verdict"]["text"].as_str().expect("text");
    assert!(verdict.contains("did not reproduce"), "{verdict}");
    assert!(json["verdict"]["unreproduced_why"]
        .as_str()
        .is_some_and(|why| why.contains("changed over time")));
}

#[test]
fn compare_names_the_configs_that_fit_and_flags_lowered_peaks() {
    let dir = common::scratch("answers-compare");
    let path = recorded_by_script(&dir, "frag.pickle", FRAGMENTED);
    let json = replay_json(&[
        text(&path),
        "--device",
        "sim:1GiB",
        "--compare",
        "expandable_segments:True",
        "max_split_size_mb:20",
    ]);
    assert_eq!(json["fits"], false);
    assert_eq!(json["first_oom"]["why"]["cause"], "fragmentation");
    let verdict = json["verdict"]["with_compare"].as_str().expect("text");
    assert!(
        verdict.ends_with("; fits under expandable_segments:True only"),
        "{verdict}"
    );
    assert_eq!(
        json["verdict"]["fits_under"],
        serde_json::json!(["expandable_segments:True"])
    );
    let rows = json["compare"].as_array().expect("rows");
    assert_eq!(rows[0]["fits"], true);
    assert_eq!(rows[1]["fits"], false);
    let (stdout, _, code) = replay(&[
        text(&path),
        "--device",
        "sim:1GiB",
        "--compare",
        "expandable_segments:True",
        "--fail-on-oom",
    ]);
    assert_eq!(code, 3, "the recorded config does not fit");
    assert!(
        stdout.contains("verdict: does not fit on 1024.00 MiB"),
        "{stdout}"
    );
    assert!(
        stdout.contains("fits under expandable_segments:True only"),
        "{stdout}"
    );
    // On 900 MiB the job's allocations themselves fail and are skipped: the peaks shown are
    // lower than the job's, and flagged.
    let json = replay_json(&[
        text(&path),
        "--device",
        "sim:900MiB",
        "--compare",
        "expandable_segments:True",
    ]);
    assert!(json["counts"]["ooms"].as_u64() > Some(0), "{json:#}");
    assert_eq!(json["peaks_lowered_by_failed_allocations"], true);
    let rows = json["compare"].as_array().expect("rows");
    assert_eq!(
        rows[0]["peaks_lowered_by_failed_allocations"],
        rows[0]["ooms"].as_u64() > Some(0)
    );
    let (stdout, _, _) = replay(&[
        text(&path),
        "--device",
        "sim:900MiB",
        "--compare",
        "expandable_segments:True",
    ]);
    assert!(
        stdout.contains("* lowered by failed allocations, which were skipped"),
        "{stdout}"
    );
}

#[test]
fn min_capacity_starts_at_the_peak_and_never_returns_a_capacity_where_a_recorded_oom_recurs() {
    let dir = common::scratch("answers-min");
    let path = recorded_by_script(&dir, "search.pickle", SEARCH);
    let json = replay_json(&[text(&path), "--min-capacity"]);
    let found = &json["min_capacity"];
    let capacity = found["capacity"].as_u64().expect("a capacity");
    let peak = found["peak_allocated"].as_u64().expect("peak");
    let lower = found["lower_bound"].as_u64().expect("lower");
    // The search replays with its capacity named, so without the cap: the recorded requests
    // of 4 GiB beside the 1 GiB of weights need 5 GiB beside the context.
    assert_eq!(peak, 5 << 30);
    assert!(lower < capacity && lower + (2 << 20) >= 5 << 30, "{found}");
    let here = format!("sim:{capacity}");
    let below = format!("sim:{}", capacity - (2 << 20));
    let at = replay_json(&[text(&path), "--device", &here]);
    assert_eq!(at["counts"]["recorded_ooms_reproduced"], 0, "{at:#}");
    assert_eq!(at["fits"], true);
    let under = replay_json(&[text(&path), "--device", &below]);
    assert_eq!(under["fits"], false, "{under:#}");
    assert_eq!(
        found["real_gpu_total"],
        capacity - found["simulated_context"].as_u64().expect("context") + (527 << 20)
    );
}

#[test]
fn min_capacity_names_the_real_gpu_a_small_job_needs() {
    let path = common::tests_path("replay/fixtures/inference.default.pickle");
    let json = replay_json(&[text(&path), "--min-capacity"]);
    let found = &json["min_capacity"];
    let capacity = found["capacity"].as_u64().expect("a capacity");
    let context = found["simulated_context"].as_u64().expect("context");
    // A device this small gets an eighth of itself as context in the model; a real GPU's
    // context is the H200's 527 MiB.
    assert!(capacity < 8 * (527 << 20), "{found}");
    assert_eq!(context, capacity / 8);
    assert_eq!(found["real_gpu_context"], 527u64 << 20);
    assert_eq!(found["real_gpu_total"], capacity - context + (527 << 20));
    let (stdout, _, _) = replay(&[text(&path), "--min-capacity"]);
    assert!(stdout.contains("a real GPU needs about"), "{stdout}");
    assert!(stdout.contains("an eighth of the device"), "{stdout}");
    // Its answer depends on the placement a few steps below: named in JSON and in the text.
    let from = found["borderline_from"]
        .as_u64()
        .expect("a borderline range");
    assert!(from < capacity, "{found}");
    assert!(stdout.contains("borderline from "), "{stdout}");
    let (table, _, _) = replay(&[
        text(&path),
        "--compare",
        "expandable_segments:True",
        "--min-capacity",
    ]);
    assert!(
        table.contains(&format!(
            "{}~",
            gpumem::alloc::format::format_size(capacity)
        )),
        "{table}"
    );
    assert!(table.contains("~ min capacity: "), "{table}");
}

/// The frame a user reads first in the recorded `event`: the innermost whose file is
/// `file_suffix` (the user's script), as (filename, line, name).
fn recorded_user_frame(event: &serde_pickle::Value, file_suffix: &str) -> (String, i64, String) {
    use serde_pickle::Value as P;
    let P::Dict(map) = event else {
        panic!("an event is a dict")
    };
    let Some(P::List(frames)) = map.get(&replay_files::key("frames")) else {
        panic!("the event has frames")
    };
    frames
        .iter()
        .find_map(|frame| {
            let P::Dict(frame) = frame else { return None };
            let text = |name: &str| match frame.get(&replay_files::key(name)) {
                Some(P::String(text)) => Some(text.clone()),
                _ => None,
            };
            let filename = text("filename")?;
            let line = match frame.get(&replay_files::key("line")) {
                Some(P::I64(line)) => *line,
                _ => return None,
            };
            filename
                .ends_with(file_suffix)
                .then(|| (filename, line, text("name").unwrap_or_default()))
        })
        .expect("a frame in the user's file")
}

/// Issue 17, acceptance 3 on real PyTorch recordings (the H200 convnet, whole and cut to its
/// last 2,000 events as a wrapped ring leaves it) replayed on a device too small for them:
/// `first_oom.why.cause` says why, `first_oom.frames` names the user's own file and line
/// first (record_snapshots.py, the script that ran the job, before torch's modules), and the
/// event number the JSON and the text give is the failing event's position in the file's
/// trace counted from 1. `--fail-on-oom` exits 3.
#[test]
fn an_oom_names_the_users_file_and_line_at_the_files_event_number() {
    let dir = common::scratch("answers-frames");
    let name = "convnet.default";
    for keep in [None, Some(2000)] {
        let (path, trace) = match keep {
            None => {
                let mut top = replay_files::fixture_values(name);
                let trace = replay_files::trace_of(&mut top).clone();
                (
                    common::tests_path(&format!("replay/fixtures/{name}.pickle")),
                    trace,
                )
            }
            Some(keep) => {
                let path = replay_files::write(
                    &dir,
                    &format!("{name}.last{keep}.pickle"),
                    &replay_files::truncated(name, keep),
                );
                let mut top = replay_files::fixture_values(name);
                let whole = replay_files::trace_of(&mut top);
                let cut = whole.len() - keep;
                (path, whole[cut..].to_vec())
            }
        };
        let label = format!("{name} {keep:?}");
        let json = replay_json(&[text(&path), "--device", "sim:800MiB"]);
        assert_eq!(json["fits"], false, "{label}");
        assert_eq!(json["frames_lookup"], "done", "{label}");
        if keep.is_some() {
            assert!(
                json["start"].is_object(),
                "{label}: the trace starts mid-run"
            );
        }
        let oom = &json["first_oom"];
        assert_eq!(oom["why"]["cause"], "device_full", "{label}: {oom:#}");
        let number = oom["index"].as_u64().expect("an event number");
        assert_eq!(json["verdict"]["first_oom_event"], number, "{label}");
        // Event N is the trace's N-th entry: the alloc that failed, of the size the OOM names.
        let event = &trace[number as usize - 1];
        assert_eq!(replay_files::action_of(event), "alloc", "{label}");
        let serde_pickle::Value::Dict(fields) = event else {
            panic!("an event is a dict")
        };
        assert_eq!(
            fields.get(&replay_files::key("size")),
            Some(&serde_pickle::Value::I64(
                oom["size"].as_i64().expect("the size asked for")
            )),
            "{label}: event {number} is the request that failed"
        );
        let (filename, line, function) = recorded_user_frame(event, "record_snapshots.py");
        let first = &oom["frames"][0];
        assert_eq!(first["filename"], filename.as_str(), "{label}: {oom:#}");
        assert_eq!(first["line"], line, "{label}");
        assert_eq!(first["name"], function.as_str(), "{label}");
        assert_eq!(first["user"], true, "{label}");
        assert_eq!(
            oom["frames_from"],
            Value::Null,
            "{label}: the event's own frames"
        );
        let frames = oom["frames"].as_array().expect("frames");
        let internal = frames
            .iter()
            .position(|frame| frame["user"] == false)
            .expect("torch's frames after the user's");
        assert!(
            frames[internal..]
                .iter()
                .all(|frame| frame["user"] == false)
                && frames[internal]["filename"]
                    .as_str()
                    .is_some_and(|f| f.contains("/torch/")),
            "{label}: {frames:#?}"
        );
        let largest = &oom["largest_live"][0];
        if let Some(made) = largest["index"].as_u64() {
            assert_eq!(
                replay_files::action_of(&trace[made as usize - 1]),
                "alloc",
                "{label}: the largest live block's alloc event"
            );
        }
        let (stdout, _, code) = replay(&[text(&path), "--device", "sim:800MiB"]);
        assert_eq!(code, 0, "{label}");
        for part in [
            format!("first at event {number}"),
            format!("first OOM       event {number} (an alloc PyTorch served)"),
            format!("at: {filename}:{line} in {function}"),
        ] {
            assert!(stdout.contains(&part), "{label}: {part:?} in\n{stdout}");
        }
        let (_, _, code) = replay(&[text(&path), "--device", "sim:800MiB", "--fail-on-oom"]);
        assert_eq!(code, 3, "{label}");
    }
}

/// A recorded OOM of a gpumem script's job carries the script's own line (gpumem's history
/// stamps each event with its call site, as PyTorch records Python frames): the failing
/// request's, and the weights' among the largest live allocations.
#[test]
fn a_reproduced_recorded_oom_names_the_scripts_line() {
    let dir = common::scratch("answers-script-frames");
    let path = recorded_by_script(&dir, "search.pickle", SEARCH);
    let json = replay_json(&[text(&path)]);
    let oom = &json["first_oom"];
    assert_eq!(oom["source"], "recorded_oom", "{oom:#}");
    let frame = &oom["frames"][0];
    assert!(
        frame["filename"]
            .as_str()
            .is_some_and(|f| f.ends_with("job.rhai")),
        "{oom:#}"
    );
    // SEARCH's line 7: `let activations = empty(mib << 20, "uint8");`
    assert_eq!(frame["line"], 7, "{oom:#}");
    assert_eq!(frame["user"], true);
    // Line 4: `let weights = empty(1 << 30, "uint8");`
    assert_eq!(oom["largest_live"][0]["frames"][0]["line"], 4, "{oom:#}");
}

/// A file too large to read whole for its frames (gpumem's synthetic trace of 110,000 events,
/// 18 MB) still gets its answer, and says its frames were not looked up and why.
#[test]
fn a_file_too_large_for_the_frames_lookup_says_so() {
    let dir = common::scratch("answers-large");
    let path = dir.join("large.pickle");
    let written = common::gpumem(
        &[
            "bench",
            "replay",
            "--events",
            "110000",
            "--file",
            text(&path),
            "--keep",
        ],
        "",
    );
    assert_eq!(
        common::outcome(&written).2,
        0,
        "the synthetic trace is written"
    );
    let bytes = std::fs::metadata(&path).expect("written").len();
    assert!(bytes > gpumem::snapshot::replay::frames::LOOKUP_MAX_BYTES);
    let json = replay_json(&[text(&path), "--device", "sim:4GiB"]);
    assert_eq!(json["fits"], false, "{json:#}");
    assert_eq!(json["frames_lookup"]["too_large"], bytes);
    assert_eq!(json["first_oom"]["frames"], serde_json::json!([]));
    let (stdout, _, _) = replay(&[text(&path), "--device", "sim:4GiB"]);
    let line = format!(
        "frames not looked up: the file ({}) is larger than the 16.00 MiB",
        gpumem::alloc::format::format_size(bytes)
    );
    assert!(stdout.contains(&line), "{line:?} in\n{stdout}");
}

/// PyTorch 2.11 records most `oom` entries (and, in a history recorded with stacks only now
/// and then, some allocations) without frames. The answer then names the stack of the nearest
/// earlier event of the trace — the code that was running when the allocation failed — and
/// says which event it came from, instead of naming no place at all.
#[test]
fn a_failing_event_without_frames_is_placed_by_the_nearest_earlier_stack() {
    let dir = common::scratch("answers-nearest-frames");
    let user = replay_files::frame("/home/me/train.py", 12, "step");
    let torch = replay_files::frame(
        "/usr/lib/python3/site-packages/torch/nn/functional.py",
        100,
        "linear",
    );
    let small = 0x7f00_0000_0000_i64;
    let big = 0x7f10_0000_0000_i64;
    let events = vec![
        event("segment_alloc", small, 2 << 20),
        replay_files::event_at("alloc", small, 512, vec![torch, user]),
        event("segment_alloc", big, 4 << 30),
        event("alloc", big, 4 << 30),
    ];
    let path = replay_files::write(&dir, "nearest.pickle", &snapshot(Vec::new(), events));
    let json = replay_json(&[text(&path), "--device", "sim:2GiB"]);
    let oom = &json["first_oom"];
    assert_eq!(oom["index"], 4, "{oom:#}");
    assert_eq!(oom["frames_from"], 2, "{oom:#}");
    assert_eq!(oom["frames"][0]["filename"], "/home/me/train.py", "{oom:#}");
    assert_eq!(oom["frames"][0]["line"], 12, "{oom:#}");
    assert_eq!(oom["frames"][0]["user"], true, "{oom:#}");
    let (stdout, _, _) = replay(&[text(&path), "--device", "sim:2GiB"]);
    assert!(
        stdout.contains("/home/me/train.py:12 in step")
            && stdout.contains("(the stack of event 2, the nearest before the OOM"),
        "{stdout}"
    );
}

#[test]
fn a_compared_config_under_pressure_is_checked_under_the_models_placement_too() {
    // The convnet fixture on a device just large enough for it under max_split_size_mb:20:
    // 34 retries, and segments its recording never made.
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/replay/fixtures/convnet.default.pickle");
    let json = replay_json(&[
        text(&fixture),
        "--device",
        "sim:1707081728",
        "--compare",
        "max_split_size_mb:20",
    ]);
    let row = &json["compare"][0];
    assert!(row["num_alloc_retries"].as_i64() > Some(0), "{row:#}");
    let check = &row["placement_check"];
    assert!(check["fits"].is_boolean(), "{row:#}");
    // Borderline: the two placements disagree, and then the job does not fit; otherwise
    // both answers are the row's.
    if row["borderline"] == true {
        assert_eq!(row["fits"], false, "{row:#}");
    } else {
        assert_eq!(check["fits"], row["fits"], "{row:#}");
    }
    // The same config as the main replay: the same check, in the report's own fields.
    let main = replay_json(&[
        text(&fixture),
        "--device",
        "sim:1707081728",
        "--alloc-conf",
        "max_split_size_mb:20",
    ]);
    assert_eq!(main["placement_check"], *check);
    assert_eq!(main["verdict"]["borderline"], row["borderline"]);
}

#[test]
fn a_verdict_under_a_configs_memory_fraction_names_the_cap_it_ran_under() {
    let fixture = common::tests_path("replay/fixtures/convnet.default.pickle");
    let json = replay_json(&[
        text(&fixture),
        "--device",
        "sim:4GiB",
        "--alloc-conf",
        "per_process_memory_fraction:0.5",
    ]);
    let verdict = json["verdict"]["text"].as_str().expect("a verdict");
    assert!(
        verdict.starts_with(
            "fits on 4.00 GiB under per_process_memory_fraction:0.5 (2.00 GiB allowed)"
        ),
        "{verdict}"
    );
}

#[test]
fn segment_differences_under_another_config_are_called_the_answer_not_an_error() {
    let fixture = common::tests_path("replay/fixtures/convnet.default.pickle");
    let clause = "(under another config than the recording's: the segments it would make)";
    let (what_if, _, _) = replay(&[text(&fixture), "--alloc-conf", "max_split_size_mb:20"]);
    assert!(what_if.contains(clause), "{what_if}");
    let (own, _, _) = replay(&[text(&fixture)]);
    assert!(own.contains("0 differ") && !own.contains(clause), "{own}");
}

#[test]
fn min_capacity_of_a_trace_that_starts_mid_run_is_the_windows() {
    let path = common::tests_path("replay/fixtures/forms/v2.11-ring-wrapped.pickle");
    let json = replay_json(&[text(&path), "--min-capacity"]);
    assert_eq!(json["min_capacity"]["window_only"], true, "{json}");
    assert_eq!(json["verdict"]["window_only"], true, "{json}");
    let (stdout, _, _) = replay(&[text(&path), "--min-capacity"]);
    let line = stdout
        .lines()
        .find(|line| line.trim_start().starts_with("min capacity"))
        .unwrap_or_else(|| panic!("no min capacity in:\n{stdout}"));
    assert!(line.contains("for the trace's window only"), "{line}");
    let whole = common::tests_path("replay/fixtures/inference.default.pickle");
    let json = replay_json(&[text(&whole), "--min-capacity"]);
    assert_eq!(json["min_capacity"]["window_only"], false, "{json}");
}
