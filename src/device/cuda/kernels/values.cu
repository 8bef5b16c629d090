// gpumem's value kernels, compiled at run time with NVRTC for the device's architecture.
// Every kernel takes plain device addresses (the caching allocator's blocks, checked on the Rust
// side to be live memory of this device holding the counts passed) and element counts; no kernel
// allocates.

// randn (src/device/cuda/kernels/randn.cu, compiled in front of this file, holds the generator). The
// Rust side defines the production configuration in front of both (kernels::production_source):
// GPUMEM_PHILOX_ROUNDS (Philox4x32 rounds; the CPU twin's tensor::philox::PHILOX_ROUNDS),
// GPUMEM_PHILOX_HILO (multiply form), GPUMEM_RANDN_PER_THREAD (blocks per loop iteration) and
// GPUMEM_RANDN_STREAMING (evict-first stores); only the first changes values.

struct ProductionNormals {
    __device__ __forceinline__ float4 operator()(u64 block, const PhiloxKeys& key) const {
        return normal4<GPUMEM_PHILOX_ROUNDS, GPUMEM_PHILOX_HILO != 0>(block, key);
    }
};

extern "C" __global__ void randn_f32(float* out, u64 n, u64 block0, PhiloxKeys key) {
    randn_f32_grid<GPUMEM_RANDN_PER_THREAD, GPUMEM_RANDN_STREAMING != 0>(out, n, block0, key,
                                                                         ProductionNormals());
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

// Other float dtypes: generated in float32 exactly as randn_f32, then converted per element, in
// randn.cu's grid-stride loop (randn_convert_grid), launched as randn_f32 is.
template <typename T, typename Convert>
__device__ __forceinline__ void randn_other(T* out, u64 n, u64 block0, const PhiloxKeys& key, Convert convert) {
    randn_convert_grid(out, n, block0, key, ProductionNormals(), convert);
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

// gpu_sleep (torch.cuda._sleep): one thread spins until `nanoseconds` have passed on the GPU's
// global timer (%globaltimer, nanoseconds), keeping the stream it is launched on busy for that
// long. The timer, not clock64's cycles, so the length does not depend on the clock speed.
__device__ __forceinline__ u64 global_timer_ns() {
    u64 now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    return now;
}

extern "C" __global__ void gpu_sleep(u64 nanoseconds) {
    const u64 start = global_timer_ns();
    while (global_timer_ns() - start < nanoseconds) {
    }
}
