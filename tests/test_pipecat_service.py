"""Parley's Pipecat TTS service in real Pipecat pipelines (pipecat.tests.utils.run_test), on the tiny short
checkpoint with a fixed seed, so the audio that comes out can be compared with the engine's own: frames and their
order, the pipeline's rate, an interruption mid-utterance, voices and languages, saved voices, and bad settings."""

import asyncio
import subprocess
import sys

import numpy as np
import pytest
import soxr
from pipecat.frames.frames import (
    EndWorkerFrame,
    ErrorFrame,
    InterruptionFrame,
    MetricsFrame,
    TTSAudioRawFrame,
    TTSSpeakFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
    TTSUpdateSettingsFrame,
)
from pipecat.metrics.metrics import TTFBMetricsData
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.tests.utils import run_test
from pipecat.transcriptions.language import Language
from pipecat.utils.errors import ErrorCategory

from engine.audio.wav import pcm16
from engine.errors import GPUUnavailableError, InputTextError, VoiceNameError
from engine.pipecat_service import ParleyTTSService
from engine.voice_library import VoiceLibrary
from tests.conftest import REFERENCE_TEXT, HeldTTS

SEED = 7
TEXT = "Hello there, from a Pipecat pipeline."


def spoken(tts, text: str, speaker: str | None = "ryan", language: str = "auto", **options) -> bytes:
    """The engine's own speech for `text` with the service's seed, as 16-bit PCM."""
    return pcm16(tts.synthesize(text, speaker, language, seed=SEED, **options)).tobytes()


def speak(service, *frames, params: PipelineParams | None = None) -> tuple[list, list]:
    """(downstream, upstream) frames of a pipeline [source, service, sink] sent `frames`, then an EndFrame."""
    return asyncio.run(run_test(service, frames_to_send=list(frames), pipeline_params=params))


def audio(frames) -> bytes:
    return b"".join(f.audio for f in frames if isinstance(f, TTSAudioRawFrame))


def tts_frames(frames) -> list:
    return [f for f in frames if isinstance(f, (TTSStartedFrame, TTSAudioRawFrame, TTSStoppedFrame))]


def test_a_sentence_comes_out_as_the_engines_own_speech_between_started_and_stopped(short_tts):
    """TTSStartedFrame, the audio frames (16-bit mono at the engine's 24 kHz, each chunk as decoded), TTSStoppedFrame,
    all of one context; the PCM is what the engine says for the text with that seed, and a TTFB figure is reported."""
    service = ParleyTTSService(short_tts, settings=ParleyTTSService.Settings(voice="ryan"), seed=SEED)
    down, up = speak(service, TTSSpeakFrame(TEXT), params=PipelineParams(enable_metrics=True))
    frames = tts_frames(down)
    assert isinstance(frames[0], TTSStartedFrame) and isinstance(frames[-1], TTSStoppedFrame)
    chunks = frames[1:-1]
    assert len(chunks) >= 2 and all(isinstance(f, TTSAudioRawFrame) for f in chunks)
    assert {(f.sample_rate, f.num_channels) for f in chunks} == {(short_tts.sample_rate_hz, 1)}
    assert len({f.context_id for f in frames}) == 1
    assert audio(down) == spoken(short_tts, TEXT)
    assert np.abs(np.frombuffer(audio(down), "<i2")).max() > 0
    ttfb = [d for f in down if isinstance(f, MetricsFrame) for d in f.data
            if isinstance(d, TTFBMetricsData) and d.model == short_tts.folder.name]  # not the zeros sent at the start
    assert len(ttfb) == 1 and ttfb[0].value > 0 and ttfb[0].processor == service.name
    assert not [f for f in up if isinstance(f, ErrorFrame)]


def test_another_pipeline_rate_gets_the_speech_resampled(short_tts):
    """A pipeline whose output runs at 16 kHz gets 16 kHz frames: the engine's speech resampled whole."""
    service = ParleyTTSService(short_tts, settings=ParleyTTSService.Settings(voice="ryan"), seed=SEED)
    down, _ = speak(service, TTSSpeakFrame(TEXT), params=PipelineParams(audio_out_sample_rate=16_000))
    assert {f.sample_rate for f in down if isinstance(f, TTSAudioRawFrame)} == {16_000}
    heard = np.frombuffer(audio(down), "<i2").astype(np.float32) / 32767
    engine = short_tts.synthesize(TEXT, "ryan", seed=SEED)
    expected = soxr.resample(engine, short_tts.sample_rate_hz, 16_000, quality="HQ")
    assert len(heard) == len(expected)
    assert np.abs(heard - expected).max() < 2e-3


