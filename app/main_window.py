"""Parley's main window: the conversation, the talk/mute/stop controls, the text box, the latency meter.

A thin view: it owns an EngineWorker in a QThread (app/worker.py) and talks to it only through
signals; what the engine says comes back as its events (engine/events.py), through the worker's one signal.
Keys: hold Space to talk (push-to-talk; Ctrl+Space while typing in the text box), Enter sends, Ctrl+Enter speaks the
text as typed, Esc stops, Ctrl+M mutes, Ctrl+, opens the settings, Ctrl+H the history, F1 About Parley / Privacy.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from PySide6.QtCore import QEvent, QEventLoop, QObject, QStandardPaths, Qt, QThread, QTimer, Signal
from PySide6.QtGui import QAction, QGuiApplication, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QAbstractSpinBox,
    QApplication,
    QCheckBox,
    QComboBox,
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMainWindow,
    QMenu,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSystemTrayIcon,
    QTextEdit,
    QVBoxLayout,
    QWidget,
)

from app.chat_view import ChatView
from app.errors import (ACTIONS, ErrorDialog, Problem, erase_failed, problem_for, saved_voice_off, unknown_voice,
                        voice_off)
from app.global_key import GlobalKeyError, GlobalTalkKey, unavailable
from app.meter import LatencyMeter
from app.settings import Settings
from app.worker import EngineWorker
from engine.assistant import AssistantInfo
from engine.voices import describe
from engine.events import (ConversationEnded, DeviceLost, DeviceRestored, Figures, Heard, HistoryErased, Level,
                           Loading, LoadFailed, Measured, Notice, Partial, Ready, ReplyText, SavedVoicesErased,
                           SavedVoiceUnavailable, SpeakingClause, StateChanged, TurnFailed, TurnFinished, VoiceCloned,
                           VoiceInputOff, VoiceNotFound)

STATE_TEXT = {
    "listening": "Listening", "hearing": "Hearing you…", "thinking": "Thinking…", "speaking": "Speaking",
    "idle": "Ready", "muted": "Muted",
}
# hands-free, the talk button says what the loop is doing and what the user may do
HANDS_FREE_TEXT = {
    "listening": "Listening — just speak", "hearing": "Hearing you…", "thinking": "Thinking…",
    "speaking": "Speaking — talk to interrupt", "muted": "Muted — unmute to talk", "idle": "Listening — just speak",
}
SHUTDOWN_WAIT_MS = 15_000  # a turn under way stops at its next TTS frame; loading may take longer
# X11's key auto-repeat reports a held key as release-press pairs a few ms apart once Qt stops marking them as
# repeats: a release is acted on only when no press follows within this long
KEY_RELEASE_DEBOUNCE_MS = 60


class MessageBox(QPlainTextEdit):
    """The text box: Enter sends, Ctrl+Enter speaks the text as typed, Shift+Enter starts a new line.

    Signals:
        send(str), speak(str): the text, stripped; the box is cleared by the window once it is taken.
    """

    send = Signal(str)
    speak = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("messageBox")
        self.setPlaceholderText("Type to Parley — Enter sends, Ctrl+Enter speaks it as written")
        self.setAccessibleName("Message to Parley")
        self.setAccessibleDescription("Enter asks Parley, Ctrl+Enter has Parley say it as written, Shift+Enter "
                                      "starts a new line; Space talks while the box is empty")
        self.setTabChangesFocus(True)
        self.setFixedHeight(64)

    def keyPressEvent(self, event) -> None:
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) \
                and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
            text = self.toPlainText().strip()
            if text:
                (self.speak if event.modifiers() & Qt.KeyboardModifier.ControlModifier else self.send).emit(text)
            return
        super().keyPressEvent(event)


class NoticeBar(QFrame):
    """A line above the conversation for a Problem that does not stop it (no microphone, no GPU),
    with a button to the page that fixes it and one to dismiss it."""

    action_chosen = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("noticeBar")
        self.label = QLabel(wordWrap=True, textFormat=Qt.TextFormat.RichText)  # Problem.html()
        self.button = QPushButton()
        self.button.clicked.connect(lambda: self.action_chosen.emit(self.problem.action))
        dismiss = QPushButton("Dismiss")
        dismiss.clicked.connect(self.hide)
        layout = QHBoxLayout(self)
        layout.addWidget(self.label, 1)
        layout.addWidget(self.button)
        layout.addWidget(dismiss)
        self.problem: Problem | None = None
        self.hide()

    def show_problem(self, problem: Problem) -> None:
        self.problem = problem
        self.label.setText(problem.html())
        self.button.setVisible(problem.action is not None)
        if problem.action is not None:
            self.button.setText(ACTIONS[problem.action])
        self.show()


class MainWindow(QMainWindow):
    """The window. Construct it, show() it, then start_engine(): the models load in the worker while
    the window is already up.

    Args:
        settings: where the user's choices live (app/settings.py).
        history_file: the conversation store; None is the default profile's.
        chat_options: how the LLM runs (engine/llm/chat.py ChatOptions: threads, sampling); None is
            ChatOptions().
    """

    # requests to the worker (queued into its thread)
    load_requested = Signal(object)  # AssistantConfig
    apply_requested = Signal(object)  # AssistantConfig
    send_requested = Signal(str)
    speak_requested = Signal(str)
    preview_requested = Signal(str)  # a voice's id, from the settings' Preview
    preview_saved_requested = Signal(str)  # a saved voice's name, from the settings' Preview
    clone_requested = Signal(object, object)  # CloneRequest, AssistantConfig: the New-voice dialog's Save
    erase_voices_requested = Signal()  # the About page's "Erase all saved voices"
    press_requested = Signal()
    release_requested = Signal()
    stop_requested = Signal()
    mute_requested = Signal(bool)
    mode_requested = Signal(str)
    open_requested = Signal(int)
    new_requested = Signal()
    deleted_requested = Signal(int)
    forget_requested = Signal(object)  # Path of the history file to delete
    shutdown_requested = Signal()

    def __init__(self, settings: Settings, history_file=None, chat_options=None, parent: QWidget | None = None):
        super().__init__(parent)
        self.settings = settings
        self.history_file = history_file
        self.chat_options = chat_options
        self.info: AssistantInfo | None = None  # the loaded engine; None while loading or after a failure
        self.state = "idle"
        self.dialog: ErrorDialog | None = None  # the error dialog on screen, if any
        self.history_view = None  # made on first use, with the GUI thread's own HistoryStore
        self.models_page = None  # made on first use
        self.about_page = None  # made on first use
        self.voice_dialog = None  # the New-voice dialog while it is open: the microphone is held muted meanwhile
        self._cloning = None  # the CloneRequest the worker is on, until its VoiceCloned comes back
        self._history_was_open = False  # the history view was on screen when all history was deleted
        self._talking = False  # Space, the global talk key or the talk button is held
        self.global_key: GlobalTalkKey | None = None
        self.global_key_problem: str | None = None  # why the global talk key of the settings does not work
        self._lost_devices: dict[str, Problem] = {}  # "output"/"input" -> its Problem, until it is back
        self.setWindowTitle("Parley")
        self.resize(960, 640)
        self.setMinimumHeight(480)  # below this the conversation shows barely two bubbles
        self._quitting = False  # Quit was chosen: closing the window ends Parley even with close_to_tray
        self._told_tray = False  # the tray said once that Parley runs on there
        self._build()
        self._build_menus()
        self.tray = self._build_tray()
        self.restoreGeometry(settings.window_geometry)  # where the user left it (Qt keeps it on a screen)

        self._thread = QThread(self)
        self.worker = EngineWorker()
        self.worker.moveToThread(self._thread)
        self._connect_worker()
        QApplication.instance().installEventFilter(self)  # Space as push-to-talk wherever focus is
        self._release = QTimer(self, singleShot=True, interval=KEY_RELEASE_DEBOUNCE_MS)
        self._release.timeout.connect(self._talk_up)
        self._grab_global_key()

    # -- building -------------------------------------------------------------------------------------

    def _build(self) -> None:
        self.chat = ChatView()
        self.chat.save_audio_requested.connect(self.save_reply_audio)
        self.notice = NoticeBar()
        self.notice.action_chosen.connect(self._act)
        self.meter = LatencyMeter()

        self.talk_button = QPushButton("Hold to talk", objectName="talkButton")
        self.talk_button.setMinimumHeight(56)
        self.talk_button.setToolTip("Hold the button, or hold Space (Ctrl+Space while typing), while you speak")
        self.talk_button.setAccessibleDescription("Push-to-talk: hold it, or Space, while you speak. Hands-free, it "
                                                  "says what Parley is doing")
        self.talk_button.pressed.connect(self._talk_down)
        self.talk_button.released.connect(self._talk_up)
        self.hands_free = QCheckBox("Hands-free", objectName="handsFree")
        self.hands_free.setToolTip("Parley listens all the time and answers when you pause")
        self.hands_free.setChecked(self.settings.listen_mode == "hands-free")
        self.hands_free.toggled.connect(self._set_hands_free)
        self.mute_button = QPushButton("Mute", objectName="muteButton", checkable=True)
        self.mute_button.setToolTip("Mute the microphone (Ctrl+M)")
        self.mute_button.toggled.connect(self._set_muted)
        self.stop_button = QPushButton("Stop", objectName="stopButton")
        self.stop_button.setToolTip("Stop speaking now (Esc)")
        self.stop_button.clicked.connect(self.stop_requested)

        self.message = MessageBox()
        self.message.send.connect(self._send)
        self.message.speak.connect(self._speak)
        self.send_button = QPushButton("Send", objectName="sendButton")
        self.send_button.setDefault(True)  # the primary action: styled as such (QPushButton:default)
        self.send_button.setToolTip("Ask Parley (Enter)")
        self.send_button.clicked.connect(lambda: self._take_text(self._send))
        self.speak_button = QPushButton("Speak", objectName="speakButton")
        self.speak_button.setToolTip("Speak the text as written, without asking the assistant (Ctrl+Enter)")
        self.speak_button.clicked.connect(lambda: self._take_text(self._speak))

        controls = QHBoxLayout()
        controls.addWidget(self.talk_button, 3)
        controls.addWidget(self.hands_free)
        controls.addWidget(self.mute_button)
        controls.addWidget(self.stop_button)
        typing = QHBoxLayout()
        typing.addWidget(self.message, 1)
        buttons = QVBoxLayout()
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.speak_button)
        typing.addLayout(buttons)
        left = QVBoxLayout()
        left.addWidget(self.notice)
        left.addWidget(self.chat, 1)
        left.addLayout(controls)
        left.addLayout(typing)
        body = QHBoxLayout()
        body.addLayout(left, 1)
        body.addWidget(self.meter)
        central = QWidget(objectName="central")
        central.setLayout(body)
        self.setCentralWidget(central)

        self.state_label = QLabel(objectName="stateLabel")
        self.load_bar = QProgressBar(objectName="loadBar", accessibleName="Loading the models")
        self.load_bar.setMaximumWidth(220)
        self.load_bar.hide()
        self.statusBar().addWidget(self.state_label, 1)
        self.statusBar().addPermanentWidget(self.load_bar)
        self._show_state("idle", text="Starting…")
        self._update_talk_button()

    def _build_menus(self) -> None:
        def action(menu, text, slot, shortcut=None, checkable=False) -> QAction:
            act = QAction(text, self, checkable=checkable)
            if shortcut:
                act.setShortcut(QKeySequence(shortcut))
                act.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
            (act.toggled if checkable else act.triggered).connect(slot)
            menu.addAction(act)
            return act

        conversation = self.menuBar().addMenu("&Conversation")
        self.new_action = action(conversation, "&New conversation", self._new_conversation, "Ctrl+N")
        self.history_action = action(conversation, "&History…", self.open_history, "Ctrl+H")
        self.stop_action = action(conversation, "&Stop speaking", self.stop_requested, "Esc")
        self.mute_action = action(conversation, "&Mute microphone", self.mute_button.setChecked, "Ctrl+M", True)
        self.mute_button.toggled.connect(self.mute_action.setChecked)
        self.save_audio_action = action(conversation, "Save reply &audio…", lambda: self.save_reply_audio(),
                                        "Ctrl+Shift+S")
        conversation.addSeparator()
        self.quit_action = action(conversation, "&Quit", self.quit, QKeySequence.StandardKey.Quit)
        tools = self.menuBar().addMenu("&Settings")
        self.settings_action = action(tools, "&Settings…", self.open_settings, "Ctrl+,")
        self.models_action = action(tools, "&Models…", self.open_models)
        help_menu = self.menuBar().addMenu("&Help")
        self.about_action = action(help_menu, "&About Parley / Privacy", self.open_about, "F1")

    def _build_tray(self) -> QSystemTrayIcon | None:
        """The tray icon, where the desktop has a tray: a click shows or hides the window; its menu too, and mutes
        and quits. None where there is no tray."""
        if not QSystemTrayIcon.isSystemTrayAvailable():
            return None
        from app.style import app_icon

        tray = QSystemTrayIcon(app_icon(), self, toolTip="Parley")
        menu = QMenu(self)
        self.show_action = menu.addAction("Hide Parley", self._toggle_shown)
        menu.aboutToShow.connect(lambda: self.show_action.setText("Hide Parley" if self.isVisible() else
                                                                  "Show Parley"))
        menu.addAction(self.mute_action)
        menu.addSeparator()
        menu.addAction(self.quit_action)
        tray.setContextMenu(menu)
        tray.activated.connect(lambda reason: self._toggle_shown()
                               if reason == QSystemTrayIcon.ActivationReason.Trigger else None)
        tray.show()
        return tray

    def _toggle_shown(self) -> None:
        if self.isVisible() and self.isActiveWindow():
            self.hide()
        else:
            self.showNormal()
            self.raise_()
            self.activateWindow()

    def quit(self) -> None:
        """Ends Parley, also where closing the window would leave it in the tray."""
        self._quitting = True
        self.close()

    def _connect_worker(self) -> None:
        w = self.worker
        self.load_requested.connect(w.load)
        self.apply_requested.connect(w.apply)
        self.send_requested.connect(w.send)
        self.speak_requested.connect(w.speak)
        self.preview_requested.connect(w.preview_voice)
        self.preview_saved_requested.connect(w.preview_saved_voice)
        self.clone_requested.connect(w.clone_voice)
        self.erase_voices_requested.connect(w.erase_saved_voices)
        self.press_requested.connect(w.press)
        self.release_requested.connect(w.release)
        self.stop_requested.connect(w.stop)
        self.mute_requested.connect(w.set_muted)
        self.mode_requested.connect(w.set_mode)
        self.open_requested.connect(w.open_conversation)
        self.new_requested.connect(w.new_conversation)
        self.deleted_requested.connect(w.conversation_deleted)
        self.forget_requested.connect(w.delete_history)
        self.shutdown_requested.connect(w.shutdown)
        # a bound method of the window, never a lambda: the worker emits from the engine's threads, and only a
        # receiver object makes Qt queue the call into the GUI thread
        w.event.connect(self._engine_event)

    def _engine_event(self, event) -> None:
        """One of the assistant's events (engine/events.py), in the GUI thread."""
        match event:
            case Loading():
                self._show_progress(event.label or event.step, event.done, event.total)
            case Ready():
                self._engine_ready(event.info)
            case LoadFailed():
                self._engine_failed(problem_for(event.error, f"loading the {event.step}"))
            case Notice():
                self.notice.show_problem(problem_for(event.error, event.doing))
            case VoiceInputOff():
                self.notice.show_problem(voice_off(event.error, event.doing))
            case VoiceNotFound():
                self.notice.show_problem(unknown_voice(event.speaker, event.speakers, event.used))
            case SavedVoiceUnavailable():
                self.notice.show_problem(saved_voice_off(event.name, event.message, event.error))
            case VoiceCloned():
                self._voice_cloned(event)
            case SavedVoicesErased():
                self._voices_erased(event)
            case Level():
                self.meter.set_level(event.rms_dbfs)
            case StateChanged():
                self._show_state(event.state)
            case Partial():
                self.chat.show_partial(event.text)
            case Heard():
                self.chat.add_user(event.text)
            case ReplyText():
                self.chat.reply_text(event.text)
            case SpeakingClause():
                self.chat.speaking_clause(event.text, event.index)
            case TurnFinished():
                result = event.result
                self.chat.finish_reply(result.reply_text, result.interrupted, (result.audio, result.audio_rate_hz))
            case TurnFailed():
                self._turn_failed(problem_for(event.error, "answering"))
            case DeviceLost():
                self._device_lost(event.kind, problem_for(event.error, "speaking"))
            case DeviceRestored():
                self._device_restored(event.kind, event.message)
            case Measured():
                self.meter.show_figure(event.turn, event.name, event.value)
            case Figures():
                self.meter.show_turn(event.metrics, event.summary)
            case ConversationEnded():
                self.chat.clear()
            case HistoryErased():
                self._history_deleted(None if event.error is None else erase_failed(event.error))

    # -- the engine --------------------------------------------------------------------------------------

    def start_engine(self) -> None:
        """Start the worker's thread and load the models named in the settings (progress in the status bar)."""
        if not self._thread.isRunning():
            self._thread.start()
        self.info = None
        self.load_bar.setRange(0, 0)  # busy until the worker names its first step
        self.load_bar.show()
        self._show_state("loading", text="Loading…")
        self._update_talk_button()
        self.load_requested.emit(self._config())

    def _config(self):
        return self.settings.assistant_config(self.history_file, self.chat_options)

    def _show_progress(self, step: str, done: int, total: int) -> None:
        loading = done < total
        self.load_bar.setRange(0, total)
        self.load_bar.setValue(done)
        self.load_bar.setVisible(loading)
        if loading:  # the bar is a thin line: the step is named where the state is, in words
            self._show_state("loading", text=f"Loading the {step}…")
        self._update_talk_button()

    def _engine_ready(self, info: AssistantInfo) -> None:
        self.info = info
        self.load_bar.hide()
        # muted while the models loaded, or a voice is being recorded: the new loop starts muted too
        if self.mute_button.isChecked() or self._microphone_held():
            self.mute_requested.emit(True)
        mic = info.microphone or "no microphone"
        kernel = " without its fast kernel" if info.megakernel_problem else ""
        if info.device == "cpu" and info.speech_precision:  # which of the CPU's paths: int8, bfloat16 or float32
            kernel = f" ({info.speech_precision.split(',')[0]})"
        voice = (f"your voice “{info.saved_voice}”" if info.saved_voice else
                 f"voice {describe(info.speaker).name}" if info.speaker else "voice from its description")
        where = info.speech_server or f"{info.device.upper()}{kernel}"
        self.statusBar().showMessage(f"{info.tts_model.name} on {where}, {voice}; {mic}", 8000)
        self._tell_megakernel_problem(info)
        self._update_talk_button()

    def _tell_megakernel_problem(self, info: AssistantInfo) -> None:
        """Speech runs without the megakernel: said once per reason, and not over a notice still on screen
        (that one matters more now; this one waits for the next start). Once the kernel runs, a reason that
        comes back later is new again."""
        reason = info.megakernel_problem
        if not reason:
            if info.device == "cuda" and self.settings.megakernel_notice:
                self.settings.megakernel_notice = ""
            return
        if reason == self.settings.megakernel_notice or not self.notice.isHidden():
            return
        self.settings.megakernel_notice = reason
        self.notice.show_problem(Problem(
            "Speech runs without Parley's fast GPU kernel", reason,
            "Speech still works, but much slower, and may stutter. Where the reason is a missing CUDA compiler, "
            "installing the NVIDIA CUDA toolkit and starting Parley again brings the kernel. This note is shown once."))

    def _engine_failed(self, problem: Problem) -> None:
        self.info = None
        self.load_bar.hide()
        self._show_state("idle", text="Not ready: " + problem.headline)
        self._update_talk_button()
        if problem.action == "models":  # the first run, or a model moved: the page that fixes it, at once
            self.notice.show_problem(problem)
            self.open_models()
        else:
            self.show_problem(problem)

    def _turn_failed(self, problem: Problem) -> None:
        self.chat.fail_turn(f"{problem.headline}: {problem.detail}")
        if problem.action is not None:  # a device or a model needs the user; "heard no words" does not
            self.show_problem(problem)

    def _device_lost(self, kind: str, problem: Problem) -> None:
        self._lost_devices[kind] = problem
        self.notice.show_problem(problem)

    def _device_restored(self, kind: str, message: str) -> None:
        problem = self._lost_devices.pop(kind, None)
        if problem is not None and self.notice.problem is problem and not self.notice.isHidden():
            if self._lost_devices:  # the other device is still out: its notice comes back
                self.notice.show_problem(next(iter(self._lost_devices.values())))
            else:
                self.notice.hide()
        self.statusBar().showMessage(message[0].upper() + message[1:], 8000)

    def save_reply_audio(self, bubble=None) -> QFileDialog | None:
        """Ask where to save a reply's audio as WAV (the newest reply's where `bubble` is None); returns the open
        dialog, or None when no reply's audio is kept."""
        bubble = bubble or self.chat.last_audio()
        if bubble is None or bubble.audio is None:
            self.statusBar().showMessage("No reply's audio to save yet: Parley keeps the audio of its replies in "
                                         "this conversation", 5000)
            return None
        folder = (QStandardPaths.writableLocation(QStandardPaths.StandardLocation.MusicLocation)
                  or QStandardPaths.writableLocation(QStandardPaths.StandardLocation.DocumentsLocation))
        name = datetime.now().strftime("Parley reply %Y-%m-%d %H.%M.wav")
        dialog = QFileDialog(self, "Save the reply's audio", str(Path(folder or Path.home()) / name))
        dialog.setObjectName("saveAudioDialog")
        dialog.setAcceptMode(QFileDialog.AcceptMode.AcceptSave)
        dialog.setNameFilters(["WAV audio (*.wav)"])
        dialog.setDefaultSuffix("wav")
        dialog.setOption(QFileDialog.Option.DontUseNativeDialog)  # styled like Parley, the same everywhere
        audio = bubble.audio
        dialog.fileSelected.connect(lambda path: self._write_audio(Path(path), *audio))
        dialog.finished.connect(dialog.deleteLater)
        dialog.open()
        return dialog

    def _write_audio(self, path: Path, samples, rate_hz: int) -> None:
        from engine.audio.wav import write_wav

        try:
            write_wav(path, samples, rate_hz)
        except OSError as e:
            self.show_problem(problem_for(e, "saving the audio"))
            return
        self.statusBar().showMessage(f"Saved the reply's audio ({len(samples) / rate_hz:.1f} s) to {path}", 8000)

    def show_problem(self, problem: Problem) -> ErrorDialog:
        """The problem as a window-modal dialog whose button leads to the page that fixes it."""
        if self.dialog is not None:
            self.dialog.close()
        self.dialog = ErrorDialog(problem, self)
        self.dialog.action_chosen.connect(self._act)
        self.dialog.open()
        return self.dialog

    def _act(self, action: str) -> None:
        self.open_settings() if action == "settings" else self.open_models()

    # -- requests -----------------------------------------------------------------------------------------

    def _take_text(self, handler) -> None:
        text = self.message.toPlainText().strip()
        if text:
            handler(text)

    def _send(self, text: str) -> None:
        if self._not_ready():
            return
        self.message.clear()
        self.chat.add_user(text)
        self.send_requested.emit(text)

    def _speak(self, text: str) -> None:
        if self._not_ready():
            return
        self.message.clear()
        self.chat.add_as_written(text)  # Parley's bubble, marked: what it says is the user's text, not a reply
        self.speak_requested.emit(text)

    def _not_ready(self) -> bool:
        """Nothing is sent while the models load: the text stays in the box, and the status bar says why."""
        if self.info is None:
            self.statusBar().showMessage("Parley is not ready yet; your text stays in the box", 5000)
            return True
        return False

    def _talk_down(self) -> None:
        voice = self.info is not None and self.info.microphone is not None
        if not self._talking and voice and not self.hands_free.isChecked():
            self._talking = True
            self.press_requested.emit()

    def _talk_up(self) -> None:
        if self._talking:
            self._talking = False
            self.release_requested.emit()

    def _set_hands_free(self, on: bool) -> None:
        mode = "hands-free" if on else "push-to-talk"
        self.settings.listen_mode = mode
        self._talk_up()
        if self.info is not None:
            self.mode_requested.emit(mode)
        self._update_talk_button()

    def _set_muted(self, muted: bool) -> None:
        self.mute_button.setText("Unmute" if muted else "Mute")
        if self.info is not None:
            self.mute_requested.emit(muted)

    def _new_conversation(self) -> None:
        self.chat.clear()
        self.setWindowTitle("Parley")
        if self.info is not None:
            self.new_requested.emit()

    def open_models(self):
        """The Models page (app/models_page.py); a changed model reloads the engine."""
        from app.models_page import ModelsPage

        if self.models_page is None:
            self.models_page = ModelsPage(self.settings.store, self)
            self.models_page.modelsChanged.connect(self._models_changed)
            self._present(self.models_page, 760, 640)
        else:
            self.models_page.refresh()
            self._present(self.models_page)
        return self.models_page

    def _models_changed(self) -> None:
        self.notice.hide()
        if self._thread.isRunning():
            self.start_engine()

    def open_history(self):
        """The history window (app/history_view.py) over this thread's own connection to the store."""
        from app.history_view import HistoryView
        from engine.errors import HistoryError
        from engine.history import HistoryStore

        if self.history_view is None:
            try:
                store = HistoryStore(self._history_path())
            except HistoryError as e:
                self.show_problem(problem_for(e, "opening the history"))
                return None
            self.history_view = HistoryView(store, self)
            self.history_view.reopen.connect(self._reopen)
            self.history_view.deleted.connect(self._deleted)
            self._present(self.history_view, 720, 480)
        else:
            self._present(self.history_view)
        return self.history_view

    def _reopen(self, conversation_id: int) -> None:
        from engine.errors import HistoryError

        try:
            conversation = self.history_view.store.open_conversation(conversation_id)
        except HistoryError as e:
            self.show_problem(problem_for(e, "reopening the conversation"))
            return
        self.chat.show_turns(conversation.turns)
        self.setWindowTitle(f"{conversation.title or 'Conversation'} — Parley")
        self.history_view.hide()
        if self.info is not None:
            self.open_requested.emit(conversation_id)

    def _deleted(self, conversation_id: int) -> None:
        if self.info is not None:  # the worker starts afresh if it was saving to that one
            self.deleted_requested.emit(conversation_id)

    def open_about(self):
        """The About / Privacy window (app/about_page.py): what is stored where, licences, delete all history."""
        from app.about_page import AboutPage

        if self.about_page is None:
            self.about_page = AboutPage(self.settings.store, self._history_path(), self)
            self.about_page.delete_history.connect(self._delete_history)
            self.about_page.erase_voices.connect(self._erase_voices)
            self._present(self.about_page, 760, 620)
        else:
            self.about_page.refresh()
            self._present(self.about_page)
        return self.about_page

    def _present(self, page: QWidget, width: int = 0, height: int = 0) -> None:
        """Shows a window of this one's (Models, History, About), made the first time (a width is given): its own
        window, closed with this one and by Esc or Ctrl+W, centred on this one and kept on its screen."""
        if width:
            page.setWindowFlag(Qt.WindowType.Window)
            closing = QShortcut(page)
            closing.activated.connect(page.close)
            # the platform's Close (Ctrl+F4 on some) and Ctrl+W everywhere, each once: a key bound twice is ambiguous
            keys = [QKeySequence(Qt.Key.Key_Escape), QKeySequence("Ctrl+W")]
            keys += [k for k in QKeySequence.keyBindings(QKeySequence.StandardKey.Close) if k not in keys]
            closing.setKeys(keys)
            screen = self.screen().availableGeometry()
            page.resize(min(width, screen.width()), min(height, screen.height()))
            frame = page.frameGeometry()
            frame.moveCenter(self.frameGeometry().center())
            page.move(max(screen.left(), min(frame.left(), screen.right() - frame.width())),
                      max(screen.top(), min(frame.top(), screen.bottom() - frame.height())))
        page.show()
        page.raise_()
        page.activateWindow()

    def _history_path(self):
        from engine.history import history_path

        return self.history_file or history_path()

    def _delete_history(self) -> None:
        """Close this thread's connection (the history view's), then have the worker erase the history through
        its own; without a worker thread it is erased here."""
        from engine.errors import HistoryError
        from engine.history import erase_history

        if self.history_view is not None:
            self._history_was_open = self.history_view.isVisible()
            self.history_view.store.close()
            self.history_view.close()
            self.history_view.deleteLater()
            self.history_view = None  # made again, over the new file, when next opened
        if self._thread.isRunning():
            self.forget_requested.emit(self._history_path())
            return
        try:
            erase_history(self._history_path())
        except HistoryError as e:
            self._history_deleted(erase_failed(e))
            return
        self._history_deleted(None)

    def _history_deleted(self, problem) -> None:
        if problem is not None:
            self.show_problem(problem)
        else:
            self.chat.clear()
            self.setWindowTitle("Parley")
            self.statusBar().showMessage("All history deleted from this computer", 8000)
        if self._history_was_open:
            self._history_was_open = False
            self.open_history()
        if self.about_page is not None:
            self.about_page.refresh()

    def open_settings(self):
        """The settings dialog; what it saves is applied at once where it can be (app/settings_dialog.py)."""
        from app.settings_dialog import SettingsDialog

        dialog = SettingsDialog(self.settings, self.info, self, global_key_problem=self.global_key_problem)
        dialog.saved.connect(self._settings_saved)
        dialog.preview_requested.connect(self.preview_requested)
        dialog.preview_saved_requested.connect(self.preview_saved_requested)
        dialog.voice_dialog_opened.connect(self._voice_dialog_opened)
        dialog.voice_renamed.connect(self._saved_voice_renamed)
        # let go of the talk key while the dialog is open, so that its field can take that very key
        self._release_global_key()
        dialog.finished.connect(self._grab_global_key)
        dialog.open()
        return dialog

    def _settings_saved(self) -> None:
        from app.style import apply_style

        apply_style(QApplication.instance(), self.settings.theme)
        self.hands_free.setChecked(self.settings.listen_mode == "hands-free")
        if self._thread.isRunning():
            self.apply_requested.emit(self._config())

    # -- saved voices ---------------------------------------------------------------------------------------

    def _voice_dialog_opened(self, dialog) -> None:
        """The New-voice dialog opened: Parley stops speaking and the conversation's microphone is muted while it is
        open, so no turn runs beside the recording or the cloning (the user's own mute comes back after)."""
        self.voice_dialog = dialog
        if self.info is not None:
            self.stop_requested.emit()
            self.mute_requested.emit(True)
        dialog.clone_requested.connect(self._clone)
        dialog.action_chosen.connect(self._act)
        dialog.finished.connect(self._voice_dialog_closed)

    def _clone(self, request) -> None:
        self._cloning = request
        if not self._thread.isRunning():  # no engine started: the worker clones with the settings' models alone
            self._thread.start()
        self.clone_requested.emit(request, self._config())

    def _voice_cloned(self, event: VoiceCloned) -> None:
        if self._cloning is None or event.name != self._cloning.name:
            return
        self._cloning = None
        if self.voice_dialog is not None:
            self.voice_dialog.show_result(event.name, event.voice, event.error)
        elif event.voice is None and event.error is None:  # cancelled: the file the worker saved is gone again
            self.statusBar().showMessage(f"The voice “{event.name}” was not saved", 5000)
        self._release_microphone()

    def _voice_dialog_closed(self) -> None:
        self.voice_dialog = None
        self._release_microphone()

    def _microphone_held(self) -> bool:
        """Whether a voice is being recorded or cloned: the conversation's microphone stays muted meanwhile."""
        return self.voice_dialog is not None or self._cloning is not None

    def _release_microphone(self) -> None:
        if not self._microphone_held() and self.info is not None:
            self.mute_requested.emit(self.mute_button.isChecked())

    def _saved_voice_renamed(self, old: str, new: str) -> None:
        """A saved voice was renamed or removed (new ""): where it is the one the settings choose, the settings follow
        at once (a removed one gives way to the speaker), whatever the settings dialog then saves."""
        from engine.voice_library import same_name

        if same_name(self.settings.saved_voice, old):
            self.settings.saved_voice = new
            self.settings.sync()
            if self.info is not None:
                self.apply_requested.emit(self._config())

    def _erase_voices(self) -> None:
        """Delete every saved voice (the About page's): the settings stop naming one, so the speaker speaks without
        a notice, then the worker erases them through the assistant; without a worker thread, here."""
        if self.settings.saved_voice:
            self.settings.saved_voice = ""
            self.settings.sync()
            if self.info is not None:
                self.apply_requested.emit(self._config())
        if self._thread.isRunning():
            self.erase_voices_requested.emit()
            return
        from engine.voice_library import VoiceLibrary

        try:
            count = VoiceLibrary().erase_all()
        except OSError as e:
            self._voices_erased(SavedVoicesErased(0, e))
            return
        self._voices_erased(SavedVoicesErased(count))

    def _voices_erased(self, event: SavedVoicesErased) -> None:
        if event.error is not None:
            self.show_problem(Problem("Not every saved voice could be deleted", str(event.error),
                                      "Close programs using the voices folder, then erase them again."))
        else:
            self.statusBar().showMessage(f"{event.count} saved voice{'s' if event.count != 1 else ''} deleted from "
                                         "this computer", 8000)
        if self.about_page is not None:
            self.about_page.refresh()

    # -- what the window shows --------------------------------------------------------------------------

    def _show_state(self, state: str, text: str | None = None) -> None:
        self.state = state
        self.state_label.setText(text or STATE_TEXT.get(state, state))
        self.talk_button.setProperty("state", state)
        self.talk_button.style().unpolish(self.talk_button)  # the style sheet styles by state
        self.talk_button.style().polish(self.talk_button)
        self._update_talk_button()

    def _update_talk_button(self) -> None:
        hands_free = self.hands_free.isChecked()
        voice = self.info is not None and self.info.microphone is not None
        self.talk_button.setEnabled(voice and not hands_free)
        if self.info is None:  # nothing listens yet: loading, or the load failed (the state line says why)
            self.talk_button.setText("Loading…" if not self.load_bar.isHidden() else "Not ready")
        elif not voice:
            self.talk_button.setText("No microphone — type below")
        else:
            self.talk_button.setText(HANDS_FREE_TEXT.get(self.state, HANDS_FREE_TEXT["listening"]) if hands_free
                                     else "Hold to talk (Space)")

    # -- keys and closing -----------------------------------------------------------------------------------

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        kind = event.type()
        if kind in (QEvent.Type.KeyPress, QEvent.Type.KeyRelease) and event.key() == Qt.Key.Key_Space \
                and self._space_talks(watched, event):
            if not event.isAutoRepeat():
                self._key_down() if kind == QEvent.Type.KeyPress else self._key_up()
            return True
        return super().eventFilter(watched, event)

    def _key_down(self) -> None:
        if self._release.isActive():  # a release and a press a few ms apart: the key is still held
            self._release.stop()
        else:
            self._talk_down()

    def _key_up(self) -> None:
        if self._talking:
            self._release.start()

    def _grab_global_key(self) -> None:
        """Holds the settings' global talk key from now on (the one held before is let go); why it cannot be used
        goes to the status bar and the settings dialog."""
        self._release_global_key()
        shortcut = self.settings.global_talk_key
        self.global_key_problem = unavailable(QGuiApplication.platformName()) if shortcut else None
        if not shortcut or self.global_key_problem:
            return
        key = GlobalTalkKey(shortcut, parent=self)
        try:
            key.start()
        except GlobalKeyError as e:
            self.global_key_problem = str(e)
            self.statusBar().showMessage(f"The talk key {shortcut} cannot be used from other apps: {e}", 15000)
            return
        key.pressed.connect(self._key_down)
        key.released.connect(self._talk_up)  # its auto-repeat is filtered where it comes in
        self.global_key = key

    def _release_global_key(self) -> None:
        if self.global_key is not None:
            self.global_key.stop()
            self.global_key = None
            self._key_up()  # a talk held with it would be released by nobody

    def _space_talks(self, watched: QObject, event: QEvent) -> bool:
        """Space is push-to-talk in this window unless the user is typing: in a field with text in it (the one with
        the focus: key events are delivered there first), or any text field but the empty message box; Ctrl+Space
        talks wherever the focus is. A release always goes to a key held for talking."""
        if not isinstance(watched, QWidget) or watched.window() is not self or self.hands_free.isChecked():
            return False
        if event.type() == QEvent.Type.KeyRelease and self._talking:
            return True
        if event.modifiers() & Qt.KeyboardModifier.ControlModifier:
            return True
        if watched is self.message:
            return not self.message.toPlainText()
        typing = (QLineEdit, QPlainTextEdit, QTextEdit, QAbstractSpinBox)
        return not (isinstance(watched, typing) or (isinstance(watched, QComboBox) and watched.isEditable()))

    def closeEvent(self, event) -> None:
        """Into the tray, where the settings say so; else stop the engine (the loop's threads, the devices), then
        the worker's thread."""
        if self.tray is not None and self.settings.close_to_tray and not self._quitting:
            event.ignore()
            self.hide()
            if not self._told_tray:  # once a session: the user knows from then on
                self._told_tray = True
                self.tray.showMessage("Parley is still running", "It listens here in the tray; Quit in its menu "
                                      "ends it.", QSystemTrayIcon.MessageIcon.Information, 4000)
            return
        QApplication.instance().removeEventFilter(self)
        self._release_global_key()
        self.settings.window_geometry = self.saveGeometry()
        self.hide()
        if self.tray is not None:
            self.tray.hide()
        if self._thread.isRunning():
            # a local event loop, so the worker's last queued signals are still delivered meanwhile
            waiting = QEventLoop()
            self.worker.closed.connect(waiting.quit)
            timer = QTimer(waiting, singleShot=True, interval=SHUTDOWN_WAIT_MS)
            timer.timeout.connect(waiting.quit)
            timer.start()
            self.shutdown_requested.emit()
            waiting.exec()
            self._thread.quit()
            self._thread.wait(SHUTDOWN_WAIT_MS)
        if self.history_view is not None:
            self.history_view.store.close()
        self.settings.sync()
        super().closeEvent(event)

