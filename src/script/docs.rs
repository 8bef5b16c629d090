//! One table describing every binding scripts see. The REPL's `:help` prints it and its tab
//! completion offers its names, so the two never disagree; a test runs every example.

/// How a binding is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A free function: `randn([2, 3])`.
    Function,
    /// A method on a tensor: `t.reshape([6])`.
    Method,
    /// A read-only tensor property: `t.shape`.
    Property,
    /// A field or method of a caught out-of-memory error: `e.why`.
    Error,
    /// A property or method of a stream: `s.synchronize()`.
    Stream,
    /// A property or method of a private pool made by `mem_pool()`: `pool.id`.
    Pool,
}

/// A binding's documentation.
#[derive(Debug, Clone, Copy)]
pub struct BindingDoc {
    /// The name scripts call.
    pub name: &'static str,
    /// How it is called.
    pub kind: Kind,
    /// The call with its arguments, as `:help` shows it.
    pub signature: &'static str,
    /// One line: what it does.
    pub summary: &'static str,
    /// A snippet that uses it (run by a test on the simulated device; `t` is a tensor there).
    pub example: &'static str,
}

const fn doc(
    name: &'static str,
    kind: Kind,
    signature: &'static str,
    summary: &'static str,
    example: &'static str,
) -> BindingDoc {
    BindingDoc {
        name,
        kind,
        signature,
        summary,
        example,
    }
}

use Kind::{Error, Function, Method, Pool, Property, Stream};

/// An example on a caught out-of-memory error `e` (a request of 1 EiB always fails).
macro_rules! on_oom {
    ($tail:literal) => {
        concat!(
            "{ let e = (); try { empty(1 << 60, \"uint8\"); } catch (x) { e = x; } e",
            $tail,
            " }"
        )
    };
}

