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
    // The x axis ends one past the file's last event (events are numbered from 1).
    assert_eq!(
        panel["to"].as_u64(),
        replay["counts"]["events"].as_u64().map(|events| events + 1),
        "events 1..N of the file, drawn up to N + 1"
    );
    // The header and the counters agree.
    assert!(
        page.contains(&format!("{ooms} out-of-memory errors")),
        "header"
    );
    let stats = &replay["final_stats"];
    assert_eq!(stats["num_ooms"].as_u64(), Some(ooms));
    // It leads with the text's verdict, in the colour of a job that does not fit.
    let verdict = replay["verdict"]["text"].as_str().expect("a verdict");
    assert!(
        page.contains(&format!("<p class=\"headline bad\">verdict: {verdict}</p>")),
        "{verdict}"
    );
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

/// Each panel's `num_ooms` counter, as the page's counters table shows it.
fn panel_ooms(page: &str) -> Vec<u64> {
    page.split("<section class=\"panel\"")
        .skip(1)
        .map(|section| {
            let cell = section
                .split("data-key=\"num_ooms\">")
                .nth(1)
                .expect("a num_ooms cell");
            cell[..cell.find('<').expect("its end")]
                .parse()
                .expect("a number")
        })
        .collect()
}

fn run_script(dir: &std::path::Path, script: &std::path::Path, device: &str) -> (String, Value) {
    let page = dir.join("page.html");
    let svg = dir.join("timeline.svg");
    let args = [
        "run",
        "--device",
        device,
        script.to_str().expect("utf-8"),
        "--report",
        page.to_str().expect("utf-8"),
        "--timeline",
        svg.to_str().expect("utf-8"),
    ];
    let (stdout, stderr, code) = outcome(&gpumem(&args, ""));
    assert_eq!(code, 0, "{stdout}{stderr}");
    let page = std::fs::read_to_string(&page).expect("report");
    let data = report_data::data(&page);
    let svg = std::fs::read_to_string(&svg).expect("timeline");
    (format!("{page}\n<!-- the timeline -->\n{svg}"), data)
}

