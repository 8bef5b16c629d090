//! Pickle's opcodes (Python's `pickletools` names), the subset a memory snapshot uses and the
//! ones that build Python objects (which a snapshot never holds), and the decoding of the
//! integer argument of `LONG1`/`LONG4`.

pub const MARK: u8 = b'(';
pub const STOP: u8 = b'.';
pub const POP: u8 = b'0';
pub const POP_MARK: u8 = b'1';
pub const DUP: u8 = b'2';
pub const FLOAT: u8 = b'F';
pub const INT: u8 = b'I';
pub const BININT: u8 = b'J';
pub const BININT1: u8 = b'K';
pub const LONG: u8 = b'L';
pub const BININT2: u8 = b'M';
pub const NONE: u8 = b'N';
pub const STRING: u8 = b'S';
pub const BINSTRING: u8 = b'T';
pub const SHORT_BINSTRING: u8 = b'U';
pub const UNICODE: u8 = b'V';
pub const BINUNICODE: u8 = b'X';
pub const APPEND: u8 = b'a';
pub const DICT: u8 = b'd';
pub const EMPTY_DICT: u8 = b'}';
pub const APPENDS: u8 = b'e';
pub const GET: u8 = b'g';
pub const BINGET: u8 = b'h';
pub const LONG_BINGET: u8 = b'j';
pub const LIST: u8 = b'l';
pub const EMPTY_LIST: u8 = b']';
pub const PUT: u8 = b'p';
pub const BINPUT: u8 = b'q';
pub const LONG_BINPUT: u8 = b'r';
pub const SETITEM: u8 = b's';
pub const TUPLE: u8 = b't';
pub const EMPTY_TUPLE: u8 = b')';
pub const SETITEMS: u8 = b'u';
pub const BINFLOAT: u8 = b'G';
pub const PROTO: u8 = 0x80;
pub const TUPLE1: u8 = 0x85;
pub const TUPLE2: u8 = 0x86;
pub const TUPLE3: u8 = 0x87;
pub const NEWTRUE: u8 = 0x88;
pub const NEWFALSE: u8 = 0x89;
pub const LONG1: u8 = 0x8a;
pub const LONG4: u8 = 0x8b;
pub const BINBYTES: u8 = b'B';
pub const SHORT_BINBYTES: u8 = b'C';
pub const SHORT_BINUNICODE: u8 = 0x8c;
pub const BINUNICODE8: u8 = 0x8d;
pub const BINBYTES8: u8 = 0x8e;
pub const MEMOIZE: u8 = 0x94;
pub const FRAME: u8 = 0x95;
/// Opcodes that build Python objects by calling code: never in a memory snapshot.
pub const OBJECT_OPCODES: [(u8, &str); 18] = [
    (b'c', "GLOBAL"),
    (0x93, "STACK_GLOBAL"),
    (b'R', "REDUCE"),
    (b'b', "BUILD"),
    (b'i', "INST"),
    (b'o', "OBJ"),
    (0x81, "NEWOBJ"),
    (0x92, "NEWOBJ_EX"),
    (b'P', "PERSID"),
    (b'Q', "BINPERSID"),
    (0x82, "EXT1"),
    (0x83, "EXT2"),
    (0x84, "EXT4"),
    (0x8f, "EMPTY_SET"),
    (0x90, "ADDITEMS"),
    (0x91, "FROZENSET"),
    (0x96, "BYTEARRAY8"),
    (0x97, "NEXT_BUFFER"),
];

/// A little-endian two's-complement integer of up to 8 bytes (`LONG1`'s argument); `None`
/// when it does not fit 64 bits.
#[inline(always)]
pub fn long(bytes: &[u8]) -> Option<i64> {
    // The common case (an address or a time in microseconds): eight bytes, read at once.
    if let Ok(eight) = <[u8; 8]>::try_from(bytes) {
        return Some(i64::from_le_bytes(eight));
    }
    // Python writes a byte past the 8th only for the sign: accept it when the value fits.
    let (low, high) = bytes.split_at(bytes.len().min(8));
    let negative = low.last().is_some_and(|&byte| byte & 0x80 != 0);
    let sign = if negative { 0xff } else { 0 };
    if high.iter().any(|&byte| byte != sign) {
        return None;
    }
    let mut buffer = [sign; 8];
    for (slot, byte) in buffer.iter_mut().zip(low) {
        *slot = *byte;
    }
    Some(i64::from_le_bytes(buffer))
}

/// A little-endian two's-complement integer from 2^63 to 2^64 - 1 (Python's `LONG1` of an
/// unsigned 64-bit value: 8 bytes with the top bit set and a 9th sign byte of 0), or `None`.
#[inline]
pub fn unsigned_long(bytes: &[u8]) -> Option<u64> {
    match bytes {
        [a, b, c, d, e, f, g, h, 0] if h & 0x80 != 0 => {
            Some(u64::from_le_bytes([*a, *b, *c, *d, *e, *f, *g, *h]))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_decodes_twos_complement() {
        assert_eq!(long(&[]), Some(0));
        assert_eq!(long(&[0xff]), Some(-1));
        assert_eq!(long(&[0x00, 0x80, 0x00]), Some(0x8000));
        assert_eq!(
            long(&[0, 0, 0, 0, 0, 0, 0, 0x80, 0]),
            None,
            "2^63 does not fit"
        );
        assert_eq!(long(&[1, 0, 0, 0, 0, 0, 0, 0, 0]), Some(1));
        assert_eq!(
            unsigned_long(&[0, 0, 0, 0, 0, 0, 0, 0x80, 0]),
            Some(1 << 63),
            "an XPU address"
        );
        assert_eq!(unsigned_long(&[0xff; 9]), None, "negative");
        assert_eq!(
            unsigned_long(&[0, 0, 0, 0, 0, 0, 0, 0x7f, 0]),
            None,
            "fits i64"
        );
    }
}
