"""A speech engine on another computer: a Parley speech server (engine/speech_server.py, `parley serve`) reached over
HTTP, with what the Dialogue and the Assistant use of a local TTSEngine (engine/tts/stream.py).

`connect_tts(url, token)` asks the server's `GET /v1/voices` what it speaks (model, speakers, languages);
`RemoteTTS.stream` checks the voice here by the engine's own rule (engine/tts/prompt.py resolve_voice), then posts the
text to `POST /v1/audio/speech` as 16-bit PCM and yields a Chunk as each piece arrives, stamped on arrival, so the
TTFC and RTF of engine/metrics.py are measured here, the network included. Cancelling closes the connection, which
the server takes as its client leaving: it stops the synthesis, or gives up the request's place in its queue.
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit

import numpy as np

from engine.errors import InputTextError, SpeechServerError
from engine.speech_server import MAX_INPUT_CHARS
from engine.text import clean_text
from engine.tts.prompt import Voice, resolve_voice
from engine.tts.sampling import new_seed
from engine.tts.stream import Chunk, TTSStream

log = logging.getLogger(__name__)

__all__ = ["RemoteTTS", "ServedModel", "connect_tts"]

CONNECT_TIMEOUT_S = 5.0  # a server on the network answers a connection in milliseconds; beyond this it is not there
# between two pieces of a response: a request waits in the server's queue until its turn (up to 8 utterances of a few
# seconds each ahead of it, by `parley serve`'s default), and a GPU's first chunk of a long clause takes < 1 s
READ_TIMEOUT_S = 60.0
BUSY_RETRY_S = (0.5, 1.0, 2.0)  # the waits before asking a busy server (429) again; then the turn fails
READ_BYTES = 1 << 16


@dataclass(frozen=True)
class ServedModel:
    """The model a speech server speaks, from its GET /v1/voices: what resolve_voice reads of a TTSConfig, so a
    voice is checked here, with the engine's words, before any text is sent.

    name: the model's folder name on the server (its /v1/models id). model_type: "custom_voice", "voice_design" or
    "base". model_size: "0b6" or "1b7". speakers, languages: the names it takes ("auto" among the languages)."""

    name: str
    model_type: str
    model_size: str
    speakers: tuple[str, ...]
    languages: tuple[str, ...]
    sample_rate_hz: int

    @property
    def default_speaker(self) -> str | None:
        """The speaker used when a caller names none: the model's first, or None (VoiceDesign)."""
        return self.speakers[0] if self.speakers else None

    @classmethod
    def from_json(cls, data: dict, url: str) -> ServedModel:
        try:
            return cls(str(data["model"]), str(data["model_type"]), str(data["model_size"]),
                       tuple(map(str, data["speakers"])), tuple(map(str, data["languages"])),
                       int(data["sample_rate_hz"]))
        except (KeyError, TypeError, ValueError) as e:
            raise SpeechServerError(f"{url} answered GET /v1/voices without what a Parley speech server says ({e!r} "
                                    "is missing or wrong); is it a Parley of another version?") from None


class RemoteTTS:
    """A Parley speech server as a speech engine: the model's speakers and languages, speech as a stream.

    url: the server's address (scheme, host and port, without /v1). Its `folder` is the server's model by name (a
    Path, as a local engine's, for what shows it: nothing of it is on this computer). Cloned voices stay on the
    computer that made them: the server speaks its model's own voices only.
    """

    def __init__(self, server: _Server, model: ServedModel):
        self.url, self._server, self.config = server.url, server, model
        self.folder = Path(model.name)
        self.megakernel_problem = None  # the server's kernel is its own affair
        self.speaker_encoder = None  # no cloning here: a saved voice is cloned with a Base model on this computer

    @property
    def speakers(self) -> list[str]:
        return list(self.config.speakers)

    @property
    def languages(self) -> list[str]:
        return list(self.config.languages)

    @property
    def sample_rate_hz(self) -> int:
        return self.config.sample_rate_hz

    @property
    def default_speaker(self) -> str | None:
        return self.config.default_speaker

    def resolve_voice(self, speaker: str | None, language: str | None = "auto", instruct: str | None = None,
                      voice=None) -> Voice:
        """Check a voice against the server's model without speaking, as TTSEngine.resolve_voice does.

        Raises:
            InputTextError: an unknown speaker or language (listing the valid ones), a style the model does not
                take, or a cloned voice (the server speaks its own voices only).
        """
        if voice is not None:
            raise InputTextError(f"a saved voice is spoken on this computer only; the speech server at {self.url} "
                                 "speaks its model's own voices")
        return resolve_voice(self.config, speaker, language, instruct)

    def stream(self, text: str, speaker: str | None = None, language: str | None = "auto", *,
               instruct: str | None = None, voice=None, seed: int | None = None) -> TTSStream:
        """Speak `text` on the server; returns a lazy stream of Chunks (float32 at sample_rate_hz), as
        TTSEngine.stream. The request is sent when iteration starts; `seed` None draws one here, which the stream's
        `seed` tells, as a local engine's does (the server gives the same audio for the same seed and text).

        Raises (at once):
            InputTextError: empty or over-long text, or a voice the server's model does not take.
        Raises (while iterating):
            SpeechServerError: the server cannot be reached, refuses the token, stays busy, or goes away
                mid-sentence; the message names the address.
        """
        resolved = self.resolve_voice(speaker, language, instruct, voice)
        text = clean_text(text)
        if len(text) > MAX_INPUT_CHARS:
            raise InputTextError(f"the speech server takes at most {MAX_INPUT_CHARS:,} characters at a time; "
                                 f"this text has {len(text):,}")
        seed = new_seed() if seed is None else int(seed)
        body = {"model": self.config.name, "input": text, "voice": resolved.speaker, "language": resolved.language,
                "instructions": resolved.instruct, "response_format": "pcm", "seed": seed}
        return RemoteStream(self._server, body, seed)

    def synthesize(self, text: str, speaker: str | None = None, language: str | None = "auto",
                   **options) -> np.ndarray:
        """The whole utterance as one float32 array at sample_rate_hz (stream() joined)."""
        chunks = [c.pcm for c in self.stream(text, speaker, language, **options)]
        return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.float32)


