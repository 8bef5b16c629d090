//! The CUDA generator source against its CPU twins, without a GPU.
//!
//! 1. `src/device/cuda/kernels/randn.cu` and the benchmark's `variants.cu` are compiled as host C++
//!    (`GPUMEM_HOST_CHECK`, with a header mapping CUDA's IEEE intrinsics onto the host's IEEE
//!    arithmetic, rounding modes included), and every candidate's values on a spread of seeds
//!    and counters must equal its Rust twin's bit for bit. The square root's correction step is
//!    checked at the same time: the host's stand-in for `rsqrt.approx` is off by -2 .. +2 ulps,
//!    and the corrected square root must still be the correctly rounded one. Skipped (with a
//!    line saying so) where no C++ compiler is found.
//!    The same program runs the kernels' grid-stride loops (`randn_f32_grid`, both layouts, and
//!    `randn_convert_grid` of the other float dtypes) thread by thread on small grids and checks
//!    that every value is written once and nothing past the tensor.
//! 2. Where NVRTC can be loaded (e.g. `LD_LIBRARY_PATH` naming a CUDA toolkit's lib64, or the
//!    `nvidia-cuda-nvrtc` wheel's lib folder), the production and benchmark sources are
//!    compiled for sm_90 exactly as on the GPU machine. Skipped otherwise.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use super::{self as bench, Transform, VARIANTS};
use gpumem::device::bench::{self as kernels, nvrtc};

/// The host stand-ins for CUDA's types and intrinsics.
const SHIM: &str = r#"
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#define __device__
#define __forceinline__ inline
typedef unsigned int u32;
struct uint4 { u32 x, y, z, w; };
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
static uint4 make_uint4(u32 x, u32 y, u32 z, u32 w) { return {x, y, z, w}; }
static float2 make_float2(float x, float y) { return {x, y}; }
static float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
static u32 __umulhi(u32 a, u32 b) { return (u32)(((unsigned long long)a * b) >> 32); }
static float __fmaf_rn(float a, float b, float c) { return std::fmaf(a, b, c); }
static float __fmaf_rz(float a, float b, float c) {
    std::fesetround(FE_TOWARDZERO);
    volatile float r = std::fmaf(a, b, c);
    std::fesetround(FE_TONEAREST);
    return r;
}
static float __fmul_rn(float a, float b) { return a * b; }
static float __fadd_rn(float a, float b) { return a + b; }
static float __fsub_rn(float a, float b) { return a - b; }
static float __uint2float_rn(u32 u) { return (float)u; }
static float __uint2float_rz(u32 u) {
    std::fesetround(FE_TOWARDZERO);
    volatile u32 v = u;
    volatile float r = (float)v;
    std::fesetround(FE_TONEAREST);
    return r;
}
static float __int2float_rn(int i) { return (float)i; }
static u32 __float_as_uint(float f) { u32 u; std::memcpy(&u, &f, 4); return u; }
static float __uint_as_float(u32 u) { float f; std::memcpy(&f, &u, 4); return f; }
static int rsqrt_error_ulps = 0;
// rsqrt.approx's stand-in: 1/sqrt(y) rounded, then moved by rsqrt_error_ulps.
float rsqrt_approx(float y) {
    u32 bits = __float_as_uint((float)(1.0 / std::sqrt((double)y)));
    return __uint_as_float(bits + rsqrt_error_ulps);
}
float2 swap_if_bit30(u32 w, float a, float b) {
    return (w & 0x40000000u) ? make_float2(b, a) : make_float2(a, b);
}
// The launch geometry, set by the grid check before "running" each thread.
struct Dim { unsigned x; };
static Dim blockIdx, blockDim, gridDim, threadIdx;
"#;

/// Reads `rounds hilo transform seed block` lines and prints the block's four float bits.
const MAIN: &str = r#"
template <int R, bool H, int T>
static float4 run(unsigned long long seed, unsigned long long block) {
    PhiloxKeys key;
    u32 k0 = (u32)seed, k1 = (u32)(seed >> 32);
    for (int r = 0; r < PHILOX_MAX_ROUNDS; ++r) {
        key.k[2 * r] = k0; key.k[2 * r + 1] = k1;
        k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
    }
    key.m0 = PHILOX_M0; key.m1 = PHILOX_M1;
    return variant_normal4<R, H, T>(block, key);
}
template <int R, bool H, int T>
struct HostGen {
    float4 operator()(unsigned long long block, const PhiloxKeys& key) const {
        return variant_normal4<R, H, T>(block, key);
    }
};

