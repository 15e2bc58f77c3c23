"""The padded-bucket prefill (engine/tts/prefill.py) against Qwen3TTS.begin's plain prefill on the same weights.

On the CPU the padded path runs eagerly: the same code the CUDA graphs capture. Tolerances, float32:
1e-5 on hidden, logits and K/V (seen: 2e-6, matmuls of more rows rounding differently); CUDA bfloat16:
cosine >= 0.999, as the megakernel tests do.
"""

import numpy as np
import pytest
import torch

from engine.tts import SamplingOptions, load_tts
from engine.tts.prefill import BUCKETS, PaddedPrefill, PrefillGraphs, attach_graphs
from engine.tts.sampling import Sampler

SMALL_BUCKETS = (16, 32, 64)
# bucket sizes, one less and one more, one row; a shorter prompt after a longer in the same bucket (32, 31)
LENGTHS = [33, 16, 15, 17, 32, 31, 1, 50, 64]

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module", params=["tiny", "tiny17"])
def tts(request, tiny_checkpoint, tiny17_checkpoint):
    """Both model shapes on the CPU (float32): talker as wide as its code predictor, and wider."""
    return load_tts({"tiny": tiny_checkpoint, "tiny17": tiny17_checkpoint}[request.param], precision="float32")


def _prompt(tts, T, seed, device="cpu"):
    generator = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(T, tts.config.talker.decoder.hidden_size, generator=generator, device=device).to(tts.dtype)


def _plain(model, prompt, max_frames):
    """Qwen3TTS.begin with no padded prefill attached."""
    saved, model.padded_prefill = model.padded_prefill, None
    try:
        return model.begin(prompt, max_frames)
    finally:
        model.padded_prefill = saved


def _assert_same_state(got, expected, T, max_frames, check):
    assert got.cache.length == expected.cache.length == T
    assert got.cache.capacity == expected.cache.capacity == T + max_frames
    assert got.frame == expected.frame == 0
    check(got.hidden, expected.hidden, "hidden")
    check(got.logits, expected.logits, "logits")
    check(got.cache.k[:, :, :T], expected.cache.k[:, :, :T], "K")
    check(got.cache.v[:, :, :T], expected.cache.v[:, :, :T], "V")


def _greedy_codes(model, state, tts, frames):
    """`frames` frames of greedy codes from `state`, fed back with tts_pad as the text track."""
    talker = tts.config.talker
    sampler = Sampler(SamplingOptions.greedy(), 0, talker.decoder.vocab_size, talker.codec_eos_id,
                      tts._suppress.clone(), min_frames=10**9)
    pad = tts.model.talker.text_embed(torch.tensor([tts.config.tts_pad_id], device=tts.device))[0]
    codes = []
    for _ in range(frames):
        frame = model.sample_frame(state, sampler)
        codes.append(frame)
        model.advance(state, frame, pad)
    return torch.stack(codes)


def test_padded_prefill_equals_the_plain_prefill(tts):
    """Hidden state, logits and the first T positions of K/V equal the plain prefill's for T at, one below and
    one above bucket sizes, one row, and a shorter prompt after a longer one in the same bucket."""
    padded = PaddedPrefill(tts.model, SMALL_BUCKETS)

    def check(got, expected, what):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5, msg=lambda m: f"T={T} {what}: {m}")

    for seed, T in enumerate(LENGTHS):
        prompt = _prompt(tts, T, seed)
        assert padded.fits(prompt)
        _assert_same_state(padded.begin(prompt, 7), _plain(tts.model, prompt, 7), T, 7, check)


def test_greedy_frames_after_the_padded_prefill_equal_the_plain_ones(tts):
    """The decode frames that follow give the same greedy codes, with the cache beyond T poisoned (NaN) in
    both: a decode step never reads a position it has not written, so the padded rows' K/V cannot matter."""
    padded = PaddedPrefill(tts.model, SMALL_BUCKETS)
    for seed, T in enumerate([16, 17, 40]):
        prompt = _prompt(tts, T, 100 + seed)
        states = [padded.begin(prompt, 6), _plain(tts.model, prompt, 6)]
        with torch.inference_mode():  # the caches are inference tensors
            for state in states:
                state.cache.k[:, :, T:] = state.cache.v[:, :, T:] = float("nan")
        got, expected = (_greedy_codes(tts.model, state, tts, 6) for state in states)
        torch.testing.assert_close(got, expected, rtol=0, atol=0, msg=lambda m: f"T={T}: {m}")
        assert torch.isfinite(states[0].hidden).all()


