"""Parley's speech service as a Ray Serve deployment (engine/speech_deployment.py), deployed from the repo's own
docs/ray-serve.yaml by `serve run` on a real local Ray cluster of 2 CPUs: 2 replicas of the tiny checkpoint, one CPU
each, behind Serve's HTTP proxy. OpenAI's client and Parley's own (engine/speech_client.py) get the single-process
server's audio from both replicas, streamed; bad requests and a wrong token get the API's errors."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import openai
import pytest
import yaml

from engine.audio.wav import pcm16
from engine.errors import SpeechServerError
from engine.speech_client import connect_tts
from tests.test_speech_server import Server

ray = pytest.importorskip("ray", reason="Ray Serve is not installed (pip install 'parley[ray]')")
serve = pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install 'parley[ray]')")

from engine.speech_deployment import REPLICA_HEADER, build_app  # noqa: E402  (needs ray, skipped above without it)

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "s3cret"
DEPLOY_S = 240  # 2 replicas importing torch and loading the model on 2 busy cores take about 10 s; a loaded CI more


@pytest.fixture(scope="module")
def cluster(short_checkpoint):
    """The base URL of docs/ray-serve.yaml served by `serve run` on a fresh local Ray cluster, its model the short
    tiny checkpoint in float32 (the single-process server's arithmetic, so the audio can be compared), its replicas
    on one CPU each and no GPU, its proxy on a free loopback port."""
    config = yaml.safe_load((ROOT / "docs" / "ray-serve.yaml").read_text())
    (app,) = config["applications"]
    app["args"].update(model=str(short_checkpoint), precision="float32")
    (deployment,) = app["deployments"]
    assert deployment["ray_actor_options"]["num_cpus"] == 1
    deployment["ray_actor_options"]["num_gpus"] = 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config["http_options"] = {"host": "127.0.0.1", "port": port}
    # short: Ray's sockets live under it, and a Unix socket's path has at most 107 characters
    folder = Path(tempfile.mkdtemp(prefix="ray"))
    (folder / "serve.yaml").write_text(yaml.safe_dump(config))
    # Ray's processes, the replicas among them, take the environment of the process that starts the cluster, as
    # `ray start` gives a machine's replicas its own: the token, and this checkout's engine for them to import
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PARLEY_API_TOKEN", TOKEN)
        env.setenv("PYTHONPATH", str(ROOT), prepend=os.pathsep)
        ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=80 * 2**20,
                 _temp_dir=str(folder))
    try:
        address = ray.get_runtime_context().gcs_address
        done = subprocess.run([sys.executable, "-m", "ray.serve.scripts", "run", "--non-blocking", "--address",
                               address, str(folder / "serve.yaml")], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        deadline = time.monotonic() + DEPLOY_S
        while (status := serve.status().applications.get("parley")) is None or status.status not in (
                "RUNNING", "DEPLOY_FAILED"):
            assert time.monotonic() < deadline, f"the deployment did not start in {DEPLOY_S} s: {status}"
            time.sleep(0.2)
        assert status.status == "RUNNING", status
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()
        shutil.rmtree(folder, ignore_errors=True)


def client(url, token=TOKEN):
    return openai.OpenAI(base_url=f"{url}/v1", api_key=token, max_retries=0)


def test_two_replicas_speak_concurrent_requests_as_the_single_process_server_does(cluster, short_tts):
    """Requests sent at once by OpenAI's client and by Parley's get, sample for sample, what `parley serve` in one
    process answers for the same text, voice and seed; both replicas answer. Which replica takes a request is
    Serve's router's choice (the less busy of two, by its cached queue lengths), so rounds of 8 are sent until both
    have answered, 5 rounds at most."""
    texts = {seed: f"Reply number {seed}, from the cluster." for seed in range(8)}
    with Server(short_tts) as single:
        expected = {seed: client(single.url).audio.speech.create(
            model="x", voice="ryan", input=text, response_format="pcm", extra_body={"seed": seed}).content
            for seed, text in texts.items()}
    remote = connect_tts(cluster, TOKEN)

    def by_openai(seed: int) -> tuple[bytes, str]:
        with client(cluster).audio.speech.with_streaming_response.create(
                model="x", voice="ryan", input=texts[seed], response_format="pcm",
                extra_body={"seed": seed}) as response:
            return response.read(), response.headers[REPLICA_HEADER]

    def by_parley(seed: int) -> tuple[bytes, None]:
        return pcm16(remote.synthesize(texts[seed], "ryan", seed=seed)).tobytes(), None

    replicas = set()
    with ThreadPoolExecutor(8) as pool:
        for _ in range(5):
            answers = list(pool.map(lambda seed: (by_parley if seed % 4 == 3 else by_openai)(seed), texts))
            for seed, (audio, replica) in zip(texts, answers):
                assert audio == expected[seed], f"seed {seed}: not the single-process server's audio"
                replicas.add(replica)
            if len(replicas - {None}) == 2:
                break
    assert len(replicas - {None}) == 2 and all(r.startswith("SERVE_REPLICA::parley#SpeechReplica#")
                                                for r in replicas - {None})


def test_speech_streams_through_serves_proxy(cluster, short_tts):
    """A text of four parts arrives in pieces as the replica speaks them: the first a frame's worth (the engine's
    first chunk), and the last long after it; a proxy that gathered the response would hand it over at once."""
    text = " ".join(f"This is sentence {n} of a longer reply, long enough to be spoken in four parts." for n in
                    range(18))
    assert short_tts.stream(text, "ryan").segments == 4
    stream = connect_tts(cluster, TOKEN).stream(text, "ryan", seed=5)
    chunks = list(stream)
    frame_samples = short_tts.sample_rate_hz * 80 // 1000  # one 12.5 Hz codec frame
    assert chunks[0].pcm.size == frame_samples and len(chunks) > 4
    spoken_s, spread_s = chunks[-1].t_ready - stream.t_start, chunks[-1].t_ready - chunks[0].t_ready
    assert spread_s > spoken_s / 4, f"all the audio came at once ({spread_s:.3f} s of {spoken_s:.3f} s)"
    assert np.array_equal(pcm16(np.concatenate([c.pcm for c in chunks])),
                          pcm16(short_tts.synthesize(text, "ryan", seed=5)))


@pytest.mark.parametrize("fields, param, said", [
    ({"voice": "nobody"}, "voice", "no voice 'nobody'; this model has"),
    ({"response_format": "mp3"}, "response_format", "choose pcm"),
    ({"input": ""}, "input", "input must be the text to speak"),
])
def test_bad_requests_get_the_apis_error_shape_through_serve(cluster, fields, param, said):
    request = {"model": "x", "voice": "ryan", "input": "Fine.", **fields}
    with pytest.raises(openai.BadRequestError) as refused:
        client(cluster).audio.speech.create(**request)
    error = refused.value.body
    assert refused.value.status_code == 400 and error["param"] == param and said in error["message"]
    assert error["type"] == "invalid_request_error" and error["code"]


def test_the_replicas_ask_for_the_token_in_their_environment(cluster):
    """PARLEY_API_TOKEN from `ray start`'s environment guards every replica: a wrong token is OpenAI's
    AuthenticationError, Parley's client without one is told it needs one; /health asks for none."""
    with pytest.raises(openai.AuthenticationError) as refused:
        client(cluster, token="wrong").models.list()
    assert refused.value.body["type"] == "authentication_error"
    with pytest.raises(SpeechServerError, match=f"the speech server at {cluster} needs a token"):
        connect_tts(cluster)
    assert [m.id for m in client(cluster).models.list()] == ["short"]
    with urllib.request.urlopen(f"{cluster}/health") as response:
        assert json.load(response)["status"] == "ok"


@pytest.mark.parametrize("args, said", [
    ({"modle": "x"}, "unknown argument 'modle' for Parley's speech deployment; it takes: model, precision, "
                     "concurrency, max_waiting"),
    ({"precision": "fast"}, "unknown precision 'fast'; choose one of: auto, float32, bf16, int8"),
    ({"concurrency": 0}, "concurrency must be a whole number >= 1, got 0"),
    ({"max_waiting": -1}, "max_waiting must be a whole number >= 0, got -1"),
])
def test_the_application_builder_names_a_wrong_argument(args, said):
    """A config's args are checked where Serve builds the application, before any replica starts."""
    with pytest.raises(ValueError, match=said):
        build_app(args)
