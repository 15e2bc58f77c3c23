"""The megakernel against the PyTorch engine on the same weights (GPU only; CI compiles it).

The reference runs the same bf16-exact weights in float32 with K/V stored in bfloat16 (kv_dtype), which
is what the kernel computes: fp32 activations, bf16 cache. Inputs are fresh random vectors per run; the
seed is in every failure message.
"""

import copy
import json
import os
import threading

import numpy as np
import pytest
import torch

from engine.tts import SamplingOptions, load_tts
from engine.tts.codec import SnakeBeta
from engine.tts.kernels.megakernel import BatchKernel, KernelRun, KernelStep
from engine.tts.model import MLP, FrameState, KVCache, RMSNorm
from engine.tts.prompt import TalkerInputs
from engine.tts.sampling import Sampler, gumbel_noise
from tests.tts.conftest import speech_like

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(scope="module")
def full_checkpoint(tmp_path_factory):
    from engine.tts.testing import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("ckpt") / "0.6b", "0.6b", seed=2)


def _stacks(checkpoint):
    """The kernel-attached bf16 engine, and a float32 copy of the same (bf16-exact) weights as reference."""
    fast = load_tts(checkpoint, device="cuda", megakernel=True)
    ref = load_tts(checkpoint, device="cuda", dtype="float32", megakernel=False)
    return fast, ref


def _cosine(a, b):
    return torch.nn.functional.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()


def _random_prefix(kcache, generator, prefix, rcache=None):
    """The first `prefix` positions of kcache (bf16) random, and of rcache the same values; both that long."""
    kcache.k[:, :, :prefix] = torch.randn(kcache.k[:, :, :prefix].shape, device="cuda", generator=generator)
    kcache.v[:, :, :prefix] = torch.randn(kcache.v[:, :, :prefix].shape, device="cuda", generator=generator)
    kcache.length = prefix
    if rcache is not None:
        rcache.k[:, :, :prefix], rcache.v[:, :, :prefix] = kcache.k[:, :, :prefix], kcache.v[:, :, :prefix]
        rcache.length = prefix


@pytest.mark.parametrize("design", KernelStep.DESIGNS)
@pytest.mark.parametrize("which", ["talker", "predictor"])
def test_kernel_step_equals_the_pytorch_stack_step_by_step(tiny_checkpoint, tiny17_checkpoint, full_checkpoint,
                                                           which, design):
    """Over 40 steps from a shared random cache, hidden-state cosine >= 0.9999 per step, both model
    shapes and the full-size 0.6B, for either design of the step kernel."""
    torch.backends.cuda.matmul.allow_tf32 = False
    for checkpoint in (tiny_checkpoint, tiny17_checkpoint, full_checkpoint):
        fast, ref = _stacks(checkpoint)
        pick = {"talker": lambda m: m.talker.model, "predictor": lambda m: m.talker.code_predictor.model}[which]
        kstack, rstack = pick(fast.model), pick(ref.model)
        if design != "barrier":
            kstack.kernel_step = KernelStep(kstack, design=design)
        cfg = kstack.cfg
        generator = torch.Generator(device="cuda").manual_seed(5)
        kcache = KVCache(cfg, 80, "cuda", torch.bfloat16)
        rcache = KVCache(cfg, 80, "cuda", torch.float32)
        _random_prefix(kcache, generator, 23, rcache)
        for buffer in kstack.kernel_step.scratch:  # poisoned: every element read must have been written
            buffer.fill_(float("nan"))
        with torch.inference_mode():
            for step in range(40):
                x = torch.randn(1, cfg.hidden_size, device="cuda", generator=generator)
                got = kstack(x.bfloat16(), kcache).float()
                expected = rstack(x, rcache)
                assert torch.isfinite(got).all(), f"step {step}"
                cos = _cosine(got, expected)
                assert cos >= 0.9999, f"{checkpoint.name} {which} {design} step {step}: cosine {cos:.6f}"
                pos = kcache.length - 1
                assert _cosine(kcache.k[:, :, pos], rcache.k[:, :, pos]) >= 0.9999
                assert _cosine(kcache.v[:, :, pos], rcache.v[:, :, pos]) >= 0.9999


