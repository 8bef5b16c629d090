//! The CPU twin of the device's random generator: counter-based Philox4x32-10 (Salmon et al.,
//! "Parallel random numbers: as easy as 1, 2, 3", SC'11) followed by Box-Muller.
//!
//! Value `j` of a stream keyed by `seed` depends only on `(seed, j)`: Philox is applied to the
//! counter `j / 4` with the key `(seed low 32 bits, seed high 32 bits)`, its four words become
//! two pairs of uniforms and each pair two normals. The CUDA kernel in
//! `src/device/kernels/values.cu` does exactly this arithmetic in float32, so the simulated
//! device can read the values of freshly generated tensors and tests can check the GPU.

/// Philox4x32 multipliers.
const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
/// Philox4x32 key increments (Weyl sequence).
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;
/// Rounds of Philox4x32-10.
const ROUNDS: usize = 10;
/// 2^-32: scales a 32-bit word into [0, 1).
const TWO_POW_M32: f32 = 1.0 / 4_294_967_296.0;
/// 2^-33: half a step, keeping the first uniform strictly positive for the logarithm.
const TWO_POW_M33: f32 = 1.0 / 8_589_934_592.0;

/// Philox4x32-10 applied to `counter` with `key`.
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let mut ctr = counter;
    let mut key = key;
    for round in 0..ROUNDS {
        if round > 0 {
            key[0] = key[0].wrapping_add(W0);
            key[1] = key[1].wrapping_add(W1);
        }
        let p0 = u64::from(M0) * u64::from(ctr[0]);
        let p1 = u64::from(M1) * u64::from(ctr[2]);
        let (hi0, lo0) = ((p0 >> 32) as u32, p0 as u32);
        let (hi1, lo1) = ((p1 >> 32) as u32, p1 as u32);
        ctr = [hi1 ^ ctr[1] ^ key[0], lo1, hi0 ^ ctr[3] ^ key[1], lo0];
    }
    ctr
}

/// The four standard normal values the generator produces for block `block` (stream values
/// `4 * block .. 4 * block + 4`), computed in float32 exactly as the device does.
pub fn normal_block(seed: u64, block: u64) -> [f32; 4] {
    let words = philox4x32_10(
        [block as u32, (block >> 32) as u32, 0, 0],
        [seed as u32, (seed >> 32) as u32],
    );
    let (a0, a1) = box_muller(words[0], words[1]);
    let (b0, b1) = box_muller(words[2], words[3]);
    [a0, a1, b0, b1]
}

// The float32 constants below are written with the same 10 significant digits as in
// values.cu, so the two files can be compared by eye; both round them to the same float32.
/// −2 ln 2 split so that `NEG2LN2_HI + NEG2LN2_LO` carries about 48 bits.
#[allow(clippy::excessive_precision)]
const NEG2LN2_HI: f32 = -1.386_294_365e+00;
#[allow(clippy::excessive_precision)]
const NEG2LN2_LO: f32 = 3.809_308_424e-09;
/// Lower bound of −2 ln u before the square root, 2⁻¹⁰⁰: keeps the device's branch-free
/// correctly rounded square root in its range; it only changes u = 1 (radius 2⁻⁵⁰, not 0).
#[allow(clippy::excessive_precision)]
const MIN_SQUARE_RADIUS: f32 = 7.888_609_052e-31;
/// Bits of a float just below √½: subtracting them from a float's bits moves its mantissa into
/// [√½, √2) and leaves the power of two in the high bits.
const SQRT_HALF_BITS: u32 = 0x3F35_04F3;

