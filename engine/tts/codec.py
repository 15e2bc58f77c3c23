"""The Qwen3-TTS 12 Hz speech-tokenizer decoder: codec codes (16 per 80 ms frame) -> 24 kHz PCM.

Weights and sizes come from a checkpoint's `speech_tokenizer/` folder (config.json, model.safetensors);
the math follows the official `qwen_tts` Qwen3TTSTokenizerV2Decoder and equals it on the same weights.
Every stage is causal, so the decoder also runs as a stream: each module's `forward(x, state)` takes
an optional StreamState holding what it carries between calls (conv input tails, transposed-conv
overlaps, attention keys/values, the frame position) in fixed-size tensors that it updates in place.
Without a state it is the official full forward; with one, decoding frame by frame (or in any chunks)
equals a full decode to float rounding, and each frame costs one frame of work. Fixed shapes and
addresses make a stream call on CUDA one captured graph per chunk length (ChunkGraphs), replayed
instead of the hundreds of small launches it takes eagerly.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from engine.errors import ModelFilesError
from engine.tts.checkpoint import load_weights
from engine.tts.config import read_json
from engine.tts.graphs import GraphSet
from engine.tts.model import MLP, RMSNorm, rotate_half

__all__ = ["CodecConfig", "CodecDecoder", "CodecStream", "StreamState", "load_codec"]

# Architecture constants of the official decoder (hard-coded in qwen_tts, not in config.json).
_SEMANTIC_QUANTIZERS = 1  # SplitResidualVectorQuantizer(n_q_semantic=1): codebook 0, then the rest
_CODEBOOK_EPSILON = 1e-5  # EuclideanCodebook clamps cluster_usage to at least this before dividing
_PRE_CONV_KERNEL = 3
_CONVNEXT_KERNEL = 7
_CONVNEXT_EXPANSION = 4
_LAYER_NORM_EPS = 1e-6
_DECODER_KERNEL = 7  # the decoder's first and last conv and each residual unit's dilated conv
_RESIDUAL_DILATIONS = (1, 3, 9)

# Attention kernels allowed: not cuDNN's, which rebuilt its plan on every masked call (~5 ms of host
# time per layer per streamed frame, bf16 on an H200 with torch 2.11): more than the whole frame's GPU work.
_ATTENTION_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]

_DECODER_KEYS = {
    "codebook_size": int,
    "codebook_dim": int,
    "num_quantizers": int,
    "latent_dim": int,
    "hidden_size": int,
    "num_hidden_layers": int,
    "num_attention_heads": int,
    "num_key_value_heads": int,
    "intermediate_size": int,
    "hidden_act": str,
    "rms_norm_eps": float,
    "rope_theta": float,
    "sliding_window": int,
    "attention_bias": bool,
    "layer_scale_initial_scale": float,
    "upsampling_ratios": tuple,
    "upsample_rates": tuple,
    "decoder_dim": int,
}


@dataclass(frozen=True)
class CodecConfig:
    """The decoder's sizes, read from `speech_tokenizer/config.json` (decoder_config keeps its names)."""

    sample_rate_hz: int  # output_sample_rate
    frame_samples: int  # decode_upsample_rate: 1920 samples = 80 ms at 24 kHz
    codebook_size: int
    codebook_dim: int  # width of the dequantized frame; each codebook holds codebook_dim // 2
    num_quantizers: int
    latent_dim: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    sliding_window: int  # a query sees itself and the sliding_window - 1 frames before it
    attention_bias: bool
    layer_scale_initial_scale: float  # only used to initialize random weights
    upsampling_ratios: tuple[int, ...]  # transposed conv + ConvNeXt stages at latent_dim
    upsample_rates: tuple[int, ...]  # DAC-style blocks, each halving the channels
    decoder_dim: int

    def __post_init__(self):
        if self.num_quantizers <= _SEMANTIC_QUANTIZERS:
            raise ValueError(f"decoder_config.num_quantizers must be >= 2, got {self.num_quantizers}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"decoder_config.num_attention_heads ({self.num_attention_heads}) must be a multiple "
                f"of num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"decoder_config.head_dim must be even for RoPE, got {self.head_dim}")
        if self.sliding_window < 1:
            raise ValueError(f"decoder_config.sliding_window must be >= 1, got {self.sliding_window}")
        upsampling = math.prod(self.upsampling_ratios) * math.prod(self.upsample_rates)
        if upsampling != self.frame_samples:
            raise ValueError(
                f"decode_upsample_rate is {self.frame_samples}, but decoder_config's upsampling_ratios "
                f"{list(self.upsampling_ratios)} and upsample_rates {list(self.upsample_rates)} "
                f"multiply to {upsampling}"
            )

    @classmethod
    def from_file(cls, path: str | Path) -> CodecConfig:
        """Read a codec config.json in the layout the official Qwen3TTSTokenizerV2Config saves.

        Args:
            path: the `speech_tokenizer/config.json` file.
        Returns:
            The decoder's config.
        Raises:
            ModelFilesError: the file is missing or not JSON, a key is missing or of the wrong
                type, or the values contradict each other; the message names file and key.
        """
        path = Path(path)
        data = read_json(path)
        decoder = _read(path, data, "decoder_config", dict, "")
        values = {key: _read(path, decoder, key, kind, "decoder_config.") for key, kind in _DECODER_KEYS.items()}
        if values.pop("hidden_act") != "silu":
            raise ModelFilesError(
                f"{path}: decoder_config.hidden_act is {decoder['hidden_act']!r}; Parley's codec supports 'silu'"
            )
        rope_scaling = decoder.get("rope_scaling")
        if rope_scaling is not None and (
            not isinstance(rope_scaling, dict) or rope_scaling.get("rope_type", rope_scaling.get("type")) != "default"
        ):
            raise ModelFilesError(
                f"{path}: decoder_config.rope_scaling is {rope_scaling!r}; Parley's codec supports default RoPE only"
            )
        # The official attention falls back to hidden_size // num_attention_heads when head_dim is absent.
        if "head_dim" in decoder:
            head_dim = _read(path, decoder, "head_dim", int, "decoder_config.")
        else:
            head_dim = values["hidden_size"] // values["num_attention_heads"]
        try:
            return cls(
                sample_rate_hz=_read(path, data, "output_sample_rate", int, ""),
                frame_samples=_read(path, data, "decode_upsample_rate", int, ""),
                head_dim=head_dim,
                **values,
            )
        except ValueError as e:
            raise ModelFilesError(f"{path}: {e}") from None


def _read(path: Path, section: dict, key: str, kind: type, where: str) -> Any:
    """One typed value of a config section; a missing or mistyped key names the file and the key."""
    if key not in section:
        raise ModelFilesError(f"{path}: missing key {where}{key}")
    value = section[key]
    if kind is tuple:
        ok = isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        value = tuple(value) if ok else value
        expected = "a list of integers"
    elif kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
        expected = "a number"
    else:
        ok = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
        expected = {int: "an integer", bool: "true or false", str: "a string", dict: "an object"}[kind]
    if not ok:
        raise ModelFilesError(f"{path}: {where}{key} is {value!r}, expected {expected}")
    return value


# ---- quantizer: codes -> (B, codebook_dim, T); nesting mirrors the official state-dict keys ----


class Folded(nn.Module):
    """A module with values that are functions of its weights alone (fold), computed when the weights are made,
    loaded or moved (not in place: whoever writes them in place calls fold) instead of in every call."""

    def __init__(self):
        super().__init__()
        self.register_load_state_dict_post_hook(lambda module, _: module.fold())

    def fold(self) -> None:
        raise NotImplementedError

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        self.fold()  # from the converted weights, as the official computes them in their dtype
        return self


class Codebook(Folded):
    """One codebook stored as running sums: an entry is embedding_sum / max(cluster_usage, eps)."""

    def __init__(self, size: int, dim: int):
        super().__init__()
        self.cluster_usage = nn.Parameter(torch.ones(size))
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))
        self.fold()

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """(B, T) int64 -> (B, T, dim)."""
        return F.embedding(codes, self._entries)

    def fold(self) -> None:
        """The entries, divided as the official divides them (each the same two operands, so its value bit for bit):
        a call gathers them in one kernel, not four."""
        with torch.no_grad():
            self._entries = self.embedding_sum / self.cluster_usage.clamp(min=_CODEBOOK_EPSILON)[:, None]


