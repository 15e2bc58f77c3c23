"""The settings dialog: voice, language, speaking style, sound devices, listening, system prompt, model
paths, GPU/CPU and theme, written to Settings (app/settings.py) when the user saves.

The voices and languages offered are the loaded model's (AssistantInfo, engine/assistant.py), and the user's saved
voices (engine/voice_library.py), which New voice… makes (app/voice_dialog.py) and Rename…/Remove change at once;
the devices are PortAudio's (engine/audio/devices.py). The speech engine is this computer's speech model or a Parley
speech server (engine/speech_client.py), which Test connection asks on a thread of its own. The window applies what
was saved without a restart where it can: the voice, the listening and the prompt at once, models and devices by
reloading them.
"""

from __future__ import annotations

import threading

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QInputDialog,
    QKeySequenceEdit,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.confirm import ask_to_confirm
from app.settings import THEMES, Settings
from engine.assistant import DEFAULT_VOICE_DESCRIPTION, AssistantInfo
from engine.errors import AudioDeviceError, ParleyError
from engine.settings import ENGINE_DEVICES, LISTEN_MODES, LONGEST_PAUSE_MS_RANGE, SILENCE_MS_RANGE, SPEECH_PRECISIONS
from engine.voice_library import VoiceLibrary, same_name
from engine.voices import describe

DEVICE_DEFAULT = "System default"
# the voice list's role that holds a saved voice's name; a speaker's id is the item's data (Qt's UserRole)
SAVED_ROLE = Qt.ItemDataRole.UserRole + 1
MODES = {"icl": "cloned from the recording's sound and words, the closest likeness",
         "x_vector": "cloned from the recording's sound alone"}
ENGINES = (("", "This computer"), ("server", "A Parley server"))  # the speech engine's choices: speech_server "" or set
SERVER_EXAMPLE = "http://192.168.1.20:8000"


class ConnectionTest(QObject):
    """Asks a speech server what it speaks (engine/speech_client.py connect_tts) on a thread of its own, so the
    dialog never waits on the network (up to its connect timeout).

    Signals:
        finished(int, str): the test's number (start()'s) and what to show: the server's model and voices, or the
            error's message.
    """

    finished = Signal(int, str)

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self._count = 0

    def start(self, url: str, token: str) -> int:
        """Begin a test; returns its number (a later test's result replaces an earlier one's)."""
        self._count += 1
        threading.Thread(target=self._run, args=(self._count, url, token), name="parley-connection-test",
                         daemon=True).start()
        return self._count

    def _run(self, number: int, url: str, token: str) -> None:
        from engine.speech_client import connect_tts  # imports the engine's prompt rules (torch): here, not at start

        try:
            tts = connect_tts(url, token)
        except ParleyError as e:
            self.finished.emit(number, str(e))
            return
        voices = ", ".join(describe(s).name for s in tts.speakers) or "voices from a description"
        self.finished.emit(number, f"Connected: {tts.folder.name}, speaking {voices}.")


