"""The speech model on the CPU at the speed the processor allows: int8 or bfloat16 weights, chosen at load.

A decode frame reads every talker and code-predictor weight 16 times over (one talker step, 15 predictor
steps): 1.6 G weights for the 0.6B model, 6.3 GB in float32, so a CPU spends the frame waiting on memory.
`choose_precision` picks what this processor multiplies fastest, `quantize` swaps the linear layers of a
model loaded in float32 for int8 ones (4x fewer bytes, fbgemm's int8 GEMM) or prepacked bfloat16 ones, each
layer's q/k/v and gate/up stacked into one product (QKVPrologue, SwiGLU: the same outputs, bit for bit, from
fewer and larger calls). bench/tts_cpu.py measures the speed, bench/tts_cpu_quality.py the agreement with float32.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.tts.codec import CausalTransposedConv, CodecDecoder
from engine.tts.model import MLP, Attention, Qwen3TTS, rotate_half

PRECISIONS = ("auto", "float32", "bf16", "int8")


@dataclass(frozen=True)
class Precision:
    """How the speech engine computes; str() is the line a user is shown ("int8 weights, ...").

    setting: "float32", "bf16" or "int8" (load_tts's `precision`, "auto" resolved).
    weights: the talker's and code predictor's linear weights: "float32", "bfloat16" or "int8".
    activations: what flows between layers: "float32" or "bfloat16" (int8 layers quantize their input to
        8 bits inside each matrix product; the rest of the model runs at this width).
    codec: the speech codec's dtype: "float32" or "bfloat16".
    """

    setting: str
    weights: str
    activations: str
    codec: str

    def __str__(self) -> str:
        text = f"{self.weights} weights, {self.activations} activations"
        if self.weights == "int8":
            text = f"int8 weights and int8 products, {self.activations} activations"
        return f"{text}, {self.codec} codec"


def int8_problem() -> str | None:
    """Why this CPU has no int8 path (fbgemm needs x86 with AVX2), or None where it has one."""
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        return "this build of torch has no fbgemm int8 kernels"
    if not torch.cpu._is_avx2_supported():
        return f"fbgemm's int8 kernels need AVX2; this CPU offers {torch.backends.cpu.get_cpu_capability()}"
    return None


def native_bf16() -> bool:
    """Whether the CPU does bfloat16 arithmetic in hardware (AVX512-BF16 or AMX): elsewhere bf16 is emulated."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def choose_precision(setting: str) -> Precision:
    """Resolve load_tts's `precision` for the CPU.

    "auto": int8 weights where fbgemm runs (x86 with AVX2: 3-4x faster than bfloat16 and float32 on a
    memory-bound frame), else bfloat16 where the CPU has it natively, else float32. The codec is a
    compute-bound stack of convolutions: bfloat16 where native, float32 elsewhere and under "float32".

    Raises:
        ValueError: an unknown setting (listing the valid ones), or "int8" on a CPU without the int8 path.
    """
    if setting not in PRECISIONS:
        raise ValueError(f"unknown precision '{setting}'; choose one of: {', '.join(PRECISIONS)}")
    problem = int8_problem()
    if setting == "int8" and problem:
        raise ValueError(f"precision 'int8' is not available: {problem}; choose auto, bf16 or float32")
    if setting == "auto":
        setting = "int8" if problem is None else "bf16" if native_bf16() else "float32"
    codec = "bfloat16" if setting != "float32" and native_bf16() else "float32"
    if setting == "float32":
        return Precision("float32", "float32", "float32", "float32")
    if setting == "bf16":
        return Precision("bf16", "bfloat16", "bfloat16", codec)
    return Precision("int8", "int8", "float32", codec)


def _stacked(linears: tuple[nn.Linear, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The weights (out, in) and biases (out,) or None of linears of one input, stacked by rows: one layer whose
    output is theirs side by side."""
    weight = torch.cat([linear.weight.detach() for linear in linears])
    biases = [linear.bias for linear in linears]
    if any(bias is None for bias in biases):
        assert all(bias is None for bias in biases), "stacked linears have a bias each or none"
        return weight, None
    return weight, torch.cat([bias.detach() for bias in biases])


class Int8Linear(nn.Module):
    """A linear layer with int8 weights, one scale per output channel (symmetric, rounded to nearest); given several
    linears of one input, their outputs side by side from one product.

    fbgemm multiplies int8 by int8: each call quantizes its input to 8 bits with one scale (7 bits without
    VNNI, whose absence makes 8-bit products saturate), so a step reads a quarter of float32's bytes. Stacked
    linears give the same outputs as separate ones (one input scale, a scale per output channel either way).
    """

    def __init__(self, *linears: nn.Linear):
        super().__init__()
        weight, bias = _stacked(linears)
        weight = weight.float()  # (out, in)
        scale = weight.abs().amax(dim=1).clamp(min=1e-12) / 127  # (out,)
        ints = torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8)
        self.out_features, self.in_features = weight.shape
        self.pack(ints, scale, None if bias is None else bias.float())
        self.reduce_range = not torch.cpu._is_vnni_supported()

    def pack(self, ints: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> None:
        """Take int8 weights (out, in) and their float scales (out,): fbgemm's packed layout holds both."""
        zeros = torch.zeros(ints.shape[0], dtype=torch.long)
        with warnings.catch_warnings():
            # quantized tensors are deprecated (https://github.com/pytorch/pytorch/issues/184982), but fbgemm's
            # prepack takes nothing else in torch 2.13; the packed weight is all that is kept
            warnings.simplefilter("ignore", UserWarning)
            weight = torch._make_per_channel_quantized_tensor(ints, scale.double(), zeros, 0)
        self.packed = torch.ops.quantized.linear_prepack(weight, bias)

    def unpack(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(int8 weights (out, in), scales (out,) float32, bias or None): what pack() took."""
        weight, bias = torch.ops.quantized.linear_unpack(self.packed)
        return weight.int_repr(), weight.q_per_channel_scales().float(), bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:  # the decoder layers' (T, in) as it is: a reshape and a view are 4 of a call's ~20 us
            return torch.ops.quantized.linear_dynamic(x, self.packed, self.reduce_range)
        rows = x.reshape(-1, x.shape[-1])  # fbgemm takes 2-D input
        return torch.ops.quantized.linear_dynamic(rows, self.packed, self.reduce_range).view(*x.shape[:-1], -1)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


class BF16Linear(nn.Module):
    """A bfloat16 linear layer whose weight oneDNN has reordered once for its kernels (F.linear reorders it on
    every call: 0.6 against 1.0 ms for a 3072 x 1024 matrix-vector product on one AVX512-BF16 core); given several
    linears of one input, their outputs side by side from one product."""

    def __init__(self, *linears: nn.Linear):
        super().__init__()
        weight, bias = _stacked(linears)
        weight = weight.to(torch.bfloat16)
        self.out_features, self.in_features = weight.shape
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, 1)
        self.bias = None if bias is None else bias.to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


class QKVPrologue(nn.Module):
    """Attention.project (as Attention.prologue) with q, k and v from one product, and q and k
    RMSNorm'd and rotated together: model.py's arithmetic in fewer, larger ops. Each fbgemm call costs about 15 us
    whatever its size and reads a wide matrix faster than narrow ones, and a frame runs 108 decoder layers: this
    and SwiGLU took the 0.6B model's code-predictor frame from 99 to 86 ms on one core (talker step 34 to 32)."""

    def __init__(self, attention: Attention, linear: type[nn.Module]):
        super().__init__()
        D = attention.head_dim
        self.qkv = linear(attention.q_proj, attention.k_proj, attention.v_proj)
        self.heads, kv_heads = attention.q_proj.out_features // D, attention.k_proj.out_features // D
        assert attention.q_norm.eps == attention.k_norm.eps
        self.head_dim, self.eps = D, attention.q_norm.eps
        # per head, as the two norms apply them: (heads + kv_heads, D)
        weight = torch.cat((attention.q_norm.weight.expand(self.heads, D), attention.k_norm.weight.expand(kv_heads, D)))
        self.register_buffer("qk_norm_weight", weight.detach().clone())

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Attention.project: x (T, hidden) -> q (heads, T, head_dim), k and v (kv_heads, T, head_dim)."""
        T, D = x.shape[0], self.head_dim
        qkv = self.qkv(x).view(T, -1, D)  # (T, heads + 2 kv_heads, D)
        qk_heads = self.qk_norm_weight.shape[0]
        # as RMSNorm.forward: the norm rounded to the input's dtype, then its weight
        qk = (self.qk_norm_weight * F.rms_norm(qkv[:, :qk_heads], (D,), eps=self.eps)).transpose(0, 1)
        qk = qk * cos + rotate_half(qk) * sin  # (heads + kv_heads, T, D)
        return qk[: self.heads], qk[self.heads :], qkv[:, qk_heads:].transpose(0, 1)


class SwiGLU(nn.Module):
    """MLP.forward (MLP.fused) with gate and up from one product: down(silu(gate) * up)."""

    def __init__(self, mlp: MLP, linear: type[nn.Module]):
        super().__init__()
        self.gate_up = linear(mlp.gate_proj, mlp.up_proj)
        self.down_proj = linear(mlp.down_proj)
        self.intermediate = mlp.gate_proj.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).split(self.intermediate, dim=-1)
        return self.down_proj(F.silu(gate) * up)


def quantize(model: Qwen3TTS, precision: Precision) -> None:
    """Swap the linear layers that run every frame (talker and code-predictor layers, their heads) in place.

    Each decoder layer's attention gets a QKVPrologue and its MLP a SwiGLU, which hold its q/k/v and MLP weights;
    the other linears are swapped one for one. The model is loaded in float32 for "int8", in bfloat16 for "bf16";
    the text projection runs once per prompt and keeps its dtype. Under "float32", or "bf16" without native
    bfloat16, nothing changes, nor on a GPU, whose bfloat16 runs as loaded (the swapped layers are CPU kernels).
    """
    if model.talker.codec_head.weight.device.type != "cpu":
        return
    if precision.weights == "int8":
        swap = Int8Linear
    elif precision.weights == "bfloat16" and native_bf16():
        swap = BF16Linear
    else:
        return
    talker = model.talker
    for layer in (*talker.model.layers, *talker.code_predictor.model.layers):
        attention, mlp = layer.self_attn, layer.mlp
        attention.prologue, mlp.fused = QKVPrologue(attention, swap), SwiGLU(mlp, swap)
        # their weights are in the prologue's and the SwiGLU's products now: held once
        attention.q_proj = attention.k_proj = attention.v_proj = None
        mlp.gate_proj = mlp.up_proj = mlp.down_proj = None
    for root in (talker.model.layers, talker.code_predictor):
        for module in list(root.modules()):
            for name, child in list(module.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(module, name, swap(child))
    talker.codec_head = swap(talker.codec_head)


class TransposedConvMatmul:
    """A ConvTranspose1d (stride s, kernel m * s, no padding) on short inputs as one matrix product and m shifted adds.

    oneDNN's transposed convolution costs about as much for 4 input samples as for 16 (55-60 ms for the first
    decoder block's 1536 -> 768, kernel 16 on one core, weights in bfloat16): it reorders the 19M-weight kernel
    on each call. Here each input sample times the weights gives its m * s output samples in one product
    (7 ms), and their overlaps add. Longer inputs, where the convolution is as fast or faster, take the convolution.
    """

    MAX_SAMPLES = 64  # input samples; on one core the two are even at 128 and the convolution wins beyond

    def __init__(self, conv: nn.ConvTranspose1d, linear: type[nn.Module]):
        weight = conv.weight.detach()  # (in, out, kernel)
        self.conv, self.out_channels, self.stride = conv, weight.shape[1], conv.stride[0]
        self.taps = weight.shape[2] // self.stride  # m: input samples that reach one output sample
        assert weight.shape[2] == self.taps * self.stride and conv.padding == (0,) and conv.groups == 1
        flat = nn.Linear(weight.shape[0], weight.shape[1] * weight.shape[2], bias=False, dtype=weight.dtype)
        flat.weight = nn.Parameter(weight.flatten(1).T.contiguous(), requires_grad=False)  # (out * kernel, in)
        self.linear = linear(flat) if linear is not nn.Linear else flat

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, in, T) -> the convolution's output (B, out, (T + m - 1) * stride), bias added."""
        B, _, T = x.shape
        if T > self.MAX_SAMPLES:
            return self.conv(x)
        cols = self.linear(x.transpose(1, 2)).view(B, T, self.out_channels, self.taps, self.stride)
        y = x.new_zeros(B, self.out_channels, T + self.taps - 1, self.stride)
        for tap in range(self.taps):  # tap j of input sample t lands at output block t + j
            y[:, :, tap:tap + T] += cols[:, :, :, tap].transpose(1, 2)
        return y.flatten(2) + self.conv.bias[:, None]


def speed_up_codec(decoder: CodecDecoder) -> None:
    """Give the codec's transposed convolutions their matrix-product form for short chunks and, where it runs in
    bfloat16 on a CPU that has it natively, its linear layers (attention, MLPs, ConvNeXt) oneDNN's prepacked weights.
    The same arithmetic: the output differs from the plain decoder's by rounding only."""
    linear = BF16Linear if decoder.pre_conv.conv.weight.dtype == torch.bfloat16 and native_bf16() else nn.Linear
    for module in list(decoder.modules()):
        if isinstance(module, CausalTransposedConv):
            module.matmul = TransposedConvMatmul(module.conv, linear)
        if linear is BF16Linear:
            for name, child in list(module.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(module, name, BF16Linear(child))
