"""The engine worker loaded once with the real engine (tiny TTS checkpoint, SmolLM2, Whisper base, the
PulseAudio null sink): typed and speak-only turns relayed as signals, stop, live settings, reopening."""

from dataclasses import replace

import pytest
from PySide6.QtCore import QObject, QThread, Signal
from pytestqt.qtbot import QtBot

from app.worker import STEPS, EngineWorker
from tests.app.test_worker import LOAD_S, TURN_S, base_config  # noqa: F401  (a fixture)
from tests.audio.test_device_faults import plugs  # noqa: F401  (a fixture)

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (see DESIGN.md section 6)")

PROMPT = "Name three colors."


class Requests(QObject):
    """The window's side of the signals: requests queued into the worker's thread."""

    load = Signal(object)
    apply = Signal(object)
    send = Signal(str)
    speak = Signal(str)
    stop = Signal()
    open = Signal(int)
    new = Signal()
    press = Signal()
    release = Signal()
    mute = Signal(bool)
    forget = Signal(object)
    shutdown = Signal()


def collect(signal) -> list:
    """Everything `signal` carries from now on, one tuple of arguments per emission."""
    got = []
    signal.connect(lambda *args: got.append(args))
    return got


@pytest.fixture(scope="module")
def engine(qapp, base_config, request):
    """(worker, requests, progress, ready info): loaded once for the module, shut down at its end."""
    thread = QThread()
    worker = EngineWorker()
    worker.moveToThread(thread)
    requests = Requests()
    for name, slot in (("load", worker.load), ("apply", worker.apply), ("send", worker.send), ("speak", worker.speak),
                       ("stop", worker.stop), ("open", worker.open_conversation), ("new", worker.new_conversation),
                       ("press", worker.press), ("release", worker.release), ("mute", worker.set_muted),
                       ("forget", worker.delete_history), ("shutdown", worker.shutdown)):
        getattr(requests, name).connect(slot)
    progress, ready, failed = collect(worker.progress), collect(worker.ready), collect(worker.failed)
    bot = QtBot(request)  # pytest-qt's qtbot is per test; this one waits for the module's load
    thread.start()
    requests.load.emit(base_config)
    bot.waitUntil(lambda: bool(ready or failed), timeout=LOAD_S * 1000)
    assert not failed, failed[0][0]
    yield worker, requests, progress, ready[0][0]
    closed = collect(worker.closed)
    requests.shutdown.emit()
    bot.waitUntil(lambda: bool(closed), timeout=TURN_S * 1000)
    thread.quit()
    thread.wait()


def test_loading_reports_each_step_and_the_models_voices(engine, short_checkpoint):
    """Progress runs through every step to done == total; ready() carries the checkpoint's own voices."""
    import json

    worker, requests, progress, info = engine
    assert [step for step, _, _ in progress][:len(STEPS)] == list(STEPS)
    assert progress[-1][1] == progress[-1][2] == len(STEPS)
    talker = json.loads((short_checkpoint / "config.json").read_text())["talker_config"]
    assert set(info.speakers) == set(talker["spk_id"]) and info.speaker == "ryan"
    assert info.device == "cpu" and info.microphone is not None and info.stt_model is not None


def test_a_typed_turn_is_relayed_as_reply_clause_turn_and_metric_signals(engine, qtbot):
    """send(): the reply grows, its clauses start playing, the turn ends, and its figures come with p50/p95."""
    worker, requests, _, _ = engine
    replies, clauses = collect(worker.reply_text), collect(worker.speaking_clause)
    finished, figures = collect(worker.turn_finished), collect(worker.metrics)
    requests.send.emit(PROMPT)
    qtbot.waitUntil(lambda: bool(finished and figures), timeout=TURN_S * 1000)
    [(result,)], [(metrics, summary)] = finished, figures
    assert result.user_text == PROMPT and result.reply_text.strip() and not result.interrupted
    assert replies and replies[-1] == (result.reply_text,)
    assert all(len(a[0]) <= len(b[0]) for a, b in zip(replies, replies[1:]))  # it only grows
    assert clauses and [index for _, index in clauses] == list(range(len(clauses)))
    assert metrics == result.metrics and metrics.tts_ttfc_ms > 0
    assert summary["tts_ttfc_ms"].count >= 1


def test_speak_only_says_the_text_without_the_llm(engine, qtbot):
    """speak(): the text is spoken as written and shown as the reply; nothing is asked of the LLM."""
    worker, requests, _, _ = engine
    replies = collect(worker.reply_text)
    (result,) = emitted(qtbot, worker.turn_finished, requests.speak, "Hello there.")
    assert result.reply_text == "Hello there." and result.user_text == "" and replies == [("Hello there.",)]
    assert result.metrics.llm_ttft_ms is None and result.metrics.tts_ttfc_ms > 0


