// Whole decode frames in one launch: codec head, codebook-0 pick, the code predictor's 15 passes with
// their heads and picks, the 16-embedding sum and the next talker step; the host reads back codes.
// reference: engine/tts/model.py Qwen3TTS.sample_frame / advance, engine/tts/sampling.py Sampler
#pragma once

#include "decoder_step.cuh"

namespace mk {

// --- picking a code (one block) ------------------------------------------------------------------

// Wellons' lowbias32, as engine/tts/sampling.py _mix32.
__device__ __forceinline__ uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  return x ^ (x >> 16);
}

__device__ __forceinline__ uint32_t draw_key(uint32_t seed, int frame, int group) {
  return mix32(mix32(mix32(seed) ^ static_cast<uint32_t>(frame)) ^ static_cast<uint32_t>(group));
}

// Gumbel(0, 1) noise of token i, bit for bit sampling.py gumbel_noise (u is exact and below 1, so the noise is
// finite; logf as torch's log).
__device__ __forceinline__ float gumbel(uint32_t key, int i) {
  const uint32_t bits = mix32(mix32(static_cast<uint32_t>(i)) ^ key);
  const float u = (static_cast<float>(bits >> 9) + 0.5f) * (1.0f / 8388608.0f);
  return -logf(-logf(u));
}

// Float -> unsigned with the same order (larger float, larger key), for the radix select.
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float order_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k);
}

struct PickScratch {  // shared memory of the picking block
  unsigned hist[256];
  int state[2];
  float best[kWarps];
  int best_index[kWarps];
};

// The k-th largest of v[0..n) (ties counted, as torch.topk(v, k).values[-1]) by a 4-pass radix select.
__device__ float kth_largest(const float* v, int n, int k, PickScratch& s) {
  uint32_t prefix = 0, mask = 0;
  int remaining = k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) s.hist[i] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const uint32_t key = order_key(v[i]);
      if ((key & mask) == prefix) atomicAdd(&s.hist[(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      // lane owns digits [8 lane, 8 lane + 8); the wanted digit d has count(> d) < remaining <= count(>= d)
      const int lane = threadIdx.x;
      unsigned c[8], total = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) total += (c[j] = s.hist[8 * lane + j]);
      unsigned at_or_above = total;  // digits of lanes >= this one
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned t = __shfl_down_sync(0xffffffffu, at_or_above, o);
        if (lane + o < 32) at_or_above += t;
      }
      unsigned above = at_or_above - total;
      if (above < static_cast<unsigned>(remaining) && static_cast<unsigned>(remaining) <= at_or_above) {
        for (int j = 7; j >= 0; --j) {
          if (above + c[j] >= static_cast<unsigned>(remaining)) {
            s.state[0] = 8 * lane + j;
            s.state[1] = remaining - static_cast<int>(above);
            break;
          }
          above += c[j];
        }
      }
    }
    __syncthreads();
    prefix |= static_cast<uint32_t>(s.state[0]) << shift;
    mask |= 255u << shift;
    remaining = s.state[1];
    __syncthreads();
  }
  return order_value(prefix);
}

// Index of the largest v[i], the lowest index on ties (torch.argmax).
__device__ int block_argmax(const float* v, int n, PickScratch& s) {
  float best = -INFINITY;
  int index = n;
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    if (index == n || v[i] > best) best = v[i], index = i;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float b = __shfl_xor_sync(0xffffffffu, best, o);
    const int j = __shfl_xor_sync(0xffffffffu, index, o);
    if (b > best || (b == best && j < index)) best = b, index = j;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) s.best[warp] = best, s.best_index[warp] = index;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kWarps; ++w)
      if (s.best[w] > s.best[0] || (s.best[w] == s.best[0] && s.best_index[w] < s.best_index[0]))
        s.best[0] = s.best[w], s.best_index[0] = s.best_index[w];
  }
  __syncthreads();
  const int result = s.best_index[0];
  __syncthreads();
  return result;
}

// sampling.py _scores + argmax with top_p = 1: argmax, or a Gumbel-max draw over softmax(v / T) cut to the top k.
// v (shared memory) is overwritten.
__device__ int pick(float* v, int n, PickParams pp, uint32_t key, PickScratch& s) {
  if (pp.temperature == 0.f) return block_argmax(v, n, s);
  for (int i = threadIdx.x; i < n; i += blockDim.x) v[i] = v[i] / pp.temperature;
  __syncthreads();
  const float kth = pp.top_k < n ? kth_largest(v, n, pp.top_k, s) : -INFINITY;
  for (int i = threadIdx.x; i < n; i += blockDim.x) v[i] = v[i] < kth ? -INFINITY : v[i] + gumbel(key, i);
  __syncthreads();
  return block_argmax(v, n, s);
}

// --- the frame loop (all blocks) -------------------------------------------------------------------

