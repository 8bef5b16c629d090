//! `gpumem diff A B`: two generated jobs (tests/jobs) whose activation grows, whose temporary
//! goes and whose cache comes; the diff names each site, and `--max-peak-increase` gates.

mod common;
mod jobs;

use std::path::PathBuf;

use serde_json::Value;

use common::{gpumem, outcome, scratch};
use jobs::{training, MODEL};

/// A: activation 100 MiB with a 16 MiB temporary. B: activation 300 MiB, no temporary, a
/// 32 MiB cache.
fn two_jobs() -> (PathBuf, PathBuf) {
    let dir = scratch("diff");
    let (a, b) = (dir.join("a.pickle"), dir.join("b.pickle"));
    training(100, true, 0).dump(&a);
    training(300, false, 32).dump(&b);
    (a, b)
}

fn run(args: &[&str]) -> (String, String, i32) {
    outcome(&gpumem(args, ""))
}

#[test]
fn the_diff_names_the_grown_added_and_removed_sites() {
    let (a, b) = two_jobs();
    let (stdout, stderr, code) = run(&["diff", a.to_str().unwrap(), b.to_str().unwrap()]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    let grown = stdout.split("grown (1):").nth(1).expect(&stdout);
    let grown_line = grown.lines().nth(1).expect("a grown site");
    assert!(
        grown_line.contains(&format!("{MODEL}:20 in forward"))
            && grown_line.contains("+200.00 MiB"),
        "{stdout}"
    );
    let added = stdout.split("added (1):").nth(1).expect(&stdout);
    assert!(
        added.lines().nth(1).unwrap().contains(":40 in attend"),
        "{stdout}"
    );
    let removed = stdout.split("removed (1):").nth(1).expect(&stdout);
    assert!(
        removed.lines().nth(1).unwrap().contains(":30 in forward"),
        "{stdout}"
    );
    assert!(
        stdout.contains("unchanged: 1 sites"),
        "the weights: {stdout}"
    );
}

#[test]
fn the_json_diff_has_the_same_sites_and_peaks() {
    let (a, b) = two_jobs();
    let (stdout, _, code) = run(&["diff", a.to_str().unwrap(), b.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0);
    let json: Value = serde_json::from_str(&stdout).expect("JSON");
    let mib = 1_u64 << 20;
    assert_eq!(json["a"]["peak_allocated"], 180 * mib);
    assert_eq!(json["b"]["peak_allocated"], 396 * mib);
    let grown = &json["sites"]["grown"][0];
    assert_eq!(grown["site"]["filename"], MODEL);
    assert_eq!(grown["site"]["line"], 20);
    assert_eq!(grown["a_bytes"], 100 * mib);
    assert_eq!(grown["b_bytes"], 300 * mib);
    assert_eq!(json["sites"]["added"][0]["site"]["line"], 40);
    assert_eq!(json["sites"]["removed"][0]["site"]["line"], 30);
    assert!(json["gate"].is_null());
}

#[test]
fn the_gate_exits_1_on_a_regression_and_0_otherwise() {
    let (a, b) = two_jobs();
    let (a, b) = (a.to_str().unwrap(), b.to_str().unwrap());
    let (stdout, _, code) = run(&["diff", a, b, "--max-peak-increase", "10"]);
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains("gate: FAILED: B's peak allocated grew by 120.0%"),
        "{stdout}"
    );
    let (stdout, _, code) = run(&["diff", a, b, "--max-peak-increase", "500"]);
    assert_eq!(code, 0, "{stdout}");
    assert!(stdout.contains("gate: passed"), "{stdout}");
    let (_, _, code) = run(&["diff", b, a, "--max-peak-increase", "0"]);
    assert_eq!(code, 0, "a job that shrank passes");
    let (stdout, _, code) = run(&["diff", a, b, "--max-peak-increase", "10", "--json"]);
    assert_eq!(code, 1);
    let json: Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(json["gate"]["passed"], false);
    let (_, stderr, code) = run(&["diff", a, b, "--max-peak-increase", "-1"]);
    assert_eq!(code, 2, "{stderr}");
}

#[test]
fn an_unreadable_file_is_named() {
    let (a, _) = two_jobs();
    let (_, stderr, code) = run(&["diff", a.to_str().unwrap(), "/nonexistent.pickle"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("/nonexistent.pickle"), "{stderr}");
    // Named once: the I/O error names the file already.
    assert_eq!(stderr.matches("/nonexistent.pickle").count(), 1, "{stderr}");
}

#[test]
fn a_job_whose_trace_starts_mid_run_is_compared_by_its_window() {
    let wrapped = &common::tests_arg("replay/fixtures/forms/v2.11-ring-wrapped.pickle");
    let whole = &common::tests_arg("replay/fixtures/forms/v2.11.pickle");
    let (stdout, stderr, code) = run(&["diff", wrapped, whole]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("window only    A starts mid-run"),
        "{stdout}"
    );
    let (stdout, _, _) = run(&["diff", wrapped, whole, "--json"]);
    let json: Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(json["a"]["window_only"], true, "{stdout}");
    assert_eq!(json["b"]["window_only"], false, "{stdout}");
    let (stdout, _, _) = run(&["diff", whole, whole]);
    assert!(!stdout.contains("window only"), "{stdout}");
}