def test_engine_with_the_padded_prefill_streams_the_same_codes(short_tts):
    """TTSEngine with a padded prefill attached (as attach_graphs does on CUDA) speaks the same greedy codes, for a
    prompt that fits a bucket and one longer than the largest, which stays on the plain prefill."""
    tts, model = short_tts, short_tts.model
    padded = PaddedPrefill(model, (16, 32))
    texts = ["Short.", "A sentence long enough that its prompt holds more than thirty-two rows, the largest "
                       "bucket in this test, so that the engine takes the plain prefill for it."]
    voice = tts.resolve_voice("ryan")
    lengths = [tts.prompts.build(tts.prompts.text_ids(t), voice, True, tts.device).prefill.shape[0] for t in texts]
    assert lengths[0] <= 32 < lengths[1]
    expected = [np.concatenate([c.codes for c in tts.stream(t, "ryan", sampling=SamplingOptions.greedy())])
                for t in texts]
    model.padded_prefill = padded
    try:
        got = [np.concatenate([c.codes for c in tts.stream(t, "ryan", sampling=SamplingOptions.greedy())])
               for t in texts]
    finally:
        model.padded_prefill = None
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g, e)


def test_bucket_choice_and_refusals(tiny_tts):
    """The smallest bucket holding T is used; one-row buckets and graphs of a CPU model are refused."""
    padded = PaddedPrefill(tiny_tts.model, (64, 16, 32))
    assert [padded.bucket(T) for T in (1, 16, 17, 33, 64)] == [16, 16, 32, 64, 64]
    hidden = tiny_tts.config.talker.decoder.hidden_size
    assert not padded.fits(torch.zeros(65, hidden))
    assert not padded.fits(torch.zeros(10, hidden, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="2 rows or more"):
        PaddedPrefill(tiny_tts.model, (1, 16))
    with pytest.raises(ValueError, match="CUDA device"):
        PrefillGraphs(tiny_tts.model)


# -- CUDA graphs (GPU machines only)

def _cosine(a, b):
    return torch.nn.functional.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype,megakernel", [("float32", False), ("bfloat16", True), ("bfloat16", False)])
@pytest.mark.parametrize("which", ["tiny", "tiny17"])
def test_graph_prefill_equals_the_eager_prefill(tiny_checkpoint, tiny17_checkpoint, exact_float32, dtype, megakernel,
                                                which):
    """load_tts on CUDA captures every bucket at load; replays equal the eager prefill (float32 to 1e-4,
    bfloat16 to cosine 0.999) over lengths in every bucket and one past the largest, two utterances in a
    row, with the megakernel attached and without."""
    checkpoint = {"tiny": tiny_checkpoint, "tiny17": tiny17_checkpoint}[which]
    tts = load_tts(checkpoint, device="cuda", dtype=dtype, megakernel=megakernel)
    graphs = tts.model.padded_prefill
    assert isinstance(graphs, PrefillGraphs) and graphs.captured == list(BUCKETS)
    assert (tts.model.frame_kernel is not None) == megakernel

    def check(got, expected, what):
        assert torch.isfinite(got).all(), f"T={T} {what}"
        if dtype == "float32":
            torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4, msg=lambda m: f"T={T} {what}: {m}")
        else:
            assert _cosine(got, expected) >= 0.999, f"T={T} {what}: cosine {_cosine(got, expected):.6f}"

    for utterance in range(2):
        for i, T in enumerate([12, 16, 17, 100, 31, 33, 64, 300, 200, 512, 600]):
            prompt = _prompt(tts, T, 10 * utterance + i, device="cuda")
            _assert_same_state(tts.model.begin(prompt, 5), _plain(tts.model, prompt, 5), T, 5, check)


@pytest.mark.gpu
@needs_cuda
def test_graph_prefill_then_greedy_frames_equal_eager_on_cuda(tiny17_checkpoint, exact_float32):
    """float32 on CUDA: greedy frames after a replayed prefill equal those after the eager one, lazily
    captured buckets included (attach with no warm-up)."""
    tts = load_tts(tiny17_checkpoint, device="cuda", dtype="float32")
    attach_graphs(tts.model, warm_up_rows=0)
    for seed, T in enumerate([20, 70, 20]):
        prompt = _prompt(tts, T, 50 + seed, device="cuda")
        states = [tts.model.begin(prompt, 6), _plain(tts.model, prompt, 6)]
        got, expected = (_greedy_codes(tts.model, state, tts, 6) for state in states)
        torch.testing.assert_close(got, expected, rtol=0, atol=0, msg=lambda m: f"T={T}: {m}")
    assert tts.model.padded_prefill.captured == [32, 128]
