// One stage of the megakernel's decode step, alone: a matvec of the 0.6B's shapes repeated in a persistent
// cooperative grid (one block an SM, grid.sync() after each, weights cycled over 16 copies so that they come
// from HBM, not L2), in the kernel's own design and in others, to see what a stage costs and what would
// pay before building it into frames_kernel. Prints one markdown table; run by bench/matvec_stages.sh.
//
// Designs (x is the stage's input vector, written by the previous stage, so read after the barrier):
//   kernel                csrc/megakernel as it is: grid_matvec<R, Loads> as stack_step calls it, x put into
//                         shared memory (RMSNorm'd by the block) after each warp's first batch is issued
//   rows first            all the warp's rows issued into registers before x is loaded: one round trip
//                         for the weights, overlapping x's
//   rows first by cp.async  the same rows copied into shared memory with cp.async (a lane reads back only
//                         what it copied): no registers held for them
//   x in lanes            rows first, and x held in registers in the lanes' layout (lane l: x[256 u + 8 l
//                         + j]), normalized by each warp alone: no shared memory, no block reduction
//   next rows before the barrier  x in lanes, and the next stage's rows loaded before grid.sync()
// and three barriers: cooperative groups' grid.sync() (its thread 0 fences with __threadfence, fence.sc, then adds
// to a counter), a release/acquire barrier (thread 0 adds with atom.release, spins with ld.acquire), and on Hopper
// a two-level one over thread-block clusters of 2, 4 or 8 (the cluster's hardware barrier, then one block a
// cluster in the release/acquire count, then the cluster's barrier again), alone and after the kernel's design.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "../csrc/megakernel/common.cuh"

using namespace mk;

struct Stage {
  const __nv_bfloat16* w;  // `copies` matrices of (rows, K), one after another
  int copies, rows, K, iters;
  const float* x;             // (K) input
  const __nv_bfloat16* norm;  // (K) RMSNorm weight, or null: x is used as it is
  float* out;                 // (rows)
  __device__ const __nv_bfloat16* matrix(int it) const { return w + static_cast<int64_t>(it % copies) * rows * K; }
};

// Row i of this warp's share: rows gwarp, gwarp + all warps, gwarp + 2 x all warps, ...
__device__ __forceinline__ int warp_row(int i) {
  return blockIdx.x * kWarps + (threadIdx.x >> 5) + i * gridDim.x * kWarps;
}

enum Design { kBarrierOnly, kReleaseBarrierOnly, kClusterBarrierOnly, kInputOnly, kKernel, kKernelRelease,
              kKernelCluster, kRowsFirst, kRowsFirstAsync, kLanes, kNextRowsEarly };

// A grid barrier as cooperative groups' (one add a block to a counter whose top bit flips once all have added:
// block 0 adds 2^31 - (gridDim.x - 1), the others 1), with release/acquire atomics in place of its fences: after
// the block's __syncthreads, thread 0 adds with release semantics (the block's writes, ordered before it by the
// __syncthreads, become visible first) and waits for the flip with acquire loads.
__device__ unsigned int g_arrived;

// Thread 0 of each of `count` blocks adds; block 0 is one of them.
__device__ __forceinline__ void release_acquire_count(unsigned int count) {
  const unsigned int add = blockIdx.x == 0 ? 0x80000000u - (count - 1) : 1u;
  unsigned int found, now;
  asm volatile("atom.add.release.gpu.global.u32 %0, [%1], %2;" : "=r"(found) : "l"(&g_arrived), "r"(add) : "memory");
  do asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(now) : "l"(&g_arrived) : "memory");
  while (((found ^ now) & 0x80000000u) == 0);
}

__device__ __forceinline__ void release_acquire_sync() {
  __syncthreads();
  if (threadIdx.x == 0) release_acquire_count(gridDim.x);
  __syncthreads();
}

