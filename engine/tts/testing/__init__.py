"""Random-weight checkpoints in the official layout, so tests and benchmarks run without downloads."""

from engine.tts.testing.checkpoint import SIZES, write_checkpoint

__all__ = ["SIZES", "write_checkpoint"]
