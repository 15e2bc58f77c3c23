"""Qwen3-TTS model configuration, read from a checkpoint folder's config.json and generation_config.json.

The keys are those the official qwen-tts classes save (Qwen3TTSConfig and its talker and code-predictor
sub-configs). Their Python defaults are NOT the published checkpoints' values, so nothing here falls
back to a default for a value that shapes the model: a missing key is an error naming file and key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import ModelFilesError


class _Reader:
    """Reads required keys from one JSON object, naming the file and key path on failure."""

    def __init__(self, data: dict, path: Path, prefix: str = ""):
        self.data, self.path, self.prefix = data, path, prefix

    def __call__(self, key: str, default: Any = ...):
        if key in self.data and self.data[key] is not None:
            return self.data[key]
        if default is not ...:
            return default
        raise ModelFilesError(f"{self.path}: missing key '{self.prefix}{key}'")

    def integer(self, key: str, default: Any = ..., minimum: int | None = None) -> int:
        """An integer (not a bool, not a string of digits); minimum=1 for a size the model is built with."""
        value = self(key, default)
        if not isinstance(value, int) or isinstance(value, bool):
            self._wrong(key, value, "an integer")
        if minimum is not None and value < minimum:
            self._wrong(key, value, f"an integer >= {minimum}")
        return value

    def number(self, key: str, default: Any = ...) -> float:
        value = self(key, default)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            self._wrong(key, value, "a number")
        return float(value)

    def ids(self, key: str) -> dict[str, int]:
        """A name -> id object (speakers, languages); names lower-cased."""
        table = self.sub(key, {})
        return {name.lower(): table.integer(name) for name in table.data}

    def sub(self, key: str, default: Any = ...) -> "_Reader":
        value = self(key, default)
        if not isinstance(value, dict):
            raise ModelFilesError(f"{self.path}: '{self.prefix}{key}' must be an object, got {value!r}")
        return _Reader(value, self.path, f"{self.prefix}{key}.")

    def _wrong(self, key: str, value: Any, expected: str):
        raise ModelFilesError(f"{self.path}: '{self.prefix}{key}' is {value!r}, expected {expected}")


def read_json(path: Path) -> dict:
    """Parse a JSON file, turning a missing or malformed file into ModelFilesError."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise ModelFilesError(f"{path}: file is missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelFilesError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ModelFilesError(f"{path}: expected a JSON object")
    return data


