"""The New-voice dialog on real widgets: recording from the PulseAudio null sink while espeak-ng speaks into it (a
level that moves, a length), a recording too short refused, a file chosen, and Save through the window's real worker
and the tiny Base model (the voice saved and chosen in the settings); a failure keeps what was entered."""

import html

import numpy as np
import pytest
import soundfile
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialog

from app.main_window import MainWindow
from app.voice_dialog import VoiceDialog
from tests.conftest import REFERENCE_TEXT

WAIT_MS = 240_000  # generous: the machine's two cores are shared with other work


def shown(dialog) -> str:
    """The dialog's message as the user reads it (it is rich text)."""
    return html.unescape(dialog.message.text())


@pytest.fixture
def dialog(qtbot):
    dialog = VoiceDialog("")
    qtbot.addWidget(dialog)
    dialog.show()
    return dialog


def test_recording_shows_a_moving_level_and_its_length_and_keeps_the_recording(dialog, qtbot, user_mic, speak):
    """Record while the user reads into the microphone: the meter rises, the length counts up against 5-20 s, and
    Stop (Space on the focused button) keeps the recording, at the microphone's own rate."""
    speech = speak(REFERENCE_TEXT)
    dialog.record_button.setFocus()
    qtbot.keyClick(dialog.record_button, Qt.Key.Key_Space)
    assert dialog.recorder is not None and dialog.record_button.text() == "■ &Stop"
    reading = user_mic(speech)
    qtbot.waitUntil(lambda: dialog.level.fraction() > 0.3, timeout=20_000)  # speech, well above the hum
    qtbot.waitUntil(lambda: dialog.recorder.seconds > 4.0, timeout=20_000)
    assert dialog.length.text().endswith(" s of 5–20 s") and float(dialog.length.text().split()[0]) > 3.0
    qtbot.keyClick(dialog.record_button, Qt.Key.Key_Space)
    reading.wait()
    samples, rate_hz = dialog.sample
    assert dialog.recorder is None and dialog.record_button.text() == "&Record" and rate_hz >= 16_000
    assert len(samples) / rate_hz > 4.0 and np.sqrt(np.mean(samples ** 2)) > 0.01
    assert dialog.source.text().startswith("Using your recording, ") and dialog.message.isHidden()
    assert dialog.level.fraction() == 0.0


def test_a_recording_shorter_than_three_seconds_is_refused(dialog, qtbot):
    """Stopped at once: the dialog says the recording is too short and how long it must be, and keeps none."""
    dialog.record_button.click()
    qtbot.waitUntil(lambda: dialog.recorder.seconds > 0.1, timeout=20_000)
    dialog.record_button.click()
    assert dialog.sample is None and dialog.source.text() == "No recording yet."
    assert "too short" in dialog.message.text() and "at least 3 s" in dialog.message.text()
    dialog.name.setText("Me")
    dialog.save()  # a name but nothing to clone: it asks for a recording, and nothing is asked of the worker
    assert "Record your voice first" in dialog.message.text() and dialog.request is None


def test_a_chosen_file_shows_its_name_and_length_and_a_file_too_short_is_refused(dialog, tmp_path, reference_wav):
    """Choose a file…: the recording's name and length; a 1-second file is refused with its length."""
    chooser = dialog.ask_file()
    chooser.selectFile(str(reference_wav))
    chooser.accept()
    assert dialog.sample == (reference_wav, None) and dialog.source.text() == "Using me.wav, 6.4 s."
    short = tmp_path / "short.flac"
    soundfile.write(short, np.zeros(16_000, np.float32), 16_000)
    dialog.use_file(short)
    assert "short.flac is 1.0 s long" in dialog.message.text() and dialog.sample == (reference_wav, None)
    dialog.use_file(tmp_path / "notes.txt")
    assert "notes.txt is not a recording Parley can read" in dialog.message.text()


def test_esc_closes_the_dialog_and_drops_a_recording_under_way(dialog, qtbot):
    dialog.record_button.click()
    qtbot.keyClick(dialog, Qt.Key.Key_Escape)
    assert not dialog.isVisible() and dialog.result() == QDialog.DialogCode.Rejected and dialog.recorder is None


@pytest.fixture
def window(qtbot, settings):
    window = MainWindow(settings)
    qtbot.addWidget(window)
    window.show()
    return window


