//! Min/max envelopes of allocated and reserved bytes over a run's event numbers, kept in a
//! bounded number of buckets however long the run: what lets a chart of ten million events
//! draw every peak exactly.
//!
//! Bucket `b` covers the event numbers `origin + b × width .. origin + (b + 1) × width` and
//! holds the lowest and highest value each figure took there: the values after each event in
//! it, and the value carried in from before when its first event is not at its start (a step
//! chart holds each value until the next event). `width` starts at 1 and doubles, merging
//! neighbours, whenever the run outgrows [`Envelope::max_buckets`]: memory is bounded by that,
//! never by the number of events, and no value is ever dropped, so the envelope's highest
//! value is the run's peak exactly and the peak's bucket is where it happened.

/// The lowest and highest bytes a figure took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    /// Lowest value.
    pub min: u64,
    /// Highest value.
    pub max: u64,
}

impl Range {
    /// The range of one value.
    pub fn of(value: u64) -> Range {
        Range {
            min: value,
            max: value,
        }
    }

    /// The range covering both.
    pub fn merge(self, other: Range) -> Range {
        Range {
            min: self.min.min(other.min),
            max: self.max.max(other.max),
        }
    }

    fn include(&mut self, value: u64) {
        self.min = self.min.min(value);
        self.max = self.max.max(value);
    }
}

/// What allocated and reserved bytes did over a stretch of event numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    /// Allocated bytes (`memory_allocated()`).
    pub allocated: Range,
    /// Reserved bytes (`memory_reserved()`).
    pub reserved: Range,
}

impl Bucket {
    /// The bucket of one state.
    pub fn of(allocated: u64, reserved: u64) -> Bucket {
        Bucket {
            allocated: Range::of(allocated),
            reserved: Range::of(reserved),
        }
    }

    /// The bucket covering both.
    pub fn merge(self, other: Bucket) -> Bucket {
        Bucket {
            allocated: self.allocated.merge(other.allocated),
            reserved: self.reserved.merge(other.reserved),
        }
    }
}

/// The envelope of a run: buckets of `width` event numbers from `origin`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    /// The first event number covered (the state before the first event is drawn from here).
    pub origin: u64,
    /// Event numbers per bucket: a power of two.
    pub width: u64,
    /// The buckets, from `origin` on, without gaps.
    pub buckets: Vec<Bucket>,
    /// The most buckets kept before neighbours are merged.
    pub max_buckets: usize,
    /// The state after the last event seen (carried into later buckets).
    last: (u64, u64),
}

impl Envelope {
    /// The most buckets an envelope keeps by default: 65,536 (2 MiB of buckets, one per
    /// 153 events of a ten-million-event run).
    pub const MAX_BUCKETS: usize = 1 << 16;

    /// An envelope from event number `origin` with the state `(allocated, reserved)` before
    /// the first event, keeping at most `max_buckets` buckets (at least 2).
    pub fn new(origin: u64, allocated: u64, reserved: u64, max_buckets: usize) -> Envelope {
        Envelope {
            origin,
            width: 1,
            buckets: vec![Bucket::of(allocated, reserved)],
            max_buckets: max_buckets.max(2),
            last: (allocated, reserved),
        }
    }

    /// The event number after the last bucket: the envelope covers `origin..end()`.
    pub fn end(&self) -> u64 {
        self.origin + self.width * self.buckets.len() as u64
    }

    /// The state `(allocated, reserved)` after the last event seen.
    pub fn last(&self) -> (u64, u64) {
        self.last
    }

    /// Notes the state after an event numbered `position` (never below the last one noted;
    /// an earlier number counts as the last).
    pub fn record(&mut self, position: u64, allocated: u64, reserved: u64) {
        let offset = position.saturating_sub(self.origin);
        while offset / self.width >= self.max_buckets as u64 {
            self.coarsen();
        }
        let index = ((offset / self.width) as usize).max(self.buckets.len() - 1);
        if index >= self.buckets.len() {
            let (carried_allocated, carried_reserved) = self.last;
            // Buckets the run passed without an event hold the carried state throughout; the
            // event's own bucket holds it before the event unless the event opens the bucket.
            self.buckets
                .resize(index + 1, Bucket::of(carried_allocated, carried_reserved));
            if offset.is_multiple_of(self.width) {
                self.buckets[index] = Bucket::of(allocated, reserved);
            }
        }
        let bucket = &mut self.buckets[index];
        bucket.allocated.include(allocated);
        bucket.reserved.include(reserved);
        self.last = (allocated, reserved);
    }

    /// Closes the envelope at event number `end` (exclusive): the last state holds until
    /// there.
    pub fn close(&mut self, end: u64) {
        let (allocated, reserved) = self.last;
        if end > self.end() {
            self.record(end - 1, allocated, reserved);
        }
    }

