"""How closely a fast engine (int8 or bfloat16 on the CPU) follows the float32 one on the same checkpoint.

Teacher-forced: both engines are fed the same codes, so one disagreement does not send them down different
paths and every frame counts. The float32 reference runs each stack once over the whole sequence (its causal
forward equals stepping it, to rounding); the fast engine steps as it does when it speaks. The figures are
top-1 agreement of codebook 0 (the talker) and of codebooks 1..15 (the code predictor, on the fast engine's
own talker state), and the codec's signal-to-noise ratio against float32 on the same codes, streamed as
TTSEngine streams them. bench/tts_cpu_quality.py prints them; tests/tts/test_cpu.py gates on them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from engine.tts.chunks import chunk_size
from engine.tts.stream import TTSEngine

TEXT = "The quick brown fox jumps over the lazy dog, and then it rests for a while."


@dataclass(frozen=True)
class Agreement:
    frames: int
    talker: float  # share of frames whose codebook-0 argmax equals float32's
    predictor: float  # share of (frame, codebook 1..15) argmaxes equal to float32's
    codec_snr_db: float  # 10 log10(|float32 audio|^2 / |difference|^2) over the codec frames
    codec_frames: int


def teacher_codes(engine: TTSEngine, frames: int, seed: int = 0) -> torch.Tensor:
    """(frames, 16) int64 codes drawn uniformly from the codec's codebooks: the sequence both engines are fed."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, engine.codec.config.codebook_size, (frames, engine.config.talker.num_code_groups),
                         generator=generator)


@torch.inference_mode()
def reference_argmaxes(engine: TTSEngine, codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The float32 engine's argmaxes on teacher codes: codebook 0 (frames,) and codebooks 1..15 (frames, 15)."""
    talker, inputs = engine.model.talker, _inputs(engine)
    frames = codes.shape[0]
    rows = torch.stack([talker.frame_embedding(codes[i]) + inputs.text_input(i) for i in range(frames - 1)])
    sequence = torch.cat((inputs.prefill, rows))  # position P-1+i gives frame i's talker state
    cache = talker.model.new_cache(sequence.shape[0], sequence)
    hidden = talker.model(sequence, cache)[inputs.prefill.shape[0] - 1:]  # (frames, hidden)
    vocab = engine.codec.config.codebook_size
    code0 = talker.codec_head(hidden)[:, :vocab].argmax(-1)
    predictor = talker.code_predictor
    rest = torch.empty(frames, codes.shape[1] - 1, dtype=torch.long)
    for i in range(frames):
        embedded = [talker.codec_embed(codes[i, :1])[0]]
        embedded += [predictor.model.codec_embedding[g](codes[i, g + 1]) for g in range(codes.shape[1] - 2)]
        x = predictor.small_to_mtp_projection(torch.stack([hidden[i], *embedded]))
        h = predictor.model(x, predictor.model.new_cache(x.shape[0], x))[1:]  # (15, hidden): states for 1..15
        rest[i] = torch.stack([head(h[g]).argmax() for g, head in enumerate(predictor.lm_head)])
    return code0, rest


class _Forced:
    """A sampler that picks the teacher's codes and records what the model's argmax would have been."""

    def __init__(self, codes: torch.Tensor):
        self.codes, self.code0, self.rest = codes, [], []

    def talker(self, logits, frame):
        raise AssertionError("codebook 0 is read from the logits directly")

    def predictor(self, logits, frame, group):
        self.rest.append(int(logits.argmax()))
        return self.codes[frame, group]


@torch.inference_mode()
def stepped_argmaxes(engine: TTSEngine, codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The engine's argmaxes stepping through teacher codes as it does when speaking: codebook 0 (frames,) and
    codebooks 1..15 (frames, 15), its predictor on its own talker state."""
    model, inputs = engine.model, _inputs(engine)
    forced = _Forced(codes)
    state = model.begin(inputs.prefill.to(engine.dtype), codes.shape[0])
    vocab = engine.codec.config.codebook_size
    for i in range(codes.shape[0]):
        forced.code0.append(int(state.logits[:vocab].argmax()))
        code0 = codes[i, 0]
        model.talker.code_predictor.predict(state.hidden, model.talker.codec_embed(code0), forced, i)
        if i + 1 < codes.shape[0]:
            model.advance(state, codes[i], inputs.text_input(i).to(engine.dtype))
    return torch.tensor(forced.code0), torch.tensor(forced.rest).view(codes.shape[0], -1)


@torch.inference_mode()
def codec_snr_db(reference: TTSEngine, engine: TTSEngine, codes: torch.Tensor) -> float:
    """SNR (dB) of the engine's codec streamed in TTSEngine's chunks (engine/tts/chunks.py) against the float32
    codec's full decode of the same codes."""
    expected = reference.codec.decode(codes).float()
    stream = engine.codec.stream()
    pieces, made = [], 0
    while made < codes.shape[0]:
        size = chunk_size(made)
        pieces.append(stream.decode(codes[made:made + size]))
        made += size
    got = torch.cat(pieces).float()
    noise = (got - expected).pow(2).sum()
    return math.inf if noise == 0 else float(10 * torch.log10(expected.pow(2).sum() / noise))


def measure(reference: TTSEngine, engine: TTSEngine, frames: int, codec_frames: int, seed: int = 0) -> Agreement:
    """Agreement of `engine` with the float32 `reference` (same checkpoint) over `frames` teacher-forced frames,
    and its codec's SNR over the first `codec_frames` of them."""
    codes = teacher_codes(reference, frames, seed)
    ref0, ref_rest = reference_argmaxes(reference, codes)
    got0, got_rest = stepped_argmaxes(engine, codes)
    return Agreement(frames, float((ref0 == got0).float().mean()), float((ref_rest == got_rest).float().mean()),
                     codec_snr_db(reference, engine, codes[:codec_frames]), codec_frames)


def _inputs(engine: TTSEngine):
    voice = engine.resolve_voice(engine.default_speaker)
    return engine.prompts.build(engine.prompts.text_ids(TEXT), voice, True, engine.device)
