"""Parley's speech engine as a service on the OpenAI audio API's speech route (`POST /v1/audio/speech`), which
OpenAI's own clients, Pipecat's OpenAITTSService, LiveKit's openai.TTS and Open WebUI call with a base URL. Each
chunk is sent as soon as it is decoded. Parley's own client (engine/speech_client.py) also asks `GET /v1/voices` what
the model speaks, and may send two fields the OpenAI API lacks: `language` and `seed`.

Up to `concurrency` requests are spoken at once: their streams take turns on the one engine a chunk at a time, the
one whose listener runs out of audio soonest first (engine/tts/turns.py), so a request's first audio waits for the
turn in progress and those of streams that fell behind, not for the others' whole utterances. On a GPU with the
megakernel, up to four of them share each launch (engine/tts/kernels/batcher.py), which makes about 1.3 times the
frames of one utterance alone; elsewhere together they go no faster than one. Either way each speaks at the engine's
speed divided among them; past the point where that is slower than real time, listeners hear gaps (the default stops
before it: DEFAULT_CONCURRENCY). Requests beyond them wait in a bounded queue, and one beyond it is refused at once
with 429, never queued without end.
`create_app(tts)` is the ASGI app; `parley serve` runs it with uvicorn.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import struct
import threading
import time
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from engine.audio.wav import pcm16
from engine.errors import InputTextError, ParleyError

log = logging.getLogger(__name__)

MAX_INPUT_CHARS = 4096  # the OpenAI API's own limit on this route's input
# how often a request waiting for its first audio looks whether its client is still there
CLIENT_CHECK_S = 0.2
FORMATS = {"pcm": "audio/pcm", "wav": "audio/wav"}  # both 16-bit signed little-endian mono at the model's rate
# Requests spoken at once where none is asked for, by the engine's device. A GPU with the megakernel speaks the 0.6B
# model ~17x faster than real time (RTF 0.057, docs/BENCHMARKS.md), so 8 at once each stay about twice real time. A
# CPU speaks it at about real time (RTF 0.75 on 8 cores, 1.9 on 2), so there a second at once trades the first's speed
# for its own first audio, which would otherwise wait for the whole of the first.
DEFAULT_CONCURRENCY = {"cpu": 2, "cuda": 8}


@dataclass(frozen=True)
class ServiceOptions:
    """token: the bearer token every request must carry (None: none is asked for; `parley serve` allows that on the
    loopback interface only). concurrency: requests spoken at once (None: DEFAULT_CONCURRENCY for the engine's
    device). max_waiting: requests that may wait behind those being spoken."""

    token: str | None = None
    concurrency: int | None = None
    max_waiting: int = 8

    def __post_init__(self):
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be 1 or more requests spoken at once, got {self.concurrency}")
        if self.max_waiting < 0:
            raise ValueError(f"max_waiting must be 0 or more requests, got {self.max_waiting}")


class _Refused(Exception):
    """A request the API answers with an error object: {"error": {message, type, param, code}}."""

    def __init__(self, status: int, message: str, code: str, param: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.code, self.param, self.kind = status, code, param, kind

    def response(self) -> JSONResponse:
        error = {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}
        return JSONResponse({"error": error}, status_code=self.status)


class _TokenGate:
    """Lets through only requests with the bearer token (and /health, for load balancers). A plain ASGI middleware:
    Starlette's BaseHTTPMiddleware would keep a handler from seeing its client hang up."""

    def __init__(self, app, token: str):
        self.app, self.expected = app, f"Bearer {token}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] != "/health":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                refused = _Refused(401, "this Parley server needs its token: send 'Authorization: Bearer <token>'",
                                   "invalid_api_key", kind="authentication_error")
                return await refused.response()(scope, receive, send)
        await self.app(scope, receive, send)


