"""load_tts on broken checkpoint folders: each fault is a ModelFilesError naming the file and the key or tensor."""

import json
import re
import shutil

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from engine.errors import InputTextError, ModelFilesError, ModelMissingError
from engine.tts import SamplingOptions, load_tts
from engine.tts.codec import CodecConfig, CodecDecoder
from engine.tts.testing import write_checkpoint
from engine.tts.testing.codec_files import randomize_decoder


@pytest.fixture
def broken(tiny_checkpoint, tmp_path):
    """A private copy of the session's tiny checkpoint, to break (the shared folder is never edited)."""
    return shutil.copytree(tiny_checkpoint, tmp_path / "tiny")


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """The tiny checkpoint of seed 0 written as 3 shards, capped like short_checkpoint (max_new_tokens=7)."""
    folder = write_checkpoint(tmp_path_factory.mktemp("sharded") / "tiny", "tiny", seed=0, shards=3)
    edit_json(folder / "generation_config.json", lambda g: g.update(max_new_tokens=7))
    return folder


def edit_json(path, change):
    """Rewrite a JSON file with `change(data)` applied in place."""
    data = json.loads(path.read_text(encoding="utf-8"))
    change(data)
    path.write_text(json.dumps(data), encoding="utf-8")


def rewrite_tensors(path, change):
    """Rewrite a safetensors file with `change(tensors)` applied in place."""
    with safe_open(str(path), "pt") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    change(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def file_error(folder, name):
    """The start of an error message about `name` inside `folder`, as a regex."""
    return re.escape(str(folder / name)) + ": "


def greedy_codes(tts):
    """All codes of one short greedy utterance, (frames, 16)."""
    chunks = tts.stream("Same weights, same speech.", "ryan", seed=0, sampling=SamplingOptions.greedy())
    return np.concatenate([c.codes for c in chunks])


# ---- the folder and config.json ----


def test_missing_folder_is_named(tmp_path):
    """A model folder that does not exist raises ModelMissingError (the app says "missing") naming it."""
    with pytest.raises(ModelMissingError, match=re.escape(str(tmp_path / "nowhere")) + ": no such model folder"):
        load_tts(tmp_path / "nowhere")


def test_missing_config_is_named(broken):
    """A folder without config.json raises ModelFilesError naming the file."""
    (broken / "config.json").unlink()
    with pytest.raises(ModelFilesError, match=file_error(broken, "config.json") + "file is missing"):
        load_tts(broken)


def test_config_that_is_not_json_is_named(broken):
    """A config.json that does not parse raises ModelFilesError naming the file."""
    (broken / "config.json").write_text('{"talker_config": ', encoding="utf-8")
    with pytest.raises(ModelFilesError, match=file_error(broken, "config.json") + "not valid JSON"):
        load_tts(broken)


@pytest.mark.parametrize("key", ["talker_config.num_hidden_layers", "talker_config.code_predictor_config.vocab_size",
                                 "tts_pad_token_id"])
def test_missing_config_key_is_named_with_its_path(broken, key):
    """A config.json without a key that shapes the model raises ModelFilesError naming the file and the key path."""
    *sections, leaf = key.split(".")

    def drop(config):
        for name in sections:
            config = config[name]
        del config[leaf]

    edit_json(broken / "config.json", drop)
    with pytest.raises(ModelFilesError, match=file_error(broken, "config.json") + f"missing key '{re.escape(key)}'\n"):
        load_tts(broken)


def test_config_dims_that_do_not_match_the_weights_are_named(broken):
    """A hidden_size the weights were not made with raises ModelFilesError naming a tensor and both shapes."""
    edit_json(broken / "config.json", lambda c: c["talker_config"].update(hidden_size=128))
    shapes = r"talker\.[\w.]+ is \([\d, ]*64[\d, ]*\), config\.json says \([\d, ]*128[\d, ]*\)\n"
    message = file_error(broken, "model.safetensors") + shapes
    with pytest.raises(ModelFilesError, match=message):
        load_tts(broken)


# ---- model.safetensors ----


def test_truncated_weights_are_named(broken):
    """A model.safetensors cut in half raises ModelFilesError naming the file and saying it is truncated."""
    path = broken / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    message = file_error(broken, "model.safetensors") + "cannot read the weights, .*truncated"
    with pytest.raises(ModelFilesError, match=message):
        load_tts(broken)


def test_missing_weights_are_named(broken):
    """A folder without model.safetensors (or a shard index) raises ModelFilesError naming the file."""
    (broken / "model.safetensors").unlink()
    with pytest.raises(ModelFilesError, match=file_error(broken, "model.safetensors") + "file is missing"):
        load_tts(broken)


def test_missing_tensor_is_named(broken):
    """A talker tensor absent from model.safetensors raises ModelFilesError naming the file and the tensor."""
    name = "talker.model.layers.1.mlp.up_proj.weight"
    rewrite_tensors(broken / "model.safetensors", lambda t: t.pop(name))
    message = file_error(broken, "model.safetensors") + f"missing tensor {re.escape(name)}\n"
    with pytest.raises(ModelFilesError, match=message):
        load_tts(broken)


def test_wrong_shape_tensor_is_named_with_both_shapes(broken):
    """A tensor of a shape config.json does not describe raises ModelFilesError with its shape and config.json's."""
    rewrite_tensors(broken / "model.safetensors",
                    lambda t: t.update({"talker.codec_head.weight": torch.zeros(2048, 64, dtype=torch.bfloat16)}))
    shapes = r"talker\.codec_head\.weight is \(2048, 64\), config\.json says \(3072, 64\)\n"
    message = file_error(broken, "model.safetensors") + shapes
    with pytest.raises(ModelFilesError, match=message):
        load_tts(broken)


def test_unexpected_tensor_is_named(broken):
    """A tensor config.json does not describe (a fourth talker layer of three) raises ModelFilesError naming it."""
    name = "talker.model.layers.3.input_layernorm.weight"
    rewrite_tensors(broken / "model.safetensors", lambda t: t.update({name: torch.ones(64, dtype=torch.bfloat16)}))
    message = file_error(broken, "model.safetensors") + f"unexpected tensor {re.escape(name)};"
    with pytest.raises(ModelFilesError, match=message):
        load_tts(broken)


# ---- sharded checkpoints ----


def test_sharded_checkpoint_gives_the_same_greedy_codes_as_the_single_file(sharded, short_tts):
    """Three shards plus an index load into the same model: greedy codes equal the single-file checkpoint's."""
    assert len(list(sharded.glob("model-*-of-00003.safetensors"))) == 3 and not (sharded / "model.safetensors").exists()
    codes = greedy_codes(load_tts(sharded, precision="float32"))  # as short_tts
    assert codes.shape == (6, 16)
    np.testing.assert_array_equal(codes, greedy_codes(short_tts))


def test_shard_missing_from_the_folder_is_named(sharded, tmp_path):
    """A shard the index names but the folder lacks raises ModelFilesError naming the shard and the index."""
    folder = shutil.copytree(sharded, tmp_path / "sharded")
    (folder / "model-00002-of-00003.safetensors").unlink()
    message = (file_error(folder, "model-00002-of-00003.safetensors")
               + r"shard named in model\.safetensors\.index\.json is missing")
    with pytest.raises(ModelFilesError, match=message):
        load_tts(folder)


# ---- tokenizers ----


def test_missing_speech_tokenizer_folder_is_named(broken):
    """A checkpoint without speech_tokenizer/ raises ModelFilesError naming that folder."""
    shutil.rmtree(broken / "speech_tokenizer")
    with pytest.raises(ModelFilesError, match=re.escape(str(broken / "speech_tokenizer")) + ": codec folder not found"):
        load_tts(broken)


@pytest.mark.parametrize("missing", [("vocab.json", "merges.txt"), ("vocab.json",), ("merges.txt",)])
def test_missing_text_tokenizer_files_are_named(broken, missing):
    """Without vocab.json or merges.txt (and no tokenizer.json) a ModelFilesError names the missing files."""
    for name in missing:
        (broken / name).unlink()
    with pytest.raises(ModelFilesError, match=re.escape(str(broken)) + ": no text tokenizer") as e:
        load_tts(broken)
    assert all(name in str(e.value) for name in missing)


def test_speech_tokenizer_of_another_codebook_size_is_refused(broken):
    """A self-consistent codec whose codebook_size is not the talker's raises ModelFilesError giving both sizes."""
    codec = broken / "speech_tokenizer"
    edit_json(codec / "config.json", lambda c: c["decoder_config"].update(codebook_size=1024))
    decoder = CodecDecoder(CodecConfig.from_file(codec / "config.json"))
    randomize_decoder(decoder, torch.Generator().manual_seed(0))
    tensors = {f"decoder.{k}": v.contiguous() for k, v in decoder.state_dict().items()}
    save_file(tensors, str(codec / "model.safetensors"))  # decoder only: load_codec ignores encoder.*
    message = (file_error(codec, "config.json") + r"codebook_size 1024 does not match config\.json "
               r"\(code predictor vocab_size 2048, talker vocab_size 3072\); "
               r"the speech tokenizer belongs to another model")
    with pytest.raises(ModelFilesError, match=message):
        load_tts(broken)


# ---- Base (voice-cloning) checkpoints ----


@pytest.fixture
def broken_base(base_checkpoint, tmp_path):
    """A private copy of the session's tiny Base checkpoint, to break."""
    return shutil.copytree(base_checkpoint, tmp_path / "base")


def test_base_model_loads_its_encoders_and_asks_for_a_cloned_voice(base_checkpoint):
    """A Base checkpoint loads with its speaker encoder and codec encoder; speaking without a voice says what to do."""
    tts = load_tts(base_checkpoint)
    assert tts.config.model_type == "base" and tts.speakers == [] and tts.default_speaker is None
    assert tts.speaker_encoder is not None and tts.speech_encoder is not None
    with pytest.raises(InputTextError, match=r"a Base model speaks in a cloned voice: clone one from a recording "
                                             r"with clone_voice\(\), or load a saved one with load_voice\(\)"):
        tts.stream("Hello there.")


def test_base_config_without_its_speaker_encoder_section_is_refused(broken_base):
    """config.json of a Base model must have speaker_encoder_config (the published files do)."""
    edit_json(broken_base / "config.json", lambda c: c.pop("speaker_encoder_config"))
    with pytest.raises(ModelFilesError, match=file_error(broken_base, "config.json")
                       + "missing key 'speaker_encoder_config'"):
        load_tts(broken_base)


def test_speaker_embedding_narrower_than_the_talker_is_refused(broken_base):
    """enc_dim must be the talker's width: the embedding stands in the talker's input."""
    edit_json(broken_base / "config.json", lambda c: c["speaker_encoder_config"].update(enc_dim=32))
    with pytest.raises(ModelFilesError, match=r"speaker_encoder_config\.enc_dim is 32, but the talker's hidden_size "
                                              r"is 64; they must be equal"):
        load_tts(broken_base)


def test_base_weights_without_the_speaker_encoder_are_refused(broken_base):
    """A Base model.safetensors lacking speaker_encoder.* names the first missing tensor."""
    rewrite_tensors(broken_base / "model.safetensors",
                    lambda t: [t.pop(k) for k in [k for k in t if k.startswith("speaker_encoder.")]])
    with pytest.raises(ModelFilesError, match=file_error(broken_base, "model.safetensors")
                       + r"missing tensor speaker_encoder\.blocks\.0\.conv\.weight \(and \d+ more\)"):
        load_tts(broken_base)


def test_speech_tokenizer_without_its_encoder_is_refused_for_a_base_model(broken_base):
    """Cloning encodes the recording: a Base model's speech_tokenizer/ must hold encoder.* (CustomVoice's need not)."""
    codec = broken_base / "speech_tokenizer"
    rewrite_tensors(codec / "model.safetensors",
                    lambda t: [t.pop(k) for k in [k for k in t if k.startswith("encoder.")]])
    with pytest.raises(ModelFilesError, match=file_error(codec, "model.safetensors") + r"missing tensor encoder\."):
        load_tts(broken_base)


def test_damaged_speaker_encoder_tensor_is_refused(broken_base):
    """A speaker-encoder tensor of the wrong shape names the tensor and both shapes."""
    rewrite_tensors(broken_base / "model.safetensors",
                    lambda t: t.update({"speaker_encoder.fc.bias": torch.zeros(8, dtype=torch.bfloat16)}))
    with pytest.raises(ModelFilesError, match=r"speaker_encoder\.fc\.bias is \(8,\), config\.json says \(64,\)"):
        load_tts(broken_base)
