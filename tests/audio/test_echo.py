"""The echo canceller (engine/audio/echo.py) on its own and on a real loopback: the Player plays espeak
speech into the 'vsink' null sink whose monitor the Microphone records (tests/conftest.py), so what the
microphone hears is Parley's own voice, as it would from open speakers."""

import difflib

import numpy as np
import pytest

pytest.importorskip("livekit", reason="livekit (WebRTC's audio processing) is not installed")

from engine.audio.echo import FRAME_SAMPLES, EchoCanceller

SPEECH = "Sure. The train to Lyon leaves at ten past nine from platform four, and it takes about two hours."


class Tap:
    """Sits between the devices and the canceller, keeping the raw near end and what came out of it."""

    def __init__(self, canceller):
        self.canceller, self.raw, self.cleaned = canceller, [], []

    def far_end(self, pcm, rate_hz, t_sound):
        self.canceller.far_end(pcm, rate_hz, t_sound)

    def near_end(self, pcm, t_recorded):
        out = self.canceller.near_end(pcm, t_recorded)
        self.raw.append(np.array(pcm, np.float32))
        self.cleaned.append(out)
        return out


def test_with_no_far_end_the_audio_passes_through_unchanged():
    canceller = EchoCanceller()
    audio = np.random.default_rng(0).uniform(-0.5, 0.5, 16_000).astype(np.float32)
    out = [canceller.near_end(audio[i : i + 333], t_recorded=i / 16_000) for i in range(0, len(audio), 333)]
    out = np.concatenate(out)
    assert len(out) == len(audio) // FRAME_SAMPLES * FRAME_SAMPLES  # whole frames; the rest waits
    np.testing.assert_array_equal(out, audio[: len(out)])


def test_the_reference_is_the_far_end_that_sounded_lead_s_after_the_near_end_was_recorded():
    """reference(n): the far-end samples paired with the last n cleaned ones, read LEAD_S ahead of the
    near end's clock (bench/aec.py measures the canceller against it)."""
    from engine.audio.echo import LEAD_S, RATE_HZ

    canceller = EchoCanceller()
    assert not canceller.reference(160).any()  # nothing paired yet
    far = np.random.default_rng(1).uniform(-0.3, 0.3, RATE_HZ).astype(np.float32)
    canceller.far_end(far, RATE_HZ, t_sound=10.0)
    out = canceller.near_end(np.zeros(800, np.float32), t_recorded=10.0)
    lead = round(LEAD_S * RATE_HZ)
    np.testing.assert_array_equal(canceller.reference(len(out)), far[lead : lead + len(out)])


# -- the echo path: does the microphone hear the speakers at all? (a headset's does not) ---------------

USER = "What time does the museum open on Sunday, and is there a cafe inside?"


class Devices:
    """The Player's and the Microphone's callbacks on one virtual clock, for a canceller: the far end (Parley's
    whole voice, 16 kHz) goes to it ahead of the near end by LEAD_S and a block, as audio leaves for the speakers
    before it sounds; run(near) hands over the next stretch of the near end and returns it cleaned."""

    def __init__(self, canceller, far, block=320):
        from engine.audio.echo import LEAD_S, RATE_HZ

        self.canceller, self.far, self.block, self.rate = canceller, far, block, RATE_HZ
        self.ahead = round(LEAD_S * RATE_HZ) + block
        self.at = 0  # near-end samples handed over so far
        canceller.far_end(far[: self.ahead], RATE_HZ, t_sound=100.0)

    def run(self, near):
        out = []
        for i in range(0, len(near), self.block):
            at = self.at + i
            end = at + self.ahead
            self.canceller.far_end(self.far[end : end + self.block], self.rate, t_sound=100.0 + end / self.rate)
            out.append(self.canceller.near_end(near[i : i + self.block], t_recorded=100.0 + at / self.rate))
        self.at += len(near)
        return np.concatenate(out)


def hum(n):
    """A real microphone's floor: 50 Hz mains hum at about -69 dBFS."""
    return (0.0005 * np.sin(2 * np.pi * 50 * np.arange(n) / 16_000)).astype(np.float32)


