"""The engine on a CUDA GPU: same greedy codes as on the CPU in float32, finite speech in bfloat16, and the
codec's stream graphs captured at load."""

import numpy as np
import pytest
import torch

from engine.tts import SamplingOptions, load_tts

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_cuda_float32_greedy_codes_equal_the_cpu(short_checkpoint, exact_float32):
    """Greedy decoding on the GPU in float32 gives the CPU's codes and audio (1e-4)."""
    cpu = load_tts(short_checkpoint, precision="float32")
    gpu = load_tts(short_checkpoint, device="cuda", dtype="float32")
    for text, speaker in [("Hello there.", "ryan"), ("Another voice, another text.", "serena")]:
        a = list(cpu.stream(text, speaker, sampling=SamplingOptions.greedy()))
        b = list(gpu.stream(text, speaker, sampling=SamplingOptions.greedy()))
        np.testing.assert_array_equal(np.concatenate([c.codes for c in a]), np.concatenate([c.codes for c in b]))
        np.testing.assert_allclose(np.concatenate([c.pcm for c in a]), np.concatenate([c.pcm for c in b]), atol=1e-4)


def test_cuda_seeded_sampling_equals_the_cpu(short_checkpoint, exact_float32):
    """The counter-based RNG makes a seeded GPU run pick the CPU run's codes."""
    cpu = load_tts(short_checkpoint, precision="float32")
    gpu = load_tts(short_checkpoint, device="cuda", dtype="float32")
    a = np.concatenate([c.codes for c in cpu.stream("Seeded on two devices.", "aiden", seed=42)])
    b = np.concatenate([c.codes for c in gpu.stream("Seeded on two devices.", "aiden", seed=42)])
    np.testing.assert_array_equal(a, b)


def test_cuda_bfloat16_is_the_default_and_streams_finite_speech(short_checkpoint):
    """device='cuda' loads bfloat16 by default and streams finite, non-silent 24 kHz chunks."""
    tts = load_tts(short_checkpoint, device="cuda")
    assert tts.dtype == torch.bfloat16
    pcm = tts.synthesize("Brain float.", "vivian", seed=1)
    assert pcm.shape == (6 * 1920,) and np.isfinite(pcm).all() and np.abs(pcm).max() > 0


def test_cuda_load_captures_the_codec_graphs_and_chunks_equal_the_eager_codec(short_checkpoint):
    """load_tts on CUDA captures the codec's graphs for every chunk the default stream makes (1 to 4 frames: the
    first, the full ones and a tail), and the streamed chunks equal the codec's eager stream of the same codes."""
    tts = load_tts(short_checkpoint, device="cuda", megakernel=False)
    assert tts.codec.captured_chunks == [1, 2, 3, 4]
    chunks = list(tts.stream("Hello there.", "ryan", seed=1))
    assert chunks[0].codes.shape[0] == 1
    eager = tts.codec.stream(eager=True)
    expected = [eager.decode(torch.from_numpy(c.codes)).cpu().numpy() for c in chunks]
    np.testing.assert_allclose(np.concatenate([c.pcm for c in chunks]), np.concatenate(expected), atol=1e-2, rtol=0)