class SettingsDialog(QDialog):
    """Edits a Settings; "Save" writes every field and emits saved(), "Cancel" writes nothing.

    Args:
        settings: what is edited.
        info: the loaded engine, for its voices and languages; None while no model is loaded (then the
            stored names are offered as they are).
        global_key_problem: why the global talk key does not work (the window's), shown under it; None if it does.

    Signals:
        saved(): the settings were written.
        preview_requested(str): play a sample of this voice (the speech model's id for it).
        preview_saved_requested(str): play a sample of this saved voice (its name).
        voice_dialog_opened(VoiceDialog): New voice… opened it; the window has the worker clone what it asks.
        voice_renamed(str, str): a saved voice was renamed (old name, new name) or removed (new name "") just now.
    """

    saved = Signal()
    preview_requested = Signal(str)
    preview_saved_requested = Signal(str)
    voice_dialog_opened = Signal(object)
    voice_renamed = Signal(str, str)

    def __init__(self, settings: Settings, info: AssistantInfo | None, parent: QWidget | None = None, *,
                 global_key_problem: str | None = None):
        super().__init__(parent)
        self.settings = settings
        self._global_key_problem = global_key_problem
        self.info = info
        self.setObjectName("settingsDialog")
        self.setWindowTitle("Settings — Parley")
        tabs = QTabWidget()
        tabs.addTab(self._voice_tab(info), "Voice")
        tabs.addTab(self._listening_tab(), "Listening")
        tabs.addTab(self._assistant_tab(), "Assistant")
        tabs.addTab(self._models_tab(), "Models and engine")
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.save)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(tabs)
        layout.addWidget(buttons)

    # -- tabs ----------------------------------------------------------------------------------------------

    def _voice_tab(self, info: AssistantInfo | None) -> QWidget:
        s = self.settings
        self.speaker = QComboBox(objectName="speaker", accessibleName="Voice")
        self.voice_note = QLabel(objectName="hint", wordWrap=True)
        self.preview = QPushButton("Preview", objectName="previewVoice", accessibleName="Preview the voice")
        self.preview.clicked.connect(self._preview)
        self.new_voice = QPushButton("New voice…", objectName="newVoice",
                                     accessibleName="Make a new voice from a recording")
        self.new_voice.setToolTip("Clone a voice from a few sentences you record, or from a recording")
        self.new_voice.clicked.connect(self.open_voice_dialog)
        self.rename_voice = QPushButton("Rename…", objectName="renameVoice", accessibleName="Rename the saved voice")
        self.rename_voice.clicked.connect(lambda: self.ask_rename(self._saved()))
        self.remove_voice = QPushButton("Remove", objectName="removeVoice", accessibleName="Remove the saved voice")
        self.remove_voice.setToolTip("Delete this saved voice from this computer")
        self.remove_voice.clicked.connect(lambda: self.ask_remove(self._saved()))
        self._speakers = info.speakers if info else ()
        self._first_voice = self._speakers[0] if self._speakers else ""
        self.speaker.currentIndexChanged.connect(self._show_voice)
        self._list_voices(s.saved_voice)
        if info is not None and info.style_kind == "description":
            # kept as stored, for the next CustomVoice model
            self.speaker.setEnabled(False)
            self.preview.setEnabled(False)
            self.speaker.setToolTip("This model has no voices of its own: it speaks as the voice description says")
        self.language = QComboBox(objectName="language")
        self.language.addItem("Automatic", "auto")
        for name in info.languages if info else ():
            if name != "auto":  # the model's own "auto" is the first item's
                self.language.addItem(name.capitalize(), name)
        self._select(self.language, s.language)
        self.style = QLineEdit(s.style, objectName="speakingStyle", clearButtonEnabled=True)
        self.style_note = QLabel(objectName="hint", wordWrap=True)
        kind = info.style_kind if info else None
        self.style.setEnabled(kind is not None)
        if kind == "description":
            self.style.setPlaceholderText(DEFAULT_VOICE_DESCRIPTION)
            self.style_note.setText("This model makes its voice from your description; empty for the one shown.")
        elif kind == "style":
            self.style.setPlaceholderText("How to speak, e.g. cheerful and a little faster")
            self.style_note.setText("Used from Parley's next reply on; empty for a plain voice.")
        elif info is not None and info.saved_voice is not None:
            self.style_note.setText("Not available: a saved voice speaks as it was recorded.")
        else:
            self.style_note.setText("Not available: " + (info.style_unsupported if info else
                                                         "the speech model has not loaded yet."))
        self.output = self._device_box("output", s.output_device)
        voice = QHBoxLayout()
        voice.addWidget(self.speaker, 1)
        voice.addWidget(self.preview)
        mine = QHBoxLayout()
        mine.addWidget(self.new_voice)
        mine.addWidget(self.rename_voice)
        mine.addWidget(self.remove_voice)
        mine.addStretch(1)
        form = QFormLayout()
        form.addRow("Voice", voice)
        form.addRow("", self.voice_note)
        form.addRow("Your voices", mine)
        form.addRow("Language", self.language)
        form.addRow("Voice description" if kind == "description" else "Speaking style", self.style)
        form.addRow("", self.style_note)
        form.addRow("Speakers", self.output)
        return self._page(form)

    def _list_voices(self, saved: str) -> None:
        """Fill the voice list: the model's speakers, then "My voices" (a damaged one shown, but not chosen: its
        tooltip says why); select the saved voice `saved`, else the settings' speaker."""
        self.speaker.blockSignals(True)  # one _show_voice at the end, not one per item
        self.speaker.clear()
        speakers = self._speakers
        self.speaker.addItem(f"{describe(speakers[0]).name} (the model's first voice)" if speakers else
                             "The model's first voice", "")
        for name in speakers:
            self.speaker.addItem(describe(name).name, name)
        stored = self.settings.speaker
        if stored and stored not in speakers:  # a voice of another model: kept selectable rather than dropped
            self.speaker.addItem(stored, stored)
        self.saved_voices = VoiceLibrary().list()
        if self.saved_voices:
            self.speaker.insertSeparator(self.speaker.count())
            self.speaker.addItem("My voices")
            self._disable(self.speaker.count() - 1, "")
            heading = self.speaker.font()
            heading.setBold(True)
            self.speaker.setItemData(self.speaker.count() - 1, heading, Qt.ItemDataRole.FontRole)
        for voice in self.saved_voices:
            self.speaker.addItem(f"{voice.name} (damaged)" if voice.damaged else voice.name)
            self.speaker.setItemData(self.speaker.count() - 1, voice.name, SAVED_ROLE)
            if voice.damaged:
                self._disable(self.speaker.count() - 1, voice.problem)
        index = next((i for i in range(self.speaker.count()) if saved and self.speaker.model().item(i).isEnabled()
                      and same_name(self.speaker.itemData(i, SAVED_ROLE) or "", saved)), -1)
        if index >= 0:
            self.speaker.setCurrentIndex(index)
        else:
            self._select(self.speaker, self.settings.speaker)
        self.speaker.blockSignals(False)
        self._show_voice()

    def _disable(self, index: int, tooltip: str) -> None:
        item = self.speaker.model().item(index)
        item.setEnabled(False)
        item.setToolTip(tooltip)

    def _voice(self) -> str:
        """The chosen speaker's id ("" only while no model is loaded, or where a saved voice is chosen)."""
        return "" if self._saved() else self.speaker.currentData() or self._first_voice

    def _saved(self) -> str:
        """The chosen saved voice's name; "" where a speaker is chosen."""
        return self.speaker.currentData(SAVED_ROLE) or ""

    def _preview(self) -> None:
        if self._saved():
            self.preview_saved_requested.emit(self._saved())
        else:
            self.preview_requested.emit(self._voice())

    def _show_voice(self) -> None:
        """Under the voice: what it sounds like and the language it speaks best, or when a saved voice was made;
        Preview where there is one to hear (the loaded model speaks either the speakers or the saved voices);
        Rename…/Remove for a saved voice."""
        saved = self._saved()
        base_loaded = self.info is not None and self.info.saved_voice is not None
        self.rename_voice.setEnabled(bool(saved))
        self.remove_voice.setEnabled(bool(saved))
        if saved:
            voice = next(v for v in self.saved_voices if v.name == saved)
            saved_on = voice.saved.astimezone()
            self.voice_note.setText(f"Your voice, {MODES[voice.mode]}; saved {saved_on.day} {saved_on:%B %Y}.")
            self.preview.setEnabled(base_loaded)
            self.preview.setToolTip("Hear a short sample of this voice" if base_loaded else
                                    "Save with this voice chosen to hear it: the speech model loaded now speaks in "
                                    "its own voices only")
            self.voice_note.show()
            return
        voice = describe(self._voice()) if self._voice() else None
        self.preview.setEnabled(voice is not None and not base_loaded)
        self.preview.setToolTip("Save with this voice chosen to hear it: the speech model loaded now speaks in your "
                                "saved voices only" if base_loaded else "Hear a short sample of this voice")
        if voice is None:
            self.voice_note.setText("The voices are the speech model's; they are listed once it has loaded.")
        elif voice.description:
            self.voice_note.setText(f"{voice.description}. Speaks {voice.language} best, and every language "
                                    "the model knows.")
        else:
            self.voice_note.setText("")
        self.voice_note.setVisible(bool(self.voice_note.text()))

    # -- saved voices --------------------------------------------------------------------------------------

    def open_voice_dialog(self):
        """New voice…: the dialog that records and clones a voice, over this one, recording from the microphone
        chosen on the Listening tab; the new voice is chosen here once it is saved. Returns the open dialog."""
        from app.voice_dialog import VoiceDialog

        dialog = VoiceDialog(self.input.currentData(), self)
        dialog.cloned.connect(self._list_voices)
        dialog.finished.connect(dialog.deleteLater)
        self.voice_dialog_opened.emit(dialog)
        dialog.open()
        return dialog

    def ask_remove(self, name: str) -> QMessageBox:
        """Ask to confirm removing a saved voice; returns the open message box (Cancel is its default)."""
        return ask_to_confirm(self, "Remove the voice?", f"Remove your voice “{name}”? Its file is deleted from this "
                              "computer; to have it again, record it again.", "Remove", "removeVoice",
                              lambda: self._remove(name))

    def _remove(self, name: str) -> None:
        try:
            VoiceLibrary().remove(name)
        except (ParleyError, OSError) as e:
            QMessageBox.warning(self, "The voice could not be removed", str(e))
            return
        self._list_voices("")
        self.voice_renamed.emit(name, "")

    def ask_rename(self, name: str, new_name: str = "", problem: str = "") -> QInputDialog:
        """Ask for a saved voice's new name; a name that cannot be taken asks again, saying why, with what was
        typed. Returns the open input dialog."""
        dialog = QInputDialog(self, objectName="renameVoiceDialog")
        dialog.setWindowTitle("Rename the voice")
        dialog.setLabelText((f"{problem[:1].upper()}{problem[1:]}\n\n" if problem else "") + f"New name for “{name}”:")
        dialog.setTextValue(new_name or name)
        dialog.setOkButtonText("Rename")
        dialog.textValueSelected.connect(lambda text: self._rename(name, text))
        dialog.finished.connect(dialog.deleteLater)
        dialog.open()
        return dialog

    def _rename(self, name: str, new_name: str) -> None:
        try:
            voice = VoiceLibrary().rename(name, new_name)
        except (ParleyError, OSError) as e:
            self.ask_rename(name, new_name, str(e))
            return
        self._list_voices(voice.name)
        self.voice_renamed.emit(name, voice.name)

    def _listening_tab(self) -> QWidget:
        s = self.settings
        self.mode = QComboBox(objectName="listenMode")
        for mode in LISTEN_MODES:
            self.mode.addItem({"hands-free": "Hands-free (answers when you pause)",
                               "push-to-talk": "Push-to-talk (hold Space)"}[mode], mode)
        self._select(self.mode, s.listen_mode)
        self.turn_detection = QCheckBox("Know when I have finished (end-of-turn detection)",
                                        objectName="turnDetection", checked=s.turn_detection)
        self.turn_detection.setToolTip("Hands-free: after a short pause Parley listens to how you spoke, and reads "
                                       "what you said, to tell whether you have finished; if not, it waits while you "
                                       "think")
        self.longest_pause = QSpinBox(objectName="longestPauseMs", suffix=" ms", singleStep=250)
        self.longest_pause.setRange(*LONGEST_PAUSE_MS_RANGE)
        self.longest_pause.setValue(s.longest_pause_ms)
        self.longest_pause.setToolTip("With end-of-turn detection: the longest pause Parley waits while you think")
        self.silence = QSpinBox(objectName="silenceMs", suffix=" ms", singleStep=100)
        self.silence.setRange(*SILENCE_MS_RANGE)
        self.silence.setValue(s.silence_ms)
        self.silence.setToolTip("Hands-free without end-of-turn detection: how long a pause ends your turn")
        self.turn_detection.toggled.connect(self._show_pauses)
        self._show_pauses(s.turn_detection)
        self.echo = QCheckBox("Echo cancellation (for open speakers)", objectName="echoCancellation",
                              checked=s.echo_cancellation)
        self.echo.setToolTip("Takes Parley's own voice out of the microphone, so it does not interrupt itself. "
                             "With a headset it notices that the microphone does not hear the speakers and "
                             "leaves your voice alone")
        self.input = self._device_box("input", s.input_device)
        self.global_key = QKeySequenceEdit(QKeySequence(s.global_talk_key), objectName="globalTalkKey",
                                           clearButtonEnabled=True, maximumSequenceLength=1)
        self.global_key.setToolTip("Push-to-talk while another app has the focus: hold this key. Empty for none")
        self.global_key_note = QLabel(self._global_key_problem or "Hold it in any app to talk (push-to-talk).",
                                      objectName="hint", wordWrap=True)
        form = QFormLayout()
        form.addRow("Microphone", self.input)
        form.addRow("Mode", self.mode)
        form.addRow("Talk key in any app", self.global_key)
        form.addRow("", self.global_key_note)
        form.addRow("", self.turn_detection)
        form.addRow("Longest pause to think", self.longest_pause)
        form.addRow("Pause that ends a turn (detection off)", self.silence)
        form.addRow("", self.echo)
        return self._page(form)

    def _show_pauses(self, turn_detection: bool) -> None:
        """Only the pause that applies can be changed: the longest one with end-of-turn detection, else the other."""
        self.longest_pause.setEnabled(turn_detection)
        self.silence.setEnabled(not turn_detection)

    def _assistant_tab(self) -> QWidget:
        from engine.llm.chat import DEFAULT_SYSTEM_PROMPT

        self.prompt = QPlainTextEdit(self.settings.system_prompt, objectName="systemPrompt",
                                     accessibleName="System prompt")
        self.prompt.setPlaceholderText(DEFAULT_SYSTEM_PROMPT)
        form = QFormLayout()
        form.addRow(QLabel("System prompt (empty: Parley's own)"))
        form.addRow(self.prompt)
        return self._page(form)

    def _models_tab(self) -> QWidget:
        s = self.settings
        form = QFormLayout()
        self.engine = QComboBox(objectName="speechEngine", accessibleName="Speech engine")
        for data, label in ENGINES:
            self.engine.addItem(label, data)
        self.engine.setToolTip("Where Parley's voice is made: by the speech model on this computer, or by a Parley "
                               "speech server (parley serve) on another one, such as a computer with a GPU")
        self.server_url = QLineEdit(s.speech_server, objectName="speechServer", accessibleName="Speech server address")
        self.server_url.setPlaceholderText(SERVER_EXAMPLE)
        self.server_token = QLineEdit(s.speech_token, objectName="speechToken", accessibleName="Speech server token")
        self.server_token.setEchoMode(QLineEdit.EchoMode.Password)
        self.server_token.setPlaceholderText("none")
        self.test_connection = QPushButton("Test connection", objectName="testConnection",
                                           accessibleName="Test the connection to the speech server")
        self.test_connection.clicked.connect(self._test_connection)
        self.connection_result = QLabel(objectName="hint", wordWrap=True)
        self.connection_result.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self._connection_test, self._testing = ConnectionTest(self), 0
        self._connection_test.finished.connect(self._connection_tested)
        token_row = QHBoxLayout()
        token_row.addWidget(self.server_token, 1)
        token_row.addWidget(self.test_connection)
        server_note = QLabel("The token is kept in Parley's settings file, which only your user account can read. "
                             "The server speaks its own model's voices; your saved voices are spoken on this "
                             "computer only.", objectName="hint", wordWrap=True)
        form.addRow("Speech engine", self.engine)
        form.addRow("Server address", self.server_url)
        form.addRow("Token", token_row)
        form.addRow("", self.connection_result)
        form.addRow("", server_note)
        self._models_form = form
        self._server_rows = (self.server_url, token_row, self.connection_result, server_note)
        self.model_paths = {}
        for key, title, folder in (("tts_model", "Speech model (folder)", True),
                                   ("stt_model", "Speech recognition (folder)", True),
                                   ("llm_model", "Language model (GGUF file)", False)):
            edit = QLineEdit(getattr(s, key), objectName=key, accessibleName=title)
            edit.setPlaceholderText("found automatically")
            browse = QPushButton("Choose…", accessibleName=f"Choose the {title.split(' (')[0].lower()}")
            browse.clicked.connect(lambda _=False, e=edit, f=folder, t=title: self._browse(e, f, t))
            row = QHBoxLayout()
            row.addWidget(edit, 1)
            row.addWidget(browse)
            form.addRow(title, row)
            self.model_paths[key] = edit
            if key == "tts_model":
                self._local_speech = (edit, browse)
        self.device = QComboBox(objectName="engineDevice")
        for device, label in zip(ENGINE_DEVICES, ("Automatic (GPU when there is one)", "GPU (CUDA)", "CPU")):
            self.device.addItem(label, device)
        self._select(self.device, s.device)
        self.precision = QComboBox(objectName="speechPrecision",
                                   accessibleName="How the speech model computes on the CPU")
        labels = {"auto": "Fastest this computer allows", "int8": "8-bit (fast)", "bf16": "bfloat16",
                  "float32": "Exact (float32, slowest)"}
        for precision in SPEECH_PRECISIONS:
            self.precision.addItem(labels[precision], precision)
        self._select(self.precision, s.speech_precision)
        self._local_speech += (self.precision,)  # a server computes as it is set up to
        self.precision.setToolTip("Without an NVIDIA GPU the speech model runs on the CPU: 8-bit weights speak several "
                                  "times faster than the exact arithmetic, at a small cost in fidelity")
        self.theme = QComboBox(objectName="theme")
        for theme in THEMES:
            self.theme.addItem({"system": "As the system", "light": "Light", "dark": "Dark"}[theme], theme)
        self._select(self.theme, s.theme)
        self.close_to_tray = QCheckBox("Keep running in the tray when the window is closed", objectName="closeToTray",
                                       checked=s.close_to_tray)
        self.close_to_tray.setToolTip("Parley stays in the tray (it listens, and the talk key works); "
                                      "Quit in its menu ends it")
        form.addRow("Run on", self.device)
        form.addRow("Speech on the CPU", self.precision)
        form.addRow("Appearance", self.theme)
        form.addRow("", self.close_to_tray)
        self.engine.currentIndexChanged.connect(self._show_engine)
        self._select(self.engine, "server" if s.speech_server else "")
        self._show_engine()
        return self._page(form)

    def _show_engine(self) -> None:
        """The server's fields where a server speaks, the speech model's folder where this computer does."""
        remote = self.engine.currentData() == "server"
        for row in self._server_rows:
            self._models_form.setRowVisible(row, remote)
        self.connection_result.setVisible(remote and bool(self.connection_result.text()))  # no blank line before
        for widget in self._local_speech:
            widget.setEnabled(not remote)
        self._local_speech[0].setPlaceholderText("not used: the server speaks" if remote else "found automatically")

    def _test_connection(self) -> None:
        url = self.server_url.text().strip()
        if not url:
            self._tell_connection(f"Give the server's address, such as {SERVER_EXAMPLE} (parley serve prints it).")
            return
        self._testing = self._connection_test.start(url, self.server_token.text().strip())
        self.test_connection.setEnabled(False)
        self._tell_connection(f"Asking {url}…")

    def _connection_tested(self, number: int, message: str) -> None:
        if number != self._testing:  # a test started since replaces it
            return
        self.test_connection.setEnabled(True)
        self._tell_connection(message[:1].upper() + message[1:])

    def _tell_connection(self, message: str) -> None:
        self.connection_result.setText(message)
        self.connection_result.show()


    # -- saving --------------------------------------------------------------------------------------------

    def save(self) -> None:
        """Write every field, then saved() and close. The widgets offer only values Settings takes; a server chosen
        without its address is not saved, and says so."""
        remote = self.engine.currentData() == "server"
        if remote and not self.server_url.text().strip():
            self._tell_connection(f"Give the server's address, such as {SERVER_EXAMPLE}, or choose This computer.")
            self.server_url.setFocus()
            return
        values = {
            # a saved voice keeps the speaker as it was: Parley speaks as it where the saved voice cannot be spoken
            "speaker": self.settings.speaker if self._saved() else self.speaker.currentData(),
            "saved_voice": self._saved(), "language": self.language.currentData(),
            "style": " ".join(self.style.text().split()),
            "output_device": self.output.currentData(),
            "input_device": self.input.currentData(), "listen_mode": self.mode.currentData(),
            "turn_detection": self.turn_detection.isChecked(), "longest_pause_ms": self.longest_pause.value(),
            "silence_ms": self.silence.value(), "echo_cancellation": self.echo.isChecked(),
            "global_talk_key": self.global_key.keySequence().toString(QKeySequence.SequenceFormat.PortableText),
            "system_prompt": self.prompt.toPlainText().strip(),
            "device": self.device.currentData(), "speech_precision": self.precision.currentData(),
            "theme": self.theme.currentData(),
            "close_to_tray": self.close_to_tray.isChecked(),
            **{key: edit.text().strip() for key, edit in self.model_paths.items()},
            # this computer keeps no server's token: a secret stays only where it is used
            "speech_server": self.server_url.text().strip() if remote else "",
            "speech_token": self.server_token.text().strip() if remote else "",
        }
        for name, value in values.items():
            setattr(self.settings, name, value)
        self.settings.sync()
        self.saved.emit()
        self.accept()

    # -- helpers -------------------------------------------------------------------------------------------

    def _device_box(self, kind: str, stored: str) -> QComboBox:
        from engine.audio import list_devices

        box = QComboBox(objectName=f"{kind}Device")
        box.addItem(DEVICE_DEFAULT, "")
        try:
            names = [d.name for d in list_devices(kind)]
        except AudioDeviceError as e:  # no PortAudio: the stored name is still offered
            names = []
            box.setToolTip(str(e))
        for name in names:
            box.addItem(name, name)
        if stored and stored not in names:  # a device that is unplugged now keeps its setting
            box.addItem(f"{stored} (not connected)", stored)
        self._select(box, stored)
        return box

    def _browse(self, edit: QLineEdit, folder: bool, title: str) -> None:
        path = (QFileDialog.getExistingDirectory(self, title, edit.text()) if folder else
                QFileDialog.getOpenFileName(self, title, edit.text(), "GGUF models (*.gguf)")[0])
        if path:
            edit.setText(path)

    @staticmethod
    def _select(box: QComboBox, value) -> None:
        index = box.findData(value)
        if index < 0:  # a stored name the model does not list: keep it selectable rather than drop it
            box.addItem(str(value), value)
            index = box.count() - 1
        box.setCurrentIndex(index)

    @staticmethod
    def _page(form: QFormLayout) -> QWidget:
        page = QWidget()
        page.setLayout(form)
        return page

