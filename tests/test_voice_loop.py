"""The live voice loop on real parts: espeak speech played into a second PulseAudio null sink whose
monitor is the Microphone (tests/conftest.py user_mic), Silero VAD, Whisper base, SmolLM2 (GGUF), the
tiny TTS checkpoint speaking through the Player on the 'vsink' null sink, and a SQLite history file."""

import logging
import math
import sys
import threading
import time

import numpy as np
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the README's install builds it)")

from engine.errors import AudioDeviceError, MicrophoneSilentError
from engine.history import HistoryStore
from engine.llm.chat import ChatModel, ChatOptions
from engine.llm.clauses import ClauseOptions, split_clauses
from engine.metrics import FIGURES, MetricsRecorder
from engine.dialogue import Dialogue, DialogueOptions
from engine.events import (
    BargeIn, DeviceLost, DeviceRestored, Heard, Level, Measured, Notice, Partial, ReplyText, SpeakingClause,
    SpeechStarted, StateChanged, TurnFailed, TurnFinished,
)  # fmt: skip
from engine.listening import SILENT_DBFS, Mode, VadOptions, VoiceOptions
from engine.voice_loop import VoiceLoop
from tests.conftest import QUESTION, QUESTION_WORD, SECOND_QUESTION, SECOND_WORD, Events, evaluated

WAIT_S = 120  # generous: the null sinks run slow and the machine is shared
CLAUSES = ClauseOptions(min_first_words=1, min_words=2)
VAD = VadOptions(silence_ms=500)


@pytest.fixture(scope="module")
def chat(smollm2_path):
    return ChatModel(smollm2_path, ChatOptions(n_ctx=512, max_tokens=40, n_threads=1, temperature=0.0))


@pytest.fixture
def parts(user_mic, chat, short_tts, transcriber, tmp_path):
    """A fresh Player, Microphone, history file and Dialogue per test (a test may break the player)."""
    from engine.audio import Microphone, Player

    chat.clear_history()
    with Player() as player, Microphone() as mic, HistoryStore(tmp_path / "history.sqlite3") as history:
        dialogue = Dialogue(chat, short_tts, player, history, transcriber, metrics=MetricsRecorder(),
                            options=DialogueOptions(speaker="ryan", tts_seed=1, clauses=CLAUSES))
        yield dialogue, mic


def run_loop(dialogue, mic, turn_model=None, text_model=None, **options):
    events = Events()
    # user_mic is a headset: Parley's voice never reaches it, so no echo canceller (tests/audio/test_echo.py
    # has the loop with open speakers)
    loop = VoiceLoop(dialogue, mic, options=VoiceOptions(**{"vad": VAD, "echo_cancellation": False, **options}),
                     turn_model=turn_model, text_model=text_model)
    loop.subscribe(events)
    loop.start()
    return loop, events


def saved_turns(dialogue):
    return dialogue.history.open_conversation(dialogue.conversation_id).turns


