"""Voice cloning with a Qwen3-TTS Base model: a recording (and what it says) -> a ClonedVoice, made once, saved to a
small file, and spoken in by TTSEngine.stream(text, voice=...) at no extra cost per utterance.

The two modes are the official generate_voice_clone's. "icl" (in-context, the official default) puts the
recording's codec codes and its transcript in the prompt, so the model goes on in the recording's voice; "x_vector"
puts only the speaker encoder's embedding where a CustomVoice model puts a speaker, and needs no transcript.
A recording is checked here (length, level, clipping) and brought to what both encoders take: mono, 24 kHz.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from engine.errors import InputTextError, ReferenceAudioError, VoiceFileError
from engine.text import clean_text, has_words

CLONE_MODES = ("icl", "x_vector")
# The official models clone from 3 s ("3-second voice cloning"); below that there is too little of a voice.
MIN_REFERENCE_S = 3.0
# People record 5-20 s. In "icl" mode every utterance's prompt holds the whole recording (12.5 codec frames a
# second): 30 s is 375 rows, which with the prompt's other rows still fits the largest prefill graph (512 rows,
# engine/tts/prefill.py); a longer recording adds cost to every utterance and nothing a voice needs.
MAX_REFERENCE_S = 30.0
# A recording whose RMS level is below -50 dBFS holds no usable speech (speech is recorded at -30 to -12 dBFS).
SILENT_DBFS = -50.0
# A sample at or beyond 0.999 is at full scale (16-bit audio's largest, 32767/32768, is 0.99997). More of them than
# 1 in 200 means the recording was clipped (a loud but clean one has a handful), and the clipping would be cloned.
FULL_SCALE = 0.999
MAX_CLIPPED_FRACTION = 0.005
_MAX_CHANNELS = 8  # more columns than this are not channels: the samples are the wrong way round

VOICE_FORMAT = "parley.cloned_voice"
VOICE_VERSION = 1
_FORMAT_KEYS = frozenset(("format", "version", "mode", "model_size", "reference_text"))
_MAX_HEADER_BYTES = 1 << 20  # a voice's header is ~1 kB; more is no voice file (and is not read whole)


@dataclass(frozen=True, eq=False)
class ClonedVoice:
    """A voice cloned from one recording, for the Base model it was made with. Immutable; compared and cached by
    identity, so an engine prepares what it needs for a voice once and reuses it for each utterance."""

    mode: str  # "icl" or "x_vector" (CLONE_MODES)
    embedding: torch.Tensor  # (hidden,) float32 on the CPU: the speaker encoder's embedding of the recording
    reference_codes: torch.Tensor | None  # (frames, 16) int64 on the CPU: the recording's codec codes; "icl" only
    reference_text: str | None  # what the recording says (cleaned); "icl" only
    model_size: str  # tts_model_size of the Base model it was cloned with ("0b6", "1b7")

    def save(self, path: str | Path, *, labels: dict[str, str] | None = None) -> Path:
        """Write the voice to one small safetensors file (the embedding, the codes, and JSON-free metadata: format,
        version, mode, model size, transcript); a file already there is replaced whole, never half-written.

        Args:
            labels: more text to keep in the file's metadata (the voice library keeps the voice's name and date;
                read_labels gives them back); none may take a key of the format's own.
        Returns:
            The path.
        Raises:
            OSError: the folder cannot be written.
            ValueError: a label of a key the format uses.
        """
        from safetensors.torch import save_file

        path = Path(path)
        tensors = {"embedding": self.embedding.float().contiguous()}
        taken = sorted(set(labels or {}) & _FORMAT_KEYS)
        if taken:
            raise ValueError(f"labels may not use the voice format's own keys: {', '.join(taken)}")
        metadata = {**(labels or {}), "format": VOICE_FORMAT, "version": str(VOICE_VERSION), "mode": self.mode,
                    "model_size": self.model_size}
        if self.reference_codes is not None:
            tensors["reference_codes"] = self.reference_codes.long().contiguous()
            metadata["reference_text"] = self.reference_text or ""
        fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        os.close(fd)
        try:
            save_file(tensors, temp, metadata=metadata)
            os.replace(temp, path)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise
        return path


def load_voice(path: str | Path) -> ClonedVoice:
    """Read a voice that ClonedVoice.save wrote.

    Raises:
        VoiceFileError: the file is missing, not a voice file, damaged, or of another format version.
    """
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise VoiceFileError(f"{path}: no such voice file")
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            metadata = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except Exception as e:  # safetensors raises its own error types for truncated or corrupt files
        raise VoiceFileError(f"{path}: not a voice file, or a damaged one ({e}); clone the voice again") from None
    if metadata.get("format") != VOICE_FORMAT:
        raise VoiceFileError(f"{path}: not a Parley voice file (format {metadata.get('format')!r})")
    if metadata.get("version") != str(VOICE_VERSION):
        raise VoiceFileError(f"{path}: a voice file of version {metadata.get('version')!r}; this Parley reads version "
                             f"{VOICE_VERSION}: clone the voice again")
    mode, embedding, codes = metadata.get("mode"), tensors.get("embedding"), tensors.get("reference_codes")
    problem = None
    if mode not in CLONE_MODES:
        problem = f"mode {mode!r} is not one of {', '.join(CLONE_MODES)}"
    elif embedding is None or embedding.dim() != 1 or not embedding.is_floating_point():
        problem = "no speaker embedding"
    elif not torch.isfinite(embedding).all():
        problem = "the speaker embedding is not finite"
    elif mode == "icl" and (codes is None or codes.dim() != 2 or codes.shape[0] < 1 or codes.is_floating_point()
                            or not metadata.get("reference_text")):
        problem = "an in-context voice without its recording's codes or transcript"
    elif codes is not None and bool((codes < 0).any()):
        problem = "negative codec codes"
    if problem:
        raise VoiceFileError(f"{path}: the voice file is damaged ({problem}); clone the voice again")
    icl = mode == "icl"
    return ClonedVoice(mode, embedding.float(), codes.long() if icl else None,
                       metadata["reference_text"] if icl else None, metadata.get("model_size", ""))


def read_labels(path: str | Path) -> dict[str, str]:
    """The labels ClonedVoice.save kept in a voice file (its metadata without the format's own keys); {} for a file
    without any, or one whose header cannot be read (load_voice says what is wrong with it).

    The header is read as the safetensors format lays it out (an 8-byte little-endian length, then JSON whose
    "__metadata__" holds the text), not through safetensors, which refuses the whole file when its tensors are cut
    short: the name of a damaged voice still shows.
    """
    try:
        with open(path, "rb") as f:
            length = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(min(length, _MAX_HEADER_BYTES)))
        metadata = header.get("__metadata__") or {}
        return {key: value for key, value in metadata.items() if key not in _FORMAT_KEYS and isinstance(value, str)}
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):  # json's errors are ValueErrors
        return {}


def read_reference(audio, sample_rate_hz: int | None, target_rate_hz: int) -> np.ndarray:
    """A recording to clone from, checked and made mono at target_rate_hz.

    Args:
        audio: a path to an audio file soundfile reads (WAV, FLAC, OGG, ...), or samples: float in [-1, 1] or integer
            PCM, shaped (samples,) or (samples, channels) as soundfile returns them. Channels are mixed down.
        sample_rate_hz: the samples' rate; None for a file (its own rate is used).
        target_rate_hz: the rate to resample to (with soxr's high quality).
    Returns:
        (samples,) float32 at target_rate_hz.
    Raises:
        ReferenceAudioError: not audio, shorter than MIN_REFERENCE_S or longer than MAX_REFERENCE_S, silent,
            or clipped (more than MAX_CLIPPED_FRACTION of the samples at full scale).
        ValueError: samples without a sample rate, or a file with one.
    """
    if isinstance(audio, (str, Path)):
        if sample_rate_hz is not None:
            raise ValueError("a file's sample rate is its own: pass sample_rate_hz only with samples")
        samples, sample_rate_hz = _read_file(Path(audio))
        where = f"{audio}: "
    else:
        if sample_rate_hz is None or int(sample_rate_hz) < 1:
            raise ValueError(f"samples need their sample rate (sample_rate_hz), got {sample_rate_hz!r}")
        samples, where = _as_float(np.asarray(audio)), ""
    if samples.ndim == 1:
        samples = samples[:, None]
    if samples.ndim != 2 or samples.shape[1] > _MAX_CHANNELS:
        raise ReferenceAudioError(f"{where}samples of shape {samples.shape} are not a recording: expected (samples,) "
                                  f"or (samples, channels) with up to {_MAX_CHANNELS} channels")
    if not np.isfinite(samples).all():
        raise ReferenceAudioError(f"{where}the recording holds samples that are not numbers (NaN or infinity)")
    seconds = samples.shape[0] / sample_rate_hz
    if seconds < MIN_REFERENCE_S or seconds > MAX_REFERENCE_S:
        raise ReferenceAudioError(f"{where}the recording is {seconds:.1f} s long; a voice is cloned from "
                                  f"{MIN_REFERENCE_S:g} to {MAX_REFERENCE_S:g} s of speech (5 to 20 s is best)")
    clipped = float(np.mean(np.abs(samples) >= FULL_SCALE))
    if clipped > MAX_CLIPPED_FRACTION:
        raise ReferenceAudioError(f"{where}the recording is clipped ({clipped:.1%} of its samples are at full scale); "
                                  "record it again with the input level lower")
    mono = samples.mean(axis=1, dtype=np.float64).astype(np.float32)
    rms = float(np.sqrt(np.mean(np.square(mono, dtype=np.float64))))
    level = 20 * math.log10(rms) if rms > 0 else -math.inf
    if level < SILENT_DBFS:
        raise ReferenceAudioError(f"{where}the recording is silent (its level is {level:.0f} dBFS); check that the "
                                  "microphone works and is not muted, and record again")
    if sample_rate_hz != target_rate_hz:
        import soxr

        mono = soxr.resample(mono, sample_rate_hz, target_rate_hz, quality="HQ").astype(np.float32)
    return mono


def _read_file(path: Path) -> tuple[np.ndarray, int]:
    import soundfile

    if not path.is_file():
        raise ReferenceAudioError(f"{path}: no such file")
    try:
        samples, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    except (soundfile.LibsndfileError, RuntimeError, TypeError) as e:
        raise ReferenceAudioError(f"{path}: not an audio file Parley can read ({e}); use WAV, FLAC or OGG") from None
    return samples, int(rate)


def _as_float(samples: np.ndarray) -> np.ndarray:
    """Samples as float32 in [-1, 1]: floats as they are, integer PCM scaled by its full scale."""
    if samples.dtype.kind == "f":
        return samples.astype(np.float32, copy=False)
    if samples.dtype.kind in "iu" and samples.dtype.itemsize in (1, 2, 4):
        info = np.iinfo(samples.dtype)
        # unsigned PCM (8-bit WAV) is centred on its middle value
        offset = (int(info.max) + 1) // 2 if samples.dtype.kind == "u" else 0
        return ((samples.astype(np.float64) - offset) / (int(info.max) + 1 - offset)).astype(np.float32)
    raise ReferenceAudioError(f"samples of type {samples.dtype} are not audio: expected float or integer PCM")


def clone_voice(speaker_encoder, speech_encoder, model_size: str, audio, sample_rate_hz: int | None, text: str | None,
                mode: str) -> ClonedVoice:
    """TTSEngine.clone_voice on the engine's two encoders (see there)."""
    if mode not in CLONE_MODES:
        raise ValueError(f"unknown clone mode {mode!r}; choose one of: {', '.join(CLONE_MODES)}")
    text = clean_text(text).strip() if text and has_words(text) else ""
    if mode == "icl" and not text:
        raise InputTextError("cloning in 'icl' mode needs what the recording says (text=...); without it, clone in "
                             "'x_vector' mode")
    samples = torch.from_numpy(read_reference(audio, sample_rate_hz, speaker_encoder.cfg.sample_rate_hz))
    embedding = speaker_encoder.embed(samples).cpu()
    if mode == "x_vector":
        return ClonedVoice(mode, embedding, None, None, model_size)
    return ClonedVoice(mode, embedding, speech_encoder.encode(samples), text, model_size)
