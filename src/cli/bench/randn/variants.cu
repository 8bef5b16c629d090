// `gpumem bench randn`'s candidate kernels, compiled only by the benchmark (never part of the
// production module): src/device/cuda/kernels/randn.cu is compiled in front of this file, and the
// benchmark appends one RANDN_VARIANT line per candidate (cli::bench::randn::VARIANTS). Each
// candidate's CPU twin is in src/cli/bench/randn/twins.rs; src/cli/bench/randn/host_check.rs
// compiles the transforms below as host C++ (GPUMEM_HOST_CHECK) and checks them against those
// twins.

// ---------------------------------------------------------------------------------------------
// Transform 1: the previous production Box-Muller ("v1"), kept as the baseline. u = w0 2^-32 +
// 2^-33 rounded to nearest in [2^-33, 1], clamped so that -2 ln u >= 2^-100; the angle pi/4 +
// (pi/2) x in [0, pi/2) from C(x) +- S(x) with C, S scaled by 1/sqrt(2) (degrees 8 and 7); w1's
// bits 31 and 30 are the signs of the two outputs.

// The polynomial's coefficients are the production neg2_log's (randn.cu) written out again on
// purpose: this is the benchmark's frozen baseline, the production kernel as it was before
// issue 8, and it must keep measuring that kernel even if the production polynomial changes.
// Its CPU twin (twins.rs) reads the production coefficients (tensor::philox::LOG_POLY): should
// those change, the host check shows the two apart, and the twin then takes its own copy of
// these.
__device__ __forceinline__ float neg2_log_v1(float u) {
    const u32 bits = __float_as_uint(u);
    const int e = (int)(bits - 0x3F3504F3u) >> 23;
    const float f = __fsub_rn(__uint_as_float(bits - ((u32)e << 23)), 1.0f);
    const float ef = __int2float_rn(e);
    float p = -1.747536212e-01f;
    p = __fmaf_rn(p, f, 2.861434817e-01f);
    p = __fmaf_rn(p, f, -2.983300090e-01f);
    p = __fmaf_rn(p, f, 3.314079046e-01f);
    p = __fmaf_rn(p, f, -3.992446959e-01f);
    p = __fmaf_rn(p, f, 5.000354648e-01f);
    p = __fmaf_rn(p, f, -6.666789055e-01f);
    p = __fmaf_rn(p, f, 9.999998212e-01f);
    p = __fmaf_rn(p, f, -2.0f);
    return __fmaf_rn(ef, -1.386294365e+00f, __fmaf_rn(f, p, __fmul_rn(ef, 3.809308424e-09f)));
}

__device__ __forceinline__ float2 box_muller_v1(u32 w0, u32 w1) {
    const float u = __fmaf_rn(__uint2float_rn(w0), 2.3283064365386963e-10f, 1.1641532182693481e-10f);
    const float r = sqrt_rn_normal(fmaxf(neg2_log_v1(u), 7.888609052e-31f));
    const float x = __fsub_rn(__uint_as_float(0x3F800000u | (w1 & 0x007FFFFFu)), 1.5f);
    const float t = __fmul_rn(x, x);
    float s = -3.289728891e-03f;
    s = __fmaf_rn(s, t, 5.635628104e-02f);
    s = __fmaf_rn(s, t, -4.567665458e-01f);
    s = __fmaf_rn(s, t, 1.110720754e+00f);
    s = __fmul_rn(s, x);
    float c = 3.079439339e-04f;
    c = __fmaf_rn(c, t, -1.458118297e-02f);
    c = __fmaf_rn(c, t, 1.793439835e-01f);
    c = __fmaf_rn(c, t, -8.723565936e-01f);
    c = __fmaf_rn(c, t, 7.071067691e-01f);
    const u32 rbits = __float_as_uint(r);
    const float ra = __uint_as_float(rbits ^ (w1 & 0x80000000u));
    const float rb = __uint_as_float(rbits ^ ((w1 << 1) & 0x80000000u));
    return make_float2(__fmul_rn(ra, __fsub_rn(c, s)), __fmul_rn(rb, __fadd_rn(c, s)));
}

// ---------------------------------------------------------------------------------------------
// Diagnostics: not generators of normals, but stages timed alone so that differences place the
// time (METHOD: "time variants that leave one stage out").
// Transform 8: Philox only; the four words as uniforms w * 2^-32 (exact: round to nearest).
// Transform 9: Box-Muller v2 on words from xorshift32 (shifts and XORs only, no multiplies) of
// the counter, so Philox's multiplies are left out.

__device__ __forceinline__ u32 xorshift32(u32 x) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return x;
}

// The four values of block `block` under transform TRANSFORM (1, 2, 8 or 9).
template <int ROUNDS, bool HILO, int TRANSFORM>
__device__ __forceinline__ float4 variant_normal4(u64 block, const PhiloxKeys& key) {
    if (TRANSFORM == 9) {
        const u32 w0 = xorshift32((u32)block ^ key.k[0]);
        const u32 w1 = xorshift32(w0 ^ (u32)(block >> 32));
        const u32 w2 = xorshift32(w1 ^ key.k[1]);
        const u32 w3 = xorshift32(w2);
        const float2 a = box_muller(w0, w1);
        const float2 b = box_muller(w2, w3);
        return make_float4(a.x, a.y, b.x, b.y);
    }
    const uint4 w = philox4x32<ROUNDS, HILO>(philox_counter(block), key);
    if (TRANSFORM == 8) {
        return make_float4(__fmul_rn(__uint2float_rn(w.x), 2.3283064365386963e-10f),
                           __fmul_rn(__uint2float_rn(w.y), 2.3283064365386963e-10f),
                           __fmul_rn(__uint2float_rn(w.z), 2.3283064365386963e-10f),
                           __fmul_rn(__uint2float_rn(w.w), 2.3283064365386963e-10f));
    }
    const float2 a = TRANSFORM == 1 ? box_muller_v1(w.x, w.y) : box_muller(w.x, w.y);
    const float2 b = TRANSFORM == 1 ? box_muller_v1(w.z, w.w) : box_muller(w.z, w.w);
    return make_float4(a.x, a.y, b.x, b.y);
}

#ifndef GPUMEM_HOST_CHECK
template <int ROUNDS, bool HILO, int TRANSFORM>
struct VariantNormals {
    __device__ __forceinline__ float4 operator()(u64 block, const PhiloxKeys& key) const {
        return variant_normal4<ROUNDS, HILO, TRANSFORM>(block, key);
    }
};

// One candidate kernel: (float* out, u64 n, u64 block0, PhiloxKeys key), as randn_f32.
#define RANDN_VARIANT(name, rounds, hilo, transform, per_thread, streaming)                 \
    extern "C" __global__ void name(float* out, u64 n, u64 block0, PhiloxKeys key) {         \
        randn_f32_grid<per_thread, streaming>(out, n, block0, key,                           \
                                              VariantNormals<rounds, hilo, transform>());    \
    }
#endif