@pytest.mark.parametrize("ring_pages", [None, 2])
def test_dataflow_step_equals_the_barrier_step_over_300_steps(full_checkpoint, ring_pages):
    """The 0.6B talker's dataflow step against the barrier step on the same inputs for 300 steps in a row (the cache
    growing from 23 to 323 positions, the counters' targets scaled by the launch): hidden-state cosine >= 0.99999 per
    step, the new K/V as close (cosine), and every counter at 300 launches' worth; with the weight ring as deep as
    shared memory allows, and capped at 2 pages, fewer than a block's share of most stages. Close, not equal: on an
    H100, 8% of the new K elements differed in their last bits after 300 steps, as a rounding that goes the other way
    in one step feeds every later one."""
    torch.backends.cuda.matmul.allow_tf32 = False
    tts = load_tts(full_checkpoint, device="cuda", megakernel=True)
    stack = tts.model.talker.model
    barrier, dataflow = stack.kernel_step, KernelStep(stack, design="dataflow", ring_pages=ring_pages)
    cfg, steps, prefix = stack.cfg, 300, 23
    generator = torch.Generator(device="cuda").manual_seed(7)
    caches = [KVCache(cfg, prefix + steps, "cuda", torch.bfloat16) for _ in range(2)]
    _random_prefix(caches[0], generator, prefix, caches[1])
    with torch.inference_mode():
        for step in range(steps):
            x = torch.randn(1, cfg.hidden_size, device="cuda", generator=generator)
            expected, got = barrier(x, caches[0]).float(), dataflow(x, caches[1]).float()
            assert torch.isfinite(got).all(), f"step {step}"
            cos = _cosine(got, expected)
            assert cos >= 0.99999, f"step {step}: cosine {cos:.7f}"
    for name in ("k", "v"):
        ref, new = (getattr(c, name)[:, :, prefix:].float() for c in caches)
        assert caches[1].length == prefix + steps and torch.equal(getattr(caches[0], name)[:, :, :prefix],
                                                                  getattr(caches[1], name)[:, :, :prefix]), name
        assert _cosine(ref, new) >= 0.99999, name
    counts = dataflow.counters.view(cfg.num_layers, 5).cpu()
    blocks, heads = steps * dataflow.blocks, steps * cfg.num_heads
    assert (counts == torch.tensor([blocks, heads, blocks, blocks, blocks], dtype=torch.int32)).all(), counts


def test_a_ring_cap_is_the_dataflow_steps_and_two_pages_or_more(tiny_checkpoint):
    """KernelStep's ring_pages (bench/dataflow_step.py --ring-pages) is refused below 2 pages or on the barrier step."""
    stack = load_tts(tiny_checkpoint, device="cuda", megakernel=True).model.talker.model
    for bad in ({"design": "dataflow", "ring_pages": 1}, {"design": "barrier", "ring_pages": 4}):
        with pytest.raises(ValueError, match="ring_pages is the dataflow step's, at least 2"):
            KernelStep(stack, **bad)


def test_a_stalled_dataflow_step_raises_and_the_next_one_runs(tiny_checkpoint):
    """A launch whose counters can never reach their targets (told it is the 4th launch on fresh counters) ends with
    a RuntimeError naming layer and stage within seconds, instead of hanging the GPU, and leaves the cache's length;
    the next step, on reset counters, equals the barrier step."""
    torch.backends.cuda.matmul.allow_tf32 = False
    tts = load_tts(tiny_checkpoint, device="cuda", megakernel=True)
    stack = tts.model.talker.model
    barrier, dataflow = stack.kernel_step, KernelStep(stack, design="dataflow")
    generator = torch.Generator(device="cuda").manual_seed(8)
    caches = [KVCache(stack.cfg, 40, "cuda", torch.bfloat16) for _ in range(2)]
    _random_prefix(caches[0], generator, 11, caches[1])
    x = torch.randn(1, stack.cfg.hidden_size, device="cuda", generator=generator)
    dataflow.launches = 3
    with torch.inference_mode():
        with pytest.raises(RuntimeError, match=r"dataflow step stalled at layer 0 stage [BC] \("):
            dataflow(x, caches[1])
        assert caches[1].length == 11 and dataflow.launches == 0 and not dataflow.counters.any()
        expected, got = barrier(x, caches[0]).float(), dataflow(x, caches[1]).float()
    assert _cosine(got, expected) >= 0.99999 and caches[1].length == 12


def test_a_traced_dataflow_step_stamps_its_waits_as_the_barrier_step_stamps_its_barriers(tiny_checkpoint):
    """With the kernel's trace on (bench/dataflow_step.py --trace reads it), one launch of either design leaves the
    launch's mark, then stages A to E of each layer in order (the dataflow step's wait for a layer's E comes before the
    next layer's A), each left no sooner than arrived and after the one before; with it off again, nothing more."""
    tts = load_tts(tiny_checkpoint, device="cuda", megakernel=True)
    stack = tts.model.talker.model
    cfg = stack.cfg
    x = torch.randn(cfg.hidden_size, device="cuda", generator=torch.Generator(device="cuda").manual_seed(9))
    out = torch.empty(cfg.hidden_size, dtype=torch.float32, device="cuda")
    expected = [22] + [0, 1, 2, 3, 4] * cfg.num_layers  # kLaunch, then kTalker + stage (common.cuh's Tag)
    for step in (stack.kernel_step, KernelStep(stack, design="dataflow")):
        cache = KVCache(cfg, 8, "cuda", torch.bfloat16)
        trace = torch.zeros((2 * len(expected), 3), dtype=torch.int64, device="cuda")  # room to see stray stamps
        with torch.inference_mode():
            step.module.set_trace(trace)
            step.launch(x, out, cache)
            torch.cuda.synchronize()
            assert step.module.set_trace(None) == len(expected), step.design
            step.check()
            step.launch(x, out, cache)
            torch.cuda.synchronize()
        rows = trace.cpu().numpy()
        assert rows[:, 0].tolist()[: len(expected)] == expected and not rows[len(expected) :].any(), step.design
        stamps = rows[: len(expected)]
        assert (stamps[:, 2] >= stamps[:, 1]).all() and (np.diff(stamps[:, 2]) >= 0).all(), step.design


