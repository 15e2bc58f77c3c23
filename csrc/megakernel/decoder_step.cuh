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
__device__ void attention_head(const StackParams& p, const LayerWeights& w, int layer, int pos, int h, float* smem,
                               float* scratch) {
  const int D = p.head_dim, NH = p.num_heads, NKV = p.num_kv_heads, group = NH / NKV, g = h / group;
  const int L = pos + 1;
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
  probe(kHeadLoaded);
  rmsnorm_shared(q, w.q_norm, D, p.eps, scratch);
  rmsnorm_shared(k, w.k_norm, D, p.eps, scratch);
  rope_shared(q, D, pos, p.rope_theta);
  rope_shared(k, D, pos, p.rope_theta);
  probe(kHeadPrepared);
  const int64_t head_base = (static_cast<int64_t>(layer) * NKV + g) * p.capacity;
  // the new position is used as the cache stores it (bf16), so every step sees the same keys
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    const __nv_bfloat16 kb = __float2bfloat16(k[i]), vb = __float2bfloat16(v[i]);
    k[i] = __bfloat162float(kb);
    v[i] = __bfloat162float(vb);
    if (h % group == 0) {
      p.cache_k[(head_base + pos) * D + i] = kb;
      p.cache_v[(head_base + pos) * D + i] = vb;
    }
  }
  __syncthreads();
  // scores: a warp per position, its lanes across head_dim (4 dims, one 8-byte load each), several
  // positions in flight per warp; the new position from shared memory (another block may be writing it)
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
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

// The step: afterwards (a grid barrier passed) p.x holds the residual stream of the new position.
// `tag` names its barriers in the trace (kTalker or kPredictor). Not inlined: frames_kernel calls it from
// three places, and one copy with its own registers ran the frame ~4% faster than three inlined ones.
// The long-row matvecs (o_proj, down) give a warp one row with all of it in flight, so a row is one
// round trip to HBM, not two or three; the 0.6B's 1024 rows about fill the grid's warps.
__device__ __noinline__ void stack_step(const StackParams& p, int pos, const float* x_in, float* smem, float* scratch, int tag) {
  cg::grid_group grid = cg::this_grid();
  const int H = p.hidden, D = p.head_dim, NH = p.num_heads, NKV = p.num_kv_heads, I = p.intermediate;
  const int q_rows = NH * D, kv_rows = NKV * D;
  for (int l = 0; l < p.num_layers; ++l) {
    const LayerWeights& w = p.layers[l];  // in shared memory: no registers held across the layer
    const float* residual = l == 0 ? x_in : p.x;
    // A: a warp's 4 rows (the 0.6B's whole share) in one batch
    grid_matvec<4, 16>(
        q_rows + 2 * kv_rows, H, smem,
        [&](int r) {
          return r < q_rows ? row_of(w.q, r, H)
                            : (r < q_rows + kv_rows ? row_of(w.k, r - q_rows, H) : row_of(w.v, r - q_rows - kv_rows, H));
        },
        [&] { load_normed(smem, residual, w.input_norm, H, p.eps, scratch); }, [&](int r, float d) { p.qkv[r] = d; });
    barrier(grid, tag + 0);
    // B
    for (int h = blockIdx.x; h < NH; h += gridDim.x) attention_head(p, w, l, pos, h, smem, scratch);
    barrier(grid, tag + 1);
    // C
    grid_matvec<1, 8>(
        H, NH * D, smem, [&](int r) { return row_of(w.o, r, NH * D); }, [&] { load_shared(smem, p.attn, NH * D); },
        [&](int r, float d) { p.x[r] = residual[r] + d; });
    barrier(grid, tag + 2);
    // D: a warp's 6 rows in one batch; gate and up rows of one index go to the same warp, so SiLU(g) * u
    // needs no exchange
    grid_matvec<6, 24>(
        2 * I, H, smem, [&](int r) { return row_of(r % 2 ? w.up : w.gate, r / 2, H); },
        [&] { load_normed(smem, p.x, w.post_norm, H, p.eps, scratch); },
        [&](int r, float d) {
          // lane 0 sees gate (even r) then up (odd r) of row r / 2
          if (r % 2 == 0) p.mlp[r / 2] = d / (1.0f + __expf(-d));
          else p.mlp[r / 2] *= d;
        });
    barrier(grid, tag + 3);
    // E
    grid_matvec<1, 12>(
        H, I, smem, [&](int r) { return row_of(w.down, r, I); }, [&] { load_shared(smem, p.mlp, I); },
        [&](int r, float d) { p.x[r] += d; });
    barrier(grid, tag + 4);
  }
}

// Every block: smem <- final_norm(p.x), the stack's output for the step just taken.
__device__ __forceinline__ void final_norm_shared(const StackParams& p, float* smem, float* scratch) {
  load_normed(smem, p.x, p.final_norm, p.hidden, p.eps, scratch);
}

}  // namespace mk
