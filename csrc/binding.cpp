// The only file that includes torch: checks dtypes, devices and shapes by name, then launches.
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "fused/params.h"
#include "megakernel/params.h"

// TORCH_CHECK with a message built by message() below, never by TORCH_CHECK's own ostream.
#define MK_CHECK(cond, ...) TORCH_CHECK(cond, message(__VA_ARGS__))

#define MK_CHECK_CUDA(call)                                                                        \
  do {                                                                                             \
    const cudaError_t err_ = (call);                                                               \
    MK_CHECK(err_ == cudaSuccess, #call, " failed at ", __FILE__, ":", __LINE__, ": ",             \
             cudaGetErrorString(err_));                                                            \
  } while (0)

namespace {

// A refusal's text, numbers by std::to_string. An ostream would format them with the locale facets of the
// libstdc++ the process loaded, while a compiler that links its own libstdc++ into the extension (CXX=/opt/gcc on
// the lent H200) indexes them by its own ids: every message with a number in it was a segfault there.
std::string text(const char* s) { return s; }
std::string text(const std::string& s) { return s; }
std::string text(c10::ScalarType t) { return c10::toString(t); }
std::string text(const c10::Device& d) { return d.str(); }
std::string text(c10::IntArrayRef values) {
  std::string s = "[";
  for (size_t i = 0; i < values.size(); ++i) s += (i ? ", " : "") + std::to_string(values[i]);
  return s + "]";
}
template <typename T, typename = std::enable_if_t<std::is_arithmetic_v<T>>>
std::string text(T number) {
  return std::to_string(number);
}

template <typename... Parts>
std::string message(const Parts&... parts) {
  return (std::string{} + ... + text(parts));
}

void expect(const torch::Tensor& t, const char* name, torch::ScalarType dtype, int64_t numel) {
  MK_CHECK(t.is_cuda(), name, " must be on a CUDA device");
  MK_CHECK(t.scalar_type() == dtype, name, " must be ", c10::toString(dtype), ", got ", t.scalar_type());
  MK_CHECK(t.is_contiguous(), name, " must be contiguous");
  MK_CHECK(numel < 0 || t.numel() == numel, name, " has ", t.numel(), " elements, expected ", numel);
}

template <typename T>
T* ptr(const torch::Tensor& t) {
  return reinterpret_cast<T*>(t.data_ptr());
}

// A stack's weights and scratch. layers: int64 (num_layers, 11) device pointers in LayerWeights order;
// dims: hidden, intermediate, heads, kv_heads, head_dim; scratch: fp32 x, qkv, attn, mlp, each for `tokens` tokens.
mk::StackParams make_stack(torch::Tensor layers, std::vector<int64_t> dims, double eps, double rope_theta,
                           torch::Tensor final_norm, torch::Tensor x, torch::Tensor qkv, torch::Tensor attn,
                           torch::Tensor mlp, int64_t tokens) {
  MK_CHECK(dims.size() == 5, "dims must be (hidden, intermediate, heads, kv_heads, head_dim)");
  const int64_t H = dims[0], I = dims[1], NH = dims[2], NKV = dims[3], D = dims[4];
  expect(layers, "layers", torch::kInt64, -1);
  MK_CHECK(layers.dim() == 2 && layers.size(1) == 11, "layers must be int64 (num_layers, 11)");
  MK_CHECK(layers.size(0) <= mk::kMaxLayers, "at most ", mk::kMaxLayers, " layers, got ", layers.size(0));
  MK_CHECK(dims[0] <= mk::kMaxNormed, "hidden size ", dims[0], " exceeds the kernel's ", mk::kMaxNormed);
  MK_CHECK(D <= mk::kMaxHeadDim, "head_dim ", D, " exceeds the kernel's ", mk::kMaxHeadDim);
  MK_CHECK(H % 8 == 0 && I % 8 == 0 && D % 8 == 0 && NH % NKV == 0, "sizes must be multiples of 8, heads of kv_heads");
  expect(final_norm, "final_norm", torch::kBFloat16, H);
  MK_CHECK(tokens >= 1 && tokens <= 2 * mk::kMaxStreams, "tokens must be 1 to ", 2 * mk::kMaxStreams, ", got ",
           tokens);
  expect(x, "x", torch::kFloat32, tokens * H);
  expect(qkv, "qkv", torch::kFloat32, tokens * (NH + 2 * NKV) * D);
  expect(attn, "attn", torch::kFloat32, tokens * NH * D);
  expect(mlp, "mlp", torch::kFloat32, tokens * I);
  mk::StackParams p{};
  p.layers = ptr<const mk::LayerWeights>(layers);
  p.num_layers = static_cast<int>(layers.size(0));
  p.hidden = H; p.intermediate = I; p.num_heads = NH; p.num_kv_heads = NKV; p.head_dim = D;
  p.eps = static_cast<float>(eps); p.rope_theta = static_cast<float>(rope_theta);
  p.final_norm = ptr<const __nv_bfloat16>(final_norm);
  p.x = ptr<float>(x); p.qkv = ptr<float>(qkv); p.attn = ptr<float>(attn); p.mlp = ptr<float>(mlp);
  p.tokens = static_cast<int>(tokens);
  return p;
}

// The stack with its KV cache (layers, kv_heads, capacity, head_dim), room for position `last`.
mk::StackParams with_cache(mk::StackParams p, const torch::Tensor& k, const torch::Tensor& v, int64_t last,
                           const char* name) {
  expect(k, name, torch::kBFloat16, -1);
  expect(v, name, torch::kBFloat16, -1);
  MK_CHECK(k.dim() == 4 && k.size(0) == p.num_layers && k.size(1) == p.num_kv_heads && k.size(3) == p.head_dim,
              name, " must be (layers, kv_heads, capacity, head_dim)");
  MK_CHECK(v.sizes() == k.sizes(), name, ": keys and values differ in shape");
  MK_CHECK(last < k.size(2), name, ": position ", last, " outside the cache's capacity ", k.size(2));
  p.cache_k = ptr<__nv_bfloat16>(k);
  p.cache_v = ptr<__nv_bfloat16>(v);
  p.capacity = static_cast<int>(k.size(2));
  return p;
}

// One token through the stack at `pos`; writes K/V there and the final-normed state to out.
void decoder_step(const mk::StackParams& stack, torch::Tensor cache_k, torch::Tensor cache_v, int64_t pos,
                  torch::Tensor x_in, torch::Tensor out, int64_t blocks) {
  MK_CHECK(pos >= 0, "pos must be >= 0");
  const mk::StackParams p = with_cache(stack, cache_k, cache_v, pos, "cache");
  expect(x_in, "x_in", torch::kFloat32, p.hidden);
  expect(out, "out", torch::kFloat32, p.hidden);
  const c10::cuda::CUDAGuard guard(x_in.device());
  MK_CHECK_CUDA(mk::launch_decoder_step(p, static_cast<int>(pos), ptr<const float>(x_in), ptr<float>(out),
                                        static_cast<int>(blocks), at::cuda::getCurrentCUDAStream()));
}

// The same step by the dataflow kernel (megakernel/dataflow.cuh): counters int32 (layers, 5), zeroed once by the
// caller, then passed to every launch with step 1, 2, ... in launch order; stalled int32 (1) stays 0 unless a wait
// timed out (1 + 8 * layer + stage: 0..4 the stages A..E, 5 the final norm). blocks and smem from plan_dataflow.
void dataflow_step(const mk::StackParams& stack, torch::Tensor cache_k, torch::Tensor cache_v, int64_t pos,
                   torch::Tensor x_in, torch::Tensor out, torch::Tensor counters, torch::Tensor stalled, int64_t step,
                   int64_t blocks, int64_t smem, int64_t ring_pages) {
  MK_CHECK(pos >= 0, "pos must be >= 0");
  MK_CHECK(step >= 1, "step must be >= 1 (the launch's number on these counters), got ", step);
  const mk::StackParams p = with_cache(stack, cache_k, cache_v, pos, "cache");
  expect(x_in, "x_in", torch::kFloat32, p.hidden);
  expect(out, "out", torch::kFloat32, p.hidden);
  expect(counters, "counters", torch::kInt32, static_cast<int64_t>(p.num_layers) * mk::kDataflowStages);
  expect(stalled, "stalled", torch::kInt32, 1);
  mk::DataflowParams f{};
  f.counters = ptr<unsigned>(counters);
  f.stalled = ptr<int>(stalled);
  f.step = static_cast<unsigned>(step & 0xFFFFFFFF);  // the counters wrap alike
  f.pages = mk::dataflow_ring_pages(p, static_cast<size_t>(smem));
  MK_CHECK(f.pages >= 2, "a KV cache of ", p.capacity, " positions leaves the dataflow step's weight ring ", f.pages,
           " pages of shared memory; it needs 2");
  // ring_pages (0: all that fit) sizes the ring: bench/dataflow_step.py --ring-pages. The pages left out are not
  // asked of the SM, whose shared memory and L1 are one array: a smaller ring leaves a larger L1.
  MK_CHECK(ring_pages == 0 || ring_pages >= 2, "ring_pages must be 0 (all that fit) or >= 2, got ", ring_pages);
  size_t launch_smem = static_cast<size_t>(smem);
  if (ring_pages > 0 && ring_pages < f.pages) {
    launch_smem -= static_cast<size_t>(f.pages - ring_pages) * mk::kPageBytes;
    f.pages = static_cast<int>(ring_pages);
  }
  const c10::cuda::CUDAGuard guard(x_in.device());
  MK_CHECK_CUDA(mk::launch_dataflow_step(p, f, static_cast<int>(pos), ptr<const float>(x_in), ptr<float>(out),
                                         static_cast<int>(blocks), launch_smem, at::cuda::getCurrentCUDAStream()));
}

// The frame loop's fixed parts: both stacks, the heads and embedding tables (int64 device pointer
// tables; predictor_vocab rows per head), small_to_mtp_projection (undefined tensors where the widths are equal), fp32
// scratch, all for `streams` streams a launch (1: run_frames; more: run_batch): the talker's stack with scratch for
// that many tokens, the predictor's for twice as many (its two prefill tokens a stream), the rest for as many.
mk::FrameParams make_frames(const mk::StackParams& talker, const mk::StackParams& predictor, torch::Tensor codec_head,
                            torch::Tensor predictor_heads, int64_t predictor_vocab, torch::Tensor embeddings,
                            c10::optional<torch::Tensor> proj_w,
                            c10::optional<torch::Tensor> proj_b, torch::Tensor logits, torch::Tensor talker_in,
                            torch::Tensor predictor_in, torch::Tensor predictor_src, int64_t streams) {
  mk::FrameParams p{};
  MK_CHECK(talker.num_layers + predictor.num_layers <= mk::kMaxLayers, "at most ", mk::kMaxLayers,
              " layers in the talker and the code predictor together");
  MK_CHECK(streams >= 1 && streams <= mk::kMaxStreams, "streams must be 1 to ", mk::kMaxStreams, ", got ", streams);
  MK_CHECK(talker.tokens == streams && predictor.tokens == 2 * streams, "the talker's stack needs scratch for ",
           streams, " tokens and the code predictor's for ", 2 * streams, " (two prefill tokens a stream)");
  p.talker = talker;
  p.predictor = predictor;
  MK_CHECK(codec_head.dim() == 2 && codec_head.size(1) == talker.hidden, "codec_head must be (vocab, talker hidden)");
  expect(codec_head, "codec_head", torch::kBFloat16, -1);
  expect(predictor_heads, "predictor_heads", torch::kInt64, -1);
  expect(embeddings, "embeddings", torch::kInt64, predictor_heads.numel() + 1);
  p.codec_head = ptr<const __nv_bfloat16>(codec_head);
  p.talker_vocab = static_cast<int>(codec_head.size(0));
  p.predictor_heads = ptr<const int64_t>(predictor_heads);
  p.predictor_vocab = static_cast<int>(predictor_vocab);
  p.embeddings = ptr<const int64_t>(embeddings);
  p.groups = static_cast<int>(embeddings.numel());
  const bool projected = proj_w.has_value() && proj_w->defined();
  MK_CHECK(projected || talker.hidden == predictor.hidden,
              "the predictor is narrower than the talker, so small_to_mtp_projection is needed");
  if (projected) {
    expect(*proj_w, "proj_w", torch::kBFloat16, static_cast<int64_t>(predictor.hidden) * talker.hidden);
    MK_CHECK(proj_b.has_value() && proj_b->defined(), "proj_b is needed with proj_w");
    expect(*proj_b, "proj_b", torch::kBFloat16, predictor.hidden);
    p.proj_w = ptr<const __nv_bfloat16>(*proj_w);
    p.proj_b = ptr<const __nv_bfloat16>(*proj_b);
  }
  expect(logits, "logits", torch::kFloat32, streams * std::max(p.talker_vocab, p.predictor_vocab));
  expect(talker_in, "talker_in", torch::kFloat32, streams * talker.hidden);
  expect(predictor_in, "predictor_in", torch::kFloat32, 2 * streams * predictor.hidden);
  expect(predictor_src, "predictor_src", torch::kFloat32, 2 * streams * talker.hidden);
  p.logits = ptr<float>(logits);
  p.talker_in = ptr<float>(talker_in);
  p.predictor_in = ptr<float>(predictor_in);
  p.predictor_src = ptr<float>(predictor_src);
  return p;
}

// Up to `frames` decode frames in one launch (FrameParams in params.h says what one frame is).
// advance_first: talker_in holds the previous frame's input and the talker steps on it first.
// Writes codes (frames, groups) and frames_done (frames emitted; fewer where codebook 0 was EOS).
void run_frames(mk::FrameParams p, torch::Tensor talker_k, torch::Tensor talker_v, torch::Tensor predictor_k,
                torch::Tensor predictor_v, int64_t talker_pos, bool advance_first, int64_t frame0, int64_t min_frames,
                int64_t eos_id, int64_t seed, double repetition_penalty, double temperature, int64_t top_k,
                double predictor_temperature, int64_t predictor_top_k, torch::Tensor suppress, torch::Tensor seen,
                torch::Tensor text_inputs, torch::Tensor hidden, torch::Tensor codes, torch::Tensor frames_done,
                int64_t blocks) {
  const int64_t frames = codes.size(0);
  MK_CHECK(frames >= 1 && codes.dim() == 2 && codes.size(1) == p.groups, "codes must be (frames >= 1, groups)");
  MK_CHECK(talker_pos >= 0, "talker_pos must be >= 0");
  const int64_t steps = frames - 1 + (advance_first ? 1 : 0);
  p.talker = with_cache(p.talker, talker_k, talker_v, talker_pos + steps - 1, "talker cache");
  p.predictor = with_cache(p.predictor, predictor_k, predictor_v, p.groups - 1, "predictor cache");
  expect(suppress, "suppress", torch::kUInt8, p.talker_vocab);
  expect(seen, "seen", torch::kUInt8, p.talker_vocab);
  expect(text_inputs, "text_inputs", torch::kFloat32, frames * p.talker.hidden);
  expect(hidden, "hidden", torch::kFloat32, p.talker.hidden);
  expect(codes, "codes", torch::kInt64, -1);
  expect(frames_done, "frames_done", torch::kInt32, 1);
  MK_CHECK(eos_id >= 0 && eos_id < p.talker_vocab, "eos_id outside the codec vocabulary");
  MK_CHECK(temperature >= 0 && predictor_temperature >= 0 && top_k >= 1 && predictor_top_k >= 1,
              "temperatures must be >= 0 and top_k >= 1");
  p.talker_pos = static_cast<int>(talker_pos);
  p.advance_first = advance_first;
  p.frames = static_cast<int>(frames);
  p.frame0 = static_cast<int>(frame0);
  p.min_frames = static_cast<int>(min_frames);
  p.eos_id = static_cast<int>(eos_id);
  p.seed = static_cast<uint32_t>(seed & 0xFFFFFFFF);
  p.repetition_penalty = static_cast<float>(repetition_penalty);
  p.talker_pick = {static_cast<float>(temperature), static_cast<int>(top_k)};
  p.predictor_pick = {static_cast<float>(predictor_temperature), static_cast<int>(predictor_top_k)};
  p.suppress = ptr<const uint8_t>(suppress);
  p.seen = ptr<uint8_t>(seen);
  p.text_inputs = ptr<const float>(text_inputs);
  p.hidden = ptr<float>(hidden);
  p.codes = ptr<int64_t>(codes);
  p.frames_done = ptr<int>(frames_done);
  const c10::cuda::CUDAGuard guard(hidden.device());
  MK_CHECK_CUDA(mk::launch_frames(p, static_cast<int>(blocks), at::cuda::getCurrentCUDAStream()));
}

// One stream of a batched launch (run_batch): its talker cache (room for its steps: frames - 1, one more where
// advance_first, from talker_pos), and its picks as run_frames takes them.
mk::StreamParams make_stream(torch::Tensor talker_k, torch::Tensor talker_v, int64_t talker_pos, bool advance_first,
                             int64_t frames, int64_t frame0, int64_t min_frames, int64_t seed,
                             double repetition_penalty, double temperature, int64_t top_k,
                             double predictor_temperature, int64_t predictor_top_k) {
  MK_CHECK(talker_pos >= 0, "talker_pos must be >= 0");
  MK_CHECK(frames >= 1, "a stream of a launch makes at least one frame, got ", frames);
  MK_CHECK(temperature >= 0 && predictor_temperature >= 0 && top_k >= 1 && predictor_top_k >= 1,
           "temperatures must be >= 0 and top_k >= 1");
  expect(talker_k, "talker cache", torch::kBFloat16, -1);
  expect(talker_v, "talker cache", torch::kBFloat16, -1);
  MK_CHECK(talker_k.dim() == 4 && talker_v.sizes() == talker_k.sizes(),
           "talker cache must be keys and values of one shape (layers, kv_heads, capacity, head_dim)");
  const int64_t last = talker_pos + frames - 2 + (advance_first ? 1 : 0);
  MK_CHECK(last < talker_k.size(2), "talker cache: position ", last, " outside its capacity ", talker_k.size(2));
  mk::StreamParams s{};
  s.cache_k = ptr<__nv_bfloat16>(talker_k);
  s.cache_v = ptr<__nv_bfloat16>(talker_v);
  s.capacity = static_cast<int>(talker_k.size(2));
  s.talker_pos = static_cast<int>(talker_pos);
  s.advance_first = advance_first;
  s.frames = static_cast<int>(frames);
  s.frame0 = static_cast<int>(frame0);
  s.min_frames = static_cast<int>(min_frames);
  s.seed = static_cast<uint32_t>(seed & 0xFFFFFFFF);
  s.repetition_penalty = static_cast<float>(repetition_penalty);
  s.talker_pick = {static_cast<float>(temperature), static_cast<int>(top_k)};
  s.predictor_pick = {static_cast<float>(predictor_temperature), static_cast<int>(predictor_top_k)};
  return s;
}

// Up to `frames` decode frames of each stream in one launch of the S-stream kernel (batch.cuh; S from make_frames's
// streams, 2, 4 or 8), each stream as run_frames would make them alone. Stream s's rows, at index s of: predictor_k/v
// (S, predictor layers, kv_heads, groups, head_dim), seen uint8 (S, talker vocab), text_inputs (S, frames, talker
// hidden), hidden and talker_in (S, talker hidden), codes int64 (S, frames, groups), frames_done int32 (S).
void run_batch(mk::FrameParams p, std::vector<mk::StreamParams> streams, torch::Tensor predictor_k,
               torch::Tensor predictor_v, int64_t eos_id, torch::Tensor suppress, torch::Tensor seen,
               torch::Tensor text_inputs, torch::Tensor hidden, torch::Tensor talker_in, torch::Tensor codes,
               torch::Tensor frames_done, int64_t blocks) {
  const int64_t S = p.talker.tokens, n = static_cast<int64_t>(streams.size());
  MK_CHECK(S == 2 || S == 4 || S == 8, "run_batch takes frame params made for 2, 4 or 8 streams, these are for ", S);
  MK_CHECK(n >= 1 && n <= S, "a launch of these frame params takes 1 to ", S, " streams, got ", n);
  MK_CHECK(codes.dim() == 3 && codes.size(0) == S && codes.size(2) == p.groups,
           "codes must be (streams, frames, groups)");
  const int64_t frames = codes.size(1), H = p.talker.hidden;
  mk::BatchParams b{};
  b.frame = p;
  b.frame.talker.capacity = 0;
  for (int64_t s = 0; s < n; ++s) {
    MK_CHECK(streams[s].frames <= frames, "stream ", s, " makes ", streams[s].frames, " frames, the launch ", frames);
    b.stream[s] = streams[s];
    b.frame.talker.capacity = std::max(b.frame.talker.capacity, streams[s].capacity);  // for attention's room
  }
  const int64_t per_stream = static_cast<int64_t>(p.predictor.num_layers) * p.predictor.num_kv_heads * p.groups *
                             p.predictor.head_dim;
  expect(predictor_k, "predictor_k", torch::kBFloat16, S * per_stream);
  expect(predictor_v, "predictor_v", torch::kBFloat16, S * per_stream);
  expect(suppress, "suppress", torch::kUInt8, p.talker_vocab);
  expect(seen, "seen", torch::kUInt8, S * p.talker_vocab);
  expect(text_inputs, "text_inputs", torch::kFloat32, S * frames * H);
  expect(hidden, "hidden", torch::kFloat32, S * H);
  expect(talker_in, "talker_in", torch::kFloat32, S * H);
  expect(codes, "codes", torch::kInt64, -1);
  expect(frames_done, "frames_done", torch::kInt32, S);
  MK_CHECK(eos_id >= 0 && eos_id < p.talker_vocab, "eos_id outside the codec vocabulary");
  b.frame.predictor.capacity = p.groups;
  b.frame.eos_id = static_cast<int>(eos_id);
  b.frame.suppress = ptr<const uint8_t>(suppress);
  b.streams = static_cast<int>(n);
  b.frames = static_cast<int>(frames);
  b.predictor_k = ptr<__nv_bfloat16>(predictor_k);
  b.predictor_v = ptr<__nv_bfloat16>(predictor_v);
  b.seen = ptr<uint8_t>(seen);
  b.text_inputs = ptr<const float>(text_inputs);
  b.hidden = ptr<float>(hidden);
  b.talker_in = ptr<float>(talker_in);
  b.codes = ptr<int64_t>(codes);
  b.frames_done = ptr<int>(frames_done);
  const c10::cuda::CUDAGuard guard(hidden.device());
  MK_CHECK_CUDA(mk::launch_batch(b, static_cast<int>(S), static_cast<int>(blocks), at::cuda::getCurrentCUDAStream()));
}

// model.py Attention's steps between the projections and the attention for T tokens at cache positions start..:
// q, k (T, heads * D), (T, kv_heads * D) RMSNorm'd per head (where q_norm and k_norm are given) and rotated by cos,
// sin (T, D); K and V written into layer `layer` of cache_k, cache_v (layers, kv_heads, capacity, D). Returns q
// normed and rotated, (heads, T, D).
torch::Tensor attention_prologue(torch::Tensor q, torch::Tensor k, torch::Tensor v,
                                 c10::optional<torch::Tensor> q_norm, c10::optional<torch::Tensor> k_norm,
                                 torch::Tensor cos, torch::Tensor sin, torch::Tensor cache_k, torch::Tensor cache_v,
                                 int64_t layer, int64_t start, double eps) {
  MK_CHECK(cache_k.dim() == 4 && cache_k.sizes() == cache_v.sizes(),
              "cache_k and cache_v must be (layers, kv_heads, capacity, head_dim)");
  expect(cache_k, "cache_k", torch::kBFloat16, -1);
  expect(cache_v, "cache_v", torch::kBFloat16, -1);
  const int64_t D = cache_k.size(3), kv_heads = cache_k.size(1), T = q.size(0);
  auto rows = [&](const torch::Tensor& t, const char* name, int64_t width) {
    MK_CHECK(t.is_cuda() && t.scalar_type() == torch::kBFloat16, name, " must be bfloat16 on a CUDA device");
    MK_CHECK(t.dim() == 2 && t.size(0) == T && t.stride(1) == 1 && t.size(1) == width, name, " must be (",
                T, ", ", width, ") with unit stride along a row, got ", t.sizes(), " strides ", t.strides());
  };
  MK_CHECK(T >= 1 && q.dim() == 2 && q.size(1) % (kv_heads * D) == 0, "q must be (tokens, heads * head_dim)");
  rows(q, "q", q.size(1));
  rows(k, "k", kv_heads * D);
  rows(v, "v", kv_heads * D);
  for (const torch::Tensor* t : {&k, &v, &cos, &sin, &cache_k, &cache_v})
    MK_CHECK(t->device() == q.device(), "every tensor must be on q's device, ", q.device());
  const bool normed = q_norm.has_value() && q_norm->defined();
  MK_CHECK(normed == (k_norm.has_value() && k_norm->defined()), "q_norm and k_norm go together");
  if (normed) {
    expect(*q_norm, "q_norm", torch::kBFloat16, D);
    expect(*k_norm, "k_norm", torch::kBFloat16, D);
    MK_CHECK(q_norm->device() == q.device() && k_norm->device() == q.device(), "the norms must be on q's device, ",
             q.device());
  }
  expect(cos, "cos", torch::kBFloat16, T * D);
  expect(sin, "sin", torch::kBFloat16, T * D);
  MK_CHECK(D % 2 == 0 && D <= 2048, "head_dim must be even and at most 2048, got ", D);
  MK_CHECK(layer >= 0 && layer < cache_k.size(0), "layer ", layer, " outside the cache's ", cache_k.size(0));
  MK_CHECK(start >= 0 && start + T <= cache_k.size(2), "positions ", start, "..", start + T - 1,
              " outside the cache's capacity of ", cache_k.size(2));
  const int64_t heads = q.size(1) / D;
  auto q_out = torch::empty({heads, T, D}, q.options());
  mk::AttentionPrologue a{};
  a.q = ptr<const __nv_bfloat16>(q); a.k = ptr<const __nv_bfloat16>(k); a.v = ptr<const __nv_bfloat16>(v);
  a.q_stride = q.stride(0); a.k_stride = k.stride(0); a.v_stride = v.stride(0);
  a.q_norm = normed ? ptr<const __nv_bfloat16>(*q_norm) : nullptr;
  a.k_norm = normed ? ptr<const __nv_bfloat16>(*k_norm) : nullptr;
  a.cos = ptr<const __nv_bfloat16>(cos); a.sin = ptr<const __nv_bfloat16>(sin);
  a.q_out = ptr<__nv_bfloat16>(q_out);
  a.cache_k = ptr<__nv_bfloat16>(cache_k); a.cache_v = ptr<__nv_bfloat16>(cache_v);
  a.tokens = static_cast<int>(T); a.heads = static_cast<int>(heads); a.kv_heads = static_cast<int>(kv_heads);
  a.head_dim = static_cast<int>(D); a.capacity = static_cast<int>(cache_k.size(2));
  a.layer = static_cast<int>(layer); a.start = static_cast<int>(start); a.eps = static_cast<float>(eps);
  const c10::cuda::CUDAGuard guard(q.device());
  MK_CHECK_CUDA(mk::launch_attention_prologue(a, at::cuda::getCurrentCUDAStream()));
  return q_out;
}

// The codec's SnakeBeta, x + sin^2(x * frequency) * inverse_beta per channel, on x (batch, channels, length) bf16 of
// any strides; frequency and inverse_beta hold a value a channel. Returns a new contiguous tensor.
torch::Tensor snake(torch::Tensor x, torch::Tensor frequency, torch::Tensor inverse_beta) {
  MK_CHECK(x.is_cuda() && x.scalar_type() == torch::kBFloat16, "x must be bfloat16 on a CUDA device");
  MK_CHECK(x.dim() == 3, "x must be (batch, channels, length), got ", x.sizes());
  const int64_t channels = x.size(1);
  MK_CHECK(x.numel() < (int64_t{1} << 31), "x has ", x.numel(), " elements, more than a launch indexes");
  for (const auto& [t, name] : {std::pair{&frequency, "frequency"}, std::pair{&inverse_beta, "inverse_beta"}}) {
    MK_CHECK(t->device() == x.device() && t->scalar_type() == torch::kBFloat16 && t->is_contiguous() &&
                t->numel() == channels, name, " must be ", channels, " contiguous bfloat16 values on x's device");
  }
  auto out = torch::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  mk::Snake s{};
  s.x = ptr<const __nv_bfloat16>(x);
  s.batch_stride = x.stride(0);
  s.row_stride = x.stride(1);
  s.step = x.stride(2);
  s.frequency = ptr<const __nv_bfloat16>(frequency);
  s.inverse_beta = ptr<const __nv_bfloat16>(inverse_beta);
  s.out = ptr<__nv_bfloat16>(out);
  s.rows = static_cast<int>(x.size(0) * channels);
  s.channels = static_cast<int>(channels);
  s.length = static_cast<int>(x.size(2));
  const c10::cuda::CUDAGuard guard(x.device());
  MK_CHECK_CUDA(mk::launch_snake(s, at::cuda::getCurrentCUDAStream()));
  return out;
}

// An RMSNorm launch over x's last dimension, x bf16 contiguous, into out (x's shape); a delta is the caller's to set.
mk::RmsNorm make_rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps, const torch::Tensor& out) {
  expect(x, "x", torch::kBFloat16, -1);
  MK_CHECK(x.dim() >= 1 && x.size(-1) >= 1, "x must have a last dimension to normalize, got ", x.sizes());
  const int64_t width = x.size(-1), rows = x.numel() / width;
  expect(weight, "weight", torch::kBFloat16, width);
  MK_CHECK(weight.device() == x.device(), "weight must be on x's device, ", x.device());
  MK_CHECK(rows < (int64_t{1} << 31), "x has ", rows, " rows, more than a launch indexes");
  mk::RmsNorm n{};
  n.x = ptr<const __nv_bfloat16>(x);
  n.weight = ptr<const __nv_bfloat16>(weight);
  n.out = ptr<__nv_bfloat16>(out);
  n.rows = static_cast<int>(rows);
  n.width = static_cast<int>(width);
  n.eps = static_cast<float>(eps);
  return n;
}