def test_attention_prologue_equals_the_pytorch_ops(tiny_checkpoint, full_checkpoint):
    """A multi-token Attention.forward with the kernel's prologue (q/k/v in one GEMM over the stacked weights, which
    q_proj, k_proj and v_proj then view with unchanged values; q/k norm, RoPE, K/V cache write in one launch) against
    model.py's own ops on the same bf16 inputs, head_dim 16 and 128, 2 to 300 tokens: V copied exactly; K and the
    layer's output equal but where the norm's sum, added in another order, rounds the other way (at most 1% of K's
    elements, each by a bf16 rounding step); the prologue writes at the cache's length; bad calls refused."""
    for checkpoint in (tiny_checkpoint, full_checkpoint):
        tts = load_tts(checkpoint, device="cuda", megakernel=True)
        plain = load_tts(checkpoint, device="cuda", megakernel=False).model.talker.model.layers[1].self_attn
        stack = tts.model.talker.model
        attention, layer = stack.layers[1].self_attn, 1
        prologue = attention.prologue
        assert prologue is not None and plain.prologue is None
        for name in ("q_proj", "k_proj", "v_proj"):
            weight = getattr(attention, name).weight
            assert torch.equal(weight, getattr(plain, name).weight), name
            stacked = prologue.qkv.weight
            assert stacked.data_ptr() <= weight.data_ptr() < stacked[-1].data_ptr(), name
        generator = torch.Generator(device="cuda").manual_seed(3)
        with torch.inference_mode():
            for T in (2, 37, 300):
                x = torch.randn(T, stack.cfg.hidden_size, device="cuda", dtype=torch.bfloat16, generator=generator)
                cos, sin = stack.rotary(0, T, x)
                outputs, caches = [], []
                for fused in (prologue, None):
                    attention.prologue = fused
                    cache = stack.new_cache(T + 8, x)
                    cache.k.zero_()
                    cache.v.zero_()
                    outputs.append(attention(x, cos, sin, [cache], layer))
                    caches.append(cache)
                attention.prologue = prologue
                (got, expected), (fast, ref) = outputs, caches
                where = f"{checkpoint.name} T={T}"
                assert torch.equal(fast.v, ref.v), where
                assert torch.equal(fast.k[:layer], ref.k[:layer]) and not fast.k[layer, :, T:].any(), where
                keys, keys_ref = fast.k[layer, :, :T].float(), ref.k[layer, :, :T].float()
                differ = (keys != keys_ref).float().mean().item()
                assert differ <= 0.01, f"{where}: {differ:.2%} of K differs"
                assert (keys - keys_ref).abs().max() <= 2 ** -5 * keys_ref.abs().max(), where
                assert _cosine(got, expected) >= 0.99999, f"{where}: cosine {_cosine(got, expected):.7f}"

                # at the cache's length: the same rows, 5 positions on
                shifted = stack.new_cache(T + 8, x)
                shifted.k.zero_()
                shifted.v.zero_()
                shifted.length = 5
                prologue(x, cos, sin, shifted, layer)
                assert torch.equal(shifted.k[layer, :, 5:5 + T], fast.k[layer, :, :T]), where
                assert torch.equal(shifted.v[layer, :, 5:5 + T], fast.v[layer, :, :T]), where
                assert not shifted.k[layer, :, :5].any() and not shifted.k[:layer].any(), where

            q, k, v = attention.q_proj(x), attention.k_proj(x), attention.v_proj(x)

            def call(q, length=0, layer=layer):
                return prologue.module.attention_prologue(q, k, v, prologue.q_norm, prologue.k_norm, cos, sin,
                                                          shifted.k, shifted.v, layer, length, prologue.eps)

            layers, capacity = shifted.k.shape[0], shifted.k.shape[2]
            refusal = rf"positions 9\.\.{T + 8} outside the cache's capacity of {capacity}"
            with pytest.raises(RuntimeError, match=refusal):
                call(q, length=9)
            with pytest.raises(RuntimeError, match="q must be bfloat16"):
                call(q.float())
            with pytest.raises(RuntimeError, match=f"layer 99 outside the cache's {layers}"):
                call(q, layer=99)
        del tts, plain
        torch.cuda.empty_cache()


