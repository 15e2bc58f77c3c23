"""The speech-tokenizer decoder: streaming equals a full decode (eagerly, and on CUDA replayed as graphs),
both equal the official qwen_tts decoder on the same folder, folders travel both ways between Parley and
the official classes, and broken folders fail with messages that name the file and the tensor or key."""

import copy
import itertools
import json
import shutil

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file

from engine.errors import ModelFilesError
from engine.tts.codec import Attention, CodecConfig, CodecDecoder, SnakeBeta, StreamState, load_codec
from engine.tts.kernels.fused import attach_codec
from engine.tts.model import MLP, RMSNorm
from engine.tts.testing import codec_files
from engine.tts.testing.codec_files import codec_config, randomize_decoder, write_codec_folder

FRAMES = 100  # > 12 sliding windows of the tiny config (8 frames) and > 1 of the published (72)
# float32, max abs difference: different reduction orders (a 1-frame matmul against a 100-frame
# one) round differently by ~1e-7 relative, and the conv stack amplifies that; measured 6e-6 (on the
# CPU, and on CUDA with TF32 off).
STREAM_ATOL = 5e-5
# float32 against the official decoder's forward (sdpa attention): measured 0.0 for decode (2.4e-6
# against its eager attention), 6e-6 for the stream (the stream's own rounding, above).
OFFICIAL_ATOL = 5e-5


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return write_codec_folder(tmp_path_factory.mktemp("codec") / "speech_tokenizer", "tiny", seed=0)


@pytest.fixture(scope="module")
def decoder(tiny_folder):
    return load_codec(tiny_folder)


@pytest.fixture(scope="module")
def codes(decoder):
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, decoder.config.codebook_size, (FRAMES, decoder.config.num_quantizers), generator=g)


@pytest.fixture(scope="module")
def full_audio(decoder, codes):
    return decoder.decode(codes)


@pytest.fixture(scope="module")
def official():
    """The official qwen_tts 12 Hz tokenizer classes (test oracle)."""
    from tests.oracle import import_qwen_tts

    import_qwen_tts()
    from qwen_tts.core.tokenizer_12hz import modeling_qwen3_tts_tokenizer_v2 as modeling

    return modeling


def stream_in_chunks(decoder, codes, sizes, eager=False):
    """Decode `codes` through one stream in chunks of the given sizes (cycled), checking each length."""
    stream, pieces, start = decoder.stream(eager=eager), [], 0
    for size in itertools.cycle(sizes):
        if start >= len(codes):
            break
        chunk = codes[start : start + size]
        pcm = stream.decode(chunk)
        assert pcm.shape == (len(chunk) * decoder.config.frame_samples,)
        pieces.append(pcm)
        start += size
    return torch.cat(pieces)


def state_tensors(state):
    """(shape, dtype, address) of each tensor of a StreamState, its flat buffer and position included."""
    tensors = [state.values, state.position, *(t for views in state._views.values() for t in views)]
    return [(tuple(t.shape), t.dtype, t.data_ptr()) for t in tensors]


def test_tiny_audio_is_mostly_unclipped_and_finite(decoder, full_audio):
    """The random tiny weights give finite audio that is neither silent nor clipped, so comparisons mean something."""
    assert full_audio.shape == (FRAMES * decoder.config.frame_samples,) and full_audio.dtype == torch.float32
    assert torch.isfinite(full_audio).all()
    assert full_audio.std() > 0.05
    assert (full_audio.abs() >= 1).float().mean() < 0.05


@pytest.mark.parametrize("sizes", [[1], [4], [3, 7, 1], [1, 3, 7, 2, 5, 11, 4]], ids=str)
def test_streamed_audio_equals_full_decode(decoder, codes, full_audio, sizes):
    """In chunks of any sizes (cycled: frame by frame, fours, and uneven ones that cross the window at every
    offset) each call returns its frames' final samples, equal to a full decode."""
    streamed = stream_in_chunks(decoder, codes, sizes)
    assert (streamed - full_audio).abs().max() < STREAM_ATOL


