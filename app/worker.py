"""The one worker that owns the engine: it loads the models (with progress), builds the Dialogue and the
VoiceLoop (engine/pipeline.py, engine/voice.py), and relays their events to the window as Qt signals.

The window moves an EngineWorker into a QThread and talks to it only through signals; loading runs in
that thread, so the window opens first and never freezes. The engine (and torch) is imported there,
on first load, never at the window's start-up.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

from PySide6.QtCore import QObject, Signal, Slot

from app.errors import Problem, problem_for
from app.settings import DEFAULT_VOICE_DESCRIPTION, EngineConfig

log = logging.getLogger(__name__)

# what each loading step is called on screen, and in "loading ..." problems
STEPS = ("history", "language model", "speech model", "speech recognition", "speakers", "microphone",
         "conversation")


@dataclass(frozen=True)
class EngineInfo:
    """What the window shows of the loaded engine, and what the settings dialog offers.

    speakers, languages: the TTS model's (from its config.json); speaker: the voice in use.
    device: where the TTS runs ("cpu" or "cuda").
    tts_model, llm_model, stt_model: the files or folders loaded; stt_model None when speech
        recognition is off (then only typed turns work).
    microphone, speakers_device: the device names; microphone None when none could be opened.
    conversation_id: the conversation turns are saved to; None until the first turn.
    style_kind: what the model's instruct is: "style" (how the voice speaks: 1.7B CustomVoice),
        "description" (the voice itself: VoiceDesign), or None when it takes none (0.6B) ...
    style_unsupported: ... and then why, in the engine's words; "" otherwise.
    style: the instruct in use: the settings' style, DEFAULT_VOICE_DESCRIPTION for a VoiceDesign model
        given none, or None.
    megakernel_problem: why speech on the GPU runs without the megakernel (no CUDA compiler, an older GPU, ...),
        in the engine's words; None where it runs, or on the CPU.
    """

    speakers: tuple[str, ...]
    languages: tuple[str, ...]
    speaker: str | None
    device: str
    tts_model: Path
    llm_model: Path
    stt_model: Path | None
    microphone: str | None
    speakers_device: str
    conversation_id: int | None
    style_kind: str | None = None
    style_unsupported: str = ""
    style: str | None = None
    megakernel_problem: str | None = None


def _style_kind(tts, language: str) -> tuple[str | None, str]:
    """(EngineInfo.style_kind, style_unsupported) of a loaded TTS, by the engine's own rule (resolve_voice)."""
    from engine.errors import InputTextError

    if tts.config.model_type == "voice_design":
        return "description", ""
    try:
        tts.resolve_voice(tts.default_speaker, language or "auto", "calm")
    except InputTextError as e:
        return None, str(e)
    return "style", ""


class _Engine:
    """The loaded parts; closed in reverse order of opening."""

    def __init__(self, config: EngineConfig):
        self.config = config
        self.history = self.chat = self.tts = self.transcriber = self.player = self.microphone = None
        self.dialogue = self.loop = None
        self.metrics = None  # one MetricsRecorder for the engine's life: p50/p95 span rebuilt loops
        self.device = "cpu"
        self.unsubscribe: list = []

    def close_loop(self) -> None:
        for unsubscribe in self.unsubscribe:
            unsubscribe()
        self.unsubscribe = []
        if self.loop is not None:
            self.loop.close()
        self.loop = self.dialogue = None

    def close(self) -> None:
        dialogue = self.dialogue
        self.close_loop()
        if dialogue is not None and dialogue.unsaved:
            log.warning("%d turns could not be saved before Parley closed: the history file %s could not be "
                        "written", len(dialogue.unsaved), self.history.path)
        for part in (self.microphone, self.player, self.history):
            if part is not None:
                try:
                    part.close()
                except Exception:  # closing must go on: a lost device may fail to close
                    log.exception("closing %s failed", type(part).__name__)
        self.microphone = self.player = self.history = None


