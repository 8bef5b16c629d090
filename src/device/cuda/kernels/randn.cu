// gpumem's normal generator: Philox4x32-R (Salmon et al., SC'11) followed by Box-Muller, built
// only from exactly reproducible float32 operations so that src/tensor/philox.rs, its CPU twin,
// gives the same bits. Compiled by NVRTC in front of values.cu (the production kernels) and of
// src/bench/randn/variants.cu (the benchmark's variants); also compiled as host C++ by
// tests/randn_twins.rs (GPUMEM_HOST_CHECK, with a header that maps the intrinsics below onto
// IEEE host arithmetic) to check this file against the twin without a GPU.
//
// Stream value j of seed s: Philox4x32-R of the counter (j/4 low word, j/4 high word, 0, 0)
// under the key (s low word, s high word); its words (w0, w1) and (w2, w3) give two normals each.
//
// Every floating-point step is an explicit IEEE intrinsic (__fmaf_rn, __fmaf_rz, __fmul_rn,
// __fsub_rn, int->float conversions with a stated rounding), which the compiler may neither
// contract nor approximate, so the twin's f32 mul_add / * / - and conversions give the same bits.

typedef unsigned int u32;
typedef unsigned long long u64;
typedef unsigned short u16;

// Philox4x32 multipliers (Random123's PHILOX_M4x32_0 and _1).
#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
// The most rounds any generator uses (Philox4x32-10, curand's and PyTorch's choice).
#define PHILOX_MAX_ROUNDS 10

// Philox's key schedule, computed on the host (kernels::PhiloxKeys): round r uses (k[2r], k[2r+1])
// = (k0 + r * 0x9E3779B9, k1 + r * 0xBB67AE85). Passed by value, so each word is a constant-bank
// operand of its round's XOR and no thread spends instructions on the schedule. m0 and m1 are
// PHILOX_M0 and PHILOX_M1 again: the `hilo` form multiplies by them for the low halves, so that
// ptxas (which cannot know they equal the immediates) keeps separate IMAD.HI and IMAD
// instructions instead of fusing them into one IMAD.WIDE.
struct PhiloxKeys {
    u32 k[2 * PHILOX_MAX_ROUNDS];
    u32 m0;
    u32 m1;
};

// Philox4x32 with ROUNDS rounds. HILO = false: each mulhilo is one 32x32->64 multiply
// (IMAD.WIDE.U32); HILO = true: __umulhi for the high half and a separate 32-bit multiply for the
// low half. Both give the same words.
template <int ROUNDS, bool HILO>
__device__ __forceinline__ uint4 philox4x32(uint4 c, const PhiloxKeys& key) {
#pragma unroll
    for (int round = 0; round < ROUNDS; ++round) {
        u32 hi0, lo0, hi1, lo1;
        if (HILO) {
            hi0 = __umulhi(PHILOX_M0, c.x);
            lo0 = c.x * key.m0;
            hi1 = __umulhi(PHILOX_M1, c.z);
            lo1 = c.z * key.m1;
        } else {
            const u64 p0 = (u64)PHILOX_M0 * c.x;
            const u64 p1 = (u64)PHILOX_M1 * c.z;
            hi0 = (u32)(p0 >> 32);
            lo0 = (u32)p0;
            hi1 = (u32)(p1 >> 32);
            lo1 = (u32)p1;
        }
        c = make_uint4(hi1 ^ c.y ^ key.k[2 * round], lo1, hi0 ^ c.w ^ key.k[2 * round + 1], lo0);
    }
    return c;
}

// The counter of block `block`.
__device__ __forceinline__ uint4 philox_counter(u64 block) {
    return make_uint4((u32)block, (u32)(block >> 32), 0u, 0u);
}

#ifdef GPUMEM_HOST_CHECK
// The host check supplies rsqrt_approx (an approximation within rsqrt.approx's error bound).
float rsqrt_approx(float y);
#else
__device__ __forceinline__ float rsqrt_approx(float y) {
    float r;
    asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(y));
    return r;
}
#endif

// sqrt(y), correctly rounded, for y in [2^-100, 2^126]: the approximate reciprocal square root and
// one FMA correction, exactly the fast path of CUDA's own sqrt.rn.f32 (IEEE correctly rounded),
// without its branch for 0, subnormal, infinite and negative inputs, which callers never pass.
// The twin uses IEEE sqrt.
__device__ __forceinline__ float sqrt_rn_normal(float y) {
    const float r = rsqrt_approx(y);
    const float s = __fmul_rn(y, r);
    const float h = __fmul_rn(r, 0.5f);
    return __fmaf_rn(__fmaf_rn(-s, s, y), h, s);
}

