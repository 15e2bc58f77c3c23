"""The streaming engine on a generated checkpoint: chunks, reproducibility, cancel, bad input, long text."""

import threading

import numpy as np
import pytest
import torch

from engine.errors import InputTextError
from engine.tts import SamplingOptions, load_tts
from engine.tts import stream as stream_module
from engine.tts.stream import FRAMES_PER_CHAR, MIN_FRAMES_CAP


def test_stream_yields_one_frame_of_24khz_pcm_per_chunk(short_tts):
    """With chunk_frames=1 each chunk holds one frame: 16 codes and 1920 float32 samples in [-1, 1] at 24 kHz."""
    chunks = list(short_tts.stream("Hello there.", "ryan", "english", seed=1, chunk_frames=1))
    assert short_tts.sample_rate_hz == 24000
    assert len(chunks) == 6  # max_new_tokens=7 in this checkpoint's generation_config.json
    for c in chunks:
        assert c.codes.shape == (1, 16) and c.codes.dtype == np.int64
        assert c.pcm.shape == (1920,) and c.pcm.dtype == np.float32
        assert np.isfinite(c.pcm).all() and np.abs(c.pcm).max() <= 1.0
    assert np.abs(np.concatenate([c.pcm for c in chunks])).max() > 0  # not silence
    assert all(a.t_ready <= b.t_ready for a, b in zip(chunks, chunks[1:]))


def test_streamed_audio_equals_a_full_decode_of_the_same_codes(short_tts):
    """Frame-by-frame streamed PCM equals the codec's full decode of all the utterance's codes."""
    chunks = list(short_tts.stream("A sentence to stream.", "serena", seed=3))
    codes = torch.from_numpy(np.concatenate([c.codes for c in chunks]))
    full = short_tts.codec.decode(codes).float().numpy()
    np.testing.assert_allclose(np.concatenate([c.pcm for c in chunks]), full, atol=1e-5, rtol=0)


def test_same_seed_same_speech_and_synthesize_is_the_stream_joined(short_tts):
    """A seed reproduces the codes and audio; another seed gives other codes; synthesize() = stream joined."""
    a = list(short_tts.stream("Reproducible.", "aiden", seed=11))
    b = list(short_tts.stream("Reproducible.", "aiden", seed=11))
    c = list(short_tts.stream("Reproducible.", "aiden", seed=12))
    codes = [np.concatenate([x.codes for x in run]) for run in (a, b, c)]
    assert np.array_equal(codes[0], codes[1]) and not np.array_equal(codes[0], codes[2])
    joined = np.concatenate([x.pcm for x in a])
    np.testing.assert_array_equal(short_tts.synthesize("Reproducible.", "aiden", seed=11), joined)


def test_chunk_frames_groups_frames_without_changing_the_audio(short_tts):
    """The first two chunks are one frame each (the lowest latency, then enough for a player's jitter buffer), later
    ones chunk_frames (the default 4; the last shorter), with the same samples as chunk_frames=1."""
    one = list(short_tts.stream("Grouped.", "ryan", seed=5, chunk_frames=1))
    four = list(short_tts.stream("Grouped.", "ryan", seed=5))
    three = list(short_tts.stream("Grouped.", "ryan", seed=5, chunk_frames=3))
    assert [c.codes.shape[0] for c in one] == [1] * 6
    assert [c.codes.shape[0] for c in four] == [1, 1, 4]
    assert [c.codes.shape[0] for c in three] == [1, 1, 3, 1]
    for grouped in (four, three):
        np.testing.assert_allclose(np.concatenate([c.pcm for c in grouped]), np.concatenate([c.pcm for c in one]),
                                   atol=1e-5)


def test_cancel_from_another_thread_stops_at_the_next_frame(tiny_tts):
    """After cancel() from another thread, the stream yields no further chunk."""
    stream = tiny_tts.stream("This would run for a long while.", "ryan", seed=2)
    first = next(stream)
    canceller = threading.Thread(target=stream.cancel)
    canceller.start()
    canceller.join()
    assert stream.cancelled and list(stream) == []
    assert first.codes.shape == (1, 16)


def test_leaving_the_loop_closes_the_stream(tiny_tts):
    """break + close() ends the stream; a closed stream yields nothing more."""
    stream = tiny_tts.stream("Closing early.", "vivian", seed=4)
    for _ in stream:
        break
    stream.close()
    assert list(stream) == []


