"""Whisper beside the turn: a voice turn's text made before the turn needs it, and the live transcript.

Early transcription: hands-free, a turn's audio is complete some silence_ms - tail_ms before the silence window
ends it (engine/stt/vad.py Endpointer.ending_turn); transcribed in that time, its text is ready when the turn is,
and the window costs no STT time. Partials: while the user speaks, the utterance so far is transcribed again every
VoiceOptions.partial_interval_ms of new speech (or, where Whisper is slow, after a rest as long as the last one
took), quickly (in the language last heard, and in a shorter window), for the window to show.
Each runs on a thread of its own; Whisper is not thread-safe, so one lock (`whisper`) is held by whoever
transcribes: these threads, or the turn itself, which comes first (a partial is skipped while it waits).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

import numpy as np

log = logging.getLogger(__name__)

__all__ = ["TranscribingAhead"]


class TranscribingAhead:
    """Early and partial transcription for one VoiceLoop (see the module docstring).

    Args:
        transcriber: the Whisper model (engine/stt Transcriber).
        partials: transcribe the utterance so far (offer_partial); False: early transcription only.
        closing: set when the loop closes; the threads end then.
        on_partial(utterance, text): a partial transcript of utterance number `utterance` (as offered); on the
            partials thread.
        on_early(key, transcript): the early Transcript of the turn `key` is made (early_transcript() hands it
            over); on the early thread.
    """

    def __init__(self, transcriber, partials: bool, closing: threading.Event,
                 on_partial: Callable[[int, str], None], on_early: Callable[[tuple[int, int], object], None]):
        self._transcriber, self._closing = transcriber, closing
        self._on_partial, self._on_early = on_partial, on_early
        self.whisper = threading.Lock()  # held by whoever transcribes: the turn, or a thread here
        self._partial_audio: queue.Queue[tuple[int, np.ndarray]] = queue.Queue(maxsize=1)
        # the newest early offer not yet taken, the one being transcribed, the last one done (key, Transcript);
        # a turn's key is its (start_sample, end_sample) in the microphone's stream
        self._early = threading.Condition()
        self._early_offer: tuple[tuple[int, int], np.ndarray] | None = None
        self._early_running: tuple[int, int] | None = None
        self._early_done: tuple[tuple[int, int], object] | None = None
        self.threads = [threading.Thread(target=self._transcribe_early, name="parley-early-stt", daemon=True)]
        if partials:
            self.threads.append(threading.Thread(target=self._partials, name="parley-partials", daemon=True))

    # -- early transcription ------------------------------------------------------------------------------

    def offer_early(self, turn) -> None:
        """An Endpointer Turn whose silence is running out: transcribe it now, unless a newer one comes first."""
        with self._early:  # only the newest waits: a resumed voice makes the one before it stale
            self._early_offer = ((turn.start_sample, turn.end_sample), turn.audio)
            self._early.notify_all()

    def early_transcript(self, key: tuple[int, int] | None):
        """The early Transcript of the turn `key`, waited for while it is being made; None when there is none
        (an offer not started yet is withdrawn: the turn transcribes it at once itself)."""
        with self._early:
            if self._early_offer is not None and self._early_offer[0] == key:
                self._early_offer = None
            if self._early_running not in (None, key):
                self._early_running = None  # a stale one, still waiting for Whisper: it is skipped
            self._early.wait_for(lambda: self._early_running != key)
            done, self._early_done = self._early_done, None
        return done[1] if done is not None and done[0] == key else None

    def made_early(self, key: tuple[int, int]):
        """The early Transcript of the turn `key` if it is made, else None; without waiting, and left for the turn."""
        with self._early:
            done = self._early_done
        return done[1] if done is not None and done[0] == key else None

    def _transcribe_early(self) -> None:
        while not self._closing.is_set():
            with self._early:
                if not self._early.wait_for(lambda: self._early_offer is not None, timeout=0.1):
                    continue
                (key, audio), self._early_offer = self._early_offer, None
                self._early_running = key
            transcript = None
            try:
                with self.whisper:
                    with self._early:  # not stale: no newer offer, and the turn has not given up on it
                        wanted = self._early_running == key and self._early_offer is None
                    if wanted:
                        transcript = self._transcriber.transcribe(audio)
            except Exception:
                log.exception("an early transcription failed; the turn is transcribed when it ends")
            finally:
                with self._early:
                    if transcript is not None:
                        self._early_done = (key, transcript)
                    self._early_running = None
                    self._early.notify_all()
            if transcript is not None:
                self._on_early(key, transcript)

    # -- partials -------------------------------------------------------------------------------------------

    def offer_partial(self, utterance: int, audio: np.ndarray) -> None:
        """The utterance so far (16 kHz), number `utterance`: only the newest offer waits for the thread."""
        try:
            self._partial_audio.get_nowait()
        except queue.Empty:
            pass
        self._partial_audio.put_nowait((utterance, audio))

    def _partials(self) -> None:
        while not self._closing.is_set():
            try:
                utterance, audio = self._partial_audio.get(timeout=0.1)
            except queue.Empty:
                continue
            if not self.whisper.acquire(blocking=False):
                continue  # a turn is being transcribed: its final text comes soon anyway
            try:
                transcript = self._transcriber.transcribe(audio, partial=True)
            except Exception:
                log.exception("a partial transcript failed")
                continue
            finally:
                self.whisper.release()
            if transcript.text:
                self._on_partial(utterance, transcript.text)
            # Whisper is free at least half the time: when the user stops, the turn's transcription seldom waits
            # for a partial, and never for long (on a slow CPU, partials come less often than partial_interval_ms)
            self._closing.wait(transcript.elapsed_s)