// model.py's RMSNorm, weight * F.rms_norm(x) over x's last dimension, on x bf16 contiguous. Returns a new tensor.
torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps) {
  auto out = torch::empty_like(x);
  const mk::RmsNorm n = make_rms_norm(x, weight, eps, out);
  const c10::cuda::CUDAGuard guard(x.device());
  MK_CHECK_CUDA(mk::launch_rms_norm(n, at::cuda::getCurrentCUDAStream()));
  return out;
}

// model.py's RMSNorm.add: (x + delta, its RMSNorm), delta first times scale (per channel) where given, as the eager
// ops round; all bf16 contiguous, delta of x's shape. Returns two new tensors.
std::vector<torch::Tensor> add_rms_norm(torch::Tensor x, torch::Tensor delta, c10::optional<torch::Tensor> scale,
                                        torch::Tensor weight, double eps) {
  auto out = torch::empty_like(x), sum = torch::empty_like(x);
  mk::RmsNorm n = make_rms_norm(x, weight, eps, out);
  expect(delta, "delta", torch::kBFloat16, x.numel());
  MK_CHECK(delta.sizes() == x.sizes(), "delta ", delta.sizes(), " must have x's shape ", x.sizes());
  MK_CHECK(delta.device() == x.device(), "delta must be on x's device, ", x.device());
  if (scale) {
    expect(*scale, "scale", torch::kBFloat16, n.width);
    MK_CHECK(scale->device() == x.device(), "scale must be on x's device, ", x.device());
    n.scale = ptr<const __nv_bfloat16>(*scale);
  }
  n.delta = ptr<const __nv_bfloat16>(delta);
  n.sum = ptr<__nv_bfloat16>(sum);
  const c10::cuda::CUDAGuard guard(x.device());
  MK_CHECK_CUDA(mk::launch_rms_norm(n, at::cuda::getCurrentCUDAStream()));
  return {sum, out};
}

