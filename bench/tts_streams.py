"""Several utterances at once through the speech engine's public API: N concurrent TTSStreams of one engine, N = 1, 2,
4, 8, 16, 32 (issue 27's streams benchmark; bench/serve_load.py measures the same through the HTTP service).

Method: a random-weight checkpoint (each utterance capped at --max-frames frames, as random weights rarely stop) or
--model, loaded once. For each N, N threads each iterate one stream of the same sentence (seed = the stream's number,
so every stream samples its own codes), all started together. TTFC: stream() called -> its first chunk in host
memory. A stream's RTF: its wall time / its audio's length. Aggregate x-real-time: all the audio made / the level's
wall time. The streams take turns on the engine a chunk at a time (engine/tts/turns.py): each is slowed by the others,
none waits for their whole utterances. Baseline in the same run: N = 1.

--trace times, in each level, the engine's work until the last stream has its first chunk, by part: each stream's
prompt, prefill, frame launches and codec decodes, the GPU synchronized around each (which costs a little), and what
is left of that wait (turns changing hands, Python). It shows what the last stream's TTFC waits for.

A joiner, as a request arriving at a busy server: once every stream of the level has its first chunk, one more stream
of a short sentence starts, its TTFC is taken and it is closed; again every 50 ms while all N go on, up to --joiners.

    python bench/tts_streams.py                             # tiny checkpoint, CPU
    python bench/tts_streams.py --size 0.6b --device cuda --streams 1,2,4,8,16,32
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from voice_loop import random_checkpoint  # noqa: E402

TEXT = "Parley speaks this sentence in every stream at once, each in its own voice of random codes."
JOINER = "Me too."


class Trace:
    """The engine's parts timed, each wrapped where it is defined (GPU synchronized before and after): milliseconds
    summed a part, and how many calls, since reset()."""

    PARTS = {"prompt": ("engine.tts.prompt", "PromptBuilder", "build"),
             "prefill": ("engine.tts.model", "Qwen3TTS", "begin"),
             "launch": ("engine.tts.kernels.batcher", "Batcher", "_launch"),
             "codec": ("engine.tts.stream", "TTSEngine", "_chunk")}

    def __init__(self, device: str):
        import importlib

        import torch

        self._sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        self._lock = threading.Lock()
        self.reset()
        for part, (module, cls, name) in self.PARTS.items():
            owner = getattr(importlib.import_module(module), cls)
            setattr(owner, name, self._timed(part, getattr(owner, name)))

    def reset(self) -> None:
        self.ms = {part: 0.0 for part in self.PARTS}
        self.calls = {part: 0 for part in self.PARTS}
        self.open = True  # parts are counted until close()

    def close(self) -> None:
        self.open = False

    def _timed(self, part: str, method):
        def timed(*args, **kwargs):
            self._sync()
            t0 = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self._sync()
                with self._lock:
                    if self.open:
                        self.ms[part] += (time.perf_counter() - t0) * 1000
                        self.calls[part] += 1

        return timed


def level(tts, streams: int, voice: str | None, joiners: int,
          trace: Trace | None = None) -> tuple[list[dict], float, list[float]]:
    """Each stream's figures with `streams` at once, the level's wall time, and its joiners' TTFC in ms."""
    results: list[dict] = [{} for _ in range(streams)]
    start = threading.Barrier(streams + 1)
    begun, done = threading.Semaphore(0), threading.Event()

    def speak(i: int) -> None:
        start.wait()
        t0 = time.perf_counter()
        first, samples = None, 0
        for chunk in tts.stream(TEXT, voice, seed=i):
            if first is None:
                begun.release()
            first = first or chunk.t_ready
            samples += chunk.pcm.size
        done.set()
        results[i] = {"ttfc_ms": (first - t0) * 1000, "wall_s": time.perf_counter() - t0,
                      "audio_s": samples / tts.sample_rate_hz}

    threads = [threading.Thread(target=speak, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    if trace is not None:
        trace.reset()
    start.wait()
    t0 = time.perf_counter()
    for _ in range(streams):
        begun.acquire()
    if trace is not None:
        trace.close()
        parts = ", ".join(f"{part} {ms:.1f} ms ({trace.calls[part]})" for part, ms in trace.ms.items())
        waited = (time.perf_counter() - t0) * 1000
        print(f"{streams} streams' first chunks in {waited:.1f} ms: {parts}, the rest "
              f"{waited - sum(trace.ms.values()):.1f} ms", file=sys.stderr)
    joined = []
    while len(joined) < joiners and not done.wait(0.05):
        stream = tts.stream(JOINER, voice, seed=streams + len(joined))
        first = next(stream)
        if not done.is_set():  # all N were still going while it waited
            joined.append((first.t_ready - stream.t_start) * 1000)
        stream.close()
    for t in threads:
        t.join()
    return results, time.perf_counter() - t0, joined


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="tiny", choices=["tiny", "0.6b"], help="random checkpoint size")
    parser.add_argument("--model", help="a TTS checkpoint folder instead of a random one")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--max-frames", type=int, default=50, help="random checkpoint: frames an utterance (4 s)")
    parser.add_argument("--streams", default="1,2,4,8,16,32", help="the levels, comma-separated")
    parser.add_argument("--joiners", type=int, default=8, help="streams that join each level, one after another")
    parser.add_argument("--json", help="also write every level's figures to this JSON file")
    parser.add_argument("--trace", action="store_true", help="time the parts of the wait for the first chunks")
    args = parser.parse_args(argv)

    from engine.tts import load_tts

    work = Path(tempfile.mkdtemp(prefix="parley-bench-"))
    try:
        tts = load_tts(args.model or random_checkpoint(work, args.size, args.max_frames), device=args.device)
        voice = tts.default_speaker
        trace = Trace(args.device) if args.trace else None
        level(tts, 1, voice, 1)  # warm-up: first-use costs (kernel build, graphs, allocator) stay out of the figures
        rows = []
        for streams in (int(n) for n in args.streams.split(",")):
            results, wall, joined = level(tts, streams, voice, args.joiners, trace)
            ttfc = [r["ttfc_ms"] for r in results]
            rtf = [r["wall_s"] / r["audio_s"] for r in results]
            rows.append({"streams": streams, "ttfc_p50_ms": float(np.percentile(ttfc, 50)),
                         "ttfc_p95_ms": float(np.percentile(ttfc, 95)), "rtf_p50": float(np.median(rtf)),
                         "rtf_max": max(rtf), "faster_than_real_time": sum(r < 1 for r in rtf),
                         "aggregate_xrt": sum(r["audio_s"] for r in results) / wall,
                         "joiner_ttfc_ms": joined})
            print(f"{streams} streams: {wall:.1f} s", file=sys.stderr)
        kernel = "megakernel" if tts.model.frame_kernel is not None else "PyTorch"
        print(f"\n{tts.folder.name} on {tts.device} ({kernel}, {tts.precision.setting}), {TEXT!r}, "
              f"<= {args.max_frames} frames an utterance\n")
        print("| streams | TTFC p50 ms | TTFC p95 ms | per-stream RTF p50 | worst RTF | faster than real time | "
              "aggregate x-real-time | a joiner's TTFC p50 / max ms (joiners) |")
        print("|---|---|---|---|---|---|---|---|")
        for r in rows:
            joined = r["joiner_ttfc_ms"]
            joiner = f"{np.median(joined):.0f} / {max(joined):.0f} ({len(joined)})" if joined else "-"
            print(f"| {r['streams']} | {r['ttfc_p50_ms']:.0f} | {r['ttfc_p95_ms']:.0f} | {r['rtf_p50']:.3f} | "
                  f"{r['rtf_max']:.3f} | {r['faster_than_real_time']} of {r['streams']} | {r['aggregate_xrt']:.2f} | "
                  f"{joiner} |")
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