/// Every binding, grouped as `:help` lists them.
#[rustfmt::skip]
pub const BINDINGS: &[BindingDoc] = &[
    doc("randn", Function, "randn(shape[, dtype])", "standard normal values (floating dtypes)", "randn([2, 3])"),
    doc("empty", Function, "empty(shape[, dtype])", "uninitialised memory (torch.empty)", "empty(1024, \"uint8\")"),
    doc("zeros", Function, "zeros(shape[, dtype])", "every element 0", "zeros([4, 4], \"int64\")"),
    doc("ones", Function, "ones(shape[, dtype])", "every element 1", "ones(8, \"float16\")"),
    doc("full", Function, "full(shape, value[, dtype])", "every element `value`", "full([2, 2], 7, \"int32\")"),
    doc("shape", Property, "t.shape", "dimensions, an array of integers", "t.shape"),
    doc("dtype", Property, "t.dtype", "element type name, e.g. \"float32\"", "t.dtype"),
    doc("numel", Property, "t.numel", "number of elements", "t.numel"),
    doc("nbytes", Property, "t.nbytes", "bytes of the elements (unrounded)", "t.nbytes"),
    doc("device", Property, "t.device", "where the tensor lives: \"sim\" (\"sim:N\" with several simulated devices) or \"cuda:N\"", "t.device"),
    doc("data_ptr", Property, "t.data_ptr", "device address of the first element", "t.data_ptr"),
    doc("reshape", Method, "t.reshape(shape)", "a view with another shape, sharing storage", "t.reshape([3, 2])"),
    doc("slice", Method, "t.slice(dim, start, end)", "a view of start..end along dim, sharing storage", "t.slice(0, 0, 1)"),
    doc("clone", Method, "t.clone()", "a copy in a new block (an allocation of its own)", "t.clone()"),
    doc("+", Method, "t + u, t + 2.0, 2.0 + t", "elementwise sum; the result is a new tensor (a temporary until bound)", "t + t"),
    doc("-", Method, "t - u, t - 2.0, 2.0 - t", "elementwise difference, a new tensor", "t - 1.0"),
    doc("*", Method, "t * u, t * 2.0, 2.0 * t", "elementwise product, a new tensor", "t * 2.0"),
    doc("/", Method, "t / u, t / 2.0, 2.0 / t", "elementwise quotient, a new tensor", "t / 2.0"),
    doc("sum", Method, "t.sum()", "sum of the elements, a number (float32 on the GPU; fresh randn/fills on sim)", "t.sum()"),
    doc("mean", Method, "t.mean()", "mean of the elements, a number", "t.mean()"),
    doc("std", Method, "t.std()", "sample standard deviation (n - 1), a number", "t.std()"),
    doc("item", Method, "t.item()", "the value of a one-element tensor", "t.slice(0, 0, 1).reshape([3]).slice(0, 0, 1).item()"),
    doc("to_array", Method, "t.to_array()", "the values as an array (up to 1,000,000 elements)", "t.to_array()"),
    doc("to", Method, "t.to(device)", "the values copied to device (an index or a name as t.device prints it); t itself when it is there already", "t.to(current_device())"),
    doc("device_count", Function, "device_count()", "how many devices this session has", "device_count()"),
    doc("current_device", Function, "current_device()", "the index of the current device, where new tensors go", "current_device()"),
    doc("set_device", Function, "set_device(device)", "make device current; creates its CUDA context, as torch.cuda.set_device does", "set_device(0)"),
    doc("with_device", Function, "with_device(device, || { ... })", "run the closure with device current, then restore the previous one; returns the closure's value", "with_device(0, || randn(8)).device"),
    doc("device_memory", Function, "device_memory([device])", "the driver's view (NVML; creates no context): device used/free, this process, its context, the allocator's share", "device_memory()"),
    doc("memory_allocated", Function, "memory_allocated([device])", "bytes held by live tensors (rounded blocks)", "memory_allocated()"),
    doc("memory_reserved", Function, "memory_reserved([device])", "bytes the allocator holds from the device", "memory_reserved(0)"),
    doc("max_memory_allocated", Function, "max_memory_allocated([device])", "peak of memory_allocated() since the last reset", "max_memory_allocated()"),
    doc("max_memory_reserved", Function, "max_memory_reserved([device])", "peak of memory_reserved() since the last reset", "max_memory_reserved()"),
    doc("memory_stats", Function, "memory_stats([device])", "every counter, keyed as PyTorch keys them", "memory_stats()[\"allocated_bytes.all.current\"]"),
    doc("memory_summary", Function, "memory_summary([device][, abbreviated])", "PyTorch's memory_summary() table (memory_summary(true) abbreviates)", "memory_summary(true)"),
    doc("memory_snapshot", Function, "memory_snapshot()", "every device's segments and their blocks with every key PyTorch's snapshot has (device, stream, frames, ...)", "memory_snapshot().len()"),
    doc("record_memory_history", Function, "record_memory_history(on[, max_entries])", "record allocator events with their script line on every device (off clears; keeps the last 1000000 by default)", "record_memory_history(true)"),
    doc("memory_history", Function, "memory_history()", "the current device's recorded events as maps with PyTorch's keys (action, addr, size, stream, time_us, frames, ...)", "memory_history().len()"),
    doc("dump_snapshot", Function, "dump_snapshot(path)", "write every device's segments and trace, and the settings, as a pickle PyTorch's memory_viz reads", "dump_snapshot(\"run.pickle\")"),
    doc("replay", Function, "replay(path[, conf])", "replay a PyTorch snapshot on the simulated H200: the `gpumem replay --json` report as a map", "replay(\"tests/replay/fixtures/inference.default.pickle\").final_stats[\"num_device_alloc\"]"),
    doc("empty_cache", Function, "empty_cache()", "return wholly free cached segments (and whole free pages of expandable segments) to the device (every device's, as PyTorch)", "empty_cache()"),
    doc("reset_peak_memory_stats", Function, "reset_peak_memory_stats([device])", "every peak becomes the current value", "reset_peak_memory_stats()"),
    doc("reset_accumulated_memory_stats", Function, "reset_accumulated_memory_stats([device])", "totals and event counters go to zero", "reset_accumulated_memory_stats()"),
    doc("set_per_process_memory_fraction", Function, "set_per_process_memory_fraction(f[, device])", "cap the allocator at f × total memory", "set_per_process_memory_fraction(0.5)"),
    doc("get_per_process_memory_fraction", Function, "get_per_process_memory_fraction([device])", "the cap in force (1.0 when none)", "get_per_process_memory_fraction()"),
    doc("mem_get_info", Function, "mem_get_info([device])", "[free, total] bytes as the driver reports them (creates the device's CUDA context, as cudaMemGetInfo does)", "mem_get_info()"),
    doc("with_allocator_conf", Function, "with_allocator_conf(conf, || { ... })", "run the closure against a second allocator under config conf (a fresh simulated GPU of this size, or the same CUDA GPU); returns its value", "with_allocator_conf(\"expandable_segments:True\", || { let x = empty(5000000, \"uint8\"); memory_reserved() })"),
    doc("mem_pool", Function, "mem_pool()", "a private pool of the current device (torch.cuda.MemPool()): id (0, n), one use; when the last reference goes, its wholly free segments go back to the device", "mem_pool().id"),
    doc("use_mem_pool", Function, "use_mem_pool(pool, || { ... })", "run the closure with every allocation going to pool (with torch.cuda.use_mem_pool(pool)); returns its value; memory_stats() counts the pool's memory, memory_map() marks its segments", "{ let p = mem_pool(); use_mem_pool(p, || { let x = empty([1000], \"uint8\"); memory_allocated() }) }"),
    doc("id", Pool, "pool.id", "a pool's id as [first, second] (PyTorch's MemPool.id: [0, n] for mem_pool())", "mem_pool().id"),
    doc("use_count", Pool, "pool.use_count()", "a pool's uses (MemPool.use_count()): 1 for the pool, 1 more inside use_mem_pool", "mem_pool().use_count()"),
    doc("memory_map", Function, "memory_map([device[, width]])", "every segment drawn as cells: allocated, free in a used segment, free segment", "memory_map(current_device(), 60)"),
    doc("fragmentation", Function, "fragmentation()", "per pool (all, small, large): cached_free, largest_free, free_blocks, releasable (what empty_cache() would return), external (1 - largest_free / cached_free)", "fragmentation().all.external"),
    doc("measure", Function, "measure(|| { ... })", "run a closure; its peak_allocated, peak_reserved, device_allocations, ... and result", "measure(|| randn(8)).peak_allocated"),
    doc("mark", Function, "mark(text)", "name the phase that begins here: --timeline and --report draw a labelled boundary", "mark(\"warm-up\")"),
    doc("progress", Function, "progress(items[, label])", "iterate a range or array with a progress bar on stderr (terminals only): for b in progress(0..n)", "progress(0..3)"),
    doc("message", Error, "e.message", "PyTorch's out-of-memory message, unchanged", on_oom!(".message")),
    doc("why", Error, "e.why", "gpumem's line saying why, computed from the figures below", on_oom!(".why")),
    doc("cause", Error, "e.cause", "impossible, never_fits, fragmentation (even under a fraction cap), over_fraction, driver_refused or device_full", on_oom!(".cause")),
    doc("requested", Error, "e.requested", "bytes asked for", on_oom!(".requested")),
    doc("rounded", Error, "e.rounded", "the request rounded as the allocator rounds it", on_oom!(".rounded")),
    doc("segment", Error, "e.segment", "bytes of the segment a cache miss needed (\"Tried to allocate\")", on_oom!(".segment")),
    doc("pool", Error, "e.pool", "\"small\" or \"large\": the pool of the request", on_oom!(".pool")),
    doc("largest_free", Error, "e.largest_free", "the pool's largest free cached block", on_oom!(".largest_free")),
    doc("cached_free", Error, "e.cached_free", "free cached bytes of the pool", on_oom!(".cached_free")),
    doc("cached_free_all", Error, "e.cached_free_all", "free cached bytes of both pools", on_oom!(".cached_free_all")),
    doc("device_free", Error, "e.device_free", "bytes the device reported free", on_oom!(".device_free")),
    doc("device_total", Error, "e.device_total", "the device's total memory", on_oom!(".device_total")),
    doc("allocated", Error, "e.allocated", "bytes of live tensors at the error", on_oom!(".allocated")),
    doc("reserved", Error, "e.reserved", "bytes held from the device at the error", on_oom!(".reserved")),
    doc("allowed", Error, "e.allowed", "the memory fraction's cap in bytes, or () without one", on_oom!(".allowed")),
    doc("fraction", Error, "e.fraction", "the memory fraction in force (1.0 without a cap)", on_oom!(".fraction")),
    doc("free_pages", Error, "e.free_pages", "bytes in whole expandable-segment pages inside the pool's free blocks", on_oom!(".free_pages")),
    doc("page", Error, "e.page", "the expandable-segment page size free_pages counts in", on_oom!(".page")),
    doc("fits_with_expandable", Error, "e.fits_with_expandable", "whether it fits when tried under expandable_segments:True: the live blocks allocated again on a side allocator (same device memory and cap), then this request", on_oom!(".fits_with_expandable")),
    doc("contains", Error, "e.contains(text)", "string functions read the error as its text (message + why line)", on_oom!(".contains(\"why\")")),
    doc("starts_with", Error, "e.starts_with(text)", "as on its text", on_oom!(".starts_with(\"CUDA out of memory.\")")),
    doc("ends_with", Error, "e.ends_with(text)", "as on its text", on_oom!(".ends_with(\")\")")),
    doc("index_of", Error, "e.index_of(text)", "as on its text", on_oom!(".index_of(\"EB\")")),
    doc("len", Error, "e.len()", "characters of its text", on_oom!(".len()")),
    doc("split", Error, "e.split(separator)", "its text split, e.g. into sentences", on_oom!(".split(\". \")")),
    doc("sub_string", Error, "e.sub_string(start[, length])", "part of its text", on_oom!(".sub_string(0, 18)")),
    doc("==", Error, "e == text", "true when its text (message + why line) equals text", on_oom!(" == \"\"")),
    doc("!=", Error, "e != text", "true when its text differs from text", on_oom!(" != \"\"")),
    doc("manual_seed", Function, "manual_seed(seed)", "restart every device's random generator at seed", "manual_seed(0)"),
    doc("synchronize", Function, "synchronize([device])", "wait until the work on every stream of the device has finished (creates its CUDA context; on sim the streams' queued work completes)", "synchronize()"),
    doc("stream", Function, "stream([device])", "a new stream of the device (torch.cuda.Stream(): the next of its pool of 32, round robin; creates the device's CUDA context)", "stream().stream_id"),
    doc("current_stream", Function, "current_stream([device])", "the stream new tensors and kernels of the device go to", "current_stream()"),
    doc("default_stream", Function, "default_stream([device])", "the device's default stream (stream_id 0)", "default_stream() == current_stream()"),
    doc("with_stream", Function, "with_stream(s, || { ... })", "run the closure with stream s current (and its device), then restore the previous streams; returns the closure's value", "with_stream(stream(), || empty(1024, \"uint8\")).nbytes"),
    doc("gpu_sleep", Function, "gpu_sleep(ms)", "keep the current stream busy for ms milliseconds (a spin kernel on a GPU, torch.cuda._sleep; on sim until the next synchronisation)", "gpu_sleep(1)"),
    doc("record_stream", Method, "t.record_stream(s)", "t is used on stream s of its device too: once freed, its block is reused only after the work queued on s by then has completed", "t.record_stream(stream())"),
    doc("device", Stream, "s.device", "the stream's device, as t.device prints it", "stream().device"),
    doc("device_index", Stream, "s.device_index", "the index of the stream's device", "stream().device_index"),
    doc("stream_id", Stream, "s.stream_id", "0 for the default stream, 1 to 32 for the pool's streams", "default_stream().stream_id"),
    doc("synchronize", Stream, "s.synchronize()", "wait until the work queued on s has finished (frees waiting for it complete at the next allocation)", "stream().synchronize()"),
    doc("wait_stream", Stream, "s.wait_stream(other)", "work queued on s from now on waits for the work queued on other (a stream of the same device) so far", "stream().wait_stream(default_stream())"),
    doc("==", Stream, "s == other", "whether two values name the same stream of the same device", "stream() == default_stream()"),
    doc("!=", Stream, "s != other", "whether they name different streams", "stream() != default_stream()"),
    doc("exit", Function, "exit([code])", "end the script (and gpumem run, or the REPL) with exit status code, 0 to 255 (default 0)", "if false { exit(3) }"),
];