def test_speech_into_the_microphone_becomes_a_spoken_measured_saved_turn(parts, user_mic, speak):
    """A WAV played into the microphone is heard, answered by SmolLM2, spoken by the TTS through the
    player clause by clause, saved, and measured in every figure; the states run their course."""
    dialogue, mic = parts
    loop, events = run_loop(dialogue, mic)
    played_before = dialogue.player.stats().frames_played
    with loop:
        user_mic(speak(QUESTION)).wait()
        finished = events.wait_for(TurnFinished)
        # the last state change, not the last event: the microphone's levels go on while it listens
        events.wait(lambda seen: events.states()[-1] == "listening", "return to listening")

    heard = events.of(Heard)
    assert [h.text for h in heard] == [finished.result.user_text] and QUESTION_WORD in heard[0].text.lower()
    replies = [r.text for r in events.of(ReplyText)]
    assert replies and replies[-1] == finished.result.reply_text
    assert all(b.startswith(a) for a, b in zip(replies, replies[1:]))  # it only grows
    clauses = events.of(SpeakingClause)
    assert [c.index for c in clauses] == list(range(len(clauses))) and clauses
    assert " ".join(c.text for c in clauses) == finished.result.heard_text
    assert dialogue.player.stats().frames_played > played_before
    assert events.of(SpeechStarted) and events.of(Level)
    assert all(SILENT_DBFS <= level.rms_dbfs <= 0 for level in events.of(Level))
    # StateChanged announces changes only, in the order the turn went through them
    states = events.states()
    assert all(a != b for a, b in zip(states, states[1:]))
    assert states[:5] == ["listening", "hearing", "thinking", "speaking", "listening"] and states[-1] == "idle"

    m = finished.result.metrics
    for name in FIGURES:
        value = getattr(m, name)
        assert value is not None and math.isfinite(value), name
    assert 0 <= m.stt_ms and m.voice_to_voice_ms > VAD.silence_ms  # measured from the end of the speech
    # the fixed window decided it: its silence, from the end of the block holding the last speech, less that block
    assert VAD.silence_ms - 100 < m.end_of_turn_ms < m.voice_to_voice_ms - m.stt_ms
    # each figure was told as soon as it was known, while the turn ran, with the value the turn ends with
    measured = events.of(Measured)
    assert {e.name: e.value for e in measured} == {name: getattr(m, name) for name in FIGURES
                                                   if name not in ("tts_rtf", "underruns")}
    assert len(measured) == 6 and {e.turn for e in measured} == {m.turn}
    order = [type(e).__name__ if not isinstance(e, Measured) else e.name for e in events.seen]
    assert order.index("Heard") < order.index("end_of_turn_ms") < order.index("stt_ms") < order.index("ReplyText")
    assert order.index("ReplyText") < order.index("llm_first_clause_ms")
    assert order.index("SpeakingClause") < order.index("voice_to_voice_ms") < order.index("TurnFinished")
    user, assistant = saved_turns(dialogue)
    assert (user.text, assistant.text) == (finished.result.user_text, finished.result.reply_text)
    assert dict(assistant.metrics) == m.as_dict()


def test_speech_while_parley_speaks_barges_in_and_becomes_the_next_turn(parts, user_mic, speak):
    """Speech that starts while a reply plays stops it at once (playback flushed, history keeps only the
    heard clauses) and is then answered as the next turn."""
    dialogue, mic = parts
    loop, events = run_loop(dialogue, mic)
    with loop:
        loop.submit_text("Tell me a long story about a cat and a dog.")
        events.wait_for(SpeakingClause, "first clause playing")
        user_mic(speak(QUESTION))
        events.wait_for(BargeIn)
        first = events.wait_for(TurnFinished).result
        second = events.wait_for(TurnFinished, count=2).result

    assert events.of(SpeechStarted) and first.interrupted and not second.interrupted
    stats = dialogue.player.stats()
    assert stats.frames_flushed > 0
    # heard: some of the clauses that started playing before the barge-in, in order, and not the whole reply
    end = events.seen.index(events.of(TurnFinished)[0])
    started = [e.text for e in events.seen[:end] if isinstance(e, SpeakingClause)]
    assert any(first.heard_text == " ".join(started[:k]) for k in range(len(started) + 1))
    assert " ".join(split_clauses(first.reply_text, CLAUSES)).startswith(first.heard_text)
    assert len(first.heard_text) < len(first.reply_text)
    assert QUESTION_WORD in second.user_text.lower() and events.of(Heard)[0].text == second.user_text
    user, interrupted, voice_user, answer = saved_turns(dialogue)
    assert interrupted.interrupted and interrupted.spoken_text == first.heard_text
    assert (voice_user.text, answer.text) == (second.user_text, second.reply_text)
    assert dialogue.chat.history[1] == {"role": "assistant", "content": first.heard_text} or not first.heard_text


def test_losing_the_output_device_mid_reply_fails_the_turn_clearly_and_saves_it(parts, user_mic):
    """The sound server dropping the player's stream while a reply plays (as when a device is unplugged) gives
    TurnFailed with a readable device error and no hang; the user's turn and what was heard are saved, and
    the loop still answers the next turn (with the same clear error, until a new Player is opened)."""
    dialogue, mic = parts
    loop, events = run_loop(dialogue, mic)
    with loop:
        loop.submit_text("Tell me a long story about a cat and a dog.")
        events.wait_for(SpeakingClause, "first clause playing")
        # (unloading the null sink would not do: PulseAudio moves its streams to another sink)
        user_mic.drop_playback()
        failed = events.wait_for(TurnFailed)
        loop.submit_text("Hello.")
        second = events.wait_for(TurnFailed, "the next turn's failure", count=2)

    assert isinstance(failed.error, AudioDeviceError), failed
    assert "output device" in failed.message and "was lost" in failed.message
    assert isinstance(second.error, AudioDeviceError) and not events.of(TurnFinished)
    user, assistant, again, unheard = saved_turns(dialogue)
    assert (user.text, again.text) == ("Tell me a long story about a cat and a dog.", "Hello.")
    assert assistant.interrupted and len(assistant.heard_text) < len(assistant.text)
    assert " ".join(split_clauses(assistant.text, CLAUSES)).startswith(assistant.heard_text)
    assert unheard.interrupted and unheard.heard_text == ""  # written by the LLM, never played


