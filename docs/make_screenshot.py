"""Makes docs/screenshot.png: Parley's real main window on a virtual X screen (Xvfb), in the middle of
a typed conversation with the real engine, the latency meter filled from the turns before.

--replay (how docs/screenshot.png was made) runs no engine: it feeds the real window the signals a
three-turn typed conversation produces, with illustrative figures through a real MetricsRecorder.
Without it, everything is real except the voice: a generated tiny Qwen3-TTS checkpoint (random weights, so it
speaks noise, through the real engine), the bundled SmolLM2 answering, speech played into a private
PulseAudio null sink. The window is grabbed from the X server while the last reply is being spoken.

    .venv/bin/python docs/make_screenshot.py [--out docs/screenshot.png] [--theme light|dark]

Needs Debian's xvfb, Qt's xcb libraries and PulseAudio (as .ci/run installs):
    apt-get install --no-install-recommends xvfb libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1 pulseaudio
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPTS = (
    "Hi! Who are you?",
    "What can you do for me?",
    "Give me one tip for a calm morning.",
)
SCREEN = "1280x820x24"
WINDOW_SIZE = (1180, 760)
LOAD_S, TURN_S = 600, 600  # two cores shared with other work: generous
FRAMES_PER_CLAUSE = 8  # the random checkpoint never says EOS: cap each clause at 0.64 s of "speech"
MAX_REPLY_TOKENS = 40


def start_xvfb() -> tuple[subprocess.Popen, str]:
    """Xvfb on the first free display (it writes the number it took to the pipe); returns (process, ':N')."""
    if shutil.which("Xvfb") is None:
        raise SystemExit("Xvfb is missing: apt-get install --no-install-recommends xvfb libxcb-cursor0 "
                         "libxcb-icccm4 libxcb-keysyms1")
    read, write = os.pipe()
    xvfb = subprocess.Popen(["Xvfb", "-displayfd", str(write), "-screen", "0", SCREEN, "-nolisten", "tcp"],
                            pass_fds=(write,), stderr=subprocess.DEVNULL)
    os.close(write)
    with os.fdopen(read) as pipe:
        number = pipe.readline().strip()
    if not number:
        raise SystemExit(f"Xvfb did not start (exit code {xvfb.poll()})")
    return xvfb, f":{number}"


def make_checkpoint(folder: Path) -> Path:
    from engine.tts.testing import write_checkpoint

    path = write_checkpoint(folder / "tiny", "tiny", seed=0)
    generation = path / "generation_config.json"
    generation.write_text(json.dumps({**json.loads(generation.read_text()), "max_new_tokens": FRAMES_PER_CLAUSE}))
    return path


def wait_for(spy, count: int, timeout_s: float, what: str, failures=()) -> None:
    """Run the event loop until the QSignalSpy has seen `count` emissions, then deliver what the same
    emissions queued for the window (a spy counts in the emitting thread, before the window's slots
    run); a Problem on one of the `failures` spies ends the script."""
    import time

    from PySide6.QtWidgets import QApplication

    end = time.monotonic() + timeout_s
    while spy.count() < count:
        for failed in failures:
            if failed.count():
                problem = failed.at(0)[0]
                raise SystemExit(f"{problem.headline} while waiting for {what}: {problem.detail}")
        left_ms = int((end - time.monotonic()) * 1000)
        if left_ms <= 0:
            raise SystemExit(f"timed out after {timeout_s:.0f} s waiting for {what}")
        spy.wait(min(left_ms, 500))
    QApplication.processEvents()


def run(out: Path, theme: str, work: Path) -> None:
    from PySide6.QtCore import QSettings
    from PySide6.QtTest import QSignalSpy
    from PySide6.QtWidgets import QApplication

    from app.main_window import MainWindow
    from app.settings import Settings
    from app.style import apply_style
    from engine.llm.chat import ChatOptions

    app = QApplication([sys.argv[0]])
    app.setApplicationDisplayName("Parley")
    apply_style(app, theme)
    settings = Settings(QSettings(str(work / "parley.ini"), QSettings.Format.IniFormat))
    settings.tts_model = str(make_checkpoint(work))
    settings.listen_mode = "push-to-talk"  # hands-free would hear Parley's own voice on the sink's monitor
    settings.device = "cpu"
    settings.theme = theme
    # short greedy replies on one LLM thread: a shared 2-core machine collapses with more threads
    chat = ChatOptions(n_ctx=1024, max_tokens=MAX_REPLY_TOKENS, n_threads=1, temperature=0.0)
    window = MainWindow(settings, history_file=work / "history.sqlite3", chat_options=chat)
    worker = window.worker
    ready, figures, clauses, finished = (QSignalSpy(worker.ready), QSignalSpy(worker.metrics),
                                         QSignalSpy(worker.speaking_clause), QSignalSpy(worker.turn_finished))
    failures = (QSignalSpy(worker.failed), QSignalSpy(worker.turn_failed))
    window.resize(*WINDOW_SIZE)
    window.show()
    try:
        try:
            converse(window, (ready, figures, clauses, finished), failures)
        except SystemExit:
            grab(window, out.with_suffix(".failed.png"))  # what the window showed when it went wrong
            raise
        grab(window, out)
        wait_for(finished, len(PROMPTS), TURN_S, "the last turn to end", failures)
    finally:
        window.close()  # stops the worker and its thread, also after a failure


# --replay: what the worker relays during three typed turns, fed to the real window's slots in the
# same order. The figures are illustrative (of the order seen on a GPU lease), not a measurement.
REPLAY = (
    ("Hi! Who are you?", ("Hello!", "I'm Parley, a voice assistant that runs entirely on this computer."),
     dict(llm_ttft_ms=41.0, llm_first_clause_ms=66.0, tts_ttfc_ms=36.0, tts_rtf=0.11, voice_to_voice_ms=212.0)),
    ("What can you do for me?", ("I can answer questions, keep notes of our talks,",
                                 "and read any text aloud in several voices."),
     dict(llm_ttft_ms=38.0, llm_first_clause_ms=71.0, tts_ttfc_ms=35.0, tts_rtf=0.10, voice_to_voice_ms=198.0)),
    ("Give me one tip for a calm morning.", ("Start slowly:", "drink a glass of water before you look at your phone."),
     None),
)


def replay(out: Path, theme: str, work: Path) -> None:
    """The window with no engine: the worker's signals replayed into its slots, the meter fed by a real
    MetricsRecorder; grabbed while the last reply's second clause is highlighted."""
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    from app.main_window import MainWindow
    from app.settings import Settings
    from app.style import apply_style
    from engine.metrics import MetricsRecorder, TurnMetrics

    app = QApplication([sys.argv[0]])
    app.setApplicationDisplayName("Parley")
    apply_style(app, theme)
    window = MainWindow(Settings(QSettings(str(work / "parley.ini"), QSettings.Format.IniFormat)),
                        history_file=work / "history.sqlite3")
    window.resize(*WINDOW_SIZE)
    window.show()
    recorder = MetricsRecorder()
    for turn, (prompt, clauses, figures) in enumerate(REPLAY):
        window.chat.add_user(prompt)
        reply = ""
        for index, clause in enumerate(clauses):
            reply = f"{reply} {clause}".strip()
            window.chat.reply_text(reply)
            window.chat.speaking_clause(clause, index)
            app.processEvents()
        if figures is None:  # the last turn stays mid-speech
            window.state_label.setText("Speaking")
            break
        window.chat.finish_reply(reply)
        metrics = TurnMetrics(turn=turn, **figures)
        recorder.record(metrics)
        window.meter.show_turn(metrics, recorder.summary())
        window.meter.set_level(-24.0)
    grab(window, out)
    window.close()


