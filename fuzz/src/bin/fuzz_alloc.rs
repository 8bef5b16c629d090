//! AFL target 2: op sequences against the allocator (see `gpumem_fuzz::alloc_ops`).
fn main() {
    afl::fuzz!(|data: &[u8]| gpumem_fuzz::alloc_ops(data));
}
