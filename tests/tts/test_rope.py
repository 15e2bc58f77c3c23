"""The talker's interleaved M-RoPE with three equal position streams is exactly plain RoPE."""

import pytest
import torch

from engine.tts.config import DecoderConfig
from engine.tts.model import DecoderStack, rotate_half
from tests.oracle import import_qwen_tts


def mrope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, section: list[int], interleaved: bool):
    """M-RoPE as Qwen3-TTS's config describes it, written from its definition: positions (3, T).

    Each rotary pair i takes its angle from one of the three streams (temporal, height, width):
    interleaved, pair i uses stream i % 3 for the first 3 * section[1..] pairs and stream 0 beyond;
    blocked, pairs are assigned to streams in contiguous runs of section[0], section[1], section[2].
    """
    pairs = inv_freq.numel()
    if interleaved:
        stream = torch.zeros(pairs, dtype=torch.long)
        for s in (1, 2):
            stream[s:section[s] * 3:3] = s
    else:
        stream = torch.repeat_interleave(torch.arange(3), torch.tensor(section))
    angles = positions.float()[:, :, None] * inv_freq[None, None, :]  # (3, T, pairs)
    chosen = angles[stream, :, torch.arange(pairs)].T  # (T, pairs)
    emb = torch.cat((chosen, chosen), dim=-1)
    return emb.cos(), emb.sin()


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("head_dim,section", [(128, [24, 20, 20]), (16, [4, 2, 2])])
def test_mrope_with_equal_streams_equals_plain_rope(head_dim, section, interleaved):
    """Rotating q by M-RoPE on equal streams gives the same q as the engine's plain RoPE, bit for bit."""
    cfg = DecoderConfig(hidden_size=64, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
                        head_dim=head_dim, rms_norm_eps=1e-6, rope_theta=1e6, vocab_size=8)
    stack = DecoderStack(cfg)
    T, start = 37, 1000
    q = torch.randn(2, T, head_dim)
    cos, sin = stack.rotary(start, T, q)
    inv_freq = stack._inv_freq
    positions = torch.arange(start, start + T).expand(3, T)
    mcos, msin = mrope_cos_sin(positions, inv_freq, section, interleaved)
    assert torch.equal(q * cos + rotate_half(q) * sin, q * mcos + rotate_half(q) * msin)

    # and the official implementation agrees, fed the same equal streams
    import_qwen_tts()
    from qwen_tts.core.models.modeling_qwen3_tts import apply_multimodal_rotary_pos_emb

    ang = positions.float()[:, None, :, None] * inv_freq[None, None, None, :]  # (3, batch, T, pairs)
    emb = torch.cat((ang, ang), dim=-1)[..., 0, :, :]  # (3, T, D)
    official_q, _ = apply_multimodal_rotary_pos_emb(q[None], q[None], emb.cos()[:, None], emb.sin()[:, None],
                                                    section, interleaved)
    torch.testing.assert_close(official_q[0], q * cos + rotate_half(q) * sin, rtol=0, atol=0)


def test_mrope_with_unequal_streams_differs_from_plain_rope():
    """The check above can fail: distinct streams do change the rotation (so equality is not vacuous)."""
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, 128, 2).float() / 128))
    equal, _ = mrope_cos_sin(torch.arange(10).expand(3, 10), inv_freq, [24, 20, 20], True)
    unequal, _ = mrope_cos_sin(torch.stack([torch.arange(10), torch.arange(10) * 2, torch.arange(10) * 3]),
                               inv_freq, [24, 20, 20], True)
    assert not torch.allclose(equal, unequal)
