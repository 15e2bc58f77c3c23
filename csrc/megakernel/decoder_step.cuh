// One decode step of a Qwen3 decoder stack (talker: 28 layers; code predictor: 5) for one token.
// Reads: the input vector x_in (hidden) fp32, bf16 weights as the PyTorch engine holds them, the bf16
// KV cache in the engine's layout (layers, kv_heads, capacity, head_dim). Writes: K/V at `pos` and the
// residual stream p.x; final_norm_shared() then gives the final-normed hidden state to every block.
// Stages per layer, each ended by a grid barrier:
//   A  RMSNorm (recomputed per block) + q/k/v rows          B  q/k RMSNorm + RoPE + KV write + attention
//   C  o_proj rows + residual                               D  RMSNorm + gate/up rows, SiLU(g) * u
//   E  down rows + residual
// Layer 0 reads its input and residual straight from x_in, so a step needs no barrier before it.
// reference: engine/tts/model.py DecoderStack.forward (T = 1)
#pragma once

#include "common.cuh"
#include "params.h"

namespace mk {

__device__ __forceinline__ const __nv_bfloat16* row_of(const __nv_bfloat16* W, int row, int K) {
  return W + static_cast<int64_t>(row) * K;
}

// 4 bf16 (one 8-byte load) as fp32; 4-wide dot products.
__device__ __forceinline__ float4 load4(const __nv_bfloat16* p) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
  return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ float dot4(const float4 a, const float* b) {
  return a.x * b[0] + a.y * b[1] + a.z * b[2] + a.w * b[3];
}
__device__ __forceinline__ float dot4(const float* a, const float* b) {
  return a[0] * b[0] + a[1] * b[1] + a[2] * b[2] + a[3] * b[3];
}

// One warp prepares a head vector in shared memory (vec, D floats, from src in global memory): RMSNorm by `norm`
// (none: nullptr) and RoPE at `pos` (where rotate), as the reference: statistics and angles in fp32. A lane holds
// elements lane, lane + 32, ...; the vector and its norm weights are loaded together (one round trip, not two), and
// RoPE's pairs (i, i + D/2) meet in shared memory.
__device__ __forceinline__ void prepare_head(float* vec, const float* src, const __nv_bfloat16* norm, bool rotate,
                                             int D, int pos, float eps, float theta) {
  constexpr int kPerLane = kMaxHeadDim / 32;
  const int lane = threadIdx.x & 31, half = D / 2;
  float x[kPerLane], g[kPerLane], ss = 0.f;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int i = lane + 32 * j;
    x[j] = i < D ? src[i] : 0.f;
    g[j] = i < D && norm != nullptr ? __bfloat162float(norm[i]) : 1.f;
  }
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) ss += x[j] * x[j];
  probe(kHeadLoaded, ss);  // block 0's thread 0: warp 0, q
  const float scale = norm != nullptr ? rsqrtf(warp_sum(ss) / D + eps) : 1.f;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int i = lane + 32 * j;
    if (i < D) vec[i] = norm != nullptr ? x[j] * scale * g[j] : x[j];
  }
  if (!rotate) return;
  __syncwarp();
  for (int i = lane; i < half; i += 32) {
    const float inv_freq = 1.0f / powf(theta, static_cast<float>(2 * i) / D);
    float s, c;
    sincosf(static_cast<float>(pos) * inv_freq, &s, &c);
    const float a = vec[i], b = vec[i + half];
    vec[i] = a * c - b * s;
    vec[i + half] = b * c + a * s;
  }
  __syncwarp();
}

// One warp: a prepared k or v vector rounded to bf16 in place, as the cache stores it (so every step attends to the
// same keys and values), and written to the cache row where `write` (one block per kv head).
__device__ __forceinline__ void round_to_cache(float* vec, __nv_bfloat16* cache, bool write, int D) {
  for (int i = threadIdx.x & 31; i < D; i += 32) {
    const __nv_bfloat16 b = __float2bfloat16(vec[i]);
    vec[i] = __bfloat162float(b);
    if (write) cache[i] = b;
  }
}

