// SwiGLU's activation, silu(gate) * up, in one launch (two eager kernels a MLP: F.silu, then the product), on the
// two halves of one GEMM's output. F.silu's float32 x / (1 + e^-x) rounded to bf16, then the product rounded, as
// those kernels round. No torch headers (build.sh compiles this file with nvcc).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "common.cuh"
#include "params.h"

namespace mk {
namespace {

// A thread an element of out (rows, width), contiguous.
__global__ void swiglu_kernel(Swiglu s) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(s.rows) * s.width) return;
  const int64_t row = i / s.width, column = i % s.width;
  const float gate = __bfloat162float(s.gate[row * s.gate_stride + column]);
  const float silu = bf16_round(gate / (1.f + expf(-gate)));
  s.out[i] = __float2bfloat16(silu * __bfloat162float(s.up[row * s.up_stride + column]));
}

}  // namespace

cudaError_t launch_swiglu(const Swiglu& s, cudaStream_t stream) {
  if (s.rows < 0 || s.width < 1) return cudaErrorInvalidValue;
  const int64_t elements = static_cast<int64_t>(s.rows) * s.width;
  if (elements == 0) return cudaSuccess;
  swiglu_kernel<<<element_blocks(elements), kElementThreads, 0, stream>>>(s);
  return cudaGetLastError();
}

}  // namespace mk
