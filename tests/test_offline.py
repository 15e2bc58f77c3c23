"""The privacy promise, checked: with the models on disk, loading them and holding a spoken and a typed
turn (Whisper, SmolLM2, Qwen3-TTS, the speakers, the history file) opens no network connection.

A socket guard in this process refuses and records every attempt to reach a network address (IPv4,
IPv6) or to resolve a host name; local unix sockets stay allowed. Libraries that phone home (hub
clients, telemetry) do it from Python, so the guard sees them.
"""

import socket

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")


@pytest.fixture
def no_network(monkeypatch):
    """Every network connection or name lookup raises and is recorded in the returned list."""
    attempts = []

    def refuse(what):
        attempts.append(what)
        raise OSError(f"network access attempted in an offline test: {what}")

    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex

    def connect(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6):
            refuse(f"connect {address}")
        return real_connect(self, address)

    def connect_ex(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6):
            refuse(f"connect_ex {address}")
        return real_connect_ex(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, *a, **k: refuse(f"getaddrinfo {host}"))
    monkeypatch.setattr(socket, "gethostbyname", lambda host: refuse(f"gethostbyname {host}"))
    monkeypatch.setattr(socket, "create_connection", lambda address, *a, **k: refuse(f"create_connection {address}"))
    return attempts


def test_the_guard_catches_a_connection(no_network):
    """The guard itself works: a plain TCP connection is refused and recorded."""
    with pytest.raises(OSError, match="offline test"):
        socket.create_connection(("huggingface.co", 443), timeout=1)
    with socket.socket() as s, pytest.raises(OSError, match="offline test"):
        s.connect(("127.0.0.1", 9))
    assert len(no_network) == 2


def test_loading_the_models_and_a_spoken_and_typed_turn_stay_offline(
        no_network, short_checkpoint, whisper_dir, smollm2_path, sound_server, speak, tmp_path):
    """Every model is loaded under the guard, then a voice turn and a typed turn run: no attempt at all."""
    from engine.audio import Player
    from engine.history import HistoryStore
    from engine.llm.chat import ChatModel, ChatOptions
    from engine.dialogue import Dialogue, DialogueOptions
    from engine.stt import Transcriber, TranscriberOptions
    from engine.tts import load_tts

    tts = load_tts(short_checkpoint)
    transcriber = Transcriber(whisper_dir, TranscriberOptions(device="cpu", cpu_threads=2))
    chat = ChatModel(smollm2_path, ChatOptions(n_ctx=512, max_tokens=16, n_threads=1, temperature=0.0))
    with Player() as player, HistoryStore(tmp_path / "history.sqlite3") as history:
        dialogue = Dialogue(chat, tts, player, history, transcriber,
                            options=DialogueOptions(speaker="ryan", tts_seed=1))
        spoken = dialogue.voice_turn(speak("Tell me about the weather today."))
        typed = dialogue.text_turn("Thank you.")
    assert "weather" in spoken.user_text.lower() and spoken.reply_text and typed.reply_text
    assert no_network == []
