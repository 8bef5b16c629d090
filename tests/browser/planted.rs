//! Strings that would run script if a report let them through as markup, and a snapshot that
//! carries them in every string it has (frames' names and file names of trace events, segments
//! and blocks, compile contexts, user metadata, external annotations), written with gpumem's own
//! pickle writer (no Python). Included by path from the report tests.

#![allow(dead_code)]

use gpumem::snapshot::model::{Annotation, Block, Frame, Segment, Snapshot, TraceEvent};
use gpumem::snapshot::{Action, AllocatorSettings};

/// Each payload, if it ran, would set `window.__planted`, open a dialog or make a request.
pub const PAYLOADS: [&str; 8] = [
    "</script><script>window.__planted='script'</script>",
    "<img src=x onerror=\"window.__planted='img'\">",
    "\"><svg onload=window.__planted='svg'>",
    "<!--<script>window.__planted='comment'</script>-->",
    "\u{2028}</script>\u{2029}<script>alert('line separators')</script>",
    "<img src=\"http://127.0.0.1:9/leak\">",
    "{{TITLE}}{{DATA}}<style>body{display:none}</style>",
    "javascript:alert('url')//<a href=\"javascript:window.__planted='href'\">x</a>",
];

/// A file name (no `/`) that would run script as markup.
pub const FILE_NAME: &str = "\"><img src=x onerror=window.__planted='file'>.pickle";

fn frames(offset: usize) -> Vec<Frame> {
    (0..3)
        .map(|i| Frame {
            name: PAYLOADS[(offset + 2 * i) % PAYLOADS.len()].to_string(),
            filename: PAYLOADS[(offset + 2 * i + 1) % PAYLOADS.len()].to_string(),
            line: 7 + i as i64,
        })
        .collect()
}

fn event(action: Action, addr: u64, size: u64, time: i64, offset: usize) -> TraceEvent {
    TraceEvent {
        action,
        addr: addr as i64,
        size: size as i64,
        stream: 0,
        time_us: time,
        compile_context: PAYLOADS[offset % PAYLOADS.len()].to_string(),
        user_metadata: PAYLOADS[(offset + 3) % PAYLOADS.len()].to_string(),
        frames: frames(offset),
    }
}

/// A small job with planted strings everywhere: a 20 MiB segment, two blocks (one freed), and
/// an OOM PyTorch recorded. Its end state is its `segments`.
pub fn snapshot() -> Snapshot {
    let base: u64 = 0x7f00_0000_0000;
    let (a, b) = (base, base + (4 << 20));
    let trace = vec![
        event(Action::SegmentAlloc, base, 20 << 20, 1, 0),
        event(Action::Alloc, a, 4 << 20, 2, 1),
        event(Action::Alloc, b, 4 << 20, 3, 2),
        event(Action::FreeRequested, a, 4 << 20, 4, 3),
        event(Action::FreeCompleted, a, 4 << 20, 5, 4),
        event(Action::Oom, 1 << 30, 1 << 40, 6, 5),
    ];
    let block = |address: u64, size: u64, state: &str, offset: usize| Block {
        address: address as i64,
        size: size as i64,
        requested_size: if state == "active_allocated" {
            size as i64
        } else {
            0
        },
        state: state.to_string(),
        frames: frames(offset),
    };
    Snapshot {
        segments: vec![Segment {
            device: 0,
            address: base as i64,
            total_size: 20 << 20,
            allocated_size: 4 << 20,
            active_size: 4 << 20,
            requested_size: 4 << 20,
            stream: 0,
            segment_type: "large".into(),
            segment_pool_id: (0, 0),
            is_expandable: false,
            frames: frames(6),
            blocks: vec![
                block(a, 4 << 20, "inactive", 7),
                block(b, 4 << 20, "active_allocated", 2),
                block(b + (4 << 20), 12 << 20, "inactive", 5),
            ],
        }],
        device_traces: vec![trace],
        allocator_settings: AllocatorSettings::default(),
        external_annotations: PAYLOADS
            .iter()
            .enumerate()
            .map(|(i, name)| Annotation {
                stage: PAYLOADS[(i + 4) % PAYLOADS.len()].to_string(),
                name: (*name).to_string(),
                device: 0,
                time_us: i as i64,
            })
            .collect(),
    }
}

/// A script whose file name, marks, printed lines and strings carry the payloads.
pub fn script() -> String {
    let mut text = String::from("let kept = [];\n");
    for (i, payload) in PAYLOADS.iter().enumerate() {
        let quoted = serde_json::to_string(payload).expect("a JSON string is a Rhai string");
        text.push_str(&format!(
            "mark({quoted});\nprint({quoted});\nkept.push(empty({} << 20, \"uint8\"));\n",
            i + 1
        ));
    }
    text.push_str("try { empty(1 << 50, \"uint8\"); } catch (e) { print(e); }\nempty_cache();\n");
    text
}

/// A script file name (no `/`) that would run script as markup.
pub const SCRIPT_NAME: &str = "\"><img src=x onerror=window.__planted='script-file'>.rhai";
