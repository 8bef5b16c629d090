// gpumem's value kernels, compiled at run time with NVRTC for the device's architecture.
// Every kernel takes plain device addresses (the caching allocator's blocks) and element
// counts; no kernel allocates.

typedef unsigned int u32;
typedef unsigned long long u64;
typedef unsigned short u16;

// ---------------------------------------------------------------------------------------
// randn: Philox4x32-10 + Box-Muller. Block c of the stream keyed by (k0, k1) is Philox applied
// to the counter (c lo, c hi, 0, 0); its words (w0, w1) and (w2, w3) give two normals each.
// src/tensor/philox.rs is the CPU twin of this arithmetic, operation for operation, and must
// change with it: every floating-point step below is an explicit IEEE intrinsic (__fmaf_rn,
// __fmul_rn, __fadd_rn, __fsub_rn, __fsqrt_rn, round-to-nearest int->float), which the compiler
// may neither contract nor approximate, so the twin's f32 mul_add / * / + / - / sqrt give the
// same bits.

// Philox's key schedule, computed on the host (Kernels::randn): round r uses (k[2r], k[2r+1]) =
// (k0 + r * 0x9E3779B9, k1 + r * 0xBB67AE85). Passed by value, each word is a constant-bank
// operand of the round's XOR, so no thread spends instructions on it.
struct PhiloxKeys {
    u32 k[20];
};

// Philox4x32-10; each mulhilo is one 32x32->64 multiply (IMAD.WIDE.U32 on the GPU).
__device__ __forceinline__ uint4 philox4x32_10(uint4 c, const PhiloxKeys& key) {
#pragma unroll
    for (int round = 0; round < 10; ++round) {
        const u64 p0 = (u64)0xD2511F53u * c.x;
        const u64 p1 = (u64)0xCD9E8D57u * c.z;
        c = make_uint4((u32)(p1 >> 32) ^ c.y ^ key.k[2 * round], (u32)p1,
                       (u32)(p0 >> 32) ^ c.w ^ key.k[2 * round + 1], (u32)p0);
    }
    return c;
}

// The same rounds with __umulhi and a separate low multiply (bench variant `umulhi`).
__device__ __forceinline__ uint4 philox4x32_10_umulhi(uint4 c, const PhiloxKeys& key) {
#pragma unroll
    for (int round = 0; round < 10; ++round) {
        const u32 hi0 = __umulhi(0xD2511F53u, c.x), lo0 = 0xD2511F53u * c.x;
        const u32 hi1 = __umulhi(0xCD9E8D57u, c.z), lo1 = 0xCD9E8D57u * c.z;
        c = make_uint4(hi1 ^ c.y ^ key.k[2 * round], lo1, hi0 ^ c.w ^ key.k[2 * round + 1], lo0);
    }
    return c;
}

// sqrt(y), correctly rounded, for y in [2^-100, 2^126]: the approximate reciprocal square root
// and one FMA correction, exactly the fast path of CUDA's own sqrt.rn.f32 (which is IEEE
// correctly rounded), without the branch sqrt.rn needs for 0, subnormal, infinite and negative
// inputs: the caller clamps y to >= 2^-100 (the CPU twin does the same clamp and IEEE sqrt).
__device__ __forceinline__ float sqrt_rn_normal(float y) {
    float r;
    asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(y));
    const float s = __fmul_rn(y, r);
    const float h = __fmul_rn(r, 0.5f);
    return __fmaf_rn(__fmaf_rn(-s, s, y), h, s);
}

