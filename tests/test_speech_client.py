"""The speech engine of a Parley speech server (engine/speech_client.py) against a real `parley serve` app (uvicorn on
a free loopback port) around the tiny random-weight checkpoint: the same audio as the local engine, voices checked
with the engine's words, the token, a busy, missing, foreign or vanishing server, cancelling, and a Dialogue's turn
spoken through it with its figures."""

import http.server
import math
import socket
import threading

import numpy as np
import pytest

from engine import speech_client
from engine.audio.wav import pcm16
from engine.errors import InputTextError, SpeechServerError
from engine.speech_client import connect_tts
from engine.speech_server import ServiceOptions
from tests.test_speech_server import HeldTTS, Server, health, wait_for


@pytest.fixture(scope="module")
def server(short_tts):
    with Server(short_tts) as running:
        yield running


@pytest.fixture
def quick_retries(monkeypatch):
    """A busy server asked again after 10 ms, not seconds."""
    monkeypatch.setattr(speech_client, "BUSY_RETRY_S", (0.01, 0.01))


def test_the_server_speaks_what_the_local_engine_speaks_chunk_by_chunk(server, short_tts):
    """With the same seed, the chunks streamed from the server join to the local engine's audio, sample for sample
    at 16 bits; they come as several chunks, each stamped when it arrived, after the stream's start."""
    remote = connect_tts(server.url)
    text = "Hello there, from the other computer. How are you today?"
    stream = remote.stream(text, "Ryan", seed=7)
    chunks = list(stream)
    local = short_tts.synthesize(text, "ryan", seed=7)
    heard = np.concatenate([c.pcm for c in chunks])
    assert heard.dtype == np.float32 and np.array_equal(pcm16(heard), pcm16(local))
    assert len(chunks) > 1 and stream.t_start < chunks[0].t_ready <= chunks[-1].t_ready
    assert remote.synthesize("Once more.", "ryan", seed=3).size == short_tts.synthesize("Once more.", "ryan",
                                                                                        seed=3).size


def test_connecting_says_what_the_server_speaks_and_checks_voices_in_the_engines_words(server, short_tts):
    """The model, speakers, languages and rate are the server's; a voice the model lacks is refused at once, with
    the words the local engine uses, and so is a saved (cloned) voice."""
    remote = connect_tts(server.url + "/v1/")  # the base URL OpenAI's clients take works too
    assert remote.url == server.url and remote.folder.name == short_tts.folder.name
    assert (remote.speakers, remote.languages) == (short_tts.speakers, short_tts.languages)
    assert (remote.sample_rate_hz, remote.default_speaker) == (short_tts.sample_rate_hz, short_tts.default_speaker)
    for speaker, language, style in (("rian", "auto", None), ("ryan", "klingon", None), ("ryan", "auto", "Softly.")):
        with pytest.raises(InputTextError) as local:
            short_tts.resolve_voice(speaker, language, style)
        with pytest.raises(InputTextError, match=str(local.value)):
            remote.stream("Hello.", speaker, language, instruct=style)
    with pytest.raises(InputTextError, match="spoken on this computer only"):
        remote.resolve_voice(None, "auto", None, voice=object())


def test_a_server_with_a_token_needs_it(short_tts):
    """No token and a wrong token are told apart, each naming what to give; the right one speaks."""
    with Server(short_tts, ServiceOptions(token="s3cret")) as guarded:
        with pytest.raises(SpeechServerError, match="needs a token"):
            connect_tts(guarded.url)
        with pytest.raises(SpeechServerError, match="refused the token") as refused:
            connect_tts(guarded.url, "wrong")
        assert "wrong" not in str(refused.value)
        assert connect_tts(guarded.url, "s3cret").synthesize("Let me in.", "ryan").size > 0


