//! Parity with PyTorch 2.11 where gpumem used to differ: the `size_t` wrap in the
//! `max_non_split_rounding_mb` rule, the float-only `set_per_process_memory_fraction`, and
//! `large_segment_size_mb` (a 2.11 key gpumem used to refuse as unknown).

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

/// `large_segment_size_mb` is a PyTorch 2.11 key (`AcceleratorAllocatorConfig`): accepted from
/// `--alloc-conf` and the environment, read before the other keys, and refused only where 2.11
/// refuses it.
#[test]
fn large_segment_size_is_accepted_and_checked_as_in_pytorch_2_11() {
    let dir = common::scratch("large-segment");
    let script = common::write(
        &dir,
        "five.rhai",
        "let x = empty(5 * 1024 * 1024, \"uint8\"); print(memory_reserved());",
    );
    let script = script.to_str().expect("utf-8 path");
    let run = |env: &[(&str, &str)], conf: Option<&str>| {
        let mut args = vec!["--device", "sim"];
        if let Some(conf) = conf {
            args.extend(["--alloc-conf", conf]);
        }
        args.extend(["run", script]);
        common::outcome(&common::gpumem_with(None, env, &args, ""))
    };
    let (stdout, stderr, code) = run(&[], Some("large_segment_size_mb:40"));
    assert_eq!((stdout.trim(), code), ("41943040", 0), "{stderr}");
    let (stdout, stderr, code) = run(
        &[(
            "PYTORCH_CUDA_ALLOC_CONF",
            "max_split_size_mb:30,large_segment_size_mb:40",
        )],
        None,
    );
    assert_eq!(code, 2, "{stdout}");
    assert!(
        stderr.contains("PYTORCH_CUDA_ALLOC_CONF") && stderr.contains("must be >= 40"),
        "{stderr}"
    );
    let (_, stderr, code) = run(&[], Some("large_segment_size_mb:10"));
    assert_eq!(code, 2);
    assert!(stderr.contains("must be > 10 MB"), "{stderr}");
}