class CodebookLayer(nn.Module):
    """The official VectorQuantization: a codebook (its project_out is the identity in this model)."""

    def __init__(self, size: int, dim: int):
        super().__init__()
        self._codebook = Codebook(size, dim)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        return self._codebook(codes)


class CodebookStack(nn.Module):
    """The official ResidualVectorQuantization: residual codebooks whose entries add up."""

    def __init__(self, count: int, size: int, dim: int):
        super().__init__()
        self.layers = nn.ModuleList(CodebookLayer(size, dim) for _ in range(count))

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """(B, count, T) -> (B, dim, T), summed in codebook order like the official."""
        total = self.layers[0](codes[:, 0])
        for index in range(1, len(self.layers)):
            total = total + self.layers[index](codes[:, index])
        return total.transpose(1, 2)


class ResidualQuantizer(nn.Module):
    """The official ResidualVectorQuantizer: codebooks at codebook_dim // 2, projected back up."""

    def __init__(self, count: int, config: CodecConfig):
        super().__init__()
        inner = config.codebook_dim // 2
        # input_proj only serves encoding (audio -> codes); it is here so strict loading checks it.
        self.input_proj = nn.Conv1d(config.codebook_dim, inner, 1, bias=False)
        self.output_proj = nn.Conv1d(inner, config.codebook_dim, 1, bias=False)
        self.vq = CodebookStack(count, config.codebook_size, inner)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        return self.output_proj(self.vq(codes))


