"""Makes docs/screenshot.png: Parley's real main window on a virtual X screen (Xvfb), in the middle of
a real conversation with the real engine, the latency meter showing what the engine measured in this run.

Everything runs as in the app: the window, its worker, Whisper base (the bundled package), SmolLM2
(the bundled GGUF) and a generated tiny Qwen3-TTS checkpoint (random weights, so it speaks noise,
through the real engine), on a private PulseAudio server. The first turn is spoken: espeak-ng's voice
is played into a null sink that is the microphone while the talk button is held; the next are typed
into the text box and sent. The window is grabbed from the X server while the last reply is spoken.

    .venv/bin/python docs/make_screenshot.py [--out docs/screenshot.png] [--theme light|dark] [--size 1180x760]

Needs Debian's xvfb, espeak-ng, Qt's xcb libraries and PulseAudio (as .ci/run installs):
    apt-get install --no-install-recommends xvfb espeak-ng libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1 pulseaudio

Waiting is done with a QEventLoop and a timer, never QSignalSpy.wait or QTest.qWait: those two keep
Python's GIL while they wait, which starves the engine's Python threads (the TTS, the audio callback):
the first version of this script stuck on the first clause that way, with the CPU idle.
"""

from __future__ import annotations

import argparse
import ctypes.util
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SPOKEN = "Hello Parley, what can you do for me?"
TYPED = ("Give me one tip for a calm morning.", "And one for the evening?")
SCREEN = "1400x900x24"
LOAD_S, TURN_S = 600, 600  # two cores shared with other work: generous
FRAMES_PER_CLAUSE = 8  # the random checkpoint never says EOS: cap each clause at 0.64 s of "speech"
MAX_REPLY_TOKENS = 40
MIC_RATE_HZ = 16_000


def start_xvfb() -> tuple[subprocess.Popen, str]:
    """Xvfb on the first free display (it writes the number it took to the pipe); returns (process, ':N')."""
    # Qt aborts the process where its xcb platform cannot load, which would leave Xvfb and PulseAudio running
    missing = [lib for lib in ("xcb-cursor", "xcb-icccm", "xcb-keysyms") if ctypes.util.find_library(lib) is None]
    if shutil.which("Xvfb") is None:
        missing.insert(0, "Xvfb")
    if missing:
        raise SystemExit(f"missing: {', '.join(missing)}; install them with: "
                         "apt-get install --no-install-recommends xvfb libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1")
    read, write = os.pipe()
    xvfb = subprocess.Popen(["Xvfb", "-displayfd", str(write), "-screen", "0", SCREEN, "-nolisten", "tcp"],
                            pass_fds=(write,), stderr=subprocess.DEVNULL)
    os.close(write)
    with os.fdopen(read) as pipe:
        number = pipe.readline().strip()
    if not number:
        raise SystemExit(f"Xvfb did not start (exit code {xvfb.poll()})")
    return xvfb, f":{number}"


def wait_until(condition, timeout_s: float, what: str, window=None) -> None:
    """Run the Qt event loop until condition() holds; SystemExit after timeout_s, or at once when the
    window shows an error dialog.

    A QEventLoop releases the GIL while it sleeps (QSignalSpy.wait and QTest.qWait do not), so the
    engine's threads run at full speed meanwhile. tests/app/test_make_screenshot.py holds it to that.
    """
    from PySide6.QtCore import QEventLoop, QTimer

    end = time.monotonic() + timeout_s
    loop = QEventLoop()
    tick = QTimer(singleShot=True, interval=50)
    tick.timeout.connect(loop.quit)
    while not condition():
        dialog = getattr(window, "dialog", None)
        if dialog is not None and dialog.isVisible():
            raise SystemExit(f"the window shows an error while waiting for {what}: {dialog.problem.headline}: "
                             f"{dialog.problem.detail}")
        if time.monotonic() > end:
            raise SystemExit(f"timed out after {timeout_s:.0f} s waiting for {what}")
        tick.start()
        loop.exec()


def make_checkpoint(folder: Path) -> Path:
    from engine.tts.testing import write_checkpoint

    path = write_checkpoint(folder / "tiny", "tiny", seed=0)
    generation = path / "generation_config.json"
    generation.write_text(json.dumps({**json.loads(generation.read_text()), "max_new_tokens": FRAMES_PER_CLAUSE}))
    return path


def espeak(text: str, folder: Path):
    """(n,) float32 16 kHz speech of `text` by espeak-ng (en-us, 150 words a minute)."""
    import numpy as np
    import soundfile
    import soxr

    if shutil.which("espeak-ng") is None:
        raise SystemExit("espeak-ng is missing: apt-get install --no-install-recommends espeak-ng")
    wav = folder / "spoken.wav"
    subprocess.run(["espeak-ng", "-v", "en-us", "-s", "150", "-w", str(wav), text], check=True)
    audio, rate = soundfile.read(wav, dtype="float32")
    return soxr.resample(audio, rate, MIC_RATE_HZ).astype(np.float32)


