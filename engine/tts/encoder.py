"""The speech tokenizer's encoder: a 24 kHz recording -> codec codes (16 per 80 ms frame), what a Base model's
in-context voice cloning puts in the talker's prompt after the recording's transcript.

It is transformers' MimiModel without its decoding half, as qwen_tts's Qwen3TTSTokenizerV2Encoder keeps it; the
weights are the `encoder.*` tensors of the checkpoint's speech_tokenizer/model.safetensors and its config is
config.json's encoder_config. Encoding follows Qwen3TTSTokenizerV2Model.encode and gives its codes
(tests/tts/test_clone.py).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from engine.errors import ModelFilesError
from engine.tts.checkpoint import load_weights
from engine.tts.config import _Reader, read_json


class SpeechEncoder:
    """Codes of a recording, the codec's first `num_quantizers` codebooks of each frame."""

    def __init__(self, mimi, sample_rate_hz: int, frame_samples: int, num_quantizers: int):
        self.mimi = mimi
        self.sample_rate_hz = sample_rate_hz  # input_sample_rate
        self.frame_samples = frame_samples  # encode_downsample_rate: 1920 samples = 80 ms at 24 kHz
        self.num_quantizers = num_quantizers  # encoder_valid_num_quantizers: the 16 the talker speaks in

    @torch.inference_mode()
    def encode(self, audio: torch.Tensor) -> torch.Tensor:
        """A recording (samples,) float32 at sample_rate_hz, in [-1, 1] -> (frames, num_quantizers) int64 codes on
        the CPU, one frame per started frame_samples of audio (the official count)."""
        device = next(self.mimi.parameters()).device
        x = audio.to(device, torch.float32)[None, None]  # (batch 1, channel 1, samples)
        codes = self.mimi.encode(x, num_quantizers=self.num_quantizers, return_dict=True).audio_codes[0]
        frames = math.ceil(audio.shape[0] / self.frame_samples)
        return codes[:, :frames].T.contiguous().cpu()  # (frames, num_quantizers)


def load_speech_encoder(folder: Path, device="cpu") -> SpeechEncoder:
    """The encoder of a checkpoint's speech_tokenizer/ folder, in float32 (it runs once per cloned voice, and the
    codes are nearest codebook entries, which half precision could move).

    Raises:
        ModelFilesError: config.json is missing, malformed or lacks a key, or model.safetensors is missing,
            truncated or corrupt, or an `encoder.*` tensor is missing, unexpected or of the wrong shape.
    """
    from transformers import MimiConfig, MimiModel  # heavy import, only when a Base model is loaded

    path = folder / "config.json"
    r = _Reader(read_json(path), path)
    num_quantizers = r.integer("encoder_valid_num_quantizers", minimum=1)
    try:
        config = MimiConfig(**r.sub("encoder_config").data)
    except (TypeError, ValueError) as e:
        raise ModelFilesError(f"{path}: encoder_config is not a Mimi encoder's config ({e})") from None
    if num_quantizers > config.num_quantizers:
        raise ModelFilesError(f"{path}: encoder_valid_num_quantizers is {num_quantizers}, but encoder_config has "
                              f"{config.num_quantizers} quantizers")
    # built on the CPU, not the meta device: its convolutions and rotary embedding keep sizes and frequencies in
    # buffers that are not in the weights file
    mimi = MimiModel(config)
    mimi.upsample = mimi.decoder_transformer = mimi.decoder = None  # the decoding half: Parley's codec does that
    mimi = load_weights(mimi, folder, prefix="encoder.", device=device, dtype=torch.float32).to(device)  # and buffers
    return SpeechEncoder(mimi, r.integer("input_sample_rate", minimum=1),
                         r.integer("encode_downsample_rate", minimum=1), num_quantizers)
