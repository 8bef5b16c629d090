//! The placement probe's own tests (tests/gpu/placement/test_probe.py): the sequences it plays
//! against the H200's driver and the data the model's tests read (`driver_tests` in
//! src/device/address_space.rs), which must stay what the probe and the exporter make. The
//! probe runs on the H200; this runs in CI, with Python's unittest.

mod common;

#[test]
fn the_placement_probe_passes_its_own_tests() {
    common::python_unittest("tests/gpu/placement", "test_probe", &[]);
}
