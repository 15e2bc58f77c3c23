"""The CPU's fast path (engine/tts/cpu.py): chosen by what the processor does, reported, one setting from float32."""

import copy

import numpy as np
import pytest
import torch

from engine.tts import SamplingOptions, load_tts
from engine.tts.codec import CausalTransposedConv, load_codec
from engine.tts.config import TTSConfig
from engine.tts.cpu import (BF16Linear, Int8Linear, Precision, TransposedConvMatmul, choose_precision, int8_problem,
                            native_bf16, quantize, speed_up_codec)
from engine.tts.model import Qwen3TTS
from engine.tts.sampling import Sampler
from engine.tts.testing.quality import measure

needs_int8 = pytest.mark.skipif(int8_problem() is not None, reason=f"no int8 path: {int8_problem()}")


@pytest.fixture(scope="module")
def int8_tts(short_checkpoint):
    return load_tts(short_checkpoint, precision="int8")


@needs_int8
def test_auto_on_a_cpu_with_fbgemm_is_int8_and_the_engine_says_so(short_checkpoint):
    """precision "auto" gives int8 linears in talker and code predictor, and tts.precision names it."""
    tts = load_tts(short_checkpoint)
    assert tts.precision.setting == "int8" and tts.precision.weights == "int8"
    assert str(tts.precision).startswith("int8 weights")
    layer = tts.model.talker.model.layers[0]
    assert isinstance(layer.self_attn.prologue.qkv, Int8Linear) and isinstance(layer.self_attn.o_proj, Int8Linear)
    assert isinstance(layer.mlp.fused.gate_up, Int8Linear) and isinstance(layer.mlp.fused.down_proj, Int8Linear)
    assert isinstance(tts.model.talker.code_predictor.lm_head[3], Int8Linear)
    assert isinstance(tts.model.talker.codec_head, Int8Linear)


def test_float32_is_one_setting_away_and_untouched(short_checkpoint):
    """precision "float32" keeps every nn.Linear and a float32 codec: today's reference path."""
    tts = load_tts(short_checkpoint, precision="float32")
    assert str(tts.precision) == "float32 weights, float32 activations, float32 codec"
    assert not any(isinstance(m, (Int8Linear, BF16Linear)) for m in tts.model.modules())
    assert tts.codec.pre_conv.conv.weight.dtype == torch.float32


@pytest.mark.parametrize("precision", ["int8", "bf16"])
def test_a_model_off_the_cpu_keeps_its_layers(tiny_checkpoint, precision):
    """The swapped layers are CPU kernels: a model whose weights live elsewhere (a GPU's, here the meta device)
    keeps its nn.Linear layers, whatever the precision says (a CUDA engine in bfloat16 once got oneDNN's)."""
    with torch.device("meta"):
        model = Qwen3TTS(TTSConfig.from_file(tiny_checkpoint / "config.json").talker)
    quantize(model, {"int8": Precision("int8", "int8", "float32", "bfloat16"),
                     "bf16": Precision("bf16", "bfloat16", "bfloat16", "bfloat16")}[precision])
    assert not any(isinstance(m, (Int8Linear, BF16Linear)) for m in model.modules())


@pytest.mark.parametrize("precision", ["int4", "fp8", "bfloat16", ""])
def test_an_unknown_precision_is_refused_with_the_valid_ones(short_checkpoint, precision):
    with pytest.raises(ValueError, match="choose one of: auto, float32, bf16, int8"):
        load_tts(short_checkpoint, precision=precision)


def test_dtype_and_precision_together_on_the_cpu_are_refused(short_checkpoint):
    with pytest.raises(ValueError, match="give precision alone"):
        load_tts(short_checkpoint, dtype="float32", precision="int8")


def test_codec_is_bfloat16_only_where_the_cpu_has_bfloat16_math():
    assert choose_precision("float32").codec == "float32"
    assert choose_precision("bf16").codec == ("bfloat16" if native_bf16() else "float32")


@needs_int8
def test_int8_streams_and_chunking_keeps_the_codes(int8_tts):
    """The int8 engine streams 80 ms chunks; the same seed gives the same codes in any chunking."""
    one = list(int8_tts.stream("Grouped.", "ryan", seed=5, chunk_frames=1))
    four = list(int8_tts.stream("Grouped.", "ryan", seed=5))
    assert all(c.pcm.dtype == np.float32 and c.pcm.shape == (c.codes.shape[0] * 1920,) for c in one)
    np.testing.assert_array_equal(np.concatenate([c.codes for c in one]), np.concatenate([c.codes for c in four]))