/// What `:help NAME` adds under a binding's one-line summary where one line cannot say it:
/// what each field of a returned map means.
pub const DETAILS: &[(&str, &str)] = &[
    (
        "device_memory",
        "The driver's account (NVML on a GPU, the model on sim), in bytes:\n\
         \x20 total_bytes, used_bytes, free_bytes  NVML's device figures (nvidia-smi's; its total also\n\
         \x20                                      counts what the driver keeps for itself)\n\
         \x20 used_v2_bytes           NVML's used without the driver's own reservation\n\
         \x20 driver_reserved_bytes   what the driver keeps before any process runs\n\
         \x20 process_bytes           this process as NVML lists it: its share of the CUDA context\n\
         \x20                         plus the allocator's reserved bytes\n\
         \x20 allocator_reserved_bytes  memory_reserved()\n\
         \x20 context_bytes           process_bytes - allocator_reserved_bytes: the context's share NVML\n\
         \x20                         lists under the process (520 MiB of the H200's 527 MiB context;\n\
         \x20                         the rest is used under no process, and cudaMemGetInfo counts all\n\
         \x20                         527 MiB: docs/memory-figures.md)\n\
         \x20 other_processes_bytes   every other process\n\
         \x20 method                  how process_bytes was found: nvml-pid, device-delta or sim-model",
    ),
    (
        "measure",
        "The map, in bytes unless said:\n\
         \x20 peak_allocated, peak_reserved      the highest memory_allocated()/memory_reserved() inside the\n\
         \x20                                    closure (the global peaks are left alone)\n\
         \x20 allocated_before, allocated_after  memory_allocated() when the closure started and ended\n\
         \x20 reserved_before, reserved_after    memory_reserved() likewise\n\
         \x20 allocations                        blocks handed out inside (a count)\n\
         \x20 device_allocations, device_frees   memory_stats()'s num_device_alloc/num_device_free inside (counts)\n\
         \x20 result                             the closure's value",
    ),
    (
        "fragmentation",
        "Each pool's map (all, small, large):\n\
         \x20 cached_free   bytes in free cached blocks\n\
         \x20 largest_free  the largest of those blocks: the largest request the cache serves without a new segment\n\
         \x20 free_blocks   how many free blocks there are\n\
         \x20 releasable    the bytes empty_cache() would return now: free blocks that are a whole segment\n\
         \x20               (or whole pages of an expandable segment)\n\
         \x20 external      1 - largest_free / cached_free: how scattered the free bytes are (0 when they are one\n\
         \x20               block or there are none, near 1 when they lie in many small blocks)\n\
         Read external beside releasable: five wholly free 20 MiB segments read external 0.8, yet releasable\n\
         equals cached_free and empty_cache() returns them whole, so that scatter is harmless. Scattered\n\
         bytes that are not releasable are the ones a large request cannot use.",
    ),
];

