"""Latency figures of a conversation, each defined once here (docs/ARCHITECTURE.md, "Measuring").

The pipeline (engine/dialogue.py) measures one `TurnMetrics` per turn and hands it to a
`MetricsRecorder`, which keeps a rolling window per figure, reports p50/p95, and delivers each turn's
figures as an event to its subscribers (the app shows them; it measures nothing).
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields

from engine.subscribers import Subscribers

__all__ = ["FIGURES", "LABELS", "Figure", "MetricsRecorder", "TurnMetrics", "format_figure", "percentile"]


@dataclass(frozen=True)
class TurnMetrics:
    """The figures of one turn; None where the turn never reached the point that ends a figure
    (a typed turn has no speech, a turn stopped before the first token has no TTFT).

    All times are wall time from time.perf_counter().
    """

    turn: int = 0
    """0, 1, 2, ... in the order the pipeline ran the turns."""
    end_of_turn_ms: float | None = None
    """End of turn: end of the user's speech -> the end of their turn decided (the end-of-turn model and the pause's
    words agreed, the longest pause ran out, or the push-to-talk key went up). Voice turns only."""
    stt_ms: float | None = None
    """STT: end of the user's turn (the endpointer's silence window ran out, or the push-to-talk key
    went up) -> final transcript; 0 where the transcript was made before the turn ended (hands-free, in the pause that
    ended it). Voice turns only."""
    llm_ttft_ms: float | None = None
    """LLM TTFT: the request to the LLM -> its first token with text (for a reply begun early, in the user's pause,
    the request came before the turn)."""
    llm_first_clause_ms: float | None = None
    """LLM first clause: the turn asks for the reply (a voice turn as soon as it has ended and its words are known) ->
    the first complete clause out of the clause splitter (less for a reply begun early, in the user's pause)."""
    tts_ttfc_ms: float | None = None
    """TTS TTFC: the first clause handed to the TTS engine -> its first PCM chunk in host memory."""
    tts_rtf: float | None = None
    """TTS RTF: synthesis wall time / duration of the audio made, over all clauses of the turn (< 1 is
    faster than real time). Synthesis time runs from each clause's hand-over to its last chunk."""
    voice_to_voice_ms: float | None = None
    """Voice-to-voice: end of the user's speech -> the reply's first audio sample handed to the sound
    card (the Player's UtteranceStarted.t_first_sample). Voice turns only."""
    underruns: int = 0
    """Player callbacks during the turn that ran out of audio mid-reply: audible gaps."""
    interrupted: bool = False
    """The turn was stopped (barge-in) before its reply had played out."""
    early_reply: bool = False
    """The reply was begun in the user's pause, before the turn was sure to end (engine/voice_loop.py)."""

    def as_dict(self) -> dict[str, float]:
        """The figures that were measured, by name (for Turn.metrics in engine/history.py)."""
        return {name: float(value) for name, value in asdict(self).items()
                if name in FIGURES and value is not None}


FIGURES: tuple[str, ...] = tuple(f.name for f in fields(TurnMetrics)
                                 if f.name not in ("turn", "interrupted", "early_reply"))
"""The names of the figures that have percentiles, in display order."""

LABELS = {"end_of_turn_ms": "End of turn", "stt_ms": "STT", "llm_ttft_ms": "LLM first token",
          "llm_first_clause_ms": "LLM first clause", "tts_ttfc_ms": "TTFC", "tts_rtf": "RTF",
          "voice_to_voice_ms": "Voice to voice", "underruns": "Underruns"}
"""What the user reads for each figure (the app's meter, `parley chat`)."""

HINTS = {
    "end_of_turn_ms": "From the end of your speech until Parley was sure you had finished",
    "stt_ms": "From the end of your turn until its words were written down; 0 when that was done while you paused",
    "llm_ttft_ms": "From asking the assistant until its first word (a reply may be begun while you pause)",
    "llm_first_clause_ms": "From your turn's words being known until the reply's first phrase was complete",
    "tts_ttfc_ms": "From a phrase handed to the voice until its first sound was made",
    "tts_rtf": "The voice's time to make a second of speech, in seconds; below 1 it keeps ahead of playback",
    "voice_to_voice_ms": "From the end of your speech until Parley's first sound",
    "underruns": "Gaps in Parley's speech where its audio came too late",
}
"""Each figure in a sentence, for whoever reads the numbers (the meter's tooltips and screen readers)."""


def format_figure(name: str, value: float | None) -> str:
    """The figure `name` as the user reads it: '182 ms', '0.42' (RTF), '3' (underruns), or '–' where the turn did
    not measure it."""
    if value is None or not math.isfinite(value):
        return "–"
    if name.endswith("_ms"):
        return f"{value:.0f} ms"
    return f"{value:.0f}" if name == "underruns" else f"{value:.2f}"


@dataclass(frozen=True)
class Figure:
    """One figure over the recorder's window: how many turns measured it, median and 95th percentile."""

    count: int
    p50: float
    p95: float


def percentile(values, q: float) -> float:
    """The q-th percentile (0..100) of values, interpolated linearly between ranks (numpy's default).

    Raises:
        ValueError: no values, or q outside 0..100.
    """
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in 0..100, got {q}")
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


class MetricsRecorder:
    """Rolling windows of the last `window` turns per figure; thread-safe.

        recorder = MetricsRecorder()
        unsubscribe = recorder.subscribe(lambda m: print(m.tts_ttfc_ms))
        recorder.record(TurnMetrics(tts_ttfc_ms=180.0))
        recorder.summary()["tts_ttfc_ms"].p50  # 180.0

    Subscribers are called on the thread that calls record(), after the windows are updated, in the
    order they subscribed; one that raises is logged and the others still run.
    """

    def __init__(self, window: int = 100):
        if window < 1:
            raise ValueError(f"window must be >= 1 turn, got {window}")
        self.window = window
        self._lock = threading.Lock()
        self._values: dict[str, deque[float]] = {name: deque(maxlen=window) for name in FIGURES}
        self._subscribers: Subscribers[TurnMetrics] = Subscribers("metrics")
        self._turns = 0

    def subscribe(self, callback: Callable[[TurnMetrics], None]) -> Callable[[], None]:
        """Call `callback(metrics)` for each turn recorded from now on; returns the function that unsubscribes."""
        return self._subscribers.subscribe(callback)

    def record(self, metrics: TurnMetrics) -> None:
        """Add one turn's figures to the windows (a None or non-finite figure is left out) and deliver it."""
        with self._lock:
            for name, value in metrics.as_dict().items():
                if math.isfinite(value):
                    self._values[name].append(value)
            self._turns += 1
        self._subscribers.emit(metrics)  # outside the lock: a subscriber may read summary()

    @property
    def turns(self) -> int:
        """How many turns have been recorded."""
        with self._lock:
            return self._turns

    def summary(self) -> Mapping[str, Figure]:
        """p50 and p95 of each figure over its window; figures no turn has measured yet are absent."""
        with self._lock:
            snapshot = {name: list(values) for name, values in self._values.items() if values}
        return {name: Figure(len(v), percentile(v, 50), percentile(v, 95)) for name, v in snapshot.items()}
