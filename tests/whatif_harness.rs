//! The what-if harness's own tests (tests/gpu/whatif/test_whatif.py): the plan, the runner, the
//! request-sequence and timing comparisons, and compare.py's verdicts with this build's
//! `gpumem` (the tests that need PyTorch skip themselves without it). The harness runs on the
//! H200; its comparison logic is checked here, in CI, with Python's unittest.

mod common;

#[test]
fn the_whatif_harness_passes_its_own_tests() {
    common::python_unittest(
        "tests/gpu/whatif",
        "test_whatif",
        &[("GPUMEM", env!("CARGO_BIN_EXE_gpumem"))],
    );
}
