"""What the assistant says while it runs: one vocabulary of small frozen events, the only way the conversation
reports to the desktop app and the command line.

The Assistant (engine/assistant.py) emits them to its subscribers, on its own threads: the loading events from the
thread that loads, the conversation's from the voice loop's threads (engine/voice_loop.py). A `message` is for the user,
in the engine's words; an `error` is the exception behind it, for the app to choose a headline and a fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.assistant import AssistantInfo
    from engine.errors import AudioDeviceLostError, HistoryError
    from engine.metrics import Figure, TurnMetrics
    from engine.dialogue import TurnResult
    from engine.voice_library import SavedVoice

# What the voice loop is doing (StateChanged.state)
STATES = ("listening", "hearing", "thinking", "speaking", "idle", "muted")


# -- loading and settings -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Loading:
    """A step of loading began: `step` (one of engine.assistant.STEPS) is the `done`-th of `total`; `label` says more
    where there is more to say ("speech model (first start: compiling its GPU kernel, about a minute)")."""

    step: str
    done: int
    total: int
    label: str = ""


@dataclass(frozen=True)
class LoadFailed:
    """Loading stopped at `step` (one of engine.assistant.STEPS) on `error`; nothing stays open. Assistant.load() then
    raises the error."""

    step: str
    error: Exception


@dataclass(frozen=True)
class Ready:
    """The assistant is loaded, or took new settings or another conversation: what it runs now."""

    info: AssistantInfo


@dataclass(frozen=True)
class Notice:
    """Something the user should know that does not stop the conversation: the history cannot be written yet
    (the turns are kept and saved later), the GPU is missing or ran out of memory (the CPU is used), new settings
    or a saved conversation could not be taken (the old ones stay). error is the exception (a ParleyError but
    for a fault of Parley's own); doing says what was under way ("loading the speech model", "speaking", ...)."""

    message: str
    error: Exception
    doing: str = "speaking"


@dataclass(frozen=True)
class VoiceInputOff:
    """Speech recognition or the microphone could not be opened (`error`, while `doing`): typed turns still work."""

    message: str
    error: Exception
    doing: str


@dataclass(frozen=True)
class VoiceNotFound:
    """The configured speaker is not one of the speech model's voices: Parley speaks as `used` instead."""

    speaker: str
    speakers: tuple[str, ...]
    used: str


@dataclass(frozen=True)
class SavedVoiceUnavailable:
    """The saved voice the settings choose (engine/voice_library.py) cannot be spoken in: no saved voice has that
    name any more, its file is damaged, it was cloned with a Base model other than the one chosen, or no Base model
    is on this computer. Parley speaks as the speech model's speaker `used` instead (None: a model without speakers);
    message says why and what to do, error is the VoiceNameError, VoiceFileError, ModelFilesError or InputTextError."""

    name: str
    message: str
    error: Exception
    used: str | None


# -- the microphone and the turn ----------------------------------------------------------------------

@dataclass(frozen=True)
class StateChanged:
    """What the loop is doing now; state is one of STATES:
    "listening" (waiting for speech: hands-free, or the push-to-talk key is down), "hearing" (the user
    is speaking), "thinking" (transcribing, or waiting for the reply's first audio), "speaking",
    "muted" (the microphone is muted and no turn runs), "idle" (not started or closed, push-to-talk
    with the key up, or no microphone)."""

    state: str


@dataclass(frozen=True)
class Level:
    """The microphone's input level over the last VoiceOptions.level_interval_ms (~10 a second), in dBFS
    (0 is full scale; engine.listening.SILENT_DBFS for silence)."""

    rms_dbfs: float


@dataclass(frozen=True)
class SpeechStarted:
    """The user began speaking (the VAD heard min_speech_ms of speech, or speech after press())."""


@dataclass(frozen=True)
class Partial:
    """What the user has said so far, re-transcribed while they speak (only with VoiceOptions.partials)."""

    text: str


@dataclass(frozen=True)
class Heard:
    """The final transcript of a voice turn, before the LLM answers it."""

    text: str


@dataclass(frozen=True)
class ReplyText:
    """The LLM's reply so far (it grows token by token); for a speak-only turn, its text, once."""

    text: str


@dataclass(frozen=True)
class SpeakingClause:
    """The first sample of this clause of the reply was handed to the sound card; index 0, 1, ..."""

    text: str
    index: int


@dataclass(frozen=True)
class BargeIn:
    """Parley's speech was cut off: the user spoke or pressed the key over it, or stop() was called."""


@dataclass(frozen=True)
class TurnFinished:
    """A turn ended normally or by barge-in (result.interrupted)."""

    result: TurnResult


@dataclass(frozen=True)
class TurnFailed:
    """A turn (or the microphone) failed; message is for the user. The loop goes on with the next turn;
    what had been said and heard is already saved."""

    message: str
    error: Exception


@dataclass(frozen=True)
class Measured:
    """A figure of the running turn (a name in engine.metrics.FIGURES), as soon as it is known: STT when the
    transcript is ready, LLM first token and first clause as they come, TTFC when the first audio is ready, voice to
    voice when it reaches the sound card. `turn` is the number TurnMetrics.turn will have; Figures follows at the end
    of the turn with every figure and the summary."""

    turn: int
    name: str
    value: float


@dataclass(frozen=True)
class Figures:
    """A turn's figures (engine/metrics.py) and the summary of every turn so far: {figure name: Figure}."""

    metrics: TurnMetrics
    summary: dict[str, Figure]


@dataclass(frozen=True)
class DeviceLost:
    """The speakers (kind "output") or the microphone ("input") stopped: unplugged, or the sound server quit.
    A turn that was speaking fails (TurnFailed; what was heard is saved); an utterance being heard becomes
    a turn with what was said so far. The loop opens the device again every VoiceOptions.device_retry_ms
    and emits DeviceRestored when it works. error is the AudioDeviceLostError.
    A microphone that delivers only digital silence is reported so too (MicrophoneSilentError): its stream
    runs on, the loop keeps listening, and DeviceRestored follows its first sound."""

    kind: str
    message: str
    error: AudioDeviceLostError


@dataclass(frozen=True)
class DeviceRestored:
    """The device of DeviceLost works again (the same one, opened anew); message is for the user."""

    kind: str
    message: str


# -- the history ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ConversationEnded:
    """The conversation being saved to was deleted from the history: the next turn starts a new one."""


@dataclass(frozen=True)
class HistoryErased:
    """Assistant.erase_history() finished: error is None, or the HistoryError saying what is still there."""

    error: HistoryError | None


# -- saved voices ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class VoiceCloned:
    """A voice asked to be cloned as `name` (the app's New voice) is done: `voice` is the SavedVoice as the library
    lists it, or None where `error` says why not (VoiceNameError, ReferenceAudioError, InputTextError,
    ModelFilesError, ...); both None where the user cancelled meanwhile and nothing was kept."""

    name: str
    voice: SavedVoice | None
    error: Exception | None = None


@dataclass(frozen=True)
class SavedVoicesErased:
    """Every saved voice was asked to be erased (Assistant.erase_saved_voices, VoiceLibrary.erase_all): `count` were
    deleted; error is None, or the OSError saying what could not be deleted (the rest were)."""

    count: int
    error: OSError | None = None