def create_app(tts, options: ServiceOptions | None = None) -> FastAPI:
    """The service around a loaded TTSEngine (engine/tts): /v1/audio/speech, /v1/models, /v1/voices and /health."""
    options = options or ServiceOptions()
    app = FastAPI(title="Parley speech", docs_url=None, redoc_url=None, openapi_url=None)
    at_once = options.concurrency or DEFAULT_CONCURRENCY[tts.device.type]
    speaking = threading.Semaphore(at_once)  # a place for each request spoken at once
    queue = _Queue(at_once, options.max_waiting)

    if options.token is not None:
        app.add_middleware(_TokenGate, token=options.token)

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": tts.folder.name, "speaking": queue.speaking, "waiting": queue.waiting,
                "at_once": at_once, "max_waiting": options.max_waiting}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": tts.folder.name, "object": "model", "created": 0,
                                            "owned_by": "parley"}]}

    @app.get("/v1/voices")
    async def voices():
        # Parley's own route, for a Parley client (engine/speech_client.py) to check a voice before each turn as it
        # would on this computer: what the engine's resolve_voice reads of the checkpoint's config.json
        config = tts.config
        return {"object": "parley.voices", "model": tts.folder.name, "model_type": config.model_type,
                "model_size": config.model_size, "speakers": tts.speakers, "languages": tts.languages,
                "sample_rate_hz": tts.sample_rate_hz}

    @app.post("/v1/audio/speech")
    async def speech(request: Request):
        try:
            text, voice, language, style, seed, audio_format = _read_request(await _json(request), tts)
            stream = tts.stream(text, voice, language, instruct=style, seed=seed)
            chunks = _speak(stream, tts.sample_rate_hz, speaking, queue, text, voice)
            first = await _first_chunk(chunks, request)  # a fault before it is still an error response
            if first is None:
                log.info("a request's client left before its first audio")
                return Response(status_code=499)  # nginx's "client closed request": nobody reads it
        except _Refused as e:
            return e.response()
        except InputTextError as e:
            return _Refused(400, str(e), "invalid_input", "input").response()
        except ParleyError as e:
            log.warning("speech failed: %s", e)
            return _Refused(500, str(e), "engine_error", kind="server_error").response()

        async def body():
            try:
                if audio_format == "wav":
                    yield _wav_header(tts.sample_rate_hz)
                yield first
                async for pcm in chunks:
                    yield pcm
            except ParleyError as e:  # the status is sent: the audio ends where the engine failed
                log.warning("speech failed after its first audio: %s", e)
            finally:
                await chunks.aclose()  # a client gone mid-stream cancels the synthesis

        return StreamingResponse(body(), media_type=FORMATS[audio_format])

    return app


class _Queue:
    """Requests being spoken (up to `at_once`) or waiting to be; refuses one beyond `max_waiting` with 429. A request
    holds a ticket, "waiting", then "speaking", then "done"; one whose client leaves while it waits is withdrawn, and
    its place goes to the next at once."""

    def __init__(self, at_once: int, max_waiting: int):
        self.at_once, self.max_waiting, self.waiting, self.speaking = at_once, max_waiting, 0, 0
        self._lock = threading.Lock()

    def join(self) -> list[str]:
        with self._lock:
            if self.speaking + self.waiting >= self.at_once + self.max_waiting:
                requests = "one request" if self.at_once == 1 else f"{self.at_once} requests"
                raise _Refused(429, f"Parley is busy: it speaks {requests} at a time, and {self.waiting} "
                                    f"{'is' if self.waiting == 1 else 'are'} waiting already; try again shortly",
                               "busy", kind="server_busy")
            self.waiting += 1
            return ["waiting"]

    def begin(self, ticket: list[str]) -> bool:
        """The ticket's turn to speak has come: False where it was withdrawn meanwhile."""
        with self._lock:
            if ticket[0] != "waiting":
                return False
            self.waiting, self.speaking, ticket[0] = self.waiting - 1, self.speaking + 1, "speaking"
            return True

    def withdraw(self, ticket: list[str]) -> None:
        """The request is gone: a ticket still waiting gives up its place (one speaking ends with its stream)."""
        with self._lock:
            if ticket[0] == "waiting":
                self.waiting, ticket[0] = self.waiting - 1, "done"

    def end(self, ticket: list[str]) -> None:
        with self._lock:
            if ticket[0] == "speaking":
                self.speaking, ticket[0] = self.speaking - 1, "done"


