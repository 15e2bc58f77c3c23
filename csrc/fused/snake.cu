// The speech codec's SnakeBeta activation, x + sin^2(x * e^alpha) / (e^beta + 1e-9) per channel, in one launch
// (engine/tts/codec.py SnakeBeta: five eager kernels, 30 activations a stream call). It rounds to bf16 after each
// op as those kernels do, with the same float32 sinf. No torch headers (build.sh compiles this file with nvcc).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "common.cuh"
#include "params.h"

namespace mk {
namespace {

// A thread an element of out (batch, channels, length), contiguous; x may be any strided view (the codec's are slices
// of a longer transposed-convolution output).
__global__ void snake_kernel(Snake s) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(s.rows) * s.length) return;
  const int64_t row = i / s.length, t = i % s.length;
  const int channel = static_cast<int>(row % s.channels);
  const float x = __bfloat162float(s.x[(row / s.channels) * s.batch_stride + channel * s.row_stride + t * s.step]);
  const float phase = bf16_round(x * __bfloat162float(s.frequency[channel]));
  const float sine = bf16_round(sinf(phase));
  const float lift = bf16_round(__bfloat162float(s.inverse_beta[channel]) * bf16_round(sine * sine));
  s.out[i] = __float2bfloat16(x + lift);
}

}  // namespace

cudaError_t launch_snake(const Snake& s, cudaStream_t stream) {
  const int64_t elements = static_cast<int64_t>(s.rows) * s.length;
  if (elements == 0) return cudaSuccess;
  snake_kernel<<<element_blocks(elements), kElementThreads, 0, stream>>>(s);
  return cudaGetLastError();
}

}  // namespace mk
