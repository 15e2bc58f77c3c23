"""Decode frames of several utterances in one batch: Qwen3TTS.sample_frames + advance_frames on B utterances at once,
B = 1, 2, 4, 8 (the batched step that concurrent streams are to share, issue 27; the codec is not in these figures).

Method: a random-weight checkpoint or --model, loaded once. For each B, B utterances of different sentences (so their
caches stand at different positions) are prefilled, then --frames batched frames are timed, each a talker step and
a code-predictor pass for all B; an utterance that reaches EOS is begun again, so the batch stays full. Figures: ms a
batched frame (median), frames a second over the batch, and x-real-time over the batch (12.5 frames are a second of
speech). Baseline in the same run: B = 1, which is exactly the engine's one-utterance path.

With --kernel (CUDA): the megakernel's frames instead, 4 a launch, EOS held back: B = 1 is FrameKernel's launch (the
engine's one-utterance path, the baseline), B = 2, 4 and 8 BatchKernel's, which reads every weight once for the batch.

    python bench/tts_batch.py                                 # tiny checkpoint, CPU
    python bench/tts_batch.py --size 0.6b --batches 1,2,4,8
    python bench/tts_batch.py --size 0.6b --device cuda --kernel --batches 1,2,4,8
"""

from __future__ import annotations

import argparse
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

SENTENCES = [
    "Parley speaks several sentences at once.", "Each of them has its own voice and its own seed.",
    "The third one is a little longer than the others, so its cache stands further on.", "Short.",
    "Batching reads every weight once for all of them.", "A sixth sentence.", "And a seventh, to fill the batch.",
    "The eighth and last.",
]
FRAMES_PER_S = 12.5


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="tiny", choices=["tiny", "0.6b"], help="random checkpoint size")
    parser.add_argument("--model", help="a TTS checkpoint folder instead of a random one")
    parser.add_argument("--precision", default="auto", help="load_tts's CPU precision")
    parser.add_argument("--frames", type=int, default=20, help="batched frames timed at each B")
    parser.add_argument("--batches", default="1,2,4,8", help="the batch sizes, comma-separated")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--kernel", action="store_true", help="the megakernel's frames (CUDA), 4 a launch")
    args = parser.parse_args(argv)

    import torch

    from engine.tts import load_tts
    from engine.tts.sampling import Sampler

    work = Path(tempfile.mkdtemp(prefix="parley-bench-"))
    try:
        tts = load_tts(args.model or random_checkpoint(work, args.size, 10_000), device=args.device,
                       precision=args.precision, megakernel=args.kernel or None)
        model, talker = tts.model, tts.config.talker
        voice = tts.resolve_voice(tts.default_speaker)
        prompts = [tts.prompts.build(tts.prompts.text_ids(s), voice, True, tts.device) for s in SENTENCES]

        def begin(b: int, seed: int, min_frames: int = 2):
            inputs = prompts[b % len(prompts)]
            sampler = Sampler(tts.default_sampling, seed, talker.decoder.vocab_size, talker.codec_eos_id,
                              tts._suppress, min_frames)
            return inputs, sampler, model.begin(inputs.prefill.to(tts.dtype), args.frames + 8)

        def launches(batch: int, frames: int) -> list[float]:
            """The megakernel's: seconds a frame of each launch of 4 frames, after a first of one frame."""
            from engine.tts.kernels.megakernel import BatchKernel, KernelRun

            jobs = [begin(b, b, min_frames=10**9) for b in range(batch)]
            times = []
            if batch == 1:
                inputs, sampler, state = jobs[0]
                made = model.frame_kernel.run(state, sampler, inputs, frames + 8, threading.Event(), 4)
                next(made)
                for _ in range(frames // 4):
                    t0 = time.perf_counter()
                    for _ in range(4):
                        next(made)  # a launch's 4 frames: the first waits for it
                    times.append((time.perf_counter() - t0) / 4)
                made.close()
                return times
            kernel = BatchKernel(model, batch)
            runs = [KernelRun.start(state, sampler, inputs, frames + 8) for inputs, sampler, state in jobs]
            kernel.launch(runs, [1] * batch)
            for _ in range(frames // 4):
                t0 = time.perf_counter()
                kernel.launch(runs, [4] * batch)  # reads back how many frames each made: the launch is over
                times.append((time.perf_counter() - t0) / 4)
            return times

        def run(batch: int, frames: int) -> list[float]:
            jobs = [begin(b, b) for b in range(batch)]
            times = []
            for _ in range(frames):
                t0 = time.perf_counter()
                codes = model.sample_frames([j[2] for j in jobs], [j[1] for j in jobs])
                going = [b for b, c in enumerate(codes) if c is not None]
                model.advance_frames([jobs[b][2] for b in going], [codes[b] for b in going],
                                     [jobs[b][0].text_input(jobs[b][2].frame) for b in going])
                times.append(time.perf_counter() - t0)
                for b in set(range(batch)) - set(going):  # EOS: a fresh utterance takes the place
                    jobs[b] = begin(b, len(times) * batch + b)
            return times

        print(f"{args.model or args.size}, {tts.precision}, {torch.get_num_threads()} torch threads\n")
        print("| batch | ms a batched frame p50 | frames/s | x-real-time | vs batch 1 |")
        print("|---|---|---|---|---|")
        timed = launches if args.kernel else run
        timed(1, 4)  # warm-up: first-use costs stay out of the figures
        base = None
        for batch in (int(b) for b in args.batches.split(",")):
            ms = float(np.median(timed(batch, args.frames))) * 1000
            rate = batch * 1000 / ms
            base = base or rate
            print(f"| {batch} | {ms:.1f} | {rate:.1f} | {rate / FRAMES_PER_S:.2f} | {rate / base:.2f}x |", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
