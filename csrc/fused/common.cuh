// What the fused kernels (each one launch for a chain of eager ops: attention_prologue.cu, rms_norm.cu, snake.cu,
// swiglu.cu) share. No torch headers.
#pragma once

#include <cuda_bf16.h>
#include <cstdint>

namespace mk {
namespace {

constexpr int kElementThreads = 256;  // a block of a thread-an-element kernel
constexpr int kMaxWarps = 32;         // most warps a block can have

// x rounded to bf16 and back: the eager ops each round their bf16 result, and so do these kernels, op by op.
__device__ __forceinline__ float bf16_round(float x) { return __bfloat162float(__float2bfloat16(x)); }

// The sum of v over the block (any whole number of warps), in every thread.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[kMaxWarps];
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int warp = threadIdx.x / 32, warps = blockDim.x / 32;
  if (threadIdx.x % 32 == 0) partial[warp] = v;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < warps; ++w) total += partial[w];
  return total;
}

// Blocks of kElementThreads for a thread an element.
inline unsigned element_blocks(int64_t elements) {
  return static_cast<unsigned>((elements + kElementThreads - 1) / kElementThreads);
}

}  // namespace
}  // namespace mk
