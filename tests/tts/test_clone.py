"""Voice cloning with a Base model: cloned voices, prompts and decode against the official qwen-tts package on the
same random-weight folder; saved voices; and each bad recording's error (the encoders alone: test_speaker.py,
test_encoder.py).

Tolerances: float32 on both sides. Speaker embeddings agree to 1e-5 absolute (seen: ~6e-7); reference codes and
greedy codes must be identical; waveforms from identical codes agree to 1e-4 absolute (seen: ~4e-6).
"""

import dataclasses

import numpy as np
import pytest
import soundfile
import torch

from engine.errors import InputTextError, ReferenceAudioError, VoiceFileError
from engine.tts import SamplingOptions, load_tts, load_voice
from engine.tts.clone import MAX_REFERENCE_S, MIN_REFERENCE_S, read_labels
from tests.conftest import copy_checkpoint
from tests.oracle import import_qwen_tts
from tests.tts.conftest import speech_like

FRAMES = 24  # official max_new_tokens=25 -> 24 frames with codes
RATE_HZ = 24_000
REFERENCE_TEXT = "Hello there, this is my own voice."
LONG_TEXT = "Please say this sentence in the voice of the recording, word for word."  # longer than 3.5 s of codes
SHORT_TEXT = "Hi there."


@pytest.fixture(scope="module")
def recording():
    return speech_like(3.5)


@pytest.fixture(scope="module")
def capped(base_checkpoint, tmp_path_factory):
    """The tiny Base checkpoint capped at FRAMES frames, so greedy runs without EOS stay short."""
    return copy_checkpoint(base_checkpoint, tmp_path_factory.mktemp("clone") / "base", max_new_tokens=FRAMES + 1)


@pytest.fixture(scope="module")
def tts(capped):
    return load_tts(capped, precision="float32")  # the official arithmetic, as the oracle computes


@pytest.fixture(scope="module")
def official(capped):
    qwen_tts = import_qwen_tts()
    return qwen_tts.Qwen3TTSModel.from_pretrained(str(capped), dtype=torch.float32)


@pytest.fixture(scope="module")
def voices(tts, recording):
    return {mode: tts.clone_voice(recording, RATE_HZ, text=REFERENCE_TEXT, mode=mode) for mode in ("icl", "x_vector")}


def greedy(tts, text, voice, whole_text=False):
    """(codes (frames, 16), pcm, chunks) of a greedy utterance."""
    chunks = list(tts.stream(text, voice=voice, sampling=SamplingOptions.greedy(), whole_text=whole_text))
    return np.concatenate([c.codes for c in chunks]), np.concatenate([c.pcm for c in chunks]), chunks


def official_clone(official, recording, text, mode, whole_text):
    """Greedy codes and the waveform the official generate_voice_clone returns (the reference's audio cut off)."""
    items = official.create_voice_clone_prompt((recording, RATE_HZ), ref_text=REFERENCE_TEXT,
                                               x_vector_only_mode=mode == "x_vector")
    prompt = official._prompt_items_to_voice_clone_prompt(items)
    input_ids = official._tokenize_texts([official._build_assistant_text(text)])
    ref_ids = [official._tokenize_texts([official._build_ref_text(REFERENCE_TEXT)])[0]]
    kwargs = official._merge_generate_kwargs(do_sample=False, subtalker_dosample=False)
    with torch.no_grad():
        codes, _ = official.model.generate(input_ids=input_ids, ref_ids=ref_ids, voice_clone_prompt=prompt,
                                           languages=["auto"], non_streaming_mode=whole_text, **kwargs)
    codes = codes[0]
    reference = prompt["ref_code"][0]
    together = codes if reference is None else torch.cat((reference, codes))
    wavs, rate = official.model.speech_tokenizer.decode([{"audio_codes": together}])
    assert rate == RATE_HZ
    wav = np.asarray(wavs[0], dtype=np.float32)
    if reference is not None:  # as generate_voice_clone cuts it
        wav = wav[int(reference.shape[0] / together.shape[0] * wav.shape[0]):]
    return codes.numpy(), wav


# ---- against the official package ----


@pytest.mark.oracle
def test_official_package_loads_a_generated_base_folder(official, tts):
    """qwen-tts reads the generated Base folder: a Base model with a speaker encoder, no speakers, our languages."""
    assert official.model.tts_model_type == "base" and official.model.speaker_encoder is not None
    assert list(official.get_supported_speakers()) == [] == tts.speakers
    assert official.get_supported_languages() == tts.languages