def test_stream_state_keeps_its_size_and_addresses(decoder, codes):
    """The stream state is allocated once: its tensors keep their shapes and addresses over many windows (what a
    CUDA graph needs), and attention keeps sliding_window - 1 frames."""
    stream = decoder.stream()
    before = state_tensors(stream._state)
    for frame in range(3 * decoder.config.sliding_window):
        stream.decode(codes[frame : frame + 1])
    assert state_tensors(stream._state) == before
    assert int(stream._state.position) == 3 * decoder.config.sliding_window
    kept = [views for module, views in stream._state._views.items() if len(views) == 2]
    assert len(kept) == decoder.config.num_hidden_layers
    assert all(k.shape[2] == v.shape[2] == decoder.config.sliding_window - 1 for k, v in kept)


def test_next_stream_starts_from_a_fresh_state(decoder, codes, full_audio):
    """A stream after another one (ended mid-utterance) starts from zeros, and its audio equals a full decode."""
    first = decoder.stream()
    for start in range(0, 30, 3):
        first.decode(codes.flip(0)[start : start + 3])
    del first
    second = decoder.stream()
    assert int(second._state.position) == 0 and not second._state.values.any()
    pieces = [second.decode(codes[start : start + 4]) for start in range(0, FRAMES, 4)]
    assert (torch.cat(pieces) - full_audio).abs().max() < STREAM_ATOL


def test_two_live_streams_do_not_share_state(decoder, codes, full_audio):
    """A stream started while another is mid-utterance has a state of its own, so interleaving them gives each the
    audio of its own codes."""
    first = decoder.stream()
    a = [first.decode(codes[frame : frame + 1]) for frame in range(10)]
    second = decoder.stream()
    assert second._state is not first._state
    other = codes.flip(0)
    b = []
    for frame in range(10, 30):
        a.append(first.decode(codes[frame : frame + 1]))
        b.append(second.decode(other[frame - 10 : frame - 9]))
    assert (torch.cat(a) - full_audio[: 30 * decoder.config.frame_samples]).abs().max() < STREAM_ATOL
    assert (torch.cat(b) - decoder.decode(other[:20])).abs().max() < STREAM_ATOL


def test_stream_call_reads_no_value_back_to_the_host(tmp_path):
    """A stream call runs on meta tensors (shapes, no data), so it has no host read that would stop a CUDA
    graph capture (an .item(), a data-dependent shape) and keeps no host copy of the position."""
    (tmp_path / "config.json").write_text(json.dumps(codec_config("tiny")))
    with torch.device("meta"):
        decoder = CodecDecoder(CodecConfig.from_file(tmp_path / "config.json"))
    with torch.inference_mode():
        state = StreamState(decoder)
        for frames in (1, 4, 3):
            pcm = decoder(torch.zeros(frames, decoder.config.num_quantizers, dtype=torch.int64, device="meta"), state)
            assert pcm.shape == (frames * decoder.config.frame_samples,) and pcm.device.type == "meta"


def test_warm_up_on_the_cpu_captures_nothing(decoder):
    """Without CUDA there are no graphs to capture; a chunk length below 1 is refused by name."""
    decoder.warm_up([1, 4])
    assert decoder.captured_chunks == []
    with pytest.raises(ValueError, match=r"chunk lengths must be >= 1 frame, got \[1, 0\]"):
        decoder.warm_up([1, 0])


def test_decode_rejects_codes_of_the_wrong_shape(decoder, codes):
    """Codes that are not (frames >= 1, num_quantizers) integers raise a ValueError naming the shape."""
    with pytest.raises(ValueError, match=r"\(frames >= 1, 16\).*\(100, 15\)"):
        decoder.decode(codes[:, :15])
    with pytest.raises(ValueError, match="float"):
        decoder.stream().decode(codes.float())
    with pytest.raises(ValueError, match=r"\(0, 16\)"):
        decoder.stream().decode(codes[:0])


