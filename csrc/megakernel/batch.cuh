// Whole decode frames of S streams in one launch: each stream is a token of every matvec, so each weight is read once
// for all of them, and a lane sums every token's products in the same k order whatever the launch's tokens
// (grid_matvec), so each stream gets the very codes of its launches alone (frame.cuh), bit for bit. What a stream has
// of its own: its talker cache and position, its code predictor cache, its picks (seed, frame, seen) and its frames'
// bounds; heads of attention run for each stream on its own cache, and block s picks stream s's codes.
// reference: frame.cuh frames_body (one stream); engine/tts/model.py Qwen3TTS.sample_frames / advance_frames
#pragma once

#include "frame.cuh"

namespace mk {

// What each block keeps of the launch's streams in shared memory: where each steps, and which still make frames.
struct StreamsState {
  int pos[kMaxStreams];    // the talker's next cache position
  bool live[kMaxStreams];  // still making frames in this launch
  bool step[kMaxStreams];  // takes a talker step before this frame
};

// Stream s's view of a stack: its cache, and its token's rows of the scratch (`first` rows a stream: 2 for the
// predictor's first pass).
__device__ __forceinline__ StackParams stream_view(const StackParams& p, __nv_bfloat16* k, __nv_bfloat16* v,
                                                   int capacity, int s, int rows) {
  StackParams q = p;
  q.cache_k = k, q.cache_v = v, q.capacity = capacity;
  q.qkv += static_cast<int64_t>(s) * rows * (p.num_heads + 2 * p.num_kv_heads) * p.head_dim;
  q.attn += static_cast<int64_t>(s) * rows * p.num_heads * p.head_dim;
  return q;
}

// Stream s's code predictor cache (layers, kv_heads, groups, head_dim) in the batch's.
__device__ __forceinline__ int64_t predictor_stride(const BatchParams& b) {
  const StackParams& p = b.frame.predictor;
  return static_cast<int64_t>(p.num_layers) * p.num_kv_heads * b.frame.groups * p.head_dim;
}

// The talker step of the streams that step (token s = stream s at st.pos[s]); the others' rows are computed and left
// unused, their caches untouched.
template <int S>
__device__ __noinline__ void talker_streams(const BatchParams& b, const StreamsState& st, float* smem, float* scratch) {
  const StackParams& p = b.frame.talker;
  stack_layers<S>(p, b.talker_in, smem, scratch, kTalker, [&](int l, const LayerWeights& w) {
    for (int i = blockIdx.x; i < S * p.num_heads; i += gridDim.x) {
      const int s = i / p.num_heads;
      if (!st.step[s]) continue;
      const StreamParams& own = b.stream[s];
      attention_head(stream_view(p, own.cache_k, own.cache_v, own.capacity, s, 1), w, l, st.pos[s], i % p.num_heads,
                     smem, scratch);
    }
  });
}

// A code predictor pass of the live streams: their first (T = 2 tokens a stream, positions 0 and 1) or the one at
// position `pos` (T = 1).
template <int S, int T>
__device__ __noinline__ void predictor_streams(const BatchParams& b, const StreamsState& st, int pos,
                                               const float* x_in, float* smem, float* scratch) {
  const StackParams& p = b.frame.predictor;
  stack_layers<S * T>(p, x_in, smem, scratch, kPredictor, [&](int l, const LayerWeights& w) {
    for (int i = blockIdx.x; i < S * p.num_heads; i += gridDim.x) {
      const int s = i / p.num_heads, h = i % p.num_heads;
      if (!st.live[s]) continue;
      const int64_t at = s * predictor_stride(b);
      const StackParams q = stream_view(p, b.predictor_k + at, b.predictor_v + at, b.frame.groups, s, T);
      if constexpr (T == 1) attention_head(q, w, l, pos, h, smem, scratch);
      else attention_first_head<T>(q, w, l, h, smem);
    }
  });
}

// One head's logits for every stream (their inputs put in every block's shared memory by prepare_x, stream s's at
// smem + s * K), then block s adjusts stream s's, picks its code into *slot(s) and calls picked(s, code), reusing
// smem (the inputs are spent by then). Ends with a barrier, after which the codes and what picked() wrote are visible
// to every block.
template <int S, typename PrepareX, typename Key, typename Slot, typename Pick, typename Adjust, typename Picked>
__device__ void heads_and_picks(const BatchParams& b, const StreamsState& st, const __nv_bfloat16* W, int vocab, int K,
                                float* smem, PickScratch& ps, int tag, PrepareX prepare_x, Key key, Slot slot,
                                Pick pick_params, Adjust adjust, Picked picked) {
  cg::grid_group grid = cg::this_grid();
  float* logits = b.frame.logits;
  grid_matvec<2, 8, S>(vocab, K, smem, [&](int r) { return row_of(W, r, K); }, prepare_x,
                       [&](int r, int s, float d) { logits[s * vocab + r] = d; });
  barrier(grid, tag);
  for (int s = blockIdx.x; s < S; s += gridDim.x) {
    if (!st.live[s]) continue;
    load_logits(smem, logits + s * vocab, vocab);
    adjust(s, smem);
    const int code = pick(smem, vocab, pick_params(s), key(s), ps);
    if (threadIdx.x == 0) *slot(s) = code;
    picked(s, code);
    __syncthreads();
  }
  barrier(grid, tag + 1);
}

template <int S>
__device__ void batch_body(const BatchParams& b, StreamsState& st, float* smem, float* scratch, PickScratch& ps) {
  cg::grid_group grid = cg::this_grid();
  const FrameParams& p = b.frame;
  const int H = p.talker.hidden, Hp = p.predictor.hidden, G = p.groups;
  auto codes = [&](int s, int f) { return b.codes + (static_cast<int64_t>(s) * b.frames + f) * G; };
  if (threadIdx.x == 0)
    for (int s = 0; s < S; ++s) {
      st.pos[s] = b.stream[s].talker_pos;
      st.live[s] = s < b.streams;
    }
  for (int f = 0; f < b.frames; ++f) {
    // a stream whose frames this launch are made stops; the others step before the frame, unless it is their first
    // and their talker has stepped on its input (as frames_body)
    bool stepping = false;
    if (threadIdx.x == 0)
      for (int s = 0; s < S; ++s) {
        if (st.live[s] && f == b.stream[s].frames) {
          st.live[s] = false;
          if (blockIdx.x == 0) b.frames_done[s] = f;
        }
        st.step[s] = st.live[s] && (f > 0 || b.stream[s].advance_first);
      }
    __syncthreads();
    for (int s = 0; s < S; ++s) stepping |= st.step[s];
    if (stepping) talker_streams<S>(b, st, smem, scratch);
    // codebook 0 (frames_body's, a stream at a time): block 0 writes each stream's hidden state and its code
    // predictor's two first inputs, [hidden state, embedding of code 0], as predictor_src's rows 2s and 2s + 1
    heads_and_picks<S>(
        b, st, p.codec_head, p.talker_vocab, H, smem, ps, kCodecHead,
        [&] {
          for (int s = 0; s < S; ++s) {
            if (st.step[s]) final_norm_shared(p.talker, p.talker.x + s * H, smem + s * H, scratch);
            else load_shared(smem + s * H, b.hidden + s * H, H);
          }
          if (blockIdx.x == 0)
            for (int s = 0; s < S; ++s)
              for (int i = threadIdx.x; i < H; i += blockDim.x) {
                if (st.step[s]) b.hidden[s * H + i] = smem[s * H + i];
                p.predictor_src[2 * s * H + i] = smem[s * H + i];
              }
        },
        [&](int s) { return draw_key(b.stream[s].seed, b.stream[s].frame0 + f, 0); },
        [&](int s) { return codes(s, f); }, [&](int s) { return b.stream[s].talker_pick; },
        [&](int s, float* v) {
          const StreamParams& own = b.stream[s];
          adjust_talker(v, p.talker_vocab, b.seen + static_cast<int64_t>(s) * p.talker_vocab, p.suppress,
                        own.repetition_penalty, own.frame0 + f < own.min_frames, p.eos_id);
        },
        [&](int s, int code) {
          embedding_row(p, 0, code, p.predictor_src + (2 * s + 1) * H);
          if (threadIdx.x == 0 && code != p.eos_id) b.seen[static_cast<int64_t>(s) * p.talker_vocab + code] = 1;
        });
    // the talker positions stepped on, and the streams that picked EOS, which end here
    if (threadIdx.x == 0)
      for (int s = 0; s < S; ++s) {
        st.pos[s] += st.step[s];
        if (st.live[s] && __ldcg(codes(s, f)) == p.eos_id) {
          st.live[s] = false;
          if (blockIdx.x == 0) b.frames_done[s] = f;
        }
      }
    __syncthreads();
    bool any = false;
    for (int s = 0; s < S; ++s) any |= st.live[s];
    if (!any) return;
    // codebooks 1..15 (frames_body's): the first pass takes each stream's two tokens, later ones a token a stream,
    // whose input block s writes as predictor_src's row s when it picks the code before
    predictor_streams<S, 2>(b, st, 0, predictor_input<2 * S>(p, p.predictor_src, smem), smem, scratch);
    for (int g = 1; g < G; ++g) {
      if (g > 1) predictor_streams<S, 1>(b, st, g, predictor_input<S>(p, p.predictor_src, smem), smem, scratch);
      heads_and_picks<S>(
          b, st, reinterpret_cast<const __nv_bfloat16*>(p.predictor_heads[g - 1]), p.predictor_vocab, Hp, smem, ps,
          kPredictorHead,
          [&] {
            for (int s = 0; s < S; ++s)
              final_norm_shared(p.predictor, p.predictor.x + (g == 1 ? 2 * s + 1 : s) * Hp, smem + s * Hp, scratch);
          },
          [&](int s) { return draw_key(b.stream[s].seed, b.stream[s].frame0 + f, g); },
          [&](int s) { return codes(s, f) + g; }, [&](int s) { return b.stream[s].predictor_pick; },
          [](int, float*) {},
          [&](int s, int code) {
            if (g + 1 < G) embedding_row(p, g, code, p.predictor_src + s * H);
          });
    }
    // each live stream's next talker input: its 16 codebook embeddings + its frame's text-track input
    for (int s = blockIdx.x; s < S; s += gridDim.x)
      if (st.live[s])
        next_talker_input(p, codes(s, f), b.text_inputs + (static_cast<int64_t>(s) * b.frames + f) * H,
                          b.talker_in + s * H);
    if (f + 1 < b.frames) barrier(grid, kFrameEnd);
  }
  if (blockIdx.x == 0 && threadIdx.x == 0)
    for (int s = 0; s < S; ++s)
      if (st.live[s]) b.frames_done[s] = b.stream[s].frames;
}

}  // namespace mk