/// Fields of the maps bindings return that count bytes and are not named `..._bytes`:
/// `measure()`'s and `fragmentation()`'s. The REPL prints such values readably beside the
/// number ([`is_byte_field`]).
pub const BYTE_FIELDS: [&str; 9] = [
    "peak_allocated",
    "peak_reserved",
    "allocated_before",
    "allocated_after",
    "reserved_before",
    "reserved_after",
    "cached_free",
    "largest_free",
    "releasable",
];

/// Whether a map key names a byte count: one of [`BYTE_FIELDS`], a `..._bytes` key
/// (`device_memory()`), a `..._bytes.` counter (`memory_stats()`), or a snapshot's `size` /
/// `..._size`.
pub fn is_byte_field(key: &str) -> bool {
    BYTE_FIELDS.contains(&key)
        || key.ends_with("_bytes")
        || key.contains("_bytes.")
        || key == "size"
        || key.ends_with("_size")
}

/// The longer explanation of `name`, if it has one ([`DETAILS`]).
pub fn details(name: &str) -> Option<&'static str> {
    DETAILS
        .iter()
        .find(|(documented, _)| *documented == name)
        .map(|(_, text)| *text)
}

/// The dtype names scripts may pass, for completion.
pub const DTYPES: [&str; 8] = [
    "float32", "float16", "bfloat16", "float64", "int64", "int32", "uint8", "bool",
];

