"""The Wyoming service over real TCP on the loopback, called by the wyoming package's own client (as Home Assistant
calls it), on the tiny random-weight checkpoint sampling greedily, so the audio sent can be compared with the
engine's own: describe, synthesize, streamed text spoken clause by clause, an error event for each bad request,
clients served in turn, and a client that leaves."""

import asyncio
import socket
import threading

import numpy as np
import pytest
from wyoming.audio import AudioChunk, AudioStart
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeVoice

from engine.audio.wav import pcm16
from engine.llm.clauses import split_clauses
from engine.speech_server import MAX_INPUT_CHARS
from engine.wyoming_server import start_server
from tests.conftest import HeldTTS, copy_checkpoint

READ_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def tts(short_checkpoint, tmp_path_factory):
    """The short checkpoint sampling greedily (generation_config.json's do_sample false), so a text's speech is the
    same every time it is spoken."""
    from engine.tts import load_tts

    folder = tmp_path_factory.mktemp("ckpt") / "greedy"
    return load_tts(copy_checkpoint(short_checkpoint, folder, do_sample=False, subtalker_dosample=False))


class Server:
    """start_server(tts) on a free loopback port, its event loop on a thread of its own, as `parley serve --wyoming`
    runs it: until stopped, then server.stop()."""

    def __init__(self, tts, concurrency=None):
        self.tts, self.concurrency, self.port = tts, concurrency, free_port()
        self.started = threading.Event()
        self.thread = threading.Thread(target=asyncio.run, args=(self._serve(),), daemon=True)

    async def _serve(self):
        server = await start_server(self.tts, "127.0.0.1", self.port, self.concurrency)
        self.loop, self.stop = asyncio.get_running_loop(), asyncio.Event()
        self.started.set()
        await self.stop.wait()
        await server.stop()

    def __enter__(self):
        self.thread.start()
        assert self.started.wait(30), "the server did not start"
        return self

    def __exit__(self, *exc):
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(30)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tts):
    with Server(tts) as running:
        yield running


def client(port: int) -> AsyncTcpClient:
    return AsyncTcpClient("127.0.0.1", port, read_timeout=READ_TIMEOUT_S)


async def ask(port: int, *requests, until: str = "audio-stop") -> list[Event]:
    """Sends the requests (Eventables or Events) on a new connection; every event answered, up to the first of type
    `until`, or to the connection's end."""
    async with client(port) as connection:
        for request in requests:
            await connection.write_event(request if isinstance(request, Event) else request.event())
        answers = []
        while (event := await connection.read_event()) is not None:
            answers.append(event)
            if event.type == until:
                break
        return answers


def pcm(events: list[Event]) -> bytes:
    return b"".join(event.payload for event in events if AudioChunk.is_type(event.type))


def spoken(tts, text: str, speaker: str, language: str = "auto") -> bytes:
    """The engine's own speech for `text`, as the server sends it: 16-bit PCM."""
    return pcm16(tts.synthesize(text, speaker, language)).tobytes()


def test_describe_lists_each_voice_with_its_languages_and_takes_streamed_text(server, tts):
    """info has one installed program, "parley", that takes streamed text; each of the model's speakers is a voice
    with its readable name and description, speaking every language of the model as an ISO code, its own first."""
    (answer,) = asyncio.run(ask(server.port, Describe(), until="info"))
    (program,) = Info.from_event(answer).tts
    assert (program.name, program.installed, program.supports_synthesize_streaming) == ("parley", True, True)
    assert [voice.name for voice in program.voices] == tts.speakers
    ryan = next(voice for voice in program.voices if voice.name == "ryan")
    assert ryan.description == "Ryan: Dynamic male voice with strong rhythmic drive; best in English"
    assert ryan.languages[0] == "en" and ryan.installed and ryan.attribution.url
    assert sorted(ryan.languages) == ["de", "en", "es", "fr", "it", "ja", "ko", "pt", "ru", "zh"]
    assert next(voice for voice in program.voices if voice.name == "sohee").languages[0] == "ko"


