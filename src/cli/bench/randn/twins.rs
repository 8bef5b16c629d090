//! CPU twins of `gpumem bench randn`'s candidate kernels (`variants.cu`): what each candidate's
//! arithmetic gives, bit for bit, so the benchmark can check every timed kernel against its own
//! twin. The production transform's twin is `tensor::philox` itself; this file holds the
//! others: the previous transform ("v1", the baseline) and the two diagnostics.

use gpumem::tensor::philox::{self, horner, LOG_POLY, SQRT_HALF_BITS, TWO_POW_M32, TWO_POW_M33};

/// −2 ln 2 split so that `NEG2LN2_HI + NEG2LN2_LO` carries about 48 bits.
#[allow(clippy::excessive_precision)]
const NEG2LN2_HI: f32 = -1.386_294_365e+00;
#[allow(clippy::excessive_precision)]
const NEG2LN2_LO: f32 = 3.809_308_424e-09;
/// Lower bound of −2 ln u before the square root, 2⁻¹⁰⁰ (v1 only: its u can round to 1).
#[allow(clippy::excessive_precision)]
const MIN_SQUARE_RADIUS: f32 = 7.888_609_052e-31;
/// v1's polynomials, highest order first (its log is `philox::LOG_POLY`, the production one):
/// sin(πx/2)/(√2·x), cos(πx/2)/√2 in x².
#[allow(clippy::excessive_precision)]
const SIN_POLY_V1: [f32; 4] = [
    -3.289_728_891e-03,
    5.635_628_104e-02,
    -4.567_665_458e-01,
    1.110_720_754e+00,
];
#[allow(clippy::excessive_precision)]
const COS_POLY_V1: [f32; 5] = [
    3.079_439_339e-04,
    -1.458_118_297e-02,
    1.793_439_835e-01,
    -8.723_565_936e-01,
    7.071_067_691e-01,
];

/// v1's −2 ln u for u in [2⁻³³, 1] (−2 ln 2 in two parts).
pub fn neg2_log_v1(u: f32) -> f32 {
    let bits = u.to_bits();
    let e = (bits.wrapping_sub(SQRT_HALF_BITS) as i32) >> 23;
    let f = f32::from_bits(bits.wrapping_sub((e as u32) << 23)) - 1.0;
    let ef = e as f32;
    let p = horner(&LOG_POLY, f);
    ef.mul_add(NEG2LN2_HI, f.mul_add(p, ef * NEG2LN2_LO))
}

/// v1's Box-Muller: u rounded to nearest in [2⁻³³, 1], the radius clamped at 2⁻⁵⁰, the angle
/// π/4 + (π/2)x from C ∓ S, and `w1`'s bits 31 and 30 as the two outputs' signs.
pub fn box_muller_v1(w0: u32, w1: u32) -> (f32, f32) {
    let u = (w0 as f32).mul_add(TWO_POW_M32, TWO_POW_M33);
    let r = neg2_log_v1(u).max(MIN_SQUARE_RADIUS).sqrt();
    let x = f32::from_bits(0x3F80_0000 | (w1 & 0x007F_FFFF)) - 1.5;
    let t = x * x;
    let s = horner(&SIN_POLY_V1, t) * x;
    let c = horner(&COS_POLY_V1, t);
    let ra = f32::from_bits(r.to_bits() ^ (w1 & 0x8000_0000));
    let rb = f32::from_bits(r.to_bits() ^ ((w1 << 1) & 0x8000_0000));
    (ra * (c - s), rb * (c + s))
}

/// `variants.cu`'s xorshift32 (shifts 13, 17, 5).
pub fn xorshift32(mut x: u32) -> u32 {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    x
}

/// What a candidate makes of its words (`variants.cu`'s TRANSFORM).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transform {
    /// 1: the previous production Box-Muller (the baseline).
    PreviousBoxMuller,
    /// 2: the production Box-Muller (`tensor::philox::box_muller`).
    BoxMuller,
    /// 8 (diagnostic): Philox alone; the words as uniforms `w · 2⁻³²`.
    Uniform,
    /// 9 (diagnostic): the production Box-Muller on xorshift32 words instead of Philox's.
    XorshiftBoxMuller,
}

impl Transform {
    /// The TRANSFORM number in `variants.cu`.
    pub fn code(self) -> u32 {
        match self {
            Transform::PreviousBoxMuller => 1,
            Transform::BoxMuller => 2,
            Transform::Uniform => 8,
            Transform::XorshiftBoxMuller => 9,
        }
    }

    /// Block `block`'s four values of the stream keyed by `seed`, Philox with `rounds` rounds.
    pub fn block(self, rounds: usize, seed: u64, block: u64) -> [f32; 4] {
        let pairs = |transform: fn(u32, u32) -> (f32, f32), w: [u32; 4]| {
            let (a0, a1) = transform(w[0], w[1]);
            let (b0, b1) = transform(w[2], w[3]);
            [a0, a1, b0, b1]
        };
        match self {
            Transform::PreviousBoxMuller => {
                pairs(box_muller_v1, philox::block_words(seed, block, rounds))
            }
            Transform::BoxMuller => philox::normal_block_with(rounds, seed, block),
            Transform::Uniform => {
                philox::block_words(seed, block, rounds).map(|word| (word as f32) * TWO_POW_M32)
            }
            Transform::XorshiftBoxMuller => {
                // The key's first round words, as variants.cu reads them.
                let (k0, k1) = (seed as u32, (seed >> 32) as u32);
                let w0 = xorshift32(block as u32 ^ k0);
                let w1 = xorshift32(w0 ^ (block >> 32) as u32);
                let w2 = xorshift32(w1 ^ k1);
                let w3 = xorshift32(w2);
                pairs(philox::box_muller, [w0, w1, w2, w3])
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::bench::randn::stats;
    use crate::cli::bench::randn::VARIANTS;
    use std::collections::HashSet;

    #[test]
    fn every_candidate_twin_is_standard_normal() {
        let mut seen = HashSet::new();
        for variant in VARIANTS.iter().filter(|v| v.is_candidate()) {
            if !seen.insert((variant.rounds, variant.transform)) {
                continue;
            }
            let mut values = vec![0f32; 1_000_000];
            philox::fill_from_blocks(|b| variant.twin_block(77, b), 0, &mut values);
            stats::assert_standard_normal(variant.name, &values);
        }
    }

    #[test]
    fn previous_transform_keeps_its_recorded_h200_values() {
        // The first eight values of seed 1234 as the previous production kernel wrote them on an
        // NVIDIA H200 (Philox4x32-10, v1): the baseline twin is still that kernel's twin.
        let head = [
            0xbd9c_2221u32,
            0xc001_e007,
            0xbf7f_535a,
            0xbfa4_bd15,
            0x3f34_dfa2,
            0x3f2c_8740,
            0x3b44_490d,
            0x3e5c_14c9,
        ];
        let mut values = [0f32; 8];
        philox::fill_from_blocks(
            |b| Transform::PreviousBoxMuller.block(10, 1234, b),
            0,
            &mut values,
        );
        assert_eq!(values.map(f32::to_bits), head);
    }

    #[test]
    fn uniforms_are_in_the_unit_interval() {
        for block in 0..1000 {
            for value in Transform::Uniform.block(10, 5, block) {
                assert!((0.0..=1.0).contains(&value));
            }
        }
    }
}
