//! Script overhead on the simulated device: the cost per iteration of
//! `for i in 0..N { let t = empty(1048576, "uint8"); }` (target: <= 1.5 µs on a 2-core
//! machine; PyTorch's Python loop costs 3.15 µs on the H200 machine's CPU), the same loop while
//! a timeline is recorded as `gpumem run --timeline/--report` records it (target: at most twice
//! the plain loop), and of running an empty script (engine set-up included).

use std::cell::RefCell;
use std::rc::Rc;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};

use gpumem::alloc::AllocConf;
use gpumem::device::sim::SimDevice;
use gpumem::script::{Host, PrintSink};
use gpumem::tensor::Runtime;
use gpumem::viz::Recorder;

const ITERATIONS: u64 = 100_000;

fn new_host() -> Host {
    let runtime = Runtime::sim(SimDevice::h200(), AllocConf::default()).expect("sim runtime");
    Host::new(runtime, PrintSink::Stdout)
}

fn allocation_loop(c: &mut Criterion) {
    let host = new_host();
    let source = format!("for i in 0..{ITERATIONS} {{ let t = empty(1048576, \"uint8\"); }}");
    let ast = host.compile("bench", &source).expect("compiles");
    let mut group = c.benchmark_group("script_overhead");
    group.throughput(Throughput::Elements(ITERATIONS));
    group.sample_size(20);
    group.bench_function("empty_1MiB_uint8_loop_100k", |b| {
        b.iter(|| host.engine().run_ast(&ast).expect("runs"))
    });
    // Recording: script lines stamped (a listened-to allocator makes bindings stamp them),
    // every event kept. A fresh recorder per run (set up outside the timing), so the kept events do
    // not pile up across runs.
    let recording = new_host();
    group.bench_function("empty_1MiB_uint8_loop_100k_recording", |b| {
        b.iter_batched(
            || {
                let runtime = recording.devices().current();
                let recorder = Rc::new(RefCell::new(Recorder::new(&runtime.allocator(), "bench")));
                let subscription = runtime.subscribe(Box::new(Rc::clone(&recorder)));
                (recorder, subscription)
            },
            |(recorder, subscription)| {
                recording.engine().run_ast(&ast).expect("runs");
                recording.devices().current().unsubscribe(subscription);
                recorder
            },
            BatchSize::PerIteration,
        )
    });
    group.finish();
    c.bench_function("script_overhead/empty_script_with_engine_setup", |b| {
        b.iter(host_and_run_empty)
    });
}

fn host_and_run_empty() {
    new_host().run_source("empty", "").expect("runs");
}

criterion_group!(benches, allocation_loop);
criterion_main!(benches);