// Runs randn_f32_grid<PER> thread by thread over n values (stream offset 4 * block0) on a
// grid of `grid` blocks of `threads` threads, and checks every value against the generator and
// that nothing past n is written. Prints one line per failure; returns the failure count.
template <int PER>
static int check_grid(unsigned long long n, unsigned grid, unsigned threads, unsigned long long block0) {
    PhiloxKeys key;
    for (int r = 0; r < PHILOX_MAX_ROUNDS; ++r) { key.k[2 * r] = 77u + r; key.k[2 * r + 1] = 5u * r; }
    key.m0 = PHILOX_M0; key.m1 = PHILOX_M1;
    const unsigned long long slots = n + 64;
    float4* storage = new float4[slots / 4 + 1];
    float* out = reinterpret_cast<float*>(storage);
    for (unsigned long long j = 0; j < slots; ++j) out[j] = __uint_as_float(0x7fc0dead);
    gridDim.x = grid; blockDim.x = threads;
    for (unsigned b = 0; b < grid; ++b)
        for (unsigned t = 0; t < threads; ++t) {
            blockIdx.x = b; threadIdx.x = t;
            randn_f32_grid<PER, false>(out, n, block0, key, HostGen<7, false, 2>());
        }
    int failures = 0;
    for (unsigned long long j = 0; j < slots; ++j) {
        const float4 v = variant_normal4<7, false, 2>(block0 + j / 4, key);
        const float lanes[4] = {v.x, v.y, v.z, v.w};
        const u32 want = j < n ? __float_as_uint(lanes[j % 4]) : 0x7fc0dead;
        if (__float_as_uint(out[j]) != want && failures++ < 3)
            std::printf("grid per=%d n=%llu grid=%u threads=%u: value %llu is %08x, want %08x\n", PER, n,
                        grid, threads, j, __float_as_uint(out[j]), want);
    }
    delete[] storage;
    return failures;
}

// The same for randn_convert_grid (the float64, float16 and bfloat16 kernels' loop), storing
// doubles: every value once, equal to the float32 value converted, nothing past n.
struct ToDouble { double operator()(float x) const { return (double)x; } };
static int check_convert_grid(unsigned long long n, unsigned grid, unsigned threads, unsigned long long block0) {
    PhiloxKeys key;
    for (int r = 0; r < PHILOX_MAX_ROUNDS; ++r) { key.k[2 * r] = 91u + r; key.k[2 * r + 1] = 3u * r; }
    key.m0 = PHILOX_M0; key.m1 = PHILOX_M1;
    const unsigned long long slots = n + 64;
    double* out = new double[slots];
    const double untouched = -1234.5;
    for (unsigned long long j = 0; j < slots; ++j) out[j] = untouched;
    gridDim.x = grid; blockDim.x = threads;
    for (unsigned b = 0; b < grid; ++b)
        for (unsigned t = 0; t < threads; ++t) {
            blockIdx.x = b; threadIdx.x = t;
            randn_convert_grid(out, n, block0, key, HostGen<7, false, 2>(), ToDouble());
        }
    int failures = 0;
    for (unsigned long long j = 0; j < slots; ++j) {
        const float4 v = variant_normal4<7, false, 2>(block0 + j / 4, key);
        const float lanes[4] = {v.x, v.y, v.z, v.w};
        const double want = j < n ? (double)lanes[j % 4] : untouched;
        if (out[j] != want && failures++ < 3)
            std::printf("convert grid n=%llu grid=%u threads=%u: value %llu is %g, want %g\n", n, grid,
                        threads, j, out[j], want);
    }
    delete[] out;
    return failures;
}

