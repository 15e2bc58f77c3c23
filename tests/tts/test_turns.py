"""Several streams of one engine at once, from real threads: each gives exactly its solo run's codes and audio, a
stream that asks waits for one turn of the others (not their utterances), and a cancel, a fault or the GPU running
out of memory in one stream leaves the others' speech whole."""

import sys
import threading
import time

import numpy as np
import pytest
import torch

from engine.errors import GPUUnavailableError
from engine.tts import SamplingOptions, load_tts
from engine.tts import stream as stream_module
from engine.tts.turns import Turns

LONG = "This sentence is one of very many in a long text. " * 9  # 450 characters: two segments
REQUESTS = [  # (text, speaker, seed, chunk_frames): one and two segments, chunks of 1, 3 and 4 frames
    ("Hello there.", "ryan", 1, 4),
    (LONG, "serena", 2, 1),
    ("A second, shorter one.", "aiden", 3, 3),
    ("Four at once.", "eric", 4, 4),
]


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread: on this shared two-core machine a second one waits at every barrier (the autouse
    torch_threads fixture restores the count)."""
    torch.set_num_threads(1)


def speak(tts, request, sampling=None):
    text, speaker, seed, chunk_frames = request
    return tts.stream(text, speaker, seed=seed, chunk_frames=chunk_frames, sampling=sampling)


def consume_at_once(streams, actions=None):
    """Iterate every stream on a thread of its own, all starting together; returns each one's chunks and what
    ended it (None, or its exception). actions[i](chunks) runs after each chunk of stream i."""
    chunks = [[] for _ in streams]
    errors = [None] * len(streams)
    start = threading.Barrier(len(streams))

    def consume(i):
        start.wait()
        try:
            for chunk in streams[i]:
                chunks[i].append(chunk)
                if actions and i in actions:
                    actions[i](chunks[i])
        except Exception as e:
            errors[i] = e

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(len(streams))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not any(thread.is_alive() for thread in threads)
    return chunks, errors


def assert_same_speech(got, want):
    """Chunk for chunk the same codes, segments and samples (the same floats, not close ones)."""
    assert [c.codes.shape[0] for c in got] == [c.codes.shape[0] for c in want]
    for a, b in zip(got, want):
        assert a.segment == b.segment
        assert np.array_equal(a.codes, b.codes)
        assert np.array_equal(a.pcm, b.pcm)


@pytest.mark.parametrize("count", [2, 4])
@pytest.mark.parametrize("sampling", [None, SamplingOptions.greedy()], ids=["sampled", "greedy"])
def test_streams_at_once_give_exactly_their_solo_speech(short_tts, count, sampling):
    """2 and 4 streams iterated at once from their own threads (one and two segments, chunks of 1, 3 and 4
    frames) give each the codes and PCM of its run alone with the same seed, sampled and greedy, and their
    chunks were made interleaved, not one utterance after another."""
    requests = REQUESTS[:count]
    solo = [list(speak(short_tts, r, sampling)) for r in requests]
    together, errors = consume_at_once([speak(short_tts, r, sampling) for r in requests])
    assert errors == [None] * count
    for got, want in zip(together, solo):
        assert_same_speech(got, want)
    first_ends = min(chunks[-1].t_ready for chunks in together)
    assert all(chunks[0].t_ready < first_ends for chunks in together)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("megakernel", [True, False], ids=["megakernel", "pytorch"])
@pytest.mark.parametrize(
    "sampling", [None, SamplingOptions.greedy(), SamplingOptions(top_p=0.8)], ids=["sampled", "greedy", "top_p"]
)
def test_cuda_streams_at_once_give_exactly_their_solo_speech(short_checkpoint, megakernel, sampling):
    """On CUDA in bf16 (the prefill's and the codec's CUDA graphs; the megakernel's whole frames, or with top_p < 1
    its one-token steps; or plain PyTorch) 4 streams at once from their own threads give each exactly its solo
    codes and PCM: nothing a turn leaves in the engine's shared buffers reaches another stream."""
    tts = load_tts(short_checkpoint, device="cuda", megakernel=megakernel)
    solo = [list(speak(tts, r, sampling)) for r in REQUESTS]
    together, errors = consume_at_once([speak(tts, r, sampling) for r in REQUESTS])
    assert errors == [None] * len(REQUESTS)
    for got, want in zip(together, solo):
        assert_same_speech(got, want)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_megakernel_streams_at_once_share_launches_and_one_may_leave(short_checkpoint):
    """With the megakernel, streams at once share its launches (engine/tts/kernels/batcher.py): the frames of
    several utterances made in one launch; each stream still gives exactly its solo codes and PCM, and one cancelled
    after its second chunk stops there while the others go on whole."""
    tts = load_tts(short_checkpoint, device="cuda", megakernel=True)
    requests = [*REQUESTS, (LONG, "vivian", 5, 2)]
    solo = [list(speak(tts, r)) for r in requests]
    assert tts._launches.shared_launches == 0  # one at a time: each launch its own
    streams = [speak(tts, r) for r in requests]

    def cancel_after_two(chunks):
        if len(chunks) == 2:
            streams[4].cancel()

    together, errors = consume_at_once(streams, {4: cancel_after_two})
    assert errors == [None] * len(requests)
    for got, want in zip(together[:4], solo[:4]):
        assert_same_speech(got, want)
    assert_same_speech(together[4], solo[4][:2])
    assert tts._launches.shared_launches > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_megakernel_streams_beginning_together_make_their_first_frames_in_a_shared_launch(short_checkpoint):
    """Streams that begin at once each hand their turn on once their prompt is in, so a launch makes the first frames
    of several (the 4 in one launch, unless a thread was slow to ask for its turn), where each stream's first launch
    made its own first frame before; each stream still gives exactly its solo codes and PCM."""
    tts = load_tts(short_checkpoint, device="cuda", megakernel=True)
    batcher = tts._launches
    solo = [list(speak(tts, r)) for r in REQUESTS]
    firsts = []  # a launch's count of the first frames it made, for each launch that made any

    def recorded(launch, runs_of):
        def wrapper(runs, frames):
            firsts.append(sum(run.state.frame == 0 for run in runs_of(runs)))
            return launch(runs, frames)
        return wrapper

    for kernel in batcher._batches:
        kernel.launch = recorded(kernel.launch, lambda runs: runs)
    batcher._single.launch = recorded(batcher._single.launch, lambda run: [run])
    together, errors = consume_at_once([speak(tts, r) for r in REQUESTS])
    assert errors == [None] * len(REQUESTS)
    for got, want in zip(together, solo):
        assert_same_speech(got, want)
    firsts = [n for n in firsts if n]  # the long text's second segment begins with a first frame of its own, later
    # the four streams' first frames in at most two launches, then the second segment's
    assert sum(firsts) == len(REQUESTS) + 1 and firsts[-1] == 1 and len(firsts) <= 3, firsts


