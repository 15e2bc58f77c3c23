"""The end-of-turn model (Smart Turn v3.2 from the installed pipecat-ai package) on real espeak-ng speech: its
features are Whisper's, it tells a finished question from a trailing "so, um", and a missing or broken model says
how to get it; in the Endpointer it ends a finished turn after a short pause and waits through a thinking pause."""

import numpy as np
import pytest

from engine.errors import ModelFilesError, ModelMissingError
from engine.stt import BLOCK_SAMPLES, SAMPLE_RATE_HZ, Endpointer, SileroVad, Turn, VadOptions, split_blocks
from engine.stt import turn as turn_module
from engine.stt.turn import Meaning, TurnModel, Words, judge_words, trails_off
from tests.stt.conftest import silence

FINISHED = "What time does the store close?"
THINKING = "Well, so, um"


@pytest.fixture(scope="module")
def model():
    return TurnModel()


def test_the_features_are_whispers_own(speak):
    """The model's input equals transformers' WhisperFeatureExtractor (8 s, normalised), what it was trained on."""
    from faster_whisper.feature_extractor import FeatureExtractor
    from transformers import WhisperFeatureExtractor

    audio = np.pad(speak(FINISHED), (SAMPLE_RATE_HZ * 8 - len(speak(FINISHED)), 0))
    expected = WhisperFeatureExtractor(chunk_length=8)(audio, sampling_rate=SAMPLE_RATE_HZ, return_tensors="np",
                                                       do_normalize=True).input_features[0]
    normalised = ((audio - audio.mean()) / np.sqrt(audio.var() + 1e-7)).astype(np.float32)
    ours = FeatureExtractor(chunk_length=8)(normalised, padding=0)[:, :800]
    np.testing.assert_allclose(ours, expected, atol=1e-4)  # float32 FFTs in another order: ~2e-5 apart


def test_a_finished_question_is_complete_and_a_trailing_filler_is_not(model, voiced):
    """After 200 ms of pause: the question is a finished turn, "well, so, um" is not."""
    pause = silence(0.2)
    finished = model.probability(np.concatenate([voiced(FINISHED), pause]))
    thinking = model.probability(np.concatenate([voiced(THINKING), pause]))
    assert finished > 0.5 > thinking, (finished, thinking)


def test_a_missing_or_broken_model_says_how_to_get_it(tmp_path, monkeypatch):
    """No pipecat-ai package, or a file onnxruntime cannot read: ModelFilesError with the pip command."""
    broken = tmp_path / "smart-turn.onnx"
    broken.write_bytes(b"not a model")
    with pytest.raises(ModelFilesError, match="cannot be loaded.*pip install --no-deps pipecat-ai==1.14.0") as damaged:
        TurnModel(broken)
    assert not isinstance(damaged.value, ModelMissingError)  # there, but unreadable: not "missing"
    monkeypatch.setattr(turn_module, "package_folder", lambda module: None)  # as where it is not installed
    with pytest.raises(ModelMissingError, match="is not installed; install it with: pip install --no-deps pipecat"):
        TurnModel()


@pytest.mark.parametrize("cores, threads", [(None, 1), (1, 1), (2, 1), (4, 1), (8, 2), (16, 4), (128, 4)])
def test_the_model_takes_a_quarter_of_the_cores_up_to_four(monkeypatch, cores, threads):
    monkeypatch.setattr(turn_module.os, "cpu_count", lambda: cores)
    assert turn_module.default_threads() == threads
    assert TurnModel()._session.get_session_options().intra_op_num_threads == threads
    assert TurnModel(threads=3)._session.get_session_options().intra_op_num_threads == 3


def ends(endpointer, audio, speech_end: int):
    """(reason, ms after the end of speech) of the one turn feeding `audio` gives."""
    turns = []
    for i, block in enumerate(split_blocks(audio)):
        turns += [(e.reason, ((i + 1) * BLOCK_SAMPLES - speech_end) * 1000 / SAMPLE_RATE_HZ)
                  for e in endpointer.feed(block) if isinstance(e, Turn)]
    assert len(turns) == 1, turns
    return turns[0]


def test_a_finished_turn_ends_after_a_short_pause_and_a_thinking_one_waits(model, voiced):
    """With the model: the question ends ("complete") within turn_check_ms plus a few blocks of its last word,
    "well, so, um" only when the longest pause has run out; without it, both end at the fixed window."""
    options = VadOptions(silence_ms=2000, turn_check_ms=200)
    vad = SileroVad()
    for text, reason, low, high in ((FINISHED, "complete", 200, 600), (THINKING, "silence", 2000, 2300)):
        speech = voiced(text)
        audio = np.concatenate([silence(0.5), speech, silence(3.0)])
        got, waited_ms = ends(Endpointer(options, vad=vad, turn_model=model), audio, len(silence(0.5)) + len(speech))
        assert got == reason and low <= waited_ms <= high, (text, got, waited_ms)


