"""A conversation's turns: a user turn (typed text, or 16 kHz speech through Whisper) in, a spoken reply out.

The LLM's tokens go through the clause splitter (engine/llm/clauses.py); each whole clause is queued
to a speech thread that runs the TTS and writes its PCM to the Player while the LLM keeps writing.
stop() (barge-in) cancels both and flushes the player; the history (engine/history.py) keeps the user
turn and, of the reply, only the clauses that were fully played. The figures are engine/metrics.py's.
One turn runs at a time; engine/voice_loop.py runs them from the microphone and a queue of typed text.
"""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from engine.errors import HistoryError, InputTextError, ParleyError
from engine.events import Heard, Measured, Notice, ReplyText, SpeakingClause
from engine.history import ConversationRef, HistoryStore, Turn
from engine.llm.clauses import ClauseOptions, ClauseSplitter, speakable_text
from engine.metrics import MetricsRecorder, TurnMetrics
from engine.text import clean_text

if TYPE_CHECKING:
    from engine.llm.chat import Reply
    from engine.stt.whisper import Transcript
    from engine.tts.clone import ClonedVoice

log = logging.getLogger(__name__)

__all__ = ["Dialogue", "DialogueOptions", "Emit", "TurnResult"]

_PLAYBACK_SLACK_S = 30.0  # PulseAudio takes up to ~2 s to start, and a null sink runs at ~50% speed


@dataclass(frozen=True)
class DialogueOptions:
    """How replies are spoken.

    speaker: a voice of the TTS model (case-insensitive); None is the model's first.
    voice: a cloned voice (engine/tts/clone.py, a saved one from engine/voice_library.py) to speak in instead, with
        a Base model; None for a speaker.
    language: "auto" or one of the TTS model's languages.
    tts_seed: makes the speech reproducible (tests); None draws a seed per clause.
    clauses: where the reply breaks into clauses; ClauseOptions() when None.
    style: the TTS's instruct for replies and say(): a speaking style (1.7B CustomVoice) or the voice
        description (VoiceDesign); None for none (0.6B models take none).
    """

    speaker: str | None = None
    language: str = "auto"
    tts_seed: int | None = None
    clauses: ClauseOptions | None = None
    style: str | None = None
    voice: ClonedVoice | None = None


@dataclass(frozen=True)
class TurnResult:
    """One finished turn.

    user_text: what was typed, or the transcript; "" for a speak-only turn (Dialogue.say).
    reply_text: everything the LLM wrote (possibly cut short by stop()); say()'s text.
    heard_text: the clauses whose audio was fully played, joined by spaces.
    interrupted: stop() came before the reply had played out.
    metrics: the turn's figures (engine/metrics.py).
    audio: the speech of heard_text's clauses, float32 mono at audio_rate_hz (what "Save audio…" writes).
    """

    user_text: str
    reply_text: str
    heard_text: str
    interrupted: bool
    metrics: TurnMetrics
    audio: np.ndarray
    audio_rate_hz: int


Emit = Callable[[object], None]
"""Where a turn reports as it runs, with events of engine/events.py: Heard (a voice turn's transcript, before the
LLM starts) and ReplyText (the reply so far, each time it grows) on the turn's thread; SpeakingClause (that clause's
first sample was handed to the device) on a watcher thread of the turn; Notice (a fault the turn got past: the
history cannot be written yet, or the GPU ran out of memory and the TTS moved to the CPU) on the turn's thread or
its speech thread; Measured (a figure, as soon as it is known) on whichever of them measured it."""


