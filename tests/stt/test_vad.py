"""Voice activity and end-of-turn on real espeak-ng speech, fed block by block as a microphone would."""

import numpy as np
import pytest

from engine.stt import BLOCK_SAMPLES, SAMPLE_RATE_HZ, Endpointer, SileroVad, SpeechStart, Turn, VadOptions, split_blocks
from tests.stt.conftest import silence

SENTENCE = "Please turn on the kitchen lights."
OTHER = "What is the weather like tomorrow?"
TOLERANCE = round(0.15 * SAMPLE_RATE_HZ)  # a few 32 ms blocks: onsets and offsets are soft


@pytest.fixture(scope="module")
def vad():
    return SileroVad()


def assert_brackets(start_sample, end_sample, first, last, options=VadOptions()):
    """The turn holds every voiced sample [first, last), with at most pre-roll + tail (+ slack) around it."""
    pre_roll = options.pre_roll_ms * SAMPLE_RATE_HZ // 1000
    tail = options.tail_ms * SAMPLE_RATE_HZ // 1000
    assert first - pre_roll - TOLERANCE <= start_sample <= first
    assert last <= end_sample <= last + tail + TOLERANCE


def run(endpointer, audio):
    """Feeds audio block by block; returns [(samples fed when it fired, event), ...]."""
    events = []
    for i, block in enumerate(split_blocks(audio)):
        events += [((i + 1) * BLOCK_SAMPLES, e) for e in endpointer.feed(block)]
    return events


