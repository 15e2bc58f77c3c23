"""The Dialogue, one turn at a time, on real parts: SmolLM2 (GGUF), the tiny TTS checkpoint, Whisper base, the
Player on PulseAudio's null sink and a SQLite history file; typed turns, spoken turns and barge-in."""

import math
import threading

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the README's install builds it)")

from engine.errors import InputTextError
from engine.history import HistoryStore
from engine.llm.chat import ChatModel, ChatOptions
from engine.llm.clauses import ClauseOptions, split_clauses
from engine.metrics import FIGURES, MetricsRecorder
from engine.dialogue import Dialogue, DialogueOptions

WAIT_S = 60  # generous: the null sink runs slow and the machine is shared
FRAME_SAMPLES = 1920  # one 80 ms TTS frame at 24 kHz; short_checkpoint speaks at most 6 per clause
# greedy, one thread (two collapse on a busy 2-core machine); short clauses so a reply has several
PROMPT = "Name three colors."  # SmolLM2 answers "The three colors are: blue, red, and green."
CLAUSES = ClauseOptions(min_first_words=1, min_words=2)


@pytest.fixture(scope="module")
def chat(smollm2_path):
    return ChatModel(smollm2_path, ChatOptions(n_ctx=512, max_tokens=32, n_threads=1, temperature=0.0))


@pytest.fixture(scope="module")
def player(pulse_server):
    from engine.audio import Player

    pulse_server.ensure_running()  # an audio test may have killed it
    with Player() as player:
        yield player


@pytest.fixture
def dialogue(chat, short_tts, player, tmp_path, request):
    chat.clear_history()
    transcriber = request.getfixturevalue("transcriber") if "voice" in request.node.name else None
    with HistoryStore(tmp_path / "history.sqlite3") as history:
        yield Dialogue(chat, short_tts, player, history, transcriber, metrics=MetricsRecorder(),
                       options=DialogueOptions(speaker="ryan", tts_seed=1, clauses=CLAUSES))


def saved_turns(dialogue):
    return dialogue.history.open_conversation(dialogue.conversation_id).turns


def test_a_typed_turn_is_spoken_saved_and_measured(dialogue, player):
    """A typed turn plays its reply, saves both turns, and records every text-turn figure as a finite number."""
    seen = []
    dialogue.metrics.subscribe(seen.append)
    played_before = player.stats().frames_played
    result = dialogue.text_turn(PROMPT)

    assert player.stats().frames_played > played_before
    assert result.reply_text.strip() and not result.interrupted
    assert result.heard_text == " ".join(split_clauses(result.reply_text, CLAUSES))
    user, assistant = saved_turns(dialogue)
    assert (user.role, user.text) == ("user", PROMPT)
    assert (assistant.role, assistant.text, assistant.interrupted) == ("assistant", result.reply_text, False)
    m = result.metrics
    for name in ("llm_ttft_ms", "llm_first_clause_ms", "tts_ttfc_ms", "tts_rtf"):
        assert math.isfinite(getattr(m, name)) and getattr(m, name) > 0, name
    assert m.llm_first_clause_ms >= m.llm_ttft_ms
    assert m.underruns >= 0 and m.stt_ms is None and m.voice_to_voice_ms is None  # no speech in a typed turn
    assert seen == [m] and dict(assistant.metrics) == m.as_dict()
    assert dialogue.chat.history[-1] == {"role": "assistant", "content": result.reply_text}


def test_a_voice_turn_is_transcribed_answered_and_measured_from_the_end_of_speech(dialogue, player, speak):
    """Spoken audio is transcribed, answered aloud and saved, with every figure measured (STT and voice-to-voice
    too)."""
    import time

    # espeak's "colors" comes out as "cutlers" here; "weather" survives whole
    audio = speak("Tell me about the weather today.")
    speech_end = time.perf_counter()
    result = dialogue.voice_turn(audio, speech_end=speech_end, turn_end=speech_end + 0.25)

    assert "weather" in result.user_text.lower()
    assert result.reply_text.strip() and not result.interrupted
    user, assistant = saved_turns(dialogue)
    assert (user.text, assistant.text) == (result.user_text, result.reply_text)
    m = result.metrics
    for name in FIGURES:
        value = getattr(m, name)
        assert value is not None and math.isfinite(value), name
    assert 0 < m.stt_ms < m.voice_to_voice_ms  # the first sample comes after the transcript
    assert m.end_of_turn_ms == pytest.approx(250.0) and m.end_of_turn_ms + m.stt_ms < m.voice_to_voice_ms
    assert dialogue.metrics.summary()["voice_to_voice_ms"].p50 == m.voice_to_voice_ms


