"""The New-voice dialog: the user records a few sentences, or chooses a recording, names the voice, and Save has the
worker clone and save it (app/worker.py EngineWorker.clone_voice, answered by a VoiceCloned event).

The recording is the engine's Recorder (engine/audio/recorder.py: the microphone at its own rate, whole band), read
for a level and a length every METER_INTERVAL_MS on the GUI thread; opening and reading it takes milliseconds.
What the engine refuses (a name taken, a silent or clipped recording, no voice-cloning model) comes back as its
message, shown here with everything the user entered kept.
Object names for the style sheet: QDialog#voiceDialog, QLabel#hint, QLabel#voiceMessage, LevelMeter#levelMeter.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QFont, QFontMetrics
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.errors import ACTIONS, Problem, clone_failed, problem_for
from app.meter import LevelMeter
from app.worker import CloneRequest
from engine.errors import AudioDeviceError, VoiceNameError
from engine.voice_library import MAX_NAME_CHARS, VoiceLibrary, check_name, same_name

# engine/tts/clone.py's MIN_REFERENCE_S and MAX_REFERENCE_S; not imported from there, which imports torch
MIN_RECORDING_S = 3.0
MAX_FILE_S = 30.0
RECORD_MAX_S = 20.0  # people record 5-20 s (engine/tts/clone.py); a longer one adds cost to every reply
METER_INTERVAL_MS = 50  # the level meter's pace: smooth to the eye, and 20 short reads a second
AUDIO_FILES = "Recordings (*.wav *.flac *.mp3 *.ogg)"


class VoiceDialog(QDialog):
    """Records or takes a recording, and asks for it to be cloned under a name.

    Args:
        input_device: the microphone to record from (Settings.input_device: a name, or "" for the default).

    Signals:
        clone_requested(CloneRequest): Save was pressed with a name and a recording; the window has the worker clone
            it and hands the answer to show_result().
        cloned(str): the voice was saved under this name; the dialog closes.
        action_chosen(str): the user asked for the page that fixes the problem shown (a key of app/errors.py ACTIONS).
    """

    clone_requested = Signal(object)
    cloned = Signal(str)
    action_chosen = Signal(str)

    def __init__(self, input_device: str = "", parent: QWidget | None = None):
        super().__init__(parent)
        self.input_device = input_device
        self.recorder = None  # the Recorder while recording
        self.sample: tuple | None = None  # (samples, rate) of a recording, or (path, None) of a file
        self.request: CloneRequest | None = None  # the clone under way
        self.problem: Problem | None = None
        self.setObjectName("voiceDialog")
        self.setWindowTitle("New voice — Parley")

        self.name = QLineEdit(objectName="voiceName", accessibleName="Name of the voice", maxLength=MAX_NAME_CHARS,
                              clearButtonEnabled=True, placeholderText="e.g. My voice")
        self.record_button = QPushButton("&Record", objectName="recordButton", checkable=True,
                                         accessibleName="Record your voice")
        self.record_button.setToolTip("Start recording; press again (Space) to stop")
        self.record_button.toggled.connect(self._record)
        self.level = LevelMeter()
        self.length = QLabel(objectName="hint")
        self.length.setAccessibleName("Length of the recording")
        tip = QLabel(f"Read a few sentences in your normal voice, in a quiet room. It stops by itself at "
                     f"{RECORD_MAX_S:.0f} s.", objectName="hint", wordWrap=True)
        self.choose_button = QPushButton("Choose a &file…", objectName="chooseRecording",
                                         accessibleName="Choose a recording file")
        self.choose_button.setToolTip("A recording of the voice: WAV, FLAC, MP3 or OGG, 3 to 30 seconds")
        self.choose_button.clicked.connect(self.ask_file)
        self.source = QLabel(objectName="voiceSource", wordWrap=True)
        self.source.setAccessibleName("The recording to clone")
        self.text = QPlainTextEdit(objectName="voiceText", accessibleName="What the recording says")
        self.text.setPlaceholderText("Leave empty and Parley writes down what it hears")
        self.text.setTabChangesFocus(True)
        self.text.setFixedHeight(64)
        self.x_vector = QCheckBox("Clone from the sound alone — no transcript, a looser likeness",
                                  objectName="xVector")
        self.x_vector.setToolTip("Parley then learns only the voice's sound, not how it says the recording's words")
        self.x_vector.toggled.connect(lambda on: self.text.setEnabled(not on and self.request is None))
        self.message = QLabel(objectName="voiceMessage", wordWrap=True, textFormat=Qt.TextFormat.RichText)
        self.message.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)  # a command can be copied
        self.busy = QProgressBar(objectName="voiceBusy", accessibleName="Making the voice", textVisible=False)
        self.busy.setRange(0, 0)  # no steps to count: it moves while the worker clones
        self.busy.setMaximumHeight(6)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel)
        self.save_button = self.buttons.button(QDialogButtonBox.StandardButton.Save)
        # the page that fixes the problem shown (Open Models…), apart from Save and Cancel: it leaves the dialog open
        self.action_button = QPushButton(objectName="voiceAction", autoDefault=False)
        self.action_button.clicked.connect(lambda: self.action_chosen.emit(self.problem.action))
        self.buttons.accepted.connect(self.save)
        self.buttons.rejected.connect(self.reject)
        _fit_bold(self.record_button, "Record", "■ Stop")
        _fit_bold(self.buttons.button(QDialogButtonBox.StandardButton.Cancel), "Cancel")  # focused while working
        self._meter = QTimer(self, interval=METER_INTERVAL_MS)
        self._meter.timeout.connect(self._show_recording)

        recording = QHBoxLayout()
        recording.addWidget(self.record_button)
        recording.addWidget(self.level, 1)
        recording.addWidget(self.length)
        file = QHBoxLayout()
        file.addWidget(QLabel("or"))
        file.addWidget(self.choose_button)
        file.addStretch(1)
        form = QFormLayout()
        form.addRow("&Name", self.name)
        form.addRow("Your voice", recording)
        form.addRow("", tip)
        form.addRow("", file)
        form.addRow("", self.source)
        form.addRow("What it &says", self.text)
        form.addRow("", self.x_vector)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.message)
        layout.addWidget(self.busy)
        buttons = QHBoxLayout()
        buttons.addWidget(self.action_button)
        buttons.addWidget(self.buttons, 1)
        layout.addLayout(buttons)
        self.setMinimumWidth(520)
        self._set_working(False)
        self._show_source()
        self._say(None)

    # -- recording -----------------------------------------------------------------------------------------

    def _record(self, on: bool) -> None:
        """Record toggled: start the Recorder on the settings' microphone, or stop it and keep what it recorded."""
        from engine.audio import Recorder

        if on:
            try:
                self.recorder = Recorder(self.input_device or None, max_s=RECORD_MAX_S)
            except AudioDeviceError as e:
                self._say(problem_for(e, "recording"))
                self.record_button.setChecked(False)
                return
            self._say(None)
            self.record_button.setText("■ &Stop")
            self.choose_button.setEnabled(False)
            self.source.setText("Recording… Stop (Space) once you have read a few sentences.")
            self._meter.start()
            self._show_recording()
            return
        if self.recorder is None:  # the device could not be opened
            return
        recorder, self.recorder = self.recorder, None
        self._meter.stop()
        self.level.set_level(float("-inf"))
        self.record_button.setText("&Record")
        self.choose_button.setEnabled(True)
        full = recorder.full
        try:
            samples, rate_hz = recorder.stop()
        except AudioDeviceError as e:
            self._say(problem_for(e, "recording"))
            self._show_source()
            return
        seconds = len(samples) / rate_hz
        if seconds < MIN_RECORDING_S:
            self._say(Problem("That recording is too short", f"It is {seconds:.1f} s long; a voice needs at least "
                              f"{MIN_RECORDING_S:.0f} s.", "Record again and read a few sentences."))
        else:
            self.sample = (samples, rate_hz)
            self._say(Problem("", f"Stopped at {RECORD_MAX_S:.0f} s, enough for a good likeness.", "") if full
                      else None)
        self._show_source()

    def _show_recording(self) -> None:
        """The meter's tick: the level and length so far; at RECORD_MAX_S the recording stops itself."""
        try:
            level = self.recorder.level_dbfs()
        except AudioDeviceError:  # the microphone went away: stopping says so
            self.record_button.setChecked(False)
            return
        self.level.set_level(level)
        self.length.setText(f"{self.recorder.seconds:4.1f} s of 5–20 s")
        if self.recorder.full:
            self.record_button.setChecked(False)

    # -- a file ----------------------------------------------------------------------------------------------

    def ask_file(self) -> QFileDialog:
        """The file chooser for a recording; returns the open dialog."""
        dialog = QFileDialog(self, "Choose a recording of the voice", str(Path.home()))
        dialog.setObjectName("chooseRecordingDialog")
        dialog.setOption(QFileDialog.Option.DontUseNativeDialog)  # styled like Parley, the same everywhere
        dialog.setFileMode(QFileDialog.FileMode.ExistingFile)
        dialog.setNameFilters([AUDIO_FILES, "All files (*)"])
        dialog.fileSelected.connect(lambda path: self.use_file(Path(path)))
        dialog.finished.connect(dialog.deleteLater)
        dialog.open()
        return dialog

    def use_file(self, path: Path) -> None:
        """Take a recording file, once its length is one a voice is cloned from (its header is read, not its sound)."""
        import soundfile

        try:
            seconds = soundfile.info(str(path)).duration
        except (soundfile.LibsndfileError, RuntimeError, OSError) as e:
            self._say(Problem("That file cannot be used", f"{path.name} is not a recording Parley can read ({e}).",
                              "Choose a WAV, FLAC, MP3 or OGG file."))
            return
        if not MIN_RECORDING_S <= seconds <= MAX_FILE_S:
            self._say(Problem("That recording cannot be used", f"{path.name} is {seconds:.1f} s long; a voice is "
                              f"cloned from {MIN_RECORDING_S:.0f} to {MAX_FILE_S:.0f} s of speech.",
                              "Choose another, or record one here."))
            return
        self.sample = (path, None)
        self._say(None)
        self._show_source()

    def _show_source(self) -> None:
        """What will be cloned: the recording made here, or the file chosen, with its length."""
        if self.sample is None:
            self.source.setText("No recording yet.")
            self.length.setText("5–20 s")
        elif self.sample[1] is None:
            import soundfile

            path = self.sample[0]
            self.source.setText(f"Using {path.name}, {soundfile.info(str(path)).duration:.1f} s.")
            self.length.setText("5–20 s")
        else:
            samples, rate_hz = self.sample
            self.source.setText(f"Using your recording, {len(samples) / rate_hz:.1f} s.")
            self.length.setText(f"{len(samples) / rate_hz:4.1f} s of 5–20 s")

    # -- saving ----------------------------------------------------------------------------------------------

    def save(self) -> None:
        """Ask the worker to clone the voice, once the name is free and there is a recording; the dialog shows it is
        working until show_result()."""
        if self.recorder is not None:  # Save while recording: what was said so far is the recording
            self.record_button.setChecked(False)
        try:
            name = check_name(self.name.text())
            taken = next((v.name for v in VoiceLibrary().list() if same_name(v.name, name)), None)
            if taken is not None:  # said now, not after the worker has finished what it is doing
                raise VoiceNameError(f"there is already a saved voice named {taken!r}; choose another name")
        except VoiceNameError as e:
            self._say(clone_failed(e))
            self.name.setFocus()
            return
        if self.sample is None:
            self._say(Problem("Record your voice first", "Record a few sentences, or choose a recording.", ""))
            self.record_button.setFocus()
            return
        audio, rate_hz = self.sample
        self.request = CloneRequest(name, audio, rate_hz, " ".join(self.text.toPlainText().split()),
                                    "x_vector" if self.x_vector.isChecked() else "icl")
        self._say(None)
        self._set_working(True)
        self.clone_requested.emit(self.request)

    def show_result(self, name: str, voice, error: BaseException | None) -> None:
        """The worker's answer (VoiceCloned): saved, the dialog closes (cloned()); failed, it says why and keeps what
        the user entered."""
        self.request = None
        self._set_working(False)
        if voice is not None:
            self.cloned.emit(voice.name)
            self.accept()
            return
        if error is not None:
            self._say(clone_failed(error))
            self.name.setFocus()  # Save is the default button again

    def reject(self) -> None:
        """Cancel or Esc: a recording stops and is dropped; a clone under way is not kept."""
        if self.recorder is not None:
            self._meter.stop()
            self.recorder.close()
            self.recorder = None
        if self.request is not None:
            self.request.cancelled.set()
        super().reject()

    # -- what the dialog shows -------------------------------------------------------------------------------

    def _set_working(self, working: bool) -> None:
        """While the voice is made: a moving bar and a line saying so, every input off but Cancel."""
        for widget in (self.name, self.record_button, self.choose_button, self.x_vector, self.save_button):
            widget.setEnabled(not working)
        self.text.setEnabled(not working and not self.x_vector.isChecked())
        self.busy.setVisible(working)
        if working:
            self.message.setText("Making the voice… Parley listens to the recording and learns its sound: a few "
                                 "seconds, longer the first time, while the voice-cloning model loads.")
            self.message.show()
            self.action_button.hide()
        self.adjustSize()

    def _say(self, problem: Problem | None) -> None:
        """Show a problem (or a note: a Problem without a headline) under the inputs; None clears it."""
        self.problem = problem
        self.message.setVisible(problem is not None)
        self.message.setText(problem.html(headline=bool(problem.headline)) if problem is not None else "")
        action = problem.action if problem is not None else None
        self.action_button.setVisible(action is not None)
        if action is not None:
            self.action_button.setText(ACTIONS[action])
        self.adjustSize()  # a long message (a download command) is shown whole, not squeezed


def _fit_bold(button: QPushButton, *texts: str) -> None:
    """Make a button wide enough for each text in the bold the style sheet gives a focused (default) button, so no
    text is cut when it takes the focus."""
    bold = QFont(button.font())
    bold.setWeight(QFont.Weight.DemiBold)
    button.setMinimumWidth(max(QFontMetrics(bold).horizontalAdvance(text) for text in texts) + 40)
