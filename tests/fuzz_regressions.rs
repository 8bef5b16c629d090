//! Inputs the fuzzers (fuzz/, AFL++) found or were seeded with, replayed through the very same
//! target bodies (fuzz/src/lib.rs, which needs only gpumem) in the normal test suite: every file
//! under fuzz/regressions/TARGET/ must pass its target without a panic.

#[path = "../fuzz/src/lib.rs"]
mod targets;

use std::path::Path;

/// Runs `target` on every file of fuzz/regressions/`name`, returning how many there were.
fn replay(name: &str, target: fn(&[u8])) -> usize {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/regressions")
        .join(name);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|error| panic!("{}: {error}", dir.display()))
        .map(|entry| entry.expect("entry").path())
        .collect();
    files.sort();
    for file in &files {
        let data = std::fs::read(file).expect("read");
        let outcome = std::panic::catch_unwind(|| target(&data));
        assert!(outcome.is_ok(), "{} fails {name}", file.display());
    }
    files.len()
}

#[test]
fn script_regressions() {
    assert!(replay("script", targets::script) > 0);
}

#[test]
fn alloc_regressions() {
    assert!(replay("alloc", targets::alloc_ops) > 0);
}

#[test]
fn alloc_conf_regressions() {
    assert!(replay("alloc_conf", targets::alloc_conf) > 0);
}

#[test]
fn snapshot_regressions() {
    assert!(replay("snapshot", targets::snapshot) > 0);
}

#[test]
#[ignore]
fn replay_dir() {
    let dir = std::env::var("REPLAY_DIR").expect("REPLAY_DIR");
    let target: fn(&[u8]) = match std::env::var("REPLAY_TARGET").as_deref() {
        Ok("script") => targets::script,
        Ok("alloc") => targets::alloc_ops,
        Ok("snapshot") => targets::snapshot,
        _ => targets::alloc_conf,
    };
    let mut seen = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir(dir).expect("dir") {
        let path = entry.expect("entry").path();
        let data = std::fs::read(&path).expect("read");
        if let Err(panic) = std::panic::catch_unwind(|| target(&data)) {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            let head: String = message.chars().take(160).collect();
            if seen.insert(head.clone()) {
                eprintln!("{}: {head}", path.display());
            }
        }
    }
}
