"""The speech service over real HTTP (uvicorn on the loopback), called by OpenAI's own Python client and by plain
HTTP, on the tiny random-weight checkpoint: streamed PCM and WAV, the models, voices and health routes, Parley's
seed and language fields, the API's error shape for bad requests, the token, and the queue's limit."""

import asyncio
import io
import json
import socket
import threading
import time
import urllib.request
import wave

import numpy as np
import openai
import pytest
import uvicorn

from engine.audio.wav import pcm16
from engine.speech_server import MAX_INPUT_CHARS, ServiceOptions, create_app


class Server:
    """create_app(tts, options) served by uvicorn on a loopback port (a free one where port is 0), in a thread."""

    def __init__(self, tts, options=None, port: int = 0):
        self.socket = socket.socket()
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port just left, to start again on
        self.socket.bind(("127.0.0.1", port))
        self.port = self.socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(create_app(tts, options), log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(30)
        self.socket.close()

    def cut(self) -> None:
        """Drop every connection at once, as a server whose process dies does, and stop without waiting for them."""
        for connection in list(self.server.server_state.connections):
            connection.loop.call_soon_threadsafe(connection.transport.abort)
        self.server.force_exit = self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture(scope="module")
def server(short_tts):
    with Server(short_tts) as running:
        yield running


def client(server, token="unused"):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=token, max_retries=0)


def test_openais_client_streams_pcm_and_wav_in_the_voice_asked_for(server, short_tts):
    """The openai package's speech call (with_streaming_response) gets 16-bit PCM at the model's rate, chunk by
    chunk, and a WAV that Python's wave module reads; both carry speech (not silence) of the same length."""
    with client(server).audio.speech.with_streaming_response.create(
            model=short_tts.folder.name, voice="ryan", input="Hello there, from the service.",
            response_format="pcm") as response:
        assert response.headers["content-type"] == "audio/pcm"
        parts = list(response.iter_bytes())
    pcm = np.frombuffer(b"".join(parts), "<i2")
    assert pcm.size > short_tts.sample_rate_hz // 25 and np.abs(pcm).max() > 0
    wav = client(server).audio.speech.create(model=short_tts.folder.name, voice="Ryan", input="Hello there.",
                                             response_format="wav").content
    with wave.open(io.BytesIO(wav)) as read:
        assert (read.getframerate(), read.getnchannels(), read.getsampwidth()) == (short_tts.sample_rate_hz, 1, 2)
        frames = read.readframes(10**9)
    assert len(frames) > 0 and len(frames) % 2 == 0


def test_models_and_health_say_what_is_served(server, short_tts):
    assert [m.id for m in client(server).models.list()] == [short_tts.folder.name]
    assert health(server) == {"status": "ok", "model": short_tts.folder.name, "speaking": 0, "waiting": 0,
                              "at_once": 2, "max_waiting": 8}  # the CPU's default


def test_parleys_own_voices_route_and_fields_name_the_voices_and_make_speech_reproducible(server, short_tts):
    """GET /v1/voices says what the model speaks (for Parley's client); the request's seed and language fields,
    sent as OpenAI's client sends extra fields, give the engine's own audio for that seed, the same each time."""
    request = urllib.request.Request(f"{server.url}/v1/voices", headers={"Authorization": "Bearer unused"})
    with urllib.request.urlopen(request) as response:
        assert json.load(response) == {
            "object": "parley.voices", "model": short_tts.folder.name, "model_type": "custom_voice",
            "model_size": short_tts.config.model_size, "speakers": short_tts.speakers,
            "languages": short_tts.languages, "sample_rate_hz": short_tts.sample_rate_hz}
    said = [client(server).audio.speech.create(model="x", voice="ryan", input="Same again.", response_format="pcm",
                                               extra_body={"seed": 11, "language": "English"}).content
            for _ in range(2)]
    assert said[0] == said[1] == pcm16(short_tts.synthesize("Same again.", "ryan", "english", seed=11)).tobytes()


