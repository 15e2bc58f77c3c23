// The persistent kernels and their host-side launches; no torch headers (CI compiles this file with nvcc).
// Stages are in decoder_step.cuh, dataflow.cuh and frame.cuh; csrc/binding.cpp is the torch glue.
#include <cuda_runtime.h>

#include <algorithm>

#include "batch.cuh"
#include "dataflow.cuh"

namespace mk {

// The kernels read their parameters and layer tables from shared-memory copies: a layer's weight and
// norm pointers are then one shared load away, not a global round trip at the head of every stage.
__device__ __forceinline__ void copy_layers(LayerWeights* dst, const LayerWeights* src, int n) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}

// One token through one stack; block 0 writes the final-normed state to `out`.
__global__ void __launch_bounds__(kThreads, 1)
    decoder_step_kernel(StackParams params, int pos, const float* x_in, float* out) {
  extern __shared__ float smem[];
  __shared__ float scratch[kWarps];
  __shared__ StackParams p;
  __shared__ LayerWeights layers[kMaxLayers];
  trace_launch();
  copy_layers(layers, params.layers, params.num_layers);
  if (threadIdx.x == 0) {
    p = params;
    p.layers = layers;
  }
  __syncthreads();
  stack_step(p, pos, x_in, smem, scratch, kTalker);
  if (blockIdx.x == 0) {
    final_norm_shared(p, p.x, smem, scratch);
    for (int i = threadIdx.x; i < p.hidden; i += blockDim.x) out[i] = smem[i];
  }
}

// The same step without grid barriers (dataflow.cuh): the dynamic shared memory is the weight ring, then the work area.
__global__ void __launch_bounds__(kThreads, 1)
    dataflow_step_kernel(StackParams params, DataflowParams f, int pos, const float* x_in, float* out) {
  extern __shared__ float smem[];
  __shared__ float scratch[kWarps];
  __shared__ StackParams p;
  __shared__ LayerWeights layers[kMaxLayers];
  __shared__ Slice slices[kMatvecs];
  trace_launch();
  copy_layers(layers, params.layers, params.num_layers);
  if (threadIdx.x == 0) {
    p = params;
    p.layers = layers;
  }
  __syncthreads();
  dataflow_step(p, f, pos, x_in, out, reinterpret_cast<__nv_bfloat16*>(smem), smem + f.pages * (kPageBytes / 4),
                scratch, slices);
}

__global__ void __launch_bounds__(kThreads, 1) frames_kernel(FrameParams params) {
  extern __shared__ float smem[];
  __shared__ float scratch[kMaxTokens * kWarps];  // load_normed's sums of a step's tokens
  __shared__ PickScratch pick_scratch;
  __shared__ FrameParams p;
  __shared__ LayerWeights layers[kMaxLayers];
  trace_launch();
  const int talker_layers = params.talker.num_layers;
  copy_layers(layers, params.talker.layers, talker_layers);
  copy_layers(layers + talker_layers, params.predictor.layers, params.predictor.num_layers);
  if (threadIdx.x == 0) {
    p = params;
    p.talker.layers = layers;
    p.predictor.layers = layers + talker_layers;
  }
  __syncthreads();
  frames_body(p, smem, scratch, pick_scratch);
}

// S streams' frames (batch.cuh): as frames_kernel, with the streams' state in shared memory too.
template <int S>
__global__ void __launch_bounds__(kThreads, 1) batch_kernel(BatchParams params) {
  extern __shared__ float smem[];
  __shared__ float scratch[kMaxTokens * kWarps];  // load_normed's sums of a step's tokens
  __shared__ PickScratch pick_scratch;
  __shared__ BatchParams b;
  __shared__ StreamsState state;
  __shared__ LayerWeights layers[kMaxLayers];
  trace_launch();
  const int talker_layers = params.frame.talker.num_layers;
  copy_layers(layers, params.frame.talker.layers, talker_layers);
  copy_layers(layers + talker_layers, params.frame.predictor.layers, params.frame.predictor.num_layers);
  if (threadIdx.x == 0) {
    b = params;
    b.frame.talker.layers = layers;
    b.frame.predictor.layers = layers + talker_layers;
  }
  __syncthreads();
  batch_body<S>(b, state, smem, scratch, pick_scratch);
}

static size_t max_size(size_t a, size_t b) { return a > b ? a : b; }

// The largest activation vector for `tokens` tokens, or attention's q|k|v + scores over the cache + per-warp partial
// sums (a first pass's attention needs less: q|k|v of its tokens).
size_t step_shared_bytes(const StackParams& p, int tokens) {
  size_t floats = max_size(max_size(p.hidden, p.intermediate), static_cast<size_t>(p.num_heads) * p.head_dim);
  return 4 * max_size(tokens * floats, (3 + kWarps) * static_cast<size_t>(p.head_dim) + p.capacity + 3);
}

// Either stack's step (the predictor's first of two tokens), the talker-wide sources of a predictor input, or a
// head's logits.
size_t frame_shared_bytes(const FrameParams& p) {
  size_t bytes = max_size(step_shared_bytes(p.talker, 1), step_shared_bytes(p.predictor, 2));
  bytes = max_size(bytes, 4 * 2 * static_cast<size_t>(p.talker.hidden));
  return max_size(bytes, 4 * static_cast<size_t>(max_size(p.talker_vocab, p.predictor_vocab)));
}