class SplitQuantizer(nn.Module):
    """The official SplitResidualVectorQuantizer: the semantic codebook 0, then the acoustic rest."""

    def __init__(self, config: CodecConfig):
        super().__init__()
        self.rvq_first = ResidualQuantizer(_SEMANTIC_QUANTIZERS, config)
        self.rvq_rest = ResidualQuantizer(config.num_quantizers - _SEMANTIC_QUANTIZERS, config)

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """(B, num_quantizers, T) int64 -> (B, codebook_dim, T)."""
        first = self.rvq_first(codes[:, :_SEMANTIC_QUANTIZERS])
        return first + self.rvq_rest(codes[:, _SEMANTIC_QUANTIZERS:])


# ---- causal convolutions: the only places besides attention that look back in time ----


class CausalConv(nn.Module):
    """The official CausalConvNet (stride 1): a Conv1d fed `context` past samples, zeros at the start."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, dilation: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, dilation=dilation, groups=groups)
        self.context = (kernel_size - 1) * dilation

    def state_shapes(self) -> tuple[tuple[int, ...], ...]:
        """A stream keeps the last `context` input samples: (1, in_channels, context)."""
        return ((1, self.conv.in_channels, self.context),) if self.context else ()

    def forward(self, x: torch.Tensor, state: StreamState | None = None) -> torch.Tensor:
        """(B, C, T) -> (B, out_channels, T); B = 1 with a state."""
        if not self.context:
            return self.conv(x)
        if state is None:
            x = F.pad(x, (self.context, 0))  # the official left padding
        else:
            (past,) = state[self]  # (1, C, context); a fresh stream's zeros are the full decode's padding
            x = torch.cat([past, x], dim=-1)  # (1, C, context + T)
            past.copy_(x[..., x.shape[-1] - self.context :])
        return self.conv(x)


class CausalTransposedConv(nn.Module):
    """The official CausalTransConvNet: ConvTranspose1d with its last kernel - stride samples cut.

    Output samples [i*stride, (i+1)*stride) then depend on input frames <= i only, so they are final
    once frame i arrives; the cut tail is the overlap that the next frames add to, so a stream keeps
    it (without the bias, which the next call adds again) and adds it to the next call's head.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int):
        super().__init__()
        self.conv = nn.ConvTranspose1d(in_channels, out_channels, kernel_size, stride=stride)
        self.stride = stride
        self.overlap = kernel_size - stride  # output samples that reach into the next call's
        # set by engine.tts.cpu.speed_up_codec: x -> self.conv(x) as one matrix product, faster on a CPU for short x
        self.matmul = None

    def state_shapes(self) -> tuple[tuple[int, ...], ...]:
        """A stream keeps the overlap, bias excluded: (1, out_channels, kernel - stride)."""
        return ((1, self.conv.out_channels, self.overlap),) if self.overlap else ()

    def forward(self, x: torch.Tensor, state: StreamState | None = None) -> torch.Tensor:
        """(B, C, T) -> (B, out_channels, T * stride); B = 1 with a state."""
        y = self.conv(x) if self.matmul is None else self.matmul(x)  # (B, out, T * stride + overlap)
        length = x.shape[-1] * self.stride
        if state is not None and self.overlap:
            (overlap,) = state[self]  # (1, out, overlap); zeros at a stream's start, and adding zeros changes nothing
            y[..., : self.overlap] += overlap
            overlap.copy_(y[..., length:] - self.conv.bias[:, None])
        return y[..., :length]


