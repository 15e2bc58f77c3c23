"""Where a megakernel frame's time goes: every grid barrier of a run, timed on the device.

The kernel's barrier trace (csrc/megakernel/common.cuh) has block 0 stamp %globaltimer when it arrives
at each grid barrier and when it leaves. A stage's time is from leaving the barrier before it to
leaving its own; "block 0 waits" is the part block 0 spent at the barrier (the rest of the grid still
working, or the barrier itself). Frames run as the engine runs them (sampled, `--per-launch` a launch);
the frame time without the trace is measured in the same run, so the trace's own cost shows. With `--streams`
2, 4 or 8, the launches are the batch kernel's (BatchKernel), that many utterances at once, so a stage's table beside
the one-utterance table shows what each utterance more costs it.

With --probes the kernel is built from a copy of its sources with MK_PROBES defined, and block 0's thread 0
also stamps points inside the stages (common.cuh `probe`: weights issued, input vector ready, first batch of
weights used, rows done; in attention, q loaded, normed and rotated, scores, softmax, done): a second
table gives each point's time from the stage's start, p50.

    python bench/megakernel_trace.py --size 0.6b [--probes] [--streams 1,2,4,8]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.tts import SamplingOptions, load_tts  # noqa: E402
from engine.tts.kernels import build  # noqa: E402
from engine.tts.sampling import Sampler  # noqa: E402
from bench_checkpoint import add_arguments as add_checkpoint_arguments, checkpoint  # noqa: E402  (bench/)

TEXT = "Parley speaks while it thinks, one frame of sixteen codes every eighty milliseconds."
STAGES = "ABCDE"
TAGS = {16: "codec head", 17: "codec pick", 18: "predictor heads", 19: "predictor picks", 20: "frame end",
        21: "projection"}
LAUNCH = 22
PROBE = 32  # probe tags are PROBE + a point of common.cuh's Probe
POINTS = ("issued", "input ready", "first batch used", "rows done", "q loaded", "normed and rotated", "scores",
          "softmax", "head done")


def tag_name(tag: int) -> str:
    if tag < 8:
        return f"talker {STAGES[tag]}"
    if tag < 16:
        return f"predictor {STAGES[tag - 8]}"
    return TAGS[tag]


def run_frames(tts, frames: int, per_launch: int, streams: int = 1):
    """Frames from fresh prompts, as the engine makes them (`streams` utterances a launch); returns each launch's
    CUDA-event ms a frame."""
    from engine.tts.kernels.megakernel import BatchKernel, KernelRun

    prompts, talker = tts.prompts, tts.config.talker
    inputs = prompts.build(prompts.text_ids(TEXT), tts.resolve_voice(tts.default_speaker), True, tts.device)
    runs = []
    for seed in range(streams):
        sampler = Sampler(SamplingOptions(), seed, talker.decoder.vocab_size, talker.codec_eos_id, tts._suppress,
                          min_frames=10**9)
        state = tts.model.begin(inputs.prefill.to(tts.dtype), frames + 1)
        runs.append(KernelRun.start(state, sampler, inputs, frames + 1))
    batch = BatchKernel(tts.model, streams) if streams > 1 else None

    def launch(frames: int) -> None:
        if batch is None:
            tts.model.frame_kernel.launch(runs[0], frames)
        else:
            batch.launch(runs, [frames] * streams)

    launch(1)  # the first launch has no talker step
    times = []
    for _ in range(frames // per_launch):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        launch(per_launch)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / per_launch)
    return times


def main() -> int:
    parser = argparse.ArgumentParser()
    add_checkpoint_arguments(parser)
    parser.add_argument("--frames", type=int, default=64)
    parser.add_argument("--per-launch", type=int, default=4)
    parser.add_argument("--probes", action="store_true", help="also stamp points inside the stages")
    parser.add_argument("--streams", default="1", help="utterances a launch, comma-separated: a table each")
    args = parser.parse_args()
    tts = load(checkpoint(args), args.probes)
    for streams in (int(n) for n in args.streams.split(",")):
        report(tts, args, streams)
    return 0


def load(folder: Path, probes: bool):
    """The engine with the megakernel, built from a copy of the sources with the probes compiled in where
    `probes` is set (its own build: the hash differs)."""
    if not probes:
        return load_tts(folder, device="cuda", megakernel=True)
    with tempfile.TemporaryDirectory() as tmp:
        build.CSRC = Path(shutil.copytree(build.CSRC, Path(tmp) / "csrc"))
        common = build.CSRC / "megakernel" / "common.cuh"
        common.write_text("#define MK_PROBES\n" + common.read_text())
        return load_tts(folder, device="cuda", megakernel=True)


def report(tts, args: argparse.Namespace, streams: int) -> None:
    """Time frames plain and traced, and print where a frame's time goes."""
    module = tts.model.frame_kernel.module
    run_frames(tts, 8, args.per_launch, streams)  # warm-up
    plain = run_frames(tts, args.frames, args.per_launch, streams)
    per_frame = 4096 if args.probes else 1024  # ~550 barriers a frame, and ~4 points in each stage
    trace = torch.zeros((args.frames * per_frame, 3), dtype=torch.int64, device="cuda")
    module.set_trace(trace)
    traced = run_frames(tts, args.frames, args.per_launch, streams)
    count = module.set_trace(None)
    rows = trace[:count].cpu().numpy()
    probes, rows = probe_offsets(rows), rows[rows[:, 0] < PROBE]
    per_tag = defaultdict(lambda: ([], []))  # tag -> (stage ns, block-0 wait ns)
    for prev, row in zip(rows[:-1], rows[1:]):
        if row[0] == LAUNCH:
            continue
        per_tag[int(row[0])][0].append(row[2] - prev[2])
        per_tag[int(row[0])][1].append(row[2] - row[1])
    rows = rows[rows[:, 0] != LAUNCH]
    frames = int((rows[:, 0] == 17).sum())  # one codebook-0 pick a frame of the launch (the first launch's included)
    total = sum(sum(v[0]) for v in per_tag.values()) / frames / 1e6  # ms
    print(f"\n{torch.cuda.get_device_name()}, {args.size} bf16, {streams} utterance(s) at once, {frames} frames "
          f"traced, {args.per_launch} a launch; "
          f"frame {np.median(plain):.3f} ms p50 untraced, {np.median(traced):.3f} ms traced; "
          f"{len(rows) / frames:.0f} barriers a frame\n")
    print("| stage | a frame | p50 us | p95 us | block 0 waits p50 us | ms a frame | share |")
    print("|---|---|---|---|---|---|---|")
    for tag in sorted(per_tag):
        stage, wait = (np.array(v) / 1e3 for v in per_tag[tag])
        ms = stage.sum() / frames / 1e3
        print(f"| {tag_name(tag)} | {len(stage) / frames:.0f} | {np.median(stage):.1f} "
              f"| {np.percentile(stage, 95):.1f} | {np.median(wait):.1f} | {ms:.3f} | {100 * ms / total:.0f}% |")
    print(f"| all | {len(rows) / frames:.0f} | | | | {total:.3f} | 100% |")
    if probes:
        points = sorted({point for by_point in probes.values() for point in by_point})
        print("\nInside the stages (block 0, warp 0): us from the stage's start to each point, p50\n")
        print("| stage | " + " | ".join(POINTS[p] for p in points) + " |")
        print("|---|" + "---|" * len(points))
        for tag in sorted(probes):
            cells = (f"{np.median(probes[tag][p]) / 1e3:.2f}" if p in probes[tag] else "" for p in points)
            print(f"| {tag_name(tag)} | " + " | ".join(cells) + " |")


def probe_offsets(rows: np.ndarray) -> dict[int, dict[int, list[int]]]:
    """stage tag -> probe point -> ns from the stage's start (the barrier or launch before it) to the point."""
    offsets, pending, start = defaultdict(lambda: defaultdict(list)), [], None
    for tag, _, leave in rows:
        if tag >= PROBE:
            if start is not None:
                pending.append((int(tag) - PROBE, leave - start))
            continue
        if tag != LAUNCH:  # the points seen since the last barrier belong to this stage
            for point, ns in pending:
                offsets[int(tag)][point].append(ns)
        pending, start = [], leave
    return offsets


if __name__ == "__main__":
    sys.exit(main())
