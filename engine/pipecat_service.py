"""Parley's speech engine as a Pipecat text-to-speech service, running in the pipeline's own process (Pipecat 1.14;
`pip install 'parley[pipecat]'`). Each sentence Pipecat hands over is spoken by a loaded TTSEngine's stream() on a
thread of its own, and its audio goes on as TTSAudioRawFrames of 16-bit mono PCM as soon as each chunk is decoded: at
the engine's 24 kHz (Pipecat's default output rate), or resampled with soxr to the rate the pipeline asks for.

The service has the shape of Pipecat's own local ones (pipecat/services/kokoro, piper): the base class opens each
utterance with TTSStartedFrame and closes it with TTSStoppedFrame, and measures TTFB from the text handed over to
the first audio. An interruption (or the pipeline's end) cancels the stream at its next frame, and nothing of it is
heard after. Several services (pipelines) may share one engine: their streams take turns on it a chunk at a time.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

import numpy as np
import soxr

try:
    from pipecat.frames.frames import ErrorFrame, Frame, TTSAudioRawFrame
    from pipecat.services.settings import TTSSettings
    from pipecat.services.tts_service import TTSService
    from pipecat.transcriptions.language import Language
    from pipecat.utils.errors import ErrorCategory
    from pipecat.utils.types import NOT_GIVEN, NotGiven
except ImportError as e:  # pipecat-ai itself, or one of its requirements (the app installs it without them)
    raise ImportError(f"Parley's Pipecat service needs pipecat-ai 1.14 and its requirements ({e}); install them with: "
                      "pip install 'parley[pipecat]'") from e

from engine.audio.wav import pcm16
from engine.errors import ParleyError
from engine.text import has_words
from engine.voice_library import VoiceLibrary
from engine.voices import model_language

__all__ = ["ParleyTTSService", "ParleyTTSSettings"]


@dataclass
class ParleyTTSSettings(TTSSettings):
    """What the service speaks in; each may change while the pipeline runs (TTSUpdateSettingsFrame).

    voice: a speaker of a CustomVoice model ("ryan"), or the name of a saved voice (engine/voice_library.py) for a
        Base model; none for a VoiceDesign model. language: "auto", the model's name for one ("english"), or a
        Pipecat Language (Language.EN). style: how to speak (1.7B CustomVoice), or the voice described (VoiceDesign).
    """

    style: str | None | NotGiven = field(default_factory=lambda: NOT_GIVEN)


class ParleyTTSService(TTSService):
    """A loaded TTSEngine (engine.tts.load_tts) as a Pipecat TTS service.

    Args:
        tts: the engine; load it once, before the pipeline starts (loading takes seconds).
        settings: voice, language and style; the model's first speaker and "auto" where not given.
        seed: the same seed and text give the same audio; None draws one for each utterance.
        voices: where a Base model's saved voices are read; the user's own (VoiceLibrary()) where not given.
        **kwargs: Pipecat's TTSService options (sample_rate, text_transforms, ...). Keep its sentence aggregation:
            each text handed over is a prompt of its own, and the model speaks a sentence better than a token.
    Raises:
        InputTextError: the model has no such speaker or language, or takes no such style (the message lists what
            it has); a Base model given no saved voice.
        VoiceNameError, VoiceFileError: a Base model's saved voice is not there, or its file is damaged.
    Text with nothing to say (no letter or digit: "🙂") is passed over, as Parley's own conversation does; a voice
    changed to one the model lacks makes each utterance an ErrorFrame (INVALID_REQUEST) until the settings change.
    """

    Settings = ParleyTTSSettings
    _settings: ParleyTTSSettings

    def __init__(self, tts, *, settings: ParleyTTSSettings | None = None, seed: int | None = None,
                 voices: VoiceLibrary | None = None, text_transforms: list | None = None, **kwargs):
        # set before the base class's __init__, which asks language_to_service_language about the model
        self._tts, self._seed = tts, seed
        self._voices = voices or VoiceLibrary()
        self._saved = None  # (name, ClonedVoice) of the saved voice last spoken in: its codec state stays with it
        store = self.Settings(model=tts.folder.name, voice=tts.default_speaker, language="auto", style=None)
        if settings is not None:
            store.apply_update(settings)
        super().__init__(push_start_frame=True, push_stop_frames=True, settings=store,
                         text_transforms=[*(text_transforms or []), ("*", _speakable)], **kwargs)
        self._stream_options()  # a voice, language or style the model lacks is an error now, not at the first reply

    def can_generate_metrics(self) -> bool:
        return True

    def language_to_service_language(self, language: Language) -> str | None:
        """The model's name for a Pipecat Language ("en-US": "english"); None where the model does not speak it."""
        return model_language(self._tts.languages, str(language))

    async def _update_settings(self, delta: ParleyTTSSettings) -> dict:
        changed = await super()._update_settings(delta)
        if "model" in changed:  # another model is another engine: a new service
            self._warn_unhandled_updated_settings({"model"})
        return changed

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame, None]:
        """The utterance's audio as it is decoded; an ErrorFrame where the settings name what the model lacks or the
        engine fails (the audio before a failure is heard)."""
        await self.start_tts_usage_metrics(text)
        try:
            stream = self._tts.stream(text, **self._stream_options())
        except ParleyError as e:  # the voice, language or style the settings name: until they change
            await self.cancel_ttfb_metrics()
            yield ErrorFrame(error=str(e), exception=e, category=ErrorCategory.INVALID_REQUEST)
            return
        loop = asyncio.get_running_loop()
        chunks: asyncio.Queue = asyncio.Queue()
        # the default executor: asyncio.run waits for its threads, so the loop outlives a stream still stopping
        loop.run_in_executor(None, _speak, stream, self._tts.sample_rate_hz, self.sample_rate, loop, chunks)
        try:
            while (pcm := await chunks.get()) is not None:
                if isinstance(pcm, BaseException):
                    raise pcm
                await self.stop_ttfb_metrics()
                yield TTSAudioRawFrame(pcm, self.sample_rate, 1, context_id=context_id)
        except ParleyError as e:
            yield ErrorFrame(error=str(e), exception=e, category=ErrorCategory.SERVER)
        finally:
            # an interruption or the pipeline's end cancels this task while it waits for a chunk: the engine stops at
            # its next frame, and what it still hands over is never read
            stream.cancel()
            await self.cancel_ttfb_metrics()  # where no audio came, there is no time to first audio to report

    def _stream_options(self) -> dict:
        """TTSEngine.stream's voice arguments from the settings, checked against the model.

        Raises:
            InputTextError, VoiceNameError, VoiceFileError: as the class says.
        """
        settings, saved = self._settings, None
        speaker = settings.voice
        if self._tts.config.model_type == "base" and speaker:
            if self._saved is None or self._saved[0] != speaker:
                self._saved = (speaker, self._voices.load(speaker))
            speaker, saved = None, self._saved[1]
        options = dict(speaker=speaker, language=settings.language, instruct=settings.style, voice=saved)
        self._tts.resolve_voice(**options)
        return dict(options, seed=self._seed)


async def _speakable(text: str, text_type: str) -> str:
    """`text`, or nothing where it has nothing to say (engine/text.py's rule): Pipecat then opens no utterance."""
    return text if has_words(text) else ""


def _speak(stream, from_hz: int, to_hz: int, loop: asyncio.AbstractEventLoop, out: asyncio.Queue) -> None:
    """Runs `stream` on this thread (taking turns with any other stream of the engine), handing `out` each chunk as
    16-bit PCM bytes at to_hz, then the exception that ended it (if one did), then None. Each utterance has a resampler
    of its own, flushed at its end: nothing of one is heard in the next."""
    def hand(item) -> None:
        loop.call_soon_threadsafe(out.put_nowait, item)

    try:
        resampler = None if from_hz == to_hz else soxr.ResampleStream(from_hz, to_hz, 1, dtype="float32", quality="HQ")
        for chunk in stream:
            hand(pcm16(chunk.pcm if resampler is None else resampler.resample_chunk(chunk.pcm)).tobytes())
        if resampler is not None and not stream.cancelled:
            hand(pcm16(resampler.resample_chunk(np.zeros(0, np.float32), last=True)).tobytes())
    except BaseException as e:  # raised in run_tts, which reports it
        hand(e)
    finally:
        hand(None)