@pytest.mark.oracle
def test_decode_equals_official_decoder_on_parleys_folder(official, tiny_folder, decoder, codes, full_audio):
    """The official classes load Parley's folder with no missing or unexpected keys, and decode the same waveform."""
    model, info = official.Qwen3TTSTokenizerV2Model.from_pretrained(str(tiny_folder), output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    with torch.inference_mode():
        expected = model.decoder(codes.T[None])[0, 0]  # (1, 16, frames) -> (1, 1, samples)
    assert (full_audio - expected).abs().max() < OFFICIAL_ATOL
    assert (stream_in_chunks(decoder, codes, [1, 4, 2]) - expected).abs().max() < OFFICIAL_ATOL


@pytest.mark.oracle
def test_official_tokenizer_wrapper_loads_parleys_folder(official, tiny_folder, full_audio, codes):
    """qwen_tts' Qwen3TTSTokenizer (AutoFeatureExtractor + AutoModel) loads the folder and decodes the same audio."""
    from qwen_tts.inference.qwen3_tts_tokenizer import Qwen3TTSTokenizer

    tokenizer = Qwen3TTSTokenizer.from_pretrained(str(tiny_folder))
    assert tokenizer.feature_extractor.sampling_rate == 24000
    wavs, sample_rate = tokenizer.decode([{"audio_codes": codes}])
    assert sample_rate == 24000
    assert (torch.from_numpy(wavs[0]) - full_audio).abs().max() < OFFICIAL_ATOL


@pytest.mark.oracle
def test_folder_saved_by_official_classes_loads_and_decodes_identically(official, tmp_path, codes):
    """A folder the official save_pretrained writes (no head_dim key: the official fallback) loads in load_codec."""
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Config

    config = codec_config("tiny")
    del config["decoder_config"]["head_dim"]  # the class does not save it unless given
    model = official.Qwen3TTSTokenizerV2Model(Qwen3TTSTokenizerV2Config.from_dict(config))
    # The official init leaves codebooks at zero (silence); give it random weights that make sound.
    (tmp_path / "config.json").write_text(json.dumps(config))
    weights = CodecDecoder(CodecConfig.from_file(tmp_path / "config.json"))
    randomize_decoder(weights, torch.Generator().manual_seed(5))
    model.decoder.load_state_dict(weights.state_dict(), strict=True)
    model.save_pretrained(tmp_path / "saved")

    decoder = load_codec(tmp_path / "saved")
    sizes = config["decoder_config"]
    assert decoder.config.head_dim == sizes["hidden_size"] // sizes["num_attention_heads"]
    with torch.inference_mode():
        expected = model.decoder(codes[:40].T[None])[0, 0]
    assert expected.std() > 0.05
    assert (decoder.decode(codes[:40]) - expected).abs().max() < OFFICIAL_ATOL
    assert (stream_in_chunks(decoder, codes[:40], [3, 1]) - expected).abs().max() < OFFICIAL_ATOL


def test_bfloat16_stream_tracks_float32_decode(tiny_folder, codes, full_audio):
    """In bfloat16 the weights and the carried state are bfloat16 and the audio stays close to float32's."""
    decoder = load_codec(tiny_folder, dtype=torch.bfloat16)
    stream = decoder.stream()
    streamed = torch.cat([stream.decode(codes[i : i + 1]) for i in range(40)])
    assert stream._state.values.dtype == torch.bfloat16 and stream._state.values.numel() > 0
    assert streamed.dtype == torch.float32
    reference = full_audio[: len(streamed)]
    assert (streamed - reference).abs().mean() < 0.03
    assert torch.corrcoef(torch.stack([streamed, reference]))[0, 1] > 0.99


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_float32_stream_equals_cuda_decode_and_cpu(tiny_folder, codes, full_audio):
    """On CUDA with TF32 off (with it, cuDNN convs alone differ by ~3e-3) the stream (graphs captured with it off)
    equals full decode and CPU."""
    decoder = load_codec(tiny_folder, device="cuda")
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        full = decoder.decode(codes)
        streamed = stream_in_chunks(decoder, codes, [1, 3, 7, 2])
    assert full.device.type == "cuda" and streamed.device.type == "cuda"
    assert (streamed - full).abs().max() < STREAM_ATOL
    assert (full.cpu() - full_audio).abs().max() < STREAM_ATOL


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_bfloat16_stream_tracks_float32_decode(tiny_folder, codes, full_audio):
    """On CUDA in bfloat16 the streamed audio stays close to the float32 decode."""
    decoder = load_codec(tiny_folder, device="cuda", dtype=torch.bfloat16)
    streamed = stream_in_chunks(decoder, codes, [1, 3, 7, 2]).cpu()
    assert (streamed - full_audio).abs().mean() < 0.03
    assert torch.corrcoef(torch.stack([streamed, full_audio]))[0, 1] > 0.99


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_bf16_codec_with_the_megakernel_kernels_streams_as_without(tiny_folder, codes):
    """With the megakernel's kernels (engine.tts.kernels.fused.attach_codec: SnakeBeta, RMSNorm and the MLP's activation
    in one launch each, gate and up in one GEMM, the attention's q, k and v in one and its RoPE and window in one) the
    bf16 stream, graphs replayed, is the plain decoder's audio but where a rounding step differs: relative RMS
    difference < 1%."""
    plain = load_codec(tiny_folder, device="cuda", dtype=torch.bfloat16)
    fused = load_codec(tiny_folder, device="cuda", dtype=torch.bfloat16)
    attach_codec(fused)
    assert all(m.kernel is not None for m in fused.modules() if isinstance(m, (SnakeBeta, RMSNorm)))
    assert all(m.fused is not None for m in fused.modules() if isinstance(m, MLP))
    assert all(m.prologue is not None for m in fused.modules() if isinstance(m, Attention))
    expected = stream_in_chunks(plain, codes.cuda(), [1, 4]).float()
    got = stream_in_chunks(fused, codes.cuda(), [1, 4]).float()
    assert fused.captured_chunks == [1, 4]
    error = ((got - expected).pow(2).mean().sqrt() / expected.pow(2).mean().sqrt()).item()
    assert error < 0.01, f"relative RMS difference: {error:.3g}"


def test_snake_factors_follow_the_weights_when_loaded_and_converted(decoder):
    """SnakeBeta's e^alpha and 1 / (e^beta + 1e-9), computed once, are those of the loaded weights (not of the zeros
    it was made with) and, after a dtype change, of the converted weights: its output is the official formula's."""
    def official(m, x):
        return x + (1.0 / (m.beta.exp()[None, :, None] + 1e-9)) * torch.sin(x * m.alpha.exp()[None, :, None]).pow(2)

    snake = next(m for m in decoder.modules() if isinstance(m, SnakeBeta))
    assert snake.alpha.abs().max() > 0
    x = torch.randn(1, snake.alpha.numel(), 5, generator=torch.Generator().manual_seed(0))
    assert torch.equal(snake(x), official(snake, x))
    half = copy.deepcopy(snake).to(torch.bfloat16)
    assert torch.equal(half(x.bfloat16()), official(half, x.bfloat16()))



@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("size", ["tiny", "full"])
def test_cuda_window_prologue_keeps_the_streams_keys_and_values_as_the_attention_ops(tiny_folder, full_config, codes,
                                                                                       size):
    """The codec attention's stream path with WindowPrologue alone (one GEMM for q, k and v; RoPE and the window in
    attention_prologue.cu without its norm), grouped heads (tiny: 4 over 2) and the published 16 x 64: over chunks
    of 1, 4 and 3 frames each layer's kept keys and values track the plain ops' (cosine >= 0.9999) and so does the
    audio (relative RMS difference < 1%); norms given by halves are refused."""
    from engine.tts.kernels.build import build
    from engine.tts.kernels.fused import WindowPrologue

    if size == "tiny":
        plain = load_codec(tiny_folder, device="cuda", dtype=torch.bfloat16)
    else:
        plain = CodecDecoder(full_config).eval()
        randomize_decoder(plain, torch.Generator().manual_seed(0))
        plain = plain.to(device="cuda", dtype=torch.bfloat16)
    fused = copy.deepcopy(plain)
    layers = [m for m in fused.modules() if isinstance(m, Attention)]
    for attention in layers:
        attention.prologue = WindowPrologue(attention, build())
    streams, audio = [], []
    for decoder in (plain, fused):
        stream = decoder.stream(eager=True)
        audio.append(torch.cat([stream.decode(chunk) for chunk in codes[:8].cuda().split([1, 4, 3])]).float())
        streams.append(stream)
    expected, got = audio
    error = ((got - expected).pow(2).mean().sqrt() / expected.pow(2).mean().sqrt()).item()
    assert error < 0.01, f"relative RMS difference: {error:.3g}"
    plain_layers = [m for m in plain.modules() if isinstance(m, Attention)]
    for ours, theirs in zip(layers, plain_layers):
        for a, b in zip(streams[1]._state[ours], streams[0]._state[theirs]):
            cosine = torch.nn.functional.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()
            assert cosine >= 0.9999, f"kept keys/values: cosine {cosine:.7f}"
    prologue, x = layers[0].prologue, torch.zeros(3, 8, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="q_norm and k_norm go together"):
        prologue.module.attention_prologue(x, x, x, x[0], None, x, x, x[None, None], x[None, None], 0, 0, 1e-6)

def test_codebook_entries_follow_the_weights_when_loaded_converted_and_randomized(decoder, full_config):
    """A codebook's entries, divided once, are the official's embedding_sum / max(cluster_usage, 1e-5) of the loaded
    weights, of the converted ones after a dtype change, and of the ones randomize_decoder writes in place."""
    def official(m, codes):
        return F.embedding(codes, m.embedding_sum / m.cluster_usage.clamp(min=1e-5)[:, None])

    codes = torch.arange(0, decoder.config.codebook_size, 7)[None]
    codebook = decoder.quantizer.rvq_rest.vq.layers[3]._codebook
    assert (codebook.cluster_usage < 1e-5).any()  # entries the clamp decides
    assert torch.equal(codebook(codes), official(codebook, codes))
    half = copy.deepcopy(codebook).to(torch.bfloat16)
    assert torch.equal(half(codes), official(half, codes))
    fresh = CodecDecoder(full_config)
    randomize_decoder(fresh, torch.Generator().manual_seed(1))
    codebook = fresh.quantizer.rvq_first.vq.layers[0]._codebook
    assert torch.equal(codebook(codes), official(codebook, codes))

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

# Graph replays against the same code run op by op on the same device: the same kernels on the same shapes,
# so equal but for an algorithm choice that differs under capture (none is expected).
GRAPH_ATOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


@pytest.fixture(scope="module")
def full_config(tmp_path_factory):
    """The published codec sizes (window 72, head_dim 64, 16 heads)."""
    path = tmp_path_factory.mktemp("full") / "config.json"
    path.write_text(json.dumps(codec_config("full")))
    return CodecConfig.from_file(path)


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("size", ["tiny", "full"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_cuda_graph_stream_equals_the_eager_stream(tiny_folder, full_config, codes, size, dtype):
    """On CUDA the graph-replayed stream equals the same code run eagerly over 100 frames in chunks of 1, 2, 3, 4
    and 7 (1 and 4 captured by warm_up, the others mid-stream), for two consecutive streams."""
    if size == "tiny":
        decoder = load_codec(tiny_folder, device="cuda", dtype=dtype)
    else:
        decoder = CodecDecoder(full_config).eval()
        randomize_decoder(decoder, torch.Generator().manual_seed(0))
        decoder = decoder.to(device="cuda", dtype=dtype)
    decoder.warm_up([1, 4])
    assert decoder.captured_chunks == [1, 4]
    sizes = [1, 4, 4, 3, 7, 1, 2]
    utterances = [codes, codes.flip(0)]
    eager = [stream_in_chunks(decoder, u, sizes, eager=True) for u in utterances]
    assert decoder.captured_chunks == [1, 4]
    graph = [stream_in_chunks(decoder, u, sizes) for u in utterances]
    assert decoder.captured_chunks == [1, 2, 3, 4, 7]
    for e, g in zip(eager, graph):
        assert g.device.type == "cuda" and torch.isfinite(g).all() and g.std() > 0.01
        diff = (g - e).abs().max().item()
        assert diff < GRAPH_ATOL[dtype], f"{size} {dtype}: max |graph - eager| = {diff:.3g}"


@pytest.mark.gpu
@cuda
def test_cuda_bf16_codec_keeps_dense_conv_weights_channels_last_and_decodes_as_on_the_cpu(tiny_folder, decoder, codes,
                                                                                          full_audio):
    """On CUDA in bf16 every dense conv weight with a kernel wider than 1 is stored with its channel dimension 1
    innermost (cuDNN's layout: no conversion per call), with the same values; the audio is the CPU float32
    decoder's up to bf16 rounding."""
    gpu = load_codec(tiny_folder, device="cuda", dtype=torch.bfloat16)
    convs = {name: m for name, m in gpu.named_modules()
             if isinstance(m, (torch.nn.Conv1d, torch.nn.ConvTranspose1d)) and m.groups == 1 and m.kernel_size[0] > 1}
    assert convs and all(m.weight.stride(1) == 1 for m in convs.values())
    cpu = dict(decoder.named_modules())
    for name, m in convs.items():
        assert torch.equal(m.weight.cpu(), cpu[name].weight.to(torch.bfloat16))
    audio = gpu.decode(codes.cuda()).float().cpu()
    error = (audio - full_audio).pow(2).mean().sqrt() / full_audio.pow(2).mean().sqrt()
    assert error < 0.05, f"relative RMS error against the CPU float32 decoder: {error:.3g}"


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_cuda_interleaved_streams_replay_the_graphs_and_equal_their_solo_runs(tiny_folder, codes, dtype):
    """On CUDA three streams interleaved call by call (one ending mid-way, in chunks of 1 and 4) all replay the
    graphs, each swapping its own state in, and each gives exactly the audio of its solo stream."""
    decoder = load_codec(tiny_folder, device="cuda", dtype=dtype)
    utterances = [codes[:30].cuda(), codes.flip(0)[:30].cuda(), codes[10:22].cuda()]
    solo = [stream_in_chunks(decoder, u, [1, 4]) for u in utterances]
    streams = [decoder.stream() for _ in utterances]
    assert all(s._graphs is not None for s in streams)
    pieces, starts = [[], [], []], [0, 0, 0]
    for size in itertools.cycle([1, 4]):
        live = [i for i, u in enumerate(utterances) if starts[i] < len(u)]
        if not live:
            break
        for i in live:
            pieces[i].append(streams[i].decode(utterances[i][starts[i] : starts[i] + size]))
            starts[i] += size
    for got, want in zip(pieces, solo):
        assert torch.equal(torch.cat(got), want)


def test_writer_is_deterministic_per_seed(tmp_path):
    """The same seed writes the same weights; another seed writes others."""
    paths = [write_codec_folder(tmp_path / name, "tiny", seed) for name, seed in (("a", 3), ("b", 3), ("c", 4))]
    blobs = [(p / "model.safetensors").read_bytes() for p in paths]
    assert blobs[0] == blobs[1] != blobs[2]
    with safe_open(paths[0] / "model.safetensors", "pt") as f:
        names = list(f.keys())
    assert any(n.startswith("encoder.encoder_transformer.") for n in names)
    dropped = ("encoder.decoder.", "encoder.upsample.", "encoder.decoder_transformer.")  # None in the official
    assert not any(n.startswith(dropped) for n in names)


def test_writer_leaves_nothing_on_error(tmp_path, monkeypatch):
    """A failure while writing leaves neither the folder nor a partial one behind."""

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(codec_files, "save_file", fail)
    with pytest.raises(OSError, match="disk full"):
        write_codec_folder(tmp_path / "speech_tokenizer", "tiny", 0)
    assert list(tmp_path.iterdir()) == []


# ---- broken folders ----


@pytest.fixture
def broken(tiny_folder, tmp_path):
    """A private copy of the tiny folder to break."""
    return shutil.copytree(tiny_folder, tmp_path / "speech_tokenizer")


def rewrite_tensors(folder, change):
    """Rewrite model.safetensors with `change(tensors)` applied."""
    path = folder / "model.safetensors"
    with safe_open(path, "pt") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    change(tensors)
    save_file(tensors, str(path))


def test_missing_folder_is_named(tmp_path):
    """A folder that does not exist raises ModelFilesError naming it."""
    with pytest.raises(ModelFilesError, match=r"nowhere: codec folder not found"):
        load_codec(tmp_path / "nowhere")


def test_missing_or_invalid_config_is_named(broken):
    """A missing config.json, or one that is not JSON, raises ModelFilesError naming the file."""
    (broken / "config.json").write_text("{not json")
    with pytest.raises(ModelFilesError, match=r"config\.json: not valid JSON"):
        load_codec(broken)
    (broken / "config.json").unlink()
    with pytest.raises(ModelFilesError, match=r"config\.json: file is missing"):
        load_codec(broken)


@pytest.mark.parametrize(
    "key", ["decoder_config.sliding_window", "decoder_config.codebook_dim", "decode_upsample_rate"]
)
def test_missing_config_key_is_named(broken, key):
    """A config.json without a key the decoder needs raises ModelFilesError naming the file and the key."""
    config = json.loads((broken / "config.json").read_text())
    *sections, leaf = key.split(".")
    section = config
    for name in sections:
        section = section[name]
    del section[leaf]
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelFilesError, match=rf"config\.json: missing key {key}$"):
        load_codec(broken)


def test_contradictory_config_is_named(broken):
    """A decode_upsample_rate that the upsampling stages do not multiply to is reported with both values."""
    config = json.loads((broken / "config.json").read_text())
    config["decode_upsample_rate"] = 960
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelFilesError, match=r"config\.json: decode_upsample_rate is 960.*multiply to 1920"):
        load_codec(broken)


def test_missing_or_truncated_weights_are_named(broken):
    """A truncated model.safetensors, or none, raises ModelFilesError naming the file."""
    path = broken / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFilesError, match=r"model\.safetensors: cannot read the weights, .*truncated"):
        load_codec(broken)
    path.unlink()
    with pytest.raises(ModelFilesError, match=r"model\.safetensors: file is missing"):
        load_codec(broken)


