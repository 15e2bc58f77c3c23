"""Parley's speech engine as a Wyoming text-to-speech service, the protocol Home Assistant's Assist speaks to voice
programs (https://github.com/OHF-Voice/wyoming, through its own `wyoming` package): `describe` is answered with the
voices, `synthesize` speaks a text, and synthesize-start / -chunk / -stop speak a text while it is being written (an
LLM's reply), a clause at a time (engine/llm/clauses.py). Audio goes out as 16-bit mono PCM at the model's rate, each
chunk as soon as it is decoded.

Up to `concurrency` utterances are spoken at once, their streams taking turns on the engine a chunk at a time (the
limit is the HTTP service's: engine/speech_server.py); other connections wait their turn, and one whose client leaves
gives up its place, or stops its speech at the next frame. `start_server(tts, host, port)` listens; `parley serve
--wyoming` runs it. The protocol has no authentication: whoever reaches the port may speak.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import time
from dataclasses import dataclass

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Attribution, Describe, Info, TtsProgram, TtsVoice
from wyoming.server import AsyncEventHandler, AsyncTcpServer
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped

from engine.audio.wav import pcm16
from engine.errors import InputTextError, ParleyError
from engine.llm.clauses import ClauseSplitter
from engine.speech_server import DEFAULT_CONCURRENCY, MAX_INPUT_CHARS
from engine.voices import LANGUAGE_CODES, describe, model_language

log = logging.getLogger(__name__)

QWEN = Attribution(name="Qwen team, Alibaba Cloud (Qwen3-TTS)", url="https://github.com/QwenLM/Qwen3-TTS")


async def start_server(tts, host: str, port: int, concurrency: int | None = None) -> AsyncTcpServer:
    """Listen for Wyoming clients on host:port in the running event loop, speaking with a loaded TTSEngine up to
    `concurrency` utterances at once (None: DEFAULT_CONCURRENCY for the engine's device); `await server.stop()` closes
    every connection (cancelling what they speak) and stops listening.

    Raises:
        ParleyError: the model has no built-in voices (a VoiceDesign or Base model: Wyoming has no way to describe
            or clone a voice).
        OSError: the address cannot be listened on (in use, or not this computer's).
        ValueError: concurrency below 1.
    """
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"concurrency must be 1 or more utterances spoken at once, got {concurrency}")
    if not tts.speakers:
        raise ParleyError(f"{tts.folder.name} has no built-in voices, and a Wyoming client can only name one: serve "
                          "a CustomVoice model (Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice)")
    service = _Service(tts, asyncio.Semaphore(concurrency or DEFAULT_CONCURRENCY[tts.device.type]), _info(tts).event())
    server = AsyncTcpServer(host, port)
    await server.start(lambda reader, writer: _Connection(service, reader, writer))
    return server


def _info(tts) -> Info:
    """The `info` answer: one program, "parley", with each of the model's speakers as a voice that speaks every one of
    the model's languages (its own first), and streamed text taken."""
    codes = [LANGUAGE_CODES.get(name, name) for name in tts.languages if name != "auto"]
    voices = []
    for speaker in tts.speakers:
        about = describe(speaker)
        own = LANGUAGE_CODES.get(about.language.split(" (")[0].lower())  # "Chinese (Beijing dialect)": zh
        heard = f"{about.name}: {about.description}; best in {about.language}" if about.description else about.name
        voices.append(TtsVoice(name=speaker, description=heard, attribution=QWEN, installed=True,
                               version=tts.folder.name, languages=sorted(codes, key=lambda code: code != own)))
    try:
        version = importlib.metadata.version("parley")
    except importlib.metadata.PackageNotFoundError:  # an uninstalled copy
        version = None
    program = TtsProgram(name="parley", description=f"Parley, offline speech ({tts.folder.name})",
                         attribution=QWEN, installed=True, version=version, voices=voices,
                         supports_synthesize_streaming=True)
    return Info(tts=[program])


@dataclass(frozen=True)
class _Service:
    """What every connection shares: the engine, a place for each utterance spoken at once (its waiters are served in
    turn), and the info event."""

    tts: object
    speaking: asyncio.Semaphore
    info: Event


@dataclass(frozen=True)
class _Utterance:
    """A text to speak, its stream made (and its input checked) when the request came."""

    stream: object  # TTSStream
    characters: int
    speaker: str


class _Refused(Exception):
    """A request that is answered with an `error` event: text for people, code for programs."""

    def __init__(self, text: str, code: str):
        super().__init__(text)
        self.code = code

    def event(self) -> Event:
        return Error(text=str(self), code=self.code).event()


@dataclass
class _TextStream:
    """A synthesize-start's stream while its text comes in: the voice, the clause splitter, the characters so far."""

    speaker: str
    language: str
    clauses: ClauseSplitter
    characters: int = 0


class _Connection(AsyncEventHandler):
    """One client. Its events are read as they come, while a task of its own answers them in order: so a streamed
    text's chunks are taken while its first clauses are spoken, and a client that leaves is seen at once (its end of
    the connection closes), which cancels its speech. A request that cannot be spoken gets an `error` event, and then
    the connection is closed: Home Assistant reads until audio-stop or synthesize-stopped, skipping other events, so
    only the connection's end tells it that nothing more comes (it reconnects for each request)."""

    def __init__(self, service: _Service, reader, writer):
        super().__init__(reader, writer)
        self.service, self.tts = service, service.tts
        self.answers: asyncio.Queue = asyncio.Queue()  # an Event to send, an _Utterance to speak, or a _Refused
        self.text_stream: _TextStream | None = None
        self.answering = asyncio.create_task(self._answer(), name="parley wyoming answers")

    async def handle_event(self, event: Event) -> bool:
        try:
            self._take(event)
        except _Refused as refused:
            self.answers.put_nowait(refused)
        except InputTextError as e:
            self.answers.put_nowait(_Refused(str(e), "invalid_text"))
        return True

    async def disconnect(self) -> None:
        self.answering.cancel()
        await asyncio.wait({self.answering})  # its stream has stopped, and its place is free for the next

    def _take(self, event: Event) -> None:
        """Queue what answers `event`; _Refused or InputTextError where it cannot be spoken. Events of other kinds
        are dropped, as the protocol asks of a server."""
        if Describe.is_type(event.type):
            self.answers.put_nowait(self.service.info)
        elif Synthesize.is_type(event.type):
            if self.text_stream is None:  # inside a stream it is the protocol's copy of the streamed text
                speaker, language = self._voice(event.data.get("voice"))
                self._speak(_text(event.data.get("text"), MAX_INPUT_CHARS), speaker, language)
        elif SynthesizeStart.is_type(event.type):
            if self.text_stream is not None:
                raise _Refused("synthesize-start came inside a stream; end that one with synthesize-stop first",
                               "stream_open")
            speaker, language = self._voice(event.data.get("voice"))
            self.text_stream = _TextStream(speaker, language, ClauseSplitter())
        elif SynthesizeChunk.is_type(event.type):
            stream = self._open_stream("synthesize-chunk")
            text = event.data.get("text")
            if not isinstance(text, str):
                raise _Refused("synthesize-chunk's text must be a string", "invalid_text")
            stream.characters += len(text)
            if stream.characters > MAX_INPUT_CHARS:
                raise _Refused(f"the streamed text has passed {MAX_INPUT_CHARS:,} characters, the most one request may "
                               "have; send longer text in parts", "text_too_long")
            for clause in stream.clauses.feed(text):
                self._speak(clause, stream.speaker, stream.language)
        elif SynthesizeStop.is_type(event.type):
            stream = self._open_stream("synthesize-stop")
            for clause in stream.clauses.flush():
                self._speak(clause, stream.speaker, stream.language)
            self.answers.put_nowait(SynthesizeStopped().event())
            self.text_stream = None

    def _open_stream(self, kind: str) -> _TextStream:
        if self.text_stream is None:
            raise _Refused(f"{kind} came outside a stream; begin one with synthesize-start", "no_stream")
        return self.text_stream

    def _speak(self, text: str, speaker: str, language: str) -> None:
        stream = self.tts.stream(text, speaker, language)  # checks the text now; the work happens in its turn
        self.answers.put_nowait(_Utterance(stream, len(text), speaker))

    def _voice(self, voice) -> tuple[str, str]:
        """(speaker, language) of a request's `voice`: {"name": a voice of `info`, "language": a code or the model's
        name for it}, both optional; a language alone picks a voice whose own language it is. A "speaker" is not
        looked at: each of Parley's voices is one speaker."""
        if voice is None:
            voice = {}
        if not isinstance(voice, dict):
            raise _Refused("voice must be an object: {\"name\": ..., \"language\": ...}", "invalid_voice")
        name, asked = voice.get("name"), voice.get("language")
        if name is not None and (not isinstance(name, str) or name.lower() not in self.tts.speakers):
            raise _Refused(f"no voice {name!r}; this model has {', '.join(self.tts.speakers)}", "unknown_voice")
        language = "auto"
        if asked is not None:
            language = model_language(self.tts.languages, asked) if isinstance(asked, str) else None
            if language is None:
                spoken = ", ".join(f"{LANGUAGE_CODES.get(n, n)} ({n})" for n in self.tts.languages if n != "auto")
                raise _Refused(f"no language {asked!r}; this model speaks {spoken}", "unknown_language")
        return (name or _speaker_for(self.tts, language)).lower(), language

    async def _answer(self) -> None:
        """Sends the queued answers in order, until a refusal (then the connection is closed), or the client leaves."""
        try:
            while True:
                answer = await self.answers.get()
                if isinstance(answer, _Refused):
                    log.info("wyoming request refused (%s): %s", answer.code, answer)
                    await self.write_event(answer.event())
                    break
                if isinstance(answer, _Utterance):
                    await self._say(answer)
                else:
                    await self.write_event(answer)
        except ConnectionError:
            log.info("a wyoming client left while it was answered")
        except ParleyError as e:
            log.warning("wyoming speech failed: %s", e)
            await self._send_last(_Refused(str(e), "engine_error"))
        except Exception as e:  # never the server's end: the client hears what failed, the log has the traceback
            log.exception("wyoming speech failed")
            await self._send_last(_Refused(f"Parley failed while speaking ({type(e).__name__}: {e})", "engine_error"))
        await self.stop()

    async def _send_last(self, refused: _Refused) -> None:
        try:
            await self.write_event(refused.event())
        except ConnectionError:
            pass

    async def _say(self, utterance: _Utterance) -> None:
        """audio-start, the utterance's chunks as the engine decodes them, audio-stop: once a place is free. The
        stream runs on a thread; cancelling this (the client left) stops it at the next frame, and its place is
        handed on only once it has."""
        rate_hz, stream = self.tts.sample_rate_hz, utterance.stream
        async with self.service.speaking:
            loop = asyncio.get_running_loop()
            chunks: asyncio.Queue = asyncio.Queue()
            t_begin = time.perf_counter()
            running = loop.run_in_executor(None, _produce, stream, loop, chunks)
            samples, first = 0, None
            try:
                await self.write_event(AudioStart(rate=rate_hz, width=2, channels=1).event())
                while (chunk := await chunks.get()) is not None:
                    if isinstance(chunk, BaseException):
                        raise chunk
                    first = first or chunk.t_ready
                    samples += chunk.pcm.size
                    await self.write_event(AudioChunk(rate=rate_hz, width=2, channels=1,
                                                      audio=pcm16(chunk.pcm).tobytes()).event())
                if first is not None:  # logged before audio-stop, after which the client may be gone at once
                    audio_s = samples / rate_hz
                    log.info("wyoming speech: %d characters, voice %s: TTFC %.0f ms (%.0f ms waiting), RTF %.2f, "
                             "%.1f s", utterance.characters, utterance.speaker, (first - stream.t_start) * 1000,
                             (t_begin - stream.t_start) * 1000, (time.perf_counter() - t_begin) / audio_s, audio_s)
                await self.write_event(AudioStop().event())
            finally:
                stream.cancel()  # nothing to stop where it has ended
                await asyncio.wait({running})


def _produce(stream, loop: asyncio.AbstractEventLoop, chunks: asyncio.Queue) -> None:
    """Runs `stream` on this thread, handing each Chunk (then an exception, if one ends it, then None) to `chunks`."""
    try:
        for chunk in stream:
            loop.call_soon_threadsafe(chunks.put_nowait, chunk)
    except BaseException as e:
        loop.call_soon_threadsafe(chunks.put_nowait, e)
    finally:
        loop.call_soon_threadsafe(chunks.put_nowait, None)


def _text(text, limit: int) -> str:
    """A synthesize request's text, checked: a string with something in it, at most `limit` characters."""
    if not isinstance(text, str) or not text.strip():
        raise _Refused("text must be the text to speak", "empty_text")
    if len(text) > limit:
        raise _Refused(f"text is {len(text):,} characters; at most {limit:,} a request (send longer text in parts)",
                       "text_too_long")
    return text


def _speaker_for(tts, language: str) -> str:
    """The voice for a request that names only a language: the first whose own language it is (a dialect's speaker
    after the rest), else the model's first."""
    own = [speaker for speaker in tts.speakers if describe(speaker).language.lower().startswith(language)]
    return min(own, key=lambda speaker: describe(speaker).language.lower() != language, default=tts.default_speaker)
