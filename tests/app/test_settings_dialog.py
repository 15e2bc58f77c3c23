"""The settings dialog on real widgets: offers the loaded model's voices, saves to Settings, cancels cleanly."""

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialogButtonBox

from app.settings_dialog import SettingsDialog
from engine.assistant import DEFAULT_VOICE_DESCRIPTION
from tests.app.conftest import INFO


def choose(box, data):
    index = box.findData(data)
    assert index >= 0, f"{box.objectName()} does not offer {data!r}"
    box.setCurrentIndex(index)


def test_saving_writes_every_choice_to_the_settings(qtbot, settings):
    """Voice, language, listening (end-of-turn detection, its pauses and echo cancellation too), prompt, models and
    engine chosen in the dialog are in the settings after Save; only the pause that applies can be changed."""
    dialog = SettingsDialog(settings, INFO)
    qtbot.addWidget(dialog)
    assert [dialog.speaker.itemData(i) for i in range(dialog.speaker.count())] == ["", "aiden", "ryan"]
    assert [dialog.language.itemData(i) for i in range(dialog.language.count())] == ["auto", "english", "german"]
    choose(dialog.speaker, "ryan")
    choose(dialog.language, "german")
    choose(dialog.mode, "push-to-talk")
    assert dialog.turn_detection.isChecked() and dialog.longest_pause.isEnabled() and not dialog.silence.isEnabled()
    dialog.longest_pause.setValue(3000)
    dialog.turn_detection.click()  # off: the fixed pause is the one that applies
    assert dialog.silence.isEnabled() and not dialog.longest_pause.isEnabled()
    dialog.silence.setValue(1100)
    assert dialog.echo.isChecked() and "headset" in dialog.echo.toolTip()
    dialog.echo.click()
    dialog.prompt.setPlainText("  Answer in one sentence.  ")
    dialog.model_paths["llm_model"].setText("/models/other.gguf")
    choose(dialog.device, "cpu")
    assert dialog.precision.currentData() == "auto" and dialog.precision.accessibleName()
    choose(dialog.precision, "float32")
    choose(dialog.theme, "dark")
    assert dialog.global_key.keySequence().toString() == "Ctrl+Alt+Space"  # the default
    dialog.global_key.clear()
    qtbot.keyClick(dialog.global_key, Qt.Key.Key_F9, Qt.KeyboardModifier.ControlModifier
                   | Qt.KeyboardModifier.ShiftModifier)
    with qtbot.waitSignal(dialog.saved):
        dialog.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Save).click()

    assert (settings.speaker, settings.language, settings.listen_mode, settings.silence_ms) == \
        ("ryan", "german", "push-to-talk", 1100)
    assert settings.global_talk_key == "Ctrl+Shift+F9"
    assert settings.system_prompt == "Answer in one sentence." and settings.llm_model == "/models/other.gguf"
    assert (settings.device, settings.speech_precision, settings.theme) == ("cpu", "float32", "dark")
    assert settings.echo_cancellation is False
    assert (settings.turn_detection, settings.longest_pause_ms) == (False, 3000)
    assert dialog.result() == SettingsDialog.DialogCode.Accepted


def test_echo_cancellation_turned_off_shows_unchecked_and_saves_unchanged(qtbot, settings):
    """A stored "off" opens unchecked on the Listening tab, and saving without touching it keeps it off."""
    settings.echo_cancellation = False
    dialog = SettingsDialog(settings, INFO)
    qtbot.addWidget(dialog)
    assert not dialog.echo.isChecked() and dialog.silence.parentWidget() is dialog.echo.parentWidget()
    dialog.save()
    assert settings.echo_cancellation is False


def test_cancel_writes_nothing(qtbot, settings):
    """Changes in a cancelled dialog never reach the settings file."""
    dialog = SettingsDialog(settings, INFO)
    qtbot.addWidget(dialog)
    choose(dialog.speaker, "ryan")
    dialog.silence.setValue(2000)
    with qtbot.assertNotEmitted(dialog.saved):
        dialog.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Cancel).click()
    assert settings.speaker == "" and settings.silence_ms == 700 and settings.store.allKeys() == []


def test_stored_names_the_machine_lacks_now_are_kept(qtbot, settings):
    """An unplugged device or a voice of another model stays selected as stored, not silently replaced."""
    settings.input_device, settings.speaker = "USB headset", "vivian"
    dialog = SettingsDialog(settings, INFO)
    qtbot.addWidget(dialog)
    assert dialog.input.currentData() == "USB headset" and "not connected" in dialog.input.currentText()
    assert dialog.speaker.currentData() == "vivian"
    dialog.save()
    assert settings.input_device == "USB headset" and settings.speaker == "vivian"