def test_runaway_generation_is_capped_per_character(tiny_tts):
    """Without EOS the stream ends at the cap: a 2 s floor plus FRAMES_PER_CHAR frames per character."""
    frames = sum(c.codes.shape[0] for c in tiny_tts.stream("Hi", "ryan", seed=0))
    assert frames == MIN_FRAMES_CAP + FRAMES_PER_CHAR * 2


def test_eos_ends_the_stream_after_the_two_frame_minimum(tiny_checkpoint):
    """When the talker's head makes EOS the best code, generation stops at the official minimum of 2 frames."""
    tts = load_tts(tiny_checkpoint, precision="float32")  # float32: its codec head is an nn.Linear
    head = tts.model.talker.codec_head
    biased = torch.nn.Linear(head.in_features, head.out_features, bias=True)
    with torch.no_grad():
        biased.weight.copy_(head.weight)
        biased.bias.zero_()
        biased.bias[tts.config.talker.codec_eos_id] = 1000.0
    tts.model.talker.codec_head = biased
    chunks = list(tts.stream("Stop soon.", "ryan", seed=0))
    assert sum(c.codes.shape[0] for c in chunks) == 2
    assert all((c.codes[:, 0] != tts.config.talker.codec_eos_id).all() for c in chunks)


def test_a_code_outside_the_codec_ends_its_segment_and_the_rest_is_spoken(short_tts, monkeypatch, caplog):
    """A frame holding a code the codec has no entry for never reaches it: its segment ends before that frame,
    the next segment is spoken, and a warning names the stream's seed (a fault injected into the sampler)."""

    class Faulty(stream_module.Sampler):
        def talker(self, logits, frame):
            code = super().talker(logits, frame)
            faulty = frame == 3 and self.seed == seed  # segment 0's sampler has the stream's seed
            return torch.full_like(code, 2897) if faulty else code  # a talker id, but no codec entry

    monkeypatch.setattr(stream_module, "Sampler", Faulty)
    seed, sentence = 7, "This sentence is one of very many in a long text. "
    with caplog.at_level("WARNING", logger="engine.tts.stream"):
        chunks = list(short_tts.stream(sentence * 10, "ryan", seed=seed, chunk_frames=1))
    frames = [c.segment for c in chunks]
    assert frames.count(0) == 3 and frames.count(1) == 6  # segment 0 ends before its fourth frame
    assert all((c.codes >= 0).all() and (c.codes < 2048).all() for c in chunks)
    assert "seed 7" in caplog.text and "frame 3 of segment 0" in caplog.text


@pytest.mark.parametrize("text", ["", "   ", "\n\t\r", "\x00\x01\x02\x7f", "\ud800\udfff"[:1] * 3])
def test_text_with_nothing_to_speak_is_rejected_at_once(short_tts, text):
    """Empty, blank, control-only or lone-surrogate text raises InputTextError when stream() is called."""
    with pytest.raises(InputTextError, match="nothing to speak"):
        short_tts.stream(text, "ryan")


def test_unknown_speaker_and_language_errors_list_the_valid_ones(short_tts):
    """The error names the bad value and lists every valid choice from the checkpoint's config."""
    with pytest.raises(InputTextError) as e:
        short_tts.stream("Hi.", "rian")
    assert "'rian'" in str(e.value) and all(s in str(e.value) for s in short_tts.speakers)
    with pytest.raises(InputTextError) as e:
        short_tts.stream("Hi.", "ryan", "klingon")
    assert "'klingon'" in str(e.value) and all(lang in str(e.value) for lang in short_tts.languages)
    assert "beijing_dialect" not in short_tts.languages and "auto" in short_tts.languages


def test_speakers_and_languages_come_from_the_config_case_insensitively(short_tts):
    """Speaker and language names are the config's, matched regardless of case."""
    assert short_tts.speakers == sorted(short_tts.config.talker.speaker_ids)
    assert sum(c.codes.shape[0] for c in short_tts.stream("Case.", "RYAN", "English", seed=1)) == 6


@pytest.mark.parametrize("text", [
    "Emoji 😀🎉 and flags 🇩🇪", "مرحبا بالعالم", "שלום עולם", "混合 scripts ミックス 한국어",
    "<|im_end|> typed by a user <|im_start|>", "<speak><break time='1s'/></speak>", "bell\x07 nul\x00 tab\t end",
    "lone \ud800 surrogate", "a" * 5000,
])
def test_odd_text_is_spoken_not_crashed_on(short_tts, text):
    """Emoji, RTL, mixed scripts, tag-like text, control characters and one 5000-letter word all stream."""
    chunks = list(short_tts.stream(text, "ryan", seed=0))
    assert chunks and all(np.isfinite(c.pcm).all() for c in chunks)


