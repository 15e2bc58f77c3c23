"""Where the GPU time of the codec's stream call and of the talker's prefill goes: their kernels, summed by name.

Method: a random-weight checkpoint in the official layout (written once under --cache), loaded by load_tts on
CUDA in bf16, so the codec's chunk graphs and the prefill's bucket graphs are the engine's own. For each piece
(the codec stream call of 1 and of 4 frames, the prefill of a 16- and a 64-row bucket) torch.profiler records
--calls graph replays, each after an idle device; the table gives per call: the wall time of the replay (CUDA
events), the kernels' count and summed time, and the kernels that take the most time, by name. The wall time
less the summed kernel time is what the device spends between kernels (launch gaps inside the graph). Kernel
names are cut to --width characters. With --megakernel the engine loads with the megakernel attached, so the graphs
hold its kernels (the prefill's attention prologue, RMSNorm and SwiGLU; the codec's SnakeBeta and attention
prologue) where the PyTorch ops were.

    python bench/gpu_profile.py --size 0.6b [--megakernel]
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.tts import load_tts  # noqa: E402
from engine.tts.prefill import PrefillGraphs  # noqa: E402
from bench_checkpoint import add_arguments as add_checkpoint_arguments, checkpoint  # noqa: E402  (bench/)


def profile_calls(call, calls: int):
    """(wall ms per call (list), {kernel name: (count, total us)} over all calls) of `calls` calls."""
    walls = []
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            end.synchronize()
            walls.append(start.elapsed_time(end))
    kernels = defaultdict(lambda: [0, 0.0])
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and event.device_time_total > 0:
            kernels[event.name][0] += 1
            kernels[event.name][1] += event.device_time_total
    return walls, kernels


def report(title: str, walls, kernels, calls: int, top: int, width: int) -> None:
    if not kernels:
        print(f"\n### {title}\n\nthe profiler recorded no kernels (CUPTI did not trace the graph's)")
        return
    count = sum(c for c, _ in kernels.values()) / calls
    busy = sum(t for _, t in kernels.values()) / calls / 1000
    wall = float(np.percentile(walls, 50))
    print(f"\n### {title}\n\nper call: wall p50 {wall:.3f} ms, {count:.0f} kernels, kernel time {busy:.3f} ms "
          f"({100 * busy / wall:.0f}% of the wall time)\n")
    print("| kernel | per call | us per call | share of kernel time |")
    print("|---|---|---|---|")
    ranked = sorted(kernels.items(), key=lambda kv: -kv[1][1])
    for name, (n, us) in ranked[:top]:
        short = name if len(name) <= width else name[: width - 3] + "..."
        print(f"| `{short}` | {n / calls:.0f} | {us / calls:.1f} | {100 * us / calls / 1000 / busy:.0f}% |")
    rest = ranked[top:]
    if rest:
        n, us = sum(c for _, (c, _) in rest), sum(t for _, (_, t) in rest)
        print(f"| {len(rest)} other kernels | {n / calls:.0f} | {us / calls:.1f} "
              f"| {100 * us / calls / 1000 / busy:.0f}% |")


def main() -> int:
    parser = argparse.ArgumentParser()
    add_checkpoint_arguments(parser)
    parser.add_argument("--calls", type=int, default=20, help="replays profiled per piece")
    parser.add_argument("--top", type=int, default=12, help="kernels listed per piece")
    parser.add_argument("--width", type=int, default=90, help="kernel names cut to this many characters")
    parser.add_argument("--megakernel", action="store_true",
                        help="attach the megakernel (its prefill and codec kernels)")
    args = parser.parse_args()
    folder = checkpoint(args)
    tts = load_tts(folder, "cuda", megakernel=args.megakernel)
    codec, prefill = tts.codec, tts.model.padded_prefill
    assert isinstance(prefill, PrefillGraphs), "load_tts on CUDA should have attached the prefill graphs"
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.size}, bf16, megakernel "
          f"{'on' if args.megakernel else 'off'}; {args.calls} calls a piece, each on an idle device")

    generator = torch.Generator(device="cuda").manual_seed(0)
    with torch.inference_mode():
        for frames in (1, 4):
            stream = codec.stream()
            codes = torch.randint(0, codec.config.codebook_size, (frames, codec.config.num_quantizers),
                                  device="cuda", generator=generator)
            stream.decode(codes)
            report(f"codec stream call, {frames} frame{'s' if frames > 1 else ''} (CUDA graph)",
                   *profile_calls(lambda: stream.decode(codes), args.calls), args.calls, args.top, args.width)
        for bucket in (16, 64):
            report(f"talker prefill, {bucket}-row bucket (CUDA graph)",
                   *profile_calls(lambda: prefill.run(bucket), args.calls), args.calls, args.top, args.width)
    return 0


if __name__ == "__main__":
    sys.exit(main())