async def _speak(stream, rate_hz: int, speaking: threading.Semaphore, queue: _Queue, text: str, voice: str | None):
    """The stream's chunks as 16-bit PCM bytes, synthesised on a thread of their own once a place is free;
    closing this generator (the client went away) cancels the stream, or withdraws it from the queue."""
    ticket = queue.join()
    loop = asyncio.get_running_loop()
    out: asyncio.Queue = asyncio.Queue()
    t_request = time.perf_counter()

    def produce() -> None:
        try:
            with speaking:
                if not queue.begin(ticket):
                    return  # its client left while it waited
                t_start, samples, first = time.perf_counter(), 0, None
                for chunk in stream:
                    first = first or time.perf_counter()
                    samples += chunk.pcm.size
                    loop.call_soon_threadsafe(out.put_nowait, pcm16(chunk.pcm).tobytes())
                if first is not None:
                    audio_s = samples / rate_hz
                    log.info("speech: %d characters, voice %s: TTFC %.0f ms (%.0f ms waiting), RTF %.2f, %.1f s",
                             len(text), voice or "default", (first - t_request) * 1000, (t_start - t_request) * 1000,
                             (time.perf_counter() - t_start) / audio_s, audio_s)
        except BaseException as e:  # handed to the request, which answers or ends its response with it
            loop.call_soon_threadsafe(out.put_nowait, e)
        finally:
            queue.end(ticket)
            loop.call_soon_threadsafe(out.put_nowait, None)

    threading.Thread(target=produce, name="parley-serve-speech", daemon=True).start()
    try:
        while (item := await out.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stream.cancel()
        queue.withdraw(ticket)


async def _first_chunk(chunks, request: Request) -> bytes | None:
    """The first chunk of _speak's `chunks` (b"" where there is none), or None where the client leaves before it
    comes: waiting in the queue, or while the engine starts, the request is then withdrawn and its stream cancelled
    (an ASGI server does not cancel a handler whose client has gone)."""
    first = asyncio.ensure_future(anext(chunks, b""))
    try:
        while not (await asyncio.wait({first}, timeout=CLIENT_CHECK_S))[0]:
            if await request.is_disconnected():
                first.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await first
                return None
    except asyncio.CancelledError:  # a server that cancels the request of a client gone (Ray Serve's replicas do)
        first.cancel()  # which closes `chunks` where it waits: the request leaves the queue, its stream is cancelled
        raise
    return first.result()


async def _json(request: Request) -> dict:
    try:
        body = await request.json()
    except ValueError:
        raise _Refused(400, "the request body must be JSON: {\"model\", \"input\", \"voice\", ...}", "invalid_json")
    if not isinstance(body, dict):
        raise _Refused(400, "the request body must be a JSON object", "invalid_json")
    return body


def _read_request(body: dict, tts) -> tuple[str, str | None, str, str | None, int | None, str]:
    """(input, voice, language, instructions, seed, response_format) of a speech request, each checked; _Refused says
    what is wrong. language ("auto" when absent) and seed (drawn per request when absent: the same seed and text give
    the same audio) are Parley's own fields, which OpenAI's clients send as extra_body."""
    text = body.get("input")
    if not isinstance(text, str) or not text.strip():
        raise _Refused(400, "input must be the text to speak", "invalid_input", "input")
    if len(text) > MAX_INPUT_CHARS:
        raise _Refused(400, f"input is {len(text):,} characters; at most {MAX_INPUT_CHARS:,} a request (send longer "
                            "text in parts)", "input_too_long", "input")
    voice = body.get("voice")
    if voice is not None and not isinstance(voice, str):
        raise _Refused(400, "voice must be a name", "invalid_voice", "voice")
    if voice and tts.speakers and voice.lower() not in {s.lower() for s in tts.speakers}:
        raise _Refused(400, f"no voice {voice!r}; this model has {', '.join(tts.speakers)}", "invalid_voice",
                       "voice")
    language = body.get("language") or "auto"
    if not isinstance(language, str) or language.lower() not in tts.languages:
        raise _Refused(400, f"unknown language {language!r}; this model has: {', '.join(tts.languages)}",
                       "invalid_language", "language")
    seed = body.get("seed")
    if seed is not None and (type(seed) is not int or not 0 <= seed < 2**63):
        raise _Refused(400, f"seed must be a whole number from 0 to 2**63 - 1, got {seed!r}", "invalid_seed", "seed")
    audio_format = body.get("response_format") or "wav"
    if audio_format not in FORMATS:
        raise _Refused(400, f"response_format {audio_format!r} is not served; choose pcm (16-bit, "
                            f"{tts.sample_rate_hz} Hz, mono) or wav", "invalid_response_format", "response_format")
    speed = body.get("speed", 1.0)
    if speed not in (1, 1.0):
        raise _Refused(400, "this speech model speaks at one speed; leave speed out or send 1.0", "invalid_speed",
                       "speed")
    style = body.get("instructions") or None
    if style is not None:
        if not isinstance(style, str):
            raise _Refused(400, "instructions must be text: how to speak", "invalid_instructions", "instructions")
        try:  # the voice is known by now, so what the model refuses here is the style
            tts.resolve_voice(voice or tts.default_speaker, language, style)
        except InputTextError as e:
            raise _Refused(400, str(e), "invalid_instructions", "instructions") from None
    return text, voice or None, language, style, seed, audio_format


def _wav_header(rate_hz: int) -> bytes:
    """A WAV header for 16-bit mono of a length not known yet (the sizes at their largest, as streamed WAV has)."""
    unknown = 0xFFFFFFFF
    return (b"RIFF" + struct.pack("<I", unknown) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, rate_hz,
                                                                             rate_hz * 2, 2, 16)
            + b"data" + struct.pack("<I", unknown))
