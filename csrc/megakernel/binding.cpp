// The only file that includes torch: checks dtypes, devices and shapes by name, then launches.
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>

#include "params.h"

#define MK_CHECK_CUDA(call)                                                                        \
  do {                                                                                             \
    const cudaError_t err_ = (call);                                                               \
    TORCH_CHECK(err_ == cudaSuccess, #call, " failed at ", __FILE__, ":", __LINE__, ": ",          \
                cudaGetErrorString(err_));                                                         \
  } while (0)

static void expect(const torch::Tensor& t, const char* name, torch::ScalarType dtype, int64_t numel) {
  TORCH_CHECK(t.is_cuda(), name, " must be on a CUDA device");
  TORCH_CHECK(t.scalar_type() == dtype, name, " must be ", c10::toString(dtype), ", got ", t.scalar_type());
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(numel < 0 || t.numel() == numel, name, " has ", t.numel(), " elements, expected ", numel);
}

// layers: int64 (num_layers, 11) device pointers in LayerWeights order; dims: hidden, intermediate,
// heads, kv_heads, head_dim; scratch: fp32 buffers x, qkv, attn, mlp; returns nothing, writes out and K/V at pos.
void decoder_step(torch::Tensor layers, std::vector<int64_t> dims, double eps, double rope_theta,
                  torch::Tensor cache_k, torch::Tensor cache_v, int64_t pos, torch::Tensor x_in,
                  torch::Tensor final_norm, torch::Tensor x, torch::Tensor qkv, torch::Tensor attn,
                  torch::Tensor mlp, torch::Tensor out, int64_t blocks) {
  TORCH_CHECK(dims.size() == 5, "dims must be (hidden, intermediate, heads, kv_heads, head_dim)");
  const int64_t H = dims[0], I = dims[1], NH = dims[2], NKV = dims[3], D = dims[4];
  TORCH_CHECK(layers.scalar_type() == torch::kInt64 && layers.dim() == 2 && layers.size(1) == 11,
              "layers must be int64 (num_layers, 11)");
  TORCH_CHECK(H % 8 == 0 && I % 8 == 0 && D % 8 == 0 && NH % NKV == 0, "sizes must be multiples of 8, heads of kv_heads");
  expect(cache_k, "cache_k", torch::kBFloat16, -1);
  expect(cache_v, "cache_v", torch::kBFloat16, -1);
  TORCH_CHECK(cache_k.dim() == 4 && cache_k.size(0) == layers.size(0) && cache_k.size(1) == NKV && cache_k.size(3) == D,
              "cache_k must be (layers, kv_heads, capacity, head_dim)");
  TORCH_CHECK(cache_v.sizes() == cache_k.sizes(), "cache_v must match cache_k");
  TORCH_CHECK(pos >= 0 && pos < cache_k.size(2), "pos ", pos, " outside the cache's capacity ", cache_k.size(2));
  expect(x_in, "x_in", torch::kFloat32, H);
  expect(final_norm, "final_norm", torch::kBFloat16, H);
  expect(x, "x", torch::kFloat32, H);
  expect(qkv, "qkv", torch::kFloat32, (NH + 2 * NKV) * D);
  expect(attn, "attn", torch::kFloat32, NH * D);
  expect(mlp, "mlp", torch::kFloat32, I);
  expect(out, "out", torch::kFloat32, H);
  const c10::cuda::CUDAGuard guard(x.device());
  mk::StackParams p{};
  p.layers = reinterpret_cast<const mk::LayerWeights*>(layers.data_ptr<int64_t>());
  p.num_layers = static_cast<int>(layers.size(0));
  p.hidden = H; p.intermediate = I; p.num_heads = NH; p.num_kv_heads = NKV; p.head_dim = D;
  p.eps = static_cast<float>(eps); p.rope_theta = static_cast<float>(rope_theta);
  p.cache_k = reinterpret_cast<__nv_bfloat16*>(cache_k.data_ptr());
  p.cache_v = reinterpret_cast<__nv_bfloat16*>(cache_v.data_ptr());
  p.capacity = static_cast<int>(cache_k.size(2)); p.pos = static_cast<int>(pos);
  p.x_in = x_in.data_ptr<float>();
  p.final_norm = reinterpret_cast<const __nv_bfloat16*>(final_norm.data_ptr());
  p.x = x.data_ptr<float>(); p.qkv = qkv.data_ptr<float>(); p.attn = attn.data_ptr<float>();
  p.mlp = mlp.data_ptr<float>(); p.out = out.data_ptr<float>();
  MK_CHECK_CUDA(mk::launch_decoder_step(p, static_cast<int>(blocks), at::cuda::getCurrentCUDAStream()));
}

// How many blocks a launch for this stack uses (all co-resident), or an error naming the limit.
int64_t plan_blocks(std::vector<int64_t> dims, int64_t capacity) {
  mk::StackParams p{};
  p.hidden = dims[0]; p.intermediate = dims[1]; p.num_heads = dims[2]; p.num_kv_heads = dims[3]; p.head_dim = dims[4];
  p.capacity = static_cast<int>(capacity);
  int blocks = 0;
  const size_t smem = mk::shared_bytes(p);
  MK_CHECK_CUDA(mk::coresident_blocks(smem, &blocks));
  TORCH_CHECK(blocks > 0, "the decoder-step kernel does not fit on an SM with ", smem, " bytes of shared memory");
  return blocks;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decoder_step", &decoder_step, "one decode step of a Qwen3 decoder stack in one persistent launch");
  m.def("plan_blocks", &plan_blocks, "co-resident blocks for a stack's launch");
}