// -2 ln(u) for u in [2^-33, 1]. u = 2^e * m with m in [sqrt(1/2), sqrt(2)) by bit operations;
// -2 ln(m) = f * P(f), f = m - 1 exact (Sterbenz); -2 ln 2 = NEG2LN2_HI + NEG2LN2_LO.
// P: degree 8 minimax of -2 ln(1+f)/f on [sqrt(1/2)-1, sqrt(2)-1], max relative error 3.0e-8
// with these float32 coefficients (src/device/kernels/fit_randn_poly.py).
__device__ __forceinline__ float neg2_log(float u) {
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

// Box-Muller on two words. u = w0 * 2^-32 + 2^-33 (one rounding) in [2^-33, 1];
// r = sqrt(max(-2 ln u, 2^-100)) (2^-50 instead of 0 when u rounds to 1). The angle is pi/4 + (pi/2) x in [0, pi/2) with x in [-1/2, 1/2) taken from
// w1's low 23 bits exactly (no range reduction); w1's bits 31 and 30 are the signs of the two
// outputs, which spreads the angle over the whole circle. With C(x) = cos(pi x/2)/sqrt(2) and
// S(x) = sin(pi x/2)/sqrt(2): cos(pi/4 + pi x/2) = C - S, sin(pi/4 + pi x/2) = C + S.
// C: degree 8 even, S: degree 7 odd, minimax on [-1/2, 1/2], max relative errors 1.7e-8 with
// these float32 coefficients (src/device/kernels/fit_randn_poly.py).
__device__ __forceinline__ float2 box_muller(u32 w0, u32 w1) {
    const float u = __fmaf_rn(__uint2float_rn(w0), 2.3283064365386963e-10f, 1.1641532182693481e-10f);
    const float r = sqrt_rn_normal(fmaxf(neg2_log(u), 7.888609052e-31f));
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

template <bool UMULHI>
__device__ __forceinline__ float4 normal4(u64 block, const PhiloxKeys& key) {
    const uint4 counter = make_uint4((u32)block, (u32)(block >> 32), 0u, 0u);
    const uint4 w = UMULHI ? philox4x32_10_umulhi(counter, key) : philox4x32_10(counter, key);
    const float2 a = box_muller(w.x, w.y);
    const float2 b = box_muller(w.z, w.w);
    return make_float4(a.x, a.y, b.x, b.y);
}

// The previous generator's Box-Muller (CUDA's logf/sincospif, or the hardware approximations
// __logf/__sincosf), kept only as a timing reference for `gpumem bench randn`; tensors never
// use it and the CPU twin does not model it.
template <bool FAST>
__device__ __forceinline__ float4 normal4_libm(u64 block, const PhiloxKeys& key) {
    const uint4 w = philox4x32_10(make_uint4((u32)block, (u32)(block >> 32), 0u, 0u), key);
    float out[4];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const u32 w0 = k ? w.z : w.x, w1 = k ? w.w : w.y;
        const float u = (float)w0 * 2.3283064365386963e-10f + 1.1641532182693481e-10f;
        const float v = (float)w1 * 2.3283064365386963e-10f;
        float s, c;
        const float r = sqrtf(-2.0f * (FAST ? __logf(u) : logf(u)));
        if (FAST) {
            __sincosf(6.2831853071795865f * v - 3.1415926535897932f, &s, &c);
            s = -s;
            c = -c;
        } else {
            sincospif(v + v, &s, &c);
        }
        out[2 * k] = r * c;
        out[2 * k + 1] = r * s;
    }
    return make_float4(out[0], out[1], out[2], out[3]);
}

// Generator choice for the float32 kernels: 0 gpumem's (wide multiply), 1 gpumem's (__umulhi),
// 2 previous precise, 3 previous fast.
template <int GEN>
__device__ __forceinline__ float4 normal4_gen(u64 block, const PhiloxKeys& key) {
    if (GEN == 0) return normal4<false>(block, key);
    if (GEN == 1) return normal4<true>(block, key);
    return normal4_libm<GEN == 3>(block, key);
}

__device__ __forceinline__ u16 to_half(float x) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    return h;
}

// Round-to-nearest-even truncation of the float's bits (finite values; NaN never occurs here).
__device__ __forceinline__ u16 to_bfloat16(float x) {
    const u32 bits = __float_as_uint(x);
    return (u16)((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

// Stream values 4*full .. n-1 of the last, partial block (n not a multiple of 4).
template <int GEN>
__device__ __forceinline__ void randn_f32_partial(float* out, u64 n, u64 block0, const PhiloxKeys& key) {
    const u64 full = n / 4;
    const float4 v = normal4_gen<GEN>(block0 + full, key);
    const float lanes[4] = {v.x, v.y, v.z, v.w};
    for (u64 j = 4 * full; j < n; ++j) out[j] = lanes[j - 4 * full];
}

// One block of four values per thread (one Philox call, one coalesced 16-byte store); the
// thread after the last full block writes the partial one. `out` is 16-byte aligned
// (allocator blocks are 512-byte aligned; randn writes whole tensors).
template <int GEN>
__device__ __forceinline__ void randn_f32_each(float* out, u64 n, u64 block0, const PhiloxKeys& key) {
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n / 4) {
        reinterpret_cast<float4*>(out)[i] = normal4_gen<GEN>(block0 + i, key);
    } else if (i == n / 4 && n % 4 != 0) {
        randn_f32_partial<GEN>(out, n, block0, key);
    }
}

// Grid-stride loop: a grid sized to fill the device once, each thread making every
// (gridDim.x * blockDim.x)-th block, so constants and setup are paid once per thread.
template <int GEN>
__device__ __forceinline__ void randn_f32_loop(float* out, u64 n, u64 block0, const PhiloxKeys& key) {
    const u64 full = n / 4, stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < full; i += stride) {
        reinterpret_cast<float4*>(out)[i] = normal4_gen<GEN>(block0 + i, key);
    }
    if (n % 4 != 0 && blockIdx.x == 0 && threadIdx.x == 0) randn_f32_partial<GEN>(out, n, block0, key);
}

// Variants for `gpumem bench randn` (src/device/kernels/mod.rs lists them, how each is
// launched, and which one tensors use). The first four give identical values.
#define RANDN_F32(name, body, gen)                                                         \
    extern "C" __global__ void name(float* out, u64 n, u64 block0, PhiloxKeys key) {     \
        body<gen>(out, n, block0, key);                                                   \
    }
RANDN_F32(randn_f32_each, randn_f32_each, 0)
RANDN_F32(randn_f32_loop, randn_f32_loop, 0)
RANDN_F32(randn_f32_umulhi_each, randn_f32_each, 1)
RANDN_F32(randn_f32_umulhi_loop, randn_f32_loop, 1)
RANDN_F32(randn_f32_libm_each, randn_f32_each, 2)
RANDN_F32(randn_f32_libm_fast_each, randn_f32_each, 3)

// Other float dtypes: generated in float32 exactly as above, then converted per element.
template <typename T, typename Convert>
__device__ __forceinline__ void randn_other(T* out, u64 n, u64 block0, const PhiloxKeys& key, Convert convert) {
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (4 * i >= n) return;
    const float4 v = normal4<false>(block0 + i, key);
    const float lanes[4] = {v.x, v.y, v.z, v.w};
    for (u64 j = 4 * i; j < n && j < 4 * i + 4; ++j) out[j] = convert(lanes[j - 4 * i]);
}

struct ToDouble { __device__ double operator()(float x) const { return (double)x; } };
struct ToHalf { __device__ u16 operator()(float x) const { return to_half(x); } };
struct ToBf16 { __device__ u16 operator()(float x) const { return to_bfloat16(x); } };

extern "C" __global__ void randn_f64(double* out, u64 n, u64 block0, PhiloxKeys key) {
    randn_other(out, n, block0, key, ToDouble());
}
extern "C" __global__ void randn_f16(u16* out, u64 n, u64 block0, PhiloxKeys key) {
    randn_other(out, n, block0, key, ToHalf());
}
extern "C" __global__ void randn_bf16(u16* out, u64 n, u64 block0, PhiloxKeys key) {
    randn_other(out, n, block0, key, ToBf16());
}

// ---------------------------------------------------------------------------------------
// Fills: the host prepares the element's bit pattern; one kernel per element width.

#define FILL(name, T)                                                                     \
    extern "C" __global__ void name(T* out, u64 n, u64 pattern) {                         \
        for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n;                   \
             i += (u64)gridDim.x * blockDim.x)                                             \
            out[i] = (T)pattern;                                                          \
    }