def test_the_null_sinks_devices_are_offered(qtbot, settings):
    """The speaker and microphone lists are PortAudio's devices (here the PulseAudio null sink's)."""
    from engine.audio import list_devices

    dialog = SettingsDialog(settings, INFO)
    qtbot.addWidget(dialog)
    outputs = [dialog.output.itemData(i) for i in range(dialog.output.count())]
    assert outputs == [""] + [d.name for d in list_devices("output")] and len(outputs) > 1
    assert dialog.input.count() == 1 + len(list_devices("input"))


def test_the_style_field_is_offered_only_where_the_model_takes_a_style(qtbot, settings):
    """A 1.7B CustomVoice model: "Speaking style" is editable and saved (spaces tidied); a VoiceDesign model
    asks for a voice description; a 0.6B model, or none loaded, disables it and says why."""
    from dataclasses import replace

    settings.style = "whispering"
    dialog = SettingsDialog(settings, replace(INFO, style_kind="style"))
    qtbot.addWidget(dialog)
    assert dialog.style.isEnabled() and dialog.style.text() == "whispering"
    dialog.style.setText("  cheerful   and a little faster ")
    with qtbot.waitSignal(dialog.saved):
        dialog.save()
    assert settings.style == "cheerful and a little faster"

    design = SettingsDialog(settings, replace(INFO, style_kind="description"))
    qtbot.addWidget(design)
    form = design.style.parentWidget().layout()
    assert design.style.isEnabled() and form.labelForField(design.style).text() == "Voice description"
    assert design.style.placeholderText() == DEFAULT_VOICE_DESCRIPTION  # the voice it speaks in while empty
    assert not design.speaker.isEnabled() and "no voices of its own" in design.speaker.toolTip()
    assert dialog.speaker.isEnabled()

    reason = "this 0.6B model takes no speaking style; the 1.7B CustomVoice model does"
    for info, why in ((replace(INFO, style_kind=None, style_unsupported=reason), reason),
                      (None, "not loaded yet")):
        plain = SettingsDialog(settings, info)
        qtbot.addWidget(plain)
        assert not plain.style.isEnabled() and why in plain.style_note.text()
        assert plain.style.text() == "cheerful and a little faster"  # kept for a model that takes one


def test_automatic_is_offered_once_and_the_title_names_parley_once(qtbot, settings):
    """A model that lists "auto" among its languages: one "Automatic" (the report saw "Automatic" and "Auto");
    the title is "Settings — Parley", to which Qt appends no second "Parley"."""
    from dataclasses import replace

    dialog = SettingsDialog(settings, replace(INFO, languages=("auto", "english")))
    qtbot.addWidget(dialog)
    assert [dialog.language.itemText(i) for i in range(dialog.language.count())] == ["Automatic", "English"]
    assert dialog.windowTitle() == "Settings — Parley"


def test_voices_have_readable_names_a_description_and_a_preview(qtbot, settings):
    """The voice list reads as names ("Ono Anna", not ono_anna), says under it what the chosen voice sounds like
    and which language it speaks best, and Preview asks for a sample of the one chosen (the model's first for the
    first item); saved is the model's id."""
    from dataclasses import replace

    info = replace(INFO, speakers=("aiden", "ono_anna", "uncle_fu", "my_voice"))
    dialog = SettingsDialog(settings, info)
    qtbot.addWidget(dialog)
    assert [dialog.speaker.itemText(i) for i in range(dialog.speaker.count())] == [
        "Aiden (the model's first voice)", "Aiden", "Ono Anna", "Uncle Fu", "My Voice"]
    note = dialog.voice_note.text()
    assert note.startswith("Sunny American male voice") and "English best" in note
    with qtbot.waitSignal(dialog.preview_requested) as asked:
        dialog.preview.click()
    assert asked.args == ["aiden"]
    choose(dialog.speaker, "ono_anna")
    assert "Japanese female voice" in dialog.voice_note.text() and "Japanese best" in dialog.voice_note.text()
    with qtbot.waitSignal(dialog.preview_requested) as asked:
        dialog.preview.click()
    assert asked.args == ["ono_anna"]
    choose(dialog.speaker, "my_voice")  # another checkpoint's voice: its id tidied, nothing made up about it
    assert dialog.voice_note.isHidden() and dialog.preview.isEnabled()
    with qtbot.waitSignal(dialog.saved):
        dialog.save()
    assert settings.speaker == "my_voice"


def test_without_a_loaded_model_no_voice_can_be_previewed(qtbot, settings):
    """Before the speech model loads there is no voice to hear: Preview is off, and the note says why."""
    dialog = SettingsDialog(settings, None)
    qtbot.addWidget(dialog)
    assert not dialog.preview.isEnabled() and "once it has loaded" in dialog.voice_note.text()


