//! Hash maps and sets keyed by device address, for the replay's per-event bookkeeping (the
//! engine's live blocks, the first pass's scan).

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// A hasher for device addresses: one multiplication, enough for keys that are already
/// spread out (the standard hasher costs more than the allocator's own work here).
#[derive(Default)]
pub struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = (self.0 ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3);
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = (value ^ (value >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// A map from device addresses.
pub type AddressMap<V> = HashMap<u64, V, BuildHasherDefault<AddressHasher>>;

/// A set of device addresses.
pub type AddressSet = HashSet<u64, BuildHasherDefault<AddressHasher>>;