@pytest.mark.parametrize("voice, speaker, language", [
    (SynthesizeVoice(name="ryan"), "ryan", "auto"),
    (None, "aiden", "auto"),  # the model's first
    (SynthesizeVoice(language="en-US"), "aiden", "english"),  # the first whose own language it is
    (SynthesizeVoice(language="zh"), "serena", "chinese"),  # a dialect's speaker after the rest
    (SynthesizeVoice(language="French"), "aiden", "french"),  # none of its own: the model's first
])
def test_synthesize_streams_the_engines_own_speech_as_16_bit_mono(server, tts, voice, speaker, language):
    """audio-start, several audio-chunks and audio-stop, all 16-bit mono at the model's rate, whose PCM is what the
    engine itself says for the text in that voice and language."""
    text = "Hello there, from Home Assistant."
    answers = asyncio.run(ask(server.port, Synthesize(text=text, voice=voice)))
    assert answers[0].type == "audio-start" and answers[-1].type == "audio-stop"
    assert {event.type for event in answers[1:-1]} == {"audio-chunk"} and len(answers) > 3
    start = AudioStart.from_event(answers[0])
    assert (start.rate, start.width, start.channels) == (tts.sample_rate_hz, 2, 1)
    assert all(AudioChunk.from_event(e).rate == tts.sample_rate_hz for e in answers[1:-1])
    assert pcm(answers) == spoken(tts, text, speaker, language)
    assert np.abs(np.frombuffer(pcm(answers), "<i2")).max() > 0


def test_streamed_text_is_spoken_a_clause_at_a_time_as_it_comes(server, tts):
    """synthesize-start, then chunks of text: each clause is spoken (audio-start ... audio-stop) as soon as it is
    complete, before the rest of the text is sent; the protocol's copy of the whole text (synthesize) is not spoken
    again, and synthesize-stop speaks the rest and ends with synthesize-stopped."""
    first, rest = ["Well, hello ", "there, my friend. How"], [" are you today? I am fine", " thanks"]
    text = "".join(first + rest)
    clauses = split_clauses(text)

    async def converse():
        async with client(server.port) as connection:
            await connection.write_event(SynthesizeStart(voice=SynthesizeVoice(name="ryan")).event())
            for piece in first:
                await connection.write_event(SynthesizeChunk(text=piece).event())
            heard = []
            while len([e for e in heard if e.type == "audio-stop"]) < 2:  # the two clauses complete so far
                heard.append(await connection.read_event())
            for piece in rest:
                await connection.write_event(SynthesizeChunk(text=piece).event())
            await connection.write_event(Synthesize(text=text, voice=SynthesizeVoice(name="ryan")).event())
            await connection.write_event(SynthesizeStop().event())
            while heard[-1].type != "synthesize-stopped":
                heard.append(await connection.read_event())
            return heard

    heard = asyncio.run(converse())
    assert clauses == ["Well, hello there,", "my friend.", "How are you today?", "I am fine thanks"]
    utterances = []
    for event in heard[:-1]:
        if event.type == "audio-start":
            utterances.append([])
        utterances[-1].append(event)
    assert [u[-1].type for u in utterances] == ["audio-stop"] * len(clauses)
    assert [pcm(u) for u in utterances] == [spoken(tts, clause, "ryan") for clause in clauses]


@pytest.mark.parametrize("requests, code, said", [
    ([Synthesize(text="Hi.", voice=SynthesizeVoice(name="nobody"))], "unknown_voice",
     "no voice 'nobody'; this model has aiden, dylan, eric, ono_anna, ryan, serena, sohee, uncle_fu, vivian"),
    ([Synthesize(text="Hi.", voice=SynthesizeVoice(language="xx"))], "unknown_language",
     "no language 'xx'; this model speaks zh (chinese), en (english), fr (french)"),
    ([Event("synthesize", {"text": "Hi.", "voice": "ryan"})], "invalid_voice", "voice must be an object"),
    ([Synthesize(text="")], "empty_text", "text must be the text to speak"),
    ([Event("synthesize", {"text": 42})], "empty_text", "text must be the text to speak"),
    ([Synthesize(text="a" * (MAX_INPUT_CHARS + 1))], "text_too_long", "at most 4,096 a request"),
    ([Synthesize(text="\u0000\u0001 \u2603\ufe0f")], "invalid_text", "nothing to speak: the text has no letters"),
    ([SynthesizeChunk(text="Hi.")], "no_stream", "synthesize-chunk came outside a stream"),
    ([SynthesizeStop()], "no_stream", "synthesize-stop came outside a stream"),
    ([SynthesizeStart(), SynthesizeStart()], "stream_open", "synthesize-start came inside a stream"),
    ([SynthesizeStart(voice=SynthesizeVoice(name="nobody"))], "unknown_voice", "no voice 'nobody'"),
    ([SynthesizeStart(), SynthesizeChunk(text="a" * MAX_INPUT_CHARS), SynthesizeChunk(text="a")], "text_too_long",
     "the streamed text has passed 4,096 characters"),
])
def test_a_bad_request_gets_an_error_event_and_the_server_goes_on(server, tts, requests, code, said):
    """Each bad request is answered, after whatever came before it, with an error event (a text naming the fault
    and a code), then its connection ends, as Home Assistant needs to stop waiting; the next client is served."""
    answers = asyncio.run(ask(server.port, *requests, until="error"))
    error = Error.from_event(answers[-1])
    assert error.code == code and said in error.text
    assert {event.type for event in answers[:-1]} <= {"audio-start", "audio-chunk", "audio-stop"}

    async def ended():
        async with client(server.port) as connection:
            for request in requests:
                await connection.write_event(request if isinstance(request, Event) else request.event())
            while (event := await connection.read_event()) is not None and event.type != "error":
                pass
            return await connection.read_event()

    assert asyncio.run(ended()) is None
    assert pcm(asyncio.run(ask(server.port, Synthesize(text="Fine.")))) == spoken(tts, "Fine.", "aiden")