class _Server:
    """A speech server's address and token, and its requests: one connection each, so cancelling one shuts only
    its own (the few milliseconds of a new connection on a network are small beside a clause's synthesis)."""

    def __init__(self, url: str, token: str | None):
        self.url, self._token = url, token

    def open(self, method: str, path: str, body: dict | None = None, cancelled: threading.Event | None = None,
             on_connect=None) -> tuple[http.client.HTTPResponse, socket.socket]:
        """A request's response with a 200 status, and its connection's socket (the caller closes both); a busy
        server (429) is asked again after each of BUSY_RETRY_S, unless `cancelled` is set meanwhile. `on_connect`
        gets each socket once it is connected, for a cancel from another thread to shut.

        Raises:
            SpeechServerError: the server cannot be reached, refuses the token, stays busy, or answers an error.
            InputTextError: the server refuses the text or the voice (400), in its words.
        """
        for wait_s in (*BUSY_RETRY_S, None):
            response, sock = self._send(method, path, body, on_connect)
            if response.status == 200:
                return response, sock
            error = self._error(response)
            sock.close()
            if response.status != 429 or wait_s is None:
                raise error
            log.info("the speech server at %s is busy; asking again in %.1f s", self.url, wait_s)
            if cancelled is not None and cancelled.wait(wait_s):
                raise error
            if cancelled is None:
                time.sleep(wait_s)
        raise AssertionError("unreachable: the last try returns or raises")

    def _send(self, method: str, path: str, body: dict | None, on_connect) -> tuple[http.client.HTTPResponse,
                                                                                   socket.socket]:
        parts = urlsplit(self.url)
        kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        connection = kind(parts.hostname, parts.port, timeout=CONNECT_TIMEOUT_S)
        headers = {"Accept": "application/json" if body is None else "audio/pcm"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        data = None if body is None else json.dumps(body).encode()
        if data is not None:
            headers["Content-Type"] = "application/json"
        try:
            connection.connect()
            sock = connection.sock
            sock.settimeout(READ_TIMEOUT_S)
            if on_connect is not None:
                on_connect(sock)
            connection.request(method, parts.path + path, body=data, headers=headers)
            return connection.getresponse(), sock
        except (OSError, http.client.HTTPException) as e:
            connection.close()
            raise SpeechServerError(f"cannot reach the speech server at {self.url} ({_reason(e)}); is parley serve "
                                    "running there, and is the address right?") from None

    def _error(self, response: http.client.HTTPResponse) -> Exception:
        """The error a response other than 200 means, in the server's words where it sent the API's error shape."""
        try:
            said = json.loads(response.read(READ_BYTES))["error"]["message"]
        except (OSError, http.client.HTTPException, ValueError, KeyError, TypeError):
            said = None
        status = f"{response.status} {response.reason}"
        if response.status == 401:
            if not self._token:
                return SpeechServerError(f"the speech server at {self.url} needs a token: give the one parley serve "
                                         "was started with (its --token or PARLEY_API_TOKEN)")
            return SpeechServerError(f"the speech server at {self.url} refused the token ({status}); give the one "
                                     "parley serve was started with (its --token or PARLEY_API_TOKEN)")
        if response.status == 429:
            return SpeechServerError(f"the speech server at {self.url} is still busy after "
                                     f"{len(BUSY_RETRY_S) + 1} tries ({said or status}); try again shortly")
        if said is None:
            return SpeechServerError(f"{self.url} is not a Parley speech server ({status} with no error message "
                                     "of the OpenAI API's shape); give the address parley serve printed")
        if response.status == 400:
            return InputTextError(f"the speech server refused this: {said}")
        return SpeechServerError(f"the speech server at {self.url} failed ({status}): {said}")


class RemoteStream(TTSStream):
    """A TTSStream whose chunks come from a speech server: cancel() also shuts the connection, so a read waiting for
    the next piece ends at once and the server sees its client leave."""

    def __init__(self, server: _Server, body: dict, seed: int):
        self._server, self._body = server, body
        self._socket: socket.socket | None = None
        self._socket_lock = threading.Lock()
        super().__init__(self._run, seed, 1)

    def cancel(self) -> None:
        super().cancel()
        with self._socket_lock:
            sock = self._socket
        if sock is not None:
            _shut(sock)

    def _connected(self, sock: socket.socket) -> None:
        with self._socket_lock:
            self._socket = sock
        if self.cancelled:  # cancel() came while it was connecting
            _shut(sock)

    def _run(self, cancelled: threading.Event, stream: TTSStream) -> Iterator[Chunk]:
        if cancelled.is_set():
            return
        server = self._server
        try:
            response, sock = server.open("POST", "/v1/audio/speech", self._body, cancelled, self._connected)
        except SpeechServerError:
            if cancelled.is_set():  # the shut connection, not the server
                return
            raise
        rest = b""  # an odd byte: half of a sample whose other half comes with the next piece
        try:
            while not cancelled.is_set():
                try:
                    data = response.read1(READ_BYTES)
                except (OSError, http.client.HTTPException) as e:
                    if cancelled.is_set():
                        return
                    raise SpeechServerError(f"the speech server at {server.url} stopped answering mid-sentence "
                                            f"({_reason(e)}); the rest of this reply is not spoken") from None
                if not data:
                    return
                data, rest = rest + data, b""
                if len(data) % 2:
                    data, rest = data[:-1], data[-1:]
                if data:
                    pcm = np.frombuffer(data, "<i2").astype(np.float32) / 32767.0  # engine/audio/wav.py pcm16's scale
                    yield Chunk(pcm=pcm, codes=np.zeros((0, 16), np.int64), segment=0, t_ready=time.perf_counter())
        finally:
            with self._socket_lock:
                self._socket = None
            response.close()
            sock.close()


def connect_tts(url: str, token: str | None = None) -> RemoteTTS:
    """A Parley speech server as a speech engine, once it has said what it speaks.

    Args:
        url: its address, e.g. http://192.168.1.20:8000 (`parley serve` prints it; a trailing /v1, as OpenAI's
            clients take it, is allowed).
        token: the bearer token the server was started with; None or "" for a server on this computer without one.
    Raises:
        SpeechServerError: a URL that is no http(s) address, a server that cannot be reached, refuses the token, is
            not a Parley speech server, or runs a Base model (which speaks only cloned voices, and cannot be sent one).
    """
    address = url.strip().rstrip("/").removesuffix("/v1")
    parts = urlsplit(address)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SpeechServerError(f"{url!r} is not a speech server's address; give one such as "
                                "http://192.168.1.20:8000, as parley serve prints it")
    try:
        parts.port
    except ValueError:
        raise SpeechServerError(f"{url!r} has no valid port; give one such as http://192.168.1.20:8000") from None
    server = _Server(address, token or None)
    response, sock = server.open("GET", "/v1/voices")
    try:
        data = json.loads(response.read())
    except (OSError, http.client.HTTPException, ValueError):
        raise SpeechServerError(f"{address} is not a Parley speech server (GET /v1/voices answered no JSON); give "
                                "the address parley serve printed") from None
    finally:
        response.close()
        sock.close()
    if not isinstance(data, dict) or data.get("object") != "parley.voices":
        raise SpeechServerError(f"{address} is not a Parley speech server (GET /v1/voices answered no voices); give "
                                "the address parley serve printed")
    model = ServedModel.from_json(data, address)
    if model.model_type == "base":
        raise SpeechServerError(f"the speech server at {address} runs a Base model ({model.name}), which speaks only "
                                "voices cloned from a recording, and none can be sent to it; serve a CustomVoice or "
                                "VoiceDesign model")
    return RemoteTTS(server, model)


def _shut(sock: socket.socket) -> None:
    """End a connection from another thread: a read blocked on it returns at once (close() alone would not wake it)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # already closed, or the peer went first
        pass


def _reason(error: BaseException) -> str:
    """An OS or HTTP error in a few words: "connection refused", "timed out", ..."""
    if isinstance(error, socket.timeout):
        return "no answer in time"
    if isinstance(error, http.client.IncompleteRead):
        return "the connection closed before the end of the audio"
    if isinstance(error, OSError) and error.strerror:
        return error.strerror.lower()
    return str(error) or type(error).__name__
