//! The pages of expandable segments a trace has mapped and still holds, each contiguous mapped
//! range with the event at which it began: where a private pool's expandable segment was made.
//!
//! PyTorch releases an expandable segment (its address reservation) once its last page is
//! unmapped, and the driver may hand the same addresses to the next reservation, of another
//! pool. So a range mapped from nothing is a new segment, and only allocations made in it from
//! then on are that segment's pool's; a range that grows, or is mapped again around pages still
//! held, is the segment it touches.

use super::ranges::Spans;

/// Disjoint mapped ranges, adjacent ones merged, each with the index of the event that began
/// it (the earliest of those merged).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MappedSince(Spans<u64>);

impl MappedSince {
    /// Pages `[start, end)` were mapped at event `index`: joined to the ranges they touch or
    /// overlap (the earliest beginning is kept), else a range of their own begun here.
    pub fn map(&mut self, start: u64, end: u64, index: u64) {
        self.0.insert_with(start, end, index, u64::min);
    }

    /// Pages `[start, end)` were unmapped: the ranges lose them, and what is left of each
    /// keeps its beginning.
    pub fn unmap(&mut self, start: u64, end: u64) {
        self.0.remove(start, end);
    }

    /// The event at which the mapped range holding `addr` began, if `addr` is mapped.
    pub fn began(&self, addr: u64) -> Option<u64> {
        self.0.value_at(addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One step: map (with the event index) or unmap a range, then where an address's
    /// mapped range began, and why.
    enum Step {
        Map(u64, u64, u64),
        Unmap(u64, u64),
    }

    #[test]
    fn a_range_mapped_from_nothing_begins_anew() {
        use Step::*;
        let steps: [(Step, u64, Option<u64>, &str); 9] = [
            (Map(100, 110, 1), 105, Some(1), "a range of its own"),
            (Map(110, 130, 5), 125, Some(1), "grown: the same segment"),
            (
                Unmap(110, 120),
                125,
                Some(1),
                "a hole inside keeps the rest",
            ),
            (
                Map(110, 120, 9),
                115,
                Some(1),
                "mapped again between held pages",
            ),
            (Unmap(90, 140), 100, None, "all unmapped: released"),
            (Map(100, 110, 12), 100, Some(12), "a new segment there"),
            (Map(200, 210, 13), 205, Some(13), "another range"),
            (
                Map(150, 205, 14),
                150,
                Some(13),
                "joined: the earliest beginning",
            ),
            (Map(5, 5, 15), 5, None, "an empty range maps nothing"),
        ];
        let mut mapped = MappedSince::default();
        for (step, addr, began, why) in steps {
            match step {
                Map(start, end, index) => mapped.map(start, end, index),
                Unmap(start, end) => mapped.unmap(start, end),
            }
            assert_eq!(mapped.began(addr), began, "{why}");
        }
    }
}