class _Speech:
    """The speech stage of one turn: a thread that speaks queued clauses into the player, in order.

    Control before data: each chunk is written under `gate` after checking `stopped`, and stop()
    flushes under the same lock, so no chunk reaches the player after a flush.
    """

    def __init__(self, tts, player, options: DialogueOptions, speaker: str | None,
                 gate: threading.Lock, stopped: threading.Event, tell: Emit, turn: int):
        self._tts, self._player, self._options, self._speaker = tts, player, options, speaker
        self._gate, self._stopped, self._tell, self._turn = gate, stopped, tell, turn
        self._clauses: queue.SimpleQueue[str | None] = queue.SimpleQueue()  # None ends the turn
        self._stream = None  # the TTSStream being spoken; cancelled by stop()
        self.spoken: list[tuple[str, int]] = []  # (clause, the player's frames_written after its last chunk)
        self.spoken_pcm: list[np.ndarray] = []  # each spoken clause's speech, as the TTS made it
        self.starts: list[tuple[str, int]] = []  # (clause, the player's frames_written before its first chunk)
        self.ttfc_ms: float | None = None  # of the first clause
        self.synthesis_s = 0.0  # each clause's hand-over -> its last chunk, summed
        self.audio_samples = 0
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="parley-speech", daemon=True)
        self._thread.start()

    def put(self, clause: str) -> None:
        self._clauses.put(clause)

    def finish(self) -> None:
        """No more clauses: the thread ends once the queued ones are spoken. Then join()."""
        self._clauses.put(None)

    def join(self) -> None:
        self._thread.join()

    def cancel(self) -> None:
        stream = self._stream
        if stream is not None:
            stream.cancel()

    def _run(self) -> None:
        try:
            while True:
                clause = self._clauses.get()
                if clause is None or self._stopped.is_set():
                    return
                self._speak(clause)
        except BaseException as e:  # handed to the turn, which raises it on its own thread
            self.error = e
        finally:
            self._stream = None

    def _speak(self, clause: str) -> None:
        try:
            stream = self._tts.stream(clause, self._speaker, self._options.language, instruct=self._options.style,
                                      voice=self._options.voice, seed=self._options.tts_seed)
        except InputTextError as e:  # a clause the TTS cannot speak (nothing left once cleaned): skip it
            log.warning("skipping clause %r: %s", clause, e)
            return
        self._stream = stream
        if self._stopped.is_set():  # stop() may have looked for a stream before this one existed
            stream.cancel()
        last, noticed, pcm = None, False, []
        for chunk in stream:
            with self._gate:
                if self._stopped.is_set():
                    break
                if last is None:
                    self.starts.append((clause, self._player.stats().frames_written))
                self._player.write(chunk.pcm)
                end = self._player.stats().frames_written
            pcm.append(chunk.pcm)
            if stream.notice is not None and not noticed:  # the TTS moved to the CPU mid-clause
                self._tell(Notice(str(stream.notice), stream.notice))
                noticed = True
            if self.ttfc_ms is None:
                self.ttfc_ms = (chunk.t_ready - stream.t_start) * 1000.0
                self._tell(Measured(self._turn, "tts_ttfc_ms", self.ttfc_ms))
            self.audio_samples += chunk.pcm.size
            last = chunk.t_ready
        else:
            if last is not None:
                self.spoken.append((clause, end))
                self.spoken_pcm.append(np.concatenate(pcm))
        if last is not None:
            self.synthesis_s += last - stream.t_start


class _TurnState:
    """What stop() needs to reach while a turn runs."""

    def __init__(self, player):
        self.player = player
        self.gate = threading.Lock()
        self.stopped = threading.Event()
        self.played_out = False  # under gate: the reply finished playing, so a late stop() is no barge-in
        self.consumed_at_stop: int | None = None  # the player's played + flushed frames when stopped
        self.reply = None
        self.speech: _Speech | None = None
        self.ended = threading.Event()  # the turn is over: the clause watcher stops
        self.first_sample: float | None = None  # the reply's first sample at the device, once the watcher saw it

    def clause_started(self, start: int, stats) -> bool:
        """Whether the sample at frames_written position `start` has been handed to the device, by `stats`."""
        if self.stopped.is_set():  # the flush consumed the rest unplayed
            return self.consumed_at_stop > start
        return stats.frames_played + stats.frames_flushed > start

    def stop(self) -> None:
        with self.gate:
            if self.stopped.is_set() or self.played_out:
                return
            stats = self.player.stats()
            self.consumed_at_stop = stats.frames_played + stats.frames_flushed
            self.stopped.set()
            self.player.flush()
        if self.reply is not None:
            self.reply.cancel()
        if self.speech is not None:
            self.speech.cancel()