// The two-level barrier over clusters of C blocks (a launch with cluster dimension C): the cluster's hardware
// barrier (release/acquire at cluster scope: every block's writes ordered before its first block's thread 0
// goes on), the release/acquire count among the clusters' first blocks (gridDim.x / C of them, not gridDim.x),
// and the cluster's barrier again, where the other blocks wait for their first one. Release and acquire are
// cumulative, so a write made before the first cluster barrier is visible after the second, in every cluster.
template <int C>
__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  if (threadIdx.x == 0 && cluster.block_rank() == 0) release_acquire_count(gridDim.x / C);
  cluster.sync();
#else
  __trap();  // the host runs the cluster rows on compute capability 9.0 and later only
#endif
}

// The warp's R rows (warp_row), each KP pieces of 256 weights, into registers.
template <int R, int KP>
__device__ __forceinline__ void load_rows(const Stage& s, const __nv_bfloat16* W, uint4 (&q)[R][KP]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int r = warp_row(i);
#pragma unroll
    for (int u = 0; u < KP; ++u)
      if (r < s.rows) q[i][u] = load_weights(W + static_cast<int64_t>(r) * s.K + u * 256 + lane * kVec);
  }
}

// The same rows copied into this lane's slots of shared memory (R x KP 16-byte slots a lane, after x's K floats).
template <int R, int KP>
__device__ __forceinline__ void copy_rows(const Stage& s, const __nv_bfloat16* W, uint4* slots) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int r = warp_row(i);
#pragma unroll
    for (int u = 0; u < KP; ++u)
      if (r < s.rows) {
        const __nv_bfloat16* src = W + static_cast<int64_t>(r) * s.K + u * 256 + lane * kVec;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(static_cast<unsigned>(
                         __cvta_generic_to_shared(slots + (i * KP + u) * kThreads))),
                     "l"(src)
                     : "memory");
      }
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
}

// dot(row, x) of those rows, x given per lane by xk(u) (a pointer to its 8 values), sums written by lane 0.
template <int R, int KP, typename X>
__device__ __forceinline__ void finish_rows(const Stage& s, const uint4 (&q)[R][KP], X xk) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int r = warp_row(i);
    float acc = 0.f;
#pragma unroll
    for (int u = 0; u < KP; ++u) acc += dot8(q[i][u], xk(u));
    acc = warp_sum(acc);
    if (lane == 0 && r < s.rows) s.out[r] = acc;
  }
}

// x (K = 1024) in the lanes' layout, RMSNorm'd by the warp where s.norm is set.
__device__ __forceinline__ void load_lanes(const Stage& s, float (&x)[4][kVec]) {
  const int lane = threadIdx.x & 31;
  uint4 g[4];
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const float4 a = *reinterpret_cast<const float4*>(s.x + u * 256 + lane * kVec);
    const float4 b = *reinterpret_cast<const float4*>(s.x + u * 256 + lane * kVec + 4);
    x[u][0] = a.x, x[u][1] = a.y, x[u][2] = a.z, x[u][3] = a.w, x[u][4] = b.x, x[u][5] = b.y, x[u][6] = b.z, x[u][7] = b.w;
    if (s.norm != nullptr) g[u] = *reinterpret_cast<const uint4*>(s.norm + u * 256 + lane * kVec);
  }
  if (s.norm == nullptr) return;
  float ss = 0.f;
#pragma unroll
  for (int u = 0; u < 4; ++u)
#pragma unroll
    for (int j = 0; j < kVec; ++j) ss += x[u][j] * x[u][j];
  const float scale = rsqrtf(warp_sum(ss) / 1024 + 1e-6f);
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const __nv_bfloat162* gp = reinterpret_cast<const __nv_bfloat162*>(&g[u]);
#pragma unroll
    for (int j = 0; j < kVec / 2; ++j) {
      const float2 f = __bfloat1622float2(gp[j]);
      x[u][2 * j] *= scale * f.x;
      x[u][2 * j + 1] *= scale * f.y;
    }
  }
}