#define CASE(R, H, T) if (rounds == R && hilo == H && transform == T) v = run<R, H != 0, T>(seed, block);
int main(int argc, char** argv) {
    if (argc > 1 && std::strcmp(argv[1], "grid") == 0) {
        int failures = 0;
        const unsigned geometry[][2] = {{1, 1}, {1, 4}, {3, 4}, {2, 32}, {5, 7}};
        for (unsigned long long n = 0; n < 300; ++n)
            for (const auto& g : geometry) {
                failures += check_grid<1>(n, g[0], g[1], 5);
                failures += check_grid<2>(n, g[0], g[1], 5);
                failures += check_convert_grid(n, g[0], g[1], 5);
            }
        for (unsigned long long n : {4099ull, 65536ull, 100003ull}) {
            failures += check_grid<1>(n, 13, 64, 0xFFFFFFF0ull);
            failures += check_grid<2>(n, 13, 64, 0xFFFFFFF0ull);
            failures += check_convert_grid(n, 13, 64, 0xFFFFFFF0ull);
        }
        std::printf("grid failures %d\n", failures);
        return failures != 0;
    }
    rsqrt_error_ulps = argc > 1 ? std::atoi(argv[1]) : 0;
    int rounds, hilo, transform;
    unsigned long long seed, block;
    while (std::scanf("%d %d %d %llu %llu", &rounds, &hilo, &transform, &seed, &block) == 5) {
        float4 v = {0, 0, 0, 0};
        CASE(7, 0, 1) CASE(7, 0, 2) CASE(7, 0, 8) CASE(7, 0, 9)
        CASE(7, 1, 1) CASE(7, 1, 2) CASE(7, 1, 8) CASE(7, 1, 9)
        CASE(10, 0, 1) CASE(10, 0, 2) CASE(10, 0, 8) CASE(10, 0, 9)
        CASE(10, 1, 1) CASE(10, 1, 2) CASE(10, 1, 8) CASE(10, 1, 9)
        std::printf("%08x %08x %08x %08x\n", __float_as_uint(v.x), __float_as_uint(v.y),
                    __float_as_uint(v.z), __float_as_uint(v.w));
    }
    return 0;
}
"#;

/// A C++ compiler, if one is installed.
fn cxx() -> Option<String> {
    let candidates = [
        std::env::var("CXX").ok(),
        Some("c++".into()),
        Some("g++".into()),
        Some("clang++".into()),
    ];
    candidates.into_iter().flatten().find(|compiler| {
        Command::new(compiler)
            .arg("--version")
            .output()
            .is_ok_and(|output| output.status.success())
    })
}

/// The (seed, block) pairs checked: small and large counters (carries into the high word),
/// several seeds, and a dense run from 0.
fn queries() -> Vec<(u64, u64)> {
    let mut queries = Vec::new();
    for seed in [0u64, 1234, 0xFFFF_FFFF_FFFF_FFFF, 0x0123_4567_89AB_CDEF] {
        for block in 0..3000u64 {
            queries.push((seed, block));
        }
        let mut block = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..3000 {
            block = block
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            queries.push((seed, block >> (block % 40)));
        }
    }
    queries
}

