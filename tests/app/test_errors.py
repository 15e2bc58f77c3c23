"""Readable errors: engine exceptions become a headline, the detail, one line of what to do, and a way forward."""

from PySide6.QtWidgets import QMessageBox

from app.errors import ErrorDialog, Problem, problem_for
from engine.errors import (AudioDeviceError, AudioDeviceLostError, GPUUnavailableError, HistoryError, InputTextError,
                           ModelFilesError, ModelMissingError)


def test_each_kind_of_failure_points_to_the_page_that_fixes_it():
    """No model or a damaged one -> Models page, each headline saying which; no device or out of memory ->
    Settings; bad text or history -> no page. The detail reads as a sentence (the engine's begin in lower case)."""
    missing = problem_for(ModelMissingError("/x: no such model folder"), "loading the speech model")
    assert missing.action == "models" and missing.detail == "/x: no such model folder"
    assert missing.headline == "A model is missing (loading the speech model)"
    damaged = problem_for(ModelFilesError("the weights of /x cannot be read"), "loading the speech model")
    assert damaged.headline == "A model cannot be read (loading the speech model)" and damaged.action == "models"
    assert damaged.detail == "The weights of /x cannot be read"
    assert problem_for(AudioDeviceError("this machine has no input device"),
                       "opening the microphone").action == "settings"
    assert "choose another one in Settings" in problem_for(AudioDeviceError("x"), "y").advice
    memory = problem_for(MemoryError(), "loading the speech model")
    assert memory.headline.startswith("Out of memory") and memory.action == "settings"
    assert problem_for(InputTextError("unknown speaker 'rian'"), "answering").action is None
    assert problem_for(HistoryError("disk full"), "answering").action is None
    other = problem_for(KeyError("rian"), "answering")
    assert other.detail == "KeyError: 'rian'" and other.action is None


def test_the_gpu_falling_back_to_the_cpu_says_so_and_leads_to_the_settings():
    """A GPUUnavailableError (no GPU, or it ran out of memory mid-reply) is a notice that Parley uses the CPU."""
    error = GPUUnavailableError("the GPU ran out of memory while speaking; Parley speaks on the CPU from now on")
    problem = problem_for(error, "speaking")
    assert problem.headline == "The GPU is not available; Parley is using the CPU"
    assert problem.detail == "The" + str(error)[3:] and problem.action == "settings" and "goes on" in problem.advice


def test_a_lost_device_is_named_in_plain_words_and_opens_no_page():
    """Speakers or microphone lost: 'disconnected' headlines, the device and why as the detail, Parley carrying on
    by itself, each said once (the report saw the banner say both twice), and no action (so no dialog: the
    conversation goes on)."""
    lost = "output device 'default' (index 1) was lost (its stream stopped)"
    speakers = problem_for(AudioDeviceLostError(f"the speakers were disconnected: {lost}; Parley carries on by "
                                                "itself once they are back", "output", lost), "speaking")
    microphone = problem_for(AudioDeviceLostError("the microphone was disconnected: ...", "input"), "speaking")
    assert speakers.headline == "The speakers were disconnected" and "by itself" in speakers.advice
    assert speakers.detail == "Output device 'default' (index 1) was lost (its stream stopped)."
    said = " ".join((speakers.headline, speakers.detail, speakers.advice)).lower()
    assert said.count("disconnected") == 1 and said.count("by itself") == 1
    assert microphone.headline == "The microphone was disconnected" and "typing still works" in microphone.advice
    assert speakers.action is None and microphone.action is None


def test_a_denied_microphone_says_to_allow_it_in_the_system_settings_once():
    """MicrophoneAccessError: 'denied' in the headline, and no Parley page to open (the fix is not in Parley). The
    engine's message says how to allow access on this system, so the advice does not say it again."""
    from engine.audio.devices import Device, access_error

    error = access_error(Device(1, "default", 2, 48000.0), OSError("Error opening InputStream: Permission denied"))
    problem = problem_for(error, "x")
    assert problem.headline == "Access to the microphone is denied" and problem.action is None
    assert "allow microphone access in your system settings" in problem.detail and problem.advice == ""


def test_a_silent_microphone_is_not_called_disconnected_and_leads_to_the_settings():
    """MicrophoneSilentError (only exact zeros: denied without an error, or muted) says the microphone hears
    nothing; the engine's message says how to allow access or unmute, and the advice adds only choosing another
    microphone in Settings, so the notice says each thing once."""
    from engine.audio.devices import Device, silence_error

    problem = problem_for(silence_error(Device(1, "default", 2, 48000.0), 5.0), "x")
    assert problem.headline == "The microphone hears nothing" and problem.action == "settings"
    notice = f"{problem.detail}\n{problem.advice}"
    assert all(notice.count(said) == 1 for said in ("system settings", "muted", "in Settings"))


def test_a_problem_shows_its_text_as_written_in_rich_text(qtbot):
    """A detail holding a command's '<placeholder>', '&' and a line break is shown as written in the notice bar
    and in the dialog (rich text would drop the placeholder as an unknown tag and join the lines); an empty
    advice adds no empty line."""
    from PySide6.QtGui import QTextDocument

    from app.main_window import NoticeBar

    detail = "broken/config.json: not valid JSON\nrun: hf download <the model's hub id> --local-dir a&b"
    problem = Problem("A model is damaged", detail, "")

    def shown(rich: str) -> str:
        document = QTextDocument()
        document.setHtml(rich)
        return document.toPlainText()

    bar = NoticeBar()
    qtbot.addWidget(bar)
    bar.show_problem(problem)
    assert shown(bar.label.text()) == f"A model is damaged\n{detail}"
    dialog = ErrorDialog(problem)
    qtbot.addWidget(dialog)
    assert shown(dialog.informativeText()) == detail


def test_torch_out_of_memory_is_recognised_without_importing_torch_here():
    """A CUDA out-of-memory error (torch.OutOfMemoryError) reads as 'Out of memory'."""
    import torch

    problem = problem_for(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), "answering")
    assert problem.headline == "Out of memory while answering" and problem.action == "settings"
    assert "2.00 GiB" in problem.detail


def test_the_dialog_shows_the_problem_and_its_button_leads_on(qtbot):
    """The message box carries the headline, detail and advice; its action button emits the action."""
    problem = problem_for(ModelFilesError("the speech model is not on this machine"), "loading the speech model")
    dialog = ErrorDialog(problem)
    qtbot.addWidget(dialog)
    dialog.open()
    assert dialog.text() == problem.headline
    assert problem.detail in dialog.informativeText() and problem.advice in dialog.informativeText()
    with qtbot.waitSignal(dialog.action_chosen) as chosen:
        dialog.action_button.click()
    assert chosen.args == ["models"]
    plain = ErrorDialog(problem_for(InputTextError("empty text"), "answering"))
    qtbot.addWidget(plain)
    assert plain.action_button is None and plain.button(QMessageBox.StandardButton.Close) is not None
