// The fused kernels' arguments as plain structs, shared by the CUDA side and the torch binding (no device code here).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace mk {

// The prefill's attention prologue for `tokens` tokens at cache positions start.. (attention_prologue.cu).
struct AttentionPrologue {
  const __nv_bfloat16 *q, *k, *v;        // the projections' outputs: rows of heads * D, kv_heads * D, kv_heads * D
  int64_t q_stride, k_stride, v_stride;  // their row strides (elements)
  const __nv_bfloat16 *q_norm, *k_norm;  // (head_dim) RMSNorm weights, or both null: no norm
  const __nv_bfloat16 *cos, *sin;        // (tokens, head_dim) the rotary angles' cos and sin
  __nv_bfloat16* q_out;                  // out (heads, tokens, head_dim): q normed and rotated
  __nv_bfloat16 *cache_k, *cache_v;      // (layers, kv_heads, capacity, head_dim): this layer's new rows written
  int tokens, heads, kv_heads, head_dim, capacity, layer, start;
  float eps;
};
cudaError_t launch_attention_prologue(const AttentionPrologue& a, cudaStream_t stream);

// The codec's SnakeBeta over (batch, channels, length) bf16 (snake.cu).
struct Snake {
  const __nv_bfloat16* x;                          // (batch, channels, length) at the strides below
  int64_t batch_stride, row_stride, step;
  const __nv_bfloat16 *frequency, *inverse_beta;   // (channels) e^alpha, 1 / (e^beta + 1e-9)
  __nv_bfloat16* out;                              // (batch, channels, length) contiguous
  int rows, channels, length;                      // rows = batch * channels
};
cudaError_t launch_snake(const Snake& s, cudaStream_t stream);

// model.py's RMSNorm, weight * F.rms_norm(x), over rows of bf16 (rms_norm.cu); with a delta, RMSNorm.add: the
// residual add before it too.
struct RmsNorm {
  const __nv_bfloat16* x;       // (rows, width) contiguous
  const __nv_bfloat16* delta;   // null, or (rows, width) contiguous: a residual branch, added to x before the norm
  const __nv_bfloat16* scale;   // null, or (width): the branch's per-channel factor (a LayerScale)
  __nv_bfloat16* sum;           // (rows, width) contiguous: x + delta (times scale), where delta is given
  const __nv_bfloat16* weight;  // (width)
  __nv_bfloat16* out;           // (rows, width) contiguous
  int rows, width;
  float eps;
};
cudaError_t launch_rms_norm(const RmsNorm& n, cudaStream_t stream);

// SwiGLU's silu(gate) * up over rows of bf16 (swiglu.cu).
struct Swiglu {
  const __nv_bfloat16 *gate, *up;  // (rows, width) each, with unit stride along a row
  int64_t gate_stride, up_stride;  // between rows
  __nv_bfloat16* out;              // (rows, width) contiguous
  int rows, width;
};
cudaError_t launch_swiglu(const Swiglu& s, cudaStream_t stream);

}  // namespace mk
