"""How long the end-of-turn model (Smart Turn v3.2, engine/stt/turn.py TurnModel) takes to weigh a pause, by the CPU
threads its inference may use: the decision at a pause waits for it, every pause, on a GPU machine too.

Method: the model's 8 s window of a noisy voice-like signal (its time does not depend on what it hears), asked --runs
times after one warm-up per thread count; the median and 95th percentile of TurnModel.probability() in milliseconds,
the features included. The machine's core count is printed beside them.

    python bench/turn_model.py --threads 1,2,4,8
"""

from __future__ import annotations

import argparse
import os
import sys
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
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    t = np.arange(WINDOW_S * SAMPLE_RATE_HZ) / SAMPLE_RATE_HZ
    audio = (0.1 * np.sin(2 * np.pi * 150 * t) * rng.uniform(0, 1, t.size) + rng.normal(0, 0.01, t.size))
    audio = audio.astype(np.float32)
    print(f"{os.cpu_count()} cores\n\n| threads | p50 ms | p95 ms |\n|---|---|---|")
    for threads in (int(n) for n in args.threads.split(",")):
        model = TurnModel(args.turn_model, threads=threads)
        model.probability(audio)
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            model.probability(audio)
            times.append((time.perf_counter() - start) * 1000)
        print(f"| {threads} | {np.percentile(times, 50):.1f} | {np.percentile(times, 95):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