__device__ __forceinline__ void load_input(const Stage& s, float* smem, float* scratch) {
  if (s.norm != nullptr) load_normed(smem, s.x, s.norm, s.K, 1e-6f, scratch);
  else load_shared(smem, s.x, s.K);
}

// R rows a warp cover the stage (rows <= R x all warps); KP = K / 256; MR, ML: the kernel's grid_matvec<MR, ML>.
// C: the cluster size the launch has, for the cluster barrier's designs.
template <int D, int R, int KP, int MR, int ML, int C = 1>
__global__ void __launch_bounds__(kThreads, 1) stage_kernel(Stage s) {
  extern __shared__ float smem[];
  __shared__ float scratch[kWarps];
  cg::grid_group grid = cg::this_grid();
  uint4 q[R][KP];
  if constexpr (D == kNextRowsEarly) load_rows<R, KP>(s, s.matrix(0), q);
  for (int it = 0; it < s.iters; ++it) {
    const __nv_bfloat16* W = s.matrix(it);
    if constexpr (D == kInputOnly) load_input(s, smem, scratch);
    if constexpr (D == kKernel || D == kKernelRelease || D == kKernelCluster)
      grid_matvec<MR, ML>(
          s.rows, s.K, smem, [&](int r) { return W + static_cast<int64_t>(r) * s.K; },
          [&] { load_input(s, smem, scratch); }, [&](int r, int, float d) { s.out[r] = d; });
    if constexpr (D == kRowsFirst) {
      load_rows<R, KP>(s, W, q);
      load_input(s, smem, scratch);
      finish_rows<R, KP>(s, q, [&](int u) { return smem + u * 256 + (threadIdx.x & 31) * kVec; });
    }
    if constexpr (D == kRowsFirstAsync) {
      uint4* slots = reinterpret_cast<uint4*>(smem + s.K) + threadIdx.x;
      copy_rows<R, KP>(s, W, slots);
      load_input(s, smem, scratch);
      asm volatile("cp.async.wait_group 0;" ::: "memory");
      const int lane = threadIdx.x & 31;
#pragma unroll 1
      for (int i = 0; i < R; ++i) {  // read back slot by slot: no registers held for the rows
        const int r = warp_row(i);
        float acc = 0.f;
#pragma unroll
        for (int u = 0; u < KP; ++u) acc += dot8(slots[(i * KP + u) * kThreads], smem + u * 256 + lane * kVec);
        acc = warp_sum(acc);
        if (lane == 0 && r < s.rows) s.out[r] = acc;
      }
    }
    if constexpr (D == kLanes || D == kNextRowsEarly) {
      if constexpr (D == kLanes) load_rows<R, KP>(s, W, q);
      float x[4][kVec];
      load_lanes(s, x);
      finish_rows<R, KP>(s, q, [&](int u) { return x[u]; });
      if constexpr (D == kNextRowsEarly) load_rows<R, KP>(s, s.matrix(it + 1), q);
    }
    if constexpr (D == kReleaseBarrierOnly || D == kKernelRelease) release_acquire_sync();
    else if constexpr (D == kClusterBarrierOnly || D == kKernelCluster) cluster_sync<C>();
    else grid.sync();
  }
}

#define CHECK(call)                                                                          \
  do {                                                                                       \
    const cudaError_t e_ = (call);                                                           \
    if (e_ != cudaSuccess) {                                                                 \
      std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e_));               \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