// ---------------------------------------------------------------------------------------------
// The production transform (Box-Muller "v2"; the twin is tensor::philox::box_muller).
//
// u = RZ(RZ(float(w0)) * 2^-32 + 2^-33) in [2^-33, 1 - 2^-24]: rounding toward zero keeps u
// below 1, so -2 ln u >= 1.19e-7 and the square root needs no clamp (the radius ranges over
// [3.45e-4, 6.764]).
// -2 ln u: u = 2^e * m with m in [sqrt(1/2), sqrt(2)) by bit operations; -2 ln m = f * P(f),
// f = m - 1 exact (Sterbenz); -2 ln u = e * NEG2LN2 + f * P(f). P: degree 8 minimax of
// -2 ln(1+f)/f on [sqrt(1/2)-1, sqrt(2)-1], max relative error 3.0e-8 with these float32
// coefficients (src/device/cuda/kernels/fit_randn_poly.py). NEG2LN2 is -2 ln 2 rounded to float32
// (relative error 2.7e-9, a thirtieth of an ulp).
// The angle: x in [-1/2, 1/2) from w1's low 23 bits exactly, theta = (pi/2) x in [-pi/4, pi/4);
// cos(theta) = C(x^2) (degree 6, C(0) = 1, max relative error 3.9e-8) and sin(theta) = x S(x^2)
// (degree 7, 2.8e-8). w1's bits 31 and 30 move the pair to one of four quarter turns: bit 31
// negates cos, bit 30 swaps the two: (c, s), (s, c), (-c, s), (s, -c) cover the whole circle.

#define NEG2LN2 -1.386294365e+00f

// (a, b), or (b, a) when bit 30 of w is set. Written in PTX because NVVM turns the C++ test into
// shift, mask and compare; this way ptxas makes it one LOP3 setting a predicate and two FSEL.
#ifdef GPUMEM_HOST_CHECK
float2 swap_if_bit30(u32 w, float a, float b);
#else
__device__ __forceinline__ float2 swap_if_bit30(u32 w, float a, float b) {
    float2 out;
    asm("{\n\t.reg .pred p;\n\t.reg .b32 t;\n\t"
        "and.b32 t, %2, 0x40000000;\n\t"
        "setp.ne.b32 p, t, 0;\n\t"
        "selp.f32 %0, %4, %3, p;\n\t"
        "selp.f32 %1, %3, %4, p;\n\t}"
        : "=f"(out.x), "=f"(out.y)
        : "r"(w), "f"(a), "f"(b));
    return out;
}
#endif

__device__ __forceinline__ float uniform_open(u32 w0) {
    return __fmaf_rz(__uint2float_rz(w0), 2.3283064365386963e-10f, 1.1641532182693481e-10f);
}

__device__ __forceinline__ float neg2_log(float u) {
    const u32 bits = __float_as_uint(u);
    // e * 2^23: the exponent of u relative to [sqrt(1/2), sqrt(2)), left in the high bits.
    const u32 e_high = (bits - 0x3F3504F3u) & 0xFF800000u;
    const float f = __fsub_rn(__uint_as_float(bits - e_high), 1.0f);
    // e * 2^23 as a float (exact), so that the power of two cancels in e * 2^23 * (NEG2LN2 *
    // 2^-23): one conversion, no shift; the product is exactly e * NEG2LN2.
    const float ef_high = __int2float_rn((int)e_high);
    float p = -1.747536212e-01f;
    p = __fmaf_rn(p, f, 2.861434817e-01f);
    p = __fmaf_rn(p, f, -2.983300090e-01f);
    p = __fmaf_rn(p, f, 3.314079046e-01f);
    p = __fmaf_rn(p, f, -3.992446959e-01f);
    p = __fmaf_rn(p, f, 5.000354648e-01f);
    p = __fmaf_rn(p, f, -6.666789055e-01f);
    p = __fmaf_rn(p, f, 9.999998212e-01f);
    p = __fmaf_rn(p, f, -2.0f);
    return __fmaf_rn(ef_high, NEG2LN2 * 1.1920928955078125e-07f, __fmul_rn(f, p));
}

__device__ __forceinline__ float2 box_muller(u32 w0, u32 w1) {
    const float r = sqrt_rn_normal(neg2_log(uniform_open(w0)));
    const float x = __fsub_rn(__uint_as_float(0x3F800000u | (w1 & 0x007FFFFFu)), 1.5f);
    const float t = __fmul_rn(x, x);
    float s = -4.685971886e-03f;
    s = __fmaf_rn(s, t, 7.971252501e-02f);
    s = __fmaf_rn(s, t, -6.459666491e-01f);
    s = __fmaf_rn(s, t, 1.570796371e+00f);
    s = __fmul_rn(s, x);
    float c = -2.041452937e-02f;
    c = __fmaf_rn(c, t, 2.536023855e-01f);
    c = __fmaf_rn(c, t, -1.233697653e+00f);
    c = __fmaf_rn(c, t, 1.0f);
    const float c_signed = __uint_as_float(__float_as_uint(c) ^ (w1 & 0x80000000u));
    const float2 turned = swap_if_bit30(w1, c_signed, s);
    return make_float2(__fmul_rn(r, turned.x), __fmul_rn(r, turned.y));
}