def _steps(model: Qwen3TTS, tts, prompt: torch.Tensor, frames: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy frames from a prompt: the talker's hidden states (frames + 1, hidden) and the codes (frames, 16)."""
    talker = tts.config.talker
    sampler = Sampler(SamplingOptions.greedy(), 0, talker.decoder.vocab_size, talker.codec_eos_id, tts._suppress)
    state = model.begin(prompt, frames)
    hidden, codes = [state.hidden], []
    for i in range(frames):
        codes.append(model.sample_frame(state, sampler))
        model.advance(state, codes[-1], prompt[i])
        hidden.append(state.hidden)
    return torch.stack(hidden), torch.stack(codes)


@pytest.mark.parametrize("precision", ["int8", "bf16"])
def test_stacked_products_compute_what_the_layers_one_by_one_do(float32_tts, precision):
    """quantize's fused layers (q/k/v in one product, gate/up in one, q and k normed and rotated together) give the
    same hidden states and codes, bit for bit, as each linear swapped for its own fast layer."""
    if precision == "int8" and int8_problem():
        pytest.skip(f"no int8 path: {int8_problem()}")
    if precision == "bf16" and not native_bf16():
        pytest.skip("no native bfloat16: precision bf16 keeps the nn.Linear layers")
    linear, dtype = {"int8": (Int8Linear, torch.float32), "bf16": (BF16Linear, torch.bfloat16)}[precision]
    one_by_one, fused = (copy.deepcopy(float32_tts.model).to(dtype) for _ in range(2))
    talker = one_by_one.talker
    for root in (talker.model.layers, talker.code_predictor):
        for module in list(root.modules()):
            for name, child in list(module.named_children()):
                if isinstance(child, torch.nn.Linear):
                    setattr(module, name, linear(child))
    talker.codec_head = linear(talker.codec_head)
    quantize(fused, choose_precision(precision))
    assert fused.talker.model.layers[0].self_attn.q_proj is None  # its weights are in the prologue's product
    hidden_size = float32_tts.config.talker.decoder.hidden_size
    prompt = torch.randn(9, hidden_size, generator=torch.Generator().manual_seed(0)).to(dtype)
    expected, got = _steps(one_by_one, float32_tts, prompt, 6), _steps(fused, float32_tts, prompt, 6)
    torch.testing.assert_close(got, expected, atol=0, rtol=0)


@needs_int8
def test_int8_weights_round_trip_through_fbgemms_packing(int8_tts):
    """The packed layer holds the int8 weights and per-channel scales it was made from: w ~ ints * scale."""
    layer = int8_tts.model.talker.model.layers[0].mlp.fused.gate_up
    ints, scale, bias = layer.unpack()
    assert ints.dtype == torch.int8 and ints.abs().max() == 127 and bias is None
    assert scale.shape == (layer.out_features,) and bool((scale > 0).all())


def test_transposed_convolutions_as_matrix_products_equal_the_convolutions(tiny_checkpoint):
    """speed_up_codec changes rounding only: a float32 codec decodes the same audio, whole and streamed."""
    plain = load_codec(tiny_checkpoint / "speech_tokenizer")
    fast = load_codec(tiny_checkpoint / "speech_tokenizer")
    speed_up_codec(fast)
    assert all(m.matmul is not None for m in fast.modules() if isinstance(m, CausalTransposedConv))
    codes = torch.randint(0, plain.config.codebook_size, (9, plain.config.num_quantizers),
                          generator=torch.Generator().manual_seed(0))
    expected = plain.decode(codes)
    torch.testing.assert_close(fast.decode(codes), expected, atol=1e-5, rtol=0)
    stream = fast.stream()
    streamed = torch.cat([stream.decode(codes[:1]), stream.decode(codes[1:5]), stream.decode(codes[5:])])
    torch.testing.assert_close(streamed, expected, atol=1e-5, rtol=0)


def test_a_long_input_takes_the_convolution():
    """Beyond MAX_SAMPLES input samples the matrix-product form hands the call to the convolution itself."""
    conv = torch.nn.ConvTranspose1d(8, 4, 6, stride=3)
    matmul = TransposedConvMatmul(conv, torch.nn.Linear)
    for samples in (1, TransposedConvMatmul.MAX_SAMPLES, TransposedConvMatmul.MAX_SAMPLES + 1):
        x = torch.randn(1, 8, samples)
        torch.testing.assert_close(matmul(x), conv(x), atol=1e-5, rtol=0)


@pytest.fixture(scope="module")
def float32_tts(tiny_checkpoint):
    return load_tts(tiny_checkpoint, precision="float32")


# The tiny model's int8 gives about 0.99 (codebook 0) and 0.94 (codebooks 1..15) over 100 frames, and with every
# layer's scales shuffled 0.17 and 0.09; bench/tts_cpu_quality.py's figures for 0.6B are in docs/BENCHMARKS.md
TALKER_AGREEMENT, PREDICTOR_AGREEMENT, CODEC_SNR_DB = 0.95, 0.88, 20.0


@needs_int8
def test_int8_follows_float32_teacher_forced(float32_tts, tiny_checkpoint):
    """Over 100 teacher-forced frames the int8 engine's argmaxes agree with float32's, and its codec's audio is
    within CODEC_SNR_DB of float32's."""
    result = measure(float32_tts, load_tts(tiny_checkpoint, precision="int8"), frames=100, codec_frames=20)
    assert result.talker >= TALKER_AGREEMENT and result.predictor >= PREDICTOR_AGREEMENT, result
    assert result.codec_snr_db >= CODEC_SNR_DB, result


@needs_int8
def test_the_gate_catches_int8_weights_with_the_wrong_scales(float32_tts, tiny_checkpoint):
    """Each layer's per-channel scales shuffled across its channels (a layout bug) fails the same gate."""
    broken = load_tts(tiny_checkpoint, precision="int8")
    generator = torch.Generator().manual_seed(0)
    for layer in broken.model.modules():
        if isinstance(layer, Int8Linear):
            ints, scale, bias = layer.unpack()
            layer.pack(ints, scale[torch.randperm(scale.numel(), generator=generator)], bias)
    result = measure(float32_tts, broken, frames=100, codec_frames=1)
    assert result.talker < TALKER_AGREEMENT and result.predictor < PREDICTOR_AGREEMENT, result