class Dialogue:
    """A conversation: owns the engine objects and runs one turn at a time, from one thread.

        dialogue = Dialogue(chat, tts, player, history, transcriber)
        result = dialogue.text_turn("What is the capital of France?")
        # from another thread, while it speaks: dialogue.stop()

    Args:
        chat: the LLM (engine/llm/chat.py ChatModel); its history follows the conversation.
        tts: the speech engine (engine/tts load_tts), at 24 kHz.
        player: the audio out (engine/audio Player).
        history: where turns are saved.
        transcriber: the Whisper model for voice_turn (engine/stt Transcriber); None for typed turns only.
        options: DialogueOptions() when None.
        metrics: where each turn's figures go; a new MetricsRecorder when None.
        conversation: the conversation turns are saved to: an earlier Dialogue's, to carry it on (the turns it
            could not save yet are the store's, and go with it), or None for a new one, made with its first turn.
    Raises:
        InputTextError: the speaker or language is not one the TTS model has, or a style it takes none of.
    """

    def __init__(self, chat, tts, player, history: HistoryStore, transcriber=None, *,
                 options: DialogueOptions | None = None, metrics: MetricsRecorder | None = None,
                 conversation: ConversationRef | None = None):
        from engine.audio.player import TTS_RATE_HZ

        self.chat, self.tts, self.player, self.history, self.transcriber = chat, tts, player, history, transcriber
        self.metrics = metrics or MetricsRecorder()
        self.conversation = conversation or ConversationRef()
        if tts.sample_rate_hz != TTS_RATE_HZ:
            raise ParleyError(f"the TTS model speaks at {tts.sample_rate_hz} Hz; the player takes {TTS_RATE_HZ} Hz")
        self.set_options(options or DialogueOptions())  # bad names fail here, not mid-turn
        self._lock = threading.Lock()
        self._current: _TurnState | None = None
        self._turns = 0

    def set_options(self, options: DialogueOptions) -> None:
        """Speak from the next turn on with `options` (a turn under way keeps its voice), checked first.

        Raises:
            InputTextError: the speaker or language is not one the TTS model has, a style it takes none of, or a
                cloned voice it cannot speak in (not a Base model, or another one); the options stay as they were.
        """
        speaker = None if options.voice is not None else options.speaker or self.tts.default_speaker
        self.tts.resolve_voice(speaker, options.language, options.style, options.voice)
        self.options, self.speaker = options, speaker

    @property
    def conversation_id(self) -> int | None:
        """The saved conversation's id; None until the history could make it."""
        return self.conversation.id

    # -- turns -----------------------------------------------------------------------------------

    def text_turn(self, user_text: str, emit: Emit | None = None) -> TurnResult:
        """A typed turn: the reply is generated, spoken and saved; returns when it has played out or stopped.
        `emit` gets the turn's events (see Emit) as it runs.

        Raises:
            InputTextError: empty text, or too long for the LLM's context (nothing is saved).
            ParleyError: a stage failed (LLM, TTS, audio device); the user turn and whatever of the
                reply was heard are already saved.
            RuntimeError: another turn is running (one at a time).
        """
        with self._turn_state() as state:
            return self._turn(state, user_text, emit)

    def early_reply(self, text: str) -> Reply:
        """The LLM's reply to `text`, begun before its turn is sure (the user paused, and may go on): generate it
        with Reply.ahead(), then hand it to voice_turn(reply=) or discard() it. Nothing of it is heard or saved
        before; no turn runs beside it.

        Raises:
            InputTextError: empty text, or too long for the LLM's context.
            RuntimeError: a turn or another early reply is running.
        """
        return self.chat.stream_reply(text)

    def voice_turn(self, audio_16k, speech_end: float | None = None, emit: Emit | None = None, *,
                   turn_end: float | None = None, transcript: Transcript | None = None,
                   reply: Reply | None = None) -> TurnResult:
        """A spoken turn: Whisper transcribes `audio_16k`, then as text_turn.

        stop() works from the start: called during the transcription, the turn is saved with an empty,
        interrupted reply and nothing is spoken.

        Args:
            audio_16k: (n,) float32 mono at 16 kHz, e.g. an Endpointer Turn's audio.
            speech_end: time.perf_counter() when the user stopped speaking (the origin of
                voice_to_voice_ms and end_of_turn_ms); None is now, i.e. the speech ended as it was handed over.
            turn_end: time.perf_counter() when the end of the turn was decided (the silence window ran
                out, the key was released): the end of end_of_turn_ms, the origin of stt_ms; None is speech_end.
            transcript: audio_16k's transcript when it was made already (the voice loop transcribes a turn
                while its silence runs out); stt_ms is then 0, or the time from turn_end to its made_at if later.
            reply: an early_reply() to that transcript's text, generated ahead while the silence ran out; the turn
                ends it, or discards it if it cannot begin.
        Raises:
            InputTextError: no words were heard (nothing is saved).
            ParleyError: as text_turn.
            ValueError: the reply answers another text than the transcript.
        """
        try:
            if self.transcriber is None:
                raise ParleyError("this Dialogue has no Transcriber; pass one to take spoken turns")
            if reply is not None and (transcript is None or reply.user_text != transcript.text):
                raise ValueError("an early reply needs the transcript it answers")
            speech_end = time.perf_counter() if speech_end is None else speech_end
            turn_end = speech_end if turn_end is None else turn_end
            end_of_turn_ms = (turn_end - speech_end) * 1000.0
            with self._turn_state() as state:
                transcript = transcript or self.transcriber.transcribe(audio_16k)
                # the turn goes on once it has ended and its words are known; whatever it waits for after that (the
                # token an early reply is making, say) is the LLM's time, not the transcript's
                words_at = max(turn_end, transcript.made_at)
                stt_ms = (words_at - turn_end) * 1000.0
                if not transcript.text.strip():
                    raise InputTextError(f"heard no words in {transcript.audio_s:.1f} s of audio; please speak again")
                if emit is not None:
                    emit(Heard(transcript.text))
                    emit(Measured(self._turns, "end_of_turn_ms", end_of_turn_ms))
                    emit(Measured(self._turns, "stt_ms", stt_ms))
                early, reply = reply, None  # the turn ends it from here
                return self._turn(state, transcript.text, emit, speech_end=speech_end, end_of_turn_ms=end_of_turn_ms,
                                  stt_ms=stt_ms, reply=early, asked_at=words_at)
        finally:
            if reply is not None:  # the turn did not begin: nothing of the reply is kept
                reply.discard()

    def say(self, text: str, emit: Emit | None = None) -> TurnResult:
        """A speak-only turn: `text` goes clause by clause straight to the TTS and the player; stop() cuts it.

        The LLM writes nothing; the text is saved as an assistant turn marked as_written (cut to what was heard, as
        a reply is) and what was heard joins the LLM's history, so later replies know it was said.

        Raises:
            InputTextError: nothing speakable in `text` (empty, or only markup and emoji).
            ParleyError: the TTS or the audio device failed.
            RuntimeError: another turn is running (one at a time).
        """
        clean_text(speakable_text(text, self.options.clauses))  # the engine's one rule: refused as `parley say` refuses
        with self._turn_state() as state:
            return self._turn(state, text, emit, llm=False)

    def preview(self, speaker: str | None, text: str, voice: ClonedVoice | None = None) -> None:
        """`text` in the voice `speaker`, or in the cloned voice `voice` (then speaker is None), on the speakers, as
        the settings' Preview plays it; stop() cuts it short. None of it is saved, measured or told to the LLM.

        Raises:
            InputTextError: the speech model has no such voice (a cloned one needs the Base model it was cloned
                with, a speaker a CustomVoice model), or nothing in `text` can be spoken.
            ParleyError: the TTS or the audio device failed.
            RuntimeError: a turn is running (one at a time).
        """
        options = self.options
        if voice is not None or options.voice is not None:  # a cloned voice takes no style, a speaker no voice
            options = replace(options, voice=voice, style=None if voice is not None else options.style)
        self.tts.resolve_voice(speaker, options.language, options.style, options.voice)
        with self._turn_state() as state:
            speech = _Speech(self.tts, self.player, options, speaker, state.gate, state.stopped,
                             lambda _event: None, self._turns)
            state.speech = speech
            speech.put(text)
            speech.finish()
            speech.join()
            if speech.error is not None:
                raise speech.error
            self._play_out(state, speech)
            with state.gate:
                state.played_out = True

    def stop(self) -> None:
        """Barge-in, from any thread: cancel the LLM and the TTS and flush the player; a no-op between turns."""
        with self._lock:
            state = self._current
        if state is not None:
            state.stop()

    # -- the loop ---------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _turn_state(self):
        """The running turn's state, reachable by stop() from before its first stage until it ends."""
        state = _TurnState(self.player)
        with self._lock:
            if self._current is not None:
                raise RuntimeError("a turn is already running; Dialogue takes one turn at a time")
            self._current = state
        try:
            yield state
        finally:
            with self._lock:
                self._current = None

    def _turn(self, state: _TurnState, user_text: str, emit: Emit | None, speech_end: float | None = None,
              end_of_turn_ms: float | None = None, stt_ms: float | None = None, llm: bool = True,
              reply: Reply | None = None, asked_at: float | None = None) -> TurnResult:
        """Speaks the LLM's reply to user_text (llm=False: user_text itself; `reply`: begun early), then saves and
        measures it. asked_at: when the turn asked for its reply (the origin of llm_first_clause_ms); None is now."""
        early = reply is not None
        if reply is None and llm:
            reply = self.chat.stream_reply(user_text, cancel=state.stopped)  # validates first

        def tell(event) -> None:
            if emit is not None:
                emit(event)

        def notice(error: ParleyError) -> None:
            tell(Notice(str(error), error))

        if llm:
            self._save(Turn("user", user_text), notice)
        self._first_playback_event()  # events of earlier turns must not end this one's voice-to-voice
        before = self.player.stats()
        speech = _Speech(self.tts, self.player, self.options, self.speaker, state.gate, state.stopped, tell,
                         self._turns)
        state.reply, state.speech = reply, speech
        watcher = None
        if emit is not None:
            watcher = threading.Thread(target=self._watch_clauses, args=(state, speech, emit, speech_end),
                                       name="parley-clauses", daemon=True)
            watcher.start()
        first_clause_ms = None
        error: Exception | None = None
        try:
            try:
                splitter = ClauseSplitter(self.options.clauses)
                t_request = time.perf_counter() if asked_at is None else asked_at

                def speak(clauses):
                    nonlocal first_clause_ms
                    for clause in clauses:
                        if first_clause_ms is None and llm:
                            first_clause_ms = (time.perf_counter() - t_request) * 1000.0
                            tell(Measured(self._turns, "llm_first_clause_ms", first_clause_ms))
                        speech.put(clause)

                tokens = reply if llm else [user_text]
                ttft_told = not llm
                try:
                    for token in tokens:
                        if state.stopped.is_set() or speech.error is not None:  # control before data
                            break
                        if not ttft_told and reply.ttft_ms is not None:
                            tell(Measured(self._turns, "llm_ttft_ms", reply.ttft_ms))
                            ttft_told = True
                        tell(ReplyText(reply.text if llm else user_text))
                        speak(splitter.feed(token))
                finally:
                    if llm:
                        reply.close()
                if not state.stopped.is_set() and speech.error is None:
                    speak(splitter.flush())
            finally:
                speech.finish()
                speech.join()
            if speech.error is not None:
                raise speech.error
            self._play_out(state, speech)
        except Exception as e:  # a stage failed: what had played is what was heard, and is saved below
            error = e
            state.stop()
        except BaseException:
            state.stop()  # Ctrl-C: nothing is left queued to play
            raise
        finally:
            with state.gate:
                state.played_out = True
            state.ended.set()
            if watcher is not None:
                watcher.join()

        interrupted = state.consumed_at_stop is not None
        heard = [i for i, (_clause, end) in enumerate(speech.spoken)
                 if not interrupted or end <= state.consumed_at_stop]
        heard_text = " ".join(speech.spoken[i][0] for i in heard)
        audio = np.concatenate([speech.spoken_pcm[i] for i in heard] or [np.zeros(0, np.float32)])
        reply_text = reply.text if llm else user_text
        after = self.player.stats()
        metrics = TurnMetrics(
            turn=self._turns,
            end_of_turn_ms=end_of_turn_ms,
            stt_ms=stt_ms,
            llm_ttft_ms=reply.ttft_ms if llm else None,
            llm_first_clause_ms=first_clause_ms,
            tts_ttfc_ms=speech.ttfc_ms,
            tts_rtf=(speech.synthesis_s / (speech.audio_samples / self.tts.sample_rate_hz)
                     if speech.audio_samples else (None if speech.synthesis_s == 0 else math.inf)),
            voice_to_voice_ms=self._voice_to_voice_ms(state, speech_end),
            underruns=after.underruns - before.underruns,
            interrupted=interrupted,
            early_reply=early,
        )
        self._turns += 1
        self.metrics.record(metrics)
        if llm and interrupted:
            self.chat.amend_last_reply(heard_text)  # the LLM's next prompt holds only what was heard
        elif not llm and heard_text:  # what Parley said is part of the conversation the LLM carries on
            self.chat.history = self.chat.history + [{"role": "assistant", "content": heard_text}]
        if reply_text.strip():
            self._save(Turn("assistant", reply_text, heard_text=heard_text if interrupted else None,
                            interrupted=interrupted, as_written=not llm, metrics=metrics.as_dict()), notice)
        if error is not None:
            raise error
        return TurnResult(user_text if llm else "", reply_text, heard_text, interrupted, metrics, audio,
                          self.tts.sample_rate_hz)

    def _watch_clauses(self, state: _TurnState, speech: _Speech, emit: Emit, speech_end: float | None) -> None:
        """SpeakingClause for each spoken clause as its first sample reaches the device; with the first, the turn's
        voice to voice."""
        index = 0

        def next_started(stats) -> bool:  # called under the player's lock: it must not take it again
            return len(speech.starts) > index and state.clause_started(speech.starts[index][1], stats)

        try:
            while True:
                started = self.player.wait_until(lambda s: state.ended.is_set() or next_started(s), 1.0)
                if next_started(self.player.stats()):
                    emit(SpeakingClause(speech.starts[index][0], index))
                    if index == 0:
                        self._first_sample(state, speech_end, emit)
                    index += 1
                elif started:  # the turn ended before this clause played
                    return
        except (ParleyError, RuntimeError):  # the device was lost or closed: the turn itself reports it
            return

    def _play_out(self, state: _TurnState, speech: _Speech) -> None:
        """Waits until everything written has reached the device, or stop()."""
        if state.stopped.is_set():
            return
        self.player.end_of_utterance()
        target = self.player.stats().frames_written
        audio_s = speech.audio_samples / self.tts.sample_rate_hz
        done = self.player.wait_until(
            lambda s: state.stopped.is_set() or s.frames_played + s.frames_flushed >= target,
            _PLAYBACK_SLACK_S + 4 * audio_s,
        )
        if not done:
            log.warning("the reply had not played out after %.0f s; carrying on", _PLAYBACK_SLACK_S + 4 * audio_s)

    def _first_playback_event(self):
        """Empties the player's UtteranceStarted queue; returns the oldest event in it, or None."""
        first = None
        while True:
            try:
                event = self.player.events.get_nowait()
            except queue.Empty:
                return first
            first = first or event

    def _first_sample(self, state: _TurnState, speech_end: float | None, emit: Emit) -> None:
        # The player queues the event under the lock that counts the sample played, so it is there by now.
        first = self._first_playback_event()
        if first is not None:
            state.first_sample = first.t_first_sample
            if speech_end is not None:
                emit(Measured(self._turns, "voice_to_voice_ms", (first.t_first_sample - speech_end) * 1000.0))

    def _voice_to_voice_ms(self, state: _TurnState, speech_end: float | None) -> float | None:
        t_first = state.first_sample
        first = self._first_playback_event()  # also empties the queue for the next turn
        if t_first is None and first is not None:
            t_first = first.t_first_sample
        if speech_end is None or t_first is None:
            return None
        return (t_first - speech_end) * 1000.0

    def _save(self, turn: Turn, notice: Callable[[ParleyError], None]) -> None:
        # A write that fails is kept by the store and written with a later turn: the conversation goes on, so the
        # error is a notice, not raised.
        try:
            self.history.add_turn(self.conversation, turn)
        except HistoryError as e:
            log.warning("%s", e)
            notice(e)
