"""The Assistant with the user's saved voices, on real parts (the tiny Base and CustomVoice checkpoints, SmolLM2,
Whisper base, the PulseAudio null sink, voice files in a data folder of the module's own): replies in a saved
voice, switching between it and a speaker, what happens when one cannot be spoken, and cloning new ones."""

import dataclasses
from dataclasses import replace

import numpy as np
import pytest

from engine.errors import (InputTextError, ModelFilesError, ModelMissingError, ReferenceAudioError, VoiceFileError,
                           VoiceNameError)
from engine.events import Loading, Notice, Ready, SavedVoiceUnavailable, VoiceNotFound
from engine.settings import AssistantConfig
from engine.voice_library import VoiceLibrary, same_name
from tests.conftest import HEARD_REFERENCE, REFERENCE_TEXT
from tests.test_assistant import loaded, turn

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the README's install builds it)")


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    """The module's own data folder (XDG_DATA_HOME), where the assistant finds saved voices, and its library."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_DATA_HOME", str(tmp_path_factory.mktemp("data")))
        yield VoiceLibrary()


@pytest.fixture(scope="module")
def base_tts(short_base_checkpoint):
    from engine.tts import load_tts

    return load_tts(short_base_checkpoint)


@pytest.fixture(scope="module")
def saved(library, base_tts, reference_wav):
    """'Ann' (in-context) and 'Bob' (x-vector) cloned from the espeak recording and saved."""
    library.add("Ann", base_tts.clone_voice(reference_wav, text=REFERENCE_TEXT))
    library.add("Bob", base_tts.clone_voice(reference_wav, mode="x_vector"))
    return library


@pytest.fixture(scope="module")
def config(short_checkpoint, short_base_checkpoint, smollm2_path, tmp_path_factory):
    """Speaking in the saved voice 'Ann' with the tiny Base model; 'ryan' is the speaker beside it. No Whisper (a
    missing folder): typed turns only, and a quicker load."""
    from engine.llm.chat import ChatOptions

    return AssistantConfig(
        tts_model=str(short_checkpoint), base_model=str(short_base_checkpoint), saved_voice="ann", speaker="ryan",
        stt_model=str(tmp_path_factory.mktemp("none") / "none"), llm_model=str(smollm2_path),
        listen_mode="push-to-talk", device="cpu", history_file=tmp_path_factory.mktemp("history") / "h.sqlite3",
        chat_options=ChatOptions(n_ctx=512, max_tokens=16, n_threads=1, temperature=0.0), tts_seed=1,
    )


def test_a_saved_voice_speaks_replies_and_typed_text_with_the_base_model(saved, config, base_tts, short_base_checkpoint,
                                                                         short_checkpoint, voices_built, sound_server):
    """The settings' saved voice: the Base model loads in place of the CustomVoice one, Ready names the voice (and
    still offers the CustomVoice model's speakers), typed text is the audio TTSEngine.stream gives in that voice
    with the same seed, and the LLM's replies are spoken in it too."""
    import json

    assistant, events = loaded(config)
    try:
        info = events.of(Ready)[-1].info
        assert (info.saved_voice, info.speaker, info.tts_model) == ("Ann", None, short_base_checkpoint)
        assert (info.style_kind, info.style_unsupported) == (None, "a saved voice speaks as it was recorded, without "
                                                                  "a speaking style")
        speakers = json.loads((short_checkpoint / "config.json").read_text())["talker_config"]["spk_id"]
        assert set(info.speakers) == set(speakers) and info.style_kind is None
        assert not events.of(SavedVoiceUnavailable) and not events.of(VoiceNotFound)
        result = turn(assistant, events, assistant.speak, "Hello there.")
        voice = saved.load("Ann")
        expected = np.concatenate([c.pcm for c in base_tts.stream("Hello there.", voice=voice, seed=1)])
        np.testing.assert_allclose(result.audio, expected, atol=1e-5, rtol=0)
        assert result.heard_text == "Hello there."
        voices_built.clear()
        assert turn(assistant, events, assistant.send, "Name three colors.").reply_text.strip()
        assert voices_built and all(v.clone is not None and v.clone.mode == "icl" for v in voices_built)
    finally:
        assistant.close()