@pytest.mark.oracle
def test_reference_codes_equal_the_officials(official, voices, recording):
    """The recording's codes are the official speech tokenizer's, frame for frame, and vary (no constant code)."""
    expected = official.model.speech_tokenizer.encode(recording, sr=RATE_HZ).audio_codes[0]
    got = voices["icl"].reference_codes
    assert got.shape == (44, 16) and torch.equal(got, expected)  # 3.5 s: 43.75 frames, a started frame counts
    assert all(len(set(got[:, q].tolist())) > 5 for q in range(16))
    assert voices["x_vector"].reference_codes is None


@pytest.mark.oracle
@pytest.mark.parametrize("mode,whole_text,text", [
    ("icl", False, LONG_TEXT),  # the text outlasts the recording's frames: the rest is fed one token a frame
    ("icl", False, SHORT_TEXT),  # the recording's frames outlast the text: it is padded
    ("icl", True, LONG_TEXT),
    ("x_vector", False, LONG_TEXT),
    ("x_vector", True, SHORT_TEXT),
])
def test_greedy_codes_and_waveform_equal_the_official_voice_clone(tts, official, voices, recording, mode,
                                                                  whole_text, text):
    """Greedy decoding in a cloned voice gives the official codes exactly, and its waveform within 1e-4."""
    codes, wav = official_clone(official, recording, text, mode, whole_text)
    got_codes, pcm, _ = greedy(tts, text, voices[mode], whole_text)
    assert codes.shape == (FRAMES, 16)
    np.testing.assert_array_equal(got_codes, codes)
    np.testing.assert_allclose(pcm, wav, atol=1e-4, rtol=0)


@pytest.mark.oracle
def test_streamed_first_chunk_holds_no_reference_audio(tts, official, voices, recording):
    """An in-context voice's first chunk is one frame of new speech, the official's first 80 ms after its cut."""
    _, wav = official_clone(official, recording, LONG_TEXT, "icl", False)
    first = next(iter(tts.stream(LONG_TEXT, voice=voices["icl"], sampling=SamplingOptions.greedy())))
    assert first.codes.shape == (1, 16) and first.pcm.shape == (tts.codec.config.frame_samples,)
    np.testing.assert_allclose(first.pcm, wav[:first.pcm.shape[0]], atol=1e-4, rtol=0)


# ---- voices: made once, saved, reused ----


def test_saved_voice_round_trips_and_speaks_the_same(tts, voices, tmp_path):
    """A voice saved and loaded again holds the same values and gives the same greedy codes, in both modes."""
    for mode, voice in voices.items():
        path = voice.save(tmp_path / f"{mode}.voice")
        assert path.stat().st_size < 10_000  # a small file: the embedding, and 44 frames of codes for icl
        loaded = load_voice(path)
        assert (loaded.mode, loaded.reference_text, loaded.model_size) == (voice.mode, voice.reference_text,
                                                                           voice.model_size)
        assert torch.equal(loaded.embedding, voice.embedding)
        assert (loaded.reference_codes is None) == (mode == "x_vector")
        if mode == "icl":
            assert torch.equal(loaded.reference_codes, voice.reference_codes)
        np.testing.assert_array_equal(greedy(tts, SHORT_TEXT, loaded)[0], greedy(tts, SHORT_TEXT, voice)[0])


def test_labels_are_kept_beside_the_voice_and_read_from_a_damaged_file(voices, tmp_path):
    """save(labels=...) keeps text beside the voice; read_labels gives it back without the format's own keys, also
    from a file cut short in its tensors; a label may not take a format key."""
    path = voices["icl"].save(tmp_path / "labelled.voice", labels={"name": "Zoë 😀", "saved": "2025-01-02T03:04:05"})
    assert read_labels(path) == {"name": "Zoë 😀", "saved": "2025-01-02T03:04:05"}
    assert load_voice(path).reference_text == REFERENCE_TEXT
    path.write_bytes(path.read_bytes()[:-64])
    assert read_labels(path)["name"] == "Zoë 😀" and read_labels(tmp_path / "none.voice") == {}
    with pytest.raises(ValueError, match=r"labels may not use the voice format's own keys: mode"):
        voices["icl"].save(tmp_path / "x.voice", labels={"mode": "x_vector"})


