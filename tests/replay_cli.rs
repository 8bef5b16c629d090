//! What each subcommand's `--help` lists and says it does by default, how options given
//! before a subcommand are treated, replay's indifference to the allocator config variables,
//! and traces recorded with `skip_actions`.

use std::path::Path;

use gpumem::snapshot::replay::{replay, ReplayOptions};
use serde_json::Value;

mod common;
mod replay_files;

fn help(args: &[&str]) -> String {
    let output = common::gpumem(args, "");
    let (stdout, stderr, code) = common::outcome(&output);
    assert_eq!(code, 0, "{stderr}");
    stdout
}

const LIMITS: [&str; 3] = ["--max-operations", "--max-call-depth", "--max-expr-depth"];

#[test]
fn replay_help_lists_only_its_flags_and_its_real_defaults() {
    let text = help(&["replay", "--help"]);
    for flag in LIMITS {
        assert!(
            !text.contains(flag),
            "replay runs no script: {flag} in\n{text}"
        );
    }
    for part in [
        "--fail-on-oom",
        "`sim` or `sim:SIZE`",
        "replay never runs on a GPU",
        "Default: the simulated H200",
        "Default: the recorded config",
        "PYTORCH_CUDA_ALLOC_CONF and PYTORCH_ALLOC_CONF are ignored",
        "3 with --fail-on-oom when the job does not fit",
        "--min-capacity",
        "Event N is the N-th entry of the file's trace (counted from 1)",
    ] {
        assert!(text.contains(part), "{part:?} in\n{text}");
    }
    assert!(!text.contains("cuda:0 when a GPU is found"), "{text}");
}

#[test]
fn each_subcommand_lists_what_it_uses() {
    let run = help(&["run", "--help"]);
    for part in [
        "--device",
        "--alloc-conf",
        "PYTORCH_CUDA_ALLOC_CONF",
        "--max-operations",
    ] {
        assert!(run.contains(part), "{part:?} in\n{run}");
    }
    let test = help(&["test", "--help"]);
    assert!(
        test.contains("PYTORCH_CUDA_ALLOC_CONF is not read"),
        "{test}"
    );
    assert!(test.contains("--max-operations"), "{test}");
    let bench_replay = help(&["bench", "replay", "--help"]);
    for flag in ["--device", "--alloc-conf", "--max-operations"] {
        assert!(!bench_replay.contains(flag), "{flag} in\n{bench_replay}");
    }
    let bench_alloc = help(&["bench", "alloc", "--help"]);
    assert!(bench_alloc.contains("--device"), "{bench_alloc}");
    assert!(!bench_alloc.contains("--max-operations"), "{bench_alloc}");
    let top = help(&["--help"]);
    assert!(
        top.contains("3 `replay --fail-on-oom` when the replayed job does not fit"),
        "{top}"
    );
}

#[test]
fn options_before_a_subcommand_apply_to_it_or_are_refused() {
    let fixture = common::tests_path("replay/fixtures/convnet.default.pickle");
    let fixture = fixture.to_str().expect("utf-8");
    let output = common::gpumem(&["--max-operations", "5", "replay", fixture], "");
    let (_, stderr, code) = common::outcome(&output);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("--max-operations does not apply to `gpumem replay`"),
        "{stderr}"
    );
    let output = common::gpumem(&["--device", "sim:24GiB", "replay", fixture], "");
    let (stdout, stderr, code) = common::outcome(&output);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("verdict         fits on 24.00 GiB"),
        "{stdout}"
    );
    let output = common::gpumem(
        &["--device", "sim", "bench", "replay", "--events", "10"],
        "",
    );
    let (_, stderr, code) = common::outcome(&output);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("--device does not apply to `gpumem bench replay`"),
        "{stderr}"
    );
    let dir = common::scratch("cli-outer");
    common::write(&dir, "x.rhai", "print(1 + 1);");
    for args in [
        &["--device", "sim", "run", "x.rhai"][..],
        &["run", "x.rhai", "--device", "sim"][..],
    ] {
        let output = common::gpumem_in(Some(&dir), args, "");
        let (stdout, stderr, code) = common::outcome(&output);
        assert_eq!((code, stdout.trim()), (0, "2"), "{args:?}: {stderr}");
    }
    common::write(&dir, "spin.rhai", "loop {}");
    let output = common::gpumem_in(
        Some(&dir),
        &["--max-operations", "1000", "run", "spin.rhai"],
        "",
    );
    let (_, stderr, code) = common::outcome(&output);
    assert_eq!(code, 1, "the limit given before `run` applies: {stderr}");
    assert!(stderr.contains("Too many operations"), "{stderr}");
}

#[test]
fn replay_ignores_the_config_variables_and_says_so() {
    let fixture = common::tests_path("replay/fixtures/convnet.default.pickle");
    let output = common::gpumem_with(
        None,
        &[("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")],
        &["replay", fixture.to_str().expect("utf-8")],
        "",
    );
    let (stdout, stderr, code) = common::outcome(&output);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("replay ignores PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"),
        "{stderr}"
    );
    assert!(
        stdout.contains("allocator conf  (defaults) (recorded in the file)"),
        "{stdout}"
    );
}

fn expected(name: &str) -> Value {
    let path = common::tests_path(&format!("replay/fixtures/{name}.json"));
    serde_json::from_str(&std::fs::read_to_string(path).expect("json")).expect("JSON")
}

