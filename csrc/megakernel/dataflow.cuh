// One token through one decoder stack without grid barriers (issue 27): stack_step's job (decoder_step.cuh: the same
// StackParams, KV cache layout, fp32 activations and bf16 weights), but a stage waits only for the counter of the
// stage whose output it reads, and each block streams its own weight rows into a ring of shared-memory pages ahead of
// the stages that use them.
//
// Stages per layer, as stack_step's; each block counts a stage done with one red.add after its stores:
//   A  RMSNorm + q/k/v rows                           waits for E of the layer before (every block)
//   B  q/k RMSNorm, RoPE, K/V write, attention        waits for A (every block); a block per query head
//   C  o_proj rows + residual                         waits for B (every head)
//   D  RMSNorm + gate/up rows, SiLU(g) * u            waits for C (every block)
//   E  down rows + residual                           waits for D (every block)
// block 0 then waits for the last E and writes the final-normed state. The counters only grow: launch n waits for n
// times a stage's producers (DataflowParams.step), so nothing is reset between launches.
//
// Why one copy of each scratch buffer is enough: every stage waits for all producers of the stage before it, each of
// which waited for all of the stage before theirs, so once any block has passed stage S's wait, every block has
// finished S - 1 and all before it, reads included. A buffer is written again only by a later stage of that chain
// (qkv by the next layer's A, attn by its B, mlp by its D; x by C and E, after the norms and residual adds that read
// it), so no block is still reading it then.
//
// Memory order: a producer's threads store, __syncthreads, then one thread issues a release fence and the add; a
// consumer's thread 0 polls with ld.acquire.gpu (which also drops the SM's L1 lines), then __syncthreads. The
// K/V at `pos` are written by one block per kv head and read back only from shared memory by that kv head's blocks
// (attention_head), as in stack_step; earlier positions were written by earlier launches.
//
// The weight ring: a block's rows of A, C, D and E (a contiguous range of each stage's rows, as few or as many as
// balance gives) form one fixed sequence of 16 KiB pages of whole rows, layer after layer. The block issues pages by
// cp.async as far ahead as the ring has room, at the start and as soon as a stage has used its pages, so before
// every wait: weights never depend on activations, so HBM streams them while blocks wait, and a stage whose input is
// ready reads its input vector and computes from shared memory.
//
// A wait gives up after kStallNs (2 s, where a whole step takes about a millisecond), records where in
// DataflowParams.stalled and ends the launch; the other blocks see the flag while they poll and end too, and the host
// raises instead of hanging the GPU.
// reference: engine/tts/model.py DecoderStack.forward (T = 1)
#pragma once

#include "decoder_step.cuh"