__device__ __forceinline__ const __nv_bfloat16* table(const FrameParams& p, int group) {
  return reinterpret_cast<const __nv_bfloat16*>(p.embeddings[group]);
}

// Block 0: dst[0..H) <- embedding row `code` of codebook `group` in fp32, 8 values a thread from one 16-byte load (H is
// a multiple of 8; the binding checks): a bf16 at a time, a thread waited for 4 round trips to memory one after
// another, before each of the predictor's passes.
__device__ __forceinline__ void embedding_row(const FrameParams& p, int group, int64_t code, float* dst) {
  const int H = p.talker.hidden;
  const __nv_bfloat16* row = table(p, group) + code * H;
  for (int i = kVec * threadIdx.x; i < H; i += kVec * blockDim.x) {
    float v[kVec];
    unpack8(load_weights(row + i), v);
    *reinterpret_cast<float4*>(dst + i) = make_float4(v[0], v[1], v[2], v[3]);
    *reinterpret_cast<float4*>(dst + i + 4) = make_float4(v[4], v[5], v[6], v[7]);
  }
}

// One block: dst[0..H) <- the codebook embeddings of `codes` summed in codebook order, + text (the next talker step's
// input). A thread takes 8 values and issues 8 codebooks' 16-byte loads before it adds any: a codebook at a time, the
// sum waited for a round trip to memory per codebook.
__device__ __forceinline__ void next_talker_input(const FrameParams& p, const int64_t* codes, const float* text,
                                                  float* dst) {
  constexpr int kInFlight = 8;
  const int H = p.talker.hidden, G = p.groups;
  for (int i = kVec * threadIdx.x; i < H; i += kVec * blockDim.x) {
    float sum[kVec] = {};
    for (int j0 = 0; j0 < G; j0 += kInFlight) {
      uint4 raw[kInFlight];
#pragma unroll
      for (int j = 0; j < kInFlight; ++j)
        raw[j] = j0 + j < G ? load_weights(table(p, j0 + j) + __ldcg(codes + j0 + j) * H + i) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int j = 0; j < kInFlight && j0 + j < G; ++j) {
        float v[kVec];
        unpack8(raw[j], v);
#pragma unroll
        for (int e = 0; e < kVec; ++e) sum[e] += v[e];
      }
    }
#pragma unroll
    for (int e = 0; e < kVec; ++e) dst[i + e] = sum[e] + text[i + e];
  }
}

// The predictor's input for a pass of T tokens from talker-wide source vectors (token t's at src + t * talker
// hidden; all blocks; ends with a barrier where the projection runs): small_to_mtp_projection where the widths
// differ, else the sources themselves.
template <int T = 1>
__device__ const float* predictor_input(const FrameParams& p, const float* src, float* smem) {
  if (p.proj_w == nullptr) return src;
  cg::grid_group grid = cg::this_grid();
  const int H = p.talker.hidden, Hp = p.predictor.hidden;
  grid_matvec<(T > 8 ? 1 : 2), (T > 8 ? 4 : 8), T>(  // a row a warp at 16 tokens: no spills
      Hp, H, smem, [&](int r) { return row_of(p.proj_w, r, H); }, [&] { load_shared(smem, src, T * H); },
      [&](int r, int t, float d) { p.predictor_in[t * Hp + r] = d + __bfloat162float(p.proj_b[r]); });
  barrier(grid, kProjection);
  return p.predictor_in;
}

// One block: codebook 0's logits v adjusted as sampling.py Sampler.talker does: the repetition penalty on codes seen,
// -inf for suppressed codes and for EOS while `early` (before min_frames). A thread's flags of 4 codes load together:
// a code at a time, each waited for its own round trips to memory.
__device__ __forceinline__ void adjust_talker(float* v, int vocab, const uint8_t* seen, const uint8_t* suppress,
                                              float penalty, bool early, int eos_id) {
  constexpr int kCodes = 4;
  for (int i0 = threadIdx.x; i0 < vocab; i0 += kCodes * blockDim.x) {
    uint8_t was_seen[kCodes], suppressed[kCodes];
#pragma unroll
    for (int u = 0; u < kCodes; ++u) {
      const int i = i0 + u * blockDim.x;
      was_seen[u] = i < vocab && penalty != 1.f ? seen[i] : 0;
      suppressed[u] = i < vocab ? suppress[i] : 0;
    }
#pragma unroll
    for (int u = 0; u < kCodes; ++u) {
      const int i = i0 + u * blockDim.x;
      if (i >= vocab) break;
      float x = v[i];
      if (was_seen[u]) x = x < 0.f ? x * penalty : x / penalty;
      if (suppressed[u] || (early && i == eos_id)) x = -INFINITY;
      v[i] = x;
    }
  }
  __syncthreads();
}

