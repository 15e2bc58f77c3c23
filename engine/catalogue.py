"""The models Parley recommends downloading, sized to this computer: one list for the app's Models page and for
`parley models`. Each names its hub repository, the files to fetch, about how much that is and its licence; the
downloads themselves are engine/downloads.py (checked against the hub's sizes and SHA-256).

What comes with Parley (Whisper base, SmolLM2-135M) needs no download; these replace it where it is weak.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from engine.models import DEFAULT_BASE_REPO, DEFAULT_TTS_REPO, Found, models_dir

KINDS = ("tts", "stt", "llm", "clone")


@dataclass(frozen=True)
class Offer:
    """A model to download. kind: "tts", "stt", "llm" or "clone" (the Base model of saved voices); name: what people
    call it; files: the paths to fetch from the repository (None: all of it); size: about how much that is, in
    words; why: what it is for."""

    kind: str
    name: str
    repo_id: str
    files: tuple[str, ...] | None
    size: str
    licence: str
    why: str

    def download_folder(self) -> Path:
        """Where it is downloaded: Parley's models folder / the repository's name."""
        return models_dir() / self.repo_id.split("/")[1]

    def downloaded_path(self) -> Path:
        """The path a model setting takes once it is downloaded: the folder, or the single file in it."""
        folder = self.download_folder()
        return folder / self.files[0] if self.files and len(self.files) == 1 else folder


@dataclass(frozen=True)
class Machine:
    """What sizes the offers: memory and the largest NVIDIA GPU's memory (0 without one), in bytes."""

    memory: int
    gpu_memory: int


SPEECH = Offer("tts", "Qwen3-TTS 0.6B", DEFAULT_TTS_REPO, None, "about 2 GB", "Apache-2.0",
               "the speech model Parley speaks with; nine voices, ten languages")
WHISPER_SMALL = Offer("stt", "Whisper small", "Systran/faster-whisper-small", None, "about 480 MB", "MIT",
                      "fewer misheard words than the bundled Whisper base, for three times its work")
QWEN_1_5B = Offer("llm", "Qwen2.5 1.5B Instruct", "bartowski/Qwen2.5-1.5B-Instruct-GGUF",
                  ("Qwen2.5-1.5B-Instruct-Q4_K_M.gguf",), "about 1 GB", "Apache-2.0",
                  "far better answers than the bundled SmolLM2-135M, and quick on a CPU")
QWEN_7B = Offer("llm", "Qwen2.5 7B Instruct", "bartowski/Qwen2.5-7B-Instruct-GGUF",
                ("Qwen2.5-7B-Instruct-Q4_K_M.gguf",), "about 4.7 GB", "Apache-2.0",
                "answers close to the large online assistants'; quick on a GPU with 8 GB or more")
# Not recommended with the others: only those who clone a voice need it (engine/voice_library.py)
CLONING = Offer("clone", "Qwen3-TTS 0.6B Base", DEFAULT_BASE_REPO, None, "about 2 GB", "Apache-2.0",
                "clones a voice from a few seconds of speech, and speaks in your saved voices")
OFFERS = (SPEECH, WHISPER_SMALL, QWEN_1_5B, QWEN_7B, CLONING)

_GPU_FOR_LARGER = 8 * 1024**3  # a 7B model at 4 bits and Whisper small beside the speech model


def recommended(machine: Machine) -> dict[str, Offer | None]:
    """For each kind but "clone" (wanted only by those who clone a voice), the offer for this machine; None where what
    comes with Parley is the better fit (Whisper base on a CPU: a larger Whisper would slow every turn)."""
    gpu = machine.gpu_memory >= _GPU_FOR_LARGER
    return {"tts": SPEECH, "stt": WHISPER_SMALL if gpu else None, "llm": QWEN_7B if gpu else QWEN_1_5B}


@functools.cache
def this_machine() -> Machine:
    """This computer's memory and GPU memory (nvidia-smi's, so that no GPU library is loaded to ask)."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
    gpu = 0
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=5).stdout
            gpu = max((int(line) * 1024**2 for line in out.split() if line.isdigit()), default=0)
        except (OSError, subprocess.SubprocessError):
            gpu = 0
    return Machine(memory, gpu)


def downloaded(kind: str) -> Path | None:
    """The language or hearing model ("llm", "stt") an automatic setting takes: the one recommended for this machine
    where it has been downloaded, else another downloaded offer of that kind; None (the bundled one then) where there
    is none."""
    best = recommended(this_machine()).get(kind)
    for offer in sorted((o for o in OFFERS if o.kind == kind), key=lambda o: o is not best):
        if offer.downloaded_path().exists():
            return offer.downloaded_path()
    return None


def to_download(found: dict[str, Found], machine: Machine) -> list[Offer]:
    """The recommended offers not here yet: for each kind with no usable model, or only the one that comes with
    Parley (Whisper base or SmolLM2), whose recommended model is not downloaded; a damaged download of it is fetched
    again."""
    wanted = []
    for kind, offer in recommended(machine).items():
        if offer is not None and (found[kind].path is None or found[kind].bundled):
            if found[kind].damaged or not offer.download_folder().exists():
                wanted.append(offer)
    return wanted