def test_snake_kernel_equals_the_five_ops(short_checkpoint):
    """The codec's SnakeBeta in one launch against its five PyTorch ops on the same bf16 input, contiguous and strided:
    the same float32 sinf and a rounding after each op, so equal but at most 0.1% of elements (each by a rounding
    step); load_tts with the kernel attaches every SnakeBeta; other dtypes refused."""
    tts = load_tts(short_checkpoint, device="cuda", megakernel=True)
    snakes = [m for m in tts.codec.modules() if isinstance(m, SnakeBeta)]
    assert snakes and all(m.kernel is not None for m in snakes)
    generator = torch.Generator(device="cuda").manual_seed(4)
    with torch.inference_mode():
        for snake in (snakes[0], snakes[-1]):
            wide = 4 * torch.randn(2, snake.alpha.numel(), 50, device="cuda", generator=generator).bfloat16()
            for x in (wide, wide[..., 3:40], wide.transpose(1, 2).contiguous().transpose(1, 2)):
                got = snake(x)
                kernel, snake.kernel = snake.kernel, None
                expected = snake(x)
                snake.kernel = kernel
                assert got.shape == expected.shape and got.is_contiguous()
                differ = (got != expected).float().mean().item()
                assert differ <= 0.001, f"{differ:.3%} of the elements differ"
                assert (got.float() - expected.float()).abs().max() <= 2 ** -7 * expected.float().abs().max()
        with pytest.raises(RuntimeError, match="x must be bfloat16"):
            snake.kernel(x.float(), snake._frequency, snake._inverse_beta)


def test_rms_norm_and_mlp_kernels_equal_the_pytorch_ops(short_checkpoint):
    """RMSNorm in one launch, also with the residual add (and LayerScale) before it, and the MLP in three (gate and up
    from one GEMM over the stacked weights, which gate_proj and up_proj then view with unchanged values; silu(gate) *
    up in one launch), against model.py's ops on the same bf16 input, 1 to 300 rows and a (batch, rows, hidden) input
    as the codec's. The residual sum: equal. RMSNorm: equal but where its sum of squares, added in another order,
    rounds the other way (at most 1% of elements, each by a rounding step or two); the MLP:
    cosine >= 0.9999 (cuBLAS sums the stacked GEMM in another order too). load_tts attaches every RMSNorm and MLP of
    the model and the codec; bad calls refused, naming the numbers."""
    tts = load_tts(short_checkpoint, device="cuda", megakernel=True)
    plain = load_tts(short_checkpoint, device="cuda", megakernel=False)
    for model in (tts.model, tts.codec):
        norms = [m for m in model.modules() if isinstance(m, RMSNorm)]
        mlps = [m for m in model.modules() if isinstance(m, MLP)]
        assert norms and mlps, type(model).__name__
        assert all(m.kernel is not None and m.add_kernel is not None for m in norms)
        assert all(m.fused is not None for m in mlps)
    layer, plain_layer = tts.model.talker.model.layers[1], plain.model.talker.model.layers[1]
    fused = layer.mlp.fused
    for name in ("gate_proj", "up_proj"):
        weight = getattr(layer.mlp, name).weight
        assert torch.equal(weight, getattr(plain_layer.mlp, name).weight), name
        stacked = fused.gate_up.weight
        assert stacked.data_ptr() <= weight.data_ptr() < stacked[-1].data_ptr(), name
    generator = torch.Generator(device="cuda").manual_seed(5)
    hidden = tts.model.talker.model.cfg.hidden_size
    with torch.inference_mode():
        for shape in ((1, hidden), (37, hidden), (300, hidden), (2, 7, hidden)):
            x = torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=generator)
            got, expected = layer.input_layernorm(x), plain_layer.input_layernorm(x)
            assert got.shape == expected.shape and got.dtype == torch.bfloat16, shape
            differ = (got != expected).float().mean().item()
            assert differ <= 0.01, f"RMSNorm {shape}: {differ:.2%} of the elements differ"
            assert ((got.float() - expected.float()).abs() <= 2 ** -6 * expected.float().abs()).all(), shape
            got, expected = layer.mlp(x), plain_layer.mlp(x)
            assert got.shape == expected.shape and got.dtype == torch.bfloat16, shape
            assert _cosine(got, expected) >= 0.9999, f"MLP {shape}: cosine {_cosine(got, expected):.7f}"
            # RMSNorm.add, as the talker's layers call it and with a LayerScale as the codec's: the sum exactly
            delta = torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=generator)
            scale = torch.randn(hidden, device="cuda", dtype=torch.bfloat16, generator=generator)
            for factor in (None, scale):
                (got_sum, got), (sum_, expected) = (n.add(x, delta, factor) for n in (layer.input_layernorm,
                                                                                        plain_layer.input_layernorm))
                assert torch.equal(got_sum, sum_) and got.shape == expected.shape, shape
                differ = (got != expected).float().mean().item()
                assert differ <= 0.01, f"RMSNorm.add {shape}: {differ:.2%} of the elements differ"
                assert ((got.float() - expected.float()).abs() <= 2 ** -6 * expected.float().abs()).all(), shape
        module, norm = fused.module, layer.input_layernorm
        with pytest.raises(RuntimeError, match="x must be BFloat16, got Float"):
            module.rms_norm(x.float(), norm.weight, norm.eps)
        with pytest.raises(RuntimeError, match=f"weight has 5 elements, expected {hidden}"):
            module.rms_norm(x, norm.weight[:5], norm.eps)
        with pytest.raises(RuntimeError, match=rf"delta \[7, 2, {hidden}\] must have x's shape \[2, 7, {hidden}\]"):
            module.add_rms_norm(x, x.transpose(0, 1).contiguous(), None, norm.weight, norm.eps)
        with pytest.raises(RuntimeError, match=f"scale has 5 elements, expected {hidden}"):
            module.add_rms_norm(x, x, norm.weight[:5], norm.weight, norm.eps)
        gate = torch.zeros(3, 8, device="cuda", dtype=torch.bfloat16)
        with pytest.raises(RuntimeError, match=r"gate \[3, 8\] and up \[3, 4\] must match"):
            module.swiglu(gate, gate[:, :4])
        with pytest.raises(RuntimeError, match="up must be bfloat16"):
            module.swiglu(gate, gate.float())


