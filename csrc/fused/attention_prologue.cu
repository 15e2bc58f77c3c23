// The prefill's attention prologue in one launch (engine/tts/model.py Attention between its projections and
// scaled_dot_product_attention): q and k RMSNorm'd per head and rotated, K and V written into the KV cache, q written
// head-major. Eager PyTorch takes 16 kernels a layer for this (~420 of the 0.6B talker prefill's ~960). The speech
// codec's attention, which has no q/k norm, runs it without (10 kernels a layer), its window as the cache.
// No torch headers (build.sh compiles this file with nvcc).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "common.cuh"
#include "params.h"

namespace mk {
namespace {

// A block a (token, head): q heads, then k heads, then v heads. Thread i holds the rotary pair (i, i + D/2), which
// RoPE's rotate_half mixes; blockDim is D/2 rounded up to whole warps, the extra threads holding zeros.
__global__ void attention_prologue_kernel(AttentionPrologue a) {
  const int rows = a.heads + 2 * a.kv_heads;
  const int t = blockIdx.x / rows, head = blockIdx.x % rows;
  const int D = a.head_dim, half = D / 2, i = threadIdx.x;
  const bool is_q = head < a.heads, is_k = !is_q && head < a.heads + a.kv_heads;
  const int kv_head = is_q ? 0 : (is_k ? head - a.heads : head - a.heads - a.kv_heads);
  const __nv_bfloat16* src = is_q ? a.q + t * a.q_stride + head * D
                                  : (is_k ? a.k + t * a.k_stride : a.v + t * a.v_stride) + kv_head * D;
  const int64_t cache_row = ((static_cast<int64_t>(a.layer) * a.kv_heads + kv_head) * a.capacity + a.start + t) * D;
  if (!is_q && !is_k) {  // v goes into the cache as it is
    if (i < half) {
      a.cache_v[cache_row + i] = src[i];
      a.cache_v[cache_row + i + half] = src[i + half];
    }
    return;
  }
  const float x0 = i < half ? __bfloat162float(src[i]) : 0.f;
  const float x1 = i < half ? __bfloat162float(src[i + half]) : 0.f;
  float n0 = x0, n1 = x1;
  if (a.q_norm != nullptr) {  // the same for every thread: block_sum's barrier is reached by all or none
    // RMSNorm as F.rms_norm: float32 statistics, the normalized value rounded, then the weight's product rounded
    const float rstd = rsqrtf(block_sum(x0 * x0 + x1 * x1) / D + a.eps);
    const __nv_bfloat16* weight = is_q ? a.q_norm : a.k_norm;
    if (i < half) {
      n0 = bf16_round(__bfloat162float(weight[i]) * bf16_round(x0 * rstd));
      n1 = bf16_round(__bfloat162float(weight[i + half]) * bf16_round(x1 * rstd));
    }
  }
  if (i >= half) return;
  // RoPE as q * cos + rotate_half(q) * sin, with rotate_half(q) = (-q[D/2:], q[:D/2]); each product and the sum rounded
  const __nv_bfloat16 *cos = a.cos + t * D, *sin = a.sin + t * D;
  const float r0 = bf16_round(bf16_round(n0 * __bfloat162float(cos[i])) + bf16_round(-n1 * __bfloat162float(sin[i])));
  const float r1 = bf16_round(bf16_round(n1 * __bfloat162float(cos[i + half])) +
                              bf16_round(n0 * __bfloat162float(sin[i + half])));
  __nv_bfloat16* dst = is_q ? a.q_out + (static_cast<int64_t>(head) * a.tokens + t) * D : a.cache_k + cache_row;
  dst[i] = __float2bfloat16(r0);
  dst[i + half] = __float2bfloat16(r1);
}

}  // namespace

cudaError_t launch_attention_prologue(const AttentionPrologue& a, cudaStream_t stream) {
  if (a.tokens < 1 || a.head_dim < 2 || a.head_dim % 2 != 0 || a.head_dim / 2 > 32 * kMaxWarps)
    return cudaErrorInvalidValue;
  const int threads = (a.head_dim / 2 + 31) / 32 * 32;
  attention_prologue_kernel<<<a.tokens * (a.heads + 2 * a.kv_heads), threads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace mk