def test_a_voice_turn_transcribed_before_it_ended_has_no_stt(dialogue, speak):
    """Hands-free, the words are often transcribed in the pause that ends the turn: STT is then 0, the reply's first
    clause counts from the turn's end (so a wait for the LLM shows as the LLM's), and the figures add up to no more
    than voice-to-voice. A transcript that comes after the end counts from the end."""
    import time

    audio = speak("Tell me about the weather today.")
    transcript = dialogue.transcriber.transcribe(audio)
    speech_end, turn_end = transcript.made_at - 0.05, time.perf_counter()
    early = dialogue.voice_turn(audio, speech_end=speech_end, turn_end=turn_end, transcript=transcript).metrics
    assert early.stt_ms == 0 and early.end_of_turn_ms == pytest.approx((turn_end - speech_end) * 1000)
    parts = early.end_of_turn_ms + early.stt_ms + early.llm_first_clause_ms + early.tts_ttfc_ms
    assert parts < early.voice_to_voice_ms
    late = dialogue.voice_turn(audio, speech_end=transcript.made_at - 0.3, turn_end=transcript.made_at - 0.1,
                               transcript=transcript).metrics
    assert late.stt_ms == pytest.approx(100.0)


def test_barge_in_flushes_playback_and_keeps_only_the_heard_clauses(dialogue, player):
    """stop() while speaking flushes the player, ends the turn, and saves the reply as interrupted with only heard
    clauses."""
    start = player.stats()
    stopped = threading.Event()

    def barge_in():  # from another thread, as the app's window would; the turn runs on its worker's
        # once more than one whole clause has played, the first clause is certainly heard
        if player.wait_until(lambda s: s.frames_played - start.frames_played > 6 * FRAME_SAMPLES, WAIT_S):
            dialogue.stop()
            stopped.set()

    user = threading.Thread(target=barge_in)
    user.start()
    result = dialogue.text_turn(PROMPT)
    user.join(WAIT_S)
    assert stopped.is_set()

    after = player.stats()
    assert result.interrupted and result.metrics.interrupted
    assert after.frames_flushed > start.frames_flushed  # the unplayed rest was dropped
    assert after.frames_played + after.frames_flushed == after.frames_written  # nothing left queued
    clauses = split_clauses(result.reply_text, CLAUSES)
    heard = result.heard_text.split(" ") if result.heard_text else []
    assert result.heard_text.startswith(clauses[0])
    assert " ".join(clauses).startswith(result.heard_text) and len(heard) < len(" ".join(clauses).split(" "))
    user, assistant = saved_turns(dialogue)
    assert user.text == PROMPT
    assert assistant.interrupted and assistant.heard_text == result.heard_text
    assert assistant.spoken_text == result.heard_text
    assert dialogue.chat.history[-1] == {"role": "assistant", "content": result.heard_text}
    written = player.stats().frames_written
    dialogue.stop()  # between turns: nothing to stop
    assert player.stats().frames_written == written


def test_an_empty_message_saves_nothing_and_a_bad_speaker_is_refused(dialogue, chat, short_tts, player):
    """Empty text is refused before anything is saved; an unknown speaker names the valid ones."""
    with pytest.raises(InputTextError, match="empty"):
        dialogue.text_turn("   ")
    assert dialogue.conversation_id is None
    with pytest.raises(InputTextError, match="unknown speaker 'rian'.*ryan"):
        Dialogue(chat, short_tts, player, dialogue.history, options=DialogueOptions(speaker="rian"))


def test_speaking_emoji_alone_is_refused_by_the_engines_one_rule(dialogue):
    """Speak-as-written (the app's Ctrl+Enter) refuses text with no letter or digit with the message `parley say`
    gives (tests/tts/test_cli.py), and saves nothing; a word among emoji is spoken."""
    for text in ("😀🎉👍", "**!!!**", "…"):
        with pytest.raises(InputTextError, match="^nothing to speak: the text has no letters or digits$"):
            dialogue.say(text)
    assert dialogue.conversation_id is None
    assert dialogue.say("Great 🎉").heard_text == "Great"


def test_stop_before_a_voice_turns_reply_starts_saves_the_user_turn_and_speaks_nothing(dialogue, player, speak):
    """stop() once the transcript is in but before the LLM runs: nothing is spoken, the turn is interrupted,
    the user's words are saved and no empty reply is."""
    from engine.events import Heard

    written = player.stats().frames_written
    result = dialogue.voice_turn(speak("Tell me about the weather today."),
                                 emit=lambda event: dialogue.stop() if isinstance(event, Heard) else None)
    assert result.interrupted and result.reply_text == "" and result.heard_text == ""
    assert player.stats().frames_written == written
    (user,) = saved_turns(dialogue)
    assert user.role == "user" and "weather" in user.text.lower()
