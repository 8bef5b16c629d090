//! `gpumem replay FILE --tune` on a recorded fixture: a ranked table of every config of the
//! default grid with the best config ready to paste, and the same ranking as JSON.

mod common;

use serde_json::Value;

use common::{gpumem, outcome, scratch, tests_path, write};

fn fixture() -> String {
    tests_path("replay/fixtures/convnet.default.pickle")
        .to_string_lossy()
        .into_owned()
}

fn run(args: &[&str]) -> (String, String, i32) {
    outcome(&gpumem(args, ""))
}

/// The table's rows: (rank, config as printed).
fn table_rows(stdout: &str) -> Vec<(usize, String)> {
    stdout
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let rank: usize = words.next()?.parse().ok()?;
            let fits = words.next()?;
            if fits != "yes" && fits != "no" {
                return None;
            }
            // rank, fits, peak reserved (2 words), peak allocated (2), cudaMalloc, retries, OOMs.
            let conf = line.split_whitespace().nth(9)?.to_string();
            Some((rank, conf))
        })
        .collect()
}

#[test]
fn tune_ranks_at_least_100_configs_and_prints_the_best_ready_to_paste() {
    let (stdout, stderr, code) = run(&["replay", &fixture(), "--tune", "--threads", "2"]);
    assert_eq!(code, 0, "{stderr}");
    let rows = table_rows(&stdout);
    assert!(rows.len() >= 100, "{} rows:\n{stdout}", rows.len());
    let ranks: Vec<usize> = rows.iter().map(|(rank, _)| *rank).collect();
    assert_eq!(ranks, (1..=rows.len()).collect::<Vec<_>>());
    assert!(stdout.contains("<- the job's own config"), "{stdout}");
    let last = stdout.lines().last().expect("a last line");
    assert!(
        last.starts_with("PYTORCH_CUDA_ALLOC_CONF='")
            || last.starts_with("unset PYTORCH_CUDA_ALLOC_CONF"),
        "{last}"
    );
    assert!(stdout.contains("best config: fits on"), "{stdout}");

    let (json_out, _, code) = run(&["replay", &fixture(), "--tune", "--json", "--threads", "1"]);
    assert_eq!(code, 0);
    let json: Value = serde_json::from_str(&json_out).expect("JSON");
    let configs = json["configs"].as_array().expect("configs");
    assert_eq!(configs.len(), rows.len());
    for ((rank, printed), row) in rows.iter().zip(configs) {
        assert_eq!(row["rank"], *rank as u64);
        let conf = row["alloc_conf"].as_str().expect("text");
        let expected = if conf.is_empty() { "(defaults)" } else { conf };
        assert_eq!(
            printed, expected,
            "the same ranking in the table and the JSON"
        );
    }
    let best = configs[0]["alloc_conf"].as_str().unwrap();
    if !best.is_empty() {
        assert_eq!(last, format!("PYTORCH_CUDA_ALLOC_CONF='{best}'"));
    }
    // Ranked: configs that fit first, then by peak reserved.
    let keys: Vec<(bool, u64)> = configs
        .iter()
        .map(|row| {
            (
                !row["fits"].as_bool().unwrap(),
                row["peak_reserved"].as_u64().unwrap(),
            )
        })
        .collect();
    assert!(keys.windows(2).all(|pair| pair[0] <= pair[1]), "{keys:?}");
    assert_eq!(
        configs.iter().filter(|row| row["recorded"] == true).count(),
        1
    );
}

#[test]
fn a_small_capacity_ranks_the_configs_that_still_fit_first() {
    let dir = scratch("tune-grid");
    let grid = write(
        &dir,
        "grid.txt",
        "# two axes and one config\nexpandable_segments = none, True\nmax_split_size_mb = none, 64\nconf = garbage_collection_threshold:0.6\n",
    );
    let (stdout, stderr, code) = run(&[
        "replay",
        &fixture(),
        "--tune",
        "--grid",
        grid.to_str().unwrap(),
        "--capacity",
        "1GiB",
        "--json",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let json: Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(json["capacity"], 1_u64 << 30);
    assert_eq!(json["configs"].as_array().unwrap().len(), 4);
    let skipped = &json["skipped"][0];
    assert_eq!(skipped["alloc_conf"], "garbage_collection_threshold:0.6");
    assert!(skipped["reason"]
        .as_str()
        .unwrap()
        .contains("memory fraction below 1"));
    let fits: Vec<bool> = json["configs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["fits"].as_bool().unwrap())
        .collect();
    assert!(fits.windows(2).all(|pair| pair[0] >= pair[1]), "{fits:?}");
}

#[test]
fn a_bad_grid_file_is_a_usage_error_naming_the_line() {
    let dir = scratch("tune-bad-grid");
    let grid = write(
        &dir,
        "grid.txt",
        "expandable_segments = True\nmax_split = 64\n",
    );
    let (_, stderr, code) = run(&[
        "replay",
        &fixture(),
        "--tune",
        "--grid",
        grid.to_str().unwrap(),
    ]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("line 2: 'max_split' is not a key"),
        "{stderr}"
    );
}

#[test]
fn the_report_holds_the_same_ranking_and_the_best_config() {
    let dir = scratch("tune-report");
    let grid = write(
        &dir,
        "grid.txt",
        "expandable_segments = none, True\nmax_split_size_mb = none, 128\n",
    );
    let report = dir.join("tune.html");
    let (stdout, stderr, code) = run(&[
        "replay",
        &fixture(),
        "--tune",
        "--grid",
        grid.to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stderr}");
    let html = std::fs::read_to_string(&report).expect("the report");
    let rows = table_rows(&stdout);
    assert_eq!(rows.len(), 4, "{stdout}");
    let mut from = 0;
    for (rank, conf) in &rows {
        // The table's rows appear in the page in the same order (HTML-escaped text).
        let needle = format!("{rank:>4}  ");
        let at = html[from..].find(&needle).expect(&needle) + from;
        let line_end = html[at..].find('\n').map_or(html.len(), |end| at + end);
        assert!(
            html[at..line_end].contains(conf.as_str()),
            "rank {rank}: {conf}"
        );
        from = line_end;
    }
    let last = stdout.lines().last().expect("a last line");
    assert!(
        html.contains(&last.replace('\'', "&#39;")) || html.contains(last),
        "{last}"
    );
}

#[test]
fn a_trace_that_starts_mid_run_fits_its_window_only() {
    let wrapped = tests_path("replay/fixtures/forms/v2.11-ring-wrapped.pickle");
    let dir = scratch("tune-window");
    let grid = write(&dir, "grid.txt", "expandable_segments = False, True\n");
    let wrapped = wrapped.to_str().expect("utf-8 path");
    let grid = grid.to_str().expect("utf-8 path");
    let (stdout, stderr, code) = run(&["replay", wrapped, "--tune", "--grid", grid]);
    assert_eq!(code, 0, "{stderr}");
    let best = stdout
        .lines()
        .find(|line| line.starts_with("best config: fits"))
        .unwrap_or_else(|| panic!("no fitting best config in:\n{stdout}"));
    assert!(best.contains("for the trace's window only"), "{best}");
    let (stdout, stderr, code) = run(&["replay", wrapped, "--tune", "--grid", grid, "--json"]);
    assert_eq!(code, 0, "{stderr}");
    let json: Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(json["window_only"], Value::Bool(true), "{stdout}");
    // A trace from the job's start is not.
    let (stdout, _, _) = run(&["replay", &fixture(), "--tune", "--grid", grid, "--json"]);
    let json: Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(json["window_only"], Value::Bool(false), "{stdout}");
}