def open_new_voice(window):
    """Settings, then New voice…, from the window (its engine not started: the worker clones with the settings'
    models alone)."""
    settings_dialog = window.open_settings()
    return settings_dialog, settings_dialog.open_voice_dialog()


def test_save_clones_the_voice_in_the_worker_and_chooses_it_in_the_settings(window, qtbot, settings, voices,
                                                                           base_checkpoint, reference_wav):
    """A name, a file and what it says; Save: the dialog shows it is working with its inputs off, the worker clones
    with the tiny Base model, the voice is in the library with that transcript, the dialog closes, and the settings'
    voice list has it chosen; the settings' Save makes it the voice Parley speaks in."""
    settings.base_model = str(base_checkpoint)
    settings_dialog, dialog = open_new_voice(window)
    dialog.name.setText("Grandma Ann")
    dialog.use_file(reference_wav)
    dialog.text.setPlainText(REFERENCE_TEXT)
    with qtbot.waitSignal(dialog.cloned, timeout=WAIT_MS) as cloned:
        dialog.save_button.click()
        assert dialog.busy.isVisible() and not dialog.name.isEnabled() and not dialog.save_button.isEnabled()
        assert dialog.buttons.button(dialog.buttons.StandardButton.Cancel).isEnabled()
    assert cloned.args == ["Grandma Ann"] and not dialog.isVisible()
    (voice,) = voices.list()
    assert (voice.name, voice.mode, voice.transcript) == ("Grandma Ann", "icl", REFERENCE_TEXT)
    assert settings_dialog.speaker.currentText() == "Grandma Ann" and settings_dialog.rename_voice.isEnabled()
    settings_dialog.save()
    assert settings.saved_voice == "Grandma Ann" and settings.speaker == ""


def test_without_the_voice_cloning_model_the_dialog_says_so_and_keeps_everything(window, qtbot, settings, voices,
                                                                                tmp_path, reference_wav):
    """No Base model where the settings say: the engine's message under the inputs, Open Models… beside Save (it
    opens the Models page, whose voice-cloning card offers the download), and the name, file and text kept."""
    settings.base_model = str(tmp_path / "no-base")
    _, dialog = open_new_voice(window)
    dialog.name.setText("Me")
    dialog.use_file(reference_wav)
    dialog.text.setPlainText(REFERENCE_TEXT)
    dialog.x_vector.click()
    dialog.save()
    qtbot.waitUntil(lambda: dialog.request is None, timeout=WAIT_MS)
    assert dialog.isVisible() and "The voice-cloning model is not on this computer" in dialog.message.text()
    assert "no-base: no such model folder" in dialog.message.text()
    assert dialog.action_button.isVisible() and dialog.action_button.text() == "Open Models…"
    assert (dialog.name.text(), dialog.sample, dialog.text.toPlainText()) == ("Me", (reference_wav, None),
                                                                             REFERENCE_TEXT)
    assert dialog.x_vector.isChecked() and dialog.name.isEnabled() and dialog.save_button.isEnabled()
    assert voices.list() == []
    dialog.action_button.click()
    row = window.models_page.rows["clone"]
    assert window.models_page.isVisible() and row.download_button.text().startswith("Download Qwen3-TTS 0.6B Base")


def test_a_silent_recording_is_refused_with_the_engines_words(window, qtbot, settings, voices, tmp_path,
                                                              base_checkpoint):
    """A file of silence: "This recording cannot be used", the level it has; nothing is saved."""
    settings.base_model = str(base_checkpoint)
    silent = tmp_path / "silent.wav"
    soundfile.write(silent, np.zeros(5 * 16_000, np.float32), 16_000)
    _, dialog = open_new_voice(window)
    dialog.name.setText("Quiet")
    dialog.use_file(silent)
    dialog.x_vector.click()
    dialog.save()
    qtbot.waitUntil(lambda: dialog.request is None, timeout=WAIT_MS)
    assert "This recording cannot be used" in dialog.message.text() and "silent" in dialog.message.text()
    assert not dialog.action_button.isVisible() and voices.list() == []


def test_a_name_already_taken_is_said_at_once(dialog, voices, cloned, reference_wav):
    """A name a saved voice has, however capitalised: said before anything is asked of the worker."""
    voices.add("Ann", cloned)
    dialog.name.setText("ANN")
    dialog.use_file(reference_wav)
    dialog.save()
    assert dialog.request is None and "already a saved voice named 'Ann'" in shown(dialog)
