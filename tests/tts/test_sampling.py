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

from engine.tts import stream
from engine.tts.sampling import Sampler, SamplingOptions, _uniform, gumbel_noise

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
    """The same (seed, frame, group) always gives the same noise, for the whole vocabulary or some of its tokens;
    changing any one changes it."""
    tokens = torch.arange(2048)
    base = gumbel_noise(123, 4, 2, tokens)
    assert torch.equal(base, gumbel_noise(123, 4, 2, tokens))
    assert torch.equal(base[[7, 1000, 2047]], gumbel_noise(123, 4, 2, torch.tensor([7, 1000, 2047])))
    for other in [(124, 4, 2), (123, 5, 2), (123, 4, 3)]:
        assert not torch.equal(base, gumbel_noise(*other, tokens))
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


def test_noise_is_finite_at_both_ends_of_the_random_bits():
    """The uniform draw stays strictly inside (0, 1) in float32 for the lowest and highest bits, so the
    Gumbel noise is finite: the highest once rounded to 1.0, whose noise was +inf."""
    u = _uniform(torch.tensor([0, 1, 2**31, 2**32 - 2**9, 2**32 - 256, 2**32 - 1]))
    assert ((u > 0) & (u < 1)).all(), u
    assert torch.isfinite(-torch.log(-torch.log(u))).all()


def _tiny_sampler(options, seed, min_frames=2):
    """A Sampler shaped as the tiny and real checkpoints' talker: 3072 ids, the top 1024 suppressed but EOS."""
    vocab, eos = 3072, 2150
    suppress = torch.zeros(vocab, dtype=torch.bool)
    suppress[vocab - 1024:] = True
    suppress[eos] = False
    return Sampler(options, seed, vocab, eos, suppress, min_frames), suppress


@pytest.mark.parametrize("fill", ["random", "nan everywhere", "nan where allowed", "inf where suppressed",
                                  "-inf where allowed"])
def test_a_suppressed_id_never_wins_whatever_the_logits_hold(fill):
    """Codebook 0 is never a suppressed id, nor EOS before min_frames: not with NaN or inf logits, and not in the
    draw that picked suppressed id 2897 (seed 496234175, frame 67: its noise there was +inf, and -inf + inf NaN)."""
    torch.manual_seed(0)
    for options in (SamplingOptions(), SamplingOptions(top_k=3072), SamplingOptions(top_p=0.8),
                    SamplingOptions.greedy()):
        for seed, frame in [(496234175, 67), (496234175, 0), (1, 1), (2, 5)]:
            sampler, suppress = _tiny_sampler(options, seed)
            logits = torch.randn(3072) * 4
            if fill == "nan everywhere":
                logits[:] = float("nan")
            elif fill == "nan where allowed":
                logits[~suppress] = float("nan")
            elif fill == "inf where suppressed":
                logits[suppress] = float("inf")
            elif fill == "-inf where allowed":
                logits[~suppress] = float("-inf")
            code = int(sampler.talker(logits, frame))
            assert not suppress[code], (options, seed, frame, code)
            assert frame >= sampler.min_frames or code != sampler.eos_id


def test_a_token_cut_by_top_k_never_wins():
    """A code predictor draw picks among its top k, also where a cut token's noise was +inf (seed 9, frame 8,
    codebook 14, token 1866 under the old 24-bit uniform)."""
    torch.manual_seed(0)
    options = SamplingOptions()
    logits = torch.randn(2048)
    logits[1866] = -20.0  # far below the top 50
    top = set(torch.topk(logits, options.predictor_top_k).indices.tolist())
    sampler = Sampler(options, 9, 2048, 0, torch.zeros(2048, dtype=torch.bool))
    assert int(sampler.predictor(logits, 8, 14)) in top


@pytest.fixture(scope="module")
def tiny_talker_logits(tiny_tts):
    """The tiny checkpoint's codebook-0 logits (frames, vocab) at every frame of 4 whole utterances (to EOS or the
    runaway cap), recorded from real streams."""
    recordings = []

    class Recording(Sampler):
        def talker(self, logits, frame):
            recordings[-1].append(logits.float().clone())
            return super().talker(logits, frame)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(stream, "Sampler", Recording)
        for seed in range(4):
            recordings.append([])
            tiny_tts.synthesize("Hi.", "ryan", seed=seed)
    return [torch.stack(r) for r in recordings]


def test_thousands_of_seeds_never_pick_a_suppressed_id_at_full_length(tiny_tts, tiny_talker_logits):
    """3,000 seeds through the real Sampler, each for a whole utterance of the tiny checkpoint's logits (frame 0 to
    EOS or the cap, not one frame): no codebook-0 pick is suppressed, or EOS before min_frames. The old noise
    picked a suppressed id in about one draw of 16,000, 8 expected here; bench/sampling_sweep.py runs 10,000+."""
    talker = tiny_tts.config.talker
    invalid, draws = [], 0
    for seed in range(3_000):
        sampler = Sampler(tiny_tts.default_sampling, seed, talker.decoder.vocab_size, talker.codec_eos_id,
                          tiny_tts._suppress)
        for frame, logits in enumerate(tiny_talker_logits[seed % len(tiny_talker_logits)]):
            code = int(sampler.talker(logits, frame))
            draws += 1
            if code == sampler.eos_id and frame >= sampler.min_frames:
                break
            if tiny_tts._suppress[code] or code == sampler.eos_id:
                invalid.append((seed, frame, code))
    assert draws > 100_000
    assert not invalid, f"{len(invalid)} invalid picks in {draws} draws, the first (seed, frame, code): {invalid[:5]}"