class Microphone:
    """A null sink 'usermic' whose monitor is the default source: what say() plays, Parley hears. It hums faintly
    between lines, as a real microphone does (exact zeros would be reported as a microphone that hears nothing)."""

    def __init__(self, env: dict):
        from tests.conftest import hum

        self.env = env
        self._pactl("load-module", "module-null-sink", "sink_name=usermic", f"rate={MIC_RATE_HZ}", "channels=1")
        self._pactl("set-default-source", "usermic.monitor")
        hum(env, "usermic")

    def _pactl(self, *args) -> str:
        return subprocess.run(["pactl", *args], env=self.env, capture_output=True, text=True, check=True).stdout

    def say(self, audio) -> subprocess.Popen:
        player = subprocess.Popen(["pacat", "--playback", "--device=usermic", "--raw", "--format=float32le",
                                   f"--rate={MIC_RATE_HZ}", "--channels=1"], stdin=subprocess.PIPE, env=self.env)
        player.stdin.write(audio.tobytes())
        player.stdin.close()
        return player


def converse(window, mic: Microphone, speech) -> None:
    """Load; one spoken turn (push-to-talk), then the typed ones; return while the last reply is spoken."""
    window.start_engine()
    wait_until(lambda: window.info is not None, LOAD_S, "the engine to load", window)
    if window.info.microphone is None:
        raise SystemExit("the engine opened no microphone")

    window.talk_button.pressed.emit()  # as holding the talk button does
    wait_until(lambda: window.state == "listening", TURN_S, "the microphone to listen", window)
    talking = mic.say(speech)
    wait_until(lambda: talking.poll() is not None, TURN_S, "the spoken question to be played", window)
    window.talk_button.released.emit()
    wait_until(lambda: "turn 1" in window.meter.turns.text() and window.state == "idle", TURN_S,
               "the spoken turn's figures", window)

    for n, prompt in enumerate(TYPED, start=2):
        window.message.setPlainText(prompt)
        window.send_button.click()  # as the user does: the real window sends it to the worker
        if n < len(TYPED) + 1:
            wait_until(lambda: f"turn {n}" in window.meter.turns.text() and window.state == "idle", TURN_S,
                       f"turn {n}'s figures", window)
    # the last reply mid-speech, its spoken clause highlighted, the meter showing the turns before
    wait_until(lambda: window.state == "speaking" and len(window.chat.bubbles) == 2 * (len(TYPED) + 1),
               TURN_S, "the last reply to be spoken", window)


def grab(window, path: Path) -> None:
    from PySide6.QtWidgets import QApplication

    QApplication.processEvents()
    image = window.screen().grabWindow(window.winId())  # the X server's pixels, not a widget render
    if image.isNull() or not image.save(str(path)):
        raise SystemExit(f"could not grab the window into {path}")
    print(f"wrote {path} ({image.width()}x{image.height()})")


def run(out: Path, theme: str, size: tuple[int, int], work: Path, env: dict) -> None:
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    from app.main_window import MainWindow
    from app.settings import Settings
    from app.style import apply_style
    from engine.llm.chat import ChatOptions

    app = QApplication([sys.argv[0]])
    app.setApplicationDisplayName("Parley")
    apply_style(app, theme)
    mic = Microphone(env)
    speech = espeak(SPOKEN, work)
    settings = Settings(QSettings(str(work / "parley.ini"), QSettings.Format.IniFormat))
    settings.tts_model = str(make_checkpoint(work))
    settings.listen_mode = "push-to-talk"
    settings.device, settings.theme, settings.speaker = "cpu", theme, "ryan"
    # short greedy replies on one LLM thread: a shared 2-core machine collapses with more threads
    chat = ChatOptions(n_ctx=1024, max_tokens=MAX_REPLY_TOKENS, n_threads=1, temperature=0.0)
    window = MainWindow(settings, history_file=work / "history.sqlite3", chat_options=chat)
    window.resize(*size)
    window.show()
    try:
        try:
            converse(window, mic, speech)
        except SystemExit:
            grab(window, out.with_suffix(".failed.png"))  # what the window showed when it went wrong
            raise
        grab(window, out)
        wait_until(lambda: window.state == "idle", TURN_S, "the last turn to end", window)
    finally:
        window.close()  # stops the worker and its thread, also after a failure


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshot.png")
    parser.add_argument("--theme", choices=("light", "dark"), default="light")
    parser.add_argument("--size", default="1180x760", help="the window's size, WIDTHxHEIGHT")
    parser.add_argument("--verbose", action="store_true", help="log the engine's progress to stderr")
    args = parser.parse_args(argv)
    size = tuple(int(n) for n in args.size.lower().split("x"))
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s: %(message)s")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # a kill still stops Xvfb and PulseAudio below

    from tests.conftest import PulseServer  # the tests' private PulseAudio null sink, reused

    with tempfile.TemporaryDirectory(prefix="parley-shot-") as folder:
        work = Path(folder)
        (work / "pulse").mkdir(mode=0o700)
        pulse = PulseServer(work / "pulse")
        xvfb, display = start_xvfb()
        try:
            pulse.start()
            # before Qt and PortAudio start: the X display and the private sound server; one torch
            # thread, since two cores shared with llama.cpp (and whatever else runs) only contend
            os.environ.update({"DISPLAY": display, "QT_QPA_PLATFORM": "xcb", "OMP_NUM_THREADS": "1",
                               **{k: pulse.env[k] for k in ("XDG_RUNTIME_DIR", "PULSE_RUNTIME_PATH")}})
            os.environ.pop("PULSE_SERVER", None)
            run(args.out, args.theme, size, work, pulse.env)
        finally:
            pulse.kill()
            xvfb.terminate()
            xvfb.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