#[test]
fn cuda_generator_source_equals_the_twins_on_the_host() {
    let Some(compiler) = cxx() else {
        eprintln!("skipped: no C++ compiler found");
        return;
    };
    let dir = std::env::temp_dir().join(format!("gpumem-randn-twins-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let source = dir.join("check.cpp");
    let binary = dir.join("check");
    std::fs::write(
        &source,
        format!(
            "#define GPUMEM_HOST_CHECK 1\n{SHIM}\n{}\n{}\n{MAIN}",
            kernels::RANDN_SOURCE,
            bench::VARIANTS_SOURCE
        ),
    )
    .expect("write check.cpp");
    let build = Command::new(&compiler)
        .args([
            "-std=c++17",
            "-O1",
            "-frounding-math",
            "-ffp-contract=off",
            "-o",
        ])
        .arg(&binary)
        .arg(&source)
        .output()
        .expect("run the C++ compiler");
    assert!(
        build.status.success(),
        "{compiler} failed:\n{}",
        String::from_utf8_lossy(&build.stderr)
    );

    let queries = queries();
    let mut input = String::new();
    let mut expected = Vec::new();
    let mut combinations = VARIANTS
        .iter()
        .map(|v| (v.rounds, v.hilo, v.transform))
        .collect::<Vec<_>>();
    combinations.sort_by_key(|&(r, h, t)| (r, h, t.code()));
    combinations.dedup();
    for &(rounds, hilo, transform) in &combinations {
        for &(seed, block) in &queries {
            input.push_str(&format!(
                "{rounds} {} {} {seed} {block}\n",
                u8::from(hilo),
                transform.code()
            ));
            let values = transform.block(rounds, seed, block);
            expected.push(format!(
                "{:08x} {:08x} {:08x} {:08x}",
                values[0].to_bits(),
                values[1].to_bits(),
                values[2].to_bits(),
                values[3].to_bits()
            ));
        }
    }
    for rsqrt_error in ["0", "1", "-1", "2", "-2"] {
        let mut child = Command::new(&binary)
            .arg(rsqrt_error)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run the check");
        let mut stdin = child.stdin.take().expect("stdin");
        let feed = input.clone();
        let writer = std::thread::spawn(move || stdin.write_all(feed.as_bytes()));
        let output = child.wait_with_output().expect("check output");
        writer.join().expect("writer").expect("write queries");
        let got = String::from_utf8_lossy(&output.stdout);
        let got: Vec<&str> = got.lines().collect();
        assert_eq!(got.len(), expected.len(), "rsqrt error {rsqrt_error}");
        let mismatches: Vec<String> = got
            .iter()
            .zip(&expected)
            .enumerate()
            .filter(|(_, (g, e))| *g != *e)
            .take(5)
            .map(|(i, (g, e))| {
                let line = input.lines().nth(i).unwrap_or("");
                format!("query `{line}`: C++ {g}, twin {e}")
            })
            .collect();
        assert!(
            mismatches.is_empty(),
            "rsqrt.approx off by {rsqrt_error} ulps: {} of {} blocks differ, e.g.\n{}",
            got.iter().zip(&expected).filter(|(g, e)| *g != *e).count(),
            expected.len(),
            mismatches.join("\n")
        );
    }
    // The kernels' loop: every value written once, nothing past the end, for both layouts.
    let grid = Command::new(&binary)
        .arg("grid")
        .output()
        .expect("run the grid check");
    let report = String::from_utf8_lossy(&grid.stdout);
    assert!(grid.status.success(), "{report}");
    assert!(report.contains("grid failures 0"), "{report}");
    let _ = std::fs::remove_dir_all(&dir);
    // Every transform of the matrix was covered.
    for transform in [
        Transform::PreviousBoxMuller,
        Transform::BoxMuller,
        Transform::Uniform,
        Transform::XorshiftBoxMuller,
    ] {
        assert!(combinations.iter().any(|&(_, _, t)| t == transform));
    }
}

#[test]
fn sources_compile_with_nvrtc_where_available() {
    if let Err(why) = nvrtc::available() {
        eprintln!("skipped: {why}");
        return;
    }
    let dir: PathBuf = std::env::temp_dir();
    for (name, source, entries) in [
        (
            kernels::SOURCE_NAME,
            kernels::production_source(),
            vec![
                "randn_f32",
                "randn_f64",
                "randn_f16",
                "randn_bf16",
                "fill_u8",
                "fill_u16",
                "fill_u32",
                "fill_u64",
                "binary_f32",
                "moments_f32",
                "moments_finish",
            ],
        ),
        (
            "randn_variants.cu",
            bench::source(),
            VARIANTS.iter().map(|v| v.name).collect(),
        ),
    ] {
        for capability in [(9, 0), (8, 0)] {
            let ptx = nvrtc::compile(&source, name, capability)
                .unwrap_or_else(|error| panic!("{name} for {capability:?}: {error}"));
            for entry in &entries {
                assert!(
                    ptx.contains(&format!(".entry {entry}(")),
                    "{name}: no kernel {entry}"
                );
            }
            if capability == (9, 0) {
                let _ = std::fs::write(dir.join(format!("gpumem-{name}.ptx")), ptx);
            }
        }
    }
}
