"""Python side of csrc/megakernel: builds it once (cached), and runs a decoder stack's single-token step in it.

`attach(model)` gives the talker's and the code predictor's DecoderStack a kernel step, so every
one-token forward of model.py runs its whole layer stack in one persistent launch (prefill stays on
batched PyTorch matmuls and writes the same KV layout). Where CUDA, the compiler or a supported GPU is
missing, `MegakernelUnavailable` says why and the caller keeps the PyTorch path.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from engine.errors import ParleyError
from engine.tts.model import DecoderStack, KVCache, Qwen3TTS

CSRC = Path(__file__).resolve().parent.parent.parent / "csrc" / "megakernel"
MAX_POSITIONS = 16384  # shared memory is planned for attention over this many cached positions

_module = None


class MegakernelUnavailable(ParleyError):
    """The megakernel cannot run here; the message says why (the PyTorch engine is used instead)."""


def _cache_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "parley" / "megakernel" / f"torch-{torch.__version__}"


def build():
    """Compile (first use only; cached on disk) and import the kernel extension."""
    global _module
    if _module is not None:
        return _module
    if not torch.cuda.is_available():
        raise MegakernelUnavailable("the megakernel needs a CUDA GPU; none is available")
    major, minor = torch.cuda.get_device_capability()
    if major < 8:
        name = torch.cuda.get_device_name()
        raise MegakernelUnavailable(f"the megakernel needs compute capability 8.0+, found {major}.{minor} ({name})")
    from torch.utils.cpp_extension import load

    arch = "-gencode=arch=compute_90a,code=sm_90a" if (major, minor) == (9, 0) else f"-arch=sm_{major}{minor}"
    directory = _cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    try:
        _module = load(
            name="parley_megakernel",
            sources=[str(CSRC / "binding.cpp"), str(CSRC / "megakernel.cu")],
            extra_cuda_cflags=["-O3", "-std=c++17", arch],
            extra_include_paths=[str(CSRC)],
            build_directory=str(directory),
        )
    except (RuntimeError, OSError) as e:  # no nvcc, or the build failed
        raise MegakernelUnavailable(f"the megakernel could not be built ({e})") from None
    return _module


class KernelStep:
    """A DecoderStack's one-token step in the kernel: same weights, same KV cache, fp32 activations."""

    WEIGHTS = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
               "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
               "input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_norm.weight",
               "self_attn.k_norm.weight")

    def __init__(self, stack: DecoderStack):
        cfg = stack.cfg
        first = next(stack.parameters())
        if first.dtype != torch.bfloat16 or first.device.type != "cuda":
            raise MegakernelUnavailable(f"the megakernel runs bf16 weights on CUDA, got {first.dtype} on {first.device}")
        self.module = build()
        self.cfg = cfg
        self.dims = [cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim]
        params = [dict(layer.named_parameters()) for layer in stack.layers]
        pointers = [[layer[name].data_ptr() for name in self.WEIGHTS] for layer in params]
        self.layers = torch.tensor(pointers, dtype=torch.int64, device=first.device)
        self.final_norm = stack.norm.weight
        device = first.device
        empty = lambda n: torch.empty(n, dtype=torch.float32, device=device)  # noqa: E731
        self.x, self.qkv = empty(cfg.hidden_size), empty((cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim)
        self.attn, self.mlp = empty(cfg.num_heads * cfg.head_dim), empty(cfg.intermediate_size)
        self.blocks = self.module.plan_blocks(self.dims, MAX_POSITIONS)

    def __call__(self, x: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """x (1, hidden) -> final-normed hidden (1, hidden) in x's dtype; writes K/V at cache.length."""
        if cache.capacity > MAX_POSITIONS:
            raise RuntimeError(f"KV cache of {cache.capacity} positions exceeds the kernel's {MAX_POSITIONS}")
        out = torch.empty(self.cfg.hidden_size, dtype=torch.float32, device=x.device)
        self.module.decoder_step(self.layers, self.dims, self.cfg.rms_norm_eps, self.cfg.rope_theta, cache.k, cache.v,
                                 cache.length, x.reshape(-1).float().contiguous(), self.final_norm, self.x, self.qkv,
                                 self.attn, self.mlp, out, self.blocks)
        cache.length += 1
        return out.to(x.dtype)[None]


def attach(model: Qwen3TTS) -> None:
    """Run every single-token step of the talker and the code predictor in the kernel.

    Raises:
        MegakernelUnavailable: no CUDA GPU of compute capability 8.0+, no compiler, or non-bf16 weights.
    """
    for stack in (model.talker.model, model.talker.code_predictor.model):
        stack.kernel_step = KernelStep(stack)