/// P(f) ≈ −2 ln(1+f) / f on [√½ − 1, √2 − 1], degree 8, highest order first. Minimax
/// (src/device/kernels/fit_randn_poly.py); max relative error 3.0e-8 with these float32 coefficients.
#[allow(clippy::excessive_precision)]
const LOG_POLY: [f32; 9] = [
    -1.747_536_212e-01,
    2.861_434_817e-01,
    -2.983_300_090e-01,
    3.314_079_046e-01,
    -3.992_446_959e-01,
    5.000_354_648e-01,
    -6.666_789_055e-01,
    9.999_998_212e-01,
    -2.0,
];
/// S(x)/x = sin(πx/2) / (√2·x) as a polynomial in x², x in [−½, ½], highest order first
/// (degree 7 in x). Max relative error 1.7e-8.
#[allow(clippy::excessive_precision)]
const SIN_POLY: [f32; 4] = [
    -3.289_728_891e-03,
    5.635_628_104e-02,
    -4.567_665_458e-01,
    1.110_720_754e+00,
];
/// C(x) = cos(πx/2) / √2 as a polynomial in x², x in [−½, ½], highest order first (degree 8 in
/// x). Max relative error 1.7e-8.
#[allow(clippy::excessive_precision)]
const COS_POLY: [f32; 5] = [
    3.079_439_339e-04,
    -1.458_118_297e-02,
    1.793_439_835e-01,
    -8.723_565_936e-01,
    7.071_067_691e-01,
];

/// Horner's rule with one fused multiply-add per step, as the device's `__fmaf_rn` chain.
fn horner(coefficients: &[f32], x: f32) -> f32 {
    let mut iter = coefficients.iter();
    let first = iter.next().copied().unwrap_or(0.0);
    iter.fold(first, |p, &c| p.mul_add(x, c))
}

/// −2 ln(u) for u in [2⁻³³, 1], with only exactly reproducible steps: bit operations split
/// u = 2ᵉ·m with m in [√½, √2), then −2 ln u = e·(−2 ln 2) + f·P(f), f = m − 1 (exact).
pub fn neg2_log(u: f32) -> f32 {
    let bits = u.to_bits();
    let e = (bits.wrapping_sub(SQRT_HALF_BITS) as i32) >> 23;
    let f = f32::from_bits(bits.wrapping_sub((e as u32) << 23)) - 1.0;
    // |e| ≤ 33: exact.
    let ef = e as f32;
    let p = horner(&LOG_POLY, f);
    ef.mul_add(NEG2LN2_HI, f.mul_add(p, ef * NEG2LN2_LO))
}

/// `(cos θ, sin θ)` of the generator's angle θ = π/4 + (π/2)·x, where x in [−½, ½) is taken
/// exactly from the low 23 bits of `word` (so θ in [0, π/2)): with C(x) = cos(πx/2)/√2 and
/// S(x) = sin(πx/2)/√2, cos θ = C − S and sin θ = C + S.
pub fn quarter_turn_cos_sin(word: u32) -> (f32, f32) {
    let x = f32::from_bits(0x3F80_0000 | (word & 0x007F_FFFF)) - 1.5;
    let t = x * x;
    let s = horner(&SIN_POLY, t) * x;
    let c = horner(&COS_POLY, t);
    (c - s, c + s)
}

/// Box-Muller on two words: `u = w0·2⁻³² + 2⁻³³` (one rounding) in [2⁻³³, 1],
/// `r = √max(−2 ln u, 2⁻¹⁰⁰)`;
/// the angle comes from `w1`'s low 23 bits ([`quarter_turn_cos_sin`]) and `w1`'s bits 31 and
/// 30 are the signs of the two results, which spreads the angle over the whole circle.
/// Every step is the f32 operation the device performs (`mul_add` for each of its FMAs).
fn box_muller(w0: u32, w1: u32) -> (f32, f32) {
    // `as f32` rounds to nearest even, as the device's int→float conversion.
    let u = (w0 as f32).mul_add(TWO_POW_M32, TWO_POW_M33);
    // IEEE sqrt, correctly rounded, as the device's.
    let r = neg2_log(u).max(MIN_SQUARE_RADIUS).sqrt();
    let (cos, sin) = quarter_turn_cos_sin(w1);
    let ra = f32::from_bits(r.to_bits() ^ (w1 & 0x8000_0000));
    let rb = f32::from_bits(r.to_bits() ^ ((w1 << 1) & 0x8000_0000));
    (ra * cos, rb * sin)
}

/// Value `index` of the stream keyed by `seed`.
pub fn normal_at(seed: u64, index: u64) -> f32 {
    normal_block(seed, index / 4)[(index % 4) as usize]
}