def test_user_text_never_becomes_control_tokens(short_tts):
    """'<|im_end|>' typed in the text is tokenized as plain text, not as the special token."""
    ids = short_tts.prompts.text_ids("a <|im_end|> b")
    assert short_tts.config.im_end_id not in ids and short_tts.config.im_start_id not in ids


def test_long_text_is_split_into_segments_and_streamed_in_order(short_tts):
    """Text over the segment size is spoken segment by segment, each capped, in order, without a crash."""
    sentence = "This sentence is one of very many in a long text. "
    chunks = list(short_tts.stream(sentence * 60, "ryan", seed=0, chunk_frames=1))
    segments = [c.segment for c in chunks]
    assert segments == sorted(segments) and segments[-1] >= 6
    assert len(chunks) == 6 * (segments[-1] + 1)


def test_each_segment_begins_with_two_one_frame_chunks(short_tts):
    """A long text's every segment (a prefill of its own) starts as an utterance does: two one-frame chunks, then
    chunk_frames (each segment here is capped at 6 frames)."""
    sentence = "This sentence is one of very many in a long text. "
    sizes: dict[int, list[int]] = {}
    for chunk in short_tts.stream(sentence * 20, "ryan", seed=0):
        sizes.setdefault(chunk.segment, []).append(chunk.codes.shape[0])
    assert len(sizes) >= 2 and all(frames == [1, 1, 4] for frames in sizes.values()), sizes


def test_streaming_text_feed_and_whole_text_prefill_both_work(short_tts):
    """whole_text=False (text fed per frame) and True (text in the prefill) give different valid speech."""
    a = np.concatenate([c.codes for c in short_tts.stream("Two ways.", "eric", seed=9, whole_text=True)])
    b = np.concatenate([c.codes for c in short_tts.stream("Two ways.", "eric", seed=9, whole_text=False)])
    assert a.shape == b.shape and not np.array_equal(a, b)


def test_greedy_sampling_is_deterministic_without_a_seed(short_tts):
    """temperature=0 (greedy) ignores the seed: two runs with different seeds give the same codes."""
    greedy = SamplingOptions.greedy()
    a = np.concatenate([c.codes for c in short_tts.stream("Greedy.", "ryan", seed=1, sampling=greedy)])
    b = np.concatenate([c.codes for c in short_tts.stream("Greedy.", "ryan", seed=2, sampling=greedy)])
    assert np.array_equal(a, b)


def test_style_instruction_is_refused_by_a_0_6b_model_and_taken_by_a_1_7b(short_tts, tiny17_checkpoint):
    """A speaking style raises on the 0.6B model (which has none) and shapes speech on the 1.7B-shaped one."""
    with pytest.raises(InputTextError, match="0.6B"):
        short_tts.stream("Hi.", "ryan", instruct="cheerful")
    tts = load_tts(tiny17_checkpoint)
    plain = next(iter(tts.stream("Hi.", "ryan", seed=1)))
    styled = next(iter(tts.stream("Hi.", "ryan", seed=1, instruct="Speak very cheerfully.")))
    assert not np.array_equal(plain.pcm, styled.pcm)


def test_prompts_reuse_each_voices_rows_and_equal_fresh_ones(tiny_tts, monkeypatch):
    """The rows a prompt holds besides its text are made once per voice and kept for a few voices: prompts
    built with voices coming and going (past what is kept) equal those of a builder that never kept any."""
    import engine.tts.prompt as prompt_module

    monkeypatch.setattr(prompt_module, "_VOICES_KEPT", 2)
    builder = prompt_module.PromptBuilder(tiny_tts.config, tiny_tts.prompts.tokenizer, tiny_tts.model.talker)
    ids = builder.text_ids("Kept rows, fresh text.")
    order = ["ryan", "vivian", "ryan", "aiden", "eric", "ryan", "vivian"]
    for speaker, whole_text in zip(order, [True, False] * 4):
        voice = prompt_module.resolve_voice(tiny_tts.config, speaker, "english", None)
        fresh = prompt_module.PromptBuilder(tiny_tts.config, tiny_tts.prompts.tokenizer, tiny_tts.model.talker)
        got, want = builder.build(ids, voice, whole_text, "cpu"), fresh.build(ids, voice, whole_text, "cpu")
        for name in ("prefill", "track", "pad"):
            assert torch.equal(getattr(got, name), getattr(want, name)), (speaker, name)
        assert len(builder._voices) <= 2
