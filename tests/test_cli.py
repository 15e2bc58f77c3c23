"""`parley chat --text` and `parley say` on the speakers, end to end: the real command in a subprocess,
speaking into PulseAudio's null sink."""

import os
import subprocess
import sys

import pytest

def run_chat(tmp_path, stdin, *args):
    """Run `parley chat ARGS` with `stdin`, its history under tmp_path: (exit code, stdout, stderr)."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (see DESIGN.md section 6)")
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


def test_say_without_out_plays_through_the_player(sound_server, short_checkpoint, tmp_path):
    """`parley say` with no --out speaks on the default device and reports TTFC and RTF, writing no file."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "engine.cli", "say", "Out loud.", "--model", str(short_checkpoint),
                           "--seed", "1"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert "played on" in done.stderr and "0.48 s of speech" in done.stderr and "TTFC" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_say_names_an_output_device_that_does_not_exist(sound_server, short_checkpoint, tmp_path):
    """--output-device naming no device exits 2 with a message listing the devices, and no traceback."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "engine.cli", "say", "Hi.", "--model", str(short_checkpoint),
                           "--output-device", "no-such-speaker"], env=env, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 2 and "no-such-speaker" in done.stderr and "Traceback" not in done.stderr
