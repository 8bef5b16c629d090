//! What a snapshot file may make the reader do. A pickle is a program for a stack machine and
//! a snapshot file is untrusted input (a colleague's OOM dump, a file attached to a bug report),
//! so the reader bounds, in proportion to the file's size:
//!
//! - how deep values nest (the values are dropped, cloned and compared recursively);
//! - how many values the memo keeps;
//! - the memory the values it builds hold at any moment ([`Budget::hold`]);
//! - the work spent copying and scanning values that the file refers to more than once
//!   ([`Budget::spend`]), which a few bytes can ask for again and again.
//!
//! Every other opcode does a bounded amount of work per byte, so with these the time to read a
//! file is linear in its size. A refusal names the byte offset and the limit ([`Refusal`]).

/// Bytes in a mebibyte.
const MIB: u64 = 1 << 20;

/// How far a file may push the reader. [`ReadLimits::default`] is what `gpumem replay` uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadLimits {
    /// Deepest nesting of containers in one value (a list in a dict in a list is 3). PyTorch's
    /// snapshots nest 7 deep (the snapshot, `segments`, a segment, its `blocks`, a block, its
    /// `frames`, a frame), 9 in the legacy layout whose blocks carry a `history`.
    pub max_depth: u32,
    /// Most memo ids holding a value at once (ids of containers that a streaming read drops
    /// hold none and do not count). Every id is also charged to the memory budget; this bound
    /// only names a flood of ids plainly.
    pub max_memo_entries: usize,
    /// Bytes of values the reader may hold at once, whatever the file's size.
    pub base_memory: u64,
    /// And this many more per byte of the file.
    pub memory_per_byte: u64,
    /// Values the reader may copy or scan because the file refers to them again (`GET`, `DUP`,
    /// memoizing a finished container), whatever the file's size.
    pub base_work: u64,
    /// And this many more per byte of the file.
    pub work_per_byte: u64,
}

impl Default for ReadLimits {
    /// Limits under which the reader holds at most 32 MiB + 1 × the file's size (the values it
    /// holds are charged at what they cost at worst: twice their size for the spare capacity
    /// of their vectors, hash tables while they grow, a string's header), and reads in time
    /// linear in the file's size. With the replay's own share ([`crate::snapshot::replay`]'s
    /// live allocations: 16 MiB + 1 × the file's size) and the process itself (about 12 MiB of
    /// code, stacks and buffers), `gpumem replay` stays within issue 21's bound of
    /// 64 MiB + 2 × the file's size on any input.
    fn default() -> Self {
        ReadLimits {
            max_depth: 64,
            max_memo_entries: 1 << 30,
            base_memory: 32 * MIB,
            memory_per_byte: 1,
            base_work: 64 * MIB,
            work_per_byte: 16,
        }
    }
}

/// Why the reader refused to go on: where, and which limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Byte offset in the file.
    pub offset: u64,
    /// Which limit, with its value.
    pub message: String,
}

/// The memory and work a file has used so far, against its allowance.
#[derive(Debug, Clone)]
pub struct Budget {
    limits: ReadLimits,
    /// The file's size when known (0 when not): the allowance follows the larger of it and the
    /// bytes read so far.
    size: u64,
    /// Bytes of values held now.
    held: u64,
    /// The most bytes held at once.
    peak: u64,
    /// Values copied or scanned so far.
    spent: u64,
}

impl Budget {
    /// A budget under `limits` for a file of `size` bytes (`None`: unknown, the allowance then
    /// grows with the bytes read).
    pub fn new(limits: ReadLimits, size: Option<u64>) -> Budget {
        Budget {
            limits,
            size: size.unwrap_or(0),
            held: 0,
            peak: 0,
            spent: 0,
        }
    }

    /// The limits.
    pub fn limits(&self) -> &ReadLimits {
        &self.limits
    }

    /// Bytes of values held now.
    pub fn held(&self) -> u64 {
        self.held
    }

    /// The most bytes of values held at once so far.
    pub fn peak(&self) -> u64 {
        self.peak
    }

    /// Values copied or scanned so far.
    pub fn spent(&self) -> u64 {
        self.spent
    }

    fn scale(&self, offset: u64) -> u64 {
        self.size.max(offset)
    }

    /// The memory allowed for a file whose size is known to be at least `scale` bytes.
    pub fn memory_allowance(&self, scale: u64) -> u64 {
        self.limits
            .base_memory
            .saturating_add(self.limits.memory_per_byte.saturating_mul(scale))
    }

    fn work_allowance(&self, scale: u64) -> u64 {
        self.limits
            .base_work
            .saturating_add(self.limits.work_per_byte.saturating_mul(scale))
    }