    /// Merges neighbouring buckets: half as many, twice as wide.
    fn coarsen(&mut self) {
        let merged: Vec<Bucket> = self
            .buckets
            .chunks(2)
            .map(|pair| {
                pair.iter()
                    .copied()
                    .reduce(Bucket::merge)
                    .unwrap_or(pair[0])
            })
            .collect();
        self.buckets = merged;
        self.width *= 2;
    }

    /// The buckets covering event numbers `from..to`, merged (`None` when the range is empty
    /// or outside the envelope).
    pub fn over(&self, from: u64, to: u64) -> Option<Bucket> {
        if to <= from || to <= self.origin || from >= self.end() {
            return None;
        }
        let first = (from.saturating_sub(self.origin) / self.width) as usize;
        let last = ((to - 1).saturating_sub(self.origin) / self.width) as usize;
        self.buckets
            .get(first..=last.min(self.buckets.len() - 1))?
            .iter()
            .copied()
            .reduce(Bucket::merge)
    }

    /// The highest allocated and reserved bytes over the run, each with the first event
    /// number of the bucket it is in.
    pub fn peaks(&self) -> ((u64, u64), (u64, u64)) {
        let mut allocated = (0, self.origin);
        let mut reserved = (0, self.origin);
        for (index, bucket) in self.buckets.iter().enumerate() {
            let at = self.origin + index as u64 * self.width;
            if bucket.allocated.max > allocated.0 {
                allocated = (bucket.allocated.max, at);
            }
            if bucket.reserved.max > reserved.0 {
                reserved = (bucket.reserved.max, at);
            }
        }
        (allocated, reserved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The states of a run as (position, allocated, reserved), and each position's exact
    /// range, computed naively.
    fn naive(states: &[(u64, u64, u64)], initial: (u64, u64), end: u64) -> Vec<Bucket> {
        let mut per_position = vec![None::<Bucket>; end as usize];
        let mut last = initial;
        let mut next = 0;
        for position in 0..end {
            let mut bucket = None::<Bucket>;
            while next < states.len() && states[next].0 == position {
                let state = Bucket::of(states[next].1, states[next].2);
                bucket = Some(bucket.map_or(state, |b| b.merge(state)));
                last = (states[next].1, states[next].2);
                next += 1;
            }
            per_position[position as usize] = Some(bucket.unwrap_or(Bucket::of(last.0, last.1)));
        }
        per_position.into_iter().flatten().collect()
    }

    #[test]
    fn buckets_hold_exact_extremes_however_often_they_merge() {
        // A pseudo-random walk with several events at some positions and gaps at others.
        let mut seed = 0x2545_F491_4F6C_DD1D_u64;
        let mut random = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut states = Vec::new();
        let (mut allocated, mut reserved) = (100_u64, 1000_u64);
        let mut position = 1;
        for _ in 0..5000 {
            position += random() % 3;
            allocated = (allocated + random() % 50).saturating_sub(random() % 50);
            reserved = reserved.max(allocated) + random() % 2;
            states.push((position, allocated, reserved));
        }
        let end = position + 1;
        let mut envelope = Envelope::new(0, 100, 1000, 64);
        for &(position, allocated, reserved) in &states {
            envelope.record(position, allocated, reserved);
        }
        envelope.close(end);
        assert!(envelope.buckets.len() <= 64 && envelope.width > 1);
        assert!(envelope.end() >= end);
        let exact = naive(&states, (100, 1000), end);
        for (index, bucket) in envelope.buckets.iter().enumerate() {
            let from = index as u64 * envelope.width;
            let to = (from + envelope.width).min(end);
            if from >= end {
                continue;
            }
            let expected = exact[from as usize..to as usize]
                .iter()
                .copied()
                .reduce(Bucket::merge);
            assert_eq!(Some(*bucket), expected, "bucket {index}");
        }
        let peak = states.iter().map(|s| s.1).max().unwrap_or(0);
        let ((value, at), _) = envelope.peaks();
        assert_eq!(value, peak);
        let first_peak = states.iter().find(|s| s.1 == peak).map_or(0, |s| s.0);
        assert!(at <= first_peak && first_peak < at + envelope.width);
    }

    #[test]
    fn a_value_carried_into_a_bucket_counts_until_the_first_event_in_it() {
        let mut envelope = Envelope::new(0, 5, 5, 8);
        envelope.record(1, 9, 9);
        envelope.record(4, 2, 9);
        envelope.close(5);
        let allocated: Vec<(u64, u64)> = envelope
            .buckets
            .iter()
            .map(|b| (b.allocated.min, b.allocated.max))
            .collect();
        assert_eq!(allocated, [(5, 5), (9, 9), (9, 9), (9, 9), (2, 2)]);
        assert_eq!(
            envelope.over(0, 2).map(|b| b.allocated),
            Some(Range { min: 5, max: 9 })
        );
        assert_eq!(envelope.over(3, 3), None);
    }
}
