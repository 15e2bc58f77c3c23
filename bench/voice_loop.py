"""Benchmark of the live voice loop: a scripted 20-turn spoken conversation, per-stage latency p50/p95.

Method: a private PulseAudio server with two null sinks: 'vsink' (48 kHz) is the speakers Parley plays
on, 'usermic' (16 kHz) is where the user's voice is played (espeak-ng, en-us, 150 words/min), and its
monitor is the default source the Microphone records. Each scripted line is played into 'usermic' and
goes through the real loop (engine/voice_loop.py: Silero VAD endpointing hands-free -> Whisper base ->
SmolLM2-135M-Instruct -> clause splitter -> Qwen3-TTS -> Player); the next line starts once the reply
has played out. One unscored warm-up turn first. The figures are engine/metrics.py's, summarised by
its MetricsRecorder (p50/p95 over the scored turns); "voice-to-voice beyond the window" is
voice-to-voice minus --silence-ms, the pause the endpointer waits for before it ends a turn.

The Qwen3-TTS weights are random (no checkpoint can be downloaded here), written in the official
layout at --size unless --model is given, each clause capped at --max-frames frames (random weights
rarely emit EOS), so the work per frame is the real model's. PulseAudio's null sinks run on a slow
clock (~50-75% of real time here): the user's speech and the silence window take longer in wall time
than in audio time, which inflates voice-to-voice; STT, TTFT, TTFC and RTF are unaffected.

--app runs the same turns through the desktop app instead of a bare loop: the main window (on Qt's offscreen
platform) with its worker thread and the Assistant, on the app's settings but for the models, the device, a fixed
--silence-ms window and the same LLM options; the window shows every event as it does for a user (the live
transcript, the growing reply, the meter). Beside a bare loop with --partials (the app's live transcript) and one
without (as `parley chat`), it tells where the app's time goes.

--audio virtual is for machines with neither a sound server nor PortAudio (the GPU machine): a software
sound card (bench/virtual_audio.py) takes sounddevice's place, and its clock threads call the real
Player's and Microphone's callbacks once a period at wall-clock pace; the user's line goes into the
microphone's stream at the pace it was spoken, then silence. Everything from the Microphone's callback
to the Player's callback is the same code as with PulseAudio, and voice-to-voice still ends at the first
sample handed over in the Player's callback. The lines' speech is read from --voices (WAV files that
espeak-ng wrote there earlier: --voices-only renders them and stops), so espeak-ng is needed only where
they are rendered. bench/gpu_voice_loop.sh runs it so on the GPU machine.

    python bench/voice_loop.py                      # CPU, tiny checkpoint
    python bench/voice_loop.py --app                # the same through the desktop app
    python bench/voice_loop.py --device cuda --size 0.6b
    python bench/voice_loop.py --voices DIR --voices-only && python bench/voice_loop.py --audio virtual --voices DIR
Needs the Debian packages pulseaudio, pulseaudio-utils, libasound2-plugins and espeak-ng (.ci/run), or
with --audio virtual only a --voices folder rendered elsewhere.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import queue
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SCRIPT = [
    "Hello, who are you?",
    "Tell me about the weather today.",
    "What is a good breakfast?",
    "How do I make a cup of tea?",
    "Name a famous painter.",
    "What is the largest animal?",
    "Give me a tip for better sleep.",
    "What is the capital of Spain?",
    "How many days are in a week?",
    "Tell me a short joke.",
    "What is your favorite book?",
    "How do plants grow?",
    "What is the speed of light?",
    "Suggest a name for a dog.",
    "What should I cook for dinner?",
    "How far away is the moon?",
    "What is a healthy snack?",
    "Tell me something about the ocean.",
    "What time is it in London?",
    "Thank you, goodbye.",
]
WARM_UP = "Good morning."
USER_RATE_HZ = 16_000
ROWS = [  # (figure in engine/metrics.py, shown as)
    ("stt_ms", "STT (end of turn -> transcript) ms"),
    ("llm_ttft_ms", "LLM TTFT ms"),
    ("llm_first_clause_ms", "LLM first clause ms"),
    ("tts_ttfc_ms", "TTS TTFC ms"),
    ("tts_rtf", "TTS RTF"),
    ("voice_to_voice_ms", "voice-to-voice ms"),
    ("underruns", "underruns per turn"),
]


class Pulse:
    """A private pulseaudio daemon with the two null sinks; stop() ends it."""

    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="parley-bench-pulse-"))
        self.dir.chmod(0o700)
        self.env = {**os.environ, "XDG_RUNTIME_DIR": str(self.dir), "PULSE_RUNTIME_PATH": str(self.dir / "pulse")}
        self.env.pop("PULSE_SERVER", None)
        subprocess.run(["pulseaudio", "-n", "--daemonize=yes", "--exit-idle-time=-1", "--disallow-exit",
                        "-L", "module-null-sink sink_name=vsink rate=48000",
                        "-L", f"module-null-sink sink_name=usermic rate={USER_RATE_HZ} channels=1",
                        "-L", "module-native-protocol-unix auth-anonymous=1", "-L", "module-always-sink"],
                       env=self.env, check=True, capture_output=True, timeout=30)  # fmt: skip
        for args in (["set-default-sink", "vsink"], ["set-default-source", "usermic.monitor"]):
            self.pactl(*args)
        # the microphone hums faintly (50 Hz, -69 dBFS) as a real one does; exact zeros between lines would
        # be reported as a silenced microphone (VoiceOptions.silent_microphone_s)
        hum = self.pactl("load-module", "module-sine", "sink=usermic", "frequency=50")
        for block in self.pactl("list", "sink-inputs").split("Sink Input #")[1:]:
            if f"Owner Module: {hum}" in (line.strip() for line in block.splitlines()):
                self.pactl("set-sink-input-volume", block.split()[0], "0.001")
        # PortAudio (through ALSA's pulse plugin) finds the server from these, read when it opens a stream
        os.environ.update({k: self.env[k] for k in ("XDG_RUNTIME_DIR", "PULSE_RUNTIME_PATH")})
        os.environ.pop("PULSE_SERVER", None)

    def pactl(self, *args: str) -> str:
        return subprocess.run(["pactl", *args], env=self.env, check=True, capture_output=True, text=True,
                              timeout=10).stdout.strip()

    def play(self, audio: np.ndarray) -> subprocess.Popen:
        player = subprocess.Popen(["pacat", "--playback", "--device=usermic", "--raw", "--format=float32le",
                                   f"--rate={USER_RATE_HZ}", "--channels=1"], stdin=subprocess.PIPE, env=self.env)
        player.stdin.write(audio.astype(np.float32).tobytes())
        player.stdin.close()
        return player

    def stop(self) -> None:
        # PortAudio's client (ALSA's pulse plugin) stays connected until PortAudio ends, and makes the runtime
        # folder anew once the server has gone: end it first (no audio is used after stop())
        if "sounddevice" in sys.modules:
            sys.modules["sounddevice"]._terminate()
        pid_file = self.dir / "pulse" / "pid"
        pid = int(pid_file.read_text().split()[0]) if pid_file.is_file() else None
        subprocess.run(["pulseaudio", "--kill"], env=self.env, capture_output=True, timeout=30)
        # the server makes the folder anew while it shuts down, if it is already gone: wait until it has exited
        deadline = time.monotonic() + 10
        while pid is not None and _running(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        shutil.rmtree(self.dir, ignore_errors=True)


def _running(pid: int) -> bool:
    """Whether the process runs (a zombie, which init may reap late, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def speech(text: str, folder: Path, voice: str = "en-us") -> np.ndarray:
    """espeak-ng's `voice` at 150 words a minute, as (n,) float32 at 16 kHz; rendered into `folder` unless an
    earlier run left it there (named by the hash of the text, and of the voice where it is not en-us, so an edited
    line is rendered anew)."""
    import soundfile
    import soxr

    name = text if voice == "en-us" else f"{voice}:{text}"  # en-us lines keep the names rendered folders have
    wav = folder / f"{hashlib.sha256(name.encode()).hexdigest()[:16]}.wav"
    if not wav.is_file():
        if shutil.which("espeak-ng") is None:
            raise SystemExit(f"{wav} ({text!r}) is not there and espeak-ng is not installed to render it; "
                             "render the lines elsewhere with --voices DIR --voices-only and bring DIR")
        subprocess.run(["espeak-ng", "-v", voice, "-s", "150", "-w", str(wav), text], check=True)
    audio, rate = soundfile.read(wav, dtype="float32")
    return soxr.resample(audio, rate, USER_RATE_HZ).astype(np.float32)


class VirtualAudio:
    """bench/virtual_audio.py in sounddevice's place; play() speaks into its microphone."""

    def __init__(self):
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import virtual_audio

        virtual_audio.install()
        self.play = virtual_audio.speak

    def stop(self) -> None:
        pass


def random_checkpoint(folder: Path, size: str, max_frames: int) -> Path:
    """A random-weight TTS checkpoint of `size` in the official layout under `folder`, each clause capped
    at `max_frames` frames (random weights rarely emit EOS). Also used by bench/soak.py."""
    from engine.tts.testing import write_checkpoint

    path = write_checkpoint(folder / size, size, seed=0)
    config = path / "generation_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "max_new_tokens": max_frames + 1}))
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where TTS, Whisper and the LLM run")
    parser.add_argument("--size", default="tiny", choices=["tiny", "0.6b"], help="random TTS checkpoint size")
    parser.add_argument("--model", help="a TTS checkpoint folder instead of a random one")
    parser.add_argument("--megakernel", default="auto", choices=["auto", "on", "off"],
                        help="TTS decode steps in the CUDA megakernel: where it builds (auto), required, or never")
    parser.add_argument("--max-frames", type=int, default=12, help="random checkpoint: frames per clause cap")
    parser.add_argument("--turns", type=int, default=len(SCRIPT), help=f"scored turns (at most {len(SCRIPT)})")
    parser.add_argument("--silence-ms", type=int, default=700, help="the endpointer's end-of-turn pause")
    parser.add_argument("--llm-threads", type=int, default=1,
                        help="CPU threads for llama.cpp (1: two collapse on a busy 2-core machine)")
    parser.add_argument("--timeout-s", type=float, default=180.0, help="longest wait for one turn")
    parser.add_argument("--audio", default="pulse", choices=["pulse", "virtual"],
                        help="PulseAudio null sinks, or the software sound card (see above)")
    parser.add_argument("--voices",
                        help="folder of the lines' speech, rendered there when missing (default: a temporary one)")
    parser.add_argument("--voices-only", action="store_true", help="render the lines into --voices and stop")
    parser.add_argument("--whisper", help="a CTranslate2 Whisper folder (default: the bundled base)")
    parser.add_argument("--partials", action="store_true",
                        help="transcribe the utterance while it is spoken too, as the app does for its live transcript")
    parser.add_argument("--app", action="store_true",
                        help="through the desktop app (main window offscreen, its worker, the Assistant)")
    parser.add_argument("--json", help="also write the figures (p50/p95 per figure) to this JSON file")
    args = parser.parse_args(argv)
    if args.voices_only and not args.voices:
        parser.error("--voices-only needs --voices")
    if args.app and (args.audio != "pulse" or args.partials):
        parser.error("--app takes the app's own live transcript and needs --audio pulse")

    work = Path(tempfile.mkdtemp(prefix="parley-bench-"))
    voices = Path(args.voices) if args.voices else work
    voices.mkdir(parents=True, exist_ok=True)
    if args.voices_only:
        for line in [WARM_UP] + SCRIPT[: args.turns]:
            speech(line, voices)
        print(f"{args.turns + 1} lines in {voices}", file=sys.stderr)
        return 0
    # before sounddevice is imported: PortAudio lists devices once
    audio = Pulse() if args.audio == "pulse" else VirtualAudio()
    try:
        return (run_app if args.app else run)(args, audio, work, voices)
    finally:
        audio.stop()
        shutil.rmtree(work, ignore_errors=True)


def load_transcriber(args):
    """Whisper on --device, or on the CPU where CTranslate2's CUDA libraries do not load there (the
    Transcriber falls back by itself, saying why): the table names where it ran."""
    from engine.stt import Transcriber, TranscriberOptions

    transcriber = Transcriber(args.whisper,
                              TranscriberOptions(device=args.device, cpu_threads=2 if args.device == "cpu" else 0))
    if transcriber.gpu_unavailable:
        print(transcriber.gpu_unavailable, file=sys.stderr)
    transcriber.warm_up()
    return transcriber


def run(args, audio, work: Path, voices_dir: Path) -> int:
    from engine.audio import Microphone, Player
    from engine.dialogue import Dialogue
    from engine.events import TurnFailed, TurnFinished
    from engine.history import HistoryStore
    from engine.listening import VoiceOptions
    from engine.llm.chat import ChatModel, ChatOptions, bundled_model_path
    from engine.metrics import MetricsRecorder
    from engine.stt import VadOptions
    from engine.tts import load_tts
    from engine.voice_loop import VoiceLoop

    t0 = time.perf_counter()
    checkpoint = Path(args.model) if args.model else random_checkpoint(work, args.size, args.max_frames)
    tts = load_tts(checkpoint, device=args.device, megakernel={"auto": None, "on": True, "off": False}[args.megakernel])
    tts_path = "megakernel" if tts.model.frame_kernel is not None else "PyTorch"
    chat = ChatModel(bundled_model_path(), ChatOptions(n_ctx=2048, max_tokens=48, temperature=0.0,
                                                       n_threads=args.llm_threads,
                                                       n_gpu_layers=None if args.device == "cuda" else 0))
    transcriber = load_transcriber(args)
    lines = [WARM_UP] + SCRIPT[: args.turns]
    voices = [speech(line, voices_dir) for line in lines]
    print(f"loaded in {time.perf_counter() - t0:.0f} s: TTS {tts.folder.name} on {tts.device}, Whisper on "
          f"{transcriber.device} ({transcriber.compute_type}), LLM {chat.model_path.name} with "
          f"{chat.n_gpu_layers} GPU layers", file=sys.stderr)

    events: queue.SimpleQueue = queue.SimpleQueue()
    failed = early = 0
    with Player() as player, Microphone() as mic, HistoryStore(work / "history.sqlite3") as history:
        dialogue = Dialogue(chat, tts, player, history, transcriber)
        options = VoiceOptions(vad=VadOptions(silence_ms=args.silence_ms), barge_in=False, partials=args.partials)
        with VoiceLoop(dialogue, mic, options=options) as loop:
            loop.subscribe(lambda e: events.put(e) if isinstance(e, TurnFinished | TurnFailed) else None)
            loop.start()
            for i, (line, voice) in enumerate(zip(lines, voices)):
                if i == 1:
                    dialogue.metrics = MetricsRecorder()  # the warm-up turn is not scored
                audio.play(voice).wait()
                try:
                    event = events.get(timeout=args.timeout_s)
                except queue.Empty:
                    print(f"turn {i}: no result within {args.timeout_s:.0f} s; stopping", file=sys.stderr)
                    return 1
                if isinstance(event, TurnFailed):
                    failed += i > 0
                    print(f"turn {i} ({line!r}) failed: {event.message}", file=sys.stderr)
                else:
                    r = event.result
                    early += i > 0 and r.metrics.early_reply
                    print(f"turn {i}: heard {r.user_text!r} -> {len(r.reply_text.split())} words, "
                          f"{describe(r.metrics)}", file=sys.stderr)
        summary = dialogue.metrics.summary()

    scored = dialogue.metrics.turns
    setup = (f"{platform.machine()} with {os.cpu_count()} CPU cores, --device {args.device}, --audio {args.audio}, "
             f"TTS {args.model or 'random ' + args.size + f' (<= {args.max_frames} frames a clause)'} "
             f"on {tts.device} ({tts_path}), "
             f"Whisper {transcriber.path.name} on {transcriber.device} ({transcriber.compute_type}), "
             f"LLM {chat.model_path.name} with {chat.n_gpu_layers} GPU layers, silence window {args.silence_ms} ms, "
             f"partials {'on' if args.partials else 'off'}")
    return report(args, summary, scored, failed, early, setup)


def describe(metrics) -> str:
    """A turn's LLM figures, for its line on stderr: what the reply's start took, and whether it began early."""
    return (f"LLM first clause {metrics.llm_first_clause_ms or 0:.0f} ms"
            + (", reply begun in the pause" if metrics.early_reply else ""))


def _number(value: float) -> str:
    """Three significant figures, never in exponent form: 1410, 26.7, 0.286."""
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def report(args, summary, scored: int, failed: int, early: int, setup: str) -> int:
    """Prints the table (and writes --json); the exit status."""
    print(f"\n{scored} scored turns ({failed} failed, {early} with the reply begun in the pause), {setup}\n")
    print("| figure | p50 | p95 | turns |")
    print("|---|---|---|---|")
    for name, label in ROWS:
        if name in summary:
            f = summary[name]
            print(f"| {label} | {_number(f.p50)} | {_number(f.p95)} | {f.count} |")
        else:
            print(f"| {label} | - | - | 0 |")
    if "voice_to_voice_ms" in summary:
        f = summary["voice_to_voice_ms"]
        print(f"| voice-to-voice beyond the {args.silence_ms} ms window, ms | {_number(f.p50 - args.silence_ms)} | "
              f"{_number(f.p95 - args.silence_ms)} | {f.count} |")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "setup": setup, "scored_turns": scored,
            "failed_turns": failed, "early_replies": early, "silence_ms": args.silence_ms,
            "figures": {name: {"p50": f.p50, "p95": f.p95, "turns": f.count} for name, f in summary.items()},
        }, indent=1) + "\n")
    return 0 if failed == 0 else 1


