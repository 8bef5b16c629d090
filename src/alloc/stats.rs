//! Counters with PyTorch's names and meaning (`c10::CachingDeviceAllocator::DeviceStats`), and
//! their flattening into the keys `torch.cuda.memory_stats()` returns.

use super::Pool;

/// One counter: its current value, the highest it reached since the last peak reset, and the
/// totals added and removed since the last accumulated reset.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stat {
    /// Value now.
    pub current: i64,
    /// Highest `current` since the last `reset_peak_memory_stats`.
    pub peak: i64,
    /// Sum of all increases since the last `reset_accumulated_memory_stats`.
    pub allocated: i64,
    /// Sum of all decreases since the last `reset_accumulated_memory_stats`.
    pub freed: i64,
    /// Highest `current` since the innermost open measurement scope began
    /// ([`DeviceStats::begin_scope`]); untouched by `reset_peak_memory_stats`.
    pub scope_peak: i64,
}

impl Stat {
    /// Adds `amount` (PyTorch's `Stat::increase`).
    #[inline]
    pub fn increase(&mut self, amount: i64) {
        self.current += amount;
        self.peak = self.peak.max(self.current);
        self.scope_peak = self.scope_peak.max(self.current);
        self.allocated += amount;
    }

    /// Removes `amount` (PyTorch's `Stat::decrease`; the peak is untouched).
    #[inline]
    pub fn decrease(&mut self, amount: i64) {
        self.current -= amount;
        self.freed += amount;
    }

    fn reset_accumulated(&mut self) {
        self.allocated = 0;
        self.freed = 0;
    }

    fn reset_peak(&mut self) {
        self.peak = self.current;
    }
}

/// What [`DeviceStats::begin_scope`] hands back and [`DeviceStats::end_scope`] takes: the
/// counters when the scope began, with the enclosing scope's peaks so far.
#[derive(Debug, Clone)]
pub struct ScopeMark {
    start: DeviceStats,
}

/// A closed measurement scope: the counters when it began and when it ended. In `end`, each
/// [`Stat::scope_peak`] is the highest value the counter reached inside the scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeReport {
    /// The counters when the scope began.
    pub start: DeviceStats,
    /// The counters when it ended; `scope_peak`s are the scope's peaks.
    pub end: DeviceStats,
}

/// A counter kept three times: for both pools together ("all"), the small pool and the large
/// pool. Every update touches "all" and the pool of the block concerned.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatArray {
    /// Both pools (`all`).
    pub all: Stat,
    /// Blocks of the small pool (`small_pool`).
    pub small: Stat,
    /// Blocks of the large pool (`large_pool`).
    pub large: Stat,
}

impl StatArray {
    /// The counter of one pool.
    #[inline]
    pub fn pool(&self, pool: Pool) -> &Stat {
        match pool {
            Pool::Small => &self.small,
            Pool::Large => &self.large,
        }
    }

    /// Increases "all" and `pool` by `amount`.
    #[inline]
    pub fn increase(&mut self, pool: Pool, amount: i64) {
        self.all.increase(amount);
        match pool {
            Pool::Small => self.small.increase(amount),
            Pool::Large => self.large.increase(amount),
        }
    }

    /// Decreases "all" and `pool` by `amount`.
    #[inline]
    pub fn decrease(&mut self, pool: Pool, amount: i64) {
        self.all.decrease(amount);
        match pool {
            Pool::Small => self.small.decrease(amount),
            Pool::Large => self.large.decrease(amount),
        }
    }

    /// Applies a signed change the way PyTorch's `free_block` does: an increase for a positive
    /// amount, a decrease for a negative one, nothing for zero.
    #[inline]
    pub fn apply(&mut self, pool: Pool, delta: i64) {
        if delta > 0 {
            self.increase(pool, delta);
        } else if delta < 0 {
            self.decrease(pool, -delta);
        }
    }
}

/// Every counter of one device's allocator, as in PyTorch's `DeviceStats`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceStats {
    /// Blocks handed to users and not yet freed.
    pub allocation: StatArray,
    /// Segments held from the device (`cudaMalloc`s not yet returned).
    pub segment: StatArray,
    /// Blocks in use or awaiting stream events before reuse.
    pub active: StatArray,
    /// Free blocks that are pieces of a split segment (not releasable by `empty_cache`).
    pub inactive_split: StatArray,
    /// Bytes of blocks handed to users (rounded sizes).
    pub allocated_bytes: StatArray,
    /// Bytes held from the device.
    pub reserved_bytes: StatArray,
    /// Bytes of active blocks.
    pub active_bytes: StatArray,
    /// Bytes of free pieces of split segments.
    pub inactive_split_bytes: StatArray,
    /// Bytes users asked for (unrounded) in active blocks.
    pub requested_bytes: StatArray,
    /// Times every cached segment was freed to retry a failed `cudaMalloc`.
    pub num_alloc_retries: i64,
    /// Out-of-memory errors raised.
    pub num_ooms: i64,
    /// Times all streams were synchronised (every `empty_cache` and every full flush).
    pub num_sync_all_streams: i64,
    /// `cudaMalloc` calls that succeeded.
    pub num_device_alloc: i64,
    /// `cudaFree` calls.
    pub num_device_free: i64,
    /// Allocated blocks of at least `max_split_size` bytes.
    pub oversize_allocations: Stat,
    /// Segments of at least `max_split_size` bytes.
    pub oversize_segments: Stat,
    /// The `max_split_size` in force when the allocator was created, -1 for unlimited.
    pub max_split_size: i64,
}