class _FailingTTS:
    """The real TTS engine, made to raise (as a CUDA out-of-memory would) from its second clause on, once."""

    def __init__(self, tts):
        self._tts, self.clauses, self.failed = tts, 0, False

    def __getattr__(self, name):
        return getattr(self._tts, name)

    def stream(self, *args, **kwargs):
        self.clauses += 1
        if self.clauses == 2 and not self.failed:
            self.failed = True
            raise RuntimeError("CUDA out of memory (injected)")
        return self._tts.stream(*args, **kwargs)


def test_a_stage_error_fails_only_its_turn(user_mic, chat, short_tts, transcriber, tmp_path):
    """A TTS that raises mid-reply gives TurnFailed; the loop goes on to answer the next typed turn, and
    the history holds both turns, the failed reply cut to what was played."""
    from engine.audio import Microphone, Player

    chat.clear_history()
    failing = _FailingTTS(short_tts)
    with Player() as player, Microphone() as mic, HistoryStore(tmp_path / "h.sqlite3") as history:
        dialogue = Dialogue(chat, failing, player, history, transcriber, metrics=MetricsRecorder(),
                            options=DialogueOptions(speaker="ryan", tts_seed=1, clauses=CLAUSES))
        loop, events = run_loop(dialogue, mic)
        with loop:
            loop.submit_text("Name three colors.")
            loop.submit_text("Say hello.")
            failed = events.wait_for(TurnFailed)
            finished = events.wait_for(TurnFinished)
        turns = saved_turns(dialogue)

    assert "CUDA out of memory" in failed.message and isinstance(failed.error, RuntimeError)
    assert events.seen.index(failed) < events.seen.index(events.of(TurnFinished)[0])
    assert [t.role for t in turns] == ["user", "assistant", "user", "assistant"]
    assert turns[0].text == "Name three colors." and turns[1].interrupted
    assert turns[1].spoken_text == turns[1].heard_text and len(turns[1].heard_text) < len(turns[1].text)
    assert (turns[2].text, turns[3].text) == ("Say hello.", finished.result.reply_text)


def test_push_to_talk_hears_only_between_press_and_release(parts, user_mic, speak):
    """In push-to-talk, speech without the key makes no turn; speech between press() and release() does."""
    dialogue, mic = parts
    loop, events = run_loop(dialogue, mic, mode=Mode.PUSH_TO_TALK)
    with loop:
        assert loop.state == "idle"
        levels = len(events.of(Level))
        user_mic(speak("This should not be heard.")).wait()
        events.wait_for(Level, "levels after the speech", count=levels + 10)  # ~1 s more captured
        assert not events.of(SpeechStarted) and events.states() == ["idle"]  # announced once, at start

        loop.press()
        events.wait(lambda seen: "listening" in [e.state for e in seen if isinstance(e, StateChanged)], "key down")
        user_mic(speak(QUESTION)).wait()
        events.wait_for(SpeechStarted)
        levels = len(events.of(Level))
        events.wait_for(Level, "levels after the speech", count=levels + 10)
        loop.release()
        finished = events.wait_for(TurnFinished)

    assert QUESTION_WORD in finished.result.user_text.lower()
    assert events.states()[:4] == ["idle", "listening", "hearing", "thinking"]  # idle: announced at start
    assert [t.text for t in saved_turns(dialogue)][0] == finished.result.user_text


def test_audio_lost_while_the_loop_was_stalled_is_a_logged_warning(parts, user_mic, speak, caplog):
    """A subscriber that holds up the listening thread for a second makes the Microphone drop blocks
    (it keeps 8 here): the turn still runs, and the log says that audio was lost and why."""
    from engine.audio import Microphone, MicrophoneOptions

    dialogue, _ = parts

    def slow(event):
        if isinstance(event, SpeechStarted):
            time.sleep(1.0)

    with Microphone(options=MicrophoneOptions(queue_blocks=8)) as mic:
        loop, events = run_loop(dialogue, mic)
        loop.subscribe(slow)
        with loop:
            user_mic(speak(QUESTION)).wait()
            events.wait_for(TurnFinished)
        assert mic.stats().dropped_blocks > 0
    assert "the microphone lost audio before this turn" in caplog.text