@dataclass(frozen=True)
class DecoderConfig:
    """One Qwen3 decoder stack: the talker's (28 layers) or the code predictor's (5 layers)."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    vocab_size: int

    @classmethod
    def read(cls, r: _Reader) -> "DecoderConfig":
        if r("use_sliding_window", False):
            raise ModelFilesError(f"{r.path}: '{r.prefix}use_sliding_window' is true; "
                                  "Parley supports full attention only")
        if r("hidden_act", "silu") != "silu":
            raise ModelFilesError(f"{r.path}: '{r.prefix}hidden_act' is {r('hidden_act')!r}; Parley supports 'silu'")
        if r("attention_bias", False):
            raise ModelFilesError(f"{r.path}: '{r.prefix}attention_bias' is true; Parley supports bias-free attention")
        num_heads = r.integer("num_attention_heads", minimum=1)
        hidden = r.integer("hidden_size", minimum=1)
        num_kv_heads = r.integer("num_key_value_heads", minimum=1)
        if num_heads % num_kv_heads:
            raise ModelFilesError(f"{r.path}: '{r.prefix}num_attention_heads' ({num_heads}) is not a multiple of "
                                  f"num_key_value_heads ({num_kv_heads})")
        return cls(
            hidden_size=hidden,
            intermediate_size=r.integer("intermediate_size", minimum=1),
            num_layers=r.integer("num_hidden_layers", minimum=1),
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=r.integer("head_dim", hidden // num_heads, minimum=1),
            rms_norm_eps=r.number("rms_norm_eps"),
            rope_theta=r.number("rope_theta"),
            vocab_size=r.integer("vocab_size", minimum=1),
        )


@dataclass(frozen=True)
class TalkerConfig:
    """The talker (codebook-0 decoder), its code predictor, and the codec-track special ids."""

    decoder: DecoderConfig
    predictor: DecoderConfig
    num_code_groups: int  # 16 codebooks per frame
    text_vocab_size: int
    text_hidden_size: int
    codec_pad_id: int
    codec_bos_id: int
    codec_eos_id: int
    codec_think_id: int
    codec_nothink_id: int
    codec_think_bos_id: int
    codec_think_eos_id: int
    language_ids: dict[str, int]  # lower-case name -> codec id, dialects included
    speaker_ids: dict[str, int]  # lower-case name -> codec id
    speaker_dialects: dict[str, str]  # speaker -> dialect language it speaks for chinese/auto

    @classmethod
    def read(cls, r: _Reader) -> "TalkerConfig":
        rope = r.sub("rope_scaling", {}).data
        # The talker's rotary embedding is M-RoPE; for speech all three position streams are equal, which
        # makes it plain RoPE (tests/tts/test_rope.py proves it), so only the section's total must fit.
        section = rope.get("mrope_section")
        decoder = DecoderConfig.read(r)
        if section is not None and (not isinstance(section, list) or not all(type(n) is int for n in section)
                                    or 2 * sum(section) != decoder.head_dim):
            raise ModelFilesError(f"{r.path}: talker_config.rope_scaling.mrope_section {section} "
                                  f"does not cover head_dim {decoder.head_dim}")
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            raise ModelFilesError(f"{r.path}: talker_config.rope_scaling type {rope.get('rope_type')!r}; "
                                  "Parley supports 'default'")
        dialects = {k.lower(): v for k, v in r.sub("spk_is_dialect", {}).data.items() if v}
        return cls(
            decoder=decoder,
            predictor=DecoderConfig.read(r.sub("code_predictor_config")),
            num_code_groups=r.integer("num_code_groups", minimum=2),
            text_vocab_size=r.integer("text_vocab_size", minimum=1),
            text_hidden_size=r.integer("text_hidden_size", minimum=1),
            codec_pad_id=r.integer("codec_pad_id"),
            codec_bos_id=r.integer("codec_bos_id"),
            codec_eos_id=r.integer("codec_eos_token_id"),
            codec_think_id=r.integer("codec_think_id"),
            codec_nothink_id=r.integer("codec_nothink_id"),
            codec_think_bos_id=r.integer("codec_think_bos_id"),
            codec_think_eos_id=r.integer("codec_think_eos_id"),
            language_ids=r.ids("codec_language_id"),
            speaker_ids=r.ids("spk_id"),
            speaker_dialects=dialects,
        )


@dataclass(frozen=True)
class SpeakerEncoderConfig:
    """A Base model's speaker encoder (ECAPA-TDNN: a recording's 128-bin mel -> one talker-width vector).

    The published Base checkpoints write only enc_dim and sample_rate; every other size is the official
    Qwen3TTSSpeakerEncoderConfig default, which their weights have, so those keys fall back to it.
    """

    mel_dim: int  # mel bins in, 128
    enc_dim: int  # the embedding's width: the talker's hidden size
    channels: tuple[int, ...]  # the first TDNN's, each SE-Res2Net block's, then the aggregation's
    kernel_sizes: tuple[int, ...]
    dilations: tuple[int, ...]
    attention_channels: int  # in the attentive statistics pooling
    res2net_scale: int  # a Res2Net block splits its channels into this many groups
    se_channels: int  # the squeeze-excitation bottleneck
    sample_rate_hz: int  # of the audio the mel is taken from

    @classmethod
    def read(cls, r: _Reader) -> "SpeakerEncoderConfig":
        def sizes(key: str, default: list[int]) -> tuple[int, ...]:
            value = r(key, default)
            if not isinstance(value, list) or not all(type(n) is int and n >= 1 for n in value):
                r._wrong(key, value, "a list of integers >= 1")
            return tuple(value)

        channels = sizes("enc_channels", [512, 512, 512, 512, 1536])
        kernel_sizes = sizes("enc_kernel_sizes", [5, 3, 3, 3, 1])
        dilations = sizes("enc_dilations", [1, 2, 3, 4, 1])
        if not len(channels) == len(kernel_sizes) == len(dilations) or len(channels) < 3:
            raise ModelFilesError(f"{r.path}: {r.prefix}enc_channels, enc_kernel_sizes and enc_dilations must be "
                                  f"lists of one length (3 or more), got {len(channels)}, {len(kernel_sizes)} and "
                                  f"{len(dilations)}")
        if sum(channels[1:-1]) != channels[-1]:
            raise ModelFilesError(f"{r.path}: '{r.prefix}enc_channels' {list(channels)}: the last (the aggregation's, "
                                  "which joins the SE-Res2Net blocks' outputs) must be the sum of those between")
        scale = r.integer("enc_res2net_scale", 8, minimum=1)
        if any(c % scale for c in channels[1:-1]):
            raise ModelFilesError(f"{r.path}: '{r.prefix}enc_channels' {list(channels)}: the SE-Res2Net blocks' "
                                  f"channels must be multiples of enc_res2net_scale ({scale})")
        return cls(
            mel_dim=r.integer("mel_dim", 128, minimum=1),
            enc_dim=r.integer("enc_dim", minimum=1),
            channels=channels,
            kernel_sizes=kernel_sizes,
            dilations=dilations,
            attention_channels=r.integer("enc_attention_channels", 128, minimum=1),
            res2net_scale=scale,
            se_channels=r.integer("enc_se_channels", 128, minimum=1),
            sample_rate_hz=r.integer("sample_rate", 24000, minimum=1),
        )


@dataclass(frozen=True)
class TTSConfig:
    """A whole Qwen3-TTS checkpoint: model kind, text-side special ids, the talker, and a Base model's speaker
    encoder (None for the others)."""

    model_type: str  # "custom_voice", "voice_design" or "base"
    model_size: str  # "0b6" or "1b7" as the checkpoint says
    im_start_id: int
    im_end_id: int
    tts_pad_id: int
    tts_bos_id: int
    tts_eos_id: int
    talker: TalkerConfig
    speaker_encoder: SpeakerEncoderConfig | None = None

    @classmethod
    def from_file(cls, path: str | Path) -> "TTSConfig":
        path = Path(path)
        r = _Reader(read_json(path), path)
        if r("tokenizer_type", "qwen3_tts_tokenizer_12hz") != "qwen3_tts_tokenizer_12hz":
            raise ModelFilesError(f"{path}: tokenizer_type {r('tokenizer_type')!r}; "
                                  "Parley supports the 12 Hz models only")
        model_type = str(r("tts_model_type"))
        talker = TalkerConfig.read(r.sub("talker_config"))
        speaker_encoder = None
        if model_type == "base":
            speaker_encoder = SpeakerEncoderConfig.read(r.sub("speaker_encoder_config"))
            if speaker_encoder.enc_dim != talker.decoder.hidden_size:
                raise ModelFilesError(f"{path}: speaker_encoder_config.enc_dim is {speaker_encoder.enc_dim}, but the "
                                      f"talker's hidden_size is {talker.decoder.hidden_size}; they must be equal")
        return cls(
            model_type=model_type,
            model_size=str(r("tts_model_size", "")),
            im_start_id=r.integer("im_start_token_id"),
            im_end_id=r.integer("im_end_token_id"),
            tts_pad_id=r.integer("tts_pad_token_id"),
            tts_bos_id=r.integer("tts_bos_token_id"),
            tts_eos_id=r.integer("tts_eos_token_id"),
            talker=talker,
            speaker_encoder=speaker_encoder,
        )

    @property
    def speakers(self) -> list[str]:
        """Speakers a caller may name: none for VoiceDesign, whose voice is described (its config may still
        list the speaker ids of the model it was trained from)."""
        return sorted(self.talker.speaker_ids) if self.model_type == "custom_voice" else []

    @property
    def default_speaker(self) -> str | None:
        """The speaker used when a caller names none: the model's first, or None (VoiceDesign)."""
        return self.speakers[0] if self.speakers else None

    @property
    def languages(self) -> list[str]:
        """Languages a caller may ask for: 'auto' plus the config's, dialects excluded (as the official model)."""
        return ["auto"] + sorted(k for k in self.talker.language_ids if "dialect" not in k)