/// `memory_stats()` key names of the per-pool counters, in PyTorch's sorted order.
const ARRAY_NAMES: [&str; 9] = [
    "active",
    "active_bytes",
    "allocated_bytes",
    "allocation",
    "inactive_split",
    "inactive_split_bytes",
    "requested_bytes",
    "reserved_bytes",
    "segment",
];

impl DeviceStats {
    /// Fresh counters for an allocator whose `max_split_size` statistic is `max_split_size`.
    pub fn new(max_split_size: i64) -> DeviceStats {
        DeviceStats {
            max_split_size,
            ..DeviceStats::default()
        }
    }

    fn array(&self, name: &str) -> &StatArray {
        match name {
            "active" => &self.active,
            "active_bytes" => &self.active_bytes,
            "allocated_bytes" => &self.allocated_bytes,
            "allocation" => &self.allocation,
            "inactive_split" => &self.inactive_split,
            "inactive_split_bytes" => &self.inactive_split_bytes,
            "requested_bytes" => &self.requested_bytes,
            "reserved_bytes" => &self.reserved_bytes,
            _ => &self.segment,
        }
    }

    /// Every counter with a current value and peaks: the nine pool arrays' 27, then the two
    /// oversize counters.
    fn stats_mut(&mut self) -> Vec<&mut Stat> {
        let arrays = [
            &mut self.active,
            &mut self.active_bytes,
            &mut self.allocated_bytes,
            &mut self.allocation,
            &mut self.inactive_split,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
            &mut self.reserved_bytes,
            &mut self.segment,
        ];
        let mut stats = Vec::with_capacity(29);
        for array in arrays {
            stats.extend([&mut array.all, &mut array.small, &mut array.large]);
        }
        stats.extend([&mut self.oversize_allocations, &mut self.oversize_segments]);
        stats
    }

    /// `torch.cuda.reset_peak_memory_stats()`: every peak becomes the current value.
    pub fn reset_peak(&mut self) {
        for stat in self.stats_mut() {
            stat.reset_peak();
        }
    }

    /// Opens a measurement scope: from now on every counter's `scope_peak` follows its highest
    /// value, without touching the peaks `max_memory_allocated()` reads. Scopes nest; each
    /// costs O(1) to open and close, and nothing per allocator operation beyond the one
    /// comparison every counter update already makes for `scope_peak`.
    pub fn begin_scope(&mut self) -> ScopeMark {
        let start = self.clone();
        for stat in self.stats_mut() {
            stat.scope_peak = stat.current;
        }
        ScopeMark { start }
    }

    /// Closes the scope `mark` opened and reports it. The enclosing scope's peaks take the
    /// inner scope's into account, as if it had never been opened. Close scopes innermost
    /// first.
    pub fn end_scope(&mut self, mark: ScopeMark) -> ScopeReport {
        let end = self.clone();
        let mut start = mark.start;
        for (stat, outer) in self.stats_mut().into_iter().zip(start.stats_mut()) {
            stat.scope_peak = stat.scope_peak.max(outer.scope_peak);
        }
        ScopeReport { start, end }
    }

    /// `torch.cuda.reset_accumulated_memory_stats()`: totals and event counters go to zero.
    pub fn reset_accumulated(&mut self) {
        for stat in self.stats_mut() {
            stat.reset_accumulated();
        }
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
    }

    /// The flat `(key, value)` list `torch.cuda.memory_stats()` returns, sorted as Python sorts
    /// the keys (122 entries, e.g. `("allocated_bytes.all.current", 512)`).
    pub fn entries(&self) -> Vec<(String, i64)> {
        let mut entries = Vec::with_capacity(122);
        for name in ARRAY_NAMES {
            let array = self.array(name);
            for (pool, stat) in [
                ("all", &array.all),
                ("large_pool", &array.large),
                ("small_pool", &array.small),
            ] {
                push_stat(&mut entries, &format!("{name}.{pool}"), stat);
            }
        }
        for (name, value) in [
            ("max_split_size", self.max_split_size),
            ("num_alloc_retries", self.num_alloc_retries),
            ("num_device_alloc", self.num_device_alloc),
            ("num_device_free", self.num_device_free),
            ("num_ooms", self.num_ooms),
            ("num_sync_all_streams", self.num_sync_all_streams),
        ] {
            entries.push((name.to_string(), value));
        }
        push_stat(
            &mut entries,
            "oversize_allocations",
            &self.oversize_allocations,
        );
        push_stat(&mut entries, "oversize_segments", &self.oversize_segments);
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        entries
    }