def test_stop_interrupts_the_reply_at_once(engine, qtbot):
    """stop() as the first clause plays: the turn ends interrupted and barge_in() is signalled."""
    worker, requests, _, _ = engine
    finished, barged = collect(worker.turn_finished), collect(worker.barge_in)
    worker.speaking_clause.connect(lambda text, index: requests.stop.emit() if index == 0 else None)
    try:
        requests.send.emit("Tell me about the sea in three sentences.")
        qtbot.waitUntil(lambda: bool(finished), timeout=TURN_S * 1000)
    finally:
        worker.speaking_clause.disconnect()
    assert finished[0][0].interrupted and barged


def emitted(qtbot, signal, request, *args) -> tuple:
    """Emit `request(*args)` and return the arguments of `signal`'s next emission (waited for by polling,
    so the wait never hands a timer to the engine's threads)."""
    got = collect(signal)
    request.emit(*args)
    qtbot.waitUntil(lambda: bool(got), timeout=TURN_S * 1000)
    return got[0]


def test_a_new_voice_applies_without_reloading_the_models(engine, qtbot, base_config):
    """apply() with another speaker: ready() again with that voice, and no loading step runs."""
    worker, requests, progress, _ = engine
    before = len(progress)
    (info,) = emitted(qtbot, worker.ready, requests.apply,
                      replace(base_config, speaker="aiden", system_prompt="Answer in one word."))
    assert info.speaker == "aiden" and len(progress) == before
    (problem,) = emitted(qtbot, worker.notice, requests.apply, replace(base_config, speaker="rian"))
    assert "rian" in problem.detail and "ryan" in problem.detail  # the valid voices are named
    (info,) = emitted(qtbot, worker.ready, requests.apply, base_config)
    assert info.speaker == "ryan"


def test_echo_cancellation_applies_by_restarting_the_loop_without_reloading(engine, qtbot, base_config, monkeypatch):
    """apply() with echo cancellation off, then on: each time a new VoiceLoop is built with that option (the
    canceller is made when a loop starts), and no loading step runs."""
    from engine.voice import VoiceLoop

    worker, requests, progress, _ = engine
    built = []
    init = VoiceLoop.__init__

    def recorded(self, dialogue, microphone=None, options=None, **kwargs):
        built.append(options)
        init(self, dialogue, microphone, options, **kwargs)

    monkeypatch.setattr(VoiceLoop, "__init__", recorded)
    before = len(progress)
    for on in (False, True):
        emitted(qtbot, worker.ready, requests.apply, replace(base_config, echo_cancellation=on))
        assert built and built[-1].echo_cancellation is on
    assert len(built) == 2 and len(progress) == before


def test_reopening_a_conversation_continues_it(engine, qtbot, base_config):
    """open_conversation(): the next turn is saved to that conversation; new_conversation() starts another."""
    from engine.history import HistoryStore, Turn

    worker, requests, _, _ = engine
    with HistoryStore(base_config.history_file) as store:
        cid = store.new_conversation("Earlier")
        store.add_turn(cid, Turn("user", "My name is Ada."))
        store.add_turn(cid, Turn("assistant", "Hello Ada."))
    (info,) = emitted(qtbot, worker.ready, requests.open, cid)
    assert info.conversation_id == cid
    (result,) = emitted(qtbot, worker.turn_finished, requests.send, PROMPT)
    with HistoryStore(base_config.history_file) as store:
        turns = store.open_conversation(cid).turns
    assert [t.text for t in turns] == ["My name is Ada.", "Hello Ada.", PROMPT, result.reply_text]
    (info,) = emitted(qtbot, worker.ready, requests.new)
    assert info.conversation_id is None


def test_push_to_talk_and_mute_show_in_the_loops_state(engine, qtbot):
    """press() starts listening on the real microphone, release() with nothing said goes back to idle;
    mute shows as "muted" and unmuting returns to idle (push-to-talk with the key up)."""
    worker, requests, _, _ = engine
    states, failed = collect(worker.state_changed), collect(worker.turn_failed)
    levels = collect(worker.level)
    assert emitted(qtbot, worker.state_changed, requests.press) == ("listening",)
    qtbot.waitUntil(lambda: bool(levels), timeout=TURN_S * 1000)  # the microphone is read meanwhile
    assert emitted(qtbot, worker.state_changed, requests.release) == ("idle",)
    assert emitted(qtbot, worker.state_changed, requests.mute, True) == ("muted",)
    assert emitted(qtbot, worker.state_changed, requests.mute, False) == ("idle",)
    assert [s for (s,) in states] == ["listening", "idle", "muted", "idle"] and not failed


