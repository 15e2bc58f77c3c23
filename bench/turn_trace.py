"""A timeline of each voice turn for bench/turn_taking.py --trace: when Whisper, the end-of-turn models, the LLM's
tokens and the speech model's clauses ran, in ms from the end of the user's speech, so the work between the last word
and the reply's first sound can be read turn by turn.

It wraps the engine's classes in this process only (the engine itself keeps no timeline): the wrappers record
time.perf_counter(), the clock the loop's own figures use.
"""

from __future__ import annotations

import functools
import threading
import time


class Trace:
    """Records the steps of the loop's turns once installed; timeline() tells those since a point in time."""

    def __init__(self):
        self._lock = threading.Lock()
        self._events: list[tuple[float, float, str]] = []  # (start, end, what)
        self._speech_end: float | None = None

    def install(self) -> None:
        from engine.llm.chat import Reply
        from engine.stt.turn import TurnModel
        from engine.stt.turn_text import TextTurnModel
        from engine.stt.whisper import Transcriber
        from engine.tts.stream import TTSEngine
        from engine.voice_loop import VoiceLoop

        self._timed(Transcriber, "transcribe", lambda r, a, k: f'stt {len(a[1]) / 16000:.1f} s "{r.text[:40]}"')
        self._timed(Transcriber, "_detect_language", lambda r, a, k: f"language {max(r, key=r.get)}")
        self._timed(TurnModel, "probability", lambda r, a, k: f"voice {r:.2f}")
        self._timed(TextTurnModel, "reading", lambda r, a, k: f"words whole {r.whole:.2f} sentence {r.sentence:.2f}")
        self._timed(TTSEngine, "stream", lambda r, a, k: f'clause "{a[1][:30]}"')
        self._timed(VoiceLoop, "provisional", lambda r, a, k: "pause" if a[1] is not None else "speech again")
        self._timed(Reply, "__init__", lambda r, a, k: "reply asked")
        self._tokens(Reply)
        heard = VoiceLoop.turn_heard

        @functools.wraps(heard)
        def turn_heard(loop, audio, speech_end, turn_end, key):
            with self._lock:
                self._speech_end = speech_end
                self._events.append((turn_end, turn_end, "turn decided"))
            return heard(loop, audio, speech_end, turn_end, key)

        VoiceLoop.turn_heard = turn_heard

    def _timed(self, cls, name: str, says) -> None:
        original = getattr(cls, name)

        @functools.wraps(original)
        def timed(*args, **kwargs):
            start = time.perf_counter()
            result = original(*args, **kwargs)
            self._add(start, time.perf_counter(), says(result, args, kwargs))
            return result

        setattr(cls, name, timed)

    def _tokens(self, reply_cls) -> None:
        """Each token the LLM writes, whether asked for ahead() of the turn or by the turn's own iteration."""
        run = reply_cls._run

        @functools.wraps(run)
        def timed_run(reply):
            start = time.perf_counter()
            for piece in run(reply):
                now = time.perf_counter()
                self._add(start, now, f"token {piece!r}")
                yield piece
                start = time.perf_counter()

        reply_cls._run = timed_run

    def _add(self, start: float, end: float, what: str) -> None:
        with self._lock:
            self._events.append((start, end, what))

    def timeline(self, since: float, first_sound_ms: float | None) -> str:
        """The steps that began after `since`, in ms from the last turn's end of speech, one per line."""
        with self._lock:
            events = sorted(e for e in self._events if e[0] >= since)
            zero = self._speech_end
        if zero is None:
            return ""
        lines = [f"    {1000 * (start - zero):7.0f} {1000 * (end - start):6.0f}  {what}" for start, end, what in events]
        if first_sound_ms is not None:
            lines.append(f"    {first_sound_ms:7.0f}         first sound at the sound card")
        return "\n".join(["    from speech end, ms / took ms", *lines])
