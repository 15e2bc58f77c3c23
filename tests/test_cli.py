"""`parley chat --text` end to end: the real command in a subprocess, speaking into PulseAudio's null sink."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (see DESIGN.md section 6)")


def run_chat(tmp_path, stdin, *args):
    """Run `parley chat ARGS` with `stdin`, its history under tmp_path: (exit code, stdout, stderr)."""
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path / "data"), "OMP_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "engine.cli", "chat", *map(str, args)], input=stdin, env=env,
                          capture_output=True, text=True, timeout=180)
    return done.returncode, done.stdout, done.stderr


def test_chat_prints_and_speaks_each_reply_with_its_figures(sound_server, short_checkpoint, tmp_path):
    """Each typed line gets a printed reply and a line of figures on stderr; the turns are saved."""
    from engine.history import HistoryStore, history_path

    code, out, err = run_chat(tmp_path, "Name three colors.\n", "--text", "--model", short_checkpoint,
                              "--speaker", "ryan")
    assert code == 0, err
    assert out.strip()
    assert "llm_ttft_ms" in err and "tts_ttfc_ms" in err and "tts_rtf" in err
    with HistoryStore(history_path("default", tmp_path / "data" / "parley" / "history")) as history:
        (conversation,) = history.list_conversations()
        assert conversation.turn_count == 2


def test_chat_names_a_missing_llm_file(sound_server, short_checkpoint, tmp_path):
    """A --llm path that does not exist fails with exit code 2 and a message naming the file."""
    missing = tmp_path / "nope.gguf"
    code, _, err = run_chat(tmp_path, "", "--text", "--model", short_checkpoint, "--llm", missing)
    assert code == 2 and f"{missing} does not exist" in err