def test_streamed_probabilities_equal_faster_whispers_batched_pass(speak, vad):
    """Block-by-block probabilities with carried state equal faster-whisper's own pass over the whole file."""
    from faster_whisper.vad import SileroVADModel

    from engine.stt.vad import silero_model_path

    audio = np.concatenate([silence(0.5), speak(SENTENCE), silence(0.5)])
    audio = audio[: len(audio) // BLOCK_SAMPLES * BLOCK_SAMPLES]
    vad.reset()
    streamed = np.array([vad.probability(b) for b in split_blocks(audio)])
    batched = SileroVADModel(str(silero_model_path()))(audio).reshape(-1)
    np.testing.assert_allclose(streamed, batched, atol=1e-5)
    assert streamed.max() > 0.9 and streamed[:10].max() < 0.1


def test_speech_start_and_end_bracket_the_spoken_part(voiced, vad):
    """With silence around a sentence, one SpeechStart and one Turn bracket the voiced samples."""
    options = VadOptions()
    speech = voiced(SENTENCE)
    lead = silence(1.0)
    audio = np.concatenate([lead, speech, silence(1.5)])
    first, last = len(lead), len(lead) + len(speech)
    events = run(Endpointer(options, vad=vad), audio)
    assert [type(e) for _, e in events] == [SpeechStart, Turn]
    (_, start), (_, turn) = events
    assert turn.start_sample == start.start_sample and turn.reason == "silence"
    assert_brackets(turn.start_sample, turn.end_sample, first, last, options)
    np.testing.assert_array_equal(turn.audio, audio[turn.start_sample : turn.end_sample])


@pytest.mark.parametrize("silence_ms", [400, 1200])
def test_end_of_turn_fires_only_after_the_configured_silence(voiced, vad, silence_ms):
    """The Turn comes silence_ms (give or take a block or two) after the voice stops, not before."""
    speech = voiced(SENTENCE)
    audio = np.concatenate([silence(0.5), speech, silence(2.0)])
    last = len(silence(0.5)) + len(speech)
    events = run(Endpointer(VadOptions(silence_ms=silence_ms), vad=vad), audio)
    fired = [at for at, e in events if isinstance(e, Turn)]
    assert len(fired) == 1
    waited_ms = (fired[0] - last) * 1000 / SAMPLE_RATE_HZ
    assert silence_ms <= waited_ms <= silence_ms + 250


def test_a_pause_shorter_than_silence_ms_keeps_the_turn_open(voiced, vad):
    """1.0 s of quiet with silence_ms=1200 ends nothing; flush() then hands over the turn."""
    endpointer = Endpointer(VadOptions(silence_ms=1200), vad=vad)
    events = run(endpointer, np.concatenate([silence(0.5), voiced(SENTENCE), silence(1.0)]))
    assert [type(e) for _, e in events] == [SpeechStart]
    assert endpointer.in_turn
    turn = endpointer.flush()
    assert turn is not None and turn.reason == "flushed" and not endpointer.in_turn


def test_the_ending_turn_is_known_before_the_silence_runs_out_and_is_the_turn_that_comes(voiced, vad):
    """ending_turn(): None while the voice goes on; once the tail after it is in, the very Turn (same samples)
    that silence_ms later ends it, well before that; and it moves when the voice resumes after a pause."""
    speech = voiced(SENTENCE)
    audio = np.concatenate([silence(0.5), speech, silence(0.4), speech, silence(2.0)])
    endpointer = Endpointer(VadOptions(silence_ms=700), vad=vad)
    ending, turns = [], []
    for i, block in enumerate(split_blocks(audio)):
        turns += [(i, e) for e in endpointer.feed(block) if isinstance(e, Turn)]
        early = endpointer.ending_turn()
        if early is not None and (not ending or ending[-1][1].end_sample != early.end_sample):
            ending.append((i, early))
    ((at, turn),) = turns
    (_, first), (last_at, last) = ending[0], ending[-1]
    assert first.end_sample < len(silence(0.5)) + len(speech) + len(silence(0.4))  # the pause's, superseded
    assert (last.start_sample, last.end_sample, last.reason) == (turn.start_sample, turn.end_sample, turn.reason)
    np.testing.assert_array_equal(last.audio, turn.audio)
    assert (at - last_at) * BLOCK_SAMPLES >= (700 - VadOptions().tail_ms - 100) * SAMPLE_RATE_HZ // 1000


def test_two_utterances_separated_by_a_long_pause_give_two_turns(voiced, vad):
    """Two sentences 1.5 s apart are two turns; espeak's short pause between sentences splits nothing."""
    first = voiced(f"{SENTENCE} Thank you.")  # two sentences, one short pause inside
    second = voiced(OTHER)
    audio = np.concatenate([silence(0.5), first, silence(1.5), second, silence(1.0)])
    events = run(Endpointer(VadOptions(silence_ms=700), vad=vad), audio)
    turns = [e for _, e in events if isinstance(e, Turn)]
    assert [type(e) for _, e in events] == [SpeechStart, Turn, SpeechStart, Turn]
    starts = [len(silence(0.5)), len(silence(0.5)) + len(first) + len(silence(1.5))]
    for turn, start, speech in zip(turns, starts, (first, second)):
        assert_brackets(turn.start_sample, turn.end_sample, start, start + len(speech))


def test_push_to_talk_ends_on_release_and_trims_to_the_speech(voiced, vad):
    """Held across two sentences and long pauses, push-to-talk gives one turn from first to last word."""
    endpointer = Endpointer(VadOptions(silence_ms=300), mode="push-to-talk", vad=vad)
    a, b = voiced(SENTENCE), voiced(OTHER)
    audio = np.concatenate([silence(1.0), a, silence(1.5), b, silence(1.0)])
    first, last = len(silence(1.0)), len(audio) - len(silence(1.0))
    run(endpointer, silence(0.5))  # before the key goes down
    endpointer.press()
    events = run(endpointer, audio)
    assert [type(e) for _, e in events] == [SpeechStart]
    turn = endpointer.release()
    offset = len(silence(0.5))
    assert turn.reason == "released"
    assert_brackets(turn.start_sample - offset, turn.end_sample - offset, first, last)


def test_push_to_talk_without_speech_gives_no_turn(vad):
    """Pressing and releasing over silence hands back None, so nothing is transcribed."""
    endpointer = Endpointer(mode="push-to-talk", vad=vad)
    endpointer.press()
    assert run(endpointer, silence(1.0)) == []
    assert endpointer.release() is None


def test_hands_free_turn_is_cut_at_max_turn_s(voiced, vad):
    """Speech longer than max_turn_s ends as a "max-length" turn of about that length."""
    events = run(Endpointer(VadOptions(max_turn_s=1.0), vad=vad), np.concatenate([silence(0.5), voiced(SENTENCE)]))
    turn = next(e for _, e in events if isinstance(e, Turn))
    assert turn.reason == "max-length"
    assert abs(len(turn.audio) - SAMPLE_RATE_HZ) <= BLOCK_SAMPLES


def test_bad_blocks_and_options_are_errors_that_say_what_fits(vad):
    """A wrong block size, an unknown mode and an out-of-range threshold each name the valid choice."""
    with pytest.raises(ValueError, match="512 mono samples.*split_blocks"):
        Endpointer(vad=vad).feed(np.zeros(480, np.float32))
    with pytest.raises(ValueError, match="hands-free, push-to-talk"):
        Endpointer(mode="always", vad=vad)
    with pytest.raises(ValueError, match="threshold must be between 0 and 1, got 1.5"):
        VadOptions(threshold=1.5)
    with pytest.raises(RuntimeError, match="push-to-talk"):
        Endpointer(vad=vad).press()