#[test]
fn each_allocator_of_a_script_gets_its_own_timeline_and_counters() {
    let dir = scratch("report-allocators");
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/fragmentation.rhai");
    let (page, data) = run_script(&dir, &script, "sim");
    let panels = data["panels"].as_array().expect("panels");
    let labels: Vec<&str> = panels
        .iter()
        .map(|panel| panel["label"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(labels.len(), 3, "{labels:?}");
    assert_eq!(labels[0], "session allocator (sim)");
    assert!(
        labels[1].starts_with("with_allocator_conf(\"\") #1 at ")
            && labels[1].contains("fragmentation.rhai:"),
        "{labels:?}"
    );
    assert!(
        labels[2].starts_with("with_allocator_conf(\"expandable_segments:True\") #2"),
        "{labels:?}"
    );
    // Each timeline's OOMs are its own allocator's counter, and the header adds them up.
    let counted: Vec<u64> = panels
        .iter()
        .map(|panel| panel["counts"]["ooms"].as_u64().expect("a count"))
        .collect();
    assert_eq!(counted, panel_ooms(&page));
    assert_eq!(counted[0], 0, "the session's allocator never ran out");
    assert!(counted[1] > 0 && counted[2] > 0, "{counted:?}");
    let total: u64 = counted.iter().sum();
    assert!(
        page.contains(&format!("{total} out-of-memory errors · ")),
        "the header's count is the counters' sum"
    );
}

#[test]
fn markers_name_the_scripts_own_line_through_stdlib_helpers() {
    let dir = scratch("report-stdlib-lines");
    let script = common::write(
        &dir,
        "helpers.rhai",
        "import \"mem\" as mem;\n\
         mem::require_fresh(\"helpers.rhai\");\n\
         let r = mem::fill_until_oom(300 << 20);\n\
         r = ();\n\
         empty_cache();\n",
    );
    let (page, data) = run_script(&dir, &script, "sim:1GiB");
    let panel = &data["panels"][0];
    let site = |context: u64| -> (String, Value) {
        let label = &panel["labels"][context as usize - 1];
        (
            label[0].as_str().unwrap_or("").to_string(),
            label[1].clone(),
        )
    };
    let marks = panel["marks"].as_array().expect("marks");
    let sites: Vec<(u64, String, Value)> = marks
        .iter()
        .map(|mark| {
            let (label, helper) = site(mark[2].as_u64().expect("a context"));
            (mark[1].as_u64().expect("a kind"), label, helper)
        })
        .collect();
    let file = script.to_str().expect("utf-8");
    assert_eq!(
        sites,
        [
            (1, format!("{file}:2"), Value::from("mem::require_fresh")),
            (0, format!("{file}:3"), Value::from("mem::fill_until_oom")),
            (1, format!("{file}:5"), Value::Null),
        ]
    );
    assert!(
        page.contains("OOM helpers.rhai:3 (mem::fill_until_oom)"),
        "the chart's label"
    );
    // The header counts the script's own empty_cache() call, not the helper's.
    assert!(
        page.contains("1 out-of-memory errors · 1 empty_cache() calls</p>"),
        "{}",
        &page[page.find("<header>").unwrap_or(0)..][..400]
    );
    assert!(page.contains("1 empty_cache() calls (and 1 inside stdlib helpers)"));
}

#[test]
fn marks_draw_labelled_phase_boundaries() {
    let dir = scratch("report-marks");
    let script = common::write(
        &dir,
        "phases.rhai",
        "mark(\"<load>\");\n\
         let w = empty(64 << 20, \"uint8\");\n\
         mark(\"train\");\n\
         for i in 0..3 { let x = empty(8 << 20, \"uint8\"); }\n",
    );
    let (page, data) = run_script(&dir, &script, "sim");
    let panel = &data["panels"][0];
    let phases: Vec<(u64, &str)> = panel["marks"]
        .as_array()
        .expect("marks")
        .iter()
        .filter(|mark| mark[1] == 2)
        .map(|mark| {
            (
                mark[0].as_u64().expect("where"),
                mark[3].as_str().unwrap_or(""),
            )
        })
        .collect();
    // The weights' segment_alloc and alloc are events 1 and 2: the second phase starts at 3.
    assert_eq!(phases, [(1, "<load>"), (3, "train")]);
    assert!(page.contains("▸ train"), "the chart labels the phase");
    assert!(page.contains("▸ &lt;load&gt;"), "as text");
    assert!(page.contains("2 phases marked"));
}

#[test]
fn each_device_gets_its_own_timeline() {
    let dir = scratch("report-devices");
    let script = common::write(
        &dir,
        "two.rhai",
        "mark(\"start\");\n\
         let a = empty(100 << 20, \"uint8\");\n\
         let b = with_device(1, || empty(300 << 20, \"uint8\"));\n",
    );
    let (page, data) = run_script(&dir, &script, "sim:80GiB,80GiB");
    let panels = data["panels"].as_array().expect("panels");
    let summary: Vec<(&str, u64)> = panels
        .iter()
        .map(|panel| {
            (
                panel["label"].as_str().unwrap_or(""),
                panel["peaks"]["allocated"][0].as_u64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("device 0 (sim:0)", 100 << 20),
            ("device 1 (sim:1)", 300 << 20)
        ]
    );
    // Each with its own counters, and the phase on both.
    assert!(page.contains("data-key=\"allocated_bytes.all.peak\">100 MiB"));
    assert!(page.contains("data-key=\"allocated_bytes.all.peak\">300 MiB"));
    for panel in panels {
        assert!(panel["marks"]
            .as_array()
            .expect("marks")
            .iter()
            .any(|mark| mark[3] == "start"));
    }
}