// The four values of block `block`: Philox4x32-ROUNDS, then Box-Muller on each pair of words.
template <int ROUNDS, bool HILO>
__device__ __forceinline__ float4 normal4(u64 block, const PhiloxKeys& key) {
    const uint4 w = philox4x32<ROUNDS, HILO>(philox_counter(block), key);
    const float2 a = box_muller(w.x, w.y);
    const float2 b = box_muller(w.z, w.w);
    return make_float4(a.x, a.y, b.x, b.y);
}

// ---------------------------------------------------------------------------------------------
// Writing a float32 tensor. `Gen` maps (block, key) to the block's four values. (The host check
// compiles this part too, with blockIdx etc. as variables, to run every thread's loop.)

template <bool STREAMING>
__device__ __forceinline__ void store4(float4* p, float4 v) {
#ifndef GPUMEM_HOST_CHECK
    if (STREAMING) {
        __stcs(p, v);  // st.global.cs: evict-first, the data is not read back soon
        return;
    }
#endif
    *p = v;
}

// A grid-stride loop over the tensor's blocks of four values: the grid fills the device once
// (multiprocessors x resident blocks, kernels::RandnKernel), so constants and set-up are paid once
// per thread. `out` is 16-byte aligned (allocator blocks are 512-byte aligned; randn writes whole
// tensors); the thread of block 0 writes the last, partial block when n is not a multiple of 4.
//
// PER_THREAD = 1 is the plain loop. PER_THREAD = 2 makes two independent blocks per iteration,
// `threads` apart, so each store stays coalesced across the warp and the two Philox chains
// overlap; it counts its iterations in 32 bits (at most full / threads, which is small) and steps
// the counter and the address instead of recomputing them from the index.
template <int PER_THREAD, bool STREAMING, typename Gen>
__device__ __forceinline__ void randn_f32_grid(float* out, u64 n, u64 block0, const PhiloxKeys& key, Gen gen) {
    float4* out4 = reinterpret_cast<float4*>(out);
    const u64 full = n / 4, threads = (u64)gridDim.x * blockDim.x;
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (PER_THREAD == 2) {
        if (i < full) {
            // Pairs (i + 2k threads, i + (2k + 1) threads) that lie wholly inside the tensor: the
            // k with (2k + 1) threads <= full - i - 1. Afterwards at most one block is left.
            u32 pairs = (u32)((full - i - 1 + threads) / (2 * threads));
            u64 block = block0 + i;
            float4* p = out4 + i;
            for (; pairs != 0; --pairs) {
                const float4 a = gen(block, key);
                const float4 b = gen(block + threads, key);
                store4<STREAMING>(p, a);
                store4<STREAMING>(p + threads, b);
                block += 2 * threads;
                p += 2 * threads;
            }
            i = (u64)(p - out4);
            if (i < full) store4<STREAMING>(p, gen(block, key));
        }
    } else {
        for (; i < full; i += threads) store4<STREAMING>(out4 + i, gen(block0 + i, key));
    }
    if (n % 4 != 0 && blockIdx.x == 0 && threadIdx.x == 0) {
        const float4 v = gen(block0 + full, key);
        const float lanes[4] = {v.x, v.y, v.z, v.w};
        for (u64 j = 4 * full; j < n; ++j) out[j] = lanes[j - 4 * full];
    }
}

// The same grid-stride loop for the other float dtypes: each block of four values is generated
// in float32 exactly as randn_f32's, then stored one element at a time through `convert` (T's
// natural alignment is enough). Every randn kernel is launched the same way
// (kernels::RandnKernel::launch).
template <typename T, typename Gen, typename Convert>
__device__ __forceinline__ void randn_convert_grid(T* out, u64 n, u64 block0, const PhiloxKeys& key, Gen gen,
                                                   Convert convert) {
    const u64 blocks = (n + 3) / 4, threads = (u64)gridDim.x * blockDim.x;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < blocks; i += threads) {
        const float4 v = gen(block0 + i, key);
        const float lanes[4] = {v.x, v.y, v.z, v.w};
        for (u64 j = 4 * i; j < n && j < 4 * i + 4; ++j) out[j] = convert(lanes[j - 4 * i]);
    }
}
