// model.py's RMSNorm, weight * F.rms_norm(x), in one launch (two eager kernels; 57 in the 0.6B talker's prefill,
// 17 in a codec stream call), and RMSNorm.add, the residual add before it (x + delta, or x + scale * delta for the
// codec's LayerScale), in the same launch: the add (and product) each rounded to bf16 as the eager ops round, so the
// sum is theirs exactly. Float32 statistics, the normalized value rounded to bf16, then the weight's product
// rounded, as F.rms_norm and the product round. No torch headers (build.sh compiles this file with nvcc).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "common.cuh"
#include "params.h"

namespace mk {
namespace {

constexpr int kNormThreads = 256;

// Element i of the row at `row` as the norm sees it: x's, or the rounded sum with the branch.
__device__ __forceinline__ float normed_input(const RmsNorm& n, int64_t row, int i) {
  const float x = __bfloat162float(n.x[row + i]);
  if (n.delta == nullptr) return x;
  float d = __bfloat162float(n.delta[row + i]);
  if (n.scale != nullptr) d = bf16_round(__bfloat162float(n.scale[i]) * d);
  return bf16_round(x + d);
}

// A block a row.
__global__ void rms_norm_kernel(RmsNorm n) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * n.width;
  float squares = 0.f;
  for (int i = threadIdx.x; i < n.width; i += kNormThreads) {
    const float v = normed_input(n, row, i);
    if (n.delta != nullptr) n.sum[row + i] = __float2bfloat16(v);  // v is a bf16 value: stored exactly
    squares += v * v;
  }
  const float rstd = rsqrtf(block_sum(squares) / n.width + n.eps);
  for (int i = threadIdx.x; i < n.width; i += kNormThreads)
    n.out[row + i] = __float2bfloat16(__bfloat162float(n.weight[i]) * bf16_round(normed_input(n, row, i) * rstd));
}

}  // namespace

cudaError_t launch_rms_norm(const RmsNorm& n, cudaStream_t stream) {
  if (n.rows < 0 || n.width < 1 || (n.delta != nullptr && n.sum == nullptr)) return cudaErrorInvalidValue;
  if (n.rows == 0) return cudaSuccess;
  rms_norm_kernel<<<n.rows, kNormThreads, 0, stream>>>(n);
  return cudaGetLastError();
}

}  // namespace mk
