// gpumem's value kernels, compiled at run time with NVRTC for the device's architecture.
// Every kernel takes plain device addresses (the caching allocator's blocks) and element
// counts; no kernel allocates.

typedef unsigned int u32;
typedef unsigned long long u64;
typedef unsigned short u16;

// ---------------------------------------------------------------------------------------
// randn: Philox4x32-10 + Box-Muller. Block c of the stream keyed by (k0, k1) is Philox applied
// to the counter (c lo, c hi, 0, 0); its words (w0, w1) and (w2, w3) give two normals each.
// src/tensor/philox.rs is the CPU twin of this arithmetic and must change with it.

__device__ __forceinline__ uint4 philox4x32_10(uint4 c, u32 k0, u32 k1) {
#pragma unroll
    for (int round = 0; round < 10; ++round) {
        if (round > 0) {
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        const u32 hi0 = __umulhi(0xD2511F53u, c.x), lo0 = 0xD2511F53u * c.x;
        const u32 hi1 = __umulhi(0xCD9E8D57u, c.z), lo1 = 0xCD9E8D57u * c.z;
        c = make_uint4(hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0);
    }
    return c;
}

// u = w0 * 2^-32 + 2^-33 in (0, 1]; v = w1 * 2^-32. The precise functions (logf, sincospif,
// sqrtf) are correctly rounded or within an ulp, which the CPU twin reproduces; the fast ones
// are the hardware approximations (__logf, __sincosf). FAST_LOG / FAST_TRIG pick per function.
template <bool FAST_LOG, bool FAST_TRIG>
__device__ __forceinline__ float2 box_muller(u32 w0, u32 w1) {
    const float u = (float)w0 * 2.3283064365386963e-10f + 1.1641532182693481e-10f;
    const float v = (float)w1 * 2.3283064365386963e-10f;
    float s, c;
    const float r = sqrtf(-2.0f * (FAST_LOG ? __logf(u) : logf(u)));
    if (FAST_TRIG) {
        // __sincosf is accurate on [-pi, pi]: sin/cos(2*pi*v - pi) = -sin/cos(2*pi*v).
        __sincosf(6.2831853071795865f * v - 3.1415926535897932f, &s, &c);
        s = -s;
        c = -c;
    } else {
        sincospif(v + v, &s, &c);
    }
    return make_float2(r * c, r * s);
}

template <bool FAST_LOG, bool FAST_TRIG>
__device__ __forceinline__ float4 normal4(u64 block, u32 k0, u32 k1) {
    const uint4 w = philox4x32_10(make_uint4((u32)block, (u32)(block >> 32), 0u, 0u), k0, k1);
    const float2 a = box_muller<FAST_LOG, FAST_TRIG>(w.x, w.y);
    const float2 b = box_muller<FAST_LOG, FAST_TRIG>(w.z, w.w);
    return make_float4(a.x, a.y, b.x, b.y);
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

// Each thread makes ILP blocks of four values (one Philox call and one 16-byte store each),
// blockDim.x blocks apart so every store instruction of a warp is coalesced. `out` is 16-byte
// aligned (allocator blocks are 512-byte aligned; randn writes whole tensors).
template <bool FAST_LOG, bool FAST_TRIG, int ILP>
__device__ __forceinline__ void randn_f32_body(float* out, u64 n, u64 block0, u32 k0, u32 k1) {
    const u64 base = (u64)blockIdx.x * blockDim.x * ILP + threadIdx.x;
#pragma unroll
    for (int k = 0; k < ILP; ++k) {
        const u64 i = base + (u64)k * blockDim.x;
        if (4 * i >= n) return;
        const float4 v = normal4<FAST_LOG, FAST_TRIG>(block0 + i, k0, k1);
        if (4 * i + 4 <= n) {
            reinterpret_cast<float4*>(out)[i] = v;
        } else {
            const float lanes[4] = {v.x, v.y, v.z, v.w};
            for (u64 j = 4 * i; j < n; ++j) out[j] = lanes[j - 4 * i];
        }
    }
}

// Variants: precise or fast log/trig, one or two blocks per thread. `randn_f32_precise_1` is
// what tensors use (the CPU twin matches it); the others exist for `gpumem bench randn`.
#define RANDN_F32(name, fast_log, fast_trig, ilp)                                          \
    extern "C" __global__ void name(float* out, u64 n, u64 block0, u32 k0, u32 k1) {      \
        randn_f32_body<fast_log, fast_trig, ilp>(out, n, block0, k0, k1);                 \
    }
RANDN_F32(randn_f32_precise_1, false, false, 1)
RANDN_F32(randn_f32_precise_2, false, false, 2)
RANDN_F32(randn_f32_fasttrig_1, false, true, 1)
RANDN_F32(randn_f32_fastlog_1, true, false, 1)
RANDN_F32(randn_f32_fast_1, true, true, 1)

// Other float dtypes: generated in float32 exactly as above, then converted per element.
template <typename T, typename Convert>
__device__ __forceinline__ void randn_other(T* out, u64 n, u64 block0, u32 k0, u32 k1, Convert convert) {
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (4 * i >= n) return;
    const float4 v = normal4<false, false>(block0 + i, k0, k1);
    const float lanes[4] = {v.x, v.y, v.z, v.w};
    for (u64 j = 4 * i; j < n && j < 4 * i + 4; ++j) out[j] = convert(lanes[j - 4 * i]);
}

struct ToDouble { __device__ double operator()(float x) const { return (double)x; } };
struct ToHalf { __device__ u16 operator()(float x) const { return to_half(x); } };
struct ToBf16 { __device__ u16 operator()(float x) const { return to_bfloat16(x); } };

extern "C" __global__ void randn_f64(double* out, u64 n, u64 block0, u32 k0, u32 k1) {
    randn_other(out, n, block0, k0, k1, ToDouble());
}
extern "C" __global__ void randn_f16(u16* out, u64 n, u64 block0, u32 k0, u32 k1) {
    randn_other(out, n, block0, k0, k1, ToHalf());
}
extern "C" __global__ void randn_bf16(u16* out, u64 n, u64 block0, u32 k0, u32 k1) {
    randn_other(out, n, block0, k0, k1, ToBf16());
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
