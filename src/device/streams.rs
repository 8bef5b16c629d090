//! Streams, events and synchronisation as the caching allocator sees them: [`StreamEvent`], the
//! marker [`super::DeviceMemory::record_event`] hands back (`cudaEventRecord`), and
//! [`StreamWork`], the simulated device's model of when queued work completes.
//!
//! The allocator records one event per stream a freed block was used on (`record_stream`) and
//! gives the block back to its pool only once each event has completed (PyTorch's
//! `insert_events`, `process_events`, `synchronize_and_free_events`). On a real GPU an event
//! completes when the stream's work up to it has run; the simulated device has no clock, so it
//! follows one rule (issue 19's): **a stream is idle unless a caller queued work on it, and a
//! stream's queued work completes at the next synchronisation point** — the stream's, the
//! device's, an event's, or a call CUDA makes synchronising (`cudaFree`, unmapping pages).
//! An event recorded on an idle stream is therefore complete at once.

use std::collections::BTreeMap;

/// A marker recorded in a stream's queue (`cudaEventRecord`): it completes once every piece of
/// work queued on `stream` before it has completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamEvent {
    /// The stream it was recorded on (the allocator's stream id; 0 = the default stream).
    pub stream: u64,
    /// The device's name for the event. On the simulated device, how many pieces of work were
    /// queued on the stream when it was recorded: the event is complete once that many have
    /// completed. On a CUDA device, the number of the driver event it keeps for this one.
    pub ticket: u64,
}

/// One stream's queue in the simulated device's model.
#[derive(Debug, Clone, Default)]
struct Queue {
    /// Pieces of work queued so far.
    queued: u64,
    /// Pieces of work completed so far (never more than `queued`; completion is in order).
    done: u64,
    /// Pieces of work that wait for another stream (`wait_stream`): (this stream's ticket,
    /// the other stream, the other stream's ticket it waits for).
    waits: Vec<(u64, u64, u64)>,
}

/// The simulated device's streams: what is queued on each, what has completed, and which
/// stream waits for which. Work completes only when something synchronises (see the module
/// documentation); everything here is deterministic.
#[derive(Debug, Clone, Default)]
pub struct StreamWork {
    queues: BTreeMap<u64, Queue>,
}

impl StreamWork {
    /// Queues one piece of work on `stream` that keeps it busy until the next synchronisation
    /// point (a kernel such as `gpu_sleep`'s).
    pub fn queue(&mut self, stream: u64) {
        self.queues.entry(stream).or_default().queued += 1;
    }

    /// Whether `stream` has queued work that has not completed.
    pub fn is_busy(&self, stream: u64) -> bool {
        self.queues
            .get(&stream)
            .is_some_and(|queue| queue.done < queue.queued)
    }

    /// Records an event on `stream` after the work queued on it so far.
    pub fn record(&self, stream: u64) -> StreamEvent {
        StreamEvent {
            stream,
            ticket: self.queues.get(&stream).map_or(0, |queue| queue.queued),
        }
    }

    /// Whether `event` has completed (`cudaEventQuery`).
    pub fn is_complete(&self, event: StreamEvent) -> bool {
        self.queues
            .get(&event.stream)
            .is_none_or(|queue| queue.done >= event.ticket)
    }

    /// Makes `stream`'s future work wait for the work queued on `other` so far
    /// (`cudaStreamWaitEvent` of an event recorded on `other`): when `other` is busy, `stream`
    /// gets a piece of work that completes only after `other`'s. Nothing changes when `other`
    /// is idle or is `stream` itself.
    pub fn wait(&mut self, stream: u64, other: u64) {
        if stream == other || !self.is_busy(other) {
            return;
        }
        let waited = self.queues.get(&other).map_or(0, |queue| queue.queued);
        let queue = self.queues.entry(stream).or_default();
        queue.queued += 1;
        let ticket = queue.queued;
        queue.waits.push((ticket, other, waited));
    }

    /// Completes the work `event` waits for (`cudaEventSynchronize`), and whatever that work
    /// waited for on other streams.
    pub fn synchronize_event(&mut self, event: StreamEvent) {
        self.complete(event.stream, event.ticket);
    }

    /// Completes everything queued on `stream` (`cudaStreamSynchronize`).
    pub fn synchronize_stream(&mut self, stream: u64) {
        let queued = self.queues.get(&stream).map_or(0, |queue| queue.queued);
        self.complete(stream, queued);
    }

    /// Completes everything queued on every stream (`cudaDeviceSynchronize`).
    pub fn synchronize_all(&mut self) {
        for queue in self.queues.values_mut() {
            queue.done = queue.queued;
            queue.waits.clear();
        }
    }

    /// Completes `stream`'s work up to `ticket`, first completing on other streams what that
    /// work waits for. Waits always point at work queued earlier, so this ends.
    fn complete(&mut self, stream: u64, ticket: u64) {
        let Some(queue) = self.queues.get_mut(&stream) else {
            return;
        };
        if queue.done >= ticket {
            return;
        }
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut queue.waits)
            .into_iter()
            .partition(|&(at, _, _)| at <= ticket);
        queue.waits = later;
        queue.done = ticket.min(queue.queued);
        for (_, other, waited) in due {
            self.complete(other, waited);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_on_an_idle_stream_is_complete_at_once() {
        let work = StreamWork::default();
        let event = work.record(7);
        assert!(work.is_complete(event));
        assert!(!work.is_busy(7));
    }

    #[test]
    fn queued_work_completes_only_when_something_synchronises() {
        let mut work = StreamWork::default();
        work.queue(1);
        let first = work.record(1);
        assert!(!work.is_complete(first), "busy until a synchronisation");
        work.queue(1);
        let second = work.record(1);
        work.synchronize_event(first);
        assert!(work.is_complete(first));
        assert!(!work.is_complete(second), "later work still queued");
        assert!(work.is_busy(1));
        work.synchronize_stream(1);
        assert!(work.is_complete(second));
        work.queue(1);
        work.queue(2);
        let (on_one, on_two) = (work.record(1), work.record(2));
        work.synchronize_stream(2);
        assert!(work.is_complete(on_two) && !work.is_complete(on_one));
        work.synchronize_all();
        assert!(work.is_complete(on_one));
        assert!(!work.is_busy(1) && !work.is_busy(2));
    }

    #[test]
    fn a_stream_that_waits_for_another_completes_after_it() {
        let mut work = StreamWork::default();
        work.wait(1, 2);
        assert!(
            !work.is_busy(1),
            "waiting for an idle stream queues nothing"
        );
        work.queue(2);
        work.wait(1, 2);
        let on_one = work.record(1);
        assert!(
            !work.is_complete(on_one),
            "stream 1 now waits for stream 2's work"
        );
        work.queue(2);
        work.synchronize_event(on_one);
        assert!(work.is_complete(on_one));
        assert!(
            work.is_complete(StreamEvent {
                stream: 2,
                ticket: 1
            }),
            "the work it waited for completed first"
        );
        assert!(
            work.is_busy(2),
            "work queued on stream 2 after the wait is not waited for"
        );
        work.wait(3, 3);
        assert!(!work.is_busy(3));
    }
}
