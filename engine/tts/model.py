"""Qwen3-TTS talker and code predictor in plain PyTorch; equals qwen_tts on the same weights.

Module attribute names equal the official state-dict keys (talker.model.layers.3.self_attn.q_proj, ...),
so loading with strict=True is the check. A decode frame is: sample codebook 0 from the talker's
logits, run the code predictor for codebooks 1..15, then feed the sum of the 16 codebook embeddings
plus the text-track embedding back into the talker. This file is the reference the CUDA megakernel is
checked against, so each step is written out plainly.

Several utterances decode together as a batch of sequences, each with its own cache at its own position
(Qwen3TTS.sample_frames and advance_frames): the linear layers, which read every weight, take all of them in one
product, and attention runs per sequence over its own cache. An utterance alone is a batch of one.
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
        # set by engine.tts.kernels.fused.attach: the projections, norms, RoPE and cache writes of forward in two
        # CUDA launches, one sequence a call; by engine.tts.cpu.quantize: project in fewer CPU ops (QKVPrologue)
        self.prologue = None

    @property
    def batches(self) -> bool:
        """Whether several sequences can share a call: a prologue that writes the cache itself (the CUDA kernels')
        serves one sequence a call."""
        return self.prologue is None or hasattr(self.prologue, "project")

    def project(self, x, cos, sin):
        """x (T, H) -> q (heads, T, D), k and v (kv_heads, T, D): normed and rotated, as the cache keeps them."""
        if self.prologue is not None:
            return self.prologue.project(x, cos, sin)
        T, D = x.shape[0], self.head_dim
        q = self.q_norm(self.q_proj(x).view(T, -1, D)).transpose(0, 1)
        k = self.k_norm(self.k_proj(x).view(T, -1, D)).transpose(0, 1)
        v = self.v_proj(x).view(T, -1, D).transpose(0, 1)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin, v

    def forward(self, x, cos, sin, caches: list[KVCache], layer: int) -> torch.Tensor:
        """x (B * T, H): T tokens of each of B sequences, sequence b's rows at caches[b]'s positions
        [length, length + T); writes K/V there; returns (B * T, H). One sequence where `batches` is False."""
        B = len(caches)
        T = x.shape[0] // B
        if not self.batches:
            (cache,) = caches
            q, k, v = self.prologue(x, cos, sin, cache, layer), None, None
        else:
            q, k, v = self.project(x, cos, sin)
        outs = []
        for b, cache in enumerate(caches):
            start, end, rows = cache.length, cache.length + T, slice(b * T, (b + 1) * T)
            if k is not None:
                cache.k[layer, :, start:end] = k[:, rows]
                cache.v[layer, :, start:end] = v[:, rows]
            # a multi-token call only ever starts an empty cache (prefill), so "causal" needs no offset
            assert T == 1 or start == 0, "multi-token forward must start from an empty cache"
            outs.append(F.scaled_dot_product_attention(  # .to: the cache may store a narrower dtype (kv_dtype)
                q[None, :, rows], cache.k[None, layer, :, :end].to(q.dtype), cache.v[None, layer, :, :end].to(q.dtype),
                is_causal=T > 1, enable_gqa=True,
            )[0])
        out = outs[0] if B == 1 else torch.cat(outs, dim=1)  # (heads, B * T, D)
        return self.o_proj(out.transpose(0, 1).reshape(B * T, -1))


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

    def forward(self, x, delta, cos, sin, caches, layer):
        """The residual stream x (the rows of the sequences whose caches are `caches`) plus the previous layer's MLP
        output delta (None in the first layer) -> (the stream after this layer's attention, this layer's MLP output).
        The sums are x + attention(norm(x)), then + mlp(norm(x)), each add left to the norm that reads its sum
        (RMSNorm.add: one launch for both in the kernel)."""
        x, h = self.input_layernorm.add(x, delta)
        x, h = self.post_attention_layernorm.add(x, self.self_attn(h, cos, sin, caches, layer))
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
        return self.forward_batch(x[None], [cache])[0]

    def forward_batch(self, x: torch.Tensor, caches: list[KVCache]) -> torch.Tensor:
        """x (B, T, hidden): T tokens of each of B sequences, sequence b's after what caches[b] holds -> final-normed
        hidden states (B, T, hidden); advances each cache by T. Every weight is read once for all of them, unless a
        kernel serves one sequence a call (the megakernel's step, the CUDA prologue): then one after the other."""
        B, T, _ = x.shape
        for cache in caches:
            if cache.length + T > cache.capacity:
                raise RuntimeError(f"KV cache full: {cache.length} + {T} > {cache.capacity}")
        if B > 1 and not all(layer.self_attn.batches for layer in self.layers):
            return torch.stack([self.forward_batch(x[b : b + 1], [cache])[0] for b, cache in enumerate(caches)])
        if self.kernel_step is not None and T == 1:
            steps = [self.kernel_step(x[b], cache) for b, cache in enumerate(caches)]
            return steps[0][None] if B == 1 else torch.stack(steps)  # alone, no copy on every step
        rotations = [self.rotary(cache.length, T, x) for cache in caches]
        cos, sin = rotations[0] if B == 1 else (torch.cat(parts) for parts in zip(*rotations))
        x, delta = x.reshape(B * T, -1), None
        for i, layer in enumerate(self.layers):
            x, delta = layer(x, delta, cos, sin, caches, i)
        for cache in caches:
            cache.length += T
        return self.norm.add(x, delta)[1].view(B, T, -1)


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
        """hidden: talker's final-normed state (H,); returns codes 1..15 (15,)."""
        return self.predict_batch(hidden[None], code0_embedding[None], [sampler], [frame])[0]

    def predict_batch(self, hidden: torch.Tensor, code0_embedding: torch.Tensor, samplers: list[Sampler],
                      frames: list[int]) -> torch.Tensor:
        """Codes 1..15 (B, 15) of B utterances' frames: hidden (B, H) their talker states, code0_embedding (B, H),
        utterance b picking with samplers[b] for its frame frames[b].

        Prefill [hidden, embedding of code 0] -> code 1, then one step per code -> codes 2..15; the KV
        caches live for this frame only.
        """
        groups = len(self.lm_head)
        caches = [self.model.new_cache(groups + 1, hidden) for _ in samplers]
        x = self.small_to_mtp_projection(torch.stack((hidden, code0_embedding), dim=1))
        h = self.model.forward_batch(x, caches)[:, -1]
        codes = []
        for g in range(groups):
            logits = self.lm_head[g](h)
            code = torch.stack([s.predictor(logits[b], frames[b], g + 1) for b, s in enumerate(samplers)])
            codes.append(code)
            if g + 1 < groups:
                x = self.small_to_mtp_projection(self.model.codec_embedding[g](code))
                h = self.model.forward_batch(x[:, None], caches)[:, 0]
        return torch.stack(codes, dim=1)


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

    def sample_frame(self, state: FrameState, sampler: Sampler) -> torch.Tensor | None:
        """The next frame's 16 codes (16,) int64 on the model's device, or None at EOS."""
        return self.sample_frames([state], [sampler])[0]

    def advance(self, state: FrameState, codes: torch.Tensor, text_input: torch.Tensor) -> None:
        """Feed frame `codes` (16,) plus the text-track input (hidden,) to the talker; updates state."""
        self.advance_frames([state], [codes], [text_input])

    @torch.inference_mode()
    def sample_frames(self, states: list[FrameState], samplers: list[Sampler]) -> list[torch.Tensor | None]:
        """sample_frame for several utterances at once, each with its own sampler: their code predictors run as one
        batch. An utterance at EOS gets None and costs its batch nothing more."""
        talker = self.talker
        code0 = [sampler.talker(state.logits, state.frame) for state, sampler in zip(states, samplers, strict=True)]
        going = [b for b, (code, sampler) in enumerate(zip(code0, samplers)) if int(code) != sampler.eos_id]
        frames: list[torch.Tensor | None] = [None] * len(states)
        if going:
            rest = talker.code_predictor.predict_batch(
                torch.stack([states[b].hidden for b in going]),
                talker.codec_embed(torch.stack([code0[b] for b in going])),
                [samplers[b] for b in going], [states[b].frame for b in going])
            for row, b in enumerate(going):
                frames[b] = torch.cat((code0[b][None], rest[row]))
        return frames

    @torch.inference_mode()
    def advance_frames(self, states: list[FrameState], codes: list[torch.Tensor], text_inputs: list[torch.Tensor]):
        """advance for several utterances at once: their talker steps run as one batch."""
        if not states:
            return
        talker = self.talker
        x = torch.stack([talker.frame_embedding(c) + t for c, t in zip(codes, text_inputs, strict=True)])
        hidden = talker.model.forward_batch(x[:, None], [state.cache for state in states])[:, 0]
        logits = talker.codec_head(hidden)
        for b, state in enumerate(states):
            state.hidden, state.logits = hidden[b], logits[b]
            state.frame += 1