def test_an_address_with_no_server_or_another_server_is_told(tmp_path):
    """Nothing listening: 'cannot reach'; an HTTP server that is not Parley's: 'not a Parley speech server'; a
    string that is no address: said so."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with pytest.raises(SpeechServerError, match=rf"cannot reach the speech server at http://127.0.0.1:{port} "):
        connect_tts(f"http://127.0.0.1:{port}")
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        with pytest.raises(SpeechServerError, match="is not a Parley speech server"):
            connect_tts(f"http://127.0.0.1:{other.server_address[1]}")
    finally:
        other.shutdown()
        other.server_close()
    with pytest.raises(SpeechServerError, match="not a speech server's address"):
        connect_tts("192.168.1.20:8000")


def test_a_busy_server_is_asked_again_then_the_error_says_so(short_tts, quick_retries):
    """While the one request the server takes is spoken (concurrency=1, max_waiting=0), another is refused with 429:
    the client asks again a few times, then fails readably; once the server is free, the same engine speaks."""
    held = HeldTTS(short_tts)
    with Server(held, ServiceOptions(concurrency=1, max_waiting=0)) as busy:
        remote = connect_tts(busy.url)
        first = threading.Thread(target=lambda: remote.synthesize("First.", "ryan"))
        first.start()
        wait_for(lambda: health(busy)["speaking"] == 1)
        with pytest.raises(SpeechServerError, match="still busy after 3 tries .*speaks one request at a time"):
            list(remote.stream("Second.", "ryan"))
        held.release.set()
        first.join(60)
        assert remote.synthesize("Third.", "ryan").size > 0


class StalledTTS(HeldTTS):
    """The real engine, whose streams give their first chunk, then wait for `release` before the rest."""

    def stream(self, text, *args, **kwargs):
        return _Stalled(self.tts.stream(text, *args, **kwargs), self.release)


class _Stalled:
    def __init__(self, stream, release):
        self.stream, self.release = stream, release

    def __iter__(self):
        for index, chunk in enumerate(self.stream):
            if index == 1:
                self.release.wait(60)
            yield chunk

    def cancel(self):
        self.stream.cancel()
        self.release.set()


def test_cancelling_closes_the_request_and_the_server_is_free_at_once(short_tts):
    """A stream cancelled from another thread while it waits for audio ends without an error, and the server,
    seeing its client leave, stops speaking it (its health says so)."""
    with Server(StalledTTS(short_tts)) as stalling:
        stream = connect_tts(stalling.url).stream("Hello there, this goes on for a while.", "ryan")
        first = next(stream)
        assert first.pcm.size > 0 and health(stalling)["speaking"] == 1
        threading.Timer(0.2, stream.cancel).start()
        assert list(stream) == [] and stream.cancelled
        wait_for(lambda: health(stalling)["speaking"] == 0)


def test_a_server_that_goes_away_mid_sentence_fails_the_stream_readably_and_speaks_again_once_back(short_tts):
    """The server's connections are cut and it stops while a stream is under way: iterating raises a
    SpeechServerError naming the address; a server started again at the same address speaks the next stream."""
    stalled = StalledTTS(short_tts)
    with Server(stalled) as going:
        remote = connect_tts(going.url)
        stream = remote.stream("Hello there, this goes on for a while.", "ryan")
        next(stream)
        going.cut()
        with pytest.raises(SpeechServerError, match=f"the speech server at {going.url} stopped answering "
                                                    "mid-sentence"):
            list(stream)
    with pytest.raises(SpeechServerError, match="cannot reach"):
        list(remote.stream("Anyone there?", "ryan"))
    with Server(short_tts, port=going.port):
        assert remote.synthesize("Back again.", "ryan").size > 0


@pytest.fixture(scope="module")
def chat(smollm2_path):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the README's install builds it)")
    from engine.llm.chat import ChatModel, ChatOptions

    return ChatModel(smollm2_path, ChatOptions(n_ctx=512, max_tokens=32, n_threads=1, temperature=0.0))


def test_a_typed_turn_spoken_through_the_server_is_heard_and_measured(server, chat, pulse_server, tmp_path):
    """A Dialogue whose speech engine is the server: the reply plays on the speakers, and the turn's figures (TTFC
    and RTF of the speech, the network included) are filled as for a local engine."""
    from engine.audio import Player
    from engine.dialogue import Dialogue, DialogueOptions
    from engine.history import HistoryStore
    from engine.llm.clauses import ClauseOptions

    pulse_server.ensure_running()
    with Player() as player, HistoryStore(tmp_path / "history.sqlite3") as history:
        dialogue = Dialogue(chat, connect_tts(server.url), player, history,
                            options=DialogueOptions(speaker="ryan", tts_seed=1,
                                                    clauses=ClauseOptions(min_first_words=1, min_words=2)))
        played_before = player.stats().frames_played
        result = dialogue.text_turn("Name three colors.")
    assert result.reply_text.strip() and result.heard_text and not result.interrupted
    assert player.stats().frames_played > played_before and result.audio.size > 0
    for name in ("llm_ttft_ms", "tts_ttfc_ms", "tts_rtf"):
        assert math.isfinite(getattr(result.metrics, name)) and getattr(result.metrics, name) > 0, name