def test_muted_microphone_hears_nothing(parts, user_mic, speak):
    """While muted the loop reports silence and the 'muted' state and starts no turn; unmuting listens again."""
    dialogue, mic = parts
    loop, events = run_loop(dialogue, mic)
    with loop:
        loop.muted = True
        assert mic.mute and loop.state == "muted"
        levels = len(events.of(Level))
        user_mic(speak(QUESTION)).wait()
        events.wait_for(Level, "levels after the speech", count=levels + 10)
        assert not events.of(SpeechStarted)
        assert all(level.rms_dbfs == SILENT_DBFS for level in events.of(Level)[levels + 3:])
        loop.muted = False
        assert loop.state == "listening"
    assert events.states() == ["listening", "muted", "listening", "idle"]
    assert dialogue.conversation_id is None  # nothing was said, nothing saved


def test_speak_only_text_is_spoken_and_saved_without_the_llm_writing(parts):
    """submit_text(speak_only=True) speaks the text clause by clause, saves it as Parley's turn and puts it in
    the LLM's history, without the LLM generating anything; text with nothing to say fails clearly."""
    dialogue, mic = parts
    loop, events = run_loop(dialogue, mic)
    with loop:
        loop.submit_text("First part, second part.", speak_only=True)
        finished = events.wait_for(TurnFinished).result
        loop.submit_text("   ", speak_only=True)
        failed = events.wait_for(TurnFailed)
    assert finished.user_text == "" and finished.heard_text == "First part, second part."
    assert [c.text for c in events.of(SpeakingClause)] == ["First part,", "second part."]
    assert finished.metrics.tts_ttfc_ms > 0 and finished.metrics.llm_ttft_ms is None
    # the speech of both clauses, as the TTS made it: what "Save audio…" writes
    assert finished.audio.dtype == np.float32 and finished.audio_rate_hz == dialogue.tts.sample_rate_hz
    assert finished.audio.size >= 2 * dialogue.tts.sample_rate_hz // 25 and np.abs(finished.audio).max() > 0
    assert dialogue.chat.history == [{"role": "assistant", "content": "First part, second part."}]
    (turn,) = saved_turns(dialogue)
    assert (turn.role, turn.text, turn.interrupted, turn.as_written) == (
        "assistant", "First part, second part.", False, True)
    assert "nothing to speak" in failed.message


def test_a_reopened_conversation_is_read_ahead_while_the_loop_idles(parts, monkeypatch):
    """With nothing to do, the turn worker reads the next prompt (system prompt and history) into the LLM's cache, a
    little at a time, so the first turn of a reopened conversation reads only what the user said."""
    dialogue, mic = parts
    chat = dialogue.chat
    chat.history = [{"role": r, "content": f"Turn {i}: the sea is {i} metres deep here."} for i in range(8)
                    for r in ("user", "assistant")]
    chat._llm.reset()  # a cache that holds none of it, as after another conversation
    done, read_ahead = threading.Event(), chat.read_ahead

    def reading(*args, **kwargs):
        more = read_ahead(*args, **kwargs)
        if not more:
            done.set()
        return more

    monkeypatch.setattr(chat, "read_ahead", reading)
    calls = evaluated(chat, monkeypatch)
    loop, events = run_loop(dialogue, mic)
    with loop:
        assert done.wait(60), "the idle worker did not read the prompt ahead"
        read = sum(calls)
        calls.clear()
        loop.submit_text("How deep is it now?")
        events.wait_for(TurnFinished)
    assert read > 200 and calls[0] <= 16, (read, calls[:3])


def test_a_voice_preview_plays_on_the_speakers_and_is_no_turn(parts):
    """preview() speaks a sample in the voice asked for, through the player, with the loop speaking meanwhile; no
    turn begins or ends, nothing is saved or told to the LLM; a voice the model lacks is a Notice."""
    dialogue, mic = parts
    loop, events = run_loop(dialogue, mic)
    played = dialogue.player.stats().frames_written
    with loop:
        loop.preview("aiden", "Hello, I am Aiden.")
        loop.preview("nobody", "Hello.")  # runs after the first has played out
        notice = events.wait_for(Notice)
    assert dialogue.player.stats().frames_written > played and "speaking" in events.states()
    assert not events.of(TurnFinished) and not events.of(TurnFailed) and not events.of(SpeakingClause)
    assert dialogue.conversation_id is None and dialogue.chat.history == []
    assert "nobody" in notice.message and notice.doing == "playing the voice's sample"