class SnakeBeta(Folded):
    """x + sin^2(x * e^alpha) / (e^beta + 1e-9) per channel, as the official; pointwise in time, so nothing to carry."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))
        self.fold()
        # set by engine.tts.kernels.fused.attach_codec: (x, frequency, inverse_beta) -> this forward, in one CUDA launch
        self.kernel = None

    def forward(self, x: torch.Tensor, state: StreamState | None = None) -> torch.Tensor:
        if self.kernel is not None:
            return self.kernel(x, self._frequency, self._inverse_beta)
        return x + self._inverse_beta * torch.sin(x * self._frequency).pow(2)

    def fold(self) -> None:
        """e^alpha and 1 / (e^beta + 1e-9), (1, C, 1): 4 of a call's 9 kernels, were they computed in it."""
        with torch.no_grad():
            self._frequency = self.alpha.exp()[None, :, None]
            self._inverse_beta = 1.0 / (self.beta.exp()[None, :, None] + 1e-9)


class ConvNeXtBlock(nn.Module):
    """The official ConvNeXtBlock: causal depthwise conv, LayerNorm, GELU MLP, gamma, residual."""

    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = CausalConv(dim, dim, _CONVNEXT_KERNEL, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=_LAYER_NORM_EPS)
        self.pwconv1 = nn.Linear(dim, _CONVNEXT_EXPANSION * dim)
        self.pwconv2 = nn.Linear(_CONVNEXT_EXPANSION * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x: torch.Tensor, state: StreamState | None = None) -> torch.Tensor:
        h = self.dwconv(x, state).transpose(1, 2)  # (B, T, dim)
        h = self.pwconv2(F.gelu(self.pwconv1(self.norm(h))))
        return x + (self.gamma * h).transpose(1, 2)


class ResidualUnit(nn.Module):
    """The official DecoderResidualUnit: Snake, dilated causal conv, Snake, 1x1 conv, residual."""

    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv(dim, dim, _DECODER_KERNEL, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv(dim, dim, 1)

    def forward(self, x: torch.Tensor, state: StreamState | None = None) -> torch.Tensor:
        h = self.conv1(self.act1(x), state)
        return x + self.conv2(self.act2(h), state)


class DecoderBlock(nn.Module):
    """The official DecoderDecoderBlock: Snake, transposed conv by `rate` halving channels, 3 residual units."""

    def __init__(self, in_dim: int, out_dim: int, rate: int):
        super().__init__()
        units = [ResidualUnit(out_dim, dilation) for dilation in _RESIDUAL_DILATIONS]
        self.block = nn.ModuleList([SnakeBeta(in_dim), CausalTransposedConv(in_dim, out_dim, 2 * rate, rate), *units])

    def forward(self, x: torch.Tensor, state: StreamState | None = None) -> torch.Tensor:
        for module in self.block:
            x = module(x, state)
        return x


# ---- the pre-transformer: sliding-window causal attention over frames ----


class LayerScale(nn.Module):
    """A learnt per-channel scale on a residual branch (applied by the norm that adds the branch: RMSNorm.add)."""

    def __init__(self, dim: int, initial: float):
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), initial))


class Attention(nn.Module):
    """Causal self-attention over a sliding window; a stream keeps the last window - 1 keys and values."""

    def __init__(self, config: CodecConfig):
        super().__init__()
        heads, kv_heads, head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, heads * head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_heads * head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_heads * head_dim, bias=bias)
        self.o_proj = nn.Linear(heads * head_dim, config.hidden_size, bias=bias)
        self.head_dim = head_dim
        self.kv_heads = kv_heads
        self.groups = heads // kv_heads
        self.kept = config.sliding_window - 1
        # set by engine.tts.kernels.fused.attach_codec: a stream's projections, RoPE and window below in four CUDA
        # launches
        self.prologue = None

    def state_shapes(self) -> tuple[tuple[int, ...], ...]:
        """A stream keeps the last sliding_window - 1 keys and values: (1, kv_heads, window - 1, head_dim) each."""
        shape = (1, self.kv_heads, self.kept, self.head_dim)
        return shape, shape

    def forward(self, x, cos, sin, mask, state: StreamState | None = None) -> torch.Tensor:
        """x (B, T, hidden); cos, sin (T, head_dim); mask (T, keys) bool, True = may attend, where the
        keys are the T frames alone, or with a state its window - 1 kept frames and then the T (B = 1)."""
        B, T, _ = x.shape  # batch, new frames
        if state is not None and self.prologue is not None:
            q, k, v = self.prologue(x, cos, sin, *state[self])
        else:
            q = self.q_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, H, T, D)
            k = self.k_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, KV, T, D)
            v = self.v_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
            if state is not None:
                keys, values = state[self]  # (1, KV, window - 1, D) each, oldest first
                k, v = torch.cat([keys, k], dim=2), torch.cat([values, v], dim=2)  # (1, KV, window - 1 + T, D)
        if state is not None:
            keys, values = state[self]
            keys.copy_(k[:, :, T:])
            values.copy_(v[:, :, T:])
        if self.groups > 1:
            k, v = k.repeat_interleave(self.groups, dim=1), v.repeat_interleave(self.groups, dim=1)
        with sdpa_kernel(_ATTENTION_BACKENDS):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # scale 1/sqrt(D), as the official
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))


