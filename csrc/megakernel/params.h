// The persistent kernels' arguments as plain structs, shared by the CUDA side and the torch binding (no device
// code here).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace mk {

constexpr int kMaxNormed = 2048;  // widest vector the kernels normalize (the 1.7B talker's hidden)
constexpr int kMaxHeadDim = 256;  // widest attention head (128 in both published sizes)
constexpr int kMaxLayers = 40;    // talker + predictor layers a launch holds (28 + 5 in both published sizes)

struct LayerWeights {  // pointers into the engine's own parameters; no copies
  const __nv_bfloat16 *q, *k, *v, *o, *gate, *up, *down;
  const __nv_bfloat16 *input_norm, *post_norm, *q_norm, *k_norm;
};

// One Qwen3 decoder stack: its weights, shapes, KV cache (layers, kv_heads, capacity, head_dim) and
// fp32 scratch for `tokens` tokens a step: residual x (hidden), q|k|v, attention output, SiLU(g) * u, token t's at
// t times each one's size.
struct StackParams {
  const LayerWeights* layers;
  int num_layers, hidden, intermediate, num_heads, num_kv_heads, head_dim;
  float eps, rope_theta;
  const __nv_bfloat16* final_norm;
  __nv_bfloat16 *cache_k, *cache_v;
  int capacity;
  float *x, *qkv, *attn, *mlp;
  int tokens;
};

// How one codebook is picked from its logits (engine/tts/sampling.py); temperature 0 = greedy.
struct PickParams {
  float temperature;
  int top_k;
};

// A run of whole decode frames (engine/tts/model.py Qwen3TTS.sample_frame, then advance). Per frame:
// [a talker step on talker_in, unless it is the launch's first frame and !advance_first] -> codec head
// on the talker's hidden state -> codebook 0 (repetition penalty over `seen`, `suppress`, EOS masked
// before min_frames) -> the code predictor's prefill and 14 steps with its heads -> codebooks 1..15 ->
// talker_in = the 16 codebook embeddings + that frame's text-track input (the next frame's step).
struct FrameParams {
  StackParams talker, predictor;
  const __nv_bfloat16* codec_head;          // (talker vocab, talker hidden)
  const int64_t* predictor_heads;           // 15 pointers to (predictor vocab, predictor hidden)
  const int64_t* embeddings;                // 16 pointers: codebook 0 (talker vocab rows), 1..15 (predictor vocab rows), talker-wide
  const __nv_bfloat16 *proj_w, *proj_b;     // small_to_mtp_projection (predictor hidden, talker hidden), or null
  int talker_vocab, predictor_vocab, groups; // groups = 16 codebooks
  int talker_pos;                           // cache position of the launch's first talker step
  bool advance_first;                       // talker_in holds an input the talker has not stepped on
  int frames;                               // frames to run at most
  int frame0;                               // index of the first frame in the utterance (RNG counter, min_frames)
  int min_frames, eos_id;
  uint32_t seed;
  float repetition_penalty;
  PickParams talker_pick, predictor_pick;
  const uint8_t* suppress;                  // (talker vocab) 1 = never emitted
  uint8_t* seen;                            // (talker vocab) codebook-0 codes emitted so far (read and written)
  const float* text_inputs;                 // (frames, talker hidden)
  float* hidden;                            // (talker hidden) final-normed talker state: read unless advance_first, written per step
  float* logits;                            // scratch (max vocab)
  float *talker_in, *predictor_in, *predictor_src;  // scratch: talker hidden, 2 x predictor hidden, 2 x talker hidden
  int64_t* codes;                           // out (frames, groups)
  int* frames_done;                         // out: frames emitted (< frames when codebook 0 was EOS)
};

