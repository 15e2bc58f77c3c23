"""The megakernel's decoder step against the PyTorch stack on the same weights (GPU only; CI compiles it)."""

import numpy as np
import pytest
import torch

from engine.tts import load_tts
from engine.tts.model import KVCache

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _stacks(checkpoint):
    """The kernel-attached bf16 engine, and a float32 copy of the same (bf16-exact) weights as reference."""
    fast = load_tts(checkpoint, device="cuda", megakernel=True)
    ref = load_tts(checkpoint, device="cuda", dtype="float32", megakernel=False)
    return fast, ref


def _cosine(a, b):
    return torch.nn.functional.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()


@pytest.mark.parametrize("which", ["talker", "predictor"])
def test_kernel_step_equals_the_pytorch_stack_step_by_step(tiny_checkpoint, tiny17_checkpoint, which):
    """Over 40 steps from a shared random cache, hidden-state cosine >= 0.9999 per step, both model shapes."""
    torch.backends.cuda.matmul.allow_tf32 = False
    for checkpoint in (tiny_checkpoint, tiny17_checkpoint):
        fast, ref = _stacks(checkpoint)
        pick = {"talker": lambda m: m.talker.model, "predictor": lambda m: m.talker.code_predictor.model}[which]
        kstack, rstack = pick(fast.model), pick(ref.model)
        cfg = kstack.cfg
        generator = torch.Generator(device="cuda").manual_seed(5)
        kcache = KVCache(cfg, 80, "cuda", torch.bfloat16)
        rcache = KVCache(cfg, 80, "cuda", torch.float32)
        prefix = 23
        kcache.k[:, :, :prefix] = torch.randn(kcache.k[:, :, :prefix].shape, device="cuda", generator=generator)
        kcache.v[:, :, :prefix] = torch.randn(kcache.v[:, :, :prefix].shape, device="cuda", generator=generator)
        rcache.k[:, :, :prefix], rcache.v[:, :, :prefix] = kcache.k[:, :, :prefix].float(), kcache.v[:, :, :prefix].float()
        kcache.length = rcache.length = prefix
        kstack.kernel_step.x.fill_(float("nan"))  # poisoned scratch: every element must be rewritten
        with torch.inference_mode():
            for step in range(40):
                x = torch.randn(1, cfg.hidden_size, device="cuda", generator=generator)
                got = kstack(x.bfloat16(), kcache).float()
                expected = rstack(x, rcache)
                assert torch.isfinite(got).all(), f"step {step}"
                cos = _cosine(got, expected)
                assert cos >= 0.9999, f"{checkpoint.name} {which} step {step}: cosine {cos:.6f}"
                pos = kcache.length - 1
                assert _cosine(kcache.k[:, :, pos], rcache.k[:, :, pos]) >= 0.9999
                assert _cosine(kcache.v[:, :, pos], rcache.v[:, :, pos]) >= 0.9999


def test_engine_with_the_kernel_streams_speech(short_checkpoint):
    """load_tts on CUDA picks the kernel by default; it streams finite speech of the expected length."""
    tts = load_tts(short_checkpoint, device="cuda")
    assert tts.model.talker.model.kernel_step is not None
    chunks = list(tts.stream("Kernel speech.", "ryan", seed=3))
    pcm = np.concatenate([c.pcm for c in chunks])
    assert pcm.shape == (6 * 1920,) and np.isfinite(pcm).all() and np.abs(pcm).max() > 0
