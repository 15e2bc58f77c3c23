"""Whisper beside the turn (engine/transcribing.py) on the real Whisper base model and espeak-ng speech."""

import threading
import time

from engine.transcribing import TranscribingAhead
from tests.conftest import QUESTION, QUESTION_WORD


class TimedTranscriber:
    """The Transcriber, recording when each transcription ran and whether it was a partial one."""

    def __init__(self, transcriber):
        self._transcriber, self.calls = transcriber, []

    def transcribe(self, audio, **options):
        start = time.monotonic()
        transcript = self._transcriber.transcribe(audio, **options)
        self.calls.append((start, time.monotonic(), options.get("partial", False)))
        return transcript


def test_partials_leave_whisper_free_half_the_time_and_are_quick(transcriber, speak):
    """Offered far faster than Whisper can go, partials rest after each as long as it took: Whisper is free at least
    half the time, so the turn's own transcription seldom waits for one; each is a partial one (no language detection,
    a shorter window), and the newest offer is the one transcribed."""
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
    assert len(calls) >= 2 and all(partial for _, _, partial in timed.calls)
    for (begin, end), (following, _) in zip(calls, calls[1:]):
        assert following - end >= 0.9 * (end - begin), calls
    assert partials and all(QUESTION_WORD in text.lower() for _, text in partials)
    numbers = [n for n, _ in partials]
    assert numbers == sorted(numbers) and numbers[-1] - numbers[0] >= len(numbers) - 1