// Several streams' frames in one launch (batch.cuh): BatchParams.frame holds what they share (the weights, heads,
// tables, eos_id, suppress, and scratch for `streams` tokens of the talker, 2 x `streams` of the predictor, logits and
// predictor inputs for each stream); its per-launch fields are unused. What each stream has of its own:
constexpr int kMaxStreams = 8;
constexpr int kMaxTokens = 2 * kMaxStreams;  // tokens a stack step takes at most: the predictor's first pass
struct StreamParams {
  __nv_bfloat16 *cache_k, *cache_v;  // its talker cache (layers, kv_heads, capacity, head_dim)
  int capacity;
  int talker_pos;                    // cache position of its first talker step in the launch
  bool advance_first;                // as FrameParams'
  int frames;                        // its frames at most in this launch (<= BatchParams.frames)
  int frame0, min_frames;            // as FrameParams'
  uint32_t seed;
  float repetition_penalty;
  PickParams talker_pick, predictor_pick;
};
struct BatchParams {
  FrameParams frame;
  StreamParams stream[kMaxStreams];
  int streams, frames;                      // streams in the launch (<= the kernel's S), frames at most
  __nv_bfloat16 *predictor_k, *predictor_v; // (streams, predictor layers, kv_heads, groups, head_dim)
  // stream s's rows at s times each one's size:
  uint8_t* seen;                            // (streams, talker vocab)
  const float* text_inputs;                 // (streams, frames, talker hidden)
  float* hidden;                            // (streams, talker hidden) as FrameParams'
  float* talker_in;                         // (streams, talker hidden) the next talker step's input, read and written
  int64_t* codes;                           // out (streams, frames, groups)
  int* frames_done;                         // out (streams): frames emitted (fewer than its frames at EOS)
};

// The dataflow step's own arguments (dataflow.cuh): its counters, owned by the caller and zeroed once, a count per
// layer and stage (q/k/v, attention, o_proj, gate/up, down) that only grows; the stall flag; the launch's number.
constexpr int kDataflowStages = 5;
constexpr int kPageBytes = 16384;  // a page of the weight ring in shared memory: whole rows, so a row is at most 8192
struct DataflowParams {
  unsigned* counters;  // (layers, kDataflowStages)
  int* stalled;        // 0, or 1 + 8 * layer + stage (5: the final norm) of the first wait that timed out
  unsigned step;       // this launch's number on these counters: 1, 2, ... (wrapping is harmless)
  int pages;           // pages in the ring
};

// Shared memory a launch needs, blocks that fit co-resident, and the launches (megakernel.cu).
size_t step_shared_bytes(const StackParams& p, int tokens);
size_t frame_shared_bytes(const FrameParams& p);
cudaError_t step_coresident_blocks(size_t smem, int* blocks);
cudaError_t frame_coresident_blocks(size_t smem, int* blocks);
cudaError_t launch_decoder_step(const StackParams& p, int pos, const float* x_in, float* out, int blocks,
                                cudaStream_t stream);
cudaError_t launch_frames(const FrameParams& p, int blocks, cudaStream_t stream);
// S streams a launch, for S = 2, 4 and 8 (batch.cuh); a launch of fewer streams leaves the rest of its S unused.
size_t batch_shared_bytes(const BatchParams& p, int S);
cudaError_t batch_coresident_blocks(int S, size_t smem, int* blocks);
cudaError_t launch_batch(const BatchParams& p, int S, int blocks, cudaStream_t stream);
// The dataflow step's shared memory is all an SM gives a block (dataflow_shared_bytes); its ring gets what attention
// and the activations leave (dataflow_ring_pages).
cudaError_t dataflow_shared_bytes(size_t* bytes);
int dataflow_ring_pages(const StackParams& p, size_t smem);
cudaError_t dataflow_coresident_blocks(size_t smem, int* blocks);
cudaError_t launch_dataflow_step(const StackParams& p, const DataflowParams& f, int pos, const float* x_in, float* out,
                                 int blocks, size_t smem, cudaStream_t stream);
// The barrier trace (common.cuh): slots (capacity, 3) or null to stop; the count of barriers recorded.
cudaError_t set_trace(unsigned long long* slots, int capacity);
cudaError_t trace_count(int* count);

}  // namespace mk
