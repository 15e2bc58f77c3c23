// The kernel's arguments as plain structs, shared by the CUDA side and the torch binding (no device code here).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace mk {

struct LayerWeights {  // pointers into the engine's own parameters; no copies
  const __nv_bfloat16 *q, *k, *v, *o, *gate, *up, *down;
  const __nv_bfloat16 *input_norm, *post_norm, *q_norm, *k_norm;
};

struct StackParams {
  const LayerWeights* layers;
  int num_layers, hidden, intermediate, num_heads, num_kv_heads, head_dim;
  float eps, rope_theta;
  __nv_bfloat16 *cache_k, *cache_v;
  int capacity, pos;
  const float* x_in;
  const __nv_bfloat16* final_norm;
  float *x, *qkv, *attn, *mlp;  // scratch: residual (hidden), q|k|v, attention output, SiLU(g) * u
  float* out;
};

// Shared memory one launch needs, blocks that fit co-resident, and the launch (megakernel.cu).
size_t shared_bytes(const StackParams& p);
cudaError_t coresident_blocks(size_t smem, int* blocks);
cudaError_t launch_decoder_step(const StackParams& p, int blocks, cudaStream_t stream);

}  // namespace mk
