//! Cooperative interruption of long native work (the simulated device's reductions over
//! hundreds of millions of generated values). The caller that owns the user's Ctrl-C — the
//! script host — registers its flag for the current thread with [`watch`]; loops that may run
//! for seconds call [`check`] between chunks and stop with [`TensorError::Interrupted`]. The
//! tensor layer never learns who set the flag, and an interrupted reduction has allocated
//! nothing, so the allocator is left as it was.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::TensorError;

thread_local! {
    static FLAG: RefCell<Option<Arc<AtomicBool>>> = const { RefCell::new(None) };
}

/// Makes [`check`] on this thread fail while `flag` is set (`None` stops watching).
pub fn watch(flag: Option<Arc<AtomicBool>>) {
    FLAG.with(|slot| *slot.borrow_mut() = flag);
}

/// `Err(TensorError::Interrupted)` when the watched flag is set. The flag is left set: its
/// owner clears it when it has reported the interruption.
pub fn check() -> Result<(), TensorError> {
    let set = FLAG.with(|slot| {
        slot.borrow()
            .as_ref()
            .is_some_and(|flag| flag.load(Ordering::Relaxed))
    });
    if set {
        Err(TensorError::Interrupted)
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_follows_the_watched_flag() {
        assert_eq!(check(), Ok(()));
        let flag = Arc::new(AtomicBool::new(false));
        watch(Some(Arc::clone(&flag)));
        assert_eq!(check(), Ok(()));
        flag.store(true, Ordering::Relaxed);
        assert_eq!(check(), Err(TensorError::Interrupted));
        watch(None);
        assert_eq!(check(), Ok(()));
    }
}
