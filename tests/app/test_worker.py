"""The engine worker in its own thread with the real engine: the tiny TTS checkpoint, SmolLM2, Whisper
base and the PulseAudio null sink; loading with progress, turns relayed as signals, failures as Problems."""

from dataclasses import replace

import pytest
from PySide6.QtCore import QThread

from app.settings import EngineConfig
from app.worker import STEPS, EngineWorker

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (see DESIGN.md section 6)")

LOAD_S = 240  # generous: the machine's two cores are shared with other work
TURN_S = 120


@pytest.fixture(scope="module")
def base_config(short_checkpoint, smollm2_path, whisper_dir, tmp_path_factory):
    from engine.llm.chat import ChatOptions

    # push-to-talk: hands-free would hear Parley's own voice through the null sink's monitor
    return EngineConfig(
        tts_model=str(short_checkpoint), stt_model=str(whisper_dir), llm_model=str(smollm2_path), speaker="ryan",
        listen_mode="push-to-talk", device="cpu", history_file=tmp_path_factory.mktemp("history") / "h.sqlite3",
        chat_options=ChatOptions(n_ctx=512, max_tokens=32, n_threads=1, temperature=0.0), tts_seed=1,
    )


class Harness:
    """An EngineWorker in a started QThread, driven as the window drives it: through queued signals."""

    def __init__(self, qtbot):
        from PySide6.QtCore import QObject, Signal

        class Requests(QObject):
            load = Signal(object)
            apply = Signal(object)
            send = Signal(str)
            speak = Signal(str)
            shutdown = Signal()

        self.qtbot = qtbot
        self.thread = QThread()
        self.worker = EngineWorker()
        self.worker.moveToThread(self.thread)
        self.requests = Requests()
        self.requests.load.connect(self.worker.load)
        self.requests.apply.connect(self.worker.apply)
        self.requests.send.connect(self.worker.send)
        self.requests.speak.connect(self.worker.speak)
        self.requests.shutdown.connect(self.worker.shutdown)
        self.progress = []
        self.worker.progress.connect(lambda step, done, total: self.progress.append((step, done, total)))
        self.thread.start()

    def emitted(self, signal, request, *args, unless: list = ()) -> tuple:
        """Emit `request(*args)`; the arguments of `signal`'s next emission, waited for by polling;
        fails at once with what `unless` holds when something is appended to it first."""
        got = []
        signal.connect(lambda *a: got.append(a))
        request.emit(*args)
        self.qtbot.waitUntil(lambda: bool(got or unless), timeout=LOAD_S * 1000)
        assert not unless, unless
        return got[0]

    def close(self):
        self.emitted(self.worker.closed, self.requests.shutdown)
        self.thread.quit()
        self.thread.wait()


@pytest.fixture
def harness(qtbot):
    harness = Harness(qtbot)
    yield harness
    harness.close()


def test_a_missing_speech_model_fails_with_the_way_to_the_models_page(harness, base_config, tmp_path):
    """No TTS checkpoint: loading stops at the speech model with a Problem that leads to the Models page."""
    config = replace(base_config, tts_model=str(tmp_path / "no-such-model"))
    (problem,) = harness.emitted(harness.worker.failed, harness.requests.load, config)
    assert problem.action == "models" and "speech model" in problem.headline
    assert "no-such-model" in problem.detail
    steps = [step for step, _, _ in harness.progress]
    assert steps[:3] == list(STEPS[:3]) and "speakers" not in steps
    assert all(total == len(STEPS) for _, _, total in harness.progress)


def test_a_file_that_is_no_gguf_model_fails_readably(harness, base_config, tmp_path):
    """A broken LLM path: a readable Problem naming the file, pointing to the Models page."""
    bad = tmp_path / "chat.gguf"
    bad.write_bytes(b"not a model")
    (problem,) = harness.emitted(harness.worker.failed, harness.requests.load, replace(base_config, llm_model=str(bad)))
    assert problem.action == "models" and "language model" in problem.headline and str(bad) in problem.detail