def test_a_voice_is_prepared_once_for_every_utterance(tts, recording, monkeypatch):
    """Its prompt rows and the codec's state after its recording are made once, not per utterance."""
    voice = tts.clone_voice(recording, RATE_HZ, text=REFERENCE_TEXT)
    contexts = []
    monkeypatch.setattr(tts.codec, "context", lambda codes: contexts.append(codes))  # clone_voice made it
    greedy(tts, SHORT_TEXT, voice)
    key = (tts.resolve_voice(None, voice=voice), tts.device)
    rows = tts.prompts._voices[key]
    for _ in range(2):
        greedy(tts, SHORT_TEXT, voice)
    assert contexts == [] and tts.prompts._voices[key] is rows


def test_voice_for_another_model_is_refused(tts, voices):
    """A voice cloned with another Base model size says so instead of speaking garbage."""
    other = dataclasses.replace(voices["x_vector"], model_size="1b7", embedding=torch.zeros(96))
    with pytest.raises(InputTextError, match=r"this voice was cloned with another model \(a 1b7 Base model, a 96-wide "
                                             r"embedding; this is a 0b6 one, 64 wide\): clone it again"):
        tts.stream(SHORT_TEXT, voice=other)


def test_models_that_do_not_clone_refuse_cloned_voices(short_tts, voices, recording):
    """A CustomVoice model neither clones nor speaks in a cloned voice; a Base model takes no speaker name."""
    with pytest.raises(InputTextError, match=r"voice cloning needs a Base model .*; this is a custom_voice model"):
        short_tts.clone_voice(recording, RATE_HZ, text=REFERENCE_TEXT)
    with pytest.raises(InputTextError, match=r"a cloned voice needs a Base model"):
        short_tts.stream(SHORT_TEXT, "ryan", voice=voices["icl"])


def test_base_model_takes_no_speaker_name(tts, voices):
    with pytest.raises(InputTextError, match=r"a Base model has no built-in speakers"):
        tts.stream(SHORT_TEXT, "ryan", voice=voices["icl"])


# ---- recordings in other forms ----


def test_stereo_integer_and_file_recordings_clone_like_the_mono_float_samples(tts, voices, recording, tmp_path):
    """Stereo (channels mixed), 16-bit PCM and a WAV file of the same recording give (nearly) the same voice."""
    stereo = tts.clone_voice(np.stack((recording, recording), axis=1), RATE_HZ, mode="x_vector")
    torch.testing.assert_close(stereo.embedding, voices["x_vector"].embedding, atol=1e-6, rtol=0)
    pcm16 = np.round(recording * 32767).astype(np.int16)
    from_int = tts.clone_voice(pcm16, RATE_HZ, text=REFERENCE_TEXT)
    soundfile.write(tmp_path / "voice.wav", pcm16, RATE_HZ, subtype="PCM_16")
    from_file = tts.clone_voice(tmp_path / "voice.wav", text=REFERENCE_TEXT)
    torch.testing.assert_close(from_file.embedding, from_int.embedding, atol=1e-6, rtol=0)
    assert torch.equal(from_file.reference_codes, from_int.reference_codes)
    torch.testing.assert_close(from_int.embedding, voices["icl"].embedding, atol=1e-2, rtol=0)


@pytest.mark.parametrize("rate_hz", [16_000, 44_100, 48_000])
def test_other_sample_rates_are_resampled_to_24_khz(tts, voices, recording, rate_hz):
    """The recording at another rate is resampled: as many frames as its length at 12.5 Hz, a close embedding."""
    import soxr

    voice = tts.clone_voice(soxr.resample(recording, RATE_HZ, rate_hz), rate_hz, text=REFERENCE_TEXT)
    assert voice.reference_codes.shape == (44, 16)
    cosine = torch.nn.functional.cosine_similarity(voice.embedding, voices["icl"].embedding, dim=0)
    assert cosine > (0.9 if rate_hz < RATE_HZ else 0.99)  # 16 kHz lacks the 8-12 kHz that the mel reaches


# ---- bad input: a clear error, and nothing changed ----