// Best of 4 timed launches (after one warm-up) of `iters` stages; us a stage. C > 1: a launch in clusters of C
// blocks, as many of the SMs as whole clusters that fit co-resident cover (the design's name says how many).
template <int D, int R, int KP, int MR, int ML, int C = 1>
void row(const char* stage, const char* design, Stage s, int sms) {
  const void* kernel = reinterpret_cast<const void*>(stage_kernel<D, R, KP, MR, ML, C>);
  const size_t smem = 4 * static_cast<size_t>(s.K) + (D == kRowsFirstAsync ? 16 * R * KP * kThreads : 0);
  CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  cudaLaunchAttribute attrs[2];
  attrs[0].id = cudaLaunchAttributeCooperative;
  attrs[0].val.cooperative = 1;
  attrs[1].id = cudaLaunchAttributeClusterDimension;
  attrs[1].val.clusterDim = {C, 1, 1};
  cudaLaunchConfig_t config = {dim3(sms - sms % C), dim3(kThreads), smem, nullptr, attrs, C > 1 ? 2u : 1u};
  char named[160];
  std::snprintf(named, sizeof named, "%s", design);
  if constexpr (C > 1) {
    int major = 0, clusters = 0;
    CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    if (major < 9) return;
    CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &config));
    config.gridDim.x = std::min(config.gridDim.x, static_cast<unsigned>(clusters * C));
    std::snprintf(named, sizeof named, "%s (%u blocks)", design, config.gridDim.x);
  }
  void* args[] = {&s};
  if (C > 1) {  // whether a cooperative launch takes clusters here: said in the table, not fatal
    const cudaError_t e = cudaLaunchKernelExC(&config, kernel, args);
    if (e != cudaSuccess) {
      std::printf("| %s | %s | launch failed: %s | - | - |\n", stage, named, cudaGetErrorString(e));
      return;
    }
    CHECK(cudaDeviceSynchronize());
  }
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  float best = 1e30f;
  for (int rep = 0; rep < 5; ++rep) {
    CHECK(cudaEventRecord(start));
    CHECK(cudaLaunchKernelExC(&config, kernel, args));
    CHECK(cudaEventRecord(stop));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0.f;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (rep > 0 && ms < best) best = ms;
  }
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  const double us = 1000.0 * best / s.iters, mb = 2.0 * s.rows * s.K / 1e6;
  if (D == kBarrierOnly || D == kReleaseBarrierOnly || D == kClusterBarrierOnly || D == kInputOnly)
    std::printf("| %s | %s | - | %.2f | - |\n", stage, named, us);
  else std::printf("| %s | %s | %.1f | %.2f | %.0f |\n", stage, named, mb, us, mb * 1e3 / us);
}

// A stage whose input is RMSNorm'd (K = 1024), R rows a warp covering it: the kernel's grid_matvec at 2, 3 and
// R rows a batch, then the other designs.
template <int R>
void normed_designs(const char* stage, const Stage& s, int sms) {
  char whole[96];
  std::snprintf(whole, sizeof whole, "kernel: grid_matvec<%d, %d>", R, 4 * R);
  row<kKernel, R, 4, 2, 8>(stage, "kernel: grid_matvec<2, 8>", s, sms);
  row<kKernel, R, 4, 3, 12>(stage, "kernel: grid_matvec<3, 12>", s, sms);
  row<kKernel, R, 4, R, 4 * R>(stage, whole, s, sms);
  std::snprintf(whole, sizeof whole, "kernel: grid_matvec<%d, %d>, release/acquire barrier", R, 4 * R);
  row<kKernelRelease, R, 4, R, 4 * R>(stage, whole, s, sms);
  std::snprintf(whole, sizeof whole, "kernel: grid_matvec<%d, %d>, cluster barrier, clusters of 4", R, 4 * R);
  row<kKernelCluster, R, 4, R, 4 * R, 4>(stage, whole, s, sms);
  row<kRowsFirst, R, 4, 1, 1>(stage, "rows first, x in shared memory", s, sms);
  row<kRowsFirstAsync, R, 4, 1, 1>(stage, "rows first by cp.async, x in shared memory", s, sms);
  row<kLanes, R, 4, 1, 1>(stage, "rows first, x in lanes", s, sms);
  row<kNextRowsEarly, R, 4, 1, 1>(stage, "x in lanes, next rows before the barrier", s, sms);
}