/// Fills `out` with stream values `first .. first + out.len()`.
pub fn fill_normals(seed: u64, first: u64, out: &mut [f32]) {
    let mut index = first;
    let mut written = 0;
    while written < out.len() {
        let block = normal_block(seed, index / 4);
        let lane = (index % 4) as usize;
        let take = (4 - lane).min(out.len() - written);
        out[written..written + take].copy_from_slice(&block[lane..lane + take]);
        written += take;
        index += take as u64;
    }
}

/// Calls `visit` with stream values `first .. first + count`, in order, without storing them
/// (reductions over large simulated tensors).
pub fn for_each_normal(seed: u64, first: u64, count: u64, mut visit: impl FnMut(f32)) {
    let mut buffer = [0f32; 4096];
    let mut done = 0u64;
    while done < count {
        let take = (count - done).min(buffer.len() as u64) as usize;
        fill_normals(seed, first + done, &mut buffer[..take]);
        buffer[..take].iter().for_each(|&value| visit(value));
        done += take as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Known-answer vectors from Random123's kat_vectors (philox4x32, 10 rounds).
    #[test]
    fn philox_matches_random123_known_answers() {
        assert_eq!(
            philox4x32_10([0, 0, 0, 0], [0, 0]),
            [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
        );
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]
        );
        assert_eq!(
            philox4x32_10(
                [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
                [0xa409_3822, 0x299f_31d0]
            ),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
    }

    #[test]
    fn value_depends_only_on_seed_and_index() {
        let mut run = vec![0f32; 37];
        fill_normals(7, 5, &mut run);
        for (i, &value) in run.iter().enumerate() {
            assert_eq!(value, normal_at(7, 5 + i as u64));
        }
        assert_ne!(normal_at(7, 0), normal_at(8, 0));
        assert_ne!(normal_at(7, 0), normal_at(7, 1));
    }

    #[test]
    fn values_are_standard_normal() {
        let (mut sum, mut squares, n) = (0f64, 0f64, 1_000_000u64);
        for_each_normal(42, 0, n, |value| {
            assert!(value.is_finite());
            sum += f64::from(value);
            squares += f64::from(value) * f64::from(value);
        });
        let mean = sum / n as f64;
        let std = (squares / n as f64 - mean * mean).sqrt();
        // Standard errors at n = 1e6: 1e-3 for the mean, 7e-4 for the std.
        assert!(mean.abs() < 4e-3, "mean {mean}");
        assert!((std - 1.0).abs() < 3e-3, "std {std}");
    }

    #[test]
    fn distribution_matches_the_normal_cdf() {
        // Φ(x) at a few points; with n = 1e6 the empirical CDF is within 1.6e-3 of Φ everywhere
        // with probability 0.99 (Kolmogorov). A wrong quadrant or sign rule fails this.
        let points = [
            (-3.0, 0.001_349_898),
            (-2.0, 0.022_750_132),
            (-1.0, 0.158_655_254),
            (-0.5, 0.308_537_539),
            (0.0, 0.5),
            (0.5, 0.691_462_461),
            (1.0, 0.841_344_746),
            (2.0, 0.977_249_868),
            (3.0, 0.998_650_102),
        ];
        let n = 1_000_000u64;
        let mut below = [0u64; 9];
        for_each_normal(9, 0, n, |value| {
            for (count, (x, _)) in below.iter_mut().zip(points) {
                *count += u64::from(f64::from(value) < x);
            }
        });
        for (count, (x, phi)) in below.iter().zip(points) {
            let cdf = *count as f64 / n as f64;
            assert!((cdf - phi).abs() < 1.6e-3, "P(z < {x}) = {cdf}, Φ = {phi}");
        }
    }

    #[test]
    fn pairs_are_rotation_invariant() {
        // Box-Muller pairs are uniform in angle: each of the 8 octants holds 1/8 of them.
        let mut octants = [0u64; 8];
        let blocks = 250_000u64;
        for block in 0..blocks {
            let v = normal_block(11, block);
            for (x, y) in [(v[0], v[1]), (v[2], v[3])] {
                let angle = f64::from(y).atan2(f64::from(x));
                let octant = ((angle / std::f64::consts::FRAC_PI_4).floor() as i64).rem_euclid(8);
                octants[octant as usize] += 1;
            }
        }
        for count in octants {
            let share = count as f64 / (2 * blocks) as f64;
            assert!((share - 0.125).abs() < 2e-3, "octant share {share}");
        }
    }

    /// One float32 ulp at `x` (x finite, nonzero, normal).
    fn ulp(x: f64) -> f64 {
        (2f64).powi(x.abs().log2().floor() as i32 - 23)
    }

    #[test]
    fn neg2_log_is_within_two_and_a_half_ulps() {
        // Every float32 u the generator can form (w0 = 0 .. 2^32, stride chosen to hit many
        // exponents and mantissas), against the f64 logarithm.
        let mut worst = 0f64;
        let mut w0 = 0u32;
        loop {
            let u = (w0 as f32).mul_add(TWO_POW_M32, TWO_POW_M33);
            let exact = -2.0 * f64::from(u).ln();
            let got = f64::from(neg2_log(u));
            if exact == 0.0 {
                assert_eq!(got, 0.0);
            } else {
                worst = worst.max((got - exact).abs() / ulp(exact));
            }
            match w0.checked_add(997) {
                Some(next) => w0 = next,
                None => break,
            }
        }
        // Measured: 1.93 ulps over this sample (Horner's and the final roundings on top of the polynomial's
        // 3.0e-8 relative error).
        assert!(worst < 2.5, "max error {worst} ulps");
        assert!(worst > 0.0);
    }

    #[test]
    fn angle_polynomials_are_accurate() {
        let mut worst = 0f64;
        for word in (0..1u32 << 23).step_by(7) {
            let (cos, sin) = quarter_turn_cos_sin(word);
            let x = f64::from(f32::from_bits(0x3F80_0000 | word) - 1.5);
            let theta = std::f64::consts::FRAC_PI_4 + std::f64::consts::FRAC_PI_2 * x;
            worst = worst
                .max((f64::from(cos) - theta.cos()).abs())
                .max((f64::from(sin) - theta.sin()).abs());
        }
        // Absolute, since near the axes C ∓ S cancels: measured 1.22e-7, about one ulp of 1.0
        // (2^-23 ≈ 1.19e-7).
        assert!(worst < 1.25e-7, "max absolute error {worst:e}");
    }

    #[test]
    fn twin_equals_values_recorded_on_the_h200() {
        // `gpumem --device cuda bench randn` on an NVIDIA H200 (sm_90, seed 1234,
        // randn([200, 300, 200, 20])), lines `pinned seed=1234 first=…`: the float32 bits of
        // stream values 0..8 and 239999996..240000000. The same run found all of the first 10⁶
        // values bit-identical to this twin.
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
        let tail = [0x3ebc_4c94u32, 0xbe50_edf4, 0x3f21_0771, 0x3fed_9cf4];
        for (first, expected) in [(0u64, &head[..]), (239_999_996, &tail[..])] {
            let mut values = vec![0f32; expected.len()];
            fill_normals(1234, first, &mut values);
            let bits: Vec<u32> = values.iter().map(|value| value.to_bits()).collect();
            assert_eq!(bits, expected, "stream values from {first}");
        }
    }

    #[test]
    fn radius_covers_the_tails() {
        // w0 = 0 gives the smallest u = 2^-33 and the largest radius sqrt(66 ln 2) ≈ 6.764.
        let r = neg2_log(TWO_POW_M33).sqrt();
        assert!((f64::from(r) - (66.0 * std::f64::consts::LN_2).sqrt()).abs() < 1e-6);
        // The largest u rounds to 1: −2 ln u = 0, no NaN; the radius is clamped to 2^-50.
        assert_eq!(
            neg2_log((u32::MAX as f32).mul_add(TWO_POW_M32, TWO_POW_M33)),
            0.0
        );
        let (x, y) = box_muller(u32::MAX, 0);
        assert!(x.abs() <= 2f32.powi(-50) && y.abs() <= 2f32.powi(-50) && x != 0.0);
    }
}
