"""Code sampling: the official processors' maths, a seeded counter-based RNG, and the right distribution."""

import math

import pytest
import torch
from transformers.generation.logits_process import (
    MinNewTokensLengthLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensLogitsProcessor,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from engine.tts.sampling import Sampler, SamplingOptions, gumbel_noise

V, EOS = 64, 50


def _sampler(options, seed=7):
    suppress = torch.zeros(V, dtype=torch.bool)
    suppress[48:] = True
    suppress[EOS] = False
    return Sampler(options, seed, V, EOS, suppress)


def test_greedy_talker_pick_equals_hf_processors_then_argmax():
    """Greedy codebook-0 picks equal argmax after HF's penalty, min-new-tokens and suppress processors."""
    torch.manual_seed(0)
    sampler = _sampler(SamplingOptions.greedy())
    history = torch.zeros(1, 0, dtype=torch.long)
    processors = [RepetitionPenaltyLogitsProcessor(1.05),
                  MinNewTokensLengthLogitsProcessor(0, 2, EOS),
                  SuppressTokensLogitsProcessor([i for i in range(48, V) if i != EOS])]
    for frame in range(40):
        logits = torch.randn(V) * 3
        logits[EOS] = logits.max() + 0.5 if frame % 7 == 0 else logits[EOS]  # EOS often the best
        logits[history[0]] += 0.03  # repeats near the top, so the penalty decides
        expected = logits[None].clone()
        for p in processors:
            expected = p(history, expected)
        got = sampler.talker(logits, frame)
        assert int(got) == int(expected.argmax()), f"frame {frame}"
        history = torch.cat([history, got.view(1, 1)], dim=1)


def test_topk_topp_masks_equal_hf_warpers():
    """Our top-k and top-p cut the same tokens as HF's TopKLogitsWarper and TopPLogitsWarper."""
    torch.manual_seed(1)
    for _ in range(15):
        logits = torch.randn(V) * 2
        for k, p in [(5, 1.0), (V, 0.8), (10, 0.5), (1, 1.0)]:
            options = SamplingOptions(temperature=1.0, top_k=k, top_p=p, repetition_penalty=1.0)
            allowed = set()
            for seed in range(200):
                allowed.add(int(Sampler(options, seed, V, EOS, torch.zeros(V, dtype=torch.bool)).talker(logits, 5)))
            ref = TopPLogitsWarper(p)(None, TopKLogitsWarper(k)(None, logits[None].clone())) if p < 1 else \
                TopKLogitsWarper(k)(None, logits[None].clone())
            hf_allowed = set(torch.nonzero(torch.isfinite(ref[0])).flatten().tolist())
            assert allowed <= hf_allowed
            assert len(allowed) >= min(len(hf_allowed), 2) or len(hf_allowed) == 1


def test_sampling_frequencies_follow_softmax_over_temperature():
    """Gumbel-max draws over many seeds match softmax(logits / T) within 4 standard errors."""
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    options = SamplingOptions(temperature=0.7, top_k=6, predictor_temperature=0.7, predictor_top_k=6)
    n = 6000
    counts = torch.zeros(6)
    sampler = _sampler(options)
    for frame in range(n):
        counts[int(sampler.predictor(logits, frame, 3))] += 1
    p = torch.softmax(logits / 0.7, -1)
    se = torch.sqrt(p * (1 - p) / n)
    assert torch.all((counts / n - p).abs() < 4 * se + 1e-9), (counts / n, p)


def test_noise_is_a_pure_function_of_seed_frame_group_token():
    """The same (seed, frame, group) always gives the same noise; changing any one changes it."""
    base = gumbel_noise(123, 4, 2, 2048, "cpu")
    assert torch.equal(base, gumbel_noise(123, 4, 2, 2048, "cpu"))
    for other in [(124, 4, 2), (123, 5, 2), (123, 4, 3)]:
        assert not torch.equal(base, gumbel_noise(*other, 2048, "cpu"))
    assert torch.isfinite(base).all()
    # Gumbel(0, 1): mean is the Euler-Mascheroni constant, variance pi^2 / 6
    assert abs(base.mean().item() - 0.5772) < 0.1
    assert abs(base.var().item() - math.pi ** 2 / 6) < 0.3


def test_options_reject_bad_values_and_read_generation_config():
    """Invalid options raise with the field named; generation_config.json keys map onto the options."""
    with pytest.raises(ValueError, match="top_k"):
        SamplingOptions(top_k=0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingOptions(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        SamplingOptions(top_p=1.5)
    opts = SamplingOptions.from_generation_config(
        {"do_sample": True, "temperature": 0.8, "top_k": 30, "subtalker_top_k": 20, "subtalker_dosample": False,
         "max_new_tokens": 8192})
    assert (opts.temperature, opts.top_k, opts.predictor_top_k, opts.predictor_temperature) == (0.8, 30, 20, 0.0)
    assert SamplingOptions.from_generation_config({"do_sample": False}).temperature == 0.0
