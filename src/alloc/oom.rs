//! PyTorch's out-of-memory error, raised after every attempt to find memory failed (the end of
//! `DeviceCachingAllocator::malloc`). The text is the same with and without expandable
//! segments; only the figures differ (reserved bytes are mapped bytes there).

use super::format::format_size as fs;
use super::{AllocError, CachingAllocator, EventKind, OutOfMemory, Request};

impl CachingAllocator {
    /// Builds PyTorch's OOM error: reads the device's free and total memory, records the `oom`
    /// trace entry (device free bytes, rounded request), counts `num_ooms`, and words the
    /// message with the allocated and reserved bytes as they are after the cache flush, and
    /// the bytes cached in private pools (which PyTorch reports as allocated in them).
    /// `orig_size` is the caller's request before rounding, for gpumem's diagnosis.
    pub(super) fn out_of_memory(&mut self, request: Request, orig_size: u64) -> AllocError {
        let (device_free, device_total) = self.device.mem_get_info().unwrap_or((0, 0));
        let allowed_info = match self.allowed_memory_maximum {
            Some(allowed) => format!("{} allowed; ", fs(allowed)),
            None => String::new(),
        };
        let mut proc_info = String::new();
        for process in self.device.process_memory() {
            if process.is_current {
                proc_info.push_str("Including non-PyTorch memory, this process");
            } else {
                proc_info.push_str(&format!("Process {}", process.pid));
            }
            proc_info.push_str(&format!(" has {} memory in use. ", fs(process.used_bytes)));
        }
        self.emit(
            EventKind::Oom,
            device_free,
            request.size,
            request.alloc_size,
            request.stream,
            request.pool,
            request.owner,
        );
        self.stats.num_ooms += 1;
        let allocated = self.stats.allocated_bytes.all.current.max(0) as u64;
        let reserved = self.stats.reserved_bytes.all.current.max(0) as u64;
        // PyTorch sums the free block sets of every private pool, and calls it allocated.
        let private = self.cached_in_private_pools();
        let private_info = if private > 0 {
            format!(
                "with {} allocated in private pools (e.g., CUDA Graphs), ",
                fs(private)
            )
        } else {
            String::new()
        };
        let message = format!(
            "CUDA out of memory. Tried to allocate {}. GPU {} has a total capacity of {} of which {} is free. {}{}Of the allocated memory {} is allocated by PyTorch, {}and {} is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)",
            fs(request.alloc_size),
            self.device.index(),
            fs(device_total),
            fs(device_free),
            proc_info,
            allowed_info,
            fs(allocated + private),
            private_info,
            fs(reserved.saturating_sub(allocated).saturating_sub(private)),
        );
        AllocError::OutOfMemory(OutOfMemory {
            message,
            alloc_size: request.alloc_size,
            diagnosis: Box::new(self.diagnose(
                (request.stream, request.owner),
                orig_size,
                request.size,
                request.alloc_size,
            )),
        })
    }
}