def test_a_model_beyond_the_kernels_limits_speaks_on_the_pytorch_steps(tmp_path, caplog):
    """A talker of 39 layers, 41 with the code predictor's, one over what a frame launch holds: load_tts on CUDA
    logs why and keeps the decode steps on PyTorch (the multi-token kernels attached), and speaks."""
    from safetensors.torch import save_file

    from engine.tts.config import TTSConfig
    from engine.tts.testing import write_checkpoint
    from engine.tts.testing.checkpoint import random_weights

    folder = write_checkpoint(tmp_path / "deep", "tiny")
    config = json.loads((folder / "config.json").read_text())
    config["talker_config"]["num_hidden_layers"] = 39
    (folder / "config.json").write_text(json.dumps(config))
    weights = random_weights(TTSConfig.from_file(folder / "config.json"), seed=0)
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with caplog.at_level("WARNING", logger="engine.tts.stream"):
        tts = load_tts(folder, device="cuda")
    assert "does not run this model (at most 40 layers in the talker and the code predictor together)" in caplog.text
    talker = tts.model.talker.model
    assert tts.model.frame_kernel is None and talker.kernel_step is None and talker.layers[0].mlp.fused is not None
    pcm = np.concatenate([c.pcm for c in tts.stream("A deep model.", tts.default_speaker, seed=1)])
    assert np.isfinite(pcm).all() and np.abs(pcm).max() > 0


def test_engine_with_the_kernel_streams_speech(short_checkpoint):
    """load_tts on CUDA picks the kernel by default; it streams finite speech of the expected length."""
    tts = load_tts(short_checkpoint, device="cuda")
    assert tts.model.talker.model.kernel_step is not None
    chunks = list(tts.stream("Kernel speech.", "ryan", seed=3))
    pcm = np.concatenate([c.pcm for c in chunks])
    assert pcm.shape == (6 * 1920,) and np.isfinite(pcm).all() and np.abs(pcm).max() > 0


def _reference(checkpoint):
    ref = load_tts(checkpoint, device="cuda", dtype="float32", megakernel=False)
    for stack in (ref.model.talker.model, ref.model.talker.code_predictor.model):
        stack.kv_dtype = torch.bfloat16
    return ref


