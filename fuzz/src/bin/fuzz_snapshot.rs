//! AFL target 4: arbitrary bytes as a snapshot file, read and replayed (see
//! `gpumem_fuzz::snapshot`).
fn main() {
    afl::fuzz!(|data: &[u8]| gpumem_fuzz::snapshot(data));
}
