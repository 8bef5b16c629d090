//! AFL target 1: arbitrary bytes as a script (see `gpumem_fuzz::script`).
fn main() {
    afl::fuzz!(|data: &[u8]| gpumem_fuzz::script(data));
}