def echo_of(far, delay_s=0.04, gain=0.3):
    """The speakers heard by the microphone: far, delay_s later and quieter."""
    delay = round(delay_s * 16_000)
    return gain * np.concatenate([np.zeros(delay, np.float32), far[: len(far) - delay]])


def test_a_microphone_that_hears_the_speakers_is_cancelled(speak):
    """Parley's voice coming back 40 ms later: the echo path is found, and the echo is cancelled."""
    far = np.concatenate([speak(SPEECH)] * 2)
    raw = echo_of(far) + hum(len(far))
    raw = raw[: len(raw) // 320 * 320]
    canceller = EchoCanceller()
    out = Devices(canceller, far).run(raw)
    assert canceller.speakers_heard is True
    tail = slice(len(out) // 2, len(out))  # AEC3 has converged by then
    erle_db = 10 * np.log10(np.sum(raw[tail].astype(np.float64) ** 2) / np.sum(out[tail].astype(np.float64) ** 2))
    assert erle_db > 10, f"ERLE {erle_db:.1f} dB"


def test_a_headset_microphone_passes_the_users_voice_through_untouched_and_an_unplugged_one_is_found(speak):
    """A headset never hears the speakers: once PATH_WINDOW_S of Parley's speech showed it, the microphone
    passes through as it is, so the user's voice over Parley's (which AEC3 alone removes in patches) reaches
    the VAD whole. When the speakers come to be heard (the headset unplugged), cancelling resumes."""
    from engine.audio.echo import PATH_WINDOW_S

    far = np.concatenate([speak(SPEECH)] * 5)
    half = 8_000  # samples: half a second
    talk_at = int((PATH_WINDOW_S + 2) * 2) * half  # the user speaks over Parley once the path is known
    user = speak(USER)
    headset = hum(talk_at + len(user) + 4 * half)
    headset = headset[: len(headset) // half * half]
    headset[talk_at : talk_at + len(user)] += user
    canceller = EchoCanceller()
    devices = Devices(canceller, far)
    out, known = [], []
    for i in range(0, len(headset), half):
        out.append(devices.run(headset[i : i + half]))
        known.append(canceller.speakers_heard)
    assert known[-1] is False
    decided = known.index(False)
    assert decided <= 2 * (PATH_WINDOW_S + 1) and all(k is False for k in known[decided:])
    passed = (decided + 1) * half  # the half seconds after the decision
    assert passed < talk_at
    np.testing.assert_array_equal(np.concatenate(out)[passed:], headset[passed:])
    # the headset unplugged: from now on the microphone hears Parley
    at = devices.at
    unplugged = echo_of(far)[at:] + hum(len(far) - at)
    for i in range(0, int(PATH_WINDOW_S + 3) * 2 * half, half):
        devices.run(unplugged[i : i + half])
    assert canceller.speakers_heard is True


def test_parleys_own_voice_played_and_recorded_back_is_cancelled(sound_server, speak):
    """On the null-sink loopback, the echo of espeak speech comes out of the canceller at least 10 dB
    quieter over the frames where it is loud (after the first second, AEC3's convergence)."""
    import soxr

    from engine.audio import Microphone, Player

    speech = soxr.resample(np.concatenate([speak(SPEECH)] * 2), 16_000, 24_000).astype(np.float32)
    tap = Tap(EchoCanceller())
    with Player() as player, Microphone() as mic:
        player.echo, mic.echo = tap, tap
        player.write(np.zeros(12_000, np.float32))  # half a second of silence: the pairing settles first
        player.write(speech)
        assert player.wait_done(60)
        # the echo's tail: the microphone has recorded as much as the player played, plus 0.3 s
        wanted = sum(map(len, tap.raw)) + 8_000
        while sum(map(len, tap.raw)) < wanted:
            assert mic.read(5) is not None
        player.echo = mic.echo = None
    cleaned = np.concatenate(tap.cleaned)
    raw = np.concatenate(tap.raw)[: len(cleaned)]
    frames = len(cleaned) // FRAME_SAMPLES
    raw_f = raw[: frames * FRAME_SAMPLES].reshape(frames, FRAME_SAMPLES).astype(np.float64)
    out_f = cleaned[: frames * FRAME_SAMPLES].reshape(frames, FRAME_SAMPLES).astype(np.float64)
    loud = np.sqrt(np.mean(raw_f**2, axis=1)) > 10 ** (-40 / 20)
    assert loud.sum() > 300  # the echo was recorded: over 3 s of loud frames
    first = int(np.argmax(loud))
    keep = loud & (np.arange(frames) >= first + 100)
    erle_db = 10 * np.log10(np.sum(raw_f[keep] ** 2) / np.sum(out_f[keep] ** 2))
    assert erle_db > 10, f"ERLE {erle_db:.1f} dB"


# -- the voice loop on the loopback: Parley's own voice must not barge in, a second voice must ----------

REPLY = ("The train to Lyon leaves at ten past nine from platform four. It takes about two hours, and there "
         "is a dining car. The next one after that leaves at eleven, from the same platform.")
QUESTION = "Tell me about the weather today."  # espeak + Whisper base hear this word for word


class EspeakVoice:
    """The tiny TTS engine, but each clause is spoken by espeak-ng, so what Parley says is real speech
    (the tiny checkpoint's random weights make noise that no VAD takes for a voice)."""

    def __init__(self, tts, speak):
        self._tts, self._speak = tts, speak

    def __getattr__(self, name):
        return getattr(self._tts, name)

    def stream(self, text, *args, **kwargs):
        import soxr

        return _EspeakStream(soxr.resample(self._speak(text), 16_000, 24_000).astype(np.float32))


class _EspeakStream:
    notice = None

    def __init__(self, pcm):
        import time

        self.t_start, self._pcm, self._cancelled = time.perf_counter(), pcm, False

    def cancel(self):
        self._cancelled = True

    def __iter__(self):
        import time
        from types import SimpleNamespace

        for start in range(0, len(self._pcm), 1920):  # 80 ms chunks, as the TTS streams them
            if self._cancelled:
                return
            yield SimpleNamespace(pcm=self._pcm[start : start + 1920], t_ready=time.perf_counter())


def second_voice(sound_server, tmp_path):
    """espeak-ng's English female voice saying QUESTION, played into 'vsink' (mixed with Parley's) by pacat."""
    import subprocess

    import soundfile
    import soxr

    wav = tmp_path / "second.wav"
    subprocess.run(["espeak-ng", "-v", "en-us+f3", "-s", "150", "-w", str(wav), QUESTION], check=True)
    audio, rate = soundfile.read(wav, dtype="float32")
    audio = soxr.resample(audio, rate, 16_000).astype(np.float32)
    player = subprocess.Popen(["pacat", "--playback", "--device=vsink", "--raw", "--format=float32le",
                               "--rate=16000", "--channels=1"], stdin=subprocess.PIPE, env=sound_server.env)
    player.stdin.write(audio.tobytes())
    player.stdin.close()
    return player


@pytest.fixture(scope="module")
def chat(smollm2_path):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the README's install builds it)")
    from engine.llm.chat import ChatModel, ChatOptions

    return ChatModel(smollm2_path, ChatOptions(n_ctx=512, max_tokens=20, n_threads=1, temperature=0.0))


@pytest.fixture
def loopback_loop(sound_server, chat, short_tts, transcriber, speak, tmp_path):
    """run(**VoiceOptions) -> (loop, events, dialogue): a hands-free loop whose microphone records its own
    speakers ('vsink' and its monitor), Parley speaking with espeak-ng."""
    from contextlib import ExitStack

    from engine.audio import Microphone, Player
    from engine.history import HistoryStore
    from engine.llm.clauses import ClauseOptions
    from engine.dialogue import Dialogue, DialogueOptions
    from engine.listening import VadOptions, VoiceOptions
    from engine.voice_loop import VoiceLoop
    from tests.conftest import Events

    chat.clear_history()
    with ExitStack() as stack:
        player, mic = stack.enter_context(Player()), stack.enter_context(Microphone())
        history = stack.enter_context(HistoryStore(tmp_path / "history.sqlite3"))
        dialogue = Dialogue(chat, EspeakVoice(short_tts, speak), player, history, transcriber,
                            options=DialogueOptions(speaker="ryan",
                                                    clauses=ClauseOptions(min_first_words=1, min_words=2)))

        def run(**options):
            events = Events()
            loop = stack.enter_context(VoiceLoop(dialogue, mic,
                                                 options=VoiceOptions(vad=VadOptions(silence_ms=500), **options)))
            loop.subscribe(events)
            loop.start()
            return loop, events, dialogue

        yield run


def test_parleys_own_voice_from_the_speakers_does_not_barge_in(loopback_loop):
    from engine.events import BargeIn, Heard, SpeechStarted, TurnFinished

    loop, events, dialogue = loopback_loop()
    loop.submit_text(REPLY, speak_only=True)
    finished = events.wait_for(TurnFinished)
    loop.close()
    assert not finished.result.interrupted and finished.result.heard_text
    assert dialogue.player.stats().frames_played > 24_000 * 5  # over 5 s of speech went out and came back
    assert not events.of(BargeIn) and not events.of(SpeechStarted) and not events.of(Heard)


def test_with_neither_echo_cancellation_nor_the_level_gate_parleys_own_voice_barges_in(loopback_loop):
    """The control for the test above: the same echo is taken for the user once nothing stops it (the
    gate opened wide: its loudest-block floor alone, for one block)."""
    from engine.events import BargeIn, TurnFinished

    loop, events, _ = loopback_loop(echo_cancellation=False, barge_in_margin_db=0.0, barge_in_min_dbfs=-100.0,
                                    barge_in_ms=1)
    loop.submit_text(REPLY, speak_only=True)
    events.wait_for(BargeIn)
    assert events.wait_for(TurnFinished).result.interrupted


def test_a_second_voice_over_parleys_speech_barges_in_and_is_heard(loopback_loop, sound_server, tmp_path):
    from engine.events import BargeIn, Heard, TurnFinished

    loop, events, dialogue = loopback_loop()
    loop.submit_text(REPLY, speak_only=True)
    # five seconds into Parley's reply (AEC3 converges in its first two or three), the user speaks over it
    assert dialogue.player.wait_until(lambda s: s.frames_played >= 5 * 24_000, 60)
    assert not events.of(BargeIn)
    second_voice(sound_server, tmp_path).wait()
    events.wait_for(BargeIn)
    assert events.wait_for(TurnFinished).result.interrupted
    heard = events.wait_for(Heard).text
    assert likeness(heard, QUESTION) > max(likeness(heard, line) for line in REPLY.split(". ")), heard


def likeness(a: str, b: str) -> float:
    """How alike two texts are, letter by letter (difflib's ratio, 0..1, case aside). The turn of a voice spoken
    over Parley's is the voice's if its text is more like that voice's line than like any sentence of the reply.
    No one word of it is sure: its start is under Parley's voice, and Whisper has heard the line as "Tell me about
    the winner today!" and "and we amount the Wemmer to May" (0.86 and 0.67 like it, 0.41 and 0.31 like the
    nearest sentence of the reply)."""
    return difflib.SequenceMatcher(None, a.lower(), b.lower()).ratio()


def test_over_a_headset_the_users_voice_over_parleys_barges_in_with_echo_cancellation_on(user_mic, loopback_loop,
                                                                                        speak):
    """With a headset the microphone ('usermic') never hears Parley ('vsink'). The canceller, on as by default,
    finds no echo path in Parley's first PATH_WINDOW_S of speech and passes the microphone through, so the user's
    voice over the reply barges in and becomes the turn (AEC3 alone takes it for echo in patches: the soak with
    the canceller on lost a turn so, docs/lab/BENCHMARKS-LOG.md)."""
    from engine.audio.echo import PATH_WINDOW_S
    from engine.events import BargeIn, Heard, TurnFinished

    loop, events, dialogue = loopback_loop()
    loop.submit_text(REPLY, speak_only=True)
    assert dialogue.player.wait_until(lambda s: s.frames_played >= (PATH_WINDOW_S + 2) * 24_000, 60)
    assert not events.of(BargeIn)
    user_mic(speak(QUESTION)).wait()
    events.wait_for(BargeIn)
    assert events.wait_for(TurnFinished).result.interrupted
    assert "today" in events.wait_for(Heard).text.lower()
