"""GPU benchmark of the megakernel's one-token decoder step in its two designs, one table, one run: the engine's
barrier step (csrc/megakernel/decoder_step.cuh, stages ended by grid barriers) and the dataflow step
(csrc/megakernel/dataflow.cuh, stages waiting on their producers' counters, weights streamed into shared memory
ahead of them; issue 27).

Method: a random-weight checkpoint in the official layout (bench_checkpoint.py), bf16 on the GPU. For each stack
(the talker's 28 layers, the code predictor's 5) both designs step on the same random inputs from the same random
KV cache of --prefix positions, taking turns step by step, each growing its own cache by one a step. Every launch is
timed alone with CUDA events (KernelStep.launch: no host synchronization inside them; the dataflow step's stall
check follows the end event); --warmup steps first, then p50 / p95 over --steps. The floor is the stack's layer
weight bytes over the device-to-device copy bandwidth measured in the same run. The last column is the lowest
cosine between a design's outputs and the barrier step's over the timed steps (1 = equal). With --trace N, N more
steps of each design run with the kernel's trace on (csrc/megakernel/common.cuh), and a second table splits a step's
time by stage into block 0's own share of the stage and its wait for the rest of the grid (the barrier, or the
counter). --ring-pages adds the dataflow step with its weight ring of that many pages a block (the shared memory
left out goes to L1), as designs of their own in the same run: how much of each stage's time the ring costs.
With --probes (and --trace) the kernels are built with MK_PROBES, as `bench/megakernel_trace.py --probes` builds them,
and a third table gives the points block 0 stamps inside each stage (attention's, the same function in both designs,
among them) as microseconds from the stage's start, p50 a layer: where a stage that takes longer in one design does.

    python bench/dataflow_step.py --size 0.6b [--trace 50 [--probes]] [--ring-pages 2,4]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.tts.kernels.megakernel import KernelStep  # noqa: E402
from engine.tts.model import KVCache  # noqa: E402
from gpu_bandwidth import copy_bandwidth_gbs  # noqa: E402  (bench/, the script's folder)
from bench_checkpoint import add_arguments as add_checkpoint_arguments, checkpoint  # noqa: E402  (bench/)
from megakernel_trace import LAUNCH, POINTS, PROBE, STAGES, load, probe_offsets  # noqa: E402  (bench/)


def random_caches(cfg, designs, prefix: int, capacity: int, generator) -> dict[str, KVCache]:
    """Per design, a KV cache holding the same `prefix` random positions."""
    caches = {design: KVCache(cfg, capacity, "cuda", torch.bfloat16) for design in designs}
    shape = (cfg.num_layers, cfg.num_kv_heads, prefix, cfg.head_dim)
    keys, values = (torch.randn(shape, device="cuda", generator=generator) for _ in range(2))
    for cache in caches.values():
        cache.k[:, :, :prefix], cache.v[:, :, :prefix] = keys, values
        cache.length = prefix
    return caches


def time_designs(steps: dict[str, KernelStep], args) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Per design, the timed steps' milliseconds and the lowest cosine between its outputs and the barrier step's."""
    cfg = next(iter(steps.values())).cfg
    generator = torch.Generator(device="cuda").manual_seed(0)
    caches = random_caches(cfg, steps, args.prefix, args.prefix + args.warmup + args.steps, generator)
    outs = {design: torch.empty(cfg.hidden_size, dtype=torch.float32, device="cuda") for design in steps}
    times = {design: [] for design in steps}
    lowest = dict.fromkeys(steps, 1.0)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.inference_mode():
        for i in range(args.warmup + args.steps):
            x = torch.randn(cfg.hidden_size, device="cuda", generator=generator)
            for design, step in steps.items():
                cache = caches[design]
                start.record()
                step.launch(x, outs[design], cache)
                end.record()
                end.synchronize()
                step.check()
                cache.length += 1
                if i >= args.warmup:
                    times[design].append(start.elapsed_time(end))
            if i >= args.warmup:
                for design, out in outs.items():
                    cosine = torch.nn.functional.cosine_similarity(out.double(), outs["barrier"].double(), dim=0)
                    lowest[design] = min(lowest[design], cosine.item())
    return times, lowest


