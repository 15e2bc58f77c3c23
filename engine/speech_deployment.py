"""Parley's speech service (engine/speech_server.py) across machines: a Ray Serve deployment whose replicas each load
one speech engine (on the GPU Ray gives it, or on the CPU) and answer the same routes through the same create_app,
behind Serve's HTTP proxy, so clients keep the OpenAI base URL they give `parley serve`. Serve's router sends each
request to the less busy of two replicas; within a replica the service's own queue holds what waits (429 beyond it).

`build_app(args)` is the Serve application builder that docs/ray-serve.yaml names (`serve run` / `serve deploy`);
its args are SpeechDeploymentOptions' fields. Needs the `ray` extra: `pip install 'parley[ray]'`.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

try:
    from ray import serve
except ImportError as e:  # an optional extra: say how to get it
    raise ImportError("Parley's Ray Serve deployment needs Ray Serve: pip install 'parley[ray]'") from e

from engine.errors import ParleyError
from engine.speech_server import DEFAULT_CONCURRENCY, ServiceOptions, create_app
from engine.tts.cpu import PRECISIONS

# requests a replica takes beside its queue's (one speaking, max_waiting waiting): GET /health, /v1/voices and
# /v1/models, which answer at once, so a probe or a client's voice check is never held up behind speech
QUICK_REQUESTS = 4
# the response header naming the replica that answered: which machine spoke a request, in a log or a test
REPLICA_HEADER = "x-parley-replica"


@dataclass(frozen=True)
class SpeechDeploymentOptions:
    """What every replica serves. model: a checkpoint folder or hub id, found on each replica's machine as
    `parley serve --model` finds it ("" for $PARLEY_TTS_MODEL, else the default CustomVoice model). precision: a CPU
    replica's arithmetic, as load_tts takes it (auto, float32, bf16, int8); a GPU replica uses its own. concurrency:
    requests a replica speaks at once (None: `parley serve`'s default for its device). max_waiting: requests that may
    wait in a replica behind those it speaks.

    The token is not an option: each replica reads PARLEY_API_TOKEN from its own environment (that of `ray start` on
    its machine), so the secret stays out of the config file and Serve's dashboard."""

    model: str = ""
    precision: str = "auto"
    concurrency: int | None = None
    max_waiting: int = 8

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown precision {self.precision!r}; choose one of: {', '.join(PRECISIONS)}")
        if self.concurrency is not None and (type(self.concurrency) is not int or self.concurrency < 1):
            raise ValueError(f"concurrency must be a whole number >= 1, got {self.concurrency!r}")
        if type(self.max_waiting) is not int or self.max_waiting < 0:
            raise ValueError(f"max_waiting must be a whole number >= 0, got {self.max_waiting!r}")

    @classmethod
    def from_args(cls, args: dict) -> SpeechDeploymentOptions:
        """The options of a Serve config's `args` (or `serve run ... key=value`), unknown names refused."""
        known = [field.name for field in dataclasses.fields(cls)]
        unknown = sorted(set(args) - set(known))
        if unknown:
            raise ValueError(f"unknown argument {', '.join(map(repr, unknown))} for Parley's speech deployment; it "
                             f"takes: {', '.join(known)}")
        return cls(**args)


@serve.deployment(ray_actor_options={"num_cpus": 1})
@serve.ingress()
class SpeechReplica:
    """One speech engine and the service around it; the ASGI app is made once the engine is loaded
    (__serve_build_asgi_app__, which Serve calls after the constructor)."""

    def __init__(self, options: SpeechDeploymentOptions):
        import ray

        from engine.models import find_tts_model
        from engine.tts import load_tts

        token = os.environ.get("PARLEY_API_TOKEN")
        if not token:
            raise ParleyError(f"PARLEY_API_TOKEN is not set on {os.uname().nodename}: a Serve deployment is reached "
                              "from the network, so its clients must send a token; start Ray there with it in the "
                              "environment (PARLEY_API_TOKEN=... ray start ...)")
        # Ray hides every GPU but the one it gave this replica (CUDA_VISIBLE_DEVICES), and gives none where the
        # deployment asks for none: "cuda" is then that GPU
        on_gpu = bool(ray.get_gpu_ids())
        self.tts = load_tts(find_tts_model(options.model or None), device="cuda" if on_gpu else "cpu",
                            precision="auto" if on_gpu else options.precision)
        self.service = ServiceOptions(token=token, concurrency=options.concurrency, max_waiting=options.max_waiting)
        self.replica = serve.get_replica_context().replica_id.to_full_id_str()

    def __serve_build_asgi_app__(self):
        return _NamedReplica(create_app(self.tts, self.service), self.replica)


class _NamedReplica:
    """An ASGI app whose responses say which replica made them (REPLICA_HEADER). A plain ASGI wrapper, as
    speech_server's token gate is: Starlette's BaseHTTPMiddleware would keep a handler from seeing its client leave."""

    def __init__(self, app, replica: str):
        self.app, self.header = app, (REPLICA_HEADER.encode(), replica.encode())

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def named(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, named)


def build_app(args: dict) -> serve.Application:
    """The Serve application of docs/ray-serve.yaml: SpeechReplica with `args` (SpeechDeploymentOptions' fields).
    Replicas and their resources come from the config's `deployments` (num_replicas, ray_actor_options.num_gpus).

    Raises:
        ValueError: an unknown argument, precision or max_waiting (naming the valid ones).
    """
    options = SpeechDeploymentOptions.from_args(args)
    # Serve sends a replica no more than this at once: those it speaks, its queue's and a few quick ones
    at_once = options.concurrency or max(DEFAULT_CONCURRENCY.values())
    return SpeechReplica.options(max_ongoing_requests=at_once + options.max_waiting + QUICK_REQUESTS).bind(options)
