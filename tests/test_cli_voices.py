"""`parley voice` and `parley say --voice` end to end: the real commands in subprocesses, offline, on the tiny Base
checkpoint, an espeak-ng recording, the bundled Whisper base and data and settings folders of the test's own; and
`parley models --cloning` fetching the Base model from a local stand-in for the hub."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest
import soundfile

from tests.conftest import HEARD_REFERENCE, REFERENCE_TEXT


@pytest.fixture(scope="module")
def home(tmp_path_factory, whisper_dir, short_base_checkpoint):
    """A user's folders: data (saved voices), settings naming the Whisper and Base models, empty model folders."""
    root = tmp_path_factory.mktemp("home")
    (root / "config" / "Parley").mkdir(parents=True)
    (root / "config" / "Parley" / "Parley.conf").write_text(
        f"[models]\nstt={whisper_dir}\nbase={short_base_checkpoint}\n", encoding="utf-8")
    for name in ("models", "hf", "data"):
        (root / name).mkdir()
    return root


def env_of(home, **more):
    dropped = ("PARLEY_TTS_MODEL", "PARLEY_BASE_MODEL", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env.update(XDG_DATA_HOME=str(home / "data"), XDG_CONFIG_HOME=str(home / "config"),
               PARLEY_MODELS=str(home / "models"), HF_HOME=str(home / "hf"), HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")
    return {**env, **more}


def start(home, *args, cwd=None, **env):
    """Start `parley ARGS` (python -m engine.cli) as a user runs it; returns the Popen."""
    return subprocess.Popen([sys.executable, "-m", "engine.cli", *map(str, args)], env=env_of(home, **env), cwd=cwd,
                            text=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(process, timeout=180):
    """(exit code, stdout, stderr) of a started run."""
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def parley(home, *args, **env):
    return finish(start(home, *args, **env))


def test_a_voice_is_cloned_listed_spoken_and_removed_from_the_command_line(home, reference_wav, short_base_checkpoint,
                                                                           tmp_path):
    """voice add without --text: Whisper's transcript is printed and kept; voice list shows it; say --voice writes
    the speech TTSEngine.stream gives in that voice with the same seed; voice remove deletes it."""
    from engine.tts import load_tts
    from engine.voice_library import VoiceLibrary

    code, out, err = parley(home, "voice", "add", "Grandma Ann", "--audio", reference_wav)
    assert code == 0, err
    assert f'parley: heard "{HEARD_REFERENCE}" (give --text if the recording says something else)' in err
    path = home / "data" / "parley" / "voices" / "grandma-ann.voice"
    assert out == (f"saved the voice 'Grandma Ann' (in-context, 0.6B Base) in {path}; speak in it with: parley say "
                   "--voice 'Grandma Ann' \"TEXT\"\n")

    code, out, err = parley(home, "voice", "add", "Bob", "--audio", reference_wav, "--mode", "x_vector")
    assert code == 0 and "heard" not in err, err
    code, out, err = parley(home, "voice", "list")
    assert code == 0, err
    bob, ann, summary = out.splitlines()  # by name
    assert ann.startswith("Grandma Ann  in-context  0.6B Base  ") and ann.endswith(f'"{HEARD_REFERENCE}"')
    assert bob.startswith("Bob          x-vector    0.6B Base  20")
    assert summary.startswith("(2 voices, ") and summary.endswith(f" in {path.parent})")

    code, out, err = parley(home, "say", "Hello there.", "--voice", "grandma ann", "--seed", 1, "--out",
                            tmp_path / "ann.wav")
    assert code == 0, err
    assert "0.48 s of speech by the saved voice 'Grandma Ann' (seed 1)" in err
    pcm, rate = soundfile.read(tmp_path / "ann.wav", dtype="float32")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_DATA_HOME", str(home / "data"))
        voice = VoiceLibrary().load("Grandma Ann")
    expected = load_tts(short_base_checkpoint).synthesize("Hello there.", voice=voice, seed=1)
    assert rate == 24_000 and pcm.shape == expected.shape == (6 * 1920,)
    np.testing.assert_allclose(pcm, np.clip(expected, -1, 1), atol=1 / 32768 + 1e-6, rtol=0)  # 16-bit

    code, out, err = parley(home, "voice", "rename", "bob", "Robert")
    assert code == 0 and out.startswith("renamed to 'Robert' ("), err
    for name in ("GRANDMA ANN", "Robert"):
        code, out, err = parley(home, "voice", "remove", name)
        assert code == 0 and out.startswith("removed the saved voice "), err
    code, out, _ = parley(home, "voice", "list")
    assert code == 0 and out.startswith(f"No saved voices in {path.parent}; clone one with: parley voice add NAME")


@pytest.fixture(scope="module")
def clips(tmp_path_factory, speak):
    """Recordings that cannot be cloned from, as files: too short, too long, silent, clipped, and no audio at all."""
    folder = tmp_path_factory.mktemp("clips")
    speech = speak(REFERENCE_TEXT)
    soundfile.write(folder / "short.wav", speech[:16_000 * 2], 16_000)
    soundfile.write(folder / "long.wav", np.tile(speech, 6), 16_000)
    soundfile.write(folder / "silent.wav", np.zeros(16_000 * 5, np.float32), 16_000)
    soundfile.write(folder / "clipped.wav", np.clip(speech * 20, -1, 1), 16_000)
    (folder / "notes.wav").write_text("not audio")
    return folder


def test_every_bad_input_is_refused_with_a_clear_message_and_exit_code_2(home, reference_wav, clips, tmp_path):
    """Unusable recordings, names, voices and models: each exits 2 with the engine's message and no traceback; usage
    errors are argparse's. The runs start together (their start-up overlaps); none loads a model."""
    seeded = parley(home, "voice", "add", "Ann", "--audio", reference_wav, "--mode", "x_vector")
    assert seeded[0] == 0, seeded[2]
    empty = tmp_path / "empty"  # no settings: the Base model is looked for where Parley downloads it
    (empty / "config").mkdir(parents=True)
    cases = {
        "missing file": (("voice", "add", "Bob", "--audio", clips / "none.wav"), r"none\.wav: no such file"),
        "too short": (("voice", "add", "Bob", "--audio", clips / "short.wav"),
                      r"short\.wav: the recording is 2\.0 s long; a voice is cloned from 3 to 30 s of speech"),
        "too long": (("voice", "add", "Bob", "--audio", clips / "long.wav"), r"the recording is 3\d\.\d s long"),
        "silent": (("voice", "add", "Bob", "--audio", clips / "silent.wav"), r"the recording is silent"),
        "clipped": (("voice", "add", "Bob", "--audio", clips / "clipped.wav"), r"the recording is clipped"),
        "not audio": (("voice", "add", "Bob", "--audio", clips / "notes.wav"),
                      r"notes\.wav: not an audio file Parley can read"),
        "taken name": (("voice", "add", "ANN", "--audio", reference_wav),
                       r"there is already a saved voice named 'Ann'; choose another name, or replace it"),
        "empty name": (("voice", "add", " ", "--audio", reference_wav), r"a saved voice needs a name"),
        "no such model": (("voice", "add", "Bob", "--audio", reference_wav, "--model", tmp_path / "nope"),
                          r"nope: no such model folder"),
        "unknown voice": (("say", "Hi.", "--voice", "Zed", "--out", tmp_path / "x.wav"),
                          r"no saved voice is named 'Zed'; the saved voices are: Ann"),
        "remove unknown": (("voice", "remove", "Zed"), r"no saved voice is named 'Zed'; the saved voices are: Ann"),
        "voice and speaker": (("say", "Hi.", "--voice", "Ann", "--speaker", "ryan"),
                              r"argument --speaker: not allowed with argument --voice"),
        "bad mode": (("voice", "add", "Bob", "--audio", reference_wav, "--mode", "xvector"),
                     r"argument --mode: invalid choice: 'xvector'"),
    }
    started = {name: start(home, *args) for name, (args, _) in cases.items()}
    started["no base model"] = start(home, "voice", "add", "Bob", "--audio", reference_wav,
                                     XDG_CONFIG_HOME=str(empty / "config"))
    started["style for a saved voice"] = start(home, "say", "Hi.", "--voice", "Ann", "--instruct", "cheerful")
    try:
        results = {name: finish(process) for name, process in started.items()}
    finally:
        for process in started.values():  # only after a failure is one still running
            if process.poll() is None:
                process.kill()
                process.wait()
    for name, (_, message) in cases.items():
        code, _, err = results[name]
        assert code == 2 and "Traceback" not in err, (name, err)
        assert re.search(message, err), (name, err)
    code, _, err = results["no base model"]
    local = home / "models" / "Qwen3-TTS-12Hz-0.6B-Base"
    assert code == 2 and ("parley: the voice-cloning model Qwen/Qwen3-TTS-12Hz-0.6B-Base is not on this machine "
                          f"(looked in {local} and the Hugging Face cache). Download it (about 2 GB) with:\n"
                          f"  hf download Qwen/Qwen3-TTS-12Hz-0.6B-Base --local-dir {local}\n") in err
    code, _, err = results["style for a saved voice"]
    assert code == 2 and "a Base model has no built-in speakers and takes no speaking style" in err
    code, out, _ = parley(home, "voice", "list")
    assert [line.split()[0] for line in out.splitlines()[:-1]] == ["Ann"]  # nothing else was saved


def test_models_lists_the_cloning_model_and_fetches_it_when_asked(home, base_checkpoint, tiny_checkpoint,
                                                                   smollm2_path, tmp_path, monkeypatch, capsys):
    """`parley models` says whether the voice-cloning model is here and, missing, how to get it (not among the
    recommended downloads); `--download --cloning` fetches it with the others, from a local hub, into Parley's models
    folder, where saved voices find it."""
    from engine.catalogue import CLONING, recommended, this_machine
    from engine.cli import main
    from engine.models import DEFAULT_TTS_REPO, find_base_model
    from tests.app.fake_hub import FakeHub, repo_files

    monkeypatch.setenv("PARLEY_MODELS", str(tmp_path / "models"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("PARLEY_BASE_MODEL", raising=False)
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert ("Voice cloning (Base model, for saved voices): missing. The voice-cloning model "
            "Qwen/Qwen3-TTS-12Hz-0.6B-Base is not on this machine") in out
    assert ("To clone voices: Qwen3-TTS 0.6B Base (about 2 GB, Apache-2.0), clones a voice from a few seconds of "
            "speech, and speaks in your saved voices; parley models --download --cloning fetches it") in out
    llm = recommended(this_machine())["llm"]
    repos = {DEFAULT_TTS_REPO: repo_files(tiny_checkpoint), CLONING.repo_id: repo_files(base_checkpoint),
             llm.repo_id: {llm.files[0]: smollm2_path.read_bytes()}}
    with FakeHub(repos) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        assert main(["models", "--download", "--cloning"]) == 0
    assert f"{CLONING.name}: done: {CLONING.download_folder()}" in capsys.readouterr().err
    assert find_base_model() == tmp_path / "models" / "Qwen3-TTS-12Hz-0.6B-Base"
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "Voice cloning (Base model, for saved voices): ready." in out and "To clone voices" not in out


def test_chat_talks_in_a_saved_voice_and_names_one_that_is_not_saved(home, reference_wav, short_checkpoint,
                                                                     short_base_checkpoint, smollm2_path,
                                                                     sound_server):
    """`parley chat --text --voice NAME` says it speaks in that saved voice and answers; a name no voice has is refused
    before any model loads."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the README's install builds it)")
    assert parley(home, "voice", "add", "Chatty", "--audio", reference_wav, "--mode", "x_vector")[0] == 0
    common = ("chat", "--text", "--model", short_checkpoint, "--llm", smollm2_path, "--device", "cpu")
    chat = subprocess.run([sys.executable, "-m", "engine.cli", *map(str, common), "--voice", "chatty"],
                          input="Name three colors.\n", env=env_of(home), capture_output=True, text=True, timeout=180)
    assert chat.returncode == 0 and chat.stdout.strip(), chat.stderr
    assert (f"parley: {smollm2_path.name} and {short_base_checkpoint.name}, the saved voice 'Chatty'; type a message"
            in chat.stderr)
    code, _, err = parley(home, *common, "--voice", "Nobody")
    assert code == 2 and "parley: no saved voice is named 'Nobody'; the saved voices are: " in err
    assert "Traceback" not in err and "loading" not in err
