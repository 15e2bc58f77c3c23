"""The settings dialog: voice, language, speaking style, sound devices, listening, system prompt, model
paths, GPU/CPU and theme, written to Settings (app/settings.py) when the user saves.

The voices and languages offered are the loaded model's (AssistantInfo, engine/assistant.py); the devices are
PortAudio's (engine/audio/devices.py). The window applies what was saved without a restart where it
can: the voice, the listening and the prompt at once, models and devices by reloading them.
"""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QKeySequenceEdit,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.settings import THEMES, Settings
from engine.assistant import DEFAULT_VOICE_DESCRIPTION, AssistantInfo
from engine.errors import AudioDeviceError
from engine.settings import ENGINE_DEVICES, LISTEN_MODES, LONGEST_PAUSE_MS_RANGE, SILENCE_MS_RANGE
from engine.voices import describe

DEVICE_DEFAULT = "System default"


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
    """

    saved = Signal()
    preview_requested = Signal(str)

    def __init__(self, settings: Settings, info: AssistantInfo | None, parent: QWidget | None = None, *,
                 global_key_problem: str | None = None):
        super().__init__(parent)
        self.settings = settings
        self._global_key_problem = global_key_problem
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
        speakers = info.speakers if info else ()
        self.speaker.addItem(f"{describe(speakers[0]).name} (the model's first voice)" if speakers else
                             "The model's first voice", "")
        for name in speakers:
            self.speaker.addItem(describe(name).name, name)
        self._select(self.speaker, s.speaker)
        self.voice_note = QLabel(objectName="hint", wordWrap=True)
        self.preview = QPushButton("Preview", objectName="previewVoice", accessibleName="Preview the voice")
        self.preview.setToolTip("Hear a short sample of this voice")
        self.preview.clicked.connect(lambda: self.preview_requested.emit(self._voice()))
        self.speaker.currentIndexChanged.connect(self._show_voice)
        self._first_voice = speakers[0] if speakers else ""
        self._show_voice()
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
        else:
            self.style_note.setText("Not available: " + (info.style_unsupported if info else
                                                         "the speech model has not loaded yet."))
        self.output = self._device_box("output", s.output_device)
        voice = QHBoxLayout()
        voice.addWidget(self.speaker, 1)
        voice.addWidget(self.preview)
        form = QFormLayout()
        form.addRow("Voice", voice)
        form.addRow("", self.voice_note)
        form.addRow("Language", self.language)
        form.addRow("Voice description" if kind == "description" else "Speaking style", self.style)
        form.addRow("", self.style_note)
        form.addRow("Speakers", self.output)
        return self._page(form)

    def _voice(self) -> str:
        """The chosen voice's id ("" only while no model is loaded)."""
        return self.speaker.currentData() or self._first_voice

    def _show_voice(self) -> None:
        """Under the voice: what it sounds like and the language it speaks best; Preview where there is one to hear."""
        voice = describe(self._voice()) if self._voice() else None
        self.preview.setEnabled(voice is not None)
        if voice is None:
            self.voice_note.setText("The voices are the speech model's; they are listed once it has loaded.")
        elif voice.description:
            self.voice_note.setText(f"{voice.description}. Speaks {voice.language} best, and every language "
                                    "the model knows.")
        else:
            self.voice_note.setText("")
        self.voice_note.setVisible(bool(self.voice_note.text()))

    def _listening_tab(self) -> QWidget:
        s = self.settings
        self.mode = QComboBox(objectName="listenMode")
        for mode in LISTEN_MODES:
            self.mode.addItem({"hands-free": "Hands-free (answers when you pause)",
                               "push-to-talk": "Push-to-talk (hold Space)"}[mode], mode)
        self._select(self.mode, s.listen_mode)
        self.turn_detection = QCheckBox("Know when I have finished (end-of-turn detection)",
                                        objectName="turnDetection", checked=s.turn_detection)
        self.turn_detection.setToolTip("Hands-free: after a short pause Parley listens to how you spoke to tell "
                                       "whether you have finished; if not, it waits while you think")
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
        self.device = QComboBox(objectName="engineDevice")
        for device, label in zip(ENGINE_DEVICES, ("Automatic (GPU when there is one)", "GPU (CUDA)", "CPU")):
            self.device.addItem(label, device)
        self._select(self.device, s.device)
        self.theme = QComboBox(objectName="theme")
        for theme in THEMES:
            self.theme.addItem({"system": "As the system", "light": "Light", "dark": "Dark"}[theme], theme)
        self._select(self.theme, s.theme)
        self.close_to_tray = QCheckBox("Keep running in the tray when the window is closed", objectName="closeToTray",
                                       checked=s.close_to_tray)
        self.close_to_tray.setToolTip("Parley stays in the tray (it listens, and the talk key works); "
                                      "Quit in its menu ends it")
        form.addRow("Run on", self.device)
        form.addRow("Appearance", self.theme)
        form.addRow("", self.close_to_tray)
        return self._page(form)

    # -- saving --------------------------------------------------------------------------------------------

    def save(self) -> None:
        """Write every field, then saved() and close. The widgets offer only values Settings takes."""
        values = {
            "speaker": self.speaker.currentData(), "language": self.language.currentData(),
            "style": " ".join(self.style.text().split()),
            "output_device": self.output.currentData(),
            "input_device": self.input.currentData(), "listen_mode": self.mode.currentData(),
            "turn_detection": self.turn_detection.isChecked(), "longest_pause_ms": self.longest_pause.value(),
            "silence_ms": self.silence.value(), "echo_cancellation": self.echo.isChecked(),
            "global_talk_key": self.global_key.keySequence().toString(QKeySequence.SequenceFormat.PortableText),
            "system_prompt": self.prompt.toPlainText().strip(),
            "device": self.device.currentData(), "theme": self.theme.currentData(),
            "close_to_tray": self.close_to_tray.isChecked(),
            **{key: edit.text().strip() for key, edit in self.model_paths.items()},
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

