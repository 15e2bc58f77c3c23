"""Speakers and microphone unplugged and plugged back, on the session's real PulseAudio server (tests/conftest.py):
the null sinks' modules are unloaded mid-stream (pactl unload-module), with module-always-sink out of the way so
that no sink is left to take the streams over, and PortAudio's streams end as on a real unplug; then sinks of
the same names are loaded again. Player and Microphone, then the voice loop with the real TTS, SmolLM2, Whisper
and a SQLite history: a clear message, the turn in flight saved, and the loop carrying on by itself."""

import subprocess

import numpy as np
import pytest

from engine.errors import AudioDeviceError, AudioDeviceLostError
from tests.conftest import MIC_RATE_HZ, NULL_SINK_RATE_HZ, QUESTION, QUESTION_WORD, hum

WAIT_S = 120  # generous: the null sinks run slow and the machine is shared


class Plugs:
    """Unplugs and plugs back null sinks of the session's PulseAudio server, by name; restore() puts the
    server back as the session started it (vsink the default sink, its monitor the default source)."""

    def __init__(self, server):
        self.env = server.env

    def pactl(self, *args) -> str:
        return subprocess.run(["pactl", *args], env=self.env, capture_output=True, text=True, check=True,
                              timeout=10).stdout.strip()

    def _modules(self) -> list[tuple[str, str, str]]:
        """(index, name, arguments) of each loaded module."""
        return [tuple((line.split("\t") + [""])[:3]) for line in self.pactl("list", "short", "modules").splitlines()]

    def _sink_module(self, sink: str) -> str | None:
        return next((i for i, name, args in self._modules()
                     if name == "module-null-sink" and f"sink_name={sink}" in args.split()), None)

    def unplug(self, *sinks: str) -> None:
        """Unloads the named sinks (and module-always-sink, which would put a sink in their place)."""
        for index, name, _ in self._modules():
            if name == "module-always-sink":
                self.pactl("unload-module", index)
        for sink in sinks:
            self.pactl("unload-module", self._sink_module(sink))

    def plug(self, sink: str, *args: str) -> None:
        """Loads a null sink named `sink` (module-null-sink arguments `args`), humming as a real device does."""
        self.pactl("load-module", "module-null-sink", f"sink_name={sink}", *args)
        hum(self.env, sink)

    def route(self, sink: str, source: str) -> None:
        """Makes `sink` and `source` the defaults and moves every stream there (a stream reopened between two
        plugs may have landed on whichever device was there first)."""
        self.pactl("set-default-sink", sink)
        self.pactl("set-default-source", source)
        for line in self.pactl("list", "short", "sink-inputs").splitlines():
            index, _, _, driver, *_ = line.split("\t")
            if driver != "module-sine.c":  # a device's own hum stays with it
                self.pactl("move-sink-input", index, sink)
        for line in self.pactl("list", "short", "source-outputs").splitlines():
            self.pactl("move-source-output", line.split("\t")[0], source)

    def restore(self) -> None:
        for index, name, args in self._modules():
            if name == "module-null-sink" and "sink_name=vsink" not in args.split():
                self.pactl("unload-module", index)
        if self._sink_module("vsink") is None:
            self.plug("vsink", f"rate={NULL_SINK_RATE_HZ}")
        if not any(name == "module-always-sink" for _, name, _ in self._modules()):
            self.pactl("load-module", "module-always-sink")
        self.route("vsink", "vsink.monitor")


@pytest.fixture
def plugs(sound_server):
    plugs = Plugs(sound_server)
    yield plugs
    if sound_server.pid() is not None:
        plugs.restore()


