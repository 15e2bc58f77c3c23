// Shared device helpers: 16-byte bf16 loads, warp/block reductions, the grid-wide matvec, the traced barrier.
// reference: engine/tts/model.py (the ops these build are checked against it, see tests/tts/test_megakernel.py)
#pragma once

#include <cuda_bf16.h>
#include <cooperative_groups.h>
#include <cstdint>

#include "params.h"

namespace mk {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;            // threads per block
constexpr int kWarps = kThreads / 32;    // warps per block
constexpr int kVec = 8;                  // bf16 per 16-byte load

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide reduction of T values a thread at once, with one pair of barriers rather than T: every thread gets v[t]
// reduced over the block, in the same order whatever T. `scratch` holds T * kWarps floats of shared memory and
// `identity` fills the lanes past the last warp.
template <float (*warp_op)(float), int T>
__device__ __forceinline__ void block_reduce(float (&v)[T], float* scratch, float identity) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int t = 0; t < T; ++t) v[t] = warp_op(v[t]);
  __syncthreads();
  if (lane == 0)
#pragma unroll
    for (int t = 0; t < T; ++t) scratch[t * kWarps + warp] = v[t];
  __syncthreads();
#pragma unroll
  for (int t = 0; t < T; ++t) v[t] = warp_op(lane < kWarps ? scratch[t * kWarps + lane] : identity);
}

template <int T>
__device__ __forceinline__ void block_sums(float (&v)[T], float* scratch) {
  block_reduce<warp_sum, T>(v, scratch, 0.f);
}
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  float one[1] = {v};
  block_reduce<warp_sum, 1>(one, scratch, 0.f);
  return one[0];
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  float one[1] = {v};
  block_reduce<warp_max, 1>(one, scratch, -INFINITY);
  return one[0];
}

// 8 bf16 (one 16-byte load) as fp32.
__device__ __forceinline__ void unpack8(const uint4& raw, float (&out)[kVec]) {
  const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < kVec / 2; ++i) {
    const float2 f = __bfloat1622float2(p[i]);
    out[2 * i] = f.x, out[2 * i + 1] = f.y;
  }
}

// 8 bf16 weights (one 16-byte load) dotted with 8 fp32 activations from shared memory, in order.
__device__ __forceinline__ float dot8(const uint4& raw, const float* x) {
  float w[kVec];
  unpack8(raw, w);
  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < kVec; ++i) acc = fmaf(w[i], x[i], acc);
  return acc;
}

// 8 fp32 inputs at a 32-byte aligned address in shared memory, as two 16-byte loads: scalar loads of a lane's 8
// (lanes 32 bytes apart) would hit the same 4 banks from 8 lanes each.
struct X8 {
  float4 lo, hi;
};
__device__ __forceinline__ X8 load_x8(const float* x) {
  return {*reinterpret_cast<const float4*>(x), *reinterpret_cast<const float4*>(x + 4)};
}
__device__ __forceinline__ float dot8(const uint4& raw, const X8& x) {
  const float in[8] = {x.lo.x, x.lo.y, x.lo.z, x.lo.w, x.hi.x, x.hi.y, x.hi.z, x.hi.w};
  return dot8(raw, in);
}

// Weights are read once per step: a read-only, L1-bypassing 16-byte load.
__device__ __forceinline__ uint4 load_weights(const __nv_bfloat16* w) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(w));
  return r;
}

// --- barrier trace -----------------------------------------------------------------------------------
// Off unless set_trace (megakernel.cu) points it at a buffer; then block 0 records, for each grid
// barrier (and each of the dataflow step's waits), its tag and the %globaltimer (ns) when the block
// arrives and when it leaves (bench/megakernel_trace.py and bench/dataflow_step.py read it).
enum Tag : int {  // stack stages A..E are base + 0..4
  kTalker = 0, kPredictor = 8, kCodecHead = 16, kCodecPick, kPredictorHead, kPredictorPick, kFrameEnd,
  kProjection, kLaunch,  // kLaunch: a launch's start (arrive = leave)
  kProbe = 32                        // + a Probe point (below)
};

struct Trace {
  unsigned long long* slots;  // (capacity, 3): tag, arrive, leave
  int capacity, count;
};
__device__ Trace g_trace;