def test_partials_show_the_words_while_the_user_is_still_speaking(parts, user_mic, speak):
    """With partials on, Partial transcripts of the utterance so far come before its final Heard text."""
    dialogue, mic = parts
    # a long silence window, so no pause inside the line ends the turn early
    loop, events = run_loop(dialogue, mic, partials=True, partial_interval_ms=300, vad=VadOptions(silence_ms=1500))
    with loop:
        # long enough (~7 s) that Whisper on a busy CPU finishes a partial while the user still speaks
        user_mic(speak("Tell me about the weather today and about the weather tomorrow and about the "
                       "weather for the rest of the week in the city")).wait()
        heard = events.wait_for(Heard)
        partials = [e for e in events.seen[: events.seen.index(heard)] if isinstance(e, Partial)]
    assert partials and all(p.text.strip() for p in partials)
    assert events.seen.index(events.of(SpeechStarted)[0]) < events.seen.index(partials[0])  # while speaking
    # Whisper pads every window to 30 s, so on this CPU each partial costs seconds: few arrive, the first
    # of a fraction of a word; only their timing is asserted, the words are the final transcript's job


def test_options_and_close_are_checked(parts):
    """A bad mode names the valid ones; close() twice is fine; start() after close() is refused."""
    dialogue, mic = parts
    with pytest.raises(ValueError, match="unknown mode 'walkie'.*hands-free, push-to-talk"):
        VoiceOptions(mode="walkie")
    loop = VoiceLoop(dialogue, mic)
    loop.start()
    with pytest.raises(ValueError, match="unknown mode"):
        loop.set_mode("walkie")
    loop.close()
    loop.close()
    with pytest.raises(RuntimeError, match="already started"):
        loop.start()


def test_a_running_loop_hands_pythons_lock_over_within_a_millisecond(parts):
    """The loop's models wait for Python's lock after every step that released it: started, the loop shortens the
    interpreter's switch interval to 1 ms (from Python's 5), and never lengthens a shorter one."""
    dialogue, mic = parts
    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.005)
        with run_loop(dialogue, mic)[0]:
            assert sys.getswitchinterval() == pytest.approx(0.001)
        sys.setswitchinterval(0.0005)
        with run_loop(dialogue, mic)[0]:
            assert sys.getswitchinterval() == pytest.approx(0.0005)
    finally:
        sys.setswitchinterval(before)


def test_losing_the_microphone_is_reported_and_typed_turns_go_on(parts, user_mic):
    """The sound server dropping the Microphone's stream gives DeviceLost naming the input device, the
    'idle' state instead of a hang, and a typed turn afterwards is still answered."""
    dialogue, mic = parts
    loop, events = run_loop(dialogue, mic)
    with loop:
        events.wait_for(Level, "the microphone's first levels")
        user_mic.drop_recording()
        failed = events.wait_for(DeviceLost)
        events.wait(lambda seen: events.states()[-1:] == ["idle"], "the idle state")
        loop.submit_text("Say hello.")
        finished = events.wait_for(TurnFinished).result
    assert isinstance(failed.error, AudioDeviceError)
    assert "input device" in failed.message and "was lost" in failed.message
    assert finished.user_text == "Say hello." and finished.reply_text.strip()


def test_a_microphone_giving_only_digital_silence_is_reported_and_hears_again_at_the_first_sound(
        parts, user_mic, speak):
    """Exact zeros for silent_microphone_s (as macOS gives an app it denies the microphone): DeviceLost with a
    MicrophoneSilentError saying what to check, and 'idle'; the loop listens on, so the user's speech brings
    DeviceRestored and is heard as a turn."""
    dialogue, mic = parts
    user_mic.hush()
    loop, events = run_loop(dialogue, mic, silent_microphone_s=1.0)
    with loop:
        lost = events.wait_for(DeviceLost)
        events.wait(lambda seen: events.states()[-1:] == ["idle"], "the idle state")
        user_mic(speak(QUESTION))
        restored = events.wait_for(DeviceRestored)
        heard = events.wait_for(Heard)
    assert isinstance(lost.error, MicrophoneSilentError) and lost.kind == "input"
    assert "nothing but digital silence" in lost.message and "muted" in lost.message
    assert restored.kind == "input" and "hears sound again" in restored.message
    assert QUESTION_WORD in heard.text.lower()