def saved_items(dialog) -> list[tuple[str, bool, str]]:
    """The voice list's saved voices: (text, enabled, tooltip), after its "My voices" heading."""
    from app.settings_dialog import SAVED_ROLE

    model = dialog.speaker.model()
    return [(dialog.speaker.itemText(i), model.item(i).isEnabled(), model.item(i).toolTip())
            for i in range(dialog.speaker.count()) if dialog.speaker.itemData(i, SAVED_ROLE)]


def test_saved_voices_are_offered_beside_the_speakers_and_choosing_one_keeps_the_speaker(qtbot, settings, voices,
                                                                                        cloned):
    """"My voices" lists the saved voices after the model's (a damaged one disabled, its problem as tooltip);
    choosing one saves voice/saved and leaves the speaker as it was, Parley's fallback; a speaker chosen again
    clears it."""
    from dataclasses import replace

    voices.add("Grandma Ann", cloned)
    voices.add("Bob", replace(cloned))
    broken = voices.add("Broken", cloned).path
    broken.write_bytes(broken.read_bytes()[:40])
    settings.speaker = "ryan"
    dialog = SettingsDialog(settings, INFO)
    qtbot.addWidget(dialog)
    texts = [dialog.speaker.itemText(i) for i in range(dialog.speaker.count())]
    assert texts[:3] == ["Aiden (the model's first voice)", "Aiden", "Ryan"] and "My voices" in texts
    (bob, damaged, ann) = saved_items(dialog)  # a damaged file's name is its file's, where its header is cut too
    assert bob == ("Bob", True, "") and ann == ("Grandma Ann", True, "")
    assert damaged[:2] == ("broken (damaged)", False) and "damaged" in damaged[2]
    assert dialog.speaker.currentText() == "Ryan" and not dialog.remove_voice.isEnabled()
    dialog.speaker.setCurrentIndex(texts.index("Grandma Ann"))
    assert dialog.voice_note.text().startswith("Your voice, cloned from the recording's sound and words")
    assert dialog.remove_voice.isEnabled()
    dialog.save()
    assert (settings.saved_voice, settings.speaker) == ("Grandma Ann", "ryan")

    again = SettingsDialog(settings, INFO)
    qtbot.addWidget(again)
    assert again.speaker.currentText() == "Grandma Ann"
    choose(again.speaker, "aiden")
    again.save()
    assert (settings.saved_voice, settings.speaker) == ("", "aiden")


def test_preview_plays_what_the_loaded_model_speaks_and_says_why_not_otherwise(qtbot, settings, voices, cloned):
    """A speaker's model loaded: speakers preview, a saved voice cannot (its tooltip says to choose it first); the
    Base model loaded (a saved voice speaks): saved voices preview by name, speakers cannot."""
    from dataclasses import replace

    voices.add("Ann", cloned)
    dialog = SettingsDialog(settings, INFO)
    qtbot.addWidget(dialog)
    dialog.speaker.setCurrentIndex(dialog.speaker.findText("Ann"))
    assert not dialog.preview.isEnabled() and "Save with this voice chosen to hear it" in dialog.preview.toolTip()
    choose(dialog.speaker, "ryan")
    assert dialog.preview.isEnabled()

    base = SettingsDialog(settings, replace(INFO, speaker=None, saved_voice="Ann"))
    qtbot.addWidget(base)
    assert not base.preview.isEnabled() and "saved voices only" in base.preview.toolTip()
    base.speaker.setCurrentIndex(base.speaker.findText("Ann"))
    with qtbot.waitSignal(base.preview_saved_requested) as asked:
        base.preview.click()
    assert asked.args == ["Ann"]
    assert "saved voice speaks as it was recorded" in base.style_note.text()


def test_remove_asks_first_and_deletes_the_voice(qtbot, settings, voices, cloned):
    """Remove names the voice and asks; Cancel (the default, and Esc) keeps it; Remove deletes its file, the list
    drops it and falls back to the speaker, and voice_renamed tells the window (new name "")."""
    from PySide6.QtWidgets import QMessageBox, QPushButton

    voices.add("Ann", cloned)
    settings.saved_voice, settings.speaker = "Ann", "ryan"
    dialog = SettingsDialog(settings, INFO)
    qtbot.addWidget(dialog)
    dialog.show()
    dialog.remove_voice.click()
    box = dialog.findChild(QMessageBox, "removeVoiceConfirm")
    assert box.isVisible() and "“Ann”" in box.text()
    assert box.defaultButton() is box.button(QMessageBox.StandardButton.Cancel)
    qtbot.keyClick(box, Qt.Key.Key_Escape)
    assert [v.name for v in voices.list()] == ["Ann"]
    dialog.remove_voice.click()
    box = [b for b in dialog.findChildren(QMessageBox, "removeVoiceConfirm") if b.isVisible()][0]
    with qtbot.waitSignal(dialog.voice_renamed) as told:
        box.findChild(QPushButton, "confirmRemoveVoice").click()
    assert told.args == ["Ann", ""] and voices.list() == [] and saved_items(dialog) == []
    assert dialog.speaker.currentData() == "ryan" and "My voices" not in dialog.speaker.currentText()