class EngineWorker(QObject):
    """Owns every engine object; lives in its own QThread. Slots are the window's requests.

    Signals:
        progress(str, int, int): a loading step's name, steps done, steps in all.
        ready(EngineInfo): loading (or applying settings) finished; the conversation can start.
        failed(Problem): loading failed; nothing runs until load() is asked again.
        notice(Problem): something the user should know that does not stop the conversation
            (GPU missing or out of memory -> CPU; no microphone -> typed turns only; the history
            cannot be written yet -> kept and saved later).
        level(float): the microphone's RMS level in dBFS, about 10 a second.
        state_changed(str): "listening", "hearing", "thinking", "speaking", "idle" or "muted".
        speech_started(): the user started speaking.
        partial(str): the live transcript while the user speaks.
        heard(str): the final transcript of a spoken turn.
        reply_text(str): the reply so far; it grows.
        speaking_clause(str, int): that clause (the index-th of the reply) started playing.
        turn_finished(TurnResult): a turn ended (engine/pipeline.py), possibly interrupted.
        turn_failed(Problem): a turn failed; the conversation goes on.
        barge_in(): speech was interrupted (by the user's voice or stop()).
        device_lost(str, Problem): "output" (the speakers) or "input" (the microphone) stopped working;
            the loop opens it again by itself.
        device_restored(str, str): that device works again, and the message saying so.
        metrics(TurnMetrics, dict): a turn's figures and the recorder's summary {figure: Figure}.
        conversation_ended(): the conversation being saved to was deleted; the next turn starts a new one.
        history_deleted(Problem | None): delete_history() finished: None, or why the history could not be erased.
        closed(): shutdown() finished; everything is closed.
    """

    progress = Signal(str, int, int)
    ready = Signal(object)
    failed = Signal(object)
    notice = Signal(object)
    level = Signal(float)
    state_changed = Signal(str)
    speech_started = Signal()
    partial = Signal(str)
    heard = Signal(str)
    reply_text = Signal(str)
    speaking_clause = Signal(str, int)
    turn_finished = Signal(object)
    turn_failed = Signal(object)
    barge_in = Signal()
    device_lost = Signal(str, object)
    device_restored = Signal(str, str)
    metrics = Signal(object, object)
    conversation_ended = Signal()
    history_deleted = Signal(object)
    closed = Signal()

    def __init__(self):
        super().__init__()  # no parent, so it can move to its thread
        self._engine: _Engine | None = None
        self._step = 0  # the loading step under way, named in a failure

    # -- loading -------------------------------------------------------------------------------------

    @Slot(object)
    def load(self, config: EngineConfig) -> None:
        """Close what is open, then load everything `config` names, step by step (progress signals)."""
        self._close()
        engine = _Engine(config)
        try:
            self._open(engine)
        except Exception as e:
            engine.close()
            self.failed.emit(problem_for(e, f"loading the {STEPS[self._step]}"))
            return
        self._engine = engine
        self.ready.emit(self._info())

    @Slot(object)
    def apply(self, config: EngineConfig) -> None:
        """New settings: the voice, listening and prompt apply at once; new models or devices reload."""
        engine = self._engine
        if engine is None or engine.config.models_differ(config):
            self.load(config)
            return
        from engine.llm.chat import DEFAULT_SYSTEM_PROMPT

        engine.chat.system_prompt = config.system_prompt or DEFAULT_SYSTEM_PROMPT
        old, engine.config = engine.config, config
        # the conversation goes on in a new Dialogue, with the turns still waiting to be saved
        earlier = engine.dialogue
        conversation_id = earlier.conversation_id
        try:
            # the loop makes its echo canceller when it starts, so echo_cancellation needs a new loop too
            voice = ("speaker", "language", "style", "silence_ms", "echo_cancellation", "tts_seed")
            if any(getattr(old, name) != getattr(config, name) for name in voice):
                self._rebuild_loop(engine, conversation_id, carry_from=earlier)
            elif old.listen_mode != config.listen_mode:
                engine.loop.set_mode(config.listen_mode)
        except Exception as e:  # e.g. a language the model lacks: the old voice stays
            engine.config = old
            self._rebuild_loop(engine, conversation_id, carry_from=earlier)
            self.notice.emit(problem_for(e, "applying the settings"))
        self.ready.emit(self._info())

    def _open(self, engine: _Engine) -> None:
        config = engine.config
        self._step = 0
        self._progress()
        from engine.history import HistoryStore, history_path

        # a history that cannot be opened yet (held by another program, read-only) does not stop Parley:
        # the turns wait in memory and are saved once it can be written
        engine.history = HistoryStore(config.history_file or history_path(), open_later=True)
        if engine.history.open_error is not None:
            self.notice.emit(problem_for(engine.history.open_error, "opening the history"))

        self._advance()
        import torch

        from engine.llm.chat import DEFAULT_SYSTEM_PROMPT, ChatModel, ChatOptions, bundled_model_path
        from engine.metrics import MetricsRecorder

        from engine.errors import GPUUnavailableError

        has_cuda = torch.cuda.is_available()
        engine.device = "cuda" if config.device in ("auto", "cuda") and has_cuda else "cpu"
        if config.device == "cuda" and not has_cuda:
            self.notice.emit(problem_for(GPUUnavailableError(
                f"the settings ask for the GPU (CUDA), but torch {torch.__version__} finds no CUDA device"),
                "loading the models"))
        chat_options = config.chat_options or ChatOptions()
        if engine.device == "cpu":
            chat_options = replace(chat_options, n_gpu_layers=0)
        llm_path = Path(config.llm_model).expanduser() if config.llm_model else bundled_model_path()
        engine.chat = ChatModel(llm_path, chat_options, config.system_prompt or DEFAULT_SYSTEM_PROMPT)
        engine.metrics = MetricsRecorder()

        self._advance()
        from engine.models import find_tts_model
        from engine.tts import load_tts

        if engine.device == "cuda":
            from engine.tts.megakernel import needs_build

            if needs_build():  # a minute of nvcc that would otherwise look like a stuck load
                self._progress("speech model (first start: compiling its GPU kernel, about a minute)")
        engine.tts = load_tts(find_tts_model(config.tts_model or None), device=engine.device)
        if engine.tts.device.type != engine.device:  # the GPU had no room: load_tts fell back to the CPU
            engine.device = "cpu"
            self.notice.emit(problem_for(GPUUnavailableError(
                "the GPU has no room for the speech model; it runs on the CPU (see the log for the GPU's error)"),
                "loading the speech model"))

        self._advance()
        from engine.stt import Transcriber, TranscriberOptions

        try:
            engine.transcriber = Transcriber(config.stt_model or None, TranscriberOptions(device=engine.device))
            engine.transcriber.warm_up()
            if engine.transcriber.gpu_unavailable:
                self.notice.emit(problem_for(GPUUnavailableError(engine.transcriber.gpu_unavailable),
                                             "loading the speech recognition"))
        except Exception as e:  # typed turns still work without it
            self.notice.emit(self._voice_off(e, "loading the speech recognition"))
            engine.transcriber = None

        self._advance()
        from engine.audio import Microphone, Player

        engine.player = Player(config.output_device or None)

        self._advance()
        if engine.transcriber is not None:
            try:
                engine.microphone = Microphone(config.input_device or None)
            except Exception as e:
                self.notice.emit(self._voice_off(e, "opening the microphone"))

        self._advance()
        self._rebuild_loop(engine, None)
        self._advance()

    def _rebuild_loop(self, engine: _Engine, conversation_id: int | None, dialogue=None, carry_from=None) -> None:
        """A new VoiceLoop over the loaded models, and a new Dialogue saving to `conversation_id` unless
        `dialogue` is one to go on with; the new one takes over the turns the Dialogue `carry_from` could
        not save yet (read once its loop is closed, so a turn that was ending is among them)."""
        from engine.stt.vad import VadOptions
        from engine.voice import VoiceLoop, VoiceOptions

        engine.close_loop()
        config = engine.config
        unknown = None
        if dialogue is None:
            unsaved = carry_from.unsaved if carry_from is not None else ()
            dialogue, unknown = self._new_dialogue(engine, conversation_id, unsaved)
        engine.dialogue = dialogue
        # partials: the window shows the live transcript while the user speaks (a Whisper run per
        # 0.8 s of new speech, skipped while a turn is being transcribed)
        voice = VoiceOptions(mode=config.listen_mode, vad=VadOptions(silence_ms=config.silence_ms), partials=True,
                             echo_cancellation=config.echo_cancellation)
        engine.loop = VoiceLoop(dialogue, engine.microphone, options=voice)
        recorder = engine.metrics
        engine.unsubscribe = [
            engine.loop.subscribe(self._relay),
            recorder.subscribe(lambda metrics: self.metrics.emit(metrics, dict(recorder.summary()))),
        ]
        engine.loop.start()
        if unknown is not None:
            self.notice.emit(unknown)

    @staticmethod
    def _new_dialogue(engine: _Engine, conversation_id: int | None, unsaved):
        """(Dialogue in the settings' voice, saving to conversation_id; the Problem to show if the stored
        speaker is not one of the model's, else None)."""
        from engine.pipeline import Dialogue, DialogueOptions

        config, tts = engine.config, engine.tts
        # a speaker or style stored for another model is kept in the settings, but not used by this one
        speaker, unknown = config.speaker or None, None
        if speaker is not None and speaker.lower() not in tts.speakers:  # the model's names are lower-case
            if tts.speakers:  # a VoiceDesign model has none: its voice is the description
                unknown = Problem(
                    "This speech model has no voice of that name",
                    f"{speaker!r} is not one of its voices ({', '.join(tts.speakers)}); "
                    f"Parley speaks as {tts.default_speaker!r}.",
                    "Choose a voice in Settings.", action="settings")
            speaker = None
        style_kind, style = _style_kind(tts, config.language)[0], None
        if style_kind is not None:
            style = config.style or (DEFAULT_VOICE_DESCRIPTION if style_kind == "description" else None)
        options = DialogueOptions(speaker=speaker, language=config.language or "auto",
                                  tts_seed=config.tts_seed, style=style)
        dialogue = Dialogue(engine.chat, tts, engine.player, engine.history, engine.transcriber, options=options,
                            metrics=engine.metrics, conversation_id=conversation_id, unsaved=unsaved)
        return dialogue, unknown

    def _voice_off(self, error: Exception, doing: str) -> Problem:
        problem = problem_for(error, doing)
        return replace(problem, headline="Voice input is off: " + problem.headline[0].lower() + problem.headline[1:],
                       advice=" ".join(filter(None, ("You can still type to Parley.", problem.advice))))

    def _progress(self, label: str | None = None) -> None:
        """The step under way, by its name or by `label` where it says more."""
        self.progress.emit(label or STEPS[min(self._step, len(STEPS) - 1)], self._step, len(STEPS))

    def _advance(self) -> None:
        self._step += 1
        self._progress()

    def _info(self) -> EngineInfo:
        engine = self._engine
        tts = engine.tts
        style_kind, style_unsupported = _style_kind(tts, engine.config.language)
        return EngineInfo(
            speakers=tuple(tts.speakers), languages=tuple(tts.languages), speaker=engine.dialogue.speaker,
            device=engine.device, tts_model=tts.folder, llm_model=engine.chat.model_path,
            stt_model=engine.transcriber.path if engine.transcriber else None,
            microphone=engine.microphone.device.name if engine.microphone else None,
            speakers_device=engine.player.device.name, conversation_id=engine.dialogue.conversation_id,
            style_kind=style_kind, style_unsupported=style_unsupported, style=engine.dialogue.options.style,
            megakernel_problem=tts.megakernel_problem,
        )

    # -- the conversation: the window's requests -------------------------------------------------------

    @Slot(str)
    def send(self, text: str) -> None:
        """A typed turn: the LLM answers and the reply is spoken."""
        self._engine.loop.submit_text(text)

    @Slot(str)
    def speak(self, text: str) -> None:
        """Speak `text` as it is, without the LLM."""
        self._engine.loop.submit_text(text, speak_only=True)

    @Slot()
    def press(self) -> None:
        """Push-to-talk key down."""
        self._engine.loop.press()

    @Slot()
    def release(self) -> None:
        """Push-to-talk key up: what was said becomes a turn."""
        self._engine.loop.release()

    @Slot()
    def stop(self) -> None:
        """Interrupt the speech at once."""
        self._engine.loop.stop()

    @Slot(bool)
    def set_muted(self, muted: bool) -> None:
        self._engine.loop.muted = muted

    @Slot(str)
    def set_mode(self, listen_mode: str) -> None:
        """"hands-free" or "push-to-talk"."""
        self._engine.config = replace(self._engine.config, listen_mode=listen_mode)
        self._engine.loop.set_mode(listen_mode)

    @Slot(int)
    def open_conversation(self, conversation_id: int) -> None:
        """Carry on a saved conversation: the LLM sees its turns, new turns are saved to it."""
        engine = self._engine
        earlier, carry_from = engine.dialogue, None
        try:
            conversation = engine.history.open_conversation(conversation_id)
            engine.close_loop()  # no turn runs while the LLM's history is replaced
            engine.chat.history = conversation.messages()
            if earlier is not None and earlier.unsaved:  # their conversation was never made
                log.warning("%d turns said while the history could not be written are not saved: another "
                            "conversation was opened before it could be", len(earlier.unsaved))
        except Exception as e:
            self.notice.emit(problem_for(e, "reopening the conversation"))
            carry_from = engine.dialogue  # the conversation goes on, unless its loop was closed already
            conversation_id = carry_from.conversation_id if carry_from else None
        self._rebuild_loop(engine, conversation_id, carry_from=carry_from)
        self.ready.emit(self._info())

    @Slot()
    def new_conversation(self) -> None:
        """Start afresh: the LLM forgets, the next turn opens a new saved conversation."""
        engine = self._engine
        earlier = engine.dialogue  # its turns still waiting for a conversation open the new one: not lost
        engine.close_loop()
        engine.chat.clear_history()
        self._rebuild_loop(engine, None, carry_from=earlier)
        self.ready.emit(self._info())

    @Slot(int)
    def conversation_deleted(self, conversation_id: int) -> None:
        """A conversation was deleted from the history: if it is the one under way, start afresh."""
        engine = self._engine
        if engine is not None and engine.dialogue is not None and engine.dialogue.conversation_id == conversation_id:
            self.new_conversation()
            self.conversation_ended.emit()

    @Slot(object)
    def delete_history(self, path: Path) -> None:
        """Erase every conversation in the history file, in place, through the engine's own store
        (HistoryStore.erase_all; the turns not saved yet go too), so no connection is ever left on a deleted
        file; then the LLM forgets and the next turn starts a new conversation. If nothing could be
        deleted (locked, read-only), the conversation goes on as it was."""
        from app.about_page import erase_failed, erase_history
        from engine.errors import HistoryError

        engine, problem = self._engine, None
        loaded = engine is not None and engine.history.path == Path(path)
        if loaded:
            dialogue = engine.dialogue
            engine.close_loop()  # no turn is being saved meanwhile
        try:
            if loaded:
                engine.history.erase_all()
            else:
                erase_history(path)
        except HistoryError as e:
            problem = erase_failed(e)
        if not loaded:
            self.history_deleted.emit(problem)
            return
        conversation_id = dialogue.conversation_id
        if problem is None or (conversation_id is not None and not self._still_saved(conversation_id)):
            engine.chat.clear_history()
            self._rebuild_loop(engine, None)
        else:  # nothing was erased: the conversation goes on in the same Dialogue, which holds the turns
            self._rebuild_loop(engine, conversation_id, dialogue)  # that wait for the file to create it
        self.history_deleted.emit(problem)
        self.ready.emit(self._info())

    def _still_saved(self, conversation_id: int) -> bool:
        """Whether the conversation under way is still in the history (an erase that failed part-way)."""
        from engine.errors import HistoryError

        try:
            return any(c.id == conversation_id for c in self._engine.history.list_conversations())
        except HistoryError:  # cannot tell: keep it, so nothing is lost
            return True

    @Slot()
    def shutdown(self) -> None:
        """Close everything (joins the loop's threads); then closed()."""
        self._close()
        self.closed.emit()

    def _close(self) -> None:
        if self._engine is not None:
            self._engine.close()
            self._engine = None

    # -- engine events -> signals (called on the engine's own threads) --------------------------------

    def _relay(self, event) -> None:
        from engine import voice

        kind = type(event)
        if kind is voice.Level:
            self.level.emit(event.rms_dbfs)
        elif kind is voice.StateChanged:
            self.state_changed.emit(event.state)
        elif kind is voice.SpeechStarted:
            self.speech_started.emit()
        elif kind is voice.Partial:
            self.partial.emit(event.text)
        elif kind is voice.Heard:
            self.heard.emit(event.text)
        elif kind is voice.ReplyText:
            self.reply_text.emit(event.text)
        elif kind is voice.SpeakingClause:
            self.speaking_clause.emit(event.text, event.index)
        elif kind is voice.TurnFinished:
            self.turn_finished.emit(event.result)
        elif kind is voice.TurnFailed:
            self.turn_failed.emit(problem_for(event.error, "answering"))
        elif kind is voice.BargeIn:
            self.barge_in.emit()
        elif kind is voice.DeviceLost:
            self.device_lost.emit(event.kind, problem_for(event.error, "speaking"))
        elif kind is voice.DeviceRestored:
            self.device_restored.emit(event.kind, event.message)
        elif kind is voice.Notice:  # the history cannot be written yet, or the TTS moved to the CPU
            self.notice.emit(problem_for(event.error, "speaking"))