// Stage B for query head h: warps 0-2 prepare q and its kv head's new k and v at once (a warp each; k and v rounded
// to bf16 as the cache stores them, and written there by one block per kv head), then the block attends over
// positions 0..pos.
__device__ void attention_head(const StackParams& p, const LayerWeights& w, int layer, int pos, int h, float* smem,
                               float* scratch) {
  const int D = p.head_dim, NH = p.num_heads, NKV = p.num_kv_heads, group = NH / NKV, g = h / group;
  const int L = pos + 1;
  float* q = smem;
  float* k = smem + D;
  float* v = smem + 2 * D;
  float* scores = smem + 3 * D;
  const int64_t head_base = (static_cast<int64_t>(layer) * NKV + g) * p.capacity;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (warp == 0) {
    prepare_head(q, p.qkv + h * D, w.q_norm, true, D, pos, p.eps, p.rope_theta);
  } else if (warp <= 2) {
    float* vec = warp == 1 ? k : v;
    prepare_head(vec, p.qkv + (warp == 1 ? NH : NH + NKV) * D + g * D, warp == 1 ? w.k_norm : nullptr, warp == 1, D,
                 pos, p.eps, p.rope_theta);
    round_to_cache(vec, (warp == 1 ? p.cache_k : p.cache_v) + (head_base + pos) * D, h % group == 0, D);
  }
  __syncthreads();
  probe(kHeadPrepared);
  // scores: a warp per position, its lanes across head_dim (4 dims, one 8-byte load each), several
  // positions in flight per warp; the new position from shared memory (another block may be writing it)
  const float scale = rsqrtf(static_cast<float>(D));
  const __nv_bfloat16* keys = p.cache_k + head_base * D;
  const __nv_bfloat16* values = p.cache_v + head_base * D;
  constexpr int kPositions = 4;
  float local_max = -INFINITY;
  for (int t0 = warp * kPositions; t0 < L; t0 += kWarps * kPositions) {
    float s[kPositions];
#pragma unroll
    for (int u = 0; u < kPositions; ++u) {
      const int t = t0 + u;
      s[u] = 0.f;
      if (t < L)
        for (int d = 4 * lane; d < D; d += 128) s[u] += t == pos ? dot4(k + d, q + d) : dot4(load4(keys + t * D + d), q + d);
    }
#pragma unroll
    for (int u = 0; u < kPositions; ++u) {
      const float score = warp_sum(s[u]) * scale;
      if (t0 + u < L) {
        if (lane == 0) scores[t0 + u] = score;
        local_max = fmaxf(local_max, score);
      }
    }
  }
  const float m = block_max(local_max, scratch);
  probe(kHeadScored);
  float local_sum = 0.f;
  for (int t = threadIdx.x; t < L; t += blockDim.x) {
    const float e = __expf(scores[t] - m);
    scores[t] = e;
    local_sum += e;
  }
  const float inv_sum = 1.0f / block_sum(local_sum, scratch);
  probe(kHeadSoftmax);
  // weighted values: warps split the positions, lanes the dims; partial sums meet in shared memory
  float* partial = scores + ((L + 3) & ~3);  // (kWarps, D), 16-byte aligned
  for (int d = 4 * lane; d < D; d += 128) {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
    for (int t = warp; t < L; t += kWarps) {
      const float e = scores[t];
      const float4 x = t == pos ? make_float4(v[d], v[d + 1], v[d + 2], v[d + 3]) : load4(values + t * D + d);
      acc.x = fmaf(e, x.x, acc.x);
      acc.y = fmaf(e, x.y, acc.y);
      acc.z = fmaf(e, x.z, acc.z);
      acc.w = fmaf(e, x.w, acc.w);
    }
    *reinterpret_cast<float4*>(partial + warp * D + d) = acc;
  }
  __syncthreads();
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.f;
    for (int w2 = 0; w2 < kWarps; ++w2) acc += partial[w2 * D + d];
    p.attn[h * D + d] = acc * inv_sum;
  }
  __syncthreads();
  probe(kHeadDone);
}