def test_asking_for_the_gpu_on_a_machine_without_one_runs_on_the_cpu_with_a_notice(engine, qtbot, base_config):
    """device "cuda" with no CUDA device: a notice that says so and leads to Settings, then ready() on the CPU."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    worker, requests, _, _ = engine
    notices, ready = collect(worker.notice), collect(worker.ready)
    requests.apply.emit(replace(base_config, device="cuda"))  # another device: the models reload
    qtbot.waitUntil(lambda: bool(ready), timeout=LOAD_S * 1000)
    (problem,) = [p for (p,) in notices if "GPU" in p.headline]
    assert problem.action == "settings" and "CPU" in problem.headline
    assert ready[0][0].device == "cpu"


def test_deleting_all_history_erases_the_file_in_place_and_the_next_turn_is_saved_afresh(engine, qtbot, base_config):
    """delete_history(): the worker's own store erases every conversation (not a byte of what was said is
    left in the file, its -wal or -shm), the LLM forgets, and the next turn is the one conversation left."""
    from engine.history import HistoryStore
    from tests.test_history import bytes_on_disk

    worker, requests, _, _ = engine
    path = base_config.history_file
    secret = "The vault code is seven seven four."
    emitted(qtbot, worker.turn_finished, requests.speak, secret)
    assert secret.encode() in bytes_on_disk(path)
    ready = collect(worker.ready)
    assert emitted(qtbot, worker.history_deleted, requests.forget, path) == (None,)
    qtbot.waitUntil(lambda: bool(ready), timeout=TURN_S * 1000)
    assert ready[-1][0].conversation_id is None and secret.encode() not in bytes_on_disk(path)
    emitted(qtbot, worker.turn_finished, requests.speak, "Hello again.")
    with HistoryStore(path) as store:
        (conversation,) = store.list_conversations()
        assert [t.text for t in store.open_conversation(conversation.id).turns] == ["Hello again."]


def test_deleting_all_history_while_another_program_holds_it_deletes_nothing(engine, qtbot, base_config):
    """The file locked by another program: history_deleted carries the Problem (nothing was deleted), and the
    conversation goes on where it was, its saved turns and the next one in the same conversation."""
    from engine.history import HistoryStore
    from tests.test_history_faults import locked

    worker, requests, _, _ = engine
    path = base_config.history_file
    emitted(qtbot, worker.turn_finished, requests.speak, "Keep this.")
    ready = collect(worker.ready)
    with locked(path):
        (problem,) = emitted(qtbot, worker.history_deleted, requests.forget, path)
    qtbot.waitUntil(lambda: bool(ready), timeout=TURN_S * 1000)
    assert problem.headline == "The history could not be erased" and "nothing was deleted" in problem.detail
    assert str(path) in problem.detail and "locked" in problem.detail
    conversation_id = ready[-1][0].conversation_id
    emitted(qtbot, worker.turn_finished, requests.speak, "And this.")
    with HistoryStore(path) as store:
        assert [t.text for t in store.open_conversation(conversation_id).turns][-2:] == ["Keep this.", "And this."]


def test_a_turn_held_back_by_a_lock_after_deleting_all_history_is_saved_whole(engine, qtbot, base_config):
    """Deleting all history, then a turn ending while another program holds the file: once it is free the
    turn is written with the next one, and this process's own connections read the file whole (its bytes
    are read by another process: this one closing a file it opened would drop the store's SQLite locks)."""
    from engine.history import HistoryStore
    from tests.test_history import bytes_on_disk
    from tests.test_history_faults import locked

    worker, requests, _, _ = engine
    path = base_config.history_file
    emitted(qtbot, worker.turn_finished, requests.speak, "Said before deleting.")
    ready = collect(worker.ready)
    assert emitted(qtbot, worker.history_deleted, requests.forget, path) == (None,)
    qtbot.waitUntil(lambda: bool(ready), timeout=TURN_S * 1000)
    assert b"Said before deleting." not in bytes_on_disk(path)
    emitted(qtbot, worker.turn_finished, requests.speak, "Said after deleting.")
    with HistoryStore(path) as store:  # a second connection of this process, as the history window has
        assert len(store.list_conversations()) == 1
    notices = collect(worker.notice)
    with locked(path):
        emitted(qtbot, worker.turn_finished, requests.speak, "Held back after deleting.")
    assert len(notices) == 1 and "locked" in notices[0][0].detail
    emitted(qtbot, worker.turn_finished, requests.speak, "Then saved.")
    assert len(notices) == 1, notices[-1][0].detail  # the worker's own connection wrote them both
    with HistoryStore(path) as store:
        (conversation,) = store.list_conversations()
        assert [t.text for t in store.open_conversation(conversation.id).turns] == [
            "Said after deleting.", "Held back after deleting.", "Then saved."]