def test_speech_after_a_thinking_pause_goes_on_in_the_same_turn(model, voiced):
    """ "Well, so, um", a second of thought, then the question: one turn holding both, ended after the question."""
    first, second = voiced(THINKING), voiced(FINISHED)
    audio = np.concatenate([silence(0.5), first, silence(1.0), second, silence(2.5)])
    reason, _ = ends(Endpointer(VadOptions(silence_ms=2000), turn_model=model), audio,
                     len(audio) - len(silence(2.5)))
    assert reason == "complete"


@pytest.mark.parametrize("text, language, hanging", [
    ("I want to book a table for.", "en", True),  # Whisper's full stop after a voice that stopped
    ("The best time to call me is", "en", True),
    ("My brother just bought a...", "en", True),
    ("So, um", "en", True),
    ("Can you tell me the", "en", True),
    ("I was going to-", "en", True),
    ("What is a good book to read?", "en", False),
    ("Turn the lights on.", "en", False),
    ("Thank you.", "en", False),
    ("I think so.", "en", False),
    ("Book a table for four.", "en", False),
    ("", "en", False),
    ("Je voudrais réserver une table pour", "fr", False),  # another language's words are not judged
    ("Je voudrais réserver une table pour...", "fr", True),  # but an ellipsis is one in any
])
def test_words_left_hanging_are_told_from_a_finished_sentence(text, language, hanging):
    assert trails_off(text, language) is hanging


@pytest.mark.parametrize("text, language, words", [
    ("What is a good book to read?", "en", Words.SENTENCE),
    ("Turn the lights on.", "en", Words.SENTENCE),
    ("Wie spät ist es?", "de", Words.SENTENCE),
    ("今何時ですか？", "ja", Words.SENTENCE),
    ("I want to book a table for.", "en", Words.TRAILING),
    ("So, um...", "en", Words.TRAILING),
    ("Could you remind me to?", "en", Words.OPEN),  # Whisper's question mark on a voice left hanging
    ("Dark green", "en", Words.OPEN),  # no mark: the voice decides
    ("", "en", Words.OPEN),
])
def test_the_words_say_whether_a_sentence_ended(text, language, words):
    assert judge_words(text, language) is words


class Asking:
    """The end-of-turn model and a judge of the words that keep the order they are asked in (`asked`: "model", the
    key of the words, or ("read", key)); a pause's words are judged `judged` from the tenth time they are asked for
    (~300 ms to transcribe them), or the `judged_at`th; where `reads` (a Meaning) is not None, they read so (the
    Endpointer's `read`)."""

    def __init__(self, model, judged, judged_at=10, reads=None):
        self.model, self.judged, self.judged_at, self.reads, self.asked = model, judged, judged_at, reads, []

    def probability(self, audio_16k):
        self.asked.append("model")
        return self.model.probability(audio_16k)

    def words(self, key):
        self.asked.append(key)
        return None if self.keys.count(key) < self.judged_at else self.judged

    def read(self, key):
        self.asked.append(("read", key))
        return self.reads

    @property
    def keys(self):
        return [a for a in self.asked if a != "model" and a[0] != "read"]

    @property
    def read_keys(self):
        return [a[1] for a in self.asked if a[0] == "read"]


def ended(audio, speech_end: int, asking: Asking):
    """(reason, ms after the end of speech) of the one turn of `audio`, with the model and words of `asking`."""
    options = VadOptions(silence_ms=2000, turn_check_ms=200, sentence_ms=600, statement_ms=400)
    endpointer = Endpointer(options, turn_model=asking, words=asking.words,
                            read=None if asking.reads is None else asking.read)
    return ends(endpointer, audio, speech_end)