// Stage B of a stack's first T tokens (positions 0..T-1, the cache empty before them) for query head h: a warp each
// prepares a token's q, k or v as attention_head does (k and v rounded to bf16 and written to the cache by one
// block per kv head), then warp t attends for token t over positions 0..t, all from shared memory.
template <int T>
__device__ void attention_first_head(const StackParams& p, const LayerWeights& w, int layer, int h, float* smem) {
  static_assert(3 * T <= kWarps, "a warp per prepared vector");
  const int D = p.head_dim, NH = p.num_heads, NKV = p.num_kv_heads, group = NH / NKV, g = h / group;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* q = smem;  // (T, D) each: q, k, v
  float* k = smem + T * D;
  float* v = smem + 2 * T * D;
  if (warp < 3 * T) {
    const int kind = warp / T, t = warp % T;  // kind 0: q, 1: k, 2: v
    const float* src = p.qkv + t * (NH + 2 * NKV) * D + (kind == 0 ? h * D : (kind == 1 ? NH : NH + NKV) * D + g * D);
    float* vec = smem + (kind * T + t) * D;
    prepare_head(vec, src, kind == 0 ? w.q_norm : (kind == 1 ? w.k_norm : nullptr), kind < 2, D, t, p.eps,
                 p.rope_theta);
    const int64_t row = (static_cast<int64_t>(layer) * NKV + g) * p.capacity + t;
    if (kind > 0) round_to_cache(vec, (kind == 1 ? p.cache_k : p.cache_v) + row * D, h % group == 0, D);
  }
  __syncthreads();
  if (warp < T) {
    const int t = warp;
    const float scale = rsqrtf(static_cast<float>(D));
    float e[T], m = -INFINITY, sum = 0.f;
#pragma unroll
    for (int j = 0; j < T; ++j) {
      float d = 0.f;
      for (int i = lane; i < D; i += 32) d += q[t * D + i] * k[j * D + i];
      e[j] = warp_sum(d) * scale;
      if (j <= t) m = fmaxf(m, e[j]);
    }
#pragma unroll
    for (int j = 0; j < T; ++j) {
      e[j] = j <= t ? __expf(e[j] - m) : 0.f;
      sum += e[j];
    }
    const float inv_sum = 1.0f / sum;
    for (int i = lane; i < D; i += 32) {
      float acc = 0.f;
#pragma unroll
      for (int j = 0; j < T; ++j) acc = fmaf(e[j], v[j * D + i], acc);
      p.attn[t * NH * D + h * D + i] = acc * inv_sum;
    }
  }
  __syncthreads();  // smem is the next head's
}

