"""Qwen3-TTS (12 Hz) speech engine: checkpoint folders in, streamed 24 kHz speech out."""

from engine.tts.clone import CLONE_MODES, ClonedVoice, load_voice
from engine.tts.sampling import SamplingOptions
from engine.tts.stream import Chunk, TTSEngine, TTSStream, load_tts

__all__ = ["CLONE_MODES", "Chunk", "ClonedVoice", "SamplingOptions", "TTSEngine", "TTSStream", "load_tts", "load_voice"]