class RecordingTranscriber:
    """The Transcriber, recording which thread asked for each transcription and of how many samples."""

    def __init__(self, transcriber):
        self._transcriber, self.calls = transcriber, []

    def transcribe(self, audio, **options):
        self.calls.append((threading.current_thread().name, len(audio)))
        return self._transcriber.transcribe(audio, **options)

    def __getattr__(self, name):
        return getattr(self._transcriber, name)


def test_a_turn_is_transcribed_while_its_silence_runs_out_so_its_text_is_ready_when_it_ends(parts, user_mic, speak):
    """Hands-free, the turn's audio is complete once the tail after the voice is in: the loop transcribes it
    then, on its early-transcription thread, and the turn ending silence_ms later takes that text; the
    turn worker transcribes nothing."""
    dialogue, mic = parts
    dialogue.transcriber = recording = RecordingTranscriber(dialogue.transcriber)
    loop, events = run_loop(dialogue, mic)
    with loop:
        user_mic(speak(QUESTION))
        heard = events.wait_for(Heard)
    assert QUESTION_WORD in heard.text.lower()
    assert [thread for thread, _ in recording.calls] == ["parley-early-stt"]


def test_a_voice_resumed_within_the_silence_window_makes_the_early_text_stale_and_the_turn_holds_both_parts(
        parts, user_mic, speak):
    """A pause longer than the tail but shorter than silence_ms between two sentences: the early transcript
    of the first is dropped, and the turn's text is that of both."""
    dialogue, mic = parts
    dialogue.transcriber = recording = RecordingTranscriber(dialogue.transcriber)
    loop, events = run_loop(dialogue, mic)
    with loop:
        # espeak ends a sentence with 0.39 s of silence: more than tail_ms and a block, less than VAD.silence_ms
        user_mic(np.concatenate([speak(QUESTION), speak(SECOND_QUESTION)]))
        heard = events.wait_for(Heard)
        finished = events.wait_for(TurnFinished)
    assert QUESTION_WORD in heard.text.lower() and SECOND_WORD in heard.text.lower(), heard.text
    assert finished.result.user_text == heard.text and len(events.of(Heard)) == 1
    lengths = [n for _, n in recording.calls]
    assert len(lengths) >= 2 and lengths[-1] > lengths[0]  # the first part alone, then the whole turn


@pytest.mark.parametrize("early_reply", [True, False])
def test_a_reply_begun_in_the_pause_that_ends_the_turn_is_the_one_spoken_and_saved(parts, user_mic, speak,
                                                                                   early_reply):
    """The early transcript is ready long before a 3 s pause ends the turn: the LLM's reply to it begins in the
    pause (unless VoiceOptions.early_reply is off), and the turn speaks and saves that reply, once, after the Heard
    that starts it."""
    dialogue, mic = parts
    loop, events = run_loop(dialogue, mic, vad=VadOptions(silence_ms=3000), early_reply=early_reply)
    with loop:
        user_mic(speak(QUESTION))
        finished = events.wait_for(TurnFinished)
    result = finished.result
    assert result.metrics.early_reply == early_reply and QUESTION_WORD in result.user_text.lower()
    assert result.reply_text.strip() and result.heard_text and not result.interrupted
    assert dialogue.chat.history == [{"role": "user", "content": result.user_text},
                                     {"role": "assistant", "content": result.reply_text}]
    user, assistant = saved_turns(dialogue)
    assert (user.text, assistant.text) == (result.user_text, result.reply_text)
    order = [type(e).__name__ for e in events.seen]
    assert order.index("Heard") < order.index("ReplyText") < order.index("SpeakingClause")


