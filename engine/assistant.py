"""Parley's assistant: the one object through which the desktop app and `parley chat` hold a conversation.

Built from one AssistantConfig (engine/settings.py), it opens the parts in order (the history, the LLM, the speech
model, speech recognition, the speakers, the microphone), runs the conversation in a Dialogue and its VoiceLoop
(engine/dialogue.py, engine/voice_loop.py), takes new settings in place where it can, and closes everything in reverse
order. It reports everything as events (engine/events.py) to its subscribers. It has no thread of its own: calls
run on the caller's thread (the app's worker thread, the command line's main thread) and return at once, but
load() (which takes seconds to minutes) and the history commands; the conversation runs on the loop's threads.

    assistant = Assistant(load_config(), subscribe=print)
    assistant.load()                    # Loading events, then Ready; raises what stopped it (LoadFailed first)
    assistant.send("Hello!")            # a typed turn; TurnFinished when it has been spoken
    assistant.close()

A saved voice (engine/voice_library.py) chosen in the settings (AssistantConfig.saved_voice) is spoken by a Base
model (engine/models.py find_base_model) in place of the CustomVoice one; one that cannot be spoken gives way to the
speaker, with a SavedVoiceUnavailable event. clone_voice() makes and saves new voices. Where the settings name a speech
server (AssistantConfig.speech_server), it speaks in place of a speech model here (engine/speech_client.py), in its
model's own voices.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from engine.errors import (FeatureUnavailableError, GPUUnavailableError, HistoryError, InputTextError,
                           ModelFilesError, ParleyError, VoiceFileError, VoiceNameError)
from engine.events import (ConversationEnded, Figures, HistoryErased, LoadFailed, Loading, Notice, Ready,
                           SavedVoiceUnavailable, VoiceInputOff, VoiceNotFound)
from engine.history import ConversationRef
from engine.settings import AssistantConfig
from engine.subscribers import Subscribers

if TYPE_CHECKING:
    from engine.tts.clone import ClonedVoice
    from engine.tts.config import TTSConfig
    from engine.tts.stream import TTSEngine
    from engine.voice_library import SavedVoice

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_VOICE_DESCRIPTION", "STEPS", "Assistant", "AssistantInfo", "ConfiguredVoice", "SpeechChoice",
           "configured_voice", "speech_choice", "style_kind"]

# Loading's steps, in order (Loading.step, LoadFailed.step)
STEPS = ("history", "language model", "speech model", "speech recognition", "speakers", "microphone", "conversation")
# The voice a VoiceDesign model speaks in until the user describes one: such a model has no voice of its own, and an
# empty description would stop it speaking at all
DEFAULT_VOICE_DESCRIPTION = "A warm, clear, friendly voice at a natural, relaxed pace."


@dataclass(frozen=True)
class AssistantInfo:
    """What runs now: for the app to show, and for its settings dialog to offer.

    speakers, languages: the TTS model's (from its config.json); speaker: the voice in use, None where a saved
        voice speaks. A Base model has no speakers: while one speaks a saved voice, speakers are those of the
        CustomVoice model the settings name (its config.json; () where it is not on this computer), for the settings
        to offer beside the saved voices.
    saved_voice: the saved voice in use, its name as saved; None where a speaker speaks.
    device: where the TTS runs ("cpu" or "cuda"); with a speech server, where the other models run.
    tts_model, llm_model, stt_model: the files or folders loaded; stt_model None when speech
        recognition is off (then only typed turns work). With a speech server, tts_model is its model's folder name
        there.
    speech_server: the address of the speech server that speaks (AssistantConfig.speech_server); "" where the speech
        model runs on this computer.
    microphone, speakers_device: the device names; microphone None when none could be opened.
    conversation_id: the conversation turns are saved to; None until the first turn.
    style_kind: what the model's instruct is: "style" (how the voice speaks: 1.7B CustomVoice),
        "description" (the voice itself: VoiceDesign), or None when it takes none (0.6B) ...
    style_unsupported: ... and then why, in the engine's words; "" otherwise.
    style: the instruct in use: the settings' style, DEFAULT_VOICE_DESCRIPTION for a VoiceDesign model
        given none, or None.
    speech_precision: how the speech model computes (engine/tts/cpu.py Precision: "int8 weights and int8 products,
        float32 activations, bfloat16 codec"); on a CPU the fastest this one allows, as load_tts chose it.
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
    speech_precision: str = ""
    saved_voice: str | None = None
    speech_server: str = ""


@dataclass(frozen=True)
class SpeechChoice:
    """The speech model a config asks for (see speech_choice): folder, and for a saved voice the voice, its
    name as saved and its file's stamp (path, size, modification time: a voice saved again is taken anew); or, where
    the saved voice cannot be spoken, the speaker's model and why (problem). folder is None where a speech server
    speaks (server, its address)."""

    folder: Path | None
    voice: ClonedVoice | None = None
    name: str | None = None
    stamp: tuple | None = None
    problem: ParleyError | None = None
    server: str = ""


def style_kind(model: TTSConfig, language: str) -> tuple[str | None, str]:
    """(AssistantInfo.style_kind, style_unsupported) of a speech model, by the engine's own rule (resolve_voice)."""
    from engine.tts.prompt import (
        resolve_voice,  # imports torch: not at the window's start-up
    )

    if model.model_type == "voice_design":
        return "description", ""
    if model.model_type == "base":  # the engine's reason names its API; a person chose a saved voice
        return None, "a saved voice speaks as it was recorded, without a speaking style"
    try:
        resolve_voice(model, model.default_speaker, language or "auto", "calm")
    except InputTextError as e:
        return None, str(e)
    return "style", ""


@dataclass(frozen=True)
class ConfiguredVoice:
    """The voice a config asks of a speech model, fitted to it (see configured_voice).

    speaker: one of the model's speakers, or None (its first; VoiceDesign models have none).
    language: as configured. style: the instruct to speak with, or None.
    not_found: VoiceNotFound where the configured speaker is not one of the model's; else None.
    """

    speaker: str | None
    language: str
    style: str | None
    not_found: VoiceNotFound | None = None


def configured_voice(model: TTSConfig, config: AssistantConfig) -> ConfiguredVoice:
    """The configured voice, fitted to a speech model: settings may have been made for another model, so a speaker
    it lacks becomes its first (said by not_found), a style goes only to a model that takes one, and a VoiceDesign
    model with no description speaks in DEFAULT_VOICE_DESCRIPTION's voice (it has no voice of its own)."""
    speaker, not_found = config.speaker or None, None
    if speaker is not None and speaker.lower() not in model.speakers:  # the model's names are lower-case
        if model.speakers:  # a VoiceDesign model has none: its voice is the description
            not_found = VoiceNotFound(speaker, tuple(model.speakers), model.default_speaker)
        speaker = None
    kind, style = style_kind(model, config.language)[0], None
    if kind is not None:
        style = config.style or (DEFAULT_VOICE_DESCRIPTION if kind == "description" else None)
    return ConfiguredVoice(speaker, config.language or "auto", style, not_found)


def speech_choice(config: AssistantConfig) -> SpeechChoice:
    """The speech model `config` asks for, found (files only, nothing loaded): for a saved voice, the Base model
    it was cloned with (find_base_model) and the voice; where it cannot be spoken (removed, damaged, cloned with
    another model, no Base model here), the speaker's CustomVoice model and why. `parley say` and `parley chat` choose
    so too. Where a speech server speaks, nothing is looked for here; a saved voice chosen gives way (problem).

    Raises:
        ModelFilesError: the CustomVoice model is not there (the message says how to get it).
        VoiceNameError, VoiceFileError, ModelFilesError, InputTextError: the saved voice cannot be spoken, and there
            is no CustomVoice model to give way to.
    """
    from engine.models import find_base_model, find_tts_model

    problem = None
    if config.speech_server:
        if config.saved_voice:
            problem = InputTextError(f"a saved voice is spoken on this computer only; the speech server at "
                                     f"{config.speech_server} speaks its model's own voices")
        return SpeechChoice(None, problem=problem, server=config.speech_server)
    if config.saved_voice:
        from engine.tts.clone import load_voice
        from engine.voice_library import VoiceLibrary

        try:
            saved = VoiceLibrary().get(config.saved_voice)
            voice = load_voice(saved.path)
            folder = find_base_model(config.base_model or None, voice.model_size)
            _check_fits(folder, voice)
            stat = saved.path.stat()
            return SpeechChoice(folder, voice, saved.name, (saved.path, stat.st_size, stat.st_mtime_ns))
        except (VoiceNameError, VoiceFileError, ModelFilesError, InputTextError, OSError) as e:
            problem = e if isinstance(e, ParleyError) else VoiceFileError(f"the saved voice cannot be read ({e})")
    try:
        folder = find_tts_model(config.tts_model or None)
    except ModelFilesError:
        if problem is not None:  # no speaker to give way to: what went wrong is the saved voice
            raise problem from None
        raise
    return SpeechChoice(folder, problem=problem)


def _check_fits(folder: Path, voice: ClonedVoice) -> None:
    """Whether the Base model in `folder` speaks `voice`, by its config.json (cheap; the weights are not read).

    Raises:
        InputTextError: the voice was cloned with another Base model (the engine's words).
    """
    from engine.tts.config import TTSConfig
    from engine.tts.prompt import resolve_voice

    try:
        model = TTSConfig.from_file(folder / "config.json")
    except ModelFilesError:  # loading it names what is wrong with the folder
        return
    resolve_voice(model, None, "auto", None, voice)


class Assistant:
    """The conversation's parts and their lifetimes, behind one set of commands and one stream of events.

    Args:
        config: what to load and how to converse.
        subscribe: a first subscriber (see subscribe()), so no event of load() is missed.
    """

    def __init__(self, config: AssistantConfig, subscribe: Callable[[object], None] | None = None):
        self.config = config
        self._subscribers: Subscribers[object] = Subscribers("assistant")
        if subscribe is not None:
            self._subscribers.subscribe(subscribe)
        self.history = self.chat = self.tts = self.transcriber = self.player = self.microphone = None
        self.turn_model = self.text_model = None  # the end-of-turn models of voice and words, where turns take them
        self.dialogue = self.loop = None
        self.metrics = None  # one MetricsRecorder for the assistant's life: p50/p95 span rebuilt loops
        self.device = "cpu"
        self._speech: SpeechChoice | None = None  # the speech model loaded, and the saved voice it speaks
        self._unsubscribe: list[Callable[[], None]] = []
        self._step = 0  # the loading step under way

    def subscribe(self, callback: Callable[[object], None]) -> Callable[[], None]:
        """Call `callback(event)` for each event from now on (on the assistant's and the loop's threads); returns
        the unsubscriber. A callback that raises is logged; the others still run."""
        return self._subscribers.subscribe(callback)

    def _emit(self, event) -> None:
        self._subscribers.emit(event)

    @property
    def info(self) -> AssistantInfo:
        """What runs now (after load())."""
        tts = self.tts
        kind, style_unsupported = style_kind(tts.config, self.config.language)
        return AssistantInfo(
            speakers=self._speakers_on_offer(), languages=tuple(tts.languages), speaker=self.dialogue.speaker,
            device=self.device, tts_model=tts.folder, llm_model=self.chat.model_path,
            stt_model=self.transcriber.path if self.transcriber else None,
            microphone=self.microphone.device.name if self.microphone else None,
            speakers_device=self.player.device.name, conversation_id=self.dialogue.conversation_id,
            style_kind=kind, style_unsupported=style_unsupported, style=self.dialogue.options.style,
            megakernel_problem=tts.megakernel_problem, saved_voice=self._speech.name, speech_server=self._speech.server,
            speech_precision="" if self._speech.server else str(tts.precision),
        )

    def _speakers_on_offer(self) -> tuple[str, ...]:
        """The loaded model's speakers; for a Base model (none), those of the CustomVoice model the settings name."""
        if self.tts.speakers or self.tts.config.model_type != "base":
            return tuple(self.tts.speakers)
        from engine.models import find_tts_model
        from engine.tts.config import TTSConfig

        try:
            return tuple(TTSConfig.from_file(find_tts_model(self.config.tts_model or None) / "config.json").speakers)
        except ParleyError:
            return ()

    # -- loading -------------------------------------------------------------------------------------------

    def load(self) -> None:
        """Open everything the config names, step by step (Loading events), then start the conversation (Ready).

        Speech recognition or a microphone that cannot be opened leaves typed turns (VoiceInputOff); a GPU that is
        missing or full leaves the CPU (Notice).

        Raises:
            ModelFilesError, AudioDeviceError, ParleyError, ...: what stopped it, after LoadFailed said so;
                everything opened is closed again.
        """
        try:
            self._open()
        except Exception as e:
            step = STEPS[min(self._step, len(STEPS) - 1)]
            self.close()
            self._emit(LoadFailed(step, e))
            raise
        self._emit(Ready(self.info))

    def _open(self) -> None:
        config = self.config
        self._step = 0
        self._progress()
        from engine.history import HistoryStore, history_path

        # a history that cannot be opened yet (held by another program, read-only) does not stop Parley:
        # the turns wait in memory and are saved once it can be written
        self.history = HistoryStore(config.history_file or history_path(), open_later=True)
        if self.history.open_error is not None:
            self._emit(Notice(str(self.history.open_error), self.history.open_error, "opening the history"))

        self._advance()
        import torch

        from engine.llm.chat import (
            DEFAULT_SYSTEM_PROMPT,
            ChatModel,
            ChatOptions,
            bundled_model_path,
        )
        from engine.catalogue import downloaded
        from engine.metrics import MetricsRecorder

        has_cuda = torch.cuda.is_available()
        self.device = "cuda" if config.device in ("auto", "cuda") and has_cuda else "cpu"
        if config.device == "cuda" and not has_cuda:
            self._gpu_notice(f"the settings ask for the GPU (CUDA), but torch {torch.__version__} finds no CUDA "
                             "device", "loading the models")
        chat_options = config.chat_options or ChatOptions()
        if self.device == "cpu":
            chat_options = replace(chat_options, n_gpu_layers=0)
        # automatic: the recommended model where it has been downloaded, else the one that comes with Parley
        llm_path = (Path(config.llm_model).expanduser() if config.llm_model
                    else downloaded("llm") or bundled_model_path())
        self.chat = ChatModel(llm_path, chat_options, config.system_prompt or DEFAULT_SYSTEM_PROMPT)
        self.metrics = MetricsRecorder()

        self._advance()
        self._open_speech()

        self._advance()
        from engine.stt import Transcriber, TranscriberOptions

        try:
            if config.voice_input:
                self.transcriber = Transcriber(config.stt_model or downloaded("stt"),
                                               TranscriberOptions(device=self.device))
                self.transcriber.warm_up()
                if self.transcriber.gpu_unavailable:
                    self._gpu_notice(self.transcriber.gpu_unavailable, "loading the speech recognition")
        except Exception as e:  # typed turns still work without it
            self._emit(VoiceInputOff(str(e), e, "loading the speech recognition"))
            self.transcriber = None
        self._load_turn_model()

        self._advance()
        from engine.audio import Microphone, Player

        self.player = Player(config.output_device or None)

        self._advance()
        if self.transcriber is not None:
            try:
                self.microphone = Microphone(config.input_device or None)
            except Exception as e:
                self._emit(VoiceInputOff(str(e), e, "opening the microphone"))

        self._advance()
        self._start_loop(self._new_dialogue())
        self._advance()

    def _open_speech(self) -> None:
        """The speech engine the config names: a speech server's, or a model on this computer."""
        self._speech = speech_choice(self.config)
        if self._speech.server:
            from engine.speech_client import connect_tts

            self._progress(f"speech model (asking the speech server at {self._speech.server})")
            self.tts = connect_tts(self._speech.server, self.config.speech_token)
        else:
            self._load_tts()

    def _load_tts(self) -> None:
        """The speech model of self._speech, on this computer."""
        from engine.tts import load_tts

        if self.device == "cuda":
            from engine.tts.kernels.build import needs_build

            if needs_build():  # a minute of nvcc that would otherwise look like a stuck load
                self._progress("speech model (first start: compiling its GPU kernel, about a minute)")
        precision = self.config.speech_precision if self.device == "cpu" else "auto"
        self.tts = load_tts(self._speech.folder, device=self.device, precision=precision)
        if self.tts.device.type != self.device:  # the GPU had no room: load_tts fell back to the CPU
            self.device = "cpu"
            self._gpu_notice("the GPU has no room for the speech model; it runs on the CPU (see the log for the "
                             "GPU's error)", "loading the speech model")
        if self.tts.device.type == "cpu" and self.chat.n_gpu_layers == 0:
            import torch

            # a reply's words and its speech are made at once: torch takes the cores llama.cpp leaves, since an
            # OpenMP op with a thread on a core the LLM holds waits at each barrier (10-20x slower on 2 cores)
            torch.set_num_threads(max(1, (os.cpu_count() or 1) - self.chat.cpu_threads))

    def _load_turn_model(self) -> None:
        """The end-of-turn models, where the config asks for them and there is speech to hear; where the voice's cannot
        be loaded, a Notice, and the pause alone ends each turn; where the words' cannot, a Notice, and the voice's
        decides alone."""
        self.turn_model = self.text_model = None
        if not (self.config.turn_detection and self.transcriber is not None):
            return
        from engine.stt.turn import TurnModel, default_threads
        from engine.stt.turn_text import TextTurnModel

        try:
            self.turn_model = TurnModel()
        except ModelFilesError as e:
            error = FeatureUnavailableError(f"end-of-turn detection is off ({e}); a pause of "
                                            f"{self.config.silence_ms} ms ends each turn")
            self._emit(Notice(str(error), error, "loading the end-of-turn model"))
            return
        try:
            self.text_model = TextTurnModel(threads=default_threads(), gpu_layers=self.chat.n_gpu_layers)
        except ParleyError as e:
            error = FeatureUnavailableError(f"end-of-turn detection hears the voice only ({e}); a finished sentence "
                                            "the voice leaves open ends the turn after a longer pause")
            self._emit(Notice(str(error), error, "loading the end-of-turn model"))

    def _gpu_notice(self, message: str, doing: str) -> None:
        error = GPUUnavailableError(message)
        self._emit(Notice(str(error), error, doing))

    def _progress(self, label: str = "") -> None:
        self._emit(Loading(STEPS[min(self._step, len(STEPS) - 1)], self._step, len(STEPS), label))

    def _advance(self) -> None:
        self._step += 1
        self._progress()

    # -- the conversation's loop ---------------------------------------------------------------------------

    def _start_loop(self, dialogue) -> None:
        """A new VoiceLoop over the loaded models and `dialogue` (see _new_dialogue)."""
        from engine.listening import VoiceOptions
        from engine.stt.vad import VadOptions
        from engine.voice_loop import VoiceLoop

        self._close_loop()
        config = self.config
        self.dialogue = dialogue
        # partials: the live transcript while the user speaks (a Whisper run per 0.8 s of new speech, skipped
        # while a turn is being transcribed)
        silence_ms = config.longest_pause_ms if self.turn_model is not None else config.silence_ms
        voice = VoiceOptions(mode=config.listen_mode, vad=VadOptions(silence_ms=silence_ms),
                             partials=config.live_transcript, echo_cancellation=config.echo_cancellation)
        self.loop = VoiceLoop(dialogue, self.microphone, options=voice, turn_model=self.turn_model,
                              text_model=self.text_model)
        recorder = self.metrics
        self._unsubscribe = [
            self.loop.subscribe(self._emit),
            recorder.subscribe(lambda metrics: self._emit(Figures(metrics, dict(recorder.summary())))),
        ]
        self.loop.start()

    def _new_dialogue(self, conversation: ConversationRef | None = None):
        """A Dialogue in the config's voice, saving to `conversation` (an earlier Dialogue's, to carry it on; None:
        a new one)."""
        from engine.dialogue import Dialogue

        return Dialogue(self.chat, self.tts, self.player, self.history, self.transcriber,
                        options=self._dialogue_options(), metrics=self.metrics, conversation=conversation)

    def _dialogue_options(self):
        """The config's voice as DialogueOptions: its saved voice, or its speaker fitted to the speech model
        (configured_voice: VoiceNotFound where the model lacks the configured speaker; SavedVoiceUnavailable first
        where the saved voice gave way to it)."""
        from engine.dialogue import DialogueOptions

        language = self.config.language or "auto"
        if self._speech.voice is not None:  # a cloned voice takes no speaker and no style
            return DialogueOptions(voice=self._speech.voice, language=language, tts_seed=self.config.tts_seed)
        voice = configured_voice(self.tts.config, self.config)
        problem = self._speech.problem
        if problem is not None:
            used = voice.speaker or self.tts.default_speaker
            instead = f"speaking as {used!r}" if used else "speaking in the speech model's own voice"
            self._emit(SavedVoiceUnavailable(self.config.saved_voice, f"{instead} instead of the saved voice "
                                             f"{self.config.saved_voice!r}: {problem}", problem, used))
        if voice.not_found is not None:
            self._emit(voice.not_found)
        return DialogueOptions(speaker=voice.speaker, language=voice.language, tts_seed=self.config.tts_seed,
                               style=voice.style)

    def _close_loop(self) -> None:
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        self._unsubscribe = []
        if self.loop is not None:
            self.loop.close()
        self.loop = self.dialogue = None

    # -- settings --------------------------------------------------------------------------------------------

    def apply(self, config: AssistantConfig) -> None:
        """New settings: the voice and the prompt are taken by the conversation in place, the listening options by a
        new voice loop over it, another speech model or server by the conversation carrying on over it (Ready); other
        new models or devices mean a new load() (see AssistantConfig.models_differ), which this does. A voice the
        model cannot take leaves the old one (Notice).

        Raises:
            ModelFilesError, SpeechServerError, ...: the new models could not be opened; everything is closed, after
                LoadFailed said so (as load()).
        """
        try:
            speech = speech_choice(config)
        except ParleyError:  # the load says what is missing, at its step
            speech = None
        if self.loop is None or self.config.models_differ(config):
            self.close()
            self.config = config
            self.load()
            return
        if (self.config.speech_model_setting != config.speech_model_setting or speech is None
                or speech.folder != self._speech.folder):
            self._reopen_speech(config)
            return
        from engine.llm.chat import DEFAULT_SYSTEM_PROMPT

        self.chat.system_prompt = config.system_prompt or DEFAULT_SYSTEM_PROMPT
        (old, self.config), old_speech = (self.config, config), self._speech
        voice = ("speaker", "language", "style", "tts_seed", "saved_voice")
        try:
            if any(getattr(old, name) != getattr(config, name) for name in voice) or speech.stamp != old_speech.stamp:
                self._speech = speech
                self.dialogue.set_options(self._dialogue_options())  # from the next turn on, checked first
            # the endpointer takes its pauses and its model, and the loop makes its echo canceller, when the loop
            # starts
            listening = ("turn_detection", "silence_ms", "longest_pause_ms", "echo_cancellation")
            if any(getattr(old, name) != getattr(config, name) for name in listening):
                if old.turn_detection != config.turn_detection:
                    self._load_turn_model()
                self._start_loop(self.dialogue)
            elif old.listen_mode != config.listen_mode:
                self.loop.set_mode(config.listen_mode)
        except Exception as e:  # e.g. a language the model lacks: the old voice stays
            self.config, self._speech = old, old_speech
            if self.loop is None:  # closed before the new one failed: the old settings' loop again
                self._start_loop(self.dialogue)
            self._emit(Notice(str(e), e, "applying the settings"))
        self._emit(Ready(self.info))

    def _reopen_speech(self, config: AssistantConfig) -> None:
        """Another speech engine (a model, or a server) under the conversation going on: the loop stops, the old
        engine goes (its memory is the new one's), the new one opens (Loading at the speech model's step) and the
        conversation carries on over it (Ready); the language model and Whisper stay loaded. Where the new one cannot
        be opened, everything is closed, as after a failed load() (LoadFailed)."""
        conversation, turn_detection = self.dialogue.conversation, self.config.turn_detection
        self._close_loop()
        self.config, self.tts, self._speech = config, None, None
        self._step = STEPS.index("speech model")
        try:
            self._progress()
            self._open_speech()
            if config.turn_detection != turn_detection:  # saved with the speech model in one go
                self._load_turn_model()
            self._start_loop(self._new_dialogue(conversation))
        except Exception as e:
            self.close()
            self._emit(LoadFailed(STEPS[self._step], e))
            raise
        self._emit(Ready(self.info))

    # -- the conversation: commands --------------------------------------------------------------------------

    def send(self, text: str) -> None:
        """A typed turn: the LLM answers and the reply is spoken (queued behind a running turn)."""
        self.loop.submit_text(text)

    def speak(self, text: str) -> None:
        """Speak `text` as it is, without the LLM."""
        self.loop.submit_text(text, speak_only=True)

    def preview_voice(self, speaker: str) -> None:
        """A short sample of the speech model's voice `speaker` (engine/voices.py), after any turn under way;
        not part of the conversation."""
        from engine.voices import sample_line

        self.loop.preview(speaker, sample_line(speaker))

    def preview_saved_voice(self, name: str) -> None:
        """A short sample of the saved voice `name`, as preview_voice. Only the Base model it was cloned with speaks
        it: with a speaker's model loaded (or another Base model) a Notice says to choose the voice first.
        """
        from engine.tts.clone import load_voice
        from engine.voice_library import VoiceLibrary
        from engine.voices import saved_sample_line

        try:
            saved = VoiceLibrary().get(name)
            voice = load_voice(saved.path)
            if self.tts.config.model_type != "base":
                raise InputTextError(f"the saved voice {saved.name!r} can be heard once it is chosen: the speech model "
                                     f"loaded now ({self.tts.folder.name}) speaks in its own voices only")
            self.tts.resolve_voice(None, self.config.language, None, voice)
        except ParleyError as e:
            self._emit(Notice(str(e), e, "playing the voice's sample"))
            return
        self.loop.preview(None, saved_sample_line(saved.name), voice)

    # -- saved voices -----------------------------------------------------------------------------------------

    def clone_voice(self, name: str, audio, sample_rate_hz: int | None = None, *, text: str | None = None,
                    mode: str = "icl", replace: bool = False) -> SavedVoice:
        """Clone the voice of a recording and save it as `name` (VoiceLibrary.clone), with the Base model: the one
        loaded where a saved voice speaks, else the settings' (AssistantConfig.base_model), loaded for this call on
        the assistant's device. In "icl" mode without `text`, the assistant's Whisper hears what the recording says
        (one loaded for this call where speech recognition is off). Runs on the caller's thread (seconds); where the
        voice is the one the settings choose, it is taken anew (Ready).

        Args:
            name: its name in the library (any script; unique however capitalised).
            audio, sample_rate_hz, mode: as TTSEngine.clone_voice: a file, or samples and their rate; "icl" (the
                recording's sound and words in every prompt: the closest likeness) or "x_vector".
            text: what the recording says, word for word; None to have Whisper hear it.
            replace: replace a saved voice of that name.
        Returns:
            The saved voice, its transcript the one used.
        Raises:
            VoiceNameError, ReferenceAudioError, InputTextError, ValueError: as VoiceLibrary.clone.
            ModelFilesError: no Base model (the message says how to download it), or it cannot be loaded.
        """
        from engine.voice_library import VoiceLibrary, same_name

        saved = VoiceLibrary().clone(self._base_engine, name, audio, sample_rate_hz, text=text, mode=mode,
                                     replace=replace, transcribe=self._transcribe)
        if self.loop is not None and same_name(self.config.saved_voice, saved.name):
            self.apply(self.config)
        return saved

    def erase_saved_voices(self) -> int:
        """Delete every saved voice (VoiceLibrary.erase_all: the files, damaged ones too, and their folder); where one
        was speaking, the speaker speaks from now on (a reload, SavedVoiceUnavailable saying why). Returns how many
        voices there were.

        Raises:
            OSError: a file could not be deleted (the rest were).
        """
        from engine.voice_library import VoiceLibrary

        erased = VoiceLibrary().erase_all()
        if self.loop is not None and self._speech.voice is not None:
            self.apply(self.config)
        return erased

    def _base_engine(self) -> TTSEngine:
        """The Base model to clone with: the loaded one where it is one, else the settings' (loaded now)."""
        if self.tts is not None and self.tts.speaker_encoder is not None:
            return self.tts
        from engine.models import find_base_model
        from engine.tts import load_tts

        return load_tts(find_base_model(self.config.base_model or None), device=self.device)

    def _transcribe(self, audio_16k) -> str:
        """What a recording says, by the conversation's Whisper; where speech recognition is off, by one loaded now."""
        if self.loop is not None and self.dialogue.transcriber is not None:
            return self.loop.transcribe(audio_16k).text
        from engine.catalogue import downloaded
        from engine.stt import Transcriber, TranscriberOptions

        return Transcriber(self.config.stt_model or downloaded("stt"),
                           TranscriberOptions(device=self.device)).transcribe(audio_16k).text

    def press(self) -> None:
        """Push-to-talk key down."""
        self.loop.press()

    def release(self) -> None:
        """Push-to-talk key up: what was said becomes a turn."""
        self.loop.release()

    def stop(self) -> None:
        """Interrupt the speech at once."""
        self.loop.stop()

    @property
    def muted(self) -> bool:
        """Microphone mute."""
        return self.loop.muted

    @muted.setter
    def muted(self, value: bool) -> None:
        self.loop.muted = value

    def set_mode(self, listen_mode: str) -> None:
        """"hands-free" or "push-to-talk", at once."""
        self.config = replace(self.config, listen_mode=listen_mode)
        self.loop.set_mode(listen_mode)

    # -- the history -------------------------------------------------------------------------------------------

    def open_conversation(self, conversation_id: int) -> None:
        """Carry on a saved conversation: the LLM sees its turns, new turns are saved to it (Ready). One that cannot
        be read leaves the conversation as it was (Notice)."""
        try:
            conversation = self.history.open_conversation(conversation_id)
        except Exception as e:  # the conversation under way goes on
            self._emit(Notice(str(e), e, "reopening the conversation"))
        else:
            self._close_loop()  # no turn runs while the LLM's history is replaced
            self.chat.history = conversation.messages()
            self._start_loop(self._new_dialogue(ConversationRef(conversation_id)))
        self._emit(Ready(self.info))

    def new_conversation(self) -> None:
        """Start afresh: the LLM forgets, the next turn opens a new saved conversation (Ready)."""
        self._close_loop()
        self.chat.clear_history()
        self._start_loop(self._new_dialogue())
        self._emit(Ready(self.info))

    def conversation_deleted(self, conversation_id: int) -> None:
        """A conversation was deleted from the history: if it is the one under way, start afresh
        (ConversationEnded)."""
        if self.dialogue is not None and self.dialogue.conversation_id == conversation_id:
            self.new_conversation()
            self._emit(ConversationEnded())

    def erase_history(self) -> None:
        """Erase every conversation in the history file, in place, through this assistant's own store
        (HistoryStore.erase_all; the turns not saved yet go too), so no connection is left on a deleted file; then
        the LLM forgets and the next turn starts a new conversation (HistoryErased, Ready). If nothing could be
        deleted (locked, read-only), the conversation goes on as it was."""
        dialogue, error = self.dialogue, None
        self._close_loop()  # no turn is being saved meanwhile
        try:
            self.history.erase_all()
        except HistoryError as e:
            error = e
        conversation_id = dialogue.conversation_id
        if error is None or (conversation_id is not None and not self._still_saved(conversation_id)):
            self.chat.clear_history()
            self._start_loop(self._new_dialogue())
        else:  # nothing was erased: the conversation goes on, with its turns that wait for the file
            self._start_loop(dialogue)
        self._emit(HistoryErased(error))
        self._emit(Ready(self.info))

    def _still_saved(self, conversation_id: int) -> bool:
        """Whether the conversation under way is still in the history (an erase that failed part-way)."""
        try:
            return any(c.id == conversation_id for c in self.history.list_conversations())
        except HistoryError:  # cannot tell: keep it, so nothing is lost
            return True

    # -- closing ---------------------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the conversation (joins the loop's threads) and close every part, in reverse order. Safe to call
        twice; load() opens everything again."""
        self._close_loop()
        for part in (self.microphone, self.player, self.history):
            if part is not None:
                try:
                    part.close()
                except ParleyError as e:  # the history's turns that still cannot be written: it says how many
                    log.warning("%s", e)
                except Exception:  # closing must go on: a lost device may fail to close
                    log.exception("closing %s failed", type(part).__name__)
        self.history = self.chat = self.tts = self.transcriber = self.player = self.microphone = None
        self._speech = None

    def __enter__(self) -> Assistant:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