def test_a_stream_asking_waits_for_one_turn_of_another_not_its_utterance(tiny_tts):
    """A second stream's first chunk comes after at most the chunk the first stream was making when it asked and
    one more (first come first served), long before the first stream ends."""
    first = tiny_tts.stream("A long utterance goes on.", "ryan", seed=1, chunk_frames=1)  # 175 frames: no EOS
    started, times = threading.Event(), []

    def consume():
        for chunk in first:
            times.append(chunk.t_ready)
            started.set()

    thread = threading.Thread(target=consume)
    thread.start()
    assert started.wait(timeout=120)
    asked = time.perf_counter()
    second = next(tiny_tts.stream("Me too.", "serena", seed=2))
    thread.join(timeout=600)
    between = [t for t in times if asked < t < second.t_ready]
    assert len(between) <= 2, f"{len(between)} chunks of the first stream came before the second's first"
    assert second.t_ready < times[-1] and len(times) == 175


def test_cancelling_one_stream_leaves_the_others_whole(short_tts):
    """One of three streams cancelled (from its own thread) after its second chunk stops there; the other two
    give exactly their solo speech."""
    requests = [REQUESTS[0], (LONG, "vivian", 5, 1), REQUESTS[2]]
    solo = [list(speak(short_tts, r)) for r in requests]
    streams = [speak(short_tts, r) for r in requests]

    def cancel_after_two(chunks):
        if len(chunks) == 2:
            streams[1].cancel()

    together, errors = consume_at_once(streams, {1: cancel_after_two})
    assert errors == [None] * 3
    assert_same_speech(together[1], solo[1][:2])
    assert_same_speech(together[0], solo[0])
    assert_same_speech(together[2], solo[2])


def test_a_stream_that_fails_leaves_the_others_whole(short_tts, monkeypatch):
    """A stream whose sampler fails at its fourth frame raises in its own thread; the others give exactly their
    solo speech, and the engine speaks on after (the failed stream's turn was handed on)."""
    requests = [REQUESTS[0], (LONG, "vivian", 66, 1), REQUESTS[2]]
    solo = [list(speak(short_tts, r)) for r in requests]

    class Faulty(stream_module.Sampler):
        def talker(self, logits, frame):
            if frame == 3 and self.seed == 66:
                raise RuntimeError("a fault in one stream")
            return super().talker(logits, frame)

    monkeypatch.setattr(stream_module, "Sampler", Faulty)
    together, errors = consume_at_once([speak(short_tts, r) for r in requests])
    assert isinstance(errors[1], RuntimeError) and errors[0] is None and errors[2] is None
    assert_same_speech(together[1], solo[1][:3])
    assert_same_speech(together[0], solo[0])
    assert_same_speech(together[2], solo[2])
    assert_same_speech(list(speak(short_tts, requests[0])), solo[0])