def _random_inputs(tts, seed: int, prompt: int = 19, track: int = 60) -> TalkerInputs:
    """Prefill and text-track vectors of the size real ones have (the text track's own scale)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    H = tts.config.talker.decoder.hidden_size
    scale = tts.model.talker.model.codec_embedding.weight.float().std().item() * 4
    rand = lambda *shape: torch.randn(*shape, H, device="cuda", generator=g) * scale  # noqa: E731
    return TalkerInputs(prefill=rand(prompt), track=rand(track), pad=rand(1)[0])


def _sampler(tts, options, seed, min_frames):
    talker = tts.config.talker
    return Sampler(options, seed, talker.decoder.vocab_size, talker.codec_eos_id, tts._suppress.clone(), min_frames)


class _Forced(Sampler):
    """Teacher forcing: at every draw the kernel's code is checked against the reference's scores, then
    returned as the pick, so both engines walk the same codes and the reference never drifts off on a
    code of its own. A draw where the two differ is kept in `misses` unless a perturbation of the
    reference's logits by `tolerance` (of their spread) makes the kernel's code the pick: a near-tie at
    the top, or at the top-k cut (the kernel's sums run in another order, and a K/V element now and then
    rounds to the neighbouring bf16 value)."""

    def __init__(self, *args, codes, tolerance):
        super().__init__(*args)
        self.codes, self.tolerance, self.draws, self.misses, self.near_ties = codes, tolerance, 0, [], 0
        self.plain = Sampler(SamplingOptions.greedy(), *args[1:])  # penalty and masks only
        self.plain.seen = self.seen

    def _force(self, logits, frame, group, temperature, top_k):
        forced = int(self.codes[frame, group])
        v = self.plain.talker_logits(logits, frame) if group == 0 else logits.float()
        self.draws += 1
        if temperature == 0:
            score = v
        else:
            v = v / temperature
            noise = gumbel_noise(self.seed, frame, group, torch.arange(v.numel(), device=v.device))
            kth = torch.topk(v, top_k).values[-1]
            score = torch.where(v < kth, float("-inf"), v + noise)
        own = int(torch.argmax(score))
        if own != forced:
            eps = self.tolerance * v[torch.isfinite(v)].std()
            if temperature == 0:
                ok = v[forced] >= v[own] - eps
            else:
                sure = v > kth + eps  # in the top k under any perturbation within eps
                best = (v + noise)[sure].max() if sure.any() else float("-inf")
                ok = v[forced] >= kth - eps and v[forced] + noise[forced] >= best - eps
            if ok:
                self.near_ties += 1
            else:
                self.misses.append((frame, group, own, forced))
        return torch.tensor(forced, device=logits.device)

    def talker(self, logits, frame):
        o = self.options
        code = self._force(logits, frame, 0, o.temperature, o.top_k)
        self.seen[code] = True
        return code

    def predictor(self, logits, frame, group):
        o = self.options
        return self._force(logits, frame, group, o.predictor_temperature, o.predictor_top_k)


def _reference_codes(ref, inputs, options, seed, frames, min_frames, forced=None):
    """The reference's codes, free-running, or checking `forced` codes (then returns the sampler)."""
    talker = ref.config.talker
    args = (options, seed, talker.decoder.vocab_size, talker.codec_eos_id, ref._suppress.clone(), min_frames)
    sampler = Sampler(*args) if forced is None else _Forced(*args, codes=forced, tolerance=1e-2)
    state = ref.model.begin(inputs.prefill, frames)
    codes = []
    while state.frame < frames:
        frame = ref.model.sample_frame(state, sampler)
        if frame is None:
            break
        codes.append(frame.cpu())
        ref.model.advance(state, frame, inputs.text_input(state.frame))
    return torch.stack(codes).numpy() if codes else np.zeros((0, 16), np.int64), sampler


def _kernel_codes(fast, ref, inputs, options, seed, frames, min_frames, per_launch):
    """The kernel from the reference's prefill (its bf16 K/V are exact in bf16), per_launch frames a launch."""
    kernel = fast.model.frame_kernel
    for buffer in (*kernel._scratch, *kernel._steps[0].scratch, *kernel._steps[1].scratch):
        buffer.fill_(float("nan"))  # poisoned: every element read must have been written
    ref_state = ref.model.begin(inputs.prefill, frames)
    cache = KVCache(fast.model.talker.model.cfg, ref_state.cache.capacity, "cuda", torch.bfloat16)
    cache.k.copy_(ref_state.cache.k)
    cache.v.copy_(ref_state.cache.v)
    cache.length = ref_state.cache.length
    state = FrameState(cache, ref_state.hidden, None)
    sampler = _sampler(fast, options, seed, min_frames)
    got = [c.cpu() for c in kernel.run(state, sampler, inputs, frames, threading.Event(), per_launch)]
    return (torch.stack(got).numpy() if got else np.zeros((0, 16), np.int64)), sampler, state


def _first_difference(a, b):
    if a.shape != b.shape:
        return f"{len(a)} frames vs {len(b)}"
    frame, group = np.argwhere(a != b)[0]
    return f"frame {frame} codebook {group}: {a[frame, group]} vs {b[frame, group]}"