@pytest.mark.parametrize("fields, param, said", [
    ({"input": ""}, "input", "input must be the text to speak"),
    ({"input": "a" * (MAX_INPUT_CHARS + 1)}, "input", "at most 4,096 a request"),
    ({"voice": "nobody"}, "voice", "no voice 'nobody'; this model has"),
    ({"response_format": "mp3"}, "response_format", "choose pcm"),
    ({"speed": 1.5}, "speed", "one speed"),
    ({"input": "\u0000\u0001"}, "input", "nothing"),
    ({"instructions": "Whisper it."}, "instructions", "takes no speaking style"),
    ({"instructions": ["loud"]}, "instructions", "instructions must be text"),
    ({"language": "klingon"}, "language", "unknown language 'klingon'; this model has: auto, "),
    ({"seed": "7"}, "seed", "seed must be a whole number"),
])
def test_bad_requests_get_the_apis_error_shape_and_the_server_goes_on(server, short_tts, fields, param, said):
    """Each bad request is a 400 with {"error": {message, type, param, code}}, which the client raises as
    BadRequestError; the next good request is served."""
    request = {"model": short_tts.folder.name, "voice": "ryan", "input": "Fine.", **fields}
    parleys = {name: request.pop(name) for name in ("language", "seed") if name in request}  # no OpenAI fields
    with pytest.raises(openai.BadRequestError) as refused:
        client(server).audio.speech.create(**request, extra_body=parleys)
    error = refused.value.body
    assert refused.value.status_code == 400 and error["param"] == param and said in error["message"]
    assert error["type"] == "invalid_request_error" and error["code"]
    assert client(server).audio.speech.create(model="x", voice="ryan", input="Fine.").content


def test_a_server_with_a_token_refuses_requests_without_it(short_tts):
    with Server(short_tts, ServiceOptions(token="s3cret")) as guarded:
        with pytest.raises(openai.AuthenticationError):
            client(guarded, token="wrong").models.list()
        assert [m.id for m in client(guarded, token="s3cret").models.list()] == [short_tts.folder.name]
        with urllib.request.urlopen(f"{guarded.url}/health") as response:  # no token: for load balancers
            assert response.status == 200


class HeldTTS:
    """The real engine, whose streams wait for `release` before their first chunk: a request holds the engine for
    as long as a test needs. `spoken` lists the texts whose streams ran."""

    def __init__(self, tts):
        self.tts, self.release, self.spoken = tts, threading.Event(), []

    def __getattr__(self, name):
        return getattr(self.tts, name)

    def stream(self, text, *args, **kwargs):
        return _Held(self.tts.stream(text, *args, **kwargs), self.release, lambda: self.spoken.append(text))


class _Held:
    def __init__(self, stream, release, runs):
        self.stream, self.release, self.runs = stream, release, runs

    def __iter__(self):
        self.runs()
        self.release.wait(60)
        yield from self.stream

    def cancel(self):
        self.stream.cancel()


def health(server) -> dict:
    with urllib.request.urlopen(f"{server.url}/health") as response:
        return json.load(response)


def test_requests_beyond_the_queue_are_refused_at_once_and_the_rest_are_served_in_turn(short_tts):
    """One at a time: one is spoken, max_waiting wait, and one more is a 429 at once, in the API's error shape
    (nothing crashes); then every accepted request gets its audio, in turn."""
    held = HeldTTS(short_tts)
    with Server(held, ServiceOptions(concurrency=1, max_waiting=1)) as small:
        sizes = []

        def ask():
            sizes.append(len(client(small).audio.speech.create(model="x", voice="ryan", input="In turn.",
                                                                response_format="pcm").content))

        first, second = threading.Thread(target=ask), threading.Thread(target=ask)
        first.start()
        wait_for(lambda: health(small)["speaking"] == 1)
        second.start()
        wait_for(lambda: health(small)["waiting"] == 1)
        with pytest.raises(openai.APIStatusError) as refused:
            client(small).audio.speech.create(model="x", voice="ryan", input="One too many.")
        assert refused.value.status_code == 429 and refused.value.body["code"] == "busy"
        assert "speaks one request at a time, and 1 is waiting already" in refused.value.body["message"]
        held.release.set()
        first.join(60)
        second.join(60)
    assert len(sizes) == 2 and all(size > 0 for size in sizes)


def test_a_request_whose_client_leaves_while_it_waits_gives_up_its_place_and_is_never_spoken(short_tts):
    """A client that hangs up while its request waits in the queue frees the place at once (health shows it, and a
    new request is taken, not refused), and the engine never starts its stream."""
    held = HeldTTS(short_tts)
    with Server(held, ServiceOptions(concurrency=1, max_waiting=1)) as small:
        first = threading.Thread(target=lambda: client(small).audio.speech.create(model="x", voice="ryan",
                                                                                 input="First."))
        first.start()
        wait_for(lambda: health(small)["speaking"] == 1)
        host, port = small.url.removeprefix("http://").split(":")
        body = json.dumps({"model": "x", "voice": "ryan", "input": "Never mind."}).encode()
        with socket.create_connection((host, int(port))) as leaving:
            leaving.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                            + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            wait_for(lambda: health(small)["waiting"] == 1)
        wait_for(lambda: health(small)["waiting"] == 0)
        third = threading.Thread(target=lambda: client(small).audio.speech.create(model="x", voice="ryan",
                                                                                 input="Third."))
        third.start()
        wait_for(lambda: health(small)["waiting"] == 1)  # taken: the place was free again
        held.release.set()
        first.join(60)
        third.join(60)
        assert held.spoken == ["First.", "Third."]


