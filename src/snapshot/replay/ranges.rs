//! Sets of disjoint address ranges, merged as they are added: which pages of expandable
//! segments a trace has mapped or unmapped so far, and the parts of a range it has not
//! ([`Ranges`]); the pages mapped now with the event each mapped range began at
//! ([`super::mapped::MappedSince`]).

use std::collections::BTreeMap;

/// Disjoint half-open ranges `[start, end)`, adjacent ones merged, each carrying a value that
/// merging combines.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Spans<V> {
    /// start → (end, value).
    spans: BTreeMap<u64, (u64, V)>,
}

/// Disjoint half-open ranges `[start, end)`, adjacent ones merged.
pub type Ranges = Spans<()>;

impl<V: Copy> Spans<V> {
    /// The parts of `[start, end)` that no range of the set covers, in address order.
    pub fn gaps(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut gaps = Vec::new();
        let mut cursor = start;
        // The range that begins before `start` may cover its beginning.
        if let Some((_, &(before_end, _))) = self.spans.range(..=start).next_back() {
            cursor = cursor.max(before_end);
        }
        for (&span_start, &(span_end, _)) in self.spans.range(start..end) {
            if span_start > cursor {
                gaps.push((cursor, span_start));
            }
            cursor = cursor.max(span_end);
        }
        if cursor < end {
            gaps.push((cursor, end));
        }
        gaps
    }

    /// Adds `[start, end)` with `value`, merging it with the ranges it touches or overlaps;
    /// `join` combines the values of merged ranges.
    pub fn insert_with(&mut self, start: u64, end: u64, value: V, join: impl Fn(V, V) -> V) {
        if start >= end {
            return;
        }
        let (mut new_start, mut new_end, mut new_value) = (start, end, value);
        if let Some((&before_start, &(before_end, _))) = self.spans.range(..=start).next_back() {
            if before_end >= start {
                new_start = before_start;
            }
        }
        let absorbed: Vec<u64> = self
            .spans
            .range(new_start..=new_end)
            .map(|(&span_start, _)| span_start)
            .collect();
        for span_start in absorbed {
            if let Some((span_end, span_value)) = self.spans.remove(&span_start) {
                new_end = new_end.max(span_end);
                new_value = join(new_value, span_value);
            }
        }
        self.spans.insert(new_start, (new_end, new_value));
    }

    /// Takes `[start, end)` out of the set: what is left of each range it cut keeps its value.
    pub fn remove(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let first = self
            .spans
            .range(..start)
            .next_back()
            .filter(|(_, &(span_end, _))| span_end > start)
            .map(|(&span_start, _)| span_start);
        let cut: Vec<u64> = first
            .into_iter()
            .chain(
                self.spans
                    .range(start..end)
                    .map(|(&span_start, _)| span_start),
            )
            .collect();
        for span_start in cut {
            if let Some((span_end, value)) = self.spans.remove(&span_start) {
                if span_start < start {
                    self.spans.insert(span_start, (start, value));
                }
                if end < span_end {
                    self.spans.insert(end, (span_end, value));
                }
            }
        }
    }

    /// The value of the range holding `addr`, if one does.
    pub fn value_at(&self, addr: u64) -> Option<V> {
        let (_, &(end, value)) = self.spans.range(..=addr).next_back()?;
        (addr < end).then_some(value)
    }

    /// The ranges, lowest first.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.spans.iter().map(|(&start, &(end, _))| (start, end))
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }
}

impl Ranges {
    /// Adds `[start, end)`, merging it with the ranges it touches or overlaps.
    pub fn insert(&mut self, start: u64, end: u64) {
        self.insert_with(start, end, (), |(), ()| ());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_and_merges() {
        let mut ranges = Ranges::default();
        assert_eq!(ranges.gaps(10, 20), [(10, 20)]);
        ranges.insert(10, 20);
        ranges.insert(30, 40);
        assert_eq!(ranges.gaps(0, 50), [(0, 10), (20, 30), (40, 50)]);
        assert_eq!(ranges.gaps(15, 35), [(20, 30)]);
        assert!(ranges.gaps(12, 18).is_empty());
        ranges.insert(20, 30);
        assert_eq!(ranges.iter().collect::<Vec<_>>(), [(10, 40)]);
        ranges.insert(5, 12);
        ranges.insert(38, 45);
        assert_eq!(ranges.iter().collect::<Vec<_>>(), [(5, 45)]);
        ranges.insert(50, 50);
        assert_eq!(ranges.iter().count(), 1);
        assert!(!ranges.is_empty());
    }

    #[test]
    fn removing_cuts_ranges_and_keeps_their_values() {
        let mut spans: Spans<u64> = Spans::default();
        spans.insert_with(10, 40, 7, u64::min);
        spans.remove(20, 25);
        assert_eq!(spans.iter().collect::<Vec<_>>(), [(10, 20), (25, 40)]);
        assert_eq!((spans.value_at(15), spans.value_at(30)), (Some(7), Some(7)));
        assert_eq!(spans.value_at(22), None);
        spans.remove(0, 100);
        assert!(spans.is_empty());
    }
}