def test_rename_takes_a_new_name_and_asks_again_for_one_that_is_taken(qtbot, settings, voices, cloned):
    """Rename… offers the name to edit; a name another voice has is asked again with the engine's reason and what
    was typed; a free one renames the voice, which stays chosen."""
    voices.add("Ann", cloned)
    voices.add("Bob", cloned)
    dialog = SettingsDialog(settings, INFO)
    qtbot.addWidget(dialog)
    dialog.speaker.setCurrentIndex(dialog.speaker.findText("Ann"))
    asked = dialog.ask_rename("Ann")
    assert asked.textValue() == "Ann"
    asked.setTextValue("bob")
    asked.accept()
    again = [d for d in dialog.findChildren(type(asked), "renameVoiceDialog") if d.isVisible()][0]
    assert "already a saved voice named 'Bob'" in again.labelText() and again.textValue() == "bob"
    again.setTextValue("Annie")
    with qtbot.waitSignal(dialog.voice_renamed) as told:
        again.accept()
    assert told.args == ["Ann", "Annie"] and [v.name for v in voices.list()] == ["Annie", "Bob"]
    assert dialog.speaker.currentText() == "Annie"


def test_a_speech_server_is_chosen_with_its_address_and_a_masked_token_kept_private(qtbot, settings):
    """Models and engine: This computer by default (the server's fields hidden); A Parley server shows the address and
    the token, masked, and disables the speech model's folder; Save keeps both, in a file only its user can read.
    Choosing This computer again saves no server and no token."""
    import os
    import stat

    from PySide6.QtWidgets import QLineEdit

    dialog = SettingsDialog(settings, INFO)
    qtbot.addWidget(dialog)
    assert dialog.engine.currentData() == "" and dialog.server_url.isHidden() and dialog.server_token.isHidden()
    choose(dialog.engine, "server")
    assert not dialog.server_url.isHidden() and not dialog.model_paths["tts_model"].isEnabled()
    assert not dialog.precision.isEnabled()  # a server computes as it is set up to
    assert dialog.server_token.echoMode() == QLineEdit.EchoMode.Password
    dialog.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Save).click()
    assert dialog.result() != SettingsDialog.DialogCode.Accepted
    assert "Give the server's address" in dialog.connection_result.text() and settings.speech_server == ""
    dialog.server_url.setText(" http://192.168.1.20:8000 ")
    dialog.server_token.setText("s3cret")
    with qtbot.waitSignal(dialog.saved):
        dialog.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Save).click()
    assert (settings.speech_server, settings.speech_token) == ("http://192.168.1.20:8000", "s3cret")
    path = settings.store.fileName()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    settings.theme = "dark"
    settings.store.sync()  # QSettings writing the file again keeps it private
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600

    again = SettingsDialog(settings, INFO)
    qtbot.addWidget(again)
    assert again.engine.currentData() == "server" and again.server_url.text() == "http://192.168.1.20:8000"
    choose(again.engine, "")
    with qtbot.waitSignal(again.saved):
        again.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Save).click()
    assert (settings.speech_server, settings.speech_token) == ("", "")


def test_test_connection_names_the_servers_model_and_voices_or_says_what_is_wrong(qtbot, settings, short_tts):
    """Test connection against a real `parley serve` app: its model and voices; with the wrong token, why; the
    dialog answers meanwhile (the test runs on a thread of its own)."""
    from engine.speech_server import ServiceOptions
    from tests.test_speech_server import Server

    dialog = SettingsDialog(settings, INFO)
    qtbot.addWidget(dialog)
    choose(dialog.engine, "server")
    with Server(short_tts, ServiceOptions(token="s3cret")) as server:
        dialog.server_url.setText(server.url)
        dialog.server_token.setText("wrong")
        with qtbot.waitSignal(dialog._connection_test.finished, timeout=30_000):
            dialog.test_connection.click()
            assert not dialog.test_connection.isEnabled() and dialog.connection_result.text().startswith("Asking")
        assert "refused the token" in dialog.connection_result.text() and dialog.test_connection.isEnabled()
        dialog.server_token.setText("s3cret")
        with qtbot.waitSignal(dialog._connection_test.finished, timeout=30_000):
            dialog.test_connection.click()
        said = dialog.connection_result.text()
    assert said.startswith(f"Connected: {short_tts.folder.name}, speaking ") and "Ryan" in said
