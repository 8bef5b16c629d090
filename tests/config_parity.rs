//! Parity with PyTorch 2.11 where gpumem used to differ: the `size_t` wrap in the
//! `max_non_split_rounding_mb` rule and the float-only `set_per_process_memory_fraction`.

mod common;

use gpumem::alloc::MIB;

/// PyTorch compares `block.size >= request.size + max_non_split_rounding_size` in `size_t`, so
/// the largest accepted value (`SIZE_MAX / MiB` megabytes) wraps the sum below the request
/// and every cached oversize block is refused: the request gets a new segment.
#[test]
fn max_non_split_rounding_wraps_as_pytorchs_size_t_addition() {
    let conf = format!(
        "max_split_size_mb:20,max_non_split_rounding_mb:{}",
        u64::MAX / MIB
    );
    let mut allocator = common::sim_allocator(Some(8 << 30), &conf);
    let big = allocator.malloc(40 * MIB).expect("40 MiB");
    allocator.free(big).expect("free");
    let again = allocator.malloc(30 * MIB).expect("30 MiB");
    assert_eq!(
        allocator.stats().num_device_alloc,
        2,
        "the cached 40 MiB block must be refused, as in PyTorch"
    );
    allocator.free(again).expect("free");
    allocator.check_invariants().expect("consistent");
}

#[test]
fn memory_fraction_must_be_a_float_as_in_pytorch() {
    let (host, output) = common::sim_host(None, "");
    let error = host
        .run_source("t", "set_per_process_memory_fraction(1);")
        .expect_err("an integer is a TypeError in PyTorch");
    let message = error.to_string();
    assert!(
        message.contains("set_per_process_memory_fraction: fraction must be a float")
            && message.contains("must be `float`")
            && message.contains("got i64 (1)"),
        "{message}"
    );
    host.run_source(
        "t",
        "set_per_process_memory_fraction(1.0); print(get_per_process_memory_fraction());",
    )
    .expect("a float is fine");
    assert_eq!(output.borrow().as_str(), "1.0\n");
}
