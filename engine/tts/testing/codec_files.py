"""Random-weight `speech_tokenizer/` folders in the official Qwen3-TTS 12 Hz layout, for tests.

A folder holds config.json (the keys Qwen3TTSTokenizerV2Config saves), model.safetensors (`encoder.*`
from transformers' MimiModel as the official Qwen3TTSTokenizerV2Encoder keeps it, `decoder.*` from
Parley's CodecDecoder) and preprocessor_config.json (the feature extractor the official loader asks
AutoFeatureExtractor for). The official qwen_tts package loads these folders, and so does load_codec.
"""

from __future__ import annotations

import copy
import json
import math
import os
import secrets
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import EncodecFeatureExtractor, MimiConfig, MimiModel

from engine.tts.codec import CodecConfig, CodecDecoder, Folded, ResidualUnit

__all__ = ["codec_config", "write_codec_folder", "randomize_decoder"]

SAMPLE_RATE_HZ = 24_000
FRAME_SAMPLES = 1920  # 80 ms at 24 kHz: 12.5 Hz frames

# decoder_config of the published checkpoints (Qwen/Qwen3-TTS-12Hz-*/speech_tokenizer/config.json).
# The last three keys are in the published file but unused by the official decoder (every codebook,
# the semantic one too, has codebook_size entries); they are kept so readers meet what they will meet.
_FULL_DECODER = {
    "attention_bias": False,
    "attention_dropout": 0.0,
    "codebook_dim": 512,
    "codebook_size": 2048,
    "decoder_dim": 1536,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 512,
    "intermediate_size": 1024,
    "latent_dim": 1024,
    "layer_scale_initial_scale": 0.01,
    "max_position_embeddings": 8000,
    "num_attention_heads": 16,
    "num_hidden_layers": 8,
    "num_key_value_heads": 16,
    "num_quantizers": 16,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000,
    "sliding_window": 72,
    "upsample_rates": [8, 5, 4, 3],
    "upsampling_ratios": [2, 2],
    "num_semantic_quantizers": 1,
    "semantic_codebook_size": 4096,
    "vector_quantization_hidden_dimension": 512,
}

# Tiny keeps the structure (16 codebooks of 2048, the talker's code range; 2 + 4 upsampling stages;
# 1920 samples a frame; grouped KV heads; a head_dim that is not hidden / heads) with small widths,
# and a window of 8 frames so that a 100-frame test crosses it many times.
_TINY_DECODER = {
    **_FULL_DECODER,
    "codebook_dim": 32,
    "decoder_dim": 32,
    "head_dim": 16,
    "hidden_size": 32,
    "intermediate_size": 64,
    "latent_dim": 32,
    "num_attention_heads": 4,
    "num_hidden_layers": 3,
    "num_key_value_heads": 2,
    "sliding_window": 8,
    "vector_quantization_hidden_dimension": 32,
}

# MimiConfig's defaults are the 12 Hz tokenizer's encoder (Mimi: 24 kHz, 8*6*5*4 * 2 = 1920 samples
# a frame, 32 quantizers of which the first 16 are used). Tiny shrinks the widths only.
_FULL_ENCODER: dict = {"frame_rate": SAMPLE_RATE_HZ / FRAME_SAMPLES}
_TINY_ENCODER = {
    **_FULL_ENCODER,
    "hidden_size": 16,
    "num_filters": 4,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "intermediate_size": 32,
    "codebook_dim": 16,
    "vector_quantization_hidden_dimension": 16,
    "upsample_groups": 16,
}

_SIZES = {"tiny": (_TINY_DECODER, _TINY_ENCODER), "full": (_FULL_DECODER, _FULL_ENCODER)}


def codec_config(size: str) -> dict:
    """The config.json contents of a codec folder.

    Args:
        size: "tiny" (small widths, fast on a CPU) or "full" (the published model's sizes).
    Returns:
        A dict in the layout Qwen3TTSTokenizerV2Config.save_pretrained writes.
    Raises:
        ValueError: an unknown size.
    """
    if size not in _SIZES:
        raise ValueError(f"unknown codec size {size!r}; choose one of: {', '.join(_SIZES)}")
    decoder, encoder = _SIZES[size]
    encoder_config = MimiConfig(**encoder).to_diff_dict()
    encoder_config.pop("transformers_version", None)  # the official file has it at the top level only
    return {
        "architectures": ["Qwen3TTSTokenizerV2Model"],
        "model_type": "qwen3_tts_tokenizer_12hz",
        "dtype": "float32",
        "encoder_valid_num_quantizers": 16,
        "input_sample_rate": SAMPLE_RATE_HZ,
        "output_sample_rate": SAMPLE_RATE_HZ,
        "decode_upsample_rate": FRAME_SAMPLES,
        "encode_downsample_rate": FRAME_SAMPLES,
        "encoder_config": encoder_config,
        "decoder_config": copy.deepcopy(decoder),
    }