def run_app(args, audio, work: Path, voices_dir: Path) -> int:
    """The turns through the desktop app: its window (offscreen), worker and Assistant, on the app's settings."""
    os.environ["QT_QPA_PLATFORM"] = "offscreen"
    import threading

    from PySide6.QtCore import QSettings, QTimer
    from PySide6.QtWidgets import QApplication

    from app.main_window import MainWindow
    from app.settings import Settings
    from engine.events import Figures, Ready, TurnFailed
    from engine.llm.chat import ChatOptions
    from engine.metrics import MetricsRecorder

    qt = QApplication([])
    settings = Settings(QSettings(str(work / "parley.ini"), QSettings.Format.IniFormat))
    settings.tts_model = str(Path(args.model) if args.model else random_checkpoint(work, args.size, args.max_frames))
    settings.stt_model = args.whisper or ""
    settings.device = args.device
    settings.listen_mode = "hands-free"
    settings.turn_detection = False  # the bare loop's fixed window, so that the two compare
    settings.silence_ms = args.silence_ms
    window = MainWindow(settings, history_file=work / "history.sqlite3", chat_options=ChatOptions(
        n_ctx=2048, max_tokens=48, temperature=0.0, n_threads=args.llm_threads,
        n_gpu_layers=None if args.device == "cuda" else 0))
    events: queue.SimpleQueue = queue.SimpleQueue()
    # a plain function: called on the worker's thread as it emits, not queued behind the window's work
    window.worker.event.connect(lambda e: events.put(e) if isinstance(e, Ready | Figures | TurnFailed) else None)
    lines = [WARM_UP] + SCRIPT[: args.turns]
    voices = [speech(line, voices_dir) for line in lines]
    recorder, outcome = MetricsRecorder(), {"failed": 0, "early": 0, "info": None, "error": None}

    def drive() -> None:
        try:
            outcome["info"] = wait_for(events, Ready, args.timeout_s).info
            for i, voice in enumerate(voices):
                audio.play(voice).wait()
                event = wait_for(events, Figures | TurnFailed, args.timeout_s)
                if isinstance(event, TurnFailed):
                    outcome["failed"] += i > 0
                    print(f"turn {i} ({lines[i]!r}) failed: {event.message}", file=sys.stderr)
                elif i > 0:  # the warm-up turn is not scored
                    recorder.record(event.metrics)
                    outcome["early"] += event.metrics.early_reply
                print(f"turn {i}: {'failed' if isinstance(event, TurnFailed) else describe(event.metrics)}",
                      file=sys.stderr)
        except Exception as e:  # reported once the window has closed
            outcome["error"] = e

    t0 = time.perf_counter()
    window.show()
    window.start_engine()
    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    def close_when_done() -> None:
        if not driver.is_alive():
            window.close()
            qt.quit()

    poll = QTimer(interval=100)
    poll.timeout.connect(close_when_done)
    poll.start()
    qt.exec()
    if outcome["error"] is not None:
        print(f"stopped: {outcome['error']}", file=sys.stderr)
        return 1
    info = outcome["info"]
    print(f"app loaded and ran in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    setup = (f"{platform.machine()} with {os.cpu_count()} CPU cores, --app (the desktop app, offscreen), --device "
             f"{args.device}, TTS {info.tts_model.name} on {info.device}, Whisper {info.stt_model.name}, LLM "
             f"{info.llm_model.name}, silence window {args.silence_ms} ms, live transcript on")
    return report(args, recorder.summary(), recorder.turns, outcome["failed"], outcome["early"], setup)


def wait_for(events: queue.SimpleQueue, kind, timeout_s: float):
    """The next event of `kind` (a class or a union of them) within timeout_s; TimeoutError otherwise."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            event = events.get(timeout=max(deadline - time.monotonic(), 0.001))
        except queue.Empty:
            raise TimeoutError(f"no {kind} within {timeout_s:.0f} s") from None
        if isinstance(event, kind):
            return event


if __name__ == "__main__":
    sys.exit(main())