def grab(window, path: Path) -> None:
    from PySide6.QtWidgets import QApplication

    QApplication.processEvents()
    image = window.screen().grabWindow(window.winId())  # the X server's pixels, not a widget render
    if image.isNull() or not image.save(str(path)):
        raise SystemExit(f"could not grab the window into {path}")
    print(f"wrote {path} ({image.width()}x{image.height()})")


def converse(window, spies, failures) -> None:
    """Load, then type PROMPTS one turn at a time; return while the last reply is being spoken."""
    ready, figures, clauses, finished = spies
    window.start_engine()
    wait_for(ready, 1, LOAD_S, "the engine to load", failures)
    for n, prompt in enumerate(PROMPTS):
        spoken = clauses.count()
        window.message.setPlainText(prompt)
        window.send_button.click()  # as the user does: the real window sends it to the worker
        if n < len(PROMPTS) - 1:
            wait_for(figures, n + 1, TURN_S, f"turn {n + 1}'s figures", failures)
            wait_for(finished, n + 1, TURN_S, f"turn {n + 1} to end", failures)
    # the last reply mid-speech: its spoken clause highlighted, the meter showing the turns before
    wait_for(clauses, spoken + 2, TURN_S, "the last reply's second clause", failures)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshot.png")
    parser.add_argument("--theme", choices=("light", "dark"), default="light")
    parser.add_argument("--verbose", action="store_true", help="log the engine's progress to stderr")
    parser.add_argument("--replay", action="store_true",
                        help="replay a scripted conversation's events into the window instead of running the engine")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s: %(message)s")

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
            (replay if args.replay else run)(args.out, args.theme, work)
        finally:
            pulse.kill()
            xvfb.terminate()
            xvfb.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
