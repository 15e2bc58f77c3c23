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
cosine between the two designs' outputs over the timed steps (1 = equal).

    python bench/dataflow_step.py --size 0.6b
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.tts import load_tts  # noqa: E402
from engine.tts.kernels.megakernel import KernelStep  # noqa: E402
from engine.tts.model import KVCache  # noqa: E402
from gpu_bandwidth import copy_bandwidth_gbs  # noqa: E402  (bench/, the script's folder)
from bench_checkpoint import add_arguments as add_checkpoint_arguments, checkpoint  # noqa: E402  (bench/)


def time_designs(steps: dict[str, KernelStep], args) -> tuple[dict[str, list[float]], float]:
    """Per design, the timed steps' milliseconds; and the lowest cosine between the designs' outputs."""
    cfg = next(iter(steps.values())).cfg
    generator = torch.Generator(device="cuda").manual_seed(0)
    capacity = args.prefix + args.warmup + args.steps
    caches = {design: KVCache(cfg, capacity, "cuda", torch.bfloat16) for design in steps}
    shape = (cfg.num_layers, cfg.num_kv_heads, args.prefix, cfg.head_dim)
    keys, values = (torch.randn(shape, device="cuda", generator=generator) for _ in range(2))
    for cache in caches.values():
        cache.k[:, :, :args.prefix], cache.v[:, :, :args.prefix] = keys, values
        cache.length = args.prefix
    outs = {design: torch.empty(cfg.hidden_size, dtype=torch.float32, device="cuda") for design in steps}
    times = {design: [] for design in steps}
    lowest = 1.0
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
                a, b = outs.values()
                lowest = min(lowest, torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=0).item())
    return times, lowest


def main() -> int:
    parser = argparse.ArgumentParser()
    add_checkpoint_arguments(parser)
    parser.add_argument("--prefix", type=int, default=100, help="cached positions before the first step")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    folder = checkpoint(args)
    bandwidth = copy_bandwidth_gbs()
    tts = load_tts(folder, device="cuda", megakernel=True)
    stacks = {"talker": tts.model.talker.model, "code predictor": tts.model.talker.code_predictor.model}
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.size} bf16; copy bandwidth "
          f"{bandwidth:.0f} GB/s (same run); {args.steps} steps from {args.prefix} cached positions\n")
    print("| stack step (ms) | barrier p50 / p95 | dataflow p50 / p95 | barrier / dataflow | floor "
          "| dataflow / floor | lowest cosine |")
    print("|---|---|---|---|---|---|---|")
    for name, stack in stacks.items():
        steps = {"barrier": stack.kernel_step, "dataflow": KernelStep(stack, design="dataflow")}
        times, lowest = time_designs(steps, args)
        floor = sum(p.numel() * p.element_size() for p in stack.layers.parameters()) / bandwidth / 1e6
        p50 = {design: np.percentile(t, 50) for design, t in times.items()}
        cells = " | ".join(f"{p50[d]:.3f} / {np.percentile(times[d], 95):.3f}" for d in steps)
        print(f"| {name} | {cells} | {p50['barrier'] / p50['dataflow']:.2f}x | {floor:.3f} "
              f"| {p50['dataflow'] / floor:.1f}x | {lowest:.7f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
