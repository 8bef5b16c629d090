//! Memory at the peaks by allocation site in `gpumem replay`: the same sites, with their bytes,
//! in the text, the JSON and the report, for a generated job with frames (tests/jobs).

mod common;
mod jobs;

use serde_json::Value;

use common::{gpumem, outcome, scratch};
use jobs::{training, MODEL};

const MIB: u64 = 1 << 20;

#[test]
fn the_sites_at_the_peaks_are_in_the_text_the_json_and_the_report() {
    let dir = scratch("replay-sites");
    let file = dir.join("job.pickle");
    // Weights 64 MiB at model.py:10; per step an activation of 100 MiB at :20 and a 16 MiB
    // temporary at :30: allocated memory peaks at 180 MiB with all three live.
    training(100, true, 0).dump(&file);
    let file = file.to_str().expect("a UTF-8 path");

    let (stdout, stderr, code) = outcome(&gpumem(&["replay", file], ""));
    assert_eq!(code, 0, "{stderr}");
    let section = stdout
        .split("memory at the peaks by allocation site")
        .nth(1)
        .expect(&stdout);
    let allocated = section.split("peak allocated").nth(1).expect(section);
    let lines: Vec<&str> = allocated.lines().collect();
    assert!(lines[0].contains("180.00 MiB after event"), "{section}");
    assert!(
        lines[1].contains("100.00 MiB") && lines[1].contains(&format!("{MODEL}:20 in forward")),
        "{section}"
    );
    assert!(
        lines[2].contains("64.00 MiB") && lines[2].contains(":10 in __init__"),
        "{section}"
    );
    assert!(
        lines[3].contains("16.00 MiB") && lines[3].contains(":30 in forward"),
        "{section}"
    );

    let (stdout, _, code) = outcome(&gpumem(&["replay", file, "--json"], ""));
    assert_eq!(code, 0);
    let json: Value = serde_json::from_str(&stdout).expect("JSON");
    let peak = &json["sites_at_peaks"]["allocated"];
    assert_eq!(peak["bytes"], 180 * MIB);
    let sites: Vec<(i64, u64)> = peak["sites"]
        .as_array()
        .expect("sites")
        .iter()
        .map(|site| {
            (
                site["site"]["line"].as_i64().unwrap(),
                site["bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(sites, [(20, 100 * MIB), (10, 64 * MIB), (30, 16 * MIB)]);
    assert_eq!(json["sites_at_peaks"]["frames_known"], true);
    let reserved = &json["sites_at_peaks"]["reserved"];
    assert!(reserved["bytes"].as_u64().unwrap() >= 180 * MIB);

    let report = dir.join("report.html");
    let (_, stderr, code) = outcome(&gpumem(
        &["replay", file, "--report", report.to_str().unwrap()],
        "",
    ));
    assert_eq!(code, 0, "{stderr}");
    let html = std::fs::read_to_string(&report).expect("the report");
    assert!(html.contains("memory at the peaks by allocation site"));
    assert!(
        html.contains(&format!("{MODEL}:20 in forward")),
        "the site is in the report"
    );
}

#[test]
fn the_sites_of_a_recorded_job_add_up_to_its_peaks() {
    let fixture = common::tests_path("replay/fixtures/convnet.default.pickle");
    let (stdout, stderr, code) = outcome(&gpumem(
        &["replay", fixture.to_str().unwrap(), "--json"],
        "",
    ));
    assert_eq!(code, 0, "{stderr}");
    let json: Value = serde_json::from_str(&stdout).expect("JSON");
    let sites = &json["sites_at_peaks"];
    assert_eq!(
        sites["frames_known"], true,
        "the fixture records Python stacks"
    );
    for peak in ["reserved", "allocated"] {
        let list = sites[peak]["sites"].as_array().expect("sites");
        assert!(!list.is_empty(), "{peak}");
        let sum: u64 = list
            .iter()
            .map(|site| site["bytes"].as_u64().unwrap())
            .sum();
        assert_eq!(
            sum,
            sites[peak]["allocated"].as_u64().unwrap(),
            "{peak}: the sites hold the live bytes"
        );
    }
    assert_eq!(
        sites["allocated"]["bytes"], json["final_stats"]["allocated_bytes.all.peak"],
        "the peak the sites are read at is the allocator's"
    );
}