def test_a_reply_begun_in_a_pause_the_user_talks_on_through_is_dropped_unheard_and_unsaved(
        parts, user_mic, speak, caplog):
    """A 2.5 s pause for thought inside a 4 s window: the reply begun to the first half is dropped when the voice
    comes back; the one turn is both halves, and neither the LLM's history nor the saved conversation nor the
    speakers had anything of the dropped reply."""
    caplog.set_level(logging.INFO, logger="engine.voice_loop")
    dialogue, mic = parts
    loop, events = run_loop(dialogue, mic, vad=VadOptions(silence_ms=4000))
    with loop:
        user_mic(np.concatenate([speak(QUESTION), np.zeros(40_000, np.float32), speak(SECOND_QUESTION)]))
        finished = events.wait_for(TurnFinished)
    result = finished.result
    # the reply to the first half was dropped; the whole turn's, begun in the pause that ended it, was spoken
    dropped = [r.getMessage().lower() for r in caplog.records if "dropped the early reply" in r.getMessage()]
    assert dropped and QUESTION_WORD in dropped[0] and SECOND_WORD not in dropped[0] and result.metrics.early_reply
    assert QUESTION_WORD in result.user_text.lower() and SECOND_WORD in result.user_text.lower()
    assert [h.text for h in events.of(Heard)] == [result.user_text]
    assert dialogue.chat.history == [{"role": "user", "content": result.user_text},
                                     {"role": "assistant", "content": result.reply_text}]
    assert [t.text for t in saved_turns(dialogue)] == [result.user_text, result.reply_text]
    order = [type(e).__name__ for e in events.seen]
    assert order.index("Heard") < order.index("ReplyText") and order.index("Heard") < order.index("SpeakingClause")


def test_a_pause_the_voice_calls_finished_but_the_words_leave_hanging_keeps_the_turn(parts, user_mic, speak):
    """ "I want to book a table for", a second's pause, "four people.": the end-of-turn model takes espeak-ng's
    falling pitch for a finished turn (checked below), but the pause's early transcript ends on "for", so the loop
    keeps listening and the one turn holds both halves; the finished sentence then ends after a short pause, not
    the 2 s longest pause."""
    from engine.stt.turn import TurnModel
    from tests.stt.conftest import silence, voiced_span

    model = TurnModel()
    first = speak("I want to book a table for")
    lo, hi = voiced_span(first)
    assert model.probability(np.concatenate([first[lo:hi], silence(0.2)])) > 0.5  # the voice alone would end it
    dialogue, mic = parts
    loop, events = run_loop(dialogue, mic, model, vad=VadOptions(silence_ms=2000))
    with loop:
        user_mic(np.concatenate([first, np.zeros(16_000, np.float32), speak("four people.")]))
        finished = events.wait_for(TurnFinished)
    text = finished.result.user_text.lower()
    assert "table" in text and "people" in text and len(events.of(Heard)) == 1, text


def test_the_pause_is_transcribed_while_the_end_of_turn_model_weighs_it(parts, user_mic, speak, monkeypatch):
    """A pause's early transcription starts before the end-of-turn model is asked about it, so the two work at once
    (on a GPU the words are in before the model has answered): a transcription begins during each of the model's
    calls, or between it and the one before. With no tail and no check delay, the pause's audio is complete at the
    very block the model is asked at: the case most pauses are in with the defaults (Silero's hysteresis puts the two
    in one block for 52 of the 72 pauses of bench/turn_taking.py's turns), made certain here. A threshold of 0.99
    keeps the model from ending the turn at a gap between words: the question's full stop ends it, at sentence_ms."""
    from engine.stt.turn import TurnModel

    model, (dialogue, mic) = TurnModel(), parts
    asked, transcribed = [], []  # (start, end) of each of the model's calls; when each transcription began

    class Timed:
        def probability(self, audio_16k):
            start = time.perf_counter()
            p = model.probability(audio_16k)
            asked.append((start, time.perf_counter()))
            return p

    transcribe = dialogue.transcriber.transcribe

    def timed_transcribe(audio, **kwargs):
        transcribed.append(time.perf_counter())
        return transcribe(audio, **kwargs)

    monkeypatch.setattr(dialogue.transcriber, "transcribe", timed_transcribe)
    vad = VadOptions(silence_ms=2000, turn_check_ms=0, tail_ms=0, turn_threshold=0.99)
    loop, events = run_loop(dialogue, mic, Timed(), vad=vad)
    with loop:
        user_mic(speak(QUESTION))
        finished = events.wait_for(TurnFinished)
    assert QUESTION_WORD in finished.result.user_text.lower() and asked
    for (_, after), (_, end) in zip([(0.0, 0.0), *asked], asked):
        assert any(after < t < end for t in transcribed), (asked, transcribed)


