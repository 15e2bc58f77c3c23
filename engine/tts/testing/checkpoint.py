"""Random-weight Qwen3-TTS checkpoints in the official folder layout, for tests and benchmarks.

A folder written here holds what a published checkpoint holds: config.json and generation_config.json
with the official keys, model.safetensors (bf16, the official tensor names; optionally sharded), the
Qwen text tokenizer files and speech_tokenizer/ (the codec, its encoder included). The ids in config.json
are the published 0.6B CustomVoice model's; sizes are the published ones ("0.6b", "1.7b") or tiny ones of
the same shape ("tiny" like the 0.6B, "tiny-1.7b" like the 1.7B: a wider talker than its code predictor).
A "base" model (voice cloning) has no speakers and no dialects, as Qwen/Qwen3-TTS-12Hz-*-Base, and a speaker
encoder: its config.json section and its `speaker_encoder.*` weights.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.tts.config import TTSConfig
from engine.tts.model import Qwen3TTS
from engine.tts.speaker import SpeakerEncoder
from engine.tts.testing.codec_files import write_codec_folder
from engine.tts.testing.tokenizer_files import write_tokenizer_files

SIZES = ("tiny", "tiny-1.7b", "0.6b", "1.7b")
MODEL_TYPES = ("custom_voice", "base")

# The published checkpoints' codec-track ids (talker_config of Qwen/Qwen3-TTS-12Hz-*-CustomVoice).
LANGUAGE_IDS = {"chinese": 2055, "english": 2050, "german": 2053, "italian": 2070, "portuguese": 2071,
                "spanish": 2054, "japanese": 2058, "korean": 2064, "french": 2061, "russian": 2069,
                "beijing_dialect": 2074, "sichuan_dialect": 2062}
SPEAKER_IDS = {"serena": 3066, "vivian": 3065, "uncle_fu": 3010, "ryan": 3061, "aiden": 2861,
               "ono_anna": 2873, "sohee": 2864, "eric": 2875, "dylan": 2878}
SPEAKER_DIALECTS = {"dylan": "beijing_dialect", "eric": "sichuan_dialect"}
GENERATION_CONFIG = {"do_sample": True, "repetition_penalty": 1.05, "temperature": 0.9, "top_p": 1.0,
                     "top_k": 50, "subtalker_dosample": True, "subtalker_temperature": 0.9,
                     "subtalker_top_k": 50, "subtalker_top_p": 1.0, "max_new_tokens": 8192}

# (talker hidden, intermediate, layers, heads, kv heads, head_dim), (predictor likewise), text hidden
_DIMS = {
    "tiny": ((64, 128, 3, 4, 2, 16), (64, 128, 2, 4, 2, 16), 96),
    "tiny-1.7b": ((96, 160, 3, 4, 2, 16), (64, 128, 2, 4, 2, 16), 96),
    "0.6b": ((1024, 3072, 28, 16, 8, 128), (1024, 3072, 5, 16, 8, 128), 2048),
    "1.7b": ((2048, 6144, 28, 16, 8, 128), (1024, 3072, 5, 16, 8, 128), 2048),
}


def _decoder_config(dims, vocab_size: int) -> dict:
    hidden, intermediate, layers, heads, kv_heads, head_dim = dims
    return {"hidden_size": hidden, "intermediate_size": intermediate, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
            "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 1000000, "vocab_size": vocab_size,
            "max_position_embeddings": 32768, "attention_bias": False, "use_sliding_window": False}


# speaker_encoder_config of a tiny Base model: the published layers, narrower (the published files write only
# enc_dim and sample_rate, leaving the official defaults: channels [512, 512, 512, 512, 1536], 128 attention and
# squeeze-excitation channels); mel_dim stays 128, the bins the official mel has
_TINY_SPEAKER_ENCODER = {"mel_dim": 128, "enc_channels": [32, 32, 32, 32, 96], "enc_kernel_sizes": [5, 3, 3, 3, 1],
                         "enc_dilations": [1, 2, 3, 4, 1], "enc_attention_channels": 16, "enc_res2net_scale": 8,
                         "enc_se_channels": 16}


def make_config(size: str, text: dict, model_type: str = "custom_voice") -> dict:
    """config.json for a size and model type; `text` holds the tokenizer's special ids and the text vocabulary size."""
    if size not in SIZES:
        raise ValueError(f"unknown size '{size}'; choose one of: {', '.join(SIZES)}")
    if model_type not in MODEL_TYPES:
        raise ValueError(f"unknown model type '{model_type}'; choose one of: {', '.join(MODEL_TYPES)}")
    base = model_type == "base"
    talker_dims, predictor_dims, text_hidden = _DIMS[size]
    head_dim = talker_dims[5]
    # interleaved M-RoPE sections as published ([24, 20, 20] of 64 rotary pairs), scaled to head_dim
    t = head_dim // 2
    section = [t - 2 * (t * 20 // 64), t * 20 // 64, t * 20 // 64]
    talker = _decoder_config(talker_dims, 3072)
    talker.update({
        "rope_scaling": {"interleaved": True, "mrope_section": section, "rope_type": "default", "type": "default"},
        "num_code_groups": 16, "text_hidden_size": text_hidden, "text_vocab_size": text["text_vocab_size"],
        "codec_eos_token_id": 2150, "codec_think_id": 2154, "codec_nothink_id": 2155,
        "codec_think_bos_id": 2156, "codec_think_eos_id": 2157, "codec_pad_id": 2148, "codec_bos_id": 2149,
        "codec_language_id": {k: v for k, v in LANGUAGE_IDS.items() if not (base and "dialect" in k)},
        "spk_id": {} if base else SPEAKER_IDS,
        "spk_is_dialect": {} if base else {name: SPEAKER_DIALECTS.get(name, False) for name in SPEAKER_IDS},
        "code_predictor_config": {**_decoder_config(predictor_dims, 2048), "num_code_groups": 16},
    })
    extra = {}
    if base:
        tiny = {} if size in ("0.6b", "1.7b") else _TINY_SPEAKER_ENCODER
        extra["speaker_encoder_config"] = {**tiny, "enc_dim": talker_dims[0], "sample_rate": 24000}
    return {
        "architectures": ["Qwen3TTSForConditionalGeneration"], "model_type": "qwen3_tts",
        "tokenizer_type": "qwen3_tts_tokenizer_12hz", "tts_model_type": model_type,
        "tts_model_size": "1b7" if "1.7b" in size else "0b6",
        "im_start_token_id": text["im_start"], "im_end_token_id": text["im_end"],
        "tts_pad_token_id": text["tts_pad"], "tts_bos_token_id": text["tts_bos"], "tts_eos_token_id": text["tts_eos"],
        "assistant_token_id": text["assistant"], "transformers_version": "4.57.3",
        "talker_config": talker, **extra,
    }


@torch.no_grad()
def random_weights(cfg: TTSConfig, seed: int) -> dict[str, torch.Tensor]:
    """bf16 tensors under the official names, scaled so activations stay O(1) through every layer."""
    generator = torch.Generator().manual_seed(seed)
    with torch.device("meta"):
        shapes = {name: t.shape for name, t in Qwen3TTS(cfg.talker).state_dict().items()}
        if cfg.speaker_encoder is not None:
            encoder = SpeakerEncoder(cfg.speaker_encoder).state_dict().items()
            shapes.update({f"speaker_encoder.{name}": t.shape for name, t in encoder})
    weights = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            w = 1.0 + 0.1 * torch.randn(shape, generator=generator)
        elif name.endswith(".bias"):
            w = 0.02 * torch.randn(shape, generator=generator)
        elif "embedding" in name:
            w = 0.5 * torch.randn(shape, generator=generator)
        else:
            # 1/sqrt(fan_in) (a convolution's: input channels times kernel): unit-variance outputs, so logits
            # have O(1) gaps and greedy ties are rare
            w = torch.randn(shape, generator=generator) / math.sqrt(math.prod(shape[1:]))
        weights[name] = w.to(torch.bfloat16)
    return weights


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_checkpoint(folder: str | Path, size: str = "tiny", seed: int = 0, shards: int = 1,
                     model_type: str = "custom_voice") -> Path:
    """Write a complete random checkpoint folder; returns its path. Nothing is left half-written.

    Args:
        folder: where the checkpoint goes (created; must not exist or be empty).
        size: one of SIZES.
        seed: makes the weights reproducible.
        shards: >1 writes model-0000N-of-0000M.safetensors plus model.safetensors.index.json.
        model_type: one of MODEL_TYPES: "custom_voice" (named speakers) or "base" (voice cloning).
    """
    folder = Path(folder)
    if folder.exists() and any(folder.iterdir()):
        raise FileExistsError(f"{folder} exists and is not empty")
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        text = write_tokenizer_files(staging, "tiny" if size.startswith("tiny") else "full")
        config = make_config(size, text, model_type)
        _write_json(staging / "config.json", config)
        _write_json(staging / "generation_config.json", GENERATION_CONFIG)
        weights = random_weights(TTSConfig.from_file(staging / "config.json"), seed)
        _save_weights(staging, weights, shards)
        write_codec_folder(staging / "speech_tokenizer", "tiny" if size.startswith("tiny") else "full", seed)
        staging.chmod(0o755)  # mkdtemp makes it owner-only; a checkpoint is an ordinary shared folder
        if folder.exists():
            folder.rmdir()
        os.replace(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return folder


def _save_weights(folder: Path, weights: dict[str, torch.Tensor], shards: int) -> None:
    if shards <= 1:
        save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
        return
    names = list(weights)
    weight_map, total = {}, 0
    for i in range(shards):
        part = names[i::shards]
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: weights[n] for n in part}, str(folder / file), metadata={"format": "pt"})
        weight_map.update({n: file for n in part})
        total += sum(weights[n].numel() * weights[n].element_size() for n in part)
    _write_json(folder / "model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": weight_map})