def test_two_clients_at_once_are_served_in_turn(tts):
    """With one utterance at a time: while one client's text is spoken, another's is taken (checked) but waits for
    the engine; once the first is done, the second is spoken, and each gets its own speech whole."""
    held = HeldTTS(tts)
    with Server(held, concurrency=1) as small:
        async def both():
            first = asyncio.create_task(ask(small.port, Synthesize(text="First in turn.")))
            await held.wait(lambda: held.spoken == ["First in turn."])
            second = asyncio.create_task(ask(small.port, Synthesize(text="Second in turn.")))
            await held.wait(lambda: "Second in turn." in held.made)
            assert held.spoken == ["First in turn."]
            held.release.set()
            return await first, await second

        first, second = asyncio.run(both())
    assert held.spoken == ["First in turn.", "Second in turn."]
    assert pcm(first) == spoken(tts, "First in turn.", "aiden")
    assert pcm(second) == spoken(tts, "Second in turn.", "aiden")


def test_clients_up_to_the_concurrency_are_spoken_at_once_and_the_next_waits(tts):
    """With two at once, two clients' texts are both speaking (each past its first chunk) while a third's is taken
    but waits for a place; released, each of the three gets exactly its own speech."""
    held = HeldTTS(tts)
    texts = ["One at once.", "Two at once.", "Three waits."]
    with Server(held, concurrency=2) as small:
        async def three():
            speaking = [asyncio.create_task(ask(small.port, Synthesize(text=text))) for text in texts[:2]]
            await held.wait(lambda: sorted(held.spoken) == sorted(texts[:2]))
            waiting = asyncio.create_task(ask(small.port, Synthesize(text=texts[2])))
            await held.wait(lambda: texts[2] in held.made)
            assert texts[2] not in held.spoken
            held.release.set()
            return await asyncio.gather(*speaking, waiting)

        answers = asyncio.run(three())
    assert held.spoken[2] == texts[2]
    for text, answer in zip(texts, answers):
        assert pcm(answer) == spoken(tts, text, "aiden")


def test_a_client_that_leaves_mid_stream_cancels_its_speech_and_the_next_is_served(tts):
    """A client that hangs up after its first chunk has its stream cancelled (the engine stops at the next frame)
    and the engine goes to the next client at once."""
    held = HeldTTS(tts)
    with Server(held) as small:
        async def leave_then_ask():
            async with client(small.port) as leaving:
                await leaving.write_event(Synthesize(text="Never mind.").event())
                assert [(await leaving.read_event()).type for _ in range(2)] == ["audio-start", "audio-chunk"]
            await held.wait(lambda: held.cancelled == ["Never mind."])
            return await ask(small.port, Synthesize(text="Next, please."))

        answers = asyncio.run(leave_then_ask())
    assert pcm(answers) == spoken(tts, "Next, please.", "aiden")


def test_a_client_that_leaves_while_it_waits_gives_up_its_place_and_is_never_spoken(tts):
    """A client that hangs up while another's text is spoken leaves the queue: its text is never spoken, and the
    client after it is served next."""
    held = HeldTTS(tts)
    with Server(held, concurrency=1) as small:
        async def scenario():
            first = asyncio.create_task(ask(small.port, Synthesize(text="First.")))
            await held.wait(lambda: held.spoken == ["First."])
            async with client(small.port) as leaving:
                await leaving.write_event(Synthesize(text="Never mind.").event())
                await held.wait(lambda: "Never mind." in held.made)
            third = asyncio.create_task(ask(small.port, Synthesize(text="Third.")))
            await held.wait(lambda: "Third." in held.made)
            held.release.set()
            return await first, await third

        first, third = asyncio.run(scenario())
    assert held.spoken == ["First.", "Third."]
    assert pcm(third) == spoken(tts, "Third.", "aiden")
