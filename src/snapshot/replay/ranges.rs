//! A set of disjoint address ranges, merged as they are added: which pages of expandable
//! segments a trace has mapped or unmapped so far, and the parts of a range it has not.

use std::collections::BTreeMap;

/// Disjoint half-open ranges `[start, end)`, adjacent ones merged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ranges {
    /// start → end.
    spans: BTreeMap<u64, u64>,
}

impl Ranges {
    /// The parts of `[start, end)` that no range of the set covers, in address order.
    pub fn gaps(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut gaps = Vec::new();
        let mut cursor = start;
        // The range that begins before `start` may cover its beginning.
        if let Some((_, &before_end)) = self.spans.range(..=start).next_back() {
            cursor = cursor.max(before_end);
        }
        for (&span_start, &span_end) in self.spans.range(start..end) {
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

    /// Adds `[start, end)`, merging it with the ranges it touches or overlaps.
    pub fn insert(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let mut new_start = start;
        let mut new_end = end;
        if let Some((&before_start, &before_end)) = self.spans.range(..=start).next_back() {
            if before_end >= start {
                new_start = before_start;
                new_end = new_end.max(before_end);
            }
        }
        let absorbed: Vec<u64> = self
            .spans
            .range(new_start..=new_end)
            .map(|(&span_start, _)| span_start)
            .collect();
        for span_start in absorbed {
            if let Some(span_end) = self.spans.remove(&span_start) {
                new_end = new_end.max(span_end);
            }
        }
        self.spans.insert(new_start, new_end);
    }

    /// The ranges, lowest first.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.spans.iter().map(|(&start, &end)| (start, end))
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
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
}