FILL(fill_u8, unsigned char)
FILL(fill_u16, u16)
FILL(fill_u32, u32)
FILL(fill_u64, u64)

// ---------------------------------------------------------------------------------------
// Elementwise float32 arithmetic. mode 0: a ⊕ b (tensors), 1: a ⊕ scalar, 2: scalar ⊕ b.
// op 0 +, 1 -, 2 *, 3 /.

__device__ __forceinline__ float apply(int op, float x, float y) {
    switch (op) {
        case 0: return x + y;
        case 1: return x - y;
        case 2: return x * y;
        default: return x / y;
    }
}

extern "C" __global__ void binary_f32(const float* a, const float* b, float* out, u64 n,
                                      int op, int mode, float scalar) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (u64)gridDim.x * blockDim.x) {
        const float x = mode == 2 ? scalar : a[i];
        const float y = mode == 1 ? scalar : b[i];
        out[i] = apply(op, x, y);
    }
}

// ---------------------------------------------------------------------------------------
// Reductions: sum of (x - shift) and of its square, in double. Each block writes its partial
// sums to `moments_partials`; `moments_finish` adds them in a fixed order into
// `moments_scratch`, so results are bit-for-bit reproducible (no floating-point atomics).
// std runs it twice: shift 0 for the mean, then shift = mean.

#define MOMENTS_MAX_BLOCKS 1024
__device__ double moments_partials[2 * MOMENTS_MAX_BLOCKS];
__device__ double moments_scratch[2];

__device__ __forceinline__ void block_sum2(double& s, double& q) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        s += __shfl_down_sync(0xffffffffu, s, offset);
        q += __shfl_down_sync(0xffffffffu, q, offset);
    }
    __shared__ double warp_s[32], warp_q[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        warp_s[warp] = s;
        warp_q[warp] = q;
    }
    __syncthreads();
    if (warp == 0) {
        const int warps = (blockDim.x + 31) >> 5;
        s = lane < warps ? warp_s[lane] : 0.0;
        q = lane < warps ? warp_q[lane] : 0.0;
        for (int offset = 16; offset > 0; offset >>= 1) {
            s += __shfl_down_sync(0xffffffffu, s, offset);
            q += __shfl_down_sync(0xffffffffu, q, offset);
        }
    }
}

extern "C" __global__ void moments_f32(const float* x, u64 n, double shift) {
    double s = 0.0, q = 0.0;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (u64)gridDim.x * blockDim.x) {
        const double d = (double)x[i] - shift;
        s += d;
        q += d * d;
    }
    block_sum2(s, q);
    if (threadIdx.x == 0) {
        moments_partials[2 * blockIdx.x] = s;
        moments_partials[2 * blockIdx.x + 1] = q;
    }
}

// One block: adds the first `blocks` partials.
extern "C" __global__ void moments_finish(u64 blocks) {
    double s = 0.0, q = 0.0;
    for (u64 b = threadIdx.x; b < blocks; b += blockDim.x) {
        s += moments_partials[2 * b];
        q += moments_partials[2 * b + 1];
    }
    block_sum2(s, q);
    if (threadIdx.x == 0) {
        moments_scratch[0] = s;
        moments_scratch[1] = q;
    }
}
