//! Watching a session beyond one allocator's event stream: what a timeline of a whole script
//! needs to know that no allocator can tell it. A script's `with_allocator_conf` makes a second
//! allocator current for a while (its events go to that allocator's own subscribers), and
//! `mark(text)` names a phase of the script, which belongs to no allocator.
//!
//! A [`SessionWatcher`] set on a [`super::Runtime`] ([`super::Runtime::watch`]) is told when
//! an allocator becomes current (so it can subscribe a recorder to it before its first event),
//! when it stops being current (to read its counters while it still exists), and each mark.
//! With several devices, each device's runtime takes its own watcher.

use crate::alloc::CachingAllocator;

/// Told what a timeline of a whole session needs beyond one allocator's events.
pub trait SessionWatcher {
    /// `allocator` became current (a `with_allocator_conf` closure begins), before its first
    /// event. Its trace context is the caller's (the script line that made it).
    fn allocator_started(&mut self, allocator: &mut CachingAllocator);
    /// The allocator made current last stops being current (its closure ended): its state is
    /// final unless tensors made in it outlive the closure.
    fn allocator_ended(&mut self, allocator: &CachingAllocator);
    /// The script marked a phase named `text` (`mark(text)`), `context` being the caller's
    /// trace context (its script line).
    fn mark(&mut self, text: &str, context: u32);
}
