"""How long the end-of-turn model (Smart Turn v3.2, engine/stt/turn.py TurnModel) takes to weigh a pause, by the CPU
threads its inference may use: the decision at a pause waits for it, every pause, on a GPU machine too.

Method: the model's 8 s window of a noisy voice-like signal (its time does not depend on what it hears), asked --runs
times after one warm-up per thread count; the median and 95th percentile of TurnModel.probability() in milliseconds,
the features included. The machine's core count is printed beside them. With --beside, each count is timed again while
another thread runs pure Python, as the voice loop's threads do around a pause (the LLM's token loop, Whisper's
decoding, the player): the model's call takes Python's lock (the GIL) again after each step that released it, and
waits for it up to the interpreter's switch interval (5 ms, or --switch-ms) every time.

    python bench/turn_model.py --threads 1,2,4,8
    python bench/turn_model.py --threads 1,4 --beside [--switch-ms 1]
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.stt.turn import SAMPLE_RATE_HZ, WINDOW_S, TurnModel  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", default="1,2,4", help="thread counts, comma-separated")
    parser.add_argument("--runs", type=int, default=30, help="inferences per thread count")
    parser.add_argument("--turn-model", help="the Smart Turn ONNX file (default: pipecat-ai's)")
    parser.add_argument("--beside", action="store_true", help="also time each count beside a thread running Python")
    parser.add_argument("--switch-ms", type=float, help="the interpreter's switch interval (sys.setswitchinterval)")
    args = parser.parse_args(argv)
    if args.switch_ms is not None:
        sys.setswitchinterval(args.switch_ms / 1000)
    rng = np.random.default_rng(0)
    t = np.arange(WINDOW_S * SAMPLE_RATE_HZ) / SAMPLE_RATE_HZ
    audio = (0.1 * np.sin(2 * np.pi * 150 * t) * rng.uniform(0, 1, t.size) + rng.normal(0, 0.01, t.size))
    audio = audio.astype(np.float32)
    print(f"{os.cpu_count()} cores, switch interval {sys.getswitchinterval() * 1000:g} ms\n\n"
          "| threads | beside | p50 ms | p95 ms |\n|---|---|---|---|")
    for threads in (int(n) for n in args.threads.split(",")):
        model = TurnModel(args.turn_model, threads=threads)
        model.probability(audio)
        for beside in (False, True) if args.beside else (False,):
            times = timed(model, audio, args.runs, beside)
            print(f"| {threads} | {'a thread running Python' if beside else 'nothing'} | "
                  f"{np.percentile(times, 50):.1f} | {np.percentile(times, 95):.1f} |")
    return 0


def timed(model: TurnModel, audio: np.ndarray, runs: int, beside: bool) -> list[float]:
    """Milliseconds of each of `runs` calls, with (beside) a thread counting in pure Python meanwhile."""
    stop = threading.Event()

    def busy() -> None:
        n = 0
        while not stop.is_set():
            n += 1

    other = threading.Thread(target=busy, daemon=True)
    if beside:
        other.start()
    times = []
    try:
        for _ in range(runs):
            start = time.perf_counter()
            model.probability(audio)
            times.append((time.perf_counter() - start) * 1000)
    finally:
        stop.set()
        if beside:
            other.join()
    return times


if __name__ == "__main__":
    sys.exit(main())
