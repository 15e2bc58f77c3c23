"""Load test of `parley serve` (engine/speech_server.py) on the loopback: 1-32 clients at once, each asking for one
sentence after another, streamed as PCM.

Method: the service runs in this process (uvicorn on a free loopback port, as `parley serve` runs it) around a
random-weight checkpoint (each utterance capped at --max-frames frames, as random weights rarely stop) or --model.
For each number of clients, that many threads send --requests requests each, one after the other, over plain HTTP
(http.client). TTFC: the request sent -> its first audio byte. RTF: a request's whole time / its audio's length.
Aggregate x-real-time: all the audio served / the level's wall time. A 429 (the queue is full: --concurrency
utterances are spoken at once, --max-waiting wait) is counted, not retried; any other failure is an error. Loopback
only: the bench never opens a port beyond this machine.

    python bench/serve_load.py                            # tiny checkpoint, CPU
    python bench/serve_load.py --size 0.6b --device cuda
    python bench/serve_load.py --concurrency 1            # one utterance at a time, the service before issue 27
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from voice_loop import random_checkpoint  # noqa: E402

TEXT = "Parley speaks this sentence for every client, one request after another."


class Service:
    """create_app(tts, options) served by uvicorn on a free loopback port, in a thread."""

    def __init__(self, tts, options):
        import uvicorn

        from engine.speech_server import create_app

        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(create_app(tts, options), log_level="error", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)

    def __enter__(self):
        self.thread.start()
        while not self.server.started:
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(60)
        self.socket.close()


def ask(port: int, voice: str, timeout_s: float) -> dict:
    """One streamed request: its status, TTFC and whole time in seconds, and the audio's bytes."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    body = json.dumps({"model": "parley", "input": TEXT, "voice": voice, "response_format": "pcm"})
    t0 = time.perf_counter()
    try:
        connection.request("POST", "/v1/audio/speech", body, {"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            response.read()
            return {"status": response.status}
        first = response.read1(65536)
        t_first, size = time.perf_counter(), len(first)
        while chunk := response.read1(65536):
            size += len(chunk)
        return {"status": 200, "ttfc": t_first - t0, "total": time.perf_counter() - t0, "bytes": size}
    except (OSError, http.client.HTTPException) as e:
        return {"status": None, "error": repr(e)}
    finally:
        connection.close()


def level(port: int, clients: int, requests: int, voice: str, timeout_s: float) -> tuple[list[dict], float]:
    """Every client's results at `clients` at once, and the level's wall time."""
    results: list[dict] = []
    lock = threading.Lock()

    def client():
        for _ in range(requests):
            result = ask(port, voice, timeout_s)
            with lock:
                results.append(result)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, time.perf_counter() - t0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="tiny", choices=["tiny", "0.6b"], help="random checkpoint size")
    parser.add_argument("--model", help="a TTS checkpoint folder instead of a random one")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--max-frames", type=int, default=25, help="random checkpoint: frames an utterance")
    parser.add_argument("--clients", default="1,2,4,8,16,32", help="the levels, comma-separated")
    parser.add_argument("--requests", type=int, default=3, help="requests each client sends, one after the other")
    parser.add_argument("--concurrency", type=int, help="utterances spoken at once (default: parley serve's for the "
                        "device)")
    parser.add_argument("--max-waiting", type=int, default=8, help="the service's queue (parley serve's default)")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="longest wait for one request")
    args = parser.parse_args(argv)

    from engine.speech_server import DEFAULT_CONCURRENCY, ServiceOptions
    from engine.tts import load_tts

    work = Path(tempfile.mkdtemp(prefix="parley-bench-"))
    try:
        tts = load_tts(args.model or random_checkpoint(work, args.size, args.max_frames), device=args.device)
        voice = tts.default_speaker or ""
        rate = tts.sample_rate_hz
        rows = []
        at_once = args.concurrency or DEFAULT_CONCURRENCY[tts.device.type]
        with Service(tts, ServiceOptions(concurrency=at_once, max_waiting=args.max_waiting)) as service:
            ask(service.port, voice, args.timeout_s)  # warm-up
            for clients in (int(n) for n in args.clients.split(",")):
                results, wall = level(service.port, clients, args.requests, voice, args.timeout_s)
                served = [r for r in results if r["status"] == 200]
                audio_s = [r["bytes"] / 2 / rate for r in served]
                ttfc = [r["ttfc"] * 1000 for r in served]
                rtf = [r["total"] / a for r, a in zip(served, audio_s, strict=True) if a > 0]
                rows.append((clients, len(results), len(served), sum(r["status"] == 429 for r in results),
                             sum(r["status"] not in (200, 429) for r in results),
                             *(np.percentile(ttfc, [50, 95]) if ttfc else (float("nan"),) * 2),
                             np.median(rtf) if rtf else float("nan"), sum(audio_s) / wall))
                print(f"{clients} clients: {len(served)} of {len(results)} served in {wall:.1f} s", file=sys.stderr)
        print(f"\n{tts.folder.name} on {tts.device}, {args.requests} requests a client, concurrency {at_once}, "
              f"max_waiting {args.max_waiting}, {TEXT!r}\n")
        print("| clients | requests | served | refused (429) | errors | TTFC p50 ms | TTFC p95 ms | RTF p50 | "
              "aggregate x-real-time |")
        print("|---|---|---|---|---|---|---|---|---|")
        for clients, asked, served, busy, errors, p50, p95, rtf, xrt in rows:
            print(f"| {clients} | {asked} | {served} | {busy} | {errors} | {p50:.0f} | {p95:.0f} | {rtf:.2f} | "
                  f"{xrt:.2f} |")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