@pytest.mark.parametrize("options", [SamplingOptions.greedy(), SamplingOptions()], ids=["greedy", "sampled"])
def test_kernel_frames_give_the_reference_codes_for_200_frames(tiny_checkpoint, tiny17_checkpoint, full_checkpoint,
                                                               options):
    """Whole frames on the device (heads, sampling, predictor, embeddings) pick the reference's codes over
    200 frames, for both model shapes and the full-size 0.6B: every draw (16 a frame), teacher-forced.

    A draw may differ only at a near-tie (see _Forced), and in at most 1% of draws.
    """
    torch.backends.cuda.matmul.allow_tf32 = False
    for checkpoint in (tiny_checkpoint, tiny17_checkpoint, full_checkpoint):
        fast, ref = load_tts(checkpoint, device="cuda", megakernel=True), _reference(checkpoint)
        seed = int.from_bytes(os.urandom(4), "little")
        inputs = _random_inputs(ref, seed)
        with torch.inference_mode():
            got, sampler, state = _kernel_codes(fast, ref, inputs, options, seed, 200, 10**9, per_launch=7)
            replayed, forced = _reference_codes(ref, inputs, options, seed, 200, 10**9, forced=got)
        assert got.shape == (200, 16) and (replayed == got).all()
        assert forced.draws == 200 * 16
        where = f"{checkpoint.name} seed {seed}: {forced.near_ties} near-ties; misses (frame, codebook, ref, kernel)"
        assert not forced.misses, f"{where} {forced.misses}"
        assert forced.near_ties <= forced.draws // 100, where
        print(where)
        assert state.frame == 200 and state.cache.length == 19 + 199  # one talker step after each frame but the last
        seen = torch.zeros(ref.config.talker.decoder.vocab_size, dtype=torch.bool)
        seen[got[:, 0]] = True
        assert torch.equal(sampler.seen.cpu(), seen), "the repetition-penalty history differs"
        del fast, ref
        torch.cuda.empty_cache()


def test_kernel_frames_stop_at_eos_like_the_reference(tiny_checkpoint):
    """EOS held back for min_frames, then emitted: the same frames, the same end, within one launch."""
    torch.backends.cuda.matmul.allow_tf32 = False
    fast, ref = load_tts(tiny_checkpoint, device="cuda", megakernel=True), _reference(tiny_checkpoint)
    options = SamplingOptions(temperature=1.5)
    with torch.inference_mode():
        for seed in range(20):
            inputs = _random_inputs(ref, seed)
            expected, _ = _reference_codes(ref, inputs, options, seed, 40, min_frames=3)
            if 3 <= len(expected) < 40:
                break
        else:
            pytest.fail("no seed in 20 ended its utterance by EOS")
        got, _, state = _kernel_codes(fast, ref, inputs, options, seed, 40, 3, per_launch=40)
    assert got.shape == expected.shape and (got == expected).all(), f"seed {seed}: {_first_difference(got, expected)}"
    assert state.frame == len(expected)


def _copy(state):
    """A FrameState of its own with the same cache and hidden state."""
    cache = copy.copy(state.cache)
    cache.k, cache.v = state.cache.k.clone(), state.cache.v.clone()
    return FrameState(cache, state.hidden.clone(), None)


@pytest.mark.parametrize("streams", BatchKernel.SIZES)
@pytest.mark.parametrize("options", [SamplingOptions.greedy(), SamplingOptions(temperature=1.5)],
                         ids=["greedy", "sampled"])
def test_batched_utterances_each_give_their_codes_alone(tiny_checkpoint, full_checkpoint, streams, options):
    """Utterances decoded together, launch after launch of the batched kernel, give each exactly (bit for bit) the
    codes, the talker cache and the repetition history of its FrameKernel run alone, while they join at different
    launches, wait for a place (one more utterance than a launch takes), and leave at their cap or at EOS; the tiny
    shapes and the full-size 0.6B."""
    torch.backends.cuda.matmul.allow_tf32 = False
    count = streams + 1
    joins, caps = [0, 0, 2, 3, 5, 1, 4, 6, 2][:count], [40, 12, 40, 25, 30, 18, 36, 22, 28][:count]
    for checkpoint in (tiny_checkpoint, full_checkpoint):
        fast = load_tts(checkpoint, device="cuda", megakernel=True)
        batch = BatchKernel(fast.model, streams)
        for buffer in (*batch._scratch, *batch._steps[0].scratch, *batch._steps[1].scratch):
            buffer.fill_(float("nan"))  # poisoned: every element read must have been written
        base = int.from_bytes(os.urandom(4), "little")
        with torch.inference_mode():
            inputs = [_random_inputs(fast, base + i) for i in range(count)]
            begun = [fast.model.begin(inputs[i].prefill.to(torch.bfloat16), caps[i]) for i in range(count)]
            alone = []
            for i in range(count):
                state, sampler = _copy(begun[i]), _sampler(fast, options, base + i, 3)
                codes = fast.model.frame_kernel.run(state, sampler, inputs[i], caps[i], threading.Event(), 4)
                alone.append(([c.cpu() for c in codes], state, sampler))
            runs, made, launch = [None] * count, [[] for _ in range(count)], 0
            while not all(run is not None and run.ended for run in runs):
                for i in range(count):
                    if runs[i] is None and joins[i] <= launch:
                        sampler = _sampler(fast, options, base + i, 3)
                        runs[i] = KernelRun.start(_copy(begun[i]), sampler, inputs[i], caps[i])
                going = [i for i in range(count) if runs[i] is not None and not runs[i].ended][:streams]
                if going:
                    frames = [min(3 + (i + launch) % 3, runs[i].cap - runs[i].state.frame) for i in going]
                    for i, codes in zip(going, batch.launch([runs[i] for i in going], frames)):
                        made[i] += [c.cpu() for c in codes]
                launch += 1
        where = f"{checkpoint.name}, {streams} streams, seed {base}"
        for i in range(count):
            got, run = made[i], runs[i]
            expected, state, sampler = alone[i]
            assert len(got) == len(expected) and all(torch.equal(a, b) for a, b in zip(got, expected)), \
                f"{where}: utterance {i} made {len(got)} frames, alone {len(expected)}"
            assert run.state.frame == state.frame and run.state.cache.length == state.cache.length, where
            n = state.cache.length
            assert torch.equal(run.state.cache.k[:, :, :n], state.cache.k[:, :, :n]), where
            assert torch.equal(run.state.cache.v[:, :, :n], state.cache.v[:, :, :n]), where
            assert torch.equal(run.sampler.seen, sampler.seen), where
        print(where, [len(m) for m in made])
        del fast, batch
        torch.cuda.empty_cache()