__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ void trace_stamp(int tag, unsigned long long arrive) {
  if (g_trace.count < g_trace.capacity) {
    unsigned long long* s = g_trace.slots + 3 * g_trace.count++;
    s[0] = tag, s[1] = arrive, s[2] = now_ns();
  }
}

// At a kernel's start: the trace's mark that a launch begins.
__device__ __forceinline__ void trace_launch() {
  if (blockIdx.x == 0 && threadIdx.x == 0 && g_trace.slots != nullptr) trace_stamp(kLaunch, now_ns());
}

// Points inside a stage, stamped by block 0's thread 0 (arrive = leave, tag kProbe + point) only where the
// sources are built with MK_PROBES defined (`bench/megakernel_trace.py --probes` builds such a copy): where a
// stage's time goes before its barrier, seen from warp 0. `after` is a value the point waits for (a sum of the
// loaded weights, say): the stamp is not taken before it is computed.
enum Probe : int {
  kIssued, kInputReady, kFirstBatchUsed, kRowsDone,                  // grid_matvec
  kHeadLoaded, kHeadPrepared, kHeadScored, kHeadSoftmax, kHeadDone  // attention_head (block 0: head 0)
};
__device__ __forceinline__ void probe(int point, float after = 0.f) {
#ifdef MK_PROBES
  asm volatile("" ::"f"(after));
  if (blockIdx.x == 0 && threadIdx.x == 0 && g_trace.slots != nullptr) trace_stamp(kProbe + point, now_ns());
#endif
}

// grid.sync(), traced when a buffer is set.
__device__ __forceinline__ void barrier(cg::grid_group& grid, int tag) {
  const bool traced = blockIdx.x == 0 && g_trace.slots != nullptr;  // uniform in the block
  unsigned long long arrive = 0;
  if (traced) {
    __syncthreads();
    arrive = now_ns();
  }
  grid.sync();
  if (traced && threadIdx.x == 0) trace_stamp(tag, arrive);
}

// --- the grid-wide matvec ---------------------------------------------------------------------------
// out(r, dot(row(r)[:K], x)) for r in [0, rows), R rows per warp at a time over all the grid's warps;
// row(r) gives the weight row's address, out is called by lane 0 in row order. prepare() fills x, the
// block's input vector in shared memory (a whole-block step ending with __syncthreads), after each warp has
// issued its first batch of loads, so the weights' round trip overlaps the vector's. A warp's R rows'
// 16-byte loads, Loads / R of each a lane, are issued before any is used: a stage is bound by how many
// bytes are on their way from HBM, and a row that fits in one batch costs one round trip. A lane sums its
// weights in k order whatever R and Loads are, so the result does not depend on them. A call site picks
// R and Loads for its shape: few rounds of R rows over the grid's warps, few batches of a row, within the
// registers its kernel has left (csrc/build.sh reports spills).
// With T > 1, x holds T input vectors (token t's at x + t * K) that every row is dotted with: the weights are read
// once for T tokens, and out(r, t, d) is called for each.
template <int R = 2, int Loads = 8, int T = 1, typename Row, typename Prepare, typename Out>
__device__ __forceinline__ void grid_matvec(int rows, int K, const float* x, Row row, Prepare prepare, Out out) {
  constexpr int kPerRow = Loads / R, kBatch = 32 * kVec * kPerRow;  // weights of a row a batch covers
  const int lane = threadIdx.x & 31, step = R * gridDim.x * kWarps;
  int r = R * (blockIdx.x * kWarps + (threadIdx.x >> 5)), base = lane * kVec;
  const __nv_bfloat16* w[R];
  uint4 a[R][kPerRow];
  auto start_rows = [&] {
#pragma unroll
    for (int i = 0; i < R; ++i) w[i] = r + i < rows ? row(r + i) : nullptr;
  };
  auto issue = [&] {  // the batch at `base` of the rows in w
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int u = 0; u < kPerRow; ++u) {
        const int k = base + u * 32 * kVec;
        // a full definition, not a predicated load: a register a predicated load may leave unwritten keeps its
        // old value, so every batch array of the step stayed live through all its stages (255 registers)
        a[i][u] = w[i] != nullptr && k < K ? load_weights(w[i] + k) : make_uint4(0u, 0u, 0u, 0u);
      }
  };
  start_rows();
  issue();
  probe(kIssued);
  prepare();
  probe(kInputReady);
  bool first = true;
  while (r < rows) {
    float acc[T][R];
#pragma unroll
    for (int t = 0; t < T; ++t)
#pragma unroll
      for (int i = 0; i < R; ++i) acc[t][i] = 0.f;
    for (;;) {
#pragma unroll
      for (int t = 0; t < T; ++t)
#pragma unroll
        for (int i = 0; i < R; ++i)
#pragma unroll
          for (int u = 0; u < kPerRow; ++u) {
            const int k = base + u * 32 * kVec;
            if (w[i] != nullptr && k < K) acc[t][i] += dot8(a[i][u], load_x8(x + t * K + k));
          }
      if (first) probe(kFirstBatchUsed, acc[0][0]), first = false;
      if ((base += kBatch) >= K) break;
      issue();
    }
#pragma unroll
    for (int t = 0; t < T; ++t)
#pragma unroll
      for (int i = 0; i < R; ++i) acc[t][i] = warp_sum(acc[t][i]);
    if (lane == 0) {
#pragma unroll
      for (int t = 0; t < T; ++t)
#pragma unroll
        for (int i = 0; i < R; ++i)
          if (w[i] != nullptr) out(r + i, t, acc[t][i]);
    }
    r += step;
    base = lane * kVec;
    start_rows();
    issue();
  }
  probe(kRowsDone);
}

