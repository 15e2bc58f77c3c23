"""The fused kernels of csrc/fused/: chains of eager ops in one launch each, where a multi-token forward (the
talker's prefill, the speech codec) keeps batched PyTorch GEMMs around them.

`attach(model)` gives every talker and code-predictor layer an AttentionPrologue (q/k RMSNorm, RoPE and the K/V cache
write: 16 eager kernels in one) and the model's RMSNorms (each with the residual add before it) and MLP activations
one launch each (FusedMLP: gate and up in one GEMM). `attach_codec(decoder)` does the same for the speech codec, its
SnakeBeta activations too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.tts.codec import Attention as CodecAttention, CodecDecoder, SnakeBeta
from engine.tts.kernels.build import build, require_bf16_cuda
from engine.tts.model import MLP, Attention, KVCache, Qwen3TTS, RMSNorm


class Stacked:
    """Linears of one input as one GEMM: their weights (and biases) stacked into one tensor, which they then view
    (the same values, held once: the separate copies are freed); a call returns each one's output, split back."""

    def __init__(self, *linears: torch.nn.Linear):
        with torch.no_grad():
            self.weight = torch.cat([linear.weight for linear in linears])
            self.bias = None if linears[0].bias is None else torch.cat([linear.bias for linear in linears])
        self.rows = [linear.weight.shape[0] for linear in linears]
        for linear, weight in zip(linears, self.weight.split(self.rows)):
            linear.weight.data = weight
        if self.bias is not None:
            for linear, bias in zip(linears, self.bias.split(self.rows)):
                linear.bias.data = bias

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x (rows, in) -> each linear's (rows, out), views of one output."""
        return F.linear(x, self.weight, self.bias).split(self.rows, dim=1)


class AttentionPrologue:
    """A multi-token Attention.forward up to its attention in two launches: q, k and v from one GEMM, then q and k
    RMSNorm'd per head and rotated and K and V written into the cache at its length
    (csrc/fused/attention_prologue.cu, rounding to bf16 after each step as model.py does). Returns q
    (heads, T, head_dim)."""

    def __init__(self, attention: Attention, module):
        self.qkv = Stacked(attention.q_proj, attention.k_proj, attention.v_proj)
        # the norms' weights, not the module: the module holds this object, and no reference cycle keeps it alive
        self.q_norm, self.k_norm, self.eps = attention.q_norm.weight, attention.k_norm.weight, attention.q_norm.eps
        self.module = module

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache,
                 layer: int) -> torch.Tensor:
        return self.module.attention_prologue(*self.qkv(x), self.q_norm, self.k_norm, cos, sin, cache.k, cache.v,
                                              layer, cache.length, self.eps)


class WindowPrologue:
    """The codec's Attention.forward in a stream, up to its attention, in four launches: q, k and v from one GEMM,
    the stream's kept keys and values copied into the window's first rows, then q and k rotated and the new keys and
    values written after them (attention_prologue.cu without the norm, the window as a one-layer cache). Returns q
    (1, heads, T, head_dim) and the window's keys and values (1, kv_heads, kept + T, head_dim)."""

    def __init__(self, attention: CodecAttention, module):
        self.qkv = Stacked(attention.q_proj, attention.k_proj, attention.v_proj)
        self.module = module

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, keys: torch.Tensor,
                 values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        kept, T = keys.shape[2], x.shape[1]
        windows = []
        for past in (keys, values):
            window = past.new_empty(1, past.shape[1], kept + T, past.shape[3])
            window[:, :, :kept].copy_(past)
            windows.append(window)
        q = self.module.attention_prologue(*self.qkv(x[0]), None, None, cos, sin, *windows, 0, kept, 0.0)
        return q[None], *windows


class FusedMLP:
    """model.py's MLP in three launches: gate and up from one GEMM, silu(gate) * up in one (csrc/fused/swiglu.cu,
    rounding as F.silu and the product do), then down_proj."""

    def __init__(self, mlp: MLP, module):
        self.gate_up = Stacked(mlp.gate_proj, mlp.up_proj)
        self.down_proj, self.module = mlp.down_proj, module  # a child of mlp: no reference cycle back to it

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x.reshape(-1, x.shape[-1]))
        return self.down_proj(self.module.swiglu(gate, up)).view(*x.shape[:-1], -1)


def _fuse(modules, module) -> None:
    """RMSNorms and MLPs among `modules` to the extension's kernels."""
    for m in modules:
        if isinstance(m, RMSNorm):
            m.kernel, m.add_kernel = module.rms_norm, module.add_rms_norm
        elif isinstance(m, MLP):
            m.fused = FusedMLP(m, module)


def attach(model: Qwen3TTS) -> None:
    """Run every multi-token forward's attention prologue, and the model's RMSNorms and MLP activations, in the
    extension's launches. Before the megakernel's attach: these move the q/k/v and gate/up weights, whose addresses
    its kernel steps keep.

    Raises:
        MegakernelUnavailable: no CUDA GPU of compute capability 8.0+, no compiler, or non-bf16 weights.
    """
    talker, predictor = model.talker.model, model.talker.code_predictor.model
    require_bf16_cuda(next(talker.parameters()))
    module = build()
    for layer in (*talker.layers, *predictor.layers):
        layer.self_attn.prologue = AttentionPrologue(layer.self_attn, module)
    _fuse(model.modules(), module)


def attach_codec(decoder: CodecDecoder) -> None:
    """Run the speech codec's SnakeBeta activations in one launch each (csrc/fused/snake.cu), not five, and its
    transformer's RMSNorms and MLPs as the talker's and its attention's projections, RoPE and window in a stream in
    four launches (WindowPrologue); before the decoder's first stream on CUDA, whose graphs keep the ops they were
    captured with.

    Raises:
        MegakernelUnavailable: no CUDA GPU of compute capability 8.0+, no compiler, or non-bf16 weights.
    """
    require_bf16_cuda(decoder.pre_conv.conv.weight)
    module = build()
    for m in decoder.modules():
        if isinstance(m, SnakeBeta):
            m.kernel = module.snake
        elif isinstance(m, CodecAttention):
            m.prologue = WindowPrologue(m, module)
    _fuse(decoder.modules(), module)