// A stage whose input is used as it is, a row a warp of KP pieces (the kernel's grid_matvec<1, KP>).
template <int KP>
void plain_designs(const char* stage, const Stage& s, int sms) {
  char kernel[96];
  std::snprintf(kernel, sizeof kernel, "kernel: grid_matvec<1, %d>", KP);
  row<kKernel, 1, KP, 1, KP>(stage, kernel, s, sms);
  std::snprintf(kernel, sizeof kernel, "kernel: grid_matvec<1, %d>, release/acquire barrier", KP);
  row<kKernelRelease, 1, KP, 1, KP>(stage, kernel, s, sms);
  std::snprintf(kernel, sizeof kernel, "kernel: grid_matvec<1, %d>, cluster barrier, clusters of 4", KP);
  row<kKernelCluster, 1, KP, 1, KP, 4>(stage, kernel, s, sms);
  row<kRowsFirst, 1, KP, 1, 1>(stage, "rows first, x in shared memory", s, sms);
  row<kRowsFirstAsync, 1, KP, 1, 1>(stage, "rows first by cp.async, x in shared memory", s, sms);
}

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, grid %d x %d, 400 stages a launch, best of 4 launches\n\n", prop.name, sms, kThreads);
  std::printf("| stage (rows x K) | design | MB | us a stage | GB/s |\n|---|---|---|---|---|\n");
  if (sms * kWarps < 1024) {
    std::fprintf(stderr, "this bench's row split assumes >= 1024 warps (128 SMs); this GPU has %d SMs\n", sms);
    return 1;
  }
  const int copies = 16;
  const size_t elems = static_cast<size_t>(copies) * 6144 * 1024;  // 16 copies of the largest, 192 MB
  std::vector<__nv_bfloat16> host(1 << 20);
  for (size_t i = 0; i < host.size(); ++i) host[i] = __float2bfloat16(static_cast<float>((i * 2654435761u) % 1000) / 1000.f - 0.5f);
  __nv_bfloat16 *w = nullptr, *norm = nullptr;
  float *x = nullptr, *out = nullptr;
  CHECK(cudaMalloc(&w, elems * 2));
  for (size_t off = 0; off < elems; off += host.size())
    CHECK(cudaMemcpy(w + off, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMalloc(&norm, 2 * 3072));
  CHECK(cudaMemcpy(norm, host.data(), 2 * 3072, cudaMemcpyHostToDevice));
  const std::vector<float> ones(8192, 0.01f);
  CHECK(cudaMalloc(&x, 4 * ones.size()));
  CHECK(cudaMemcpy(x, ones.data(), 4 * ones.size(), cudaMemcpyHostToDevice));
  CHECK(cudaMalloc(&out, 4 * 8192));

  const Stage normed{w, copies, 1, 1024, 400, x, norm, out};
  row<kBarrierOnly, 1, 1, 1, 1>("-", "grid.sync() alone", normed, sms);
  row<kReleaseBarrierOnly, 1, 1, 1, 1>("-", "release/acquire barrier alone", normed, sms);
  row<kClusterBarrierOnly, 1, 1, 1, 1, 2>("-", "cluster barrier alone, clusters of 2", normed, sms);
  row<kClusterBarrierOnly, 1, 1, 1, 1, 4>("-", "cluster barrier alone, clusters of 4", normed, sms);
  row<kClusterBarrierOnly, 1, 1, 1, 1, 8>("-", "cluster barrier alone, clusters of 8", normed, sms);
  row<kInputOnly, 1, 1, 1, 1>("-", "x (1024) RMSNorm'd into shared memory + grid.sync()", normed, sms);

  Stage a = normed;  // q/k/v
  a.rows = 4096;
  normed_designs<4>("A q/k/v (4096 x 1024)", a, sms);
  Stage d = normed;  // gate/up
  d.rows = 6144;
  normed_designs<6>("D gate/up (6144 x 1024)", d, sms);
  plain_designs<8>("C o_proj (1024 x 2048)", Stage{w, copies, 1024, 2048, 400, x, nullptr, out}, sms);
  plain_designs<12>("E down (1024 x 3072)", Stage{w, copies, 1024, 3072, 400, x, nullptr, out}, sms);
  return 0;
}
