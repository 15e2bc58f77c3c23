"""Whisper beside the turn (engine/transcribing.py) on the real Whisper base model and espeak-ng speech."""

import threading
import time

from engine.stt.vad import Turn
from engine.transcribing import TranscribingAhead
from tests.conftest import QUESTION, QUESTION_WORD


class TimedTranscriber:
    """The Transcriber, recording when each transcription ran and whether it was quick."""

    def __init__(self, transcriber):
        self._transcriber, self.calls = transcriber, []

    def transcribe(self, audio, **options):
        start = time.monotonic()
        transcript = self._transcriber.transcribe(audio, **options)
        self.calls.append((start, time.monotonic(), options.get("quick", False)))
        return transcript


def test_partials_leave_whisper_free_half_the_time_and_are_quick(transcriber, speak):
    """Offered far faster than Whisper can go, partials rest after each as long as it took: Whisper is free at least
    half the time, so the turn's own transcription seldom waits for one; each is a quick one (no language detection),
    and the newest offer is the one transcribed."""
    timed, closing, partials = TimedTranscriber(transcriber), threading.Event(), []
    ahead = TranscribingAhead(timed, True, closing, on_partial=lambda n, text: partials.append((n, text)),
                              on_early=lambda key, transcript: None)
    for thread in ahead.threads:
        thread.start()
    audio = speak(QUESTION)
    try:
        for n in range(120):  # every 50 ms for 6 s
            ahead.offer_partial(n, audio)
            time.sleep(0.05)
    finally:
        closing.set()
        for thread in ahead.threads:
            thread.join()
    calls = [(begin, end) for begin, end, _ in timed.calls]
    assert len(calls) >= 2 and all(quick for _, _, quick in timed.calls)
    for (begin, end), (following, _) in zip(calls, calls[1:]):
        assert following - end >= 0.9 * (end - begin), calls
    assert partials and all(QUESTION_WORD in text.lower() for _, text in partials)
    numbers = [n for n, _ in partials]
    assert numbers == sorted(numbers) and numbers[-1] - numbers[0] >= len(numbers) - 1


def test_a_pauses_words_go_before_any_partial(transcriber, speak):
    """A pause's early transcription wins Whisper: a partial of the speech before the pause is dropped, and none
    starts while the pause's words wait to be made (they would wait for it); once they are made, partials go on."""
    timed, closing, partials, early = TimedTranscriber(transcriber), threading.Event(), [], threading.Event()
    ahead = TranscribingAhead(timed, True, closing, on_partial=lambda n, text: partials.append(n),
                              on_early=lambda key, transcript: early.set())
    early_thread, partials_thread = ahead.threads
    audio = speak(QUESTION)
    ahead.offer_partial(0, audio)  # the speech before the pause, not taken yet
    ahead.offer_early(Turn(audio, 0, len(audio), "silence"))
    ahead.offer_partial(1, audio)  # the voice goes on while the pause's words wait
    partials_thread.start()
    try:
        time.sleep(1.0)
        assert timed.calls == []  # Whisper was free, yet neither partial took it
        early_thread.start()
        assert early.wait(30)
        time.sleep(1.0)
        assert [quick for _, _, quick in timed.calls] == [False] and partials == []
        ahead.offer_partial(2, audio)
        deadline = time.monotonic() + 30
        while not partials and time.monotonic() < deadline:
            time.sleep(0.05)
        assert partials == [2]
    finally:
        closing.set()
        for thread in ahead.threads:
            if thread.is_alive():
                thread.join()
