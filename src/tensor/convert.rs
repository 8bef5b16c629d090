//! Host-side conversions between float32 and the 16-bit float formats, and the rounding a
//! value undergoes when stored in a dtype. Used to prepare fill patterns for the device and to
//! turn bytes read back from it into numbers.

use super::{DType, TensorError};

/// float32 → IEEE half bits, rounding to nearest even (as `__float2half_rn`).
pub fn f32_to_f16_bits(value: f32) -> u16 {
    let bits = value.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exponent = ((bits >> 23) & 0xff) as i32;
    let mantissa = bits & 0x007f_ffff;
    if exponent == 0xff {
        // Infinity stays infinity; NaN keeps a quiet payload bit.
        return sign | 0x7c00 | if mantissa != 0 { 0x0200 } else { 0 };
    }
    let unbiased = exponent - 127;
    if unbiased > 15 {
        return sign | 0x7c00;
    }
    if unbiased >= -14 {
        // Normal half: 10 mantissa bits, round to nearest even on the 13 dropped bits.
        let half = (((unbiased + 15) as u32) << 10) | (mantissa >> 13);
        let rest = mantissa & 0x1fff;
        let rounded = if rest > 0x1000 || (rest == 0x1000 && half & 1 == 1) {
            half + 1
        } else {
            half
        };
        return sign | rounded as u16;
    }
    if unbiased < -25 {
        return sign;
    }
    // Subnormal half: shift the full significand (with its implicit bit) into place.
    let significand = mantissa | 0x0080_0000;
    // value = significand · 2^(unbiased − 23) = half · 2^−24, so half = significand >> shift.
    let shift = (-1 - unbiased) as u32;
    let half = significand >> shift;
    let rest = significand & ((1 << shift) - 1);
    let midpoint = 1 << (shift - 1);
    let rounded = if rest > midpoint || (rest == midpoint && half & 1 == 1) {
        half + 1
    } else {
        half
    };
    sign | rounded as u16
}

/// IEEE half bits → float32 (exact).
pub fn f16_bits_to_f32(bits: u16) -> f32 {
    let sign = if bits & 0x8000 != 0 { -1.0f32 } else { 1.0 };
    let exponent = i32::from((bits >> 10) & 0x1f);
    let mantissa = f32::from(bits & 0x03ff);
    match exponent {
        0 => sign * mantissa * 2f32.powi(-24),
        0x1f if mantissa == 0.0 => sign * f32::INFINITY,
        0x1f => f32::NAN,
        _ => sign * (1.0 + mantissa / 1024.0) * 2f32.powi(exponent - 15),
    }
}

/// float32 → bfloat16 bits, rounding to nearest even (as `__float2bfloat16_rn`).
pub fn f32_to_bf16_bits(value: f32) -> u16 {
    let bits = value.to_bits();
    if value.is_nan() {
        return ((bits >> 16) as u16) | 0x0040;
    }
    let rounding = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(rounding) >> 16) as u16
}

/// bfloat16 bits → float32 (exact).
pub fn bf16_bits_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// The value `value` becomes when stored as `dtype` (PyTorch's casts: floats round,
/// integers truncate toward zero, bool is "non-zero").
pub fn stored_value(dtype: DType, value: f64) -> f64 {
    match dtype {
        DType::Float64 => value,
        DType::Float32 => f64::from(value as f32),
        DType::Float16 => f64::from(f16_bits_to_f32(f32_to_f16_bits(value as f32))),
        DType::BFloat16 => f64::from(bf16_bits_to_f32(f32_to_bf16_bits(value as f32))),
        DType::Int64 => (value as i64) as f64,
        DType::Int32 => f64::from(value as i32),
        DType::UInt8 => f64::from(value as u8),
        DType::Bool => f64::from(u8::from(value != 0.0)),
    }
}

/// Checks that `value` can be stored as `dtype` without overflow, as PyTorch's `full` checks
/// ("value cannot be converted to type uint8_t without overflow"): integer types need a finite
/// value whose integer part is in range; floating types accept infinities and NaN but not a
/// finite value beyond their largest; bool takes anything.
pub fn check_representable(dtype: DType, value: f64) -> Result<(), TensorError> {
    // Bounds as f64; `i64::MAX as f64` rounds up to 2^63, an exclusive upper bound.
    let in_range = match dtype {
        DType::Bool => true,
        DType::Float64 => true,
        DType::Float32 => !value.is_finite() || value.abs() <= f64::from(f32::MAX),
        DType::Float16 => !value.is_finite() || value.abs() <= 65504.0,
        DType::BFloat16 => !value.is_finite() || value.abs() <= 3.389_531_389_251_535e38,
        DType::Int64 => {
            value.is_finite()
                && value.trunc() >= -(i64::MAX as f64)
                && value.trunc() < i64::MAX as f64
        }
        DType::Int32 => {
            value.is_finite()
                && value.trunc() >= -2_147_483_648.0
                && value.trunc() <= 2_147_483_647.0
        }
        DType::UInt8 => value.is_finite() && value.trunc() >= 0.0 && value.trunc() <= 255.0,
    };
    if in_range {
        Ok(())
    } else {
        Err(TensorError::OutOfRange(format!(
            "value {value} cannot be converted to {dtype} without overflow"
        )))
    }
}

