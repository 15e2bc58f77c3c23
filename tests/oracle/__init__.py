"""The official qwen-tts package, imported as a test oracle (never by engine/)."""

import importlib
import os
import sys
import warnings

_STUBS = os.path.join(os.path.dirname(__file__), "stubs")


def import_qwen_tts():
    """Import qwen_tts with the torchaudio stub on the path; returns the package."""
    if _STUBS not in sys.path:
        sys.path.insert(0, _STUBS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return importlib.import_module("qwen_tts")
