//! A snapshot's `allocator_settings`: the allocator config PyTorch records in every snapshot,
//! made from an [`AllocConf`] when gpumem writes one and turned back into an [`AllocConf`] when
//! a recorded snapshot is replayed.

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

use crate::alloc::config::ROUNDUP_POWER2_INTERVALS;
use crate::alloc::{AllocConf, ConfigError};

/// `allocator_settings`, PyTorch 2.11's keys in PyTorch's order.
#[derive(Debug, Clone, PartialEq)]
pub struct AllocatorSettings {
    /// The config text the allocator was last configured with (`PYTORCH_CUDA_ALLOC_CONF`).
    pub alloc_conf: String,
    /// `max_split_size` in bytes, -1 for unlimited.
    pub max_split_size: i64,
    /// `garbage_collection_threshold`, 0.0 when off.
    pub garbage_collection_threshold: f64,
    /// `expandable_segments`.
    pub expandable_segments: bool,
    /// `pinned_num_register_threads` (host allocator; 1 by default).
    pub pinned_num_register_threads: i64,
    /// `release_lock_on_cudamalloc`.
    pub release_lock_on_cudamalloc: bool,
    /// `pinned_use_cuda_host_register`.
    pub pinned_use_cuda_host_register: bool,
    /// `graph_capture_record_stream_reuse`.
    pub graph_capture_record_stream_reuse: bool,
    /// `roundup_power2_divisions`, one value per interval: keys "1", "2", "4", ... "32768".
    pub roundup_power2_divisions: [i64; ROUNDUP_POWER2_INTERVALS],
}

impl Default for AllocatorSettings {
    /// PyTorch's defaults (no config).
    fn default() -> Self {
        AllocatorSettings::from_conf(&AllocConf::default())
    }
}

/// The key PyTorch gives interval `index` of `roundup_power2_divisions`: its start in MiB.
fn interval_key(index: usize) -> String {
    (1_u64 << index).to_string()
}

impl AllocatorSettings {
    /// The settings a PyTorch allocator configured like `conf` would record. Options gpumem
    /// parses but does not keep (the host allocator's) get PyTorch's defaults.
    pub fn from_conf(conf: &AllocConf) -> AllocatorSettings {
        let mut divisions = [0_i64; ROUNDUP_POWER2_INTERVALS];
        for (slot, value) in divisions.iter_mut().zip(conf.roundup_power2_divisions) {
            // Saturating, as the model's integers do (no division count comes near it).
            *slot = i64::try_from(value).unwrap_or(i64::MAX);
        }
        AllocatorSettings {
            alloc_conf: conf.source.clone(),
            max_split_size: conf.max_split_size_stat(),
            garbage_collection_threshold: conf.garbage_collection_threshold,
            expandable_segments: conf.expandable_segments,
            pinned_num_register_threads: 1,
            release_lock_on_cudamalloc: false,
            pinned_use_cuda_host_register: false,
            graph_capture_record_stream_reuse: false,
            roundup_power2_divisions: divisions,
        }
    }

    /// The config to replay under: the recorded config text parsed as PyTorch parsed it, with
    /// the recorded values of the options that change the allocator's decisions put over it
    /// (they are what was in force when the snapshot was taken, even if changed at run time).
    pub fn to_conf(&self) -> Result<AllocConf, ConfigError> {
        let mut conf = AllocConf::parse(&self.alloc_conf)?;
        conf.max_split_size = if self.max_split_size < 0 {
            u64::MAX
        } else {
            self.max_split_size as u64
        };
        conf.garbage_collection_threshold = self.garbage_collection_threshold;
        conf.expandable_segments = self.expandable_segments;
        for (slot, value) in conf
            .roundup_power2_divisions
            .iter_mut()
            .zip(self.roundup_power2_divisions)
        {
            *slot = u64::try_from(value).unwrap_or(0);
        }
        Ok(conf)
    }
}

