// model.py's RMSNorm, weight * F.rms_norm(x), in one launch (two eager kernels; 57 in the 0.6B talker's prefill,
// 17 in a codec stream call). Float32 statistics, the normalized value rounded to bf16, then the weight's product
// rounded, as those two kernels round. No torch headers (build.sh compiles this file with nvcc).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "ordinary.cuh"
#include "params.h"

namespace mk {
namespace {

constexpr int kNormThreads = 256;

// A block a row.
__global__ void rms_norm_kernel(RmsNorm n) {
  const __nv_bfloat16* x = n.x + static_cast<int64_t>(blockIdx.x) * n.width;
  __nv_bfloat16* out = n.out + static_cast<int64_t>(blockIdx.x) * n.width;
  float squares = 0.f;
  for (int i = threadIdx.x; i < n.width; i += kNormThreads) {
    const float v = __bfloat162float(x[i]);
    squares += v * v;
  }
  const float rstd = rsqrtf(block_sum(squares) / n.width + n.eps);
  for (int i = threadIdx.x; i < n.width; i += kNormThreads)
    out[i] = __float2bfloat16(__bfloat162float(n.weight[i]) * bf16_round(__bfloat162float(x[i]) * rstd));
}

}  // namespace

cudaError_t launch_rms_norm(const RmsNorm& n, cudaStream_t stream) {
  if (n.rows < 0 || n.width < 1) return cudaErrorInvalidValue;
  if (n.rows == 0) return cudaSuccess;
  rms_norm_kernel<<<n.rows, kNormThreads, 0, stream>>>(n);
  return cudaGetLastError();
}

}  // namespace mk