def test_kernel_draws_never_pick_a_suppressed_or_a_nan_code(tiny_checkpoint):
    """Where the noise or the logits are extreme, the on-device draws keep the Sampler's rule: seed 496234175 runs past
    frame 67 (whose draw picked suppressed id 2897 when the noise could be +inf), and codec-head rows of NaN weights
    (NaN logits: a broken model) are never picked, by the kernel or the reference; EOS is held back throughout."""
    torch.backends.cuda.matmul.allow_tf32 = False
    fast, ref = load_tts(tiny_checkpoint, device="cuda", megakernel=True), _reference(tiny_checkpoint)
    nan_rows = [5, 100, 1500]
    for tts in (fast, ref):
        with torch.no_grad():
            tts.model.talker.codec_head.weight[nan_rows] = float("nan")
    inputs, seed = _random_inputs(ref, 0), 496234175
    with torch.inference_mode():
        got, _, _ = _kernel_codes(fast, ref, inputs, SamplingOptions(), seed, 100, 10**9, per_launch=7)
        expected, _ = _reference_codes(ref, inputs, SamplingOptions(), seed, 100, 10**9)
    for codes in (got, expected):
        assert codes.shape == (100, 16)
        assert (codes[:, 0] < 2048).all() and not np.isin(codes[:, 0], nan_rows).any(), codes[:, 0]


@pytest.mark.parametrize("mode", ["icl", "x_vector"])
def test_kernel_speaks_a_cloned_voice_like_the_reference(base_checkpoint, mode):
    """A cloned voice's own prompt (built and prefilled as every voice's): the kernel's greedy codes over 60 frames
    are the reference's, draw by draw (teacher-forced; near-ties only, at most 1%), and a Base engine with the
    kernel streams the voice from a one-frame first chunk."""
    torch.backends.cuda.matmul.allow_tf32 = False
    text = "A cloned voice, spoken by the kernel."
    fast, ref = load_tts(base_checkpoint, device="cuda", megakernel=True), _reference(base_checkpoint)
    assert fast.model.frame_kernel is not None
    voice = ref.clone_voice(speech_like(4.0), 24_000, text="Hello there, this is my own voice.", mode=mode)
    with torch.inference_mode():
        inputs = ref.prompts.build(ref.prompts.text_ids(text), ref.resolve_voice(None, voice=voice), False, "cuda")
        greedy = SamplingOptions.greedy()
        got, _, state = _kernel_codes(fast, ref, inputs, greedy, 0, 60, 10**9, per_launch=7)
        replayed, forced = _reference_codes(ref, inputs, greedy, 0, 60, 10**9, forced=got)
    assert got.shape == (60, 16) and (replayed == got).all()
    where = f"{mode}: {forced.near_ties} near-ties; misses (frame, codebook, ref, kernel)"
    assert not forced.misses, f"{where} {forced.misses}"
    assert forced.near_ties <= forced.draws // 100, where
    chunks = list(fast.stream(text, voice=voice, sampling=greedy))
    assert chunks[0].codes.shape == (1, 16) and chunks[0].pcm.shape == (1920,)
    assert all(np.isfinite(c.pcm).all() for c in chunks)
