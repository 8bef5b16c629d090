//! The seed walkthrough recorded from PyTorch (tests/fixtures/pytorch-seed-walkthrough.json):
//! its Rhai steps run through the script layer on the simulated H200 give PyTorch's counters
//! after every step, PyTorch's `memory_summary()` text and snapshot after the summary steps, and
//! PyTorch's OOM message under a 0.02 memory fraction.

use std::cell::RefCell;
use std::rc::Rc;

use gpumem::alloc::AllocError;
use gpumem::script::Host;
use serde_json::Value;

mod common;

fn fixture() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/pytorch-seed-walkthrough.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("JSON")
}

fn host(total: u64) -> (Host, Rc<RefCell<String>>) {
    common::sim_host(Some(total), "")
}

/// One script: every step, then a line `STATS <step> <key> <value>` per recorded key.
fn walkthrough_script(fixture: &Value) -> String {
    let mut script = String::new();
    for (index, step) in fixture["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .enumerate()
    {
        script.push_str(step["rhai"].as_str().expect("rhai"));
        script.push_str("\n{ let s = memory_stats();\n");
        for key in step["stats"].as_object().expect("stats").keys() {
            script.push_str(&format!(
                "print(`STATS {index} {key} ${{s[\"{key}\"]}}`);\n"
            ));
        }
        script.push_str("}\n");
    }
    script
}

#[test]
fn counters_after_every_step_equal_pytorch() {
    let fixture = fixture();
    let (host, output) = host(fixture["total_memory_bytes"].as_u64().expect("total"));
    host.run_source("walkthrough", &walkthrough_script(&fixture))
        .expect("script runs");
    let output = output.borrow();
    let mut checked = 0;
    for (index, step) in fixture["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .enumerate()
    {
        for (key, expected) in step["stats"].as_object().expect("stats") {
            let line = format!("STATS {index} {key} {expected}");
            assert!(
                output.lines().any(|l| l == line),
                "step {index} ({}): expected {line}",
                step["rhai"]
            );
            checked += 1;
        }
    }
    assert!(checked > 100, "only {checked} values checked");
}

#[test]
fn summary_and_snapshot_equal_pytorch() {
    let fixture = fixture();
    let (host, output) = host(fixture["total_memory_bytes"].as_u64().expect("total"));
    let mut script = String::new();
    for step in fixture["steps"].as_array().expect("steps") {
        script.push_str(step["rhai"].as_str().expect("rhai"));
        script.push('\n');
    }
    for line in fixture["summary_steps_rhai"]
        .as_array()
        .expect("summary steps")
    {
        script.push_str(line.as_str().expect("line"));
        script.push('\n');
    }
    script.push_str(
        "for seg in memory_snapshot() { print(`SEG ${seg.segment_type} ${seg.total_size} ${seg.allocated_size}`); \
         for b in seg.blocks { print(`BLOCK ${b.size} ${b.state}`); } }\n",
    );
    host.run_source("summary", &script).expect("script runs");
    let output = output.borrow();
    let summary = fixture["memory_summary"].as_str().expect("summary");
    assert!(
        output.starts_with(summary),
        "memory_summary differs:\n{output}"
    );

    // PyTorch lists segments by address; compare them as a multiset of (type, sizes, blocks).
    let mut expected: Vec<String> = fixture["memory_snapshot_segments_after_summary_steps"]
        .as_array()
        .expect("segments")
        .iter()
        .map(|seg| {
            let blocks: Vec<String> = seg["blocks"]
                .as_array()
                .expect("blocks")
                .iter()
                .map(|b| format!("BLOCK {} {}", b[0], b[1].as_str().expect("state")))
                .collect();
            format!(
                "SEG {} {} {}\n{}",
                seg["segment_type"].as_str().expect("type"),
                seg["total_size"],
                seg["allocated_size"],
                blocks.join("\n")
            )
        })
        .collect();
    let rest = &output[summary.len()..];
    let mut actual: Vec<String> = rest
        .split("SEG ")
        .filter(|chunk| !chunk.trim().is_empty())
        .map(|chunk| format!("SEG {}", chunk.trim_end()))
        .collect();
    expected.sort();
    actual.sort();
    assert_eq!(actual, expected);
}

#[test]
fn oom_under_a_fraction_keeps_nine_tensors_and_reads_like_pytorch() {
    let fixture = fixture();
    let oom = &fixture["oom"];
    let mut allocator = common::sim_allocator(None, "");
    allocator.set_memory_fraction(0.02).expect("fraction");
    let mut kept = Vec::new();
    let message = loop {
        match allocator.malloc(300 << 20) {
            Ok(block) => kept.push(block),
            Err(AllocError::OutOfMemory(oom)) => break oom.message,
            Err(other) => panic!("unexpected {other}"),
        }
        assert!(kept.len() < 100, "never ran out");
    };
    assert_eq!(kept.len() as u64, oom["kept"].as_u64().expect("kept"));
    let expected = oom["message"].as_str().expect("message");
    // Word for word PyTorch's, figures included: the sim's free figure counts the context as
    // cudaMemGetInfo does (527 MiB on the H200) and its process figure as NVML attributes it
    // to the process (520 MiB), which is what the message quotes.
    assert_eq!(message, expected);
    for block in kept {
        allocator.free(block).expect("free");
    }
}
