"""Parley's engine against the official qwen-tts package, built from the same folder and weights.

Tolerances: float32 on both sides. Talker logits agree to 1e-4 absolute (seen: ~2e-6, SDPA vs the
official eager attention); greedy codes must be identical; waveforms from identical codes agree to
1e-4 absolute (seen: ~1e-6).
"""

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from engine.tts import SamplingOptions, load_tts
from tests.oracle import import_qwen_tts
from tests.conftest import copy_checkpoint, voice_design_copy

pytestmark = pytest.mark.oracle

FRAMES = 12  # official max_new_tokens=13 -> 12 frames with codes

CASES = [
    ("Hello there, how are you today?", "ryan", "english", True),
    ("Streaming text, fed one token per frame.", "serena", "auto", False),
    ("你好，世界。", "vivian", "chinese", True),
    ("A dialect speaker on auto.", "eric", "auto", False),
    ("Guten Tag!", "dylan", "german", True),
]


def _official(folder):
    qwen_tts = import_qwen_tts()
    return qwen_tts.Qwen3TTSModel.from_pretrained(str(folder), dtype=torch.float32)


def _official_codes_and_wav(model, text, speaker, language, whole_text, instruct=None):
    """Greedy codes (frames, 16) and waveform from the official model, as generate_custom_voice builds them."""
    input_ids = model._tokenize_texts([model._build_assistant_text(text)])
    instruct_ids = [model._tokenize_texts([model._build_instruct_text(instruct)])[0]] if instruct else [None]
    kwargs = model._merge_generate_kwargs(do_sample=False, subtalker_dosample=False)
    with torch.no_grad():
        codes, _ = model.model.generate(input_ids=input_ids, instruct_ids=instruct_ids, languages=[language],
                                        speakers=[speaker], non_streaming_mode=whole_text, **kwargs)
        wavs, rate = model.model.speech_tokenizer.decode([{"audio_codes": codes[0]}])
    assert rate == 24000
    return codes[0].numpy(), np.asarray(wavs[0], dtype=np.float32)


@pytest.fixture(scope="module", params=["tiny", "tiny17"])
def capped(request, tiny_checkpoint, tiny17_checkpoint, tmp_path_factory):
    """Both model shapes, capped at FRAMES frames so greedy runs without EOS stay short."""
    source = {"tiny": tiny_checkpoint, "tiny17": tiny17_checkpoint}[request.param]
    return copy_checkpoint(source, tmp_path_factory.mktemp("parity") / request.param, max_new_tokens=FRAMES + 1)


@pytest.fixture(scope="module")
def both(capped):
    return load_tts(capped, precision="float32"), _official(capped)


def test_official_package_loads_parleys_generated_folder(both):
    """qwen-tts's own from_pretrained reads the generated folder: speakers, languages and type as written."""
    ours, official = both
    assert official.get_supported_speakers() == ours.speakers
    assert official.get_supported_languages() == ours.languages
    assert official.model.tts_model_type == "custom_voice"


def test_prompt_token_ids_equal_the_official_processors(both):
    """Role, text and tail token ids equal the official processor's tokenization of the whole prompt."""
    ours, official = both
    for text, *_ in CASES:
        expected = official._tokenize_texts([official._build_assistant_text(text)])[0][0].tolist()
        got = ours.prompts.role_ids + ours.prompts.text_ids(text) + ours.prompts.tail_ids
        assert got == expected, text


