"""Qwen3-TTS talker and code predictor in plain PyTorch, batch 1; equals qwen_tts on the same weights.

Module attribute names equal the official state-dict keys (talker.model.layers.3.self_attn.q_proj, ...),
so loading with strict=True is the check. A decode frame is: sample codebook 0 from the talker's
logits, run the code predictor for codebooks 1..15, then feed the sum of the 16 codebook embeddings
plus the text-track embedding back into the talker. This file is the reference the CUDA megakernel is
checked against, so each step is written out plainly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.tts.config import DecoderConfig, TalkerConfig
from engine.tts.sampling import Sampler


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        # set by engine.tts.kernels.fused, for bf16 x, each in one CUDA launch: (x, weight, eps) -> this forward, and
        # (x, delta, scale, weight, eps) -> add()
        self.kernel = None
        self.add_kernel = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernel is not None and x.dtype == torch.bfloat16:
            return self.kernel(x.contiguous(), self.weight, self.eps)
        # float32 statistics, then back to the input dtype before the weight, as the official Qwen3TTSRMSNorm:
        # F.rms_norm computes in float32 and rounds once, one kernel on CUDA where the formula takes seven
        return self.weight * F.rms_norm(x, self.weight.shape, eps=self.eps)

    def add(self, x: torch.Tensor, delta: torch.Tensor | None, scale: torch.Tensor | None = None):
        """(x + delta, this norm of it), delta first times `scale` (per channel) where given: a residual branch
        joining the stream, and the norm that reads the stream next. The kernel does both in one launch. No delta
        (the first layer's, which no branch precedes): (x, this norm of x)."""
        if delta is None:
            return x, self(x)
        if self.add_kernel is not None and x.dtype == torch.bfloat16:
            return self.add_kernel(x.contiguous(), delta.contiguous(), scale, self.weight, self.eps)
        x = x + (delta if scale is None else scale * delta)
        return x, self(x)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class KVCache:
    """Keys and values of one decoder stack, preallocated: (layers, kv_heads, capacity, head_dim) each."""

    def __init__(self, cfg: DecoderConfig, capacity: int, device, dtype):
        shape = (cfg.num_layers, cfg.num_kv_heads, capacity, cfg.head_dim)
        self.k = torch.empty(shape, device=device, dtype=dtype)
        self.v = torch.empty(shape, device=device, dtype=dtype)
        self.length = 0  # positions filled

    @property
    def capacity(self) -> int:
        return self.k.shape[2]


class Attention(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        H, D = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(H, cfg.num_heads * D, bias=False)
        self.k_proj = nn.Linear(H, cfg.num_kv_heads * D, bias=False)
        self.v_proj = nn.Linear(H, cfg.num_kv_heads * D, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * D, H, bias=False)
        self.q_norm = RMSNorm(D, cfg.rms_norm_eps)  # per head, before RoPE
        self.k_norm = RMSNorm(D, cfg.rms_norm_eps)
        self.head_dim = D
        # set by engine.tts.kernels.fused.attach: the projections, norms, RoPE and cache writes below in two CUDA
        # launches; by engine.tts.cpu.quantize: the same in fewer CPU ops (QKVPrologue)
        self.prologue = None

    def forward(self, x, cos, sin, cache: KVCache, layer: int) -> torch.Tensor:
        """x (T, H) at cache positions [cache.length, cache.length + T); writes K/V there; returns (T, H)."""
        T, D = x.shape[0], self.head_dim
        start, end = cache.length, cache.length + T
        if self.prologue is not None:
            q = self.prologue(x, cos, sin, cache, layer)
        else:
            q = self.q_norm(self.q_proj(x).view(T, -1, D)).transpose(0, 1)  # (heads, T, D)
            k = self.k_norm(self.k_proj(x).view(T, -1, D)).transpose(0, 1)  # (kv_heads, T, D)
            v = self.v_proj(x).view(T, -1, D).transpose(0, 1)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            cache.k[layer, :, start:end] = k
            cache.v[layer, :, start:end] = v
        # a multi-token call only ever starts an empty cache (prefill), so "causal" needs no offset
        assert T == 1 or start == 0, "multi-token forward must start from an empty cache"
        out = F.scaled_dot_product_attention(  # .to: the cache may store a narrower dtype (kv_dtype)
            q[None], cache.k[None, layer, :, :end].to(q.dtype), cache.v[None, layer, :, :end].to(q.dtype),
            is_causal=T > 1, enable_gqa=True,
        )[0]
        return self.o_proj(out.transpose(0, 1).reshape(T, -1))


class MLP(nn.Module):
    """SwiGLU feed-forward, down(silu(gate(x)) * up(x)): the talker's, the code predictor's and the codec's (cfg a
    DecoderConfig or the codec's CodecConfig: both have the two sizes it reads)."""

    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        # set by engine.tts.kernels.fused: this forward in three CUDA launches; by engine.tts.cpu.quantize: gate and
        # up in one CPU product (SwiGLU)
        self.fused = None

    def forward(self, x):
        if self.fused is not None:
            return self.fused(x)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, delta, cos, sin, cache, layer):
        """The residual stream x plus the previous layer's MLP output delta (None in the first layer) -> (the stream
        after this layer's attention, this layer's MLP output). The sums are x + attention(norm(x)), then
        + mlp(norm(x)), each add left to the norm that reads its sum (RMSNorm.add: one launch for both in the
        kernel)."""
        x, h = self.input_layernorm.add(x, delta)
        x, h = self.post_attention_layernorm.add(x, self.self_attn(h, cos, sin, cache, layer))
        return x, self.mlp(h)


class DecoderStack(nn.Module):
    """Qwen3 decoder layers + final norm, with plain RoPE on positions counted by the cache.

    The talker's config asks for interleaved M-RoPE; with its three position streams equal (always, for
    speech) that is exactly plain RoPE, proven in tests/tts/test_rope.py.
    """

    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self._inv_freq: torch.Tensor | None = None
        # set by engine.tts.kernels.megakernel.attach: one-token steps then run in one persistent CUDA launch
        self.kernel_step = None
        # the dtype K/V are stored in; None = the activations'. bfloat16 under float32 activations is
        # what the megakernel does (fp32 math, bf16 cache): its reference in tests
        self.kv_dtype: torch.dtype | None = None

    def new_cache(self, capacity: int, like: torch.Tensor) -> KVCache:
        return KVCache(self.cfg, capacity, like.device, self.kv_dtype or like.dtype)

    def rotary(self, start: int, T: int, like: torch.Tensor):
        """cos, sin (T, head_dim) for positions start..start+T-1, computed in float32 (as the official code)."""
        D = self.cfg.head_dim
        if self._inv_freq is None or self._inv_freq.device != like.device:
            exponent = torch.arange(0, D, 2, dtype=torch.int64, device=like.device).float() / D
            self._inv_freq = 1.0 / (self.cfg.rope_theta ** exponent)
        positions = torch.arange(start, start + T, device=like.device, dtype=torch.float32)
        freqs = torch.outer(positions, self._inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(like.dtype), emb.sin().to(like.dtype)

    def forward(self, x: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """x (T, hidden) -> final-normed hidden states (T, hidden); advances the cache by T."""
        if cache.length + x.shape[0] > cache.capacity:
            raise RuntimeError(f"KV cache full: {cache.length} + {x.shape[0]} > {cache.capacity}")
        if self.kernel_step is not None and x.shape[0] == 1:
            return self.kernel_step(x, cache)
        cos, sin = self.rotary(cache.length, x.shape[0], x)
        delta = None
        for i, layer in enumerate(self.layers):
            x, delta = layer(x, delta, cos, sin, cache, i)
        cache.length += x.shape[0]
        return self.norm.add(x, delta)[1]


class TalkerModel(DecoderStack):
    def __init__(self, cfg: TalkerConfig):
        super().__init__(cfg.decoder)
        self.codec_embedding = nn.Embedding(cfg.decoder.vocab_size, cfg.decoder.hidden_size)
        self.text_embedding = nn.Embedding(cfg.text_vocab_size, cfg.text_hidden_size)


class TextProjection(nn.Module):
    """Text-embedding width (2048) -> talker width: linear, SiLU, linear, both with bias."""

    def __init__(self, cfg: TalkerConfig):
        super().__init__()
        self.linear_fc1 = nn.Linear(cfg.text_hidden_size, cfg.text_hidden_size, bias=True)
        self.linear_fc2 = nn.Linear(cfg.text_hidden_size, cfg.decoder.hidden_size, bias=True)

    def forward(self, x):
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class PredictorModel(DecoderStack):
    def __init__(self, cfg: TalkerConfig):
        super().__init__(cfg.predictor)
        # codebooks 1..15; rows are talker-width, projected down by small_to_mtp_projection where they differ
        self.codec_embedding = nn.ModuleList(
            nn.Embedding(cfg.predictor.vocab_size, cfg.decoder.hidden_size) for _ in range(cfg.num_code_groups - 1)
        )


class CodePredictor(nn.Module):
    """Codebooks 1..15 of a frame from the talker's hidden state and codebook 0 (a 5-layer decoder, 15 heads)."""

    def __init__(self, cfg: TalkerConfig):
        super().__init__()
        self.model = PredictorModel(cfg)
        self.lm_head = nn.ModuleList(
            nn.Linear(cfg.predictor.hidden_size, cfg.predictor.vocab_size, bias=False)
            for _ in range(cfg.num_code_groups - 1)
        )
        # 1.7B: talker hidden 2048 -> predictor hidden 1024; 0.6B: the same width, and no tensor on disk
        if cfg.predictor.hidden_size != cfg.decoder.hidden_size:
            self.small_to_mtp_projection = nn.Linear(cfg.decoder.hidden_size, cfg.predictor.hidden_size, bias=True)
        else:
            self.small_to_mtp_projection = nn.Identity()

    def predict(self, hidden: torch.Tensor, code0_embedding: torch.Tensor, sampler: Sampler, frame: int):
        """hidden: talker's final-normed state (H,); returns codes 1..15 as a list of 0-d tensors.

        Prefill [hidden, embedding of code 0] -> code 1, then one step per code -> codes 2..15; the KV
        cache lives for this frame only.
        """
        groups = len(self.lm_head)
        cache = self.model.new_cache(groups + 1, hidden)
        x = self.small_to_mtp_projection(torch.stack((hidden, code0_embedding)))
        h = self.model(x, cache)[-1]
        codes = []
        for g in range(groups):
            code = sampler.predictor(self.lm_head[g](h), frame, g + 1)
            codes.append(code)
            if g + 1 < groups:
                x = self.small_to_mtp_projection(self.model.codec_embedding[g](code)[None])
                h = self.model(x, cache)[0]
        return codes


class Talker(nn.Module):
    def __init__(self, cfg: TalkerConfig):
        super().__init__()
        self.cfg = cfg
        self.model = TalkerModel(cfg)
        self.text_projection = TextProjection(cfg)
        self.codec_head = nn.Linear(cfg.decoder.hidden_size, cfg.decoder.vocab_size, bias=False)
        self.code_predictor = CodePredictor(cfg)

    def text_embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Text-track inputs: (T,) text token ids -> (T, hidden)."""
        return self.text_projection(self.model.text_embedding(ids))

    def codec_embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Codec-track inputs: (T,) codebook-0 / special codec ids -> (T, hidden)."""
        return self.model.codec_embedding(ids)

    def frame_embedding(self, codes: torch.Tensor) -> torch.Tensor:
        """Sum of the 16 codebook embeddings of one frame (16,) -> (hidden,): the next step's codec track; or of
        several frames at once, (16, frames) -> (frames, hidden)."""
        tables = [self.model.codec_embedding, *self.code_predictor.model.codec_embedding]
        # stacked then summed, as the official code does, so float rounding matches it
        return torch.stack([table(code) for table, code in zip(tables, codes)]).sum(0)


@dataclass
class FrameState:
    """Where one utterance's decode stands: the talker cache and its last output."""

    cache: KVCache
    hidden: torch.Tensor  # (hidden,) talker's final-normed state at the last position
    logits: torch.Tensor  # (codec vocab,) codec head on it
    frame: int = 0  # frames emitted so far


class Qwen3TTS(nn.Module):
    """The speech model as the official checkpoint stores it (talker.*; a Base model's speaker_encoder.* is not
    loaded)."""

    def __init__(self, cfg: TalkerConfig):
        super().__init__()
        self.talker = Talker(cfg)
        # set by engine.tts.kernels.megakernel.attach: whole frames (sample_frame + advance) in one CUDA launch each
        self.frame_kernel = None
        # set by engine.tts.prefill.attach_graphs: begin() pads the prompt to a fixed length and replays a CUDA graph
        self.padded_prefill = None

    @torch.inference_mode()
    def begin(self, prompt: torch.Tensor, max_frames: int) -> FrameState:
        """Prefill the talker with the prompt's input vectors (T, hidden); room for max_frames more."""
        if self.padded_prefill is not None and self.padded_prefill.fits(prompt):
            return self.padded_prefill.begin(prompt, max_frames)
        talker = self.talker
        cache = talker.model.new_cache(prompt.shape[0] + max_frames, prompt)
        hidden = talker.model(prompt, cache)[-1]
        return FrameState(cache, hidden, talker.codec_head(hidden))

    @torch.inference_mode()
    def sample_frame(self, state: FrameState, sampler: Sampler) -> torch.Tensor | None:
        """The next frame's 16 codes (16,) int64 on the model's device, or None at EOS."""
        talker = self.talker
        code0 = sampler.talker(state.logits, state.frame)
        if int(code0) == sampler.eos_id:
            return None
        rest = talker.code_predictor.predict(state.hidden, talker.codec_embed(code0), sampler, state.frame)
        return torch.stack([code0, *rest])

    @torch.inference_mode()
    def advance(self, state: FrameState, codes: torch.Tensor, text_input: torch.Tensor) -> None:
        """Feed frame `codes` (16,) plus the text-track input (hidden,) to the talker; updates state."""
        talker = self.talker
        x = (talker.frame_embedding(codes) + text_input)[None]
        state.hidden = talker.model(x, state.cache)[0]
        state.logits = talker.codec_head(state.hidden)
        state.frame += 1
