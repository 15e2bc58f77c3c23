"""How codec tokens are picked from logits: the official generate()'s processors, with a seeded RNG.

The processors and their order follow transformers' generate() as qwen-tts calls it for the talker:
repetition penalty -> minimum frames (EOS masked) -> suppress mask -> temperature -> top-k -> top-p.
Sampling draws by the Gumbel-max trick from a counter-based hash (seed, frame, codebook, token), so a
draw depends on nothing but those four numbers: the same seed gives the same speech on any device
and in any chunking, and the CUDA kernel reproduces the PyTorch engine bit for bit.

A masked token (suppressed, EOS held back, cut by top-k or top-p) scores -inf and can never be picked:
the noise is always finite, and a NaN logit (a broken model) counts as -inf, never as the largest value.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields

import torch

_M32 = 0xFFFFFFFF


@dataclass(frozen=True)
class SamplingOptions:
    """How the talker (codebook 0) and the code predictor (codebooks 1..15) pick codes.

    temperature=0 means greedy (argmax after the penalty and masks), which parity tests use; greedy is
    wrong for real speech, where the official model then misses EOS. Defaults are the official
    generate() defaults; a checkpoint's generation_config.json overrides them (see from_generation_config).
    """

    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.05
    predictor_temperature: float = 0.9
    predictor_top_k: int = 50
    predictor_top_p: float = 1.0

    def __post_init__(self):
        for name in ("temperature", "predictor_temperature"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0 (0 = greedy), got {getattr(self, name)}")
        for name in ("top_k", "predictor_top_k"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("top_p", "predictor_top_p"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {getattr(self, name)}")
        if not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")

    @classmethod
    def greedy(cls) -> "SamplingOptions":
        return cls(temperature=0.0, predictor_temperature=0.0)

    @classmethod
    def from_generation_config(cls, config: dict) -> "SamplingOptions":
        """Defaults from a checkpoint's generation_config.json (the official keys; do_sample=false = greedy).

        Raises:
            ValueError: a value is not a number, or out of range; the message names the file's key.
        """
        names = {f.name for f in fields(cls)}
        official = {"subtalker_temperature": "predictor_temperature", "subtalker_top_k": "predictor_top_k",
                    "subtalker_top_p": "predictor_top_p"}
        values = {official.get(k, k): v for k, v in config.items() if official.get(k, k) in names}
        for key, value in config.items():
            if official.get(key, key) in names and (not isinstance(value, (int, float)) or isinstance(value, bool)):
                raise ValueError(f"{key} is {value!r}, expected a number")
        if config.get("do_sample") is False:
            values["temperature"] = 0.0
        if config.get("subtalker_dosample") is False:
            values["predictor_temperature"] = 0.0
        return cls(**values)


def _mix32(x):
    """A 32-bit integer hash (Wellons' lowbias32) on an int, or an int64 tensor, holding values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _M32
    return x ^ (x >> 16)


def _uniform(bits: torch.Tensor) -> torch.Tensor:
    """32 random bits (int64 holding [0, 2**32)) -> float32 strictly inside (0, 1): (top 23 bits + 0.5) / 2**23.

    23 bits, not 24: k + 0.5 is exact in float32 only below 2**23, and the top 24-bit value rounded up
    to exactly 1.0, whose Gumbel noise is +inf (and -inf + inf is NaN, which argmax picks).
    """
    return ((bits >> 9).to(torch.float32) + 0.5) * (1.0 / (1 << 23))


def gumbel_noise(seed: int, frame: int, group: int, tokens: torch.Tensor) -> torch.Tensor:
    """Gumbel(0, 1) noise of some tokens (int64 indices) of one draw, a pure function of (seed, frame, group, token).

    Returns float32, finite, shaped as `tokens`.
    """
    key = _mix32(_mix32(_mix32(seed & _M32) ^ (frame & _M32)) ^ (group & _M32))  # Python ints: no launches
    bits = _mix32(_mix32(tokens) ^ key)
    return -torch.log(-torch.log(_uniform(bits)))


def new_seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


def _no_nan(logits: torch.Tensor) -> torch.Tensor:
    """float32 logits with NaN as -inf: argmax takes NaN for the largest value, so a NaN would win any draw."""
    logits = logits.float()
    return logits.masked_fill(logits.isnan(), float("-inf"))


def _draw(logits: torch.Tensor, temperature: float, top_k: int, top_p: float, seed: int, frame: int,
          group: int) -> torch.Tensor:
    """The pick (0-d int64) from logits whose masked tokens are -inf: their argmax (greedy), or a Gumbel-max draw
    from softmax(logits / T) cut to top-k / top-p like HF's warpers, the argmax of logits / T + noise.

    A -inf token is never drawn while another is not. Noise is made only for the tokens the cuts leave (the values
    it has in the whole vocabulary), and they are taken in index order, so ties go to the lowest index as argmax's.
    """
    if temperature == 0:
        return torch.argmax(logits)
    logits = logits / temperature
    if top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        # HF TopPLogitsWarper: drop the low tail whose cumulative probability is <= 1 - top_p, keep >= 1.
        sorted_logits, order = torch.sort(logits)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        drop = cumulative <= 1 - top_p
        drop[-1] = False
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    tokens = (logits > float("-inf")).nonzero()[:, 0]
    if tokens.numel() == 0:  # all masked (a broken model's NaN logits): the first token, as argmax over -inf picks
        return torch.argmax(logits)
    return tokens[torch.argmax(logits[tokens] + gumbel_noise(seed, frame, group, tokens))]


class Sampler:
    """Picks the codes of one utterance: codebook 0 with the talker's processors, 1..15 for the predictor."""

    def __init__(self, options: SamplingOptions, seed: int, vocab_size: int, eos_id: int,
                 suppress: torch.Tensor, min_frames: int = 2):
        """suppress: bool (vocab_size,), True where the talker may never emit a token (EOS excluded)."""
        self.options, self.seed, self.eos_id, self.min_frames = options, seed, eos_id, min_frames
        self.suppress = suppress
        self.seen = torch.zeros(vocab_size, dtype=torch.bool, device=suppress.device)  # codebook-0 history

    def talker_logits(self, logits: torch.Tensor, frame: int) -> torch.Tensor:
        """Codebook 0's logits (vocab,) for frame `frame` after the penalty and the masks (-inf where masked)."""
        o = self.options
        logits = _no_nan(logits)
        if o.repetition_penalty != 1.0:
            # HF RepetitionPenaltyLogitsProcessor over the codes generated so far
            penalized = torch.where(logits < 0, logits * o.repetition_penalty, logits / o.repetition_penalty)
            logits = torch.where(self.seen, penalized, logits)
        mask = self.suppress
        if frame < self.min_frames:
            mask = mask.clone()
            mask[self.eos_id] = True
        return logits.masked_fill(mask, float("-inf"))

    def talker(self, logits: torch.Tensor, frame: int) -> torch.Tensor:
        """Codebook-0 code (0-d int64, on the logits' device) for frame `frame` from the talker's logits (vocab,)."""
        o = self.options
        code = _draw(self.talker_logits(logits, frame), o.temperature, o.top_k, o.top_p, self.seed, frame, 0)
        self.seen[code] = True
        return code

    def predictor(self, logits: torch.Tensor, frame: int, group: int) -> torch.Tensor:
        """Code (0-d int64) of codebook `group` (1..15) for frame `frame` from a predictor head's logits."""
        o = self.options
        return _draw(_no_nan(logits), o.predictor_temperature, o.predictor_top_k, o.predictor_top_p, self.seed, frame,
                     group)
