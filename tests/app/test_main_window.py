"""The main window's controls on real widgets: what each key and button asks of the worker, and how the
engine's events show. The worker's thread is not started here (tests/app/test_engine_window.py runs
the window on the real engine); the events are emitted through its signal as the worker would relay them."""

import pytest
from PySide6.QtCore import QEvent, Qt
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QApplication, QPushButton

from app.main_window import STATE_TEXT, MainWindow
from engine.errors import AudioDeviceLostError, AudioDeviceError, GPUUnavailableError, ModelFilesError
from engine.events import (DeviceLost, DeviceRestored, Figures, Heard, Level, Loading, LoadFailed, Measured, Notice,
                           Partial, Ready, ReplyText, SpeakingClause, StateChanged, TurnFailed, VoiceInputOff,
                           VoiceNotFound)
from engine.metrics import MetricsRecorder, TurnMetrics
from tests.app.conftest import INFO


@pytest.fixture
def window(qtbot, settings, tmp_path):
    window = MainWindow(settings, history_file=tmp_path / "history.sqlite3")
    qtbot.addWidget(window)
    window.show()
    qtbot.waitExposed(window)
    return window


def ready(window, **changes):
    from dataclasses import replace

    window.worker.event.emit(Ready(replace(INFO, **changes)))


def test_enter_sends_the_text_and_ctrl_enter_only_speaks_it(window, qtbot):
    """Enter asks for a turn with the typed text and shows it; Ctrl+Enter asks to speak it as written."""
    ready(window)
    qtbot.keyClicks(window.message, "What time is it?")
    with qtbot.waitSignal(window.send_requested) as sent:
        qtbot.keyClick(window.message, Qt.Key.Key_Return)
    assert sent.args == ["What time is it?"] and window.message.toPlainText() == ""
    assert [(b.role, b.text) for b in window.chat.bubbles] == [("user", "What time is it?")]

    qtbot.keyClicks(window.message, "Say this.")
    with qtbot.waitSignal(window.speak_requested) as spoken:
        qtbot.keyClick(window.message, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    assert spoken.args == ["Say this."] and window.message.toPlainText() == ""
    # no user bubble: Parley's own, marked as the user's text said as written (the engine's ReplyText then fills it)
    assert [(b.role, b.text, b.note.text()) for b in window.chat.bubbles[1:]] == [
        ("assistant", "Say this.", "said as you typed it")]

    qtbot.keyClicks(window.message, "two")
    qtbot.keyClick(window.message, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    assert window.message.toPlainText() == "two\n"  # Shift+Enter is a new line


def test_text_typed_while_the_models_load_stays_in_the_box(window, qtbot):
    """Before the worker is ready nothing is sent and nothing typed is lost; the status bar says why."""
    qtbot.keyClicks(window.message, "Hello?")
    with qtbot.assertNotEmitted(window.send_requested):
        qtbot.keyClick(window.message, Qt.Key.Key_Return)
        window.send_button.click()
    assert window.message.toPlainText() == "Hello?" and window.chat.bubbles == []
    assert "not ready" in window.statusBar().currentMessage()


def test_loading_names_each_step_where_the_state_is_and_the_talk_button_waits(window, qtbot):
    """While the models load, the state line names the step (the bar beside it is a thin line with no room for
    words), the talk button says "Loading…" and takes no press; ready, it listens; a failed load says "Not ready"."""
    window.worker.event.emit(Loading("speech model", 2, 7, "speech model (first start: compiling its GPU kernel, "
                                                          "about a minute)"))
    assert window.state_label.text() == ("Loading the speech model (first start: compiling its GPU kernel, "
                                         "about a minute)…")
    assert not window.load_bar.isHidden() and window.load_bar.value() == 2
    assert window.talk_button.text() == "Loading…" and not window.talk_button.isEnabled()
    window.worker.event.emit(Loading("conversation", 7, 7))
    ready(window)
    assert window.load_bar.isHidden() and window.talk_button.text() == "Listening — just speak"

    window.worker.event.emit(Loading("history", 0, 7))  # settings that need new models: loading again
    assert window.state_label.text() == "Loading the history…"
    window.worker.event.emit(LoadFailed("speech model", ModelFilesError("/m/tts: no such model folder")))
    assert window.talk_button.text() == "Not ready" and window.state_label.text().startswith("Not ready")


def key(widget, kind, modifiers=Qt.KeyboardModifier.NoModifier, repeat=False):
    """Space pressed or released on `widget`, as the window's event filter sees it."""
    QApplication.sendEvent(widget, QKeyEvent(kind, Qt.Key.Key_Space, modifiers, " ", repeat))


def test_holding_space_is_push_to_talk_unless_the_user_is_typing(window, qtbot):
    """Space down asks press(), up asks release() (a moment later), key repeats are ignored; in the empty message
    box (where the focus starts) Space talks too, once the box has text it types, and Ctrl+Space talks there."""
    ready(window)
    window.hands_free.setChecked(False)
    for widget in (window.chat, window.message):
        widget.setFocus()
        with qtbot.waitSignal(window.press_requested):
            key(widget, QEvent.Type.KeyPress)
        # a held key repeats as release+press pairs marked auto-repeat: they must not end the turn
        with qtbot.assertNotEmitted(window.release_requested, wait=150):
            key(widget, QEvent.Type.KeyRelease, repeat=True)
        with qtbot.waitSignal(window.release_requested):
            key(widget, QEvent.Type.KeyRelease)
    assert window.message.toPlainText() == ""

    qtbot.keyClicks(window.message, "Hello")
    with qtbot.assertNotEmitted(window.press_requested):
        qtbot.keyClick(window.message, Qt.Key.Key_Space)
    assert window.message.toPlainText() == "Hello "
    with qtbot.waitSignal(window.press_requested):
        key(window.message, QEvent.Type.KeyPress, Qt.KeyboardModifier.ControlModifier)
    with qtbot.waitSignal(window.release_requested):
        key(window.message, QEvent.Type.KeyRelease, Qt.KeyboardModifier.ControlModifier)
    assert window.message.toPlainText() == "Hello "


def test_a_held_space_under_x11_auto_repeat_is_one_turn(window, qtbot):
    """Past Qt's auto-repeat flag, X11 repeats a held key as plain release-press pairs a few ms apart: they are one
    held key, so one press() and, once the key is really up, one release()."""
    ready(window)
    window.hands_free.setChecked(False)
    window.chat.setFocus()
    presses, releases = [], []
    window.press_requested.connect(lambda: presses.append(1))
    window.release_requested.connect(lambda: releases.append(1))
    key(window.chat, QEvent.Type.KeyPress)
    for _ in range(5):
        key(window.chat, QEvent.Type.KeyRelease)
        key(window.chat, QEvent.Type.KeyPress)
    qtbot.wait(200)
    assert (len(presses), len(releases)) == (1, 0)
    key(window.chat, QEvent.Type.KeyRelease)
    qtbot.waitUntil(lambda: len(releases) == 1)
    assert len(presses) == 1


def test_hands_free_the_talk_button_says_what_parley_is_doing(window, qtbot):
    """Hands-free, the big button follows the loop: listening, hearing, thinking, speaking (talk to interrupt)."""
    ready(window)
    window.hands_free.setChecked(True)
    for state, text in (("listening", "Listening — just speak"), ("hearing", "Hearing you…"),
                        ("thinking", "Thinking…"), ("speaking", "Speaking — talk to interrupt")):
        window.worker.event.emit(StateChanged(state))
        assert window.talk_button.text() == text and window.state_label.text() == STATE_TEXT[state]


def test_hands_free_mode_is_switched_saved_and_space_no_longer_talks(window, qtbot, settings):
    """The Hands-free toggle asks the worker for the mode and stores it; in hands-free Space does nothing."""
    ready(window)
    window.hands_free.setChecked(False)
    with qtbot.waitSignal(window.mode_requested) as mode:
        window.hands_free.setChecked(True)
    assert mode.args == ["hands-free"] and settings.listen_mode == "hands-free"
    assert not window.talk_button.isEnabled()
    window.chat.setFocus()
    with qtbot.assertNotEmitted(window.press_requested):
        qtbot.keyPress(window.chat, Qt.Key.Key_Space)


def test_the_talk_button_held_is_push_to_talk(window, qtbot):
    """Pressing and releasing the big button asks press() and release()."""
    ready(window)
    window.hands_free.setChecked(False)
    with qtbot.waitSignal(window.press_requested):
        qtbot.mousePress(window.talk_button, Qt.MouseButton.LeftButton)
    with qtbot.waitSignal(window.release_requested):
        qtbot.mouseRelease(window.talk_button, Qt.MouseButton.LeftButton)


def test_escape_stops_and_ctrl_m_mutes(window, qtbot):
    """Esc (and the Stop button) ask stop(); Ctrl+M toggles the mute, shown on the Mute button."""
    ready(window)
    window.activateWindow()
    with qtbot.waitSignal(window.stop_requested):
        qtbot.keyClick(window.chat, Qt.Key.Key_Escape)
    with qtbot.waitSignal(window.stop_requested):
        window.stop_button.click()
    with qtbot.waitSignal(window.mute_requested) as muted:
        qtbot.keyClick(window.chat, Qt.Key.Key_M, Qt.KeyboardModifier.ControlModifier)
    assert muted.args == [True] and window.mute_button.isChecked() and window.mute_button.text() == "Unmute"


def test_the_engines_events_drive_the_conversation_meter_and_state(window, qtbot):
    """Heard, reply text, spoken clauses, the end of a turn, figures and states show in the window."""
    ready(window)
    emit = window.worker.event.emit
    emit(StateChanged("hearing"))
    assert window.state_label.text() == "Hearing you…" and window.talk_button.property("state") == "hearing"
    emit(Partial("name three"))
    emit(Heard("Name three colors."))
    emit(ReplyText("Red, green"))
    emit(ReplyText("Red, green and blue."))
    emit(SpeakingClause("Red, green and blue.", 0))
    emit(Measured(0, "voice_to_voice_ms", 812.0))
    assert window.meter.values["voice_to_voice_ms"][0].text() == "812 ms"  # before the turn has ended
    recorder = MetricsRecorder()
    recorder.subscribe(lambda m: emit(Figures(m, dict(recorder.summary()))))
    recorder.record(TurnMetrics(tts_ttfc_ms=140.0, tts_rtf=0.5, llm_ttft_ms=90.0))
    assert [(b.role, b.text) for b in window.chat.bubbles] == [("user", "Name three colors."),
                                                             ("assistant", "Red, green and blue.")]
    assert window.meter.values["tts_ttfc_ms"][1].text() == "140 ms"
    emit(Level(-30.0))
    assert window.meter.level.fraction() == 0.5


def test_a_failed_load_shows_a_dialog_whose_button_opens_the_settings(window, qtbot):
    """A failed load is a dialog with the headline and a way forward; its button opens that page."""
    window.worker.event.emit(LoadFailed("speakers", AudioDeviceError("no output device")))
    dialog = window.dialog
    assert dialog.isVisible() and dialog.text() == "A sound device is not working (loading the speakers)"
    assert window.info is None and "Not ready" in window.state_label.text()
    dialog.action_button.click()
    from app.settings_dialog import SettingsDialog

    assert window.findChild(SettingsDialog, "settingsDialog").isVisible()


def test_a_notice_keeps_the_conversation_going_and_says_what_to_do(window, qtbot):
    """No microphone: a notice bar (not a dialog), typing still works, the talk button says why it is off."""
    window.worker.event.emit(VoiceInputOff("this machine has no input device", AudioDeviceError(
        "this machine has no input device"), "opening the microphone"))
    ready(window, microphone=None)
    assert not window.notice.isHidden() and "Voice input is off: a sound device" in window.notice.label.text()
    assert "You can still type to Parley." in window.notice.label.text()
    assert window.dialog is None
    assert not window.talk_button.isEnabled() and "type below" in window.talk_button.text()
    qtbot.keyClicks(window.message, "typed")
    with qtbot.waitSignal(window.send_requested):
        qtbot.keyClick(window.message, Qt.Key.Key_Return)


def test_the_status_bar_says_which_of_the_cpus_paths_speaks(window):
    """On a CPU the engine picks its fastest arithmetic (int8 where the CPU has it): the status bar names it."""
    ready(window, device="cpu", speech_precision="int8 weights and int8 products, float32 activations, bfloat16 codec")
    assert "tts on CPU (int8 weights and int8 products)" in window.statusBar().currentMessage()
    ready(window, device="cpu", speech_precision="float32 weights, float32 activations, float32 codec")
    assert "tts on CPU (float32 weights)" in window.statusBar().currentMessage()


def test_speech_without_the_megakernel_is_told_once_per_reason(window, qtbot, settings):
    """The engine speaks on PyTorch for want of a CUDA compiler: the status bar says so at every start, the notice
    bar once (a lasting reason is not repeated), and again for a new reason or once the kernel has run between; a
    notice already on screen (no microphone) is not covered, the kernel's waiting for the next start."""
    no_toolkit = "the megakernel could not be built (CUDA_HOME environment variable is not set)"
    ready(window, device="cuda", megakernel_problem=no_toolkit)
    assert "on CUDA without its fast kernel" in window.statusBar().currentMessage()
    assert not window.notice.isHidden() and "fast GPU kernel" in window.notice.label.text()
    assert "CUDA_HOME" in window.notice.label.text() and "NVIDIA CUDA toolkit" in window.notice.label.text()
    window.notice.hide()  # Dismiss

    ready(window, device="cuda", megakernel_problem=no_toolkit)  # the next start, the same reason
    assert window.notice.isHidden() and "without its fast kernel" in window.statusBar().currentMessage()

    window.worker.event.emit(VoiceInputOff("this machine has no input device", AudioDeviceError(
        "this machine has no input device"), "opening the microphone"))
    old_gpu = "the megakernel needs compute capability 8.0+, found 7.5 (Tesla T4)"
    ready(window, device="cuda", microphone=None, megakernel_problem=old_gpu)
    assert "no input device" in window.notice.label.text()
    window.notice.hide()
    ready(window, device="cuda", megakernel_problem=old_gpu)
    assert not window.notice.isHidden() and "Tesla T4" in window.notice.label.text()
    assert settings.megakernel_notice == old_gpu

    window.notice.hide()
    ready(window, device="cuda")  # the kernel runs: nothing to tell, and a reason that comes back is told again
    assert window.notice.isHidden() and "fast kernel" not in window.statusBar().currentMessage()
    ready(window, device="cuda", megakernel_problem=old_gpu)
    assert not window.notice.isHidden() and "Tesla T4" in window.notice.label.text()


def test_lost_devices_show_in_the_notice_bar_until_they_are_back(window, qtbot):
    """Speakers and microphone lost: each in the notice bar, never a dialog (a turn that failed for it too);
    the microphone back brings the speakers' notice back, the speakers back hides the bar and says so."""
    ready(window)
    speakers = AudioDeviceLostError("the speakers were disconnected: gone", "output")
    microphone = AudioDeviceLostError("the microphone was disconnected: gone", "input")
    emit = window.worker.event.emit
    emit(DeviceLost("output", str(speakers), speakers))
    emit(TurnFailed(str(speakers), speakers))
    emit(DeviceLost("input", str(microphone), microphone))
    assert not window.notice.isHidden() and "The microphone was disconnected" in window.notice.label.text()
    assert window.dialog is None
    emit(DeviceRestored("input", "the microphone is back: input device 'default'"))
    assert "The speakers were disconnected" in window.notice.label.text() and not window.notice.isHidden()
    assert window.statusBar().currentMessage() == "The microphone is back: input device 'default'"
    emit(DeviceRestored("output", "the speakers are back: output device 'default'"))
    assert window.notice.isHidden() and window.statusBar().currentMessage().startswith("The speakers are back")


def test_saving_the_settings_restyles_the_app_at_once(window, qtbot, qapp):
    """A theme saved in the settings dialog is applied without a restart."""
    from PySide6.QtWidgets import QDialogButtonBox

    dialog = window.open_settings()
    dialog.theme.setCurrentIndex(dialog.theme.findData("dark"))
    try:
        dialog.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Save).click()
        assert window.settings.theme == "dark" and qapp.property("parleyScheme") == "dark"
    finally:
        from app.style import apply_style

        apply_style(qapp, "system")


def test_save_reply_audio_writes_what_was_heard_as_wav(window, qtbot, tmp_path):
    """Ctrl+Shift+S (or a reply's "Save audio…") asks where, then writes the reply's audio as a 16-bit WAV; with no
    reply yet the status bar says so; a place that cannot be written is an error dialog naming it."""
    import numpy as np
    import soundfile
    from PySide6.QtWidgets import QFileDialog

    from engine.dialogue import TurnResult
    from engine.events import TurnFinished

    ready(window)
    window.save_audio_action.trigger()
    assert window.statusBar().currentMessage().startswith("No reply's audio to save yet")
    audio = (np.sin(np.arange(2400) / 10).astype(np.float32) * 0.5)
    metrics = TurnMetrics(turn=0)
    window.worker.event.emit(ReplyText("Hello."))
    window.worker.event.emit(TurnFinished(TurnResult("Hi", "Hello.", "Hello.", False, metrics, audio, 24_000)))
    window.save_audio_action.trigger()
    dialog = window.findChild(QFileDialog, "saveAudioDialog")
    assert dialog is not None and dialog.isVisible() and dialog.defaultSuffix() == "wav"
    dialog.selectFile(str(tmp_path / "hello"))
    dialog.accept()
    saved, rate = soundfile.read(tmp_path / "hello.wav", dtype="float32")
    assert rate == 24_000 and np.abs(saved - audio).max() < 1e-4
    assert window.statusBar().currentMessage().startswith("Saved the reply's audio (0.1 s)")
    window._write_audio(tmp_path / "missing" / "x.wav", audio, 24_000)
    assert window.dialog.isVisible() and "no such folder" in window.dialog.informativeText()
    assert "saving the audio" in window.dialog.text()


def test_a_voice_preview_in_the_settings_is_asked_of_the_worker(window, qtbot):
    """The settings' Preview reaches the window's request to the worker, with the voice chosen there."""
    ready(window)
    dialog = window.open_settings()
    dialog.speaker.setCurrentIndex(dialog.speaker.findData("ryan"))
    with qtbot.waitSignal(window.preview_requested) as asked:
        dialog.preview.click()
    assert asked.args == ["ryan"]
    dialog.reject()


def test_ctrl_h_lists_saved_conversations_and_reopening_one_shows_it(window, qtbot, tmp_path):
    """History… (Ctrl+H) shows the store's conversations; reopening one shows its turns and asks the worker to
    continue it."""
    from engine.history import HistoryStore, Turn

    with HistoryStore(tmp_path / "history.sqlite3") as store:
        cid = store.new_conversation("Colours")
        store.add_turn(cid, Turn("user", "Name three colors."))
        store.add_turn(cid, Turn("assistant", "Red, green and blue.", heard_text="Red,", interrupted=True))
    ready(window)
    window.activateWindow()
    qtbot.keyClick(window.chat, Qt.Key.Key_H, Qt.KeyboardModifier.ControlModifier)
    view = window.history_view
    assert view is not None and view.isVisible() and view.selected_id() == cid

    with qtbot.waitSignal(window.open_requested) as opened:
        view.reopen.emit(cid)
    assert opened.args == [cid] and not view.isVisible()
    assert [(b.role, b.text) for b in window.chat.bubbles] == [("user", "Name three colors."),
                                                             ("assistant", "Red, green and blue.")]
    assert window.chat.bubbles[-1].note.text() == "interrupted" and "Colours" in window.windowTitle()

    with qtbot.waitSignal(window.deleted_requested) as deleted:
        view.delete(cid)
    assert deleted.args == [cid] and view.store.list_conversations() == []


def test_a_missing_model_opens_the_models_page_at_once(window, qtbot):
    """At first run (no model found) the Models page opens by itself, with the reason above the conversation."""
    window.worker.event.emit(LoadFailed("speech model", ModelFilesError(
        "the speech model Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice is not on this machine")))
    page = window.models_page
    assert page is not None and page.isVisible() and page.objectName() == "modelsPage"
    assert not window.notice.isHidden() and window.notice.button.text() == "Open Models…"
    assert window.dialog is None
    page.hide()
    window.notice.button.click()
    assert page.isVisible()


def test_the_meters_labels_fit_at_the_smallest_window_size_and_its_card_is_painted(window, qtbot):
    """At the window's minimum size, with five-digit figures, every label of the meter ("LLM first token",
    each value) gets the width its text needs; the meter paints its style-sheet card; Send is the default."""
    from PySide6.QtWidgets import QLabel

    from app.meter import SHOWN

    ready(window)
    figures = {name: 12345.0 for name in SHOWN if name.endswith("_ms")}
    recorder = MetricsRecorder()
    recorder.record(TurnMetrics(turn=0, tts_rtf=10.5, **figures))
    window.worker.event.emit(Figures(TurnMetrics(turn=0, tts_rtf=10.5, **figures), dict(recorder.summary())))
    qtbot.waitUntil(lambda: window.meter.values["llm_ttft_ms"][0].text() == "12345 ms")
    QApplication.processEvents()  # the layouts take the longer texts' sizes
    smallest = window.minimumSizeHint().expandedTo(window.minimumSize())
    window.resize(smallest)
    qtbot.waitUntil(lambda: window.size() == smallest)
    QApplication.processEvents()
    labels = window.meter.findChildren(QLabel)
    assert "LLM first token" in [label.text() for label in labels]
    cut = [label.text() for label in labels if label.width() < label.sizeHint().width()]
    assert cut == []
    assert window.meter.testAttribute(Qt.WidgetAttribute.WA_StyledBackground)
    assert window.send_button.isDefault()


def test_notices_of_the_gpu_and_of_a_voice_the_model_lacks_say_what_to_do(window, qtbot):
    """A GPU that is missing: the notice bar says the CPU is used and leads to Settings; a configured voice the model
    lacks: the bar names it, the voices there are and the one speaking, and leads to Settings too."""
    gpu = GPUUnavailableError("the settings ask for the GPU (CUDA), but torch finds no CUDA device")
    window.worker.event.emit(Notice(str(gpu), gpu, "loading the models"))
    assert "Parley is using the CPU" in window.notice.label.text() and window.notice.button.text() == "Open Settings…"
    window.worker.event.emit(VoiceNotFound("Nobody", ("aiden", "ryan"), "aiden"))
    problem = window.notice.problem
    assert problem.headline == "This speech model has no voice of that name" and problem.action == "settings"
    assert problem.detail == "'Nobody' is not one of its voices (aiden, ryan); Parley speaks as 'aiden'."
    assert window.dialog is None


@pytest.mark.parametrize("opener, close_button", [("open_models", "modelsClose"), ("open_history", "historyClose"),
                                                  ("open_about", "aboutClose")])
def test_models_history_and_about_open_over_the_window_and_close_by_esc_ctrl_w_and_close(
        window, qtbot, opener, close_button):
    """Each opens over the main window, on its screen (centred on it where the screen leaves room: History here, on
    the offscreen platform's 800 x 600 screen), and closes by Esc, Ctrl+W and its Close button, as a desktop app's
    windows do; opened again, it is the same window."""
    window.setGeometry(0, 60, 800, 480)
    page = getattr(window, opener)()
    qtbot.waitExposed(page)
    assert window.screen().availableGeometry().contains(page.frameGeometry())
    if opener == "open_history":  # within the width of a frame, which the page has only once shown
        offset = page.frameGeometry().center() - window.frameGeometry().center()
        assert abs(offset.x()) <= 2 and abs(offset.y()) <= 2
    for close in (lambda: qtbot.keyClick(page, Qt.Key.Key_Escape),
                  lambda: qtbot.keyClick(page, Qt.Key.Key_W, Qt.KeyboardModifier.ControlModifier),
                  lambda: page.findChild(QPushButton, close_button).click()):
        assert getattr(window, opener)() is page and page.isVisible()
        page.activateWindow()
        qtbot.waitUntil(lambda: QApplication.activeWindow() is page)
        close()
        qtbot.waitUntil(lambda: not page.isVisible())


def test_the_window_opens_where_and_as_large_as_it_was_closed(qtbot, settings, tmp_path):
    """Its size and place are kept in the settings when it closes, and the next window takes them."""
    first = MainWindow(settings, history_file=tmp_path / "history.sqlite3")
    qtbot.addWidget(first)
    first.show()
    qtbot.waitExposed(first)
    first.setGeometry(0, 40, 800, 530)
    qtbot.waitUntil(lambda: first.geometry().height() == 530)
    first.close()
    second = MainWindow(settings, history_file=tmp_path / "history.sqlite3")
    qtbot.addWidget(second)
    assert (second.geometry().y(), second.geometry().height()) == (40, 530)


def test_the_tray_shows_and_hides_the_window_mutes_and_quits_and_keeps_parley_running_when_asked(
        qtbot, settings, tmp_path, monkeypatch):
    """Where the desktop has a tray (stood in for here: the offscreen platform has none), the icon's menu shows or
    hides the window, mutes (the window's own action) and quits; with "keep running in the tray" on, closing the
    window hides it, once saying so, and Quit ends Parley."""
    from PySide6.QtWidgets import QSystemTrayIcon

    monkeypatch.setattr(QSystemTrayIcon, "isSystemTrayAvailable", staticmethod(lambda: True))
    settings.close_to_tray = True
    window = MainWindow(settings, history_file=tmp_path / "history.sqlite3")
    qtbot.addWidget(window)
    window.show()
    qtbot.waitExposed(window)
    menu = window.tray.contextMenu()
    assert [a.text() for a in menu.actions() if a.text()] == ["Hide Parley", "&Mute microphone", "&Quit"]
    messages = []
    monkeypatch.setattr(window.tray, "showMessage", lambda title, *rest: messages.append(title))
    for _ in range(2):
        window.close()
        assert not window.isVisible() and window.tray.isVisible()
        window.tray.activated.emit(QSystemTrayIcon.ActivationReason.Trigger)
        assert window.isVisible()
    assert messages == ["Parley is still running"]  # said once
    menu.actions()[1].trigger()
    assert window.mute_button.isChecked()
    window.quit_action.trigger()
    assert not window.isVisible() and not window.tray.isVisible()


def test_without_a_tray_closing_the_window_ends_parley(window):
    """No tray (the offscreen platform has none): no icon, and closing closes, whatever the setting says."""
    window.settings.close_to_tray = True
    assert window.tray is None
    window.close()
    assert not window.isVisible()


def test_a_saved_voice_speaking_is_named_and_one_that_cannot_speak_is_a_notice(window, qtbot):
    """Ready with a saved voice: the status bar names it as the user's; SavedVoiceUnavailable: the notice bar says
    which voice, why (the engine's words) and leads to the Models page where the Base model is missing."""
    from engine.errors import ModelMissingError, VoiceNameError
    from engine.events import SavedVoiceUnavailable

    ready(window, speaker=None, saved_voice="Grandma Ann")
    assert "your voice “Grandma Ann”" in window.statusBar().currentMessage()
    missing = ModelMissingError("/m/base: no such model folder")
    window.worker.event.emit(SavedVoiceUnavailable(
        "Grandma Ann", f"speaking as 'aiden' instead of the saved voice 'Grandma Ann': {missing}", missing, "aiden"))
    problem = window.notice.problem
    assert problem.headline == "Parley cannot speak in your voice “Grandma Ann”" and problem.action == "models"
    assert problem.detail.startswith("Speaking as 'aiden' instead") and "/m/base" in problem.detail
    gone = VoiceNameError("no saved voice is named 'Bob'")
    window.worker.event.emit(SavedVoiceUnavailable("Bob", f"speaking as 'aiden' instead: {gone}", gone, "aiden"))
    assert window.notice.problem.action == "settings" and window.notice.isVisible()


@pytest.mark.parametrize("muted", [False, True])
def test_the_new_voice_dialog_stops_parley_and_mutes_the_microphone_until_it_closes(window, qtbot, muted):
    """New voice… stops Parley's speech and mutes the conversation's microphone, also across a reload meanwhile;
    closing the dialog gives back the user's own mute."""
    ready(window)
    window.mute_button.setChecked(muted)
    dialog = window.open_settings()
    with qtbot.waitSignal(window.stop_requested), qtbot.waitSignal(window.mute_requested) as asked:
        voice_dialog = dialog.open_voice_dialog()
    assert asked.args == [True] and window.voice_dialog is voice_dialog
    with qtbot.waitSignal(window.mute_requested) as asked:
        ready(window)
    assert asked.args == [True]
    with qtbot.waitSignal(window.mute_requested) as asked:
        voice_dialog.reject()
    assert asked.args == [muted] and window.voice_dialog is None
    dialog.reject()


def test_removing_the_voice_in_use_gives_way_to_the_speaker_at_once(window, qtbot, settings, voices, cloned):
    """Remove in the settings of the saved voice the settings choose: voice/saved is cleared and the worker is asked
    to apply it (the speaker speaks), whatever the settings dialog saves later; the Preview of a saved voice asks
    the worker for it by name."""
    from PySide6.QtWidgets import QMessageBox

    voices.add("Ann", cloned)
    settings.saved_voice = "Ann"
    ready(window, speaker=None, saved_voice="Ann")
    dialog = window.open_settings()
    with qtbot.waitSignal(window.preview_saved_requested) as asked:
        dialog.preview.click()
    assert asked.args == ["Ann"]
    with qtbot.waitSignal(window.apply_requested) as applied:
        dialog.ask_remove("Ann").findChild(QPushButton, "confirmRemoveVoice").click()
    assert settings.saved_voice == "" and applied.args[0].saved_voice == "" and voices.list() == []
    assert not dialog.findChild(QMessageBox, "removeVoiceConfirm").isVisible()
    dialog.reject()


def test_speech_from_a_server_is_named_in_the_status_bar(window):
    """Ready with a speech server: the status bar names its model on the server's address, not this computer's
    device."""
    from pathlib import Path

    ready(window, speech_server="http://192.168.1.20:8000", tts_model=Path("Qwen3-TTS-12Hz-1.7B-CustomVoice"))
    said = window.statusBar().currentMessage()
    assert said.startswith("Qwen3-TTS-12Hz-1.7B-CustomVoice on http://192.168.1.20:8000, voice ") and "CPU" not in said
