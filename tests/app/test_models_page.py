"""ModelsPage driven offscreen: what is present and where, choosing, resetting, and real hub downloads
(a local fake hub through HF_ENDPOINT) with progress, cancel and the offline explanation."""

import os
import socket

import pytest
from huggingface_hub import constants
from PySide6.QtCore import QSettings, Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QFileDialog

from app.models_page import ModelsPage
from engine.models import locate_model
from engine.models import DEFAULT_TTS_REPO
from tests.app.fake_hub import FakeHub, repo_files

TTS_FOLDER = DEFAULT_TTS_REPO.split("/")[1]
CHUNK = 10 * 1024 * 1024  # huggingface_hub's write size: a download held after 12 MiB has one chunk on disk


@pytest.fixture
def models_dir(tmp_path, monkeypatch):
    """An empty Parley models folder and Hugging Face cache, so only what a test puts there is found."""
    monkeypatch.setenv("PARLEY_MODELS", str(tmp_path / "models"))
    monkeypatch.delenv("PARLEY_TTS_MODEL", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    return tmp_path / "models"


@pytest.fixture
def qsettings(tmp_path):
    return QSettings(str(tmp_path / "parley.ini"), QSettings.Format.IniFormat)


@pytest.fixture
def page(qtbot, qsettings, models_dir):
    widget = ModelsPage(qsettings)
    qtbot.addWidget(widget)
    widget.show()
    return widget


def test_present_models_say_where_they_were_found(qtbot, qsettings, models_dir, tiny_checkpoint, smollm2_path):
    """A chosen TTS folder, the bundled Whisper and the bundled SmolLM2 all show as Ready with their source."""
    qsettings.setValue("models/tts", str(tiny_checkpoint))
    page = ModelsPage(qsettings)
    qtbot.addWidget(page)
    page.show()
    assert page.missing() == []
    for name in ("tts", "stt", "llm"):
        assert page.rows[name].state.text() == "Ready" and page.rows[name].property("state") == "present"
        assert not page.rows[name].offline.isVisible()
    assert page.rows["tts"].where.text() == f"Chosen folder: {tiny_checkpoint}"
    assert page.rows["stt"].where.text() == "Comes with Parley: Whisper base (English and 98 more languages)"
    llm = page.rows["llm"].where.text()  # what the small model is for, and what to get instead, in words
    assert llm.startswith("Comes with Parley: SmolLM2-135M") and "often wrong" in llm and "far better" in llm
    assert page.rows["llm"].download_button.text().startswith("Download Qwen2.5")
    assert page.summary.text().startswith("Everything Parley needs")
    # the tiny model is what leads to "Get the recommended models": a language model, not the speech model chosen
    assert page.recommended_downloads() == ["llm"] and page.get_recommended_button.isVisible()
    assert "Recommended for this computer: Qwen2.5" in page.summary.text() and "Apache-2.0" in page.summary.text()


def test_a_missing_model_offers_a_download_and_the_offline_command(page, models_dir):
    """No TTS model: the row says Missing, offers Download, and shows the command to run elsewhere."""
    row = page.rows["tts"]
    assert page.missing() == ["tts"]
    assert row.state.text() == "Missing" and row.property("state") == "missing"
    assert "is not on this machine" in row.where.text()
    assert row.download_button.isVisible() and row.offline.isVisible()
    command = f"hf download {DEFAULT_TTS_REPO} --local-dir {models_dir / TTS_FOLDER}"
    assert command in row.offline.text()
    row.copy_button.click()
    assert QGuiApplication.clipboard().text() == command


def test_the_voice_cloning_model_is_offered_but_never_missing(page, qsettings, models_dir, base_checkpoint):
    """The Base model of saved voices has its card: "Not downloaded" with what it is for and a Download of it, but
    Parley runs without it, so the page never counts it missing; chosen, it is Ready."""
    from engine.catalogue import CLONING

    row = page.rows["clone"]
    assert page.missing() == ["tts"] and "Your voices" not in page.summary.text()
    assert row.state.text() == "Not downloaded" and "your own voices" in row.where.text()
    assert row.download_button.isVisible() and row.download_button.text() == f"Download {CLONING.name}, {CLONING.size}"
    assert f"hf download {CLONING.repo_id}" in row.offline.text()
    page.set_path("clone", str(base_checkpoint))
    assert qsettings.value("models/base") == str(base_checkpoint) and row.state.text() == "Ready"


def test_choosing_a_folder_stores_it_and_find_automatically_clears_it(page, qtbot, qsettings, tiny_checkpoint):
    """Choose… opens a folder dialog; the folder picked is stored and shown; the reset goes back to automatic."""
    row = page.rows["tts"]
    qtbot.mouseClick(row.choose_button, Qt.MouseButton.LeftButton)
    dialog = page.findChild(QFileDialog, "chooseDialog")
    assert dialog.isVisible() and dialog.fileMode() == QFileDialog.FileMode.Directory
    with qtbot.waitSignal(page.modelsChanged):
        dialog.fileSelected.emit(str(tiny_checkpoint))  # what the dialog sends when the user picks the folder
        dialog.reject()
    assert qsettings.value("models/tts") == str(tiny_checkpoint)
    assert row.state.text() == "Ready" and row.auto_button.isVisible()
    with qtbot.waitSignal(page.modelsChanged):
        qtbot.mouseClick(row.auto_button, Qt.MouseButton.LeftButton)
    assert qsettings.value("models/tts") == "" and row.state.text() == "Missing"


def test_wrong_files_are_explained_not_accepted_silently(tmp_path):
    """A folder that is no checkpoint or Whisper model, or a file that is no GGUF, is missing with the reason named."""
    (tmp_path / "empty").mkdir()
    found = locate_model("tts", str(tmp_path / "empty"))
    assert found.path is None and "not a Qwen3-TTS checkpoint folder (no config.json, speech_tokenizer)" in found.where
    (tmp_path / "notes.gguf").write_text("hello")
    found = locate_model("llm", str(tmp_path / "notes.gguf"))
    assert found.path is None and "not a GGUF model file" in found.where
    found = locate_model("stt", str(tmp_path / "empty"))
    assert found.path is None and "not a complete CTranslate2 Whisper model folder" in found.where


@pytest.mark.parametrize("damage, said", [
    ("cut", "the file is cut short"), ("header", "its header is damaged"), ("config", "cannot be read as JSON")])
def test_a_damaged_checkpoint_cannot_be_read_here_as_it_cannot_be_loaded(page, qsettings, tiny_checkpoint, tmp_path,
                                                                          damage, said):
    """A truncated weights file, a garbled header or config: the page says "Cannot be read" with the file and why,
    as loading it would fail (the report saw "Ready" here beside "Not ready" in the main window)."""
    import shutil

    from engine.errors import ModelFilesError
    from engine.tts import load_tts

    broken = tmp_path / "Qwen3-TTS-12Hz-0.6B-CustomVoice"
    shutil.copytree(tiny_checkpoint, broken)
    weights = broken / "speech_tokenizer" / "model.safetensors"
    if damage == "cut":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif damage == "header":
        weights.write_bytes(weights.read_bytes()[:8] + b"\xff" * 64 + weights.read_bytes()[72:])
    else:
        (broken / "config.json").write_text("{ not json")
    with pytest.raises(ModelFilesError):
        load_tts(broken)
    found = locate_model("tts", str(broken))
    assert found.path is None and found.damaged and said in found.where
    page.set_path("tts", str(broken))
    row = page.rows["tts"]
    assert row.state.text() == "Cannot be read" and row.property("state") == "damaged"
    assert "cannot be read" in page.summary.text()


def test_download_shows_progress_then_the_model_is_ready(page, qtbot, qsettings, models_dir, tiny_checkpoint,
                                                         monkeypatch):
    """Download fetches the repository from the hub (HF_ENDPOINT), the bar fills, the path is stored, Ready."""
    files = repo_files(tiny_checkpoint)
    row = page.rows["tts"]
    with FakeHub({DEFAULT_TTS_REPO: files}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)  # read by huggingface_hub in the download's process
        seen = []
        with qtbot.waitSignal(page.modelsChanged, timeout=60_000):
            qtbot.mouseClick(row.download_button, Qt.MouseButton.LeftButton)
            assert row.state.text() == "Downloading" and row.bar.isVisible() and not row.download_button.isVisible()
            page.downloads["tts"].progress.connect(lambda done, total: seen.append((done, total)))
    target = models_dir / TTS_FOLDER
    assert qsettings.value("models/tts") == str(target)
    assert repo_files(target) == files
    assert seen and seen[-1] == (sum(map(len, files.values())),) * 2
    assert row.state.text() == "Ready" and not row.bar.isVisible() and not row.download_button.isVisible()
    assert page.missing() == []


def test_cancel_stops_a_download_in_flight_and_keeps_its_bytes(page, qtbot, models_dir, monkeypatch):
    """Cancel during a transfer ends it at once: no model folder, the row Missing again, Download offered."""
    files = {"config.json": b"{}", "model.safetensors": os.urandom(2 * CHUNK)}
    row = page.rows["tts"]
    with FakeHub({DEFAULT_TTS_REPO: files}, hold_after=CHUNK + 2 * 1024 * 1024) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        qtbot.mouseClick(row.download_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: row.bar.value() > 0, timeout=60_000)
        assert " of " in row.bar_text.text()
        download = page.downloads["tts"]
        with qtbot.waitSignal(download.failed, timeout=30_000):
            qtbot.mouseClick(row.cancel_button, Qt.MouseButton.LeftButton)
    assert "Download cancelled" in row.where.text()
    assert not (models_dir / TTS_FOLDER).exists() and (models_dir / f"{TTS_FOLDER}.partial").is_dir()
    assert row.state.text() == "Missing" and row.download_button.isVisible() and "tts" not in page.downloads


def test_download_without_a_network_explains_what_to_do(page, qtbot, models_dir, monkeypatch):
    """When the hub cannot be reached the row says so and shows the command for another machine."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    row = page.rows["tts"]
    qtbot.mouseClick(row.download_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "cannot reach the Hugging Face hub" in row.offline.text(), timeout=60_000)
    assert row.offline.isVisible() and f"hf download {DEFAULT_TTS_REPO}" in row.offline.text()
    assert row.state.text() == "Missing" and row.download_button.isVisible()


def test_a_damaged_download_is_offered_again_and_replaced(page, qtbot, qsettings, models_dir, tiny_checkpoint,
                                                          monkeypatch):
    """A model in Parley's models folder that cannot be read gets "Download … again" (before, the button hid
    because the folder existed, leaving no way out but the file manager); the new copy replaces it, Ready."""
    import shutil

    files = repo_files(tiny_checkpoint)
    target = models_dir / TTS_FOLDER
    shutil.copytree(tiny_checkpoint, target)
    (target / "config.json").write_text("{ not json")
    page.refresh()
    row = page.rows["tts"]
    assert row.state.text() == "Cannot be read"
    assert row.download_button.isVisible() and row.download_button.text().endswith(" again")
    with FakeHub({DEFAULT_TTS_REPO: files}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        with qtbot.waitSignal(page.modelsChanged, timeout=60_000):
            qtbot.mouseClick(row.download_button, Qt.MouseButton.LeftButton)
    assert repo_files(target) == files
    assert row.state.text() == "Ready" and not row.download_button.isVisible()
    assert sorted(p.name for p in models_dir.iterdir()) == [TTS_FOLDER]


def test_get_the_recommended_models_fetches_each_missing_one_and_all_are_ready(page, qtbot, qsettings, models_dir,
                                                                            tiny_checkpoint, monkeypatch):
    """One action on a first run: the speech model and the language model recommended for this computer download
    side by side from the hub (each checked against its listed hash), each row shows its progress, and then every
    row is Ready with its downloaded model chosen and the action gone."""
    from engine.catalogue import recommended, this_machine

    llm = recommended(this_machine())["llm"]
    gguf = b"GGUF" + os.urandom(64 * 1024)
    qsettings.setValue("models/llm", str(models_dir / "nothing.gguf"))  # no usable language model either
    page.refresh()
    assert page.recommended_downloads() == ["tts", "llm"] and page.get_recommended_button.isVisible()
    repos = {DEFAULT_TTS_REPO: repo_files(tiny_checkpoint), llm.repo_id: {llm.files[0]: gguf}}
    with FakeHub(repos) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        qtbot.mouseClick(page.get_recommended_button, Qt.MouseButton.LeftButton)
        assert set(page.downloads) == {"tts", "llm"} and not page.get_recommended_button.isVisible()
        assert page.total_bar.isVisible() and page.total_text.text().startswith("2 models: ")  # one view of both
        qtbot.waitUntil(lambda: not page.downloads, timeout=60_000)
    assert not page.total_bar.isVisible()
    assert qsettings.value("models/llm") == str(llm.downloaded_path()) and llm.downloaded_path().read_bytes() == gguf
    assert qsettings.value("models/tts") == str(models_dir / TTS_FOLDER)
    assert page.missing() == [] and all(page.rows[name].state.text() == "Ready" for name in ("tts", "stt", "llm"))
    assert page.recommended_downloads() == [] and not page.get_recommended_button.isVisible()