def test_missing_tensor_is_named(broken):
    """A decoder tensor absent from model.safetensors raises ModelFilesError naming file and tensor."""
    rewrite_tensors(broken, lambda t: t.pop("decoder.pre_transformer.layers.1.mlp.up_proj.weight"))
    name = r"decoder\.pre_transformer\.layers\.1\.mlp\.up_proj\.weight"
    with pytest.raises(ModelFilesError, match=rf"model\.safetensors: missing tensor {name}$"):
        load_codec(broken)


def test_wrong_shape_tensor_is_named(broken):
    """A tensor whose shape config.json does not describe raises ModelFilesError with both shapes."""
    rewrite_tensors(broken, lambda t: t.update({"decoder.pre_conv.conv.weight": torch.zeros(32, 32, 4)}))
    message = r"model\.safetensors: decoder\.pre_conv\.conv\.weight is \(32, 32, 4\), config\.json says \(32, 32, 3\)"
    with pytest.raises(ModelFilesError, match=message):
        load_codec(broken)


def test_unexpected_tensor_is_named(broken):
    """A decoder tensor config.json does not describe (one layer too many) raises ModelFilesError naming it."""
    name = "decoder.pre_transformer.layers.9.input_layernorm.weight"
    rewrite_tensors(broken, lambda t: t.update({name: torch.ones(32)}))
    with pytest.raises(ModelFilesError, match=rf"unexpected tensor {name.replace('.', '[.]')};"):
        load_codec(broken)