def test_switching_between_a_speaker_and_saved_voices_reloads_only_the_speech_model_change(saved, config,
                                                                                          short_checkpoint,
                                                                                          short_base_checkpoint,
                                                                                          sound_server):
    """From the saved voice to the speaker and back, the speech model reloads (the loading steps again); from one saved
    voice to another it does not; previews play in the saved voice the Base model speaks, and say to choose a saved
    voice first while a speaker's model is loaded."""
    assistant, events = loaded(config)
    try:
        loads = len(events.of(Loading))
        assistant.apply(replace(config, saved_voice="Bob"))
        info = events.of(Ready)[-1].info
        assert (info.saved_voice, len(events.of(Loading))) == ("Bob", loads)
        assert assistant.dialogue.options.voice.mode == "x_vector"
        notices = len(events.of(Notice))
        assistant.preview_saved_voice("ann")
        assert turn(assistant, events, assistant.speak, "Still Bob.").heard_text == "Still Bob."
        assert len(events.of(Notice)) == notices  # the preview played, queued before the turn

        assistant.apply(replace(config, saved_voice=""))
        info = events.of(Ready)[-1].info
        assert (info.saved_voice, info.speaker, info.tts_model) == (None, "ryan", short_checkpoint)
        assert len(events.of(Loading)) > loads
        assert turn(assistant, events, assistant.speak, "Ryan now.").heard_text == "Ryan now."
        assistant.preview_saved_voice("Ann")
        notice = events.wait_for(Notice, count=notices + 1)
        assert isinstance(notice.error, InputTextError) and "the saved voice 'Ann' can be heard once it is chosen" \
            in notice.message and notice.doing == "playing the voice's sample"

        loads = len(events.of(Loading))
        assistant.apply(config)
        assert events.of(Ready)[-1].info.tts_model == short_base_checkpoint and len(events.of(Loading)) > loads
    finally:
        assistant.close()


@pytest.mark.parametrize("case", ["removed", "damaged", "no base model", "another model"])
def test_a_saved_voice_that_cannot_be_spoken_gives_way_to_the_speaker_saying_why(saved, config, short_checkpoint,
                                                                                 tmp_path, case, sound_server):
    """A voice no longer saved, a damaged voice file, no Base model where the settings say, or a voice cloned with
    another Base model: Parley loads the speaker's model and speaks as 'ryan', and SavedVoiceUnavailable says why."""
    name, setting = "Ann", {}
    if case == "removed":
        name = "Nobody"
    elif case == "damaged":
        name = "Broken"
        path = saved.add("Broken", saved.load("Bob")).path
        path.write_bytes(path.read_bytes()[:40])
    elif case == "no base model":
        setting = {"base_model": str(tmp_path / "no-base")}
    else:
        name = "Bigger"
        other = saved.load("Bob")
        saved.add("Bigger", dataclasses.replace(other, model_size="1b7", embedding=other.embedding.repeat(2)))
    try:
        assistant, events = loaded(replace(config, saved_voice=name, **setting))
        try:
            (unavailable,) = events.of(SavedVoiceUnavailable)
            info = events.of(Ready)[-1].info
            assert (info.speaker, info.saved_voice, info.tts_model) == ("ryan", None, short_checkpoint)
            assert unavailable.name == name and unavailable.used == "ryan"
            assert unavailable.message.startswith(f"speaking as 'ryan' instead of the saved voice {name!r}: ")
            expected = {"removed": (VoiceNameError, "no saved voice is named 'Nobody'; the saved voices are: Ann"),
                        "damaged": (VoiceFileError, "broken.voice: not a voice file, or a damaged one"),
                        "no base model": (ModelMissingError, "no-base: no such model folder"),
                        "another model": (InputTextError, "this voice was cloned with another model")}[case]
            assert isinstance(unavailable.error, expected[0]) and expected[1] in unavailable.message
            assert turn(assistant, events, assistant.speak, "Hello.").heard_text == "Hello."
        finally:
            assistant.close()
    finally:
        for extra in ("Broken", "Bigger"):
            if any(same_name(v.name, extra) for v in saved.list()):
                saved.remove(extra)