// Copy n fp32 values from global into shared memory (whole block). Where both ends are 16-byte aligned the copies go
// as 16-byte cp.async, all in flight before one wait: a load then a store per value waited for one round trip to
// memory per value a thread holds. The copies read through L2 (.cg), where the other blocks' writes are.
__device__ __forceinline__ void load_shared(float* dst, const float* src, int n) {
  int i = threadIdx.x;
  if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15) == 0) {
    const int quads = n / 4;
    for (; i < quads; i += blockDim.x) {
      const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(dst + 4 * i));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(to), "l"(src + 4 * i) : "memory");
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
    i = 4 * quads + threadIdx.x;
  }
  for (; i < n; i += blockDim.x) dst[i] = src[i];
  __syncthreads();
}

// dst <- RMSNorm(src) * w in shared memory for T vectors of n fp32 (token t's at src + t * n in global memory, at
// dst + t * n): the vectors' and the norm weights' loads are issued together, so a stage waits for one round trip,
// not two, and the T sums of squares share one pair of barriers. `scratch` holds T * kWarps floats.
template <int T = 1>
__device__ __forceinline__ void load_normed(float* dst, const float* src, const __nv_bfloat16* w, int n, float eps,
                                            float* scratch) {
  static_assert(T <= kMaxTokens, "scratch holds kMaxTokens sums");
  constexpr int kGroup = 8;  // tokens whose values a thread holds at once: 16 (8 streams' first predictor pass) spill
  if constexpr (T > kGroup) {
    static_assert(T % kGroup == 0, "whole groups of tokens");
    for (int t = 0; t < T; t += kGroup) load_normed<kGroup>(dst + t * n, src + t * n, w, n, eps, scratch);
    return;
  }
  constexpr int per_thread = kMaxNormed / kThreads;
  float v[T][per_thread], g[per_thread], ss[T];
#pragma unroll
  for (int j = 0; j < per_thread; ++j) {
    const int i = threadIdx.x + j * kThreads;
#pragma unroll
    for (int t = 0; t < T; ++t) v[t][j] = i < n ? src[t * n + i] : 0.f;
    g[j] = i < n ? __bfloat162float(w[i]) : 0.f;
  }
#pragma unroll
  for (int t = 0; t < T; ++t) {
    ss[t] = 0.f;
#pragma unroll
    for (int j = 0; j < per_thread; ++j) ss[t] += v[t][j] * v[t][j];
  }
  block_sums<T>(ss, scratch);
#pragma unroll
  for (int t = 0; t < T; ++t) {
    const float scale = rsqrtf(ss[t] / n + eps);
#pragma unroll
    for (int j = 0; j < per_thread; ++j) {
      const int i = threadIdx.x + j * kThreads;
      if (i < n) dst[t * n + i] = v[t][j] * scale * g[j];
    }
  }
  __syncthreads();
}

}  // namespace mk
