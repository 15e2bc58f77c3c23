"""The engine worker in its own thread with the real engine (the tiny TTS checkpoint, SmolLM2, the PulseAudio null
sink): the window's requests run on the Assistant (tests/test_assistant.py tests its behaviour), and its events come
back through the one signal, in order, into the GUI thread."""

from dataclasses import replace

import pytest
from PySide6.QtCore import QObject, QThread, Signal

from app.worker import EngineWorker
from engine.events import HistoryErased, Loading, LoadFailed, Ready, ReplyText, TurnFinished
from engine.settings import AssistantConfig

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the README's install builds it)")

WAIT_MS = 240_000  # generous: the machine's two cores are shared with other work


class Window(QObject):
    """The window's side: requests queued into the worker's thread, and what the one signal brought, in the GUI
    thread (a receiver object, as the window is, makes Qt queue the worker's emissions into it)."""

    load = Signal(object)
    speak = Signal(str)
    forget = Signal(object)
    shutdown = Signal()

    def __init__(self, worker: EngineWorker):
        super().__init__()
        self.events, self.threads, self.closed = [], set(), False
        self.load.connect(worker.load)
        self.speak.connect(worker.speak)
        self.forget.connect(worker.delete_history)
        self.shutdown.connect(worker.shutdown)
        worker.event.connect(self.got)
        worker.closed.connect(self.done)

    def got(self, event) -> None:
        self.events.append(event)
        self.threads.add(QThread.currentThread())

    def done(self) -> None:
        self.closed = True

    def of(self, kind) -> list:
        return [e for e in self.events if isinstance(e, kind)]


@pytest.fixture
def worker_and_window(qtbot):
    thread = QThread()
    worker = EngineWorker()
    worker.moveToThread(thread)
    window = Window(worker)
    thread.start()
    yield worker, window
    window.shutdown.emit()
    qtbot.waitUntil(lambda: window.closed, timeout=WAIT_MS)
    thread.quit()
    thread.wait()


@pytest.fixture
def config(short_checkpoint, smollm2_path, tmp_path):
    from engine.llm.chat import ChatOptions

    # no Whisper (a missing folder): typed turns only, which is all this needs, and a quicker load
    return AssistantConfig(
        tts_model=str(short_checkpoint), stt_model=str(tmp_path / "none"), llm_model=str(smollm2_path),
        speaker="ryan", listen_mode="push-to-talk", device="cpu", history_file=tmp_path / "h.sqlite3",
        chat_options=ChatOptions(n_ctx=512, max_tokens=32, n_threads=1, temperature=0.0), tts_seed=1,
    )


def test_requests_run_on_the_assistant_and_its_events_reach_the_gui_thread_in_order(worker_and_window, config,
                                                                                     qtbot, qapp):
    """load() then speak(): Loading steps, Ready, the reply and the finished turn arrive through the one signal, in
    the order the engine emitted them, each in the GUI thread."""
    worker, window = worker_and_window
    window.load.emit(config)
    qtbot.waitUntil(lambda: bool(window.of(Ready) or window.of(LoadFailed)), timeout=WAIT_MS)
    assert not window.of(LoadFailed), window.of(LoadFailed)
    window.speak.emit("Hello there.")
    qtbot.waitUntil(lambda: bool(window.of(TurnFinished)), timeout=WAIT_MS)
    kinds = [type(e) for e in window.events if type(e) in (Loading, Ready, ReplyText, TurnFinished)]
    assert kinds.index(Ready) > max(i for i, k in enumerate(kinds) if k is Loading)
    assert kinds[-2:] == [ReplyText, TurnFinished] and window.of(TurnFinished)[0].result.reply_text == "Hello there."
    assert window.threads == {qapp.thread()}


def test_a_failed_load_is_told_and_nothing_runs(worker_and_window, config, qtbot, tmp_path):
    """A missing speech model: LoadFailed at its step through the signal; erasing the history then goes through the
    worker without an assistant (HistoryErased)."""
    worker, window = worker_and_window
    window.load.emit(replace(config, tts_model=str(tmp_path / "no-such-model")))
    qtbot.waitUntil(lambda: bool(window.of(LoadFailed)), timeout=WAIT_MS)
    (failed,) = window.of(LoadFailed)
    assert failed.step == "speech model" and "no-such-model" in str(failed.error) and not window.of(Ready)
    window.forget.emit(config.history_file)
    qtbot.waitUntil(lambda: bool(window.of(HistoryErased)), timeout=WAIT_MS)
    assert window.of(HistoryErased)[0].error is None