namespace mk {

constexpr int kPageElems = kPageBytes / 2;  // bf16 weights a page holds
constexpr int kMaxPages = 16;               // pages in the ring at most (cp.async.wait_group takes an immediate)
constexpr unsigned long long kStallNs = 2000000000ull;  // a wait that long is a bug: a whole step takes ~1 ms
constexpr int kMatvecs = 4;                 // the stages with weights: A, C, D, E
enum DataflowStage : int { kStageA, kStageB, kStageC, kStageD, kStageE, kStageFinal };

// --- cp.async: 16 bytes global -> shared, L2 only; a thread's groups complete in order -------------------------------
__device__ __forceinline__ void copy16_async(void* dst, const void* src) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void commit_async() { asm volatile("cp.async.commit_group;" ::: "memory"); }

// Until at most n of this thread's groups are pending (waiting for fewer, where n >= N, is also right).
template <int N = kMaxPages - 1>
__device__ __forceinline__ void wait_async(int n) {
  if constexpr (N == 0) {
    asm volatile("cp.async.wait_group 0;" ::: "memory");
  } else {
    if (n >= N) asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
    else wait_async<N - 1>(n);
  }
}

// --- counters --------------------------------------------------------------------------------------------------------
__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ int load_relaxed(const int* p) {
  int v;
  asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Whole block, after its stores: count them done (n producers' worth). The barrier orders every thread's stores
// before thread 0's release fence, as CUTLASS's generic barrier does.
__device__ __forceinline__ void signal(unsigned* counter, unsigned n = 1) {
  __syncthreads();
  if (threadIdx.x == 0) asm volatile("fence.acq_rel.gpu;\n\tred.relaxed.gpu.global.add.u32 [%0], %1;" ::"l"(counter),
                                     "r"(n) : "memory");
}

// Whole block: until *counter, stage `stage`'s, reaches target. False where this wait timed out after kStallNs
// (recorded in f.stalled as `code`, unless another wait was first) or another block's did (both looked at every 64
// polls, off the path of a wait that succeeds): the launch then ends. Block 0 traces each wait as the barrier step
// traces the barrier after the same stage (tag kTalker + stage: arrived with its own share done, left with all).
__device__ __forceinline__ bool wait_for(const DataflowParams& f, const unsigned* counter, unsigned target, int code,
                                         int stage) {
  bool ok = true;
  if (threadIdx.x == 0) {
    const unsigned long long start = now_ns();
    for (unsigned poll = 0;; ++poll) {
      if (static_cast<int>(load_acquire(counter) - target) >= 0) break;  // wrap-safe: the counters may pass 2^32
      if (poll % 64 == 63 && (load_relaxed(f.stalled) != 0 || now_ns() - start > kStallNs)) {
        ok = false;
        atomicCAS(f.stalled, 0, code);
        break;
      }
      __nanosleep(32);
    }
    if (blockIdx.x == 0 && g_trace.slots != nullptr) trace_stamp(kTalker + stage, start);
  }
  return __syncthreads_and(ok);
}

// --- the weight ring -------------------------------------------------------------------------------------------------
// A block's share of one stage with weights: rows row0..row0 + rows of K weights, per_page of them a page.
struct Slice {
  int K, row0, rows, per_page, pages;
};

// Rows 0..total split into contiguous ranges, one per block, in units of `unit` rows that stay together (D: the gate
// and up rows of one index, so SiLU(g) * u needs no exchange).
__device__ __forceinline__ Slice slice_of(int total, int K, int unit) {
  const int64_t units = total / unit;
  const int u0 = static_cast<int>(units * blockIdx.x / gridDim.x);
  const int u1 = static_cast<int>(units * (blockIdx.x + 1) / gridDim.x);
  Slice s;
  s.K = K;
  s.row0 = u0 * unit;
  s.rows = (u1 - u0) * unit;
  s.per_page = kPageElems / K / unit * unit;
  s.pages = (s.rows + s.per_page - 1) / s.per_page;
  return s;
}

// Row r of stage m's weights (m: 0 A over q|k|v, 1 C, 2 D with gate row i at 2i and up row i at 2i + 1, 3 E).
__device__ __forceinline__ const __nv_bfloat16* weight_row(const StackParams& p, const LayerWeights& w, int m, int r) {
  const int H = p.hidden, q_rows = p.num_heads * p.head_dim, kv_rows = p.num_kv_heads * p.head_dim;
  switch (m) {
    case 0:
      return r < q_rows ? row_of(w.q, r, H)
                        : (r < q_rows + kv_rows ? row_of(w.k, r - q_rows, H) : row_of(w.v, r - q_rows - kv_rows, H));
    case 1: return row_of(w.o, r, q_rows);
    case 2: return row_of(r % 2 ? w.up : w.gate, r / 2, H);
    default: return row_of(w.down, r, p.intermediate);
  }
}

// `rows` weight rows in shared memory dotted with x (shared memory too): a warp takes U rows at a time (adjacent in one
// page), its lanes 16 bytes each across K; row(i) is row i's address, out(i, acc) gets the U sums from row i on.
template <int U, typename Row, typename Out>
__device__ __forceinline__ void rows_matvec(int rows, int K, const float* x, Row row, Out out) {
  const int lane = threadIdx.x & 31;
  for (int i = U * (threadIdx.x >> 5); i < rows; i += U * kWarps) {
    const __nv_bfloat16* w = row(i);
    float acc[U];
#pragma unroll
    for (int j = 0; j < U; ++j) acc[j] = 0.f;
#pragma unroll 4
    for (int k = lane * kVec; k < K; k += 32 * kVec) {
#pragma unroll
      for (int j = 0; j < U; ++j) acc[j] += dot8(*reinterpret_cast<const uint4*>(w + j * K + k), x + k);
    }
#pragma unroll
    for (int j = 0; j < U; ++j) acc[j] = warp_sum(acc[j]);
    if (lane == 0) out(i, acc);
  }
}

// The block's pages, issued in the order they are used: layer by layer, A, C, D, E, each slice's pages in row order.
// Every thread keeps the same copy of this state and runs every call (block-uniform control flow).
struct WeightRing {
  __nv_bfloat16* base;  // pages * kPageElems
  int pages;
  const Slice* slices;  // kMatvecs, in shared memory
  int issued = 0, used = 0;            // pages of the sequence issued, and used
  int layer = 0, stage = 0, page = 0;  // the next page to issue: its layer, stage (0..3) and page in the slice

  // Issue pages until the ring is full or the sequence ends; each thread copies its share and commits one group a page.
  __device__ void fill(const StackParams& p) {
    while (layer < p.num_layers && issued - used < pages) {
      const Slice& s = slices[stage];
      if (page < s.pages) {
        __nv_bfloat16* slot = base + (issued % pages) * kPageElems;
        const int first = page * s.per_page, n = min(s.per_page, s.rows - first), per_row = s.K / kVec;
        const LayerWeights& w = p.layers[layer];
        for (int c = threadIdx.x; c < n * per_row; c += kThreads) {
          const int r = c / per_row, k = (c - r * per_row) * kVec;
          copy16_async(slot + r * s.K + k, weight_row(p, w, stage, s.row0 + first + r) + k);
        }
        commit_async();
        ++issued;
        ++page;
      }
      if (page >= s.pages) {
        page = 0;
        if (++stage == kMatvecs) stage = 0, ++layer;
      }
    }
  }

  // Stage m's rows of the current layer against x (shared memory); out(r, acc) gets the U sums from the slice's row r
  // on. The stage's pages already issued are used together, all warps across their rows (usually the whole stage: a
  // stage's share of the 0.6B's weights is 2 to 6 pages), then their slots are refilled at once.
  template <int U, typename Out>
  __device__ void use(const StackParams& p, int m, const float* x, Out out) {
    const Slice& s = slices[m];
    for (int j = 0; j < s.pages;) {
      const int batch = min(s.pages - j, issued - used);  // this stage's next pages are the oldest issued
      wait_async(issued - used - batch);
      __syncthreads();  // every thread's copies of them have landed
      const int first = j * s.per_page, rows = min((j + batch) * s.per_page, s.rows) - first;
      rows_matvec<U>(
          rows, s.K, x,
          [&](int i) { return base + (used + i / s.per_page) % pages * kPageElems + i % s.per_page * s.K; },
          [&](int i, const float* acc) { out(s.row0 + first + i, acc); });
      __syncthreads();  // their slots are read
      used += batch;
      j += batch;
      fill(p);
    }
  }

  // Before the launch ends early: no copy may land after it.
  __device__ void drain() { wait_async(0); }
};

// --- the step --------------------------------------------------------------------------------------------------------
// ring: f.pages * kPageBytes of shared memory; work: step_shared_bytes(p, 1) (attention, or a stage's input vector);
// slices: kMatvecs of shared memory. Block 0 writes the final-normed state to out.
__device__ void dataflow_step(const StackParams& p, const DataflowParams& f, int pos, const float* x_in, float* out,
                              __nv_bfloat16* ring_pages, float* work, float* scratch, Slice* slices) {
  const int H = p.hidden, NH = p.num_heads, I = p.intermediate, L = p.num_layers;
  const int q_rows = NH * p.head_dim, qkv_rows = q_rows + 2 * p.num_kv_heads * p.head_dim;
  if (threadIdx.x == 0) {
    slices[0] = slice_of(qkv_rows, H, 1);
    slices[1] = slice_of(H, q_rows, 1);
    slices[2] = slice_of(2 * I, H, 2);
    slices[3] = slice_of(H, I, 1);
  }
  __syncthreads();
  WeightRing ring{ring_pages, f.pages, slices};
  ring.fill(p);
  const unsigned every_block = f.step * gridDim.x, every_head = f.step * NH;
  for (int l = 0; l < L; ++l) {
    const LayerWeights& w = p.layers[l];  // in shared memory
    unsigned* done = f.counters + l * kDataflowStages;
    const int where = 1 + 8 * l;  // + the stage: f.stalled's code
    const float* residual = l == 0 ? x_in : p.x;
    // A (layer 0's input is the launch's own)
    if (l > 0 && !wait_for(f, done - kDataflowStages + kStageE, every_block, where + kStageA, kStageE))
      return ring.drain();
    load_normed(work, residual, w.input_norm, H, p.eps, scratch);
    ring.use<1>(p, 0, work, [&](int r, const float* d) { p.qkv[r] = d[0]; });
    signal(done + kStageA);
    // B
    if (blockIdx.x < NH) {
      if (!wait_for(f, done + kStageA, every_block, where + kStageB, kStageA)) return ring.drain();
      unsigned heads = 0;
      for (int h = blockIdx.x; h < NH; h += gridDim.x, ++heads) attention_head(p, w, l, pos, h, work, scratch);
      signal(done + kStageB, heads);
    }
    // C
    if (!wait_for(f, done + kStageB, every_head, where + kStageC, kStageB)) return ring.drain();
    load_shared(work, p.attn, q_rows);
    ring.use<1>(p, 1, work, [&](int r, const float* d) { p.x[r] = residual[r] + d[0]; });
    signal(done + kStageC);
    // D
    if (!wait_for(f, done + kStageC, every_block, where + kStageD, kStageC)) return ring.drain();
    load_normed(work, p.x, w.post_norm, H, p.eps, scratch);
    ring.use<2>(p, 2, work, [&](int r, const float* d) { p.mlp[r / 2] = d[0] / (1.0f + __expf(-d[0])) * d[1]; });
    signal(done + kStageD);
    // E
    if (!wait_for(f, done + kStageD, every_block, where + kStageE, kStageD)) return ring.drain();
    load_shared(work, p.mlp, I);
    ring.use<1>(p, 3, work, [&](int r, const float* d) { p.x[r] += d[0]; });
    signal(done + kStageE);
  }
  if (blockIdx.x == 0) {
    const unsigned* last = f.counters + (L - 1) * kDataflowStages + kStageE;
    if (!wait_for(f, last, every_block, 1 + 8 * (L - 1) + kStageFinal, kStageE)) return;
    final_norm_shared(p, p.x, work, scratch);
    for (int i = threadIdx.x; i < H; i += blockDim.x) out[i] = work[i];
  }
}

}  // namespace mk