def test_cloning_transcribes_the_recording_with_whisper_and_saves_the_voice(saved, config, whisper_dir,
                                                                          reference_wav, sound_server):
    """clone_voice() with no transcript, speech recognition off and a speaker's model loaded: a Whisper loaded for
    the call hears the recording and the settings' Base model clones it; the voice is saved with what was heard, and
    choosing it speaks in it. Cloning the voice in use again under its name (replace) takes it at once."""
    speaker = replace(config, saved_voice="", stt_model=str(whisper_dir), voice_input=False)
    assistant, events = loaded(speaker)
    try:
        made = assistant.clone_voice("Carol", reference_wav)
        assert (made.name, made.mode, made.transcript) == ("Carol", "icl", HEARD_REFERENCE)
        assert saved.get("carol").path == made.path and events.of(Ready)[-1].info.speaker == "ryan"
        assistant.apply(replace(speaker, saved_voice="Carol"))
        assert events.of(Ready)[-1].info.saved_voice == "Carol"
        assert turn(assistant, events, assistant.speak, "Carol here.").heard_text == "Carol here."
        ready = len(events.of(Ready))
        again = assistant.clone_voice("CAROL", reference_wav, mode="x_vector", replace=True)
        assert again.mode == "x_vector" and len(events.of(Ready)) == ready + 1
        assert assistant.dialogue.options.voice.mode == "x_vector"
        assert events.of(Ready)[-1].info.saved_voice == "CAROL"
    finally:
        assistant.close()
        saved.remove("Carol")


def test_cloning_refuses_bad_names_recordings_and_a_missing_base_model_readably(saved, config, reference_wav, tmp_path,
                                                                              sound_server):
    """A taken name, an unusable recording or a mode with no transcript to be had are refused before any model loads
    (nothing saved); a missing Base model is named with how to download it."""
    import soundfile

    assistant, events = loaded(replace(config, saved_voice=""))
    try:
        with pytest.raises(VoiceNameError, match=r"there is already a saved voice named 'Ann'"):
            assistant.clone_voice("ann", reference_wav)
        with pytest.raises(VoiceNameError, match=r"a saved voice needs a name"):
            assistant.clone_voice("  ", reference_wav)
        short = tmp_path / "short.wav"
        soundfile.write(short, np.zeros(16_000), 16_000)
        with pytest.raises(ReferenceAudioError, match=r"short\.wav: the recording is 1\.0 s long"):
            assistant.clone_voice("Dan", short)
        silent = tmp_path / "silent.wav"
        soundfile.write(silent, np.zeros(5 * 16_000), 16_000)
        with pytest.raises(ReferenceAudioError, match=r"the recording is silent"):
            assistant.clone_voice("Dan", silent)
        (tmp_path / "notes.wav").write_text("not audio")
        with pytest.raises(ReferenceAudioError, match=r"not an audio file Parley can read"):
            assistant.clone_voice("Dan", tmp_path / "notes.wav")
        with pytest.raises(ValueError, match=r"unknown clone mode 'xvector'"):
            assistant.clone_voice("Dan", reference_wav, mode="xvector")
        assistant.config = replace(assistant.config, base_model=str(tmp_path / "no-base"))
        with pytest.raises(ModelFilesError, match=r"no-base: no such model folder"):
            assistant.clone_voice("Dan", reference_wav, mode="x_vector")
        assert [v.name for v in saved.list()] == ["Ann", "Bob"]
    finally:
        assistant.close()



def test_erasing_every_saved_voice_while_one_speaks_gives_way_to_the_speaker(config, base_tts, reference_wav,
                                                                             tmp_path, monkeypatch, sound_server):
    """erase_saved_voices(): every voice file and the folder go; the assistant, which spoke in one, now speaks as
    the speaker and says why."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    library = VoiceLibrary()
    library.add("Dee", base_tts.clone_voice(reference_wav, mode="x_vector"))
    library.add("Eve", base_tts.clone_voice(reference_wav, mode="x_vector"))
    assistant, events = loaded(replace(config, saved_voice="Dee"))
    try:
        assert events.of(Ready)[-1].info.saved_voice == "Dee"
        assert assistant.erase_saved_voices() == 2
        assert not library.folder.exists() and library.list() == []
        (unavailable,) = events.of(SavedVoiceUnavailable)
        assert unavailable.name == "Dee" and isinstance(unavailable.error, VoiceNameError)
        assert events.of(Ready)[-1].info.speaker == "ryan"
        assert turn(assistant, events, assistant.speak, "Ryan again.").heard_text == "Ryan again."
    finally:
        assistant.close()