def tone(hz: float, seconds: float, rate_hz: int = 24_000) -> np.ndarray:
    t = np.arange(int(seconds * rate_hz)) / rate_hz
    return (0.5 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def test_a_player_whose_sink_was_unloaded_says_so_and_plays_again_once_it_is_back(plugs):
    """Unloading the sink mid-utterance: waits raise AudioDeviceLostError ('the speakers were disconnected'),
    reopen() fails while no sink exists and works once one named the same is loaded; then it plays again."""
    from engine.audio import Player

    with Player() as player:
        player.write(tone(440, 10.0))
        assert player.wait_until(lambda s: s.frames_played > 0, WAIT_S)
        plugs.unplug("vsink")
        with pytest.raises(AudioDeviceLostError, match="the speakers were disconnected: output device 'default'"):
            player.wait_done(WAIT_S)
        assert player.lost is not None and player.lost.kind == "output"
        assert player.lost.lost.startswith("output device 'default'") and "disconnected" not in player.lost.lost
        with pytest.raises(AudioDeviceError, match="cannot open output device"):
            player.reopen()  # nothing to play on yet
        assert player.lost is not None
        plugs.plug("vsink", f"rate={NULL_SINK_RATE_HZ}")
        player.reopen()
        assert player.lost is None
        before = player.stats()
        player.write(tone(660, 0.3))
        assert player.wait_done(WAIT_S)
        after = player.stats()
    assert after.frames_played - before.frames_played == 7200  # all of the 0.3 s at 24 kHz
    assert after.frames_written == after.frames_played + after.frames_flushed  # the lost stream's rest: flushed


def test_a_microphone_whose_source_was_unloaded_says_so_and_records_again_once_it_is_back(plugs):
    """Unloading every sink (so no source is left) while recording: read() raises AudioDeviceLostError ('the
    microphone was disconnected'); once the sinks are back, reopen() records what is played into them."""
    from engine.audio import Microphone

    plugs.plug("headmic", f"rate={MIC_RATE_HZ}", "channels=1")
    plugs.route("vsink", "headmic.monitor")
    with Microphone() as mic:
        assert mic.read(WAIT_S) is not None
        plugs.unplug("headmic", "vsink")
        with pytest.raises(AudioDeviceLostError, match="the microphone was disconnected: input device 'default'"):
            while True:
                mic.read(WAIT_S)  # drains what was queued, then raises
        plugs.plug("headmic", f"rate={MIC_RATE_HZ}", "channels=1")
        plugs.plug("vsink", f"rate={NULL_SINK_RATE_HZ}")
        plugs.route("vsink", "headmic.monitor")
        mic.reopen()
        assert mic.lost is None
        pacat = play_into("headmic", plugs, tone(1000, 2.0, MIC_RATE_HZ))
        loudest = max(float(np.sqrt(np.mean(np.square(mic.read(WAIT_S).pcm)))) for _ in range(100))
        pacat.wait(WAIT_S)
    assert loudest > 0.2  # the tone, recorded by the reopened stream


def play_into(sink: str, plugs: Plugs, audio: np.ndarray) -> subprocess.Popen:
    """Plays (n,) float32 16 kHz mono audio into `sink` (the user speaking into the microphone)."""
    pacat = subprocess.Popen(["pacat", "--playback", f"--device={sink}", "--raw", "--format=float32le",
                              f"--rate={MIC_RATE_HZ}", "--channels=1"], stdin=subprocess.PIPE, env=plugs.env,
                             stderr=subprocess.DEVNULL)
    pacat.stdin.write(np.asarray(audio, np.float32).tobytes())
    pacat.stdin.close()
    return pacat


# -- the voice loop -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def chat(smollm2_path):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the README's install builds it)")
    from engine.llm.chat import ChatModel, ChatOptions

    return ChatModel(smollm2_path, ChatOptions(n_ctx=512, max_tokens=24, n_threads=1, temperature=0.0))


def dialogue_on(player, chat, short_tts, history, transcriber=None):
    from engine.llm.clauses import ClauseOptions
    from engine.dialogue import Dialogue, DialogueOptions

    chat.clear_history()
    return Dialogue(chat, short_tts, player, history, transcriber,
                    options=DialogueOptions(speaker="ryan", tts_seed=1,
                                            clauses=ClauseOptions(min_first_words=1, min_words=2)))


def saved(dialogue):
    return dialogue.history.open_conversation(dialogue.conversation_id).turns


def test_the_loop_saves_the_cut_turn_says_the_speakers_are_gone_and_speaks_again_once_they_are_back(
        plugs, chat, short_tts, tmp_path):
    """The speakers' sink unloaded while a reply plays: TurnFailed and DeviceLost say 'the speakers were
    disconnected', the reply is saved as far as it was heard; a sink of the same name loaded again gives
    DeviceRestored by itself, and the next turn is spoken and saved."""
    from engine.audio import Player
    from engine.history import HistoryStore
    from engine.events import DeviceLost, DeviceRestored, SpeakingClause, TurnFailed, TurnFinished
    from engine.voice_loop import VoiceLoop
    from tests.conftest import Events

    long_text = "First part, second part, third part, fourth part, fifth part, sixth part, the end."
    events = Events()
    with Player() as player, HistoryStore(tmp_path / "history.sqlite3") as history:
        dialogue = dialogue_on(player, chat, short_tts, history)
        with VoiceLoop(dialogue) as loop:  # no microphone: typed and spoken-text turns
            loop.subscribe(events)
            loop.start()
            loop.submit_text(long_text, speak_only=True)
            events.wait_for(SpeakingClause)
            plugs.unplug("vsink")
            failed = events.wait_for(TurnFailed)
            lost = events.wait_for(DeviceLost)
            plugs.plug("vsink", f"rate={NULL_SINK_RATE_HZ}")
            restored = events.wait_for(DeviceRestored)
            played = player.stats().frames_played
            loop.submit_text("Back again.", speak_only=True)
            finished = events.wait_for(TurnFinished)
        turns = saved(dialogue)

    assert isinstance(failed.error, AudioDeviceLostError)
    assert failed.message.startswith("the speakers were disconnected: output device 'default'")
    assert (lost.kind, lost.message) == ("output", failed.message) and "once they are back" in lost.message
    assert (restored.kind, restored.message) == ("output", "the speakers are back: output device 'default'")
    assert finished.result.heard_text == "Back again." and player.stats().frames_played > played
    cut, back = turns
    assert cut.text == long_text and cut.interrupted and long_text.startswith(cut.heard_text)
    assert len(cut.heard_text) < len(long_text) and (back.text, back.interrupted) == ("Back again.", False)


def test_a_headset_unplugged_mid_sentence_keeps_what_was_said_and_the_loop_listens_again_once_it_is_back(
        plugs, chat, short_tts, transcriber, speak, tmp_path):
    """Microphone and speakers both unplugged while the user speaks: DeviceLost for each ('the microphone was
    disconnected'), the words said so far become a turn that is saved (its reply cannot be spoken: TurnFailed);
    plugged back, DeviceRestored for each comes by itself, and a new question is heard, answered and spoken."""
    from engine.audio import Microphone, Player
    from engine.events import DeviceLost, DeviceRestored, Heard, Level, SpeechStarted, TurnFailed, TurnFinished
    from engine.history import HistoryStore
    from engine.stt.vad import VadOptions
    from engine.listening import VoiceOptions
    from engine.voice_loop import VoiceLoop
    from tests.conftest import Events

    plugs.plug("headmic", f"rate={MIC_RATE_HZ}", "channels=1")
    plugs.route("vsink", "headmic.monitor")  # Parley speaks on vsink, the user into headmic: no echo
    events = Events()
    with Player() as player, Microphone() as mic, HistoryStore(tmp_path / "history.sqlite3") as history:
        dialogue = dialogue_on(player, chat, short_tts, history, transcriber)
        with VoiceLoop(dialogue, mic, options=VoiceOptions(vad=VadOptions(silence_ms=500))) as loop:
            loop.subscribe(events)
            loop.start()
            events.wait_for(Level)
            play_into("headmic", plugs, speak("Tell me about the weather today and about the weather tomorrow."))
            events.wait_for(SpeechStarted)
            levels = len(events.of(Level))
            events.wait_for(Level, count=levels + 15)  # 1.5 s more of the sentence heard
            plugs.unplug("headmic", "vsink")
            mic_lost = events.wait_for(DeviceLost, kind="input")
            heard = events.wait_for(Heard)
            failed = events.wait_for(TurnFailed)
            events.wait_for(DeviceLost, kind="output")
            plugs.plug("headmic", f"rate={MIC_RATE_HZ}", "channels=1")
            plugs.plug("vsink", f"rate={NULL_SINK_RATE_HZ}")
            events.wait_for(DeviceRestored, kind="input")
            events.wait_for(DeviceRestored, kind="output")
            plugs.route("vsink", "headmic.monitor")
            played = player.stats().frames_played
            play_into("headmic", plugs, speak(QUESTION))
            finished = events.wait_for(TurnFinished)
        turns = saved(dialogue)

    assert mic_lost.message.startswith("the microphone was disconnected: input device 'default'")
    assert heard.text.strip() and isinstance(failed.error, AudioDeviceLostError) and failed.error.kind == "output"
    assert QUESTION_WORD in finished.result.user_text.lower() and player.stats().frames_played > played
    cut_user, cut_reply, user, reply = turns
    assert cut_user.text == heard.text and cut_reply.interrupted and cut_reply.heard_text == ""
    assert (user.text, reply.text) == (finished.result.user_text, finished.result.reply_text)
