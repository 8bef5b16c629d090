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
/// `4 * block .. 4 * block + 4`), computed in float32 as the device does.
pub fn normal_block(seed: u64, block: u64) -> [f32; 4] {
    let words = philox4x32_10(
        [block as u32, (block >> 32) as u32, 0, 0],
        [seed as u32, (seed >> 32) as u32],
    );
    let (a0, a1) = box_muller(words[0], words[1]);
    let (b0, b1) = box_muller(words[2], words[3]);
    [a0, a1, b0, b1]
}

/// Box-Muller on two words: `r = sqrt(-2 ln u)`, `(r cos 2πv, r sin 2πv)` with
/// `u = w0·2⁻³² + 2⁻³³` in (0, 1] and `v = w1·2⁻³²` in [0, 1]. Intermediate steps run in f64
/// and round to f32 where the device rounds, so the twin stays within a few float32 ulps of
/// the device's correctly rounded float32 functions.
fn box_muller(w0: u32, w1: u32) -> (f32, f32) {
    // Both scalings are exact in f32 apart from the final addition, as on the device.
    let u = (w0 as f32) * TWO_POW_M32 + TWO_POW_M33;
    let v = (w1 as f32) * TWO_POW_M32;
    let log = f64::from(u).ln() as f32;
    let radius = (-2.0 * f64::from(log)).sqrt() as f32;
    // The device calls sincospif(2v): sin and cos of π·(2v), with 2v exact in f32.
    let (sin, cos) = (std::f64::consts::PI * f64::from(v + v)).sin_cos();
    (
        (f64::from(radius) * (cos as f32) as f64) as f32,
        (f64::from(radius) * (sin as f32) as f64) as f32,
    )
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
        assert!(mean.abs() < 5e-3, "mean {mean}");
        assert!((std - 1.0).abs() < 5e-3, "std {std}");
    }
}
