//! Statistical sanity checks of a stream of normals, shared by the tests of the production
//! generator's CPU twin (the library's) and of the benchmark's candidate twins (the binary's,
//! which includes this file with `#[path]`: test code both crates need, not library API).

/// Mean, standard deviation, χ² of the histogram against N(0, 1) and lag-1 correlation.
#[derive(Debug)]
pub struct Summary {
    pub mean: f64,
    pub std: f64,
    pub chi_square: f64,
    pub bins: usize,
    pub lag1: f64,
}

/// Φ(x), the standard normal CDF, via erfc (Numerical Recipes' erfcc, relative error below
/// 1.2e-7 everywhere: far below the counts' own noise).
pub fn phi(x: f64) -> f64 {
    let z = x.abs() / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let erfc = t * poly.exp();
    if x >= 0.0 {
        1.0 - 0.5 * erfc
    } else {
        0.5 * erfc
    }
}

/// Bin edges of the χ² test: width 1/8 over [−4, 4], plus a bin for each tail.
const EDGES: usize = 65;

/// The summary of `values`.
pub fn summarize(values: &[f32]) -> Summary {
    let n = values.len() as f64;
    let (mut sum, mut squares, mut lag) = (0f64, 0f64, 0f64);
    let mut counts = [0u64; EDGES + 1];
    for (i, &value) in values.iter().enumerate() {
        assert!(value.is_finite(), "value {i} is {value}");
        let v = f64::from(value);
        sum += v;
        squares += v * v;
        if let Some(&next) = values.get(i + 1) {
            lag += v * f64::from(next);
        }
        let bin = ((v + 4.0) * 8.0).floor() + 1.0;
        counts[bin.clamp(0.0, EDGES as f64) as usize] += 1;
    }
    let mean = sum / n;
    let variance = squares / n - mean * mean;
    let lag1 = (lag / (n - 1.0) - mean * mean) / variance;
    let edge = |k: usize| -4.0 + k as f64 / 8.0;
    let mut chi_square = 0.0;
    for (k, &count) in counts.iter().enumerate() {
        let low = if k == 0 { 0.0 } else { phi(edge(k - 1)) };
        let high = if k == EDGES { 1.0 } else { phi(edge(k)) };
        let expected = n * (high - low);
        chi_square += (count as f64 - expected).powi(2) / expected;
    }
    Summary {
        mean,
        std: variance.sqrt(),
        chi_square,
        bins: EDGES + 1,
        lag1,
    }
}

/// Asserts that `values` (10⁶ of them) look standard normal: mean within 4 standard errors
/// (4e-3), std within 3e-3, χ² with 65 degrees of freedom below 120 (p ≈ 3e-5), lag-1
/// correlation within 5 standard errors (5e-3).
pub fn assert_standard_normal(name: &str, values: &[f32]) {
    let s = summarize(values);
    assert!(s.mean.abs() < 4e-3, "{name}: {s:?}");
    assert!((s.std - 1.0).abs() < 3e-3, "{name}: {s:?}");
    assert!(s.chi_square < 120.0, "{name}: {s:?} ({} bins)", s.bins);
    assert!(s.lag1.abs() < 5e-3, "{name}: {s:?}");
}