def test_a_voice_design_model_speaks_in_a_default_voice_until_one_is_described(harness, base_config, short_checkpoint,
                                                                               tmp_path):
    """A VoiceDesign checkpoint, loaded with a speaker stored for another model and no description: it
    loads without complaint, takes no speaker, and speaks in DEFAULT_VOICE_DESCRIPTION's voice; a
    description set in the settings is then the one used."""
    from app.settings import DEFAULT_VOICE_DESCRIPTION
    from tests.conftest import voice_design_copy

    design = voice_design_copy(short_checkpoint, tmp_path / "design")
    notices, failed = [], []
    harness.worker.notice.connect(notices.append)
    harness.worker.failed.connect(failed.append)
    config = replace(base_config, tts_model=str(design), speaker="ryan", style="")
    (info,) = harness.emitted(harness.worker.ready, harness.requests.load, config, unless=failed)
    assert (info.style_kind, info.speakers, info.speaker) == ("description", (), None)
    assert info.style == DEFAULT_VOICE_DESCRIPTION and notices == []
    (result,) = harness.emitted(harness.worker.turn_finished, harness.requests.speak, "Hello there.")
    assert result.reply_text == "Hello there." and result.metrics.tts_ttfc_ms > 0

    described = replace(config, style="A deep, slow, gravelly voice.")
    (info,) = harness.emitted(harness.worker.ready, harness.requests.apply, described)
    assert info.style == "A deep, slow, gravelly voice." and notices == []
    (result,) = harness.emitted(harness.worker.turn_finished, harness.requests.speak, "Hello again.")
    assert result.reply_text == "Hello again."


def test_a_speaker_the_new_model_lacks_is_a_notice_and_its_first_voice_speaks(harness, base_config):
    """A stored speaker the CustomVoice model has no voice for (settings from another model): the
    engine still loads, speaks as the model's first voice, and a notice names the voices to pick from."""
    notices = []
    harness.worker.notice.connect(notices.append)
    (info,) = harness.emitted(harness.worker.ready, harness.requests.load, replace(base_config, speaker="Nobody"))
    assert info.speaker == info.speakers[0] and info.speaker != "nobody"
    (problem,) = notices
    assert "'Nobody'" in problem.detail and info.speakers[0] in problem.detail and problem.action == "settings"
    (result,) = harness.emitted(harness.worker.turn_finished, harness.requests.speak, "Hello there.")
    assert result.reply_text == "Hello there."


def test_a_history_file_held_by_another_program_at_start_is_a_notice_and_its_turns_wait_for_it(harness, base_config,
                                                                                             tmp_path):
    """Another program holds the history file while the engine loads: it loads anyway, with a notice that the
    history cannot be saved (naming the file and the lock), not a failed load; a turn said meanwhile waits
    in memory, through a settings change that makes a new Dialogue, and is saved with the next turn once the
    file is free."""
    from engine.history import HistoryStore
    from tests.test_history_faults import locked

    path = tmp_path / "h.sqlite3"
    HistoryStore(path).close()
    notices, failed = [], []
    harness.worker.notice.connect(notices.append)
    harness.worker.failed.connect(failed.append)
    config = replace(base_config, history_file=path)
    with locked(path):
        harness.emitted(harness.worker.ready, harness.requests.load, config, unless=failed)
        harness.emitted(harness.worker.turn_finished, harness.requests.speak, "Said while it was held.")
        harness.emitted(harness.worker.ready, harness.requests.apply, replace(config, tts_seed=config.tts_seed + 1))
    (problem, *later) = notices  # the load's notice, then one a turn while it is held
    assert problem.headline == "The conversation history cannot be saved" and problem.action is None
    assert str(path) in problem.detail and "locked" in problem.detail
    harness.emitted(harness.worker.turn_finished, harness.requests.speak, "Said once it was free.")
    with HistoryStore(path) as store:
        (conversation,) = store.list_conversations()
        assert [t.text for t in store.open_conversation(conversation.id).turns] == [
            "Said while it was held.", "Said once it was free."]