# ---- the published model's size ----


def test_full_size_config_builds_and_streams_a_first_frame(tmp_path):
    """The published sizes (1920 samples a frame, window 72, head_dim 64) build, and one frame decodes alone."""
    (tmp_path / "config.json").write_text(json.dumps(codec_config("full")))
    config = CodecConfig.from_file(tmp_path / "config.json")
    sizes = (config.frame_samples, config.sample_rate_hz, config.sliding_window, config.head_dim)
    assert sizes == (1920, 24000, 72, 64)
    decoder = CodecDecoder(config).eval()
    randomize_decoder(decoder, torch.Generator().manual_seed(0))
    # 271 decoder tensors, as the published speech_tokenizer/model.safetensors holds.
    assert len(decoder.state_dict()) == 271
    pcm = decoder.stream().decode(torch.randint(0, config.codebook_size, (1, config.num_quantizers)))
    assert pcm.shape == (1920,) and torch.isfinite(pcm).all() and pcm.std() > 0


@pytest.mark.slow
@pytest.mark.oracle
def test_full_size_folder_loads_in_parley_and_official(official, tmp_path):
    """A full-size folder (~680 MB) loads in both, and a few frames decode to the same waveform."""
    folder = write_codec_folder(tmp_path / "speech_tokenizer", "full", seed=0)
    decoder = load_codec(folder)
    model, info = official.Qwen3TTSTokenizerV2Model.from_pretrained(str(folder), output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    codes = torch.randint(0, 2048, (6, 16), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        expected = model.decoder(codes.T[None])[0, 0]
    assert (decoder.decode(codes) - expected).abs().max() < OFFICIAL_ATOL
    assert (stream_in_chunks(decoder, codes, [1, 2]) - expected).abs().max() < OFFICIAL_ATOL