def test_the_end_of_turn_figure_counts_the_models_time(parts, user_mic, speak):
    """A turn is decided once the end-of-turn model has answered, not when the block that asked it came in: an answer
    that takes 1.5 s (by then the pause's words are in, so that answer decides) shows in the turn's end-of-turn figure
    (the meter's "End of turn"), not in the LLM's."""
    from engine.stt.turn import TurnModel

    model, (dialogue, mic) = TurnModel(), parts

    class Slow:
        def probability(self, audio_16k):
            time.sleep(1.5)
            return model.probability(audio_16k)

    vad = VadOptions(silence_ms=4000, turn_check_ms=200, turn_threshold=0.01)  # the check's answer ends the turn
    loop, events = run_loop(dialogue, mic, Slow(), vad=vad)
    with loop:
        user_mic(speak(QUESTION))
        finished = events.wait_for(TurnFinished)
    assert finished.result.metrics.end_of_turn_ms >= vad.turn_check_ms + 1500, finished.result.metrics


def test_a_finished_sentence_that_reads_as_a_whole_message_ends_its_turn_before_sentence_ms(parts, user_mic, speak):
    """The question the voice's model hears going on (see the test below), with the words' reader: its early words
    end a sentence and read as a whole message, so the turn ends as soon as they are in, not after sentence_ms (set
    far beyond Whisper's time here, so that only the reader can end the turn sooner)."""
    from engine.stt.turn import TurnModel
    from engine.stt.turn_text import TextTurnModel

    dialogue, mic = parts
    vad = VadOptions(silence_ms=6000, sentence_ms=4000)
    loop, events = run_loop(dialogue, mic, TurnModel(), TextTurnModel(threads=1), vad=vad)
    with loop:
        user_mic(speak(QUESTION))
        finished = events.wait_for(TurnFinished)
    assert QUESTION_WORD in finished.result.user_text.lower()
    assert finished.result.metrics.end_of_turn_ms < vad.sentence_ms, finished.result.metrics


def test_a_finished_statement_ends_its_turn_after_statement_ms_not_sentence_ms(parts, user_mic, speak):
    """A statement the voice's model hears going on and that reads as no whole message (a user may go on after one),
    checked below: its words call for their full stop, so the turn ends once they are in and statement_ms has passed,
    not after sentence_ms (set far beyond Whisper's time here)."""
    from engine.stt.turn import Meaning, TurnModel
    from engine.stt.turn_text import TextTurnModel
    from tests.stt.conftest import silence, voiced_span

    statement, model, reader = "I lost my wallet yesterday.", TurnModel(), TextTurnModel(threads=1)
    spoken = speak(statement)
    lo, hi = voiced_span(spoken)
    assert model.probability(np.concatenate([spoken[lo:hi], silence(0.2)])) < 0.5
    assert reader.read(statement, "en") is Meaning.STATEMENT
    dialogue, mic = parts
    vad = VadOptions(silence_ms=6000, sentence_ms=4000, statement_ms=400)
    loop, events = run_loop(dialogue, mic, model, reader, vad=vad)
    with loop:
        user_mic(spoken)
        finished = events.wait_for(TurnFinished)
    assert "wallet" in finished.result.user_text.lower()
    assert vad.statement_ms <= finished.result.metrics.end_of_turn_ms < vad.sentence_ms, finished.result.metrics


def test_a_finished_sentence_the_voice_seems_to_go_on_from_ends_its_turn_before_the_longest_pause(parts, user_mic,
                                                                                                   speak):
    """The question, 3 s of silence, another sentence, with a 4 s longest pause: the end-of-turn model hears
    espeak-ng's question going on (checked below), but its early transcript ends a sentence, so the pause ends the turn
    (after VadOptions.sentence_ms, once the words are in): two turns, where the voice alone would make one of both."""
    from engine.stt.turn import TurnModel
    from tests.stt.conftest import silence, voiced_span

    model = TurnModel()
    first = speak(QUESTION)
    lo, hi = voiced_span(first)
    assert model.probability(np.concatenate([first[lo:hi], silence(0.2)])) < 0.5  # the voice alone would wait
    dialogue, mic = parts
    loop, events = run_loop(dialogue, mic, model, vad=VadOptions(silence_ms=4000))
    with loop:
        user_mic(np.concatenate([first, np.zeros(48_000, np.float32), speak(SECOND_QUESTION)]))
        events.wait_for(TurnFinished, count=2)
    heard = [h.text.lower() for h in events.of(Heard)]
    assert len(heard) == 2 and QUESTION_WORD in heard[0] and SECOND_WORD in heard[1], heard
