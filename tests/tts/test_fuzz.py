"""Generated text through the speech engine's front and into audio: no crash, clear rejections, sane audio.

Hypothesis draws texts a user or an LLM could hand over: empty, whitespace, 20,000 characters, emoji,
right-to-left scripts, control characters, mixed scripts, SSML-like tags, lone surrogates. 1,000 go
through the text front (cleaning, segments, the real tokenizer and prompt); 100 on through the real
talker, predictor and codec of a one-frame-per-segment checkpoint.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.errors import InputTextError
from engine.tts import load_tts
from engine.text import clean_text
from engine.tts.prompt import split_text
from engine.tts.stream import SEGMENT_CHARS
from tests.conftest import copy_checkpoint

PIECES = [
    "Hello there.", "  ", "\t\n\r", "\x00\x07\x1b[31m", "\u200b\u200d\ufeff", "😀👩‍👩‍👧‍👦🇯🇵", "مرحبا بالعالم",
    "שלום עולם", "\u202egnirts desrever\u202c", "日本語のテキスト。", "한국어 문장", "Ünïcödé ñ ß", "<speak>",
    '<break time="1s"/>', "</prosody>", "&amp; &lt;", "\ud800", "\udfff", "1,000.50", "3:14", "e.g.", "!!!",
    "…", "—", "\u0301\u0301", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "Ω≈ç√∫", "\u2028\u2029",
]

texts = st.one_of(
    st.text(st.characters(exclude_categories=()), max_size=300),  # any code point, surrogates included
    st.lists(st.sampled_from(PIECES), max_size=12).map("".join),
    st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=20)), max_size=8).map(" ".join),
    st.sampled_from(["", " ", "\n\n", "\x00", "A" * 20_000, "word " * 4_000, "😀" * 5_000]),
)


@pytest.fixture(scope="module")
def one_frame_tts(tiny_checkpoint, tmp_path_factory):
    """The tiny checkpoint capped at one frame per segment (official max_new_tokens=2)."""
    return load_tts(copy_checkpoint(tiny_checkpoint, tmp_path_factory.mktemp("ckpt") / "one", max_new_tokens=2))


SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture]


@settings(max_examples=1000, deadline=None, suppress_health_check=SLOW_OK)
@given(text=texts)
def test_any_text_becomes_talker_inputs_or_is_rejected_clearly(one_frame_tts, text):
    """The front stream() runs before any audio (clean, split into segments, tokenize, build the prompt):
    a text with nothing speakable is rejected with a readable InputTextError, any other text gives
    segments of at most SEGMENT_CHARS, each with finite talker inputs."""
    tts = one_frame_tts
    try:
        cleaned = clean_text(text)
    except InputTextError as e:
        assert "nothing to speak" in str(e)
        with pytest.raises(InputTextError):
            tts.stream(text, "ryan", seed=0)  # the engine rejects it at once, before any work
        return
    segments = split_text(cleaned, SEGMENT_CHARS)
    assert segments and all(0 < len(s) <= SEGMENT_CHARS for s in segments)
    voice = tts.resolve_voice("ryan")
    for segment in segments:
        ids = tts.prompts.text_ids(segment)
        assert ids, f"segment {segment!r} has no tokens"
        inputs = tts.prompts.build(ids, voice, True, tts.device)
        assert inputs.prefill.isfinite().all() and inputs.track.isfinite().all()


def _speak_checked(one_frame_tts, text):
    try:
        stream = one_frame_tts.stream(text, "ryan", seed=0)
    except InputTextError:
        return  # the test above checks the rejections
    segments = split_text(clean_text(text), SEGMENT_CHARS)
    chunks = list(stream)
    pcm = np.concatenate([c.pcm for c in chunks]) if chunks else np.zeros(0, np.float32)
    assert np.isfinite(pcm).all() and np.abs(pcm).max(initial=0) <= 1.0
    assert len(chunks) <= len(segments) and pcm.size <= len(segments) * one_frame_tts.codec.config.frame_samples


@settings(max_examples=100, deadline=None, suppress_health_check=SLOW_OK)
@given(text=texts.filter(lambda t: len(t) <= 1000))
def test_any_text_is_spoken_as_finite_bounded_audio(one_frame_tts, text):
    """Through to audio: finite samples in [-1, 1], at most one frame (the checkpoint's cap) a segment."""
    _speak_checked(one_frame_tts, text)


def test_twenty_thousand_characters_are_spoken_segment_by_segment(one_frame_tts):
    """The longest texts: 20,000 characters with no space, and 20,000 of emoji and words."""
    for text in ("A" * 20_000, ("word 😀 " * 3_000)[:20_000]):
        _speak_checked(one_frame_tts, text)