def write_codec_folder(folder: str | Path, size: str = "tiny", seed: int = 0) -> Path:
    """Write a complete speech_tokenizer/ folder with random weights; the same seed gives the same bytes.

    The folder is built beside its destination and renamed into place, so an error leaves nothing.

    Args:
        folder: the speech_tokenizer/ folder to create; it must not exist or be empty.
        size: "tiny" or "full" (see codec_config).
        seed: seeds the random weights.
    Returns:
        The folder.
    Raises:
        ValueError: an unknown size.
        FileExistsError: the folder exists and is not empty.
    """
    folder = Path(folder)
    config_json = codec_config(size)
    if folder.exists() and any(folder.iterdir()):
        raise FileExistsError(f"{folder}: already exists and is not empty")
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = folder.parent / f".{folder.name}.{secrets.token_hex(4)}.partial"
    staging.mkdir()
    try:
        (staging / "config.json").write_text(json.dumps(config_json, indent=2) + "\n", encoding="utf-8")
        config = CodecConfig.from_file(staging / "config.json")  # the writer reads it as Parley does
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            encoder = _encoder_tensors(config_json["encoder_config"])
            decoder = CodecDecoder(config)
            randomize_decoder(decoder, torch.Generator().manual_seed(seed))
        tensors = {**encoder, **{f"decoder.{k}": v.contiguous() for k, v in decoder.state_dict().items()}}
        save_file(tensors, str(staging / "model.safetensors"), metadata={"format": "pt"})
        extractor = EncodecFeatureExtractor(feature_size=1, sampling_rate=config_json["input_sample_rate"])
        (staging / "preprocessor_config.json").write_text(extractor.to_json_string(), encoding="utf-8")
        os.replace(staging, folder)  # replaces an empty folder too
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return folder


@torch.no_grad()
def _encoder_tensors(encoder_config: dict) -> dict[str, torch.Tensor]:
    """`encoder.*` tensors: a MimiModel without its decoding half, as Qwen3TTSTokenizerV2Encoder keeps it.

    MimiModel's own initialization leaves every codebook entry at zero, so every frame would encode to code 0:
    the entries get random values instead, small beside the encoder's outputs (std ~5 on speech-level input), so
    the nearest entry follows the input and each of the 16 codebooks picks varied codes. Each codebook stores its
    entries times a usage count; the counts vary, so a reader that skips the division is caught.
    """
    mimi = MimiModel(MimiConfig(**encoder_config))
    mimi.upsample = mimi.decoder_transformer = mimi.decoder = None
    for name, module in mimi.named_modules():
        if name.endswith(".codebook"):
            usage = torch.rand(module.cluster_usage.shape) * 3.5 + 0.5
            module.cluster_usage.copy_(usage)
            module.embed_sum.copy_(0.5 * torch.randn(module.embed_sum.shape) * usage[:, None])
    return {f"encoder.{k}": v.clone().contiguous() for k, v in mimi.state_dict().items()}


@torch.no_grad()
def randomize_decoder(decoder: CodecDecoder, generator: torch.Generator) -> None:
    """Fill a decoder with random weights that keep activations finite and the audio mostly unclipped.

    Every parameter gets a value that matters (no zero biases, no unit norms), so a test catches a
    weight read from the wrong place: variance-preserving conv/linear weights, layer scales around
    the configured value, and a few near-empty codebook entries that only decode sensibly if
    cluster_usage is clamped the official way.
    """
    config = decoder.config

    def normal(shape, std, mean=0.0):
        return torch.randn(shape, generator=generator) * std + mean

    def uniform(shape, low, high):
        return torch.rand(shape, generator=generator) * (high - low) + low

    for name, p in decoder.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "embedding_sum":
            continue  # set with its cluster_usage below
        if leaf == "cluster_usage":
            usage = uniform(p.shape, 0.5, 4.0)
            usage[:: max(1, p.shape[0] // 8)] = 1e-7  # below the 1e-5 clamp
            entries = normal((p.shape[0], config.codebook_dim // 2), 1.0)
            sums = entries * usage.clamp(min=1e-5)[:, None]
            p.copy_(usage)
            decoder.get_submodule(name.rsplit(".", 1)[0]).embedding_sum.copy_(sums)
        elif leaf == "scale":  # transformer LayerScale
            p.copy_(config.layer_scale_initial_scale * uniform(p.shape, 0.5, 1.5))
        elif leaf == "gamma":  # ConvNeXt layer scale
            p.copy_(uniform(p.shape, 0.05, 0.15))
        elif leaf in ("alpha", "beta"):  # Snake, as log-parameters
            p.copy_(normal(p.shape, 0.2))
        elif leaf == "bias":
            p.copy_(normal(p.shape, 0.02))
        elif p.dim() == 1:  # RMSNorm / LayerNorm weights
            p.copy_(normal(p.shape, 0.1, mean=1.0))
        else:
            p.copy_(normal(p.shape, 1.0 / math.sqrt(_fan_in(decoder, name, p))))
    for module in decoder.modules():
        if isinstance(module, ResidualUnit):  # a unit branch at ~1/3 of its input keeps 12 units from blowing up
            module.conv2.conv.weight.mul_(0.3)
    # The last conv writes the waveform: keep it well inside [-1, 1] so clamping rarely hides a difference.
    decoder.decoder[-1].conv.weight.mul_(0.1)
    for module in decoder.modules():
        if isinstance(module, Folded):  # written in place above: what it computes from its weights is stale
            module.fold()


def _fan_in(decoder: CodecDecoder, name: str, p: torch.Tensor) -> int:
    """Inputs summed per output: in_channels * kernel / stride for a transposed conv, else in * kernel."""
    module = decoder.get_submodule(name.rsplit(".", 1)[0])
    if isinstance(module, torch.nn.ConvTranspose1d):
        return max(1, p.shape[0] * p.shape[2] // module.stride[0])
    return math.prod(p.shape[1:])
