//! Fidelity: replays the allocation traces recorded from PyTorch 2.11 on an H200
//! (tests/fixtures/pytorch-traces/) and checks every recorded counter after every op, plus the
//! recorded segment addresses and data pointers where the trace has them.

use std::collections::BTreeMap;
use std::path::Path;

use gpumem::alloc::{AllocConf, AllocError, Allocation, CachingAllocator};
use gpumem::device::sim::SimDevice;
use serde_json::Value;

/// Counters the fixture counts from the start of each trace rather than of the process.
const PER_TRACE: [&str; 4] = [
    "num_alloc_retries",
    "num_device_alloc",
    "num_device_free",
    "num_ooms",
];

fn replay(file: &str) -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/pytorch-traces")
        .join(file);
    let text = std::fs::read_to_string(&path).expect("fixture readable");
    let fixture: Value = serde_json::from_str(&text).expect("fixture is JSON");
    let total = fixture["total_memory"].as_u64().expect("total_memory");
    let conf =
        AllocConf::parse(fixture["alloc_conf"].as_str().expect("alloc_conf")).expect("config");
    let mut allocator =
        CachingAllocator::new(Box::new(SimDevice::new(total)), conf).expect("allocator");
    let fraction = fixture["memory_fraction"]
        .as_f64()
        .expect("memory_fraction");
    if fraction < 1.0 {
        allocator.set_memory_fraction(fraction).expect("fraction");
    }
    let mut mismatches = Vec::new();
    for (trace_index, trace) in fixture["traces"]
        .as_array()
        .expect("traces")
        .iter()
        .enumerate()
    {
        let mut slots: BTreeMap<u64, Allocation> = BTreeMap::new();
        let base: BTreeMap<&str, i64> = PER_TRACE
            .iter()
            .map(|key| (*key, allocator.stats().get(key).expect("counter")))
            .collect();
        for (op_index, step) in trace["ops"].as_array().expect("ops").iter().enumerate() {
            let op = step["op"].as_array().expect("op");
            let at = format!("{file} trace {trace_index} op {op_index} {op:?}");
            match op[0].as_str().expect("op name") {
                "alloc" => {
                    let slot = op[1].as_u64().expect("slot");
                    let size = op[2].as_u64().expect("size");
                    let expect_oom = op.get(3).and_then(Value::as_str) == Some("oom");
                    match allocator.malloc(size) {
                        Ok(new) => {
                            if expect_oom {
                                mismatches.push(format!("{at}: PyTorch refused, gpumem allocated"));
                            }
                            if let Some(old) = slots.insert(slot, new) {
                                allocator.free(old).expect("free old occupant");
                            }
                        }
                        Err(AllocError::OutOfMemory(_)) if expect_oom => {}
                        Err(error) => mismatches.push(format!("{at}: unexpected error {error}")),
                    }
                }
                "free" => {
                    if let Some(old) = slots.remove(&op[1].as_u64().expect("slot")) {
                        allocator.free(old).expect("free");
                    }
                }
                "empty_cache" => allocator.empty_cache().expect("empty_cache"),
                other => panic!("unknown op {other}"),
            }
            if let Err(violation) = allocator.check_invariants() {
                mismatches.push(format!("{at}: invariant broken: {violation}"));
            }
            for (key, expected) in step["stats"].as_object().expect("stats") {
                let mut actual = allocator
                    .stats()
                    .get(key)
                    .unwrap_or_else(|| panic!("no stat {key}"));
                if let Some(start) = base.get(key.as_str()) {
                    actual -= start;
                }
                if Some(actual) != expected.as_i64() {
                    mismatches.push(format!("{at}: {key} = {actual}, PyTorch {expected}"));
                }
            }
            if let Some(ptrs) = step.get("ptrs").and_then(Value::as_object) {
                let actual: BTreeMap<String, u64> = slots
                    .iter()
                    .filter(|(_, a)| !a.is_null())
                    .map(|(slot, a)| (slot.to_string(), a.ptr))
                    .collect();
                let expected: BTreeMap<String, u64> = ptrs
                    .iter()
                    .filter_map(|(slot, ptr)| Some((slot.clone(), ptr.as_u64()?)))
                    .filter(|(_, ptr)| *ptr != 0)
                    .collect();
                if actual != expected {
                    mismatches.push(format!("{at}: data_ptrs {actual:?}, PyTorch {expected:?}"));
                }
            }
            if let Some(segments) = step.get("segments").and_then(Value::as_array) {
                let expected: Vec<(u64, u64)> = segments
                    .iter()
                    .filter_map(|s| Some((s[0].as_u64()?, s[1].as_u64()?)))
                    .collect();
                let mut actual: Vec<(u64, u64)> =
                    allocator.segments().map(|(p, s, _)| (p, s)).collect();
                actual.sort_unstable();
                let mut expected_sorted = expected.clone();
                expected_sorted.sort_unstable();
                if actual != expected_sorted {
                    mismatches.push(format!(
                        "{at}: segments {actual:?}, PyTorch {expected_sorted:?}"
                    ));
                }
            }
        }
        // Between traces: drop every tensor, empty the cache, reset peaks.
        for (_, allocation) in std::mem::take(&mut slots) {
            allocator.free(allocation).expect("free at trace end");
        }
        allocator.empty_cache().expect("empty_cache");
        allocator.reset_peak_stats();
    }
    mismatches
}

fn check(file: &str) {
    let mismatches = replay(file);
    assert!(
        mismatches.is_empty(),
        "{} mismatches, first ones:\n{}",
        mismatches.len(),
        mismatches
            .iter()
            .take(12)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn default_config() {
    check("traces_default.json");
}

#[test]
fn default_config_with_addresses() {
    check("traces_default_addr.json");
}

#[test]
fn memory_fraction() {
    check("traces_default_frac.json");
}

#[test]
fn garbage_collection_threshold() {
    check("traces_gc06_frac.json");
}

#[test]
fn max_split_size() {
    check("traces_maxsplit64_frac.json");
}

#[test]
fn roundup_power2_divisions() {
    check("traces_pow2div4.json");
}

#[test]
fn expandable_segments() {
    check("traces_expandable.json");
}

#[test]
fn expandable_segments_with_memory_fraction() {
    check("traces_expandable_frac.json");
}