// As frame_shared_bytes, for S streams: S tokens of the talker, 2 S of the predictor, S heads' inputs.
size_t batch_shared_bytes(const BatchParams& b, int S) {
  const FrameParams& p = b.frame;
  size_t bytes = max_size(step_shared_bytes(p.talker, S), step_shared_bytes(p.predictor, 2 * S));
  bytes = max_size(bytes, 4 * 2 * static_cast<size_t>(S) * p.talker.hidden);
  return max_size(bytes, 4 * static_cast<size_t>(max_size(p.talker_vocab, p.predictor_vocab)));
}

static const void* batch_kernel_for(int S) {
  switch (S) {
    case 2: return reinterpret_cast<const void*>(batch_kernel<2>);
    case 4: return reinterpret_cast<const void*>(batch_kernel<4>);
    case 8: return reinterpret_cast<const void*>(batch_kernel<8>);
    default: return nullptr;
  }
}

// One block per SM, and only where every block fits co-resident (a cooperative launch needs all of them
// resident): every SM streams weights, none waits on another.
static cudaError_t coresident_blocks(const void* kernel, size_t smem, int* blocks) {
  int device = 0, sms = 0, per_sm = 0, optin = 0;
  cudaFuncAttributes attributes{};
  *blocks = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&attributes, kernel);
  // more than a block may have (8 streams' scratch on an sm_80 part): none fits, and no failed call leaves its error
  // for the next launch to find
  if (e != cudaSuccess || smem + attributes.sharedSizeBytes > static_cast<size_t>(optin)) return e;
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem);
  *blocks = per_sm < 1 ? 0 : sms;
  return e;
}

cudaError_t step_coresident_blocks(size_t smem, int* blocks) {
  return coresident_blocks(reinterpret_cast<const void*>(decoder_step_kernel), smem, blocks);
}

cudaError_t frame_coresident_blocks(size_t smem, int* blocks) {
  return coresident_blocks(reinterpret_cast<const void*>(frames_kernel), smem, blocks);
}

cudaError_t batch_coresident_blocks(int S, size_t smem, int* blocks) {
  const void* kernel = batch_kernel_for(S);
  if (kernel == nullptr) return cudaErrorInvalidValue;
  return coresident_blocks(kernel, smem, blocks);
}

cudaError_t dataflow_coresident_blocks(size_t smem, int* blocks) {
  return coresident_blocks(reinterpret_cast<const void*>(dataflow_step_kernel), smem, blocks);
}

// All the dynamic shared memory an SM gives one block of this kernel.
cudaError_t dataflow_shared_bytes(size_t* bytes) {
  int device = 0, optin = 0;
  cudaFuncAttributes attributes{};
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&attributes, reinterpret_cast<const void*>(dataflow_step_kernel));
  *bytes = static_cast<size_t>(optin) - attributes.sharedSizeBytes;
  return e;
}

// Pages left for the ring in `smem` bytes beside the work area (attention over p.capacity positions; 16-byte aligned).
int dataflow_ring_pages(const StackParams& p, size_t smem) {
  const size_t work = (step_shared_bytes(p, 1) + 15) / 16 * 16;
  return smem < work ? 0 : static_cast<int>(std::min<size_t>(kMaxPages, (smem - work) / kPageBytes));
}

cudaError_t launch_dataflow_step(const StackParams& p, const DataflowParams& f, int pos, const float* x_in, float* out,
                                 int blocks, size_t smem, cudaStream_t stream) {
  void* args[] = {const_cast<StackParams*>(&p), const_cast<DataflowParams*>(&f), &pos, const_cast<float**>(&x_in),
                  &out};
  return cudaLaunchCooperativeKernel(reinterpret_cast<void*>(dataflow_step_kernel), dim3(blocks), dim3(kThreads), args,
                                     smem, stream);
}

cudaError_t launch_decoder_step(const StackParams& p, int pos, const float* x_in, float* out, int blocks,
                                cudaStream_t stream) {
  void* args[] = {const_cast<StackParams*>(&p), &pos, const_cast<float**>(&x_in), &out};
  return cudaLaunchCooperativeKernel(reinterpret_cast<void*>(decoder_step_kernel), dim3(blocks), dim3(kThreads), args,
                                     step_shared_bytes(p, 1), stream);
}

cudaError_t launch_frames(const FrameParams& p, int blocks, cudaStream_t stream) {
  void* args[] = {const_cast<FrameParams*>(&p)};
  return cudaLaunchCooperativeKernel(reinterpret_cast<void*>(frames_kernel), dim3(blocks), dim3(kThreads), args,
                                     frame_shared_bytes(p), stream);
}

cudaError_t launch_batch(const BatchParams& p, int S, int blocks, cudaStream_t stream) {
  const void* kernel = batch_kernel_for(S);
  if (kernel == nullptr || p.streams < 1 || p.streams > S) return cudaErrorInvalidValue;
  void* args[] = {const_cast<BatchParams*>(&p)};
  return cudaLaunchCooperativeKernel(kernel, dim3(blocks), dim3(kThreads), args, batch_shared_bytes(p, S), stream);
}

cudaError_t set_trace(unsigned long long* slots, int capacity) {
  const Trace t{slots, capacity, 0};
  return cudaMemcpyToSymbol(g_trace, &t, sizeof t);
}

cudaError_t trace_count(int* count) {
  Trace t;
  const cudaError_t e = cudaMemcpyFromSymbol(&t, g_trace, sizeof t);
  *count = t.count;
  return e;
}

}  // namespace mk