/// The first binding named `name` (functions may have several overloads documented once; a
/// name may be documented once per [`Kind`], e.g. `synchronize()` and `s.synchronize()`).
pub fn find(name: &str) -> Option<&'static BindingDoc> {
    BINDINGS.iter().find(|doc| doc.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::DType;

    #[test]
    fn names_are_unique_per_kind_and_dtypes_match_the_tensor_layer() {
        for (index, doc) in BINDINGS.iter().enumerate() {
            assert!(
                BINDINGS[..index]
                    .iter()
                    .all(|other| (other.name, other.kind) != (doc.name, doc.kind)),
                "{} documented twice",
                doc.name
            );
            assert!(doc.signature.contains(doc.name));
        }
        let names: Vec<&str> = DType::ALL.iter().map(|d| d.name()).collect();
        assert_eq!(names, DTYPES);
        for (name, _) in DETAILS {
            assert!(
                find(name).is_some(),
                "details for {name}, which is no binding"
            );
        }
        // A test runs every example: one that wrote to a fixed folder would leave its file
        // behind (the test moves relative paths into a scratch folder it removes).
        for doc in BINDINGS {
            assert!(
                !doc.example.contains("\"/"),
                "{}'s example writes to an absolute path",
                doc.name
            );
        }
    }
}
