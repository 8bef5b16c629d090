//! The recorded device-level events (`segment_alloc`, `segment_free`, `segment_map`,
//! `segment_unmap`) against the ones gpumem's allocator made, paired in order.

use std::collections::VecDeque;

use serde::Serialize;

use crate::alloc::EventKind;

/// One device-level event: (kind, address, bytes).
pub type DeviceEvent = (EventKind, u64, u64);

/// One side of a pairing: the event and the index of the recorded event during which it
/// happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Seen {
    /// Index of the recorded event (for gpumem's side: of the event being replayed).
    pub index: u64,
    /// PyTorch's action name.
    pub action: &'static str,
    /// Address.
    pub addr: u64,
    /// Bytes.
    pub size: u64,
}

/// The first pair whose action or size differs (or an event without a partner).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Difference {
    /// Position in the sequence of device events (0-based).
    pub position: u64,
    /// What PyTorch recorded there, if anything.
    pub recorded: Option<Seen>,
    /// What gpumem did there, if anything.
    pub replayed: Option<Seen>,
}

/// The comparison so far.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SegmentComparison {
    /// Device events in the file.
    pub recorded: u64,
    /// Device events gpumem made.
    pub replayed: u64,
    /// Positions where the action or size differ, plus events without a partner.
    pub differing: u64,
    /// Pairs that agree in action and size and also in address.
    pub same_address: u64,
    /// Pairs that agree in action and size and in the address's offset from their side's
    /// first device event (the same layout, wherever the address space starts).
    pub same_offset: u64,
    /// The first difference.
    pub first_difference: Option<Difference>,
    #[serde(skip)]
    waiting_recorded: VecDeque<Seen>,
    #[serde(skip)]
    waiting_replayed: VecDeque<Seen>,
    #[serde(skip)]
    paired: u64,
    /// Each side's first device event address.
    #[serde(skip)]
    origins: (Option<u64>, Option<u64>),
}

impl SegmentComparison {
    /// A device event from the file.
    pub fn recorded(&mut self, index: u64, (action, addr, size): DeviceEvent) {
        self.recorded += 1;
        self.waiting_recorded.push_back(Seen {
            index,
            action: action.name(),
            addr,
            size,
        });
        self.pair();
    }

    /// A device event gpumem made while replaying event `index`.
    pub fn replayed(&mut self, index: u64, (action, addr, size): DeviceEvent) {
        self.replayed += 1;
        self.waiting_replayed.push_back(Seen {
            index,
            action: action.name(),
            addr,
            size,
        });
        self.pair();
    }

    fn pair(&mut self) {
        while !self.waiting_recorded.is_empty() && !self.waiting_replayed.is_empty() {
            let recorded = self.waiting_recorded.pop_front();
            let replayed = self.waiting_replayed.pop_front();
            if let (Some(a), Some(b)) = (recorded, replayed) {
                if a.action == b.action && a.size == b.size {
                    if a.addr == b.addr {
                        self.same_address += 1;
                    }
                    let recorded_origin = *self.origins.0.get_or_insert(a.addr);
                    let replayed_origin = *self.origins.1.get_or_insert(b.addr);
                    if a.addr.wrapping_sub(recorded_origin) == b.addr.wrapping_sub(replayed_origin)
                    {
                        self.same_offset += 1;
                    }
                } else {
                    self.differ(Some(a), Some(b));
                }
            }
            self.paired += 1;
        }
    }

    fn differ(&mut self, recorded: Option<Seen>, replayed: Option<Seen>) {
        self.differing += 1;
        if self.first_difference.is_none() {
            self.first_difference = Some(Difference {
                position: self.paired,
                recorded,
                replayed,
            });
        }
    }

    /// Ends the comparison: events still without a partner differ.
    pub fn finish(&mut self) {
        while let Some(seen) = self.waiting_recorded.pop_front() {
            self.differ(Some(seen), None);
            self.paired += 1;
        }
        while let Some(seen) = self.waiting_replayed.pop_front() {
            self.differ(None, Some(seen));
            self.paired += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::model::Action;

    #[test]
    fn pairs_in_order_and_reports_the_first_difference() {
        let mut comparison = SegmentComparison::default();
        comparison.recorded(0, (Action::SegmentAlloc, 10, 2 << 20));
        comparison.replayed(1, (Action::SegmentAlloc, 10, 2 << 20));
        comparison.recorded(5, (Action::SegmentAlloc, 30, 20 << 20));
        comparison.replayed(6, (Action::SegmentAlloc, 40, 20 << 20));
        comparison.recorded(7, (Action::SegmentFree, 30, 20 << 20));
        comparison.replayed(8, (Action::SegmentAlloc, 50, 4 << 20));
        comparison.recorded(9, (Action::SegmentAlloc, 60, 2 << 20));
        comparison.finish();
        assert_eq!(comparison.recorded, 4);
        assert_eq!(comparison.replayed, 3);
        assert_eq!(comparison.same_address, 1);
        assert_eq!(comparison.same_offset, 1);
        assert_eq!(comparison.differing, 2);
        let first = comparison.first_difference.expect("a difference");
        assert_eq!(first.position, 2);
        assert_eq!(first.recorded.map(|s| s.index), Some(7));
        assert_eq!(first.replayed.map(|s| s.size), Some(4 << 20));
    }
}
