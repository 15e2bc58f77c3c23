"""The user's saved voices: voices cloned from their recordings (engine/tts/clone.py), kept in Parley's data folder
($XDG_DATA_HOME/parley/voices, beside the history) one file each, under names the user chose. The app's voice list,
the assistant and `parley voice` all read and change them here.

A voice file is ClonedVoice.save's, its labels holding the user's name for it and when it was saved; the file's own
name is only a tidy form of that name, so any name a person writes (any script, spaces, emoji) is safe on every disk.
Names are unique however they are capitalised. A voice holds no recording, but an in-context voice holds the
recording's codec codes, from which its sound can be decoded again: erasing a voice deletes its file.
Importing this module is light (no numpy, no torch): the window lists voices before anything of the engine loads.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from engine.errors import InputTextError, VoiceFileError, VoiceNameError
from engine.settings import data_dir

if TYPE_CHECKING:
    from collections.abc import Callable

    import numpy as np

    from engine.tts.clone import ClonedVoice
    from engine.tts.stream import TTSEngine

__all__ = ["MAX_NAME_CHARS", "SavedVoice", "VoiceLibrary", "check_name", "same_name", "voices_dir"]

MAX_NAME_CHARS = 64  # a name fits a menu line; longer says nothing a shorter one could not
SUFFIX = ".voice"
# Unicode's categories of what no name shows: control characters, unpaired surrogates, unassigned code points, and
# line and paragraph separators (a name is one line). Format characters stay: emoji sequences join with U+200D.
_UNSHOWN = ("Cc", "Cs", "Cn", "Zl", "Zp")
# file names Windows keeps for devices, whatever follows the dot
_RESERVED = {"con", "prn", "aux", "nul", *(f"com{i}" for i in range(1, 10)), *(f"lpt{i}" for i in range(1, 10))}
_SLUG_CHARS = 40
_WHISPER_RATE_HZ = 16_000  # what a transcribe callable hears (engine/stt SAMPLE_RATE_HZ, not imported: it is heavy)


def voices_dir() -> Path:
    """The folder of saved voices: $XDG_DATA_HOME/parley/voices, else ~/.local/share/parley/voices."""
    return data_dir() / "voices"


def check_name(name: str) -> str:
    """A voice's name as it is kept: surrounding spaces taken away, composed characters composed (NFC).

    Raises:
        VoiceNameError: empty, longer than MAX_NAME_CHARS, or holding a control character or line break.
    """
    if not isinstance(name, str):
        raise VoiceNameError(f"a voice's name is text, got {type(name).__name__}")
    name = unicodedata.normalize("NFC", name.strip())
    if not name:
        raise VoiceNameError("a saved voice needs a name")
    if len(name) > MAX_NAME_CHARS:
        raise VoiceNameError(f"the name {name[:20]!r}... is {len(name)} characters long; a voice's name has at most "
                             f"{MAX_NAME_CHARS}")
    unshown = [ch for ch in name if unicodedata.category(ch) in _UNSHOWN]
    if unshown:
        raise VoiceNameError(f"the name {name!r} holds {unicodedata.name(unshown[0], f'U+{ord(unshown[0]):04X}')}, "
                             "which a name cannot show; use letters, digits, spaces and punctuation")
    return name


def same_name(a: str, b: str) -> bool:
    """Whether two names name the same saved voice (as the library compares them)."""
    return bool(a.strip()) and _key(a.strip()) == _key(b.strip())


def _key(name: str) -> str:
    """What makes two names the same name: compatibility-normalised and case-folded ("ANN", "ann", "Ａｎｎ")."""
    return unicodedata.normalize("NFKC", name).casefold()


def _slug(name: str) -> str:
    """The tidy file stem of a name: its ASCII letters and digits, lower case, joined by '-' ("Grandma Ann" ->
    "grandma-ann"); "voice" for a name with none (most non-Latin scripts)."""
    ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    slug = re.sub(r"[^a-z0-9]+", "-", ascii_name.lower()).strip("-")[:_SLUG_CHARS].strip("-") or "voice"
    return f"{slug}-voice" if slug in _RESERVED else slug


@dataclass(frozen=True)
class SavedVoice:
    """One saved voice, as the library lists it.

    name: the user's name for it. path: its file.
    mode: "icl" or "x_vector" (engine/tts/clone.py CLONE_MODES); "" where the file is damaged.
    model_size: the Base model it was cloned with ("0b6", "1b7"); "" where unknown.
    saved: when it was saved (UTC); the file's time where the file does not say.
    transcript: what its recording says ("icl"); "" for an x-vector voice.
    problem: why it cannot be used (a damaged file, in VoiceFileError's words); "" when it can.
    size_bytes: the file's size.
    """

    name: str
    path: Path
    mode: str
    model_size: str
    saved: datetime
    transcript: str
    problem: str
    size_bytes: int

    @property
    def damaged(self) -> bool:
        return bool(self.problem)


class VoiceLibrary:
    """The saved voices in one folder (voices_dir() unless given); each call looks at the files anew, so the app, the
    assistant and the command line see each other's changes.

        library = VoiceLibrary()
        library.add("Grandma", tts.clone_voice("grandma.wav", text="..."))
        tts.stream("Hello.", voice=library.load("grandma"))
    """

    def __init__(self, folder: Path | None = None):
        self.folder = Path(folder) if folder is not None else voices_dir()

    def list(self) -> list[SavedVoice]:
        """Every saved voice, by name (case-insensitive); a damaged file is listed with its problem, never raised."""
        from engine.tts.clone import load_voice, read_labels

        voices = []
        for path in self._files():
            labels = read_labels(path)
            try:
                voice = load_voice(path)
            except VoiceFileError as e:
                mode, size, transcript, problem = "", labels.get("model_size", ""), "", str(e)
            else:
                mode, size, transcript, problem = voice.mode, voice.model_size, voice.reference_text or "", ""
            stat = path.stat()
            voices.append(SavedVoice(labels.get("name") or path.stem, path, mode, size,
                                     _saved_at(labels.get("saved"), stat.st_mtime), transcript, problem,
                                     stat.st_size))
        return sorted(voices, key=lambda v: (_key(v.name), v.path.name))

    def get(self, name: str) -> SavedVoice:
        """The saved voice of that name (any capitalisation).

        Raises:
            VoiceNameError: there is none; the message lists the saved voices.
        """
        voices = self.list()
        wanted = _key(name.strip()) if isinstance(name, str) else None
        for voice in voices:
            if _key(voice.name) == wanted:
                return voice
        names = ", ".join(v.name for v in voices)
        raise VoiceNameError(f"no saved voice is named {name!r}; " +
                             (f"the saved voices are: {names}" if voices else "no voice has been saved yet"))

    def load(self, name: str) -> ClonedVoice:
        """The voice of that name, to speak in (TTSEngine.stream(..., voice=...)).

        Raises:
            VoiceNameError: no saved voice has that name.
            VoiceFileError: its file is damaged or of another format version (clone it again).
        """
        from engine.tts.clone import load_voice

        return load_voice(self.get(name).path)

    def add(self, name: str, voice: ClonedVoice, *, replace: bool = False) -> SavedVoice:
        """Save `voice` under `name`.

        Args:
            replace: a voice of that name (any capitalisation) is replaced, and takes this spelling of the name;
                without it such a voice is an error.
        Returns:
            The voice as listed.
        Raises:
            VoiceNameError: the name cannot be used (check_name), or is taken and replace is False.
            OSError: the folder cannot be written.
        """
        name = check_name(name)
        existing = self._find(name)
        if existing is not None and not replace:
            raise VoiceNameError(f"there is already a saved voice named {existing.name!r}; choose another name, or "
                                 "replace it")
        path = existing.path if existing is not None else self._new_path(name)
        self._write(voice, path, name)
        return self.get(name)

    def clone(self, engine: Callable[[], TTSEngine], name: str, audio, sample_rate_hz: int | None = None, *,
              text: str | None = None, mode: str = "icl", replace: bool = False,
              transcribe: Callable[[np.ndarray], str] | None = None) -> SavedVoice:
        """Clone a recording's voice and save it under `name`: what the app's "New voice", Assistant.clone_voice and
        `parley voice add` do. The name, the mode and the recording are checked first, so a bad one is told before
        any model loads or listens.

        Args:
            engine: gives the Base model's TTSEngine to clone with; called once the rest is checked.
            name, replace: as add().
            audio, sample_rate_hz, mode: as TTSEngine.clone_voice (a file, or samples and their rate; "icl" or
                "x_vector").
            text: what the recording says; in "icl" mode without it (or with no words in it), `transcribe` hears it.
            transcribe: (n,) float32 speech at 16 kHz -> its text (Whisper); None: "icl" mode needs `text`.
        Returns:
            The voice as listed; its transcript is what was given or heard.
        Raises:
            VoiceNameError: as add().
            ReferenceAudioError: the recording is not audio, too short or too long, silent, or clipped.
            InputTextError: "icl" mode with no transcript to be had: none given and no `transcribe`, or no words
                heard in the recording; or the model is no Base model.
            ValueError: an unknown mode, or samples without their sample rate.
            ModelFilesError: `engine` could not load the Base model.
        """
        from engine.text import has_words
        from engine.tts.clone import CLONE_MODES, read_reference

        name = check_name(name)
        existing = self._find(name)
        if existing is not None and not replace:
            raise VoiceNameError(f"there is already a saved voice named {existing.name!r}; choose another name, or "
                                 "replace it")
        if mode not in CLONE_MODES:
            raise ValueError(f"unknown clone mode {mode!r}; choose one of: {', '.join(CLONE_MODES)}")
        heard = read_reference(audio, sample_rate_hz, _WHISPER_RATE_HZ)  # the recording's faults, told first
        if mode == "icl" and not (text and has_words(text)):
            if transcribe is None:
                raise InputTextError("cloning in 'icl' mode needs what the recording says; without it, clone in "
                                     "'x_vector' mode")
            text = transcribe(heard)
            if not has_words(text):
                raise InputTextError(f"no words were heard in the recording ({heard.size / _WHISPER_RATE_HZ:.1f} "
                                     "s); give what it says, or clone in 'x_vector' mode")
        voice = engine().clone_voice(audio, sample_rate_hz, text=text, mode=mode)
        return self.add(name, voice, replace=replace)

    def rename(self, name: str, new_name: str) -> SavedVoice:
        """Give a saved voice another name (only its capitals changed is fine).

        Raises:
            VoiceNameError: no voice has `name`, `new_name` cannot be used, or another voice has it.
            VoiceFileError: its file is damaged (a damaged voice can only be removed).
        """
        from engine.tts.clone import load_voice

        old, new_name = self.get(name), check_name(new_name)
        other = self._find(new_name)
        if other is not None and other.path != old.path:
            raise VoiceNameError(f"there is already a saved voice named {other.name!r}; choose another name")
        voice = load_voice(old.path)
        path = old.path if _slug(new_name) == _slug(old.name) else self._new_path(new_name)
        self._write(voice, path, new_name, saved=old.saved)
        if path != old.path:
            old.path.unlink(missing_ok=True)
        return self.get(new_name)

    def remove(self, name: str) -> SavedVoice:
        """Delete a saved voice's file (a damaged one too); returns it as it was listed.

        Raises:
            VoiceNameError: no saved voice has that name.
        """
        voice = self.get(name)
        voice.path.unlink(missing_ok=True)
        return voice

    def erase_all(self) -> int:
        """Delete every saved voice, damaged ones and half-written files too, and the folder once it is empty;
        returns how many voices there were. A folder that does not exist has nothing to erase."""
        if not self.folder.is_dir():
            return 0
        voices = self._files()
        for path in voices + sorted(self.folder.glob(f".*{SUFFIX}.*")):  # ClonedVoice.save's temporary files
            path.unlink(missing_ok=True)
        try:
            self.folder.rmdir()
        except OSError:  # something of the user's own is in it: left alone
            pass
        return len(voices)

    def summary(self) -> str:
        """What is stored, in a line for the About page: "3 voices, 41 kB", "1 voice, 6 kB (1 damaged)", or
        "none saved"."""
        voices = self.list()
        if not voices:
            return "none saved"
        size = sum(v.size_bytes for v in voices)
        damaged = sum(v.damaged for v in voices)
        amount = f"{size / 1e6:.1f} MB" if size >= 1e5 else f"{max(1, round(size / 1e3))} kB"
        return (f"{len(voices)} voice{'s' if len(voices) != 1 else ''}, {amount}"
                + (f" ({damaged} damaged)" if damaged else ""))

    # -- files ---------------------------------------------------------------------------------------------

    def _files(self) -> list[Path]:
        if not self.folder.is_dir():
            return []
        return sorted(p for p in self.folder.glob(f"*{SUFFIX}") if p.is_file() and not p.name.startswith("."))

    def _find(self, name: str) -> SavedVoice | None:
        try:
            return self.get(name)
        except VoiceNameError:
            return None

    def _new_path(self, name: str) -> Path:
        """A file for a new voice: its slug, numbered where another voice's file has it ("ann-2.voice")."""
        slug, n = _slug(name), 1
        taken = {p.name.casefold() for p in self._files()}  # casefold: a macOS or Windows disk ignores case
        while f"{slug}{'' if n == 1 else f'-{n}'}{SUFFIX}" in taken:
            n += 1
        return self.folder / f"{slug}{'' if n == 1 else f'-{n}'}{SUFFIX}"

    def _write(self, voice: ClonedVoice, path: Path, name: str, saved: datetime | None = None) -> None:
        # voices are the user's likeness: the folder is theirs alone, as the history's is
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        saved = saved or datetime.now(timezone.utc)
        voice.save(path, labels={"name": name, "saved": saved.isoformat(timespec="seconds")})


def _saved_at(label: str | None, mtime: float) -> datetime:
    """When a voice was saved: its label (ISO 8601), else the file's modification time; UTC."""
    try:
        when = datetime.fromisoformat(label) if label else None
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        return datetime.fromtimestamp(mtime, timezone.utc)
    return when.astimezone(timezone.utc)
