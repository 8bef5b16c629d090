//! What `--report` and `--timeline` write, read without a browser: the numbers a replay's
//! page uses, the pictures a script gets, and that planted strings stay text. The browser
//! checks are in tests/report_browser.rs.

use serde_json::Value;

mod common;
#[path = "browser/report_data.rs"]
mod report_data;

use common::{gpumem, outcome, scratch};

/// The colours of the overview's allocated and reserved lines (src/viz/chart.rs).
const ALLOCATED: &str = "#C43A28";
const RESERVED: &str = "#346EAA";

fn json(stdout: &str) -> Value {
    serde_json::from_str(stdout.trim()).expect("one JSON object")
}

#[test]
fn a_replay_report_numbers_every_oom_as_the_text_does() {
    let dir = scratch("report-numbering");
    let page = dir.join("replay.html");
    let args = [
        "replay",
        "tests/replay/fixtures/convnet.default.pickle",
        "--device",
        "sim:1500MiB",
        "--json",
        "--report",
        page.to_str().expect("utf-8"),
    ];
    let (stdout, stderr, code) = outcome(&gpumem(&args, ""));
    assert_eq!(code, 0, "{stderr}");
    let replay = json(&stdout);
    let first = replay["first_oom"]["index"].as_u64().expect("an OOM");
    let ooms = replay["counts"]["ooms"].as_u64().expect("a count");
    assert!(
        ooms > 10,
        "the fixture runs out of memory on 1500 MiB: {ooms}"
    );

    let page = std::fs::read_to_string(&page).expect("report written");
    let data = report_data::data(&page);
    let panel = &data["panels"][0];
    assert_eq!(panel["numbering"], "trace");
    let marked: Vec<u64> = panel["marks"]
        .as_array()
        .expect("marks")
        .iter()
        .filter(|mark| mark[1] == 0)
        .map(|mark| mark[0].as_u64().expect("a number"))
        .collect();
    assert_eq!(
        marked.first(),
        Some(&first),
        "the page's first OOM is the text's"
    );
    assert_eq!(marked.len() as u64, ooms, "one OOM marked per failed alloc");
    assert_eq!(panel["counts"]["ooms"].as_u64(), Some(ooms));
    // The x axis ends one past the file's last event.
    assert_eq!(
        panel["to"].as_u64(),
        replay["counts"]["events"].as_u64(),
        "events 0..N-1 of the file, drawn up to N"
    );
    // The header and the counters agree.
    assert!(
        page.contains(&format!("{ooms} out-of-memory errors")),
        "header"
    );
    let stats = &replay["final_stats"];
    assert_eq!(stats["num_ooms"].as_u64(), Some(ooms));
}

#[test]
fn a_replay_timeline_draws_its_peaks_exactly() {
    let dir = scratch("report-peaks");
    let page = dir.join("replay.html");
    let args = [
        "replay",
        "tests/replay/fixtures/transformer_fp32.default.pickle",
        "--json",
        "--report",
        page.to_str().expect("utf-8"),
    ];
    let (stdout, stderr, code) = outcome(&gpumem(&args, ""));
    assert_eq!(code, 0, "{stderr}");
    let stats = json(&stdout)["final_stats"].clone();
    let page = std::fs::read_to_string(&page).expect("report written");
    let data = report_data::data(&page);
    for (key, color, name) in [
        ("allocated_bytes.all.peak", ALLOCATED, "allocated"),
        ("reserved_bytes.all.peak", RESERVED, "reserved"),
    ] {
        let peak = stats[key].as_u64().expect("a peak");
        assert_eq!(
            data["panels"][0]["peaks"][name][0].as_u64(),
            Some(peak),
            "{name}: the page's peak is the replay's"
        );
        let (drawn, per_pixel) = report_data::drawn_peak(&page, 0, color);
        assert!(
            (drawn - peak as f64).abs() <= per_pixel,
            "{name}: drawn at {drawn}, the peak is {peak} (one pixel: {per_pixel})"
        );
    }
}

#[test]
fn timeline_may_be_given_twice_for_svg_and_png() {
    let dir = scratch("timeline-twice");
    let svg = dir.join("t.svg");
    let png = dir.join("t.png");
    let script = common::write(
        &dir,
        "two.rhai",
        "let a = empty(30 << 20, \"uint8\");\na = ();\nempty_cache();\n",
    );
    let args = [
        "run",
        "--device",
        "sim",
        script.to_str().expect("utf-8"),
        "--timeline",
        svg.to_str().expect("utf-8"),
        "--timeline",
        png.to_str().expect("utf-8"),
    ];
    let (_, stderr, code) = outcome(&gpumem(&args, ""));
    assert_eq!(code, 0, "{stderr}");
    let svg = std::fs::read_to_string(&svg).expect("the SVG");
    assert!(svg.starts_with("<svg") && svg.contains("empty_cache() two.rhai:3"));
    let png = std::fs::read(&png).expect("the PNG");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));
}
