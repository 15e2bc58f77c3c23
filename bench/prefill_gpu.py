"""GPU benchmark of the talker's prefill (Qwen3TTS.begin): eager PyTorch against the padded-bucket CUDA graphs
of engine/tts/prefill.py, one table.

Method: a random-weight checkpoint in the official layout (written once under --cache), bf16 on the GPU,
megakernel off, or with --megakernel attached: each layer's attention prologue (q/k norm, RoPE, K/V cache write)
then runs in one launch of its extension, in both columns. For each prompt
length T, a random (T, hidden) bf16 prompt; each call of begin() starts on an idle device (synchronize)
and is timed by CUDA events around it, so launch gaps count as they do in TTFC; --warmup calls, then
p50 / p95 over --iters calls. "eager" is begin() with no padded prefill (~400 launches), "graph" the one
load_tts attached (input copy, one replay, K/V copy into the utterance's cache, output copies). Both
allocate the utterance's cache. The floor is the talker's weight bytes (layers, final norm, codec head)
over the device-to-device copy bandwidth measured in the same run: a prefill reads every weight once
(above ~200 rows compute bounds it instead). max |d logits| is graph against eager, a sanity check.
The buckets' capture time and memory are measured on a second, fresh capture.

    python bench/prefill_gpu.py --size 0.6b [--megakernel]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.tts import load_tts  # noqa: E402
from engine.tts.prefill import PrefillGraphs  # noqa: E402
from gpu_bandwidth import copy_bandwidth_gbs  # noqa: E402  (bench/, the script's folder)
from bench_checkpoint import add_arguments as add_checkpoint_arguments, checkpoint  # noqa: E402  (bench/)


def prefill_ms(model, prompt, warmup: int, iters: int):
    """ms of model.begin(prompt) per call (CUDA events, idle device before each), and the last state."""
    times = []
    for i in range(warmup + iters):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        state = model.begin(prompt, 64)
        end.record()
        end.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end))
    return times, state


def capture_costs(model):
    """(bucket, ms) of capturing each bucket afresh in order, and the MiB the fresh graphs reserve."""
    torch.cuda.synchronize()
    reserved = torch.cuda.memory_reserved()
    graphs = PrefillGraphs(model)
    costs = []
    for bucket in graphs.buckets:
        t = time.perf_counter()
        graphs.warm_up(bucket)  # captures the buckets up to this one; the smaller ones are done already
        torch.cuda.synchronize()
        costs.append((bucket, 1000 * (time.perf_counter() - t)))
    grown = (torch.cuda.memory_reserved() - reserved) / 2**20
    return costs, grown


def main() -> int:
    parser = argparse.ArgumentParser()
    add_checkpoint_arguments(parser)
    parser.add_argument("--lengths", default="12,40,100,130,250,400", help="prompt lengths (rows), comma-separated")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--megakernel", action="store_true", help="attach the megakernel (its attention prologue)")
    args = parser.parse_args()
    folder = checkpoint(args)
    bandwidth = copy_bandwidth_gbs()
    tts = load_tts(folder, device="cuda", megakernel=args.megakernel)
    model = tts.model
    graphs = model.padded_prefill
    assert isinstance(graphs, PrefillGraphs), "load_tts on CUDA should have attached the prefill graphs"
    talker = model.talker
    weight_bytes = sum(p.numel() * p.element_size()
                       for p in (*talker.model.layers.parameters(), *talker.model.norm.parameters(),
                                 talker.codec_head.weight))
    floor = weight_bytes / bandwidth / 1e6
    generator = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for T in (int(v) for v in args.lengths.split(",")):
        prompt = torch.randn(T, talker.cfg.decoder.hidden_size, device="cuda", generator=generator).to(tts.dtype)
        model.padded_prefill = None
        eager, eager_state = prefill_ms(model, prompt, args.warmup, args.iters)
        model.padded_prefill = graphs
        graph, graph_state = (prefill_ms(model, prompt, args.warmup, args.iters) if graphs.fits(prompt)
                              else (None, None))
        delta = (graph_state.logits.float() - eager_state.logits.float()).abs().max().item() if graph else None
        rows.append((T, graphs.bucket(T) if graph else None, eager, graph, delta))
    costs, grown = capture_costs(model)

    cell = lambda v: f"{np.percentile(v, 50):.3f} / {np.percentile(v, 95):.3f}" if v else "- (eager)"  # noqa: E731
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.size} {tts.dtype}, "
          f"megakernel {'on' if args.megakernel else 'off'}; "
          f"copy bandwidth {bandwidth:.0f} GB/s, talker weights {weight_bytes / 1e9:.2f} GB (same run)\n")
    print("| prompt rows | bucket | eager p50 / p95 ms | graph p50 / p95 ms | eager / graph | floor ms "
          "| graph / floor | max \\|d logits\\| |")
    print("|---|---|---|---|---|---|---|---|")
    for T, bucket, eager, graph, delta in rows:
        e50 = np.percentile(eager, 50)
        g50 = np.percentile(graph, 50) if graph else None
        print(f"| {T} | {bucket or '-'} | {cell(eager)} | {cell(graph)} | "
              f"{f'{e50 / g50:.1f}x' if graph else '-'} | {floor:.3f} | {f'{g50 / floor:.1f}x' if graph else '-'} | "
              f"{f'{delta:.3g}' if graph else '-'} |")
    print("\nCapture, once per bucket at load (warm-up runs + capture + instantiation, wall clock ms): "
          + ", ".join(f"{b}: {ms:.0f}" for b, ms in costs)
          + f"; total {sum(ms for _, ms in costs):.0f} ms, {grown:.0f} MiB reserved (static buffers + graph pool)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
