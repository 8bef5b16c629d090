//! Which device is current, kept the way PyTorch 2.11 keeps it on CUDA 12
//! (c10/cuda/CUDAFunctions.cpp), so that gpumem creates a device's CUDA context exactly when
//! PyTorch would.
//!
//! Since CUDA 12, `cudaSetDevice(d)` creates device `d`'s primary context at once. PyTorch
//! therefore avoids calling it where it can: leaving a device guard or a `torch.cuda.device`
//! block does not switch back to a device that has no context yet, it only remembers that
//! device as the current one (`targetDeviceIndex`, here `deferred`) until something needs it.
//! The CUDA runtime's own current device (`cudaGetDevice`, here `active`) stays where it was.
//! Every method below is one of PyTorch's functions and returns the device whose
//! `cudaSetDevice` it calls, if any: that call creates the device's context when it is missing.

/// A device whose `cudaSetDevice` a step calls (creating its context if missing), if any.
pub(crate) type Activation = Option<usize>;

/// The current-device bookkeeping of one process (PyTorch keeps it per thread; scripts run on
/// one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Selection {
    /// The CUDA runtime's current device (`cudaGetDevice`).
    active: usize,
    /// A device made current without creating its context (PyTorch's `targetDeviceIndex`).
    deferred: Option<usize>,
}

impl Selection {
    /// A process whose runtime has `device` current and no context anywhere.
    pub(crate) fn starting_on(device: usize) -> Selection {
        Selection {
            active: device,
            deferred: None,
        }
    }

    /// `torch.cuda.current_device()`: the deferred device if there is one, else the active.
    pub(crate) fn current(self) -> usize {
        self.deferred.unwrap_or(self.active)
    }

    /// `c10::cuda::SetDevice(d, force=true)`, which `torch.cuda.set_device` calls since
    /// PyTorch 2.8 (pytorch/pytorch#155900, so that `set_device(0)` creates device 0's context
    /// as `set_device(1)` creates device 1's): forgets any deferred device and always calls
    /// `cudaSetDevice(d)`.
    pub(crate) fn force_set(&mut self, device: usize) -> Activation {
        self.deferred = None;
        self.active = device;
        Some(device)
    }

    /// `c10::cuda::SetDevice(d)` (PyTorch's internal callers): forgets any deferred device and
    /// calls `cudaSetDevice(d)` unless `d` is the runtime's current device already.
    pub(crate) fn set(&mut self, device: usize) -> Activation {
        self.deferred = None;
        if device == self.active {
            return None;
        }
        self.active = device;
        Some(device)
    }

    /// `c10::cuda::ExchangeDevice(d)`, entering a device guard or a `torch.cuda.device` block:
    /// always creates `d`'s context, except when nothing is deferred and `d` is the runtime's
    /// current device. Returns the device current before, to restore on the way out.
    pub(crate) fn exchange(&mut self, device: usize) -> (usize, Activation) {
        match self.deferred.take() {
            Some(previous) => {
                self.active = device;
                (previous, Some(device))
            }
            None if device == self.active => (device, None),
            None => {
                let previous = self.active;
                self.active = device;
                (previous, Some(device))
            }
        }
    }

    /// `c10::cuda::MaybeExchangeDevice(d)`, leaving a `torch.cuda.device` block: switches back
    /// to `d` only when its context exists, else defers it.
    pub(crate) fn maybe_exchange(&mut self, device: usize, has_context: bool) -> Activation {
        if device == self.active {
            return None;
        }
        if has_context {
            self.active = device;
            Some(device)
        } else {
            self.deferred = Some(device);
            None
        }
    }

    /// `c10::cuda::MaybeSetDevice(d)`, leaving a device guard: [`Selection::set`] when `d`'s
    /// context exists, else defers it.
    pub(crate) fn maybe_set(&mut self, device: usize, has_context: bool) -> Activation {
        if has_context {
            self.set(device)
        } else {
            self.deferred = Some(device);
            None
        }
    }

    /// `c10::cuda::SetTargetDevice()`, which the caching allocator calls before every
    /// allocation: a deferred device becomes the runtime's current one.
    pub(crate) fn settle(&mut self) -> Activation {
        match self.deferred {
            Some(device) => self.set(device),
            None => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selecting_the_runtimes_device_calls_nothing() {
        let mut selection = Selection::starting_on(0);
        assert_eq!(selection.set(0), None);
        assert_eq!(selection.exchange(0), (0, None));
        assert_eq!(selection.settle(), None);
        assert_eq!(selection.set(1), Some(1));
        assert_eq!(selection.current(), 1);
    }

    #[test]
    fn torch_cuda_set_device_always_sets_the_device() {
        let mut selection = Selection::starting_on(0);
        assert_eq!(selection.force_set(0), Some(0));
        let (previous, _) = selection.exchange(1);
        selection.maybe_exchange(previous, false);
        assert_eq!(selection.force_set(1), Some(1));
        assert_eq!(selection.current(), 1, "the deferred device is forgotten");
    }

    #[test]
    fn leaving_a_device_block_defers_a_device_without_context() {
        // `with torch.cuda.device(1): ...` in a fresh process, then `set_device(0)`.
        let mut selection = Selection::starting_on(0);
        let (previous, activation) = selection.exchange(1);
        assert_eq!((previous, activation), (0, Some(1)));
        assert_eq!(selection.maybe_exchange(previous, false), None);
        assert_eq!(selection.current(), 0, "current_device() reports 0 again");
        // The runtime still has device 1 current, so even the internal SetDevice(0) calls
        // cudaSetDevice(0): the stray context on GPU 0.
        assert_eq!(selection.set(0), Some(0));
    }

    #[test]
    fn a_deferred_device_is_activated_by_the_next_allocation() {
        let mut selection = Selection::starting_on(0);
        let (previous, _) = selection.exchange(1);
        selection.maybe_exchange(previous, false);
        assert_eq!(selection.settle(), Some(0));
        assert_eq!(selection.settle(), None);
        assert_eq!(selection.current(), 0);
    }

    #[test]
    fn entering_a_guard_with_a_deferred_device_always_sets_the_device() {
        let mut selection = Selection::starting_on(0);
        let (previous, _) = selection.exchange(1);
        selection.maybe_exchange(previous, false);
        // PyTorch calls cudaSetDevice(1) although 1 is the runtime's device already.
        assert_eq!(selection.exchange(1), (0, Some(1)));
        assert_eq!(selection.maybe_set(0, false), None);
        assert_eq!(selection.current(), 0);
    }

    #[test]
    fn leaving_to_a_device_with_context_switches_back() {
        let mut selection = Selection::starting_on(0);
        let (previous, _) = selection.exchange(1);
        assert_eq!(selection.maybe_exchange(previous, true), Some(0));
        assert_eq!(selection, Selection::starting_on(0));
        let (previous, _) = selection.exchange(1);
        assert_eq!(selection.maybe_set(previous, true), Some(0));
        assert_eq!(selection, Selection::starting_on(0));
    }
}