/// The little-endian bit pattern of `value` stored as `dtype`, widened to 64 bits (the
/// pattern a fill kernel repeats).
pub fn fill_pattern(dtype: DType, value: f64) -> u64 {
    let stored = stored_value(dtype, value);
    match dtype {
        DType::Float64 => stored.to_bits(),
        DType::Float32 => u64::from((stored as f32).to_bits()),
        DType::Float16 => u64::from(f32_to_f16_bits(stored as f32)),
        DType::BFloat16 => u64::from(f32_to_bf16_bits(stored as f32)),
        DType::Int64 => stored as i64 as u64,
        DType::Int32 => u64::from(stored as i32 as u32),
        DType::UInt8 | DType::Bool => stored as u64,
    }
}

/// Decodes `bytes` (little-endian elements of `dtype`) into numbers.
pub fn decode(dtype: DType, bytes: &[u8]) -> Vec<f64> {
    let size = dtype.size();
    bytes
        .chunks_exact(size)
        .map(|chunk| {
            let mut raw = [0u8; 8];
            raw[..size].copy_from_slice(chunk);
            let word = u64::from_le_bytes(raw);
            match dtype {
                DType::Float64 => f64::from_bits(word),
                DType::Float32 => f64::from(f32::from_bits(word as u32)),
                DType::Float16 => f64::from(f16_bits_to_f32(word as u16)),
                DType::BFloat16 => f64::from(bf16_bits_to_f32(word as u16)),
                DType::Int64 => word as i64 as f64,
                DType::Int32 => f64::from(word as u32 as i32),
                DType::UInt8 => f64::from(word as u8),
                DType::Bool => f64::from(u8::from(word as u8 != 0)),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_round_trips_and_rounds() {
        for value in [0.0f32, 1.0, -2.5, 65504.0, 6.1035156e-5, 5.9604645e-8, 0.1] {
            let back = f16_bits_to_f32(f32_to_f16_bits(value));
            assert!(
                (back - value).abs() <= value.abs() * 1e-3,
                "{value} -> {back}"
            );
        }
        assert_eq!(f32_to_f16_bits(1.0), 0x3c00);
        assert_eq!(f32_to_f16_bits(-2.0), 0xc000);
        assert_eq!(f32_to_f16_bits(1e6), 0x7c00);
        assert_eq!(f32_to_f16_bits(5.9604645e-8), 0x0001);
    }

    #[test]
    fn bfloat16_round_trips() {
        assert_eq!(f32_to_bf16_bits(1.0), 0x3f80);
        assert_eq!(bf16_bits_to_f32(0x3f80), 1.0);
        assert_eq!(bf16_bits_to_f32(f32_to_bf16_bits(-3.0)), -3.0);
    }

    #[test]
    fn patterns_decode_back() {
        for dtype in DType::ALL {
            let pattern = fill_pattern(dtype, 3.0);
            let bytes = pattern.to_le_bytes();
            assert_eq!(
                decode(dtype, &bytes[..dtype.size()]),
                vec![stored_value(dtype, 3.0)]
            );
        }
        assert_eq!(stored_value(DType::Int32, -2.7), -2.0);
        assert_eq!(stored_value(DType::Bool, 0.5), 1.0);
    }
}

#[cfg(test)]
mod range_tests {
    use super::*;

    #[test]
    fn fill_values_must_fit_the_dtype() {
        assert!(check_representable(DType::UInt8, 255.9).is_ok());
        assert!(check_representable(DType::Int32, -2_147_483_648.0).is_ok());
        assert!(check_representable(DType::Float32, f64::INFINITY).is_ok());
        assert!(check_representable(DType::Float16, f64::NAN).is_ok());
        assert!(check_representable(DType::Bool, 7.0).is_ok());
        for (dtype, value) in [
            (DType::UInt8, 300.0),
            (DType::UInt8, -1.0),
            (DType::Int32, 1e10),
            (DType::Int64, f64::NAN),
            (DType::Float16, 1e6),
            (DType::Float32, 1e300),
        ] {
            let error = check_representable(dtype, value).expect_err("overflow");
            assert!(error.to_string().contains("without overflow"), "{error}");
            assert!(error.to_string().contains(dtype.name()), "{error}");
        }
    }
}