fn replayed(path: &Path, name: &str) -> gpumem::snapshot::replay::ReplayReport {
    let options = ReplayOptions {
        capacity: expected(name)["total_memory"].as_u64(),
        ..ReplayOptions::default()
    };
    replay(path, &options, &mut |_, _| {}).expect("replays")
}

#[test]
fn traces_recorded_with_skip_actions_replay() {
    let dir = common::scratch("cli-skip");
    let name = "transformer_fp32.default";
    let json = expected(name);
    let stat = |key: &str| json["memory_stats"][key].as_i64().expect("stat");
    // Without free_requested: free_completed frees, every counter as PyTorch's.
    let path = replay_files::write(
        &dir,
        "no-requested.pickle",
        &replay_files::without_actions(name, &["free_requested"]),
    );
    let report = replayed(&path, name);
    for key in [
        "allocated_bytes.all.peak",
        "reserved_bytes.all.peak",
        "num_device_alloc",
        "allocated_bytes.all.current",
    ] {
        assert_eq!(report.stat(key), stat(key), "{key}\n{report}");
    }
    assert!(report.fits() && report.start.is_none(), "{report}");
    // Without free_completed: blocks are freed at free_requested (no stream waits here).
    let path = replay_files::write(
        &dir,
        "no-completed.pickle",
        &replay_files::without_actions(name, &["free_completed"]),
    );
    let report = replayed(&path, name);
    assert!(report.free_on_request, "{report}");
    for key in [
        "allocated_bytes.all.peak",
        "reserved_bytes.all.peak",
        "allocated_bytes.all.current",
    ] {
        assert_eq!(report.stat(key), stat(key), "{key}\n{report}");
    }
    assert!(
        report.end_state.matches(),
        "{:?}",
        report.end_state.first_difference
    );
    assert!(report
        .to_string()
        .contains("blocks were freed at free_requested"));
    // Without segment events: the end state's segments are taken as held from the start, so
    // the blocks may land in other segments than PyTorch's (the end-state check shows it).
    let path = replay_files::write(
        &dir,
        "no-segments.pickle",
        &replay_files::without_actions(name, &["segment_alloc", "segment_free"]),
    );
    let report = replayed(&path, name);
    assert!(report.fits(), "{report}");
    let start = report.start.expect("the segments are held from the start");
    assert_eq!(start.figures.blocks, 0, "{report}");
    assert_eq!(
        start.figures.reserved_bytes as i64,
        stat("reserved_bytes.all.current")
    );
    assert!(
        report
            .to_string()
            .contains("the trace records no segment events"),
        "{report}"
    );
    for key in [
        "allocated_bytes.all.current",
        "reserved_bytes.all.current",
        "segment.all.current",
    ] {
        assert_eq!(report.stat(key), stat(key), "{key}\n{report}");
    }
    assert_eq!(report.end_state.recorded, report.end_state.replayed);
}

/// `--addresses-from RUN`: a replay places its segments where another recording of the job put
/// them while its device calls are that recording's, and by the model after; never an error.
#[test]
fn a_replay_takes_segment_addresses_from_another_recording_while_its_calls_are_its() {
    let file = &common::tests_arg("replay/fixtures/convnet.default.pickle");
    let other = &common::tests_arg("replay/fixtures/transformer_fp32.default.pickle");
    let json = |args: &[&str]| -> Value {
        let output = common::gpumem(args, "");
        let (stdout, stderr, code) = common::outcome(&output);
        assert_eq!(code, 0, "{args:?}: {stderr}");
        serde_json::from_str(&stdout).expect("one JSON object")
    };
    let plain = json(&["replay", file, "--json"]);
    let segments = plain["placed"]["sequence"].as_u64().expect("placed");
    assert!(segments > 1, "{}", plain["placed"]);
    // Its own recording: every segment where the file put it, the same answer.
    let own = json(&["replay", file, "--addresses-from", file, "--json"]);
    assert_eq!(own["final_stats"], plain["final_stats"]);
    assert_eq!(own["placed"], plain["placed"]);
    assert_eq!(own["addresses_from"], file.as_str());
    assert_eq!(plain["addresses_from"], Value::Null);
    // Another job's: followed only while the calls agree, then the model's placement.
    let foreign = json(&["replay", file, "--addresses-from", other, "--json"]);
    let placed = &foreign["placed"];
    assert!(placed["model"].as_u64() > Some(0), "{placed}");
    assert!(placed["sequence"].as_u64() < Some(segments), "{placed}");
    assert_eq!(foreign["fits"], Value::Bool(true));
    let output = common::gpumem(&["replay", file, "--addresses-from", other], "");
    let (stdout, stderr, code) = common::outcome(&output);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains(&format!("{other}'s addresses")), "{stdout}");
    // What cannot be done is said, naming what was wrong.
    let missing = format!("{file}.missing");
    let output = common::gpumem(&["replay", file, "--addresses-from", &missing], "");
    let (_, stderr, code) = common::outcome(&output);
    assert_ne!(code, 0);
    assert!(
        stderr.contains("the recording to take addresses from") && stderr.contains(&missing),
        "{stderr}"
    );
    let output = common::gpumem(
        &[
            "replay",
            file,
            "--addresses-from",
            other,
            "--placement",
            "model",
        ],
        "",
    );
    let (_, stderr, code) = common::outcome(&output);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("--placement recorded"), "{stderr}");
}