def trace_designs(steps: dict[str, KernelStep], args) -> dict[str, tuple[np.ndarray, dict[int, dict[int, float]]]]:
    """Per design, block 0's microseconds a step (p50 over --trace steps) per stage A-E: (its own share of the stage,
    its wait for the rest of the grid to finish it), from the kernel's trace (common.cuh): the barrier step stamps
    the grid barrier after each stage, the dataflow step its wait on that stage's counter. With it, where the kernels
    have probes: stage -> point -> us from the stage's start (leaving the wait before it), p50 over its layers."""
    cfg = next(iter(steps.values())).cfg
    generator = torch.Generator(device="cuda").manual_seed(1)
    caches = random_caches(cfg, steps, args.prefix, args.prefix + args.trace, generator)
    x = torch.randn(cfg.hidden_size, device="cuda", generator=generator)
    out = torch.empty(cfg.hidden_size, dtype=torch.float32, device="cuda")
    result = {}
    for design, step in steps.items():
        per_layer = len(STAGES) * (6 if args.probes else 1)  # a stamp a stage, and up to 5 points in each with probes
        trace = torch.zeros((args.trace * (per_layer * cfg.num_layers + 1), 3), dtype=torch.int64, device="cuda")
        with torch.inference_mode():
            step.module.set_trace(trace)
            for _ in range(args.trace):
                step.launch(x, out, caches[design])
                caches[design].length += 1
            torch.cuda.synchronize()
            count = step.module.set_trace(None)
            step.check()
        rows = trace[:count].cpu().numpy()
        points = {stage: {point: np.median(ns) / 1e3 for point, ns in by_point.items()}
                  for stage, by_point in probe_offsets(rows).items()}
        per_step = np.zeros((args.trace, len(STAGES), 2))  # ns: own share, wait
        launch, left = -1, 0
        for tag, arrive, leave in rows[rows[:, 0] < PROBE]:
            if tag == LAUNCH:
                launch += 1
            else:
                per_step[launch, tag] += (arrive - left, leave - arrive)
            left = leave
        result[design] = np.median(per_step, axis=0) / 1e3, points
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    add_checkpoint_arguments(parser)
    parser.add_argument("--prefix", type=int, default=100, help="cached positions before the first step")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--trace", type=int, default=0, help="also trace this many steps of each design: where the "
                        "time goes, stage by stage")
    parser.add_argument("--probes", action="store_true", help="with --trace, build the kernels with their probes and "
                        "also report the points inside each stage")
    parser.add_argument("--ring-pages", default="", help="comma-separated caps on the dataflow step's weight pages in "
                        "flight a block, each also timed (and traced) as a design of its own")
    args = parser.parse_args()
    if args.probes and not args.trace:
        parser.error("--probes needs --trace N")
    rings = [int(n) for n in args.ring_pages.split(",") if n]
    folder = checkpoint(args)
    bandwidth = copy_bandwidth_gbs()
    tts = load(folder, args.probes)
    stacks = {"talker": tts.model.talker.model, "code predictor": tts.model.talker.code_predictor.model}
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.size} bf16; copy bandwidth "
          f"{bandwidth:.0f} GB/s (same run); {args.steps} steps from {args.prefix} cached positions\n")
    print("| stack | design | step p50 / p95 ms | barrier / design | floor ms | design / floor | lowest cosine |")
    print("|---|---|---|---|---|---|---|")
    traced = {}
    for name, stack in stacks.items():
        steps = {"barrier": stack.kernel_step, "dataflow": KernelStep(stack, design="dataflow")}
        steps |= {f"dataflow, ring {n}": KernelStep(stack, design="dataflow", ring_pages=n) for n in rings}
        times, lowest = time_designs(steps, args)
        floor = sum(p.numel() * p.element_size() for p in stack.layers.parameters()) / bandwidth / 1e6
        p50 = {design: np.percentile(t, 50) for design, t in times.items()}
        for design in steps:
            print(f"| {name} | {design} | {p50[design]:.3f} / {np.percentile(times[design], 95):.3f} "
                  f"| {p50['barrier'] / p50[design]:.2f}x | {floor:.3f} | {p50[design] / floor:.1f}x "
                  f"| {lowest[design]:.7f} |")
        if args.trace:
            traced[name] = trace_designs(steps, args)
    if traced:
        print(f"\nWhere a step's time goes: block 0's own share of each stage / its wait for the grid to finish it, "
              f"us a step summed over the layers, p50 of {args.trace} traced steps\n")
        print("| stack | design | " + " | ".join(STAGES) + " | own share | waiting |")
        print("|---|---|" + "---|" * (len(STAGES) + 2))
        for name, designs in traced.items():
            for design, (us, _) in designs.items():
                cells = " | ".join(f"{own:.0f} / {wait:.0f}" for own, wait in us)
                print(f"| {name} | {design} | {cells} | {us[:, 0].sum():.0f} | {us[:, 1].sum():.0f} |")
    if args.probes:
        shown = sorted({p for designs in traced.values() for _, points in designs.values()
                        for by_point in points.values() for p in by_point})
        print("\nInside the stages (block 0, warp 0): us from the stage's start to each point, p50 a layer\n")
        print("| stack | design | stage | " + " | ".join(POINTS[p] for p in shown) + " |")
        print("|---|---|---|" + "---|" * len(shown))
        for name, designs in traced.items():
            for design, (_, points) in designs.items():
                for stage in sorted(points):
                    cells = (f"{points[stage][p]:.2f}" if p in points[stage] else "" for p in shown)
                    print(f"| {name} | {design} | {STAGES[stage]} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
