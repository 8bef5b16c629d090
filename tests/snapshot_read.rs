//! The streaming snapshot reader on PyTorch's own files: every fixture in tests/replay/fixtures
//! yields exactly the trace events PyTorch recorded (counted by action), its segments and its
//! allocator settings.

use std::collections::BTreeMap;

use gpumem::snapshot::pickle;
use serde_json::Value;

mod common;

fn fixture_names() -> Vec<String> {
    let dir = common::tests_path("replay/fixtures");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("fixtures folder")
        .filter_map(|entry| {
            let name = entry.ok()?.file_name().into_string().ok()?;
            name.strip_suffix(".pickle").map(str::to_string)
        })
        .collect();
    names.sort();
    names
}

#[test]
fn every_fixture_streams_its_recorded_events() {
    let names = fixture_names();
    assert_eq!(names.len(), 8, "{names:?}");
    for name in names {
        let dir = common::tests_path("replay/fixtures");
        let expected: Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join(format!("{name}.json"))).expect("json"),
        )
        .expect("JSON");
        let mut actions: BTreeMap<String, u64> = BTreeMap::new();
        let mut last_index = None;
        let rest = pickle::stream_file(&dir.join(format!("{name}.pickle")), |emitted| {
            *actions
                .entry(emitted.entry.action_name().to_string())
                .or_default() += 1;
            assert_eq!(emitted.index, last_index.map_or(0, |i| i + 1));
            last_index = Some(emitted.index);
            Ok(())
        })
        .expect("readable");
        let mut recorded: BTreeMap<String, u64> = expected["actions"]
            .as_object()
            .expect("actions")
            .iter()
            .map(|(k, v)| (k.clone(), v.as_u64().expect("count")))
            .collect();
        // The .json counted the trace of a first `_snapshot()`; `_dump_snapshot` took a second
        // one, whose trace ends with the first's `snapshot` event.
        recorded.insert("snapshot".into(), 1);
        assert_eq!(actions, recorded, "{name}");
        assert_eq!(rest.traces.len(), 1, "{name}: one device");
        assert_eq!(
            rest.traces[0].1,
            expected["events"].as_u64().expect("events") + 1
        );
        let settings = rest.settings.expect("allocator_settings");
        assert_eq!(
            settings.expandable_segments,
            name.ends_with("expandable"),
            "{name}"
        );
        let reserved: u64 = rest.segments.iter().map(|s| s.total_size).sum();
        assert_eq!(
            reserved,
            expected["memory_stats"]["reserved_bytes.all.current"]
                .as_u64()
                .expect("reserved"),
            "{name}: segments add up to the reserved bytes"
        );
    }
}