// silu(gate) * up on gate, up bf16 (rows, width), each with unit stride along a row (the two halves of one GEMM's
// output, say). Returns a new contiguous (rows, width) tensor.
torch::Tensor swiglu(torch::Tensor gate, torch::Tensor up) {
  for (const auto& [t, name] : {std::pair{&gate, "gate"}, std::pair{&up, "up"}}) {
    MK_CHECK(t->is_cuda() && t->scalar_type() == torch::kBFloat16, name, " must be bfloat16 on a CUDA device");
    MK_CHECK(t->dim() == 2 && t->stride(1) == 1, name, " must be (rows, width) with unit stride along a row, got ",
             t->sizes(), " strides ", t->strides());
  }
  MK_CHECK(gate.sizes() == up.sizes() && gate.device() == up.device(), "gate ", gate.sizes(), " and up ",
           up.sizes(), " must match, on one device");
  MK_CHECK(gate.numel() < (int64_t{1} << 31), "gate has ", gate.numel(), " elements, more than a launch indexes");
  auto out = torch::empty(gate.sizes(), gate.options().memory_format(at::MemoryFormat::Contiguous));
  mk::Swiglu s{};
  s.gate = ptr<const __nv_bfloat16>(gate);
  s.up = ptr<const __nv_bfloat16>(up);
  s.gate_stride = gate.stride(0);
  s.up_stride = up.stride(0);
  s.out = ptr<__nv_bfloat16>(out);
  s.rows = static_cast<int>(gate.size(0));
  s.width = static_cast<int>(gate.size(1));
  const c10::cuda::CUDAGuard guard(gate.device());
  MK_CHECK_CUDA(mk::launch_swiglu(s, at::cuda::getCurrentCUDAStream()));
  return out;
}

