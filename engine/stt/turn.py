"""End of turn from the voice itself: whether a pause is the end of what the user wanted to say, or a pause for thought;
and from the words (`judge_words`), once they are transcribed.

The model is Smart Turn v3.2 (Pipecat's open model, BSD-2-Clause: a Whisper-tiny encoder with a classifier, 8.7 MB,
int8), which ships inside the pipecat-ai package. The app installs that package without its dependencies and reads the
model file only: pipecat-ai's own requirements (aiohttp, openai, numba, Pillow, ..., about 94 MB) are not needed to
run it (the pipecat extra, for engine/pipecat_service.py, brings them). onnxruntime runs it on the CPU, on the Whisper
log-mel features (faster-whisper's FeatureExtractor) of the last 8 s of the utterance, pause included, after zero-mean
unit-variance normalisation, as Pipecat's LocalSmartTurnAnalyzerV3 does.
"""

from __future__ import annotations

import enum
import logging
import os
from pathlib import Path

import numpy as np

from engine.errors import ModelFilesError, ModelMissingError
from engine.models import package_folder

log = logging.getLogger(__name__)

__all__ = ["HOW_TO_GET", "Meaning", "TurnModel", "Words", "default_threads", "judge_words", "trails_off",
           "turn_model_path"]

SAMPLE_RATE_HZ = 16_000
WINDOW_S = 8  # the model's input: the last 8 s, zeros before shorter audio
HOW_TO_GET = "install it with: pip install --no-deps pipecat-ai==1.14.0"
_MODEL_FILE = ("audio", "turn", "smart_turn", "data", "smart-turn-v3.2-cpu.onnx")


def turn_model_path() -> Path:
    """The Smart Turn v3.2 model file in the installed pipecat-ai package (found, not imported).

    Raises:
        ModelFilesError: the package is not installed, or lacks the file; the message says how to install it.
    """
    folder = package_folder("pipecat")
    path = None if folder is None else folder.joinpath(*_MODEL_FILE)
    if path is None or not path.is_file():
        raise ModelMissingError(f"the end-of-turn model (Smart Turn v3.2, from pipecat-ai) is not installed; "
                              f"{HOW_TO_GET}")
    return path


class TurnModel:
    """Smart Turn v3.2 on the CPU: probability() of an utterance being complete. Not thread-safe: one listening
    thread asks it.

    Args:
        path: the ONNX file; None finds it in the pipecat-ai package.
        threads: CPU threads for one inference; None: a quarter of the cores, 1 to 4 (default_threads).
    Raises:
        ModelFilesError: the file is missing, or onnxruntime cannot read it.
    """

    def __init__(self, path: Path | None = None, threads: int | None = None):
        import onnxruntime
        from faster_whisper.feature_extractor import FeatureExtractor

        self.path = Path(path) if path is not None else turn_model_path()
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads or default_threads()
        options.inter_op_num_threads = 1
        try:
            self._session = onnxruntime.InferenceSession(str(self.path), sess_options=options,
                                                         providers=["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime raises its own types for missing and corrupt files
            raise ModelFilesError(f"{self.path}: the end-of-turn model cannot be loaded ({e}); {HOW_TO_GET}") from None
        self._features = FeatureExtractor(chunk_length=WINDOW_S)
        self._frames = WINDOW_S * SAMPLE_RATE_HZ // self._features.hop_length  # 800

    def probability(self, audio_16k: np.ndarray) -> float:
        """How likely it is that the user has finished: 0..1 (above 0.5, the model's own cut, they have).

        Args:
            audio_16k: (n,) float32 mono at 16 kHz: the utterance, with the pause after it so far.
        """
        window = WINDOW_S * SAMPLE_RATE_HZ
        audio = np.asarray(audio_16k, np.float32)[-window:]
        audio = np.pad(audio, (window - len(audio), 0))
        audio = (audio - audio.mean()) / np.sqrt(audio.var() + 1e-7)
        features = self._features(audio.astype(np.float32), padding=0)[:, : self._frames]
        (logits,) = self._session.run(None, {"input_features": features[None]})
        return float(np.asarray(logits).ravel()[0])  # the model ends in a sigmoid: already a probability


def default_threads() -> int:
    """The turn model's CPU threads: a quarter of the cores, at least 1 and at most 4. Every pause's decision waits for
    its answer (on 16 idle cores 51 ms with one thread, 21 with four: docs/BENCHMARKS.md), while Whisper transcribes
    that pause and the LLM begins its reply: the other cores are theirs. On 2 cores it runs on one, beside them."""
    return max(1, min(4, (os.cpu_count() or 1) // 4))


# English words a finished sentence seldom ends on: articles, prepositions, conjunctions, possessives, auxiliaries and
# fillers ("a table for", "the best time to call me is", "so, um")
_TRAILING = frozenset("""
    a an the my your his her its our their every
    to for of at by with from into onto about than as like
    and but or nor because if when while though although unless until whether
    is are was were be been does did would could should shall may might must
    very he she we they
    um uh er erm hmm mm ah eh
""".split())  # not "so", "that", "you", "on", "do", "can": "I think so", "thank you", "turn it on", "I can" end turns


def trails_off(text: str, language: str) -> bool:
    """Whether a transcript (in `language`, a Whisper code) stops mid-sentence: it ends in "..." or a dash, or, in
    English, on a word a finished sentence seldom ends on. Another language's words are not judged.

    The end-of-turn model hears the voice; this reads the words, which a pause for thought leaves hanging, whatever
    the voice's pitch did (synthetic voices, and many speakers, fall at every pause).
    """
    text = text.strip()
    if text.endswith(("...", "…", "-", "—")):  # Whisper's marks of a voice trailing off or cut short
        return True
    if text.endswith(("?", "!")) or language != "en":
        return False
    words = text.rstrip(".,;:-–— ").split()
    return bool(words) and words[-1].strip("\"'“”‘’()").lower() in _TRAILING



class Words(enum.Enum):
    """What the end of a turn's transcript says (judge_words)."""

    TRAILING = "trailing"  # it stops mid-sentence: more is coming, whatever the voice did
    OPEN = "open"  # no sign either way: the voice decides
    SENTENCE = "sentence"  # a sentence ends there plainly: finished, though the voice may sound as if it goes on


class Meaning(enum.Enum):
    """What words that end a sentence read as (engine/stt/turn_text.py TextTurnModel.read)."""

    WHOLE = "whole"  # a whole message, such as a question: the user has finished
    STATEMENT = "statement"  # a finished sentence, after which a user may go on or not
    PART = "part"  # neither: a fragment, often Whisper's full stop on a hanging voice ("The best!")


_FINAL_MARKS = (".", "?", "!", "。", "？", "！")


def judge_words(text: str, language: str) -> Words:
    """Whether a transcript (in `language`, a Whisper code) trails off (trails_off), ends a sentence (its final mark,
    after a word a sentence can end on: in English, "Could you remind me to?" is Whisper's mark on a hanging voice),
    or neither (no final mark: "dark green")."""
    if trails_off(text, language):
        return Words.TRAILING
    text = text.strip()
    if not text.endswith(_FINAL_MARKS):
        return Words.OPEN
    words = text.rstrip("".join(_FINAL_MARKS) + " ").split()
    if language == "en" and words and words[-1].strip("\"'“”‘’()").lower() in _TRAILING:
        return Words.OPEN
    return Words.SENTENCE
