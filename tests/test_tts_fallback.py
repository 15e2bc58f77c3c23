"""The GPU running out of memory mid-utterance: the speech engine moves to the CPU, starts the segment again and
says so; through the conversation loop the turn is still spoken whole and saved. CPU tests inject the fault
into the real model; the GPU test causes a real out-of-memory (skipped without CUDA)."""

import numpy as np
import pytest
import torch

from engine.errors import GPUUnavailableError
from engine.tts import load_tts

TEXT = "First part, second part."


def fail_at_frame(tts, n):
    """Makes the real model's n-th sample_frame call raise torch.OutOfMemoryError, as the CUDA allocator does."""
    model, calls = tts.model, [0]
    real = model.sample_frame

    def sample_frame(state, sampler):
        calls[0] += 1
        if calls[0] == n:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(state, sampler)

    model.sample_frame = sample_frame  # on this model object only: the CPU engine reloaded after it is clean
    return model


def test_out_of_memory_mid_segment_restarts_it_on_a_reloaded_cpu_engine(short_checkpoint, short_tts):
    """The 3rd frame raising OutOfMemoryError: the stream carries on with the whole segment again, equal to a
    clean run, a GPUUnavailableError notice, and a new model object in the engine."""
    tts = load_tts(short_checkpoint, precision="float32")  # as short_tts, the reference
    failing = fail_at_frame(tts, 3)
    stream = tts.stream("Hello there.", "ryan", seed=5)
    chunks = list(stream)
    reference = list(short_tts.stream("Hello there.", "ryan", seed=5))
    # the two 1-frame chunks came out before the fault; then the segment from its start
    for got, want in zip(chunks[:2], reference[:2]):
        np.testing.assert_array_equal(got.pcm, want.pcm)
    # later chunks are chunk_frames long, so compare the joined segment (the codec streams exactly)
    np.testing.assert_array_equal(np.concatenate([c.codes for c in chunks[2:]]),
                                  np.concatenate([c.codes for c in reference]))
    np.testing.assert_allclose(np.concatenate([c.pcm for c in chunks[2:]]),
                               np.concatenate([c.pcm for c in reference]), atol=1e-5)
    assert isinstance(stream.notice, GPUUnavailableError)
    assert "ran out of memory" in str(stream.notice) and "speaks on the CPU" in str(stream.notice)
    assert tts.model is not failing and tts.device == torch.device("cpu")
    assert list(tts.stream("Hello there.", "ryan", seed=5))[0].codes.tolist() == reference[0].codes.tolist()


def test_out_of_memory_twice_is_raised(short_checkpoint):
    """A second OutOfMemoryError in the same stream (after the move) is raised, not retried for ever."""
    tts = load_tts(short_checkpoint)
    fail_at_frame(tts, 1)
    real_move = tts._move_to_cpu  # what a stream calls, in its turn

    def move_and_break():
        real_move()
        fail_at_frame(tts, 1)

    tts._move_to_cpu = move_and_break
    with pytest.raises(torch.OutOfMemoryError):
        list(tts.stream("Hello there.", "ryan", seed=5))


@pytest.fixture
def dialogue(smollm2_path, short_checkpoint, pulse_server, tmp_path):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the README's install builds it)")
    from engine.audio import Player
    from engine.history import HistoryStore
    from engine.llm.chat import ChatModel, ChatOptions
    from engine.llm.clauses import ClauseOptions
    from engine.dialogue import Dialogue, DialogueOptions

    pulse_server.ensure_running()
    chat = ChatModel(smollm2_path, ChatOptions(n_ctx=512, max_tokens=12, n_threads=1, temperature=0.0))
    with Player() as player, HistoryStore(tmp_path / "history.sqlite3") as history:
        yield Dialogue(chat, load_tts(short_checkpoint), player, history,
                       options=DialogueOptions(speaker="ryan", tts_seed=1,
                                               clauses=ClauseOptions(min_first_words=1, min_words=2)))


def test_a_turn_hit_by_out_of_memory_is_spoken_whole_noticed_and_saved(dialogue, short_tts):
    """say() with the fault in its first clause: every clause plays to its end, a Notice carries the
    GPUUnavailableError, the audio written is the chunks before the fault plus both whole clauses, and the turn is
    saved."""
    from engine.events import Notice

    fail_at_frame(dialogue.tts, 3)
    seen = []
    before = dialogue.player.stats().frames_written
    result = dialogue.say(TEXT, lambda event: seen.append(event.error) if isinstance(event, Notice) else None)
    written = dialogue.player.stats().frames_written - before

    assert result.heard_text == TEXT and not result.interrupted
    assert len(seen) == 1 and isinstance(seen[0], GPUUnavailableError)
    clean = sum(short_tts.synthesize(clause, "ryan", seed=1).size for clause in ("First part,", "second part."))
    expected = (2 * 1920 + clean) * dialogue.player.rate_hz / 24_000  # the two 80 ms chunks before the fault
    assert abs(written - expected) <= 0.01 * expected  # the device's resampler holds back a few frames
    (turn,) = dialogue.history.open_conversation(dialogue.conversation_id).turns
    assert (turn.role, turn.text, turn.interrupted) == ("assistant", TEXT, False)
    assert dialogue.tts.device == torch.device("cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_real_out_of_memory_on_the_gpu_moves_the_stream_to_the_cpu(short_checkpoint):
    """The GPU filled with tensors after the engine loaded: the stream's next allocation fails for real, it
    moves to the CPU, finishes the utterance and frees the GPU model; loading with the GPU full gets the CPU."""
    tts = load_tts(short_checkpoint, device="cuda")
    assert tts.device.type == "cuda"
    filler = []

    def fill():
        # every byte the allocator can get, in ever smaller blocks, down to its small-block pool: the codec's
        # and the prefill's CUDA graphs replay in memory of their own, so only the stream's small tensors
        # (its KV cache, each chunk's output) still allocate, and they must fail for real
        torch.cuda.empty_cache()
        block = 1 << 30
        while block >= 512:
            try:
                filler.append(torch.empty(block, dtype=torch.uint8, device="cuda"))
            except torch.OutOfMemoryError:
                block //= 2

    try:
        fill()
        stream = tts.stream("Hello there.", "ryan", seed=5)
        chunks = list(stream)
        assert isinstance(stream.notice, GPUUnavailableError) and tts.device == torch.device("cpu")
        codes = np.concatenate([c.codes for c in chunks])
        # the engine speaks on the CPU at its own precision now: its fresh utterance is the restarted segment
        clean = np.concatenate([c.codes for c in tts.stream("Hello there.", "ryan", seed=5)])
        np.testing.assert_array_equal(codes[-len(clean):], clean)  # the restarted segment is whole
        fill()  # again: moving to the CPU gave the GPU model's memory back
        assert load_tts(short_checkpoint, device="cuda").device == torch.device("cpu")
    finally:
        filler.clear()
        torch.cuda.empty_cache()
    assert torch.cuda.memory_allocated() < 1 << 20  # the GPU model and its stream state are gone