@pytest.mark.parametrize("samples,rate_hz,message", [
    (speech_like(MIN_REFERENCE_S - 0.5), RATE_HZ, r"the recording is 2\.5 s long; a voice is cloned from 3 to 30 s"),
    (speech_like(MAX_REFERENCE_S + 1, 16_000), 16_000, r"the recording is 31\.0 s long; a voice is cloned from 3 to"),
    (np.zeros(0, np.float32), RATE_HZ, r"the recording is 0\.0 s long"),
    (np.zeros(RATE_HZ * 5, np.float32), RATE_HZ, r"the recording is silent \(its level is -inf dBFS\)"),
    (speech_like(5) * 0.002, RATE_HZ, r"the recording is silent \(its level is -\d+ dBFS\); check that the micro"),
    (np.clip(speech_like(5) * 8, -1, 1), RATE_HZ, r"the recording is clipped \(\d+\.\d% of its samples are at full "
                                                  r"scale\); record it again with the input level lower"),
    (np.full(RATE_HZ * 5, np.nan, np.float32), RATE_HZ, r"samples that are not numbers"),
    (np.zeros((2, RATE_HZ * 5), np.float32), RATE_HZ, r"samples of shape \(2, 120000\) are not a recording"),
    (np.array(["a"] * RATE_HZ * 5), RATE_HZ, r"samples of type <U1 are not audio"),
])
def test_unusable_recordings_are_refused_with_what_to_do(tts, samples, rate_hz, message):
    with pytest.raises(ReferenceAudioError, match=message):
        tts.clone_voice(samples, rate_hz, mode="x_vector")


def test_files_that_are_not_audio_are_refused(tts, tmp_path):
    (tmp_path / "notes.wav").write_text("not audio at all")
    with pytest.raises(ReferenceAudioError, match=r"notes\.wav: not an audio file Parley can read \(.*\); use WAV"):
        tts.clone_voice(tmp_path / "notes.wav", mode="x_vector")
    with pytest.raises(ReferenceAudioError, match=r"missing\.wav: no such file"):
        tts.clone_voice(tmp_path / "missing.wav", mode="x_vector")


def test_in_context_cloning_needs_the_transcript(tts, recording):
    """'icl' mode without a transcript (or one with no words) says to give it or use 'x_vector' mode."""
    for text in (None, "", " \n ", "..."):
        with pytest.raises(InputTextError, match=r"cloning in 'icl' mode needs what the recording says "
                                                 r"\(text=\.\.\.\); without it, clone in 'x_vector' mode"):
            tts.clone_voice(recording, RATE_HZ, text=text)
    assert tts.clone_voice(recording, RATE_HZ, mode="x_vector").reference_text is None


def test_wrong_arguments_are_refused(tts, recording, tmp_path):
    with pytest.raises(ValueError, match=r"unknown clone mode 'xvector'; choose one of: icl, x_vector"):
        tts.clone_voice(recording, RATE_HZ, mode="xvector")
    with pytest.raises(ValueError, match=r"samples need their sample rate"):
        tts.clone_voice(recording, text=REFERENCE_TEXT)


def test_damaged_voice_files_are_refused(voices, tmp_path):
    """A missing, truncated, foreign or future voice file raises VoiceFileError saying what is wrong."""
    good = voices["icl"].save(tmp_path / "good.voice").read_bytes()
    with pytest.raises(VoiceFileError, match=r"nothing\.voice: no such voice file"):
        load_voice(tmp_path / "nothing.voice")
    (tmp_path / "cut.voice").write_bytes(good[: len(good) // 2])
    with pytest.raises(VoiceFileError, match=r"cut\.voice: not a voice file, or a damaged one \(.*\); clone the voice"):
        load_voice(tmp_path / "cut.voice")
    from safetensors.torch import save_file

    save_file({"embedding": torch.zeros(64)}, str(tmp_path / "other.voice"), metadata={"format": "pt"})
    with pytest.raises(VoiceFileError, match=r"other\.voice: not a Parley voice file \(format 'pt'\)"):
        load_voice(tmp_path / "other.voice")
    metadata = {"format": "parley.cloned_voice", "version": "2", "mode": "x_vector", "model_size": "0b6"}
    save_file({"embedding": torch.zeros(64)}, str(tmp_path / "future.voice"), metadata=metadata)
    with pytest.raises(VoiceFileError, match=r"a voice file of version '2'; this Parley reads version 1"):
        load_voice(tmp_path / "future.voice")
    save_file({"embedding": torch.zeros(64)}, str(tmp_path / "half.voice"), metadata={**metadata, "mode": "icl",
                                                                                       "version": "1"})
    with pytest.raises(VoiceFileError, match=r"damaged \(an in-context voice without its recording's codes"):
        load_voice(tmp_path / "half.voice")