class BargeIn(FrameProcessor):
    """After the service: at the first audio of the first utterance, the user barges in (an interruption both ways,
    as Pipecat's user-turn handling sends) and a new reply is asked for; the pipeline ends once that one has stopped."""

    def __init__(self, reply: str):
        super().__init__()
        self.reply, self.interrupted = reply, None

    async def process_frame(self, frame, direction):
        await super().process_frame(frame, direction)
        await self.push_frame(frame, direction)
        if isinstance(frame, TTSAudioRawFrame) and self.interrupted is None:
            self.interrupted = frame.context_id
            await self.broadcast_interruption()
            await self.push_frame(TTSSpeakFrame(self.reply), FrameDirection.UPSTREAM)
        elif isinstance(frame, TTSStoppedFrame) and frame.context_id != self.interrupted:
            await self.push_frame(EndWorkerFrame())


def test_an_interruption_stops_the_utterance_and_nothing_more_of_it_is_heard(short_tts):
    """Interrupted after its first chunk, the utterance's stream is cancelled (the engine stops at its next frame)
    and none of its audio comes after the interruption; the reply asked for next is spoken whole."""
    held = HeldTTS(short_tts)  # the first utterance waits after its first chunk until cancelled
    service = ParleyTTSService(held, settings=ParleyTTSService.Settings(voice="ryan"), seed=SEED)
    barge_in = BargeIn("Sorry, go on.")
    down, _ = asyncio.run(run_test(Pipeline([service, barge_in]), frames_to_send=[TTSSpeakFrame(TEXT)],
                                   send_end_frame=False))
    assert held.cancelled == [TEXT] and held.spoken == [TEXT, "Sorry, go on."]
    interrupted = barge_in.interrupted
    first = [f for f in tts_frames(down) if f.context_id == interrupted]
    assert [type(f) for f in first] == [TTSStartedFrame, TTSAudioRawFrame]
    after = down[next(i for i, f in enumerate(down) if isinstance(f, InterruptionFrame)):]
    assert not [f for f in after if getattr(f, "context_id", None) == interrupted]
    assert audio(after) == spoken(short_tts, "Sorry, go on.")
    assert isinstance(tts_frames(after)[0], TTSStartedFrame) and isinstance(tts_frames(after)[-1], TTSStoppedFrame)


def test_two_pipelines_with_one_engine_speak_at_once(short_tts):
    """Two services on one engine (two pipelines, two callers): while the first's utterance is held after its first
    chunk, the second's is spoken whole (the engine's streams take turns); each gets its own speech."""
    held = HeldTTS(short_tts)  # the first utterance waits after its first chunk until released

    async def both():
        settings = ParleyTTSService.Settings(voice="ryan")
        first = asyncio.create_task(run_test(ParleyTTSService(held, settings=settings, seed=SEED),
                                             frames_to_send=[TTSSpeakFrame("First at once.")]))
        await held.wait(lambda: held.spoken == ["First at once."])
        second, _ = await run_test(ParleyTTSService(short_tts, settings=settings, seed=SEED),
                                   frames_to_send=[TTSSpeakFrame("Second at once.")])
        first_still_speaking = not first.done()  # the second did not wait for the first to end
        held.release.set()
        return first_still_speaking, (await first)[0], second

    first_still_speaking, first, second = asyncio.run(both())
    assert first_still_speaking
    assert audio(first) == spoken(short_tts, "First at once.")
    assert audio(second) == spoken(short_tts, "Second at once.")


def test_text_with_nothing_to_say_is_passed_over(short_tts):
    """Whitespace and emoji open no utterance and raise no error (as Parley's own conversation skips them); the
    sentence after them is spoken as usual."""
    service = ParleyTTSService(short_tts, settings=ParleyTTSService.Settings(voice="ryan"), seed=SEED)
    down, up = speak(service, TTSSpeakFrame("   "), TTSSpeakFrame("🙂 🎉"), TTSSpeakFrame(TEXT))
    frames = tts_frames(down)
    assert isinstance(frames[0], TTSStartedFrame) and isinstance(frames[-1], TTSStoppedFrame)
    assert len({f.context_id for f in frames}) == 1
    assert audio(down) == spoken(short_tts, TEXT)
    assert not [f for f in up if isinstance(f, ErrorFrame)]


def test_a_voice_the_model_lacks_is_an_error_frame_until_the_settings_change(short_tts):
    """Changed to a speaker the model lacks, an utterance is an ErrorFrame upstream naming the model's speakers
    (INVALID_REQUEST: Pipecat gives the service no more text until its settings change) and no audio; changed to a
    speaker it has, the next is spoken in that voice."""
    service = ParleyTTSService(short_tts, settings=ParleyTTSService.Settings(voice="ryan"), seed=SEED)
    down, up = speak(service,
                     TTSUpdateSettingsFrame(delta=ParleyTTSService.Settings(voice="nobody")), TTSSpeakFrame(TEXT),
                     TTSUpdateSettingsFrame(delta=ParleyTTSService.Settings(voice="serena")), TTSSpeakFrame("Again."))
    errors = [f for f in up if isinstance(f, ErrorFrame)]
    assert errors[0].error.startswith("unknown speaker 'nobody'; this model has: aiden, dylan, eric")
    assert errors[0].category == ErrorCategory.INVALID_REQUEST and errors[0].processor is service
    assert audio(down) == spoken(short_tts, "Again.", "serena")


