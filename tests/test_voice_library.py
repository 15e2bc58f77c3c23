"""The saved voices (engine/voice_library.py) on real files: voices cloned by the tiny Base checkpoint from espeak-ng
speech, kept in a data folder of the test's own; names of any script, duplicates, damaged files, erasing."""

import os
import stat
from datetime import datetime, timedelta, timezone

import pytest
import torch

from engine.errors import InputTextError, ReferenceAudioError, VoiceFileError, VoiceNameError
from engine.voice_library import MAX_NAME_CHARS, VoiceLibrary, check_name, voices_dir
from tests.conftest import HEARD_REFERENCE, REFERENCE_TEXT


@pytest.fixture(scope="module")
def base_tts(base_checkpoint):
    from engine.tts import load_tts

    return load_tts(base_checkpoint)


@pytest.fixture(scope="module")
def cloned(base_tts, reference_wav):
    """{mode: ClonedVoice} of the espeak recording, in both modes."""
    return {mode: base_tts.clone_voice(reference_wav, text=REFERENCE_TEXT, mode=mode) for mode in ("icl", "x_vector")}


@pytest.fixture
def library(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    return VoiceLibrary()


def test_saved_voices_live_in_parleys_data_folder_one_private_file_each(library, cloned, tmp_path):
    """The folder is $XDG_DATA_HOME/parley/voices, readable by the user alone; each voice is one small file there,
    listed with its name, mode, model size, date and transcript."""
    before = datetime.now(timezone.utc).replace(microsecond=0)
    library.add("Grandma Ann", cloned["icl"])
    library.add("Work voice", cloned["x_vector"])
    assert library.folder == voices_dir() == tmp_path / "data" / "parley" / "voices"
    assert stat.S_IMODE(library.folder.stat().st_mode) == 0o700
    ann, work = library.list()
    assert (ann.name, ann.mode, ann.model_size, ann.transcript, ann.problem) == ("Grandma Ann", "icl", "0b6",
                                                                                 REFERENCE_TEXT, "")
    assert (work.name, work.mode, work.transcript, work.damaged) == ("Work voice", "x_vector", "", False)
    assert before <= ann.saved <= datetime.now(timezone.utc) and ann.saved.tzinfo is not None
    assert sorted(p.name for p in library.folder.iterdir()) == ["grandma-ann.voice", "work-voice.voice"]
    assert ann.size_bytes == ann.path.stat().st_size < 20_000


def test_a_saved_voice_loads_as_it_was_cloned(library, cloned):
    """load() by name, in any capitalisation, gives the voice's embedding, codes and transcript back."""
    library.add("Ann", cloned["icl"])
    loaded = library.load("  ANN ")
    assert torch.equal(loaded.embedding, cloned["icl"].embedding)
    assert torch.equal(loaded.reference_codes, cloned["icl"].reference_codes)
    assert loaded.reference_text == REFERENCE_TEXT


@pytest.mark.parametrize("name", ["Оля", "李小龙", "Ann/Bob: \"quoted\" <*?>", "😀 emoji 👨‍👩‍👧", "CON", "..", "a" * 64,
                                  "Zoë", "Zoë"])  # the last two: composed, and e + combining diaeresis
def test_any_name_a_person_writes_is_kept_exactly_in_a_file_safe_on_every_disk(library, cloned, name):
    """Names in other scripts, with path characters, emoji or a Windows device's name keep their spelling (composed
    as NFC), in a file whose name is plain lower-case ASCII inside the voices folder."""
    saved = library.add(name, cloned["x_vector"])
    assert saved.name == check_name(name) and [v.name for v in library.list()] == [saved.name]
    assert saved.path.parent == library.folder and saved.path.name.isascii()
    assert saved.path.stem.replace("-", "").isalnum() and saved.path.stem.lower() not in ("con", "nul", "prn")
    assert library.get(name).path == saved.path


def test_names_are_unique_however_they_are_capitalised(library, cloned):
    """'ann', 'ANN' and 'Ａｎｎ' (full-width) are 'Ann': refused unless replacing, which takes the new spelling and
    voice; names with the same file stem get files of their own."""
    library.add("Ann", cloned["icl"])
    for other in ("ann", " ANN ", "Ａｎｎ"):
        with pytest.raises(VoiceNameError, match=r"there is already a saved voice named 'Ann'; choose another name, "
                                                 r"or replace it"):
            library.add(other, cloned["x_vector"])
    replaced = library.add("ANN", cloned["x_vector"], replace=True)
    assert [(v.name, v.mode) for v in library.list()] == [("ANN", "x_vector")]
    library.add("Ann!", cloned["icl"])
    assert {v.path.name for v in library.list()} == {replaced.path.name, "ann-2.voice"}


@pytest.mark.parametrize("name,message", [
    ("", r"a saved voice needs a name"),
    ("   \t", r"a saved voice needs a name"),
    ("a" * (MAX_NAME_CHARS + 1), rf"is {MAX_NAME_CHARS + 1} characters long; a voice's name has at most 64"),
    ("two\nlines", r"holds LINE FEED|holds U\+000A"),
    ("nul\x00here", r"holds .*which a name cannot show"),
    ("line\u2028sep", r"holds LINE SEPARATOR"),
])
def test_unusable_names_are_refused_saying_why(library, cloned, name, message):
    with pytest.raises(VoiceNameError, match=message):
        library.add(name, cloned["icl"])
    assert library.list() == []


def test_an_unknown_name_lists_the_saved_voices(library, cloned):
    with pytest.raises(VoiceNameError, match=r"no saved voice is named 'Bob'; no voice has been saved yet"):
        library.load("Bob")
    library.add("Ann", cloned["icl"])
    library.add("Zoe", cloned["x_vector"])
    for call in (library.get, library.load, library.remove):
        with pytest.raises(VoiceNameError, match=r"no saved voice is named 'Bob'; the saved voices are: Ann, Zoe"):
            call("Bob")


def test_a_damaged_file_is_listed_with_its_problem_and_can_be_removed(library, cloned):
    """A cut-short voice file and a file that is no voice at all are listed as damaged, with VoiceFileError's reason
    (the name still shows where the header survived); the others list as usual, loading a damaged one says what is
    wrong, and removing it works. Files of other kinds in the folder are left alone."""
    good = library.add("Good", cloned["icl"])
    cut = library.add("Cut short", cloned["icl"])
    cut.path.write_bytes(cut.path.read_bytes()[:-100])
    (library.folder / "junk.voice").write_bytes(b"\x00" * 50)
    (library.folder / "notes.txt").write_text("mine")
    listed = {v.name: v for v in library.list()}
    assert list(listed) == ["Cut short", "Good", "junk"]
    assert "damaged" in listed["Cut short"].problem and listed["Cut short"].mode == ""
    assert listed["junk"].damaged and listed["Good"].problem == "" and listed["Good"].path == good.path
    with pytest.raises(VoiceFileError, match=r"cut-short\.voice: not a voice file, or a damaged one"):
        library.load("cut short")
    with pytest.raises(VoiceFileError):
        library.rename("junk", "Other")
    assert library.remove("Cut short").name == "Cut short" and not cut.path.exists()
    assert [v.name for v in library.list()] == ["Good", "junk"]
    assert library.summary().endswith("(1 damaged)")


def test_renaming_keeps_the_voice_and_its_date(library, cloned):
    """rename(): the new name (a new capitalisation too), the same voice and date, the old file gone; a name another
    voice has is refused."""
    library.add("Ann", cloned["icl"])
    library.add("Zoe", cloned["x_vector"])
    saved = library.get("Ann").saved
    renamed = library.rename("ann", "Grandma")
    assert renamed.name == "Grandma" and renamed.saved == saved and renamed.path.name == "grandma.voice"
    assert [v.name for v in library.list()] == ["Grandma", "Zoe"] and not (library.folder / "ann.voice").exists()
    assert torch.equal(library.load("Grandma").reference_codes, cloned["icl"].reference_codes)
    assert library.rename("grandma", "GRANDMA").path == renamed.path
    with pytest.raises(VoiceNameError, match=r"there is already a saved voice named 'Zoe'"):
        library.rename("Grandma", "zoe")


def test_a_file_without_a_date_is_dated_by_its_modification_time(library, cloned):
    """A voice file saved by hand (no labels) lists under its file's name and time."""
    library.folder.mkdir(parents=True)
    path = cloned["x_vector"].save(library.folder / "by-hand.voice")
    an_hour_ago = datetime.now(timezone.utc) - timedelta(hours=1)
    os.utime(path, (an_hour_ago.timestamp(), an_hour_ago.timestamp()))
    (voice,) = library.list()
    assert (voice.name, voice.mode) == ("by-hand", "x_vector")
    assert abs(voice.saved - an_hour_ago) < timedelta(seconds=1)


def test_erasing_all_voices_deletes_every_file_and_the_folder(library, cloned):
    """erase_all(): the voices, damaged ones and half-written files go, and the folder with them; the summary says
    what is stored before and after."""
    assert library.erase_all() == 0 and library.summary() == "none saved"
    library.add("Ann", cloned["icl"])
    library.add("Bob", cloned["x_vector"])
    (library.folder / "broken.voice").write_bytes(b"nothing")
    (library.folder / ".ann.voice.x1y2").write_bytes(b"left by a crash")
    assert library.summary().startswith("3 voices, ") and library.summary().endswith(" kB (1 damaged)")
    assert library.erase_all() == 3
    assert not library.folder.exists() and library.list() == [] and library.summary() == "none saved"


def test_clone_saves_what_whisper_heard_and_checks_everything_before_a_model_loads(library, base_tts, transcriber,
                                                                                   reference_wav):
    """clone(): in "icl" mode without a transcript, the real Whisper hears the recording and the voice keeps its words;
    with one, nothing is transcribed. A taken name, an unknown mode, a bad recording and a recording with no words
    (a 440 Hz tone) are refused before the model is asked for, and nothing is saved."""
    import numpy as np

    asked, heard = [], []

    def engine():
        asked.append(True)
        return base_tts

    def transcribe(audio_16k):
        heard.append(audio_16k.size / 16_000)
        return transcriber.transcribe(audio_16k).text

    saved = library.clone(engine, "Ann", reference_wav, transcribe=transcribe)
    assert (saved.transcript, saved.mode) == (HEARD_REFERENCE, "icl") and len(asked) == 1
    assert heard == [pytest.approx(6.42, abs=0.01)]
    typed = library.clone(engine, "Typed", reference_wav, text=REFERENCE_TEXT, transcribe=transcribe)
    assert typed.transcript == REFERENCE_TEXT and len(heard) == 1
    asked.clear()
    tone = (0.1 * np.sin(2 * np.pi * 440 * np.arange(5 * 16_000) / 16_000)).astype(np.float32)
    for call, error, message in [
        (lambda: library.clone(engine, "ann", reference_wav), VoiceNameError, r"already a saved voice named 'Ann'"),
        (lambda: library.clone(engine, "Bo", reference_wav, mode="xvector"), ValueError, r"unknown clone mode"),
        (lambda: library.clone(engine, "Bo", tone[:16_000], 16_000, mode="x_vector"), ReferenceAudioError,
         r"the recording is 1\.0 s long"),
        (lambda: library.clone(engine, "Bo", tone, 16_000, transcribe=transcribe), InputTextError,
         r"no words were heard in the recording \(5\.0 s\); give what it says, or clone in 'x_vector' mode"),
        (lambda: library.clone(engine, "Bo", reference_wav), InputTextError,
         r"cloning in 'icl' mode needs what the recording says; without it, clone in 'x_vector' mode"),
    ]:
        with pytest.raises(error, match=message):
            call()
    assert asked == [] and [v.name for v in library.list()] == ["Ann", "Typed"]