// The layers of a step of T tokens, stage B (attention) by attend(layer, weights), which leaves token t's head h at
// p.attn + (t * num_heads + h) * head_dim: x_in holds their input vectors (token t's at x_in + t * hidden), and the
// stack's scratch room for T tokens (p.tokens). Afterwards (a grid barrier passed) p.x holds the tokens' residual
// streams, token t's at p.x + t * hidden. Each stage reads its weights once for all T tokens, and a token's sums do
// not depend on T (grid_matvec). `tag` names its barriers in the trace (kTalker or kPredictor). The long-row matvecs
// (o_proj, down) give a warp one row with all of it in flight, so a row is one round trip to HBM, not two or three;
// the 0.6B's 1024 rows about fill the grid's warps.
template <int T, typename Attend>
__device__ __forceinline__ void stack_layers(const StackParams& p, const float* x_in, float* smem, float* scratch,
                                             int tag, Attend attend) {
  cg::grid_group grid = cg::this_grid();
  const int H = p.hidden, D = p.head_dim, NH = p.num_heads, NKV = p.num_kv_heads, I = p.intermediate;
  const int q_rows = NH * D, kv_rows = NKV * D, qkv_rows = q_rows + 2 * kv_rows;
  // rows a warp takes at once in A and D: fewer where many tokens' sums need the registers (the sums are the same)
  constexpr int kRowsA = T > 4 ? 2 : 4, kRowsD = T > 2 ? 2 : 6;
  for (int l = 0; l < p.num_layers; ++l) {
    const LayerWeights& w = p.layers[l];  // in shared memory: no registers held across the layer
    const float* residual = l == 0 ? x_in : p.x;
    // A: a warp's 4 rows (the 0.6B's whole share) in one batch
    grid_matvec<kRowsA, 4 * kRowsA, T>(
        qkv_rows, H, smem,
        [&](int r) {
          return r < q_rows ? row_of(w.q, r, H)
                            : (r < q_rows + kv_rows ? row_of(w.k, r - q_rows, H) : row_of(w.v, r - q_rows - kv_rows, H));
        },
        [&] { load_normed<T>(smem, residual, w.input_norm, H, p.eps, scratch); },
        [&](int r, int t, float d) { p.qkv[t * qkv_rows + r] = d; });
    barrier(grid, tag + 0);
    attend(l, w);
    barrier(grid, tag + 1);
    // C
    grid_matvec<1, 8, T>(
        H, q_rows, smem, [&](int r) { return row_of(w.o, r, q_rows); }, [&] { load_shared(smem, p.attn, T * q_rows); },
        [&](int r, int t, float d) { p.x[t * H + r] = residual[t * H + r] + d; });
    barrier(grid, tag + 2);
    // D: a warp's 6 rows in one batch; gate and up rows of one index go to the same warp, so SiLU(g) * u
    // needs no exchange
    grid_matvec<kRowsD, 4 * kRowsD, T>(
        2 * I, H, smem, [&](int r) { return row_of(r % 2 ? w.up : w.gate, r / 2, H); },
        [&] { load_normed<T>(smem, p.x, w.post_norm, H, p.eps, scratch); },
        [&](int r, int t, float d) {
          // lane 0 sees gate (even r) then up (odd r) of row r / 2, token by token
          float* mlp = p.mlp + t * I;
          if (r % 2 == 0) mlp[r / 2] = d / (1.0f + __expf(-d));
          else mlp[r / 2] *= d;
        });
    barrier(grid, tag + 3);
    // E
    grid_matvec<1, 12, T>(
        H, I, smem, [&](int r) { return row_of(w.down, r, I); }, [&] { load_shared(smem, p.mlp, T * I); },
        [&](int r, int t, float d) { p.x[t * H + r] += d; });
    barrier(grid, tag + 4);
  }
}

// The step of T tokens of one sequence (T > 1: its first T, at positions 0..T-1; pos is then 0). Not inlined:
// frames_kernel calls it from three places, and one copy with its own registers ran the frame ~4% faster than three
// inlined ones.
template <int T = 1>
__device__ __noinline__ void stack_step(const StackParams& p, int pos, const float* x_in, float* smem, float* scratch,
                                        int tag) {
  stack_layers<T>(p, x_in, smem, scratch, tag, [&](int l, const LayerWeights& w) {
    for (int h = blockIdx.x; h < p.num_heads; h += gridDim.x) {
      if constexpr (T == 1) attention_head(p, w, l, pos, h, smem, scratch);
      else attention_first_head<T>(p, w, l, h, smem);
    }
  });
}

// Every block: smem <- final_norm(x), x a residual stream of the step just taken (p.x + t * hidden for token t).
__device__ __forceinline__ void final_norm_shared(const StackParams& p, const float* x, float* smem, float* scratch) {
  load_normed(smem, x, p.final_norm, p.hidden, p.eps, scratch);
}

}  // namespace mk