    /// Takes `bytes` more of memory, read at `offset`, or refuses.
    pub fn hold(&mut self, bytes: u64, offset: u64) -> Result<(), Refusal> {
        self.hold_expecting(bytes, offset, offset)
    }

    /// [`Budget::hold`] for a value the file says is `bytes` long, whose data will end at byte
    /// `end` if the file really holds it: the allowance may count those bytes too (a file that
    /// ends early is refused as truncated when they are read).
    pub fn hold_expecting(&mut self, bytes: u64, offset: u64, end: u64) -> Result<(), Refusal> {
        let held = self.held.saturating_add(bytes);
        let allowance = self.memory_allowance(self.scale(end));
        if held > allowance {
            return Err(Refusal {
                offset,
                message: format!(
                    "the values read so far would hold {held} bytes of memory, over the reader's limit of {allowance} bytes for this file ({} MiB + {} per byte of the file)",
                    self.limits.base_memory / MIB,
                    self.limits.memory_per_byte
                ),
            });
        }
        self.held = held;
        self.peak = self.peak.max(held);
        Ok(())
    }

    /// Gives back `bytes` of memory (a value was dropped or handed out).
    pub fn release(&mut self, bytes: u64) {
        self.held = self.held.saturating_sub(bytes);
    }

    /// Spends `units` of work (values copied or scanned), at `offset`, or refuses.
    pub fn spend(&mut self, units: u64, offset: u64) -> Result<(), Refusal> {
        let spent = self.spent.saturating_add(units);
        let allowance = self.work_allowance(self.scale(offset));
        if spent > allowance {
            return Err(Refusal {
                offset,
                message: format!(
                    "copying the values the file refers to again would take {spent} steps, over the reader's limit of {allowance} for this file ({} Mi + {} per byte of the file)",
                    self.limits.base_work / MIB,
                    self.limits.work_per_byte
                ),
            });
        }
        self.spent = spent;
        Ok(())
    }

    /// Refuses a value nested `depth` levels deep, found at `offset`, when that is over the
    /// limit.
    pub fn check_depth(&self, depth: u32, offset: u64) -> Result<(), Refusal> {
        if depth > self.limits.max_depth {
            return Err(Refusal {
                offset,
                message: format!(
                    "values nested more than {} levels deep (the reader's limit; PyTorch's snapshots nest at most 9)",
                    self.limits.max_depth
                ),
            });
        }
        Ok(())
    }

    /// Refuses a memo of `entries` values, at `offset`, when that is over the limit.
    pub fn check_memo(&self, entries: usize, offset: u64) -> Result<(), Refusal> {
        if entries > self.limits.max_memo_entries {
            return Err(Refusal {
                offset,
                message: format!(
                    "the memo would keep more than {} values (the reader's limit)",
                    self.limits.max_memo_entries
                ),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> ReadLimits {
        ReadLimits {
            max_depth: 3,
            max_memo_entries: 2,
            base_memory: 100,
            memory_per_byte: 2,
            base_work: 10,
            work_per_byte: 1,
        }
    }

    #[test]
    fn memory_is_held_and_released_within_the_allowance() {
        let mut budget = Budget::new(small(), Some(50));
        assert!(budget.hold(200, 0).is_ok());
        assert_eq!(budget.held(), 200);
        let refusal = budget
            .hold(1, 7)
            .expect_err("200 = 100 + 2 × 50 is the limit");
        assert_eq!(refusal.offset, 7);
        assert!(
            refusal.message.contains("limit of 200 bytes"),
            "{refusal:?}"
        );
        budget.release(150);
        assert!(budget.hold(100, 8).is_ok());
    }

    #[test]
    fn an_unknown_size_grows_with_the_bytes_read_or_promised() {
        let mut budget = Budget::new(small(), None);
        assert!(budget.hold(101, 0).is_err());
        assert!(budget.hold(101, 1).is_ok());
        assert!(budget.hold_expecting(999, 1, 500).is_ok());
        assert!(
            budget.hold(1, 1).is_err(),
            "what was promised is not there yet"
        );
    }

    #[test]
    fn work_is_never_given_back() {
        let mut budget = Budget::new(small(), Some(5));
        assert!(budget.spend(15, 0).is_ok());
        assert!(budget.spend(1, 3).is_err());
    }

    #[test]
    fn depth_and_memo_limits_name_themselves() {
        let budget = Budget::new(small(), Some(5));
        assert!(budget.check_depth(3, 0).is_ok());
        let refusal = budget.check_depth(4, 9).expect_err("too deep");
        assert_eq!(refusal.offset, 9);
        assert!(refusal.message.contains("more than 3 levels"));
        assert!(budget.check_memo(2, 0).is_ok());
        assert!(budget
            .check_memo(3, 0)
            .expect_err("too many")
            .message
            .contains("more than 2 values"));
    }
}
