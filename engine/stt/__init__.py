"""Hearing: voice activity and end-of-turn (vad), speech to text with faster-whisper (whisper).

Capture hands 16 kHz blocks to an Endpointer, which yields SpeechStart and Turn events; a Turn's
audio goes to Transcriber.transcribe, which returns a Transcript.
"""

from engine.stt.vad import (
    BLOCK_SAMPLES,
    SAMPLE_RATE_HZ,
    Endpointer,
    Mode,
    SileroVad,
    SpeechStart,
    Turn,
    VadOptions,
    split_blocks,
)
from engine.stt.whisper import (
    Transcriber,
    TranscriberOptions,
    Transcript,
    assemble_bundled_model,
    find_whisper_model,
)

__all__ = [
    "BLOCK_SAMPLES",
    "SAMPLE_RATE_HZ",
    "Endpointer",
    "Mode",
    "SileroVad",
    "SpeechStart",
    "Transcriber",
    "TranscriberOptions",
    "Transcript",
    "Turn",
    "VadOptions",
    "assemble_bundled_model",
    "find_whisper_model",
    "split_blocks",
]