def test_talker_logits_equal_the_official_talker_on_the_same_inputs(both):
    """Prefill and 8 decode steps: codec-head logits within 1e-4 of the official talker's."""
    ours, official = both
    torch.manual_seed(0)
    hidden = ours.config.talker.decoder.hidden_size
    x = torch.randn(9, hidden)
    steps = torch.randn(8, hidden)
    talker = official.model.talker
    with torch.no_grad():
        out = talker(inputs_embeds=x[None], attention_mask=torch.ones(1, 9, dtype=torch.long), use_cache=True)
        expected = [out.logits[0, -1]]
        cache = out.past_key_values
        for i, s in enumerate(steps):
            mask = torch.ones(1, 10 + i, dtype=torch.long)
            out = talker.model(inputs_embeds=s[None, None], attention_mask=mask, past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            expected.append(talker.codec_head(out.last_hidden_state)[0, -1])
    state = ours.model.begin(x, 9)
    got = [state.logits]
    with torch.inference_mode():
        for s in steps:
            state.hidden = ours.model.talker.model(s[None], state.cache)[0]
            got.append(ours.model.talker.codec_head(state.hidden))
    for i, (g, e) in enumerate(zip(got, expected)):
        torch.testing.assert_close(g, e, atol=1e-4, rtol=0, msg=f"step {i}")


@pytest.mark.parametrize("text,speaker,language,whole_text", CASES)
def test_greedy_codes_and_waveform_equal_the_official_generate(both, text, speaker, language, whole_text):
    """Greedy decoding gives the official codes exactly, and the same waveform within 1e-4."""
    ours, official = both
    codes, wav = _official_codes_and_wav(official, text, speaker, language, whole_text)
    chunks = list(ours.stream(text, speaker, language, sampling=SamplingOptions.greedy(), whole_text=whole_text))
    got_codes = np.concatenate([c.codes for c in chunks])
    assert codes.shape == (FRAMES, 16)
    np.testing.assert_array_equal(got_codes, codes)
    np.testing.assert_allclose(np.concatenate([c.pcm for c in chunks]), wav, atol=1e-4, rtol=0)


def test_voice_design_prompt_equals_the_official(capped, tmp_path):
    """A VoiceDesign model (no speaker, a voice description) gives the official greedy codes."""
    folder = voice_design_copy(capped, tmp_path / "design")
    ours, official = load_tts(folder, precision="float32"), _official(folder)
    assert ours.speakers == [] and ours.default_speaker is None  # the ids its config keeps are not voices
    description = "A calm, low voice."
    codes, _ = _official_codes_and_wav(official, "Designed voice.", None, "english", False, instruct=description)
    got = np.concatenate([c.codes for c in ours.stream("Designed voice.", None, "english", instruct=description,
                                                        sampling=SamplingOptions.greedy(), whole_text=False)])
    np.testing.assert_array_equal(got, codes)


def test_parley_loads_a_folder_saved_by_the_official_classes(tiny_checkpoint, tmp_path):
    """A checkpoint written by the official save_pretrained (model and codec) loads and decodes identically."""
    qwen_tts = import_qwen_tts()
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Config
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model

    folder = tmp_path / "official"
    config = Qwen3TTSConfig(**json.loads((tiny_checkpoint / "config.json").read_text()))
    torch.manual_seed(3)
    Qwen3TTSForConditionalGeneration(config).save_pretrained(folder)
    # the official save writes speaker_encoder_config.model_type, which its own config class then
    # refuses on load (Qwen3TTSSpeakerEncoderConfig takes no **kwargs); published folders lack the key
    saved = json.loads((folder / "config.json").read_text())
    saved["speaker_encoder_config"].pop("model_type", None)
    (folder / "config.json").write_text(json.dumps(saved))
    codec_config = Qwen3TTSTokenizerV2Config(
        **json.loads((tiny_checkpoint / "speech_tokenizer" / "config.json").read_text()))
    codec = Qwen3TTSTokenizerV2Model(codec_config)
    # the official random init leaves the codebooks at zero (silence), so give it real random weights
    codec.load_state_dict(load_file(tiny_checkpoint / "speech_tokenizer" / "model.safetensors"))
    codec.save_pretrained(folder / "speech_tokenizer")
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(tiny_checkpoint / name, folder / name)
    shutil.copy(tiny_checkpoint / "speech_tokenizer" / "preprocessor_config.json", folder / "speech_tokenizer")
    copy_checkpoint(folder, tmp_path / "capped", max_new_tokens=FRAMES + 1)
    ours = load_tts(tmp_path / "capped", precision="float32")
    official = qwen_tts.Qwen3TTSModel.from_pretrained(str(tmp_path / "capped"), dtype=torch.float32)
    codes, wav = _official_codes_and_wav(official, "Saved by the official code.", "aiden", "english", True)
    assert np.abs(wav).max() > 0.01
    chunks = list(ours.stream("Saved by the official code.", "aiden", "english", sampling=SamplingOptions.greedy()))
    np.testing.assert_array_equal(np.concatenate([c.codes for c in chunks]), codes)
    np.testing.assert_allclose(np.concatenate([c.pcm for c in chunks]), wav, atol=1e-4, rtol=0)