def test_out_of_memory_in_one_stream_moves_every_live_stream_to_the_cpu(short_checkpoint, short_tts):
    """Two streams interleaved chunk by chunk on one thread (turns are taken per chunk, so one thread may drive
    both): the GPU running out of memory at one's third frame moves the engine in that stream's turn and restarts
    its segment; the other, mid-segment, restarts its own at its next turn. Both then give their whole solo speech
    after the chunks heard before, each with a notice saying why."""
    tts = load_tts(short_checkpoint, precision="float32")
    model = tts.model
    real = model.sample_frame

    def sample_frame(state, sampler):
        if sampler.seed == 5 and state.frame == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(state, sampler)

    model.sample_frame = sample_frame  # this model object only: the engine reloaded after it is clean
    requests = [("Hello there.", "ryan", 5, 1), ("Another voice.", "serena", 6, 1)]
    solo = [list(speak(short_tts, r)) for r in requests]
    failing, other = (speak(tts, r) for r in requests)
    heard = [[], [next(other)]]  # the other stream is one chunk into its segment on the old model
    heard[0] += [next(failing), next(failing)]  # two frames, then the third runs out of memory
    heard[0] += list(failing)
    heard[1] += list(other)
    assert tts.model is not model and tts.device == torch.device("cpu")
    assert_same_speech(heard[0], solo[0][:2] + solo[0])
    assert_same_speech(heard[1], solo[1][:1] + solo[1])
    assert isinstance(failing.notice, GPUUnavailableError) and "2.00 GiB" in str(failing.notice)
    assert isinstance(other.notice, GPUUnavailableError) and "another utterance" in str(other.notice)


def served_after_waiting(turns, asks) -> list:
    """While this thread holds the turn, each ask (name, *deadline) is a thread of its own asking for one, in this
    order; returns the names in the order the turns went to them."""
    served, threads = [], []

    def take(name, *deadline):
        with turns.turn(*deadline):
            served.append(name)

    with turns.turn():
        for name, *deadline in asks:
            threads.append(threading.Thread(target=take, args=(name, *deadline)))
            threads[-1].start()
            waited = time.monotonic() + 10
            while len(turns._waiting) < len(threads) and time.monotonic() < waited:  # asked, in this order
                time.sleep(0.001)
    for thread in threads:
        thread.join(timeout=10)
    return served


def test_turns_go_to_the_waiter_due_soonest_and_first_come_first_served_at_a_tie():
    """While one thread holds the turn, waiters due at 3, 1, 2 and 1 again are served at 1, 1 (in the order they
    asked), 2, then 3; one that asks with no deadline goes before them all."""
    served = served_after_waiting(Turns(), [("3", 3.0), ("1", 1.0), ("2", 2.0), ("1 again", 1.0), ("now",)])
    assert served == ["now", "1", "1 again", "2", "3"]


def test_a_turn_ending_wakes_only_the_waiter_due_next(monkeypatch):
    """Eight waiters are served in order, each woken once: the end of a turn wakes the one that takes the next, not
    every waiter to contend for the lock and wait again."""
    wake_ups = []

    class Counted(threading.Condition):
        def wait(self, timeout=None):
            woken = super().wait(timeout)
            if sys._getframe(1).f_globals["__name__"] == Turns.__module__:  # not threading's own (starting one)
                wake_ups.append(threading.get_ident())
            return woken

    monkeypatch.setattr(threading, "Condition", Counted)
    served = served_after_waiting(Turns(), [(d, d) for d in (8.0, 3.0, 6.0, 1.0, 7.0, 2.0, 5.0, 4.0)])
    assert served == sorted(served) and len(served) == 8
    assert len(wake_ups) == 8


def test_a_stream_asks_for_each_turn_by_when_its_listener_runs_out_of_audio(tiny_tts, monkeypatch):
    """Each chunk's turn is asked for with the stream's start plus the audio handed out before it as its deadline, or
    the moment it asks where that is past: a stream that has just begun is due at once, one ahead of real time only
    when its listener would run out."""
    asked, real = [], tiny_tts._turns.turn

    def turn(*deadline):
        asked.append((*deadline, time.perf_counter()))
        return real(*deadline)

    monkeypatch.setattr(tiny_tts._turns, "turn", turn)
    stream = tiny_tts.stream("Hello there.", "ryan", seed=1, chunk_frames=2)
    chunks = []
    for chunk in stream:
        chunks.append(chunk)
        time.sleep(0.3 if len(chunks) == 2 else 0)  # a listener that pauses: the stream falls behind
    due = stream.t_start + np.cumsum([0.0] + [len(c.pcm) / tiny_tts.sample_rate_hz for c in chunks])
    assert len(chunks) > 3 and len(asked) == len(chunks) + 1  # the last ask finds the end
    for (deadline, at), when in zip(asked, due):
        assert deadline == pytest.approx(max(when, at), abs=1e-3)
    assert asked[2][0] > due[2]  # behind after the pause: due as it asks


def test_a_thread_holding_the_turn_cannot_ask_again():
    """Asking for a turn while holding it is an error, not a thread waiting for itself for ever; the turn is free
    after."""
    turns = Turns()
    with turns.turn():
        with pytest.raises(RuntimeError, match="while holding it"):
            with turns.turn():
                pass
    with turns.turn():
        pass