// How many blocks a launch uses (all co-resident), or an error naming the limit.
template <typename Coresident>
int64_t plan(Coresident coresident, size_t smem, const char* what) {
  int blocks = 0;
  MK_CHECK_CUDA(coresident(smem, &blocks));
  MK_CHECK(blocks > 0, "the ", what, " kernel does not fit on an SM with ", smem, " bytes of shared memory");
  return blocks;
}

int64_t plan_step_blocks(mk::StackParams p, int64_t capacity) {
  p.capacity = static_cast<int>(capacity);
  return plan(mk::step_coresident_blocks, mk::step_shared_bytes(p, 1), "decoder-step");
}

// (blocks, shared-memory bytes) of a dataflow launch with a KV cache of up to `capacity` positions.
std::vector<int64_t> plan_dataflow(mk::StackParams p, int64_t capacity) {
  const int widest = std::max({p.hidden, p.intermediate, p.num_heads * p.head_dim});
  MK_CHECK(2 * widest <= mk::kPageBytes, "the dataflow step's pages hold rows of at most ", mk::kPageBytes / 2,
           " weights, this stack has rows of ", widest);
  size_t smem = 0;
  MK_CHECK_CUDA(mk::dataflow_shared_bytes(&smem));
  p.capacity = static_cast<int>(capacity);
  const int pages = mk::dataflow_ring_pages(p, smem);
  MK_CHECK(pages >= 2, "a KV cache of ", capacity, " positions leaves the dataflow step's weight ring ", pages,
           " pages of shared memory; it needs 2");
  return {plan(mk::dataflow_coresident_blocks, smem, "dataflow-step"), static_cast<int64_t>(smem)};
}