// One block: dst[0..vocab) <- logits written by the grid (load_shared: all of them in flight at once), a NaN (a broken
// model) as -inf, never the largest value (sampling.py _no_nan).
__device__ __forceinline__ void load_logits(float* dst, const float* logits, int vocab) {
  load_shared(dst, logits, vocab);
  for (int i = threadIdx.x; i < vocab; i += blockDim.x)
    if (isnan(dst[i])) dst[i] = -INFINITY;
  __syncthreads();
}

// Logits of one head over the grid (its input x put in every block's shared memory, smem, by prepare_x),
// then block 0 adjusts them, picks into *slot, reusing smem for the logits (x is spent by then), and calls
// picked(code). Ends with a barrier, after which *slot and what picked() wrote are visible to every block.
template <typename PrepareX, typename Adjust, typename Picked>
__device__ int64_t head_and_pick(const __nv_bfloat16* W, int vocab, int K, PickParams pp, uint32_t key,
                                 int64_t* slot, float* smem, PickScratch& s, const FrameParams& p, int tag,
                                 PrepareX prepare_x, Adjust adjust, Picked picked) {
  cg::grid_group grid = cg::this_grid();
  grid_matvec(vocab, K, smem, [&](int r) { return row_of(W, r, K); }, prepare_x,
              [&](int r, int, float d) { p.logits[r] = d; });
  barrier(grid, tag);
  if (blockIdx.x == 0) {
    load_logits(smem, p.logits, vocab);
    adjust(smem);
    const int code = pick(smem, vocab, pp, key, s);
    if (threadIdx.x == 0) *slot = code;
    picked(code);
    __syncthreads();
  }
  barrier(grid, tag + 1);
  return __ldcg(slot);
}

__device__ void frames_body(const FrameParams& p, float* smem, float* scratch, PickScratch& s) {
  cg::grid_group grid = cg::this_grid();
  const int H = p.talker.hidden, G = p.groups;
  int pos = p.talker_pos;
  for (int f = 0; f < p.frames; ++f) {
    const int frame = p.frame0 + f;
    int64_t* codes = p.codes + static_cast<int64_t>(f) * G;
    const bool step = f > 0 || p.advance_first;
    if (step) stack_step(p.talker, pos++, p.talker_in, smem, scratch, kTalker);
    // codebook 0: codec head, repetition penalty over the codes so far, suppress mask, EOS held back
    // until min_frames (sampling.py Sampler.talker). Block 0 writes the code predictor's two prefill inputs,
    // [hidden state, embedding of code 0], as predictor_src's rows 0 and 1: both are read after the head's barriers.
    const int64_t code0 = head_and_pick(
        p.codec_head, p.talker_vocab, H, p.talker_pick, draw_key(p.seed, frame, 0), codes, smem, s, p, kCodecHead,
        [&] {
          if (step) final_norm_shared(p.talker, p.talker.x, smem, scratch);
          else load_shared(smem, p.hidden, H);
          if (blockIdx.x == 0)
            for (int i = threadIdx.x; i < H; i += blockDim.x) {
              if (step) p.hidden[i] = smem[i];
              p.predictor_src[i] = smem[i];
            }
        },
        [&](float* v) {
          adjust_talker(v, p.talker_vocab, p.seen, p.suppress, p.repetition_penalty, frame < p.min_frames, p.eos_id);
        },
        [&](int code) { embedding_row(p, 0, code, p.predictor_src + H); });
    if (code0 == p.eos_id) {
      if (blockIdx.x == 0 && threadIdx.x == 0) *p.frames_done = f;
      return;
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) p.seen[code0] = 1;
    // codebooks 1..15: the two prefill tokens in one pass (each weight read once for both), then a pass a code, its
    // input the embedding of the code before, which block 0 writes as predictor_src's row 0 when it picks that code
    stack_step<2>(p.predictor, 0, predictor_input<2>(p, p.predictor_src, smem), smem, scratch, kPredictor);
    for (int g = 1; g < G; ++g) {
      if (g > 1) stack_step(p.predictor, g, predictor_input(p, p.predictor_src, smem), smem, scratch, kPredictor);
      head_and_pick(
          reinterpret_cast<const __nv_bfloat16*>(p.predictor_heads[g - 1]), p.predictor_vocab, p.predictor.hidden,
          p.predictor_pick, draw_key(p.seed, frame, g), codes + g, smem, s, p, kPredictorHead,
          [&] { final_norm_shared(p.predictor, p.predictor.x + (g == 1 ? p.predictor.hidden : 0), smem, scratch); },
          [](float*) {},
          [&](int code) {
            if (g + 1 < G) embedding_row(p, g, code, p.predictor_src);
          });
    }
    // the next talker step's input: the 16 codebook embeddings + this frame's text-track input
    if (blockIdx.x == 0) next_talker_input(p, codes, p.text_inputs + static_cast<int64_t>(f) * H, p.talker_in);
    if (f + 1 < p.frames) barrier(grid, kFrameEnd);
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) *p.frames_done = p.frames;
}

}  // namespace mk