@pytest.mark.parametrize("text, judged, reason, low, high", [
    (FINISHED, Words.OPEN, "complete", 400, 800),
    (FINISHED, Words.SENTENCE, "complete", 400, 800),
    (FINISHED, Words.TRAILING, "silence", 2000, 2300),
    (THINKING, Words.SENTENCE, "complete", 600, 900),
    (THINKING, Words.OPEN, "silence", 2000, 2300),
    (THINKING, Words.TRAILING, "silence", 2000, 2300),
])
def test_the_words_of_a_pause_have_the_last_word(model, voiced, text, judged, reason, low, high):
    """The model calls the question finished after 200 ms: words that do not trail off end the turn when they come
    ("complete"), trailing ones wait for the longest pause. It hears "well, so, um" going on: words that end a
    sentence end the turn at sentence_ms of the pause (600 ms), though they came sooner; words with no sign either
    way, or trailing ones, leave it to the longest pause. The words are asked for at the check before the model is,
    so whoever transcribes them has the model's time to do it; the key asked about is the pause's (the turn's start
    sample, and where the pause would end it: "well, so, um" pauses at its commas too), and a pause's words are not
    asked for again once judged."""
    speech = voiced(text)
    audio = np.concatenate([silence(0.5), speech, silence(3.0)])
    asking = Asking(model, judged)
    got, waited_ms = ended(audio, len(silence(0.5)) + len(speech), asking)
    assert got == reason and low <= waited_ms <= high, (got, waited_ms)
    assert len({start for start, _ in asking.keys}) == 1 and asking.keys.count(asking.keys[-1]) == 10
    assert asking.asked[:3] == [asking.keys[0], "model", asking.keys[0]], asking.asked[:3]


def test_words_made_while_the_model_ran_end_the_turn_at_the_check(model, voiced):
    """Words transcribed while the model was asked (judged at their second ask, the one after the model's) end the
    finished question at the check's own block: no block later."""
    speech = voiced(FINISHED)
    audio = np.concatenate([silence(0.5), speech, silence(3.0)])
    at_check, _ = ended(audio, len(silence(0.5)) + len(speech), Asking(model, Words.SENTENCE, judged_at=1))
    assert at_check == "complete"
    later = ended(audio, len(silence(0.5)) + len(speech), Asking(model, Words.SENTENCE, judged_at=2))
    assert later == ended(audio, len(silence(0.5)) + len(speech), Asking(model, Words.SENTENCE, judged_at=1))


@pytest.mark.parametrize("text, judged, reads, reason, low, high", [
    (THINKING, Words.SENTENCE, Meaning.WHOLE, "complete", 200, 300),
    (THINKING, Words.SENTENCE, Meaning.STATEMENT, "complete", 400, 600),
    (THINKING, Words.SENTENCE, Meaning.PART, "complete", 600, 900),
    (THINKING, Words.OPEN, Meaning.WHOLE, "silence", 2000, 2300),
    (FINISHED, Words.SENTENCE, Meaning.PART, "complete", 200, 300),
    (FINISHED, Words.SENTENCE, Meaning.STATEMENT, "complete", 200, 300),
    (FINISHED, Words.SENTENCE, Meaning.WHOLE, "complete", 200, 300),
])
def test_what_the_words_mean_ends_the_turn_before_sentence_ms(model, voiced, text, judged, reads, reason, low, high):
    """The model hears "well, so, um" going on. Where its words end a sentence and read as a whole message, the turn
    ends at the check; as a finished statement, at statement_ms; as neither, at sentence_ms, as without the reader.
    The question it calls finished ends at the check whatever its words read. Words that end a sentence are read once a
    pause, and before the model is asked, which it then is only where they do not read as a whole message; words that
    end no sentence are not read."""
    speech = voiced(text)
    audio = np.concatenate([silence(0.5), speech, silence(3.0)])
    speech_end = len(silence(0.5)) + len(speech)
    asking = AtTheEnd(model, judged, judged_at=1, reads=reads, speech_end=speech_end)
    got, waited_ms = ended(audio, speech_end, asking)
    assert got == reason and low <= waited_ms <= high, (got, waited_ms)
    last_pause = [key for key in dict.fromkeys(asking.keys) if key[1] >= speech_end]
    assert asking.read_keys == (last_pause if judged is Words.SENTENCE else []), asking.asked
    at_last_pause = asking.asked[asking.asked.index(last_pause[0]):]
    assert ("model" in at_last_pause) == (judged is not Words.SENTENCE or reads is not Meaning.WHOLE), asking.asked


class AtTheEnd(Asking):
    """Asking, where the words of a pause inside the speech (the commas of "well, so, um") trail off, as Whisper
    writes them ("Well, so..."): only the last pause's are judged `judged`."""

    def __init__(self, model, judged, speech_end, **kwargs):
        super().__init__(model, judged, **kwargs)
        self.speech_end = speech_end

    def words(self, key):
        judged = super().words(key)
        return Words.TRAILING if judged is not None and key[1] < self.speech_end else judged