class FailingTTS:
    """The real engine whose streams fail after their first chunk, as when the GPU is lost mid-sentence."""

    def __init__(self, tts):
        self.tts = tts

    def __getattr__(self, name):
        return getattr(self.tts, name)

    def stream(self, *args, **kwargs):
        return _Failing(self.tts.stream(*args, **kwargs))


class _Failing:
    def __init__(self, stream):
        self.stream = stream

    def __getattr__(self, name):
        return getattr(self.stream, name)

    def __iter__(self):
        yield next(self.stream)
        raise GPUUnavailableError("the GPU was lost")


def test_an_engine_failing_mid_utterance_is_an_error_frame_after_the_audio_before_it(short_tts):
    """The audio decoded before the failure is heard, then an ErrorFrame naming it (SERVER: the service is still
    given text); the utterance still ends with TTSStoppedFrame."""
    service = ParleyTTSService(FailingTTS(short_tts), settings=ParleyTTSService.Settings(voice="ryan"), seed=SEED)
    down, up = speak(service, TTSSpeakFrame(TEXT))
    first_chunk = next(iter(short_tts.stream(TEXT, "ryan", seed=SEED))).pcm
    assert audio(down) == pcm16(first_chunk).tobytes()
    assert isinstance(tts_frames(down)[-1], TTSStoppedFrame)
    (error,) = [f for f in up if isinstance(f, ErrorFrame)]
    assert error.error == "the GPU was lost" and error.category == ErrorCategory.SERVER and service.is_usable


def test_a_pipecat_language_speaks_the_models_language_of_that_code(short_tts):
    """Language.EN_US is the model's "english": the audio is the engine's in English, not in "auto"."""
    service = ParleyTTSService(short_tts, settings=ParleyTTSService.Settings(voice="ryan", language=Language.EN_US),
                               seed=SEED)
    down, _ = speak(service, TTSSpeakFrame(TEXT))
    assert audio(down) == spoken(short_tts, TEXT, language="english") != spoken(short_tts, TEXT)


@pytest.mark.parametrize("settings, error, said", [
    (dict(voice="nobody"), InputTextError, "unknown speaker 'nobody'; this model has: aiden, dylan"),
    (dict(voice="ryan", language=Language.SW), InputTextError, "unknown language 'sw'; this model has: auto,"),
    (dict(voice="ryan", style="cheerfully"), InputTextError, "this 0.6B model takes no speaking style"),
])
def test_settings_the_model_cannot_speak_are_refused_when_the_service_is_made(short_tts, settings, error, said):
    """A voice, language or style the model lacks is an error naming what it has, before any pipeline runs."""
    with pytest.raises(error, match=said.replace("(", r"\(")):
        ParleyTTSService(short_tts, settings=ParleyTTSService.Settings(**settings))


@pytest.fixture(scope="module")
def saved_voices(short_base_checkpoint, reference_wav, tmp_path_factory):
    """(Base engine, a library holding "Grandma", cloned in context from the espeak recording)."""
    from engine.tts import load_tts

    tts = load_tts(short_base_checkpoint, precision="float32")
    library = VoiceLibrary(tmp_path_factory.mktemp("voices"))
    library.add("Grandma", tts.clone_voice(reference_wav, text=REFERENCE_TEXT))
    return tts, library


def test_a_base_model_speaks_in_a_saved_voice_named_in_the_settings(saved_voices):
    """With a Base model, the voice names a saved voice (any capitalisation): the audio is the engine's in it."""
    tts, library = saved_voices
    service = ParleyTTSService(tts, settings=ParleyTTSService.Settings(voice="grandma"), seed=SEED, voices=library)
    down, _ = speak(service, TTSSpeakFrame(TEXT))
    assert audio(down) == spoken(tts, TEXT, None, voice=library.load("Grandma"))
    with pytest.raises(VoiceNameError, match="no saved voice is named 'Grandpa'; the saved voices are: Grandma"):
        ParleyTTSService(tts, settings=ParleyTTSService.Settings(voice="Grandpa"), voices=library)


def test_without_pipecats_requirements_the_import_says_how_to_install_them():
    """Where pipecat-ai is installed without its requirements (the app's model-file install), importing the
    service is an ImportError naming what is missing and the extra to install."""
    hide = "import sys; sys.modules['loguru'] = None; import engine.pipecat_service"
    run = subprocess.run([sys.executable, "-c", hide], capture_output=True, text=True)
    assert run.returncode == 1
    assert "ImportError: Parley's Pipecat service needs pipecat-ai 1.14 and its requirements" in run.stderr
    assert "loguru" in run.stderr and "pip install 'parley[pipecat]'" in run.stderr
