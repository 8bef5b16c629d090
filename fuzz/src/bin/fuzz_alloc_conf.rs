//! AFL target 3: arbitrary `--alloc-conf` text (see `gpumem_fuzz::alloc_conf`).
fn main() {
    afl::fuzz!(|data: &[u8]| gpumem_fuzz::alloc_conf(data));
}