    /// One value by its `memory_stats()` key, e.g. `"reserved_bytes.all.peak"`.
    pub fn get(&self, key: &str) -> Option<i64> {
        let mut parts = key.split('.');
        let name = parts.next()?;
        let scalar = match name {
            "max_split_size" => Some(self.max_split_size),
            "num_alloc_retries" => Some(self.num_alloc_retries),
            "num_device_alloc" => Some(self.num_device_alloc),
            "num_device_free" => Some(self.num_device_free),
            "num_ooms" => Some(self.num_ooms),
            "num_sync_all_streams" => Some(self.num_sync_all_streams),
            _ => None,
        };
        if scalar.is_some() {
            return if parts.next().is_none() { scalar } else { None };
        }
        let stat = match name {
            "oversize_allocations" => &self.oversize_allocations,
            "oversize_segments" => &self.oversize_segments,
            _ if ARRAY_NAMES.contains(&name) => {
                let array = self.array(name);
                match parts.next()? {
                    "all" => &array.all,
                    "small_pool" => &array.small,
                    "large_pool" => &array.large,
                    _ => return None,
                }
            }
            _ => return None,
        };
        let value = match parts.next()? {
            "current" => stat.current,
            "peak" => stat.peak,
            "allocated" => stat.allocated,
            "freed" => stat.freed,
            _ => return None,
        };
        parts.next().is_none().then_some(value)
    }
}

fn push_stat(entries: &mut Vec<(String, i64)>, prefix: &str, stat: &Stat) {
    entries.push((format!("{prefix}.allocated"), stat.allocated));
    entries.push((format!("{prefix}.current"), stat.current));
    entries.push((format!("{prefix}.freed"), stat.freed));
    entries.push((format!("{prefix}.peak"), stat.peak));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_tracks_peak_and_totals() {
        let mut stat = Stat::default();
        stat.increase(10);
        stat.decrease(4);
        stat.increase(2);
        assert_eq!(
            stat,
            Stat {
                current: 8,
                peak: 10,
                allocated: 12,
                freed: 4,
                scope_peak: 10,
            }
        );
        stat.reset_peak();
        assert_eq!(stat.peak, 8);
    }

    #[test]
    fn scopes_nest_and_leave_the_global_peak_alone() {
        let mut stats = DeviceStats::new(-1);
        let bytes =
            |stats: &mut DeviceStats, delta: i64| stats.allocated_bytes.apply(Pool::Large, delta);
        bytes(&mut stats, 100);
        bytes(&mut stats, -100);
        let outer = stats.begin_scope();
        bytes(&mut stats, 30);
        let inner = stats.begin_scope();
        bytes(&mut stats, 50);
        bytes(&mut stats, -70);
        let inner = stats.end_scope(inner);
        assert_eq!(inner.end.allocated_bytes.all.scope_peak, 80);
        assert_eq!(inner.start.allocated_bytes.all.current, 30);
        bytes(&mut stats, 10);
        let outer = stats.end_scope(outer);
        assert_eq!(outer.end.allocated_bytes.all.scope_peak, 80);
        assert_eq!(outer.end.allocated_bytes.large.scope_peak, 80);
        assert_eq!(stats.allocated_bytes.all.peak, 100);
        stats.reset_peak();
        assert_eq!(stats.allocated_bytes.all.peak, 20);
    }

    #[test]
    fn entries_have_pytorch_keys_in_python_order() {
        let stats = DeviceStats::new(-1);
        let entries = stats.entries();
        assert_eq!(entries.len(), 122);
        assert_eq!(entries[0].0, "active.all.allocated");
        assert_eq!(entries[4].0, "active.large_pool.allocated");
        assert_eq!(
            entries.last().map(|e| e.0.as_str()),
            Some("segment.small_pool.peak")
        );
        let index = |key: &str| entries.iter().position(|e| e.0 == key);
        assert!(index("max_split_size") < index("num_alloc_retries"));
        assert!(index("oversize_segments.peak") < index("requested_bytes.all.allocated"));
        for (key, value) in &entries {
            assert_eq!(stats.get(key), Some(*value), "{key}");
        }
        assert_eq!(stats.get("max_split_size"), Some(-1));
        assert_eq!(stats.get("segment.all"), None);
        assert_eq!(stats.get("nonsense"), None);
    }
}