def test_openai_clients_at_once_are_spoken_together_each_its_own_speech(short_tts):
    """Three openai clients at once with concurrency 3 are all speaking together (health says so while they are
    held), a fourth waits and a fifth is refused (max_waiting 1); released, each gets exactly the engine's audio
    for its own text and seed."""
    held = HeldTTS(short_tts)
    requests = [("First together.", 1), ("Second together.", 2), ("Third together.", 3), ("Fourth waits.", 4)]
    got = {}

    def ask(text, seed):
        got[text] = client(small).audio.speech.create(model="x", voice="ryan", input=text, response_format="pcm",
                                                      extra_body={"seed": seed}).content

    with Server(held, ServiceOptions(concurrency=3, max_waiting=1)) as small:
        threads = [threading.Thread(target=ask, args=request) for request in requests]
        for thread in threads[:3]:
            thread.start()
        wait_for(lambda: health(small)["speaking"] == 3)
        threads[3].start()
        wait_for(lambda: health(small)["waiting"] == 1)
        with pytest.raises(openai.APIStatusError) as refused:
            client(small).audio.speech.create(model="x", voice="ryan", input="One too many.")
        assert "speaks 3 requests at a time, and 1 is waiting already" in refused.value.body["message"]
        assert health(small)["at_once"] == 3
        held.release.set()
        for thread in threads:
            thread.join(60)
    assert sorted(held.spoken[:3]) == sorted(text for text, _ in requests[:3]) and held.spoken[3] == "Fourth waits."
    for text, seed in requests:
        assert got[text] == pcm16(short_tts.synthesize(text, "ryan", seed=seed)).tobytes()


def test_a_concurrency_below_one_is_refused():
    with pytest.raises(ValueError, match="concurrency must be 1 or more requests spoken at once, got 0"):
        ServiceOptions(concurrency=0)


def wait_for(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_request_the_asgi_server_cancels_while_it_waits_gives_up_its_place(short_tts):
    """An ASGI server may cancel the request of a client that left, as Ray Serve's replicas do (uvicorn lets the
    handler see the client go instead): one cancelled while it waits frees its place at once and is never spoken."""
    held = HeldTTS(short_tts)
    app = create_app(held, ServiceOptions(concurrency=1, max_waiting=1))

    async def call(method: str, path: str, body: dict | None = None) -> list[dict]:
        """The ASGI messages the app sends for one request, whose client sends `body` and then waits."""
        data, sent, said = json.dumps(body or {}).encode(), [], []

        async def receive():
            if not sent:
                sent.append(data)
                return {"type": "http.request", "body": data, "more_body": False}
            await asyncio.Event().wait()  # the client neither speaks again nor leaves

        async def send(message):
            said.append(message)

        scope = {"type": "http", "http_version": "1.1", "method": method, "path": path, "raw_path": path.encode(),
                 "root_path": "", "scheme": "http", "query_string": b"", "server": ("127.0.0.1", 80),
                 "client": ("127.0.0.1", 1), "headers": [(b"content-type", b"application/json")]}
        await app(scope, receive, send)
        return said

    async def queue() -> dict:
        (start, body, *_) = await call("GET", "/health")
        return json.loads(body["body"])

    async def until(condition) -> None:
        deadline = time.monotonic() + 30
        while not condition(await queue()):
            assert time.monotonic() < deadline, "timed out"
            await asyncio.sleep(0.02)

    async def scenario() -> list[dict]:
        speech = {"model": "x", "voice": "ryan", "input": "First.", "response_format": "pcm"}
        first = asyncio.create_task(call("POST", "/v1/audio/speech", speech))
        await until(lambda q: q["speaking"] == 1)
        leaving = asyncio.create_task(call("POST", "/v1/audio/speech", {**speech, "input": "Never mind."}))
        await until(lambda q: q["waiting"] == 1)
        leaving.cancel()
        await until(lambda q: q["waiting"] == 0)
        with pytest.raises(asyncio.CancelledError):
            await leaving
        held.release.set()
        said = await first
        # the withdrawn request's thread looks at the queue once the engine is free, and tells this loop: it ends
        # before the loop does (a server's loop outlives it)
        for thread in threading.enumerate():
            if thread.name == "parley-serve-speech":
                await asyncio.to_thread(thread.join, 30)
        return said

    said = asyncio.run(scenario())
    assert said[0]["status"] == 200 and b"".join(m.get("body", b"") for m in said[1:])
    assert held.spoken == ["First."]