def test_turns_waiting_for_a_locked_history_survive_a_delete_that_fails(engine, qtbot, base_config):
    """After deleting all history, turns that end while another program holds the file wait in memory for
    it (no conversation could be made); deleting all history again while it is still held fails and
    deletes nothing, those turns included: once the file is free they are saved, with the next turn."""
    from engine.history import HistoryStore
    from tests.test_history_faults import locked

    worker, requests, _, _ = engine
    path = base_config.history_file
    ready = collect(worker.ready)
    assert emitted(qtbot, worker.history_deleted, requests.forget, path) == (None,)
    qtbot.waitUntil(lambda: bool(ready), timeout=TURN_S * 1000)
    with locked(path):
        emitted(qtbot, worker.turn_finished, requests.speak, "Waiting for the file.")
        (problem,) = emitted(qtbot, worker.history_deleted, requests.forget, path)
        assert "nothing was deleted" in problem.detail
    emitted(qtbot, worker.turn_finished, requests.speak, "Saved with it.")
    with HistoryStore(path) as store:
        (conversation,) = store.list_conversations()
        assert [t.text for t in store.open_conversation(conversation.id).turns] == [
            "Waiting for the file.", "Saved with it."]


def test_turns_waiting_for_a_locked_history_are_erased_by_a_delete_that_works(engine, qtbot, base_config):
    """Turns waiting in memory for the file to make their conversation are history too: deleting all history
    once the file is free erases them with the rest, and only the turn after it is saved."""
    from engine.history import HistoryStore
    from tests.test_history_faults import locked

    worker, requests, _, _ = engine
    path = base_config.history_file
    ready = collect(worker.ready)
    assert emitted(qtbot, worker.history_deleted, requests.forget, path) == (None,)
    qtbot.waitUntil(lambda: len(ready) == 1, timeout=TURN_S * 1000)
    with locked(path):
        emitted(qtbot, worker.turn_finished, requests.speak, "Waiting for the file.")
    assert emitted(qtbot, worker.history_deleted, requests.forget, path) == (None,)
    qtbot.waitUntil(lambda: len(ready) == 2, timeout=TURN_S * 1000)
    emitted(qtbot, worker.turn_finished, requests.speak, "Said after deleting.")
    with HistoryStore(path) as store:
        (conversation,) = store.list_conversations()
        assert [t.text for t in store.open_conversation(conversation.id).turns] == ["Said after deleting."]


def test_a_locked_history_is_a_notice_and_the_turn_is_saved_once_it_is_free(engine, qtbot, base_config):
    """Another program holding the history file while a turn ends: notice() carries the HistoryError (the bar,
    not a dialog), the turn still finishes, and it is written with the next turn once the file is free."""
    from engine.history import HistoryStore
    from tests.test_history_faults import locked

    worker, requests, _, _ = engine
    notices = collect(worker.notice)
    with locked(base_config.history_file):
        emitted(qtbot, worker.turn_finished, requests.speak, "Said while locked.")
    (problem,) = [p for (p,) in notices]
    assert problem.headline == "The conversation history cannot be saved" and problem.action is None
    assert str(base_config.history_file) in problem.detail and "locked" in problem.detail
    emitted(qtbot, worker.turn_finished, requests.speak, "Said after.")
    with HistoryStore(base_config.history_file) as store:
        texts = [t.text for c in store.list_conversations() for t in store.open_conversation(c.id).turns]
    assert texts.count("Said while locked.") == 1 and texts.index("Said while locked.") < texts.index("Said after.")


def test_unplugged_devices_are_signalled_and_come_back_by_themselves(engine, qtbot, plugs):
    """The null sink unloaded (speakers gone, and its monitor, the microphone): device_lost for each with its
    Problem; loaded again, device_restored for each without any request, and the next turn is spoken."""
    from tests.conftest import NULL_SINK_RATE_HZ

    worker, requests, _, _ = engine
    lost, restored = collect(worker.device_lost), collect(worker.device_restored)
    plugs.unplug("vsink")
    qtbot.waitUntil(lambda: {kind for kind, _ in lost} == {"input", "output"}, timeout=TURN_S * 1000)
    problems = dict(lost)
    assert problems["output"].headline == "The speakers were disconnected" and problems["output"].action is None
    assert problems["input"].headline == "The microphone was disconnected"
    plugs.plug("vsink", f"rate={NULL_SINK_RATE_HZ}")
    qtbot.waitUntil(lambda: {kind for kind, _ in restored} == {"input", "output"}, timeout=TURN_S * 1000)
    assert dict(restored)["output"] == "the speakers are back: output device 'default'"
    (result,) = emitted(qtbot, worker.turn_finished, requests.speak, "Back again.")
    assert result.heard_text == "Back again."
