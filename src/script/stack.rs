//! The thread scripts run on, and the guard that keeps deep recursion from overflowing it.
//!
//! Rhai evaluates, compares, prints and drops nested values recursively and each script call
//! level costs several kilobytes of native stack (about 7.5 KiB in a release build, 50 KiB
//! in a debug build), so no fixed call-depth limit is safe for every script. Scripts therefore
//! run on a thread with a [`SCRIPT_STACK_BYTES`] stack, and [`nearly_full`] — polled by the
//! engine before every operation (see `Host`) — stops a script with a clean "Stack overflow"
//! error while [`STACK_RESERVE_BYTES`] are still free, whatever `--max-call-depth` says.

use std::cell::Cell;

/// The stack size of threads that evaluate scripts: reserved, not committed, up front.
pub const SCRIPT_STACK_BYTES: usize = 256 << 20;

/// How much of the script stack is kept free: a script is stopped when less than this is left.
/// It covers one operation's own native frames (a binding, a parse of an `eval` at the deepest
/// expression depth the limits allow, the error's unwinding) in a debug build.
pub const STACK_RESERVE_BYTES: usize = 48 << 20;

thread_local! {
    /// The address near the top of this thread's script stack; 0 on other threads.
    static STACK_TOP: Cell<usize> = const { Cell::new(0) };
}

/// The address of a local variable: where the stack pointer roughly is.
#[inline(never)]
fn stack_pointer() -> usize {
    let marker = 0_u8;
    std::hint::black_box(&marker) as *const u8 as usize
}

/// Runs `work` on a new thread with a [`SCRIPT_STACK_BYTES`] stack and returns its result.
/// Everything script-related (sessions, engines, values) must be created inside `work`: they
/// are not `Send`. Returns `Err` with a description when the thread cannot start or `work`
/// panics.
pub fn on_script_stack<T: Send>(work: impl FnOnce() -> T + Send) -> Result<T, String> {
    std::thread::scope(|scope| {
        let handle = std::thread::Builder::new()
            .name("script".into())
            .stack_size(SCRIPT_STACK_BYTES)
            .spawn_scoped(scope, || {
                STACK_TOP.with(|top| top.set(stack_pointer()));
                work()
            })
            .map_err(|error| format!("cannot start the script thread: {error}"))?;
        handle.join().map_err(|payload| {
            payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into())
        })
    })
}

/// Bytes of script stack still free, or `None` on a thread not started by
/// [`on_script_stack`] (whose size is unknown).
pub fn remaining() -> Option<usize> {
    let top = STACK_TOP.with(Cell::get);
    (top != 0).then(|| SCRIPT_STACK_BYTES.saturating_sub(top.saturating_sub(stack_pointer())))
}

/// Whether less than [`STACK_RESERVE_BYTES`] of the script stack is left.
pub fn nearly_full() -> bool {
    remaining().is_some_and(|left| left < STACK_RESERVE_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_script_threads_know_their_stack() {
        assert_eq!(remaining(), None);
        assert!(!nearly_full());
        let left = on_script_stack(remaining).expect("runs");
        let left = left.expect("known on the script thread");
        assert!(left > SCRIPT_STACK_BYTES - (1 << 20), "{left}");
    }

    #[test]
    fn the_guard_trips_before_the_stack_ends() {
        fn dig(depth: usize) -> usize {
            let padding = [0_u8; 4096];
            std::hint::black_box(&padding);
            if nearly_full() {
                depth
            } else {
                dig(depth + 1)
            }
        }
        let depth = on_script_stack(|| dig(0)).expect("no overflow");
        assert!(depth > 1000, "{depth}");
    }
}
