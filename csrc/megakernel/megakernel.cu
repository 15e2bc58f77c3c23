// The persistent kernel and its host-side launch; no torch headers (CI compiles this file with nvcc).
// Stages are in decoder_step.cuh; binding.cpp is the torch glue.
#include <cuda_runtime.h>

#include "decoder_step.cuh"

namespace mk {

__global__ void __launch_bounds__(kThreads) decoder_step_kernel(StackParams p) {
  extern __shared__ float smem[];
  __shared__ float scratch[kWarps];
  decoder_step_body(p, smem, scratch);
}

// Shared memory for a stack: the largest activation vector, or q|k|v + scores over the cache.
size_t shared_bytes(const StackParams& p) {
  size_t floats = p.hidden;
  floats = floats > static_cast<size_t>(p.intermediate) ? floats : p.intermediate;
  floats = floats > static_cast<size_t>(p.num_heads * p.head_dim) ? floats : p.num_heads * p.head_dim;
  const size_t attention = 3 * p.head_dim + p.capacity;
  return 4 * (floats > attention ? floats : attention);
}

// Blocks that can all be resident at once (a cooperative launch needs every block resident).
cudaError_t coresident_blocks(size_t smem, int* blocks) {
  int device = 0, sms = 0, per_sm = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e == cudaSuccess) e = cudaFuncSetAttribute(decoder_step_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                 static_cast<int>(smem));
  if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, decoder_step_kernel, kThreads, smem);
  *blocks = sms * (per_sm < 1 ? 0 : 1);  // one block per SM: every SM streams weights, none waits on another
  return e;
}

cudaError_t launch_decoder_step(const StackParams& p, int blocks, cudaStream_t stream) {
  const size_t smem = shared_bytes(p);
  void* args[] = {const_cast<StackParams*>(&p)};
  return cudaLaunchCooperativeKernel(reinterpret_cast<void*>(decoder_step_kernel), dim3(blocks), dim3(kThreads),
                                     args, smem, stream);
}

}  // namespace mk