int64_t plan_frame_blocks(mk::FrameParams p, int64_t capacity) {
  p.talker.capacity = static_cast<int>(capacity);
  p.predictor.capacity = p.groups;
  if (p.talker.tokens == 1) return plan(mk::frame_coresident_blocks, mk::frame_shared_bytes(p), "frame");
  mk::BatchParams b{};
  b.frame = p;
  const int S = p.talker.tokens;
  const size_t smem = mk::batch_shared_bytes(b, S);
  return plan([S](size_t bytes, int* blocks) { return mk::batch_coresident_blocks(S, bytes, blocks); }, smem,
              "batched frame");
}

// Record the grid barriers (and dataflow waits) of the launches that follow into trace (int64 (n, 3): tag, arrive ns,
// leave ns; see common.cuh), or stop (None); returns how many the previous buffer got.
int64_t set_trace(c10::optional<torch::Tensor> trace) {
  int count = 0;
  MK_CHECK_CUDA(mk::trace_count(&count));
  if (trace.has_value() && trace->defined()) {
    expect(*trace, "trace", torch::kInt64, -1);
    MK_CHECK(trace->dim() == 2 && trace->size(1) == 3, "trace must be int64 (n, 3)");
    MK_CHECK_CUDA(mk::set_trace(ptr<unsigned long long>(*trace), static_cast<int>(trace->size(0))));
  } else {
    MK_CHECK_CUDA(mk::set_trace(nullptr, 0));
  }
  return count;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  pybind11::class_<mk::StackParams>(m, "Stack");
  pybind11::class_<mk::FrameParams>(m, "Frames");
  pybind11::class_<mk::StreamParams>(m, "Stream");
  m.def("stack", &make_stack, "a decoder stack's weights and scratch");
  m.def("frames", &make_frames, "the frame loop's weights and scratch");
  m.def("decoder_step", &decoder_step, "one decode step of a Qwen3 decoder stack in one persistent launch");
  m.def("run_frames", &run_frames, "whole decode frames (talker, codec head, sampling, code predictor) in one launch");
  m.def("plan_step_blocks", &plan_step_blocks, "co-resident blocks for a decoder-step launch");
  m.def("dataflow_step", &dataflow_step,
        "one decode step of a Qwen3 decoder stack in one persistent launch without grid barriers");
  m.def("plan_dataflow", &plan_dataflow, "co-resident blocks and shared memory for a dataflow-step launch");
  m.def("set_trace", &set_trace,
        "record the following launches' grid barriers and dataflow waits (bench/megakernel_trace.py, "
        "bench/dataflow_step.py)");
  m.def("plan_frame_blocks", &plan_frame_blocks, "co-resident blocks for a frame launch (of one or several streams)");
  m.def("stream", &make_stream, "one stream of a batched frame launch: its talker cache, position and picks");
  m.def("run_batch", &run_batch, "whole decode frames of several streams in one launch, each as alone");
  m.def("attention_prologue", &attention_prologue,
        "a prefill layer's q/k RMSNorm (where given) + RoPE and K/V cache write for its tokens, in one launch");
  m.def("snake", &snake, "the speech codec's SnakeBeta activation in one launch");
  m.def("rms_norm", &rms_norm, "model.py's RMSNorm (weight * F.rms_norm) in one launch");
  m.def("add_rms_norm", &add_rms_norm, "model.py's RMSNorm.add (the residual add, then the norm) in one launch");
  m.def("swiglu", &swiglu, "SwiGLU's silu(gate) * up in one launch");
}
