// Shared device helpers: 16-byte bf16 loads, warp/block reductions, the warp-per-row matvec.
// reference: engine/tts/model.py (the ops these build are checked against it, see tests/tts/test_megakernel.py)
#pragma once

#include <cuda_bf16.h>
#include <cooperative_groups.h>
#include <cstdint>

namespace mk {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;            // threads per block
constexpr int kWarps = kThreads / 32;    // warps per block
constexpr int kVec = 8;                  // bf16 per 16-byte load

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide reduction of one value per thread; `scratch` holds kWarps floats of shared memory and
// `identity` fills the lanes past the last warp. Every thread gets the result.
template <float (*warp_op)(float)>
__device__ __forceinline__ float block_reduce(float v, float* scratch, float identity) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_op(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  return warp_op(lane < kWarps ? scratch[lane] : identity);
}

__device__ __forceinline__ float block_sum(float v, float* scratch) { return block_reduce<warp_sum>(v, scratch, 0.f); }
__device__ __forceinline__ float block_max(float v, float* scratch) {
  return block_reduce<warp_max>(v, scratch, -INFINITY);
}

// One 16-byte load of 8 bf16 weights, dotted with 8 fp32 activations from shared memory.
__device__ __forceinline__ float dot8(const __nv_bfloat16* w, const float* x) {
  const uint4 raw = __ldg(reinterpret_cast<const uint4*>(w));
  const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&raw);
  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(p[i]);
    acc = fmaf(f.x, x[2 * i], acc);
    acc = fmaf(f.y, x[2 * i + 1], acc);
  }
  return acc;
}

// dot(W[row, :K], x) by one warp; K % 256 == 0 (checked on the host), x in shared memory.
__device__ __forceinline__ float warp_row_dot(const __nv_bfloat16* W, int row, int K, const float* x) {
  const int lane = threadIdx.x & 31;
  const __nv_bfloat16* w = W + static_cast<int64_t>(row) * K;
  float acc = 0.f;
  for (int k = lane * kVec; k < K; k += 32 * kVec) acc += dot8(w + k, x + k);
  return warp_sum(acc);
}

// Copy n fp32 values from global into shared memory (whole block).
__device__ __forceinline__ void load_shared(float* dst, const float* src, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
  __syncthreads();
}

// In shared memory: x <- x * rsqrt(mean(x^2) + eps) * w  (RMSNorm; statistics in fp32 as the reference).
__device__ __forceinline__ void rmsnorm_shared(float* x, const __nv_bfloat16* w, int n, float eps, float* scratch) {
  float ss = 0.f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) ss += x[i] * x[i];
  const float scale = rsqrtf(block_sum(ss, scratch) / n + eps);
  for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] = x[i] * scale * __bfloat162float(w[i]);
  __syncthreads();
}

}  // namespace mk
