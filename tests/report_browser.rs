//! The HTML report in a real browser: `gpumem run scripts/training_loop.rhai --report` opened in
//! headless Chromium (Debian's `chromium`) through the DevTools protocol by
//! `tests/browser/check_report.mjs` (over `--remote-debugging-pipe`; no npm package). The page must
//! render the timeline and the segment map, show an event and its script line on hover, make
//! no request beyond its own file and log no error; a screenshot is kept under cargo's scratch
//! folder.
//!
//! Needs `chromium` ($CHROMIUM, else /usr/bin/chromium) and `node`; `.ci/run` installs
//! Chromium. Without them the test says so and passes, except under CI (`CI` set), where it
//! fails.

use std::path::Path;
use std::process::Command;

mod common;

fn available(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .output()
        .is_ok_and(|output| output.status.success())
}

#[test]
fn the_report_renders_in_chromium_offline_without_errors() {
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    if !Path::new(&chromium).exists() || !available("node") {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must have chromium and node (.ci/run installs chromium)"
        );
        eprintln!("skipped: needs {chromium} and node (apt-get install -y chromium)");
        return;
    }
    let dir = common::scratch("report-browser");
    let report = dir.join("training_loop.html");
    let timeline = dir.join("training_loop.png");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/training_loop.rhai");
    let output = common::gpumem_in(
        None,
        &[
            "run",
            "--device",
            "sim",
            script.to_str().expect("utf-8 path"),
            "--report",
            report.to_str().expect("utf-8 path"),
            "--timeline",
            timeline.to_str().expect("utf-8 path"),
        ],
        "",
    );
    let (_, stderr, code) = common::outcome(&output);
    assert_eq!(code, 0, "{stderr}");
    let png = std::fs::read(&timeline).expect("timeline written");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
    assert!(
        png.len() > 20_000,
        "a PNG with a chart in it ({} bytes)",
        png.len()
    );

    let screenshot = dir.join("report.png");
    let checker = common::tests_path("browser/check_report.mjs");
    let output = Command::new("node")
        .arg(&checker)
        .arg(&report)
        .arg(&screenshot)
        .env("CHROMIUM", &chromium)
        .output()
        .expect("node runs");
    let (stdout, stderr, code) = common::outcome(&output);
    assert_eq!(code, 0, "check_report failed: {stderr}");
    let result: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    let metrics = &result["metrics"];
    let number = |pointer: &str| {
        metrics
            .pointer(pointer)
            .and_then(|v| v.as_f64())
            .unwrap_or(0.0)
    };

    assert_eq!(
        result["requests"],
        serde_json::json!([]),
        "no request leaves the page"
    );
    assert_eq!(result["errors"], serde_json::json!([]), "no console error");
    assert_eq!(
        metrics["ready"], "1",
        "the page's script ran to the end: {metrics}"
    );
    assert!(
        number("/chart/width") > 600.0 && number("/chart/height") > 250.0,
        "timeline drawn: {metrics}"
    );
    assert!(
        number("/chartShapes") > 10.0,
        "the chart has its lines: {metrics}"
    );
    assert!(
        number("/map/width") > 300.0 && number("/map/height") > 40.0,
        "map drawn: {metrics}"
    );
    assert!(
        number("/mapSegments") >= 2.0,
        "the map shows segments: {metrics}"
    );
    assert!(
        number("/mapRects") > number("/mapSegments"),
        "segments have blocks: {metrics}"
    );
    assert!(
        number("/slider") > 50.0,
        "the slider spans the events: {metrics}"
    );
    assert!(
        number("/summary") > 1000.0,
        "memory_summary() is on the page"
    );
    let tooltip = result["tooltip"].as_str().unwrap_or("");
    assert!(
        tooltip.contains("training_loop.rhai:") && tooltip.contains("allocated"),
        "hovering shows the event and its script line: {tooltip:?}"
    );
    let shot = std::fs::read(&screenshot).expect("screenshot written");
    assert!(
        shot.starts_with(b"\x89PNG") && shot.len() > 50_000,
        "a screenshot with content"
    );
}
