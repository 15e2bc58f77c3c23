"""Parley's engine: a library with no Qt in it.

The speech engine lives in engine.tts (load_tts, TTSStream, Chunk, SamplingOptions); importing this
package stays light (no torch), so the command line starts fast.
"""

from engine.errors import AudioDeviceError, InputTextError, ModelFilesError, ParleyError

__all__ = ["AudioDeviceError", "InputTextError", "ModelFilesError", "ParleyError"]
