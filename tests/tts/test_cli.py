"""`parley say` end to end: the real command in a subprocess on a generated tiny checkpoint, offline.

The runs that load the model start together in one fixture, so their start-up (importing torch and
transformers, ~3 s each) overlaps; each test then checks one run's exit code, stderr and files.
"""

import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest
import soundfile
import torch

from engine.models import DEFAULT_TTS_REPO

FRAMES = 6  # short_checkpoint stops at 6 frames (max_new_tokens=7)
FRAME_SAMPLES = 1920  # 80 ms at 24 kHz
TEXT = "Hello there."


def offline_env(folder):
    """The environment of an offline machine with nothing downloaded: PARLEY_MODELS and HF_HOME are empty folders."""
    # a cache path of its own would override HF_HOME, and a default model would override the lookup
    dropped = ("PARLEY_TTS_MODEL", "XDG_DATA_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    for name in ("models", "hf"):
        (folder / name).mkdir()
    env.update(PARLEY_MODELS=str(folder / "models"), HF_HOME=str(folder / "hf"), HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")  # one thread each: the runs share the CPU
    return env


def start(cwd, env, *args):
    """Start `parley say ARGS` (python -m engine.cli) in folder cwd; returns the Popen, text mode."""
    return subprocess.Popen([sys.executable, "-m", "engine.cli", "say", *map(str, args)], cwd=cwd, env=env,
                            text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(process, stdin="", timeout=120):
    """Wait for a started run: (exit code, stderr)."""
    _, err = process.communicate(stdin, timeout=timeout)
    return process.returncode, err


def parley(tmp_path, *args):
    """Run `parley say ARGS` to the end, offline, in a new empty folder: (exit code, stderr, that folder)."""
    cwd = tmp_path / "work"
    cwd.mkdir()
    return (*finish(start(cwd, offline_env(tmp_path), *args)), cwd)


@pytest.fixture(scope="module")
def runs(short_checkpoint, tmp_path_factory):
    """The runs that load the model, started together: name -> (exit code, stderr, the run's folder)."""
    env = offline_env(tmp_path_factory.mktemp("offline"))
    folders = {name: tmp_path_factory.mktemp(name) for name in ("argument", "stdin", "nobody")}
    common = ("--model", short_checkpoint, "--seed", 1, "--speaker", "ryan")
    started = {
        "argument": start(folders["argument"], env, TEXT, "--out", "speech.wav", *common),
        "stdin": start(folders["stdin"], env, "--out", "speech.wav", *common),
        "nobody": start(folders["nobody"], env, TEXT, "--out", "speech.wav", "--model", short_checkpoint,
                        "--speaker", "nobody"),
    }
    stdin = {"stdin": TEXT + "\n"}
    try:
        return {name: (*finish(p, stdin.get(name, "")), folders[name]) for name, p in started.items()}
    finally:
        for p in started.values():  # only after a failure is one still running
            if p.poll() is None:
                p.kill()
                p.wait()


def test_say_writes_a_24khz_mono_wav_and_reports_ttfc_and_rtf(runs):
    """`parley say TEXT --out F` exits 0, writes a 24 kHz mono WAV of the capped 6 frames, prints TTFC and RTF."""
    code, err, folder = runs["argument"]
    assert code == 0, err
    audio, rate = soundfile.read(folder / "speech.wav", dtype="float32")
    info = soundfile.info(folder / "speech.wav")
    assert rate == 24000 and info.channels == 1 and info.subtype == "PCM_16"
    assert audio.shape == (FRAMES * FRAME_SAMPLES,) and np.abs(audio).max() > 0
    assert re.search(r"TTFC \d+ ms, RTF \d+\.\d+", err), err
    assert sorted(p.name for p in folder.iterdir()) == ["speech.wav"]  # the temporary file was renamed


def test_say_reads_the_text_from_stdin_when_none_is_given(runs):
    """With no text argument the text comes from stdin: the same text and seed give the same samples."""
    code, err, folder = runs["stdin"]
    assert code == 0, err
    from_stdin, _ = soundfile.read(folder / "speech.wav", dtype="int16")
    from_argument, _ = soundfile.read(runs["argument"][2] / "speech.wav", dtype="int16")
    np.testing.assert_array_equal(from_stdin, from_argument)


def test_unknown_speaker_lists_the_valid_ones_and_leaves_no_file(runs, short_tts):
    """`--speaker nobody` exits non-zero naming every valid speaker, before the model loads, and leaves no file, not
    even a temporary one."""
    code, err, folder = runs["nobody"]
    assert code == 2
    assert "unknown speaker 'nobody'" in err and all(s in err for s in short_tts.speakers)
    assert "loaded" not in err and "Traceback" not in err
    assert list(folder.iterdir()) == []


def test_missing_model_folder_is_named_with_exit_code_2(tmp_path):
    """A --model folder that does not exist exits 2 with a message naming it, and no traceback."""
    code, err, cwd = parley(tmp_path, TEXT, "--out", "speech.wav", "--model", tmp_path / "nowhere")
    assert code == 2
    assert f"parley: {tmp_path / 'nowhere'}: no such model folder" in err and "Traceback" not in err
    assert list(cwd.iterdir()) == []


def test_missing_default_model_says_how_to_download_it(tmp_path):
    """Offline with empty model folders and no --model, the message names the default model and the download command."""
    code, err, cwd = parley(tmp_path, TEXT, "--out", "speech.wav")
    assert code == 2
    assert f"the speech model {DEFAULT_TTS_REPO} is not on this machine" in err
    local = tmp_path / "models" / DEFAULT_TTS_REPO.split("/")[1]
    assert f"hf download {DEFAULT_TTS_REPO} --local-dir {local}" in err
    assert "Traceback" not in err and list(cwd.iterdir()) == []


def test_output_folder_that_does_not_exist_is_named_before_loading(tmp_path, short_checkpoint):
    """--out in a missing folder exits 2 naming that folder, before any model is loaded, and creates nothing."""
    out = tmp_path / "no" / "such" / "speech.wav"
    code, err, cwd = parley(tmp_path, TEXT, "--out", out, "--model", short_checkpoint)
    assert code == 2
    assert f"cannot write {out}: the folder {out.parent} does not exist" in err
    assert "loaded" not in err and "Traceback" not in err  # failed before the model was loaded
    assert not (tmp_path / "no").exists() and list(cwd.iterdir()) == []


def test_nothing_to_speak_is_refused_before_loading(tmp_path, short_checkpoint):
    """Standard input with only spaces and control characters exits 2 saying there is nothing to speak, before any
    model is loaded, and writes nothing."""
    cwd = tmp_path / "work"
    cwd.mkdir()
    run = start(cwd, offline_env(tmp_path), "--out", "speech.wav", "--model", short_checkpoint)
    code, err = finish(run, stdin=" \t\x00\n \x1b\n")
    assert code == 2 and "parley: nothing to speak" in err
    assert "loaded" not in err and "Traceback" not in err and list(cwd.iterdir()) == []


def test_the_reported_seed_writes_its_wav_where_it_once_crashed_at_frame_67(tmp_path, tiny_checkpoint):
    """The report's command on the tiny checkpoint (`make-checkpoint --size tiny`, seed 0): its draw at frame 67 picked
    suppressed id 2897 and the codec's lookup raised IndexError; now it writes the whole WAV and exits 0."""
    code, err, cwd = parley(tmp_path, "Jumps brown dog fox the into the far a fox the the.", "--seed", 496234175,
                            "--speaker", "ryan", "--model", tiny_checkpoint, "--out", "x.wav")
    assert code == 0 and "Traceback" not in err and "parley: warning" not in err, err
    frames = soundfile.info(cwd / "x.wav").frames // FRAME_SAMPLES
    assert frames > 68, frames  # past the frame that failed


def test_emoji_alone_are_refused_before_loading_as_the_app_refuses_them(tmp_path, short_checkpoint):
    """`parley say` with only emoji exits 2 with the engine's one rule (the app's speak-as-written gives the same
    message, tests/test_dialogue.py), before any model is loaded."""
    code, err, cwd = parley(tmp_path, "😀🎉👍", "--out", "speech.wav", "--model", short_checkpoint)
    assert code == 2 and "parley: nothing to speak: the text has no letters or digits" in err
    assert "loaded" not in err and "Traceback" not in err and list(cwd.iterdir()) == []


def test_a_long_text_tells_its_length_and_progress_and_ctrl_c_keeps_what_was_written(tmp_path, short_checkpoint):
    """A text of many parts: `parley say` says how many and about how long, a line a finished part (stderr is not a
    terminal here), and on Ctrl-C exits 130 saying how much it kept: a valid WAV of whole frames, no temporary file."""
    cwd = tmp_path / "work"
    cwd.mkdir()
    run = start(cwd, offline_env(tmp_path), "--out", "speech.wav", "--model", short_checkpoint, "--seed", 3)
    run.stdin.write("This sentence is one of very many in a long text. " * 400)
    run.stdin.close()
    lines = []
    try:
        while not lines or "part 2 of 50 done" not in lines[-1]:
            lines.append(run.stderr.readline())
            assert lines[-1], "".join(lines)  # the run ended before its second part
        run.send_signal(signal.SIGINT)
        code = run.wait(timeout=60)
    finally:
        run.kill()
    err = "".join(lines) + run.stderr.read()
    assert code == 130, err
    assert re.search(r"parley: 19,999 characters in 50 parts, about 2\d:\d\d of speech; Ctrl-C stops and keeps what "
                     r"is written in speech.wav", err), err
    assert "parley: part 1 of 50 done, 0 s of speech" in err and "Traceback" not in err  # 6 frames: 0.48 s
    kept = re.search(r"parley: stopped; kept (\d+) s of speech in speech.wav", err)
    assert kept, err
    audio, rate = soundfile.read(cwd / "speech.wav", dtype="float32")
    assert rate == 24000 and audio.size >= 2 * FRAMES * FRAME_SAMPLES and audio.size % FRAME_SAMPLES == 0
    assert abs(audio.size / rate - int(kept[1])) <= 0.5
    assert [p.name for p in cwd.iterdir()] == ["speech.wav"]


def test_say_speaks_with_the_model_and_voice_chosen_in_the_app_unless_a_flag_says_otherwise(tmp_path,
                                                                                               short_checkpoint):
    """The app's settings file names the model, the speaker and the CPU's speech precision: `parley say` with neither
    flag uses them; --speaker overrides the file's; a speaker saved for another model gives way to this one's first,
    with a warning."""
    from PySide6.QtCore import QSettings

    env = offline_env(tmp_path)
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    settings = QSettings(str(tmp_path / "config" / "Parley" / "Parley.conf"), QSettings.Format.IniFormat)
    settings.setValue("models/tts", str(short_checkpoint))
    settings.setValue("voice/speaker", "vivian")
    settings.setValue("engine/speech_precision", "float32")
    settings.sync()
    runs = {}
    for name, flags in (("file", ()), ("flag", ("--speaker", "ryan"))):
        (tmp_path / name).mkdir()
        runs[name] = finish(start(tmp_path / name, env, TEXT, "--out", "speech.wav", *flags))
    settings.setValue("voice/speaker", "somebody")
    settings.sync()
    (tmp_path / "other").mkdir()
    runs["other"] = finish(start(tmp_path / "other", env, TEXT, "--out", "speech.wav"))
    for name, (code, err) in runs.items():
        assert code == 0 and f"loaded {short_checkpoint} on cpu (float32) in " in err, (name, err)
    assert "speech by vivian" in runs["file"][1] and "speech by ryan" in runs["flag"][1]
    assert "parley: warning: this speech model has no voice 'somebody'" in runs["other"][1]
    assert "speech by aiden" in runs["other"][1]  # the model's first


@pytest.mark.parametrize("option, value, message", [
    ("--device", "gpu", "argument --device: 'gpu' is not a device; choose cpu, cuda or cuda:N"),
    ("--dtype", "int8", "argument --dtype: invalid choice: 'int8'"),
])
def test_a_bad_device_or_dtype_is_a_usage_error(tmp_path, short_checkpoint, option, value, message):
    """--device or --dtype the engine cannot take exits 2 with the usage and the choices, no traceback."""
    code, err, cwd = parley(tmp_path, TEXT, "--out", "speech.wav", "--model", short_checkpoint, option, value)
    assert code == 2 and message in err and "usage: parley say" in err
    assert "Traceback" not in err and list(cwd.iterdir()) == []


def test_output_path_that_is_a_folder_is_refused_before_loading(tmp_path, short_checkpoint):
    """--out naming an existing folder exits 2 with a clear message, before any model is loaded."""
    out = tmp_path / "a_folder"
    out.mkdir()
    code, err, _ = parley(tmp_path, TEXT, "--out", out, "--model", short_checkpoint)
    assert code == 2 and f"cannot write {out}: it is a folder" in err
    assert "loaded" not in err and "Traceback" not in err and list(out.iterdir()) == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_first_say_on_the_gpu_says_it_compiles_the_kernel_and_speaks(tmp_path, short_checkpoint):
    """`parley say --device cuda` with no kernel built yet (an empty cache folder) and no ninja on PATH (as an
    environment used without activating it): it says it compiles the GPU kernel, builds it with the ninja package's
    copy, and speaks, with no warning of Parley's."""
    env = offline_env(tmp_path)
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    env["PATH"] = os.pathsep.join(d for d in env.get("PATH", "").split(os.pathsep)
                                  if d and not os.path.exists(os.path.join(d, "ninja")))
    cwd = tmp_path / "work"
    cwd.mkdir()
    run = start(cwd, env, TEXT, "--out", "speech.wav", "--model", short_checkpoint, "--device", "cuda",
                "--speaker", "ryan", "--seed", 1)
    code, err = finish(run, timeout=600)  # the compile takes about a minute
    assert code == 0, err
    assert "parley: compiling the GPU kernel (first use of this version" in err, err
    assert "parley: warning" not in err, err  # the build did not fail: speech ran in the kernel
    assert re.search(r"loaded .* on cuda", err), err
    pcm, rate = soundfile.read(cwd / "speech.wav")
    assert rate == 24000 and len(pcm) == FRAMES * FRAME_SAMPLES and np.abs(pcm).max() > 0