class TransformerLayer(nn.Module):
    """Pre-norm attention and MLP, each residual branch scaled by a LayerScale."""

    def __init__(self, config: CodecConfig):
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn_layer_scale = LayerScale(config.hidden_size, config.layer_scale_initial_scale)
        self.mlp_layer_scale = LayerScale(config.hidden_size, config.layer_scale_initial_scale)

    def forward(self, x, branch, cos, sin, mask, state: StreamState | None = None):
        """The stream x plus the previous layer's MLP branch (its output and LayerScale; (None, None) in the first
        layer) -> (the stream after this layer's attention, this layer's MLP branch): x + scale * attention(norm(x)),
        then + scale * mlp(norm(x)), each add left to the norm after it (RMSNorm.add: one launch in the kernel)."""
        x, h = self.input_layernorm.add(x, *branch)
        attention = self.self_attn(h, cos, sin, mask, state)
        x, h = self.post_attention_layernorm.add(x, attention, self.self_attn_layer_scale.scale)
        return x, (self.mlp(h), self.mlp_layer_scale.scale)


class Transformer(nn.Module):
    """The official DecoderTransformerModel: latent -> hidden, sliding-window layers, norm, -> latent."""

    def __init__(self, config: CodecConfig):
        super().__init__()
        self.input_proj = nn.Linear(config.latent_dim, config.hidden_size)
        self.layers = nn.ModuleList(TransformerLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.output_proj = nn.Linear(config.hidden_size, config.latent_dim)
        self.window = config.sliding_window
        self.head_dim = config.head_dim
        self.rope_theta = config.rope_theta

    def forward(self, x: torch.Tensor, state: StreamState | None = None) -> torch.Tensor:
        """(B, T, latent_dim) -> (B, T, latent_dim); a stream starts at state.position and advances it by T."""
        T = x.shape[1]  # new frames
        queries = keys = torch.arange(T, device=x.device)  # (T,) positions: a full decode's frames see each other
        if state is not None:  # on the device, so that a CUDA graph replays at every position
            keys = torch.arange(1 - self.window, T, device=x.device) + state.position  # (window - 1 + T,): kept, new
            queries = queries + state.position
        # a query sees itself and the window - 1 frames before it; the slots a stream has kept from before
        # its frame 0 hold zeros, not frames, and are masked out
        mask = (keys[None, :] <= queries[:, None]) & (keys[None, :] > queries[:, None] - self.window) & (keys >= 0)
        cos, sin = self._rope(queries, x.dtype)
        h, branch = self.input_proj(x), (None, None)
        for layer in self.layers:
            h, branch = layer(h, branch, cos, sin, mask, state)
        if state is not None:
            state.position.add_(T)
        return self.output_proj(self.norm.add(h, *branch)[1])

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (T, head_dim) at absolute positions, computed in float32 like the official."""
        exponents = torch.arange(0, self.head_dim, 2, device=positions.device).float() / self.head_dim
        inv_freq = 1.0 / (self.rope_theta**exponents)
        angles = positions.float()[:, None] * inv_freq[None, :]
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)


# ---- the whole decoder ----


class CodecDecoder(nn.Module):
    """Codes -> waveform. Attribute names are the official `decoder.*` state-dict keys without the prefix.

    Its streams share one StreamState (and on CUDA its ChunkGraphs, which replay on it): see stream().
    """

    def __init__(self, config: CodecConfig):
        super().__init__()
        self.config = config
        latent = config.latent_dim
        self.quantizer = SplitQuantizer(config)
        self.pre_conv = CausalConv(config.codebook_dim, latent, _PRE_CONV_KERNEL)
        self.pre_transformer = Transformer(config)
        self.upsample = nn.ModuleList(
            nn.ModuleList([CausalTransposedConv(latent, latent, ratio, ratio), ConvNeXtBlock(latent)])
            for ratio in config.upsampling_ratios
        )
        dims = [config.decoder_dim // 2**i for i in range(len(config.upsample_rates) + 1)]
        blocks = [DecoderBlock(dims[i], dims[i + 1], rate) for i, rate in enumerate(config.upsample_rates)]
        self.decoder = nn.ModuleList(
            [
                CausalConv(latent, config.decoder_dim, _DECODER_KERNEL),
                *blocks,
                SnakeBeta(dims[-1]),
                CausalConv(dims[-1], 1, _DECODER_KERNEL),
            ]
        )
        # on CUDA, made on first use: the stream call's graphs, which its streams replay (each on its own state)
        self._graphs: ChunkGraphs | None = None

    def forward(self, codes: torch.Tensor, state: StreamState | None = None) -> torch.Tensor:
        """(frames, num_quantizers) int64 -> (frames * frame_samples,) float32 in [-1, 1].

        Without a state this is the official forward; with one it continues the stream the state holds,
        updating the state in place (nothing else is allocated outside the call or read from the host,
        so a CUDA graph can capture it).
        """
        self.check_codes(codes)
        codes = codes.to(self.pre_conv.conv.weight.device).T[None]  # (1, Q, frames)
        x = self.pre_conv(self.quantizer(codes), state)  # (1, latent, frames)
        x = self.pre_transformer(x.transpose(1, 2), state).transpose(1, 2)
        for stage in self.upsample:
            for module in stage:
                x = module(x, state)
        for module in self.decoder:
            x = module(x, state)
        return x.clamp(min=-1, max=1)[0, 0].float()

    def check_codes(self, codes: torch.Tensor) -> None:
        """Raises ValueError unless codes is an integer tensor of shape (frames >= 1, num_quantizers)."""
        Q = self.config.num_quantizers
        if codes.dim() != 2 or codes.shape[0] < 1 or codes.shape[1] != Q or codes.is_floating_point():
            raise ValueError(
                f"codes must be an integer tensor of shape (frames >= 1, {Q}), "
                f"got {codes.dtype} of shape {tuple(codes.shape)}"
            )

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """Decode a whole utterance at once, as the official decoder's forward does.

        Attention is dense over all frames (masked to the window), so memory grows with frames^2;
        for long or live audio use `stream()`.

        Args:
            codes: (frames, num_quantizers) integer codes, each in [0, codebook_size).
        Returns:
            (frames * frame_samples,) float32 samples at sample_rate_hz, clamped to [-1, 1],
            on the decoder's device.
        Raises:
            ValueError: codes are not an integer tensor of that shape.
        """
        return self(codes)

    def stream(self, eager: bool = False) -> CodecStream:
        """A stateful decoder over this one's weights, for frames that arrive a few at a time.

        Each stream has a StreamState of its own, so streams may be interleaved call by call: one call at a
        time (a decoder is not thread-safe; TTSEngine's streams call it in their turns). On CUDA a call replays
        the decoder's graphs (one per chunk length, captured on the length's first use or by warm_up), which run
        on a state of their own: the calling stream's is copied in where another stream's is there.

        Args:
            eager: run op by op even on CUDA: the same code without graphs, the reference they are
                checked against. On the CPU every stream runs eagerly.
        """
        return CodecStream(self, eager)

    @torch.inference_mode()
    def context(self, codes: torch.Tensor) -> StreamState:
        """The state a stream is in once it has decoded `codes` (frames, num_quantizers), decoded now, eagerly, on a
        state of its own (no stream's is touched). A stream that goes on from it (CodecStream.continue_from) decodes
        what follows as a decode of codes + what follows would, without their audio: the official cloned voice's
        decode, which puts the recording's codes first and cuts their audio off.

        Raises:
            ValueError: codes are not an integer tensor of that shape.
        """
        state = StreamState(self)
        self(codes, state)
        return state

    @torch.inference_mode()
    def warm_up(self, chunk_frames: Iterable[int]) -> None:
        """On CUDA, capture the stream graphs for chunks of these many frames now, not on first use.

        A capture costs about three eager stream calls and the capture itself; it changes neither a live
        stream's state nor its output. On the CPU there is nothing to capture.

        Args:
            chunk_frames: chunk lengths (frames per stream call); those already captured are skipped.
        Raises:
            ValueError: a chunk length below 1.
        """
        lengths = list(chunk_frames)
        if any(frames < 1 for frames in lengths):
            raise ValueError(f"chunk lengths must be >= 1 frame, got {lengths}")
        graphs = self._chunk_graphs()
        if graphs is not None:
            for frames in lengths:
                graphs.graph(frames)

    @property
    def captured_chunks(self) -> list[int]:
        """The chunk lengths (frames per call) whose stream graphs exist, smallest first; [] on the CPU."""
        return self._graphs.captured if self._graphs is not None else []

    def _chunk_graphs(self) -> ChunkGraphs | None:
        """The stream call's graphs, made on first use; None on the CPU, where streams run eagerly."""
        if self._graphs is None and self.pre_conv.conv.weight.is_cuda:
            self._graphs = ChunkGraphs(self, StreamState(self))
        return self._graphs


class StreamState:
    """What a stream carries from one call to the next, in tensors of fixed size at fixed addresses.

    Each causal conv keeps its last `context` input samples, each transposed conv the overlap that the
    next frames add to, each attention layer its last sliding_window - 1 keys and values (oldest first),
    all in the decoder's dtype; `position` is the number of frames decoded, on the device. The modules
    update their tensors in place (copy_, add_), so a CUDA graph captured on a state replays on it. A
    fresh state is zeros: the zeros a full decode pads its convs with, no overlap yet, and key slots from
    before frame 0, which attention masks out. All but the position are views of one flat buffer, so
    reset() and copy_() are one op each.
    """

    def __init__(self, decoder: CodecDecoder):
        weight = decoder.pre_conv.conv.weight
        shapes = {m: m.state_shapes() for m in decoder.modules() if hasattr(m, "state_shapes")}
        total = sum(math.prod(shape) for each in shapes.values() for shape in each)
        self.values = torch.zeros(total, dtype=weight.dtype, device=weight.device)  # (total,)
        self.position = torch.zeros((), dtype=torch.int64, device=weight.device)  # () frames decoded
        self._views: dict[nn.Module, tuple[torch.Tensor, ...]] = {}
        offset = 0
        for module, each in shapes.items():
            views = []
            for shape in each:
                views.append(self.values[offset : offset + math.prod(shape)].view(shape))
                offset += math.prod(shape)
            self._views[module] = tuple(views)

    def __getitem__(self, module: nn.Module) -> tuple[torch.Tensor, ...]:
        """The tensors `module` keeps, in the order of its state_shapes()."""
        return self._views[module]

    def reset(self) -> None:
        """Back to a fresh stream's state, in place."""
        self.values.zero_()
        self.position.zero_()

    def copy_(self, other: StreamState) -> None:
        """Take `other`'s contents (a state of the same decoder), in place."""
        self.values.copy_(other.values)
        self.position.copy_(other.position)


class CodecStream:
    """Decodes an utterance in pieces; the audio equals `CodecDecoder.decode` of all frames at once.

    Carries its own StreamState from call to call; on CUDA the calls replay the decoder's graphs. Not thread-safe.
    """

    @torch.inference_mode()
    def __init__(self, decoder: CodecDecoder, eager: bool = False):
        self._decoder = decoder
        self._state = StreamState(decoder)  # fresh: zeros
        self._graphs = None if eager else decoder._chunk_graphs()  # None: eager

    @torch.inference_mode()
    def continue_from(self, context: StreamState) -> None:
        """Go on from `context` (CodecDecoder.context, of this stream's decoder), as if this stream had decoded its
        codes; call it before the first decode."""
        self._state.copy_(context)

    @torch.inference_mode()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """Decode the next n frames.

        Args:
            codes: (n, num_quantizers) integer codes, n >= 1, following those already decoded.
        Returns:
            (n * frame_samples,) float32 samples that are final: no look-ahead, nothing re-decoded.
            On the decoder's device; the caller's to keep: no later call overwrites them.
        Raises:
            ValueError: codes are not an integer tensor of that shape.
        """
        if self._graphs is None:
            return self._decoder(codes, self._state)  # which checks the codes
        self._decoder.check_codes(codes)
        return self._graphs.decode(codes, self._state)


class ChunkGraphs:
    """The stream call `decoder(codes, state)` as one CUDA graph per chunk length, on one StreamState of its own
    at fixed addresses, into which each call's stream state is swapped.

    A length's graph is captured on its first use (or by CodecDecoder.warm_up), engine/tts/graphs.py's
    way. Its warm-up runs go to a scratch state (what they prepare depends on shapes, not addresses) and
    capturing does not execute, so the state a stream left here is untouched. The codes go in through a static
    tensor per length; each replay's output is cloned, as the lengths share one memory pool.
    """

    def __init__(self, decoder: CodecDecoder, state: StreamState):
        # a proxy: the decoder holds this object, and without a reference cycle a decoder that is dropped frees
        # its GPU memory at once, not at some later garbage collection (as when the engine moves to the CPU)
        self._decoder, self._state = weakref.proxy(decoder), state
        # the stream state whose contents are in self._state (its own tensors are stale meanwhile), weakly: the
        # state of a stream that has ended is never copied back
        self._holder: weakref.ref[StreamState] | None = None
        # frames -> (graph, (codes (frames, Q) int64 input, pcm (frames * frame_samples,) float32 output))
        self._graphs = GraphSet(state.values.device)

    @property
    def captured(self) -> list[int]:
        return self._graphs.captured

    def decode(self, codes: torch.Tensor, state: StreamState) -> torch.Tensor:
        """The stream call on checked codes (n, Q) continuing `state`: copy in, replay, copy out. A stream decoding
        alone copies its state once; streams taking turns swap theirs in and out, which copies are exact."""
        holder = self._holder() if self._holder is not None else None
        if holder is not state:
            if holder is not None:
                holder.copy_(self._state)
            self._state.copy_(state)
            self._holder = weakref.ref(state)
        graph, (inputs, pcm) = self.graph(codes.shape[0])
        inputs.copy_(codes)
        graph.replay()
        return pcm.clone()

    def graph(self, frames: int) -> tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, torch.Tensor]]:
        """The graph for chunks of `frames` frames, captured now if it does not exist yet."""
        if frames in self._graphs:
            return self._graphs[frames]
        decoder, state = self._decoder, self._state
        inputs = torch.zeros(frames, decoder.config.num_quantizers, dtype=torch.int64, device=state.values.device)
        return self._graphs.capture(frames, run=lambda: (inputs, decoder(inputs, state)),
                                    warm_up=lambda: decoder(inputs, StreamState(decoder)))