impl Serialize for AllocatorSettings {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(9))?;
        map.serialize_entry("PYTORCH_CUDA_ALLOC_CONF", &self.alloc_conf)?;
        map.serialize_entry("max_split_size", &self.max_split_size)?;
        map.serialize_entry(
            "garbage_collection_threshold",
            &self.garbage_collection_threshold,
        )?;
        map.serialize_entry("expandable_segments", &self.expandable_segments)?;
        map.serialize_entry(
            "pinned_num_register_threads",
            &self.pinned_num_register_threads,
        )?;
        map.serialize_entry(
            "release_lock_on_cudamalloc",
            &self.release_lock_on_cudamalloc,
        )?;
        map.serialize_entry(
            "pinned_use_cuda_host_register",
            &self.pinned_use_cuda_host_register,
        )?;
        map.serialize_entry(
            "graph_capture_record_stream_reuse",
            &self.graph_capture_record_stream_reuse,
        )?;
        map.serialize_entry("roundup_power2_divisions", &Divisions(self))?;
        map.end()
    }
}

/// `roundup_power2_divisions` as PyTorch pickles it: a dict from interval start (a string) to
/// divisions.
struct Divisions<'a>(&'a AllocatorSettings);

impl Serialize for Divisions<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let divisions = &self.0.roundup_power2_divisions;
        let mut map = serializer.serialize_map(Some(divisions.len()))?;
        for (index, value) in divisions.iter().enumerate() {
            map.serialize_entry(&interval_key(index), value)?;
        }
        map.end()
    }
}

/// The interval index of a `roundup_power2_divisions` key ("1" → 0, "32768" → 15).
pub fn interval_index(key: &str) -> Option<usize> {
    let megabytes: u64 = key.parse().ok()?;
    if !megabytes.is_power_of_two() {
        return None;
    }
    let index = megabytes.trailing_zeros() as usize;
    (index < ROUNDUP_POWER2_INTERVALS).then_some(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_pytorchs() {
        let settings = AllocatorSettings::default();
        assert_eq!(settings.max_split_size, -1);
        assert_eq!(settings.alloc_conf, "");
        assert_eq!(settings.pinned_num_register_threads, 1);
        assert_eq!(settings.to_conf(), Ok(AllocConf::default()));
    }

    #[test]
    fn round_trips_a_config() {
        let conf = AllocConf::parse(
            "max_split_size_mb:64,roundup_power2_divisions:[256:1,>:4],garbage_collection_threshold:0.5",
        )
        .expect("valid");
        let settings = AllocatorSettings::from_conf(&conf);
        assert_eq!(settings.max_split_size, 64 << 20);
        assert_eq!(settings.roundup_power2_divisions[9], 4);
        assert_eq!(settings.to_conf(), Ok(conf));
    }

    #[test]
    fn recorded_values_win_over_the_text() {
        let settings = AllocatorSettings {
            max_split_size: 100 << 20,
            ..AllocatorSettings::default()
        };
        assert_eq!(
            settings.to_conf().map(|conf| conf.max_split_size),
            Ok(100 << 20)
        );
    }

    /// PyTorch records no value for `large_segment_size_mb`: it comes back from the recorded
    /// config text.
    #[test]
    fn large_segment_size_comes_back_from_the_recorded_text() {
        let settings = AllocatorSettings {
            alloc_conf: "large_segment_size_mb:40".into(),
            ..AllocatorSettings::default()
        };
        let conf = settings.to_conf().expect("a 2.11 key");
        assert_eq!(conf.large_segment_size, 40 << 20);
        assert_eq!(conf.max_non_split_rounding_size, 40 << 20);
    }

    #[test]
    fn interval_keys() {
        assert_eq!(interval_key(0), "1");
        assert_eq!(interval_key(15), "32768");
        assert_eq!(interval_index("32768"), Some(15));
        assert_eq!(interval_index("3"), None);
        assert_eq!(interval_index("65536"), None);
    }
}
