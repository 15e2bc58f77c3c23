// One decode step of a Qwen3 decoder stack (talker: 28 layers; code predictor: 5) for one token.
// Reads: the input vector x_in (hidden) fp32, bf16 weights as the PyTorch engine holds them, the bf16
// KV cache in the engine's layout (layers, kv_heads, capacity, head_dim). Writes: K/V at `pos`, the
// final-normed hidden state `out` (hidden) fp32. Stages per layer, each ended by a grid barrier:
//   A  RMSNorm (recomputed per block) + q/k/v rows          B  q/k RMSNorm + RoPE + KV write + attention
//   C  o_proj rows + residual                               D  RMSNorm + gate/up rows, SiLU(g) * u
//   E  down rows + residual
// reference: engine/tts/model.py DecoderStack.forward (T = 1)
#pragma once

#include "common.cuh"
#include "params.h"

namespace mk {

// RoPE on a head vector in shared memory, pairs (i, i + D/2) as rotate_half; angles in fp32 like torch.
__device__ __forceinline__ void rope_shared(float* x, int D, int pos, float theta) {
  const int half = D / 2;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float inv_freq = 1.0f / powf(theta, static_cast<float>(2 * i) / D);
    float s, c;
    sincosf(static_cast<float>(pos) * inv_freq, &s, &c);
    const float a = x[i], b = x[i + half];
    x[i] = a * c - b * s;
    x[i + half] = b * c + a * s;
  }
  __syncthreads();
}

// Stage B for query head h: the block normalizes and rotates q and its kv head's new k, writes the new
// K/V (one block per kv head), then attends over positions 0..pos.
__device__ void attention_head(const StackParams& p, const LayerWeights& w, int layer, int h, float* smem,
                               float* scratch) {
  const int D = p.head_dim, NH = p.num_heads, NKV = p.num_kv_heads, group = NH / NKV, g = h / group;
  const int L = p.pos + 1;
  float* q = smem;
  float* k = smem + D;
  float* v = smem + 2 * D;
  float* scores = smem + 3 * D;
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    q[i] = p.qkv[h * D + i];
    k[i] = p.qkv[NH * D + g * D + i];
    v[i] = p.qkv[(NH + NKV) * D + g * D + i];
  }
  __syncthreads();
  rmsnorm_shared(q, w.q_norm, D, p.eps, scratch);
  rmsnorm_shared(k, w.k_norm, D, p.eps, scratch);
  rope_shared(q, D, p.pos, p.rope_theta);
  rope_shared(k, D, p.pos, p.rope_theta);
  const int64_t head_base = (static_cast<int64_t>(layer) * NKV + g) * p.capacity;
  // the new position is used as the cache stores it (bf16), so every step sees the same keys
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    const __nv_bfloat16 kb = __float2bfloat16(k[i]), vb = __float2bfloat16(v[i]);
    k[i] = __bfloat162float(kb);
    v[i] = __bfloat162float(vb);
    if (h % group == 0) {
      p.cache_k[(head_base + p.pos) * D + i] = kb;
      p.cache_v[(head_base + p.pos) * D + i] = vb;
    }
  }
  __syncthreads();
  const float scale = rsqrtf(static_cast<float>(D));
  float local_max = -INFINITY;
  for (int t = threadIdx.x; t < L; t += blockDim.x) {
    float s = 0.f;
    if (t == p.pos) {
      for (int d = 0; d < D; ++d) s = fmaf(q[d], k[d], s);
    } else {
      const __nv_bfloat16* kt = p.cache_k + (head_base + t) * D;
      for (int d = 0; d < D; d += kVec) s += dot8(kt + d, q + d);
    }
    scores[t] = s * scale;
    local_max = fmaxf(local_max, s * scale);
  }
  const float m = block_max(local_max, scratch);
  float local_sum = 0.f;
  for (int t = threadIdx.x; t < L; t += blockDim.x) {
    const float e = __expf(scores[t] - m);
    scores[t] = e;
    local_sum += e;
  }
  const float inv_sum = 1.0f / block_sum(local_sum, scratch);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.f;
    for (int t = 0; t < p.pos; ++t) acc = fmaf(scores[t], __bfloat162float(p.cache_v[(head_base + t) * D + d]), acc);
    acc = fmaf(scores[p.pos], v[d], acc);
    p.attn[h * D + d] = acc * inv_sum;
  }
}

__device__ void decoder_step_body(const StackParams& p, float* smem, float* scratch) {
  cg::grid_group grid = cg::this_grid();
  const int H = p.hidden, D = p.head_dim, NH = p.num_heads, NKV = p.num_kv_heads, I = p.intermediate;
  const int lane = threadIdx.x & 31;
  const int warps_total = gridDim.x * kWarps;
  const int gwarp = blockIdx.x * kWarps + (threadIdx.x >> 5);
  const int qkv_rows = (NH + 2 * NKV) * D;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < H; i += gridDim.x * blockDim.x) p.x[i] = p.x_in[i];
  grid.sync();
  for (int l = 0; l < p.num_layers; ++l) {
    const LayerWeights w = p.layers[l];
    // A
    load_shared(smem, p.x, H);
    rmsnorm_shared(smem, w.input_norm, H, p.eps, scratch);
    for (int r = gwarp; r < qkv_rows; r += warps_total) {
      const __nv_bfloat16* W = r < NH * D ? w.q : (r < (NH + NKV) * D ? w.k : w.v);
      const int row = r < NH * D ? r : (r < (NH + NKV) * D ? r - NH * D : r - (NH + NKV) * D);
      const float d = warp_row_dot(W, row, H, smem);
      if (lane == 0) p.qkv[r] = d;
    }
    grid.sync();
    // B
    for (int h = blockIdx.x; h < NH; h += gridDim.x) attention_head(p, w, l, h, smem, scratch);
    grid.sync();
    // C
    load_shared(smem, p.attn, NH * D);
    for (int r = gwarp; r < H; r += warps_total) {
      const float d = warp_row_dot(w.o, r, NH * D, smem);
      if (lane == 0) p.x[r] += d;
    }
    grid.sync();
    // D
    load_shared(smem, p.x, H);
    rmsnorm_shared(smem, w.post_norm, H, p.eps, scratch);
    for (int r = gwarp; r < I; r += warps_total) {
      const float gate = warp_row_dot(w.gate, r, H, smem);
      const float up = warp_row_dot(w.up, r, H, smem);
      if (lane == 0) p.mlp[r] = gate / (1.0f + __expf(-gate)) * up;
    }
    grid.sync();
    // E
    load_shared(smem, p.mlp, I);
    for (int r = gwarp; r < H; r += warps_total) {
      const float d = warp_row_dot(w.down, r, I, smem);
      if (lane == 0) p.x[r] += d;
    }
    grid.sync();
  }
  if (blockIdx.x == 0) {
    load_shared(smem, p.x, H);
    rmsnorm_shared(smem, p.final_norm, H, p.eps, scratch);
    for (int i = threadIdx.x; i < H; i += blockDim.x) p.out[i] = smem[i];
  }
}

}  // namespace mk