def load_codec(
    folder: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> CodecDecoder:
    """Load the decoder half of a checkpoint's `speech_tokenizer/` folder.

    Args:
        folder: the speech_tokenizer/ folder (config.json + model.safetensors; `encoder.*` is ignored).
        device: where the weights go ("cpu", "cuda", ...).
        dtype: the weights' and the stream state's dtype (float32 or bfloat16).
    Returns:
        The decoder in eval mode.
    Raises:
        ModelFilesError: the folder, config.json or model.safetensors is missing or unreadable, or a
            decoder tensor is missing, unexpected or of a shape config.json does not describe.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ModelFilesError(
            f"{folder}: codec folder not found (expected a checkpoint's speech_tokenizer/ folder "
            f"with config.json and model.safetensors)"
        )
    config = CodecConfig.from_file(folder / "config.json")
    with torch.device("meta"):  # shapes only: no memory, no initialization
        decoder = CodecDecoder(config)
    decoder = load_weights(decoder, folder, prefix="decoder.", device=device, dtype=dtype)
    if decoder.pre_conv.conv.weight.is_cuda and dtype != torch.float32:
        _channels_last_weights(decoder)
    return decoder


def _channels_last_weights(decoder: CodecDecoder) -> None:
    """Store each dense conv's weight with its channel dimension 1 innermost (a Conv1d's (out, in, k): the input
    channels; a ConvTranspose1d's (in, out, k): the output channels), the layout cuDNN's half-precision kernels
    read and would otherwise convert it to on every call: 39 conversions, a fifth of a 1-frame stream call's
    kernel time on an H200 (bench/gpu_profile.py). The values are unchanged."""
    for module in decoder.modules():
        if isinstance(module, (nn.Conv1d, nn.ConvTranspose1d)) and module.groups == 1:
            module.weight = nn.Parameter(module.weight.transpose(1, 2).contiguous().transpose(1, 2),
                                         requires_grad=module.weight.requires_grad)
